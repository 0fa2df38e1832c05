/* tokenizer — the DeepSeek byte-level BPE tokenizer, loaded from a Hugging Face tokenizer.json.
 *
 * Ids are int32. Text is UTF-8 bytes with an explicit length (it may contain NUL).
 * Invalid UTF-8 in encode input follows one rule: every maximal invalid subsequence (Unicode's
 * "maximal subpart" practice, as Rust's String::from_utf8_lossy) becomes U+FFFD before
 * tokenizing, so the ids are those of the lossily decoded string. Decoding never fails on
 * bytes: token bytes that do not form UTF-8 come out as U+FFFD under the same rule.
 *
 * A loaded tokenizer is safe to use from several threads (the word cache has a lock). */
#ifndef DSV4_TEXT_TOKENIZER_H
#define DSV4_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include "core/err.h"

typedef struct dsv4_tokenizer dsv4_tokenizer;

/* A growable id list; zero-initialise, append with the encode calls, free with dsv4_ids_free. */
typedef struct dsv4_ids {
    int32_t *v;
    size_t n, cap;
} dsv4_ids;
void dsv4_ids_free(dsv4_ids *ids);

/* path: a tokenizer.json file, or a folder holding one. */
dsv4_tokenizer *dsv4_tokenizer_load(const char *path, dsv4_err *err);
void dsv4_tokenizer_free(dsv4_tokenizer *t);

/* Number of ids (model vocabulary plus added tokens): the largest id + 1. */
int32_t dsv4_tokenizer_n_vocab(const dsv4_tokenizer *t);

/* Appends the ids of text[0..len) to out. No BOS is added. Added and special tokens written
 * literally in the text are recognised (leftmost-longest), as Hugging Face does. */
int dsv4_tokenizer_encode(dsv4_tokenizer *t, const char *text, size_t len, dsv4_ids *out, dsv4_err *err);

/* Decodes ids to a malloc'd NUL-terminated UTF-8 string (*out, *out_len without the NUL).
 * skip_special: drop ids of added tokens marked special. Unknown ids are an error. */
int dsv4_tokenizer_decode(const dsv4_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                          char **out, size_t *out_len, dsv4_err *err);

/* The raw bytes one id decodes to (not necessarily UTF-8: byte-level pieces split characters);
 * NULL for an id out of range. */
const char *dsv4_tokenizer_id_bytes(const dsv4_tokenizer *t, int32_t id, size_t *len);
/* The token's string as the vocabulary spells it (byte-level alphabet for model tokens, the
 * literal content for added tokens); NULL for an id out of range. */
const char *dsv4_tokenizer_id_token(const dsv4_tokenizer *t, int32_t id);
/* Id of a token spelled as in the vocabulary (e.g. "<｜end▁of▁sentence｜>"), or -1. */
int32_t dsv4_tokenizer_token_id(const dsv4_tokenizer *t, const char *token);
/* 1 when id is an added token flagged special. */
int dsv4_tokenizer_is_special(const dsv4_tokenizer *t, int32_t id);

/* Replaces invalid UTF-8 in s[0..len) by U+FFFD (maximal-subpart rule). Returns a malloc'd
 * NUL-terminated copy, or NULL when out of memory; *out_len gets its length. */
char *dsv4_utf8_sanitize(const char *s, size_t len, size_t *out_len);
/* Length of the valid UTF-8 sequence starting at s (1..4), or 0 when s[0..len) does not start
 * with one; *cp gets the code point. */
int dsv4_utf8_decode1(const unsigned char *s, size_t len, uint32_t *cp);

/* Length of the longest prefix of s[0..len) that is valid UTF-8; *incomplete is set when the rest
 * is one sequence cut short by the end of the buffer (more bytes may still complete it). */
size_t dsv4_utf8_valid_prefix(const unsigned char *s, size_t len, int *incomplete);

/* For s[0..len) not starting with a valid sequence: the length (1..3) of its maximal subpart, the
 * prefix that could still have begun one. Unicode's practice replaces it by one U+FFFD. */
size_t dsv4_utf8_invalid_len(const unsigned char *s, size_t len);

/* Streaming detokenizer: feed ids one at a time as they are generated; each call returns the
 * text that is now complete. A UTF-8 character split across tokens is held back until its
 * last byte arrives; bytes that can no longer become a character come out as U+FFFD, so the
 * concatenated output equals dsv4_tokenizer_decode of all the ids. */
typedef struct dsv4_detok {
    const dsv4_tokenizer *t;
    int skip_special;
    unsigned char pend[4];
    int npend;
    char *buf;
    size_t cap;
} dsv4_detok;
void dsv4_detok_init(dsv4_detok *d, const dsv4_tokenizer *t, int skip_special);
/* Returns the newly completed text (valid until the next call; *len its length) or NULL on an
 * unknown id. */
const char *dsv4_detok_push(dsv4_detok *d, int32_t id, size_t *len, dsv4_err *err);
/* Ends the stream: whatever is held back comes out (as U+FFFD). */
const char *dsv4_detok_flush(dsv4_detok *d, size_t *len);
void dsv4_detok_free(dsv4_detok *d);

#endif
