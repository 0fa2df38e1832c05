/* CUDA backend runtime: the device and its stream, the first-error slot and the poison flag,
 * resident copies of weights and constants (found by host address), the op profile, the device
 * views of the constant arrays an op reads, output poisoning and how an op ends, device memory
 * and graphs. The ops themselves are in one file per family. */
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <stdarg.h>
#include <time.h>
#include "kernels/cuda/internal.h"
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
        else if (ordinal >= n)
            rc = dsv4_fail(err, DSV4_E_DEVICE, "device 'cuda': GPU %d asked for, this machine has %d", ordinal, n);
        else {
            cudaDeviceProp p;
            if ((e = cudaSetDevice(ordinal)) != cudaSuccess || (e = cudaGetDeviceProperties(&p, ordinal)) != cudaSuccess)
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

int dsv4cu::cuda_check(dsv4_err *err)
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

resident *dsv4cu::resident_of(const void *host)
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
    if (resident_of(host))
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

unsigned dsv4cu::drops;        /* bumped by every drop: cached expert tables are rebuilt */

extern "C" void dsv4_cuda_drop(const void *host)
{
    pthread_mutex_lock(&dsv4cu::lock);
    drops++;
    resident *r = resident_of(host);
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
size_t dsv4cu::data_bytes(const dsv4_weight *w)
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

size_t dsv4cu::scale_bytes(const dsv4_weight *w)
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

extern "C" size_t dsv4_cuda_host_bytes(const dsv4_weight *w)
{
    if (w->form >= DSV4_WF_EXL3) /* the plan never spills EXL3 */
        return 0;
    size_t b = 0;
    pthread_mutex_lock(&dsv4cu::lock);
    const resident *d = resident_of(w->data), *s = w->scale ? resident_of(w->scale) : NULL;
    if (d && d->pinned)
        b += d->bytes;
    if (s && s->pinned)
        b += s->bytes;
    pthread_mutex_unlock(&dsv4cu::lock);
    return b;
}

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

/* ---- the op profile and the op lock ---------------------------------------------------- */

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

/* ---- what an op reads and writes: device buffers, constants through their resident copies ---- */

/* Whether p is device memory (device or managed). Only a constant array that has no resident
 * copy is asked about (dev_known), never an op's activations: the model places every constant
 * at load, so the ops' common path never pays for the query. */
static int on_dev(const void *p)
{
    cudaPointerAttributes at;
    if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
        cudaGetLastError(); /* not a pointer the runtime knows: host memory */
        return 0;
    }
    return at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged;
}

const void *dsv4cu::dev_known(const void *p)
{
    if (!p)
        return NULL;
    resident *r = resident_of(p);
    if (r)
        return r->dev;
    return on_dev(p) ? p : NULL;
}

const void *dsv4cu::dev_const(const void *p, const char *op, const char *what)
{
    if (!p)
        return NULL;
    const void *d = dev_known(p);
    if (!d)
        fail(DSV4_E_ARG,
             "cuda: %s: %s at %p is host memory that was never placed on the device (dsv4_cuda_put, or the "
             "model's placement list) and is not device memory",
             op, what, p);
    return d;
}

bool dsv4cu::poison_out(void *p, size_t bytes)
{
    return !dsv4cu::poison || !p || !bytes || !CK(cudaMemsetAsync(p, 0xff, bytes, stream));
}

bool dsv4cu::poison_rows(float *p, int64_t rows, int64_t w, int64_t ld)
{
    return !dsv4cu::poison || !p || rows <= 0 || w <= 0 ||
           !CK(cudaMemset2DAsync(p, ld * sizeof(float), 0xff, w * sizeof(float), rows, stream));
}

int dsv4cu::launched(const char *what)
{
    return !failed(cudaGetLastError(), what);
}

bool dsv4cu::given(const char *op, std::initializer_list<const void *> bufs)
{
    for (const void *p : bufs)
        if (!p) {
            fail(DSV4_E_ARG, "cuda: %s: a buffer it reads or writes is NULL", op);
            return false;
        }
    return true;
}

void dsv4cu::out_fail(void *p, size_t bytes)
{
    if (p && bytes) /* NaN bytes; the marking's own failure is kept only when the op kept none */
        failed(cudaMemsetAsync(p, 0xff, bytes, stream), "marking a failed output");
}

void dsv4cu::fail_rows(float *p, int64_t rows, int64_t w, int64_t ld)
{
    if (p && rows > 0 && w > 0)
        failed(cudaMemset2DAsync(p, ld * sizeof(float), 0xff, w * sizeof(float), rows, stream), "marking failed rows");
}

void dsv4cu::finish(bool ran, const char *what, void *p, size_t bytes)
{
    if (!ran || !launched(what))
        out_fail(p, bytes);
}

void dsv4cu::finish_rows(bool ran, const char *what, float *y, int64_t rows, int64_t w, int64_t ld)
{
    if (!ran || !launched(what))
        fail_rows(y, rows, w, ld);
}

float *dsv4cu::grow_buf(growbuf *b, size_t n, size_t want, const char *what)
{
    if (n <= b->n)
        return b->p;
    if (what && capturing) {
        fail(DSV4_E_STATE, "cuda: %s must grow to %zu floats, which a recording cannot", what, n);
        return NULL;
    }
    want = want > n ? want : n;
    float *p = NULL;
    if (CK(cudaMalloc((void **)&p, want * sizeof(float))))
        return NULL;
    b->p = p;
    b->n = want;
    return p;
}

void *dsv4cu::cu_alloc(size_t bytes)
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

void dsv4cu::cu_free(void *p)
{
    if (p)
        cudaFree(p);
}

void dsv4cu::cu_upload(void *dst, const void *host, size_t bytes)
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

void dsv4cu::cu_download(void *host, const void *src, size_t bytes)
{
    if (!bytes)
        return;
    pthread_mutex_lock(&dsv4cu::lock);
    if (CK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDefault, stream)) || CK(cudaStreamSynchronize(stream)))
        memset(host, 0xff, bytes);
    pthread_mutex_unlock(&dsv4cu::lock);
}

void dsv4cu::cu_copy(void *dst, const void *src, size_t bytes)
{
    if (!bytes || dst == src)
        return;
    pthread_mutex_lock(&dsv4cu::lock);
    CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
    pthread_mutex_unlock(&dsv4cu::lock);
}

void dsv4cu::cu_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows)
{
    if (!width || !rows)
        return;
    pthread_mutex_lock(&dsv4cu::lock);
    CK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDefault, stream));
    pthread_mutex_unlock(&dsv4cu::lock);
}

/* ---- graphs: the op stream captured between graph_begin and graph_end ------------------- */

int dsv4cu::cu_graph_begin(void)
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

void *dsv4cu::cu_graph_end(void)
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

void dsv4cu::cu_graph_run(void *g)
{
    if (!g)
        return;
    pthread_mutex_lock(&dsv4cu::lock);
    CK(cudaGraphLaunch((cudaGraphExec_t)g, stream));
    pthread_mutex_unlock(&dsv4cu::lock);
}

void dsv4cu::cu_graph_free(void *g)
{
    if (g)
        cudaGraphExecDestroy((cudaGraphExec_t)g);
}

extern "C" const char *dsv4_cuda_graph_why(void) { return g_cap_err.code ? g_cap_err.msg : ""; }
