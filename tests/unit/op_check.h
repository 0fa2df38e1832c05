/* The op tests' shared pieces (tests/unit/test_backend_ops.c, tests/cuda/test_cuda_ops.c):
 * random inputs, poisoned outputs, the per-element comparison against a tolerance, planted
 * controls, and random weights of every stored form. Include after check.h and test_rng.h. */
#ifndef DSV4_OP_CHECK_H
#define DSV4_OP_CHECK_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "io/weight.h"

static inline float *falloc(size_t n) { return malloc((n ? n : 1) * sizeof(float)); }

static inline void fill(float *v, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        v[i] = frand(lo, hi);
}

/* NaN everywhere: an element an op forgets to write then fails every comparison. */
static inline void poison(float *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        v[i] = NAN;
}

/* Whether |got - ref| <= rel * mag everywhere with no NaN on either side; prints the worst
 * ratio unless quiet. */
static inline int agree_within(const char *what, const float *got, const float *ref, const double *mag, size_t n,
                               double rel, int quiet)
{
    double worst = 0;
    size_t nan = 0, at = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i]) || isnan(ref[i])) {
            nan++;
            continue;
        }
        double r = fabs((double)got[i] - ref[i]) / (rel * mag[i] + 1e-30);
        if (r > worst) {
            worst = r;
            at = i;
        }
    }
    int ok = nan == 0 && worst <= 1.0;
    if (!quiet)
        printf("  %-52s worst |diff|/tol %.3f at %zu, NaN %zu  %s\n", what, worst, at, nan, ok ? "ok" : "FAIL");
    return ok;
}

/* A planted control: the same comparison against a deliberately wrong reference must fail,
 * so no check passes by being unable to fail. */
static inline void control_within(const char *what, const float *got, const float *wrong, const double *mag, size_t n,
                                  double rel)
{
    int caught = !agree_within(what, got, wrong, mag, n, rel, 1);
    CHECK(caught, "control %s: a deliberately wrong reference passed the comparison", what);
    printf("  control %-44s %s\n", what, caught ? "caught" : "NOT CAUGHT");
}

/* An e4m3 code that is not NaN. */
static inline uint8_t fp8_code(void)
{
    uint8_t q;
    do
        q = (uint8_t)rnd();
    while ((q & 0x7f) == 0x7f);
    return q;
}

/* A random weight [n, k] of a stored form (not EXL3): values in [-1, 1] or random codes; FP8
 * scales per (bn x bk) block, FP4 per (1 x bk) group, e8m0 bytes or f32 values, never 1.0 so a
 * skipped scale shows. Free data and scale. */
static inline void make_weight(dsv4_wform form, int64_t n, int64_t k, int bn, int bk, int e8m0, dsv4_weight *w)
{
    memset(w, 0, sizeof *w);
    w->name = "random";
    w->form = form;
    w->n = n;
    w->k = k;
    size_t nk = (size_t)n * k, ns = 0;
    uint8_t *d = NULL;
    switch (form) {
    case DSV4_WF_F32: {
        float *f = falloc(nk);
        fill(f, nk, -1, 1);
        w->data = f;
        break;
    }
    case DSV4_WF_BF16:
    case DSV4_WF_F16: {
        uint16_t *h = malloc(nk * 2);
        for (size_t i = 0; i < nk; i++)
            h[i] = form == DSV4_WF_BF16 ? dsv4_f32_to_bf16(frand(-1, 1)) : dsv4_f32_to_f16(frand(-1, 1));
        w->data = h;
        break;
    }
    case DSV4_WF_FP8:
        d = malloc(nk);
        for (size_t i = 0; i < nk; i++)
            d[i] = fp8_code();
        w->data = d;
        ns = (size_t)((n + bn - 1) / bn) * ((k + bk - 1) / bk);
        break;
    default:
        d = malloc(nk / 2);
        for (size_t i = 0; i < nk / 2; i++)
            d[i] = (uint8_t)rnd();
        w->data = d;
        ns = (size_t)n * (k / bk);
        break;
    }
    if (ns) {
        w->bn = bn;
        w->bk = bk;
        w->scale_e8m0 = e8m0;
        if (e8m0) {
            uint8_t *s = malloc(ns);
            for (size_t i = 0; i < ns; i++) {
                uint8_t b;
                do
                    b = (uint8_t)(120 + rnd() % 15);
                while (b == 127);
                s[i] = b;
            }
            w->scale = s;
        } else {
            float *s = falloc(ns);
            fill(s, ns, 0.5f, 0.99f);
            w->scale = s;
        }
    }
}

static inline size_t scale_count(const dsv4_weight *w)
{
    if (w->form == DSV4_WF_FP8)
        return (size_t)((w->n + w->bn - 1) / w->bn) * ((w->k + w->bk - 1) / w->bk);
    return w->form == DSV4_WF_FP4 ? (size_t)w->n * (w->k / w->bk) : 0;
}

/* A copy of w's scales with the block over row `row`, columns 0..bk set to 1 (that block's
 * scale skipped), for the controls; free it. */
static inline void *scale_skipped(const dsv4_weight *w, int64_t row)
{
    size_t ns = scale_count(w), es = w->scale_e8m0 ? 1 : 4;
    size_t at = w->form == DSV4_WF_FP8 ? (size_t)(row / w->bn) * ((w->k + w->bk - 1) / w->bk) : (size_t)row * (w->k / w->bk);
    void *s = malloc(ns * es);
    memcpy(s, w->scale, ns * es);
    if (w->scale_e8m0)
        ((uint8_t *)s)[at] = 127;
    else
        ((float *)s)[at] = 1.0f;
    return s;
}

/* eid [R, K]: K distinct experts of E a row, as routing gives (E >= K). */
static inline void distinct_experts(int32_t *eid, int R, int K, int E)
{
    for (int r = 0; r < R; r++)
        for (int k = 0; k < K; k++) {
            int e, again;
            do {
                e = (int)(rnd() % (uint64_t)E);
                again = 0;
                for (int j = 0; j < k; j++)
                    again |= eid[r * K + j] == e;
            } while (again);
            eid[r * K + k] = e;
        }
}

#endif
