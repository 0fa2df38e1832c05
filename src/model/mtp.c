/* V4's MTP stage as a drafter (docs/mtp.md).
 *
 * The stage is a sliding block whose row at position p reads the embedding of token p + 1 and
 * the target's final streams at p. Its window rows for the tokens a sequence holds are state:
 * every target forward keeps each row's final streams and writes the window row that its
 * token completes (position p - 1 for a token at p), so the window is copied, saved, restored
 * and rolled back with the layers'.
 *
 * A draft after the anchor (the token at position L of a sequence of L tokens) chains the
 * stage: step j at position L - 1 + j reads the target's streams at L - 1 (j = 0) or its own
 * previous output streams, and the anchor or its previous draft; its window is the sequence's
 * rows before L - 1 and the chain's own rows, which are not kept. Each step's head (its mix,
 * its norm, the shared head) gives a draft, the argmax, ties to the lower id.
 *
 * Every buffer the ops see is in the model's memory (m->mem: the step arena, the sequence's
 * window and streams, the attention's key table), moved with m->mem's copies, so the stage runs
 * on any backend; the host holds only row bookkeeping, the key table it uploads and the
 * downloaded logits it takes the argmax of. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "model/model.h"

/* x [R, hc, D] = e_proj(enorm(embed(tok))) + h_proj(hnorm(hs_k)) for every stream k of hs [R, hc, D];
 * tok [R] in m->mem. */
static int stage_input(dsv4_model *m, int st, const int32_t *tok, const float *hs, int R, float *x, dsv4_err *err)
{
    const dsv4_config *c = &m->cfg;
    const dsv4_mtp *M = &m->mtp;
    const dsv4_backend *be = m->be;
    int n = c->hc_mult, D = c->dim;
    float eps = (float)c->norm_eps;
    size_t mk = m->arena.off;
    float *e = dsv4_ftake(m, (size_t)R * D, err), *ep = dsv4_ftake(m, (size_t)R * D, err);
    float *hn = dsv4_ftake(m, (size_t)R * n * D, err);
    int rc = err && err->code;
    if (!rc) {
        be->embed(&m->embed, tok, R, 1, e);
        be->rmsnorm(e, R, D, M->enorm[st], eps, e);
        be->linear(&M->e_proj[st], 0, D, e, R, D, ep, D);
        be->rmsnorm(hs, (int64_t)R * n, D, M->hnorm[st], eps, hn);
        be->linear(&M->h_proj[st], 0, D, hn, R * n, D, x, D);
        for (int r = 0; r < R; r++)
            for (int k = 0; k < n; k++)
                be->add(x + ((int64_t)r * n + k) * D, ep + (int64_t)r * D, D, x + ((int64_t)r * n + k) * D);
    }
    dsv4_release(m, mk);
    return rc;
}

/* The window row of the stage's attention input a [R, D] at positions pos [R] (m->mem). */
static void window_row(const dsv4_model *m, const dsv4_layer *L, const float *a, int R, const int64_t *pos, float *kv)
{
    const dsv4_config *c = &m->cfg;
    int d = c->head_dim;
    m->be->linear(&L->wkv, 0, d, a, R, c->dim, kv, d);
    m->be->rmsnorm(kv, R, d, L->kv_norm, (float)c->norm_eps, kv);
    m->be->rope(kv, R, d, 1, d, c->rope_dim, m->inv_freq_main, pos, 0);
}

int dsv4_mtp_window(dsv4_step *f, const float *X, dsv4_err *err)
{
    dsv4_model *m = f->m;
    const dsv4_config *c = &m->cfg;
    const dsv4_layer *L = &m->mtp.st[0];
    const dsv4_backend *mem = m->mem;
    int n = c->hc_mult, D = c->dim, d = c->head_dim, R = f->R, nr = 0;
    int64_t w = (int64_t)n * D;
    size_t fb = sizeof(float);
    for (int r = 0; r < R; r++)
        nr += f->pos[r] > 0;
    int na = nr ? nr : 1; /* buffers of at least one row */
    size_t mk = m->arena.off;
    float *hs = dsv4_ftake(m, (size_t)na * w, err), *x = dsv4_ftake(m, (size_t)na * w, err);
    float *a = dsv4_ftake(m, (size_t)na * D, err), *kv = dsv4_ftake(m, (size_t)na * d, err);
    float *mix = dsv4_ftake(m, (size_t)na * (2 * n + n * n), err);
    int32_t *dtok = dsv4_take(m, na * sizeof(int32_t), err);
    int64_t *dpos = dsv4_take(m, na * sizeof(int64_t), err);
    int32_t *tok = malloc(na * sizeof *tok);
    int64_t *pos = malloc(na * sizeof *pos);
    int *row = malloc(na * sizeof *row);
    int rc = err && err->code;
    if (!rc && (!tok || !pos || !row))
        rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory for the MTP window");
    if (!rc) {
        /* in position order, each row reads its predecessor's streams, then leaves its own: a
         * chunk longer than the ring still reads each predecessor before it is overwritten
         * (the copies run in order) */
        for (int r = 0, k = 0; r < R; r++) {
            dsv4_seq *s = f->b->seqs[f->row_seq[r]];
            if (f->pos[r] > 0) {
                mem->copy(hs + k * w, s->mhs + ((f->pos[r] - 1) % s->kv_cap) * w, w * fb);
                tok[k] = f->ids[r];
                pos[k] = f->pos[r] - 1;
                row[k++] = r;
            }
            mem->copy(s->mhs + (f->pos[r] % s->kv_cap) * w, X + r * w, w * fb);
        }
        mem->upload(dtok, tok, na * sizeof *tok);
        mem->upload(dpos, pos, na * sizeof *pos);
        rc = nr ? stage_input(m, 0, dtok, hs, nr, x, err) : 0;
    }
    if (!rc && nr) {
        m->be->hc_pre(x, nr, n, D, L->hc_attn_fn, L->hc_attn_base, L->hc_attn_scale, c->hc_iters, (float)c->hc_eps,
                      (float)c->norm_eps, mix, mix + (size_t)nr * n, mix + (size_t)nr * 2 * n, a, L->attn_norm);
        window_row(m, L, a, nr, dpos, kv);
        for (int k = 0; k < nr; k++) {
            dsv4_seq *s = f->b->seqs[f->row_seq[row[k]]];
            mem->copy(s->mkv + (pos[k] % s->kv_cap) * d, kv + (int64_t)k * d, d * fb);
        }
    }
    dsv4_release(m, mk);
    free(tok);
    free(pos);
    free(row);
    return rc;
}

/* One chain step's attention: a [D] at position p (dp: p in m->mem), the sequence's window
 * rows before L - 1 and the chain's rows ck [p - (L - 1) + 1, d] (this step's written at its
 * end). */
static int chain_attention(dsv4_model *m, dsv4_seq *s, int64_t L0, int64_t p, const int64_t *dp, const float *a,
                           float *ck, float *y, dsv4_err *err)
{
    const dsv4_config *c = &m->cfg;
    const dsv4_layer *L = &m->mtp.st[0];
    const dsv4_backend *be = m->be;
    int H = c->n_heads, d = c->head_dim, rd = c->rope_dim, W = c->window;
    int64_t Hd = (int64_t)H * d;
    float eps = (float)c->norm_eps;
    size_t mk = m->arena.off;
    float *qr = dsv4_ftake(m, c->q_lora, err), *q = dsv4_ftake(m, Hd, err), *o = dsv4_ftake(m, Hd, err);
    float *t = dsv4_ftake(m, (size_t)c->o_groups * c->o_lora, err);
    const float **dkeys = dsv4_take(m, (size_t)W * sizeof *dkeys, err); /* the op's key table, in m->mem */
    const float **keys = malloc((size_t)W * sizeof *keys);
    int rc = err && err->code;
    if (!rc && !keys)
        rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory in the MTP stage's attention");
    if (!rc) {
        be->linear(&L->wq_a, 0, c->q_lora, a, 1, c->dim, qr, c->q_lora);
        be->rmsnorm(qr, 1, c->q_lora, L->q_norm, eps, qr);
        be->linear(&L->wq_b, 0, Hd, qr, 1, c->q_lora, q, Hd);
        be->rmsnorm(q, H, d, NULL, eps, q);
        be->rope(q, 1, Hd, H, d, rd, m->inv_freq_main, dp, 0);
        window_row(m, L, a, 1, dp, ck + (p - (L0 - 1)) * d);
        int nk = 0;
        for (int64_t j = p - W + 1 < 0 ? 0 : p - W + 1; j <= p; j++)
            keys[nk++] = j < L0 - 1 ? s->mkv + (j % s->kv_cap) * d : ck + (j - (L0 - 1)) * d;
        m->mem->upload(dkeys, keys, (size_t)nk * sizeof *keys);
        be->attend(q, H, d, dkeys, nk, 1.0f / sqrtf((float)d), L->sink, o);
        be->rope(o, 1, Hd, H, d, rd, m->inv_freq_main, dp, 1);
        be->linear_blocks(&L->wo_a, c->o_groups, o, 1, t);
        be->linear(&L->wo_b, 0, c->dim, t, 1, (int64_t)c->o_groups * c->o_lora, y, c->dim);
    }
    free(keys);
    dsv4_release(m, mk);
    return rc;
}

int dsv4_mtp_on(const dsv4_model *m) { return m->mtp.on; }

int dsv4_mtp_draft(dsv4_model *m, dsv4_seq *s, int32_t anchor, int k, int32_t *out, dsv4_err *err)
{
    const dsv4_config *c = &m->cfg;
    const dsv4_mtp *M = &m->mtp;
    dsv4_err_clear(err);
    if (!M->on)
        return -dsv4_fail(err, DSV4_E_UNSUPPORTED, !M->n ? "%s: no MTP stage (mtp.0) in this checkpoint"
                                                         : "%s: loaded without its draft stages (dsv4_load_opts.draft_stages)",
                          m->dir);
    if (!s || s->m != m || anchor < 0 || anchor >= c->vocab || k < 0)
        return -dsv4_fail(err, DSV4_E_ARG, "MTP draft: a NULL or foreign sequence, anchor %d outside the vocabulary, or %d tokens",
                          anchor, k);
    int64_t L0 = s->len;
    if (L0 == 0 || k == 0) /* the stage reads the streams of the token before the anchor */
        return 0;
    const dsv4_layer *L = &M->st[0];
    const dsv4_backend *be = m->be, *mem = m->mem;
    int n = c->hc_mult, D = c->dim, V = c->vocab;
    int64_t w = (int64_t)n * D;
    float eps = (float)c->norm_eps, hce = (float)c->hc_eps;
    /* between steps the arena is free: the chain's buffers are taken from it and given back */
    size_t mk = m->arena.off;
    float *x = dsv4_ftake(m, w, err), *hs = dsv4_ftake(m, w, err), *a = dsv4_ftake(m, D, err), *y = dsv4_ftake(m, D, err);
    float *mix = dsv4_ftake(m, 2 * n + n * n, err), *lg = dsv4_ftake(m, V, err);
    float *ck = dsv4_ftake(m, (size_t)k * c->head_dim, err);
    int32_t *dtok = dsv4_take(m, sizeof(int32_t), err);
    int64_t *dp = dsv4_take(m, sizeof(int64_t), err);
    float *lh = dsv4_fbuf(V, err);
    int rc = err && err->code, made = 0;
    if (rc)
        goto out;
    mem->copy(hs, s->mhs + ((L0 - 1) % s->kv_cap) * w, w * sizeof(float));
    for (int j = 0; j < k && !rc; j++) {
        int32_t tok = j ? out[j - 1] : anchor;
        int64_t p = L0 - 1 + j;
        float *pre = mix, *post = mix + n, *comb = mix + 2 * n;
        mem->upload(dtok, &tok, sizeof tok);
        mem->upload(dp, &p, sizeof p);
        if ((rc = stage_input(m, 0, dtok, hs, 1, x, err)))
            break;
        be->hc_pre(x, 1, n, D, L->hc_attn_fn, L->hc_attn_base, L->hc_attn_scale, c->hc_iters, hce, eps, pre, post, comb, a,
                   L->attn_norm);
        if ((rc = chain_attention(m, s, L0, p, dp, a, ck, y, err)))
            break;
        be->hc_post(x, y, 1, n, D, post, comb);
        be->hc_pre(x, 1, n, D, L->hc_ffn_fn, L->hc_ffn_base, L->hc_ffn_scale, c->hc_iters, hce, eps, pre, post, comb, a,
                   L->ffn_norm);
        if ((rc = dsv4_moe_of(m, L, dtok, 1, a, y, err)))
            break;
        be->hc_post(x, y, 1, n, D, post, comb);
        mem->copy(hs, x, w * sizeof(float)); /* the next step reads these streams */
        be->hc_pre(x, 1, n, D, M->hc_head_fn[0], M->hc_head_base[0], M->hc_head_scale[0], 0, hce, eps, pre, NULL, NULL, a,
                   M->norm[0]);
        be->linear(&m->head, 0, V, a, 1, D, lg, V);
        if (be->check && (rc = be->check(err)))
            break;
        mem->download(lh, lg, (size_t)V * sizeof(float));
        int best = 0;
        for (int v = 1; v < V; v++)
            if (lh[v] > lh[best])
                best = v;
        out[j] = best;
        made = j + 1;
    }
out:
    dsv4_release(m, mk);
    free(lh);
    return rc ? -rc : made;
}
