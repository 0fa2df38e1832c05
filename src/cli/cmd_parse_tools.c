/* dsv4 parse-tools: model output text to content, reasoning and tool calls, one per line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"
#include "text/dsml.h"

typedef struct parse_ctx {
    int mode;   /* 1 thinking, 0 chat, -1: thinking when the text holds </think> */
    int v4;     /* V4's DSML tags instead of V4.1's */
    long chunk; /* feed the parser this many bytes at a time (0: all at once) */
} parse_ctx;

/* One line of model output: {content, reasoning_content, tool_calls[, malformed]}. */
static int parse_line(void *ctx, const char *s, size_t len, long lineno)
{
    const parse_ctx *c = ctx;
    int thinking = c->mode >= 0 ? c->mode : memmem(s, len, "</think>", 8) != NULL;
    dsv4_err err = {0};
    dsv4_dsml *p = dsv4_dsml_new_family(thinking, c->v4, &err);
    dsv4_dsml_out o;
    dsv4_dsml_out_init(&o);
    int r = p ? 0 : 1;
    size_t step = c->chunk > 0 ? (size_t)c->chunk : (len ? len : 1);
    for (size_t i = 0; !r && i < len; i += step)
        r = dsv4_dsml_feed(p, s + i, len - i < step ? len - i : step, &o, &err);
    if (!r)
        r = dsv4_dsml_finish(p, &o, &err);
    if (r)
        fprintf(stderr, "dsv4 parse-tools: line %ld: %s\n", lineno, err.msg);
    else {
        fputs("{\"content\": ", stdout);
        cli_json_string_write(stdout, o.content.p, o.content.n);
        fputs(", \"reasoning_content\": ", stdout);
        if (o.has_reasoning)
            cli_json_string_write(stdout, o.reasoning.p, o.reasoning.n);
        else
            fputs("null", stdout);
        char *calls = cJSON_PrintUnformatted(o.calls);
        printf(", \"tool_calls\": %s", calls ? calls : "[]");
        free(calls);
        if (o.malformed)
            printf(", \"malformed\": %d", o.malformed);
        fputs("}\n", stdout);
    }
    dsv4_dsml_out_free(&o);
    dsv4_dsml_free(p);
    return r ? 1 : 0;
}

int dsv4_cmd_parse_tools(int argc, char **argv)
{
    int mode = -1; /* -1: auto, 0: chat, 1: thinking */
    int v4 = 0;
    long chunk = 0;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            printf("usage: dsv4 parse-tools [--thinking|--chat] [--v4] [--chunk N]\n"
                   "  Reads one model output text (a JSON string) per line and writes\n"
                   "  {\"content\": ..., \"reasoning_content\": ...|null, \"tool_calls\": [{\"name\": ..., \"arguments\": {...}}]}\n"
                   "  per line, plus \"malformed\": N when N invokes were dropped as malformed or truncated.\n"
                   "  --thinking: the text starts inside <think> (thinking mode); --chat: it does not; default:\n"
                   "  thinking when the text holds </think>. --chunk N feeds the parser N bytes at a time (the\n"
                   "  result must not depend on it). --v4: the V4 (0731) tags (<｜DSML｜tool_calls> ...).\n");
            return 0;
        } else if (!strcmp(argv[i], "--thinking"))
            mode = 1;
        else if (!strcmp(argv[i], "--chat"))
            mode = 0;
        else if (!strcmp(argv[i], "--v4"))
            v4 = 1;
        else if (!strcmp(argv[i], "--chunk") && i + 1 < argc)
            chunk = strtol(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: dsv4 parse-tools [--thinking|--chat] [--v4] [--chunk N]  (see -h)\n");
            return 2;
        }
    }
    parse_ctx c = {.mode = mode, .v4 = v4, .chunk = chunk};
    return cli_json_lines("parse-tools", parse_line, &c);
}
