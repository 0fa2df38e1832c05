/* Bad checkpoints fail with one message naming the file, the tensor and the problem, and a
 * non-zero exit from the CLI; never a crash or a silent wrong model. Each case copies
 * v4-tiny-a into a scratch folder and breaks one thing. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "core/core.h"
#include "dsv4.h"

static char src[1024], tmp[1024];

static unsigned char *slurp(const char *path, size_t *n) { return (unsigned char *)dsv4_read_file(path, n, NULL); }

static void spit(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    fwrite(b, 1, n, f);
    fclose(f);
}

/* Fresh copy of the fixture in tmp; returns the model file's bytes for editing. */
static unsigned char *fresh(size_t *n)
{
    char p[1200], q[1200];
    size_t cn;
    snprintf(p, sizeof p, "%s/config.json", src);
    unsigned char *cfg = slurp(p, &cn);
    snprintf(q, sizeof q, "%s/config.json", tmp);
    spit(q, cfg, cn);
    free(cfg);
    snprintf(p, sizeof p, "%s/model.safetensors", src);
    return slurp(p, n);
}

static void write_model(const void *b, size_t n)
{
    char q[1200];
    snprintf(q, sizeof q, "%s/model.safetensors", tmp);
    spit(q, b, n);
}

/* Rewrites the header JSON (edit applied to the parsed object) keeping the data section. */
static void edit_header(unsigned char *b, size_t n, void (*edit)(cJSON *))
{
    uint64_t hl;
    memcpy(&hl, b, 8);
    cJSON *j = cJSON_ParseWithLength((char *)b + 8, hl);
    edit(j);
    char *h = cJSON_PrintUnformatted(j);
    uint64_t nl = strlen(h);
    size_t out_n = 8 + nl + (n - 8 - hl);
    unsigned char *o = malloc(out_n);
    memcpy(o, &nl, 8);
    memcpy(o + 8, h, nl);
    memcpy(o + 8 + nl, b + 8 + hl, n - 8 - hl);
    write_model(o, out_n);
    free(o);
    free(h);
    cJSON_Delete(j);
}

static void expect_fail(const char *what, const char *s1, const char *s2)
{
    dsv4_err err = {0};
    dsv4_model *m = dsv4_model_load(tmp, NULL, &err);
    CHECK(m == NULL && err.code != 0, "%s: the load should fail", what);
    CHECK(!s1 || strstr(err.msg, s1), "%s: message should name '%s': %s", what, s1, err.msg);
    CHECK(!s2 || strstr(err.msg, s2), "%s: message should say '%s': %s", what, s2, err.msg);
    printf("  %-28s -> %s\n", what, err.msg);
    dsv4_model_free(m);
}

static void rename_wkv(cJSON *j)
{
    cJSON *t = cJSON_DetachItemFromObject(j, "layers.1.attn.wkv.weight");
    cJSON_AddItemToObject(j, "layers.1.attn.wkv.weightX", t);
}
static void reshape_wq_a(cJSON *j)
{
    cJSON *t = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "layers.0.attn.wq_a.weight"), "shape");
    cJSON_ReplaceItemInArray(t, 0, cJSON_CreateNumber(48));
    cJSON_ReplaceItemInArray(t, 1, cJSON_CreateNumber(512));
}
static void unknown_dtype(cJSON *j)
{
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(j, "layers.2.attn.wq_b.weight"), "dtype", cJSON_CreateString("F9_E9"));
}
static void offsets_out(cJSON *j)
{
    cJSON *o = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "head.weight"), "data_offsets");
    double b = cJSON_GetArrayItem(o, 0)->valuedouble;
    cJSON_ReplaceItemInArray(o, 0, cJSON_CreateNumber(b + 1e9));
    cJSON_ReplaceItemInArray(o, 1, cJSON_CreateNumber(b + 1e9 + 524288));
}
static void wrong_bytes(cJSON *j)
{
    cJSON *o = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "norm.weight"), "data_offsets");
    cJSON_ReplaceItemInArray(o, 1, cJSON_CreateNumber(cJSON_GetArrayItem(o, 1)->valuedouble - 4));
}
static void norm_as_int(cJSON *j)
{
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(j, "layers.3.ffn_norm.weight"), "dtype", cJSON_CreateString("I32"));
}
static void drop_scale(cJSON *j) { cJSON_DeleteItemFromObject(j, "layers.0.attn.wo_b.scale"); }

static void set_config(const char *from, const char *to)
{
    char p[1200];
    size_t n;
    snprintf(p, sizeof p, "%s/config.json", src);
    char *c = (char *)slurp(p, &n), *at = strstr(c, from);
    CHECK(at != NULL, "config edit: '%s' not found", from);
    if (!at)
        return;
    size_t lf = strlen(from), lt = strlen(to);
    char *o = malloc(n + lt + 1);
    memcpy(o, c, at - c);
    memcpy(o + (at - c), to, lt);
    memcpy(o + (at - c) + lt, at + lf, n - (at - c) - lf);
    snprintf(p, sizeof p, "%s/config.json", tmp);
    spit(p, o, n - lf + lt);
    free(c);
    free(o);
}

int main(void)
{
    snprintf(src, sizeof src, "%s", CHECK_FIXTURES "/v4/v4-tiny-a");
    snprintf(tmp, sizeof tmp, "/tmp/dsv4-corrupt-%d", (int)getpid());
    mkdir(tmp, 0755);
    size_t n;
    unsigned char *b = fresh(&n);
    CHECK(b != NULL, "cannot read %s", src);
    if (!b)
        return check_summary("corrupt");

    write_model(b, n / 2);
    expect_fail("truncated file", "model.safetensors", "truncated");
    write_model(b, 5);
    expect_fail("truncated header length", "model.safetensors", "truncated");
    {
        unsigned char *c = malloc(n);
        memcpy(c, b, n);
        memcpy(c + 8, "{\"embed.weight\": [", 18);
        write_model(c, n);
        free(c);
    }
    expect_fail("bad header JSON", "model.safetensors", "bad header JSON");
    edit_header(b, n, offsets_out);
    expect_fail("offsets out of range", "head.weight", "out of range");
    edit_header(b, n, wrong_bytes);
    expect_fail("size does not match shape", "norm.weight", "bytes of data");
    edit_header(b, n, rename_wkv);
    expect_fail("missing tensor", "layers.1.attn.wkv.weight", "missing from");
    edit_header(b, n, reshape_wq_a);
    expect_fail("mis-shaped tensor", "layers.0.attn.wq_a.weight", "shape");
    edit_header(b, n, unknown_dtype);
    expect_fail("unknown dtype", "layers.2.attn.wq_b.weight", "F9_E9");
    edit_header(b, n, norm_as_int);
    expect_fail("wrong dtype for a norm", "layers.3.ffn_norm.weight", "I32");
    edit_header(b, n, drop_scale);
    expect_fail("FP8 weight without scales", "layers.0.attn.wo_b.scale", "missing");

    write_model(b, n);
    set_config("\"hidden_size\": 256", "\"hidden_size\": 512");
    expect_fail("config width contradicts", "embed.weight", "shape");
    set_config("\"n_routed_experts\": 8", "\"n_routed_experts\": 9");
    expect_fail("config experts contradict", "layers.0.ffn.gate.weight", "expected [9, 256]");
    set_config("\"vocab_size\": 1024", "\"vocab_size\": \"many\"");
    expect_fail("config bad value", "vocab_size", "integer");
    set_config("\"sliding_attention\"", "\"diagonal_attention\"");
    expect_fail("config unknown layer type", "layer_types", "diagonal_attention");
    set_config("{", "[");
    expect_fail("config not an object", "config.json", NULL);

    /* The CLI exits non-zero and prints the message on one line. */
    set_config("\"hidden_size\": 256", "\"hidden_size\": 512");
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "./build/dsv4 info -m %s 2>/dev/null >/dev/null", tmp);
    int rc = system(cmd);
    CHECK(rc != 0, "dsv4 info on a bad checkpoint should exit non-zero");

    /* And the intact copy loads. */
    set_config("\"hidden_size\": 256", "\"hidden_size\": 256");
    dsv4_err err = {0};
    dsv4_model *m = dsv4_model_load(tmp, NULL, &err);
    CHECK(m != NULL, "the unbroken copy should load: %s", err.msg);
    dsv4_model_free(m);
    free(b);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd)) {
    }
    return check_summary("corrupt");
}
