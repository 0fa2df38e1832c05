/* Tokenizer mechanics on a small synthetic tokenizer.json: merges by rank, added tokens (raw and
 * normalized, lstrip/rstrip), a normalizer, ignore_merges, the invalid-UTF-8 rule, decoding with
 * and without specials, and the streaming detokenizer on characters split across tokens.
 * (Exactness on the real vocabulary is tests/suite_text.sh, against the peer.) */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "check.h"
#include "text/tokenizer.h"
#include "bytelevel.h"


static const char *path = "build/tests/tok_synthetic.json";

/* merges (by rank): "h e", "l l", "he ll", "hell o", "Ġ w", then e-acute's two bytes */
static void write_tokenizer(int lowercase, int ignore_merges)
{
    cJSON *root = cJSON_CreateObject(), *model = cJSON_CreateObject(), *vocab = cJSON_CreateObject();
    char s[8], a[8], b[8];
    int id = 0;
    for (int x = 0; x < 256; x++) {
        bytelevel_spell(x, s);
        cJSON_AddNumberToObject(vocab, s, id++);
    }
    const char *merged[] = {"he", "ll", "hell", "hello", "\xc4\xa0w", "\xc3\x83\xc2\xa9", "wor", "world"};
    for (int i = 0; i < 8; i++)
        cJSON_AddNumberToObject(vocab, merged[i], id++);
    cJSON *merges = cJSON_CreateArray();
    bytelevel_spell(0xc3, a);
    bytelevel_spell(0xa9, b);
    char accent[32];
    snprintf(accent, sizeof accent, "%s %s", a, b);
    const char *m[] = {"h e", "l l", "he ll", "hell o", "\xc4\xa0 w", accent, "w o", "wo r"};
    for (int i = 0; i < 6; i++)
        cJSON_AddItemToArray(merges, cJSON_CreateString(m[i]));
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddItemToObject(model, "vocab", vocab);
    cJSON_AddItemToObject(model, "merges", merges);
    if (ignore_merges)
        cJSON_AddTrueToObject(model, "ignore_merges");
    cJSON_AddItemToObject(root, "model", model);
    cJSON *added = cJSON_CreateArray();
    const char *at[] = {"<s>", "<S>", "[x]", "<ss>"};
    int special[] = {1, 0, 0, 1}, normalized[] = {0, 1, 0, 0}, lstrip[] = {0, 0, 1, 0};
    for (int i = 0; i < 4; i++) {
        cJSON *t = cJSON_CreateObject();
        cJSON_AddNumberToObject(t, "id", 300 + i);
        cJSON_AddStringToObject(t, "content", at[i]);
        cJSON_AddBoolToObject(t, "special", special[i]);
        cJSON_AddBoolToObject(t, "normalized", normalized[i]);
        cJSON_AddBoolToObject(t, "lstrip", lstrip[i]);
        cJSON_AddItemToArray(added, t);
    }
    cJSON_AddItemToObject(root, "added_tokens", added);
    if (lowercase) {
        cJSON *n = cJSON_CreateObject();
        cJSON_AddStringToObject(n, "type", "Lowercase");
        cJSON_AddItemToObject(root, "normalizer", n);
    }
    cJSON *pt = cJSON_CreateObject(), *pat = cJSON_CreateObject();
    cJSON_AddStringToObject(pt, "type", "Split");
    cJSON_AddStringToObject(pat, "Regex", " ?\\p{L}+|\\s+|[^\\s\\p{L}]+");
    cJSON_AddItemToObject(pt, "pattern", pat);
    cJSON_AddStringToObject(pt, "behavior", "Isolated");
    cJSON_AddItemToObject(root, "pre_tokenizer", pt);
    bytelevel_save(root, path);
}

/* Several threads encode the same texts through one tokenizer (sharing its word cache); each
 * must get what a lone thread gets. */
typedef struct job {
    dsv4_tokenizer *t;
    int seed, bad;
} job;

static void text_for(int i, char *buf)
{
    static const char *const w[] = {"hello", " world", "HeLLo", "\xc3\xa9t\xc3\xa9", " [x]", "<s>", "\n\n", "123", "wor", " hell"};
    buf[0] = 0;
    for (int k = 0; k < 1 + i % 7; k++)
        strcat(buf, w[(i * 7 + k * 3) % 10]);
}

static void *encode_many(void *arg)
{
    job *j = arg;
    dsv4_ids a = {0}, b = {0};
    dsv4_err err = {0};
    char text[128];
    for (int i = 0; i < 3000; i++) {
        int k = (i * 31 + j->seed) % 500;
        text_for(k, text);
        a.n = b.n = 0;
        if (dsv4_tokenizer_encode(j->t, text, strlen(text), &a, &err) || dsv4_tokenizer_encode(j->t, text, strlen(text), &b, &err) ||
            a.n != b.n || memcmp(a.v, b.v, a.n * sizeof *a.v))
            j->bad++;
    }
    dsv4_ids_free(&a);
    dsv4_ids_free(&b);
    return NULL;
}

static int ids_eq(const dsv4_ids *x, const int32_t *want, size_t n)
{
    return x->n == n && !memcmp(x->v, want, n * sizeof *want);
}

static void enc(dsv4_tokenizer *t, const char *s, size_t n, dsv4_ids *out)
{
    dsv4_err err = {0};
    out->n = 0;
    CHECK(dsv4_tokenizer_encode(t, s, n, out, &err) == 0, "encode: %s", err.msg);
}

static void show(const char *what, const dsv4_ids *x)
{
    fprintf(stderr, "%s:", what);
    for (size_t i = 0; i < x->n; i++)
        fprintf(stderr, " %d", (int)x->v[i]);
    fputc('\n', stderr);
}

int main(void)
{
    dsv4_err err = {0};
    write_tokenizer(0, 0);
    dsv4_tokenizer *t = dsv4_tokenizer_load(path, &err);
    CHECK(t != NULL, "load: %s", err.msg);
    if (!t)
        return check_summary("tokenizer");
    CHECK(dsv4_tokenizer_n_vocab(t) == 304, "n_vocab %d", (int)dsv4_tokenizer_n_vocab(t));
    dsv4_ids x = {0};
    /* merges: "hello" -> one token; " w" merges but "wor" needs the unused rank-6 merge: absent */
    enc(t, "hello world", 11, &x);
    int32_t want1[] = {259, 260, 'o', 'r', 'l', 'd'}; /* a byte's own token has the byte's value as id here */
    CHECK(ids_eq(&x, want1, 6), "hello world");
    if (!ids_eq(&x, want1, 6))
        show("got", &x);
    /* added tokens: leftmost-longest ("<ss>" over "<s>"), lstrip swallows the space before "[x]" */
    enc(t, "<ss><s> [x]", 11, &x);
    int32_t want2[] = {303, 300, 302};
    CHECK(ids_eq(&x, want2, 3), "added tokens");
    enc(t, "<s>\t\xe3\x80\x80[x]", 10, &x); /* lstrip takes Unicode white space (U+3000) too */
    int32_t want2b[] = {300, 302};
    CHECK(ids_eq(&x, want2b, 2), "lstrip over a tab and U+3000");
    /* invalid UTF-8 encodes as U+FFFD */
    dsv4_ids y = {0};
    enc(t, "a\xff" "b\xe6\x97", 5, &x);
    enc(t, "a\xef\xbf\xbd" "b\xef\xbf\xbd", 8, &y);
    CHECK(x.n == y.n && !memcmp(x.v, y.v, x.n * sizeof *x.v), "invalid UTF-8 rule");
    /* e-acute is one merged token of two bytes; decode and streaming decode */
    enc(t, "\xc3\xa9", 2, &x);
    CHECK(x.n == 1 && x.v[0] == 261, "accent merge");
    /* stream "日" (e6 97 a5) as three single-byte tokens, then a stray continuation byte */
    int32_t bytes_ids[4];
    unsigned char bs[4] = {0xe6, 0x97, 0xa5, 0x97};
    for (int i = 0; i < 4; i++) {
        char sp[8];
        bytelevel_spell(bs[i], sp);
        bytes_ids[i] = dsv4_tokenizer_token_id(t, sp);
    }
    dsv4_detok d;
    dsv4_detok_init(&d, t, 0);
    size_t n;
    const char *o = dsv4_detok_push(&d, bytes_ids[0], &n, &err);
    CHECK(o && n == 0, "stream: first byte held back");
    o = dsv4_detok_push(&d, bytes_ids[1], &n, &err);
    CHECK(o && n == 0, "stream: second byte held back");
    o = dsv4_detok_push(&d, bytes_ids[2], &n, &err);
    CHECK(o && n == 3 && !memcmp(o, "\xe6\x97\xa5", 3), "stream: character complete");
    o = dsv4_detok_push(&d, bytes_ids[3], &n, &err);
    CHECK(o && n == 3 && !memcmp(o, "\xef\xbf\xbd", 3), "stream: stray byte is U+FFFD");
    o = dsv4_detok_push(&d, bytes_ids[0], &n, &err);
    CHECK(o && n == 0, "stream: held again");
    o = dsv4_detok_flush(&d, &n);
    CHECK(n == 3 && !memcmp(o, "\xef\xbf\xbd", 3), "stream: flush of a cut character");
    CHECK(dsv4_detok_push(&d, 99999, &n, &err) == NULL && err.code == DSV4_E_ARG, "stream: unknown id");
    dsv4_detok_free(&d);
    char *text;
    size_t tl;
    int32_t dec[] = {300, 259, 301, bytes_ids[0]};
    CHECK(dsv4_tokenizer_decode(t, dec, 4, 0, &text, &tl, &err) == 0 && !strcmp(text, "<s>hello<S>\xef\xbf\xbd"), "decode");
    free(text);
    CHECK(dsv4_tokenizer_decode(t, dec, 3, 1, &text, &tl, &err) == 0 && !strcmp(text, "hello<S>"), "decode skipping specials");
    free(text);
    CHECK(dsv4_tokenizer_decode(t, dec, 0, 0, &text, &tl, &err) == 0 && tl == 0, "decode nothing");
    free(text);
    /* random bytes, mostly invalid UTF-8: no failure, and decode(encode(x)) is x with each maximal
     * invalid subpart replaced by U+FFFD */
    {
        uint64_t r = 88172645463325252ull;
        int bad = 0;
        for (int it = 0; it < 20000; it++) {
            unsigned char buf[64];
            size_t n = 1 + it % 63;
            for (size_t k = 0; k < n; k++) {
                r ^= r << 13, r ^= r >> 7, r ^= r << 17;
                buf[k] = (unsigned char)(it & 1 ? r : 0x80 | (r & 0x7f)); /* odd: any byte; even: high bytes */
            }
            size_t cl;
            char *clean = dsv4_utf8_sanitize((const char *)buf, n, &cl);
            enc(t, (const char *)buf, n, &x);
            char *back;
            size_t bl;
            if (!clean || dsv4_tokenizer_decode(t, x.v, x.n, 0, &back, &bl, &err)) {
                bad++;
                free(clean);
                continue;
            }
            int inc;
            if (bl != cl || memcmp(back, clean, cl) || dsv4_utf8_valid_prefix((unsigned char *)back, bl, &inc) != bl)
                bad++;
            free(back);
            free(clean);
        }
        CHECK(bad == 0, "random bytes: %d of 20000 failed the invalid-UTF-8 rule", bad);
    }
    /* shared between threads: the same ids as one thread alone */
    {
        dsv4_ids ref[500];
        char text[128];
        memset(ref, 0, sizeof ref);
        for (int k = 0; k < 500; k++) {
            text_for(k, text);
            dsv4_tokenizer_encode(t, text, strlen(text), &ref[k], &err);
        }
        job jobs[4];
        pthread_t th[4];
        for (int i = 0; i < 4; i++) {
            jobs[i] = (job){t, i * 17, 0};
            pthread_create(&th[i], NULL, encode_many, &jobs[i]);
        }
        int bad = 0;
        for (int i = 0; i < 4; i++) {
            pthread_join(th[i], NULL);
            bad += jobs[i].bad;
        }
        for (int k = 0; k < 500; k++) {
            text_for(k, text);
            x.n = 0;
            enc(t, text, strlen(text), &x);
            bad += x.n != ref[k].n || memcmp(x.v, ref[k].v, x.n * sizeof *x.v);
            dsv4_ids_free(&ref[k]);
        }
        CHECK(bad == 0, "threads: %d encodes differ", bad);
    }
    dsv4_tokenizer_free(t);

    /* a normalizer: "<S>" (normalized) is matched as its normalized form "<s>" in the normalized
     * text; "<s>" (raw) only where the input has it as written */
    write_tokenizer(1, 0);
    t = dsv4_tokenizer_load(path, &err);
    CHECK(t != NULL, "load lowercase: %s", err.msg);
    if (t) {
        enc(t, "HELLO<S>", 8, &x);
        int32_t want3[] = {259, 301};
        CHECK(ids_eq(&x, want3, 2), "lowercase normalizer + normalized added token");
        if (!ids_eq(&x, want3, 2))
            show("got", &x);
        enc(t, "<s><S>", 6, &x);
        int32_t want4[] = {300, 301};
        CHECK(ids_eq(&x, want4, 2), "raw then normalized added token");
        dsv4_tokenizer_free(t);
    }
    /* ignore_merges: a word in the vocabulary is taken whole even without a merge path */
    write_tokenizer(0, 1);
    t = dsv4_tokenizer_load(path, &err);
    CHECK(t != NULL, "load ignore_merges: %s", err.msg);
    if (t) {
        enc(t, "world", 5, &x);
        CHECK(x.n == 1 && x.v[0] == 263, "ignore_merges");
        dsv4_tokenizer_free(t);
    }
    /* a tokenizer.json that is not one */
    FILE *f = fopen(path, "w");
    fputs("{\"model\": {\"type\": \"Unigram\"}}", f);
    fclose(f);
    CHECK(dsv4_tokenizer_load(path, &err) == NULL && err.code == DSV4_E_UNSUPPORTED, "unsupported model");
    CHECK(dsv4_tokenizer_load("build/tests/no-such-dir", &err) == NULL && err.code == DSV4_E_IO, "missing file");
    dsv4_ids_free(&x);
    dsv4_ids_free(&y);
    return check_summary("tokenizer");
}
