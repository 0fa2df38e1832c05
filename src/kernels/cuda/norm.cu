/* CUDA rmsnorm (one block per row) and rope (one thread per row, head and channel pair), each
 * also in REF's form that stores its values through bf16 (rmsnorm_rb, rope_rb). */
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cuda/internal.h"
#include "kernels/cuda/norm.cuh"

using namespace dsv4cu;

/* ---- rmsnorm: one block per row -------------------------------------------------------- */

/* Row blockIdx.x of x into y, each value through bf16 when RB. A row too long for registers:
 * rms_block writes it, then each thread rounds the channels it wrote (its own stores, so no
 * barrier). */
template <bool RB>
__device__ __forceinline__ void rmsnorm_row(const float *x, int dim, const float *w, float eps, float *sh, float *y)
{
    const float *xr = x + (int64_t)blockIdx.x * dim;
    float *yr = y + (int64_t)blockIdx.x * dim;
    if (dim <= NB * RMS_V) {
        float v[RMS_V], wv[RMS_V];
#pragma unroll
        for (int c = 0; c < RMS_V; c++) {
            int i = threadIdx.x + c * NB;
            v[c] = i < dim ? xr[i] : 0.0f;
            wv[c] = i < dim && w ? w[i] : 1.0f;
        }
        rms_out(v, wv, w != NULL, dim, eps, sh, yr, RB);
        return;
    }
    rms_block(xr, dim, w, eps, sh, yr);
    for (int i = threadIdx.x; RB && i < dim; i += NB)
        yr[i] = rt_bf16(yr[i]);
}

__global__ void __launch_bounds__(NB) k_rmsnorm(const float *x, int dim, const float *w, float eps, float *y)
{
    PDL_WAIT();
    __shared__ float sh[NW + 1];
    rmsnorm_row<false>(x, dim, w, eps, sh, y);
}

__global__ void __launch_bounds__(NB) k_rmsnorm_rb(const float *x, int dim, const float *w, float eps, float *y)
{
    PDL_WAIT();
    __shared__ float sh[NW + 1];
    rmsnorm_row<true>(x, dim, w, eps, sh, y);
}

/* rmsnorm (rb false) or rmsnorm_rb; fn names the op in the profile. */
static void rmsnorm_op(const char *fn, const char *op, bool rb, const float *x, int64_t rows, int dim, const float *w,
                       float eps, float *y)
{
    if (rows <= 0 || dim <= 0)
        return;
    op_begin_at(fn);
    size_t b = (size_t)rows * dim * sizeof(float);
    bool in = given(op, {x, y});
    const float *dw = in && w ? (const float *)dev_const(w, op, "w") : NULL;
    bool ran = in && (dw || !w) && (y == x || poison_out(y, b));
    if (ran)
        launch_k(rb ? k_rmsnorm_rb : k_rmsnorm, (unsigned)rows, NB, 0, stream, x, dim, dw, eps, y);
    finish(ran, op, y, b);
    op_end();
}

void dsv4cu::cu_rmsnorm(const float *x, int64_t rows, int dim, const float *w, float eps, float *y)
{
    rmsnorm_op(__func__, "rmsnorm", false, x, rows, dim, w, eps, y);
}

void dsv4cu::cu_rmsnorm_rb(const float *x, int64_t rows, int dim, const float *w, float eps, float *y)
{
    rmsnorm_op(__func__, "rmsnorm_rb", true, x, rows, dim, w, eps, y);
}

/* ---- rope: one thread per (row, head, channel pair) ------------------------------------- */

/* Thread i < half of (row t, head h) rotates pair i; with rb it stores the pair through bf16
 * and rounds the head's unrotated channels j = i, i + P, ... (P threads a head: half, at least
 * one), so every one of the head's d values is rounded once, by one thread. */
__global__ void k_rope(float *x, int T, int64_t ld, int heads, int d, int rd, const float *inv_freq,
                       const int64_t *pos, int inverse, int rb)
{
    PDL_WAIT();
    int half = rd / 2, P = half > 0 ? half : 1;
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)T * heads * P)
        return;
    int i = (int)(idx % P), h = (int)(idx / P % heads);
    int64_t t = idx / ((int64_t)P * heads);
    float *row = x + t * ld + (int64_t)h * d;
    if (i < half) {
        float ang = (float)pos[t] * inv_freq[i];
        float c = cosf(ang), s = inverse ? -sinf(ang) : sinf(ang);
        float *v = row + (d - rd);
        float a = v[2 * i], b = v[2 * i + 1];
        float o0 = a * c - b * s, o1 = a * s + b * c;
        v[2 * i] = rb ? rt_bf16(o0) : o0;
        v[2 * i + 1] = rb ? rt_bf16(o1) : o1;
    }
    for (int j = i; rb && j < d; j += P)
        if (j < d - rd || j >= d - rd + 2 * half)
            row[j] = rt_bf16(row[j]);
}

/* rope (rb 0) or rope_rb; fn names the op in the profile. */
static void rope_op(const char *fn, const char *op, int rb, float *x, int T, int64_t stride, int heads, int d, int rd,
                    const float *inv_freq, const int64_t *pos, int inverse)
{
    int half = rd / 2, P = rb && half == 0 ? 1 : half;
    int64_t width = (int64_t)heads * d, n = (int64_t)T * heads * P;
    if (n <= 0)
        return;
    op_begin_at(fn);
    /* x is rotated in place; pos is the step's (a device buffer), inv_freq a constant (unread
     * without pairs) */
    bool in = given(op, {x, pos}) && (half == 0 || given(op, {inv_freq}));
    const float *df = in && half ? (const float *)dev_const(inv_freq, op, "inv_freq") : NULL;
    bool ran = in && (df || half == 0);
    if (ran)
        launch_k(k_rope, (unsigned)cdiv(n, 256), 256, 0, stream, x, T, stride, heads, d, rd, df, pos, inverse, rb);
    finish_rows(ran, op, x, T, width, stride);
    op_end();
}

void dsv4cu::cu_rope(float *x, int T, int64_t stride, int heads, int d, int rd, const float *inv_freq, const int64_t *pos,
                    int inverse)
{
    rope_op(__func__, "rope", 0, x, T, stride, heads, d, rd, inv_freq, pos, inverse);
}

void dsv4cu::cu_rope_rb(float *x, int T, int64_t stride, int heads, int d, int rd, const float *inv_freq,
                       const int64_t *pos, int inverse)
{
    rope_op(__func__, "rope_rb", 1, x, T, stride, heads, d, rd, inv_freq, pos, inverse);
}
