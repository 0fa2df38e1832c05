/* kernels/cuda/exl3 — EXL3 trellis-coded linear layers on the GPU (exl3.cu), callable from C.
 *
 * Same computation as the CPU's dsv4_exl3_linear_rows (kernels/cpu/exl3.h), in three kernels
 * queued on one stream: x' = H(x ⊙ suh)/√128 per 128 block; y'[t, c] = Σ_r x'[t, r] Ŵ[r, c]
 * with the 16x16 tiles decoded on the fly from their 16·K-bit words (fp32 fma, rows in
 * ascending order); y = H(y')/√128 ⊙ svh (+ bias). The input and output steps run the CPU's
 * exact operation sequence. The middle step splits the kp rows into S slices (S from the
 * layer's shape only: more slices when there are few 128-wide output blocks), each an fma
 * chain in the CPU's order, and adds the slices' sums in slice order; with S = 1 the result
 * is the CPU's bit for bit. When the linear family takes the tensor cores (cuda.h), the middle
 * step runs on them instead (exl3_mma.cuh: the same slices, exact products, fp32 sums in another
 * order). Each output row's operations depend only on the layer's shape and that switch, never
 * on T, the row's place in the batch or [r0, r1): a batch equals its rows one at a time bit for
 * bit. A call computes its rows in rounds of at most 1024, which bounds the scratch. */
#ifndef DSV4_CUDA_EXL3_H
#define DSV4_CUDA_EXL3_H

#include <stddef.h>
#include <stdint.h>
#include "core/err.h"
#include "io/weight.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Uploads the layer's trellis words, suh, svh and bias (fp32) once, keyed by w->exl3; a second
 * put of the same layer is a no-op. */
int dsv4_cuda_exl3_put(const dsv4_weight *w, dsv4_err *err);
/* Frees the layer's device copy (a no-op when it has none). */
void dsv4_cuda_exl3_drop(const dsv4_weight *w);
/* Bytes put copies for w: trellis as stored + 4 bytes per suh, svh and bias value. */
size_t dsv4_cuda_exl3_bytes(const dsv4_weight *w);
/* Bytes held by all put layers now. */
size_t dsv4_cuda_exl3_resident(void);
/* Slices the middle step uses for w (1..kp/128), for reports and tests. */
int dsv4_cuda_exl3_slices(const dsv4_weight *w);

/* dy[t, i] = Σ_j W[r0 + i, j] dx[t, j] (+ bias[r0 + i]) for i < r1 - r0, t < T, W the layer's
 * logical [n, k] weight: device pointers, x rows of stride ldx (>= k), y rows of stride ldy
 * (>= r1 - r0); only those elements of dy are written. Queued on `stream` (a cudaStream_t;
 * NULL: the default stream) without waiting. The layer must have been put. Uses a scratch
 * buffer kept by this file (grown as needed: growing frees the old one, which waits for the
 * device, and fails while the stream is being captured); calls that may overlap must use
 * dsv4_cuda_exl3_linear_ws instead. Returns 0 or a DSV4_E_* code; the message of the first
 * failure is kept for dsv4_cuda_exl3_check. */
int dsv4_cuda_exl3_linear(const dsv4_weight *w, int64_t r0, int64_t r1, const float *dx, int T, int64_t ldx,
                          float *dy, int64_t ldy, void *stream);
/* Scratch bytes (device memory, 256-byte aligned use) the call needs. */
size_t dsv4_cuda_exl3_ws_bytes(const dsv4_weight *w, int64_t r0, int64_t r1, int T);
/* As dsv4_cuda_exl3_linear with the caller's scratch `ws` of ws_bytes (>= ws_bytes above, 16-byte
 * aligned): bitwise the same results. */
int dsv4_cuda_exl3_linear_ws(const dsv4_weight *w, int64_t r0, int64_t r1, const float *dx, int T, int64_t ldx,
                             float *dy, int64_t ldy, void *ws, size_t ws_bytes, void *stream);
/* 0 when no call failed since the last check; else copies the first failure into err (when not
 * NULL), forgets it and returns its code. */
int dsv4_cuda_exl3_check(dsv4_err *err);

#ifdef __cplusplus
}
#endif
#endif
