/* kernels/cuda — the RMS norm of a row held in registers, shared by rmsnorm and the hc sites'
 * fused norm so the two give the same bits. C++ only. */
#ifndef DSV4_CUDA_NORM_CUH
#define DSV4_CUDA_NORM_CUH

#include "kernels/cuda/internal.h"
#include "kernels/cuda/rounding.cuh"

namespace dsv4cu {

/* Rows of up to NB * RMS_V elements are held in registers: every load of a thread is issued
 * before the first use (y may alias x, which otherwise orders each store before the next load).
 * A thread's elements are summed in the same order either way. */
enum { RMS_V = 16 };

/* The RMS norm of one row held in registers by a block of NB threads (thread t holds channels
 * t + c NB, c < RMS_V, and their weights wv): the squares summed per thread in c order, then
 * the block's fixed-order sum; y = v / rms, times wv when weighted, each value through bf16 as
 * it is stored when rb (rmsnorm_rb). k_rmsnorm and the hc sites' fused norm both end here, so
 * the two give the same bits. sh: [NW + 1] shared floats. */
__device__ __forceinline__ void rms_out(const float (&v)[RMS_V], const float (&wv)[RMS_V], bool weighted, int dim,
                                        float eps, float *sh, float *y, bool rb = false)
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
        if (i < dim) {
            float o = weighted ? v[c] * inv * wv[c] : v[c] * inv;
            y[i] = rb ? rt_bf16(o) : o;
        }
    }
}


} // namespace dsv4cu

/* rmsnorm's kernel (norm.cu): row blockIdx.x of x [*, dim] into y, times w when given. */
__global__ void __launch_bounds__(dsv4cu::NB) k_rmsnorm(const float *x, int dim, const float *w, float eps, float *y);
/* rmsnorm_rb's: the same, each value of y through bf16. */
__global__ void __launch_bounds__(dsv4cu::NB) k_rmsnorm_rb(const float *x, int dim, const float *w, float eps, float *y);

#endif
