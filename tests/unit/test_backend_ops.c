/* Every op of the backend table (kernels/backend.h) on every backend the build has, in the
 * manner of ggml's test-backend-ops. On the CPU each op is checked against a reference written
 * here in double precision from the math backend.h states; every other backend (CUDA, when the
 * build has it and a device answers) runs the same cases over its own memory and is checked
 * against the CPU's result. The random inputs come from a fixed seed (DSV4_SEED=n for others).
 *
 * Tolerances are bounds derived per op (stated at each test) in units of u = 2^-24, the fp32
 * rounding unit, with gamma(n) = n u / (1 - n u), the bound on n rounding errors in a row: a
 * sum of n terms in any order and grouping is within gamma(n - 1) sum|terms| of the exact sum.
 * Library functions (expf, sinf, ...) are taken as within 2 ulp (2 u relative per ulp). A
 * comparison passes when |got - ref| <= bound everywhere and nothing is NaN; another backend
 * against the CPU gets twice the bound (each is within one bound of the exact value).
 *
 * For every op: outputs are poisoned first (NaN in the output buffer, so an element an op does
 * not write fails); a planted control (a deliberately wrong reference: one index off, a scale
 * skipped, a limit skipped) must fail the same comparison; and where the op has rows, each row
 * computed alone equals the same row in the batch, bit for bit (backend.h's row contract).
 *
 * Not here: linear over EXL3 weights (test_exl3 and suite_exl3.sh, against the dense decode and
 * the EXL3 reference's vectors; tests/cuda/test_cuda_exl3.c, CUDA against the CPU) and the
 * experts op's V4.1 REF numerics (test_v41_fixtures, on each backend). hc_pre's Sinkhorn runs 1 to 3
 * rounds here: the bound derived for it doubles with each half-step. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "core/core.h"
#include "io/weight.h"
#include "kernels/backend.h"
#include "kernels/kv_format.h"
#ifdef DSV4_CUDA
#include "kernels/cuda/cuda.h"
#endif
#include "test_rng.h"
#include "op_check.h"

static const double U = 0x1p-24;
static double gam(double n) { return n * U / (1.0 - n * U); }
/* another backend against the CPU: both within one bound of the exact value */
static const double OTHER = 2.0;

/* A backend under test; weights go to it through put_weight where it needs them there. */
typedef struct {
    const dsv4_backend *be;
    int (*put_weight)(const dsv4_weight *w, dsv4_err *err);
    void (*drop_weight)(const dsv4_weight *w);
} target;

static target cpu_t, others[4];
static int n_others;
static const dsv4_backend *cpu;

/* ---- buffers in a backend's memory --------------------------------------------------------- */

static void *bput(const dsv4_backend *be, const void *host, size_t bytes)
{
    void *d = be->alloc(bytes ? bytes : 4);
    CHECK(d != NULL, "%s: alloc of %zu bytes failed", be->name, bytes);
    if (d && host && bytes)
        be->upload(d, host, bytes);
    return d;
}

/* A backend buffer of n floats, NaN-filled (an output). */
static float *bpoison(const dsv4_backend *be, size_t n)
{
    float *h = falloc(n);
    poison(h, n);
    float *d = bput(be, h, n * sizeof(float));
    free(h);
    return d;
}

/* The host copy of a backend buffer (malloc'd). */
static void *bget(const dsv4_backend *be, const void *d, size_t bytes)
{
    void *h = malloc(bytes ? bytes : 4);
    be->download(h, d, bytes);
    return h;
}

/* After a backend's ops: no failure kept (backends whose ops cannot fail have no check). */
static void bok(const dsv4_backend *be, const char *what)
{
    dsv4_err err = {0};
    if (be->check)
        CHECK(!be->check(&err), "%s on %s: %s", what, be->name, err.msg);
}

static void put_weights(const target *t, const dsv4_weight *w, int n)
{
    dsv4_err err = {0};
    for (int i = 0; t->put_weight && i < n; i++)
        CHECK(!t->put_weight(&w[i], &err), "%s: put weight: %s", t->be->name, err.msg);
}

static void drop_weights(const target *t, const dsv4_weight *w, int n)
{
    for (int i = 0; t->drop_weight && i < n; i++)
        t->drop_weight(&w[i]);
}

static void free_weight(dsv4_weight *w)
{
    free((void *)w->data);
    free((void *)w->scale);
}

/* Rows of `width` floats alone against the same rows of a batch, bitwise. */
static int rows_equal(const float *a, const float *b, size_t n) { return !memcmp(a, b, n * sizeof(float)); }

static void report_rows(const char *what, const char *be, int same, int rows)
{
    CHECK(same, "%s on %s: a row alone differs from the same row in the batch", what, be);
    printf("  %-52s %s: %d rows alone == in the batch: %s\n", what, be, rows, same ? "bitwise" : "DIFFERENT");
}

/* ---- the stored forms, decoded here in double ---------------------------------------------- */

static double e4m3_d(uint8_t c)
{
    int e = (c >> 3) & 15, m = c & 7;
    double v = e ? ldexp(8 + m, e - 10) : ldexp(m, -9);
    return c & 0x80 ? -v : v;
}

static double e2m1_d(uint8_t c)
{
    static const double v[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    return c & 8 ? -v[c & 7] : v[c & 7];
}

static double bf16_d(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static double f16_d(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
    return h & 0x8000 ? -v : v;
}

static double scale_d(const dsv4_weight *w, size_t i)
{
    if (w->scale_e8m0)
        return ldexp(1.0, ((const uint8_t *)w->scale)[i] - 127);
    return ((const float *)w->scale)[i];
}

/* W[r, j] as stored: the code times its block's scale, exact in double. */
static double w_at(const dsv4_weight *w, int64_t r, int64_t j)
{
    int64_t k = w->k;
    switch (w->form) {
    case DSV4_WF_F32:
        return ((const float *)w->data)[r * k + j];
    case DSV4_WF_BF16:
        return bf16_d(((const uint16_t *)w->data)[r * k + j]);
    case DSV4_WF_F16:
        return f16_d(((const uint16_t *)w->data)[r * k + j]);
    case DSV4_WF_FP8:
        return e4m3_d(((const uint8_t *)w->data)[r * k + j]) *
               scale_d(w, (size_t)(r / w->bn) * ((k + w->bk - 1) / w->bk) + j / w->bk);
    case DSV4_WF_FP4: {
        uint8_t b = ((const uint8_t *)w->data)[(r * k + j) / 2];
        return e2m1_d(j & 1 ? b >> 4 : b & 15) * scale_d(w, (size_t)r * (k / w->bk) + j / w->bk);
    }
    default:
        return NAN;
    }
}

/* The whole weight decoded, [n, k] doubles. */
static double *w_dense(const dsv4_weight *w)
{
    double *d = malloc((size_t)w->n * w->k * sizeof(double));
    for (int64_t r = 0; r < w->n; r++)
        for (int64_t j = 0; j < w->k; j++)
            d[r * w->k + j] = w_at(w, r, j);
    return d;
}

/* y[t, i] = sum_j W[r0 + i, j] x[t, j] in double, with the bound on an fp32 computation of it:
 * k products and k - 1 additions in any grouping, one product by a block's factor, one by
 * FP4's folded f32 scale, the rounding of the reference to fp32 (k + 3 roundings a term; we
 * take gamma(k + 4)) times sum_j |W x|. */
static void linear_ref(const double *W, int64_t k, int64_t r0, int64_t nr, const float *x, int T, int64_t ldx,
                       float *ref, double *tol)
{
    for (int t = 0; t < T; t++)
        for (int64_t i = 0; i < nr; i++) {
            const double *wr = W + (r0 + i) * k;
            const float *xr = x + (size_t)t * ldx;
            double s = 0, m = 0;
            for (int64_t j = 0; j < k; j++) {
                s += wr[j] * xr[j];
                m += fabs(wr[j] * xr[j]);
            }
            ref[(size_t)t * nr + i] = (float)s;
            tol[(size_t)t * nr + i] = gam((double)k + 4) * m;
        }
}

/* Two neighbouring x values of row t swapped (one index off), choosing a pair that differs. */
static void swap_pair(float *x, int64_t n)
{
    int64_t j = rnd() % (n - 1);
    for (int64_t tries = 0; tries < n && fabsf(x[j] - x[j + 1]) < 0.25f; tries++)
        j = (j + 1) % (n - 1);
    float t = x[j];
    x[j] = x[j + 1];
    x[j + 1] = t;
}

/* ---- memory: alloc, free, upload, download, copy --------------------------------------------- */

/* alloc gives zeroed memory; upload, copy (between two buffers: backend.h leaves overlapping
 * copies unstated) and download move bytes exactly. Control: the last download went into a
 * poisoned host buffer, so had it written nothing the comparison would have failed. */
static void test_memory(const target *t)
{
    const dsv4_backend *be = t->be;
    size_t n = 10007;
    uint8_t *h = malloc(n), *back = malloc(n), *z = calloc(1, n);
    for (size_t i = 0; i < n; i++)
        h[i] = (uint8_t)rnd();
    uint8_t *a = be->alloc(n), *b = be->alloc(n);
    CHECK(a && b, "%s: alloc failed", be->name);
    if (!a || !b)
        return;
    memset(back, 0xa5, n);
    be->download(back, a, n);
    int zeroed = !memcmp(back, z, n);
    be->upload(a, h, n);
    be->copy(b, a, n);
    memset(back, 0xa5, n);
    be->download(back, b, n);
    int moved = !memcmp(back, h, n);
    bok(be, "memory");
    /* copy2d: 50 rows of 30 bytes from a + 5 at pitch 97 to a zeroed buffer at pitch 113 */
    uint8_t *c2 = be->alloc(n), *want = calloc(1, n), *got = malloc(n);
    CHECK(c2 != NULL, "%s: alloc failed", be->name);
    for (size_t r = 0; r < 50; r++)
        memcpy(want + r * 113, h + 5 + r * 97, 30);
    int strided = 0;
    if (c2) {
        be->copy2d(c2, 113, a + 5, 97, 30, 50);
        be->download(got, c2, n);
        strided = !memcmp(got, want, n);
        be->free(c2);
    }
    bok(be, "memory");
    CHECK(zeroed, "%s: alloc did not give zeroed memory", be->name);
    CHECK(moved, "%s: upload, copy, download changed bytes", be->name);
    CHECK(strided, "%s: copy2d moved other bytes than its rows", be->name);
    free(want), free(got);
    memset(z, 0xa5, n);
    int caught = memcmp(z, h, n) != 0; /* control: the poison itself fails the comparison */
    CHECK(caught, "%s: control: the poisoned host buffer matched the bytes", be->name);
    printf("  memory on %-42s zeroed %s, bytes moved %s, strided rows %s\n", be->name, zeroed ? "yes" : "NO",
           moved ? "exactly" : "CHANGED", strided ? "exactly" : "WRONG");
    be->free(a);
    be->free(b);
    free(h), free(back), free(z);
}

/* ---- linear ---------------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    dsv4_wform form;
    int64_t n, k;
    int bn, bk, e8m0;
    int64_t r0, r1; /* rows [r0, r1) of W; r1 0: every row */
    int T, padx, pady;
} lin_case;

static const float PAD = 12345.0f;

/* The op on backend t over its own buffers: y [T, ldy] with the columns past r1 - r0 marked
 * PAD (they must stay), the rest poisoned. */
static float *run_linear(const target *t, const dsv4_weight *w, int64_t r0, int64_t r1, const float *x, int T,
                         int64_t ldx, int64_t ldy)
{
    const dsv4_backend *be = t->be;
    int64_t nr = r1 - r0;
    size_t ny = (size_t)T * ldy;
    float *hy = falloc(ny);
    for (size_t i = 0; i < ny; i++)
        hy[i] = PAD;
    for (int r = 0; r < T; r++)
        poison(hy + (size_t)r * ldy, nr);
    float *dx = bput(be, x, (size_t)T * ldx * sizeof(float)), *dy = bput(be, hy, ny * sizeof(float));
    be->linear(w, r0, r1, dx, T, ldx, dy, ldy);
    be->download(hy, dy, ny * sizeof(float));
    bok(be, "linear");
    be->free(dx), be->free(dy);
    return hy;
}

/* [T, ldy] -> [T, nr], checking the pad columns kept their mark. */
static float *dense_rows(const float *y, int T, int64_t nr, int64_t ldy, int *pad_ok)
{
    float *d = falloc((size_t)T * nr);
    for (int t = 0; t < T; t++) {
        memcpy(d + (size_t)t * nr, y + (size_t)t * ldy, nr * sizeof(float));
        for (int64_t i = nr; i < ldy; i++)
            *pad_ok &= y[(size_t)t * ldy + i] == PAD;
    }
    return d;
}

/* Tolerance: gamma(k + 4) sum_j |W x| (linear_ref). Controls: x one index off in the last row;
 * a scaled form read with one scale block skipped. Rows: each alone (T = 1, the CPU's fused
 * single-row path) against the batch. */
static void test_linear(const lin_case *c)
{
    dsv4_weight w;
    make_weight(c->form, c->n, c->k, c->bn, c->bk, c->e8m0, &w);
    int64_t k = c->k, r0 = c->r0, r1 = c->r1 ? c->r1 : c->n, nr = r1 - r0, ldx = k + c->padx, ldy = nr + c->pady;
    int T = c->T;
    size_t ny = (size_t)T * nr;
    float *x = falloc((size_t)T * ldx), *ref = falloc(ny), *bad = falloc(ny);
    double *tol = malloc(ny * sizeof(double)), *W = w_dense(&w);
    fill(x, (size_t)T * ldx, -1, 1);
    linear_ref(W, k, r0, nr, x, T, ldx, ref, tol);
    float *xs = falloc((size_t)T * ldx);
    memcpy(xs, x, (size_t)T * ldx * sizeof(float));
    swap_pair(xs + (size_t)(T - 1) * ldx, k);
    double *scr = malloc(ny * sizeof(double));
    linear_ref(W, k, r0, nr, xs, T, ldx, bad, scr);
    dsv4_weight ws = w;
    if (w.scale)
        ws.scale = scale_skipped(&w, r0);
    float *cpu_y = NULL;
    char what[160];
    for (int o = -1; o < n_others; o++) {
        const target *t = o < 0 ? &cpu_t : &others[o];
        const char *bn = t->be->name;
        put_weights(t, &w, 1);
        int pad_ok = 1;
        float *yy = run_linear(t, &w, r0, r1, x, T, ldx, ldy), *y = dense_rows(yy, T, nr, ldy, &pad_ok);
        snprintf(what, sizeof what, "%s on %s", c->name, bn);
        CHECK(pad_ok, "%s: wrote outside its output columns", what);
        if (o < 0) {
            CHECK(agree_within(what, y, ref, tol, ny, 1.0, 0), "%s: differs from the double reference", what);
            snprintf(what, sizeof what, "%s: x index off", c->name);
            control_within(what, y, bad, tol, ny, 1.0);
        } else {
            CHECK(agree_within(what, y, cpu_y, tol, ny, OTHER, 0), "%s: differs from the CPU", what);
            float *cb = run_linear(&cpu_t, &w, r0, r1, xs, T, ldx, ldy), *cbd = dense_rows(cb, T, nr, ldy, &pad_ok);
            snprintf(what, sizeof what, "%s on %s: x index off", c->name, bn);
            control_within(what, y, cbd, tol, ny, OTHER);
            free(cb), free(cbd);
        }
        int same = 1;
        for (int r = 0; r < T; r++) {
            float *one = run_linear(t, &w, r0, r1, x + (size_t)r * ldx, 1, ldx, ldy);
            same &= rows_equal(one, y + (size_t)r * nr, nr);
            free(one);
        }
        report_rows(c->name, bn, same, T);
        drop_weights(t, &w, 1);
        /* the op given a weight whose scale block over row r0 is skipped, after w is dropped (a
         * backend that keeps weights finds their data and scales by address) */
        if (w.scale) {
            put_weights(t, &ws, 1);
            float *sy = run_linear(t, &ws, r0, r1, x, T, ldx, ldy), *syd = dense_rows(sy, T, nr, ldy, &pad_ok);
            snprintf(what, sizeof what, "%s on %s: scale skipped", c->name, bn);
            control_within(what, syd, o < 0 ? ref : cpu_y, tol, ny, o < 0 ? 1.0 : OTHER);
            drop_weights(t, &ws, 1);
            free(sy), free(syd);
        }
        free(yy);
        if (o < 0)
            cpu_y = y;
        else
            free(y);
    }
    if (w.scale)
        free((void *)ws.scale);
    free_weight(&w);
    free(x), free(ref), free(bad), free(tol), free(W), free(xs), free(scr), free(cpu_y);
}

/* ---- REF's roundings: round_bf16, roundtrip, linear_q ------------------------------------- */

/* The references search the codes' values for the nearest (ties to the even code), in double,
 * rather than follow the CPU's formulas: round_bf16 between the two bf16 neighbours of x;
 * e4m3 over its 127 non-negative finite values (saturating at 448); e2m1 over its 8. */
static double near_bf16(float x)
{
    uint32_t b;
    memcpy(&b, &x, 4);
    uint32_t lo = b & 0xffff0000u, hi = lo + 0x10000u;
    float fl, fh;
    memcpy(&fl, &lo, 4);
    memcpy(&fh, &hi, 4);
    double dl = fabs((double)x - fl), dh = fabs((double)fh - x);
    return dl < dh || (dl == dh && !(lo & 0x10000u)) ? fl : fh;
}

static double near_code(double a, const double *vals, int n) /* a >= 0; vals ascending, code = index */
{
    int best = 0;
    for (int c = 1; c < n; c++) {
        double d = fabs(vals[c] - a), db = fabs(vals[best] - a);
        if (d < db || (d == db && !(c & 1)))
            best = c;
    }
    return vals[best];
}

static double e4m3_vals[127], e2m1_vals[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

static double near_e4m3(double v)
{
    double a = fabs(v) > 448 ? 448 : fabs(v);
    double r = near_code(a, e4m3_vals, 127);
    return signbit(v) ? -r : r;
}

static double near_e2m1(double v)
{
    double a = fabs(v) > 6 ? 6 : fabs(v);
    double r = near_code(a, e2m1_vals, 8);
    return signbit(v) ? -r : r;
}

static double pow2_at_least(double t) { return exp2(ceil(log2(t))); }

/* The round trip's reference over [n] (blocks of `block`); shift != 0 plants a scale one
 * power of two off (the control). */
static void roundtrip_ref(const float *x, int64_t n, int block, int code, int shift, float *ref)
{
    for (int64_t b0 = 0; b0 < n; b0 += block) {
        int64_t e = b0 + block < n ? b0 + block : n;
        double amax = code == DSV4_RT_FP8 ? 1e-4f : 0;
        for (int64_t i = b0; i < e; i++)
            amax = fmax(amax, fabs(x[i]));
        double s = code == DSV4_RT_FP8    ? pow2_at_least((float)(amax * (1.0f / 448.0f)))
                   : code == DSV4_RT_FP4 ? pow2_at_least((float)(fmax(amax, 6 * 0x1p-126) * (1.0f / 6.0f)))
                                         : near_e4m3((float)(fmax(amax, 6 * 0x1p-9) / 6.0f));
        s = ldexp(s, shift);
        for (int64_t i = b0; i < e; i++) {
            double q = (double)(x[i] / (float)s);
            ref[i] = (float)((code == DSV4_RT_FP8 ? near_e4m3(q) : near_e2m1(q)) * s);
        }
    }
}

/* Values of every magnitude the roundings meet: random in [-1, 1] scaled by 2^[-30, 12], zeros
 * of both signs, bf16 midpoints (ties), and a block of tiny values. */
static float *rounding_input(int64_t n)
{
    float *x = falloc((size_t)n);
    for (int64_t i = 0; i < n; i++) {
        x[i] = ldexpf(frand(-1, 1), (int)(rnd() % 43) - 30);
        if (i % 17 == 3) { /* a bf16 tie: the half-way bit set, nothing below it */
            uint32_t b;
            memcpy(&b, &x[i], 4);
            b = (b & 0xffff0000u) | 0x8000u;
            memcpy(&x[i], &b, 4);
        }
    }
    x[0] = 0.0f, x[1] = -0.0f;
    for (int64_t i = 64; i < 96 && i < n; i++)
        x[i] = ldexpf(frand(-1, 1), -20);
    return x;
}

static float *run_inplace(const target *t, int op, const float *x, int64_t n, int block, int code)
{
    const dsv4_backend *be = t->be;
    float *d = bput(be, x, (size_t)n * sizeof(float)), *h = falloc((size_t)n);
    if (op == 0)
        be->round_bf16(d, n);
    else
        be->roundtrip(d, n, block, code);
    be->download(h, d, (size_t)n * sizeof(float));
    bok(be, op ? "roundtrip" : "round_bf16");
    be->free(d);
    return h;
}

/* Exact ops: the CPU equals the reference bit for bit, and every other backend the CPU (their
 * formulas are the same sequence of correctly rounded steps). Controls: the scale one power of
 * two off; bf16 ties sent away from even. */
static void test_rounding(void)
{
    for (int c = 0; c < 127; c++)
        e4m3_vals[c] = (c >> 3) == 0 ? (c & 7) / 512.0 : (1 + (c & 7) / 8.0) * ldexp(1, (c >> 3) - 7);
    const int64_t n = 1000; /* not a multiple of 16 or 32: the last block is short */
    float *x = rounding_input(n), *ref = falloc(n), *bad = falloc(n);
    static const struct { const char *name; int op, block, code; } cases[] = {
        {"round_bf16", 0, 0, 0},
        {"roundtrip fp8 e4m3, ue8m0 per 32", 1, 32, DSV4_RT_FP8},
        {"roundtrip fp4 e2m1, ue8m0 per 32", 1, 32, DSV4_RT_FP4},
        {"roundtrip fp4 e2m1, e4m3 scale per 16", 1, 16, DSV4_RT_FP4_E4M3},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        if (cases[k].op == 0) {
            for (int64_t i = 0; i < n; i++) {
                ref[i] = (float)near_bf16(x[i]);
                uint32_t b;
                memcpy(&b, &x[i], 4);
                bad[i] = (b & 0xffffu) == 0x8000u ? (float)near_bf16(nextafterf(x[i], 2 * x[i])) : ref[i];
            }
        } else {
            roundtrip_ref(x, n, cases[k].block, cases[k].code, 0, ref);
            roundtrip_ref(x, n, cases[k].block, cases[k].code, 1, bad);
        }
        float *cpu_y = run_inplace(&cpu_t, cases[k].op, x, n, cases[k].block, cases[k].code);
        int same = !memcmp(cpu_y, ref, (size_t)n * sizeof(float)), caught = memcmp(cpu_y, bad, (size_t)n * sizeof(float)) != 0;
        CHECK(same, "%s on cpu: differs from the reference", cases[k].name);
        CHECK(caught, "control %s: the wrong reference matched", cases[k].name);
        printf("  %-52s cpu == reference bitwise %s; control %s\n", cases[k].name, same ? "ok" : "FAIL",
               caught ? "caught" : "NOT CAUGHT");
        for (int o = 0; o < n_others; o++) {
            float *y = run_inplace(&others[o], cases[k].op, x, n, cases[k].block, cases[k].code);
            int eq = !memcmp(y, cpu_y, (size_t)n * sizeof(float));
            CHECK(eq, "%s on %s: differs from the CPU", cases[k].name, others[o].be->name);
            printf("  %-52s %s == cpu bitwise %s\n", cases[k].name, others[o].be->name, eq ? "ok" : "FAIL");
            free(y);
        }
        free(cpu_y);
    }
    free(x), free(ref), free(bad);
}

static float *run_linear_q(const target *t, const dsv4_weight *w, const float *x, int T, int64_t ldx)
{
    const dsv4_backend *be = t->be;
    size_t ny = (size_t)T * w->n;
    float *hy = falloc(ny);
    poison(hy, ny);
    float *dx = bput(be, x, (size_t)T * ldx * sizeof(float)), *dy = bput(be, hy, ny * sizeof(float));
    float *keep = falloc((size_t)T * ldx);
    be->linear_q(w, 0, w->n, dx, T, ldx, dy, w->n);
    be->download(hy, dy, ny * sizeof(float));
    be->download(keep, dx, (size_t)T * ldx * sizeof(float));
    bok(be, "linear_q");
    CHECK(!memcmp(keep, x, (size_t)T * ldx * sizeof(float)), "linear_q on %s changed its input", be->name);
    be->free(dx), be->free(dy);
    free(keep);
    return hy;
}

/* linear_q against linear_ref of x's rows through the fp8 round trip's reference in blocks of
 * dsv4_act_block (the FP8 weight's column block, 32 for FP4), at linear's
 * tolerance (gamma(k + 4) sum |W x'|). Control: the unquantized x. Rows: each alone. And on each
 * backend, linear_q(x) == linear(x') bit for bit (x' the reference's quantized x, which the
 * roundtrip cases show every backend makes bit for bit): a backend may take x' as bf16 values
 * (the tensor cores' one term), never other arithmetic; control: x' with one value moved by
 * 2^-6 of itself. */
static void test_linear_q(const lin_case *c)
{
    dsv4_weight w;
    make_weight(c->form, c->n, c->k, c->bn, c->bk, c->e8m0, &w);
    int64_t k = c->k, n = c->n, ldx = k + c->padx;
    int T = c->T;
    size_t ny = (size_t)T * n;
    float *x = falloc((size_t)T * ldx), *xq = falloc((size_t)T * k), *ref = falloc(ny), *bad = falloc(ny);
    double *tol = malloc(ny * sizeof(double)), *tb = malloc(ny * sizeof(double)), *W = w_dense(&w);
    fill(x, (size_t)T * ldx, -1, 1);
    for (int t = 0; t < T; t++) /* every other 32 channels 2^-12 smaller: in a block of 64 or 128
                                 * they fall to e4m3's subnormal grid, in their own block of 32
                                 * they do not (power-of-two scales alone change no rounding) */
        for (int64_t c = 0; c < k; c++)
            x[(size_t)t * ldx + c] = ldexpf(x[(size_t)t * ldx + c], -12 * (int)((c / 32) % 2));
    for (int t = 0; t < T; t++)
        roundtrip_ref(x + (size_t)t * ldx, k, dsv4_act_block(&w), DSV4_RT_FP8, 0, xq + (size_t)t * k);
    linear_ref(W, k, 0, n, xq, T, k, ref, tol);
    linear_ref(W, k, 0, n, x, T, ldx, bad, tb);
    float *cpu_y = NULL;
    char what[160];
    for (int o = -1; o < n_others; o++) {
        const target *t = o < 0 ? &cpu_t : &others[o];
        put_weights(t, &w, 1);
        float *y = run_linear_q(t, &w, x, T, ldx);
        snprintf(what, sizeof what, "%s on %s", c->name, t->be->name);
        CHECK(agree_within(what, y, o < 0 ? ref : cpu_y, tol, ny, o < 0 ? 1.0 : OTHER, 0), "%s: differs from %s", what,
              o < 0 ? "the double reference" : "the CPU");
        snprintf(what, sizeof what, "%s on %s: x unquantized", c->name, t->be->name);
        control_within(what, y, bad, tol, ny, o < 0 ? 1.0 : OTHER);
        int same = 1;
        for (int r = 0; r < T; r++) {
            float *one = run_linear_q(t, &w, x + (size_t)r * ldx, 1, ldx);
            same &= rows_equal(one, y + (size_t)r * n, n);
            free(one);
        }
        report_rows(c->name, t->be->name, same, T);
        snprintf(what, sizeof what, "%s on %s", c->name, t->be->name);
        float *yl = run_linear(t, &w, 0, n, xq, T, k, n);
        int eq = rows_equal(yl, y, ny);
        CHECK(eq, "%s: differs from linear over the quantized x", what);
        float keepv = xq[k / 2];
        xq[k / 2] = keepv * (1.0f + 0x1p-6f) + 0x1p-10f;
        float *yb = run_linear(t, &w, 0, n, xq, T, k, n);
        xq[k / 2] = keepv;
        int caught = !rows_equal(yb, y, ny);
        CHECK(caught, "%s: control (a quantized value moved by 2^-6 of itself) not caught", what);
        printf("  %-52s == linear(x') bitwise %s; control %s\n", what, eq ? "ok" : "FAIL", caught ? "caught" : "NOT CAUGHT");
        if (dsv4_act_block(&w) != 32) { /* control: x' quantized in blocks of 32, not the weight's */
            float *x32 = falloc((size_t)T * k);
            for (int r = 0; r < T; r++)
                roundtrip_ref(x + (size_t)r * ldx, k, 32, DSV4_RT_FP8, 0, x32 + (size_t)r * k);
            float *y32 = run_linear(t, &w, 0, n, x32, T, k, n);
            int c32 = !rows_equal(y32, y, ny);
            CHECK(c32, "%s: control (x quantized in blocks of 32) not caught", what);
            printf("  %-52s control (blocks of 32 instead of %d) %s\n", what, dsv4_act_block(&w),
                   c32 ? "caught" : "NOT CAUGHT");
            free(x32), free(y32);
        }
        free(yl), free(yb);
        drop_weights(t, &w, 1);
        if (o < 0)
            cpu_y = y;
        else
            free(y);
    }
    free_weight(&w);
    free(x), free(xq), free(ref), free(bad), free(tol), free(tb), free(W), free(cpu_y);
}

/* linear_rb on each backend that has it, against the same backend's linear (quant 0) or linear_q
 * (quant 1) followed by its round_bf16, bit for bit: rows [r0, r1) of W into y with row stride
 * ldy (the pad columns keep their mark). Control: the product unrounded differs somewhere.
 * Rows: each alone gives the same bits. */
static void test_linear_rb(const lin_case *c)
{
    dsv4_weight w;
    make_weight(c->form, c->n, c->k, c->bn, c->bk, c->e8m0, &w);
    int64_t k = c->k, ldx = k + c->padx, r0 = c->r0, r1 = c->r1 ? c->r1 : c->n, nr = r1 - r0, ldy = nr + c->pady;
    int T = c->T;
    float *x = falloc((size_t)T * ldx);
    fill(x, (size_t)T * ldx, -1, 1);
    for (int o = 0; o < n_others; o++) {
        const target *t = &others[o];
        const dsv4_backend *be = t->be;
        if (!be->linear_rb)
            continue;
        put_weights(t, &w, 1);
        for (int quant = 0; quant < 2; quant++) {
            if (quant && c->form != DSV4_WF_FP8 && c->form != DSV4_WF_FP4)
                continue;
            size_t ny = (size_t)T * ldy;
            float *hy = falloc(ny), *h2 = falloc(ny), *hone = falloc((size_t)ldy);
            for (size_t i = 0; i < ny; i++)
                hy[i] = PAD;
            float *dx = bput(be, x, (size_t)T * ldx * sizeof(float)), *dy = bput(be, hy, ny * sizeof(float));
            float *dy2 = bput(be, hy, ny * sizeof(float));
            be->linear_rb(&w, r0, r1, dx, T, ldx, dy, ldy, quant);
            if (quant)
                be->linear_q(&w, r0, r1, dx, T, ldx, dy2, ldy);
            else
                be->linear(&w, r0, r1, dx, T, ldx, dy2, ldy);
            be->download(h2, dy2, ny * sizeof(float));
            for (int r = 0; r < T; r++)
                be->round_bf16(dy2 + (size_t)r * ldy, nr);
            be->download(hy, dy, ny * sizeof(float));
            bok(be, "linear_rb");
            int rounded = 0, same = 1;
            for (size_t i = 0; i < ny; i++)
                rounded |= memcmp(&hy[i], &h2[i], sizeof(float)) != 0; /* h2: the product unrounded */
            be->download(h2, dy2, ny * sizeof(float));
            int eq = !memcmp(hy, h2, ny * sizeof(float));
            for (int r = 0; r < T; r++) { /* each row alone */
                float *d1 = bput(be, hy, (size_t)ldy * sizeof(float));
                be->linear_rb(&w, r0, r1, dx + (size_t)r * ldx, 1, ldx, d1, ldy, quant);
                be->download(hone, d1, (size_t)ldy * sizeof(float));
                be->free(d1);
                same &= rows_equal(hone, hy + (size_t)r * ldy, nr);
            }
            char what[160];
            snprintf(what, sizeof what, "%s on %s, linear_rb quant %d", c->name, be->name, quant);
            CHECK(eq, "%s: differs from the product then round_bf16", what);
            CHECK(rounded, "control %s: the unrounded product equals it", what);
            CHECK(same, "%s: a row alone differs from the batch", what);
            printf("  %-52s == product + round_bf16 %s; rows alone %s; control %s\n", what, eq ? "bitwise" : "DIFFER",
                   same ? "bitwise" : "DIFFER", rounded ? "caught" : "NOT CAUGHT");
            be->free(dx), be->free(dy), be->free(dy2);
            free(hy), free(h2), free(hone);
        }
        drop_weights(t, &w, 1);
    }
    free_weight(&w);
    free(x);
}

static const lin_case rb_cases[] = {
    {.name = "rb fp8 [32, 32] rows 16..144 T=5", .form = DSV4_WF_FP8, .n = 160, .k = 768, .bn = 32, .bk = 32, .e8m0 = 1,
     .r0 = 16, .r1 = 144, .T = 5, .padx = 4, .pady = 3},
    {.name = "rb fp8 [128, 128] T=70", .form = DSV4_WF_FP8, .n = 256, .k = 512, .bn = 128, .bk = 128, .e8m0 = 1, .T = 70},
    {.name = "rb fp4 T=1, k 4096 (split sums)", .form = DSV4_WF_FP4, .n = 64, .k = 4096, .bn = 1, .bk = 32, .e8m0 = 1,
     .T = 1},
    {.name = "rb fp4 T=33", .form = DSV4_WF_FP4, .n = 96, .k = 1024, .bn = 1, .bk = 32, .e8m0 = 1, .T = 33},
    {.name = "rb bf16 T=9", .form = DSV4_WF_BF16, .n = 128, .k = 512, .T = 9},
};

/* ---- linear_blocks ---------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    dsv4_wform form;
    int G;
    int64_t rk, k; /* each block's rows, the slice width */
    int bn, bk, T;
} blocks_case;

static float *run_blocks(const target *t, const dsv4_weight *w, int G, const float *x, int T)
{
    const dsv4_backend *be = t->be;
    size_t nx = (size_t)T * G * w->k, ny = (size_t)T * w->n;
    float *dx = bput(be, x, nx * sizeof(float)), *dy = bpoison(be, ny);
    be->linear_blocks(w, G, dx, T, dy);
    float *y = bget(be, dy, ny * sizeof(float));
    bok(be, "linear_blocks");
    be->free(dx), be->free(dy);
    return y;
}

/* y[t, g n/G + i] = sum_j W[g n/G + i, j] x[t, g k + j]: linear_ref per block over its slice;
 * tolerance gamma(k + 4) sum|W x|. Control: block 1 computed from block 0's slice. */
static void blocks_ref(const double *W, const blocks_case *c, const float *x, int wrong, float *ref, double *tol)
{
    int64_t n = c->G * c->rk, ldx = c->G * c->k;
    float *r = falloc((size_t)c->T * c->rk);
    double *m = malloc((size_t)c->T * c->rk * sizeof(double));
    for (int g = 0; g < c->G; g++) {
        int src = wrong && g == 1 ? 0 : g;
        /* rows g rk.. of W against slice src of x: W's rows offset by g rk, x by src k */
        linear_ref(W + (size_t)g * c->rk * c->k, c->k, 0, c->rk, x + src * c->k, c->T, ldx, r, m);
        for (int t = 0; t < c->T; t++) {
            memcpy(ref + (size_t)t * n + g * c->rk, r + (size_t)t * c->rk, c->rk * sizeof(float));
            memcpy(tol + (size_t)t * n + g * c->rk, m + (size_t)t * c->rk, c->rk * sizeof(double));
        }
    }
    free(r), free(m);
}

static void test_linear_blocks(const blocks_case *c)
{
    int64_t n = c->G * c->rk;
    dsv4_weight w;
    make_weight(c->form, n, c->k, c->bn, c->bk, 1, &w);
    size_t nx = (size_t)c->T * c->G * c->k, ny = (size_t)c->T * n;
    float *x = falloc(nx), *ref = falloc(ny), *bad = falloc(ny), *cpu_y = NULL;
    double *tol = malloc(ny * sizeof(double)), *scr = malloc(ny * sizeof(double)), *W = w_dense(&w);
    fill(x, nx, -1, 1);
    blocks_ref(W, c, x, 0, ref, tol);
    blocks_ref(W, c, x, 1, bad, scr);
    char what[160];
    for (int o = -1; o < n_others; o++) {
        const target *t = o < 0 ? &cpu_t : &others[o];
        put_weights(t, &w, 1);
        float *y = run_blocks(t, &w, c->G, x, c->T);
        snprintf(what, sizeof what, "%s on %s", c->name, t->be->name);
        CHECK(agree_within(what, y, o < 0 ? ref : cpu_y, tol, ny, o < 0 ? 1.0 : OTHER, 0), "%s: differs", what);
        if (o < 0)
            control_within("linear_blocks: block 1 given block 0's slice", y, bad, tol, ny, 1.0);
        else { /* the CPU with block 1 reading block 0's slice: x's slice 1 replaced by slice 0 */
            float *xb = falloc(nx);
            memcpy(xb, x, nx * sizeof(float));
            for (int r = 0; r < c->T; r++)
                memcpy(xb + (size_t)r * c->G * c->k + c->k, x + (size_t)r * c->G * c->k, c->k * sizeof(float));
            float *cb = run_blocks(&cpu_t, &w, c->G, xb, c->T);
            snprintf(what, sizeof what, "linear_blocks on %s: block 1 given block 0's slice", t->be->name);
            control_within(what, y, cb, tol, ny, OTHER);
            free(xb), free(cb);
        }
        int same = 1;
        for (int r = 0; r < c->T; r++) {
            float *one = run_blocks(t, &w, c->G, x + (size_t)r * c->G * c->k, 1);
            same &= rows_equal(one, y + (size_t)r * n, n);
            free(one);
        }
        report_rows(c->name, t->be->name, same, c->T);
        drop_weights(t, &w, 1);
        if (o < 0)
            cpu_y = y;
        else
            free(y);
    }
    free_weight(&w);
    free(x), free(ref), free(bad), free(cpu_y), free(tol), free(scr), free(W);
}

/* ---- linear_multi ----------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    dsv4_wform form;
    int64_t n;
    int bn, bk, e8m0;
} multi_w;

typedef struct {
    const char *name;
    int64_t k;
    int T, padx, nw;
    multi_w w[6];
} multi_case;

/* y[j] of each weight, host copies; lin: each through linear instead (the contract's meaning). */
static float **run_multi(const target *t, const dsv4_weight *w, int nw, const float *x, int T, int64_t ldx, int lin)
{
    const dsv4_backend *be = t->be;
    float *dx = bput(be, x, (size_t)T * ldx * sizeof(float)), *dy[6];
    const dsv4_weight *wp[6];
    for (int j = 0; j < nw; j++) {
        wp[j] = &w[j];
        dy[j] = bpoison(be, (size_t)T * w[j].n);
    }
    if (lin)
        for (int j = 0; j < nw; j++)
            be->linear(&w[j], 0, w[j].n, dx, T, ldx, dy[j], w[j].n);
    else
        be->linear_multi(nw, wp, dx, T, ldx, dy);
    float **y = malloc(nw * sizeof *y);
    for (int j = 0; j < nw; j++) {
        y[j] = bget(be, dy[j], (size_t)T * w[j].n * sizeof(float));
        be->free(dy[j]);
    }
    bok(be, "linear_multi");
    be->free(dx);
    return y;
}

static void free_ys(float **y, int n)
{
    for (int j = 0; j < n; j++)
        free(y[j]);
    free(y);
}

/* Each y[j] against linear_ref (gamma(k + 4) sum|W x|) and bit for bit against linear(W_j) on
 * the same backend. Control: weight 0's rows shifted by one. */
static void test_linear_multi(const multi_case *c)
{
    int nw = c->nw, T = c->T;
    int64_t k = c->k, ldx = k + c->padx;
    dsv4_weight w[6];
    memset(w, 0, sizeof w);
    float *ref[6], *x = falloc((size_t)T * ldx);
    double *tol[6];
    fill(x, (size_t)T * ldx, -1, 1);
    for (int j = 0; j < nw; j++) {
        make_weight(c->w[j].form, c->w[j].n, k, c->w[j].bn, c->w[j].bk, c->w[j].e8m0, &w[j]);
        double *W = w_dense(&w[j]);
        ref[j] = falloc((size_t)T * w[j].n);
        tol[j] = malloc((size_t)T * w[j].n * sizeof(double));
        linear_ref(W, k, 0, w[j].n, x, T, ldx, ref[j], tol[j]);
        free(W);
    }
    float **cpu_y = NULL;
    char what[160];
    for (int o = -1; o < n_others; o++) {
        const target *t = o < 0 ? &cpu_t : &others[o];
        const char *bn = t->be->name;
        put_weights(t, w, nw);
        float **y = run_multi(t, w, nw, x, T, ldx, 0), **yl = run_multi(t, w, nw, x, T, ldx, 1);
        int close = 1, same = 1;
        for (int j = 0; j < nw; j++) {
            size_t ny = (size_t)T * w[j].n;
            snprintf(what, sizeof what, "%s: %s [%lld, %lld] on %s", c->name, dsv4_wform_name(w[j].form),
                     (long long)w[j].n, (long long)k, bn);
            close &= agree_within(what, y[j], o < 0 ? ref[j] : cpu_y[j], tol[j], ny, o < 0 ? 1.0 : OTHER, 0);
            same &= rows_equal(y[j], yl[j], ny);
        }
        CHECK(close, "%s on %s: differs", c->name, bn);
        CHECK(same, "%s on %s: a y[j] differs from linear(W_j)", c->name, bn);
        printf("  %-52s %s: each y[j] == linear(W_j): %s\n", c->name, bn, same ? "bitwise" : "DIFFERENT");
        float *sh = falloc((size_t)T * w[0].n);
        const float *r0 = o < 0 ? ref[0] : cpu_y[0];
        for (int r = 0; r < T; r++)
            for (int64_t i = 0; i < w[0].n; i++)
                sh[(size_t)r * w[0].n + i] = r0[(size_t)r * w[0].n + (i + 1) % w[0].n];
        snprintf(what, sizeof what, "linear_multi on %s: rows shifted by one", bn);
        control_within(what, y[0], sh, tol[0], (size_t)T * w[0].n, o < 0 ? 1.0 : OTHER);
        free(sh);
        int rs = 1;
        for (int r = 0; r < T; r++) {
            float **one = run_multi(t, w, nw, x + (size_t)r * ldx, 1, ldx, 0);
            for (int j = 0; j < nw; j++)
                rs &= rows_equal(one[j], y[j] + (size_t)r * w[j].n, w[j].n);
            free_ys(one, nw);
        }
        report_rows(c->name, bn, rs, T);
        drop_weights(t, w, nw);
        free_ys(yl, nw);
        if (o < 0)
            cpu_y = y;
        else
            free_ys(y, nw);
    }
    for (int j = 0; j < nw; j++)
        free_weight(&w[j]), free(ref[j]), free(tol[j]);
    free_ys(cpu_y, nw);
    free(x);
}

/* ---- embed ------------------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    dsv4_wform form;
    int64_t n, k;
    int bn, bk, e8m0, T, streams;
} embed_case;

static float *run_embed(const target *t, const dsv4_weight *w, const int32_t *ids, int T, int n)
{
    const dsv4_backend *be = t->be;
    size_t nx = (size_t)T * n * w->k;
    int32_t *di = bput(be, ids, T * sizeof(int32_t));
    float *dX = bpoison(be, nx);
    be->embed(w, di, T, n, dX);
    float *X = bget(be, dX, nx * sizeof(float));
    bok(be, "embed");
    be->free(di), be->free(dX);
    return X;
}

/* X[t, i, :] = W[ids[t], :] decoded exactly: the stored value (an f32 scale's product rounded
 * once to fp32, as the stored value in fp32 is) bit for bit, tolerance 0. Control: the last
 * row's id one off. */
static void test_embed(const embed_case *c)
{
    dsv4_weight w;
    make_weight(c->form, c->n, c->k, c->bn, c->bk, c->e8m0, &w);
    int T = c->T, ns = c->streams;
    int64_t D = c->k;
    size_t nx = (size_t)T * ns * D;
    int32_t *ids = malloc(T * sizeof(int32_t)), *ib = malloc(T * sizeof(int32_t));
    for (int t = 0; t < T; t++)
        ids[t] = t == 0 ? (int32_t)(c->n - 1) : t == 2 ? ids[1] : (int32_t)(rnd() % c->n);
    memcpy(ib, ids, T * sizeof(int32_t));
    ib[T - 1] = (ib[T - 1] + 1) % (int32_t)c->n;
    float *ref = falloc(nx), *bad = falloc(nx), *cpu_X = NULL;
    double *tol = calloc(nx, sizeof(double));
    for (int t = 0; t < T; t++)
        for (int i = 0; i < ns; i++)
            for (int64_t j = 0; j < D; j++) {
                ref[((size_t)t * ns + i) * D + j] = (float)w_at(&w, ids[t], j);
                bad[((size_t)t * ns + i) * D + j] = (float)w_at(&w, ib[t], j);
            }
    char what[160];
    for (int o = -1; o < n_others; o++) {
        const target *t = o < 0 ? &cpu_t : &others[o];
        put_weights(t, &w, 1);
        float *X = run_embed(t, &w, ids, T, ns);
        snprintf(what, sizeof what, "%s on %s", c->name, t->be->name);
        CHECK(agree_within(what, X, o < 0 ? ref : cpu_X, tol, nx, 1.0, 0), "%s: not the stored rows exactly", what);
        snprintf(what, sizeof what, "embed on %s: id one off", t->be->name);
        control_within(what, X, bad, tol, nx, 1.0);
        int same = 1;
        for (int r = 0; r < T; r++) {
            float *one = run_embed(t, &w, ids + r, 1, ns);
            same &= rows_equal(one, X + (size_t)r * ns * D, (size_t)ns * D);
            free(one);
        }
        report_rows(c->name, t->be->name, same, T);
        drop_weights(t, &w, 1);
        if (o < 0)
            cpu_X = X;
        else
            free(X);
    }
    free_weight(&w);
    free(ids), free(ib), free(ref), free(bad), free(cpu_X), free(tol);
}

/* ---- rmsnorm ----------------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    int rows, dim, weighted, in_place;
} norm_case;

/* How the run_* helpers of the ops with a REF form run them: the op, its _rb form, or the op
 * followed by the backend's round_bf16 over the range the _rb form rounds. */
enum { OP_PLAIN, OP_RB, OP_THEN_ROUND };

static float *run_rmsnorm_as(const target *t, const float *x, int rows, int dim, const float *w, int in_place, int mode)
{
    const dsv4_backend *be = t->be;
    size_t n = (size_t)rows * dim;
    float *dx = bput(be, x, n * sizeof(float)), *dw = w ? bput(be, w, dim * sizeof(float)) : NULL;
    float *dy = in_place ? dx : bpoison(be, n);
    if (mode == OP_RB)
        be->rmsnorm_rb(dx, rows, dim, dw, 1e-6f, dy);
    else
        be->rmsnorm(dx, rows, dim, dw, 1e-6f, dy);
    if (mode == OP_THEN_ROUND)
        be->round_bf16(dy, (int64_t)n);
    float *y = bget(be, dy, n * sizeof(float));
    bok(be, mode == OP_RB ? "rmsnorm_rb" : "rmsnorm");
    if (!in_place)
        be->free(dy);
    be->free(dx);
    if (dw)
        be->free(dw);
    return y;
}

/* y = x / sqrt(mean(x^2) + eps) * w in double. Bound: the sum of squares (dim positive terms,
 * gamma(dim)), the mean, + eps, then sqrt halves that relative error and adds u, the
 * reciprocal, x * inv, * w and the reference's rounding: |y| gamma(dim / 2 + 6). */
static float *run_rmsnorm(const target *t, const float *x, int rows, int dim, const float *w, int in_place)
{
    return run_rmsnorm_as(t, x, rows, dim, w, in_place, OP_PLAIN);
}

static void rmsnorm_ref(const float *x, int rows, int dim, const float *w, float *ref, double *tol)
{
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * dim;
        double ss = 0;
        for (int i = 0; i < dim; i++)
            ss += (double)xr[i] * xr[i];
        double inv = 1.0 / sqrt(ss / dim + (double)1e-6f);
        for (int i = 0; i < dim; i++) {
            double y = xr[i] * inv * (w ? w[i] : 1.0);
            ref[(size_t)r * dim + i] = (float)y;
            tol[(size_t)r * dim + i] = gam(dim / 2.0 + 6) * fabs(y);
        }
    }
}

/* Control: the last row's x one index off (and, weighted, w one index off). */
static void test_rmsnorm(const norm_case *c)
{
    size_t n = (size_t)c->rows * c->dim;
    float *x = falloc(n), *w = c->weighted ? falloc(c->dim) : NULL, *ref = falloc(n), *bad = falloc(n), *cpu_y = NULL;
    float *xs = falloc(n);
    double *tol = malloc(n * sizeof(double)), *scr = malloc(n * sizeof(double));
    fill(x, n, -2, 2);
    if (w)
        fill(w, c->dim, 0.5f, 1.5f);
    rmsnorm_ref(x, c->rows, c->dim, w, ref, tol);
    memcpy(xs, x, n * sizeof(float));
    swap_pair(xs + (size_t)(c->rows - 1) * c->dim, c->dim);
    rmsnorm_ref(xs, c->rows, c->dim, w, bad, scr);
    char what[160];
    for (int o = -1; o < n_others; o++) {
        const target *t = o < 0 ? &cpu_t : &others[o];
        float *y = run_rmsnorm(t, x, c->rows, c->dim, w, c->in_place);
        double s = o < 0 ? 1.0 : OTHER;
        snprintf(what, sizeof what, "%s on %s", c->name, t->be->name);
        CHECK(agree_within(what, y, o < 0 ? ref : cpu_y, tol, n, s, 0), "%s: differs", what);
        float *b = o < 0 ? bad : run_rmsnorm(&cpu_t, xs, c->rows, c->dim, w, 0);
        snprintf(what, sizeof what, "rmsnorm on %s: x index off", t->be->name);
        control_within(what, y, b, tol, n, s);
        if (o >= 0)
            free(b);
        int same = 1;
        for (int r = 0; r < c->rows; r++) {
            float *one = run_rmsnorm(t, x + (size_t)r * c->dim, 1, c->dim, w, c->in_place);
            same &= rows_equal(one, y + (size_t)r * c->dim, c->dim);
            free(one);
        }
        report_rows(c->name, t->be->name, same, c->rows);
        if (o < 0)
            cpu_y = y;
        else
            free(y);
    }
    free(x), free(w), free(ref), free(bad), free(cpu_y), free(xs), free(tol), free(scr);
}

/* ---- rope -------------------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    int T, heads, d, rd, pad, inverse;
} rope_case;

static float *run_rope_as(const target *t, const float *x, int T, int64_t stride, int heads, int d, int rd,
                          const float *freq, const int64_t *pos, int inverse, int mode)
{
    const dsv4_backend *be = t->be;
    size_t n = (size_t)T * stride;
    float *dx = bput(be, x, n * sizeof(float)), *df = bput(be, freq, rd / 2 * sizeof(float));
    int64_t *dp = bput(be, pos, T * sizeof(int64_t));
    if (mode == OP_RB)
        be->rope_rb(dx, T, stride, heads, d, rd, df, dp, inverse);
    else
        be->rope(dx, T, stride, heads, d, rd, df, dp, inverse);
    for (int r = 0; mode == OP_THEN_ROUND && r < T; r++) /* each row's heads, not its padding */
        be->round_bf16(dx + (size_t)r * stride, (int64_t)heads * d);
    float *y = bget(be, dx, n * sizeof(float));
    bok(be, mode == OP_RB ? "rope_rb" : "rope");
    be->free(dx), be->free(df), be->free(dp);
    return y;
}

static float *run_rope(const target *t, const float *x, int T, int64_t stride, int heads, int d, int rd,
                       const float *freq, const int64_t *pos, int inverse)
{
    return run_rope_as(t, x, T, stride, heads, d, rd, freq, pos, inverse, OP_PLAIN);
}

/* Pairs (a, b) of the last rd channels of each head rotated by the angle pos inv_freq (by its
 * negative when inverse), the angle being the fp32 product (float)pos * inv_freq as backend.h
 * states (at positions near 70000 its rounding alone moves a result by 4e-3): the reference
 * rotates by exactly that angle, in double. Bound: cos and sin
 * within 2 ulp each, the two products, the difference and the reference's rounding:
 * (|a| + |b|) 7 u. Every other channel and the row padding unchanged, bit for bit. */
static void rope_ref(const float *x, int T, int64_t stride, int heads, int d, int rd, const float *freq,
                     const int64_t *pos, int inverse, float *ref, double *tol)
{
    memcpy(ref, x, (size_t)T * stride * sizeof(float));
    memset(tol, 0, (size_t)T * stride * sizeof(double));
    for (int t = 0; t < T; t++)
        for (int h = 0; h < heads; h++)
            for (int i = 0; i < rd / 2; i++) {
                size_t at = (size_t)t * stride + (size_t)h * d + (d - rd) + 2 * i;
                float ang = (float)pos[t] * freq[i];
                double cs = cos((double)ang), sn = inverse ? -sin((double)ang) : sin((double)ang);
                double a = x[at], b = x[at + 1];
                ref[at] = (float)(a * cs - b * sn);
                ref[at + 1] = (float)(a * sn + b * cs);
                tol[at] = tol[at + 1] = 7 * U * (fabs(a) + fabs(b));
            }
}

/* Control: the last row one position off. Rows: each alone. */
static void test_rope(const rope_case *c)
{
    int64_t stride = (int64_t)c->heads * c->d + c->pad;
    size_t n = (size_t)c->T * stride;
    float *x = falloc(n), *freq = falloc(c->rd / 2), *ref = falloc(n), *bad = falloc(n), *cpu_y = NULL;
    int64_t *pos = malloc(c->T * sizeof(int64_t)), *pb = malloc(c->T * sizeof(int64_t));
    double *tol = malloc(n * sizeof(double)), *scr = malloc(n * sizeof(double));
    fill(x, n, -1, 1);
    for (int i = 0; i < c->rd / 2; i++)
        freq[i] = powf(10000.0f, -(float)(2 * i) / c->rd);
    for (int t = 0; t < c->T; t++)
        pos[t] = pb[t] = rnd() % 70000;
    pb[c->T - 1]++;
    rope_ref(x, c->T, stride, c->heads, c->d, c->rd, freq, pos, c->inverse, ref, tol);
    rope_ref(x, c->T, stride, c->heads, c->d, c->rd, freq, pb, c->inverse, bad, scr);
    char what[160];
    for (int o = -1; o < n_others; o++) {
        const target *t = o < 0 ? &cpu_t : &others[o];
        double s = o < 0 ? 1.0 : OTHER;
        float *y = run_rope(t, x, c->T, stride, c->heads, c->d, c->rd, freq, pos, c->inverse);
        snprintf(what, sizeof what, "%s on %s", c->name, t->be->name);
        CHECK(agree_within(what, y, o < 0 ? ref : cpu_y, tol, n, s, 0), "%s: differs", what);
        float *b = o < 0 ? bad : run_rope(&cpu_t, x, c->T, stride, c->heads, c->d, c->rd, freq, pb, c->inverse);
        snprintf(what, sizeof what, "rope on %s: position one off", t->be->name);
        control_within(what, y, b, tol, n, s);
        if (o >= 0)
            free(b);
        int same = 1;
        for (int r = 0; r < c->T; r++) {
            float *one = run_rope(t, x + (size_t)r * stride, 1, stride, c->heads, c->d, c->rd, freq, pos + r, c->inverse);
            same &= rows_equal(one, y + (size_t)r * stride, stride);
            free(one);
        }
        report_rows(c->name, t->be->name, same, c->T);
        if (o < 0)
            cpu_y = y;
        else
            free(y);
    }
    free(x), free(freq), free(ref), free(bad), free(cpu_y), free(pos), free(pb), free(tol), free(scr);
}

/* ---- add, swiglu, scale ------------------------------------------------------------------------------- */

static const char *const elem_names[] = {"add", "swiglu", "scale"};

/* Elementwise ops: n values, in backend buffers; alias: y is a's buffer; limit: swiglu's, or
 * scale's factor. */
static float *run_elem(const target *t, int op, const float *a, const float *b, int64_t n, float limit, int alias)
{
    const dsv4_backend *be = t->be;
    float *da = bput(be, a, n * sizeof(float)), *db = bput(be, b, n * sizeof(float));
    float *dy = alias ? da : bpoison(be, n);
    if (op == 0)
        be->add(da, db, n, dy);
    else if (op == 1)
        be->swiglu(da, db, n, limit, dy);
    else
        be->scale(da, n, limit, dy);
    float *y = bget(be, dy, n * sizeof(float));
    bok(be, elem_names[op]);
    if (!alias)
        be->free(dy);
    be->free(da), be->free(db);
    return y;
}

typedef struct {
    const char *name;
    int op; /* 0 add, 1 swiglu, 2 scale (by limit) */
    int64_t n;
    float limit;
    int alias;
} elem_case;

/* add: y = a + b, one rounding: the fp32 sum exactly, tolerance 0; scale: y = a s the same way.
 * swiglu: h = silu(min(g, L))
 * clamp(u, -L, L) in double; bound: expf within 2 ulp (4 u in e^-a, at most 4 u in 1 + e^-a),
 * the sum, the division, the product and the reference's rounding: |h| 8 u. Controls: add one
 * element off; swiglu the limit skipped (or, without a limit, one element off). "Rows": the two
 * halves of the array in two calls equal one call, bit for bit. */
static void test_elem(const elem_case *c)
{
    int64_t n = c->n;
    float *a = falloc(n), *b = falloc(n), *ref = falloc(n), *bad = falloc(n), *cpu_y = NULL;
    double *tol = malloc(n * sizeof(double));
    fill(a, n, -3, 3);
    fill(b, n, -3, 3);
    for (int64_t i = 0; i < n; i++) {
        if (c->op == 0) {
            ref[i] = (float)((double)a[i] + b[i]);
            tol[i] = 0;
        } else if (c->op == 2) {
            ref[i] = (float)((double)a[i] * c->limit);
            tol[i] = 0;
        } else {
            double g = a[i], u = b[i];
            if (c->limit > 0) {
                g = fmin(g, c->limit);
                u = fmin(fmax(u, -c->limit), c->limit);
            }
            double h = g / (1 + exp(-g)) * u;
            ref[i] = (float)h;
            tol[i] = 8 * U * fabs(h);
        }
    }
    if (c->op == 1 && c->limit > 0)
        for (int64_t i = 0; i < n; i++)
            bad[i] = (float)((double)a[i] / (1 + exp(-(double)a[i])) * b[i]);
    else {
        memcpy(bad, ref, n * sizeof(float));
        bad[n / 2] = ref[n / 2 + 1];
    }
    char what[160];
    for (int o = -1; o < n_others; o++) {
        const target *t = o < 0 ? &cpu_t : &others[o];
        double s = o < 0 ? 1.0 : OTHER;
        float *y = run_elem(t, c->op, a, b, n, c->limit, c->alias);
        snprintf(what, sizeof what, "%s on %s", c->name, t->be->name);
        CHECK(agree_within(what, y, o < 0 ? ref : cpu_y, tol, n, s, 0), "%s: differs", what);
        float *bb = bad;
        if (o >= 0 && c->op == 1 && c->limit > 0)
            bb = run_elem(&cpu_t, 1, a, b, n, 0, 0);
        else if (o >= 0) {
            bb = falloc(n);
            memcpy(bb, cpu_y, n * sizeof(float));
            bb[n / 2] = cpu_y[n / 2 + 1];
        }
        snprintf(what, sizeof what, "%s on %s: %s", elem_names[c->op], t->be->name,
                 c->op == 1 && c->limit > 0 ? "limit skipped" : "one element off");
        control_within(what, y, bb, tol, n, s);
        if (bb != bad)
            free(bb);
        float *h1 = run_elem(t, c->op, a, b, n / 2, c->limit, c->alias);
        float *h2 = run_elem(t, c->op, a + n / 2, b + n / 2, n - n / 2, c->limit, c->alias);
        int same = rows_equal(h1, y, n / 2) && rows_equal(h2, y + n / 2, n - n / 2);
        report_rows(c->name, t->be->name, same, 2);
        free(h1), free(h2);
        if (o < 0)
            cpu_y = y;
        else
            free(y);
    }
    free(a), free(b), free(ref), free(bad), free(cpu_y), free(tol);
}

/* ---- hyper-connections ------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    int T, n, D, full, iters, normed;
    float hc_eps; /* 0: the model's 1e-6; larger makes its every use show */
} hc_case;

typedef struct {
    float *pre, *post, *comb, *h;
} hc_out;

static float hc_eps_of(const hc_case *c) { return c->hc_eps > 0 ? c->hc_eps : 1e-6f; }

static void hc_free(hc_out *o) { free(o->pre), free(o->post), free(o->comb), free(o->h); }

/* hc_pre on t: with_h 0 passes h NULL (mixes only); hw given: the normed collapse. */
static hc_out run_hc_pre(const target *t, const hc_case *c, int T, const float *X, const float *fn, const float *base,
                         const float *scale, const float *hw, int with_h)
{
    const dsv4_backend *be = t->be;
    int n = c->n, nm = c->full ? (2 + n) * n : n;
    size_t nx = (size_t)T * n * c->D;
    float *dX = bput(be, X, nx * sizeof(float)), *dfn = bput(be, fn, (size_t)nm * n * c->D * sizeof(float));
    float *db = bput(be, base, nm * sizeof(float)), *ds = bput(be, scale, 3 * sizeof(float));
    float *dhw = hw ? bput(be, hw, c->D * sizeof(float)) : NULL;
    float *dpre = bpoison(be, (size_t)T * n), *dpost = c->full ? bpoison(be, (size_t)T * n) : NULL;
    float *dcomb = c->full ? bpoison(be, (size_t)T * n * n) : NULL, *dh = with_h ? bpoison(be, (size_t)T * c->D) : NULL;
    be->hc_pre(dX, T, n, c->D, dfn, db, ds, c->iters, hc_eps_of(c), 1e-6f, dpre, dpost, dcomb, dh, dhw);
    hc_out o = {bget(be, dpre, (size_t)T * n * 4), c->full ? bget(be, dpost, (size_t)T * n * 4) : NULL,
                c->full ? bget(be, dcomb, (size_t)T * n * n * 4) : NULL, with_h ? bget(be, dh, (size_t)T * c->D * 4) : NULL};
    bok(be, "hc_pre");
    be->free(dX), be->free(dfn), be->free(db), be->free(ds), be->free(dpre);
    if (dhw)
        be->free(dhw);
    if (dpost)
        be->free(dpost), be->free(dcomb);
    if (dh)
        be->free(dh);
    return o;
}

/* All outputs in one array (pre, post, comb, h) for one comparison. */
static float *hc_flat(const hc_out *o, const hc_case *c, size_t *len)
{
    size_t a = (size_t)c->T * c->n, cc = c->full ? a * c->n : 0, hd = (size_t)c->T * c->D;
    *len = a + (c->full ? a + cc : 0) + hd;
    float *v = falloc(*len), *p = v;
    memcpy(p, o->pre, a * 4), p += a;
    if (c->full) {
        memcpy(p, o->post, a * 4), p += a;
        memcpy(p, o->comb, cc * 4), p += cc;
    }
    memcpy(p, o->h, hd * 4);
    return v;
}

static double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }

/* The site in double, following backend.h and kernels/hc_mix.h: inv = 1/sqrt(mean(x^2) + eps)
 * over the n D values of a row; m_j = (fn_j . x) inv; pre_i = sigmoid(m_i s0 + base_i) + eps;
 * post_i = 2 sigmoid(m_{n+i} s1 + base_{n+i}); comb row j = softmax_k(m_{2n+jn+k} s2 + base) +
 * eps, then `iters` Sinkhorn rounds (each: every row over its sum + eps, except in the first,
 * where the rows are the softmax's; then every column); h = sum_i pre_i X_i, normed as rmsnorm
 * with hw when given. Flat output order as hc_flat.
 *
 * Bounds, first order, per row: the mixes' dot products gamma(nD + 2) sum|fn x| inv plus |m|
 * gamma(nD / 2 + 4) for inv; an argument A = m s + base adds u (|m s| + |A|); a sigmoid
 * passes its argument's error times s(1 - s) and adds 5 u (expf, the sum, the quotient, + eps);
 * a softmax entry's relative error is twice its largest argument error (with u |a - max| for
 * the shift) plus gamma(n + 6); each Sinkhorn half-step at most doubles the entries' relative
 * error and adds gamma(n + 2) (its sum, + eps, the quotient); h's error is sum_i dpre_i |X_i| +
 * gamma(n + 1) sum|pre X|; normed, |hw| inv dh + |y| (|dh|_2 / |h|_2 + gamma(D / 2 + 6)). */
static void hc_pre_ref(const hc_case *c, const float *X, const float *fn, const float *base, const float *scale,
                       const float *hw, float *ref, double *tol)
{
    int T = c->T, n = c->n, D = c->D, nm = c->full ? (2 + n) * n : n;
    int64_t nd = (int64_t)n * D;
    size_t a = (size_t)T * n, cc = c->full ? a * n : 0, oh = a + (c->full ? a + cc : 0);
    double m[64], dm[64], pre[16], dpre[16], cm[256], ce[256];
    for (int t = 0; t < T; t++) {
        const float *x = X + t * nd;
        double ss = 0;
        for (int64_t i = 0; i < nd; i++)
            ss += (double)x[i] * x[i];
        double inv = 1.0 / sqrt(ss / nd + (double)1e-6f);
        for (int j = 0; j < nm; j++) {
            double s = 0, am = 0;
            for (int64_t i = 0; i < nd; i++) {
                s += (double)fn[j * nd + i] * x[i];
                am += fabs((double)fn[j * nd + i] * x[i]);
            }
            m[j] = s * inv;
            dm[j] = gam((double)nd + 2) * am * inv + fabs(m[j]) * gam(nd / 2.0 + 4);
        }
        for (int i = 0; i < n; i++) {
            double A = m[i] * scale[0] + base[i], sg = sigm(A);
            double dA = fabs(scale[0]) * dm[i] + U * (fabs(m[i] * scale[0]) + fabs(A));
            pre[i] = sg + (double)hc_eps_of(c);
            dpre[i] = sg * (1 - sg) * dA + 5 * U;
            ref[(size_t)t * n + i] = (float)pre[i];
            tol[(size_t)t * n + i] = dpre[i];
        }
        if (c->full) {
            for (int i = 0; i < n; i++) {
                double B = m[n + i] * scale[1] + base[n + i], sg = sigm(B);
                double dB = fabs(scale[1]) * dm[n + i] + U * (fabs(m[n + i] * scale[1]) + fabs(B));
                ref[a + (size_t)t * n + i] = (float)(2 * sg);
                tol[a + (size_t)t * n + i] = 2 * (sg * (1 - sg) * dB + 5 * U);
            }
            for (int j = 0; j < n; j++) {
                double arg[16], da[16], mx = -INFINITY, sum = 0, worst = 0;
                for (int k = 0; k < n; k++) {
                    int q = 2 * n + j * n + k;
                    arg[k] = m[q] * scale[2] + base[q];
                    da[k] = fabs(scale[2]) * dm[q] + U * (fabs(m[q] * scale[2]) + fabs(arg[k]));
                    mx = fmax(mx, arg[k]);
                }
                for (int k = 0; k < n; k++) {
                    sum += exp(arg[k] - mx);
                    worst = fmax(worst, da[k] + U * fabs(arg[k] - mx));
                }
                for (int k = 0; k < n; k++) {
                    cm[j * n + k] = exp(arg[k] - mx) / sum + (double)hc_eps_of(c);
                    ce[j * n + k] = 2 * worst + gam(n + 6.0);
                }
            }
            for (int it = 0; it < c->iters; it++)
                for (int half = it ? 0 : 1; half < 2; half++)
                    for (int l = 0; l < n; l++) { /* half 0: row l; half 1: column l */
                        double s = 0, e = 0;
                        for (int k = 0; k < n; k++) {
                            int at = half ? k * n + l : l * n + k;
                            s += cm[at];
                            e = fmax(e, ce[at]);
                        }
                        for (int k = 0; k < n; k++) {
                            int at = half ? k * n + l : l * n + k;
                            cm[at] /= s + (double)hc_eps_of(c);
                            ce[at] = 2 * e + gam(n + 2.0);
                        }
                    }
            for (int q = 0; q < n * n; q++) {
                ref[2 * a + (size_t)t * n * n + q] = (float)cm[q];
                tol[2 * a + (size_t)t * n * n + q] = ce[q] * cm[q] + U * cm[q];
            }
        }
        double *h = malloc(D * sizeof(double)), *dh = malloc(D * sizeof(double)), hh = 0, dd2 = 0;
        for (int dd = 0; dd < D; dd++) {
            double s = 0, e = 0, am = 0;
            for (int i = 0; i < n; i++) {
                s += pre[i] * x[(int64_t)i * D + dd];
                e += dpre[i] * fabs(x[(int64_t)i * D + dd]);
                am += fabs(pre[i] * x[(int64_t)i * D + dd]);
            }
            h[dd] = s;
            dh[dd] = e + gam(n + 1.0) * am;
            hh += s * s;
            dd2 += dh[dd] * dh[dd];
        }
        double hinv = 1.0 / sqrt(hh / D + (double)1e-6f), rel = sqrt(dd2 / hh) + gam(D / 2.0 + 6);
        for (int dd = 0; dd < D; dd++) {
            size_t at = oh + (size_t)t * D + dd;
            if (hw) {
                double y = h[dd] * hinv * hw[dd];
                ref[at] = (float)y;
                tol[at] = fabs(hw[dd]) * hinv * dh[dd] + fabs(y) * rel;
            } else {
                ref[at] = (float)h[dd];
                tol[at] = dh[dd] + U * fabs(h[dd]);
            }
        }
        free(h), free(dh);
    }
}

/* Control: two neighbouring mix rows of fn swapped (one index off). Also: mixes only (h NULL)
 * give the same mixes bit for bit, and the normed collapse is bit for bit what rmsnorm(h, hw)
 * on the same backend makes of the unnormed one. Rows: each alone. */
static void test_hc_pre(const hc_case *c)
{
    int T = c->T, n = c->n, D = c->D, nm = c->full ? (2 + n) * n : n;
    int64_t nd = (int64_t)n * D;
    float *X = falloc((size_t)T * nd), *fn = falloc((size_t)nm * nd), *base = falloc(nm), scale[3];
    float *hw = c->normed ? falloc(D) : NULL, *fn2 = falloc((size_t)nm * nd);
    fill(X, (size_t)T * nd, -1, 1);
    fill(fn, (size_t)nm * nd, -1.0f / sqrtf(nd), 1.0f / sqrtf(nd));
    fill(base, nm, -1, 1);
    fill(scale, 3, 0.5f, 2.0f);
    if (hw)
        fill(hw, D, 0.5f, 1.5f);
    memcpy(fn2, fn, (size_t)nm * nd * sizeof(float));
    int j = c->full ? nm - 2 : 0;
    memcpy(fn2 + (size_t)j * nd, fn + (size_t)(j + 1) * nd, nd * sizeof(float));
    memcpy(fn2 + (size_t)(j + 1) * nd, fn + (size_t)j * nd, nd * sizeof(float));
    size_t L = (size_t)T * n * (c->full ? 2 + n : 1) + (size_t)T * D;
    float *ref = falloc(L), *bad = falloc(L), *cpu_f = NULL;
    double *tol = malloc(L * sizeof(double)), *scr = malloc(L * sizeof(double));
    hc_pre_ref(c, X, fn, base, scale, hw, ref, tol);
    hc_pre_ref(c, X, fn2, base, scale, hw, bad, scr);
    char what[160];
    for (int o = -1; o < n_others; o++) {
        const target *t = o < 0 ? &cpu_t : &others[o];
        double s = o < 0 ? 1.0 : OTHER;
        hc_out g = run_hc_pre(t, c, T, X, fn, base, scale, hw, 1);
        float *gf = hc_flat(&g, c, &L);
        snprintf(what, sizeof what, "%s on %s", c->name, t->be->name);
        CHECK(agree_within(what, gf, o < 0 ? ref : cpu_f, tol, L, s, 0), "%s: differs", what);
        float *bf = bad;
        if (o >= 0) {
            hc_out b = run_hc_pre(&cpu_t, c, T, X, fn2, base, scale, hw, 1);
            bf = hc_flat(&b, c, &L);
            hc_free(&b);
        }
        snprintf(what, sizeof what, "hc_pre on %s: mix row off by one", t->be->name);
        control_within(what, gf, bf, tol, L, s);
        if (bf != bad)
            free(bf);
        hc_out mo = run_hc_pre(t, c, T, X, fn, base, scale, hw, 0);
        int mix_same = rows_equal(mo.pre, g.pre, (size_t)T * n) &&
                       (!c->full || (rows_equal(mo.post, g.post, (size_t)T * n) &&
                                     rows_equal(mo.comb, g.comb, (size_t)T * n * n)));
        CHECK(mix_same, "%s on %s: mixes only (h NULL) differ from the full call", c->name, t->be->name);
        hc_free(&mo);
        if (hw) { /* normed h == rmsnorm(h, hw) of the unnormed h, on the same backend */
            hc_out un = run_hc_pre(t, c, T, X, fn, base, scale, NULL, 1);
            float *sep = run_rmsnorm(t, un.h, T, D, hw, 0);
            CHECK(rows_equal(sep, g.h, (size_t)T * D), "%s on %s: normed h differs from rmsnorm of h", c->name,
                  t->be->name);
            hc_free(&un);
            free(sep);
        }
        int same = 1;
        for (int r = 0; r < T; r++) {
            hc_out one = run_hc_pre(t, c, 1, X + (size_t)r * nd, fn, base, scale, hw, 1);
            same &= rows_equal(one.pre, g.pre + (size_t)r * n, n) && rows_equal(one.h, g.h + (size_t)r * D, D);
            if (c->full)
                same &= rows_equal(one.post, g.post + (size_t)r * n, n) &&
                        rows_equal(one.comb, g.comb + (size_t)r * n * n, (size_t)n * n);
            hc_free(&one);
        }
        report_rows(c->name, t->be->name, same, T);
        hc_free(&g);
        if (o < 0)
            cpu_f = gf;
        else
            free(gf);
    }
    free(X), free(fn), free(fn2), free(base), free(hw), free(ref), free(bad), free(cpu_f), free(tol), free(scr);
}

typedef struct {
    const char *name;
    int T, n, D;
} hcx_case;

/* ---- engram_gate ------------------------------------------------------------------------------ */

static float *run_engram(const target *t, const float *X, const float *kv, const float *w, int T, int n, int D,
                         int round_bf16)
{
    const dsv4_backend *be = t->be;
    size_t nx = (size_t)T * n * D;
    float *dX = bput(be, X, nx * 4), *dkv = bput(be, kv, (size_t)T * (n + 1) * D * 4), *dw = bput(be, w, (size_t)n * D * 4);
    be->engram_gate(dX, dkv, dw, T, n, D, 1e-6f, round_bf16);
    float *y = bget(be, dX, nx * 4);
    bok(be, "engram_gate");
    be->free(dX), be->free(dkv), be->free(dw);
    return y;
}

/* The gate in double: ref [T, n, D] and its bound. The bound carries the sums' rounding into
 * the gate: s's error (gamma(D + 4) times the sum of |x w key| rx rk / sqrt(D), and as much
 * again for rx and rk) times the gate's slope at s, times |val|, plus the update's own two
 * roundings. shift: stream k takes stream (k + shift) % n's weights (0; 1 for the control). */
static void engram_ref(const float *X, const float *kv, const float *w, int T, int n, int D, int shift, float *ref,
                       double *tol)
{
    for (int t = 0; t < T; t++)
        for (int k = 0; k < n; k++) {
            const float *x = X + ((size_t)t * n + k) * D, *key = kv + (size_t)t * (n + 1) * D + (size_t)k * D;
            const float *val = kv + (size_t)t * (n + 1) * D + (size_t)n * D, *wk = w + (size_t)((k + shift) % n) * D;
            double d = 0, da = 0, xx = 0, kk = 0;
            for (int j = 0; j < D; j++) {
                double p = (double)x[j] * wk[j] * key[j];
                d += p, da += fabs(p), xx += (double)x[j] * x[j], kk += (double)key[j] * key[j];
            }
            double rx = 1 / sqrt(xx / D + 1e-6), rk = 1 / sqrt(kk / D + 1e-6), s = d * rx * rk / sqrt((double)D);
            double a = fabs(s) > 1e-6 ? fabs(s) : 1e-6, z = (s > 0 ? 1 : s < 0 ? -1 : 0) * sqrt(a);
            double g = 1 / (1 + exp(-z)), slope = fabs(s) > 1e-6 ? g * (1 - g) * 0.5 / sqrt(a) : 0;
            double es = 2 * gam(D + 4.0) * (da * rx * rk / sqrt((double)D) + fabs(s)) + 1e-7 * fabs(s);
            for (int j = 0; j < D; j++) {
                double v = x[j] + g * val[j];
                ref[((size_t)t * n + k) * D + j] = (float)v;
                tol[((size_t)t * n + k) * D + j] =
                    es * slope * fabs(val[j]) + gam(4.0) * (fabs(x[j]) + fabs(g * val[j])) + 1e-30;
            }
        }
}

/* Engram's gate against the double reference; control: each stream given the next stream's
 * weights; rows alone == in the batch; the bf16 form is the fp32 form rounded, bit for bit. */
static void test_engram_gate(const hcx_case *c)
{
    int T = c->T, n = c->n, D = c->D;
    size_t nx = (size_t)T * n * D;
    float *X = falloc(nx), *kv = falloc((size_t)T * (n + 1) * D), *w = falloc((size_t)n * D);
    float *ref = falloc(nx), *bad = falloc(nx), *cpu_y = NULL;
    double *tol = malloc(nx * sizeof(double)), *scr = malloc(nx * sizeof(double));
    fill(X, nx, -1, 1);
    fill(kv, (size_t)T * (n + 1) * D, -1, 1);
    fill(w, (size_t)n * D, -1, 1);
    engram_ref(X, kv, w, T, n, D, 0, ref, tol);
    engram_ref(X, kv, w, T, n, D, 1, bad, scr);
    char what[160];
    for (int o = -1; o < n_others; o++) {
        const target *t = o < 0 ? &cpu_t : &others[o];
        double s = o < 0 ? 1.0 : OTHER;
        float *y = run_engram(t, X, kv, w, T, n, D, 0);
        snprintf(what, sizeof what, "%s on %s", c->name, t->be->name);
        CHECK(agree_within(what, y, o < 0 ? ref : cpu_y, tol, nx, s, 0), "%s: differs", what);
        snprintf(what, sizeof what, "engram_gate on %s: the next stream's weights", t->be->name);
        control_within(what, y, bad, tol, nx, s);
        float *yr = run_engram(t, X, kv, w, T, n, D, 1);
        float *rr = falloc(nx);
        memcpy(rr, y, nx * 4);
        dsv4_round_bf16(rr, (int64_t)nx);
        snprintf(what, sizeof what, "%s on %s, through bf16", c->name, t->be->name);
        CHECK(!memcmp(yr, rr, nx * 4), "%s: not the fp32 form rounded to bf16", what);
        printf("  %-52s %s\n", what, !memcmp(yr, rr, nx * 4) ? "the fp32 form rounded, bitwise" : "DIFFERENT");
        free(yr), free(rr);
        int same = 1;
        for (int r = 0; r < T; r++) {
            float *one = run_engram(t, X + (size_t)r * n * D, kv + (size_t)r * (n + 1) * D, w, 1, n, D, 0);
            same &= rows_equal(one, y + (size_t)r * n * D, (size_t)n * D);
            free(one);
        }
        report_rows(c->name, t->be->name, same, T);
        if (o < 0)
            cpu_y = y;
        else
            free(y);
    }
    free(X), free(kv), free(w), free(ref), free(bad), free(cpu_y), free(tol), free(scr);
}

static float *run_collapse(const target *t, const float *X, int T, int n, int D, const float *pre)
{
    const dsv4_backend *be = t->be;
    float *dX = bput(be, X, (size_t)T * n * D * 4), *dp = bput(be, pre, (size_t)T * n * 4), *dh = bpoison(be, (size_t)T * D);
    be->hc_collapse(dX, T, n, D, dp, dh);
    float *h = bget(be, dh, (size_t)T * D * 4);
    bok(be, "hc_collapse");
    be->free(dX), be->free(dp), be->free(dh);
    return h;
}

static void collapse_ref(const float *X, int T, int n, int D, const float *pre, float *ref, double *tol)
{
    for (int t = 0; t < T; t++)
        for (int dd = 0; dd < D; dd++) {
            double s = 0, m = 0;
            for (int i = 0; i < n; i++) {
                double v = (double)pre[t * n + i] * X[((size_t)t * n + i) * D + dd];
                s += v, m += fabs(v);
            }
            ref[(size_t)t * D + dd] = (float)s;
            tol[(size_t)t * D + dd] = gam(n + 1.0) * m;
        }
}

/* h = sum_i pre_i X_i: n products and n - 1 sums, the reference's rounding: gamma(n + 1)
 * sum|pre X|. Control: the last row's first two pre swapped. */
static void test_hc_collapse(const hcx_case *c)
{
    int T = c->T, n = c->n, D = c->D;
    size_t nx = (size_t)T * n * D, nh = (size_t)T * D;
    float *X = falloc(nx), *pre = falloc((size_t)T * n), *pre2 = falloc((size_t)T * n);
    float *ref = falloc(nh), *bad = falloc(nh), *cpu_h = NULL;
    double *tol = malloc(nh * sizeof(double)), *scr = malloc(nh * sizeof(double));
    fill(X, nx, -1, 1);
    fill(pre, (size_t)T * n, 0.1f, 1.0f);
    pre[(size_t)(T - 1) * n] = 0.2f, pre[(size_t)(T - 1) * n + 1] = 0.9f;
    memcpy(pre2, pre, (size_t)T * n * 4);
    pre2[(size_t)(T - 1) * n] = 0.9f, pre2[(size_t)(T - 1) * n + 1] = 0.2f;
    collapse_ref(X, T, n, D, pre, ref, tol);
    collapse_ref(X, T, n, D, pre2, bad, scr);
    char what[160];
    for (int o = -1; o < n_others; o++) {
        const target *t = o < 0 ? &cpu_t : &others[o];
        double s = o < 0 ? 1.0 : OTHER;
        float *h = run_collapse(t, X, T, n, D, pre);
        snprintf(what, sizeof what, "%s on %s", c->name, t->be->name);
        CHECK(agree_within(what, h, o < 0 ? ref : cpu_h, tol, nh, s, 0), "%s: differs", what);
        float *b = o < 0 ? bad : run_collapse(&cpu_t, X, T, n, D, pre2);
        snprintf(what, sizeof what, "hc_collapse on %s: pre index off", t->be->name);
        control_within(what, h, b, tol, nh, s);
        if (o >= 0)
            free(b);
        int same = 1;
        for (int r = 0; r < T; r++) {
            float *one = run_collapse(t, X + (size_t)r * n * D, 1, n, D, pre + (size_t)r * n);
            same &= rows_equal(one, h + (size_t)r * D, D);
            free(one);
        }
        report_rows(c->name, t->be->name, same, T);
        if (o < 0)
            cpu_h = h;
        else
            free(h);
    }
    free(X), free(pre), free(pre2), free(ref), free(bad), free(cpu_h), free(tol), free(scr);
}

static float *run_post_as(const target *t, const float *X, const float *y, int T, int n, int D, const float *post,
                          const float *comb, int mode)
{
    const dsv4_backend *be = t->be;
    size_t nx = (size_t)T * n * D;
    float *dX = bput(be, X, nx * 4), *dy = bput(be, y, (size_t)T * D * 4), *dp = bput(be, post, (size_t)T * n * 4);
    float *dc = bput(be, comb, (size_t)T * n * n * 4);
    if (mode == OP_RB)
        be->hc_post_rb(dX, dy, T, n, D, dp, dc);
    else
        be->hc_post(dX, dy, T, n, D, dp, dc);
    if (mode == OP_THEN_ROUND)
        be->round_bf16(dX, (int64_t)nx);
    float *o = bget(be, dX, nx * 4);
    bok(be, mode == OP_RB ? "hc_post_rb" : "hc_post");
    be->free(dX), be->free(dy), be->free(dp), be->free(dc);
    return o;
}

static float *run_post(const target *t, const float *X, const float *y, int T, int n, int D, const float *post,
                       const float *comb)
{
    return run_post_as(t, X, y, T, n, D, post, comb, OP_PLAIN);
}

static void post_ref(const float *X, const float *y, int T, int n, int D, const float *post, const float *comb,
                     float *ref, double *tol)
{
    for (int t = 0; t < T; t++)
        for (int k = 0; k < n; k++)
            for (int dd = 0; dd < D; dd++) {
                double v = (double)post[t * n + k] * y[(size_t)t * D + dd], s = v, m = fabs(v);
                for (int j = 0; j < n; j++) {
                    v = (double)comb[(size_t)t * n * n + j * n + k] * X[((size_t)t * n + j) * D + dd];
                    s += v, m += fabs(v);
                }
                ref[((size_t)t * n + k) * D + dd] = (float)s;
                tol[((size_t)t * n + k) * D + dd] = gam(n + 2.0) * m;
            }
}

/* X[k] = post[k] y + sum_j comb[j][k] X[j]: n + 1 products, n sums, the reference's rounding:
 * gamma(n + 2) sum|terms|. Control: comb read transposed in the first row (one stream: the
 * first row given the second row's comb). */
static void test_hc_post(const hcx_case *c)
{
    int T = c->T, n = c->n, D = c->D;
    size_t nx = (size_t)T * n * D;
    float *X = falloc(nx), *y = falloc((size_t)T * D), *post = falloc((size_t)T * n), *comb = falloc((size_t)T * n * n);
    float *comb2 = falloc((size_t)T * n * n), *ref = falloc(nx), *bad = falloc(nx), *cpu_X = NULL;
    double *tol = malloc(nx * sizeof(double)), *scr = malloc(nx * sizeof(double));
    fill(X, nx, -1, 1);
    fill(y, (size_t)T * D, -1, 1);
    fill(post, (size_t)T * n, 0, 2);
    fill(comb, (size_t)T * n * n, 0, 1);
    memcpy(comb2, comb, (size_t)T * n * n * 4);
    for (int j = 0; j < n; j++) /* n 1: the first row given the second row's comb */
        for (int k = 0; k < n; k++)
            comb2[j * n + k] = n > 1 ? comb[k * n + j] : comb[(size_t)n * n + j * n + k];
    post_ref(X, y, T, n, D, post, comb, ref, tol);
    post_ref(X, y, T, n, D, post, comb2, bad, scr);
    char what[160];
    for (int o = -1; o < n_others; o++) {
        const target *t = o < 0 ? &cpu_t : &others[o];
        double s = o < 0 ? 1.0 : OTHER;
        float *g = run_post(t, X, y, T, n, D, post, comb);
        snprintf(what, sizeof what, "%s on %s", c->name, t->be->name);
        CHECK(agree_within(what, g, o < 0 ? ref : cpu_X, tol, nx, s, 0), "%s: differs", what);
        float *b = o < 0 ? bad : run_post(&cpu_t, X, y, T, n, D, post, comb2);
        snprintf(what, sizeof what, "hc_post on %s: %s", t->be->name, n > 1 ? "comb transposed" : "comb of the next row");
        control_within(what, g, b, tol, nx, s);
        if (o >= 0)
            free(b);
        int same = 1;
        for (int r = 0; r < T; r++) {
            float *one = run_post(t, X + (size_t)r * n * D, y + (size_t)r * D, 1, n, D, post + r * n,
                                  comb + (size_t)r * n * n);
            same &= rows_equal(one, g + (size_t)r * n * D, (size_t)n * D);
            free(one);
        }
        report_rows(c->name, t->be->name, same, T);
        if (o < 0)
            cpu_X = g;
        else
            free(g);
    }
    free(X), free(y), free(post), free(comb), free(comb2), free(ref), free(bad), free(cpu_X), free(tol), free(scr);
}

/* ---- REF's forms: rmsnorm_rb, rope_rb, hc_post_rb ------------------------------------------------ */

/* Each _rb op, on every backend, over its whole output buffer of n floats:
 *  - its output equals the same backend's op followed by its round_bf16 over the range
 *    backend.h states, bit for bit, with no NaN (an element it skips keeps its poison);
 *    control: it differs from the op's output unrounded (the inputs are not bf16 values, so a
 *    missing rounding shows); each row alone equals the same row in the batch;
 *  - against the CPU's output (on the CPU: the double reference through bf16), within the
 *    op's bound plus the two roundings: each moves a value by at most 2^-8 of it, and the op's
 *    |y| <= |ref| + s tol, so |got - want| <= s tol + 2^-7 (|ref| + s tol) (rb_mag); the op's
 *    planted control, its wrong input run through the _rb op (the wrong reference through
 *    bf16), must fail the same comparison. */
static void rb_mag(const float *ref, const double *tol, size_t n, double s, double *mag)
{
    for (size_t i = 0; i < n; i++)
        mag[i] = s * tol[i] + 0x1p-7 * (fabs(ref[i]) + s * tol[i]);
}

/* The bitwise checks: rb the _rb op's output, sep the op then round_bf16, plain the op alone. */
static void rb_bitwise(const char *what, const float *rb, const float *sep, const float *plain, size_t n, int same_rows)
{
    size_t nan = 0;
    for (size_t i = 0; i < n; i++)
        nan += isnan(rb[i]) != 0;
    int eq = nan == 0 && !memcmp(rb, sep, n * sizeof(float)), caught = memcmp(rb, plain, n * sizeof(float)) != 0;
    CHECK(eq, "%s: differs from the op then round_bf16", what);
    CHECK(caught, "control %s: the op's unrounded output equals it", what);
    CHECK(same_rows, "%s: a row alone differs from the same row in the batch", what);
    printf("  %-52s == op + round_bf16 %s; rows alone %s; control %s\n", what, eq ? "bitwise" : "DIFFER",
           same_rows ? "bitwise" : "DIFFER", caught ? "caught" : "NOT CAUGHT");
}

/* The checks an _rb op's output y (n values, on target o: -1 the CPU) takes beside rb_bitwise:
 * within the op's bound plus the roundings (rb_mag) of the rounded reference rref (the CPU) or
 * of the CPU's output cpu_y (another backend); then, when a control b is given, apart from it by
 * more than that bound. b is freed unless it is the CPU's own rounded control rbad. */
static void rb_against(const char *what, const char *ctl, int o, const float *y, const float *ref, const float *rref,
                       const float *cpu_y, const double *tol, double *mag, size_t n, float *b, const float *rbad)
{
    rb_mag(ref, tol, n, o < 0 ? 1.0 : OTHER, mag);
    CHECK(agree_within(what, y, o < 0 ? rref : cpu_y, mag, n, 1.0, 0), "%s: differs", what);
    if (!b)
        return;
    control_within(ctl, y, b, mag, n, 1.0);
    if (b != rbad)
        free(b);
}

/* A copy of n floats through bf16 (malloc'd). */
static float *rounded_copy(const float *v, size_t n)
{
    float *r = falloc(n);
    memcpy(r, v, n * sizeof(float));
    dsv4_round_bf16(r, (int64_t)n);
    return r;
}

/* Control: rmsnorm's (the last row's x one index off). */
static void test_rmsnorm_rb(const norm_case *c)
{
    int rows = c->rows, dim = c->dim;
    size_t n = (size_t)rows * dim;
    float *x = falloc(n), *w = c->weighted ? falloc(dim) : NULL, *ref = falloc(n), *bad = falloc(n), *xs = falloc(n);
    float *cpu_y = NULL;
    double *tol = malloc(n * sizeof(double)), *scr = malloc(n * sizeof(double)), *mag = malloc(n * sizeof(double));
    fill(x, n, -2, 2);
    if (w)
        fill(w, dim, 0.5f, 1.5f);
    rmsnorm_ref(x, rows, dim, w, ref, tol);
    memcpy(xs, x, n * sizeof(float));
    swap_pair(xs + (size_t)(rows - 1) * dim, dim);
    rmsnorm_ref(xs, rows, dim, w, bad, scr);
    float *rref = rounded_copy(ref, n), *rbad = rounded_copy(bad, n);
    char what[160];
    for (int o = -1; o < n_others; o++) {
        const target *t = o < 0 ? &cpu_t : &others[o];
        float *y = run_rmsnorm_as(t, x, rows, dim, w, c->in_place, OP_RB);
        float *sep = run_rmsnorm_as(t, x, rows, dim, w, c->in_place, OP_THEN_ROUND);
        float *plain = run_rmsnorm_as(t, x, rows, dim, w, c->in_place, OP_PLAIN);
        int same = 1;
        for (int r = 0; r < rows; r++) {
            float *one = run_rmsnorm_as(t, x + (size_t)r * dim, 1, dim, w, c->in_place, OP_RB);
            same &= rows_equal(one, y + (size_t)r * dim, dim);
            free(one);
        }
        snprintf(what, sizeof what, "%s on %s", c->name, t->be->name);
        rb_bitwise(what, y, sep, plain, n, same);
        char ctl[96];
        snprintf(ctl, sizeof ctl, "rmsnorm_rb on %s: x index off", t->be->name);
        rb_against(what, ctl, o, y, ref, rref, cpu_y, tol, mag, n,
                   o < 0 ? rbad : run_rmsnorm_as(&cpu_t, xs, rows, dim, w, 0, OP_RB), rbad);
        free(sep), free(plain);
        if (o < 0)
            cpu_y = y;
        else
            free(y);
    }
    free(x), free(w), free(ref), free(bad), free(xs), free(cpu_y), free(tol), free(scr), free(mag), free(rref), free(rbad);
}

/* Control: rope's (the last row one position off; none without pairs). Range controls: the
 * rotated channels alone through bf16 (where a head has others), and the row padding through
 * bf16 too (where rows have padding), must each differ from rope_rb's output. */
static void test_rope_rb(const rope_case *c)
{
    int T = c->T, heads = c->heads, d = c->d, rd = c->rd;
    int64_t stride = (int64_t)heads * d + c->pad;
    size_t n = (size_t)T * stride;
    float *x = falloc(n), *freq = falloc(rd / 2), *ref = falloc(n), *bad = falloc(n), *cpu_y = NULL;
    int64_t *pos = calloc(T, sizeof(int64_t)), *pb = calloc(T, sizeof(int64_t));
    double *tol = malloc(n * sizeof(double)), *scr = malloc(n * sizeof(double)), *mag = malloc(n * sizeof(double));
    fill(x, n, -1, 1);
    for (int i = 0; i < rd / 2; i++)
        freq[i] = powf(10000.0f, -(float)(2 * i) / rd);
    for (int t = 0; t < T; t++)
        pos[t] = pb[t] = rnd() % 70000;
    pb[T - 1]++;
    rope_ref(x, T, stride, heads, d, rd, freq, pos, c->inverse, ref, tol);
    rope_ref(x, T, stride, heads, d, rd, freq, pb, c->inverse, bad, scr);
    /* the reference of rope_rb: every heads * d value of a row through bf16, the padding as it was */
    float *rref = falloc(n), *rbad = falloc(n);
    memcpy(rref, ref, n * sizeof(float));
    memcpy(rbad, bad, n * sizeof(float));
    for (int t = 0; t < T; t++) {
        dsv4_round_bf16(rref + (size_t)t * stride, (int64_t)heads * d);
        dsv4_round_bf16(rbad + (size_t)t * stride, (int64_t)heads * d);
    }
    char what[160];
    for (int o = -1; o < n_others; o++) {
        const target *t = o < 0 ? &cpu_t : &others[o];
        float *y = run_rope_as(t, x, T, stride, heads, d, rd, freq, pos, c->inverse, OP_RB);
        float *sep = run_rope_as(t, x, T, stride, heads, d, rd, freq, pos, c->inverse, OP_THEN_ROUND);
        float *plain = run_rope_as(t, x, T, stride, heads, d, rd, freq, pos, c->inverse, OP_PLAIN);
        int same = 1;
        for (int r = 0; r < T; r++) {
            float *one = run_rope_as(t, x + (size_t)r * stride, 1, stride, heads, d, rd, freq, pos + r, c->inverse, OP_RB);
            same &= rows_equal(one, y + (size_t)r * stride, stride);
            free(one);
        }
        snprintf(what, sizeof what, "%s on %s", c->name, t->be->name);
        rb_bitwise(what, y, sep, plain, n, same);
        if (d > rd) { /* control: the rotated channels alone rounded */
            float *part = falloc(n);
            memcpy(part, plain, n * sizeof(float));
            for (int r = 0; r < T; r++)
                for (int h = 0; h < heads; h++)
                    dsv4_round_bf16(part + (size_t)r * stride + (size_t)h * d + (d - rd), rd);
            int caught = memcmp(part, y, n * sizeof(float)) != 0;
            CHECK(caught, "control %s: the rotated channels alone rounded equal it", what);
            printf("  control %-44s %s\n", "rope_rb: the rotated channels alone rounded", caught ? "caught" : "NOT CAUGHT");
            free(part);
        }
        if (c->pad) { /* control: the padding rounded too */
            float *all = rounded_copy(sep, n);
            int caught = memcmp(all, y, n * sizeof(float)) != 0;
            CHECK(caught, "control %s: the padding rounded too equals it", what);
            printf("  control %-44s %s\n", "rope_rb: the row padding rounded too", caught ? "caught" : "NOT CAUGHT");
            free(all);
        }
        char ctl[96];
        snprintf(ctl, sizeof ctl, "rope_rb on %s: position one off", t->be->name);
        float *b = rd <= 0 ? NULL : o < 0 ? rbad : run_rope_as(&cpu_t, x, T, stride, heads, d, rd, freq, pb, c->inverse, OP_RB);
        rb_against(what, ctl, o, y, ref, rref, cpu_y, tol, mag, n, b, rbad);
        free(sep), free(plain);
        if (o < 0)
            cpu_y = y;
        else
            free(y);
    }
    free(x), free(freq), free(ref), free(bad), free(cpu_y), free(pos), free(pb), free(tol), free(scr), free(mag);
    free(rref), free(rbad);
}

/* Control: hc_post's (comb transposed; one stream: the first row given the second's comb). */
static void test_hc_post_rb(const hcx_case *c)
{
    int T = c->T, n = c->n, D = c->D;
    size_t nx = (size_t)T * n * D;
    float *X = falloc(nx), *y = falloc((size_t)T * D), *post = falloc((size_t)T * n), *comb = falloc((size_t)T * n * n);
    float *comb2 = falloc((size_t)T * n * n), *ref = falloc(nx), *bad = falloc(nx), *cpu_X = NULL;
    double *tol = malloc(nx * sizeof(double)), *scr = malloc(nx * sizeof(double)), *mag = malloc(nx * sizeof(double));
    fill(X, nx, -1, 1);
    fill(y, (size_t)T * D, -1, 1);
    fill(post, (size_t)T * n, 0, 2);
    fill(comb, (size_t)T * n * n, 0, 1);
    memcpy(comb2, comb, (size_t)T * n * n * 4);
    for (int j = 0; j < n; j++)
        for (int k = 0; k < n; k++)
            comb2[j * n + k] = n > 1 ? comb[k * n + j] : comb[(size_t)n * n + j * n + k];
    post_ref(X, y, T, n, D, post, comb, ref, tol);
    post_ref(X, y, T, n, D, post, comb2, bad, scr);
    float *rref = rounded_copy(ref, nx), *rbad = rounded_copy(bad, nx);
    char what[160];
    for (int o = -1; o < n_others; o++) {
        const target *t = o < 0 ? &cpu_t : &others[o];
        float *g = run_post_as(t, X, y, T, n, D, post, comb, OP_RB);
        float *sep = run_post_as(t, X, y, T, n, D, post, comb, OP_THEN_ROUND);
        float *plain = run_post_as(t, X, y, T, n, D, post, comb, OP_PLAIN);
        int same = 1;
        for (int r = 0; r < T; r++) {
            float *one = run_post_as(t, X + (size_t)r * n * D, y + (size_t)r * D, 1, n, D, post + r * n,
                                     comb + (size_t)r * n * n, OP_RB);
            same &= rows_equal(one, g + (size_t)r * n * D, (size_t)n * D);
            free(one);
        }
        snprintf(what, sizeof what, "%s on %s", c->name, t->be->name);
        rb_bitwise(what, g, sep, plain, nx, same);
        char ctl[96];
        snprintf(ctl, sizeof ctl, "hc_post_rb on %s: %s", t->be->name, n > 1 ? "comb transposed" : "comb of the next row");
        rb_against(what, ctl, o, g, ref, rref, cpu_X, tol, mag, nx,
                   o < 0 ? rbad : run_post_as(&cpu_t, X, y, T, n, D, post, comb2, OP_RB), rbad);
        free(sep), free(plain);
        if (o < 0)
            cpu_X = g;
        else
            free(g);
    }
    free(X), free(y), free(post), free(comb), free(comb2), free(ref), free(bad), free(cpu_X), free(tol), free(scr);
    free(mag), free(rref), free(rbad);
}

/* ---- attend ------------------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    int H, d, nk, pool;
} attend_case;

/* keys: rows kidx of the pool [np, d], with the pool, the key table, q, sink and out all in the
 * backend's memory. */
static float *run_attend(const target *t, const float *q, int H, int d, const float *pool, int np, const int *kidx,
                         int nk, float scale, const float *sink)
{
    const dsv4_backend *be = t->be;
    float *dq = bput(be, q, (size_t)H * d * 4), *ds = bput(be, sink, H * 4);
    float *dpool = bput(be, pool, (size_t)np * d * 4);
    const float **keys = malloc((nk + 1) * sizeof *keys);
    for (int i = 0; i < nk; i++)
        keys[i] = dpool + (size_t)kidx[i] * d;
    const float **dkeys = bput(be, keys, (size_t)nk * sizeof *keys);
    float *dout = bpoison(be, (size_t)H * d);
    be->attend(dq, H, d, dkeys, nk, scale, ds, dout);
    float *o = bget(be, dout, (size_t)H * d * 4);
    bok(be, "attend");
    be->free(dq), be->free(ds), be->free(dout), be->free(dpool), be->free(dkeys);
    free(keys);
    return o;
}

/* Per head, in double: s_i = (q . k_i) scale, p = softmax over (s_1.., sink), out = sum p_i k_i.
 * Bound, first order: a score's error is gamma(d) sum|q k| scale + u |s| (the scale's product);
 * an exponential's relative error that plus u |s - max| (the shift) plus 4 u (expf); a weight
 * p_i's relative error is twice the largest of those plus gamma(nk + 2) (the denominator's sum,
 * the quotient); out_j's error is sum_i p_i |k_ij| (that + gamma(nk + 1)). */
static void attend_ref(const float *q, int H, int d, const float *const *rows, int nk, float scale, const float *sink,
                       float *ref, double *tol)
{
    double *s = malloc((nk + 1) * sizeof(double));
    for (int h = 0; h < H; h++) {
        const float *qh = q + (size_t)h * d;
        double mx = sink[h], worst = 0;
        for (int i = 0; i < nk; i++) {
            double v = 0, m = 0;
            for (int j = 0; j < d; j++) {
                v += (double)qh[j] * rows[i][j];
                m += fabs((double)qh[j] * rows[i][j]);
            }
            s[i] = v * scale;
            worst = fmax(worst, gam(d) * m * scale + U * fabs(s[i]));
            mx = fmax(mx, s[i]);
        }
        double den = exp(sink[h] - mx), ew = U * fabs(sink[h] - mx);
        for (int i = 0; i < nk; i++) {
            den += exp(s[i] - mx);
            ew = fmax(ew, U * fabs(s[i] - mx));
        }
        double ep = 2 * (worst + ew + 4 * U) + gam(nk + 2.0);
        for (int j = 0; j < d; j++) {
            double o = 0, m = 0;
            for (int i = 0; i < nk; i++) {
                double p = exp(s[i] - mx) / den;
                o += p * rows[i][j];
                m += p * fabs(rows[i][j]);
            }
            ref[(size_t)h * d + j] = (float)o;
            tol[(size_t)h * d + j] = m * (ep + gam(nk + 1.0)) + U * fabs(o);
        }
    }
    free(s);
}

/* Control: one key one place off. Heads: each head alone (H = 1) equals the same head in the
 * full call, bit for bit. */
static void test_attend(const attend_case *c)
{
    int H = c->H, d = c->d, nk = c->nk;
    float *q = falloc((size_t)H * d), *pool = falloc((size_t)c->pool * d), *sink = falloc(H);
    float *ref = falloc((size_t)H * d), *bad = falloc((size_t)H * d), *cpu_o = NULL;
    double *tol = malloc((size_t)H * d * sizeof(double)), *scr = malloc((size_t)H * d * sizeof(double));
    int *kidx = malloc((nk + 1) * sizeof(int)), *kb = malloc((nk + 1) * sizeof(int));
    const float **rows = malloc((nk + 1) * sizeof *rows);
    fill(q, (size_t)H * d, -1, 1);
    fill(pool, (size_t)c->pool * d, -1, 1);
    fill(sink, H, -1, 1);
    for (int i = 0; i < nk; i++)
        kidx[i] = kb[i] = rnd() % c->pool;
    if (nk)
        kb[nk / 2] = (kidx[nk / 2] + 1) % c->pool;
    float scale = 1.0f / sqrtf((float)d);
    for (int i = 0; i < nk; i++)
        rows[i] = pool + (size_t)kidx[i] * d;
    attend_ref(q, H, d, rows, nk, scale, sink, ref, tol);
    for (int i = 0; i < nk; i++)
        rows[i] = pool + (size_t)kb[i] * d;
    attend_ref(q, H, d, rows, nk, scale, sink, bad, scr);
    char what[160];
    for (int o = -1; o < n_others; o++) {
        const target *t = o < 0 ? &cpu_t : &others[o];
        double s = o < 0 ? 1.0 : OTHER;
        float *g = run_attend(t, q, H, d, pool, c->pool, kidx, nk, scale, sink);
        snprintf(what, sizeof what, "%s on %s", c->name, t->be->name);
        CHECK(agree_within(what, g, o < 0 ? ref : cpu_o, tol, (size_t)H * d, s, 0), "%s: differs", what);
        if (nk) {
            float *b = o < 0 ? bad : run_attend(&cpu_t, q, H, d, pool, c->pool, kb, nk, scale, sink);
            snprintf(what, sizeof what, "attend on %s: a key one place off", t->be->name);
            control_within(what, g, b, tol, (size_t)H * d, s);
            if (o >= 0)
                free(b);
        } else /* no keys: only the sink, so out is 0 exactly */
            for (int i = 0; i < H * d; i++)
                CHECK(g[i] == 0.0f, "%s: out[%d] = %g with no keys", what, i, g[i]);
        int same = 1;
        for (int h = 0; h < H; h++) {
            float *one = run_attend(t, q + (size_t)h * d, 1, d, pool, c->pool, kidx, nk, scale, sink + h);
            same &= rows_equal(one, g + (size_t)h * d, d);
            free(one);
        }
        report_rows(c->name, t->be->name, same, H);
        if (o < 0)
            cpu_o = g;
        else
            free(g);
    }
    free(q), free(pool), free(sink), free(ref), free(bad), free(cpu_o), free(tol), free(scr), free(kidx), free(kb);
    free(rows);
}

/* ---- route -------------------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    int R, E, K;
    int ties, bias, hash, norm; /* ties: logits and bias from a few values, so exact ties are everywhere */
} route_case;

typedef struct {
    int32_t *eid;
    float *wts;
} route_out;

static route_out run_route(const target *t, const route_case *c, int R, const float *lg, const float *bias,
                           const int32_t *t2e, int vocab, const int32_t *ids)
{
    const dsv4_backend *be = t->be;
    int E = c->E, K = c->K;
    float *dlg = bput(be, lg, (size_t)R * E * 4), *db = bias ? bput(be, bias, E * 4) : NULL;
    int32_t *dt = t2e ? bput(be, t2e, (size_t)vocab * K * 4) : NULL, *di = bput(be, ids, R * 4);
    int32_t *de = bput(be, NULL, (size_t)R * K * 4);
    float *dw = bpoison(be, (size_t)R * K);
    int32_t *neg = malloc((size_t)R * K * 4);
    for (int i = 0; i < R * K; i++)
        neg[i] = -1; /* poisoned ids: an unwritten one is no expert */
    be->upload(de, neg, (size_t)R * K * 4);
    free(neg);
    be->route(dlg, R, E, K, db, dt, di, c->norm, 2.5f, de, dw);
    route_out o = {bget(be, de, (size_t)R * K * 4), bget(be, dw, (size_t)R * K * 4)};
    bok(be, "route");
    be->free(dlg), be->free(di), be->free(de), be->free(dw);
    if (db)
        be->free(db);
    if (dt)
        be->free(dt);
    return o;
}

static double softplus_d(double x) { return log1p(exp(x)); }

/* In double: s = sqrt(softplus(lg)); the experts tid2eid[ids[r]] (hash), else the K best of
 * s + bias, ties to the lower expert, best first; w = s_e (over sum + 1e-20 when norm) times
 * route_scale. A score s is within 8 u of its value (expf, log1pf, sqrtf, each within 2 ulp,
 * the last halving what it is given); a weight's bound is |w| (2 8 u + gamma(K + 3)) with
 * norm (the sum, + 1e-20, the quotient, the scale), |w| (8 u + 2 u) without. higher: ties go
 * to the higher expert instead (a control). Returns v, the selection scores s + bias [R, E]. */
static double *route_ref(const route_case *c, const float *lg, const float *bias, const int32_t *t2e,
                         const int32_t *ids, int higher, int32_t *eid, float *wts, double *tol)
{
    int R = c->R, E = c->E, K = c->K;
    double *v = malloc((size_t)R * E * sizeof(double)), *s = malloc(E * sizeof(double));
    for (int r = 0; r < R; r++) {
        for (int e = 0; e < E; e++) {
            s[e] = sqrt(softplus_d(lg[(size_t)r * E + e]));
            v[(size_t)r * E + e] = s[e] + (bias ? bias[e] : 0.0);
        }
        int32_t *ch = eid + (size_t)r * K;
        for (int k = 0; k < K; k++) {
            if (t2e) {
                ch[k] = t2e[(size_t)ids[r] * K + k];
                continue;
            }
            int best = -1;
            for (int e = 0; e < E; e++) {
                int used = 0;
                for (int j = 0; j < k; j++)
                    used |= ch[j] == e;
                double x = v[(size_t)r * E + e];
                if (!used && (best < 0 || x > v[(size_t)r * E + best] || (higher && x == v[(size_t)r * E + best])))
                    best = e;
            }
            ch[k] = best;
        }
        double sum = 0;
        for (int k = 0; k < K; k++)
            sum += s[ch[k]];
        for (int k = 0; k < K; k++) {
            double w = (c->norm ? s[ch[k]] / (sum + 1e-20) : s[ch[k]]) * 2.5;
            wts[(size_t)r * K + k] = (float)w;
            tol[(size_t)r * K + k] = fabs(w) * (c->norm ? 16 * U + gam(K + 3.0) : 10 * U);
        }
    }
    free(s);
    return v;
}

/* The experts must be the reference's; a pair of continuous scores within their bounds
 * (16 u relative) of each other may come in either order (counted, "near ties"), and that
 * row's weights are then compared in the reference's order of the op's experts. Controls: ties
 * to the higher expert (ties cases) or the weights one expert off (the others). Rows: alone. */
static void test_route(const route_case *c)
{
    int R = c->R, E = c->E, K = c->K, vocab = 50;
    const float qv[5] = {-1.0f, 0.0f, 0.5f, 1.0f, 2.0f};
    float *lg = falloc((size_t)R * E), *bias = c->bias ? falloc(E) : NULL;
    for (size_t i = 0; i < (size_t)R * E; i++)
        lg[i] = c->ties ? qv[rnd() % 5] : frand(-3, 3);
    for (int e = 0; c->bias && e < E; e++)
        bias[e] = c->ties ? 0.25f * (rnd() % 3) : frand(-0.5f, 0.5f);
    int32_t *t2e = NULL, *ids = malloc(R * 4);
    for (int r = 0; r < R; r++)
        ids[r] = rnd() % vocab;
    if (c->hash) {
        t2e = malloc((size_t)vocab * K * 4);
        for (int i = 0; i < vocab * K; i++)
            t2e[i] = rnd() % E;
    }
    size_t RK = (size_t)R * K;
    int32_t *eref = malloc(RK * 4), *ebad = malloc(RK * 4);
    float *wref = falloc(RK), *wbad = falloc(RK);
    double *tol = malloc(RK * sizeof(double)), *scr = malloc(RK * sizeof(double));
    double *v = route_ref(c, lg, bias, t2e, ids, 0, eref, wref, tol);
    free(route_ref(c, lg, bias, t2e, ids, 1, ebad, wbad, scr));
    route_out cpu_o = {0};
    char what[160];
    for (int o = -1; o < n_others; o++) {
        const target *t = o < 0 ? &cpu_t : &others[o];
        route_out g = run_route(t, c, R, lg, bias, t2e, vocab, ids);
        int exact = 1, near = 0;
        float *wcmp = falloc(RK);
        memcpy(wcmp, wref, RK * 4);
        for (int r = 0; r < R; r++) {
            const int32_t *a = g.eid + (size_t)r * K, *b = eref + (size_t)r * K;
            if (!memcmp(a, b, K * 4))
                continue;
            int ok = !c->ties && !c->hash;
            for (int k = 0; ok && k < K; k++) {
                double va = a[k] >= 0 && a[k] < E ? v[(size_t)r * E + a[k]] : -1e30, vb = v[(size_t)r * E + b[k]];
                ok = a[k] == b[k] || fabs(va - vb) <= 16 * U * fmax(fabs(va), fabs(vb));
            }
            exact &= ok;
            near += ok;
            if (ok) { /* the reference's weights of the op's experts */
                double s[64], sum = 0;
                for (int k = 0; k < K; k++)
                    sum += s[k] = sqrt(softplus_d(lg[(size_t)r * E + a[k]]));
                for (int k = 0; k < K; k++)
                    wcmp[(size_t)r * K + k] = (float)((c->norm ? s[k] / (sum + 1e-20) : s[k]) * 2.5);
            }
        }
        snprintf(what, sizeof what, "%s on %s", c->name, t->be->name);
        CHECK(exact, "%s: other experts than the reference's", what);
        CHECK(agree_within(what, g.wts, wcmp, tol, RK, o < 0 ? 1.0 : OTHER, 0), "%s: weights differ", what);
        printf("  %-52s experts %s (%d near ties)\n", what, exact ? "as the reference" : "DIFFERENT", near);
        if (c->ties && !c->hash) {
            int caught = memcmp(g.eid, ebad, RK * 4) != 0;
            CHECK(caught, "%s: control (ties to the higher expert) not caught", what);
            printf("  control %-44s %s\n", "route ties to the higher expert", caught ? "caught" : "NOT CAUGHT");
        } else {
            float *sh = falloc(RK);
            for (size_t i = 0; i < RK; i++)
                sh[i] = wcmp[i - i % K + (i % K + 1) % K];
            snprintf(what, sizeof what, "route on %s: weights one expert off", t->be->name);
            control_within(what, g.wts, sh, tol, RK, o < 0 ? 1.0 : OTHER);
            free(sh);
        }
        int same = 1;
        for (int r = 0; r < R; r++) {
            route_out one = run_route(t, c, 1, lg + (size_t)r * E, bias, t2e, vocab, ids + r);
            same &= !memcmp(one.eid, g.eid + (size_t)r * K, K * 4) && rows_equal(one.wts, g.wts + (size_t)r * K, K);
            free(one.eid), free(one.wts);
        }
        report_rows(c->name, t->be->name, same, R);
        free(wcmp);
        if (o < 0)
            cpu_o = g;
        else
            free(g.eid), free(g.wts);
    }
    free(cpu_o.eid), free(cpu_o.wts);
    free(lg), free(bias), free(t2e), free(ids), free(eref), free(ebad), free(wref), free(wbad), free(tol), free(scr), free(v);
}

/* ---- experts ------------------------------------------------------------------------------------ */

typedef struct {
    const char *name;
    dsv4_wform form;
    int R, E, K, D, I, pre_weight;
    float limit;
} experts_case;

static float *run_experts(const target *t, const dsv4_experts_args *a)
{
    const dsv4_backend *be = t->be;
    int R = a->R, K = a->K, D = a->D;
    size_t wn = DSV4_EXPERTS_WORK(R, K, D, a->I, a->E);
    dsv4_experts_args b = *a;
    b.x = bput(be, a->x, (size_t)R * D * 4);
    b.wts = bput(be, a->wts, (size_t)R * K * 4);
    b.eid = bput(be, a->eid, (size_t)R * K * 4);
    b.y = bpoison(be, (size_t)R * D);
    b.work = bpoison(be, wn);
    be->experts(&b);
    float *y = bget(be, b.y, (size_t)R * D * 4);
    bok(be, "experts");
    be->free((void *)b.x), be->free((void *)b.wts), be->free((void *)b.eid), be->free(b.y), be->free(b.work);
    return y;
}

static double silu_d(double a) { return a / (1 + exp(-a)); }

/* In double: for each row's k-th expert e with weight w: g = W1[e] x, u = W3[e] x, h =
 * silu(min(g, L)) clamp(u, L) (times w when pre-weighted), y = sum_k (pre ? 1 : w) W2[e] h.
 * Bound, first order: g and u within gamma(D + 4) sum|W x| (linear_ref); h's error |silu'| dg
 * |u| + |silu| du (|silu'| <= 1.1; min and clamp pass at most what they are given) + 8 u |h|
 * (swiglu) (+ u when pre-weighted, times |w|); W2 h's error sum_j |W2_dj| dh_j + gamma(I + 4)
 * sum|W2 h|; the weighted sum over K adds gamma(K + 1) sum|c y| (c = pre ? 1 : w). */
static void experts_ref(const experts_case *c, double *const *W1, double *const *W2, double *const *W3,
                        const int32_t *eid, const float *wts, const float *x, float *ref, double *tol)
{
    int R = c->R, K = c->K, D = c->D, I = c->I;
    double *h = malloc(I * sizeof(double)), *dh = malloc(I * sizeof(double));
    for (int r = 0; r < R; r++) {
        const float *xr = x + (size_t)r * D;
        double *y = calloc(D, sizeof(double)), *dy = calloc(D, sizeof(double)), *ay = calloc(D, sizeof(double));
        for (int k = 0; k < K; k++) {
            int e = eid[r * K + k];
            double w = wts[r * K + k], cw = c->pre_weight ? 1.0 : w, hw = c->pre_weight ? w : 1.0;
            for (int i = 0; i < I; i++) {
                double g = 0, u = 0, ag = 0, au = 0;
                for (int j = 0; j < D; j++) {
                    g += W1[e][(size_t)i * D + j] * xr[j], ag += fabs(W1[e][(size_t)i * D + j] * xr[j]);
                    u += W3[e][(size_t)i * D + j] * xr[j], au += fabs(W3[e][(size_t)i * D + j] * xr[j]);
                }
                double dg = gam(D + 4.0) * ag, du = gam(D + 4.0) * au;
                if (c->limit > 0) {
                    g = fmin(g, c->limit);
                    u = fmin(fmax(u, -c->limit), c->limit);
                }
                double sv = silu_d(g);
                h[i] = sv * u * hw;
                dh[i] = (1.1 * dg * fabs(u) + fabs(sv) * du + 8 * U * fabs(sv * u)) * fabs(hw) +
                        (c->pre_weight ? U * fabs(h[i]) : 0);
            }
            for (int dd = 0; dd < D; dd++) {
                double s = 0, m = 0, p = 0;
                for (int j = 0; j < I; j++) {
                    double a = W2[e][(size_t)dd * I + j];
                    s += a * h[j], m += fabs(a * h[j]), p += fabs(a) * dh[j];
                }
                y[dd] += cw * s;
                dy[dd] += fabs(cw) * (p + gam(I + 4.0) * m);
                ay[dd] += fabs(cw * s);
            }
        }
        for (int dd = 0; dd < D; dd++) {
            ref[(size_t)r * D + dd] = (float)y[dd];
            tol[(size_t)r * D + dd] = dy[dd] + gam(K + 1.0) * ay[dd];
        }
        free(y), free(dy), free(ay);
    }
    free(h), free(dh);
}

/* Whether each row of a (host arguments) run alone gives y's row, bit for bit. */
static int experts_rows_alone(const target *t, const dsv4_experts_args *a, const float *y)
{
    int same = 1, K = a->K, D = a->D;
    for (int r = 0; r < a->R; r++) {
        dsv4_experts_args one = *a;
        one.R = 1, one.eid = a->eid + r * K, one.wts = a->wts + r * K, one.x = a->x + (size_t)r * D;
        float *y1 = run_experts(t, &one);
        same &= rows_equal(y1, y + (size_t)r * D, D);
        free(y1);
    }
    return same;
}

/* Control: the last pair's expert one off. Rows: each alone, also with the V4.1 REF numerics
 * (ref = 1, whose values are the fixtures' business: test_v41_fixtures), where the tensor cores
 * take the quantized x and h as one term. */
static void test_experts(const experts_case *c)
{
    int R = c->R, E = c->E, K = c->K, D = c->D, I = c->I, RK = R * K;
    int bn = c->form == DSV4_WF_FP8 ? 128 : 1, bk = c->form == DSV4_WF_FP8 ? 128 : 32;
    dsv4_weight *w = calloc(3 * E, sizeof *w); /* w1 [0, E), w2 [E, 2E), w3 [2E, 3E) */
    double **W = malloc(3 * E * sizeof *W);
    for (int e = 0; e < E; e++) {
        make_weight(c->form, I, D, bn, bk, 1, &w[e]);
        make_weight(c->form, D, I, bn, bk, 1, &w[E + e]);
        make_weight(c->form, I, D, bn, bk, 1, &w[2 * E + e]);
    }
    for (int i = 0; i < 3 * E; i++)
        W[i] = w_dense(&w[i]);
    float *x = falloc((size_t)R * D), *wts = falloc(RK), *ref = falloc((size_t)R * D), *bad = falloc((size_t)R * D);
    int32_t *eid = malloc(RK * 4), *e2 = malloc(RK * 4);
    fill(x, (size_t)R * D, -1, 1);
    fill(wts, RK, 0.1f, 1.0f);
    distinct_experts(eid, R, K, E);
    memcpy(e2, eid, RK * 4);
    for (int r = 0; r < R; r++) { /* the control: every row's last expert another one not in the row */
        int32_t *er = e2 + (size_t)r * K, e = er[K - 1], used = 1;
        while (used) {
            e = (e + 1) % E;
            used = 0;
            for (int k = 0; k < K; k++)
                used |= er[k] == e;
        }
        er[K - 1] = e;
    }
    double *tol = malloc((size_t)R * D * sizeof(double)), *scr = malloc((size_t)R * D * sizeof(double));
    experts_ref(c, W, W + E, W + 2 * E, eid, wts, x, ref, tol);
    experts_ref(c, W, W + E, W + 2 * E, e2, wts, x, bad, scr);
    dsv4_experts_args a = {.w1 = w, .w2 = w + E, .w3 = w + 2 * E, .E = E, .K = K, .R = R, .D = D, .I = I,
                           .eid = eid, .wts = wts, .x = x, .limit = c->limit, .pre_weight = c->pre_weight};
    float *cpu_y = NULL;
    char what[160];
    for (int o = -1; o < n_others; o++) {
        const target *t = o < 0 ? &cpu_t : &others[o];
        double s = o < 0 ? 1.0 : OTHER;
        put_weights(t, w, 3 * E);
        float *y = run_experts(t, &a);
        snprintf(what, sizeof what, "%s on %s", c->name, t->be->name);
        CHECK(agree_within(what, y, o < 0 ? ref : cpu_y, tol, (size_t)R * D, s, 0), "%s: differs", what);
        dsv4_experts_args ab = a;
        ab.eid = e2;
        float *b = o < 0 ? bad : run_experts(&cpu_t, &ab);
        snprintf(what, sizeof what, "experts on %s: an expert id off", t->be->name);
        control_within(what, y, b, tol, (size_t)R * D, s);
        if (o >= 0)
            free(b);
        report_rows(c->name, t->be->name, experts_rows_alone(t, &a, y), R);
        if (c->form == DSV4_WF_FP8 || c->form == DSV4_WF_FP4) {
            dsv4_experts_args ar = a;
            ar.ref = 1;
            float *yr = run_experts(t, &ar);
            snprintf(what, sizeof what, "%s, ref", c->name);
            report_rows(what, t->be->name, experts_rows_alone(t, &ar, yr), R);
            free(yr);
        }
        drop_weights(t, w, 3 * E);
        if (o < 0)
            cpu_y = y;
        else
            free(y);
    }
    for (int i = 0; i < 3 * E; i++)
        free_weight(&w[i]), free(W[i]);
    free(w), free(W), free(x), free(wts), free(ref), free(bad), free(eid), free(e2), free(tol), free(scr), free(cpu_y);
}

/* ---- the table itself: recording, check, attn_work, kv_production ------------------------------ */

/* Recording (graph_*): all four entries or none. Where there are: rmsnorm -> add recorded over
 * backend buffers, replayed with new input contents, equals the ops run directly, bit for bit;
 * control: a replay that was not run leaves the output as it was (the comparison then fails). */
static void test_table(const target *t)
{
    const dsv4_backend *be = t->be;
    int all = be->graph_begin && be->graph_end && be->graph_run && be->graph_free;
    int none = !be->graph_begin && !be->graph_end && !be->graph_run && !be->graph_free;
    CHECK(be->name && be->name[0], "a backend without a name");
    CHECK(all || none, "%s: some of the graph entries are missing", be->name);
    CHECK(be->alloc && be->free && be->upload && be->download && be->copy && be->linear && be->linear_blocks &&
              be->linear_multi && be->embed && be->rmsnorm && be->rope && be->hc_pre && be->hc_collapse && be->engram_gate &&
              be->hc_post && be->attend && be->attn_step && be->attn_step41 && be->route && be->experts && be->add &&
              be->swiglu && be->scale && be->copy2d && be->linear_q && be->round_bf16 && be->roundtrip && be->rmsnorm_rb &&
              be->rope_rb && be->hc_post_rb,
          "%s: an op of the table is missing", be->name);
    printf("  table of %-42s recording %s, check %s, attn_work %s, production caches %s\n", be->name,
           all ? "yes" : "none", be->check ? "yes" : "none", be->attn_work ? "yes" : "DSV4_ATTN_WORK",
           be->kv_production ? "yes" : "no");
    if (!all)
        return;
    int T = 3, D = 256;
    size_t n = (size_t)T * D;
    float *x = falloc(n), *b = falloc(n), *nw = falloc(D), *eager = falloc(n), *rep = falloc(n);
    fill(nw, D, 0.5f, 1.5f);
    float *dx = bput(be, NULL, n * 4), *db = bput(be, NULL, n * 4), *dh = bput(be, NULL, n * 4);
    float *dz = bput(be, NULL, n * 4), *dw = bput(be, nw, D * 4);
    CHECK(!be->graph_begin(), "%s: graph_begin failed", be->name);
    be->rmsnorm(dx, T, D, dw, 1e-6f, dh);
    be->add(dh, db, (int64_t)n, dz);
    void *g = be->graph_end();
    CHECK(g != NULL, "%s: the recording failed", be->name);
    int same = 1, caught = 1;
    for (int it = 0; it < 3 && g; it++) {
        fill(x, n, -1, 1);
        fill(b, n, -1, 1);
        be->upload(dx, x, n * 4);
        be->upload(db, b, n * 4);
        be->rmsnorm(dx, T, D, dw, 1e-6f, dh);
        be->add(dh, db, (int64_t)n, dz);
        be->download(eager, dz, n * 4);
        float *p = falloc(n);
        poison(p, n);
        be->upload(dz, p, n * 4);
        be->download(rep, dz, n * 4); /* the control: no replay yet, so no match */
        caught &= !rows_equal(rep, eager, n);
        be->graph_run(g);
        be->download(rep, dz, n * 4);
        same &= rows_equal(rep, eager, n);
        free(p);
    }
    bok(be, "graph");
    CHECK(same, "%s: a replay differs from the ops run directly", be->name);
    CHECK(caught, "%s: control: the output matched before the replay ran", be->name);
    printf("  recording on %-38s 3 replays with new inputs == direct: %s\n", be->name, same ? "bitwise" : "DIFFERENT");
    if (g)
        be->graph_free(g);
    be->free(dx), be->free(db), be->free(dh), be->free(dz), be->free(dw);
    free(x), free(b), free(nw), free(eager), free(rep);
}

/* ---- attn_step ------------------------------------------------------------------------------------ */

typedef struct {
    const char *name;
    int S;
    int64_t start[3];
    int n[3];
    int H, d, rd, W, ratio, csa, ci, nI, topk, kv_cap, c_cap;
    int64_t vis_cap;
    int ties; /* indexer keys planted exactly tied (more than topk of them) */
    int prod; /* production caches: window rows, entries and indexer keys stored packed */
} attn_case;

/* A sequence's layer buffers on the host: f kv, c, z, ent, ic, iz, ikey (floats); p pkv, pent,
 * pikey (packed rows). */
typedef struct {
    float *f[7];
    uint8_t *p[3];
} seq_state;

static void state_sizes(const attn_case *c, size_t fsz[7], size_t psz[3])
{
    int cw = (1 + c->csa) * c->d;
    fsz[0] = c->prod ? 0 : (size_t)c->kv_cap * c->d;
    fsz[1] = fsz[2] = c->ratio ? (size_t)c->c_cap * cw : 0;
    fsz[3] = c->ratio && !c->prod ? (size_t)c->vis_cap * c->d : 0;
    fsz[4] = fsz[5] = c->csa ? (size_t)c->c_cap * 2 * c->ci : 0;
    fsz[6] = c->csa && !c->prod ? (size_t)c->vis_cap * c->ci : 0;
    psz[0] = c->prod ? (size_t)c->kv_cap * dsv4_kv_row_bytes(DSV4_KV_WINDOW, c->d) : 0;
    psz[1] = c->prod && c->ratio ? (size_t)c->vis_cap * dsv4_kv_row_bytes(DSV4_KV_MAIN, c->d) : 0;
    psz[2] = c->prod && c->csa ? (size_t)c->vis_cap * dsv4_kv_row_bytes(DSV4_KV_INDEX, c->ci) : 0;
}

static void state_copy(const attn_case *c, seq_state *dst, const seq_state *src)
{
    size_t fsz[7], psz[3];
    state_sizes(c, fsz, psz);
    for (int k = 0; k < 7; k++) {
        dst->f[k] = fsz[k] ? falloc(fsz[k]) : NULL;
        if (fsz[k])
            memcpy(dst->f[k], src->f[k], fsz[k] * 4);
    }
    for (int k = 0; k < 3; k++) {
        dst->p[k] = psz[k] ? malloc(psz[k]) : NULL;
        if (psz[k])
            memcpy(dst->p[k], src->p[k], psz[k]);
    }
}

static void state_free(seq_state *s, int n)
{
    for (int j = 0; j < n; j++) {
        for (int k = 0; k < 7; k++)
            free(s[j].f[k]);
        for (int k = 0; k < 3; k++)
            free(s[j].p[k]);
    }
}

static int states_equal(const attn_case *c, const seq_state *a, const seq_state *b)
{
    size_t fsz[7], psz[3];
    state_sizes(c, fsz, psz);
    int same = 1;
    for (int k = 0; k < 7; k++)
        same &= !fsz[k] || !memcmp(a->f[k], b->f[k], fsz[k] * 4);
    for (int k = 0; k < 3; k++)
        same &= !psz[k] || !memcmp(a->p[k], b->p[k], psz[k]);
    return same;
}

/* The step's inputs for every row of every sequence (sequence s's rows i = 0..n[s] at
 * positions start[s] + i, sequences in order) and the layer's constants. */
typedef struct {
    int R;
    float *q, *kv, *cc, *zz, *ic, *iz, *qi, *wt;
    float *sink, *ifreq, *ape, *norm, *iape, *inorm;
} step_in;

static int row_of(const attn_case *c, int s, int i)
{
    int r = i;
    for (int t = 0; t < s; t++)
        r += c->n[t];
    return r;
}

/* The op on t for rows [lo[s], hi[s]) of each sequence (those with any), from the states
 * init; the final states into fin (every sequence: copies of init where not in the step), o of
 * the step's rows into *o (in row order). window: the layer's window. */
static void run_attn(const target *t, const attn_case *c, const step_in *in, const int *lo, const int *hi,
                     seq_state *const *init, seq_state *fin, float **o, int window)
{
    const dsv4_backend *be = t->be;
    size_t fsz[7], psz[3];
    state_sizes(c, fsz, psz);
    int cw = (1 + c->csa) * c->d, iw = 2 * c->ci, Hd = c->H * c->d, nIc = c->nI * c->ci;
    int64_t pos[64], start[3];
    int32_t seq[64], first[3];
    int which[3], ns = 0, R = 0;
    for (int s = 0; s < c->S; s++) {
        if (hi[s] <= lo[s])
            continue;
        which[ns] = s;
        start[ns] = c->start[s] + lo[s];
        first[ns] = R;
        for (int i = lo[s]; i < hi[s]; i++, R++) {
            pos[R] = c->start[s] + i;
            seq[R] = ns;
        }
        ns++;
    }
    /* the rows' inputs gathered */
    const float *src[8] = {in->q, in->kv, in->cc, in->zz, in->ic, in->iz, in->qi, in->wt};
    int wid[8] = {Hd, c->d, cw, cw, iw, iw, nIc, c->nI};
    float *dbuf[8];
    for (int b = 0; b < 8; b++) {
        float *h = falloc((size_t)R * wid[b]);
        int r = 0;
        for (int j = 0; j < ns; j++)
            for (int i = lo[which[j]]; i < hi[which[j]]; i++, r++)
                memcpy(h + (size_t)r * wid[b], src[b] + (size_t)row_of(c, which[j], i) * wid[b], wid[b] * 4);
        dbuf[b] = bput(be, h, (size_t)R * wid[b] * 4);
        free(h);
    }
    dsv4_lbufs hst[3];
    float *dsf[3][7];
    uint8_t *dsp[3][3];
    memset(hst, 0, sizeof hst);
    for (int j = 0; j < ns; j++) {
        const seq_state *st = init[which[j]];
        for (int k = 0; k < 7; k++)
            dsf[j][k] = fsz[k] ? bput(be, st->f[k], fsz[k] * 4) : NULL;
        for (int k = 0; k < 3; k++)
            dsp[j][k] = psz[k] ? bput(be, st->p[k], psz[k]) : NULL;
        hst[j] = (dsv4_lbufs){.kv = dsf[j][0], .c = dsf[j][1], .z = dsf[j][2], .ent = dsf[j][3], .ic = dsf[j][4],
                              .iz = dsf[j][5], .ikey = dsf[j][6], .pkv = dsp[j][0], .pent = dsp[j][1], .pikey = dsp[j][2]};
    }
    int m = c->ratio ? c->ratio : 1;
    float *dk[6] = {bput(be, in->sink, c->H * 4), bput(be, in->ifreq, c->rd / 2 * 4), bput(be, in->ape, (size_t)m * cw * 4),
                    bput(be, in->norm, c->d * 4), bput(be, in->iape, (size_t)m * iw * 4), bput(be, in->inorm, (c->ci + 1) * 4)};
    dsv4_attn_args a = {
        .rows = {.R = R, .S = ns, .pos = bput(be, pos, R * 8), .seq = bput(be, seq, R * 4),
                 .start = bput(be, start, ns * 8), .first = bput(be, first, ns * 4)},
        .st = bput(be, hst, ns * sizeof(dsv4_lbufs)),
        .kv_cap = c->kv_cap, .c_cap = c->c_cap, .vis_cap = c->vis_cap,
        .H = c->H, .d = c->d, .rd = c->rd, .window = window,
        .scale = 1.0f / sqrtf((float)c->d), .eps = 1e-6f,
        .sink = dk[0], .inv_freq = dk[1],
        .ratio = c->ratio, .csa = c->csa,
        .comp = {.ratio = c->ratio, .dim = c->d, .overlap = c->csa, .ape = dk[2], .norm = dk[3]},
        .icomp = {.ratio = c->ratio, .dim = c->ci, .overlap = 1, .ape = dk[4], .norm = dk[5]},
        .nI = c->nI, .ci = c->ci, .topk = c->topk, .iw_scale = 0.7f,
        .q = dbuf[0], .kv = dbuf[1], .cc = dbuf[2], .zz = dbuf[3], .ic = dbuf[4], .iz = dbuf[5], .qi = dbuf[6], .wt = dbuf[7],
        .o = bpoison(be, (size_t)R * Hd), .kv_prod = c->prod,
    };
    size_t wn = be->attn_work ? be->attn_work(&a) : DSV4_ATTN_WORK(R, c->vis_cap, c->topk);
    a.work = wn ? bpoison(be, wn) : NULL;
    a.work_n = wn;
    be->attn_step(&a);
    *o = bget(be, a.o, (size_t)R * Hd * 4);
    for (int s = 0; s < c->S; s++)
        state_copy(c, &fin[s], init[s]);
    for (int j = 0; j < ns; j++) {
        seq_state *f = &fin[which[j]];
        for (int k = 0; k < 7; k++)
            if (fsz[k]) {
                be->download(f->f[k], dsf[j][k], fsz[k] * 4);
                be->free(dsf[j][k]);
            }
        for (int k = 0; k < 3; k++)
            if (psz[k]) {
                be->download(f->p[k], dsp[j][k], psz[k]);
                be->free(dsp[j][k]);
            }
    }
    bok(be, "attn_step");
    for (int b = 0; b < 8; b++)
        be->free(dbuf[b]);
    for (int k = 0; k < 6; k++)
        be->free(dk[k]);
    be->free((void *)a.rows.pos), be->free((void *)a.rows.seq), be->free((void *)a.rows.start);
    be->free((void *)a.rows.first), be->free((void *)a.st), be->free(a.o);
    if (a.work)
        be->free(a.work);
}

/* Row tok of a per-token stream of sequence s: the step's row when the step holds it, else
 * the ring's slot. */
static const float *tok_at(const attn_case *c, int s, int64_t tok, const float *step, const float *ring, int cap, int width)
{
    if (tok >= c->start[s])
        return step + (size_t)row_of(c, s, (int)(tok - c->start[s])) * width;
    return ring + (size_t)(tok % cap) * width;
}

/* Entry w of a compressor (dim, overlap, ape, norm) of sequence s in double: per channel, the
 * softmax over its slots (with overlap window w-1's first halves, then window w's second
 * halves) of z + ape weighting c; RMS-normed with `norm`; roped at position w m (the fp32
 * angle, as rope_ref). Bound, first order: the pooled value's error is sum p |c| (twice the
 * largest logit error (u |z + ape| for the sum, u |l - max| for the shift, 4 u for expf) +
 * gamma(2 m + 2)); the norm passes it as rmsnorm_ref's chain does (|norm| inv e + |y| (|e|_2 /
 * |x|_2 + gamma(dim / 2 + 6))); the rotation adds the pair's two errors and 7 u (|a| + |b|). */
static void entry_ref(const attn_case *c, int s, int dim, int overlap, const float *ape, const float *norm,
                      const float *cs, const float *zs, const float *cr, const float *zr, int64_t w, const float *ifreq,
                      float *ref, double *tol)
{
    int m = c->ratio, cw = (1 + overlap) * dim, off = overlap ? dim : 0;
    double *v = malloc(dim * sizeof(double)), *e = malloc(dim * sizeof(double)), lg[2048], vv[2048];
    for (int ch = 0; ch < dim; ch++) {
        int ns = 0;
        double worst = 0;
        if (overlap && w > 0)
            for (int j = 0; j < m; j++) {
                int64_t tok = (w - 1) * m + j;
                vv[ns] = tok_at(c, s, tok, cs, cr, c->c_cap, cw)[ch];
                lg[ns++] = (double)tok_at(c, s, tok, zs, zr, c->c_cap, cw)[ch] + ape[(size_t)j * cw + ch];
            }
        for (int j = 0; j < m; j++) {
            int64_t tok = w * m + j;
            vv[ns] = tok_at(c, s, tok, cs, cr, c->c_cap, cw)[off + ch];
            lg[ns++] = (double)tok_at(c, s, tok, zs, zr, c->c_cap, cw)[off + ch] + ape[(size_t)j * cw + off + ch];
        }
        double mx = -INFINITY, den = 0, acc = 0, mag = 0;
        for (int i = 0; i < ns; i++)
            mx = fmax(mx, lg[i]);
        for (int i = 0; i < ns; i++) {
            double p = exp(lg[i] - mx);
            den += p, acc += p * vv[i], mag += p * fabs(vv[i]);
            worst = fmax(worst, U * fabs(lg[i]) + U * fabs(lg[i] - mx) + 4 * U);
        }
        v[ch] = acc / den;
        e[ch] = mag / den * (2 * worst + gam(2.0 * m + 2));
    }
    double ss = 0, ee = 0;
    for (int i = 0; i < dim; i++)
        ss += v[i] * v[i], ee += e[i] * e[i];
    double inv = 1.0 / sqrt(ss / dim + (double)1e-6f), rel = sqrt(ee / ss) + gam(dim / 2.0 + 6);
    for (int i = 0; i < dim; i++) {
        double y = v[i] * inv * norm[i];
        e[i] = fabs(norm[i]) * inv * e[i] + fabs(y) * rel;
        v[i] = y;
    }
    for (int i = 0; i < dim; i++)
        ref[i] = (float)v[i], tol[i] = e[i] + U * fabs(v[i]);
    for (int i = 0; i < c->rd / 2; i++) {
        int at = dim - c->rd + 2 * i;
        float ang = (float)(w * m) * ifreq[i];
        double cs2 = cos((double)ang), sn = sin((double)ang), a = v[at], b = v[at + 1];
        double t2 = e[at] + e[at + 1] + 7 * U * (fabs(a) + fabs(b));
        ref[at] = (float)(a * cs2 - b * sn);
        ref[at + 1] = (float)(a * sn + b * cs2);
        tol[at] = tol[at + 1] = t2;
    }
    free(v), free(e);
}

/* Stored row w of a final state's entries (or indexer keys, idx) as floats: the float buffer's
 * row, or the packed row unpacked; *step: the stored block scale of each value (0 unpacked). */
static void stored_row(const attn_case *c, const seq_state *st, int idx, int64_t w, float *out, double *step)
{
    int dim = idx ? c->ci : c->d;
    if (!c->prod) {
        memcpy(out, (idx ? st->f[6] : st->f[3]) + w * dim, dim * 4);
        for (int i = 0; step && i < dim; i++)
            step[i] = 0;
        return;
    }
    int fmt = idx ? DSV4_KV_INDEX : DSV4_KV_MAIN, rb = dsv4_kv_row_bytes(fmt, dim);
    const uint8_t *row = (idx ? st->p[2] : st->p[1]) + w * rb;
    dsv4_kv_unpack(fmt, row, dim, out);
    for (int i = 0; step && i < dim; i++)
        step[i] = dsv4_kv_scale(fmt, row, dim, i / dsv4_kv_block(fmt));
}

/* The stored rows of the entries (and indexer keys) the step emits, in row order, from a final
 * state; step: their blocks' scales (production), or NULL. Returns the count of values. */
static size_t emitted_rows(const attn_case *c, const seq_state *fin, float *out, double *step)
{
    size_t n = 0;
    for (int s = 0; s < c->S && c->ratio; s++)
        for (int i = 0; i < c->n[s]; i++) {
            int64_t p = c->start[s] + i;
            if ((p + 1) % c->ratio)
                continue;
            stored_row(c, &fin[s], 0, p / c->ratio, out + n, step ? step + n : NULL);
            n += c->d;
            if (c->csa) {
                stored_row(c, &fin[s], 1, p / c->ratio, out + n, step ? step + n : NULL);
                n += c->ci;
            }
        }
    return n;
}

/* A final state as the step must leave it apart from its emitted entries (checked within
 * their bounds): init's rings with each sequence's last cap step rows stored (packed for a
 * production window ring), every entry row not emitted as it was, the emitted rows taken from
 * `fin`. */
static void expected_state(const attn_case *c, const step_in *in, seq_state *const *init, const seq_state *fin,
                           seq_state *exp)
{
    int cw = (1 + c->csa) * c->d, iw = 2 * c->ci, rbw = dsv4_kv_row_bytes(DSV4_KV_WINDOW, c->d);
    int rbm = dsv4_kv_row_bytes(DSV4_KV_MAIN, c->d), rbi = dsv4_kv_row_bytes(DSV4_KV_INDEX, c->ci);
    for (int s = 0; s < c->S; s++) {
        state_copy(c, &exp[s], init[s]);
        int64_t end = c->start[s] + c->n[s];
        for (int i = 0; i < c->n[s]; i++) {
            int64_t p = c->start[s] + i;
            int r = row_of(c, s, i);
            if (p + c->kv_cap >= end) {
                if (c->prod)
                    dsv4_kv_pack(DSV4_KV_WINDOW, in->kv + (size_t)r * c->d, c->d, exp[s].p[0] + (p % c->kv_cap) * rbw);
                else
                    memcpy(exp[s].f[0] + (p % c->kv_cap) * c->d, in->kv + (size_t)r * c->d, c->d * 4);
            }
            if (c->ratio && p + c->c_cap >= end) {
                memcpy(exp[s].f[1] + (p % c->c_cap) * cw, in->cc + (size_t)r * cw, cw * 4);
                memcpy(exp[s].f[2] + (p % c->c_cap) * cw, in->zz + (size_t)r * cw, cw * 4);
                if (c->csa) {
                    memcpy(exp[s].f[4] + (p % c->c_cap) * iw, in->ic + (size_t)r * iw, iw * 4);
                    memcpy(exp[s].f[5] + (p % c->c_cap) * iw, in->iz + (size_t)r * iw, iw * 4);
                }
            }
            if (c->ratio && (p + 1) % c->ratio == 0) {
                int64_t w = p / c->ratio;
                if (c->prod) {
                    memcpy(exp[s].p[1] + w * rbm, fin[s].p[1] + w * rbm, rbm);
                    if (c->csa)
                        memcpy(exp[s].p[2] + w * rbi, fin[s].p[2] + w * rbi, rbi);
                } else {
                    memcpy(exp[s].f[3] + w * c->d, fin[s].f[3] + w * c->d, c->d * 4);
                    if (c->csa)
                        memcpy(exp[s].f[6] + w * c->ci, fin[s].f[6] + w * c->ci, c->ci * 4);
                }
            }
        }
    }
}

typedef struct {
    double s;
    int64_t w;
} scored_d;

static int by_score_desc(const void *a, const void *b)
{
    const scored_d *x = a, *y = b;
    if (x->s != y->s)
        return x->s > y->s ? -1 : 1;
    return x->w < y->w ? -1 : x->w > y->w;
}

/* the wrong order, for a control: ties to the higher entry */
static int by_score_desc_high(const void *a, const void *b)
{
    const scored_d *x = a, *y = b;
    if (x->s != y->s)
        return x->s > y->s ? -1 : 1;
    return x->w > y->w ? -1 : x->w < y->w;
}

static int by_w(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* The step's emitted entries against entry_ref, and o's reference and bound over the op's own
 * final entries and indexer keys (stored rows): an indexer score in double, sum_h (wt_h
 * iw_scale) relu(qi_h . ikey_w) / sqrt(ci), bound sum_h |c_h| gamma(ci) sum|qi k| + gamma(nI +
 * 3) sum|c relu| over sqrt(ci); the topk of highest score (ties to the lower entry) ascending,
 * then the window rows p - window + 1..p (production: as stored, packed and unpacked), through
 * attend_ref. A selection boundary closer than the scores' bounds is a near tie (counted: the
 * case's data must have none). ties_high: ties to the higher entry instead (a control). */
typedef struct {
    float *o, *ent, *ent_got;
    double *o_tol, *ent_tol;
    size_t n_ent;
    int near_ties, rows_selected;
} attn_ref_out;

static void attn_ref(const attn_case *c, const step_in *in, seq_state *const *init, const seq_state *fin, int window,
                     int ties_high, attn_ref_out *out)
{
    int Hd = c->H * c->d, R = in->R, m = c->ratio;
    size_t cap = (size_t)R * (c->d + c->ci) + 1;
    out->o = falloc((size_t)R * Hd);
    out->o_tol = malloc((size_t)R * Hd * sizeof(double));
    out->ent = falloc(cap), out->ent_got = falloc(cap), out->ent_tol = malloc(cap * sizeof(double));
    out->near_ties = 0, out->rows_selected = 0;
    double *step = malloc(cap * sizeof(double));
    out->n_ent = emitted_rows(c, fin, out->ent_got, step);
    size_t n = 0;
    for (int s = 0; s < c->S && m; s++)
        for (int i = 0; i < c->n[s]; i++) {
            int64_t p = c->start[s] + i;
            if ((p + 1) % m)
                continue;
            entry_ref(c, s, c->d, c->csa, in->ape, in->norm, in->cc, in->zz, init[s]->f[1], init[s]->f[2], p / m,
                      in->ifreq, out->ent + n, out->ent_tol + n);
            n += c->d;
            if (c->csa) {
                entry_ref(c, s, c->ci, 1, in->iape, in->inorm, in->ic, in->iz, init[s]->f[4], init[s]->f[5], p / m,
                          in->ifreq, out->ent + n, out->ent_tol + n);
                n += c->ci;
            }
        }
    for (size_t i = 0; i < n; i++)
        out->ent_tol[i] += step[i];
    int64_t nv = c->vis_cap + 1;
    const float **keys = malloc((window + nv + 1) * sizeof *keys);
    float *ek = falloc((size_t)nv * c->d), *ik = falloc((size_t)nv * (c->ci + 1)), *wk = falloc((size_t)(window + 1) * c->d);
    uint8_t *rowb = malloc(dsv4_kv_row_bytes(DSV4_KV_WINDOW, c->d));
    scored_d *sc = malloc(nv * sizeof *sc);
    double *stol = malloc(nv * sizeof(double));
    int64_t *sel = malloc(nv * sizeof(int64_t));
    int rbw = dsv4_kv_row_bytes(DSV4_KV_WINDOW, c->d);
    for (int s = 0; s < c->S; s++)
        for (int i = 0; i < c->n[s]; i++) {
            int64_t p = c->start[s] + i;
            int r = row_of(c, s, i), nk = 0;
            if (m) {
                int64_t nvis = (p + 1) / m;
                for (int64_t w = 0; w < nvis; w++)
                    stored_row(c, &fin[s], 0, w, ek + w * c->d, NULL);
                if (c->csa) {
                    const float *qi = in->qi + (size_t)r * c->nI * c->ci, *wt = in->wt + (size_t)r * c->nI;
                    for (int64_t w = 0; w < nvis; w++) {
                        stored_row(c, &fin[s], 1, w, ik + w * c->ci, NULL);
                        double v = 0, e = 0, a = 0;
                        for (int h = 0; h < c->nI; h++) {
                            double dp = 0, dm = 0, ch = (double)wt[h] * 0.7f;
                            for (int j = 0; j < c->ci; j++) {
                                dp += (double)qi[h * c->ci + j] * ik[w * c->ci + j];
                                dm += fabs((double)qi[h * c->ci + j] * ik[w * c->ci + j]);
                            }
                            v += ch * (dp > 0 ? dp : 0);
                            a += fabs(ch) * (dp > 0 ? dp : 0);
                            e += fabs(ch) * gam(c->ci) * dm;
                        }
                        sc[w] = (scored_d){v / sqrt((double)c->ci), w};
                        stol[w] = (e + gam(c->nI + 3.0) * a) / sqrt((double)c->ci) + U * fabs(sc[w].s);
                    }
                    qsort(sc, nvis, sizeof *sc, ties_high ? by_score_desc_high : by_score_desc);
                    int64_t kept = nvis < c->topk ? nvis : c->topk;
                    if (nvis > c->topk) {
                        out->rows_selected++;
                        const scored_d *a = &sc[c->topk - 1], *b = &sc[c->topk];
                        if (a->s != b->s && a->s - b->s <= stol[a->w] + stol[b->w])
                            out->near_ties++;
                    }
                    for (int64_t k = 0; k < kept; k++)
                        sel[k] = sc[k].w;
                    qsort(sel, kept, sizeof *sel, by_w);
                    for (int64_t k = 0; k < kept; k++)
                        keys[nk++] = ek + sel[k] * c->d;
                } else
                    for (int64_t w = 0; w < nvis; w++)
                        keys[nk++] = ek + w * c->d;
            }
            int nw = 0;
            for (int64_t j = p - window + 1 < 0 ? 0 : p - window + 1; j <= p; j++, nw++) {
                float *dst = wk + (size_t)nw * c->d;
                if (j >= c->start[s]) {
                    const float *row = in->kv + (size_t)row_of(c, s, (int)(j - c->start[s])) * c->d;
                    if (c->prod) {
                        dsv4_kv_pack(DSV4_KV_WINDOW, row, c->d, rowb);
                        dsv4_kv_unpack(DSV4_KV_WINDOW, rowb, c->d, dst);
                    } else
                        memcpy(dst, row, c->d * 4);
                } else if (c->prod)
                    dsv4_kv_unpack(DSV4_KV_WINDOW, init[s]->p[0] + (j % c->kv_cap) * rbw, c->d, dst);
                else
                    memcpy(dst, init[s]->f[0] + (j % c->kv_cap) * c->d, c->d * 4);
                keys[nk++] = dst;
            }
            attend_ref(in->q + (size_t)r * Hd, c->H, c->d, keys, nk, 1.0f / sqrtf((float)c->d), in->sink,
                       out->o + (size_t)r * Hd, out->o_tol + (size_t)r * Hd);
        }
    free(step), free(keys), free(ek), free(ik), free(wk), free(rowb), free(sc), free(stol), free(sel);
}

static void attn_ref_free(attn_ref_out *r) { free(r->o), free(r->ent), free(r->ent_got), free(r->o_tol), free(r->ent_tol); }

/* S sequences at different positions, a step of several rows each (rows completing entries; a
 * sequence with more rows than the window ring holds), from random state. On the CPU: the
 * emitted entries and indexer keys against entry_ref, o against attn_ref over the op's own
 * entries, and the rings and untouched entries as expected_state, bit for bit. Another backend:
 * o and the entries against the CPU's (twice the bounds; with production caches against
 * attn_ref over its own stored rows), the rest of the state bit for bit.
 * Controls: the window one shorter (a wrong window start); with planted ties, the indexer's
 * ties to the higher entry. Rows: each sequence alone, and the
 * step cut in two (each sequence's first half, then the rest from that state), give the same
 * o and final state bit for bit. */
static void test_attn_step(const attn_case *c)
{
    if (c->prod && !cpu->kv_production)
        return;
    size_t fsz[7], psz[3];
    state_sizes(c, fsz, psz);
    int R = 0, Hd = c->H * c->d, cw = (1 + c->csa) * c->d, iw = 2 * c->ci, nIc = c->nI * c->ci;
    for (int s = 0; s < c->S; s++)
        R += c->n[s];
    int m = c->ratio ? c->ratio : 1;
    step_in in = {.R = R};
    in.q = falloc((size_t)R * Hd), in.kv = falloc((size_t)R * c->d), in.cc = falloc((size_t)R * cw);
    in.zz = falloc((size_t)R * cw), in.ic = falloc((size_t)R * iw + 1), in.iz = falloc((size_t)R * iw + 1);
    in.qi = falloc((size_t)R * nIc + 1), in.wt = falloc((size_t)R * c->nI + 1);
    in.sink = falloc(c->H), in.ifreq = falloc(c->rd / 2), in.ape = falloc((size_t)m * cw), in.norm = falloc(c->d);
    in.iape = falloc((size_t)m * iw + 1), in.inorm = falloc(c->ci + 1);
    fill(in.q, (size_t)R * Hd, -1, 1);
    fill(in.kv, (size_t)R * c->d, -1, 1);
    fill(in.cc, (size_t)R * cw, -1, 1);
    fill(in.zz, (size_t)R * cw, -1, 1);
    fill(in.ic, (size_t)R * iw, -1, 1);
    fill(in.iz, (size_t)R * iw, -1, 1);
    fill(in.qi, (size_t)R * nIc, c->ties ? 0.0f : -1.0f, 1);
    fill(in.wt, (size_t)R * c->nI, 0.1f, 1);
    fill(in.sink, c->H, -1, 1);
    for (int i = 0; i < c->rd / 2; i++)
        in.ifreq[i] = powf(10000.0f, -(float)(2 * i) / c->rd);
    fill(in.ape, (size_t)m * cw, -0.5f, 0.5f);
    fill(in.norm, c->d, 0.5f, 1.5f);
    fill(in.iape, (size_t)m * iw, -0.5f, 0.5f);
    fill(in.inorm, c->ci, 0.5f, 1.5f);
    seq_state init[3], *ip[3] = {&init[0], &init[1], &init[2]};
    int rb[3] = {dsv4_kv_row_bytes(DSV4_KV_WINDOW, c->d), dsv4_kv_row_bytes(DSV4_KV_MAIN, c->d),
                 dsv4_kv_row_bytes(DSV4_KV_INDEX, c->ci)};
    int wd[3] = {c->d, c->d, c->ci}, fm[3] = {DSV4_KV_WINDOW, DSV4_KV_MAIN, DSV4_KV_INDEX};
    float *tmp = falloc(c->d > c->ci ? c->d : c->ci);
    for (int s = 0; s < c->S; s++) {
        for (int k = 0; k < 7; k++) {
            init[s].f[k] = fsz[k] ? falloc(fsz[k]) : NULL;
            if (fsz[k])
                fill(init[s].f[k], fsz[k], -1, 1);
        }
        for (int k = 0; k < 3; k++) {
            init[s].p[k] = psz[k] ? malloc(psz[k]) : NULL;
            for (size_t r = 0; psz[k] && r < psz[k] / rb[k]; r++) { /* every third indexer key the same: exact ties */
                if (k == 2 && c->ties && r % 3 == 0)
                    for (int i = 0; i < wd[k]; i++)
                        tmp[i] = 0.5f;
                else
                    fill(tmp, wd[k], -1, 1);
                dsv4_kv_pack(fm[k], tmp, wd[k], init[s].p[k] + r * rb[k]);
            }
        }
        if (c->ties && fsz[6])
            for (int64_t w = 0; w < c->vis_cap; w += 3)
                for (int i = 0; i < c->ci; i++)
                    init[s].f[6][w * c->ci + i] = 0.5f;
    }
    free(tmp);
    int lo[3] = {0, 0, 0}, hi[3] = {c->n[0], c->n[1], c->n[2]}, half[3];
    for (int s = 0; s < 3; s++)
        half[s] = hi[s] / 2;
    float *cpu_o = NULL, *cpu_ent = falloc((size_t)R * (c->d + c->ci) + 1);
    attn_ref_out ref = {0};
    char what[200];
    for (int o = -1; o < n_others; o++) {
        const target *t = o < 0 ? &cpu_t : &others[o];
        const char *bn = t->be->name;
        if (c->prod && !t->be->kv_production) {
            printf("  %-52s %s: no production caches (a model with them refuses it)\n", c->name, bn);
            continue;
        }
        double sc = o < 0 ? 1.0 : OTHER;
        seq_state fin[3], exp[3];
        float *og, *ow;
        run_attn(t, c, &in, lo, hi, ip, fin, &og, c->W);
        if (o < 0) {
            attn_ref(c, &in, ip, fin, c->W, 0, &ref);
            CHECK(ref.near_ties == 0, "%s: the case's data has %d near ties at the top-k boundary", c->name,
                  ref.near_ties);
            if (c->csa)
                printf("  %-52s indexer: %d rows select from more than topk, %d near ties\n", c->name,
                       ref.rows_selected, ref.near_ties);
        }
        /* production caches: another backend's entries may round to a neighbouring code where the
         * CPU's fp32 value sat on the other side of a boundary, so its o is checked against the
         * reference over its own stored rows, and its entries against the exact ones within its
         * own blocks' steps */
        attn_ref_out own = {0};
        const attn_ref_out *rr = &ref;
        if (o >= 0 && c->prod) {
            attn_ref(c, &in, ip, fin, c->W, 0, &own);
            CHECK(own.near_ties == 0, "%s on %s: %d near ties at the top-k boundary", c->name, bn, own.near_ties);
            rr = &own;
        }
        const float *o_want = o < 0 || c->prod ? rr->o : cpu_o, *e_want = o < 0 || c->prod ? rr->ent : cpu_ent;
        snprintf(what, sizeof what, "%s on %s: o", c->name, bn);
        CHECK(agree_within(what, og, o_want, rr->o_tol, (size_t)R * Hd, sc, 0), "%s: differs", what);
        float *eg = falloc(ref.n_ent + 1);
        emitted_rows(c, fin, eg, NULL);
        snprintf(what, sizeof what, "%s on %s: entries", c->name, bn);
        CHECK(agree_within(what, eg, e_want, rr->ent_tol, ref.n_ent, sc, 0), "%s: differ", what);
        if (rr == &own)
            attn_ref_free(&own);
        expected_state(c, &in, ip, fin, exp);
        if (o < 0)
            memcpy(cpu_ent, eg, ref.n_ent * 4);
        int st_same = 1;
        for (int s = 0; s < c->S; s++)
            st_same &= states_equal(c, &exp[s], &fin[s]);
        CHECK(st_same, "%s on %s: the rings or untouched entries are not as the step must leave them", c->name, bn);
        printf("  %-52s %s: rings and untouched entries %s\n", c->name, bn, st_same ? "bitwise as expected" : "DIFFERENT");
        state_free(exp, c->S);
        /* control: the window one shorter */
        seq_state wf[3];
        if (o < 0) {
            attn_ref_out wr;
            attn_ref(c, &in, ip, fin, c->W - 1, 0, &wr);
            ow = falloc((size_t)R * Hd);
            memcpy(ow, wr.o, (size_t)R * Hd * 4);
            attn_ref_free(&wr);
        } else {
            run_attn(&cpu_t, c, &in, lo, hi, ip, wf, &ow, c->W - 1);
            state_free(wf, c->S);
        }
        snprintf(what, sizeof what, "attn_step on %s: window start off by one", bn);
        control_within(what, og, ow, ref.o_tol, (size_t)R * Hd, sc);
        free(ow);
        if (c->ties) { /* control: the indexer's ties to the higher entry, over this backend's own state */
            attn_ref_out th;
            attn_ref(c, &in, ip, fin, c->W, 1, &th);
            snprintf(what, sizeof what, "attn_step on %s: indexer ties to the higher entry", bn);
            control_within(what, og, th.o, ref.o_tol, (size_t)R * Hd, sc);
            attn_ref_free(&th);
        }
        /* rows: each sequence alone; the step cut in two */
        int same = 1;
        for (int s = 0; s < c->S; s++) {
            int l1[3] = {0, 0, 0}, h1[3] = {0, 0, 0};
            h1[s] = c->n[s];
            seq_state f1[3];
            float *o1;
            run_attn(t, c, &in, l1, h1, ip, f1, &o1, c->W);
            same &= rows_equal(o1, og + (size_t)row_of(c, s, 0) * Hd, (size_t)c->n[s] * Hd);
            same &= states_equal(c, &f1[s], &fin[s]);
            state_free(f1, c->S);
            free(o1);
        }
        seq_state fa[3], fb[3], *fap[3] = {&fa[0], &fa[1], &fa[2]};
        float *oa, *ob;
        run_attn(t, c, &in, lo, half, ip, fa, &oa, c->W);
        run_attn(t, c, &in, half, hi, fap, fb, &ob, c->W);
        int ra = 0, rbo = 0;
        for (int s = 0; s < c->S; s++) {
            int r0 = row_of(c, s, 0);
            same &= rows_equal(oa + (size_t)ra * Hd, og + (size_t)r0 * Hd, (size_t)half[s] * Hd);
            same &= rows_equal(ob + (size_t)rbo * Hd, og + (size_t)(r0 + half[s]) * Hd, (size_t)(c->n[s] - half[s]) * Hd);
            same &= states_equal(c, &fb[s], &fin[s]);
            ra += half[s], rbo += c->n[s] - half[s];
        }
        state_free(fa, c->S), state_free(fb, c->S);
        free(oa), free(ob);
        snprintf(what, sizeof what, "%s (alone, cut in two)", c->name);
        report_rows(what, bn, same, R);
        free(eg);
        state_free(fin, c->S);
        if (o < 0)
            cpu_o = og;
        else
            free(og);
    }
    attn_ref_free(&ref);
    free(cpu_o), free(cpu_ent);
    state_free(init, c->S);
    free(in.q), free(in.kv), free(in.cc), free(in.zz), free(in.ic), free(in.iz), free(in.qi), free(in.wt);
    free(in.sink), free(in.ifreq), free(in.ape), free(in.norm), free(in.iape), free(in.inorm);
}

static const attn_case attn_cases[] = {
    {.name = "attn_step sliding S=2", .S = 2, .start = {3, 50}, .n = {6, 12}, .H = 2, .d = 64, .rd = 16, .W = 8,
     .kv_cap = 8, .c_cap = 8},
    {.name = "attn_step hca m=8 S=3", .S = 3, .start = {100, 7, 250}, .n = {9, 10, 4}, .H = 4, .d = 64, .rd = 16, .W = 8,
     .ratio = 8, .kv_cap = 8, .c_cap = 8, .vis_cap = 40},
    {.name = "attn_step csa m=4 S=3 ties", .S = 3, .start = {70, 130, 6}, .n = {5, 20, 3}, .H = 4, .d = 64, .rd = 16, .W = 8,
     .ratio = 4, .csa = 1, .ci = 32, .nI = 4, .topk = 5, .kv_cap = 16, .c_cap = 8, .vis_cap = 48, .ties = 1},
    {.name = "attn_step csa m=4 S=2", .S = 2, .start = {200, 37}, .n = {4, 6}, .H = 2, .d = 128, .rd = 64, .W = 16,
     .ratio = 4, .csa = 1, .ci = 64, .nI = 8, .topk = 16, .kv_cap = 32, .c_cap = 12, .vis_cap = 64},
    /* 20 indexer heads of 48 over rows of 95 to 128 entries: on CUDA's tensor cores two head
     * tiles (the second padded), three k-steps, entries past a 64-entry chunk */
    {.name = "attn_step csa m=4 S=2 nI=20 ci=48", .S = 2, .start = {380, 505}, .n = {5, 7}, .H = 2, .d = 64, .rd = 16,
     .W = 8, .ratio = 4, .csa = 1, .ci = 48, .nI = 20, .topk = 12, .kv_cap = 16, .c_cap = 8, .vis_cap = 136},
    {.name = "attn_step sliding S=2 production", .S = 2, .start = {3, 50}, .n = {6, 12}, .H = 2, .d = 64, .rd = 16, .W = 8,
     .kv_cap = 8, .c_cap = 8, .prod = 1},
    {.name = "attn_step hca m=8 S=3 production", .S = 3, .start = {100, 7, 250}, .n = {9, 10, 4}, .H = 4, .d = 64, .rd = 16,
     .W = 8, .ratio = 8, .kv_cap = 8, .c_cap = 8, .vis_cap = 40, .prod = 1},
    {.name = "attn_step csa m=4 S=3 ties production", .S = 3, .start = {70, 130, 6}, .n = {5, 20, 3}, .H = 4, .d = 64,
     .rd = 16, .W = 8, .ratio = 4, .csa = 1, .ci = 32, .nI = 4, .topk = 5, .kv_cap = 16, .c_cap = 8, .vis_cap = 48,
     .ties = 1, .prod = 1},
};

/* ---- attn_step41 ------------------------------------------------------------------------------- */

/* V4.1's step (CSA2) over S sequences of P rows each from position 0, through three layers as a
 * V4.1 model chains them: A, a KV source of ratio m that owns its index keys and is the index and
 * candidate source; B, an index source scoring A's keys, filtered by A's candidate blocks; C, a
 * reader that attends A's entries through B's selection. fp32 caches and numerics (REF and the
 * production caches: test_v41_fixtures, test_kv), on every backend: the state, the inputs and the
 * shared slots in the backend's memory, the results checked on the host. */
typedef struct {
    const char *name;
    int S, P, m, H, d, rd, W, nI, ci, topk, cand_bs, cand_k, ape, cut;
} attn41_case;

enum { L41 = 3 }; /* A, B, C */

typedef struct {
    float *q[L41], *kv[L41], *cc, *zz, *qi[2], *wt[2];
    float *sink, *freq, *norm, *apev, *iknorm;
    dsv4_weight iwk;
} in41;

typedef struct {
    float *o[L41];           /* [Rt, H d] */
    int64_t *sel[2], *cand;  /* A's and B's selections [Rt, K]; A's blocks [Rt, cand_k] */
    int *nsel[2], *ncand;
} out41;

static int64_t ent_cap41(const attn41_case *c) { return c->P / c->m + 1; }
static int kv_cap41(const attn41_case *c) { return c->W + 2; }
static int c_cap41(const attn41_case *c) { return c->m + 1; }

/* each sequence's buffers for A, B, C: [S * L41], layer-major */
static dsv4_lbufs *state41(const attn41_case *c)
{
    dsv4_lbufs *st = calloc((size_t)L41 * c->S, sizeof *st);
    for (int l = 0; l < L41; l++)
        for (int s = 0; s < c->S; s++) {
            dsv4_lbufs *b = &st[l * c->S + s];
            b->kv = calloc((size_t)kv_cap41(c) * c->d, sizeof(float));
            if (l == 0) {
                b->c = calloc((size_t)c_cap41(c) * c->d, sizeof(float));
                b->z = calloc((size_t)c_cap41(c) * c->d, sizeof(float));
                b->ent = calloc((size_t)ent_cap41(c) * c->d, sizeof(float));
                b->ikey = calloc((size_t)ent_cap41(c) * c->ci, sizeof(float));
                b->ent_cap = ent_cap41(c);
            }
        }
    return st;
}

static void state41_free(const attn41_case *c, dsv4_lbufs *st)
{
    for (int i = 0; i < L41 * c->S; i++)
        free(st[i].kv), free(st[i].c), free(st[i].z), free(st[i].ent), free(st[i].ikey);
    free(st);
}

static void out41_alloc(const attn41_case *c, out41 *o)
{
    size_t Rt = (size_t)c->S * c->P;
    for (int l = 0; l < L41; l++)
        o->o[l] = falloc(Rt * c->H * c->d);
    for (int k = 0; k < 2; k++) {
        o->sel[k] = calloc(Rt * c->topk, sizeof(int64_t));
        o->nsel[k] = calloc(Rt, sizeof(int));
    }
    o->cand = calloc(Rt * c->cand_k, sizeof(int64_t));
    o->ncand = calloc(Rt, sizeof(int));
}

static void out41_free(out41 *o)
{
    for (int l = 0; l < L41; l++)
        free(o->o[l]);
    for (int k = 0; k < 2; k++)
        free(o->sel[k]), free(o->nsel[k]);
    free(o->cand), free(o->ncand);
}

/* Gathers rows [lo, hi) of a [Rt, w] input (each sequence's positions lo..hi-1) into a step's rows. */
static float *gather41(const attn41_case *c, const float *x, int w, int lo, int hi)
{
    int n = hi - lo;
    float *g = falloc((size_t)c->S * n * w);
    for (int s = 0; s < c->S; s++)
        memcpy(g + (size_t)s * n * w, x + ((size_t)s * c->P + lo) * w, (size_t)n * w * sizeof(float));
    return g;
}

/* Host buffer of `bytes` into t's memory and back (step41's staging). */
static void *put41(const target *t, const void *h, size_t bytes) { return bput(t->be, h, bytes); }
static void get41(const target *t, void *h, void *d, size_t bytes)
{
    t->be->download(h, d, bytes);
    t->be->free(d);
}

/* One step of positions [lo, hi) of every sequence through A, B, C on t: the host state st is
 * staged into t's memory for the step and back after it; results land at the rows' places in
 * out. */
static void step41(const target *t, const attn41_case *c, const in41 *in, dsv4_lbufs *st, int lo, int hi, out41 *out)
{
    const dsv4_backend *be = t->be;
    int S = c->S, n = hi - lo, R = S * n, K = c->topk, CB = c->cand_k, d = c->d, Hd = c->H * c->d;
    int64_t *pos = malloc(R * sizeof(int64_t)), *start = malloc(S * sizeof(int64_t));
    int32_t *seq = malloc(R * sizeof(int32_t)), *first = malloc(S * sizeof(int32_t));
    for (int s = 0; s < S; s++) {
        start[s] = lo;
        first[s] = s * n;
        for (int i = 0; i < n; i++)
            pos[s * n + i] = lo + i, seq[s * n + i] = s;
    }
    int64_t vis = ent_cap41(c);
    /* the state in t's memory, and its table */
    size_t kvb = (size_t)kv_cap41(c) * d * 4, cb = (size_t)c_cap41(c) * d * 4, eb = (size_t)vis * d * 4,
           ib = (size_t)vis * c->ci * 4;
    dsv4_lbufs *dst = calloc((size_t)L41 * S, sizeof *dst);
    for (int i = 0; i < L41 * S; i++) {
        dst[i].kv = put41(t, st[i].kv, kvb);
        if (i < S) {
            dst[i].c = put41(t, st[i].c, cb), dst[i].z = put41(t, st[i].z, cb);
            dst[i].ent = put41(t, st[i].ent, eb), dst[i].ikey = put41(t, st[i].ikey, ib);
            dst[i].ent_cap = vis;
        }
    }
    dsv4_lbufs *dtab = put41(t, dst, (size_t)L41 * S * sizeof *dst);
    int64_t *dpos = put41(t, pos, R * 8), *dstart = put41(t, start, S * 8);
    int32_t *dseq = put41(t, seq, R * 4), *dfirst = put41(t, first, S * 4);
    int64_t *sel = put41(t, NULL, (size_t)R * K * 8), *cand = put41(t, NULL, (size_t)R * CB * 8);
    int *nsel = put41(t, NULL, R * 4), *ncand = put41(t, NULL, R * 4);
    float *cc = gather41(c, in->cc, d, lo, hi), *zz = gather41(c, in->zz, d, lo, hi);
    float *dcc = put41(t, cc, (size_t)R * d * 4), *dzz = put41(t, zz, (size_t)R * d * 4);
    int64_t *hsel = malloc((size_t)R * K * 8), *hcand = malloc((size_t)R * CB * 8);
    int *hnsel = malloc(R * 4), *hncand = malloc(R * 4);
    float *ho = falloc((size_t)R * Hd);
    /* the constants in t's memory too (a device backend reads them there) */
    float *dsink = put41(t, in->sink, (size_t)c->H * 4), *dfreq = put41(t, in->freq, (size_t)(c->rd / 2) * 4);
    float *dnorm = put41(t, in->norm, (size_t)d * 4), *dikn = put41(t, in->iknorm, (size_t)c->ci * 4);
    float *dape = in->apev ? put41(t, in->apev, (size_t)c->m * d * 4) : NULL;
    for (int l = 0; l < L41; l++) {
        float *q = gather41(c, in->q[l], Hd, lo, hi), *kv = gather41(c, in->kv[l], d, lo, hi);
        float *qi = l < 2 ? gather41(c, in->qi[l], c->nI * c->ci, lo, hi) : NULL;
        float *wt = l < 2 ? gather41(c, in->wt[l], c->nI, lo, hi) : NULL;
        float *dq = put41(t, q, (size_t)R * Hd * 4), *dkv = put41(t, kv, (size_t)R * d * 4);
        float *dqi = qi ? put41(t, qi, (size_t)R * c->nI * c->ci * 4) : NULL, *dwt = wt ? put41(t, wt, (size_t)R * c->nI * 4) : NULL;
        dsv4_attn41_args a = {.rows = {.R = R, .S = S, .pos = dpos, .seq = dseq, .start = dstart, .first = dfirst},
                              .st = dtab + l * S, .est = dtab, .ist = dtab, .kv_cap = kv_cap41(c), .c_cap = c_cap41(c),
                              .vis_cap = vis, .H = c->H, .d = d, .rd = c->rd, .window = c->W,
                              .scale = 1.0f / sqrtf((float)d), .eps = 1e-6f, .sink = dsink, .inv_freq = dfreq,
                              .ratio = c->m, .own_ent = l == 0, .own_ikey = l == 0, .index_source = l < 2,
                              .cand_source = l == 0, .cand_filter = l == 1,
                              .comp = {.ratio = c->m, .dim = d, .overlap = 0, .ape = dape, .norm = dnorm},
                              .iwk = &in->iwk, .ik_norm = dikn, .nI = c->nI, .ci = c->ci, .topk = K,
                              .cand_bs = c->cand_bs, .cand_k = CB, .q = dq, .kv = dkv, .cc = dcc, .zz = dzz, .qi = dqi,
                              .wt = dwt, .sel = sel, .cand = cand, .nsel = nsel, .ncand = ncand,
                              .o = bpoison(be, (size_t)R * Hd)};
        size_t wn = be->attn41_work ? be->attn41_work(&a) : DSV4_ATTN41_WORK(vis, K, c->W, c->H, d, c->ci);
        a.work = bpoison(be, wn);
        be->attn_step41(&a);
        bok(be, "attn_step41");
        get41(t, ho, a.o, (size_t)R * Hd * 4);
        be->download(hsel, sel, (size_t)R * K * 8), be->download(hnsel, nsel, R * 4);
        be->download(hcand, cand, (size_t)R * CB * 8), be->download(hncand, ncand, R * 4);
        for (int s = 0; s < S; s++)
            for (int i = 0; i < n; i++) {
                size_t g = (size_t)s * c->P + lo + i, r = (size_t)s * n + i;
                memcpy(out->o[l] + g * Hd, ho + r * Hd, Hd * sizeof(float));
                if (l < 2) {
                    memcpy(out->sel[l] + g * K, hsel + r * K, K * sizeof(int64_t));
                    out->nsel[l][g] = hnsel[r];
                }
                if (l == 0) {
                    memcpy(out->cand + g * CB, hcand + r * CB, CB * sizeof(int64_t));
                    out->ncand[g] = hncand[r];
                }
            }
        be->free(a.work), be->free(dq), be->free(dkv);
        if (dqi)
            be->free(dqi), be->free(dwt);
        free(q), free(kv), free(qi), free(wt);
    }
    for (int i = 0; i < L41 * S; i++) {
        get41(t, st[i].kv, dst[i].kv, kvb);
        if (i < S) {
            get41(t, st[i].c, dst[i].c, cb), get41(t, st[i].z, dst[i].z, cb);
            get41(t, st[i].ent, dst[i].ent, eb), get41(t, st[i].ikey, dst[i].ikey, ib);
        }
    }
    be->free(dtab), be->free(dpos), be->free(dstart), be->free(dseq), be->free(dfirst), be->free(sel), be->free(cand);
    be->free(nsel), be->free(ncand), be->free(dcc), be->free(dzz);
    be->free(dsink), be->free(dfreq), be->free(dnorm), be->free(dikn);
    if (dape)
        be->free(dape);
    free(dst), free(cc), free(zz), free(pos), free(start), free(seq), free(first), free(hsel), free(hcand), free(hnsel);
    free(hncand), free(ho);
}

/* Rope of the last rd channels of a row of width w at position p, in double: the angle is the
 * fp32 product backend.h states. */
static void rope41_d(double *x, int w, int rd, const float *freq, int64_t p)
{
    for (int i = 0; i < rd / 2; i++) {
        float ang = (float)p * freq[i];
        double cs = cos((double)ang), sn = sin((double)ang), *v = x + (w - rd) + 2 * i, a = v[0], b = v[1];
        v[0] = a * cs - b * sn;
        v[1] = a * sn + b * cs;
    }
}

static void rms41_d(double *x, int n, const float *w)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    double inv = 1.0 / sqrt(ss / n + 1e-6);
    for (int i = 0; i < n; i++)
        x[i] *= inv * w[i];
}

/* Entry w of sequence s and its index key, in double from the inputs (rope at position pos_of):
 * m > 1, the softmax pool of the group, RMS-normed; m = 1, the row's cc. */
static void entry41_d(const attn41_case *c, const in41 *in, int s, int64_t w, int64_t pos_of, double *ent, double *key)
{
    int d = c->d, m = c->m;
    for (int ch = 0; ch < d; ch++) {
        double mx = -INFINITY, den = 0, acc = 0;
        for (int j = 0; j < m; j++) {
            size_t g = (size_t)s * c->P + w * m + j;
            mx = fmax(mx, (double)in->zz[g * d + ch] + (in->apev ? in->apev[j * d + ch] : 0.0));
        }
        for (int j = 0; j < m; j++) {
            size_t g = (size_t)s * c->P + w * m + j;
            double e = exp((double)in->zz[g * d + ch] + (in->apev ? in->apev[j * d + ch] : 0.0) - mx);
            den += e;
            acc += e * in->cc[g * d + ch];
        }
        ent[ch] = m > 1 ? acc / den : in->cc[((size_t)s * c->P + w) * d + ch];
    }
    if (m > 1) /* ratio 1: the row's latent, normed by the forward, as it is */
        rms41_d(ent, d, in->norm);
    const float *W = in->iwk.data;
    for (int i = 0; i < c->ci; i++) {
        double v = 0;
        for (int j = 0; j < d; j++)
            v += (double)W[(size_t)i * d + j] * ent[j];
        key[i] = v;
    }
    rms41_d(key, c->ci, in->iknorm);
    rope41_d(key, c->ci, c->rd, in->freq, pos_of);
    rope41_d(ent, d, c->rd, in->freq, pos_of);
}

/* Scores of row g's query (index layer k) against sequence s's stored keys, in double, with a
 * bound on the op's error: per head, the dot's gamma(ci) sum|q k|; the weighted sum's
 * gamma(nI + 1) over its terms. */
static void scores41_d(const attn41_case *c, const in41 *in, int k, size_t g, const float *keys, int64_t nvis,
                       double *sc, double *tl)
{
    int ci = c->ci, nI = c->nI;
    for (int64_t w = 0; w < nvis; w++) {
        double s = 0, t = 0;
        for (int h = 0; h < nI; h++) {
            const float *qh = in->qi[k] + (g * nI + h) * ci;
            double v = 0, a = 0;
            for (int j = 0; j < ci; j++) {
                v += (double)qh[j] * keys[w * ci + j];
                a += fabs((double)qh[j] * keys[w * ci + j]);
            }
            double wh = in->wt[k][g * nI + h];
            s += wh * (v > 0 ? v : 0);
            t += fabs(wh) * (gam(ci) * a + U * fabs(v)) + gam(nI + 1.0) * fabs(wh * v);
        }
        sc[w] = s;
        tl[w] = t;
    }
}

/* Whether a kept set sel[0..n) of nvis scored items is a top-k the op may give: n = min(k, nvis),
 * ascending ids, and no item left out beats a kept one by more than their bounds; items
 * masked (-inf) are kept only once no unmasked one is left out, lowest ids first (ties to the
 * lower index). */
static int topk41_ok(const int64_t *sel, int n, int k, int64_t nvis, const double *sc, const double *tl,
                     const uint8_t *masked)
{
    if (n != (k < nvis ? k : nvis))
        return 0;
    uint8_t *in = calloc(nvis + 1, 1);
    int ok = 1;
    for (int i = 0; i < n && ok; i++) {
        ok = sel[i] >= 0 && sel[i] < nvis && (i == 0 || sel[i] > sel[i - 1]);
        if (ok)
            in[sel[i]] = 1;
    }
    for (int64_t a = 0; a < nvis && ok; a++)
        for (int64_t b = 0; b < nvis && ok && in[a]; b++) {
            if (in[b])
                continue;
            int ma = masked && masked[a], mb = masked && masked[b];
            if (ma && !mb)
                ok = 0;
            else if (ma && mb)
                ok = a < b;
            else if (!ma && !mb)
                ok = sc[a] + tl[a] >= sc[b] - tl[b];
        }
    free(in);
    return ok;
}

/* Control: the selection's best entry swapped for the worst one left out; B's selection judged
 * without A's blocks; an entry's rope one position off; the row's own window row left out of the attention. Rows: cut in two steps
 * (the second continuing from the first's state) == one step, bit for bit, outputs and state. */
static void attn41_on(const target *t, const attn41_case *c, const in41 *inp, double sf);

static void test_attn_step41(const attn41_case *c)
{
    int S = c->S, P = c->P, d = c->d, H = c->H, Hd = H * d, ci = c->ci, nI = c->nI;
    size_t Rt = (size_t)S * P;
    in41 in = {0};
    for (int l = 0; l < L41; l++) {
        fill(in.q[l] = falloc(Rt * Hd), Rt * Hd, -1, 1);
        fill(in.kv[l] = falloc(Rt * d), Rt * d, -1, 1);
    }
    fill(in.cc = falloc(Rt * d), Rt * d, -1, 1);
    fill(in.zz = falloc(Rt * d), Rt * d, -2, 2);
    for (int k = 0; k < 2; k++) {
        fill(in.qi[k] = falloc(Rt * nI * ci), Rt * nI * ci, -1, 1);
        fill(in.wt[k] = falloc(Rt * nI), Rt * nI, -1, 1);
    }
    fill(in.sink = falloc(H), H, -1, 1);
    fill(in.norm = falloc(d), d, 0.5f, 1.5f);
    fill(in.iknorm = falloc(ci), ci, 0.5f, 1.5f);
    if (c->ape)
        fill(in.apev = falloc((size_t)c->m * d), (size_t)c->m * d, -1, 1);
    in.freq = falloc(c->rd / 2);
    for (int i = 0; i < c->rd / 2; i++)
        in.freq[i] = powf(10000.0f, -2.0f * i / c->rd);
    make_weight(DSV4_WF_F32, ci, d, 0, 0, 0, &in.iwk);
    for (int o = -1; o < n_others; o++) {
        const target *t = o < 0 ? &cpu_t : &others[o];
        put_weights(t, &in.iwk, 1);
        attn41_on(t, c, &in, o < 0 ? 1.0 : OTHER);
        drop_weights(t, &in.iwk, 1);
    }
    for (int l = 0; l < L41; l++)
        free(in.q[l]), free(in.kv[l]);
    for (int k = 0; k < 2; k++)
        free(in.qi[k]), free(in.wt[k]);
    free(in.cc), free(in.zz), free(in.sink), free(in.norm), free(in.iknorm), free(in.apev), free(in.freq);
    free_weight(&in.iwk);
}

/* The op on t for case c: one step and the same rows cut in two, checked against the double
 * references (bounds times sf: 1 for the CPU, OTHER for another backend). */
static void attn41_on(const target *t, const attn41_case *c, const in41 *inp, double sf)
{
    int S = c->S, P = c->P, d = c->d, H = c->H, Hd = H * d, ci = c->ci, K = c->topk, bs = c->cand_bs;
    size_t Rt = (size_t)S * P;
    const in41 in = *inp;
    dsv4_lbufs *st = state41(c), *st2 = state41(c);
    out41 one = {0}, two = {0};
    out41_alloc(c, &one);
    out41_alloc(c, &two);
    step41(t, c, &in, st, 0, P, &one);
    step41(t, c, &in, st2, 0, c->cut, &two);
    step41(t, c, &in, st2, c->cut, P, &two);
    char what[160];
    const char *bn = t->be->name;

    /* the entries and keys A emitted, against the double reference */
    int64_t ne = P / c->m;
    size_t nent = (size_t)S * ne;
    float *eref = falloc(nent * (d + ci)), *ebad = falloc(nent * (d + ci)), *egot = falloc(nent * (d + ci));
    double *etol = malloc(nent * (d + ci) * sizeof(double)), *ed = malloc((d + ci) * sizeof(double));
    for (int s = 0; s < S; s++)
        for (int64_t w = 0; w < ne; w++) {
            size_t at = ((size_t)s * ne + w) * (d + ci);
            memcpy(egot + at, st[s].ent + w * d, d * sizeof(float));
            memcpy(egot + at + d, st[s].ikey + w * ci, ci * sizeof(float));
            /* bound, taken whole: the pool's m-term softmax and sum, the norm's d-term mean, the key's
             * d-term product and ci-term mean, the ropes: gamma(4 (m + d + ci) + 64) times the row's
             * largest magnitude (each step's error is relative to its inputs, all of that size) */
            entry41_d(c, &in, s, w, w * c->m, ed, ed + d);
            double mx = 0;
            for (int i = 0; i < d + ci; i++)
                mx = fmax(mx, fabs(ed[i]));
            for (int i = 0; i < d + ci; i++) {
                eref[at + i] = (float)ed[i];
                etol[at + i] = gam(4.0 * (c->m + d + ci) + 64) * mx;
            }
            entry41_d(c, &in, s, w, w * c->m + 1, ed, ed + d);
            for (int i = 0; i < d + ci; i++)
                ebad[at + i] = (float)ed[i];
        }
    snprintf(what, sizeof what, "%s on %s: entries and keys", c->name, bn);
    CHECK(agree_within(what, egot, eref, etol, nent * (d + ci), sf, 0), "%s: differ", what);
    snprintf(what, sizeof what, "%s on %s: entry rope one position off", c->name, bn);
    control_within(what, egot, ebad, etol, nent * (d + ci), sf);

    /* the selections, against double scores of the keys A stored */
    double *sc = malloc((ne + 1) * sizeof(double)), *tl = malloc((ne + 1) * sizeof(double));
    double *bsc = malloc((ne + 1) * sizeof(double)), *btl = malloc((ne + 1) * sizeof(double));
    uint8_t *mask = malloc(ne + 1);
    int bad_sel = 0, bad_cand = 0, control = 0, controlled = 0, unfiltered = 0;
    for (int s = 0; s < S; s++)
        for (int p = 0; p < P; p++) {
            size_t g = (size_t)s * P + p;
            int64_t nvis = (p + 1) / c->m, nb = (nvis + bs - 1) / bs;
            scores41_d(c, &in, 0, g, st[s].ikey, nvis, sc, tl);
            bad_sel += !topk41_ok(one.sel[0] + g * K, one.nsel[0][g], K, nvis, sc, tl, NULL);
            if (!controlled && nvis > K) { /* the best kept swapped for the worst left out */
                int64_t sw[64], best = 0, worst = -1;
                memcpy(sw, one.sel[0] + g * K, K * sizeof(int64_t));
                for (int i = 1; i < K; i++)
                    if (sc[sw[i]] > sc[sw[best]])
                        best = i;
                for (int64_t w = 0; w < nvis; w++) {
                    int kept = 0;
                    for (int i = 0; i < K; i++)
                        kept |= sw[i] == w;
                    if (!kept && (worst < 0 || sc[w] < sc[worst]))
                        worst = w;
                }
                sw[best] = worst;
                for (int i = 1; i < K; i++) /* ascending again */
                    for (int j = i; j > 0 && sw[j] < sw[j - 1]; j--) {
                        int64_t t = sw[j];
                        sw[j] = sw[j - 1], sw[j - 1] = t;
                    }
                control = !topk41_ok(sw, K, K, nvis, sc, tl, NULL);
                controlled = 1;
            }
            /* the candidate blocks: best score of each, the newest forced in */
            for (int64_t b = 0; b < nb; b++) {
                bsc[b] = -INFINITY, btl[b] = 0;
                for (int64_t w = b * bs; w < nvis && w < (b + 1) * bs; w++)
                    if (sc[w] > bsc[b])
                        bsc[b] = sc[w], btl[b] = tl[w];
            }
            if (nb)
                bsc[nb - 1] = INFINITY;
            int64_t cs[64];
            int nc = one.ncand[g];
            memcpy(cs, one.cand + g * c->cand_k, nc * sizeof(int64_t));
            for (int i = 1; i < nc; i++)
                for (int j = i; j > 0 && cs[j] < cs[j - 1]; j--) {
                    int64_t t = cs[j];
                    cs[j] = cs[j - 1], cs[j - 1] = t;
                }
            bad_cand += !topk41_ok(cs, nc, c->cand_k, nb, bsc, btl, NULL) || (nb && cs[nc - 1] != nb - 1);
            /* B: A's keys, entries outside A's blocks masked */
            scores41_d(c, &in, 1, g, st[s].ikey, nvis, sc, tl);
            for (int64_t w = 0; w < nvis; w++) {
                mask[w] = 1;
                for (int i = 0; i < nc; i++)
                    if (cs[i] == w / bs)
                        mask[w] = 0;
            }
            bad_sel += !topk41_ok(one.sel[1] + g * K, one.nsel[1][g], K, nvis, sc, tl, mask);
            unfiltered += !topk41_ok(one.sel[1] + g * K, one.nsel[1][g], K, nvis, sc, tl, NULL);
        }
    snprintf(what, sizeof what, "%s on %s: A's and B's top-k", c->name, bn);
    CHECK(!bad_sel, "%s: %d rows' selections are no top-k of the scores", what, bad_sel);
    printf("  %-52s %d rows off  %s\n", what, bad_sel, bad_sel ? "FAIL" : "ok");
    snprintf(what, sizeof what, "%s on %s: A's candidate blocks", c->name, bn);
    CHECK(!bad_cand, "%s: %d rows' blocks are not the best", what, bad_cand);
    printf("  %-52s %d rows off  %s\n", what, bad_cand, bad_cand ? "FAIL" : "ok");
    CHECK(controlled && control, "control %s: a selection with its best entry swapped out passed", c->name);
    snprintf(what, sizeof what, "%s on %s: the best entry swapped out", c->name, bn);
    printf("  control %-44s %s\n", what, controlled && control ? "caught" : "NOT CAUGHT");
    snprintf(what, sizeof what, "%s on %s: B's top-k without A's blocks", c->name, bn);
    CHECK(unfiltered > 0, "control %s: B's selections are also the unfiltered top-k", what);
    printf("  control %-44s %s\n", what, unfiltered ? "caught" : "NOT CAUGHT");

    /* the outputs: attend over the selected stored entries, then the window rows */
    for (int l = 0; l < L41; l++) {
        float *ref = falloc(Rt * Hd), *bad = falloc(Rt * Hd);
        double *tol = malloc(Rt * Hd * sizeof(double)), *scr = malloc(Hd * sizeof(double));
        const float **rows = malloc((K + c->W + 1) * sizeof *rows);
        const int64_t *sl = one.sel[l == 0 ? 0 : 1];
        const int *ns = one.nsel[l == 0 ? 0 : 1];
        for (int s = 0; s < S; s++)
            for (int p = 0; p < P; p++) {
                size_t g = (size_t)s * P + p;
                int nk = 0;
                for (int i = 0; i < ns[g]; i++)
                    rows[nk++] = st[s].ent + sl[g * K + i] * d;
                for (int j = p - c->W + 1 < 0 ? 0 : p - c->W + 1; j <= p; j++)
                    rows[nk++] = in.kv[l] + ((size_t)s * P + j) * d;
                float scale = 1.0f / sqrtf((float)d);
                attend_ref(in.q[l] + g * Hd, H, d, rows, nk, scale, in.sink, ref + g * Hd, tol + g * Hd);
                attend_ref(in.q[l] + g * Hd, H, d, rows, nk - 1, scale, in.sink, bad + g * Hd, scr);
            }
        snprintf(what, sizeof what, "%s on %s: layer %c's output", c->name, bn, "ABC"[l]);
        CHECK(agree_within(what, one.o[l], ref, tol, Rt * Hd, sf, 0), "%s: differs", what);
        snprintf(what, sizeof what, "layer %c on %s: the row's own window row left out", "ABC"[l], bn);
        control_within(what, one.o[l], bad, tol, Rt * Hd, sf);
        free(ref), free(bad), free(tol), free(scr), free(rows);
    }

    /* cut in two == one step */
    int same = 1;
    for (int l = 0; l < L41; l++)
        same &= rows_equal(one.o[l], two.o[l], Rt * Hd);
    for (int k = 0; k < 2; k++)
        same &= !memcmp(one.sel[k], two.sel[k], Rt * K * sizeof(int64_t)) &&
                !memcmp(one.nsel[k], two.nsel[k], Rt * sizeof(int));
    same &= !memcmp(one.cand, two.cand, Rt * c->cand_k * sizeof(int64_t)) &&
            !memcmp(one.ncand, two.ncand, Rt * sizeof(int));
    for (int s = 0; s < S; s++)
        same &= rows_equal(st[s].ent, st2[s].ent, (size_t)ent_cap41(c) * d) &&
                rows_equal(st[s].ikey, st2[s].ikey, (size_t)ent_cap41(c) * ci);
    snprintf(what, sizeof what, "%s on %s (cut at %d)", c->name, bn, c->cut);
    CHECK(same, "%s: two steps differ from one", what);
    printf("  %-52s two steps == one: %s\n", what, same ? "bitwise" : "DIFFER");

    free(eref), free(ebad), free(egot), free(etol), free(ed), free(sc), free(tl), free(bsc), free(btl), free(mask);
    out41_free(&one), out41_free(&two);
    state41_free(c, st), state41_free(c, st2);
}

static const attn41_case attn41_cases[] = {
    {.name = "attn_step41 m=2 S=2", .S = 2, .P = 40, .m = 2, .H = 2, .d = 32, .rd = 16, .W = 8, .nI = 4, .ci = 16,
     .topk = 6, .cand_bs = 4, .cand_k = 2, .ape = 1, .cut = 13},
    {.name = "attn_step41 m=1 S=3", .S = 3, .P = 24, .m = 1, .H = 4, .d = 32, .rd = 8, .W = 4, .nI = 2, .ci = 16,
     .topk = 5, .cand_bs = 3, .cand_k = 3, .ape = 0, .cut = 7},
};

/* REF's attention (backend.h, attn_step41 step 4): the sums in double and o rounded to float
 * once, so every backend's o is the double attention rounded to float, bit for bit (a double
 * sum's error moves that rounding only where the value lies within about 1e-16 of a boundary
 * between floats: about 1e-8 of the elements). A sliding layer (ratio 0) of two sequences,
 * where REF rounds nothing else: the window's rows alone, at 48 and 1024 rows and two head
 * widths, so that every form a device has runs. Control: the same step without ref
 * (fp32 sums) leaves some elements off the rounded double. */
static void test_attn41_ref(const target *t, int P, int d)
{
    enum { S = 2, H = 8, W = 16, KV_CAP = W + 2 };
    int R = S * P;
    const dsv4_backend *be = t->be;
    float *q = falloc((size_t)R * H * d), *kv = falloc((size_t)R * d), *sink = falloc(H), *want = falloc((size_t)R * H * d);
    double *tol = malloc((size_t)R * H * d * sizeof(double));
    fill(q, (size_t)R * H * d, -1, 1);
    fill(kv, (size_t)R * d, -1, 1);
    fill(sink, H, -1, 1);
    for (int s = 0; s < S; s++)
        for (int p = 0; p < P; p++) {
            const float *rows[W];
            int nk = 0;
            for (int j = p - W + 1 < 0 ? 0 : p - W + 1; j <= p; j++)
                rows[nk++] = kv + ((size_t)s * P + j) * d;
            size_t g = (size_t)s * P + p;
            attend_ref(q + g * H * d, H, d, rows, nk, 1.0f / sqrtf((float)d), sink, want + g * H * d, tol + g * H * d);
        }
    int64_t *pos = malloc(R * sizeof(int64_t)), start[S] = {0, 0};
    int32_t *seq = malloc(R * sizeof(int32_t)), first[S] = {0, P};
    for (int r = 0; r < R; r++)
        pos[r] = r % P, seq[r] = r / P;
    int off[2] = {0, 0};
    for (int ref = 1; ref >= 0; ref--) {
        dsv4_lbufs st[S] = {{0}};
        for (int s = 0; s < S; s++)
            st[s].kv = bput(be, NULL, (size_t)KV_CAP * d * sizeof(float));
        dsv4_lbufs *dst = bput(be, st, sizeof st);
        int64_t *dpos = bput(be, pos, R * sizeof(int64_t)), *dstart = bput(be, start, sizeof start);
        int32_t *dseq = bput(be, seq, R * sizeof(int32_t)), *dfirst = bput(be, first, sizeof first);
        float *dq = bput(be, q, (size_t)R * H * d * sizeof(float)), *dkv = bput(be, kv, (size_t)R * d * sizeof(float));
        float *dsink = bput(be, sink, H * sizeof(float));
        dsv4_attn41_args a = {.rows = {.R = R, .S = S, .pos = dpos, .seq = dseq, .start = dstart, .first = dfirst},
                              .st = dst, .est = dst, .ist = dst, .kv_cap = KV_CAP, .c_cap = 1, .H = H, .d = d,
                              .window = W, .scale = 1.0f / sqrtf((float)d), .eps = 1e-6f, .sink = dsink, .ref = ref,
                              .q = dq, .kv = dkv, .o = bpoison(be, (size_t)R * H * d)};
        size_t wn = be->attn41_work ? be->attn41_work(&a) : DSV4_ATTN41_WORK(0, 0, W, H, d, 0);
        a.work = bpoison(be, wn);
        be->attn_step41(&a);
        bok(be, "attn_step41 (REF attention)");
        float *got = bget(be, a.o, (size_t)R * H * d * sizeof(float));
        for (size_t i = 0; i < (size_t)R * H * d; i++)
            off[ref] += memcmp(&got[i], &want[i], sizeof(float)) != 0;
        free(got);
        be->free(a.o), be->free(a.work), be->free(dq), be->free(dkv), be->free(dpos), be->free(dstart), be->free(dseq);
        be->free(dfirst), be->free(dst), be->free(dsink);
        for (int s = 0; s < S; s++)
            be->free(st[s].kv);
    }
    char what[96];
    snprintf(what, sizeof what, "attn_step41 REF attention, %d rows, d %d, on %s", R, d, be->name);
    CHECK(!off[1], "%s: %d of %d elements are not the double attention rounded once", what, off[1], R * H * d);
    printf("  %-52s == double, rounded once: %d elements off  %s\n", what, off[1], off[1] ? "FAIL" : "ok");
    CHECK(off[0] > 0, "control attn_step41 on %s: the fp32 attention also equals the rounded double everywhere", be->name);
    printf("  control %-44s %s (%d elements off)\n", "fp32 sums are not the rounded double", off[0] ? "caught" : "NOT CAUGHT",
           off[0]);
    free(q), free(kv), free(sink), free(want), free(tol), free(pos), free(seq);
}

/* ---- the cases ---------------------------------------------------------------------------------- */

static const lin_case linq_cases[] = {
    {.name = "linear_q fp8 e8m0 T=5, k%32!=0", .form = DSV4_WF_FP8, .n = 96, .k = 200, .bn = 64, .bk = 64, .e8m0 = 1, .T = 5,
     .padx = 3},
    {.name = "linear_q fp4 e8m0 T=4", .form = DSV4_WF_FP4, .n = 64, .k = 512, .bn = 1, .bk = 32, .e8m0 = 1, .T = 4},
    /* shapes the tensor cores take, at each pass width (8, 16, 64 tokens) */
    {.name = "linear_q fp8 [32, 32] blocks T=1", .form = DSV4_WF_FP8, .n = 160, .k = 768, .bn = 32, .bk = 32, .e8m0 = 1,
     .T = 1},
    {.name = "linear_q fp8 [32, 32] blocks T=13", .form = DSV4_WF_FP8, .n = 96, .k = 1024, .bn = 32, .bk = 32, .e8m0 = 1,
     .T = 13},
    {.name = "linear_q fp8 [128, 128] blocks T=70", .form = DSV4_WF_FP8, .n = 144, .k = 512, .bn = 128, .bk = 128,
     .e8m0 = 1, .T = 70},
    {.name = "linear_q fp8 [128, 128] blocks T=3, k%128!=0", .form = DSV4_WF_FP8, .n = 64, .k = 456, .bn = 128,
     .bk = 128, .e8m0 = 1, .T = 3, .padx = 5},
    {.name = "linear_q fp4 T=33", .form = DSV4_WF_FP4, .n = 80, .k = 1024, .bn = 1, .bk = 32, .e8m0 = 1, .T = 33},
};

static const lin_case lin_cases[] = {
    {.name = "linear fp8 e8m0 T=9", .form = DSV4_WF_FP8, .n = 256, .k = 512, .bn = 128, .bk = 128, .e8m0 = 1, .T = 9},
    {.name = "linear fp8 e8m0 T=1 (fused row)", .form = DSV4_WF_FP8, .n = 130, .k = 1024, .bn = 128, .bk = 128, .e8m0 = 1, .T = 1},
    {.name = "linear fp8 rows 37..173 strided", .form = DSV4_WF_FP8, .n = 200, .k = 320, .bn = 64, .bk = 64, .e8m0 = 1,
     .r0 = 37, .r1 = 173, .T = 3, .padx = 5, .pady = 3},
    {.name = "linear fp8 f32 scales k%16!=0", .form = DSV4_WF_FP8, .n = 70, .k = 100, .bn = 64, .bk = 64, .T = 5},
    {.name = "linear fp8 f32 scales k=2048 T=1", .form = DSV4_WF_FP8, .n = 96, .k = 2048, .bn = 128, .bk = 128, .T = 1},
    {.name = "linear fp4 e8m0 T=7", .form = DSV4_WF_FP4, .n = 128, .k = 1024, .bn = 1, .bk = 32, .e8m0 = 1, .T = 7},
    {.name = "linear fp4 e8m0 T=1 (fused row)", .form = DSV4_WF_FP4, .n = 64, .k = 512, .bn = 1, .bk = 32, .e8m0 = 1, .T = 1},
    {.name = "linear fp4 bk 16 f32 scales", .form = DSV4_WF_FP4, .n = 40, .k = 80, .bn = 1, .bk = 16, .T = 3},
    {.name = "linear fp4 rows 3..60 strided", .form = DSV4_WF_FP4, .n = 64, .k = 96, .bn = 1, .bk = 32, .e8m0 = 1,
     .r0 = 3, .r1 = 60, .T = 2, .padx = 2, .pady = 1},
    {.name = "linear bf16 T=10", .form = DSV4_WF_BF16, .n = 300, .k = 768, .T = 10},
    {.name = "linear bf16 k=45 strided", .form = DSV4_WF_BF16, .n = 33, .k = 45, .T = 2, .padx = 1},
    {.name = "linear f16 rows 8..64", .form = DSV4_WF_F16, .n = 64, .k = 256, .r0 = 8, .T = 4, .pady = 2},
    {.name = "linear f32 T=8", .form = DSV4_WF_F32, .n = 50, .k = 132, .T = 8, .padx = 4},
};

static const blocks_case blocks_cases[] = {
    {.name = "linear_blocks fp8 8x128 T=5", .form = DSV4_WF_FP8, .G = 8, .rk = 128, .k = 512, .bn = 128, .bk = 128, .T = 5},
    {.name = "linear_blocks fp8 4x64 T=1", .form = DSV4_WF_FP8, .G = 4, .rk = 64, .k = 256, .bn = 64, .bk = 128, .T = 1},
    {.name = "linear_blocks fp4 2x96 T=3", .form = DSV4_WF_FP4, .G = 2, .rk = 96, .k = 256, .bn = 1, .bk = 32, .T = 3},
};

static const multi_case multi_cases[] = {
    {.name = "linear_multi k=512 T=5", .k = 512, .T = 5, .nw = 4,
     .w = {{.form = DSV4_WF_FP8, .n = 256, .bn = 128, .bk = 128, .e8m0 = 1},
           {.form = DSV4_WF_FP4, .n = 96, .bn = 1, .bk = 32, .e8m0 = 1},
           {.form = DSV4_WF_BF16, .n = 70},
           {.form = DSV4_WF_F32, .n = 3}}},
    {.name = "linear_multi k=100 T=1 strided", .k = 100, .T = 1, .padx = 4, .nw = 3,
     .w = {{.form = DSV4_WF_FP8, .n = 70, .bn = 64, .bk = 64},
           {.form = DSV4_WF_FP4, .n = 30, .bn = 1, .bk = 20, .e8m0 = 1},
           {.form = DSV4_WF_F16, .n = 17}}},
};

static const embed_case embed_cases[] = {
    {.name = "embed bf16 T=7 n=4", .form = DSV4_WF_BF16, .n = 1000, .k = 256, .T = 7, .streams = 4},
    {.name = "embed fp8 e8m0 T=5 n=1", .form = DSV4_WF_FP8, .n = 300, .k = 200, .bn = 128, .bk = 128, .e8m0 = 1, .T = 5,
     .streams = 1},
    {.name = "embed fp8 f32 scales T=4 n=2", .form = DSV4_WF_FP8, .n = 129, .k = 100, .bn = 64, .bk = 64, .T = 4, .streams = 2},
    {.name = "embed fp4 T=3 n=4", .form = DSV4_WF_FP4, .n = 77, .k = 128, .bn = 1, .bk = 32, .e8m0 = 1, .T = 3, .streams = 4},
    {.name = "embed f16 T=3 n=3", .form = DSV4_WF_F16, .n = 50, .k = 70, .T = 3, .streams = 3},
    {.name = "embed f32 T=3 n=2", .form = DSV4_WF_F32, .n = 40, .k = 33, .T = 3, .streams = 2},
};

static const norm_case norm_cases[] = {
    {.name = "rmsnorm 5x1000 weighted", .rows = 5, .dim = 1000, .weighted = 1},
    {.name = "rmsnorm 3x4096", .rows = 3, .dim = 4096},
    {.name = "rmsnorm 4x512 weighted in place", .rows = 4, .dim = 512, .weighted = 1, .in_place = 1},
    {.name = "rmsnorm 2x7 in place", .rows = 2, .dim = 7, .in_place = 1},
};

static const rope_case rope_cases[] = {
    {.name = "rope T=4 3x64 rd 16 padded", .T = 4, .heads = 3, .d = 64, .rd = 16, .pad = 8},
    {.name = "rope T=3 8x128 rd 64 inverse", .T = 3, .heads = 8, .d = 128, .rd = 64, .inverse = 1},
    {.name = "rope T=2 1x512 rd 64", .T = 2, .heads = 1, .d = 512, .rd = 64},
    {.name = "rope T=5 4x64 rd 16 odd stride", .T = 5, .heads = 4, .d = 64, .rd = 16, .pad = 3},
};

static const hc_case hc_cases[] = {
    {.name = "hc_pre T=3 n=4 D=512 sinkhorn 3", .T = 3, .n = 4, .D = 512, .full = 1, .iters = 3},
    {.name = "hc_pre T=2 n=4 D=300 sinkhorn 2 normed", .T = 2, .n = 4, .D = 300, .full = 1, .iters = 2, .normed = 1},
    {.name = "hc_pre T=2 n=3 D=200 sinkhorn 1", .T = 2, .n = 3, .D = 200, .full = 1, .iters = 1},
    {.name = "hc_pre T=2 n=1 D=300 sinkhorn 2", .T = 2, .n = 1, .D = 300, .full = 1, .iters = 2},
    {.name = "hc_pre T=2 n=4 D=700 head", .T = 2, .n = 4, .D = 700},
    {.name = "hc_pre T=3 n=4 D=256 head normed", .T = 3, .n = 4, .D = 256, .normed = 1},
    {.name = "hc_pre T=2 n=4 D=16 sinkhorn 1 eps 0.05", .T = 2, .n = 4, .D = 16, .full = 1, .iters = 1, .hc_eps = 0.05f},
    {.name = "hc_pre T=2 n=4 D=16 sinkhorn 2 eps 0.05", .T = 2, .n = 4, .D = 16, .full = 1, .iters = 2, .hc_eps = 0.05f},
    {.name = "hc_pre T=2 n=4 D=16 head eps 0.05 normed", .T = 2, .n = 4, .D = 16, .normed = 1, .hc_eps = 0.05f},
};

static const hcx_case collapse_cases[] = {
    {.name = "hc_collapse T=5 n=4 D=700", .T = 5, .n = 4, .D = 700},
    {.name = "hc_collapse T=2 n=2 D=33", .T = 2, .n = 2, .D = 33},
};
static const hcx_case engram_cases[] = {
    {.name = "engram_gate T=5 n=4 D=700", .T = 5, .n = 4, .D = 700},
    {.name = "engram_gate T=3 n=2 D=33", .T = 3, .n = 2, .D = 33},
};

/* The _rb forms' cases: a row longer than a device may hold in registers (5000), a rope with
 * every channel rotated and one with none. */
static const norm_case norm_rb_cases[] = {
    {.name = "rmsnorm_rb 5x1000 weighted", .rows = 5, .dim = 1000, .weighted = 1},
    {.name = "rmsnorm_rb 3x5000 weighted", .rows = 3, .dim = 5000, .weighted = 1},
    {.name = "rmsnorm_rb 6x128 in place", .rows = 6, .dim = 128, .in_place = 1},
    {.name = "rmsnorm_rb 2x7 weighted in place", .rows = 2, .dim = 7, .weighted = 1, .in_place = 1},
};

static const rope_case rope_rb_cases[] = {
    {.name = "rope_rb T=4 3x64 rd 16 padded", .T = 4, .heads = 3, .d = 64, .rd = 16, .pad = 8},
    {.name = "rope_rb T=3 8x128 rd 64 inverse", .T = 3, .heads = 8, .d = 128, .rd = 64, .inverse = 1},
    {.name = "rope_rb T=2 1x512 rd 64", .T = 2, .heads = 1, .d = 512, .rd = 64},
    {.name = "rope_rb T=5 4x32 rd 32 odd stride", .T = 5, .heads = 4, .d = 32, .rd = 32, .pad = 3},
    {.name = "rope_rb T=2 2x40 rd 0", .T = 2, .heads = 2, .d = 40, .rd = 0},
};

static const hcx_case post_rb_cases[] = {
    {.name = "hc_post_rb T=3 n=4 D=700", .T = 3, .n = 4, .D = 700},
    {.name = "hc_post_rb T=2 n=1 D=64", .T = 2, .n = 1, .D = 64},
};

static const hcx_case post_cases[] = {
    {.name = "hc_post T=3 n=4 D=700", .T = 3, .n = 4, .D = 700},
    {.name = "hc_post T=2 n=1 D=64", .T = 2, .n = 1, .D = 64},
};

static const attend_case attend_cases[] = {
    {.name = "attend H=4 d=96 keys 37", .H = 4, .d = 96, .nk = 37, .pool = 50},
    {.name = "attend H=8 d=512 keys 300", .H = 8, .d = 512, .nk = 300, .pool = 400},
    {.name = "attend H=2 d=64 no keys", .H = 2, .d = 64, .nk = 0, .pool = 1},
};

static const elem_case elem_cases[] = {
    {.name = "add n=10001", .op = 0, .n = 10001},
    {.name = "add n=4096 in place", .op = 0, .n = 4096, .alias = 1},
    {.name = "swiglu n=10001 limit 1", .op = 1, .n = 10001, .limit = 1.0f},
    {.name = "swiglu n=4096 no limit", .op = 1, .n = 4096},
    {.name = "swiglu n=999 limit 2 in place", .op = 1, .n = 999, .limit = 2.0f, .alias = 1},
    {.name = "scale n=10001 by 1/sqrt(128)", .op = 2, .n = 10001, .limit = 0.08838835f},
    {.name = "scale n=4096 in place", .op = 2, .n = 4096, .limit = -3.1f, .alias = 1},
};

static const route_case route_cases[] = {
    {.name = "route R=9 E=64 K=6 ties bias norm", .R = 9, .E = 64, .K = 6, .ties = 1, .bias = 1, .norm = 1},
    {.name = "route R=9 E=64 K=6 ties", .R = 9, .E = 64, .K = 6, .ties = 1},
    {.name = "route R=33 E=256 K=8 bias norm", .R = 33, .E = 256, .K = 8, .bias = 1, .norm = 1},
    {.name = "route R=5 E=64 K=6 hash norm", .R = 5, .E = 64, .K = 6, .hash = 1, .norm = 1},
};

static const experts_case experts_cases[] = {
    {.name = "experts fp4 R=5 E=8 K=3", .form = DSV4_WF_FP4, .R = 5, .E = 8, .K = 3, .D = 256, .I = 128},
    {.name = "experts fp4 R=12 pre-weighted limit 1.5", .form = DSV4_WF_FP4, .R = 12, .E = 8, .K = 3, .D = 256, .I = 128,
     .pre_weight = 1, .limit = 1.5f},
    {.name = "experts fp8 R=6 E=6 K=4", .form = DSV4_WF_FP8, .R = 6, .E = 6, .K = 4, .D = 256, .I = 384},
    /* 20 pairs an expert: the tensor cores' prefill tiles */
    {.name = "experts fp4 R=40 E=4 K=2", .form = DSV4_WF_FP4, .R = 40, .E = 4, .K = 2, .D = 256, .I = 128},
};

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

int main(void)
{
    const char *seed = getenv("DSV4_SEED");
    rng = seed ? strtoull(seed, NULL, 10) : 20260301u;
    if (!rng)
        rng = 1;
    cpu = dsv4_backend_cpu();
    cpu_t = (target){.be = cpu};
#ifdef DSV4_CUDA
    /* DSV4_TEST_DEVICE=cuda (tests/cuda/on_device.sh): the device must answer; otherwise a
     * build with CUDA but no device tests the CPU alone */
    dsv4_err err = {0};
    const char *want = getenv("DSV4_TEST_DEVICE");
    if (!dsv4_cuda_init(&err)) {
        dsv4_cuda_set_poison(1);
        others[n_others++] = (target){.be = dsv4_backend_cuda(), .put_weight = dsv4_cuda_put_weight,
                                      .drop_weight = dsv4_cuda_drop_weight};
        printf("cuda: %s\n", dsv4_cuda_device_name());
    } else {
        CHECK(!want || strcmp(want, "cuda"), "DSV4_TEST_DEVICE=cuda but no device: %s", err.msg);
        printf("no CUDA device (%s): the CPU alone\n", err.msg);
    }
#endif
    printf("backend ops, seed %llu (DSV4_SEED to change), backends: cpu", (unsigned long long)rng);
    for (int o = 0; o < n_others; o++)
        printf(", %s", others[o].be->name);
    printf("\n");
    /* the ops' cases draw the same numbers whichever backends there are */
    uint64_t cases_seed = rng;
    for (int o = -1; o < n_others; o++) {
        test_table(o < 0 ? &cpu_t : &others[o]);
        test_memory(o < 0 ? &cpu_t : &others[o]);
    }
    rng = cases_seed;
    for (size_t i = 0; i < N_OF(lin_cases); i++)
        test_linear(&lin_cases[i]);
    test_rounding();
    for (size_t i = 0; i < N_OF(linq_cases); i++)
        test_linear_q(&linq_cases[i]);
    for (size_t i = 0; i < N_OF(blocks_cases); i++)
        test_linear_blocks(&blocks_cases[i]);
    for (size_t i = 0; i < N_OF(multi_cases); i++)
        test_linear_multi(&multi_cases[i]);
    for (size_t i = 0; i < N_OF(embed_cases); i++)
        test_embed(&embed_cases[i]);
    for (size_t i = 0; i < N_OF(norm_cases); i++)
        test_rmsnorm(&norm_cases[i]);
    for (size_t i = 0; i < N_OF(rope_cases); i++)
        test_rope(&rope_cases[i]);
    for (size_t i = 0; i < N_OF(hc_cases); i++)
        test_hc_pre(&hc_cases[i]);
    for (size_t i = 0; i < N_OF(collapse_cases); i++)
        test_hc_collapse(&collapse_cases[i]);
    for (size_t i = 0; i < N_OF(engram_cases); i++)
        test_engram_gate(&engram_cases[i]);
    for (size_t i = 0; i < N_OF(post_cases); i++)
        test_hc_post(&post_cases[i]);
    for (size_t i = 0; i < N_OF(attend_cases); i++)
        test_attend(&attend_cases[i]);
    for (size_t i = 0; i < N_OF(elem_cases); i++)
        test_elem(&elem_cases[i]);
    for (size_t i = 0; i < N_OF(route_cases); i++)
        test_route(&route_cases[i]);
    for (size_t i = 0; i < N_OF(experts_cases); i++)
        test_experts(&experts_cases[i]);
    for (size_t i = 0; i < N_OF(attn_cases); i++)
        test_attn_step(&attn_cases[i]);
    for (size_t i = 0; i < N_OF(attn41_cases); i++)
        test_attn_step41(&attn41_cases[i]);
    for (size_t i = 0; i < N_OF(rb_cases); i++)
        test_linear_rb(&rb_cases[i]);
    /* 48 rows and 1024 (a device may split a small step's columns over blocks, or share a large
     * step's key loads among heads); d 128 and 72 (a device may have a form for multiples of 16) */
    for (int o = -1; o < n_others; o++)
        for (int P = 24; P <= 512; P += 488)
            for (int d = 128; d >= 72; d -= 56)
                test_attn41_ref(o < 0 ? &cpu_t : &others[o], P, d);
    for (size_t i = 0; i < N_OF(norm_rb_cases); i++)
        test_rmsnorm_rb(&norm_rb_cases[i]);
    for (size_t i = 0; i < N_OF(rope_rb_cases); i++)
        test_rope_rb(&rope_rb_cases[i]);
    for (size_t i = 0; i < N_OF(post_rb_cases); i++)
        test_hc_post_rb(&post_rb_cases[i]);
    return check_summary("backend ops");
}
