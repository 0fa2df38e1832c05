/* draft — drafted decoding that never changes a token.
 *
 * A drafter proposes the next few tokens; one forward of the target over the last token and
 * the proposal scores them all; the sampler then draws at each row in order, exactly as plain
 * decoding would at that position (same logits by row invariance, same keyed draw, same
 * penalty history), and the proposal is kept while it agrees with the draws. The first draw
 * that differs is itself the next token, so every step yields at least one. The sequence is
 * then rolled back to the tokens that were kept. Drafted output == plain output, token for
 * token and logprob for logprob, whatever the drafter proposed.
 *
 * Prompt lookup: the proposal is what followed the latest earlier occurrence of the context's
 * last n tokens (n from max_n down to min_n). It needs no model and suits any checkpoint. */
#ifndef DSV4_SERVE_DRAFT_H
#define DSV4_SERVE_DRAFT_H

#include <stdint.h>
#include "dsv4.h"
#include "serve/sampler.h"

#define DSV4_DRAFT_MAX 16     /* tokens a proposal may hold */

/* Writes up to k (<= DSV4_DRAFT_MAX) proposed tokens to out; returns how many (0: no match).
 * ctx[0..n): the sequence so far, its last token included. Ties between occurrences go to the
 * latest one. */
int dsv4_lookup_draft(const int32_t *ctx, int64_t n, int min_n, int max_n, int k, int32_t *out);

/* Acceptance counts: steps, proposed and kept tokens, and how often proposal position i was
 * kept (at[i]). */
typedef struct dsv4_draft_stats {
    long steps, proposed, kept;
    long at[DSV4_DRAFT_MAX];
} dsv4_draft_stats;

/* One step of sequence s (length L, `last` not yet fed): feeds last and draft[0..nd), draws at
 * each row r in order at position L + 1 + r (dsv4_sample, then dsv4_sampler_accept), keeping
 * draft[r] while it equals the draw. Stops after the first differing draw, after a draw of
 * stop_id (< 0: none), or once max_out draws are made (>= 1). out[0..*n_out) are the draws,
 * the next tokens of the sequence; s is left holding last and the kept tokens before the final
 * draw (length L + *n_out). logits: scratch of (nd + 1) * vocab floats. nd = 0 is a plain
 * step. Returns 0 or an error code (s is then in an unspecified state). */
int dsv4_draft_step(dsv4_model *m, dsv4_seq *s, dsv4_sampler *smp, const dsv4_sample_params *p, int32_t last,
                    const int32_t *draft, int nd, int32_t stop_id, int max_out, float *logits,
                    dsv4_sample_out *out, int *n_out, dsv4_draft_stats *st, dsv4_err *err);

#endif
