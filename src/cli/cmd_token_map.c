/* dsv4 token-map: the Engram compressed token map of a tokenizer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"
#include "text/normalize.h"
#include "text/token_map.h"

static int print_keys(dsv4_tokenizer *t)
{
    dsv4_err err = {0};
    dsv4_normalizer *nz = dsv4_normalizer_parse(dsv4_token_map_chain, &err);
    int rc = nz ? 0 : 1;
    for (int32_t id = 0; !rc && id < dsv4_tokenizer_n_vocab(t); id++) {
        char *k;
        size_t kl;
        rc = dsv4_token_map_key(t, nz, id, &k, &kl, &err);
        if (rc)
            break;
        printf("[%d,", (int)id);
        cli_json_string_write(stdout, k, kl);
        puts("]");
        free(k);
    }
    if (rc)
        fprintf(stderr, "dsv4 token-map: %s\n", err.msg);
    dsv4_normalizer_free(nz);
    dsv4_tokenizer_free(t);
    return rc;
}

int cmd_token_map(int argc, char **argv)
{
    const char *dir = NULL;
    int print = 0, keys = 0;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            printf("usage: dsv4 token-map -t DIR [--print | --keys]\n"
                   "  Builds the Engram compressed token map (DeepSeek-V4.1 spec 9.1) and prints its class count\n"
                   "  (\"classes N\"; the V4.1 tokenizer gives 99092). --print writes the map instead: one JSON\n"
                   "  array, the class of each id. --keys writes each id's normalized key, one [id, key] per line.\n");
            return 0;
        } else if ((!strcmp(argv[i], "-t") || !strcmp(argv[i], "--tokenizer")) && i + 1 < argc)
            dir = argv[++i];
        else if (!strcmp(argv[i], "--print"))
            print = 1;
        else if (!strcmp(argv[i], "--keys"))
            keys = 1;
        else
            dir = NULL, i = argc;
    }
    if (!dir) {
        fprintf(stderr, "usage: dsv4 token-map -t DIR [--print]  (see -h)\n");
        return 2;
    }
    dsv4_err err = {0};
    dsv4_tokenizer *t = dsv4_tokenizer_load(dir, &err);
    if (t && keys)
        return print_keys(t);
    int32_t *map, nc;
    if (!t || dsv4_token_map_build(t, &map, &nc, &err)) {
        fprintf(stderr, "dsv4 token-map: %s\n", err.msg);
        dsv4_tokenizer_free(t);
        return 1;
    }
    if (print) {
        int32_t nv = dsv4_tokenizer_n_vocab(t);
        putchar('[');
        for (int32_t i = 0; i < nv; i++)
            printf(i ? ",%d" : "%d", (int)map[i]);
        puts("]");
    } else
        printf("classes %d\n", (int)nc);
    free(map);
    dsv4_tokenizer_free(t);
    return 0;
}
