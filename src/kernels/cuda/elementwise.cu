/* CUDA elementwise ops: swiglu (with its clamps), add and scale. */
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cuda/internal.h"

using namespace dsv4cu;

/* ---- swiglu ------------------------------------------------------------------------------- */

__global__ void k_swiglu(const float *g, const float *u, int64_t n, float limit, float *h)
{
    PDL_WAIT();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        h[i] = swiglu1(g[i], u[i], limit);
}

/* An elementwise op of two [n] device inputs a, b into y (which may alias either): k(a, b, n,
 * extra..., y). */
template <class K, class... A>
static void two_inputs(K k, const char *what, const float *a, const float *b, int64_t n, float *y, A... extra)
{
    if (n <= 0)
        return;
    size_t by = (size_t)n * sizeof(float);
    op_begin_at(what);
    bool ran = given(what, {a, b, y}) && (y == a || y == b || poison_out(y, by));
    if (ran)
        launch_k(k, (unsigned)cdiv(n, 256), 256, 0, stream, a, b, n, extra..., y);
    finish(ran, what, y, by);
    op_end();
}

void dsv4cu::cu_swiglu(const float *g, const float *u, int64_t n, float limit, float *h)
{
    two_inputs(k_swiglu, "swiglu", g, u, n, h, limit);
}


/* ---- add, memory ------------------------------------------------------------------------ */

__global__ void k_add(const float *a, const float *b, int64_t n, float *y)
{
    PDL_WAIT();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = a[i] + b[i];
}

void dsv4cu::cu_add(const float *a, const float *b, int64_t n, float *y) { two_inputs(k_add, "add", a, b, n, y); }

__global__ void k_scale(const float *x, int64_t n, float sc, float *y)
{
    PDL_WAIT();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = x[i] * sc;
}

void dsv4cu::cu_scale(const float *x, int64_t n, float s, float *y)
{
    if (n <= 0)
        return;
    size_t by = (size_t)n * sizeof(float);
    op_begin_at("scale");
    bool ran = given("scale", {x, y}) && (y == x || poison_out(y, by));
    if (ran)
        launch_k(k_scale, (unsigned)cdiv(n, 256), 256, 0, stream, x, n, s, y);
    finish(ran, "scale", y, by);
    op_end();
}
