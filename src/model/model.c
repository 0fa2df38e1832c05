/* Loading: config, tensors bound to slots (as stored, no conversion of large weights), rope
 * tables. Every missing or mis-shaped tensor fails naming it. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <sys/mman.h>
#include "core/core.h"
#include "model/engram.h"
#include "model/model.h"
#include "text/token_map.h"

typedef struct binder {
    dsv4_model *m;
    dsv4_err *err;
    dsv4_progress prog;
    int rc;
} binder;

static void bw(binder *b, dsv4_weight *w, int64_t n, int64_t k, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void bw(binder *b, dsv4_weight *w, int64_t n, int64_t k, const char *fmt, ...)
{
    if (b->rc)
        return;
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    b->rc = dsv4_weight_bind(b->m->st, name, n, k, b->m->cfg.fp8_block, w, b->err);
    if (!b->rc) {
        dsv4_weight_scales_e8m0(w); /* power-of-two fp32 scales as e8m0: the same values */
        b->m->weight_bytes += w->bytes;
        dsv4_progress_step(&b->prog, 1);
    }
}

static float *bf(binder *b, int64_t numel, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static float *bf(binder *b, int64_t numel, const char *fmt, ...)
{
    if (b->rc)
        return NULL;
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    float *v = dsv4_tensor_f32(b->m->st, name, numel, b->err);
    if (!v)
        b->rc = b->err->code;
    else {
        b->m->weight_bytes += dsv4_st_find(b->m->st, name)->nbytes;
        dsv4_progress_step(&b->prog, 1);
    }
    return v;
}

static void bind_compressor(binder *b, dsv4_compressor *c, const char *pfx, int ratio, int dim, int overlap)
{
    const dsv4_config *cf = &b->m->cfg;
    int cw = (1 + overlap) * dim;
    c->ratio = ratio;
    c->dim = dim;
    c->overlap = overlap;
    bw(b, &c->wkv, cw, cf->dim, "%s.wkv", pfx);
    bw(b, &c->wgate, cw, cf->dim, "%s.wgate", pfx);
    c->ape = bf(b, (int64_t)ratio * cw, "%s.ape", pfx);
    c->norm = bf(b, dim, "%s.norm.weight", pfx);
}

static void bind_tid2eid(binder *b, dsv4_layer *L, int li)
{
    if (b->rc)
        return;
    const dsv4_config *c = &b->m->cfg;
    char name[128];
    snprintf(name, sizeof name, "layers.%d.ffn.gate.tid2eid", li);
    const dsv4_tensor *t = dsv4_st_find(b->m->st, name);
    if (!t) {
        b->rc = dsv4_fail(b->err, DSV4_E_MODEL, "tensor %s: missing (layer %d is hash-routed)", name, li);
        return;
    }
    if ((t->dtype != DSV4_DT_I32 && t->dtype != DSV4_DT_I64) || t->ndim != 2 || t->shape[0] != c->vocab ||
        t->shape[1] != c->n_active) {
        b->rc = dsv4_fail(b->err, DSV4_E_MODEL, "%s: tensor %s: expected I32 or I64 [%d, %d], found %s with %d dims",
                          dsv4_st_file_path(b->m->st, t->file), name, c->vocab, c->n_active, dsv4_dtype_name(t->dtype), t->ndim);
        return;
    }
    L->tid2eid = malloc(t->numel * sizeof(int32_t));
    for (int64_t i = 0; i < t->numel; i++) {
        int64_t v = t->dtype == DSV4_DT_I32 ? ((const int32_t *)t->data)[i] : ((const int64_t *)t->data)[i];
        if (v < 0 || v >= c->n_experts) {
            b->rc = dsv4_fail(b->err, DSV4_E_MODEL, "%s: tensor %s: entry %lld names expert %lld of %d",
                              dsv4_st_file_path(b->m->st, t->file), name, (long long)i, (long long)v, c->n_experts);
            return;
        }
        L->tid2eid[i] = (int32_t)v;
    }
    dsv4_progress_step(&b->prog, 1);
}

/* What every layer of both families has: norms, hyper-connection mixes, the attention's
 * query/window/output projections. */
static void bind_common(binder *b, dsv4_layer *L, const char *p)
{
    dsv4_model *m = b->m;
    const dsv4_config *c = &m->cfg;
    int D = c->dim, H = c->n_heads, d = c->head_dim, n = c->hc_mult, nm = (2 + n) * n;
    L->attn_norm = bf(b, D, "%s.attn_norm.weight", p);
    L->ffn_norm = bf(b, D, "%s.ffn_norm.weight", p);
    L->hc_attn_fn = bf(b, (int64_t)nm * n * D, "%s.hc_attn_fn", p);
    L->hc_attn_base = bf(b, nm, "%s.hc_attn_base", p);
    L->hc_attn_scale = bf(b, 3, "%s.hc_attn_scale", p);
    L->hc_ffn_fn = bf(b, (int64_t)nm * n * D, "%s.hc_ffn_fn", p);
    L->hc_ffn_base = bf(b, nm, "%s.hc_ffn_base", p);
    L->hc_ffn_scale = bf(b, 3, "%s.hc_ffn_scale", p);
    bw(b, &L->wq_a, c->q_lora, D, "%s.attn.wq_a", p);
    L->q_norm = bf(b, c->q_lora, "%s.attn.q_norm.weight", p);
    bw(b, &L->wq_b, (int64_t)H * d, c->q_lora, "%s.attn.wq_b", p);
    bw(b, &L->wkv, d, D, "%s.attn.wkv", p);
    L->kv_norm = bf(b, d, "%s.attn.kv_norm.weight", p);
    bw(b, &L->wo_a, (int64_t)c->o_groups * c->o_lora, (int64_t)H * d / c->o_groups, "%s.attn.wo_a", p);
    bw(b, &L->wo_b, D, (int64_t)c->o_groups * c->o_lora, "%s.attn.wo_b", p);
    L->sink = bf(b, H, "%s.attn.attn_sink", p);
    L->engram = -1;
}

/* Routed experts (gate, bias or hash table; E of them, K a row) and the shared expert. li:
 * the backbone layer (its hash routing), or -1 for a draft stage. */
static void bind_ffn(binder *b, dsv4_layer *L, int li, const char *p, int E, int K)
{
    const dsv4_config *c = &b->m->cfg;
    int D = c->dim;
    L->n_exp = E;
    L->n_act = K;
    bw(b, &L->gate, E, D, "%s.ffn.gate", p);
    if (b->rc) /* a wrong expert count stops here, before E slots are made */
        return;
    L->hash = li >= 0 && c->hash_layer[li];
    if (L->hash)
        bind_tid2eid(b, L, li);
    else
        L->gate_bias = bf(b, E, "%s.ffn.gate.bias", p);
    L->w1 = calloc(E, sizeof(dsv4_weight));
    L->w2 = calloc(E, sizeof(dsv4_weight));
    L->w3 = calloc(E, sizeof(dsv4_weight));
    if (!L->w1 || !L->w2 || !L->w3) {
        b->rc = dsv4_fail(b->err, DSV4_E_NOMEM, "out of memory for the experts of %s", p);
        return;
    }
    for (int e = 0; e < E && !b->rc; e++) {
        bw(b, &L->w1[e], c->moe_inter, D, "%s.ffn.experts.%d.w1", p, e);
        bw(b, &L->w2[e], D, c->moe_inter, "%s.ffn.experts.%d.w2", p, e);
        bw(b, &L->w3[e], c->moe_inter, D, "%s.ffn.experts.%d.w3", p, e);
    }
    if (c->n_shared > 0) {
        int64_t si = (int64_t)c->moe_inter * c->n_shared;
        bw(b, &L->sw1, si, D, "%s.ffn.shared_experts.w1", p);
        bw(b, &L->sw2, D, si, "%s.ffn.shared_experts.w2", p);
        bw(b, &L->sw3, si, D, "%s.ffn.shared_experts.w3", p);
    }
}

static void bind_layer(binder *b, int li)
{
    dsv4_model *m = b->m;
    const dsv4_config *c = &m->cfg;
    dsv4_layer *L = &m->layers[li];
    int D = c->dim, d = c->head_dim;
    L->ratio = c->ratio[li];
    char p[64];
    snprintf(p, sizeof p, "layers.%d", li);
    bind_common(b, L, p);
    if (L->ratio > 0) {
        L->csa = c->csa[li];
        L->own_ent = 1;
        L->own_ikey = L->csa;
        L->cw = (1 + L->csa) * d;
        L->c_span = (1 + L->csa) * L->ratio;
        L->icw = L->csa ? 2 * c->index_dim : 0;
        char cp[96];
        snprintf(cp, sizeof cp, "%s.attn.compressor", p);
        bind_compressor(b, &L->comp, cp, L->ratio, d, L->csa);
        if (L->csa) {
            if (c->index_topk <= 0 || c->index_heads <= 0 || c->index_dim < c->rope_dim) {
                if (!b->rc)
                    b->rc = dsv4_fail(b->err, DSV4_E_MODEL, "layer %d has an indexer but the config's index_topk/index_n_heads/index_head_dim are missing or too small", li);
                return;
            }
            snprintf(cp, sizeof cp, "%s.attn.indexer.compressor", p);
            bind_compressor(b, &L->icomp, cp, L->ratio, c->index_dim, 1);
            bw(b, &L->iwq_b, (int64_t)c->index_heads * c->index_dim, c->q_lora, "%s.attn.indexer.wq_b", p);
            bw(b, &L->iweights, c->index_heads, D, "%s.attn.indexer.weights_proj", p);
        }
    }
    bind_ffn(b, L, li, p, c->n_experts, c->n_active);
}

static int in_list(const int *v, int n, int x)
{
    for (int i = 0; i < n; i++)
        if (v[i] == x)
            return 1;
    return 0;
}

/* V4.1 (CSA2) roles: every layer with ratio > 0 attends the entries of the latest KV source
 * at or before it and the selection of the latest index source; an index source scores
 * against its KV source's keys. Contradictions fail naming the layer. */
static int v41_roles(dsv4_model *m, dsv4_err *err)
{
    const dsv4_config *c = &m->cfg;
    int kv = -1, ix = -1;
    for (int li = 0; li < c->n_layers; li++) {
        dsv4_layer *L = &m->layers[li];
        L->ratio = c->ratio[li];
        L->index_source = in_list(c->index_source, c->n_index_source, li);
        int is_kv = in_list(c->kv_source, c->n_kv_source, li);
        if ((is_kv || L->index_source) && !L->ratio)
            return dsv4_fail(err, DSV4_E_MODEL, "config: layer %d is a KV or index source but has compress ratio 0", li);
        if (!L->ratio)
            continue;
        if (is_kv) {
            kv = li;
            L->own_ent = 1;
            L->own_ikey = L->index_source;
            L->cw = L->ratio > 1 ? c->head_dim : 0;
            L->c_span = L->ratio > 1 ? L->ratio : 0;
        }
        if (kv < 0 || m->layers[kv].ratio != L->ratio)
            return dsv4_fail(err, DSV4_E_MODEL, "config: layer %d (ratio %d) has no KV source of that ratio at or before it (kv_source_layer_ids)",
                             li, L->ratio);
        L->kv_src = kv;
        if (L->index_source) {
            if (!m->layers[kv].own_ikey)
                return dsv4_fail(err, DSV4_E_MODEL, "config: index source %d reads KV source %d, which is not an index source (no keys)", li, kv);
            if (c->index_topk <= 0 || c->index_heads <= 0 || c->index_dim < c->rope_dim || c->index_dim % 32)
                return dsv4_fail(err, DSV4_E_MODEL, "config: index_topk/index_n_heads/index_head_dim missing or unusable for layer %d", li);
            L->ikey_src = kv;
            ix = li;
        }
        if (ix < 0 || m->layers[ix].kv_src != kv)
            return dsv4_fail(err, DSV4_E_MODEL, "config: layer %d has no index source reading KV source %d at or before it", li, kv);
        L->cand_source = li == c->candidate_source;
        if (L->cand_source && (!L->index_source || c->candidate_block_size <= 0 || c->candidate_topk_blocks <= 0))
            return dsv4_fail(err, DSV4_E_MODEL, "config: candidate_source_layer_id %d is not an index source, or the candidate block size/count is missing", li);
        L->cand_filter = L->index_source && c->candidate_source >= 0 && li > c->candidate_source &&
                         m->layers[c->candidate_source].ikey_src == L->ikey_src;
    }
    for (int i = 0; i < c->n_engram; i++)
        if (c->engram_layer[i] < 0 || c->engram_layer[i] >= c->n_layers)
            return dsv4_fail(err, DSV4_E_MODEL, "config: engram_layer_ids[%d] = %d is not a layer", i, c->engram_layer[i]);
    return 0;
}

static void bind_layer_v41(binder *b, int li)
{
    dsv4_model *m = b->m;
    const dsv4_config *c = &m->cfg;
    dsv4_layer *L = &m->layers[li];
    int D = c->dim, d = c->head_dim, ci = c->index_dim;
    char p[64];
    snprintf(p, sizeof p, "layers.%d", li);
    bind_common(b, L, p);
    if (L->own_ent) {
        L->comp.ratio = L->ratio;
        L->comp.dim = d;
        bw(b, &L->comp.wkv, d, D, "%s.attn.compressor.wkv", p);
        if (L->ratio > 1)
            bw(b, &L->comp.wgate, d, D, "%s.attn.compressor.wgate", p);
        L->comp.norm = bf(b, d, "%s.attn.compressor.norm.weight", p);
    }
    if (L->own_ikey) {
        bw(b, &L->iwk, ci, d, "%s.attn.indexer.wk", p);
        L->ik_norm = bf(b, ci, "%s.attn.indexer.k_norm.weight", p);
    }
    if (L->index_source) {
        bw(b, &L->iwq_b, (int64_t)c->index_heads * ci, c->q_lora, "%s.attn.indexer.wq_b", p);
        bw(b, &L->iweights, c->index_heads, D, "%s.attn.indexer.weights_proj", p);
    }
    bind_ffn(b, L, li, p, c->n_experts, c->n_active);
}

/* V4.1's DSpark stages mtp.0..n-1 (spec §10, §11): each a ratio-0 block with its own
 * experts; stage 0 also projects the target's features, the last one owns the final norm,
 * the Markov head and the confidence head. */
static void bind_spec(binder *b)
{
    dsv4_model *m = b->m;
    const dsv4_config *c = &m->cfg;
    dsv4_spec *S = &m->spec;
    int n = c->n_mtp, D = c->dim, rk = c->spec_markov_rank;
    if (b->rc || c->family != DSV4_FAMILY_V41 || !n)
        return;
    for (int i = 0; i < c->n_spec_target; i++)
        if (c->spec_target[i] >= c->n_layers) {
            b->rc = dsv4_fail(b->err, DSV4_E_MODEL, "config: dspark_target_layer_ids[%d] = %d is not a layer", i, c->spec_target[i]);
            return;
        }
    if (!(S->st = calloc(n, sizeof *S->st))) {
        b->rc = dsv4_fail(b->err, DSV4_E_NOMEM, "out of memory");
        return;
    }
    S->n = n;
    for (int s = 0; s < n && !b->rc; s++) {
        char p[32];
        snprintf(p, sizeof p, "mtp.%d", s);
        bind_common(b, &S->st[s], p);
        bind_ffn(b, &S->st[s], -1, p, c->spec_experts, c->spec_active);
    }
    bw(b, &S->main_proj, D, (int64_t)c->n_spec_target * D, "mtp.0.main_proj");
    S->main_norm = bf(b, D, "mtp.0.main_norm.weight");
    S->norm = bf(b, D, "mtp.%d.norm.weight", n - 1);
    bw(b, &S->mk_embed, c->vocab, rk, "mtp.%d.markov_head.embed", n - 1);
    bw(b, &S->mk_head, c->vocab, rk, "mtp.%d.markov_head.head", n - 1);
    S->conf = bf(b, (int64_t)D + rk, "mtp.%d.confidence_head.proj.weight", n - 1);
}

/* V4's MTP stages mtp.0..n-1 (docs/mtp.md): each a sliding block with the backbone's experts,
 * the projections of the token's embedding and of the target's streams, their norms, and
 * its own head mix and norm before the shared head. */
static void bind_mtp(binder *b)
{
    dsv4_model *m = b->m;
    const dsv4_config *c = &m->cfg;
    dsv4_mtp *M = &m->mtp;
    int n = c->n_mtp, D = c->dim, hc = c->hc_mult;
    if (b->rc || c->family != DSV4_FAMILY_V4 || !n)
        return;
    M->st = calloc(n, sizeof *M->st);
    M->e_proj = calloc(n, sizeof *M->e_proj);
    M->h_proj = calloc(n, sizeof *M->h_proj);
    M->enorm = calloc(n, sizeof(float *));
    M->hnorm = calloc(n, sizeof(float *));
    M->norm = calloc(n, sizeof(float *));
    M->hc_head_fn = calloc(n, sizeof(float *));
    M->hc_head_base = calloc(n, sizeof(float *));
    M->hc_head_scale = calloc(n, sizeof(float *));
    if (!M->st || !M->e_proj || !M->h_proj || !M->enorm || !M->hnorm || !M->norm || !M->hc_head_fn || !M->hc_head_base ||
        !M->hc_head_scale) {
        b->rc = dsv4_fail(b->err, DSV4_E_NOMEM, "out of memory");
        return;
    }
    M->n = n;
    for (int s = 0; s < n && !b->rc; s++) {
        char p[32];
        snprintf(p, sizeof p, "mtp.%d", s);
        bind_common(b, &M->st[s], p);
        bind_ffn(b, &M->st[s], -1, p, c->n_experts, c->n_active);
        bw(b, &M->e_proj[s], D, D, "%s.e_proj", p);
        bw(b, &M->h_proj[s], D, D, "%s.h_proj", p);
        M->enorm[s] = bf(b, D, "%s.enorm.weight", p);
        M->hnorm[s] = bf(b, D, "%s.hnorm.weight", p);
        M->norm[s] = bf(b, D, "%s.norm.weight", p);
        M->hc_head_fn[s] = bf(b, (int64_t)hc * hc * D, "%s.hc_head_fn", p);
        M->hc_head_base[s] = bf(b, hc, "%s.hc_head_base", p);
        M->hc_head_scale[s] = bf(b, 1, "%s.hc_head_scale", p);
    }
}

/* token_map.json ("token_map": [vocab] ids below engram_compressed_vocab_size), as the
 * oracle fixtures ship it (they have no tokenizer). */
static int token_map_json(dsv4_model *m, const char *path, FILE *f, dsv4_err *err)
{
    const dsv4_config *c = &m->cfg;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *txt = malloc(n + 1);
    size_t got = txt ? fread(txt, 1, n, f) : 0;
    fclose(f);
    if (!txt || got != (size_t)n) {
        free(txt);
        return dsv4_fail(err, DSV4_E_IO, "%s: read failed", path);
    }
    txt[n] = 0;
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "token_map");
    int rc = 0;
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != c->vocab)
        rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: 'token_map' must be a list of %d ids", path, c->vocab);
    else if (!(m->token_map = dsv4_xmalloc((size_t)c->vocab * sizeof(int32_t), err)))
        rc = err->code;
    int i = 0;
    for (const cJSON *e = rc ? NULL : a->child; e; e = e->next, i++) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= c->engram_compressed_vocab) {
            rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: token_map[%d] is not an id below engram_compressed_vocab_size %d", path, i,
                           c->engram_compressed_vocab);
            break;
        }
        m->token_map[i] = (int32_t)e->valuedouble;
    }
    cJSON_Delete(j);
    return rc;
}

/* The map built from the checkpoint's tokenizer (spec §9.1); its class count must be the
 * config's engram_compressed_vocab_size (the reference asserts the same). Embedding rows past
 * the tokenizer's vocabulary are ids no tokenizer produces: they take the pad id's class. */
static int token_map_tokenizer(dsv4_model *m, dsv4_err *err)
{
    const dsv4_config *c = &m->cfg;
    int32_t *map = NULL, nc = 0, nv = 0;
    int rc = dsv4_token_map_of_dir(m->dir, &map, &nc, &nv, err);
    if (!rc && (nc != c->engram_compressed_vocab || nv > c->vocab || c->engram_pad_id >= nv))
        rc = dsv4_fail(err, DSV4_E_MODEL, "%s: the tokenizer gives %d Engram token classes over %d ids; the config says %d classes over %d ids (pad %d)",
                       m->dir, nc, nv, c->engram_compressed_vocab, c->vocab, c->engram_pad_id);
    if (!rc && !(m->token_map = dsv4_xmalloc((size_t)c->vocab * sizeof(int32_t), err)))
        rc = err->code;
    for (int i = 0; !rc && i < c->vocab; i++)
        m->token_map[i] = map[i < nv ? i : c->engram_pad_id];
    free(map);
    return rc;
}

static int load_token_map(dsv4_model *m, dsv4_err *err)
{
    const dsv4_config *c = &m->cfg;
    if (c->engram_pad_id < 0 || c->engram_pad_id >= c->vocab)
        return dsv4_fail(err, DSV4_E_MODEL, "config: engram_pad_id %d is not a token", c->engram_pad_id);
    if (m->token_map) { /* given with the model (a synthetic one) */
        for (int i = 0; i < c->vocab; i++)
            if (m->token_map[i] < 0 || m->token_map[i] >= c->engram_compressed_vocab)
                return dsv4_fail(err, DSV4_E_MODEL, "%s: token map entry %d = %d is not below engram_compressed_vocab_size %d",
                                 m->dir, i, m->token_map[i], c->engram_compressed_vocab);
        m->engram_pad = m->token_map[c->engram_pad_id];
        return 0;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/token_map.json", m->dir);
    FILE *f = fopen(path, "rb");
    int rc = f ? token_map_json(m, path, f, err) : token_map_tokenizer(m, err);
    if (!rc)
        m->engram_pad = m->token_map[c->engram_pad_id];
    return rc;
}

/* Engram layers: layout (primes, offsets, multipliers) computed as the reference does, checked
 * against the config's table sizes, then the tensors. */
static void bind_engram(binder *b)
{
    dsv4_model *m = b->m;
    const dsv4_config *c = &m->cfg;
    int ne = c->n_engram, G = c->engram_max_ngram, cols = (G - 1) * c->engram_heads, hd = c->engram_head_dim;
    if (b->rc || !ne)
        return;
    if (G < 2 || G > 8 || c->engram_heads <= 0 || hd <= 0 || hd % 32 || c->engram_vocab_size < 2) {
        b->rc = dsv4_fail(b->err, DSV4_E_MODEL, "config: engram_max_ngram_size %d (2..8), engram_n_heads %d, engram_head_dim %d (multiple of 32) or engram_vocab_size %lld unusable",
                          G, c->engram_heads, hd, (long long)c->engram_vocab_size);
        return;
    }
    if ((b->rc = load_token_map(m, b->err)))
        return;
    m->engram = calloc(ne, sizeof *m->engram);
    int64_t *primes = calloc((size_t)ne * cols, sizeof(int64_t));
    dsv4_engram_primes(ne, G, c->engram_heads, c->engram_vocab_size, primes);
    for (int i = 0; i < ne && !b->rc; i++) {
        dsv4_engram *e = &m->engram[i];
        int li = e->layer = c->engram_layer[i];
        m->layers[li].engram = i;
        e->cols = cols;
        e->prime = malloc(cols * sizeof(int64_t));
        e->offset = malloc(cols * sizeof(int64_t));
        int64_t rows = 0;
        for (int k = 0; k < cols; k++) {
            e->prime[k] = primes[(size_t)i * cols + k];
            e->offset[k] = rows;
            rows += e->prime[k];
        }
        if (rows != c->engram_rows[i]) {
            b->rc = dsv4_fail(b->err, DSV4_E_MODEL, "config: engram_num_embeddings[%d] = %lld, but the layout's primes give %lld rows",
                              i, (long long)c->engram_rows[i], (long long)rows);
            break;
        }
        if (dsv4_engram_multipliers(li, c->engram_compressed_vocab, G, e->mult)) {
            b->rc = dsv4_fail(b->err, DSV4_E_MODEL, "config: engram_compressed_vocab_size %d gives a hash bound numpy draws in 32 bits (unsupported)",
                              c->engram_compressed_vocab);
            break;
        }
        bw(b, &e->wkv, (int64_t)(c->hc_mult + 1) * c->dim, (int64_t)cols * hd, "layers.%d.engram.wkv", li);
        float *q = bf(b, (int64_t)c->hc_mult * c->dim, "layers.%d.engram.q_weight", li);
        float *k = bf(b, (int64_t)c->hc_mult * c->dim, "layers.%d.engram.k_weight", li);
        if (q && k)
            for (int64_t j = 0; j < (int64_t)c->hc_mult * c->dim; j++)
                q[j] *= k[j];
        e->qk = q;
        free(k);
    }
    free(primes);
}

/* inv_freq[i] for i < rd/2, as transformers builds it (fp32 powers); YaRN blends the
 * interpolated and extrapolated frequencies with a linear ramp between the correction dims. */
static float *rope_table(const dsv4_rope_cfg *r, int rd)
{
    int half = rd / 2;
    float *f = malloc(half * sizeof(float));
    double lo = 0, hi = 0;
    if (r->yarn) {
        double b = r->theta, L0 = r->orig_max_pos;
        double cl = rd * log(L0 / (r->beta_fast * 2 * M_PI)) / (2 * log(b));
        double ch = rd * log(L0 / (r->beta_slow * 2 * M_PI)) / (2 * log(b));
        lo = fmax(floor(cl), 0);
        hi = fmin(ceil(ch), rd - 1);
        if (lo == hi)
            hi += 0.001;
    }
    for (int i = 0; i < half; i++) {
        float pf = powf((float)r->theta, (float)(2 * i) / (float)rd);
        float ext = 1.0f / pf;
        if (!r->yarn) {
            f[i] = ext;
            continue;
        }
        float interp = 1.0f / ((float)r->factor * pf);
        float ramp = (float)((i - lo) / (hi - lo));
        ramp = fminf(fmaxf(ramp, 0.0f), 1.0f);
        float e = 1.0f - ramp;
        f[i] = interp * (1.0f - e) + ext * e;
    }
    return f;
}

/* Whether expert e of layer li shares its bytes with an earlier layer's (synthetic models
 * with fewer expert layers): counted, placed and uploaded once. */
static int expert_shared(const dsv4_model *m, int li, int e)
{
    for (int j = 0; j < li; j++)
        if (m->layers[j].w1 && m->layers[j].w1[e].data == m->layers[li].w1[e].data)
            return 1;
    return 0;
}

typedef struct {
    dsv4_place_item *v;
    int64_t n, cap;
    int oom;
} item_list;

/* Appends a bound weight (w) or a float array (a, n); what a model does not have is unbound
 * or NULL, and left out. */
static int add_item(item_list *l, const dsv4_weight *w, const float *a, int64_t n, int64_t expert, int shared)
{
    if (w ? !w->data : !a)
        return 0;
    if (l->n == l->cap) {
        int64_t cap = l->cap ? 2 * l->cap : 256;
        dsv4_place_item *v = realloc(l->v, (size_t)cap * sizeof *v);
        if (!v) {
            l->oom = 1;
            return 0;
        }
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = (dsv4_place_item){.w = w, .a = a, .n = n, .expert = expert, .shared = shared, .slot = -1};
    return 1;
}

/* A routed expert's weight: expert number `expert` overall, `slot` within its layer. */
static int add_expert(item_list *l, const dsv4_weight *w, int64_t expert, int shared, int slot)
{
    int k = add_item(l, w, NULL, 0, expert, shared);
    if (k)
        l->v[l->n - 1].slot = slot;
    return k;
}

/* One layer's arrays and weights, of E routed experts (K a token) numbered from *ne on
 * (shared: a layer before it holds the same expert; main layers only, li >= 0). */
static void layer_items(item_list *l, const dsv4_model *m, const dsv4_layer *L, int li, int E, int K, int64_t *ne)
{
    const dsv4_config *c = &m->cfg;
    int D = c->dim, n = c->hc_mult, nm = (2 + n) * n;
#define W(w) add_item(l, (w), NULL, 0, DSV4_PLACE_HOT, 0)
#define F(p, cnt) add_item(l, NULL, (p), (cnt), DSV4_PLACE_HOT, 0)
    F(L->attn_norm, D);
    F(L->ffn_norm, D);
    F(L->hc_attn_fn, (int64_t)nm * n * D);
    F(L->hc_attn_base, nm);
    F(L->hc_attn_scale, 3);
    F(L->hc_ffn_fn, (int64_t)nm * n * D);
    F(L->hc_ffn_base, nm);
    F(L->hc_ffn_scale, 3);
    F(L->q_norm, c->q_lora);
    F(L->kv_norm, c->head_dim);
    F(L->sink, c->n_heads);
    W(&L->wq_a);
    W(&L->wq_b);
    W(&L->wkv);
    W(&L->wo_a);
    W(&L->wo_b);
    W(&L->gate);
    W(&L->comp.wkv);
    W(&L->comp.wgate);
    F(L->comp.norm, L->comp.dim);
    F(L->comp.ape, (int64_t)L->comp.ratio * (1 + L->comp.overlap) * L->comp.dim);
    W(&L->icomp.wkv);
    W(&L->icomp.wgate);
    F(L->icomp.norm, L->icomp.dim);
    F(L->icomp.ape, (int64_t)L->icomp.ratio * (1 + L->icomp.overlap) * L->icomp.dim);
    F(L->gate_bias, E);
    F((const float *)L->tid2eid, (int64_t)c->vocab * K); /* int32 words, moved as they are */
    W(&L->iwq_b);
    W(&L->iweights);
    W(&L->iwk);
    F(L->ik_norm, c->index_dim);
    for (int e = 0; e < E && L->w1; e++) {
        int sh = li >= 0 && expert_shared(m, li, e);
        int k = add_expert(l, &L->w1[e], *ne, sh, e);
        k += add_expert(l, &L->w2[e], *ne, sh, e);
        k += add_expert(l, &L->w3[e], *ne, sh, e);
        *ne += k > 0;
    }
    if (c->n_shared > 0) {
        W(&L->sw1);
        W(&L->sw2);
        W(&L->sw3);
    }
#undef W
#undef F
}

int dsv4_place_items(const dsv4_model *m, dsv4_place_item **items, int64_t *n_items, dsv4_err *err)
{
    const dsv4_config *c = &m->cfg;
    int D = c->dim, n = c->hc_mult;
    item_list l = {0};
#define W(w) add_item(&l, (w), NULL, 0, DSV4_PLACE_HOT, 0)
#define F(p, cnt) add_item(&l, NULL, (p), (cnt), DSV4_PLACE_HOT, 0)
    add_item(&l, &m->embed, NULL, 0, DSV4_PLACE_EMBED, 0);
    W(&m->head);
    F(m->norm, D);
    F(m->hc_head_fn, (int64_t)n * n * D);
    F(m->hc_head_base, n);
    F(m->hc_head_scale, 1);
    F(m->inv_freq_main, c->rope_dim / 2);
    F(m->inv_freq_compress, c->rope_dim / 2);
    int64_t ne = 0; /* experts numbered in layer order */
    for (int li = 0; li < c->n_layers && m->layers; li++)
        layer_items(&l, m, &m->layers[li], li, c->n_experts, c->n_active, &ne);
    for (int i = 0; i < c->n_engram && m->engram; i++) { /* the tables stay on the host: rows are fetched */
        W(&m->engram[i].wkv);
        F(m->engram[i].qk, (int64_t)n * D);
    }
    /* V4.1's DSpark stages, when the model is loaded to draft (spec_enable) */
    if (m->spec.asked && m->spec.n > 0 && c->family == DSV4_FAMILY_V41) {
        const dsv4_spec *S = &m->spec;
        for (int st = 0; st < S->n; st++)
            layer_items(&l, m, &S->st[st], -1, c->spec_experts, c->spec_active, &ne);
        W(&S->main_proj);
        W(&S->mk_embed);
        W(&S->mk_head);
        F(S->main_norm, D);
        F(S->norm, D);
        F(S->conf, D + c->spec_markov_rank);
    }
    /* V4's MTP stages, when loaded to draft: they run on the model's backend like a layer */
    if (m->mtp.asked && m->mtp.n > 0 && c->family == DSV4_FAMILY_V4) {
        const dsv4_mtp *M = &m->mtp;
        for (int st = 0; st < M->n; st++) {
            layer_items(&l, m, &M->st[st], -1, c->n_experts, c->n_active, &ne);
            W(&M->e_proj[st]);
            W(&M->h_proj[st]);
            F(M->enorm[st], D);
            F(M->hnorm[st], D);
            F(M->norm[st], D);
            F(M->hc_head_fn[st], (int64_t)n * n * D);
            F(M->hc_head_base[st], n);
            F(M->hc_head_scale[st], 1);
        }
    }
#undef W
#undef F
    if (l.oom) {
        free(l.v);
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory listing the weights to place");
    }
    *items = l.v;
    *n_items = l.n;
    return 0;
}

const char *dsv4_model_placement(const dsv4_model *m) { return m->placement; }

double dsv4_device_bandwidth(const char *device)
{
    dsv4_err err;
    const dsv4_backend *be = dsv4_backend_named(device, &err);
    return be && be->copy_bandwidth ? be->copy_bandwidth() : 0;
}

double dsv4_device_host_bandwidth(const char *device)
{
    dsv4_err err;
    const dsv4_backend *be = dsv4_backend_named(device, &err);
    return be && be->host_read_bandwidth ? be->host_read_bandwidth() : 0;
}

void dsv4_device_capture(const char *device, int on)
{
    dsv4_err err;
    const dsv4_backend *be = dsv4_backend_named(device, &err);
    if (be && be->capture)
        be->capture(on);
}

int dsv4_device_probe(const char *device, char *desc, size_t n, dsv4_err *err)
{
    dsv4_err_clear(err);
    const dsv4_backend *be = dsv4_backend_named(device, err);
    if (!be)
        return err->code;
    be->describe(desc, n);
    return 0;
}

/* A checkpoint with tensors of a layer past num_hidden_layers is not the model the config
 * describes (fewer layers than it declares fail as a missing tensor). */
static int check_layer_count(const dsv4_model *m, dsv4_err *err)
{
    const dsv4_config *c = &m->cfg;
    for (int i = 0; i < dsv4_st_count(m->st); i++) {
        const char *name = dsv4_st_at(m->st, i)->name;
        if (strncmp(name, "layers.", 7) || name[7] < '0' || name[7] > '9')
            continue;
        char *end;
        errno = 0;
        unsigned long li = strtoul(name + 7, &end, 10);
        if (*end == '.' && (errno || li >= (unsigned long)c->n_layers))
            return dsv4_fail(err, DSV4_E_MODEL, "%s: tensor %s is of layer %lu, but the config's num_hidden_layers is %d",
                             dsv4_st_label(m->st), name, li, c->n_layers);
    }
    return 0;
}

/* Binds every tensor of m->st to its slot and builds the rope tables; m->cfg is set. */
static int model_bind(dsv4_model *m, const dsv4_load_opts *o, dsv4_err *err)
{
    const dsv4_config *c = &m->cfg;
    if (check_layer_count(m, err))
        return err->code;
    m->layers = calloc(c->n_layers, sizeof(dsv4_layer));
    if (!m->layers)
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    int v41 = c->family == DSV4_FAMILY_V41;
    if (v41 && v41_roles(m, err))
        return err->code;
    binder b = {.m = m, .err = err};
    int per_layer = 20 + 3 * c->n_experts;
    dsv4_progress_begin(&b.prog, "loading", (uint64_t)per_layer * c->n_layers + 6 + 4 * c->n_engram, o->progress);
    bw(&b, &m->embed, c->vocab, c->dim, "embed");
    bw(&b, &m->head, c->vocab, c->dim, "head");
    m->norm = bf(&b, c->dim, "norm.weight");
    if (!v41) { /* V4.1 collapses with the last FFN site's pre instead of a head mix */
        m->hc_head_fn = bf(&b, (int64_t)c->hc_mult * c->hc_mult * c->dim, "hc_head_fn");
        m->hc_head_base = bf(&b, c->hc_mult, "hc_head_base");
        m->hc_head_scale = bf(&b, 1, "hc_head_scale");
    }
    for (int i = 0; i < c->n_layers && !b.rc; i++) {
        if (v41)
            bind_layer_v41(&b, i);
        else
            bind_layer(&b, i);
    }
    bind_engram(&b);
    bind_spec(&b);
    bind_mtp(&b);
    b.prog.total = b.prog.done;
    dsv4_progress_end(&b.prog);
    if (b.rc)
        return b.rc;
    if (dsv4_engram_open(m, o->engram_tables, err))
        return err->code;
    m->inv_freq_main = rope_table(&c->rope_main, c->rope_dim);
    m->inv_freq_compress = rope_table(&c->rope_compress, c->rope_dim);
    return 0;
}

/* Settles options and checks what the config asks for against what this build runs. */
static dsv4_model *model_new(const dsv4_load_opts *o, const char *dir, dsv4_err *err)
{
    dsv4_err_clear(err);
    if (!dsv4_backend_named(o->device, err)) /* unknown, or not in this build or on this machine */
        return NULL;
    dsv4_model *m = calloc(1, sizeof *m);
    if (!m) {
        dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
        return NULL;
    }
    m->dir = strdup(dir);
    m->be = m->mem = dsv4_backend_cpu();
    m->max_rollback = o->max_rollback > 0 ? o->max_rollback : 256;
    if (o->n_threads > 0)
        omp_set_num_threads(o->n_threads);
    return m;
}

/* The KV cache format: production where asked (or AUTO) and the backend keeps it. */
static int model_kv(dsv4_model *m, const dsv4_load_opts *o, const dsv4_backend *be, dsv4_err *err)
{
    if (o->kv < DSV4_KV_DEFAULT || o->kv > DSV4_KV_AUTO)
        return dsv4_fail(err, DSV4_E_ARG, "kv cache format %d is unknown (exact, production, auto)", o->kv);
    if (o->kv == DSV4_KV_PRODUCTION && !be->kv_production)
        return dsv4_fail(err, DSV4_E_UNSUPPORTED,
                         "--kv production: the %s backend does not keep production KV caches yet (it keeps exact fp32 "
                         "ones: use --kv exact)", be->name);
    m->kv_prod = o->kv == DSV4_KV_PRODUCTION || (o->kv == DSV4_KV_AUTO && be->kv_production);
    if (m->kv_prod && (m->cfg.head_dim % 2 || m->cfg.index_dim % 2))
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "%s: production KV caches pack two e2m1 values a byte; head_dim %d and "
                         "index_head_dim %d must be even", m->dir, m->cfg.head_dim, m->cfg.index_dim);
    return 0;
}

const char *dsv4_model_kv(const dsv4_model *m) { return m->kv_prod ? "production" : "exact"; }

static int model_check(dsv4_model *m, const dsv4_load_opts *o, dsv4_err *err)
{
    const dsv4_config *c = &m->cfg;
    const dsv4_backend *be = dsv4_backend_named(o->device, err);
    if (!be || model_kv(m, o, be, err))
        return err->code;
    /* V4.1 defaults to its release reference's rounding (REF) on every backend that has the
     * rounding ops; V4 runs fp32 unless REF is asked for (its fixtures are exact-math
     * references, and no V4 reference in REF numerics exists to check a default against) */
    int rounds = be->linear_q && be->round_bf16 && be->roundtrip;
    m->numerics = o->numerics ? o->numerics
                              : (c->family == DSV4_FAMILY_V41 && rounds ? DSV4_NUMERICS_REF : DSV4_NUMERICS_FP32);
    if (m->numerics == DSV4_NUMERICS_REF && (!be->linear_q || !be->round_bf16 || !be->roundtrip))
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "numerics 'ref': the %s backend has no REF rounding ops", be->name);
    for (int i = 0; i < c->n_layers; i++)
        if (c->ratio[i] > DSV4_MAX_RATIO)
            return dsv4_fail(err, DSV4_E_UNSUPPORTED, "%s: layer %d compresses by %d (at most %d)", m->dir, i, c->ratio[i],
                             DSV4_MAX_RATIO);
    return 0;
}

/* Moves the weights to the chosen device: a device backend holds every array its ops read (the
 * CPU backend reads them where they are mapped). The list is kept: freeing the model drops what
 * the backend took. */
static int model_place(dsv4_model *m, const dsv4_load_opts *o, dsv4_err *err)
{
    const dsv4_backend *be = dsv4_backend_named(o->device, err);
    if (!be)
        return err->code;
    if (!be->place)
        return 0;
    m->be = be;
    m->spec.asked = m->mtp.asked = o->draft_stages; /* the stages are placed only to draft */
    m->mem = be;
    if (dsv4_place_items(m, &m->placed, &m->n_placed, err) ||
        be->place(m->placed, m->n_placed, m->placement, sizeof m->placement, &m->experts_host, err))
        return dsv4_err_prefix(err, "%s: putting the weights on the %s device", m->dir, be->name);
    return 0;
}

/* The draft stages run when asked for, on the model's backend: V4's MTP stage and V4.1's
 * DSpark stages keep their windows in the model's memory, moved by its copies. Otherwise the
 * sequences keep no stage windows and a draft is refused. */
static void spec_enable(dsv4_model *m, const dsv4_load_opts *o)
{
    m->spec.on = m->spec.n > 0 && o->draft_stages;
    m->mtp.on = m->mtp.n > 0 && o->draft_stages;
    m->spec.asked = m->mtp.asked = o->draft_stages;
}

dsv4_model *dsv4_model_load(const char *dir, const dsv4_load_opts *opts, dsv4_err *err)
{
    dsv4_load_opts o = {0};
    if (opts)
        o = *opts;
    dsv4_model *m = model_new(&o, dir, err);
    if (!m)
        return NULL;
    if (dsv4_config_load(dir, &m->cfg, err) || model_check(m, &o, err) || !(m->st = dsv4_st_open_dir(dir, err)) ||
        model_bind(m, &o, err) || model_place(m, &o, err)) {
        dsv4_model_free(m);
        return NULL;
    }
    spec_enable(m, &o);
    return m;
}

dsv4_model *dsv4_model_from_memory(const char *config_json, void *st_image, size_t st_len, const char *label,
                                   const dsv4_load_opts *opts, dsv4_err *err)
{
    return dsv4_model_from_memory_ext(config_json, st_image, st_len, label, NULL, NULL, opts, err);
}

dsv4_model *dsv4_model_from_memory_ext(const char *config_json, void *st_image, size_t st_len, const char *label,
                                       const char *const *files, const int32_t *token_map, const dsv4_load_opts *opts,
                                       dsv4_err *err)
{
    dsv4_load_opts o = {0};
    if (opts)
        o = *opts;
    dsv4_model *m = model_new(&o, label, err);
    if (!m || dsv4_config_parse(config_json, label, &m->cfg, err) || model_check(m, &o, err)) {
        munmap(st_image, st_len); /* the image is the set's once it is opened; until then, ours */
        dsv4_model_free(m);
        return NULL;
    }
    if (!(m->st = dsv4_st_open_memory(st_image, st_len, label, err))) {
        dsv4_model_free(m);
        return NULL;
    }
    for (int i = 0; files && files[i]; i++)
        if (dsv4_st_add_file(m->st, files[i], err)) {
            dsv4_model_free(m);
            return NULL;
        }
    if (token_map && m->cfg.n_engram) {
        if (!(m->token_map = dsv4_xmalloc((size_t)m->cfg.vocab * sizeof(int32_t), err))) {
            dsv4_model_free(m);
            return NULL;
        }
        memcpy(m->token_map, token_map, (size_t)m->cfg.vocab * sizeof(int32_t));
    }
    if (model_bind(m, &o, err) || model_place(m, &o, err)) {
        dsv4_model_free(m);
        return NULL;
    }
    spec_enable(m, &o);
    return m;
}

static void free_compressor(dsv4_compressor *c)
{
    free(c->ape);
    free(c->norm);
}

/* Every linear weight slot of the model (EXL3 weights own a small decoded record). */
static void release_layer(dsv4_layer *L)
{
    dsv4_weight *all[] = {&L->wq_a, &L->wq_b, &L->wkv, &L->wo_a, &L->wo_b, &L->comp.wkv, &L->comp.wgate,
                          &L->icomp.wkv, &L->icomp.wgate, &L->iwq_b, &L->iweights, &L->iwk, &L->gate,
                          &L->sw1, &L->sw2, &L->sw3};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
        dsv4_weight_release(all[k]);
    for (int e = 0; e < L->n_exp; e++) {
        if (L->w1)
            dsv4_weight_release(&L->w1[e]);
        if (L->w2)
            dsv4_weight_release(&L->w2[e]);
        if (L->w3)
            dsv4_weight_release(&L->w3[e]);
    }
}

static void release_weights(dsv4_model *m)
{
    dsv4_weight_release(&m->embed);
    dsv4_weight_release(&m->head);
    for (int i = 0; m->layers && i < m->cfg.n_layers; i++)
        release_layer(&m->layers[i]);
    for (int i = 0; m->spec.st && i < m->spec.n; i++)
        release_layer(&m->spec.st[i]);
    dsv4_weight *sw[] = {&m->spec.main_proj, &m->spec.mk_embed, &m->spec.mk_head};
    for (size_t k = 0; k < sizeof sw / sizeof sw[0]; k++)
        dsv4_weight_release(sw[k]);
    for (int i = 0; m->mtp.st && i < m->mtp.n; i++) {
        release_layer(&m->mtp.st[i]);
        dsv4_weight_release(&m->mtp.e_proj[i]);
        dsv4_weight_release(&m->mtp.h_proj[i]);
    }
    for (int i = 0; m->engram && i < m->cfg.n_engram; i++)
        dsv4_weight_release(&m->engram[i].wkv);
}

static void free_layer(dsv4_layer *L)
{
    free(L->attn_norm);
    free(L->ffn_norm);
    free(L->hc_attn_fn);
    free(L->hc_attn_base);
    free(L->hc_attn_scale);
    free(L->hc_ffn_fn);
    free(L->hc_ffn_base);
    free(L->hc_ffn_scale);
    free(L->q_norm);
    free(L->kv_norm);
    free(L->sink);
    free_compressor(&L->comp);
    free_compressor(&L->icomp);
    free(L->gate_bias);
    free(L->tid2eid);
    free(L->w1);
    free(L->w2);
    free(L->w3);
    free(L->ik_norm);
}

void dsv4_model_free(dsv4_model *m)
{
    if (!m)
        return;
    dsv4_graphs_free(m);
    dsv4_arena_free(m);
    if (m->placed)
        m->be->unplace(m->placed, m->n_placed);
    free(m->placed);
    release_weights(m);
    for (int i = 0; m->layers && i < m->cfg.n_layers; i++)
        free_layer(&m->layers[i]);
    free(m->layers);
    for (int i = 0; m->spec.st && i < m->spec.n; i++)
        free_layer(&m->spec.st[i]);
    free(m->spec.st);
    free(m->spec.main_norm);
    free(m->spec.norm);
    free(m->spec.conf);
    for (int i = 0; m->mtp.st && i < m->mtp.n; i++) {
        free_layer(&m->mtp.st[i]);
        free(m->mtp.enorm[i]);
        free(m->mtp.hnorm[i]);
        free(m->mtp.norm[i]);
        free(m->mtp.hc_head_fn[i]);
        free(m->mtp.hc_head_base[i]);
        free(m->mtp.hc_head_scale[i]);
    }
    dsv4_mtp *M = &m->mtp;
    void *mp[] = {M->st, M->e_proj, M->h_proj, M->enorm, M->hnorm, M->norm, M->hc_head_fn, M->hc_head_base, M->hc_head_scale};
    for (size_t k = 0; k < sizeof mp / sizeof mp[0]; k++)
        free(mp[k]);
    dsv4_engram_close(m);
    for (int i = 0; m->engram && i < m->cfg.n_engram; i++) {
        free(m->engram[i].prime);
        free(m->engram[i].offset);
        free(m->engram[i].qk);
    }
    free(m->engram);
    free(m->token_map);
    free(m->norm);
    free(m->hc_head_fn);
    free(m->hc_head_base);
    free(m->hc_head_scale);
    free(m->inv_freq_main);
    free(m->inv_freq_compress);
    dsv4_st_close(m->st);
    free(m->dir);
    free(m);
}

int dsv4_model_experts_in_host(const dsv4_model *m) { return m->experts_host; }

void dsv4_model_get_info(const dsv4_model *m, dsv4_model_info *out)
{
    const dsv4_config *c = &m->cfg;
    out->family = c->family == DSV4_FAMILY_V41 ? "deepseek_v41" : "deepseek_v4";
    out->vocab_size = c->vocab;
    out->hidden_size = c->dim;
    out->n_layers = c->n_layers;
    out->n_heads = c->n_heads;
    out->head_dim = c->head_dim;
    out->bos_id = c->bos_id;
    out->eos_id = c->eos_id;
    out->max_position = c->max_pos;
    out->weight_bytes = m->weight_bytes;
}
