/* token_map — the Engram compressed token map of DeepSeek-V4.1 (spec §9.1): token ids that
 * decode to the same text after NFKC → NFD → strip accents → lowercase → whitespace runs to one
 * space → strip (a token that is only whitespace stays " ") share a class. Classes are numbered
 * in first-seen id order. A token whose lone decode is not whole UTF-8 (it holds U+FFFD) is
 * keyed by its raw vocabulary spelling. */
#ifndef DSV4_TEXT_TOKEN_MAP_H
#define DSV4_TEXT_TOKEN_MAP_H

#include <stdint.h>
#include "core/err.h"
#include "text/tokenizer.h"

/* *map: malloc'd [n_vocab] class per id (n_vocab = dsv4_tokenizer_n_vocab(t)); *n_classes:
 * the number of classes (the V4.1 tokenizer must give 99,092). */
int dsv4_token_map_build(const dsv4_tokenizer *t, int32_t **map, int32_t *n_classes, dsv4_err *err);

/* The map of a checkpoint's tokenizer: tokenizer.json in dir, else in dir/tokenizer (the
 * layouts checkpoints ship); as dsv4_token_map_build, and *n_vocab the tokenizer's vocabulary.
 * What the model reads at load when the checkpoint has no token_map.json. */
int dsv4_token_map_of_dir(const char *dir, int32_t **map, int32_t *n_classes, int32_t *n_vocab, dsv4_err *err);

/* The normalizer chain as Hugging Face normalizer JSON (for dsv4_normalizer_parse). */
extern const char dsv4_token_map_chain[];
/* The key of one id as above (malloc'd, NUL-terminated): normalizer is a dsv4_normalizer of
 * dsv4_token_map_chain. Exposed for tests. */
int dsv4_token_map_key(const dsv4_tokenizer *t, const void *normalizer, int32_t id, char **key, size_t *len, dsv4_err *err);

#endif
