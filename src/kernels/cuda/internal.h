/* kernels/cuda — what the CUDA backend's translation units share: the op lock, the stream every
 * op queues on, the first-error slot, the device views of constants, output poisoning and
 * failure marking, the resident copies, the block-reduction helpers and the op table's
 * entries. C++ only; not part of the C interface (cuda.h). */
#ifndef DSV4_CUDA_INTERNAL_H
#define DSV4_CUDA_INTERNAL_H

#include <cuda_runtime.h>
#include <initializer_list>
#include <utility>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
extern "C" { /* the C headers carry no linkage of their own */
#include "core/core.h"
#include "io/weight.h"
#include "kernels/backend.h"
}
#include "kernels/cuda/cuda.h"

namespace dsv4cu {

/* Held by every op for its whole call (the resident table and the ops' grow-only buffers are shared). */
extern pthread_mutex_t lock;
/* The stream every op queues on: a blocking stream, so the legacy default stream (the
 * synchronous copies of the tests and of the placement) stays ordered with it both ways;
 * graphs capture it. */
extern cudaStream_t stream;
extern int poison;              /* NaN-fill device outputs before kernels write them */
extern int capturing;           /* inside graph_begin .. graph_end */
extern int ordinal;             /* the device this process uses (dsv4_cuda_select) */
/* Expert parallel (comm.cu): this process computes routed expert e only when
 * e % ep_world == ep_rank. */
extern int ep_rank, ep_world;
/* Before an experts op computes its pairs: Y [n] filled with -0 where pairs are left to other
 * ranks (nothing when this process computes every pair and has no communicator). */
void ep_clear(float *Y, int64_t n);
/* After: Y [n] summed over the ranks in place on the stream (the NCCL all-reduce), or handed
 * to the test hook (dsv4_cuda_set_pairs_hook); nothing in a world of one without NCCL. */
void ep_reduce(float *Y, size_t n);

/* Where an op records a failure: the first-error slot, or while recording the recording's
 * own slot (a failed recording returns NULL from graph_end, and the ops run again). */
dsv4_err *errp(void);
/* Records e (when not cudaSuccess) as the op's failure; returns whether it failed. */
int failed(cudaError_t e, const char *what);
/* Runs a CUDA call, recording its failure (failed()); true when it failed. */
#define CK(call) dsv4cu::failed((call), #call)
/* Records a failure of the op by message (first one kept). */
void fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Whether the last launch went through (records the error when not). */
int launched(const char *what);

/* Starts an op under the lock. DSV4_CUDA_PROFILE=1: op_end waits for the op and adds its time
 * to its function's total, printed at exit (recorded steps are not timed: run with
 * DSV4_GRAPHS=0). */
void op_begin_at(const char *name);
#define op_begin() op_begin_at(__func__)
void op_end(void);
/* Profiling only: the op's time so far goes to `name`, the rest to the next split or the op. */
void prof_split(const char *name);

/* What an op reads and writes. Activations, outputs and sequence state are device buffers (the
 * backend's alloc: the model's step arena and sequence state), used as they are: no copies,
 * no per-call checks. A constant array (weights, norm weights, hc params, sinks, rope tables,
 * router bias, tid2eid) is read through its resident copy (placed at load: dsv4_cuda_put,
 * dsv4_cuda_put_weight, dsv4_cuda_pin_weight) or is device memory itself.
 * dev_const: that device view; NULL for NULL, and for an array that is neither, after
 * recording a failure that names the op and the array (a missed placement is a bug, never
 * papered over with a copy). dev_known: the same without recording anything. */
const void *dev_const(const void *p, const char *op, const char *what);
const void *dev_known(const void *p);
/* Whether every buffer in bufs was given (not NULL); records the op's failure when one was not,
 * so a missing buffer fails the op instead of a kernel. */
bool given(const char *op, std::initializer_list<const void *> bufs);
/* An output filled with NaN bytes before its kernels write it, when poisoning is on (bytes, or
 * rows [rows, w] with row stride ld floats); false when that failed (recorded). */
bool poison_out(void *p, size_t bytes);
bool poison_rows(float *p, int64_t rows, int64_t w, int64_t ld);
/* Marks an output that could not be computed: NaN bytes, queued on the stream (bytes, or rows
 * [rows, w] with row stride ld floats). The op records its failure itself. */
void out_fail(void *p, size_t bytes);
void fail_rows(float *p, int64_t rows, int64_t w, int64_t ld);
/* How an op with one output ends: p marked failed when its kernels were not launched (ran
 * false) or the launch failed (recorded as `what`); finish_rows for rows with a stride. */
void finish(bool ran, const char *what, void *p, size_t bytes);
void finish_rows(bool ran, const char *what, float *y, int64_t rows, int64_t w, int64_t ld);

__host__ __device__ static inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Programmatic dependent launch (Hopper): every kernel starts with PDL_WAIT(), launched by
 * launch_k. The wait holds until the previous grid has finished and its writes are visible, so
 * the order of results is unchanged; then the trigger lets the next kernel on the stream be
 * scheduled at once (its blocks take their places and wait at their own PDL_WAIT), so its launch
 * overlaps this kernel's work instead of following its last block. (The trigger takes effect
 * once every block of this grid passed it, so the next grid never holds places this grid's
 * unlaunched blocks need.) A kernel launched plainly passes both at once. DSV4_PDL=0 launches
 * plainly (for comparison). */
#define PDL_WAIT() (cudaGridDependencySynchronize(), cudaTriggerProgrammaticLaunchCompletion())
int pdl_enabled(void);

template <typename... P, typename... A>
static inline void launch_k(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, A &&...args)
{
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = at;
    cfg.numAttrs = pdl_enabled() ? 1 : 0;
    cudaLaunchKernelEx(&cfg, k, std::forward<A>(args)...);
}

enum { NB = 256, NW = NB / 32 };

/* A warp's xor tree (float or double). */
template <class T>
__device__ __forceinline__ T warp_sum(T v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sum over a block of NWARP warps in a fixed order (each warp's tree, then thread 0 adds the
 * warps' partials in index order); every thread gets the result. sh: [NWARP + 1] of T. */
template <int NWARP, class T>
__device__ __forceinline__ T block_sum(T v, T *sh)
{
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0)
        sh[wid] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        T s = sh[0];
        for (int i = 1; i < NWARP; i++)
            s += sh[i];
        sh[NWARP] = s;
    }
    __syncthreads();
    return sh[NWARP];
}

__device__ __forceinline__ float ex(float v) { return expf(v); }
__device__ __forceinline__ double ex(double v) { return exp(v); }

/* The softmax of scores p[0..nk) beside a sink logit, in place, by a block of NWARP warps:
 * m = max(sink, p), p_i = e^(p_i - m); returns the denominator sum_i p_i + e^(sink - m), the
 * sum by threads t over i = t, t + 32 NWARP, ... in order, then block_sum. The order depends on
 * nk and NWARP only. sh: [NWARP + 1] of T. */
template <int NWARP, class T>
__device__ __forceinline__ T block_softmax(T *p, int nk, T sink, T *sh)
{
    const int NT = NWARP * 32;
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    T mx = sink;
    for (int i = threadIdx.x; i < nk; i += NT)
        mx = fmax(mx, p[i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        mx = fmax(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0)
        sh[wid] = mx;
    __syncthreads();
    mx = sh[0];
    for (int i = 1; i < NWARP; i++)
        mx = fmax(mx, sh[i]);
    T sum = 0;
    for (int i = threadIdx.x; i < nk; i += NT) {
        T e = ex(p[i] - mx);
        p[i] = e;
        sum += e;
    }
    return block_sum<NWARP>(sum, sh) + ex(sink - mx);
}

/* The RMS norm of one row of dim values by a block of NB threads: the squares summed per
 * thread over channels t, t + NB, ... in order, then the block's fixed-order sum; y = x / rms,
 * times w when given. y may be x. sh: [NW + 1] shared floats. */
__device__ __forceinline__ void rms_block(const float *x, int dim, const float *w, float eps, float *sh, float *y)
{
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += NB)
        ss = fmaf(x[i], x[i], ss);
    ss = block_sum<NW>(ss, sh);
    float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += NB)
        y[i] = w ? x[i] * inv * w[i] : x[i] * inv;
}

/* silu(min(a, limit)) * clamp(b, -limit, limit) (limit <= 0: no clamp), as the CPU's swiglu. */
__device__ __forceinline__ float swiglu1(float a, float b, float limit)
{
    if (limit > 0) {
        a = fminf(a, limit);
        b = fminf(fmaxf(b, -limit), limit);
    }
    return a / (1.0f + expf(-a)) * b;
}

enum { ATT_MAXD = 512, ATT_C = ATT_MAXD / 32 };

/* v[c] = k[lane + 32 c] (0 past n), c < C: a warp's lanes reading a row of n floats in column
 * stripes, every load issued before any is used. kvrow.cuh overloads it for cache rows. */
template <int C>
__device__ __forceinline__ void row_lanes(const float *k, int n, int lane, float (&v)[C])
{
#pragma unroll
    for (int c = 0; c < C; c++)
        v[c] = lane + 32 * c < n ? k[lane + 32 * c] : 0.0f;
}

/* One head's attention over nk keys (K = V) by a block of NWARP warps: scores by warp (key i
 * to warp i % NWARP, q's slice held in registers), the softmax with the sink, then out_j =
 * sum_i (p_i / den) k_ij: for d <= ATT_MAXD warp w sums its keys i = w, w + NWARP, ... in order
 * (lane l owns columns l + 32 c) and the NWARP partial rows are added in warp order, so a
 * lane's loads of one key are independent and each warp waits on nk / NWARP keys, not nk;
 * wider heads sum every key per column in order. The order depends on nk, d and NWARP only.
 * key(i) gives key i's row of d values (a float pointer, or a crow: anything row_lanes and
 * an index by column read); p holds nk floats; sh is [NWARP + 1] shared floats,
 * part [NWARP, ATT_MAXD]. */
template <int NWARP, class Key>
__device__ __forceinline__ void attend_head(const float *qh, Key key, int nk, int d, float scale, float sink, float *p,
                                            float *sh, float *part, float *out)
{
    const int NT = NWARP * 32;
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    bool narrow = d <= ATT_MAXD;
    float qv[ATT_C];
#pragma unroll
    for (int c = 0; c < ATT_C; c++)
        qv[c] = narrow && lane + 32 * c < d ? qh[lane + 32 * c] : 0.0f;
    for (int i = wid; i < nk; i += NWARP) {
        const auto k = key(i);
        float a = 0.0f;
        if (narrow) {
            float kv[ATT_C];
            row_lanes(k, d, lane, kv);
#pragma unroll
            for (int c = 0; c < ATT_C; c++)
                if (lane + 32 * c < d)
                    a = fmaf(qv[c], kv[c], a);
        } else
            for (int j = lane; j < d; j += 32)
                a = fmaf(qh[j], k[j], a);
        a = warp_sum(a);
        if (lane == 0)
            p[i] = a * scale;
    }
    __syncthreads();
    float den = block_softmax<NWARP>(p, nk, sink, sh);
    if (!narrow) {
        for (int j = threadIdx.x; j < d; j += NT) {
            float acc = 0.0f;
            for (int i = 0; i < nk; i++)
                acc = fmaf(p[i] / den, key(i)[j], acc);
            out[j] = acc;
        }
        return;
    }
    float acc[ATT_C];
#pragma unroll
    for (int c = 0; c < ATT_C; c++)
        acc[c] = 0.0f;
    for (int i = wid; i < nk; i += NWARP) {
        const auto k = key(i);
        float w = p[i] / den, kv[ATT_C];
        row_lanes(k, d, lane, kv);
#pragma unroll
        for (int c = 0; c < ATT_C; c++)
            if (lane + 32 * c < d)
                acc[c] = fmaf(w, kv[c], acc[c]);
    }
#pragma unroll
    for (int c = 0; c < ATT_C; c++)
        if (lane + 32 * c < d)
            part[wid * ATT_MAXD + lane + 32 * c] = acc[c];
    __syncthreads();
    for (int j = threadIdx.x; j < d; j += NT) {
        float o = part[j];
        for (int w = 1; w < NWARP; w++)
            o += part[w * ATT_MAXD + j];
        out[j] = o;
    }
}

/* The resident copies of host arrays (runtime.cu), found by host address: NULL when none. drops
 * is bumped by every drop, so tables built over resident copies know when to rebuild. */
typedef struct {
    const void *host;           /* NULL: empty; TOMB: deleted */
    void *dev;                  /* what kernels read: device memory, or the device view of pinned host memory */
    void *pinned;               /* the pinned host copy (NULL when dev is device memory) */
    size_t bytes;
} resident;
resident *resident_of(const void *host);
extern unsigned drops;

/* Bytes of a weight's data and of its scales as stored (runtime.cu). */
size_t data_bytes(const dsv4_weight *w);
size_t scale_bytes(const dsv4_weight *w);

/* A device buffer of floats that only grows (runtime.cu): an outgrown one is kept, never
 * freed, since a recorded graph may still read it. grow_buf gives b->p when it holds n floats,
 * else a new one of max(n, want) floats; NULL when cudaMalloc fails or, for a buffer named
 * `what`, when it must grow inside a recording (the error names it). what NULL: growing while
 * recording is allowed (the relaxed capture mode permits the allocation). */
typedef struct { float *p; size_t n; } growbuf;
float *grow_buf(growbuf *b, size_t n, size_t want, const char *what);

/* The op table's entries, one file per family (runtime.cu: memory, graphs and the error check;
 * linear.cu, rounding.cu, experts.cu, norm.cu, hc.cu, attend.cu, elementwise.cu, embed.cu); their contracts
 * are the ops' in kernels/backend.h. */
int cuda_check(dsv4_err *err);
void *cu_alloc(size_t bytes);
void cu_free(void *p);
void cu_upload(void *dst, const void *host, size_t bytes);
void cu_download(void *host, const void *src, size_t bytes);
void cu_copy(void *dst, const void *src, size_t bytes);
void cu_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows);
int cu_graph_begin(void);
void *cu_graph_end(void);
void cu_graph_run(void *g);
void cu_graph_free(void *g);
/* Whether a kernel family ("linear", "attn", "index") takes the tensor cores (linear.cu). */
bool tc_family(const char *fam);
void cu_linear(const dsv4_weight *w, int64_t r0, int64_t r1, const float *x, int T, int64_t ldx, float *y, int64_t ldy);
/* cu_linear, told whether x holds bf16 values (x1: the tensor-core path takes one term, mma.cuh)
 * and whether each output is rounded to bf16 as the kernel writes it (rb). */
void linear_x(const dsv4_weight *w, int64_t r0, int64_t r1, const float *x, int T, int64_t ldx, float *y, int64_t ldy,
              int x1, int rb);
void cu_linear_blocks(const dsv4_weight *w, int G, const float *x, int T, float *y);
void cu_linear_q(const dsv4_weight *w, int64_t r0, int64_t r1, const float *x, int T, int64_t ldx, float *y, int64_t ldy);
/* cu_linear_q with its outputs rounded to bf16 as they are written when rb. */
void linear_q_x(const dsv4_weight *w, int64_t r0, int64_t r1, const float *x, int T, int64_t ldx, float *y, int64_t ldy,
                int rb);
void cu_linear_rb(const dsv4_weight *w, int64_t r0, int64_t r1, const float *x, int T, int64_t ldx, float *y,
                  int64_t ldy, int quant);
void cu_round_bf16(float *x, int64_t n);
void cu_roundtrip(float *x, int64_t n, int block, int code);
void cu_linear_multi(int nw, const dsv4_weight *const *w, const float *x, int T, int64_t ldx, float *const *y);
void cu_rmsnorm(const float *x, int64_t rows, int dim, const float *w, float eps, float *y);
void cu_rope(float *x, int T, int64_t stride, int heads, int d, int rd, const float *inv_freq, const int64_t *pos,
             int inverse);
void cu_rmsnorm_rb(const float *x, int64_t rows, int dim, const float *w, float eps, float *y);
void cu_rope_rb(float *x, int T, int64_t stride, int heads, int d, int rd, const float *inv_freq, const int64_t *pos,
                int inverse);
void cu_hc_pre(const float *X, int T, int n, int D, const float *fn, const float *base, const float *scale, int iters,
               float hc_eps, float norm_eps, float *pre, float *post, float *comb, float *h, const float *hw);
void cu_hc_post(float *X, const float *y, int T, int n, int D, const float *post, const float *comb);
void cu_hc_post_rb(float *X, const float *y, int T, int n, int D, const float *post, const float *comb);
void cu_hc_collapse(const float *X, int T, int n, int D, const float *pre, float *h);
void cu_engram_gate(float *X, const float *kv, const float *w, int T, int n, int D, float eps, int round_bf16);
void cu_attend(const float *q, int H, int d, const float *const *keys, int nk, float scale, const float *sink, float *out);
void cu_swiglu(const float *g, const float *u, int64_t n, float limit, float *h);
void cu_add(const float *a, const float *b, int64_t n, float *y);
void cu_scale(const float *x, int64_t n, float s, float *y);
void cu_embed(const dsv4_weight *w, const int32_t *ids, int T, int n, float *X);
void cu_experts(const dsv4_experts_args *a);

/* The step ops in step.cu. */
void attn_step(const dsv4_attn_args *a);
size_t attn_work(const dsv4_attn_args *a);
/* V4.1's (step41.cu). */
void attn_step41(const dsv4_attn41_args *a);
size_t attn41_work(const dsv4_attn41_args *a);
void route(const float *lg, int R, int E, int K, const float *bias, const int32_t *tid2eid, const int32_t *ids, int norm,
           float route_scale, int32_t *eid, float *wts);

} // namespace dsv4cu

#endif
