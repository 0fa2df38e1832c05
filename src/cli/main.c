#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"
#include "dsv4.h"

static int cmd_version(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    printf("dsv4 %s\n", dsv4_version());
    return 0;
}

/* dsv4 devices [--device NAME]: what each backend (or the one named) can run on here. */
static int cmd_devices(int argc, char **argv)
{
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            printf("usage: dsv4 devices [--device cpu|cuda]\n  says whether each device can run here, and why not\n");
            return 0;
        }
        if (!strcmp(argv[i], "--device") && i + 1 < argc)
            only = argv[++i];
        else {
            fprintf(stderr, "dsv4 devices: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    const char *all[] = {"cpu", "cuda"};
    int rc = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (only && strcmp(only, all[i]))
            continue;
        char desc[512];
        dsv4_err err;
        if (dsv4_device_probe(all[i], desc, sizeof desc, &err)) {
            printf("%s: unavailable: %s\n", all[i], err.msg);
            rc = only ? 1 : rc;
        } else
            printf("%s\n", desc);
    }
    if (only && strcmp(only, "cpu") && strcmp(only, "cuda")) {
        fprintf(stderr, "dsv4 devices: unknown device '%s' (devices: cpu, cuda)\n", only);
        return 2;
    }
    return rc;
}

static const dsv4_cmd commands[] = {
    {"info", "summarise a checkpoint: config, layer schedule, tensors, bytes by storage form", dsv4_cmd_info},
    {"logits", "write float32 logits for every position of an id sequence", dsv4_cmd_logits},
    {"generate", "greedy generation from token ids", dsv4_cmd_generate},
    {"constrain", "constrained decoding: JSON object, JSON Schema or forced tool call; --check, --bench", dsv4_cmd_constrain},
    {"bench", "load, prefill and decode speed; --synthetic v4-flash for real shapes without a file", dsv4_cmd_bench},
    {"synth", "write a random-weight checkpoint (tiny default, or V4-Flash shapes)", dsv4_cmd_synth},
    {"engram-bench", "Engram table rows/s, resident and streamed, cold and warm, on a synthetic table", dsv4_cmd_engram_bench},
    {"version", "print the version", cmd_version},
    {"tokenize", "text lines (JSON strings) to id lists", dsv4_cmd_tokenize},
    {"detokenize", "id lists to text lines (JSON strings)", dsv4_cmd_detokenize},
    {"render", "chat requests to DeepSeek-V4.1 prompt text", dsv4_cmd_render},
    {"serve", "OpenAI-compatible HTTP server", dsv4_cmd_serve},
    {"chat", "a conversation in the terminal (streams, keeps the conversation, reuses the cache)", dsv4_cmd_chat},
    {"parse-tools", "model output to content, reasoning and DSML tool calls", dsv4_cmd_parse_tools},
    {"token-map", "the Engram compressed token map of a tokenizer", dsv4_cmd_token_map},
    {"normalize", "text lines through a Hugging Face normalizer", dsv4_cmd_normalize},
    {"dequant", "write one weight as float32 [out, in]", dsv4_cmd_dequant},
    {"quantize", "make an EXL3 pack from a checkpoint", dsv4_cmd_quantize},
    {"bench-exl3", "time the EXL3 matvec against memory bandwidth", dsv4_cmd_bench_exl3},
    {"devices", "say which devices (cpu, cuda) can run here", cmd_devices},
};

static void usage(FILE *f)
{
    fprintf(f, "dsv4 %s — DeepSeek-V4 family inference\nusage: dsv4 <command> [options]  (dsv4 <command> -h for its options)\n\ncommands:\n",
            dsv4_version());
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].summary);
}

int cli_is_help(const char *a) { return !strcmp(a, "-h") || !strcmp(a, "--help"); }

int cli_parse_ids(const char *s, int **ids, int *n)
{
    int cap = 16, k = 0;
    int *v = malloc(cap * sizeof *v);
    const char *p = s;
    while (*p) {
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p || x < 0 || x > 0x7fffffff) {
            free(v);
            return -1;
        }
        if (k == cap)
            v = realloc(v, (cap *= 2) * sizeof *v);
        v[k++] = (int)x;
        p = end;
        if (*p == ',')
            p++;
        else if (*p) {
            free(v);
            return -1;
        }
    }
    *ids = v;
    *n = k;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || cli_is_help(argv[1])) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("dsv4 %s\n", dsv4_version());
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name))
            return cli_ranks_finish(commands[i].run(argc - 1, argv + 1));
    fprintf(stderr, "dsv4: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
