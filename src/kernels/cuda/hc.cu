/* CUDA hyper-connection sites: hc_pre (the mixes, Sinkhorn and the collapse, optionally
 * RMS-normed), hc_post (and hc_post_rb, its values stored through bf16), and hc_collapse with
 * given weights (V4.1). */
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cuda/internal.h"
#include "kernels/hc_mix.h"
#include "kernels/cuda/norm.cuh"
#include "kernels/cuda/rounding.cuh"

using namespace dsv4cu;

/* ---- hyper-connections ------------------------------------------------------------------ */

enum { HC_MAXN = 5, HC_MAXM = (2 + HC_MAXN) * HC_MAXN };
static_assert(HC_MAXN * HC_MAXN <= 32, "k_hc_pre holds the comb matrix in one warp");

/* Elements of X's row a block of k_hc_mix sums: the mixes of one row are spread over
 * (nm + 1) * cdiv(nd, HC_SPAN) blocks (a single block per row left the site latency-bound). */
enum { HC_SPAN = 2048, HC_U = 8 };

/* Partial sums of the site's dot products over span sp of row t: part[t][j][sp] = fn_j . X_t
 * for j < nm, X_t . X_t for j = nm; fixed order per shape. Block b is (j, sp, t) with j
 * varying fastest, then sp: the nm + 1 blocks that read one span of X_t run together, so the
 * span comes from memory once and from the L2 for the others (fn, a few MB, stays there). */
__global__ void __launch_bounds__(NB) k_hc_mix(const float *X, int64_t nd, const float *fn, int nm, int nsp, float *part)
{
    PDL_WAIT();
    __shared__ float sh[NW + 1];
    int64_t b = blockIdx.x;
    int j = (int)(b % (nm + 1)), sp = (int)(b / (nm + 1) % nsp);
    int64_t t = b / (nm + 1) / nsp;
    const float *x = X + t * nd, *f = j < nm ? fn + j * nd : x;
    int64_t i0 = (int64_t)sp * HC_SPAN, i1 = i0 + HC_SPAN < nd ? i0 + HC_SPAN : nd;
    float a = 0.0f;
    for (int64_t i = i0 + threadIdx.x; i < i1; i += NB)
        a = fmaf(f[i], x[i], a);
    a = block_sum<NW>(a, sh);
    if (threadIdx.x == 0)
        part[((int64_t)t * (nm + 1) + j) * nsp + sp] = a;
}

/* One Sinkhorn half-step on comb element v of an N x N matrix held one element a lane (lanes
 * past N N hold nothing): the line's entries, lanes first + q stride, gathered by shuffles
 * (all issued before the sum needs them), summed in index order, then v divided by the sum +
 * hc_eps, as dsv4_hc_normalize does. */
template <int N>
__device__ __forceinline__ float hc_line(float v, bool own, int first, int stride, float hc_eps)
{
    float e[N], sum = 0.0f;
#pragma unroll
    for (int q = 0; q < N; q++)
        e[q] = __shfl_sync(0xffffffffu, v, (first + q * stride) & 31);
#pragma unroll
    for (int q = 0; q < N; q++)
        sum += e[q];
    return own ? v / (sum + hc_eps) : v;
}

/* The Sinkhorn steps on element (jr, kc): rows (from the second iteration on), then columns. */
template <int N>
__device__ __forceinline__ float hc_sinkhorn(float v, bool own, int jr, int kc, int iters, float hc_eps)
{
    for (int it = 0; it < iters; it++) {
        if (it > 0)
            v = hc_line<N>(v, own, jr * N, 1, hc_eps);
        v = hc_line<N>(v, own, kc, N, hc_eps);
    }
    return v;
}

/* One block per row t: the nm dot products from k_hc_mix's spans (each summed in span order),
 * the norm, the mixes, then the collapse h = sum_i pre_i X_i (HC_U channels a
 * thread at a time so their loads are in flight together; each channel's streams in order).
 * hw: h then RMS-normed times hw as k_rmsnorm does it (the same channels per thread, the same
 * order), when D <= NB * RMS_V; the host runs k_rmsnorm after this kernel otherwise.
 * X [T, n*D]; pre/post [T, n], comb [T, n, n], h [T, D]; post == NULL: the head collapse. */
__global__ void __launch_bounds__(NB) k_hc_pre(const float *X, int n, int D, const float *part, int nsp, const float *base,
                                               const float *scale, int iters, float hc_eps, float norm_eps, float *pre,
                                               float *post, float *comb, float *h, const float *hw)
{
    PDL_WAIT();
    __shared__ float m[HC_MAXM + 1], c[HC_MAXN * HC_MAXN], pr[HC_MAXN], po[HC_MAXN], sh[NW + 1];
    int t = blockIdx.x;
    int nm = post ? (2 + n) * n : n;
    int64_t nd = (int64_t)n * D;
    const float *x = X + t * nd;
    /* the fused collapse's inputs, loaded before anything waits on them: their latency passes
     * while the mixes are made */
    bool fused = h && hw && D <= NB * RMS_V;
    float xv[RMS_V][HC_MAXN];
#pragma unroll
    for (int u = 0; u < RMS_V; u++)
#pragma unroll
        for (int i = 0; i < HC_MAXN; i++) {
            int dd = threadIdx.x + u * NB;
            xv[u][i] = fused && i < n && dd < D ? x[(int64_t)i * D + dd] : 0.0f;
        }
    for (int j = threadIdx.x; j <= nm; j += NB) {
        const float *p = part + ((int64_t)t * (nm + 1) + j) * nsp;
        float a = 0.0f;
        for (int sp = 0; sp < nsp; sp++)
            a += p[sp];
        m[j] = a;
    }
    __syncthreads();
    float inv = 1.0f / sqrtf(m[nm] / (float)nd + norm_eps);
    __syncthreads();
    for (int j = threadIdx.x; j < nm; j += NB)
        m[j] *= inv;
    __syncthreads();
    /* The mixes, by warp 0: lane j < n stream j's pre, post and comb row (hc_mix.h); then lane
     * l < n n holds comb element (l / n, l % n) through the Sinkhorn steps, gathering its row's
     * or column's entries by shuffles and summing them in index order, as the CPU does. One
     * division per lane and half-step, so a line's divisions run side by side rather than one
     * after another in a single thread. */
    if (threadIdx.x < 32) {
        int l = threadIdx.x, jr = l / n, kc = l % n;
        bool own = l < n * n;
        if (l < n) {
            pr[l] = dsv4_sigmoid(m[l] * scale[0] + base[l]) + hc_eps;
            if (post) {
                po[l] = 2.0f * dsv4_sigmoid(m[n + l] * scale[1] + base[n + l]);
                dsv4_hc_comb_row(m, scale, base, n, l, hc_eps, c);
            }
        }
        __syncwarp();
        float v = own ? c[l] : 0.0f;
        if (post) {
            switch (n) {
            case 1: v = hc_sinkhorn<1>(v, own, jr, kc, iters, hc_eps); break;
            case 2: v = hc_sinkhorn<2>(v, own, jr, kc, iters, hc_eps); break;
            case 3: v = hc_sinkhorn<3>(v, own, jr, kc, iters, hc_eps); break;
            case 4: v = hc_sinkhorn<4>(v, own, jr, kc, iters, hc_eps); break;
            default: v = hc_sinkhorn<5>(v, own, jr, kc, iters, hc_eps); break;
            }
        }
        if (post && own)
            c[l] = v;
    }
    __syncthreads();
    if (threadIdx.x < n) {
        pre[t * n + threadIdx.x] = pr[threadIdx.x];
        if (post)
            post[t * n + threadIdx.x] = po[threadIdx.x];
    }
    for (int i = threadIdx.x; post && i < n * n; i += NB)
        comb[(int64_t)t * n * n + i] = c[i];
    if (!h)
        return;
    float *hr = h + (int64_t)t * D;
    if (fused) {
        float v[RMS_V], wv[RMS_V];
#pragma unroll
        for (int u = 0; u < RMS_V; u++) {
            int dd = threadIdx.x + u * NB;
            wv[u] = dd < D ? hw[dd] : 1.0f;
            v[u] = 0.0f;
#pragma unroll
            for (int i = 0; i < HC_MAXN; i++)
                if (i < n)
                    v[u] = fmaf(pr[i], xv[u][i], v[u]);
        }
        rms_out(v, wv, true, D, norm_eps, sh, hr);
        return;
    }
    for (int d0 = threadIdx.x; d0 < D; d0 += HC_U * NB) {
        float s[HC_U];
#pragma unroll
        for (int u = 0; u < HC_U; u++)
            s[u] = 0.0f;
        for (int i = 0; i < n; i++)
#pragma unroll
            for (int u = 0; u < HC_U; u++)
                if (d0 + u * NB < D)
                    s[u] = fmaf(pr[i], x[(int64_t)i * D + d0 + u * NB], s[u]);
#pragma unroll
        for (int u = 0; u < HC_U; u++)
            if (d0 + u * NB < D)
                hr[d0 + u * NB] = s[u];
    }
}

/* Device scratch for k_hc_mix's partial sums. It only grows, and an outgrown buffer is kept:
 * a recorded graph may still read it. */
static growbuf g_hcp;

/* growing is not recordable; the step then runs the ops again */
static float *hc_parts(size_t n) { return grow_buf(&g_hcp, n, n, "hc_pre's scratch"); }

void dsv4cu::cu_hc_pre(const float *X, int T, int n, int D, const float *fn, const float *base, const float *scale,
                      int iters, float hc_eps, float norm_eps, float *pre, float *post, float *comb, float *h,
                      const float *hw)
{
    if (T <= 0)
        return;
    int nm = post ? (2 + n) * n : n;
    int64_t nd = (int64_t)n * D;
    size_t bp = (size_t)T * n * sizeof(float), bc = (size_t)T * n * n * sizeof(float), bh = (size_t)T * D * sizeof(float);
    op_begin();
    int ok = n <= HC_MAXN;
    if (!ok)
        fail(DSV4_E_UNSUPPORTED, "cuda: hc_pre: %d streams, the kernel holds at most %d", n, HC_MAXN);
    ok = ok && given("hc_pre", {X, pre, fn, base, scale}) && (!post || given("hc_pre", {comb}));
    const float *dfn = ok ? (const float *)dev_const(fn, "hc_pre", "fn") : NULL;
    const float *db = ok ? (const float *)dev_const(base, "hc_pre", "base") : NULL;
    const float *ds = ok ? (const float *)dev_const(scale, "hc_pre", "scale") : NULL;
    const float *dhw = ok && h && hw ? (const float *)dev_const(hw, "hc_pre", "hw") : NULL;
    int nsp = (int)cdiv(nd, HC_SPAN);
    bool in = dfn && db && ds && (dhw || !h || !hw);
    float *part = in ? hc_parts((size_t)T * (nm + 1) * nsp) : NULL;
    bool ran = part && poison_out(pre, bp) && poison_out(h, bh) &&
               (!post || (poison_out(post, bp) && poison_out(comb, bc)));
    if (ran) {
        launch_k(k_hc_mix, dim3((unsigned)((int64_t)T * (nm + 1) * nsp)), NB, 0, stream, X, nd, dfn, nm, nsp, part);
        prof_split("hc_pre: mixes");
        launch_k(k_hc_pre, T, NB, 0, stream, X, n, D, part, nsp, db, ds, iters, hc_eps, norm_eps, pre, post, comb, h, dhw);
        if (dhw && D > NB * RMS_V && launched("hc_pre"))
            launch_k(k_rmsnorm, (unsigned)T, NB, 0, stream, (const float *)h, D, dhw, norm_eps, h);
        if (launched("hc_pre")) { /* h NULL: the mixes only (V4.1 collapses with another site's pre) */
            op_end();
            return;
        }
    }
    out_fail(pre, bp);
    out_fail(h, bh);
    if (post) {
        out_fail(post, bp);
        out_fail(comb, bc);
    }
    op_end();
}

/* X[k] = post[k] y + sum_j comb[j][k] X[j]: one thread per (row, channel), all n streams; each
 * value stored through bf16 when rb (hc_post_rb: a thread reads and writes only its channel). */
__global__ void k_hc_post(float *X, const float *y, int T, int n, int D, const float *post, const float *comb, int rb)
{
    PDL_WAIT();
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)T * D)
        return;
    int64_t t = idx / D;
    int dd = (int)(idx % D);
    float *x = X + t * n * D;
    const float *po = post + t * n, *c = comb + t * n * n;
    float old[HC_MAXN];
    for (int j = 0; j < n; j++)
        old[j] = x[(int64_t)j * D + dd];
    float yv = y[t * D + dd];
    for (int k = 0; k < n; k++) {
        float s = po[k] * yv;
        for (int j = 0; j < n; j++)
            s = fmaf(c[j * n + k], old[j], s);
        x[(int64_t)k * D + dd] = rb ? rt_bf16(s) : s;
    }
}

/* hc_post (rb 0) or hc_post_rb; fn names the op in the profile. */
static void hc_post_op(const char *fn, const char *op, int rb, float *X, const float *y, int T, int n, int D,
                       const float *post, const float *comb)
{
    if (T <= 0)
        return;
    int64_t nd = (int64_t)n * D;
    size_t bX = (size_t)T * nd * sizeof(float);
    op_begin_at(fn);
    int ok = n <= HC_MAXN;
    if (!ok)
        fail(DSV4_E_UNSUPPORTED, "cuda: %s: %d streams, the kernel holds at most %d", op, n, HC_MAXN);
    ok = ok && given(op, {X, y, post, comb});
    if (ok) /* X is updated in place: nothing to poison */
        launch_k(k_hc_post, (unsigned)cdiv((int64_t)T * D, 256), 256, 0, stream, X, y, T, n, D, post, comb, rb);
    finish(ok, op, X, bX);
    op_end();
}

void dsv4cu::cu_hc_post(float *X, const float *y, int T, int n, int D, const float *post, const float *comb)
{
    hc_post_op(__func__, "hc_post", 0, X, y, T, n, D, post, comb);
}

void dsv4cu::cu_hc_post_rb(float *X, const float *y, int T, int n, int D, const float *post, const float *comb)
{
    hc_post_op(__func__, "hc_post_rb", 1, X, y, T, n, D, post, comb);
}


/* h = sum_i pre_i X_i with pre given (V4.1's sites): one thread per (row, channel), the
 * streams summed in order as on the CPU. */
__global__ void k_hc_collapse(const float *X, int T, int n, int D, const float *pre, float *h)
{
    PDL_WAIT();
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)T * D)
        return;
    int64_t t = idx / D;
    int dd = (int)(idx % D);
    const float *x = X + t * n * D, *pr = pre + t * n;
    float s = 0.0f;
    for (int i = 0; i < n; i++)
        s = fmaf(pr[i], x[(int64_t)i * D + dd], s);
    h[idx] = s;
}

void dsv4cu::cu_hc_collapse(const float *X, int T, int n, int D, const float *pre, float *h)
{
    if (T <= 0)
        return;
    size_t bh = (size_t)T * D * sizeof(float);
    op_begin();
    bool ran = given("hc_collapse", {X, pre, h}) && poison_out(h, bh);
    if (ran)
        launch_k(k_hc_collapse, (unsigned)cdiv((int64_t)T * D, 256), 256, 0, stream, X, T, n, D, pre, h);
    finish(ran, "hc_collapse", h, bh);
    op_end();
}
