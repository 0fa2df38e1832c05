/* The DeepSeek-V4.1 layers (spec §4-§9), on the same op table, rows and sequence state as V4.
 *
 * CSA2: KV-source layers emit compressed entries (and, when they are index sources, index
 * keys) into their own sequence state; the layers after them attend those entries. Index
 * sources choose each row's compressed entries; the choice (and the candidate source's
 * block filter) lives in this step's scratch and is read by the layers after it in the same
 * step, as the reference's shared runtime slots are. Every index source scores against its
 * KV source's keys as they stand after this row's group (decode == prefill, spec §7.2).
 *
 * Projections run over all rows; the stateful part is the backend's attn_step41 (its rule is in
 * kernels/backend.h), so a row is computed the same way however the prompt was chunked. Shapes: R rows, D width,
 * n streams, H heads of d, rd rope dims, nI index heads of ci, r compression ratio. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "model/engram.h"
#include "model/model.h"

/* This step's shared slots, per row: the latest index source's selection and the candidate
 * source's kept blocks. */
typedef struct v41_shared {
    int64_t *topk;           /* [R, index_topk] ascending entry ids */
    int *ntopk;              /* [R] */
    int64_t *cand;           /* [R, candidate_topk_blocks] kept block ids */
    int *ncand;              /* [R] */
    int64_t *ehash;          /* [R, n_engram, cols] Engram row ids */
} v41_shared;

/* The step's Engram rows, fetched ahead: streamed tables are read on a thread, layer by
 * layer, while the layers before each Engram layer compute. */
typedef struct prefetch {
    const dsv4_model *m;
    int R;
    const int64_t *ehash;
    float *rows;             /* [n_engram, R * cols, head_dim] */
    int done, rc;            /* Engram layers fetched; first error */
    dsv4_err err;
    uint64_t bytes;
    double gather_s, stall_s; /* reading rows (fetch thread); the forward waiting for them */
    pthread_mutex_t mu;
    pthread_cond_t cv;
} prefetch;

static void *fetch_all(void *arg)
{
    prefetch *pf = arg;
    const dsv4_config *c = &pf->m->cfg;
    int cols = pf->m->engram[0].cols, ne = c->n_engram;
    int64_t per = (int64_t)pf->R * cols;
    int64_t *ids = malloc(per * sizeof(int64_t));
    for (int ei = 0; ei < ne; ei++) {
        int rc = 0;
        if (!ids)
            rc = dsv4_fail(&pf->err, DSV4_E_NOMEM, "out of memory fetching Engram rows");
        for (int64_t i = 0; i < per && ids; i++)
            ids[i] = pf->ehash[(i / cols * ne + ei) * cols + i % cols];
        double t0 = dsv4_now();
        if (!rc)
            rc = dsv4_etable_rows(&pf->m->engram[ei].table, ids, (int)per, pf->rows + ei * per * c->engram_head_dim, &pf->bytes,
                                  &pf->err);
        pf->gather_s += dsv4_now() - t0;
        pthread_mutex_lock(&pf->mu);
        pf->done = rc ? ne : ei + 1;
        pf->rc = rc;
        pthread_cond_broadcast(&pf->cv);
        pthread_mutex_unlock(&pf->mu);
        if (rc)
            break;
    }
    free(ids);
    return NULL;
}

/* Waits for Engram layer ei's rows; returns its [R * cols, head_dim] block or NULL on error. */
static const float *rows_of(prefetch *pf, int ei, dsv4_err *err)
{
    double t0 = dsv4_now();
    pthread_mutex_lock(&pf->mu);
    while (pf->done <= ei)
        pthread_cond_wait(&pf->cv, &pf->mu);
    int rc = pf->rc;
    pthread_mutex_unlock(&pf->mu);
    pf->stall_s += dsv4_now() - t0;
    if (rc) {
        *err = pf->err;
        return NULL;
    }
    return pf->rows + (int64_t)ei * pf->R * pf->m->engram[0].cols * pf->m->cfg.engram_head_dim;
}

/* Engram row ids of every row: the compressed id enters the sequence's history at its
 * position, then the look-backs (pad once they cross the sequence start). */
static void engram_hashes(dsv4_step *f, v41_shared *sh)
{
    const dsv4_model *m = f->m;
    const dsv4_config *c = &m->cfg;
    int G = c->engram_max_ngram, ne = c->n_engram, cols = m->engram[0].cols;
    for (int r = 0; r < f->R; r++) {
        dsv4_seq *s = f->b->seqs[f->row_seq[r]];
        int64_t p = f->pos[r], tok[8];
        s->etok[p % s->e_cap] = m->token_map[f->ids[r]];
        for (int k = 0; k < G; k++)
            tok[k] = p - k >= 0 ? s->etok[(p - k) % s->e_cap] : m->engram_pad;
        for (int i = 0; i < ne; i++) {
            const dsv4_engram *e = &m->engram[i];
            dsv4_engram_hash(tok, e->mult, e->prime, e->offset, G, c->engram_heads, sh->ehash + ((int64_t)r * ne + i) * cols);
        }
    }
}

/* Engram at the input of its layer: the rows' table entries [cols * hd] projected to n keys
 * and one value [D]; each stream k gets value * sigmoid(signed sqrt of the normalised
 * (x_k * q_k * k_k) . key_k / sqrt(D)) added (spec §9.4). X: [R, n, D] in place. The rows
 * come from the host's fetch (pf), uploaded here, or are in backend memory already (dev:
 * every Engram layer's [R, cols * hd] block, uploaded before the layers). */
static int engram_apply(dsv4_step *f, int ei, prefetch *pf, const float *dev, float *X, dsv4_err *err)
{
    dsv4_model *m = f->m;
    const dsv4_config *c = &m->cfg;
    const dsv4_engram *e = &m->engram[ei];
    int R = f->R, n = c->hc_mult, D = c->dim, hd = c->engram_head_dim, cols = e->cols;
    int64_t ew = (int64_t)cols * hd, kw = (int64_t)(n + 1) * D;
    size_t mk = m->arena.off;
    const float *rows = dev ? dev + (int64_t)ei * R * ew : rows_of(pf, ei, err);
    float *E = rows && !dev ? dsv4_ftake(m, (size_t)R * ew, err) : (float *)rows;
    float *kv = rows ? dsv4_ftake(m, (size_t)R * kw, err) : NULL;
    int rc = !rows || (err && err->code);
    if (!rc) {
        /* [R, cols * hd]: each row's entries side by side */
        if (!dev)
            m->mem->upload(E, rows, (size_t)R * ew * sizeof(float));
        dsv4_rnd(m, E, (int64_t)R * ew);
        dsv4_lin(m, &e->wkv, 0, kw, E, R, ew, kv, kw, 0);
        m->be->engram_gate(X, kv, e->qk, R, n, D, (float)c->norm_eps, m->numerics == DSV4_NUMERICS_REF);
    }
    dsv4_release(m, mk);
    return rc;
}

/* Rope tables of a layer: the compressed layers' (YaRN) or the main one. */
static const float *freq_of(const dsv4_model *m, const dsv4_layer *L)
{
    return L->ratio ? m->inv_freq_compress : m->inv_freq_main;
}

void dsv4_v41_window_row(const dsv4_model *m, const dsv4_layer *L, const float *a, int R, const int64_t *pos, float *kv,
                         int packed)
{
    const dsv4_config *c = &m->cfg;
    int d = c->head_dim;
    dsv4_lin(m, &L->wkv, 0, d, a, R, c->dim, kv, d, 0);
    dsv4_norm(m, kv, R, d, L->kv_norm, (float)c->norm_eps, kv);
    dsv4_rope(m, kv, R, d, 1, d, c->rope_dim, freq_of(m, L), pos, 0);
    if (m->numerics == DSV4_NUMERICS_REF && !packed) /* a packed cache stores the round trip's codes itself */
        m->be->roundtrip(kv, (int64_t)R * d, 32, DSV4_RT_FP8);
}

void dsv4_v41_qkv(const dsv4_model *m, const dsv4_layer *L, const float *a, int R, const int64_t *pos, float *qr,
                  float *q, float *kv)
{
    const dsv4_config *c = &m->cfg;
    int H = c->n_heads, d = c->head_dim;
    int64_t Hd = (int64_t)H * d;
    dsv4_lin(m, &L->wq_a, 0, c->q_lora, a, R, c->dim, qr, c->q_lora, 0);
    dsv4_norm(m, qr, R, c->q_lora, L->q_norm, (float)c->norm_eps, qr);
    dsv4_lin(m, &L->wq_b, 0, Hd, qr, R, c->q_lora, q, Hd, 0);
    dsv4_rope(m, q, R, Hd, H, d, c->rope_dim, freq_of(m, L), pos, 0);
    dsv4_v41_window_row(m, L, a, R, pos, kv, m->kv_prod);
}

int dsv4_v41_attn_out(dsv4_model *m, const dsv4_layer *L, float *o, int R, const int64_t *pos, float *y,
                      dsv4_err *err)
{
    const dsv4_config *c = &m->cfg;
    int H = c->n_heads, d = c->head_dim, G = c->o_groups, rk = c->o_lora;
    int64_t Hd = (int64_t)H * d;
    size_t mk = m->arena.off;
    float *t = dsv4_ftake(m, (size_t)R * G * rk, err);
    if (!t)
        return err->code;
    dsv4_rnd(m, o, (int64_t)R * Hd);
    dsv4_rope(m, o, R, Hd, H, d, c->rope_dim, freq_of(m, L), pos, 1);
    /* the reference's grouped einsum runs on wo_a dequantized to bf16: no input quantization,
     * each group's rows as linear computes them, then the bf16 output */
    m->be->linear_blocks(&L->wo_a, G, o, R, t);
    dsv4_rnd(m, t, (int64_t)R * G * rk);
    dsv4_lin(m, &L->wo_b, 0, c->dim, t, R, (int64_t)G * rk, y, c->dim, 0);
    dsv4_release(m, mk);
    return 0;
}

/* One layer's attention over R rows: a [R, D] (attn_norm output) -> y [R, D]. The projections
 * run over all rows; the stateful part is the backend's attn_step41. */
static int attention(dsv4_step *f, int li, v41_shared *sh, const float *a, float *y, dsv4_err *err)
{
    dsv4_model *m = f->m;
    const dsv4_config *c = &m->cfg;
    const dsv4_backend *be = f->be;
    const dsv4_layer *L = &m->layers[li];
    int R = f->R, S = f->rows.S, H = c->n_heads, d = c->head_dim, rd = c->rope_dim, nI = c->index_heads,
        ci = c->index_dim, ref = m->numerics == DSV4_NUMERICS_REF;
    int64_t Hd = (int64_t)H * d;
    float eps = (float)c->norm_eps;
    if (!be->attn_step41)
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "%s: V4.1 attention is not on this backend", be->name);
    dsv4_attn41_args A = {.rows = f->rows, .st = f->st + (int64_t)li * S, .est = L->ratio ? f->st + (int64_t)L->kv_src * S : NULL,
                          .ist = L->index_source ? f->st + (int64_t)L->ikey_src * S : NULL, .kv_cap = f->kv_cap,
                          .c_cap = L->own_ent && L->ratio > 1 ? dsv4_c_cap(m, L) : 0,
                          .vis_cap = L->ratio ? f->vis_cap[L->kv_src] : 0, .H = H, .d = d, .rd = rd, .window = c->window,
                          .scale = 1.0f / sqrtf((float)d), .eps = eps, .sink = L->sink, .inv_freq = m->inv_freq_compress,
                          .ratio = L->ratio, .own_ent = L->own_ent, .own_ikey = L->own_ikey,
                          .index_source = L->index_source, .cand_source = L->cand_source, .cand_filter = L->cand_filter,
                          .comp = dsv4_pool_of(&L->comp), .iwk = &L->iwk, .ik_norm = L->ik_norm, .nI = nI, .ci = ci,
                          .topk = c->index_topk, .cand_bs = c->candidate_block_size, .cand_k = c->candidate_topk_blocks,
                          .ref = ref, .kv_prod = m->kv_prod, .sel = sh->topk, .cand = sh->cand, .nsel = sh->ntopk,
                          .ncand = sh->ncand};
    size_t mk = m->arena.off;
    float *qr = dsv4_ftake(m, (size_t)R * c->q_lora, err), *q = dsv4_ftake(m, (size_t)R * Hd, err);
    float *kv = dsv4_ftake(m, (size_t)R * d, err), *o = dsv4_ftake(m, (size_t)R * Hd, err);
    float *cc = NULL, *zz = NULL, *qi = NULL, *wt = NULL;
    if (L->own_ent) {
        cc = dsv4_ftake(m, (size_t)R * d, err);
        zz = dsv4_ftake(m, (size_t)R * d, err);
    }
    if (L->index_source) {
        qi = dsv4_ftake(m, (size_t)R * nI * ci, err);
        wt = dsv4_ftake(m, (size_t)R * nI, err);
    }
    A.q = q, A.kv = kv, A.cc = cc, A.zz = zz, A.qi = qi, A.wt = wt, A.o = o;
    A.work = dsv4_ftake(m, be->attn41_work ? be->attn41_work(&A) : DSV4_ATTN41_WORK(A.vis_cap, A.topk, A.window, A.H, d, ci), err);
    int rc = err && err->code;
    if (rc)
        goto out;

    dsv4_v41_qkv(m, L, a, R, f->dpos, qr, q, kv);
    if (L->own_ent && L->ratio > 1) { /* the reference promotes these to fp32: no rounding */
        dsv4_lin(m, &L->comp.wkv, 0, d, a, R, c->dim, cc, d, DSV4_LIN_F32OUT | DSV4_LIN_NOQ);
        dsv4_lin(m, &L->comp.wgate, 0, d, a, R, c->dim, zz, d, DSV4_LIN_F32OUT | DSV4_LIN_NOQ);
    } else if (L->own_ent) {
        dsv4_lin(m, &L->comp.wkv, 0, d, a, R, c->dim, cc, d, 0);
        dsv4_norm(m, cc, R, d, L->comp.norm, eps, cc);
    }
    if (L->index_source) {
        int64_t qw = (int64_t)nI * ci;
        dsv4_lin(m, &L->iwq_b, 0, qw, qr, R, c->q_lora, qi, qw, 0);
        dsv4_rope(m, qi, R, qw, nI, ci, rd, m->inv_freq_compress, f->dpos, 0);
        if (ref)
            be->roundtrip(qi, (int64_t)R * qw, 32, DSV4_RT_FP4);
        dsv4_lin(m, &L->iweights, 0, nI, a, R, c->dim, wt, nI, 0);
        be->scale(wt, (int64_t)R * nI, 1.0f / sqrtf((float)ci) / sqrtf((float)nI), wt);
        dsv4_rnd(m, wt, (int64_t)R * nI);
    }
    be->attn_step41(&A);
    rc = dsv4_v41_attn_out(m, L, o, R, f->dpos, y, err);
out:
    dsv4_release(m, mk);
    return rc;
}

typedef struct layer_ctx { dsv4_step *f; int li; v41_shared *sh; } layer_ctx;

static int layer_attention(void *ctx, const float *a, float *y, dsv4_err *err)
{
    layer_ctx *lc = ctx;
    return attention(lc->f, lc->li, lc->sh, a, y, err);
}

int dsv4_v41_block(dsv4_model *m, const dsv4_layer *L, const int32_t *ids, int R, float *X, float *pin,
                   dsv4_attn_fn attn, void *ctx, dsv4_err *err)
{
    const dsv4_config *c = &m->cfg;
    const dsv4_backend *be = m->be;
    int n = c->hc_mult, D = c->dim;
    float eps = (float)c->norm_eps, hce = (float)c->hc_eps;
    size_t mk = m->arena.off;
    float *pre_a = dsv4_ftake(m, (size_t)R * n, err), *pre_f = dsv4_ftake(m, (size_t)R * n, err);
    float *post = dsv4_ftake(m, (size_t)R * n, err), *comb = dsv4_ftake(m, (size_t)R * n * n, err);
    float *h = dsv4_ftake(m, (size_t)R * D, err), *a = dsv4_ftake(m, (size_t)R * D, err), *y = dsv4_ftake(m, (size_t)R * D, err);
    int rc = err && err->code;
    if (rc)
        goto out;
    be->hc_pre(X, R, n, D, L->hc_attn_fn, L->hc_attn_base, L->hc_attn_scale, c->hc_iters, hce, eps, pre_a, post, comb, NULL, NULL);
    be->hc_collapse(X, R, n, D, pin, h);
    dsv4_rnd(m, h, (int64_t)R * D);
    dsv4_norm(m, h, R, D, L->attn_norm, eps, a);
    if ((rc = attn(ctx, a, y, err)))
        goto out;
    dsv4_hc_post(m, X, y, R, n, D, post, comb);
    be->hc_pre(X, R, n, D, L->hc_ffn_fn, L->hc_ffn_base, L->hc_ffn_scale, c->hc_iters, hce, eps, pre_f, post, comb, NULL, NULL);
    be->hc_collapse(X, R, n, D, pre_a, h);
    dsv4_rnd(m, h, (int64_t)R * D);
    dsv4_norm(m, h, R, D, L->ffn_norm, eps, a);
    if ((rc = dsv4_moe_of(m, L, ids, R, a, y, err)))
        goto out;
    dsv4_hc_post(m, X, y, R, n, D, post, comb);
    m->mem->copy(pin, pre_f, (size_t)R * n * sizeof(float));
out:
    dsv4_release(m, mk);
    return rc;
}

/* The layers of a step, over backend buffers (a step recorded and replayed when the Engram
 * rows were uploaded before them: erows). */
typedef struct v41_run {
    dsv4_step *f;
    v41_shared *sh;
    prefetch *pf;
    const float *erows;
    float *X, *pin, *mh, *avg, *feat;
} v41_run;

static int v41_layer_loop(void *ctx, dsv4_err *err)
{
    v41_run *v = ctx;
    dsv4_step *f = v->f;
    dsv4_model *m = f->m;
    const dsv4_config *c = &m->cfg;
    const dsv4_backend *be = f->be;
    int R = f->R, n = c->hc_mult, D = c->dim, nt = c->n_spec_target, rc = 0;
    for (int li = 0; li < c->n_layers && !rc; li++) {
        const dsv4_layer *L = &m->layers[li];
        if (L->engram >= 0 && (rc = engram_apply(f, L->engram, v->pf, v->erows, v->X, err)))
            break;
        for (int k = 0; v->mh && k < nt; k++)
            if (c->spec_target[k] == li) { /* the drafter's features: this block's input, averaged over the streams */
                be->hc_collapse(v->X, R, n, D, v->avg, v->feat);
                m->mem->copy2d(v->mh + (int64_t)k * D, (size_t)nt * D * sizeof(float), v->feat, (size_t)D * sizeof(float),
                               (size_t)D * sizeof(float), (size_t)R);
            }
        layer_ctx lc = {f, li, v->sh};
        rc = dsv4_v41_block(m, L, f->dids, R, v->X, v->pin, layer_attention, &lc, err);
    }
    return rc;
}

int dsv4_v41_layers(dsv4_step *f, float *X, float *h, dsv4_err *err)
{
    dsv4_model *m = f->m;
    const dsv4_config *c = &m->cfg;
    const dsv4_backend *be = f->be, *mem = m->mem;
    int R = f->R, n = c->hc_mult, D = c->dim, nt = c->n_spec_target, K = c->index_topk > 0 ? c->index_topk : 1;
    int64_t ew = c->n_engram ? (int64_t)m->engram[0].cols * c->engram_head_dim : 0;
    int CB = c->candidate_topk_blocks > 0 ? c->candidate_topk_blocks : 1;
    int cols = c->n_engram ? m->engram[0].cols : 0;
    size_t mk = m->arena.off;
    /* the step's shared slots; pin: the collapse weights the next site uses; mh: the DSpark
     * stages' features; avg: the weights (1/n each) that average the streams */
    v41_shared sh = {.topk = dsv4_take(m, (size_t)R * K * sizeof(int64_t), err),
                     .ntopk = dsv4_take(m, (size_t)R * sizeof(int), err),
                     .cand = dsv4_take(m, (size_t)R * CB * sizeof(int64_t), err),
                     .ncand = dsv4_take(m, (size_t)R * sizeof(int), err)};
    float *pin = dsv4_ftake(m, (size_t)R * n, err);
    float *mh = m->spec.on ? dsv4_ftake(m, (size_t)R * nt * D, err) : NULL;
    float *avg = m->spec.on ? dsv4_ftake(m, (size_t)R * n, err) : NULL, *feat = m->spec.on ? dsv4_ftake(m, (size_t)R * D, err) : NULL;
    float *hpin = malloc((size_t)R * n * sizeof(float));
    sh.ehash = calloc((size_t)R * (c->n_engram ? c->n_engram * cols : 1), sizeof(int64_t));
    prefetch pf = {.m = m, .R = R, .ehash = sh.ehash, .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    pthread_t th;
    int threaded = 0;
    int rc = err && err->code;
    if (!rc && (!hpin || !sh.ehash))
        rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory for a V4.1 step of %d rows", R);
    if (rc)
        goto out;
    for (int r = 0; r < R; r++) /* one-hot start: the first site reads stream 0 */
        for (int i = 0; i < n; i++)
            hpin[r * n + i] = i == 0;
    mem->upload(pin, hpin, (size_t)R * n * sizeof(float));
    if (avg) { /* 1/n: exact for the power-of-two stream counts, so the weighted sum is the mean */
        for (int64_t i = 0; i < (int64_t)R * n; i++)
            hpin[i] = 1.0f / n;
        mem->upload(avg, hpin, (size_t)R * n * sizeof(float));
    }
    if (c->n_engram) {
        engram_hashes(f, &sh);
        if (!(pf.rows = dsv4_fbuf((size_t)c->n_engram * R * cols * c->engram_head_dim, err))) {
            rc = err->code;
            goto out;
        }
        threaded = m->engram_streamed && !pthread_create(&th, NULL, fetch_all, &pf);
        if (!threaded) { /* read in line: all of it is the forward's wait */
            fetch_all(&pf);
            pf.stall_s += pf.gather_s;
        }
    }
    /* Rows read in line go up before the layers, so the layers read backend buffers only and a
     * step can be recorded; streamed rows go up as each Engram layer's arrive, the layers before
     * it computing meanwhile. */
    v41_run run = {.f = f, .sh = &sh, .pf = &pf, .X = X, .pin = pin, .mh = mh, .avg = avg, .feat = feat};
    if (c->n_engram && !threaded) {
        if (pf.rc) {
            if (err)
                *err = pf.err;
            rc = pf.rc;
            goto out;
        }
        float *dev = dsv4_ftake(m, (size_t)c->n_engram * R * ew, err);
        if (!dev) {
            rc = err && err->code ? err->code : DSV4_E_NOMEM;
            goto out;
        }
        mem->upload(dev, pf.rows, (size_t)c->n_engram * R * ew * sizeof(float));
        run.erows = dev;
    }
    dsv4_rnd(m, X, (int64_t)R * n * D);
    rc = threaded ? v41_layer_loop(&run, err) : dsv4_layers_replayed(f, v41_layer_loop, &run, err);
    if (!rc && mh) {
        dsv4_rnd(m, mh, (int64_t)R * nt * D);
        rc = dsv4_spec_window(f, mh, err);
    }
    if (!rc) { /* the head reads the collapse with the last FFN site's pre */
        be->hc_collapse(X, R, n, D, pin, h);
        dsv4_rnd(m, h, (int64_t)R * D);
    }
    if (threaded)
        pthread_join(th, NULL);
    m->engram_bytes += pf.bytes;
    m->engram_gather_s += pf.gather_s;
    m->engram_stall_s += pf.stall_s;
    if (!rc && c->n_engram)
        m->engram_tokens += (uint64_t)R;
out:
    free(pf.rows);
    free(sh.ehash);
    free(hpin);
    dsv4_release(m, mk);
    return rc;
}
