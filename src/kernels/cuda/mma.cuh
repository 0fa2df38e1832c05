/* kernels/cuda — the tensor-core row kernel: y = W x over BF16, FP8 and FP4 weights on bf16
 * mma.sync with fp32 accumulation, exact to fp32 rounding (below). Shared by the linear and
 * expert kernels, for every row count. C++ only.
 *
 * Exactness. Every BF16, e4m3 and e2m1 value is a bf16 value, so the weight side is exact. An
 * fp32 activation x is split into three bf16 terms by truncation: hi = x with its low 16 bits
 * cleared, r = x - hi (exact in fp32, at most 16 significant bits), mid = r truncated the same
 * way, lo = r - mid (at most 8 significant bits, so a bf16 value). x = hi + mid + lo exactly,
 * each product w * term is exact in the fp32 accumulator's input, and the sum is an fp32 sum.
 * (Inf and NaN inputs give NaN.) An x that holds bf16 values (REF's activations) is its own
 * hi, and its mid and lo products are zeros, which leave an fp32 sum as it was: so a k-tile
 * whose staged x has no mid or lo term anywhere skips their MMAs (a block-uniform test at the
 * tile's barrier), and calls whose x is known to hold bf16 values (REF's quantized inputs) are
 * built with one term (E = 1). Either way a token's sum is the three-term sum's value.
 *
 * Batch invariance. In m16n8k16 the weight rows are the M side (16) and the tokens the N side
 * (8), so an output depends only on its weight row, its token's x and the sequence of k-steps,
 * which the weight's shape alone fixes (tc_run, and the sum stated above tc_rows). How many
 * tokens a launch holds, where a token sits in it, how many tokens a pass takes and whether the
 * launch splits change nothing in a token's operations. */
#ifndef DSV4_CUDA_MMA_CUH
#define DSV4_CUDA_MMA_CUH

#include "kernels/cuda/linear.cuh"

namespace dsv4cu {

/* d = a b + c on one m16n8k16 tile (bf16 in, fp32 accumulate). */
__device__ __forceinline__ void mma_bf16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1, const float c[4])
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

/* The high halves of two fp32 bit patterns as a bf16 pair (u0 low). */
__device__ __forceinline__ uint32_t hi_pair(uint32_t u0, uint32_t u1) { return __byte_perm(u0, u1, 0x7632); }

/* x0, x1 as three bf16 pairs whose sum is (x0, x1) exactly (see the top of this file). */
__device__ __forceinline__ void split3(float x0, float x1, uint32_t p[3])
{
    uint32_t u0 = __float_as_uint(x0), u1 = __float_as_uint(x1);
    float r0 = x0 - __uint_as_float(u0 & 0xffff0000u), r1 = x1 - __uint_as_float(u1 & 0xffff0000u);
    uint32_t v0 = __float_as_uint(r0), v1 = __float_as_uint(r1);
    float l0 = r0 - __uint_as_float(v0 & 0xffff0000u), l1 = r1 - __uint_as_float(v1 & 0xffff0000u);
    p[0] = hi_pair(u0, u1);
    p[1] = hi_pair(v0, v1);
    p[2] = hi_pair(__float_as_uint(l0), __float_as_uint(l1));
}
/* The terms an activation takes: 3 for any fp32 x (split3), 1 for x whose values are bf16
 * values already (REF's quantized inputs: their hi is all of them, so the one product is the
 * three-term sum's, whose mid and lo products are zeros). */
enum { TC_X3 = 3, TC_X1 = 1 };
template <int E>
__device__ __forceinline__ void split_terms(float x0, float x1, uint32_t p[E])
{
    if constexpr (E == 1)
        p[0] = hi_pair(__float_as_uint(x0), __float_as_uint(x1));
    else
        split3(x0, x1, p);
}

/* A form's runs: a run is 16 G elements of a row (G k-steps); thread t of a warp holds the chunk
 * of 4 G elements at 4 G t of it (one load: CT), and k-step u of the run takes that chunk's
 * elements 4 u .. 4 u + 3: so a run is four chunks, and thread t's chunk of run c is CT c * 4 + t. */
template <int F> struct tcf;
template <> struct tcf<DSV4_WF_BF16> { typedef uint4 CT; enum { G = 2 }; };
template <> struct tcf<DSV4_WF_FP8> { typedef uint4 CT; enum { G = 4 }; };
template <> struct tcf<DSV4_WF_FP4> { typedef uint32_t CT; enum { G = 2 }; };
/* FP8 whose scale blocks are 32 wide along k (V4.1's): a run takes one scale, so its runs are
 * 32 elements, two k-steps. A kind of the tensor-core path, not a storage form (tc_form). */
enum { TC_FP8_32 = 0x100 + DSV4_WF_FP8 };
template <> struct tcf<TC_FP8_32> { typedef uint2 CT; enum { G = 2 }; };

/* The storage form a tensor-core kind reads. */
__host__ __device__ constexpr int tc_form(int F) { return F == TC_FP8_32 ? (int)DSV4_WF_FP8 : F; }

/* Step u's four elements of a chunk as two bf16 pairs: (0, 1) and (2, 3). */
template <int F>
__device__ __forceinline__ void tc_decode(const typename tcf<F>::CT &c, int u, uint32_t &p01, uint32_t &p23)
{
    if constexpr (F == DSV4_WF_BF16) {
        const uint32_t w[4] = {c.x, c.y, c.z, c.w};
        p01 = w[2 * u];
        p23 = w[2 * u + 1];
    } else if constexpr (tc_form(F) == DSV4_WF_FP8) {
        float v[4];
        if constexpr (F == TC_FP8_32) {
            e4m3x4(u ? c.y : c.x, v);
        } else {
            const uint32_t w[4] = {c.x, c.y, c.z, c.w};
            e4m3x4(w[u], v);
        }
        p01 = hi_pair(__float_as_uint(v[0]), __float_as_uint(v[1]));
        p23 = hi_pair(__float_as_uint(v[2]), __float_as_uint(v[3]));
    } else {
        /* the e2m1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 as bf16 bits, their low and high bytes
         * looked up for the four nibbles at once (each nibble's magnitude selects a byte), then
         * interleaved into pairs; each nibble's sign bit (bits 3, 7, 11, 15) becomes its half's
         * (bits 15, 31) by one multiply: sg * (2^12 + 2^24) puts nibble 0's sign at 15 and nibble
         * 1's at 31, sg * (2^4 + 2^16) nibble 2's at 15 and 3's at 31; the other products land
         * on distinct bits between them (one carry, 27 + 27 into 28, or 19 + 19 into 20), which
         * the mask clears */
        uint32_t h = c >> (16 * u), sel = h & 0x7777u, sg = h & 0x8888u;
        uint32_t lo = __byte_perm(0xC0800000u, 0xC0804000u, sel), hi = __byte_perm(0x3F3F3F00u, 0x40404040u, sel);
        p01 = __byte_perm(lo, hi, 0x5140) | ((sg * 0x01001000u) & 0x80008000u);
        p23 = __byte_perm(lo, hi, 0x7362) | ((sg * 0x00010010u) & 0x80008000u);
    }
}

/* A row's first byte. */
template <int F>
__device__ __forceinline__ const uint8_t *tc_row(const wdev &w, int64_t r)
{
    return w.q + (F == DSV4_WF_BF16 ? r * w.k * 2 : tc_form(F) == DSV4_WF_FP8 ? r * w.k : r * w.k / 2);
}

/* A block: TC_TW warps, warp wid owning the 16-row group blk * TC_TW + wid, over up to 8 NT
 * tokens a pass (NT = 1, 2 for few tokens, TC_TN / 8 for many). TC_SMAX bounds tcs. */
enum { TC_TW = 8, TC_TN = 64, TC_SMAX = 64 };
/* Runs of a scaled form whose chains a tile issues interleaved (tc_rows). */
enum { TC_IL = 2 };

/* k-steps a k-tile (a whole number of runs): few-token passes take longer tiles, so that a warp
 * keeps about 2 KB of weights in flight while it computes the tile before. Few-token passes
 * double-buffer the split x tile (one barrier a tile); the 64-token pass has room for one. */
template <int F, int NT>
__host__ __device__ constexpr int tc_ks()
{
    return NT > 2 ? 4 : F == DSV4_WF_BF16 ? 4 : 8;
}
template <int NT>
__host__ __device__ constexpr int tc_xbufs()
{
    return NT > 2 ? 1 : 2;
}
/* Whether the next tile's operands are loaded before the current one is computed: few-token
 * passes, whose tiles compute quickly; a 64-token pass computes long enough for its block's
 * other warps to cover the loads, and needs the registers for its sums. */
template <int NT>
__host__ __device__ constexpr bool tc_prefetch()
{
    return NT <= 2;
}

/* 16 bytes from global src to shared dst without passing through registers; zeros when !valid. */
__device__ __forceinline__ void cp16(void *dst, const void *src, bool valid)
{
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_wait(void) { asm volatile("cp.async.wait_all;" ::: "memory"); }

/* Where run slice s of S begins: slices are contiguous, in order, fixed by the run count and S. */
__device__ __forceinline__ int tc_slice(int nrun, int S, int s) { return (int)((int64_t)nrun * s / S); }

/* Block scale i of a scaled weight as stored: the e8m0 byte, or the fp32 scale's bits. A tile's
 * scales are loaded with its weights and converted only when the tile is computed, so the load
 * has the previous tile's time to arrive. */
__device__ __forceinline__ uint32_t tc_scale_raw(const wdev &w, int64_t i)
{
    return w.e8m0 ? (uint32_t)__ldg((const uint8_t *)w.s + i) : __float_as_uint(__ldg((const float *)w.s + i));
}
/* The scale a raw value stands for, without branches: e8m0 b is 2^(b - 127) (b = 0 the subnormal
 * 2^-127, 255 NaN). */
__device__ __forceinline__ float tc_scale_of(const wdev &w, uint32_t b)
{
    if (!w.e8m0)
        return __uint_as_float(b);
    uint32_t v = b ? b << 23 : 0x00400000u;
    return __uint_as_float(b == 255 ? 0x7fc00000u : v);
}

/* The first scale index of weight row r (add the k block). */
template <int F>
__device__ __forceinline__ int64_t tc_srow(const wdev &w, int64_t r)
{
    return tc_form(F) == DSV4_WF_FP8 ? (int64_t)((uint32_t)r / (uint32_t)w.bn) * w.sk : r * w.sk;
}

/* One run of one n-tile, its G k-steps' weight fragments a[u] decoded: acc += W_run x_run.
 * BF16 chains every product into acc; a scaled form sums the run from zero (the E terms of
 * each k-step in turn, the k-steps in order) and adds it with one fma by each row's block scale
 * (s0 for row g, s1 for row g + 8). */
template <int F, int E, class XF>
__device__ __forceinline__ void tc_run(float acc[4], const uint32_t (*a)[4], const XF &xfrag, float s0, float s1, bool x3)
{
    enum { G = tcf<F>::G };
    auto chain = [&](float d[4]) {
#pragma unroll
        for (int u = 0; u < G; u++)
#pragma unroll
            for (int e = 0; e < E; e++) {
                if (e && !x3) /* the tile's mid and lo terms are all zero */
                    break;
                uint2 b = xfrag(u, e);
                mma_bf16(d, a[u], b.x, b.y, d);
            }
    };
    if constexpr (F == DSV4_WF_BF16) {
        chain(acc);
    } else {
        float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        chain(p);
        acc[0] = fmaf(p[0], s0, acc[0]);
        acc[1] = fmaf(p[1], s0, acc[1]);
        acc[2] = fmaf(p[2], s1, acc[2]);
        acc[3] = fmaf(p[3], s1, acc[3]);
    }
}

/* One k-tile's weights in a thread's registers: its two rows' chunks of each run (zero where
 * the run is not loaded) and their block scales. */
template <int F, int NT>
struct tc_tile {
    enum { G = tcf<F>::G, KS = tc_ks<F, NT>(), RT = KS / G };
    typename tcf<F>::CT qa[RT], qb[RT];
    uint32_t sa[RT], sb[RT]; /* raw (tc_scale_raw) */
};

/* y[t, i] = sum_k W[r0 + i, k] x[t, k] for rows i < nr and tokens t < T of a row map M
 * (linear.cuh), computed for weight row i of a 16-row group and token t as
 *   y = P_0 + P_1 + ... + P_{S-1}, added left to right, where P_s is run slice s (tc_slice)
 *   summed from zero over its runs in order, each run added by tc_run.
 * S = tcs is fixed by the weight's shape. Unsplit (part == NULL, Z = 1), a warp walks every
 * slice and folds each into the total at its end; split into Z groups (Z a power of two <= S;
 * the 64-token pass takes Z = S only),
 * block z's warps compute slices z S / Z .. (z + 1) S / Z - 1, each into its own slab
 * m.with_y(part + s slab, pld), and tc_fold adds the slabs in slice order. Either way, and for
 * every T, NT, Z, launch shape and place of a token in it, a token's sum is the same sequence of
 * operations.
 *
 * Fragment mapping: thread (g, t) = (lane / 4, lane % 4) holds rows g and g + 8 of the group and
 * token g of each n-tile; in k-step u of a run it holds the run's elements 4 G t + 4 u .. + 3
 * (tcf), which fill the MMA's k slots 2t, 2t + 1, 2t + 8, 2t + 9: a permutation of the run's k
 * shared by both operands. Needs tc_ok (a run inside one scale block, k % 4 G == 0) and x rows
 * 16-byte aligned.
 *
 * The block walks k-tiles of RT runs (k-tiles are aligned to RT runs from 0, so a slice may
 * start inside one). Each thread reads its share of a tile's x (few-token passes copy it ahead
 * into shared memory with cp.async, into its own slots: xr), splits it into the three bf16
 * terms and stores them in fragment order
 * (xs[buffer][term][n-tile][step][lane]: one 8-byte read a fragment). In few-token passes the
 * next tile's x copies and weight loads are issued before the current tile is computed, so they
 * are in flight while it runs (tc_prefetch). */
template <int F, int NT, class M, int E = TC_X3>
__device__ __forceinline__ void tc_rows(const wdev &w, int64_t r0, int nr, const M &m, int T, int blk, float *part,
                                        int64_t pld, int64_t slab, int z, int Z)
{
    typedef tc_tile<F, NT> TL;
    enum { G = TL::G, KS = TL::KS, RT = TL::RT, TN = 8 * NT, XT = 4 * KS, XN = TN * XT,
           XV = (XN + TC_TW * 32 - 1) / (TC_TW * 32), XB = tc_xbufs<NT>(), PF = tc_prefetch<NT>() };
    static_assert(KS % G == 0 && (XN % (TC_TW * 32) == 0 || XV == 1), "a k-tile is whole runs, staged evenly");
    const bool scaled = F != DSV4_WF_BF16;
    /* few-token passes of a scaled form interleave runs (below); the 64-token pass's n-tiles are
     * independent chains already */
    constexpr int IL = scaled && NT <= 2 ? TC_IL : 1;
    static_assert(RT % IL == 0, "a tile is whole groups of interleaved runs");
    __shared__ uint2 xs[XB][E][NT][KS][32];
    __shared__ float4 xr[PF ? XV : 1][TC_TW * 32];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int S = w.tcs, i0 = (blk * TC_TW + wid) * 16;
    if (part && z >= Z)
        return;
    const bool live = i0 < nr;
    const int k = (int)w.k, nrun = (k + 16 * G - 1) / (16 * G);
    const int64_t ra = r0 + (i0 + g < nr ? i0 + g : 0), rb = r0 + (i0 + g + 8 < nr ? i0 + g + 8 : 0);
    typedef typename tcf<F>::CT CT;
    /* thread t's chunk of run c of each row: CT c * 4 + t (a run is four chunks) */
    const CT *ca = (const CT *)tc_row<F>(w, ra) + t, *cb = (const CT *)tc_row<F>(w, rb) + t;
    const int nch = k / (4 * G);
    const int64_t sa = scaled ? tc_srow<F>(w, ra) : 0, sb = scaled ? tc_srow<F>(w, rb) : 0;
    const int s_beg = part ? z * (S / Z) : 0, s_end = part ? (z + 1) * (S / Z) : S;
    const int c_beg = tc_slice(nrun, S, s_beg), c_end = tc_slice(nrun, S, s_end);
    /* float4 f of token tok's XT in a tile (the v-th this thread stages) is run f / 4G's elements
     * 4 (f % 4G) .. + 3, which thread t' = (f % 4G) / G holds in step (f / 4G) G + f % G */
    const int xf = (int)threadIdx.x % XT, xq = xf % (4 * G), xoff = (xf / (4 * G)) * 16 * G + 4 * xq;
    const int xslot = ((xf / (4 * G)) * G + xq % G) * 32 + (((int)threadIdx.x / XT) & 7) * 4 + xq / G;
    for (int t0 = 0; t0 < T; t0 += TN) {
        /* few-token passes keep their x rows' addresses; the 64-token pass needs the registers */
        const float *xp[PF ? XV : 1];
        auto xrow = [&](int v) -> const float * {
            int tok = ((int)threadIdx.x + v * TC_TW * 32) / XT;
            return t0 + tok < T ? m.xr(t0 + tok) + xoff : NULL;
        };
        if constexpr (PF)
#pragma unroll
            for (int v = 0; v < XV; v++)
                xp[v] = xrow(v);
        /* tile c: this thread's x copies into xr, and its weights into L */
        auto load = [&](TL &L, int c) {
#pragma unroll
            for (int v = 0; v < XV; v++) {
                if (!PF || (XN < TC_TW * 32 && (int)threadIdx.x >= XN))
                    break;
                const float *xv = xp[PF ? v : 0];
                bool in = xv && c * 16 * G + xoff < k;
                cp16(&xr[PF ? v : 0][threadIdx.x], in ? (const void *)(xv + c * 16 * G) : (const void *)w.q, in);
            }
            if (live && c >= c_beg && c + RT <= c_end && (c + RT) * 4 <= nch) {
                /* a tile of whole runs inside the block's runs and inside k: every load, without
                 * the per-run checks below */
#pragma unroll
                for (int v = 0; v < RT; v++) {
                    L.qa[v] = __ldg(ca + (c + v) * 4);
                    L.qb[v] = __ldg(cb + (c + v) * 4);
                    if (scaled) {
                        L.sa[v] = tc_scale_raw(w, sa + ((c + v) >> w.kss));
                        L.sb[v] = tc_scale_raw(w, sb + ((c + v) >> w.kss));
                    }
                }
                return;
            }
#pragma unroll
            for (int v = 0; v < RT; v++) {
                /* a thread's accumulators hold whole runs (its tokens), so every thread takes the
                 * run's scales, while only the chunks inside k are loaded */
                int cc = c + v;
                bool run = live && cc >= c_beg && cc < c_end, in = run && cc * 4 + t < nch;
                L.qa[v] = in ? __ldg(ca + cc * 4) : CT{};
                L.qb[v] = in ? __ldg(cb + cc * 4) : CT{};
                if (scaled) {
                    int bi = cc >> w.kss;
                    L.sa[v] = run ? tc_scale_raw(w, sa + bi) : 0u;
                    L.sb[v] = run ? tc_scale_raw(w, sb + bi) : 0u;
                }
            }
        };
        float tot[NT][4], acc[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int q = 0; q < 4; q++)
                tot[j][q] = acc[j][q] = 0.0f;
        /* slice s's partial into its slab (split) */
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
        /* slice `slice` ends: to its slab, or into the total */
        auto slice_end = [&]() {
            if (PF && part)
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
        TL cur;
        if (PF)
            load(cur, c_first);
        int buf = 0;
        for (int c0 = c_first; c0 < c_end; c0 += RT) {
            if (!PF)
                load(cur, c0);
            if (PF)
                cp_wait();
            if (XB == 1 && c0 != c_first) /* the single buffer's last readers are done */
                __syncthreads();
            uint32_t wide = 0; /* a mid or lo term this thread staged */
#pragma unroll
            for (int v = 0; v < XV; v++) {
                if (XN < TC_TW * 32 && (int)threadIdx.x >= XN)
                    break;
                float4 xv;
                if constexpr (PF)
                    xv = xr[v][threadIdx.x];
                else {
                    const float *xq = xrow(v);
                    xv = xq && c0 * 16 * G + xoff < k ? __ldg((const float4 *)(xq + c0 * 16 * G))
                                                      : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                }
                uint32_t b01[E], b23[E];
                split_terms<E>(xv.x, xv.y, b01);
                split_terms<E>(xv.z, xv.w, b23);
                int tok = ((int)threadIdx.x + v * TC_TW * 32) / XT;
#pragma unroll
                for (int e = 0; e < E; e++) {
                    (&xs[buf][e][tok >> 3][0][0])[xslot] = make_uint2(b01[e], b23[e]);
                    if (e)
                        wide |= b01[e] | b23[e];
                }
            }
            /* the tile takes its mid and lo MMAs only where some token's x needs them */
            const bool x3 = __syncthreads_or(wide != 0) != 0;
            const bool more = PF && c0 + RT < c_end;
            TL nx;
            if (more)
                load(nx, c0 + RT);
            /* A scaled form's runs are independent chains until each is added to the total, so
             * a tile inside the block's runs and inside one slice issues them TC_IL at a time,
             * interleaved (MMA latency hidden behind the other chains); each run's own sequence
             * of operations, and the order the runs reach the total, are the loop's below. */
            const bool whole = IL > 1 && live && c0 >= c_beg && c0 + RT <= c_end;
            while (whole && c0 == next) /* a slice ends where the tile starts */
                slice_end();
            if (whole && next >= c0 + RT) {
#pragma unroll
                for (int v0 = 0; v0 < RT; v0 += IL) {
                    uint32_t a[IL][G][4];
                    float p[IL][NT][4];
#pragma unroll
                    for (int h = 0; h < IL; h++) {
#pragma unroll
                        for (int u = 0; u < G; u++) {
                            tc_decode<F>(cur.qa[v0 + h], u, a[h][u][0], a[h][u][2]);
                            tc_decode<F>(cur.qb[v0 + h], u, a[h][u][1], a[h][u][3]);
                        }
#pragma unroll
                        for (int j = 0; j < NT; j++)
#pragma unroll
                            for (int q = 0; q < 4; q++)
                                p[h][j][q] = 0.0f;
                    }
#pragma unroll
                    for (int u = 0; u < G; u++)
#pragma unroll
                        for (int e = 0; e < E; e++) {
                            if (e && !x3)
                                break;
#pragma unroll
                            for (int j = 0; j < NT; j++)
#pragma unroll
                                for (int h = 0; h < IL; h++) {
                                    uint2 b = xs[buf][e][j][(v0 + h) * G + u][lane];
                                    mma_bf16(p[h][j], a[h][u], b.x, b.y, p[h][j]);
                                }
                        }
#pragma unroll
                    for (int h = 0; h < IL; h++) {
                        const float s0 = tc_scale_of(w, cur.sa[v0 + h]), s1 = tc_scale_of(w, cur.sb[v0 + h]);
#pragma unroll
                        for (int j = 0; j < NT; j++) {
                            acc[j][0] = fmaf(p[h][j][0], s0, acc[j][0]);
                            acc[j][1] = fmaf(p[h][j][1], s0, acc[j][1]);
                            acc[j][2] = fmaf(p[h][j][2], s1, acc[j][2]);
                            acc[j][3] = fmaf(p[h][j][3], s1, acc[j][3]);
                        }
                    }
                }
            } else if (live)
#pragma unroll
                for (int v = 0; v < RT; v++) {
                    int c = c0 + v;
                    if (c >= c_end)
                        break;
                    if (c < c_beg)
                        continue;
                    while (c == next)
                        slice_end();
                    const float s0 = scaled ? tc_scale_of(w, cur.sa[v]) : 1.0f, s1 = scaled ? tc_scale_of(w, cur.sb[v]) : 1.0f;
                    uint32_t a[G][4];
#pragma unroll
                    for (int u = 0; u < G; u++) {
                        tc_decode<F>(cur.qa[v], u, a[u][0], a[u][2]);
                        tc_decode<F>(cur.qb[v], u, a[u][1], a[u][3]);
                    }
#pragma unroll
                    for (int j = 0; j < NT; j++) {
                        if (8 * j >= T - t0) /* an n-tile past the pass's last token (a partial tile) */
                            break;
                        tc_run<F, E>(acc[j], a, [&](int u, int e) { return xs[buf][e][j][v * G + u][lane]; }, s0, s1, x3);
                    }
                }
            if (more)
                cur = nx;
            buf = XB == 1 ? 0 : buf ^ 1;
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
        /* the next pass restages both buffers */
        __syncthreads();
    }
}

/* Kernels that run tc_rows with NT n-tiles a pass take this block size and bound. */
#define TC_BOUNDS(NT) __launch_bounds__(TC_TW * 32, 2)

/* Host side (linear.cu): whether a weight takes the tensor-core path (from its form, shape and
 * scale blocks alone, so every call over it sums the same way); the kind it takes (its form, or
 * TC_FP8_32); the n-tiles a pass for T tokens (1, 2 or TC_TN / 8). */
bool tc_ok(const dsv4_weight *w);
int tc_kind(const dsv4_weight *w);
int tc_nt(int T);
/* Blocks a launch over nr rows takes (for each token pass; kernels that fold the row blocks into
 * another grid dimension ask it too), and the slice groups Z a launch of that many blocks in all
 * splits into (1: unsplit), from the device's block slots alone. */
__host__ __device__ inline int tc_blocks(int64_t nr) { return (int)cdiv(nr, TC_TW * 16); }
int tc_groups(int S, int64_t blocks, int nt);
/* A device buffer of n floats for slice partials (grows, never freed: recordings may read it). */
float *tc_part_buf(size_t n);
/* y[r, i] = part[0][r, i] + part[1][r, i] + ... + part[S-1][r, i] (left to right), r < rows,
 * i < nr: slab s at part + s slab, row stride pld; y row stride ldy; rounded to bf16 when rb. */
void tc_fold(const float *part, int S, int64_t rows, int nr, int64_t pld, int64_t slab, float *y, int64_t ldy,
             cudaStream_t st, int rb = 0);

} // namespace dsv4cu

#endif
