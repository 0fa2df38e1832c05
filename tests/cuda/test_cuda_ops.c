/* Every CUDA op against the CPU reference, op by op, on fresh random inputs each run (the
 * seed is printed; DSV4_SEED=n repeats a run). The ops take device buffers only: a test keeps
 * its arrays on the host and runs each op through a wrapper (g_*) that uploads them, runs the
 * op on the device copies and downloads its outputs; constant arrays go up as device copies
 * and weights are placed (resident, or pinned host memory mapped into the device). Outputs
 * are poisoned before each launch (NaN-filled before the upload, and NaN-filled again by the
 * backend's poisoning), and NaN never passes.
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
 * equals the same weights launched one by one, bit for bit. A weight or constant never placed
 * is refused (the op fails naming it, its output NaN), never copied in behind the caller. */
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
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/weight_decode.h"
#include "kernels/cuda/cuda.h"

static const dsv4_backend *cpu, *gpu;
#include "test_rng.h"
#include "op_check.h"

static const double REL = 1e-5;

static int agree(const char *what, const float *got, const float *ref, const double *mag, size_t n, int quiet)
{
    return agree_within(what, got, ref, mag, n, REL, quiet);
}

static void control(const char *what, const float *got, const float *wrong, const double *mag, size_t n)
{
    control_within(what, got, wrong, mag, n, REL);
}

/* ---- the GPU ops over host arrays --------------------------------------------------------- */

#include "dev_buf.h"

/* A device copy of host [bytes] (NULL for NULL), and the way back: d downloaded into h (when
 * both are there), then freed. */
static void *up(const void *h, size_t bytes) { return h ? to_dev(h, bytes) : NULL; }

static void down(void *h, void *d, size_t bytes)
{
    if (h && d)
        gpu->download(h, d, bytes);
    if (d)
        gpu->free(d);
}

static void drop(void *d)
{
    if (d)
        gpu->free(d);
}

/* Each wrapper uploads every array it is given (outputs too, so what an op must not write keeps
 * its bytes), runs the op over the device copies (an output that aliases an input is one copy)
 * and downloads the outputs; x and y of the linear ops span (T - 1) ld + width floats. */
static void g_linear(const dsv4_weight *w, int64_t r0, int64_t r1, const float *x, int T, int64_t ldx, float *y,
                     int64_t ldy)
{
    size_t xb = ((size_t)(T - 1) * ldx + w->k) * sizeof(float), yb = ((size_t)(T - 1) * ldy + (r1 - r0)) * sizeof(float);
    float *dx = up(x, xb), *dy = up(y, yb);
    gpu->linear(w, r0, r1, dx, T, ldx, dy, ldy);
    drop(dx);
    down(y, dy, yb);
}

static void g_rmsnorm(const float *x, int64_t rows, int dim, const float *w, float eps, float *y)
{
    size_t b = (size_t)rows * dim * sizeof(float);
    float *dx = up(x, b), *dy = y == x ? dx : up(y, b), *dw = up(w, (size_t)dim * sizeof(float));
    gpu->rmsnorm(dx, rows, dim, dw, eps, dy);
    drop(dw);
    if (dy != dx)
        drop(dx);
    down(y, dy, b);
}

static void g_rope(float *x, int T, int64_t stride, int heads, int d, int rd, const float *freq, const int64_t *pos,
                   int inverse)
{
    size_t xb = ((size_t)(T - 1) * stride + (size_t)heads * d) * sizeof(float);
    float *dx = up(x, xb), *df = up(freq, (size_t)(rd / 2) * sizeof(float));
    int64_t *dp = up(pos, (size_t)T * sizeof(int64_t));
    gpu->rope(dx, T, stride, heads, d, rd, df, dp, inverse);
    drop(df), drop(dp);
    down(x, dx, xb);
}

static void g_hc_pre(const float *X, int T, int n, int D, const float *fn, const float *base, const float *scale,
                     int iters, float hc_eps, float norm_eps, float *pre, float *post, float *comb, float *h,
                     const float *hw)
{
    size_t nm = post ? (size_t)(2 + n) * n : (size_t)n, nd = (size_t)n * D, f = sizeof(float);
    float *dX = up(X, T * nd * f), *dfn = up(fn, nm * nd * f), *db = up(base, nm * f), *ds = up(scale, (post ? 3 : 1) * f);
    float *dhw = up(hw, (size_t)D * f), *dpre = up(pre, (size_t)T * n * f), *dpost = up(post, (size_t)T * n * f);
    float *dcomb = up(comb, (size_t)T * n * n * f), *dh = up(h, (size_t)T * D * f);
    gpu->hc_pre(dX, T, n, D, dfn, db, ds, iters, hc_eps, norm_eps, dpre, dpost, dcomb, dh, dhw);
    drop(dX), drop(dfn), drop(db), drop(ds), drop(dhw);
    down(pre, dpre, (size_t)T * n * f);
    down(post, dpost, (size_t)T * n * f);
    down(comb, dcomb, (size_t)T * n * n * f);
    down(h, dh, (size_t)T * D * f);
}

static void g_hc_collapse(const float *X, int T, int n, int D, const float *pre, float *h)
{
    size_t f = sizeof(float);
    float *dX = up(X, (size_t)T * n * D * f), *dp = up(pre, (size_t)T * n * f), *dh = up(h, (size_t)T * D * f);
    gpu->hc_collapse(dX, T, n, D, dp, dh);
    drop(dX), drop(dp);
    down(h, dh, (size_t)T * D * f);
}

static void g_hc_post(float *X, const float *y, int T, int n, int D, const float *post, const float *comb)
{
    size_t f = sizeof(float);
    float *dX = up(X, (size_t)T * n * D * f), *dy = up(y, (size_t)T * D * f), *dpo = up(post, (size_t)T * n * f);
    float *dc = up(comb, (size_t)T * n * n * f);
    gpu->hc_post(dX, dy, T, n, D, dpo, dc);
    drop(dy), drop(dpo), drop(dc);
    down(X, dX, (size_t)T * n * D * f);
}

/* The key rows gathered into one device matrix, and the op's key table pointing at them. */
static void g_attend(const float *q, int H, int d, const float *const *keys, int nk, float scale, const float *sink,
                     float *out)
{
    size_t f = sizeof(float), nr = nk > 0 ? (size_t)nk : 1;
    float *dq = up(q, (size_t)H * d * f), *ds = up(sink, (size_t)H * f), *dout = up(out, (size_t)H * d * f);
    float *rows = to_dev(NULL, nr * d * f);
    const float **tab = malloc(nr * sizeof *tab);
    for (int i = 0; i < nk; i++) {
        gpu->upload(rows + (size_t)i * d, keys[i], (size_t)d * f);
        tab[i] = rows + (size_t)i * d;
    }
    void *dtab = to_dev(nk > 0 ? tab : NULL, nr * sizeof *tab);
    gpu->attend(dq, H, d, dtab, nk, scale, ds, dout);
    drop(dq), drop(ds), drop(rows), drop(dtab);
    down(out, dout, (size_t)H * d * f);
    free(tab);
}

static void g_swiglu(const float *g, const float *u, int64_t n, float limit, float *h)
{
    size_t b = (size_t)n * sizeof(float);
    float *dg = up(g, b), *du = up(u, b), *dh = h == g ? dg : h == u ? du : up(h, b);
    gpu->swiglu(dg, du, n, limit, dh);
    if (dg != dh)
        drop(dg);
    if (du != dh)
        drop(du);
    down(h, dh, b);
}

static void g_embed(const dsv4_weight *w, const int32_t *ids, int T, int n, float *X)
{
    size_t xb = (size_t)T * n * w->k * sizeof(float);
    int32_t *di = up(ids, (size_t)T * sizeof(int32_t));
    float *dX = up(X, xb);
    gpu->embed(w, di, T, n, dX);
    drop(di);
    down(X, dX, xb);
}

/* A weight that was never placed: the op was refused, not served by a copy. check() reports a
 * failure naming the op and the weight, and the output rows [T, nr] (stride ldy) are NaN. */
static void check_refused(const char *what, const char *op, const dsv4_weight *w, const float *y, int T, int64_t nr,
                          int64_t ldy)
{
    dsv4_err err = {0};
    int code = gpu->check(&err);
    int named = code && strstr(err.msg, op) && strstr(err.msg, w->name) && strstr(err.msg, "never placed");
    int nan = 1;
    for (int t = 0; t < T; t++)
        for (int64_t i = 0; i < nr; i++)
            nan &= isnan(y[(size_t)t * ldy + i]);
    CHECK(named, "%s: an unplaced weight was not refused by name (%s)", what, code ? err.msg : "no error");
    CHECK(nan, "%s: the refused op left output that is not NaN", what);
    printf("  unplaced weight refused, output NaN: %s\n", named && nan ? "yes" : "NO");
}

/* Bytes of a weight's data and of its scales as stored. */
static size_t data_bytes_of(const dsv4_weight *w)
{
    size_t nk = (size_t)w->n * w->k;
    return w->form == DSV4_WF_F32 ? nk * 4 : w->form == DSV4_WF_FP8 ? nk : w->form == DSV4_WF_FP4 ? nk / 2 : nk * 2;
}

static size_t scale_bytes_of(const dsv4_weight *w) { return scale_count(w) * (w->scale_e8m0 ? 1 : 4); }

/* Where the weight is read from: resident in device memory, pinned in host memory mapped into
 * the device (the memory plan's spilled experts), or first never placed (the op must refuse
 * it), then placed resident. */
enum { RESIDENT, PINNED, UNPLACED };

/* Places w as `where` says (UNPLACED: resident, after the refusal was checked). */
static void place_weight(const char *what, const dsv4_weight *w, int where)
{
    dsv4_err err = {0};
    if (where == PINNED)
        CHECK(!dsv4_cuda_pin_weight(w, &err), "%s: pin: %s", what, err.msg);
    else
        CHECK(!dsv4_cuda_put_weight(w, &err), "%s: put: %s", what, err.msg);
}

/* ---- linear ------------------------------------------------------------------------------ */

typedef struct {
    dsv4_wform form;
    int64_t n, k;
    int bn, bk, e8m0;
    int64_t r0, r1;
    int T, padx, pady;
} lin_case;

static void lin_weight(const lin_case *c, dsv4_weight *w) { make_weight(c->form, c->n, c->k, c->bn, c->bk, c->e8m0, w); }

static void test_linear(const lin_case *c, int where)
{
    char what[160];
    snprintf(what, sizeof what, "linear %s [%lld,%lld] rows %lld..%lld T=%d%s", dsv4_wform_name(c->form),
             (long long)c->n, (long long)c->k, (long long)c->r0, (long long)c->r1, c->T,
             where == RESIDENT ? " resident" : where == PINNED ? " pinned" : " (unplaced first)");
    dsv4_weight w;
    lin_weight(c, &w);
    dsv4_err err = {0};
    int64_t k = c->k, nr = c->r1 - c->r0, ldx = k + c->padx, ldy = nr + c->pady;
    int T = c->T;
    float *x = falloc((size_t)T * ldx), *ref = falloc((size_t)T * ldy), *got = falloc((size_t)T * ldy);
    float *row = falloc(k), *one = falloc(ldy);
    double *mag = malloc((size_t)T * nr * sizeof(double));
    fill(x, (size_t)T * ldx, -1, 1);
    if (where == UNPLACED) { /* refused, output NaN (got holds numbers first) */
        for (size_t i = 0; i < (size_t)T * ldy; i++)
            got[i] = 7.0f;
        g_linear(&w, c->r0, c->r1, x, T, ldx, got, ldy);
        check_refused(what, "linear", &w, got, T, nr, ldy);
    }
    size_t dev0, pin0, dev1, pin1;
    dsv4_cuda_usage(&dev0, &pin0);
    place_weight(what, &w, where);
    dsv4_cuda_usage(&dev1, &pin1);
    size_t wb = dsv4_cuda_weight_bytes(&w);
    CHECK(dev1 - dev0 == (where != PINNED ? wb : 0) && pin1 - pin0 == (where == PINNED ? wb : 0),
          "%s: %zu bytes went to the device and %zu to pinned memory (weight %zu bytes)", what, dev1 - dev0, pin1 - pin0, wb);
    cpu->linear(&w, c->r0, c->r1, x, T, ldx, ref, ldy);
    const float pad_mark = 12345.0f;
    for (size_t i = 0; i < (size_t)T * ldy; i++)
        got[i] = pad_mark;
    for (int t = 0; t < T; t++)
        poison(got + (size_t)t * ldy, nr);
    g_linear(&w, c->r0, c->r1, x, T, ldx, got, ldy);
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
    float *xs = falloc((size_t)T * ldx), *wr = falloc((size_t)T * ldy), *wp = calloc((size_t)T * nr, sizeof(float));
    memcpy(xs, x, (size_t)T * ldx * sizeof(float));
    /* the pair whose swap moves row r0 the most (a pair in a block of small scale, or of nearly
     * equal weights, moves it less than the tolerance and would hide the swap) */
    float *w0 = falloc(k);
    dsv4_weight_row(&w, c->r0, w0);
    int64_t j = 0;
    double best = -1;
    for (int64_t q = 0; q + 1 < k; q++) {
        const float *xl = xs + (size_t)(T - 1) * ldx;
        double d = fabs(((double)w0[q] - w0[q + 1]) * ((double)xl[q] - xl[q + 1]));
        if (d > best) {
            best = d;
            j = q;
        }
    }
    free(w0);
    float tmp = xs[(size_t)(T - 1) * ldx + j];
    xs[(size_t)(T - 1) * ldx + j] = xs[(size_t)(T - 1) * ldx + j + 1];
    xs[(size_t)(T - 1) * ldx + j + 1] = tmp;
    cpu->linear(&w, c->r0, c->r1, xs, T, ldx, wr, ldy);
    for (int t = 0; t < T; t++)
        memcpy(wp + (size_t)t * nr, wr + (size_t)t * ldy, nr * sizeof(float));
    snprintf(what, sizeof what, "linear %s index off", dsv4_wform_name(c->form));
    control(what, g, wp, mag, (size_t)T * nr);

    /* control 2, one scale skipped: the GPU runs a copy of the weight whose scale block over
     * row r0, columns 0..bk is 1 (that block's scale skipped; the copy placed for the call) */
    if (w.scale) {
        void *s2 = scale_skipped(&w, c->r0);
        dsv4_weight w2 = w;
        w2.scale = s2;
        CHECK(!dsv4_cuda_put(s2, scale_bytes_of(&w), &err), "%s: put: %s", what, err.msg);
        float *g2 = falloc((size_t)T * ldy), *gp = falloc((size_t)T * nr);
        poison(g2, (size_t)T * ldy);
        g_linear(&w2, c->r0, c->r1, x, T, ldx, g2, ldy);
        dsv4_cuda_drop(s2);
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
        g_linear(&w, c->r0, c->r1, x + (size_t)t * ldx, 1, ldx, one, ldy);
        same &= !memcmp(one, got + (size_t)t * ldy, nr * sizeof(float));
    }
    CHECK(same, "linear %s T=%d: a row alone differs from the same row in the batch", dsv4_wform_name(c->form), T);
    printf("  concurrent == solo (%d rows): %s\n", T, same ? "bitwise equal" : "DIFFERENT");
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
    lin_case c = {.form = form, .n = n, .k = k, .bn = bn, .bk = bk, .e8m0 = 1, .r1 = n, .T = T};
    dsv4_weight w[8];
    const dsv4_weight *wp[8];
    float *hx[8], *dx[8], *dy[8], *dg[8];
    size_t xb = (size_t)T * k * sizeof(float), yb = (size_t)T * n * sizeof(float);
    dsv4_err err = {0};
    int ok = 1;
    for (int j = 0; j < count; j++) {
        lin_weight(&c, &w[j]);
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

/* The grouped output projection on device buffers: one launch equals the blocks launched one
 * by one (bitwise) and the CPU (within tolerance); control: block 1 given block 0's slice. */
static void test_linear_blocks(dsv4_wform form, int G, int64_t rk, int64_t k, int T)
{
    char what[96];
    snprintf(what, sizeof what, "linear blocks %d x %s [%lld,%lld] T=%d", G, dsv4_wform_name(form), (long long)rk,
             (long long)k, T);
    int64_t n = G * rk;
    lin_case c = {.form = form, .n = n, .k = k, .bn = 128, .bk = form == DSV4_WF_FP4 ? 32 : 128, .e8m0 = 1, .r1 = n, .T = T};
    dsv4_weight w;
    lin_weight(&c, &w);
    dsv4_err err = {0};
    CHECK(!dsv4_cuda_put_weight(&w, &err), "%s: %s", what, err.msg);
    size_t nx = (size_t)T * G * k, ny = (size_t)T * n;
    float *hx = falloc(nx), *ref = falloc(ny), *one = falloc(ny), *blk = falloc(ny), *row = falloc(k);
    fill(hx, nx, -1, 1);
    float *dx = gpu->alloc(nx * sizeof(float)), *dy = gpu->alloc(ny * sizeof(float)), *dz = gpu->alloc(ny * sizeof(float));
    gpu->upload(dx, hx, nx * sizeof(float));
    gpu->linear_blocks(&w, G, dx, T, dy);
    for (int g = 0; g < G; g++)
        gpu->linear(&w, g * rk, (g + 1) * rk, dx + g * k, T, (int64_t)G * k, dz + g * rk, n);
    gpu->download(blk, dy, ny * sizeof(float));
    gpu->download(one, dz, ny * sizeof(float));
    CHECK(!gpu->check(&err), "%s: %s", what, err.msg);
    cpu->linear_blocks(&w, G, hx, T, ref);
    double *mag = malloc(ny * sizeof(double));
    for (int64_t i = 0; i < n; i++) {
        dsv4_weight_row(&w, i, row);
        for (int t = 0; t < T; t++) {
            double m = 0;
            for (int64_t q = 0; q < k; q++)
                m += fabs((double)row[q] * hx[(size_t)t * G * k + (i / rk) * k + q]);
            mag[(size_t)t * n + i] = m;
        }
    }
    CHECK(agree(what, blk, ref, mag, ny, 0), "%s: GPU and CPU differ", what);
    CHECK(!memcmp(blk, one, ny * sizeof(float)), "%s: one launch differs from the blocks one by one", what);
    float *bad = falloc(ny); /* control: block 1 computed from block 0's slice of x */
    memcpy(bad, ref, ny * sizeof(float));
    float *ctl = falloc(ny);
    cpu->linear(&w, rk, 2 * rk, hx, T, (int64_t)G * k, ctl, rk);
    for (int t = 0; t < T; t++)
        memcpy(bad + (size_t)t * n + rk, ctl + (size_t)t * rk, rk * sizeof(float));
    control("linear blocks slice off by one", blk, bad, mag, ny);
    gpu->free(dx), gpu->free(dy), gpu->free(dz);
    dsv4_cuda_drop_weight(&w);
    free((void *)w.data), free((void *)w.scale);
    free(hx), free(ref), free(one), free(blk), free(row), free(mag), free(bad), free(ctl);
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
        g_rmsnorm(got, rows, dim, w, 1e-6f, got);
    } else {
        poison(got, n);
        g_rmsnorm(x, rows, dim, w, 1e-6f, got);
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
        g_rmsnorm(x + (size_t)r * dim, 1, dim, w, 1e-6f, one);
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
    g_rope(got, T, stride, heads, d, rd, freq, pos, inverse);
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
        g_rope(one, 1, stride, heads, d, rd, freq, pos + t, inverse);
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

/* A site's random inputs: X [T, n, D] in [-1, 1], fn [nm, n D] scaled so its dot products
 * with X stay O(1), base [nm], scale [3] (malloc'd). */
static void hc_random(int T, int n, int D, int nm, float **X, float **fn, float **base, float scale[3])
{
    int64_t nd = (int64_t)n * D;
    *X = falloc((size_t)T * nd);
    *fn = falloc((size_t)nm * nd);
    *base = falloc(nm);
    fill(*X, (size_t)T * nd, -1, 1);
    fill(*fn, (size_t)nm * nd, -1.0f / sqrtf(nd), 1.0f / sqrtf(nd));
    fill(*base, nm, -1, 1);
    fill(scale, 3, 0.5f, 2.0f);
}

static void test_hc_pre(int T, int n, int D, int full)
{
    char what[128];
    snprintf(what, sizeof what, "hc_pre T=%d n=%d D=%d%s", T, n, D, full ? " + sinkhorn" : " (head)");
    int nm = full ? (2 + n) * n : n, iters = 20;
    int64_t nd = (int64_t)n * D;
    float *X, *fn, *base, scale[3];
    hc_random(T, n, D, nm, &X, &fn, &base, scale);
    hc_out r = hc_alloc(T, n, D, full), g = hc_alloc(T, n, D, full), w = hc_alloc(T, n, D, full);
    cpu->hc_pre(X, T, n, D, fn, base, scale, iters, 1e-6f, 1e-6f, r.pre, r.post, r.comb, r.h, NULL);
    g_hc_pre(X, T, n, D, fn, base, scale, iters, 1e-6f, 1e-6f, g.pre, g.post, g.comb, g.h, NULL);
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
    int j = full ? nm - 2 : 0; /* two comb mixes (for n = 1, post and the comb) */
    memcpy(fn2 + (size_t)j * nd, fn + (size_t)(j + 1) * nd, nd * sizeof(float));
    memcpy(fn2 + (size_t)(j + 1) * nd, fn + (size_t)j * nd, nd * sizeof(float));
    cpu->hc_pre(X, T, n, D, fn2, base, scale, iters, 1e-6f, 1e-6f, w.pre, w.post, w.comb, w.h, NULL);
    float *wf = hc_flat(&w, T, n, D, full, &L);
    control(full ? "hc_pre mix row off by one" : "hc_pre (head) mix row off by one", gf, wf, mag, L);
    int same = 1;
    for (int t = 0; t < T; t++) {
        hc_out o = hc_alloc(1, n, D, full);
        g_hc_pre(X + (size_t)t * nd, 1, n, D, fn, base, scale, iters, 1e-6f, 1e-6f, o.pre, o.post, o.comb, o.h, NULL);
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
    g_hc_pre(X, T, n, D, fn, base, scale, iters, 1e-6f, 1e-6f, o.pre, o.post, o.comb, NULL, NULL);
    int mix_same = !gpu->check(&err) && !memcmp(o.pre, g.pre, (size_t)T * n * sizeof(float));
    if (full)
        mix_same &= !memcmp(o.post, g.post, (size_t)T * n * sizeof(float)) &&
                    !memcmp(o.comb, g.comb, (size_t)T * n * n * sizeof(float));
    CHECK(mix_same, "%s: mixes only (h NULL) differ from the full call: %s", what, err.msg);
    printf("  mixes only (h NULL): %s\n", mix_same ? "bitwise equal" : "DIFFERENT");
    hc_free(&o);
    /* h normed (hw): bitwise what rmsnorm(h, hw) makes of the GPU's own h; within tolerance of
     * the CPU's (mag: the collapse's terms times the row's 1/rms and |hw|); control: one hw
     * element skipped (1) */
    float *hw = falloc(D), *hw2 = falloc(D), *sep = falloc((size_t)T * D);
    fill(hw, D, 0.5f, 1.5f);
    memcpy(hw2, hw, D * sizeof(float));
    hw2[D / 3] = 1.0f;
    hc_out gn = hc_alloc(T, n, D, full), rn = hc_alloc(T, n, D, full), wn = hc_alloc(T, n, D, full);
    g_hc_pre(X, T, n, D, fn, base, scale, iters, 1e-6f, 1e-6f, gn.pre, gn.post, gn.comb, gn.h, hw);
    cpu->hc_pre(X, T, n, D, fn, base, scale, iters, 1e-6f, 1e-6f, rn.pre, rn.post, rn.comb, rn.h, hw);
    g_hc_pre(X, T, n, D, fn, base, scale, iters, 1e-6f, 1e-6f, wn.pre, wn.post, wn.comb, wn.h, hw2);
    poison(sep, (size_t)T * D);
    g_rmsnorm(g.h, T, D, hw, 1e-6f, sep);
    CHECK(!memcmp(sep, gn.h, (size_t)T * D * sizeof(float)), "%s: normed h differs from rmsnorm of h", what);
    double *nmag = malloc((size_t)T * D * sizeof(double));
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int dd = 0; dd < D; dd++)
            ss += (double)r.h[(size_t)t * D + dd] * r.h[(size_t)t * D + dd];
        double ri = 1.0 / sqrt(ss / D + 1e-6);
        for (int dd = 0; dd < D; dd++)
            nmag[(size_t)t * D + dd] = mag[hs + (size_t)t * D + dd] * ri * fabs(hw[dd]) + fabs(rn.h[(size_t)t * D + dd]);
    }
    char wn_what[160];
    snprintf(wn_what, sizeof wn_what, "%s, h normed", what);
    CHECK(agree(wn_what, gn.h, rn.h, nmag, (size_t)T * D, 0), "%s: GPU and CPU differ", wn_what);
    control("hc_pre norm weight skipped", wn.h, rn.h, nmag, (size_t)T * D);
    free(hw), free(hw2), free(sep), free(nmag);
    hc_free(&gn), hc_free(&rn), hc_free(&wn);
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
    g_hc_collapse(X, T, n, D, pre, got);
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
        g_hc_collapse(X + (size_t)t * nd, 1, n, D, pre + (size_t)t * n, one);
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
    g_hc_post(got, y, T, n, D, post, comb);
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
        g_hc_post(one, y + (size_t)t * D, 1, n, D, post + t * n, comb + (size_t)t * n * n);
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
    g_attend(q, H, d, keys, nk, scale, sink, got);
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
    g_swiglu(g, u, n, limit, got);
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
    g_swiglu(g, u, n / 2, limit, half);
    g_swiglu(g + n / 2, u + n / 2, n - n / 2, limit, half + n / 2);
    CHECK(!memcmp(half, got, n * sizeof(float)), "%s: two halves differ from one call", what);
    free(g), free(u), free(ref), free(got), free(wr), free(mag), free(half);
}

/* ---- batch invariance ------------------------------------------------------------------------ */

/* A row's bits never depend on T, on the other rows or on where the row sits: the weight
 * resident, x and y on the device, every T in 1..64 and some large T (the first T rows of one
 * x, then the last T rows, so each row also runs at other positions), each row against the
 * same row run alone. One row's result also agrees with the CPU's (1e-5 * sum|w x|), and a
 * control runs a copy of the weight with one element changed: that row must change. With
 * q = 1, the op is linear_q (REF's quantized input, which the tensor cores take as one term);
 * with q = 2, every other row of x holds bf16 values (REF's activations), so its tensor-core
 * tiles leave out the mid and lo products alone and take them beside the other rows. */
static void test_invariance(const lin_case *c, int Tmax, int q)
{
    char what[128];
    snprintf(what, sizeof what, "invariance %s%s [%lld,%lld]%s%s T=1..64,%d", q == 1 ? "linear_q " : q == 2 ? "bf16 rows " : "",
             dsv4_wform_name(c->form), (long long)c->n, (long long)c->k, c->bn && !c->e8m0 ? " f32 scales" : "",
             c->form == DSV4_WF_FP8 && c->bk == 32 ? " bk 32" : "", Tmax);
    void (*lin)(const dsv4_weight *, int64_t, int64_t, const float *, int, int64_t, float *, int64_t) =
        q == 1 ? gpu->linear_q : gpu->linear;
    dsv4_weight w;
    lin_weight(c, &w);
    dsv4_err err = {0};
    CHECK(!dsv4_cuda_put_weight(&w, &err), "%s: put: %s", what, err.msg);
    int64_t n = c->n, k = c->k;
    size_t xb = (size_t)Tmax * k * sizeof(float), yb = (size_t)Tmax * n * sizeof(float);
    float *x = falloc((size_t)Tmax * k), *solo = falloc((size_t)Tmax * n);
    fill(x, (size_t)Tmax * k, -1, 1);
    for (int t = 0; q == 2 && t < Tmax; t += 2)
        for (int64_t j = 0; j < k; j++) {
            uint32_t u;
            memcpy(&u, &x[(size_t)t * k + j], 4);
            u &= 0xffff0000u;
            memcpy(&x[(size_t)t * k + j], &u, 4);
        }
    float *dx = to_dev(x, xb), *dy = to_dev(NULL, yb);
    for (int t = 0; t < Tmax; t++)
        lin(&w, 0, n, dx + (size_t)t * k, 1, k, dy + (size_t)t * n, n);
    gpu->download(solo, dy, yb);
    CHECK(!gpu->check(&err), "%s: %s", what, err.msg);
    /* the solo rows against the CPU */
    float *ref = falloc(n), *row = falloc(k);
    double *mag = malloc(n * sizeof(double));
    int t1 = Tmax / 3;
    (q == 1 ? cpu->linear_q : cpu->linear)(&w, 0, n, x + (size_t)t1 * k, 1, k, ref, n);
    for (int64_t i = 0; i < n; i++) {
        dsv4_weight_row(&w, i, row);
        double s = 0;
        for (int64_t j = 0; j < k; j++)
            s += fabs((double)row[j] * x[(size_t)t1 * k + j]);
        mag[i] = s;
    }
    CHECK(agree(what, solo + (size_t)t1 * n, ref, mag, n, 0), "%s: a solo row differs from the CPU beyond 1e-5 * sum|w x|", what);
    int Ts[70], nT = 0;
    for (int T = 1; T <= 64 && T <= Tmax; T++)
        Ts[nT++] = T;
    if (Tmax > 64) {
        Ts[nT++] = 100 < Tmax ? 100 : Tmax;
        Ts[nT++] = Tmax;
    }
    float *got = falloc((size_t)Tmax * n);
    int bad_T = 0, runs = 0;
    for (int i = 0; i < nT && !bad_T; i++)
        for (int end = 0; end < 2; end++) {
            int T = Ts[i], t0 = end ? Tmax - T : 0;
            poison(got, (size_t)T * n);
            gpu->upload(dy, got, (size_t)T * n * sizeof(float));
            lin(&w, 0, n, dx + (size_t)t0 * k, T, k, dy, n);
            gpu->download(got, dy, (size_t)T * n * sizeof(float));
            runs++;
            if (memcmp(got, solo + (size_t)t0 * n, (size_t)T * n * sizeof(float))) {
                bad_T = T;
                break;
            }
        }
    CHECK(!bad_T, "%s: at T=%d a row differs from the same row alone", what, bad_T);
    printf("  %-56s %d runs, every row bitwise equal to itself alone: %s\n", what, runs, bad_T ? "NO" : "yes");
    /* control: one weight element changed (a copy, placed for the call) must change its row, over
     * an x whose element at the change is large enough that its term decides the row's bits */
    dsv4_weight w2 = w;
    size_t nk = (size_t)n * k, e = (size_t)k / 2; /* row 0's element k / 2 */
    size_t nbytes = c->form == DSV4_WF_F32 ? nk * 4 : c->form == DSV4_WF_FP8 ? nk : c->form == DSV4_WF_FP4 ? nk / 2 : nk * 2;
    size_t byte = c->form == DSV4_WF_F32 ? 4 * e + 3 : c->form == DSV4_WF_FP8 ? e : c->form == DSV4_WF_FP4 ? e / 2 : 2 * e + 1;
    uint8_t *d2 = malloc(nbytes);
    memcpy(d2, w.data, nbytes);
    d2[byte] ^= 0x10; /* an exponent bit (FP4: a magnitude bit) */
    w2.data = d2;
    float *g2 = falloc(n), *g1 = falloc(n), *xc = falloc(k);
    memcpy(xc, x, (size_t)k * sizeof(float));
    xc[e] = xc[e + 1] = 1e6f; /* FP4's changed bit is element e + 1's */
    poison(g1, n);
    poison(g2, n);
    CHECK(!dsv4_cuda_put(d2, nbytes, &err), "%s: put: %s", what, err.msg);
    g_linear(&w, 0, n, xc, 1, k, g1, n);
    g_linear(&w2, 0, n, xc, 1, k, g2, n);
    dsv4_cuda_drop(d2);
    CHECK(!gpu->check(&err), "%s: %s", what, err.msg);
    int changed = memcmp(g2, g1, sizeof(float)) != 0;
    CHECK(changed, "control %s: a changed weight element left its row's bits unchanged", what);
    printf("  control %-48s %s\n", "invariance: one weight element changed", changed ? "caught" : "NOT CAUGHT");
    dsv4_cuda_drop_weight(&w);
    gpu->free(dx);
    gpu->free(dy);
    free((void *)w.data), free((void *)w.scale), free(d2), free(g2), free(g1), free(xc);
    free(x), free(solo), free(ref), free(row), free(mag), free(got);
}

/* ---- embedding ------------------------------------------------------------------------------ */

/* T rows (ids with repeats and the table's last row) into n streams, the table resident, pinned
 * or first never placed (refused, then placed): bitwise equal to the CPU's decode (both decode
 * each stored element exactly). Controls: one row's id off by one, and for scaled forms one
 * scale block skipped. */
static void test_embed(const lin_case *c, int T, int n, int where)
{
    char what[160];
    snprintf(what, sizeof what, "embed %s [%lld,%lld] T=%d n=%d%s", dsv4_wform_name(c->form), (long long)c->n,
             (long long)c->k, T, n, where == RESIDENT ? " resident" : where == PINNED ? " pinned" : " (unplaced first)");
    dsv4_weight w;
    lin_weight(c, &w);
    dsv4_err err = {0};
    int64_t D = c->k;
    size_t nx = (size_t)T * n * D;
    int32_t *ids = malloc(T * sizeof(int32_t));
    for (int t = 0; t < T; t++)
        ids[t] = t == 0 ? (int32_t)(c->n - 1) : t == 2 ? ids[1] : (int32_t)(rnd() % c->n);
    float *ref = falloc(nx), *got = falloc(nx), *wr = falloc(nx);
    double *mag = malloc(nx * sizeof(double));
    if (where == UNPLACED) { /* refused, output NaN (got holds numbers first) */
        for (size_t i = 0; i < nx; i++)
            got[i] = 7.0f;
        g_embed(&w, ids, T, n, got);
        check_refused(what, "embed", &w, got, 1, (int64_t)nx, (int64_t)nx);
    }
    place_weight(what, &w, where);
    cpu->embed(&w, ids, T, n, ref);
    poison(got, nx);
    g_embed(&w, ids, T, n, got);
    CHECK(!gpu->check(&err), "%s: %s", what, err.msg);
    for (size_t i = 0; i < nx; i++)
        mag[i] = fabs(ref[i]) + 1e-3;
    CHECK(agree(what, got, ref, mag, nx, 0), "%s: GPU and CPU differ", what);
    CHECK(!memcmp(got, ref, nx * sizeof(float)), "%s: not bitwise equal to the CPU's decode", what);
    /* control 1: the last row's id one off */
    ids[T - 1] = (ids[T - 1] + 1) % (int32_t)c->n;
    cpu->embed(&w, ids, T, n, wr);
    control("embed id one off", got, wr, mag, nx);
    ids[T - 1] = (ids[T - 1] + (int32_t)c->n - 1) % (int32_t)c->n;
    /* control 2: the GPU reads a copy whose scale block at row ids[0], columns 0..bk is 1 (the
     * copy placed for the call) */
    if (w.scale) {
        void *s2 = scale_skipped(&w, ids[0]);
        dsv4_weight w2 = w;
        w2.scale = s2;
        CHECK(!dsv4_cuda_put(s2, scale_bytes_of(&w), &err), "%s: put: %s", what, err.msg);
        poison(wr, nx);
        g_embed(&w2, ids, T, n, wr);
        dsv4_cuda_drop(s2);
        control("embed scale skipped", wr, ref, mag, nx);
        free(s2);
    }
    dsv4_cuda_drop_weight(&w);
    free((void *)w.data);
    free((void *)w.scale);
    free(ids), free(ref), free(got), free(wr), free(mag);
}

/* Strides and aliasing: linear over x rows with an aligned row stride (read in place) and an
 * odd one (packed first) into y rows with a stride, bitwise equal to the same rows dense, the
 * padding columns of y untouched; a row at an odd offset of a device buffer (an unaligned
 * start: the packed path) equal to the row copied to an aligned buffer; rmsnorm in place and
 * swiglu and add with the output aliasing an input, each equal to the same op out of place;
 * add equal to the CPU's bit for bit (one rounding a sum). */
static void test_strides_and_aliasing(void)
{
    dsv4_err err = {0};
    int all = 1;
    /* linear: FP8 resident, x rows with stride 520 (aligned) and 517 (packed), y stride 300 */
    lin_case c = {DSV4_WF_FP8, 256, 512, 128, 128, 1, 0, 256, 5, 0, 0};
    dsv4_weight w;
    lin_weight(&c, &w);
    CHECK(!dsv4_cuda_put_weight(&w, &err), "put: %s", err.msg);
    int T = 5;
    int64_t k = 512, lds[2] = {520, 517}, ldy = 300;
    float *xd = falloc((size_t)T * k);
    fill(xd, (size_t)T * k, -1, 1);
    float *dxd = to_dev(xd, (size_t)T * k * 4), *dyd = to_dev(NULL, (size_t)T * 256 * 4);
    gpu->linear(&w, 0, 256, dxd, T, k, dyd, 256);
    float *dense = from_dev(dyd, (size_t)T * 256 * 4);
    for (int v = 0; v < 2; v++) {
        int64_t ldx = lds[v];
        float *x = falloc((size_t)T * ldx), *seven = falloc((size_t)T * ldy);
        fill(x, (size_t)T * ldx, -1, 1);
        for (int t = 0; t < T; t++)
            memcpy(x + (size_t)t * ldx, xd + (size_t)t * k, k * sizeof(float));
        for (size_t i = 0; i < (size_t)T * ldy; i++)
            seven[i] = 7.0f;
        float *dx = to_dev(x, (size_t)T * ldx * sizeof(float)), *dy = to_dev(seven, (size_t)T * ldy * sizeof(float));
        gpu->linear(&w, 0, 256, dx, T, ldx, dy, ldy);
        float *yh = from_dev(dy, (size_t)T * ldy * sizeof(float));
        int same = 1;
        for (int t = 0; t < T; t++) {
            same &= !memcmp(yh + (size_t)t * ldy, dense + (size_t)t * 256, 256 * sizeof(float));
            for (int64_t i = 256; i < ldy; i++) /* padding columns untouched */
                same &= yh[(size_t)t * ldy + i] == 7.0f;
        }
        printf("  linear FP8 x (ldx %lld) y (ldy %lld)               %s\n", (long long)ldx, (long long)ldy,
               same ? "bitwise equal to the dense rows" : "DIFFERENT");
        all &= same;
        /* a row alone at an odd offset of the device buffer (unaligned start: the packed path) */
        float *d1 = to_dev(NULL, 256 * sizeof(float)), *d2 = to_dev(NULL, 256 * sizeof(float));
        float *da = to_dev(x + ldx + 1, k * sizeof(float));
        gpu->linear(&w, 0, 256, dx + ldx + 1, 1, ldx, d1, 256);
        gpu->linear(&w, 0, 256, da, 1, k, d2, 256);
        float *h2 = from_dev(d2, 256 * sizeof(float));
        same = dev_equal(d1, h2, 256 * sizeof(float));
        printf("  linear FP8 a row at an odd offset                  %s\n", same ? "bitwise equal to it aligned" : "DIFFERENT");
        all &= same;
        gpu->free(d1), gpu->free(d2), gpu->free(da), gpu->free(dx), gpu->free(dy);
        free(h2), free(x), free(yh), free(seven);
    }
    gpu->free(dxd), gpu->free(dyd);
    free(xd), free(dense);
    dsv4_cuda_drop_weight(&w);
    free((void *)w.data), free((void *)w.scale);

    /* rmsnorm out of place and in place */
    int rows = 4, dim = 600;
    size_t nx = (size_t)rows * dim;
    float *x = falloc(nx), *nw = falloc(dim);
    fill(x, nx, -2, 2);
    fill(nw, dim, 0.5f, 1.5f);
    float *dx = to_dev(x, nx * 4), *dy = to_dev(NULL, nx * 4), *dnw = to_dev(nw, dim * 4);
    gpu->rmsnorm(dx, rows, dim, dnw, 1e-6f, dy);
    float *ya = from_dev(dy, nx * 4);
    gpu->rmsnorm(dx, rows, dim, dnw, 1e-6f, dx);
    int same = dev_equal(dx, ya, nx * 4);
    printf("  rmsnorm in place                             %s\n", same ? "bitwise equal" : "DIFFERENT");
    all &= same;
    gpu->free(dx), gpu->free(dy), gpu->free(dnw);

    /* swiglu with h aliasing g (as the experts call it), add aliased, add against the CPU */
    size_t ns = 5001;
    float *g = falloc(ns), *u = falloc(ns), *ad = falloc(ns);
    fill(g, ns, -3, 3);
    fill(u, ns, -3, 3);
    float *dg = to_dev(g, ns * 4), *du = to_dev(u, ns * 4), *dh = to_dev(NULL, ns * 4);
    gpu->swiglu(dg, du, ns, 1.0f, dh);
    float *hh = from_dev(dh, ns * 4);
    gpu->swiglu(dg, du, ns, 1.0f, dg);
    same = dev_equal(dg, hh, ns * 4);
    cpu->add(g, u, ns, ad); /* add: the same sums everywhere (one rounding) */
    gpu->upload(dg, g, ns * 4);
    gpu->add(dg, du, ns, dh);
    same &= dev_equal(dh, ad, ns * 4);
    gpu->add(dg, du, ns, dg);
    same &= dev_equal(dg, ad, ns * 4);
    printf("  swiglu / add aliased, add against the CPU    %s\n", same ? "bitwise equal" : "DIFFERENT");
    all &= same;
    gpu->free(dg), gpu->free(du), gpu->free(dh);
    CHECK(!gpu->check(&err), "strides and aliasing: %s", err.msg);
    CHECK(all, "an op over strided or aliased buffers differs from the same op dense or out of place");
    free(x), free(nw), free(ya), free(g), free(u), free(hh), free(ad);
}

/* ---- several projections of one input ------------------------------------------------------ */

/* gpu->linear_multi over the nc weights of cs (one k; mixed forms, row counts, warps per row
 * and paths; weight 1 pinned, the last held in device memory of its own (not placed: read in
 * place), the rest resident) for T rows of x, in four ways: x dense (0), with an aligned row
 * stride (1), with an odd one that the chunk path packs (2: those weights run alone); the
 * weights three times over, more than one launch holds (3). Each result is bitwise equal to
 * gpu->linear weight by weight on the same buffers and within tolerance of the CPU. Control:
 * weight 0's result against its reference with the rows shifted by one. */
static void test_linear_multi(const lin_case *cs, int nc, int T)
{
    enum { NC = 8, NW = 3 * NC };
    int64_t k = cs[0].k;
    char what[128];
    dsv4_weight w[NC], wg[NC]; /* wg: the GPU's views (the last one's arrays device copies) */
    const dsv4_weight *wp[NW];
    float *ref[NC], *got[NW], *one[NW];
    double *mag[NC];
    dsv4_err err = {0};
    float *x = falloc((size_t)T * k), *row = falloc(k);
    fill(x, (size_t)T * k, -1, 1);
    for (int j = 0; j < nc; j++) {
        int64_t n = cs[j].n;
        lin_weight(&cs[j], &w[j]);
        wg[j] = w[j];
        if (j == 1)
            CHECK(!dsv4_cuda_pin_weight(&w[j], &err), "linear multi: pin: %s", err.msg);
        else if (j < nc - 1)
            CHECK(!dsv4_cuda_put_weight(&w[j], &err), "linear multi: put: %s", err.msg);
        else {
            wg[j].data = to_dev(w[j].data, data_bytes_of(&w[j]));
            wg[j].scale = w[j].scale ? to_dev(w[j].scale, scale_bytes_of(&w[j])) : NULL;
        }
        ref[j] = falloc((size_t)T * n);
        mag[j] = malloc((size_t)T * n * sizeof(double));
        cpu->linear(&w[j], 0, n, x, T, k, ref[j], n);
        for (int64_t i = 0; i < n; i++) {
            dsv4_weight_row(&w[j], i, row);
            for (int t = 0; t < T; t++) {
                double m = 0;
                for (int64_t q = 0; q < k; q++)
                    m += fabs((double)row[q] * x[(size_t)t * k + q]);
                mag[j][(size_t)t * n + i] = m;
            }
        }
    }
    static const char *const how[4] = {"dense", "stride k+4", "stride k+1", "3x the weights"};
    for (int v = 0; v < 4; v++) {
        int nw = v == 3 ? 3 * nc : nc;
        int64_t ldx = k + (v == 1 ? 4 : v == 2 ? 1 : 0);
        float *hx = falloc((size_t)T * ldx);
        fill(hx, (size_t)T * ldx, -1, 1);
        for (int t = 0; t < T; t++)
            memcpy(hx + (size_t)t * ldx, x + (size_t)t * k, k * sizeof(float));
        float *dx = to_dev(hx, (size_t)T * ldx * sizeof(float));
        for (int j = 0; j < nw; j++) {
            size_t ny = (size_t)T * cs[j % nc].n;
            wp[j] = &wg[j % nc];
            got[j] = to_dev(NULL, ny * sizeof(float));
            one[j] = to_dev(NULL, ny * sizeof(float));
        }
        gpu->linear_multi(nw, wp, dx, T, ldx, got);
        for (int j = 0; j < nw; j++)
            gpu->linear(wp[j], 0, wp[j]->n, dx, T, ldx, one[j], wp[j]->n);
        CHECK(!gpu->check(&err), "linear multi %s: %s", how[v], err.msg);
        int same = 1, close = 1;
        for (int j = 0; j < nw; j++) {
            const dsv4_weight *a = wp[j];
            size_t ny = (size_t)T * a->n;
            float *g = from_dev(got[j], ny * sizeof(float));
            float *o = from_dev(one[j], ny * sizeof(float));
            same &= !memcmp(g, o, ny * sizeof(float));
            snprintf(what, sizeof what, "linear multi %s [%lld,%lld] T=%d", dsv4_wform_name(a->form), (long long)a->n,
                     (long long)k, T);
            close &= agree(what, g, ref[j % nc], mag[j % nc], ny, v > 0);
            if (v == 0 && j == 0) { /* control: the rows shifted by one */
                float *bad = falloc(ny);
                for (int t = 0; t < T; t++)
                    for (int64_t i = 0; i < a->n; i++)
                        bad[(size_t)t * a->n + i] = ref[0][(size_t)t * a->n + (i + 1) % a->n];
                control("linear multi rows shifted by one", g, bad, mag[0], ny);
                free(bad);
            }
            free(g), free(o);
        }
        snprintf(what, sizeof what, "linear multi %d weights [*,%lld] T=%d, %s", nw, (long long)k, T, how[v]);
        CHECK(close, "%s: GPU and CPU differ", what);
        CHECK(same, "%s: differs from the weights one by one", what);
        printf("  %-44s %s\n", what, same && close ? "== one by one, ~ CPU" : "FAIL");
        for (int j = 0; j < nw; j++)
            gpu->free(got[j]), gpu->free(one[j]);
        gpu->free(dx);
        free(hx);
    }
    for (int j = 0; j < nc; j++) {
        if (j < nc - 1)
            dsv4_cuda_drop_weight(&w[j]);
        else
            gpu->free((void *)wg[j].data), gpu->free((void *)wg[j].scale);
        free((void *)w[j].data), free((void *)w[j].scale);
        free(ref[j]), free(mag[j]);
    }
    free(x), free(row);
}

/* ---- route -------------------------------------------------------------------------------- */

/* quant: logits and bias drawn from a few values, so exact ties are everywhere (the same x
 * gives the same score on each side); else continuous, where a selection may differ from the
 * CPU's only between two scores that agree to rounding (checked: such a swap is accepted when
 * the two CPU scores are within 1e-5 relative, and that row's weights are not compared). */
static void test_route(int R, int E, int K, int quant, int with_bias, int hash)
{
    char what[128];
    snprintf(what, sizeof what, "route R=%d E=%d K=%d%s%s%s", R, E, K, quant ? " ties" : "", with_bias ? " bias" : "",
             hash ? " hash" : "");
    const float qv[5] = {-1.0f, 0.0f, 0.5f, 1.0f, 2.0f};
    float *lg = falloc((size_t)R * E), *bias = with_bias ? falloc(E) : NULL;
    for (size_t i = 0; i < (size_t)R * E; i++)
        lg[i] = quant ? qv[rnd() % 5] : frand(-3, 3);
    for (int e = 0; with_bias && e < E; e++)
        bias[e] = quant ? 0.25f * (rnd() % 3) : frand(-0.5f, 0.5f);
    int vocab = 50;
    int32_t *t2e = NULL, *ids = malloc((size_t)R * sizeof(int32_t));
    for (int r = 0; r < R; r++)
        ids[r] = rnd() % vocab;
    dsv4_err err = {0};
    if (hash) {
        t2e = malloc((size_t)vocab * K * sizeof(int32_t));
        for (int i = 0; i < vocab * K; i++)
            t2e[i] = rnd() % E;
        CHECK(!dsv4_cuda_put(t2e, (size_t)vocab * K * sizeof(int32_t), &err), "put tid2eid: %s", err.msg);
    }
    int32_t *eid_r = malloc((size_t)R * K * 4), *eid_g = malloc((size_t)R * K * 4), *eid_w = malloc((size_t)R * K * 4);
    float *w_r = falloc((size_t)R * K), *w_g = falloc((size_t)R * K), *w_w = falloc((size_t)R * K);
    cpu->route(lg, R, E, K, bias, t2e, ids, 1, 2.5f, eid_r, w_r);
    float *dlg = to_dev(lg, (size_t)R * E * 4), *dw = to_dev(NULL, (size_t)R * K * 4), *db = up(bias, (size_t)E * 4);
    int32_t *dids = to_dev(ids, (size_t)R * 4), *de = to_dev(NULL, (size_t)R * K * 4);
    gpu->route(dlg, R, E, K, db, t2e, dids, 1, 2.5f, de, dw);
    CHECK(!gpu->check(&err), "%s: %s", what, err.msg);
    gpu->download(eid_g, de, (size_t)R * K * 4);
    gpu->download(w_g, dw, (size_t)R * K * 4);
    int exact = 1, near = 0;
    double *mag = malloc((size_t)R * K * sizeof(double));
    for (int r = 0; r < R; r++) {
        int row_same = !memcmp(eid_g + (size_t)r * K, eid_r + (size_t)r * K, K * 4);
        if (!row_same && !quant && !hash) { /* a swap between scores equal to rounding only */
            int ok = 1;
            for (int k = 0; k < K; k++) {
                int a = eid_g[r * K + k], b = eid_r[r * K + k];
                float va = sqrtf(lg[r * E + a] > 20 ? lg[r * E + a] : log1pf(expf(lg[r * E + a]))) + (bias ? bias[a] : 0);
                float vb = sqrtf(lg[r * E + b] > 20 ? lg[r * E + b] : log1pf(expf(lg[r * E + b]))) + (bias ? bias[b] : 0);
                ok &= a == b || fabsf(va - vb) <= 1e-5f * fmaxf(fabsf(va), fabsf(vb));
            }
            near += ok;
            row_same = ok;
        }
        exact &= row_same;
        for (int k = 0; k < K; k++) {
            mag[r * K + k] = fabs(w_r[r * K + k]);
            if (memcmp(eid_g + (size_t)r * K, eid_r + (size_t)r * K, K * 4))
                w_g[r * K + k] = w_r[r * K + k]; /* a near-tie row: weights not compared */
        }
    }
    CHECK(exact, "%s: the GPU chose other experts than the CPU", what);
    printf("  %-44s experts %s (%d near-tie rows)\n", what, exact ? "equal" : "DIFFERENT", near);
    CHECK(agree(what, w_g, w_r, mag, (size_t)R * K, 0), "%s: weights differ", what);
    if (!hash) {
        /* control: ties to the higher expert (the CPU over the experts in reverse order) */
        float *lr = falloc((size_t)R * E), *br = with_bias ? falloc(E) : NULL;
        for (int r = 0; r < R; r++)
            for (int e = 0; e < E; e++)
                lr[r * E + e] = lg[r * E + (E - 1 - e)];
        for (int e = 0; with_bias && e < E; e++)
            br[e] = bias[E - 1 - e];
        cpu->route(lr, R, E, K, br, NULL, ids, 1, 2.5f, eid_w, w_w);
        int differ = 0;
        for (int i = 0; i < R * K; i++)
            differ |= (E - 1 - eid_w[i]) != eid_g[i];
        if (quant) {
            CHECK(differ, "%s: control (ties to the higher expert) not caught", what);
            printf("  control %-36s %s\n", "route ties to the higher expert", differ ? "caught" : "NOT CAUGHT");
        }
        free(lr), free(br);
    }
    gpu->free(dlg), gpu->free(dw), gpu->free(dids), gpu->free(de), drop(db);
    if (hash)
        dsv4_cuda_drop(t2e);
    free(lg), free(bias), free(t2e), free(ids), free(eid_r), free(eid_g), free(eid_w), free(w_r), free(w_g), free(w_w);
    free(mag);
}

/* ---- experts -------------------------------------------------------------------------------- */

static float silu_f(float a) { return a / (1.0f + expf(-a)); }

/* E experts of one form (w1, w3 [I, D], w2 [D, I]) resident (half pinned); eid drawn so that
 * experts take many rows (the grouped tiles at R * K > 64). Tolerance: mag_y = sum_k |c_k|
 * sum_j |W2_dj| Mh_j with Mh_j = |h_j| + 1.1 |u_j| mag(g_j) + |silu g_j| mag(u_j) (times |w|
 * when pre-weighted): the first-order propagation of the products' rounding. */
static void test_experts(dsv4_wform form, int fp8_block, int R, int E, int K, int D, int I, int pre_weight, float limit)
{
    char what[160];
    snprintf(what, sizeof what, "experts %s%s R=%d E=%d K=%d D=%d I=%d%s", dsv4_wform_name(form),
             form == DSV4_WF_FP8 && fp8_block != 128 ? " [32,32]" : "", R, E, K, D, I, pre_weight ? " pre-weighted" : "");
    /* FP8 in square blocks (V4's [128, 128], V4.1's [32, 32]); FP4 in groups of 32 */
    int bn = form == DSV4_WF_FP8 ? fp8_block : 1, bk = form == DSV4_WF_FP8 ? fp8_block : 32;
    lin_case c13 = {form, I, D, bn, bk, 1, 0, I, 1, 0, 0}, c2 = {form, D, I, bn, bk, 1, 0, D, 1, 0, 0};
    dsv4_weight *w1 = calloc(E, sizeof *w1), *w2 = calloc(E, sizeof *w2), *w3 = calloc(E, sizeof *w3);
    dsv4_err err = {0};
    for (int e = 0; e < E; e++) {
        lin_weight(&c13, &w1[e]);
        lin_weight(&c2, &w2[e]);
        lin_weight(&c13, &w3[e]);
        int (*put)(const dsv4_weight *, dsv4_err *) = e % 2 ? dsv4_cuda_pin_weight : dsv4_cuda_put_weight;
        CHECK(!put(&w1[e], &err) && !put(&w2[e], &err) && !put(&w3[e], &err), "%s: put: %s", what, err.msg);
    }
    int RK = R * K;
    float *x = falloc((size_t)R * D), *wts = falloc(RK), *yr = falloc((size_t)R * D), *yg = falloc((size_t)R * D);
    int32_t *eid = malloc((size_t)RK * 4);
    fill(x, (size_t)R * D, -1, 1);
    fill(wts, RK, 0.1f, 1.0f);
    distinct_experts(eid, R, K, E);
    dsv4_experts_args a = {w1, w2, w3, E, K, R, D, I, eid, wts, x, limit, pre_weight, 0, yr, NULL};
    cpu->experts(&a);
    size_t wn = DSV4_EXPERTS_WORK(R, K, D, I, E);
    float *dx = to_dev(x, (size_t)R * D * 4), *dw = to_dev(wts, RK * 4), *dy = to_dev(NULL, (size_t)R * D * 4);
    int32_t *de = to_dev(eid, RK * 4);
    float *dwork = to_dev(NULL, wn * 4);
    dsv4_experts_args ga = a;
    ga.eid = de, ga.wts = dw, ga.x = dx, ga.y = dy, ga.work = dwork;
    unsigned long staged0 = dsv4_cuda_experts_staged();
    gpu->experts(&ga);
    CHECK(!gpu->check(&err), "%s: %s", what, err.msg);
    gpu->download(yg, dy, (size_t)R * D * 4);
    /* half the experts are pinned: the step copies its routed ones into device staging first */
    CHECK(dsv4_cuda_experts_staged() > staged0, "%s: the pinned experts were not staged", what);
    /* magnitudes */
    double *mag = calloc((size_t)R * D, sizeof(double));
    float *row = falloc(D > I ? D : I), *g = falloc(I), *u = falloc(I), *gm = falloc(I), *um = falloc(I);
    float *w2r = falloc((size_t)D * I);
    for (int p = 0; p < RK; p++) {
        int r = p / K, e = eid[p];
        const float *xr = x + (size_t)r * D;
        for (int i = 0; i < I; i++) {
            double sg = 0, su = 0, ag = 0, au = 0;
            dsv4_weight_row(&w1[e], i, row);
            for (int j = 0; j < D; j++)
                sg += (double)row[j] * xr[j], ag += fabs((double)row[j] * xr[j]);
            dsv4_weight_row(&w3[e], i, row);
            for (int j = 0; j < D; j++)
                su += (double)row[j] * xr[j], au += fabs((double)row[j] * xr[j]);
            g[i] = (float)sg, u[i] = (float)su, gm[i] = (float)ag, um[i] = (float)au;
        }
        for (int i = 0; i < D; i++)
            dsv4_weight_row(&w2[e], i, w2r + (size_t)i * I);
        double c = pre_weight ? 1.0 : fabs(wts[p]), hw = pre_weight ? fabs(wts[p]) : 1.0;
        for (int dd = 0; dd < D; dd++) {
            double s = 0;
            for (int j = 0; j < I; j++) {
                float gg = limit > 0 ? fminf(g[j], limit) : g[j];
                float uu = limit > 0 ? fminf(fmaxf(u[j], -limit), limit) : u[j];
                double mh = fabs(silu_f(gg) * uu) + 1.1 * fabs(uu) * gm[j] + fabs(silu_f(gg)) * um[j];
                s += fabs(w2r[(size_t)dd * I + j]) * mh * hw;
            }
            mag[(size_t)r * D + dd] += c * s;
        }
    }
    CHECK(agree(what, yg, yr, mag, (size_t)R * D, 0), "%s: GPU and CPU differ", what);
    /* control: one row's k-th expert one off */
    int32_t *e2 = malloc((size_t)RK * 4);
    memcpy(e2, eid, (size_t)RK * 4);
    e2[RK - 1] = (e2[RK - 1] + 1) % E;
    float *yw = falloc((size_t)R * D);
    dsv4_experts_args wa = a;
    wa.eid = e2, wa.y = yw;
    cpu->experts(&wa);
    control("experts expert id off", yg, yw, mag, (size_t)R * D);
    /* each row alone == in the batch, bitwise (solo pairs vs grouped tiles) */
    int same = 1;
    float *one = falloc(D);
    for (int r = 0; r < R; r++) {
        dsv4_experts_args oa = ga;
        oa.R = 1, oa.eid = de + (size_t)r * K, oa.wts = dw + (size_t)r * K, oa.x = dx + (size_t)r * D;
        oa.y = dy;
        gpu->experts(&oa);
        gpu->download(one, dy, D * 4);
        same &= !memcmp(one, yg + (size_t)r * D, D * 4);
    }
    CHECK(same, "%s: a row alone differs from the batch", what);
    printf("  concurrent == solo (%d rows, %d pairs): %s\n", R, RK, same ? "bitwise equal" : "DIFFERENT");
    /* REF numerics (x and h through e4m3 blocks of 32, products and outputs through bf16): the
     * GPU's against the CPU's within 2^-6 of the largest |y|, since a bf16 rounding may fall the
     * other way where the fp32 sums' orders differ; a wrong quantization or a missing rounding
     * moves y by far more. Control: the fp32 result is not within it. And each row alone. */
    dsv4_experts_args ca = a;
    ca.ref = 1, ca.y = yw;
    cpu->experts(&ca);
    ga.ref = 1;
    gpu->experts(&ga);
    CHECK(!gpu->check(&err), "%s ref: %s", what, err.msg);
    float *yq = falloc((size_t)R * D);
    gpu->download(yq, dy, (size_t)R * D * 4);
    double ymax = 0, dmax = 0, dctl = 0;
    for (size_t i = 0; i < (size_t)R * D; i++) {
        ymax = fmax(ymax, fabs(yw[i]));
        dmax = fmax(dmax, fabs((double)yq[i] - yw[i]));
        dctl = fmax(dctl, fabs((double)yr[i] - yw[i]));
    }
    CHECK(dmax <= 0x1p-6 * ymax, "%s ref: GPU and CPU differ by %.3g, beyond 2^-6 of %.3g", what, dmax, ymax);
    CHECK(dctl > 0x1p-6 * ymax, "%s ref: control (the fp32 result) within the bound", what);
    int rsame = 1;
    for (int r = 0; r < R; r++) {
        dsv4_experts_args oa = ga;
        oa.R = 1, oa.eid = de + (size_t)r * K, oa.wts = dw + (size_t)r * K, oa.x = dx + (size_t)r * D;
        gpu->experts(&oa);
        gpu->download(one, dy, D * 4);
        rsame &= !memcmp(one, yq + (size_t)r * D, D * 4);
    }
    CHECK(rsame, "%s ref: a row alone differs from the batch", what);
    printf("  ref: max|gpu - cpu| %.3g (bound %.3g, fp32 control %.3g), %d rows alone == in the batch: %s\n", dmax,
           0x1p-6 * ymax, dctl, R, rsame ? "bitwise" : "DIFFERENT");
    free(yq);
    gpu->free(dx), gpu->free(dw), gpu->free(dy), gpu->free(de), gpu->free(dwork);
    for (int e = 0; e < E; e++) {
        dsv4_weight *ws[3] = {&w1[e], &w2[e], &w3[e]};
        for (int j = 0; j < 3; j++) {
            dsv4_cuda_drop_weight(ws[j]);
            free((void *)ws[j]->data), free((void *)ws[j]->scale);
        }
    }
    free(w1), free(w2), free(w3), free(x), free(wts), free(yr), free(yg), free(eid), free(mag), free(row), free(g);
    free(u), free(gm), free(um), free(w2r), free(e2), free(yw), free(one);
}

/* ---- graphs ------------------------------------------------------------------------------------ */

/* rmsnorm -> linear -> add recorded once; replays with new input contents equal the ops run
 * directly, bitwise. A recording of an op given a constant that was never placed fails (NULL, a
 * reason naming the array) and leaves no error. */
static void test_graph(void)
{
    if (!gpu->graph_begin) {
        CHECK(0, "the CUDA table has no graph entries");
        return;
    }
    dsv4_err err = {0};
    lin_case c = {DSV4_WF_FP4, 128, 256, 1, 32, 1, 0, 128, 3, 0, 0};
    dsv4_weight w;
    lin_weight(&c, &w);
    CHECK(!dsv4_cuda_put_weight(&w, &err), "put: %s", err.msg);
    int T = 3, k = 256, n = 128;
    float *nw = falloc(k), *x = falloc((size_t)T * k), *b = falloc((size_t)T * n);
    fill(nw, k, 0.5f, 1.5f);
    CHECK(!dsv4_cuda_put(nw, k * 4, &err), "put: %s", err.msg);
    float *dx = to_dev(NULL, (size_t)T * k * 4), *dh = to_dev(NULL, (size_t)T * k * 4), *dy = to_dev(NULL, (size_t)T * n * 4);
    float *db = to_dev(NULL, (size_t)T * n * 4), *dz = to_dev(NULL, (size_t)T * n * 4);
    CHECK(!gpu->graph_begin(), "graph_begin failed");
    gpu->rmsnorm(dx, T, k, nw, 1e-6f, dh);
    gpu->linear(&w, 0, n, dh, T, k, dy, n);
    gpu->add(dy, db, (int64_t)T * n, dz);
    void *g = gpu->graph_end();
    CHECK(g != NULL, "graph_end failed: %s", dsv4_cuda_graph_why());
    int same = 1;
    float *eager = falloc((size_t)T * n), *rep = falloc((size_t)T * n);
    for (int it = 0; it < 3 && g; it++) {
        fill(x, (size_t)T * k, -1, 1);
        fill(b, (size_t)T * n, -1, 1);
        gpu->upload(dx, x, (size_t)T * k * 4);
        gpu->upload(db, b, (size_t)T * n * 4);
        gpu->rmsnorm(dx, T, k, nw, 1e-6f, dh);
        gpu->linear(&w, 0, n, dh, T, k, dy, n);
        gpu->add(dy, db, (int64_t)T * n, dz);
        gpu->download(eager, dz, (size_t)T * n * 4);
        gpu->upload(dz, x, (size_t)T * n * 4); /* overwrite: the replay must write it again */
        gpu->graph_run(g);
        gpu->download(rep, dz, (size_t)T * n * 4);
        same &= !memcmp(eager, rep, (size_t)T * n * 4);
    }
    CHECK(!gpu->check(&err), "graph: %s", err.msg);
    CHECK(same, "graph: a replay differs from the ops run directly");
    printf("  graph rmsnorm+linear+add, 3 replays with new inputs: %s\n", same ? "bitwise equal" : "DIFFERENT");
    gpu->graph_free(g);
    /* a constant never placed inside a recording: refused, no error left behind, eager ops
     * still fine */
    float *nw2 = falloc(k);
    memcpy(nw2, nw, k * 4);
    CHECK(!gpu->graph_begin(), "graph_begin failed");
    gpu->rmsnorm(dx, T, k, nw2, 1e-6f, dh);
    void *g2 = gpu->graph_end();
    CHECK(g2 == NULL && strstr(dsv4_cuda_graph_why(), "never placed"),
          "graph: a recording with a constant never placed was not refused");
    printf("  graph with a constant never placed refused: %s\n", dsv4_cuda_graph_why());
    if (g2)
        gpu->graph_free(g2);
    CHECK(!gpu->check(&err), "graph: a failed recording left an error: %s", err.msg);
    gpu->add(dy, db, (int64_t)T * n, dz);
    CHECK(!gpu->check(&err), "graph: ops after a failed recording: %s", err.msg);
    /* the same op run directly: it fails naming the array, its output NaN */
    gpu->rmsnorm(dx, T, k, nw2, 1e-6f, dh);
    float *hn = from_dev(dh, (size_t)T * k * 4);
    int code = gpu->check(&err), nan = 1;
    for (size_t i = 0; i < (size_t)T * k; i++)
        nan &= isnan(hn[i]);
    CHECK(code && strstr(err.msg, "rmsnorm") && strstr(err.msg, "never placed") && nan,
          "rmsnorm with a constant never placed: not refused by name with a NaN output (%s)", code ? err.msg : "no error");
    printf("  rmsnorm with a constant never placed refused, output NaN: %s\n", code && nan ? err.msg : "NO");
    free(hn), free(nw2);
    gpu->free(dx), gpu->free(dh), gpu->free(dy), gpu->free(db), gpu->free(dz);
    dsv4_cuda_drop(nw);
    dsv4_cuda_drop_weight(&w);
    free((void *)w.data), free((void *)w.scale), free(nw), free(x), free(b), free(eager), free(rep);
}

/* ---- attn_step ------------------------------------------------------------------------------- */

typedef struct {
    int S;
    int64_t start[3];
    int n[3];
    int H, d, rd, W, ratio, csa, ci, nI, topk, kv_cap, c_cap;
    int64_t vis_cap;
    int ties;                   /* plant exactly tied indexer keys (more than topk of them) */
} attn_case;

typedef struct {
    float *b[7];                /* kv, c, z, ent, ic, iz, ikey (the dsv4_lbufs order) */
} seq_state;

/* Element counts of a sequence's buffers, in dsv4_lbufs order. */
static void state_sizes(const attn_case *c, size_t sz[7])
{
    int cw = (1 + c->csa) * c->d;
    sz[0] = (size_t)c->kv_cap * c->d;
    sz[1] = sz[2] = c->ratio ? (size_t)c->c_cap * cw : 0;
    sz[3] = c->ratio ? (size_t)c->vis_cap * c->d : 0;
    sz[4] = sz[5] = c->csa ? (size_t)c->c_cap * 2 * c->ci : 0;
    sz[6] = c->csa ? (size_t)c->vis_cap * c->ci : 0;
}

static dsv4_lbufs as_lbufs(float *const b[7])
{
    dsv4_lbufs l = {.kv = b[0], .c = b[1], .z = b[2], .ent = b[3], .ic = b[4], .iz = b[5], .ikey = b[6]};
    return l;
}

typedef struct {
    int R;
    int64_t *pos, *start;
    int32_t *seq, *first;
    float *q, *kv, *cc, *zz, *ic, *iz, *qi, *wt;
    float *sink, *ifreq, *ape, *norm, *iape, *inorm;
} step_in;

/* The arguments for the step's sequences `which` (ns of them, in order) over host buffers
 * (the rows of those sequences only, renumbered): the CPU's, and what attn_gpu uploads. */
static dsv4_attn_args attn_args(const attn_case *c, const step_in *in, const int *which, int ns, const dsv4_lbufs *st,
                                int64_t *pos, int32_t *seq, int64_t *start, int32_t *first, float **bufs)
{
    int cw = (1 + c->csa) * c->d, iw = 2 * c->ci, Hd = c->H * c->d;
    int R = 0;
    for (int j = 0; j < ns; j++) {
        int s = which[j];
        start[j] = c->start[s];
        first[j] = R;
        for (int i = 0; i < c->n[s]; i++) {
            pos[R] = c->start[s] + i;
            seq[R] = j;
            int r0 = 0;
            for (int t = 0; t < s; t++)
                r0 += c->n[t];
            int src = r0 + i;
            memcpy(bufs[0] + (size_t)R * Hd, in->q + (size_t)src * Hd, Hd * 4);
            memcpy(bufs[1] + (size_t)R * c->d, in->kv + (size_t)src * c->d, c->d * 4);
            memcpy(bufs[2] + (size_t)R * cw, in->cc + (size_t)src * cw, cw * 4);
            memcpy(bufs[3] + (size_t)R * cw, in->zz + (size_t)src * cw, cw * 4);
            memcpy(bufs[4] + (size_t)R * iw, in->ic + (size_t)src * iw, iw * 4);
            memcpy(bufs[5] + (size_t)R * iw, in->iz + (size_t)src * iw, iw * 4);
            memcpy(bufs[6] + (size_t)R * c->nI * c->ci, in->qi + (size_t)src * c->nI * c->ci, (size_t)c->nI * c->ci * 4);
            memcpy(bufs[7] + (size_t)R * c->nI, in->wt + (size_t)src * c->nI, c->nI * 4);
            R++;
        }
    }
    dsv4_attn_args a;
    memset(&a, 0, sizeof a);
    a.rows = (dsv4_rows){R, ns, pos, seq, start, first};
    a.st = st;
    a.kv_cap = c->kv_cap, a.c_cap = c->c_cap, a.vis_cap = c->vis_cap;
    a.H = c->H, a.d = c->d, a.rd = c->rd, a.window = c->W;
    a.scale = 1.0f / sqrtf((float)c->d), a.eps = 1e-6f;
    a.sink = in->sink, a.inv_freq = in->ifreq;
    a.ratio = c->ratio, a.csa = c->csa;
    a.comp = (dsv4_pool){c->ratio, c->d, c->csa, in->ape, in->norm};
    a.icomp = (dsv4_pool){c->ratio, c->ci, 1, in->iape, in->inorm};
    a.nI = c->nI, a.ci = c->ci, a.topk = c->topk, a.iw_scale = 0.7f;
    a.q = bufs[0], a.kv = bufs[1], a.cc = bufs[2], a.zz = bufs[3], a.ic = bufs[4], a.iz = bufs[5];
    a.qi = bufs[6], a.wt = bufs[7];
    return a;
}

/* Scratch attn_gpu gives the op: what its attn_work asks (0), or only DSV4_ATTN_WORK (1), with
 * which the tensor-core attention takes its other form (per row instead of per key chunk). */
static int g_attn_lean;

/* Runs the step for sequences `which` on the GPU from the initial states; returns o [rows, H d]
 * and the final states (host copies, in st_out). work_out: the op's scratch (scores, sel). */
static float *attn_gpu(const attn_case *c, const step_in *in, const int *which, int ns, seq_state *const *init,
                       seq_state *st_out, float **work_out)
{
    size_t sz[7];
    state_sizes(c, sz);
    int Rmax = in->R, cw = (1 + c->csa) * c->d, iw = 2 * c->ci, Hd = c->H * c->d;
    size_t bsz[8] = {(size_t)Rmax * Hd, (size_t)Rmax * c->d, (size_t)Rmax * cw, (size_t)Rmax * cw, (size_t)Rmax * iw,
                     (size_t)Rmax * iw, (size_t)Rmax * c->nI * c->ci, (size_t)Rmax * c->nI};
    float *hb[8], *db[8];
    for (int i = 0; i < 8; i++)
        hb[i] = falloc(bsz[i]);
    int64_t pos[64], start[3];
    int32_t seq[64], first[3];
    dsv4_lbufs hst[3] = {{0}};
    dsv4_attn_args a = attn_args(c, in, which, ns, hst, pos, seq, start, first, hb);
    int R = a.rows.R;
    for (int i = 0; i < 8; i++)
        db[i] = to_dev(hb[i], bsz[i] * 4);
    float *dstate[3][7];
    for (int j = 0; j < ns; j++) {
        for (int k = 0; k < 7; k++)
            dstate[j][k] = sz[k] ? to_dev(init[which[j]]->b[k], sz[k] * 4) : NULL;
        hst[j] = as_lbufs(dstate[j]);
    }
    dsv4_lbufs *dst = to_dev(hst, ns * sizeof(dsv4_lbufs));
    int64_t *dpos = to_dev(pos, R * 8), *dstart = to_dev(start, ns * 8);
    int32_t *dseq = to_dev(seq, R * 4), *dfirst = to_dev(first, ns * 4);
    size_t wn = !g_attn_lean && gpu->attn_work ? gpu->attn_work(&a) : DSV4_ATTN_WORK(R, c->vis_cap, c->topk);
    float *dwork = to_dev(NULL, wn * 4), *dout = to_dev(NULL, (size_t)R * Hd * 4);
    a.rows.pos = dpos, a.rows.seq = dseq, a.rows.start = dstart, a.rows.first = dfirst;
    a.st = dst;
    a.q = db[0], a.kv = db[1], a.cc = db[2], a.zz = db[3], a.ic = db[4], a.iz = db[5], a.qi = db[6], a.wt = db[7];
    a.o = dout, a.work = dwork, a.work_n = wn;
    /* the constants as device copies */
    int m = c->ratio > 0 ? c->ratio : 1;
    float *dk[6] = {up(in->sink, (size_t)c->H * 4), up(in->ifreq, (size_t)(c->rd / 2) * 4), up(in->ape, (size_t)m * cw * 4),
                    up(in->norm, (size_t)c->d * 4), up(in->iape, (size_t)m * iw * 4), up(in->inorm, (size_t)c->ci * 4)};
    a.sink = dk[0], a.inv_freq = dk[1], a.comp.ape = dk[2], a.comp.norm = dk[3], a.icomp.ape = dk[4], a.icomp.norm = dk[5];
    gpu->attn_step(&a);
    for (int i = 0; i < 6; i++)
        drop(dk[i]);
    float *o = from_dev(dout, (size_t)R * Hd * 4);
    for (int j = 0; j < ns; j++)
        for (int k = 0; k < 7; k++) {
            st_out[j].b[k] = sz[k] ? from_dev(dstate[j][k], sz[k] * 4) : NULL;
            gpu->free(dstate[j][k]);
        }
    if (work_out)
        *work_out = from_dev(dwork, wn * 4);
    for (int i = 0; i < 8; i++)
        gpu->free(db[i]), free(hb[i]);
    gpu->free(dst), gpu->free(dpos), gpu->free(dstart), gpu->free(dseq), gpu->free(dfirst), gpu->free(dwork);
    gpu->free(dout);
    return o;
}

/* The CPU op over copies of the initial states: o, and the final states in st_out. mutate:
 * applied to the copies first (a planted control). */
static float *attn_cpu(const attn_case *c, const step_in *in, seq_state *const *init, seq_state *st_out, int window)
{
    size_t sz[7];
    state_sizes(c, sz);
    int R = in->R, Hd = c->H * c->d;
    int which[3] = {0, 1, 2};
    int cw = (1 + c->csa) * c->d, iw = 2 * c->ci;
    size_t bsz[8] = {(size_t)R * Hd, (size_t)R * c->d, (size_t)R * cw, (size_t)R * cw, (size_t)R * iw, (size_t)R * iw,
                     (size_t)R * c->nI * c->ci, (size_t)R * c->nI};
    float *hb[8];
    for (int i = 0; i < 8; i++)
        hb[i] = falloc(bsz[i]);
    int64_t pos[64], start[3];
    int32_t seq[64], first[3];
    dsv4_lbufs hst[3] = {{0}};
    dsv4_attn_args a = attn_args(c, in, which, c->S, hst, pos, seq, start, first, hb);
    for (int j = 0; j < c->S; j++) {
        for (int k = 0; k < 7; k++) {
            st_out[j].b[k] = sz[k] ? falloc(sz[k]) : NULL;
            if (sz[k])
                memcpy(st_out[j].b[k], init[j]->b[k], sz[k] * 4);
        }
        hst[j] = as_lbufs(st_out[j].b);
    }
    float *o = falloc((size_t)R * Hd);
    a.o = o;
    a.window = window;
    cpu->attn_step(&a);
    for (int i = 0; i < 8; i++)
        free(hb[i]);
    return o;
}

static void state_free(seq_state *s, int n)
{
    for (int j = 0; j < n; j++)
        for (int k = 0; k < 7; k++)
            free(s[j].b[k]);
}

/* A case's random step inputs and initial sequence states (with planted ties when asked). */
static void attn_inputs(const attn_case *c, step_in *inp, seq_state init[3])
{
    size_t sz[7];
    state_sizes(c, sz);
    int R = 0, Hd = c->H * c->d, cw = (1 + c->csa) * c->d, iw = 2 * c->ci;
    for (int s = 0; s < c->S; s++)
        R += c->n[s];
    step_in in;
    memset(&in, 0, sizeof in);
    in.R = R;
    in.q = falloc((size_t)R * Hd), in.kv = falloc((size_t)R * c->d), in.cc = falloc((size_t)R * cw);
    in.zz = falloc((size_t)R * cw), in.ic = falloc((size_t)R * iw), in.iz = falloc((size_t)R * iw);
    in.qi = falloc((size_t)R * c->nI * c->ci), in.wt = falloc((size_t)R * c->nI);
    fill(in.q, (size_t)R * Hd, -1, 1);
    fill(in.kv, (size_t)R * c->d, -1, 1);
    fill(in.cc, (size_t)R * cw, -1, 1);
    fill(in.zz, (size_t)R * cw, -1, 1);
    fill(in.ic, (size_t)R * iw, -1, 1);
    fill(in.iz, (size_t)R * iw, -1, 1);
    fill(in.qi, (size_t)R * c->nI * c->ci, c->ties ? 0.0f : -1.0f, 1);
    fill(in.wt, (size_t)R * c->nI, 0.1f, 1);
    in.sink = falloc(c->H), in.ifreq = falloc(c->rd / 2);
    fill(in.sink, c->H, -1, 1);
    for (int i = 0; i < c->rd / 2; i++)
        in.ifreq[i] = powf(10000.0f, -(float)(2 * i) / c->rd);
    int m = c->ratio > 0 ? c->ratio : 1;
    in.ape = falloc((size_t)m * cw), in.norm = falloc(c->d), in.iape = falloc((size_t)m * iw), in.inorm = falloc(c->ci);
    fill(in.ape, (size_t)m * cw, -0.5f, 0.5f);
    fill(in.norm, c->d, 0.5f, 1.5f);
    fill(in.iape, (size_t)m * iw, -0.5f, 0.5f);
    fill(in.inorm, c->ci, 0.5f, 1.5f);
    for (int s = 0; s < c->S; s++)
        for (int k = 0; k < 7; k++) {
            init[s].b[k] = sz[k] ? falloc(sz[k]) : NULL;
            if (sz[k])
                fill(init[s].b[k], sz[k], -1, 1);
        }
    if (c->ties) /* every third indexer key the same positive vector: the best scores, exactly tied */
        for (int s = 0; s < c->S; s++)
            for (int64_t w = 0; w < c->vis_cap; w += 3)
                for (int i = 0; i < c->ci; i++)
                    init[s].b[6][w * c->ci + i] = 0.5f;
    *inp = in;
}

static void attn_inputs_free(const attn_case *c, step_in *in, seq_state init[3])
{
    state_free(init, c->S);
    free(in->q), free(in->kv), free(in->cc), free(in->zz), free(in->ic), free(in->iz), free(in->qi), free(in->wt);
    free(in->sink), free(in->ifreq), free(in->ape), free(in->norm), free(in->iape), free(in->inorm);
}

/* Random sequence state (rings, entries, indexer keys) for S sequences at different positions
 * and a step of several rows each (rows completing CSA/HCA entries; a sequence with more rows
 * than the rings hold); compares o, the entries, the indexer keys and every ring with the CPU
 * op, checks the indexer's selection exactly (the GPU's own scores through the CPU's top-k, and
 * against the CPU's scores), that each sequence alone gives the rows of the batch bitwise, and
 * planted controls: a window one shorter, and ties to the higher index. */
static void test_attn_step(const attn_case *c)
{
    char what[200];
    snprintf(what, sizeof what, "attn_step ratio %d%s S=%d H=%d d=%d topk %d vis %lld W %d%s%s", c->ratio,
             c->csa ? " csa" : c->ratio ? " hca" : " sliding", c->S, c->H, c->d, c->topk, (long long)c->vis_cap, c->W,
             c->ties ? " ties" : "", c->csa && dsv4_cuda_tensor_cores() ? " (tensor cores)" : "");
    size_t sz[7];
    state_sizes(c, sz);
    int R = 0, Hd = c->H * c->d;
    for (int s = 0; s < c->S; s++)
        R += c->n[s];
    step_in in;
    seq_state init[3], *ip[3] = {&init[0], &init[1], &init[2]};
    attn_inputs(c, &in, init);
    seq_state ref[3], got[3];
    int all3[3] = {0, 1, 2};
    float *oref = attn_cpu(c, &in, ip, ref, c->W);
    float *work = NULL;
    float *ogot = attn_gpu(c, &in, all3, c->S, ip, got, &work);
    dsv4_err err = {0};
    CHECK(!gpu->check(&err), "%s: %s", what, err.msg);
    /* o: a convex combination of key rows; mag = the largest |key value| anywhere */
    double M = 0;
    for (int s = 0; s < c->S; s++) {
        for (size_t i = 0; i < sz[0]; i++)
            M = fmax(M, fabs(init[s].b[0][i]));
        for (size_t i = 0; i < sz[3]; i++)
            M = fmax(M, fabs(ref[s].b[3][i]));
    }
    for (size_t i = 0; i < (size_t)R * c->d; i++)
        M = fmax(M, fabs(in.kv[i]));
    double *mag = malloc((size_t)R * Hd * sizeof(double));
    for (size_t i = 0; i < (size_t)R * Hd; i++)
        mag[i] = M;
    snprintf(what + strlen(what), sizeof what - strlen(what), " o");
    CHECK(agree(what, ogot, oref, mag, (size_t)R * Hd, 0), "%s: GPU and CPU differ", what);
    /* entries and indexer keys (rows: mag = the row's largest |value|); rings bitwise */
    int rings_same = 1, ent_ok = 1;
    for (int s = 0; s < c->S; s++) {
        for (int k = 0; k < 7; k++) {
            if (!sz[k])
                continue;
            if (k == 3 || k == 6) {
                int w = k == 3 ? c->d : c->ci;
                double *em = malloc(sz[k] * sizeof(double));
                for (size_t r0 = 0; r0 < sz[k]; r0 += w) {
                    double rm = 0;
                    for (int i = 0; i < w; i++)
                        rm = fmax(rm, fabs(ref[s].b[k][r0 + i]));
                    for (int i = 0; i < w; i++)
                        em[r0 + i] = rm;
                }
                ent_ok &= agree(k == 3 ? "  entries" : "  indexer keys", got[s].b[k], ref[s].b[k], em, sz[k], 1);
                free(em);
            } else
                rings_same &= !memcmp(got[s].b[k], ref[s].b[k], sz[k] * 4);
        }
    }
    CHECK(ent_ok, "%s: entries or indexer keys differ", what);
    CHECK(rings_same, "%s: rings differ", what);
    printf("  entries, indexer keys %s; rings %s\n", ent_ok ? "ok" : "FAIL", rings_same ? "bitwise equal" : "DIFFERENT");
    /* the selection: the GPU's scores against the CPU's (tolerance), and its kept set exactly the
     * CPU top-k of the GPU's own scores; against the CPU's scores too, unless a boundary pair is
     * within rounding (counted) */
    if (c->csa) {
        int sel_exact = 1, score_ok = 1, near = 0, far = 0, checked = 0;
        const int32_t *sel = (const int32_t *)(work + (size_t)R * c->vis_cap);
        dsv4_scored *tmp = malloc((size_t)c->vis_cap * sizeof *tmp);
        int64_t *mine = malloc((size_t)c->vis_cap * sizeof(int64_t)), *cpus = malloc((size_t)c->vis_cap * sizeof(int64_t));
        float *cs = falloc(c->vis_cap);
        int r = 0;
        for (int s = 0; s < c->S; s++)
            for (int i = 0; i < c->n[s]; i++, r++) {
                int64_t p = c->start[s] + i, nvis = (p + 1) / c->ratio;
                if (nvis <= c->topk)
                    continue;
                checked++;
                const float *gs = work + (size_t)r * c->vis_cap;
                for (int64_t w = 0; w < nvis; w++) { /* the CPU's score, from the final (CPU) keys */
                    float sc = 0;
                    for (int h = 0; h < c->nI; h++) {
                        float dp = dsv4_dot(in.qi + ((size_t)r * c->nI + h) * c->ci, ref[s].b[6] + w * c->ci, c->ci);
                        sc += in.wt[r * c->nI + h] * 0.7f * (dp > 0 ? dp : 0);
                    }
                    cs[w] = sc * (1.0f / sqrtf((float)c->ci));
                    double mg = 0;
                    for (int h = 0; h < c->nI; h++)
                        for (int j = 0; j < c->ci; j++)
                            mg += fabs(in.wt[r * c->nI + h] * 0.7 * in.qi[((size_t)r * c->nI + h) * c->ci + j] *
                                       ref[s].b[6][w * c->ci + j]);
                    score_ok &= fabs(gs[w] - cs[w]) <= REL * mg / sqrt(c->ci) + 1e-30;
                }
                for (int64_t w = 0; w < nvis; w++)
                    tmp[w] = (dsv4_scored){gs[w], w};
                int n1 = dsv4_topk_ascending(tmp, nvis, c->topk, mine);
                int same = n1 == c->topk;
                for (int k = 0; same && k < n1; k++)
                    same = mine[k] == sel[(size_t)r * c->topk + k];
                sel_exact &= same;
                for (int64_t w = 0; w < nvis; w++)
                    tmp[w] = (dsv4_scored){cs[w], w};
                dsv4_topk_ascending(tmp, nvis, c->topk, cpus);
                if (memcmp(cpus, mine, (size_t)c->topk * sizeof(int64_t))) {
                    /* accepted when every entry in one set but not the other has a CPU score within
                     * rounding (1e-5 relative) of the others: a boundary decided by rounding */
                    float lo = INFINITY, hi = -INFINITY;
                    for (int k = 0; k < c->topk; k++) {
                        int in_c = 0, in_m = 0;
                        for (int j = 0; j < c->topk; j++)
                            in_c |= cpus[j] == mine[k], in_m |= mine[j] == cpus[k];
                        if (!in_c)
                            lo = fminf(lo, cs[mine[k]]), hi = fmaxf(hi, cs[mine[k]]);
                        if (!in_m)
                            lo = fminf(lo, cs[cpus[k]]), hi = fmaxf(hi, cs[cpus[k]]);
                    }
                    if (hi - lo <= 1e-5f * fmaxf(fabsf(hi), fabsf(lo)))
                        near++;
                    else
                        far++;
                }
            }
        CHECK(score_ok, "%s: indexer scores differ beyond tolerance", what);
        CHECK(sel_exact, "%s: the GPU's selection is not the top-k of its scores (desc, ties low, ascending)", what);
        CHECK(far == 0, "%s: %d rows selected differently from the CPU's scores", what, far);
        printf("  indexer: %d rows selected, scores %s, selection %s; vs the CPU's scores %d differ, %d of them "
               "within rounding\n", checked, score_ok ? "ok" : "FAIL", sel_exact ? "exact" : "WRONG", near + far, near);
        free(tmp), free(mine), free(cpus), free(cs);
    }
    /* control 1: the window one shorter (a wrong window start) */
    if (c->W > 1) {
        seq_state wr[3];
        float *ow = attn_cpu(c, &in, ip, wr, c->W - 1);
        control("attn_step window start off by one", ogot, ow, mag, (size_t)R * Hd);
        state_free(wr, c->S);
        free(ow);
    }
    /* control 2: ties to the higher index: the lowest tied key lowered a little in the
     * reference's state, so it loses its tie to the next */
    if (c->ties && c->csa) {
        seq_state mod[3], wr[3], *mp[3] = {&mod[0], &mod[1], &mod[2]};
        for (int s = 0; s < c->S; s++)
            for (int k = 0; k < 7; k++) {
                mod[s].b[k] = sz[k] ? falloc(sz[k]) : NULL;
                if (sz[k])
                    memcpy(mod[s].b[k], init[s].b[k], sz[k] * 4);
            }
        for (int s = 0; s < c->S; s++)
            mod[s].b[6][0] = 0.49f;
        float *ow = attn_cpu(c, &in, mp, wr, c->W);
        control("attn_step tie to the higher index", ogot, ow, mag, (size_t)R * Hd);
        state_free(mod, c->S), state_free(wr, c->S);
        free(ow);
    }
    /* each sequence alone == its rows in the batch, bitwise */
    int same = 1, r0 = 0;
    for (int s = 0; s < c->S; s++) {
        seq_state one[1];
        float *o1 = attn_gpu(c, &in, &s, 1, ip, one, NULL);
        same &= !memcmp(o1, ogot + (size_t)r0 * Hd, (size_t)c->n[s] * Hd * 4);
        for (int k = 0; k < 7; k++)
            same &= !sz[k] || !memcmp(one[0].b[k], got[s].b[k], sz[k] * 4);
        r0 += c->n[s];
        state_free(one, 1);
        free(o1);
    }
    CHECK(same, "%s: a sequence alone differs from the batch", what);
    printf("  each sequence alone == in the batch: %s\n", same ? "bitwise equal" : "DIFFERENT");
    /* the batch again with the least scratch: the same bits (on tensor cores, the other form) */
    {
        seq_state lean[3];
        g_attn_lean = 1;
        float *ol = attn_gpu(c, &in, all3, c->S, ip, lean, NULL);
        g_attn_lean = 0;
        int eq = !memcmp(ol, ogot, (size_t)R * Hd * 4);
        CHECK(eq, "%s: the batch with the least scratch differs", what);
        printf("  the batch with the least scratch: %s\n", eq ? "bitwise equal" : "DIFFERENT");
        state_free(lean, c->S);
        free(ol);
    }
    CHECK(!gpu->check(&err), "%s: %s", what, err.msg);
    state_free(ref, c->S), state_free(got, c->S);
    attn_inputs_free(c, &in, init);
    free(oref), free(ogot), free(work), free(mag);
}

/* Rows [r0, r0 + n) of a step's inputs as a step of their own (the shared parameters as they are). */
static step_in rows_of(const attn_case *c, const step_in *in, int r0, int n)
{
    int cw = (1 + c->csa) * c->d, iw = 2 * c->ci;
    step_in v = *in;
    v.R = n;
    v.q = in->q + (size_t)r0 * c->H * c->d, v.kv = in->kv + (size_t)r0 * c->d;
    v.cc = in->cc + (size_t)r0 * cw, v.zz = in->zz + (size_t)r0 * cw;
    v.ic = in->ic + (size_t)r0 * iw, v.iz = in->iz + (size_t)r0 * iw;
    v.qi = in->qi + (size_t)r0 * c->nI * c->ci, v.wt = in->wt + (size_t)r0 * c->nI;
    return v;
}

/* x with its low 16 bits cleared: the hi term of the tensor cores' split. Not inlined: inlined
 * under iscore_ref's `if (hi)` inside its loop, GCC 12.2 at -O1 and -O2 (not with -fno-tree-ter)
 * drops the mask, and the reference then equals the full one. */
__attribute__((noinline)) static float bf16_hi(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u &= 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

/* Row r's indexer scores over keys (nvis rows of ci) in double: ref[w], and mag[w] = sum_h |w_h|
 * sum_j |q_hj k_wj| / sqrt(ci), with w_h = wt[r,h] 0.7 (the float product); hi: q and the keys
 * cut to their bf16 hi terms first. */
static void iscore_ref(const attn_case *c, const step_in *in, int r, const float *keys, int64_t nvis, int hi,
                       float *ref, double *mag)
{
    const float *q = in->qi + (size_t)r * c->nI * c->ci;
    for (int64_t w = 0; w < nvis; w++) {
        double v = 0, m = 0;
        for (int h = 0; h < c->nI; h++) {
            double wh = (double)(in->wt[(size_t)r * c->nI + h] * 0.7f), dp = 0, dm = 0;
            for (int j = 0; j < c->ci; j++) {
                float a = q[(size_t)h * c->ci + j], b = keys[w * c->ci + j];
                if (hi)
                    a = bf16_hi(a), b = bf16_hi(b);
                dp += (double)a * b;
                dm += fabs((double)a * b);
            }
            v += wh * (dp > 0 ? dp : 0);
            m += fabs(wh) * dm;
        }
        ref[w] = (float)(v / sqrt((double)c->ci));
        mag[w] = m / sqrt((double)c->ci);
    }
}

/* The indexer on the tensor cores (k_iscore_tc), the switch on for the duration: the checks of
 * test_attn_step (o, entries, keys and the selection against the CPU, each sequence alone);
 * the scores of every selecting row against a double reference over the GPU's own keys within
 * REL * sum_h |w_h| sum_j |q k| / sqrt(ci), and differing in rounding from the FMA kernel's
 * somewhere (so the tensor-core kernel is the one that ran); and a row alone: rows at the
 * start, middle and end of each sequence, each run as a step of one row from the state its
 * sequence's earlier rows leave (a step of those rows first), give the batch's o row and
 * scores bit for bit; the scores' rms error at most 1/16 of a reference of the bf16 hi terms
 * alone (a kernel without the split's mid and lo terms; the worst-case bound admits it).
 * Controls: one reference score moved by twice its bound fails the comparison; and with one
 * row's first indexer head reduced to one element whose
 * split has a lo term, changing that lo term changes the row's scores while every other row's
 * scores and o keep their bits. */
static void test_attn_step_tc(const attn_case *c)
{
    int was = dsv4_cuda_tensor_cores();
    dsv4_cuda_set_tensor_cores(1);
    test_attn_step(c);
    char what[200];
    snprintf(what, sizeof what, "attn_step tensor-core indexer nI %d ci %d topk %d vis %lld", c->nI, c->ci, c->topk,
             (long long)c->vis_cap);
    int R = 0, Hd = c->H * c->d, all3[3] = {0, 1, 2}, row0[3];
    for (int s = 0; s < c->S; s++)
        row0[s] = R, R += c->n[s];
    int64_t V = c->vis_cap;
    step_in in;
    seq_state init[3], got[3], *ip[3] = {&init[0], &init[1], &init[2]};
    attn_inputs(c, &in, init);
    float *work = NULL, *o = attn_gpu(c, &in, all3, c->S, ip, got, &work);
    dsv4_err err = {0};
    CHECK(!gpu->check(&err), "%s: %s", what, err.msg);
    /* the scores against the double reference, and the hi-terms control */
    float *ref = falloc((size_t)R * V), *rhi = falloc((size_t)R * V), *gs = falloc((size_t)R * V);
    double *mag = malloc((size_t)R * V * sizeof(double)), *mhi = malloc((size_t)V * sizeof(double));
    size_t n = 0;
    int selecting = 0;
    for (int s = 0; s < c->S; s++)
        for (int i = 0; i < c->n[s]; i++) {
            int r = row0[s] + i;
            int64_t nvis = (c->start[s] + i + 1) / c->ratio;
            if (nvis <= c->topk)
                continue;
            selecting++;
            iscore_ref(c, &in, r, got[s].b[6], nvis, 0, ref + n, mag + n);
            iscore_ref(c, &in, r, got[s].b[6], nvis, 1, rhi + n, mhi);
            memcpy(gs + n, work + (size_t)r * V, (size_t)nvis * 4);
            n += (size_t)nvis;
        }
    CHECK(selecting == R, "%s: %d of %d rows select (the case must make every row select)", what, selecting, R);
    char sw[220];
    snprintf(sw, sizeof sw, "%s scores", what);
    CHECK(agree(sw, gs, ref, mag, n, 0), "%s: differ from the double reference", sw);
    /* the split's lower terms are in the sums: the error against the double reference is far
     * below that of the hi terms alone (which the worst-case bound above still admits) */
    {
        double e_got = 0, e_hi = 0;
        for (size_t i = 0; i < n; i++) {
            e_got += ((double)gs[i] - ref[i]) * ((double)gs[i] - ref[i]);
            e_hi += ((double)rhi[i] - ref[i]) * ((double)rhi[i] - ref[i]);
        }
        CHECK(e_got * 256 <= e_hi, "%s: rms error %.3g not below 1/16 of the hi terms' %.3g", sw, sqrt(e_got / n),
              sqrt(e_hi / n));
        printf("  scores' rms error %.3g, the hi terms alone %.3g\n", sqrt(e_got / n), sqrt(e_hi / n));
        /* planted control of the comparison: one score of the reference moved by twice its bound */
        float *wrong = falloc(n);
        memcpy(wrong, ref, n * 4);
        wrong[n / 2] += (float)(2 * REL * mag[n / 2]);
        control("tensor-core indexer: one score off by twice its bound", gs, wrong, mag, n);
        free(wrong);
    }
    /* the switch reaches the indexer: the FMA kernel's scores of the same step differ from these
     * in rounding somewhere (their sums run in other orders) */
    {
        seq_state st[3];
        float *wf = NULL;
        dsv4_cuda_set_tensor_cores(0);
        float *of = attn_gpu(c, &in, all3, c->S, ip, st, &wf);
        dsv4_cuda_set_tensor_cores(1);
        int differ = 0;
        for (int s = 0; s < c->S; s++)
            for (int i = 0; i < c->n[s]; i++) {
                int r = row0[s] + i;
                int64_t nvis = (c->start[s] + i + 1) / c->ratio;
                differ += memcmp(wf + (size_t)r * V, work + (size_t)r * V, (size_t)nvis * 4) != 0;
            }
        CHECK(differ > 0, "%s: the scores are the FMA kernel's bit for bit (the tensor-core kernel did not run)", what);
        printf("  tensor cores on vs off: %d of %d rows' scores differ in rounding (the tensor-core kernel ran)\n", differ,
               R);
        state_free(st, c->S);
        free(of), free(wf);
    }
    /* a row alone == the row in the batch */
    int same = 1, runs = 0;
    for (int s = 0; s < c->S; s++) {
        int at[3] = {0, c->n[s] / 2, c->n[s] - 1};
        for (int k = 0; k < 3; k++) {
            int i = at[k], r = row0[s] + i;
            seq_state pre[1], one[1];
            seq_state *from = &init[s];
            if (i > 0) { /* the sequence's earlier rows as a step of their own */
                attn_case cp = *c;
                cp.S = 1, cp.start[0] = c->start[s], cp.n[0] = i;
                step_in ps = rows_of(c, &in, row0[s], i);
                int z = 0;
                float *op = attn_gpu(&cp, &ps, &z, 1, &from, pre, NULL);
                free(op);
                from = &pre[0];
            }
            attn_case c1 = *c;
            c1.S = 1, c1.start[0] = c->start[s] + i, c1.n[0] = 1;
            step_in s1 = rows_of(c, &in, r, 1);
            int z = 0;
            float *w1 = NULL, *o1 = attn_gpu(&c1, &s1, &z, 1, &from, one, &w1);
            int64_t nvis = (c->start[s] + i + 1) / c->ratio;
            same &= !memcmp(o1, o + (size_t)r * Hd, (size_t)Hd * 4);
            same &= !memcmp(w1, work + (size_t)r * V, (size_t)nvis * 4);
            runs++;
            state_free(one, 1);
            if (i > 0)
                state_free(pre, 1);
            free(o1), free(w1);
        }
    }
    CHECK(same, "%s: a row alone differs from the row in a batch of %d", what, R);
    printf("  %d rows alone == in the batch of %d (o and scores): %s\n", runs, R, same ? "bitwise equal" : "DIFFERENT");
    /* control: row rc's first head one element x whose split is 1 + 2^-9 + 2^-23 (hi, mid, lo),
     * against the same with no lo term: rc's scores must change, no other row's bits may */
    int rc = row0[c->S - 1] + c->n[c->S - 1] / 2;
    float *qh = in.qi + (size_t)rc * c->nI * c->ci;
    for (int h = 0; h < c->nI; h++)
        for (int j = 0; j < c->ci; j++)
            qh[(size_t)h * c->ci + j] = 0.0f;
    float *oc[2], *wc[2];
    for (int v = 0; v < 2; v++) {
        seq_state st[3];
        qh[0] = 1.0f + 0x1p-9f + (v ? 0x1p-23f : 0.0f);
        oc[v] = attn_gpu(c, &in, all3, c->S, ip, st, &wc[v]);
        state_free(st, c->S);
    }
    int64_t nc = (c->start[c->S - 1] + c->n[c->S - 1] / 2 + 1) / c->ratio;
    int changed = memcmp(wc[0] + (size_t)rc * V, wc[1] + (size_t)rc * V, (size_t)nc * 4) != 0, others = 1;
    for (int s = 0; s < c->S; s++)
        for (int i = 0; i < c->n[s]; i++) {
            int r = row0[s] + i;
            if (r == rc)
                continue;
            int64_t nvis = (c->start[s] + i + 1) / c->ratio;
            others &= !memcmp(wc[0] + (size_t)r * V, wc[1] + (size_t)r * V, (size_t)nvis * 4);
            others &= !memcmp(oc[0] + (size_t)r * Hd, oc[1] + (size_t)r * Hd, (size_t)Hd * 4);
        }
    CHECK(changed, "control %s: a changed lo term of one q element left its row's scores unchanged", what);
    CHECK(others, "%s: one row's q changed another row's bits", what);
    printf("  control %-48s %s; the other rows %s\n", "tensor-core indexer: one lo term changed", changed ? "caught" : "NOT CAUGHT",
           others ? "bitwise unchanged" : "CHANGED");
    CHECK(!gpu->check(&err), "%s: %s", what, err.msg);
    for (int v = 0; v < 2; v++)
        free(oc[v]), free(wc[v]);
    state_free(got, c->S);
    attn_inputs_free(c, &in, init);
    free(o), free(work), free(ref), free(rhi), free(gs), free(mag), free(mhi);
    dsv4_cuda_set_tensor_cores(was);
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
    printf("cuda ops on %s, seed %llu (DSV4_SEED to repeat), tensor cores %s (DSV4_CUDA_TC)\n", dsv4_cuda_device_name(),
           (unsigned long long)rng,
           dsv4_cuda_tensor_cores() == DSV4_CUDA_TC_ALL    ? "on"
           : dsv4_cuda_tensor_cores() == DSV4_CUDA_TC_ATTN ? "for the attention and indexer"
                                                           : "off");
    cpu = dsv4_backend_cpu();
    gpu = dsv4_backend_cuda();
    dsv4_cuda_set_poison(1);

    const lin_case lc[] = {
        {.form = DSV4_WF_FP8, .n = 256, .k = 512, .bn = 128, .bk = 128, .e8m0 = 1, .r1 = 256, .T = 9},
        /* several token blocks */
        {.form = DSV4_WF_FP8, .n = 256, .k = 2048, .bn = 128, .bk = 128, .e8m0 = 1, .r1 = 256, .T = 130},
        {.form = DSV4_WF_FP4, .n = 512, .k = 2048, .bn = 1, .bk = 32, .e8m0 = 1, .r1 = 512, .T = 70},
        {.form = DSV4_WF_BF16, .n = 130, .k = 1024, .r1 = 130, .T = 64},
        /* sub-range, strided in and out */
        {.form = DSV4_WF_FP8, .n = 200, .k = 320, .bn = 64, .bk = 64, .e8m0 = 1, .r0 = 37, .r1 = 173, .T = 3, .padx = 5, .pady = 3},
        /* k % 16 != 0: element path, f32 scales */
        {.form = DSV4_WF_FP8, .n = 70, .k = 100, .bn = 64, .bk = 64, .r1 = 70, .T = 5},
        /* f32 scales, long rows */
        {.form = DSV4_WF_FP8, .n = 96, .k = 2048, .bn = 128, .bk = 128, .r1 = 96, .T = 1},
        /* a run past k (tensor cores), tokens past 4 */
        {.form = DSV4_WF_FP8, .n = 96, .k = 96, .bn = 64, .bk = 64, .e8m0 = 1, .r1 = 96, .T = 9},
        {.form = DSV4_WF_BF16, .n = 50, .k = 40, .r1 = 50, .T = 7},         /* the same, BF16 */
        {.form = DSV4_WF_FP4, .n = 128, .k = 1024, .bn = 1, .bk = 32, .e8m0 = 1, .r1 = 128, .T = 9},
        /* k % 32 == 0, sub-range */
        {.form = DSV4_WF_FP4, .n = 64, .k = 96, .bn = 1, .bk = 32, .e8m0 = 1, .r0 = 3, .r1 = 60, .T = 2, .padx = 2, .pady = 1},
        /* bk 16: element path */
        {.form = DSV4_WF_FP4, .n = 40, .k = 80, .bn = 1, .bk = 16, .e8m0 = 1, .r1 = 40, .T = 3},
        /* V4.1's [32, 32] FP8 blocks (32-element tensor-core runs): few and many tokens, a sub-range */
        {.form = DSV4_WF_FP8, .n = 160, .k = 1024, .bn = 32, .bk = 32, .e8m0 = 1, .r1 = 160, .T = 9},
        {.form = DSV4_WF_FP8, .n = 96, .k = 2048, .bn = 32, .bk = 32, .e8m0 = 1, .r1 = 96, .T = 130},
        {.form = DSV4_WF_FP8, .n = 100, .k = 200, .bn = 32, .bk = 32, .e8m0 = 1, .r0 = 5, .r1 = 90, .T = 3, .padx = 2, .pady = 1},
        {.form = DSV4_WF_BF16, .n = 300, .k = 768, .r1 = 300, .T = 10},
        {.form = DSV4_WF_BF16, .n = 33, .k = 45, .r1 = 33, .T = 2, .padx = 1},         /* element path */
        {.form = DSV4_WF_F16, .n = 64, .k = 256, .r0 = 8, .r1 = 64, .T = 4, .pady = 2},
        {.form = DSV4_WF_F32, .n = 50, .k = 132, .r1 = 50, .T = 8, .padx = 4},
    };
    for (size_t i = 0; i < sizeof lc / sizeof lc[0]; i++)
        test_linear(&lc[i], i % 3 == 0 ? RESIDENT : i % 3 == 1 ? PINNED : UNPLACED);
    const lin_case ec[] = {
        {.form = DSV4_WF_BF16, .n = 1000, .k = 256},
        {.form = DSV4_WF_FP8, .n = 300, .k = 200, .bn = 128, .bk = 128, .e8m0 = 1},
        {.form = DSV4_WF_FP8, .n = 129, .k = 100, .bn = 64, .bk = 64},
        {.form = DSV4_WF_FP4, .n = 77, .k = 128, .bn = 1, .bk = 32, .e8m0 = 1},
        {.form = DSV4_WF_F16, .n = 50, .k = 70},
        {.form = DSV4_WF_F32, .n = 40, .k = 33},
    };
    for (size_t i = 0; i < sizeof ec / sizeof ec[0]; i++) {
        test_embed(&ec[i], 7, 4, i % 3 == 0 ? RESIDENT : i % 3 == 1 ? PINNED : UNPLACED);
        test_embed(&ec[i], 3, 1, UNPLACED);
    }
    const lin_case ic[] = {
        {.form = DSV4_WF_FP8, .n = 384, .k = 1024, .bn = 128, .bk = 128, .e8m0 = 1}, {.form = DSV4_WF_FP8,
         .n = 200, .k = 512, .bn = 64, .bk = 64},
        {.form = DSV4_WF_FP8, .n = 256, .k = 4096, .bn = 128, .bk = 128, .e8m0 = 1}, /* 16 k slices: a split launch */
        {.form = DSV4_WF_FP4, .n = 256, .k = 1024, .bn = 1, .bk = 32, .e8m0 = 1},    {.form = DSV4_WF_BF16,
         .n = 300, .k = 768},
        {.form = DSV4_WF_FP8, .n = 256, .k = 2048, .bn = 32, .bk = 32, .e8m0 = 1}, /* 32-element runs */
        {.form = DSV4_WF_FP8, .n = 70, .k = 100, .bn = 64, .bk = 64},     {.form = DSV4_WF_F16, .n = 64, .k = 256},
        {.form = DSV4_WF_FP8, .n = 96, .k = 96, .bn = 64, .bk = 64, .e8m0 = 1}, /* a run past k */
        {.form = DSV4_WF_F32, .n = 50, .k = 132},
        {.form = DSV4_WF_FP8, .n = 64, .k = 200, .bn = 32, .bk = 32, .e8m0 = 1},   /* a run past k */
    };
    for (size_t i = 0; i < sizeof ic / sizeof ic[0]; i++)
        test_invariance(&ic[i], i < 6 ? 4096 : 300, 0);
    for (size_t i = 0; i < 6; i++) {
        if (ic[i].form == DSV4_WF_FP8 || ic[i].form == DSV4_WF_FP4)
            test_invariance(&ic[i], 4096, 1);
        test_invariance(&ic[i], 4096, 2);
    }
    test_linear_group(DSV4_WF_FP4, 96, 512, 1, 32, 6, 1);
    test_linear_group(DSV4_WF_FP8, 128, 384, 128, 128, 3, 3);
    test_linear_group(DSV4_WF_FP4, 96, 512, 1, 32, 4, 150); /* the 64-token pass, three token blocks */
    test_linear_blocks(DSV4_WF_FP8, 8, 128, 512, 1);
    test_linear_blocks(DSV4_WF_FP8, 8, 128, 512, 5);
    test_linear_blocks(DSV4_WF_FP8, 8, 128, 512, 150);
    test_rmsnorm(5, 1000, 1, 0);
    test_rmsnorm(3, 4096, 0, 0);
    test_rmsnorm(4, 512, 1, 1);
    test_rope(4, 3, 64, 16, 8, 0);
    test_rope(3, 8, 128, 64, 0, 1);
    test_hc_pre(3, 4, 512, 1);
    test_hc_pre(2, 4, 700, 0);
    test_hc_pre(2, 2, 300, 1);
    test_hc_pre(2, 5, 300, 1);
    test_hc_pre(2, 3, 300, 1);
    test_hc_pre(2, 1, 300, 1);
    test_hc_pre(2, 4, 5000, 1); /* h normed past NB * RMS_V channels: a separate rmsnorm launch */
    test_hc_post(3, 4, 700);
    test_hc_collapse(5, 4, 700);
    test_attend(4, 96, 37, 50);
    test_attend(8, 512, 300, 400);
    test_attend(2, 64, 0, 1);
    test_swiglu(10001, 1.0f);
    test_swiglu(4096, 0.0f);
    CHECK(!gpu->check(&err), "a CUDA op failed: %s", err.msg);
    test_strides_and_aliasing();
    /* k 2048: FP8 e8m0 (2 warps a row), FP4 (2), FP8 f32 scales (4), BF16 (4), FP8 with bk 36
     * (element path), F32 (8), BF16 of 3 rows; k 100: all on the element path */
    const lin_case mc[] = {
        {.form = DSV4_WF_FP8, .n = 8192, .k = 2048, .bn = 128, .bk = 128, .e8m0 = 1,
         .r1 = 8192}, {.form = DSV4_WF_FP4, .n = 96, .k = 2048, .bn = 1, .bk = 32, .e8m0 = 1, .r1 = 96},
        {.form = DSV4_WF_FP8, .n = 200, .k = 2048, .bn = 128, .bk = 128,
         .r1 = 200},   {.form = DSV4_WF_BF16, .n = 300, .k = 2048, .r1 = 300},
        {.form = DSV4_WF_FP8, .n = 40, .k = 2048, .bn = 64, .bk = 36, .e8m0 = 1,
         .r1 = 40},       {.form = DSV4_WF_F32, .n = 50, .k = 2048, .r1 = 50},
        {.form = DSV4_WF_BF16, .n = 3, .k = 2048, .r1 = 3},
        {.form = DSV4_WF_FP8, .n = 128, .k = 2048, .bn = 32, .bk = 32, .e8m0 = 1, .r1 = 128},
    };
    const lin_case me[] = {
        {.form = DSV4_WF_FP8, .n = 70, .k = 100, .bn = 64, .bk = 64, .r1 = 70}, {.form = DSV4_WF_FP4,
         .n = 30, .k = 100, .bn = 1, .bk = 20, .e8m0 = 1, .r1 = 30},
        {.form = DSV4_WF_BF16, .n = 33, .k = 100, .r1 = 33}, {.form = DSV4_WF_F32, .n = 17, .k = 100, .r1 = 17},
    };
    /* T = 40: the tensor cores' 64-token pass */
    const int mT[] = {1, 5, 40};
    for (size_t i = 0; i < sizeof mT / sizeof mT[0]; i++) {
        test_linear_multi(mc, sizeof mc / sizeof mc[0], mT[i]);
        test_linear_multi(me, sizeof me / sizeof me[0], mT[i]);
    }
    test_route(9, 64, 6, 1, 1, 0);
    test_route(9, 64, 6, 1, 0, 0);
    test_route(33, 256, 8, 0, 1, 0);
    test_route(5, 64, 6, 0, 0, 1);
    test_experts(DSV4_WF_FP4, 0, 5, 8, 3, 256, 128, 0, 0.0f);
    test_experts(DSV4_WF_FP4, 0, 40, 8, 3, 256, 128, 1, 1.5f);
    /* 144 pairs over 8 experts: the tensor cores' 64-pair tiles (at least 16 pairs an expert) */
    test_experts(DSV4_WF_FP4, 0, 48, 8, 3, 256, 128, 0, 0.0f);
    /* 600 pairs over 4 experts: two full 64-pair tiles and a partial one an expert (its live
     * n-tiles alone), several row blocks a tile (I = 384: 3, D = 256: 2) */
    test_experts(DSV4_WF_FP4, 0, 200, 4, 3, 256, 384, 0, 0.0f);
    test_experts(DSV4_WF_FP8, 128, 30, 6, 4, 256, 384, 0, 0.0f);
    test_experts(DSV4_WF_FP8, 32, 30, 6, 4, 256, 384, 0, 0.0f);
    const attn_case ac[] = {
        {.S = 3, .start = {70, 130, 6}, .n = {5, 20, 3}, .H = 4, .d = 64, .rd = 16, .W = 8, .ratio = 4,
         .csa = 1, .ci = 32, .nI = 4, .topk = 5, .kv_cap = 16, .c_cap = 8, .vis_cap = 48, .ties = 1},
        {.S = 3, .start = {600, 37, 250}, .n = {4, 6, 9}, .H = 8, .d = 128, .rd = 64, .W = 16, .ratio = 4,
         .csa = 1, .ci = 64, .nI = 8, .topk = 16, .kv_cap = 32, .c_cap = 12, .vis_cap = 200},
        {.S = 3, .start = {100, 7, 250}, .n = {9, 10, 4}, .H = 4, .d = 64, .rd = 16, .W = 8, .ratio = 8,
         .kv_cap = 8, .c_cap = 8, .vis_cap = 40},
        {.S = 2, .start = {3, 50, 0}, .n = {6, 12, 0}, .H = 2, .d = 64, .rd = 16, .W = 8, .kv_cap = 8, .c_cap = 8},
        /* V4-sized: d 512, 64 indexer heads of 128, topk 512 over ~4000 entries (ties); HCA m 128
         * over ~15600 entries (the attention's key array past 48 KB of shared memory) */
        {.S = 2, .start = {9000, 15999, 0}, .n = {3, 2, 0}, .H = 8, .d = 512, .rd = 64, .W = 128,
         .ratio = 4, .csa = 1, .ci = 128, .nI = 64, .topk = 512, .kv_cap = 256, .c_cap = 8, .vis_cap = 4096, .ties = 1},
        {.S = 2, .start = {1998975, 262143, 0}, .n = {2, 2, 0}, .H = 4, .d = 512, .rd = 64, .W = 128,
         .ratio = 128, .kv_cap = 256, .c_cap = 128, .vis_cap = 16384},
        /* V4's 64 heads over 40 rows, a sequence of 30 alone and both together (with the tensor
         * cores on: a block per key chunk, and a block per row, the same bits) */
        {.S = 2, .start = {2100, 700, 0}, .n = {30, 10, 0}, .H = 64, .d = 512, .rd = 64, .W = 128,
         .ratio = 4, .csa = 1, .ci = 128, .nI = 64, .topk = 512, .kv_cap = 256, .c_cap = 8, .vis_cap = 1024},
    };
    for (size_t i = 0; i < sizeof ac / sizeof ac[0]; i++)
        test_attn_step(&ac[i]);
    /* the indexer on the tensor cores whatever DSV4_CUDA_TC says: V4's 64 heads of 128 over 60
     * rows whose entries end inside a 64-entry chunk; 72 heads of 48 (two groups of head tiles,
     * the last padded, three k-steps) with ties */
    const attn_case tc[] = {
        {.S = 3, .start = {600, 877, 301}, .n = {24, 20, 16}, .H = 4, .d = 64, .rd = 16, .W = 8, .ratio = 4,
         .csa = 1, .ci = 128, .nI = 64, .topk = 32, .kv_cap = 32, .c_cap = 8, .vis_cap = 240},
        {.S = 2, .start = {280, 505, 0}, .n = {12, 10, 0}, .H = 2, .d = 64, .rd = 16, .W = 8, .ratio = 4,
         .csa = 1, .ci = 48, .nI = 72, .topk = 20, .kv_cap = 16, .c_cap = 8, .vis_cap = 136, .ties = 1},
    };
    for (size_t i = 0; i < sizeof tc / sizeof tc[0]; i++)
        test_attn_step_tc(&tc[i]);
    test_graph();
    CHECK(!gpu->check(&err), "a CUDA op failed: %s", err.msg);
    return check_summary("cuda ops");
}
