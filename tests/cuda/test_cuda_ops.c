/* Every CUDA op against the CPU reference, op by op, on fresh random inputs each run (the
 * seed is printed; DSV4_SEED=n repeats a run). Outputs are poisoned before each launch (host
 * buffers NaN-filled, device buffers NaN-filled by the backend), and NaN never passes.
 *
 * Tolerance: |gpu - cpu| <= 1e-5 * mag per element, where mag is the sum of the absolute
 * values of the terms that make the element (sum_k |w_k x_k| for a dot product, |ref| for
 * elementwise results, 1 for the hyper-connection mixes, which lie in (0, 2]). 1e-5 is above
 * the worst case of fp32 summation in the two orders at these lengths ((k/32 + 8) * 2^-24
 * each for k <= 2048) and far below what a wrong index or a skipped scale moves.
 *
 * Each op also has planted controls: the same comparison against a deliberately wrong
 * reference (one index off, one scale skipped, the limit skipped) must fail, so no check
 * passes by being unable to fail. And concurrent == solo: a batch of rows equals the same
 * rows one at a time on the GPU, bit for bit; a grouped launch (several experts in one grid)
 * equals the same weights launched one by one, bit for bit. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "core/core.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda.h"

static const dsv4_backend *cpu, *gpu;
static uint64_t rng;

static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static float frand(float lo, float hi) { return lo + (hi - lo) * (rnd() / 4294967296.0f); }

static float *falloc(size_t n) { return malloc((n ? n : 1) * sizeof(float)); }

static void fill(float *v, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        v[i] = frand(lo, hi);
}

static void poison(float *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        v[i] = NAN;
}

static const double REL = 1e-5;

/* Whether |got - ref| <= REL * mag everywhere with no NaN; prints the worst ratio unless quiet. */
static int agree(const char *what, const float *got, const float *ref, const double *mag, size_t n, int quiet)
{
    double worst = 0;
    size_t nan = 0, at = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i]) || isnan(ref[i])) {
            nan++;
            continue;
        }
        double r = fabs((double)got[i] - ref[i]) / (REL * mag[i] + 1e-30);
        if (r > worst) {
            worst = r;
            at = i;
        }
    }
    int ok = nan == 0 && worst <= 1.0;
    if (!quiet)
        printf("  %-44s worst |diff|/tol %.3f at %zu, NaN %zu  %s\n", what, worst, at, nan, ok ? "ok" : "FAIL");
    return ok;
}

/* The control must be caught: the comparison against a wrong reference fails. */
static void control(const char *what, const float *got, const float *wrong, const double *mag, size_t n)
{
    int caught = !agree(what, got, wrong, mag, n, 1);
    CHECK(caught, "control %s: a deliberately wrong reference passed the comparison", what);
    printf("  control %-36s %s\n", what, caught ? "caught" : "NOT CAUGHT");
}

/* ---- linear ------------------------------------------------------------------------------ */

typedef struct {
    dsv4_wform form;
    int64_t n, k;
    int bn, bk, e8m0;
    int64_t r0, r1;
    int T, padx, pady;
} lin_case;

static uint8_t fp8_code(void)
{
    uint8_t q;
    do
        q = (uint8_t)rnd();
    while ((q & 0x7f) == 0x7f);
    return q;
}

/* A random weight of the case's form; scales avoid 1.0 so a skipped scale shows. */
static void make_weight(const lin_case *c, dsv4_weight *w)
{
    memset(w, 0, sizeof *w);
    w->name = "random";
    w->form = c->form;
    w->n = c->n;
    w->k = c->k;
    size_t nk = (size_t)c->n * c->k, ns = 0;
    uint8_t *d = NULL;
    switch (c->form) {
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
            h[i] = c->form == DSV4_WF_BF16 ? dsv4_f32_to_bf16(frand(-1, 1)) : dsv4_f32_to_f16(frand(-1, 1));
        w->data = h;
        break;
    }
    case DSV4_WF_FP8:
        d = malloc(nk);
        for (size_t i = 0; i < nk; i++)
            d[i] = fp8_code();
        w->data = d;
        ns = (size_t)((c->n + c->bn - 1) / c->bn) * ((c->k + c->bk - 1) / c->bk);
        break;
    default:
        d = malloc(nk / 2);
        for (size_t i = 0; i < nk / 2; i++)
            d[i] = (uint8_t)rnd();
        w->data = d;
        ns = (size_t)c->n * (c->k / c->bk);
        break;
    }
    if (ns) {
        w->bn = c->bn;
        w->bk = c->bk;
        w->scale_e8m0 = c->e8m0;
        if (c->e8m0) {
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

static size_t scale_count(const dsv4_weight *w)
{
    if (w->form == DSV4_WF_FP8)
        return (size_t)((w->n + w->bn - 1) / w->bn) * ((w->k + w->bk - 1) / w->bk);
    return w->form == DSV4_WF_FP4 ? (size_t)w->n * (w->k / w->bk) : 0;
}

/* Where the weight is read from: copied in per call, resident in device memory, or pinned in
 * host memory mapped into the device (the memory plan's spilled experts). */
enum { PER_CALL, RESIDENT, PINNED };

static void test_linear(const lin_case *c, int where)
{
    char what[160];
    snprintf(what, sizeof what, "linear %s [%lld,%lld] rows %lld..%lld T=%d%s", dsv4_wform_name(c->form),
             (long long)c->n, (long long)c->k, (long long)c->r0, (long long)c->r1, c->T,
             where == RESIDENT ? " resident" : where == PINNED ? " pinned" : "");
    dsv4_weight w;
    make_weight(c, &w);
    dsv4_err err = {0};
    size_t dev0, pin0, dev1, pin1;
    dsv4_cuda_usage(&dev0, &pin0);
    if (where == RESIDENT)
        CHECK(!dsv4_cuda_put_weight(&w, &err), "%s: put: %s", what, err.msg);
    if (where == PINNED)
        CHECK(!dsv4_cuda_pin_weight(&w, &err), "%s: pin: %s", what, err.msg);
    dsv4_cuda_usage(&dev1, &pin1);
    size_t wb = dsv4_cuda_weight_bytes(&w);
    CHECK(dev1 - dev0 == (where == RESIDENT ? wb : 0) && pin1 - pin0 == (where == PINNED ? wb : 0),
          "%s: %zu bytes went to the device and %zu to pinned memory (weight %zu bytes)", what, dev1 - dev0, pin1 - pin0, wb);
    int64_t k = c->k, nr = c->r1 - c->r0, ldx = k + c->padx, ldy = nr + c->pady;
    int T = c->T;
    float *x = falloc((size_t)T * ldx), *ref = falloc((size_t)T * ldy), *got = falloc((size_t)T * ldy);
    float *row = falloc(k), *one = falloc(ldy);
    double *mag = malloc((size_t)T * nr * sizeof(double));
    fill(x, (size_t)T * ldx, -1, 1);
    cpu->linear(&w, c->r0, c->r1, x, T, ldx, ref, ldy);
    const float pad_mark = 12345.0f;
    for (size_t i = 0; i < (size_t)T * ldy; i++)
        got[i] = pad_mark;
    for (int t = 0; t < T; t++)
        poison(got + (size_t)t * ldy, nr);
    gpu->linear(&w, c->r0, c->r1, x, T, ldx, got, ldy);
    CHECK(!gpu->check(&err), "%s: %s", what, err.msg);
    for (int64_t i = 0; i < nr; i++) {
        dsv4_weight_row(&w, c->r0 + i, row);
        for (int t = 0; t < T; t++) {
            double s = 0;
            for (int64_t j = 0; j < k; j++)
                s += fabs((double)row[j] * x[(size_t)t * ldx + j]);
            mag[(size_t)t * nr + i] = s;
        }
    }
    /* pack [T, nr] views for the comparison */
    float *g = falloc((size_t)T * nr), *r = falloc((size_t)T * nr);
    int pad_ok = 1;
    for (int t = 0; t < T; t++) {
        memcpy(g + (size_t)t * nr, got + (size_t)t * ldy, nr * sizeof(float));
        memcpy(r + (size_t)t * nr, ref + (size_t)t * ldy, nr * sizeof(float));
        for (int64_t i = nr; i < ldy; i++)
            pad_ok &= got[(size_t)t * ldy + i] == pad_mark;
    }
    CHECK(agree(what, g, r, mag, (size_t)T * nr, 0), "%s: GPU and CPU differ beyond 1e-5 * sum|w x|", what);
    CHECK(pad_ok, "%s: wrote outside its output columns", what);

    /* control 1, one index off: the reference computed with x[T-1][j] and x[T-1][j+1] swapped */
    float *xs = falloc((size_t)T * ldx), *wr = falloc((size_t)T * ldy), *wp = falloc((size_t)T * nr);
    memcpy(xs, x, (size_t)T * ldx * sizeof(float));
    int64_t j = rnd() % (k - 1);
    /* a pair that differs (x within 1e-3 of its neighbour would hide the swap) */
    while (fabsf(xs[(size_t)(T - 1) * ldx + j] - xs[(size_t)(T - 1) * ldx + j + 1]) < 0.25f)
        j = (j + 1) % (k - 1);
    float tmp = xs[(size_t)(T - 1) * ldx + j];
    xs[(size_t)(T - 1) * ldx + j] = xs[(size_t)(T - 1) * ldx + j + 1];
    xs[(size_t)(T - 1) * ldx + j + 1] = tmp;
    cpu->linear(&w, c->r0, c->r1, xs, T, ldx, wr, ldy);
    for (int t = 0; t < T; t++)
        memcpy(wp + (size_t)t * nr, wr + (size_t)t * ldy, nr * sizeof(float));
    snprintf(what, sizeof what, "linear %s index off", dsv4_wform_name(c->form));
    control(what, g, wp, mag, (size_t)T * nr);

    /* control 2, one scale skipped: the GPU runs a copy of the weight whose scale block over
     * row r0, columns 0..bk is 1 (that block's scale skipped) */
    if (w.scale) {
        size_t ns = scale_count(&w), es = w.scale_e8m0 ? 1 : 4, at;
        at = w.form == DSV4_WF_FP8 ? (size_t)(c->r0 / w.bn) * ((w.k + w.bk - 1) / w.bk) : (size_t)c->r0 * (w.k / w.bk);
        void *s2 = malloc(ns * es);
        memcpy(s2, w.scale, ns * es);
        if (w.scale_e8m0)
            ((uint8_t *)s2)[at] = 127;
        else
            ((float *)s2)[at] = 1.0f;
        dsv4_weight w2 = w;
        w2.scale = s2;
        float *g2 = falloc((size_t)T * ldy), *gp = falloc((size_t)T * nr);
        poison(g2, (size_t)T * ldy);
        gpu->linear(&w2, c->r0, c->r1, x, T, ldx, g2, ldy);
        for (int t = 0; t < T; t++)
            memcpy(gp + (size_t)t * nr, g2 + (size_t)t * ldy, nr * sizeof(float));
        snprintf(what, sizeof what, "linear %s scale skipped", dsv4_wform_name(c->form));
        control(what, gp, r, mag, (size_t)T * nr);
        free(s2);
        free(g2);
        free(gp);
    }

    /* concurrent == solo */
    int same = 1;
    for (int t = 0; t < T; t++) {
        poison(one, ldy);
        gpu->linear(&w, c->r0, c->r1, x + (size_t)t * ldx, 1, ldx, one, ldy);
        same &= !memcmp(one, got + (size_t)t * ldy, nr * sizeof(float));
    }
    CHECK(same, "linear %s T=%d: a row alone differs from the same row in the batch", dsv4_wform_name(c->form), T);
    printf("  concurrent == solo (%d rows): %s\n", T, same ? "bitwise equal" : "DIFFERENT");
    if (where != PER_CALL)
        dsv4_cuda_drop_weight(&w);
    free((void *)w.data);
    free((void *)w.scale);
    free(x), free(ref), free(got), free(row), free(one), free(mag), free(g), free(r), free(xs), free(wr), free(wp);
}

/* ---- grouped linear: n weights of one form and shape in one launch ------------------------ */

static void test_linear_group(dsv4_wform form, int64_t n, int64_t k, int bn, int bk, int count, int T)
{
    char what[128];
    snprintf(what, sizeof what, "linear group %d x %s [%lld,%lld] T=%d", count, dsv4_wform_name(form), (long long)n,
             (long long)k, T);
    lin_case c = {form, n, k, bn, bk, 1, 0, n, T, 0, 0};
    dsv4_weight w[8];
    const dsv4_weight *wp[8];
    float *hx[8], *dx[8], *dy[8], *dg[8];
    size_t xb = (size_t)T * k * sizeof(float), yb = (size_t)T * n * sizeof(float);
    dsv4_err err = {0};
    int ok = 1;
    for (int j = 0; j < count; j++) {
        make_weight(&c, &w[j]);
        wp[j] = &w[j];
        ok &= !dsv4_cuda_put_weight(&w[j], &err);
        hx[j] = falloc((size_t)T * k);
        fill(hx[j], (size_t)T * k, -1, 1);
        ok &= cudaMalloc((void **)&dx[j], xb) == cudaSuccess && cudaMalloc((void **)&dy[j], yb) == cudaSuccess &&
              cudaMalloc((void **)&dg[j], yb) == cudaSuccess;
        ok &= cudaMemcpy(dx[j], hx[j], xb, cudaMemcpyHostToDevice) == cudaSuccess;
        ok &= cudaMemset(dy[j], 0xff, yb) == cudaSuccess && cudaMemset(dg[j], 0xff, yb) == cudaSuccess;
    }
    CHECK(ok, "%s: device setup failed: %s", what, err.msg);
    for (int j = 0; j < count; j++)
        CHECK(!dsv4_cuda_linear_dev(&w[j], 0, n, dx[j], T, dy[j], NULL, &err), "%s: %s", what, err.msg);
    CHECK(!dsv4_cuda_linear_group_dev(wp, count, (const float *const *)dx, T, dg, NULL, &err), "%s: %s", what, err.msg);
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "%s: %s", what, cudaGetErrorString(cudaGetLastError()));
    float *one = falloc((size_t)T * n), *grp = falloc((size_t)T * n), *ref = falloc((size_t)T * n);
    double *mag = malloc((size_t)T * n * sizeof(double));
    float *row = falloc(k);
    int same = 1, close = 1;
    for (int j = 0; j < count; j++) {
        cudaMemcpy(one, dy[j], yb, cudaMemcpyDeviceToHost);
        cudaMemcpy(grp, dg[j], yb, cudaMemcpyDeviceToHost);
        same &= !memcmp(one, grp, yb);
        cpu->linear(&w[j], 0, n, hx[j], T, k, ref, n);
        for (int64_t i = 0; i < n; i++) {
            dsv4_weight_row(&w[j], i, row);
            for (int t = 0; t < T; t++) {
                double m = 0;
                for (int64_t q = 0; q < k; q++)
                    m += fabs((double)row[q] * hx[j][(size_t)t * k + q]);
                mag[(size_t)t * n + i] = m;
            }
        }
        close &= agree(what, grp, ref, mag, (size_t)T * n, j > 0);
        if (j == 1) { /* control: job 1's result against job 0's reference (one job index off) */
            float *ref0 = falloc((size_t)T * n);
            cpu->linear(&w[0], 0, n, hx[0], T, k, ref0, n);
            control("linear group job index off", grp, ref0, mag, (size_t)T * n);
            free(ref0);
        }
    }
    CHECK(close, "%s: GPU and CPU differ", what);
    CHECK(same, "%s: the grouped launch differs from the weights launched one by one", what);
    printf("  grouped == one by one (%d weights): %s\n", count, same ? "bitwise equal" : "DIFFERENT");
    for (int j = 0; j < count; j++) {
        dsv4_cuda_drop_weight(&w[j]);
        free((void *)w[j].data);
        free((void *)w[j].scale);
        free(hx[j]);
        cudaFree(dx[j]);
        cudaFree(dy[j]);
        cudaFree(dg[j]);
    }
    free(one), free(grp), free(ref), free(mag), free(row);
}

/* ---- rmsnorm ----------------------------------------------------------------------------- */

static void test_rmsnorm(int rows, int dim, int with_w, int in_place)
{
    char what[128];
    snprintf(what, sizeof what, "rmsnorm %dx%d%s%s", rows, dim, with_w ? " weighted" : "", in_place ? " in place" : "");
    size_t n = (size_t)rows * dim;
    float *x = falloc(n), *w = with_w ? falloc(dim) : NULL, *ref = falloc(n), *got = falloc(n), *wr = falloc(n);
    double *mag = malloc(n * sizeof(double));
    fill(x, n, -2, 2);
    if (w)
        fill(w, dim, 0.5f, 1.5f);
    cpu->rmsnorm(x, rows, dim, w, 1e-6f, ref);
    if (in_place) {
        memcpy(got, x, n * sizeof(float));
        gpu->rmsnorm(got, rows, dim, w, 1e-6f, got);
    } else {
        poison(got, n);
        gpu->rmsnorm(x, rows, dim, w, 1e-6f, got);
    }
    for (size_t i = 0; i < n; i++)
        mag[i] = fabs(ref[i]);
    CHECK(agree(what, got, ref, mag, n, 0), "%s: GPU and CPU differ", what);
    if (w) { /* control: one weight index off */
        float *w2 = falloc(dim);
        memcpy(w2, w, dim * sizeof(float));
        int j = rnd() % (dim - 1);
        while (fabsf(w[j] - w[j + 1]) < 0.1f)
            j = (j + 1) % (dim - 1);
        w2[j] = w[j + 1];
        cpu->rmsnorm(x, rows, dim, w2, 1e-6f, wr);
        control("rmsnorm weight index off", got, wr, mag, n);
        free(w2);
    }
    int same = 1;
    float *one = falloc(dim);
    for (int r = 0; r < rows; r++) {
        poison(one, dim);
        gpu->rmsnorm(x + (size_t)r * dim, 1, dim, w, 1e-6f, one);
        same &= !memcmp(one, got + (size_t)r * dim, dim * sizeof(float));
    }
    CHECK(same, "%s: a row alone differs from the batch", what);
    free(x), free(w), free(ref), free(got), free(wr), free(mag), free(one);
}

/* ---- rope -------------------------------------------------------------------------------- */

static void test_rope(int T, int heads, int d, int rd, int pad, int inverse)
{
    char what[128];
    snprintf(what, sizeof what, "rope T=%d %dx%d rd=%d%s", T, heads, d, rd, inverse ? " inverse" : "");
    int64_t stride = (int64_t)heads * d + pad;
    size_t n = (size_t)T * stride;
    float *x = falloc(n), *ref = falloc(n), *got = falloc(n), *wr = falloc(n), *freq = falloc(rd / 2);
    int64_t *pos = malloc(T * sizeof(int64_t));
    double *mag = malloc(n * sizeof(double));
    fill(x, n, -1, 1);
    for (int i = 0; i < rd / 2; i++)
        freq[i] = powf(10000.0f, -(float)(2 * i) / rd);
    for (int t = 0; t < T; t++)
        pos[t] = rnd() % 70000;
    memcpy(ref, x, n * sizeof(float));
    memcpy(got, x, n * sizeof(float));
    cpu->rope(ref, T, stride, heads, d, rd, freq, pos, inverse);
    gpu->rope(got, T, stride, heads, d, rd, freq, pos, inverse);
    for (size_t i = 0; i < n; i++)
        mag[i] = fabs(x[i]) + fabs(x[i ^ 1]);
    CHECK(agree(what, got, ref, mag, n, 0), "%s: GPU and CPU differ", what);
    /* control: the reference one position off on the last row */
    memcpy(wr, x, n * sizeof(float));
    pos[T - 1]++;
    cpu->rope(wr, T, stride, heads, d, rd, freq, pos, inverse);
    pos[T - 1]--;
    control("rope position off by one", got, wr, mag, n);
    int same = 1;
    float *one = falloc(stride);
    for (int t = 0; t < T; t++) {
        memcpy(one, x + (size_t)t * stride, stride * sizeof(float));
        gpu->rope(one, 1, stride, heads, d, rd, freq, pos + t, inverse);
        same &= !memcmp(one, got + (size_t)t * stride, stride * sizeof(float));
    }
    CHECK(same, "%s: a row alone differs from the batch", what);
    free(x), free(ref), free(got), free(wr), free(freq), free(pos), free(mag), free(one);
}

/* ---- hyper-connections ---------------------------------------------------------------------- */

typedef struct {
    float *pre, *post, *comb, *h;
} hc_out;

static hc_out hc_alloc(int T, int n, int D, int full)
{
    hc_out o = {falloc((size_t)T * n), full ? falloc((size_t)T * n) : NULL, full ? falloc((size_t)T * n * n) : NULL,
                falloc((size_t)T * D)};
    poison(o.pre, (size_t)T * n);
    poison(o.h, (size_t)T * D);
    if (full) {
        poison(o.post, (size_t)T * n);
        poison(o.comb, (size_t)T * n * n);
    }
    return o;
}

static void hc_free(hc_out *o)
{
    free(o->pre), free(o->post), free(o->comb), free(o->h);
}

/* All outputs of one hc_pre in one array (pre, post, comb, h), with their magnitudes. */
static float *hc_flat(const hc_out *o, int T, int n, int D, int full, size_t *len)
{
    size_t a = (size_t)T * n, c = full ? (size_t)T * n * n : 0, hd = (size_t)T * D;
    size_t L = a + (full ? a : 0) + c + hd;
    float *v = falloc(L), *p = v;
    memcpy(p, o->pre, a * sizeof(float)), p += a;
    if (full) {
        memcpy(p, o->post, a * sizeof(float)), p += a;
        memcpy(p, o->comb, c * sizeof(float)), p += c;
    }
    memcpy(p, o->h, hd * sizeof(float));
    *len = L;
    return v;
}

static void test_hc_pre(int T, int n, int D, int full)
{
    char what[128];
    snprintf(what, sizeof what, "hc_pre T=%d n=%d D=%d%s", T, n, D, full ? " + sinkhorn" : " (head)");
    int nm = full ? (2 + n) * n : n, iters = 20;
    int64_t nd = (int64_t)n * D;
    float *X = falloc((size_t)T * nd), *fn = falloc((size_t)nm * nd), *base = falloc(nm), scale[3];
    fill(X, (size_t)T * nd, -1, 1);
    fill(fn, (size_t)nm * nd, -1.0f / sqrtf(nd), 1.0f / sqrtf(nd));
    fill(base, nm, -1, 1);
    fill(scale, 3, 0.5f, 2.0f);
    hc_out r = hc_alloc(T, n, D, full), g = hc_alloc(T, n, D, full), w = hc_alloc(T, n, D, full);
    cpu->hc_pre(X, T, n, D, fn, base, scale, iters, 1e-6f, 1e-6f, r.pre, r.post, r.comb, r.h);
    gpu->hc_pre(X, T, n, D, fn, base, scale, iters, 1e-6f, 1e-6f, g.pre, g.post, g.comb, g.h);
    size_t L;
    float *rf = hc_flat(&r, T, n, D, full, &L), *gf = hc_flat(&g, T, n, D, full, &L);
    double *mag = malloc(L * sizeof(double));
    size_t hs = L - (size_t)T * D;
    for (size_t i = 0; i < hs; i++)
        mag[i] = 1.0;
    for (int t = 0; t < T; t++)
        for (int dd = 0; dd < D; dd++) {
            double s = 0;
            for (int i = 0; i < n; i++)
                s += fabs((double)r.pre[t * n + i] * X[(size_t)t * nd + (size_t)i * D + dd]);
            mag[hs + (size_t)t * D + dd] = s;
        }
    CHECK(agree(what, gf, rf, mag, L, 0), "%s: GPU and CPU differ", what);
    /* control: the reference with two neighbouring mix rows of fn swapped (one index off) */
    float *fn2 = falloc((size_t)nm * nd);
    memcpy(fn2, fn, (size_t)nm * nd * sizeof(float));
    int j = full ? 2 * n : 0;
    memcpy(fn2 + (size_t)j * nd, fn + (size_t)(j + 1) * nd, nd * sizeof(float));
    memcpy(fn2 + (size_t)(j + 1) * nd, fn + (size_t)j * nd, nd * sizeof(float));
    cpu->hc_pre(X, T, n, D, fn2, base, scale, iters, 1e-6f, 1e-6f, w.pre, w.post, w.comb, w.h);
    float *wf = hc_flat(&w, T, n, D, full, &L);
    control(full ? "hc_pre mix row off by one" : "hc_pre (head) mix row off by one", gf, wf, mag, L);
    int same = 1;
    for (int t = 0; t < T; t++) {
        hc_out o = hc_alloc(1, n, D, full);
        gpu->hc_pre(X + (size_t)t * nd, 1, n, D, fn, base, scale, iters, 1e-6f, 1e-6f, o.pre, o.post, o.comb, o.h);
        same &= !memcmp(o.pre, g.pre + (size_t)t * n, n * sizeof(float));
        same &= !memcmp(o.h, g.h + (size_t)t * D, D * sizeof(float));
        if (full) {
            same &= !memcmp(o.post, g.post + (size_t)t * n, n * sizeof(float));
            same &= !memcmp(o.comb, g.comb + (size_t)t * n * n, (size_t)n * n * sizeof(float));
        }
        hc_free(&o);
    }
    CHECK(same, "%s: a row alone differs from the batch", what);
    /* mixes only (h NULL, as V4.1 calls it): the same mixes, bitwise, and no error */
    hc_out o = hc_alloc(T, n, D, full);
    dsv4_err err = {0};
    gpu->hc_pre(X, T, n, D, fn, base, scale, iters, 1e-6f, 1e-6f, o.pre, o.post, o.comb, NULL);
    int mix_same = !gpu->check(&err) && !memcmp(o.pre, g.pre, (size_t)T * n * sizeof(float));
    if (full)
        mix_same &= !memcmp(o.post, g.post, (size_t)T * n * sizeof(float)) &&
                    !memcmp(o.comb, g.comb, (size_t)T * n * n * sizeof(float));
    CHECK(mix_same, "%s: mixes only (h NULL) differ from the full call: %s", what, err.msg);
    printf("  mixes only (h NULL): %s\n", mix_same ? "bitwise equal" : "DIFFERENT");
    hc_free(&o);
    hc_free(&r), hc_free(&g), hc_free(&w);
    free(X), free(fn), free(fn2), free(base), free(rf), free(gf), free(wf), free(mag);
}

/* h = sum_i pre_i X_i with pre given (V4.1's collapse). */
static void test_hc_collapse(int T, int n, int D)
{
    char what[128];
    snprintf(what, sizeof what, "hc_collapse T=%d n=%d D=%d", T, n, D);
    int64_t nd = (int64_t)n * D;
    float *X = falloc((size_t)T * nd), *pre = falloc((size_t)T * n), *ref = falloc((size_t)T * D);
    float *got = falloc((size_t)T * D), *wrong = falloc((size_t)T * D), *one = falloc(D), *pre2 = falloc((size_t)T * n);
    double *mag = malloc((size_t)T * D * sizeof(double));
    fill(X, (size_t)T * nd, -1, 1);
    fill(pre, (size_t)T * n, 0.1f, 1.0f);
    pre[(size_t)(T - 1) * n] = 0.2f, pre[(size_t)(T - 1) * n + 1] = 0.9f; /* the control's pair differs */
    cpu->hc_collapse(X, T, n, D, pre, ref);
    poison(got, (size_t)T * D);
    gpu->hc_collapse(X, T, n, D, pre, got);
    dsv4_err err = {0};
    CHECK(!gpu->check(&err), "%s: %s", what, err.msg);
    for (int t = 0; t < T; t++)
        for (int dd = 0; dd < D; dd++) {
            double s = 0;
            for (int i = 0; i < n; i++)
                s += fabs((double)pre[t * n + i] * X[(size_t)t * nd + (size_t)i * D + dd]);
            mag[(size_t)t * D + dd] = s;
        }
    CHECK(agree(what, got, ref, mag, (size_t)T * D, 0), "%s: GPU and CPU differ", what);
    /* control: the reference with the last row's first two pre swapped (one index off) */
    memcpy(pre2, pre, (size_t)T * n * sizeof(float));
    float *p = pre2 + (size_t)(T - 1) * n, tmp = p[0];
    p[0] = p[1], p[1] = tmp;
    cpu->hc_collapse(X, T, n, D, pre2, wrong);
    control("hc_collapse pre index off", got, wrong, mag, (size_t)T * D);
    int same = 1;
    for (int t = 0; t < T; t++) {
        poison(one, D);
        gpu->hc_collapse(X + (size_t)t * nd, 1, n, D, pre + (size_t)t * n, one);
        same &= !memcmp(one, got + (size_t)t * D, D * sizeof(float));
    }
    CHECK(same, "%s: a row alone differs from the batch", what);
    printf("  concurrent == solo (%d rows): %s\n", T, same ? "bitwise equal" : "DIFFERENT");
    free(X), free(pre), free(ref), free(got), free(wrong), free(one), free(pre2), free(mag);
}

static void test_hc_post(int T, int n, int D)
{
    char what[128];
    snprintf(what, sizeof what, "hc_post T=%d n=%d D=%d", T, n, D);
    size_t nx = (size_t)T * n * D;
    float *X = falloc(nx), *y = falloc((size_t)T * D), *post = falloc((size_t)T * n), *comb = falloc((size_t)T * n * n);
    float *ref = falloc(nx), *got = falloc(nx), *wr = falloc(nx), *comb2 = falloc((size_t)T * n * n);
    double *mag = malloc(nx * sizeof(double));
    fill(X, nx, -1, 1);
    fill(y, (size_t)T * D, -1, 1);
    fill(post, (size_t)T * n, 0, 2);
    fill(comb, (size_t)T * n * n, 0, 1);
    memcpy(ref, X, nx * sizeof(float));
    memcpy(got, X, nx * sizeof(float));
    cpu->hc_post(ref, y, T, n, D, post, comb);
    gpu->hc_post(got, y, T, n, D, post, comb);
    for (int t = 0; t < T; t++)
        for (int k = 0; k < n; k++)
            for (int dd = 0; dd < D; dd++) {
                double s = fabs((double)post[t * n + k] * y[(size_t)t * D + dd]);
                for (int j = 0; j < n; j++)
                    s += fabs((double)comb[(size_t)t * n * n + j * n + k] * X[((size_t)t * n + j) * D + dd]);
                mag[((size_t)t * n + k) * D + dd] = s;
            }
    CHECK(agree(what, got, ref, mag, nx, 0), "%s: GPU and CPU differ", what);
    /* control: comb read transposed for the first row (j and k swapped) */
    memcpy(comb2, comb, (size_t)T * n * n * sizeof(float));
    for (int j = 0; j < n; j++)
        for (int k = 0; k < n; k++)
            comb2[j * n + k] = comb[k * n + j];
    memcpy(wr, X, nx * sizeof(float));
    cpu->hc_post(wr, y, T, n, D, post, comb2);
    control("hc_post comb indices swapped", got, wr, mag, nx);
    int same = 1;
    float *one = falloc((size_t)n * D);
    for (int t = 0; t < T; t++) {
        memcpy(one, X + (size_t)t * n * D, (size_t)n * D * sizeof(float));
        gpu->hc_post(one, y + (size_t)t * D, 1, n, D, post + t * n, comb + (size_t)t * n * n);
        same &= !memcmp(one, got + (size_t)t * n * D, (size_t)n * D * sizeof(float));
    }
    CHECK(same, "%s: a row alone differs from the batch", what);
    free(X), free(y), free(post), free(comb), free(ref), free(got), free(wr), free(comb2), free(mag), free(one);
}

/* ---- attend ------------------------------------------------------------------------------- */

static void test_attend(int H, int d, int nk, int pool)
{
    char what[128];
    snprintf(what, sizeof what, "attend H=%d d=%d keys=%d", H, d, nk);
    float *q = falloc((size_t)H * d), *kp = falloc((size_t)pool * d), *sink = falloc(H);
    float *ref = falloc((size_t)H * d), *got = falloc((size_t)H * d), *wr = falloc((size_t)H * d);
    const float **keys = malloc((nk + 1) * sizeof(float *)), **k2 = malloc((nk + 1) * sizeof(float *));
    double *mag = malloc((size_t)H * d * sizeof(double));
    fill(q, (size_t)H * d, -1, 1);
    fill(kp, (size_t)pool * d, -1, 1);
    fill(sink, H, -1, 1);
    for (int i = 0; i < nk; i++)
        keys[i] = kp + (size_t)(rnd() % pool) * d;
    float scale = 1.0f / sqrtf((float)d);
    cpu->attend(q, H, d, keys, nk, scale, sink, ref);
    poison(got, (size_t)H * d);
    gpu->attend(q, H, d, keys, nk, scale, sink, got);
    for (int h = 0; h < H; h++)
        for (int j = 0; j < d; j++) {
            double m = 0;
            for (int i = 0; i < nk; i++)
                m = fmax(m, fabs(keys[i][j]));
            mag[(size_t)h * d + j] = m;
        }
    CHECK(agree(what, got, ref, mag, (size_t)H * d, 0), "%s: GPU and CPU differ", what);
    if (nk >= 2) { /* control: one key one place off */
        memcpy(k2, keys, nk * sizeof(float *));
        int i = rnd() % (nk - 1);
        k2[i] = keys[i + 1] != keys[i] ? keys[i + 1] : kp + (size_t)((keys[i] - kp) / d + 1) % pool * d;
        cpu->attend(q, H, d, k2, nk, scale, sink, wr);
        control("attend key index off", got, wr, mag, (size_t)H * d);
    }
    free(q), free(kp), free(sink), free(ref), free(got), free(wr), free(keys), free(k2), free(mag);
}

/* ---- swiglu ------------------------------------------------------------------------------- */

static void test_swiglu(int64_t n, float limit)
{
    char what[128];
    snprintf(what, sizeof what, "swiglu n=%lld limit %g", (long long)n, limit);
    float *g = falloc(n), *u = falloc(n), *ref = falloc(n), *got = falloc(n), *wr = falloc(n);
    double *mag = malloc(n * sizeof(double));
    fill(g, n, -3, 3);
    fill(u, n, -3, 3);
    cpu->swiglu(g, u, n, limit, ref);
    poison(got, n);
    gpu->swiglu(g, u, n, limit, got);
    for (int64_t i = 0; i < n; i++)
        mag[i] = fabs(ref[i]);
    CHECK(agree(what, got, ref, mag, n, 0), "%s: GPU and CPU differ", what);
    /* control: the clamp skipped (limit > 0), or one element off (no limit) */
    if (limit > 0)
        cpu->swiglu(g, u, n, 0, wr);
    else {
        memcpy(wr, ref, n * sizeof(float));
        wr[n / 2] = ref[n / 2 + 1];
    }
    control(limit > 0 ? "swiglu limit skipped" : "swiglu one index off", got, wr, mag, n);
    float *half = falloc(n);
    poison(half, n);
    gpu->swiglu(g, u, n / 2, limit, half);
    gpu->swiglu(g + n / 2, u + n / 2, n - n / 2, limit, half + n / 2);
    CHECK(!memcmp(half, got, n * sizeof(float)), "%s: two halves differ from one call", what);
    free(g), free(u), free(ref), free(got), free(wr), free(mag), free(half);
}

int main(void)
{
    dsv4_err err = {0};
    if (dsv4_cuda_init(&err)) {
        fprintf(stderr, "test_cuda_ops: %s\n", err.msg);
        CHECK(0, "no GPU: %s", err.msg);
        return check_summary("cuda ops");
    }
    const char *seed = getenv("DSV4_SEED");
    rng = seed ? strtoull(seed, NULL, 10) : ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
    if (!rng)
        rng = 1;
    printf("cuda ops on %s, seed %llu (DSV4_SEED to repeat)\n", dsv4_cuda_device_name(), (unsigned long long)rng);
    cpu = dsv4_backend_cpu();
    gpu = dsv4_backend_cuda();
    dsv4_cuda_set_poison(1);

    const lin_case lc[] = {
        {DSV4_WF_FP8, 256, 512, 128, 128, 1, 0, 256, 9, 0, 0},
        {DSV4_WF_FP8, 200, 320, 64, 64, 1, 37, 173, 3, 5, 3},    /* sub-range, strided in and out */
        {DSV4_WF_FP8, 70, 100, 64, 64, 0, 0, 70, 5, 0, 0},       /* k % 16 != 0: element path, f32 scales */
        {DSV4_WF_FP8, 96, 2048, 128, 128, 0, 0, 96, 1, 0, 0},    /* f32 scales, long rows */
        {DSV4_WF_FP4, 128, 1024, 1, 32, 1, 0, 128, 9, 0, 0},
        {DSV4_WF_FP4, 64, 96, 1, 32, 1, 3, 60, 2, 2, 1},         /* k % 32 == 0, sub-range */
        {DSV4_WF_FP4, 40, 80, 1, 16, 1, 0, 40, 3, 0, 0},         /* bk 16: element path */
        {DSV4_WF_BF16, 300, 768, 0, 0, 0, 0, 300, 10, 0, 0},
        {DSV4_WF_BF16, 33, 45, 0, 0, 0, 0, 33, 2, 1, 0},         /* element path */
        {DSV4_WF_F16, 64, 256, 0, 0, 0, 8, 64, 4, 0, 2},
        {DSV4_WF_F32, 50, 132, 0, 0, 0, 0, 50, 8, 4, 0},
    };
    for (size_t i = 0; i < sizeof lc / sizeof lc[0]; i++)
        test_linear(&lc[i], i % 3 == 0 ? RESIDENT : i % 3 == 1 ? PINNED : PER_CALL);
    test_linear_group(DSV4_WF_FP4, 96, 512, 1, 32, 6, 1);
    test_linear_group(DSV4_WF_FP8, 128, 384, 128, 128, 3, 3);
    test_rmsnorm(5, 1000, 1, 0);
    test_rmsnorm(3, 4096, 0, 0);
    test_rmsnorm(4, 512, 1, 1);
    test_rope(4, 3, 64, 16, 8, 0);
    test_rope(3, 8, 128, 64, 0, 1);
    test_hc_pre(3, 4, 512, 1);
    test_hc_pre(2, 4, 700, 0);
    test_hc_post(3, 4, 700);
    test_hc_collapse(5, 4, 700);
    test_attend(4, 96, 37, 50);
    test_attend(8, 512, 300, 400);
    test_attend(2, 64, 0, 1);
    test_swiglu(10001, 1.0f);
    test_swiglu(4096, 0.0f);
    CHECK(!gpu->check(&err), "a CUDA op failed: %s", err.msg);
    return check_summary("cuda ops");
}
