/* CUDA backend, V4.1's stateful attention (attn_step41, kernels/backend.h) over device buffers.
 *
 * The CPU walks the step's rows in position order. Here each phase runs over all the rows, in
 * stream order, and a row reads only what that walk would have written before it: every
 * entry a row may see is complete once the emission phase is done, and the window and
 * compressor rows of this step are read from the step's inputs (the rings only hold earlier
 * steps' rows until the last phase). The phases:
 *   k41_lat    KV sources: the entry each row's group completes, unrotated: pooled from the
 *              compressor inputs and RMS-normed (m > 1), or the row's cc as it is (m = 1);
 *              zeros for a row that completes none;
 *   linear     key owners: the index key projection of those rows, one linear op;
 *   k41_store  the key RMS-normed and roped, the entry roped, both stored at entry w;
 *   scores     index sources: iscore_launch (step.cu) with iw_scale = post = 1 (V4.1's head
 *              weights carry every factor); the candidate source scores every row with an
 *              entry, the others only rows that keep fewer than all;
 *   k41_cand   the candidate source's blocks: block maxima, the newest block forced in, the
 *              best cand_k of finite score;
 *   k41_filter a candidate filter: scores outside the kept blocks to -inf;
 *   k41_topk   the topk best entries in ascending order (all of them when there are no more);
 *   k41_attn   attention per (row, head) over the selected entries, then the window (on the
 *              tensor cores instead, attn_tc.cu, when they are on and the heads suit them;
 *              REF's in double, as the reference's, attn41_f64.cu);
 *   k_ring     the rings take the step's rows (step.cu).
 * Each row's result comes from one block in an order fixed by the shapes: batch invariant, and
 * a row gives the same bits in any step. REF (ref) rounds where the CPU's walk does: the
 * pooled and normed latent, the key projection's e4m3 input and its output, the key after
 * its norm and rope, the entry after its rope, and both through their fp4 round trips
 * (rounding.cuh), and the index scores (k_iscore's ref). Production caches (kv_prod): the
 * entries, keys and window rows are stored packed (kvrow.cuh) and read decoded; the attention
 * reads this step's window rows through the same round trip (k_window_rt). The index phases
 * run in passes of score_rows rows, so their scratch does not grow as [rows, context]. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "kernels/cuda/step.cuh"
#include "kernels/cuda/rounding.cuh"

using namespace dsv4cu;

namespace {

enum { A41_NW = 16 };          /* warps of an attention block, as attn_step's */

/* Block per row r at position p. When p completes group w = p / m: m > 1, each channel pooled
 * over the group's m tokens (the step's cc, zz rows for tokens of this step, the rings for
 * earlier ones) and the block's RMS norm with norm; m = 1, cc[r]. lat[r] takes it, or zeros. */
__global__ void __launch_bounds__(NB) k41_lat(rows_dev rd, int m, int d, int c_cap, const float *ape, const float *norm,
                                              float eps, const float *cc, const float *zz, float *lat, int ref)
{
    PDL_WAIT();
    extern __shared__ float ev[]; /* [d] */
    __shared__ float red[NW + 1];
    int r = blockIdx.x;
    int64_t p = rd.pos[r];
    float *out = lat + (int64_t)r * d;
    if ((p + 1) % m) {
        for (int ch = threadIdx.x; ch < d; ch += NB)
            out[ch] = 0.0f;
        return;
    }
    if (m == 1) {
        for (int ch = threadIdx.x; ch < d; ch += NB)
            out[ch] = cc[(int64_t)r * d + ch];
        return;
    }
    int s = rd.seq[r];
    dsv4_lbufs b = rd.st[s];
    int64_t start = rd.start[s], first = rd.first[s], w = p / m;
    auto row = [&](int64_t tok, const float *&c, const float *&z) {
        bool here = tok >= start;
        int64_t ro = here ? (first + (tok - start)) * d : (tok % c_cap) * d;
        c = (here ? cc : b.c) + ro;
        z = (here ? zz : b.z) + ro;
    };
    for (int ch = threadIdx.x; ch < d; ch += NB) {
        float v = pool_channel(m, d, 0, ape, w, ch, row);
        ev[ch] = ref ? rt_bf16(v) : v;
    }
    rms_block(ev, d, norm, eps, red, out);
    if (ref) /* the channels this thread wrote */
        for (int ch = threadIdx.x; ch < d; ch += NB)
            out[ch] = rt_bf16(out[ch]);
}

/* rope_store, with REF's steps between the rope and the store: the roped row through bf16,
 * then through its cache code in blocks (DSV4_RT_*). prod: the (REF: bf16-rounded) roped row
 * packed in format fmt into prow instead, which is that round trip's stored form. */
__device__ void rope_store41(float *v, int n, int rd, const float *inv_freq, int64_t p, float *dst, int ref, int block,
                             int code, int prod, int fmt, uint8_t *prow)
{
    if (prod) {
        rope_store(v, n, rd, inv_freq, p, v);
        __syncthreads();
        if (ref) {
            for (int i = threadIdx.x; i < n; i += NB)
                v[i] = rt_bf16(v[i]);
            __syncthreads();
        }
        pack_row_block(fmt, v, n, prow);
        return;
    }
    if (!ref) {
        rope_store(v, n, rd, inv_freq, p, dst);
        return;
    }
    rope_store(v, n, rd, inv_freq, p, v);
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += NB)
        v[i] = rt_bf16(v[i]);
    __syncthreads();
    for (int b = threadIdx.x; b * block < n; b += NB)
        rt_block(v + b * block, v + b * block, n - b * block < block ? n - b * block : block, code);
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += NB)
        dst[i] = v[i];
}

/* Block per row that completes group w: (kk given) the index key kk[r] RMS-normed with ik_norm
 * and roped at w m into ikey[w]; the entry lat[r] roped at w m into ent[w] (the row's sequence's
 * buffers of this layer; prod: packed into pikey[w], pent[w]). */
__global__ void __launch_bounds__(NB) k41_store(rows_dev rd, int m, int d, int ci, int rdim, const float *inv_freq,
                                                const float *ik_norm, float eps, const float *lat, const float *kk,
                                                int ref, int prod)
{
    PDL_WAIT();
    extern __shared__ float sv[]; /* [max(d, ci)] */
    __shared__ float red[NW + 1];
    int r = blockIdx.x;
    int64_t p = rd.pos[r];
    if ((p + 1) % m)
        return;
    int64_t w = p / m;
    dsv4_lbufs b = rd.st[rd.seq[r]];
    if (kk) {
        for (int i = threadIdx.x; i < ci; i += NB)
            sv[i] = ref ? rt_bf16(kk[(int64_t)r * ci + i]) : kk[(int64_t)r * ci + i];
        rms_block(sv, ci, ik_norm, eps, red, sv);
        if (ref)
            for (int i = threadIdx.x; i < ci; i += NB)
                sv[i] = rt_bf16(sv[i]);
        rope_store41(sv, ci, rdim, inv_freq, w * m, b.ikey + w * ci, ref, 32, DSV4_RT_FP4, prod, DSV4_KV_INDEX,
                     prod ? b.pikey + w * dsv4_kv_row_bytes(DSV4_KV_INDEX, ci) : NULL);
        __syncthreads();
    }
    for (int i = threadIdx.x; i < d; i += NB)
        sv[i] = lat[(int64_t)r * d + i];
    rope_store41(sv, d, rdim, inv_freq, w * m, b.ent + w * d, ref, 16, DSV4_RT_FP4_E4M3, prod, DSV4_KV_MAIN,
                 prod ? b.pent + w * dsv4_kv_row_bytes(DSV4_KV_MAIN, d) : NULL);
}

/* Block per row with nvis >= 1 entries: block b's score is the best of its entries' (bs a
 * block), the newest block's +inf; the best k = min(cand_k, blocks of score above -inf) go to
 * cand[r] in ascending order (all of them when that is every block), ncand[r] = k; ncand = 0
 * for a row with none. Row r = r0 + x reads scores[x * vis_cap ..] and writes bm[x * nbc ..],
 * its block scores. */
__global__ void __launch_bounds__(TK_NT) k41_cand(rows_dev rd, int r0, int ratio, int64_t vis_cap, int bs, int cand_k,
                                                  int64_t nbc, const float *scores, float *bm, int64_t *cand, int *ncand)
{
    PDL_WAIT();
    __shared__ int s_cnt;
    int r = r0 + (int)blockIdx.x;
    int64_t nvis = (rd.pos[r] + 1) / ratio;
    if (nvis < 1 || nvis > vis_cap) {
        if (threadIdx.x == 0)
            ncand[r] = 0;
        return;
    }
    const float *sc = scores + (int64_t)blockIdx.x * vis_cap;
    float *bmr = bm + (int64_t)blockIdx.x * nbc;
    int nb = (int)((nvis + bs - 1) / bs), cnt = 0;
    if (threadIdx.x == 0)
        s_cnt = 0;
    __syncthreads();
    for (int k = threadIdx.x; k < nb; k += TK_NT) {
        float mx = -INFINITY;
        for (int64_t w = (int64_t)k * bs; w < nvis && w < (int64_t)(k + 1) * bs; w++)
            mx = fmaxf(mx, sc[w]);
        float v = k == nb - 1 ? INFINITY : mx;
        bmr[k] = v;
        cnt += v != -INFINITY;
    }
    atomicAdd(&s_cnt, cnt);
    __syncthreads();
    int keep = s_cnt < cand_k ? s_cnt : cand_k;
    int64_t *out = cand + (int64_t)r * cand_k;
    if (keep >= nb) { /* every block, all of finite score */
        for (int k = threadIdx.x; k < nb; k += TK_NT)
            out[k] = k;
    } else
        topk_block(bmr, nb, keep, out);
    if (threadIdx.x == 0)
        ncand[r] = keep;
}

/* Block per row r = r0 + x with nvis > topk: the scores of entries whose block is not among
 * cand[r]'s ncand[r] blocks become -inf (scores[x * vis_cap ..], mask[x * nbc ..] bytes). */
__global__ void __launch_bounds__(NB) k41_filter(rows_dev rd, int r0, int ratio, int topk, int64_t vis_cap, int bs,
                                                 int cand_k, int64_t nbc, const int64_t *cand, const int *ncand,
                                                 float *scores, unsigned char *mask)
{
    PDL_WAIT();
    int r = r0 + (int)blockIdx.x;
    int64_t nvis = (rd.pos[r] + 1) / ratio;
    if (nvis <= topk || nvis > vis_cap)
        return;
    int64_t nb = (nvis + bs - 1) / bs;
    unsigned char *mr = mask + (int64_t)blockIdx.x * nbc;
    for (int64_t k = threadIdx.x; k < nb; k += NB)
        mr[k] = 0;
    __syncthreads();
    int nc = ncand[r];
    for (int i = threadIdx.x; i < nc && i < cand_k; i += NB) {
        int64_t k = cand[(int64_t)r * cand_k + i];
        if (k >= 0 && k * bs < nvis)
            mr[k] = 1;
    }
    __syncthreads();
    float *sc = scores + (int64_t)blockIdx.x * vis_cap;
    for (int64_t w = threadIdx.x; w < nvis; w += NB)
        if (!mr[w / bs])
            sc[w] = -INFINITY;
}

/* Block per row r = r0 + x: sel[r] the topk best entries of its scores (scores[x * vis_cap ..])
 * in ascending order and
 * nsel[r] = topk; a row with nvis <= topk keeps every entry 0..nvis-1 (nsel = nvis); a row
 * beyond vis_cap keeps none (its attention is NaN). */
__global__ void __launch_bounds__(TK_NT) k41_topk(rows_dev rd, int r0, int ratio, int topk, int64_t vis_cap,
                                                  const float *scores, int64_t *sel, int *nsel)
{
    PDL_WAIT();
    int r = r0 + (int)blockIdx.x;
    int64_t nvis = (rd.pos[r] + 1) / ratio;
    int64_t *out = sel + (int64_t)r * topk;
    if (nvis > vis_cap) {
        if (threadIdx.x == 0)
            nsel[r] = -1;
        return;
    }
    if (nvis <= topk) {
        for (int i = threadIdx.x; i < nvis; i += TK_NT)
            out[i] = i;
    } else
        topk_block(scores + (int64_t)blockIdx.x * vis_cap, (int)nvis, topk, out);
    if (threadIdx.x == 0)
        nsel[r] = (int)(nvis < topk ? nvis : topk);
}

/* Block (row r, head h): attend_head over row r's keys (geo41). pr: [nkmax] floats of dynamic
 * shared memory. */
__global__ void __launch_bounds__(A41_NW * 32) k41_attn(geo41 g, int H, int d, float scale, const float *sink,
                                                        const float *q, float *o)
{
    PDL_WAIT();
    extern __shared__ float pr[];
    __shared__ float sh[A41_NW + 1], part[A41_NW * ATT_MAXD];
    int r = blockIdx.x, h = blockIdx.y;
    geo41::Row row(g, r, d);
    float *orow = o + ((int64_t)r * H + h) * d;
    if (!row.ok) {
        for (int j = threadIdx.x; j < d; j += A41_NW * 32)
            orow[j] = __int_as_float(0x7fc00000);
        return;
    }
    auto key = [&](int i) -> crow { return row.key(i); };
    attend_head<A41_NW>(q + ((int64_t)r * H + h) * d, key, row.nk, d, scale, sink[h], pr, sh, part, orow);
}

int g41_smem_set;               /* what k41_attn was allowed so far */

/* A buffer attn_step41 reads or writes: given (it is a device buffer by the op's contract; a
 * missing one fails the op rather than a kernel). */
bool need41(const void *p, const char *what)
{
    if (p)
        return true;
    fail(DSV4_E_ARG, "cuda: attn_step41: no %s", what);
    return false;
}

/* The attention runs on the tensor cores (attn_tc.cu) when they are on and the heads suit them;
 * REF's runs in double (attn41_f64.cu). */
bool tc41(const dsv4_attn41_args *a) { return !a->ref && tc_family("attn") && attn_tc_fits(a->H, a->d); }

/* Keys a row may attend: its selection and the window. */
int64_t nkmax41(const dsv4_attn41_args *a)
{
    int64_t vis = a->ratio ? a->vis_cap : 0;
    return (a->ratio ? (vis < a->topk ? vis : a->topk) : 0) + a->window;
}

/* The scratch's pieces, in floats from work (attn41_work's order); part: the tensor-core
 * attention's chunk partials (few rows). */
struct work41 {
    float *scores, *lat, *kk, *bm, *kvq, *part;
    unsigned char *mask;
    int64_t nbc;
    int srows;                  /* rows a pass of the index phases takes (score_rows) */
    size_t part_n, n;
};

work41 layout41(const dsv4_attn41_args *a, float *base)
{
    work41 w = {};
    int64_t R = a->rows.R, vis = a->ratio ? a->vis_cap : 0;
    w.nbc = a->cand_bs > 0 ? cdiv(vis, a->cand_bs) : 0;
    size_t off = 0;
    auto take = [&](size_t n) -> float * {
        float *p = base ? base + off : NULL;
        off += (n + 3) & ~(size_t)3; /* 16-byte pieces */
        return p;
    };
    w.srows = a->index_source ? score_rows((int)R, vis) : 0;
    if (a->index_source)
        w.scores = take((size_t)w.srows * vis);
    if (a->own_ent)
        w.lat = take((size_t)R * a->d);
    if (a->own_ikey)
        w.kk = take((size_t)R * a->ci);
    if (a->cand_source)
        w.bm = take((size_t)w.srows * w.nbc);
    if (a->cand_filter)
        w.mask = (unsigned char *)take(((size_t)w.srows * w.nbc + 3) / 4);
    if (a->kv_prod)
        w.kvq = take((size_t)R * a->d);
    w.part_n = tc41(a) ? attn_tc_part((int)R, a->H, a->d, nkmax41(a)) : 0;
    if (w.part_n)
        w.part = take(w.part_n);
    w.n = off ? off : 1;
    return w;
}

/* The arguments as this backend runs them; false after recording why not. */
bool check41(const dsv4_attn41_args *a)
{
    const dsv4_rows *rw = &a->rows;
    int m = a->ratio;
    bool ok = need41(rw->pos, "rows.pos") && need41(rw->seq, "rows.seq") && need41(rw->start, "rows.start") &&
              need41(rw->first, "rows.first") && need41(a->st, "st") && need41(a->q, "q") && need41(a->kv, "kv") &&
              need41(a->o, "o") && need41(a->work, "work") && need41(a->sink, "sink");
    if (ok && m)
        ok = need41(a->est, "est") && need41(a->sel, "sel") && need41(a->nsel, "nsel");
    if (ok && a->own_ent)
        ok = need41(a->cc, "cc") && (m == 1 || need41(a->zz, "zz")) && (!a->rd || need41(a->inv_freq, "inv_freq"));
    if (ok && a->index_source)
        ok = need41(a->ist, "ist") && need41(a->qi, "qi") && need41(a->wt, "wt");
    if (ok && (a->cand_source || a->cand_filter))
        ok = need41(a->cand, "cand") && need41(a->ncand, "ncand");
    if (!ok)
        return false;
    bool bad = rw->S <= 0 || a->window < 0 || a->kv_cap <= 0 || a->H <= 0 || a->H > 65535 || a->d <= 0 ||
               a->d > ATT_MAXD || a->rd < 0 || a->rd % 2 || a->rd > a->d || m < 0 || (m && a->vis_cap < 0) ||
               (a->own_ent && (!m || a->comp.ratio != m || a->comp.dim != a->d || a->comp.overlap ||
                               (m > 1 && a->c_cap < m))) ||
               (a->own_ikey && (!a->own_ent || !a->iwk || a->iwk->n != a->ci || a->iwk->k != a->d || a->rd > a->ci)) ||
               (a->index_source && (!m || a->topk <= 0 || a->nI <= 0 || a->ci <= 0)) ||
               (m && !a->index_source && a->topk <= 0) ||
               ((a->cand_source || a->cand_filter) && (!a->index_source || a->cand_bs <= 0 || a->cand_k <= 0)) ||
               (m && a->vis_cap > INT32_MAX);
    if (bad)
        fail(DSV4_E_ARG, "cuda: attn_step41: inconsistent arguments (ratio %d, d %d, rd %d, ci %d, topk %d, overlap %d)",
             m, a->d, a->rd, a->ci, a->topk, a->comp.overlap);
    return !bad;
}

} // namespace

size_t dsv4cu::attn41_work(const dsv4_attn41_args *a) { return layout41(a, NULL).n; }

void dsv4cu::attn_step41(const dsv4_attn41_args *a)
{
    const dsv4_rows *rw = &a->rows;
    int R = rw->R, H = a->H, d = a->d, m = a->ratio, ci = a->ci, K = a->topk;
    if (R <= 0 || H <= 0 || d <= 0)
        return;
    size_t bo = (size_t)R * H * d * sizeof(float);
    int64_t vis = m ? a->vis_cap : 0;
    work41 w = layout41(a, a->work);
    rows_dev rdv = {rw->pos, rw->seq, rw->start, rw->first, a->st, R, rw->S};
    rows_dev rdi = rdv;
    rdi.st = a->ist;

    /* the entries' latents, then (a separate op) their index keys' projection */
    op_begin();
    bool run = check41(a);
    if (run && a->own_ent) {
        const float *norm =
            m > 1 && a->comp.norm ? (const float *)dev_const(a->comp.norm, "attn_step41", "comp.norm") : NULL;
        const float *ape = m > 1 && a->comp.ape ? (const float *)dev_const(a->comp.ape, "attn_step41", "comp.ape") : NULL;
        run = (norm || !a->comp.norm || m == 1) && (ape || !a->comp.ape || m == 1);
        if (run) {
            launch_k(k41_lat, (unsigned)R, NB, (size_t)d * sizeof(float), stream, rdv, m, d, a->c_cap, ape, norm, a->eps,
                     a->cc, a->zz, w.lat, a->ref);
            run = launched("attn_step41 entries");
        }
    }
    op_end();
    if (run && a->own_ikey) {
        if (a->ref && (a->iwk->form == DSV4_WF_FP8 || a->iwk->form == DSV4_WF_FP4)) /* REF's e4m3 input */
            cu_linear_q(a->iwk, 0, ci, w.lat, R, d, w.kk, ci);
        else
            cu_linear(a->iwk, 0, ci, w.lat, R, d, w.kk, ci);
    }

    op_begin();
    const float *sink = run ? (const float *)dev_const(a->sink, "attn_step41", "sink") : NULL;
    const float *ifr =
        run && a->own_ent && a->rd ? (const float *)dev_const(a->inv_freq, "attn_step41", "inv_freq") : NULL;
    const float *ikn = run && a->own_ikey && a->ik_norm ? (const float *)dev_const(a->ik_norm, "attn_step41", "ik_norm")
                                                        : NULL;
    run = run && sink && (ifr || !a->own_ent || !a->rd) && (ikn || !a->own_ikey || !a->ik_norm);
    int64_t nkmax = nkmax41(a);
    bool tc = tc41(a);
    bool f64 = a->ref;
    size_t asmem = (size_t)(nkmax > 0 ? nkmax : 1) * sizeof(float);
    size_t static_smem = (A41_NW + 1 + A41_NW * ATT_MAXD) * sizeof(float);
    if (run && !tc && !f64 && asmem + static_smem > 48 * 1024 && (int)asmem > g41_smem_set) {
        int dev = 0, optin = 0;
        if (CK(cudaGetDevice(&dev)) || CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev)))
            run = false;
        else if (asmem + static_smem > (size_t)optin) {
            fail(DSV4_E_UNSUPPORTED, "cuda: attn_step41: %lld keys a row do not fit shared memory (%d bytes)",
                 (long long)nkmax, optin);
            run = false;
        } else if (CK(cudaFuncSetAttribute(k41_attn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)asmem)))
            run = false;
        else
            g41_smem_set = (int)asmem;
    }
    if (run && dsv4cu::poison)
        CK(cudaMemsetAsync(a->o, 0xff, bo, stream));
    if (run && a->own_ent) {
        int wmax = ci > d ? ci : d;
        launch_k(k41_store, (unsigned)R, NB, (size_t)wmax * sizeof(float), stream, rdv, m, d, ci, a->rd, ifr, ikn, a->eps,
                 w.lat, a->own_ikey ? w.kk : (const float *)NULL, a->ref, a->kv_prod);
        run = launched("attn_step41 entry stores");
    }
    prof_split("attn_step41: entries");
    /* the candidate source's blocks are every row's; a plain index source scores only rows that
     * keep fewer than all; in passes of w.srows rows */
    int keep = a->cand_source ? 0 : K; /* rows with more entries than this are scored */
    for (int r0 = 0; run && a->index_source && r0 < R; r0 += w.srows) {
        int nr = R - r0 < w.srows ? R - r0 : w.srows;
        if (vis > keep)
            run = iscore_launch(rdi, r0, nr, m, keep, vis, a->nI, ci, 1.0f, 1.0f, a->qi, a->wt, w.scores, a->ref,
                                a->kv_prod);
        if (run && a->cand_source) {
            launch_k(k41_cand, (unsigned)nr, TK_NT, 0, stream, rdv, r0, m, vis, a->cand_bs, a->cand_k, w.nbc,
                     (const float *)w.scores, w.bm, a->cand, a->ncand);
            run = launched("attn_step41 candidate blocks");
        }
        if (run && a->cand_filter) {
            launch_k(k41_filter, (unsigned)nr, NB, 0, stream, rdv, r0, m, K, vis, a->cand_bs, a->cand_k, w.nbc,
                     (const int64_t *)a->cand, (const int *)a->ncand, w.scores, w.mask);
            run = launched("attn_step41 candidate filter");
        }
        if (run) {
            launch_k(k41_topk, (unsigned)nr, TK_NT, 0, stream, rdv, r0, m, K, vis, (const float *)w.scores, a->sel,
                     a->nsel);
            run = launched("attn_step41 top-k");
        }
    }
    prof_split("attn_step41: indexer");
    const float *kv = a->kv; /* the step's window rows as the attention reads them */
    if (run && a->kv_prod) {
        launch_k(k_window_rt, (unsigned)cdiv((int64_t)R * cdiv(d, 32), 256), 256, 0, stream, R, d, a->kv, w.kvq);
        run = launched("attn_step41 window rows' round trip");
        kv = w.kvq;
    }
    geo41 geo = {rdv, a->est, m, K, a->kv_cap, a->window, (int)nkmax, kv, a->sel, a->nsel, a->kv_prod};
    if (run && f64)
        run = attn41_f64_launch(geo, H, d, (m ? K : 0) + a->window, a->scale, sink, a->q, a->o);
    else if (run && tc)
        run = attn41_tc_launch(geo, H, d, a->scale, sink, a->q, a->o, w.part, w.part_n);
    else if (run) {
        launch_k(k41_attn, dim3((unsigned)R, (unsigned)H), A41_NW * 32, asmem, stream, geo, H, d, a->scale, sink, a->q,
                 a->o);
        run = launched("attn_step41 attention");
    }
    if (run) {
        int ring_m = a->own_ent && m > 1 ? m : 0;
        launch_k(k_ring, dim3((unsigned)cdiv((int64_t)R * d, 256), 3), 256, 0, stream, rdv, ring_m, 0, d, d, 0, a->kv_cap,
                 a->c_cap, a->kv, a->cc, a->zz, (const float *)NULL, (const float *)NULL, a->kv_prod);
        run = launched("attn_step41 rings");
    }
    if (run && a->kv_prod) {
        launch_k(k_ring_pack, (unsigned)cdiv((int64_t)R * cdiv(d, 32), 256), 256, 0, stream, rdv, d, a->kv_cap, a->kv);
        run = launched("attn_step41 packed window ring");
    }
    if (!run)
        out_fail(a->o, bo);
    op_end();
}
