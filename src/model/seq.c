/* Sequence state: per layer a ring of window rows, rings of compressor inputs, and the
 * emitted compressed entries / indexer keys. Everything the next token needs is here, so a
 * sequence can be copied, saved to bytes, restored and rolled back.
 *
 * Rollback: rings hold `need + max_rollback` rows, so rows for any length n >= hi - max_rollback
 * are still present (hi = furthest length reached); entries past n / ratio are dropped and
 * re-emitted identically when the tokens come again. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "kernels/kv_format.h"
#include "model/model.h"

int dsv4_c_cap(const dsv4_model *m, const dsv4_layer *L) { return L->c_span + m->max_rollback; }

/* Bytes of one window row, compressed entry and indexer key in the model's cache format. */
static size_t win_row(const dsv4_model *m)
{
    return m->kv_prod ? (size_t)dsv4_kv_row_bytes(DSV4_KV_WINDOW, m->cfg.head_dim) : (size_t)m->cfg.head_dim * sizeof(float);
}
static size_t ent_row(const dsv4_model *m)
{
    return m->kv_prod ? (size_t)dsv4_kv_row_bytes(DSV4_KV_MAIN, m->cfg.head_dim) : (size_t)m->cfg.head_dim * sizeof(float);
}
static size_t ikey_row(const dsv4_model *m)
{
    return m->kv_prod ? (size_t)dsv4_kv_row_bytes(DSV4_KV_INDEX, m->cfg.index_dim) : (size_t)m->cfg.index_dim * sizeof(float);
}

dsv4_seq *dsv4_seq_new(dsv4_model *m, dsv4_err *err)
{
    const dsv4_config *c = &m->cfg;
    dsv4_seq *s = calloc(1, sizeof *s);
    if (!s) {
        dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
        return NULL;
    }
    s->m = m;
    const dsv4_backend *mem = m->mem;
    s->kv_cap = c->window + m->max_rollback;
    s->L = calloc(c->n_layers, sizeof *s->L);
    int ok = s->L != NULL;
    for (int i = 0; i < c->n_layers && ok; i++) {
        const dsv4_layer *L = &m->layers[i];
        dsv4_lbufs *ls = &s->L[i];
        if (m->kv_prod)
            ok = (ls->pkv = mem->alloc((size_t)s->kv_cap * win_row(m))) != NULL;
        else
            ok = (ls->kv = mem->alloc((size_t)s->kv_cap * win_row(m))) != NULL;
        if (L->cw && ok) {
            size_t n = (size_t)dsv4_c_cap(m, L) * L->cw;
            ok = (ls->c = mem->alloc(n * sizeof(float))) && (ls->z = mem->alloc(n * sizeof(float)));
        }
        if (L->icw && ok) {
            size_t ni = (size_t)dsv4_c_cap(m, L) * L->icw;
            ok = (ls->ic = mem->alloc(ni * sizeof(float))) && (ls->iz = mem->alloc(ni * sizeof(float)));
        }
    }
    if (ok && m->spec.on) { /* the DSpark stages' windows, kept and rolled back as the layers' are */
        ok = (s->skv = calloc(m->spec.n, sizeof *s->skv)) != NULL;
        for (int i = 0; i < m->spec.n && ok; i++)
            ok = (s->skv[i] = mem->alloc((size_t)s->kv_cap * c->head_dim * sizeof(float))) != NULL;
    }
    if (ok && m->mtp.on) /* V4's MTP window and the final streams its next row reads */
        ok = (s->mkv = mem->alloc((size_t)s->kv_cap * c->head_dim * sizeof(float))) &&
             (s->mhs = mem->alloc((size_t)s->kv_cap * c->hc_mult * c->dim * sizeof(float)));
    if (ok && c->n_engram) {
        s->e_cap = c->engram_max_ngram - 1 + m->max_rollback;
        ok = (s->etok = calloc(s->e_cap, sizeof(int32_t))) != NULL;
    }
    if (!ok) {
        dsv4_seq_free(s);
        dsv4_fail(err, DSV4_E_NOMEM, "out of memory creating a sequence");
        return NULL;
    }
    return s;
}

void dsv4_seq_free(dsv4_seq *s)
{
    if (!s)
        return;
    if (s->L)
        for (int i = 0; i < s->m->cfg.n_layers; i++) {
            dsv4_lbufs *ls = &s->L[i];
            void *all[] = {ls->kv, ls->c, ls->z, ls->ent, ls->ic, ls->iz, ls->ikey, ls->pkv, ls->pent, ls->pikey};
            for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
                if (all[k])
                    s->m->mem->free(all[k]);
        }
    free(s->L);
    for (int i = 0; s->skv && i < s->m->spec.n; i++)
        if (s->skv[i])
            s->m->mem->free(s->skv[i]);
    free(s->skv);
    if (s->mkv)
        s->m->mem->free(s->mkv);
    if (s->mhs)
        s->m->mem->free(s->mhs);
    free(s->etok);
    free(s);
}

int64_t dsv4_seq_len(const dsv4_seq *s) { return s->len; }

/* Rows [old, cap) of `row` bytes added to a buffer of backend memory. The old buffer may still be read by queued
 * ops; the backend's free waits for them. */
static int grow(const dsv4_backend *mem, void *bufp, int64_t old, int64_t cap, size_t row)
{
    void **buf = bufp;
    void *e = mem->alloc((size_t)cap * row);
    if (!e)
        return -1;
    if (*buf) {
        mem->copy(e, *buf, (size_t)old * row);
        mem->free(*buf);
    }
    *buf = e;
    return 0;
}

/* The entry capacity a buffer has once it holds `need` entries (it starts at 16, doubling). */
static int64_t ent_cap_for(int64_t need)
{
    int64_t cap = 16;
    while (cap < need)
        cap *= 2;
    return need ? cap : 0;
}

/* Makes room for the entries that n_tokens of context emit. */
int dsv4_seq_reserve(dsv4_seq *s, int64_t n_tokens, dsv4_err *err)
{
    const dsv4_config *c = &s->m->cfg;
    for (int i = 0; i < c->n_layers; i++) {
        const dsv4_layer *L = &s->m->layers[i];
        dsv4_lbufs *ls = &s->L[i];
        if (!L->own_ent)
            continue;
        int64_t need = n_tokens / L->ratio;
        if (need <= ls->ent_cap)
            continue;
        int64_t cap = ls->ent_cap ? ls->ent_cap : 16;
        while (cap < need)
            cap *= 2;
        int prod = s->m->kv_prod;
        if (grow(s->m->mem, prod ? (void *)&ls->pent : (void *)&ls->ent, ls->ent_cap, cap, ent_row(s->m)))
            return dsv4_fail(err, DSV4_E_NOMEM, "out of memory growing the compressed cache to %lld entries", (long long)cap);
        if (L->own_ikey && grow(s->m->mem, prod ? (void *)&ls->pikey : (void *)&ls->ikey, ls->ent_cap, cap, ikey_row(s->m)))
            return dsv4_fail(err, DSV4_E_NOMEM, "out of memory growing the indexer keys to %lld entries", (long long)cap);
        ls->ent_cap = cap;
    }
    return 0;
}

/* Walks every buffer of the state in a fixed order; used by save, restore, copy and bytes.
 * Sizes are in bytes. */
typedef void (*visit_fn)(void *ctx, void *buf, size_t bytes, int host);

static void visit(dsv4_seq *s, visit_fn f, void *ctx)
{
    const dsv4_model *m = s->m;
    const dsv4_config *c = &m->cfg;
    for (int i = 0; i < c->n_layers; i++) {
        const dsv4_layer *L = &m->layers[i];
        dsv4_lbufs *ls = &s->L[i];
        f(ctx, m->kv_prod ? (void *)ls->pkv : (void *)ls->kv, (size_t)s->kv_cap * win_row(m), 0);
        size_t n = (size_t)dsv4_c_cap(m, L) * L->cw * sizeof(float), ne = L->own_ent ? (size_t)(s->len / L->ratio) : 0;
        if (L->cw) {
            f(ctx, ls->c, n, 0);
            f(ctx, ls->z, n, 0);
        }
        if (L->own_ent)
            f(ctx, m->kv_prod ? (void *)ls->pent : (void *)ls->ent, ne * ent_row(m), 0);
        if (L->icw) {
            size_t ni = (size_t)dsv4_c_cap(m, L) * L->icw * sizeof(float);
            f(ctx, ls->ic, ni, 0);
            f(ctx, ls->iz, ni, 0);
        }
        if (L->own_ikey)
            f(ctx, m->kv_prod ? (void *)ls->pikey : (void *)ls->ikey, ne * ikey_row(m), 0);
    }
    if (s->etok)
        f(ctx, s->etok, (size_t)s->e_cap * sizeof(int32_t), 1);
    for (int i = 0; s->skv && i < s->m->spec.n; i++)
        f(ctx, s->skv[i], (size_t)s->kv_cap * c->head_dim * sizeof(float), 0);
    if (s->mkv) {
        f(ctx, s->mkv, (size_t)s->kv_cap * c->head_dim * sizeof(float), 0);
        f(ctx, s->mhs, (size_t)s->kv_cap * c->hc_mult * c->dim * sizeof(float), 0);
    }
}

static void count_fn(void *ctx, void *buf, size_t n, int host)
{
    (void)buf;
    (void)host;
    *(size_t *)ctx += n;
}

size_t dsv4_seq_bytes(const dsv4_seq *s)
{
    size_t n = 0;
    visit((dsv4_seq *)s, count_fn, &n);
    return n;
}

/* The state's bytes at n tokens; cap: the entry buffers' allocation instead of their used part. */
static size_t bytes_at(const dsv4_model *m, int64_t n, int cap)
{
    const dsv4_config *c = &m->cfg;
    size_t b = 0;
    for (int i = 0; i < c->n_layers; i++) {
        const dsv4_layer *L = &m->layers[i];
        b += (size_t)(c->window + m->max_rollback) * win_row(m);
        b += 2 * (size_t)dsv4_c_cap(m, L) * (L->cw + L->icw) * sizeof(float);
        if (L->own_ent) {
            size_t ne = (size_t)(cap ? ent_cap_for(n / L->ratio) : n / L->ratio);
            b += ne * (ent_row(m) + (L->own_ikey ? ikey_row(m) : 0));
        }
    }
    if (c->n_engram)
        b += (size_t)(c->engram_max_ngram - 1 + m->max_rollback) * sizeof(int32_t);
    return b;
}

size_t dsv4_seq_bytes_at(const dsv4_model *m, int64_t n_tokens) { return bytes_at(m, n_tokens < 0 ? 0 : n_tokens, 0); }

size_t dsv4_model_state_room(const dsv4_model *m) { return m->mem->state_room ? m->mem->state_room() : 0; }

int64_t dsv4_kv_fit(const dsv4_model *m, int lanes, size_t budget)
{
    if (lanes < 1)
        lanes = 1;
    double per = (double)budget / lanes;
    if ((double)bytes_at(m, 0, 1) > per)
        return 0;
    int64_t lo = 0, hi = (int64_t)1 << 40; /* lo fits, hi does not */
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if ((double)bytes_at(m, mid, 1) <= per)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

typedef struct { uint8_t *p; const uint8_t *q; const dsv4_backend *mem; } cursor;
/* Empty buffers (no entries yet) may be NULL: the copies must not see them. Buffers are in
 * m->mem, except the Engram history, which the host keeps (host). */
static void put_fn(void *ctx, void *buf, size_t n, int host)
{
    cursor *c = ctx;
    if (n && host)
        memcpy(c->p, buf, n);
    else if (n)
        c->mem->download(c->p, buf, n);
    c->p += n;
}
static void get_fn(void *ctx, void *buf, size_t n, int host)
{
    cursor *c = ctx;
    if (n && host)
        memcpy(buf, c->q, n);
    else if (n)
        c->mem->upload(buf, c->q, n);
    c->q += n;
}

/* Version 2: a header of magic, layout, length, furthest length and cache format (0 exact,
 * 1 production), then the buffers in visit order. */
#define SEQ_MAGIC "DSV4SEQ2"
#define SEQ_HDR 40

/* A fingerprint of what the state layout depends on, so bytes never restore into another model. */
static uint64_t layout_id(const dsv4_seq *s)
{
    const dsv4_config *c = &s->m->cfg;
    uint64_t h = 1469598103934665603ull;
    int v[] = {c->n_layers, c->head_dim, c->window, c->index_dim, s->kv_cap, s->m->max_rollback, c->vocab, c->dim, s->m->kv_prod};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        h = (h ^ (uint64_t)v[i]) * 1099511628211ull;
    for (int i = 0; i < c->n_layers; i++)
        h = (h ^ (uint64_t)(c->ratio[i] * 2 + s->m->layers[i].csa)) * 1099511628211ull;
    h = (h ^ (uint64_t)(s->mkv != NULL)) * 1099511628211ull;
    if (c->family == DSV4_FAMILY_V41) { /* which layers own caches, and the Engram history */
        for (int i = 0; i < c->n_layers; i++)
            h = (h ^ (uint64_t)(s->m->layers[i].own_ent * 2 + s->m->layers[i].own_ikey)) * 1099511628211ull;
        h = (h ^ (uint64_t)s->e_cap) * 1099511628211ull;
        h = (h ^ (uint64_t)(s->skv ? s->m->spec.n : 0)) * 1099511628211ull;
    }
    return h;
}

int dsv4_seq_save(const dsv4_seq *s, void **buf, size_t *len, dsv4_err *err)
{
    size_t body = dsv4_seq_bytes(s), n = SEQ_HDR + body;
    uint8_t *b = dsv4_xmalloc(n, err);
    if (!b)
        return err->code;
    uint64_t hdr[4] = {layout_id(s), (uint64_t)s->len, (uint64_t)s->hi, (uint64_t)s->m->kv_prod};
    memcpy(b, SEQ_MAGIC, 8);
    memcpy(b + 8, hdr, sizeof hdr);
    cursor c = {.p = b + SEQ_HDR, .mem = s->m->mem};
    visit((dsv4_seq *)s, put_fn, &c);
    *buf = b;
    *len = n;
    return 0;
}

int dsv4_seq_restore(dsv4_seq *s, const void *buf, size_t len, dsv4_err *err)
{
    const uint8_t *b = buf;
    uint64_t hdr[4];
    if (len >= 8 && !memcmp(b, "DSV4SEQ1", 8))
        return dsv4_fail(err, DSV4_E_ARG, "sequence bytes: saved by an older dsv4 (state version 1; this one reads version 2)");
    if (len < SEQ_HDR || memcmp(b, SEQ_MAGIC, 8))
        return dsv4_fail(err, DSV4_E_ARG, "sequence bytes: not a saved dsv4 sequence");
    memcpy(hdr, b + 8, sizeof hdr);
    if (hdr[3] != (uint64_t)s->m->kv_prod)
        return dsv4_fail(err, DSV4_E_ARG, "sequence bytes: saved with %s KV caches, this model keeps %s ones",
                         hdr[3] ? "production" : "exact", s->m->kv_prod ? "production" : "exact");
    if (hdr[0] != layout_id(s))
        return dsv4_fail(err, DSV4_E_ARG, "sequence bytes: saved from a different model or rollback setting");
    int64_t old_len = s->len;
    s->len = (int64_t)hdr[1];
    if (dsv4_seq_reserve(s, s->len, err) || dsv4_seq_bytes(s) != len - SEQ_HDR) {
        s->len = old_len;
        if (!err || !err->code)
            dsv4_fail(err, DSV4_E_ARG, "sequence bytes: %zu bytes do not match the saved length", len);
        return err ? err->code : DSV4_E_ARG;
    }
    s->hi = (int64_t)hdr[2];
    cursor c = {.q = b + SEQ_HDR, .mem = s->m->mem};
    visit(s, get_fn, &c);
    return 0;
}

dsv4_seq *dsv4_seq_copy(const dsv4_seq *s, dsv4_err *err)
{
    void *b;
    size_t n;
    if (dsv4_seq_save(s, &b, &n, err))
        return NULL;
    dsv4_seq *d = dsv4_seq_new(s->m, err);
    if (d && dsv4_seq_restore(d, b, n, err)) {
        dsv4_seq_free(d);
        d = NULL;
    }
    free(b);
    return d;
}

int dsv4_seq_truncate(dsv4_seq *s, int64_t n, dsv4_err *err)
{
    if (n < 0 || n > s->len)
        return dsv4_fail(err, DSV4_E_ARG, "cannot truncate a sequence of %lld tokens to %lld", (long long)s->len, (long long)n);
    if (n < s->hi - s->m->max_rollback)
        return dsv4_fail(err, DSV4_E_STATE,
                         "cannot roll back to %lld tokens: the caches keep %d tokens of history behind the furthest point (%lld); restore a saved state instead",
                         (long long)n, s->m->max_rollback, (long long)s->hi);
    s->len = n;
    return 0;
}

/* Bytes of host staging fill_rows gathers rows in before one upload (a long context's rows go up
 * in a few hundred copies, not one a row). */
#define FILL_STAGE ((size_t)4 << 20)

/* Random rows of width n (uniform in [-1, 1)) stored as the model keeps them at dst (backend
 * memory), gathered in stage (FILL_STAGE bytes, at least one row). */
static void fill_rows(const dsv4_model *m, void *dst, int64_t rows, int n, int fmt, float *tmp, uint8_t *stage, uint64_t *x)
{
    size_t rb = fmt < 0 ? (size_t)n * sizeof(float) : (size_t)dsv4_kv_row_bytes(fmt, n);
    int64_t per = (int64_t)(FILL_STAGE / rb) > 0 ? (int64_t)(FILL_STAGE / rb) : 1;
    for (int64_t r0 = 0; r0 < rows; r0 += per) {
        int64_t nr = rows - r0 < per ? rows - r0 : per;
        for (int64_t r = 0; r < nr; r++) {
            uint8_t *row = stage + (size_t)r * rb;
            float *v = fmt >= 0 ? tmp : (float *)(void *)row;
            for (int i = 0; i < n; i++) {
                *x = *x * 6364136223846793005ull + 1442695040888963407ull;
                v[i] = (float)((*x >> 40) * 0x1p-23 - 1.0);
            }
            if (fmt >= 0)
                dsv4_kv_pack(fmt, tmp, n, row);
        }
        m->mem->upload((uint8_t *)dst + (size_t)r0 * rb, stage, (size_t)nr * rb);
    }
}

int dsv4_seq_fill_synthetic(dsv4_seq *s, int64_t n, uint64_t seed, dsv4_err *err)
{
    const dsv4_model *m = s->m;
    const dsv4_config *c = &m->cfg;
    if (dsv4_seq_reserve(s, n, err))
        return err->code;
    int w = 2 * (c->head_dim > c->index_dim ? c->head_dim : c->index_dim); /* the widest row: a CSA compressor's 2 d */
    float *tmp = dsv4_fbuf((size_t)w, err);
    uint8_t *pk = dsv4_xmalloc(FILL_STAGE > (size_t)w * sizeof(float) ? FILL_STAGE : (size_t)w * sizeof(float), err);
    if (!tmp || !pk) {
        free(tmp);
        free(pk);
        return err->code;
    }
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    int prod = m->kv_prod;
    for (int i = 0; i < c->n_layers; i++) {
        const dsv4_layer *L = &m->layers[i];
        dsv4_lbufs *ls = &s->L[i];
        fill_rows(m, prod ? (void *)ls->pkv : (void *)ls->kv, s->kv_cap, c->head_dim, prod ? DSV4_KV_WINDOW : -1, tmp, pk, &x);
        if (L->cw) {
            fill_rows(m, ls->c, dsv4_c_cap(m, L), L->cw, -1, tmp, pk, &x);
            fill_rows(m, ls->z, dsv4_c_cap(m, L), L->cw, -1, tmp, pk, &x);
        }
        if (L->icw) {
            fill_rows(m, ls->ic, dsv4_c_cap(m, L), L->icw, -1, tmp, pk, &x);
            fill_rows(m, ls->iz, dsv4_c_cap(m, L), L->icw, -1, tmp, pk, &x);
        }
        if (L->own_ent)
            fill_rows(m, prod ? (void *)ls->pent : (void *)ls->ent, n / L->ratio, c->head_dim, prod ? DSV4_KV_MAIN : -1, tmp, pk, &x);
        if (L->own_ikey)
            fill_rows(m, prod ? (void *)ls->pikey : (void *)ls->ikey, n / L->ratio, c->index_dim, prod ? DSV4_KV_INDEX : -1, tmp,
                      pk, &x);
    }
    for (int i = 0; s->etok && i < s->e_cap; i++)
        s->etok[i] = m->engram_pad;
    s->len = s->hi = n;
    free(tmp);
    free(pk);
    return 0;
}
