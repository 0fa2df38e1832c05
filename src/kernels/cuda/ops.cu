/* CUDA backend: the dsv4_backend ops on the GPU, fp32 activations and fp32 accumulation.
 *
 * Batch invariance: every kernel gives each output row one fixed reduction order that
 * depends only on the op's shape (k, dim, n...), never on T or on the row's place in the
 * batch: a row is owned by one warp or one block, lanes take fixed strides, and partial
 * sums meet in a fixed shuffle tree. A batch of rows therefore equals the rows one at a time,
 * bit for bit. The order differs from the CPU's, so GPU and CPU agree to rounding only.
 *
 * Buffers: the ops run over device buffers without copies or waits (the V4 forward's step
 * arena and sequence state); the older ops also take host buffers, copied in and out per call
 * (V4.1's stateful steps, tests). The stateful attention op and routing live in step.cu. */
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "kernels/cuda/internal.h"
#include "kernels/hc_mix.h"
#include "kernels/cuda/exl3_cuda.h"

using namespace dsv4cu;

/* ---- state: device, stream, first error, poison flag -------------------------------- */

namespace dsv4cu {
pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
cudaStream_t stream;
int poison;
int capturing;
}
static int g_ready;
static char g_name[320];
static dsv4_err g_err;          /* first failure of an op since the last check */
static dsv4_err g_cap_err;      /* first failure while recording a graph */

dsv4_err *dsv4cu::errp(void) { return capturing ? &g_cap_err : &g_err; }

int dsv4cu::failed(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return 0;
    if (!errp()->code)
        dsv4_fail(errp(), DSV4_E_DEVICE, "cuda: %s: %s", what, cudaGetErrorString(e));
    return 1;
}
#define CK(call) failed((call), #call)

void dsv4cu::fail(int code, const char *fmt, ...)
{
    dsv4_err *e = errp();
    if (e->code)
        return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    dsv4_fail(e, code, "%s", msg);
}

extern "C" int dsv4_cuda_init(dsv4_err *err)
{
    pthread_mutex_lock(&dsv4cu::lock);
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
                dsv4cu::poison = ps && *ps == '1';
                if ((e = cudaStreamCreate(&dsv4cu::stream)) != cudaSuccess)
                    rc = dsv4_fail(err, DSV4_E_DEVICE, "device 'cuda': creating a stream: %s", cudaGetErrorString(e));
                else
                    g_ready = 1;
            }
        }
    }
    pthread_mutex_unlock(&dsv4cu::lock);
    return rc;
}

extern "C" const char *dsv4_cuda_device_name(void) { return g_name; }
extern "C" void dsv4_cuda_set_poison(int on) { dsv4cu::poison = on; }

static int cuda_check(dsv4_err *err)
{
    pthread_mutex_lock(&dsv4cu::lock);
    int rc = g_err.code;
    if (rc) {
        if (err)
            *err = g_err;
        dsv4_err_clear(&g_err);
    }
    pthread_mutex_unlock(&dsv4cu::lock);
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
    pthread_mutex_lock(&dsv4cu::lock);
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
    pthread_mutex_unlock(&dsv4cu::lock);
    return rc;
}

extern "C" int dsv4_cuda_put(const void *host, size_t bytes, dsv4_err *err) { return put_copy(host, bytes, 0, err); }

static unsigned g_drops;        /* bumped by every drop: cached expert tables are rebuilt */

extern "C" void dsv4_cuda_drop(const void *host)
{
    pthread_mutex_lock(&dsv4cu::lock);
    g_drops++;
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
    pthread_mutex_unlock(&dsv4cu::lock);
}

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
    if (w->form == DSV4_WF_EXL3) /* trellis, scales and bias on the device (the plan never spills them) */
        return dsv4_cuda_exl3_put(w, err);
    if (w->form > DSV4_WF_EXL3)
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

extern "C" size_t dsv4_cuda_weight_bytes(const dsv4_weight *w)
{
    if (w->form == DSV4_WF_EXL3)
        return dsv4_cuda_exl3_bytes(w);
    return data_bytes(w) + (w->scale ? scale_bytes(w) : 0);
}

extern "C" int dsv4_cuda_mem(size_t *free_b, size_t *total_b, dsv4_err *err)
{
    cudaError_t e = cudaMemGetInfo(free_b, total_b);
    if (e != cudaSuccess)
        return dsv4_fail(err, DSV4_E_DEVICE, "cuda: cudaMemGetInfo: %s", cudaGetErrorString(e));
    return 0;
}

extern "C" void dsv4_cuda_usage(size_t *device_b, size_t *pinned_b)
{
    pthread_mutex_lock(&dsv4cu::lock);
    *device_b = g_res_bytes;
    *pinned_b = g_pin_bytes;
    pthread_mutex_unlock(&dsv4cu::lock);
}

extern "C" void dsv4_cuda_drop_weight(const dsv4_weight *w)
{
    if (w->form == DSV4_WF_EXL3) {
        dsv4_cuda_exl3_drop(w);
        return;
    }
    dsv4_cuda_drop(w->data);
    if (w->scale)
        dsv4_cuda_drop(w->scale);
}

/* ---- per-op scratch: one device arena, reset at each op ----------------------------- */

/* Scratch serves the host-buffer path only: an op over device buffers uses none, so a
 * recorded graph never points into the arena (which a later op may free and regrow). */
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

int dsv4cu::pdl_enabled(void)
{
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("DSV4_PDL");
        on = !(e && !strcmp(e, "0"));
    }
    return on;
}

/* The op profile (DSV4_CUDA_PROFILE=1): wall time from op_begin to the op's completion. */
static int g_prof = -1, g_nprof, g_depth;
static const char *g_prof_name;
static double g_prof_t0;
static struct { const char *name; double s; long n; } g_prof_tab[64];

static double prof_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void prof_print(void)
{
    double all = 0;
    for (int i = 0; i < g_nprof; i++)
        all += g_prof_tab[i].s;
    fprintf(stderr, "cuda op profile (each op waited for; %.3f s in all):\n", all);
    for (int i = 0; i < g_nprof; i++)
        for (int j = i + 1; j < g_nprof; j++)
            if (g_prof_tab[j].s > g_prof_tab[i].s) {
                auto t = g_prof_tab[i];
                g_prof_tab[i] = g_prof_tab[j];
                g_prof_tab[j] = t;
            }
    for (int i = 0; i < g_nprof; i++)
        fprintf(stderr, "  %-22s %8ld calls %10.3f ms %9.1f us/call %5.1f%%\n", g_prof_tab[i].name, g_prof_tab[i].n,
                g_prof_tab[i].s * 1e3, g_prof_tab[i].s / g_prof_tab[i].n * 1e6, 100 * g_prof_tab[i].s / all);
}

void dsv4cu::op_begin_at(const char *name)
{
    pthread_mutex_lock(&dsv4cu::lock);
    if (!capturing)
        scratch_reset();
    if (g_prof < 0) {
        const char *e = getenv("DSV4_CUDA_PROFILE");
        g_prof = e && !strcmp(e, "1");
        if (g_prof)
            atexit(prof_print);
    }
    if (g_prof && !capturing && g_depth++ == 0) {
        cudaStreamSynchronize(stream);
        g_prof_name = name;
        g_prof_t0 = prof_now();
    }
}

/* Adds one call of `seconds` to name's row of the profile (64 rows at most). */
static void prof_add(const char *name, double seconds)
{
    int i = 0;
    while (i < g_nprof && strcmp(g_prof_tab[i].name, name))
        i++;
    if (i < 64) {
        if (i == g_nprof)
            g_prof_tab[g_nprof++].name = name;
        g_prof_tab[i].s += seconds;
        g_prof_tab[i].n++;
    }
}

/* Inside a profiled op: the time since the op began (or the last split) goes to `name`. */
void dsv4cu::prof_split(const char *name)
{
    if (g_prof <= 0 || capturing || !g_prof_name)
        return;
    cudaStreamSynchronize(stream);
    double t = prof_now();
    prof_add(name, t - g_prof_t0);
    g_prof_t0 = t;
}

void dsv4cu::op_end(void)
{
    if (g_prof > 0 && !capturing && --g_depth == 0 && g_prof_name) {
        cudaStreamSynchronize(stream);
        prof_add(g_prof_name, prof_now() - g_prof_t0);
        g_prof_name = NULL;
    }
    pthread_mutex_unlock(&dsv4cu::lock);
}

/* A device buffer of `bytes` for this op (256-byte aligned), NULL after recording an error. */
void *dsv4cu::scratch(size_t bytes)
{
    if (capturing) {
        fail(DSV4_E_ARG, "cuda: a recorded op was given a host buffer or an unregistered host constant "
                         "(recordings take device buffers only)");
        return NULL;
    }
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

int dsv4cu::on_dev(const void *p)
{
    if (!p)
        return 0;
    cudaPointerAttributes at;
    if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
        cudaGetLastError(); /* not a pointer the runtime knows: host memory */
        return 0;
    }
    return at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged;
}

/* The device view of a constant array: device memory itself, resident if put, else copied. */
const void *dsv4cu::dev_const(const void *host, size_t bytes)
{
    if (!host)
        return NULL;
    resident *r = find(host);
    if (r)
        return r->dev;
    if (on_dev(host))
        return host;
    void *d = scratch(bytes);
    if (d && bytes && CK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice)))
        return NULL;
    return d;
}

const void *dsv4cu::dev_known(const void *p)
{
    if (!p)
        return NULL;
    resident *r = find(p);
    if (r)
        return r->dev;
    return on_dev(p) ? p : NULL;
}

const void *dsv4cu::in_buf(const void *p, size_t bytes)
{
    if (!p || on_dev(p))
        return p;
    void *d = scratch(bytes);
    if (d && bytes && CK(cudaMemcpy(d, p, bytes, cudaMemcpyHostToDevice)))
        return NULL;
    return d;
}

void *dsv4cu::out_buf(void *p, size_t bytes, int may_poison)
{
    if (!p)
        return NULL;
    if (on_dev(p)) {
        if (dsv4cu::poison && may_poison && bytes && CK(cudaMemsetAsync(p, 0xff, bytes, stream)))
            return NULL;
        return p;
    }
    void *d = scratch(bytes);
    if (d && dsv4cu::poison && bytes && CK(cudaMemset(d, 0xff, bytes)))
        return NULL;
    return d;
}

void dsv4cu::out_back(void *p, const void *d, size_t bytes)
{
    if (p && d && d != p && bytes)
        CK(cudaMemcpy(p, d, bytes, cudaMemcpyDeviceToHost));
}

void dsv4cu::out_fail(void *p, size_t bytes)
{
    if (!p || !bytes)
        return;
    if (on_dev(p))
        cudaMemsetAsync(p, 0xff, bytes, stream); /* NaN bytes; the op's failure is already kept */
    else
        memset(p, 0xff, bytes);
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
    if (d && dsv4cu::poison && CK(cudaMemset(d, 0xff, n * sizeof(float))))
        return NULL;
    return d;
}

static void dev_back(float *host, int64_t ld, const float *d, int64_t rows, int64_t w)
{
    if (rows)
        CK(cudaMemcpy2D(host, ld * sizeof(float), d, w * sizeof(float), w * sizeof(float), rows, cudaMemcpyDeviceToHost));
}

int dsv4cu::launched(const char *what)
{
    return !failed(cudaGetLastError(), what);
}

/* Host rows [rows, w] with stride ld set to NaN: what an op leaves when it failed. */
static void nan_fill(float *host, int64_t rows, int64_t w, int64_t ld)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < w; i++)
            host[r * ld + i] = NAN;
}

/* Rows [rows, w] with stride ld set to NaN, host or device: what an op leaves when it failed. */
static void fail_rows(float *p, int64_t rows, int64_t w, int64_t ld)
{
    if (!p || rows <= 0 || w <= 0)
        return;
    if (on_dev(p))
        cudaMemset2DAsync(p, ld * sizeof(float), 0xff, w * sizeof(float), rows, stream);
    else
        nan_fill(p, rows, w, ld);
}

/* How an op with one output ends: the result copied back when p is a host buffer (d its device
 * copy), or p marked failed (NaN) when its inputs could not be staged (ran false) or the launch
 * failed. */
static void finish(bool ran, const char *what, void *p, const void *d, size_t bytes)
{
    if (ran && launched(what))
        out_back(p, d, bytes);
    else
        out_fail(p, bytes);
}

/* The same for rows [rows, w] of y with row stride ld, dy their dense device copy (or y). */
static void finish_rows(bool ran, const char *what, float *y, const float *dy, int64_t rows, int64_t w, int64_t ld)
{
    if (ran && launched(what)) {
        if (dy != y)
            dev_back(y, ld, dy, rows, w);
    } else
        fail_rows(y, rows, w, ld);
}

/* ---- shared device helpers ----------------------------------------------------------- */
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
    int n, nr, bpj, multi;
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
    __device__ __forceinline__ const float *xr(int t) const { return x + (int64_t)t * ldx; }
    __device__ __forceinline__ float *yr(int t) const { return y + (int64_t)t * ldy; }
};

struct pair_map {
    const float *x;             /* row ord[t] / xdiv of it, row stride ldx */
    float *y;                   /* row ord[t] of it, row stride ldy */
    const int *ord;             /* the tile's pairs */
    int xdiv;
    int64_t ldx, ldy;
    __device__ __forceinline__ const float *xr(int t) const { return x + (int64_t)(__ldg(ord + t) / xdiv) * ldx; }
    __device__ __forceinline__ float *yr(int t) const { return y + (int64_t)__ldg(ord + t) * ldy; }
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
                m.yr(t0 + tt)[i0 + rr] = sum;
            }
        }
        __syncthreads();
    }
}

/* A single linear: the weight's parameters at fixed offsets. */
template <int F, bool VEC, int TT>
__global__ void __launch_bounds__(LIN_WARPS * 32) k_linear(wdev w, int64_t r0, int nr, dense_map m, int T)
{
    PDL_WAIT();
    linear_rows<F, VEC, TT>(w, r0, nr, m, T, blockIdx.x);
}

/* A group: job blockIdx.x / bpj. Kept apart from k_linear because a run-time job index into the
 * parameters cost the single launches registers and time (measured: FP4 expert 6.6 -> 10.3 us).
 * The T = 1 build is held to 64 registers (4 blocks a multiprocessor). */
template <int F, bool VEC, int TT>
__global__ void __launch_bounds__(LIN_WARPS * 32, VEC && TT == 1 ? 4 : 1) k_linear_group(lin_jobs J, int T)
{
    PDL_WAIT();
    int j = blockIdx.x / J.bpj;
    dense_map m = {J.x[j], J.y[j], J.ldx, J.ldy};
    linear_rows<F, VEC, TT>(J.w[j], J.r0[j], J.nr, m, T, blockIdx.x % J.bpj);
}

/* A multi launch: job j owns blocks b0[j] .. b0[j + 1] - 1 (a scan of at most
 * DSV4_CUDA_GROUP_MAX bounds, uniform in the block). Its own kernel, so the group and single
 * launches keep their parameters and registers. The T = 1 chunk build is held to 64 registers
 * (4 blocks a multiprocessor), what k_linear's FP8 build uses unbounded (the job lookup took it
 * to 74); the others have no minimum (0), as in k_linear. */
template <int F, bool VEC, int TT>
__global__ void __launch_bounds__(LIN_WARPS * 32, VEC && TT == 1 ? 4 : 0) k_linear_multi(lin_jobs J, int T)
{
    PDL_WAIT();
    int j = 0, b = (int)blockIdx.x;
    while (j + 1 < J.n && b >= J.b0[j + 1])
        j++;
    dense_map m = {J.x[j], J.y[j], J.ldx, J.nrj[j]};
    linear_rows<F, VEC, TT>(J.w[j], J.r0[j], J.nrj[j], m, T, b - J.b0[j]);
}

/* Whether the 8-element chunk path tiles this weight's rows (and its scale blocks). */
static bool vec_ok(const dsv4_weight *w)
{
    bool scaled = w->form == DSV4_WF_FP8 || w->form == DSV4_WF_FP4;
    return w->form < DSV4_WF_EXL3 && w->k % 8 == 0 && (!scaled || w->bk % 8 == 0);
}

/* A storage form's chunk path: rows a warp owns (R) and chunks of each in flight (U). */
struct ck_shape {
    int R, U;
};
template <int F>
static ck_shape ck_shape_of(void) { return ck_shape{(int)ck<F>::R, (int)ck<F>::U}; }
static ck_shape chunk_shape(int form)
{
    switch (form) {
    case DSV4_WF_F32: return ck_shape_of<DSV4_WF_F32>();
    case DSV4_WF_BF16: return ck_shape_of<DSV4_WF_BF16>();
    case DSV4_WF_F16: return ck_shape_of<DSV4_WF_F16>();
    case DSV4_WF_FP8: return ck_shape_of<DSV4_WF_FP8>();
    default: return ck_shape_of<DSV4_WF_FP4>();
    }
}

/* Output rows one block of a launch covers: LIN_WARPS / wpr row groups of R (chunk path), or
 * LIN_WARPS rows (element path). */
template <int F>
static int rows_per_block(const wdev &w, bool vec)
{
    return vec ? LIN_WARPS / w.wpr * (int)ck<F>::R : LIN_WARPS;
}

/* A linear kernel's build for the call: T = 1 on the chunk path (fewer registers), the chunk
 * path, or the element path; the three take the same arguments. */
template <class K, class... A>
static void launch_build(K k1, K kc, K ke, bool vec, int T, dim3 grid, cudaStream_t st, A... args)
{
    launch_k(vec && T == 1 ? k1 : vec ? kc : ke, grid, LIN_WARPS * 32, 0, st, args...);
}

template <int F>
static void launch_form(lin_jobs &J, bool vec, int T, cudaStream_t st)
{
    if (J.multi) {
        J.b0[0] = 0;
        for (int j = 0; j < J.n; j++)
            J.b0[j + 1] = J.b0[j] + (int)cdiv(J.nrj[j], rows_per_block<F>(J.w[j], vec));
        launch_build(k_linear_multi<F, true, 1>, k_linear_multi<F, true, LIN_TT>, k_linear_multi<F, false, LIN_TT>, vec,
                     T, dim3((unsigned)J.b0[J.n]), st, J, T);
        return;
    }
    J.bpj = (int)cdiv(J.nr, rows_per_block<F>(J.w[0], vec));
    dim3 grid((unsigned)(J.bpj * J.n));
    if (J.n > 1) {
        launch_build(k_linear_group<F, true, 1>, k_linear_group<F, true, LIN_TT>, k_linear_group<F, false, LIN_TT>, vec, T,
                     grid, st, J, T);
        return;
    }
    dense_map m = {J.x[0], J.y[0], J.ldx, J.ldy};
    launch_build(k_linear<F, true, 1>, k_linear<F, true, LIN_TT>, k_linear<F, false, LIN_TT>, vec, T, grid, st, J.w[0],
                 J.r0[0], J.nr, m, T);
}

/* Launches J's jobs, whose weights all have w's form and path (and, but in a multi launch, its
 * shape). */
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
    J.ldx = wd.k;
    J.ldy = nr;
    return J;
}

/* Warps per row group: doubled (up to LIN_WARPS) while the weight has too few row groups to
 * give the device LIN_MIN_WARPS warps and each lane would still get its U chunks (splitting
 * further only adds blocks, and a second wave). From the weight's form and shape alone, so
 * every call over that weight sums a row the same way. */
static wdev wdev_of_n(const dsv4_weight *w, const void *q, const void *s, int mats);

static wdev wdev_of(const dsv4_weight *w, const void *q, const void *s) { return wdev_of_n(w, q, s, 1); }

/* As wdev_of for a weight that runs beside mats - 1 others of its shape in every launch (the
 * active experts of a row): the warps per row group count the others' rows too, so a small
 * matrix is not split finer than the launch needs. From the shape and mats alone. */
static wdev wdev_of_n(const dsv4_weight *w, const void *q, const void *s, int mats)
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
    int64_t nch = w->k / 8, groups = cdiv(w->n, chunk_shape(w->form).R) * (mats > 0 ? mats : 1);
    d.wpr = 1;
    while (d.wpr < LIN_WARPS && groups * d.wpr < LIN_MIN_WARPS && nch >= (int64_t)32 * chunk_shape(w->form).U * d.wpr * 2)
        d.wpr *= 2;
    return d;
}

/* Device x rows the chunk path cannot read in place (float4 loads need a 16-byte aligned row
 * start) are packed into this buffer first. It only grows, and a buffer it outgrew is kept
 * (never freed), since a recorded graph may still read it. */
static float *g_pack;
static size_t g_pack_cap;

static float *pack_buf(size_t n)
{
    if (n > g_pack_cap) {
        float *p = NULL;
        if (CK(cudaMalloc((void **)&p, n * sizeof(float))))
            return NULL;
        g_pack = p; /* the old one stays allocated: recordings may point at it */
        g_pack_cap = n;
    }
    return g_pack;
}

/* EXL3 rows (exl3.cu) over device buffers, or host ones copied in and out; its failures are
 * kept here like every op's. */
static void exl3_linear(const dsv4_weight *w, int64_t r0, int64_t r1, const float *x, int T, int64_t ldx, float *y,
                        int64_t ldy)
{
    int64_t nr = r1 - r0;
    int ydev = on_dev(y);
    const float *dx = on_dev(x) ? x : dev_in(x, T, w->k, ldx);
    int64_t dldx = on_dev(x) ? ldx : w->k, dldy = ydev ? ldy : nr;
    float *dy = ydev ? y : dev_out((size_t)T * nr);
    if (ydev && dsv4cu::poison)
        CK(cudaMemset2DAsync(y, ldy * sizeof(float), 0xff, nr * sizeof(float), T, stream));
    dsv4_err e;
    memset(&e, 0, sizeof e);
    if (!dx || !dy || dsv4_cuda_exl3_linear(w, r0, r1, dx, T, dldx, dy, dldy, stream) || dsv4_cuda_exl3_check(&e)) {
        if (e.code)
            fail(e.code, "%s", e.msg);
        fail_rows(y, T, nr, ldy);
        return;
    }
    if (!ydev)
        dev_back(y, ldy, dy, T, nr);
}

static void cu_linear(const dsv4_weight *w, int64_t r0, int64_t r1, const float *x, int T, int64_t ldx, float *y,
                      int64_t ldy)
{
    int64_t nr = r1 - r0;
    if (T <= 0 || nr <= 0)
        return;
    op_begin();
    if (w->form == DSV4_WF_EXL3) {
        exl3_linear(w, r0, r1, x, T, ldx, y, ldy);
        op_end();
        return;
    }
    int ok = w->form < DSV4_WF_EXL3;
    if (!ok)
        fail(DSV4_E_UNSUPPORTED, "cuda: weight %s: form %s has no CUDA kernel", w->name ? w->name : "?",
             dsv4_wform_name(w->form));
    const void *q = ok ? dev_const(w->data, data_bytes(w)) : NULL;
    const void *s = ok && w->scale ? dev_const(w->scale, scale_bytes(w)) : NULL;
    int xdev = on_dev(x), ydev = on_dev(y);
    const float *dx = NULL;
    int64_t dldx = w->k;
    if (ok && xdev) {
        bool aligned = ((uintptr_t)x & 15) == 0 && (T == 1 || ldx % 4 == 0);
        if (aligned || !vec_ok(w)) {
            dx = x;
            dldx = ldx;
        } else {
            float *pk = pack_buf((size_t)T * w->k);
            if (pk && !CK(cudaMemcpy2DAsync(pk, w->k * sizeof(float), x, ldx * sizeof(float), w->k * sizeof(float), T,
                                            cudaMemcpyDeviceToDevice, stream)))
                dx = pk;
        }
    } else if (ok)
        dx = dev_in(x, T, w->k, ldx);
    float *dy = NULL;
    int64_t dldy = nr;
    if (ok && ydev) {
        if (!dsv4cu::poison || !CK(cudaMemset2DAsync(y, ldy * sizeof(float), 0xff, nr * sizeof(float), T, stream))) {
            dy = y;
            dldy = ldy;
        }
    } else if (ok)
        dy = dev_out((size_t)T * nr);
    bool ran = q && (s || !w->scale) && dx && dy;
    if (ran) {
        lin_jobs J = one_job(wdev_of(w, q, s), r0, (int)nr, dx, dy);
        J.ldx = dldx;
        J.ldy = dldy;
        launch_linear(w, J, T, stream);
    }
    finish_rows(ran, "linear", y, dy, T, nr, ldy);
    op_end();
}

/* The G blocks in one launch (jobs of one weight at row offsets g n/G, strided x and y) when
 * both buffers are on the device and the shape allows it; else block by block. */
static void cu_linear_blocks(const dsv4_weight *w, int G, const float *x, int T, float *y)
{
    int64_t rk = w->n / G;
    if (T <= 0 || G < 1)
        return;
    bool one = G <= DSV4_CUDA_GROUP_MAX && w->form < DSV4_WF_EXL3 && on_dev(x) && on_dev(y) && vec_ok(w) &&
               ((uintptr_t)x & 15) == 0 && (w->k * G) % 4 == 0 && w->k % 4 == 0;
    if (!one) {
        for (int g = 0; g < G; g++)
            cu_linear(w, g * rk, (g + 1) * rk, x + g * w->k, T, (int64_t)G * w->k, y + g * rk, w->n);
        return;
    }
    op_begin();
    const void *q = dev_const(w->data, data_bytes(w));
    const void *s = w->scale ? dev_const(w->scale, scale_bytes(w)) : NULL;
    if (q && (s || !w->scale) && (!dsv4cu::poison || !CK(cudaMemsetAsync(y, 0xff, (size_t)T * w->n * sizeof(float), stream)))) {
        lin_jobs J;
        memset(&J, 0, sizeof J);
        J.n = G;
        J.nr = (int)rk;
        J.ldx = (int64_t)G * w->k;
        J.ldy = w->n;
        for (int g = 0; g < G; g++) {
            J.w[g] = wdev_of(w, q, s);
            J.r0[g] = g * rk;
            J.x[g] = x + g * w->k;
            J.y[g] = y + g * rk;
        }
        launch_linear(w, J, T, stream);
        if (!launched("linear blocks"))
            fail_rows(y, T, w->n, w->n);
    } else
        fail_rows(y, T, w->n, w->n);
    op_end();
}

/* The weights of each storage form in one launch (x shared, y[j] dense [T, W_j.n]; x and every
 * y on the device), each job summed as cu_linear sums it alone: the same wdev_of, path and
 * grid within the job. A weight the launches cannot take (EXL3, not resident, the chunk path
 * over an x it would have to pack) runs alone through cu_linear, as do all when x or a y is
 * host memory. Past DSV4_CUDA_GROUP_MAX weights, slice by slice. */
static void cu_linear_multi(int nw, const dsv4_weight *const *w, const float *x, int T, int64_t ldx, float *const *y)
{
    if (nw > DSV4_CUDA_GROUP_MAX) {
        cu_linear_multi(DSV4_CUDA_GROUP_MAX, w, x, T, ldx, y);
        cu_linear_multi(nw - DSV4_CUDA_GROUP_MAX, w + DSV4_CUDA_GROUP_MAX, x, T, ldx, y + DSV4_CUDA_GROUP_MAX);
        return;
    }
    if (T <= 0 || nw <= 0)
        return;
    bool dev = on_dev(x);
    for (int j = 0; j < nw; j++)
        dev = dev && on_dev(y[j]);
    if (!dev) {
        for (int j = 0; j < nw; j++)
            cu_linear(w[j], 0, w[j]->n, x, T, ldx, y[j], w[j]->n);
        return;
    }
    bool aligned = ((uintptr_t)x & 15) == 0 && (T == 1 || ldx % 4 == 0);
    int state[DSV4_CUDA_GROUP_MAX]; /* 0: for a launch, 1: launched, -1: alone */
    wdev wd[DSV4_CUDA_GROUP_MAX];
    op_begin();
    for (int j = 0; j < nw; j++) {
        const dsv4_weight *a = w[j];
        const void *q = a->form < DSV4_WF_EXL3 && a->n > 0 ? dev_known(a->data) : NULL;
        const void *s = q && a->scale ? dev_known(a->scale) : NULL;
        state[j] = q && (s || !a->scale) && (aligned || !vec_ok(a)) ? 0 : -1;
        if (!state[j])
            wd[j] = wdev_of(a, q, s);
    }
    for (int j0 = 0; j0 < nw; j0++) {
        if (state[j0])
            continue;
        bool vec = vec_ok(w[j0]);
        lin_jobs J;
        memset(&J, 0, sizeof J);
        J.multi = 1;
        J.ldx = ldx;
        for (int j = j0; j < nw; j++) {
            if (state[j] || w[j]->form != w[j0]->form || vec_ok(w[j]) != vec)
                continue;
            state[j] = 1;
            if (dsv4cu::poison && CK(cudaMemsetAsync(y[j], 0xff, (size_t)T * w[j]->n * sizeof(float), stream))) {
                fail_rows(y[j], T, w[j]->n, w[j]->n);
                continue;
            }
            J.w[J.n] = wd[j];
            J.x[J.n] = x;
            J.y[J.n] = y[j];
            J.nrj[J.n++] = (int)w[j]->n;
        }
        if (!J.n)
            continue;
        launch_linear(w[j0], J, T, stream);
        if (!launched("linear multi"))
            for (int i = 0; i < J.n; i++)
                fail_rows(J.y[i], T, J.nrj[i], J.nrj[i]);
    }
    op_end();
    for (int j = 0; j < nw; j++)
        if (state[j] < 0)
            cu_linear(w[j], 0, w[j]->n, x, T, ldx, y[j], w[j]->n);
}

extern "C" int dsv4_cuda_linear_dev(const dsv4_weight *w, int64_t r0, int64_t r1, const float *dx, int T, float *dy,
                                    void *stream, dsv4_err *err)
{
    pthread_mutex_lock(&dsv4cu::lock);
    resident *rq = find(w->data), *rs = w->scale ? find(w->scale) : NULL;
    pthread_mutex_unlock(&dsv4cu::lock);
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
    J.ldx = w[0]->k;
    J.ldy = w[0]->n;
    for (int j = 0; j < n; j++) {
        const dsv4_weight *a = w[j], *b = w[0];
        if (a->form != b->form || a->n != b->n || a->k != b->k || a->bn != b->bn || a->bk != b->bk ||
            a->scale_e8m0 != b->scale_e8m0 || (a->scale == NULL) != (b->scale == NULL))
            return dsv4_fail(err, DSV4_E_ARG, "cuda: linear group: weight %s differs from %s in form, shape or blocks",
                             a->name ? a->name : "?", b->name ? b->name : "?");
        pthread_mutex_lock(&dsv4cu::lock);
        resident *rq = find(a->data), *rs = a->scale ? find(a->scale) : NULL;
        pthread_mutex_unlock(&dsv4cu::lock);
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

/* Rows of up to NB * RMS_V elements are held in registers: every load of a thread is issued
 * before the first use (y may alias x, which otherwise orders each store before the next load).
 * A thread's elements are summed in the same order either way. */
enum { RMS_V = 16 };

/* The RMS norm of one row held in registers by a block of NB threads (thread t holds channels
 * t + c NB, c < RMS_V, and their weights wv): the squares summed per thread in c order, then
 * the block's fixed-order sum; y = v / rms, times wv when weighted. k_rmsnorm and the hc sites'
 * fused norm both end here, so the two give the same bits. sh: [NW + 1] shared floats. */
__device__ __forceinline__ void rms_out(const float (&v)[RMS_V], const float (&wv)[RMS_V], bool weighted, int dim,
                                        float eps, float *sh, float *y)
{
    float ss = 0.0f;
#pragma unroll
    for (int c = 0; c < RMS_V; c++)
        if (threadIdx.x + c * NB < dim)
            ss = fmaf(v[c], v[c], ss);
    ss = block_sum<NW>(ss, sh);
    float inv = 1.0f / sqrtf(ss / (float)dim + eps);
#pragma unroll
    for (int c = 0; c < RMS_V; c++) {
        int i = threadIdx.x + c * NB;
        if (i < dim)
            y[i] = weighted ? v[c] * inv * wv[c] : v[c] * inv;
    }
}

__global__ void __launch_bounds__(NB) k_rmsnorm(const float *x, int dim, const float *w, float eps, float *y)
{
    PDL_WAIT();
    __shared__ float sh[NW + 1];
    const float *xr = x + (int64_t)blockIdx.x * dim;
    float *yr = y + (int64_t)blockIdx.x * dim;
    if (dim <= NB * RMS_V) {
        float v[RMS_V], wv[RMS_V];
#pragma unroll
        for (int c = 0; c < RMS_V; c++) {
            int i = threadIdx.x + c * NB;
            v[c] = i < dim ? xr[i] : 0.0f;
            wv[c] = i < dim && w ? w[i] : 1.0f;
        }
        rms_out(v, wv, w != NULL, dim, eps, sh, yr);
        return;
    }
    rms_block(xr, dim, w, eps, sh, yr);
}

static void cu_rmsnorm(const float *x, int64_t rows, int dim, const float *w, float eps, float *y)
{
    if (rows <= 0 || dim <= 0)
        return;
    op_begin();
    size_t b = (size_t)rows * dim * sizeof(float);
    const float *dw = (const float *)dev_const(w, (size_t)dim * sizeof(float));
    const float *dx = (const float *)in_buf(x, b);
    float *dy = (float *)out_buf(y, b, y != x);
    bool ran = dx && dy && (dw || !w);
    if (ran)
        launch_k(k_rmsnorm, (unsigned)rows, NB, 0, stream, dx, dim, dw, eps, dy);
    finish(ran, "rmsnorm", y, dy, b);
    op_end();
}

/* ---- rope: one thread per (row, head, channel pair) ------------------------------------- */

__global__ void k_rope(float *x, int T, int64_t ld, int heads, int d, int rd, const float *inv_freq,
                       const int64_t *pos, int inverse)
{
    PDL_WAIT();
    int half = rd / 2;
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)T * heads * half)
        return;
    int i = (int)(idx % half), h = (int)(idx / half % heads);
    int64_t t = idx / ((int64_t)half * heads);
    float ang = (float)pos[t] * inv_freq[i];
    float c = cosf(ang), s = inverse ? -sinf(ang) : sinf(ang);
    float *v = x + t * ld + (int64_t)h * d + (d - rd);
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
    op_begin();
    const float *df = (const float *)dev_const(inv_freq, (size_t)(rd / 2) * sizeof(float));
    const int64_t *dp = (const int64_t *)dev_const(pos, (size_t)T * sizeof(int64_t));
    int xdev = on_dev(x);
    float *dx = xdev ? x : dev_in(x, T, width, stride);
    int64_t ld = xdev ? stride : width;
    bool ran = df && dp && dx;
    if (ran)
        launch_k(k_rope, (unsigned)cdiv(n, 256), 256, 0, stream, dx, T, ld, heads, d, rd, df, dp, inverse);
    finish_rows(ran, "rope", x, dx, T, width, stride);
    op_end();
}

/* ---- hyper-connections ------------------------------------------------------------------ */

enum { HC_MAXN = 5, HC_MAXM = (2 + HC_MAXN) * HC_MAXN };
static_assert(HC_MAXN * HC_MAXN <= 32, "k_hc_pre holds the comb matrix in one warp");

/* Elements of X's row a block of k_hc_mix sums: the mixes of one row are spread over
 * (nm + 1) * cdiv(nd, HC_SPAN) blocks (a single block per row left the site latency-bound). */
enum { HC_SPAN = 2048, HC_U = 8 };

/* Partial sums of the site's dot products over span sp of row t: part[t][j][sp] = fn_j . X_t
 * for j < nm, X_t . X_t for j = nm. Block (t, j, sp); fixed order per shape. */
__global__ void __launch_bounds__(NB) k_hc_mix(const float *X, int64_t nd, const float *fn, int nm, float *part)
{
    PDL_WAIT();
    __shared__ float sh[NW + 1];
    int t = blockIdx.x, j = blockIdx.y, sp = blockIdx.z, nsp = gridDim.z;
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
     * division per lane and half-step: a thread dividing a whole line waited on each division
     * in turn. */
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
static float *g_hcp;
static size_t g_hcp_n;

static float *hc_parts(size_t n)
{
    if (n <= g_hcp_n)
        return g_hcp;
    if (capturing) { /* growing is not recordable; the step runs the ops again */
        fail(DSV4_E_ARG, "cuda: hc_pre: its scratch must grow, which a recording cannot");
        return NULL;
    }
    float *p = NULL;
    if (CK(cudaMalloc((void **)&p, n * sizeof(float))))
        return NULL;
    g_hcp = p;
    g_hcp_n = n;
    return p;
}

static void cu_hc_pre(const float *X, int T, int n, int D, const float *fn, const float *base, const float *scale,
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
    const float *dfn = ok ? (const float *)dev_const(fn, (size_t)nm * nd * sizeof(float)) : NULL;
    const float *db = ok ? (const float *)dev_const(base, (size_t)nm * sizeof(float)) : NULL;
    const float *ds = ok ? (const float *)dev_const(scale, (post ? 3 : 1) * sizeof(float)) : NULL;
    const float *dhw = ok && h && hw ? (const float *)dev_const(hw, (size_t)D * sizeof(float)) : NULL;
    const float *dX = ok ? (const float *)in_buf(X, (size_t)T * nd * sizeof(float)) : NULL;
    float *dpre = ok ? (float *)out_buf(pre, bp, 1) : NULL, *dh = ok && h ? (float *)out_buf(h, bh, 1) : NULL;
    float *dpost = ok && post ? (float *)out_buf(post, bp, 1) : NULL;
    float *dcomb = ok && post ? (float *)out_buf(comb, bc, 1) : NULL;
    int nsp = (int)cdiv(nd, HC_SPAN);
    float *part = ok ? hc_parts((size_t)T * (nm + 1) * nsp) : NULL;
    if (dfn && db && ds && dX && dpre && part && (dh || !h) && (dhw || !h || !hw) && (!post || (dpost && dcomb))) {
        prof_split("hc_pre: host part");
        launch_k(k_hc_mix, dim3((unsigned)T, (unsigned)nm + 1, (unsigned)nsp), NB, 0, stream, dX, nd, dfn, nm, part);
        prof_split("hc_pre: mixes");
        launch_k(k_hc_pre, T, NB, 0, stream, dX, n, D, part, nsp, db, ds, iters, hc_eps, norm_eps, dpre, dpost, dcomb, dh,
                 dhw);
        if (dhw && D > NB * RMS_V && launched("hc_pre"))
            launch_k(k_rmsnorm, (unsigned)T, NB, 0, stream, (const float *)dh, D, dhw, norm_eps, dh);
        if (launched("hc_pre")) {
            out_back(pre, dpre, bp);
            out_back(h, dh, bh); /* h NULL: the mixes only (V4.1 collapses with another site's pre) */
            if (post) {
                out_back(post, dpost, bp);
                out_back(comb, dcomb, bc);
            }
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

/* X[k] = post[k] y + sum_j comb[j][k] X[j]: one thread per (row, channel), all n streams. */
__global__ void k_hc_post(float *X, const float *y, int T, int n, int D, const float *post, const float *comb)
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
        x[(int64_t)k * D + dd] = s;
    }
}

static void cu_hc_post(float *X, const float *y, int T, int n, int D, const float *post, const float *comb)
{
    if (T <= 0)
        return;
    int64_t nd = (int64_t)n * D;
    size_t bX = (size_t)T * nd * sizeof(float);
    op_begin();
    int ok = n <= HC_MAXN;
    if (!ok)
        fail(DSV4_E_UNSUPPORTED, "cuda: hc_post: %d streams, the kernel holds at most %d", n, HC_MAXN);
    float *dX = ok ? (float *)in_buf(X, bX) : NULL;
    const float *dy = ok ? (const float *)in_buf(y, (size_t)T * D * sizeof(float)) : NULL;
    const float *dpo = ok ? (const float *)in_buf(post, (size_t)T * n * sizeof(float)) : NULL;
    const float *dc = ok ? (const float *)in_buf(comb, (size_t)T * n * n * sizeof(float)) : NULL;
    bool ran = dX && dy && dpo && dc;
    if (ran)
        launch_k(k_hc_post, (unsigned)cdiv((int64_t)T * D, 256), 256, 0, stream, dX, dy, T, n, D, dpo, dc);
    finish(ran, "hc_post", X, dX, bX);
    op_end();
}

/* ---- attend: one block per head ---------------------------------------------------------- */

/* q [H, d], keys [nk, d] (K = V), sink [H], p [H, nk] scratch, out [H, d]; attend_head's
 * order. */
__global__ void __launch_bounds__(NB) k_attend(const float *q, int d, const float *keys, int nk, float scale,
                                               const float *sink, float *p_all, float *out)
{
    PDL_WAIT();
    __shared__ float sh[NW + 1], part[NW * ATT_MAXD];
    int h = blockIdx.x;
    auto key = [&](int i) { return keys + (int64_t)i * d; };
    attend_head<NW>(q + (int64_t)h * d, key, nk, d, scale, sink[h], p_all + (int64_t)h * nk, sh, part, out + (int64_t)h * d);
}

static float *g_keys;           /* host staging for the gathered key rows */
static size_t g_keys_cap;

static void cu_attend(const float *q, int H, int d, const float *const *keys, int nk, float scale, const float *sink,
                      float *out)
{
    if (H <= 0 || d <= 0)
        return;
    size_t bo = (size_t)H * d * sizeof(float);
    op_begin();
    size_t kb = (size_t)(nk > 0 ? nk : 1) * d * sizeof(float);
    if (kb > g_keys_cap) {
        float *nkeys = (float *)realloc(g_keys, kb);
        if (nkeys) {
            g_keys = nkeys;
            g_keys_cap = kb;
        }
    }
    int ok = kb <= g_keys_cap;
    if (!ok)
        fail(DSV4_E_NOMEM, "cuda: attend: out of host memory staging %d keys", nk);
    for (int i = 0; ok && i < nk; i++)
        memcpy(g_keys + (size_t)i * d, keys[i], d * sizeof(float));
    const float *ds = ok ? (const float *)dev_const(sink, H * sizeof(float)) : NULL;
    const float *dq = ok ? (const float *)in_buf(q, bo) : NULL;
    float *dk = ok ? dev_in(g_keys, nk, d, d) : NULL;
    float *dp = ok ? (float *)scratch((size_t)H * (nk > 0 ? nk : 1) * sizeof(float)) : NULL;
    float *dout = ok ? (float *)out_buf(out, bo, 1) : NULL;
    bool ran = ds && dq && dk && dp && dout;
    if (ran)
        launch_k(k_attend, H, NB, 0, stream, dq, d, dk, nk, scale, ds, dp, dout);
    finish(ran, "attend", out, dout, bo);
    op_end();
}

/* ---- swiglu ------------------------------------------------------------------------------- */

/* silu(min(a, limit)) * clamp(b, -limit, limit) (limit <= 0: no clamp), as the CPU's swiglu. */
__device__ __forceinline__ float swiglu1(float a, float b, float limit)
{
    if (limit > 0) {
        a = fminf(a, limit);
        b = fminf(fmaxf(b, -limit), limit);
    }
    return a / (1.0f + expf(-a)) * b;
}

__global__ void k_swiglu(const float *g, const float *u, int64_t n, float limit, float *h)
{
    PDL_WAIT();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        h[i] = swiglu1(g[i], u[i], limit);
}

/* An elementwise op of two [n] inputs a, b into y (which may alias either): k(a, b, n,
 * extra..., y) over device views of the buffers. */
template <class K, class... A>
static void two_inputs(K k, const char *what, const float *a, const float *b, int64_t n, float *y, A... extra)
{
    if (n <= 0)
        return;
    size_t by = (size_t)n * sizeof(float);
    op_begin_at(what);
    const float *da = (const float *)in_buf(a, by), *db = (const float *)in_buf(b, by);
    float *dy = (float *)out_buf(y, by, y != a && y != b);
    bool ran = da && db && dy;
    if (ran)
        launch_k(k, (unsigned)cdiv(n, 256), 256, 0, stream, da, db, n, extra..., dy);
    finish(ran, what, y, dy, by);
    op_end();
}

static void cu_swiglu(const float *g, const float *u, int64_t n, float limit, float *h)
{
    two_inputs(k_swiglu, "swiglu", g, u, n, h, limit);
}

/* ---- embedding: one thread per (row, channel), the element decoded as linear's element path
 * decodes it (exact for every stored form), written to all n streams ---------------------- */

__global__ void k_embed(wdev w, const int32_t *ids, int n, float *X)
{
    __shared__ float lut4[16];
    PDL_WAIT();
    if (threadIdx.x < 16)
        lut4[threadIdx.x] = c_e2m1[threadIdx.x];
    __syncthreads();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (i >= w.k)
        return;
    float v = decode1(w, __ldg(ids + t), i, lut4), *x = X + t * n * w.k + i;
    for (int s = 0; s < n; s++)
        x[(int64_t)s * w.k] = v;
}

/* The table is read where the memory plan put it (device memory, or pinned host memory when
 * it did not fit: a step reads T rows of it, so the host link costs little). */
static void cu_embed(const dsv4_weight *w, const int32_t *ids, int T, int n, float *X)
{
    if (T <= 0 || n <= 0)
        return;
    op_begin();
    size_t b = (size_t)T * n * w->k * sizeof(float);
    int ok = w->form < DSV4_WF_EXL3 && T <= 65535;
    if (!ok)
        fail(DSV4_E_UNSUPPORTED, "cuda: embedding %s: %s table, %d rows: no CUDA lookup for it", w->name ? w->name : "?",
             dsv4_wform_name(w->form), T);
    const void *q = ok ? dev_const(w->data, data_bytes(w)) : NULL;
    const void *s = ok && w->scale ? dev_const(w->scale, scale_bytes(w)) : NULL;
    const int32_t *di = ok ? (const int32_t *)in_buf(ids, (size_t)T * sizeof(int32_t)) : NULL;
    float *dX = ok ? (float *)out_buf(X, b, 1) : NULL;
    bool ran = q && (s || !w->scale) && di && dX;
    if (ran)
        launch_k(k_embed, dim3((unsigned)cdiv(w->k, NB), (unsigned)T), NB, 0, stream, wdev_of(w, q, s), di, n, dX);
    finish(ran, "embed", X, dX, b);
    op_end();
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

static void cu_hc_collapse(const float *X, int T, int n, int D, const float *pre, float *h)
{
    if (T <= 0)
        return;
    int64_t nd = (int64_t)n * D;
    size_t bh = (size_t)T * D * sizeof(float);
    op_begin();
    const float *dX = (const float *)in_buf(X, (size_t)T * nd * sizeof(float));
    const float *dp = (const float *)in_buf(pre, (size_t)T * n * sizeof(float));
    float *dh = (float *)out_buf(h, bh, 1);
    bool ran = dX && dp && dh;
    if (ran)
        launch_k(k_hc_collapse, (unsigned)cdiv((int64_t)T * D, 256), 256, 0, stream, dX, T, n, D, dp, dh);
    finish(ran, "hc_collapse", h, dh, bh);
    op_end();
}

/* ---- routed experts ----------------------------------------------------------------- */

/* The per-expert weight parameters of one weights array (a layer's w1, w2 or w3) in device
 * memory, built once and found again by the array's host address; rebuilt after any drop
 * (the device copies may have moved). */
struct xtab {
    const dsv4_weight *host;
    int E;
    unsigned gen;
    wdev *dev;
};
static xtab *g_xt;
static int g_nxt, g_capxt;
static cudaStream_t g_side;     /* non-blocking: table uploads that must not touch the op stream */

static const wdev *expert_table(const dsv4_weight *w, int E, int K)
{
    for (int i = 0; i < g_nxt; i++)
        if (g_xt[i].host == w && g_xt[i].E == E) {
            if (g_xt[i].gen == g_drops)
                return g_xt[i].dev;
            /* stale: the old table may still be read by queued work, so it is not freed here */
            g_xt[i] = g_xt[--g_nxt];
            break;
        }
    const dsv4_weight *a = &w[0];
    wdev *h = (wdev *)malloc((size_t)E * sizeof(wdev));
    if (!h) {
        fail(DSV4_E_NOMEM, "cuda: experts: out of host memory for an expert table");
        return NULL;
    }
    for (int e = 0; e < E; e++) {
        const dsv4_weight *b = &w[e];
        if (b->form != a->form || b->n != a->n || b->k != a->k || b->bn != a->bn || b->bk != a->bk ||
            b->scale_e8m0 != a->scale_e8m0 || (b->scale == NULL) != (a->scale == NULL) || b->form >= DSV4_WF_EXL3) {
            fail(DSV4_E_UNSUPPORTED, "cuda: experts: weight %s differs from %s in form, shape or blocks",
                 b->name ? b->name : "?", a->name ? a->name : "?");
            free(h);
            return NULL;
        }
        resident *rq = find(b->data), *rs = b->scale ? find(b->scale) : NULL;
        if (!rq || (b->scale && !rs)) {
            fail(DSV4_E_ARG, "cuda: experts: weight %s is not on the device (dsv4_cuda_put_weight or pin_weight first)",
                 b->name ? b->name : "?");
            free(h);
            return NULL;
        }
        h[e] = wdev_of_n(b, rq->dev, rs ? rs->dev : NULL, K);
    }
    wdev *d = NULL;
    if (!g_side && CK(cudaStreamCreateWithFlags(&g_side, cudaStreamNonBlocking))) {
        free(h);
        return NULL;
    }
    if (CK(cudaMalloc((void **)&d, (size_t)E * sizeof(wdev))) ||
        CK(cudaMemcpyAsync(d, h, (size_t)E * sizeof(wdev), cudaMemcpyHostToDevice, g_side)) ||
        CK(cudaStreamSynchronize(g_side))) {
        free(h);
        return NULL;
    }
    free(h);
    if (g_nxt == g_capxt) {
        int nc = g_capxt ? 2 * g_capxt : 64;
        xtab *n = (xtab *)realloc(g_xt, (size_t)nc * sizeof(xtab));
        if (!n) {
            fail(DSV4_E_NOMEM, "cuda: experts: out of host memory for the expert tables");
            return NULL;
        }
        g_xt = n;
        g_capxt = nc;
    }
    g_xt[g_nxt++] = xtab{w, E, g_drops, d};
    return d;
}

/* The (row, k) pairs grouped by expert, stable by pair index: cnt/off per expert, ord the
 * pairs in expert order, tiles of up to `tile` pairs of one expert as (expert, first, rows).
 * One block of EX_SORT threads, E <= EX_SORT; pairs with an expert outside 0..E-1 are left out. */
enum { EX_SORT = 1024 };

__global__ void __launch_bounds__(EX_SORT) k_ex_sort(const int32_t *eid, int RK, int E, int tile, int *cnt, int *off,
                                                     int *ord, int *tiles, int *ntiles)
{
    PDL_WAIT();
    /* counts and offsets in shared memory */
    extern __shared__ int sm[];
    int *scnt = sm, *soff = sm + E, *chunk = sm + 2 * E;
    if (threadIdx.x < E)
        scnt[threadIdx.x] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < RK; i += EX_SORT) {
        int e = eid[i];
        if (e >= 0 && e < E)
            atomicAdd(&scnt[e], 1);
    }
    __syncthreads();
    { /* thread e: its pairs' and tiles' offsets by a block scan, then its tiles */
        __shared__ int wsum[2][EX_SORT / 32];
        int e = threadIdx.x, lane = e & 31, wid = e >> 5;
        int c = e < E ? scnt[e] : 0, nt = (c + tile - 1) / tile, ic = c, it = nt;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            int a = __shfl_up_sync(0xffffffffu, ic, o), b = __shfl_up_sync(0xffffffffu, it, o);
            if (lane >= o)
                ic += a, it += b;
        }
        if (lane == 31)
            wsum[0][wid] = ic, wsum[1][wid] = it;
        __syncthreads();
        if (wid == 0) {
            int a = wsum[0][lane], b = wsum[1][lane];
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                int pa = __shfl_up_sync(0xffffffffu, a, o), pb = __shfl_up_sync(0xffffffffu, b, o);
                if (lane >= o)
                    a += pa, b += pb;
            }
            wsum[0][lane] = a, wsum[1][lane] = b;
        }
        __syncthreads();
        int o = ic - c + (wid ? wsum[0][wid - 1] : 0), t0 = it - nt + (wid ? wsum[1][wid - 1] : 0);
        if (e < E)
            soff[e] = o;
        for (int k = 0; k < nt; k++) {
            tiles[3 * (t0 + k)] = e;
            tiles[3 * (t0 + k) + 1] = o + k * tile;
            tiles[3 * (t0 + k) + 2] = min(tile, c - k * tile);
        }
        if (e == EX_SORT - 1)
            *ntiles = wsum[1][EX_SORT / 32 - 1];
    }
    __syncthreads();
    if (threadIdx.x < E) {
        cnt[threadIdx.x] = scnt[threadIdx.x];
        off[threadIdx.x] = soff[threadIdx.x];
    }
    /* thread e places expert e's pairs in pair order */
    int e = threadIdx.x, at = e < E ? soff[e] : 0;
    for (int c0 = 0; c0 < RK; c0 += EX_SORT) {
        __syncthreads();
        if (c0 + threadIdx.x < RK)
            chunk[threadIdx.x] = eid[c0 + threadIdx.x];
        __syncthreads();
        int n = min(EX_SORT, RK - c0);
        if (e < E)
            for (int i = 0; i < n; i++)
                if (chunk[i] == e)
                    ord[at++] = c0 + i;
    }
}

/* W1 (z = 0, into G) and W3 (z = 1, into U) of each tile's expert over the tile's x rows:
 * block (tile, row block, z). Blocks past the tile count exit. */
template <int F, bool VEC, int TT>
__global__ void __launch_bounds__(LIN_WARPS * 32, VEC && TT == 1 ? 4 : 1) k_ex_up(const wdev *t1, const wdev *t3, const int *tiles,
                                                         const int *ntiles, const int *ord, const float *x, float *G,
                                                         float *U, int K, int D, int I)
{
    PDL_WAIT();
    int tl = blockIdx.x;
    if (tl >= *ntiles)
        return;
    int e = tiles[3 * tl], s0 = tiles[3 * tl + 1], n = tiles[3 * tl + 2];
    wdev w = blockIdx.z ? t3[e] : t1[e];
    pair_map m = {x, blockIdx.z ? U : G, ord + s0, K, D, I};
    linear_rows<F, VEC, TT>(w, 0, I, m, n, blockIdx.y);
}

/* W2 of each tile's expert over the tile's h rows (G), into Y. */
template <int F, bool VEC, int TT>
__global__ void __launch_bounds__(LIN_WARPS * 32, VEC && TT == 1 ? 4 : 1) k_ex_down(const wdev *t2, const int *tiles, const int *ntiles,
                                                           const int *ord, const float *G, float *Y, int D, int I)
{
    PDL_WAIT();
    int tl = blockIdx.x;
    if (tl >= *ntiles)
        return;
    int e = tiles[3 * tl], s0 = tiles[3 * tl + 1], n = tiles[3 * tl + 2];
    wdev w = t2[e];
    pair_map m = {G, Y, ord + s0, 1, I, D};
    linear_rows<F, VEC, TT>(w, 0, D, m, n, blockIdx.y);
}

/* h = swiglu(g, u), times the pair's weight when pre_weight; into G. */
__global__ void k_ex_act(float *G, const float *U, const float *wts, int64_t n, int I, float limit, int pre_weight)
{
    PDL_WAIT();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float h = swiglu1(G[i], U[i], limit);
    if (pre_weight)
        h *= wts[i / I];
    G[i] = h;
}

/* y_r = sum over k in order of (pre_weight ? 1 : w_rk) Y_rk; a pair with no valid expert
 * makes its row NaN. */
__global__ void k_ex_sum(const float *Y, const float *wts, const int32_t *eid, int E, int K, int D, int64_t n,
                         int pre_weight, float *y)
{
    PDL_WAIT();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    int64_t r = i / D;
    int dd = (int)(i % D);
    float s = 0.0f;
    for (int k = 0; k < K; k++) {
        int64_t pr = r * K + k;
        int e = eid[pr];
        float v = Y[pr * D + dd];
        if (e < 0 || e >= E)
            v = __int_as_float(0x7fc00000);
        s = fmaf(pre_weight ? 1.0f : wts[pr], v, s);
    }
    y[i] = s;
}

template <int F>
static void launch_experts(const dsv4_experts_args *a, const wdev *t1, const wdev *t2, const wdev *t3, bool vec1,
                           bool vec2, int tile, int NT, const int *tiles, const int *ntiles, const int *ord, float *G,
                           float *U, float *Y)
{
    const dsv4_weight *w1 = &a->w1[0], *w2 = &a->w2[0];
    int wpr1 = wdev_of_n(w1, NULL, NULL, a->K).wpr, wpr2 = wdev_of_n(w2, NULL, NULL, a->K).wpr;
    int rpb1 = vec1 ? LIN_WARPS / wpr1 * chunk_shape(F).R : LIN_WARPS;
    int rpb2 = vec2 ? LIN_WARPS / wpr2 * chunk_shape(F).R : LIN_WARPS;
    dim3 g1((unsigned)NT, (unsigned)cdiv(a->I, rpb1), 2), g2((unsigned)NT, (unsigned)cdiv(a->D, rpb2));
    int K = a->K, D = a->D, I = a->I;
    if (tile == 1 && vec1)
        launch_k(k_ex_up<F, true, 1>, g1, LIN_WARPS * 32, 0, stream, t1, t3, tiles, ntiles, ord, a->x, G, U, K, D, I);
    else if (vec1)
        launch_k(k_ex_up<F, true, LIN_TT>, g1, LIN_WARPS * 32, 0, stream, t1, t3, tiles, ntiles, ord, a->x, G, U, K, D, I);
    else
        launch_k(k_ex_up<F, false, LIN_TT>, g1, LIN_WARPS * 32, 0, stream, t1, t3, tiles, ntiles, ord, a->x, G, U, K, D, I);
    if (!launched("experts w1/w3"))
        return;
    prof_split("experts: w1, w3");
    int64_t nh = (int64_t)a->R * K * I;
    launch_k(k_ex_act, (unsigned)cdiv(nh, 256), 256, 0, stream, G, U, a->wts, nh, I, a->limit, a->pre_weight);
    if (!launched("experts swiglu"))
        return;
    prof_split("experts: swiglu");
    if (tile == 1 && vec2)
        launch_k(k_ex_down<F, true, 1>, g2, LIN_WARPS * 32, 0, stream, t2, tiles, ntiles, ord, G, Y, D, I);
    else if (vec2)
        launch_k(k_ex_down<F, true, LIN_TT>, g2, LIN_WARPS * 32, 0, stream, t2, tiles, ntiles, ord, G, Y, D, I);
    else
        launch_k(k_ex_down<F, false, LIN_TT>, g2, LIN_WARPS * 32, 0, stream, t2, tiles, ntiles, ord, G, Y, D, I);
    launched("experts w2");
    prof_split("experts: w2");
}

/* Up to this many pairs, each pair is its own tile (the T = 1 build, as a decode step's linear
 * runs); above, tiles of up to LIN_TT rows of one expert share the expert's weight reads. */
enum { EX_SOLO_PAIRS = 64 };

static void experts_run(const dsv4_experts_args *a);
static void cu_linear(const dsv4_weight *w, int64_t r0, int64_t r1, const float *x, int T, int64_t ldx, float *y,
                      int64_t ldy);

/* Whether every expert of w has the first one's storage form, shape and blocks, of a form the
 * grouped kernels take. */
static bool experts_uniform(const dsv4_weight *w, int E)
{
    for (int e = 0; e < E; e++)
        if (w[e].form != w[0].form || w[e].n != w[0].n || w[e].k != w[0].k || w[e].bn != w[0].bn ||
            w[e].bk != w[0].bk || w[e].scale_e8m0 != w[0].scale_e8m0 || (w[e].scale == NULL) != (w[0].scale == NULL) ||
            w[e].form >= DSV4_WF_EXL3)
            return false;
    return true;
}

__global__ void k_scale_rows(float *g, int64_t n, int I, const float *w)
{
    PDL_WAIT();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        g[i] *= w[i / I];
}

/* Experts of mixed storage forms (EXL3 packs, partly quantized checkpoints): the step waits for
 * the routing, and each used expert's rows go through the linear op together, as the CPU
 * groups them; then the grouped path's combine. Not recordable (it reads eid on the host). */
static void experts_by_expert(const dsv4_experts_args *a)
{
    int R = a->R, K = a->K, D = a->D, I = a->I, E = a->E, RK = R * K;
    size_t by = (size_t)R * D * sizeof(float), rkb = (size_t)RK * sizeof(float);
    if (capturing) {
        pthread_mutex_lock(&dsv4cu::lock);
        fail(DSV4_E_UNSUPPORTED, "cuda: experts of mixed storage forms route on the host (not recordable)");
        pthread_mutex_unlock(&dsv4cu::lock);
        return;
    }
    int32_t *eid = (int32_t *)malloc(RK * sizeof(int32_t));
    int *rows = (int *)malloc(RK * sizeof(int));
    float *wsel = (float *)malloc(rkb), *hw = (float *)malloc(rkb);
    float *xd = NULL, *xb = NULL, *g = NULL, *u = NULL, *yb = NULL, *Y = NULL, *dw = NULL, *yd = NULL;
    int32_t *de = NULL;
    bool ok = eid && rows && wsel && hw && !CK(cudaMalloc((void **)&xb, (size_t)RK * D * sizeof(float))) &&
              !CK(cudaMalloc((void **)&g, (size_t)RK * I * sizeof(float))) &&
              !CK(cudaMalloc((void **)&u, (size_t)RK * I * sizeof(float))) &&
              !CK(cudaMalloc((void **)&yb, (size_t)RK * D * sizeof(float))) &&
              !CK(cudaMalloc((void **)&Y, (size_t)RK * D * sizeof(float))) && !CK(cudaMalloc((void **)&dw, 2 * rkb)) &&
              !CK(cudaMalloc((void **)&de, (size_t)RK * sizeof(int32_t))) && !CK(cudaMalloc((void **)&xd, by)) &&
              !CK(cudaMalloc((void **)&yd, by));
    ok = ok && !CK(cudaMemcpyAsync(eid, a->eid, RK * sizeof(int32_t), cudaMemcpyDefault, stream)) &&
         !CK(cudaMemcpyAsync(hw, a->wts, rkb, cudaMemcpyDefault, stream)) &&
         !CK(cudaMemcpyAsync(xd, a->x, by, cudaMemcpyDefault, stream)) && !CK(cudaStreamSynchronize(stream));
    for (int e = 0; e < E && ok; e++) {
        int n = 0;
        for (int i = 0; i < RK; i++)
            if (eid[i] == e) {
                rows[n] = i;
                wsel[n++] = hw[i];
                ok = ok && !CK(cudaMemcpyAsync(xb + (size_t)(n - 1) * D, xd + (size_t)(i / K) * D, D * sizeof(float),
                                               cudaMemcpyDeviceToDevice, stream));
            }
        if (!n || !ok)
            continue;
        cu_linear(&a->w1[e], 0, I, xb, n, D, g, I);
        cu_linear(&a->w3[e], 0, I, xb, n, D, u, I);
        cu_swiglu(g, u, (int64_t)n * I, a->limit, g);
        if (a->pre_weight) {
            ok = ok && !CK(cudaMemcpyAsync(dw, wsel, n * sizeof(float), cudaMemcpyHostToDevice, stream));
            launch_k(k_scale_rows, (unsigned)cdiv((int64_t)n * I, 256), 256, 0, stream, g, (int64_t)n * I, I, dw);
            ok = ok && !CK(cudaStreamSynchronize(stream));
        }
        cu_linear(&a->w2[e], 0, D, g, n, I, yb, D);
        for (int i = 0; i < n && ok; i++)
            ok = !CK(cudaMemcpyAsync(Y + (size_t)rows[i] * D, yb + (size_t)i * D, D * sizeof(float),
                                     cudaMemcpyDeviceToDevice, stream));
    }
    ok = ok && !CK(cudaMemcpyAsync(de, eid, RK * sizeof(int32_t), cudaMemcpyHostToDevice, stream)) &&
         !CK(cudaMemcpyAsync(dw + RK, hw, rkb, cudaMemcpyHostToDevice, stream));
    if (ok) {
        launch_k(k_ex_sum, (unsigned)cdiv((int64_t)R * D, 256), 256, 0, stream, Y, dw + RK, de, E, K, D, (int64_t)R * D,
                                                                           a->pre_weight, yd);
        ok = !CK(cudaMemcpyAsync(a->y, yd, by, cudaMemcpyDefault, stream)) && !CK(cudaStreamSynchronize(stream));
    }
    if (!ok) {
        pthread_mutex_lock(&dsv4cu::lock);
        fail(DSV4_E_DEVICE, "cuda: experts of mixed storage forms failed");
        out_fail(a->y, by);
        pthread_mutex_unlock(&dsv4cu::lock);
    }
    cudaStreamSynchronize(stream); /* the temporaries are read by queued copies */
    cudaFree(xd), cudaFree(xb), cudaFree(g), cudaFree(u), cudaFree(yb), cudaFree(Y), cudaFree(dw), cudaFree(de), cudaFree(yd);
    free(eid), free(rows), free(wsel), free(hw);
}

/* Host buffers (the V4.1 forward keeps its activations on the host) are copied in, the op
 * runs on device copies, and y is copied back. */
static void cu_experts(const dsv4_experts_args *a)
{
    if (a->R <= 0 || a->D <= 0)
        return;
    if (!experts_uniform(a->w1, a->E) || !experts_uniform(a->w2, a->E) || !experts_uniform(a->w3, a->E) ||
        a->w1[0].form != a->w2[0].form || a->w1[0].form != a->w3[0].form) {
        experts_by_expert(a);
        return;
    }
    op_begin();
    if (on_dev(a->x) && on_dev(a->y) && on_dev(a->eid) && on_dev(a->wts) && on_dev(a->work)) {
        experts_run(a);
        op_end();
        return;
    }
    size_t RK = (size_t)a->R * a->K, by = (size_t)a->R * a->D * sizeof(float);
    dsv4_experts_args d = *a;
    d.x = (const float *)in_buf(a->x, by);
    d.eid = (const int32_t *)in_buf(a->eid, RK * sizeof(int32_t));
    d.wts = (const float *)in_buf(a->wts, RK * sizeof(float));
    d.y = (float *)out_buf(a->y, by, 1);
    d.work = on_dev(a->work) ? a->work : (float *)scratch(DSV4_EXPERTS_WORK(a->R, a->K, a->D, a->I, a->E) * sizeof(float));
    if (!d.x || !d.eid || !d.wts || !d.y || !d.work) {
        out_fail(a->y, by);
        op_end();
        return;
    }
    experts_run(&d);
    if (!errp()->code)
        out_back(a->y, d.y, by);
    op_end();
}

/* The op on device buffers, inside op_begin/op_end. */
static void experts_run(const dsv4_experts_args *a)
{
    int R = a->R, K = a->K, D = a->D, I = a->I, E = a->E;
    size_t by = (size_t)R * D * sizeof(float);
    int64_t RK = (int64_t)R * K;
    int ok = 1;
    if (a->ref) {
        fail(DSV4_E_DEVICE, "cuda: experts: REF numerics run on the CPU");
        ok = 0;
    } else if (K <= 0 || I <= 0 || E <= 0 || E > EX_SORT || RK > INT32_MAX / 4) {
        fail(DSV4_E_ARG, "cuda: experts: bad shape R=%d K=%d D=%d I=%d E=%d (at most %d experts)", R, K, D, I, E,
             (int)EX_SORT);
        ok = 0;
    } else if (a->w1[0].n != I || a->w1[0].k != D || a->w3[0].n != I || a->w3[0].k != D || a->w2[0].n != D ||
               a->w2[0].k != I || a->w1[0].form != a->w2[0].form || a->w1[0].form != a->w3[0].form) {
        fail(DSV4_E_ARG, "cuda: experts: weights are not [I, D], [D, I], [I, D] of one form");
        ok = 0;
    }
    const wdev *t1 = ok ? expert_table(a->w1, E, K) : NULL, *t2 = ok ? expert_table(a->w2, E, K) : NULL;
    const wdev *t3 = ok ? expert_table(a->w3, E, K) : NULL;
    bool vec1 = ok && vec_ok(&a->w1[0]) && vec_ok(&a->w3[0]), vec2 = ok && vec_ok(&a->w2[0]);
    if (t1 && t2 && t3 && (vec1 || vec2) &&
        (((uintptr_t)a->x & 15) || ((uintptr_t)a->work & 15) || (vec1 && D % 4) || (vec2 && I % 4))) {
        fail(DSV4_E_ARG, "cuda: experts: x and work must be 16-byte aligned");
        t1 = NULL;
    }
    if (t1 && t2 && t3) {
        int tile = RK <= EX_SOLO_PAIRS ? 1 : LIN_TT;
        int64_t NT = tile == 1 ? RK : (RK / tile + E < RK ? RK / tile + E : RK);
        float *G = a->work, *U = G + RK * I, *Y = U + RK * I;
        int *ord = (int *)(Y + RK * D), *tiles = ord + RK, *cnt = tiles + 3 * NT, *off = cnt + E, *ntiles = off + E;
        if (dsv4cu::poison)
            CK(cudaMemsetAsync(a->y, 0xff, by, stream));
        prof_split("experts: host part");
        launch_k(k_ex_sort, 1, EX_SORT, (2 * (size_t)E + EX_SORT) * sizeof(int), stream, a->eid, (int)RK, E, tile, cnt, off, ord, tiles, ntiles);
        prof_split("experts: grouping");
        if (launched("experts grouping")) {
            switch (a->w1[0].form) {
            case DSV4_WF_F32: launch_experts<DSV4_WF_F32>(a, t1, t2, t3, vec1, vec2, tile, (int)NT, tiles, ntiles, ord, G, U, Y); break;
            case DSV4_WF_BF16: launch_experts<DSV4_WF_BF16>(a, t1, t2, t3, vec1, vec2, tile, (int)NT, tiles, ntiles, ord, G, U, Y); break;
            case DSV4_WF_F16: launch_experts<DSV4_WF_F16>(a, t1, t2, t3, vec1, vec2, tile, (int)NT, tiles, ntiles, ord, G, U, Y); break;
            case DSV4_WF_FP8: launch_experts<DSV4_WF_FP8>(a, t1, t2, t3, vec1, vec2, tile, (int)NT, tiles, ntiles, ord, G, U, Y); break;
            default: launch_experts<DSV4_WF_FP4>(a, t1, t2, t3, vec1, vec2, tile, (int)NT, tiles, ntiles, ord, G, U, Y); break;
            }
            launch_k(k_ex_sum, (unsigned)cdiv((int64_t)R * D, 256), 256, 0, stream, Y, a->wts, a->eid, E, K, D,
                                                                               (int64_t)R * D, a->pre_weight, a->y);
            if (launched("experts sum") && !errp()->code)
                return;
        }
    }
    out_fail(a->y, by);
}

/* ---- add, memory ------------------------------------------------------------------------ */

__global__ void k_add(const float *a, const float *b, int64_t n, float *y)
{
    PDL_WAIT();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = a[i] + b[i];
}

static void cu_add(const float *a, const float *b, int64_t n, float *y) { two_inputs(k_add, "add", a, b, n, y); }

static void *cu_alloc(size_t bytes)
{
    void *p = NULL;
    pthread_mutex_lock(&dsv4cu::lock);
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError(); /* out of memory is the caller's to handle (NULL) */
        p = NULL;
    } else if (CK(cudaMemsetAsync(p, 0, bytes, stream))) {
        cudaFree(p);
        p = NULL;
    }
    pthread_mutex_unlock(&dsv4cu::lock);
    return p;
}

static void cu_free(void *p)
{
    if (p)
        cudaFree(p);
}

static void cu_upload(void *dst, const void *host, size_t bytes)
{
    if (!bytes)
        return;
    pthread_mutex_lock(&dsv4cu::lock);
    /* pageable memory is staged before the call returns; pinned memory is read later, so wait
     * for it (the caller may reuse its buffer at once) */
    if (!CK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyDefault, stream)) && !capturing) {
        cudaPointerAttributes at;
        if (cudaPointerGetAttributes(&at, host) == cudaSuccess && at.type == cudaMemoryTypeHost)
            CK(cudaStreamSynchronize(stream));
        cudaGetLastError();
    }
    pthread_mutex_unlock(&dsv4cu::lock);
}

static void cu_download(void *host, const void *src, size_t bytes)
{
    if (!bytes)
        return;
    pthread_mutex_lock(&dsv4cu::lock);
    if (CK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDefault, stream)) || CK(cudaStreamSynchronize(stream)))
        memset(host, 0xff, bytes);
    pthread_mutex_unlock(&dsv4cu::lock);
}

static void cu_copy(void *dst, const void *src, size_t bytes)
{
    if (!bytes || dst == src)
        return;
    pthread_mutex_lock(&dsv4cu::lock);
    CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
    pthread_mutex_unlock(&dsv4cu::lock);
}

/* ---- graphs: the op stream captured between graph_begin and graph_end ------------------- */

static int cu_graph_begin(void)
{
    pthread_mutex_lock(&dsv4cu::lock);
    int rc = 0;
    dsv4_err_clear(&g_cap_err);
    if (capturing)
        rc = dsv4_fail(&g_cap_err, DSV4_E_ARG, "cuda: graph_begin while recording");
    else {
        cudaError_t e = cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed);
        if (e != cudaSuccess)
            rc = dsv4_fail(&g_cap_err, DSV4_E_DEVICE, "cuda: cudaStreamBeginCapture: %s", cudaGetErrorString(e));
        else
            capturing = 1;
    }
    cudaGetLastError();
    pthread_mutex_unlock(&dsv4cu::lock);
    return rc;
}

static void *cu_graph_end(void)
{
    pthread_mutex_lock(&dsv4cu::lock);
    void *ret = NULL;
    if (capturing) {
        cudaGraph_t g = NULL;
        cudaError_t e = cudaStreamEndCapture(stream, &g);
        capturing = 0;
        if (e == cudaSuccess && !g_cap_err.code) {
            cudaGraphExec_t ex = NULL;
            e = cudaGraphInstantiate(&ex, g, 0);
            if (e == cudaSuccess)
                ret = (void *)ex;
        }
        if (e != cudaSuccess && !g_cap_err.code)
            dsv4_fail(&g_cap_err, DSV4_E_DEVICE, "cuda: recording a graph: %s", cudaGetErrorString(e));
        if (g)
            cudaGraphDestroy(g);
        cudaGetLastError(); /* a failed recording leaves nothing behind: the ops run again */
    } else if (!g_cap_err.code)
        dsv4_fail(&g_cap_err, DSV4_E_ARG, "cuda: graph_end without graph_begin");
    pthread_mutex_unlock(&dsv4cu::lock);
    return ret;
}

static void cu_graph_run(void *g)
{
    if (!g)
        return;
    pthread_mutex_lock(&dsv4cu::lock);
    CK(cudaGraphLaunch((cudaGraphExec_t)g, stream));
    pthread_mutex_unlock(&dsv4cu::lock);
}

static void cu_graph_free(void *g)
{
    if (g)
        cudaGraphExecDestroy((cudaGraphExec_t)g);
}

extern "C" const char *dsv4_cuda_graph_why(void) { return g_cap_err.code ? g_cap_err.msg : ""; }

static void cu_attn_step(const dsv4_attn_args *a) { dsv4cu::attn_step(a); }

static void cu_route(const float *lg, int R, int E, int K, const float *bias, const int32_t *tid2eid, const int32_t *ids,
                     int norm, float route_scale, int32_t *eid, float *wts)
{
    dsv4cu::route(lg, R, E, K, bias, tid2eid, ids, norm, route_scale, eid, wts);
}

static dsv4_backend make_table(void)
{
    dsv4_backend t;
    memset(&t, 0, sizeof t);
    t.name = "cuda";
    t.alloc = cu_alloc;
    t.free = cu_free;
    t.upload = cu_upload;
    t.download = cu_download;
    t.copy = cu_copy;
    t.linear = cu_linear;
    t.linear_blocks = cu_linear_blocks;
    t.linear_multi = cu_linear_multi;
    t.embed = cu_embed;
    t.rmsnorm = cu_rmsnorm;
    t.rope = cu_rope;
    t.hc_pre = cu_hc_pre;
    t.hc_collapse = cu_hc_collapse;
    t.hc_post = cu_hc_post;
    t.attend = cu_attend;
    t.attn_step = cu_attn_step;
    t.route = cu_route;
    t.experts = cu_experts;
    t.add = cu_add;
    t.swiglu = cu_swiglu;
    t.graph_begin = cu_graph_begin;
    t.graph_end = cu_graph_end;
    t.graph_run = cu_graph_run;
    t.graph_free = cu_graph_free;
    t.check = cuda_check;
    return t;
}

static const dsv4_backend cuda_backend = make_table();

extern "C" const dsv4_backend *dsv4_backend_cuda(void) { return &cuda_backend; }
