/* dsv4 synth: writes a random-weight checkpoint in the release layout (a small default to
 * run without downloading anything, or V4-Flash shapes for loader and speed work). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"
#include "model/diag.h"

int dsv4_cmd_synth(int argc, char **argv)
{
    const char *preset = "tiny", *out = NULL;
    int layers = 4;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            printf("usage: dsv4 synth [--preset tiny|v4-flash|v4.1-tiny|v4.1-flash] [--layers N] -o DIR\n"
                   "Writes config.json + model.safetensors with random weights in the release layout\n"
                   "(FP8 blocks, FP4 experts, BF16 embeddings). tiny: the real 129,280 vocabulary at width 64\n"
                   "with sliding, CSA and HCA layers and a hash-routed layer (default 4 layers). v4.1-tiny:\n"
                   "V4.1's structure at width 64 (CSA2 roles, Engram, 3 DSpark stages; a token_map.json beside\n"
                   "it); v4.1-flash: the same at V4.1-Flash shapes (docs/v41.md).\n");
            return 0;
        }
        if (!strcmp(argv[i], "--preset") && i + 1 < argc)
            preset = argv[++i];
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc)
            layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-o") && i + 1 < argc)
            out = argv[++i];
        else {
            fprintf(stderr, "dsv4 synth: unknown option '%s' (see -h)\n", argv[i]);
            return 2;
        }
    }
    if (!out) {
        fprintf(stderr, "dsv4 synth: -o DIR is required\n");
        return 2;
    }
    dsv4_err err = {0};
    if (dsv4_synthetic_write(preset, layers, out, &err)) {
        fprintf(stderr, "dsv4 synth: %s\n", err.msg);
        return 1;
    }
    fprintf(stderr, "wrote %s (%s, %d layers)\n", out, preset, layers);
    return 0;
}
