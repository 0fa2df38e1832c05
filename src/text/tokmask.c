/* tokmask — the vocabulary trie walk and the per-request constraint. See tokmask.h. */
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "text/tokmask.h"

/* One byte trie over a set of tokens. */
typedef struct trie {
    int n;              /* nodes, in preorder; the root (the empty prefix) is not stored */
    uint8_t *byte;      /* [n] the edge's byte */
    uint16_t *depth;    /* [n] 1 for the root's children */
    uint32_t *skip;     /* [n] the first node past this one's subtree */
    uint32_t *tok0;     /* [n] first token ending here, in ids[] */
    uint16_t *ntok;     /* [n] tokens ending here (equal byte strings share a node) */
    int32_t *ids;       /* tokens sorted by their bytes */
} trie;

/* Free-text shortcut: inside a free JSON string every string-safe token (no '"', '\\' or
 * control byte, whole UTF-8 characters) keeps the state alive, so only the other tokens need a
 * walk, over a trie of those alone; likewise for raw text and tokens without '<' or NUL. */
enum { SHORT_CHARS = 32 }; /* string-safe tokens of up to this many characters are bucketed */

struct dsv4_vocab_trie {
    int32_t n_ids;
    trie all, not_str, not_raw;
    uint64_t *safe_str, *safe_raw; /* [words] */
    /* a bounded string (maxLength) with room for k more characters allows the string-safe
     * tokens of at most k characters: safe_le[k] (k <= SHORT_CHARS) holds them, and not_short
     * the tokens left to walk (not safe, or longer than SHORT_CHARS characters) */
    uint64_t *safe_le;             /* [SHORT_CHARS + 1][words] */
    trie not_short;
    int max_len;
    uint32_t *id_off;   /* [n_ids + 1] each id's bytes in id_bytes (empty: not in the trie) */
    uint8_t *id_bytes;
};

typedef struct tok_ref {
    const uint8_t *s;
    size_t n;
    int32_t id;
} tok_ref;

static int cmp_tok(const void *a, const void *b)
{
    const tok_ref *x = a, *y = b;
    size_t n = x->n < y->n ? x->n : y->n;
    int c = memcmp(x->s, y->s, n);
    if (c)
        return c;
    if (x->n != y->n)
        return x->n < y->n ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static void trie_free(trie *t)
{
    free(t->byte);
    free(t->depth);
    free(t->skip);
    free(t->tok0);
    free(t->ntok);
    free(t->ids);
    memset(t, 0, sizeof *t);
}

void dsv4_vocab_trie_free(dsv4_vocab_trie *v)
{
    if (!v)
        return;
    trie_free(&v->all);
    trie_free(&v->not_str);
    trie_free(&v->not_raw);
    trie_free(&v->not_short);
    free(v->safe_le);
    free(v->safe_str);
    free(v->safe_raw);
    free(v->id_off);
    free(v->id_bytes);
    free(v);
}

int32_t dsv4_vocab_trie_n_ids(const dsv4_vocab_trie *v) { return v->n_ids; }
int dsv4_vocab_trie_n_nodes(const dsv4_vocab_trie *v) { return v->all.n; }

/* Builds t from refs[0..m) sorted by bytes, `total` bytes in all. */
static int trie_build(trie *t, const tok_ref *refs, int m, size_t total)
{
    t->byte = malloc(total + 1);
    t->depth = malloc((total + 1) * sizeof *t->depth);
    t->skip = malloc((total + 1) * sizeof *t->skip);
    t->tok0 = malloc((total + 1) * sizeof *t->tok0);
    t->ntok = calloc(total + 1, sizeof *t->ntok);
    t->ids = malloc((size_t)(m ? m : 1) * sizeof *t->ids);
    uint32_t *open = malloc((65536 + 1) * sizeof *open); /* node at each depth on the current path */
    if (!t->byte || !t->depth || !t->skip || !t->tok0 || !t->ntok || !t->ids || !open) {
        free(open);
        return -1;
    }
    int n = 0, path = 0;
    const tok_ref *prev = NULL;
    for (int i = 0; i < m; i++) {
        const tok_ref *r = &refs[i];
        t->ids[i] = r->id;
        size_t lcp = 0;
        if (prev)
            while (lcp < prev->n && lcp < r->n && prev->s[lcp] == r->s[lcp])
                lcp++;
        /* close the nodes deeper than the shared prefix: their subtrees end here */
        for (; path > (int)lcp; path--)
            t->skip[open[path]] = (uint32_t)n;
        for (size_t d = lcp; d < r->n; d++) {
            t->byte[n] = r->s[d];
            t->depth[n] = (uint16_t)(d + 1);
            t->tok0[n] = 0;
            open[++path] = (uint32_t)n;
            n++;
        }
        const uint32_t at = open[path];
        if (!t->ntok[at])
            t->tok0[at] = (uint32_t)i;
        t->ntok[at]++;
        prev = r;
    }
    for (; path > 0; path--)
        t->skip[open[path]] = (uint32_t)n;
    t->n = n;
    free(open);
    return 0;
}

static int whole_utf8(const uint8_t *s, size_t n)
{
    int inc;
    return dsv4_utf8_valid_prefix(s, n, &inc) == n;
}

static int str_safe(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] < 0x20 || s[i] == '"' || s[i] == '\\')
            return 0;
    return whole_utf8(s, n);
}

static size_t n_chars(const uint8_t *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += (s[i] & 0xC0) != 0x80;
    return k;
}

static int short_safe(const uint8_t *s, size_t n) { return str_safe(s, n) && n_chars(s, n) <= SHORT_CHARS; }

static int raw_safe(const uint8_t *s, size_t n) { return !memchr(s, '<', n) && !memchr(s, 0, n) && whole_utf8(s, n); }

/* The refs (sorted) that `safe` refuses, into out; returns their number and byte total. */
static int unsafe_refs(const tok_ref *refs, int m, int (*safe)(const uint8_t *, size_t), uint64_t *bits, tok_ref *out,
                       size_t *total)
{
    int k = 0;
    *total = 0;
    for (int i = 0; i < m; i++) {
        if (safe(refs[i].s, refs[i].n)) {
            bits[refs[i].id >> 6] |= 1ull << (refs[i].id & 63);
            continue;
        }
        out[k++] = refs[i];
        *total += refs[i].n;
    }
    return k;
}

dsv4_vocab_trie *dsv4_vocab_trie_new(const dsv4_tokenizer *t, int32_t n_ids, dsv4_err *err)
{
    const int32_t nt = dsv4_tokenizer_n_vocab(t) < n_ids ? dsv4_tokenizer_n_vocab(t) : n_ids;
    dsv4_vocab_trie *v = dsv4_xcalloc(1, sizeof *v, err);
    tok_ref *refs = dsv4_xmalloc((size_t)(nt > 0 ? nt : 1) * sizeof *refs, err);
    tok_ref *sub = dsv4_xmalloc((size_t)(nt > 0 ? nt : 1) * sizeof *sub, err);
    if (!v || !refs || !sub)
        goto fail;
    v->n_ids = n_ids;
    int m = 0;
    size_t total = 0;
    for (int32_t id = 0; id < nt; id++) {
        size_t len = 0;
        const char *b = dsv4_tokenizer_id_bytes(t, id, &len);
        if (!b || !len || dsv4_tokenizer_is_special(t, id))
            continue;
        if (len > 65535) {
            dsv4_fail(err, DSV4_E_FORMAT, "token %d is %zu bytes long", id, len);
            goto fail;
        }
        refs[m++] = (tok_ref){(const uint8_t *)b, len, id};
        total += len;
        if ((int)len > v->max_len)
            v->max_len = (int)len;
    }
    v->id_off = dsv4_xcalloc((size_t)n_ids + 1, sizeof *v->id_off, err);
    v->id_bytes = dsv4_xmalloc(total + 1, err);
    v->safe_str = dsv4_xcalloc(dsv4_mask_words(n_ids), sizeof *v->safe_str, err);
    v->safe_raw = dsv4_xcalloc(dsv4_mask_words(n_ids), sizeof *v->safe_raw, err);
    v->safe_le = dsv4_xcalloc((SHORT_CHARS + 1) * dsv4_mask_words(n_ids), sizeof *v->safe_le, err);
    if (!v->id_off || !v->id_bytes || !v->safe_str || !v->safe_raw || !v->safe_le)
        goto fail;
    uint32_t off = 0;
    for (int i = 0, at = 0; i < n_ids; i++) { /* refs are in id order here */
        v->id_off[i] = off;
        if (at < m && refs[at].id == i) {
            memcpy(v->id_bytes + off, refs[at].s, refs[at].n);
            off += (uint32_t)refs[at].n;
            at++;
        }
    }
    v->id_off[n_ids] = off;
    qsort(refs, (size_t)m, sizeof *refs, cmp_tok);
    if (trie_build(&v->all, refs, m, total))
        goto fail;
    size_t sub_total;
    int k = unsafe_refs(refs, m, str_safe, v->safe_str, sub, &sub_total);
    if (trie_build(&v->not_str, sub, k, sub_total))
        goto fail;
    k = unsafe_refs(refs, m, raw_safe, v->safe_raw, sub, &sub_total);
    if (trie_build(&v->not_raw, sub, k, sub_total))
        goto fail;
    const size_t W = dsv4_mask_words(n_ids);
    k = unsafe_refs(refs, m, short_safe, v->safe_le, sub, &sub_total); /* safe_le[0] as scratch */
    if (trie_build(&v->not_short, sub, k, sub_total))
        goto fail;
    memset(v->safe_le, 0, W * sizeof *v->safe_le);
    for (int i = 0; i < m; i++)
        if (short_safe(refs[i].s, refs[i].n))
            for (size_t c = n_chars(refs[i].s, refs[i].n); c <= SHORT_CHARS; c++)
                v->safe_le[c * W + (refs[i].id >> 6)] |= 1ull << (refs[i].id & 63);
    free(sub);
    free(refs);
    return v;
fail:
    free(sub);
    free(refs);
    dsv4_vocab_trie_free(v);
    if (!err->code)
        dsv4_fail(err, DSV4_E_NOMEM, "out of memory building the vocabulary trie");
    return NULL;
}

size_t dsv4_vocab_trie_scratch(const dsv4_vocab_trie *v) { return (size_t)(v->max_len + 1) * sizeof(dsv4_gstate); }

/* Sets in mask the tokens of t's nodes [from, to) (whole subtrees) whose bytes s takes.
 * st: [max_len + 1] states. */
static void walk(const trie *t, int from, int to, const dsv4_grammar *g, const dsv4_gstate *s, uint64_t *mask,
                 dsv4_gstate *st)
{
    memcpy(&st[0], s, dsv4_gstate_size(s)); /* st[d]: the state after the path's first d bytes */
    for (int i = from; i < to;) {
        const int d = t->depth[i];
        if (!dsv4_gstate_feed(g, &st[d - 1], t->byte[i], &st[d])) {
            i = (int)t->skip[i];
            continue;
        }
        for (int k = 0; k < t->ntok[i]; k++) {
            const int32_t id = t->ids[t->tok0[i] + k];
            mask[id >> 6] |= 1ull << (id & 63);
        }
        i++;
    }
}

/* The node reached by the bytes p[0..n) from the root, or -1. */
static int trie_find(const trie *t, const uint8_t *p, size_t n)
{
    int i = 0, found = -1;
    for (size_t d = 0; d < n; d++) {
        /* the children of the node found so far (the root's: depth 1) start at i */
        const int end = found < 0 ? t->n : (int)t->skip[found];
        while (i < end && t->byte[i] != p[d])
            i = (int)t->skip[i];
        if (i >= end)
            return -1;
        found = i++;
    }
    return found;
}

int dsv4_vocab_trie_mask(const dsv4_vocab_trie *v, const dsv4_grammar *g, const dsv4_gstate *s, const int32_t *eos,
                         int n_eos, uint64_t *mask, void *scratch, dsv4_err *err)
{
    void *own = NULL;
    if (!scratch) {
        scratch = own = dsv4_xmalloc(dsv4_vocab_trie_scratch(v), err);
        if (!own)
            return -1;
    }
    const size_t W = dsv4_mask_words(v->n_ids);
    memset(mask, 0, W * sizeof *mask);
    uint32_t room;
    const uint8_t *rest;
    size_t rest_n;
    const int free_text = dsv4_gstate_free_text(g, s, &room, &rest, &rest_n);
    const trie *t = &v->all;
    if ((free_text & DSV4_FREE_STRING) && room == UINT32_MAX) {
        for (size_t w = 0; w < W; w++)
            mask[w] |= v->safe_str[w];
        t = &v->not_str;
    } else if ((free_text & DSV4_FREE_STRING) && s->nt == 1) {
        /* one thread in a bounded string: the safe tokens that fit its room are allowed and
         * those that do not are refused (no other thread could take them); the rest is walked */
        const uint64_t *le = v->safe_le + (size_t)(room < SHORT_CHARS ? room : SHORT_CHARS) * W;
        for (size_t w = 0; w < W; w++)
            mask[w] |= le[w];
        t = &v->not_short;
    }
    if ((free_text & DSV4_FREE_RAW) && (t == &v->all || t == &v->not_str)) {
        for (size_t w = 0; w < W; w++)
            mask[w] |= v->safe_raw[w];
        if (t == &v->all)
            t = &v->not_raw;
    }
    if (t == &v->all && !(free_text & DSV4_FREE_RAW) && (free_text & DSV4_FREE_RAW_AFTER)) {
        /* raw text with part of its marker read: the safe tokens are allowed but for those
         * starting with the marker's rest, which are walked (that subtree of the whole trie),
         * as are the unsafe ones */
        for (size_t w = 0; w < W; w++)
            mask[w] |= v->safe_raw[w];
        const int i0 = trie_find(&v->all, rest, rest_n);
        if (i0 >= 0) {
            const int i1 = (int)v->all.skip[i0];
            for (int i = i0; i < i1; i++)
                for (int k = 0; k < v->all.ntok[i]; k++) {
                    const int32_t id = v->all.ids[v->all.tok0[i] + k];
                    mask[id >> 6] &= ~(1ull << (id & 63));
                }
            walk(&v->all, i0, i1, g, s, mask, scratch);
        }
        t = &v->not_raw;
    }
    walk(t, 0, t->n, g, s, mask, scratch);
    if (dsv4_gstate_accepts(g, s))
        for (int k = 0; k < n_eos; k++)
            if (eos[k] >= 0 && eos[k] < v->n_ids)
                mask[eos[k] >> 6] |= 1ull << (eos[k] & 63);
    int allowed = 0;
    for (size_t w = 0; w < W; w++)
        allowed += __builtin_popcountll(mask[w]);
    free(own);
    return allowed;
}

/* ---- the constraint ------------------------------------------------------------------ */

typedef struct centry {
    uint64_t hash;
    void *state;       /* the state's bytes */
    size_t len;
    uint64_t *mask;
    int allowed;
} centry;

struct dsv4_constraint {
    dsv4_grammar *g;
    const dsv4_vocab_trie *v;
    int32_t *eos;
    int n_eos;
    dsv4_gstate *cur, *tmp;
    void *scratch;
    uint64_t *own_mask;
    int ended;
    centry *cache;
    int n_cache, cap_cache, next_evict;
    size_t words;
    dsv4_constraint_stats st;
};

static uint64_t fnv1a(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

void dsv4_constraint_free(dsv4_constraint *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->n_cache; i++) {
        free(c->cache[i].state);
        free(c->cache[i].mask);
    }
    free(c->cache);
    free(c->cur);
    free(c->tmp);
    free(c->scratch);
    free(c->own_mask);
    free(c->eos);
    dsv4_grammar_free(c->g);
    free(c);
}

dsv4_constraint *dsv4_constraint_new(dsv4_grammar *g, const dsv4_vocab_trie *v, const int32_t *eos, int n_eos,
                                     int cache_entries, dsv4_err *err)
{
    dsv4_constraint *c = dsv4_xcalloc(1, sizeof *c, err);
    if (!c) {
        dsv4_grammar_free(g);
        return NULL;
    }
    c->g = g;
    c->v = v;
    c->words = dsv4_mask_words(v->n_ids);
    c->n_eos = n_eos > 0 ? n_eos : 0;
    c->eos = dsv4_xmalloc((size_t)(c->n_eos + 1) * sizeof *c->eos, err);
    c->cur = dsv4_xmalloc(sizeof *c->cur, err);
    c->tmp = dsv4_xmalloc(sizeof *c->tmp, err);
    c->scratch = dsv4_xmalloc(dsv4_vocab_trie_scratch(v), err);
    c->own_mask = dsv4_xmalloc(c->words * sizeof *c->own_mask, err);
    c->cap_cache = cache_entries > 0 ? cache_entries : 0;
    c->cache = c->cap_cache ? dsv4_xcalloc((size_t)c->cap_cache, sizeof *c->cache, err) : NULL;
    if (!c->eos || !c->cur || !c->tmp || !c->scratch || !c->own_mask || (c->cap_cache && !c->cache)) {
        dsv4_constraint_free(c);
        return NULL;
    }
    if (c->n_eos)
        memcpy(c->eos, eos, (size_t)c->n_eos * sizeof *eos);
    dsv4_gstate_init(g, c->cur);
    return c;
}

const dsv4_grammar *dsv4_constraint_grammar(const dsv4_constraint *c) { return c->g; }

int dsv4_constraint_mask(dsv4_constraint *c, uint64_t *mask, dsv4_err *err)
{
    c->st.masks++;
    if (c->ended) { /* after the end nothing is allowed */
        memset(mask, 0, c->words * sizeof *mask);
        return 0;
    }
    const size_t len = dsv4_gstate_size(c->cur);
    const uint64_t h = c->cap_cache ? fnv1a(c->cur, len) : 0;
    for (int i = 0; i < c->n_cache; i++) {
        centry *e = &c->cache[i];
        if (e->hash == h && e->len == len && !memcmp(e->state, c->cur, len)) {
            memcpy(mask, e->mask, c->words * sizeof *mask);
            c->st.hits++;
            return e->allowed;
        }
    }
    const double t0 = dsv4_now();
    int allowed = dsv4_vocab_trie_mask(c->v, c->g, c->cur, c->eos, c->n_eos, mask, c->scratch, err);
    c->st.walk_seconds += dsv4_now() - t0;
    if (allowed < 0 || !c->cap_cache)
        return allowed;
    /* keep it: a free slot, else the oldest one in insertion order */
    centry *e;
    if (c->n_cache < c->cap_cache)
        e = &c->cache[c->n_cache++];
    else {
        e = &c->cache[c->next_evict];
        c->next_evict = (c->next_evict + 1) % c->cap_cache;
        free(e->state);
        free(e->mask);
    }
    e->hash = h;
    e->len = len;
    e->state = malloc(len);
    e->mask = malloc(c->words * sizeof *mask);
    e->allowed = allowed;
    if (!e->state || !e->mask) { /* an unusable entry is harmless: it can never match */
        free(e->state);
        free(e->mask);
        e->state = NULL;
        e->mask = NULL;
        e->len = (size_t)-1;
        return allowed;
    }
    memcpy(e->state, c->cur, len);
    memcpy(e->mask, mask, c->words * sizeof *mask);
    return allowed;
}

const uint64_t *dsv4_constraint_next_mask(dsv4_constraint *c, dsv4_err *err)
{
    return dsv4_constraint_mask(c, c->own_mask, err) < 0 ? NULL : c->own_mask;
}

int dsv4_constraint_accept(dsv4_constraint *c, int32_t id, dsv4_err *err)
{
    if (c->ended)
        return dsv4_fail(err, DSV4_E_ARG, "constraint: token %d after the end of the reply", id);
    for (int k = 0; k < c->n_eos; k++)
        if (id == c->eos[k]) {
            if (!dsv4_gstate_accepts(c->g, c->cur))
                return dsv4_fail(err, DSV4_E_ARG, "constraint: end of sequence before the reply is complete");
            c->ended = 1;
            return 0;
        }
    const dsv4_vocab_trie *v = c->v;
    if (id < 0 || id >= v->n_ids || v->id_off[id] == v->id_off[id + 1])
        return dsv4_fail(err, DSV4_E_ARG, "constraint: token %d is not allowed here", id);
    memcpy(c->tmp, c->cur, dsv4_gstate_size(c->cur));
    if (!dsv4_gstate_feed_bytes(c->g, c->tmp, v->id_bytes + v->id_off[id], v->id_off[id + 1] - v->id_off[id]))
        return dsv4_fail(err, DSV4_E_ARG, "constraint: token %d is not allowed here", id);
    dsv4_gstate *x = c->cur;
    c->cur = c->tmp;
    c->tmp = x;
    return 0;
}

int dsv4_constraint_complete(const dsv4_constraint *c) { return c->ended || dsv4_gstate_accepts(c->g, c->cur); }
int dsv4_constraint_ended(const dsv4_constraint *c) { return c->ended; }

void dsv4_constraint_get_stats(const dsv4_constraint *c, dsv4_constraint_stats *st) { *st = c->st; }
