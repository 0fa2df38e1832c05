#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "io/config.h"

static cJSON *get(const cJSON *o, const char *k) { return o ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL; }

/* Number under the first key present; `*found` says whether any was. */
static double num2(const cJSON *o, const char *k1, const char *k2, double dflt, int *found)
{
    const cJSON *v = get(o, k1);
    if (!cJSON_IsNumber(v) && k2)
        v = get(o, k2);
    if (found)
        *found = cJSON_IsNumber(v);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

static int need_int(const cJSON *o, const char *k1, const char *k2, int *out, const char *where, dsv4_err *err)
{
    int f;
    double v = num2(o, k1, k2, 0, &f);
    if (!f && (get(o, k1) || (k2 && get(o, k2))))
        return dsv4_fail(err, DSV4_E_MODEL, "%s: key '%s' must be a non-negative integer", where, get(o, k1) ? k1 : k2);
    if (!f)
        return dsv4_fail(err, DSV4_E_MODEL, "%s: missing key '%s'%s%s%s", where, k1, k2 ? " (or '" : "", k2 ? k2 : "", k2 ? "')" : "");
    if (v != floor(v) || v < 0 || v > 2147483647.0)
        return dsv4_fail(err, DSV4_E_MODEL, "%s: key '%s' must be a non-negative integer", where, k1);
    *out = (int)v;
    return 0;
}

static int int_list(const cJSON *a, int *out, int max, int *n, const char *key, const char *where, dsv4_err *err)
{
    if (!cJSON_IsArray(a))
        return dsv4_fail(err, DSV4_E_MODEL, "%s: '%s' must be a list", where, key);
    int k = 0;
    for (const cJSON *e = a->child; e; e = e->next) {
        if (!cJSON_IsNumber(e) || k >= max)
            return dsv4_fail(err, DSV4_E_MODEL, "%s: '%s' entry %d is not a number (or the list is too long)", where, key, k);
        out[k++] = (int)e->valuedouble;
    }
    *n = k;
    return 0;
}

static void rope_yarn(const cJSON *o, dsv4_rope_cfg *r)
{
    if (!o)
        return;
    const cJSON *t = get(o, "type");
    if (!cJSON_IsString(t))
        t = get(o, "rope_type");
    if (cJSON_IsString(t) && !strcmp(t->valuestring, "yarn")) {
        r->yarn = 1;
        r->factor = num2(o, "factor", NULL, 1.0, NULL);
        r->orig_max_pos = num2(o, "original_max_position_embeddings", NULL, 4096, NULL);
        r->beta_fast = num2(o, "beta_fast", NULL, 32, NULL);
        r->beta_slow = num2(o, "beta_slow", NULL, 1, NULL);
    }
}

int dsv4_config_parse(const char *json, const char *where, dsv4_config *c, dsv4_err *err)
{
    memset(c, 0, sizeof *c);
    cJSON *root = cJSON_Parse(json);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return dsv4_fail(err, DSV4_E_FORMAT, "%s: not a JSON object", where);
    }
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
    int rc = 0;
#define NEED(k1, k2, f) if (!rc) rc = need_int(o, k1, k2, &c->f, where, err)
    NEED("vocab_size", NULL, vocab);
    NEED("hidden_size", "dim", dim);
    NEED("num_hidden_layers", "n_layers", n_layers);
    NEED("num_attention_heads", "n_heads", n_heads);
    NEED("head_dim", NULL, head_dim);
    NEED("q_lora_rank", NULL, q_lora);
    NEED("o_groups", NULL, o_groups);
    NEED("o_lora_rank", NULL, o_lora);
    NEED("sliding_window", "window_size", window);
    NEED("n_routed_experts", NULL, n_experts);
    NEED("num_experts_per_tok", "n_activated_experts", n_active);
    NEED("moe_intermediate_size", "moe_inter_dim", moe_inter);
#undef NEED
    if (rc)
        goto out;
    if (c->n_layers > DSV4_MAX_LAYERS || c->n_layers < 1) {
        rc = dsv4_fail(err, DSV4_E_MODEL, "%s: num_hidden_layers %d out of range 1..%d", where, c->n_layers, DSV4_MAX_LAYERS);
        goto out;
    }
    c->n_shared = (int)num2(o, "n_shared_experts", NULL, 1, NULL);
    c->index_heads = (int)num2(o, "index_n_heads", NULL, 0, NULL);
    c->index_dim = (int)num2(o, "index_head_dim", NULL, 0, NULL);
    c->index_topk = (int)num2(o, "index_topk", NULL, 0, NULL);
    const cJSON *ntp = get(o, "norm_topk_prob");
    c->norm_topk = ntp ? cJSON_IsTrue(ntp) : 1;
    c->route_scale = num2(o, "routed_scaling_factor", "route_scale", 1.0, NULL);
    c->swiglu_limit = num2(o, "swiglu_limit", NULL, 0.0, NULL);
    c->hc_mult = (int)num2(o, "hc_mult", NULL, 4, NULL);
    c->hc_iters = (int)num2(o, "hc_sinkhorn_iters", NULL, 20, NULL);
    c->hc_eps = num2(o, "hc_eps", NULL, 1e-6, NULL);
    c->norm_eps = num2(o, "rms_norm_eps", "norm_eps", 1e-6, NULL);
    c->n_mtp = (int)num2(o, "num_nextn_predict_layers", "n_mtp_layers", 0, NULL);
    c->bos_id = (int)num2(root, "bos_token_id", NULL, 0, NULL);
    c->eos_id = (int)num2(root, "eos_token_id", NULL, 1, NULL);
    c->pad_id = (int)num2(root, "pad_token_id", NULL, 2, NULL);
    c->image_token_id = (int)num2(root, "image_token_id", NULL, -1, NULL);
    c->max_pos = (int64_t)num2(o, "max_position_embeddings", NULL, 65536, NULL);
    const cJSON *sf = get(o, "scoring_func");
    if (cJSON_IsString(sf) && strcmp(sf->valuestring, "sqrtsoftplus")) {
        rc = dsv4_fail(err, DSV4_E_UNSUPPORTED, "%s: scoring_func '%s' (dsv4 implements sqrtsoftplus)", where, sf->valuestring);
        goto out;
    }

    /* rope dims: qk_rope_head_dim, else partial_rotary_factor * head_dim */
    int f;
    double rd = num2(o, "qk_rope_head_dim", "rope_head_dim", 0, &f);
    if (!f) {
        double prf = num2(o, "partial_rotary_factor", NULL, 0, &f);
        const cJSON *rp = get(o, "rope_parameters");
        if (!f && cJSON_IsObject(rp))
            prf = num2(get(rp, "main"), "partial_rotary_factor", NULL, 0, &f);
        if (!f) {
            rc = dsv4_fail(err, DSV4_E_MODEL, "%s: missing key 'qk_rope_head_dim' (or 'partial_rotary_factor')", where);
            goto out;
        }
        rd = prf * c->head_dim;
    }
    c->rope_dim = (int)lround(rd);
    if (c->rope_dim <= 0 || c->rope_dim > c->head_dim || c->rope_dim % 2) {
        rc = dsv4_fail(err, DSV4_E_MODEL, "%s: rope dims %d do not fit head_dim %d", where, c->rope_dim, c->head_dim);
        goto out;
    }

    /* rope thetas and YaRN: flat keys + rope_scaling, or rope_parameters {main, compress} */
    c->rope_main.theta = num2(o, "rope_theta", NULL, 10000.0, NULL);
    c->rope_compress.theta = num2(o, "compress_rope_theta", NULL, 160000.0, NULL);
    const cJSON *rp = get(o, "rope_parameters");
    if (cJSON_IsObject(rp) && (get(rp, "main") || get(rp, "compress"))) {
        c->rope_main.theta = num2(get(rp, "main"), "rope_theta", NULL, c->rope_main.theta, NULL);
        c->rope_compress.theta = num2(get(rp, "compress"), "rope_theta", NULL, c->rope_compress.theta, NULL);
        rope_yarn(get(rp, "compress"), &c->rope_compress);
    } else {
        rope_yarn(get(o, "rope_scaling"), &c->rope_compress);
    }
    if (!c->rope_compress.yarn && num2(o, "rope_factor", NULL, 0, &f) && f) { /* inference/config.json spelling */
        c->rope_compress.yarn = 1;
        c->rope_compress.factor = num2(o, "rope_factor", NULL, 1, NULL);
        c->rope_compress.orig_max_pos = num2(o, "original_seq_len", NULL, 4096, NULL);
        c->rope_compress.beta_fast = num2(o, "beta_fast", NULL, 32, NULL);
        c->rope_compress.beta_slow = num2(o, "beta_slow", NULL, 1, NULL);
    }

    /* layer schedule: layer_types + compress_rates, or compress_ratios (may cover MTP layers too) */
    int csa = 4, hca = 128;
    const cJSON *cr = get(o, "compress_rates");
    if (cJSON_IsObject(cr)) {
        csa = (int)num2(cr, "compressed_sparse_attention", NULL, 4, NULL);
        hca = (int)num2(cr, "heavily_compressed_attention", NULL, 128, NULL);
    }
    csa = (int)num2(o, "compress_rate_csa", NULL, csa, NULL);
    hca = (int)num2(o, "compress_rate_hca", NULL, hca, NULL);
    const cJSON *lt = get(o, "layer_types"), *ratios = get(o, "compress_ratios");
    if (cJSON_IsArray(lt)) {
        if (cJSON_GetArraySize(lt) < c->n_layers) {
            rc = dsv4_fail(err, DSV4_E_MODEL, "%s: 'layer_types' has %d entries for %d layers", where, cJSON_GetArraySize(lt), c->n_layers);
            goto out;
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
                rc = dsv4_fail(err, DSV4_E_MODEL, "%s: 'layer_types'[%d] = '%s' is not a known attention type", where, i, s);
                goto out;
            }
        }
    } else if (cJSON_IsArray(ratios)) {
        int n, tmp[DSV4_MAX_LAYERS * 2];
        if ((rc = int_list(ratios, tmp, DSV4_MAX_LAYERS * 2, &n, "compress_ratios", where, err)))
            goto out;
        if (n < c->n_layers) {
            rc = dsv4_fail(err, DSV4_E_MODEL, "%s: 'compress_ratios' has %d entries for %d layers", where, n, c->n_layers);
            goto out;
        }
        for (int i = 0; i < c->n_layers; i++) {
            c->ratio[i] = tmp[i];
            if (c->family == DSV4_FAMILY_V4 && tmp[i] && tmp[i] != csa && tmp[i] != hca) {
                rc = dsv4_fail(err, DSV4_E_MODEL, "%s: 'compress_ratios'[%d] = %d is neither the CSA rate %d nor the HCA rate %d",
                               where, i, tmp[i], csa, hca);
                goto out;
            }
            c->csa[i] = c->family == DSV4_FAMILY_V4 && tmp[i] == csa;
        }
    } else {
        rc = dsv4_fail(err, DSV4_E_MODEL, "%s: missing key 'layer_types' (or 'compress_ratios')", where);
        goto out;
    }
    for (int i = 0; i < c->n_layers; i++)
        if (c->ratio[i] < 0) {
            rc = dsv4_fail(err, DSV4_E_MODEL, "%s: layer %d has a negative compression ratio", where, i);
            goto out;
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
                rc = dsv4_fail(err, DSV4_E_MODEL, "%s: 'mlp_layer_types'[%d] = '%s' (expected moe or hash_moe)", where, i, s);
                goto out;
            }
        }
    } else {
        int nh = (int)num2(o, "num_hash_layers", "n_hash_layers", 0, NULL);
        for (int i = 0; i < nh && i < c->n_layers; i++)
            c->hash_layer[i] = 1;
    }

    /* weight block size */
    c->fp8_block[0] = c->fp8_block[1] = 128;
    const cJSON *qc = get(root, "quantization_config");
    const cJSON *wbs = get(qc, "weight_block_size");
    if (cJSON_IsArray(wbs) && cJSON_GetArraySize(wbs) == 2) {
        c->fp8_block[0] = cJSON_GetArrayItem(wbs, 0)->valueint;
        c->fp8_block[1] = cJSON_GetArrayItem(wbs, 1)->valueint;
    }

    /* V4.1 */
    if (c->family == DSV4_FAMILY_V41) {
        const cJSON *a;
        if ((a = get(o, "kv_source_layer_ids")) || (a = get(o, "kv_source_layers")))
            if ((rc = int_list(a, c->kv_source, DSV4_MAX_LAYERS, &c->n_kv_source, "kv_source_layer_ids", where, err)))
                goto out;
        if ((a = get(o, "index_source_layer_ids")) || (a = get(o, "index_source_layers")))
            if ((rc = int_list(a, c->index_source, DSV4_MAX_LAYERS, &c->n_index_source, "index_source_layer_ids", where, err)))
                goto out;
        c->candidate_source = (int)num2(o, "candidate_source_layer_id", "candidate_source_layer", -1, NULL);
        c->candidate_topk_blocks = (int)num2(o, "candidate_topk_blocks", NULL, 0, NULL);
        c->candidate_block_size = (int)num2(o, "candidate_block_size", NULL, 1, NULL);
        if ((a = get(o, "engram_layer_ids")))
            if ((rc = int_list(a, c->engram_layer, 8, &c->n_engram, "engram_layer_ids", where, err)))
                goto out;
        const cJSON *er = get(o, "engram_num_embeddings");
        for (int i = 0; i < c->n_engram && cJSON_IsArray(er); i++) {
            const cJSON *e = cJSON_GetArrayItem(er, i);
            c->engram_rows[i] = cJSON_IsNumber(e) ? (int64_t)e->valuedouble : 0;
        }
        c->engram_max_ngram = (int)num2(o, "engram_max_ngram_size", NULL, 4, NULL);
        c->engram_heads = (int)num2(o, "engram_n_heads", NULL, 8, NULL);
        c->engram_head_dim = (int)num2(o, "engram_head_dim", NULL, 256, NULL);
        c->engram_pad_id = (int)num2(o, "engram_pad_id", "engram_pad_token_id", 2, NULL);
        c->engram_vocab_size = (int64_t)num2(o, "engram_vocab_size", NULL, 0, NULL);
        c->engram_compressed_vocab = (int)num2(o, "engram_compressed_vocab_size", NULL, 0, NULL);
    }
out:
    cJSON_Delete(root);
    return rc;
}

int dsv4_config_load(const char *dir, dsv4_config *cfg, dsv4_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f)
        return dsv4_fail(err, DSV4_E_IO, "%s: cannot open: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc(n + 1);
    size_t got = s ? fread(s, 1, n, f) : 0;
    fclose(f);
    if (!s || got != (size_t)n) {
        free(s);
        return dsv4_fail(err, DSV4_E_IO, "%s: read failed", path);
    }
    s[n] = 0;
    int rc = dsv4_config_parse(s, path, cfg, err);
    free(s);
    return rc;
}
