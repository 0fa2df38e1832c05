/* The op tests' random numbers: one xorshift stream per test binary (each binary seeds it, from
 * the time or a fixed value, or from DSV4_SEED, and prints the seed, so a run can be repeated). */
#ifndef DSV4_TEST_RNG_H
#define DSV4_TEST_RNG_H
#include <stdint.h>

static uint64_t rng;

static inline uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static inline float frand(float lo, float hi) { return lo + (hi - lo) * (rnd() / 4294967296.0f); }

#endif
