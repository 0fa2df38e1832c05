/* The sampler: greedy and its ties, logprobs after penalties and before temperature, bias,
 * penalties, top-k/top-p/min-p truncation, the keyed draw (SplitMix64 test vector, inverse
 * CDF in id order) and its independence from anything but (seed, position). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "serve/sampler.h"

/* Reference log-softmax in fp64 of an fp64 row. */
static double ref_logprob(const double *w, int n, int id)
{
    double mx = -INFINITY, s = 0;
    for (int i = 0; i < n; i++)
        mx = fmax(mx, w[i]);
    for (int i = 0; i < n; i++)
        s += exp(w[i] - mx);
    return w[id] - mx - log(s);
}

static int sample1(dsv4_sampler *s, const dsv4_sample_params *p, const float *l, int64_t pos, dsv4_sample_out *o)
{
    dsv4_err err = {0};
    int rc = dsv4_sample(s, p, l, pos, o, &err);
    if (rc)
        fprintf(stderr, "sample: %s\n", err.msg);
    return rc;
}

int main(void)
{
    enum { V = 50 };
    float l[V];
    dsv4_err err = {0};
    srand(7);
    for (int i = 0; i < V; i++)
        l[i] = (float)((rand() % 1000) / 250.0 - 2.0);
    l[17] = 6.0f;
    l[31] = 6.0f; /* tie with 17: greedy takes the lower id */
    dsv4_sampler s;
    CHECK(dsv4_sampler_init(&s, V, NULL, 0, &err) == 0, "init");
    dsv4_sample_params p;
    dsv4_sample_out o;

    /* greedy, ties to the lower id, logprob = log-softmax */
    dsv4_sample_params_default(&p);
    p.temperature = 0;
    p.n_top_logprobs = 5;
    CHECK(sample1(&s, &p, l, 0, &o) == 0 && o.id == 17, "greedy tie -> 17, got %d", o.id);
    double w[V];
    for (int i = 0; i < V; i++)
        w[i] = l[i];
    CHECK(fabs(o.logprob - ref_logprob(w, V, 17)) < 1e-12, "greedy logprob %.15g vs %.15g", o.logprob, ref_logprob(w, V, 17));
    CHECK(o.n_top == 5 && o.top_ids[0] == 17 && o.top_ids[1] == 31, "top ids %d %d", o.top_ids[0], o.top_ids[1]);
    int sorted = 1;
    for (int i = 1; i < o.n_top; i++)
        sorted &= o.top_logprobs[i] <= o.top_logprobs[i - 1];
    CHECK(sorted, "top logprobs descending");
    for (int i = 0; i < V; i++) {
        int in = 0;
        for (int k = 0; k < o.n_top; k++)
            in |= o.top_ids[k] == i;
        if (!in)
            CHECK(l[i] <= l[o.top_ids[o.n_top - 1]], "id %d outside top-5 beats the last of them", i);
    }

    /* scoring a given token agrees with sampling it, bit for bit, top entries included */
    {
        double work[V];
        dsv4_sample_out sc;
        dsv4_score(l, V, work, 17, 5, &sc);
        CHECK(sc.id == 17 && sc.logprob == o.logprob && sc.n_top == 5 && !memcmp(sc.top_ids, o.top_ids, 5 * sizeof *sc.top_ids) &&
                  !memcmp(sc.top_logprobs, o.top_logprobs, 5 * sizeof *sc.top_logprobs),
              "score == sample for the greedy token");
        dsv4_score(l, V, work, 40, 0, &sc);
        CHECK(sc.id == 40 && fabs(sc.logprob - ref_logprob(w, V, 40)) < 1e-12 && sc.n_top == 0, "score of another token");
    }

    /* logit bias moves greedy and the logprob follows the biased row */
    int32_t bid = 3;
    float bval = 20.0f;
    p.bias_ids = &bid;
    p.bias_vals = &bval;
    p.n_bias = 1;
    CHECK(sample1(&s, &p, l, 0, &o) == 0 && o.id == 3, "bias -> 3, got %d", o.id);
    w[3] += 20.0;
    CHECK(fabs(o.logprob - ref_logprob(w, V, 3)) < 1e-12, "biased logprob");
    w[3] -= 20.0;
    p.n_bias = 0;

    /* penalties: repetition over prompt+output, presence/frequency over output; logprob is
     * of the penalised row and the same at every temperature (taken before it) */
    int32_t prompt[] = {17, 5};
    dsv4_sampler s2;
    CHECK(dsv4_sampler_init(&s2, V, prompt, 2, &err) == 0, "init2");
    dsv4_sampler_accept(&s2, 31);
    dsv4_sampler_accept(&s2, 31);
    dsv4_sampler_accept(&s2, 8);
    dsv4_sample_params_default(&p);
    p.repetition_penalty = 1.3;
    p.presence_penalty = 0.5;
    p.frequency_penalty = 0.25;
    double pw[V];
    for (int i = 0; i < V; i++) {
        pw[i] = l[i];
        int c = i == 31 ? 2 : i == 8 ? 1 : 0;
        if (c || i == 17 || i == 5)
            pw[i] = pw[i] > 0 ? pw[i] / 1.3 : pw[i] * 1.3;
        if (c)
            pw[i] -= 0.5 + 0.25 * c;
    }
    double lp_at[3];
    double temps[3] = {0, 0.5, 2.0};
    int same_id_ok = 1;
    for (int t = 0; t < 3; t++) {
        p.temperature = temps[t];
        p.seed = 99;
        CHECK(sample1(&s2, &p, l, 4, &o) == 0, "penalised sample");
        lp_at[t] = o.logprob;
        same_id_ok &= fabs(o.logprob - ref_logprob(pw, V, o.id)) < 1e-12;
    }
    CHECK(same_id_ok, "penalised logprobs = log-softmax of the penalised row at every temperature");
    p.temperature = 0;
    int parg = 0;
    for (int i = 1; i < V; i++)
        if (pw[i] > pw[parg])
            parg = i;
    CHECK(sample1(&s2, &p, l, 4, &o) == 0 && o.id == parg && parg != 31, "greedy on the penalised row: %d vs %d", o.id, parg);
    CHECK(lp_at[0] == lp_at[1] || fabs(lp_at[0] - ref_logprob(pw, V, parg)) < 1e-12, "greedy logprob of the penalised row");
    dsv4_sampler_free(&s2);

    /* SplitMix64 test vector: seeded with 0 its first output is 0xE220A8397B1DCDAF; at
     * position 0, case 0 the key is the seed itself */
    CHECK(dsv4_keyed_uniform(0, 0, 0) == (double)(0xE220A8397B1DCDAFull >> 11) * 0x1.0p-53, "splitmix64 vector");
    /* the key composition for a position and a case */
    {
        uint64_t seq = (3 * 5 + 1) * 0x9E3779B97F4A7C15ull, x = 42 + (seq ^ (seq * 8192));
        uint64_t z = x + 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        CHECK(dsv4_keyed_uniform(42, 5, 1) == (double)(z >> 11) * 0x1.0p-53, "key composition");
    }
    double mean = 0;
    for (int i = 0; i < 10000; i++)
        mean += dsv4_keyed_uniform(1234, (uint64_t)i, 0);
    CHECK(fabs(mean / 10000 - 0.5) < 0.02, "keyed uniform mean %.4f", mean / 10000);

    /* inverse CDF in id order: probabilities 1/4, 1/4, 1/2 over ids 0, 1, 2 */
    {
        dsv4_sampler s3;
        CHECK(dsv4_sampler_init(&s3, 3, NULL, 0, &err) == 0, "init3");
        float l3[3] = {0.0f, 0.0f, (float)log(2.0)};
        dsv4_sample_params_default(&p);
        p.seed = 77;
        int ok = 1, hist[3] = {0};
        for (int pos = 0; pos < 400; pos++) {
            double u = dsv4_keyed_uniform(77, (uint64_t)pos, 0);
            int want = u < 0.25 ? 0 : u < 0.5 ? 1 : 2;
            ok &= sample1(&s3, &p, l3, pos, &o) == 0 && o.id == want;
            hist[o.id]++;
        }
        CHECK(ok, "draw = first id whose cumulative mass exceeds u");
        CHECK(hist[2] > 150 && hist[0] > 60 && hist[1] > 60, "histogram %d %d %d", hist[0], hist[1], hist[2]);
        dsv4_sampler_free(&s3);
    }

    /* truncation: top-k, top-p, min-p keep only the ids they should */
    {
        /* ids sorted by logit */
        int order[V];
        for (int i = 0; i < V; i++)
            order[i] = i;
        for (int i = 0; i < V; i++)
            for (int j = i + 1; j < V; j++)
                if (l[order[j]] > l[order[i]] || (l[order[j]] == l[order[i]] && order[j] < order[i])) {
                    int t = order[i];
                    order[i] = order[j];
                    order[j] = t;
                }
        int rank[V];
        for (int i = 0; i < V; i++)
            rank[order[i]] = i;
        double pr[V], tot = 0;
        for (int i = 0; i < V; i++)
            tot += pr[i] = exp(l[i] - 6.0);
        /* nucleus size for top_p = 0.8 */
        double cum = 0;
        int nuc = 0;
        while (cum < 0.8 * tot)
            cum += pr[order[nuc++]];
        int ok_k = 1, ok_p = 1, ok_m = 1, seen_k[V] = {0};
        dsv4_sample_params_default(&p);
        for (int pos = 0; pos < 600; pos++) {
            p.seed = 5;
            p.top_k = 3;
            p.top_p = 1;
            ok_k &= sample1(&s, &p, l, pos, &o) == 0 && rank[o.id] < 3;
            seen_k[o.id] = 1;
            p.top_k = 0;
            p.top_p = 0.8;
            ok_p &= sample1(&s, &p, l, pos, &o) == 0 && rank[o.id] < nuc;
            p.top_p = 1;
            p.min_p = 0.2;
            ok_m &= sample1(&s, &p, l, pos, &o) == 0 && pr[o.id] >= 0.2 * pr[order[0]];
            p.min_p = 0;
        }
        CHECK(ok_k && seen_k[order[0]] && seen_k[order[1]] && seen_k[order[2]], "top-k 3");
        CHECK(ok_p, "top-p 0.8 stays in the nucleus of %d", nuc);
        CHECK(ok_m, "min-p 0.2");
    }

    /* the draw depends only on (seed, position): same inputs, same token; another seed differs somewhere */
    {
        dsv4_sample_params_default(&p);
        p.seed = 11;
        int same = 1, differ = 0;
        for (int pos = 0; pos < 50; pos++) {
            dsv4_sample_out a, b;
            sample1(&s, &p, l, pos, &a);
            sample1(&s, &p, l, pos, &b);
            same &= a.id == b.id && a.logprob == b.logprob;
            p.seed = 12;
            sample1(&s, &p, l, pos, &b);
            p.seed = 11;
            differ += a.id != b.id;
        }
        CHECK(same, "deterministic per (seed, position)");
        CHECK(differ > 0, "seeds differ");
    }

    /* bad arguments are errors, not crashes */
    dsv4_sample_params_default(&p);
    p.n_top_logprobs = 21;
    CHECK(dsv4_sample(&s, &p, l, 0, &o, &err) == DSV4_E_ARG, "top_logprobs > 20 rejected");
    dsv4_sample_params_default(&p);
    bid = V;
    p.bias_ids = &bid;
    p.bias_vals = &bval;
    p.n_bias = 1;
    CHECK(dsv4_sample(&s, &p, l, 0, &o, &err) == DSV4_E_ARG, "bias id out of range rejected");
    dsv4_sampler_free(&s);
    return check_summary("sampler");
}
