/* io/config — config.json in every spelling of the family (modern HF keys, the release's
 * legacy keys, V4.1's composite text_config) into one dsv4_config. */
#ifndef DSV4_CONFIG_H
#define DSV4_CONFIG_H

#include <stdint.h>
#include "dsv4.h"

#define DSV4_MAX_LAYERS 128

typedef enum { DSV4_FAMILY_V4 = 4, DSV4_FAMILY_V41 = 41 } dsv4_family;

typedef struct dsv4_rope_cfg {
    double theta;
    int yarn;                 /* apply YaRN (compressed layers) */
    double factor, beta_fast, beta_slow;
    double orig_max_pos;
} dsv4_rope_cfg;

typedef struct dsv4_config {
    dsv4_family family;
    int vocab, dim, n_layers, n_heads, head_dim, rope_dim;
    int q_lora, o_groups, o_lora, window;
    int ratio[DSV4_MAX_LAYERS];      /* compression ratio per layer: 0 sliding, else m */
    int csa[DSV4_MAX_LAYERS];        /* 1: compressed sparse attention (overlapping windows + indexer) */
    int hash_layer[DSV4_MAX_LAYERS]; /* 1: routed by tid2eid */
    int index_heads, index_dim, index_topk;
    int n_experts, n_active, n_shared, moe_inter;
    int norm_topk;
    double route_scale, swiglu_limit;
    int hc_mult, hc_iters;
    double hc_eps, norm_eps;
    dsv4_rope_cfg rope_main, rope_compress;
    int n_mtp;
    int fp8_block[2];
    int bos_id, eos_id, pad_id;
    int64_t max_pos;
    /* V4.1 (deepseek_v41): shared compressed attention and Engram */
    int n_kv_source, kv_source[DSV4_MAX_LAYERS];
    int n_index_source, index_source[DSV4_MAX_LAYERS];
    int candidate_source, candidate_topk_blocks, candidate_block_size;
    int n_engram, engram_layer[8];
    int64_t engram_rows[8];
    int engram_max_ngram, engram_heads, engram_head_dim, engram_pad_id;
    int64_t engram_vocab_size;
    int engram_compressed_vocab;
    int image_token_id;
} dsv4_config;

/* Reads DIR/config.json. Contradictions (a layer list shorter than the layer count, an
 * unknown layer type, rope dims larger than the head) fail naming the key. */
int dsv4_config_load(const char *dir, dsv4_config *cfg, dsv4_err *err);
/* Same, from JSON text; `where` names the source in messages. */
int dsv4_config_parse(const char *json, const char *where, dsv4_config *cfg, dsv4_err *err);

#endif
