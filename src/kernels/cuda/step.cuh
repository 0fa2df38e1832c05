/* kernels/cuda — what attn_step's kernels share: the rows of a step as the kernels read them
 * from device memory, and a row's attention geometry (which keys it attends, in what order).
 * C++ only; included by the files of attn_step's kernels. */
#ifndef DSV4_CUDA_STEP_CUH
#define DSV4_CUDA_STEP_CUH

#include "kernels/cuda/internal.h"
#include "kernels/cuda/kvrow.cuh"

namespace dsv4cu {

/* The step's rows (device pointers; dsv4_rows of backend.h) and each sequence's buffers. */
struct rows_dev {
    const int64_t *pos;
    const int32_t *seq;
    const int64_t *start;
    const int32_t *first;
    const dsv4_lbufs *st;
    int R, S;
};

/* Row r's keys: the kept entries (sel[r] when the indexer chose, else entries 0..ns-1), then
 * the window positions j0..p (the step's kv row when the step holds it, else the kv ring).
 * ok is false when the row cannot be attended within the caller's bounds (its position beyond
 * vis_cap, more than nkmax keys, or no position): its output is NaN. prod: the entries and the
 * ring are production caches (pent, pkv), and the step's kv rows given are their round trips. */
struct attn_row {
    dsv4_lbufs b;
    int64_t p, start, first, j0;
    int nk, ns, prod;
    bool use_sel, ok;
    const int *rs;

    __device__ __forceinline__ attn_row(const rows_dev &rd, int r, int ratio, int csa, int topk, int64_t vis_cap,
                                        int window, int nkmax, const int *sel, int prod_)
    {
        prod = prod_;
        p = rd.pos[r];
        int s = rd.seq[r];
        b = rd.st[s];
        start = rd.start[s];
        first = rd.first[s];
        int64_t nvis = ratio ? (p + 1) / ratio : 0;
        use_sel = csa && nvis > topk;
        int64_t nsel = use_sel ? topk : nvis;
        j0 = p - window + 1 < 0 ? 0 : p - window + 1;
        int64_t nk64 = nsel + (p - j0 + 1);
        ok = !(nvis > vis_cap || nk64 > nkmax || p < 0);
        nk = ok ? (int)nk64 : 0;
        ns = ok ? (int)nsel : 0;
        rs = sel ? sel + (int64_t)r * topk : NULL;
    }
    /* Key i's row of d values (i < nk). */
    __device__ __forceinline__ crow key(int i, int d, int kv_cap, const float *kv) const
    {
        if (i < ns)
            return cache_row(prod ? (const void *)b.pent : b.ent, use_sel ? (int64_t)rs[i] : (int64_t)i, d, prod,
                             DSV4_KV_MAIN);
        int64_t tok = j0 + (i - ns);
        if (tok >= start)
            return crow{kv + (first + (tok - start)) * d, -1, d};
        return cache_row(prod ? (const void *)b.pkv : b.kv, tok % kv_cap, d, prod, DSV4_KV_WINDOW);
    }
};

/* Channel ch of entry w of a compressor (ratio mr, width dim, overlap 0/1, ape or NULL) pooled
 * as dsv4_pool_group defines it: the softmax over the group's slots of z (+ ape) weighting c,
 * slots in the CPU's order (window w-1's first half, then window w's second half with overlap;
 * window w's only without). row(tok, c, z) points c and z at token tok's compressor inputs
 * ((1 + overlap) dim floats each: the step's row or the ring's). */
template <class Row>
__device__ __forceinline__ float pool_channel(int mr, int dim, int overlap, const float *ape, int64_t w, int ch, Row row)
{
    int cw = (1 + overlap) * dim, off = overlap ? dim : 0;
    bool prev = overlap && w > 0;
    int nslot = prev ? 2 * mr : mr;
    /* slot i's logit, and its value c[col] */
    auto slot = [&](int i, float &v) -> float {
        bool lo = prev && i < mr;
        int j = prev && i >= mr ? i - mr : i;
        int col = lo ? ch : off + ch;
        const float *c, *z;
        row((lo ? w - 1 : w) * mr + j, c, z);
        v = c[col];
        return z[col] + (ape ? ape[(int64_t)j * cw + col] : 0.0f);
    };
    float mx = -INFINITY, v;
    for (int i = 0; i < nslot; i++)
        mx = fmaxf(mx, slot(i, v));
    float den = 0.0f, acc = 0.0f;
    for (int i = 0; i < nslot; i++) {
        float e = expf(slot(i, v) - mx);
        den += e;
        acc += e * v;
    }
    return acc / den;
}

/* The interleaved rope of the last rd of n values in shared memory at position p (the rope
 * op's angle: (float)p * inv_freq[i]) by a block of NB threads, then every value to dst. */
__device__ __forceinline__ void rope_store(float *v, int n, int rd, const float *inv_freq, int64_t p, float *dst)
{
    __syncthreads();
    float fp = (float)p, *x = v + (n - rd);
    for (int i = threadIdx.x; i < rd / 2; i += NB) {
        float ang = fp * inv_freq[i];
        float c = cosf(ang), sn = sinf(ang);
        float a0 = x[2 * i], b0 = x[2 * i + 1];
        x[2 * i] = a0 * c - b0 * sn;
        x[2 * i + 1] = a0 * sn + b0 * c;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += NB)
        dst[i] = v[i];
}

/* A float's order as an unsigned key (higher score, higher key); -0 is +0, as the CPU's
 * comparisons see them. */
__device__ __forceinline__ unsigned okey(float f)
{
    if (f == 0.0f)
        f = 0.0f;
    unsigned u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

enum { TK_NT = 1024, TK_NW = TK_NT / 32 };

/* By a block of TK_NT threads, every one calling: the `want` best of sc[0..n) (0 < want < n),
 * ties to the lower index, into out[0..want) in ascending index order. Four 8-bit radix passes
 * find the key T of the want-th best and how many entries equal to T are taken (need: the lowest-indexed
 * ones); then one ordered pass keeps every key > T and the first `need` keys == T, each at its
 * place given by a block scan of (greater, equal) counts. Atomic counts are exact, so the
 * result is deterministic. */
template <class Out>
__device__ void topk_block(const float *sc, int n, int want, Out *out)
{
    __shared__ unsigned hist[256];
    __shared__ unsigned s_prefix, s_need;
    __shared__ unsigned long long wsum[TK_NW];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    unsigned prefix = 0, mask = 0, need = (unsigned)want;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += TK_NT)
            hist[i] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += TK_NT) {
            unsigned k = okey(sc[i]);
            if ((k & mask) == prefix)
                atomicAdd(&hist[(k >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned cum = 0;
            int bin = 255;
            for (; bin > 0; bin--) {
                if (cum + hist[bin] >= need)
                    break;
                cum += hist[bin];
            }
            s_prefix = prefix | ((unsigned)bin << shift);
            s_need = need - cum;
        }
        __syncthreads();
        prefix = s_prefix;
        need = s_need;
        mask |= 255u << shift;
        __syncthreads(); /* everyone has read s_prefix before thread 0 writes it again */
    }
    const unsigned T = prefix;
    unsigned long long carry = 0; /* (greater << 32) | equal, over the chunks before */
    for (int c0 = 0; c0 < n; c0 += TK_NT) {
        int i = c0 + threadIdx.x;
        unsigned k = i < n ? okey(sc[i]) : 0u;
        int gt = i < n && k > T, eq = i < n && k == T;
        unsigned long long v = ((unsigned long long)gt << 32) | (unsigned)eq, x = v;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            unsigned long long y = __shfl_up_sync(0xffffffffu, x, o);
            if (lane >= o)
                x += y;
        }
        if (lane == 31)
            wsum[wid] = x;
        __syncthreads();
        if (wid == 0) {
            unsigned long long t = wsum[lane];
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                unsigned long long y = __shfl_up_sync(0xffffffffu, t, o);
                if (lane >= o)
                    t += y;
            }
            wsum[lane] = t;
        }
        __syncthreads();
        unsigned long long excl = carry + (wid ? wsum[wid - 1] : 0ull) + x - v;
        unsigned gtb = (unsigned)(excl >> 32), eqb = (unsigned)(excl & 0xffffffffu);
        if (gt || (eq && eqb < need))
            out[gtb + (eqb < need ? eqb : need)] = i;
        carry += wsum[TK_NW - 1];
        __syncthreads(); /* wsum is rewritten by the next chunk */
    }
}

/* V4.1's rows (attn_step41): row r's keys are est's entries sel[r][0..nsel[r]) (none at ratio
 * 0), then the window positions j0..p (the step's kv row when the step holds it, else this
 * layer's ring, rd.st). A geometry gives a row's Row: ok (false when the selection is missing
 * or the row needs more than nkmax keys: its output is NaN), nk and key(i); packed: its keys'
 * formats are read at run time (prod). */
struct geo41 {
    static constexpr int packed = 1;
    rows_dev rd;
    const dsv4_lbufs *est;
    int ratio, topk, kv_cap, window, nkmax;
    const float *kv;
    const int64_t *sel;
    const int *nsel;
    int prod;                   /* production caches: pent, pkv; kv holds the step's round trips */
    struct Row {
        const void *ring, *ent;
        const float *kv;
        const int64_t *rs;
        int64_t start, first, j0;
        int d, kv_cap, ns, nk, prod;
        bool ok;
        __device__ __forceinline__ Row(const geo41 &g, int r, int d_) : kv(g.kv), d(d_), kv_cap(g.kv_cap), prod(g.prod)
        {
            int64_t p = g.rd.pos[r];
            int s = g.rd.seq[r];
            ring = prod ? (const void *)g.rd.st[s].pkv : g.rd.st[s].kv;
            ent = !g.ratio ? NULL : prod ? (const void *)g.est[s].pent : g.est[s].ent;
            start = g.rd.start[s];
            first = g.rd.first[s];
            ns = g.ratio ? g.nsel[r] : 0;
            j0 = p - g.window + 1 < 0 ? 0 : p - g.window + 1;
            int64_t n64 = ns + (p - j0 + 1);
            ok = ns >= 0 && ns <= g.topk && n64 <= g.nkmax && p >= 0;
            nk = ok ? (int)n64 : 0;
            rs = g.ratio ? g.sel + (int64_t)r * g.topk : NULL;
        }
        /* Key i's format (crow::fmt), as key(i) has it. */
        __device__ __forceinline__ int kfmt(int i) const
        {
            if (!prod)
                return -1;
            return i < ns ? DSV4_KV_MAIN : j0 + (i - ns) >= start ? -1 : DSV4_KV_WINDOW;
        }
        __device__ __forceinline__ crow key(int i) const
        {
            if (i < ns)
                return cache_row(ent, rs[i], d, prod, DSV4_KV_MAIN);
            int64_t tok = j0 + (i - ns);
            if (tok >= start)
                return crow{kv + (first + (tok - start)) * d, -1, d};
            return cache_row(ring, tok % kv_cap, d, prod, DSV4_KV_WINDOW);
        }
    };
};

/* attn_step's attention on tensor cores (attn_tc.cu): whether a head width suits it; the floats
 * of partials the per-chunk form wants for R rows (0: that form is not used); the launch, per
 * chunk when part holds part_n >= attn_tc_part floats, else a block a row and head group.
 * False when a launch failed (the failure is recorded). */
bool attn_tc_fits(int H, int d);
size_t attn_tc_part(int R, int H, int d, int64_t nkmax);
bool attn_tc_launch(const rows_dev &rd, int ratio, int csa, int topk, int64_t vis_cap, int kv_cap, int H, int d,
                    int window, int64_t nkmax, float scale, const float *sink, const float *q, const float *kv,
                    const int *sel, int prod, float *o, float *part, size_t part_n);
/* REF's attention for V4.1's rows (attn41_f64.cu, backend.h attn_step41 step 4): every sum in
 * double, o rounded to float once. nkbound: the most keys any row of the model can have (topk +
 * window), which with H and d alone picks the kernel, so a row's bits never depend on the step.
 * False when a launch failed (recorded). */
bool attn41_f64_launch(const geo41 &g, int H, int d, int64_t nkbound, float scale, const float *sink, const float *q,
                       float *o);
/* The same for V4.1's rows (step41.cu). */
bool attn41_tc_launch(const geo41 &g, int H, int d, float scale, const float *sink, const float *q, float *o,
                      float *part, size_t part_n);

/* The indexer's scores on the tensor cores (index_tc.cu): whether k_iscore_tc takes a step of
 * these shapes (the tensor-core mode has the indexer, ci % 16 == 0, its shared memory within
 * the device's limit: shapes and the device alone, so every step of a process scores one way), and its
 * launch on the op stream for the rows and entries k_iscore writes (iscore_launch's arguments).
 * false: the launch failed (recorded). */
bool iscore_tc_fits(int nI, int ci, int64_t vis_cap);
bool iscore_tc(const rows_dev &rd, int r0, int nr, int ratio, int topk, int64_t vis_cap, int nI, int ci, float iw_scale,
               float post, const float *qi, const float *wt, float *scores, int prod);

/* The indexer's scores of rows r0 .. r0 + nr - 1 that keep fewer than all their entries (nvis >
 * topk): scores[(r - r0) * vis_cap + w] = sum_h (wt[r,h] iw_scale) relu(qi[r,h] . ikey[w]) *
 * post, the keys those of rd.st's buffers (prod: the packed pikey); on the tensor cores when
 * iscore_tc_fits, else k_iscore (step.cu). ref (V4.1 REF): each dot, each term and the sum
 * through bf16, always by k_iscore. false: the launch failed (recorded). */
bool iscore_launch(const rows_dev &rd, int r0, int nr, int ratio, int topk, int64_t vis_cap, int nI, int ci,
                   float iw_scale, float post, const float *qi, const float *wt, float *scores, int ref, int prod);

/* The scores take at most this many floats of scratch: a step scores its rows in passes of
 * score_rows(R, vis_cap) rows (at least one), so no buffer grows as [rows, context]. */
enum { SCORE_FLOATS = 1 << 26 };
int score_rows(int R, int64_t vis_cap);

/* The rings take the step's rows (step.cu): thread per (row, column) of stream y (0 kv, 1 c,
 * 2 z, 3 ic, 4 iz; c and z only with ratio, ic and iz only with csa), the last cap rows of each
 * sequence at slot p % cap. */
__global__ void k_ring(rows_dev rd_, int ratio, int csa, int d, int cw, int iw, int kv_cap, int c_cap, const float *kv,
                       const float *cc, const float *zz, const float *ic, const float *iz, int prod);
/* Production caches (step.cu): k_ring_pack, thread per (row, window block), packs the kept rows
 * of kv [R, d] into the pkv ring (k_ring skips kv with prod); k_window_rt, thread per (row,
 * window block), writes kvq [R, d] = kv through the window row's format and back. */
__global__ void k_ring_pack(rows_dev rd, int d, int kv_cap, const float *kv);
__global__ void k_window_rt(int R, int d, const float *kv, float *kvq);

} // namespace dsv4cu

#endif
