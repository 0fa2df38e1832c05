#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>
#include "core/core.h"
#include "text/normalize.h"
#include "text/tokenizer.h"
#include "text/buf.h"

enum { N_NFC, N_NFD, N_NFKC, N_NFKD, N_LOWER, N_STRIP_ACCENTS, N_STRIP, N_REPLACE, N_PREPEND };

typedef struct nop {
    int kind;
    int left, right;   /* Strip */
    char *pat;         /* Replace: literal pattern (re == NULL) */
    size_t pat_len;
    pcre2_code *re;    /* Replace: regex pattern */
    char *content;     /* Replace / Prepend */
} nop;

struct dsv4_normalizer {
    nop *ops;
    int n, cap;
};

static void sb_cp(dsv4_buf *b, uint32_t cp)
{
    utf8proc_uint8_t u[4];
    utf8proc_ssize_t k = utf8proc_encode_char((utf8proc_int32_t)cp, u);
    dsv4_buf_put(b, u, (size_t)k);
}

void dsv4_normalizer_free(dsv4_normalizer *n)
{
    if (!n)
        return;
    for (int i = 0; i < n->n; i++) {
        free(n->ops[i].pat);
        free(n->ops[i].content);
        pcre2_code_free(n->ops[i].re);
    }
    free(n->ops);
    free(n);
}

static int add_op(dsv4_normalizer *n, nop op, dsv4_err *err)
{
    if (n->n == n->cap) {
        int c = n->cap ? n->cap * 2 : 4;
        nop *p = realloc(n->ops, (size_t)c * sizeof *p);
        if (!p)
            return dsv4_fail(err, DSV4_E_NOMEM, "normalizer: out of memory");
        n->ops = p;
        n->cap = c;
    }
    n->ops[n->n++] = op;
    return 0;
}

static char *dupstr(const char *s)
{
    size_t k = strlen(s);
    char *d = malloc(k + 1);
    if (d)
        memcpy(d, s, k + 1);
    return d;
}

static int parse_node(dsv4_normalizer *n, const cJSON *j, dsv4_err *err)
{
    if (cJSON_IsNull(j))
        return 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsString(type))
        return dsv4_fail(err, DSV4_E_FORMAT, "normalizer: missing \"type\"");
    const char *t = type->valuestring;
    nop op = {0};
    if (!strcmp(t, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "normalizers");
        const cJSON *e;
        cJSON_ArrayForEach(e, list)
        {
            int rc = parse_node(n, e, err);
            if (rc)
                return rc;
        }
        return 0;
    } else if (!strcmp(t, "NFC"))
        op.kind = N_NFC;
    else if (!strcmp(t, "NFD"))
        op.kind = N_NFD;
    else if (!strcmp(t, "NFKC"))
        op.kind = N_NFKC;
    else if (!strcmp(t, "NFKD"))
        op.kind = N_NFKD;
    else if (!strcmp(t, "Lowercase"))
        op.kind = N_LOWER;
    else if (!strcmp(t, "StripAccents"))
        op.kind = N_STRIP_ACCENTS;
    else if (!strcmp(t, "Strip")) {
        op.kind = N_STRIP;
        op.left = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "strip_left"));
        op.right = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "strip_right"));
    } else if (!strcmp(t, "Prepend")) {
        op.kind = N_PREPEND;
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prepend");
        if (!cJSON_IsString(p))
            return dsv4_fail(err, DSV4_E_FORMAT, "normalizer Prepend: missing \"prepend\"");
        op.content = dupstr(p->valuestring);
    } else if (!strcmp(t, "Replace")) {
        op.kind = N_REPLACE;
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(j, "pattern");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "content");
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(pat, "String");
        const cJSON *pr = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        if (!cJSON_IsString(c) || (!cJSON_IsString(ps) && !cJSON_IsString(pr)))
            return dsv4_fail(err, DSV4_E_FORMAT, "normalizer Replace: needs pattern.String|Regex and content");
        op.content = dupstr(c->valuestring);
        if (cJSON_IsString(ps)) {
            op.pat = dupstr(ps->valuestring);
            op.pat_len = strlen(ps->valuestring);
            if (op.pat_len == 0) {
                free(op.pat);
                free(op.content);
                return dsv4_fail(err, DSV4_E_FORMAT, "normalizer Replace: empty pattern");
            }
        } else {
            int ec;
            PCRE2_SIZE eo;
            op.re = pcre2_compile((PCRE2_SPTR)pr->valuestring, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
            if (!op.re) {
                free(op.content);
                return dsv4_fail(err, DSV4_E_FORMAT, "normalizer Replace: regex error %d at %zu", ec, (size_t)eo);
            }
        }
    } else {
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "normalizer type \"%s\" is not supported", t);
    }
    return add_op(n, op, err);
}

dsv4_normalizer *dsv4_normalizer_from_cjson(const void *node, dsv4_err *err)
{
    dsv4_normalizer *n = calloc(1, sizeof *n);
    if (!n) {
        dsv4_fail(err, DSV4_E_NOMEM, "normalizer: out of memory");
        return NULL;
    }
    if (parse_node(n, node, err)) {
        dsv4_normalizer_free(n);
        return NULL;
    }
    return n;
}

dsv4_normalizer *dsv4_normalizer_parse(const char *json, dsv4_err *err)
{
    cJSON *j = cJSON_Parse(json);
    if (!j) {
        dsv4_fail(err, DSV4_E_FORMAT, "normalizer: invalid JSON");
        return NULL;
    }
    dsv4_normalizer *n = dsv4_normalizer_from_cjson(j, err);
    cJSON_Delete(j);
    return n;
}

/* Hugging Face's normalizers use Unicode tables of several ages (its normalization and mark data
 * are older than utf8proc 2.8's Unicode 15, its lowercase is Unicode 16). The tables below bring
 * utf8proc to the same answers; they were found by putting every code point through both, and
 * tests/suite_text.sh keeps checking that.
 *
 * Code points that Hugging Face's NFKC/NFKD leave alone although utf8proc has a compatibility
 * decomposition for them. */
static const uint32_t hf_no_compat[][2] = {
    {0x32ff, 0x32ff}, {0xa7f2, 0xa7f4}, {0xab69, 0xab69}, {0x10781, 0x10785}, {0x10787, 0x107b0},
    {0x107b2, 0x107ba}, {0x1e030, 0x1e06d}, {0x1f16c, 0x1f16c}, {0x1fbf0, 0x1fbf9},
};

/* Lowercase mappings of Unicode 16 that utf8proc 2.8 lacks: [first, last, first's lowercase,
 * step] where the lowercase of first + k is lower + k * step. */
static const uint32_t lower16[][4] = {
    {0x1c89, 0x1c89, 0x1c8a, 1}, {0xa7cb, 0xa7cb, 0x264, 0}, {0xa7cc, 0xa7cc, 0xa7cd, 0}, {0xa7ce, 0xa7ce, 0xa7cf, 0},
    {0xa7d2, 0xa7d2, 0xa7d3, 0}, {0xa7d4, 0xa7d4, 0xa7d5, 0}, {0xa7da, 0xa7da, 0xa7db, 0}, {0xa7dc, 0xa7dc, 0x19b, 0},
    {0x10d50, 0x10d65, 0x10d70, 1}, {0x16ea0, 0x16eb8, 0x16ebb, 1},
};

/* Marks (Mn/Mc/Me for utf8proc) that Hugging Face's StripAccents keeps: its mark table is older
 * than these. It strips U+1CF2..1CF3, which later Unicode made letters. */
static const uint32_t hf_not_marks[][2] = {
    {0x7fd, 0x7fd}, {0x898, 0x89f}, {0x8ca, 0x8d3}, {0x9fe, 0x9fe}, {0xafa, 0xaff}, {0xb55, 0xb55}, {0xc04, 0xc04},
    {0xc3c, 0xc3c}, {0xcf3, 0xcf3}, {0xd00, 0xd00}, {0xd3b, 0xd3c}, {0xd81, 0xd81}, {0xeba, 0xeba}, {0xece, 0xece},
    {0x1715, 0x1715}, {0x180f, 0x180f}, {0x1abf, 0x1ace}, {0x1cf7, 0x1cf7}, {0x1df6, 0x1dfa}, {0xa82c, 0xa82c},
    {0xa8ff, 0xa8ff}, {0x10d24, 0x10d27}, {0x10eab, 0x10eac}, {0x10efd, 0x10eff}, {0x10f46, 0x10f50}, {0x10f82, 0x10f85},
    {0x11070, 0x11070}, {0x11073, 0x11074}, {0x110c2, 0x110c2}, {0x11145, 0x11146}, {0x111c9, 0x111c9}, {0x111ce, 0x111cf},
    {0x11241, 0x11241}, {0x1133b, 0x1133b}, {0x1145e, 0x1145e}, {0x1182c, 0x1183a}, {0x11930, 0x11935}, {0x11937, 0x11938},
    {0x1193b, 0x1193e}, {0x11940, 0x11940}, {0x11942, 0x11943}, {0x119d1, 0x119d7}, {0x119da, 0x119e0}, {0x119e4, 0x119e4},
    {0x11a01, 0x11a0a}, {0x11a33, 0x11a39}, {0x11a3b, 0x11a3e}, {0x11a47, 0x11a47}, {0x11a51, 0x11a5b}, {0x11a8a, 0x11a99},
    {0x11d31, 0x11d36}, {0x11d3a, 0x11d3a}, {0x11d3c, 0x11d3d}, {0x11d3f, 0x11d45}, {0x11d47, 0x11d47}, {0x11d8a, 0x11d8e},
    {0x11d90, 0x11d91}, {0x11d93, 0x11d97}, {0x11ef3, 0x11ef6}, {0x11f00, 0x11f01}, {0x11f03, 0x11f03}, {0x11f34, 0x11f3a},
    {0x11f3e, 0x11f42}, {0x13440, 0x13440}, {0x13447, 0x13455}, {0x16f4f, 0x16f4f}, {0x16f7f, 0x16f87}, {0x16fe4, 0x16fe4},
    {0x16ff0, 0x16ff1}, {0x1cf00, 0x1cf2d}, {0x1cf30, 0x1cf46}, {0x1e08f, 0x1e08f}, {0x1e130, 0x1e136}, {0x1e2ae, 0x1e2ae},
    {0x1e2ec, 0x1e2ef}, {0x1e4ec, 0x1e4ef},
};

static int in_ranges(const uint32_t (*r)[2], size_t n, uint32_t c)
{
    for (size_t i = 0; i < n; i++)
        if (c >= r[i][0] && c <= r[i][1])
            return 1;
    return 0;
}

/* Code points a normalization form leaves alone in Hugging Face. The marks its tables do not know
 * (hf_not_marks) are, to it, starters without decomposition, composition or combining class; the
 * compat forms also keep hf_no_compat. */
static int kept(uint32_t c, int compat)
{
    return in_ranges(hf_not_marks, sizeof hf_not_marks / sizeof hf_not_marks[0], c) ||
           (compat && in_ranges(hf_no_compat, sizeof hf_no_compat / sizeof hf_no_compat[0], c));
}

/* Hugging Face's is_combining_mark. */
static int hf_mark(uint32_t c)
{
    if (c == 0x1cf2 || c == 0x1cf3)
        return 1;
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return (k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_MC || k == UTF8PROC_CATEGORY_ME) &&
           !in_ranges(hf_not_marks, sizeof hf_not_marks / sizeof hf_not_marks[0], c);
}

static uint32_t to_lower(uint32_t c)
{
    for (size_t i = 0; i < sizeof lower16 / sizeof lower16[0]; i++)
        if (c >= lower16[i][0] && c <= lower16[i][1])
            return lower16[i][2] + (c - lower16[i][0]) * lower16[i][3];
    return (uint32_t)utf8proc_tolower((utf8proc_int32_t)c);
}

static int map_utf8proc(const char *s, size_t len, int opts, dsv4_buf *o)
{
    utf8proc_uint8_t *r = NULL;
    utf8proc_ssize_t k = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &r, (utf8proc_option_t)opts);
    if (k < 0)
        return -1;
    dsv4_buf_put(o, r, (size_t)k);
    free(r);
    return 0;
}

/* Rust's char::is_whitespace: the White_Space property. */
static int is_ws(uint32_t c)
{
    return (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) ||
           c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

static int apply(const nop *op, const char *s, size_t len, dsv4_buf *o)
{
    const unsigned char *u = (const unsigned char *)s;
    switch (op->kind) {
    case N_NFC:
    case N_NFD:
    case N_NFKC:
    case N_NFKD: {
        int opts = UTF8PROC_STABLE;
        opts |= op->kind == N_NFC ? UTF8PROC_COMPOSE : op->kind == N_NFD ? UTF8PROC_DECOMPOSE
              : op->kind == N_NFKC ? UTF8PROC_COMPOSE | UTF8PROC_COMPAT : UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
        /* the kept code points are starters that compose with nothing, so normalizing the text
         * between them piece by piece gives the whole text's normal form */
        size_t start = 0;
        for (size_t i = 0; i < len;) {
            uint32_t cp;
            int k = dsv4_utf8_decode1(u + i, len - i, &cp);
            if (!k)
                return -1;
            if (kept(cp, (opts & UTF8PROC_COMPAT) != 0)) {
                if (map_utf8proc(s + start, i - start, opts, o))
                    return -1;
                dsv4_buf_put(o, s + i, (size_t)k);
                start = i + (size_t)k;
            }
            i += (size_t)k;
        }
        return map_utf8proc(s + start, len - start, opts, o);
    }
    default:
        break;
    }
    if (op->kind == N_PREPEND) {
        if (len)
            dsv4_buf_put(o, op->content, strlen(op->content));
        dsv4_buf_put(o, s, len);
        return 0;
    }
    if (op->kind == N_REPLACE) {
        size_t cl = strlen(op->content);
        if (!op->re) {
            size_t i = 0;
            while (i < len) {
                if (len - i >= op->pat_len && !memcmp(s + i, op->pat, op->pat_len)) {
                    dsv4_buf_put(o, op->content, cl);
                    i += op->pat_len;
                } else
                    dsv4_buf_put(o, s + i++, 1);
            }
            return 0;
        }
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(op->re, NULL);
        if (!md)
            return -1;
        size_t i = 0;
        while (i <= len) {
            int rc = pcre2_match(op->re, u, len, i, PCRE2_NO_UTF_CHECK, md, NULL);
            if (rc < 0)
                break;
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            dsv4_buf_put(o, s + i, ov[0] - i);
            dsv4_buf_put(o, op->content, cl);
            if (ov[1] == ov[0]) {
                /* an empty match: copy one character and move on */
                if (ov[1] >= len) {
                    i = len + 1;
                    break;
                }
                uint32_t cp;
                int k = dsv4_utf8_decode1(u + ov[1], len - ov[1], &cp);
                dsv4_buf_put(o, s + ov[1], (size_t)(k ? k : 1));
                i = ov[1] + (size_t)(k ? k : 1);
            } else
                i = ov[1];
        }
        if (i < len)
            dsv4_buf_put(o, s + i, len - i);
        pcre2_match_data_free(md);
        return 0;
    }
    if (op->kind == N_STRIP) {
        size_t b = 0, e = len;
        uint32_t cp;
        while (op->left && b < e) {
            int k = dsv4_utf8_decode1(u + b, e - b, &cp);
            if (!k || !is_ws(cp))
                break;
            b += (size_t)k;
        }
        while (op->right && e > b) {
            size_t p = e - 1;
            while (p > b && (u[p] & 0xc0) == 0x80)
                p--;
            int k = dsv4_utf8_decode1(u + p, e - p, &cp);
            if (!k || !is_ws(cp))
                break;
            e = p;
        }
        dsv4_buf_put(o, s + b, e - b);
        return 0;
    }
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int k = dsv4_utf8_decode1(u + i, len - i, &cp);
        if (!k)
            return -1;
        if (op->kind == N_LOWER) {
            /* Rust's char::to_lowercase uses the full mapping; U+0130 is the one character whose
             * full lowercase differs from the simple one utf8proc gives. */
            if (cp == 0x130) {
                sb_cp(o, 'i');
                sb_cp(o, 0x307);
            } else
                sb_cp(o, to_lower(cp));
        } else if (!hf_mark(cp)) {
            dsv4_buf_put(o, s + i, (size_t)k);
        }
        i += (size_t)k;
    }
    return 0;
}

int dsv4_normalize(const dsv4_normalizer *n, const char *s, size_t len, char **out, size_t *out_len, dsv4_err *err)
{
    dsv4_buf cur = {0};
    dsv4_buf_put(&cur, s, len);
    if (!cur.p)
        dsv4_buf_put(&cur, "", 0);
    for (int i = 0; i < n->n && !cur.oom; i++) {
        dsv4_buf nx = {0};
        dsv4_buf_put(&nx, "", 0);
        if (apply(&n->ops[i], cur.p, cur.n, &nx) || nx.oom) {
            free(nx.p);
            free(cur.p);
            return dsv4_fail(err, DSV4_E_ARG, "normalize: invalid UTF-8 or out of memory");
        }
        free(cur.p);
        cur = nx;
    }
    if (cur.oom) {
        free(cur.p);
        return dsv4_fail(err, DSV4_E_NOMEM, "normalize: out of memory");
    }
    *out = cur.p;
    *out_len = cur.n;
    return 0;
}
