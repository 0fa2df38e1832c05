/* The forward's entry point for both families, and what every family's layers share.
 *
 * dsv4_forward checks a batch, lays it out as rows (sequence, token) with their positions,
 * uploads that layout once, embeds the rows, runs the family's layers (V4: v4.c, V4.1: v41.c)
 * and the head. Beside it: the step arena every layer takes its buffers from, the routed +
 * shared expert FFN that V4, V4.1 and the draft stages all run, and the cache of recorded
 * steps, which replays a step's layers on the arena's fixed addresses. Shapes: R rows, D model
 * width, n streams. */
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "model/model.h"

/* ---- the step arena: every buffer of a step in backend memory, at the same addresses from
 * one step to the next while the sizes do not grow (a recorded step replays on them) ---- */

void *dsv4_take(dsv4_model *m, size_t bytes, dsv4_err *err)
{
    dsv4_arena *A = &m->arena;
    bytes = (bytes + 255) & ~(size_t)255;
    if (!bytes)
        bytes = 256;
    A->want = A->off + bytes > A->want ? A->off + bytes : A->want;
    if (A->off + bytes <= A->cap) {
        void *p = A->base + A->off;
        A->off += bytes;
        return p;
    }
    /* Outgrown: this step takes its own buffer; the arena grows for the next one. */
    void *p = A->n_extra < DSV4_ARENA_EXTRA ? m->mem->alloc(bytes) : NULL;
    if (!p) {
        dsv4_fail(err, DSV4_E_NOMEM, "out of memory for a step's buffers (%zu bytes)", bytes);
        return NULL;
    }
    A->extra[A->n_extra] = p;
    A->extra_off[A->n_extra++] = A->off;
    A->off += bytes;
    return p;
}

/* Gives back every buffer taken since mark (a layer's, at its end): the arena's by rewinding,
 * the step's own ones by freeing them, so a step that outgrew the arena holds one layer's
 * buffers at a time. */
void dsv4_release(dsv4_model *m, size_t mark)
{
    dsv4_arena *A = &m->arena;
    while (A->n_extra > 0 && A->extra_off[A->n_extra - 1] >= mark)
        m->mem->free(A->extra[--A->n_extra]);
    A->off = mark;
}

static void arena_begin(dsv4_model *m)
{
    m->arena.off = 0;
    m->arena.want = 0;
}

/* Frees the step's own buffers; grows the arena to what the step wanted. */
static void arena_end(dsv4_model *m)
{
    dsv4_arena *A = &m->arena;
    int outgrown = A->want > A->cap;
    dsv4_release(m, 0);
    if (outgrown) {
        m->mem->free(A->base);
        A->cap = 0;
        A->gen++;
        if ((A->base = m->mem->alloc(A->want)))
            A->cap = A->want;
    }
    A->n_extra = 0;
}

void dsv4_arena_free(dsv4_model *m)
{
    if (m->mem && m->arena.base)
        m->mem->free(m->arena.base);
    memset(&m->arena, 0, sizeof m->arena);
}

float *dsv4_ftake(dsv4_model *m, size_t n, dsv4_err *err) { return dsv4_take(m, n * sizeof(float), err); }

/* Routed experts (top-k of score + bias, or the hash table's experts) plus the shared
 * expert. V4 weights each expert's output; V4.1 weights the expert's hidden activation
 * before w2 (spec §8), and in REF numerics rounds that activation and each projection to
 * bf16. ids [R] token ids, x [R, D], y [R, D]: backend memory. */
int dsv4_moe(dsv4_model *m, int li, const int32_t *ids, int R, const float *x, float *y, dsv4_err *err)
{
    return dsv4_moe_of(m, &m->layers[li], ids, R, x, y, err);
}

int dsv4_moe_of(dsv4_model *m, const dsv4_layer *L, const int32_t *ids, int R, const float *x, float *y, dsv4_err *err)
{
    const dsv4_config *c = &m->cfg;
    int D = c->dim, E = L->n_exp, K = L->n_act, I = c->moe_inter;
    float lim = (float)c->swiglu_limit;
    int64_t SI = (int64_t)I * (c->n_shared > 0 ? c->n_shared : 1);
    size_t mk = m->arena.off;
    float *lg = dsv4_ftake(m, (size_t)R * E, err), *wts = dsv4_ftake(m, (size_t)R * K, err);
    int32_t *eid = dsv4_take(m, (size_t)R * K * sizeof(int32_t), err);
    float *g = dsv4_ftake(m, (size_t)R * SI, err), *u = dsv4_ftake(m, (size_t)R * SI, err);
    float *ys = dsv4_ftake(m, (size_t)R * D, err);
    float *work = dsv4_ftake(m, DSV4_EXPERTS_WORK(R, K, D, I, E), err);
    if (err && err->code)
        return err->code;
    dsv4_lin(m, &L->gate, 0, E, x, R, D, lg, E, DSV4_LIN_F32OUT | DSV4_LIN_NOQ);
    m->be->route(lg, R, E, K, L->gate_bias, L->hash ? L->tid2eid : NULL, ids, c->norm_topk, (float)c->route_scale, eid,
                 wts);
    dsv4_experts_args ea = {.w1 = L->w1, .w2 = L->w2, .w3 = L->w3, .E = E, .K = K, .R = R, .D = D, .I = I, .eid = eid,
                            .wts = wts, .x = x, .limit = lim, .pre_weight = c->family == DSV4_FAMILY_V41,
                            .ref = m->numerics == DSV4_NUMERICS_REF, .y = y, .work = work};
    m->be->experts(&ea);
    if (c->n_shared > 0) {
        const dsv4_weight *sw[2] = {&L->sw1, &L->sw3};
        float *gu[2] = {g, u};
        dsv4_lin_multi(m, 2, sw, x, R, D, gu, 0);
        m->be->swiglu(g, u, (int64_t)R * SI, lim, g);
        dsv4_rnd(m, g, (int64_t)R * SI);
        dsv4_lin(m, &L->sw2, 0, D, g, R, SI, ys, D, 0);
        m->be->add(y, ys, (int64_t)R * D, y);
    }
    dsv4_rnd(m, y, (int64_t)R * D);
    dsv4_release(m, mk);
    return 0;
}

/* What a recording of the layers depends on besides buffer contents: the rows' layout per
 * sequence, the entry capacities and the arena's placement. */
static uint64_t step_key(const dsv4_step *f, const dsv4_batch *b)
{
    uint64_t h = 1469598103934665603ull;
#define MIX(v) (h = (h ^ (uint64_t)(v)) * 1099511628211ull)
    MIX(f->R);
    MIX(b->n_seqs);
    MIX(f->m->arena.gen);
    for (int i = 0; i < b->n_seqs; i++)
        MIX(b->n_ids[i]);
    for (int li = 0; li < f->m->cfg.n_layers; li++)
        MIX(f->vis_cap[li]);
#undef MIX
    return h;
}

int dsv4_layers_replayed(dsv4_step *f, int (*layers)(void *ctx, dsv4_err *err), void *ctx, dsv4_err *err)
{
    dsv4_model *m = f->m;
    const dsv4_backend *be = f->be;
    const char *env = getenv("DSV4_GRAPHS");
    if (!be->graph_begin || (env && !strcmp(env, "0")))
        return layers(ctx, err);
    uint64_t key = step_key(f, f->b);
    dsv4_graphs *G = &m->graphs;
    for (int i = 0; i < DSV4_GRAPH_SLOTS; i++)
        if (G->g[i] && G->key[i] == key) {
            be->graph_run(G->g[i]);
            G->use[i] = ++G->clock;
            return 0;
        }
    int bad = 0;
    for (int i = 0; i < DSV4_GRAPH_SLOTS; i++)
        bad |= i < G->n_unrecordable && G->unrecordable[i] == key;
    if (G->last != key || m->arena.n_extra || bad) { /* seen once, buffers not at their places, or not recordable */
        G->last = key;
        return layers(ctx, err);
    }
    if (be->graph_begin()) {
        G->last = 0;
        return layers(ctx, err);
    }
    int rc = layers(ctx, err);
    void *g = be->graph_end();
    if (rc || !g) { /* nothing ran while recording: run the ops, and do not try this shape again */
        if (g)
            be->graph_free(g);
        G->last = 0;
        if (!rc)
            G->unrecordable[G->n_unrecordable++ % DSV4_GRAPH_SLOTS] = key;
        return rc ? rc : layers(ctx, err);
    }
    int slot = 0;
    for (int i = 1; i < DSV4_GRAPH_SLOTS; i++)
        if (!G->g[i] || (G->g[slot] && G->use[i] < G->use[slot]))
            slot = i;
    if (G->g[slot])
        be->graph_free(G->g[slot]);
    G->g[slot] = g;
    G->key[slot] = key;
    G->use[slot] = ++G->clock;
    be->graph_run(g);
    return 0;
}

typedef struct v4_ctx { dsv4_step *f; float *X, *h, *y, *pre, *post, *comb; } v4_ctx;

static int v4_layers(void *ctx, dsv4_err *err)
{
    v4_ctx *v = ctx;
    return dsv4_v4_layers(v->f, v->X, v->h, v->y, v->pre, v->post, v->comb, err);
}

void dsv4_graphs_free(dsv4_model *m)
{
    for (int i = 0; i < DSV4_GRAPH_SLOTS; i++)
        if (m->graphs.g[i])
            m->be->graph_free(m->graphs.g[i]);
    memset(&m->graphs, 0, sizeof m->graphs);
}

/* Uploads the step's row layout and the table of each sequence's layer buffers, [n_layers, S]. */
static int step_rows(dsv4_step *f, const dsv4_batch *b, int64_t *start, int32_t *first, dsv4_err *err)
{
    dsv4_model *m = f->m;
    const dsv4_backend *mem = m->mem;
    int R = f->R, S = b->n_seqs, NL = m->cfg.n_layers;
    int64_t *dpos = dsv4_take(m, (size_t)R * sizeof(int64_t), err), *dstart = dsv4_take(m, (size_t)S * sizeof(int64_t), err);
    int32_t *dseq = dsv4_take(m, (size_t)R * sizeof(int32_t), err), *dfirst = dsv4_take(m, (size_t)S * sizeof(int32_t), err);
    int32_t *dids = dsv4_take(m, (size_t)R * sizeof(int32_t), err);
    dsv4_lbufs *st = dsv4_take(m, (size_t)NL * S * sizeof(dsv4_lbufs), err), *hst = malloc((size_t)NL * S * sizeof *hst);
    f->vis_cap = calloc(NL, sizeof(int64_t));
    if ((err && err->code) || !hst || !f->vis_cap) {
        free(hst);
        return err && err->code ? err->code : dsv4_fail(err, DSV4_E_NOMEM, "out of memory for a step of %d rows", R);
    }
    for (int li = 0; li < NL; li++)
        for (int i = 0; i < S; i++) {
            const dsv4_lbufs *ls = &b->seqs[i]->L[li];
            hst[(int64_t)li * S + i] = *ls;
            if (ls->ent_cap > f->vis_cap[li])
                f->vis_cap[li] = ls->ent_cap;
        }
    mem->upload(dpos, f->pos, (size_t)R * sizeof(int64_t));
    mem->upload(dseq, f->row_seq, (size_t)R * sizeof(int32_t));
    mem->upload(dstart, start, (size_t)S * sizeof(int64_t));
    mem->upload(dfirst, first, (size_t)S * sizeof(int32_t));
    mem->upload(dids, f->ids, (size_t)R * sizeof(int32_t));
    mem->upload(st, hst, (size_t)NL * S * sizeof(dsv4_lbufs));
    free(hst);
    f->dpos = dpos;
    f->dids = dids;
    f->st = st;
    f->rows = (dsv4_rows){.R = R, .S = S, .pos = dpos, .seq = dseq, .start = dstart, .first = dfirst};
    return 0;
}

/* The most bytes of logits the head writes to backend memory at a time (at least one row). */
#define HEAD_CHUNK_BYTES ((size_t)64 << 20)

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
    int n = c->hc_mult, D = c->dim, S = b->n_seqs;
    dsv4_step f = {.m = m, .be = be, .R = R, .b = b, .kv_cap = b->seqs[0]->kv_cap};
    f.pos = malloc(R * sizeof(int64_t));
    f.row_seq = malloc(R * sizeof(int32_t));
    int32_t *ids = malloc(R * sizeof(int32_t)), *first = malloc(S * sizeof(int32_t));
    int64_t *start = malloc(S * sizeof(int64_t));
    arena_begin(m);
    float *X = dsv4_ftake(m, (size_t)R * n * D, err), *h = dsv4_ftake(m, (size_t)R * D, err);
    float *y = dsv4_ftake(m, (size_t)R * D, err), *pre = dsv4_ftake(m, (size_t)R * n, err);
    float *post = dsv4_ftake(m, (size_t)R * n, err);
    float *comb = dsv4_ftake(m, (size_t)R * n * n, err);
    int rc = (err && err->code) || !f.pos || !f.row_seq || !ids || !first || !start;
    if (rc) {
        rc = err && err->code ? err->code : dsv4_fail(err, DSV4_E_NOMEM, "out of memory for a step of %d rows", R);
        goto out;
    }
    for (int i = 0, r = 0; i < S; i++) {
        start[i] = b->seqs[i]->len;
        first[i] = r;
        for (int j = 0; j < b->n_ids[i]; j++, r++) {
            f.pos[r] = b->seqs[i]->len + j;
            f.row_seq[r] = i;
            ids[r] = b->ids[i][j];
        }
    }
    f.ids = ids;
    if ((rc = step_rows(&f, b, start, first, err)))
        goto out;
    be->embed(&m->embed, f.dids, R, n, X);
    float eps = (float)c->norm_eps, hce = (float)c->hc_eps;
    if (c->family == DSV4_FAMILY_V41)
        rc = dsv4_v41_layers(&f, X, h, err);
    else {
        v4_ctx v = {&f, X, h, y, pre, post, comb};
        rc = dsv4_layers_replayed(&f, v4_layers, &v, err);
        if (!rc && m->mtp.on) /* before the head reuses X */
            rc = dsv4_mtp_window(&f, X, err);
    }
    if (!rc && be->check) /* a device op failed: the sequences do not advance */
        rc = be->check(err);
    /* The head's output: on a device from the arena, copied out to the caller's logits a chunk
     * of rows at a time (bounded however many rows ask; a row's logits do not depend on the
     * rows beside it); in host memory (the CPU) the caller's array itself. Taken before the
     * sequences advance, so running out of memory leaves them as they were. */
    int64_t V = c->vocab;
    int hrows = 0, chunk = 0;
    float *lg = NULL;
    for (int i = 0; b->logits && i < S; i++)
        hrows += b->all_logits ? b->n_ids[i] : b->n_ids[i] > 0;
    if (!rc && hrows) {
        chunk = m->be->place ? (int)(HEAD_CHUNK_BYTES / ((size_t)V * sizeof(float))) : hrows;
        chunk = chunk < 1 ? 1 : chunk > hrows ? hrows : chunk;
        lg = m->be->place ? dsv4_ftake(m, (size_t)chunk * V, err) : b->logits;
        if (!lg)
            rc = err && err->code ? err->code : DSV4_E_NOMEM;
    }
    if (rc)
        goto out;
    for (int i = 0; i < S; i++) {
        b->seqs[i]->len += b->n_ids[i];
        if (b->seqs[i]->len > b->seqs[i]->hi)
            b->seqs[i]->hi = b->seqs[i]->len;
    }
    if (b->logits) {
        /* Head rows: every row, or each sequence's last. V4.1's layers already left the
         * final collapse in h; V4 collapses the selected rows with its head mix. */
        int v41 = c->family == DSV4_FAMILY_V41, nr = 0;
        for (int i = 0, r = 0; i < S; i++) {
            for (int j = 0; j < b->n_ids[i]; j++, r++)
                if (b->all_logits || j == b->n_ids[i] - 1) {
                    if (nr != r && v41)
                        m->mem->copy(h + (int64_t)nr * D, h + (int64_t)r * D, (size_t)D * sizeof(float));
                    else if (nr != r)
                        m->mem->copy(X + (int64_t)nr * n * D, X + (int64_t)r * n * D, (size_t)n * D * sizeof(float));
                    nr++;
                }
        }
        int ref = m->numerics == DSV4_NUMERICS_REF;
        if (!v41) /* REF: the collapse through bf16 before its norm, as at the layers' sites */
            be->hc_pre(X, nr, n, D, m->hc_head_fn, m->hc_head_base, m->hc_head_scale, 0, hce, eps, pre, NULL, NULL, h,
                       ref ? NULL : m->norm);
        if (!v41 && ref)
            dsv4_rnd(m, h, (int64_t)nr * D);
        if (v41 || ref)
            dsv4_norm(m, h, nr, D, m->norm, eps, h);
        for (int r0 = 0; r0 < nr; r0 += chunk) {
            int rows = nr - r0 < chunk ? nr - r0 : chunk;
            float *out = lg == b->logits ? b->logits + (size_t)r0 * V : lg;
            be->linear(&m->head, 0, V, h + (int64_t)r0 * D, rows, D, out, V);
            if (out != b->logits + (size_t)r0 * V)
                m->mem->download(b->logits + (size_t)r0 * V, lg, (size_t)rows * V * sizeof(float));
        }
        if (be->check)
            rc = be->check(err);
    }
out:
    arena_end(m);
    free(f.pos);
    free(f.row_seq);
    free(f.vis_cap);
    free(ids);
    free(first);
    free(start);
    return rc;
}
