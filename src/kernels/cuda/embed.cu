/* CUDA embedding lookup: each element decoded exactly as the linear kernels' element path does. */
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cuda/internal.h"
#include "kernels/cuda/linear.cuh"

using namespace dsv4cu;

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
 * it did not fit: a step reads T rows of it, so the host link costs little); ids and X are
 * device buffers. */
void dsv4cu::cu_embed(const dsv4_weight *w, const int32_t *ids, int T, int n, float *X)
{
    if (T <= 0 || n <= 0)
        return;
    op_begin();
    size_t b = (size_t)T * n * w->k * sizeof(float);
    int ok = w->form < DSV4_WF_EXL3 && T <= 65535;
    if (!given("embed", {ids, X}))
        ok = 0;
    else if (!w->data) {
        fail(DSV4_E_ARG, "cuda: embedding %s: no data", w->name ? w->name : "?");
        ok = 0;
    } else if (!ok)
        fail(DSV4_E_UNSUPPORTED, "cuda: embedding %s: %s table, %d rows: no CUDA lookup for it", w->name ? w->name : "?",
             dsv4_wform_name(w->form), T);
    const char *nm = w->name ? w->name : "embedding table";
    const void *q = ok ? dev_const(w->data, "embed", nm) : NULL;
    const void *s = q && w->scale ? dev_const(w->scale, "embed", nm) : NULL;
    bool ran = q && (s || !w->scale) && poison_out(X, b);
    if (ran)
        launch_k(k_embed, dim3((unsigned)cdiv(w->k, NB), (unsigned)T), NB, 0, stream, wdev_of(w, q, s), ids, n, X);
    finish(ran, "embed", X, b);
    op_end();
}
