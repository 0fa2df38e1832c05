/* CUDA backend, attn_step's indexer scores on the tensor cores: k_iscore_tc, which attn_step
 * runs in place of k_iscore when the tensor-core mode has the indexer (cuda.h: the default and
 * DSV4_CUDA_TC=1) and the shapes fit; the keys fp32 or packed (kvrow.cuh).
 *
 * The math. For a row r with nvis = (p + 1) / ratio > topk, every visible entry w < nvis gets
 *   score[r][w] = (sum_h (wt[r,h] iw_scale) relu(qi[r,h] . ikey[w])) * post
 * (V4: post = 1 / sqrt(ci); V4.1, whose weights carry every factor: iw_scale = post = 1)
 * as k_iscore computes it, with the dots on m16n8k16 bf16 MMAs: M = heads (16 a tile; nI padded
 * with zero rows), N = entries (8 a tile), K = ci (16 a k-step). q and the keys are fp32, so
 * each is split exactly into three bf16 terms (split3, mma.cuh: x = hi + mid + lo) and a dot is
 *   A = sum over k-steps in order of hi.hi               (one accumulator)
 *   B = sum over k-steps in order of hi.mid, mid.hi, hi.lo, lo.hi, mid.mid  (another)
 *   dot = A + B
 * Every product of two bf16 terms is exact in the accumulator's input; the terms left out
 * (mid.lo, lo.mid, lo.lo) are below 2^-21 |q_j k_j| together (|mid| < 2^-7 |x|, |lo| < 2^-15
 * |x|), and the small terms' sum is kept apart from the large one so its rounding does not add
 * to the chain of the large sum: the dot is exact to about fp32 rounding (a few units of 2^-24
 * of sum_j |q_j k_j|), as the FMA kernel's. Then per entry, over head tiles in order,
 * a thread adds fmaf(w_g, relu(dot_g), s) then the same for head g + 8 of the tile (w_h =
 * wt[r,h] iw_scale, 0 for a padded head), the eight threads of a column are added by a fixed
 * xor tree (lane offsets 4, 8, 16), and the sum is multiplied by post.
 *
 * Batch invariance. A block (row r = r0 + x, entries [64 y, 64 (y + 1))) reads only row r's q and head
 * weights, the keys of r's sequence and the shapes (nI, ci); the k-steps, the terms, the head
 * tiles and the tree are in an order fixed by nI and ci alone, and an entry's column sits in
 * the same place of its tile whatever the block's other entries are. So a row's scores never
 * depend on R, on the other rows or on where the row sits in the step. The grid (R, 64-entry
 * chunks of vis_cap) depends only on shapes, so a recorded step replays; rows that keep every
 * entry, and chunks past a row's entries, return at once.
 *
 * Fragments (mma.cuh's mapping): thread (g, t) = (lane / 4, lane % 4) loads, per k-step, the
 * float4 of d = 16 ks + 4 t .. + 3 of heads g and g + 8 of a tile (A) and of the tile's entry g
 * (B); its elements 0, 1 fill k slots 2t, 2t + 1 and its elements 2, 3 slots 2t + 8, 2t + 9, one
 * permutation of the k-step shared by both operands (a dot does not depend on the order of its
 * k slots' pairing, only on which elements pair). It holds the sums of heads g, g + 8 for
 * entries 2t, 2t + 1 of the tile. */
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/step.cuh"

using namespace dsv4cu;

namespace {

enum {
    IT_EPB = 64,                /* entries a block takes: a warp per n-tile of 8 */
    IT_HG = 4                   /* head tiles whose sums a warp holds at once */
};
static_assert(IT_EPB == 8 * NW, "a warp per 8-entry tile");

/* 16 bytes at p, as a float4 load when p is 16-byte aligned (aligned: the caller's uniform test). */
__device__ __forceinline__ float4 ld4(const float *p, bool aligned)
{
    if (aligned)
        return __ldg((const float4 *)p);
    return make_float4(__ldg(p), __ldg(p + 1), __ldg(p + 2), __ldg(p + 3));
}

__device__ __forceinline__ void mma4(float d[4], const uint4 &a, uint32_t b0, uint32_t b1)
{
    const uint32_t av[4] = {a.x, a.y, a.z, a.w};
    mma_bf16(d, av, b0, b1, d);
}

__device__ __forceinline__ float relu(float a) { return a > 0.0f ? a : 0.0f; }

/* Block (row r, entries [IT_EPB y, IT_EPB (y + 1))), NB threads. Row r's q is split once into
 * shared memory in fragment order: qs[term][head tile][k-step][lane] (uint4: a0..a3), zero rows
 * for the padded heads; then warp wid takes entries w0 + 8 wid .. + 7 (its B fragments split as
 * loaded, the next k-step's keys loaded ahead) over IT_HG head tiles at a time. */
template <int PROD>
__global__ void __launch_bounds__(NB, 4) k_iscore_tc(rows_dev rd_, int r0, int ratio, int topk, int64_t vis_cap, int nI,
                                                  int ci, float iw_scale, float post, const float *qi, const float *wt,
                                                  float *scores)
{
    PDL_WAIT();
    extern __shared__ uint4 qs[];
    const int r = r0 + (int)blockIdx.x, lane = threadIdx.x & 31, wid = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int64_t nvis = (rd_.pos[r] + 1) / ratio;
    const int64_t w0 = (int64_t)blockIdx.y * IT_EPB;
    if (nvis <= topk || nvis > vis_cap || w0 >= nvis)
        return;
    const int KS = ci / 16, HT = (nI + 15) / 16, TS = HT * KS * 32; /* TS: one term's uint4s */
    const float *q = qi + (int64_t)r * nI * ci, *wr = wt + (int64_t)r * nI;
    const bool qal = ((uintptr_t)q & 15) == 0;
    const float4 z4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    /* item (tile ht, k-step ks, lane l): heads 16 ht + l / 4 and + 8, d = 16 ks + 4 (l % 4); a
     * thread's QU items of a pass loaded together, then split and stored */
    enum { QU = 4 };
    for (int i0 = 0; i0 < TS; i0 += QU * NB) {
        float4 x[QU][2];
#pragma unroll
        for (int u = 0; u < QU; u++) {
            int it = i0 + u * NB + (int)threadIdx.x, l = it & 31, hk = it >> 5, ht = hk / KS, ks = hk - ht * KS;
            int h0 = ht * 16 + (l >> 2), h1 = h0 + 8, dd = ks * 16 + 4 * (l & 3);
            x[u][0] = it < TS && h0 < nI ? ld4(q + (int64_t)h0 * ci + dd, qal) : z4;
            x[u][1] = it < TS && h1 < nI ? ld4(q + (int64_t)h1 * ci + dd, qal) : z4;
        }
#pragma unroll
        for (int u = 0; u < QU; u++) {
            int it = i0 + u * NB + (int)threadIdx.x;
            if (it < TS) {
                uint32_t p0[3], p1[3], p2[3], p3[3];
                split3(x[u][0].x, x[u][0].y, p0);
                split3(x[u][1].x, x[u][1].y, p1);
                split3(x[u][0].z, x[u][0].w, p2);
                split3(x[u][1].z, x[u][1].w, p3);
#pragma unroll
                for (int e = 0; e < 3; e++)
                    qs[e * TS + it] = make_uint4(p0[e], p1[e], p2[e], p3[e]);
            }
        }
    }
    __syncthreads();
    const int64_t n0 = w0 + 8 * wid;
    if (n0 >= nvis)
        return; /* whole warps; no barrier below */
    const dsv4_lbufs &kb = rd_.st[rd_.seq[r]];
    const bool kin = n0 + g < nvis;
    const crow kc = cache_row(PROD ? (const void *)kb.pikey : kb.ikey, kin ? n0 + g : n0, ci, PROD, DSV4_KV_INDEX);
    const bool kal = ((uintptr_t)kb.ikey & 15) == 0;
    const float *kp = (const float *)kc.p + 4 * t; /* fp32 keys */
    /* the thread's four key values of k-step ks */
    auto kload = [&](int ks) -> float4 { return PROD ? kc.ld4(ks * 16 + 4 * t) : ld4(kp + ks * 16, kal); };
    float s0 = 0.0f, s1 = 0.0f; /* entries n0 + 2t, n0 + 2t + 1 */
    for (int hg = 0; hg < HT; hg += IT_HG) {
        float ah[IT_HG][4], al[IT_HG][4];
#pragma unroll
        for (int j = 0; j < IT_HG; j++)
#pragma unroll
            for (int c = 0; c < 4; c++)
                ah[j][c] = al[j][c] = 0.0f;
        float4 nx = kin ? kload(0) : z4;
        for (int ks = 0; ks < KS; ks++) {
            const float4 kv = nx;
            if (ks + 1 < KS)
                nx = kin ? kload(ks + 1) : z4;
            uint32_t b01[3], b23[3];
            split3(kv.x, kv.y, b01);
            split3(kv.z, kv.w, b23);
#pragma unroll
            for (int j = 0; j < IT_HG; j++) {
                if (hg + j < HT) {
                    const uint4 *ap = qs + ((hg + j) * KS + ks) * 32 + lane;
                    const uint4 aH = ap[0], aM = ap[TS], aL = ap[2 * TS];
                    mma4(ah[j], aH, b01[0], b23[0]); /* hi.hi */
                    mma4(al[j], aH, b01[1], b23[1]); /* hi.mid */
                    mma4(al[j], aM, b01[0], b23[0]); /* mid.hi */
                    mma4(al[j], aH, b01[2], b23[2]); /* hi.lo */
                    mma4(al[j], aL, b01[0], b23[0]); /* lo.hi */
                    mma4(al[j], aM, b01[1], b23[1]); /* mid.mid */
                }
            }
        }
#pragma unroll
        for (int j = 0; j < IT_HG; j++) {
            if (hg + j < HT) {
                int h0 = (hg + j) * 16 + g, h1 = h0 + 8;
                float wa = h0 < nI ? wr[h0] * iw_scale : 0.0f, wb = h1 < nI ? wr[h1] * iw_scale : 0.0f;
                s0 = fmaf(wa, relu(ah[j][0] + al[j][0]), s0);
                s0 = fmaf(wb, relu(ah[j][2] + al[j][2]), s0);
                s1 = fmaf(wa, relu(ah[j][1] + al[j][1]), s1);
                s1 = fmaf(wb, relu(ah[j][3] + al[j][3]), s1);
            }
        }
    }
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
        s0 += __shfl_xor_sync(0xffffffffu, s0, o);
        s1 += __shfl_xor_sync(0xffffffffu, s1, o);
    }
    const int64_t e0 = n0 + 2 * t;
    if (g == 0) {
        float *out = scores + (int64_t)blockIdx.x * vis_cap;
        if (e0 < nvis)
            out[e0] = s0 * post;
        if (e0 + 1 < nvis)
            out[e0 + 1] = s1 * post;
    }
}

int g_optin;                    /* the device's largest dynamic shared memory a block may opt into */
int g_smem_set;                 /* what k_iscore_tc was allowed so far */

/* Shared bytes of a block: the three terms of 16 ceil(nI / 16) heads of ci. */
size_t tc_qbytes(int nI, int ci) { return (size_t)3 * ((nI + 15) / 16) * (ci / 16) * 32 * sizeof(uint4); }

} // namespace

bool dsv4cu::iscore_tc_fits(int nI, int ci, int64_t vis_cap)
{
    if (!tc_family("index") || nI <= 0 || ci <= 0 || ci % 16 || cdiv(vis_cap, IT_EPB) > 65535)
        return false;
    if (!g_optin) {
        int dev = 0;
        if (CK(cudaGetDevice(&dev)) ||
            CK(cudaDeviceGetAttribute(&g_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev)))
            return false; /* the op has failed (recorded) */
    }
    return tc_qbytes(nI, ci) <= (size_t)g_optin;
}

bool dsv4cu::iscore_tc(const rows_dev &rd, int r0, int nr, int ratio, int topk, int64_t vis_cap, int nI, int ci,
                       float iw_scale, float post, const float *qi, const float *wt, float *scores, int prod)
{
    size_t smem = tc_qbytes(nI, ci);
    if (smem > 48 * 1024 && (int)smem > g_smem_set) {
        if (CK(cudaFuncSetAttribute(k_iscore_tc<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)) ||
            CK(cudaFuncSetAttribute(k_iscore_tc<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)))
            return false;
        g_smem_set = (int)smem;
    }
    launch_k(prod ? k_iscore_tc<1> : k_iscore_tc<0>, dim3((unsigned)nr, (unsigned)cdiv(vis_cap, IT_EPB)), NB, smem,
             stream, rd, r0, ratio, topk, vis_cap, nI, ci, iw_scale, post, qi, wt, scores);
    return launched("attn_step indexer scores (tensor cores)");
}
