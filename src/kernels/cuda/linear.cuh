/* kernels/cuda — the linear family's device side, shared by linear.cu and experts.cu: a
 * launch's jobs, the row maps (dense, or gathered through (row, expert) pairs) and the row
 * kernel every matrix-times-rows kernel runs. C++ only. */
#ifndef DSV4_CUDA_LINEAR_CUH
#define DSV4_CUDA_LINEAR_CUH

#include "kernels/cuda/forms.cuh"
#include "kernels/cuda/rounding.cuh"

namespace dsv4cu {

enum { LIN_WARPS = 8, LIN_TT = 8, LIN_MIN_WARPS = 3200 };

/* One launch's work: n jobs, each rows [r0, r0 + nr) of its weight times its x, bpj blocks a
 * job. A single linear is one job; a group (experts of one form and shape) is several. A
 * multi launch (weights of one form over one x) has jobs of their own row counts nrj and
 * warps per row: job j takes blocks b0[j] .. b0[j + 1] - 1 and writes y[j] dense. */
struct lin_jobs {
    wdev w[DSV4_CUDA_GROUP_MAX];
    int64_t r0[DSV4_CUDA_GROUP_MAX];
    const float *x[DSV4_CUDA_GROUP_MAX];
    float *y[DSV4_CUDA_GROUP_MAX];
    int nrj[DSV4_CUDA_GROUP_MAX];
    int b0[DSV4_CUDA_GROUP_MAX + 1];
    float *part[DSV4_CUDA_GROUP_MAX]; /* tensor-core path: the job's slice partials, or NULL (mma.cuh) */
    int zj[DSV4_CUDA_GROUP_MAX];      /* and its slice groups */
    int n, nr, bpj, multi;
    int x1;                     /* x holds bf16 values: the tensor-core path takes one term (mma.cuh) */
    int rb;                     /* a single job's outputs rounded to bf16 as they are written (REF) */
    int64_t ldx, ldy;           /* a single job's row strides (groups are dense), x's in a multi launch */
};

/* y[t, i] = sum_k W[r0 + i, k] x[t, k]; x [T, k] dense, y [T, nr] dense, per job.
 * Chunk path (VEC): a warp owns R rows, wpr warps split a row group's chunks (R and wpr from
 * the weight's form and shape alone); each lane accumulates its chunks of a row in order, a
 * chunk of a block-scaled form summed unscaled (8 products) and entering the lane's sum as one
 * fma with its block's scale; a warp's lanes meet in the xor tree, the group's warps in warp
 * order. Element path: one warp per row, lane l takes elements l, l + 32, ... with the scale
 * applied per element. Tokens go TT at a time over the same rows, each with its own sums and
 * the same sequence of operations, so a token's result is the same whatever T is, wherever
 * the token sits in the batch, and whether TT is 1 (the T = 1 build, fewer registers) or 8. */
/* Where token t's x row is read and its y row written: dense with row strides (linear), or
 * gathered through a list of (row, expert) pairs (the experts op). Only addresses differ; the
 * operations on a token's sums are the same. */
struct dense_map {
    const float *x;
    float *y;
    int64_t ldx, ldy;
    int rb; /* put rounds each value to bf16 (REF's output rounding) */
    /* the map of tokens t0, t0 + 1, ... */
    __device__ __forceinline__ dense_map at(int t0) const
    {
        return dense_map{x + (int64_t)t0 * ldx, y + (int64_t)t0 * ldy, ldx, ldy, rb};
    }
    /* the same rows written to p with row stride ld, as they are (a split's partial sums) */
    __device__ __forceinline__ dense_map with_y(float *p, int64_t ld) const { return dense_map{x, p, ldx, ld, 0}; }
    __device__ __forceinline__ const float *xr(int t) const { return x + (int64_t)t * ldx; }
    __device__ __forceinline__ float *yr(int t) const { return y + (int64_t)t * ldy; }
    __device__ __forceinline__ void put(int t, int64_t i, float v) const { yr(t)[i] = rb ? rt_bf16(v) : v; }
};

struct pair_map {
    const float *x;             /* row ord[t] / xdiv of it, row stride ldx */
    float *y;                   /* row ord[t] of it, row stride ldy */
    const int *ord;             /* the tile's pairs */
    int xdiv;
    int64_t ldx, ldy;
    __device__ __forceinline__ const float *xr(int t) const { return x + (int64_t)(__ldg(ord + t) / xdiv) * ldx; }
    __device__ __forceinline__ float *yr(int t) const { return y + (int64_t)__ldg(ord + t) * ldy; }
    __device__ __forceinline__ pair_map with_y(float *p, int64_t ld) const { return pair_map{x, p, ord, xdiv, ldx, ld}; }
    __device__ __forceinline__ void put(int t, int64_t i, float v) const { yr(t)[i] = v; }
};

template <int F, bool VEC, int TT, class M>
__device__ __forceinline__ void linear_rows(const wdev &w, int64_t r0, int nr, const M &m, int T, int blk)
{
    const int R = VEC ? (int)ck<F>::R : 1;
    static_assert((VEC ? (int)ck<F>::R : 1) * TT <= 32, "one lane per (row, token) adds the group's warp sums");
    __shared__ float lut4[16];
    __shared__ float part[LIN_WARPS][VEC ? (int)ck<F>::R : 1][TT];
    if (threadIdx.x < 16)
        lut4[threadIdx.x] = c_e2m1[threadIdx.x];
    __syncthreads();
    const bool scaled = F == DSV4_WF_FP8 || F == DSV4_WF_FP4;
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    int wpr = VEC ? w.wpr : 1;
    int i0 = (blk * (LIN_WARPS / wpr) + wid / wpr) * R, sub = wid % wpr;
    bool live = i0 < nr;
    int64_t k = w.k;
    for (int t0 = 0; t0 < T; t0 += TT) {
        const float *xt[TT];
#pragma unroll
        for (int tt = 0; tt < TT; tt++)
            xt[tt] = t0 + tt < T ? m.xr(t0 + tt) : NULL;
        float acc[R][TT];
#pragma unroll
        for (int rr = 0; rr < R; rr++)
#pragma unroll
            for (int tt = 0; tt < TT; tt++)
                acc[rr][tt] = 0.0f;
        if (live && VEC) {
            typedef typename ck<F>::T CT;
            const int U = ck<F>::U;
            int64_t nch = k / 8, step = 32 * wpr;
            /* FP8 scale blocks span bn rows: when the group's R rows lie in one, they share each
             * chunk's scale, loaded and decoded once (the same value, so the same sums) */
            const bool one_scale = F == DSV4_WF_FP8 && w.bn % R == 0 && r0 % R == 0;
            const CT *row[R];
            int64_t sbase[R];
#pragma unroll
            for (int rr = 0; rr < R; rr++) {
                /* rows past the range read the group's first row; their sums are dropped */
                int64_t r = r0 + (i0 + rr < nr ? i0 + rr : i0);
                row[rr] = (const CT *)w.q + r * nch;
                sbase[rr] = F == DSV4_WF_FP8 ? (int64_t)((uint32_t)r / (uint32_t)w.bn) * w.sk : r * w.sk;
            }
            for (int64_t c0 = sub * 32 + lane; c0 < nch; c0 += step * U) {
                CT raw[U][R];
#pragma unroll
                for (int u = 0; u < U; u++)
#pragma unroll
                    for (int rr = 0; rr < R; rr++)
                        if (c0 + u * step < nch)
                            raw[u][rr] = ck<F>::ld(row[rr] + c0 + u * step);
#pragma unroll
                for (int u = 0; u < U; u++) {
                    int64_t c = c0 + u * step;
                    if (c >= nch)
                        break;
                    /* TT == 1: each row decoded right before its products (8 values live,
                     * not 8 R); TT > 1: all R decoded once and reused by every token. The
                     * operations on a token's sums are the same either way. */
                    float v[TT == 1 ? 1 : R][8], s[R];
                    uint32_t blk = w.cshift >= 0 ? (uint32_t)c >> w.cshift : (uint32_t)c / (uint32_t)w.cpb;
#pragma unroll
                    for (int rr = 0; rr < R; rr++) {
                        if (TT > 1)
                            decode8<F>(raw[u][rr], v[TT == 1 ? 0 : rr]);
                        s[rr] = !scaled ? 1.0f : rr > 0 && one_scale ? s[0] : scale_at(w.s, w.e8m0, sbase[rr] + blk);
                    }
#pragma unroll
                    for (int tt = 0; tt < TT; tt++) {
                        if (t0 + tt >= T)
                            break;
                        const float4 *xp = (const float4 *)(xt[tt] + c * 8);
                        float4 a = __ldg(xp), b = __ldg(xp + 1);
#pragma unroll
                        for (int rr = 0; rr < R; rr++) {
                            const int vr = TT == 1 ? 0 : rr;
                            if (TT == 1)
                                decode8<F>(raw[u][rr], v[0]);
                            if (scaled) {
                                float p = v[vr][0] * a.x;
                                p = fmaf(v[vr][1], a.y, p);
                                p = fmaf(v[vr][2], a.z, p);
                                p = fmaf(v[vr][3], a.w, p);
                                p = fmaf(v[vr][4], b.x, p);
                                p = fmaf(v[vr][5], b.y, p);
                                p = fmaf(v[vr][6], b.z, p);
                                p = fmaf(v[vr][7], b.w, p);
                                acc[rr][tt] = fmaf(p, s[rr], acc[rr][tt]);
                            } else {
                                float q = acc[rr][tt];
                                q = fmaf(v[vr][0], a.x, q);
                                q = fmaf(v[vr][1], a.y, q);
                                q = fmaf(v[vr][2], a.z, q);
                                q = fmaf(v[vr][3], a.w, q);
                                q = fmaf(v[vr][4], b.x, q);
                                q = fmaf(v[vr][5], b.y, q);
                                q = fmaf(v[vr][6], b.z, q);
                                acc[rr][tt] = fmaf(v[vr][7], b.w, q);
                            }
                        }
                    }
                }
            }
        } else if (live) {
            int64_t r = r0 + i0;
            for (int64_t kk = lane; kk < k; kk += 32) {
                float v = decode1(w, r, kk, lut4);
#pragma unroll
                for (int tt = 0; tt < TT; tt++) {
                    if (t0 + tt >= T)
                        break;
                    acc[0][tt] = fmaf(v, xt[tt][kk], acc[0][tt]);
                }
            }
        }
#pragma unroll
        for (int rr = 0; rr < R; rr++)
#pragma unroll
            for (int tt = 0; tt < TT; tt++) {
                float sum = warp_sum(acc[rr][tt]);
                if (lane == 0)
                    part[wid][rr][tt] = sum;
            }
        __syncthreads();
        if (live && sub == 0 && lane < R * TT) {
            int rr = lane / TT, tt = lane % TT;
            if (i0 + rr < nr && t0 + tt < T) {
                float sum = part[wid][rr][tt];
                for (int j = 1; j < wpr; j++)
                    sum += part[wid + j][rr][tt];
                m.put(t0 + tt, i0 + rr, sum);
            }
        }
        __syncthreads();
    }
}


/* A storage form's chunk path: rows a warp owns (R) and chunks of each in flight (U). */
struct ck_shape {
    int R, U;
};

/* Host side (linear.cu), for the experts op: whether the 8-element chunk path tiles a weight,
 * a form's chunk shape, and a weight's device view when it runs beside mats - 1 others of its
 * shape. */
bool vec_ok(const dsv4_weight *w);
ck_shape chunk_shape(int form);
wdev wdev_of_n(const dsv4_weight *w, const void *q, const void *s, int mats);

static inline wdev wdev_of(const dsv4_weight *w, const void *q, const void *s) { return wdev_of_n(w, q, s, 1); }

} // namespace dsv4cu

#endif
