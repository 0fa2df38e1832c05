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
        const uint8_t *row = (const uint8_t *)p;
        if (fmt == DSV4_KV_WINDOW)
            return kv_e4m3(row[j]) * kv_ue8m0(row[n + (j >> 5)]);
        uint32_t c = (j & 1) ? row[j >> 1] >> 4 : row[j >> 1] & 15u;
        int cb = (n + 1) >> 1;
        float s = fmt == DSV4_KV_MAIN ? kv_e4m3(row[cb + (j >> 4)]) : kv_ue8m0(row[cb + (j >> 5)]);
        return kv_e2m1(c) * s;
    }
    /* Values j .. j + 3 (j % 4 == 0; an fp32 row 16-byte aligned). */
    __device__ __forceinline__ float4 ld4(int j) const
    {
        if (fmt < 0)
            return *(const float4 *)((const float *)p + j);
        return make_float4((*this)[j], (*this)[j + 1], (*this)[j + 2], (*this)[j + 3]);
    }
};

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
