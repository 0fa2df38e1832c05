/* kernels/cuda — the weight storage forms on the device: the weight view every matrix kernel
 * reads (wdev), the scale lookups and the exact decoders of 8-element chunks and of single
 * elements. Shared by the linear, expert and embedding kernels. C++ only. */
#ifndef DSV4_CUDA_FORMS_CUH
#define DSV4_CUDA_FORMS_CUH

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include "kernels/cuda/internal.h"

namespace dsv4cu {

/* e8m0 byte -> 2^(b - 127) exactly (b = 0 is the subnormal 2^-127); 255 is NaN. */
__device__ __forceinline__ float e8m0(unsigned b)
{
    return b == 255 ? __int_as_float(0x7fc00000) : b ? __int_as_float((int)(b << 23)) : __int_as_float(0x00400000);
}

__device__ __forceinline__ float scale_at(const void *s, int is_e8m0, int64_t i)
{
    return is_e8m0 ? e8m0(((const uint8_t *)s)[i]) : ((const float *)s)[i];
}

static __constant__ float c_e2m1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                 -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

struct wdev {
    const uint8_t *q;           /* data as stored */
    const void *s;              /* scales (FP8/FP4) */
    int form, e8m0, bn, bk;
    int64_t k;
    int64_t sk;                 /* scale blocks along a row: FP8 ceil(k / bk), FP4 k / bk */
    int cpb, cshift;            /* 8-element chunks per scale block, its log2 (-1: not a power of two) */
    int wpr;                    /* warps per output row (chunk path) */
    int tcs;                    /* run slices of a 16-row group (tensor-core path, mma.cuh) */
    int kss;                    /* log2 of its runs per scale block (tensor-core path: tc_ok) */
};


/* The chunk path reads rows in chunks of 8 elements: 32 bytes (F32), 16 (BF16/F16), 8 (FP8),
 * 4 (FP4). A warp owns R neighbouring rows and lane l of its w-th warp takes chunks
 * (w * 32 + l) + j * 32 * wpr of each, so a load instruction is one contiguous span of a row,
 * and the 8 x values a chunk needs are loaded once for the R rows (x comes from L1, and at one
 * weight byte per element re-reading it per row would cost more L1 traffic than the weights'
 * own). U chunks of each row are loaded before the first is used (about 2 KB a warp). */
template <int F> struct ck;
template <> struct ck<DSV4_WF_F32> {
    struct T { uint4 a, b; };
    enum { R = 2, U = 1 };
    static __device__ __forceinline__ T ld(const T *p) { return T{__ldg(&p->a), __ldg(&p->b)}; }
};
template <> struct ck<DSV4_WF_BF16> {
    typedef uint4 T;
    enum { R = 2, U = 2 };
    static __device__ __forceinline__ T ld(const T *p) { return __ldg(p); }
};
template <> struct ck<DSV4_WF_F16> {
    typedef uint4 T;
    enum { R = 2, U = 2 };
    static __device__ __forceinline__ T ld(const T *p) { return __ldg(p); }
};
template <> struct ck<DSV4_WF_FP8> {
    typedef uint2 T;
    enum { R = 4, U = 2 };
    static __device__ __forceinline__ T ld(const T *p) { return __ldg(p); }
};
template <> struct ck<DSV4_WF_FP4> {
    typedef unsigned int T;
    enum { R = 4, U = 4 };
    static __device__ __forceinline__ T ld(const T *p) { return __ldg(p); }
};

__device__ __forceinline__ void bf16x2(uint32_t u, float *v)
{
    v[0] = __uint_as_float(u << 16);
    v[1] = __uint_as_float(u & 0xffff0000u);
}

__device__ __forceinline__ void f16x2(uint32_t u, float *v)
{
    __half2_raw h;
    h.x = (unsigned short)(u & 0xffff);
    h.y = (unsigned short)(u >> 16);
    float2 f = __half22float2(__half2(h));
    v[0] = f.x;
    v[1] = f.y;
}

/* Four e4m3 bytes to fp32, exactly (e4m3 -> f16 is exact and keeps NaN, then f16 -> f32). */
__device__ __forceinline__ void e4m3x4(uint32_t u, float *v)
{
#pragma unroll
    for (int j = 0; j < 2; j++) {
        __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u >> (16 * j)), __NV_E4M3);
        float2 f = __half22float2(__half2(h));
        v[2 * j] = f.x;
        v[2 * j + 1] = f.y;
    }
}

/* Eight e2m1 nibbles (element i in bits 4i..4i+3) to fp32, exactly, without a table: nibbles q
 * and q + 4 (16 bits apart) become the two halves of an f16x2 with the magnitude bits in the
 * exponent's low bits and the top mantissa bit, which is the value times 2^-14 (e = 0 lands on
 * the f16 subnormals, 0 and 0.5 * 2^-14); one f16 multiply by 2^14, exact, restores it. */
__device__ __forceinline__ void e2m1x8(uint32_t u, float *v)
{
    const __half2 k14 = __float2half2_rn(16384.0f);
#pragma unroll
    for (int q = 0; q < 4; q++) {
        uint32_t m = (q < 3 ? u << (9 - 4 * q) : u >> 3) & 0x0e000e00u;
        uint32_t sg = (u << (12 - 4 * q)) & 0x80008000u;
        __half2_raw h;
        h.x = (unsigned short)((m | sg) & 0xffff);
        h.y = (unsigned short)((m | sg) >> 16);
        float2 f = __half22float2(__hmul2(__half2(h), k14));
        v[q] = f.x;
        v[q + 4] = f.y;
    }
}

template <int F>
__device__ __forceinline__ void decode8(const typename ck<F>::T &c, float *v)
{
    if constexpr (F == DSV4_WF_F32) {
        uint32_t u[8] = {c.a.x, c.a.y, c.a.z, c.a.w, c.b.x, c.b.y, c.b.z, c.b.w};
#pragma unroll
        for (int i = 0; i < 8; i++)
            v[i] = __uint_as_float(u[i]);
    } else if constexpr (F == DSV4_WF_BF16 || F == DSV4_WF_F16) {
        uint32_t u[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (F == DSV4_WF_BF16)
                bf16x2(u[i], v + 2 * i);
            else
                f16x2(u[i], v + 2 * i);
        }
    } else if constexpr (F == DSV4_WF_FP8) {
        e4m3x4(c.x, v);
        e4m3x4(c.y, v + 4);
    } else {
        e2m1x8(c, v);
    }
}

/* One element (the path for shapes the 8-element chunks do not tile), times its scale. */
__device__ __forceinline__ float decode1(const wdev &w, int64_t r, int64_t i, const float *lut4)
{
    switch (w.form) {
    case DSV4_WF_F32: return ((const float *)w.q)[r * w.k + i];
    case DSV4_WF_BF16: return __uint_as_float((uint32_t)((const uint16_t *)w.q)[r * w.k + i] << 16);
    case DSV4_WF_F16: {
        __half_raw h;
        h.x = ((const uint16_t *)w.q)[r * w.k + i];
        return __half2float(__half(h));
    }
    case DSV4_WF_FP8: {
        float s = scale_at(w.s, w.e8m0, (r / w.bn) * w.sk + i / w.bk);
        __half_raw h = __nv_cvt_fp8_to_halfraw(w.q[r * w.k + i], __NV_E4M3);
        return __half2float(__half(h)) * s;
    }
    default: {
        float s = scale_at(w.s, w.e8m0, r * w.sk + i / w.bk);
        uint8_t b = w.q[r * (w.k / 2) + i / 2];
        return lut4[(i & 1) ? b >> 4 : b & 15] * s;
    }
    }
}


} // namespace dsv4cu

#endif
