/* V4's MTP stage (model/mtp.c) on a synthetic checkpoint in the release layout (`dsv4 synth
 * --preset tiny`: random weights, mtp.0 as the release ships it). There is no oracle for the
 * stage here, so its checks are the contracts:
 *  - a checkpoint missing any mtp.0 tensor is refused naming it, like any other tensor;
 *  - drafted == plain through the verify step, ids and logprobs bit for bit, greedy and seeded,
 *    for proposals of 1 and 8 tokens (random weights: acceptance is low, the rollback path runs);
 *  - the stage's window is sequence state: a draft after a rollback, a restore or a copy equals
 *    the uninterrupted run's, and after a prompt longer than its rings in one forward equals
 *    the chunked prefill's;
 *  - the server's lanes drafting with it give the plain requests' tokens (1 and 3 lanes,
 *    beside a plain request, resumed from the prompt cache);
 *  - lanes and drafts asking for it on a model without it, or loaded without its draft
 *    stages, are refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "core/core.h"
#include "dsv4.h"
#include "model/diag.h"
#include "serve/draft.h"
#include "serve/lanes.h"
#include "serve/sampler.h"

#define N_GEN 12
#include "lanes_run.h"
#include "renamed.h"

/* Plain (k = 0) or MTP-drafted generation through dsv4_draft_step: ids and logprobs. */
static int run(dsv4_model *m, const int32_t *prompt, int T, const dsv4_sample_params *sp, int k, int32_t *ids,
               double *lps)
{
    dsv4_err err = {0};
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    int V = info.vocab_size, made = 0;
    dsv4_seq *s = dsv4_seq_new(m, &err);
    dsv4_sampler smp;
    int32_t ctx[64];
    memcpy(ctx, prompt, T * sizeof *ctx);
    float *lg = malloc((size_t)(DSV4_DRAFT_MAX + 1) * V * sizeof(float));
    int rc = dsv4_sampler_init(&smp, V, ctx, T, &err);
    int n = T - 1;
    const int32_t *p = ctx;
    dsv4_batch b = {.n_seqs = 1, .seqs = &s, .ids = &p, .n_ids = &n, .logits = lg};
    rc = rc || dsv4_forward(m, &b, &err);
    while (!rc && made < N_GEN) {
        int32_t prop[DSV4_DRAFT_MAX];
        int nd = k ? dsv4_mtp_draft(m, s, ctx[T + made - 1], k, prop, &err) : 0;
        if (nd < 0) {
            rc = -nd;
            break;
        }
        dsv4_sample_out out[DSV4_DRAFT_MAX + 1];
        int got = 0;
        rc = dsv4_draft_step(m, s, &smp, sp, ctx[T + made - 1], prop, nd, -1, N_GEN - made, lg, out, &got, NULL, &err);
        for (int i = 0; i < got && !rc; i++) {
            ids[made] = ctx[T + made] = out[i].id;
            lps[made++] = out[i].logprob;
        }
    }
    CHECK(!rc, "generation: %s", err.msg);
    dsv4_sampler_free(&smp);
    dsv4_seq_free(s);
    free(lg);
    return made;
}

static void check_state(dsv4_model *m)
{
    static const int32_t ids[] = {0, 7, 9, 11, 13, 7, 9, 11, 13, 21};
    dsv4_err err = {0};
    dsv4_seq *a = dsv4_seq_new(m, &err), *s = dsv4_seq_new(m, &err);
    const int32_t *p = ids;
    int n = 8;
    dsv4_batch ba = {.n_seqs = 1, .seqs = &a, .ids = &p, .n_ids = &n};
    CHECK(!dsv4_forward(m, &ba, &err), "state: %s", err.msg);
    int32_t da[6], db[6], junk[5] = {3, 1000, 2000, 3000, 4000};
    CHECK(dsv4_mtp_draft(m, a, ids[8], 6, da, &err) == 6, "state: draft: %s", err.msg);
    dsv4_batch bs = {.n_seqs = 1, .seqs = &s, .ids = &p, .n_ids = &n};
    CHECK(!dsv4_forward(m, &bs, &err), "state: %s", err.msg);
    p = junk;
    n = 5;
    CHECK(!dsv4_forward(m, &bs, &err), "state: %s", err.msg);
    CHECK(!dsv4_seq_truncate(s, 8, &err), "state: rollback: %s", err.msg);
    CHECK(dsv4_mtp_draft(m, s, ids[8], 6, db, &err) == 6 && !memcmp(da, db, sizeof da),
          "MTP draft after a rollback differs from the uninterrupted run's");
    void *buf;
    size_t len;
    CHECK(!dsv4_seq_save(a, &buf, &len, &err), "save: %s", err.msg);
    dsv4_seq *r = dsv4_seq_new(m, &err);
    CHECK(!dsv4_seq_restore(r, buf, len, &err), "restore: %s", err.msg);
    memset(db, 0, sizeof db);
    CHECK(dsv4_mtp_draft(m, r, ids[8], 6, db, &err) == 6 && !memcmp(da, db, sizeof da),
          "MTP draft after a restore differs from the saved sequence's");
    dsv4_seq *cp = dsv4_seq_copy(a, &err);
    memset(db, 0, sizeof db);
    CHECK(cp && dsv4_mtp_draft(m, cp, ids[8], 6, db, &err) == 6 && !memcmp(da, db, sizeof da),
          "MTP draft of a copy differs from the original's");
    dsv4_seq *e = dsv4_seq_new(m, &err);
    CHECK(dsv4_mtp_draft(m, e, 5, 4, db, &err) == 0, "an empty sequence drafts nothing (no streams before the anchor)");
    free(buf);
    dsv4_seq_free(a);
    dsv4_seq_free(s);
    dsv4_seq_free(r);
    dsv4_seq_free(cp);
    dsv4_seq_free(e);
    printf("  MTP window: rollback, restore and copy give the uninterrupted run's draft\n");
}


/* The synthetic folder with one tensor renamed in its header: refused by name. */
static void check_missing(const char *dir, const char *name)
{
    char tmp[] = "/tmp/dsv4_mtp_missing_XXXXXX";
    const char *files[] = {"config.json", "model.safetensors"};
    if (renamed_copy(dir, files, 2, name, tmp))
        return;
    dsv4_err err = {0};
    dsv4_load_opts lo = {.draft_stages = 0}; /* bound either way */
    dsv4_model *m = dsv4_model_load(tmp, &lo, &err);
    CHECK(!m && strstr(err.msg, name), "missing %s: %s", name, m ? "loaded" : err.msg);
    printf("  without %s: refused (%s)\n", name, err.msg);
    dsv4_model_free(m);
    renamed_remove(tmp, files, 2);
}

int main(void)
{
    char dir[] = "/tmp/dsv4_mtp_XXXXXX";
    dsv4_err err = {0};
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    CHECK(!dsv4_synthetic_write("tiny", 3, dir, &err), "synth: %s", err.msg);
    dsv4_load_opts lo = {.draft_stages = 1, .device = getenv("DSV4_TEST_DEVICE")};
    dsv4_model *m = dsv4_model_load(dir, &lo, &err);
    CHECK(m && dsv4_mtp_on(m), "load: %s", err.msg);
    if (m && *dsv4_model_placement(m))
        printf("  placement: %s\n", dsv4_model_placement(m));
    if (m && dsv4_mtp_on(m)) {
        static const int32_t prompt[] = {0, 5, 7, 9, 11, 5, 7, 9};
        for (int mode = 0; mode < 2; mode++) {
            dsv4_sample_params sp;
            dsv4_sample_params_default(&sp);
            sp.temperature = mode ? 1.5 : 0.0;
            sp.seed = 99;
            int32_t ref[N_GEN], got[N_GEN];
            double rlp[N_GEN], glp[N_GEN];
            int nr = run(m, prompt, 8, &sp, 0, ref, rlp);
            for (int k = 1; k <= 8; k *= 8) {
                int ng = run(m, prompt, 8, &sp, k, got, glp);
                CHECK(ng == nr && !memcmp(got, ref, nr * sizeof *ref) && !memcmp(glp, rlp, nr * sizeof *rlp),
                      "%s, MTP proposals of %d: drafted differs from plain", mode ? "seeded" : "greedy", k);
            }
            static int32_t lref[4][N_GEN], lgot[4][N_GEN];
            static double lrlp[4][N_GEN], lglp[4][N_GEN];
            int lnr[4], lng[4];
            lanes_run(m, 1, DSV4_DRAFTER_MTP, 0, 0, 0, &sp, lref, lrlp, lnr, NULL, NULL);
            int64_t proposed = 0;
            for (int lanes = 1; lanes <= 3; lanes += 2)
                for (int v = 0; v < 3; v++) {
                    lanes_run(m, lanes, DSV4_DRAFTER_MTP, v == 1 ? 16 : 3, v == 1, v == 2, &sp, lgot, lglp, lng, NULL, &proposed);
                    for (int k = 0; k < 4; k++)
                        CHECK(lng[k] == lnr[k] && !memcmp(lgot[k], lref[k], lnr[k] * sizeof(int32_t)) &&
                                  !memcmp(lglp[k], lrlp[k], lnr[k] * sizeof(double)),
                              "%s, %d lanes, %s: MTP-drafted request %d differs from plain", mode ? "seeded" : "greedy",
                              lanes, v == 0 ? "alone" : v == 1 ? "beside a plain one" : "resumed", k);
                }
            CHECK(proposed > 0, "the MTP lanes proposed nothing");
            printf("  %s: drafted == plain (proposals of 1 and 8; lanes 1 and 3, beside plain, resumed)\n",
                   mode ? "seeded" : "greedy");
        }
        check_state(m);
    }
    dsv4_model_free(m);
    { /* loaded without its draft stages: bound, but no window kept and a draft refused saying why */
        dsv4_load_opts off = {.draft_stages = 0, .device = getenv("DSV4_TEST_DEVICE")};
        dsv4_model *q = dsv4_model_load(dir, &off, &err);
        dsv4_seq *s = q ? dsv4_seq_new(q, &err) : NULL;
        int32_t x[2];
        CHECK(q && !dsv4_mtp_on(q) && s && dsv4_mtp_draft(q, s, 5, 2, x, &err) < 0 && strstr(err.msg, "draft_stages"),
              "without draft_stages: %s", err.msg);
        dsv4_seq_free(s);
        dsv4_model_free(q);
    }
    { /* a prompt longer than the rings (window + max_rollback) in one forward == by chunks */
        dsv4_load_opts small = {.draft_stages = 1, .max_rollback = 4, .device = getenv("DSV4_TEST_DEVICE")};
        dsv4_model *q = dsv4_model_load(dir, &small, &err);
        CHECK(q != NULL, "load: %s", err.msg);
        int32_t ids[60], da[4], db[4];
        for (int i = 0; i < 60; i++)
            ids[i] = (i * 37 + 11) % 5000;
        dsv4_seq *one = q ? dsv4_seq_new(q, &err) : NULL, *ch = q ? dsv4_seq_new(q, &err) : NULL;
        int n = 59, rc = !one || !ch;
        const int32_t *p = ids;
        dsv4_batch b1 = {.n_seqs = 1, .seqs = &one, .ids = &p, .n_ids = &n};
        rc = rc || dsv4_forward(q, &b1, &err);
        for (int at = 0; !rc && at < 59; at += 7) {
            p = ids + at;
            n = 59 - at < 7 ? 59 - at : 7;
            dsv4_batch b2 = {.n_seqs = 1, .seqs = &ch, .ids = &p, .n_ids = &n};
            rc = dsv4_forward(q, &b2, &err);
        }
        CHECK(!rc && dsv4_mtp_draft(q, one, ids[59], 4, da, &err) == 4 && dsv4_mtp_draft(q, ch, ids[59], 4, db, &err) == 4 &&
                  !memcmp(da, db, sizeof da),
              "MTP draft after one 59-token forward (rings of 20) differs from the chunked prefill's: %s", err.msg);
        dsv4_seq_free(one);
        dsv4_seq_free(ch);
        dsv4_model_free(q);
    }
    const char *need[] = {"mtp.0.e_proj.weight", "mtp.0.h_proj.scale", "mtp.0.enorm.weight", "mtp.0.hnorm.weight",
                          "mtp.0.norm.weight", "mtp.0.hc_head_fn", "mtp.0.attn.wkv.weight", "mtp.0.ffn.experts.7.w3.weight",
                          "mtp.0.ffn.shared_experts.w2.weight"};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        check_missing(dir, need[i]);
    dsv4_model *v41 = dsv4_model_load(CHECK_FIXTURES "/v41/v41-tiny-a", &lo, &err);
    dsv4_lanes_opts o = {.n_lanes = 1, .drafter = DSV4_DRAFTER_MTP};
    dsv4_lanes *l = v41 ? dsv4_lanes_new(v41, &o, &err) : NULL;
    CHECK(v41 && !l && strstr(err.msg, "no MTP stage"), "MTP lanes on a model without the stage: %s", l ? "made" : err.msg);
    dsv4_lanes_free(l);
    dsv4_model_free(v41);
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    remove(path);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    remove(path);
    rmdir(dir);
    return check_summary("mtp");
}
