/* kernels/cuda — the EXL3 middle step on the tensor cores (exl3.cu launches it when the linear
 * family takes them, cuda.h): part[s][t][c] = Σ over the slice's rows r of x'[t, r] Ŵ[r, c], the
 * same slices as the FMA core, each a chain of bf16 mma.sync steps with fp32 accumulation.
 * C++ only.
 *
 * Exactness. A codebook value is an fp16 value: 11 significant bits. Its top 8 (the fp32 bit
 * pattern with the low 16 bits cleared) are a bf16 value wh, and w - wh has at most 3 significant
 * bits, so it is a bf16 value wl: w = wh + wl exactly. x' is fp32, split by split3 (mma.cuh)
 * into three bf16 terms. The six products wh xe, wl xe are exact in the accumulator's input.
 *
 * The fragments fall out of the format. An m16n8k16 A fragment (16 x 16, M = the tile's output
 * columns, K = its input rows) gives lane (q = lane / 4, p = lane % 4) columns q and q + 8 at
 * rows 2p, 2p + 1, 2p + 8, 2p + 9: exactly run p of columns q and q + 8 (exl3_run). So a warp
 * owns one 16-column tile of the block's 128 and decodes each of its weights once per k-step,
 * for up to 32 tokens (four n-tiles of 8).
 *
 * Batch invariance. A token's sum is, over the slice's 128-row chunks in order and their 8
 * k-steps in order, the MMAs wh x_hi, wl x_hi, wh x_mid, wl x_mid, wh x_lo, wl x_lo into its
 * accumulator. Which n-tile holds the token, how many tokens the block holds and T change
 * none of these; the layer's shape alone fixes the slices (exl3.cu). */
#ifndef DSV4_CUDA_EXL3_MMA_CUH
#define DSV4_CUDA_EXL3_MMA_CUH

#include "kernels/cuda/exl3_code.cuh"
#include "kernels/cuda/mma.cuh"

namespace dsv4cu {

enum {
    X3_TN = 32,     /* tokens a block: four n-tiles of 8 */
    X3_XS = 136,    /* bf16 values a token's staged row of 128 takes (the pad spreads lanes over banks) */
    X3_THREADS = 256,
};

/* Dynamic shared memory of a block at K: two buffers each of the three terms' staged x and the
 * chunk's 64 tiles (8K words and two repeated). */
__host__ __device__ constexpr size_t exl3_tc_smem(int K)
{
    return 2 * (3 * X3_TN * X3_XS * 2 + 64 * (8 * K + 2) * 4);
}

/* part[s][t][bx*128 + c] for the block's 128 columns and tokens t0 .. t0 + 31 (those < T); grid
 * (nbr, S, ceil(T / 32)); 256 threads, warp jj the block's tile column jj. */
template <int K, int CB>
__global__ void __launch_bounds__(X3_THREADS, 2)
    exl3_core_tc(const uint4 *__restrict__ tr, const float *__restrict__ xh, float *__restrict__ part, int64_t kp,
                 int64_t np, int T, int64_t b0, int nbr, int chunks, int S)
{
    constexpr int TW = 8 * K + 2, C4 = 128 * K;             /* u32 a tile; uint4 a chunk (exl3_code.cuh) */
    constexpr int LD = (C4 + X3_THREADS - 1) / X3_THREADS; /* uint4 of a chunk a thread loads */
    constexpr int XPLANE = X3_TN * X3_XS / 2;              /* u32 a term's staged x */
    extern __shared__ __align__(16) uint32_t x3_smem[];
    uint32_t *xs0 = x3_smem, *ts0 = x3_smem + 2 * 3 * XPLANE;

    const int tid = threadIdx.x, lane = tid & 31, jj = tid >> 5, q = lane >> 2, p = lane & 3;
    const int bx = blockIdx.x, s = blockIdx.y, t0 = blockIdx.z * X3_TN;
    const int nt = T - t0 < X3_TN ? T - t0 : X3_TN, ng = (nt + 7) >> 3;
    const int64_t b = b0 + bx, tiles_n = np / 16;
    const int ch0 = (int)((int64_t)s * chunks / S), ch1 = (int)((int64_t)(s + 1) * chunks / S);

    int wa, oa, wb, ob; /* run p of columns q and q + 8 */
    exl3_run_at<K>(q, p, wa, oa);
    exl3_run_at<K>(q + 8, p, wb, ob);

    uint4 rg[LD];
    float4 rx[4];
    auto load = [&](int ch) {
#pragma unroll
        for (int v = 0; v < LD; v++) {
            int u = tid + X3_THREADS * v;
            if (u < C4)
                rg[v] = exl3_chunk_load<K>(tr, tiles_n, b, ch, u);
        }
#pragma unroll
        for (int v = 0; v < 4; v++) {
            int u = tid + X3_THREADS * v, t = u >> 5, c4 = u & 31;
            rx[v] = t < nt ? *reinterpret_cast<const float4 *>(xh + (int64_t)(t0 + t) * kp + 128 * (int64_t)ch + 4 * c4)
                           : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    };
    auto store = [&](int buf) {
        uint32_t *ts = ts0 + buf * 64 * TW, *xs = xs0 + buf * 3 * XPLANE;
#pragma unroll
        for (int v = 0; v < LD; v++) {
            int u = tid + X3_THREADS * v;
            if (u < C4)
                exl3_chunk_store<K>(ts, u, rg[v]);
        }
#pragma unroll
        for (int v = 0; v < 4; v++) {
            if (v >= ng) /* tokens 8v .. 8v + 7: an n-tile the block does not compute */
                break;
            int u = tid + X3_THREADS * v, t = u >> 5, c4 = u & 31;
            uint32_t p01[3], p23[3];
            split3(rx[v].x, rx[v].y, p01);
            split3(rx[v].z, rx[v].w, p23);
#pragma unroll
            for (int e = 0; e < 3; e++)
                *reinterpret_cast<uint2 *>(&xs[e * XPLANE + t * (X3_XS / 2) + 2 * c4]) = make_uint2(p01[e], p23[e]);
        }
    };

    float acc[X3_TN / 8][4];
#pragma unroll
    for (int n = 0; n < X3_TN / 8; n++)
        acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    exl3_chunks(ch0, ch1, load, store, [&](int buf) {
        const uint32_t *ts = ts0 + buf * 64 * TW, *xs = xs0 + buf * 3 * XPLANE;
#pragma unroll 2
        for (int i = 0; i < 8; i++) {
            const uint32_t *tw = &ts[(i * 8 + jj) * TW];
            float2 a01, a23, b01, b23;
            exl3_run<K, CB>(tw, wa, oa, a01, a23);
            exl3_run<K, CB>(tw, wb, ob, b01, b23);
            /* A fragment: (col q, rows 2p, 2p+1), (col q+8, same rows), (col q, rows 2p+8, 2p+9), (col q+8, same) */
            const float f[4][2] = {{a01.x, a01.y}, {b01.x, b01.y}, {a23.x, a23.y}, {b23.x, b23.y}};
            uint32_t wh[4], wl[4];
#pragma unroll
            for (int r = 0; r < 4; r++) {
                uint32_t u0 = __float_as_uint(f[r][0]) & 0xffff0000u, u1 = __float_as_uint(f[r][1]) & 0xffff0000u;
                wh[r] = hi_pair(u0, u1);
                wl[r] = hi_pair(__float_as_uint(f[r][0] - __uint_as_float(u0)),
                                __float_as_uint(f[r][1] - __uint_as_float(u1)));
            }
#pragma unroll
            for (int n = 0; n < X3_TN / 8; n++) {
                if (n < ng) {
                    const uint32_t *xr = xs + (8 * n + q) * (X3_XS / 2) + 8 * i + p;
#pragma unroll
                    for (int e = 0; e < 3; e++) {
                        uint32_t x0 = xr[e * XPLANE], x1 = xr[e * XPLANE + 4];
                        mma_bf16(acc[n], wh, x0, x1, acc[n]);
                        mma_bf16(acc[n], wl, x0, x1, acc[n]);
                    }
                }
            }
        }
    });
    const int64_t ncols = (int64_t)nbr * 128;
    float *ps = part + (int64_t)s * T * ncols + (int64_t)bx * 128 + 16 * jj;
#pragma unroll
    for (int n = 0; n < X3_TN / 8; n++) {
        int t = 8 * n + 2 * p;
        if (t < nt) {
            ps[(int64_t)(t0 + t) * ncols + q] = acc[n][0];
            ps[(int64_t)(t0 + t) * ncols + q + 8] = acc[n][2];
        }
        if (t + 1 < nt) {
            ps[(int64_t)(t0 + t + 1) * ncols + q] = acc[n][1];
            ps[(int64_t)(t0 + t + 1) * ncols + q + 8] = acc[n][3];
        }
    }
}

} // namespace dsv4cu
#endif
