/* The production KV-cache formats (kernels/kv_format.h) against the seed's formulas, written
 * here independently in double precision: amax exactly at, just under and just over a power of
 * two (times the format's largest code), subnormal values and scales, all-zero blocks, short
 * last blocks, NaN and infinity refused, and the stored layout byte for byte. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "check.h"
#include "kernels/kv_format.h"

/* Every e4m3fn value (no infinities; 0x7f NaN), listed from the definition: 2^-9 m for
 * exponent field 0, (1 + m/8) 2^(e-7) else. */
static double e4m3_grid[127];
static void grid_init(void)
{
    for (int c = 0; c < 127; c++) {
        int e = c >> 3, m = c & 7;
        e4m3_grid[c] = e ? (1.0 + m / 8.0) * pow(2.0, e - 7) : m * pow(2.0, -9);
    }
}
static const double e2m1_grid[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

/* Nearest grid point to |v| (saturating at the top), ties to the point with the even index. */
static double nearest(const double *g, int n, double v)
{
    double a = fabs(v);
    int best = 0;
    for (int i = 1; i < n; i++) {
        double db = fabs(a - g[best]), di = fabs(a - g[i]);
        if (di < db || (di == db && (i % 2) == 0))
            best = i;
    }
    return copysign(g[best], v);
}

/* 2^ceil(log2(t)) found by search, t > 0 (the seed's bit formula rounds t up to a power of two). */
static double pow2_up(double t)
{
    double p = 1.0;
    while (p < t)
        p *= 2;
    while (p / 2 >= t)
        p /= 2;
    return p;
}

/* What each format stores for a block, from the seed's formulas: the scale and the values. */
static double ref_scale(int fmt, const float *x, int nb)
{
    double amax = 0;
    for (int i = 0; i < nb; i++)
        amax = fmax(amax, fabs((double)x[i]));
    if (fmt == DSV4_KV_MAIN) /* e4m3(max(amax, 6 * 2^-9) / 6), the quotient an fp32 division */
        return nearest(e4m3_grid, 127, (float)(fmax(amax, 6.0 * pow(2.0, -9)) / 6.0));
    double floor_ = fmt == DSV4_KV_WINDOW ? (float)1e-4 : 6.0 * pow(2.0, -126), qmax = fmt == DSV4_KV_WINDOW ? 448 : 6;
    return pow2_up((float)(fmax(amax, floor_) / qmax)); /* the fp32 quotient, rounded up to 2^k */
}
static double ref_value(int fmt, double v, double s)
{
    double q = v / s;
    if (fmt == DSV4_KV_WINDOW)
        return nearest(e4m3_grid, 127, q) * s;
    if (fmt == DSV4_KV_MAIN)
        q = (float)((float)v / (float)s); /* the fp32 division the format does */
    return nearest(e2m1_grid, 8, fmax(-6, fmin(6, q))) * s;
}

static const char *name[3] = {"window", "main", "index"};

/* Packs x[0..n) and checks every stored value and scale against the formulas. */
static void check_row(int fmt, const float *x, int n, const char *what)
{
    uint8_t row[1200];
    float y[1024];
    memset(row, 0xa5, sizeof row);
    CHECK(dsv4_kv_pack(fmt, x, n, row) == 0, "%s %s: pack refused a finite row", name[fmt], what);
    dsv4_kv_unpack(fmt, row, n, y);
    int B = dsv4_kv_block(fmt), bad = 0;
    for (int j = 0; j * B < n; j++) {
        int nb = n - j * B < B ? n - j * B : B;
        double s = ref_scale(fmt, x + j * B, nb), got = dsv4_kv_scale(fmt, row, n, j);
        CHECK(got == s, "%s %s block %d: scale %.9g, formula %.9g", name[fmt], what, j, got, s);
        for (int i = 0; i < nb && !bad; i++) {
            double want = ref_value(fmt, x[j * B + i], s);
            if ((double)y[j * B + i] != want || !!signbit(y[j * B + i]) != !!signbit(want)) {
                bad = 1;
                CHECK(0, "%s %s value %d: %.9g stored %.9g, formula %.9g", name[fmt], what, j * B + i, x[j * B + i],
                      y[j * B + i], want);
            }
            if ((double)dsv4_kv_value(fmt, row, n, j * B + i) != (double)y[j * B + i]) {
                bad = 1;
                CHECK(0, "%s %s value %d: dsv4_kv_value differs from unpack", name[fmt], what, j * B + i);
            }
        }
    }
    if (!bad)
        CHECK(1, "ok");
}

static uint32_t rng = 12345;
static float frand(void)
{
    rng = rng * 1664525u + 1013904223u;
    return (float)((rng >> 8) / 16777216.0 * 2 - 1);
}

/* A block whose amax is `amax` exactly: random values below it, the amax at a random spot and signs mixed. */
static void block_with_amax(float *x, int nb, float amax)
{
    for (int i = 0; i < nb; i++)
        x[i] = frand() * amax;
    x[(rng >> 3) % nb] = (rng & 1) ? amax : -amax;
}

int main(void)
{
    grid_init();
    float x[1024];
    char what[96];

    /* sizes: V4-Flash widths and every fixture's (48, 24, 16: short last blocks) */
    CHECK(dsv4_kv_row_bytes(DSV4_KV_WINDOW, 512) == 528, "window row 512: %d", dsv4_kv_row_bytes(DSV4_KV_WINDOW, 512));
    CHECK(dsv4_kv_row_bytes(DSV4_KV_MAIN, 512) == 288, "main row 512: %d", dsv4_kv_row_bytes(DSV4_KV_MAIN, 512));
    CHECK(dsv4_kv_row_bytes(DSV4_KV_INDEX, 128) == 68, "index row 128: %d", dsv4_kv_row_bytes(DSV4_KV_INDEX, 128));
    CHECK(dsv4_kv_row_bytes(DSV4_KV_WINDOW, 48) == 50, "window row 48");
    CHECK(dsv4_kv_row_bytes(DSV4_KV_MAIN, 48) == 27, "main row 48");
    CHECK(dsv4_kv_row_bytes(DSV4_KV_INDEX, 24) == 13, "index row 24");

    /* amax at, just under and just over qmax * 2^k (UE8M0) or 6 * e4m3 values (MAIN), over the exponent range */
    for (int fmt = 0; fmt < 3; fmt++) {
        int B = dsv4_kv_block(fmt);
        double qmax = fmt == DSV4_KV_WINDOW ? 448 : 6;
        for (int k = -30; k <= 30; k += 3)
            for (int side = -1; side <= 1; side++) {
                float a = (float)(qmax * pow(2.0, k));
                if (side)
                    a = nextafterf(a, side < 0 ? 0.0f : INFINITY);
                block_with_amax(x, B, a);
                snprintf(what, sizeof what, "amax %s qmax*2^%d", side < 0 ? "just under" : side ? "just over" : "at", k);
                check_row(fmt, x, B, what);
            }
    }
    /* the main scale at e4m3 ties: amax / 6 at a midpoint between two e4m3 values, and either side */
    for (int c = 1; c < 125; c += 7) {
        double mid = (e4m3_grid[c] + e4m3_grid[c + 1]) / 2;
        for (int side = -1; side <= 1; side++) {
            float a = (float)(mid * 6);
            if (side)
                a = nextafterf(a, side < 0 ? 0.0f : INFINITY);
            block_with_amax(x, 16, a);
            snprintf(what, sizeof what, "main amax/6 %s the e4m3 midpoint after code %d", side < 0 ? "under" : side ? "over" : "at", c);
            check_row(DSV4_KV_MAIN, x, 16, what);
        }
    }
    /* values at e4m3 / e2m1 rounding ties inside a block with a fixed scale */
    for (int fmt = 0; fmt < 3; fmt++) {
        int B = dsv4_kv_block(fmt);
        for (int i = 0; i < B; i++) {
            double t = fmt == DSV4_KV_WINDOW ? (e4m3_grid[(i * 3) % 125] + e4m3_grid[(i * 3) % 125 + 1]) / 2
                                             : (e2m1_grid[i % 7] + e2m1_grid[i % 7 + 1]) / 2;
            x[i] = (float)((i & 1 ? -t : t) / 4); /* the scale is 1/4 below */
        }
        x[B - 1] = fmt == DSV4_KV_WINDOW ? 112.0f : 1.5f; /* amax = qmax / 4 */
        check_row(fmt, x, B, "values at rounding ties");
    }
    /* subnormal inputs, and blocks so small the floor sets the scale */
    for (int fmt = 0; fmt < 3; fmt++) {
        int B = dsv4_kv_block(fmt);
        for (int i = 0; i < B; i++)
            x[i] = ldexpf(frand(), -140); /* fp32 subnormals */
        check_row(fmt, x, B, "fp32 subnormal values");
        for (int i = 0; i < B; i++)
            x[i] = frand() * 1e-5f;
        check_row(fmt, x, B, "amax below the floor");
        block_with_amax(x, B, fmt == DSV4_KV_WINDOW ? 1e-4f : fmt == DSV4_KV_MAIN ? 6.0f * 0x1p-9f : 6.0f * 0x1p-126f);
        check_row(fmt, x, B, "amax at the floor");
    }
    /* e4m3 subnormal codes in the window format: a block spanning 2^-9..448 of its scale */
    for (int i = 0; i < 32; i++)
        x[i] = (float)(ldexp(1.0, -12 + (i % 21)) * (i & 1 ? -1.3 : 1.1));
    x[5] = 448.0f;
    check_row(DSV4_KV_WINDOW, x, 32, "e4m3 subnormal codes");
    /* all zeros (and negative zeros keep their sign) */
    for (int fmt = 0; fmt < 3; fmt++) {
        for (int i = 0; i < 64; i++)
            x[i] = i & 1 ? -0.0f : 0.0f;
        check_row(fmt, x, 64, "all zeros");
    }
    /* whole rows at V4-Flash widths and the fixtures' short last blocks */
    int widths[][2] = {{DSV4_KV_WINDOW, 512}, {DSV4_KV_MAIN, 512}, {DSV4_KV_INDEX, 128}, {DSV4_KV_WINDOW, 48},
                       {DSV4_KV_MAIN, 48}, {DSV4_KV_INDEX, 24}, {DSV4_KV_INDEX, 16}};
    for (size_t w = 0; w < sizeof widths / sizeof widths[0]; w++) {
        for (int i = 0; i < widths[w][1]; i++)
            x[i] = frand() * ldexpf(1.0f, (int)(rng % 20) - 10);
        snprintf(what, sizeof what, "a random row of %d", widths[w][1]);
        check_row(widths[w][0], x, widths[w][1], what);
    }
    /* the layout: codes first (e2m1 low nibble = even index), then one scale byte per block */
    {
        uint8_t row[68];
        for (int i = 0; i < 128; i++)
            x[i] = i < 32 ? (i == 0 ? 6.0f : i == 1 ? -0.5f : 0.0f) : 0.0f;
        dsv4_kv_pack(DSV4_KV_INDEX, x, 128, row);
        CHECK(row[0] == (0x7 | (0x9 << 4)), "index layout: first byte %#x (6 low, -0.5 high)", row[0]);
        CHECK(row[64] == 127, "index layout: the first block's scale byte %d (2^0)", row[64]);
        uint8_t w[528];
        for (int i = 0; i < 512; i++)
            x[i] = i == 33 ? 448.0f * 4 : 0.0f;
        dsv4_kv_pack(DSV4_KV_WINDOW, x, 512, w);
        CHECK(w[33] == 0x7e && w[512] == 127 - 22 && w[513] == 129, "window layout: code %#x, scales %d %d", w[33], w[512], w[513]);
        uint8_t mrow[288];
        for (int i = 0; i < 512; i++)
            x[i] = i == 17 ? 3.0f : 0.0f;
        dsv4_kv_pack(DSV4_KV_MAIN, x, 512, mrow);
        CHECK(mrow[8] == (0x7 << 4) && mrow[257] == 0x30, "main layout: codes %#x (6 in the high nibble), scale %#x (0.5)", mrow[8], mrow[257]);
    }
    /* NaN and infinity refused: pack says so and the block reads back as NaN, the others intact */
    for (int fmt = 0; fmt < 3; fmt++) {
        int B = dsv4_kv_block(fmt);
        for (int bad = 0; bad < 3; bad++) {
            uint8_t row[200];
            float y[96];
            for (int i = 0; i < 3 * B; i++)
                x[i] = frand();
            x[B + 3] = bad == 0 ? NAN : bad == 1 ? INFINITY : -INFINITY;
            CHECK(dsv4_kv_pack(fmt, x, 3 * B, row) == -1, "%s: pack took a %s", name[fmt], bad ? "infinity" : "NaN");
            dsv4_kv_unpack(fmt, row, 3 * B, y);
            int nan_ok = 1, rest_ok = 1;
            for (int i = 0; i < 3 * B; i++) {
                if (i >= B && i < 2 * B)
                    nan_ok &= isnan(y[i]);
                else
                    rest_ok &= !isnan(y[i]) && fabsf(y[i] - x[i]) <= 0.5f;
            }
            CHECK(nan_ok && rest_ok, "%s: refused block reads NaN (%d), the others their values (%d)", name[fmt], nan_ok, rest_ok);
        }
    }
    return check_summary("test_kvformat");
}
