/* io/config — config.json in every spelling of the family (modern HF keys, the release's
 * legacy keys, V4.1's composite text_config) into one dsv4_config. */
#ifndef DSV4_CONFIG_H
#define DSV4_CONFIG_H

#include <stdint.h>
#include "core/err.h"

#define DSV4_MAX_LAYERS 128

/* The valid range of every config value (the parse refuses anything outside, naming the key).
 * The bounds sit far above the released models (spec: V4-Flash, V4.1-Flash) and below what
 * would overflow an int size product, divide by zero or run without end. */
#define DSV4_MAX_VOCAB (1 << 24)
#define DSV4_MAX_DIM 65536          /* width, low ranks, expert width, FP8 block sides, engram row dim */
#define DSV4_MAX_HEADS 1024         /* attention and indexer heads */
#define DSV4_MAX_HEAD_DIM 4096
#define DSV4_MAX_WINDOW 65536       /* sliding window (every layer keeps that many rows per sequence) */
#define DSV4_MAX_EXPERTS 16384
#define DSV4_MAX_SHARED 64
#define DSV4_MAX_TOPK (1 << 20)     /* index_topk, candidate_topk_blocks, candidate_block_size */
#define DSV4_MAX_HC 16              /* hyper-connection streams */
#define DSV4_MAX_SINKHORN_ITERS 1000 /* released models use 20; each token and site runs them all */
#define DSV4_MAX_COMPRESS 65536     /* compression rates (the backends run up to DSV4_MAX_RATIO) */
#define DSV4_MAX_SCALE 1e6          /* routed_scaling_factor, swiglu_limit */
#define DSV4_MAX_POSITIONS 9007199254740992.0 /* 2^53: positions are int64, exact in a double */
#define DSV4_MAX_ROPE_THETA 1e30    /* the tables take the base in fp32 */
#define DSV4_MAX_ROPE_FACTOR 1e6    /* YaRN factor and betas */
#define DSV4_MAX_ENGRAM 8           /* engram layers */
#define DSV4_MAX_NGRAM 8            /* engram_max_ngram_size */
#define DSV4_MAX_ENGRAM_HEADS 64
#define DSV4_MAX_ENGRAM_VOCAB 4294967296.0 /* the prime search tests candidates by trial division */
#define DSV4_MAX_ENGRAM_ROWS 9007199254740992.0
#define DSV4_MAX_SPEC_TARGETS 16    /* dspark_target_layer_ids */
/* dspark_block_size; include/dsv4.h publishes the same bound (a TU that sees both would warn
 * of a redefinition if they ever differed) */
#define DSV4_MAX_SPEC_BLOCK 64

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
    int n_engram, engram_layer[DSV4_MAX_ENGRAM];
    int64_t engram_rows[DSV4_MAX_ENGRAM];
    int engram_max_ngram, engram_heads, engram_head_dim, engram_pad_id;
    int64_t engram_vocab_size;
    int engram_compressed_vocab;
    int image_token_id;
    /* V4.1 DSpark drafter (n_mtp stages mtp.*): the block it drafts (anchor + noise tokens),
     * the target layers whose block inputs feed it, its Markov rank and its stages' experts */
    int spec_block, spec_noise, n_spec_target, spec_target[DSV4_MAX_SPEC_TARGETS];
    int spec_markov_rank, spec_experts, spec_active;
} dsv4_config;

/* Reads DIR/config.json. A value outside its range above, of the wrong type, or contradicting
 * another (a layer list shorter than the layer count, an unknown layer type, rope dims larger
 * than the head, o_groups not dividing the heads) fails naming the key. */
int dsv4_config_load(const char *dir, dsv4_config *cfg, dsv4_err *err);
/* Same, from JSON text; `where` names the source in messages. */
int dsv4_config_parse(const char *json, const char *where, dsv4_config *cfg, dsv4_err *err);

#endif
