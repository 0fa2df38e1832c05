/* Bad checkpoints fail with one message naming the file, the tensor and the problem, and a
 * non-zero exit from the CLI; never a crash or a silent wrong model. Each case copies
 * v4-tiny-a into a scratch folder and breaks one thing. The config tables give every value
 * out of its range: each load runs in a child, so a crash or a hang is a reported failure. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"
#include "core/core.h"
#include "dsv4.h"
#include "model/model.h"

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
    if (!strcmp(from, "{")) /* a key the fixture lacks: put it first */
        from = "{\n";
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


/* The load in a child (alarm: a hang is a failure), its message back through a pipe. Returns 0
 * loaded, 1 failed with msg, -1 crashed or hung (msg says which). */
static int load_in_child(char *msg, size_t n, double *secs)
{
    int fd[2];
    *secs = 0;
    if (pipe(fd))
        return -1;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        alarm(10);
        dsv4_err err = {0};
        dsv4_model *m = dsv4_model_load(tmp, NULL, &err);
        size_t l = strlen(err.msg);
        if (write(fd[1], err.msg, l) != (ssize_t)l) {
        }
        _exit(m == NULL && err.code != 0 ? 1 : 0);
    }
    close(fd[1]);
    size_t got = 0;
    ssize_t r;
    while (got + 1 < n && (r = read(fd[0], msg + got, n - 1 - got)) > 0)
        got += (size_t)r;
    msg[got] = 0;
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    *secs = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    if (WIFSIGNALED(st)) {
        snprintf(msg, n, WTERMSIG(st) == SIGALRM ? "hung: killed after 10 s" : "crashed with signal %d", WTERMSIG(st));
        return -1;
    }
    return WEXITSTATUS(st);
}

/* One config value out of range: `from` (text of the fixture's config.json; "{" puts `to`
 * first) becomes `to`, and the load must fail at once naming `key`. */
typedef struct {
    const char *from, *to, *key;
} bad_value;

static void bad_values(const bad_value *t, int n)
{
    for (int i = 0; i < n; i++) {
        set_config(t[i].from, t[i].to);
        char msg[1024];
        double secs;
        int rc = load_in_child(msg, sizeof msg, &secs);
        CHECK(rc == 1, "%s: the load should fail naming '%s': %s", t[i].to, t[i].key, rc == 0 ? "it loaded" : msg);
        CHECK(rc != 1 || strstr(msg, t[i].key), "%s: the message should name '%s': %s", t[i].to, t[i].key, msg);
        CHECK(secs < 2, "%s: refusing took %.1f s", t[i].to, secs);
        printf("  %-44.*s -> %s\n", (int)strcspn(t[i].to, "\n"), t[i].to, msg);
    }
}

/* A copy of fixture `dir` (model, config and token map) in tmp; src is set to it. */
static void use_fixture(const char *dir)
{
    snprintf(src, sizeof src, "%s/%s", CHECK_FIXTURES, dir);
    const char *files[] = {"config.json", "model.safetensors", "token_map.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char p[1200], q[1200];
        size_t n;
        snprintf(p, sizeof p, "%s/%s", src, files[i]);
        snprintf(q, sizeof q, "%s/%s", tmp, files[i]);
        unsigned char *b = slurp(p, &n);
        if (b)
            spit(q, b, n);
        else
            unlink(q);
        free(b);
    }
}

/* The process's mapped size in kB (VmSize). */
static long vm_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmSize:", 7))
            kb = atol(line + 7);
    if (f)
        fclose(f);
    return kb;
}

/* A model from memory whose config fails still releases the image it was handed. */
static void memory_image_released(void)
{
    long before = vm_kb();
    for (int i = 0; i < 8; i++) {
        size_t n = (size_t)16 << 20;
        void *map = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        dsv4_err err = {0};
        dsv4_model *m = dsv4_model_from_memory("{\"vocab_size\": 0}", map, n, "memory", NULL, &err);
        CHECK(m == NULL && strstr(err.msg, "vocab_size"), "a bad config from memory should fail naming the key: %s", err.msg);
        dsv4_model_free(m);
    }
    long grew = vm_kb() - before;
    CHECK(grew < 16 * 1024, "8 failed loads from memory left %ld kB mapped (the 16 MiB images were not released)", grew);
}

#define N_OF(t) ((int)(sizeof t / sizeof t[0]))

static const bad_value v4_bad[] = {
    {"\"o_groups\": 2", "\"o_groups\": 0", "o_groups"},
    {"\"o_groups\": 2", "\"o_groups\": 3", "o_groups"},
    {"\"o_groups\": 2", "\"o_groups\": 8", "o_groups"},
    {"\"weight_block_size\": [", "\"weight_block_size\": [0, 0], \"x\": [", "weight_block_size"},
    {"\"weight_block_size\": [", "\"weight_block_size\": [\"a\", \"b\"], \"x\": [", "weight_block_size"},
    {"\"weight_block_size\": [", "\"weight_block_size\": [1e300, 1e300], \"x\": [", "weight_block_size"},
    {"\"weight_block_size\": [", "\"weight_block_size\": [64], \"x\": [", "weight_block_size"},
    {"\"hc_sinkhorn_iters\": 20", "\"hc_sinkhorn_iters\": 2147483647", "hc_sinkhorn_iters"},
    {"\"hc_sinkhorn_iters\": 20", "\"hc_sinkhorn_iters\": 0", "hc_sinkhorn_iters"},
    {"\"n_routed_experts\": 8", "\"n_routed_experts\": 2147483647", "n_routed_experts"},
    {"\"n_routed_experts\": 8", "\"n_routed_experts\": 0", "n_routed_experts"},
    {"\"rms_norm_eps\": 1e-06", "\"rms_norm_eps\": -1", "rms_norm_eps"},
    {"\"rms_norm_eps\": 1e-06", "\"rms_norm_eps\": 0", "rms_norm_eps"},
    {"\"rope_theta\": 10000.0,\n  \"compress", "\"rope_theta\": 0,\n  \"compress", "rope_theta"},
    {"\"rope_theta\": 10000.0,\n  \"compress", "\"rope_theta\": 1,\n  \"compress", "rope_theta"},
    {"\"compress_rope_theta\": 160000.0", "\"compress_rope_theta\": -5", "compress_rope_theta"},
    {"\"sliding_window\": 8", "\"sliding_window\": 0", "sliding_window"},
    {"\"sliding_window\": 8", "\"sliding_window\": 1e9", "sliding_window"},
    {"\"hc_mult\": 4", "\"hc_mult\": 0", "hc_mult"},
    {"\"hc_mult\": 4", "\"hc_mult\": 17", "hc_mult"},
    {"\"hc_eps\": 1e-06", "\"hc_eps\": -1", "hc_eps"},
    {"\"hc_eps\": 1e-06", "\"hc_eps\": 0", "hc_eps"},
    {"\"head_dim\": 64", "\"head_dim\": 0", "head_dim"},
    {"\"head_dim\": 64", "\"head_dim\": 1e300", "head_dim"},
    {"\"vocab_size\": 1024", "\"vocab_size\": -1", "vocab_size"},
    {"\"vocab_size\": 1024", "\"vocab_size\": 4294967296", "vocab_size"},
    {"\"hidden_size\": 256", "\"hidden_size\": 0", "hidden_size"},
    {"\"hidden_size\": 256", "\"hidden_size\": 256.5", "hidden_size"},
    {"\"num_hidden_layers\": 4", "\"num_hidden_layers\": 0", "num_hidden_layers"},
    {"\"num_attention_heads\": 4", "\"num_attention_heads\": 0", "num_attention_heads"},
    {"\"q_lora_rank\": 96", "\"q_lora_rank\": 0", "q_lora_rank"},
    {"\"o_lora_rank\": 48", "\"o_lora_rank\": -48", "o_lora_rank"},
    {"\"moe_intermediate_size\": 64", "\"moe_intermediate_size\": 0", "moe_intermediate_size"},
    {"\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 0", "num_experts_per_tok"},
    {"\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 9", "num_experts_per_tok"},
    {"\"n_shared_experts\": 1", "\"n_shared_experts\": -1", "n_shared_experts"},
    {"\"index_topk\": 4", "\"index_topk\": -1", "index_topk"},
    {"\"index_topk\": 4", "\"index_topk\": 1e12", "index_topk"},
    {"\"index_n_heads\": 4", "\"index_n_heads\": 1e9", "index_n_heads"},
    {"\"index_head_dim\": 32", "\"index_head_dim\": -32", "index_head_dim"},
    {"\"routed_scaling_factor\": 1.5", "\"routed_scaling_factor\": 0", "routed_scaling_factor"},
    {"\"swiglu_limit\": 1.0", "\"swiglu_limit\": -1", "swiglu_limit"},
    {"\"max_position_embeddings\": 65536", "\"max_position_embeddings\": 0", "max_position_embeddings"},
    {"\"max_position_embeddings\": 65536", "\"max_position_embeddings\": 1e300", "max_position_embeddings"},
    {"\"num_nextn_predict_layers\": 0", "\"num_nextn_predict_layers\": -1", "num_nextn_predict_layers"},
    {"\"bos_token_id\": 0", "\"bos_token_id\": 5000", "bos_token_id"},
    {"\"eos_token_id\": 1", "\"eos_token_id\": -1", "eos_token_id"},
    {"\"norm_topk_prob\": true", "\"norm_topk_prob\": \"yes\"", "norm_topk_prob"},
    {"\"partial_rotary_factor\": 0.25,\n  \"quant", "\"partial_rotary_factor\": 0,\n  \"quant", "partial_rotary_factor"},
    {"\"partial_rotary_factor\": 0.25,\n  \"quant", "\"partial_rotary_factor\": 2,\n  \"quant", "partial_rotary_factor"},
    {"\"compressed_sparse_attention\": 4", "\"compressed_sparse_attention\": 0", "compress_rates.compressed_sparse_attention"},
    {"\"heavily_compressed_attention\": 16", "\"heavily_compressed_attention\": 1e10", "compress_rates.heavily_compressed_attention"},
    {"\"factor\": 4.0", "\"factor\": 0", "rope_scaling.factor"},
    {"\"beta_fast\": 32", "\"beta_fast\": -1", "rope_scaling.beta_fast"},
    {"\"original_max_position_embeddings\": 32", "\"original_max_position_embeddings\": 0", "rope_scaling.original_max_position_embeddings"},
    {"{", "{\"qk_rope_head_dim\": 15,\n", "qk_rope_head_dim"},
    {"{", "{\"qk_rope_head_dim\": 1e300,\n", "qk_rope_head_dim"},
    {"{", "{\"pad_token_id\": 99999,\n", "pad_token_id"},
    {"{", "{\"image_token_id\": -7,\n", "image_token_id"},
    {"{", "{\"compress_rate_csa\": -4,\n", "compress_rate_csa"},
    {"{", "{\"scoring_func\": 7,\n", "scoring_func"},
    /* a layer count that is not the checkpoint's (4 layers) */
    {"\"num_hidden_layers\": 4", "\"num_hidden_layers\": 3", "num_hidden_layers"},
    {"\"num_hidden_layers\": 4", "\"num_hidden_layers\": 2", "num_hidden_layers"},
};

static const bad_value v41_bad[] = {
    {"\"kv_source_layer_ids\": [", "\"kv_source_layer_ids\": [99, ", "kv_source_layer_ids"},
    {"\"index_source_layer_ids\": [", "\"index_source_layer_ids\": [\"a\", ", "index_source_layer_ids"},
    {"\"compress_ratios\": [", "\"compress_ratios\": [1e10, ", "compress_ratios"},
    {"\"compress_ratios\": [", "\"compress_ratios\": [-1, ", "compress_ratios"},
    {"\"candidate_source_layer_id\": 6", "\"candidate_source_layer_id\": 50", "candidate_source_layer_id"},
    {"\"candidate_block_size\": 4", "\"candidate_block_size\": 0", "candidate_block_size"},
    {"\"candidate_topk_blocks\": 3", "\"candidate_topk_blocks\": 1e15", "candidate_topk_blocks"},
    {"\"engram_layer_ids\": [", "\"engram_layer_ids\": [1e10, ", "engram_layer_ids"},
    {"\"engram_num_embeddings\": [", "\"engram_num_embeddings\": [1.5, ", "engram_num_embeddings"},
    {"\"engram_num_embeddings\": [", "\"engram_num_embeddings\": \"many\", \"x\": [", "engram_num_embeddings"},
    {"\"engram_max_ngram_size\": 4", "\"engram_max_ngram_size\": 100", "engram_max_ngram_size"},
    {"\"engram_max_ngram_size\": 4", "\"engram_max_ngram_size\": 1", "engram_max_ngram_size"},
    {"\"engram_n_heads\": 2", "\"engram_n_heads\": 0", "engram_n_heads"},
    {"\"engram_n_heads\": 2", "\"engram_n_heads\": 1e9", "engram_n_heads"},
    {"\"engram_head_dim\": 32", "\"engram_head_dim\": -32", "engram_head_dim"},
    {"\"engram_vocab_size\": 37", "\"engram_vocab_size\": 1e18", "engram_vocab_size"},
    {"\"engram_pad_id\": 2", "\"engram_pad_id\": 5000", "engram_pad_id"},
    {"\"engram_compressed_vocab_size\": 664", "\"engram_compressed_vocab_size\": -1", "engram_compressed_vocab_size"},
    {"\"qk_rope_head_dim\": 16", "\"qk_rope_head_dim\": 0", "qk_rope_head_dim"},
    {"\"hc_sinkhorn_iters\": 20", "\"hc_sinkhorn_iters\": 1e6", "hc_sinkhorn_iters"},
    {"\"rms_norm_eps\": 1e-20", "\"rms_norm_eps\": 1e-50", "rms_norm_eps"},
    {"\"num_hidden_layers\": 10", "\"num_hidden_layers\": 9", "num_hidden_layers"},
};

/* A tensor whose shape's element count wraps int64 to zero, with zero bytes of data. */
static void overflow_numel(cJSON *j)
{
    cJSON *t = cJSON_CreateObject();
    cJSON_AddStringToObject(t, "dtype", "F32");
    double sh[] = {4294967296.0, 4294967296.0};
    cJSON_AddItemToObject(t, "shape", cJSON_CreateDoubleArray(sh, 2));
    double off[] = {0, 0};
    cJSON_AddItemToObject(t, "data_offsets", cJSON_CreateDoubleArray(off, 2));
    cJSON_AddItemToObject(j, "extra.weight", t);
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
    edit_header(b, n, overflow_numel);
    expect_fail("element count overflows", "extra.weight", "overflows");

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

    printf("config values out of range (v4-tiny-a):\n");
    bad_values(v4_bad, N_OF(v4_bad));

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

    memory_image_released();

    printf("config values out of range (v41-tiny-a):\n");
    use_fixture("v41/v41-tiny-a");
    bad_values(v41_bad, N_OF(v41_bad));
    set_config("{", "{");
    m = dsv4_model_load(tmp, NULL, &err);
    CHECK(m != NULL, "the unbroken V4.1 copy should load: %s", err.msg);
    dsv4_model_free(m);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd)) {
    }
    return check_summary("corrupt");
}
