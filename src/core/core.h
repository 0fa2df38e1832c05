/* core — numbers and plumbing shared by every layer: errors, number codecs, logging, time. */
#ifndef DSV4_CORE_H
#define DSV4_CORE_H

#include <stdarg.h>
#include <stdint.h>
#include <stddef.h>
#include "core/err.h"

/* ---- errors: set a message and return the code, so callers write `return dsv4_fail(...)` */
int dsv4_fail(dsv4_err *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Prefixes an existing message with context ("loading X: ..."). Returns err->code. */
int dsv4_err_prefix(dsv4_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void dsv4_err_clear(dsv4_err *err);

/* ---- number codecs. Every conversion here is exact where the target can represent the value. */
float dsv4_bf16_to_f32(uint16_t h);
uint16_t dsv4_f32_to_bf16(float f);          /* round to nearest even; NaN stays NaN */
float dsv4_f16_to_f32(uint16_t h);
uint16_t dsv4_f32_to_f16(float f);           /* round to nearest even */
float dsv4_e4m3_to_f32(uint8_t q);           /* OCP fp8 e4m3fn: no inf, 0x7f/0xff are NaN */
uint8_t dsv4_f32_to_e4m3(float f);           /* round to nearest even, saturating to +-448 */
float dsv4_e2m1_to_f32(uint8_t code);        /* low 4 bits: 0,.5,1,1.5,2,3,4,6 and negatives */
uint8_t dsv4_f32_to_e2m1(float f);           /* nearest, ties to even code, saturating to +-6 */
float dsv4_e8m0_to_f32(uint8_t e);           /* 2^(e-127); 0xff is NaN */
extern const float dsv4_e4m3_lut[256];
extern const float dsv4_e2m1_lut[16];
/* Round trips of activations (V4.1 REF numerics). */
void dsv4_round_bf16(float *x, int64_t n);                /* each value through bf16 */
float dsv4_pow2_ceil(float t);                            /* 2^ceil(log2 t), t positive finite */
void dsv4_fp8_roundtrip(float *x, int64_t n, int block);  /* e4m3, ue8m0 scale per block */
void dsv4_fp4_roundtrip(float *x, int64_t n, int block, int e4m3_scale); /* e2m1; e4m3 or ue8m0 scale */
/* The dot product every CPU op and the model's host arithmetic use: one fixed reduction order
 * per length (core/dot.c). */
float dsv4_dot(const float *a, const float *b, int64_t n);

/* ---- logging and progress */
void dsv4_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A progress line on stderr when it is a terminal: "label  done/total  (pct)". */
typedef struct dsv4_progress {
    const char *label;
    uint64_t total, done;
    double t0, last;
    int enabled;
} dsv4_progress;
void dsv4_progress_begin(dsv4_progress *p, const char *label, uint64_t total, int enabled);
void dsv4_progress_step(dsv4_progress *p, uint64_t add);
void dsv4_progress_end(dsv4_progress *p);

/* A whole file, NUL-terminated (the NUL not counted in *len; len may be NULL). */
char *dsv4_read_file(const char *path, size_t *len, dsv4_err *err);

double dsv4_now(void);                       /* seconds, monotonic */
void *dsv4_xmalloc(size_t n, dsv4_err *err); /* malloc that reports failure in err */
void *dsv4_xcalloc(size_t n, size_t sz, dsv4_err *err);

#endif
