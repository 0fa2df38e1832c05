/* bench_cuda — the CUDA linear kernels at V4-Flash shapes (three of V4.1-Flash's, and three
 * EXL3 layers) against the device's bandwidth.
 *
 * Ceilings, on a 2 GiB buffer: cudaMemcpy device-to-device and a plain copy kernel (bytes read
 * + written), and a read-only kernel (bytes read), which is the matvec's own pattern.
 * Per shape: weights resident as stored (random bytes, never zeros), rotated over enough
 * copies (>= 512 MB) that L2 (60 MB) cannot serve them; the launches are captured in a CUDA
 * graph and the replays timed with events (median of 10), so launch gaps stay out.
 * GB/s counts the weight bytes (data + scales) read once per call; activations are ignored
 * (x is <= 32 KB per token). The compute ceilings: mma.sync's rate in bf16 and in e4m3 (the
 * instruction the tensor-core kernels issue; PyTorch's peaks, tests/cuda/peer_torch.py, go
 * through wgmma).
 * Then a batch-1 estimate of V4-Flash decode from its matvecs alone: one CSA layer's
 * projections, 6 routed + 1 shared expert, timed as one graph, times 43, plus the head. */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
extern "C" {
#include "core/core.h"
#include "io/exl3_format.h"
}
#include "kernels/cuda/cuda.h"

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "bench_cuda: %s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t rng_next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void fill_bytes(uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i += 8) {
        uint64_t r = rng_next();
        memcpy(p + i, &r, n - i < 8 ? n - i : 8);
    }
}

static int cmp_f(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* Median ms of `reps` replays of g. */
static float time_graph(cudaGraphExec_t g, cudaStream_t st, int reps)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    float t[32];
    for (int i = 0; i < 3; i++)
        CK(cudaGraphLaunch(g, st));
    for (int i = 0; i < reps; i++) {
        CK(cudaEventRecord(a, st));
        CK(cudaGraphLaunch(g, st));
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&t[i], a, b));
    }
    qsort(t, reps, sizeof t[0], cmp_f);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return t[reps / 2];
}

/* Reads n 16-byte words (four loads in flight a thread); the xor only keeps the loads alive. */
__global__ void k_read(const uint4 *p, size_t n, unsigned *sink)
{
    size_t stride = (size_t)gridDim.x * blockDim.x, i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned acc = 0;
    for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 a = __ldg(p + i), b = __ldg(p + i + stride), c = __ldg(p + i + 2 * stride), d = __ldg(p + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n; i += stride) {
        uint4 a = __ldg(p + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (acc == 0x9e3779b9u)
        *sink = acc;
}

__global__ void k_copy(const uint4 *p, uint4 *q, size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        q[i] = __ldg(p + i);
}

/* The tensor cores' rate through mma.sync, the instruction the kernels use: each warp issues
 * CH independent chains of MMAs on constant operands (bf16 m16n8k16, or with FP8 set e4m3
 * m16n8k32, both with fp32 accumulation) and writes the sums, so nothing is optimised away. */
template <int FP8>
__global__ void k_mma_rate(float *out, int iters)
{
    enum { CH = 8 };
    const uint32_t a = FP8 ? 0x30303030u : 0x3c003c00u, b = FP8 ? 0x30303030u : 0x3c003c00u;
    float acc[CH][4] = {};
    for (int i = 0; i < iters; i++)
#pragma unroll
        for (int c = 0; c < CH; c++) {
            if (FP8)
                asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                             "{%8,%9}, {%0,%1,%2,%3};"
                             : "+f"(acc[c][0]), "+f"(acc[c][1]), "+f"(acc[c][2]), "+f"(acc[c][3])
                             : "r"(a), "r"(a), "r"(a), "r"(a), "r"(b), "r"(b));
            else
                asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                             "{%8,%9}, {%0,%1,%2,%3};"
                             : "+f"(acc[c][0]), "+f"(acc[c][1]), "+f"(acc[c][2]), "+f"(acc[c][3])
                             : "r"(a), "r"(a), "r"(a), "r"(a), "r"(b), "r"(b));
        }
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < CH; c++)
        sum += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
    out[(size_t)blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

/* TFLOP/s of k_mma_rate over every multiprocessor (8 blocks of 4 warps each), median of 10. */
template <int FP8>
static double mma_rate(int sms, cudaStream_t st)
{
    const int blocks = sms * 8, threads = 128, iters = 1024;
    float *out;
    CK(cudaMalloc((void **)&out, (size_t)blocks * threads * sizeof(float)));
    cudaGraph_t gr;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
    k_mma_rate<FP8><<<blocks, threads, 0, st>>>(out, iters);
    CK(cudaStreamEndCapture(st, &gr));
    CK(cudaGraphInstantiate(&ge, gr, 0));
    float ms = time_graph(ge, st, 10);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(gr);
    CK(cudaFree(out));
    double mmas = (double)blocks * (threads / 32) * iters * 8, flops = 2.0 * 16 * 8 * (FP8 ? 32 : 16);
    return mmas * flops / (ms * 1e-3) / 1e12;
}

typedef struct {
    const char *name;
    dsv4_wform form;
    int64_t n, k; /* EXL3: multiples of 128 */
    int bn, bk;   /* EXL3: bn the bits a weight (K), bk the codebook */
} shape;

static size_t data_bytes(const shape *s)
{
    size_t e = (size_t)s->n * s->k;
    return s->form == DSV4_WF_FP8 ? e : s->form == DSV4_WF_FP4 ? e / 2 : s->form == DSV4_WF_EXL3 ? e * s->bn / 8 : e * 2;
}

/* FP8 block and FP4 group scales; EXL3's suh and svh as the device holds them (fp32) */
static size_t scale_bytes(const shape *s)
{
    if (s->form == DSV4_WF_FP8)
        return (size_t)((s->n + s->bn - 1) / s->bn) * ((s->k + s->bk - 1) / s->bk);
    if (s->form == DSV4_WF_EXL3)
        return 4 * (size_t)(s->n + s->k);
    return s->form == DSV4_WF_FP4 ? (size_t)s->n * (s->k / s->bk) : 0;
}

/* An EXL3 record over random trellis words p (any words are a valid trellis), suh and svh
 * random signs times 1/2. */
static dsv4_exl3 *exl3_record(const shape *s, const uint8_t *p)
{
    dsv4_exl3 *e = (dsv4_exl3 *)calloc(1, sizeof *e);
    e->prefix = (char *)s->name;
    e->K = s->bn;
    e->cb = s->bk;
    e->kp = e->k = s->k;
    e->np = e->n = s->n;
    e->trellis = (const uint16_t *)p;
    e->suh = (float *)malloc(s->k * sizeof(float));
    e->svh = (float *)malloc(s->n * sizeof(float));
    for (int64_t i = 0; i < s->k; i++)
        e->suh[i] = (rng_next() & 1) ? 0.5f : -0.5f;
    for (int64_t i = 0; i < s->n; i++)
        e->svh[i] = (rng_next() & 1) ? 0.5f : -0.5f;
    e->bytes = data_bytes(s);
    return e;
}

/* `count` resident copies of a random weight of shape s, in one host block. */
static dsv4_weight *make_copies(const shape *s, int count, uint8_t **block)
{
    size_t db = data_bytes(s), sb = scale_bytes(s), per = (db + sb + 255) & ~(size_t)255;
    uint8_t *h = (uint8_t *)malloc(per * count);
    fill_bytes(h, per * count);
    dsv4_weight *w = (dsv4_weight *)calloc(count, sizeof *w);
    dsv4_err err = {};
    for (int c = 0; c < count; c++) {
        uint8_t *p = h + per * c;
        w[c].name = s->name;
        w[c].form = s->form;
        w[c].n = s->n;
        w[c].k = s->k;
        if (s->form == DSV4_WF_EXL3) {
            w[c].exl3 = exl3_record(s, p);
            w[c].bytes = db;
        } else {
            if (sb) /* e8m0 scales in a sane range: 2^-8 .. 2^7 */
                for (size_t i = 0; i < sb; i++)
                    p[db + i] = (uint8_t)(119 + p[db + i] % 16);
            w[c].data = p;
            w[c].scale = sb ? p + db : NULL;
            w[c].scale_e8m0 = 1;
            w[c].bn = s->bn;
            w[c].bk = s->bk;
            w[c].bytes = db + sb;
        }
        if (dsv4_cuda_put_weight(&w[c], &err)) {
            fprintf(stderr, "bench_cuda: %s\n", err.msg);
            exit(1);
        }
    }
    *block = h;
    return w;
}

static void free_copies(dsv4_weight *w, int count, uint8_t *block)
{
    for (int c = 0; c < count; c++) {
        dsv4_cuda_drop_weight(&w[c]);
        if (w[c].exl3) {
            dsv4_exl3 *e = (dsv4_exl3 *)w[c].exl3;
            free(e->suh);
            free(e->svh);
            free(e);
        }
    }
    free(w);
    free(block);
}

/* BENCH_T=a,b,...: only those row counts (besides T = 1); unset: all of them */
static int t_wanted(int T)
{
    const char *l = getenv("BENCH_T");
    if (!l || !*l)
        return 1;
    for (const char *p = l; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (atoi(p) == T)
            return 1;
    return 0;
}

int main(void)
{
    dsv4_err err = {};
    if (dsv4_cuda_init(&err)) {
        fprintf(stderr, "bench_cuda: %s\n", err.msg);
        return 1;
    }
    printf("device: %s\n", dsv4_cuda_device_name());
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

    /* copy ceiling */
    size_t cb = (size_t)2 << 30;
    void *a, *b;
    CK(cudaMalloc(&a, cb));
    CK(cudaMalloc(&b, cb));
    CK(cudaMemset(a, 1, cb));
    cudaGraph_t gr;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
    CK(cudaMemcpyAsync(b, a, cb, cudaMemcpyDeviceToDevice, st));
    CK(cudaStreamEndCapture(st, &gr));
    CK(cudaGraphInstantiate(&ge, gr, 0));
    float ms = time_graph(ge, st, 10);
    double copy_gbs = 2.0 * cb / (ms * 1e-3) / 1e9;
    printf("cudaMemcpy D2D %zu MiB: %.3f ms, %.0f GB/s (read + write)\n", cb >> 20, ms, copy_gbs);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(gr);
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    unsigned *sink;
    CK(cudaMalloc((void **)&sink, sizeof *sink));
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
    k_copy<<<sms * 8, 256, 0, st>>>((const uint4 *)a, (uint4 *)b, cb / 16);
    CK(cudaStreamEndCapture(st, &gr));
    CK(cudaGraphInstantiate(&ge, gr, 0));
    ms = time_graph(ge, st, 10);
    double kcopy_gbs = 2.0 * cb / (ms * 1e-3) / 1e9;
    printf("copy kernel    %zu MiB: %.3f ms, %.0f GB/s (read + write)\n", cb >> 20, ms, kcopy_gbs);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(gr);
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
    k_read<<<sms * 8, 256, 0, st>>>((const uint4 *)a, cb / 16, sink);
    CK(cudaStreamEndCapture(st, &gr));
    CK(cudaGraphInstantiate(&ge, gr, 0));
    ms = time_graph(ge, st, 10);
    double read_gbs = (double)cb / (ms * 1e-3) / 1e9;
    printf("read kernel    %zu MiB: %.3f ms, %.0f GB/s (read)\n", cb >> 20, ms, read_gbs);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(gr);
    if (kcopy_gbs > copy_gbs)
        copy_gbs = kcopy_gbs;
    printf("mma.sync rate: bf16 m16n8k16 %.1f TFLOP/s, e4m3 m16n8k32 %.1f TFLOP/s (fp32 accumulation)\n\n",
           mma_rate<0>(sms, st), mma_rate<1>(sms, st));
    CK(cudaFree(a));
    CK(cudaFree(b));

    float *dx, *dy;
    /* T up to PREFILL_T (the prefill row of the table; the head below runs at T = 1) */
    enum { PREFILL_T = 4096 };
    CK(cudaMalloc((void **)&dx, (size_t)PREFILL_T * 32768 * sizeof(float)));
    CK(cudaMalloc((void **)&dy, (size_t)PREFILL_T * 131072 * sizeof(float)));
    /* x: every fp32 bit pattern 0x3c3c3c3c (three bf16 terms on the tensor cores), or with
     * BENCH_X=bf16 the pattern 0x3c3c0000, a bf16 value as REF's quantized inputs are, through
     * the one-term call REF's products make (dsv4_cuda_linear_dev_bf16x) */
    const char *xform = getenv("BENCH_X");
    int x_bf16 = xform && !strcmp(xform, "bf16");
    int (*lin)(const dsv4_weight *, int64_t, int64_t, const float *, int, float *, void *, dsv4_err *) =
        x_bf16 ? dsv4_cuda_linear_dev_bf16x : dsv4_cuda_linear_dev;
    if (x_bf16)
        CK(cudaMemset2D(dx, 4, 0, 2, (size_t)PREFILL_T * 32768));
    if (x_bf16)
        CK(cudaMemset2D((char *)dx + 2, 4, 0x3c, 2, (size_t)PREFILL_T * 32768));
    else
        CK(cudaMemset(dx, 0x3c, (size_t)PREFILL_T * 32768 * sizeof(float)));
    printf("x: %s\n\n", x_bf16 ? "bf16 values (one term)" : "fp32 values (three terms)");

    const shape shapes[] = {
        {"wq_a FP8", DSV4_WF_FP8, 1024, 4096, 128, 128},
        {"wq_b FP8", DSV4_WF_FP8, 32768, 1024, 128, 128},
        {"wo_b FP8", DSV4_WF_FP8, 4096, 8192, 128, 128},
        {"expert w1 FP4", DSV4_WF_FP4, 2048, 4096, 1, 32},
        {"expert w2 FP4", DSV4_WF_FP4, 4096, 2048, 1, 32},
        {"gate BF16", DSV4_WF_BF16, 4096, 4096, 0, 0},
        /* V4.1-Flash: width 5120, FP8 in [32, 32] blocks (the tensor cores' 32-element runs) */
        {"41 wq_a FP8/32", DSV4_WF_FP8, 1280, 5120, 32, 32},
        {"41 wo_b FP8/32", DSV4_WF_FP8, 5120, 8192, 32, 32},
        {"41 w1 FP4", DSV4_WF_FP4, 2304, 5120, 1, 32},
        /* EXL3 packs (K bits a weight, 3INST codebook; random trellis words) */
        {"wq_a EXL3 K4", DSV4_WF_EXL3, 1024, 4096, 4, DSV4_EXL3_3INST},
        {"wo_b EXL3 K3", DSV4_WF_EXL3, 4096, 8192, 3, DSV4_EXL3_3INST},
        {"w1 EXL3 K2", DSV4_WF_EXL3, 2048, 4096, 2, DSV4_EXL3_3INST},
    };
    printf("%-16s %-14s %4s %10s %7s %9s %8s %8s %8s\n", "weight", "[n, k]", "T", "us/call", "x T=1", "GB/s", "of copy",
           "of read", "TFLOP/s");
    /* BENCH_ONLY=name: that shape alone (e.g. under a profiler) */
    const char *only = getenv("BENCH_ONLY");
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const shape *s = &shapes[si];
        if (only && strncmp(s->name, only, strlen(only)))
            continue;
        size_t bytes = data_bytes(s) + scale_bytes(s);
        int count = (int)(((size_t)512 << 20) / bytes) + 1;
        uint8_t *blk;
        dsv4_weight *w = make_copies(s, count, &blk);
        int calls = count < 64 ? 64 : count;
        const int Ts[] = {1, 2, 4, 5, 8, 16, 64, 512, PREFILL_T};
        double us1 = 0;
        for (int ti = 0; ti < (int)(sizeof Ts / sizeof Ts[0]); ti++) {
            /* T = 1 runs (the other rows' ratio) unless BENCH_NO_T1 is set (a profiler's run) */
            if (ti ? !t_wanted(Ts[ti]) : getenv("BENCH_NO_T1") != NULL)
                continue;
            /* a call over many rows is compute-bound: L2 reuse across calls does not matter */
            int nc = Ts[ti] > 16 ? 16 : calls;
            /* one call before the capture: EXL3's scratch grows outside it */
            if (lin(&w[0], 0, s->n, dx, Ts[ti], dy, st, &err)) {
                fprintf(stderr, "bench_cuda: %s\n", err.msg);
                return 1;
            }
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
            for (int c = 0; c < nc; c++)
                if (lin(&w[c % count], 0, s->n, dx, Ts[ti], dy, st, &err)) {
                    fprintf(stderr, "bench_cuda: %s\n", err.msg);
                    return 1;
                }
            CK(cudaStreamEndCapture(st, &gr));
            CK(cudaGraphInstantiate(&ge, gr, 0));
            ms = time_graph(ge, st, 10);
            double us = ms * 1e3 / nc, gbs = bytes / (us * 1e-6) / 1e9;
            if (us1 == 0)
                us1 = us;
            double tf = 2.0 * s->n * s->k * Ts[ti] / (us * 1e-6) / 1e12;
            char sh[32];
            snprintf(sh, sizeof sh, "[%lld,%lld]", (long long)s->n, (long long)s->k);
            printf("%-16s %-14s %4d %10.2f %7.2f %9.0f %7.1f%% %7.1f%% %8.2f\n", s->name, sh, Ts[ti], us, us / us1, gbs,
                   100 * gbs / copy_gbs, 100 * gbs / read_gbs, tf);
            cudaGraphExecDestroy(ge);
            cudaGraphDestroy(gr);
        }
        free_copies(w, count, blk);
    }

    if (only)
        return 0;
    /* one CSA layer's matvecs at batch 1, as V4-Flash shapes them (spec table): attention
     * projections, compressor and indexer (FP8), the router (BF16), 6 routed experts (FP4)
     * and the shared expert (FP8) */
    const shape layer[] = {
        {"wq_a", DSV4_WF_FP8, 1024, 4096, 128, 128},       {"wq_b", DSV4_WF_FP8, 32768, 1024, 128, 128},
        {"wkv", DSV4_WF_FP8, 512, 4096, 128, 128},         {"wo_a", DSV4_WF_FP8, 8192, 4096, 128, 128},
        {"wo_b", DSV4_WF_FP8, 4096, 8192, 128, 128},       {"comp.wkv", DSV4_WF_FP8, 1024, 4096, 128, 128},
        {"comp.wgate", DSV4_WF_FP8, 1024, 4096, 128, 128}, {"icomp.wkv", DSV4_WF_FP8, 256, 4096, 128, 128},
        {"icomp.wgate", DSV4_WF_FP8, 256, 4096, 128, 128}, {"iwq_b", DSV4_WF_FP8, 8192, 1024, 128, 128},
        {"iweights", DSV4_WF_BF16, 64, 4096, 0, 0},        {"gate", DSV4_WF_BF16, 256, 4096, 0, 0},
        {"sw1", DSV4_WF_FP8, 2048, 4096, 128, 128},        {"sw3", DSV4_WF_FP8, 2048, 4096, 128, 128},
        {"sw2", DSV4_WF_FP8, 4096, 2048, 128, 128},
    };
    const shape ew[3] = {{"w1", DSV4_WF_FP4, 2048, 4096, 1, 32}, {"w3", DSV4_WF_FP4, 2048, 4096, 1, 32},
                         {"w2", DSV4_WF_FP4, 4096, 2048, 1, 32}};
    int nl = sizeof layer / sizeof layer[0];
    dsv4_weight *lw[sizeof layer / sizeof layer[0] + 18];
    uint8_t *lb[sizeof layer / sizeof layer[0] + 18];
    size_t layer_bytes = 0;
    for (int i = 0; i < nl; i++) {
        lw[i] = make_copies(&layer[i], 1, &lb[i]);
        layer_bytes += lw[i]->bytes;
    }
    for (int e = 0; e < 18; e++) {
        lw[nl + e] = make_copies(&ew[e % 3], 1, &lb[nl + e]);
        layer_bytes += lw[nl + e]->bytes;
    }
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
    for (int i = 0; i < nl + 18; i++)
        if (dsv4_cuda_linear_dev(lw[i], 0, lw[i]->n, dx, 1, dy, st, &err)) {
            fprintf(stderr, "bench_cuda: %s\n", err.msg);
            return 1;
        }
    CK(cudaStreamEndCapture(st, &gr));
    CK(cudaGraphInstantiate(&ge, gr, 0));
    float layer_ms = time_graph(ge, st, 10);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(gr);
    /* the same layer with the experts grouped: the 6 experts' w1 and w3 (one input) in one
     * launch, their w2 in a second */
    const dsv4_weight *g13[12], *g2[6];
    const float *gx[12];
    float *gy13[12], *gy2[6];
    int n13 = 0, n2 = 0;
    for (int e = 0; e < 18; e++) {
        if (e % 3 == 2) {
            g2[n2] = lw[nl + e];
            gy2[n2] = dy + (size_t)n2 * 4096;
            n2++;
        } else {
            g13[n13] = lw[nl + e];
            gy13[n13] = dy + (size_t)n13 * 2048;
            n13++;
        }
    }
    for (int j = 0; j < 12; j++)
        gx[j] = dx;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
    for (int i = 0; i < nl; i++)
        if (dsv4_cuda_linear_dev(lw[i], 0, lw[i]->n, dx, 1, dy, st, &err)) {
            fprintf(stderr, "bench_cuda: %s\n", err.msg);
            return 1;
        }
    if (dsv4_cuda_linear_group_dev(g13, 12, gx, 1, gy13, st, &err) || dsv4_cuda_linear_group_dev(g2, 6, gx, 1, gy2, st, &err)) {
        fprintf(stderr, "bench_cuda: %s\n", err.msg);
        return 1;
    }
    CK(cudaStreamEndCapture(st, &gr));
    CK(cudaGraphInstantiate(&ge, gr, 0));
    float glayer_ms = time_graph(ge, st, 10);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(gr);
    shape hs = {"head BF16", DSV4_WF_BF16, 129280, 4096, 0, 0};
    uint8_t *hb;
    dsv4_weight *hw = make_copies(&hs, 1, &hb);
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
    if (dsv4_cuda_linear_dev(hw, 0, hw->n, dx, 1, dy, st, &err)) {
        fprintf(stderr, "bench_cuda: %s\n", err.msg);
        return 1;
    }
    CK(cudaStreamEndCapture(st, &gr));
    CK(cudaGraphInstantiate(&ge, gr, 0));
    float head_ms = time_graph(ge, st, 10);
    double tok_bytes = 43.0 * layer_bytes + hw->bytes, tok_ms = 43.0 * layer_ms + head_ms;
    double gtok_ms = 43.0 * glayer_ms + head_ms;
    double floor_ms = tok_bytes / (copy_gbs * 1e9) * 1e3, rfloor_ms = tok_bytes / (read_gbs * 1e9) * 1e3;
    printf("\nV4-Flash batch-1 matvecs: one CSA layer %.1f MB in %.3f ms (%.0f GB/s); head %.2f GB in %.3f ms\n",
           layer_bytes / 1e6, layer_ms, layer_bytes / (layer_ms * 1e-3) / 1e9, hw->bytes / 1e9, head_ms);
    printf("decode estimate (43 CSA-sized layers + head, matvecs only): %.2f ms/token for %.2f GB; floor at the best "
           "copy rate %.2f ms (%.0f%% of floor), at the read rate %.2f ms (%.0f%%)\n",
           tok_ms, tok_bytes / 1e9, floor_ms, 100 * floor_ms / tok_ms, rfloor_ms, 100 * rfloor_ms / tok_ms);
    printf("experts grouped (w1+w3 of the 6 in one launch, w2 in another: 17 launches a layer, not 33): layer %.3f ms "
           "(%.0f GB/s); decode estimate %.2f ms/token (%.0f%% of the copy floor, %.0f%% of the read floor)\n",
           glayer_ms, layer_bytes / (glayer_ms * 1e-3) / 1e9, gtok_ms, 100 * floor_ms / gtok_ms, 100 * rfloor_ms / gtok_ms);
    return 0;
}
