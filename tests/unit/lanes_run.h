/* Test helper: four requests through a model's lanes, drafted or plain, for the drafted ==
 * plain checks of the drafters' tests. The includer defines N_GEN (tokens a request makes). */
#ifndef DSV4_TEST_LANES_RUN_H
#define DSV4_TEST_LANES_RUN_H

#include "check.h"
#include "dsv4.h"
#include "serve/lanes.h"

/* Four requests through n lanes (drafting `draft` tokens a step with `drafter`; request 0 plain
 * when mixed), twice when cached (the second round must resume from the prompt cache): the last
 * round's ids and logprobs; adds the tokens kept and proposed over all rounds to *kept and
 * *proposed (either may be NULL). */
static void lanes_run(dsv4_model *m, int n_lanes, int drafter, int draft, int mixed, int cached,
                      const dsv4_sample_params *sp, int32_t (*ids)[N_GEN], double (*lps)[N_GEN], int *nk, int64_t *kept,
                      int64_t *proposed)
{
    static const int32_t p0[] = {0, 5, 7, 9, 11, 5, 7}, p1[] = {0, 100, 200, 300}, p2[] = {0, 9, 9, 9, 9, 9},
                         p3[] = {0, 42, 17, 42, 17, 42, 17, 42};
    const int32_t *pr[4] = {p0, p1, p2, p3};
    int T[4] = {7, 4, 6, 8};
    dsv4_err err = {0};
    dsv4_lanes_opts o = {.n_lanes = n_lanes, .drafter = drafter, .cache_bytes = cached ? 64 << 20 : 0,
                          .draft_row_cost = 1e-9}; /* full depth: the random stages are kept too seldom for the policy */
    dsv4_lanes *l = dsv4_lanes_new(m, &o, &err);
    CHECK(l != NULL, "lanes: %s", err.msg);
    if (!l)
        return;
    for (int round = 0; round < 1 + cached; round++) {
        dsv4_request *rs[4];
        for (int k = 0; k < 4; k++) {
            rs[k] = dsv4_request_new(pr[k], T[k], &err);
            rs[k]->sp = *sp;
            rs[k]->sp.seed += (uint64_t)k;
            rs[k]->max_tokens = N_GEN;
            rs[k]->use_cache = cached;
            rs[k]->draft = mixed && k == 0 ? 0 : draft;
            CHECK(!dsv4_lanes_submit(l, rs[k], &err), "submit: %s", err.msg);
        }
        for (int guard = 0; guard < 5000; guard++) {
            int done = 1;
            for (int k = 0; k < 4; k++)
                done &= rs[k]->finish != 0;
            if (done || dsv4_lanes_step(l, &err) < 0)
                break;
        }
        for (int k = 0; k < 4; k++) {
            CHECK(rs[k]->finish == DSV4_FINISH_LENGTH, "lanes: finish %d (%s)", rs[k]->finish, rs[k]->errmsg);
            CHECK(!cached || !round || rs[k]->n_cached > 0, "lanes: request %d did not resume from the cache", k);
            nk[k] = rs[k]->n_out;
            for (int i = 0; i < rs[k]->n_out && i < N_GEN; i++) {
                ids[k][i] = rs[k]->out[i].id;
                lps[k][i] = rs[k]->out[i].logprob;
            }
            if (kept)
                *kept += rs[k]->draft_kept;
            if (proposed)
                *proposed += rs[k]->draft_proposed;
            dsv4_request_release(rs[k]);
        }
    }
    dsv4_lanes_free(l);
}

#endif
