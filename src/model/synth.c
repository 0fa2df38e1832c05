/* Synthetic models: random weights in the release layout and storage forms at real shapes,
 * built in memory as a safetensors image and loaded through the normal binder, so the real
 * per-token cost can be measured without the 150 GB checkpoint. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include "core/core.h"
#include "io/safetensors.h"
#include "model/model.h"

typedef struct syn_t {
    char name[96];
    dsv4_dtype dt;
    int64_t shape[2];
    int nd;
    int kind;   /* fill: 0 weights, 1 ones (norms), 2 zeros, 3 e8m0 weight scale, 4 e8m0 fp4 scale, 5 tid2eid, 6 small f32 */
    int alias;  /* >= 0: shares the bytes of that earlier tensor (same shape) */
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

/* Shapes of a synthetic preset. */
typedef struct syn_shape {
    int V, D, H, d, rd, Q, G, OR, E, K, I, NI, CI, topk, W, csa, hca, blk;
} syn_shape;

static const syn_shape v4_flash = {129280, 4096, 64, 512, 64, 1024, 8, 1024, 256, 6, 2048, 64, 128, 512, 128, 4, 128, 128};
/* A toy at the real vocabulary (so the real tokenizer drives it) with every layer kind. */
static const syn_shape tiny = {129280, 64, 2, 64, 16, 32, 2, 16, 8, 2, 32, 2, 32, 8, 16, 4, 16, 32};

static const syn_shape v41_flash = {129280, 5120, 64, 512, 64, 1280, 8, 1024, 384, 6, 2304, 32, 128, 512, 128, 2, 1, 32};

/* V4.1-Flash's CSA2 schedule in N layers: the first half ratio 2 (layer 0 its KV and index
 * source), the rest ratio 1 (its first layer the KV, index and candidate source, a re-index
 * source every 4 layers after). No Engram: its tables (~190 GB) are measured by engram-bench. */
static int v41_kv_source(int li, int n_layers) { return li == 0 || li == (n_layers + 1) / 2; }
static int v41_index_source(int li, int n_layers)
{
    int h = (n_layers + 1) / 2;
    return li == 0 || (li >= h && (li - h) % 4 == 0);
}

static void v41_config(const syn_shape *sh, int n_layers, int *sched, char *cfg, size_t cfg_n)
{
    int h = (n_layers + 1) / 2, pos = 0, ip = 0, kp = 0;
    char ratios[512] = "", kv[64] = "", idx[512] = "";
    for (int i = 0; i < n_layers; i++) {
        sched[i] = i < h ? 2 : 1;
        pos += snprintf(ratios + pos, sizeof ratios - pos, i ? ",%d" : "%d", sched[i]);
        if (v41_index_source(i, n_layers))
            ip += snprintf(idx + ip, sizeof idx - ip, ip ? ",%d" : "%d", i);
        if (v41_kv_source(i, n_layers))
            kp += snprintf(kv + kp, sizeof kv - kp, kp ? ",%d" : "%d", i);
    }
    snprintf(cfg, cfg_n,
             "{\"architectures\":[\"DeepseekV41ForCausalLM\"],\"model_type\":\"deepseek_v41\",\"bos_token_id\":0,\"eos_token_id\":1,"
             "\"quantization_config\":{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\",\"scale_fmt\":\"ue8m0\",\"weight_block_size\":[32,32],"
             "\"expert_dtype\":\"fp4\"},\"text_config\":{\"vocab_size\":%d,\"hidden_size\":%d,\"num_hidden_layers\":%d,"
             "\"num_attention_heads\":%d,\"head_dim\":%d,\"qk_rope_head_dim\":%d,\"q_lora_rank\":%d,\"o_groups\":%d,"
             "\"o_lora_rank\":%d,\"sliding_window\":%d,\"compress_ratios\":[%s],\"kv_source_layer_ids\":[%s],"
             "\"index_source_layer_ids\":[%s],\"candidate_source_layer_id\":%d,\"candidate_topk_blocks\":2048,"
             "\"candidate_block_size\":8,\"index_n_heads\":%d,\"index_head_dim\":%d,\"index_topk\":%d,"
             "\"n_routed_experts\":%d,\"num_experts_per_tok\":%d,\"n_shared_experts\":1,\"moe_intermediate_size\":%d,"
             "\"swiglu_limit\":10.0,\"routed_scaling_factor\":1.5,\"hc_mult\":4,\"hc_sinkhorn_iters\":20,\"hc_eps\":1e-6,"
             "\"rms_norm_eps\":1e-20,\"rope_theta\":10000,\"compress_rope_theta\":160000,\"max_position_embeddings\":1048576,"
             "\"rope_scaling\":{\"type\":\"yarn\",\"factor\":16,\"original_max_position_embeddings\":65536,\"beta_fast\":32,"
             "\"beta_slow\":1},\"engram_layer_ids\":[]}}",
             sh->V, sh->D, n_layers, sh->H, sh->d, sh->rd, sh->Q, sh->G, sh->OR, sh->W, ratios, kv, idx, h < n_layers ? h : -1,
             sh->NI, sh->CI, sh->topk, sh->E, sh->K, sh->I);
}

/* Builds the config JSON and the safetensors image (an anonymous mapping) of a preset. */
static int synth_build(const char *preset, int n_layers, int expert_layers, int in_memory, int progress, char *cfg, size_t cfg_n,
                       uint8_t **img_out, size_t *len_out, dsv4_err *err)
{
    const syn_shape *sh = !strcmp(preset, "v4-flash") ? &v4_flash : !strcmp(preset, "tiny") ? &tiny
                        : !strcmp(preset, "v4.1-flash") ? &v41_flash : NULL;
    if (!sh)
        return dsv4_fail(err, DSV4_E_ARG, "unknown synthetic preset '%s' (known: v4-flash, v4.1-flash, tiny)", preset);
    int v41 = sh == &v41_flash;
    if (n_layers < 1 || n_layers > 43)
        return dsv4_fail(err, DSV4_E_ARG, "%d layers: a synthetic model has 1 to 43", n_layers);
    const int V = sh->V, D = sh->D, H = sh->H, d = sh->d, Q = sh->Q, G = sh->G, OR = sh->OR, E = sh->E, K = sh->K,
              I = sh->I, NI = sh->NI, CI = sh->CI;
    /* V4-Flash runs [0, 0] + [4, 128] * 20 + [4]. v4-flash takes N layers from layer 2 on
     * (alternating CSA / HCA: where the cost is); tiny starts with a sliding layer. */
    int n_hash = sh == &tiny ? 1 : 0;
    char ratios[512] = "";
    int sched[43], pos = 0;
    for (int i = 0; i < n_layers; i++) {
        int j = sh == &tiny ? i : i + 2;
        sched[i] = j < 2 ? 0 : (j % 2 == 0) ? sh->csa : sh->hca;
        pos += snprintf(ratios + pos, sizeof ratios - pos, i ? ",%d" : "%d", sched[i]);
    }
    if (v41)
        v41_config(sh, n_layers, sched, cfg, cfg_n);
    else
        snprintf(cfg, cfg_n,
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
             V, D, n_layers, H, d, sh->rd, Q, G, OR, sh->W, ratios, sh->csa, sh->hca, NI, CI, sh->topk, E, K, I, n_hash, sh->blk, sh->blk);
    syn_list l = {.blk = sh->blk};
    int expert_base[43] = {0};
    char p[96];
    add(&l, DSV4_DT_BF16, V, D, 0, "embed.weight");
    add(&l, DSV4_DT_BF16, V, D, 0, "head.weight");
    add(&l, DSV4_DT_BF16, D, 0, 1, "norm.weight");
    if (!v41) {
        add(&l, DSV4_DT_F32, 4, 4 * D, 6, "hc_head_fn");
        add(&l, DSV4_DT_F32, 4, 0, 2, "hc_head_base");
        add(&l, DSV4_DT_F32, 1, 0, 1, "hc_head_scale");
    }
    for (int li = 0; li < n_layers; li++) {
        int m = sched[li], csa = !v41 && m == sh->csa, cw = (1 + csa) * d;
#define P(s) (snprintf(p, sizeof p, "layers.%d.%s", li, s), p)
        add(&l, DSV4_DT_BF16, D, 0, 1, "%s", P("attn_norm.weight"));
        add(&l, DSV4_DT_BF16, D, 0, 1, "%s", P("ffn_norm.weight"));
        const char *site[2] = {"attn", "ffn"};
        for (int s = 0; s < 2; s++) {
            add(&l, DSV4_DT_F32, 24, 4 * D, 6, "layers.%d.hc_%s_fn", li, site[s]);
            add(&l, DSV4_DT_F32, 24, 0, 6, "layers.%d.hc_%s_base", li, site[s]);
            add(&l, DSV4_DT_F32, 3, 0, 1, "layers.%d.hc_%s_scale", li, site[s]);
        }
        fp8(&l, Q, D, P("attn.wq_a"));
        add(&l, DSV4_DT_BF16, Q, 0, 1, "%s", P("attn.q_norm.weight"));
        fp8(&l, (int64_t)H * d, Q, P("attn.wq_b"));
        fp8(&l, d, D, P("attn.wkv"));
        add(&l, DSV4_DT_BF16, d, 0, 1, "%s", P("attn.kv_norm.weight"));
        fp8(&l, (int64_t)G * OR, (int64_t)H * d / G, P("attn.wo_a"));
        fp8(&l, D, (int64_t)G * OR, P("attn.wo_b"));
        add(&l, DSV4_DT_F32, H, 0, 2, "%s", P("attn.attn_sink"));
        if (v41 && v41_kv_source(li, n_layers)) {
            add(&l, DSV4_DT_BF16, d, D, 0, "%s", P("attn.compressor.wkv.weight"));
            if (m > 1)
                add(&l, DSV4_DT_BF16, d, D, 0, "%s", P("attn.compressor.wgate.weight"));
            add(&l, DSV4_DT_BF16, d, 0, 1, "%s", P("attn.compressor.norm.weight"));
            add(&l, DSV4_DT_BF16, CI, d, 0, "%s", P("attn.indexer.wk.weight"));
            add(&l, DSV4_DT_BF16, CI, 0, 1, "%s", P("attn.indexer.k_norm.weight"));
        }
        if (v41 && v41_index_source(li, n_layers)) {
            fp8(&l, (int64_t)NI * CI, Q, P("attn.indexer.wq_b"));
            add(&l, DSV4_DT_BF16, NI, D, 0, "%s", P("attn.indexer.weights_proj.weight"));
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
        add(&l, DSV4_DT_BF16, E, D, 0, "%s", P("ffn.gate.weight"));
        if (li < n_hash)
            add(&l, DSV4_DT_I32, V, K, 5, "%s", P("ffn.gate.tid2eid"));
        else
            add(&l, DSV4_DT_F32, E, 0, 2, "%s", P("ffn.gate.bias"));
        int first = l.n; /* this layer's experts, or those of layer li % expert_layers */
        for (int e = 0; e < E; e++) {
            char q[96];
            snprintf(q, sizeof q, "layers.%d.ffn.experts.%d.w1", li, e);
            fp4(&l, I, D, q);
            snprintf(q, sizeof q, "layers.%d.ffn.experts.%d.w2", li, e);
            fp4(&l, D, I, q);
            snprintf(q, sizeof q, "layers.%d.ffn.experts.%d.w3", li, e);
            fp4(&l, I, D, q);
        }
        if (expert_layers > 0 && li >= expert_layers)
            for (int i = first; i < l.n; i++)
                l.t[i].alias = expert_base[li % expert_layers] + (i - first);
        else if (li < 43)
            expert_base[li] = first;
        fp8(&l, I, D, P("ffn.shared_experts.w1"));
        fp8(&l, D, I, P("ffn.shared_experts.w2"));
        fp8(&l, I, D, P("ffn.shared_experts.w3"));
#undef P
    }
    if (!v41) { /* V4's MTP stage mtp.0, as the release ships it: a sliding block with its own
                 * experts, the input projections and norms, its head mix. In memory (and when
                 * layers share experts) its experts are layer 0's bytes: the benchmarks never
                 * run it, and a full layer of V4-Flash experts is 3.2 GB. */
        const char *q0 = "mtp.0";
        add(&l, DSV4_DT_BF16, D, 0, 1, "%s.attn_norm.weight", q0);
        add(&l, DSV4_DT_BF16, D, 0, 1, "%s.ffn_norm.weight", q0);
        const char *site[2] = {"attn", "ffn"};
        for (int s = 0; s < 2; s++) {
            add(&l, DSV4_DT_F32, 24, 4 * D, 6, "%s.hc_%s_fn", q0, site[s]);
            add(&l, DSV4_DT_F32, 24, 0, 6, "%s.hc_%s_base", q0, site[s]);
            add(&l, DSV4_DT_F32, 3, 0, 1, "%s.hc_%s_scale", q0, site[s]);
        }
        fp8(&l, Q, D, "mtp.0.attn.wq_a");
        add(&l, DSV4_DT_BF16, Q, 0, 1, "%s.attn.q_norm.weight", q0);
        fp8(&l, (int64_t)H * d, Q, "mtp.0.attn.wq_b");
        fp8(&l, d, D, "mtp.0.attn.wkv");
        add(&l, DSV4_DT_BF16, d, 0, 1, "%s.attn.kv_norm.weight", q0);
        fp8(&l, (int64_t)G * OR, (int64_t)H * d / G, "mtp.0.attn.wo_a");
        fp8(&l, D, (int64_t)G * OR, "mtp.0.attn.wo_b");
        add(&l, DSV4_DT_F32, H, 0, 2, "%s.attn.attn_sink", q0);
        add(&l, DSV4_DT_BF16, E, D, 0, "%s.ffn.gate.weight", q0);
        add(&l, DSV4_DT_F32, E, 0, 2, "%s.ffn.gate.bias", q0);
        int first = l.n;
        for (int e = 0; e < E; e++) {
            char q[96];
            snprintf(q, sizeof q, "mtp.0.ffn.experts.%d.w1", e);
            fp4(&l, I, D, q);
            snprintf(q, sizeof q, "mtp.0.ffn.experts.%d.w2", e);
            fp4(&l, D, I, q);
            snprintf(q, sizeof q, "mtp.0.ffn.experts.%d.w3", e);
            fp4(&l, I, D, q);
        }
        if (expert_layers > 0 || in_memory)
            for (int i = first; i < l.n; i++)
                l.t[i].alias = expert_base[0] + (i - first);
        fp8(&l, I, D, "mtp.0.ffn.shared_experts.w1");
        fp8(&l, D, I, "mtp.0.ffn.shared_experts.w2");
        fp8(&l, I, D, "mtp.0.ffn.shared_experts.w3");
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
    for (int i = 0; i < l.n; i++) {
        syn_t *t = &l.t[i];
        off = (off + 63) & ~(size_t)63;
        t->off = t->alias >= 0 ? l.t[t->alias].off : off;
        if (t->nd == 2)
            hl += snprintf(hdr + hl, hcap - hl, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],\"data_offsets\":[%zu,%zu]}",
                           i ? "," : "", t->name, dsv4_dtype_name(t->dt), (long long)t->shape[0], (long long)t->shape[1], t->off,
                           t->off + t->bytes);
        else
            hl += snprintf(hdr + hl, hcap - hl, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld],\"data_offsets\":[%zu,%zu]}",
                           i ? "," : "", t->name, dsv4_dtype_name(t->dt), (long long)t->shape[0], t->off, t->off + t->bytes);
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
    dsv4_progress_begin(&pr, "building synthetic weights", l.n, progress);
    for (int i = 0; i < l.n; i++) {
        if (l.t[i].alias < 0)
            fill(&l.t[i], img + 8 + hpad + l.t[i].off, E, K, 0x5eed0000ull + i);
        dsv4_progress_step(&pr, 1);
    }
    dsv4_progress_end(&pr);
    free(hdr);
    free(l.t);
    *img_out = img;
    *len_out = total;
    return 0;
}

dsv4_model *dsv4_model_synthetic(const char *preset, int n_layers, int expert_layers, const dsv4_load_opts *opts,
                                 dsv4_err *err)
{
    char cfg[4096], label[96];
    uint8_t *img;
    size_t total;
    if (synth_build(preset, n_layers, expert_layers, 1, opts && opts->progress, cfg, sizeof cfg, &img, &total, err))
        return NULL;
    if (expert_layers > 0 && expert_layers < n_layers)
        snprintf(label, sizeof label, "synthetic:%s/%d (experts of %d layers)", preset, n_layers, expert_layers);
    else
        snprintf(label, sizeof label, "synthetic:%s/%d", preset, n_layers);
    return dsv4_model_from_memory(cfg, img, total, label, opts, err);
}

int dsv4_synthetic_write(const char *preset, int n_layers, const char *dir, dsv4_err *err)
{
    char cfg[4096], path[4096];
    uint8_t *img;
    size_t total;
    if (synth_build(preset, n_layers, 0, 0, 1, cfg, sizeof cfg, &img, &total, err))
        return err->code;
    mkdir(dir, 0755);
    int rc = 0;
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "wb");
    if (!f || fputs(cfg, f) < 0)
        rc = dsv4_fail(err, DSV4_E_IO, "%s: cannot write", path);
    if (f)
        fclose(f);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    f = rc ? NULL : fopen(path, "wb");
    if (!rc && (!f || fwrite(img, 1, total, f) != total))
        rc = dsv4_fail(err, DSV4_E_IO, "%s: cannot write %zu bytes", path, total);
    if (f && fclose(f) && !rc)
        rc = dsv4_fail(err, DSV4_E_IO, "%s: write failed", path);
    munmap(img, total);
    return rc;
}
