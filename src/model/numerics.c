/* Numerics modes. FP32 runs the equations in float32 with full-precision caches; REF rounds
 * where the V4.1 release reference rounds (bf16 activations, e4m3 activation blocks in front of
 * every FP8/FP4 product, V4.1's fp8/fp4 cache round trips), through the backend's rounding ops
 * (linear_q, round_bf16, roundtrip: the reference's formulas bit for bit, spec §3, §6, §7), so
 * the activations stay where the backend keeps them; where an op's whole output is rounded, its
 * _rb form (linear_rb, rmsnorm_rb, rope_rb, hc_post_rb) writes it rounded in the same launch.
 * V4 takes the same rules at the matching places of its graph (docs/numerics.md). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "model/model.h"

void dsv4_rnd(const dsv4_model *m, float *x, int64_t n)
{
    if (m->numerics == DSV4_NUMERICS_REF)
        m->be->round_bf16(x, n);
}

void dsv4_norm(const dsv4_model *m, const float *x, int64_t rows, int dim, const float *w, float eps, float *y)
{
    if (m->numerics == DSV4_NUMERICS_REF)
        m->be->rmsnorm_rb(x, rows, dim, w, eps, y);
    else
        m->be->rmsnorm(x, rows, dim, w, eps, y);
}

void dsv4_rope(const dsv4_model *m, float *x, int T, int64_t stride, int heads, int d, int rd, const float *inv_freq,
               const int64_t *pos, int inverse)
{
    if (m->numerics == DSV4_NUMERICS_REF)
        m->be->rope_rb(x, T, stride, heads, d, rd, inv_freq, pos, inverse);
    else
        m->be->rope(x, T, stride, heads, d, rd, inv_freq, pos, inverse);
}

void dsv4_hc_post(const dsv4_model *m, float *X, const float *y, int T, int n, int D, const float *post,
                  const float *comb)
{
    if (m->numerics == DSV4_NUMERICS_REF)
        m->be->hc_post_rb(X, y, T, n, D, post, comb);
    else
        m->be->hc_post(X, y, T, n, D, post, comb);
}

void dsv4_lin(const dsv4_model *m, const dsv4_weight *w, int64_t r0, int64_t r1, const float *x, int T, int64_t ldx,
              float *y, int64_t ldy, int flags)
{
    if (m->numerics != DSV4_NUMERICS_REF) {
        m->be->linear(w, r0, r1, x, T, ldx, y, ldy);
        return;
    }
    int q = (w->form == DSV4_WF_FP8 || w->form == DSV4_WF_FP4) && !(flags & DSV4_LIN_NOQ);
    if (!(flags & DSV4_LIN_F32OUT) && m->be->linear_rb) {
        m->be->linear_rb(w, r0, r1, x, T, ldx, y, ldy, q);
        return;
    }
    if (q)
        m->be->linear_q(w, r0, r1, x, T, ldx, y, ldy);
    else
        m->be->linear(w, r0, r1, x, T, ldx, y, ldy);
    if (!(flags & DSV4_LIN_F32OUT)) {
        if (ldy == r1 - r0)
            m->be->round_bf16(y, (int64_t)T * ldy);
        else
            for (int t = 0; t < T; t++)
                m->be->round_bf16(y + t * ldy, r1 - r0);
    }
}

void dsv4_lin_multi(const dsv4_model *m, int nw, const dsv4_weight *const *w, const float *x, int T, int64_t ldx,
                    float *const *y, int flags)
{
    int ref = m->numerics == DSV4_NUMERICS_REF, q = 0;
    for (int j = 0; j < nw; j++)
        q |= ref && (w[j]->form == DSV4_WF_FP8 || w[j]->form == DSV4_WF_FP4) && !(flags & DSV4_LIN_NOQ);
    if (q) { /* each weight's own quantized copy of x, as dsv4_lin makes it */
        for (int j = 0; j < nw; j++)
            dsv4_lin(m, w[j], 0, w[j]->n, x, T, ldx, y[j], w[j]->n, flags);
        return;
    }
    m->be->linear_multi(nw, w, x, T, ldx, y);
    if (ref && !(flags & DSV4_LIN_F32OUT))
        for (int j = 0; j < nw; j++)
            m->be->round_bf16(y[j], (int64_t)T * w[j]->n);
}
