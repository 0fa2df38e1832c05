/* kernels/kv_format — the production KV-cache row formats (the ones DeepSeek's production engine
 * declares, as the tracker seed quotes them; docs/kv.md), packed and unpacked from this one
 * definition by the CPU backend and the CUDA kernels (compiled for both, like hc_mix.h).
 *
 * A row of n values is cut into blocks of B (the last may be short); each block has one scale.
 * Stored row: the value codes first, then one scale byte per block.
 *  - WINDOW (sliding-window rows): e4m3 codes, one byte per value; B = 32, UE8M0 scales.
 *  - MAIN (compressed entries):    e2m1 codes, two per byte, low nibble = even index; B = 16,
 *                                  E4M3 scales.
 *  - INDEX (indexer keys):         e2m1 codes as MAIN; B = 32, UE8M0 scales.
 * At n = 512 (window, main) and 128 (index): 528, 288 and 68 bytes.
 *
 * Scales. UE8M0 (WINDOW, INDEX): t = max(amax, floor) / qmax with qmax 448 (e4m3) or 6 (e2m1) and
 * floor 1e-4 (e4m3) or 6 * 2^-126 (e2m1); the scale is 2^k with k = ((bits(t) - 1) >> 23) + 1 - 127
 * over the fp32 bits of t (t rounded up to a power of two), stored as the byte k + 127; a value
 * is coded as e4m3 / e2m1 of v * 2^-k, which is exact scaling. E4M3 (MAIN): the scale is
 * s = e4m3(max(amax, 6 * 2^-9) / 6) (the floor keeps s at least e4m3's least positive value),
 * and a value is coded as e2m1(clamp(v / s, -6, 6)). Every cast rounds to nearest, ties to even,
 * and saturates (e4m3 at 448, e2m1 at 6).
 *
 * A block holding a NaN or an infinity is refused: pack returns -1 and writes NaN codes for
 * that block, so a reader sees NaN, never a wrong number. */
#ifndef DSV4_KV_FORMAT_H
#define DSV4_KV_FORMAT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define DSV4_KV_HD __host__ __device__ static inline
#else
#define DSV4_KV_HD static inline
#endif

enum { DSV4_KV_WINDOW = 0, DSV4_KV_MAIN = 1, DSV4_KV_INDEX = 2 };

DSV4_KV_HD int dsv4_kv_block(int fmt) { return fmt == DSV4_KV_MAIN ? 16 : 32; }
DSV4_KV_HD int dsv4_kv_code_bytes(int fmt, int n) { return fmt == DSV4_KV_WINDOW ? n : (n + 1) / 2; }
DSV4_KV_HD int dsv4_kv_row_bytes(int fmt, int n)
{
    int b = dsv4_kv_block(fmt);
    return dsv4_kv_code_bytes(fmt, n) + (n + b - 1) / b;
}

DSV4_KV_HD uint32_t dsv4_kv_bits(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    return b;
}
DSV4_KV_HD float dsv4_kv_from_bits(uint32_t b)
{
    float f;
    memcpy(&f, &b, 4);
    return f;
}

/* e4m3fn: 4 exponent bits (bias 7), 3 mantissa bits, no infinities, 0x7f / 0xff NaN. */
DSV4_KV_HD float dsv4_kv_e4m3_value(uint8_t c)
{
    uint32_t e = (c >> 3) & 15, m = c & 7, s = (uint32_t)(c & 0x80) << 24;
    if ((c & 0x7f) == 0x7f)
        return dsv4_kv_from_bits(0x7fc00000u);
    if (!e) /* m * 2^-9, exact */
        return dsv4_kv_from_bits(s | dsv4_kv_bits((float)m * 0x1p-9f));
    return dsv4_kv_from_bits(s | ((e + 120) << 23) | (m << 20));
}
DSV4_KV_HD uint8_t dsv4_kv_e4m3_code(float f)
{
    uint8_t s = (dsv4_kv_bits(f) >> 24) & 0x80;
    float a = fabsf(f);
    if (a != a)
        return (uint8_t)(s | 0x7f);
    if (a >= 448.0f)
        return (uint8_t)(s | 0x7e);
    if (a < 0x1p-6f) /* subnormal steps of 2^-9 (a * 512 is exact); 8 steps is the least normal, code 8 */
        return (uint8_t)(s | (uint8_t)rintf(a * 512.0f));
    int e = (int)((dsv4_kv_bits(a) >> 23) & 0xff) - 127; /* a = 1.m * 2^e, -6 <= e <= 8 */
    int q = (int)rintf(ldexpf(a, 3 - e));              /* 8..16 eighths */
    if (q == 16) {
        q = 8;
        e++;
    }
    return (uint8_t)(s | ((e + 7) << 3) | (q - 8));
}

/* e2m1 codes 0..15: 0, .5, 1, 1.5, 2, 3, 4, 6, then the same negated. */
DSV4_KV_HD float dsv4_kv_e2m1_value(uint8_t c)
{
    const float v[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    return (c & 8) ? -v[c & 7] : v[c & 7];
}
/* Nearest, ties to the even code (0.25, 1.25, 2.5, 5 down; 0.75, 1.75, 3.5 up), saturating. */
DSV4_KV_HD uint8_t dsv4_kv_e2m1_code(float f)
{
    uint8_t s = (dsv4_kv_bits(f) >> 28) & 8;
    float a = fabsf(f);
    uint8_t c = a <= 0.25f ? 0 : a < 0.75f ? 1 : a <= 1.25f ? 2 : a < 1.75f ? 3 : a <= 2.5f ? 4 : a < 3.5f ? 5 : a <= 5.0f ? 6 : 7;
    return (uint8_t)(s | c);
}

/* The power-of-two exponent k of a UE8M0 scale for a block's amax (finite, >= 0). */
DSV4_KV_HD int dsv4_kv_pow2_exp(float amax, float floor_, float qmax)
{
    float t = fmaxf(amax, floor_) / qmax;
    return (int)(((dsv4_kv_bits(t) - 1u) >> 23) + 1u) - 127;
}
/* The floor and the largest code value of a UE8M0 format's blocks. */
DSV4_KV_HD float dsv4_kv_floor(int fmt) { return fmt == DSV4_KV_WINDOW ? 1e-4f : 6.0f * 0x1p-126f; }
DSV4_KV_HD float dsv4_kv_qmax(int fmt) { return fmt == DSV4_KV_WINDOW ? 448.0f : 6.0f; }
/* The MAIN format's E4M3 scale code for a block's amax. */
DSV4_KV_HD uint8_t dsv4_kv_main_scale(float amax) { return dsv4_kv_e4m3_code(fmaxf(amax, 6.0f * 0x1p-9f) / 6.0f); }

DSV4_KV_HD void dsv4_kv_put_e2m1(uint8_t *row, int k, uint8_t c)
{
    row[k / 2] = (uint8_t)((k & 1) ? (row[k / 2] & 0x0f) | (c << 4) : (row[k / 2] & 0xf0) | c);
}

/* Block j of a row of n: its values x[0..nb) (nb <= block) coded into the row's codes and scale. */
DSV4_KV_HD int dsv4_kv_pack_block(int fmt, const float *x, int nb, int j, int n, uint8_t *row)
{
    int i0 = j * dsv4_kv_block(fmt);
    uint8_t *sc = row + dsv4_kv_code_bytes(fmt, n) + j;
    float amax = 0.0f;
    int bad = 0;
    for (int i = 0; i < nb; i++) {
        float a = fabsf(x[i]);
        bad |= !(a <= 3.4028235e38f); /* NaN or infinity */
        amax = fmaxf(amax, a);
    }
    if (bad) {
        *sc = fmt == DSV4_KV_MAIN ? 0x7f : 0xff;
        for (int i = 0; i < nb; i++) {
            if (fmt == DSV4_KV_WINDOW)
                row[i0 + i] = 0x7f;
            else /* e2m1 has no NaN: the NaN scale carries it */
                dsv4_kv_put_e2m1(row, i0 + i, 0);
        }
        return -1;
    }
    if (fmt == DSV4_KV_MAIN) {
        *sc = dsv4_kv_main_scale(amax);
        float s = dsv4_kv_e4m3_value(*sc);
        for (int i = 0; i < nb; i++)
            dsv4_kv_put_e2m1(row, i0 + i, dsv4_kv_e2m1_code(fminf(fmaxf(x[i] / s, -6.0f), 6.0f)));
        return 0;
    }
    int k2 = dsv4_kv_pow2_exp(amax, dsv4_kv_floor(fmt), dsv4_kv_qmax(fmt));
    *sc = (uint8_t)(k2 + 127);
    float inv = dsv4_kv_from_bits((uint32_t)(127 - k2) << 23); /* 2^-k: -126 <= k <= 126 here */
    for (int i = 0; i < nb; i++) {
        if (fmt == DSV4_KV_WINDOW)
            row[i0 + i] = dsv4_kv_e4m3_code(x[i] * inv);
        else
            dsv4_kv_put_e2m1(row, i0 + i, dsv4_kv_e2m1_code(x[i] * inv));
    }
    return 0;
}

/* A row of n values into dsv4_kv_row_bytes(fmt, n) bytes; -1 when a block was refused. */
DSV4_KV_HD int dsv4_kv_pack(int fmt, const float *x, int n, uint8_t *row)
{
    int B = dsv4_kv_block(fmt), rc = 0;
    for (int j = 0; j * B < n; j++)
        rc |= dsv4_kv_pack_block(fmt, x + j * B, n - j * B < B ? n - j * B : B, j, n, row);
    return rc;
}

/* The scale of block j as a float (NaN for a refused block). */
DSV4_KV_HD float dsv4_kv_scale(int fmt, const uint8_t *row, int n, int j)
{
    uint8_t b = row[dsv4_kv_code_bytes(fmt, n) + j];
    if (fmt == DSV4_KV_MAIN)
        return dsv4_kv_e4m3_value(b);
    return b == 0xff ? dsv4_kv_from_bits(0x7fc00000u) : dsv4_kv_from_bits((uint32_t)b << 23);
}

/* Value k of a stored row. */
DSV4_KV_HD float dsv4_kv_value(int fmt, const uint8_t *row, int n, int k)
{
    float s = dsv4_kv_scale(fmt, row, n, k / dsv4_kv_block(fmt));
    if (fmt == DSV4_KV_WINDOW)
        return dsv4_kv_e4m3_value(row[k]) * s;
    return dsv4_kv_e2m1_value((uint8_t)((k & 1) ? row[k / 2] >> 4 : row[k / 2] & 15)) * s;
}

/* The whole row, block by block (each value as dsv4_kv_value gives it). */
DSV4_KV_HD void dsv4_kv_unpack(int fmt, const uint8_t *row, int n, float *x)
{
    int B = dsv4_kv_block(fmt);
    for (int j = 0; j * B < n; j++) {
        float s = dsv4_kv_scale(fmt, row, n, j);
        int e = (j + 1) * B < n ? (j + 1) * B : n;
        if (fmt == DSV4_KV_WINDOW)
            for (int k = j * B; k < e; k++)
                x[k] = dsv4_kv_e4m3_value(row[k]) * s;
        else {
            /* blocks start at even k (B is even): whole bytes, two values each */
            const float v[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                 -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
            int k = j * B;
            for (; k + 1 < e; k += 2) {
                uint8_t b = row[k / 2];
                x[k] = v[b & 15] * s;
                x[k + 1] = v[b >> 4] * s;
            }
            if (k < e)
                x[k] = v[row[k / 2] & 15] * s;
        }
    }
}

#endif
