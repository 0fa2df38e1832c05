/* libFuzzer target: tokenizer encode of arbitrary bytes, on a small byte-level BPE tokenizer
 * built at start (the 256-byte alphabet, a few merges, added tokens, the DeepSeek pre-tokenizer
 * split patterns). Every input encodes; decoding the ids gives back the input with invalid UTF-8
 * replaced as the encoder documents, and the streaming detokenizer agrees. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "text/tokenizer.h"
#include "../unit/bytelevel.h"

static dsv4_tokenizer *tok;


static cJSON *split(const char *regex)
{
    cJSON *s = cJSON_CreateObject(), *p = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "type", "Split");
    cJSON_AddStringToObject(p, "Regex", regex);
    cJSON_AddItemToObject(s, "pattern", p);
    cJSON_AddStringToObject(s, "behavior", "Isolated");
    cJSON_AddFalseToObject(s, "invert");
    return s;
}

static char *tokenizer_json(void)
{
    cJSON *root = cJSON_CreateObject(), *model = cJSON_CreateObject(), *vocab = cJSON_CreateObject();
    char s[8];
    int id = 0;
    for (int x = 0; x < 256; x++) {
        bytelevel_spell(x, s);
        cJSON_AddNumberToObject(vocab, s, id++);
    }
    const char *merged[] = {"he", "ll", "hell", "hello", "\xc4\xa0w", "\xc4\xa0t", "\xc4\xa0th", "12", "\xc4\xa0\xc4\xa0"};
    const char *merges[] = {"h e", "l l", "he ll", "hell o", "\xc4\xa0 w", "\xc4\xa0 t", "\xc4\xa0t h", "1 2", "\xc4\xa0 \xc4\xa0"};
    cJSON *ml = cJSON_CreateArray();
    for (int i = 0; i < 9; i++) {
        cJSON_AddNumberToObject(vocab, merged[i], id++);
        cJSON_AddItemToArray(ml, cJSON_CreateString(merges[i]));
    }
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddItemToObject(model, "vocab", vocab);
    cJSON_AddItemToObject(model, "merges", ml);
    cJSON_AddItemToObject(root, "model", model);
    cJSON *added = cJSON_CreateArray();
    const char *at[] = {"<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
                        "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", "<think>", "</think>", "<tool>"};
    for (int i = 0; i < 5; i++) {
        cJSON *t = cJSON_CreateObject();
        cJSON_AddNumberToObject(t, "id", id++);
        cJSON_AddStringToObject(t, "content", at[i]);
        cJSON_AddBoolToObject(t, "special", i < 2);
        cJSON_AddFalseToObject(t, "normalized");
        cJSON_AddItemToArray(added, t);
    }
    cJSON_AddItemToObject(root, "added_tokens", added);
    cJSON *pt = cJSON_CreateObject(), *seq = cJSON_CreateArray(), *bl = cJSON_CreateObject();
    cJSON_AddStringToObject(pt, "type", "Sequence");
    cJSON_AddItemToArray(seq, split("\\p{N}{1,3}"));
    cJSON_AddItemToArray(seq, split("[\xe4\xb8\x80-\xe9\xbe\xa5\xe3\x81\x80-\xe3\x82\x9f\xe3\x82\xa0-\xe3\x83\xbf]+"));
    cJSON_AddItemToArray(seq, split("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
                                    " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"));
    cJSON_AddStringToObject(bl, "type", "ByteLevel");
    cJSON_AddFalseToObject(bl, "add_prefix_space");
    cJSON_AddFalseToObject(bl, "use_regex");
    cJSON_AddItemToArray(seq, bl);
    cJSON_AddItemToObject(pt, "pretokenizers", seq);
    cJSON_AddItemToObject(root, "pre_tokenizer", pt);
    cJSON *dec = cJSON_CreateObject();
    cJSON_AddStringToObject(dec, "type", "ByteLevel");
    cJSON_AddItemToObject(root, "decoder", dec);
    char *txt = cJSON_Print(root);
    cJSON_Delete(root);
    return txt;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    const char *t = getenv("TMPDIR");
    char path[300];
    snprintf(path, sizeof path, "%s/dsv4-fuzz-tokenizer-XXXXXX.json", t && *t ? t : "/tmp");
    int fd = mkstemps(path, 5);
    char *txt = tokenizer_json();
    size_t n = strlen(txt);
    if (fd < 0 || write(fd, txt, n) != (ssize_t)n)
        abort();
    close(fd);
    free(txt);
    dsv4_err err = {0};
    tok = dsv4_tokenizer_load(path, &err);
    unlink(path);
    if (!tok) {
        fprintf(stderr, "fuzz_tokenizer: %s\n", err.msg);
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dsv4_ids ids = {0};
    dsv4_err err = {0};
    if (dsv4_tokenizer_encode(tok, (const char *)data, size, &ids, &err))
        abort(); /* any bytes encode */
    char *out = NULL;
    size_t on = 0, wn = 0;
    if (dsv4_tokenizer_decode(tok, ids.v, ids.n, 0, &out, &on, &err))
        abort();
    char *want = dsv4_utf8_sanitize((const char *)data, size, &wn);
    if (!want || on != wn || memcmp(out, want, on))
        abort();
    /* the streaming detokenizer gives the same text */
    dsv4_detok d;
    dsv4_detok_init(&d, tok, 0);
    size_t got = 0, len;
    for (size_t i = 0; i < ids.n; i++) {
        const char *p = dsv4_detok_push(&d, ids.v[i], &len, &err);
        if (!p && err.code)
            abort();
        if (p && len && (got + len > wn || memcmp(want + got, p, len)))
            abort();
        got += p ? len : 0;
    }
    const char *p = dsv4_detok_flush(&d, &len);
    if (p && len && (got + len > wn || memcmp(want + got, p, len)))
        abort();
    got += p ? len : 0;
    if (got != wn)
        abort();
    dsv4_detok_free(&d);
    free(want);
    free(out);
    dsv4_ids_free(&ids);
    return 0;
}
