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

/* q [H, d], keys [nk, d] (K = V) or, when kp is set, key i at kp[i] (device rows), sink [H],
 * p [H, nk] scratch, out [H, d]; attend_head's order. */
__global__ void __launch_bounds__(NB) k_attend(const float *q, int d, const float *keys, const float *const *kp, int nk,
                                               float scale, const float *sink, float *p_all, float *out)
{
    PDL_WAIT();
    __shared__ float sh[NW + 1], part[NW * ATT_MAXD];
    int h = blockIdx.x;
    auto key = [&](int i) { return kp ? kp[i] : keys + (int64_t)i * d; };
    attend_head<NW>(q + (int64_t)h * d, key, nk, d, scale, sink[h], p_all + (int64_t)h * nk, sh, part, out + (int64_t)h * d);
}

static float *g_keys;           /* host staging for the gathered key rows */
static size_t g_keys_cap;

/* Key rows in host memory are gathered on the host and sent as one matrix; rows in device
 * memory (the model's memory on this device) are read where they are, through the pointer
 * table. A call mixing the two is refused. */
void dsv4cu::cu_attend(const float *q, int H, int d, const float *const *keys, int nk, float scale, const float *sink,
                      float *out)
{
    if (H <= 0 || d <= 0)
        return;
    size_t bo = (size_t)H * d * sizeof(float);
    op_begin();
    int dev = nk > 0 && on_dev(keys[0]), ok = 1;
    for (int i = 1; i < nk && ok; i++)
        if (on_dev(keys[i]) != dev) {
            fail(DSV4_E_ARG, "cuda: attend: key rows %d and %d are in different memories (host and device)", 0, i);
            ok = 0;
        }
    size_t kb = (size_t)(nk > 0 ? nk : 1) * d * sizeof(float);
    if (ok && !dev && kb > g_keys_cap) {
        float *nkeys = (float *)realloc(g_keys, kb);
        if (nkeys) {
            g_keys = nkeys;
            g_keys_cap = kb;
        }
    }
    if (ok && !dev && kb > g_keys_cap) {
        fail(DSV4_E_NOMEM, "cuda: attend: out of host memory staging %d keys", nk);
        ok = 0;
    }
    for (int i = 0; ok && !dev && i < nk; i++)
        memcpy(g_keys + (size_t)i * d, keys[i], d * sizeof(float));
    const float *ds = ok ? (const float *)dev_const(sink, H * sizeof(float)) : NULL;
    const float *dq = ok ? (const float *)in_buf(q, bo) : NULL;
    const float *const *kp = ok && dev ? (const float *const *)in_buf(keys, (size_t)nk * sizeof *keys) : NULL;
    float *dk = ok && !dev ? dev_in(g_keys, nk, d, d) : NULL;
    float *dp = ok ? (float *)scratch((size_t)H * (nk > 0 ? nk : 1) * sizeof(float)) : NULL;
    float *dout = ok ? (float *)out_buf(out, bo, 1) : NULL;
    bool ran = ds && dq && (dev ? kp != NULL : dk != NULL) && dp && dout;
    if (ran)
        launch_k(k_attend, H, NB, 0, stream, dq, d, (const float *)dk, kp, nk, scale, ds, dp, dout);
    finish(ran, "attend", out, dout, bo);
    op_end();
}
