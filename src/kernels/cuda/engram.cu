/* CUDA backend: Engram's gate (backend.h: engram_gate), a block per (row, stream): the three
 * sums by the block's fixed-order reduction, then the update by column. */
#include <cuda_bf16.h>
#include <math.h>
#include "kernels/cuda/internal.h"

using namespace dsv4cu;

namespace {

__global__ void __launch_bounds__(NB) k_engram_gate(float *X, const float *kv, const float *w, int n, int D, float eps,
                                                    int round_bf16)
{
    PDL_WAIT();
    __shared__ float sh[NW + 1];
    int t = blockIdx.x, k = blockIdx.y;
    int64_t kw = (int64_t)(n + 1) * D;
    float *x = X + ((int64_t)t * n + k) * D;
    const float *key = kv + t * kw + (int64_t)k * D, *val = kv + t * kw + (int64_t)n * D, *wk = w + (int64_t)k * D;
    float d = 0.0f, xx = 0.0f, kk = 0.0f;
    for (int j = threadIdx.x; j < D; j += NB) {
        d = fmaf(x[j] * wk[j], key[j], d);
        xx = fmaf(x[j], x[j], xx);
        kk = fmaf(key[j], key[j], kk);
    }
    d = block_sum<NW>(d, sh);
    xx = block_sum<NW>(xx, sh);
    kk = block_sum<NW>(kk, sh);
    float rx = 1.0f / sqrtf(xx / D + eps), rk = 1.0f / sqrtf(kk / D + eps);
    float s = d * rx * rk * (1.0f / sqrtf((float)D));
    float sg = (float)((s > 0) - (s < 0)), gate = 1.0f / (1.0f + expf(-sg * sqrtf(fmaxf(fabsf(s), 1e-6f))));
    for (int j = threadIdx.x; j < D; j += NB) {
        float v = x[j] + gate * val[j];
        x[j] = round_bf16 ? __bfloat162float(__float2bfloat16_rn(v)) : v;
    }
}

} // namespace

void dsv4cu::cu_engram_gate(float *X, const float *kv, const float *w, int T, int n, int D, float eps, int round_bf16)
{
    if (T <= 0 || n <= 0 || D <= 0)
        return;
    int64_t nd = (int64_t)n * D;
    size_t bX = (size_t)T * nd * sizeof(float);
    op_begin();
    bool ok = given("engram_gate", {X, kv, w}) && n <= 65535;
    if (!ok && n > 65535)
        fail(DSV4_E_ARG, "cuda: engram_gate: more than 65535 streams");
    const float *dw = ok ? (const float *)dev_const(w, "engram_gate", "the streams' query weights") : NULL;
    bool ran = dw != NULL;
    if (ran) /* X is updated in place: nothing to poison */
        launch_k(k_engram_gate, dim3((unsigned)T, (unsigned)n), NB, 0, stream, X, kv, dw, n, D, eps, round_bf16);
    finish(ran, "engram_gate", X, bX);
    op_end();
}
