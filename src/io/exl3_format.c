/* io/exl3_format — an EXL3 trellis-coded linear layer as stored: binding and validating its
 * tensors (the format: ExLlamaV3's, as docs/exl3.md reads it; decode and multiply: kernels/cpu/exl3.h). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "io/exl3_format.h"

/* ---------------------------------------------------------------- binding */

/* A scale vector of `len` from prefix.<full> (F16/BF16/F32 values) or prefix.<legacy> (I16/U16
 * sign words, len/16 of them, bit b of word j = sign of element 16j + b, 1 = -1). */
static int read_scale(const dsv4_st *st, const char *prefix, const char *full, const char *legacy, int64_t len,
                      float *out, size_t *bytes, dsv4_err *err)
{
    char name[512], sh[96];
    snprintf(name, sizeof name, "%s.%s", prefix, full);
    const dsv4_tensor *t = dsv4_st_find(st, name);
    if (t) {
        if (t->numel != len || (t->dtype != DSV4_DT_F16 && t->dtype != DSV4_DT_BF16 && t->dtype != DSV4_DT_F32))
            return dsv4_fail(err, DSV4_E_UNSUPPORTED, "%s: tensor %s: %s %s, expected F16 [%lld]",
                             dsv4_st_file_path(st, t->file), name, dsv4_dtype_name(t->dtype), dsv4_tensor_shape(t, sh, sizeof sh),
                             (long long)len);
        for (int64_t i = 0; i < len; i++) {
            if (t->dtype == DSV4_DT_F32) {
                memcpy(&out[i], (const char *)t->data + 4 * i, 4);
            } else {
                uint16_t h;
                memcpy(&h, (const char *)t->data + 2 * i, 2);
                out[i] = t->dtype == DSV4_DT_F16 ? dsv4_f16_to_f32(h) : dsv4_bf16_to_f32(h);
            }
        }
        *bytes += t->nbytes;
        return 0;
    }
    snprintf(name, sizeof name, "%s.%s", prefix, legacy);
    t = dsv4_st_find(st, name);
    if (!t)
        return dsv4_fail(err, DSV4_E_MODEL, "tensor %s.%s: missing (neither .%s nor legacy .%s is present)", prefix, full,
                         full, legacy);
    if (t->numel != len / 16 || (t->dtype != DSV4_DT_I16 && t->dtype != DSV4_DT_U16))
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "%s: tensor %s: %s %s, expected I16 [%lld] sign words",
                         dsv4_st_file_path(st, t->file), name, dsv4_dtype_name(t->dtype), dsv4_tensor_shape(t, sh, sizeof sh),
                         (long long)(len / 16));
    for (int64_t j = 0; j < len / 16; j++) {
        uint16_t w;
        memcpy(&w, (const char *)t->data + 2 * j, 2);
        for (int b = 0; b < 16; b++)
            out[16 * j + b] = (w >> b) & 1 ? -1.0f : 1.0f;
    }
    *bytes += t->nbytes;
    return 0;
}

/* The codebook flag prefix.<suffix>: 0 absent, 1 present with the locked multiplier. */
static int read_flag(const dsv4_st *st, const char *prefix, const char *suffix, uint32_t mult, int *present,
                     dsv4_err *err)
{
    char name[512], sh[96];
    snprintf(name, sizeof name, "%s.%s", prefix, suffix);
    const dsv4_tensor *t = dsv4_st_find(st, name);
    *present = t != NULL;
    if (!t)
        return 0;
    if (t->numel != 1 || (t->dtype != DSV4_DT_I32 && t->dtype != DSV4_DT_U32))
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "%s: tensor %s: %s %s, expected an I32 scalar",
                         dsv4_st_file_path(st, t->file), name, dsv4_dtype_name(t->dtype), dsv4_tensor_shape(t, sh, sizeof sh));
    uint32_t v;
    memcpy(&v, t->data, 4);
    if (v != mult)
        return dsv4_fail(err, DSV4_E_UNSUPPORTED,
                         "%s: tensor %s: multiplier 0x%08X; only the locked 0x%08X is supported (files from before "
                         "exllamav3 0f2da5d may carry others)",
                         dsv4_st_file_path(st, t->file), name, v, mult);
    return 0;
}

int dsv4_exl3_bind(const dsv4_st *st, const char *prefix, int64_t n, int64_t k, dsv4_exl3 **out, dsv4_err *err)
{
    char name[512], sh[96];
    *out = NULL;
    snprintf(name, sizeof name, "%s.trellis", prefix);
    const dsv4_tensor *t = dsv4_st_find(st, name);
    if (!t)
        return dsv4_fail(err, DSV4_E_MODEL, "tensor %s: missing from the checkpoint", name);
    const char *file = dsv4_st_file_path(st, t->file);
    if ((t->dtype != DSV4_DT_I16 && t->dtype != DSV4_DT_U16) || t->ndim != 3 || t->shape[2] % 16 || t->shape[2] < 16 ||
        t->shape[2] > 128)
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "%s: tensor %s: %s %s, expected I16 [in/16, out/16, 16*K] with K in 1..8",
                         file, name, dsv4_dtype_name(t->dtype), dsv4_tensor_shape(t, sh, sizeof sh));
    int64_t kp = t->shape[0] * 16, np = t->shape[1] * 16;
    if (kp <= 0 || np <= 0 || kp % 128 || np % 128)
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "%s: tensor %s: shape %s: padded dims %lld x %lld are not multiples of 128",
                         file, name, dsv4_tensor_shape(t, sh, sizeof sh), (long long)kp, (long long)np);
    if (!n)
        n = np;
    if (!k)
        k = kp;
    if (n > np || k > kp || n < 0 || k < 0)
        return dsv4_fail(err, DSV4_E_MODEL, "%s: tensor %s: shape %s holds %lld x %lld (in x out), smaller than the layer's [%lld, %lld]",
                         file, name, dsv4_tensor_shape(t, sh, sizeof sh), (long long)kp, (long long)np, (long long)n, (long long)k);
    if ((uintptr_t)t->data % 2)
        return dsv4_fail(err, DSV4_E_FORMAT, "%s: tensor %s: data at an odd offset", file, name);
    int mcg, mul1;
    if (read_flag(st, prefix, "mcg", DSV4_EXL3_MCG_MULT, &mcg, err) ||
        read_flag(st, prefix, "mul1", DSV4_EXL3_MUL1_MULT, &mul1, err))
        return err->code;
    if (mcg && mul1)
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "EXL3 layer %s: both .mcg and .mul1 are present; a layer has one codebook",
                         prefix);
    char bname[512];
    snprintf(bname, sizeof bname, "%s.bias", prefix);
    const dsv4_tensor *bt = dsv4_st_find(st, bname);
    if (bt && ((bt->numel != np && bt->numel != n) ||
               (bt->dtype != DSV4_DT_F16 && bt->dtype != DSV4_DT_BF16 && bt->dtype != DSV4_DT_F32)))
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "%s: tensor %s: %s %s, expected F16 [%lld]", dsv4_st_file_path(st, bt->file),
                         bname, dsv4_dtype_name(bt->dtype), dsv4_tensor_shape(bt, sh, sizeof sh), (long long)np);
    size_t plen = strlen(prefix) + 1;
    size_t sz = sizeof(dsv4_exl3) + (size_t)(kp + np + (bt ? n : 0)) * sizeof(float) + plen;
    dsv4_exl3 *e = dsv4_xmalloc(sz, err);
    if (!e)
        return err->code;
    memset(e, 0, sizeof *e);
    e->suh = (float *)(e + 1);
    e->svh = e->suh + kp;
    e->bias = bt ? e->svh + np : NULL;
    e->prefix = (char *)(e->svh + np + (bt ? n : 0));
    memcpy(e->prefix, prefix, plen);
    e->K = (int)(t->shape[2] / 16);
    e->cb = mcg ? DSV4_EXL3_MCG : mul1 ? DSV4_EXL3_MUL1 : DSV4_EXL3_3INST;
    e->kp = kp;
    e->np = np;
    e->k = k;
    e->n = n;
    e->trellis = t->data;
    e->bytes = t->nbytes;
    if (read_scale(st, prefix, "suh", "su", kp, e->suh, &e->bytes, err) ||
        read_scale(st, prefix, "svh", "sv", np, e->svh, &e->bytes, err)) {
        free(e);
        return err->code;
    }
    if (bt) {
        for (int64_t c = 0; c < n; c++) {
            if (bt->dtype == DSV4_DT_F32) {
                memcpy(&e->bias[c], (const char *)bt->data + 4 * c, 4);
            } else {
                uint16_t h;
                memcpy(&h, (const char *)bt->data + 2 * c, 2);
                e->bias[c] = bt->dtype == DSV4_DT_F16 ? dsv4_f16_to_f32(h) : dsv4_bf16_to_f32(h);
            }
        }
        e->bytes += bt->nbytes;
    }
    *out = e;
    return 0;
}

void dsv4_exl3_free(dsv4_exl3 *e) { free(e); }

/* ---------------------------------------------------------------- quantization_config */


static int check_record(const char *path, const cJSON *qc, const dsv4_exl3 *e, dsv4_err *err)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(qc, "quant_method");
    if (cJSON_IsString(m) && strcmp(m->valuestring, "exl3"))
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "%s: quant_method '%s', but layer %s is stored as EXL3", path,
                         m->valuestring, e->prefix);
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(qc, "tensor_storage");
    const cJSON *rec = cJSON_IsObject(ts) ? cJSON_GetObjectItemCaseSensitive(ts, e->prefix) : NULL;
    if (!cJSON_IsObject(rec))
        return 0;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(rec, "quant_format");
    if (cJSON_IsString(fmt) && strcmp(fmt->valuestring, "exl3"))
        return dsv4_fail(err, DSV4_E_MODEL, "%s: tensor_storage.%s.quant_format is '%s' but %s.trellis exists", path,
                         e->prefix, fmt->valuestring, e->prefix);
    const cJSON *bpw = cJSON_GetObjectItemCaseSensitive(rec, "bits_per_weight");
    if (cJSON_IsNumber(bpw) && bpw->valuedouble != e->K)
        return dsv4_fail(err, DSV4_E_MODEL, "%s: tensor_storage.%s.bits_per_weight is %g but %s.trellis holds K = %d", path,
                         e->prefix, bpw->valuedouble, e->prefix, e->K);
    static const char *keys[3] = {NULL, "mcg_multiplier", "mul1_multiplier"};
    for (int cb = 1; cb < 3; cb++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(rec, keys[cb]);
        if (v && e->cb != cb)
            return dsv4_fail(err, DSV4_E_MODEL, "%s: tensor_storage.%s has %s but the layer has no .%s tensor", path,
                             e->prefix, keys[cb], cb == 1 ? "mcg" : "mul1");
    }
    return 0;
}

int dsv4_exl3_check_config(const char *dir, const dsv4_exl3 *e, dsv4_err *err)
{
    static const char *files[2] = {"quantization_config.json", "config.json"};
    for (int f = 0; f < 2; f++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, files[f]);
        char *txt = dsv4_read_file(path, NULL, NULL);
        if (!txt)
            continue;
        cJSON *j = cJSON_Parse(txt);
        free(txt);
        if (!j) {
            return dsv4_fail(err, DSV4_E_FORMAT, "%s: bad JSON", path);
        }
        const cJSON *qc = f ? cJSON_GetObjectItemCaseSensitive(j, "quantization_config") : j;
        int rc = cJSON_IsObject(qc) ? check_record(path, qc, e, err) : 0;
        cJSON_Delete(j);
        if (rc)
            return rc;
    }
    return 0;
}
