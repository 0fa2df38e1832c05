/* dsv4 normalize: a Hugging Face normalizer as a line filter (for tests against the peer). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"
#include "text/normalize.h"
#include "text/token_map.h"

int cmd_normalize(int argc, char **argv)
{
    const char *spec = NULL;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            printf("usage: dsv4 normalize (-n JSON | --token-map)\n"
                   "  Reads one JSON string per line and writes it normalized, one JSON string per line. -n takes\n"
                   "  a tokenizer.json \"normalizer\" object; --token-map uses the Engram token map's chain.\n");
            return 0;
        } else if (!strcmp(argv[i], "-n") && i + 1 < argc)
            spec = argv[++i];
        else if (!strcmp(argv[i], "--token-map"))
            spec = dsv4_token_map_chain;
        else {
            spec = NULL;
            break;
        }
    }
    if (!spec) {
        fprintf(stderr, "usage: dsv4 normalize (-n JSON | --token-map)  (see -h)\n");
        return 2;
    }
    dsv4_err err = {0};
    dsv4_normalizer *nz = dsv4_normalizer_parse(spec, &err);
    if (!nz) {
        fprintf(stderr, "dsv4 normalize: %s\n", err.msg);
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long lineno = 0;
    int rc = 0;
    while ((n = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        if (strspn(line, " \t\r\n") == (size_t)n)
            continue;
        char *s, *o;
        size_t len, ol;
        if (cli_json_string_parse(line, (size_t)n, &s, &len)) {
            fprintf(stderr, "dsv4 normalize: line %ld is not a JSON string\n", lineno);
            rc = 1;
            break;
        }
        if (dsv4_normalize(nz, s, len, &o, &ol, &err)) {
            fprintf(stderr, "dsv4 normalize: line %ld: %s\n", lineno, err.msg);
            free(s);
            rc = 1;
            break;
        }
        cli_json_string_write(stdout, o, ol);
        putchar('\n');
        free(o);
        free(s);
    }
    free(line);
    dsv4_normalizer_free(nz);
    return rc;
}
