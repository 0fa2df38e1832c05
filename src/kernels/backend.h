/* kernels/backend — the op table the model's forward is written against. The CPU backend
 * (kernels/cpu) is the reference; a GPU backend supplies the same ops over device buffers.
 *
 * Every op computes each output row the same way whatever else is in the batch and however
 * many threads run (threads split rows, never one row's sum): chunked prefill, batched lanes
 * and drafted decode then give bit-identical rows. Shapes are row-major; T = rows. */
#ifndef DSV4_BACKEND_H
#define DSV4_BACKEND_H

#include <stdint.h>
#include "io/weight.h"

typedef struct dsv4_backend {
    const char *name;
    /* y[t, i] = sum_k W[r0 + i, k] * x[t, k] for i < r1 - r0: rows [r0, r1) of W.
     * x: [T, W.k] with row stride ldx; y: [T, r1 - r0] with row stride ldy. */
    void (*linear)(const dsv4_weight *w, int64_t r0, int64_t r1, const float *x, int T, int64_t ldx, float *y, int64_t ldy);
    /* y = x / sqrt(mean(x^2) + eps) * (w ? w : 1), per row of `dim`; x and y may alias. */
    void (*rmsnorm)(const float *x, int64_t rows, int dim, const float *w, float eps, float *y);
    /* Interleaved rope on the last rd channels of each of `heads` heads of width d in each
     * row (row stride `stride`), at pos[t]; inverse rotates by -angle. inv_freq: [rd/2]. */
    void (*rope)(float *x, int T, int64_t stride, int heads, int d, int rd, const float *inv_freq, const int64_t *pos,
                 int inverse);
    /* Hyper-connection site: from the n streams X [T, n, D], the mixes pre [T, n], post [T, n],
     * comb [T, n, n] (Sinkhorn-normalised) and the collapse h [T, D] = sum_i pre_i X_i.
     * fn [(2+n)n, nD], base [(2+n)n], scale [3]. post/comb may be NULL (head collapse, where
     * fn is [n, nD] and scale [1]). h may be NULL (mixes only). */
    void (*hc_pre)(const float *X, int T, int n, int D, const float *fn, const float *base, const float *scale, int iters,
                   float hc_eps, float norm_eps, float *pre, float *post, float *comb, float *h);
    /* h [T, D] = sum_i pre_i X_i with given pre [T, n] (V4.1 collapses with the previous site's pre). */
    void (*hc_collapse)(const float *X, int T, int n, int D, const float *pre, float *h);
    /* X[k] = post[k] * y + sum_j comb[j][k] * X[j], per row. */
    void (*hc_post)(float *X, const float *y, int T, int n, int D, const float *post, const float *comb);
    /* Attention of one query row over nk keys (K = V, rows of width d at keys[i] pointers):
     * for each of H heads: softmax over (q_h . k_i * scale, sink[h]) and out_h = sum p_i k_i. */
    void (*attend)(const float *q, int H, int d, const float *const *keys, int nk, float scale, const float *sink, float *out);
    /* h = silu(min(g, limit)) * clamp(u, -limit, limit) (limit <= 0: no clamp); [n] values. */
    void (*swiglu)(const float *g, const float *u, int64_t n, float limit, float *h);
    /* The ops return nothing; a backend whose ops can fail (device errors) keeps the first
     * failure, and check() reports it into err and clears it (returns its code, 0 if none).
     * NULL where the ops cannot fail. */
    int (*check)(dsv4_err *err);
} dsv4_backend;

const dsv4_backend *dsv4_backend_cpu(void);

/* The dot product every CPU op uses: one fixed reduction order per length. */
float dsv4_dot(const float *a, const float *b, int64_t n);

#endif
