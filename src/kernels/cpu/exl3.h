/* kernels/cpu/exl3 — EXL3 decode, multiply and quantizer on the CPU, over a layer bound by
 * io/exl3_format.h (which states the stored form). */
#ifndef DSV4_KERNELS_CPU_EXL3_H
#define DSV4_KERNELS_CPU_EXL3_H

#include <stdint.h>
#include "io/exl3_format.h"
#include "io/weight.h"

/* The codebook: 16-bit trellis state -> its fp16 value (as float), exact. */
float dsv4_exl3_codebook(int cb, uint32_t state);

/* Tile (i, j) decoded to out[r*16 + c] = Ŵ[16i + r][16j + c] (r: input, c: output), exact. */
void dsv4_exl3_tile(const dsv4_exl3 *e, int64_t i, int64_t j, float *out);

/* Full dequant: out [n, k] fp32 row-major (out[c*k + r] = W[r][c]); the rotations are done in
 * double and rounded once. inner: write Ŵ instead (same orientation, no rotation or scales),
 * which is exactly representable. */
void dsv4_exl3_dequant(const dsv4_exl3 *e, int inner, float *out);

/* One logical row c (< n) of the [n, k] weight, k floats, the same values dsv4_exl3_dequant
 * writes (it decodes the whole 128-wide output block: slow, for tools only). */
void dsv4_exl3_row(const dsv4_exl3 *e, int64_t c, float *out);

/* y[T, n] = x[T, k] Wᵀ (+ bias): x scaled by suh and rotated per 128 block, multiplied by Ŵ
 * decoded on the fly (fp32, one fixed fma order per output), rotated back and scaled by svh.
 * Each row's result is bitwise the same whatever T and the thread count (threads split
 * 128-wide output blocks and groups of rows). Uses AVX2 when built with it. */
void dsv4_exl3_linear(const dsv4_weight *w, const float *x, int T, float *y);
/* Output rows [r0, r1) only (r1 <= n), as the backend's linear op: x rows of stride ldx, y rows
 * [r1 - r0] of stride ldy. Each computed row is bitwise the one dsv4_exl3_linear gives. */
void dsv4_exl3_linear_rows(const dsv4_weight *w, int64_t r0, int64_t r1, const float *x, int T, int64_t ldx, float *y,
                           int64_t ldy);
/* The same computation on the plain C path (bitwise equal to the AVX2 path: both use fma). */
void dsv4_exl3_linear_scalar(const dsv4_weight *w, const float *x, int T, float *y);

/* ---- quantizer (exl3_quant.c) */

/* Packs a tile's 256 K-bit codes (trellis order) into its 16K stored words: the codes MSB-first
 * into one bit stream, 32 bits per u32, each u32 stored low half first. */
void dsv4_exl3_pack_codes(const uint32_t *codes, int K, uint16_t *words);

/* A Viterbi workspace for one thread (about 0.8 MB + 2^(24-K) bytes). */
typedef struct dsv4_exl3_enc dsv4_exl3_enc;
dsv4_exl3_enc *dsv4_exl3_enc_new(int K, int cb, dsv4_err *err);
void dsv4_exl3_enc_free(dsv4_exl3_enc *e);
/* Encodes one tile: target[r*16 + c] (codebook units) -> words[16K] as stored, and the values
 * they decode to in decoded[r*16 + c]. The walk is tail-biting and minimises the squared error
 * up to the search's cost perturbation (< 2^-15 relative). Returns the squared error. */
double dsv4_exl3_enc_tile(dsv4_exl3_enc *e, const float *target, uint16_t *words, float *decoded);
/* Standard deviation of the codebook over all 65536 states. */
float dsv4_exl3_codebook_std(int cb);

typedef struct dsv4_exl3_qstats {
    double err2, ref2;          /* sum of squared errors of W, and of W itself */
    double tile_se, tile_ref2;  /* the same in the rotated, normalised (codebook) domain */
    double secs;
    int64_t tiles;
} dsv4_exl3_qstats;

/* Quantizes the weight w (any bound form, logical [n, k]) to K bits with codebook cb:
 * W = diag(suh) H Ŵ H diag(svh) with random signs (from seed) in suh and svh, the per-output
 * RMS folded into svh and one global scale into suh, so Ŵ has the codebook's spread.
 * Outputs (padded kp, np = multiples of 128): trellis [kp/16][np/16][16K] words, suh [kp] and
 * svh [np] as fp16 bits. progress (may be NULL) is called with tiles done after each 128
 * output columns. Threads split the tiles of a column block. */
int dsv4_exl3_quantize(const dsv4_weight *w, int K, int cb, uint64_t seed, uint16_t *trellis, uint16_t *suh,
                       uint16_t *svh, dsv4_exl3_qstats *stats, void (*progress)(void *, int64_t), void *ctx,
                       dsv4_err *err);

#endif
