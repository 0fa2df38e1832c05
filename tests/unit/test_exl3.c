/* EXL3: codebook values, tile bit layout, and the fused matvec against the dense dequant.
 * No argument: in-memory random layers. With DIR (made by tests/tools/exl3_gen.py): the same
 * matvec checks on every layer listed in DIR/cases.txt, read from DIR/exl3.safetensors. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "core/core.h"
#include "io/st_write.h"
#include "io/weight.h"
#include "kernels/cpu/exl3.h"
#include "kernels/cpu/weight_decode.h"

/* fp32 matvec vs the double product with the dense weight: |y - ref| <= MV_TOL · ||x|| · ||W_c||
 * (the Cauchy-Schwarz scale of the dot product, which the two orthonormal rotations keep).
 * Measured: at most 1.1e-7 for k up to 4096; 1e-6 leaves a margin of ~10 and is far below the
 * O(1) relative error any decode mistake makes. */
#define MV_TOL 1e-6

static uint64_t rng_s = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
    rng_s = rng_s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_s >> 33);
}
static float rndf(void) { return (float)rnd() / 2147483648.0f - 0.5f; }

static void test_codebook(void)
{
    /* spec §2.5 table: values printed with 8 decimals (so off by up to 5e-9); fp16 neighbours
     * here are >= 1e-4 apart, so 6e-9 accepts only the printed value */
    static const struct { uint32_t s; double v[3]; } tab[] = {
        {0x0000, {+0.76806641, +1.84375000, -3.45312500}}, {0x0001, {-0.91943359, +0.13452148, +0.64111328}},
        {0x0002, {+0.93164062, -0.75927734, -0.44848633}}, {0x00FF, {+1.20410156, -1.28710938, +0.83740234}},
        {0x1234, {-2.19921875, +1.51464844, -0.57714844}}, {0x8000, {-0.49804688, -0.63525391, -0.86816406}},
        {0xABCD, {-0.69433594, +0.36889648, -1.31445312}}, {0xFFFF, {-0.15820312, +0.85009766, -0.65136719}},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        for (int cb = 0; cb < 3; cb++) {
            float v = dsv4_exl3_codebook(cb, tab[i].s);
            CHECK(fabs(v - tab[i].v[cb]) < 6e-9, "codebook %d state 0x%04X: %.8f, expected %.8f", cb, tab[i].s, v, tab[i].v[cb]);
        }
    /* spec: std over all states 1.243711 / 1.244112 / 1.000310 (6 decimals) */
    static const double sd_want[3] = {1.243711, 1.244112, 1.000310};
    for (int cb = 0; cb < 3; cb++) {
        double s = 0, s2 = 0;
        for (uint32_t st = 0; st < 65536; st++) {
            double v = dsv4_exl3_codebook(cb, st);
            s += v;
            s2 += v * v;
        }
        double m = s / 65536, sd = sqrt(s2 / 65536 - m * m);
        CHECK(fabs(sd - sd_want[cb]) < 1e-6, "codebook %d std %.6f, expected %.6f", cb, sd, sd_want[cb]);
    }
}

typedef struct layer {
    char path[64];
    dsv4_st *st;
    dsv4_weight w;
} layer;

/* Writes a random EXL3 layer "l" (trellis [kp/16, np/16, 16K], F16 suh/svh, codebook flag,
 * optional bias) to a temp file and binds it with logical [n, k]. */
static int make_layer(layer *L, int K, int cb, int64_t kp, int64_t np, int64_t n, int64_t k, int bias,
                      const uint16_t *trellis_or_null)
{
    dsv4_err err = {0};
    size_t nw = (size_t)(kp / 16) * (np / 16) * 16 * K;
    uint16_t *tr = malloc(nw * 2), *suh = malloc(kp * 2), *svh = malloc(np * 2), *b = malloc(np * 2);
    for (size_t i = 0; i < nw; i++)
        tr[i] = trellis_or_null ? trellis_or_null[i] : (uint16_t)rnd();
    for (int64_t i = 0; i < kp; i++)
        suh[i] = dsv4_f32_to_f16((rnd() & 1 ? -1 : 1) * (0.005f + 0.015f * (rndf() + 0.5f)));
    for (int64_t i = 0; i < np; i++) {
        svh[i] = dsv4_f32_to_f16((rnd() & 1 ? -1 : 1) * (0.5f + 1.5f * (rndf() + 0.5f)));
        b[i] = dsv4_f32_to_f16(rndf());
    }
    uint32_t mult = cb == DSV4_EXL3_MCG ? DSV4_EXL3_MCG_MULT : DSV4_EXL3_MUL1_MULT;
    dsv4_st_out t[5] = {
        {"l.trellis", DSV4_DT_I16, 3, {kp / 16, np / 16, 16 * K}, tr},
        {"l.suh", DSV4_DT_F16, 1, {kp}, suh},
        {"l.svh", DSV4_DT_F16, 1, {np}, svh},
    };
    int nt = 3;
    if (cb)
        t[nt++] = (dsv4_st_out){cb == DSV4_EXL3_MCG ? "l.mcg" : "l.mul1", DSV4_DT_I32, 0, {0}, &mult};
    if (bias)
        t[nt++] = (dsv4_st_out){"l.bias", DSV4_DT_F16, 1, {np}, b};
    snprintf(L->path, sizeof L->path, "/tmp/dsv4_test_exl3_%d.safetensors", (int)getpid());
    int rc = dsv4_st_write(L->path, t, nt, NULL, &err);
    free(tr);
    free(suh);
    free(svh);
    free(b);
    L->st = rc ? NULL : dsv4_st_open_file(L->path, &err);
    unlink(L->path);
    if (!L->st || dsv4_weight_bind(L->st, "l", n, k, NULL, &L->w, &err)) {
        CHECK(0, "make_layer: %s", err.msg);
        return -1;
    }
    return 0;
}

static void drop_layer(layer *L)
{
    dsv4_weight_release(&L->w);
    dsv4_st_close(L->st);
}

/* Tile decode against the closed form: state_p = OR_m code_{p-m} << (K m), at the element the
 * permutation puts position p. */
static void test_tile_layout(void)
{
    for (int K = 1; K <= 8; K++) {
        uint32_t codes[256];
        uint16_t words[128];
        for (int p = 0; p < 256; p++)
            codes[p] = rnd() & ((1u << K) - 1);
        dsv4_exl3_pack_codes(codes, K, words);
        layer L;
        if (make_layer(&L, K, DSV4_EXL3_MUL1, 128, 128, 0, 0, 0, NULL))
            return;
        /* put the known tile at (0, 0) by decoding it through a one-tile-wide view */
        dsv4_exl3 view = *L.w.exl3;
        view.trellis = words;
        view.np = 16;
        float tile[256];
        dsv4_exl3_tile(&view, 0, 0, tile);
        int bad = 0;
        for (int p = 0; p < 256; p++) {
            uint32_t s = 0;
            for (int m = 0; m * K < 16; m++)
                s |= codes[(p - m + 256) % 256] << (K * m);
            int t = p / 8, j = p % 8;
            static const int rofs[4] = {0, 1, 8, 9};
            int r = 2 * (t % 4) + rofs[j % 4], c = t / 4 + 8 * (j / 4);
            bad += tile[r * 16 + c] != dsv4_exl3_codebook(DSV4_EXL3_MUL1, s & 0xffff);
        }
        CHECK(!bad, "K=%d: %d of 256 tile elements differ from the closed-form states", K, bad);
        drop_layer(&L);
    }
}

/* matvec == dense x within MV_TOL; T rows at once == one row at a time, bitwise; AVX2 ==
 * scalar, bitwise; 1 thread == 2 threads, bitwise; a row range == the same rows of the whole. */
static void check_matvec(const char *what, const dsv4_weight *w, int T)
{
    int64_t n = w->n, k = w->k;
    float *dense = malloc(n * k * sizeof(float)), *x = malloc(T * k * sizeof(float));
    float *y = malloc(T * n * sizeof(float)), *y1 = malloc(T * n * sizeof(float)), *ys = malloc(T * n * sizeof(float));
    float *yt = malloc(T * n * sizeof(float));
    dsv4_exl3_dequant(w->exl3, 0, dense);
    for (int64_t i = 0; i < T * k; i++)
        x[i] = rndf();
    dsv4_exl3_linear(w, x, T, y);
    for (int t = 0; t < T; t++)
        dsv4_exl3_linear(w, x + t * k, 1, y1 + t * n);
    dsv4_exl3_linear_scalar(w, x, T, ys);
    int nth = omp_get_max_threads();
    omp_set_num_threads(nth > 1 ? 1 : 2);
    dsv4_exl3_linear(w, x, T, yt);
    omp_set_num_threads(nth);
    CHECK(!memcmp(y, y1, T * n * sizeof(float)), "%s: %d rows at once differ from one row at a time", what, T);
    CHECK(!memcmp(y, ys, T * n * sizeof(float)), "%s: the SIMD and scalar paths differ", what);
    CHECK(!memcmp(y, yt, T * n * sizeof(float)), "%s: the result depends on the thread count", what);
    /* rows [r0, r1) through the backend's form (strided x and y) == those rows of the full product */
    int64_t r0 = n / 3, r1 = n - n / 5, ldx = k + 3, ldy = r1 - r0 + 2;
    float *xs = malloc(T * ldx * sizeof(float)), *yr = malloc(T * ldy * sizeof(float));
    for (int t = 0; t < T; t++)
        memcpy(xs + t * ldx, x + t * k, k * sizeof(float));
    dsv4_exl3_linear_rows(w, r0, r1, xs, T, ldx, yr, ldy);
    int rows_bad = 0;
    for (int t = 0; t < T; t++)
        rows_bad += memcmp(yr + t * ldy, y + t * n + r0, (r1 - r0) * sizeof(float)) != 0;
    CHECK(!rows_bad, "%s: rows [%lld, %lld) differ from the full product in %d of %d input rows", what, (long long)r0,
          (long long)r1, rows_bad, T);
    free(xs);
    free(yr);
    double worst = 0;
    for (int t = 0; t < T; t++) {
        double xn = 0;
        for (int64_t r = 0; r < k; r++)
            xn += (double)x[t * k + r] * x[t * k + r];
        for (int64_t c = 0; c < n; c++) {
            double ref = w->exl3->bias ? w->exl3->bias[c] : 0, wn = 0;
            for (int64_t r = 0; r < k; r++) {
                ref += (double)dense[c * k + r] * x[t * k + r];
                wn += (double)dense[c * k + r] * dense[c * k + r];
            }
            double rel = fabs(y[t * n + c] - ref) / (sqrt(xn * wn) + 1e-30);
            if (rel > worst)
                worst = rel;
        }
    }
    CHECK(worst <= MV_TOL, "%s: matvec vs dense: error %.3g of ||x||·||W_c||, tolerance %.1g", what, worst, MV_TOL);
    if (getenv("DSV4_TEST_VERBOSE"))
        fprintf(stderr, "%s: matvec error %.3g of ||x||·||W_c||\n", what, worst);
    free(dense);
    free(x);
    free(y);
    free(y1);
    free(ys);
    free(yt);
}

static void test_random_layers(void)
{
    static const struct { int K, cb; int64_t kp, np, n, k; int bias; } cases[] = {
        {1, 0, 128, 128, 0, 0, 0},      {2, 1, 256, 128, 0, 0, 1},   {3, 2, 128, 384, 300, 100, 1},
        {4, 0, 384, 256, 256, 384, 0},  {5, 1, 128, 128, 0, 0, 0},   {6, 2, 256, 256, 129, 255, 1},
        {7, 0, 128, 256, 0, 0, 0},      {8, 1, 128, 128, 0, 0, 1},   {4, 2, 4096, 128, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        layer L;
        if (make_layer(&L, cases[i].K, cases[i].cb, cases[i].kp, cases[i].np, cases[i].n, cases[i].k, cases[i].bias, NULL))
            continue;
        char what[96];
        snprintf(what, sizeof what, "K=%d cb=%d [%lld, %lld]", cases[i].K, cases[i].cb, (long long)L.w.n, (long long)L.w.k);
        check_matvec(what, &L.w, i % 2 ? 37 : 5);
        /* dsv4_weight_row gives the rows of the dense dequant */
        float *dense = malloc(L.w.n * L.w.k * sizeof(float)), *row = malloc(L.w.k * sizeof(float));
        dsv4_exl3_dequant(L.w.exl3, 0, dense);
        int64_t r = L.w.n - 1;
        dsv4_weight_row(&L.w, r, row);
        CHECK(!memcmp(row, dense + r * L.w.k, L.w.k * sizeof(float)), "%s: weight_row differs from dequant", what);
        free(dense);
        free(row);
        drop_layer(&L);
    }
}

/* Every one of the 65536 states through the SIMD decode: K=8 tiles whose odd positions hold the states (a << 8) | v for all a, v;
 * the fused product must equal the scalar (table) path bitwise for every codebook. */
static void test_all_states(void)
{
    const int K = 8;
    const int64_t kp = 512, np = 256;
    uint16_t *tr = malloc((size_t)512 * 16 * K * 2);
    for (int q = 0; q < 512; q++) {
        uint32_t codes[256];
        for (int p = 0; p < 256; p++)
            codes[p] = p % 2 ? (uint32_t)(q / 256 * 128 + (p - 1) / 2) : (uint32_t)(q % 256);
        dsv4_exl3_pack_codes(codes, K, tr + (size_t)q * 16 * K);
    }
    for (int cb = 0; cb < 3; cb++) {
        layer L;
        if (make_layer(&L, K, cb, kp, np, 0, 0, 0, tr))
            continue;
        float *x = malloc(3 * kp * sizeof(float)), *y = malloc(3 * np * sizeof(float)), *ys = malloc(3 * np * sizeof(float));
        for (int64_t i = 0; i < 3 * kp; i++)
            x[i] = rndf();
        dsv4_exl3_linear(&L.w, x, 3, y);
        dsv4_exl3_linear_scalar(&L.w, x, 3, ys);
        CHECK(!memcmp(y, ys, 3 * np * sizeof(float)), "codebook %d: SIMD and scalar decode differ over all states", cb);
        free(x);
        free(y);
        free(ys);
        drop_layer(&L);
    }
    free(tr);
}

static double gauss(void)
{
    double u1 = (rnd() + 1.0) / 2147483650.0, u2 = rnd() / 2147483648.0;
    return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Viterbi encoder: the words it returns decode (through the reader) to the values it reports,
 * and its MSE on Gaussian tiles (scaled to the codebook's std, clipped at 3 sigma so the rare
 * targets beyond a codebook's range do not dominate) is near what the trellis can do.
 * Bounds: the mean over 24 tiles per K with the codebook used here (0.294 0.0718 0.0189
 * 0.00508 0.00118 0.000426 0.000085 0.000021 of the variance; DSV4_TEST_TILES=24
 * DSV4_TEST_VERBOSE=1 prints them) times ~1.3 for the spread over the 3 tiles tested; a
 * greedy or broken search is several times worse. */
static void test_encoder(void)
{
    static const double bound[9] = {0, 0.38, 0.093, 0.025, 0.0066, 0.0016, 0.00056, 0.00011, 0.000028};
    rng_s = 20261129; /* its own tiles, whatever ran before */
    for (int K = 1; K <= 8; K++) {
        int cb = K % 3;
        dsv4_err err = {0};
        dsv4_exl3_enc *enc = dsv4_exl3_enc_new(K, cb, &err);
        CHECK(enc != NULL, "%s", err.msg);
        if (!enc)
            continue;
        float sd = dsv4_exl3_codebook_std(cb);
        double se = 0, s2 = 0;
        int bad = 0;
        int ntiles = getenv("DSV4_TEST_TILES") ? atoi(getenv("DSV4_TEST_TILES")) : 3;
        for (int t = 0; t < ntiles; t++) {
            float tile[256], dec[256], got[256];
            uint16_t words[128];
            for (int i = 0; i < 256; i++) {
                double g = gauss();
                tile[i] = (float)(sd * (g > 3 ? 3 : g < -3 ? -3 : g));
                s2 += (double)tile[i] * tile[i];
            }
            se += dsv4_exl3_enc_tile(enc, tile, words, dec);
            dsv4_exl3 view = {.prefix = "enc", .K = K, .cb = cb, .kp = 16, .np = 16, .trellis = words};
            dsv4_exl3_tile(&view, 0, 0, got);
            bad += memcmp(got, dec, sizeof got) != 0;
        }
        dsv4_exl3_enc_free(enc);
        CHECK(!bad, "K=%d: %d encoded tiles decode to other values than the encoder reports", K, bad);
        if (getenv("DSV4_TEST_VERBOSE"))
            fprintf(stderr, "encoder K=%d cb=%d: MSE %.6f of the variance\n", K, cb, se / s2);
        CHECK(se / s2 <= bound[K], "K=%d cb=%d: Gaussian MSE %.5f of the variance, bound %.5f", K, cb, se / s2, bound[K]);
    }
}

/* A whole layer: an F32 Gaussian weight [100, 200] (padded to 128 x 256) quantized to K=3 and
 * read back through the EXL3 binding: the dequant error matches what the quantizer reported
 * (its float rotations vs dequant's double: 1e-3 relative) and is the trellis' Gaussian error
 * (sqrt(0.020) = 0.141, bound 0.16); norms of columns survive the folding into svh. */
static void test_quantize_layer(void)
{
    const int64_t n = 100, k = 200, kp = 256, np = 128;
    const int K = 3, cb = DSV4_EXL3_MCG;
    dsv4_err err = {0};
    float *wv = malloc(n * k * sizeof(float));
    for (int64_t i = 0; i < n * k; i++)
        wv[i] = (float)(0.02 * gauss() * (1 + (i / k) % 7)); /* rows of different scales */
    char path[64];
    snprintf(path, sizeof path, "/tmp/dsv4_test_exl3q_%d.safetensors", (int)getpid());
    dsv4_st_out t = {"w.weight", DSV4_DT_F32, 2, {n, k}, wv};
    dsv4_st *st = NULL;
    dsv4_weight w = {0}, q = {0};
    if (dsv4_st_write(path, &t, 1, NULL, &err) || !(st = dsv4_st_open_file(path, &err)) ||
        dsv4_weight_bind(st, "w", n, k, NULL, &w, &err)) {
        CHECK(0, "%s", err.msg);
        unlink(path);
        free(wv);
        dsv4_st_close(st);
        return;
    }
    unlink(path);
    uint16_t *tr = malloc((kp / 16) * (np / 16) * 16 * K * 2), *suh = malloc(kp * 2), *svh = malloc(np * 2);
    dsv4_exl3_qstats qs;
    int rc = dsv4_exl3_quantize(&w, K, cb, 7, tr, suh, svh, &qs, NULL, NULL, &err);
    CHECK(!rc, "%s", err.msg);
    uint32_t mult = DSV4_EXL3_MCG_MULT;
    dsv4_st_out o[4] = {
        {"q.trellis", DSV4_DT_I16, 3, {kp / 16, np / 16, 16 * K}, tr},
        {"q.suh", DSV4_DT_F16, 1, {kp}, suh},
        {"q.svh", DSV4_DT_F16, 1, {np}, svh},
        {"q.mcg", DSV4_DT_I32, 0, {0}, &mult},
    };
    dsv4_st *qst = NULL;
    if (!rc && !dsv4_st_write(path, o, 4, NULL, &err) && (qst = dsv4_st_open_file(path, &err)) &&
        !dsv4_weight_bind(qst, "q", n, k, NULL, &q, &err)) {
        float *d = malloc(n * k * sizeof(float));
        dsv4_exl3_dequant(q.exl3, 0, d);
        double e2 = 0, r2 = 0;
        for (int64_t i = 0; i < n * k; i++) {
            e2 += (double)(d[i] - wv[i]) * (d[i] - wv[i]);
            r2 += (double)wv[i] * wv[i];
        }
        double rel = sqrt(e2 / r2), rep = sqrt(qs.err2 / qs.ref2);
        CHECK(fabs(rel - rep) <= 1e-3 * rep, "quantized layer: dequant error %.6f, the quantizer reported %.6f", rel, rep);
        CHECK(rel <= 0.16, "quantized layer: relative error %.4f, bound 0.16", rel);
        CHECK(qs.tiles == (kp / 16) * (np / 16), "quantized layer: %lld tiles, expected %lld", (long long)qs.tiles,
              (long long)((kp / 16) * (np / 16)));
        free(d);
    } else {
        CHECK(0, "%s", err.msg);
    }
    unlink(path);
    dsv4_weight_release(&q);
    dsv4_st_close(qst);
    dsv4_weight_release(&w);
    dsv4_st_close(st);
    free(tr);
    free(suh);
    free(svh);
    free(wv);
}

static void test_files(const char *dir)
{
    char path[4096], prefix[256];
    long long n, k;
    snprintf(path, sizeof path, "%s/cases.txt", dir);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "%s: cannot open", path);
    if (!f)
        return;
    dsv4_err err = {0};
    snprintf(path, sizeof path, "%s/exl3.safetensors", dir);
    dsv4_st *st = dsv4_st_open_file(path, &err);
    CHECK(st != NULL, "%s", err.msg);
    while (st && fscanf(f, "%255s %lld %lld", prefix, &n, &k) == 3) {
        dsv4_weight w;
        if (dsv4_weight_bind(st, prefix, n, k, NULL, &w, &err)) {
            CHECK(0, "%s", err.msg);
            continue;
        }
        CHECK(w.form == DSV4_WF_EXL3 && w.n == n && w.k == k, "%s: bound as %s [%lld, %lld]", prefix,
              dsv4_wform_name(w.form), (long long)w.n, (long long)w.k);
        check_matvec(prefix, &w, 19);
        dsv4_weight_release(&w);
    }
    fclose(f);
    dsv4_st_close(st);
}

int main(int argc, char **argv)
{
    if (argc > 1) {
        test_files(argv[1]);
        return check_summary("exl3 files");
    }
    test_codebook();
    test_tile_layout();
    test_random_layers();
    test_all_states();
    test_encoder();
    test_quantize_layer();
    return check_summary("exl3");
}
