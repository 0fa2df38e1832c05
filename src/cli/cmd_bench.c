/* dsv4 bench: load time, prefill and decode tokens/s, weight bytes read per decoded token
 * and the fraction of this machine's measured read bandwidth that represents. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "cli/cli.h"
#include "core/core.h"

/* Read bandwidth of all threads summing a buffer much larger than the caches (GB/s). */
static double read_bandwidth(void)
{
    size_t n = (size_t)1 << 28; /* 1 GiB of floats */
    float *b = mmap(NULL, n * sizeof(float), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b == MAP_FAILED)
        return 0;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        b[i] = (float)(i & 7);
    double best = 0, sink = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = dsv4_now(), s = 0;
#pragma omp parallel for schedule(static) reduction(+ : s)
        for (size_t i = 0; i < n; i += 8)
            s += b[i] + b[i + 1] + b[i + 2] + b[i + 3] + b[i + 4] + b[i + 5] + b[i + 6] + b[i + 7];
        double t = dsv4_now() - t0;
        sink += s;
        if (n * sizeof(float) / t / 1e9 > best)
            best = n * sizeof(float) / t / 1e9;
    }
    munmap(b, n * sizeof(float));
    return sink >= 0 ? best : best;
}

int dsv4_cmd_bench(int argc, char **argv)
{
    cli_model_opts o = {0};
    const char *synth = NULL;
    int layers = 2, P = 64, N = 8;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            printf("usage: dsv4 bench (-m DIR | --synthetic v4-flash [--layers N]) [--prefill P] [--decode N]\n"
                   "Prints load time, prefill and decode tokens/s, weight bytes read per decoded token and the\n"
                   "fraction of the measured memory read bandwidth that the decode speed represents.\n"
                   "  --synthetic v4-flash  random weights in memory at V4-Flash shapes and storage forms\n"
                   "  --layers N            synthetic layers (alternating CSA / HCA as in layers 2.. of the model)\n"
                   "  --prefill P           prompt tokens (default 64)\n"
                   "  --decode N            decode steps (default 8)\n%s",
                   cli_model_usage());
            return 0;
        }
        if (cli_model_opt(argc, argv, &i, &o))
            continue;
        if (!strcmp(argv[i], "--synthetic") && i + 1 < argc)
            synth = argv[++i];
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc)
            layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prefill") && i + 1 < argc)
            P = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--decode") && i + 1 < argc)
            N = atoi(argv[++i]);
        else {
            fprintf(stderr, "dsv4 bench: unknown option '%s' (see -h)\n", argv[i]);
            return 2;
        }
    }
    if (P < 1 || N < 1) {
        fprintf(stderr, "dsv4 bench: --prefill and --decode must be positive\n");
        return 2;
    }
    double t0 = dsv4_now();
    dsv4_err err = {0};
    dsv4_model *m;
    if (synth) {
        o.load.progress = 1;
        m = dsv4_model_synthetic(synth, layers, &o.load, &err);
        if (!m)
            fprintf(stderr, "dsv4 bench: %s\n", err.msg);
    } else
        m = cli_load(&o, "bench");
    if (!m)
        return 1;
    double t_load = dsv4_now() - t0;
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    printf("model: %s layers=%d width=%d vocab=%d threads=%d\n", synth ? synth : o.dir, info.n_layers, info.hidden_size,
           info.vocab_size, omp_get_max_threads());
    printf("load: %.2f s, %.2f GB of weights\n", t_load, info.weight_bytes / 1e9);
    if (*dsv4_model_placement(m))
        printf("placement: %s\n", dsv4_model_placement(m));
    dsv4_seq *s = dsv4_seq_new(m, &err);
    int32_t *ids = malloc(P * sizeof *ids);
    for (int i = 0; i < P; i++)
        ids[i] = (int32_t)((i * 7919 + 13) % info.vocab_size);
    float *lg = malloc((size_t)info.vocab_size * sizeof(float));
    const int32_t *p = ids;
    dsv4_batch b = {.n_seqs = 1, .seqs = &s, .ids = &p, .n_ids = &P, .all_logits = 0, .logits = lg};
    double t1 = dsv4_now();
    int rc = dsv4_forward(m, &b, &err);
    double t_pre = dsv4_now() - t1;
    int one = 1;
    b.n_ids = &one;
    double t2 = dsv4_now();
    for (int i = 0; i < N && !rc; i++) {
        int best = 0;
        for (int v = 1; v < info.vocab_size; v++)
            if (lg[v] > lg[best])
                best = v;
        ids[0] = best;
        rc = dsv4_forward(m, &b, &err);
    }
    double t_dec = (dsv4_now() - t2) / N;
    if (rc) {
        fprintf(stderr, "dsv4 bench: %s\n", err.msg);
        return 1;
    }
    double bw = read_bandwidth();
    size_t wb = dsv4_decode_weight_bytes(m);
    printf("prefill: %d tokens in %.3f s = %.1f tok/s\n", P, t_pre, P / t_pre);
    printf("decode: %.1f ms/token = %.2f tok/s at context %d..%d\n", t_dec * 1e3, 1.0 / t_dec, P, P + N);
    printf("weights read per decoded token: %.1f MB; effective %.2f GB/s\n", wb / 1e6, wb / t_dec / 1e9);
    printf("measured read bandwidth (all threads): %.2f GB/s; decode reaches %.0f%% of it\n", bw, 100.0 * wb / t_dec / 1e9 / bw);
    dsv4_state_cost_t sc;
    dsv4_state_cost(m, 131072, &sc);
    printf("state at 131072 tokens (these %d layers): fp32 %.1f MB (window %.1f, entries %.1f, index keys %.1f); "
           "quantized store %.1f MB\n",
           info.n_layers, (sc.window_bytes + sc.entry_bytes + sc.ikey_bytes) / 1e6, sc.window_bytes / 1e6,
           sc.entry_bytes / 1e6, sc.ikey_bytes / 1e6, (sc.window_bytes_q + sc.entry_bytes_q + sc.ikey_bytes_q) / 1e6);
    free(ids);
    free(lg);
    dsv4_seq_free(s);
    dsv4_model_free(m);
    return 0;
}
