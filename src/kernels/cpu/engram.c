/* kernels/cpu — Engram's gate (backend.h: engram_gate): each (row, stream) in turn, the sums in
 * index order. */
#include <math.h>
#include "core/core.h"
#include "kernels/cpu/cpu.h"

void dsv4_cpu_engram_gate(float *X, const float *kv, const float *w, int T, int n, int D, float eps, int round_bf16)
{
    int64_t kw = (int64_t)(n + 1) * D;
    float isd = 1.0f / sqrtf((float)D);
    for (int t = 0; t < T; t++) {
        const float *val = kv + t * kw + (int64_t)n * D;
        for (int k = 0; k < n; k++) {
            float *x = X + ((int64_t)t * n + k) * D;
            const float *key = kv + t * kw + (int64_t)k * D, *wk = w + (int64_t)k * D;
            float dot = 0;
            for (int j = 0; j < D; j++)
                dot += x[j] * wk[j] * key[j];
            float rx = 1.0f / sqrtf(dsv4_dot(x, x, D) / D + eps), rk = 1.0f / sqrtf(dsv4_dot(key, key, D) / D + eps);
            dot = dot * rx * rk * isd;
            float sg = (float)((dot > 0) - (dot < 0)), gate = 1.0f / (1.0f + expf(-sg * sqrtf(fmaxf(fabsf(dot), 1e-6f))));
            for (int j = 0; j < D; j++)
                x[j] += gate * val[j];
            if (round_bf16)
                dsv4_round_bf16(x, D);
        }
    }
}
