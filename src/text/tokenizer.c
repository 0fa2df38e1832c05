#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <cjson/cJSON.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include "core/core.h"
#include "text/normalize.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

/* ---- hashing and tables ------------------------------------------------------------- */

static uint64_t hash_bytes(const void *p, size_t n)
{
    const unsigned char *s = p;
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 29;
    return h;
}

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

/* Byte-string keys (stored in an arena) to a 64-bit value; open addressing, power-of-two size. */
typedef struct sslot {
    uint64_t h;
    uint32_t off, len; /* len == UINT32_MAX: empty */
    uint64_t val;
} sslot;

typedef struct strmap {
    sslot *s;
    size_t cap, n;
    char *arena;
    size_t an, acap;
} strmap;

static int sm_init(strmap *m, size_t want)
{
    size_t cap = 16;
    while (cap < want * 2)
        cap <<= 1;
    m->s = malloc(cap * sizeof *m->s);
    if (!m->s)
        return -1;
    for (size_t i = 0; i < cap; i++)
        m->s[i].len = UINT32_MAX;
    m->cap = cap;
    m->n = 0;
    m->an = 0;
    return 0;
}

static void sm_free(strmap *m)
{
    free(m->s);
    free(m->arena);
    memset(m, 0, sizeof *m);
}

static sslot *sm_find(const strmap *m, const void *k, size_t len, uint64_t h)
{
    size_t mask = m->cap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        sslot *e = &m->s[i];
        if (e->len == UINT32_MAX)
            return e;
        if (e->h == h && e->len == len && !memcmp(m->arena + e->off, k, len))
            return e;
    }
}

static int sm_grow(strmap *m)
{
    strmap o = *m;
    size_t cap = m->cap * 2;
    sslot *s = malloc(cap * sizeof *s);
    if (!s)
        return -1;
    for (size_t i = 0; i < cap; i++)
        s[i].len = UINT32_MAX;
    m->s = s;
    m->cap = cap;
    for (size_t i = 0; i < o.cap; i++) {
        if (o.s[i].len == UINT32_MAX)
            continue;
        size_t j = o.s[i].h & (cap - 1);
        while (s[j].len != UINT32_MAX)
            j = (j + 1) & (cap - 1);
        s[j] = o.s[i];
    }
    free(o.s);
    return 0;
}

/* Inserts or overwrites. Returns 0, or -1 when out of memory. */
static int sm_put(strmap *m, const void *k, size_t len, uint64_t val)
{
    if ((m->n + 1) * 2 > m->cap && sm_grow(m))
        return -1;
    uint64_t h = hash_bytes(k, len);
    sslot *e = sm_find(m, k, len, h);
    if (e->len != UINT32_MAX) {
        e->val = val;
        return 0;
    }
    if (m->an + len > m->acap) {
        size_t c = (m->an + len) * 2 + 64;
        char *a = realloc(m->arena, c);
        if (!a)
            return -1;
        m->arena = a;
        m->acap = c;
    }
    memcpy(m->arena + m->an, k, len);
    e->h = h;
    e->off = (uint32_t)m->an;
    e->len = (uint32_t)len;
    e->val = val;
    m->an += len;
    m->n++;
    return 0;
}

static int sm_get(const strmap *m, const void *k, size_t len, uint64_t *val)
{
    if (!m->cap)
        return 0;
    sslot *e = sm_find(m, k, len, hash_bytes(k, len));
    if (e->len == UINT32_MAX)
        return 0;
    *val = e->val;
    return 1;
}

/* Merge table: key (left id << 32 | right id), value (rank << 32 | merged id). */
typedef struct mslot {
    uint64_t k, v;
} mslot;

#define M_EMPTY UINT64_MAX

/* ---- tokenizer ----------------------------------------------------------------------- */

typedef struct added {
    char *s;           /* content as written */
    size_t len;
    char *m;           /* what is matched: the content, normalized for normalized tokens */
    size_t mlen;
    int32_t id;
    int special, normalized, lstrip, rstrip;
} added;

/* Added tokens that may start at a given byte, longest first (leftmost-longest matching). */
typedef struct matcher {
    int *idx;         /* indices into t->added, grouped by first byte */
    int start[257];   /* group of byte b: idx[start[b] .. start[b+1]) */
} matcher;

enum { SPLIT_ISOLATED, SPLIT_REMOVED };

typedef struct split {
    pcre2_code *re;
    int behavior;
} split;

#define CACHE_MAX_WORD 128
#define CACHE_MAX_ENTRIES (1u << 20)

struct dsv4_tokenizer {
    strmap vocab;            /* token spelled in the byte-level alphabet -> id (model vocabulary) */
    mslot *merges;
    size_t mcap;
    int32_t byte_id[256];    /* id of the one-byte token of each byte */
    char byte_ch[256][3];    /* byte-level alphabet: UTF-8 of the character standing for each byte */
    int byte_chn[256];
    int32_t n_vocab;
    int ignore_merges;
    /* per id: decoded bytes and the spelled token */
    uint32_t *dec_off, *dec_len, *tok_off;
    char *dec, *tok;
    unsigned char *is_special;
    added *added;
    int n_added;
    matcher m_raw, m_norm;   /* non-normalized tokens (matched on raw text), normalized ones */
    dsv4_normalizer *norm;
    split *splits;
    int n_splits;
    pthread_mutex_t lock;
    strmap cache;            /* word bytes -> (offset << 24 | count) into cache_ids */
    int32_t *cache_ids;
    size_t cn, ccap;
};

/* The byte-level alphabet of GPT-2: printable Latin-1 bytes stand for themselves, the others
 * are shifted to U+0100 and up in byte order. */
static void byte_alphabet(dsv4_tokenizer *t)
{
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
        uint32_t cp = keep ? (uint32_t)b : 256u + (uint32_t)n++;
        if (cp < 0x80) {
            t->byte_ch[b][0] = (char)cp;
            t->byte_chn[b] = 1;
        } else {
            t->byte_ch[b][0] = (char)(0xc0 | (cp >> 6));
            t->byte_ch[b][1] = (char)(0x80 | (cp & 0x3f));
            t->byte_chn[b] = 2;
        }
    }
}

/* Byte a byte-level character stands for, or -1 when cp is outside the alphabet. */
static int alphabet_byte(uint32_t cp)
{
    if ((cp >= '!' && cp <= '~') || (cp >= 0xa1 && cp <= 0xac) || (cp >= 0xae && cp <= 0xff))
        return (int)cp;
    if (cp < 256 || cp >= 256 + 68)
        return -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
        if (!keep && 256 + n++ == (int)cp)
            return b;
    }
    return -1;
}

static int merge_put(dsv4_tokenizer *t, uint64_t k, uint64_t v)
{
    size_t mask = t->mcap - 1;
    for (size_t i = hash_u64(k) & mask;; i = (i + 1) & mask) {
        if (t->merges[i].k == M_EMPTY || t->merges[i].k == k) {
            if (t->merges[i].k == k)
                return 0; /* a repeated merge keeps its first (best) rank */
            t->merges[i].k = k;
            t->merges[i].v = v;
            return 0;
        }
    }
}

static inline int merge_get(const dsv4_tokenizer *t, int32_t a, int32_t b, uint64_t *v)
{
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t mask = t->mcap - 1;
    for (size_t i = hash_u64(k) & mask;; i = (i + 1) & mask) {
        if (t->merges[i].k == k) {
            *v = t->merges[i].v;
            return 1;
        }
        if (t->merges[i].k == M_EMPTY)
            return 0;
    }
}

void dsv4_tokenizer_free(dsv4_tokenizer *t)
{
    if (!t)
        return;
    sm_free(&t->vocab);
    free(t->merges);
    free(t->dec_off);
    free(t->dec_len);
    free(t->tok_off);
    free(t->dec);
    free(t->tok);
    free(t->is_special);
    for (int i = 0; i < t->n_added; i++) {
        if (t->added[i].m != t->added[i].s)
            free(t->added[i].m);
        free(t->added[i].s);
    }
    free(t->added);
    free(t->m_raw.idx);
    free(t->m_norm.idx);
    dsv4_normalizer_free(t->norm);
    for (int i = 0; i < t->n_splits; i++)
        pcre2_code_free(t->splits[i].re);
    free(t->splits);
    sm_free(&t->cache);
    free(t->cache_ids);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

static char *read_file(const char *path, size_t *len, dsv4_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        dsv4_fail(err, DSV4_E_IO, "cannot open %s", path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        dsv4_fail(err, DSV4_E_IO, "cannot read %s", path);
        return NULL;
    }
    fclose(f);
    buf[n] = 0;
    *len = (size_t)n;
    return buf;
}

static int build_matcher(dsv4_tokenizer *t, matcher *m, int normalized)
{
    int cnt[257] = {0};
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].normalized == normalized && t->added[i].mlen)
            cnt[(unsigned char)t->added[i].m[0]]++;
    m->start[0] = 0;
    for (int b = 0; b < 256; b++)
        m->start[b + 1] = m->start[b] + cnt[b];
    m->idx = malloc(((size_t)m->start[256] + 1) * sizeof *m->idx);
    if (!m->idx)
        return -1;
    int fill[256];
    for (int b = 0; b < 256; b++)
        fill[b] = m->start[b];
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].normalized == normalized && t->added[i].mlen)
            m->idx[fill[(unsigned char)t->added[i].m[0]]++] = i;
    for (int b = 0; b < 256; b++) /* longest first within each group (insertion sort: groups are small) */
        for (int i = m->start[b] + 1; i < m->start[b + 1]; i++)
            for (int j = i; j > m->start[b] && t->added[m->idx[j]].mlen > t->added[m->idx[j - 1]].mlen; j--) {
                int x = m->idx[j];
                m->idx[j] = m->idx[j - 1];
                m->idx[j - 1] = x;
            }
    return 0;
}

static int add_split(dsv4_tokenizer *t, const char *pattern, int literal, int behavior, dsv4_err *err)
{
    int ec;
    PCRE2_SIZE eo;
    char *adapted = literal ? NULL : dsv4_regex_adapt(pattern);
    if (!literal && !adapted)
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(literal ? pattern : adapted), PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0), &ec, &eo, NULL);
    free(adapted);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return dsv4_fail(err, DSV4_E_FORMAT, "pre_tokenizer regex: %s at offset %zu", (char *)msg, (size_t)eo);
    }
    /* JIT is a speed-up only; without it matching stays correct */
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    split *s = realloc(t->splits, (size_t)(t->n_splits + 1) * sizeof *s);
    if (!s) {
        pcre2_code_free(re);
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    }
    t->splits = s;
    t->splits[t->n_splits].re = re;
    t->splits[t->n_splits].behavior = behavior;
    t->n_splits++;
    return 0;
}

/* GPT-2's pattern, which ByteLevel applies when its use_regex is set. */
static const char gpt2_pattern[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int parse_pretok(dsv4_tokenizer *t, const cJSON *j, dsv4_err *err)
{
    if (!j || cJSON_IsNull(j))
        return 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsString(type))
        return dsv4_fail(err, DSV4_E_FORMAT, "pre_tokenizer: missing \"type\"");
    const char *ty = type->valuestring;
    if (!strcmp(ty, "Sequence")) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(j, "pretokenizers"))
        {
            int rc = parse_pretok(t, e, err);
            if (rc)
                return rc;
        }
        return 0;
    }
    if (!strcmp(ty, "ByteLevel")) {
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "add_prefix_space")))
            return dsv4_fail(err, DSV4_E_UNSUPPORTED, "pre_tokenizer ByteLevel with add_prefix_space is not supported");
        /* the byte mapping itself happens in the BPE step */
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "use_regex")))
            return add_split(t, gpt2_pattern, 0, SPLIT_ISOLATED, err);
        return 0;
    }
    if (!strcmp(ty, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(j, "pattern");
        const cJSON *rx = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(pat, "String");
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(j, "behavior");
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "invert")))
            return dsv4_fail(err, DSV4_E_UNSUPPORTED, "pre_tokenizer Split with invert is not supported");
        int b;
        if (cJSON_IsString(beh) && !strcmp(beh->valuestring, "Isolated"))
            b = SPLIT_ISOLATED;
        else if (cJSON_IsString(beh) && !strcmp(beh->valuestring, "Removed"))
            b = SPLIT_REMOVED;
        else
            return dsv4_fail(err, DSV4_E_UNSUPPORTED, "pre_tokenizer Split behavior %s is not supported",
                             cJSON_IsString(beh) ? beh->valuestring : "(missing)");
        if (cJSON_IsString(rx))
            return add_split(t, rx->valuestring, 0, b, err);
        if (cJSON_IsString(st))
            return add_split(t, st->valuestring, 1, b, err);
        return dsv4_fail(err, DSV4_E_FORMAT, "pre_tokenizer Split: missing pattern");
    }
    return dsv4_fail(err, DSV4_E_UNSUPPORTED, "pre_tokenizer type \"%s\" is not supported", ty);
}

/* Splits a merges entry, "left right" or ["left", "right"], into its two token spellings. */
static int merge_parts(const cJSON *e, const char **a, size_t *al, const char **b, size_t *bl)
{
    if (cJSON_IsString(e)) {
        const char *s = e->valuestring, *sp = strchr(s, ' ');
        if (!sp || sp == s || !sp[1] || strchr(sp + 1, ' '))
            return -1;
        *a = s;
        *al = (size_t)(sp - s);
        *b = sp + 1;
        *bl = strlen(sp + 1);
        return 0;
    }
    if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2) {
        const cJSON *x = cJSON_GetArrayItem(e, 0), *y = cJSON_GetArrayItem(e, 1);
        if (!cJSON_IsString(x) || !cJSON_IsString(y))
            return -1;
        *a = x->valuestring;
        *al = strlen(x->valuestring);
        *b = y->valuestring;
        *bl = strlen(y->valuestring);
        return 0;
    }
    return -1;
}

/* Decoded bytes of one token, by Hugging Face's ByteLevel decoder rule: a token whose every
 * character is in the byte-level alphabet stands for those bytes; any other token for its own
 * UTF-8 text. */
static size_t token_bytes(const char *tok, size_t len, char *out)
{
    const unsigned char *u = (const unsigned char *)tok;
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int k = dsv4_utf8_decode1(u + i, len - i, &cp);
        int b = k ? alphabet_byte(cp) : -1;
        if (b < 0) {
            memcpy(out, tok, len);
            return len;
        }
        out[n++] = (char)b;
        i += (size_t)k;
    }
    return n;
}

static int load_json(dsv4_tokenizer *t, const cJSON *root, dsv4_err *err)
{
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (!cJSON_IsObject(model) || (mt && (!cJSON_IsString(mt) || strcmp(mt->valuestring, "BPE"))))
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "model: only BPE is supported");
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback")))
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "model: byte_fallback is not supported");
    const char *nulls[] = {"continuing_subword_prefix", "end_of_word_suffix", "dropout"};
    for (int i = 0; i < 3; i++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(model, nulls[i]);
        if (x && !cJSON_IsNull(x) && !(cJSON_IsString(x) && !x->valuestring[0]))
            return dsv4_fail(err, DSV4_E_UNSUPPORTED, "model: %s is not supported", nulls[i]);
    }
    t->ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"));
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges))
        return dsv4_fail(err, DSV4_E_FORMAT, "model: missing vocab or merges");

    int nv = cJSON_GetArraySize(vocab);
    if (sm_init(&t->vocab, (size_t)nv))
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    int32_t maxid = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab)
    {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > 1e9)
            return dsv4_fail(err, DSV4_E_FORMAT, "vocab: bad id for \"%s\"", e->string);
        int32_t id = (int32_t)e->valuedouble;
        if (sm_put(&t->vocab, e->string, strlen(e->string), (uint64_t)id))
            return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
        if (id > maxid)
            maxid = id;
    }
    int na = cJSON_GetArraySize(addl);
    t->added = calloc((size_t)na + 1, sizeof *t->added);
    if (!t->added)
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    cJSON_ArrayForEach(e, addl)
    {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (!cJSON_IsNumber(id) || !cJSON_IsString(c) || id->valuedouble < 0 || id->valuedouble > 1e9)
            return dsv4_fail(err, DSV4_E_FORMAT, "added_tokens: bad entry");
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "single_word")))
            return dsv4_fail(err, DSV4_E_UNSUPPORTED, "added_tokens: single_word is not supported (\"%s\")", c->valuestring);
        added *a = &t->added[t->n_added++];
        a->len = strlen(c->valuestring);
        a->s = malloc(a->len + 1);
        if (!a->s)
            return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
        memcpy(a->s, c->valuestring, a->len + 1);
        a->id = (int32_t)id->valuedouble;
        a->special = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "special"));
        a->normalized = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "normalized"));
        a->lstrip = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "lstrip"));
        a->rstrip = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "rstrip"));
        if (a->id > maxid)
            maxid = a->id;
    }
    t->n_vocab = maxid + 1;
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (norm && !cJSON_IsNull(norm)) {
        t->norm = dsv4_normalizer_from_cjson(norm, err);
        if (!t->norm)
            return err ? err->code : DSV4_E_FORMAT;
    }
    /* Normalized added tokens are looked for in normalized text, so in their normalized form; as
     * in Hugging Face, that form is also what their id decodes to. */
    for (int i = 0; i < t->n_added; i++) {
        added *a = &t->added[i];
        a->m = a->s;
        a->mlen = a->len;
        if (a->normalized && t->norm && a->len) {
            int rc = dsv4_normalize(t->norm, a->s, a->len, &a->m, &a->mlen, err);
            if (rc) {
                a->m = a->s;
                return rc;
            }
        }
    }

    /* per-id spelled token and decoded bytes; added tokens take precedence over the model's */
    size_t nid = (size_t)t->n_vocab;
    t->tok_off = malloc((nid + 1) * sizeof *t->tok_off);
    t->dec_off = malloc((nid + 1) * sizeof *t->dec_off);
    t->dec_len = calloc(nid + 1, sizeof *t->dec_len);
    t->is_special = calloc(nid + 1, 1);
    const char **spell = calloc(nid + 1, sizeof *spell);
    if (!t->tok_off || !t->dec_off || !t->dec_len || !t->is_special || !spell) {
        free(spell);
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    }
    cJSON_ArrayForEach(e, vocab) spell[(int32_t)e->valuedouble] = e->string;
    for (int i = 0; i < t->n_added; i++) {
        spell[t->added[i].id] = t->added[i].m;
        t->is_special[t->added[i].id] = (unsigned char)t->added[i].special;
    }
    size_t total = 0;
    for (size_t i = 0; i < nid; i++)
        total += spell[i] ? strlen(spell[i]) + 1 : 1;
    t->tok = malloc(total);
    t->dec = malloc(total);
    if (!t->tok || !t->dec) {
        free(spell);
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    }
    size_t to = 0, dn = 0;
    for (size_t i = 0; i < nid; i++) {
        t->tok_off[i] = (uint32_t)to;
        t->dec_off[i] = (uint32_t)dn;
        if (!spell[i]) {
            t->tok_off[i] = UINT32_MAX;
            continue;
        }
        size_t k = strlen(spell[i]);
        memcpy(t->tok + to, spell[i], k + 1);
        to += k + 1;
        size_t d = token_bytes(spell[i], k, t->dec + dn);
        t->dec_len[i] = (uint32_t)d;
        dn += d;
    }
    free(spell);

    byte_alphabet(t);
    for (int b = 0; b < 256; b++) {
        uint64_t v;
        if (!sm_get(&t->vocab, t->byte_ch[b], (size_t)t->byte_chn[b], &v))
            return dsv4_fail(err, DSV4_E_FORMAT, "vocab: no token for byte 0x%02x (not a byte-level vocabulary)", b);
        t->byte_id[b] = (int32_t)v;
    }

    int nm = cJSON_GetArraySize(merges);
    t->mcap = 16;
    while (t->mcap < (size_t)nm * 2 + 16)
        t->mcap <<= 1;
    t->merges = malloc(t->mcap * sizeof *t->merges);
    if (!t->merges)
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    for (size_t i = 0; i < t->mcap; i++)
        t->merges[i].k = M_EMPTY;
    char *cat = NULL;
    size_t catcap = 0;
    uint64_t rank = 0;
    cJSON_ArrayForEach(e, merges)
    {
        const char *a, *b;
        size_t al, bl;
        uint64_t ia, ib, im;
        if (merge_parts(e, &a, &al, &b, &bl)) {
            free(cat);
            return dsv4_fail(err, DSV4_E_FORMAT, "merges: entry %llu is malformed", (unsigned long long)rank);
        }
        if (al + bl > catcap) {
            catcap = (al + bl) * 2;
            char *c = realloc(cat, catcap);
            if (!c) {
                free(cat);
                return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
            }
            cat = c;
        }
        memcpy(cat, a, al);
        memcpy(cat + al, b, bl);
        if (!sm_get(&t->vocab, a, al, &ia) || !sm_get(&t->vocab, b, bl, &ib) || !sm_get(&t->vocab, cat, al + bl, &im)) {
            free(cat);
            return dsv4_fail(err, DSV4_E_FORMAT, "merges: entry %llu names a token missing from the vocab", (unsigned long long)rank);
        }
        merge_put(t, ia << 32 | ib, rank << 32 | im);
        rank++;
    }
    free(cat);

    if (build_matcher(t, &t->m_raw, 0) || build_matcher(t, &t->m_norm, 1))
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    int rc = parse_pretok(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), err);
    if (rc)
        return rc;
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(dec, "type");
    if (dec && !cJSON_IsNull(dec) && !(cJSON_IsString(dt) && !strcmp(dt->valuestring, "ByteLevel")))
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "decoder: only ByteLevel is supported");
    if (sm_init(&t->cache, 4096))
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    return 0;
}

dsv4_tokenizer *dsv4_tokenizer_load(const char *path, dsv4_err *err)
{
    char file[4096];
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        snprintf(file, sizeof file, "%s/tokenizer.json", path);
    else
        snprintf(file, sizeof file, "%s", path);
    size_t len;
    char *text = read_file(file, &len, err);
    if (!text)
        return NULL;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root) {
        dsv4_fail(err, DSV4_E_FORMAT, "%s: invalid JSON", file);
        return NULL;
    }
    dsv4_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        cJSON_Delete(root);
        dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&t->lock, NULL);
    int rc = load_json(t, root, err);
    cJSON_Delete(root);
    if (rc) {
        dsv4_err_prefix(err, "%s", file);
        dsv4_tokenizer_free(t);
        return NULL;
    }
    return t;
}

int32_t dsv4_tokenizer_n_vocab(const dsv4_tokenizer *t) { return t->n_vocab; }

const char *dsv4_tokenizer_id_bytes(const dsv4_tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n_vocab || t->tok_off[id] == UINT32_MAX)
        return NULL;
    *len = t->dec_len[id];
    return t->dec + t->dec_off[id];
}

const char *dsv4_tokenizer_id_token(const dsv4_tokenizer *t, int32_t id)
{
    if (id < 0 || id >= t->n_vocab || t->tok_off[id] == UINT32_MAX)
        return NULL;
    return t->tok + t->tok_off[id];
}

int32_t dsv4_tokenizer_token_id(const dsv4_tokenizer *t, const char *token)
{
    size_t k = strlen(token);
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].len == k && !memcmp(t->added[i].s, token, k))
            return t->added[i].id;
    uint64_t v;
    return sm_get(&t->vocab, token, k, &v) ? (int32_t)v : -1;
}

int dsv4_tokenizer_is_special(const dsv4_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && t->is_special[id];
}

void dsv4_ids_free(dsv4_ids *ids)
{
    free(ids->v);
    memset(ids, 0, sizeof *ids);
}

static int ids_reserve(dsv4_ids *o, size_t more)
{
    if (o->n + more <= o->cap)
        return 0;
    size_t c = o->cap ? o->cap : 64;
    while (c < o->n + more)
        c *= 2;
    int32_t *v = realloc(o->v, c * sizeof *v);
    if (!v)
        return -1;
    o->v = v;
    o->cap = c;
    return 0;
}

/* ---- BPE ------------------------------------------------------------------------------ */

typedef struct hent {
    uint32_t rank, pos, rpos;
    int32_t a, b, m;
} hent;

static inline int hless(const hent *x, const hent *y)
{
    return x->rank < y->rank || (x->rank == y->rank && x->pos < y->pos);
}

static void hpush(hent *h, size_t *n, hent e)
{
    size_t i = (*n)++;
    while (i) {
        size_t p = (i - 1) / 2;
        if (!hless(&e, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static hent hpop(hent *h, size_t *n)
{
    hent top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && hless(&h[c + 1], &h[c]))
            c++;
        if (!hless(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n)
        h[i] = last;
    return top;
}

typedef struct work {
    int32_t *id;
    int32_t *prev, *next;
    hent *heap;
    size_t cap;
} work;

static int work_reserve(work *w, size_t n)
{
    if (n <= w->cap)
        return 0;
    size_t c = w->cap ? w->cap : 64;
    while (c < n)
        c *= 2;
    int32_t *a = realloc(w->id, c * sizeof *a);
    if (a)
        w->id = a;
    int32_t *p = realloc(w->prev, c * sizeof *p);
    if (p)
        w->prev = p;
    int32_t *x = realloc(w->next, c * sizeof *x);
    if (x)
        w->next = x;
    hent *h = realloc(w->heap, 2 * c * sizeof *h);
    if (h)
        w->heap = h;
    if (!a || !p || !x || !h)
        return -1;
    w->cap = c;
    return 0;
}

static void work_free(work *w)
{
    free(w->id);
    free(w->prev);
    free(w->next);
    free(w->heap);
}

static inline void push_pair(const dsv4_tokenizer *t, work *w, size_t *hn, int32_t l, int32_t r)
{
    uint64_t v;
    if (merge_get(t, w->id[l], w->id[r], &v))
        hpush(w->heap, hn, (hent){(uint32_t)(v >> 32), (uint32_t)l, (uint32_t)r, w->id[l], w->id[r], (int32_t)(uint32_t)v});
}

/* BPE over one pre-tokenized word: start from one symbol per byte and apply the merge of lowest
 * rank (leftmost first among equals) until none applies. Appends the ids to out. */
static int bpe_word(const dsv4_tokenizer *t, work *w, const unsigned char *s, size_t n, dsv4_ids *out)
{
    if (t->ignore_merges) {
        char sp[2 * CACHE_MAX_WORD];
        size_t k = 0;
        if (n <= CACHE_MAX_WORD) {
            for (size_t i = 0; i < n; i++) {
                memcpy(sp + k, t->byte_ch[s[i]], (size_t)t->byte_chn[s[i]]);
                k += (size_t)t->byte_chn[s[i]];
            }
            uint64_t v;
            if (sm_get(&t->vocab, sp, k, &v)) {
                if (ids_reserve(out, 1))
                    return -1;
                out->v[out->n++] = (int32_t)v;
                return 0;
            }
        }
    }
    if (work_reserve(w, n) || ids_reserve(out, n))
        return -1;
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        w->id[i] = t->byte_id[s[i]];
        w->prev[i] = (int32_t)i - 1;
        w->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < n; i++)
        push_pair(t, w, &hn, (int32_t)i, (int32_t)i + 1);
    while (hn) {
        hent e = hpop(w->heap, &hn);
        int32_t l = (int32_t)e.pos, r = (int32_t)e.rpos;
        if (w->id[l] != e.a || w->next[l] != r || w->id[r] != e.b)
            continue; /* stale: one side was merged since this pair was queued */
        w->id[l] = e.m;
        w->id[r] = -1;
        int32_t rn = w->next[r];
        w->next[l] = rn;
        if (rn >= 0)
            w->prev[rn] = l;
        if (w->prev[l] >= 0)
            push_pair(t, w, &hn, w->prev[l], l);
        if (rn >= 0)
            push_pair(t, w, &hn, l, rn);
    }
    for (int32_t i = 0; i >= 0; i = w->next[i])
        out->v[out->n++] = w->id[i];
    return 0;
}

/* A word's ids, from the cache or by BPE (then cached). */
static int encode_word(dsv4_tokenizer *t, work *w, const unsigned char *s, size_t n, dsv4_ids *out)
{
    if (n == 0)
        return 0;
    if (n > CACHE_MAX_WORD)
        return bpe_word(t, w, s, n, out);
    uint64_t v;
    pthread_mutex_lock(&t->lock);
    if (sm_get(&t->cache, s, n, &v)) {
        size_t off = (size_t)(v >> 24), cnt = (size_t)(v & 0xffffff);
        if (ids_reserve(out, cnt)) {
            pthread_mutex_unlock(&t->lock);
            return -1;
        }
        memcpy(out->v + out->n, t->cache_ids + off, cnt * sizeof(int32_t));
        out->n += cnt;
        pthread_mutex_unlock(&t->lock);
        return 0;
    }
    pthread_mutex_unlock(&t->lock);
    size_t start = out->n;
    if (bpe_word(t, w, s, n, out))
        return -1;
    size_t cnt = out->n - start;
    pthread_mutex_lock(&t->lock);
    if (t->cache.n >= CACHE_MAX_ENTRIES) {
        /* a bounded cache: start over rather than grow without limit */
        sm_free(&t->cache);
        t->cn = 0;
        if (sm_init(&t->cache, 4096)) {
            pthread_mutex_unlock(&t->lock);
            return -1;
        }
    }
    if (t->cn + cnt > t->ccap) {
        size_t c = (t->cn + cnt) * 2 + 1024;
        int32_t *p = realloc(t->cache_ids, c * sizeof *p);
        if (!p) {
            pthread_mutex_unlock(&t->lock);
            return 0; /* caching is optional */
        }
        t->cache_ids = p;
        t->ccap = c;
    }
    memcpy(t->cache_ids + t->cn, out->v + start, cnt * sizeof(int32_t));
    sm_put(&t->cache, s, n, (uint64_t)t->cn << 24 | cnt);
    t->cn += cnt;
    pthread_mutex_unlock(&t->lock);
    return 0;
}

/* ---- pre-tokenization and encode ------------------------------------------------------- */

typedef struct enc {
    dsv4_tokenizer *t;
    work w;
    pcre2_match_data *md;
    dsv4_ids *out;
    dsv4_err *err;
} enc;

/* Applies split level k to s[0..n) and recurses into each piece; the last level runs BPE. */
static int pretok(enc *e, int k, const unsigned char *s, size_t n)
{
    if (n == 0)
        return 0;
    if (k == e->t->n_splits) {
        if (encode_word(e->t, &e->w, s, n, e->out))
            return dsv4_fail(e->err, DSV4_E_NOMEM, "encode: out of memory");
        return 0;
    }
    const split *sp = &e->t->splits[k];
    size_t pos = 0, last = 0;
    while (pos <= n) {
        int rc = pcre2_match(sp->re, s, n, pos, PCRE2_NO_UTF_CHECK, e->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            /* JIT stack exhaustion on a pathological piece: the interpreter has no such limit */
            rc = pcre2_match(sp->re, s, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, e->md, NULL);
            if (rc == PCRE2_ERROR_NOMATCH)
                break;
            if (rc < 0)
                return dsv4_fail(e->err, DSV4_E_ARG, "encode: regex match failed (%d)", rc);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) {
            /* empty matches delimit nothing; step over one character */
            if (ms >= n)
                break;
            uint32_t cp;
            int c = dsv4_utf8_decode1(s + ms, n - ms, &cp);
            pos = ms + (size_t)(c ? c : 1);
            continue;
        }
        int rc2 = pretok(e, k + 1, s + last, ms - last);
        if (rc2)
            return rc2;
        if (sp->behavior == SPLIT_ISOLATED && (rc2 = pretok(e, k + 1, s + ms, me - ms)))
            return rc2;
        last = pos = me;
    }
    return pretok(e, k + 1, s + last, n - last);
}

/* Rust's char::is_whitespace (White_Space), which lstrip/rstrip follow. */
static int is_white(uint32_t c)
{
    return (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) ||
           c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

/* Start of the whitespace run ending at s[at], not before `from`. */
static size_t white_back(const unsigned char *s, size_t from, size_t at)
{
    while (at > from) {
        size_t p = at - 1;
        while (p > from && (s[p] & 0xc0) == 0x80)
            p--;
        uint32_t cp;
        if (dsv4_utf8_decode1(s + p, at - p, &cp) != (int)(at - p) || !is_white(cp))
            break;
        at = p;
    }
    return at;
}

/* End of the whitespace run starting at s[at]. */
static size_t white_fwd(const unsigned char *s, size_t at, size_t n)
{
    uint32_t cp;
    int k;
    while (at < n && (k = dsv4_utf8_decode1(s + at, n - at, &cp)) > 0 && is_white(cp))
        at += (size_t)k;
    return at;
}

/* Leftmost-longest added token in s[from..n) by matcher m; returns its index in t->added or -1,
 * with the matched span (widened by lstrip/rstrip) in *ms, *me. */
static int find_added(const dsv4_tokenizer *t, const matcher *m, const unsigned char *s, size_t from, size_t n,
                      size_t *ms, size_t *me)
{
    if (m->start[256] == 0)
        return -1;
    for (size_t i = from; i < n; i++) {
        int b = s[i];
        for (int j = m->start[b]; j < m->start[b + 1]; j++) {
            const added *a = &t->added[m->idx[j]];
            if (a->mlen <= n - i && !memcmp(s + i, a->m, a->mlen)) {
                size_t st = i, en = i + a->mlen;
                if (a->lstrip)
                    st = white_back(s, from, st);
                if (a->rstrip)
                    en = white_fwd(s, en, n);
                *ms = st;
                *me = en;
                return m->idx[j];
            }
        }
    }
    return -1;
}

/* Normalizes a segment free of non-normalized added tokens, then splits it on the normalized
 * added tokens and pre-tokenizes what lies between. */
static int encode_segment(enc *e, const unsigned char *s, size_t n)
{
    char *norm = NULL;
    size_t nn = n;
    const unsigned char *p = s;
    if (e->t->norm && n) {
        int rc = dsv4_normalize(e->t->norm, (const char *)s, n, &norm, &nn, e->err);
        if (rc)
            return rc;
        p = (const unsigned char *)norm;
    }
    size_t pos = 0;
    int rc = 0;
    while (pos < nn) {
        size_t ms, me;
        int a = find_added(e->t, &e->t->m_norm, p, pos, nn, &ms, &me);
        if (a < 0)
            break;
        if ((rc = pretok(e, 0, p + pos, ms - pos)))
            goto done;
        if (ids_reserve(e->out, 1)) {
            rc = dsv4_fail(e->err, DSV4_E_NOMEM, "encode: out of memory");
            goto done;
        }
        e->out->v[e->out->n++] = e->t->added[a].id;
        pos = me;
    }
    rc = pretok(e, 0, p + pos, nn - pos);
done:
    free(norm);
    return rc;
}

int dsv4_tokenizer_encode(dsv4_tokenizer *t, const char *text, size_t len, dsv4_ids *out, dsv4_err *err)
{
    int inc;
    char *clean = NULL;
    const unsigned char *s = (const unsigned char *)text;
    if (dsv4_utf8_valid_prefix(s, len, &inc) != len) {
        clean = dsv4_utf8_sanitize(text, len, &len);
        if (!clean)
            return dsv4_fail(err, DSV4_E_NOMEM, "encode: out of memory");
        s = (const unsigned char *)clean;
    }
    enc e = {.t = t, .out = out, .err = err};
    e.md = pcre2_match_data_create(4, NULL);
    int rc = 0;
    if (!e.md) {
        rc = dsv4_fail(err, DSV4_E_NOMEM, "encode: out of memory");
        goto done;
    }
    /* Hugging Face's order: tokens that skip normalization are found on the raw text first */
    size_t pos = 0;
    while (pos < len) {
        size_t ms, me;
        int a = find_added(t, &t->m_raw, s, pos, len, &ms, &me);
        if (a < 0)
            break;
        if ((rc = encode_segment(&e, s + pos, ms - pos)))
            goto done;
        if (ids_reserve(out, 1)) {
            rc = dsv4_fail(err, DSV4_E_NOMEM, "encode: out of memory");
            goto done;
        }
        out->v[out->n++] = t->added[a].id;
        pos = me;
    }
    rc = encode_segment(&e, s + pos, len - pos);
done:
    pcre2_match_data_free(e.md);
    work_free(&e.w);
    free(clean);
    return rc;
}

/* ---- decode ---------------------------------------------------------------------------- */

int dsv4_tokenizer_decode(const dsv4_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                          char **out, size_t *out_len, dsv4_err *err)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab || t->tok_off[ids[i]] == UINT32_MAX)
            return dsv4_fail(err, DSV4_E_ARG, "decode: unknown id %d", (int)ids[i]);
        total += t->dec_len[ids[i]];
    }
    char *raw = malloc(total + 1);
    if (!raw)
        return dsv4_fail(err, DSV4_E_NOMEM, "decode: out of memory");
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (skip_special && t->is_special[ids[i]])
            continue;
        memcpy(raw + k, t->dec + t->dec_off[ids[i]], t->dec_len[ids[i]]);
        k += t->dec_len[ids[i]];
    }
    int inc;
    if (dsv4_utf8_valid_prefix((unsigned char *)raw, k, &inc) == k) {
        raw[k] = 0;
        *out = raw;
        *out_len = k;
        return 0;
    }
    *out = dsv4_utf8_sanitize(raw, k, out_len);
    free(raw);
    return *out ? 0 : dsv4_fail(err, DSV4_E_NOMEM, "decode: out of memory");
}

void dsv4_detok_init(dsv4_detok *d, const dsv4_tokenizer *t, int skip_special)
{
    memset(d, 0, sizeof *d);
    d->t = t;
    d->skip_special = skip_special;
}

void dsv4_detok_free(dsv4_detok *d)
{
    free(d->buf);
    memset(d, 0, sizeof *d);
}

const char *dsv4_detok_push(dsv4_detok *d, int32_t id, size_t *len, dsv4_err *err)
{
    const dsv4_tokenizer *t = d->t;
    if (id < 0 || id >= t->n_vocab || t->tok_off[id] == UINT32_MAX) {
        dsv4_fail(err, DSV4_E_ARG, "decode: unknown id %d", (int)id);
        return NULL;
    }
    size_t tl = (d->skip_special && t->is_special[id]) ? 0 : t->dec_len[id];
    size_t need = (size_t)d->npend + tl;
    /* room for the joined bytes plus the U+FFFD expansion of every held-back byte */
    if (need * 3 + 8 > d->cap) {
        size_t c = need * 6 + 64;
        char *b = realloc(d->buf, c);
        if (!b) {
            dsv4_fail(err, DSV4_E_NOMEM, "decode: out of memory");
            return NULL;
        }
        d->buf = b;
        d->cap = c;
    }
    unsigned char *raw = (unsigned char *)d->buf + need * 2 + 4;
    memcpy(raw, d->pend, (size_t)d->npend);
    memcpy(raw + d->npend, t->dec + t->dec_off[id], tl);
    d->npend = 0;
    size_t i = 0, o = 0;
    while (i < need) {
        int inc;
        size_t ok = dsv4_utf8_valid_prefix(raw + i, need - i, &inc);
        memmove(d->buf + o, raw + i, ok);
        o += ok;
        i += ok;
        if (i == need)
            break;
        if (inc) {
            d->npend = (int)(need - i);
            memcpy(d->pend, raw + i, need - i);
            break;
        }
        /* an invalid sequence: one U+FFFD for its maximal subpart, as whole-text decoding does */
        memcpy(d->buf + o, "\xef\xbf\xbd", 3);
        o += 3;
        i += dsv4_utf8_invalid_len(raw + i, need - i);
    }
    d->buf[o] = 0;
    *len = o;
    return d->buf;
}

const char *dsv4_detok_flush(dsv4_detok *d, size_t *len)
{
    size_t o = 0;
    if (d->npend) {
        size_t sc;
        char *fix = dsv4_utf8_sanitize((const char *)d->pend, (size_t)d->npend, &sc);
        if (fix && sc + 1 <= d->cap) {
            memcpy(d->buf, fix, sc);
            o = sc;
        }
        free(fix);
        d->npend = 0;
    }
    if (d->buf)
        d->buf[o] = 0;
    *len = o;
    return d->buf ? d->buf : "";
}
