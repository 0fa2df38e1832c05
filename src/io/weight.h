/* io/weight — a linear layer's weight as stored, with what the kernels need to decode it.
 * Logical shape [n, k] = [out_features, in_features]: y = W x. Nothing is dequantized here. */
#ifndef DSV4_WEIGHT_H
#define DSV4_WEIGHT_H

#include <stdint.h>
#include "io/safetensors.h"

typedef enum {
    DSV4_WF_F32,
    DSV4_WF_BF16,
    DSV4_WF_F16,
    DSV4_WF_FP8,   /* e4m3 [n, k] + power-of-two scale per (bn x bk) block */
    DSV4_WF_FP4,   /* e2m1 pairs [n, k/2] (low nibble = even k) + scale per (1 x bk) group */
    DSV4_WF_EXL3,  /* trellis-coded (see io/exl3_format.h) */
    DSV4_WF_COUNT
} dsv4_wform;

const char *dsv4_wform_name(dsv4_wform f);

typedef struct dsv4_exl3 dsv4_exl3;

typedef struct dsv4_weight {
    const char *name;       /* the weight tensor's name in the checkpoint (or the EXL3 layer prefix) */
    dsv4_wform form;
    int64_t n, k;
    const void *data;
    const void *scale;      /* FP8: [ceil(n/bn), ceil(k/bk)]; FP4: [n, k/bk] */
    int scale_e8m0;         /* scales stored as e8m0 bytes, else f32 */
    int bn, bk;
    const dsv4_exl3 *exl3;
    size_t bytes;           /* stored bytes, scales included */
    void *owned;            /* scales made at load (dsv4_weight_scales_e8m0), freed by dsv4_weight_release */
} dsv4_weight;

/* Binds `prefix`.weight (+ .scale) of logical shape [n, k], or, when `prefix`.trellis exists, the
 * EXL3 layer `prefix` (n or k of 0: the padded size; the binding then owns a malloc'd
 * dsv4_exl3 that dsv4_weight_release frees). fp8_block: the checkpoint's
 * weight_block_size [bn, bk] (used when the scale shape does not say otherwise). Fails
 * naming the tensor when it is missing, mis-shaped or stored in a form no kernel reads. */
int dsv4_weight_bind(const dsv4_st *st, const char *prefix, int64_t n, int64_t k, const int fp8_block[2],
                     dsv4_weight *out, dsv4_err *err);

/* Frees what a binding owns (the EXL3 record, scales made at load). */
void dsv4_weight_release(dsv4_weight *w);

/* An FP8 or FP4 weight's fp32 scales, when every one is a power of two 2^-126 .. 2^127, replaced by
 * an e8m0 copy the weight owns: the same values in a quarter of the bytes, so every kernel reads
 * one scale form (the CUDA tensor-core path decodes with e8m0 scales). Returns whether it did;
 * other scales (not powers of two, zero, subnormal, inf, NaN), other forms or no memory leave the
 * weight as bound. */
int dsv4_weight_scales_e8m0(dsv4_weight *w);

/* Reads a small tensor (norm weights, biases, hc params: F32/BF16/F16) into a new fp32
 * array, checking its element count. */
float *dsv4_tensor_f32(const dsv4_st *st, const char *name, int64_t numel, dsv4_err *err);

#endif
