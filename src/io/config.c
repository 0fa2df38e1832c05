#include <cjson/cJSON.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "io/config.h"

/* Every value is read through num_in with its valid range, so a nonsense value fails naming its
 * key before anything divides by it, loops on it or sizes an allocation from it. The state keeps
 * the first failure; later reads return their defaults and the parse stops at the next check. */
typedef struct {
    const char *where;
    dsv4_err *err;
    int rc;
} rd;

enum { F_INT = 1, F_OPEN_LO = 2, F_NEED = 4 };

static const cJSON *get(const cJSON *o, const char *k)
{
    const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
    return cJSON_IsNull(v) ? NULL : v; /* HF configs write null for "not set" */
}

/* Checks the value v (found under pre + key; NULL: absent) is a number in [lo, hi] (lo excluded
 * with F_OPEN_LO; whole numbers only with F_INT). Absent: dflt, or a failure with F_NEED. */
static double check_num(rd *r, const cJSON *v, const char *pre, const char *key, double dflt, double lo, double hi, int f)
{
    if (r->rc)
        return dflt;
    if (!v) {
        if (f & F_NEED)
            r->rc = dsv4_fail(r->err, DSV4_E_MODEL, "%s: missing key '%s%s'", r->where, pre, key);
        return dflt;
    }
    double x = cJSON_IsNumber(v) ? v->valuedouble : 0;
    if (cJSON_IsNumber(v) && isfinite(x) && (!(f & F_INT) || x == floor(x)) && x >= lo && x <= hi &&
        !((f & F_OPEN_LO) && x == lo))
        return x;
    char got[64];
    if (cJSON_IsNumber(v))
        snprintf(got, sizeof got, "it is %.15g", x);
    else
        snprintf(got, sizeof got, "it is not a number");
    r->rc = dsv4_fail(r->err, DSV4_E_MODEL, "%s: key '%s%s' must be %s in %c%.15g, %.15g] (%s)", r->where, pre, key,
                      f & F_INT ? "an integer" : "a number", f & F_OPEN_LO ? '(' : '[', lo, hi, got);
    return dflt;
}

/* check_num of the value under k1, else under k2. */
static double num_in(rd *r, const cJSON *o, const char *pre, const char *k1, const char *k2, double dflt, double lo,
                     double hi, int f)
{
    const char *key = k1;
    const cJSON *v = get(o, k1);
    if (!v && k2)
        v = get(o, key = k2);
    if (!v && (f & F_NEED) && k2 && !r->rc) {
        r->rc = dsv4_fail(r->err, DSV4_E_MODEL, "%s: missing key '%s%s' (or '%s')", r->where, pre, k1, k2);
        return dflt;
    }
    return check_num(r, v, pre, key, dflt, lo, hi, f);
}

static int int_in(rd *r, const cJSON *o, const char *k1, const char *k2, int dflt, double lo, double hi)
{
    return (int)num_in(r, o, "", k1, k2, dflt, lo, hi, F_INT);
}

static int need_int(rd *r, const cJSON *o, const char *k1, const char *k2, double lo, double hi)
{
    return (int)num_in(r, o, "", k1, k2, 0, lo, hi, F_INT | F_NEED);
}

static int bool_in(rd *r, const cJSON *o, const char *k, int dflt)
{
    const cJSON *v = get(o, k);
    if (r->rc || !v)
        return dflt;
    if (!cJSON_IsBool(v))
        r->rc = dsv4_fail(r->err, DSV4_E_MODEL, "%s: key '%s' must be true or false", r->where, k);
    return cJSON_IsTrue(v);
}

/* A list of at most max integers in [lo, hi]; returns its length. */
static int int_list(rd *r, const cJSON *a, const char *key, int *out, int max, double lo, double hi)
{
    if (r->rc)
        return 0;
    if (!cJSON_IsArray(a)) {
        r->rc = dsv4_fail(r->err, DSV4_E_MODEL, "%s: '%s' must be a list", r->where, key);
        return 0;
    }
    int k = 0;
    for (const cJSON *e = a->child; e; e = e->next, k++) {
        double x = cJSON_IsNumber(e) ? e->valuedouble : NAN;
        if (k >= max) {
            r->rc = dsv4_fail(r->err, DSV4_E_MODEL, "%s: '%s' has more than %d entries", r->where, key, max);
            return 0;
        }
        if (!cJSON_IsNumber(e) || !(x >= lo && x <= hi) || x != floor(x)) {
            r->rc = dsv4_fail(r->err, DSV4_E_MODEL, "%s: '%s' entry %d must be an integer in [%.15g, %.15g]", r->where, key, k,
                              lo, hi);
            return 0;
        }
        out[k] = (int)x;
    }
    return k;
}

/* YaRN of the compressed layers, from an object whose path (for messages) is pre. */
static void rope_yarn(rd *r, const cJSON *o, const char *pre, dsv4_rope_cfg *y)
{
    if (!o)
        return;
    const cJSON *t = get(o, "type");
    if (!cJSON_IsString(t))
        t = get(o, "rope_type");
    if (cJSON_IsString(t) && !strcmp(t->valuestring, "yarn")) {
        y->yarn = 1;
        y->factor = num_in(r, o, pre, "factor", NULL, 1.0, 0, DSV4_MAX_ROPE_FACTOR, F_OPEN_LO);
        y->orig_max_pos = num_in(r, o, pre, "original_max_position_embeddings", NULL, 4096, 1, DSV4_MAX_POSITIONS, 0);
        y->beta_fast = num_in(r, o, pre, "beta_fast", NULL, 32, 0, DSV4_MAX_ROPE_FACTOR, F_OPEN_LO);
        y->beta_slow = num_in(r, o, pre, "beta_slow", NULL, 1, 0, DSV4_MAX_ROPE_FACTOR, F_OPEN_LO);
    }
}

/* A token id at the top level: a number, or the first of a list (HF writes eos lists). */
static int token_id(rd *r, const cJSON *root, const char *k, int dflt, int lo, int hi)
{
    const cJSON *v = get(root, k);
    if (cJSON_IsArray(v))
        v = v->child;
    return (int)check_num(r, v, "", k, dflt, lo, hi, F_INT);
}

static void layer_schedule(rd *r, const cJSON *o, dsv4_config *c)
{
    /* layer_types + compress_rates, or compress_ratios (may cover MTP layers too) */
    int csa = 4, hca = 128;
    const cJSON *cr = get(o, "compress_rates");
    if (cJSON_IsObject(cr)) {
        csa = (int)num_in(r, cr, "compress_rates.", "compressed_sparse_attention", NULL, 4, 1, DSV4_MAX_COMPRESS, F_INT);
        hca = (int)num_in(r, cr, "compress_rates.", "heavily_compressed_attention", NULL, 128, 1, DSV4_MAX_COMPRESS, F_INT);
    }
    csa = int_in(r, o, "compress_rate_csa", NULL, csa, 1, DSV4_MAX_COMPRESS);
    hca = int_in(r, o, "compress_rate_hca", NULL, hca, 1, DSV4_MAX_COMPRESS);
    if (r->rc)
        return;
    const cJSON *lt = get(o, "layer_types"), *ratios = get(o, "compress_ratios");
    if (cJSON_IsArray(lt)) {
        if (cJSON_GetArraySize(lt) < c->n_layers) {
            r->rc = dsv4_fail(r->err, DSV4_E_MODEL, "%s: 'layer_types' has %d entries for %d layers", r->where,
                              cJSON_GetArraySize(lt), c->n_layers);
            return;
        }
        for (int i = 0; i < c->n_layers; i++) {
            const cJSON *e = cJSON_GetArrayItem(lt, i);
            const char *s = cJSON_IsString(e) ? e->valuestring : "";
            if (!strcmp(s, "sliding_attention"))
                c->ratio[i] = 0;
            else if (!strcmp(s, "compressed_sparse_attention"))
                c->ratio[i] = csa, c->csa[i] = 1;
            else if (!strcmp(s, "heavily_compressed_attention"))
                c->ratio[i] = hca;
            else {
                r->rc = dsv4_fail(r->err, DSV4_E_MODEL, "%s: 'layer_types'[%d] = '%s' is not a known attention type", r->where,
                                  i, s);
                return;
            }
        }
    } else if (cJSON_IsArray(ratios)) {
        int tmp[DSV4_MAX_LAYERS * 2];
        int n = int_list(r, ratios, "compress_ratios", tmp, DSV4_MAX_LAYERS * 2, 0, DSV4_MAX_COMPRESS);
        if (r->rc)
            return;
        if (n < c->n_layers) {
            r->rc = dsv4_fail(r->err, DSV4_E_MODEL, "%s: 'compress_ratios' has %d entries for %d layers", r->where, n,
                              c->n_layers);
            return;
        }
        for (int i = 0; i < c->n_layers; i++) {
            c->ratio[i] = tmp[i];
            if (c->family == DSV4_FAMILY_V4 && tmp[i] && tmp[i] != csa && tmp[i] != hca) {
                r->rc = dsv4_fail(r->err, DSV4_E_MODEL,
                                  "%s: 'compress_ratios'[%d] = %d is neither the CSA rate %d nor the HCA rate %d", r->where, i,
                                  tmp[i], csa, hca);
                return;
            }
            c->csa[i] = c->family == DSV4_FAMILY_V4 && tmp[i] == csa;
        }
    } else {
        r->rc = dsv4_fail(r->err, DSV4_E_MODEL, "%s: missing key 'layer_types' (or 'compress_ratios')", r->where);
        return;
    }

    /* hash-routed layers: mlp_layer_types, else the first num_hash_layers */
    const cJSON *mlt = get(o, "mlp_layer_types");
    if (cJSON_IsArray(mlt)) {
        for (int i = 0; i < c->n_layers; i++) {
            const cJSON *e = cJSON_GetArrayItem(mlt, i);
            const char *s = cJSON_IsString(e) ? e->valuestring : "";
            if (!strcmp(s, "hash_moe"))
                c->hash_layer[i] = 1;
            else if (strcmp(s, "moe")) {
                r->rc = dsv4_fail(r->err, DSV4_E_MODEL, "%s: 'mlp_layer_types'[%d] = '%s' (expected moe or hash_moe)", r->where,
                                  i, s);
                return;
            }
        }
    } else {
        int nh = int_in(r, o, "num_hash_layers", "n_hash_layers", 0, 0, c->n_layers);
        for (int i = 0; i < nh; i++)
            c->hash_layer[i] = 1;
    }
}

static void rope(rd *r, const cJSON *o, dsv4_config *c)
{
    /* rope dims: qk_rope_head_dim, else partial_rotary_factor * head_dim */
    const cJSON *rp = get(o, "rope_parameters");
    if (get(o, "qk_rope_head_dim") || get(o, "rope_head_dim"))
        c->rope_dim = need_int(r, o, "qk_rope_head_dim", "rope_head_dim", 2, c->head_dim);
    else {
        const cJSON *src = o;
        const char *pre = "";
        if (!get(o, "partial_rotary_factor") && get(get(rp, "main"), "partial_rotary_factor"))
            src = get(rp, "main"), pre = "rope_parameters.main.";
        if (!get(src, "partial_rotary_factor")) {
            r->rc = dsv4_fail(r->err, DSV4_E_MODEL, "%s: missing key 'qk_rope_head_dim' (or 'partial_rotary_factor')", r->where);
            return;
        }
        double prf = num_in(r, src, pre, "partial_rotary_factor", NULL, 0, 0, 1, F_OPEN_LO);
        c->rope_dim = (int)lround(prf * c->head_dim);
    }
    if (r->rc)
        return;
    if (c->rope_dim <= 0 || c->rope_dim > c->head_dim || c->rope_dim % 2) {
        r->rc = dsv4_fail(r->err, DSV4_E_MODEL, "%s: rope dims %d (qk_rope_head_dim, or partial_rotary_factor x head_dim) must be even, "
                          "2..head_dim %d", r->where, c->rope_dim, c->head_dim);
        return;
    }

    /* thetas and YaRN: flat keys + rope_scaling, or rope_parameters {main, compress}. A base of 1
     * or less gives no rotation (and YaRN divides by its log). */
    c->rope_main.theta = num_in(r, o, "", "rope_theta", NULL, 10000.0, 1, DSV4_MAX_ROPE_THETA, F_OPEN_LO);
    c->rope_compress.theta = num_in(r, o, "", "compress_rope_theta", NULL, 160000.0, 1, DSV4_MAX_ROPE_THETA, F_OPEN_LO);
    if (cJSON_IsObject(rp) && (get(rp, "main") || get(rp, "compress"))) {
        c->rope_main.theta = num_in(r, get(rp, "main"), "rope_parameters.main.", "rope_theta", NULL, c->rope_main.theta, 1,
                                    DSV4_MAX_ROPE_THETA, F_OPEN_LO);
        c->rope_compress.theta = num_in(r, get(rp, "compress"), "rope_parameters.compress.", "rope_theta", NULL,
                                        c->rope_compress.theta, 1, DSV4_MAX_ROPE_THETA, F_OPEN_LO);
        rope_yarn(r, get(rp, "compress"), "rope_parameters.compress.", &c->rope_compress);
    } else {
        rope_yarn(r, get(o, "rope_scaling"), "rope_scaling.", &c->rope_compress);
    }
    const cJSON *rf = get(o, "rope_factor"); /* inference/config.json spelling; 0 there means none */
    if (!c->rope_compress.yarn && rf && !(cJSON_IsNumber(rf) && rf->valuedouble == 0)) {
        c->rope_compress.yarn = 1;
        c->rope_compress.factor = num_in(r, o, "", "rope_factor", NULL, 1, 0, DSV4_MAX_ROPE_FACTOR, F_OPEN_LO);
        c->rope_compress.orig_max_pos = num_in(r, o, "", "original_seq_len", NULL, 4096, 1, DSV4_MAX_POSITIONS, 0);
        c->rope_compress.beta_fast = num_in(r, o, "", "beta_fast", NULL, 32, 0, DSV4_MAX_ROPE_FACTOR, F_OPEN_LO);
        c->rope_compress.beta_slow = num_in(r, o, "", "beta_slow", NULL, 1, 0, DSV4_MAX_ROPE_FACTOR, F_OPEN_LO);
    }
}

static void v41_keys(rd *r, const cJSON *o, dsv4_config *c)
{
    const cJSON *a;
    int L = c->n_layers;
    if ((a = get(o, "kv_source_layer_ids")) || (a = get(o, "kv_source_layers")))
        c->n_kv_source = int_list(r, a, "kv_source_layer_ids", c->kv_source, DSV4_MAX_LAYERS, 0, L - 1);
    if ((a = get(o, "index_source_layer_ids")) || (a = get(o, "index_source_layers")))
        c->n_index_source = int_list(r, a, "index_source_layer_ids", c->index_source, DSV4_MAX_LAYERS, 0, L - 1);
    c->candidate_source = int_in(r, o, "candidate_source_layer_id", "candidate_source_layer", -1, -1, L - 1);
    c->candidate_topk_blocks = int_in(r, o, "candidate_topk_blocks", NULL, 0, 0, DSV4_MAX_TOPK);
    c->candidate_block_size = int_in(r, o, "candidate_block_size", NULL, 1, 1, DSV4_MAX_TOPK);
    if ((a = get(o, "engram_layer_ids")))
        c->n_engram = int_list(r, a, "engram_layer_ids", c->engram_layer, DSV4_MAX_ENGRAM, 0, L - 1);
    const cJSON *er = get(o, "engram_num_embeddings");
    if (!r->rc && c->n_engram && (!cJSON_IsArray(er) || cJSON_GetArraySize(er) < c->n_engram)) {
        r->rc = dsv4_fail(r->err, DSV4_E_MODEL, "%s: 'engram_num_embeddings' must be a list of %d row counts (one per engram layer)",
                          r->where, c->n_engram);
        return;
    }
    for (int i = 0; i < c->n_engram && !r->rc; i++) {
        const cJSON *e = cJSON_GetArrayItem(er, i);
        double x = cJSON_IsNumber(e) ? e->valuedouble : -1;
        if (!(x >= 1 && x <= DSV4_MAX_ENGRAM_ROWS) || x != floor(x))
            r->rc = dsv4_fail(r->err, DSV4_E_MODEL, "%s: 'engram_num_embeddings' entry %d must be an integer in [1, %.15g]",
                              r->where, i, (double)DSV4_MAX_ENGRAM_ROWS);
        else
            c->engram_rows[i] = (int64_t)x;
    }
    c->engram_max_ngram = int_in(r, o, "engram_max_ngram_size", NULL, 4, 2, DSV4_MAX_NGRAM);
    c->engram_heads = int_in(r, o, "engram_n_heads", NULL, 8, 1, DSV4_MAX_ENGRAM_HEADS);
    c->engram_head_dim = int_in(r, o, "engram_head_dim", NULL, 256, 1, DSV4_MAX_DIM);
    c->engram_pad_id = int_in(r, o, "engram_pad_id", "engram_pad_token_id", 2, 0, c->vocab - 1);
    c->engram_vocab_size = (int64_t)num_in(r, o, "", "engram_vocab_size", NULL, 0, 0, DSV4_MAX_ENGRAM_VOCAB, F_INT);
    c->engram_compressed_vocab = int_in(r, o, "engram_compressed_vocab_size", NULL, 0, 0, c->vocab);
    if (!c->n_mtp || r->rc)
        return;
    c->spec_block = int_in(r, o, "dspark_block_size", NULL, 5, 1, DSV4_MAX_SPEC_BLOCK);
    c->spec_noise = int_in(r, o, "dspark_noise_token_id", NULL, 0, 0, c->vocab - 1);
    if ((a = get(o, "dspark_target_layer_ids")))
        c->n_spec_target = int_list(r, a, "dspark_target_layer_ids", c->spec_target, DSV4_MAX_SPEC_TARGETS, 0, DSV4_MAX_LAYERS - 1);
    else if (!r->rc)
        r->rc = dsv4_fail(r->err, DSV4_E_MODEL, "%s: %d draft stages (num_nextn_predict_layers) but no 'dspark_target_layer_ids'",
                          r->where, c->n_mtp);
    c->spec_markov_rank = int_in(r, o, "dspark_markov_rank", NULL, 256, 1, DSV4_MAX_DIM);
    c->spec_experts = int_in(r, o, "dspark_n_routed_experts", NULL, c->n_experts, 1, DSV4_MAX_EXPERTS);
    c->spec_active = int_in(r, o, "dspark_num_experts_per_tok", "dspark_n_activated_experts", c->n_active, 1, c->spec_experts);
    if (!r->rc && c->n_spec_target < 1)
        r->rc = dsv4_fail(r->err, DSV4_E_MODEL, "%s: 'dspark_target_layer_ids' is empty", r->where);
}

int dsv4_config_parse(const char *json, const char *where, dsv4_config *c, dsv4_err *err)
{
    memset(c, 0, sizeof *c);
    cJSON *root = cJSON_Parse(json);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return dsv4_fail(err, DSV4_E_FORMAT, "%s: not a JSON object", where);
    }
    rd r = {where, err, 0}, *R = &r;
    const cJSON *o = root, *tc = get(root, "text_config");
    const cJSON *mt = get(root, "model_type");
    c->family = DSV4_FAMILY_V4;
    if (cJSON_IsObject(tc)) {
        o = tc;
        c->family = DSV4_FAMILY_V41;
    }
    if (cJSON_IsString(mt) && !strncmp(mt->valuestring, "deepseek_v41", 12))
        c->family = DSV4_FAMILY_V41;
    if (get(o, "kv_source_layer_ids") || get(o, "kv_source_layers"))
        c->family = DSV4_FAMILY_V41;

    c->vocab = need_int(R, o, "vocab_size", NULL, 1, DSV4_MAX_VOCAB);
    c->dim = need_int(R, o, "hidden_size", "dim", 1, DSV4_MAX_DIM);
    c->n_layers = need_int(R, o, "num_hidden_layers", "n_layers", 1, DSV4_MAX_LAYERS);
    c->n_heads = need_int(R, o, "num_attention_heads", "n_heads", 1, DSV4_MAX_HEADS);
    c->head_dim = need_int(R, o, "head_dim", NULL, 2, DSV4_MAX_HEAD_DIM);
    c->q_lora = need_int(R, o, "q_lora_rank", NULL, 1, DSV4_MAX_DIM);
    c->o_groups = need_int(R, o, "o_groups", NULL, 1, c->n_heads);
    c->o_lora = need_int(R, o, "o_lora_rank", NULL, 1, DSV4_MAX_DIM);
    c->window = need_int(R, o, "sliding_window", "window_size", 1, DSV4_MAX_WINDOW);
    c->n_experts = need_int(R, o, "n_routed_experts", NULL, 1, DSV4_MAX_EXPERTS);
    c->n_active = need_int(R, o, "num_experts_per_tok", "n_activated_experts", 1, c->n_experts);
    c->moe_inter = need_int(R, o, "moe_intermediate_size", "moe_inter_dim", 1, DSV4_MAX_DIM);
    if (!r.rc && (int64_t)c->n_heads * c->head_dim % c->o_groups)
        r.rc = dsv4_fail(err, DSV4_E_MODEL, "%s: key 'o_groups' = %d does not divide num_attention_heads x head_dim = %lld",
                         where, c->o_groups, (long long)c->n_heads * c->head_dim);
    if (r.rc)
        goto out;
    c->n_shared = int_in(R, o, "n_shared_experts", NULL, 1, 0, DSV4_MAX_SHARED);
    c->index_heads = int_in(R, o, "index_n_heads", NULL, 0, 0, DSV4_MAX_HEADS);
    c->index_dim = int_in(R, o, "index_head_dim", NULL, 0, 0, DSV4_MAX_HEAD_DIM);
    c->index_topk = int_in(R, o, "index_topk", NULL, 0, 0, DSV4_MAX_TOPK);
    c->norm_topk = bool_in(R, o, "norm_topk_prob", 1);
    c->route_scale = num_in(R, o, "", "routed_scaling_factor", "route_scale", 1.0, 0, DSV4_MAX_SCALE, F_OPEN_LO);
    c->swiglu_limit = num_in(R, o, "", "swiglu_limit", NULL, 0.0, 0, DSV4_MAX_SCALE, 0);
    c->hc_mult = int_in(R, o, "hc_mult", NULL, 4, 1, DSV4_MAX_HC);
    c->hc_iters = int_in(R, o, "hc_sinkhorn_iters", NULL, 20, 1, DSV4_MAX_SINKHORN_ITERS);
    c->hc_eps = num_in(R, o, "", "hc_eps", NULL, 1e-6, 0, 1, F_OPEN_LO);
    /* the norms run in fp32: an eps below its smallest normal is zero there */
    c->norm_eps = num_in(R, o, "", "rms_norm_eps", "norm_eps", 1e-6, FLT_MIN, 1, 0);
    c->n_mtp = int_in(R, o, "num_nextn_predict_layers", "n_mtp_layers", 0, 0, DSV4_MAX_LAYERS);
    c->bos_id = token_id(R, root, "bos_token_id", 0, 0, c->vocab - 1);
    c->eos_id = token_id(R, root, "eos_token_id", 1, 0, c->vocab - 1);
    c->pad_id = token_id(R, root, "pad_token_id", 2, 0, c->vocab - 1);
    c->image_token_id = token_id(R, root, "image_token_id", -1, -1, INT32_MAX); /* may lie past the text vocabulary */
    c->max_pos = (int64_t)num_in(R, o, "", "max_position_embeddings", NULL, 65536, 1, DSV4_MAX_POSITIONS, F_INT);
    if (r.rc)
        goto out;
    const cJSON *sf = get(o, "scoring_func");
    if (sf && (!cJSON_IsString(sf) || strcmp(sf->valuestring, "sqrtsoftplus"))) {
        r.rc = dsv4_fail(err, DSV4_E_UNSUPPORTED, "%s: scoring_func '%s' (dsv4 implements sqrtsoftplus)", where,
                         cJSON_IsString(sf) ? sf->valuestring : "(not a string)");
        goto out;
    }
    rope(R, o, c);
    if (!r.rc)
        layer_schedule(R, o, c);
    if (r.rc)
        goto out;

    /* weight block size */
    c->fp8_block[0] = c->fp8_block[1] = 128;
    const cJSON *wbs = get(get(root, "quantization_config"), "weight_block_size");
    if (wbs) {
        int n = int_list(R, wbs, "quantization_config.weight_block_size", c->fp8_block, 2, 1, DSV4_MAX_DIM);
        if (!r.rc && n != 2)
            r.rc = dsv4_fail(err, DSV4_E_MODEL, "%s: 'quantization_config.weight_block_size' must be a list of 2 integers", where);
        if (r.rc)
            goto out;
    }
    if (c->family == DSV4_FAMILY_V41)
        v41_keys(R, o, c);
out:
    cJSON_Delete(root);
    return r.rc;
}

int dsv4_config_load(const char *dir, dsv4_config *cfg, dsv4_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *s = dsv4_read_file(path, NULL, err);
    if (!s)
        return err->code;
    int rc = dsv4_config_parse(s, path, cfg, err);
    free(s);
    return rc;
}
