/* dsv4 quantize --exl3 — any dsv4-readable checkpoint to an EXL3 pack. Each source shard becomes
 * one output shard of the same name (so memory holds one shard's packed output at a time); the
 * linear layers are replaced by .trellis/.suh/.svh(/.mcg/.mul1), everything else is copied as
 * stored; config.json gains the exl3 quantization_config and quantization_config.json lists
 * every quantized layer. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "cli/cli.h"
#include "core/core.h"
#include "io/safetensors.h"
#include "io/st_write.h"
#include "io/weight.h"
#include "kernels/cpu/exl3.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dsv4 quantize --exl3 BITS [--head-bits B] [--codebook mul1|mcg|3inst] [--seed S] [--only LIST]\n"
            "                     -m SRC -o DST\n"
            "  Makes an EXL3 pack from SRC (a checkpoint folder or one .safetensors file) in the folder DST.\n"
            "  BITS, B: integer bits per weight 1..8 (B for head.weight; default 6). Quantized: the attention\n"
            "  projections (wq_a, wq_b, wkv, wo_a, wo_b, compressor wkv/wgate, indexer wq_b), routed and shared\n"
            "  experts (w1, w2, w3) and the head; everything else (embeddings, norms, router, hc params, indexer\n"
            "  weights_proj) is copied as stored. Codebook default mul1. Method: random-sign Hadamard rotation\n"
            "  on both sides with the output-channel RMS and a global scale folded into svh/suh, then a\n"
            "  tail-biting Viterbi search per 16x16 tile (no calibration data: plain weight MSE).\n"
            "  --only LIST: quantize only the linears whose name contains one of these comma-separated\n"
            "  fragments (the rest are copied). Prints one line per quantized tensor: relative Frobenius\n"
            "  error ||W - Q||/||W|| and speed.\n");
}

/* 0: copy; 1: a linear layer the pack quantizes; 2: the head. prefix: the name less ".weight". */
static int linear_kind(const char *prefix)
{
    static const char *tails[] = {
        ".attn.wq_a", ".attn.wq_b", ".attn.wkv", ".attn.wo_a", ".attn.wo_b", ".attn.compressor.wkv",
        ".attn.compressor.wgate", ".attn.indexer.wq_b", ".attn.indexer.compressor.wkv", ".attn.indexer.compressor.wgate",
        ".shared_experts.w1", ".shared_experts.w2", ".shared_experts.w3",
    };
    if (!strcmp(prefix, "head"))
        return 2;
    size_t l = strlen(prefix);
    for (size_t i = 0; i < sizeof tails / sizeof tails[0]; i++) {
        size_t tl = strlen(tails[i]);
        if (l > tl && !strcmp(prefix + l - tl, tails[i]))
            return 1;
    }
    /* routed experts: ...experts.<E>.w1|w2|w3 */
    const char *e = strstr(prefix, ".experts.");
    if (e && !strstr(prefix, "shared_experts")) {
        const char *p = e + 9;
        while (*p >= '0' && *p <= '9')
            p++;
        if (p > e + 9 && (!strcmp(p, ".w1") || !strcmp(p, ".w2") || !strcmp(p, ".w3")))
            return 1;
    }
    return 0;
}

/* The logical [n, k] of a stored 2-D weight (packed FP4 holds two values per byte). */
static void weight_dims(const dsv4_tensor *t, int64_t *n, int64_t *k)
{
    *n = t->shape[0];
    *k = t->dtype == DSV4_DT_I8 || t->dtype == DSV4_DT_U8 ? 2 * t->shape[1] : t->shape[1];
}

/* --only: a comma-separated list of name fragments; NULL quantizes every linear. */
static const char *only_list;

static int selected(const char *prefix)
{
    if (!only_list)
        return 1;
    for (const char *p = only_list; *p;) {
        const char *e = strchr(p, ',');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        char frag[256];
        snprintf(frag, sizeof frag, "%.*s", (int)(l < sizeof frag ? l : sizeof frag - 1), p);
        if (l && strstr(prefix, frag))
            return 1;
        p += l + (e != NULL);
    }
    return 0;
}

static int quant_target(const dsv4_tensor *t, char *prefix, size_t cap)
{
    size_t l = strlen(t->name);
    if (l <= 7 || strcmp(t->name + l - 7, ".weight") || t->ndim != 2)
        return 0;
    snprintf(prefix, cap, "%.*s", (int)(l - 7), t->name);
    return selected(prefix) ? linear_kind(prefix) : 0;
}

/* True when t is the .scale of a weight this run quantizes (it is not copied). */
static int is_dropped_scale(const dsv4_st *st, const dsv4_tensor *t)
{
    size_t l = strlen(t->name);
    if (l <= 6 || strcmp(t->name + l - 6, ".scale"))
        return 0;
    char wname[600], prefix[512];
    snprintf(wname, sizeof wname, "%.*s.weight", (int)(l - 6), t->name);
    const dsv4_tensor *w = dsv4_st_find(st, wname);
    return w && quant_target(w, prefix, sizeof prefix);
}

typedef struct qout {
    char names[4][540];
    uint16_t *trellis, *suh, *svh;
    uint32_t mult;
} qout;

static void progress_cb(void *ctx, int64_t tiles) { dsv4_progress_step(ctx, (uint64_t)tiles); }


static int write_json(const char *path, cJSON *j)
{
    char *s = cJSON_Print(j);
    FILE *f = s ? fopen(path, "w") : NULL;
    int ok = f && fputs(s, f) >= 0 && fputc('\n', f) != EOF;
    if (f && fclose(f))
        ok = 0;
    free(s);
    if (!ok)
        fprintf(stderr, "dsv4 quantize: %s: cannot write\n", path);
    return ok ? 0 : -1;
}

/* Copies the source folder's other files (tokenizer, generation config, ...) into dst. */
static int copy_side_files(const char *src, const char *dst)
{
    DIR *d = opendir(src);
    if (!d)
        return 0;
    int rc = 0;
    for (struct dirent *de; (de = readdir(d)) && !rc;) {
        const char *nm = de->d_name;
        size_t l = strlen(nm);
        if (nm[0] == '.' || (l > 12 && !strcmp(nm + l - 12, ".safetensors")) || !strcmp(nm, "config.json") ||
            !strcmp(nm, "quantization_config.json") || !strcmp(nm, "model.safetensors.index.json"))
            continue;
        char sp[4400], dp[4400];
        snprintf(sp, sizeof sp, "%s/%s", src, nm);
        snprintf(dp, sizeof dp, "%s/%s", dst, nm);
        struct stat sb;
        if (stat(sp, &sb) || !S_ISREG(sb.st_mode))
            continue;
        FILE *in = fopen(sp, "rb"), *out = in ? fopen(dp, "wb") : NULL;
        char buf[65536];
        size_t n;
        while (out && (n = fread(buf, 1, sizeof buf, in)) > 0)
            if (fwrite(buf, 1, n, out) != n)
                rc = -1;
        if (!out || (in && ferror(in)))
            rc = -1;
        if (in)
            fclose(in);
        if (out && fclose(out))
            rc = -1;
        if (rc)
            fprintf(stderr, "dsv4 quantize: cannot copy %s to %s\n", sp, dp);
    }
    closedir(d);
    return rc;
}

static uint64_t name_hash(const char *s, uint64_t seed)
{
    uint64_t h = 1469598103934665603ull ^ seed;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

int dsv4_cmd_quantize(int argc, char **argv)
{
    const char *src = NULL, *dst = NULL, *cbname = "mul1";
    int bits = 0, head_bits = 6;
    unsigned long long seed = 1;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            usage(stdout);
            return 0;
        } else if (i + 1 < argc && !strcmp(argv[i], "--exl3")) {
            bits = atoi(argv[++i]);
        } else if (i + 1 < argc && !strcmp(argv[i], "--head-bits")) {
            head_bits = atoi(argv[++i]);
        } else if (i + 1 < argc && !strcmp(argv[i], "--codebook")) {
            cbname = argv[++i];
        } else if (i + 1 < argc && !strcmp(argv[i], "--only")) {
            only_list = argv[++i];
        } else if (i + 1 < argc && !strcmp(argv[i], "--seed")) {
            seed = strtoull(argv[++i], NULL, 10);
        } else if (i + 1 < argc && !strcmp(argv[i], "-m")) {
            src = argv[++i];
        } else if (i + 1 < argc && !strcmp(argv[i], "-o")) {
            dst = argv[++i];
        } else {
            fprintf(stderr, "dsv4 quantize: unknown or incomplete option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    int cb = !strcmp(cbname, "3inst") ? DSV4_EXL3_3INST : !strcmp(cbname, "mcg") ? DSV4_EXL3_MCG
                                                        : !strcmp(cbname, "mul1") ? DSV4_EXL3_MUL1 : -1;
    if (!src || !dst || bits < 1 || bits > 8 || head_bits < 1 || head_bits > 8 || cb < 0) {
        fprintf(stderr, "dsv4 quantize: need --exl3 BITS (1..8), -m SRC and -o DST; --head-bits 1..8; --codebook "
                        "mul1, mcg or 3inst\n");
        usage(stderr);
        return 2;
    }
    dsv4_err err = {0};
    struct stat sb;
    int is_dir = stat(src, &sb) == 0 && S_ISDIR(sb.st_mode);
    char srcdir[4096];
    snprintf(srcdir, sizeof srcdir, "%s", src);
    if (!is_dir)
        snprintf(srcdir, sizeof srcdir, "%s", dirname(srcdir));
    dsv4_st *st = is_dir ? dsv4_st_open_dir(src, &err) : dsv4_st_open_file(src, &err);
    if (!st) {
        fprintf(stderr, "dsv4 quantize: %s\n", err.msg);
        return 1;
    }
    if (mkdir(dst, 0755) && errno != EEXIST) {
        fprintf(stderr, "dsv4 quantize: %s: cannot create: %s\n", dst, strerror(errno));
        dsv4_st_close(st);
        return 1;
    }
    /* total tiles, for the progress line */
    uint64_t total = 0;
    int nq = 0;
    char prefix[512];
    for (int i = 0; i < dsv4_st_count(st); i++) {
        const dsv4_tensor *t = dsv4_st_at(st, i);
        if (quant_target(t, prefix, sizeof prefix)) {
            int64_t n, k;
            weight_dims(t, &n, &k);
            total += (uint64_t)((k + 127) / 128 * 8) * ((n + 127) / 128 * 8);
            nq++;
        }
    }
    fprintf(stderr, "dsv4 quantize: %d linear layers, %llu tiles, K=%d (head %d), codebook %s\n", nq,
            (unsigned long long)total, bits, head_bits, cbname);
    cJSON *storage = cJSON_CreateObject(), *wmap = cJSON_CreateObject();
    dsv4_progress prog;
    dsv4_progress_begin(&prog, "quantize", total, 1);
    int rc = 0, nfiles = 0;
    double t_all = dsv4_now(), err2 = 0, ref2 = 0, qbytes = 0, qweights = 0;
    int64_t tiles_all = 0;
    for (int f = 0; !rc; f++) {
        /* the tensors of file f (files are numbered from 0 in load order) */
        int cnt = 0;
        for (int i = 0; i < dsv4_st_count(st); i++)
            cnt += dsv4_st_at(st, i)->file == f;
        if (!cnt) {
            int any_later = 0;
            for (int i = 0; i < dsv4_st_count(st); i++)
                any_later |= dsv4_st_at(st, i)->file > f;
            if (!any_later)
                break;
            continue;
        }
        nfiles++;
        char fpath[4096], fname[1024];
        snprintf(fpath, sizeof fpath, "%s", dsv4_st_file_path(st, f));
        snprintf(fname, sizeof fname, "%s", basename(fpath));
        dsv4_st_out *outs = calloc((size_t)cnt * 5, sizeof *outs);
        qout *qs = calloc((size_t)cnt, sizeof *qs);
        int no = 0, nqo = 0;
        for (int i = 0; i < dsv4_st_count(st) && !rc; i++) {
            const dsv4_tensor *t = dsv4_st_at(st, i);
            if (t->file != f || is_dropped_scale(st, t))
                continue;
            int kind = quant_target(t, prefix, sizeof prefix);
            if (!kind) {
                outs[no++] = (dsv4_st_out){t->name, t->dtype, t->ndim, {0}, t->data};
                memcpy(outs[no - 1].shape, t->shape, sizeof t->shape);
                cJSON_AddStringToObject(wmap, t->name, fname);
                continue;
            }
            int K = kind == 2 ? head_bits : bits;
            int64_t n, k;
            weight_dims(t, &n, &k);
            dsv4_weight w;
            if (dsv4_weight_bind(st, prefix, n, k, NULL, &w, &err)) {
                fprintf(stderr, "dsv4 quantize: %s\n", err.msg);
                rc = 1;
                break;
            }
            int64_t kp = (k + 127) / 128 * 128, np = (n + 127) / 128 * 128;
            qout *q = &qs[nqo++];
            q->trellis = malloc((size_t)(kp / 16) * (np / 16) * 16 * K * 2);
            q->suh = malloc(kp * 2);
            q->svh = malloc(np * 2);
            dsv4_exl3_qstats qst;
            if (!q->trellis || !q->suh || !q->svh) {
                fprintf(stderr, "dsv4 quantize: %s: out of memory\n", prefix);
                dsv4_weight_release(&w);
                rc = 1;
                break;
            }
            if (dsv4_exl3_quantize(&w, K, cb, name_hash(prefix, seed), q->trellis, q->suh, q->svh, &qst, progress_cb,
                                   &prog, &err)) {
                fprintf(stderr, "dsv4 quantize: %s\n", err.msg);
                dsv4_weight_release(&w);
                rc = 1;
                break;
            }
            static const char *sfx[3] = {"trellis", "suh", "svh"};
            for (int s = 0; s < 3; s++)
                snprintf(q->names[s], sizeof q->names[s], "%s.%s", prefix, sfx[s]);
            outs[no++] = (dsv4_st_out){q->names[0], DSV4_DT_I16, 3, {kp / 16, np / 16, 16 * K}, q->trellis};
            outs[no++] = (dsv4_st_out){q->names[1], DSV4_DT_F16, 1, {kp}, q->suh};
            outs[no++] = (dsv4_st_out){q->names[2], DSV4_DT_F16, 1, {np}, q->svh};
            cJSON *rec = cJSON_CreateObject(), *stored = cJSON_CreateObject();
            int nout = 3;
            if (cb != DSV4_EXL3_3INST) {
                q->mult = cb == DSV4_EXL3_MCG ? DSV4_EXL3_MCG_MULT : DSV4_EXL3_MUL1_MULT;
                snprintf(q->names[3], sizeof q->names[3], "%s.%s", prefix, cb == DSV4_EXL3_MCG ? "mcg" : "mul1");
                outs[no++] = (dsv4_st_out){q->names[3], DSV4_DT_I32, 0, {0}, &q->mult};
                nout = 4;
            }
            for (int s = 0; s < nout; s++) {
                const dsv4_st_out *o = &outs[no - nout + s];
                cJSON *e = cJSON_CreateObject(), *sh = cJSON_CreateArray();
                size_t nb = dsv4_dtype_size(o->dtype);
                for (int d = 0; d < o->ndim; d++) {
                    cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)o->shape[d]));
                    nb *= (size_t)o->shape[d];
                }
                cJSON_AddItemToObject(e, "shape", sh);
                cJSON_AddNumberToObject(e, "n_bytes", (double)nb);
                cJSON_AddStringToObject(e, "dtype", dsv4_dtype_name(o->dtype));
                cJSON_AddItemToObject(stored, o->name, e);
                cJSON_AddStringToObject(wmap, o->name, fname);
                qbytes += nb;
            }
            cJSON_AddItemToObject(rec, "stored_tensors", stored);
            cJSON_AddStringToObject(rec, "quant_format", "exl3");
            cJSON_AddNumberToObject(rec, "bits_per_weight", K);
            if (cb != DSV4_EXL3_3INST)
                cJSON_AddNumberToObject(rec, cb == DSV4_EXL3_MCG ? "mcg_multiplier" : "mul1_multiplier", q->mult);
            cJSON_AddItemToObject(storage, prefix, rec);
            err2 += qst.err2;
            ref2 += qst.ref2;
            qweights += (double)n * k;
            tiles_all += qst.tiles;
            printf("%-48s %-4s [%lld, %lld] K=%d  rel.err %.5f  (tile mse %.5f)  %lld tiles %.1fs  %.1f tiles/s\n", prefix,
                   dsv4_wform_name(w.form), (long long)n, (long long)k, K, sqrt(qst.err2 / (qst.ref2 + 1e-300)),
                   qst.tile_se / (qst.tile_ref2 + 1e-300), (long long)qst.tiles, qst.secs, qst.tiles / qst.secs);
            fflush(stdout);
            dsv4_weight_release(&w);
        }
        if (!rc) {
            char opath[5200];
            snprintf(opath, sizeof opath, "%s/%s", dst, fname);
            if (dsv4_st_write(opath, outs, no, "{\"format\":\"pt\"}", &err)) {
                fprintf(stderr, "dsv4 quantize: %s\n", err.msg);
                rc = 1;
            }
        }
        for (int i = 0; i < nqo; i++) {
            free(qs[i].trellis);
            free(qs[i].suh);
            free(qs[i].svh);
        }
        free(qs);
        free(outs);
    }
    dsv4_progress_end(&prog);
    double secs = dsv4_now() - t_all;
    cJSON *qc = cJSON_CreateObject();
    cJSON_AddStringToObject(qc, "quant_method", "exl3");
    char ver[64];
    snprintf(ver, sizeof ver, "dsv4 %s", dsv4_version());
    cJSON_AddStringToObject(qc, "version", ver);
    cJSON_AddNumberToObject(qc, "bits", bits);
    cJSON_AddNumberToObject(qc, "head_bits", head_bits);
    cJSON_AddStringToObject(qc, "out_scales", "always");
    cJSON_AddStringToObject(qc, "codebook", cbname);
    char path[4200];
    if (!rc && nfiles > 1) {
        cJSON *idx = cJSON_CreateObject();
        cJSON_AddItemToObject(idx, "metadata", cJSON_CreateObject());
        cJSON_AddItemToObject(idx, "weight_map", wmap);
        wmap = NULL;
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dst);
        rc = write_json(path, idx) ? 1 : 0;
        cJSON_Delete(idx);
    }
    cJSON_Delete(wmap);
    snprintf(path, sizeof path, "%s/config.json", srcdir);
    char *ctext = rc ? NULL : dsv4_read_file(path, NULL, NULL);
    if (ctext) {
        cJSON *cfg = cJSON_Parse(ctext);
        free(ctext);
        if (!cfg) {
            fprintf(stderr, "dsv4 quantize: %s: bad JSON\n", path);
            rc = 1;
        } else {
            cJSON *old = cJSON_DetachItemFromObjectCaseSensitive(cfg, "quantization_config");
            cJSON *c = cJSON_Duplicate(qc, 1);
            /* tensors left in FP8 (not quantized, or outside --only) still need their block size */
            cJSON *wbs = old ? cJSON_GetObjectItemCaseSensitive(old, "weight_block_size") : NULL;
            if (wbs)
                cJSON_AddItemToObject(c, "weight_block_size", cJSON_Duplicate(wbs, 1));
            if (old)
                cJSON_AddItemToObject(c, "original_quantization_config", old);
            cJSON_AddItemToObject(cfg, "quantization_config", c);
            snprintf(path, sizeof path, "%s/config.json", dst);
            rc = write_json(path, cfg) ? 1 : 0;
            cJSON_Delete(cfg);
        }
    }
    if (!rc) {
        cJSON_AddItemToObject(qc, "tensor_storage", storage);
        storage = NULL;
        snprintf(path, sizeof path, "%s/quantization_config.json", dst);
        rc = write_json(path, qc) ? 1 : 0;
    }
    if (!rc && is_dir)
        rc = copy_side_files(srcdir, dst) ? 1 : 0;
    cJSON_Delete(storage);
    cJSON_Delete(qc);
    dsv4_st_close(st);
    if (!rc)
        printf("quantized %d layers, %.0f weights at %.3f bits/weight (scales included): rel.err %.5f overall, "
               "%lld tiles in %.1fs (%.1f tiles/s)\n",
               nq, qweights, qweights ? qbytes * 8 / qweights : 0.0, sqrt(err2 / (ref2 + 1e-300)), (long long)tiles_all,
               secs, tiles_all / secs);
    return rc;
}
