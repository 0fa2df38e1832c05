/* kernels/cuda — the tensor-core row kernel: y = W x over BF16, FP8 and FP4 weights on bf16
 * mma.sync with fp32 accumulation, exact to fp32 rounding (below). Shared by the linear and
 * expert kernels, for every row count. C++ only.
 *
 * Exactness. Every BF16, e4m3 and e2m1 value is a bf16 value, so the weight side is exact. An
 * fp32 activation x is split into three bf16 terms by truncation: hi = x with its low 16 bits
 * cleared, r = x - hi (exact in fp32, at most 16 significant bits), mid = r truncated the same
 * way, lo = r - mid (at most 8 significant bits, so a bf16 value). x = hi + mid + lo exactly,
 * each product w * term is exact in the fp32 accumulator's input, and the sum is an fp32 sum.
 * (Inf and NaN inputs give NaN.)
 *
 * Batch invariance. In m16n8k16 the weight rows are the M side (16) and the tokens the N side
 * (8), so an output depends only on its weight row, its token's x and the sequence of k-steps,
 * which the weight's shape alone fixes (tc_step, and the sum stated above tc_rows). How many
 * tokens a launch holds, where a token sits in it, which of the two paths runs and how many
 * tokens a pass takes change nothing in a token's operations. */
#ifndef DSV4_CUDA_MMA_CUH
#define DSV4_CUDA_MMA_CUH

#include "kernels/cuda/linear.cuh"

namespace dsv4cu {

/* k-steps whose weight loads the register path issues together. */
enum { TC_U = 4 };

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

/* 16 bytes from global src to shared dst without passing through registers; zeros when !valid. */
__device__ __forceinline__ void cp16(void *dst, const void *src, bool valid)
{
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_wait(void) { asm volatile("cp.async.wait_all;" ::: "memory"); }

/* A form's runs: a run is 16 G elements of a row (G k-steps); thread t of a warp holds the chunk
 * of 4 G elements at 4 G t of it (one load: CT), and k-step u of the run takes that chunk's
 * elements 4 u .. 4 u + 3. U runs are loaded together (the register path's loads in flight). */
template <int F> struct tcf;
template <> struct tcf<DSV4_WF_BF16> { typedef uint4 CT; enum { G = 2, U = 2 }; };
template <> struct tcf<DSV4_WF_FP8> { typedef uint4 CT; enum { G = 4, U = 2 }; };
template <> struct tcf<DSV4_WF_FP4> { typedef uint32_t CT; enum { G = 2, U = 4 }; };

/* Thread chunk at element kk of the row at p (the row's first byte). */
template <int F>
__device__ __forceinline__ typename tcf<F>::CT tc_load(const uint8_t *p, int kk)
{
    if constexpr (F == DSV4_WF_BF16)
        return __ldg((const uint4 *)(p + 2 * kk));
    else if constexpr (F == DSV4_WF_FP8)
        return __ldg((const uint4 *)(p + kk));
    else
        return __ldg((const uint32_t *)(p + kk / 2));
}

/* e2m1 magnitude codes 0..7 as bf16 bits. */
__device__ __forceinline__ uint32_t e2m1_bf16(uint32_t n)
{
    const unsigned long long lo = 0x3fc03f803f000000ull, hi = 0x40c0408040404000ull;
    uint32_t m = n & 7;
    uint32_t b = (uint32_t)(((m & 4) ? hi : lo) >> (16 * (m & 3))) & 0xffffu;
    return b | (n & 8) << 12;
}

/* Step u's four elements of a chunk as two bf16 pairs: (0, 1) and (2, 3). */
template <int F>
__device__ __forceinline__ void tc_decode(const typename tcf<F>::CT &c, int u, uint32_t &p01, uint32_t &p23)
{
    if constexpr (F == DSV4_WF_BF16) {
        const uint32_t w[4] = {c.x, c.y, c.z, c.w};
        p01 = w[2 * u];
        p23 = w[2 * u + 1];
    } else if constexpr (F == DSV4_WF_FP8) {
        const uint32_t w[4] = {c.x, c.y, c.z, c.w};
        float v[4];
        e4m3x4(w[u], v);
        p01 = hi_pair(__float_as_uint(v[0]), __float_as_uint(v[1]));
        p23 = hi_pair(__float_as_uint(v[2]), __float_as_uint(v[3]));
    } else {
        uint32_t h = c >> (16 * u);
        p01 = e2m1_bf16(h) | e2m1_bf16(h >> 4) << 16;
        p23 = e2m1_bf16(h >> 8) | e2m1_bf16(h >> 12) << 16;
    }
}

/* A row's first byte. */
template <int F>
__device__ __forceinline__ const uint8_t *tc_row(const wdev &w, int64_t r)
{
    return w.q + (F == DSV4_WF_BF16 ? r * w.k * 2 : F == DSV4_WF_FP8 ? r * w.k : r * w.k / 2);
}

/* Warps a block of the register path holds (warp w of the launch is slice w % tcs of row group
 * w / tcs), and the tile path's block: TC_TW warps of one row group each, over TC_TN tokens.
 * TC_SMAX bounds tcs. */
enum { TC_RW = 4, TC_TW = 8, TC_TN = 64, TC_SMAX = 64 };
/* m-tiles of a register-path warp for NT n-tiles */
#define TC_MR(NT) ((NT) == 1 ? 4 : 2)

/* Where run slice s of S begins: slices are contiguous, in order, fixed by the run count and S. */
__device__ __forceinline__ int tc_slice(int nrun, int S, int s) { return (int)((int64_t)nrun * s / S); }

/* The scale block of run r (a run lies in one block: tc_ok). */
template <int F>
__device__ __forceinline__ int tc_sblock(const wdev &w, int r)
{
    return w.kss >= 0 ? r >> w.kss : (int)((uint32_t)(r * 16 * tcf<F>::G) / (uint32_t)w.bk);
}

/* The first scale index of weight row r (add the k block). */
template <int F>
__device__ __forceinline__ int64_t tc_srow(const wdev &w, int64_t r)
{
    return F == DSV4_WF_FP8 ? (int64_t)((uint32_t)r / (uint32_t)w.bn) * w.sk : r * w.sk;
}

/* One k-step of one n-tile: acc += W_step x_step, either chained into acc (BF16) or summed from
 * zero and added with one fma by each row's block scale (s0 for row g, s1 for row g + 8). */
template <int F>
__device__ __forceinline__ void tc_step(float acc[4], const uint32_t a[4], const uint32_t b01[3], const uint32_t b23[3],
                                        float s0, float s1)
{
    if constexpr (F != DSV4_WF_BF16) {
        const float z[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        float p[4];
        mma_bf16(p, a, b01[0], b23[0], z);
        mma_bf16(p, a, b01[1], b23[1], p);
        mma_bf16(p, a, b01[2], b23[2], p);
        acc[0] = fmaf(p[0], s0, acc[0]);
        acc[1] = fmaf(p[1], s0, acc[1]);
        acc[2] = fmaf(p[2], s1, acc[2]);
        acc[3] = fmaf(p[3], s1, acc[3]);
    } else {
        mma_bf16(acc, a, b01[0], b23[0], acc);
        mma_bf16(acc, a, b01[1], b23[1], acc);
        mma_bf16(acc, a, b01[2], b23[2], acc);
    }
}

/* The sum both paths compute, for weight row i of a 16-row group and token t:
 *   y = P_0 + P_1 + ... + P_{S-1}, added left to right, where P_s is run slice s (tc_slice)
 *   summed from zero over its runs in order, each run's G k-steps in order by tc_step.
 * The register path gives slice s to warp s of the row group and adds the warps' sums in warp
 * order (one block holds the group when tcs <= TC_RW); the tile path walks all slices in one
 * warp, folding each into the total at its end. Split (part != NULL), each slice's sum goes to
 * its own slab of part instead and tc_fold adds the slabs in slice order. S = tcs is fixed by the
 * weight's shape, so the bits are the same on every path and split, for every T.
 *
 * Fragment mapping: thread (g, t) = (lane / 4, lane % 4) holds rows g and g + 8 of the group and
 * token g of each n-tile; in k-step u of a run it holds the run's elements 4 G t + 4 u .. + 3
 * (tcf), which fill the MMA's k slots 2t, 2t + 1, 2t + 8, 2t + 9: a permutation of the run's k
 * shared by both operands. Needs tc_ok (a run inside one scale block, k % 4 G == 0) and x rows
 * 16-byte aligned. */

/* The register path, for few tokens: y[t, i] = sum_k W[r0 + i, k] x[t, k], i < nr, t < T, through
 * a row map M (linear.cuh). Block blk of TC_RW warps; a row group is TC_MR(NT) m-tiles of 16 rows
 * (each m-tile's sums are those of a 16-row group above: the m-tiles only share x loads and
 * splits); tokens 8 NT at a time, each warp splitting its own x values. Split (part != NULL,
 * required when tcs > TC_RW): slice s goes to the map m.with_y(part + s slab, pld). */
template <int F, int NT, class M>
__device__ __forceinline__ void tc_rows(const wdev &w, int64_t r0, int nr, const M &m, int T, int blk, float *part,
                                        int64_t pld, int64_t slab)
{
    typedef typename tcf<F>::CT CT;
    enum { G = tcf<F>::G, MR = TC_MR(NT), UR = tcf<F>::U * 2 / MR > 0 ? tcf<F>::U * 2 / MR : 1 };
    const bool scaled = F != DSV4_WF_BF16;
    __shared__ float red[TC_RW][MR * NT * 4][32];
    __shared__ float4 xsm[TC_RW][UR][NT][G][32]; /* each lane's own x chunks, no sharing */
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int S = w.tcs, gw = blk * TC_RW + wid, i0 = gw / S * 16 * MR, sub = gw % S;
    const bool live = i0 < nr;
    const int k = (int)w.k, nrun = (k + 16 * G - 1) / (16 * G);
    const int c_lo = tc_slice(nrun, S, sub), c_hi = tc_slice(nrun, S, sub + 1);
    /* rows g and g + 8 of each m-tile (rows past nr read the group's first row; dropped) as byte
     * offsets from w.q, and their first scale index */
    uint32_t ro[MR][2];
    int so[MR][2];
#pragma unroll
    for (int mt = 0; mt < MR; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int i = i0 + 16 * mt + g + 8 * h;
            int64_t r = r0 + (i < nr ? i : i0);
            ro[mt][h] = (uint32_t)(tc_row<F>(w, r) - w.q);
            so[mt][h] = scaled ? (int)tc_srow<F>(w, r) : 0;
        }
    for (int t0 = 0; t0 < T; t0 += 8 * NT) {
        float acc[MR][NT][4];
#pragma unroll
        for (int mt = 0; mt < MR; mt++)
#pragma unroll
            for (int j = 0; j < NT; j++)
                acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.0f;
        const float *xr[NT];
#pragma unroll
        for (int j = 0; j < NT; j++)
            xr[j] = t0 + 8 * j + g < T ? m.xr(t0 + 8 * j + g) : NULL;
        if (live)
            for (int c0 = c_lo; c0 < c_hi; c0 += UR) {
                /* UR runs' weight loads, and their x copied to this lane's shared slots, are
                 * issued together before the first use */
                CT q[UR][MR][2];
#pragma unroll
                for (int v = 0; v < UR; v++) {
                    int kk = (c0 + v) * 16 * G + 4 * G * t;
                    bool in = c0 + v < c_hi && kk < k;
                    if (in)
#pragma unroll
                        for (int mt = 0; mt < MR; mt++)
#pragma unroll
                            for (int h = 0; h < 2; h++)
                                q[v][mt][h] = tc_load<F>(w.q + ro[mt][h], kk);
#pragma unroll
                    for (int j = 0; j < NT; j++)
#pragma unroll
                        for (int u = 0; u < G; u++)
                            cp16(&xsm[wid][v][j][u][lane], in && xr[j] ? (const float4 *)(xr[j] + kk) + u : (const float4 *)w.q,
                                 in && xr[j]);
                }
                cp_wait();
#pragma unroll
                for (int v = 0; v < UR; v++) {
                    int c = c0 + v, kk = c * 16 * G + 4 * G * t;
                    if (c >= c_hi)
                        break;
                    int bi = scaled ? tc_sblock<F>(w, c) : 0;
#pragma unroll
                    for (int u = 0; u < G; u++) {
                        uint32_t b01[NT][3], b23[NT][3];
#pragma unroll
                        for (int j = 0; j < NT; j++) {
                            float4 xv = xsm[wid][v][j][u][lane];
                            split3(xv.x, xv.y, b01[j]);
                            split3(xv.z, xv.w, b23[j]);
                        }
#pragma unroll
                        for (int mt = 0; mt < MR; mt++) {
                            uint32_t a[4] = {0u, 0u, 0u, 0u};
                            if (kk < k) {
                                tc_decode<F>(q[v][mt][0], u, a[0], a[2]);
                                tc_decode<F>(q[v][mt][1], u, a[1], a[3]);
                            }
                            float s0 = 1.0f, s1 = 1.0f;
                            if (scaled) {
                                s0 = scale_at(w.s, w.e8m0, so[mt][0] + bi);
                                s1 = scale_at(w.s, w.e8m0, so[mt][1] + bi);
                            }
#pragma unroll
                            for (int j = 0; j < NT; j++)
                                tc_step<F>(acc[mt][j], a, b01[j], b23[j], s0, s1);
                        }
                    }
                }
            }
        if (part) {
            const M pm = m.with_y(part + sub * slab, pld);
            if (live)
#pragma unroll
                for (int mt = 0; mt < MR; mt++)
#pragma unroll
                    for (int j = 0; j < NT; j++)
#pragma unroll
                        for (int qd = 0; qd < 4; qd++) {
                            int tk = t0 + 8 * j + 2 * t + (qd & 1), i = i0 + 16 * mt + g + (qd >> 1) * 8;
                            if (tk < T && i < nr)
                                pm.yr(tk)[i] = acc[mt][j][qd];
                        }
            continue;
        }
        if (S > 1) {
            __syncthreads();
            if (sub)
#pragma unroll
                for (int mt = 0; mt < MR; mt++)
#pragma unroll
                    for (int j = 0; j < NT; j++)
#pragma unroll
                        for (int qd = 0; qd < 4; qd++)
                            red[wid][(mt * NT + j) * 4 + qd][lane] = acc[mt][j][qd];
            __syncthreads();
            if (!sub)
                for (int o = 1; o < S; o++)
#pragma unroll
                    for (int mt = 0; mt < MR; mt++)
#pragma unroll
                        for (int j = 0; j < NT; j++)
#pragma unroll
                            for (int qd = 0; qd < 4; qd++)
                                acc[mt][j][qd] += red[wid + o][(mt * NT + j) * 4 + qd][lane];
        }
        if (live && !sub)
#pragma unroll
            for (int mt = 0; mt < MR; mt++)
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int qd = 0; qd < 4; qd++) {
                        int tk = t0 + 8 * j + 2 * t + (qd & 1), i = i0 + 16 * mt + g + (qd >> 1) * 8;
                        if (tk < T && i < nr)
                            m.yr(tk)[i] = acc[mt][j][qd];
                    }
    }
}

/* The tile path, for many tokens: the same sums (see above) over TC_TN tokens a pass. Block of
 * TC_TW warps, warp wid owning row group blk * TC_TW + wid; the block splits each 64-element
 * k-tile (4 / G runs) of its tokens' x into the three bf16 terms once, into shared memory in
 * fragment order (xs[term][n-tile][step][lane]: one 8-byte read a fragment). All slices, or split
 * (part != NULL) slice `only` alone, to m.with_y(part + only slab, pld). */
template <int F, class M>
__device__ __forceinline__ void tc_rows_tile(const wdev &w, int64_t r0, int nr, const M &m, int T, int blk, float *part,
                                             int64_t pld, int64_t slab, int only)
{
    typedef typename tcf<F>::CT CT;
    enum { G = tcf<F>::G, NT = TC_TN / 8, KS = 4, RT = KS / G };
    const bool scaled = F != DSV4_WF_BF16;
    __shared__ uint2 xs[3][NT][KS][32];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int S = w.tcs, i0 = (blk * TC_TW + wid) * 16;
    if (part && only >= S)
        return;
    const bool live = i0 < nr;
    const int k = (int)w.k, nrun = (k + 16 * G - 1) / (16 * G);
    const int64_t ra = r0 + (i0 + g < nr ? i0 + g : 0), rb = r0 + (i0 + g + 8 < nr ? i0 + g + 8 : 0);
    const uint8_t *pa = tc_row<F>(w, ra), *pb = tc_row<F>(w, rb);
    const int64_t sa = scaled ? tc_srow<F>(w, ra) : 0, sb = scaled ? tc_srow<F>(w, rb) : 0;
    /* the x values this thread stages: token ft of the pass, step fs of each k-tile */
    const int ft = threadIdx.x >> 2, fs = threadIdx.x & 3;
    const int c_beg = part ? tc_slice(nrun, S, only) : 0, c_end = part ? tc_slice(nrun, S, only + 1) : nrun;
    for (int t0 = 0; t0 < T; t0 += TC_TN) {
        const float *fx = t0 + ft < T ? m.xr(t0 + ft) : NULL;
        float tot[NT][4], acc[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int q = 0; q < 4; q++)
                tot[j][q] = acc[j][q] = 0.0f;
        int slice = part ? only : 0, next = part ? c_end : tc_slice(nrun, S, 1);
        /* k-tiles are aligned to RT runs from 0, so a slice may start inside one */
        for (int c0 = c_beg / RT * RT; c0 < c_end; c0 += RT) {
            CT qa[RT], qb[RT];
#pragma unroll
            for (int v = 0; v < RT; v++) {
                int kk = (c0 + v) * 16 * G + 4 * G * t;
                if (live && kk < k) {
                    qa[v] = tc_load<F>(pa, kk);
                    qb[v] = tc_load<F>(pb, kk);
                }
            }
            __syncthreads();
#pragma unroll
            for (int q = 0; q < 4; q++) {
                int kk = (c0 + fs / G) * 16 * G + 4 * G * q + 4 * (fs % G);
                float4 xv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (fx && kk < k)
                    xv = __ldg((const float4 *)(fx + kk));
                uint32_t b01[3], b23[3];
                split3(xv.x, xv.y, b01);
                split3(xv.z, xv.w, b23);
#pragma unroll
                for (int e = 0; e < 3; e++)
                    xs[e][ft >> 3][fs][(ft & 7) * 4 + q] = make_uint2(b01[e], b23[e]);
            }
            __syncthreads();
            if (!live)
                continue;
#pragma unroll
            for (int v = 0; v < RT; v++) {
                int c = c0 + v, kk = c * 16 * G + 4 * G * t;
                if (c >= c_end)
                    break;
                if (c < c_beg)
                    continue;
                if (c == next) { /* slice `slice` ends: fold it into the total */
#pragma unroll
                    for (int j = 0; j < NT; j++)
#pragma unroll
                        for (int q = 0; q < 4; q++) {
                            tot[j][q] = slice ? tot[j][q] + acc[j][q] : acc[j][q];
                            acc[j][q] = 0.0f;
                        }
                    slice++;
                    next = tc_slice(nrun, S, slice + 1);
                }
                float s0 = 1.0f, s1 = 1.0f;
                if (scaled) {
                    int bi = tc_sblock<F>(w, c);
                    s0 = scale_at(w.s, w.e8m0, sa + bi);
                    s1 = scale_at(w.s, w.e8m0, sb + bi);
                }
#pragma unroll
                for (int u = 0; u < G; u++) {
                    uint32_t a[4] = {0u, 0u, 0u, 0u};
                    if (kk < k) {
                        tc_decode<F>(qa[v], u, a[0], a[2]);
                        tc_decode<F>(qb[v], u, a[1], a[3]);
                    }
#pragma unroll
                    for (int j = 0; j < NT; j++) {
                        uint32_t b01[3], b23[3];
#pragma unroll
                        for (int e = 0; e < 3; e++) {
                            uint2 xv = xs[e][j][v * G + u][lane];
                            b01[e] = xv.x;
                            b23[e] = xv.y;
                        }
                        tc_step<F>(acc[j], a, b01, b23, s0, s1);
                    }
                }
            }
        }
        const M om = part ? m.with_y(part + only * slab, pld) : m;
        if (live)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    float v = !part && slice ? tot[j][q] + acc[j][q] : acc[j][q];
                    int tk = t0 + 8 * j + 2 * t + (q & 1), i = i0 + g + (q >> 1) * 8;
                    if (tk < T && i < nr)
                        om.yr(tk)[i] = v;
                }
    }
}

/* Either path: NT n-tiles a pass on the register path, NT = 0 for the tile path (split: slice
 * `only`; a block past the weight's slices does nothing); a kernel that runs it takes its block
 * size and bounds from TC_BOUNDS(NT). */
template <int F, int NT, class M>
__device__ __forceinline__ void tc_any(const wdev &w, int64_t r0, int nr, const M &m, int T, int blk, float *part,
                                       int64_t pld, int64_t slab, int only)
{
    if constexpr (NT == 0)
        tc_rows_tile<F>(w, r0, nr, m, T, blk, part, pld, slab, only);
    else
        tc_rows<F, NT>(w, r0, nr, m, T, blk, part, pld, slab);
}

#define TC_BOUNDS(NT) __launch_bounds__((NT) ? TC_RW * 32 : TC_TW * 32, (NT) ? 4 : 2)

/* Host side (linear.cu): whether a weight takes the tensor-core path (from its form, shape and
 * scale blocks alone, so every call over it sums the same way); the n-tiles of a register-path
 * pass for T tokens, 0 for the tile path; the rows one block of either path covers. */
bool tc_ok(const dsv4_weight *w);
int tc_nt(int T);
/* Blocks a launch of nr rows (of T tokens, TB a block) takes on either path; whether it splits
 * (the register path must when tcs > TC_RW; the tile path does when its blocks would be few). */
int tc_blocks(const wdev &w, int nt, int64_t nr);
bool tc_split(const wdev &w, int nt, int64_t blocks);
/* A device buffer of n floats for slice partials (grows, never freed: recordings may read it). */
float *tc_part_buf(size_t n);
/* y[r, i] = part[0][r, i] + part[1][r, i] + ... + part[S-1][r, i] (left to right), r < rows,
 * i < nr: slab s at part + s slab, row stride pld; y row stride ldy. */
void tc_fold(const float *part, int S, int64_t rows, int nr, int64_t pld, int64_t slab, float *y, int64_t ldy,
             cudaStream_t st);

} // namespace dsv4cu

#endif
