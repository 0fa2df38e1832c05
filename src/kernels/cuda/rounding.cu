/* CUDA REF rounding ops: round_bf16, roundtrip and linear_q (kernels/backend.h), over the
 * formulas of rounding.cuh. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "kernels/cuda/internal.h"
#include "kernels/cuda/rounding.cuh"

using namespace dsv4cu;

__global__ void k_round_bf16(float *x, int64_t n)
{
    PDL_WAIT();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = rt_bf16(x[i]);
}

/* x[r * ld + c] for r < rows, c < n: a row per blockIdx.y. */
__global__ void k_round_bf16_rows(float *x, int64_t n, int64_t ld)
{
    PDL_WAIT();
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c < n)
        x[(int64_t)blockIdx.y * ld + c] = rt_bf16(x[(int64_t)blockIdx.y * ld + c]);
}

/* Thread per block of `block` values (the last one may be short). */
__global__ void k_roundtrip(float *x, int64_t n, int block, int code)
{
    PDL_WAIT();
    int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, b0 = b * block;
    if (b0 < n)
        rt_block(x + b0, x + b0, (int)(n - b0 < block ? n - b0 : block), code);
}

/* Warp per (row, block of `block` values) of x [rows, k] (stride ldx) into xq [rows, k]: lane
 * j holds elements j, j + 32, ... of the block, the block's largest magnitude comes from a
 * shuffle tree (a maximum, so its order does not matter), and each lane codes its elements at
 * the block's scale: rt_block's values (every lane reads its elements before any lane writes,
 * so xq may be x). QB_MAX bounds the elements a lane holds. */
#define QB_MAX 8
__global__ void k_quant_rows(const float *x, int64_t rows, int k, int64_t ldx, int block, float *xq)
{
    PDL_WAIT();
    int nb = (k + block - 1) / block, lane = threadIdx.x & 31, per = (block + 31) / 32;
    int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (i >= rows * nb)
        return;
    int64_t r = i / nb;
    int c0 = (int)(i % nb) * block, end = c0 + block < k ? c0 + block : k;
    float v[QB_MAX], amax = 1e-4f;
#pragma unroll
    for (int j = 0; j < QB_MAX; j++) {
        int c = c0 + lane + 32 * j;
        v[j] = j < per && c < end ? x[r * ldx + c] : 0.0f;
        amax = fmaxf(amax, fabsf(v[j]));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float sc = rt_pow2_ceil(amax * (1.0f / 448.0f));
#pragma unroll
    for (int j = 0; j < QB_MAX; j++) {
        int c = c0 + lane + 32 * j;
        if (j < per && c < end)
            xq[r * k + c] = rt_e4m3(fminf(fmaxf(v[j] / sc, -448.0f), 448.0f)) * sc;
    }
}

bool dsv4cu::quant_rows(const float *x, int64_t rows, int k, int64_t ldx, int block, float *xq)
{
    if (block <= 0 || block > 32 * QB_MAX) {
        fail(DSV4_E_UNSUPPORTED, "cuda: REF activation blocks of %d values (at most %d)", block, 32 * QB_MAX);
        return false;
    }
    int64_t nt = rows * ((k + block - 1) / block) * 32;
    if (nt > 0)
        launch_k(k_quant_rows, (unsigned)cdiv(nt, 256), 256, 0, stream, x, rows, k, ldx, block, xq);
    return true;
}

void dsv4cu::round_bf16_launch(float *x, int64_t n)
{
    if (n > 0)
        launch_k(k_round_bf16, (unsigned)cdiv(n, 256), 256, 0, stream, x, n);
}

void dsv4cu::round_bf16_rows_launch(float *x, int rows, int64_t n, int64_t ld)
{
    if (n <= 0 || rows <= 0)
        return;
    if (ld == n)
        round_bf16_launch(x, rows * n);
    else
        for (int r0 = 0; r0 < rows; r0 += 65535) /* grid y's limit */
            launch_k(k_round_bf16_rows, dim3((unsigned)cdiv(n, 256), (unsigned)(rows - r0 < 65535 ? rows - r0 : 65535)),
                     256, 0, stream, x + (int64_t)r0 * ld, n, ld);
}

void dsv4cu::cu_round_bf16(float *x, int64_t n)
{
    if (n <= 0)
        return;
    size_t by = (size_t)n * sizeof(float);
    op_begin_at("round_bf16");
    bool ran = given("round_bf16", {x});
    if (ran)
        round_bf16_launch(x, n);
    finish(ran, "round_bf16", x, by);
    op_end();
}

void dsv4cu::cu_roundtrip(float *x, int64_t n, int block, int code)
{
    if (n <= 0)
        return;
    size_t by = (size_t)n * sizeof(float);
    op_begin_at("roundtrip");
    bool ok = block > 0 && (code == DSV4_RT_FP8 || code == DSV4_RT_FP4 || code == DSV4_RT_FP4_E4M3);
    if (!ok)
        fail(DSV4_E_ARG, "cuda: roundtrip: block %d, code %d", block, code);
    ok = ok && given("roundtrip", {x});
    if (ok)
        launch_k(k_roundtrip, (unsigned)cdiv(cdiv(n, block), 128), 128, 0, stream, x, n, block, code);
    finish(ok, "roundtrip", x, by);
    op_end();
}

static growbuf g_qx;

float *dsv4cu::ref_buf(size_t n) { return grow_buf(&g_qx, n, n, "REF's quantized input buffer"); }

void dsv4cu::cu_linear_q(const dsv4_weight *w, int64_t r0, int64_t r1, const float *x, int T, int64_t ldx, float *y,
                         int64_t ldy)
{
    linear_q_x(w, r0, r1, x, T, ldx, y, ldy, 0);
}

void dsv4cu::linear_q_x(const dsv4_weight *w, int64_t r0, int64_t r1, const float *x, int T, int64_t ldx, float *y,
                        int64_t ldy, int rb)
{
    if (T <= 0 || r1 <= r0)
        return;
    op_begin_at("linear_q");
    float *xq = given("linear_q", {x, y}) ? ref_buf((size_t)T * w->k) : NULL;
    bool ran = xq && quant_rows(x, T, (int)w->k, ldx, dsv4_act_block(w), xq) && launched("linear_q input");
    if (!ran)
        fail_rows(y, T, r1 - r0, ldy);
    op_end();
    if (ran) /* xq holds bf16 values (e4m3 times a power of two): one tensor-core term */
        linear_x(w, r0, r1, xq, T, w->k, y, ldy, 1, rb);
}
