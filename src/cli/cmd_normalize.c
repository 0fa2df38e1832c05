/* dsv4 normalize: a Hugging Face normalizer as a line filter (for tests against the peer). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"
#include "text/normalize.h"
#include "text/token_map.h"

/* One line: the normalized text as a JSON string. */
static int normalize_line(void *ctx, const char *s, size_t len, long lineno)
{
    dsv4_err err = {0};
    char *o;
    size_t ol;
    if (dsv4_normalize(ctx, s, len, &o, &ol, &err)) {
        fprintf(stderr, "dsv4 normalize: line %ld: %s\n", lineno, err.msg);
        return 1;
    }
    cli_json_string_write(stdout, o, ol);
    putchar('\n');
    free(o);
    return 0;
}

int dsv4_cmd_normalize(int argc, char **argv)
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
    int rc = cli_json_lines("normalize", normalize_line, nz);
    dsv4_normalizer_free(nz);
    return rc;
}
