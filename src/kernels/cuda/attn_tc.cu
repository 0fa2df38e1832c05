/* CUDA backend: attn_step's attention on tensor cores (when the tensor-core mode has the attention:
 * the default and DSV4_CUDA_TC=1; docs/cuda.md).
 * The math is attend's (backend.h): o_h = sum_i p_i k_i / (e^(sink_h - M) + sum_i p_i), p_i =
 * e^(s_i - M), s_i = scale q_h . k_i, over the row's keys (the kept entries, then the window),
 * keys being the values too.
 *
 * Shape. A block takes one row, 16 heads (the MMA's M side) and the row's keys in chunks of 64
 * (the N side of the scores, the K side of the weighted sum), with 8 warps:
 *   scores  S[16, 64] = Q[16, d] K^T, warp w the keys 8w .. 8w + 7 of the chunk, d in k-steps
 *           of 16 (within a k-step thread t loads elements 4t .. 4t + 3 of a row, the same
 *           for q and the keys, so the k order is a fixed permutation of d);
 *   softmax per head over the chunk: its own maximum m_c, p = e^(s - m_c), l_c = sum p;
 *   values  O_c[16, d] = P[16, 64] K, warp w the columns 8 (w + 8 j) .. + 7.
 * A chunk's (m_c, l_c, O_c) are then merged into the row's (M, L, O), starting from the sink
 * (M = sink, L = 1, O = 0), in chunk order (at_weights, at_mix). Few rows: each chunk has its own block
 * and writes its partial to `part`, and k_attn_join merges them; many rows: the block loops
 * over the chunks and merges as it goes. Both run the same instructions on the same values, so
 * a row's bits do not depend on which was used, on R, or on the other rows.
 *
 * Exactness. q, the keys and p are fp32; each is split into three bf16 terms (split3, exact),
 * and each product is the sum of the six term products down to hi*lo, lo*hi, mid*mid; the
 * three left out are below 2^-23 of |a| |b|, so a dot keeps fp32 accuracy. */
#include <math.h>
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/step.cuh"

using namespace dsv4cu;

namespace {

enum { AT_HG = 16, AT_KC = 64, AT_NW = 8, AT_NT = AT_NW * 32, AT_MAXNT = 8 };

/* V4's rows (attn_step): attn_row's keys. A geometry gives a row's Row: ok, nk and key(i), and
 * says whether its caches may be packed (packed; 0: every key is fp32, so the kernel's reads
 * carry no format test). */
template <int PROD>
struct geo4 {
    static constexpr int packed = PROD;
    rows_dev rd;
    int ratio, csa, topk;
    int64_t vis_cap;
    int kv_cap, window, nkmax;
    const float *kv;
    const int *sel;
    struct Row {
        attn_row a;
        const float *kv;
        int d, kv_cap, nk;
        bool ok;
        __device__ __forceinline__ Row(const geo4 &g, int r, int d_)
            : a(g.rd, r, g.ratio, g.csa, g.topk, g.vis_cap, g.window, g.nkmax, g.sel, PROD), kv(g.kv), d(d_),
              kv_cap(g.kv_cap), nk(a.nk), ok(a.ok)
        {
        }
        __device__ __forceinline__ crow key(int i) const { return a.key(i, d, kv_cap, kv); }
    };
};

/* One (m, l, o) partial into the running (M, L, O); the only arithmetic the join does, so the
 * split and the looping forms agree bit for bit (no contraction: explicit roundings). */
__device__ __forceinline__ void at_weights(float &M, float m, float &a, float &b)
{
    float M2 = fmaxf(M, m);
    a = expf(M - M2);
    b = expf(m - M2);
    M = M2;
}
__device__ __forceinline__ float at_mix(float O, float a, float o, float b)
{
    return __fadd_rn(__fmul_rn(O, a), __fmul_rn(o, b));
}

/* acc += the six term products of a (16 x 16) and b (16 x 8), small ones first. */
__device__ __forceinline__ void mma6(float acc[4], const uint32_t a[3][4], const uint32_t b0[3], const uint32_t b1[3])
{
    mma_bf16(acc, a[1], b0[1], b1[1], acc);
    mma_bf16(acc, a[2], b0[0], b1[0], acc);
    mma_bf16(acc, a[0], b0[2], b1[2], acc);
    mma_bf16(acc, a[1], b0[0], b1[0], acc);
    mma_bf16(acc, a[0], b0[1], b1[1], acc);
    mma_bf16(acc, a[0], b0[0], b1[0], acc);
}

/* Grid (R, heads / 16, SPLIT ? nch : 1), AT_NT threads; the rows' keys from geo (geo4, geo41).
 * part: [R, nch, H, d + 2] (O_c, m_c, l_c) when SPLIT. Needs d % 16 == 0 and d <= 8 * 8 *
 * AT_MAXNT. */
template <bool SPLIT, class G>
__global__ void __launch_bounds__(AT_NT, 2) k_attn_tc(G geo, int H, int d, int nch, float scale, const float *sink,
                                                   const float *q, float *o, float *part)
{
    PDL_WAIT();
    __shared__ float sS[AT_HG][AT_KC + 4];
    __shared__ const void *skey[AT_KC];
    __shared__ int sfmt[AT_KC];
    __shared__ float sm[AT_HG], sl[AT_HG];
    int r = blockIdx.x, h0 = blockIdx.y * AT_HG;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    typename G::Row ar(geo, r, d);
    if (!ar.ok) {
        if (!SPLIT)
            for (int i = threadIdx.x; i < AT_HG * d; i += AT_NT)
                if (h0 + i / d < H)
                    o[((int64_t)r * H + h0) * d + i] = __int_as_float(0x7fc00000);
        return; /* SPLIT: the join writes the NaN */
    }
    int nchr = (ar.nk + AT_KC - 1) / AT_KC;
    int c0 = SPLIT ? (int)blockIdx.z : 0, c1 = SPLIT ? c0 + 1 : nchr;
    if (c0 >= nchr)
        return;
    bool va = h0 + g < H, vb = h0 + g + 8 < H;
    const float *qa = q + ((int64_t)r * H + h0 + g) * d, *qb = qa + (int64_t)8 * d;
    float Ma = va ? sink[h0 + g] : 0.0f, Mb = vb ? sink[h0 + g + 8] : 0.0f, La = 1.0f, Lb = 1.0f;
    float O[AT_MAXNT][4];
#pragma unroll
    for (int j = 0; j < AT_MAXNT; j++)
        O[j][0] = O[j][1] = O[j][2] = O[j][3] = 0.0f;
    int ntd = d / 8;
    for (int c = c0; c < c1; c++) {
        int base = c * AT_KC;
        if (threadIdx.x < AT_KC) {
            int i = base + (int)threadIdx.x;
            crow k = ar.key(i < ar.nk ? i : ar.nk - 1);
            skey[threadIdx.x] = k.p;
            sfmt[threadIdx.x] = G::packed ? k.fmt : -1;
        }
        __syncthreads();
        /* scores of keys 8w .. 8w + 7 */
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const crow kr = {skey[8 * w + g], G::packed ? sfmt[8 * w + g] : -1, d};
#pragma unroll 4 /* a few k-steps' loads in flight, not one */
        for (int k0 = 0; k0 < d; k0 += 16) {
            float4 xa = va ? *(const float4 *)(qa + k0 + 4 * t) : make_float4(0.f, 0.f, 0.f, 0.f);
            float4 xb = vb ? *(const float4 *)(qb + k0 + 4 * t) : make_float4(0.f, 0.f, 0.f, 0.f);
            float4 kk = kr.ld4(k0 + 4 * t);
            uint32_t pa[2][3], pb[2][3], a[3][4], b0[3], b1[3];
            split3(xa.x, xa.y, pa[0]);
            split3(xa.z, xa.w, pa[1]);
            split3(xb.x, xb.y, pb[0]);
            split3(xb.z, xb.w, pb[1]);
            split3(kk.x, kk.y, b0);
            split3(kk.z, kk.w, b1);
#pragma unroll
            for (int u = 0; u < 3; u++) {
                a[u][0] = pa[0][u];
                a[u][1] = pb[0][u];
                a[u][2] = pa[1][u];
                a[u][3] = pb[1][u];
            }
            mma6(acc, a, b0, b1);
        }
        sS[g][8 * w + 2 * t] = acc[0] * scale;
        sS[g][8 * w + 2 * t + 1] = acc[1] * scale;
        sS[g + 8][8 * w + 2 * t] = acc[2] * scale;
        sS[g + 8][8 * w + 2 * t + 1] = acc[3] * scale;
        __syncthreads();
        /* each head's softmax over the chunk: 8 threads a head, 8 keys a thread */
        if (threadIdx.x < AT_HG * 8) {
            int hh = threadIdx.x >> 3, j0 = (threadIdx.x & 7) * 8, nv = ar.nk - base;
            float m = -INFINITY;
            for (int j = j0; j < j0 + 8; j++)
                if (j < nv)
                    m = fmaxf(m, sS[hh][j]);
#pragma unroll
            for (int off = 4; off > 0; off >>= 1)
                m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
            float l = 0.0f;
            for (int j = j0; j < j0 + 8; j++) {
                float e = j < nv ? expf(sS[hh][j] - m) : 0.0f;
                sS[hh][j] = e;
                l += e;
            }
#pragma unroll
            for (int off = 4; off > 0; off >>= 1)
                l += __shfl_xor_sync(0xffffffffu, l, off);
            if ((threadIdx.x & 7) == 0)
                sm[hh] = m, sl[hh] = l;
        }
        __syncthreads();
        /* O_c = P K over the chunk's keys, 16 at a k-step */
        float ac[AT_MAXNT][4];
#pragma unroll
        for (int j = 0; j < AT_MAXNT; j++)
            ac[j][0] = ac[j][1] = ac[j][2] = ac[j][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < AT_KC; ks += 16) {
            uint32_t a[3][4], q0[3], q1[3], q2[3], q3[3];
            split3(sS[g][ks + 2 * t], sS[g][ks + 2 * t + 1], q0);
            split3(sS[g + 8][ks + 2 * t], sS[g + 8][ks + 2 * t + 1], q1);
            split3(sS[g][ks + 2 * t + 8], sS[g][ks + 2 * t + 9], q2);
            split3(sS[g + 8][ks + 2 * t + 8], sS[g + 8][ks + 2 * t + 9], q3);
#pragma unroll
            for (int u = 0; u < 3; u++) {
                a[u][0] = q0[u];
                a[u][1] = q1[u];
                a[u][2] = q2[u];
                a[u][3] = q3[u];
            }
            auto kat = [&](int i) { return crow{skey[i], G::packed ? sfmt[i] : -1, d}; };
            const crow k0 = kat(ks + 2 * t), k1 = kat(ks + 2 * t + 1), k8 = kat(ks + 2 * t + 8), k9 = kat(ks + 2 * t + 9);
            if (G::packed && SPLIT) {
                /* the thread's columns 8 nt + g of the four keys, each key's loads together
                 * (column 8 (w + AT_NW j) + g is value j of the stride); the looping form,
                 * whose registers hold the row's O besides, reads value by value */
                float v0[AT_MAXNT], v1[AT_MAXNT], v8[AT_MAXNT], v9[AT_MAXNT];
                k0.strided(8 * w + g, 8 * AT_NW, v0);
                k1.strided(8 * w + g, 8 * AT_NW, v1);
                k8.strided(8 * w + g, 8 * AT_NW, v8);
                k9.strided(8 * w + g, 8 * AT_NW, v9);
#pragma unroll
                for (int j = 0; j < AT_MAXNT; j++)
                    if (w + AT_NW * j < ntd) {
                        uint32_t b0[3], b1[3];
                        split3(v0[j], v1[j], b0);
                        split3(v8[j], v9[j], b1);
                        mma6(ac[j], a, b0, b1);
                    }
            } else {
#pragma unroll
                for (int j = 0; j < AT_MAXNT; j++) {
                    int nt = w + AT_NW * j;
                    if (nt < ntd) {
                        int col = 8 * nt + g;
                        uint32_t b0[3], b1[3];
                        split3(k0[col], k1[col], b0);
                        split3(k8[col], k9[col], b1);
                        mma6(ac[j], a, b0, b1);
                    }
                }
            }
        }
        if (SPLIT) {
            float *pr = part + (((int64_t)r * nch + c) * H + h0) * (d + 2);
#pragma unroll
            for (int j = 0; j < AT_MAXNT; j++) {
                int nt = w + AT_NW * j;
                if (nt < ntd) {
                    int col = 8 * nt + 2 * t;
                    if (va) {
                        pr[(int64_t)g * (d + 2) + col] = ac[j][0];
                        pr[(int64_t)g * (d + 2) + col + 1] = ac[j][1];
                    }
                    if (vb) {
                        pr[(int64_t)(g + 8) * (d + 2) + col] = ac[j][2];
                        pr[(int64_t)(g + 8) * (d + 2) + col + 1] = ac[j][3];
                    }
                }
            }
            if (threadIdx.x < AT_HG && h0 + (int)threadIdx.x < H) {
                pr[(int64_t)threadIdx.x * (d + 2) + d] = sm[threadIdx.x];
                pr[(int64_t)threadIdx.x * (d + 2) + d + 1] = sl[threadIdx.x];
            }
        } else {
            float aa, ba, ab, bb;
            float ma = sm[g], mb = sm[g + 8];
            at_weights(Ma, ma, aa, ba);
            at_weights(Mb, mb, ab, bb);
            La = at_mix(La, aa, sl[g], ba);
            Lb = at_mix(Lb, ab, sl[g + 8], bb);
#pragma unroll
            for (int j = 0; j < AT_MAXNT; j++) {
                O[j][0] = at_mix(O[j][0], aa, ac[j][0], ba);
                O[j][1] = at_mix(O[j][1], aa, ac[j][1], ba);
                O[j][2] = at_mix(O[j][2], ab, ac[j][2], bb);
                O[j][3] = at_mix(O[j][3], ab, ac[j][3], bb);
            }
        }
        __syncthreads(); /* sS, skey, sm and sl are the next chunk's */
    }
    if (!SPLIT) {
        float *oa = o + ((int64_t)r * H + h0 + g) * d, *ob = oa + (int64_t)8 * d;
#pragma unroll
        for (int j = 0; j < AT_MAXNT; j++) {
            int nt = w + AT_NW * j;
            if (nt < ntd) {
                int col = 8 * nt + 2 * t;
                if (va) {
                    oa[col] = __fdiv_rn(O[j][0], La);
                    oa[col + 1] = __fdiv_rn(O[j][1], La);
                }
                if (vb) {
                    ob[col] = __fdiv_rn(O[j][2], Lb);
                    ob[col + 1] = __fdiv_rn(O[j][3], Lb);
                }
            }
        }
    }
}

/* Grid (R, H), NB threads over the columns: the row's chunk partials merged in chunk order
 * from the sink, as k_attn_tc's looping form does, then O / L. */
template <class G>
__global__ void __launch_bounds__(NB) k_attn_join(G geo, int H, int d, int nch, const float *sink, const float *part,
                                                  float *o)
{
    PDL_WAIT();
    int r = blockIdx.x, h = blockIdx.y;
    typename G::Row ar(geo, r, d);
    float *orow = o + ((int64_t)r * H + h) * d;
    if (!ar.ok) {
        for (int j = threadIdx.x; j < d; j += NB)
            orow[j] = __int_as_float(0x7fc00000);
        return;
    }
    int nchr = (ar.nk + AT_KC - 1) / AT_KC;
    const float *pr = part + ((int64_t)r * nch * H + h) * (d + 2);
    size_t cstride = (size_t)H * (d + 2);
    for (int j = threadIdx.x; j < d; j += NB) {
        float M = sink[h], L = 1.0f, O = 0.0f;
        for (int c = 0; c < nchr; c++) {
            const float *pc = pr + c * cstride;
            float a, b;
            at_weights(M, pc[d], a, b);
            L = at_mix(L, a, pc[d + 1], b);
            O = at_mix(O, a, pc[j], b);
        }
        orow[j] = __fdiv_rn(O, L);
    }
}

} // namespace

/* Rows at most this many head groups in all take a block per chunk (the split form). */
enum { AT_SPLIT_GROUPS = 132 };

bool dsv4cu::attn_tc_fits(int H, int d) { return H > 0 && d > 0 && d % 16 == 0 && d <= 8 * AT_NW * AT_MAXNT; }

size_t dsv4cu::attn_tc_part(int R, int H, int d, int64_t nkmax)
{
    int groups = (H + AT_HG - 1) / AT_HG;
    if (!attn_tc_fits(H, d) || (int64_t)R * groups > AT_SPLIT_GROUPS)
        return 0;
    int64_t nch = (nkmax + AT_KC - 1) / AT_KC;
    return (size_t)R * (size_t)nch * (size_t)H * (size_t)(d + 2);
}

/* The launch for rows of geometry G: per chunk and joined when part holds the partials, else a
 * block a row and head group. */
template <class G>
static bool tc_launch(const G &geo, int R, int H, int d, int64_t nkmax, float scale, const float *sink, const float *q,
                      float *o, float *part, size_t part_n)
{
    int groups = (H + AT_HG - 1) / AT_HG;
    int nch = (int)((nkmax + AT_KC - 1) / AT_KC);
    size_t need = attn_tc_part(R, H, d, nkmax);
    if (need && part && part_n >= need && nch <= 65535) {
        launch_k(k_attn_tc<true, G>, dim3((unsigned)R, (unsigned)groups, (unsigned)nch), AT_NT, 0, stream, geo, H, d, nch,
                 scale, sink, q, o, part);
        if (!launched("attention (tensor cores, per chunk)"))
            return false;
        launch_k(k_attn_join<G>, dim3((unsigned)R, (unsigned)H), NB, 0, stream, geo, H, d, nch, sink, (const float *)part,
                 o);
        return launched("attention (chunks joined)");
    }
    launch_k(k_attn_tc<false, G>, dim3((unsigned)R, (unsigned)groups, 1), AT_NT, 0, stream, geo, H, d, nch, scale, sink, q,
             o, (float *)NULL);
    return launched("attention (tensor cores)");
}

bool dsv4cu::attn_tc_launch(const rows_dev &rd, int ratio, int csa, int topk, int64_t vis_cap, int kv_cap, int H,
                            int d, int window, int64_t nkmax, float scale, const float *sink, const float *q,
                            const float *kv, const int *sel, int prod, float *o, float *part, size_t part_n)
{
    if (prod) {
        geo4<1> g = {rd, ratio, csa, topk, vis_cap, kv_cap, window, (int)nkmax, kv, sel};
        return tc_launch(g, rd.R, H, d, nkmax, scale, sink, q, o, part, part_n);
    }
    geo4<0> g = {rd, ratio, csa, topk, vis_cap, kv_cap, window, (int)nkmax, kv, sel};
    return tc_launch(g, rd.R, H, d, nkmax, scale, sink, q, o, part, part_n);
}

bool dsv4cu::attn41_tc_launch(const geo41 &g, int H, int d, float scale, const float *sink, const float *q, float *o,
                              float *part, size_t part_n)
{
    return tc_launch(g, g.rd.R, H, d, g.nkmax, scale, sink, q, o, part, part_n);
}
