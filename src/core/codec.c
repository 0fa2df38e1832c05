/* Number codecs for every storage form a checkpoint may use. The decoders are exact; the
 * encoders round to nearest, ties to even, as torch's casts do. */
#include <math.h>
#include <string.h>
#include "core/core.h"

static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float dsv4_bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t dsv4_f32_to_bf16(float f)
{
    uint32_t u = f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float dsv4_f16_to_f32(uint16_t h)
{
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0x1f)
        return u2f(s | 0x7f800000u | (m << 13));
    if (e == 0) {
        float v = ldexpf((float)m, -24);
        return s ? -v : v;
    }
    return u2f(s | ((e + 112) << 23) | (m << 13));
}

uint16_t dsv4_f32_to_f16(float f)
{
    uint32_t u = f2u(f), s = (u >> 16) & 0x8000u;
    float a = fabsf(f);
    if (isnan(f))
        return (uint16_t)(s | 0x7e00u);
    if (a >= 65520.0f)
        return (uint16_t)(s | 0x7c00u);
    if (a < 6.103515625e-05f) { /* subnormal: quantum 2^-24 */
        return (uint16_t)(s | (uint32_t)nearbyintf(a * 16777216.0f));
    }
    int e;
    frexpf(a, &e); /* a = f * 2^e, f in [0.5, 1) */
    int ex = e - 1;
    float q = nearbyintf(ldexpf(a, 10 - ex)); /* in [1024, 2048] */
    if (q >= 2048.0f) {
        q = 1024.0f;
        ex++;
    }
    return (uint16_t)(s | ((uint32_t)(ex + 15) << 10) | ((uint32_t)q - 1024u));
}

float dsv4_e4m3_to_f32(uint8_t q)
{
    int s = q >> 7, e = (q >> 3) & 0xf, m = q & 7;
    float v;
    if (e == 0xf && m == 7)
        return NAN;
    if (e == 0)
        v = ldexpf((float)m, -9);
    else
        v = ldexpf(1.0f + m / 8.0f, e - 7);
    return s ? -v : v;
}

uint8_t dsv4_f32_to_e4m3(float f)
{
    if (isnan(f))
        return 0x7f;
    uint8_t s = signbit(f) ? 0x80 : 0;
    float a = fabsf(f);
    if (a >= 448.0f)
        return s | 0x7e;
    if (a < 0.015625f) /* below 2^-6: subnormal, quantum 2^-9 */
        return s | (uint8_t)nearbyintf(a * 512.0f);
    int e;
    frexpf(a, &e);
    int ex = e - 1;
    float q = nearbyintf(ldexpf(a, 3 - ex)); /* in [8, 16] */
    if (q >= 16.0f) {
        q = 8.0f;
        ex++;
    }
    unsigned code = ((unsigned)(ex + 7) << 3) | ((unsigned)q - 8u);
    if (code > 0x7e)
        code = 0x7e;
    return s | (uint8_t)code;
}

const float dsv4_e2m1_lut[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                 -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

float dsv4_e2m1_to_f32(uint8_t code) { return dsv4_e2m1_lut[code & 15]; }

uint8_t dsv4_f32_to_e2m1(float f)
{
    uint8_t s = signbit(f) ? 8 : 0;
    float a = fabsf(f);
    uint8_t c;
    if (isnan(f))
        c = 7;
    else if (a <= 0.25f)
        c = 0;
    else if (a < 0.75f)
        c = 1;
    else if (a <= 1.25f)
        c = 2;
    else if (a < 1.75f)
        c = 3;
    else if (a <= 2.5f)
        c = 4;
    else if (a < 3.5f)
        c = 5;
    else if (a <= 5.0f)
        c = 6;
    else
        c = 7;
    return s | c;
}

float dsv4_e8m0_to_f32(uint8_t e)
{
    if (e == 0xff)
        return NAN;
    return ldexpf(1.0f, (int)e - 127);
}

/* The e4m3 table the kernels index, built at compile time from the same formula as the
 * decoder above (the codec test checks the two agree on all 256 codes). */
#define E4(q) ((q) == 0x7f || (q) == 0xff ? NAN : \
    (((q) & 0x80) ? -1.0f : 1.0f) * ((((q) >> 3) & 0xf) == 0 ? ((q) & 7) / 512.0f : \
    (1.0f + ((q) & 7) / 8.0f) * (float)(1u << (((q) >> 3) & 0xf)) / 128.0f))
#define R8(b) E4(b), E4(b + 1), E4(b + 2), E4(b + 3), E4(b + 4), E4(b + 5), E4(b + 6), E4(b + 7)
#define R64(b) R8(b), R8(b + 8), R8(b + 16), R8(b + 24), R8(b + 32), R8(b + 40), R8(b + 48), R8(b + 56)
const float dsv4_e4m3_lut[256] = {R64(0), R64(64), R64(128), R64(192)};

/* ---- activation round trips (the V4.1 reference numerics; model/numerics.c) */

void dsv4_round_bf16(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = dsv4_bf16_to_f32(dsv4_f32_to_bf16(x[i]));
}

/* 2^ceil(log2 t) for positive finite t, from the bits: exponent - 127 + (mantissa != 0). */
float dsv4_pow2_ceil(float t)
{
    uint32_t b;
    memcpy(&b, &t, 4);
    int e = (int)((b >> 23) & 0xff) - 127 + ((b & 0x7fffff) != 0);
    return ldexpf(1.0f, e);
}

/* Per block of `block` values: s = 2^ceil(log2(max(amax, 1e-4) / 448)), v = e4m3(v / s) * s. */
void dsv4_fp8_roundtrip(float *x, int64_t n, int block)
{
    for (int64_t b0 = 0; b0 < n; b0 += block) {
        int64_t e = b0 + block < n ? b0 + block : n;
        float amax = 1e-4f;
        for (int64_t i = b0; i < e; i++)
            amax = fmaxf(amax, fabsf(x[i]));
        float s = dsv4_pow2_ceil(amax * (1.0f / 448.0f));
        for (int64_t i = b0; i < e; i++)
            x[i] = dsv4_e4m3_to_f32(dsv4_f32_to_e4m3(fminf(fmaxf(x[i] / s, -448.0f), 448.0f))) * s;
    }
}

/* Per block: e2m1 codes with scale e4m3(max(amax, 6*2^-9) / 6) (e4m3_scale) or
 * 2^ceil(log2(max(amax, 6*2^-126) / 6)) (ue8m0); v = e2m1(clamp(v / s, +-6)) * s. */
void dsv4_fp4_roundtrip(float *x, int64_t n, int block, int e4m3_scale)
{
    for (int64_t b0 = 0; b0 < n; b0 += block) {
        int64_t e = b0 + block < n ? b0 + block : n;
        float amax = 0;
        for (int64_t i = b0; i < e; i++)
            amax = fmaxf(amax, fabsf(x[i]));
        float s = e4m3_scale ? dsv4_e4m3_to_f32(dsv4_f32_to_e4m3(fmaxf(amax, 6.0f * 0x1p-9f) / 6.0f))
                             : dsv4_pow2_ceil(fmaxf(amax, 6.0f * 0x1p-126f) * (1.0f / 6.0f));
        for (int64_t i = b0; i < e; i++)
            x[i] = dsv4_e2m1_to_f32(dsv4_f32_to_e2m1(fminf(fmaxf(x[i] / s, -6.0f), 6.0f))) * s;
    }
}
