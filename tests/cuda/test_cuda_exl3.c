/* The EXL3 linear kernel (src/kernels/cuda/exl3.cu) against the CPU (dsv4_exl3_linear_rows)
 * and against an exact (double) reference, on small layers built in memory: trellises from the
 * CPU quantizer (K = 2, 3, 4, 8 x each codebook) and random trellises (any 16-bit words are a
 * valid trellis: K = 1..8, shapes that give the kernel 1 to 8 k slices). n and k are below the
 * padded sizes; with and without bias; T = 1, 3, 9, 40; all rows and sub-ranges [r0, r1); x and
 * y rows strided; and one call of more rows than a round (exl3.cu computes 1024 rows at a time).
 * Fresh random inputs each run (seed printed; DSV4_SEED=n repeats a run).
 *
 * Both middle steps: the FMA core (the default) and, with DSV4_CUDA_TC=1, the tensor-core core
 * (exl3_mma.cuh), under the same tolerance. With the tensor cores on, every call also runs with
 * them off, and the two must differ somewhere in the run (so the tensor-core core is what ran);
 * only the FMA core is the CPU's operation sequence.
 *
 * Poisoning: device outputs are filled with NaN bytes before each launch and x's stride
 * padding holds NaN, so an element not written, or an x element read past k, shows; NaN never
 * passes, and y's stride padding must still hold the poison bytes after the call.
 *
 * Tolerance, per element y[t, c]: |gpu - ref| <= 1e-5 * M, with
 *   M = |bias_c| + |svh_c|/sqrt(128) * sum over the 128 columns c' of c's block, and all r < kp,
 *       of |x'[t, r] * What[r, c']|,   x' = H(x[t] ⊙ suh)/sqrt(128),
 * the sum of the absolute values of the terms of y[t, c] written in the rotated domain (each
 * x'_r What_rc' enters y_c times ±svh_c/sqrt(128)). The GPU runs the CPU's operations except
 * that the kp-long fma chain of each rotated output y'_c' is cut into S slice chains added
 * in slice order (S = dsv4_cuda_exl3_slices). Errors of either order against the exact sum
 * stay, in practice, near sqrt(length) * 2^-24 of the terms (about 3e-6 for kp = 2048, worst
 * case of a chain of length L: L * 2^-24); the Hadamard steps add at most 7 roundings of
 * partial sums bounded by the same terms, and x ⊙ suh one. 1e-5 is far below what a wrong
 * bit, sign, codebook or index moves (the controls below move it by orders of magnitude).
 * With S = 1 the FMA core runs exactly the CPU's operations: the bitwise agreement is printed.
 * The tensor-core core sums each 16-row k-step's six exact products (weight split into two bf16
 * terms, x into three) in the MMA's accumulator, one rounding a product group instead of one a
 * product: its error is of the same order, within the same bound.
 *
 * Checks: GPU vs CPU, GPU vs exact, CPU vs exact (the tolerance's own sanity); batch == solo
 * (each row alone, T = 1) bit for bit; a sub-range equals the same columns of the full range
 * bit for bit; the caller-scratch entry equals the cached-scratch one bit for bit; put twice
 * is a no-op, drop frees, a call on a layer not put fails and is reported once. Planted
 * controls that must be caught: a CPU reference with one suh sign flipped, an exact reference
 * with one tile decoded with another codebook, one without the bias, and the batch/solo
 * comparison of two different rows. */
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
#include "io/weight.h"
#include "kernels/cpu/exl3.h"
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/exl3_cuda.h"

#include "test_rng.h"

static double gauss(void)
{
    double u = (rnd() + 1.0) / 4294967297.0, v = rnd() / 4294967296.0;
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

static const double REL = 1e-5;

/* ---- layers in memory ---------------------------------------------------------------------- */

typedef struct lay {
    dsv4_exl3 e;
    dsv4_weight w;
    uint16_t *tr;
    float *suh, *svh, *bias;
    int quantized;
    char name[96];
} lay;

static const char *cb_name(int cb) { return cb == DSV4_EXL3_MCG ? "mcg" : cb == DSV4_EXL3_MUL1 ? "mul1" : "3inst"; }

/* An EXL3 layer of logical [n, k]: from the quantizer (quant) or random words and scales. */
static lay *make_lay(int K, int cb, int64_t n, int64_t k, int bias, int quant)
{
    int64_t kp = (k + 127) / 128 * 128, np = (n + 127) / 128 * 128;
    size_t nw = (size_t)(kp / 16) * (np / 16) * 16 * K;
    lay *L = calloc(1, sizeof *L);
    L->tr = malloc(nw * 2);
    L->suh = malloc(kp * sizeof(float));
    L->svh = malloc(np * sizeof(float));
    L->bias = bias ? malloc(n * sizeof(float)) : NULL;
    L->quantized = quant;
    snprintf(L->name, sizeof L->name, "K=%d %s [%lld,%lld]%s%s", K, cb_name(cb), (long long)n, (long long)k,
             bias ? " bias" : "", quant ? " quantized" : "");
    if (quant) {
        float *wv = malloc((size_t)n * k * sizeof(float));
        for (int64_t i = 0; i < n * k; i++)
            wv[i] = (float)(0.02 * gauss() * (1 + (i / k) % 5));
        dsv4_weight src = {.name = "src", .form = DSV4_WF_F32, .n = n, .k = k, .data = wv, .bytes = (size_t)n * k * 4};
        uint16_t *s16 = malloc(kp * 2), *v16 = malloc(np * 2);
        dsv4_exl3_qstats qs;
        dsv4_err err = {0};
        int rc = dsv4_exl3_quantize(&src, K, cb, rnd(), L->tr, s16, v16, &qs, NULL, NULL, &err);
        CHECK(!rc, "%s: quantize: %s", L->name, err.msg);
        for (int64_t i = 0; i < kp; i++)
            L->suh[i] = rc ? 1.0f : dsv4_f16_to_f32(s16[i]);
        for (int64_t i = 0; i < np; i++)
            L->svh[i] = rc ? 1.0f : dsv4_f16_to_f32(v16[i]);
        free(s16);
        free(v16);
        free(wv);
    } else {
        for (size_t i = 0; i < nw; i++)
            L->tr[i] = (uint16_t)rnd();
        for (int64_t i = 0; i < kp; i++)
            L->suh[i] = dsv4_f16_to_f32(dsv4_f32_to_f16((rnd() & 1 ? -1 : 1) * frand(0.005f, 0.02f)));
        for (int64_t i = 0; i < np; i++)
            L->svh[i] = dsv4_f16_to_f32(dsv4_f32_to_f16((rnd() & 1 ? -1 : 1) * frand(0.5f, 2.0f)));
    }
    for (int64_t i = 0; bias && i < n; i++)
        L->bias[i] = dsv4_f16_to_f32(dsv4_f32_to_f16(frand(-1, 1)));
    L->e = (dsv4_exl3){.prefix = L->name, .K = K, .cb = cb, .kp = kp, .np = np, .k = k, .n = n, .trellis = L->tr,
                       .suh = L->suh, .svh = L->svh, .bias = L->bias, .bytes = nw * 2 + (size_t)(kp + np) * 2};
    L->w = (dsv4_weight){.name = L->name, .form = DSV4_WF_EXL3, .n = n, .k = k, .exl3 = &L->e, .bytes = L->e.bytes};
    return L;
}

static void free_lay(lay *L)
{
    free(L->tr);
    free(L->suh);
    free(L->svh);
    free(L->bias);
    free(L);
}

/* ---- exact reference ----------------------------------------------------------------------- */

static void fwht_d(double *v)
{
    for (int h = 1; h < 128; h *= 2)
        for (int i = 0; i < 128; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                double a = v[j], b = v[j + h];
                v[j] = a + b;
                v[j + h] = a - b;
            }
}

/* ref[t * nr + c - r0] (exact, in double) and mag (M above) for c in [r0, r1); suh as given;
 * tile (pi, pj) decoded with codebook pcb when pi >= 0; no bias when nobias. */
static void reference(const dsv4_exl3 *e, const float *suh, const float *x, int T, int64_t ldx, int64_t r0, int64_t r1,
                      int64_t pi, int64_t pj, int pcb, int nobias, double *ref, double *mag)
{
    const int64_t kp = e->kp, nr = r1 - r0;
    const double s128 = 1 / sqrt(128.0);
    double *xs = malloc((size_t)T * kp * sizeof(double));
    double *yb = malloc((size_t)T * 128 * sizeof(double)), *ab = malloc((size_t)T * 128 * sizeof(double));
    float tile[256];
    for (int t = 0; t < T; t++) {
        for (int64_t i = 0; i < kp; i++)
            xs[t * kp + i] = i < e->k ? (double)x[t * ldx + i] * suh[i] : 0;
        for (int64_t b = 0; b < kp; b += 128) {
            fwht_d(xs + t * kp + b);
            for (int i = 0; i < 128; i++)
                xs[t * kp + b + i] *= s128;
        }
    }
    dsv4_exl3 view = *e;
    view.cb = pcb;
    for (int64_t b = r0 / 128; b <= (r1 - 1) / 128; b++) {
        memset(yb, 0, (size_t)T * 128 * sizeof(double));
        memset(ab, 0, (size_t)T * 128 * sizeof(double));
        for (int64_t i = 0; i < kp / 16; i++)
            for (int jj = 0; jj < 8; jj++) {
                int64_t j = 8 * b + jj;
                dsv4_exl3_tile(i == pi && j == pj ? &view : e, i, j, tile);
                for (int t = 0; t < T; t++)
                    for (int r = 0; r < 16; r++) {
                        double xv = xs[t * kp + 16 * i + r];
                        for (int c = 0; c < 16; c++) {
                            yb[t * 128 + 16 * jj + c] += xv * tile[r * 16 + c];
                            ab[t * 128 + 16 * jj + c] += fabs(xv * tile[r * 16 + c]);
                        }
                    }
            }
        for (int t = 0; t < T; t++) {
            fwht_d(yb + t * 128);
            double A = 0;
            for (int c = 0; c < 128; c++)
                A += ab[t * 128 + c];
            for (int c = 0; c < 128; c++) {
                int64_t col = 128 * b + c;
                if (col < r0 || col >= r1)
                    continue;
                double bv = e->bias && !nobias ? e->bias[col] : 0;
                ref[t * nr + col - r0] = yb[t * 128 + c] * s128 * e->svh[col] + bv;
                mag[t * nr + col - r0] = fabs(e->svh[col]) * s128 * A + fabs(e->bias ? e->bias[col] : 0);
            }
        }
    }
    free(xs);
    free(yb);
    free(ab);
}

/* ---- comparisons --------------------------------------------------------------------------- */

/* got rows of stride ldg against ref (dense [T, nr], float or double). */
static double worst_ratio(const float *got, int64_t ldg, const float *reff, const double *refd, const double *mag,
                          int T, int64_t nr, size_t *nan)
{
    double worst = 0;
    *nan = 0;
    for (int t = 0; t < T; t++)
        for (int64_t c = 0; c < nr; c++) {
            double g = got[t * ldg + c], r = reff ? reff[t * nr + c] : refd[t * nr + c];
            if (isnan(g) || isnan(r)) {
                (*nan)++;
                continue;
            }
            double q = fabs(g - r) / (REL * mag[t * nr + c] + 1e-30);
            if (q > worst)
                worst = q;
        }
    return worst;
}

static int agree(const char *what, const float *got, int64_t ldg, const float *reff, const double *refd,
                 const double *mag, int T, int64_t nr, int quiet)
{
    size_t nan;
    double w = worst_ratio(got, ldg, reff, refd, mag, T, nr, &nan);
    int ok = !nan && w <= 1.0;
    if (!quiet)
        printf("    %-28s worst |diff|/tol %.4f, NaN %zu  %s\n", what, w, nan, ok ? "ok" : "FAIL");
    return ok;
}

static void control(const char *what, const float *got, int64_t ldg, const float *reff, const double *refd,
                    const double *mag, int T, int64_t nr)
{
    int caught = !agree(what, got, ldg, reff, refd, mag, T, nr, 1);
    CHECK(caught, "control %s: a deliberately wrong reference passed", what);
    printf("    control %-28s %s\n", what, caught ? "caught" : "NOT CAUGHT");
}

static int cuda_ok(cudaError_t e, const char *what)
{
    CHECK(e == cudaSuccess, "%s: %s", what, cudaGetErrorString(e));
    return e == cudaSuccess;
}

/* GPU y rows [r0, r1) of x (host, T rows of ldx) into host y (T rows of ldy), output poisoned
 * before the launch; also checks the stride padding of y kept the poison. */
static int run_gpu(const dsv4_weight *w, int64_t r0, int64_t r1, const float *x, int T, int64_t ldx, float *y,
                   int64_t ldy, void *ws, size_t wsb)
{
    size_t xb = (size_t)T * ldx * sizeof(float), yb = (size_t)T * ldy * sizeof(float);
    float *dx = NULL, *dy = NULL;
    int ok = cuda_ok(cudaMalloc((void **)&dx, xb), "cudaMalloc x") && cuda_ok(cudaMalloc((void **)&dy, yb), "cudaMalloc y") &&
             cuda_ok(cudaMemcpy(dx, x, xb, cudaMemcpyHostToDevice), "copy x") &&
             cuda_ok(cudaMemset(dy, 0xff, yb), "poison y");
    if (ok) {
        int rc = ws ? dsv4_cuda_exl3_linear_ws(w, r0, r1, dx, T, ldx, dy, ldy, ws, wsb, NULL)
                    : dsv4_cuda_exl3_linear(w, r0, r1, dx, T, ldx, dy, ldy, NULL);
        dsv4_err err = {0};
        int bad = dsv4_cuda_exl3_check(&err);
        CHECK(!rc && !bad, "linear %s rows %lld..%lld T=%d: rc %d: %s", w->name, (long long)r0, (long long)r1, T, rc,
              err.msg);
        ok = !rc && !bad && cuda_ok(cudaDeviceSynchronize(), "linear kernels") &&
             cuda_ok(cudaMemcpy(y, dy, yb, cudaMemcpyDeviceToHost), "copy y");
    }
    if (!ok)
        for (size_t i = 0; i < (size_t)T * ldy; i++)
            y[i] = NAN;
    else {
        size_t kept = 0, pads = 0;
        for (int t = 0; t < T; t++)
            for (int64_t c = r1 - r0; c < ldy; c++) {
                uint32_t u;
                memcpy(&u, &y[t * ldy + c], 4);
                kept += u == 0xffffffffu;
                pads++;
            }
        CHECK(kept == pads, "linear %s: %zu of %zu padding elements of y were written", w->name, pads - kept, pads);
    }
    cudaFree(dx);
    cudaFree(dy);
    return ok;
}

/* Whether rows of two strided outputs are bitwise equal over nr columns. */
static int same_bits(const float *a, int64_t lda, const float *b, int64_t ldb, int T, int64_t nr)
{
    for (int t = 0; t < T; t++)
        if (memcmp(a + t * lda, b + t * ldb, (size_t)nr * sizeof(float)))
            return 0;
    return 1;
}

/* ---- one call shape ------------------------------------------------------------------------ */

static int64_t bits_equal, bits_total; /* GPU vs CPU over S = 1 layers */
static int64_t tc_differ, tc_total;    /* tensor cores on: outputs that differ from the FMA core's */

/* With the tensor cores on: the same call on the FMA core, and how many outputs differ. */
static void against_fma(const dsv4_weight *w, int64_t r0, int64_t r1, const float *x, int T, int64_t ldx,
                        const float *yg, int64_t ldy)
{
    if (dsv4_cuda_tensor_cores() != DSV4_CUDA_TC_ALL)
        return;
    float *yf = malloc((size_t)T * ldy * sizeof(float));
    dsv4_cuda_set_tensor_cores(DSV4_CUDA_TC_OFF);
    run_gpu(w, r0, r1, x, T, ldx, yf, ldy, NULL, 0);
    dsv4_cuda_set_tensor_cores(DSV4_CUDA_TC_ALL);
    for (int t = 0; t < T; t++)
        for (int64_t c = 0; c < r1 - r0; c++)
            tc_differ += memcmp(&yg[t * ldy + c], &yf[t * ldy + c], 4) != 0;
    tc_total += (int64_t)T * (r1 - r0);
    free(yf);
}

static void test_call(lay *L, int64_t r0, int64_t r1, int T, int padx, int pady, int controls, const float *yfull,
                      int64_t ldfull)
{
    const dsv4_exl3 *e = &L->e;
    const int64_t k = e->k, nr = r1 - r0, ldx = k + padx, ldy = nr + pady;
    const int S = dsv4_cuda_exl3_slices(&L->w);
    printf("  %s rows %lld..%lld T=%d (S=%d)\n", L->name, (long long)r0, (long long)r1, T, S);
    float *x = malloc((size_t)T * ldx * sizeof(float));
    for (int t = 0; t < T; t++)
        for (int64_t i = 0; i < ldx; i++)
            x[t * ldx + i] = i < k ? frand(-1, 1) : NAN;
    float *yg = malloc((size_t)T * ldy * sizeof(float)), *yc = malloc((size_t)T * ldy * sizeof(float));
    double *ref = malloc((size_t)T * nr * sizeof(double)), *mag = malloc((size_t)T * nr * sizeof(double));
    float *refc = malloc((size_t)T * nr * sizeof(float));

    run_gpu(&L->w, r0, r1, x, T, ldx, yg, ldy, NULL, 0);
    for (size_t i = 0; i < (size_t)T * ldy; i++)
        yc[i] = NAN;
    dsv4_exl3_linear_rows(&L->w, r0, r1, x, T, ldx, yc, ldy);
    reference(e, e->suh, x, T, ldx, r0, r1, -1, -1, e->cb, 0, ref, mag);
    for (int t = 0; t < T; t++)
        for (int64_t c = 0; c < nr; c++)
            refc[t * nr + c] = yc[t * ldy + c];

    CHECK(agree("gpu vs cpu", yg, ldy, refc, NULL, mag, T, nr, 0), "%s rows %lld..%lld T=%d: gpu vs cpu", L->name,
          (long long)r0, (long long)r1, T);
    CHECK(agree("gpu vs exact", yg, ldy, NULL, ref, mag, T, nr, 0), "%s rows %lld..%lld T=%d: gpu vs exact", L->name,
          (long long)r0, (long long)r1, T);
    CHECK(agree("cpu vs exact", yc, ldy, NULL, ref, mag, T, nr, 0), "%s rows %lld..%lld T=%d: cpu vs exact", L->name,
          (long long)r0, (long long)r1, T);
    int64_t eq = 0;
    for (int t = 0; t < T; t++)
        for (int64_t c = 0; c < nr; c++)
            eq += !memcmp(&yg[t * ldy + c], &yc[t * ldy + c], 4);
    printf("    bitwise equal to the cpu: %lld of %lld\n", (long long)eq, (long long)(T * nr));
    against_fma(&L->w, r0, r1, x, T, ldx, yg, ldy);
    if (S == 1) {
        bits_equal += eq;
        bits_total += T * nr;
    }

    /* batch == solo, bit for bit */
    if (T > 1) {
        float *y1 = malloc((size_t)ldy * sizeof(float));
        int same = 1;
        for (int t = 0; t < T; t++) {
            run_gpu(&L->w, r0, r1, x + t * ldx, 1, ldx, y1, ldy, NULL, 0);
            same &= same_bits(yg + t * ldy, ldy, y1, ldy, 1, nr);
        }
        CHECK(same, "%s rows %lld..%lld T=%d: a row of the batch differs from the row alone", L->name, (long long)r0,
              (long long)r1, T);
        printf("    batch == solo: %s\n", same ? "yes" : "NO");
        if (controls) {
            int caught = !same_bits(yg, ldy, yg + ldy, ldy, 1, nr);
            CHECK(caught, "control %s: rows 0 and 1 compare bitwise equal", L->name);
            printf("    control %-28s %s\n", "batch row 0 vs row 1", caught ? "caught" : "NOT CAUGHT");
        }
        free(y1);
    }
    /* a sub-range equals the same columns of the whole-range call with the same x */
    if (yfull) {
        int same = same_bits(yg, ldy, yfull + r0, ldfull, T, nr);
        CHECK(same, "%s rows %lld..%lld: differs from the same rows of the full call", L->name, (long long)r0,
              (long long)r1);
        printf("    sub-range == full range: %s\n", same ? "yes" : "NO");
    }

    if (controls) {
        /* one suh sign flipped, through the CPU */
        float *suh2 = malloc(e->kp * sizeof(float));
        memcpy(suh2, e->suh, e->kp * sizeof(float));
        int64_t j = (int64_t)(rnd() % (uint32_t)k);
        suh2[j] = -suh2[j];
        lay W = *L;
        W.e.suh = suh2;
        W.w.exl3 = &W.e;
        float *yw = malloc((size_t)T * ldy * sizeof(float)), *yw2 = malloc((size_t)T * nr * sizeof(float));
        dsv4_exl3_linear_rows(&W.w, r0, r1, x, T, ldx, yw, ldy);
        for (int t = 0; t < T; t++)
            for (int64_t c = 0; c < nr; c++)
                yw2[t * nr + c] = yw[t * ldy + c];
        control("suh sign flipped (cpu)", yg, ldy, yw2, NULL, mag, T, nr);
        /* one tile (of a used input row band and an output column in range) with another codebook */
        double *refw = malloc((size_t)T * nr * sizeof(double)), *magw = malloc((size_t)T * nr * sizeof(double));
        int64_t pi = (int64_t)(rnd() % (uint32_t)((k + 15) / 16)), pj = (r0 + (int64_t)(rnd() % (uint32_t)nr)) / 16;
        reference(e, e->suh, x, T, ldx, r0, r1, pi, pj, (e->cb + 1) % 3, 0, refw, magw);
        control("one tile, other codebook", yg, ldy, NULL, refw, mag, T, nr);
        if (e->bias) {
            reference(e, e->suh, x, T, ldx, r0, r1, -1, -1, e->cb, 1, refw, magw);
            control("bias left out", yg, ldy, NULL, refw, mag, T, nr);
        }
        free(refw);
        free(magw);
        free(suh2);
        free(yw);
        free(yw2);
    }
    free(x);
    free(yg);
    free(yc);
    free(ref);
    free(mag);
    free(refc);
}

/* Every call shape on one layer: T = 1, 3, 9, 40; all rows, then a sub-range crossing blocks
 * (compared with the full call on the same x). */
static void test_layer(lay *L)
{
    dsv4_err err = {0};
    size_t before = dsv4_cuda_exl3_resident();
    CHECK(!dsv4_cuda_exl3_put(&L->w, &err), "%s: put: %s", L->name, err.msg);
    size_t after = dsv4_cuda_exl3_resident();
    CHECK(after - before == dsv4_cuda_exl3_bytes(&L->w), "%s: put took %zu bytes, expected %zu", L->name,
          after - before, dsv4_cuda_exl3_bytes(&L->w));
    CHECK(!dsv4_cuda_exl3_put(&L->w, &err) && dsv4_cuda_exl3_resident() == after, "%s: a second put was not a no-op",
          L->name);
    const int Ts[4] = {1, 3, 9, 40};
    for (int ti = 0; ti < 4; ti++) {
        int T = Ts[ti];
        int64_t n = L->e.n, r0 = n > 64 ? 37 : 1, r1 = n > 200 ? n - 21 : n - 1;
        /* the full-range call and a sub-range on the same x: draw x once by reseeding */
        uint64_t save = rng;
        test_call(L, 0, n, T, 3, 0, ti == 1, NULL, 0);
        /* redo the full call's x to compare the sub-range against it */
        rng = save;
        int64_t k = L->e.k, ldx = k + 3;
        float *x = malloc((size_t)T * ldx * sizeof(float)), *yf = malloc((size_t)T * n * sizeof(float));
        for (int t = 0; t < T; t++)
            for (int64_t i = 0; i < ldx; i++)
                x[t * ldx + i] = i < k ? frand(-1, 1) : NAN;
        run_gpu(&L->w, 0, n, x, T, ldx, yf, n, NULL, 0);
        rng = save;
        test_call(L, r0, r1, T, 3, 5, ti == 2, yf, n);
        free(x);
        free(yf);
    }
    dsv4_cuda_exl3_drop(&L->w);
    CHECK(dsv4_cuda_exl3_resident() == before, "%s: drop left %zu bytes", L->name, dsv4_cuda_exl3_resident() - before);
}

/* The scratch-taking entry, a call on a layer that was not put, arguments out of range. */
static void test_interface(void)
{
    lay *L = make_lay(3, DSV4_EXL3_MUL1, 150, 200, 1, 0);
    dsv4_err err = {0};
    const int T = 4;
    int64_t k = L->e.k, n = L->e.n;
    float *x = malloc((size_t)T * k * sizeof(float)), *y1 = malloc((size_t)T * n * sizeof(float)),
          *y2 = malloc((size_t)T * n * sizeof(float));
    for (int64_t i = 0; i < T * k; i++)
        x[i] = frand(-1, 1);
    float *dx = NULL, *dy = NULL;
    void *ws = NULL;
    size_t wsb = dsv4_cuda_exl3_ws_bytes(&L->w, 0, n, T);
    if (cuda_ok(cudaMalloc((void **)&dx, (size_t)T * k * 4), "cudaMalloc") &&
        cuda_ok(cudaMalloc((void **)&dy, (size_t)T * n * 4), "cudaMalloc") && cuda_ok(cudaMalloc(&ws, wsb), "cudaMalloc") &&
        cuda_ok(cudaMemcpy(dx, x, (size_t)T * k * 4, cudaMemcpyHostToDevice), "copy")) {
        int rc = dsv4_cuda_exl3_linear(&L->w, 0, n, dx, T, k, dy, n, NULL);
        int code = dsv4_cuda_exl3_check(&err);
        CHECK(rc && code, "a call on a layer not put did not fail");
        printf("  not put: %s\n", err.msg);
        CHECK(!dsv4_cuda_exl3_check(NULL), "the failure was reported twice");
        CHECK(!dsv4_cuda_exl3_put(&L->w, &err), "put: %s", err.msg);
        rc = dsv4_cuda_exl3_linear(&L->w, 0, n + 1, dx, T, k, dy, n, NULL);
        CHECK(rc && dsv4_cuda_exl3_check(NULL), "rows past n were accepted");
        rc = dsv4_cuda_exl3_linear_ws(&L->w, 0, n, dx, T, k, dy, n, ws, wsb - 1, NULL);
        CHECK(rc && dsv4_cuda_exl3_check(NULL), "a short scratch was accepted");
        run_gpu(&L->w, 0, n, x, T, k, y1, n, NULL, 0);
        run_gpu(&L->w, 0, n, x, T, k, y2, n, ws, wsb);
        int same = same_bits(y1, n, y2, n, T, n);
        CHECK(same, "the caller-scratch entry differs from the cached-scratch one");
        printf("  caller scratch (%zu bytes) == cached scratch: %s\n", wsb, same ? "yes" : "NO");
        dsv4_cuda_exl3_drop(&L->w);
    }
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(ws);
    free(x);
    free(y1);
    free(y2);
    free_lay(L);
}

int main(void)
{
    int ndev = 0;
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess || ndev < 1 || cudaSetDevice(0) != cudaSuccess) {
        CHECK(0, "no GPU: %s", ce != cudaSuccess ? cudaGetErrorString(ce) : "no device");
        return check_summary("exl3 cuda");
    }
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    const char *seed = getenv("DSV4_SEED");
    rng = seed ? strtoull(seed, NULL, 10) : ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
    if (!rng)
        rng = 1;
    printf("exl3 cuda on %s, seed %llu (DSV4_SEED to repeat), middle step on the %s\n", prop.name,
           (unsigned long long)rng, dsv4_cuda_tensor_cores() == DSV4_CUDA_TC_ALL ? "tensor cores" : "FMA core");

    test_interface();
    /* quantized: K = 2, 3, 4, 8 x each codebook; [200, 300] pads to [256, 384] (S = 1) */
    const int Kq[4] = {2, 3, 4, 8};
    for (int ki = 0; ki < 4; ki++)
        for (int cb = 0; cb < 3; cb++) {
            lay *L = make_lay(Kq[ki], cb, 200, 300, (ki + cb) % 2, 1);
            test_layer(L);
            free_lay(L);
        }
    /* random trellises: the other K, and shapes with S = 2, 4, 8 slices */
    static const struct {
        int K, cb;
        int64_t n, k;
        int bias;
    } rc[] = {
        {1, DSV4_EXL3_3INST, 130, 260, 1}, {5, DSV4_EXL3_MCG, 256, 512, 0},  {6, DSV4_EXL3_MUL1, 100, 700, 1},
        {7, DSV4_EXL3_3INST, 70, 130, 0},  {3, DSV4_EXL3_MCG, 129, 640, 0},  {4, DSV4_EXL3_MUL1, 300, 1000, 1},
        {8, DSV4_EXL3_3INST, 500, 2000, 1}, {2, DSV4_EXL3_MUL1, 1000, 1500, 0},
    };
    for (size_t i = 0; i < sizeof rc / sizeof rc[0]; i++) {
        lay *L = make_lay(rc[i].K, rc[i].cb, rc[i].n, rc[i].k, rc[i].bias, 0);
        test_layer(L);
        free_lay(L);
    }
    /* more rows than a round: the rounds' rows against the CPU, and each alone */
    {
        lay *L = make_lay(3, DSV4_EXL3_MCG, 129, 640, 1, 0);
        dsv4_err err = {0};
        CHECK(!dsv4_cuda_exl3_put(&L->w, &err), "%s: put: %s", L->name, err.msg);
        test_call(L, 0, L->e.n, 1030, 3, 0, 0, NULL, 0);
        dsv4_cuda_exl3_drop(&L->w);
        free_lay(L);
    }
    printf("S = 1 layers: %lld of %lld outputs bitwise equal to the cpu\n", (long long)bits_equal,
           (long long)bits_total);
    if (dsv4_cuda_tensor_cores() == DSV4_CUDA_TC_ALL) {
        printf("tensor cores: %lld of %lld outputs differ from the FMA core's (the tensor-core core ran)\n",
               (long long)tc_differ, (long long)tc_total);
        CHECK(tc_differ > 0, "tensor cores on, yet every output is the FMA core's: the tensor-core core did not run");
    }
    CHECK(dsv4_cuda_exl3_resident() == 0, "%zu bytes still resident after every drop", dsv4_cuda_exl3_resident());
    return check_summary("exl3 cuda");
}
