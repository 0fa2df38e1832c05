/* sampler — turns one row of logits into the next token, and reports its logprobs.
 *
 * Order of operations on a row of V logits (fp32 in, fp64 inside):
 *   1. logit bias (added), then penalties: repetition (divides positive logits, multiplies
 *      negative ones, for every id seen in prompt or output), presence and frequency (subtract
 *      per id seen in the output: presence once, frequency times the count);
 *   2. the constraint mask (allow, from constrained decoding): ids it does not allow become
 *      -inf, so they can neither be drawn nor win greedy, and leave the reported alternatives;
 *   3. logprobs are taken HERE: log-softmax of the biased/penalised/masked logits, before
 *      temperature and before any truncation (top-k/top-p/min-p), so they describe the
 *      distribution actually sampled from, independent of sampling knobs;
 *   4. temperature 0 (or top_k 1): greedy, argmax with ties to the lowest id;
 *      otherwise divide by temperature, drop ids below min_p times the top probability, keep
 *      the top-k, then top-p (smallest set of most likely ids whose mass reaches top_p of what
 *      is left); orderings by probability break ties to the lower id;
 *   5. draw: a uniform u from the keyed generator below, then the first id (in id order) whose
 *      fp64 cumulative probability over the kept ids exceeds u times their total mass.
 *
 * Keyed draw (as DeepInfer's random_sampling describes it, followed as far as described):
 *   seq = (3·position + case) · 0x9E3779B97F4A7C15, x = seed + (seq ^ (seq · 2^13)),
 *   u = (splitmix64(x) >> 11) · 2^-53, where splitmix64 is the standard step (add the golden
 *   gamma, then the two xor-shift-multiply rounds and the final xor-shift). case 0 is the token
 *   draw. The draw depends only on (seed, position, case): never on the lane or the batch. */
#ifndef DSV4_SERVE_SAMPLER_H
#define DSV4_SERVE_SAMPLER_H

#include <stddef.h>
#include <stdint.h>
#include "dsv4.h"

#define DSV4_MAX_TOP_LOGPROBS 20

typedef struct dsv4_sample_params {
    double temperature;        /* 0: greedy */
    int top_k;                 /* 0: off */
    double top_p;              /* 1: off */
    double min_p;              /* 0: off */
    double presence_penalty, frequency_penalty; /* 0: off; over output tokens */
    double repetition_penalty; /* 1: off; over prompt and output tokens */
    const int32_t *bias_ids;   /* logit bias: n_bias (id, value) pairs */
    const float *bias_vals;
    int n_bias;
    uint64_t seed;             /* key of the draws */
    int n_top_logprobs;        /* 0..DSV4_MAX_TOP_LOGPROBS */
    const uint64_t *allow;     /* NULL, or the allowed ids: bit (id & 63) of word id >> 6 */
} dsv4_sample_params;

void dsv4_sample_params_default(dsv4_sample_params *p);

/* The tokens a request has seen, for the penalties: per-id counts in the output and a flag
 * for the prompt. Sized to the vocabulary. */
typedef struct dsv4_sampler {
    int vocab;
    int32_t *out_count;        /* [vocab] times each id was generated */
    uint8_t *in_prompt;        /* [vocab] 1 when the id occurs in the prompt */
    double *work;              /* [vocab] scratch: adjusted logits */
    double *prob;              /* [vocab] scratch: unnormalised probabilities at temperature */
    int32_t *idx, *idx2;       /* [vocab] scratch: candidate ids */
    uint64_t *key, *key2;      /* [vocab] scratch: sort keys */
    uint8_t *keep;             /* [vocab] scratch: kept ids */
} dsv4_sampler;

int dsv4_sampler_init(dsv4_sampler *s, int vocab, const int32_t *prompt, int n_prompt, dsv4_err *err);
/* Forgets the tokens seen and records a new prompt, keeping the buffers: a server reuses one
 * sampler per lane rather than allocating its vocabulary-sized scratch for every request. */
void dsv4_sampler_reset(dsv4_sampler *s, const int32_t *prompt, int n_prompt);
void dsv4_sampler_free(dsv4_sampler *s);
/* Records a generated id (for presence/frequency/repetition). */
void dsv4_sampler_accept(dsv4_sampler *s, int32_t id);

typedef struct dsv4_sample_out {
    int32_t id;
    double logprob;            /* of id, step 3 above */
    int n_top;
    int32_t top_ids[DSV4_MAX_TOP_LOGPROBS];   /* most likely first, ties to the lower id */
    double top_logprobs[DSV4_MAX_TOP_LOGPROBS];
} dsv4_sample_out;

/* Samples from logits[vocab]; position: the index the new token will take in the sequence. */
int dsv4_sample(dsv4_sampler *s, const dsv4_sample_params *p, const float *logits, int64_t position,
                dsv4_sample_out *out, dsv4_err *err);

/* The keyed uniform in [0, 1): the draw for (seed, position, case). */
double dsv4_keyed_uniform(uint64_t seed, uint64_t position, uint64_t kase);

/* Scores a given token (teacher forcing): out->id = id, its log-softmax and the top n_top of
 * logits[vocab], computed exactly as dsv4_sample computes them for an unpenalised row, so a
 * forced token's logprob equals the sampled one's. work: [vocab] scratch. */
void dsv4_score(const float *logits, int vocab, double *work, int32_t id, int n_top, dsv4_sample_out *out);

#endif
