/* kernels/hc_mix — the per-stream arithmetic of a hyper-connection site's mixes, shared by the
 * CPU backend and the CUDA kernels (compiled for both: one definition of the formulas, each
 * backend deciding only which thread runs which stream). m: the site's normalised mixes
 * [(2 + n) n]; c: the comb matrix [n, n], row j = stream j. */
#ifndef DSV4_HC_MIX_H
#define DSV4_HC_MIX_H

#include <math.h>

#ifdef __CUDACC__
#define DSV4_HD __host__ __device__ static inline
#else
#define DSV4_HD static inline
#endif

DSV4_HD float dsv4_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* Row j of comb before Sinkhorn: softmax over k of m[2n + jn + k] scale + base, plus hc_eps. */
DSV4_HD void dsv4_hc_comb_row(const float *m, const float *scale, const float *base, int n, int j, float hc_eps, float *c)
{
    float mx = -INFINITY, s = 0.0f;
    for (int k = 0; k < n; k++) {
        c[j * n + k] = m[2 * n + j * n + k] * scale[2] + base[2 * n + j * n + k];
        mx = fmaxf(mx, c[j * n + k]);
    }
    for (int k = 0; k < n; k++)
        s += (c[j * n + k] = expf(c[j * n + k] - mx));
    for (int k = 0; k < n; k++)
        c[j * n + k] = c[j * n + k] / s + hc_eps;
}

/* One Sinkhorn half-step on line i of c: a row (stride 1, step n between rows) or a column
 * (stride n): its entries over their sum + hc_eps, summed in index order. */
DSV4_HD void dsv4_hc_normalize(float *c, int n, int first, int stride, float hc_eps)
{
    float s = 0.0f;
    for (int k = 0; k < n; k++)
        s += c[first + k * stride];
    for (int k = 0; k < n; k++)
        c[first + k * stride] /= s + hc_eps;
}

#endif
