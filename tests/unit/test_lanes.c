/* Lanes on v4-tiny-v (real vocabulary, random weights), with token ids:
 *  - concurrent == solo: 8 requests of unequal prompt lengths (some longer than the prefill
 *    chunk), greedy and seeded, through 1, 2, 4 and 8 lanes (fewer lanes than requests means
 *    requests join as others leave) give the tokens and logprobs of each one run alone;
 *  - resumed == fresh: a next turn, a re-sent prompt and a diverging prefix resume from the
 *    cache (cached tokens counted) and match a cold run; a match below the rollback reach of
 *    the finished state resumes from the prompt-end state instead;
 *  - drafted == plain: requests that draft by prompt lookup (repetitive prompts, so there are
 *    proposals; random weights refuse nearly all of them, so this runs the rollback path, and
 *    test_draft.c the kept path on a trained model) give the tokens and logprobs of plain solo
 *    runs, through 1, 3 and 8 lanes, beside a plain request, with proposals longer than the
 *    rollback reach, and resumed from the cache;
 *  - stop ids, max_tokens 0, prompt scoring, cancel, and bad requests. */
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "serve/lanes.h"

enum { NREQ = 8, MAXTOK = 6, ROLLBACK = 8 };

typedef struct result {
    int n, finish, n_cached;
    int32_t id[64];
    double lp[64];
    int32_t top[64][3];
} result;

static dsv4_model *model;

static void make_prompt(int32_t *p, int n, unsigned seed)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        p[i] = (int32_t)(1000 + (seed >> 8) % 120000);
    }
}

static dsv4_request *req_for(const int32_t *prompt, int n, int k, int use_cache)
{
    dsv4_err err = {0};
    dsv4_request *r = dsv4_request_new(prompt, n, &err);
    r->max_tokens = MAXTOK;
    r->use_cache = use_cache;
    r->sp.n_top_logprobs = 3;
    if (k % 2) { /* seeded sampling on odd requests, greedy on even ones */
        r->sp.temperature = 1.0;
        r->sp.top_p = 0.95;
        r->sp.seed = 1000 + (uint64_t)k;
    } else {
        r->sp.temperature = 0;
    }
    return r;
}

static void collect(dsv4_request *r, result *out)
{
    memset(out, 0, sizeof *out);
    out->n = r->n_out;
    out->finish = r->finish;
    out->n_cached = r->n_cached;
    for (int i = 0; i < r->n_out && i < 64; i++) {
        out->id[i] = r->out[i].id;
        out->lp[i] = r->out[i].logprob;
        for (int k = 0; k < 3; k++)
            out->top[i][k] = r->out[i].top_ids[k];
    }
}

/* Runs requests through lanes step by step until all finish. */
static int run_all(dsv4_lanes *l, dsv4_request **rs, int n)
{
    dsv4_err err = {0};
    for (int i = 0; i < n; i++)
        if (dsv4_lanes_submit(l, rs[i], &err)) {
            fprintf(stderr, "submit: %s\n", err.msg);
            return -1;
        }
    for (int guard = 0; guard < 10000; guard++) {
        int done = 1;
        for (int i = 0; i < n; i++)
            done &= rs[i]->finish != 0;
        if (done)
            return 0;
        if (dsv4_lanes_step(l, &err) < 0) {
            fprintf(stderr, "step: %s\n", err.msg);
            return -1;
        }
    }
    return -1;
}

static int same(const result *a, const result *b)
{
    if (a->n != b->n || a->finish != b->finish)
        return 0;
    for (int i = 0; i < a->n; i++)
        if (a->id[i] != b->id[i] || a->lp[i] != b->lp[i] || memcmp(a->top[i], b->top[i], sizeof a->top[i]))
            return 0;
    return 1;
}

static dsv4_lanes *new_lanes(int n, size_t cache)
{
    dsv4_err err = {0};
    dsv4_lanes_opts o = {.n_lanes = n, .prefill_chunk = 16, .step_tokens = 40, .cache_bytes = cache, .max_rollback = ROLLBACK,
                         .snapshot_every = 24};
    dsv4_lanes *l = dsv4_lanes_new(model, &o, &err);
    if (!l)
        fprintf(stderr, "lanes: %s\n", err.msg);
    return l;
}

/* One request alone, no cache. */
static void solo(const int32_t *prompt, int n, int k, result *out)
{
    dsv4_lanes *l = new_lanes(1, 0);
    dsv4_request *r = req_for(prompt, n, k, 0);
    run_all(l, &r, 1);
    collect(r, out);
    dsv4_request_release(r);
    dsv4_lanes_free(l);
}

/* A prompt sharing its first `keep` tokens with `base` and then `extra` tokens of its own,
 * served beside the cache in l: it resumes from `want_cached` tokens and gives the tokens the
 * same prompt gives alone and cold. k: the request's sampling case (as req_for). */
static void resumed_case(dsv4_lanes *l, const int32_t *base, int keep, int extra, unsigned seed, int k, int want_cached,
                         const char *what)
{
    int32_t p[64];
    memcpy(p, base, keep * sizeof *p);
    make_prompt(p + keep, extra, seed);
    dsv4_request *r = req_for(p, keep + extra, k, 1);
    run_all(l, &r, 1);
    result got, ref;
    collect(r, &got);
    solo(p, keep + extra, k, &ref);
    CHECK(got.n_cached == want_cached && same(&got, &ref), "%s (cached %d, want %d)", what, got.n_cached, want_cached);
    dsv4_request_release(r);
}

int main(void)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", CHECK_FIXTURES "/v4/v4-tiny-v");
    dsv4_err err = {0};
    /* DSV4_TEST_DEVICE=cuda runs the same contracts over the CUDA backend; DSV4_TEST_KV=production
     * with production KV caches (tests/suite_kv.sh) */
    const char *kv = getenv("DSV4_TEST_KV");
    dsv4_load_opts lo = {.n_threads = 1, .max_rollback = ROLLBACK, .device = getenv("DSV4_TEST_DEVICE"),
                         .kv = kv && !strcmp(kv, "production") ? DSV4_KV_PRODUCTION : DSV4_KV_EXACT};
    model = dsv4_model_load(dir, &lo, &err);
    CHECK(model != NULL, "load %s: %s", dir, err.msg);
    if (!model)
        return check_summary("lanes");

    static const int plen[NREQ] = {3, 17, 40, 70, 5, 33, 9, 50};
    static int32_t prompts[NREQ][80];
    static result ref[NREQ], got[NREQ];
    for (int k = 0; k < NREQ; k++) {
        make_prompt(prompts[k], plen[k], 77u + (unsigned)k);
        solo(prompts[k], plen[k], k, &ref[k]);
        CHECK(ref[k].n == MAXTOK && ref[k].finish == DSV4_FINISH_LENGTH, "solo %d: %d tokens, finish %d", k, ref[k].n, ref[k].finish);
    }
    int differs = 0;
    for (int k = 1; k < NREQ; k++)
        differs |= ref[k].id[0] != ref[0].id[0];
    CHECK(differs, "requests produce different tokens (the test can tell them apart)");

    static const int widths[] = {1, 2, 4, 8};
    for (int w = 0; w < 4; w++) {
        dsv4_lanes *l = new_lanes(widths[w], 0);
        dsv4_request *rs[NREQ];
        for (int k = 0; k < NREQ; k++)
            rs[k] = req_for(prompts[k], plen[k], k, 0);
        CHECK(run_all(l, rs, NREQ) == 0, "run %d lanes", widths[w]);
        for (int k = 0; k < NREQ; k++) {
            collect(rs[k], &got[k]);
            CHECK(same(&got[k], &ref[k]), "%d lanes: request %d differs from solo", widths[w], k);
            dsv4_request_release(rs[k]);
        }
        dsv4_lanes_stats st;
        dsv4_lanes_get_stats(l, &st);
        CHECK(st.requests == NREQ && st.generated_tokens == NREQ * MAXTOK, "stats %llu %llu", (unsigned long long)st.requests,
              (unsigned long long)st.generated_tokens);
        dsv4_lanes_free(l);
    }

    /* drafted == plain */
    {
        enum { ND = 6, DTOK = 24 };
        static int32_t dp[ND][64];
        static result dref[ND];
        int dlen[ND];
        for (int k = 0; k < ND; k++) {
            /* a motif repeated, then a tail of its own: lookup finds the motif's continuation */
            int m = 3 + k % 3, reps = 4 + k;
            make_prompt(dp[k], m, 500u + (unsigned)k);
            for (int i = m; i < m * reps; i++)
                dp[k][i] = dp[k][i - m];
            make_prompt(dp[k] + m * reps, 2, 600u + (unsigned)k);
            dlen[k] = m * reps + 2;
            dsv4_lanes *l = new_lanes(1, 0);
            dsv4_request *r = req_for(dp[k], dlen[k], k, 0);
            r->max_tokens = DTOK;
            run_all(l, &r, 1);
            collect(r, &dref[k]);
            dsv4_request_release(r);
            dsv4_lanes_free(l);
        }
        static const int dw[] = {1, 3, 8};
        int64_t kept = 0, proposed = 0;
        for (int w = 0; w < 3; w++) {
            dsv4_lanes *l = new_lanes(dw[w], 64u << 20);
            dsv4_request *rs[ND];
            for (int k = 0; k < ND; k++) {
                rs[k] = req_for(dp[k], dlen[k], k, w == 2);
                rs[k]->max_tokens = DTOK;
                rs[k]->draft = k == 5 ? 0 : k == 4 ? DSV4_DRAFT_MAX : 4; /* one plain beside, one past the reach */
            }
            CHECK(run_all(l, rs, ND) == 0, "drafted run, %d lanes", dw[w]);
            for (int k = 0; k < ND; k++) {
                result g;
                collect(rs[k], &g);
                CHECK(same(&g, &dref[k]), "%d lanes: drafted request %d differs from plain solo", dw[w], k);
                kept += rs[k]->draft_kept;
                proposed += rs[k]->draft_proposed;
                dsv4_request_release(rs[k]);
            }
            if (w == 2) { /* again, resumed from the cache the first pass filled */
                for (int k = 0; k < ND; k++) {
                    rs[k] = req_for(dp[k], dlen[k], k, 1);
                    rs[k]->max_tokens = DTOK;
                    rs[k]->draft = 4;
                }
                run_all(l, rs, ND);
                for (int k = 0; k < ND; k++) {
                    result g;
                    collect(rs[k], &g);
                    CHECK(g.n_cached > 0 && same(&g, &dref[k]), "resumed drafted request %d (cached %d) differs from plain", k,
                          g.n_cached);
                    dsv4_request_release(rs[k]);
                }
            }
            dsv4_lanes_free(l);
        }
        CHECK(proposed > 0, "no proposal was made: the drafted path went untested");
        printf("  drafted: %lld of %lld proposed tokens kept\n", (long long)kept, (long long)proposed);
    }

    /* resumed == fresh */
    {
        dsv4_lanes *l = new_lanes(2, 64u << 20);
        int32_t p2[128];
        /* turn 1: request 2 (40 tokens) */
        dsv4_request *a = req_for(prompts[2], plen[2], 2, 1);
        run_all(l, &a, 1);
        result ra;
        collect(a, &ra);
        CHECK(same(&ra, &ref[2]) && ra.n_cached == 0, "turn 1 with the cache on = solo");
        /* turn 2: prompt, the first 5 outputs (the 6th was never fed), then new tokens */
        int n2 = 0;
        memcpy(p2, prompts[2], plen[2] * sizeof *p2);
        n2 = plen[2];
        for (int i = 0; i < MAXTOK - 1; i++)
            p2[n2++] = ra.id[i];
        make_prompt(p2 + n2, 12, 999);
        n2 += 12;
        dsv4_request_release(a);
        for (int k = 0; k < 2; k++) { /* greedy and seeded */
            dsv4_request *b = req_for(p2, n2, k, 1);
            run_all(l, &b, 1);
            result rb, fb;
            collect(b, &rb);
            solo(p2, n2, k, &fb);
            /* the first turn-2 request resumes from turn 1's end; the second finds its own prompt */
            CHECK(rb.n_cached == (k ? n2 - 1 : plen[2] + MAXTOK - 1), "next turn cached %d of %d", rb.n_cached, n2);
            CHECK(same(&rb, &fb), "next turn (%s): resumed == fresh", k ? "seeded" : "greedy");
            dsv4_request_release(b);
        }
        /* the same prompt again: all but the last token from the cache */
        dsv4_request *c = req_for(p2, n2, 0, 1);
        run_all(l, &c, 1);
        result rc_, fc;
        collect(c, &rc_);
        solo(p2, n2, 0, &fc);
        CHECK(rc_.n_cached == n2 - 1 && same(&rc_, &fc), "re-sent prompt: cached %d of %d, same tokens", rc_.n_cached, n2);
        dsv4_request_release(c);
        /* diverging inside the rollback reach of the prompt-end state (40) but not of the
         * finished state (45): resumes from the prompt-end state and rolls back */
        resumed_case(l, prompts[2], 36, 10, 4242, 1, 36, "diverging prefix: resumed from the prompt end and rolled back");
        /* below every end state's reach: the snapshot taken at 24 tokens while prefilling */
        resumed_case(l, prompts[2], 28, 10, 31337, 0, 24, "prefix of 28: resumed from the snapshot at 24");
        /* a match beyond every state's reach is served cold */
        resumed_case(l, prompts[2], 14, 10, 4711, 0, 0, "unreachable prefix: cold");
        dsv4_lanes_stats st;
        dsv4_lanes_get_stats(l, &st);
        CHECK(st.cache_entries > 0 && st.cached_tokens > 0, "cache stats %zu entries", st.cache_entries);
        dsv4_lanes_free(l);
    }

    /* stop ids, max_tokens 0 with prompt scoring, cancel, bad requests */
    {
        dsv4_lanes *l = new_lanes(2, 0);
        dsv4_request *r = req_for(prompts[1], plen[1], 1, 0);
        r->stop_ids = malloc(sizeof *r->stop_ids);
        r->stop_ids[0] = ref[1].id[2];
        r->n_stop_ids = 1;
        run_all(l, &r, 1);
        int first = 0;
        while (ref[1].id[first] != ref[1].id[2])
            first++;
        CHECK(r->finish == DSV4_FINISH_STOP && r->n_out == first + 1, "stop id: %d tokens, finish %d", r->n_out, r->finish);
        dsv4_request_release(r);

        dsv4_request *s = req_for(prompts[3], plen[3], 0, 0);
        s->max_tokens = 0;
        s->prompt_logprobs = 1;
        run_all(l, &s, 1);
        CHECK(s->finish == DSV4_FINISH_LENGTH && s->n_out == 0 && s->n_prompt_lp == plen[3], "scoring: %d logprobs", s->n_prompt_lp);
        /* the scored logprob of prompt[k] equals the greedy logprob when prompt[k] is the greedy pick */
        result g;
        solo(prompts[3], 30, 0, &g);
        int32_t q[80];
        memcpy(q, prompts[3], 30 * sizeof *q);
        q[30] = g.id[0];
        dsv4_request *s2 = req_for(q, 31, 0, 0);
        s2->max_tokens = 0;
        s2->prompt_logprobs = 1;
        run_all(l, &s2, 1);
        CHECK(s2->n_prompt_lp == 31 && g.id[0] == q[30] && s2->prompt_lp[30].logprob == g.lp[0] && isnan(s2->prompt_lp[0].logprob),
              "teacher-forced logprob %.9g = sampled logprob %.9g", s2->prompt_lp[30].logprob, g.lp[0]);
        CHECK(s2->prompt_lp[30].n_top == 3 && !memcmp(s2->prompt_lp[30].top_ids, g.top[0], sizeof g.top[0]),
              "teacher-forced top ids = sampled top ids");
        int finite = 1;
        for (int i = 1; i < s->n_prompt_lp; i++)
            finite &= s->prompt_lp[i].logprob <= 0 && isfinite(s->prompt_lp[i].logprob) && s->prompt_lp[i].id == prompts[3][i];
        CHECK(finite, "prompt logprobs finite and <= 0");
        dsv4_request_release(s);
        dsv4_request_release(s2);

        /* teacher forcing: forcing the greedy tokens reproduces their logprobs and top ids; a
         * forced token that is a stop id ends nothing until the last one */
        dsv4_request *fr[2];
        for (int k = 0; k < 2; k++) {
            fr[k] = req_for(prompts[k * 2], plen[k * 2], 1, 0); /* seeded settings: forcing ignores them */
            fr[k]->forced = malloc(MAXTOK * sizeof *fr[k]->forced);
            memcpy(fr[k]->forced, ref[k * 2].id, MAXTOK * sizeof *fr[k]->forced);
            fr[k]->n_forced = MAXTOK;
            fr[k]->stop_ids = malloc(sizeof *fr[k]->stop_ids);
            fr[k]->stop_ids[0] = ref[k * 2].id[k ? MAXTOK - 1 : 1];
            fr[k]->n_stop_ids = 1;
        }
        run_all(l, fr, 2);
        for (int k = 0; k < 2; k++) {
            result f;
            collect(fr[k], &f);
            f.finish = ref[k * 2].finish;
            CHECK(same(&f, &ref[k * 2]), "forced greedy tokens (%d) give the greedy logprobs", k);
            CHECK(fr[k]->n_out == MAXTOK && fr[k]->finish == (k ? DSV4_FINISH_STOP : DSV4_FINISH_LENGTH),
                  "forced: %d tokens, finish %d", fr[k]->n_out, fr[k]->finish);
            dsv4_request_release(fr[k]);
        }

        dsv4_request *c = req_for(prompts[5], plen[5], 0, 0);
        c->max_tokens = 50;
        dsv4_lanes_submit(l, c, &err);
        for (int i = 0; i < 4; i++)
            dsv4_lanes_step(l, &err);
        dsv4_request_cancel(c);
        dsv4_lanes_step(l, &err);
        dsv4_lanes_stats st;
        dsv4_lanes_get_stats(l, &st);
        CHECK(c->finish == DSV4_FINISH_CANCELLED && st.busy == 0, "cancel frees the lane within one step");
        dsv4_request_release(c);

        dsv4_request *bad = dsv4_request_new(prompts[0], 0, &err);
        CHECK(dsv4_lanes_submit(l, bad, &err) == DSV4_E_ARG, "empty prompt rejected");
        dsv4_request_release(bad);
        int32_t oob = 200000;
        bad = dsv4_request_new(&oob, 1, &err);
        CHECK(dsv4_lanes_submit(l, bad, &err) == DSV4_E_ARG, "id outside the vocabulary rejected");
        dsv4_request_release(bad);
        bad = dsv4_request_new(prompts[0], 3, &err);
        bad->max_tokens = 1 << 20;
        CHECK(dsv4_lanes_submit(l, bad, &err) == DSV4_E_ARG, "prompt + max_tokens beyond the context rejected");
        dsv4_request_release(bad);
        dsv4_lanes_free(l);
    }
    /* a full queue refuses */
    {
        dsv4_lanes_opts o = {.n_lanes = 1, .queue_max = 2};
        dsv4_lanes *l = dsv4_lanes_new(model, &o, &err);
        dsv4_request *rs[3];
        int rcs[3];
        for (int i = 0; i < 3; i++) {
            rs[i] = req_for(prompts[0], plen[0], 0, 0);
            rcs[i] = dsv4_lanes_submit(l, rs[i], &err);
        }
        CHECK(rcs[0] == 0 && rcs[1] == 0 && rcs[2] == DSV4_E_STATE, "queue of 2 refuses the third");
        dsv4_lanes_shutdown(l);
        dsv4_request *late = req_for(prompts[0], plen[0], 0, 0);
        CHECK(dsv4_lanes_submit(l, late, &err) == DSV4_E_CLOSED, "no submissions after shutdown (told apart from a full queue)");
        dsv4_request_release(late);
        for (int i = 0; i < 3; i++) {
            CHECK(i == 2 || rs[i]->finish == DSV4_FINISH_CANCELLED, "shutdown cancels queued request %d", i);
            dsv4_request_release(rs[i]);
        }
        dsv4_lanes_free(l);
    }
    /* a cancelled request gives its queue slot back at once (a client that left), and a
     * request refused by a full queue can be submitted again without leaking */
    {
        dsv4_lanes_opts o = {.n_lanes = 1, .queue_max = 2};
        dsv4_lanes *l = dsv4_lanes_new(model, &o, &err);
        dsv4_request *rs[3];
        for (int i = 0; i < 2; i++) {
            rs[i] = req_for(prompts[0], plen[0], 0, 0);
            dsv4_lanes_submit(l, rs[i], &err);
        }
        dsv4_request_cancel(rs[1]);
        rs[2] = req_for(prompts[0], plen[0], 0, 0);
        CHECK(dsv4_lanes_submit(l, rs[2], &err) == 0 && rs[1]->finish == DSV4_FINISH_CANCELLED,
              "a cancelled queued request frees its slot before any step");
        dsv4_request *gone = req_for(prompts[0], plen[0], 0, 0);
        dsv4_request_release(rs[2]); /* the caller leaves without cancelling first */
        CHECK(dsv4_lanes_submit(l, gone, &err) == 0, "a released queued request frees its slot");

        enum { LONG = 4096, RETRIES = 40 };
        int32_t *lp = malloc(LONG * sizeof *lp);
        make_prompt(lp, LONG, 77);
        dsv4_request *sc = dsv4_request_new(lp, LONG, &err);
        sc->prompt_logprobs = 1;
        sc->max_tokens = 0;
        size_t before = mallinfo2().uordblks;
        int refused = 0;
        for (int i = 0; i < RETRIES; i++)
            refused += dsv4_lanes_submit(l, sc, &err) == DSV4_E_STATE;
        size_t grown = mallinfo2().uordblks - before;
        CHECK(refused == RETRIES && grown < (size_t)LONG * sizeof(dsv4_sample_out) * 2,
              "resubmitting a prompt-scoring request keeps one buffer (%zu bytes grown over %d tries)", grown, RETRIES);
        dsv4_request_release(sc);
        free(lp);

        dsv4_request *neg = req_for(prompts[0], plen[0], 0, 0);
        neg->max_tokens = -plen[0];
        dsv4_request_cancel(rs[0]);
        CHECK(dsv4_lanes_submit(l, neg, &err) == DSV4_E_ARG, "a negative max_tokens is refused");
        dsv4_request_release(neg);
        dsv4_request_release(rs[0]);
        dsv4_request_release(rs[1]);
        dsv4_request_release(gone);
        dsv4_lanes_free(l);
    }
    dsv4_model_free(model);
    return check_summary("lanes");
}
