/* CUDA attend: one block per head over a table of key rows, with the sink. */
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

/* q [H, d], key i at kp[i] (rows of d in device memory; K = V), sink [H], p [H, nk] the softmax
 * weights, out [H, d]; attend_head's order. */
__global__ void __launch_bounds__(NB) k_attend(const float *q, int d, const float *const *kp, int nk, float scale,
                                               const float *sink, float *p_all, float *out)
{
    PDL_WAIT();
    __shared__ float sh[NW + 1], part[NW * ATT_MAXD];
    int h = blockIdx.x;
    auto key = [&](int i) { return kp[i]; };
    attend_head<NW>(q + (int64_t)h * d, key, nk, d, scale, sink[h], p_all + (int64_t)h * nk, sh, part, out + (int64_t)h * d);
}

/* Device room for the softmax weights [H, nk]. It grows by doubling, and an outgrown buffer is
 * kept (never freed): a recorded graph may still read it. Growing is not recordable. */
static growbuf g_probs;

static float *probs(size_t n) { return grow_buf(&g_probs, n, 2 * g_probs.n, "attend's weights buffer"); }

/* q, the key table, the key rows and out are device buffers (backend.h); the sink is a
 * constant (resident or device memory). */
void dsv4cu::cu_attend(const float *q, int H, int d, const float *const *keys, int nk, float scale, const float *sink,
                      float *out)
{
    if (H <= 0 || d <= 0)
        return;
    size_t bo = (size_t)H * d * sizeof(float);
    op_begin();
    bool ok = given("attend", {q, sink, out}) && (nk <= 0 || given("attend", {keys}));
    const float *ds = ok ? (const float *)dev_const(sink, "attend", "sink") : NULL;
    float *dp = ds ? probs((size_t)H * (nk > 0 ? nk : 1)) : NULL;
    bool ran = dp && poison_out(out, bo);
    if (ran)
        launch_k(k_attend, H, NB, 0, stream, q, d, keys, nk > 0 ? nk : 0, scale, ds, dp, out);
    finish(ran, "attend", out, bo);
    op_end();
}
