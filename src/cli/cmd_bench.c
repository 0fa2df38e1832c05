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

static int argmax(const float *v, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

int dsv4_cmd_bench(int argc, char **argv)
{
    cli_model_opts o = {0};
    const char *synth = NULL;
    int layers = 2, P = 64, N = 8, lanes = 1, elayers = 0;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            printf("usage: dsv4 bench (-m DIR | --synthetic v4-flash [--layers N] [--expert-layers E]) [--prefill P]\n"
                   "                  [--decode N] [--lanes L]\n"
                   "Prints load time, prefill and decode tokens/s, the bytes a decoded token reads (weights and\n"
                   "cache) and the fraction of the measured memory bandwidth that the decode speed represents\n"
                   "(on a GPU: its device-to-device copy rate; on the CPU: all threads reading).\n"
                   "  --synthetic v4-flash  random weights in memory at V4-Flash shapes and storage forms\n"
                   "  --layers N            synthetic layers (alternating CSA / HCA as in layers 2.. of the model)\n"
                   "  --expert-layers E     only E layers own routed experts, layer i uses layer i %% E's (all 43\n"
                   "                        layers' shapes on a GPU that cannot hold 43 layers of experts)\n"
                   "  --prefill P           prompt tokens per lane (default 64)\n"
                   "  --decode N            timed decode steps (default 8), after two untimed ones\n"
                   "  --lanes L             sequences decoded together, one token each per step (default 1)\n%s",
                   cli_model_usage());
            return 0;
        }
        if (cli_model_opt(argc, argv, &i, &o))
            continue;
        if (!strcmp(argv[i], "--synthetic") && i + 1 < argc)
            synth = argv[++i];
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc)
            layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--expert-layers") && i + 1 < argc)
            elayers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prefill") && i + 1 < argc)
            P = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--decode") && i + 1 < argc)
            N = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--lanes") && i + 1 < argc)
            lanes = atoi(argv[++i]);
        else {
            fprintf(stderr, "dsv4 bench: unknown option '%s' (see -h)\n", argv[i]);
            return 2;
        }
    }
    if (P < 1 || N < 1 || lanes < 1 || lanes > 256 || elayers < 0) {
        fprintf(stderr, "dsv4 bench: --prefill, --decode and --lanes (at most 256) must be positive\n");
        return 2;
    }
    double t0 = dsv4_now();
    dsv4_err err = {0};
    dsv4_model *m;
    if (synth) {
        o.load.progress = 1;
        m = dsv4_model_synthetic(synth, layers, elayers, &o.load, &err);
        if (!m)
            fprintf(stderr, "dsv4 bench: %s\n", err.msg);
    } else
        m = cli_load(&o, "bench");
    if (!m)
        return 1;
    double t_load = dsv4_now() - t0;
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    int V = info.vocab_size;
    printf("model: %s layers=%d width=%d vocab=%d threads=%d device=%s\n", synth ? synth : o.dir, info.n_layers,
           info.hidden_size, V, omp_get_max_threads(), o.load.device ? o.load.device : "cpu");
    if (synth && elayers > 0 && elayers < layers)
        printf("experts: %d layers own routed experts; layer i reads layer i %% %d's (same bytes read per token)\n", elayers,
               elayers);
    printf("load: %.2f s, %.2f GB of weights\n", t_load, info.weight_bytes / 1e9);
    if (*dsv4_model_placement(m))
        printf("placement: %s\n", dsv4_model_placement(m));
    dsv4_seq **s = calloc(lanes, sizeof *s);
    int32_t *ids = malloc((size_t)P * sizeof *ids), *next = calloc(lanes, sizeof *next);
    const int32_t **idp = malloc(lanes * sizeof *idp);
    int *nid = malloc(lanes * sizeof *nid);
    float *lg = malloc((size_t)lanes * V * sizeof(float));
    int rc = !s || !ids || !next || !idp || !nid || !lg;
    double t_pre = 0;
    /* Each lane's prompt alone (lane 0 timed), then the lanes decode together. */
    for (int l = 0; l < lanes && !rc; l++) {
        if (!(s[l] = dsv4_seq_new(m, &err))) {
            rc = 1;
            break;
        }
        for (int i = 0; i < P; i++)
            ids[i] = (int32_t)((i * 7919 + 13 + l * 104729) % V);
        const int32_t *p = ids;
        dsv4_batch b = {.n_seqs = 1, .seqs = &s[l], .ids = &p, .n_ids = &P, .logits = lg};
        double t1 = dsv4_now();
        rc = dsv4_forward(m, &b, &err);
        if (l == 0)
            t_pre = dsv4_now() - t1;
        next[l] = argmax(lg, V);
    }
    dsv4_batch b = {.n_seqs = lanes, .seqs = s, .ids = idp, .n_ids = nid, .logits = lg};
    for (int l = 0; l < lanes; l++) {
        idp[l] = &next[l];
        nid[l] = 1;
    }
    double t2 = 0;
    for (int i = 0; i < N + 2 && !rc; i++) {
        if (i == 2) /* the first step of a shape runs, the second records it */
            t2 = dsv4_now();
        rc = dsv4_forward(m, &b, &err);
        for (int l = 0; l < lanes && !rc; l++)
            next[l] = argmax(lg + (size_t)l * V, V);
    }
    double t_dec = (dsv4_now() - t2) / N;
    if (rc) {
        fprintf(stderr, "dsv4 bench: %s\n", *err.msg ? err.msg : "out of memory");
        return 1;
    }
    int gpu = o.load.device && !strcmp(o.load.device, "cuda");
    double bw = gpu ? dsv4_device_bandwidth("cuda") : read_bandwidth();
    size_t wb = dsv4_decode_weight_bytes(m), sb = dsv4_decode_state_bytes(m, P + N / 2 + 1);
    double flops = 2.0 * dsv4_token_params(m);
    printf("prefill: %d tokens in %.3f s = %.1f tok/s (%.1f TFLOP/s in the projections and experts)\n", P, t_pre, P / t_pre,
           flops * P / t_pre / 1e12);
    if (lanes == 1) {
        printf("decode: %.2f ms/token = %.2f tok/s at context %d..%d\n", t_dec * 1e3, 1.0 / t_dec, P, P + N + 2);
        printf("read per decoded token: weights %.1f MB + cache %.1f MB; effective %.2f GB/s\n", wb / 1e6, sb / 1e6,
               (wb + sb) / t_dec / 1e9);
        printf("measured %s bandwidth: %.1f GB/s; floor %.3f ms/token; decode reaches %.0f%% of it\n",
               gpu ? "device copy (read + write)" : "read (all threads)", bw, (wb + sb) / (bw * 1e9) * 1e3,
               100.0 * (wb + sb) / t_dec / 1e9 / bw);
    } else {
        double step_b = dsv4_decode_step_bytes(m, lanes, P + N / 2 + 1);
        printf("decode: %d lanes, %.2f ms/step = %.1f tok/s per lane, %.1f tok/s aggregate at context %d..%d\n", lanes,
               t_dec * 1e3, 1.0 / t_dec, lanes / t_dec, P, P + N + 2);
        printf("read per step (weights, the expected distinct experts of %d lanes' picks, caches): %.1f MB; effective "
               "%.2f GB/s; floor %.3f ms/step; %.0f%% of it\n",
               lanes, step_b / 1e6, step_b / t_dec / 1e9, step_b / (bw * 1e9) * 1e3, 100.0 * step_b / t_dec / 1e9 / bw);
    }
    dsv4_state_cost_t sc;
    dsv4_state_cost(m, 131072, &sc);
    printf("state at 131072 tokens (these %d layers): fp32 %.1f MB (window %.1f, entries %.1f, index keys %.1f); "
           "quantized store %.1f MB\n",
           info.n_layers, (sc.window_bytes + sc.entry_bytes + sc.ikey_bytes) / 1e6, sc.window_bytes / 1e6,
           sc.entry_bytes / 1e6, sc.ikey_bytes / 1e6, (sc.window_bytes_q + sc.entry_bytes_q + sc.ikey_bytes_q) / 1e6);
    for (int l = 0; l < lanes; l++)
        dsv4_seq_free(s[l]);
    free(s);
    free(ids);
    free(next);
    free(idp);
    free(nid);
    free(lg);
    dsv4_model_free(m);
    return 0;
}
