/* dsv4 logits: float32 little-endian logits [T, vocab] for every position of an id list;
 * with --prefill P, positions 0..P-1 come from one prefill call and the rest from one-token
 * decode steps (the two paths the exactness tests compare). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"

int dsv4_cmd_logits(int argc, char **argv)
{
    cli_model_opts o = {0};
    const char *ids_s = NULL, *out = NULL;
    int P = -1;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            printf("usage: dsv4 logits -m DIR --ids 0,5,7,... [--prefill P] -o FILE\n"
                   "Writes float32 little-endian logits [T, vocab] for every position.\n"
                   "  --ids LIST       comma-separated token ids\n"
                   "  --prefill P      positions 0..P-1 in one prefill call, the rest one token per step\n"
                   "                   (default: the whole sequence in one call)\n"
                   "  -o FILE          output file\n%s",
                   cli_model_usage());
            return 0;
        }
        if (cli_model_opt(argc, argv, &i, &o))
            continue;
        if (!strcmp(argv[i], "--ids") && i + 1 < argc)
            ids_s = argv[++i];
        else if (!strcmp(argv[i], "--prefill") && i + 1 < argc)
            P = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-o") && i + 1 < argc)
            out = argv[++i];
        else {
            fprintf(stderr, "dsv4 logits: unknown option '%s' (see -h)\n", argv[i]);
            return 2;
        }
    }
    int *ids = NULL, T = 0;
    if (!ids_s || !out || cli_parse_ids(ids_s, &ids, &T) || T == 0) {
        fprintf(stderr, "dsv4 logits: --ids (a non-empty comma-separated list) and -o are required\n");
        return 2;
    }
    if (P < 0 || P > T)
        P = T;
    dsv4_model *m = cli_load(&o, "logits");
    if (!m)
        return 1;
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    dsv4_err err = {0};
    dsv4_seq *s = dsv4_seq_new(m, &err);
    float *lg = malloc((size_t)T * info.vocab_size * sizeof(float));
    int32_t *ids32 = malloc(T * sizeof *ids32);
    for (int i = 0; i < T; i++)
        ids32[i] = ids[i];
    int rc = 0;
    for (int done = 0; done < T && !rc;) {
        int n = done == 0 && P > 0 ? P : 1;
        const int32_t *p = ids32 + done;
        dsv4_batch b = {.n_seqs = 1, .seqs = &s, .ids = &p, .n_ids = &n, .all_logits = 1,
                        .logits = lg + (size_t)done * info.vocab_size};
        if ((rc = dsv4_forward(m, &b, &err)))
            fprintf(stderr, "dsv4 logits: %s\n", err.msg);
        done += n;
    }
    if (!rc && cli_rank() == 0) { /* --gpus: every rank has the logits; rank 0 writes them */
        FILE *f = fopen(out, "wb");
        if (!f || fwrite(lg, sizeof(float), (size_t)T * info.vocab_size, f) != (size_t)T * info.vocab_size) {
            fprintf(stderr, "dsv4 logits: cannot write %s\n", out);
            rc = 1;
        }
        if (f)
            fclose(f);
    }
    free(ids);
    free(ids32);
    free(lg);
    dsv4_seq_free(s);
    dsv4_model_free(m);
    return rc ? 1 : 0;
}
