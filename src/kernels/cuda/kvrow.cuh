/* kernels/cuda — a cache row as the step kernels read it: fp32 values (exact caches, this step's
 * rows), or a production row (kernels/kv_format.h) decoded value by value as it is read, so no
 * kernel needs an unpacked copy of a cache. And the stores: a row packed block by block.
 * C++ only; included by the files of the step kernels.
 *
 * Every decoded value is the one dsv4_kv_value (kv_format.h) gives, bit for bit: the code's value
 * (e4m3 through f16, exact; e2m1 from its bits) times its block's scale, one float multiply. */
#ifndef DSV4_CUDA_KVROW_CUH
#define DSV4_CUDA_KVROW_CUH

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include "kernels/cuda/internal.h"
#include "kernels/kv_format.h"

namespace dsv4cu {

/* e4m3fn code to float, exactly (NaN for 0x7f / 0xff). */
__device__ __forceinline__ float kv_e4m3(uint8_t c)
{
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, __NV_E4M3);
    return __half2float(__half(h));
}

/* e2m1 code (0..15) to float: 0, .5, 1, 1.5, 2, 3, 4, 6 and their negatives (-0 for code 8). */
__device__ __forceinline__ float kv_e2m1(uint32_t c)
{
    uint32_t m = c & 7u;
    uint32_t b = m < 2u ? (m ? 0x3f000000u : 0u) : (((m >> 1) + 126u) << 23) | ((m & 1u) << 22);
    return __uint_as_float(b | ((c & 8u) << 28));
}

/* A UE8M0 scale byte: 2^(b - 127) as kv_format.h reads it (NaN for 0xff). */
__device__ __forceinline__ float kv_ue8m0(uint8_t b) { return b == 0xff ? __uint_as_float(0x7fc00000u) : __uint_as_float((uint32_t)b << 23); }

/* Row of n values: fp32 at p (fmt < 0), or packed in format fmt (DSV4_KV_*). */
struct crow {
    const void *p;
    int fmt, n;

    __device__ __forceinline__ float operator[](int j) const
    {
        if (fmt < 0)
            return ((const float *)p)[j];
        return packed(j);
    }
    /* A packed row's value j, out of line: the kernels that read a few values at a time hold
     * many accumulators, and an inlined decode at every read would push them out to memory. */
    __device__ __noinline__ float packed(int j) const
    {
        const uint8_t *row = (const uint8_t *)p;
        if (fmt == DSV4_KV_WINDOW)
            return kv_e4m3(row[j]) * kv_ue8m0(row[n + (j >> 5)]);
        uint32_t c = (j & 1) ? row[j >> 1] >> 4 : row[j >> 1] & 15u;
        int cb = (n + 1) >> 1;
        float s = fmt == DSV4_KV_MAIN ? kv_e4m3(row[cb + (j >> 4)]) : kv_ue8m0(row[cb + (j >> 5)]);
        return kv_e2m1(c) * s;
    }
    /* Values j .. j + 3 (j % 4 == 0; an fp32 row 16-byte aligned): one test of the format, then
     * every byte the four need loaded before any is decoded. */
    __device__ __forceinline__ float4 ld4(int j) const
    {
        if (fmt < 0)
            return *(const float4 *)((const float *)p + j);
        const uint8_t *row = (const uint8_t *)p;
        if (fmt == DSV4_KV_WINDOW) {
            uint8_t c0 = row[j], c1 = row[j + 1], c2 = row[j + 2], c3 = row[j + 3], sb = row[n + (j >> 5)];
            float s = kv_ue8m0(sb);
            return make_float4(kv_e4m3(c0) * s, kv_e4m3(c1) * s, kv_e4m3(c2) * s, kv_e4m3(c3) * s);
        }
        int cb = (n + 1) >> 1;
        uint32_t lo = row[j >> 1], hi = row[(j >> 1) + 1];
        uint8_t sb = fmt == DSV4_KV_MAIN ? row[cb + (j >> 4)] : row[cb + (j >> 5)];
        float s = fmt == DSV4_KV_MAIN ? kv_e4m3(sb) : kv_ue8m0(sb);
        return make_float4(kv_e2m1(lo & 15u) * s, kv_e2m1(lo >> 4) * s, kv_e2m1(hi & 15u) * s, kv_e2m1(hi >> 4) * s);
    }
    /* v[c] = value j0 + step c (0 past n), c < C. One test of the format, then every load
     * issued before any value is used (a row's loads in flight together, not one after
     * another). */
    template <int C>
    __device__ __forceinline__ void strided(int j0, int step, float (&v)[C]) const
    {
        if (fmt < 0) {
            const float *f = (const float *)p;
#pragma unroll
            for (int c = 0; c < C; c++)
                v[c] = j0 + step * c < n ? f[j0 + step * c] : 0.0f;
            return;
        }
        const uint8_t *row = (const uint8_t *)p;
        uint32_t code[C];
        uint8_t sb[C];
        if (fmt == DSV4_KV_WINDOW) {
#pragma unroll
            for (int c = 0; c < C; c++) {
                int j = j0 + step * c;
                code[c] = j < n ? row[j] : 0u;
                sb[c] = j < n ? row[n + (j >> 5)] : 0;
            }
#pragma unroll
            for (int c = 0; c < C; c++)
                v[c] = j0 + step * c < n ? kv_e4m3((uint8_t)code[c]) * kv_ue8m0(sb[c]) : 0.0f;
            return;
        }
        int cb = (n + 1) >> 1, sh = fmt == DSV4_KV_MAIN ? 4 : 5;
#pragma unroll
        for (int c = 0; c < C; c++) {
            int j = j0 + step * c;
            code[c] = j < n ? row[j >> 1] : 0u;
            sb[c] = j < n ? row[cb + (j >> sh)] : 0;
        }
#pragma unroll
        for (int c = 0; c < C; c++) {
            int j = j0 + step * c;
            float s = sh == 4 ? kv_e4m3(sb[c]) : kv_ue8m0(sb[c]);
            v[c] = j < n ? kv_e2m1((j & 1) ? code[c] >> 4 : code[c] & 15u) * s : 0.0f;
        }
    }
    /* A warp's lanes reading the row in column stripes: v[c] = value lane + 32 c. */
    template <int C>
    __device__ __forceinline__ void lanes(int lane, float (&v)[C]) const { strided(lane, 32, v); }
};

/* row_lanes (internal.h) of a cache row. */
template <int C>
__device__ __forceinline__ void row_lanes(const crow &k, int, int lane, float (&v)[C])
{
    k.lanes(lane, v);
}

/* Row i of a cache of n-value rows: fp32 (prod 0) or packed in fmt. */
__device__ __forceinline__ crow cache_row(const void *base, int64_t i, int n, int prod, int fmt)
{
    if (!prod)
        return crow{(const float *)base + i * n, -1, n};
    return crow{(const uint8_t *)base + i * dsv4_kv_row_bytes(fmt, n), fmt, n};
}

/* By a block of NB threads, each taking blocks of the format: the n values at x packed into row
 * (n <= the caller's buffer; x stays). Ends with a barrier. */
__device__ __forceinline__ void pack_row_block(int fmt, const float *x, int n, uint8_t *row)
{
    int B = dsv4_kv_block(fmt);
    for (int j = threadIdx.x; j * B < n; j += NB)
        dsv4_kv_pack_block(fmt, x + j * B, n - j * B < B ? n - j * B : B, j, n, row);
    __syncthreads();
}

} // namespace dsv4cu

#endif
