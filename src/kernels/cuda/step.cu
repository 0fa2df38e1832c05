/* CUDA backend, the step-level ops: V4 attention's stateful part (attn_step) and the MoE
 * routing (route), over device buffers. Everything a kernel reads that changes from step to
 * step (positions, sequences, the per-sequence buffer table, the rings) is read from device
 * memory and grid sizes depend only on the shapes (R, S, vis_cap, topk, H, E), so a recorded
 * step replays correctly when only the buffers' contents change.
 *
 * attn_step runs five kernels in stream order:
 *   k_emit   the entries the step completes: pooled, RMS-normed, roped (reads the rings);
 *   k_iscore the indexer scores of every visible entry, rows that keep fewer than all (CSA);
 *            k_iscore_tc (index_tc.cu) instead with the tensor cores on and ci % 16 == 0;
 *   k_itopk  the topk best per row (radix select on order-preserving keys, ties to the
 *            lower index, compacted in ascending entry order by a block scan);
 *   k_attn   attention per (row, head) over the kept entries then the window;
 *   k_ring   the rings take the step's rows (writes the rings, so it runs last).
 * Each row's result is computed by one block in one fixed order: batch invariant.
 *
 * Production caches (kv_prod): k_emit packs the entries and keys it completes, k_ring_pack packs
 * the window ring's rows, every read of them decodes (kvrow.cuh), and the attention reads the
 * step's own window rows through the same round trip (k_window_rt), so a row sees what the
 * stored rows hold whichever step wrote them. The indexer scores its rows in passes of
 * score_rows rows: its scratch stays bounded however long the context. k_emit, k_iscore and
 * k_attn are built once per kind of cache (PROD), so with exact caches their reads carry no
 * format test (a per-value test serializes a row's loads). */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "kernels/cuda/step.cuh"
#include "kernels/cuda/rounding.cuh"

using namespace dsv4cu;

namespace {

struct pool_dev {
    int ratio, dim, overlap;
    const float *ape, *norm;
};

/* ---- 1. entries the step completes --------------------------------------------------- */

/* Block (row r, compressor y: 0 the attention's, 1 the indexer's). Entry w = p / m when the
 * row completes it ((p + 1) % m == 0). Per channel (a thread each): the softmax over the
 * group's slots of z (+ ape) weighting c, slots in the CPU's order (window w-1's first half,
 * then window w's second half with overlap; window w's only without); then the block's RMS
 * norm, then the interleaved rope of the last rd channels at position w m. */
template <int PROD>
__global__ void __launch_bounds__(NB) k_emit(rows_dev rd_, pool_dev pc, pool_dev pi, int c_cap, int rd,
                                             const float *inv_freq, float eps, const float *cc, const float *zz,
                                             const float *ic, const float *iz)
{
    PDL_WAIT();
    extern __shared__ float ev[]; /* [dim] */
    __shared__ float red[NW + 1];
    int r = blockIdx.x, which = blockIdx.y;
    pool_dev cp = which ? pi : pc;
    int64_t p = rd_.pos[r];
    int mr = cp.ratio;
    if ((p + 1) % mr)
        return;
    int s = rd_.seq[r];
    int64_t w = p / mr;
    dsv4_lbufs b = rd_.st[s];
    const float *cs = which ? ic : cc, *zs = which ? iz : zz;
    const float *cr = which ? b.ic : b.c, *zr = which ? b.iz : b.z;
    int dim = cp.dim, cw = (1 + cp.overlap) * dim;
    int64_t start = rd_.start[s], first = rd_.first[s];
    auto row = [&](int64_t tok, const float *&c, const float *&z) {
        int64_t ro = tok >= start ? (first + (tok - start)) * cw : (tok % c_cap) * cw;
        c = (tok >= start ? cs : cr) + ro;
        z = (tok >= start ? zs : zr) + ro;
    };
    for (int ch = threadIdx.x; ch < dim; ch += NB)
        ev[ch] = pool_channel(mr, dim, cp.overlap, cp.ape, w, ch, row);
    rms_block(ev, dim, cp.norm, eps, red, ev);
    if (!PROD) {
        rope_store(ev, dim, rd, inv_freq, w * mr, (which ? b.ikey : b.ent) + w * dim);
        return;
    }
    int fmt = which ? DSV4_KV_INDEX : DSV4_KV_MAIN;
    rope_store(ev, dim, rd, inv_freq, w * mr, ev);
    __syncthreads();
    pack_row_block(fmt, ev, dim, (which ? b.pikey : b.pent) + w * dsv4_kv_row_bytes(fmt, dim));
}

/* ---- 2. indexer scores and top-k ------------------------------------------------------- */

enum { SC_EPB = 64,             /* entries a scoring block takes (a warp per entry at a time) */
       SC_C = 8 };              /* key values a lane holds (index widths up to 256) */

/* Block (row r = r0 + x, entries [y SC_EPB, (y + 1) SC_EPB)), rows with nvis > topk only:
 * score[w] = sum_h (wt[r,h] iw_scale) relu(qi[r,h] . ikey[w]) * post, heads in order, each dot
 * by the warp's lanes (stride 32) and its xor tree, into scores[x * vis_cap + w]. */
template <int PROD>
__global__ void __launch_bounds__(NB) k_iscore(rows_dev rd_, int r0, int ratio, int topk, int64_t vis_cap, int nI,
                                               int ci, float iw_scale, float post, const float *qi, const float *wt,
                                               float *scores, int ref)
{
    PDL_WAIT();
    int r = r0 + (int)blockIdx.x, lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    int64_t nvis = (rd_.pos[r] + 1) / ratio;
    int64_t w0 = (int64_t)blockIdx.y * SC_EPB;
    if (nvis <= topk || nvis > vis_cap || w0 >= nvis)
        return;
    const dsv4_lbufs &b = rd_.st[rd_.seq[r]];
    const void *ikey = PROD ? (const void *)b.pikey : b.ikey;
    const float *q = qi + (int64_t)r * nI * ci, *wr = wt + (int64_t)r * nI;
    int64_t w1 = w0 + SC_EPB < nvis ? w0 + SC_EPB : nvis;
    for (int64_t w = w0 + wid; w < w1; w += NW) {
        const crow k = cache_row(ikey, w, ci, PROD, DSV4_KV_INDEX);
        /* the lane's key values, read (and decoded) once for every head */
        bool held = ci <= 32 * SC_C;
        float kr[SC_C];
        if (held)
            k.lanes(lane, kr);
        float s = 0.0f;
        for (int h = 0; h < nI; h++) {
            const float *qh = q + (int64_t)h * ci;
            float a = 0.0f;
            if (held) {
#pragma unroll
                for (int c = 0; c < SC_C; c++)
                    if (lane + 32 * c < ci)
                        a = fmaf(qh[lane + 32 * c], kr[c], a);
            } else
                for (int j = lane; j < ci; j += 32)
                    a = fmaf(qh[j], k[j], a);
            a = warp_sum(a);
            if (ref) { /* V4.1 REF: the bf16 einsum's rounding of each dot and term, then of the sum */
                a = rt_bf16(a);
                s += rt_bf16(wr[h] * iw_scale * (a > 0.0f ? a : 0.0f));
            } else
                s += wr[h] * iw_scale * (a > 0.0f ? a : 0.0f);
        }
        if (lane == 0)
            scores[(int64_t)blockIdx.x * vis_cap + w] = (ref ? rt_bf16(s) : s) * post;
    }
}

/* Block per row r = r0 + x with nvis > topk: the topk best of its scores (scores[x * vis_cap ..])
 * into sel[r] (topk_block). */
__global__ void __launch_bounds__(TK_NT) k_itopk(rows_dev rd_, int r0, int ratio, int topk, int64_t vis_cap,
                                                 const float *scores, int *sel)
{
    PDL_WAIT();
    int r = r0 + (int)blockIdx.x;
    int64_t nvis = (rd_.pos[r] + 1) / ratio;
    if (nvis <= topk || nvis > vis_cap)
        return;
    topk_block(scores + (int64_t)blockIdx.x * vis_cap, (int)nvis, topk, sel + (int64_t)r * topk);
}

/* ---- 3. attention over the kept entries and the window --------------------------------- */

/* Warps of a k_attn block: one block per (row, head) leaves most of the device idle at batch
 * 1 (64 heads), so each block brings 16 warps to hide its key loads' latency. */
enum { ATT_NW = 16 };

/* Block (row r, head h), as k_attend (attend_head: scores by warp, the softmax with the sink,
 * the weighted sum by warp, partial rows added in warp order). Keys: the kept entries (sel when the
 * indexer chose, else 0..nvis-1), then window positions j0..p (the step's kv row when the
 * step holds it, else the kv ring). p: [nkmax] floats of dynamic shared memory; a row that
 * needs more (its position beyond the caller's vis_cap) gets NaN. */
template <int PROD>
__global__ void __launch_bounds__(ATT_NW * 32) k_attn(rows_dev rd_, int ratio, int csa, int topk, int64_t vis_cap, int kv_cap,
                                             int H, int d, int window, int nkmax, float scale, const float *sink,
                                             const float *q, const float *kv, const int *sel, float *o)
{
    PDL_WAIT();
    extern __shared__ float pr[];
    __shared__ float sh[ATT_NW + 1], part[ATT_NW * ATT_MAXD];
    int r = blockIdx.x, h = blockIdx.y;
    attn_row ar(rd_, r, ratio, csa, topk, vis_cap, window, nkmax, sel, PROD);
    float *orow = o + ((int64_t)r * H + h) * d;
    if (!ar.ok) {
        for (int j = threadIdx.x; j < d; j += ATT_NW * 32)
            orow[j] = __int_as_float(0x7fc00000);
        return;
    }
    auto key = [&](int i) -> crow { return ar.key(i, d, kv_cap, kv); };
    attend_head<ATT_NW>(q + ((int64_t)r * H + h) * d, key, ar.nk, d, scale, sink[h], pr, sh, part, orow);
}

/* ---- routing ---------------------------------------------------------------------------- */

/* A warp per row: s_e = sqrt(softplus(lg)) into shared memory, then the K experts (hash:
 * tid2eid; else K rounds of the best unused s + bias, ties to the lower expert: each lane's
 * first maximum over its experts in order, then an xor tree that prefers the higher value,
 * then the lower index), then the weights by lane 0 in the CPU's order. */
__global__ void __launch_bounds__(NB) k_route(const float *lg, int R, int E, int K, const float *bias,
                                              const int32_t *tid2eid, const int32_t *ids, int norm, float route_scale,
                                              int32_t *eid, float *wts)
{
    PDL_WAIT();
    extern __shared__ float rsm[];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    int r = blockIdx.x * NW + wid;
    if (r >= R)
        return; /* whole warps; no block barrier below */
    float *sc = rsm + (size_t)wid * E;
    unsigned char *used = (unsigned char *)(rsm + (size_t)NW * E) + (size_t)wid * E;
    for (int e = lane; e < E; e += 32) {
        float x = lg[(int64_t)r * E + e];
        sc[e] = sqrtf(x > 20.0f ? x : log1pf(expf(x)));
        used[e] = 0;
    }
    __syncwarp();
    int32_t *ch = eid + (int64_t)r * K;
    if (tid2eid) {
        for (int k = lane; k < K; k += 32)
            ch[k] = tid2eid[(int64_t)ids[r] * K + k];
    } else {
        for (int k = 0; k < K; k++) {
            int best = -1;
            float bv = 0.0f;
            for (int e = lane; e < E; e += 32) {
                float v = sc[e] + (bias ? bias[e] : 0.0f);
                if (!used[e] && (best < 0 || v > bv)) {
                    best = e;
                    bv = v;
                }
            }
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                float ov = __shfl_xor_sync(0xffffffffu, bv, off);
                int ob = __shfl_xor_sync(0xffffffffu, best, off);
                if (ob >= 0 && (best < 0 || ov > bv || (ov == bv && ob < best))) {
                    bv = ov;
                    best = ob;
                }
            }
            if (lane == 0) {
                ch[k] = best;
                if (best >= 0)
                    used[best] = 1;
            }
            __syncwarp();
        }
    }
    __syncwarp();
    if (lane == 0) {
        float sum = 0.0f;
        for (int k = 0; k < K; k++) {
            int e = ch[k];
            sum += e >= 0 && e < E ? sc[e] : __int_as_float(0x7fc00000);
        }
        for (int k = 0; k < K; k++) {
            int e = ch[k];
            float w = e >= 0 && e < E ? sc[e] : __int_as_float(0x7fc00000);
            if (norm)
                w = w / (sum + 1e-20f);
            wts[(int64_t)r * K + k] = w * route_scale;
        }
    }
}

int g_smem_optin;               /* the device's largest dynamic shared memory a block may opt into */
int g_attn_smem_set;            /* what k_attn was allowed so far */

} // namespace

/* ---- 4. ring stores -------------------------------------------------------------------- */

/* Whether row r at position p is among its sequence's last cap rows of the step (the rows a
 * ring of cap slots keeps, so no two rows of a step share a slot). */
__device__ __forceinline__ bool ring_keeps(const rows_dev &rd, int r, int64_t p, int cap)
{
    int s = rd.seq[r];
    int64_t end = rd.start[s] + ((s + 1 < rd.S ? rd.first[s + 1] : rd.R) - rd.first[s]);
    return p + cap >= end;
}

/* Thread per (row, column) of stream y (0 kv, 1 c, 2 z, 3 ic, 4 iz): a row at position p of
 * sequence s goes to slot p % cap when p + cap >= the sequence's end in this step (its last
 * cap rows only, so no two rows share a slot). prod: the kv ring is packed (k_ring_pack). */
__global__ void dsv4cu::k_ring(rows_dev rd_, int ratio, int csa, int d, int cw, int iw, int kv_cap, int c_cap, const float *kv,
                       const float *cc, const float *zz, const float *ic, const float *iz, int prod)
{
    PDL_WAIT();
    int kind = blockIdx.y;
    if ((kind > 0 && !ratio) || (kind > 2 && !csa) || (kind == 0 && prod))
        return;
    int width = kind == 0 ? d : kind < 3 ? cw : iw, cap = kind ? c_cap : kv_cap;
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)rd_.R * width)
        return;
    int r = (int)(idx / width), c = (int)(idx % width);
    int s = rd_.seq[r];
    int64_t p = rd_.pos[r];
    if (!ring_keeps(rd_, r, p, cap))
        return;
    const float *src = kind == 0 ? kv : kind == 1 ? cc : kind == 2 ? zz : kind == 3 ? ic : iz;
    dsv4_lbufs b = rd_.st[s];
    float *ring = kind == 0 ? b.kv : kind == 1 ? b.c : kind == 2 ? b.z : kind == 3 ? b.ic : b.iz;
    ring[(p % cap) * width + c] = src[(int64_t)r * width + c];
}

/* Thread per (row, block of DSV4_KV_WINDOW) of kv [R, d]: the production kv ring takes the row
 * packed, as k_ring places fp32 rows. */
__global__ void dsv4cu::k_ring_pack(rows_dev rd, int d, int kv_cap, const float *kv)
{
    PDL_WAIT();
    int B = dsv4_kv_block(DSV4_KV_WINDOW), nb = (d + B - 1) / B;
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)rd.R * nb)
        return;
    int r = (int)(idx / nb), j = (int)(idx % nb);
    int64_t p = rd.pos[r];
    if (!ring_keeps(rd, r, p, kv_cap))
        return;
    uint8_t *row = rd.st[rd.seq[r]].pkv + (p % kv_cap) * dsv4_kv_row_bytes(DSV4_KV_WINDOW, d);
    dsv4_kv_pack_block(DSV4_KV_WINDOW, kv + (int64_t)r * d + j * B, d - j * B < B ? d - j * B : B, j, d, row);
}

/* Thread per (row, block of DSV4_KV_WINDOW): kvq = kv through the production window row's
 * packing and back (what a read of the stored row gives). */
__global__ void dsv4cu::k_window_rt(int R, int d, const float *kv, float *kvq)
{
    PDL_WAIT();
    enum { B = 32 };
    int nb = (d + B - 1) / B;
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)R * nb)
        return;
    int r = (int)(idx / nb), j = (int)(idx % nb), n = d - j * B < B ? d - j * B : B;
    uint8_t blk[B + 1]; /* the block alone as a row of n values: its codes, then its scale */
    const float *x = kv + (int64_t)r * d + j * B;
    float *y = kvq + (int64_t)r * d + j * B;
    dsv4_kv_pack_block(DSV4_KV_WINDOW, x, n, 0, n, blk);
    const crow c = {blk, DSV4_KV_WINDOW, n};
    for (int i = 0; i < n; i++)
        y[i] = c[i];
}

bool dsv4cu::iscore_launch(const rows_dev &rd, int r0, int nr, int ratio, int topk, int64_t vis_cap, int nI, int ci,
                           float iw_scale, float post, const float *qi, const float *wt, float *scores, int ref, int prod)
{
    if (!ref && iscore_tc_fits(nI, ci, vis_cap))
        return iscore_tc(rd, r0, nr, ratio, topk, vis_cap, nI, ci, iw_scale, post, qi, wt, scores, prod);
    launch_k(prod ? k_iscore<1> : k_iscore<0>, dim3((unsigned)nr, (unsigned)cdiv(vis_cap, SC_EPB)), NB, 0, stream, rd,
             r0, ratio, topk, vis_cap, nI, ci, iw_scale, post, qi, wt, scores, ref);
    return launched("attn_step indexer scores");
}

int dsv4cu::score_rows(int R, int64_t vis_cap)
{
    if (vis_cap <= 0 || (int64_t)R * vis_cap <= SCORE_FLOATS)
        return R;
    int64_t n = SCORE_FLOATS / vis_cap;
    return n < 1 ? 1 : (int)n;
}

/* ---- host side --------------------------------------------------------------------------- */

/* A buffer attn_step reads or writes: given (it is a device buffer by the op's contract; a
 * missing one fails the op rather than a kernel). */
static bool need(const void *p, const char *what)
{
    if (p)
        return true;
    fail(DSV4_E_ARG, "cuda: attn_step: no %s", what);
    return false;
}

/* Keys a row may attend: its kept entries (all visible ones without an indexer) and the window. */
static int64_t attn_nkmax(const dsv4_attn_args *a)
{
    int64_t vis = a->ratio ? a->vis_cap : 0;
    return (a->ratio ? (a->csa ? (vis < a->topk ? vis : a->topk) : vis) : 0) + a->window;
}

/* The scratch's pieces, in floats from work (attn_work's order): the indexer's scores of a pass
 * of score_rows rows and right after them the selections [R, topk] (DSV4_ATTN_WORK's layout
 * when one pass takes every row), then 16-byte aligned the step's kv rows as production caches
 * store them [R, d] (prod), and on tensor cores (when the heads suit them) the partials of few
 * rows, which the op goes without when work_n ends before them (need: the floats without). */
struct work4 {
    float *scores, *kvq, *part;
    int *sel;
    int srows;
    size_t part_n, need, n;
};

static work4 layout4(const dsv4_attn_args *a, float *base)
{
    work4 w = {};
    int R = a->rows.R;
    int64_t vis = a->ratio ? a->vis_cap : 0;
    bool csa = a->ratio && a->csa;
    size_t off = 0;
    auto take = [&](size_t n) -> float * {
        float *p = base ? base + off : NULL;
        off += n;
        return p;
    };
    auto align = [&]() { off = (off + 3) & ~(size_t)3; };
    w.srows = csa ? score_rows(R, vis) : 0;
    if (csa) {
        w.scores = take((size_t)w.srows * vis);
        w.sel = (int *)take((size_t)R * a->topk);
    }
    align();
    if (a->kv_prod)
        w.kvq = take((size_t)R * a->d);
    w.need = off;
    align();
    if (tc_family("attn") && attn_tc_fits(a->H, a->d)) {
        w.part_n = attn_tc_part(R, a->H, a->d, attn_nkmax(a));
        if (w.part_n)
            w.part = take(w.part_n);
    }
    w.n = off ? off : 1;
    if (base && a->work_n < w.n) { /* a caller's lean scratch: no partials */
        w.part = NULL;
        w.part_n = 0;
    }
    return w;
}

size_t dsv4cu::attn_work(const dsv4_attn_args *a) { return layout4(a, NULL).n; }

void dsv4cu::attn_step(const dsv4_attn_args *a)
{
    const dsv4_rows *rw = &a->rows;
    int R = rw->R, H = a->H, d = a->d;
    if (R <= 0 || H <= 0 || d <= 0)
        return;
    size_t bo = (size_t)R * H * d * sizeof(float);
    op_begin();
    int ratio = a->ratio, csa = ratio ? a->csa : 0;
    int64_t vis = ratio ? a->vis_cap : 0;
    bool ok = true;
    ok = ok && need(rw->pos, "rows.pos") && need(rw->seq, "rows.seq") && need(rw->start, "rows.start") &&
         need(rw->first, "rows.first") && need(a->st, "st") && need(a->q, "q") && need(a->kv, "kv") && need(a->o, "o");
    if (ok && ratio)
        ok = need(a->cc, "cc") && need(a->zz, "zz");
    if (ok && csa)
        ok = need(a->ic, "ic") && need(a->iz, "iz") && need(a->qi, "qi") && need(a->wt, "wt");
    work4 wk = layout4(a, a->work);
    if (ok && wk.need && (!need(a->work, "work") || a->work_n < wk.need)) {
        if (ok)
            fail(DSV4_E_ARG, "cuda: attn_step: %zu floats of work, %zu needed", a->work_n, wk.need);
        ok = false;
    }
    if (ok && (rw->S <= 0 || a->window < 0 || a->kv_cap <= 0 || (ratio && (ratio < 0 || a->c_cap <= 0 || vis < 0)) ||
               (ratio && (a->comp.ratio != ratio || a->comp.dim != d)) ||
               (csa && (a->icomp.ratio != ratio || a->icomp.dim != a->ci || a->topk <= 0 || a->ci <= 0 ||
                        a->nI <= 0)) ||
               a->rd > d || a->rd % 2 || (csa && a->rd > a->ci))) {
        fail(DSV4_E_ARG, "cuda: attn_step: inconsistent arguments (ratio %d, d %d, rd %d, ci %d, topk %d)", ratio, d,
             a->rd, a->ci, a->topk);
        ok = false;
    }
    if (ok && (vis > INT32_MAX || (csa && cdiv(vis, SC_EPB) > 65535) || H > 65535)) {
        fail(DSV4_E_UNSUPPORTED, "cuda: attn_step: vis_cap %lld or %d heads beyond the kernels' grid",
             (long long)vis, H);
        ok = false;
    }
    const float *sink = ok && need(a->sink, "sink") ? (const float *)dev_const(a->sink, "attn_step", "sink") : NULL;
    const float *ifr = sink && ratio && a->rd && need(a->inv_freq, "inv_freq")
                           ? (const float *)dev_const(a->inv_freq, "attn_step", "inv_freq") : NULL;
    pool_dev pc = {0, 0, 0, NULL, NULL}, pi = {0, 0, 0, NULL, NULL};
    if (ok && ratio) {
        const dsv4_pool *c = &a->comp;
        pc = pool_dev{c->ratio, c->dim, c->overlap ? 1 : 0,
                      (const float *)dev_const(c->ape, "attn_step", "comp.ape"),
                      (const float *)dev_const(c->norm, "attn_step", "comp.norm")};
        ok = (pc.ape || !c->ape) && (pc.norm || !c->norm) && (ifr || a->rd == 0);
        if (ok && csa) {
            const dsv4_pool *c2 = &a->icomp;
            pi = pool_dev{c2->ratio, c2->dim, c2->overlap ? 1 : 0,
                          (const float *)dev_const(c2->ape, "attn_step", "icomp.ape"),
                          (const float *)dev_const(c2->norm, "attn_step", "icomp.norm")};
            ok = (pi.ape || !c2->ape) && (pi.norm || !c2->norm);
        }
    }
    /* k_attn's score array: every key a row may have */
    int64_t nkmax = attn_nkmax(a);
    bool tc = tc_family("attn") && attn_tc_fits(H, d);
    size_t asmem = (size_t)(nkmax > 0 ? nkmax : 1) * sizeof(float);
    if (ok && !g_smem_optin) {
        int dev = 0;
        if (CK(cudaGetDevice(&dev)) || CK(cudaDeviceGetAttribute(&g_smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev)))
            ok = false;
    }
    size_t static_smem = (ATT_NW + 1 + ATT_NW * ATT_MAXD) * sizeof(float);
    if (ok && !tc && asmem + static_smem > (size_t)g_smem_optin) {
        fail(DSV4_E_UNSUPPORTED, "cuda: attn_step: %lld keys a row do not fit shared memory (%d bytes)", (long long)nkmax,
             g_smem_optin);
        ok = false;
    }
    if (ok && !tc && asmem + static_smem > 48 * 1024 && (int)asmem > g_attn_smem_set) {
        if (CK(cudaFuncSetAttribute(k_attn<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)asmem)) ||
            CK(cudaFuncSetAttribute(k_attn<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)asmem)))
            ok = false;
        else
            g_attn_smem_set = (int)asmem;
    }
    if (!ok || !sink) {
        out_fail(a->o, bo);
        op_end();
        return;
    }
    rows_dev rdv = {rw->pos, rw->seq, rw->start, rw->first, a->st, R, rw->S};
    int prod = a->kv_prod;
    if (dsv4cu::poison)
        CK(cudaMemsetAsync(a->o, 0xff, bo, stream));
    bool run = true;
    const float *kv = a->kv; /* the step's window rows as the attention reads them */
    if (prod) {
        launch_k(k_window_rt, (unsigned)cdiv((int64_t)R * cdiv(d, 32), 256), 256, 0, stream, R, d, a->kv, wk.kvq);
        run = launched("attn_step window rows' round trip");
        kv = wk.kvq;
    }
    if (run && ratio) {
        int dmax = csa && a->ci > d ? a->ci : d;
        launch_k(prod ? k_emit<1> : k_emit<0>, dim3((unsigned)R, csa ? 2 : 1), NB, (size_t)dmax * sizeof(float), stream,
                 rdv, pc, pi, a->c_cap, a->rd, ifr, a->eps, a->cc, a->zz, a->ic, a->iz);
        run = launched("attn_step entries");
    }
    prof_split("attn_step: entries");
    for (int r0 = 0; run && csa && vis > a->topk && r0 < R; r0 += wk.srows) {
        int nr = R - r0 < wk.srows ? R - r0 : wk.srows;
        run = iscore_launch(rdv, r0, nr, ratio, a->topk, vis, a->nI, a->ci, a->iw_scale, 1.0f / sqrtf((float)a->ci),
                            a->qi, a->wt, wk.scores, 0, prod);
        if (run) {
            launch_k(k_itopk, (unsigned)nr, TK_NT, 0, stream, rdv, r0, ratio, a->topk, vis, (const float *)wk.scores,
                     wk.sel);
            run = launched("attn_step indexer top-k");
        }
    }
    prof_split("attn_step: indexer");
    if (run && tc) {
        run = attn_tc_launch(rdv, ratio, csa, a->topk, vis, a->kv_cap, H, d, a->window, nkmax, a->scale, sink, a->q,
                             kv, wk.sel, prod, a->o, wk.part, wk.part_n);
    } else if (run) {
        launch_k(prod ? k_attn<1> : k_attn<0>, dim3((unsigned)R, (unsigned)H), ATT_NW * 32, asmem, stream, rdv, ratio, csa,
                 a->topk, vis, a->kv_cap, H, d, a->window, (int)nkmax, a->scale, sink, a->q, kv, (const int *)wk.sel, a->o);
        run = launched("attn_step attention");
    }
    if (run) {
        int cw = (1 + csa) * d, iw = 2 * a->ci, wmax = d;
        if (ratio && cw > wmax)
            wmax = cw;
        if (csa && iw > wmax)
            wmax = iw;
        launch_k(k_ring, dim3((unsigned)cdiv((int64_t)R * wmax, 256), 5), 256, 0, stream, rdv, ratio, csa, d, cw, iw,
                 a->kv_cap, a->c_cap, a->kv, a->cc, a->zz, a->ic, a->iz, prod);
        run = launched("attn_step rings");
    }
    if (run && prod) {
        launch_k(k_ring_pack, (unsigned)cdiv((int64_t)R * cdiv(d, 32), 256), 256, 0, stream, rdv, d, a->kv_cap, a->kv);
        run = launched("attn_step packed window ring");
    }
    if (!run)
        out_fail(a->o, bo);
    op_end();
}

void dsv4cu::route(const float *lg, int R, int E, int K, const float *bias, const int32_t *tid2eid, const int32_t *ids,
                   int norm, float route_scale, int32_t *eid, float *wts)
{
    if (R <= 0 || K <= 0)
        return;
    size_t bk = (size_t)R * K * sizeof(float);
    op_begin();
    size_t smem = (size_t)NW * E * (sizeof(float) + 1);
    bool ok = E > 0 && K <= E;
    if (!ok)
        fail(DSV4_E_ARG, "cuda: route: %d of %d experts", K, E);
    ok = ok && given("route", {lg, eid, wts});
    if (ok && smem > 48 * 1024) {
        fail(DSV4_E_UNSUPPORTED, "cuda: route: %d experts do not fit the kernel's shared memory", E);
        ok = false;
    }
    const float *db = ok && bias ? (const float *)dev_const(bias, "route", "bias") : NULL;
    const int32_t *dt = NULL;
    if (ok && tid2eid) {
        dt = (const int32_t *)dev_const(tid2eid, "route", "tid2eid");
        if (dt && !ids) {
            fail(DSV4_E_ARG, "cuda: route: tid2eid without token ids");
            dt = NULL;
        }
        ok = dt != NULL;
    }
    /* lg and ids are read, eid and wts written where they are (device buffers) */
    if (ok && (db || !bias) && poison_out(eid, bk) && poison_out(wts, bk)) {
        launch_k(k_route, (unsigned)cdiv(R, NW), NB, smem, stream, lg, R, E, K, db, dt, ids, norm, route_scale, eid, wts);
        if (launched("route")) {
            op_end();
            return;
        }
    }
    out_fail(wts, bk); /* a failed routing: weights NaN, experts 0 (valid ids) */
    if (eid)
        failed(cudaMemsetAsync(eid, 0, bk, stream), "route: clearing the experts of a failed routing");
    op_end();
}
