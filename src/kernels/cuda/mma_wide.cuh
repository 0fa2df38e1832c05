/* kernels/cuda — the tensor-core row kernel's 64-token pass, and tc_rows, which picks the pass
 * for NT. C++ only.
 *
 * The 64-token pass does the few-token pass's sums (tc_rows_few, mma.cuh: the same runs, slices,
 * k-step order and fragments, so a token's bits do not depend on the pass it took) but keeps
 * a ring of TC_WNS k-tiles in flight: each tile's x (fp32) and weight bytes are copied into
 * dynamic shared memory with cp.async TC_WNS - 1 tiles ahead of the one computed, so global
 * latency hides behind the MMAs of the tiles before, without the registers a prefetch into
 * registers would take from the sums (tot and acc hold 64 floats a thread). One block an SM
 * (the ring and the registers take that much). */
#ifndef DSV4_CUDA_MMA_WIDE_CUH
#define DSV4_CUDA_MMA_WIDE_CUH

#include "kernels/cuda/mma.cuh"

namespace dsv4cu {

/* k-tiles the 64-token pass keeps in its ring. */
enum { TC_WNS = 4 };

/* A tensor-core kind's 64-token tiles: k-steps (KS) and runs (RT) a tile, bytes of a row's run
 * (RB) and tile (WB), and the row stride WS of a tile in shared memory: WB padded so that the
 * warp's fragment reads (thread (g, t) reads row g's chunk t) hit distinct banks in each phase
 * (16-byte reads: rows g and g + 1 in 32 banks; 8-byte: rows g .. g + 3; 4-byte: all 8 rows). */
template <int F>
struct tcw {
    enum { G = tcf<F>::G, KS = tc_ks<F, TC_TN / 8>(), RT = KS / G,
           RB = F == DSV4_WF_BF16 ? 32 * G : tc_form(F) == DSV4_WF_FP8 ? 16 * G : 8 * G, WB = RB * RT,
           WS = F == DSV4_WF_BF16 ? 192 : F == TC_FP8_32 ? 160 : F == DSV4_WF_FP4 ? 48 : 64,
           XT = 4 * KS, XN = TC_TN * XT };
    static_assert(WS >= WB && WS % 16 == 0 && WB % 16 == 0, "whole 16-byte pieces, aligned");
};

/* Dynamic shared memory of a 64-token block: the ring's x (fp32) and weight tiles, and two
 * buffers of split x terms. */
template <int F, int E>
__host__ __device__ constexpr size_t tc_wide_smem()
{
    return (size_t)TC_WNS * ((size_t)tcw<F>::XN * 16 + (size_t)TC_TW * 16 * tcw<F>::WS) +
           (size_t)2 * E * (TC_TN / 8) * tcw<F>::KS * 32 * 8;
}

/* tc_rows_few's y for a 64-token pass (its comment states the sum and the fragment mapping).
 * Per k-tile c (RT runs from c0), in one barrier: every thread waits for its own copies of tile
 * c + 1, the barrier makes tile c's split x and tile c + 1's weights visible (and ends every
 * warp's reads of tile c - 1), the copies of tile c + TC_WNS - 1 go into tile c - 1's slots, each
 * thread splits its own copied x of tile c + 1 into the other xs buffer, and the warps compute
 * tile c. Scales are loaded a tile ahead into registers (a few bytes a row). */
template <int F, class M, int E>
__device__ __forceinline__ void tc_rows_wide(const wdev &w, int64_t r0, int nr, const M &m, int T, int blk, float *part,
                                             int64_t pld, int64_t slab, int z, int Z)
{
    typedef tcw<F> W;
    typedef typename tcf<F>::CT CT;
    enum { NT = TC_TN / 8, G = W::G, KS = W::KS, RT = W::RT, XT = W::XT, XN = W::XN, NTH = TC_TW * 32,
           XV = XN / NTH, WP = W::WB / 16, WV = TC_TW * 16 * WP / NTH, NS = TC_WNS };
    static_assert(XN % NTH == 0 && (TC_TW * 16 * WP) % NTH == 0 && NS >= 3, "copies spread evenly");
    const bool scaled = F != DSV4_WF_BF16;
    extern __shared__ uint4 tc_dsm[];
    float4 *xraw = (float4 *)tc_dsm;                                     /* [NS][XN] */
    uint8_t *wsm = (uint8_t *)(xraw + NS * XN);                          /* [NS][TC_TW 16][WS] */
    typedef uint2 XS[E][NT][KS][32];
    XS *xs = (XS *)(wsm + (size_t)NS * TC_TW * 16 * W::WS);              /* [2] */
    const int th = (int)threadIdx.x, lane = th & 31, wid = th >> 5, g = lane >> 2, t = lane & 3;
    const int S = w.tcs, i0 = (blk * TC_TW + wid) * 16;
    if (part && z >= Z)
        return;
    const bool live = i0 < nr;
    const int k = (int)w.k, nrun = (k + 16 * G - 1) / (16 * G);
    const int64_t ra = r0 + (i0 + g < nr ? i0 + g : 0), rb = r0 + (i0 + g + 8 < nr ? i0 + g + 8 : 0);
    const int64_t sa = scaled ? tc_srow<F>(w, ra) : 0, sb = scaled ? tc_srow<F>(w, rb) : 0;
    const int s_beg = part ? z * (S / Z) : 0, s_end = part ? (z + 1) * (S / Z) : S;
    const int c_beg = tc_slice(nrun, S, s_beg), c_end = tc_slice(nrun, S, s_end);
    /* a row's bytes; rows whose starts are 16-byte aligned take cp.async, others (a FP4 or
     * FP8_32 row of an odd length) are copied by CT loads, in step with the ring */
    const int64_t rowb = (int64_t)(tc_row<F>(w, 1) - tc_row<F>(w, 0));
    const bool wasync = ((uintptr_t)w.q % 16) == 0 && rowb % 16 == 0;
    /* this thread's x float4s: f = th + v NTH is token f / XT's float4 f % XT of the tile, which
     * is its elements 4 (f % XT) .. + 3 (a tile's x of a token is contiguous) */
    const int xf = th % XT, xq = xf % (4 * G);
    const int xslot = ((xf / (4 * G)) * G + xq % G) * 32 + ((th / XT) & 7) * 4 + xq / G;
    struct SC {
        uint32_t a[RT], b[RT]; /* raw (tc_scale_raw) */
    };
    auto lscale = [&](SC &L, int c0) {
#pragma unroll
        for (int v = 0; v < RT; v++) {
            int cc = c0 + v;
            bool run = scaled && live && cc >= c_beg && cc < c_end;
            L.a[v] = run ? tc_scale_raw(w, sa + (cc >> w.kss)) : 0u;
            L.b[v] = run ? tc_scale_raw(w, sb + (cc >> w.kss)) : 0u;
        }
    };
    for (int t0 = 0; t0 < T; t0 += TC_TN) {
        const float *xp[XV];
#pragma unroll
        for (int v = 0; v < XV; v++) {
            int tok = (th + v * NTH) / XT;
            xp[v] = t0 + tok < T ? m.xr(t0 + tok) + 4 * xf : NULL;
        }
        /* tile c0's copies into its slots (tiles past the block's runs copy nothing), as one group */
        auto issue = [&](int c0) {
            if (c0 < c_end) {
                const int sl = (c0 / RT) % NS;
#pragma unroll
                for (int v = 0; v < XV; v++) {
                    bool in = xp[v] && c0 * 16 * G + 4 * xf < k;
                    cp16(&xraw[sl * XN + th + v * NTH], in ? (const void *)(xp[v] + c0 * 16 * G) : (const void *)w.q, in);
                }
#pragma unroll
                for (int v = 0; v < WV; v++) {
                    int p = th + v * NTH, row = p / WP, col = p % WP;
                    bool rin = blk * TC_TW * 16 + row < nr;
                    int64_t off = (int64_t)c0 * W::RB + col * 16, left = rowb - off;
                    int n = !rin || left <= 0 ? 0 : left < 16 ? (int)left : 16;
                    const uint8_t *src = tc_row<F>(w, r0 + (rin ? blk * TC_TW * 16 + row : 0)) + off;
                    uint8_t *dst = wsm + ((size_t)sl * TC_TW * 16 + row) * W::WS + col * 16;
                    if (wasync) {
                        cp16n(dst, n ? (const void *)src : (const void *)w.q, n);
                    } else {
#pragma unroll
                        for (int q = 0; q < 16 / (int)sizeof(CT); q++)
                            ((CT *)dst)[q] = (q + 1) * (int)sizeof(CT) <= n ? __ldg((const CT *)src + q) : CT{};
                    }
                }
            }
            cp_commit();
        };
        /* tile c0's x, copied by this thread, split into xs[b]; whether it holds a mid or lo term */
        auto split = [&](int c0, int b) -> uint32_t {
            const int sl = (c0 / RT) % NS;
            uint32_t wide = 0;
#pragma unroll
            for (int v = 0; v < XV; v++) {
                float4 x4 = xraw[sl * XN + th + v * NTH];
                uint32_t b01[E], b23[E];
                split_terms<E>(x4.x, x4.y, b01);
                split_terms<E>(x4.z, x4.w, b23);
                int tok = (th + v * NTH) / XT;
#pragma unroll
                for (int e = 0; e < E; e++) {
                    (&xs[b][e][tok >> 3][0][0])[xslot] = make_uint2(b01[e], b23[e]);
                    if (e)
                        wide |= b01[e] | b23[e];
                }
            }
            return wide;
        };
        float tot[NT][4], acc[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int q = 0; q < 4; q++)
                tot[j][q] = acc[j][q] = 0.0f;
        auto emit = [&](int sl) {
            const M om = m.with_y(part + sl * slab, pld);
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    int tk = t0 + 8 * j + 2 * t + (q & 1), i = i0 + g + (q >> 1) * 8;
                    if (tk < T && i < nr)
                        om.put(tk, i, acc[j][q]);
                }
        };
        int slice = s_beg, next = tc_slice(nrun, S, s_beg + 1);
        auto slice_end = [&]() {
            if (part)
                emit(slice);
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    tot[j][q] = slice ? tot[j][q] + acc[j][q] : acc[j][q];
                    acc[j][q] = 0.0f;
                }
            slice++;
            next = tc_slice(nrun, S, slice + 1);
        };
        const int c_first = c_beg / RT * RT;
#pragma unroll
        for (int i = 0; i < NS - 1; i++)
            issue(c_first + i * RT);
        cp_wait_group<NS - 2>();
        uint32_t wide = split(c_first, 0);
        SC cur;
        lscale(cur, c_first);
        int buf = 0;
        for (int c0 = c_first; c0 < c_end; c0 += RT) {
            cp_wait_group<NS - 3>();
            /* the tile takes its mid and lo MMAs only where some token's x needs them */
            const bool x3 = __syncthreads_or(wide != 0) != 0;
            issue(c0 + (NS - 1) * RT);
            const bool more = c0 + RT < c_end;
            SC nx;
            if (more) {
                lscale(nx, c0 + RT);
                wide = split(c0 + RT, buf ^ 1);
            }
            const uint8_t *wt = wsm + ((size_t)((c0 / RT) % NS) * TC_TW * 16 + wid * 16 + g) * W::WS;
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
                    const float s0 = scaled ? tc_scale_of(w, cur.a[v]) : 1.0f, s1 = scaled ? tc_scale_of(w, cur.b[v]) : 1.0f;
                    const CT qa = ((const CT *)wt)[v * 4 + t], qb = ((const CT *)(wt + 8 * W::WS))[v * 4 + t];
                    uint32_t a[G][4];
#pragma unroll
                    for (int u = 0; u < G; u++) {
                        tc_decode<F>(qa, u, a[u][0], a[u][2]);
                        tc_decode<F>(qb, u, a[u][1], a[u][3]);
                    }
#pragma unroll
                    for (int j = 0; j < NT; j++)
                        tc_run<F, E>(acc[j], a, [&](int u, int e) { return xs[buf][e][j][v * G + u][lane]; }, s0, s1, x3);
                }
            if (more)
                cur = nx;
            buf ^= 1;
        }
        if (live && part)
            emit(slice);
        else if (live)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    float v = slice ? tot[j][q] + acc[j][q] : acc[j][q];
                    int tk = t0 + 8 * j + 2 * t + (q & 1), i = i0 + g + (q >> 1) * 8;
                    if (tk < T && i < nr)
                        m.put(tk, i, v);
                }
        /* the next pass refills the ring from empty */
        cp_wait_group<0>();
        __syncthreads();
    }
}

/* The row kernel for NT n-tiles a pass: the few-token pass for NT = 1, 2, the 64-token pass for
 * TC_TN / 8 (which needs tc_smem<F, E>(NT) bytes of dynamic shared memory at launch: tc_launch). */
template <int F, int NT, class M, int E = TC_X3>
__device__ __forceinline__ void tc_rows(const wdev &w, int64_t r0, int nr, const M &m, int T, int blk, float *part,
                                        int64_t pld, int64_t slab, int z, int Z)
{
    if constexpr (NT > 2)
        tc_rows_wide<F, M, E>(w, r0, nr, m, T, blk, part, pld, slab, z, Z);
    else
        tc_rows_few<F, NT, M, E>(w, r0, nr, m, T, blk, part, pld, slab, z, Z);
}

template <int F, int E>
__host__ __device__ constexpr size_t tc_smem(int NT)
{
    return NT > 2 ? tc_wide_smem<F, E>() : 0;
}

/* Kernels that run tc_rows with NT n-tiles a pass take this block size and bound: two blocks an
 * SM for the few-token passes, one for the 64-token pass (its ring). */
#define TC_BOUNDS(NT) __launch_bounds__(TC_TW * 32, (NT) > 2 ? 1 : 2)

/* Launches a tc_rows kernel with its dynamic shared memory (raising the kernel's limit past the
 * default 48 KB where it needs more; the attribute is the device's, so it is set each time). */
template <typename... P, typename... A>
static inline void tc_launch(void (*k)(P...), size_t smem, dim3 grid, dim3 block, cudaStream_t st, A &&...args)
{
    if (smem > 48 * 1024)
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    launch_k(k, grid, block, smem, st, std::forward<A>(args)...);
}

} // namespace dsv4cu

#endif
