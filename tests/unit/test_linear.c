/* The CPU backend's linear against the plain row decode (dsv4_weight_row) summed in double, for
 * every stored form at shapes where the SIMD paths meet their scalar tails: k not a multiple of
 * 8, partial scale blocks, sub-ranges of rows. Tolerance per element 1e-5 * sum_k |w_k x_k|.
 * Control: the GPU op test caught an FP8 tail block scaled by 2^-16 (k % 8 != 0); the planted
 * control here is a reference with one scale block changed, which must be caught. Each case also
 * checks that a row computed alone (T = 1) equals the same row in the batch, bit for bit; the
 * batches of more than 128 inputs over ragged row counts cross the CPU kernel's input tiles and
 * the ends of its 16-row panels and 4-row groups. First, fp32 power-of-two block scales made e8m0
 * at load (dsv4_weight_scales_e8m0) give the linear the same bits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "core/core.h"
#include "io/weight.h"
#include "kernels/backend.h"
#include "kernels/cpu/weight_decode.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}
static float frand(void) { return rnd() / 2147483648.0f - 1.0f; }

/* worst |y - ref| / (1e-5 * mag) over the outputs */
static double worst(const dsv4_weight *w, int64_t r0, int64_t r1, const float *x, int T, const float *y)
{
    float *row = malloc(w->k * sizeof(float));
    double bad = 0;
    for (int64_t r = r0; r < r1; r++) {
        dsv4_weight_row(w, r, row);
        for (int t = 0; t < T; t++) {
            double s = 0, m = 0;
            for (int64_t j = 0; j < w->k; j++)
                s += (double)row[j] * x[t * w->k + j], m += fabs((double)row[j] * x[t * w->k + j]);
            double e = fabs(s - y[t * (r1 - r0) + (r - r0)]) / (1e-5 * m + 1e-30);
            bad = e > bad ? e : bad;
        }
    }
    free(row);
    return bad;
}

static void one(dsv4_wform form, int64_t n, int64_t k, int bn, int bk, int e8m0, int64_t r0, int64_t r1, int T)
{
    dsv4_weight w = {.name = "random", .form = form, .n = n, .k = k, .bn = bn, .bk = bk, .scale_e8m0 = e8m0};
    size_t nk = (size_t)n * k, ns = 0, es = e8m0 ? 1 : 4;
    uint8_t *d = malloc(nk * 4 + 8);
    for (size_t i = 0; i < nk * 4; i++)
        d[i] = (uint8_t)rnd();
    if (form == DSV4_WF_F32)
        for (size_t i = 0; i < nk; i++)
            ((float *)d)[i] = frand();
    if (form == DSV4_WF_BF16 || form == DSV4_WF_F16)
        for (size_t i = 0; i < nk; i++)
            ((uint16_t *)d)[i] = form == DSV4_WF_BF16 ? dsv4_f32_to_bf16(frand()) : dsv4_f32_to_f16(frand());
    if (form == DSV4_WF_FP8) {
        for (size_t i = 0; i < nk; i++)
            while ((d[i] & 0x7f) == 0x7f)
                d[i] = (uint8_t)rnd();
        ns = (size_t)((n + bn - 1) / bn) * ((k + bk - 1) / bk);
    }
    if (form == DSV4_WF_FP4)
        ns = (size_t)n * (k / bk);
    void *s = NULL;
    if (ns) {
        s = malloc(ns * es);
        for (size_t i = 0; i < ns; i++)
            if (e8m0)
                ((uint8_t *)s)[i] = (uint8_t)(120 + rnd() % 15);
            else
                ((float *)s)[i] = 0.5f + (rnd() % 1000) / 2000.0f;
    }
    w.data = d, w.scale = s;
    float *x = malloc((size_t)T * k * sizeof(float)), *y = malloc((size_t)T * (r1 - r0) * sizeof(float));
    for (int64_t i = 0; i < T * k; i++)
        x[i] = frand();
    dsv4_backend_cpu()->linear(&w, r0, r1, x, T, k, y, r1 - r0);
    double bad = worst(&w, r0, r1, x, T, y);
    printf("  linear %-4s [%lld,%lld] rows %lld..%lld T=%d  worst |diff|/tol %.3f\n", dsv4_wform_name(form), (long long)n,
           (long long)k, (long long)r0, (long long)r1, T, bad);
    CHECK(bad <= 1, "linear %s [%lld,%lld]: CPU linear differs from the row decode (%.1f x tolerance)", dsv4_wform_name(form),
          (long long)n, (long long)k, bad);
    /* row invariance: each input row alone (T = 1, the decode path, fused where the form allows)
     * gives the same bits as inside the batch */
    float *y1 = malloc((size_t)(r1 - r0) * sizeof(float));
    int same = 1;
    for (int t = 0; t < T; t++) {
        dsv4_backend_cpu()->linear(&w, r0, r1, x + (int64_t)t * k, 1, k, y1, r1 - r0);
        same &= !memcmp(y1, y + (int64_t)t * (r1 - r0), (size_t)(r1 - r0) * sizeof(float));
    }
    CHECK(same, "linear %s [%lld,%lld]: a row alone differs from the same row in a batch of %d", dsv4_wform_name(form),
          (long long)n, (long long)k, T);
    free(y1);
    if (ns) { /* control: the reference with the first scale block of row r0 doubled */
        size_t at = form == DSV4_WF_FP8 ? (size_t)(r0 / bn) * ((k + bk - 1) / bk) : (size_t)r0 * (k / bk);
        if (e8m0)
            ((uint8_t *)s)[at]++;
        else
            ((float *)s)[at] *= 2;
        double c = worst(&w, r0, r1, x, T, y);
        CHECK(c > 1, "control linear %s: a doubled scale block went unnoticed (%.3f)", dsv4_wform_name(form), c);
    }
    free(d), free(s), free(x), free(y);
}

/* dsv4_weight_scales_e8m0: fp32 scales that are powers of two become an owned e8m0 copy of the
 * same values (the linear's bits unchanged); any other scale leaves the weight as bound. */
static void scales_e8m0(dsv4_wform form)
{
    enum { N = 64, K = 256, T = 3 };
    const int fp8 = form == DSV4_WF_FP8, bn = fp8 ? 32 : 1, bk = fp8 ? 64 : 32;
    const int ns = fp8 ? (N / 32) * (K / 64) : N * (K / 32);
    uint8_t *d = malloc((size_t)N * K);
    for (int i = 0; i < N * K; i++)
        do
            d[i] = (uint8_t)rnd();
        while (fp8 && (d[i] & 0x7f) == 0x7f);
    float *s = malloc((size_t)ns * sizeof(float)), x[T * K], y[T * N], y2[T * N];
    for (int i = 0; i < ns; i++)
        s[i] = ldexpf(1.0f, (int)(rnd() % 15) - 7);
    for (int i = 0; i < T * K; i++)
        x[i] = frand();
    dsv4_weight w = {.name = "pow2", .form = form, .n = N, .k = K, .bn = bn, .bk = bk, .data = d, .scale = s};
    dsv4_backend_cpu()->linear(&w, 0, N, x, T, K, y, N);
    int did = dsv4_weight_scales_e8m0(&w);
    int same = did && w.scale_e8m0 && w.owned == w.scale;
    for (int i = 0; same && i < ns; i++)
        same = ldexpf(1.0f, ((const uint8_t *)w.scale)[i] - 127) == s[i];
    CHECK(same, "%s power-of-two fp32 scales: converted %d, e8m0 %d, values kept %d", dsv4_wform_name(form), did,
          w.scale_e8m0, same);
    dsv4_backend_cpu()->linear(&w, 0, N, x, T, K, y2, N);
    CHECK(!memcmp(y, y2, sizeof y), "%s power-of-two fp32 scales: the linear's bits changed with their e8m0 copy",
          dsv4_wform_name(form));
    dsv4_weight_release(&w);
    CHECK(w.owned == NULL, "release frees the e8m0 copy");
    const float odd[] = {0.75f, -0.5f, 0.0f, INFINITY, 1e-40f};
    for (int c = 0; c < 5; c++) {
        s[ns - 1] = odd[c];
        dsv4_weight v = {.name = "odd", .form = form, .n = N, .k = K, .bn = bn, .bk = bk, .data = d, .scale = s};
        CHECK(!dsv4_weight_scales_e8m0(&v) && v.scale == s && !v.scale_e8m0 && !v.owned,
              "%s: a scale of %g is not a power of two in e8m0's range: the weight stays as bound", dsv4_wform_name(form),
              (double)odd[c]);
    }
    printf("  %s fp32 power-of-two scales as e8m0: same values, same bits\n", dsv4_wform_name(form));
    free(d), free(s);
}

int main(void)
{
    scales_e8m0(DSV4_WF_FP8);
    scales_e8m0(DSV4_WF_FP4);
    one(DSV4_WF_FP8, 70, 100, 64, 64, 0, 0, 70, 5);
    one(DSV4_WF_FP8, 70, 100, 64, 64, 1, 3, 66, 2);
    one(DSV4_WF_FP8, 130, 300, 128, 128, 1, 0, 130, 3);
    one(DSV4_WF_FP8, 64, 13, 128, 128, 0, 0, 64, 1);
    one(DSV4_WF_FP8, 256, 512, 128, 128, 1, 0, 256, 9);
    one(DSV4_WF_FP4, 40, 80, 1, 16, 1, 0, 40, 3);
    one(DSV4_WF_FP4, 64, 96, 1, 32, 1, 3, 60, 2);
    one(DSV4_WF_FP4, 32, 1024, 1, 32, 0, 0, 32, 4);
    one(DSV4_WF_FP4, 48, 2048, 1, 32, 1, 0, 48, 5);
    one(DSV4_WF_BF16, 33, 45, 0, 0, 0, 0, 33, 2);
    one(DSV4_WF_BF16, 50, 300, 0, 0, 0, 5, 50, 3);
    one(DSV4_WF_BF16, 40, 1024, 0, 0, 0, 0, 40, 3);
    one(DSV4_WF_F16, 20, 77, 0, 0, 0, 0, 20, 2);
    one(DSV4_WF_F32, 20, 131, 0, 0, 0, 0, 20, 3);
    one(DSV4_WF_FP8, 37, 300, 128, 128, 1, 0, 37, 131);
    one(DSV4_WF_FP4, 53, 256, 1, 32, 1, 2, 53, 130);
    one(DSV4_WF_BF16, 21, 100, 0, 0, 0, 0, 21, 129);
    one(DSV4_WF_F32, 18, 40, 0, 0, 0, 1, 18, 257);
    return check_summary("linear");
}
