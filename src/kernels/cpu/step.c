/* CPU backend, the step-level ops: memory, V4 attention's stateful part, routing, the routed
 * experts. These are the reference the GPU's versions are checked against; each row is
 * computed in one fixed order whatever else is in the step. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu.h"
#include "kernels/kv_format.h"

void *dsv4_cpu_alloc(size_t bytes) { return calloc(1, bytes ? bytes : 1); }
void dsv4_cpu_free(void *p) { free(p); }
void dsv4_cpu_copy(void *dst, const void *src, size_t bytes)
{
    if (bytes)
        memmove(dst, src, bytes);
}

void dsv4_pool_group(const dsv4_pool *cp, const float *cring, const float *zring, int c_cap, int64_t w, float *out)
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

/* A heap of the k kept with the worst at its root, so n entries cost n log k. The order is
 * total, so the set is the one a full sort would give. */
int64_t dsv4_best_k(dsv4_scored *v, int64_t n, int k)
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
    int64_t n = dsv4_best_k(tmp, nvis, k);
    for (int64_t i = 0; i < n; i++)
        sel[i] = tmp[i].w;
    qsort(sel, n, sizeof *sel, by_index);
    return (int)n;
}

/* Row `tok` of a per-token stream of sequence s: from the step's rows when the step holds it,
 * else from the ring. */
static const float *tok_row(const dsv4_attn_args *a, int s, int64_t tok, const float *step, const float *ring, int cap,
                            int width)
{
    const dsv4_rows *rw = &a->rows;
    if (tok >= rw->start[s])
        return step + (rw->first[s] + (tok - rw->start[s])) * (int64_t)width;
    return ring + (tok % cap) * (int64_t)width;
}

/* Entry w of compressor cp for sequence s: the group's c, z rows gathered into small rings
 * of 2m rows, pooled, normed and roped at position w m. */
static void emit(const dsv4_attn_args *a, int s, const dsv4_pool *cp, const float *cs, const float *zs, const float *cr,
                 const float *zr, int64_t w, float *out)
{
    int mr = cp->ratio, cw = (1 + cp->overlap) * cp->dim, cap = 2 * mr;
    float *gc = malloc((size_t)cap * cw * sizeof(float)), *gz = malloc((size_t)cap * cw * sizeof(float));
    if (!gc || !gz) { /* never a silently wrong entry */
        for (int i = 0; i < cp->dim; i++)
            out[i] = NAN;
        free(gc);
        free(gz);
        return;
    }
    for (int64_t tok = (w > 0 && cp->overlap ? w - 1 : w) * mr; tok < (w + 1) * mr; tok++) {
        memcpy(gc + (tok % cap) * cw, tok_row(a, s, tok, cs, cr, a->c_cap, cw), cw * sizeof(float));
        memcpy(gz + (tok % cap) * cw, tok_row(a, s, tok, zs, zr, a->c_cap, cw), cw * sizeof(float));
    }
    dsv4_pool_group(cp, gc, gz, cap, w, out);
    const dsv4_backend *be = dsv4_backend_cpu();
    be->rmsnorm(out, 1, cp->dim, cp->norm, a->eps, out);
    int64_t p = w * cp->ratio;
    be->rope(out, 1, cp->dim, 1, cp->dim, a->rd, a->inv_freq, &p, 0);
    free(gc);
    free(gz);
}

/* The indexer scores entries in tiles of this many against a running top-k, so its scratch is
 * [topk + tile] whatever the context. */
#define INDEX_TILE 1024

/* The topk entries of highest score for row r, ascending (the scores and their order are the
 * same as one pass over every entry gives). kt: [INDEX_TILE, ci] unpacked keys (production);
 * best: [topk + INDEX_TILE]. */
static int index_select(const dsv4_attn_args *a, const dsv4_lbufs *b, int r, int64_t nvis, int64_t *sel,
                        dsv4_scored *best, float *kt)
{
    const float *qi = a->qi + (int64_t)r * a->nI * a->ci, *wt = a->wt + (int64_t)r * a->nI;
    float isq = 1.0f / sqrtf((float)a->ci);
    int ci = a->ci, rb = dsv4_kv_row_bytes(DSV4_KV_INDEX, ci);
    int64_t n = 0;
    for (int64_t w0 = 0; w0 < nvis; w0 += INDEX_TILE) {
        int nt = nvis - w0 < INDEX_TILE ? (int)(nvis - w0) : INDEX_TILE;
        const float *keys = b->ikey ? b->ikey + w0 * ci : kt;
        if (a->kv_prod)
            for (int i = 0; i < nt; i++)
                dsv4_kv_unpack(DSV4_KV_INDEX, b->pikey + (w0 + i) * rb, ci, kt + (int64_t)i * ci);
        for (int i = 0; i < nt; i++) {
            float sc = 0;
            for (int h = 0; h < a->nI; h++) {
                float dp = dsv4_dot(qi + (int64_t)h * ci, keys + (int64_t)i * ci, ci);
                sc += wt[h] * a->iw_scale * (dp > 0 ? dp : 0);
            }
            best[n + i].s = sc * isq;
            best[n + i].w = w0 + i;
        }
        n = dsv4_best_k(best, n + nt, a->topk);
    }
    return dsv4_topk_ascending(best, n, a->topk, sel);
}

/* Rows of a per-token stream into a ring: only each sequence's last `cap` rows, so no two
 * rows of a step share a slot. pack: the ring holds WINDOW rows of `width` values. */
static void ring_store(const dsv4_attn_args *a, const float *step, void *const *rings, int cap, int width, int pack)
{
    const dsv4_rows *rw = &a->rows;
    size_t rb = pack ? (size_t)dsv4_kv_row_bytes(DSV4_KV_WINDOW, width) : (size_t)width * sizeof(float);
    for (int r = 0; r < rw->R; r++) {
        int s = rw->seq[r];
        int64_t end = rw->start[s] + ((s + 1 < rw->S ? rw->first[s + 1] : rw->R) - rw->first[s]);
        if (rw->pos[r] + cap < end)
            continue;
        uint8_t *dst = (uint8_t *)rings[s] + (size_t)(rw->pos[r] % cap) * rb;
        if (pack)
            dsv4_kv_pack(DSV4_KV_WINDOW, step + (int64_t)r * width, width, dst);
        else
            memcpy(dst, step + (int64_t)r * width, width * sizeof(float));
    }
}

static double index_s;
double dsv4_index_seconds(void) { return index_s; }
void dsv4_index_seconds_add(double s) { index_s += s; }

size_t dsv4_cpu_attn_work(const dsv4_attn_args *a)
{
    (void)a; /* attn_step takes its own scratch, bounded per row */
    return 0;
}

void dsv4_cpu_attn_step(const dsv4_attn_args *a)
{
    const dsv4_rows *rw = &a->rows;
    int R = rw->R, d = a->d, cw = (1 + a->csa) * d, ci = a->ci, prod = a->kv_prod;
    int64_t Hd = (int64_t)a->H * d;
    size_t rw_b = (size_t)dsv4_kv_row_bytes(DSV4_KV_WINDOW, d), re_b = (size_t)dsv4_kv_row_bytes(DSV4_KV_MAIN, d),
           ri_b = (size_t)dsv4_kv_row_bytes(DSV4_KV_INDEX, ci > 0 ? ci : 2);
    float *ebuf = malloc((size_t)(d > ci ? d : ci) * sizeof(float));
    int64_t vis = a->ratio ? a->vis_cap : 0, nek = a->csa ? a->topk : vis;
    /* production: this step's window rows as they are stored; unpacked ring rows and entries */
    float *kvq = prod ? malloc((size_t)R * d * sizeof(float)) : NULL, *wk = prod ? malloc((size_t)a->window * d * sizeof(float)) : NULL;
    float *ek = prod && nek ? malloc((size_t)nek * d * sizeof(float)) : NULL;
    float *kt = prod && a->csa ? malloc((size_t)INDEX_TILE * ci * sizeof(float)) : NULL;
    uint8_t *rowb = prod ? malloc(rw_b) : NULL;
    const float **keys = malloc((a->window + nek + 1) * sizeof *keys);
    int64_t *sel = malloc(((a->csa ? a->topk : 0) + 1) * sizeof *sel);
    dsv4_scored *best = malloc(((a->csa ? a->topk : 0) + INDEX_TILE) * sizeof *best);
    if (!ebuf || !keys || !sel || !best || (prod && (!kvq || !wk || (nek && !ek) || (a->csa && !kt) || !rowb))) {
        for (int64_t i = 0; i < (int64_t)R * Hd; i++)
            a->o[i] = NAN;
        R = 0;
    }
    if (a->ratio)
        for (int r = 0; r < R; r++) {
            int s = rw->seq[r];
            int64_t p = rw->pos[r];
            if ((p + 1) % a->ratio)
                continue;
            int64_t w = p / a->ratio;
            const dsv4_lbufs *b = &a->st[s];
            emit(a, s, &a->comp, a->cc, a->zz, b->c, b->z, w, prod ? ebuf : b->ent + w * d);
            if (prod)
                dsv4_kv_pack(DSV4_KV_MAIN, ebuf, d, b->pent + w * re_b);
            if (a->csa) {
                emit(a, s, &a->icomp, a->ic, a->iz, b->ic, b->iz, w, prod ? ebuf : b->ikey + w * ci);
                if (prod)
                    dsv4_kv_pack(DSV4_KV_INDEX, ebuf, ci, b->pikey + w * ri_b);
            }
        }
    for (int r = 0; r < R && prod; r++) {
        dsv4_kv_pack(DSV4_KV_WINDOW, a->kv + (int64_t)r * d, d, rowb);
        dsv4_kv_unpack(DSV4_KV_WINDOW, rowb, d, kvq + (int64_t)r * d);
    }
    const dsv4_backend *be = dsv4_backend_cpu();
    int ek_seq = -1;
    int64_t ek_n = 0;
    for (int r = 0; r < R; r++) {
        int s = rw->seq[r];
        const dsv4_lbufs *b = &a->st[s];
        int64_t p = rw->pos[r];
        int nk = 0;
        if (a->ratio) {
            int64_t nvis = (p + 1) / a->ratio;
            if (a->csa) {
                double t0 = dsv4_now();
                int n = index_select(a, b, r, nvis, sel, best, kt);
                index_s += dsv4_now() - t0;
                for (int i = 0; i < n; i++) {
                    if (prod)
                        dsv4_kv_unpack(DSV4_KV_MAIN, b->pent + sel[i] * re_b, d, ek + (int64_t)i * d);
                    keys[nk++] = prod ? ek + (int64_t)i * d : b->ent + sel[i] * d;
                }
            } else {
                if (prod && ek_seq != s) { /* a sequence's rows are consecutive: its entries unpack once a step */
                    ek_seq = s;
                    ek_n = 0;
                }
                for (; prod && ek_n < nvis; ek_n++)
                    dsv4_kv_unpack(DSV4_KV_MAIN, b->pent + ek_n * re_b, d, ek + ek_n * d);
                for (int64_t w = 0; w < nvis; w++)
                    keys[nk++] = prod ? ek + w * d : b->ent + w * d;
            }
        }
        int nw = 0;
        for (int64_t j = p - a->window + 1 < 0 ? 0 : p - a->window + 1; j <= p; j++, nw++) {
            if (!prod)
                keys[nk++] = tok_row(a, s, j, a->kv, b->kv, a->kv_cap, d);
            else if (j >= rw->start[s])
                keys[nk++] = tok_row(a, s, j, kvq, NULL, a->kv_cap, d);
            else {
                dsv4_kv_unpack(DSV4_KV_WINDOW, b->pkv + (size_t)(j % a->kv_cap) * rw_b, d, wk + (int64_t)nw * d);
                keys[nk++] = wk + (int64_t)nw * d;
            }
        }
        be->attend(a->q + (int64_t)r * Hd, a->H, d, keys, nk, a->scale, a->sink, a->o + (int64_t)r * Hd);
    }
    free(ebuf);
    free(kvq);
    free(wk);
    free(ek);
    free(kt);
    free(rowb);
    free(keys);
    free(sel);
    free(best);
    void **rings = malloc((size_t)rw->S * sizeof *rings);
    if (!rings)
        return;
    for (int k = 0; k < 5; k++) {
        const float *step[5] = {a->kv, a->cc, a->zz, a->ic, a->iz};
        int cap = k ? a->c_cap : a->kv_cap, width = k == 0 ? d : k < 3 ? cw : 2 * ci;
        if ((k > 0 && !a->ratio) || (k > 2 && !a->csa))
            continue;
        for (int s = 0; s < rw->S; s++) {
            const dsv4_lbufs *b = &a->st[s];
            void *rs[5] = {prod ? (void *)b->pkv : (void *)b->kv, b->c, b->z, b->ic, b->iz};
            rings[s] = rs[k];
        }
        ring_store(a, step[k], rings, cap, width, k == 0 && prod);
    }
    free(rings);
}

static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

void dsv4_cpu_route(const float *lg, int R, int E, int K, const float *bias, const int32_t *tid2eid, const int32_t *ids,
                      int norm, float route_scale, int32_t *eid, float *wts)
{
    float *sc = malloc((size_t)E * sizeof(float));
    for (int r = 0; r < R; r++) {
        int32_t *ch = eid + (int64_t)r * K;
        if (!sc) {
            for (int k = 0; k < K; k++) {
                ch[k] = 0;
                wts[(int64_t)r * K + k] = NAN;
            }
            continue;
        }
        for (int e = 0; e < E; e++)
            sc[e] = sqrtf(softplus(lg[(int64_t)r * E + e]));
        if (tid2eid) {
            for (int k = 0; k < K; k++)
                ch[k] = tid2eid[(int64_t)ids[r] * K + k];
        } else {
            for (int k = 0; k < K; k++) { /* k-th best of score + bias, ties to the lower expert */
                int best = -1;
                float bv = 0;
                for (int e = 0; e < E; e++) {
                    int used = 0;
                    for (int j = 0; j < k && !used; j++)
                        used = ch[j] == e;
                    float v = sc[e] + (bias ? bias[e] : 0.0f);
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
            if (norm)
                w = w / (sum + 1e-20f);
            wts[(int64_t)r * K + k] = w * route_scale;
        }
    }
    free(sc);
}

/* One product of the experts op: linear, with REF's quantized input and bf16 output. */
static void ex_lin(const dsv4_weight *w, int64_t nout, float *x, int n, float *y, int ref)
{
    if (ref && (w->form == DSV4_WF_FP8 || w->form == DSV4_WF_FP4))
        for (int i = 0; i < n; i++)
            dsv4_fp8_roundtrip(x + (int64_t)i * w->k, w->k, dsv4_act_block(w));
    dsv4_backend_cpu()->linear(w, 0, nout, x, n, w->k, y, nout);
    if (ref)
        dsv4_round_bf16(y, (int64_t)n * nout);
}

/* Rows routed to an expert are gathered and projected together (a row's product does not
 * depend on its neighbours); each row's sum then runs over its experts in selection order. */
void dsv4_cpu_experts(const dsv4_experts_args *a)
{
    int R = a->R, K = a->K, D = a->D, I = a->I;
    float *Y = malloc((size_t)R * K * D * sizeof(float)), *xb = malloc((size_t)R * K * D * sizeof(float));
    float *xq = malloc((size_t)R * K * D * sizeof(float));
    float *g = malloc((size_t)R * K * I * sizeof(float)), *u = malloc((size_t)R * K * I * sizeof(float));
    int *rows = malloc((size_t)R * K * sizeof(int));
    if (!Y || !xb || !xq || !g || !u || !rows) {
        for (int64_t i = 0; i < (int64_t)R * D; i++)
            a->y[i] = NAN;
        goto out;
    }
    for (int e = 0; e < a->E; e++) {
        int n = 0;
        for (int i = 0; i < R * K; i++)
            if (a->eid[i] == e) {
                rows[n] = i;
                memcpy(xb + (int64_t)n * D, a->x + (int64_t)(i / K) * D, D * sizeof(float));
                n++;
            }
        if (!n)
            continue;
        memcpy(xq, xb, (size_t)n * D * sizeof(float));
        ex_lin(&a->w1[e], I, xq, n, g, a->ref);
        memcpy(xq, xb, (size_t)n * D * sizeof(float));
        ex_lin(&a->w3[e], I, xq, n, u, a->ref);
        dsv4_backend_cpu()->swiglu(g, u, (int64_t)n * I, a->limit, g);
        if (a->pre_weight)
            for (int i = 0; i < n; i++)
                for (int j = 0; j < I; j++)
                    g[(int64_t)i * I + j] *= a->wts[rows[i]];
        if (a->ref)
            dsv4_round_bf16(g, (int64_t)n * I);
        ex_lin(&a->w2[e], D, g, n, xb, a->ref);
        for (int i = 0; i < n; i++)
            memcpy(Y + (int64_t)rows[i] * D, xb + (int64_t)i * D, D * sizeof(float));
    }
    for (int r = 0; r < R; r++)
        for (int dd = 0; dd < D; dd++) {
            float s = 0;
            for (int k = 0; k < K; k++)
                s += (a->pre_weight ? 1.0f : a->wts[r * K + k]) * Y[((int64_t)r * K + k) * D + dd];
            a->y[(int64_t)r * D + dd] = s;
        }
out:
    free(Y);
    free(xb);
    free(xq);
    free(g);
    free(u);
    free(rows);
}

void dsv4_cpu_add(const float *a, const float *b, int64_t n, float *y)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = a[i] + b[i];
}

void dsv4_cpu_scale(const float *x, int64_t n, float s, float *y)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = x[i] * s;
}

void dsv4_cpu_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows)
{
    for (size_t r = 0; r < rows; r++)
        memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
}
