/* kernels/cuda — the many-token pass of the tensor-core row kernel on warpgroup MMAs (wgmma,
 * sm_90a), the same sums as tc_rows (mma.cuh) bit for bit. C++ only.
 *
 * Why the same bits. tc_rows computes each 16-row group's products as m16n8k16 MMAs whose k
 * slots hold a fixed permutation of a run's elements, chained from zero over a run's k-steps
 * (E terms each) and entered into the slice's sum with one fma by the run's block scale (BF16:
 * chained into the slice's sum directly). Here a warpgroup's four warps are four 16-row groups,
 * and m64nNk16 with A in registers takes each warp's A fragment in m16n8k16's layout, its D in
 * m16n8k16's D layout per 8 tokens. So each k-step, run, fold and slice here is tc_rows's
 * operation on the same values, provided the two instructions compute one output element (a dot
 * product of 16 pairs plus the accumulator) alike. Measured so (docs/bench.md), and checked by
 * test_cuda_ops's invariance runs: rows of T <= 16 (mma.sync) against the same rows on this pass
 * (T = 4096 by default, T = 17..64 too with DSV4_CUDA_WG=1), bit for bit.
 *
 * Layout. x is staged first (wg_stage) into bf16 tiles, one per (block of WG_N tokens, run),
 * each term and k-step a canonical no-swizzle K-major B operand of WG_N tokens by 16 k slots:
 * 8x8 core matrices of 128 bytes, the two k halves 128 bytes apart (LBO), token octets 256 apart
 * (SBO), slots in tc_rows's permutation. A block is WG_C warpgroups (64 weight rows each) fed
 * by a ring of WG_NS stages that bulk copies (cp.async.bulk, an mbarrier a stage for full and
 * one for empty) fill, issued by the block's first thread. Each thread loads its rows' chunks of
 * a run from global memory itself, two runs ahead, and decodes them as tc_rows does (DA: run
 * c + 1's while run c's MMAs run). A run's MMAs are waited for before its fold (ptxas
 * serializes the MMAs when a fold reads one run's partial sums while the next run's are in
 * flight), so an SM's warpgroups are what keep the tensor cores busy while one folds. A block
 * may walk several items through one ring, and an item may be NB token blocks whose MMA chains
 * share each run's decoded weights.
 *
 * Registers. An SM sub-partition holds 16K registers and a block's eight warps are spread over
 * the four, so a thread may have 255 (a ninth, producer warp would cap it at 168, where the pass
 * spills); tests/cuda/ptxas_report.sh lists each kernel's registers, spills and any notice that
 * ptxas serialized its MMAs. */
#ifndef DSV4_CUDA_WGMMA_CUH
#define DSV4_CUDA_WGMMA_CUH

#include "kernels/cuda/mma.cuh"

namespace dsv4cu {

/* Tokens a pass, stages in the ring. */
enum { WG_N = 64, WG_NS = 4 };
/* Runs past the one loaded into registers whose chunks a thread asks the L2 for. */
enum { WG_PF = 4 };
/* A block: WG_C warpgroups of 64 weight rows each, whose first thread also issues the ring's
 * copies (a producer warp beside them capped a thread at 168 registers, and spilled). */
enum { WG_C = 2, WG_THREADS = WG_C * 128 };
/* Row blocks over nr rows. */
__host__ __device__ inline int wg_blocks(int64_t nr) { return (int)((nr + WG_C * 64 - 1) / (WG_C * 64)); }

/* Bytes of one staged (token block, run) tile of kind F with E terms. */
template <int F, int E>
__host__ __device__ constexpr int wg_tile_bytes()
{
    return E * tcf<F>::G * 32 * WG_N;
}

/* Stages in the ring of a pass over NB token blocks: WG_NS, or 3 where WG_NS stages and the
 * slices' totals would pass the 227 KB a block may have (FP8 with three terms, NB = 2). */
template <int F, int E, int NB>
__host__ __device__ constexpr int wg_ns()
{
    return (size_t)WG_NS * NB * wg_tile_bytes<F, E>() + (NB > 1 ? (size_t)NB * (WG_N / 2) * 256 * 4 : 0) + 16 * WG_NS >
                   227 * 1024
               ? 3
               : WG_NS;
}

/* Dynamic shared memory of a wg_rows block: the stages (NB tiles each), 2 mbarriers a stage,
 * and for NB > 1 the slices' totals of each consumer thread (wg_rows). */
template <int F, int E, int NB>
__host__ __device__ constexpr size_t wg_smem()
{
    return (size_t)wg_ns<F, E, NB>() * NB * wg_tile_bytes<F, E>() + 16 * wg_ns<F, E, NB>() +
           (NB > 1 ? (size_t)NB * (WG_N / 2) * 256 * 4 : 0);
}

/* A shared-memory matrix descriptor for a canonical no-swizzle K-major operand at s. */
__device__ __forceinline__ uint64_t wg_desc(uint32_t s)
{
    return (uint64_t)((s >> 4) & 0x3fff) | ((uint64_t)(128 >> 4) << 16) | ((uint64_t)(256 >> 4) << 32);
}

/* d (WG_N / 2 per thread) = A B (+ d when acc): A this warp's m16n8k16 fragment of 16 rows, B
 * the WG_N x 16 operand at descriptor b. */
__device__ __forceinline__ void wg_mma(float *d, const uint32_t a[4], uint64_t b, int acc)
{
    static_assert(WG_N == 64, "wg_mma's operand list is m64n64k16's");
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
                 "{%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                   "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
                   "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
                   "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc));
}
__device__ __forceinline__ void wg_fence(void) { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
/* Pins register r at this point: an asynchronous MMA's operands are read (A) and written (D) after
 * its issue, which the register allocator does not know, so a value an MMA in flight still uses
 * is pinned where the MMA is waited for, and its registers are not reused before. */
__device__ __forceinline__ void wg_pin(uint32_t &r) { asm volatile("" : "+r"(r)::"memory"); }
__device__ __forceinline__ void wg_pin(float &r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void wg_commit(void) { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait(void)
{
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

/* mbarriers in shared memory (by shared address). */
__device__ __forceinline__ void mb_init(uint32_t b, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(b), "r"(count) : "memory");
}
__device__ __forceinline__ void mb_wait(uint32_t b, uint32_t parity)
{
    asm volatile("{\n.reg .pred P;\nWAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 P, [%0], %1;\n"
                 "@!P bra WAIT;\n}\n" ::"r"(b),
                 "r"(parity)
                 : "memory");
}
__device__ __forceinline__ void mb_arrive(uint32_t b)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(b) : "memory");
}
/* The producer's: the stage's bytes to come, then their copy, which completes them. */
__device__ __forceinline__ void mb_expect(uint32_t b, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void *src, uint32_t bytes, uint32_t b)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(b)
                 : "memory");
}

/* Tokens t < T (at most WG_N) of map m staged for kind F, E terms, into the tiles at xt: run c's
 * at xt + c wg_tile_bytes, term e and k-step u at (e G + u) 32 WG_N within it. Thread e0 of the
 * block's (WG_N 4 G of them, a tile): token e0 / 4G and the run's float4 q = e0 % 4G (elements
 * 4q .. 4q + 3, zeros past k or T), which is chunk t = q / G's step u = q % G (tc_rows's fragment
 * mapping): its two pairs fill k slots 2t, 2t + 1 and 2t + 8, 2t + 9. Returns whether its mid or
 * lo terms are not all zero. */
template <int F, int E, class M>
__device__ __forceinline__ bool wg_stage(const M &m, int T, int k, int c, int e0, uint8_t *xt)
{
    enum { G = tcf<F>::G, Q = 4 * G };
    const int tok = e0 / Q, q = e0 % Q;
    const int kk = c * 16 * G + 4 * q;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (tok < T && kk < k)
        v = __ldg((const float4 *)(m.xr(tok) + kk));
    uint32_t p01[E], p23[E];
    split_terms<E>(v.x, v.y, p01);
    split_terms<E>(v.z, v.w, p23);
    const int t = q / G, u = q % G;
    uint8_t *tile = xt + (int64_t)c * wg_tile_bytes<F, E>();
    const int at = (tok / 8) * 256 + (tok % 8) * 16 + 4 * t;
    uint32_t wide = 0;
#pragma unroll
    for (int e = 0; e < E; e++) {
        uint8_t *op = tile + (e * G + u) * 32 * WG_N;
        *(uint32_t *)(op + at) = p01[e];
        *(uint32_t *)(op + at + 128) = p23[e];
        if (e)
            wide |= p01[e] | p23[e];
    }
    return wide != 0;
}
/* The stage's block: one tile (a token block's run). */
template <int F>
__host__ __device__ constexpr int wg_stage_threads()
{
    return WG_N * 4 * tcf<F>::G;
}

/* The items a block of wg_rows computes in turn, each NB token blocks or fewer (subs) of at
 * most WG_N tokens that the pass computes with the same decoded weights: item j's block h has a
 * row map, its tokens, its staged tiles and flags (wg_stage), and its split slabs (NULL
 * unsplit). */
template <class M, int NB>
struct wg_tiles { /* an experts' tile, or NB tiles of one expert */
    typedef M map_t;
    M m[NB];
    int T[NB], n;
    const uint8_t *xt[NB], *xf[NB];
    float *pt;
    __device__ __forceinline__ int count() const { return 1; }
    __device__ __forceinline__ int subs(int) const { return n; }
    __device__ __forceinline__ M map(int, int h) const { return m[h]; }
    __device__ __forceinline__ int tokens(int, int h) const { return T[h]; }
    __device__ __forceinline__ const uint8_t *tiles(int, int h) const { return xt[h]; }
    __device__ __forceinline__ const uint8_t *flags(int, int h) const { return xf[h]; }
    __device__ __forceinline__ float *part(int, int) const { return pt; }
};
/* groups of NB token blocks (item j: group b0 + j step) of a dense x of T tokens staged per
 * token block (a linear's; tstride the bytes of a token block's tiles, nrun its runs; split
 * slabs [T, nr] shifted with the tokens) */
template <int NB>
struct wg_tblocks {
    typedef dense_map map_t;
    enum { nb = NB };
    dense_map m;
    int T, b0, step, nrun;
    int64_t tstride, nr;
    const uint8_t *xb, *xf;
    float *pt;
    __device__ __forceinline__ int blocks() const { return (T + WG_N - 1) / WG_N; }
    __device__ __forceinline__ int count() const
    {
        const int ng = (blocks() + nb - 1) / nb;
        return b0 < ng ? (ng - 1 - b0) / step + 1 : 0;
    }
    __device__ __forceinline__ int tb(int j, int h) const { return (b0 + j * step) * nb + h; }
    __device__ __forceinline__ int subs(int j) const { return min(nb, blocks() - tb(j, 0)); }
    __device__ __forceinline__ dense_map map(int j, int h) const { return m.at(tb(j, h) * WG_N); }
    __device__ __forceinline__ int tokens(int j, int h) const { return min(WG_N, T - tb(j, h) * WG_N); }
    __device__ __forceinline__ const uint8_t *tiles(int j, int h) const { return xb + tb(j, h) * tstride; }
    __device__ __forceinline__ const uint8_t *flags(int j, int h) const { return xf + (int64_t)tb(j, h) * nrun; }
    __device__ __forceinline__ float *part(int j, int h) const
    {
        return pt ? pt + (int64_t)tb(j, h) * WG_N * nr : NULL;
    }
};

/* y[t, i] for rows i < nr (from r0) and the tokens t of each item of L in turn, as tc_rows<F,
 * TC_TN / 8, M, E> computes them, from x staged by wg_stage at L.tiles(j, h), with L.flags(j,
 * h)[c] whether run c has mid or lo terms (E = 3: a run without them in any of the item's token
 * blocks takes only its hi MMAs, and only its hi terms are copied, as tc_rows skips them; one with
 * them takes every term for each block, whose zero terms leave the sums as they are): row block
 * blk (WG_C warpgroups of 64 rows), slice group z of Z (L.part, pld, slab as in tc_rows). Each run's
 * weights are decoded once for the item's NB token blocks, an MMA chain a block. One ring runs
 * through all the items, so the copies and loads of the next item start before this one's sums
 * are out. Dynamic shared memory: wg_smem. */
template <int F, int E, class It, int DA, int NB>
__device__ __forceinline__ void wg_rows(const wdev &w, int64_t r0, int nr, const It &L, int blk, int64_t pld,
                                        int64_t slab, int z, int Z)
{
    typedef typename It::map_t M;
    const int nit = L.count();
    float *const part = L.part(0, 0);
    enum { G = tcf<F>::G, TB = wg_tile_bytes<F, E>(), NV = WG_N / 2, NS = wg_ns<F, E, NB>(), SB = NB * TB };
    constexpr bool scaled = F != DSV4_WF_BF16;
    extern __shared__ __align__(128) uint8_t wsm[];
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(wsm);
    const uint32_t full = sbase + NS * SB, empty = full + 8 * NS;
    /* NB > 1: the slices' totals, [NB * NV][WG_THREADS] (registers would not hold them) */
    float *const tsm = (float *)(wsm + NS * SB + 16 * NS);
    const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int S = w.tcs, k = (int)w.k, nrun = (k + 16 * G - 1) / (16 * G);
    if (part && z >= Z)
        return;
    const int s_beg = part ? z * (S / Z) : 0, s_end = part ? (z + 1) * (S / Z) : S;
    const int c_beg = tc_slice(nrun, S, s_beg), c_end = tc_slice(nrun, S, s_end);
    if (threadIdx.x == 0) {
        for (int i = 0; i < NS; i++) {
            mb_init(full + 8 * i, 1);
            mb_init(empty + 8 * i, WG_C * 4);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const int nsteps = nit * (c_end - c_beg);
    /* item j's token blocks */
    auto subs = [&](int j) { return NB == 1 ? 1 : L.subs(j); };
    /* whether run c of item j has mid or lo terms in any of its token blocks */
    auto wide = [&](int j, int c) -> uint32_t {
        uint32_t f = 0;
        if (E > 1)
#pragma unroll
            for (int h = 0; h < NB; h++)
                if (h < subs(j))
                    f |= __ldg(L.flags(j, h) + c);
        return f;
    };
    /* the copy of the block's run r (item pj, run pc) into its stage, once the run NS before
     * it has left the stage; the counters then name run r + 1 */
    int pj = 0, pc = c_beg;
    auto produce = [&](int r) {
        const int s = r % NS, nh = subs(pj);
        if (r >= NS)
            mb_wait(empty + 8 * s, ((r / NS) - 1) & 1);
        const uint32_t bytes = E > 1 && !wide(pj, pc) ? TB / E : TB;
        mb_expect(full + 8 * s, bytes * nh);
        for (int h = 0; h < nh; h++)
            bulk_copy(sbase + s * SB + h * TB, L.tiles(pj, h) + (int64_t)pc * TB, bytes, full + 8 * s);
        if (++pc == c_end) {
            pc = c_beg;
            pj++;
        }
    };
    if (threadIdx.x == 0) {
        for (int r = 0; r < NS - 1 && r < nsteps; r++)
            produce(r);
    }
    const int i0 = blk * (WG_C * 64) + warp * 16;
    const bool live = i0 < nr;
    const int64_t ra = r0 + (i0 + g < nr ? i0 + g : 0), rb = r0 + (i0 + g + 8 < nr ? i0 + g + 8 : 0);
    typedef typename tcf<F>::CT CT;
    const CT *ca = (const CT *)tc_row<F>(w, ra) + t, *cb = (const CT *)tc_row<F>(w, rb) + t;
    const int nch = k / (4 * G);
    const int64_t sa = scaled ? tc_srow<F>(w, ra) : 0, sb = scaled ? tc_srow<F>(w, rb) : 0;
    /* a run as loaded: its chunks of the two rows, raw scales and mid/lo flag */
    struct raw {
        CT qa, qb;
        uint32_t xa, xb, wd;
    };
    auto load = [&](raw &q, int j, int c) {
        bool in = live && j < nit && c * 4 + t < nch;
        q.qa = in ? __ldg(ca + c * 4) : CT{};
        q.qb = in ? __ldg(cb + c * 4) : CT{};
        /* run c + WG_PF's chunks toward the L2, so the load above finds them there when its turn
         * comes (the runs held in registers do not cover a load from memory) */
        const int cp = c + WG_PF < c_end ? c + WG_PF : c + WG_PF - (c_end - c_beg);
        if (live && j < nit && cp * 4 + t < nch) {
            asm volatile("prefetch.global.L2 [%0];" ::"l"(ca + cp * 4));
            asm volatile("prefetch.global.L2 [%0];" ::"l"(cb + cp * 4));
        }
        q.wd = j < nit ? wide(j, c) : 0u;
        bool run = scaled && live && j < nit;
        q.xa = run ? tc_scale_raw(w, sa + (c >> w.kss)) : 0u;
        q.xb = run ? tc_scale_raw(w, sb + (c >> w.kss)) : 0u;
    };
    /* a run decoded: its A fragments, and its raw scales and flag (the scales are converted
     * where they are used, outside the MMAs' flight) */
    struct dec {
        uint32_t a[G][4];
        uint32_t xa, xb, wd;
    };
    auto decode = [&](dec &d, const raw &q) {
#pragma unroll
        for (int u = 0; u < G; u++) {
            tc_decode<F>(q.qa, u, d.a[u][0], d.a[u][2]);
            tc_decode<F>(q.qb, u, d.a[u][1], d.a[u][3]);
        }
        d.xa = q.xa;
        d.xb = q.xb;
        d.wd = q.wd;
    };
    /* per token block h: the run's partial sums p, the slice's sum acc, the earlier slices'
     * total tot (NB > 1: in tsm) */
    float acc[NB][NV], p[NB][NV], tot[NB == 1 ? NV : 1];
    auto tot_at = [&](int h, int v) -> float & {
        if constexpr (NB == 1)
            return tot[v];
        else
            return tsm[(h * NV + v) * WG_THREADS + threadIdx.x];
    };
#pragma unroll
    for (int h = 0; h < NB; h++)
#pragma unroll
        for (int v = 0; v < NV; v++)
            acc[h][v] = 0.0f;
    int slice = s_beg, next = tc_slice(nrun, S, s_beg + 1);
    int it = 0; /* the item computed */
    auto emit = [&](int sl) {
#pragma unroll
        for (int h = 0; h < NB; h++) {
            if (h >= subs(it))
                break;
            const M om = L.map(it, h).with_y(L.part(it, h) + sl * slab, pld);
            const int T = L.tokens(it, h);
#pragma unroll
            for (int v = 0; v < NV; v++) {
                int tk = 8 * (v >> 2) + 2 * t + (v & 1), i = i0 + g + ((v >> 1) & 1) * 8;
                if (tk < T && i < nr)
                    om.put(tk, i, acc[h][v]);
            }
        }
    };
    /* the item's sums out, and the next item's begun */
    auto item_end = [&]() {
        if (live) {
            if (part)
                emit(slice);
            else
#pragma unroll
                for (int h = 0; h < NB; h++) {
                    if (h >= subs(it))
                        break;
                    const M om = L.map(it, h);
                    const int T = L.tokens(it, h);
#pragma unroll
                    for (int v = 0; v < NV; v++) {
                        float y = slice ? tot_at(h, v) + acc[h][v] : acc[h][v];
                        int tk = 8 * (v >> 2) + 2 * t + (v & 1), i = i0 + g + ((v >> 1) & 1) * 8;
                        if (tk < T && i < nr)
                            om.put(tk, i, y);
                    }
                }
        }
#pragma unroll
        for (int h = 0; h < NB; h++)
#pragma unroll
            for (int v = 0; v < NV; v++)
                acc[h][v] = 0.0f;
        slice = s_beg;
        next = tc_slice(nrun, S, s_beg + 1);
        it++;
    };
    auto slice_end = [&]() {
        if (part)
            emit(slice);
#pragma unroll
        for (int h = 0; h < NB; h++)
#pragma unroll
            for (int v = 0; v < NV; v++)
                tot_at(h, v) = slice ? tot_at(h, v) + acc[h][v] : acc[h][v];
#pragma unroll
        for (int h = 0; h < NB; h++)
#pragma unroll
            for (int v = 0; v < NV; v++)
                acc[h][v] = 0.0f;
        slice++;
        next = tc_slice(nrun, S, slice + 1);
    };
    /* the run's MMAs over EE terms (its mid and lo only where it has them) from stage s into p
     * (BF16: into acc), for each of NB token blocks: where the item has fewer, the last chains
     * read what the stage held before and their sums are not used (a branch around them made
     * ptxas serialize the MMAs) */
    auto mmas = [&](dec &d, int s, auto ec) {
        constexpr int EE = decltype(ec)::value;
#pragma unroll
        for (int h = 0; h < NB; h++)
#pragma unroll
            for (int v = 0; v < NV; v++)
                wg_pin(scaled ? p[h][v] : acc[h][v]);
        wg_fence();
#pragma unroll
        for (int h = 0; h < NB; h++) {
#pragma unroll
            for (int u = 0; u < G; u++)
#pragma unroll
                for (int e = 0; e < EE; e++) {
                    uint64_t ds = wg_desc(sbase + s * SB + h * TB + (e * G + u) * 32 * WG_N);
                    if constexpr (scaled)
                        wg_mma(p[h], d.a[u], ds, u | e);
                    else
                        wg_mma(acc[h], d.a[u], ds, 1);
                }
        }
        wg_commit();
    };
    /* run d's MMAs done: their operands pinned until here */
    auto done = [&](dec &d) {
        wg_wait<0>();
#pragma unroll
        for (int u = 0; u < G; u++)
#pragma unroll
            for (int j = 0; j < 4; j++)
                wg_pin(d.a[u][j]);
#pragma unroll
        for (int h = 0; h < NB; h++)
#pragma unroll
            for (int v = 0; v < NV; v++)
                wg_pin(scaled ? p[h][v] : acc[h][v]);
    };
    auto fold = [&](const dec &d) {
        if constexpr (scaled) {
            const float s0 = tc_scale_of(w, d.xa), s1 = tc_scale_of(w, d.xb);
#pragma unroll
            for (int h = 0; h < NB; h++)
#pragma unroll
                for (int v = 0; v < NV; v++)
                    acc[h][v] = fmaf(p[h][v], (v >> 1) & 1 ? s1 : s0, acc[h][v]);
        }
    };
    /* One step a run, in one loop body, with the operands of the MMAs in flight pinned (wg_pin):
     * without the pins, and with two steps a loop body under a branch for an odd count, ptxas
     * serialized the FP4 builds' MMAs (C7520). Run c of item it, the i-th run of
     * the block's: a slice ending before it first; then its stage awaited, its MMAs, and when
     * they are done its stage released and p folded into the slice's sum; the item's sums out
     * after its last run. The raw run two ahead (lj, lc: the next item's past the last) is
     * loaded as soon as its registers are free. */
    raw q0, q1;
    dec d0;
    int lj = 0, lc = c_beg;
    auto load_next = [&](raw &q) {
        load(q, lj, lc);
        if (++lc == c_end) {
            lc = c_beg;
            lj++;
        }
    };
    load_next(q0);
    load_next(q1);
    if constexpr (DA)
        decode(d0, q0); /* d0 holds run c, q1 the run after */
#pragma unroll 1
    for (int i = 0, c = c_beg; i < nsteps; i++) {
        while (c == next)
            slice_end();
        const int s = i % NS;
        /* run i + NS - 1 into the stage run i - 1 leaves */
        if (threadIdx.x == 0 && i + NS - 1 < nsteps)
            produce(i + NS - 1);
        if constexpr (!DA) { /* q0 holds run c, q1 the run after */
            decode(d0, q0);
            q0 = q1;
            load_next(q1);
        }
        mb_wait(full + 8 * s, (i / NS) & 1);
        if (E > 1 && d0.wd)
            mmas(d0, s, std::integral_constant<int, E>());
        else
            mmas(d0, s, std::integral_constant<int, 1>());
        [[maybe_unused]] dec d1;
        if constexpr (DA) {
            decode(d1, q1);
            load_next(q1);
        }
        done(d0);
        if (lane == 0)
            mb_arrive(empty + 8 * s);
        fold(d0);
        if constexpr (DA)
            d0 = d1;
        if (++c == c_end) {
            item_end();
            c = c_beg;
        }
    }
}

/* Host side (linear.cu): whether a many-token pass of kind F over T tokens (or pairs) takes
 * wgmma rather than the mma.sync pass. Both give the same bits, so this chooses only the speed:
 * by default FP8 and FP4 past 64 tokens, where it measured faster (docs/bench.md);
 * DSV4_CUDA_WG=1 every kind past the few-token passes, 0 never. And the staged-x buffers
 * (which 0 or 1) of at least `bytes`, NULL when they cannot grow. */
bool wg_use(int F, int T);
uint8_t *wg_buf(int which, size_t bytes);
/* The block shape the host launches (DSV4_CUDA_WG_V; docs/cuda.md): 4 (the default) the decode
 * ahead (DA), two token blocks a pass (NB = 2: each run's weights decoded once for 128 tokens);
 * 5 one token block without DA; 6 shape 4 without DA. */
int wg_variant(void);
/* A block shape as a type: DA and NB as in wg_rows. */
template <int DA_, int NB_>
struct wg_cfg {
    enum { DA = DA_, NB = NB_ };
};
/* fn(wg_cfg<...>()) called with the block shape wg_variant names. */
template <class Fn>
void wg_shape(Fn &&fn)
{
    switch (wg_variant()) {
    case 5: fn(wg_cfg<0, 1>()); break;
    case 6: fn(wg_cfg<0, 2>()); break;
    default: fn(wg_cfg<1, 2>()); break;
    }
}

} // namespace dsv4cu

#endif
