/* model — the checkpoint bound to model slots, the per-sequence state, and the forward. */
#ifndef DSV4_MODEL_H
#define DSV4_MODEL_H

#include "dsv4.h"
#include "core/core.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "io/weight.h"
#include "kernels/backend.h"
#include "model/diag.h"
#include "model/engram.h"

/* One compressor (attention's or the indexer's): width cd = d (HCA, one window) or 2d
 * (CSA, overlapping windows; entry w pools window w-1's first half and window w's second). */
typedef struct dsv4_compressor {
    int ratio, dim, overlap;
    dsv4_weight wkv, wgate;
    float *ape;              /* [ratio, (1 + overlap) * dim] */
    float *norm;             /* [dim] */
} dsv4_compressor;

static inline dsv4_pool dsv4_pool_of(const dsv4_compressor *cp)
{
    return (dsv4_pool){cp->ratio, cp->dim, cp->overlap, cp->ape, cp->norm};
}

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
    int n_exp, n_act;        /* routed experts and how many a row takes (DSpark stages: their own) */
    dsv4_weight *w1, *w2, *w3; /* [n_exp] each */
    dsv4_weight sw1, sw2, sw3;
    /* What the sequence state holds for this layer (seq.c reads only these): */
    int own_ent;             /* emits compressed entries (V4: ratio > 0; V4.1: KV sources) */
    int own_ikey;            /* emits indexer keys (V4: csa; V4.1: KV sources with indexer.wk) */
    int cw, c_span;          /* compressor-input ring row width (0: no ring) and tokens it must span */
    int icw;                 /* V4 indexer-compressor ring row width (0: none) */
    /* V4.1 (CSA2) roles within one forward: */
    int kv_src;              /* layer whose compressed entries this layer attends (ratio > 0) */
    int ikey_src;            /* layer whose index keys this index source scores against */
    int index_source, cand_source, cand_filter;
    dsv4_weight iwk;         /* KV sources: indexer.wk [index_dim, head_dim] */
    float *ik_norm;          /* [index_dim] */
    int engram;              /* index into model->engram, or -1 */
} dsv4_layer;

/* One Engram layer: hashed n-gram rows of a table, projected and gated into every stream. */
typedef struct dsv4_engram {
    int layer;
    int cols;                /* (max_ngram - 1) * heads: rows fetched per token */
    int64_t *prime;          /* [cols]: table size of each column */
    int64_t *offset;         /* [cols]: first row of each column in the table */
    int64_t mult[8];         /* [max_ngram]: odd hash multipliers */
    dsv4_etable table;       /* [rows, head_dim] FP8 + per-32 scales */
    dsv4_weight wkv;         /* [(hc + 1) * D, cols * head_dim] */
    float *qk;               /* [hc, D]: q_weight * k_weight */
} dsv4_engram;

/* The DSpark drafter (spec §10), V4.1's mtp.* stages: ratio-0 blocks (own window, own
 * experts) over a block of draft rows, fed through each stage's window by the target's block
 * inputs at the config's target layers. */
typedef struct dsv4_spec {
    int n;                   /* stages bound (0: none) */
    int on;                  /* the sequences keep the stages' windows and drafts can run */
    int asked;               /* loaded with draft_stages (else a draft is refused saying so) */
    dsv4_layer *st;          /* [n] */
    dsv4_weight main_proj;   /* [D, n_spec_target D] (stage 0) */
    float *main_norm;        /* [D] (stage 0) */
    float *norm;             /* [D] (last stage): before the shared head */
    dsv4_weight mk_embed, mk_head; /* Markov head [vocab, rank] each (last stage) */
    float *conf;             /* [D + rank]: the confidence head (last stage) */
} dsv4_spec;

/* V4's MTP stages (docs/mtp.md): a sliding block fed, at position p, the embedding of token
 * p + 1 and the target's final streams at p; its head mix, norm and the shared head give the
 * token after. Stage 0 drafts; its window rows of true tokens are sequence state. */
typedef struct dsv4_mtp {
    int n;                   /* stages bound (0: none) */
    int on;                  /* the sequences keep its window and drafts can run */
    int asked;               /* loaded with draft_stages */
    dsv4_layer *st;          /* [n] */
    dsv4_weight *e_proj, *h_proj; /* [n] each [D, D] */
    float **enorm, **hnorm, **norm; /* [n] each [D] */
    float **hc_head_fn, **hc_head_base, **hc_head_scale; /* [n]: [hc, hc D], [hc], [1] */
} dsv4_mtp;

/* The step arena (forward.c): a step's buffers in backend memory, at fixed offsets, so a step of
 * a shape seen before finds its buffers where a recording of it expects them. A step that
 * outgrows it takes its own buffers (extra) and grows it for the next (gen counts moves). */
#define DSV4_ARENA_EXTRA 256
typedef struct dsv4_arena {
    char *base;
    size_t cap, off, want;
    void *extra[DSV4_ARENA_EXTRA];
    size_t extra_off[DSV4_ARENA_EXTRA];   /* the arena offset each was taken at */
    int n_extra;
    uint64_t gen;
} dsv4_arena;
/* Recorded steps by shape (forward.c), least recently used out. */
#define DSV4_GRAPH_SLOTS 8
typedef struct dsv4_graphs {
    void *g[DSV4_GRAPH_SLOTS];
    uint64_t key[DSV4_GRAPH_SLOTS], use[DSV4_GRAPH_SLOTS], clock, last;
    uint64_t unrecordable[DSV4_GRAPH_SLOTS];  /* shapes whose recording failed (an op waits on the host) */
    int n_unrecordable;
} dsv4_graphs;
struct dsv4_model {
    dsv4_config cfg;
    dsv4_st *st;
    const dsv4_backend *be;
    /* Where activations and sequence state live: be's memory. One forward at a time per model. */
    const dsv4_backend *mem;
    dsv4_arena arena;
    dsv4_graphs graphs;
    dsv4_numerics numerics;
    int kv_prod;             /* production caches (kernels/kv_format.h) */
    int max_rollback;
    dsv4_weight embed, head;
    float *norm;
    float *hc_head_fn, *hc_head_base, *hc_head_scale;
    dsv4_layer *layers;
    float *inv_freq_main, *inv_freq_compress;     /* [rope_dim / 2] */
    dsv4_engram *engram;     /* [cfg.n_engram] */
    dsv4_spec spec;
    dsv4_mtp mtp;
    int32_t *token_map;      /* [vocab]: Engram compressed id of each token */
    int32_t engram_pad;      /* compressed id of the pad token */
    int engram_streamed;
    uint64_t engram_bytes, engram_tokens; /* table traffic since load */
    double engram_gather_s, engram_stall_s; /* time reading rows; time the forward waited for them */
    size_t weight_bytes;
    char *dir;
    char placement[512];     /* a device backend's memory plan in words ("" on the CPU) */
    int experts_host;        /* the plan left routed experts in pinned host memory */
    dsv4_place_item *placed; /* [n_placed] what the device backend holds (NULL on the CPU) */
    int64_t n_placed;
};

/* Every array a device backend's ops read, for its place op (kernels/place.h): the embedding,
 * the hot path's weights and float arrays, the routed experts numbered in layer order (a
 * synthetic model's layers that share an earlier layer's experts marked shared). *items is
 * malloc'd. */
int dsv4_place_items(const dsv4_model *m, dsv4_place_item **items, int64_t *n, dsv4_err *err);

/* Rows of one forward step: (sequence, token) pairs in batch order. */
typedef struct dsv4_step {
    dsv4_model *m;
    const dsv4_backend *be;
    int R;
    int64_t *pos;            /* [R] absolute position of each row */
    int32_t *row_seq;        /* [R] batch index of each row's sequence */
    const int32_t *ids;      /* [R] token ids */
    const dsv4_batch *b;
    /* The same in backend memory (m->mem), for the ops: */
    dsv4_rows rows;
    const int64_t *dpos;
    const int32_t *dids;
    const dsv4_lbufs *st;    /* [n_layers, S] each sequence's buffers per layer */
    int64_t *vis_cap;        /* [n_layers] largest entry capacity of the step's sequences (host) */
    int kv_cap;
} dsv4_step;

struct dsv4_seq {
    dsv4_model *m;
    int64_t len;             /* tokens consumed */
    int64_t hi;              /* furthest length reached since creation/restore (bounds rollback) */
    int kv_cap, c_cap;
    dsv4_lbufs *L;           /* [n_layers] each layer's buffers (kernels/backend.h) */
    int32_t *etok;           /* [e_cap]: Engram compressed ids by position mod e_cap */
    int e_cap;
    float **skv;             /* [spec.n] DSpark stage windows [kv_cap, head_dim] by position mod kv_cap */
    float *mkv;              /* V4 MTP stage 0's window [kv_cap, head_dim] (row p: token p + 1 with streams p) */
    float *mhs;              /* [kv_cap, hc D]: the target's final streams by position mod kv_cap */
};

/* A model from a config's JSON text and a safetensors image in an mmap'd region (taken
 * over: unmapped when the model is freed). Used for synthetic models. */
dsv4_model *dsv4_model_from_memory(const char *config_json, void *st_image, size_t st_len, const char *label,
                                   const dsv4_load_opts *opts, dsv4_err *err);
/* As dsv4_model_from_memory, and: files (NULL-terminated, may be NULL), safetensors files whose
 * tensors join the image's (tables to stream from disk); token_map (may be NULL), the Engram
 * token classes [vocab] when the config has Engram layers, instead of token_map.json. */
dsv4_model *dsv4_model_from_memory_ext(const char *config_json, void *st_image, size_t st_len, const char *label,
                                       const char *const *files, const int32_t *token_map, const dsv4_load_opts *opts,
                                       dsv4_err *err);

/* Sequence state helpers shared by the forward. */
int dsv4_seq_reserve(dsv4_seq *s, int64_t n_tokens, dsv4_err *err);
/* A sequence at n tokens of context whose caches hold random rows (uniform in [-1, 1), stored
 * in the model's format): what a step at that depth reads, for benchmarks, without the prefill. */
int dsv4_seq_fill_synthetic(dsv4_seq *s, int64_t n, uint64_t seed, dsv4_err *err);
/* Rows of the compressor-input ring of a layer (its span plus the rollback reach). */
int dsv4_c_cap(const dsv4_model *m, const dsv4_layer *L);

/* Numerics (numerics.c). In FP32 mode each is the plain op; in REF mode it rounds where
 * the V4.1 release reference does (V4 follows the same rules, docs/numerics.md). */
enum { DSV4_LIN_F32OUT = 1, DSV4_LIN_NOQ = 2 };
/* be->linear, plus in REF: the input quantized to e4m3 per dsv4_act_block(W) channels (ue8m0
 * scale) when W is FP8/FP4 (unless DSV4_LIN_NOQ), and the output rounded to bf16 (unless
 * F32OUT). */
void dsv4_lin(const dsv4_model *m, const dsv4_weight *w, int64_t r0, int64_t r1, const float *x, int T, int64_t ldx,
              float *y, int64_t ldy, int flags);
/* dsv4_lin(m, w[j], 0, W_j.n, x, T, ldx, y[j], W_j.n, flags) for j < nw (y[j] dense), through
 * be->linear_multi where no input is quantized (FP32, or REF when none needs it). */
void dsv4_lin_multi(const dsv4_model *m, int nw, const dsv4_weight *const *w, const float *x, int T, int64_t ldx,
                    float *const *y, int flags);
void dsv4_rnd(const dsv4_model *m, float *x, int64_t n);          /* REF: round to bf16 */
/* be->rmsnorm, be->rope (every heads * d value of each row) and be->hc_post (all of X), plus in
 * REF their outputs rounded to bf16: the ops' _rb forms, each bit for bit the op then dsv4_rnd. */
void dsv4_norm(const dsv4_model *m, const float *x, int64_t rows, int dim, const float *w, float eps, float *y);
void dsv4_rope(const dsv4_model *m, float *x, int T, int64_t stride, int heads, int d, int rd, const float *inv_freq,
               const int64_t *pos, int inverse);
void dsv4_hc_post(const dsv4_model *m, float *X, const float *y, int T, int n, int D, const float *post,
                  const float *comb);

static inline float *dsv4_fbuf(size_t n, dsv4_err *err) { return dsv4_xmalloc(n * sizeof(float), err); }

/* The routed + shared expert FFN of layer li over R rows (forward.c); ids for hash routing; ids,
 * x, y in m->mem. */
int dsv4_moe(dsv4_model *m, int li, const int32_t *ids, int R, const float *x, float *y, dsv4_err *err);
/* A step buffer of `bytes` from the arena (m->mem memory); NULL after setting err. */
void *dsv4_take(dsv4_model *m, size_t bytes, dsv4_err *err);
/* dsv4_take of n floats. */
float *dsv4_ftake(dsv4_model *m, size_t n, dsv4_err *err);
void dsv4_arena_free(dsv4_model *m);
/* Gives back the step buffers taken since `mark` (an earlier m->arena.off). */
void dsv4_release(dsv4_model *m, size_t mark);
void dsv4_graphs_free(dsv4_model *m);
/* Engram tables of the model: resident or streamed per opts (AUTO: streamed when the
 * tables exceed half of RAM); engram_io.c. */
int dsv4_engram_open(dsv4_model *m, int mode, dsv4_err *err);
void dsv4_engram_close(dsv4_model *m);

/* The V4 layers (v4.c) over X [R, n, D] in, out (backend memory); h, y [R, D], pre, post
 * [R, n] and comb [R, n, n] scratch. They read only backend buffers, so a step of them can be
 * recorded and replayed. */
int dsv4_v4_layers(dsv4_step *f, float *X, float *h, float *y, float *pre, float *post, float *comb, dsv4_err *err);
/* Runs layers(ctx, err), a step's layers over backend buffers only, from a recording when the
 * step's shape has run before (forward.c): the first step of a shape runs the ops, the second
 * records them, later ones replay (DSV4_GRAPHS=0, or a backend without recording: always the
 * ops). */
int dsv4_layers_replayed(dsv4_step *f, int (*layers)(void *ctx, dsv4_err *err), void *ctx, dsv4_err *err);
/* The V4.1 layers (v41.c): X [R, n, D] in, out; h [R, D] the final collapse. With DSpark
 * stages on, also writes every row's entry in each stage's window (dspark.c). */
int dsv4_v41_layers(dsv4_step *f, float *X, float *h, dsv4_err *err);

/* V4.1 pieces shared by the backbone and the DSpark stages (v41.c). */
/* The attention's projections of a [R, D] at positions pos: qr [R, q_lora] (q_norm'd), q [R, H d]
 * (roped) and the window row kv [R, d] (kv_norm'd, roped, REF: the cache's e4m3 round trip). */
void dsv4_v41_qkv(const dsv4_model *m, const dsv4_layer *L, const float *a, int R, const int64_t *pos, float *qr,
                  float *q, float *kv);
/* The window row alone (what a DSpark stage's window takes from the target); packed: it goes to a
 * production cache, whose packing rounds it (no REF round trip here). */
void dsv4_v41_window_row(const dsv4_model *m, const dsv4_layer *L, const float *a, int R, const int64_t *pos, float *kv,
                         int packed);
/* The attention's output: o [R, H d] (in place: rounded, inverse rope) through wo_a's groups and wo_b into y [R, D]. */
int dsv4_v41_attn_out(dsv4_model *m, const dsv4_layer *L, float *o, int R, const int64_t *pos, float *y,
                      dsv4_err *err);
/* One block with mHC (spec §5) over X [R, n, D]: pin [R, n] the collapse the attention site
 * reads (the previous site's pre); on return pin holds this block's FFN-site pre for the next.
 * attn(ctx, a, y) computes the block's attention of a [R, D] into y [R, D]; ids [R] the rows'
 * tokens. */
typedef int (*dsv4_attn_fn)(void *ctx, const float *a, float *y, dsv4_err *err);
int dsv4_v41_block(dsv4_model *m, const dsv4_layer *L, const int32_t *ids, int R, float *X, float *pin,
                   dsv4_attn_fn attn, void *ctx, dsv4_err *err);

/* DSpark (dspark.c; model.c binds the stages). The stage windows' entries of a step's rows from their block inputs at the target layers,
 * mh [R, n_spec_target D] (stream means). */
int dsv4_spec_window(dsv4_step *f, const float *mh, dsv4_err *err);
/* V4 MTP (mtp.c): the window rows the step's tokens complete (row p - 1 for a row at p),
 * from X [R, hc, D] the step's final streams, which are kept for the next step. */
int dsv4_mtp_window(dsv4_step *f, const float *X, dsv4_err *err);
/* Routed + shared experts of any layer (forward.c): dsv4_moe with the layer given. */
int dsv4_moe_of(dsv4_model *m, const dsv4_layer *L, const int32_t *ids, int R, const float *x, float *y, dsv4_err *err);


#endif
