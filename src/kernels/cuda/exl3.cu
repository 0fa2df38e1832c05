/* kernels/cuda/exl3 — EXL3 linear layers on the GPU (interface and numerics: exl3_cuda.h).
 *
 * Facts used (the format: ExLlamaV3's, as docs/exl3.md reads it; the CPU twin: kernels/cpu/exl3.c):
 * - trellis [kp/16][np/16][16K] uint16: tile (i, j) = input rows 16i.., output columns 16j..,
 *   16K words; read as 8K little-endian u32 (word 2m low, 2m+1 high), stream bit 0 = MSB of
 *   u32 0. The state of trellis position p is the 16 stream bits starting at (p+1)K - 16
 *   (mod 256K), MSB first.
 * - position p = 8t + j holds tile element row 2(t%4) + {0,1,8,9}[j%4], column t/4 + 8(j/4).
 *   So column cc's 16 rows are 4 runs of 4 consecutive positions: run g (rows 2g, 2g+1, 2g+8,
 *   2g+9) starts at P = 32(cc%8) + 8g + 4(cc/8). Its 4 states lie within 3K + 16 <= 40 bits
 *   from the run's first state bit: two funnel shifts of 3 words give a 64-bit window, and
 *   the 4 states are at fixed offsets 0, K, 2K, 3K in it.
 * - codebooks (state -> fp16 value): 3INST x = s*89226354 + 64248484, MCG x = s*0xCBAC1FED,
 *   then x = (x & 0x8FFF8FFF) ^ 0x3B603B60 and value = fp16(half(x.lo) + half(x.hi)) (one
 *   rounding: __hadd2, two states at once); MUL1 x = s*0x83DCD12D, value = fp16((1024 + byte
 *   sum of x) * half(0x1EEE) + half(0xC931)) with one rounding (__hfma2; exact before it).
 *
 * Kernels, all on the caller's stream:
 * 1. exl3_in: a warp per (row, 128 block): x ⊙ suh (0 past k), the butterflies of the CPU's
 *    fwht128 in its stage order (h = 1, 2, ..., 64), times 1/√128.
 * 2. exl3_core: a block of 128 threads per (128-column output block, k slice, group of up to
 *    8 rows). The block's 8 tiles of 8 tile rows (one 128-row chunk) are loaded with 16-byte
 *    coalesced loads into shared memory (the next chunk's loads are in flight while this one
 *    is used), each trellis word read once per row group. Thread c owns output column c:
 *    it decodes its 16 weights of a tile into registers and adds x'[t, r] Ŵ[r, c] for r in
 *    ascending order, one fma each, for every row t of the group. Writes its slice's sum.
 * 3. exl3_out: a warp per (row, output block): the slices' sums added in slice order, the
 *    butterflies, times 1/√128, times svh, plus bias; writes the columns in [r0, r1).
 * The number of slices S depends on (kp, np) only. */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unordered_map>
extern "C" { /* the C headers carry no linkage of their own */
#include "core/core.h"
#include "io/exl3_format.h"
#include "io/weight.h"
}
#include "kernels/cuda/exl3_cuda.h"
#include "kernels/cuda/exl3_code.cuh"
#include "kernels/cuda/exl3_mma.cuh"
#include "kernels/cuda/internal.h"

namespace {

constexpr int BT = 128;              /* threads of a core block = output columns it owns */
constexpr int64_t TARGET = 528;      /* core blocks wanted (4 a SM on an H200); a constant, so
                                        S is a function of the shape only */
constexpr int MIN_CHUNKS = 2;        /* 128-row chunks a slice has at least */
constexpr int ROUND = 1024;          /* rows of x a call computes at once: bounds the scratch */

/* ------------------------------------------------------------------------ device code */

/* The CPU's fwht128 on 128 values held by a warp, lane l holding v[m] = element l + 32m:
 * stages h = 1..16 across lanes, 32 and 64 across m; at each stage the pair (j, j + h) becomes
 * (a + b, a - b) with a = v[j], b = v[j + h]. */
__device__ __forceinline__ void fwht128_warp(float v[4], int lane)
{
#pragma unroll
    for (int h = 1; h < 32; h <<= 1) {
#pragma unroll
        for (int m = 0; m < 4; m++) {
            float p = __shfl_xor_sync(0xffffffffu, v[m], h);
            v[m] = (lane & h) ? __fsub_rn(p, v[m]) : __fadd_rn(v[m], p);
        }
    }
    float a0 = __fadd_rn(v[0], v[1]), a1 = __fsub_rn(v[0], v[1]);
    float a2 = __fadd_rn(v[2], v[3]), a3 = __fsub_rn(v[2], v[3]);
    v[0] = __fadd_rn(a0, a2);
    v[2] = __fsub_rn(a0, a2);
    v[1] = __fadd_rn(a1, a3);
    v[3] = __fsub_rn(a1, a3);
}

/* xh[t, 0..kp) = H(x[t] ⊙ suh)/√128 per 128 block, zero past k. A warp per (t, block). */
__global__ void __launch_bounds__(128) exl3_in(const float *__restrict__ x, int64_t ldx, const float *__restrict__ suh,
                                               float *__restrict__ xh, int64_t k, int64_t kp, int T, float s128)
{
    const int lane = threadIdx.x & 31;
    const int64_t nblk = kp / 128, wid = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
    if (wid >= (int64_t)T * nblk)
        return; /* whole warps only */
    const int64_t t = wid / nblk, base = (wid % nblk) * 128;
    float v[4];
#pragma unroll
    for (int m = 0; m < 4; m++) {
        int64_t i = base + lane + 32 * m;
        v[m] = i < k ? __fmul_rn(x[t * ldx + i], suh[i]) : 0.0f;
    }
    fwht128_warp(v, lane);
#pragma unroll
    for (int m = 0; m < 4; m++)
        xh[t * kp + base + lane + 32 * m] = __fmul_rn(v[m], s128);
}

/* part[s][t][bx*128 + c] = Σ over the slice's rows r (ascending) of xh[t, r] Ŵ[r, 128 b + c],
 * b = b0 + bx, one fma chain per (t, c) starting from 0. Grid (nbr, S, ceil(T / TT)). */
template <int K, int CB, int TT>
__global__ void __launch_bounds__(BT, 4)
    exl3_core(const uint4 *__restrict__ tr, const float *__restrict__ xh, float *__restrict__ part, int64_t kp,
              int64_t np, int T, int64_t b0, int nbr, int chunks, int S)
{
    constexpr int TW = 8 * K + 2; /* u32 a tile in shared memory (exl3_chunk_store) */
    __shared__ uint32_t ts[2][64 * TW];
    __shared__ __align__(16) float xs[2][TT][128];

    const int tid = threadIdx.x, bx = blockIdx.x, s = blockIdx.y;
    const int t0 = blockIdx.z * TT, nt = T - t0 < TT ? T - t0 : TT;
    const int64_t b = b0 + bx, tiles_n = np / 16;
    const int ch0 = (int)((int64_t)s * chunks / S), ch1 = (int)((int64_t)(s + 1) * chunks / S);

    /* this thread's column: tile jj of the block, column cc in it; per run g, the u32 holding
     * the run's first state bit and that bit's offset (0 = MSB) */
    const int jj = tid >> 4, cc = tid & 15;
    int wi[4], off[4];
#pragma unroll
    for (int g = 0; g < 4; g++)
        dsv4cu::exl3_run_at<K>(cc, g, wi[g], off[g]);

    uint4 rg[K];
    float rx[TT];
    auto load = [&](int ch) {
#pragma unroll
        for (int v = 0; v < K; v++)
            rg[v] = dsv4cu::exl3_chunk_load<K>(tr, tiles_n, b, ch, tid + BT * v);
#pragma unroll
        for (int t = 0; t < TT; t++)
            rx[t] = t < nt ? xh[(int64_t)(t0 + t) * kp + 128 * (int64_t)ch + tid] : 0.0f;
    };
    auto store = [&](int buf) {
#pragma unroll
        for (int v = 0; v < K; v++)
            dsv4cu::exl3_chunk_store<K>(ts[buf], tid + BT * v, rg[v]);
#pragma unroll
        for (int t = 0; t < TT; t++)
            xs[buf][t][tid] = rx[t];
    };

    float acc[TT];
#pragma unroll
    for (int t = 0; t < TT; t++)
        acc[t] = 0.0f;
    dsv4cu::exl3_chunks(ch0, ch1, load, store, [&](int buf) {
#pragma unroll 2
        for (int i = 0; i < 8; i++) {
            const uint32_t *tw = &ts[buf][(i * 8 + jj) * TW];
            float wv[16];
#pragma unroll
            for (int g = 0; g < 4; g++) {
                float2 d01, d23;
                dsv4cu::exl3_run<K, CB>(tw, wi[g], off[g], d01, d23);
                wv[2 * g] = d01.x;
                wv[2 * g + 1] = d01.y;
                wv[2 * g + 8] = d23.x;
                wv[2 * g + 9] = d23.y;
            }
#pragma unroll
            for (int t = 0; t < TT; t++) {
                const float4 *xr = reinterpret_cast<const float4 *>(&xs[buf][t][16 * i]);
                float a = acc[t];
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    float4 xv = xr[q];
                    a = __fmaf_rn(xv.x, wv[4 * q], a);
                    a = __fmaf_rn(xv.y, wv[4 * q + 1], a);
                    a = __fmaf_rn(xv.z, wv[4 * q + 2], a);
                    a = __fmaf_rn(xv.w, wv[4 * q + 3], a);
                }
                acc[t] = a;
            }
        }
    });
    const int64_t ncols = (int64_t)nbr * 128;
#pragma unroll
    for (int t = 0; t < TT; t++)
        if (t < nt)
            part[((int64_t)s * T + t0 + t) * ncols + (int64_t)bx * 128 + tid] = acc[t];
}

/* y[t, c - r0] for c in [r0, r1) of output block b0 + bx: the slices' sums in slice order,
 * H/√128, ⊙ svh, + bias. A warp per (t, bx). */
__global__ void __launch_bounds__(128)
    exl3_out(const float *__restrict__ part, int S, int T, int nbr, int64_t b0, const float *__restrict__ svh,
             const float *__restrict__ bias, float *__restrict__ y, int64_t ldy, int64_t r0, int64_t r1, float s128)
{
    const int lane = threadIdx.x & 31;
    const int64_t wid = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
    if (wid >= (int64_t)T * nbr)
        return;
    const int64_t t = wid / nbr, bx = wid % nbr, ncols = (int64_t)nbr * 128;
    float v[4];
#pragma unroll
    for (int m = 0; m < 4; m++) {
        const float *p = part + t * ncols + bx * 128 + lane + 32 * m;
        float a = p[0];
        for (int s = 1; s < S; s++)
            a = __fadd_rn(a, p[(int64_t)s * T * ncols]);
        v[m] = a;
    }
    fwht128_warp(v, lane);
#pragma unroll
    for (int m = 0; m < 4; m++) {
        int64_t c = (b0 + bx) * 128 + lane + 32 * m;
        if (c >= r0 && c < r1) {
            float o = __fmul_rn(__fmul_rn(v[m], s128), svh[c]);
            if (bias)
                o = __fadd_rn(o, bias[c]);
            y[t * ldy + c - r0] = o;
        }
    }
}

/* ------------------------------------------------------------------------ dispatch */

typedef void (*core_fn)(dim3, cudaStream_t, const uint4 *, const float *, float *, int64_t, int64_t, int, int64_t, int,
                        int, int);

template <int K, int CB, int TT>
void launch_core(dim3 grid, cudaStream_t st, const uint4 *tr, const float *xh, float *part, int64_t kp, int64_t np,
                 int T, int64_t b0, int nbr, int chunks, int S)
{
    exl3_core<K, CB, TT><<<grid, BT, 0, st>>>(tr, xh, part, kp, np, T, b0, nbr, chunks, S);
}

/* The tensor-core core (exl3_mma.cuh); its shared memory is past the default limit. */
template <int K, int CB>
void launch_core_tc(dim3 grid, cudaStream_t st, const uint4 *tr, const float *xh, float *part, int64_t kp, int64_t np,
                    int T, int64_t b0, int nbr, int chunks, int S)
{
    static bool attr; /* set once a kernel; setting it twice is harmless */
    if (!attr) {
        cudaFuncSetAttribute(dsv4cu::exl3_core_tc<K, CB>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)dsv4cu::exl3_tc_smem(K));
        attr = true;
    }
    dsv4cu::exl3_core_tc<K, CB>
        <<<grid, dsv4cu::X3_THREADS, dsv4cu::exl3_tc_smem(K), st>>>(tr, xh, part, kp, np, T, b0, nbr, chunks, S);
}

/* TT: rows a block of the FMA core takes (1, 2, 4, 8), or 0 for the tensor-core core. */
template <int K, int CB>
core_fn pick_tt(int TT)
{
    switch (TT) {
    case 0: return launch_core_tc<K, CB>;
    case 1: return launch_core<K, CB, 1>;
    case 2: return launch_core<K, CB, 2>;
    case 4: return launch_core<K, CB, 4>;
    default: return launch_core<K, CB, 8>;
    }
}

template <int K>
core_fn pick_cb(int cb, int TT)
{
    switch (cb) {
    case DSV4_EXL3_MCG: return pick_tt<K, DSV4_EXL3_MCG>(TT);
    case DSV4_EXL3_MUL1: return pick_tt<K, DSV4_EXL3_MUL1>(TT);
    default: return pick_tt<K, DSV4_EXL3_3INST>(TT);
    }
}

core_fn pick(int K, int cb, int TT)
{
    switch (K) {
    case 1: return pick_cb<1>(cb, TT);
    case 2: return pick_cb<2>(cb, TT);
    case 3: return pick_cb<3>(cb, TT);
    case 4: return pick_cb<4>(cb, TT);
    case 5: return pick_cb<5>(cb, TT);
    case 6: return pick_cb<6>(cb, TT);
    case 7: return pick_cb<7>(cb, TT);
    default: return pick_cb<8>(cb, TT);
    }
}

/* ------------------------------------------------------------------------ host state */

struct dev_layer {
    void *mem;           /* one allocation: trellis, suh, svh, bias */
    const uint16_t *tr;
    const float *suh, *svh, *bias;
    size_t bytes;
};

pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
std::unordered_map<const dsv4_exl3 *, dev_layer> *table; /* under mu */
size_t resident;                                         /* under mu */
void *scr;                                               /* cached scratch, under mu */
size_t scr_bytes;

pthread_mutex_t err_mu = PTHREAD_MUTEX_INITIALIZER;
dsv4_err first_err; /* under err_mu; code 0: none */

int record(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int record(int code, const char *fmt, ...)
{
    pthread_mutex_lock(&err_mu);
    if (!first_err.code) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(first_err.msg, sizeof first_err.msg, fmt, ap);
        va_end(ap);
        first_err.code = code;
    }
    pthread_mutex_unlock(&err_mu);
    return code;
}

size_t align256(size_t b) { return (b + 255) & ~(size_t)255; }

size_t trellis_bytes(const dsv4_exl3 *e) { return (size_t)(e->kp / 16) * (size_t)(e->np / 16) * 32 * (size_t)e->K; }

int slices(int64_t kp, int64_t np)
{
    int64_t nb = np / 128, cap = kp / 128 / MIN_CHUNKS;
    int64_t s = (TARGET + nb - 1) / nb;
    if (cap < 1)
        cap = 1;
    if (s > cap)
        s = cap;
    return s < 1 ? 1 : (int)s;
}

/* rows of x a core block takes at once: 1, 2, 4 or 8 (a power of two, at most 8) */
int rows_per_pass(int T) { return T >= 5 ? 8 : T >= 3 ? 4 : T; }

/* The layer's description is usable by the kernels; names what is not. */
const char *bad_layer(const dsv4_weight *w)
{
    if (!w || w->form != DSV4_WF_EXL3 || !w->exl3)
        return "not an EXL3 weight";
    const dsv4_exl3 *e = w->exl3;
    if (e->K < 1 || e->K > 8)
        return "K outside 1..8";
    if (e->cb < 0 || e->cb > 2)
        return "unknown codebook";
    if (e->kp <= 0 || e->np <= 0 || e->kp % 128 || e->np % 128)
        return "padded dims not positive multiples of 128";
    if (e->k < 0 || e->k > e->kp || e->n < 0 || e->n > e->np || !e->trellis || !e->suh || !e->svh)
        return "inconsistent layer record";
    return NULL;
}

size_t ws_need(const dsv4_exl3 *e, int64_t r0, int64_t r1, int T)
{
    if (T > ROUND)
        T = ROUND;
    int64_t nbr = (r1 + 127) / 128 - r0 / 128;
    return align256((size_t)T * (size_t)e->kp * 4) + (size_t)slices(e->kp, e->np) * (size_t)T * (size_t)nbr * 128 * 4;
}

} // namespace

/* ------------------------------------------------------------------------ C interface */

extern "C" int dsv4_cuda_exl3_put(const dsv4_weight *w, dsv4_err *err)
{
    const char *why = bad_layer(w);
    if (why)
        return dsv4_fail(err, DSV4_E_ARG, "exl3 put %s: %s", w && w->name ? w->name : "?", why);
    const dsv4_exl3 *e = w->exl3;
    pthread_mutex_lock(&mu);
    if (!table)
        table = new std::unordered_map<const dsv4_exl3 *, dev_layer>();
    if (table->count(e)) {
        pthread_mutex_unlock(&mu);
        return 0;
    }
    size_t tb = align256(trellis_bytes(e)), sb = align256((size_t)e->kp * 4), vb = align256((size_t)e->np * 4);
    size_t bb = e->bias ? (size_t)e->n * 4 : 0, total = tb + sb + vb + bb;
    dev_layer L = {};
    char *m = NULL;
    cudaError_t ce = cudaMalloc((void **)&m, total ? total : 1);
    if (ce == cudaSuccess)
        ce = cudaMemcpy(m, e->trellis, trellis_bytes(e), cudaMemcpyHostToDevice);
    if (ce == cudaSuccess)
        ce = cudaMemcpy(m + tb, e->suh, (size_t)e->kp * 4, cudaMemcpyHostToDevice);
    if (ce == cudaSuccess)
        ce = cudaMemcpy(m + tb + sb, e->svh, (size_t)e->np * 4, cudaMemcpyHostToDevice);
    if (ce == cudaSuccess && bb)
        ce = cudaMemcpy(m + tb + sb + vb, e->bias, bb, cudaMemcpyHostToDevice);
    if (ce != cudaSuccess) {
        if (m)
            cudaFree(m);
        pthread_mutex_unlock(&mu);
        return dsv4_fail(err, ce == cudaErrorMemoryAllocation ? DSV4_E_NOMEM : DSV4_E_DEVICE,
                         "exl3 put %s (%zu bytes): %s", e->prefix ? e->prefix : "?", total, cudaGetErrorString(ce));
    }
    L.mem = m;
    L.tr = (const uint16_t *)m;
    L.suh = (const float *)(m + tb);
    L.svh = (const float *)(m + tb + sb);
    L.bias = bb ? (const float *)(m + tb + sb + vb) : NULL;
    L.bytes = dsv4_cuda_exl3_bytes(w);
    (*table)[e] = L;
    resident += L.bytes;
    pthread_mutex_unlock(&mu);
    return 0;
}

extern "C" void dsv4_cuda_exl3_drop(const dsv4_weight *w)
{
    if (!w || !w->exl3)
        return;
    pthread_mutex_lock(&mu);
    if (table) {
        auto it = table->find(w->exl3);
        if (it != table->end()) {
            cudaFree(it->second.mem);
            resident -= it->second.bytes;
            table->erase(it);
        }
    }
    pthread_mutex_unlock(&mu);
}

extern "C" size_t dsv4_cuda_exl3_bytes(const dsv4_weight *w)
{
    if (bad_layer(w))
        return 0;
    const dsv4_exl3 *e = w->exl3;
    return trellis_bytes(e) + 4 * (size_t)(e->kp + e->np + (e->bias ? e->n : 0));
}

extern "C" size_t dsv4_cuda_exl3_resident(void)
{
    pthread_mutex_lock(&mu);
    size_t r = resident;
    pthread_mutex_unlock(&mu);
    return r;
}

extern "C" int dsv4_cuda_exl3_slices(const dsv4_weight *w)
{
    return bad_layer(w) ? 0 : slices(w->exl3->kp, w->exl3->np);
}

extern "C" size_t dsv4_cuda_exl3_ws_bytes(const dsv4_weight *w, int64_t r0, int64_t r1, int T)
{
    if (bad_layer(w) || r0 < 0 || r1 <= r0 || r1 > w->exl3->n || T <= 0)
        return 0;
    return ws_need(w->exl3, r0, r1, T);
}

extern "C" int dsv4_cuda_exl3_linear_ws(const dsv4_weight *w, int64_t r0, int64_t r1, const float *dx, int T,
                                        int64_t ldx, float *dy, int64_t ldy, void *ws, size_t ws_bytes, void *stream)
{
    const char *why = bad_layer(w);
    if (why)
        return record(DSV4_E_ARG, "exl3 linear %s: %s", w && w->name ? w->name : "?", why);
    const dsv4_exl3 *e = w->exl3;
    const char *name = e->prefix ? e->prefix : "?";
    if (r0 < 0 || r1 < r0 || r1 > e->n || T < 0 || ldx < e->k || ldy < r1 - r0)
        return record(DSV4_E_ARG, "exl3 linear %s: rows %lld..%lld of %lld, T %d, ldx %lld (k %lld), ldy %lld", name,
                      (long long)r0, (long long)r1, (long long)e->n, T, (long long)ldx, (long long)e->k, (long long)ldy);
    if (r0 == r1 || T == 0)
        return 0;
    size_t need = ws_need(e, r0, r1, T);
    if (!ws || ws_bytes < need)
        return record(DSV4_E_ARG, "exl3 linear %s: scratch of %zu bytes, %zu needed", name, ws_bytes, need);
    dev_layer L = {};
    int found = 0;
    pthread_mutex_lock(&mu);
    if (table) {
        auto it = table->find(e);
        if (it != table->end()) {
            L = it->second;
            found = 1;
        }
    }
    pthread_mutex_unlock(&mu);
    if (!found)
        return record(DSV4_E_ARG, "exl3 linear %s: the layer was not put on the device", name);

    cudaStream_t st = (cudaStream_t)stream;
    const float s128 = 1.0f / sqrtf(128.0f); /* the CPU's constant, the same way */
    const int64_t nblk = e->kp / 128, b0 = r0 / 128, nbr = (r1 + 127) / 128 - b0;
    const int S = slices(e->kp, e->np), tc = dsv4cu::tc_family("linear");
    const int TR = T < ROUND ? T : ROUND;
    float *xh = (float *)ws, *part = (float *)((char *)ws + align256((size_t)TR * (size_t)e->kp * 4));

    /* rounds of at most ROUND rows, each the three steps over its rows (rows never meet) */
    for (int t0 = 0; t0 < T; t0 += ROUND) {
        const int Tr = T - t0 < ROUND ? T - t0 : ROUND, TT = tc ? 0 : rows_per_pass(Tr);
        int64_t warps = (int64_t)Tr * nblk;
        exl3_in<<<(unsigned)((warps + 3) / 4), 128, 0, st>>>(dx + (int64_t)t0 * ldx, ldx, L.suh, xh, e->k, e->kp, Tr,
                                                             s128);
        const int per = tc ? (int)dsv4cu::X3_TN : TT;
        dim3 grid((unsigned)nbr, (unsigned)S, (unsigned)((Tr + per - 1) / per));
        pick(e->K, e->cb, TT)(grid, st, (const uint4 *)L.tr, xh, part, e->kp, e->np, Tr, b0, (int)nbr, (int)nblk, S);
        warps = (int64_t)Tr * nbr;
        exl3_out<<<(unsigned)((warps + 3) / 4), 128, 0, st>>>(part, S, Tr, (int)nbr, b0, L.svh, L.bias,
                                                              dy + (int64_t)t0 * ldy, ldy, r0, r1, s128);
    }
    cudaError_t ce = cudaGetLastError();
    if (ce != cudaSuccess)
        return record(DSV4_E_DEVICE, "exl3 linear %s: launch: %s", name, cudaGetErrorString(ce));
    return 0;
}

extern "C" int dsv4_cuda_exl3_linear(const dsv4_weight *w, int64_t r0, int64_t r1, const float *dx, int T, int64_t ldx,
                                     float *dy, int64_t ldy, void *stream)
{
    const char *why = bad_layer(w);
    if (why)
        return record(DSV4_E_ARG, "exl3 linear %s: %s", w && w->name ? w->name : "?", why);
    size_t need = dsv4_cuda_exl3_ws_bytes(w, r0, r1, T);
    if (!need) /* nothing to compute, or arguments the call below rejects by name */
        return dsv4_cuda_exl3_linear_ws(w, r0, r1, dx, T, ldx, dy, ldy, NULL, 0, stream);
    pthread_mutex_lock(&mu);
    if (scr_bytes < need) {
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        cudaStreamIsCapturing((cudaStream_t)stream, &cs);
        if (cs != cudaStreamCaptureStatusNone) {
            pthread_mutex_unlock(&mu);
            return record(DSV4_E_STATE, "exl3 linear %s: scratch must grow to %zu bytes while the stream is captured",
                          w->exl3->prefix ? w->exl3->prefix : "?", need);
        }
        if (scr)
            cudaFree(scr); /* waits for the device: queued calls are done with it */
        scr = NULL;
        scr_bytes = 0;
        size_t want = need + need / 4;
        cudaError_t ce = cudaMalloc(&scr, want);
        if (ce != cudaSuccess) {
            scr = NULL;
            pthread_mutex_unlock(&mu);
            return record(ce == cudaErrorMemoryAllocation ? DSV4_E_NOMEM : DSV4_E_DEVICE,
                          "exl3 linear %s: scratch of %zu bytes: %s", w->exl3->prefix ? w->exl3->prefix : "?", want,
                          cudaGetErrorString(ce));
        }
        scr_bytes = want;
    }
    void *ws = scr;
    size_t wsb = scr_bytes;
    pthread_mutex_unlock(&mu);
    return dsv4_cuda_exl3_linear_ws(w, r0, r1, dx, T, ldx, dy, ldy, ws, wsb, stream);
}

extern "C" int dsv4_cuda_exl3_check(dsv4_err *err)
{
    pthread_mutex_lock(&err_mu);
    int code = first_err.code;
    if (code && err)
        *err = first_err;
    memset(&first_err, 0, sizeof first_err);
    pthread_mutex_unlock(&err_mu);
    return code;
}
