/* REF numerics' roundings on the device (V4.1 spec §3), bit for bit the CPU's formulas in
 * core/codec.c: the same comparisons, the same round-to-nearest-even steps, the same scale
 * derivations. Used by the rounding ops (rounding.cu), by the ops that store their outputs
 * rounded (linear_rb, rmsnorm_rb, rope_rb, hc_post_rb) and inside the experts and attn_step41
 * kernels where REF rounds between their phases. */
#ifndef DSV4_CUDA_ROUNDING_CUH
#define DSV4_CUDA_ROUNDING_CUH
#include <cuda_bf16.h>
#include <math.h>
#include "kernels/backend.h"

namespace dsv4cu {

/* v through bf16, nearest even. */
__device__ __forceinline__ float rt_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

/* 2^ceil(log2 t) for positive normal t, from the bits (dsv4_pow2_ceil). */
__device__ __forceinline__ float rt_pow2_ceil(float t)
{
    unsigned b = __float_as_uint(t);
    int e = (int)((b >> 23) & 0xff) - 127 + ((b & 0x7fffff) != 0);
    return ldexpf(1.0f, e);
}

/* The value of dsv4_f32_to_e4m3(f), decoded: saturating at 448, quantum 2^-9 below 2^-6. */
__device__ __forceinline__ float rt_e4m3(float f)
{
    if (isnan(f))
        return f;
    float a = fabsf(f), r;
    if (a >= 448.0f)
        r = 448.0f;
    else if (a < 0.015625f)
        r = rintf(a * 512.0f) * (1.0f / 512.0f);
    else {
        int e;
        frexpf(a, &e);
        r = ldexpf(rintf(ldexpf(a, 4 - e)), e - 4); /* 4 significant bits */
    }
    return copysignf(r, f);
}

/* The value of dsv4_f32_to_e2m1(f), decoded (NaN to the largest magnitude, as the CPU). */
__device__ __forceinline__ float rt_e2m1(float f)
{
    float a = fabsf(f), v;
    if (isnan(f))
        v = 6.0f;
    else if (a <= 0.25f)
        v = 0.0f;
    else if (a < 0.75f)
        v = 0.5f;
    else if (a <= 1.25f)
        v = 1.0f;
    else if (a < 1.75f)
        v = 1.5f;
    else if (a <= 2.5f)
        v = 2.0f;
    else if (a < 3.5f)
        v = 3.0f;
    else if (a <= 5.0f)
        v = 4.0f;
    else
        v = 6.0f;
    return signbit(f) ? -v : v;
}

/* One block of n values (src and dst may alias) through its code (DSV4_RT_*): the block's scale
 * from its largest magnitude, then each value coded at that scale and decoded. */
__device__ __forceinline__ void rt_block(const float *src, float *dst, int n, int code)
{
    float amax = code == DSV4_RT_FP8 ? 1e-4f : 0.0f;
    for (int i = 0; i < n; i++)
        amax = fmaxf(amax, fabsf(src[i]));
    if (code == DSV4_RT_FP8) {
        float s = rt_pow2_ceil(amax * (1.0f / 448.0f));
        for (int i = 0; i < n; i++)
            dst[i] = rt_e4m3(fminf(fmaxf(src[i] / s, -448.0f), 448.0f)) * s;
        return;
    }
    float s = code == DSV4_RT_FP4_E4M3 ? rt_e4m3(fmaxf(amax, 6.0f * 0x1p-9f) / 6.0f)
                                       : rt_pow2_ceil(fmaxf(amax, 6.0f * 0x1p-126f) * (1.0f / 6.0f));
    for (int i = 0; i < n; i++)
        dst[i] = rt_e2m1(fminf(fmaxf(src[i] / s, -6.0f), 6.0f)) * s;
}

/* Launches on the stream (rounding.cu): rows [rows, k] of x (row stride ldx) through e4m3 blocks
 * of `block` values into xq [rows, k] dense (xq may be x itself when ldx = k, else must not
 * overlap it; false, with the error recorded, for a block it cannot take); and n values
 * through bf16 in place; and n values of each of `rows` rows of stride ld through bf16 in place. */
bool quant_rows(const float *x, int64_t rows, int k, int64_t ldx, int block, float *xq);
void round_bf16_launch(float *x, int64_t n);
void round_bf16_rows_launch(float *x, int rows, int64_t n, int64_t ld);
/* The device buffer REF's quantized inputs go to (linear_q, experts): at least n floats, NULL
 * after recording an error. It only grows, and a buffer it outgrew is kept, since a recorded
 * graph may still read it. */
float *ref_buf(size_t n);

} // namespace dsv4cu
#endif
