/* tokmask — which tokens a grammar state allows: a byte trie of the vocabulary, walked with
 * the matcher, and the per-request constraint that the sampler masks with.
 *
 * The trie holds every token's bytes (dsv4_tokenizer_id_bytes) except special tokens and empty
 * ones, in preorder with subtree skips. A walk feeds each trie edge's byte to a copy of the
 * matcher state one level up; a refused byte skips the whole subtree, so a state that allows
 * little costs little. Free text is the costly case (nearly every token fits), so it has a
 * shortcut: inside a JSON string without a maximum length every token of whole UTF-8 characters
 * without '"', '\\' or control bytes is allowed outright and only the other tokens are walked,
 * over a second trie of those alone; raw text likewise with tokens free of '<' and NUL (a third
 * trie). A token is allowed when every byte of it is taken; an end-of-sequence
 * id is allowed exactly when the state accepts (the reply is whole), and is then the only way
 * out when nothing may follow.
 *
 * Cache: a constraint keeps the masks of recent states keyed by the state's bytes (compared
 * whole, not only by hash), so a state seen again (deep inside a free string, the same spot of
 * an array's next item) costs a lookup. The mask is the same with or without it. */
#ifndef DSV4_TEXT_TOKMASK_H
#define DSV4_TEXT_TOKMASK_H

#include <stdint.h>
#include "core/err.h"
#include "text/grammar.h"
#include "text/tokenizer.h"

typedef struct dsv4_vocab_trie dsv4_vocab_trie;

/* n_ids: the model's vocabulary (ids at or past the tokenizer's are never allowed). */
dsv4_vocab_trie *dsv4_vocab_trie_new(const dsv4_tokenizer *t, int32_t n_ids, dsv4_err *err);
void dsv4_vocab_trie_free(dsv4_vocab_trie *v);
int32_t dsv4_vocab_trie_n_ids(const dsv4_vocab_trie *v);
int dsv4_vocab_trie_n_nodes(const dsv4_vocab_trie *v);

/* Words of a mask over n_ids ids: bit (id & 63) of word id >> 6 set = allowed. */
static inline size_t dsv4_mask_words(int32_t n_ids) { return ((size_t)n_ids + 63) / 64; }

/* The mask of state s: returns the number of allowed ids. scratch: dsv4_vocab_trie_scratch
 * bytes (one walk's states), or NULL to allocate one for the call. */
int dsv4_vocab_trie_mask(const dsv4_vocab_trie *v, const dsv4_grammar *g, const dsv4_gstate *s, const int32_t *eos,
                         int n_eos, uint64_t *mask, void *scratch, dsv4_err *err);
size_t dsv4_vocab_trie_scratch(const dsv4_vocab_trie *v);

typedef struct dsv4_constraint dsv4_constraint;

/* Takes ownership of g; v must outlive the constraint. eos: the ids that end the reply (allowed
 * exactly when the grammar accepts). cache_entries: masks kept (0: none). */
dsv4_constraint *dsv4_constraint_new(dsv4_grammar *g, const dsv4_vocab_trie *v, const int32_t *eos, int n_eos,
                                     int cache_entries, dsv4_err *err);
void dsv4_constraint_free(dsv4_constraint *c);
/* The allowed ids now, into mask[dsv4_mask_words(n_ids)]; returns their number (0 is an error
 * only if the caller samples anyway). */
int dsv4_constraint_mask(dsv4_constraint *c, uint64_t *mask, dsv4_err *err);
/* The same into the constraint's own buffer (valid until the next call); NULL on failure. */
const uint64_t *dsv4_constraint_next_mask(dsv4_constraint *c, dsv4_err *err);
/* Advances by token id; DSV4_E_ARG when the state does not allow it. */
int dsv4_constraint_accept(dsv4_constraint *c, int32_t id, dsv4_err *err);
/* 1 when the reply so far is whole (an end-of-sequence id would be allowed). */
int dsv4_constraint_complete(const dsv4_constraint *c);
/* 1 once an end-of-sequence id was accepted. */
int dsv4_constraint_ended(const dsv4_constraint *c);
const dsv4_grammar *dsv4_constraint_grammar(const dsv4_constraint *c);

typedef struct dsv4_constraint_stats {
    uint64_t masks, hits;   /* masks computed, of which served from the cache */
    double walk_seconds;    /* time in trie walks (the misses) */
} dsv4_constraint_stats;
void dsv4_constraint_get_stats(const dsv4_constraint *c, dsv4_constraint_stats *st);

#endif
