/* The DSpark drafter (model/dspark.c) against the V4.1 oracle fixture's forward_spec outputs
 * (tests/fixtures/v41/v41-tiny-a, README "DSpark drafter").
 *
 * Along the fixture's decode path (prefill P, then one token per step, each step drafting
 * after the argmax of its logits):
 *  - fp32 numerics against expected_fp64.safetensors (the tight check): spec_ids equal,
 *    spec_confidence and (case1) spec_logits within 1e-4 * max|ref|, at every step;
 *  - ref numerics against expected.safetensors (the release's bf16 path): the same ids, and
 *    confidences and (case1) logits within 2e-2, at the steps before the first position where
 *    the reference's own paths (inc_logits, logits_acc32) depart from its prefill by > 1e-2
 *    (in the fixture: all of case1's; the long cases' release decode parts before its first
 *    draft, so none of theirs).
 * The stage windows are sequence state: a draft after a rollback, a restore, a copy or a prefill
 * by chunks beside another sequence equals the draft of an uninterrupted run, bit for bit. The server's lanes drafting with DSpark give
 * the plain requests' ids and logprobs, greedy and seeded, through 1 and 3 lanes, beside a
 * plain request, and resumed from the prompt cache. A checkpoint missing any mtp.* tensor is
 * refused naming it; lanes asked for DSpark on a model without stages are refused.
 * DSV4_TEST_DEVICE=cuda (tests/cuda/on_device.sh) runs the fp32 checks on that device (the
 * CUDA backend runs fp32 numerics only, and refuses ref at load). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "core/core.h"
#include "io/safetensors.h"
#include "dsv4.h"
#include "serve/lanes.h"

#define DIR CHECK_FIXTURES "/v41/v41-tiny-a"

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

static const float *tensor(dsv4_st *st, const char *fmt, int ci, int64_t numel)
{
    char name[64];
    snprintf(name, sizeof name, fmt, ci);
    const dsv4_tensor *t = dsv4_st_find(st, name);
    if (!t)
        return NULL;
    CHECK(t->numel == numel, "%s: %lld values, expected %lld", name, (long long)t->numel, (long long)numel);
    return t->numel == numel ? t->data : NULL;
}

/* The first row t >= 0 at which a differs from b by more than tol (T if none). */
static int first_departure(const float *a, const float *b, int T, int V, double tol)
{
    for (int t = 0; t < T; t++)
        for (int v = 0; v < V; v++)
            if (fabs(a[(size_t)t * V + v] - b[(size_t)t * V + v]) > tol)
                return t;
    return T;
}

static void check_case(dsv4_model *m, dsv4_st *ex, int ref, int ci, const int32_t *ids, int T, int P, int V, int B)
{
    const char *mn = ref ? "ref" : "fp32";
    int n = T - P;
    const int32_t *sid = (const int32_t *)tensor(ex, "case%d.spec_ids", ci, (int64_t)n * (B + 1));
    const int32_t *spos = (const int32_t *)tensor(ex, "case%d.spec_start_pos", ci, n);
    const float *sconf = tensor(ex, "case%d.spec_confidence", ci, (int64_t)n * B);
    const float *slog = tensor(ex, "case%d.spec_logits", ci, (int64_t)n * B * V);
    CHECK(sid && spos && sconf, "%s case%d: spec tensors missing", mn, ci);
    if (!sid || !spos || !sconf)
        return;
    /* steps that count: every one in fp32; in ref those before the reference's own paths part */
    int upto = T;
    if (ref) {
        const float *lg = tensor(ex, "case%d.logits", ci, (int64_t)T * V), *inc = tensor(ex, "case%d.inc_logits", ci, (int64_t)T * V);
        const float *acc = tensor(ex, "case%d.logits_acc32", ci, (int64_t)T * V);
        if (lg && inc && acc) {
            int a = first_departure(lg, inc, T, V, 1e-2), b = first_departure(lg, acc, T, V, 1e-2);
            upto = a < b ? a : b;
        }
    }
    double mconf = 0, mlog = 0;
    for (int i = 0; i < n * B; i++)
        mconf = fmax(mconf, fabs(sconf[i]));
    for (size_t i = 0; slog && i < (size_t)n * B * V; i++)
        mlog = fmax(mlog, fabs(slog[i]));
    double tol_c = ref ? 2e-2 : 1e-4 * mconf, tol_l = ref ? 2e-2 : 1e-4 * mlog;
    dsv4_err err = {0};
    dsv4_seq *s = dsv4_seq_new(m, &err);
    float *lg = malloc((size_t)P * V * sizeof(float)), *dl = malloc((size_t)B * V * sizeof(float));
    float conf[64];
    int32_t did[65];
    int checked = 0, bad_id = 0, pos_bad = 0;
    double dc = 0, dlg = 0;
    const int32_t *p = ids;
    int np = P;
    dsv4_batch b = {.n_seqs = 1, .seqs = &s, .ids = &p, .n_ids = &np, .all_logits = 0, .logits = lg};
    CHECK(!dsv4_forward(m, &b, &err), "%s case%d prefill: %s", mn, ci, err.msg);
    for (int t = P; t < T && t < upto; t++) {
        p = ids + t;
        np = 1;
        if (dsv4_forward(m, &b, &err)) {
            CHECK(0, "%s case%d step %d: %s", mn, ci, t, err.msg);
            break;
        }
        int k = t - P, anchor = argmax(lg, V);
        pos_bad += spos[k] != t;
        if (dsv4_spec_draft(m, s, anchor, did, dl, conf, &err)) {
            CHECK(0, "%s case%d draft at %d: %s", mn, ci, t, err.msg);
            break;
        }
        checked++;
        for (int i = 0; i <= B; i++)
            bad_id += did[i] != sid[(size_t)k * (B + 1) + i];
        for (int i = 0; i < B; i++)
            dc = fmax(dc, fabs(conf[i] - sconf[(size_t)k * B + i]));
        for (size_t i = 0; slog && i < (size_t)B * V; i++)
            dlg = fmax(dlg, fabs(dl[i] - slog[(size_t)k * B * V + i]));
    }
    printf("  %s case%d: %d of %d drafts checked (steps before %d), ids %s, max|conf diff| %.3g (tol %.3g)", mn, ci, checked,
           n, upto, bad_id ? "DIFFER" : "equal", dc, tol_c);
    if (slog)
        printf(", max|logit diff| %.3g (tol %.3g)", dlg, tol_l);
    printf("\n");
    /* in ref, a long case's release decode parts from its prefill (stale index keys, README)
     * before its first draft: only the steps before that compare */
    CHECK(checked > 0 || (ref && upto <= P), "%s case%d: no draft checked", mn, ci);
    CHECK(!pos_bad, "%s case%d: spec_start_pos is not the decode path's", mn, ci);
    CHECK(!bad_id, "%s case%d: %d draft ids differ from spec_ids", mn, ci, bad_id);
    CHECK(dc <= tol_c, "%s case%d: confidence off by %g", mn, ci, dc);
    CHECK(!slog || dlg <= tol_l, "%s case%d: draft logits off by %g", mn, ci, dlg);
    dsv4_seq_free(s);
    free(lg);
    free(dl);
}

/* Drafts after a rollback, a restore and a copy equal those of an uninterrupted run. */
static void check_state(dsv4_model *m, const int32_t *ids, int T, int V, int B)
{
    dsv4_err err = {0};
    dsv4_seq *a = dsv4_seq_new(m, &err), *s = dsv4_seq_new(m, &err);
    float *lg = malloc((size_t)T * V * sizeof(float));
    int32_t da[65], db[65];
    float ca[64], cb[64];
    int half = T / 2;
    const int32_t *p = ids;
    int n = half;
    dsv4_batch ba = {.n_seqs = 1, .seqs = &a, .ids = &p, .n_ids = &n, .all_logits = 0, .logits = lg};
    CHECK(!dsv4_forward(m, &ba, &err), "state: %s", err.msg);
    CHECK(!dsv4_spec_draft(m, a, ids[half], da, NULL, ca, &err), "state: draft: %s", err.msg);
    /* s: past the same point with other tokens, then rolled back */
    int32_t junk[8];
    for (int i = 0; i < 8; i++)
        junk[i] = (ids[i] * 7 + 3) % V;
    dsv4_batch bs = {.n_seqs = 1, .seqs = &s, .ids = &p, .n_ids = &n, .all_logits = 0, .logits = lg};
    p = ids;
    n = half;
    CHECK(!dsv4_forward(m, &bs, &err), "state: %s", err.msg);
    p = junk;
    n = 8;
    CHECK(!dsv4_forward(m, &bs, &err), "state: %s", err.msg);
    CHECK(!dsv4_seq_truncate(s, half, &err), "state: rollback: %s", err.msg);
    CHECK(!dsv4_spec_draft(m, s, ids[half], db, NULL, cb, &err), "state: draft: %s", err.msg);
    CHECK(!memcmp(da, db, sizeof(int32_t) * (B + 1)) && !memcmp(ca, cb, sizeof(float) * B),
          "draft after a rollback differs from the uninterrupted run's");
    void *buf;
    size_t len;
    CHECK(!dsv4_seq_save(a, &buf, &len, &err), "state: save: %s", err.msg);
    dsv4_seq *r = dsv4_seq_new(m, &err);
    CHECK(!dsv4_seq_restore(r, buf, len, &err), "state: restore: %s", err.msg);
    memset(db, 0, sizeof db);
    CHECK(!dsv4_spec_draft(m, r, ids[half], db, NULL, cb, &err), "state: draft: %s", err.msg);
    CHECK(!memcmp(da, db, sizeof(int32_t) * (B + 1)) && !memcmp(ca, cb, sizeof(float) * B),
          "draft after a restore differs from the saved sequence's");
    dsv4_seq *cp = dsv4_seq_copy(a, &err);
    CHECK(cp && !dsv4_spec_draft(m, cp, ids[half], db, NULL, cb, &err), "state: copy: %s", err.msg);
    CHECK(!memcmp(da, db, sizeof(int32_t) * (B + 1)) && !memcmp(ca, cb, sizeof(float) * B),
          "draft of a copy differs from the original's");
    /* the prefix by chunks of 3 and beside another sequence in each step: the same windows */
    dsv4_seq *c3 = dsv4_seq_new(m, &err), *other = dsv4_seq_new(m, &err);
    for (int at = 0; at < half; at += 3) {
        int k = half - at < 3 ? half - at : 3, two = 2;
        const int32_t *pp[2] = {ids + at, ids + (at + 5) % half};
        int nn[2] = {k, 2};
        dsv4_seq *ss[2] = {c3, other};
        dsv4_batch bc = {.n_seqs = two, .seqs = ss, .ids = pp, .n_ids = nn};
        CHECK(!dsv4_forward(m, &bc, &err), "chunks: %s", err.msg);
    }
    memset(db, 0, sizeof db);
    CHECK(!dsv4_spec_draft(m, c3, ids[half], db, NULL, cb, &err), "chunks: draft: %s", err.msg);
    CHECK(!memcmp(da, db, sizeof(int32_t) * (B + 1)) && !memcmp(ca, cb, sizeof(float) * B),
          "draft after a chunked prefill beside another sequence differs from the one-shot prefill's");
    dsv4_seq_free(c3);
    dsv4_seq_free(other);
    printf("  stage windows: rollback, restore, copy and a chunked, batched prefill give the uninterrupted run's draft\n");
    free(buf);
    free(lg);
    dsv4_seq_free(a);
    dsv4_seq_free(s);
    dsv4_seq_free(r);
    dsv4_seq_free(cp);
}

#define N_GEN 16
#include "lanes_run.h"
#include "renamed.h"

static void lanes_cases(dsv4_model *m)
{
    static int32_t ref[4][N_GEN], got[4][N_GEN];
    static double rlp[4][N_GEN], glp[4][N_GEN];
    int nr[4], ng[4];
    int64_t kept = 0;
    for (int mode = 0; mode < 2; mode++) {
        dsv4_sample_params sp;
        dsv4_sample_params_default(&sp);
        sp.temperature = mode ? 1.5 : 0.0;
        sp.seed = 31;
        lanes_run(m, 1, DSV4_DRAFTER_LOOKUP, 0, 0, 0, &sp, ref, rlp, nr, NULL, NULL);
        for (int lanes = 1; lanes <= 3; lanes += 2)
            for (int v = 0; v < 3; v++) { /* alone, beside a plain request, resumed from the cache */
                lanes_run(m, lanes, DSV4_DRAFTER_DSPARK, v == 1 ? 16 : 4, v == 1, v == 2, &sp, got, glp, ng, &kept, NULL);
                for (int k = 0; k < 4; k++)
                    CHECK(ng[k] == nr[k] && !memcmp(got[k], ref[k], nr[k] * sizeof(int32_t)) &&
                              !memcmp(glp[k], rlp[k], nr[k] * sizeof(double)),
                          "%s, %d lanes, %s: DSpark-drafted request %d differs from plain", mode ? "seeded" : "greedy", lanes,
                          v == 0 ? "alone" : v == 1 ? "beside a plain one" : "resumed", k);
            }
    }
    CHECK(kept > 0, "the DSpark lanes kept no proposal: their kept path went untested");
    printf("  lanes with DSpark == plain (greedy, seeded; 1 and 3 lanes; beside plain; resumed): %lld tokens kept\n",
           (long long)kept);
}

/* The fixture folder with one tensor renamed in model.safetensors' header: refused by name. */
static void check_missing(const char *tensor_name)
{
    char tmp[] = "/tmp/dsv4_dspark_XXXXXX";
    const char *files[] = {"config.json", "token_map.json", "model.safetensors"};
    if (renamed_copy(DIR, files, 3, tensor_name, tmp))
        return;
    dsv4_err err = {0};
    dsv4_load_opts lo = {.numerics = DSV4_NUMERICS_FP32, .draft_stages = 1, .device = getenv("DSV4_TEST_DEVICE")};
    dsv4_model *m = dsv4_model_load(tmp, &lo, &err);
    CHECK(!m && strstr(err.msg, tensor_name), "missing %s: %s", tensor_name, m ? "loaded" : err.msg);
    printf("  without %s: %s\n", tensor_name, err.msg);
    dsv4_model_free(m);
    renamed_remove(tmp, files, 3);
}

int main(void)
{
    char *ctxt = dsv4_read_file(DIR "/cases.json", NULL, NULL);
    cJSON *cases = ctxt ? cJSON_Parse(ctxt) : NULL;
    dsv4_err err = {0};
    dsv4_st *ex64 = dsv4_st_open_file(DIR "/expected_fp64.safetensors", &err);
    dsv4_st *ex = ex64 ? dsv4_st_open_file(DIR "/expected.safetensors", &err) : NULL;
    CHECK(cases && ex64 && ex, "fixture files: %s", err.msg);
    if (!cases || !ex64 || !ex)
        return check_summary("dspark");
    const char *dev = getenv("DSV4_TEST_DEVICE");
    printf("device: %s\n", dev ? dev : "cpu");
    for (int mode = 0; mode < (dev ? 1 : 2); mode++) {
        dsv4_load_opts lo = {.numerics = mode ? DSV4_NUMERICS_REF : DSV4_NUMERICS_FP32, .draft_stages = 1, .device = dev};
        dsv4_model *m = dsv4_model_load(DIR, &lo, &err);
        CHECK(m != NULL, "load: %s", err.msg);
        if (!m)
            continue;
        dsv4_model_info info;
        dsv4_model_get_info(m, &info);
        int V = info.vocab_size, B = dsv4_spec_block(m), ci = 0;
        CHECK(B == 4, "block size %d, the fixture's is 4", B);
        for (const cJSON *cs = cJSON_GetObjectItem(cases, "cases")->child; cs; cs = cs->next, ci++) {
            const cJSON *jid = cJSON_GetObjectItem(cs, "ids");
            int T = cJSON_GetArraySize(jid), P = cJSON_GetObjectItem(cs, "prefill")->valueint;
            int32_t *ids = malloc(T * sizeof *ids);
            for (int i = 0; i < T; i++)
                ids[i] = cJSON_GetArrayItem(jid, i)->valueint;
            check_case(m, mode ? ex : ex64, mode, ci, ids, T, P, V, B);
            if (ci == 0 && !mode)
                check_state(m, ids, T, V, B);
            free(ids);
        }
        if (!mode)
            lanes_cases(m);
        dsv4_model_free(m);
    }
    const char *need[] = {"mtp.0.main_proj.weight", "mtp.0.main_norm.weight", "mtp.1.attn.wq_b.weight",
                          "mtp.2.ffn.experts.3.w2.weight", "mtp.2.markov_head.head.weight", "mtp.2.confidence_head.proj.weight",
                          "mtp.2.norm.weight"};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        check_missing(need[i]);
    {
        dsv4_model *v4 = dsv4_model_load(CHECK_FIXTURES "/v4/v4-held-1", NULL, &err);
        CHECK(v4 != NULL, "v4-held-1: %s", err.msg);
        dsv4_lanes_opts o = {.n_lanes = 1, .drafter = DSV4_DRAFTER_DSPARK};
        dsv4_lanes *l = v4 ? dsv4_lanes_new(v4, &o, &err) : NULL;
        CHECK(v4 && !l && strstr(err.msg, "no DSpark stages"), "lanes drafting DSpark without stages: %s",
              l ? "made" : err.msg);
        dsv4_lanes_free(l);
        dsv4_model_free(v4);
    }
    dsv4_st_close(ex64);
    dsv4_st_close(ex);
    cJSON_Delete(cases);
    free(ctxt);
    return check_summary("dspark");
}
