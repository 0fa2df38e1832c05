/* The DeepSeek-V4 forward pass, written once against the backend op table.
 *
 * A step takes rows (sequence, token) from several sequences. Projections run over all rows
 * at once; the stateful part of attention (window ring, compressor windows, indexer) runs
 * token by token in position order, so a row is computed the same way however the prompt
 * was chunked and whatever else shares the step. Shapes: R rows, D model width, n streams,
 * H heads of d, rd rope dims, m compression ratio. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "model/model.h"

typedef dsv4_step fwd;


void dsv4_pool_group(const dsv4_compressor *cp, const float *cring, const float *zring, int c_cap, int64_t w, float *out)
{
    int mr = cp->ratio, dim = cp->dim, cw = (1 + cp->overlap) * dim, off = cp->overlap ? dim : 0;
    int nslot = (cp->overlap && w > 0) ? 2 * mr : mr;
    float lg[2 * DSV4_MAX_RATIO], vv[2 * DSV4_MAX_RATIO];
    for (int ch = 0; ch < dim; ch++) {
        int s = 0;
        if (nslot == 2 * mr)
            for (int j = 0; j < mr; j++) {
                int64_t tok = (w - 1) * mr + j, slot = tok % c_cap;
                vv[s] = cring[slot * cw + ch];
                lg[s++] = zring[slot * cw + ch] + (cp->ape ? cp->ape[(int64_t)j * cw + ch] : 0.0f);
            }
        for (int j = 0; j < mr; j++) {
            int64_t tok = w * mr + j, slot = tok % c_cap;
            vv[s] = cring[slot * cw + off + ch];
            lg[s++] = zring[slot * cw + off + ch] + (cp->ape ? cp->ape[(int64_t)j * cw + off + ch] : 0.0f);
        }
        float mx = -INFINITY, den = 0, acc = 0;
        for (int i = 0; i < s; i++)
            mx = fmaxf(mx, lg[i]);
        for (int i = 0; i < s; i++) {
            float e = expf(lg[i] - mx);
            den += e;
            acc += e * vv[i];
        }
        out[ch] = acc / den;
    }
}

/* Compressed entry w of one compressor: the pooled group, then the weighted norm and the
 * compressed rope at position w*m. */
static void emit_entry(const fwd *f, const dsv4_compressor *cp, const float *cring, const float *zring, int c_cap,
                       int64_t w, float *out)
{
    const dsv4_model *m = f->m;
    dsv4_pool_group(cp, cring, zring, c_cap, w, out);
    f->be->rmsnorm(out, 1, cp->dim, cp->norm, (float)m->cfg.norm_eps, out);
    int64_t p = w * cp->ratio;
    f->be->rope(out, 1, cp->dim, 1, cp->dim, m->cfg.rope_dim, m->inv_freq_compress, &p, 0);
}

static int by_index(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* The family's order for every top-k: descending score, ties to the lower index; a ranks
 * below b when its score is lower, or equal at a higher index. */
static int worse(const dsv4_scored *a, const dsv4_scored *b) { return a->s < b->s || (a->s == b->s && a->w > b->w); }

static void sift_down(dsv4_scored *h, int n, int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && worse(&h[l], &h[m]))
            m = l;
        if (r < n && worse(&h[r], &h[m]))
            m = r;
        if (m == i)
            return;
        dsv4_scored t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* The k best of v[0..n) by the family's order, moved to v[0..k) (unordered): a heap of the k
 * kept with the worst at its root, so n entries cost n log k. The order is total, so the set
 * is the one a full sort would give. */
static int64_t best_k(dsv4_scored *v, int64_t n, int k)
{
    if (n <= k)
        return n;
    for (int i = k / 2 - 1; i >= 0; i--)
        sift_down(v, k, i);
    for (int64_t j = k; j < n; j++)
        if (worse(&v[0], &v[j])) {
            v[0] = v[j];
            sift_down(v, k, 0);
        }
    return k;
}

int dsv4_topk_ascending(dsv4_scored *tmp, int64_t nvis, int k, int64_t *sel)
{
    int64_t n = best_k(tmp, nvis, k);
    for (int64_t i = 0; i < n; i++)
        sel[i] = tmp[i].w;
    qsort(sel, n, sizeof *sel, by_index);
    return (int)n;
}

int64_t dsv4_best_k(dsv4_scored *v, int64_t n, int k) { return best_k(v, n, k); }

/* Indexer selection for one query: the index_topk entries of highest score among the nvis
 * visible ones (ties to the lower entry), returned in ascending entry order. */
static int index_select(const fwd *f, const float *qi, const float *wt, const float *ikey, int64_t nvis, int64_t *sel,
                        dsv4_scored *tmp)
{
    const dsv4_config *c = &f->m->cfg;
    int nI = c->index_heads, ci = c->index_dim, k = c->index_topk;
    float isq = 1.0f / sqrtf((float)ci);
    for (int64_t w = 0; w < nvis; w++) {
        float s = 0;
        for (int h = 0; h < nI; h++) {
            float dp = dsv4_dot(qi + (int64_t)h * ci, ikey + w * ci, ci);
            s += wt[h] * (dp > 0 ? dp : 0);
        }
        tmp[w].s = s * isq;
        tmp[w].w = w;
    }
    return dsv4_topk_ascending(tmp, nvis, k, sel);
}

static int attention(fwd *f, int li, const float *a, float *y, dsv4_err *err)
{
    dsv4_model *m = f->m;
    const dsv4_config *c = &m->cfg;
    const dsv4_backend *be = f->be;
    const dsv4_layer *L = &m->layers[li];
    int R = f->R, H = c->n_heads, d = c->head_dim, rd = c->rope_dim, W = c->window;
    int64_t Hd = (int64_t)H * d;
    float eps = (float)c->norm_eps;
    const float *freq = L->ratio ? m->inv_freq_compress : m->inv_freq_main;
    int cw = (1 + L->csa) * d, nI = c->index_heads, ci = c->index_dim;
    float *qr = dsv4_fbuf((size_t)R * c->q_lora, err), *q = dsv4_fbuf((size_t)R * Hd, err), *kv = dsv4_fbuf((size_t)R * d, err);
    float *o = dsv4_fbuf((size_t)R * Hd, err), *t = dsv4_fbuf((size_t)R * c->o_groups * c->o_lora, err);
    float *cc = NULL, *zz = NULL, *ic = NULL, *iz = NULL, *qi = NULL, *wt = NULL;
    if (L->ratio) {
        cc = dsv4_fbuf((size_t)R * cw, err);
        zz = dsv4_fbuf((size_t)R * cw, err);
    }
    if (L->csa) {
        ic = dsv4_fbuf((size_t)R * 2 * ci, err);
        iz = dsv4_fbuf((size_t)R * 2 * ci, err);
        qi = dsv4_fbuf((size_t)R * nI * ci, err);
        wt = dsv4_fbuf((size_t)R * nI, err);
    }
    int rc = err && err->code;
    if (rc)
        goto out;

    be->linear(&L->wq_a, 0, c->q_lora, a, R, c->dim, qr, c->q_lora);
    be->rmsnorm(qr, R, c->q_lora, L->q_norm, eps, qr);
    be->linear(&L->wq_b, 0, Hd, qr, R, c->q_lora, q, Hd);
    be->rmsnorm(q, (int64_t)R * H, d, NULL, eps, q);
    be->rope(q, R, Hd, H, d, rd, freq, f->pos, 0);
    be->linear(&L->wkv, 0, d, a, R, c->dim, kv, d);
    be->rmsnorm(kv, R, d, L->kv_norm, eps, kv);
    be->rope(kv, R, d, 1, d, rd, freq, f->pos, 0);
    if (L->ratio) {
        be->linear(&L->comp.wkv, 0, cw, a, R, c->dim, cc, cw);
        be->linear(&L->comp.wgate, 0, cw, a, R, c->dim, zz, cw);
    }
    if (L->csa) {
        be->linear(&L->icomp.wkv, 0, 2 * ci, a, R, c->dim, ic, 2 * ci);
        be->linear(&L->icomp.wgate, 0, 2 * ci, a, R, c->dim, iz, 2 * ci);
        be->linear(&L->iwq_b, 0, (int64_t)nI * ci, qr, R, c->q_lora, qi, (int64_t)nI * ci);
        be->rope(qi, R, (int64_t)nI * ci, nI, ci, rd, m->inv_freq_compress, f->pos, 0);
        be->linear(&L->iweights, 0, nI, a, R, c->dim, wt, nI);
        float s = 1.0f / sqrtf((float)nI);
        for (int64_t i = 0; i < (int64_t)R * nI; i++)
            wt[i] *= s;
    }

    /* Stateful part, token by token in position order within each sequence. */
    int64_t max_vis = 0;
    for (int r = 0; r < R; r++) {
        int64_t v = L->ratio ? (f->pos[r] + 1) / L->ratio : 0;
        if (v > max_vis)
            max_vis = v;
    }
    const float **keys = malloc((W + max_vis + 1) * sizeof *keys);
    int64_t *sel = malloc((max_vis + 1) * sizeof *sel);
    dsv4_scored *tmp = malloc((max_vis + 1) * sizeof *tmp);
    float scale = 1.0f / sqrtf((float)d);
    for (int r = 0; r < R; r++) {
        dsv4_seq *s = f->b->seqs[f->row_seq[r]];
        dsv4_lstate *ls = &s->L[li];
        int64_t p = f->pos[r];
        memcpy(ls->kv + (p % s->kv_cap) * d, kv + (int64_t)r * d, d * sizeof(float));
        int nk = 0;
        if (L->ratio) {
            int c_cap = (1 + L->csa) * L->ratio + m->max_rollback;
            int64_t slot = p % c_cap;
            memcpy(ls->c + slot * cw, cc + (int64_t)r * cw, cw * sizeof(float));
            memcpy(ls->z + slot * cw, zz + (int64_t)r * cw, cw * sizeof(float));
            if (L->csa) {
                memcpy(ls->ic + slot * 2 * ci, ic + (int64_t)r * 2 * ci, 2 * ci * sizeof(float));
                memcpy(ls->iz + slot * 2 * ci, iz + (int64_t)r * 2 * ci, 2 * ci * sizeof(float));
            }
            if ((p + 1) % L->ratio == 0) {
                int64_t w = p / L->ratio;
                emit_entry(f, &L->comp, ls->c, ls->z, c_cap, w, ls->ent + w * d);
                if (L->csa)
                    emit_entry(f, &L->icomp, ls->ic, ls->iz, c_cap, w, ls->ikey + w * ci);
            }
            int64_t nvis = (p + 1) / L->ratio;
            if (L->csa) {
                int n = index_select(f, qi + (int64_t)r * nI * ci, wt + (int64_t)r * nI, ls->ikey, nvis, sel, tmp);
                for (int i = 0; i < n; i++)
                    keys[nk++] = ls->ent + sel[i] * d;
            } else {
                for (int64_t w = 0; w < nvis; w++)
                    keys[nk++] = ls->ent + w * d;
            }
        }
        for (int64_t j = p - W + 1 < 0 ? 0 : p - W + 1; j <= p; j++)
            keys[nk++] = ls->kv + (j % s->kv_cap) * d;
        be->attend(q + (int64_t)r * Hd, H, d, keys, nk, scale, L->sink, o + (int64_t)r * Hd);
    }
    free(keys);
    free(sel);
    free(tmp);

    be->rope(o, R, Hd, H, d, rd, freq, f->pos, 1);
    int G = c->o_groups, rk = c->o_lora;
    int64_t gw = Hd / G;
    for (int g = 0; g < G; g++)
        be->linear(&L->wo_a, (int64_t)g * rk, (int64_t)(g + 1) * rk, o + g * gw, R, Hd, t + (int64_t)g * rk, (int64_t)G * rk);
    be->linear(&L->wo_b, 0, c->dim, t, R, (int64_t)G * rk, y, c->dim);
out:
    free(qr);
    free(q);
    free(kv);
    free(o);
    free(t);
    free(cc);
    free(zz);
    free(ic);
    free(iz);
    free(qi);
    free(wt);
    return rc;
}

static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* Routed experts (top-k of score + bias, or the hash table's experts) plus the shared
 * expert. Rows routed to an expert are gathered and projected together; each row's
 * weighted sum runs over its chosen experts in selection order. V4 weights each expert's
 * output; V4.1 weights the expert's hidden activation before w2 (spec §8), and in REF
 * numerics rounds that activation and each projection to bf16. x: [R, D], y: [R, D]. */
int dsv4_moe(const dsv4_model *m, int li, const int32_t *ids, int R, const float *x, float *y, dsv4_err *err)
{
    const dsv4_config *c = &m->cfg;
    const dsv4_layer *L = &m->layers[li];
    int D = c->dim, E = c->n_experts, K = c->n_active, I = c->moe_inter;
    int v41 = c->family == DSV4_FAMILY_V41;
    float lim = (float)c->swiglu_limit;
    float *lg = dsv4_fbuf((size_t)R * E, err), *Y = dsv4_fbuf((size_t)R * K * D, err), *wts = dsv4_fbuf((size_t)R * K, err);
    int *eid = malloc((size_t)R * K * sizeof(int)), *cnt = calloc(E, sizeof(int)), *rows = malloc((size_t)R * K * sizeof(int));
    int64_t SI = (int64_t)I * (c->n_shared > 0 ? c->n_shared : 1), HI = SI > I ? SI : I;
    float *xb = dsv4_fbuf((size_t)R * D, err), *g = dsv4_fbuf((size_t)R * HI, err), *u = dsv4_fbuf((size_t)R * HI, err);
    float *yb = dsv4_fbuf((size_t)R * D, err), *ys = dsv4_fbuf((size_t)R * D, err);
    int rc = (err && err->code) || !eid || !cnt || !rows;
    if (rc) {
        if (!err->code)
            dsv4_fail(err, DSV4_E_NOMEM, "out of memory in the MoE");
        rc = err->code;
        goto out;
    }
    dsv4_lin(m, &L->gate, 0, E, x, R, D, lg, E, DSV4_LIN_F32OUT | DSV4_LIN_NOQ);
    for (int r = 0; r < R; r++) {
        float *sc = lg + (int64_t)r * E;
        for (int e = 0; e < E; e++)
            sc[e] = sqrtf(softplus(sc[e]));
        int *ch = eid + r * K;
        if (L->hash) {
            for (int k = 0; k < K; k++)
                ch[k] = L->tid2eid[(int64_t)ids[r] * K + k];
        } else {
            for (int k = 0; k < K; k++) { /* k-th best of score + bias, ties to the lower expert */
                int best = -1;
                float bv = 0;
                for (int e = 0; e < E; e++) {
                    int used = 0;
                    for (int j = 0; j < k && !used; j++)
                        used = ch[j] == e;
                    float v = sc[e] + L->gate_bias[e];
                    if (!used && (best < 0 || v > bv)) {
                        best = e;
                        bv = v;
                    }
                }
                ch[k] = best;
            }
        }
        float sum = 0;
        for (int k = 0; k < K; k++)
            sum += sc[ch[k]];
        for (int k = 0; k < K; k++) {
            float w = sc[ch[k]];
            if (c->norm_topk)
                w = w / (sum + 1e-20f);
            wts[r * K + k] = w * (float)c->route_scale;
            cnt[ch[k]]++;
        }
    }
    for (int e = 0; e < E; e++) {
        if (!cnt[e])
            continue;
        int n = 0;
        for (int i = 0; i < R * K; i++)
            if (eid[i] == e) {
                rows[n] = i;
                memcpy(xb + (int64_t)n * D, x + (int64_t)(i / K) * D, D * sizeof(float));
                n++;
            }
        dsv4_lin(m, &L->w1[e], 0, I, xb, n, D, g, I, 0);
        dsv4_lin(m, &L->w3[e], 0, I, xb, n, D, u, I, 0);
        m->be->swiglu(g, u, (int64_t)n * I, lim, g);
        if (v41)
            for (int i = 0; i < n; i++)
                for (int j = 0; j < I; j++)
                    g[(int64_t)i * I + j] *= wts[rows[i]];
        dsv4_rnd(m, g, (int64_t)n * I);
        dsv4_lin(m, &L->w2[e], 0, D, g, n, I, yb, D, 0);
        for (int i = 0; i < n; i++)
            memcpy(Y + (int64_t)rows[i] * D, yb + (int64_t)i * D, D * sizeof(float));
    }
    if (c->n_shared > 0) {
        dsv4_lin(m, &L->sw1, 0, SI, x, R, D, g, SI, 0);
        dsv4_lin(m, &L->sw3, 0, SI, x, R, D, u, SI, 0);
        m->be->swiglu(g, u, (int64_t)R * SI, lim, g);
        dsv4_rnd(m, g, (int64_t)R * SI);
        dsv4_lin(m, &L->sw2, 0, D, g, R, SI, ys, D, 0);
    } else
        memset(ys, 0, (size_t)R * D * sizeof(float));
    for (int r = 0; r < R; r++)
        for (int dd = 0; dd < D; dd++) {
            float s = 0;
            for (int k = 0; k < K; k++)
                s += (v41 ? 1.0f : wts[r * K + k]) * Y[((int64_t)r * K + k) * D + dd];
            y[(int64_t)r * D + dd] = s + ys[(int64_t)r * D + dd];
        }
    dsv4_rnd(m, y, (int64_t)R * D);
out:
    free(lg);
    free(Y);
    free(wts);
    free(eid);
    free(cnt);
    free(rows);
    free(xb);
    free(g);
    free(u);
    free(yb);
    free(ys);
    return rc;
}

int dsv4_forward(dsv4_model *m, const dsv4_batch *b, dsv4_err *err)
{
    const dsv4_config *c = &m->cfg;
    const dsv4_backend *be = m->be;
    dsv4_err_clear(err);
    int R = 0;
    for (int i = 0; i < b->n_seqs; i++) {
        dsv4_seq *s = b->seqs[i];
        if (!s || s->m != m)
            return dsv4_fail(err, DSV4_E_ARG, "batch entry %d: sequence is NULL or belongs to another model", i);
        if (b->n_ids[i] < 0)
            return dsv4_fail(err, DSV4_E_ARG, "batch entry %d: negative token count", i);
        for (int j = 0; j < b->n_ids[i]; j++)
            if (b->ids[i][j] < 0 || b->ids[i][j] >= c->vocab)
                return dsv4_fail(err, DSV4_E_ARG, "batch entry %d: token %d = %d is outside the vocabulary (0..%d)", i, j,
                                 b->ids[i][j], c->vocab - 1);
        if (s->len + b->n_ids[i] > c->max_pos)
            return dsv4_fail(err, DSV4_E_ARG, "batch entry %d: %lld tokens would exceed the model's context of %lld", i,
                             (long long)(s->len + b->n_ids[i]), (long long)c->max_pos);
        for (int j = 0; j < i; j++)
            if (b->seqs[j] == s)
                return dsv4_fail(err, DSV4_E_ARG, "batch entries %d and %d are the same sequence", j, i);
        R += b->n_ids[i];
    }
    if (R == 0)
        return 0;
    for (int i = 0; i < b->n_seqs; i++)
        if (dsv4_seq_reserve(b->seqs[i], b->seqs[i]->len + b->n_ids[i], err))
            return err->code;
    int n = c->hc_mult, D = c->dim;
    fwd f = {.m = m, .be = be, .R = R, .b = b};
    f.pos = malloc(R * sizeof(int64_t));
    f.row_seq = malloc(R * sizeof(int));
    int32_t *ids = malloc(R * sizeof(int32_t));
    float *X = dsv4_fbuf((size_t)R * n * D, err), *h = dsv4_fbuf((size_t)R * D, err), *a = dsv4_fbuf((size_t)R * D, err);
    float *y = dsv4_fbuf((size_t)R * D, err), *pre = dsv4_fbuf((size_t)R * n, err), *post = dsv4_fbuf((size_t)R * n, err);
    float *comb = dsv4_fbuf((size_t)R * n * n, err);
    int rc = (err && err->code) || !f.pos || !f.row_seq || !ids;
    if (rc) {
        rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory for a step of %d rows", R);
        goto out;
    }
    for (int i = 0, r = 0; i < b->n_seqs; i++)
        for (int j = 0; j < b->n_ids[i]; j++, r++) {
            f.pos[r] = b->seqs[i]->len + j;
            f.row_seq[r] = i;
            ids[r] = b->ids[i][j];
        }
    f.ids = ids;

    for (int r = 0; r < R; r++) {
        dsv4_weight_row(&m->embed, ids[r], X + (int64_t)r * n * D);
        for (int i = 1; i < n; i++)
            memcpy(X + ((int64_t)r * n + i) * D, X + (int64_t)r * n * D, D * sizeof(float));
    }
    float eps = (float)c->norm_eps, hce = (float)c->hc_eps;
    if (c->family == DSV4_FAMILY_V41)
        rc = dsv4_v41_layers(&f, X, h, err);
    for (int li = 0; li < c->n_layers && !rc && c->family == DSV4_FAMILY_V4; li++) {
        const dsv4_layer *L = &m->layers[li];
        be->hc_pre(X, R, n, D, L->hc_attn_fn, L->hc_attn_base, L->hc_attn_scale, c->hc_iters, hce, eps, pre, post, comb, h);
        be->rmsnorm(h, R, D, L->attn_norm, eps, a);
        if ((rc = attention(&f, li, a, y, err)))
            break;
        be->hc_post(X, y, R, n, D, post, comb);
        be->hc_pre(X, R, n, D, L->hc_ffn_fn, L->hc_ffn_base, L->hc_ffn_scale, c->hc_iters, hce, eps, pre, post, comb, h);
        be->rmsnorm(h, R, D, L->ffn_norm, eps, a);
        if ((rc = dsv4_moe(m, li, ids, R, a, y, err)))
            break;
        be->hc_post(X, y, R, n, D, post, comb);
    }
    if (!rc && be->check) /* a device op failed: the sequences do not advance */
        rc = be->check(err);
    if (rc)
        goto out;
    for (int i = 0; i < b->n_seqs; i++) {
        b->seqs[i]->len += b->n_ids[i];
        if (b->seqs[i]->len > b->seqs[i]->hi)
            b->seqs[i]->hi = b->seqs[i]->len;
    }
    if (b->logits) {
        /* Head rows: every row, or each sequence's last. V4.1's layers already left the
         * final collapse in h; V4 collapses the selected rows with its head mix. */
        int v41 = c->family == DSV4_FAMILY_V41, nr = 0;
        for (int i = 0, r = 0; i < b->n_seqs; i++) {
            for (int j = 0; j < b->n_ids[i]; j++, r++)
                if (b->all_logits || j == b->n_ids[i] - 1) {
                    if (nr != r && v41)
                        memmove(h + (int64_t)nr * D, h + (int64_t)r * D, (size_t)D * sizeof(float));
                    else if (nr != r)
                        memmove(X + (int64_t)nr * n * D, X + (int64_t)r * n * D, (size_t)n * D * sizeof(float));
                    nr++;
                }
        }
        if (!v41)
            be->hc_pre(X, nr, n, D, m->hc_head_fn, m->hc_head_base, m->hc_head_scale, 0, hce, eps, pre, NULL, NULL, h);
        be->rmsnorm(h, nr, D, m->norm, eps, h);
        dsv4_rnd(m, h, (int64_t)nr * D);
        be->linear(&m->head, 0, c->vocab, h, nr, D, b->logits, c->vocab);
        if (be->check)
            rc = be->check(err);
    }
out:
    free(f.pos);
    free(f.row_seq);
    free(ids);
    free(X);
    free(h);
    free(a);
    free(y);
    free(pre);
    free(post);
    free(comb);
    return rc;
}
