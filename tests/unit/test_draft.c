/* Drafted decoding (serve/draft.c): prompt lookup's proposals on hand-made contexts, then
 * drafted == plain on the default model (models/mini): the same ids and the same logprobs, bit
 * for bit, greedy and seeded, for proposals that are all right (the plain run's own tokens),
 * all wrong, half right, and prompt lookup's, at several proposal lengths. The plain run is tied
 * to the server's: the same request through the lanes gives the same ids and logprobs. Then the
 * lanes' own drafting: requests that draft beside plain ones, through 1 and 3 lanes, give the
 * plain ids and logprobs, with proposals kept (this model's replies repeat their question). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "core/core.h"
#include "dsv4.h"
#include "serve/draft.h"
#include "serve/lanes.h"
#include "serve/sampler.h"

#define MODEL "models/mini"
#define N_GEN 40

static void lookup_cases(void)
{
    int32_t out[DSV4_DRAFT_MAX];
    const int32_t a[] = {1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3};
    /* the latest earlier "1 2 3" is at 4: 7 8 1 follow */
    int n = dsv4_lookup_draft(a, 12, 1, 3, 3, out);
    CHECK(n == 3 && out[0] == 7 && out[1] == 8 && out[2] == 1, "lookup: latest trigram (%d: %d %d %d)", n, out[0],
          out[1], out[2]);
    /* k bounded by what follows the match */
    n = dsv4_lookup_draft(a, 12, 1, 3, 16, out);
    CHECK(n == 5 && out[4] == 3, "lookup: proposal runs to the end of the context (%d)", n);
    const int32_t b[] = {5, 6, 7, 8};
    CHECK(dsv4_lookup_draft(b, 4, 1, 3, 4, out) == 0, "lookup: no earlier occurrence proposes nothing");
    /* longer n-grams first: "4 5" matches at 0 (-> 6), "5" alone would match later at 3 (-> 9) */
    const int32_t c[] = {4, 5, 6, 5, 9, 4, 5};
    n = dsv4_lookup_draft(c, 7, 1, 2, 1, out);
    CHECK(n == 1 && out[0] == 6, "lookup: the longest n-gram wins (%d: %d)", n, out[0]);
    n = dsv4_lookup_draft(c, 7, 1, 1, 1, out);
    CHECK(n == 1 && out[0] == 9, "lookup: unigram, latest occurrence (%d: %d)", n, out[0]);
    CHECK(dsv4_lookup_draft(c, 1, 1, 3, 4, out) == 0, "lookup: a one-token context proposes nothing");
}

typedef enum { PROP_NONE, PROP_RIGHT, PROP_WRONG, PROP_HALF, PROP_LOOKUP } prop_kind;

/* Generates up to N_GEN tokens after prompt; proposals of length k by `kind` (PROP_RIGHT and
 * PROP_HALF read the plain run's ids from ref). Returns the count; ids/lps filled. */
static int run(dsv4_model *m, const int32_t *prompt, int T, const dsv4_sample_params *sp, prop_kind kind, int k,
               const int32_t *ref, int n_ref, int32_t *ids, double *lps, dsv4_draft_stats *st)
{
    dsv4_err err = {0};
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    int V = info.vocab_size;
    dsv4_seq *s = dsv4_seq_new(m, &err);
    dsv4_sampler smp;
    float *lg = malloc((size_t)(DSV4_DRAFT_MAX + 1) * V * sizeof(float));
    int32_t ctx[256];
    memcpy(ctx, prompt, T * sizeof *ctx);
    if (!s || !lg || dsv4_sampler_init(&smp, V, prompt, T, &err)) {
        CHECK(0, "setup: %s", err.msg);
        return 0;
    }
    int n = T - 1, made = 0, rc = 0;
    const int32_t *p = ctx;
    dsv4_batch b = {.n_seqs = 1, .seqs = &s, .ids = &p, .n_ids = &n, .all_logits = 0, .logits = lg};
    rc = dsv4_forward(m, &b, &err);
    while (!rc && made < N_GEN) {
        int32_t prop[DSV4_DRAFT_MAX];
        int nd = 0;
        if (made > 0 && kind != PROP_NONE) {
            for (int i = 0; i < k; i++) {
                int at = made + i; /* the token the proposal's i-th entry stands for */
                int32_t right = at < n_ref ? ref[at] : 1;
                prop[i] = kind == PROP_RIGHT ? right : kind == PROP_WRONG ? (right + 1) % V
                          : i < k / 2 ? right : (right + 3) % V;
            }
            /* hand-made proposals stop where the plain run stopped */
            nd = kind == PROP_LOOKUP ? dsv4_lookup_draft(ctx, T + made, 1, 3, k, prop) : k < n_ref - made ? k : n_ref - made;
        }
        dsv4_sample_out out[DSV4_DRAFT_MAX + 1];
        int got = 0;
        rc = dsv4_draft_step(m, s, &smp, sp, ctx[T + made - 1], prop, nd, info.eos_id, N_GEN - made, lg, out, &got,
                             st, &err);
        for (int i = 0; i < got; i++) {
            ids[made] = out[i].id;
            lps[made] = out[i].logprob;
            ctx[T + made] = out[i].id;
            made++;
        }
        if (got && out[got - 1].id == info.eos_id)
            break;
    }
    CHECK(!rc, "draft step: %s", err.msg);
    dsv4_sampler_free(&smp);
    dsv4_seq_free(s);
    free(lg);
    return made;
}

/* The request through one lane (the server's path): ids and logprobs. */
static int served(dsv4_model *m, const int32_t *prompt, int T, const dsv4_sample_params *sp, int32_t eos, int32_t *ids,
                  double *lps)
{
    dsv4_err err = {0};
    dsv4_lanes_opts o = {.n_lanes = 1};
    dsv4_lanes *l = dsv4_lanes_new(m, &o, &err);
    dsv4_request *r = l ? dsv4_request_new(prompt, T, &err) : NULL;
    int n = 0;
    if (r) {
        r->sp = *sp;
        r->max_tokens = N_GEN;
        r->stop_ids = malloc(sizeof *r->stop_ids);
        r->stop_ids[r->n_stop_ids++] = eos;
    }
    if (!r || dsv4_lanes_submit(l, r, &err)) {
        CHECK(0, "lanes: %s", err.msg);
    } else {
        for (int guard = 0; guard < 1000 && !r->finish; guard++)
            if (dsv4_lanes_step(l, &err) < 0)
                break;
        CHECK(r->finish == DSV4_FINISH_STOP || r->finish == DSV4_FINISH_LENGTH, "lanes: finish %d (%s)", r->finish,
              r->errmsg);
        for (n = 0; n < r->n_out; n++) {
            ids[n] = r->out[n].id;
            lps[n] = r->out[n].logprob;
        }
    }
    if (r)
        dsv4_request_release(r);
    dsv4_lanes_free(l);
    return n;
}

/* Requests through n lanes, each drafting `draft` tokens a step (request 0 of a batch stays plain
 * when mixed): ids and logprobs into ids[k] / lps[k], counts into nk[k]; returns tokens kept. */
static int64_t lanes_run(dsv4_model *m, int n_lanes, const int32_t *const *prompts, const int *T, int n,
                         const dsv4_sample_params *sp, int draft, int mixed, int32_t eos, int32_t (*ids)[N_GEN],
                         double (*lps)[N_GEN], int *nk)
{
    dsv4_err err = {0};
    dsv4_lanes_opts o = {.n_lanes = n_lanes};
    dsv4_lanes *l = dsv4_lanes_new(m, &o, &err);
    dsv4_request *rs[8];
    int64_t kept = 0;
    for (int k = 0; k < n; k++) {
        rs[k] = dsv4_request_new(prompts[k], T[k], &err);
        rs[k]->sp = *sp;
        rs[k]->sp.seed += (uint64_t)k;
        rs[k]->max_tokens = N_GEN;
        rs[k]->stop_ids = malloc(sizeof *rs[k]->stop_ids);
        rs[k]->stop_ids[rs[k]->n_stop_ids++] = eos;
        rs[k]->draft = mixed && k == 0 ? 0 : draft;
        CHECK(!dsv4_lanes_submit(l, rs[k], &err), "submit: %s", err.msg);
    }
    for (int guard = 0; guard < 5000; guard++) {
        int done = 1;
        for (int k = 0; k < n; k++)
            done &= rs[k]->finish != 0;
        if (done || dsv4_lanes_step(l, &err) < 0)
            break;
    }
    for (int k = 0; k < n; k++) {
        CHECK(rs[k]->finish == DSV4_FINISH_STOP || rs[k]->finish == DSV4_FINISH_LENGTH, "lanes: finish %d (%s)",
              rs[k]->finish, rs[k]->errmsg);
        nk[k] = rs[k]->n_out;
        for (int i = 0; i < rs[k]->n_out; i++) {
            ids[k][i] = rs[k]->out[i].id;
            lps[k][i] = rs[k]->out[i].logprob;
        }
        kept += rs[k]->draft_kept;
        dsv4_request_release(rs[k]);
    }
    dsv4_lanes_free(l);
    return kept;
}

static void lanes_cases(dsv4_model *m, int32_t eos)
{
    /* the four questions of tests/fixtures/mini/reply.json */
    static const int32_t q0[] = {0, 3, 293, 307, 2978, 272, 992, 294, 271, 38, 4, 6};
    static const int32_t q1[] = {0, 3, 293, 307, 885, 271, 38, 4, 6};
    static const int32_t q2[] = {0, 3, 392, 1352, 96, 21, 4, 6};
    static const int32_t q3[] = {0, 3, 293, 291, 273, 2294, 38, 4, 6};
    const int32_t *pr[4] = {q0, q1, q2, q3};
    int T[4] = {12, 9, 8, 9};
    static int32_t ref[4][N_GEN], got[4][N_GEN];
    static double rlp[4][N_GEN], glp[4][N_GEN];
    int nr[4], ng[4];
    int64_t kept = 0;
    for (int mode = 0; mode < 2; mode++) {
        dsv4_sample_params sp;
        dsv4_sample_params_default(&sp);
        sp.temperature = mode ? 1.5 : 0.0;
        sp.seed = 77;
        lanes_run(m, 1, pr, T, 4, &sp, 0, 0, eos, ref, rlp, nr);
        for (int lanes = 1; lanes <= 3; lanes += 2)
            for (int mixed = 0; mixed < 2; mixed++) {
                kept += lanes_run(m, lanes, pr, T, 4, &sp, 5, mixed, eos, got, glp, ng);
                for (int k = 0; k < 4; k++)
                    CHECK(ng[k] == nr[k] && !memcmp(got[k], ref[k], nr[k] * sizeof(int32_t)) &&
                              !memcmp(glp[k], rlp[k], nr[k] * sizeof(double)),
                          "%s, %d lanes%s: drafted request %d differs from plain (%d vs %d tokens)",
                          mode ? "seeded" : "greedy", lanes, mixed ? " beside a plain one" : "", k, ng[k], nr[k]);
            }
    }
    CHECK(kept > 0, "the lanes kept no proposal: their kept path went untested");
    printf("  lanes: %lld proposed tokens kept\n", (long long)kept);
}

int main(void)
{
    lookup_cases();
    dsv4_err err = {0};
    const char *kv = getenv("DSV4_TEST_KV"); /* production: tests/suite_kv.sh */
    dsv4_load_opts lo = {.device = getenv("DSV4_TEST_DEVICE"),
                         .kv = kv && !strcmp(kv, "production") ? DSV4_KV_PRODUCTION : DSV4_KV_EXACT};
    dsv4_model *m = dsv4_model_load(MODEL, &lo, &err);
    CHECK(m != NULL, MODEL ": %s", err.msg);
    if (!m)
        return check_summary("draft");
    /* "<bos><User>What does ephemeral mean?<Assistant></think>" in the mini tokenizer */
    const int32_t prompt[] = {0, 3, 293, 307, 2978, 272, 992, 294, 271, 38, 4, 6};
    int T = (int)(sizeof prompt / sizeof *prompt);
    const char *mode_name[2] = {"greedy", "seeded"};
    const char *kind_name[] = {"none", "right", "wrong", "half", "lookup"};
    long kept_total = 0;
    for (int mode = 0; mode < 2; mode++) {
        dsv4_sample_params sp;
        dsv4_sample_params_default(&sp);
        sp.temperature = mode ? 2.0 : 0.0; /* hot enough that a draw at the wrong position differs */
        sp.top_p = 1.0;
        sp.seed = 1234;
        sp.n_top_logprobs = 0;
        int32_t ref[N_GEN], ids[N_GEN];
        double rlp[N_GEN], lps[N_GEN];
        int nref = run(m, prompt, T, &sp, PROP_NONE, 0, NULL, 0, ref, rlp, NULL);
        CHECK(nref > 4, "%s: the plain run made %d tokens", mode_name[mode], nref);
        {
            dsv4_model_info info;
            dsv4_model_get_info(m, &info);
            int ns = served(m, prompt, T, &sp, info.eos_id, ids, lps);
            CHECK(ns == nref && !memcmp(ids, ref, ns * sizeof *ids) && !memcmp(lps, rlp, ns * sizeof *lps),
                  "%s: the plain run differs from the same request through the lanes (%d vs %d tokens)",
                  mode_name[mode], nref, ns);
        }
        for (int kind = PROP_RIGHT; kind <= PROP_LOOKUP; kind++)
            for (int k = 1; k <= 8; k += k < 2 ? 1 : 3) {
                dsv4_draft_stats st = {0};
                int n = run(m, prompt, T, &sp, (prop_kind)kind, k, ref, nref, ids, lps, &st);
                int same = n == nref && !memcmp(ids, ref, n * sizeof *ids) && !memcmp(lps, rlp, n * sizeof *lps);
                CHECK(same, "%s, %s proposals of %d: drafted differs from plain (%d vs %d tokens)", mode_name[mode],
                      kind_name[kind], k, n, nref);
                if (kind == PROP_RIGHT)
                    CHECK(st.kept == st.proposed, "%s: right proposals of %d: %ld of %ld kept", mode_name[mode], k,
                          st.kept, st.proposed);
                if (kind == PROP_WRONG)
                    CHECK(st.kept == 0, "%s: wrong proposals of %d: %ld kept", mode_name[mode], k, st.kept);
                kept_total += st.kept;
            }
    }
    CHECK(kept_total > 0, "no proposal was ever kept: the verify path went untested");
    {
        dsv4_model_info info;
        dsv4_model_get_info(m, &info);
        lanes_cases(m, info.eos_id);
    }
    dsv4_model_free(m);
    return check_summary("draft");
}
