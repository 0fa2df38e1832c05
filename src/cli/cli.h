/* cli — `dsv4 <command>`: one file per command, each a thin wrapper over the library. */
#ifndef DSV4_CLI_H
#define DSV4_CLI_H

#include "dsv4.h"

typedef struct dsv4_cmd {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv); /* argv[0] is the command name */
} dsv4_cmd;

/* Commands (each in its cmd_<name>.c). */
int dsv4_cmd_dequant(int argc, char **argv);
int dsv4_cmd_bench_exl3(int argc, char **argv);
int dsv4_cmd_quantize(int argc, char **argv);

int dsv4_cmd_info(int argc, char **argv);
int dsv4_cmd_logits(int argc, char **argv);
int dsv4_cmd_generate(int argc, char **argv);
int dsv4_cmd_bench(int argc, char **argv);
int dsv4_cmd_synth(int argc, char **argv);

/* The options every model-running command takes. */
typedef struct cli_model_opts {
    const char *dir;
    dsv4_load_opts load;
} cli_model_opts;
/* Consumes argv[*i] (and its value) if it is a model option; returns 1 if it was. */
int cli_model_opt(int argc, char **argv, int *i, cli_model_opts *o);
const char *cli_model_usage(void);
/* Loads the model with progress, printing the error and returning NULL on failure. */
dsv4_model *cli_load(cli_model_opts *o, const char *cmd);

/* Shared option helpers: parse a comma-separated id list into a malloc'd array. */
int cli_parse_ids(const char *s, int **ids, int *n);
/* True when argv[i] is -h or --help. */
int cli_is_help(const char *a);
#endif
