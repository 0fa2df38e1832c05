/* The DSpark drafter of V4.1 checkpoints (spec §10): the mtp.* stages draft a block of tokens
 * after an anchor in one forward of their own.
 *
 * Features: every target forward averages the streams entering each target layer, projects
 * them (stage 0's main_proj and main_norm) and writes, per stage, that stage's window row of
 * the position into the sequence's stage window. So the stage windows are sequence state like
 * the layers' windows: copied, saved, restored and rolled back with them, always holding the
 * rows of the tokens the sequence holds.
 *
 * Draft: the block is the anchor (the token at position L of a sequence of L tokens) and
 * block - 1 noise tokens at positions L .. L + block - 1. Each stage is a V4.1 block whose
 * attention lets every block row see the stage's window rows of positions L - W .. L - 1 and
 * every row of the block (non-causal). The last stage's collapse goes through its norm and
 * the shared head; then, row by row, the Markov head adds a bias from the previous token's
 * embedding, the draft is the argmax (ties to the lower id), and the confidence head reads
 * the collapse and that embedding. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "model/model.h"

int dsv4_spec_window(dsv4_step *f, const float *mh, dsv4_err *err)
{
    dsv4_model *m = f->m;
    const dsv4_config *c = &m->cfg;
    const dsv4_spec *S = &m->spec;
    const dsv4_batch *b = f->b;
    int R = f->R, D = c->dim, d = c->head_dim, nt = c->n_spec_target;
    size_t mk = m->arena.off, rb = (size_t)d * sizeof(float);
    float *mx = dsv4_ftake(m, (size_t)R * D, err), *kv = dsv4_ftake(m, (size_t)R * d, err);
    int rc = err && err->code;
    if (!rc) {
        dsv4_lin(m, &S->main_proj, 0, D, mh, R, (int64_t)nt * D, mx, D, 0);
        dsv4_norm(m, mx, R, D, S->main_norm, (float)c->norm_eps, mx);
        for (int st = 0; st < S->n; st++) {
            dsv4_v41_window_row(m, &S->st[st], mx, R, f->dpos, kv, 0);
            /* each sequence's rows into its ring: the last kv_cap of them, in at most two runs */
            for (int i = 0, r0 = 0; i < b->n_seqs; r0 += b->n_ids[i++]) {
                dsv4_seq *s = b->seqs[i];
                int nr = b->n_ids[i], cap = s->kv_cap, old = nr > cap ? nr - cap : 0; /* rows the ring would overwrite */
                int64_t p = f->pos[r0 + old];
                for (int r = r0 + old; r < r0 + nr;) {
                    int64_t slot = p % cap;
                    int run = (int)(cap - slot < r0 + nr - r ? cap - slot : r0 + nr - r);
                    m->mem->copy(s->skv[st] + slot * d, kv + (int64_t)r * d, (size_t)run * rb);
                    r += run;
                    p += run;
                }
            }
        }
    }
    dsv4_release(m, mk);
    return rc;
}

typedef struct stage_ctx {
    dsv4_model *m;
    dsv4_seq *s;
    int st, B;
    int64_t p0;              /* the block's first position */
    const int64_t *dpos;     /* [B] its positions (the model's memory) */
} stage_ctx;

/* A stage's attention over the block's rows: the stage window's last W rows before the block,
 * then every block row. */
static int stage_attention(void *ctx, const float *a, float *y, dsv4_err *err)
{
    stage_ctx *sc = ctx;
    dsv4_model *m = sc->m;
    const dsv4_config *c = &m->cfg;
    const dsv4_layer *L = &m->spec.st[sc->st];
    dsv4_seq *s = sc->s;
    int B = sc->B, H = c->n_heads, d = c->head_dim, W = c->window;
    int64_t Hd = (int64_t)H * d, p0 = sc->p0;
    size_t mk = m->arena.off;
    float *qr = dsv4_ftake(m, (size_t)B * c->q_lora, err), *q = dsv4_ftake(m, (size_t)B * Hd, err);
    float *kv = dsv4_ftake(m, (size_t)B * d, err), *o = dsv4_ftake(m, (size_t)B * Hd, err);
    const float **dkeys = dsv4_take(m, (size_t)(W + B) * sizeof *dkeys, err); /* the op's key table, in m->mem */
    const float **keys = malloc((size_t)(W + B) * sizeof *keys);
    int rc = err && err->code;
    if (!rc && !keys)
        rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory in a draft stage's attention");
    if (!rc) {
        dsv4_v41_qkv(m, L, a, B, sc->dpos, qr, q, kv);
        int nk = 0;
        for (int64_t j = p0 - W < 0 ? 0 : p0 - W; j < p0; j++)
            keys[nk++] = s->skv[sc->st] + (j % s->kv_cap) * d;
        for (int r = 0; r < B; r++)
            keys[nk++] = kv + (int64_t)r * d;
        m->mem->upload(dkeys, keys, (size_t)nk * sizeof *keys);
        for (int r = 0; r < B; r++)
            m->be->attend(q + (int64_t)r * Hd, H, d, dkeys, nk, 1.0f / sqrtf((float)d), L->sink, o + (int64_t)r * Hd);
        rc = dsv4_v41_attn_out(m, L, o, B, sc->dpos, y, err);
    }
    free(keys);
    dsv4_release(m, mk);
    return rc;
}

int dsv4_spec_block(const dsv4_model *m) { return m->spec.on ? m->cfg.spec_block : 0; }

int dsv4_spec_draft(dsv4_model *m, dsv4_seq *s, int32_t anchor, int32_t *ids, float *logits, float *conf, dsv4_err *err)
{
    const dsv4_config *c = &m->cfg;
    const dsv4_spec *S = &m->spec;
    dsv4_err_clear(err);
    if (!S->on)
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, !S->n ? "%s: no DSpark stages (mtp.*) in this checkpoint"
                                                        : "%s: loaded without its draft stages (dsv4_load_opts.draft_stages)",
                         m->dir);
    if (!s || s->m != m)
        return dsv4_fail(err, DSV4_E_ARG, "DSpark draft: the sequence is NULL or belongs to another model");
    if (anchor < 0 || anchor >= c->vocab)
        return dsv4_fail(err, DSV4_E_ARG, "DSpark draft: anchor %d is outside the vocabulary (0..%d)", anchor, c->vocab - 1);
    const dsv4_backend *be = m->be, *mem = m->mem;
    int B = c->spec_block, n = c->hc_mult, D = c->dim, V = c->vocab, rk = c->spec_markov_rank;
    int32_t tok[DSV4_MAX_SPEC_BLOCK];
    int64_t pos[DSV4_MAX_SPEC_BLOCK];
    float hpin[DSV4_MAX_SPEC_BLOCK * DSV4_MAX_HC];
    for (int r = 0; r < B; r++) {
        tok[r] = r ? c->spec_noise : anchor;
        pos[r] = s->len + r;
        for (int i = 0; i < n; i++) /* one-hot start: the first site reads stream 0 */
            hpin[r * n + i] = i == 0;
    }
    /* between steps the arena is free: the draft's buffers are taken from it and given back */
    size_t mk = m->arena.off;
    float *X = dsv4_ftake(m, (size_t)B * n * D, err), *pin = dsv4_ftake(m, (size_t)B * n, err);
    float *xh = dsv4_ftake(m, (size_t)B * D, err), *hn = dsv4_ftake(m, (size_t)B * D, err);
    float *lg = dsv4_ftake(m, (size_t)B * V, err), *bias = dsv4_ftake(m, V, err), *me = dsv4_ftake(m, rk, err);
    int32_t *dtok = dsv4_take(m, (size_t)B * sizeof(int32_t), err), *did = dsv4_take(m, sizeof(int32_t), err);
    int64_t *dpos = dsv4_take(m, (size_t)B * sizeof(int64_t), err);
    float *row = dsv4_fbuf(V, err), *hx = dsv4_fbuf(D, err), *hme = dsv4_fbuf(rk, err);
    int rc = err && err->code;
    if (rc)
        goto out;
    mem->upload(dtok, tok, (size_t)B * sizeof(int32_t));
    mem->upload(dpos, pos, (size_t)B * sizeof(int64_t));
    mem->upload(pin, hpin, (size_t)B * n * sizeof(float));
    be->embed(&m->embed, dtok, B, n, X);
    dsv4_rnd(m, X, (int64_t)B * n * D);
    for (int st = 0; st < S->n && !rc; st++) {
        stage_ctx sc = {m, s, st, B, pos[0], dpos};
        rc = dsv4_v41_block(m, &S->st[st], dtok, B, X, pin, stage_attention, &sc, err);
    }
    if (rc)
        goto out;
    be->hc_collapse(X, B, n, D, pin, xh);
    dsv4_rnd(m, xh, (int64_t)B * D);
    dsv4_norm(m, xh, B, D, S->norm, (float)c->norm_eps, hn);
    be->linear(&m->head, 0, V, hn, B, D, lg, V);
    ids[0] = anchor;
    for (int r = 0; r < B && !rc; r++) { /* each row's bias reads the draft of the row before */
        float *lr = lg + (size_t)r * V;
        mem->upload(did, &ids[r], sizeof(int32_t));
        be->embed(&S->mk_embed, did, 1, 1, me);
        be->linear(&S->mk_head, 0, V, me, 1, rk, bias, V);
        be->add(lr, bias, V, lr);
        if (be->check && (rc = be->check(err)))
            break;
        mem->download(row, lr, (size_t)V * sizeof(float));
        int best = 0;
        for (int v = 1; v < V; v++)
            if (row[v] > row[best])
                best = v;
        ids[r + 1] = best;
        if (logits)
            memcpy(logits + (size_t)r * V, row, (size_t)V * sizeof(float));
        if (conf) {
            mem->download(hx, xh + (int64_t)r * D, (size_t)D * sizeof(float));
            mem->download(hme, me, (size_t)rk * sizeof(float));
            conf[r] = dsv4_dot(S->conf, hx, D) + dsv4_dot(S->conf + D, hme, rk);
        }
    }
out:
    dsv4_release(m, mk);
    free(row);
    free(hx);
    free(hme);
    return rc;
}
