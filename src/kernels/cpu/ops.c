/* CPU backend: the reference ops, AVX2/FMA where the build has it, scalar otherwise.
 * Threads (OpenMP) split output rows; every row is reduced in one fixed order. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif
#include "core/core.h"
#include "kernels/backend.h"
#include "kernels/hc_mix.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/exl3.h"
#include "kernels/cpu/weight_decode.h"

/* 2^(e-127) built from its bits: e8m0 scales are read once per block on the hot path. */
static inline float e8m0_fast(uint8_t e)
{
    uint32_t u = e ? (uint32_t)e << 23 : 0x00400000u;
    float f;
    memcpy(&f, &u, 4);
    return e == 0xff ? NAN : f;
}

static inline float block_scale(const dsv4_weight *w, int64_t si)
{
    return w->scale_e8m0 ? e8m0_fast(((const uint8_t *)w->scale)[si]) : ((const float *)w->scale)[si];
}

/* Decodes block b of row r (at most `len` values) into out as exact fp32 values that are
 * the stored ones up to a power-of-two factor, which is returned (with the block's scale
 * folded in). A row's dot product is then sum over blocks of dot(block, x) * factor: one fixed
 * order for every row whatever the batch. */
static inline float decode_block(const dsv4_weight *w, int64_t r, int64_t b, int64_t bk, int len, float *out)
{
    int64_t k = w->k, k0 = b * bk;
    switch (w->form) {
    case DSV4_WF_F32:
        memcpy(out, (const float *)w->data + r * k + k0, len * sizeof(float));
        return 1.0f;
    case DSV4_WF_BF16: {
        const uint16_t *p = (const uint16_t *)w->data + r * k + k0;
        int i = 0;
#ifdef __AVX2__
        _mm_prefetch((const char *)(p + 1024), _MM_HINT_T0);
        _mm_prefetch((const char *)(p + 1056), _MM_HINT_T0);
        for (; i + 8 <= len; i += 8)
            _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(
                                          _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + i))), 16)));
#endif
        for (; i < len; i++)
            out[i] = dsv4_bf16_to_f32(p[i]);
        return 1.0f;
    }
    case DSV4_WF_F16: {
        const uint16_t *p = (const uint16_t *)w->data + r * k + k0;
        for (int i = 0; i < len; i++)
            out[i] = dsv4_f16_to_f32(p[i]);
        return 1.0f;
    }
    case DSV4_WF_FP8: {
        const uint8_t *p = (const uint8_t *)w->data + r * k + k0;
        float s = block_scale(w, (r / w->bn) * ((k + w->bk - 1) / w->bk) + b);
        int i = 0;
#ifdef __AVX2__
        /* e4m3 bits placed in an f16 (sign to bit 15, exponent and mantissa shifted by 7) give
         * the value times 2^-8 exactly, subnormals included; NaN codes are a corrupt file. */
        const __m128i m7f = _mm_set1_epi16(0x7f), m80 = _mm_set1_epi16(0x80);
        /* the hardware prefetcher alone leaves this loop waiting on memory: ask 1 KB ahead */
        _mm_prefetch((const char *)(p + 1024), _MM_HINT_T0);
        _mm_prefetch((const char *)(p + 1088), _MM_HINT_T0);
        for (; i + 8 <= len; i += 8) {
            __m128i v = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(p + i)));
            __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(v, m80), 8), _mm_slli_epi16(_mm_and_si128(v, m7f), 7));
            _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
        }
        if (i == len)
            return s * 256.0f;
        for (int j = 0; j < i; j++)
            out[j] *= 256.0f; /* back to the stored values: the f16 placement gave them times 2^-8 */
#endif
        for (; i < len; i++)
            out[i] = dsv4_e4m3_lut[p[i]];
        return s;
    }
    case DSV4_WF_FP4: {
        /* A block here spans several scale groups of gs values; each group's scale is folded
         * into its values (q * s, exact: e2m1 times a power of two), so the factor is 1. */
        const uint8_t *p = (const uint8_t *)w->data + r * (k / 2) + k0 / 2;
        int64_t gs = w->bk, s0 = r * (k / gs) + k0 / gs;
#ifdef __AVX2__
        _mm_prefetch((const char *)(p + 1024), _MM_HINT_T0);
        _mm_prefetch((const char *)(p + 1088), _MM_HINT_T0);
        /* twice the e2m1 values are small integers: a byte shuffle decodes 16 codes at once */
        const __m128i lut = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12), m0f = _mm_set1_epi8(0x0f);
        if (gs % 32 == 0) {
            for (int g0 = 0; g0 < len; g0 += (int)gs) {
                __m256 sv = _mm256_set1_ps(block_scale(w, s0 + g0 / gs) * 0.5f);
                for (int i = g0; i < g0 + gs; i += 32) {
                    __m128i v = _mm_loadu_si128((const __m128i *)(p + i / 2));
                    __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(v, m0f));
                    __m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(v, 4), m0f));
                    __m128i e0 = _mm_unpacklo_epi8(lo, hi), e1 = _mm_unpackhi_epi8(lo, hi);
                    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e0)), sv));
                    _mm256_storeu_ps(out + i + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e0, 8))), sv));
                    _mm256_storeu_ps(out + i + 16, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e1)), sv));
                    _mm256_storeu_ps(out + i + 24, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e1, 8))), sv));
                }
            }
            return 1.0f;
        }
#endif
        for (int i = 0; i < len; i += 2) {
            float sc = block_scale(w, s0 + i / gs);
            uint8_t q = p[i / 2];
            out[i] = dsv4_e2m1_lut[q & 15] * sc;
            out[i + 1] = dsv4_e2m1_lut[q >> 4] * sc;
        }
        return 1.0f;
    }
    default:
        memset(out, 0, len * sizeof(float));
        return 0.0f;
    }
}

/* acc (8 lanes) += (sum of blk[j] * x[j] over the block) * f, with the 8-lane partial sums
 * kept across blocks and reduced once per row; a ragged tail goes to *tail. */
static inline void block_fma(const float *blk, const float *x, int len, float f, float *acc, float *tail)
{
    int j = 0;
#ifdef __AVX2__
    __m256 v0 = _mm256_setzero_ps(), v1 = v0;
    for (; j + 16 <= len; j += 16) {
        v0 = _mm256_fmadd_ps(_mm256_loadu_ps(blk + j), _mm256_loadu_ps(x + j), v0);
        v1 = _mm256_fmadd_ps(_mm256_loadu_ps(blk + j + 8), _mm256_loadu_ps(x + j + 8), v1);
    }
    if (j + 8 <= len) {
        v0 = _mm256_fmadd_ps(_mm256_loadu_ps(blk + j), _mm256_loadu_ps(x + j), v0);
        j += 8;
    }
    _mm256_storeu_ps(acc, _mm256_fmadd_ps(_mm256_add_ps(v0, v1), _mm256_set1_ps(f), _mm256_loadu_ps(acc)));
#else
    float v[8] = {0};
    for (; j + 8 <= len; j += 8)
        for (int l = 0; l < 8; l++)
            v[l] += blk[j + l] * x[j + l];
    for (int l = 0; l < 8; l++)
        acc[l] += v[l] * f;
#endif
    float t = 0;
    for (; j < len; j++)
        t += blk[j] * x[j];
    *tail += t * f;
}

#ifdef __AVX2__
/* block_fma for four rows against one x block: each row's operations and their order are
 * block_fma's (its two 8-lane partial sums, the remainder of 8, the factor, the ragged tail),
 * and each x vector is loaded once for the four. blk: four blocks `stride` floats apart;
 * a: four accumulators of 9 floats, `astride` floats apart. */
static inline void block_fma4(const float *blk, int64_t stride, const float *x, int len, const float *f, float *a,
                              int64_t astride)
{
    const float *b0 = blk, *b1 = blk + stride, *b2 = blk + 2 * stride, *b3 = blk + 3 * stride;
    __m256 p0 = _mm256_setzero_ps(), p1 = p0, p2 = p0, p3 = p0, q0 = p0, q1 = p0, q2 = p0, q3 = p0;
    int j = 0;
    for (; j + 16 <= len; j += 16) {
        __m256 xa = _mm256_loadu_ps(x + j), xb = _mm256_loadu_ps(x + j + 8);
        p0 = _mm256_fmadd_ps(_mm256_loadu_ps(b0 + j), xa, p0);
        q0 = _mm256_fmadd_ps(_mm256_loadu_ps(b0 + j + 8), xb, q0);
        p1 = _mm256_fmadd_ps(_mm256_loadu_ps(b1 + j), xa, p1);
        q1 = _mm256_fmadd_ps(_mm256_loadu_ps(b1 + j + 8), xb, q1);
        p2 = _mm256_fmadd_ps(_mm256_loadu_ps(b2 + j), xa, p2);
        q2 = _mm256_fmadd_ps(_mm256_loadu_ps(b2 + j + 8), xb, q2);
        p3 = _mm256_fmadd_ps(_mm256_loadu_ps(b3 + j), xa, p3);
        q3 = _mm256_fmadd_ps(_mm256_loadu_ps(b3 + j + 8), xb, q3);
    }
    if (j + 8 <= len) {
        __m256 xa = _mm256_loadu_ps(x + j);
        p0 = _mm256_fmadd_ps(_mm256_loadu_ps(b0 + j), xa, p0);
        p1 = _mm256_fmadd_ps(_mm256_loadu_ps(b1 + j), xa, p1);
        p2 = _mm256_fmadd_ps(_mm256_loadu_ps(b2 + j), xa, p2);
        p3 = _mm256_fmadd_ps(_mm256_loadu_ps(b3 + j), xa, p3);
        j += 8;
    }
    __m256 p[4] = {p0, p1, p2, p3}, q[4] = {q0, q1, q2, q3};
    for (int r = 0; r < 4; r++) {
        float *ar = a + r * astride;
        const float *br = blk + r * stride;
        _mm256_storeu_ps(ar, _mm256_fmadd_ps(_mm256_add_ps(p[r], q[r]), _mm256_set1_ps(f[r]), _mm256_loadu_ps(ar)));
        float t = 0;
        for (int i = j; i < len; i++)
            t += br[i] * x[i];
        ar[8] += t * f[r];
    }
}
#endif

#ifdef __AVX2__
/* One row times one input (decode): FP8 and FP4 blocks decoded in registers and multiplied
 * at once. The operations and their order are those of decode_block + block_fma, so a row
 * computed here equals the same row computed for a batch, bit for bit (BF16 gains nothing
 * this way: its plain path already reads at memory speed). Needs whole blocks whose length is a
 * multiple of 16 (FP8) or 32-value scale groups (FP4); acc: [9]. */
static void row_fused(const dsv4_weight *w, int64_t r, int64_t bk, const float *x, float *acc)
{
    int64_t k = w->k, nb = k / bk;
    __m256 a = _mm256_loadu_ps(acc);
    if (w->form == DSV4_WF_FP8) {
        const uint8_t *p = (const uint8_t *)w->data + r * k;
        const __m128i m7f = _mm_set1_epi16(0x7f), m80 = _mm_set1_epi16(0x80);
        int64_t srow = (r / w->bn) * nb;
        for (int64_t b = 0; b < nb; b++, p += bk, x += bk) {
            float f = block_scale(w, srow + b) * 256.0f;
            _mm_prefetch((const char *)(p + 1024), _MM_HINT_T0);
            _mm_prefetch((const char *)(p + 1088), _MM_HINT_T0);
            __m256 v0 = _mm256_setzero_ps(), v1 = v0;
            for (int j = 0; j < bk; j += 16) {
                __m128i q0 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(p + j)));
                __m128i q1 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(p + j + 8)));
                __m256 w0 = _mm256_cvtph_ps(_mm_or_si128(_mm_slli_epi16(_mm_and_si128(q0, m80), 8), _mm_slli_epi16(_mm_and_si128(q0, m7f), 7)));
                __m256 w1 = _mm256_cvtph_ps(_mm_or_si128(_mm_slli_epi16(_mm_and_si128(q1, m80), 8), _mm_slli_epi16(_mm_and_si128(q1, m7f), 7)));
                v0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + j), v0);
                v1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + j + 8), v1);
            }
            a = _mm256_fmadd_ps(_mm256_add_ps(v0, v1), _mm256_set1_ps(f), a);
        }
    } else {
        const uint8_t *p = (const uint8_t *)w->data + r * (k / 2);
        int64_t gs = w->bk, s0 = r * (k / gs);
        const __m128i lut = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12), m0f = _mm_set1_epi8(0x0f);
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *pb = p + b * bk / 2;
            const float *xb = x + b * bk;
            _mm_prefetch((const char *)(pb + 1024), _MM_HINT_T0);
            _mm_prefetch((const char *)(pb + 1088), _MM_HINT_T0);
            __m256 v0 = _mm256_setzero_ps(), v1 = v0;
            for (int g0 = 0; g0 < bk; g0 += (int)gs) {
                __m256 sv = _mm256_set1_ps(block_scale(w, s0 + (b * bk + g0) / gs) * 0.5f);
                for (int i = g0; i < g0 + gs; i += 32) {
                    __m128i v = _mm_loadu_si128((const __m128i *)(pb + i / 2));
                    __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(v, m0f));
                    __m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(v, 4), m0f));
                    __m128i e0 = _mm_unpacklo_epi8(lo, hi), e1 = _mm_unpackhi_epi8(lo, hi);
                    v0 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e0)), sv), _mm256_loadu_ps(xb + i), v0);
                    v1 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e0, 8))), sv),
                                         _mm256_loadu_ps(xb + i + 8), v1);
                    v0 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e1)), sv), _mm256_loadu_ps(xb + i + 16), v0);
                    v1 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e1, 8))), sv),
                                         _mm256_loadu_ps(xb + i + 24), v1);
                }
            }
            a = _mm256_fmadd_ps(_mm256_add_ps(v0, v1), _mm256_set1_ps(1.0f), a);
        }
    }
    _mm256_storeu_ps(acc, a);
}

static int can_fuse(const dsv4_weight *w, int64_t bk, int T)
{
    if (T != 1 || w->k % bk)
        return 0;
    return (w->form == DSV4_WF_FP8 && bk % 16 == 0) || (w->form == DSV4_WF_FP4 && w->bk % 32 == 0);
}
#endif

/* Several input rows (T > 1) take panels of LIN_RB output rows: a panel's blocks are decoded
 * once per tile of LIN_TT inputs, and each x block, read from memory once per panel and input,
 * serves the panel's rows from L1 (a row at a time would stream all of x from memory for
 * every output row). The tile's accumulators, LIN_RB x LIN_TT x 9 floats, stay in L2. */
enum { LIN_RB = 16, LIN_TT = 128 };

static inline float lin_sum(const float *a)
{
    return (((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))) + a[8];
}

/* y[t, i] for the rows of W from r0 (shapes as linear). T = 1: a thread owns whole output rows,
 * each decoded and multiplied in one pass. T > 1: panels as above. Either way each (row,
 * input) sums its blocks in order, each block as block_fma does, then lin_sum: the same
 * operations in the same order for every batch, so a row alone equals the row in any batch,
 * bit for bit. */
static void cpu_linear(const dsv4_weight *w, int64_t r0, int64_t r1, const float *x, int T, int64_t ldx, float *y,
                       int64_t ldy)
{
    if (w->form == DSV4_WF_EXL3) { /* trellis-coded: its own fused kernel (kernels/cpu/exl3.c) */
        dsv4_exl3_linear_rows(w, r0, r1, x, T, ldx, y, ldy);
        return;
    }
    int64_t k = w->k, nr = r1 - r0;
    int64_t bk = w->form == DSV4_WF_FP8 ? w->bk : w->form == DSV4_WF_FP4 ? w->bk * (w->bk < 256 ? 256 / w->bk : 1) : 256;
    int64_t nb = (k + bk - 1) / bk;
    if (T == 1) {
#ifdef __AVX2__
        int fuse = can_fuse(w, bk, T);
#endif
#pragma omp parallel
        {
            float *blk = malloc(bk * sizeof(float)), acc[9];
#pragma omp for schedule(static)
            for (int64_t i = 0; i < nr; i++) {
                memset(acc, 0, sizeof acc);
#ifdef __AVX2__
                if (fuse) {
                    row_fused(w, r0 + i, bk, x, acc);
                    y[i] = lin_sum(acc);
                    continue;
                }
#endif
                for (int64_t b = 0; b < nb; b++) {
                    int len = (int)(k - b * bk < bk ? k - b * bk : bk);
                    float f = decode_block(w, r0 + i, b, bk, len, blk);
                    block_fma(blk, x + b * bk, len, f, acc, acc + 8);
                }
                y[i] = lin_sum(acc);
            }
            free(blk);
        }
        return;
    }
    int64_t np = (nr + LIN_RB - 1) / LIN_RB;
#pragma omp parallel
    {
        float *blk = malloc((size_t)LIN_RB * bk * sizeof(float)), *acc = malloc((size_t)LIN_RB * LIN_TT * 9 * sizeof(float));
        float f[LIN_RB];
#pragma omp for schedule(static)
        for (int64_t p = 0; p < np; p++) {
            int64_t i0 = p * LIN_RB;
            int rb = (int)(nr - i0 < LIN_RB ? nr - i0 : LIN_RB);
            for (int t0 = 0; t0 < T; t0 += LIN_TT) {
                int tt = T - t0 < LIN_TT ? T - t0 : LIN_TT;
                memset(acc, 0, (size_t)rb * tt * 9 * sizeof(float));
                for (int64_t b = 0; b < nb; b++) {
                    int len = (int)(k - b * bk < bk ? k - b * bk : bk);
                    for (int r = 0; r < rb; r++)
                        f[r] = decode_block(w, r0 + i0 + r, b, bk, len, blk + r * bk);
                    for (int t = 0; t < tt; t++) {
                        const float *xb = x + (int64_t)(t0 + t) * ldx + b * bk;
                        int r = 0;
#ifdef __AVX2__
                        for (; r + 4 <= rb; r += 4)
                            block_fma4(blk + r * bk, bk, xb, len, f + r, acc + ((int64_t)r * tt + t) * 9, (int64_t)tt * 9);
#endif
                        for (; r < rb; r++) {
                            float *a = acc + ((int64_t)r * tt + t) * 9;
                            block_fma(blk + r * bk, xb, len, f[r], a, a + 8);
                        }
                    }
                }
                for (int r = 0; r < rb; r++)
                    for (int t = 0; t < tt; t++)
                        y[(int64_t)(t0 + t) * ldy + i0 + r] = lin_sum(acc + ((int64_t)r * tt + t) * 9);
            }
        }
        free(blk);
        free(acc);
    }
}

/* rmsnorm, each row's y through bf16 once written when rb (rmsnorm_rb). */
static void rmsnorm_rows(const float *x, int64_t rows, int dim, const float *w, float eps, float *y, int rb)
{
#pragma omp parallel for schedule(static) if (rows * dim > 65536)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * dim;
        float *yr = y + r * dim;
        float ss = dsv4_dot(xr, xr, dim);
        float inv = 1.0f / sqrtf(ss / dim + eps);
        for (int i = 0; i < dim; i++)
            yr[i] = w ? xr[i] * inv * w[i] : xr[i] * inv;
        if (rb)
            dsv4_round_bf16(yr, dim);
    }
}

static void cpu_rmsnorm(const float *x, int64_t rows, int dim, const float *w, float eps, float *y)
{
    rmsnorm_rows(x, rows, dim, w, eps, y, 0);
}

static void cpu_rmsnorm_rb(const float *x, int64_t rows, int dim, const float *w, float eps, float *y)
{
    rmsnorm_rows(x, rows, dim, w, eps, y, 1);
}

/* rope, each row's heads (all heads * d values) through bf16 once rotated when rb (rope_rb). */
static void rope_rows(float *x, int T, int64_t stride, int heads, int d, int rd, const float *inv_freq, const int64_t *pos,
                      int inverse, int rb)
{
    int half = rd / 2;
    float *cs = malloc((half > 0 ? 2 * half : 1) * sizeof(float));
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            float ang = (float)pos[t] * inv_freq[i];
            cs[2 * i] = cosf(ang);
            cs[2 * i + 1] = inverse ? -sinf(ang) : sinf(ang);
        }
        for (int h = 0; h < heads; h++) {
            float *v = x + t * stride + (int64_t)h * d + (d - rd);
            for (int i = 0; i < half; i++) {
                float a = v[2 * i], b = v[2 * i + 1], c = cs[2 * i], s = cs[2 * i + 1];
                v[2 * i] = a * c - b * s;
                v[2 * i + 1] = a * s + b * c;
            }
        }
        if (rb)
            dsv4_round_bf16(x + t * stride, (int64_t)heads * d);
    }
    free(cs);
}

static void cpu_rope(float *x, int T, int64_t stride, int heads, int d, int rd, const float *inv_freq, const int64_t *pos,
                     int inverse)
{
    rope_rows(x, T, stride, heads, d, rd, inv_freq, pos, inverse, 0);
}

static void cpu_rope_rb(float *x, int T, int64_t stride, int heads, int d, int rd, const float *inv_freq,
                        const int64_t *pos, int inverse)
{
    rope_rows(x, T, stride, heads, d, rd, inv_freq, pos, inverse, 1);
}

/* One row's collapse: h[dd] = sum_i pre[i] X[i, dd], summed in stream order. */
static void collapse_row(const float *x, int n, int D, const float *pr, float *hr)
{
    for (int dd = 0; dd < D; dd++) {
        float s = 0;
        for (int i = 0; i < n; i++)
            s += pr[i] * x[(int64_t)i * D + dd];
        hr[dd] = s;
    }
}

static void cpu_hc_collapse(const float *X, int T, int n, int D, const float *pre, float *h)
{
#pragma omp parallel for schedule(static) if ((int64_t)T * n * D > 65536)
    for (int t = 0; t < T; t++)
        collapse_row(X + (int64_t)t * n * D, n, D, pre + (int64_t)t * n, h + (int64_t)t * D);
}

static void cpu_hc_pre(const float *X, int T, int n, int D, const float *fn, const float *base, const float *scale,
                       int iters, float hc_eps, float norm_eps, float *pre, float *post, float *comb, float *h,
                       const float *hw)
{
    int nm = post ? (2 + n) * n : n;
    int64_t nd = (int64_t)n * D;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        const float *x = X + t * nd;
        float m[64];
        float inv = 1.0f / sqrtf(dsv4_dot(x, x, nd) / nd + norm_eps);
        for (int j = 0; j < nm; j++)
            m[j] = dsv4_dot(fn + j * nd, x, nd) * inv;
        float *pr = pre + t * n;
        for (int i = 0; i < n; i++)
            pr[i] = dsv4_sigmoid(m[i] * scale[0] + base[i]) + hc_eps;
        if (post) {
            float *po = post + t * n, *c = comb + (int64_t)t * n * n;
            for (int i = 0; i < n; i++)
                po[i] = 2.0f * dsv4_sigmoid(m[n + i] * scale[1] + base[n + i]);
            for (int j = 0; j < n; j++)
                dsv4_hc_comb_row(m, scale, base, n, j, hc_eps, c);
            for (int it = 0; it < iters; it++) {
                for (int j = 0; it > 0 && j < n; j++)
                    dsv4_hc_normalize(c, n, j * n, 1, hc_eps);
                for (int k = 0; k < n; k++)
                    dsv4_hc_normalize(c, n, k, n, hc_eps);
            }
        }
        if (h)
            collapse_row(x, n, D, pr, h + (int64_t)t * D);
    }
    if (h && hw)
        cpu_rmsnorm(h, T, D, hw, norm_eps, h);
}

/* hc_post, each row's n D values through bf16 once written when rb (hc_post_rb). */
static void hc_post_rows(float *X, const float *y, int T, int n, int D, const float *post, const float *comb, int rb)
{
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        float *x = X + (int64_t)t * n * D;
        const float *yr = y + (int64_t)t * D, *po = post + t * n, *c = comb + (int64_t)t * n * n;
        float old[16];
        for (int dd = 0; dd < D; dd++) {
            for (int j = 0; j < n; j++)
                old[j] = x[(int64_t)j * D + dd];
            for (int k = 0; k < n; k++) {
                float s = po[k] * yr[dd];
                for (int j = 0; j < n; j++)
                    s += c[j * n + k] * old[j];
                x[(int64_t)k * D + dd] = s;
            }
        }
        if (rb)
            dsv4_round_bf16(x, (int64_t)n * D);
    }
}

static void cpu_hc_post(float *X, const float *y, int T, int n, int D, const float *post, const float *comb)
{
    hc_post_rows(X, y, T, n, D, post, comb, 0);
}

static void cpu_hc_post_rb(float *X, const float *y, int T, int n, int D, const float *post, const float *comb)
{
    hc_post_rows(X, y, T, n, D, post, comb, 1);
}

static void cpu_attend(const float *q, int H, int d, const float *const *keys, int nk, float scale, const float *sink,
                       float *out)
{
#pragma omp parallel if (H * nk * d > 262144)
    {
        float *p = malloc((nk + 1) * sizeof(float));
#pragma omp for schedule(static)
        for (int h = 0; h < H; h++) {
            const float *qh = q + (int64_t)h * d;
            float mx = sink[h];
            for (int i = 0; i < nk; i++) {
                p[i] = dsv4_dot(qh, keys[i], d) * scale;
                mx = fmaxf(mx, p[i]);
            }
            float den = expf(sink[h] - mx);
            for (int i = 0; i < nk; i++)
                den += (p[i] = expf(p[i] - mx));
            float *o = out + (int64_t)h * d;
            memset(o, 0, d * sizeof(float));
            for (int i = 0; i < nk; i++) {
                float w = p[i] / den;
                const float *k = keys[i];
                for (int j = 0; j < d; j++)
                    o[j] += w * k[j];
            }
        }
        free(p);
    }
}

static void cpu_swiglu(const float *g, const float *u, int64_t n, float limit, float *h)
{
    for (int64_t i = 0; i < n; i++) {
        float a = g[i], b = u[i];
        if (limit > 0) {
            a = fminf(a, limit);
            b = fminf(fmaxf(b, -limit), limit);
        }
        h[i] = a / (1.0f + expf(-a)) * b;
    }
}

static void cpu_linear_blocks(const dsv4_weight *w, int G, const float *x, int T, float *y)
{
    int64_t rk = w->n / G;
    for (int g = 0; g < G; g++)
        cpu_linear(w, g * rk, (g + 1) * rk, x + g * w->k, T, (int64_t)G * w->k, y + g * rk, w->n);
}

static void cpu_linear_multi(int nw, const dsv4_weight *const *w, const float *x, int T, int64_t ldx, float *const *y)
{
    for (int j = 0; j < nw; j++)
        cpu_linear(w[j], 0, w[j]->n, x, T, ldx, y[j], w[j]->n);
}

static void cpu_embed(const dsv4_weight *w, const int32_t *ids, int T, int n, float *X)
{
    int64_t D = w->k;
    for (int t = 0; t < T; t++) {
        float *x = X + (int64_t)t * n * D;
        dsv4_weight_row(w, ids[t], x);
        for (int i = 1; i < n; i++)
            memcpy(x + i * D, x, D * sizeof(float));
    }
}

static void cpu_linear_q(const dsv4_weight *w, int64_t r0, int64_t r1, const float *x, int T, int64_t ldx, float *y,
                         int64_t ldy)
{
    float *xq = malloc((size_t)(T > 0 ? T : 1) * w->k * sizeof(float));
    if (!xq) { /* out of memory: never a silently unquantized product */
        for (int t = 0; t < T; t++)
            for (int64_t i = 0; i < r1 - r0; i++)
                y[t * ldy + i] = NAN;
        return;
    }
    for (int t = 0; t < T; t++) {
        memcpy(xq + (int64_t)t * w->k, x + t * ldx, w->k * sizeof(float));
        dsv4_fp8_roundtrip(xq + (int64_t)t * w->k, w->k, dsv4_act_block(w));
    }
    cpu_linear(w, r0, r1, xq, T, w->k, y, ldy);
    free(xq);
}

static void cpu_roundtrip(float *x, int64_t n, int block, int code)
{
    if (code == DSV4_RT_FP8)
        dsv4_fp8_roundtrip(x, n, block);
    else
        dsv4_fp4_roundtrip(x, n, block, code == DSV4_RT_FP4_E4M3);
}

static void cpu_describe(char *buf, size_t n) { snprintf(buf, n, "cpu: %d threads", omp_get_max_threads()); }

static const dsv4_backend cpu_backend = {
    .name = "cpu",
    .alloc = dsv4_cpu_alloc,
    .free = dsv4_cpu_free,
    .upload = dsv4_cpu_copy,
    .download = dsv4_cpu_copy,
    .copy = dsv4_cpu_copy,
    .copy2d = dsv4_cpu_copy2d,
    .linear = cpu_linear,
    .linear_q = cpu_linear_q,
    .linear_blocks = cpu_linear_blocks,
    .linear_multi = cpu_linear_multi,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .rmsnorm_rb = cpu_rmsnorm_rb,
    .rope_rb = cpu_rope_rb,
    .hc_pre = cpu_hc_pre,
    .hc_collapse = cpu_hc_collapse,
    .engram_gate = dsv4_cpu_engram_gate,
    .hc_post = cpu_hc_post,
    .hc_post_rb = cpu_hc_post_rb,
    .attend = cpu_attend,
    .swiglu = cpu_swiglu,
    .attn_step = dsv4_cpu_attn_step,
    .attn_step41 = dsv4_cpu_attn_step41,
    .route = dsv4_cpu_route,
    .experts = dsv4_cpu_experts,
    .round_bf16 = dsv4_round_bf16,
    .roundtrip = cpu_roundtrip,
    .add = dsv4_cpu_add,
    .scale = dsv4_cpu_scale,
    .attn_work = dsv4_cpu_attn_work,
    .kv_production = 1,
    .describe = cpu_describe,
};

const dsv4_backend *dsv4_backend_cpu(void) { return &cpu_backend; }
