/* CUDA attend: one block per head over gathered keys, with the sink. */
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cuda/internal.h"

using namespace dsv4cu;

/* ---- attend: one block per head ---------------------------------------------------------- */

/* q [H, d], keys [nk, d] (K = V), sink [H], p [H, nk] scratch, out [H, d]; attend_head's
 * order. */
__global__ void __launch_bounds__(NB) k_attend(const float *q, int d, const float *keys, int nk, float scale,
                                               const float *sink, float *p_all, float *out)
{
    PDL_WAIT();
    __shared__ float sh[NW + 1], part[NW * ATT_MAXD];
    int h = blockIdx.x;
    auto key = [&](int i) { return keys + (int64_t)i * d; };
    attend_head<NW>(q + (int64_t)h * d, key, nk, d, scale, sink[h], p_all + (int64_t)h * nk, sh, part, out + (int64_t)h * d);
}

static float *g_keys;           /* host staging for the gathered key rows */
static size_t g_keys_cap;

void dsv4cu::cu_attend(const float *q, int H, int d, const float *const *keys, int nk, float scale, const float *sink,
                      float *out)
{
    if (H <= 0 || d <= 0)
        return;
    size_t bo = (size_t)H * d * sizeof(float);
    op_begin();
    size_t kb = (size_t)(nk > 0 ? nk : 1) * d * sizeof(float);
    if (kb > g_keys_cap) {
        float *nkeys = (float *)realloc(g_keys, kb);
        if (nkeys) {
            g_keys = nkeys;
            g_keys_cap = kb;
        }
    }
    int ok = kb <= g_keys_cap;
    if (!ok)
        fail(DSV4_E_NOMEM, "cuda: attend: out of host memory staging %d keys", nk);
    for (int i = 0; ok && i < nk; i++)
        memcpy(g_keys + (size_t)i * d, keys[i], d * sizeof(float));
    const float *ds = ok ? (const float *)dev_const(sink, H * sizeof(float)) : NULL;
    const float *dq = ok ? (const float *)in_buf(q, bo) : NULL;
    float *dk = ok ? dev_in(g_keys, nk, d, d) : NULL;
    float *dp = ok ? (float *)scratch((size_t)H * (nk > 0 ? nk : 1) * sizeof(float)) : NULL;
    float *dout = ok ? (float *)out_buf(out, bo, 1) : NULL;
    bool ran = ds && dq && dk && dp && dout;
    if (ran)
        launch_k(k_attend, H, NB, 0, stream, dq, d, dk, nk, scale, ds, dp, dout);
    finish(ran, "attend", out, dout, bo);
    op_end();
}
