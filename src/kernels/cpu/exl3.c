/* EXL3 decode and multiply on the CPU. Facts used (spec §2): a tile is a circular bitstream
 * of 256·K bits, read as 8·K little-endian u32 words whose MSB is stream bit 0; the state of
 * trellis position p is the 16 stream bits ending at bit (p+1)·K (mod 256·K); position p
 * holds tile element (r, c) by the tensor-core permutation; a codebook maps a state to an
 * fp16 value. Everything per state is precomputed once: one fp32 LUT per codebook and, per
 * K, the (word, bit offset) of each tile element's state in row-major (r, c) order, so a
 * decode is two word loads, a funnel shift and a LUT load per weight. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif
#include "core/core.h"
#include "kernels/cpu/exl3.h"

#define INST3_MULT 89226354u
#define INST3_ADD 64248484u

static float cb_lut[3][65536];
static int32_t el_word[9][256]; /* [K][r*16 + c]: u32 word holding the first bit of the state */
static int32_t el_off[9][256];  /* [K][r*16 + c]: bit offset of that first bit (0 = MSB) */
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static float cb_value(int cb, uint32_t state)
{
    uint32_t x = state & 0xffffu;
    if (cb == DSV4_EXL3_MUL1) {
        x *= DSV4_EXL3_MUL1_MULT;
        uint32_t s = (x & 255) + ((x >> 8) & 255) + ((x >> 16) & 255) + (x >> 24);
        /* (1024 + s)·k_inv has at most 22 significant bits and the sum with k_bias stays on
         * a 2^-18 grid below 16, so fp32 holds both exactly: one rounding, to fp16. */
        float h = 1024.0f + (float)s;
        float v = h * dsv4_f16_to_f32(0x1eee) + dsv4_f16_to_f32(0xc931);
        return dsv4_f16_to_f32(dsv4_f32_to_f16(v));
    }
    x = cb == DSV4_EXL3_MCG ? x * DSV4_EXL3_MCG_MULT : x * INST3_MULT + INST3_ADD;
    x = (x & 0x8fff8fffu) ^ 0x3b603b60u;
    /* both halves have exponents within 3 of each other: their fp32 sum is exact */
    float v = dsv4_f16_to_f32((uint16_t)(x & 0xffff)) + dsv4_f16_to_f32((uint16_t)(x >> 16));
    return dsv4_f16_to_f32(dsv4_f32_to_f16(v));
}

#ifdef __AVX2__
static void plan_init(void);
#endif

static void tables_init(void)
{
    for (int cb = 0; cb < 3; cb++)
        for (uint32_t s = 0; s < 65536; s++)
            cb_lut[cb][s] = cb_value(cb, s);
    /* position p = 8t + j holds row 2(t%4) + {0,1,8,9}[j%4], column t/4 + 8(j/4) */
    static const int rofs[4] = {0, 1, 8, 9};
    for (int K = 1; K <= 8; K++)
        for (int p = 0; p < 256; p++) {
            int t = p / 8, j = p % 8;
            int r = 2 * (t % 4) + rofs[j % 4], c = t / 4 + 8 * (j / 4);
            int start = ((p + 1) * K - 16 + 256 * K) % (256 * K);
            el_word[K][r * 16 + c] = start >> 5;
            el_off[K][r * 16 + c] = start & 31;
        }
#ifdef __AVX2__
    plan_init();
#endif
}

static void tables(void) { pthread_once(&tables_once, tables_init); }

float dsv4_exl3_codebook(int cb, uint32_t state)
{
    tables();
    return cb_lut[cb][state & 0xffff];
}

/* Tile (i, j)'s 16K stored words. */
static inline const uint16_t *tile_ptr(const dsv4_exl3 *e, int64_t i, int64_t j)
{
    return e->trellis + (i * (e->np / 16) + j) * 16 * e->K;
}

/* The tile's 8K stream words (little-endian word pairs) plus a copy of word 0 after them, so a
 * state that wraps past the end reads on without a modulo. */
static inline void tile_words(const uint16_t *tw, int K, uint32_t *ext)
{
    uint16_t w[128];
    memcpy(w, tw, 32 * (size_t)K);
    for (int m = 0; m < 8 * K; m++)
        ext[m] = w[2 * m] | (uint32_t)w[2 * m + 1] << 16;
    ext[8 * K] = ext[0];
}

static void tile_decode_scalar(const uint16_t *tw, int K, const float *lut, float *out)
{
    uint32_t ext[65];
    tile_words(tw, K, ext);
    const int32_t *wi = el_word[K], *of = el_off[K];
    for (int q = 0; q < 256; q++) {
        uint64_t v = (uint64_t)ext[wi[q]] << 32 | ext[wi[q] + 1];
        out[q] = lut[(v >> (48 - of[q])) & 0xffff];
    }
}

#ifdef __AVX2__
/* The 8 elements (r, 8h..8h+7) of a tile sit at trellis positions 32 apart, so their states
 * start 32·K bits = K words apart at one common bit offset. With the stream words regrouped as
 * E[q][g] = word g·K + q, the 8 first words are E[q] rotated by g lanes (one vpermd), and so are
 * the 8 next words: a row half needs two permutes and a funnel shift instead of two gathers. */
typedef struct row_plan {
    int8_t qh, gh, ql, gl, off;
} row_plan;
static row_plan plan[9][32]; /* [K][r*2 + h] */

static void plan_init(void)
{
    for (int K = 1; K <= 8; K++)
        for (int q = 0; q < 32; q++) {
            int e = (q / 2) * 16 + (q % 2) * 8, w0 = el_word[K][e], w1 = (w0 + 1) % (8 * K);
            plan[K][q] = (row_plan){(int8_t)(w0 % K), (int8_t)(w0 / K), (int8_t)(w1 % K), (int8_t)(w1 / K),
                                    (int8_t)el_off[K][e]};
        }
}

static void tile_decode_avx2(const uint16_t *tw, int K, const float *lut, float *out)
{
    uint16_t w[128];
    uint32_t E[8][8];
    memcpy(w, tw, 32 * (size_t)K);
    for (int g = 0; g < 8; g++)
        for (int q = 0; q < K; q++) {
            int m = g * K + q;
            E[q][g] = w[2 * m] | (uint32_t)w[2 * m + 1] << 16;
        }
    __m256i Ev[8], rot[8];
    for (int q = 0; q < K; q++)
        Ev[q] = _mm256_loadu_si256((const __m256i *)E[q]);
    for (int g = 0; g < 8; g++)
        rot[g] = _mm256_setr_epi32(g, (g + 1) & 7, (g + 2) & 7, (g + 3) & 7, (g + 4) & 7, (g + 5) & 7, (g + 6) & 7,
                                   (g + 7) & 7);
    const row_plan *pl = plan[K];
    for (int q = 0; q < 32; q++) {
        __m256i hi = _mm256_permutevar8x32_epi32(Ev[pl[q].qh], rot[pl[q].gh]);
        __m256i lo = _mm256_permutevar8x32_epi32(Ev[pl[q].ql], rot[pl[q].gl]);
        /* a shift by 32 gives 0, so offset 0 needs no special case */
        __m256i v = _mm256_or_si256(_mm256_sll_epi32(hi, _mm_cvtsi32_si128(pl[q].off)),
                                    _mm256_srl_epi32(lo, _mm_cvtsi32_si128(32 - pl[q].off)));
        _mm256_storeu_ps(out + 8 * q, _mm256_i32gather_ps(lut, _mm256_srli_epi32(v, 16), 4));
    }
}
#endif

void dsv4_exl3_tile(const dsv4_exl3 *e, int64_t i, int64_t j, float *out)
{
    tables();
    tile_decode_scalar(tile_ptr(e, i, j), e->K, cb_lut[e->cb], out);
}

/* ---------------------------------------------------------------- Hadamard */

/* In-place unnormalised Walsh-Hadamard butterflies on 128 values (Sylvester order), one fixed
 * order of operations. */
static void fwht128(float *v)
{
    for (int h = 1; h < 128; h *= 2)
        for (int i = 0; i < 128; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float a = v[j], b = v[j + h];
                v[j] = a + b;
                v[j + h] = a - b;
            }
}

static void fwht128_d(double *v, size_t stride)
{
    for (int h = 1; h < 128; h *= 2)
        for (int i = 0; i < 128; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                double a = v[j * stride], b = v[(j + h) * stride];
                v[j * stride] = a + b;
                v[(j + h) * stride] = a - b;
            }
}

/* ---------------------------------------------------------------- dequant */

/* strip [kp][128] (double) = the 128 output columns of block b of W, or of Ŵ when inner. */
static void dequant_strip(const dsv4_exl3 *e, int64_t b, int inner, double *strip)
{
    float tile[256];
    for (int64_t i = 0; i < e->kp / 16; i++)
        for (int jj = 0; jj < 8; jj++) {
            tile_decode_scalar(tile_ptr(e, i, 8 * b + jj), e->K, cb_lut[e->cb], tile);
            for (int r = 0; r < 16; r++)
                for (int c = 0; c < 16; c++)
                    strip[(16 * i + r) * 128 + 16 * jj + c] = tile[r * 16 + c];
        }
    if (inner)
        return;
    for (int64_t r = 0; r < e->kp; r++)
        fwht128_d(strip + r * 128, 1);
    for (int64_t rb = 0; rb < e->kp; rb += 128)
        for (int c = 0; c < 128; c++)
            fwht128_d(strip + rb * 128 + c, 128);
    /* both orthonormal factors 1/sqrt(128) together are 1/128, exact */
    for (int64_t r = 0; r < e->kp; r++)
        for (int c = 0; c < 128; c++)
            strip[r * 128 + c] = strip[r * 128 + c] / 128.0 * e->suh[r] * e->svh[128 * b + c];
}

void dsv4_exl3_dequant(const dsv4_exl3 *e, int inner, float *out)
{
    tables();
    int64_t nb = (e->n + 127) / 128;
#pragma omp parallel
    {
        double *strip = malloc((size_t)e->kp * 128 * sizeof(double));
#pragma omp for schedule(dynamic, 1)
        for (int64_t b = 0; b < nb; b++) {
            int64_t c1 = 128 * b + 128 < e->n ? 128 * b + 128 : e->n;
            if (!strip) {
                for (int64_t c = 128 * b; c < c1; c++)
                    for (int64_t r = 0; r < e->k; r++)
                        out[c * e->k + r] = NAN;
                continue;
            }
            dequant_strip(e, b, inner, strip);
            for (int64_t c = 128 * b; c < c1; c++)
                for (int64_t r = 0; r < e->k; r++)
                    out[c * e->k + r] = (float)strip[r * 128 + (c - 128 * b)];
        }
        free(strip);
    }
}

void dsv4_exl3_row(const dsv4_exl3 *e, int64_t c, float *out)
{
    tables();
    double *strip = malloc((size_t)e->kp * 128 * sizeof(double));
    if (!strip) {
        for (int64_t r = 0; r < e->k; r++)
            out[r] = NAN;
        return;
    }
    dequant_strip(e, c / 128, 0, strip);
    for (int64_t r = 0; r < e->k; r++)
        out[r] = (float)strip[r * 128 + c % 128];
    free(strip);
}

/* ---------------------------------------------------------------- matmul */

#define ROWS_PER_TASK 16 /* rows of x sharing one decode of a tile */

/* acc[t][16] += xr[t][0..16) · tile (16x16, row-major), r ascending, one fma per term. */
static void tile_fma_scalar(const float *tile, const float *xr, size_t xstride, int nt, float *acc, size_t astride)
{
    for (int t = 0; t < nt; t++) {
        const float *x = xr + t * xstride;
        float *a = acc + t * astride;
        for (int r = 0; r < 16; r++)
            for (int c = 0; c < 16; c++)
                a[c] = fmaf(x[r], tile[r * 16 + c], a[c]);
    }
}

#ifdef __AVX2__
static void tile_fma_avx2(const float *tile, const float *xr, size_t xstride, int nt, float *acc, size_t astride)
{
    for (int t = 0; t < nt; t++) {
        const float *x = xr + t * xstride;
        float *a = acc + t * astride;
        __m256 a0 = _mm256_loadu_ps(a), a1 = _mm256_loadu_ps(a + 8);
        for (int r = 0; r < 16; r++) {
            __m256 xv = _mm256_broadcast_ss(x + r);
            a0 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(tile + r * 16), a0);
            a1 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(tile + r * 16 + 8), a1);
        }
        _mm256_storeu_ps(a, a0);
        _mm256_storeu_ps(a + 8, a1);
    }
}
#endif

static void exl3_linear(const dsv4_exl3 *e, int64_t r0, int64_t r1, const float *x, int T, int64_t ldx, float *y,
                        int64_t ldy, int simd)
{
    tables();
    void (*decode)(const uint16_t *, int, const float *, float *) = tile_decode_scalar;
    void (*fma16)(const float *, const float *, size_t, int, float *, size_t) = tile_fma_scalar;
#ifdef __AVX2__
    if (simd) {
        decode = tile_decode_avx2;
        fma16 = tile_fma_avx2;
    }
#else
    (void)simd;
#endif
    const int64_t kp = e->kp, k = e->k;
    const float s128 = 1.0f / sqrtf(128.0f);
    float *xh = malloc((size_t)T * kp * sizeof(float));
    if (!xh) {
        dsv4_log("exl3 %s: out of memory for %d rows; output set to NaN", e->prefix, T);
        for (int t = 0; t < T; t++)
            for (int64_t c = r0; c < r1; c++)
                y[t * ldy + c - r0] = NAN;
        return;
    }
    /* input side: zero padding, ⊙ suh, H per 128 block */
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        float *v = xh + (int64_t)t * kp;
        for (int64_t i = 0; i < kp; i++)
            v[i] = i < k ? x[(int64_t)t * ldx + i] * e->suh[i] : 0.0f;
        for (int64_t b = 0; b < kp; b += 128) {
            fwht128(v + b);
            for (int i = 0; i < 128; i++)
                v[b + i] *= s128;
        }
    }
    const int64_t b0 = r0 / 128, nb = (r1 + 127) / 128 - b0, nchunk = (T + ROWS_PER_TASK - 1) / ROWS_PER_TASK;
    const int K = e->K;
    const float *lut = cb_lut[e->cb];
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t task = 0; task < nb * nchunk; task++) {
        int64_t b = b0 + task % nb, t0 = task / nb * ROWS_PER_TASK;
        int nt = T - t0 < ROWS_PER_TASK ? (int)(T - t0) : ROWS_PER_TASK;
        float acc[ROWS_PER_TASK][128], tile[256];
        memset(acc, 0, sizeof acc);
        for (int64_t i = 0; i < kp / 16; i++)
            for (int jj = 0; jj < 8; jj++) {
                decode(tile_ptr(e, i, 8 * b + jj), K, lut, tile);
                fma16(tile, xh + t0 * kp + 16 * i, kp, nt, &acc[0][16 * jj], 128);
            }
        int64_t c0 = 128 * b, lo = c0 > r0 ? c0 : r0, hi = c0 + 128 < r1 ? c0 + 128 : r1;
        for (int t = 0; t < nt; t++) {
            float *a = acc[t];
            fwht128(a);
            float *yr = y + (t0 + t) * ldy - r0;
            for (int64_t c = lo; c < hi; c++) {
                float v = a[c - c0] * s128 * e->svh[c];
                yr[c] = e->bias ? v + e->bias[c] : v;
            }
        }
    }
    free(xh);
}

void dsv4_exl3_linear(const dsv4_weight *w, const float *x, int T, float *y)
{
    exl3_linear(w->exl3, 0, w->n, x, T, w->k, y, w->n, 1);
}

void dsv4_exl3_linear_scalar(const dsv4_weight *w, const float *x, int T, float *y)
{
    exl3_linear(w->exl3, 0, w->n, x, T, w->k, y, w->n, 0);
}

void dsv4_exl3_linear_rows(const dsv4_weight *w, int64_t r0, int64_t r1, const float *x, int T, int64_t ldx, float *y,
                           int64_t ldy)
{
    exl3_linear(w->exl3, r0, r1, x, T, ldx, y, ldy, 1);
}
