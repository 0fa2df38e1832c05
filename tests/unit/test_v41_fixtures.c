/* The V4.1 oracle fixture (tests/fixtures/v41/v41-tiny-a, or folders given as arguments).
 *
 * Engram: primes, offsets and multipliers computed in C equal token_map.json's (the
 * reference's numpy draw), and the hash of every position of case0 equals case0.engram_hash.
 *
 * --numerics fp32 against the ideal-math oracle expected_fp64.safetensors, both paths (one
 * prefill vs caseN.logits; prefill P then one-token decodes vs caseN.inc_logits): max|logit -
 * ref| <= 1e-4 * max|ref| and the same argmax wherever the top-two gap exceeds 1e-3 (the
 * fixture README's tight gate, not to be loosened). Seams in both modes: chunks of 1, 2, 3, 7
 * == one prefill bit for bit; copy, save/restore and rollback == an uninterrupted run;
 * two sequences in one step == each alone.
 * DSV4_TEST_DEVICE=cuda runs the checks of both modes through the CUDA backend.
 *
 * --numerics ref against the bf16 reference's prefill logits (expected.safetensors), both
 * paths, as the README recommends: within 2e-2 at every position before the first one where
 * the reference's own fp32-accumulation gauge (logits_acc32) departs from logits by > 1e-2;
 * over the whole case, argmax agreement >= 75% and mean |diff| <= 0.1. */
#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "core/core.h"
#include "io/safetensors.h"
#include "model/diag.h"
#include "model/engram.h"
#include "fixtures.h"

static int64_t jint(const cJSON *a, int i) { return (int64_t)cJSON_GetArrayItem(a, i)->valuedouble; }

/* The multipliers exceed 2^53, beyond what cJSON's doubles hold: read them from the text. */
static int read_multipliers(const char *txt, int ne, int G, int64_t out[8][8])
{
    const char *p = strstr(txt, "\"multipliers\"");
    if (!p || ne > 8 || G > 8)
        return -1;
    for (int l = 0; l < ne; l++)
        for (int i = 0; i < G; i++) {
            while (*p && (*p < '0' || *p > '9'))
                p++;
            char *e;
            out[l][i] = strtoll(p, &e, 10);
            if (e == p)
                return -1;
            p = e;
        }
    return 0;
}

static void engram_checks(const char *dir, const cJSON *cfg, const cJSON *tm, const char *tm_txt, const dsv4_tensor *hash,
                          const cJSON *ids0)
{
    int ne = cJSON_GetArraySize(cJSON_GetObjectItem(cfg, "engram_layer_ids"));
    int G = cJSON_GetObjectItem(cfg, "engram_max_ngram_size")->valueint, H = cJSON_GetObjectItem(cfg, "engram_n_heads")->valueint;
    int64_t vs = (int64_t)cJSON_GetObjectItem(cfg, "engram_vocab_size")->valuedouble;
    int64_t cv = (int64_t)cJSON_GetObjectItem(tm, "compressed_vocab_size")->valuedouble;
    int cols = (G - 1) * H;
    const cJSON *jp = cJSON_GetObjectItem(tm, "primes"), *jo = cJSON_GetObjectItem(tm, "offsets");
    const cJSON *map = cJSON_GetObjectItem(tm, "token_map");
    int64_t *primes = calloc((size_t)ne * cols, sizeof(int64_t)), off[8][64], mult[8][8], want[8][8];
    CHECK(!read_multipliers(tm_txt, ne, G, want), "%s: token_map.json has no readable multipliers", dir);
    dsv4_engram_primes(ne, G, H, vs, primes);
    int bad_p = 0, bad_o = 0, bad_m = 0;
    for (int l = 0; l < ne; l++) {
        int layer = (int)jint(cJSON_GetObjectItem(cfg, "engram_layer_ids"), l);
        int64_t o = 0;
        for (int c = 0; c < cols; c++) {
            bad_p += primes[l * cols + c] != jint(cJSON_GetArrayItem(cJSON_GetArrayItem(jp, l), c / H), c % H);
            off[l][c] = o;
            bad_o += o != jint(cJSON_GetArrayItem(jo, l), c);
            o += primes[l * cols + c];
        }
        CHECK(!dsv4_engram_multipliers(layer, cv, G, mult[l]), "%s: multipliers of layer %d", dir, layer);
        for (int i = 0; i < G; i++)
            bad_m += mult[l][i] != want[l][i];
    }
    CHECK(!bad_p && !bad_o && !bad_m, "engram layout: %d primes, %d offsets, %d multipliers differ from token_map.json", bad_p,
          bad_o, bad_m);
    int T = cJSON_GetArraySize(ids0), bad_h = 0;
    int64_t pad = (int64_t)cJSON_GetObjectItem(tm, "pad_id")->valuedouble;
    CHECK(hash && hash->dtype == DSV4_DT_I64 && hash->numel == (int64_t)T * ne * cols, "case0.engram_hash missing or mis-shaped");
    for (int t = 0; hash && t < T; t++) {
        int64_t tok[8], got[64];
        for (int k = 0; k < G; k++)
            tok[k] = t - k >= 0 ? jint(map, (int)jint(ids0, t - k)) : pad;
        for (int l = 0; l < ne; l++) {
            dsv4_engram_hash(tok, mult[l], primes + l * cols, off[l], G, H, got);
            for (int c = 0; c < cols; c++)
                bad_h += got[c] != ((const int64_t *)hash->data)[((int64_t)t * ne + l) * cols + c];
        }
    }
    CHECK(!bad_h, "engram hash: %d of %d row ids differ from case0.engram_hash", bad_h, T * ne * cols);
    printf("  engram layout/multipliers/hash: %d/%d/%d mismatches\n", bad_p + bad_o, bad_m, bad_h);
    free(primes);
}

/* REF mode statistics against the bf16 reference: max |diff| before the first position where
 * the gauge departs, argmax agreement and mean |diff| over the case. */
static void ref_compare(const char *what, const float *got, const float *ref, const float *acc32, int T, int V)
{
    int first = T;
    for (int t = 0; t < T && first == T; t++)
        for (int v = 0; v < V; v++)
            if (fabsf(acc32[(size_t)t * V + v] - ref[(size_t)t * V + v]) > 1e-2f) {
                first = t;
                break;
            }
    double md = 0, sum = 0;
    int agree = 0, dep = T; /* dep: the first position where got departs from ref by more than the gate */
    for (int t = 0; t < T; t++) {
        int ag = 0, ar = 0;
        for (int v = 0; v < V; v++) {
            size_t i = (size_t)t * V + v;
            double dd = fabs((double)got[i] - ref[i]);
            sum += dd;
            if (t < first && dd > md)
                md = dd;
            if (dd > 2e-2 && dep == T)
                dep = t;
            if (got[i] > got[(size_t)t * V + ag])
                ag = v;
            if (ref[i] > ref[(size_t)t * V + ar])
                ar = v;
        }
        agree += ag == ar;
    }
    double mean = sum / ((double)T * V);
    CHECK(md <= 2e-2, "%s: max|diff| %.3g > 2e-2 before position %d", what, md, first);
    CHECK(agree >= 0.75 * T, "%s: argmax agrees at %d of %d positions (< 75%%)", what, agree, T);
    CHECK(mean <= 0.1, "%s: mean|diff| %.3g > 0.1", what, mean);
    printf("  %-40s max|diff| %.2e before pos %d/%d (departs at %d), argmax %d/%d, mean|diff| %.3g\n", what, md, first,
           T, dep, agree, T, mean);
}

/* Streamed tables (pread by row address, fetched ahead on a thread) give the resident
 * tables' logits bit for bit, and the byte counter covers every row of every token. */
static void streamed_check(const char *dir, const int32_t *ids, int T, int P, int V)
{
    dsv4_err err = {0};
    float *a = malloc((size_t)T * V * sizeof(float)), *b = malloc((size_t)T * V * sizeof(float));
    uint64_t bytes[2] = {0}, toks[2] = {0};
    int st[2] = {0};
    for (int k = 0; k < 2; k++) {
        dsv4_load_opts lo = {.numerics = DSV4_NUMERICS_FP32,
                             .engram_tables = k ? DSV4_ENGRAM_STREAMED : DSV4_ENGRAM_RESIDENT,
                             .device = getenv("DSV4_TEST_DEVICE")};
        dsv4_model *m = dsv4_model_load(dir, &lo, &err);
        CHECK(m != NULL, "load with engram_tables %d: %s", lo.engram_tables, err.msg);
        if (!m)
            continue;
        CHECK(!run_decode(m, ids, T, P, k ? b : a, V), "engram_tables %d: forward failed", lo.engram_tables);
        dsv4_engram_stats(m, &bytes[k], &toks[k], &st[k]);
        dsv4_model_free(m);
    }
    CHECK(st[1] && !st[0], "streamed flag: resident %d, streamed %d", st[0], st[1]);
    CHECK(!memcmp(a, b, (size_t)T * V * sizeof(float)), "streamed Engram tables differ from resident ones");
    CHECK(toks[0] == (uint64_t)T && toks[1] == (uint64_t)T && bytes[0] > 0 && bytes[1] >= bytes[0],
          "Engram counters: resident %llu B / %llu tokens, streamed %llu B / %llu tokens", (unsigned long long)bytes[0],
          (unsigned long long)toks[0], (unsigned long long)bytes[1], (unsigned long long)toks[1]);
    printf("  engram streamed == resident; bytes/token resident %.0f, streamed %.0f\n", (double)bytes[0] / T,
           (double)bytes[1] / T);
    free(a);
    free(b);
}

/* Two sequences stepped together (prefill beside prefill, then decode beside decode, then one
 * alone) give each one's solo logits bit for bit: per-row scratch and per-sequence state. */
static void batch_check(dsv4_model *m, const char *what, const int32_t *const ids[2], const int T[2], const int P[2], int V)
{
    dsv4_err err = {0};
    float *solo[2], *got[2];
    dsv4_seq *s[2];
    for (int k = 0; k < 2; k++) {
        solo[k] = malloc((size_t)T[k] * V * sizeof(float));
        got[k] = malloc((size_t)T[k] * V * sizeof(float));
        run_decode(m, ids[k], T[k], P[k], solo[k], V);
        s[k] = dsv4_seq_new(m, &err);
    }
    int done[2] = {0, 0}, rc = 0;
    while ((done[0] < T[0] || done[1] < T[1]) && !rc) {
        dsv4_seq *bs[2];
        const int32_t *bi[2];
        int bn[2], nb = 0, first[2];
        for (int k = 0; k < 2; k++)
            if (done[k] < T[k]) {
                bs[nb] = s[k];
                bi[nb] = ids[k] + done[k];
                bn[nb] = done[k] ? 1 : P[k];
                first[nb++] = k;
            }
        float *lg = malloc((size_t)(bn[0] + (nb > 1 ? bn[1] : 0)) * V * sizeof(float));
        dsv4_batch b = {.n_seqs = nb, .seqs = bs, .ids = bi, .n_ids = bn, .all_logits = 1, .logits = lg};
        rc = dsv4_forward(m, &b, &err);
        for (int j = 0, off = 0; j < nb && !rc; off += bn[j], j++) {
            int k = first[j];
            memcpy(got[k] + (size_t)done[k] * V, lg + (size_t)off * V, (size_t)bn[j] * V * sizeof(float));
            done[k] += bn[j];
        }
        free(lg);
    }
    CHECK(!rc, "%s: batched forward: %s", what, err.msg);
    for (int k = 0; k < 2; k++) {
        CHECK(!rc && !memcmp(solo[k], got[k], (size_t)T[k] * V * sizeof(float)), "%s: sequence %d batched differs from solo", what, k);
        free(solo[k]);
        free(got[k]);
        dsv4_seq_free(s[k]);
    }
    printf("  %-40s batched == solo\n", what);
}

/* A copy of the fixture folder (links) whose config.json has `from` replaced by `to` must fail
 * to load with `code` and a message containing `want`; token_map: keep the token map. */
static void bad_config(const char *dir, const char *cfg_txt, const char *from, const char *to, int token_map, int code,
                       const char *want)
{
    char tmp[] = "/tmp/dsv4_v41_bad_XXXXXX", path[4096], src[PATH_MAX];
    if (!mkdtemp(tmp)) {
        CHECK(0, "mkdtemp");
        return;
    }
    const char *p = strstr(cfg_txt, from);
    CHECK(p != NULL, "config.json has no '%s'", from);
    snprintf(path, sizeof path, "%s/config.json", tmp);
    FILE *f = fopen(path, "w");
    if (f && p) {
        fwrite(cfg_txt, 1, p - cfg_txt, f);
        fputs(to, f);
        fputs(p + strlen(from), f);
    }
    if (f)
        fclose(f);
    /* absolute targets: a link holding a relative path resolves from the temporary folder */
    const char *links[2] = {"model.safetensors", "token_map.json"};
    for (int i = 0; i < 1 + token_map; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, links[i]);
        CHECK(realpath(path, src) != NULL, "realpath %s", path);
        snprintf(path, sizeof path, "%s/%s", tmp, links[i]);
        CHECK(!symlink(src, path), "symlink %s", path);
    }
    dsv4_err err = {0};
    dsv4_load_opts lo = {.numerics = DSV4_NUMERICS_FP32};
    dsv4_model *m = dsv4_model_load(tmp, &lo, &err);
    CHECK(!m && err.code == code && strstr(err.msg, want), "'%s' -> '%s': expected error %d naming '%s', got %d: %s", from, to, code,
          want, err.code, err.msg);
    dsv4_model_free(m);
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", tmp, i < 2 ? links[i] : "config.json");
        unlink(path);
    }
    rmdir(tmp);
}

int main(int argc, char **argv)
{
    const char *def = CHECK_FIXTURES "/v41/v41-tiny-a";
    int n_dirs = argc > 1 ? argc - 1 : 1;
    for (int fi = 0; fi < n_dirs; fi++) {
        const char *dir = argc > 1 ? argv[fi + 1] : def;
        const char *name = strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir;
        char path[2600];
        printf("%s\n", name);
        snprintf(path, sizeof path, "%s/cases.json", dir);
        char *ctxt = slurp(path);
        snprintf(path, sizeof path, "%s/config.json", dir);
        char *gtxt = slurp(path);
        snprintf(path, sizeof path, "%s/token_map.json", dir);
        char *ttxt = slurp(path);
        cJSON *cases = ctxt ? cJSON_Parse(ctxt) : NULL, *cfg = gtxt ? cJSON_Parse(gtxt) : NULL, *tm = ttxt ? cJSON_Parse(ttxt) : NULL;
        dsv4_err err = {0};
        snprintf(path, sizeof path, "%s/expected_fp64.safetensors", dir);
        dsv4_st *ex64 = dsv4_st_open_file(path, &err);
        snprintf(path, sizeof path, "%s/expected.safetensors", dir);
        dsv4_st *ex = dsv4_st_open_file(path, &err);
        CHECK(cases && cfg && tm && ex64 && ex, "%s: fixture files: %s", name, err.msg);
        if (!(cases && cfg && tm && ex64 && ex))
            continue;
        const cJSON *jc = cJSON_GetObjectItem(cases, "cases");
        if (argc == 1) { /* the fixture's config, edited: each contradiction is refused by name */
            bad_config(dir, gtxt, "\"kv_source_layer_ids\": [\n      2,", "\"kv_source_layer_ids\": [\n", 1, DSV4_E_MODEL, "layer 2");
            bad_config(dir, gtxt, "\"index_source_layer_ids\": [\n      2,", "\"index_source_layer_ids\": [\n      0,", 1,
                       DSV4_E_MODEL, "layer 0");
            bad_config(dir, gtxt, "\"engram_num_embeddings\": [\n      280,", "\"engram_num_embeddings\": [\n      281,", 1,
                       DSV4_E_MODEL, "engram_num_embeddings");
            bad_config(dir, gtxt, "\"candidate_source_layer_id\": 6", "\"candidate_source_layer_id\": 7", 1, DSV4_E_MODEL,
                       "candidate_source_layer_id 7");
            bad_config(dir, gtxt, "\"engram_vocab_size\": 37", "\"engram_vocab_size\": 37", 0, DSV4_E_IO, "token_map.json");
        }
        engram_checks(name, cJSON_GetObjectItem(cfg, "text_config"), tm, ttxt, dsv4_st_find(ex, "case0.engram_hash"),
                      cJSON_GetObjectItem(jc->child, "ids"));

        enum { NKEEP = 8 };
        float *exact[NKEEP] = {0}; /* fp32's prefill logits of the first cases, for kl_report */
        for (int mode = 0; mode < 2; mode++) {
            /* DSV4_TEST_DEVICE=cuda (make test-cuda): the same checks through the CUDA backend */
            dsv4_load_opts lo = {.numerics = mode ? DSV4_NUMERICS_REF : DSV4_NUMERICS_FP32, .device = getenv("DSV4_TEST_DEVICE")};
            dsv4_model *m = dsv4_model_load(dir, &lo, &err);
            CHECK(m != NULL, "%s: load: %s", name, err.msg);
            if (!m)
                continue;
            if (*dsv4_model_placement(m))
                printf("  placement: %s\n", dsv4_model_placement(m));
            const char *mn = mode ? "ref" : "fp32";
            dsv4_model_info info;
            dsv4_model_get_info(m, &info);
            int V = info.vocab_size, ci = 0;
            for (const cJSON *cs = jc->child; cs; cs = cs->next, ci++) {
                const cJSON *jid = cJSON_GetObjectItem(cs, "ids");
                int T = cJSON_GetArraySize(jid), P = cJSON_GetObjectItem(cs, "prefill")->valueint;
                int32_t *ids = malloc(T * sizeof *ids);
                for (int i = 0; i < T; i++)
                    ids[i] = (int32_t)jint(jid, i);
                char tn[64], tn2[64], what[160];
                snprintf(tn, sizeof tn, "case%d.logits", ci);
                snprintf(tn2, sizeof tn2, mode ? "case%d.logits_acc32" : "case%d.inc_logits", ci);
                const dsv4_tensor *rt = dsv4_st_find(mode ? ex : ex64, tn), *r2 = dsv4_st_find(mode ? ex : ex64, tn2);
                CHECK(rt && r2 && rt->numel == (int64_t)T * V && r2->numel == rt->numel, "%s: %s / %s missing or mis-shaped", name, tn, tn2);
                float *got = malloc((size_t)T * V * sizeof(float));
                if (rt && r2) {
                    CHECK(!run_chunks(m, ids, T, 0, got, V), "%s case%d prefill failed", name, ci);
                    snprintf(what, sizeof what, "%s case%d T=%d prefill", mn, ci, T);
                    if (mode)
                        ref_compare(what, got, rt->data, r2->data, T, V);
                    else
                        compare(what, got, rt->data, T, V);
                    if (!mode && ci < NKEEP && (exact[ci] = malloc((size_t)T * V * sizeof(float))))
                        memcpy(exact[ci], got, (size_t)T * V * sizeof(float));
                    if (mode && ci < NKEEP && exact[ci]) {
                        snprintf(what, sizeof what, "case%d T=%d prefill, ref vs fp32", ci, T);
                        kl_report(what, exact[ci], got, T, V);
                    }
                    CHECK(!run_decode(m, ids, T, P, got, V), "%s case%d decode failed", name, ci);
                    snprintf(what, sizeof what, "%s case%d T=%d prefill %d + decode", mn, ci, T, P);
                    if (mode)
                        ref_compare(what, got, rt->data, r2->data, T, V);
                    else
                        compare(what, got, r2->data, T, V);
                    if (ci == 0) {
                        static const int chunks[] = {1, 2, 3, 7};
                        snprintf(what, sizeof what, "%.100s %s case0", name, mn);
                        seams(m, what, ids, T, V, chunks, 4);
                        if (!mode)
                            streamed_check(dir, ids, T, P, V);
                    }
                }
                free(got);
                free(ids);
            }
            if (jc->child && jc->child->next && jc->child->next->next) { /* case0 beside case2 */
                const cJSON *c0 = jc->child, *c2 = jc->child->next->next;
                int T2[2] = {cJSON_GetArraySize(cJSON_GetObjectItem(c0, "ids")), cJSON_GetArraySize(cJSON_GetObjectItem(c2, "ids"))};
                int P2[2] = {cJSON_GetObjectItem(c0, "prefill")->valueint, cJSON_GetObjectItem(c2, "prefill")->valueint};
                int32_t *bi[2];
                for (int k = 0; k < 2; k++) {
                    bi[k] = malloc(T2[k] * sizeof(int32_t));
                    for (int i = 0; i < T2[k]; i++)
                        bi[k][i] = (int32_t)jint(cJSON_GetObjectItem(k ? c2 : c0, "ids"), i);
                }
                char what[64];
                snprintf(what, sizeof what, "%s case0 beside case2", mn);
                batch_check(m, what, (const int32_t *const *)bi, T2, P2, V);
                free(bi[0]);
                free(bi[1]);
            }
            dsv4_model_free(m);
        }
        for (int k = 0; k < NKEEP; k++)
            free(exact[k]);
        cJSON_Delete(cases);
        cJSON_Delete(cfg);
        cJSON_Delete(tm);
        free(ctxt);
        free(gtxt);
        free(ttxt);
        dsv4_st_close(ex64);
        dsv4_st_close(ex);
    }
    return check_summary("v41 fixtures");
}
