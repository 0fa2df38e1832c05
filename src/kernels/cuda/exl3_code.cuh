/* kernels/cuda — reading EXL3 trellis tiles on the device: where a column's runs of states lie
 * in a tile's words, the states of a run, and the codebooks' values. Shared by the FMA core
 * (exl3.cu) and the tensor-core core (exl3_mma.cuh). C++ only. The format's facts are at the
 * top of exl3.cu and in docs/exl3.md. */
#ifndef DSV4_CUDA_EXL3_CODE_CUH
#define DSV4_CUDA_EXL3_CODE_CUH

#include <cuda_fp16.h>
#include <stdint.h>
extern "C" {
#include "io/exl3_format.h"
}

namespace dsv4cu {

constexpr uint32_t EXL3_INST3_MULT = 89226354u, EXL3_INST3_ADD = 64248484u;

__device__ __forceinline__ __half2 u32_half2(uint32_t u)
{
    return __halves2half2(__ushort_as_half((unsigned short)(u & 0xffffu)), __ushort_as_half((unsigned short)(u >> 16)));
}

/* The codebook values of states sa and sb (16-bit), exactly as dsv4_exl3_codebook. */
template <int CB>
__device__ __forceinline__ float2 exl3_decode2(uint32_t sa, uint32_t sb)
{
    if (CB == DSV4_EXL3_MUL1) {
        uint32_t xa = sa * DSV4_EXL3_MUL1_MULT, xb = sb * DSV4_EXL3_MUL1_MULT;
        /* 1024 + byte sum (<= 2044) is the fp16 bit pattern 0x6400 + sum, exactly */
        uint32_t ha = 0x6400u + __dp4a(xa, 0x01010101u, 0u), hb = 0x6400u + __dp4a(xb, 0x01010101u, 0u);
        const __half2 kinv = u32_half2(0x1eee1eeeu), kbias = u32_half2(0xc931c931u);
        return __half22float2(__hfma2(u32_half2(ha | hb << 16), kinv, kbias));
    }
    uint32_t xa, xb;
    if (CB == DSV4_EXL3_MCG) {
        xa = sa * DSV4_EXL3_MCG_MULT;
        xb = sb * DSV4_EXL3_MCG_MULT;
    } else {
        xa = sa * EXL3_INST3_MULT + EXL3_INST3_ADD;
        xb = sb * EXL3_INST3_MULT + EXL3_INST3_ADD;
    }
    xa = (xa & 0x8fff8fffu) ^ 0x3b603b60u;
    xb = (xb & 0x8fff8fffu) ^ 0x3b603b60u;
    /* (a.lo, b.lo) + (a.hi, b.hi), each sum rounded once to fp16 */
    return __half22float2(__hadd2(u32_half2(__byte_perm(xa, xb, 0x5410)), u32_half2(__byte_perm(xa, xb, 0x7632))));
}

/* Run g (rows 2g, 2g + 1, 2g + 8, 2g + 9) of tile column cc: the u32 of the tile's words holding
 * its first state bit, and that bit's offset from the MSB. */
template <int K>
__device__ __forceinline__ void exl3_run_at(int cc, int g, int &wi, int &off)
{
    int P = 32 * (cc & 7) + 8 * g + 4 * (cc >> 3), st = (P + 1) * K - 16;
    if (st < 0)
        st += 256 * K;
    wi = st >> 5;
    off = st & 31;
}

/* The run's values at rows (2g, 2g + 1) and (2g + 8, 2g + 9), from a tile's words tw (8K words,
 * then words 0 and 1 again, so a run's three words never wrap). */
template <int K, int CB>
__device__ __forceinline__ void exl3_run(const uint32_t *tw, int wi, int off, float2 &d01, float2 &d23)
{
    uint32_t w0 = tw[wi], w1 = tw[wi + 1], w2 = tw[wi + 2];
    uint32_t hi = __funnelshift_l(w1, w0, off), lo = __funnelshift_l(w2, w1, off);
    uint32_t s0 = hi >> 16, s1 = __funnelshift_l(lo, hi, K) >> 16;
    uint32_t s2 = __funnelshift_l(lo, hi, 2 * K) >> 16, s3 = __funnelshift_l(lo, hi, 3 * K) >> 16;
    d01 = exl3_decode2<CB>(s0, s1);
    d23 = exl3_decode2<CB>(s2, s3);
}

/* A block's chunk is 8 tile rows of the 8 tiles (128 columns) of output block b: 128 K uint4,
 * stored in the trellis as 8 runs of 16 K contiguous uint4 (one a tile row). Uint4 u of chunk ch
 * in global memory (tiles_n tiles a tile row). */
template <int K>
__device__ __forceinline__ uint4 exl3_chunk_load(const uint4 *__restrict__ tr, int64_t tiles_n, int64_t b, int ch, int u)
{
    constexpr int ROW4 = 16 * K;
    return tr[((int64_t)(8 * ch + u / ROW4) * tiles_n + 8 * b) * (2 * K) + u % ROW4];
}

/* Uint4 u of a chunk into its tile's words in shared memory: tile (u / 16K) * 8 + its place in
 * the tile row at ts + tile * (8K + 2), a tile's first two words repeated after its last (so a
 * run's three words never wrap: exl3_run). */
template <int K>
__device__ __forceinline__ void exl3_chunk_store(uint32_t *ts, int u, uint4 v)
{
    constexpr int TW = 8 * K + 2, Q4 = 2 * K, ROW4 = 16 * K;
    int ii = u / ROW4, w = u % ROW4, tile = w / Q4, q = w % Q4;
    uint32_t *d = &ts[(ii * 8 + tile) * TW];
    d[4 * q] = v.x;
    d[4 * q + 1] = v.y;
    d[4 * q + 2] = v.z;
    d[4 * q + 3] = v.w;
    if (q == 0) {
        d[8 * K] = v.x;
        d[8 * K + 1] = v.y;
    }
}

/* A slice's chunks ch0 .. ch1 - 1 through two shared buffers: load(ch) reads chunk ch into the
 * thread's registers, store(buf) writes them to buffer buf, compute(buf) uses buffer buf. The
 * next chunk's loads are issued before the current one is computed, and stored after it. */
template <class L, class S, class C>
__device__ __forceinline__ void exl3_chunks(int ch0, int ch1, L &&load, S &&store, C &&compute)
{
    load(ch0);
    store(0);
    __syncthreads();
    for (int ch = ch0; ch < ch1; ch++) {
        const int buf = (ch - ch0) & 1;
        if (ch + 1 < ch1)
            load(ch + 1);
        compute(buf);
        if (ch + 1 < ch1)
            store(buf ^ 1);
        __syncthreads();
    }
}

} // namespace dsv4cu
#endif
