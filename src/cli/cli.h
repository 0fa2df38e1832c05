/* cli — `dsv4 <command>`: one file per command, each a thin wrapper over the library. */
#ifndef DSV4_CLI_H
#define DSV4_CLI_H

#include <stddef.h>
#include <stdio.h>
#include "dsv4.h"

typedef struct dsv4_cmd {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv); /* argv[0] is the command name */
} dsv4_cmd;

/* Commands, each in its cmd_<name>.c. */
int dsv4_cmd_tokenize(int argc, char **argv);
int dsv4_cmd_detokenize(int argc, char **argv);
int dsv4_cmd_render(int argc, char **argv);
int dsv4_cmd_serve(int argc, char **argv);
int dsv4_cmd_chat(int argc, char **argv);
int dsv4_cmd_parse_tools(int argc, char **argv);
int dsv4_cmd_token_map(int argc, char **argv);
int dsv4_cmd_normalize(int argc, char **argv);
int dsv4_cmd_dequant(int argc, char **argv);
int dsv4_cmd_bench_exl3(int argc, char **argv);
int dsv4_cmd_quantize(int argc, char **argv);
int dsv4_cmd_info(int argc, char **argv);
int dsv4_cmd_logits(int argc, char **argv);
int dsv4_cmd_generate(int argc, char **argv);
int dsv4_cmd_constrain(int argc, char **argv);
int dsv4_cmd_bench(int argc, char **argv);
int dsv4_cmd_synth(int argc, char **argv);
int dsv4_cmd_engram_bench(int argc, char **argv);

/* JSON string values with explicit lengths (the text may hold NUL). parse: line[0..n) must be
 * one JSON string (surrounding blanks allowed); *out is malloc'd UTF-8 (lone surrogates become
 * U+FFFD). Returns 0, or -1 on malformed input. write: escapes as JSON.stringify does. */
int cli_json_string_parse(const char *line, size_t n, char **out, size_t *out_len);
void cli_json_string_write(FILE *f, const char *s, size_t n);
/* Calls fn on each non-blank line of stdin (n bytes, newline included) until it returns
 * non-zero (fn reports its own error). Returns 0, or 1 after an error. */
int cli_lines(int (*fn)(void *ctx, const char *line, size_t n, long lineno), void *ctx);
/* Reads stdin as one JSON string per line (blank lines skipped) and calls fn on each decoded
 * string; stops at the first line that is not a JSON string (reported for `cmd`) or where fn
 * returns non-zero (fn reports its own error). Returns 0, or 1 after an error. */
int cli_json_lines(const char *cmd, int (*fn)(void *ctx, const char *s, size_t len, long lineno), void *ctx);

/* The options every model-running command takes. */
typedef struct cli_model_opts {
    const char *dir;
    dsv4_load_opts load;
    int gpus;               /* --gpus N (0: not given) */
} cli_model_opts;
/* The model used when no -m is given: a small DeepSeek-V4 trained to answer in English
 * (tools/train/), found beside the program or in the working directory. */
#define CLI_DEFAULT_MODEL "models/mini"
/* Sets o->dir when it is unset: $DSV4_MODEL, else the default model. Returns 0, or -1 after
 * printing why none was found. */
int cli_model_default(cli_model_opts *o, const char *cmd);
/* Consumes argv[*i] (and its value) if it is a model option; returns 1 if it was. */
int cli_model_opt(int argc, char **argv, int *i, cli_model_opts *o);
const char *cli_model_usage(void);
/* Loads the model with progress, printing the error and returning NULL on failure. */
dsv4_model *cli_load(cli_model_opts *o, const char *cmd);

/* --gpus N (ranks.c, docs/multigpu.md): before the model loads, start ranks 1 .. N-1 (this
 * process is rank 0), select each rank's GPU and join the communicator; after it loads,
 * check every rank loaded the same model. Both return 0, or 1 after printing why. Without
 * --gpus both do nothing. */
int cli_ranks_start(cli_model_opts *o, const char *cmd);
int cli_ranks_check(const dsv4_model *m, const char *cmd);
/* This process's rank (0 without --gpus): only rank 0 writes output. */
int cli_rank(void);
/* At the command's end: rank r > 0 says it finished; rank 0 waits for every rank (one that
 * fails ends the run) or, after its own failure, ends them. Returns the exit status. */
int cli_ranks_finish(int rc);

/* Shared option helpers: parse a comma-separated id list into a malloc'd array. */
int cli_parse_ids(const char *s, int **ids, int *n);
/* True when argv[i] is -h or --help. */
int cli_is_help(const char *a);
#endif
