#include <stdio.h>
#include <string.h>
#include "cli/cli.h"
#include "model/diag.h"

int dsv4_cmd_info(int argc, char **argv)
{
    cli_model_opts o = {0};
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            printf("usage: dsv4 info -m DIR\nSummarise a checkpoint: config, layer schedule, tensors by storage form,\n"
                   "and the per-sequence state at 4k and 128k tokens.\n%s", cli_model_usage());
            return 0;
        }
        if (!cli_model_opt(argc, argv, &i, &o)) {
            fprintf(stderr, "dsv4 info: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    dsv4_model *m = cli_load(&o, "info");
    if (!m)
        return 1;
    dsv4_model_print_info(m, stdout);
    dsv4_model_free(m);
    return 0;
}
