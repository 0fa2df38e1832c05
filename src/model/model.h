/* model — the checkpoint bound to model slots, the per-sequence state, and the forward. */
#ifndef DSV4_MODEL_H
#define DSV4_MODEL_H

#include "dsv4.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "io/weight.h"
#include "kernels/backend.h"

/* One compressor (attention's or the indexer's): width cd = d (HCA, one window) or 2d
 * (CSA, overlapping windows; entry w pools window w-1's first half and window w's second). */
typedef struct dsv4_compressor {
    int ratio, dim, overlap;
    dsv4_weight wkv, wgate;
    float *ape;              /* [ratio, (1 + overlap) * dim] */
    float *norm;             /* [dim] */
} dsv4_compressor;

typedef struct dsv4_layer {
    int ratio;               /* 0 sliding, else compression ratio m */
    int csa;                 /* m > 0 with an indexer (overlapping compressor) */
    int hash;
    float *attn_norm, *ffn_norm;
    float *hc_attn_fn, *hc_attn_base, *hc_attn_scale;
    float *hc_ffn_fn, *hc_ffn_base, *hc_ffn_scale;
    dsv4_weight wq_a, wq_b, wkv, wo_a, wo_b;
    float *q_norm, *kv_norm, *sink;
    dsv4_compressor comp;    /* ratio > 0 */
    dsv4_compressor icomp;   /* csa: the indexer's compressor at index_dim */
    dsv4_weight iwq_b, iweights;
    dsv4_weight gate;
    float *gate_bias;        /* [E] or NULL */
    int32_t *tid2eid;        /* [vocab, n_active] for hash layers */
    dsv4_weight *w1, *w2, *w3; /* [E] each */
    dsv4_weight sw1, sw2, sw3;
} dsv4_layer;

struct dsv4_model {
    dsv4_config cfg;
    dsv4_st *st;
    const dsv4_backend *be;
    dsv4_numerics numerics;
    int max_rollback;
    dsv4_weight embed, head;
    float *norm;
    float *hc_head_fn, *hc_head_base, *hc_head_scale;
    dsv4_layer *layers;
    float *inv_freq_main, *inv_freq_compress;     /* [rope_dim / 2] */
    size_t weight_bytes;
    char *dir;
};

/* Per-layer caches of one sequence. Rings hold per-token rows indexed by position mod cap. */
typedef struct dsv4_lstate {
    float *kv;               /* [kv_cap, d]: window rows */
    float *c, *z;            /* [c_cap, cw]: compressor inputs of recent tokens */
    float *ent;              /* [ent_cap, d]: emitted compressed entries */
    float *ic, *iz;          /* [c_cap, 2 * index_dim]: the indexer compressor's inputs */
    float *ikey;             /* [ent_cap, index_dim]: indexer keys */
    int64_t ent_cap;
} dsv4_lstate;

struct dsv4_seq {
    dsv4_model *m;
    int64_t len;             /* tokens consumed */
    int64_t hi;              /* furthest length reached since creation/restore (bounds rollback) */
    int kv_cap, c_cap;
    dsv4_lstate *L;
};

/* A model from a config's JSON text and a safetensors image in an mmap'd region (taken
 * over: unmapped when the model is freed). Used for synthetic models. */
dsv4_model *dsv4_model_from_memory(const char *config_json, void *st_image, size_t st_len, const char *label,
                                   const dsv4_load_opts *opts, dsv4_err *err);

/* Sequence state helpers shared by the forward. */
int dsv4_seq_reserve(dsv4_seq *s, int64_t n_tokens, dsv4_err *err);

#endif
