/* kernels/cpu/weight_decode — the reference path's row decode of a bound weight, any form. */
#include <string.h>
#include "core/core.h"
#include "kernels/cpu/exl3.h"
#include "kernels/cpu/weight_decode.h"

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

static inline float scale_at(const dsv4_weight *w, int64_t i)
{
    return w->scale_e8m0 ? dsv4_e8m0_to_f32(((const uint8_t *)w->scale)[i]) : ((const float *)w->scale)[i];
}

void dsv4_weight_row(const dsv4_weight *w, int64_t r, float *out)
{
    int64_t k = w->k;
    switch (w->form) {
    case DSV4_WF_F32:
        memcpy(out, (const float *)w->data + r * k, k * sizeof(float));
        break;
    case DSV4_WF_BF16: {
        const uint16_t *p = (const uint16_t *)w->data + r * k;
        for (int64_t i = 0; i < k; i++)
            out[i] = dsv4_bf16_to_f32(p[i]);
        break;
    }
    case DSV4_WF_F16: {
        const uint16_t *p = (const uint16_t *)w->data + r * k;
        for (int64_t i = 0; i < k; i++)
            out[i] = dsv4_f16_to_f32(p[i]);
        break;
    }
    case DSV4_WF_FP8: {
        const uint8_t *p = (const uint8_t *)w->data + r * k;
        int64_t sk = cdiv(k, w->bk), srow = (r / w->bn) * sk;
        for (int64_t b = 0; b < sk; b++) {
            float s = scale_at(w, srow + b);
            int64_t e = (b + 1) * w->bk < k ? (b + 1) * w->bk : k;
            for (int64_t i = b * w->bk; i < e; i++)
                out[i] = dsv4_e4m3_lut[p[i]] * s;
        }
        break;
    }
    case DSV4_WF_FP4: {
        const uint8_t *p = (const uint8_t *)w->data + r * (k / 2);
        int64_t sk = k / w->bk;
        for (int64_t b = 0; b < sk; b++) {
            float s = scale_at(w, r * sk + b);
            for (int64_t i = b * w->bk; i < (b + 1) * w->bk; i += 2) {
                uint8_t q = p[i / 2];
                out[i] = dsv4_e2m1_lut[q & 15] * s;
                out[i + 1] = dsv4_e2m1_lut[q >> 4] * s;
            }
        }
        break;
    }
    case DSV4_WF_EXL3:
        dsv4_exl3_row(w->exl3, r, out);
        break;
    default:
        memset(out, 0, k * sizeof(float));
        break;
    }
}
