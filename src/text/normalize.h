/* normalize — the Hugging Face `normalizers` that tokenizer.json files of this family use,
 * on UTF-8 strings: Sequence, NFC/NFD/NFKC/NFKD, Lowercase, StripAccents, Strip, Replace
 * (string or regex pattern), Prepend. Built from the JSON object of a tokenizer.json
 * "normalizer" field (or any JSON text of the same shape). Unicode data comes from utf8proc. */
#ifndef DSV4_TEXT_NORMALIZE_H
#define DSV4_TEXT_NORMALIZE_H

#include <stddef.h>
#include "core/err.h"

typedef struct dsv4_normalizer dsv4_normalizer;

/* json: the normalizer object as JSON text. NULL result with err set on an unknown type. */
dsv4_normalizer *dsv4_normalizer_parse(const char *json, dsv4_err *err);
/* Same, from a cJSON node (a `const cJSON *`, kept opaque here so callers need not include cJSON). */
dsv4_normalizer *dsv4_normalizer_from_cjson(const void *node, dsv4_err *err);
void dsv4_normalizer_free(dsv4_normalizer *n);

/* Normalizes s[0..len) (valid UTF-8) into a malloc'd NUL-terminated string. */
int dsv4_normalize(const dsv4_normalizer *n, const char *s, size_t len, char **out, size_t *out_len, dsv4_err *err);

#endif
