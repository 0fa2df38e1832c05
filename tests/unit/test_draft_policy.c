/* The draft policy (serve/draft_policy.c): the depth it picks from measured acceptance (the
 * asked depth at first; the longest prefix whose chance of being kept (with the prior) stays at
 * or above a row's cost; a probe one deeper every DSV4_POLICY_PROBE rounds; none while position 0 stops
 * paying, with probes still coming), and when it turns drafting off (more busy lanes than the
 * bound, experts in host memory). Then the lanes on the default model: with the busy bound
 * below the busy lanes nothing is proposed and the steps are counted as turned off, the
 * replies equal plain ones either way, and the per-position counts add up to the totals. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "dsv4.h"
#include "serve/draft_policy.h"
#include "serve/lanes.h"

/* Rounds of `prop` positions where the first `kept` are kept. */
static void rounds(dsv4_draft_policy *p, int n, int prop, int kept)
{
    for (int i = 0; i < n; i++)
        dsv4_policy_record(p, prop, kept);
}

static void depth_cases(void)
{
    dsv4_draft_policy p = {0};
    CHECK(dsv4_policy_depth(&p, 5, 0) == 5, "a new lane drafts the depth it asked for");
    CHECK(dsv4_policy_depth(&p, 40, 0) == DSV4_DRAFT_MAX, "the depth is at most DSV4_DRAFT_MAX");
    CHECK(dsv4_policy_depth(&p, 0, 0) == 0, "no depth asked, none drafted");

    /* position 0 always kept, position 1 never: deep rounds stop paying at 1 */
    rounds(&p, 9, 5, 1);
    CHECK(dsv4_policy_depth(&p, 5, 0) == 1, "kept at 0, never at 1: depth %d, want 1", dsv4_policy_depth(&p, 5, 0));
    rounds(&p, 16 - 9, 1, 1); /* round 16: a probe one deeper */
    CHECK(dsv4_policy_depth(&p, 5, 0) == 2, "probe round: depth %d, want 2", dsv4_policy_depth(&p, 5, 0));
    rounds(&p, 1, 1, 1);
    CHECK(dsv4_policy_depth(&p, 5, 0) == 1, "after the probe: depth %d, want 1", dsv4_policy_depth(&p, 5, 0));

    /* position 0 kept about half the time, position 1 never */
    dsv4_draft_policy h = {0};
    for (int i = 0; i < 8; i++) {
        dsv4_policy_record(&h, 4, 0);
        dsv4_policy_record(&h, 4, 1);
        dsv4_policy_record(&h, 4, 1);
        dsv4_policy_record(&h, 4, 0);
    }
    dsv4_policy_record(&h, 1, 0); /* 33 rounds: not a probe; position 0 kept 16 of 33 */
    CHECK(dsv4_policy_depth(&h, 4, 0.4) == 1 && dsv4_policy_depth(&h, 4, 0.6) == 0,
          "position 0 kept 16 of 33: depth %d at cost 0.4 (want 1), %d at 0.6 (want 0)", dsv4_policy_depth(&h, 4, 0.4),
          dsv4_policy_depth(&h, 4, 0.6));
    dsv4_draft_policy g = {0};
    for (int i = 0; i < 5; i++) { /* per round: kept 0, 1, 2, 3 of 4 in turn, then 4 of 4 */
        for (int k = 0; k < 4; k++)
            dsv4_policy_record(&g, 4, k);
        dsv4_policy_record(&g, 4, 4);
    }
    /* reached 25/20/15/10, kept 20/15/10/5: with the prior, chances 0.78, 0.57, 0.37, 0.18 */
    int d15 = dsv4_policy_depth(&g, 4, 0.15), d3 = dsv4_policy_depth(&g, 4, 0.3), d7 = dsv4_policy_depth(&g, 4, 0.7);
    CHECK(d15 == 4 && d3 == 3 && d7 == 1, "chances 0.78/0.57/0.37/0.18: depths %d %d %d at costs 0.15 0.3 0.7, want 4 3 1", d15,
          d3, d7);

    /* position 0 never kept: no drafting, but a probe every DSV4_POLICY_PROBE rounds */
    dsv4_draft_policy z = {0};
    rounds(&z, 10, 4, 0);
    int probes = 0, drafted = 0;
    for (int i = 0; i < 4 * DSV4_POLICY_PROBE; i++) {
        int k = dsv4_policy_depth(&z, 4, 0);
        drafted += k > 0;
        probes += k == 1;
        dsv4_policy_record(&z, k, 0);
    }
    CHECK(drafted == probes && probes >= 3 && probes <= 5, "never kept: %d rounds drafted, %d probes of depth 1", drafted,
          probes);
    printf("  depth: asked at first, the paying prefix, probes one deeper, none when position 0 stops paying\n");
}

static void allow_cases(void)
{
    CHECK(dsv4_policy_allow(8, 0, 0) == DSV4_DRAFT_ON, "no bound: on");
    CHECK(dsv4_policy_allow(4, 4, 0) == DSV4_DRAFT_ON, "at the bound: on");
    CHECK(dsv4_policy_allow(5, 4, 0) == DSV4_DRAFT_OFF_BUSY, "past the bound: off (busy)");
    CHECK(dsv4_policy_allow(1, 0, 1) == DSV4_DRAFT_OFF_HOST_EXPERTS, "experts in host memory: off");
    printf("  off: past the busy bound, and with experts in host memory\n");
}

#define N_GEN 24
static void lanes_cases(void)
{
    dsv4_err err = {0};
    dsv4_model *m = dsv4_model_load("models/mini", NULL, &err);
    CHECK(m != NULL, "models/mini: %s", err.msg);
    if (!m)
        return;
    CHECK(!dsv4_model_experts_in_host(m), "the CPU reads no experts from host memory across a bus");
    static const int32_t q0[] = {0, 3, 293, 307, 2978, 272, 992, 294, 271, 38, 4, 6};
    static const int32_t q1[] = {0, 3, 293, 307, 885, 271, 38, 4, 6};
    static const int32_t q2[] = {0, 3, 392, 1352, 96, 21, 4, 6};
    const int32_t *pr[3] = {q0, q1, q2};
    int T[3] = {12, 9, 8};
    int32_t ids[3][3][N_GEN];
    int n[3][3];
    dsv4_lanes_stats st[3];
    for (int run = 0; run < 3; run++) { /* plain; drafting, no bound; drafting, bound 1 */
        dsv4_lanes_opts o = {.n_lanes = 3, .draft_busy_max = run == 2 ? 1 : 0};
        dsv4_lanes *l = dsv4_lanes_new(m, &o, &err);
        dsv4_request *rs[3];
        for (int k = 0; k < 3; k++) {
            rs[k] = dsv4_request_new(pr[k], T[k], &err);
            rs[k]->sp.temperature = 0;
            rs[k]->max_tokens = N_GEN;
            rs[k]->use_cache = 0;
            rs[k]->draft = run ? 6 : 0;
            CHECK(!dsv4_lanes_submit(l, rs[k], &err), "submit: %s", err.msg);
        }
        for (int g = 0; g < 2000; g++) {
            int done = 1;
            for (int k = 0; k < 3; k++)
                done &= rs[k]->finish != 0;
            if (done || dsv4_lanes_step(l, &err) < 0)
                break;
        }
        for (int k = 0; k < 3; k++) {
            n[run][k] = rs[k]->n_out;
            for (int i = 0; i < rs[k]->n_out && i < N_GEN; i++)
                ids[run][k][i] = rs[k]->out[i].id;
            long reached = 0, kept = 0;
            for (int i = 0; i < DSV4_DRAFT_MAX; i++) {
                reached += rs[k]->policy.reached[i];
                kept += rs[k]->policy.kept[i];
            }
            CHECK(kept == rs[k]->draft_kept, "request %d: kept per position add up to %ld, kept %lld", k, kept,
                  (long long)rs[k]->draft_kept);
            CHECK(reached <= rs[k]->draft_proposed, "request %d: more positions reached than proposed", k);
            dsv4_request_release(rs[k]);
        }
        dsv4_lanes_get_stats(l, &st[run]);
        dsv4_lanes_free(l);
    }
    for (int run = 1; run < 3; run++)
        for (int k = 0; k < 3; k++)
            CHECK(n[run][k] == n[0][k] && !memcmp(ids[run][k], ids[0][k], n[0][k] * sizeof(int32_t)),
                  "run %d request %d: drafted differs from plain", run, k);
    uint64_t kept_at = 0;
    for (int i = 0; i < DSV4_DRAFT_MAX; i++)
        kept_at += st[1].draft_kept_at[i];
    CHECK(st[1].draft_proposed > 0 && st[1].draft_kept > 0 && kept_at == st[1].draft_kept && !st[1].draft_off_busy,
          "unbounded: %llu proposed, %llu kept (%llu by position), %llu steps off", (unsigned long long)st[1].draft_proposed,
          (unsigned long long)st[1].draft_kept, (unsigned long long)kept_at, (unsigned long long)st[1].draft_off_busy);
    CHECK(st[2].draft_off_busy > 0, "busy bound 1 with 3 lanes busy: no step was turned off");
    printf("  lanes: unbounded %llu proposed / %llu kept; bound 1: %llu proposed, %llu lane-steps off (busy)\n",
           (unsigned long long)st[1].draft_proposed, (unsigned long long)st[1].draft_kept,
           (unsigned long long)st[2].draft_proposed, (unsigned long long)st[2].draft_off_busy);
    dsv4_model_free(m);
}

int main(void)
{
    depth_cases();
    allow_cases();
    lanes_cases();
    return check_summary("draft policy");
}
