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
 * (SBO), slots in tc_rows's permutation. A block is two consumer warpgroups (128 weight rows)
 * and a producer warp that copies the tiles into a ring of WG_NS stages with bulk copies
 * (cp.async.bulk, an mbarrier a stage for full and one for empty). Each consumer thread loads its
 * rows' chunks of a run from global memory itself, two runs ahead, and decodes them as tc_rows
 * does. A run's MMAs are waited for before its fold (ptxas serializes the MMAs when a fold reads
 * one run's partial sums while the next run's are in flight), so an SM's two consumer
 * warpgroups are what keep the tensor cores busy while the other folds and decodes. */
#ifndef DSV4_CUDA_WGMMA_CUH
#define DSV4_CUDA_WGMMA_CUH

#include "kernels/cuda/mma.cuh"

namespace dsv4cu {

/* Tokens a pass, stages in the ring, consumer warpgroups a block. */
enum { WG_N = 64, WG_NS = 4, WG_C = 2, WG_THREADS = WG_C * 128 + 32 };
/* Runs past the one loaded into registers whose chunks a thread asks the L2 for. */
enum { WG_PF = 4 };
/* Rows a block computes. */
__host__ __device__ inline int wg_blocks(int64_t nr) { return (int)((nr + WG_C * 64 - 1) / (WG_C * 64)); }

/* Bytes of one staged (token block, run) tile of kind F with E terms. */
template <int F, int E>
__host__ __device__ constexpr int wg_tile_bytes()
{
    return E * tcf<F>::G * 32 * WG_N;
}

/* Dynamic shared memory of a wg_rows block: WG_NS stages, then 2 WG_NS mbarriers. */
template <int F, int E>
__host__ __device__ constexpr size_t wg_smem()
{
    return (size_t)WG_NS * wg_tile_bytes<F, E>() + 16 * WG_NS;
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

/* y[t, i] for rows i < nr (from r0) and tokens t < T <= WG_N of map m, as tc_rows<F, TC_TN / 8,
 * M, E> computes them, from x staged by wg_stage at xt, with xf[c] whether run c has mid or lo
 * terms (E = 3: a run without them takes only its hi MMAs, and only its hi terms are copied, as
 * tc_rows skips them): row block blk (WG_C 64 rows), slice group z of Z (part, pld, slab as in
 * tc_rows). Dynamic shared memory: wg_smem. */
template <int F, int E, class M>
__device__ __forceinline__ void wg_rows(const wdev &w, int64_t r0, int nr, const M &m, int T, const uint8_t *xt,
                                        const uint8_t *xf, int blk, float *part, int64_t pld, int64_t slab, int z, int Z)
{
    enum { G = tcf<F>::G, TB = wg_tile_bytes<F, E>(), NV = WG_N / 2 };
    constexpr bool scaled = F != DSV4_WF_BF16;
    extern __shared__ __align__(128) uint8_t wsm[];
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(wsm);
    const uint32_t full = sbase + WG_NS * TB, empty = full + 8 * WG_NS;
    const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int S = w.tcs, k = (int)w.k, nrun = (k + 16 * G - 1) / (16 * G);
    if (part && z >= Z)
        return;
    const int s_beg = part ? z * (S / Z) : 0, s_end = part ? (z + 1) * (S / Z) : S;
    const int c_beg = tc_slice(nrun, S, s_beg), c_end = tc_slice(nrun, S, s_end);
    if (threadIdx.x == 0) {
        for (int i = 0; i < WG_NS; i++) {
            mb_init(full + 8 * i, 1);
            mb_init(empty + 8 * i, WG_C * 4);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (warp == WG_C * 4) { /* the producer */
        if (lane == 0)
            for (int c = c_beg, i = 0; c < c_end; c++, i++) {
                int s = i % WG_NS;
                if (i >= WG_NS)
                    mb_wait(empty + 8 * s, ((i / WG_NS) - 1) & 1);
                const uint32_t bytes = E > 1 && !__ldg(xf + c) ? TB / E : TB;
                mb_expect(full + 8 * s, bytes);
                bulk_copy(sbase + s * TB, xt + (int64_t)c * TB, bytes, full + 8 * s);
            }
        return;
    }
    const int i0 = blk * (WG_C * 64) + warp * 16;
    const bool live = i0 < nr;
    const int64_t ra = r0 + (i0 + g < nr ? i0 + g : 0), rb = r0 + (i0 + g + 8 < nr ? i0 + g + 8 : 0);
    typedef typename tcf<F>::CT CT;
    const CT *ca = (const CT *)tc_row<F>(w, ra) + t, *cb = (const CT *)tc_row<F>(w, rb) + t;
    const int nch = k / (4 * G);
    const int64_t sa = scaled ? tc_srow<F>(w, ra) : 0, sb = scaled ? tc_srow<F>(w, rb) : 0;
    /* run c's chunks and raw scales into slot h */
    CT qa[2], qb[2];
    uint32_t xa[2], xbs[2], wd[2];
    auto load = [&](int h, int c) {
        bool in = live && c < c_end && c * 4 + t < nch;
        qa[h] = in ? __ldg(ca + c * 4) : CT{};
        qb[h] = in ? __ldg(cb + c * 4) : CT{};
        /* run c + WG_PF's chunks toward the L2, so the load above finds them there when its turn
         * comes (two runs of registers do not cover a load from memory) */
        const int cp = c + WG_PF;
        if (live && cp < c_end && cp * 4 + t < nch) {
            asm volatile("prefetch.global.L2 [%0];" ::"l"(ca + cp * 4));
            asm volatile("prefetch.global.L2 [%0];" ::"l"(cb + cp * 4));
        }
        if (E > 1)
            wd[h] = c < c_end ? __ldg(xf + c) : 0u;
        if (scaled) {
            bool run = live && c < c_end;
            xa[h] = run ? tc_scale_raw(w, sa + (c >> w.kss)) : 0u;
            xbs[h] = run ? tc_scale_raw(w, sb + (c >> w.kss)) : 0u;
        }
    };
    float acc[NV], tot[NV], p[NV];
#pragma unroll
    for (int v = 0; v < NV; v++)
        acc[v] = tot[v] = 0.0f;
    int slice = s_beg, next = tc_slice(nrun, S, s_beg + 1);
    auto emit = [&](int sl) {
        const M om = m.with_y(part + sl * slab, pld);
#pragma unroll
        for (int v = 0; v < NV; v++) {
            int tk = 8 * (v >> 2) + 2 * t + (v & 1), i = i0 + g + ((v >> 1) & 1) * 8;
            if (tk < T && i < nr)
                om.put(tk, i, acc[v]);
        }
    };
    auto slice_end = [&]() {
        if (part)
            emit(slice);
#pragma unroll
        for (int v = 0; v < NV; v++) {
            tot[v] = slice ? tot[v] + acc[v] : acc[v];
            acc[v] = 0.0f;
        }
        slice++;
        next = tc_slice(nrun, S, slice + 1);
    };
    load(0, c_beg);
    load(1, c_beg + 1);
    /* run c (i-th of the block's), its chunks in slot h: a slice ending before it first; then
     * its stage, its fragments, its MMAs into p (BF16: into acc), and when they are done its
     * stage released, slot h loaded with run c + 2 and p folded into the slice's sum */
    auto step = [&](auto hc, int c, int i) {
        constexpr int h = decltype(hc)::value;
        while (c == next)
            slice_end();
        const int s = i % WG_NS;
        uint32_t a[G][4];
#pragma unroll
        for (int u = 0; u < G; u++) {
            tc_decode<F>(qa[h], u, a[u][0], a[u][2]);
            tc_decode<F>(qb[h], u, a[u][1], a[u][3]);
        }
        const float s0 = scaled ? tc_scale_of(w, xa[h]) : 1.0f, s1 = scaled ? tc_scale_of(w, xbs[h]) : 1.0f;
        (void)s0, (void)s1;
        mb_wait(full + 8 * s, (i / WG_NS) & 1);
        /* the run's MMAs over EE terms (its mid and lo only where it has them) */
        auto mmas = [&](auto ec) {
            constexpr int EE = decltype(ec)::value;
            wg_fence();
#pragma unroll
            for (int u = 0; u < G; u++)
#pragma unroll
                for (int e = 0; e < EE; e++) {
                    uint64_t d = wg_desc(sbase + s * TB + (e * G + u) * 32 * WG_N);
                    if constexpr (scaled)
                        wg_mma(p, a[u], d, u | e);
                    else
                        wg_mma(acc, a[u], d, 1);
                }
            wg_commit();
        };
        if (E > 1 && wd[h])
            mmas(std::integral_constant<int, E>());
        else
            mmas(std::integral_constant<int, 1>());
        wg_wait<0>();
        if (lane == 0)
            mb_arrive(empty + 8 * s);
        load(h, c + 2);
        if constexpr (scaled) {
#pragma unroll
            for (int v = 0; v < NV; v++)
                acc[v] = fmaf(p[v], (v >> 1) & 1 ? s1 : s0, acc[v]);
        }
    };
    std::integral_constant<int, 0> H0;
    std::integral_constant<int, 1> H1;
    for (int c = c_beg; c < c_end; c += 2) {
        step(H0, c, c - c_beg);
        if (c + 1 < c_end)
            step(H1, c + 1, c + 1 - c_beg);
    }
    if (!live)
        return;
    if (part)
        emit(slice);
    else
#pragma unroll
        for (int v = 0; v < NV; v++) {
            float y = slice ? tot[v] + acc[v] : acc[v];
            int tk = 8 * (v >> 2) + 2 * t + (v & 1), i = i0 + g + ((v >> 1) & 1) * 8;
            if (tk < T && i < nr)
                m.put(tk, i, y);
        }
}

/* Host side (linear.cu): whether a many-token pass of kind F over T tokens (or pairs) takes
 * wgmma rather than the mma.sync pass. Both give the same bits, so this chooses only the speed:
 * by default FP8 and FP4 past 64 tokens, where it measured faster (docs/bench.md);
 * DSV4_CUDA_WG=1 every kind past the few-token passes, 0 never. And the staged-x buffers
 * (which 0 or 1) of at least `bytes`, NULL when they cannot grow. */
bool wg_use(int F, int T);
uint8_t *wg_buf(int which, size_t bytes);

} // namespace dsv4cu

#endif
