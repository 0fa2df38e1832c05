/* cli — `dsv4 <command>`: one file per command, each a thin wrapper over the library. */
#ifndef DSV4_CLI_H
#define DSV4_CLI_H

typedef struct dsv4_cmd {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv); /* argv[0] is the command name */
} dsv4_cmd;

/* Commands (each in its cmd_<name>.c). */
int cmd_dequant(int argc, char **argv);
int cmd_bench_exl3(int argc, char **argv);
int cmd_quantize(int argc, char **argv);

/* Shared option helpers: parse a comma-separated id list into a malloc'd array. */
int cli_parse_ids(const char *s, int **ids, int *n);
/* True when argv[i] is -h or --help. */
int cli_is_help(const char *a);
#endif
