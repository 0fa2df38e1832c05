/* The DeepSeek-V4 layers, written once against the backend op table: each layer's attention
 * and MoE between the hyper-connection sites (dsv4_forward in forward.c runs them for a step).
 *
 * A step holds rows (sequence, token) from several sequences. Projections run over all rows
 * at once; the stateful part of attention (window ring, compressor windows, indexer) runs
 * token by token in position order, so a row is computed the same way however the prompt
 * was chunked and whatever else shares the step. Shapes: R rows, D model width, n streams,
 * H heads of d, rd rope dims, m compression ratio. */
#include <math.h>
#include "core/core.h"
#include "model/model.h"

/* One V4 attention layer over the step's rows: projections over all rows, then the stateful
 * part (backend attn_step), then the grouped output projection. a: [R, D] in, y: [R, D] out. */
static int attention(dsv4_step *f, int li, const float *a, float *y, dsv4_err *err)
{
    dsv4_model *m = f->m;
    const dsv4_config *c = &m->cfg;
    const dsv4_backend *be = f->be;
    const dsv4_layer *L = &m->layers[li];
    int R = f->R, H = c->n_heads, d = c->head_dim, rd = c->rope_dim;
    int64_t Hd = (int64_t)H * d;
    float eps = (float)c->norm_eps;
    const float *freq = L->ratio ? m->inv_freq_compress : m->inv_freq_main;
    int cw = (1 + L->csa) * d, nI = c->index_heads, ci = c->index_dim;
    size_t mk = m->arena.off;
    dsv4_attn_args A = {.rows = f->rows, .st = f->st + (int64_t)li * f->rows.S, .kv_cap = f->kv_cap,
                        .c_cap = L->ratio ? dsv4_c_cap(m, L) : 0, .vis_cap = f->vis_cap[li], .H = H, .d = d, .rd = rd,
                        .window = c->window, .scale = 1.0f / sqrtf((float)d), .eps = eps, .sink = L->sink,
                        .inv_freq = m->inv_freq_compress, .ratio = L->ratio, .csa = L->csa, .comp = dsv4_pool_of(&L->comp),
                        .icomp = dsv4_pool_of(&L->icomp), .nI = nI, .ci = ci, .topk = c->index_topk,
                        .iw_scale = 1.0f / sqrtf((float)nI), .kv_prod = m->kv_prod};
    float *qr = dsv4_ftake(m, (size_t)R * c->q_lora, err), *q = dsv4_ftake(m, (size_t)R * Hd, err);
    float *kv = dsv4_ftake(m, (size_t)R * d, err);
    float *o = dsv4_ftake(m, (size_t)R * Hd, err), *t = dsv4_ftake(m, (size_t)R * c->o_groups * c->o_lora, err);
    float *cc = NULL, *zz = NULL, *ic = NULL, *iz = NULL, *qi = NULL, *wt = NULL;
    if (L->ratio) {
        cc = dsv4_ftake(m, (size_t)R * cw, err);
        zz = dsv4_ftake(m, (size_t)R * cw, err);
    }
    if (L->csa) {
        ic = dsv4_ftake(m, (size_t)R * 2 * ci, err);
        iz = dsv4_ftake(m, (size_t)R * 2 * ci, err);
        qi = dsv4_ftake(m, (size_t)R * nI * ci, err);
        wt = dsv4_ftake(m, (size_t)R * nI, err);
    }
    size_t nwork = be->attn_work ? be->attn_work(&A) : DSV4_ATTN_WORK(R, A.vis_cap, A.topk);
    A.work = nwork ? dsv4_ftake(m, nwork, err) : NULL;
    A.work_n = nwork;
    if (err && err->code)
        return err->code;

    /* The projections of a (2; 4 with a compressor; 7 with an indexer), then those of qr, each
     * set in one op: on a GPU a launch per storage form rather than one per weight. REF rounds
     * each bf16 activation as V4.1's reference does (dsv4_lin, dsv4_norm, dsv4_rope, dsv4_rnd);
     * the compressors' projections stay fp32, as V4.1's pooling compressors'. */
    const dsv4_weight *wa[7] = {&L->wq_a, &L->wkv, &L->iweights, &L->comp.wkv, &L->comp.wgate, &L->icomp.wkv,
                                &L->icomp.wgate};
    float *ya[7] = {qr, kv, wt, cc, zz, ic, iz};
    const dsv4_weight *wb[2] = {&L->wq_b, &L->iwq_b};
    float *yb[2] = {q, qi};
    int na = L->csa ? 7 : L->ratio ? 4 : 2;
    if (m->numerics == DSV4_NUMERICS_REF) {
        int nc = L->csa ? 4 : L->ratio ? 2 : 0; /* the compressors' projections */
        dsv4_lin_multi(m, L->csa ? 3 : 2, wa, a, R, c->dim, ya, 0);
        if (nc)
            dsv4_lin_multi(m, nc, wa + 3, a, R, c->dim, ya + 3, DSV4_LIN_F32OUT | DSV4_LIN_NOQ);
    } else {
        if (!L->csa) /* no indexer: the compressor's pair follows wq_a and wkv */
            wa[2] = wa[3], wa[3] = wa[4], ya[2] = ya[3], ya[3] = ya[4];
        be->linear_multi(na, wa, a, R, c->dim, ya);
    }
    dsv4_norm(m, qr, R, c->q_lora, L->q_norm, eps, qr);
    dsv4_lin_multi(m, L->csa ? 2 : 1, wb, qr, R, c->q_lora, yb, 0);
    dsv4_norm(m, q, (int64_t)R * H, d, NULL, eps, q);
    dsv4_rope(m, q, R, Hd, H, d, rd, freq, f->dpos, 0);
    dsv4_norm(m, kv, R, d, L->kv_norm, eps, kv);
    dsv4_rope(m, kv, R, d, 1, d, rd, freq, f->dpos, 0);
    if (L->csa)
        dsv4_rope(m, qi, R, (int64_t)nI * ci, nI, ci, rd, m->inv_freq_compress, f->dpos, 0);
    A.q = q, A.kv = kv, A.cc = cc, A.zz = zz, A.ic = ic, A.iz = iz, A.qi = qi, A.wt = wt, A.o = o;
    be->attn_step(&A);
    dsv4_rnd(m, o, (int64_t)R * Hd);
    dsv4_rope(m, o, R, Hd, H, d, rd, freq, f->dpos, 1);
    /* the grouped einsum on wo_a dequantized to bf16 (no input quantization), as V4.1's */
    be->linear_blocks(&L->wo_a, c->o_groups, o, R, t);
    dsv4_rnd(m, t, (int64_t)R * c->o_groups * c->o_lora);
    dsv4_lin(m, &L->wo_b, 0, c->dim, t, R, (int64_t)c->o_groups * c->o_lora, y, c->dim, 0);
    dsv4_release(m, mk);
    return 0;
}

/* A hyper-connection site's mixes and its collapse, RMS-normed by hw, into h: one fused op in
 * fp32; REF rounds the collapse and the norm's output to bf16, as V4.1's reference does. */
static void site(dsv4_step *f, const float *X, const float *fn, const float *base, const float *scale, const float *hw,
                 float *pre, float *post, float *comb, float *h)
{
    dsv4_model *m = f->m;
    const dsv4_config *c = &m->cfg;
    int R = f->R, n = c->hc_mult, D = c->dim;
    float eps = (float)c->norm_eps, hce = (float)c->hc_eps;
    if (m->numerics != DSV4_NUMERICS_REF) {
        f->be->hc_pre(X, R, n, D, fn, base, scale, c->hc_iters, hce, eps, pre, post, comb, h, hw);
        return;
    }
    f->be->hc_pre(X, R, n, D, fn, base, scale, c->hc_iters, hce, eps, pre, post, comb, h, NULL);
    dsv4_rnd(m, h, (int64_t)R * D);
    dsv4_norm(m, h, R, D, hw, eps, h);
}

/* The V4 layers over X [R, n, D] (backend memory); h, y [R, D], pre/post [R, n], comb
 * [R, n, n] scratch. Reads only backend buffers, so a step can be recorded and replayed. */
int dsv4_v4_layers(dsv4_step *f, float *X, float *h, float *y, float *pre, float *post, float *comb, dsv4_err *err)
{
    dsv4_model *m = f->m;
    const dsv4_config *c = &m->cfg;
    int R = f->R, n = c->hc_mult, D = c->dim, rc = 0;
    dsv4_rnd(m, X, (int64_t)R * n * D);
    for (int li = 0; li < c->n_layers && !rc; li++) {
        const dsv4_layer *L = &m->layers[li];
        site(f, X, L->hc_attn_fn, L->hc_attn_base, L->hc_attn_scale, L->attn_norm, pre, post, comb, h);
        if ((rc = attention(f, li, h, y, err)))
            break;
        dsv4_hc_post(m, X, y, R, n, D, post, comb);
        site(f, X, L->hc_ffn_fn, L->hc_ffn_base, L->hc_ffn_scale, L->ffn_norm, pre, post, comb, h);
        if ((rc = dsv4_moe(m, li, f->dids, R, h, y, err)))
            break;
        dsv4_hc_post(m, X, y, R, n, D, post, comb);
    }
    return rc;
}
