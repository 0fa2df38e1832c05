/* kernels/cuda — the CUDA backend (built with `make CUDA=1`), callable from C.
 *
 * Weights are uploaded once (dsv4_cuda_put_weight: the stored bytes and scales as they are,
 * decoded inside the kernels) and found again by their host address. Activations and sequence
 * state live in device memory from the table's alloc, and every op takes device buffers only:
 * it queues its kernels (one stream, no copies, no waiting). Any constant array an op reads
 * (weights, norm weights, hc params, sinks, rope tables, router bias, tid2eid) is read from its
 * copy when it was registered (dsv4_cuda_put, put_weight, pin_weight: the model's placement
 * does it at load), or in place when it is device memory; one that is neither fails the op,
 * naming the array. Ops cannot return an error; the first failure is kept and reported by the
 * table's check(), and the outputs of a failed op are NaN. */
#ifndef DSV4_CUDA_H
#define DSV4_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include "core/err.h"
#include "io/weight.h"
#include "kernels/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Selects the device dsv4_cuda_select named (0 unless it was called). Fails with DSV4_E_DEVICE, saying why, when no usable GPU is there.
 * DSV4_CUDA_POISON=1 in the environment turns poisoning on (see dsv4_cuda_set_poison). */
int dsv4_cuda_init(dsv4_err *err);
/* "NVIDIA H200, 139.8 GiB, sm_90" after a successful init. */
const char *dsv4_cuda_device_name(void);

const dsv4_backend *dsv4_backend_cuda(void);

/* Keeps a device copy of `bytes` bytes at `host` (once; a second put of the same address is
 * a no-op), used by every op that is handed that address. */
int dsv4_cuda_put(const void *host, size_t bytes, dsv4_err *err);
void dsv4_cuda_drop(const void *host);
/* The weight's data and scales (w->bytes in all). */
int dsv4_cuda_put_weight(const dsv4_weight *w, dsv4_err *err);
void dsv4_cuda_drop_weight(const dsv4_weight *w);
/* As put_weight, but the copy is in page-locked host memory mapped into the device's address
 * space: the same kernels read it over the host link (PCIe/C2C) instead of from HBM. For the
 * weights that do not fit the device (routed experts); dsv4_cuda_drop_weight frees it. */
int dsv4_cuda_pin_weight(const dsv4_weight *w, dsv4_err *err);
/* Bytes put_weight copies for w (data and scales as stored). */
size_t dsv4_cuda_weight_bytes(const dsv4_weight *w);
/* Free and total device memory now (cudaMemGetInfo). */
int dsv4_cuda_mem(size_t *free_b, size_t *total_b, dsv4_err *err);
/* The table's state_room: free device memory less the reserve the placement keeps (place.c),
 * 0 when it cannot be read. */
size_t dsv4_cuda_state_room(void);
/* Bytes held by put copies: on the device, and pinned on the host. */
void dsv4_cuda_usage(size_t *device_b, size_t *pinned_b);

/* The table's place and unplace (kernels/backend.h), place.c. */
int dsv4_cuda_place(const dsv4_place_item *items, int64_t n, char *report, size_t report_n, int *experts_host,
                    dsv4_err *err);
void dsv4_cuda_unplace(const dsv4_place_item *items, int64_t n);

/* Why the last graph recording failed (graph_end returned NULL), "" if it did not. */
const char *dsv4_cuda_graph_why(void);

/* on: every device buffer an op writes is filled with NaN bytes before its kernel runs, so
 * an element a kernel forgets to write comes back as NaN (tests). */
void dsv4_cuda_set_poison(int on);

/* Which kernels take the tensor cores. ALL: the linear and expert ops run BF16, FP8 and FP4
 * weights on them (mma.cuh) at every row count, and EXL3 layers' middle step (exl3_mma.cuh);
 * so do attn_step's indexer scores and attention for the shapes they take (index_tc.cu,
 * attn_tc.cu). ATTN (the default): the
 * attention and the indexer scores only; the linear and expert ops on the fp32 FMA kernels
 * (linear.cuh), which read a few rows faster. OFF: every op on the FMA kernels (step.cu's
 * attention and indexer too). In every mode a row's bits do not depend on the batch; the modes
 * differ from each other in rounding. Set it before the first op and leave it (a process's rows
 * must all come from one path). DSV4_CUDA_TC in the environment sets it at the first op: 1 ALL,
 * 0 OFF, unset (or any other value, e.g. attn) ATTN. */
enum { DSV4_CUDA_TC_OFF = 0, DSV4_CUDA_TC_ALL = 1, DSV4_CUDA_TC_ATTN = 2 };
void dsv4_cuda_set_tensor_cores(int mode);
int dsv4_cuda_tensor_cores(void);

/* The linear op over device buffers, queued on `stream` (a cudaStream_t; NULL: the default
 * stream) without waiting, for benchmarks and graph capture:
 * dy[t, i] = sum_k W[r0 + i, k] dx[t, k]; dx: [T, w->k] dense, dy: [T, r1 - r0] dense.
 * The weight must have been put. EXL3 weights go through dsv4_cuda_exl3_linear, whose scratch
 * cannot grow while the stream is captured: call once at the same T before capturing. */
int dsv4_cuda_linear_dev(const dsv4_weight *w, int64_t r0, int64_t r1, const float *dx, int T, float *dy, void *stream,
                         dsv4_err *err);
/* The same over dx whose values are all bf16 values (REF's quantized inputs): the tensor-core
 * path takes them as one term, as REF's linear_q does (linear.cu). Other values are summed
 * wrongly (their low bits are dropped). */
int dsv4_cuda_linear_dev_bf16x(const dsv4_weight *w, int64_t r0, int64_t r1, const float *dx, int T, float *dy,
                               void *stream, dsv4_err *err);

/* Several weights of one form, shape and block layout (the active experts' w1, say) in one
 * launch, for j < n: dy[j] = W_j dx[j] over all rows; dx[j] [T, k], dy[j] [T, n] dense device
 * buffers. Each row is summed exactly as dsv4_cuda_linear_dev sums it (bit for bit); one
 * launch instead of n is what small expert matrices need. n <= DSV4_CUDA_GROUP_MAX. */
#define DSV4_CUDA_GROUP_MAX 16
int dsv4_cuda_linear_group_dev(const dsv4_weight *const *w, int n, const float *const *dx, int T, float *const *dy,
                               void *stream, dsv4_err *err);

/* cudaMemcpy device to device over 2 GiB, bytes read + written per second, in GB/s (the best of
 * five after a warm-up); 0 when it could not run. measure.cu. */
double dsv4_cuda_copy_bandwidth(void);
/* The rate in GB/s at which a kernel reads page-locked host memory mapped into the device (how
 * spilled weights are read): a 1 GiB buffer summed, best of five after a warm-up; 0 when it
 * could not run. measure.cu. */
double dsv4_cuda_host_read_bandwidth(void);
/* How many experts calls so far copied routed experts from pinned host memory into device
 * staging before reading them (tests: that the path ran). expert_stage.cu. */
unsigned long dsv4_cuda_experts_staged(void);
/* Bytes of w (data and scales) held in pinned host memory; 0 when on the device or not placed.
 * runtime.cu. */
size_t dsv4_cuda_host_bytes(const dsv4_weight *w);
/* cudaProfilerStart (on) or cudaProfilerStop, after the queued work finished. measure.cu. */
void dsv4_cuda_capture(int on);

/* Several GPUs, one process each (comm.cu, docs/multigpu.md). Before dsv4_cuda_init: the
 * device this process uses. */
int dsv4_cuda_select(int dev, dsv4_err *err);
/* GPUs this machine has (0, with the reason in err, when none can be counted). */
int dsv4_cuda_gpu_count(dsv4_err *err);
/* Whether this build has NCCL (make CUDA=1 NCCL=1; on by default where nccl.h is found). */
int dsv4_cuda_comm_built(void);
/* Rank 0 makes the communicator's id (DSV4_CUDA_COMM_ID_BYTES) and hands it to every other
 * rank; each joins with it (after selecting its device). A failure names NCCL's reason. */
#define DSV4_CUDA_COMM_ID_BYTES 128
int dsv4_cuda_comm_id(void *id, dsv4_err *err);
int dsv4_cuda_comm_init(int world, int rank, const void *id, dsv4_err *err);
/* out [world * bytes] = every rank's in [bytes], in rank order (host buffers; waits). */
int dsv4_cuda_allgather(const void *in, size_t bytes, void *out, dsv4_err *err);
void dsv4_cuda_comm_free(void);
/* Expert parallel: of each experts op's routed experts, this process holds and computes only
 * expert e with e % world == rank; the pairs' outputs are summed over the ranks (each pair is
 * one rank's, the others add -0), so every rank gets the one-GPU result bit for bit. Set
 * before loading (placement leaves the other experts off the device). */
int dsv4_cuda_set_experts_rank(int rank, int world, dsv4_err *err);
/* Whether expert number `slot` of its layer is this process's (negative: not an expert). */
int dsv4_cuda_expert_owned(int64_t slot);
/* The rank and world set_experts_rank gave (0 and 1 unless called). */
void dsv4_cuda_experts_rank(int *rank, int *world);
/* Tests: the experts op hands its pair outputs (device [R * K * D], -0 where not this rank's)
 * to fn before the weighted sum, instead of the all-reduce; NULL restores. fn runs inside the
 * op, under its lock: it copies with cudaMemcpy, not through the table. */
typedef void (*dsv4_cuda_pairs_hook)(float *dev_pairs, size_t n, void *ctx);
void dsv4_cuda_set_pairs_hook(dsv4_cuda_pairs_hook fn, void *ctx);

#ifdef __cplusplus
}
#endif
#endif
