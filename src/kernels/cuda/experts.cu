/* CUDA routed experts: (row, expert) pairs grouped by expert into tiles, each tile's W1/W3 and
 * W2 through the linear row kernel, the activation and the weighted sum in pair order. */
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cuda/internal.h"
#include "kernels/cuda/rounding.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/wgmma.cuh"
#include "kernels/cuda/expert_stage.cuh"

using namespace dsv4cu;

/* ---- routed experts ----------------------------------------------------------------- */

/* The per-expert weight parameters of one weights array (a layer's w1, w2 or w3) in device
 * memory, built once and found again by the array's host address; rebuilt after any drop
 * (the device copies may have moved). in_host: E device flags, 1 where that expert is in
 * pinned host memory (NULL when none is). */
struct xtab {
    const dsv4_weight *host;
    int E;
    unsigned gen;
    wdev *dev;
    int *in_host;
};
static xtab *g_xt;
static int g_nxt, g_capxt;
static cudaStream_t g_side;     /* non-blocking: table uploads that must not touch the op stream */

static const wdev *expert_table(const dsv4_weight *w, int E, int K, const int **in_host)
{
    *in_host = NULL;
    for (int i = 0; i < g_nxt; i++)
        if (g_xt[i].host == w && g_xt[i].E == E) {
            if (g_xt[i].gen == drops) {
                *in_host = g_xt[i].in_host;
                return g_xt[i].dev;
            }
            /* stale: the old table may still be read by queued work, so it is not freed here */
            g_xt[i] = g_xt[--g_nxt];
            break;
        }
    const dsv4_weight *a = &w[0];
    wdev *h = (wdev *)malloc((size_t)E * sizeof(wdev));
    int *fl = (int *)calloc((size_t)E, sizeof(int)), nhost = 0;
    if (!h || !fl) {
        free(h);
        free(fl);
        fail(DSV4_E_NOMEM, "cuda: experts: out of host memory for an expert table");
        return NULL;
    }
    for (int e = 0; e < E; e++) {
        const dsv4_weight *b = &w[e];
        if (!dsv4_cuda_expert_owned(e)) { /* another rank's: never read here */
            memset(&h[e], 0, sizeof h[e]);
            continue;
        }
        if (b->form != a->form || b->n != a->n || b->k != a->k || b->bn != a->bn || b->bk != a->bk ||
            b->scale_e8m0 != a->scale_e8m0 || (b->scale == NULL) != (a->scale == NULL) || b->form >= DSV4_WF_EXL3) {
            fail(DSV4_E_UNSUPPORTED, "cuda: experts: weight %s differs from %s in form, shape or blocks",
                 b->name ? b->name : "?", a->name ? a->name : "?");
            free(h);
            return NULL;
        }
        resident *rq = resident_of(b->data), *rs = b->scale ? resident_of(b->scale) : NULL;
        if (!rq || (b->scale && !rs)) {
            fail(DSV4_E_ARG, "cuda: experts: weight %s is not on the device (dsv4_cuda_put_weight or pin_weight first)",
                 b->name ? b->name : "?");
            free(h);
            return NULL;
        }
        h[e] = wdev_of_n(b, rq->dev, rs ? rs->dev : NULL, K);
        fl[e] = rq->pinned || (rs && rs->pinned);
        nhost += fl[e];
    }
    wdev *d = NULL;
    int *dfl = NULL;
    if (!g_side && CK(cudaStreamCreateWithFlags(&g_side, cudaStreamNonBlocking))) {
        free(h);
        return NULL;
    }
    if (CK(cudaMalloc((void **)&d, (size_t)E * sizeof(wdev))) ||
        CK(cudaMemcpyAsync(d, h, (size_t)E * sizeof(wdev), cudaMemcpyHostToDevice, g_side)) ||
        (nhost && (CK(cudaMalloc((void **)&dfl, (size_t)E * sizeof(int))) ||
                   CK(cudaMemcpyAsync(dfl, fl, (size_t)E * sizeof(int), cudaMemcpyHostToDevice, g_side)))) ||
        CK(cudaStreamSynchronize(g_side))) {
        free(h);
        free(fl);
        return NULL;
    }
    free(h);
    free(fl);
    if (g_nxt == g_capxt) {
        int nc = g_capxt ? 2 * g_capxt : 64;
        xtab *n = (xtab *)realloc(g_xt, (size_t)nc * sizeof(xtab));
        if (!n) {
            fail(DSV4_E_NOMEM, "cuda: experts: out of host memory for the expert tables");
            return NULL;
        }
        g_xt = n;
        g_capxt = nc;
    }
    g_xt[g_nxt++] = xtab{w, E, drops, d, dfl};
    *in_host = dfl;
    return d;
}

/* The (row, k) pairs grouped by expert, stable by pair index: cnt/off per expert, ord the
 * pairs in expert order, tiles of up to `tile` pairs of one expert as (expert, first, rows).
 * One block of EX_SORT threads, E <= EX_SORT; pairs with an expert outside 0..E-1, or another
 * rank's (e % world != rank), are left out. */
enum { EX_SORT = 1024 };

__global__ void __launch_bounds__(EX_SORT) k_ex_sort(const int32_t *eid, int RK, int E, int tile, int rank,
                                                     int world, int *cnt, int *off, int *ord, int *tiles,
                                                     int *ntiles)
{
    PDL_WAIT();
    /* counts and offsets in shared memory */
    extern __shared__ int sm[];
    int *scnt = sm, *soff = sm + E, *chunk = sm + 2 * E;
    if (threadIdx.x < E)
        scnt[threadIdx.x] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < RK; i += EX_SORT) {
        int e = eid[i];
        if (e >= 0 && e < E && e % world == rank)
            atomicAdd(&scnt[e], 1);
    }
    __syncthreads();
    { /* thread e: its pairs' and tiles' offsets by a block scan, then its tiles */
        __shared__ int wsum[2][EX_SORT / 32];
        int e = threadIdx.x, lane = e & 31, wid = e >> 5;
        int c = e < E ? scnt[e] : 0, nt = (c + tile - 1) / tile, ic = c, it = nt;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            int a = __shfl_up_sync(0xffffffffu, ic, o), b = __shfl_up_sync(0xffffffffu, it, o);
            if (lane >= o)
                ic += a, it += b;
        }
        if (lane == 31)
            wsum[0][wid] = ic, wsum[1][wid] = it;
        __syncthreads();
        if (wid == 0) {
            int a = wsum[0][lane], b = wsum[1][lane];
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                int pa = __shfl_up_sync(0xffffffffu, a, o), pb = __shfl_up_sync(0xffffffffu, b, o);
                if (lane >= o)
                    a += pa, b += pb;
            }
            wsum[0][lane] = a, wsum[1][lane] = b;
        }
        __syncthreads();
        int o = ic - c + (wid ? wsum[0][wid - 1] : 0), t0 = it - nt + (wid ? wsum[1][wid - 1] : 0);
        if (e < E)
            soff[e] = o;
        for (int k = 0; k < nt; k++) {
            tiles[3 * (t0 + k)] = e;
            tiles[3 * (t0 + k) + 1] = o + k * tile;
            tiles[3 * (t0 + k) + 2] = min(tile, c - k * tile);
        }
        if (e == EX_SORT - 1)
            *ntiles = wsum[1][EX_SORT / 32 - 1];
    }
    __syncthreads();
    if (threadIdx.x < E) {
        cnt[threadIdx.x] = scnt[threadIdx.x];
        off[threadIdx.x] = soff[threadIdx.x];
    }
    /* thread e places expert e's pairs in pair order */
    int e = threadIdx.x, at = e < E ? soff[e] : 0;
    bool mine = e < E && e % world == rank;
    for (int c0 = 0; c0 < RK; c0 += EX_SORT) {
        __syncthreads();
        if (c0 + threadIdx.x < RK)
            chunk[threadIdx.x] = eid[c0 + threadIdx.x];
        __syncthreads();
        int n = min(EX_SORT, RK - c0);
        if (mine)
            for (int i = 0; i < n; i++)
                if (chunk[i] == e)
                    ord[at++] = c0 + i;
    }
}

/* Tile tl of the tile table: its expert, first pair and pair count; false past the count. */
__device__ __forceinline__ bool ex_tile(const int *tiles, const int *ntiles, int tl, int &e, int &s0, int &n)
{
    if (tl >= *ntiles)
        return false;
    e = tiles[3 * tl], s0 = tiles[3 * tl + 1], n = tiles[3 * tl + 2];
    return true;
}

/* W1 (z = 0, into G) and W3 (z = 1, into U) of each tile's expert over the tile's x rows:
 * block (tile, row block, z). Blocks past the tile count exit. */
template <int F, bool VEC, int TT>
__global__ void __launch_bounds__(LIN_WARPS * 32, VEC && TT == 1 ? 4 : 1) k_ex_up(const wdev *t1, const wdev *t3, const int *tiles,
                                                         const int *ntiles, const int *ord, const float *x, float *G,
                                                         float *U, int K, int D, int I)
{
    PDL_WAIT();
    int tl = blockIdx.x;
    int e, s0, n;
    if (!ex_tile(tiles, ntiles, tl, e, s0, n))
        return;
    wdev w = blockIdx.z ? t3[e] : t1[e];
    pair_map m = {x, blockIdx.z ? U : G, ord + s0, K, D, I};
    linear_rows<F, VEC, TT>(w, 0, I, m, n, blockIdx.y);
}

/* W2 of each tile's expert over the tile's h rows (G), into Y. */
template <int F, bool VEC, int TT>
__global__ void __launch_bounds__(LIN_WARPS * 32, VEC && TT == 1 ? 4 : 1) k_ex_down(const wdev *t2, const int *tiles, const int *ntiles,
                                                           const int *ord, const float *G, float *Y, int D, int I)
{
    PDL_WAIT();
    int tl = blockIdx.x;
    int e, s0, n;
    if (!ex_tile(tiles, ntiles, tl, e, s0, n))
        return;
    wdev w = t2[e];
    pair_map m = {G, Y, ord + s0, 1, I, D};
    linear_rows<F, VEC, TT>(w, 0, D, m, n, blockIdx.y);
}

/* The tensor-core builds of the two (mma.cuh): NT = 1 for tiles of up to 8 pairs, TC_TN / 8 for
 * tiles of up to TC_TN. Split (part != NULL): W1's slabs at part, W3's after them (S1 slabs of
 * [RK, I] each), W2's at part; blockIdx.z is W1 / W3 in its low bit and the slice above it.
 * blockIdx.x is row block + tile * (the row blocks, tc_blocks of the rows): a tile's row blocks
 * run together, so its x rows come from memory once and from the L2 for the others. */
template <int F, int NT, int E>
__global__ void TC_BOUNDS(NT) k_tc_ex_up(const wdev *t1, const wdev *t3, const int *tiles, const int *ntiles,
                                         const int *ord, const float *x, float *G, float *U, int K, int D, int I,
                                         float *part, int64_t slab, int S1)
{
    PDL_WAIT();
    const int nrb = tc_blocks(I), tl = (int)(blockIdx.x / nrb), z = blockIdx.z & 1;
    int e, s0, n;
    if (!ex_tile(tiles, ntiles, tl, e, s0, n))
        return;
    wdev w = z ? t3[e] : t1[e];
    pair_map m = {x, z ? U : G, ord + s0, K, D, I};
    tc_rows<F, NT, pair_map, E>(w, 0, I, m, n, (int)(blockIdx.x % nrb), part ? part + (z ? (int64_t)S1 * slab : 0) : NULL, I, slab,
                   (int)(blockIdx.z >> 1), (int)(gridDim.z >> 1));
}

template <int F, int NT, int E>
__global__ void TC_BOUNDS(NT) k_tc_ex_down(const wdev *t2, const int *tiles, const int *ntiles, const int *ord,
                                           const float *G, float *Y, int D, int I, float *part, int64_t slab)
{
    PDL_WAIT();
    const int nrb = tc_blocks(D), tl = (int)(blockIdx.x / nrb);
    int e, s0, n;
    if (!ex_tile(tiles, ntiles, tl, e, s0, n))
        return;
    wdev w = t2[e];
    pair_map m = {G, Y, ord + s0, 1, I, D};
    tc_rows<F, NT, pair_map, E>(w, 0, D, m, n, (int)(blockIdx.x % nrb), part, D, slab, (int)blockIdx.z, (int)gridDim.z);
}

/* The wgmma pass's builds (wgmma.cuh) for 64-pair tiles: a tile's x (up: the pairs' rows of x;
 * down: their rows of h) staged once (a block a run: blockIdx.y the run, blockIdx.z the tile;
 * its mid/lo flag into xf), then each tile's row blocks. */
template <int F, int E>
__global__ void __launch_bounds__(wg_stage_threads<F>()) k_wg_ex_stage(const int *tiles, const int *ntiles,
                                                                      const int *ord, const float *x, int xdiv,
                                                                      int64_t ldx, int k, int nrun, uint8_t *xb,
                                                                      uint8_t *xf)
{
    PDL_WAIT();
    const int tl = (int)blockIdx.z;
    int e, s0, n;
    if (!ex_tile(tiles, ntiles, tl, e, s0, n))
        return;
    pair_map m = {x, NULL, ord + s0, xdiv, ldx, 0};
    bool wide = wg_stage<F, E>(m, n, k, (int)blockIdx.y, (int)threadIdx.x,
                               xb + (int64_t)tl * nrun * wg_tile_bytes<F, E>());
    if (E > 1) {
        int any = __syncthreads_or(wide);
        if (threadIdx.x == 0)
            xf[(int64_t)tl * nrun + blockIdx.y] = any != 0;
    }
}

/* Pairs a tile holds on the tensor-core path when the pairs average EX_TC_BUSY an expert (8
 * below). */
enum { EX_TC_TILE = TC_TN, EX_TC_BUSY = 16 };

/* A wgmma block's items: tile tl of expert e (first pair s0, n pairs), and with NB = 2 the
 * expert's next tile beside it (its tiles paired from the first, off[e] the expert's first
 * pair). Whether the block has them: false for the second tile of a pair. */
template <int F, int E, int NB>
__device__ __forceinline__ bool wg_ex_items(const int *tiles, const int *ntiles, const int *off, int tl, int e,
                                            int s0, int n, const float *y, int xdiv, int64_t ldy, const int *ord,
                                            const uint8_t *xb, const uint8_t *xf, int nrun, float *part,
                                            wg_tiles<pair_map, NB> &L)
{
    static_assert(EX_TC_TILE == WG_N, "a tile is one token block of the pass");
    int e1 = -1, s1 = 0, n1 = 0;
    if (NB > 1) {
        if (((s0 - __ldg(off + e)) / WG_N) & 1)
            return false;
        if (!ex_tile(tiles, ntiles, tl + 1, e1, s1, n1))
            e1 = -1;
    }
    L.n = e1 == e ? 2 : 1;
    L.pt = part;
#pragma unroll
    for (int h = 0; h < NB; h++) {
        L.m[h] = pair_map{NULL, (float *)y, ord + (h ? s1 : s0), xdiv, 0, ldy};
        L.T[h] = h ? n1 : n;
        L.xt[h] = xb + (int64_t)(tl + h) * nrun * wg_tile_bytes<F, E>();
        L.xf[h] = xf + (int64_t)(tl + h) * nrun;
    }
    return true;
}

template <int F, int E, int DA, int NB>
__global__ void __launch_bounds__(WG_THREADS, 1)
    k_wg_ex_up(const wdev *t1, const wdev *t3, const int *tiles, const int *ntiles, const int *off, const int *ord,
               const uint8_t *xb, const uint8_t *xf, int nrun, float *G, float *U, int K, int D, int I, float *part,
               int64_t slab, int S1)
{
    PDL_WAIT();
    const int nrb = wg_blocks(I), tl = (int)(blockIdx.x / nrb), z = blockIdx.z & 1;
    int e, s0, n;
    wg_tiles<pair_map, NB> L;
    if (!ex_tile(tiles, ntiles, tl, e, s0, n) ||
        !wg_ex_items<F, E, NB>(tiles, ntiles, off, tl, e, s0, n, z ? U : G, K, I, ord, xb, xf, nrun,
                               part ? part + (z ? (int64_t)S1 * slab : 0) : NULL, L))
        return;
    const wdev w = z ? t3[e] : t1[e];
    wg_rows<F, E, wg_tiles<pair_map, NB>, DA, NB>(w, 0, I, L, (int)(blockIdx.x % nrb), I, slab,
                                                     (int)(blockIdx.z >> 1), (int)(gridDim.z >> 1));
}

template <int F, int E, int DA, int NB>
__global__ void __launch_bounds__(WG_THREADS, 1)
    k_wg_ex_down(const wdev *t2, const int *tiles, const int *ntiles, const int *off, const int *ord,
                 const uint8_t *xb, const uint8_t *xf, int nrun, float *Y, int D, int I, float *part, int64_t slab)
{
    PDL_WAIT();
    const int nrb = wg_blocks(D), tl = (int)(blockIdx.x / nrb);
    int e, s0, n;
    wg_tiles<pair_map, NB> L;
    if (!ex_tile(tiles, ntiles, tl, e, s0, n) ||
        !wg_ex_items<F, E, NB>(tiles, ntiles, off, tl, e, s0, n, Y, 1, D, ord, xb, xf, nrun, part, L))
        return;
    const wdev w = t2[e];
    wg_rows<F, E, wg_tiles<pair_map, NB>, DA, NB>(w, 0, D, L, (int)(blockIdx.x % nrb), D, slab,
                                                     (int)blockIdx.z, (int)gridDim.z);
}

/* h = swiglu(g, u), times the pair's weight when pre_weight; into G. */
__global__ void k_ex_act(float *G, const float *U, const float *wts, int64_t n, int I, float limit, int pre_weight,
                         int ref)
{
    PDL_WAIT();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    /* REF: the products rounded to bf16 before the activation, h after it */
    float h = ref ? swiglu1(rt_bf16(G[i]), rt_bf16(U[i]), limit) : swiglu1(G[i], U[i], limit);
    if (pre_weight)
        h *= wts[i / I];
    G[i] = ref ? rt_bf16(h) : h;
}

/* REF between the phases: h's rows through e4m3 blocks when w2 is FP8/FP4, in place (each
 * block is read whole before it is written). */
static bool ex_ref_h(const dsv4_experts_args *a, float *G)
{
    if (!a->ref || (a->w2[0].form != DSV4_WF_FP8 && a->w2[0].form != DSV4_WF_FP4))
        return true;
    return quant_rows(G, (int64_t)a->R * a->K, a->I, a->I, dsv4_act_block(&a->w2[0]), G) &&
           launched("experts h quantized") != 0;
}

/* y_r = sum over k in order of (pre_weight ? 1 : w_rk) Y_rk; a pair with no valid expert
 * makes its row NaN. */
__global__ void k_ex_sum(const float *Y, const float *wts, const int32_t *eid, int E, int K, int D, int64_t n,
                         int pre_weight, float *y)
{
    PDL_WAIT();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    int64_t r = i / D;
    int dd = (int)(i % D);
    float s = 0.0f;
    for (int k = 0; k < K; k++) {
        int64_t pr = r * K + k;
        int e = eid[pr];
        float v = Y[pr * D + dd];
        if (e < 0 || e >= E)
            v = __int_as_float(0x7fc00000);
        s = fmaf(pre_weight ? 1.0f : wts[pr], v, s);
    }
    y[i] = s;
}

/* The tensor-core path: W1/W3, the activation, W2, each tile's rows in one pass; a launch split
 * into slice groups (tc_groups, from the weight and the tile grid) is folded after it. The
 * grids cover the tile bound NT; tiles past the count exit. E terms of x: one under REF, whose
 * quantized x and h are bf16 values (mma.cuh). */
template <int F, int NTT, int E>
static void launch_tc_experts(const dsv4_experts_args *a, const wdev *t1, const wdev *t2, const wdev *t3, int NT,
                              const int *tiles, const int *ntiles, const int *off, const int *ord, float *G, float *U,
                              float *Y)
{
    wdev d1 = wdev_of_n(&a->w1[0], NULL, NULL, a->K), d2 = wdev_of_n(&a->w2[0], NULL, NULL, a->K);
    int K = a->K, D = a->D, I = a->I, threads = TC_TW * 32;
    int64_t RK = (int64_t)a->R * K, slab1 = RK * I, slab2 = RK * D;
    int rb1 = tc_blocks(I), rb2 = tc_blocks(D);
    int z1 = tc_groups(d1.tcs, (int64_t)NT * rb1 * 2, NTT), z2 = tc_groups(d2.tcs, (int64_t)NT * rb2, NTT);
    bool sp1 = z1 > 1, sp2 = z2 > 1;
    float *p1 = sp1 ? tc_part_buf((size_t)2 * d1.tcs * slab1 + (sp2 ? (size_t)d2.tcs * slab2 : 0)) : NULL;
    float *p2 = sp2 ? (sp1 ? p1 + (size_t)2 * d1.tcs * slab1 : tc_part_buf((size_t)d2.tcs * slab2)) : NULL;
    if ((sp1 && !p1) || (sp2 && !p2))
        return;
    dim3 g1((unsigned)((int64_t)NT * rb1), 1u, 2u * (unsigned)z1), g2((unsigned)((int64_t)NT * rb2), 1u, (unsigned)z2);
    /* 64-pair tiles on wgmma: each tile's x, then h, staged for it */
    constexpr bool wgp = NTT == TC_TN / 8;
    bool wg = wgp && wg_use(F, RK);
    enum { TB = wg_tile_bytes<F, E>(), G_ = tcf<F>::G };
    const int nrun1 = (int)cdiv(D, 16 * G_), nrun2 = (int)cdiv(I, 16 * G_);
    const size_t b1 = (size_t)NT * nrun1 * TB, b2 = (size_t)NT * nrun2 * TB;
    uint8_t *xb1 = wg ? wg_buf(0, b1 + (size_t)NT * nrun1) : NULL, *xb2 = wg ? wg_buf(1, b2 + (size_t)NT * nrun2) : NULL;
    if (wg && (!xb1 || !xb2)) /* no room for the staged x: the mma.sync pass, the same bits */
        wg = false;
    uint8_t *xf1 = wg ? xb1 + b1 : NULL, *xf2 = wg ? xb2 + b2 : NULL;
    if constexpr (wgp)
        if (wg) {
            launch_k(k_wg_ex_stage<F, E>, dim3(1u, (unsigned)nrun1, (unsigned)NT), wg_stage_threads<F>(), 0, stream, tiles,
                     ntiles, ord, a->x, K, (int64_t)D, D, nrun1, xb1, xf1);
            wg_shape([&](auto sh) {
                enum { DA = decltype(sh)::DA, NB = decltype(sh)::NB };
                static bool attr = false;
                if (!attr) {
                    cudaFuncSetAttribute(k_wg_ex_up<F, E, DA, NB>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)wg_smem<F, E, NB>());
                    cudaFuncSetAttribute(k_wg_ex_down<F, E, DA, NB>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)wg_smem<F, E, NB>());
                    attr = true;
                }
                dim3 g((unsigned)((int64_t)NT * wg_blocks(I)), 1u, 2u * (unsigned)z1);
                launch_k(k_wg_ex_up<F, E, DA, NB>, g, WG_THREADS, wg_smem<F, E, NB>(), stream, t1, t3,
                         tiles, ntiles, off, ord, (const uint8_t *)xb1, (const uint8_t *)xf1, nrun1, G, U, K, D, I, p1,
                         slab1, d1.tcs);
            });
        }
    if (!wg)
        launch_k(k_tc_ex_up<F, NTT, E>, g1, threads, 0, stream, t1, t3, tiles, ntiles, ord, a->x, G, U, K, D, I, p1, slab1,
                 d1.tcs);
    if (sp1) {
        tc_fold(p1, d1.tcs, RK, I, I, slab1, G, I, stream);
        tc_fold(p1 + (size_t)d1.tcs * slab1, d1.tcs, RK, I, I, slab1, U, I, stream);
    }
    if (!launched("experts w1/w3"))
        return;
    prof_split("experts: w1, w3");
    int64_t nh = RK * I;
    launch_k(k_ex_act, (unsigned)cdiv(nh, 256), 256, 0, stream, G, U, a->wts, nh, I, a->limit, a->pre_weight, a->ref);
    if (!launched("experts swiglu") || !ex_ref_h(a, G))
        return;
    prof_split("experts: swiglu");
    /* the fold writes every pair's row: other ranks' pairs must fold to -0 (comm.cu) */
    if (sp2)
        ep_clear(p2, (int64_t)d2.tcs * slab2);
    if constexpr (wgp)
        if (wg) {
            launch_k(k_wg_ex_stage<F, E>, dim3(1u, (unsigned)nrun2, (unsigned)NT), wg_stage_threads<F>(), 0, stream, tiles,
                     ntiles, ord, (const float *)G, 1, (int64_t)I, I, nrun2, xb2, xf2);
            wg_shape([&](auto sh) {
                enum { DA = decltype(sh)::DA, NB = decltype(sh)::NB };
                dim3 g((unsigned)((int64_t)NT * wg_blocks(D)), 1u, (unsigned)z2);
                launch_k(k_wg_ex_down<F, E, DA, NB>, g, WG_THREADS, wg_smem<F, E, NB>(), stream, t2,
                         tiles, ntiles, off, ord, (const uint8_t *)xb2, (const uint8_t *)xf2, nrun2, Y, D, I, p2,
                         slab2);
            });
        }
    if (!wg)
        launch_k(k_tc_ex_down<F, NTT, E>, g2, threads, 0, stream, t2, tiles, ntiles, ord, G, Y, D, I, p2, slab2);
    if (sp2)
        tc_fold(p2, d2.tcs, RK, D, D, slab2, Y, D, stream);
    launched("experts w2");
    prof_split("experts: w2");
}

/* The tensor-core path's build for the tile size and the kind (the three matrices' kinds
 * agree: experts_run). */
template <int F, int E>
static void launch_tc_tile(const dsv4_experts_args *a, const wdev *t1, const wdev *t2, const wdev *t3, int tile, int NT,
                           const int *tiles, const int *ntiles, const int *off, const int *ord, float *G, float *U,
                           float *Y)
{
    if constexpr (F == DSV4_WF_FP8)
        if (tc_kind(&a->w1[0]) == TC_FP8_32) {
            if (tile <= 8)
                launch_tc_experts<TC_FP8_32, 1, E>(a, t1, t2, t3, NT, tiles, ntiles, off, ord, G, U, Y);
            else
                launch_tc_experts<TC_FP8_32, TC_TN / 8, E>(a, t1, t2, t3, NT, tiles, ntiles, off, ord, G, U, Y);
            return;
        }
    if (tile <= 8)
        launch_tc_experts<F, 1, E>(a, t1, t2, t3, NT, tiles, ntiles, off, ord, G, U, Y);
    else
        launch_tc_experts<F, TC_TN / 8, E>(a, t1, t2, t3, NT, tiles, ntiles, off, ord, G, U, Y);
}

template <int F>
static void launch_experts(const dsv4_experts_args *a, const wdev *t1, const wdev *t2, const wdev *t3, bool vec1,
                           bool vec2, bool tc, int tile, int NT, const int *tiles, const int *ntiles, const int *off,
                           const int *ord, float *G, float *U, float *Y)
{
    const dsv4_weight *w1 = &a->w1[0], *w2 = &a->w2[0];
    if constexpr (F == DSV4_WF_BF16 || F == DSV4_WF_FP8 || F == DSV4_WF_FP4) {
        if (tc) {
            /* REF quantizes x and h of FP8 and FP4 experts (experts_run, ex_ref_h): bf16 values */
            if constexpr (F != DSV4_WF_BF16)
                if (a->ref) {
                    launch_tc_tile<F, TC_X1>(a, t1, t2, t3, tile, NT, tiles, ntiles, off, ord, G, U, Y);
                    return;
                }
            launch_tc_tile<F, TC_X3>(a, t1, t2, t3, tile, NT, tiles, ntiles, off, ord, G, U, Y);
            return;
        }
    }
    int wpr1 = wdev_of_n(w1, NULL, NULL, a->K).wpr, wpr2 = wdev_of_n(w2, NULL, NULL, a->K).wpr;
    int rpb1 = vec1 ? LIN_WARPS / wpr1 * chunk_shape(F).R : LIN_WARPS;
    int rpb2 = vec2 ? LIN_WARPS / wpr2 * chunk_shape(F).R : LIN_WARPS;
    dim3 g1((unsigned)NT, (unsigned)cdiv(a->I, rpb1), 2), g2((unsigned)NT, (unsigned)cdiv(a->D, rpb2));
    int K = a->K, D = a->D, I = a->I;
    if (tile == 1 && vec1)
        launch_k(k_ex_up<F, true, 1>, g1, LIN_WARPS * 32, 0, stream, t1, t3, tiles, ntiles, ord, a->x, G, U, K, D, I);
    else if (vec1)
        launch_k(k_ex_up<F, true, LIN_TT>, g1, LIN_WARPS * 32, 0, stream, t1, t3, tiles, ntiles, ord, a->x, G, U, K, D, I);
    else
        launch_k(k_ex_up<F, false, LIN_TT>, g1, LIN_WARPS * 32, 0, stream, t1, t3, tiles, ntiles, ord, a->x, G, U, K, D, I);
    if (!launched("experts w1/w3"))
        return;
    prof_split("experts: w1, w3");
    int64_t nh = (int64_t)a->R * K * I;
    launch_k(k_ex_act, (unsigned)cdiv(nh, 256), 256, 0, stream, G, U, a->wts, nh, I, a->limit, a->pre_weight, a->ref);
    if (!launched("experts swiglu") || !ex_ref_h(a, G))
        return;
    prof_split("experts: swiglu");
    if (tile == 1 && vec2)
        launch_k(k_ex_down<F, true, 1>, g2, LIN_WARPS * 32, 0, stream, t2, tiles, ntiles, ord, G, Y, D, I);
    else if (vec2)
        launch_k(k_ex_down<F, true, LIN_TT>, g2, LIN_WARPS * 32, 0, stream, t2, tiles, ntiles, ord, G, Y, D, I);
    else
        launch_k(k_ex_down<F, false, LIN_TT>, g2, LIN_WARPS * 32, 0, stream, t2, tiles, ntiles, ord, G, Y, D, I);
    launched("experts w2");
    prof_split("experts: w2");
}

/* Up to this many pairs, each pair is its own tile (the T = 1 build, as a decode step's linear
 * runs); above, tiles of up to LIN_TT rows of one expert share the expert's weight reads. */
enum { EX_SOLO_PAIRS = 64 };

static void experts_run(const dsv4_experts_args *a);

/* Whether every expert of w has the first one's storage form, shape and blocks, of a form the
 * grouped kernels take. */
static bool experts_uniform(const dsv4_weight *w, int E)
{
    for (int e = 0; e < E; e++)
        if (w[e].form != w[0].form || w[e].n != w[0].n || w[e].k != w[0].k || w[e].bn != w[0].bn ||
            w[e].bk != w[0].bk || w[e].scale_e8m0 != w[0].scale_e8m0 || (w[e].scale == NULL) != (w[0].scale == NULL) ||
            w[e].form >= DSV4_WF_EXL3)
            return false;
    return true;
}

__global__ void k_scale_rows(float *g, int64_t n, int I, const float *w)
{
    PDL_WAIT();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        g[i] *= w[i / I];
}

/* Experts of mixed storage forms (EXL3 packs, partly quantized checkpoints): the step waits for
 * the routing, and each used expert's rows go through the linear op together, as the CPU
 * groups them; then the grouped path's combine. Not recordable (it reads eid on the host). */
/* One product of the by-expert path: linear, with REF's quantized input and bf16 output. */
static void ex_lin(const dsv4_weight *w, int64_t nout, const float *x, int n, float *y, int ref)
{
    if (ref && (w->form == DSV4_WF_FP8 || w->form == DSV4_WF_FP4))
        cu_linear_q(w, 0, nout, x, n, w->k, y, nout);
    else
        cu_linear(w, 0, nout, x, n, w->k, y, nout);
    if (ref)
        cu_round_bf16(y, (int64_t)n * nout);
}

static void experts_by_expert(const dsv4_experts_args *a)
{
    int R = a->R, K = a->K, D = a->D, I = a->I, E = a->E, RK = R * K;
    size_t by = (size_t)R * D * sizeof(float), rkb = (size_t)RK * sizeof(float);
    if (capturing) {
        pthread_mutex_lock(&dsv4cu::lock);
        fail(DSV4_E_UNSUPPORTED, "cuda: experts of mixed storage forms route on the host (not recordable)");
        pthread_mutex_unlock(&dsv4cu::lock);
        return;
    }
    int32_t *eid = (int32_t *)malloc(RK * sizeof(int32_t));
    int *rows = (int *)malloc(RK * sizeof(int));
    float *wsel = (float *)malloc(rkb), *hw = (float *)malloc(rkb);
    float *xd = NULL, *xb = NULL, *g = NULL, *u = NULL, *yb = NULL, *Y = NULL, *dw = NULL, *yd = NULL;
    int32_t *de = NULL;
    bool ok = eid && rows && wsel && hw && !CK(cudaMalloc((void **)&xb, (size_t)RK * D * sizeof(float))) &&
              !CK(cudaMalloc((void **)&g, (size_t)RK * I * sizeof(float))) &&
              !CK(cudaMalloc((void **)&u, (size_t)RK * I * sizeof(float))) &&
              !CK(cudaMalloc((void **)&yb, (size_t)RK * D * sizeof(float))) &&
              !CK(cudaMalloc((void **)&Y, (size_t)RK * D * sizeof(float))) && !CK(cudaMalloc((void **)&dw, 2 * rkb)) &&
              !CK(cudaMalloc((void **)&de, (size_t)RK * sizeof(int32_t))) && !CK(cudaMalloc((void **)&xd, by)) &&
              !CK(cudaMalloc((void **)&yd, by));
    ok = ok && !CK(cudaMemcpyAsync(eid, a->eid, RK * sizeof(int32_t), cudaMemcpyDeviceToHost, stream)) &&
         !CK(cudaMemcpyAsync(hw, a->wts, rkb, cudaMemcpyDeviceToHost, stream)) &&
         !CK(cudaMemcpyAsync(xd, a->x, by, cudaMemcpyDeviceToDevice, stream)) && !CK(cudaStreamSynchronize(stream));
    if (ok)
        ep_clear(Y, (int64_t)RK * D);
    for (int e = 0; e < E && ok; e++) {
        int n = 0;
        if (!dsv4_cuda_expert_owned(e))
            continue;
        for (int i = 0; i < RK; i++)
            if (eid[i] == e) {
                rows[n] = i;
                wsel[n++] = hw[i];
                ok = ok && !CK(cudaMemcpyAsync(xb + (size_t)(n - 1) * D, xd + (size_t)(i / K) * D, D * sizeof(float),
                                               cudaMemcpyDeviceToDevice, stream));
            }
        if (!n || !ok)
            continue;
        ex_lin(&a->w1[e], I, xb, n, g, a->ref);
        ex_lin(&a->w3[e], I, xb, n, u, a->ref);
        cu_swiglu(g, u, (int64_t)n * I, a->limit, g);
        if (a->pre_weight) {
            ok = ok && !CK(cudaMemcpyAsync(dw, wsel, n * sizeof(float), cudaMemcpyHostToDevice, stream));
            launch_k(k_scale_rows, (unsigned)cdiv((int64_t)n * I, 256), 256, 0, stream, g, (int64_t)n * I, I, dw);
            ok = ok && !CK(cudaStreamSynchronize(stream));
        }
        if (a->ref)
            cu_round_bf16(g, (int64_t)n * I);
        ex_lin(&a->w2[e], D, g, n, yb, a->ref);
        for (int i = 0; i < n && ok; i++)
            ok = !CK(cudaMemcpyAsync(Y + (size_t)rows[i] * D, yb + (size_t)i * D, D * sizeof(float),
                                     cudaMemcpyDeviceToDevice, stream));
    }
    if (Y) { /* posted after a failure on this rank too, so no other rank waits in it */
        pthread_mutex_lock(&dsv4cu::lock);
        ep_reduce(Y, (size_t)RK * D);
        ok = ok && !errp()->code;
        pthread_mutex_unlock(&dsv4cu::lock);
    }
    ok = ok && !CK(cudaMemcpyAsync(de, eid, RK * sizeof(int32_t), cudaMemcpyHostToDevice, stream)) &&
         !CK(cudaMemcpyAsync(dw + RK, hw, rkb, cudaMemcpyHostToDevice, stream));
    if (ok) {
        launch_k(k_ex_sum, (unsigned)cdiv((int64_t)R * D, 256), 256, 0, stream, Y, dw + RK, de, E, K, D, (int64_t)R * D,
                                                                           a->pre_weight, yd);
        ok = !CK(cudaMemcpyAsync(a->y, yd, by, cudaMemcpyDeviceToDevice, stream)) && !CK(cudaStreamSynchronize(stream));
    }
    if (!ok) {
        pthread_mutex_lock(&dsv4cu::lock);
        fail(DSV4_E_DEVICE, "cuda: experts of mixed storage forms failed");
        out_fail(a->y, by);
        pthread_mutex_unlock(&dsv4cu::lock);
    }
    cudaStreamSynchronize(stream); /* the temporaries are read by queued copies */
    cudaFree(xd), cudaFree(xb), cudaFree(g), cudaFree(u), cudaFree(yb), cudaFree(Y), cudaFree(dw), cudaFree(de), cudaFree(yd);
    free(eid), free(rows), free(wsel), free(hw);
}

/* x, eid, wts, y and work are device buffers (backend.h); the weights resident or pinned. */
void dsv4cu::cu_experts(const dsv4_experts_args *a)
{
    if (a->R <= 0 || a->D <= 0)
        return;
    if (!experts_uniform(a->w1, a->E) || !experts_uniform(a->w2, a->E) || !experts_uniform(a->w3, a->E) ||
        a->w1[0].form != a->w2[0].form || a->w1[0].form != a->w3[0].form) {
        experts_by_expert(a);
        return;
    }
    op_begin();
    experts_run(a);
    op_end();
}

/* The op on device buffers, inside op_begin/op_end. */
static void experts_run(const dsv4_experts_args *a)
{
    int R = a->R, K = a->K, D = a->D, I = a->I, E = a->E;
    size_t by = (size_t)R * D * sizeof(float);
    int64_t RK = (int64_t)R * K;
    int ok = 1;
    dsv4_experts_args q = *a;
    if (K <= 0 || I <= 0 || E <= 0 || E > EX_SORT || RK > INT32_MAX / 4) {
        fail(DSV4_E_ARG, "cuda: experts: bad shape R=%d K=%d D=%d I=%d E=%d (at most %d experts)", R, K, D, I, E,
             (int)EX_SORT);
        ok = 0;
    } else if (a->w1[0].n != I || a->w1[0].k != D || a->w3[0].n != I || a->w3[0].k != D || a->w2[0].n != D ||
               a->w2[0].k != I || a->w1[0].form != a->w2[0].form || a->w1[0].form != a->w3[0].form) {
        fail(DSV4_E_ARG, "cuda: experts: weights are not [I, D], [D, I], [I, D] of one form");
        ok = 0;
    } else if (!a->x || !a->y || !a->eid || !a->wts || !a->work) {
        fail(DSV4_E_ARG, "cuda: experts: x, y, eid, wts and work are all needed (device buffers)");
        ok = 0;
    }
    bool posted = false; /* the pairs' all-reduce */
    const int *h1 = NULL, *h2 = NULL, *h3 = NULL;
    const wdev *t1 = ok ? expert_table(a->w1, E, K, &h1) : NULL, *t2 = ok ? expert_table(a->w2, E, K, &h2) : NULL;
    const wdev *t3 = ok ? expert_table(a->w3, E, K, &h3) : NULL;
    bool vec1 = ok && vec_ok(&a->w1[0]) && vec_ok(&a->w3[0]), vec2 = ok && vec_ok(&a->w2[0]);
    /* one tensor-core kind for the three (a form, and for FP8 the same run width) */
    bool tc = ok && tc_ok(&a->w1[0]) && tc_ok(&a->w3[0]) && tc_ok(&a->w2[0]) &&
              tc_kind(&a->w1[0]) == tc_kind(&a->w2[0]) && tc_kind(&a->w1[0]) == tc_kind(&a->w3[0]);
    if (t1 && t2 && t3 && (vec1 || vec2 || tc) &&
        (((uintptr_t)a->x & 15) || ((uintptr_t)a->work & 15) || (vec1 && D % 4) || (vec2 && I % 4))) {
        fail(DSV4_E_ARG, "cuda: experts: x and work must be 16-byte aligned");
        t1 = NULL;
    }
    if (t1 && t2 && t3) {
        /* the tensor cores' 64-pair tiles pay when experts hold many pairs each (prefill),
         * 8-pair tiles otherwise (decode, lanes) */
        int tile = tc ? (RK >= (int64_t)EX_TC_BUSY * E ? EX_TC_TILE : 8) : RK <= EX_SOLO_PAIRS ? 1 : LIN_TT;
        int64_t NT = tile == 1 ? RK : (RK / tile + E < RK ? RK / tile + E : RK);
        float *G = a->work, *U = G + RK * I, *Y = U + RK * I;
        int *ord = (int *)(Y + RK * D), *tiles = ord + RK, *cnt = tiles + 3 * NT, *off = cnt + E, *ntiles = off + E;
        if (dsv4cu::poison)
            CK(cudaMemsetAsync(a->y, 0xff, by, stream));
        prof_split("experts: host part");
        launch_k(k_ex_sort, 1, EX_SORT, (2 * (size_t)E + EX_SORT) * sizeof(int), stream, a->eid, (int)RK, E, tile,
                 ep_rank, ep_world, cnt, off, ord, tiles, ntiles);
        ep_clear(Y, RK * D);
        prof_split("experts: grouping");
        /* routed experts in pinned host memory: copied in first, read from device memory */
        ex_tables xt = {{t1, t2, t3}, {h1, h2, h3}};
        ex_sizes xz;
        for (int m = 0; m < 3; m++) {
            const dsv4_weight *w = m == 0 ? &a->w1[0] : m == 1 ? &a->w2[0] : &a->w3[0];
            xz.data[m] = data_bytes(w);
            xz.scale[m] = w->scale ? scale_bytes(w) : 0;
        }
        /* REF: x's rows through e4m3 blocks for FP8/FP4 products (once for w1 and w3) */
        if (a->ref && (a->w1[0].form == DSV4_WF_FP8 || a->w1[0].form == DSV4_WF_FP4)) {
            float *xq = ref_buf((size_t)R * D);
            q.x = xq && quant_rows(a->x, R, D, D, dsv4_act_block(&a->w1[0]), xq) ? xq : NULL;
        }
        a = &q;
        const wdev *st[3];
        if (a->x && launched("experts grouping") && stage_experts(xt, xz, E, tiles, ntiles, (int)NT, st)) {
            t1 = st[0];
            t2 = st[1];
            t3 = st[2];
            prof_split("experts: staging");
            switch (a->w1[0].form) {
            case DSV4_WF_F32: launch_experts<DSV4_WF_F32>(a, t1, t2, t3, vec1, vec2, tc, tile, (int)NT, tiles, ntiles, off, ord, G, U, Y); break;
            case DSV4_WF_BF16: launch_experts<DSV4_WF_BF16>(a, t1, t2, t3, vec1, vec2, tc, tile, (int)NT, tiles, ntiles, off, ord, G, U, Y); break;
            case DSV4_WF_F16: launch_experts<DSV4_WF_F16>(a, t1, t2, t3, vec1, vec2, tc, tile, (int)NT, tiles, ntiles, off, ord, G, U, Y); break;
            case DSV4_WF_FP8: launch_experts<DSV4_WF_FP8>(a, t1, t2, t3, vec1, vec2, tc, tile, (int)NT, tiles, ntiles, off, ord, G, U, Y); break;
            default: launch_experts<DSV4_WF_FP4>(a, t1, t2, t3, vec1, vec2, tc, tile, (int)NT, tiles, ntiles, off, ord, G, U, Y); break;
            }
            if (a->ref && launched("experts"))
                round_bf16_launch(Y, RK * D);
            ep_reduce(Y, (size_t)RK * D);
            posted = true;
            launch_k(k_ex_sum, (unsigned)cdiv((int64_t)R * D, 256), 256, 0, stream, Y, a->wts, a->eid, E, K, D,
                                                                               (int64_t)R * D, a->pre_weight, a->y);
            if (launched("experts sum") && !errp()->code)
                return;
        }
    }
    /* a failure on this rank alone: the others' all-reduce still gets its partner, so no rank
     * waits in it (this rank's error then ends the run) */
    if (ok && !posted && a->work && ep_world > 1)
        ep_reduce(a->work + 2 * RK * I, (size_t)RK * D);
    out_fail(a->y, by);
}
