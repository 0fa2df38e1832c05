/* dsv4 tokenize / detokenize: the tokenizer as a line filter, for tests and scripts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "cli/cli.h"
#include "core/core.h"
#include "text/tokenizer.h"

/* Options of both commands; which flags a command accepts is given by the non-NULL pointers. */
static const char *tok_path(int argc, char **argv, int *skip_special, int *stream, int *timing, int *bad)
{
    const char *dir = NULL;
    *bad = 0;
    for (int i = 1; i < argc; i++) {
        if ((!strcmp(argv[i], "-t") || !strcmp(argv[i], "--tokenizer")) && i + 1 < argc)
            dir = argv[++i];
        else if (skip_special && !strcmp(argv[i], "--skip-special"))
            *skip_special = 1;
        else if (stream && !strcmp(argv[i], "--stream"))
            *stream = 1;
        else if (timing && !strcmp(argv[i], "--time"))
            *timing = 1;
        else
            *bad = 1;
    }
    return dir;
}

/* One JSON id array and a newline; printf per id would cost more than encoding. */
static void write_ids(const int32_t *v, size_t n)
{
    char buf[4096];
    size_t k = 0;
    buf[k++] = '[';
    for (size_t i = 0; i < n; i++) {
        if (k > sizeof buf - 16) {
            fwrite(buf, 1, k, stdout);
            k = 0;
        }
        if (i)
            buf[k++] = ',';
        char d[12];
        int m = 0;
        uint32_t x = (uint32_t)v[i];
        do
            d[m++] = (char)('0' + x % 10);
        while (x /= 10);
        while (m)
            buf[k++] = d[--m];
    }
    buf[k++] = ']';
    buf[k++] = '\n';
    fwrite(buf, 1, k, stdout);
}

typedef struct encode_ctx {
    dsv4_tokenizer *t;
    dsv4_ids ids;
    double secs;     /* time spent in encoding alone (--time) */
    size_t bytes;
} encode_ctx;

/* One line: its ids as a JSON array. */
static int encode_line(void *ctx, const char *s, size_t len, long lineno)
{
    encode_ctx *c = ctx;
    dsv4_err err = {0};
    c->ids.n = 0;
    double t0 = dsv4_now();
    int erc = dsv4_tokenizer_encode(c->t, s, len, &c->ids, &err);
    c->secs += dsv4_now() - t0;
    c->bytes += len;
    if (erc) {
        fprintf(stderr, "dsv4 tokenize: line %ld: %s\n", lineno, err.msg);
        return 1;
    }
    write_ids(c->ids.v, c->ids.n);
    return 0;
}

int dsv4_cmd_tokenize(int argc, char **argv)
{
    if (argc > 1 && cli_is_help(argv[1])) {
        printf("usage: dsv4 tokenize -t DIR [--time]\n"
               "  Reads one JSON string per line on stdin and writes the ids of each (no BOS) as one JSON\n"
               "  array per line. DIR holds tokenizer.json (or is the file itself).\n"
               "  Invalid UTF-8 and lone surrogates become U+FFFD before tokenizing.\n"
               "  --time: print to stderr the bytes encoded and the seconds spent in encoding alone.\n");
        return 0;
    }
    int bad, timing = 0;
    const char *dir = tok_path(argc, argv, NULL, NULL, &timing, &bad);
    if (!dir || bad) {
        fprintf(stderr, "usage: dsv4 tokenize -t DIR  (see dsv4 tokenize -h)\n");
        return 2;
    }
    dsv4_err err = {0};
    dsv4_tokenizer *t = dsv4_tokenizer_load(dir, &err);
    if (!t) {
        fprintf(stderr, "dsv4 tokenize: %s\n", err.msg);
        return 1;
    }
    encode_ctx c = {.t = t};
    int rc = cli_json_lines("tokenize", encode_line, &c);
    if (timing)
        fprintf(stderr, "encode: %zu bytes in %.6f s\n", c.bytes, c.secs);
    dsv4_ids_free(&c.ids);
    dsv4_tokenizer_free(t);
    return rc;
}

/* Decodes through the streaming detokenizer, joining its pieces. */
static int decode_stream(const dsv4_tokenizer *t, const int32_t *ids, size_t n, int skip, char **out, size_t *out_len,
                         dsv4_err *err)
{
    dsv4_detok d;
    dsv4_detok_init(&d, t, skip);
    size_t cap = 256, len = 0;
    char *s = malloc(cap);
    for (size_t i = 0; s && i <= n; i++) {
        size_t k;
        const char *piece = i < n ? dsv4_detok_push(&d, ids[i], &k, err) : dsv4_detok_flush(&d, &k);
        if (!piece) {
            free(s);
            dsv4_detok_free(&d);
            return err->code;
        }
        if (len + k + 1 > cap) {
            cap = (len + k + 1) * 2;
            char *q = realloc(s, cap);
            if (!q) {
                free(s);
                s = NULL;
                break;
            }
            s = q;
        }
        memcpy(s + len, piece, k);
        len += k;
    }
    dsv4_detok_free(&d);
    if (!s)
        return dsv4_fail(err, DSV4_E_NOMEM, "decode: out of memory");
    s[len] = 0;
    *out = s;
    *out_len = len;
    return 0;
}

typedef struct decode_ctx {
    dsv4_tokenizer *t;
    int skip, stream;  /* drop special tokens; go through the streaming detokenizer */
    dsv4_ids ids;
} decode_ctx;

/* One JSON array of ids: the text as a JSON string. */
static int decode_line(void *ctx, const char *line, size_t n, long lineno)
{
    decode_ctx *c = ctx;
    cJSON *j = cJSON_ParseWithLength(line, n);
    if (!cJSON_IsArray(j)) {
        cJSON_Delete(j);
        fprintf(stderr, "dsv4 detokenize: line %ld is not a JSON array\n", lineno);
        return 1;
    }
    int bad = 0;
    c->ids.n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, j)
    {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > 2147483647.0) {
            bad = 1;
            break;
        }
        if (c->ids.n == c->ids.cap) {
            int32_t *v = realloc(c->ids.v, (c->ids.cap = c->ids.cap ? c->ids.cap * 2 : 256) * sizeof *v);
            if (!v) {
                bad = 1;
                break;
            }
            c->ids.v = v;
        }
        c->ids.v[c->ids.n++] = (int32_t)e->valuedouble;
    }
    cJSON_Delete(j);
    if (bad) {
        fprintf(stderr, "dsv4 detokenize: line %ld: ids must be non-negative integers\n", lineno);
        return 1;
    }
    dsv4_err err = {0};
    char *s;
    size_t len;
    if (c->stream ? decode_stream(c->t, c->ids.v, c->ids.n, c->skip, &s, &len, &err)
                  : dsv4_tokenizer_decode(c->t, c->ids.v, c->ids.n, c->skip, &s, &len, &err)) {
        fprintf(stderr, "dsv4 detokenize: line %ld: %s\n", lineno, err.msg);
        return 1;
    }
    cli_json_string_write(stdout, s, len);
    putchar('\n');
    free(s);
    return 0;
}

int dsv4_cmd_detokenize(int argc, char **argv)
{
    if (argc > 1 && cli_is_help(argv[1])) {
        printf("usage: dsv4 detokenize -t DIR [--skip-special] [--stream]\n"
               "  Reads one JSON array of ids per line on stdin and writes the decoded text of each as one\n"
               "  JSON string per line. --skip-special drops special tokens. Bytes that do not form UTF-8\n"
               "  come out as U+FFFD. An id outside the vocabulary is an error. --stream decodes id by id\n"
               "  with the streaming detokenizer (the output must be the same).\n");
        return 0;
    }
    int bad, skip = 0, stream = 0;
    const char *dir = tok_path(argc, argv, &skip, &stream, NULL, &bad);
    if (!dir || bad) {
        fprintf(stderr, "usage: dsv4 detokenize -t DIR [--skip-special]  (see dsv4 detokenize -h)\n");
        return 2;
    }
    dsv4_err err = {0};
    dsv4_tokenizer *t = dsv4_tokenizer_load(dir, &err);
    if (!t) {
        fprintf(stderr, "dsv4 detokenize: %s\n", err.msg);
        return 1;
    }
    decode_ctx c = {.t = t, .skip = skip, .stream = stream};
    int rc = cli_lines(decode_line, &c);
    dsv4_ids_free(&c.ids);
    dsv4_tokenizer_free(t);
    return rc;
}
