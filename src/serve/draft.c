/* draft — prompt lookup and the verify step; see draft.h for the contract. */
#include <string.h>
#include "core/core.h"
#include "serve/draft.h"

int dsv4_lookup_draft(const int32_t *ctx, int64_t n, int min_n, int max_n, int k, int32_t *out)
{
    if (k > DSV4_DRAFT_MAX)
        k = DSV4_DRAFT_MAX;
    if (min_n < 1)
        min_n = 1;
    for (int g = max_n; g >= min_n && k > 0; g--) {
        if (g >= n)
            continue;
        const int32_t *tail = ctx + n - g;
        /* an occurrence at j must leave a token after it: j + g < n, and j + g <= n - 1 - 0 */
        for (int64_t j = n - g - 1; j >= 0; j--) {
            if (memcmp(ctx + j, tail, (size_t)g * sizeof *ctx))
                continue;
            int64_t from = j + g, cnt = n - from < k ? n - from : k;
            memcpy(out, ctx + from, (size_t)cnt * sizeof *out);
            return (int)cnt;
        }
    }
    return 0;
}

int dsv4_draft_step(dsv4_model *m, dsv4_seq *s, dsv4_sampler *smp, const dsv4_sample_params *p, int32_t last,
                    const int32_t *draft, int nd, int32_t stop_id, int max_out, float *logits,
                    dsv4_sample_out *out, int *n_out, dsv4_draft_stats *st, dsv4_err *err)
{
    *n_out = 0;
    if (nd < 0 || nd > DSV4_DRAFT_MAX || max_out < 1)
        return dsv4_fail(err, DSV4_E_ARG, "draft step: %d proposed tokens (0..%d) and %d to make (>= 1)", nd,
                         DSV4_DRAFT_MAX, max_out);
    if (nd > max_out - 1)
        nd = max_out - 1; /* a proposal past the last token to make could never be kept */
    int32_t rows[DSV4_DRAFT_MAX + 1];
    rows[0] = last;
    memcpy(rows + 1, draft, (size_t)nd * sizeof *rows);
    int64_t L = dsv4_seq_len(s);
    int n = nd + 1, V = smp->vocab;
    const int32_t *pr = rows;
    dsv4_batch b = {.n_seqs = 1, .seqs = &s, .ids = &pr, .n_ids = &n, .all_logits = 1, .logits = logits};
    int rc = dsv4_forward(m, &b, err);
    if (rc)
        return rc;
    int r = 0;
    for (;; r++) {
        rc = dsv4_sample(smp, p, logits + (size_t)r * V, L + 1 + r, &out[r], err);
        if (rc)
            return rc;
        dsv4_sampler_accept(smp, out[r].id);
        if (r == nd || out[r].id != draft[r] || out[r].id == stop_id || r + 1 == max_out)
            break;
    }
    *n_out = r + 1;
    if (st) {
        st->steps++;
        st->proposed += nd;
        st->kept += r < nd ? r + (out[r].id == draft[r]) : r;
        for (int i = 0; i < nd && i <= r && out[i].id == draft[i]; i++)
            st->at[i]++;
    }
    /* keep last and the draws that matched the proposal before the final one */
    if (r < nd)
        rc = dsv4_seq_truncate(s, L + 1 + r, err);
    return rc;
}
