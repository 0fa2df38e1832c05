/* kernels/cuda — the many-token pass of the tensor-core row kernel: a block tile of 128 weight
 * rows by 128 tokens whose weights and x are staged in shared memory in fragment order, so
 * each weight is decoded once a block and each fragment serves several MMAs. C++ only.
 *
 * It computes what tc_rows (mma.cuh) computes, operation for operation: for weight row i and
 * token t,
 *   y = P_0 + P_1 + ... + P_{S-1}, added left to right, P_s = run slice s (tc_slice) summed
 *   from zero over its runs in order, each run added by tc_run's sequence
 * (a scaled form's run summed from zero over its k-steps, each step's E terms in turn, then
 * added with one fma by the row's block scale; BF16 chains every product into the sum), with
 * the same m16n8k16 MMA and the same permutation of a run's k slots (mma.cuh, tcf). So a
 * token's bits are those of the few-token pass, whatever T, the tile or the launch.
 *
 * Layout. 16 warps, 4 along the rows by 4 along the tokens; warp (wm, wn) owns rows
 * 32 wm .. + 31 (m-tiles 2 wm, 2 wm + 1) and tokens 32 wn .. + 31 (n-tiles 4 wn .. + 3). A
 * k-tile is 64 elements, four k-steps: RT = 4 / G runs. Each k-tile, thread (row, t) =
 * (tid / 4, tid % 4) loads its chunk of each run of its row (tcf), decodes it and stores the
 * fragments (two bf16 pairs a k-step) where the warp owning that row's m-tile reads them with
 * one 16-byte load; x's float4s go global -> shared by cp.async and are split into their terms
 * in fragment order (one 8-byte load a fragment). Both are double-buffered: the next tile's
 * loads are in flight while the current one is computed, one barrier a tile. Slice totals wait
 * in shared memory (each thread its own slots), which keeps the registers for the products. */
#ifndef DSV4_CUDA_MMA_GEMM_CUH
#define DSV4_CUDA_MMA_GEMM_CUH

#include "kernels/cuda/internal.h"
#include "kernels/cuda/mma.cuh"

namespace dsv4cu {

enum { TG_WM = 4, TG_WN = 4, TG_THREADS = TG_WM * TG_WN * 32, TG_BM = TG_WM * 32, TG_BN = TG_WN * 32,
       TG_KT = 64, TG_XV = TG_BN * TG_KT / 4 / TG_THREADS, TG_ACC = 2 * 4 * 4 };
static_assert(TG_BM == TC_TW * 16, "a block covers the row block tc_blocks counts");

/* The pass's shared memory (dynamic): fragments of two k-tiles, x as copied, the tiles' block
 * scales by row, the slice totals. */
template <int E>
struct tg_smem {
    uint4 a[2][TG_BM / 16][4][32];         /* [buf][m-tile][k-step][lane]: a0, a2, a1, a3 */
    uint2 b[2][E][TG_BN / 8][4][32];       /* [buf][term][n-tile][k-step][lane] */
    float4 raw[TG_XV][TG_THREADS];         /* each thread's own copies */
    float s[2][2][TG_BM];                  /* [buf][run of the tile][row] */
    const float *x[TG_BN];                 /* the pass's x rows (NULL past its tokens) */
    float tot[TG_ACC][TG_THREADS];         /* [value][thread] */
};
template <int E>
__host__ __device__ constexpr size_t tg_smem_bytes()
{
    return sizeof(tg_smem<E>);
}

/* As tc_rows (mma.cuh), for any T, with TG_THREADS threads a block and tg_smem_bytes<E>() of
 * dynamic shared memory; blk is the 128-row block, the tokens go 128 a pass. */
template <int F, class M, int E>
__device__ __forceinline__ void tcg_rows(const wdev &w, int64_t r0, int nr, const M &m, int T, int blk, float *part,
                                         int64_t pld, int64_t slab, int z, int Z)
{
    enum { G = tcf<F>::G, RT = 4 / G };
    static_assert(RT * G == 4 && RT <= 2, "a k-tile is whole runs");
    typedef typename tcf<F>::CT CT;
    const bool scaled = F != DSV4_WF_BF16;
    extern __shared__ uint4 tg_dyn[];
    tg_smem<E> &sm = *reinterpret_cast<tg_smem<E> *>(tg_dyn);
    const int tid = (int)threadIdx.x, lane = tid & 31, wid = tid >> 5, g = lane >> 2, t = lane & 3;
    const int wm = wid % TG_WM, wn = wid / TG_WM;
    const int S = w.tcs, k = (int)w.k, nrun = (k + 16 * G - 1) / (16 * G), nch = k / (4 * G);
    if (part && z >= Z)
        return;
    const int ib = blk * TG_BM; /* the block's first row */
    const bool live = ib + wm * 32 < nr;
    /* the staging thread's row and chunk */
    const int srow = tid >> 2, st = tid & 3;
    const int64_t rs = r0 + (ib + srow < nr ? ib + srow : 0);
    const CT *cs = (const CT *)tc_row<F>(w, rs) + st;
    const int64_t ss = scaled ? tc_srow<F>(w, rs) : 0;
    const int s_beg = part ? z * (S / Z) : 0, s_end = part ? (z + 1) * (S / Z) : S;
    const int c_beg = tc_slice(nrun, S, s_beg), c_end = tc_slice(nrun, S, s_end);
    const int c_first = c_beg / RT * RT;
    /* x: this thread copies float4 f = tid % 16 of tokens tid / 16 + 32 v; element 4 f of the
     * tile is run f / 4G's element 4 (f % 4G), thread t' = (f % 4G) / G's in step u = f % G */
    const int xf = tid & 15, xq = xf % (4 * G);
    const int xs_step = (xf / (4 * G)) * G + xq % G, xs_t = xq / G;
    for (int t0 = 0; t0 < T; t0 += TG_BN) {
        const int Tp = min(TG_BN, T - t0);
        if (tid < TG_BN)
            sm.x[tid] = tid < Tp ? m.xr(t0 + tid) : NULL;
        __syncthreads();
        CT q[RT];
        uint32_t sr[RT];
        /* tile c's x copies and this thread's weights (zero outside k) and scales */
        auto load = [&](int c) {
#pragma unroll
            for (int v = 0; v < TG_XV; v++) {
                const float *xr = sm.x[(tid >> 4) + 32 * v];
                bool in = xr && c * 16 * G + 4 * xf < k;
                cp16(&sm.raw[v][tid], in ? (const void *)(xr + c * 16 * G + 4 * xf) : (const void *)w.q, in);
            }
#pragma unroll
            for (int v = 0; v < RT; v++) {
                int cc = c + v;
                q[v] = cc * 4 + st < nch ? __ldg(cs + cc * 4) : CT{};
                if (scaled)
                    sr[v] = st == 0 && cc < nrun ? tc_scale_raw(w, ss + (cc >> w.kss)) : 0u;
            }
        };
        /* the loaded tile into buffer bf: fragments, terms and scales; whether a mid or lo
         * term is nonzero anywhere in it (the block's vote) */
        auto store = [&](int bf) -> bool {
#pragma unroll
            for (int v = 0; v < RT; v++) {
#pragma unroll
                for (int u = 0; u < G; u++) {
                    uint32_t p01, p23;
                    tc_decode<F>(q[v], u, p01, p23);
                    uint2 *d = (uint2 *)&sm.a[bf][srow >> 4][v * G + u][(srow & 7) * 4 + st];
                    d[(srow >> 3) & 1] = make_uint2(p01, p23);
                }
                if (scaled && st == 0)
                    sm.s[bf][v][srow] = tc_scale_of(w, sr[v]);
            }
            cp_wait();
            uint32_t wide = 0;
#pragma unroll
            for (int v = 0; v < TG_XV; v++) {
                float4 x = sm.raw[v][tid];
                uint32_t b01[E], b23[E];
                split_terms<E>(x.x, x.y, b01);
                split_terms<E>(x.z, x.w, b23);
                int tok = (tid >> 4) + 32 * v;
#pragma unroll
                for (int e = 0; e < E; e++) {
                    sm.b[bf][e][tok >> 3][xs_step][(tok & 7) * 4 + xs_t] = make_uint2(b01[e], b23[e]);
                    if (e)
                        wide |= b01[e] | b23[e];
                }
            }
            return __syncthreads_or(wide != 0) != 0;
        };
        float acc[2][4][4];
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int r = 0; r < 4; r++)
                    acc[i][j][r] = 0.0f;
        /* n-tile j of the warp holds tokens of this pass */
        auto jlive = [&](int j) { return 8 * (4 * wn + j) < Tp; };
        auto emit = [&](int sl) {
            const M om = m.with_y(part + sl * slab, pld);
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int r = 0; r < 4; r++) {
                        int tk = 8 * (4 * wn + j) + 2 * t + (r & 1), row = ib + wm * 32 + 16 * i + g + (r >> 1) * 8;
                        if (tk < Tp && row < nr)
                            om.put(t0 + tk, row, acc[i][j][r]);
                    }
        };
        int slice = s_beg, next = tc_slice(nrun, S, s_beg + 1);
        /* slice `slice` ends: to its slab (split), or into the total */
        auto slice_end = [&]() {
            if (part)
                emit(slice);
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int r = 0; r < 4; r++) {
                        float *tp = &sm.tot[(i * 4 + j) * 4 + r][tid];
                        if (!part)
                            *tp = slice ? *tp + acc[i][j][r] : acc[i][j][r];
                        acc[i][j][r] = 0.0f;
                    }
            slice++;
            next = tc_slice(nrun, S, slice + 1);
        };
        load(c_first);
        bool x3 = store(0);
        int buf = 0;
        for (int c0 = c_first; c0 < c_end; c0 += RT) {
            const bool more = c0 + RT < c_end;
            if (more)
                load(c0 + RT);
            if (live)
#pragma unroll
                for (int v = 0; v < RT; v++) {
                    int c = c0 + v;
                    if (c >= c_end)
                        break;
                    if (c < c_beg)
                        continue;
                    while (c == next)
                        slice_end();
                    float s0[2], s1[2];
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        s0[i] = scaled ? sm.s[buf][v][wm * 32 + 16 * i + g] : 1.0f;
                        s1[i] = scaled ? sm.s[buf][v][wm * 32 + 16 * i + g + 8] : 1.0f;
                    }
                    /* the n-tiles in two halves, each half's runs interleaved over both m-tiles
                     * (registers: the slice totals wait in shared memory, these in flight) */
#pragma unroll
                    for (int jh = 0; jh < 4; jh += 2) {
                        if (!jlive(jh))
                            break;
                        float p[2][2][4];
#pragma unroll
                        for (int i = 0; i < 2; i++)
#pragma unroll
                            for (int j = 0; j < 2; j++)
#pragma unroll
                                for (int r = 0; r < 4; r++)
                                    p[i][j][r] = 0.0f;
#pragma unroll
                        for (int u = 0; u < G; u++) {
                            uint32_t a[2][4];
#pragma unroll
                            for (int i = 0; i < 2; i++) {
                                uint4 f = sm.a[buf][2 * wm + i][v * G + u][lane];
                                a[i][0] = f.x;
                                a[i][1] = f.z;
                                a[i][2] = f.y;
                                a[i][3] = f.w;
                            }
#pragma unroll
                            for (int e = 0; e < E; e++) {
                                if (e && !x3) /* the tile's mid and lo terms are all zero */
                                    break;
#pragma unroll
                                for (int j = 0; j < 2; j++) {
                                    if (!jlive(jh + j))
                                        continue;
                                    uint2 b = sm.b[buf][e][4 * wn + jh + j][v * G + u][lane];
#pragma unroll
                                    for (int i = 0; i < 2; i++) {
                                        float *d = scaled ? p[i][j] : acc[i][jh + j];
                                        mma_bf16(d, a[i], b.x, b.y, d);
                                    }
                                }
                            }
                        }
                        if (scaled)
#pragma unroll
                            for (int i = 0; i < 2; i++)
#pragma unroll
                                for (int j = 0; j < 2; j++) {
                                    float *d = acc[i][jh + j];
                                    d[0] = fmaf(p[i][j][0], s0[i], d[0]);
                                    d[1] = fmaf(p[i][j][1], s0[i], d[1]);
                                    d[2] = fmaf(p[i][j][2], s1[i], d[2]);
                                    d[3] = fmaf(p[i][j][3], s1[i], d[3]);
                                }
                    }
                }
            if (more)
                x3 = store(buf ^ 1);
            buf ^= 1;
        }
        if (live && part)
            emit(slice);
        else if (live)
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int r = 0; r < 4; r++) {
                        int tk = 8 * (4 * wn + j) + 2 * t + (r & 1), row = ib + wm * 32 + 16 * i + g + (r >> 1) * 8;
                        float v = slice ? sm.tot[(i * 4 + j) * 4 + r][tid] + acc[i][j][r] : acc[i][j][r];
                        if (tk < Tp && row < nr)
                            m.put(t0 + tk, row, v);
                    }
        /* the next pass restages both buffers */
        __syncthreads();
    }
}

static_assert(TG_THREADS == tc_threads(TC_TN / 8), "the many-token kernels' block size");

/* A kernel's pass over T tokens: the few-token pass (NT = 1, 2) or the block-tiled one. */
template <int F, int NT, class M, int E>
__device__ __forceinline__ void tc_pass(const wdev &w, int64_t r0, int nr, const M &m, int T, int blk, float *part,
                                        int64_t pld, int64_t slab, int z, int Z)
{
    if constexpr (NT > 2)
        tcg_rows<F, M, E>(w, r0, nr, m, T, blk, part, pld, slab, z, Z);
    else
        tc_rows<F, NT, M, E>(w, r0, nr, m, T, blk, part, pld, slab, z, Z);
}

/* Dynamic shared memory a launch of kernel K, a pass of NT n-tiles, takes; raised on K once a
 * device (host side: function attributes are the current device's). False, with the op's
 * failure recorded, when refused. */
template <int NT, int E, auto K>
bool tc_launch_smem(size_t *bytes)
{
    static unsigned long long set; /* a bit a device ordinal; a second raise is harmless */
    *bytes = NT > 2 ? tg_smem_bytes<E>() : 0;
    int dev = 0;
    if (!*bytes || cudaGetDevice(&dev) != cudaSuccess || dev >= 64 || (set >> dev & 1))
        return true;
    if (CK(cudaFuncSetAttribute(K, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)*bytes)))
        return false;
    set |= 1ull << dev;
    return true;
}

} // namespace dsv4cu

#endif
