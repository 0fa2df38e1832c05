/* model/engram — Engram's n-gram hashing (spec §9): the table layout (primes, offsets), the
 * hash multipliers drawn exactly as numpy's default_rng(10007 * layer).integers(0, bound, 4),
 * the per-position hash, and the rows of a table, resident or streamed. */
#ifndef DSV4_ENGRAM_H
#define DSV4_ENGRAM_H

#include <stdint.h>
#include "dsv4.h"
#include "io/safetensors.h"
#include "io/weight.h"

/* numpy's PCG64 (XSL-RR 128/64) seeded through SeedSequence(seed), as default_rng(seed). */
typedef struct dsv4_pcg64 {
    __extension__ unsigned __int128 state, inc;
} dsv4_pcg64;
void dsv4_pcg64_seed(dsv4_pcg64 *g, uint64_t seed);
uint64_t dsv4_pcg64_next(dsv4_pcg64 *g);
/* Generator.integers(0, high, size=n, dtype=int64) for high > 2^32 (Lemire's bounded draw
 * on 64-bit words, as numpy does for that range). Returns 0, or -1 if high is out of range. */
int dsv4_rng_integers(dsv4_pcg64 *g, int64_t high, int n, int64_t *out);

/* Table sizes: for each Engram layer l, n-gram size n = 2..max_ngram and head h, the next
 * prime after engram_vocab_size - 1 (restarting per n-gram size) not used anywhere before.
 * primes: [n_engram][(max_ngram - 1) * heads]. */
void dsv4_engram_primes(int n_engram, int max_ngram, int heads, int64_t vocab_start, int64_t *primes);
/* m[i] = 2 * integers(0, (INT64_MAX / compressed_vocab) / 2)[i] + 1, i < max_ngram. */
int dsv4_engram_multipliers(int layer_id, int64_t compressed_vocab, int max_ngram, int64_t *mult);
/* Row ids of one position. tok[s] = compressed id at position p - s (s < max_ngram), already
 * padded; for n = 2..max_ngram, head h: ((xor over s < n of tok[s] * m[s]) mod prime) + offset. */
void dsv4_engram_hash(const int64_t *tok, const int64_t *mult, const int64_t *prime, const int64_t *offset,
                      int max_ngram, int heads, int64_t *ids);

/* One table's rows: through the mapping (resident) or read by address (streamed: pread, and
 * O_DIRECT aligned-block reads where the file system allows, bypassing the page cache). */
typedef struct dsv4_etable {
    dsv4_weight w;           /* [rows, head_dim] e4m3 + [rows, head_dim / 32] e8m0 */
    int streamed;
    int fd_w, fd_s, direct_w, direct_s;
    int64_t off_w, off_s;    /* file offsets of the rows and of their scales */
} dsv4_etable;
/* Binds prefix.weight/.scale of [rows, head_dim]; streamed: opens the files (direct: try
 * O_DIRECT too). */
int dsv4_etable_open(dsv4_etable *t, const dsv4_st *st, const char *prefix, int64_t rows, int head_dim, int streamed,
                     int direct, dsv4_err *err);
/* Rows [n] decoded to fp32 into out [n, head_dim], bit-identical either way; the bytes read
 * from the file (streamed) or touched in the mapping (resident) are added to *bytes. */
int dsv4_etable_rows(const dsv4_etable *t, const int64_t *rows, int n, float *out, uint64_t *bytes, dsv4_err *err);
void dsv4_etable_close(dsv4_etable *t);

/* Table identity. The release records no checksum for its tables; when the safetensors
 * metadata of the file holding `<prefix>.weight` has the key "<prefix>.weight.fnv1a64" (16
 * hex digits: FNV-1a 64 over the weight bytes, then the scale bytes), dsv4_etable_open
 * verifies it and refuses a table that does not match (one pass over the table). */
uint64_t dsv4_fnv1a64(uint64_t h, const void *p, size_t n);
#define DSV4_FNV1A64_INIT 0xcbf29ce484222325ull
/* Writes a synthetic table file (safetensors: prefix.weight e4m3 [rows, head_dim], prefix.scale
 * e8m0 [rows, head_dim / 32], random finite values). checksum: 0 records none, 1 the right
 * one, 2 a wrong one. For tests and the streaming benchmark. */
int dsv4_etable_synth(const char *path, const char *prefix, int64_t rows, int head_dim, uint64_t seed, int checksum,
                      dsv4_err *err);
/* The data of the table dsv4_etable_synth writes for seed, in memory: rows into w [rows,
 * head_dim], scales into sc [rows, head_dim / 32] (a synthetic model's resident tables). */
void dsv4_etable_synth_data(uint8_t *w, uint8_t *sc, int64_t rows, int head_dim, uint64_t seed);

#endif
