/* dsv4 dequant — one weight of a checkpoint as float32 row-major [out_features, in_features]. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "cli/cli.h"
#include "core/core.h"
#include "io/safetensors.h"
#include "io/weight.h"
#include "kernels/cpu/exl3.h"
#include "kernels/cpu/weight_decode.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dsv4 dequant -m DIR_OR_FILE --tensor NAME -o FILE [--shape OUT,IN] [--inner]\n"
            "  Writes the weight NAME as float32 row-major [out_features, in_features] (raw, no header).\n"
            "  NAME: the weight tensor (e.g. layers.0.attn.wq_a.weight) or, for EXL3, the layer prefix.\n"
            "  Forms: F32, BF16, F16, FP8 e4m3 (+ .scale F32 or E8M0, block size from its shape),\n"
            "  packed FP4 (+ .scale per group), EXL3 (.trellis, .suh/.svh or .su/.sv, .mcg/.mul1).\n"
            "  --shape OUT,IN  EXL3 only: the layer's logical size (default: the padded trellis size)\n"
            "  --inner         EXL3 only: write the decoded tiles (no rotations or scales), exact\n");
}

/* The layer prefix and logical [n, k] of NAME as stored. */
static int resolve(const dsv4_st *st, const char *name, char *prefix, size_t cap, int64_t *n, int64_t *k, int *exl3)
{
    char buf[600];
    size_t l = strlen(name);
    snprintf(prefix, cap, "%s", name);
    if (l > 8 && !strcmp(name + l - 8, ".trellis"))
        prefix[l - 8] = 0;
    else if (l > 7 && !strcmp(name + l - 7, ".weight"))
        prefix[l - 7] = 0;
    snprintf(buf, sizeof buf, "%s.trellis", prefix);
    if (dsv4_st_find(st, buf)) {
        *exl3 = 1;
        return 0;
    }
    *exl3 = 0;
    snprintf(buf, sizeof buf, "%s.weight", prefix);
    const dsv4_tensor *t = dsv4_st_find(st, buf);
    if (!t || t->ndim != 2)
        return -1;
    *n = t->shape[0];
    *k = t->dtype == DSV4_DT_I8 || t->dtype == DSV4_DT_U8 ? 2 * t->shape[1] : t->shape[1];
    return 0;
}

int dsv4_cmd_dequant(int argc, char **argv)
{
    const char *model = NULL, *tensor = NULL, *outp = NULL, *shape = NULL;
    int inner = 0;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--inner")) {
            inner = 1;
        } else if (i + 1 < argc && !strcmp(argv[i], "-m")) {
            model = argv[++i];
        } else if (i + 1 < argc && !strcmp(argv[i], "--tensor")) {
            tensor = argv[++i];
        } else if (i + 1 < argc && !strcmp(argv[i], "-o")) {
            outp = argv[++i];
        } else if (i + 1 < argc && !strcmp(argv[i], "--shape")) {
            shape = argv[++i];
        } else {
            fprintf(stderr, "dsv4 dequant: unknown or incomplete option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!model || !tensor || !outp) {
        usage(stderr);
        return 2;
    }
    long long sn = 0, sk = 0;
    if (shape && (sscanf(shape, "%lld,%lld", &sn, &sk) != 2 || sn <= 0 || sk <= 0)) {
        fprintf(stderr, "dsv4 dequant: --shape wants OUT,IN (two positive integers), got '%s'\n", shape);
        return 2;
    }
    dsv4_err err = {0};
    struct stat sb;
    int is_dir = stat(model, &sb) == 0 && S_ISDIR(sb.st_mode);
    dsv4_st *st = is_dir ? dsv4_st_open_dir(model, &err) : dsv4_st_open_file(model, &err);
    if (!st) {
        fprintf(stderr, "dsv4 dequant: %s\n", err.msg);
        return 1;
    }
    char prefix[512];
    int64_t n = sn, k = sk;
    int exl3 = 0, rc = 1;
    float *out = NULL;
    dsv4_weight w = {0};
    if (resolve(st, tensor, prefix, sizeof prefix, &n, &k, &exl3)) {
        fprintf(stderr, "dsv4 dequant: %s: no weight %s (neither %s.weight [out, in] nor %s.trellis)\n", model, tensor,
                prefix, prefix);
        goto done;
    }
    if (!exl3 && (shape || inner)) {
        fprintf(stderr, "dsv4 dequant: --shape and --inner apply to EXL3 layers only; %s is not one\n", tensor);
        goto done;
    }
    if (dsv4_weight_bind(st, prefix, n, k, NULL, &w, &err) ||
        (exl3 && is_dir && dsv4_exl3_check_config(model, w.exl3, &err))) {
        fprintf(stderr, "dsv4 dequant: %s\n", err.msg);
        goto done;
    }
    out = dsv4_xmalloc((size_t)w.n * w.k * sizeof(float), &err);
    if (!out) {
        fprintf(stderr, "dsv4 dequant: %s\n", err.msg);
        goto done;
    }
    if (exl3) {
        dsv4_exl3_dequant(w.exl3, inner, out);
    } else {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < w.n; r++)
            dsv4_weight_row(&w, r, out + r * w.k);
    }
    FILE *f = fopen(outp, "wb");
    if (!f || fwrite(out, sizeof(float), (size_t)w.n * w.k, f) != (size_t)w.n * w.k) {
        fprintf(stderr, "dsv4 dequant: %s: cannot write\n", outp);
        if (f)
            fclose(f);
        goto done;
    }
    if (fclose(f)) {
        fprintf(stderr, "dsv4 dequant: %s: cannot write\n", outp);
        goto done;
    }
    if (exl3)
        fprintf(stderr, "%s: EXL3 K=%d %s [%lld, %lld] (padded [%lld, %lld]) -> %s\n", prefix, w.exl3->K,
                w.exl3->cb == DSV4_EXL3_MCG ? "mcg" : w.exl3->cb == DSV4_EXL3_MUL1 ? "mul1" : "3inst", (long long)w.n,
                (long long)w.k, (long long)w.exl3->np, (long long)w.exl3->kp, outp);
    else
        fprintf(stderr, "%s: %s [%lld, %lld] -> %s\n", w.name, dsv4_wform_name(w.form), (long long)w.n, (long long)w.k, outp);
    rc = 0;
done:
    free(out);
    dsv4_weight_release(&w);
    dsv4_st_close(st);
    return rc;
}
