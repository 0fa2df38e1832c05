#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "io/weight.h"
#include "io/exl3_format.h"

static const char *wform_names[DSV4_WF_COUNT] = {"F32", "BF16", "F16", "FP8", "FP4", "EXL3"};
const char *dsv4_wform_name(dsv4_wform f) { return f < DSV4_WF_COUNT ? wform_names[f] : "?"; }

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

static int scale_ok(const dsv4_tensor *s)
{
    return s->dtype == DSV4_DT_F32 || s->dtype == DSV4_DT_F8_E8M0;
}

/* EXL3: a layer is trellis-coded when prefix.trellis exists (its .scale, if any, is not read). */
static int bind_exl3(const dsv4_st *st, const char *prefix, int64_t n, int64_t k, dsv4_weight *out, dsv4_err *err)
{
    dsv4_exl3 *e;
    if (dsv4_exl3_bind(st, prefix, n, k, &e, err))
        return err->code;
    out->name = e->prefix;
    out->form = DSV4_WF_EXL3;
    out->n = e->n;
    out->k = e->k;
    out->data = e->trellis;
    out->exl3 = e;
    out->bytes = e->bytes;
    return 0;
}

void dsv4_weight_release(dsv4_weight *w)
{
    if (w->form == DSV4_WF_EXL3)
        dsv4_exl3_free((dsv4_exl3 *)w->exl3);
    w->exl3 = NULL;
    free(w->owned);
    w->owned = NULL;
}

int dsv4_weight_scales_e8m0(dsv4_weight *w)
{
    if ((w->form != DSV4_WF_FP8 && w->form != DSV4_WF_FP4) || !w->scale || w->scale_e8m0 || w->owned || w->bn <= 0 ||
        w->bk <= 0)
        return 0;
    size_t n = w->form == DSV4_WF_FP8 ? (size_t)cdiv(w->n, w->bn) * (size_t)cdiv(w->k, w->bk) : (size_t)w->n * (size_t)(w->k / w->bk);
    uint8_t *b = malloc(n ? n : 1);
    if (!b)
        return 0;
    const uint8_t *f = w->scale;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, f + 4 * i, 4);
        uint32_t e = u >> 23 & 0xff;
        /* a positive power of two: no mantissa bits, no sign, a normal exponent; its exponent
         * field is the e8m0 byte of the same value */
        if ((u & 0x807fffffu) || e == 0 || e == 255) {
            free(b);
            return 0;
        }
        b[i] = (uint8_t)e;
    }
    w->scale = b;
    w->scale_e8m0 = 1;
    w->owned = b;
    return 1;
}

int dsv4_weight_bind(const dsv4_st *st, const char *prefix, int64_t n, int64_t k, const int fp8_block[2],
                     dsv4_weight *out, dsv4_err *err)
{
    char name[512], sname[512], sh[96], sh2[96];
    memset(out, 0, sizeof *out);
    snprintf(name, sizeof name, "%s.trellis", prefix);
    if (dsv4_st_find(st, name))
        return bind_exl3(st, prefix, n, k, out, err);
    snprintf(name, sizeof name, "%s.weight", prefix);
    snprintf(sname, sizeof sname, "%s.scale", prefix);
    const dsv4_tensor *t = dsv4_st_find(st, name);
    if (!t)
        return dsv4_fail(err, DSV4_E_MODEL, "tensor %s: missing from the checkpoint %s", name, dsv4_st_label(st));
    out->name = t->name;
    out->n = n;
    out->k = k;
    out->data = t->data;
    out->bytes = t->nbytes;
    const char *file = dsv4_st_file_path(st, t->file);
    if (t->ndim != 2)
        return dsv4_fail(err, DSV4_E_MODEL, "%s: tensor %s: shape %s, expected 2 dimensions [%lld, %lld]", file, name,
                         dsv4_tensor_shape(t, sh, sizeof sh), (long long)n, (long long)k);
    switch (t->dtype) {
    case DSV4_DT_F32:
    case DSV4_DT_BF16:
    case DSV4_DT_F16:
        out->form = t->dtype == DSV4_DT_F32 ? DSV4_WF_F32 : t->dtype == DSV4_DT_BF16 ? DSV4_WF_BF16 : DSV4_WF_F16;
        if (t->shape[0] != n || t->shape[1] != k)
            return dsv4_fail(err, DSV4_E_MODEL, "%s: tensor %s: shape %s, expected [%lld, %lld]", file, name,
                             dsv4_tensor_shape(t, sh, sizeof sh), (long long)n, (long long)k);
        return 0;
    case DSV4_DT_F8_E4M3:
    case DSV4_DT_I8:
    case DSV4_DT_U8: {
        int fp4 = t->dtype != DSV4_DT_F8_E4M3;
        out->form = fp4 ? DSV4_WF_FP4 : DSV4_WF_FP8;
        if (t->shape[0] != n || t->shape[1] != (fp4 ? k / 2 : k) || (fp4 && k % 2))
            return dsv4_fail(err, DSV4_E_MODEL, "%s: tensor %s: shape %s, expected [%lld, %lld] for %s", file, name,
                             dsv4_tensor_shape(t, sh, sizeof sh), (long long)n, (long long)(fp4 ? k / 2 : k),
                             fp4 ? "FP4 pairs" : "FP8");
        const dsv4_tensor *s = dsv4_st_find(st, sname);
        if (!s)
            return dsv4_fail(err, DSV4_E_MODEL, "tensor %s: missing from the checkpoint %s (the %s weight %s needs its block scales)",
                             sname, dsv4_st_label(st), fp4 ? "FP4" : "FP8", name);
        if (!scale_ok(s) || s->ndim != 2)
            return dsv4_fail(err, DSV4_E_MODEL, "%s: tensor %s: %s %s; scales must be F32 or F8_E8M0 with 2 dimensions",
                             dsv4_st_file_path(st, s->file), sname, dsv4_dtype_name(s->dtype), dsv4_tensor_shape(s, sh2, sizeof sh2));
        out->scale = s->data;
        out->scale_e8m0 = s->dtype == DSV4_DT_F8_E8M0;
        out->bytes += s->nbytes;
        int64_t sn = s->shape[0], sk = s->shape[1];
        if (fp4) {
            if (sn != n || sk <= 0 || k % sk)
                return dsv4_fail(err, DSV4_E_MODEL, "%s: tensor %s: shape %s does not give one scale per row and an equal group along [%lld, %lld]",
                                 dsv4_st_file_path(st, s->file), sname, dsv4_tensor_shape(s, sh2, sizeof sh2), (long long)n, (long long)k);
            out->bn = 1;
            out->bk = (int)(k / sk);
            return 0;
        }
        int64_t bn = fp8_block && fp8_block[0] > 0 ? fp8_block[0] : 128, bk = fp8_block && fp8_block[1] > 0 ? fp8_block[1] : 128;
        if (bn > n && n > 0) /* a block past the weight's edge is the whole weight: no kernel sizes a tile from it */
            bn = n;
        if (bk > k && k > 0)
            bk = k;
        if (sn > 0 && cdiv(n, bn) != sn)
            bn = cdiv(n, sn);
        if (sk > 0 && cdiv(k, bk) != sk)
            bk = cdiv(k, sk);
        if (sn <= 0 || sk <= 0 || bn <= 0 || bk <= 0 || bn > INT32_MAX || bk > INT32_MAX || cdiv(n, bn) != sn ||
            cdiv(k, bk) != sk)
            return dsv4_fail(err, DSV4_E_MODEL, "%s: tensor %s: shape %s fits no block size for the weight [%lld, %lld]",
                             dsv4_st_file_path(st, s->file), sname, dsv4_tensor_shape(s, sh2, sizeof sh2), (long long)n, (long long)k);
        out->bn = (int)bn;
        out->bk = (int)bk;
        return 0;
    }
    default:
        return dsv4_fail(err, DSV4_E_MODEL, "%s: tensor %s: dtype %s is not a weight form dsv4 reads (F32, BF16, F16, F8_E4M3, packed FP4 I8/U8)",
                         file, name, dsv4_dtype_name(t->dtype));
    }
}

float *dsv4_tensor_f32(const dsv4_st *st, const char *name, int64_t numel, dsv4_err *err)
{
    const dsv4_tensor *t = dsv4_st_find(st, name);
    if (!t) {
        dsv4_fail(err, DSV4_E_MODEL, "tensor %s: missing from the checkpoint %s", name, dsv4_st_label(st));
        return NULL;
    }
    if (t->numel != numel) {
        dsv4_fail(err, DSV4_E_MODEL, "%s: tensor %s: %lld elements, expected %lld", dsv4_st_file_path(st, t->file), name,
                  (long long)t->numel, (long long)numel);
        return NULL;
    }
    float *v = dsv4_xmalloc(numel * sizeof(float), err);
    if (!v)
        return NULL;
    for (int64_t i = 0; i < numel; i++) {
        switch (t->dtype) {
        case DSV4_DT_F32: v[i] = ((const float *)t->data)[i]; break;
        case DSV4_DT_BF16: v[i] = dsv4_bf16_to_f32(((const uint16_t *)t->data)[i]); break;
        case DSV4_DT_F16: v[i] = dsv4_f16_to_f32(((const uint16_t *)t->data)[i]); break;
        default:
            free(v);
            dsv4_fail(err, DSV4_E_MODEL, "%s: tensor %s: dtype %s, expected F32, BF16 or F16", dsv4_st_file_path(st, t->file),
                      name, dsv4_dtype_name(t->dtype));
            return NULL;
        }
    }
    return v;
}
