/* Options every model-running command shares: -m DIR, --threads N, --device cpu|cuda,
 * --numerics ref|fp32, --engram-tables auto|resident|streamed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"

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
    } else
        return 0;
    return 1;
}

const char *cli_model_usage(void)
{
    return "  -m, --model DIR      checkpoint folder (config.json + safetensors)\n"
           "  --threads N          CPU threads (default: all cores)\n"
           "  --device cpu|cuda    backend (default cpu)\n"
           "  --numerics ref|fp32  V4.1 reference rounding or exact fp32 (default: ref for V4.1, fp32 for V4)\n"
           "  --engram-tables auto|resident|streamed\n"
           "                       V4.1 Engram tables through the mapping or read by row from disk\n"
           "                       (default auto: streamed when larger than half of RAM and not cached)\n";
}

dsv4_model *cli_load(cli_model_opts *o, const char *cmd)
{
    if (!o->dir) {
        fprintf(stderr, "dsv4 %s: -m DIR is required (see dsv4 %s -h)\n", cmd, cmd);
        return NULL;
    }
    o->load.progress = 1;
    dsv4_err err = {0};
    dsv4_model *m = dsv4_model_load(o->dir, &o->load, &err);
    if (!m)
        fprintf(stderr, "dsv4 %s: %s\n", cmd, err.msg);
    else if (*dsv4_model_placement(m))
        fprintf(stderr, "placement: %s\n", dsv4_model_placement(m));
    return m;
}
