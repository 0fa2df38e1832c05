/* The fixed-order dot product (core.h): AVX2/FMA where the build has it, scalar otherwise;
 * either way one reduction order per length, so every caller's sums are reproducible. */
#ifdef __AVX2__
#include <immintrin.h>
#endif
#include "core/core.h"

float dsv4_dot(const float *a, const float *b, int64_t n)
{
    int64_t i = 0;
#ifdef __AVX2__
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    __m256 s = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    float acc = _mm_cvtss_f32(h);
#else
    float p[8] = {0};
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            p[j] += a[i + j] * b[i + j];
    float acc = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
#endif
    for (; i < n; i++)
        acc += a[i] * b[i];
    return acc;
}
