/* Codecs against independent definitions: every e4m3 / e2m1 / e8m0 code, bf16 and f16
 * round trips and rounding ties. The expected values are written from the format specs
 * (OCP FP8 e4m3fn, OCP MX e2m1 and e8m0, IEEE binary16, bfloat16). */
#include <math.h>
#include <string.h>
#include "check.h"
#include "core/core.h"

static float e4m3_spec(int q)
{
    int s = q >> 7, e = (q >> 3) & 15, m = q & 7;
    if (e == 15 && m == 7)
        return NAN;
    double v = e ? pow(2.0, e - 7) * (1.0 + m / 8.0) : pow(2.0, -6) * (m / 8.0);
    return (float)(s ? -v : v);
}

int main(void)
{
    /* e4m3: all 256 codes decode to the spec value, the table agrees, and encode inverts decode. */
    for (int q = 0; q < 256; q++) {
        float v = dsv4_e4m3_to_f32((uint8_t)q), w = e4m3_spec(q);
        if (isnan(w)) {
            CHECK(isnan(v) && isnan(dsv4_e4m3_lut[q]), "e4m3 %02x should be NaN", q);
            continue;
        }
        CHECK(v == w && signbit(v) == signbit(w), "e4m3 %02x: %g vs %g", q, v, w);
        CHECK(dsv4_e4m3_lut[q] == w, "e4m3 lut %02x", q);
        CHECK(dsv4_f32_to_e4m3(v) == q, "e4m3 encode(decode(%02x)) = %02x", q, dsv4_f32_to_e4m3(v));
    }
    CHECK(dsv4_f32_to_e4m3(1000.0f) == 0x7e, "e4m3 saturates");
    CHECK(dsv4_f32_to_e4m3(-1000.0f) == 0xfe, "e4m3 saturates negative");
    CHECK(dsv4_f32_to_e4m3(1.0625f) == 0x38, "e4m3 tie 1.0625 -> 1.0 (even)");
    CHECK(dsv4_f32_to_e4m3(1.1875f) == 0x3a, "e4m3 tie 1.1875 -> 1.25 (even)");
    CHECK(dsv4_f32_to_e4m3(ldexpf(1.5f, -9)) == 0x02, "e4m3 subnormal tie 1.5q -> 2q");
    CHECK(dsv4_f32_to_e4m3(ldexpf(0.5f, -9)) == 0x00, "e4m3 subnormal tie 0.5q -> 0");

    /* e2m1: 16 codes, and round-to-nearest-even ties. */
    const float e2[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    for (int c = 0; c < 16; c++) {
        float v = dsv4_e2m1_to_f32((uint8_t)c), w = (c & 8) ? -e2[c & 7] : e2[c & 7];
        CHECK(v == w && !!signbit(v) == !!(c & 8), "e2m1 %d", c);
        CHECK(dsv4_f32_to_e2m1(v) == c, "e2m1 encode(decode(%d))", c);
    }
    const float ties[7][2] = {{0.25f, 0}, {0.75f, 1}, {1.25f, 1}, {1.75f, 2}, {2.5f, 2}, {3.5f, 4}, {5.0f, 4}};
    for (int i = 0; i < 7; i++)
        CHECK(dsv4_e2m1_to_f32(dsv4_f32_to_e2m1(ties[i][0])) == ties[i][1], "e2m1 tie %g", ties[i][0]);
    CHECK(dsv4_f32_to_e2m1(100.0f) == 7 && dsv4_f32_to_e2m1(-100.0f) == 15, "e2m1 saturates");

    /* e8m0: 2^(e-127) for all 255 finite codes, 0xff NaN. */
    for (int e = 0; e < 255; e++)
        CHECK(dsv4_e8m0_to_f32((uint8_t)e) == (float)ldexp(1.0, e - 127), "e8m0 %d", e);
    CHECK(isnan(dsv4_e8m0_to_f32(0xff)), "e8m0 ff NaN");

    /* bf16: all 65536 codes round-trip (NaNs stay NaN), ties to even. */
    int bad = 0;
    for (int h = 0; h < 65536; h++) {
        float v = dsv4_bf16_to_f32((uint16_t)h);
        uint16_t back = dsv4_f32_to_bf16(v);
        if (isnan(v) ? !isnan(dsv4_bf16_to_f32(back)) : back != h)
            bad++;
    }
    CHECK(bad == 0, "bf16 round trip: %d codes differ", bad);
    CHECK(dsv4_f32_to_bf16(1.00390625f) == 0x3f80, "bf16 tie to even (down)");
    CHECK(dsv4_f32_to_bf16(1.01171875f) == 0x3f82, "bf16 tie to even (up)");

    /* f16: all 65536 codes round-trip, ties to even. */
    bad = 0;
    for (int h = 0; h < 65536; h++) {
        float v = dsv4_f16_to_f32((uint16_t)h);
        uint16_t back = dsv4_f32_to_f16(v);
        if (isnan(v) ? !isnan(dsv4_f16_to_f32(back)) : back != h)
            bad++;
    }
    CHECK(bad == 0, "f16 round trip: %d codes differ", bad);
    CHECK(dsv4_f16_to_f32(0x3c00) == 1.0f && dsv4_f16_to_f32(0x0001) == ldexpf(1, -24), "f16 values");
    CHECK(dsv4_f32_to_f16(1.0f + ldexpf(1, -11)) == 0x3c00, "f16 tie to even");
    return check_summary("codec");
}
