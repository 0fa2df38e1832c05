/* sampler — see sampler.h for the order of operations and the keyed draw. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "serve/sampler.h"

void dsv4_sample_params_default(dsv4_sample_params *p)
{
    memset(p, 0, sizeof *p);
    p->temperature = 1.0;
    p->top_p = 1.0;
    p->repetition_penalty = 1.0;
}

int dsv4_sampler_init(dsv4_sampler *s, int vocab, const int32_t *prompt, int n_prompt, dsv4_err *err)
{
    memset(s, 0, sizeof *s);
    s->vocab = vocab;
    s->out_count = dsv4_xcalloc((size_t)vocab, sizeof *s->out_count, err);
    s->in_prompt = dsv4_xcalloc((size_t)vocab, 1, err);
    s->work = dsv4_xmalloc((size_t)vocab * sizeof *s->work, err);
    s->prob = dsv4_xmalloc((size_t)vocab * sizeof *s->prob, err);
    s->idx = dsv4_xmalloc((size_t)vocab * sizeof *s->idx, err);
    s->idx2 = dsv4_xmalloc((size_t)vocab * sizeof *s->idx2, err);
    s->key = dsv4_xmalloc((size_t)vocab * sizeof *s->key, err);
    s->key2 = dsv4_xmalloc((size_t)vocab * sizeof *s->key2, err);
    s->keep = dsv4_xmalloc((size_t)vocab, err);
    if (!s->out_count || !s->in_prompt || !s->work || !s->prob || !s->idx || !s->idx2 || !s->key || !s->key2 || !s->keep) {
        dsv4_sampler_free(s);
        return DSV4_E_NOMEM;
    }
    dsv4_sampler_reset(s, prompt, n_prompt);
    return 0;
}

void dsv4_sampler_reset(dsv4_sampler *s, const int32_t *prompt, int n_prompt)
{
    memset(s->out_count, 0, (size_t)s->vocab * sizeof *s->out_count);
    memset(s->in_prompt, 0, (size_t)s->vocab);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] >= 0 && prompt[i] < s->vocab)
            s->in_prompt[prompt[i]] = 1;
}

void dsv4_sampler_free(dsv4_sampler *s)
{
    free(s->out_count);
    free(s->in_prompt);
    free(s->work);
    free(s->prob);
    free(s->idx);
    free(s->idx2);
    free(s->key);
    free(s->key2);
    free(s->keep);
    memset(s, 0, sizeof *s);
}

void dsv4_sampler_accept(dsv4_sampler *s, int32_t id)
{
    if (id >= 0 && id < s->vocab)
        s->out_count[id]++;
}

/* One SplitMix64 step from state x: add the golden gamma, then the finaliser. */
static uint64_t splitmix64(uint64_t x)
{
    uint64_t z = x + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double dsv4_keyed_uniform(uint64_t seed, uint64_t position, uint64_t kase)
{
    uint64_t seq = (3 * position + kase) * 0x9E3779B97F4A7C15ull;
    uint64_t x = seed + (seq ^ (seq << 13));
    return (double)(splitmix64(x) >> 11) * 0x1.0p-53;
}

/* Orders idx[0..n) (ascending ids on entry) by q descending, ties to the lower id: a stable
 * LSD radix sort, 11 bits a pass, on the complemented bit patterns (q >= 0, so its bits order
 * as its values do). O(n), so a flat row of the whole vocabulary stays cheap beside the step.
 * k1, k2: [n] scratch keys; i2: [n] scratch ids. */
static void sort_desc(const double *q, int32_t *idx, int n, uint64_t *k1, uint64_t *k2, int32_t *i2)
{
    for (int i = 0; i < n; i++) {
        uint64_t b;
        memcpy(&b, &q[idx[i]], sizeof b);
        k1[i] = ~b;
    }
    for (int shift = 0; shift < 64; shift += 11) {
        size_t cnt[2049] = {0};
        for (int i = 0; i < n; i++)
            cnt[((k1[i] >> shift) & 2047) + 1]++;
        if (n && cnt[((k1[0] >> shift) & 2047) + 1] == (size_t)n)
            continue; /* every key has this digit: the pass would not move anything */
        for (int d = 0; d < 2048; d++)
            cnt[d + 1] += cnt[d];
        for (int i = 0; i < n; i++) {
            size_t at = cnt[(k1[i] >> shift) & 2047]++;
            k2[at] = k1[i];
            i2[at] = idx[i];
        }
        memcpy(k1, k2, (size_t)n * sizeof *k1);
        memcpy(idx, i2, (size_t)n * sizeof *idx);
    }
}

/* Fills the top-n (id, logprob) of w[V] (adjusted logits) given its log-normaliser. */
static void top_n(const double *w, int V, double lse, int n, dsv4_sample_out *out)
{
    out->n_top = 0;
    for (int v = 0; v < V && n > 0; v++) {
        double x = w[v];
        if (x == -INFINITY) /* masked out: not an alternative */
            continue;
        int k = out->n_top;
        if (k == n && !(x > out->top_logprobs[k - 1] + lse))
            continue;
        if (k < n)
            out->n_top++;
        else
            k = n - 1;
        /* insertion: strictly greater moves up, so equal values keep the lower id first */
        while (k > 0 && x > out->top_logprobs[k - 1] + lse) {
            out->top_ids[k] = out->top_ids[k - 1];
            out->top_logprobs[k] = out->top_logprobs[k - 1];
            k--;
        }
        out->top_ids[k] = v;
        out->top_logprobs[k] = x - lse;
    }
}

/* Log-normaliser of w[V] in fp64: max plus log of the shifted sum. *arg gets the argmax. */
static double log_norm(const double *w, int V, double *mx_out, int32_t *arg)
{
    double mx = -INFINITY, sum = 0;
    *arg = 0;
    for (int v = 0; v < V; v++)
        if (w[v] > mx) {
            mx = w[v];
            *arg = v;
        }
    for (int v = 0; v < V; v++)
        sum += exp(w[v] - mx);
    *mx_out = mx;
    return mx + log(sum);
}

void dsv4_score(const float *logits, int vocab, double *work, int32_t id, int n_top, dsv4_sample_out *out)
{
    for (int v = 0; v < vocab; v++)
        work[v] = logits[v];
    double mx;
    int32_t arg;
    const double lse = log_norm(work, vocab, &mx, &arg);
    top_n(work, vocab, lse, n_top < DSV4_MAX_TOP_LOGPROBS ? n_top : DSV4_MAX_TOP_LOGPROBS, out);
    out->id = id;
    out->logprob = work[id] - lse;
}

int dsv4_sample(dsv4_sampler *s, const dsv4_sample_params *p, const float *logits, int64_t position,
                dsv4_sample_out *out, dsv4_err *err)
{
    const int V = s->vocab;
    double *w = s->work;
    if (p->n_top_logprobs < 0 || p->n_top_logprobs > DSV4_MAX_TOP_LOGPROBS)
        return dsv4_fail(err, DSV4_E_ARG, "top_logprobs must be 0..%d", DSV4_MAX_TOP_LOGPROBS);
    for (int v = 0; v < V; v++)
        w[v] = logits[v];
    for (int i = 0; i < p->n_bias; i++) {
        if (p->bias_ids[i] < 0 || p->bias_ids[i] >= V)
            return dsv4_fail(err, DSV4_E_ARG, "logit bias id %d is outside the vocabulary", p->bias_ids[i]);
        w[p->bias_ids[i]] += p->bias_vals[i];
    }
    const double rp = p->repetition_penalty;
    const int pen = rp != 1.0 || p->presence_penalty != 0 || p->frequency_penalty != 0;
    for (int v = 0; pen && v < V; v++) {
        int c = s->out_count[v];
        if (rp != 1.0 && (c || s->in_prompt[v]))
            w[v] = w[v] > 0 ? w[v] / rp : w[v] * rp;
        if (c)
            w[v] -= p->presence_penalty + p->frequency_penalty * c;
    }

    if (p->allow) {
        int any = 0;
        for (int v = 0; v < V; v++) {
            if (!(p->allow[v >> 6] >> (v & 63) & 1))
                w[v] = -INFINITY;
            else
                any = 1;
        }
        if (!any)
            return dsv4_fail(err, DSV4_E_ARG, "sampling: the constraint allows no token");
    }

    /* logprobs: log-softmax of the adjusted logits, before temperature and truncation */
    double mx;
    int32_t arg;
    const double lse = log_norm(w, V, &mx, &arg);
    top_n(w, V, lse, p->n_top_logprobs, out);

    int32_t pick = arg;
    if (p->temperature > 0 && p->top_k != 1) {
        /* probabilities relative to the top one, at temperature */
        const double T = p->temperature;
        double *q = s->prob;
        int n = 0;
        for (int v = 0; v < V; v++)
            q[v] = exp((w[v] - mx) / T);
        /* min-p first: ids below min_p times the top probability (exp(0) = 1) are out */
        const double min_keep = p->min_p > 0 ? p->min_p : 0;
        double kept = 0;
        for (int v = 0; v < V; v++)
            if (q[v] >= min_keep)
                kept += q[v];
        /* without top-k, ids below (1 - top_p) / V of the kept mass can never be in the
         * nucleus (all of them together hold less than 1 - top_p of it): drop them before
         * sorting, which makes a flat distribution affordable */
        const double floor_p = p->top_p < 1 && p->top_k == 0 ? (1 - p->top_p) / V * kept : 0;
        for (int v = 0; v < V; v++)
            if (q[v] >= floor_p && q[v] >= min_keep && q[v] > 0)
                s->idx[n++] = v;
        if (p->top_k > 0 || p->top_p < 1) {
            sort_desc(q, s->idx, n, s->key, s->key2, s->idx2);
            if (p->top_k > 0 && n > p->top_k) {
                n = p->top_k;
                kept = 0;
                for (int i = 0; i < n; i++)
                    kept += q[s->idx[i]];
            }
            if (p->top_p < 1) {
                double cum = 0;
                for (int i = 0; i < n; i++) {
                    cum += q[s->idx[i]];
                    if (cum >= p->top_p * kept) {
                        n = i + 1;
                        break;
                    }
                }
            }
            /* back to id order for the draw: mark the kept ids, then collect them ascending */
            memset(s->keep, 0, (size_t)V);
            for (int i = 0; i < n; i++)
                s->keep[s->idx[i]] = 1;
            n = 0;
            for (int v = 0; v < V; v++)
                if (s->keep[v])
                    s->idx[n++] = v;
        }
        if (n == 0)
            return dsv4_fail(err, DSV4_E_ARG, "sampling: no token left after truncation");
        double mass = 0;
        for (int i = 0; i < n; i++)
            mass += q[s->idx[i]];
        const double target = dsv4_keyed_uniform(p->seed, (uint64_t)position, 0) * mass;
        double cum = 0;
        pick = s->idx[n - 1];
        for (int i = 0; i < n; i++) {
            cum += q[s->idx[i]];
            if (cum > target) {
                pick = s->idx[i];
                break;
            }
        }
    }
    out->id = pick;
    out->logprob = w[pick] - lse;
    return 0;
}
