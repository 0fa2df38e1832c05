#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "text/normalize.h"
#include "text/token_map.h"

/* The reference's chain as a Hugging Face normalizer; U+E000 protects a lone space from Strip. */
const char dsv4_token_map_chain[] =
    "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFKC\"},{\"type\":\"NFD\"},{\"type\":\"StripAccents\"},"
    "{\"type\":\"Lowercase\"},{\"type\":\"Replace\",\"pattern\":{\"Regex\":\"[ \\\\t\\\\r\\\\n]+\"},\"content\":\" \"},"
    "{\"type\":\"Replace\",\"pattern\":{\"Regex\":\"^ $\"},\"content\":\"\\ue000\"},"
    "{\"type\":\"Strip\",\"strip_left\":true,\"strip_right\":true},"
    "{\"type\":\"Replace\",\"pattern\":{\"String\":\"\\ue000\"},\"content\":\" \"}]}";

int dsv4_token_map_key(const dsv4_tokenizer *t, const void *normalizer, int32_t id, char **key, size_t *len, dsv4_err *err)
{
    char *text;
    size_t n;
    const char *spell = dsv4_tokenizer_id_token(t, id);
    if (!spell) {
        /* an id with no token decodes to nothing */
        *key = calloc(1, 1);
        *len = 0;
        return *key ? 0 : dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    }
    int rc = dsv4_tokenizer_decode(t, &id, 1, 0, &text, &n, err);
    if (rc)
        return rc;
    if (memmem(text, n, "\xef\xbf\xbd", 3)) {
        free(text);
        size_t k = strlen(spell);
        *key = malloc(k + 1);
        if (!*key)
            return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
        memcpy(*key, spell, k + 1);
        *len = k;
        return 0;
    }
    char *norm;
    size_t nn;
    rc = dsv4_normalize(normalizer, text, n, &norm, &nn, err);
    if (rc) {
        free(text);
        return rc;
    }
    if (nn == 0) {
        free(norm);
        *key = text;
        *len = n;
    } else {
        free(text);
        *key = norm;
        *len = nn;
    }
    return 0;
}

static uint64_t fnv(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

int dsv4_token_map_build(const dsv4_tokenizer *t, int32_t **map_out, int32_t *n_classes, dsv4_err *err)
{
    int32_t nv = dsv4_tokenizer_n_vocab(t);
    dsv4_normalizer *nz = dsv4_normalizer_parse(dsv4_token_map_chain, err);
    if (!nz)
        return err ? err->code : DSV4_E_FORMAT;
    size_t cap = 16;
    while (cap < (size_t)nv * 2)
        cap <<= 1;
    /* open addressing over the first id of each class: keys are recomputed from that id */
    int32_t *slot = malloc(cap * sizeof *slot), *map = malloc(((size_t)nv + 1) * sizeof *map);
    char **keys = calloc((size_t)nv + 1, sizeof *keys);
    size_t *klen = calloc((size_t)nv + 1, sizeof *klen);
    int rc = 0;
    if (!slot || !map || !keys || !klen) {
        rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < cap; i++)
        slot[i] = -1;
    int32_t nc = 0;
    for (int32_t id = 0; id < nv && !rc; id++) {
        char *k;
        size_t kl;
        rc = dsv4_token_map_key(t, nz, id, &k, &kl, err);
        if (rc)
            break;
        size_t i = fnv(k, kl) & (cap - 1);
        for (;; i = (i + 1) & (cap - 1)) {
            if (slot[i] < 0) {
                slot[i] = nc;
                keys[nc] = k;
                klen[nc] = kl;
                map[id] = nc++;
                break;
            }
            if (klen[slot[i]] == kl && !memcmp(keys[slot[i]], k, kl)) {
                map[id] = slot[i];
                free(k);
                break;
            }
        }
    }
    if (!rc) {
        *map_out = map;
        map = NULL;
        *n_classes = nc;
    }
done:
    if (keys)
        for (int32_t i = 0; i < nv; i++)
            free(keys[i]);
    free(keys);
    free(klen);
    free(slot);
    free(map);
    dsv4_normalizer_free(nz);
    return rc;
}

int dsv4_token_map_of_dir(const char *dir, int32_t **map, int32_t *n_classes, int32_t *n_vocab, dsv4_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer", dir);
    dsv4_err e2 = {0};
    dsv4_tokenizer *t = dsv4_tokenizer_load(dir, &e2);
    if (!t && !(t = dsv4_tokenizer_load(path, &e2)))
        return dsv4_fail(err, DSV4_E_IO, "%s: the Engram token map needs token_map.json or a tokenizer.json (here or in tokenizer/): %s",
                         dir, e2.msg);
    *n_vocab = dsv4_tokenizer_n_vocab(t);
    int rc = dsv4_token_map_build(t, map, n_classes, err);
    dsv4_tokenizer_free(t);
    return rc;
}
