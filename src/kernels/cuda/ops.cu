/* CUDA backend: the dsv4_backend ops on the GPU, fp32 activations and fp32 accumulation.
 *
 * Batch invariance: every kernel gives each output row one fixed reduction order that
 * depends only on the op's shape (k, dim, n...), never on T or on the row's place in the
 * batch: a row is owned by one warp or one block, lanes take fixed strides, and partial
 * sums meet in a fixed shuffle tree. A batch of rows therefore equals the rows one at a time,
 * bit for bit. The order differs from the CPU's, so GPU and CPU agree to rounding only.
 *
 * What stays on the host: the op table takes host buffers, so each op copies its inputs in
 * and its outputs back (synchronously, default stream); the forward's stateful attention
 * (rings, compressor windows, indexer scores and top-k), the embedding lookup and routing
 * run on the host as on the CPU backend. */
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
extern "C" { /* the C headers carry no linkage of their own */
#include "core/core.h"
#include "io/weight.h"
#include "kernels/backend.h"
}
#include "kernels/cuda/cuda.h"

/* ---- state: device, first error, poison flag ---------------------------------------- */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_ready;
static char g_name[320];
static dsv4_err g_err;          /* first failure of an op since the last check */
static int g_poison;

static int cuda_failed(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return 0;
    if (!g_err.code)
        dsv4_fail(&g_err, DSV4_E_DEVICE, "cuda: %s: %s", what, cudaGetErrorString(e));
    return 1;
}
#define CK(call) cuda_failed((call), #call)

extern "C" int dsv4_cuda_init(dsv4_err *err)
{
    pthread_mutex_lock(&g_lock);
    int rc = 0;
    if (!g_ready) {
        int n = 0;
        cudaError_t e = cudaGetDeviceCount(&n);
        if (e != cudaSuccess || n == 0)
            rc = dsv4_fail(err, DSV4_E_DEVICE, "device 'cuda': no usable GPU on this machine (%s)",
                           e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device found");
        else {
            cudaDeviceProp p;
            if ((e = cudaSetDevice(0)) != cudaSuccess || (e = cudaGetDeviceProperties(&p, 0)) != cudaSuccess)
                rc = dsv4_fail(err, DSV4_E_DEVICE, "device 'cuda': %s", cudaGetErrorString(e));
            else if (p.major < 9)
                rc = dsv4_fail(err, DSV4_E_DEVICE, "device 'cuda': %s is sm_%d%d; this build targets sm_90 (Hopper)",
                               p.name, p.major, p.minor);
            else {
                snprintf(g_name, sizeof g_name, "%s, %.1f GiB, sm_%d%d", p.name, p.totalGlobalMem / 1073741824.0,
                         p.major, p.minor);
                const char *ps = getenv("DSV4_CUDA_POISON");
                g_poison = ps && *ps == '1';
                g_ready = 1;
            }
        }
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

extern "C" const char *dsv4_cuda_device_name(void) { return g_name; }
extern "C" void dsv4_cuda_set_poison(int on) { g_poison = on; }

static int cuda_check(dsv4_err *err)
{
    pthread_mutex_lock(&g_lock);
    int rc = g_err.code;
    if (rc) {
        if (err)
            *err = g_err;
        dsv4_err_clear(&g_err);
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/* ---- resident copies, found by host address (open addressing, tombstones) ---------- */

typedef struct {
    const void *host;           /* NULL: empty; TOMB: deleted */
    void *dev;                  /* what kernels read: device memory, or the device view of pinned host memory */
    void *pinned;               /* the pinned host copy (NULL when dev is device memory) */
    size_t bytes;
} resident;

static resident *g_tab;
static size_t g_cap, g_used, g_live, g_res_bytes, g_pin_bytes;
static const void *const TOMB = (const void *)&g_tab;

static size_t slot_of(const void *p, size_t cap)
{
    uint64_t h = (uint64_t)(uintptr_t)p;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return (size_t)(h & (cap - 1));
}

static resident *find(const void *host)
{
    if (!g_cap || !host)
        return NULL;
    for (size_t i = slot_of(host, g_cap);; i = (i + 1) & (g_cap - 1)) {
        if (g_tab[i].host == host)
            return &g_tab[i];
        if (!g_tab[i].host)
            return NULL;
    }
}

static int grow(dsv4_err *err)
{
    size_t ncap = g_cap ? g_cap * 2 : 1024;
    if (g_live * 2 < g_cap)
        ncap = g_cap; /* only tombstones to sweep */
    resident *nt = (resident *)calloc(ncap, sizeof *nt);
    if (!nt)
        return dsv4_fail(err, DSV4_E_NOMEM, "cuda: out of host memory for the resident table");
    for (size_t i = 0; i < g_cap; i++)
        if (g_tab[i].host && g_tab[i].host != TOMB) {
            size_t j = slot_of(g_tab[i].host, ncap);
            while (nt[j].host)
                j = (j + 1) & (ncap - 1);
            nt[j] = g_tab[i];
        }
    free(g_tab);
    g_tab = nt;
    g_cap = ncap;
    g_used = g_live;
    return 0;
}

/* A copy of `bytes` bytes at `host`, in device memory, or (pinned) in page-locked host memory
 * mapped into the device's address space, which kernels read over the bus. */
static int put_copy(const void *host, size_t bytes, int pinned, dsv4_err *err)
{
    if (!host || !bytes)
        return 0;
    pthread_mutex_lock(&g_lock);
    int rc = 0;
    if (find(host))
        goto out;
    if ((g_used + 1) * 4 > g_cap * 3 && (rc = grow(err)))
        goto out;
    {
        void *d = NULL, *h = NULL;
        cudaError_t e;
        if (pinned) {
            e = cudaHostAlloc(&h, bytes, cudaHostAllocMapped);
            if (e == cudaSuccess) {
                memcpy(h, host, bytes);
                e = cudaHostGetDevicePointer(&d, h, 0);
            }
        } else {
            e = cudaMalloc(&d, bytes);
            if (e == cudaSuccess)
                e = cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice);
        }
        if (e != cudaSuccess) {
            if (pinned)
                cudaFreeHost(h);
            else
                cudaFree(d);
            rc = dsv4_fail(err, DSV4_E_DEVICE, "cuda: %s %zu bytes: %s (%.2f GiB on the device, %.2f GiB pinned already)",
                           pinned ? "pinning" : "uploading", bytes, cudaGetErrorString(e), g_res_bytes / 1073741824.0,
                           g_pin_bytes / 1073741824.0);
            goto out;
        }
        size_t i = slot_of(host, g_cap);
        while (g_tab[i].host && g_tab[i].host != TOMB)
            i = (i + 1) & (g_cap - 1);
        if (!g_tab[i].host)
            g_used++;
        g_tab[i] = (resident){host, d, h, bytes};
        g_live++;
        *(pinned ? &g_pin_bytes : &g_res_bytes) += bytes;
    }
out:
    pthread_mutex_unlock(&g_lock);
    return rc;
}

extern "C" int dsv4_cuda_put(const void *host, size_t bytes, dsv4_err *err) { return put_copy(host, bytes, 0, err); }

extern "C" void dsv4_cuda_drop(const void *host)
{
    pthread_mutex_lock(&g_lock);
    resident *r = find(host);
    if (r) {
        if (r->pinned) {
            cudaFreeHost(r->pinned);
            g_pin_bytes -= r->bytes;
        } else {
            cudaFree(r->dev);
            g_res_bytes -= r->bytes;
        }
        r->host = TOMB;
        r->dev = r->pinned = NULL;
        g_live--;
    }
    pthread_mutex_unlock(&g_lock);
}

__host__ __device__ static inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Bytes of the data and of the scales of a weight as stored. */
static size_t data_bytes(const dsv4_weight *w)
{
    switch (w->form) {
    case DSV4_WF_F32: return (size_t)w->n * w->k * 4;
    case DSV4_WF_BF16:
    case DSV4_WF_F16: return (size_t)w->n * w->k * 2;
    case DSV4_WF_FP8: return (size_t)w->n * w->k;
    case DSV4_WF_FP4: return (size_t)w->n * w->k / 2;
    default: return 0;
    }
}

static size_t scale_bytes(const dsv4_weight *w)
{
    size_t es = w->scale_e8m0 ? 1 : 4;
    if (w->form == DSV4_WF_FP8)
        return (size_t)cdiv(w->n, w->bn) * cdiv(w->k, w->bk) * es;
    if (w->form == DSV4_WF_FP4)
        return (size_t)w->n * (w->k / w->bk) * es;
    return 0;
}

static int put_weight(const dsv4_weight *w, int pinned, dsv4_err *err)
{
    if (w->form >= DSV4_WF_EXL3)
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "cuda: weight %s: form %s has no CUDA kernel", w->name ? w->name : "?",
                         dsv4_wform_name(w->form));
    int rc = put_copy(w->data, data_bytes(w), pinned, err);
    if (!rc && w->scale)
        rc = put_copy(w->scale, scale_bytes(w), pinned, err);
    if (rc && err)
        dsv4_err_prefix(err, "weight %s (%s [%lld, %lld])", w->name ? w->name : "?", dsv4_wform_name(w->form),
                        (long long)w->n, (long long)w->k);
    return rc;
}

extern "C" int dsv4_cuda_put_weight(const dsv4_weight *w, dsv4_err *err) { return put_weight(w, 0, err); }
extern "C" int dsv4_cuda_pin_weight(const dsv4_weight *w, dsv4_err *err) { return put_weight(w, 1, err); }

extern "C" size_t dsv4_cuda_weight_bytes(const dsv4_weight *w) { return data_bytes(w) + (w->scale ? scale_bytes(w) : 0); }

extern "C" int dsv4_cuda_mem(size_t *free_b, size_t *total_b, dsv4_err *err)
{
    cudaError_t e = cudaMemGetInfo(free_b, total_b);
    if (e != cudaSuccess)
        return dsv4_fail(err, DSV4_E_DEVICE, "cuda: cudaMemGetInfo: %s", cudaGetErrorString(e));
    return 0;
}

extern "C" void dsv4_cuda_usage(size_t *device_b, size_t *pinned_b)
{
    pthread_mutex_lock(&g_lock);
    *device_b = g_res_bytes;
    *pinned_b = g_pin_bytes;
    pthread_mutex_unlock(&g_lock);
}

extern "C" void dsv4_cuda_drop_weight(const dsv4_weight *w)
{
    dsv4_cuda_drop(w->data);
    if (w->scale)
        dsv4_cuda_drop(w->scale);
}

/* ---- per-op scratch: one device arena, reset at each op ----------------------------- */

static char *g_arena;
static size_t g_arena_cap, g_arena_off;
static char *g_spill[64];       /* chunks taken when an op outgrew the arena; freed at reset */
static int g_nspill;
static size_t g_want;           /* largest total an op asked for */

static void scratch_reset(void)
{
    for (int i = 0; i < g_nspill; i++)
        cudaFree(g_spill[i]);
    g_nspill = 0;
    if (g_want > g_arena_cap) {
        cudaFree(g_arena);
        g_arena = NULL;
        g_arena_cap = 0;
        if (cudaMalloc((void **)&g_arena, g_want) == cudaSuccess)
            g_arena_cap = g_want;
    }
    g_arena_off = 0;
    g_want = 0;
}

/* A device buffer of `bytes` for this op (256-byte aligned), NULL after recording an error. */
static void *scratch(size_t bytes)
{
    bytes = bytes ? (bytes + 255) & ~(size_t)255 : 256; /* never NULL for an empty buffer */
    g_want += bytes;
    if (g_arena_off + bytes <= g_arena_cap) {
        void *p = g_arena + g_arena_off;
        g_arena_off += bytes;
        return p;
    }
    char *p = NULL;
    if (g_nspill == 64 || CK(cudaMalloc((void **)&p, bytes)))
        return NULL;
    g_spill[g_nspill++] = p;
    return p;
}

/* The device copy of a constant host array: resident if put, else copied into scratch. */
static const void *dev_const(const void *host, size_t bytes)
{
    if (!host)
        return NULL;
    resident *r = find(host);
    if (r)
        return r->dev;
    void *d = scratch(bytes);
    if (d && CK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice)))
        return NULL;
    return d;
}

/* Rows [T, w] of a host matrix with row stride ld, packed densely on the device. */
static float *dev_in(const float *host, int64_t rows, int64_t w, int64_t ld)
{
    float *d = (float *)scratch((size_t)rows * w * sizeof(float));
    if (d && rows && CK(cudaMemcpy2D(d, w * sizeof(float), host, ld * sizeof(float), w * sizeof(float), rows,
                                     cudaMemcpyHostToDevice)))
        return NULL;
    return d;
}

/* An output buffer, poisoned (NaN bytes) when poisoning is on. */
static float *dev_out(size_t n)
{
    float *d = (float *)scratch(n * sizeof(float));
    if (d && g_poison && CK(cudaMemset(d, 0xff, n * sizeof(float))))
        return NULL;
    return d;
}

static void dev_back(float *host, int64_t ld, const float *d, int64_t rows, int64_t w)
{
    if (rows)
        CK(cudaMemcpy2D(host, ld * sizeof(float), d, w * sizeof(float), w * sizeof(float), rows, cudaMemcpyDeviceToHost));
}

static int launched(const char *what)
{
    return !cuda_failed(cudaGetLastError(), what);
}

/* ---- shared device helpers ----------------------------------------------------------- */

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sum over a block of NW warps in a fixed order (each warp's tree, then warp 0 adds the
 * warps' partials in index order); every thread gets the result. sh: [NW + 1] floats. */
template <int NW>
__device__ __forceinline__ float block_sum(float v, float *sh)
{
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0)
        sh[wid] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = sh[0];
        for (int i = 1; i < NW; i++)
            s += sh[i];
        sh[NW] = s;
    }
    __syncthreads();
    return sh[NW];
}

/* e8m0 byte -> 2^(b - 127) exactly (b = 0 is the subnormal 2^-127); 255 is NaN. */
__device__ __forceinline__ float e8m0(unsigned b)
{
    return b == 255 ? __int_as_float(0x7fc00000) : b ? __int_as_float((int)(b << 23)) : __int_as_float(0x00400000);
}

__device__ __forceinline__ float scale_at(const void *s, int is_e8m0, int64_t i)
{
    return is_e8m0 ? e8m0(((const uint8_t *)s)[i]) : ((const float *)s)[i];
}

__constant__ float c_e2m1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                 -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* ---- linear -------------------------------------------------------------------------- */

enum { LIN_WARPS = 8, LIN_TT = 8, LIN_MIN_WARPS = 3200 };

struct wdev {
    const uint8_t *q;           /* data as stored */
    const void *s;              /* scales (FP8/FP4) */
    int form, e8m0, bn, bk;
    int64_t k;
    int64_t sk;                 /* scale blocks along a row: FP8 ceil(k / bk), FP4 k / bk */
    int cpb, cshift;            /* 8-element chunks per scale block, its log2 (-1: not a power of two) */
    int wpr;                    /* warps per output row (chunk path) */
};

/* The chunk path reads rows in chunks of 8 elements: 32 bytes (F32), 16 (BF16/F16), 8 (FP8),
 * 4 (FP4). A warp owns R neighbouring rows and lane l of its w-th warp takes chunks
 * (w * 32 + l) + j * 32 * wpr of each, so a load instruction is one contiguous span of a row,
 * and the 8 x values a chunk needs are loaded once for the R rows (x comes from L1, and at one
 * weight byte per element re-reading it per row would cost more L1 traffic than the weights'
 * own). U chunks of each row are loaded before the first is used (about 2 KB a warp). */
template <int F> struct ck;
template <> struct ck<DSV4_WF_F32> {
    struct T { uint4 a, b; };
    enum { R = 2, U = 1 };
    static __device__ __forceinline__ T ld(const T *p) { return T{__ldg(&p->a), __ldg(&p->b)}; }
};
template <> struct ck<DSV4_WF_BF16> {
    typedef uint4 T;
    enum { R = 2, U = 2 };
    static __device__ __forceinline__ T ld(const T *p) { return __ldg(p); }
};
template <> struct ck<DSV4_WF_F16> {
    typedef uint4 T;
    enum { R = 2, U = 2 };
    static __device__ __forceinline__ T ld(const T *p) { return __ldg(p); }
};
template <> struct ck<DSV4_WF_FP8> {
    typedef uint2 T;
    enum { R = 4, U = 2 };
    static __device__ __forceinline__ T ld(const T *p) { return __ldg(p); }
};
template <> struct ck<DSV4_WF_FP4> {
    typedef unsigned int T;
    enum { R = 4, U = 4 };
    static __device__ __forceinline__ T ld(const T *p) { return __ldg(p); }
};

__device__ __forceinline__ void bf16x2(uint32_t u, float *v)
{
    v[0] = __uint_as_float(u << 16);
    v[1] = __uint_as_float(u & 0xffff0000u);
}

__device__ __forceinline__ void f16x2(uint32_t u, float *v)
{
    __half2_raw h;
    h.x = (unsigned short)(u & 0xffff);
    h.y = (unsigned short)(u >> 16);
    float2 f = __half22float2(__half2(h));
    v[0] = f.x;
    v[1] = f.y;
}

/* Four e4m3 bytes to fp32, exactly (e4m3 -> f16 is exact and keeps NaN, then f16 -> f32). */
__device__ __forceinline__ void e4m3x4(uint32_t u, float *v)
{
#pragma unroll
    for (int j = 0; j < 2; j++) {
        __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u >> (16 * j)), __NV_E4M3);
        float2 f = __half22float2(__half2(h));
        v[2 * j] = f.x;
        v[2 * j + 1] = f.y;
    }
}

/* Eight e2m1 nibbles (element i in bits 4i..4i+3) to fp32, exactly, without a table: nibbles q
 * and q + 4 (16 bits apart) become the two halves of an f16x2 with the magnitude bits in the
 * exponent's low bits and the top mantissa bit, which is the value times 2^-14 (e = 0 lands on
 * the f16 subnormals, 0 and 0.5 * 2^-14); one f16 multiply by 2^14, exact, restores it. */
__device__ __forceinline__ void e2m1x8(uint32_t u, float *v)
{
    const __half2 k14 = __float2half2_rn(16384.0f);
#pragma unroll
    for (int q = 0; q < 4; q++) {
        uint32_t m = (q < 3 ? u << (9 - 4 * q) : u >> 3) & 0x0e000e00u;
        uint32_t sg = (u << (12 - 4 * q)) & 0x80008000u;
        __half2_raw h;
        h.x = (unsigned short)((m | sg) & 0xffff);
        h.y = (unsigned short)((m | sg) >> 16);
        float2 f = __half22float2(__hmul2(__half2(h), k14));
        v[q] = f.x;
        v[q + 4] = f.y;
    }
}

template <int F>
__device__ __forceinline__ void decode8(const typename ck<F>::T &c, float *v)
{
    if constexpr (F == DSV4_WF_F32) {
        uint32_t u[8] = {c.a.x, c.a.y, c.a.z, c.a.w, c.b.x, c.b.y, c.b.z, c.b.w};
#pragma unroll
        for (int i = 0; i < 8; i++)
            v[i] = __uint_as_float(u[i]);
    } else if constexpr (F == DSV4_WF_BF16 || F == DSV4_WF_F16) {
        uint32_t u[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (F == DSV4_WF_BF16)
                bf16x2(u[i], v + 2 * i);
            else
                f16x2(u[i], v + 2 * i);
        }
    } else if constexpr (F == DSV4_WF_FP8) {
        e4m3x4(c.x, v);
        e4m3x4(c.y, v + 4);
    } else {
        e2m1x8(c, v);
    }
}

/* One element (the path for shapes the 8-element chunks do not tile), times its scale. */
__device__ __forceinline__ float decode1(const wdev &w, int64_t r, int64_t i, const float *lut4)
{
    switch (w.form) {
    case DSV4_WF_F32: return ((const float *)w.q)[r * w.k + i];
    case DSV4_WF_BF16: return __uint_as_float((uint32_t)((const uint16_t *)w.q)[r * w.k + i] << 16);
    case DSV4_WF_F16: {
        __half_raw h;
        h.x = ((const uint16_t *)w.q)[r * w.k + i];
        return __half2float(__half(h));
    }
    case DSV4_WF_FP8: {
        float s = scale_at(w.s, w.e8m0, (r / w.bn) * w.sk + i / w.bk);
        __half_raw h = __nv_cvt_fp8_to_halfraw(w.q[r * w.k + i], __NV_E4M3);
        return __half2float(__half(h)) * s;
    }
    default: {
        float s = scale_at(w.s, w.e8m0, r * w.sk + i / w.bk);
        uint8_t b = w.q[r * (w.k / 2) + i / 2];
        return lut4[(i & 1) ? b >> 4 : b & 15] * s;
    }
    }
}

/* One launch's work: n jobs, each rows [r0, r0 + nr) of its weight times its x, bpj blocks a
 * job. A single linear is one job; a group (experts of one form and shape) is several. */
struct lin_jobs {
    wdev w[DSV4_CUDA_GROUP_MAX];
    int64_t r0[DSV4_CUDA_GROUP_MAX];
    const float *x[DSV4_CUDA_GROUP_MAX];
    float *y[DSV4_CUDA_GROUP_MAX];
    int n, nr, bpj;
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
template <int F, bool VEC, int TT>
__device__ __forceinline__ void linear_rows(const wdev &w, int64_t r0, int nr, const float *__restrict__ x, int T,
                                            float *__restrict__ y, int blk)
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
                        s[rr] = scaled ? scale_at(w.s, w.e8m0, sbase[rr] + blk) : 1.0f;
                    }
#pragma unroll
                    for (int tt = 0; tt < TT; tt++) {
                        if (t0 + tt >= T)
                            break;
                        const float4 *xp = (const float4 *)(x + (int64_t)(t0 + tt) * k + c * 8);
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
                    acc[0][tt] = fmaf(v, x[(int64_t)(t0 + tt) * k + kk], acc[0][tt]);
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
                y[(int64_t)(t0 + tt) * nr + i0 + rr] = sum;
            }
        }
        __syncthreads();
    }
}

/* A single linear: the weight's parameters at fixed offsets. */
template <int F, bool VEC, int TT>
__global__ void __launch_bounds__(LIN_WARPS * 32) k_linear(wdev w, int64_t r0, int nr, const float *__restrict__ x, int T,
                                                          float *__restrict__ y)
{
    linear_rows<F, VEC, TT>(w, r0, nr, x, T, y, blockIdx.x);
}

/* A group: job blockIdx.x / bpj. Kept apart from k_linear because a run-time job index into the
 * parameters cost the single launches registers and time (measured: FP4 expert 6.6 -> 10.3 us).
 * The T = 1 build is held to 64 registers (4 blocks a multiprocessor). */
template <int F, bool VEC, int TT>
__global__ void __launch_bounds__(LIN_WARPS * 32, VEC && TT == 1 ? 4 : 1) k_linear_group(lin_jobs J, int T)
{
    int j = blockIdx.x / J.bpj;
    linear_rows<F, VEC, TT>(J.w[j], J.r0[j], J.nr, J.x[j], T, J.y[j], blockIdx.x % J.bpj);
}

/* Whether the 8-element chunk path tiles this weight's rows (and its scale blocks). */
static bool vec_ok(const dsv4_weight *w)
{
    bool scaled = w->form == DSV4_WF_FP8 || w->form == DSV4_WF_FP4;
    return w->form < DSV4_WF_EXL3 && w->k % 8 == 0 && (!scaled || w->bk % 8 == 0);
}

static int rows_per_warp(int form)
{
    switch (form) {
    case DSV4_WF_F32: return ck<DSV4_WF_F32>::R;
    case DSV4_WF_BF16: return ck<DSV4_WF_BF16>::R;
    case DSV4_WF_F16: return ck<DSV4_WF_F16>::R;
    case DSV4_WF_FP8: return ck<DSV4_WF_FP8>::R;
    default: return ck<DSV4_WF_FP4>::R;
    }
}

static int chunks_in_flight(int form)
{
    switch (form) {
    case DSV4_WF_F32: return ck<DSV4_WF_F32>::U;
    case DSV4_WF_BF16: return ck<DSV4_WF_BF16>::U;
    case DSV4_WF_F16: return ck<DSV4_WF_F16>::U;
    case DSV4_WF_FP8: return ck<DSV4_WF_FP8>::U;
    default: return ck<DSV4_WF_FP4>::U;
    }
}

template <int F>
static void launch_form(lin_jobs &J, bool vec, int T, cudaStream_t st)
{
    int rpb = vec ? LIN_WARPS / J.w[0].wpr * (int)ck<F>::R : LIN_WARPS;
    J.bpj = (int)cdiv(J.nr, rpb);
    dim3 grid((unsigned)(J.bpj * J.n));
    if (J.n > 1) {
        if (vec && T == 1)
            k_linear_group<F, true, 1><<<grid, LIN_WARPS * 32, 0, st>>>(J, T);
        else if (vec)
            k_linear_group<F, true, LIN_TT><<<grid, LIN_WARPS * 32, 0, st>>>(J, T);
        else
            k_linear_group<F, false, LIN_TT><<<grid, LIN_WARPS * 32, 0, st>>>(J, T);
    } else if (vec && T == 1)
        k_linear<F, true, 1><<<grid, LIN_WARPS * 32, 0, st>>>(J.w[0], J.r0[0], J.nr, J.x[0], T, J.y[0]);
    else if (vec)
        k_linear<F, true, LIN_TT><<<grid, LIN_WARPS * 32, 0, st>>>(J.w[0], J.r0[0], J.nr, J.x[0], T, J.y[0]);
    else
        k_linear<F, false, LIN_TT><<<grid, LIN_WARPS * 32, 0, st>>>(J.w[0], J.r0[0], J.nr, J.x[0], T, J.y[0]);
}

/* Launches J's jobs, whose weights all have w's form and shape. */
static void launch_linear(const dsv4_weight *w, lin_jobs &J, int T, cudaStream_t st)
{
    bool vec = vec_ok(w);
    switch (w->form) {
    case DSV4_WF_F32: launch_form<DSV4_WF_F32>(J, vec, T, st); break;
    case DSV4_WF_BF16: launch_form<DSV4_WF_BF16>(J, vec, T, st); break;
    case DSV4_WF_F16: launch_form<DSV4_WF_F16>(J, vec, T, st); break;
    case DSV4_WF_FP8: launch_form<DSV4_WF_FP8>(J, vec, T, st); break;
    default: launch_form<DSV4_WF_FP4>(J, vec, T, st); break;
    }
}

/* One job: rows [r0, r0 + nr) of a weight. */
static lin_jobs one_job(const wdev &wd, int64_t r0, int nr, const float *dx, float *dy)
{
    lin_jobs J;
    memset(&J, 0, sizeof J);
    J.w[0] = wd;
    J.r0[0] = r0;
    J.x[0] = dx;
    J.y[0] = dy;
    J.n = 1;
    J.nr = nr;
    return J;
}

/* Warps per row group: doubled (up to LIN_WARPS) while the weight has too few row groups to
 * give the device LIN_MIN_WARPS warps and each lane would still get its U chunks (splitting
 * further only adds blocks, and a second wave). From the weight's form and shape alone, so
 * every call over that weight sums a row the same way. */
static wdev wdev_of(const dsv4_weight *w, const void *q, const void *s)
{
    wdev d;
    d.q = (const uint8_t *)q;
    d.s = s;
    d.form = w->form;
    d.e8m0 = w->scale_e8m0;
    d.bn = w->bn > 0 ? w->bn : 1;
    d.bk = w->bk > 0 ? w->bk : 1;
    d.k = w->k;
    d.sk = w->form == DSV4_WF_FP8 ? cdiv(w->k, d.bk) : w->k / d.bk;
    d.cpb = d.bk / 8 > 0 ? d.bk / 8 : 1;
    d.cshift = (d.cpb & (d.cpb - 1)) ? -1 : __builtin_ctz((unsigned)d.cpb);
    int64_t nch = w->k / 8, groups = cdiv(w->n, rows_per_warp(w->form));
    d.wpr = 1;
    while (d.wpr < LIN_WARPS && groups * d.wpr < LIN_MIN_WARPS && nch >= (int64_t)32 * chunks_in_flight(w->form) * d.wpr * 2)
        d.wpr *= 2;
    return d;
}

/* Host rows [rows, w] with stride ld set to NaN: what an op leaves when it failed. */
static void nan_fill(float *host, int64_t rows, int64_t w, int64_t ld)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < w; i++)
            host[r * ld + i] = NAN;
}

static void cu_linear(const dsv4_weight *w, int64_t r0, int64_t r1, const float *x, int T, int64_t ldx, float *y,
                      int64_t ldy)
{
    int64_t nr = r1 - r0;
    if (T <= 0 || nr <= 0)
        return;
    pthread_mutex_lock(&g_lock);
    scratch_reset();
    int ok = w->form < DSV4_WF_EXL3;
    if (!ok && !g_err.code)
        dsv4_fail(&g_err, DSV4_E_UNSUPPORTED, "cuda: weight %s: form %s has no CUDA kernel", w->name ? w->name : "?",
                  dsv4_wform_name(w->form));
    const void *q = ok ? dev_const(w->data, data_bytes(w)) : NULL;
    const void *s = ok && w->scale ? dev_const(w->scale, scale_bytes(w)) : NULL;
    float *dx = ok ? dev_in(x, T, w->k, ldx) : NULL, *dy = ok ? dev_out((size_t)T * nr) : NULL;
    if (q && (s || !w->scale) && dx && dy) {
        lin_jobs J = one_job(wdev_of(w, q, s), r0, (int)nr, dx, dy);
        launch_linear(w, J, T, 0);
        if (launched("linear"))
            dev_back(y, ldy, dy, T, nr);
        else
            nan_fill(y, T, nr, ldy);
    } else
        nan_fill(y, T, nr, ldy);
    pthread_mutex_unlock(&g_lock);
}

extern "C" int dsv4_cuda_linear_dev(const dsv4_weight *w, int64_t r0, int64_t r1, const float *dx, int T, float *dy,
                                    void *stream, dsv4_err *err)
{
    pthread_mutex_lock(&g_lock);
    resident *rq = find(w->data), *rs = w->scale ? find(w->scale) : NULL;
    pthread_mutex_unlock(&g_lock);
    if (w->form >= DSV4_WF_EXL3 || !rq || (w->scale && !rs))
        return dsv4_fail(err, DSV4_E_ARG, "cuda: weight %s is not resident on the device (dsv4_cuda_put_weight first)",
                         w->name ? w->name : "?");
    lin_jobs J = one_job(wdev_of(w, rq->dev, rs ? rs->dev : NULL), r0, (int)(r1 - r0), dx, dy);
    launch_linear(w, J, T, (cudaStream_t)stream);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return dsv4_fail(err, DSV4_E_DEVICE, "cuda: linear launch: %s", cudaGetErrorString(e));
    return 0;
}

extern "C" int dsv4_cuda_linear_group_dev(const dsv4_weight *const *w, int n, const float *const *dx, int T,
                                          float *const *dy, void *stream, dsv4_err *err)
{
    if (n < 1 || n > DSV4_CUDA_GROUP_MAX)
        return dsv4_fail(err, DSV4_E_ARG, "cuda: a linear group holds 1 to %d weights, not %d", DSV4_CUDA_GROUP_MAX, n);
    lin_jobs J;
    memset(&J, 0, sizeof J);
    J.n = n;
    J.nr = (int)w[0]->n;
    for (int j = 0; j < n; j++) {
        const dsv4_weight *a = w[j], *b = w[0];
        if (a->form != b->form || a->n != b->n || a->k != b->k || a->bn != b->bn || a->bk != b->bk ||
            a->scale_e8m0 != b->scale_e8m0 || (a->scale == NULL) != (b->scale == NULL))
            return dsv4_fail(err, DSV4_E_ARG, "cuda: linear group: weight %s differs from %s in form, shape or blocks",
                             a->name ? a->name : "?", b->name ? b->name : "?");
        pthread_mutex_lock(&g_lock);
        resident *rq = find(a->data), *rs = a->scale ? find(a->scale) : NULL;
        pthread_mutex_unlock(&g_lock);
        if (a->form >= DSV4_WF_EXL3 || !rq || (a->scale && !rs))
            return dsv4_fail(err, DSV4_E_ARG, "cuda: weight %s is not resident on the device (dsv4_cuda_put_weight first)",
                             a->name ? a->name : "?");
        J.w[j] = wdev_of(a, rq->dev, rs ? rs->dev : NULL);
        J.x[j] = dx[j];
        J.y[j] = dy[j];
    }
    launch_linear(w[0], J, T, (cudaStream_t)stream);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return dsv4_fail(err, DSV4_E_DEVICE, "cuda: linear group launch: %s", cudaGetErrorString(e));
    return 0;
}

/* ---- rmsnorm: one block per row -------------------------------------------------------- */

enum { NB = 256, NW = NB / 32 };

__global__ void __launch_bounds__(NB) k_rmsnorm(const float *x, int dim, const float *w, float eps, float *y)
{
    __shared__ float sh[NW + 1];
    const float *xr = x + (int64_t)blockIdx.x * dim;
    float *yr = y + (int64_t)blockIdx.x * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += NB)
        ss = fmaf(xr[i], xr[i], ss);
    ss = block_sum<NW>(ss, sh);
    float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += NB)
        yr[i] = w ? xr[i] * inv * w[i] : xr[i] * inv;
}

static void cu_rmsnorm(const float *x, int64_t rows, int dim, const float *w, float eps, float *y)
{
    if (rows <= 0 || dim <= 0)
        return;
    pthread_mutex_lock(&g_lock);
    scratch_reset();
    const float *dw = (const float *)dev_const(w, (size_t)dim * sizeof(float));
    float *dx = dev_in(x, rows, dim, dim), *dy = dev_out((size_t)rows * dim);
    if (dx && dy && (dw || !w)) {
        k_rmsnorm<<<(unsigned)rows, NB>>>(dx, dim, dw, eps, dy);
        if (launched("rmsnorm"))
            dev_back(y, dim, dy, rows, dim);
        else
            nan_fill(y, rows, dim, dim);
    } else
        nan_fill(y, rows, dim, dim);
    pthread_mutex_unlock(&g_lock);
}

/* ---- rope: one thread per (row, head, channel pair) ------------------------------------- */

__global__ void k_rope(float *x, int T, int64_t width, int heads, int d, int rd, const float *inv_freq,
                       const int64_t *pos, int inverse)
{
    int half = rd / 2;
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)T * heads * half)
        return;
    int i = (int)(idx % half), h = (int)(idx / half % heads);
    int64_t t = idx / ((int64_t)half * heads);
    float ang = (float)pos[t] * inv_freq[i];
    float c = cosf(ang), s = inverse ? -sinf(ang) : sinf(ang);
    float *v = x + t * width + (int64_t)h * d + (d - rd);
    float a = v[2 * i], b = v[2 * i + 1];
    v[2 * i] = a * c - b * s;
    v[2 * i + 1] = a * s + b * c;
}

static void cu_rope(float *x, int T, int64_t stride, int heads, int d, int rd, const float *inv_freq, const int64_t *pos,
                    int inverse)
{
    int64_t width = (int64_t)heads * d, n = (int64_t)T * heads * (rd / 2);
    if (n <= 0)
        return;
    pthread_mutex_lock(&g_lock);
    scratch_reset();
    const float *df = (const float *)dev_const(inv_freq, (size_t)(rd / 2) * sizeof(float));
    const int64_t *dp = (const int64_t *)dev_const(pos, (size_t)T * sizeof(int64_t));
    float *dx = dev_in(x, T, width, stride);
    if (df && dp && dx) {
        k_rope<<<(unsigned)cdiv(n, 256), 256>>>(dx, T, width, heads, d, rd, df, dp, inverse);
        if (launched("rope"))
            dev_back(x, stride, dx, T, width);
        else
            nan_fill(x, T, width, stride);
    } else
        nan_fill(x, T, width, stride);
    pthread_mutex_unlock(&g_lock);
}

/* ---- hyper-connections ------------------------------------------------------------------ */

__device__ __forceinline__ float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }

enum { HC_MAXN = 16, HC_MAXM = (2 + HC_MAXN) * HC_MAXN };

/* One block per row t: the norm of X_t, the nm mixes (warp j % NW owns mix j), then thread 0
 * runs the whole Sinkhorn projection in shared memory (fused: one launch for all iterations),
 * then the collapse h = sum_i pre_i X_i. X [T, n*D]; outputs pre/post [T, n], comb [T, n, n],
 * h [T, D]; post == NULL: the head collapse (nm = n mixes, no Sinkhorn). */
__global__ void __launch_bounds__(NB) k_hc_pre(const float *X, int n, int D, const float *fn, const float *base,
                                               const float *scale, int iters, float hc_eps, float norm_eps, float *pre,
                                               float *post, float *comb, float *h)
{
    __shared__ float sh[NW + 1], m[HC_MAXM], c[HC_MAXN * HC_MAXN], pr[HC_MAXN];
    int t = blockIdx.x, lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    int nm = post ? (2 + n) * n : n;
    int64_t nd = (int64_t)n * D;
    const float *x = X + t * nd;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < nd; i += NB)
        ss = fmaf(x[i], x[i], ss);
    ss = block_sum<NW>(ss, sh);
    float inv = 1.0f / sqrtf(ss / (float)nd + norm_eps);
    for (int j = wid; j < nm; j += NW) {
        const float *f = fn + j * nd;
        float a = 0.0f;
        for (int64_t i = lane; i < nd; i += 32)
            a = fmaf(f[i], x[i], a);
        a = warp_sum(a);
        if (lane == 0)
            m[j] = a * inv;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 0; i < n; i++)
            pre[t * n + i] = pr[i] = sigm(m[i] * scale[0] + base[i]) + hc_eps;
        if (post) {
            for (int i = 0; i < n; i++)
                post[t * n + i] = 2.0f * sigm(m[n + i] * scale[1] + base[n + i]);
            for (int j = 0; j < n; j++) {
                float mx = -INFINITY, s = 0.0f;
                for (int k = 0; k < n; k++) {
                    c[j * n + k] = m[2 * n + j * n + k] * scale[2] + base[2 * n + j * n + k];
                    mx = fmaxf(mx, c[j * n + k]);
                }
                for (int k = 0; k < n; k++)
                    s += (c[j * n + k] = expf(c[j * n + k] - mx));
                for (int k = 0; k < n; k++)
                    c[j * n + k] = c[j * n + k] / s + hc_eps;
            }
            for (int it = 0; it < iters; it++) {
                if (it > 0)
                    for (int j = 0; j < n; j++) {
                        float s = 0.0f;
                        for (int k = 0; k < n; k++)
                            s += c[j * n + k];
                        for (int k = 0; k < n; k++)
                            c[j * n + k] /= s + hc_eps;
                    }
                for (int k = 0; k < n; k++) {
                    float s = 0.0f;
                    for (int j = 0; j < n; j++)
                        s += c[j * n + k];
                    for (int j = 0; j < n; j++)
                        c[j * n + k] /= s + hc_eps;
                }
            }
            for (int i = 0; i < n * n; i++)
                comb[(int64_t)t * n * n + i] = c[i];
        }
    }
    __syncthreads();
    for (int dd = threadIdx.x; dd < D; dd += NB) {
        float s = 0.0f;
        for (int i = 0; i < n; i++)
            s = fmaf(pr[i], x[(int64_t)i * D + dd], s);
        h[(int64_t)t * D + dd] = s;
    }
}

static void cu_hc_pre(const float *X, int T, int n, int D, const float *fn, const float *base, const float *scale,
                      int iters, float hc_eps, float norm_eps, float *pre, float *post, float *comb, float *h)
{
    if (T <= 0)
        return;
    int nm = post ? (2 + n) * n : n;
    int64_t nd = (int64_t)n * D;
    pthread_mutex_lock(&g_lock);
    scratch_reset();
    int ok = n <= HC_MAXN;
    if (!ok && !g_err.code)
        dsv4_fail(&g_err, DSV4_E_UNSUPPORTED, "cuda: hc_pre: %d streams, the kernel holds at most %d", n, HC_MAXN);
    const float *dfn = ok ? (const float *)dev_const(fn, (size_t)nm * nd * sizeof(float)) : NULL;
    const float *db = ok ? (const float *)dev_const(base, (size_t)nm * sizeof(float)) : NULL;
    const float *ds = ok ? (const float *)dev_const(scale, (post ? 3 : 1) * sizeof(float)) : NULL;
    float *dX = ok ? dev_in(X, T, nd, nd) : NULL;
    float *dpre = ok ? dev_out((size_t)T * n) : NULL, *dh = ok ? dev_out((size_t)T * D) : NULL;
    float *dpost = ok && post ? dev_out((size_t)T * n) : NULL, *dcomb = ok && post ? dev_out((size_t)T * n * n) : NULL;
    if (dfn && db && ds && dX && dpre && dh && (!post || (dpost && dcomb))) {
        k_hc_pre<<<T, NB>>>(dX, n, D, dfn, db, ds, iters, hc_eps, norm_eps, dpre, dpost, dcomb, dh);
        if (launched("hc_pre")) {
            dev_back(pre, n, dpre, T, n);
            if (h) /* NULL: the mixes only (V4.1 collapses with another site's pre) */
                dev_back(h, D, dh, T, D);
            if (post) {
                dev_back(post, n, dpost, T, n);
                dev_back(comb, (int64_t)n * n, dcomb, T, (int64_t)n * n);
            }
            pthread_mutex_unlock(&g_lock);
            return;
        }
    }
    nan_fill(pre, T, n, n);
    if (h)
        nan_fill(h, T, D, D);
    if (post) {
        nan_fill(post, T, n, n);
        nan_fill(comb, T, (int64_t)n * n, (int64_t)n * n);
    }
    pthread_mutex_unlock(&g_lock);
}

/* X[k] = post[k] y + sum_j comb[j][k] X[j]: one thread per (row, channel), all n streams. */
__global__ void k_hc_post(float *X, const float *y, int T, int n, int D, const float *post, const float *comb)
{
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
        x[(int64_t)k * D + dd] = s;
    }
}

static void cu_hc_post(float *X, const float *y, int T, int n, int D, const float *post, const float *comb)
{
    if (T <= 0)
        return;
    int64_t nd = (int64_t)n * D;
    pthread_mutex_lock(&g_lock);
    scratch_reset();
    int ok = n <= HC_MAXN;
    if (!ok && !g_err.code)
        dsv4_fail(&g_err, DSV4_E_UNSUPPORTED, "cuda: hc_post: %d streams, the kernel holds at most %d", n, HC_MAXN);
    float *dX = ok ? dev_in(X, T, nd, nd) : NULL, *dy = ok ? dev_in(y, T, D, D) : NULL;
    float *dpo = ok ? dev_in(post, T, n, n) : NULL, *dc = ok ? dev_in(comb, T, (int64_t)n * n, (int64_t)n * n) : NULL;
    if (dX && dy && dpo && dc) {
        k_hc_post<<<(unsigned)cdiv((int64_t)T * D, 256), 256>>>(dX, dy, T, n, D, dpo, dc);
        if (launched("hc_post"))
            dev_back(X, nd, dX, T, nd);
        else
            nan_fill(X, T, nd, nd);
    } else
        nan_fill(X, T, nd, nd);
    pthread_mutex_unlock(&g_lock);
}

/* ---- attend: one block per head ---------------------------------------------------------- */

/* q [H, d], keys [nk, d] (K = V), sink [H], p [H, nk] scratch, out [H, d]. Scores by warp
 * (key i to warp i % NW), then the softmax with the sink, then out_j = sum_i (p_i / den) k_ij
 * in key order. */
__global__ void __launch_bounds__(NB) k_attend(const float *q, int d, const float *keys, int nk, float scale,
                                               const float *sink, float *p_all, float *out)
{
    __shared__ float sh[NW + 1];
    int h = blockIdx.x, lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const float *qh = q + (int64_t)h * d;
    float *p = p_all + (int64_t)h * nk;
    for (int i = wid; i < nk; i += NW) {
        const float *k = keys + (int64_t)i * d;
        float a = 0.0f;
        for (int j = lane; j < d; j += 32)
            a = fmaf(qh[j], k[j], a);
        a = warp_sum(a);
        if (lane == 0)
            p[i] = a * scale;
    }
    __syncthreads();
    float mx = sink[h];
    for (int i = threadIdx.x; i < nk; i += NB)
        mx = fmaxf(mx, p[i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0)
        sh[wid] = mx;
    __syncthreads();
    mx = sh[0];
    for (int i = 1; i < NW; i++)
        mx = fmaxf(mx, sh[i]);
    float part = 0.0f;
    for (int i = threadIdx.x; i < nk; i += NB) {
        float e = expf(p[i] - mx);
        p[i] = e;
        part += e;
    }
    float den = expf(sink[h] - mx) + block_sum<NW>(part, sh);
    float *o = out + (int64_t)h * d;
    for (int j = threadIdx.x; j < d; j += NB) {
        float acc = 0.0f;
        for (int i = 0; i < nk; i++)
            acc = fmaf(p[i] / den, keys[(int64_t)i * d + j], acc);
        o[j] = acc;
    }
}

static float *g_keys;           /* host staging for the gathered key rows */
static size_t g_keys_cap;

static void cu_attend(const float *q, int H, int d, const float *const *keys, int nk, float scale, const float *sink,
                      float *out)
{
    if (H <= 0 || d <= 0)
        return;
    pthread_mutex_lock(&g_lock);
    scratch_reset();
    size_t kb = (size_t)(nk > 0 ? nk : 1) * d * sizeof(float);
    if (kb > g_keys_cap) {
        float *nkeys = (float *)realloc(g_keys, kb);
        if (nkeys) {
            g_keys = nkeys;
            g_keys_cap = kb;
        }
    }
    int ok = kb <= g_keys_cap;
    if (!ok && !g_err.code)
        dsv4_fail(&g_err, DSV4_E_NOMEM, "cuda: attend: out of host memory staging %d keys", nk);
    for (int i = 0; ok && i < nk; i++)
        memcpy(g_keys + (size_t)i * d, keys[i], d * sizeof(float));
    const float *ds = ok ? (const float *)dev_const(sink, H * sizeof(float)) : NULL;
    float *dq = ok ? dev_in(q, 1, (int64_t)H * d, (int64_t)H * d) : NULL;
    float *dk = ok ? dev_in(g_keys, nk, d, d) : NULL;
    float *dp = ok ? (float *)scratch((size_t)H * (nk > 0 ? nk : 1) * sizeof(float)) : NULL;
    float *dout = ok ? dev_out((size_t)H * d) : NULL;
    if (ds && dq && dk && dp && dout) {
        k_attend<<<H, NB>>>(dq, d, dk, nk, scale, ds, dp, dout);
        if (launched("attend"))
            dev_back(out, (int64_t)H * d, dout, 1, (int64_t)H * d);
        else
            nan_fill(out, 1, (int64_t)H * d, (int64_t)H * d);
    } else
        nan_fill(out, 1, (int64_t)H * d, (int64_t)H * d);
    pthread_mutex_unlock(&g_lock);
}

/* ---- swiglu ------------------------------------------------------------------------------- */

__global__ void k_swiglu(const float *g, const float *u, int64_t n, float limit, float *h)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float a = g[i], b = u[i];
    if (limit > 0) {
        a = fminf(a, limit);
        b = fminf(fmaxf(b, -limit), limit);
    }
    h[i] = a / (1.0f + expf(-a)) * b;
}

static void cu_swiglu(const float *g, const float *u, int64_t n, float limit, float *h)
{
    if (n <= 0)
        return;
    pthread_mutex_lock(&g_lock);
    scratch_reset();
    float *dg = dev_in(g, 1, n, n), *du = dev_in(u, 1, n, n), *dh = dev_out((size_t)n);
    if (dg && du && dh) {
        k_swiglu<<<(unsigned)cdiv(n, 256), 256>>>(dg, du, n, limit, dh);
        if (launched("swiglu"))
            dev_back(h, n, dh, 1, n);
        else
            nan_fill(h, 1, n, n);
    } else
        nan_fill(h, 1, n, n);
    pthread_mutex_unlock(&g_lock);
}

/* h = sum_i pre_i X_i with pre given (V4.1's sites): one thread per (row, channel), the
 * streams summed in order as on the CPU. */
__global__ void k_hc_collapse(const float *X, int T, int n, int D, const float *pre, float *h)
{
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

static void cu_hc_collapse(const float *X, int T, int n, int D, const float *pre, float *h)
{
    if (T <= 0)
        return;
    int64_t nd = (int64_t)n * D;
    pthread_mutex_lock(&g_lock);
    scratch_reset();
    float *dX = dev_in(X, T, nd, nd), *dp = dev_in(pre, T, n, n), *dh = dev_out((size_t)T * D);
    if (dX && dp && dh) {
        k_hc_collapse<<<(unsigned)cdiv((int64_t)T * D, 256), 256>>>(dX, T, n, D, dp, dh);
        if (launched("hc_collapse"))
            dev_back(h, D, dh, T, D);
        else
            nan_fill(h, T, D, D);
    } else
        nan_fill(h, T, D, D);
    pthread_mutex_unlock(&g_lock);
}

static const dsv4_backend cuda_backend = {
    "cuda", cu_linear, cu_rmsnorm, cu_rope, cu_hc_pre, cu_hc_collapse, cu_hc_post, cu_attend, cu_swiglu, cuda_check,
};

extern "C" const dsv4_backend *dsv4_backend_cuda(void) { return &cuda_backend; }
