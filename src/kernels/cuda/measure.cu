/* The device's memory ceilings for benchmarks: cudaMemcpy device to device over buffers far
 * larger than the L2, counted as bytes read plus bytes written (how a copy loads HBM); a
 * kernel's read rate from mapped pinned host memory (the bus, for spilled weights); and the
 * profiler's capture range. */
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <string.h>
#include "kernels/cuda/cuda.h"

/* The best rate in GB/s of five timed runs of op (after one that warms the clocks), counting
 * `bytes` a run; 0 when the timing failed. */
template <class Op>
static double best_rate(Op op, double bytes)
{
    cudaEvent_t e0 = NULL, e1 = NULL;
    double best = 0;
    if (cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess)
        for (int rep = 0; rep < 6; rep++) {
            float ms = 0;
            cudaEventRecord(e0);
            op();
            cudaEventRecord(e1);
            if (cudaEventSynchronize(e1) != cudaSuccess || cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess) {
                best = 0;
                break;
            }
            double gbs = bytes / (ms * 1e-3) / 1e9;
            if (rep > 0 && gbs > best)
                best = gbs;
        }
    cudaGetLastError();
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    return best;
}

extern "C" double dsv4_cuda_copy_bandwidth(void)
{
    size_t n = (size_t)2 << 30;
    void *a = NULL, *b = NULL;
    double r = 0;
    if (cudaMalloc(&a, n) == cudaSuccess && cudaMalloc(&b, n) == cudaSuccess) {
        cudaMemset(a, 1, n);
        r = best_rate([&] { cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice); }, 2.0 * n);
    }
    cudaGetLastError();
    cudaFree(a);
    cudaFree(b);
    return r;
}

/* Sums n 16-byte words at p, 4 words a thread in flight, into out (so the reads are not
 * optimised away). */
__global__ void k_read_words(const uint4 *p, size_t n, unsigned *out)
{
    unsigned acc = 0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += 4 * stride) {
        uint4 v[4];
#pragma unroll
        for (int j = 0; j < 4; j++)
            v[j] = i + j * stride < n ? p[i + j * stride] : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int j = 0; j < 4; j++)
            acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
    }
    if (acc == 0x9e3779b9u)
        *out = acc;
}

extern "C" double dsv4_cuda_host_read_bandwidth(void)
{
    size_t n = (size_t)1 << 30;
    void *h = NULL, *d = NULL;
    unsigned *o = NULL;
    int sms = 0, dev = 0;
    double r = 0;
    if (cudaHostAlloc(&h, n, cudaHostAllocMapped) == cudaSuccess && cudaHostGetDevicePointer(&d, h, 0) == cudaSuccess &&
        cudaMalloc((void **)&o, sizeof *o) == cudaSuccess && cudaGetDevice(&dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess) {
        memset(h, 1, n);
        r = best_rate([&] { k_read_words<<<sms * 8, 256>>>((const uint4 *)d, n / 16, o); }, (double)n);
    }
    cudaGetLastError();
    cudaFree(o);
    cudaFreeHost(h);
    return r;
}

extern "C" void dsv4_cuda_capture(int on)
{
    cudaDeviceSynchronize();
    if (on)
        cudaProfilerStart();
    else
        cudaProfilerStop();
}
