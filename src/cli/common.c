/* Options every model-running command shares: -m DIR, --threads N, --device cpu|cuda,
 * --numerics ref|fp32, --engram-tables auto|resident|streamed, --kv exact|production. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "cli/cli.h"
#include "model/diag.h"

int cli_model_opt(int argc, char **argv, int *i, cli_model_opts *o)
{
    const char *a = argv[*i];
    if (*i + 1 >= argc)
        return 0;
    if (!strcmp(a, "-m") || !strcmp(a, "--model"))
        o->dir = argv[++*i];
    else if (!strcmp(a, "--threads") || !strcmp(a, "-t"))
        o->load.n_threads = atoi(argv[++*i]);
    else if (!strcmp(a, "--device"))
        o->load.device = argv[++*i];
    else if (!strcmp(a, "--gpus")) {
        char *end;
        long v = strtol(argv[++*i], &end, 10);
        if (*end || v < 1 || v > 64) {
            fprintf(stderr, "dsv4: --gpus takes a count of GPUs from 1 to 64, not '%s'\n", argv[*i]);
            exit(2);
        }
        o->gpus = (int)v;
    }
    else if (!strcmp(a, "--numerics")) {
        const char *v = argv[++*i];
        if (!strcmp(v, "ref"))
            o->load.numerics = DSV4_NUMERICS_REF;
        else if (!strcmp(v, "fp32"))
            o->load.numerics = DSV4_NUMERICS_FP32;
        else {
            fprintf(stderr, "dsv4: --numerics takes ref or fp32, not '%s'\n", v);
            exit(2);
        }
    } else if (!strcmp(a, "--engram-tables")) {
        const char *v = argv[++*i];
        if (!strcmp(v, "auto"))
            o->load.engram_tables = DSV4_ENGRAM_AUTO;
        else if (!strcmp(v, "resident"))
            o->load.engram_tables = DSV4_ENGRAM_RESIDENT;
        else if (!strcmp(v, "streamed"))
            o->load.engram_tables = DSV4_ENGRAM_STREAMED;
        else {
            fprintf(stderr, "dsv4: --engram-tables takes auto, resident or streamed, not '%s'\n", v);
            exit(2);
        }
    } else if (!strcmp(a, "--kv")) {
        const char *v = argv[++*i];
        if (!strcmp(v, "exact"))
            o->load.kv = DSV4_KV_EXACT;
        else if (!strcmp(v, "production"))
            o->load.kv = DSV4_KV_PRODUCTION;
        else {
            fprintf(stderr, "dsv4: --kv takes exact or production, not '%s'\n", v);
            exit(2);
        }
    } else
        return 0;
    return 1;
}

const char *cli_model_usage(void)
{
    return "  -m, --model DIR      checkpoint folder (config.json + safetensors); default $DSV4_MODEL, else\n"
           "                       the project's small English model, " CLI_DEFAULT_MODEL "\n"
           "  --threads N          CPU threads (default: all cores)\n"
           "  --device cpu|cuda    backend (default cpu)\n"
           "  --gpus N             with --device cuda: one process a GPU, the routed experts spread over\n"
           "                       them (NCCL; generate, logits and bench; serve with 1; docs/multigpu.md)\n"
           "  --numerics ref|fp32  production rounding (the release reference's) or exact fp32\n"
           "                      (default: ref for V4.1, fp32 for V4)\n"
           "  --engram-tables auto|resident|streamed\n"
           "                       V4.1 Engram tables through the mapping or read by row from disk\n"
           "                       (default auto: streamed when larger than half of RAM and not cached)\n"
           "  --kv exact|production  KV caches in fp32, or packed in the production formats (docs/kv.md;\n"
           "                       default exact, serve: production where the backend has it)\n";
}

static int has_config(const char *dir)
{
    char p[2 * PATH_MAX];
    struct stat st;
    snprintf(p, sizeof p, "%s/config.json", dir);
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* The default is looked for beside the program (build/dsv4 -> models/mini) before the working
 * directory, so the command works from anywhere in a checkout and from an installed tree. */
int cli_model_default(cli_model_opts *o, const char *cmd)
{
    static char path[PATH_MAX + 32];
    if (o->dir)
        return 0;
    const char *env = getenv("DSV4_MODEL");
    if (env && *env) {
        o->dir = env;
        return 0;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            snprintf(path, sizeof path, "%s/../" CLI_DEFAULT_MODEL, exe);
            if (has_config(path)) {
                o->dir = path;
                return 0;
            }
        }
    }
    if (has_config(CLI_DEFAULT_MODEL)) {
        o->dir = CLI_DEFAULT_MODEL;
        return 0;
    }
    fprintf(stderr, "dsv4 %s: no -m DIR given, $DSV4_MODEL is unset and the default model (" CLI_DEFAULT_MODEL
                    ") is not beside the program or in the working directory\n", cmd);
    return -1;
}

dsv4_model *cli_load(cli_model_opts *o, const char *cmd)
{
    if (cli_model_default(o, cmd))
        return NULL;
    o->load.progress = 1;
    if (o->gpus > 1 && strcmp(cmd, "generate") && strcmp(cmd, "logits") && strcmp(cmd, "bench")) {
        fprintf(stderr, "dsv4 %s: --gpus above 1 runs generate, logits and bench: a server or a session on several "
                        "GPUs needs rank 0 to hand each step to the others, which is not built (docs/multigpu.md)\n",
                cmd);
        return NULL;
    }
    if (cli_ranks_start(o, cmd))
        return NULL;
    dsv4_err err = {0};
    dsv4_model *m = dsv4_model_load(o->dir, &o->load, &err);
    if (!m)
        fprintf(stderr, "dsv4 %s: %s\n", cmd, err.msg);
    else if (*dsv4_model_placement(m) && cli_rank() == 0)
        fprintf(stderr, "placement: %s\n", dsv4_model_placement(m));
    if (m && cli_ranks_check(m, cmd)) {
        dsv4_model_free(m);
        return NULL;
    }
    return m;
}
