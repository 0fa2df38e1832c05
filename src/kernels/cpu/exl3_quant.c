/* EXL3 quantizer: per-tile Viterbi search over the bitshift trellis, and a whole layer with the
 * format's rotation and scale folding.
 *
 * Trellis (spec §2.1): s_p = ((s_{p-1} << K) | c_p) & 0xffff, so the predecessors of state
 * s' = (b << K) | c are the 2^K states (h << (16-K)) | b. One Viterbi step is: for every b the
 * best of its 2^K predecessors, then for every s' that cost plus (value(s') - target_p)^2.
 * The argmin rides in the low K mantissa bits of the (non-negative) cost, so the minimum is a
 * plain integer min the compiler vectorises; that perturbs costs by < 2^-15 relative.
 * Tail-biting: a free pass (over the second half) finds a good final state; a second pass
 * forces the first state's high 16-K bits to equal that state's low bits and ends on a state
 * that matches them, which makes the walk circular. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "kernels/cpu/exl3.h"
#include "kernels/cpu/weight_decode.h"
#ifdef __AVX2__
#include <immintrin.h>
#endif

struct dsv4_exl3_enc {
    int K, cb;
    float lut[65536];
    float cost[65536], next[65536];
    uint32_t best[32768 + 8]; /* + 8: the SIMD step reads 8 entries from any b */
    uint8_t *bp; /* [256][2^(16-K)]: the chosen predecessor's top K bits */
};

dsv4_exl3_enc *dsv4_exl3_enc_new(int K, int cb, dsv4_err *err)
{
    if (K < 1 || K > 8 || cb < 0 || cb > 2) {
        dsv4_fail(err, DSV4_E_ARG, "EXL3 encoder: K = %d, codebook %d (K must be 1..8, codebook 0..2)", K, cb);
        return NULL;
    }
    dsv4_exl3_enc *e = dsv4_xmalloc(sizeof *e, err);
    if (!e)
        return NULL;
    e->bp = dsv4_xmalloc((size_t)256 << (16 - K), err);
    if (!e->bp) {
        free(e);
        return NULL;
    }
    e->K = K;
    e->cb = cb;
    for (uint32_t s = 0; s < 65536; s++)
        e->lut[s] = dsv4_exl3_codebook(cb, s);
    return e;
}

void dsv4_exl3_enc_free(dsv4_exl3_enc *e)
{
    if (e)
        free(e->bp);
    free(e);
}

static inline uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float bitsf(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* One trellis step: next[s'] = min over predecessors of cost + (value(s') - tp)^2; bp[b] = the
 * top K bits of the best predecessor of the states (b << K) | c. */
static void step(dsv4_exl3_enc *e, const float *cost, float *next, float tp, uint8_t *bp)
{
    const int K = e->K;
    const uint32_t B = 1u << (16 - K), C = 1u << K, lowmask = C - 1;
    uint32_t *best = e->best;
#ifdef __AVX2__
    const __m256i keep = _mm256_set1_epi32((int)~lowmask);
    for (uint32_t b = 0; b < B; b += 8)
        _mm256_storeu_si256((__m256i *)(best + b), _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(cost + b)), keep));
    for (uint32_t h = 1; h < C; h++) {
        const __m256i hv = _mm256_set1_epi32((int)h);
        const float *ch = cost + h * B;
        for (uint32_t b = 0; b < B; b += 8) {
            __m256i key = _mm256_or_si256(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)(ch + b)), keep), hv);
            __m256i cur = _mm256_loadu_si256((const __m256i *)(best + b));
            _mm256_storeu_si256((__m256i *)(best + b), _mm256_min_epu32(cur, key));
        }
    }
    for (uint32_t b = 0; b < B; b++)
        bp[b] = (uint8_t)(best[b] & lowmask);
    const __m256 tv = _mm256_set1_ps(tp);
    const __m256i spread = _mm256_setr_epi32(0, 1 >> K, 2 >> K, 3 >> K, 4 >> K, 5 >> K, 6 >> K, 7 >> K);
    for (uint32_t s = 0; s < 65536; s += 8) {
        __m256i mb = K >= 3 ? _mm256_set1_epi32((int)best[s >> K])
                            : _mm256_permutevar8x32_epi32(_mm256_loadu_si256((const __m256i *)(best + (s >> K))), spread);
        __m256 m = _mm256_castsi256_ps(_mm256_and_si256(mb, keep));
        __m256 d = _mm256_sub_ps(_mm256_loadu_ps(e->lut + s), tv);
        _mm256_storeu_ps(next + s, _mm256_add_ps(m, _mm256_mul_ps(d, d)));
    }
#else
    for (uint32_t b = 0; b < B; b++)
        best[b] = fbits(cost[b]) & ~lowmask;
    for (uint32_t h = 1; h < C; h++) {
        const float *ch = cost + h * B;
        for (uint32_t b = 0; b < B; b++) {
            uint32_t key = (fbits(ch[b]) & ~lowmask) | h;
            best[b] = key < best[b] ? key : best[b];
        }
    }
    for (uint32_t b = 0; b < B; b++)
        bp[b] = (uint8_t)(best[b] & lowmask);
    for (uint32_t s = 0; s < 65536; s++) {
        float d = e->lut[s] - tp;
        next[s] = bitsf(best[s >> K] & ~lowmask) + d * d;
    }
#endif
}

/* The free pass that picks the final state only looks at positions FREE_START..255: the final
 * state's low bits hardly depend on the distant past, so the first half of the tile can be
 * skipped without changing the error beyond noise; a later start does change it
 * (docs/bench.md, "EXL3 quantizer"). */
#define FREE_START 128

/* One Viterbi pass over the targets t[start..255] (trellis order). fix >= 0: only states whose
 * high 16-K bits equal fix may start, and only states whose low 16-K bits equal fix may end.
 * Returns the final state; e->bp holds the path. */
static uint32_t viterbi(dsv4_exl3_enc *e, const float *t, int start, int32_t fix)
{
    const int K = e->K;
    const uint32_t B = 1u << (16 - K), bmask = B - 1;
    float *cost = e->cost, *next = e->next;
    for (uint32_t s = 0; s < 65536; s++) {
        float d = e->lut[s] - t[start];
        cost[s] = fix < 0 || (s >> K) == (uint32_t)fix ? d * d : 1e30f;
    }
    for (int p = start + 1; p < 256; p++) {
        step(e, cost, next, t[p], e->bp + (size_t)p * B);
        float *tmp = cost;
        cost = next;
        next = tmp;
    }
    uint32_t arg = 0;
    float bestc = INFINITY;
    for (uint32_t s = 0; s < 65536; s++)
        if ((fix < 0 || (s & bmask) == (uint32_t)fix) && cost[s] < bestc) {
            bestc = cost[s];
            arg = s;
        }
    return arg;
}

void dsv4_exl3_pack_codes(const uint32_t *codes, int K, uint16_t *words)
{
    uint32_t u32[64] = {0};
    for (int p = 0; p < 256; p++)
        for (int b = 0; b < K; b++) {
            int bit = p * K + b;
            if ((codes[p] >> (K - 1 - b)) & 1)
                u32[bit / 32] |= 1u << (31 - bit % 32);
        }
    for (int m = 0; m < 8 * K; m++) {
        words[2 * m] = (uint16_t)u32[m];
        words[2 * m + 1] = (uint16_t)(u32[m] >> 16);
    }
}

double dsv4_exl3_enc_tile(dsv4_exl3_enc *e, const float *target, uint16_t *words, float *decoded)
{
    static const int rofs[4] = {0, 1, 8, 9};
    const int K = e->K;
    const uint32_t B = 1u << (16 - K);
    float t[256];
    int el[256];
    for (int p = 0; p < 256; p++) {
        int tl = p / 8, j = p % 8;
        el[p] = (2 * (tl % 4) + rofs[j % 4]) * 16 + tl / 4 + 8 * (j / 4);
        t[p] = target[el[p]];
    }
    uint32_t last = viterbi(e, t, FREE_START, -1);
    uint32_t s = viterbi(e, t, 0, (int32_t)(last & (B - 1)));
    uint32_t codes[256];
    for (int p = 255; p >= 0; p--) {
        codes[p] = s & ((1u << K) - 1);
        if (p)
            s = ((uint32_t)e->bp[(size_t)p * B + (s >> K)] << (16 - K)) | (s >> K);
    }
    dsv4_exl3_pack_codes(codes, K, words);
    /* the decoded values come from the packed words, so they are what a reader will see */
    double se = 0;
    for (int p = 0; p < 256; p++) {
        uint32_t st = 0;
        for (int m = 0; m * K < 16; m++)
            st |= codes[(p - m + 256) % 256] << (K * m);
        float v = e->lut[st & 0xffff];
        decoded[el[p]] = v;
        se += (double)(v - t[p]) * (v - t[p]);
    }
    return se;
}

float dsv4_exl3_codebook_std(int cb)
{
    double s = 0, s2 = 0;
    for (uint32_t st = 0; st < 65536; st++) {
        double v = dsv4_exl3_codebook(cb, st);
        s += v;
        s2 += v * v;
    }
    return (float)sqrt(s2 / 65536 - (s / 65536) * (s / 65536));
}

/* ---------------------------------------------------------------- a layer */

static void fwht128(float *v, size_t stride)
{
    for (int h = 1; h < 128; h *= 2)
        for (int i = 0; i < 128; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float a = v[j * stride], b = v[(j + h) * stride];
                v[j * stride] = a + b;
                v[(j + h) * stride] = a - b;
            }
}

/* strip [kp][128] := H_k strip H (orthonormal, its own inverse) */
static void rotate_strip(float *strip, int64_t kp)
{
    for (int64_t r = 0; r < kp; r++)
        fwht128(strip + r * 128, 1);
    for (int64_t rb = 0; rb < kp; rb += 128)
        for (int c = 0; c < 128; c++)
            fwht128(strip + rb * 128 + c, 128);
    for (int64_t i = 0; i < kp * 128; i++)
        strip[i] *= 1.0f / 128.0f;
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int dsv4_exl3_quantize(const dsv4_weight *w, int K, int cb, uint64_t seed, uint16_t *trellis, uint16_t *suh,
                       uint16_t *svh, dsv4_exl3_qstats *stats, void (*progress)(void *, int64_t), void *ctx,
                       dsv4_err *err)
{
    const int64_t n = w->n, k = w->k, kp = (k + 127) / 128 * 128, np = (n + 127) / 128 * 128;
    const int64_t tn = np / 16, words = 16 * K;
    double t0 = dsv4_now();
    memset(stats, 0, sizeof *stats);
    /* random signs; the global scale g makes the rotated weight's RMS the codebook's std */
    float *su = dsv4_xmalloc(kp * sizeof(float), err);
    float *strip = su ? dsv4_xmalloc((size_t)kp * 128 * 2 * sizeof(float), err) : NULL;
    float *row = strip ? dsv4_xmalloc((size_t)k * sizeof(float), err) : NULL;
    if (!row) {
        free(su);
        free(strip);
        return err->code;
    }
    float *orig = strip + kp * 128;
    /* each real output column has RMS 1 over its k real inputs once divided by its RMS; the
     * padding is zeros, so the rotated kp x np weight has RMS sqrt(k n / (kp np)) */
    const float g = sqrtf((float)k * (float)n / ((float)kp * (float)np)) / dsv4_exl3_codebook_std(cb);
    for (int64_t r = 0; r < kp; r++) {
        suh[r] = dsv4_f32_to_f16((splitmix(&seed) & 1 ? -g : g));
        su[r] = dsv4_f16_to_f32(suh[r]);
    }
    int rc = 0;
    for (int64_t b = 0; b < np / 128 && !rc; b++) {
        /* orig = this block's 128 columns of the [kp, np] EXL3 weight; strip = the target Ŵ */
        memset(orig, 0, (size_t)kp * 128 * sizeof(float));
        for (int c = 0; c < 128; c++) {
            int64_t col = 128 * b + c;
            double ss = 0;
            if (col < n) {
                dsv4_weight_row(w, col, row);
                for (int64_t r = 0; r < k; r++) {
                    orig[r * 128 + c] = row[r];
                    ss += (double)row[r] * row[r];
                }
            }
            float rms = (float)sqrt(ss / (double)k);
            svh[col] = dsv4_f32_to_f16(splitmix(&seed) & 1 ? -rms : rms);
            float sv = dsv4_f16_to_f32(svh[col]);
            for (int64_t r = 0; r < kp; r++)
                strip[r * 128 + c] = sv != 0 && su[r] != 0 ? orig[r * 128 + c] / (su[r] * sv) : 0.0f;
        }
        rotate_strip(strip, kp);
        double se = 0, s2 = 0;
        int fail = 0;
#pragma omp parallel reduction(+ : se, s2) reduction(| : fail)
        {
            dsv4_err terr = {0};
            dsv4_exl3_enc *enc = dsv4_exl3_enc_new(K, cb, &terr);
            float tile[256], dec[256];
#pragma omp for schedule(dynamic, 1)
            for (int64_t q = 0; q < kp / 16 * 8; q++) {
                int64_t i = q / 8, jj = q % 8;
                if (!enc)
                    continue;
                for (int r = 0; r < 16; r++)
                    for (int c = 0; c < 16; c++) {
                        tile[r * 16 + c] = strip[(16 * i + r) * 128 + 16 * jj + c];
                        s2 += (double)tile[r * 16 + c] * tile[r * 16 + c];
                    }
                se += dsv4_exl3_enc_tile(enc, tile, trellis + (i * tn + 8 * b + jj) * words, dec);
                for (int r = 0; r < 16; r++)
                    for (int c = 0; c < 16; c++)
                        strip[(16 * i + r) * 128 + 16 * jj + c] = dec[r * 16 + c];
            }
            fail |= enc == NULL;
            dsv4_exl3_enc_free(enc);
        }
        if (fail) {
            rc = dsv4_fail(err, DSV4_E_NOMEM, "EXL3 quantizer: out of memory for the Viterbi tables (%s)", w->name);
            break;
        }
        stats->tile_se += se;
        stats->tile_ref2 += s2;
        /* the reconstruction from what was stored, against the original */
        rotate_strip(strip, kp);
        for (int64_t r = 0; r < k; r++)
            for (int c = 0; c < 128 && 128 * b + c < n; c++) {
                double v = (double)strip[r * 128 + c] * su[r] * dsv4_f16_to_f32(svh[128 * b + c]);
                double d = v - orig[r * 128 + c];
                stats->err2 += d * d;
                stats->ref2 += (double)orig[r * 128 + c] * orig[r * 128 + c];
            }
        stats->tiles += kp / 16 * 8;
        if (progress)
            progress(ctx, kp / 16 * 8);
    }
    stats->secs = dsv4_now() - t0;
    free(su);
    free(strip);
    free(row);
    return rc;
}
