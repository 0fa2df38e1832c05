/* io/exl3_format — EXL3 trellis-coded linear layers as stored, and their binding (the format:
 * ExLlamaV3's, as docs/exl3.md reads it; decode, multiply and the quantizer: kernels/cpu/exl3.h).
 *
 * Stored form of one layer (prefix = the module key), padded dims kp, np (multiples of 128):
 *   prefix.trellis  I16 [kp/16, np/16, 16*K]  tile (i, j) = inputs 16i.., outputs 16j.., K bits/weight
 *   prefix.suh      F16 [kp]   (or legacy prefix.su  I16 [kp/16], sign bits, 1 = -1)
 *   prefix.svh      F16 [np]   (or legacy prefix.sv  I16 [np/16])
 *   prefix.mcg / prefix.mul1   I32 scalar: codebook flag (neither: 3INST)
 *   prefix.bias     optional [np] (or [n])
 * The layer is y = x W with W [kp, np] = diag(suh) H Ŵ H diag(svh), H the block-diagonal
 * orthonormal 128x128 Sylvester Hadamard and Ŵ the decoded tiles. In dsv4 terms the weight is
 * Wᵀ of logical shape [n, k] = [out_features, in_features], n <= np, k <= kp. */
#ifndef DSV4_IO_EXL3_FORMAT_H
#define DSV4_IO_EXL3_FORMAT_H

#include <stdint.h>
#include "io/safetensors.h"
#include "io/weight.h"

enum { DSV4_EXL3_3INST = 0, DSV4_EXL3_MCG = 1, DSV4_EXL3_MUL1 = 2 };

#define DSV4_EXL3_MCG_MULT 0xCBAC1FEDu
#define DSV4_EXL3_MUL1_MULT 0x83DCD12Du

struct dsv4_exl3 {
    char *prefix;             /* the layer's key, owned */
    int K;                    /* bits per weight, 1..8 */
    int cb;                   /* DSV4_EXL3_3INST / _MCG / _MUL1 */
    int64_t kp, np;           /* padded in / out features */
    int64_t k, n;             /* logical in / out features (k <= kp, n <= np) */
    const uint16_t *trellis;  /* into the mapping: [kp/16][np/16][16K] words */
    float *suh;               /* [kp], owned (decoded from F16 or sign bits) */
    float *svh;               /* [np], owned */
    float *bias;              /* [n] or NULL, owned */
    size_t bytes;             /* stored bytes of the layer's tensors */
};

/* Binds the EXL3 layer `prefix` (its .trellis must exist) with logical shape [n, k]; n or k of
 * 0 takes the padded size. One malloc'd block, freed by dsv4_exl3_free. Fails naming the
 * tensor for any variant this code does not read (K outside 1..8, both codebook flags, a
 * multiplier other than the locked one, dims not multiples of 128, mis-shaped scales). */
int dsv4_exl3_bind(const dsv4_st *st, const char *prefix, int64_t n, int64_t k, dsv4_exl3 **out, dsv4_err *err);
void dsv4_exl3_free(dsv4_exl3 *e);

/* Checks the layer against the checkpoint folder's quantization_config.json (its
 * tensor_storage record: quant_format, bits_per_weight, codebook multiplier) and config.json's
 * quantization_config (quant_method). Missing files or records pass. */
int dsv4_exl3_check_config(const char *dir, const dsv4_exl3 *e, dsv4_err *err);

#endif
