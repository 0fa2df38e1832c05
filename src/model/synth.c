/* Synthetic models: random weights in the release layout and storage forms at real shapes,
 * built in memory as a safetensors image and loaded through the normal binder, so the real
 * per-token cost can be measured without the 150 GB checkpoint. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "core/core.h"
#include "io/safetensors.h"
#include "model/diag.h"
#include "model/engram.h"
#include "model/model.h"

typedef struct syn_t {
    char name[96];
    dsv4_dtype dt;
    int64_t shape[2];
    int nd;
    int kind;   /* fill: 0 weights, 1 ones (norms), 2 zeros, 3 e8m0 weight scale, 4 e8m0 fp4 scale, 5 tid2eid, 6 small f32,
                * 7 an Engram table's rows or scales (filled by the table generator) */
    int alias;  /* >= 0: shares the bytes of that earlier tensor (same shape) */
    int ext;    /* in a file of its own, not in the image (a streamed Engram table) */
    size_t off, bytes;
} syn_t;

typedef struct syn_list {
    syn_t *t;
    int n, cap;
    int blk;    /* FP8 block size */
} syn_list;

static void add(syn_list *l, dsv4_dtype dt, int64_t a, int64_t b, int kind, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static void add(syn_list *l, dsv4_dtype dt, int64_t a, int64_t b, int kind, const char *fmt, ...)
{
    if (l->n == l->cap)
        l->t = realloc(l->t, (l->cap = l->cap ? 2 * l->cap : 1024) * sizeof *l->t);
    syn_t *t = &l->t[l->n++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->dt = dt;
    t->shape[0] = a;
    t->shape[1] = b;
    t->nd = b > 0 ? 2 : 1;
    t->kind = kind;
    t->alias = -1;
    t->ext = 0;
    t->bytes = (size_t)a * (b > 0 ? b : 1) * dsv4_dtype_size(dt);
}

static void fp8(syn_list *l, int64_t n, int64_t k, const char *pfx)
{
    add(l, DSV4_DT_F8_E4M3, n, k, 0, "%s.weight", pfx);
    add(l, DSV4_DT_F8_E8M0, (n + l->blk - 1) / l->blk, (k + l->blk - 1) / l->blk, 3, "%s.scale", pfx);
}

static void fp4(syn_list *l, int64_t n, int64_t k, const char *pfx)
{
    add(l, DSV4_DT_I8, n, k / 2, 0, "%s.weight", pfx);
    add(l, DSV4_DT_F8_E8M0, n, k / 32, 4, "%s.scale", pfx);
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Fills a tensor with values that keep activations finite: small bf16/f32, fp8 codes that
 * are never NaN, scales that keep products near unit size. */
static void fill(const syn_t *t, uint8_t *p, int n_experts, int n_active, uint64_t seed)
{
    size_t n = t->bytes / dsv4_dtype_size(t->dt);
#pragma omp parallel for schedule(static)
    for (size_t c0 = 0; c0 < n; c0 += 65536) {
        uint64_t s = seed ^ (c0 * 0x2545f4914f6cdd1dull);
        size_t c1 = c0 + 65536 < n ? c0 + 65536 : n;
        for (size_t i = c0; i < c1; i++) {
            uint64_t r = rng_next(&s);
            switch (t->kind) {
            case 0:
                if (t->dt == DSV4_DT_BF16)
                    ((uint16_t *)p)[i] = (uint16_t)(((r & 1) << 15) | ((uint64_t)(120 + (r >> 1) % 4) << 7) | ((r >> 8) & 0x7f));
                else if (t->dt == DSV4_DT_F32)
                    ((float *)p)[i] = ((float)(r >> 40) / (float)(1 << 24) - 0.5f) * 0.02f;
                else {
                    uint8_t b = (uint8_t)r;
                    p[i] = (b & 0x7f) == 0x7f ? b ^ 1 : b;
                }
                break;
            case 1:
                if (t->dt == DSV4_DT_BF16)
                    ((uint16_t *)p)[i] = 0x3f80;
                else
                    ((float *)p)[i] = 1.0f;
                break;
            case 2:
                memset(p + i * dsv4_dtype_size(t->dt), 0, dsv4_dtype_size(t->dt));
                break;
            case 3:
                p[i] = 127 - 14;
                break;
            case 4:
                p[i] = 127 - 6;
                break;
            case 5:
                ((int32_t *)p)[i] = (int32_t)(((i % n_active) * (n_experts / n_active) + (r % (n_experts / n_active))) % n_experts);
                break;
            default:
                ((float *)p)[i] = ((float)(r >> 40) / (float)(1 << 24) - 0.5f) * 0.2f;
            }
        }
    }
}

/* Shapes of a synthetic preset. The V4.1 fields (from cb on) are zero for V4 presets. */
typedef struct syn_shape {
    int V, D, H, d, rd, Q, G, OR, E, K, I, NI, CI, topk, W, csa, hca, blk;
    int cb, cbs;                       /* candidate blocks kept, block size */
    int e_heads, e_hd, e_ngram, e_cv;  /* Engram heads per n-gram, row dim, max n-gram, compressed vocab */
    int s_n, s_block, s_noise, s_rank, s_E, s_K; /* DSpark stages, block, noise id, Markov rank, experts */
    int64_t e_rows;                    /* default rows per Engram table */
} syn_shape;

static const syn_shape v4_flash = {129280, 4096, 64, 512, 64, 1024, 8, 1024, 256, 6, 2048, 64, 128, 512, 128, 4, 128, 128,
                                   0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
/* A toy at the real vocabulary (so the real tokenizer drives it) with every layer kind. */
static const syn_shape tiny = {129280, 64, 2, 64, 16, 32, 2, 16, 8, 2, 32, 2, 32, 8, 16, 4, 16, 32,
                               0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};

/* V4.1-Flash as released (spec §2). Engram tables default to 2^22 rows each (1.1 GB; the
 * release's are 384M rows, 94 GiB): random rows are past every cache either way. */
static const syn_shape v41_flash = {129280, 5120, 64, 512, 64, 1280, 8, 1024, 384, 6, 2304, 32, 128, 512, 128, 2, 1, 32,
                                    2048, 8, 8, 256, 4, 99092, 3, 5, 128799, 256, 128, 3, (int64_t)1 << 22};
/* The same structure (CSA2 schedule, Engram, three DSpark stages, real vocabulary) at width 64:
 * for tests. Small candidate blocks so that the block filter acts at short contexts. */
static const syn_shape v41_tiny = {129280, 64, 2, 64, 16, 32, 2, 16, 8, 2, 32, 2, 32, 8, 16, 2, 1, 32,
                                   4, 4, 8, 32, 4, 99092, 3, 5, 128799, 16, 4, 2, 48000};

/* V4.1-Flash's 40 layers by role (spec §2): 0-1 sliding, 2-19 ratio 2 (KV and index sources 2,
 * 8, 14), 20-39 ratio 1 (KV, index and candidate source 20, re-index sources 24, 28, 32, 36);
 * Engram at the input of 1 and 14; the drafter reads the inputs of the last three. */
#define V41_LAYERS 40
static int rel_ratio(int r) { return r < 2 ? 0 : r < 20 ? 2 : 1; }
static int rel_kv(int r) { return r == 2 || r == 8 || r == 14 || r == 20; }
static int rel_index(int r) { return rel_kv(r) || (r > 20 && r % 4 == 0); }
static int rel_engram(int r) { return r == 1 || r == 14; }

/* N of the release's layers, in the release's order, with their roles: all 40 for N = 40;
 * fewer keep first the layers of every role (1: sliding + Engram, 14: ratio 2 KV/index source
 * + Engram, 20: ratio 1 KV/index/candidate source, 24: re-index source, 15 and 21: readers),
 * then the rest from layer 0 up. Every reader keeps its KV and index source before it. */
typedef struct v41_plan {
    int n, rel[V41_LAYERS];
    int cand, n_engram, engram[2], target[3];
} v41_plan;

static void v41_plan_make(int N, v41_plan *p)
{
    static const int first[] = {1, 14, 20, 24, 15, 21};
    char used[V41_LAYERS] = {0};
    int k = 0;
    for (int i = 0; i < 6 && k < N; i++)
        used[p->rel[k++] = first[i]] = 1;
    for (int r = 0; r < V41_LAYERS && k < N; r++)
        if (!used[r])
            p->rel[k++] = r;
    for (int i = 1; i < k; i++) /* ascending */
        for (int j = i; j > 0 && p->rel[j - 1] > p->rel[j]; j--) {
            int t = p->rel[j];
            p->rel[j] = p->rel[j - 1];
            p->rel[j - 1] = t;
        }
    p->n = k;
    p->cand = -1;
    p->n_engram = 0;
    for (int i = 0; i < k; i++) {
        if (p->rel[i] == 20)
            p->cand = i;
        if (rel_engram(p->rel[i]))
            p->engram[p->n_engram++] = i;
    }
    for (int t = 0; t < 3; t++)
        p->target[t] = k - 3 + t < 0 ? k - 1 : k - 3 + t;
}

/* What a preset build is asked for, and what it gives. */
typedef struct syn_req {
    const char *preset;
    int n_layers, expert_layers, in_memory, progress, config_only;
    int64_t engram_rows;    /* rows per Engram table asked (0: the preset's default) */
    const char *engram_dir; /* non-NULL: the tables go to files there (streamed), not into the image */
} syn_req;

typedef struct syn_out {
    char cfg[8192];
    uint8_t *img;
    size_t len;
    int32_t *token_map;     /* V4.1: [vocab] Engram classes */
    int vocab;
    char *files[3];         /* table files written (NULL-terminated) */
} syn_out;

static void syn_out_free(syn_out *o)
{
    free(o->token_map);
    for (int i = 0; o->files[i]; i++) {
        unlink(o->files[i]);
        free(o->files[i]);
        o->files[i] = NULL;
    }
}

#define CAT(...) (pos += snprintf(buf + pos, sizeof buf - pos, __VA_ARGS__))

static void v41_config(const syn_shape *sh, const v41_plan *pl, int64_t evocab, const int64_t *erows, char *cfg, size_t cfg_n)
{
    char buf[2048];
    int pos = 0;
    CAT("\"compress_ratios\":[");
    for (int i = 0; i < pl->n; i++)
        CAT("%s%d", i ? "," : "", rel_ratio(pl->rel[i]));
    for (int s = 0; s < sh->s_n; s++)
        CAT(",0");
    CAT("],\"kv_source_layer_ids\":[");
    for (int i = 0, f = 1; i < pl->n; i++)
        if (rel_kv(pl->rel[i]))
            CAT("%s%d", f ? "" : ",", i), f = 0;
    CAT("],\"index_source_layer_ids\":[");
    for (int i = 0, f = 1; i < pl->n; i++)
        if (rel_index(pl->rel[i]))
            CAT("%s%d", f ? "" : ",", i), f = 0;
    CAT("],\"engram_layer_ids\":[");
    for (int i = 0; i < pl->n_engram; i++)
        CAT("%s%d", i ? "," : "", pl->engram[i]);
    CAT("],\"engram_num_embeddings\":[");
    for (int i = 0; i < pl->n_engram; i++)
        CAT("%s%lld", i ? "," : "", (long long)erows[i]);
    CAT("],\"dspark_target_layer_ids\":[%d,%d,%d]", pl->target[0], pl->target[1], pl->target[2]);
    snprintf(cfg, cfg_n,
             "{\"architectures\":[\"DeepseekV41ForCausalLM\"],\"model_type\":\"deepseek_v41\",\"bos_token_id\":0,\"eos_token_id\":1,"
             "\"pad_token_id\":2,\"quantization_config\":{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\",\"scale_fmt\":\"ue8m0\","
             "\"weight_block_size\":[32,32],\"expert_dtype\":\"fp4\"},\"text_config\":{\"vocab_size\":%d,\"hidden_size\":%d,"
             "\"num_hidden_layers\":%d,\"num_nextn_predict_layers\":%d,\"num_attention_heads\":%d,\"num_key_value_heads\":1,"
             "\"head_dim\":%d,\"qk_rope_head_dim\":%d,\"q_lora_rank\":%d,\"o_groups\":%d,\"o_lora_rank\":%d,\"sliding_window\":%d,"
             "%s,\"candidate_source_layer_id\":%d,\"candidate_topk_blocks\":%d,\"candidate_block_size\":%d,\"index_n_heads\":%d,"
             "\"index_head_dim\":%d,\"index_topk\":%d,\"n_routed_experts\":%d,\"num_experts_per_tok\":%d,\"n_shared_experts\":1,"
             "\"moe_intermediate_size\":%d,\"scoring_func\":\"sqrtsoftplus\",\"norm_topk_prob\":true,\"swiglu_limit\":10.0,"
             "\"routed_scaling_factor\":1.5,\"hc_mult\":4,\"hc_sinkhorn_iters\":20,\"hc_eps\":1e-6,\"rms_norm_eps\":1e-20,"
             "\"rope_theta\":10000,\"compress_rope_theta\":160000,\"max_position_embeddings\":1048576,"
             "\"rope_scaling\":{\"type\":\"yarn\",\"factor\":16,\"original_max_position_embeddings\":65536,\"beta_fast\":32,"
             "\"beta_slow\":1},\"engram_max_ngram_size\":%d,\"engram_vocab_size\":%lld,\"engram_n_heads\":%d,"
             "\"engram_head_dim\":%d,\"engram_pad_id\":2,\"engram_compressed_vocab_size\":%d,\"dspark_block_size\":%d,"
             "\"dspark_noise_token_id\":%d,\"dspark_markov_rank\":%d,\"dspark_n_routed_experts\":%d,"
             "\"dspark_num_experts_per_tok\":%d}}",
             sh->V, sh->D, pl->n, sh->s_n, sh->H, sh->d, sh->rd, sh->Q, sh->G, sh->OR, sh->W, buf, pl->cand, sh->cb, sh->cbs,
             sh->NI, sh->CI, sh->topk, sh->E, sh->K, sh->I, sh->e_ngram, (long long)evocab, sh->e_heads, sh->e_hd, sh->e_cv,
             sh->s_block, sh->s_noise, sh->s_rank, sh->s_E, sh->s_K);
}

/* What every block has (backbone layers and draft stages): norms, mixes, attention projections. */
static void add_common(syn_list *l, const syn_shape *sh, const char *pf)
{
    const int D = sh->D, H = sh->H, d = sh->d, Q = sh->Q, G = sh->G, OR = sh->OR;
    char p[96];
#define P(s) (snprintf(p, sizeof p, "%s.%s", pf, s), p)
    add(l, DSV4_DT_BF16, D, 0, 1, "%s", P("attn_norm.weight"));
    add(l, DSV4_DT_BF16, D, 0, 1, "%s", P("ffn_norm.weight"));
    const char *site[2] = {"attn", "ffn"};
    for (int s = 0; s < 2; s++) {
        add(l, DSV4_DT_F32, 24, 4 * D, 6, "%s.hc_%s_fn", pf, site[s]);
        add(l, DSV4_DT_F32, 24, 0, 6, "%s.hc_%s_base", pf, site[s]);
        add(l, DSV4_DT_F32, 3, 0, 1, "%s.hc_%s_scale", pf, site[s]);
    }
    fp8(l, Q, D, P("attn.wq_a"));
    add(l, DSV4_DT_BF16, Q, 0, 1, "%s", P("attn.q_norm.weight"));
    fp8(l, (int64_t)H * d, Q, P("attn.wq_b"));
    fp8(l, d, D, P("attn.wkv"));
    add(l, DSV4_DT_BF16, d, 0, 1, "%s", P("attn.kv_norm.weight"));
    fp8(l, (int64_t)G * OR, (int64_t)H * d / G, P("attn.wo_a"));
    fp8(l, D, (int64_t)G * OR, P("attn.wo_b"));
    add(l, DSV4_DT_F32, H, 0, 2, "%s", P("attn.attn_sink"));
#undef P
}

/* Gate (and its bias: V4.1 also ships the image tokens' bias_vl) and E routed experts;
 * returns the index of the first expert tensor. The shared expert follows. */
static int add_moe(syn_list *l, const syn_shape *sh, const char *pf, int E, int hash, int v41)
{
    const int D = sh->D, I = sh->I;
    char q[96];
    add(l, DSV4_DT_BF16, E, D, 0, "%s.ffn.gate.weight", pf);
    if (hash)
        add(l, DSV4_DT_I32, sh->V, sh->K, 5, "%s.ffn.gate.tid2eid", pf);
    else
        add(l, DSV4_DT_F32, E, 0, 2, "%s.ffn.gate.bias", pf);
    if (v41)
        add(l, DSV4_DT_F32, E, 0, 2, "%s.ffn.gate.bias_vl", pf);
    int first = l->n;
    for (int e = 0; e < E; e++) {
        snprintf(q, sizeof q, "%s.ffn.experts.%d.w1", pf, e);
        fp4(l, I, D, q);
        snprintf(q, sizeof q, "%s.ffn.experts.%d.w2", pf, e);
        fp4(l, D, I, q);
        snprintf(q, sizeof q, "%s.ffn.experts.%d.w3", pf, e);
        fp4(l, I, D, q);
    }
    return first;
}

static void add_shared(syn_list *l, const syn_shape *sh, const char *pf)
{
    char q[96];
    snprintf(q, sizeof q, "%s.ffn.shared_experts.w1", pf);
    fp8(l, sh->I, sh->D, q);
    snprintf(q, sizeof q, "%s.ffn.shared_experts.w2", pf);
    fp8(l, sh->D, sh->I, q);
    snprintf(q, sizeof q, "%s.ffn.shared_experts.w3", pf);
    fp8(l, sh->I, sh->D, q);
}

static uint64_t table_seed(int ei) { return 0x5eedeeull + (uint64_t)ei; }

/* Builds the config JSON and the safetensors image (an anonymous mapping) of a preset; V4.1:
 * also the Engram token map and, when asked, the table files. */
static int synth_build(const syn_req *rq, syn_out *out, dsv4_err *err)
{
    const char *preset = rq->preset;
    int n_layers = rq->n_layers, expert_layers = rq->expert_layers, in_memory = rq->in_memory;
    memset(out, 0, sizeof *out);
    const syn_shape *sh = !strcmp(preset, "v4-flash") ? &v4_flash : !strcmp(preset, "tiny") ? &tiny
                        : !strcmp(preset, "v4.1-flash") ? &v41_flash : !strcmp(preset, "v4.1-tiny") ? &v41_tiny : NULL;
    if (!sh)
        return dsv4_fail(err, DSV4_E_ARG, "unknown synthetic preset '%s' (known: %s)", preset, DSV4_SYNTHETIC_PRESETS);
    int v41 = sh->s_n > 0, max_layers = v41 ? V41_LAYERS : 43;
    if (n_layers < 1 || n_layers > max_layers)
        return dsv4_fail(err, DSV4_E_ARG, "%d layers: a synthetic %s has 1 to %d", n_layers, preset, max_layers);
    const int V = sh->V, D = sh->D, d = sh->d, Q = sh->Q, E = sh->E, K = sh->K, NI = sh->NI, CI = sh->CI;
    int n_hash = sh == &tiny ? 1 : 0;
    int sched[43];
    v41_plan pl = {0};
    int64_t erows[2] = {0}, evocab = 0;
    if (v41) {
        v41_plan_make(n_layers, &pl);
        for (int i = 0; i < n_layers; i++)
            sched[i] = rel_ratio(pl.rel[i]);
        int64_t want = rq->engram_rows > 0 ? rq->engram_rows : sh->e_rows, cols = (int64_t)(sh->e_ngram - 1) * sh->e_heads;
        if (want < 2 * cols || want > ((int64_t)1 << 40))
            return dsv4_fail(err, DSV4_E_ARG, "%lld Engram rows: a synthetic table has %lld to 2^40", (long long)want,
                             (long long)(2 * cols));
        /* the layout's primes start after engram_vocab_size - 1: a table is cols primes just above it */
        evocab = want / cols;
        int64_t *pr = malloc((size_t)(pl.n_engram ? pl.n_engram : 1) * cols * sizeof *pr);
        if (!pr)
            return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
        dsv4_engram_primes(pl.n_engram, sh->e_ngram, sh->e_heads, evocab, pr);
        for (int i = 0; i < pl.n_engram; i++)
            for (int k = 0; k < cols; k++)
                erows[i] += pr[i * cols + k];
        free(pr);
        v41_config(sh, &pl, evocab, erows, out->cfg, sizeof out->cfg);
    } else {
        /* V4-Flash runs [0, 0] + [4, 128] * 20 + [4]. v4-flash takes N layers from layer 2 on
         * (alternating CSA / HCA: where the cost is); tiny starts with a sliding layer. */
        char ratios[512] = "";
        int pos = 0;
        for (int i = 0; i < n_layers; i++) {
            int j = sh == &tiny ? i : i + 2;
            sched[i] = j < 2 ? 0 : (j % 2 == 0) ? sh->csa : sh->hca;
            pos += snprintf(ratios + pos, sizeof ratios - pos, i ? ",%d" : "%d", sched[i]);
        }
        snprintf(out->cfg, sizeof out->cfg,
             "{\"architectures\":[\"DeepseekV4ForCausalLM\"],\"model_type\":\"deepseek_v4\",\"vocab_size\":%d,"
             "\"hidden_size\":%d,\"num_hidden_layers\":%d,\"num_attention_heads\":%d,\"head_dim\":%d,\"qk_rope_head_dim\":%d,"
             "\"q_lora_rank\":%d,\"o_groups\":%d,\"o_lora_rank\":%d,\"sliding_window\":%d,\"compress_ratios\":[%s],"
             "\"compress_rate_csa\":%d,\"compress_rate_hca\":%d,\"index_n_heads\":%d,\"index_head_dim\":%d,"
             "\"index_topk\":%d,\"n_routed_experts\":%d,\"num_experts_per_tok\":%d,\"n_shared_experts\":1,"
             "\"moe_intermediate_size\":%d,\"num_hash_layers\":%d,\"swiglu_limit\":10.0,\"routed_scaling_factor\":1.5,"
             "\"hc_mult\":4,\"hc_sinkhorn_iters\":20,\"hc_eps\":1e-6,\"rms_norm_eps\":1e-6,\"rope_theta\":10000,"
             "\"compress_rope_theta\":160000,\"max_position_embeddings\":1048576,\"bos_token_id\":0,\"eos_token_id\":1,"
             "\"rope_scaling\":{\"type\":\"yarn\",\"factor\":16,\"original_max_position_embeddings\":65536,\"beta_fast\":32,\"beta_slow\":1},"
             "\"quantization_config\":{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\",\"scale_fmt\":\"ue8m0\",\"weight_block_size\":[%d,%d]},"
             "\"expert_dtype\":\"fp4\",\"num_nextn_predict_layers\":1}",
             V, D, n_layers, sh->H, d, sh->rd, Q, sh->G, sh->OR, sh->W, ratios, sh->csa, sh->hca, NI, CI, sh->topk, E, K, sh->I,
             n_hash, sh->blk, sh->blk);
    }
    if (rq->config_only)
        return 0;
    syn_list l = {.blk = sh->blk};
    int expert_base[43] = {0}, etab[2][2]; /* the Engram tables' rows and scales tensors */
    char p[96];
    add(&l, DSV4_DT_BF16, V, D, 0, "embed.weight");
    add(&l, DSV4_DT_BF16, V, D, 0, "head.weight");
    add(&l, DSV4_DT_BF16, D, 0, 1, "norm.weight");
    if (!v41) {
        add(&l, DSV4_DT_F32, 4, 4 * D, 6, "hc_head_fn");
        add(&l, DSV4_DT_F32, 4, 0, 2, "hc_head_base");
        add(&l, DSV4_DT_F32, 1, 0, 1, "hc_head_scale");
    }
    int ei = 0;
    for (int li = 0; li < n_layers; li++) {
        int m = sched[li], csa = !v41 && m == sh->csa, cw = (1 + csa) * d, r = v41 ? pl.rel[li] : -1;
        char lp[32];
        snprintf(lp, sizeof lp, "layers.%d", li);
#define P(s) (snprintf(p, sizeof p, "layers.%d.%s", li, s), p)
        add_common(&l, sh, lp);
        if (v41 && rel_kv(r)) {
            add(&l, DSV4_DT_BF16, d, D, 0, "%s", P("attn.compressor.wkv.weight"));
            if (m > 1)
                add(&l, DSV4_DT_BF16, d, D, 0, "%s", P("attn.compressor.wgate.weight"));
            add(&l, DSV4_DT_BF16, d, 0, 1, "%s", P("attn.compressor.norm.weight"));
            if (rel_index(r)) {
                add(&l, DSV4_DT_BF16, CI, d, 0, "%s", P("attn.indexer.wk.weight"));
                add(&l, DSV4_DT_BF16, CI, 0, 1, "%s", P("attn.indexer.k_norm.weight"));
            }
        }
        if (v41 && rel_index(r)) {
            fp8(&l, (int64_t)NI * CI, Q, P("attn.indexer.wq_b"));
            add(&l, DSV4_DT_BF16, NI, D, 0, "%s", P("attn.indexer.weights_proj.weight"));
        }
        if (v41 && rel_engram(r)) {
            int cols = (sh->e_ngram - 1) * sh->e_heads;
            /* listed either way, so that every other tensor keeps its seed */
            etab[ei][0] = l.n;
            add(&l, DSV4_DT_F8_E4M3, erows[ei], sh->e_hd, 7, "%s", P("engram.embed.weight"));
            etab[ei][1] = l.n;
            add(&l, DSV4_DT_F8_E8M0, erows[ei], sh->e_hd / 32, 7, "%s", P("engram.embed.scale"));
            l.t[l.n - 1].ext = l.t[l.n - 2].ext = rq->engram_dir != NULL;
            fp8(&l, (int64_t)5 * D, (int64_t)cols * sh->e_hd, P("engram.wkv"));
            add(&l, DSV4_DT_BF16, 4, D, 0, "%s", P("engram.q_weight"));
            add(&l, DSV4_DT_BF16, 4, D, 0, "%s", P("engram.k_weight"));
            ei++;
        }
        if (m && !v41) {
            add(&l, DSV4_DT_BF16, cw, D, 0, "%s", P("attn.compressor.wkv.weight"));
            add(&l, DSV4_DT_BF16, cw, D, 0, "%s", P("attn.compressor.wgate.weight"));
            add(&l, DSV4_DT_F32, m, cw, 2, "%s", P("attn.compressor.ape"));
            add(&l, DSV4_DT_BF16, d, 0, 1, "%s", P("attn.compressor.norm.weight"));
        }
        if (m && csa) {
            add(&l, DSV4_DT_BF16, 2 * CI, D, 0, "%s", P("attn.indexer.compressor.wkv.weight"));
            add(&l, DSV4_DT_BF16, 2 * CI, D, 0, "%s", P("attn.indexer.compressor.wgate.weight"));
            add(&l, DSV4_DT_F32, m, 2 * CI, 2, "%s", P("attn.indexer.compressor.ape"));
            add(&l, DSV4_DT_BF16, CI, 0, 1, "%s", P("attn.indexer.compressor.norm.weight"));
            fp8(&l, (int64_t)NI * CI, Q, P("attn.indexer.wq_b"));
            add(&l, DSV4_DT_BF16, NI, D, 0, "%s", P("attn.indexer.weights_proj.weight"));
        }
#undef P
        int first = add_moe(&l, sh, lp, E, li < n_hash, v41); /* this layer's experts, or those of layer li % expert_layers */
        if (expert_layers > 0 && li >= expert_layers)
            for (int i = first; i < l.n; i++)
                l.t[i].alias = expert_base[li % expert_layers] + (i - first);
        else
            expert_base[li] = first;
        add_shared(&l, sh, lp);
    }
    if (v41) { /* the DSpark stages mtp.0..2 (spec §10): ratio-0 blocks with their own experts (in
                * memory, or when layers share experts, the first of layer 0's bytes); stage 0
                * projects the target features, the last owns the norm and the two heads */
        for (int s = 0; s < sh->s_n; s++) {
            char sp[16];
            snprintf(sp, sizeof sp, "mtp.%d", s);
            add_common(&l, sh, sp);
            int first = add_moe(&l, sh, sp, sh->s_E, 0, 1);
            if (expert_layers > 0 || in_memory)
                for (int i = first; i < l.n; i++)
                    l.t[i].alias = expert_base[0] + (i - first);
            add_shared(&l, sh, sp);
        }
        int last = sh->s_n - 1;
        fp8(&l, D, (int64_t)3 * D, "mtp.0.main_proj");
        add(&l, DSV4_DT_BF16, D, 0, 1, "mtp.0.main_norm.weight");
        add(&l, DSV4_DT_BF16, D, 0, 1, "mtp.%d.norm.weight", last);
        add(&l, DSV4_DT_BF16, V, sh->s_rank, 0, "mtp.%d.markov_head.embed.weight", last);
        add(&l, DSV4_DT_BF16, V, sh->s_rank, 0, "mtp.%d.markov_head.head.weight", last);
        add(&l, DSV4_DT_BF16, 1, D + sh->s_rank, 0, "mtp.%d.confidence_head.proj.weight", last);
    } else { /* V4's MTP stage mtp.0, as the release ships it: a sliding block with its own
              * experts, the input projections and norms, its head mix. In memory (and when
              * layers share experts) its experts are layer 0's bytes: the benchmarks never
              * run it, and a full layer of V4-Flash experts is 3.2 GB. */
        const char *q0 = "mtp.0";
        add_common(&l, sh, q0);
        int first = add_moe(&l, sh, q0, E, 0, 0);
        if (expert_layers > 0 || in_memory)
            for (int i = first; i < l.n; i++)
                l.t[i].alias = expert_base[0] + (i - first);
        add_shared(&l, sh, q0);
        fp8(&l, D, D, "mtp.0.e_proj");
        fp8(&l, D, D, "mtp.0.h_proj");
        add(&l, DSV4_DT_BF16, D, 0, 1, "%s.enorm.weight", q0);
        add(&l, DSV4_DT_BF16, D, 0, 1, "%s.hnorm.weight", q0);
        add(&l, DSV4_DT_BF16, D, 0, 1, "%s.norm.weight", q0);
        add(&l, DSV4_DT_F32, 4, 4 * D, 6, "%s.hc_head_fn", q0);
        add(&l, DSV4_DT_F32, 4, 0, 2, "%s.hc_head_base", q0);
        add(&l, DSV4_DT_F32, 1, 0, 1, "%s.hc_head_scale", q0);
    }
    /* header JSON, then the data, each tensor 64-byte aligned */
    size_t hcap = (size_t)l.n * 160 + 64, hl = 0, off = 0;
    char *hdr = malloc(hcap);
    hl += snprintf(hdr + hl, hcap - hl, "{");
    for (int i = 0, first = 1; i < l.n; i++) {
        syn_t *t = &l.t[i];
        if (t->ext)
            continue;
        off = (off + 63) & ~(size_t)63;
        t->off = t->alias >= 0 ? l.t[t->alias].off : off;
        if (t->nd == 2)
            hl += snprintf(hdr + hl, hcap - hl, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],\"data_offsets\":[%zu,%zu]}",
                           first ? "" : ",", t->name, dsv4_dtype_name(t->dt), (long long)t->shape[0], (long long)t->shape[1], t->off,
                           t->off + t->bytes);
        else
            hl += snprintf(hdr + hl, hcap - hl, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld],\"data_offsets\":[%zu,%zu]}",
                           first ? "" : ",", t->name, dsv4_dtype_name(t->dt), (long long)t->shape[0], t->off, t->off + t->bytes);
        first = 0;
        if (t->alias < 0)
            off += t->bytes;
    }
    hl += snprintf(hdr + hl, hcap - hl, "}");
    size_t hpad = (hl + 7) & ~(size_t)7, total = 8 + hpad + off;
    uint8_t *img = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (img == MAP_FAILED) {
        free(hdr);
        free(l.t);
        return dsv4_fail(err, DSV4_E_NOMEM, "cannot allocate %.1f GB for the synthetic model", total / 1e9);
    }
    uint64_t hlen = hpad;
    memcpy(img, &hlen, 8);
    memcpy(img + 8, hdr, hl);
    memset(img + 8 + hl, ' ', hpad - hl);
    dsv4_progress pr;
    dsv4_progress_begin(&pr, "building synthetic weights", l.n, rq->progress);
    for (int i = 0; i < l.n; i++) {
        if (l.t[i].alias < 0 && l.t[i].kind != 7 && !l.t[i].ext)
            fill(&l.t[i], img + 8 + hpad + l.t[i].off, E, K, 0x5eed0000ull + i);
        dsv4_progress_step(&pr, 1);
    }
    dsv4_progress_end(&pr);
    int rc = 0;
    if (v41) {
        /* Engram tables: the same generator writes them into the image (resident) or into a
         * file (streamed), so either way a row is the same bytes */
        for (int i = 0; i < pl.n_engram && !rc; i++) {
            if (!rq->engram_dir) {
                dsv4_etable_synth_data(img + 8 + hpad + l.t[etab[i][0]].off, img + 8 + hpad + l.t[etab[i][1]].off, erows[i],
                                       sh->e_hd, table_seed(i));
                continue;
            }
            char path[4096], pfx[64];
            snprintf(path, sizeof path, "%s/dsv4-synthetic-engram-%ld-%d.safetensors", rq->engram_dir, (long)getpid(), i);
            snprintf(pfx, sizeof pfx, "layers.%d.engram.embed", pl.engram[i]);
            if (!(out->files[i] = strdup(path)))
                rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
            else
                rc = dsv4_etable_synth(path, pfx, erows[i], sh->e_hd, table_seed(i), 0, err);
            /* on the disk and out of the page cache before the runs, as a table that was not just
             * written is: no writeback during them, and buffered reads start cold */
            int fd = rc ? -1 : open(path, O_RDONLY);
            if (fd >= 0) {
                fsync(fd);
                posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
                close(fd);
            }
        }
        /* the token map: id mod the compressed vocabulary (the release's is built from its
         * tokenizer: 99,092 classes over 129,280 ids) */
        out->vocab = V;
        if (!rc && !(out->token_map = malloc((size_t)V * sizeof(int32_t))))
            rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
        for (int i = 0; !rc && i < V; i++)
            out->token_map[i] = i % sh->e_cv;
    }
    free(hdr);
    free(l.t);
    if (rc) {
        munmap(img, total);
        syn_out_free(out);
        return rc;
    }
    out->img = img;
    out->len = total;
    return 0;
}

int dsv4_synthetic_config(const char *preset, int n_layers, int64_t engram_rows, char *buf, size_t n, dsv4_err *err)
{
    syn_req rq = {.preset = preset, .n_layers = n_layers, .engram_rows = engram_rows, .config_only = 1};
    syn_out out;
    if (synth_build(&rq, &out, err))
        return err->code;
    snprintf(buf, n, "%s", out.cfg);
    return strlen(out.cfg) < n ? 0 : dsv4_fail(err, DSV4_E_ARG, "the synthetic config needs %zu bytes", strlen(out.cfg) + 1);
}

dsv4_model *dsv4_model_synthetic_ext(const char *preset, const dsv4_synth_opts *so, const dsv4_load_opts *opts,
                                     dsv4_err *err)
{
    dsv4_load_opts o = {0};
    if (opts)
        o = *opts;
    syn_req rq = {.preset = preset, .n_layers = so->n_layers, .expert_layers = so->expert_layers, .in_memory = 1,
                  .progress = o.progress, .engram_rows = so->engram_rows};
    if (o.engram_tables == DSV4_ENGRAM_STREAMED)
        rq.engram_dir = so->engram_dir ? so->engram_dir : getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    syn_out out;
    if (synth_build(&rq, &out, err))
        return NULL;
    char label[128];
    int n = snprintf(label, sizeof label, "synthetic:%s/%d", preset, so->n_layers);
    if (so->expert_layers > 0 && so->expert_layers < so->n_layers)
        snprintf(label + n, sizeof label - n, " (experts of %d layers)", so->expert_layers);
    if (o.engram_tables == DSV4_ENGRAM_AUTO)
        o.engram_tables = DSV4_ENGRAM_RESIDENT; /* the tables are where the build put them */
    dsv4_model *m = dsv4_model_from_memory_ext(out.cfg, out.img, out.len, label, (const char *const *)out.files, out.token_map,
                                               &o, err);
    syn_out_free(&out); /* an open model holds its table files by descriptor and mapping */
    return m;
}

dsv4_model *dsv4_model_synthetic(const char *preset, int n_layers, int expert_layers, const dsv4_load_opts *opts,
                                 dsv4_err *err)
{
    dsv4_synth_opts so = {.n_layers = n_layers, .expert_layers = expert_layers};
    return dsv4_model_synthetic_ext(preset, &so, opts, err);
}

int dsv4_synthetic_write(const char *preset, int n_layers, const char *dir, dsv4_err *err)
{
    char path[4096];
    syn_req rq = {.preset = preset, .n_layers = n_layers, .progress = 1};
    syn_out out;
    if (synth_build(&rq, &out, err))
        return err->code;
    mkdir(dir, 0755);
    int rc = 0;
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "wb");
    if (!f || fputs(out.cfg, f) < 0)
        rc = dsv4_fail(err, DSV4_E_IO, "%s: cannot write", path);
    if (f)
        fclose(f);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    f = rc ? NULL : fopen(path, "wb");
    if (!rc && (!f || fwrite(out.img, 1, out.len, f) != out.len))
        rc = dsv4_fail(err, DSV4_E_IO, "%s: cannot write %zu bytes", path, out.len);
    if (f && fclose(f) && !rc)
        rc = dsv4_fail(err, DSV4_E_IO, "%s: write failed", path);
    if (!rc && out.token_map) { /* V4.1: the Engram token map beside the weights */
        snprintf(path, sizeof path, "%s/token_map.json", dir);
        f = fopen(path, "wb");
        int bad = !f || fputs("{\"token_map\":[", f) < 0;
        for (int i = 0; f && !bad && i < out.vocab; i++)
            bad = fprintf(f, i ? ",%d" : "%d", out.token_map[i]) < 0;
        bad = bad || fputs("]}\n", f) < 0;
        if (f && fclose(f))
            bad = 1;
        if (bad)
            rc = dsv4_fail(err, DSV4_E_IO, "%s: cannot write", path);
    }
    munmap(out.img, out.len);
    syn_out_free(&out);
    return rc;
}
