/* Engram hashing. The multipliers must be the reference's exactly (they address ~95 GB
 * tables), so numpy's SeedSequence -> PCG64 -> bounded draw chain is reproduced here from
 * its published algorithm; tests compare against the reference's values. */
#include <stdint.h>
#include "model/engram.h"

__extension__ typedef unsigned __int128 u128;

/* ---- SeedSequence(seed).generate_state(4, uint64), pool size 4 ---- */
#define INIT_A 0x43b0d7e5u
#define MULT_A 0x931e8875u
#define INIT_B 0x8b51f9ddu
#define MULT_B 0x58f38dedu
#define MIX_L 0xca01f9ddu
#define MIX_R 0x4973f715u

static uint32_t hashmix(uint32_t v, uint32_t *hc)
{
    v ^= *hc;
    *hc *= MULT_A;
    v *= *hc;
    return v ^ (v >> 16);
}

static uint32_t mix(uint32_t x, uint32_t y)
{
    uint32_t r = MIX_L * x - MIX_R * y;
    return r ^ (r >> 16);
}

static void seed_state(uint64_t seed, uint64_t out[4])
{
    uint32_t ent[2], pool[4], hc = INIT_A;
    int ne = 0;
    do { /* the integer as little-endian 32-bit words; 0 is one word */
        ent[ne++] = (uint32_t)seed;
        seed >>= 32;
    } while (seed);
    for (int i = 0; i < 4; i++)
        pool[i] = hashmix(i < ne ? ent[i] : 0, &hc);
    for (int s = 0; s < 4; s++)
        for (int d = 0; d < 4; d++)
            if (s != d)
                pool[d] = mix(pool[d], hashmix(pool[s], &hc));
    uint32_t w[8], hb = INIT_B;
    for (int i = 0; i < 8; i++) {
        uint32_t v = pool[i % 4] ^ hb;
        hb *= MULT_B;
        v *= hb;
        w[i] = v ^ (v >> 16);
    }
    for (int i = 0; i < 4; i++)
        out[i] = (uint64_t)w[2 * i] | (uint64_t)w[2 * i + 1] << 32;
}

/* ---- PCG64: 128-bit LCG, XSL-RR output ---- */
static const u128 PCG_MULT = ((u128)2549297995355413924ull << 64) | 4865540595714422341ull;

static void pcg_step(dsv4_pcg64 *g) { g->state = g->state * PCG_MULT + g->inc; }

void dsv4_pcg64_seed(dsv4_pcg64 *g, uint64_t seed)
{
    uint64_t v[4];
    seed_state(seed, v);
    u128 init = (u128)v[0] << 64 | v[1], seq = (u128)v[2] << 64 | v[3];
    g->state = 0;
    g->inc = seq << 1 | 1;
    pcg_step(g);
    g->state += init;
    pcg_step(g);
}

uint64_t dsv4_pcg64_next(dsv4_pcg64 *g)
{
    pcg_step(g);
    uint64_t x = (uint64_t)(g->state >> 64) ^ (uint64_t)g->state;
    unsigned rot = (unsigned)(g->state >> 122);
    return (x >> rot) | (x << ((64 - rot) & 63));
}

int dsv4_rng_integers(dsv4_pcg64 *g, int64_t high, int n, int64_t *out)
{
    if (high <= (int64_t)0xffffffffll + 1)
        return -1; /* numpy draws 32-bit words below this range; not needed by any config */
    uint64_t excl = (uint64_t)high;
    for (int i = 0; i < n; i++) {
        u128 m = (u128)dsv4_pcg64_next(g) * excl;
        uint64_t left = (uint64_t)m;
        if (left < excl) {
            uint64_t thr = (UINT64_MAX - (excl - 1)) % excl;
            while (left < thr) {
                m = (u128)dsv4_pcg64_next(g) * excl;
                left = (uint64_t)m;
            }
        }
        out[i] = (int64_t)(m >> 64);
    }
    return 0;
}

/* ---- layout ---- */
static int is_prime(int64_t n)
{
    if (n < 2)
        return 0;
    for (int64_t i = 2; i * i <= n; i++)
        if (n % i == 0)
            return 0;
    return 1;
}

void dsv4_engram_primes(int n_engram, int max_ngram, int heads, int64_t vocab_start, int64_t *primes)
{
    int used = 0;
    for (int l = 0; l < n_engram; l++)
        for (int g = 0; g < max_ngram - 1; g++) {
            int64_t cur = vocab_start - 1;
            for (int h = 0; h < heads; h++) {
                for (;;) {
                    cur++;
                    int seen = 0;
                    for (int i = 0; i < used && !seen; i++)
                        seen = primes[i] == cur;
                    if (!seen && is_prime(cur))
                        break;
                }
                primes[used++] = cur;
            }
        }
}

int dsv4_engram_multipliers(int layer_id, int64_t compressed_vocab, int max_ngram, int64_t *mult)
{
    dsv4_pcg64 g;
    dsv4_pcg64_seed(&g, 10007ull * (uint64_t)layer_id);
    if (compressed_vocab <= 0 || dsv4_rng_integers(&g, (INT64_MAX / compressed_vocab) / 2, max_ngram, mult))
        return -1;
    for (int i = 0; i < max_ngram; i++)
        mult[i] = mult[i] * 2 + 1;
    return 0;
}

void dsv4_engram_hash(const int64_t *tok, const int64_t *mult, const int64_t *prime, const int64_t *offset,
                      int max_ngram, int heads, int64_t *ids)
{
    int64_t v = tok[0] * mult[0];
    for (int i = 1; i < max_ngram; i++) {
        v ^= tok[i] * mult[i];
        for (int h = 0; h < heads; h++) {
            int c = (i - 1) * heads + h;
            ids[c] = v % prime[c] + offset[c];
        }
    }
}
