/* dsv4 bench: load time, prefill and decode tokens/s, weight bytes read per decoded token
 * and the fraction of this machine's measured read bandwidth that represents. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "cli/cli.h"
#include "core/core.h"
#include "kernels/cpu/cpu.h"
#include "model/diag.h"
#include "model/model.h"

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

/* A comma list of up to n positive ints into v; returns the count, 0 when malformed. */
static int int_list(const char *s, int *v, int n)
{
    int c = 0;
    while (*s && c < n) {
        char *e;
        long x = strtol(s, &e, 10);
        if (e == s || x < 1 || x > 1 << 20 || (*e && *e != ','))
            return 0;
        v[c++] = (int)x;
        s = *e ? e + 1 : e;
    }
    return *s ? 0 : c;
}

/* Engram counters at one moment; eg_print reports the span between two. */
typedef struct eg_mark {
    uint64_t bytes, tokens;
    double gather_s, stall_s;
} eg_mark;

static eg_mark eg_now(const dsv4_model *m)
{
    eg_mark e;
    dsv4_engram_stats(m, &e.bytes, &e.tokens, NULL);
    dsv4_engram_times(m, &e.gather_s, &e.stall_s);
    return e;
}

/* Rows a token gathered over the span [a, b] of span_s seconds: time reading and decoding them
 * and the part the forward waited for, per token and as a share of the span; the bytes read
 * and their rate against the measured bandwidth. */
static void eg_print(const dsv4_model *m, eg_mark a, eg_mark b, double span_s, double bw)
{
    int cols, streamed, ne = dsv4_engram_layout(m, NULL, &cols);
    uint64_t tok = b.tokens - a.tokens;
    if (!ne || !tok)
        return;
    dsv4_engram_stats(m, NULL, NULL, &streamed);
    double g = (b.gather_s - a.gather_s) / tok, w = (b.stall_s - a.stall_s) / tok, by = (double)(b.bytes - a.bytes) / tok;
    printf("  engram (%s): %d rows/token, gather %.1f us/token = %.2f%% of the time (waited for: %.1f us, %.2f%%); "
           "%.1f KB/token read at %.2f GB/s = %.1f%% of the measured bandwidth\n",
           streamed ? "streamed" : "resident", ne * cols, g * 1e6, 100.0 * g * tok / span_s, w * 1e6,
           100.0 * w * tok / span_s, by / 1e3, g > 0 ? by / g / 1e9 : 0, g > 0 && bw > 0 ? 100.0 * by / g / 1e9 / bw : 0);
}

/* A prompt of P tokens on a fresh sequence: its time in *t, the next token in *next. */
static int time_prefill(dsv4_model *m, int P, int V, int salt, dsv4_seq *s, float *lg, double *t, int32_t *next,
                        dsv4_err *err)
{
    int32_t *ids = malloc((size_t)P * sizeof *ids);
    if (!ids)
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    for (int i = 0; i < P; i++)
        ids[i] = (int32_t)((i * 7919 + 13 + salt * 104729) % V);
    const int32_t *p = ids;
    dsv4_batch b = {.n_seqs = 1, .seqs = &s, .ids = &p, .n_ids = &P, .logits = lg};
    double t0 = dsv4_now();
    int rc = dsv4_forward(m, &b, err);
    *t = dsv4_now() - t0;
    *next = argmax(lg, V);
    free(ids);
    return rc;
}

/* `lanes` sequences, each prompted with P tokens alone, then decoded together: the mean time of
 * N steps after two untimed ones (the first step of a shape runs, the second records it).
 * capture: a device whose profiler records the last step (NULL: none). */
static int time_decode(dsv4_model *m, int P, int N, int lanes, int V, const char *capture, double *t, eg_mark *e0,
                       eg_mark *e1, dsv4_err *err)
{
    dsv4_seq **s = calloc(lanes, sizeof *s);
    int32_t *next = calloc(lanes, sizeof *next);
    const int32_t **idp = malloc(lanes * sizeof *idp);
    int *nid = malloc(lanes * sizeof *nid);
    float *lg = malloc((size_t)lanes * V * sizeof(float));
    int rc = !s || !next || !idp || !nid || !lg ? dsv4_fail(err, DSV4_E_NOMEM, "out of memory") : 0;
    for (int l = 0; l < lanes && !rc; l++) {
        double tp;
        if (!(s[l] = dsv4_seq_new(m, err)) || time_prefill(m, P, V, l, s[l], lg, &tp, &next[l], err))
            rc = err->code ? err->code : DSV4_E_NOMEM;
        idp[l] = &next[l];
        nid[l] = 1;
    }
    dsv4_batch b = {.n_seqs = lanes, .seqs = s, .ids = idp, .n_ids = nid, .logits = lg};
    double t2 = 0;
    for (int i = 0; i < N + 2 && !rc; i++) {
        if (i == 2) {
            *e0 = eg_now(m);
            t2 = dsv4_now();
        }
        if (capture && i == N + 1)
            dsv4_device_capture(capture, 1);
        rc = dsv4_forward(m, &b, err);
        if (capture && i == N + 1)
            dsv4_device_capture(capture, 0);
        for (int l = 0; l < lanes && !rc; l++)
            next[l] = argmax(lg + (size_t)l * V, V);
    }
    *t = (dsv4_now() - t2) / N;
    *e1 = eg_now(m);
    for (int l = 0; s && l < lanes; l++)
        dsv4_seq_free(s[l]);
    free(s), free(next), free(idp), free(nid), free(lg);
    return rc;
}

/* At each depth D: a sequence whose caches hold D tokens of random rows (the fill is not timed),
 * then a prompt chunk of C tokens (prefill tok/s at D) and N decode steps after two untimed ones
 * (ms/token at D + C), with the indexer's share of each where it is counted (the CPU backend
 * times its index scoring; on a device the columns say "-"). */
static int depth_runs(dsv4_model *m, const int *Ds, int nD, int C, int N, int V, int counted, dsv4_err *err)
{
    float *lg = malloc((size_t)V * sizeof(float));
    int32_t *ids = malloc((size_t)C * sizeof *ids);
    if (!lg || !ids) {
        free(lg);
        free(ids);
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    }
    for (int i = 0; i < C; i++)
        ids[i] = (int32_t)((i * 7919 + 13) % V);
    printf("depth runs (%s KV caches; each state filled with random rows, not timed):\n", dsv4_model_kv(m));
    printf("  %9s %12s %14s %10s %12s %10s %12s\n", "depth", "state MB", "prefill tok/s", "index %", "decode ms", "index %",
           "tok/s");
    int rc = 0;
    for (int k = 0; k < nD && !rc; k++) {
        dsv4_seq *s = dsv4_seq_new(m, err);
        if (!s || dsv4_seq_fill_synthetic(s, Ds[k], (uint64_t)k + 1, err)) {
            rc = err->code ? err->code : DSV4_E_NOMEM;
            dsv4_seq_free(s);
            break;
        }
        const int32_t *p = ids;
        int c = C, one = 1;
        dsv4_batch b = {.n_seqs = 1, .seqs = &s, .ids = &p, .n_ids = &c, .logits = lg};
        double i0 = dsv4_index_seconds(), t0 = dsv4_now();
        rc = dsv4_forward(m, &b, err);
        double tp = dsv4_now() - t0, ip = dsv4_index_seconds() - i0, td = 0, id = 0;
        int32_t next = argmax(lg, V);
        const int32_t *q = &next;
        dsv4_batch d = {.n_seqs = 1, .seqs = &s, .ids = &q, .n_ids = &one, .logits = lg};
        for (int i = 0; i < N + 2 && !rc; i++) {
            if (i == 2) {
                t0 = dsv4_now();
                i0 = dsv4_index_seconds();
            }
            rc = dsv4_forward(m, &d, err);
            next = argmax(lg, V);
        }
        td = (dsv4_now() - t0) / N;
        id = (dsv4_index_seconds() - i0) / N;
        char ipc[16] = "-", idc[16] = "-";
        if (counted) {
            snprintf(ipc, sizeof ipc, "%.1f", 100.0 * ip / tp);
            snprintf(idc, sizeof idc, "%.1f", 100.0 * id / td);
        }
        if (!rc)
            printf("  %9d %12.1f %14.1f %10s %12.2f %10s %12.3f\n", Ds[k], dsv4_seq_bytes(s) / 1e6, C / tp, ipc, td * 1e3,
                   idc, 1.0 / td);
        fflush(stdout);
        dsv4_seq_free(s);
    }
    free(lg);
    free(ids);
    return rc;
}

int dsv4_cmd_bench(int argc, char **argv)
{
    cli_model_opts o = {0};
    const char *synth = NULL, *graphs = "on";
    const char *edir = NULL;
    long long erows = 0;
    int layers = 2, N = 8, elayers = 0, Ps[8] = {64}, nP = 1, Ls[8] = {1}, nL = 1, capture = 0, Ds[8], nD = 0;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            printf("usage: dsv4 bench (-m DIR | --synthetic PRESET [--layers N] [--expert-layers E] [--engram-rows R]\n"
                   "                  [--engram-dir DIR]) [--prefill P,...] [--decode N] [--lanes L,...] [--graphs on|off|both]\n"
                   "Prints load time, prefill and decode tokens/s, the bytes a decoded token reads (weights and\n"
                   "cache) and the fraction of the measured memory bandwidth that the decode speed represents\n"
                   "(on a GPU: its device-to-device copy rate; on the CPU: all threads reading); with weights\n"
                   "spilled to pinned host memory, the bytes read over the bus and the floor at the rate a kernel\n"
                   "reads host memory, measured in the same run (DSV4_CUDA_BUDGET forces a spill); with Engram\n"
                   "layers, the time spent gathering their rows per token and its share of the step.\n"
                   "  --synthetic PRESET    random weights in memory at a release's shapes and storage forms:\n"
                   "                        v4-flash    V4-Flash (N of its compressed layers, alternating CSA / HCA)\n"
                   "                        v4.1-flash  V4.1-Flash: N of its 40 layers with their CSA2 roles, Engram\n"
                   "                                    at layers 1 and 14, the 3 DSpark stages (docs/v41.md)\n"
                   "                        v4.1-tiny   the same structure at width 64; tiny: V4 layer kinds at width 64\n"
                   "  --layers N            synthetic layers (default 2)\n"
                   "  --expert-layers E     only E layers own routed experts, layer i uses layer i %% E's (all the\n"
                   "                        layers' shapes on a machine that cannot hold every layer's experts)\n"
                   "  --engram-rows R       V4.1: about R rows per Engram table (v4.1-flash default 4194304, 1.1 GB\n"
                   "                        a table; the release's have 384M); --engram-tables resident (default)\n"
                   "                        builds them in memory, streamed writes them to files and reads by row\n"
                   "  --engram-dir DIR      where streamed synthetic tables are written (default $TMPDIR or /tmp;\n"
                   "                        removed once loaded, the model holds them open)\n"
                   "  --prefill P,...       prompts timed on fresh sequences (default 64); decode lanes start\n"
                   "                        from a prompt of the first\n"
                   "  --decode N            timed decode steps (default 8), after two untimed ones\n"
                   "  --lanes L,...         sequences decoded together, one token each per step (default 1)\n"
                   "  --graphs on|off|both  replay recorded steps (GPU; default on); both: batch-1 decode each way\n"
                   "  --capture             the last decode step of each run inside the GPU profiler's capture\n"
                   "                        range (ncu --profile-from-start off); it waits before and after\n"
                   "  --depths D,...        instead of the runs above: at each context depth D, a state of D\n"
                   "                        tokens of random cache rows, a prompt chunk of the first --prefill\n"
                   "                        count on it, then --decode steps: prefill tok/s, decode ms/token and\n"
                   "                        the indexer's share of each (the fill is not timed)\n%s",
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
        else if (!strcmp(argv[i], "--engram-rows") && i + 1 < argc) {
            char *end;
            erows = strtoll(argv[++i], &end, 10);
            if (*end || erows < 1) {
                fprintf(stderr, "dsv4 bench: --engram-rows takes a positive row count\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--engram-dir") && i + 1 < argc)
            edir = argv[++i];
        else if (!strcmp(argv[i], "--prefill") && i + 1 < argc)
            nP = int_list(argv[++i], Ps, 8);
        else if (!strcmp(argv[i], "--decode") && i + 1 < argc)
            N = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--lanes") && i + 1 < argc)
            nL = int_list(argv[++i], Ls, 8);
        else if (!strcmp(argv[i], "--graphs") && i + 1 < argc)
            graphs = argv[++i];
        else if (!strcmp(argv[i], "--capture"))
            capture = 1;
        else if (!strcmp(argv[i], "--depths") && i + 1 < argc) {
            if (!(nD = int_list(argv[++i], Ds, 8))) {
                fprintf(stderr, "dsv4 bench: --depths takes a list of positive counts\n");
                return 2;
            }
        }
        else {
            fprintf(stderr, "dsv4 bench: unknown option '%s' (see -h)\n", argv[i]);
            return 2;
        }
    }
    if (!nP || !nL || N < 1 || elayers < 0 || (strcmp(graphs, "on") && strcmp(graphs, "off") && strcmp(graphs, "both"))) {
        fprintf(stderr, "dsv4 bench: --prefill and --lanes take lists of positive counts, --decode a positive count, "
                        "--graphs on, off or both\n");
        return 2;
    }
    for (int i = 0; i < nL; i++)
        if (Ls[i] > 256) {
            fprintf(stderr, "dsv4 bench: at most 256 lanes\n");
            return 2;
        }
    if (!strcmp(graphs, "off"))
        setenv("DSV4_GRAPHS", "0", 1);
    double t0 = dsv4_now();
    dsv4_err err = {0};
    dsv4_model *m;
    if (synth) {
        o.load.progress = 1;
        if (cli_ranks_start(&o, "bench"))
            return 1;
        dsv4_synth_opts so = {.n_layers = layers, .expert_layers = elayers, .engram_rows = erows, .engram_dir = edir};
        m = dsv4_model_synthetic_ext(synth, &so, &o.load, &err);
        if (!m)
            fprintf(stderr, "dsv4 bench: %s\n", err.msg);
        else if (cli_ranks_check(m, "bench")) {
            dsv4_model_free(m);
            m = NULL;
        }
    } else
        m = cli_load(&o, "bench");
    if (!m)
        return 1;
    double t_load = dsv4_now() - t0;
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    int V = info.vocab_size, gpu = o.load.device && !strcmp(o.load.device, "cuda");
    printf("model: %s layers=%d width=%d vocab=%d threads=%d device=%s\n", synth ? synth : o.dir, info.n_layers,
           info.hidden_size, V, omp_get_max_threads(), gpu ? "cuda" : "cpu");
    if (synth && elayers > 0 && elayers < layers)
        printf("experts: %d layers own routed experts; layer i reads layer i %% %d's (same bytes read per token)\n", elayers,
               elayers);
    printf("load: %.2f s, %.2f GB of weights\n", t_load, info.weight_bytes / 1e9);
    {
        int64_t er[8];
        int cols, streamed, ne = dsv4_engram_layout(m, er, &cols);
        dsv4_engram_stats(m, NULL, NULL, &streamed);
        for (int i = 0; i < ne && i < 8; i++)
            printf("%s%lld%s", i ? ", " : "engram: tables of ", (long long)er[i], i + 1 == ne ? " rows" : "");
        if (ne)
            printf(" (%.2f GB), %s, %d rows per token per layer\n", (double)(er[0] + (ne > 1 ? er[1] : 0)) * 264 / 1e9,
                   streamed ? "streamed from a file" : "resident", cols);
    }
    if (*dsv4_model_placement(m))
        printf("placement: %s\n", dsv4_model_placement(m));
    double bw = gpu ? dsv4_device_bandwidth("cuda") : read_bandwidth();
    printf("measured %s bandwidth: %.1f GB/s\n", gpu ? "device copy (read + write)" : "read (all threads)", bw);
    /* weights left in pinned host memory are read over the bus, at the rate a kernel reads it */
    double hbytes = gpu ? dsv4_decode_host_bytes(m) : 0, hbw = hbytes > 0 ? dsv4_device_host_bandwidth("cuda") : 0;
    if (hbytes > 0)
        printf("measured pinned host memory read rate (a kernel over the bus): %.1f GB/s\n", hbw);
    fflush(stdout);
    {
        double px = 0, pp = 0;
        int64_t big = (int64_t)1 << 20;
        dsv4_state_cost_t a;
        dsv4_state_cost(m, big, &a);
        px = (a.entry_bytes + a.ikey_bytes) / big;
        pp = (a.entry_bytes_q + a.ikey_bytes_q) / big;
        printf("state per token of context (these %d layers): exact %.1f B, production %.1f B; this run keeps %s "
               "caches\n", info.n_layers, px, pp, dsv4_model_kv(m));
    }
    if (nD) {
        int rc = depth_runs(m, Ds, nD, Ps[0], N, V, !o.load.device || !strcmp(o.load.device, "cpu"), &err);
        if (rc)
            fprintf(stderr, "dsv4 bench: %s\n", err.msg);
        dsv4_model_free(m);
        return rc ? 1 : 0;
    }
    float *lg = malloc((size_t)V * sizeof(float));
    double flops = 2.0 * dsv4_token_params(m);
    int rc = lg ? 0 : 1;
    for (int i = 0; i < nP && !rc; i++) {
        dsv4_seq *s = dsv4_seq_new(m, &err);
        double t;
        int32_t nx;
        eg_mark e0 = eg_now(m);
        rc = !s || time_prefill(m, Ps[i], V, 0, s, lg, &t, &nx, &err);
        eg_mark e1 = eg_now(m);
        dsv4_seq_free(s);
        if (!rc) {
            printf("prefill: %d tokens in %.3f s = %.1f tok/s (%.1f %s in the projections and experts)\n", Ps[i], t,
                   Ps[i] / t, flops * Ps[i] / t / (flops * Ps[i] / t >= 1e12 ? 1e12 : 1e9),
                   flops * Ps[i] / t >= 1e12 ? "TFLOP/s" : "GFLOP/s");
            eg_print(m, e0, e1, t, bw);
        }
        fflush(stdout);
    }
    free(lg);
    int P = Ps[0];
    for (int i = 0; i < nL && !rc; i++)
        for (int pass = 0; pass < (!strcmp(graphs, "both") && Ls[i] == 1 ? 2 : 1) && !rc; pass++) {
            if (!strcmp(graphs, "both"))
                setenv("DSV4_GRAPHS", pass ? "0" : "1", 1);
            int lanes = Ls[i];
            double t;
            eg_mark e0, e1;
            if ((rc = time_decode(m, P, N, lanes, V, capture ? o.load.device : NULL, &t, &e0, &e1, &err)))
                break;
            double step_b = dsv4_decode_step_bytes(m, lanes, P + N / 2 + 1);
            const char *how = !gpu ? "" : getenv("DSV4_GRAPHS") && !strcmp(getenv("DSV4_GRAPHS"), "0") ? ", ops one by one"
                                                                                                     : ", recorded steps";
            if (lanes == 1) {
                size_t wb = dsv4_decode_weight_bytes(m), sb = dsv4_decode_state_bytes(m, P + N / 2 + 1);
                printf("decode%s: %.3f ms/token = %.2f tok/s at context %d..%d\n", how, t * 1e3, 1.0 / t, P, P + N + 2);
                printf("  read per token: weights %.1f MB + cache %.1f MB = %.2f GB/s; floor %.3f ms/token; %.0f%% of it\n",
                       wb / 1e6, sb / 1e6, (wb + sb) / t / 1e9, (wb + sb) / (bw * 1e9) * 1e3,
                       100.0 * (wb + sb) / t / 1e9 / bw);
                if (hbytes > 0 && hbw > 0) {
                    double fl = (wb + sb - hbytes) / (bw * 1e9) + hbytes / (hbw * 1e9);
                    printf("  of which from pinned host memory: %.1f MB/token; floor with those at the bus rate %.3f "
                           "ms/token; %.0f%% of it\n", hbytes / 1e6, fl * 1e3, 100.0 * fl / t);
                }
            } else {
                printf("decode%s: %d lanes, %.3f ms/step = %.1f tok/s per lane, %.1f tok/s aggregate at context %d..%d\n",
                       how, lanes, t * 1e3, 1.0 / t, lanes / t, P, P + N + 2);
                printf("  read per step (weights, the expected distinct experts of %d lanes' picks, caches): %.1f MB = "
                       "%.2f GB/s; floor %.3f ms/step; %.0f%% of it\n",
                       lanes, step_b / 1e6, step_b / t / 1e9, step_b / (bw * 1e9) * 1e3, 100.0 * step_b / t / 1e9 / bw);
            }
            eg_print(m, e0, e1, t * N, bw);
            fflush(stdout);
        }
    if (rc) {
        fprintf(stderr, "dsv4 bench: %s\n", *err.msg ? err.msg : "out of memory");
        dsv4_model_free(m);
        return 1;
    }
    dsv4_state_cost_t sc;
    dsv4_state_cost(m, 131072, &sc);
    printf("state at 131072 tokens (these %d layers): exact caches %.1f MB (window %.1f, entries %.1f, index keys %.1f); "
           "production caches %.1f MB\n",
           info.n_layers, (sc.window_bytes + sc.entry_bytes + sc.ikey_bytes) / 1e6, sc.window_bytes / 1e6,
           sc.entry_bytes / 1e6, sc.ikey_bytes / 1e6, (sc.window_bytes_q + sc.entry_bytes_q + sc.ikey_bytes_q) / 1e6);
    dsv4_model_free(m);
    return 0;
}
