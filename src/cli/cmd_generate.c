/* dsv4 generate: greedy continuation of an id prompt; prints the new ids, and the speed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"
#include "core/core.h"

int dsv4_cmd_generate(int argc, char **argv)
{
    cli_model_opts o = {0};
    const char *ids_s = NULL;
    int N = 16, stop_eos = 1;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            printf("usage: dsv4 generate -m DIR --ids 0,5,7,... [-n N] [--ignore-eos]\n"
                   "Greedy generation: prints the generated ids, comma-separated, on one line.\n"
                   "  --ids LIST       prompt token ids\n"
                   "  -n N             tokens to generate (default 16)\n"
                   "  --ignore-eos     keep going past the end-of-sequence token\n%s",
                   cli_model_usage());
            return 0;
        }
        if (cli_model_opt(argc, argv, &i, &o))
            continue;
        if (!strcmp(argv[i], "--ids") && i + 1 < argc)
            ids_s = argv[++i];
        else if (!strcmp(argv[i], "-n") && i + 1 < argc)
            N = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ignore-eos"))
            stop_eos = 0;
        else {
            fprintf(stderr, "dsv4 generate: unknown option '%s' (see -h)\n", argv[i]);
            return 2;
        }
    }
    int *ids = NULL, T = 0;
    if (!ids_s || cli_parse_ids(ids_s, &ids, &T) || T == 0) {
        fprintf(stderr, "dsv4 generate: --ids (a non-empty comma-separated list) is required\n");
        return 2;
    }
    dsv4_model *m = cli_load(&o, "generate");
    if (!m) {
        free(ids);
        return 1;
    }
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    dsv4_err err = {0};
    dsv4_seq *s = dsv4_seq_new(m, &err);
    float *lg = malloc((size_t)info.vocab_size * sizeof(float));
    int32_t *cur = malloc((T > 1 ? T : 1) * sizeof *cur);
    for (int i = 0; i < T; i++)
        cur[i] = ids[i];
    int n = T, rc = 0, made = 0;
    double t0 = dsv4_now(), t_prefill = 0;
    for (; made < N; made++) {
        const int32_t *p = cur;
        dsv4_batch b = {.n_seqs = 1, .seqs = &s, .ids = &p, .n_ids = &n, .all_logits = 0, .logits = lg};
        if ((rc = dsv4_forward(m, &b, &err))) {
            fprintf(stderr, "dsv4 generate: %s\n", err.msg);
            break;
        }
        if (made == 0)
            t_prefill = dsv4_now() - t0;
        int best = 0;
        for (int v = 1; v < info.vocab_size; v++)
            if (lg[v] > lg[best])
                best = v;
        printf(made ? ",%d" : "%d", best);
        fflush(stdout);
        cur[0] = best;
        n = 1;
        if (stop_eos && best == info.eos_id) {
            made++;
            break;
        }
    }
    printf("\n");
    fflush(stdout);
    double t = dsv4_now() - t0;
    if (!rc)
        fprintf(stderr, "prompt %d tokens in %.3fs (%.1f tok/s); %d generated, %.1f tok/s decode\n", T, t_prefill,
                T / (t_prefill > 0 ? t_prefill : 1e-9), made, made > 1 ? (made - 1) / (t - t_prefill) : 0.0);
    free(ids);
    free(cur);
    free(lg);
    dsv4_seq_free(s);
    dsv4_model_free(m);
    return rc ? 1 : 0;
}
