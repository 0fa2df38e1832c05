/* grammar — the node store and the pushdown matcher. See grammar.h. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "text/grammar_impl.h"

/* ---- building ------------------------------------------------------------------------ */

dsv4_grammar *g_new(void) { return calloc(1, sizeof(dsv4_grammar)); }

static uint32_t add(dsv4_grammar *g, uint8_t kind)
{
    if (g->n == g->cap) {
        uint32_t cap = g->cap ? 2 * g->cap : 64;
        gnode *p = realloc(g->nodes, (size_t)cap * sizeof *p);
        if (!p) {
            g->oom = 1;
            return G_INF;
        }
        g->nodes = p;
        g->cap = cap;
    }
    memset(&g->nodes[g->n], 0, sizeof *g->nodes);
    g->nodes[g->n].kind = kind;
    return g->n++;
}

static uint8_t *dup_bytes(const void *s, size_t n)
{
    uint8_t *d = malloc(n ? n : 1);
    if (d && n)
        memcpy(d, s, n);
    return d;
}

uint32_t g_lit(dsv4_grammar *g, const void *s, size_t n)
{
    uint32_t id = add(g, G_LIT);
    if (id == G_INF)
        return id;
    g->nodes[id].lit = dup_bytes(s, n);
    g->nodes[id].len = (uint32_t)n;
    if (!g->nodes[id].lit)
        g->oom = 1;
    return id;
}

uint32_t g_lits(dsv4_grammar *g, const char *s) { return g_lit(g, s, strlen(s)); }

static int cmp_lit(const uint8_t *a, size_t an, const uint8_t *b, size_t bn)
{
    size_t n = an < bn ? an : bn;
    int c = n ? memcmp(a, b, n) : 0;
    return c ? c : (an > bn) - (an < bn);
}

uint32_t g_litset(dsv4_grammar *g, char **lits, const size_t *lens, uint32_t n)
{
    uint32_t id = add(g, G_LITSET);
    if (id == G_INF)
        return id;
    gnode *nd = &g->nodes[id];
    nd->lits = calloc(n ? n : 1, sizeof *nd->lits);
    nd->lens = calloc(n ? n : 1, sizeof *nd->lens);
    if (!nd->lits || !nd->lens) {
        g->oom = 1;
        return id;
    }
    /* insertion sort (enums are short), dropping duplicates */
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *s = (const uint8_t *)lits[i];
        uint32_t j = 0;
        while (j < k && cmp_lit(nd->lits[j], nd->lens[j], s, lens[i]) < 0)
            j++;
        if (j < k && !cmp_lit(nd->lits[j], nd->lens[j], s, lens[i]))
            continue;
        uint8_t *d = dup_bytes(s, lens[i]);
        if (!d) {
            g->oom = 1;
            break;
        }
        memmove(nd->lits + j + 1, nd->lits + j, (k - j) * sizeof *nd->lits);
        memmove(nd->lens + j + 1, nd->lens + j, (k - j) * sizeof *nd->lens);
        nd->lits[j] = d;
        nd->lens[j] = (uint32_t)lens[i];
        k++;
    }
    nd->n_lits = k;
    return id;
}

uint32_t g_ws(dsv4_grammar *g, uint32_t max)
{
    uint32_t id = add(g, G_WS);
    if (id != G_INF)
        g->nodes[id].max = max;
    return id;
}

uint32_t g_class(dsv4_grammar *g, const char *set, uint32_t min, uint32_t max)
{
    uint32_t id = add(g, G_CLASS);
    if (id == G_INF)
        return id;
    gnode *nd = &g->nodes[id];
    nd->min = min;
    nd->max = max;
    for (const unsigned char *p = (const unsigned char *)set; *p; p++) {
        unsigned lo = *p, hi = *p;
        if (p[1] == '-' && p[2]) {
            hi = p[2];
            p += 2;
        }
        for (unsigned c = lo; c <= hi; c++)
            nd->cls[c >> 6] |= 1ull << (c & 63);
    }
    return id;
}

uint32_t g_str(dsv4_grammar *g, uint32_t min, uint32_t max)
{
    uint32_t id = add(g, G_STR);
    if (id != G_INF) {
        g->nodes[id].min = min;
        g->nodes[id].max = max;
    }
    return id;
}

uint32_t g_raw(dsv4_grammar *g, const char *marker, uint32_t min, uint32_t max)
{
    uint32_t id = g_lit(g, marker, strlen(marker));
    if (id != G_INF) {
        g->nodes[id].kind = G_RAW;
        g->nodes[id].min = min;
        g->nodes[id].max = max;
    }
    return id;
}

uint32_t g_num(dsv4_grammar *g, int integer)
{
    uint32_t id = add(g, G_NUM);
    if (id != G_INF)
        g->nodes[id].integer = (uint8_t)integer;
    return id;
}

void g_set_kids(dsv4_grammar *g, uint32_t node, const uint32_t *kids, uint32_t n)
{
    if (node == G_INF)
        return;
    uint32_t *k = malloc((n ? n : 1) * sizeof *k);
    if (!k) {
        g->oom = 1;
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (kids[i] == G_INF)
            g->oom = 1;
        k[i] = kids[i];
    }
    free(g->nodes[node].kids);
    g->nodes[node].kids = k;
    g->nodes[node].n_kids = n;
}

static uint32_t with_kids(dsv4_grammar *g, uint8_t kind, const uint32_t *kids, uint32_t n)
{
    uint32_t id = add(g, kind);
    g_set_kids(g, id, kids, n);
    return id;
}

uint32_t g_seq(dsv4_grammar *g, const uint32_t *kids, uint32_t n) { return with_kids(g, G_SEQ, kids, n); }
uint32_t g_alt(dsv4_grammar *g, const uint32_t *kids, uint32_t n) { return with_kids(g, G_ALT, kids, n); }

uint32_t g_rep(dsv4_grammar *g, uint32_t item, uint32_t sep, uint32_t min, uint32_t max)
{
    uint32_t id = with_kids(g, G_REP, (const uint32_t[]){item, sep}, 2);
    if (id != G_INF) {
        g->nodes[id].min = min;
        g->nodes[id].max = max;
    }
    return id;
}

int g_finish(dsv4_grammar *g, uint32_t root)
{
    if (g->oom || root == G_INF)
        return -1;
    g->root = root;
    g->nullable = calloc(g->n ? g->n : 1, 1);
    if (!g->nullable)
        return -1;
    for (int changed = 1; changed;) {
        changed = 0;
        for (uint32_t i = 0; i < g->n; i++) {
            const gnode *n = &g->nodes[i];
            int v = 0;
            switch (n->kind) {
            case G_LIT: v = n->len == 0; break;
            case G_LITSET: v = n->n_lits && n->lens[0] == 0; break;
            case G_WS: v = 1; break;
            case G_CLASS: case G_RAW: v = n->min == 0; break;
            case G_SEQ:
                v = 1;
                for (uint32_t k = 0; k < n->n_kids; k++)
                    v &= g->nullable[n->kids[k]];
                break;
            case G_ALT:
                for (uint32_t k = 0; k < n->n_kids; k++)
                    v |= g->nullable[n->kids[k]];
                break;
            case G_REP: v = n->min == 0 || g->nullable[n->kids[0]]; break;
            default: break;
            }
            if (v && !g->nullable[i]) {
                g->nullable[i] = 1;
                changed = 1;
            }
        }
    }
    /* first bytes, to drop a child that cannot take the byte before pushing it */
    g->first = calloc(g->n ? g->n : 1, sizeof *g->first);
    if (!g->first)
        return -1;
    for (uint32_t i = 0; i < g->n; i++) {
        const gnode *n = &g->nodes[i];
        uint64_t *f = g->first[i];
#define ADD(c) (f[(uint8_t)(c) >> 6] |= 1ull << ((uint8_t)(c) & 63))
        switch (n->kind) {
        case G_LIT: if (n->len) ADD(n->lit[0]); break;
        case G_LITSET:
            for (uint32_t k = 0; k < n->n_lits; k++)
                if (n->lens[k])
                    ADD(n->lits[k][0]);
            break;
        case G_WS: ADD(' '); ADD('\n'); ADD('\t'); ADD('\r'); break;
        case G_CLASS: memcpy(f, n->cls, sizeof n->cls); break;
        case G_STR: ADD('"'); break;
        case G_RAW: for (int c = 1; c < 256; c++) ADD(c); break;
        case G_NUM: ADD('-'); for (int c = '0'; c <= '9'; c++) ADD(c); break;
        default: break;
        }
#undef ADD
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (uint32_t i = 0; i < g->n; i++) {
            const gnode *n = &g->nodes[i];
            uint32_t nk = n->kind == G_REP ? 1 : n->kind >= G_SEQ ? n->n_kids : 0;
            for (uint32_t k = 0; k < nk; k++) {
                const uint64_t *kf = g->first[n->kids[k]];
                for (int w = 0; w < 4; w++)
                    if (kf[w] & ~g->first[i][w]) {
                        g->first[i][w] |= kf[w];
                        changed = 1;
                    }
                if (n->kind == G_SEQ && !g->nullable[n->kids[k]])
                    break; /* later children start a match only after this one matched something */
            }
        }
    }
    return 0;
}

void dsv4_grammar_free(dsv4_grammar *g)
{
    if (!g)
        return;
    for (uint32_t i = 0; i < g->n; i++) {
        gnode *n = &g->nodes[i];
        free(n->kids);
        free(n->lit);
        for (uint32_t k = 0; k < n->n_lits; k++)
            free(n->lits[k]);
        free(n->lits);
        free(n->lens);
    }
    free(g->nodes);
    free(g->nullable);
    free(g->first);
    free(g);
}

int dsv4_grammar_n_nodes(const dsv4_grammar *g) { return (int)g->n; }

/* ---- matching ------------------------------------------------------------------------ */

/* String phases (low byte of a for G_STR; G_RAW uses only the UTF-8 fields). Bits 8-11: UTF-8
 * continuation bytes still due; bits 12-15: the range the next one must fall in (the first
 * continuation after E0, ED, F0, F4 is narrowed to exclude overlongs and surrogates). For G_RAW
 * bits 0-7 count the marker bytes just seen. */
enum { S_OPEN, S_BODY, S_ESC, S_HEX1, S_HEX2, S_HEX3, S_HEX4, S_DONE };
enum { N_START, N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };
enum { NUM_INT_DIGITS = 15, NUM_FRAC_DIGITS = 15, NUM_EXP_DIGITS = 2 };

static int is_ws(uint8_t c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }
static int is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
static int is_hex(uint8_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

/* UTF-8: a lead byte sets the continuation count and range; 0 when c cannot lead. */
static int utf8_lead(uint8_t c, uint32_t *rem, uint32_t *res)
{
    *res = 0;
    if (c >= 0xC2 && c <= 0xDF)
        *rem = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
        *rem = 2;
        *res = c == 0xE0 ? 1 : c == 0xED ? 2 : 0;
    } else if (c >= 0xF0 && c <= 0xF4) {
        *rem = 3;
        *res = c == 0xF0 ? 3 : c == 0xF4 ? 4 : 0;
    } else
        return 0;
    return 1;
}

static int utf8_cont_ok(uint8_t c, uint32_t res)
{
    static const uint8_t lo[5] = {0x80, 0xA0, 0x80, 0x90, 0x80}, hi[5] = {0xBF, 0xBF, 0x9F, 0xBF, 0x8F};
    return c >= lo[res] && c <= hi[res];
}

/* Counts one more character against min..max. Without a maximum the count stops at min, so
 * the states of a long free string do not differ by its length (and share cached masks). */
static int count_char(uint32_t *chars, uint32_t min, uint32_t max)
{
    if (max == G_INF) {
        if (*chars < min)
            (*chars)++;
        return 1;
    }
    if (*chars >= max)
        return 0;
    (*chars)++;
    return 1;
}

/* The character-level UTF-8 step shared by strings and raw text: a continuation byte, or a
 * new character (lead byte or ASCII) counted in *chars. 0: refused. */
static int utf8_step(uint32_t *a, uint32_t *chars, uint32_t min, uint32_t max, uint8_t c)
{
    uint32_t rem = (*a >> 8) & 15, res = (*a >> 12) & 15;
    if (rem) {
        if (!utf8_cont_ok(c, res))
            return 0;
        *a = (*a & 0xFF) | ((rem - 1) << 8);
        return 1;
    }
    if (max != G_INF && *chars >= max)
        return 0;
    if (c >= 0x80) {
        if (!utf8_lead(c, &rem, &res))
            return 0;
        *a = (*a & 0xFF) | (rem << 8) | (res << 12);
    }
    return count_char(chars, min, max);
}

static int lit_prefix_eq(const gnode *n, uint32_t j, uint32_t lo, uint32_t pos)
{
    return n->lens[j] >= pos && (pos == 0 || !memcmp(n->lits[j], n->lits[lo], pos));
}

/* A leaf reads c into its frame f; 0 when it cannot. */
static int leaf_step(const gnode *n, dsv4_gframe *f, uint8_t c)
{
    switch (n->kind) {
    case G_LIT:
        if (f->a < n->len && n->lit[f->a] == c) {
            f->a++;
            return 1;
        }
        return 0;
    case G_LITSET:
        for (uint32_t j = f->a; j < n->n_lits && lit_prefix_eq(n, j, f->a, f->b); j++)
            if (n->lens[j] > f->b && n->lits[j][f->b] == c) {
                f->a = j;
                f->b++;
                return 1;
            }
        return 0;
    case G_WS:
        if (f->a < n->max && is_ws(c)) {
            f->a++;
            return 1;
        }
        return 0;
    case G_CLASS:
        if (!(n->cls[c >> 6] >> (c & 63) & 1))
            return 0;
        /* without a maximum the count stops at min, so a long run's states repeat (and share
         * cached masks) */
        if (n->max == G_INF) {
            f->a += f->a < n->min;
            return 1;
        }
        if (f->a < n->max) {
            f->a++;
            return 1;
        }
        return 0;
    case G_STR: {
        uint32_t ph = f->a & 0xFF;
        switch (ph) {
        case S_OPEN:
            if (c != '"')
                return 0;
            f->a = S_BODY;
            return 1;
        case S_BODY:
            if ((f->a >> 8) & 15)
                return utf8_step(&f->a, &f->b, n->min, n->max, c);
            if (c == '"') {
                if (f->b < n->min)
                    return 0;
                f->a = S_DONE;
                return 1;
            }
            if (c == '\\') {
                if (!count_char(&f->b, n->min, n->max))
                    return 0;
                f->a = S_ESC;
                return 1;
            }
            if (c < 0x20)
                return 0;
            return utf8_step(&f->a, &f->b, n->min, n->max, c);
        case S_ESC:
            if (c == 'u') {
                f->a = S_HEX1;
                return 1;
            }
            if (!strchr("\"\\/bfnrt", c) || !c)
                return 0;
            f->a = S_BODY;
            return 1;
        case S_HEX1: case S_HEX2: case S_HEX3: case S_HEX4:
            /* no surrogate halves (\uD800-\uDFFF): a lone one does not decode; raw UTF-8 can
             * say everything they could, so \uD is refused outright */
            if (!is_hex(c) || (ph == S_HEX1 && (c == 'd' || c == 'D')))
                return 0;
            f->a = ph == S_HEX4 ? S_BODY : ph + 1;
            return 1;
        default:
            return 0;
        }
    }
    case G_RAW: {
        /* the marker is matched on bytes, continuation bytes included (it may hold multi-byte
         * characters); its first byte occurs in it only there, so a mismatch restarts at 0 or 1 */
        if (c == 0)
            return 0;
        uint32_t p = f->a & 0xFF;
        if (n->lit[p] == c) {
            if (p + 1 == n->len)
                return 0; /* the marker would be complete inside the text */
            p++;
        } else
            p = n->lit[0] == c ? 1 : 0;
        uint32_t a = f->a & ~0xFFu;
        if (!utf8_step(&a, &f->b, n->min, n->max, c))
            return 0;
        f->a = (a & ~0xFFu) | p;
        return 1;
    }
    case G_NUM: {
        const int d = is_digit(c);
        switch (f->a) {
        case N_START:
            if (c == '-') { f->a = N_MINUS; return 1; }
            /* fallthrough */
        case N_MINUS:
            if (c == '0') { f->a = N_ZERO; return 1; }
            if (d) { f->a = N_INT; f->b = 1; return 1; }
            return 0;
        case N_INT:
            if (d && f->b < NUM_INT_DIGITS) { f->b++; return 1; }
            /* fallthrough */
        case N_ZERO:
            if (n->integer)
                return 0;
            if (c == '.') { f->a = N_DOT; return 1; }
            if (c == 'e' || c == 'E') { f->a = N_E; return 1; }
            return 0;
        case N_DOT:
            if (d) { f->a = N_FRAC; f->b = 1; return 1; }
            return 0;
        case N_FRAC:
            if (d && f->b < NUM_FRAC_DIGITS) { f->b++; return 1; }
            if (c == 'e' || c == 'E') { f->a = N_E; return 1; }
            return 0;
        case N_E:
            if (c == '+' || c == '-') { f->a = N_ESIGN; return 1; }
            /* fallthrough */
        case N_ESIGN:
            if (d) { f->a = N_EXP; f->b = 1; return 1; }
            return 0;
        case N_EXP:
            if (d && f->b < NUM_EXP_DIGITS) { f->b++; return 1; }
            return 0;
        }
        return 0;
    }
    }
    return 0;
}

static int can_end(const dsv4_grammar *g, const gnode *n, const dsv4_gframe *f)
{
    switch (n->kind) {
    case G_LIT: return f->a == n->len;
    case G_LITSET: return n->n_lits && n->lens[f->a] == f->b;
    case G_WS: return 1;
    case G_CLASS: return f->a >= n->min;
    case G_STR: return (f->a & 0xFF) == S_DONE;
    case G_RAW: return !((f->a >> 8) & 15) && f->b >= n->min;
    case G_NUM: return f->a == N_ZERO || f->a == N_INT || f->a == N_FRAC || f->a == N_EXP;
    case G_SEQ:
        for (uint32_t k = f->a; k < n->n_kids; k++)
            if (!g->nullable[n->kids[k]])
                return 0;
        return 1;
    case G_ALT:
        if (f->a)
            return 1;
        for (uint32_t k = 0; k < n->n_kids; k++)
            if (g->nullable[n->kids[k]])
                return 1;
        return 0;
    case G_REP: return (f->b == 0 && n->min == 0) || (f->b == 1 && f->a >= n->min);
    }
    return 0;
}

/* The frame has ended and nothing more can enter it: it can be popped now. */
static int finished(const gnode *n, const dsv4_gframe *f)
{
    switch (n->kind) {
    case G_LIT: return f->a == n->len;
    case G_LITSET:
        return n->lens[f->a] == f->b &&
               !(f->a + 1 < n->n_lits && n->lens[f->a + 1] > f->b && !memcmp(n->lits[f->a + 1], n->lits[f->a], f->b));
    case G_WS: case G_CLASS: return f->a == n->max;
    case G_STR: return (f->a & 0xFF) == S_DONE;
    case G_SEQ: return f->a == n->n_kids;
    case G_ALT: return f->a == 1;
    case G_REP: return f->b == 1 && f->a == n->max;
    }
    return 0;
}

typedef struct emitter {
    const dsv4_grammar *g;
    dsv4_gstate *out;
} emitter;

/* Adds thread stk[0..d) to the output: finished frames popped, duplicates dropped, and once
 * the state is full further threads are dropped (every kept one is still a valid parse). */
static void emit(emitter *e, const dsv4_gframe *stk, int d)
{
    while (d > 0 && finished(&e->g->nodes[stk[d - 1].node], &stk[d - 1]))
        d--;
    dsv4_gstate *o = e->out;
    if (o->nt == DSV4_G_MAXT)
        return;
    size_t at = 0;
    for (int t = 0; t < o->nt; t++) {
        if (o->len[t] == d && !memcmp(o->f + at, stk, (size_t)d * sizeof *stk))
            return;
        at += o->len[t];
    }
    memcpy(o->f + o->nf, stk, (size_t)d * sizeof *stk);
    o->len[o->nt++] = (uint16_t)d;
    o->nf = (uint16_t)(o->nf + d);
}

/* Delivers byte c to the thread stk[0..d) (which it may overwrite): the top frame reads it, or
 * pushes a child that does, or ends and hands it to the frame below; every way that works is
 * emitted. */
static void deliver(emitter *e, dsv4_gframe *stk, int d, uint8_t c)
{
    if (d == 0)
        return;
    const dsv4_grammar *g = e->g;
    dsv4_gframe *f = &stk[d - 1];
    const gnode *n = &g->nodes[f->node];
    const int end = can_end(g, n, f);
    if (n->kind < G_SEQ) {
        dsv4_gframe nf = *f;
        if (leaf_step(n, &nf, c)) {
            dsv4_gframe save = *f;
            *f = nf;
            emit(e, stk, d);
            *f = save;
        }
        if (end)
            deliver(e, stk, d - 1, c);
        return;
    }
    /* composite: the options are (parent's state once the child returns, child) */
    uint32_t n_opt = 0, first = 0;
    dsv4_gframe parent[1] = {*f};
    uint32_t child[1] = {0};
    if (n->kind == G_SEQ) {
        if (f->a < n->n_kids) {
            parent[0] = *f;
            parent[0].a++;
            child[0] = n->kids[f->a];
            n_opt = 1;
        }
    } else if (n->kind == G_ALT) {
        if (f->a == 0)
            n_opt = n->n_kids;
        /* past the nesting bound a generic value may only be a scalar (its first two options
         * are the containers) */
        if ((n->flags & G_FLAG_NEST) && d > 4 * DSV4_G_NEST)
            first = 2;
    } else if (n->kind == G_REP && f->a < n->max) {
        parent[0] = *f;
        if (f->b == 1) {
            parent[0].b = 2;
            child[0] = n->kids[1];
        } else {
            parent[0].a++;
            parent[0].b = 1;
            child[0] = n->kids[0];
        }
        n_opt = 1;
    }
    for (uint32_t k = first; k < n_opt; k++) {
        dsv4_gframe par = *f;
        uint32_t kid;
        if (n->kind == G_ALT) {
            par.a = 1;
            kid = n->kids[k];
        } else {
            par = parent[0];
            kid = child[0];
        }
        const int last = k + 1 == n_opt && !end;
        dsv4_gframe tmp[DSV4_G_MAXD + 1];
        dsv4_gframe *s = stk;
        if (!last) {
            memcpy(tmp, stk, (size_t)d * sizeof *stk);
            s = tmp;
        }
        int dd = d;
        if (finished(n, &par)) /* a tail position: the child takes the parent's place */
            dd = d - 1;
        else
            s[d - 1] = par;
        if (dd == DSV4_G_MAXD)
            continue;
        if (!g->nullable[kid] && !(g->first[kid][c >> 6] >> (c & 63) & 1))
            continue; /* the child cannot start with c */
        s[dd] = (dsv4_gframe){kid, 0, 0};
        deliver(e, s, dd + 1, c);
    }
    if (end)
        deliver(e, stk, d - 1, c);
}

void dsv4_gstate_init(const dsv4_grammar *g, dsv4_gstate *s)
{
    memset(s, 0, offsetof(dsv4_gstate, f));
    s->nt = 1;
    s->nf = 1;
    s->len[0] = 1;
    s->f[0] = (dsv4_gframe){g->root, 0, 0};
}

size_t dsv4_gstate_size(const dsv4_gstate *s) { return offsetof(dsv4_gstate, f) + (size_t)s->nf * sizeof s->f[0]; }

int dsv4_gstate_feed(const dsv4_grammar *g, const dsv4_gstate *s, uint8_t c, dsv4_gstate *out)
{
    memset(out, 0, offsetof(dsv4_gstate, f));
    emitter e = {g, out};
    dsv4_gframe stk[DSV4_G_MAXD + 1];
    size_t at = 0;
    for (int t = 0; t < s->nt; t++) {
        memcpy(stk, s->f + at, (size_t)s->len[t] * sizeof *stk);
        deliver(&e, stk, s->len[t], c);
        at += s->len[t];
    }
    return out->nt > 0;
}

int dsv4_gstate_feed_bytes(const dsv4_grammar *g, dsv4_gstate *s, const void *bytes, size_t n)
{
    dsv4_gstate *tmp = malloc(2 * sizeof *tmp);
    if (!tmp)
        return 0;
    const uint8_t *b = bytes;
    dsv4_gstate *cur = s, *nxt = tmp;
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++) {
        ok = dsv4_gstate_feed(g, cur, b[i], nxt);
        if (ok) {
            cur = nxt;
            nxt = cur == tmp ? tmp + 1 : tmp;
        }
    }
    if (ok && cur != s)
        memcpy(s, cur, dsv4_gstate_size(cur));
    free(tmp);
    return ok;
}

int dsv4_gstate_accepts(const dsv4_grammar *g, const dsv4_gstate *s)
{
    size_t at = 0;
    for (int t = 0; t < s->nt; t++) {
        int ok = 1;
        for (int k = s->len[t] - 1; k >= 0 && ok; k--)
            ok = can_end(g, &g->nodes[s->f[at + k].node], &s->f[at + k]);
        if (ok)
            return 1;
        at += s->len[t];
    }
    return 0;
}

int dsv4_gstate_open(const dsv4_grammar *g, const dsv4_gstate *s)
{
    dsv4_gstate *tmp = malloc(sizeof *tmp);
    int open = 0;
    for (int c = 0; tmp && c < 256 && !open; c++)
        open = dsv4_gstate_feed(g, s, (uint8_t)c, tmp);
    free(tmp);
    return open;
}

int dsv4_gstate_free_text(const dsv4_grammar *g, const dsv4_gstate *s, uint32_t *str_room, const uint8_t **raw_rest,
                          size_t *raw_rest_n)
{
    int r = 0;
    size_t at = 0;
    *str_room = 0;
    *raw_rest = NULL;
    *raw_rest_n = 0;
    for (int t = 0; t < s->nt; t++) {
        at += s->len[t];
        if (!s->len[t])
            continue;
        const dsv4_gframe *f = &s->f[at - 1];
        const gnode *n = &g->nodes[f->node];
        if (n->kind == G_STR && (f->a & 0xFF) == S_BODY && !((f->a >> 8) & 15)) {
            const uint32_t room = n->max == G_INF ? UINT32_MAX : n->max - f->b;
            r |= DSV4_FREE_STRING;
            if (room > *str_room)
                *str_room = room;
        }
        if (n->kind == G_RAW && n->max == G_INF && !(f->a & 0xF00) && n->lit[0] == '<') {
            const uint32_t p = f->a & 0xFF;
            if (!p)
                r |= DSV4_FREE_RAW;
            else if (!*raw_rest || (*raw_rest_n == n->len - p && !memcmp(*raw_rest, n->lit + p, *raw_rest_n))) {
                r |= DSV4_FREE_RAW_AFTER;
                *raw_rest = n->lit + p;
                *raw_rest_n = n->len - p;
            } else
                return r & ~DSV4_FREE_RAW_AFTER; /* two different pending rests: no shortcut for them */
        }
    }
    return r;
}

int dsv4_grammar_matches(const dsv4_grammar *g, const char *text, size_t n)
{
    dsv4_gstate *s = malloc(sizeof *s);
    if (!s)
        return 0;
    dsv4_gstate_init(g, s);
    int ok = dsv4_gstate_feed_bytes(g, s, text, n) && dsv4_gstate_accepts(g, s);
    free(s);
    return ok;
}
