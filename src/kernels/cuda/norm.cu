/* CUDA rmsnorm (one block per row) and rope (one thread per row, head and channel pair). */
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

__global__ void __launch_bounds__(NB) k_rmsnorm(const float *x, int dim, const float *w, float eps, float *y)
{
    PDL_WAIT();
    __shared__ float sh[NW + 1];
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
        rms_out(v, wv, w != NULL, dim, eps, sh, yr);
        return;
    }
    rms_block(xr, dim, w, eps, sh, yr);
}

void dsv4cu::cu_rmsnorm(const float *x, int64_t rows, int dim, const float *w, float eps, float *y)
{
    if (rows <= 0 || dim <= 0)
        return;
    op_begin();
    size_t b = (size_t)rows * dim * sizeof(float);
    bool in = given("rmsnorm", {x, y});
    const float *dw = in && w ? (const float *)dev_const(w, "rmsnorm", "w") : NULL;
    bool ran = in && (dw || !w) && (y == x || poison_out(y, b));
    if (ran)
        launch_k(k_rmsnorm, (unsigned)rows, NB, 0, stream, x, dim, dw, eps, y);
    finish(ran, "rmsnorm", y, b);
    op_end();
}

/* ---- rope: one thread per (row, head, channel pair) ------------------------------------- */

__global__ void k_rope(float *x, int T, int64_t ld, int heads, int d, int rd, const float *inv_freq,
                       const int64_t *pos, int inverse)
{
    PDL_WAIT();
    int half = rd / 2;
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)T * heads * half)
        return;
    int i = (int)(idx % half), h = (int)(idx / half % heads);
    int64_t t = idx / ((int64_t)half * heads);
    float ang = (float)pos[t] * inv_freq[i];
    float c = cosf(ang), s = inverse ? -sinf(ang) : sinf(ang);
    float *v = x + t * ld + (int64_t)h * d + (d - rd);
    float a = v[2 * i], b = v[2 * i + 1];
    v[2 * i] = a * c - b * s;
    v[2 * i + 1] = a * s + b * c;
}

void dsv4cu::cu_rope(float *x, int T, int64_t stride, int heads, int d, int rd, const float *inv_freq, const int64_t *pos,
                    int inverse)
{
    int64_t width = (int64_t)heads * d, n = (int64_t)T * heads * (rd / 2);
    if (n <= 0)
        return;
    op_begin();
    /* x is rotated in place; pos is the step's (a device buffer), inv_freq a constant */
    const float *df = given("rope", {x, pos, inv_freq}) ? (const float *)dev_const(inv_freq, "rope", "inv_freq") : NULL;
    bool ran = df != NULL;
    if (ran)
        launch_k(k_rope, (unsigned)cdiv(n, 256), 256, 0, stream, x, T, stride, heads, d, rd, df, pos, inverse);
    finish_rows(ran, "rope", x, T, width, stride);
    op_end();
}
