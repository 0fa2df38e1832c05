/* dsv4 bench-exl3 — EXL3 matvec speed on this CPU against its memory bandwidth. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"
#include "core/core.h"
#include "kernels/backend.h"
#include "kernels/cpu/exl3.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dsv4 bench-exl3 [--bits 2,3,4] [--shape OUTxIN]... [--rows T] [--time S] [--codebook CB] [--pool MiB]\n"
            "       dsv4 bench-exl3 --quant TILES [--bits 1,2,...,8] [--codebook CB]\n"
            "  Times dsv4_exl3_linear on random trellises (codebook CB: 3inst (default), mcg or mul1; all\n"
            "  decode through one table) at V4-Flash shapes [2048x4096, 4096x2048, 1024x4096] unless\n"
            "  --shape is given, for one row and for T rows (default 64), the fastest call of --time S\n"
            "  seconds. Reports effective GB/s of packed weight read per\n"
            "  matvec and its fraction of the copy bandwidth measured in the same run (a 256 MiB memcpy,\n"
            "  counting bytes read + written), beside the FP8 form of each shape (e4m3 + 128x128 scales)\n"
            "  through the same CPU backend. Each form is timed over distinct copies filling --pool MiB\n"
            "  (default 1024, larger than the last-level cache: weights come from memory; 0: one copy,\n"
            "  cache-resident). Threads: OMP_NUM_THREADS (default all cores).\n"
            "  --quant: encodes TILES i.i.d. Gaussian 16x16 tiles per K on one thread (the quantizer's\n"
            "  Viterbi search) and prints the MSE relative to the variance, the rate-distortion bound\n"
            "  2^-2K for a Gaussian source, and tiles/s on one core.\n");
}

/* Copy bandwidth in GB/s (read + write bytes), best of 5 over 256 MiB buffers, all threads. */
static double copy_bw(void)
{
    size_t n = (size_t)256 << 20;
    char *a = malloc(n), *b = malloc(n);
    if (!a || !b) {
        free(a);
        free(b);
        return 0;
    }
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = dsv4_now();
#pragma omp parallel
        {
            int nt = omp_get_num_threads(), id = omp_get_thread_num();
            size_t chunk = n / nt;
            memcpy(b + id * chunk, a + id * chunk, id == nt - 1 ? n - id * chunk : chunk);
        }
        double bw = 2.0 * n / (dsv4_now() - t0) / 1e9;
        if (bw > best)
            best = bw;
    }
    free(a);
    free(b);
    return best;
}

/* Seconds per call of the CPU backend's linear (EXL3 goes to dsv4_exl3_linear_rows): the
 * fastest of the calls that fill `secs` (the machine is shared; the minimum is the least
 * disturbed measure). Successive calls take successive copies of the weight, so with a pool
 * larger than the last-level cache each call reads its weight from memory. */
static double time_linear(const dsv4_weight *ws, int ncopy, const float *x, int T, float *y, double secs)
{
    const dsv4_backend *be = dsv4_backend_cpu();
    double ts[256];
    int n = 0;
    double t_end = dsv4_now() + secs;
    be->linear(&ws[0], 0, ws[0].n, x, T, ws[0].k, y, ws[0].n);
    while (n < 256 && (n < 3 || dsv4_now() < t_end)) {
        const dsv4_weight *w = &ws[(n + 1) % ncopy];
        double t0 = dsv4_now();
        be->linear(w, 0, w->n, x, T, w->k, y, w->n);
        ts[n++] = dsv4_now() - t0;
    }
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && ts[j] < ts[j - 1]; j--) {
            double t = ts[j];
            ts[j] = ts[j - 1];
            ts[j - 1] = t;
        }
    return ts[0];
}

/* Copies of a weight of `bytes` that fill `pool` bytes (at least one). */
static int copies(size_t bytes, size_t pool)
{
    size_t c = (pool + bytes - 1) / bytes;
    return c < 1 ? 1 : c > 4096 ? 4096 : (int)c;
}

static double gauss(uint64_t *s)
{
    uint64_t a = (*s = *s * 6364136223846793005ull + 1442695040888963407ull) >> 11;
    uint64_t b = (*s = *s * 6364136223846793005ull + 1442695040888963407ull) >> 11;
    double u1 = (a + 1.0) / 9007199254740993.0, u2 = b / 9007199254740992.0;
    return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Gaussian tiles through the Viterbi encoder, one thread. */
static int bench_quant(const int *bits, int nbits, int cb, int tiles)
{
    printf("codebook %s, %d Gaussian tiles per K, one thread\n", cb == 0 ? "3inst" : cb == 1 ? "mcg" : "mul1", tiles);
    printf("%2s %10s %10s %8s %10s\n", "K", "mse/var", "2^-2K", "ratio", "tiles/s");
    float sd = dsv4_exl3_codebook_std(cb);
    for (int b = 0; b < nbits; b++) {
        dsv4_err err = {0};
        dsv4_exl3_enc *e = dsv4_exl3_enc_new(bits[b], cb, &err);
        if (!e) {
            fprintf(stderr, "dsv4 bench-exl3: %s\n", err.msg);
            return 1;
        }
        uint64_t rs = 42;
        double se = 0, s2 = 0, t = 0;
        for (int i = 0; i < tiles; i++) {
            float tile[256], dec[256];
            uint16_t words[128];
            for (int j = 0; j < 256; j++) {
                tile[j] = (float)(sd * gauss(&rs));
                s2 += (double)tile[j] * tile[j];
            }
            double t0 = dsv4_now();
            se += dsv4_exl3_enc_tile(e, tile, words, dec);
            t += dsv4_now() - t0;
        }
        dsv4_exl3_enc_free(e);
        double d = se / s2, bound = pow(2.0, -2.0 * bits[b]);
        printf("%2d %10.5f %10.5f %8.3f %10.1f\n", bits[b], d, bound, d / bound, tiles / t);
        fflush(stdout);
    }
    return 0;
}

int dsv4_cmd_bench_exl3(int argc, char **argv)
{
    int bits[8] = {2, 3, 4}, nbits = 3, T = 64;
    long long shapes[16][2] = {{2048, 4096}, {4096, 2048}, {1024, 4096}};
    int nshapes = 3, custom = 0;
    double secs = 1.0;
    size_t pool = (size_t)1 << 30;
    int quant = 0, qcb = DSV4_EXL3_3INST, bits_given = 0;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            usage(stdout);
            return 0;
        } else if (i + 1 < argc && !strcmp(argv[i], "--bits")) {
            int *ids, n;
            if (cli_parse_ids(argv[++i], &ids, &n) || n < 1 || n > 8) {
                fprintf(stderr, "dsv4 bench-exl3: --bits wants 1 to 8 values in 1..8\n");
                return 2;
            }
            nbits = n;
            bits_given = 1;
            for (int j = 0; j < n; j++)
                bits[j] = ids[j];
            free(ids);
            for (int j = 0; j < n; j++)
                if (bits[j] < 1 || bits[j] > 8) {
                    fprintf(stderr, "dsv4 bench-exl3: --bits values must be in 1..8\n");
                    return 2;
                }
        } else if (i + 1 < argc && !strcmp(argv[i], "--shape")) {
            if (!custom)
                nshapes = 0;
            custom = 1;
            if (nshapes == 16 || sscanf(argv[++i], "%lldx%lld", &shapes[nshapes][0], &shapes[nshapes][1]) != 2 ||
                shapes[nshapes][0] <= 0 || shapes[nshapes][1] <= 0 || shapes[nshapes][0] % 128 || shapes[nshapes][1] % 128) {
                fprintf(stderr, "dsv4 bench-exl3: --shape wants OUTxIN, multiples of 128 (at most 16 shapes)\n");
                return 2;
            }
            nshapes++;
        } else if (i + 1 < argc && !strcmp(argv[i], "--rows")) {
            T = atoi(argv[++i]);
            if (T < 1) {
                fprintf(stderr, "dsv4 bench-exl3: --rows wants a positive count\n");
                return 2;
            }
        } else if (i + 1 < argc && !strcmp(argv[i], "--quant")) {
            quant = atoi(argv[++i]);
            if (quant < 1) {
                fprintf(stderr, "dsv4 bench-exl3: --quant wants a positive tile count\n");
                return 2;
            }
        } else if (i + 1 < argc && !strcmp(argv[i], "--codebook")) {
            const char *c = argv[++i];
            qcb = !strcmp(c, "3inst") ? 0 : !strcmp(c, "mcg") ? 1 : !strcmp(c, "mul1") ? 2 : -1;
            if (qcb < 0) {
                fprintf(stderr, "dsv4 bench-exl3: --codebook is 3inst, mcg or mul1\n");
                return 2;
            }
        } else if (i + 1 < argc && !strcmp(argv[i], "--pool")) {
            pool = (size_t)atoll(argv[++i]) << 20;
        } else if (i + 1 < argc && !strcmp(argv[i], "--time")) {
            secs = atof(argv[++i]);
        } else {
            fprintf(stderr, "dsv4 bench-exl3: unknown or incomplete option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (quant) {
        if (!bits_given)
            for (nbits = 0; nbits < 8; nbits++)
                bits[nbits] = nbits + 1;
        return bench_quant(bits, nbits, qcb, quant);
    }
    double bw = copy_bw();
    printf("threads %d, copy bandwidth %.1f GB/s (read + write)\n", omp_get_max_threads(), bw);
    printf("%-11s %4s %9s %10s %8s %7s %12s %10s\n", "shape", "K", "MiB", "us/matvec", "GB/s", "of bw", "Gweights/s",
           "T-row x");
    for (int s = 0; s < nshapes; s++) {
        /* the FP8 form of the same shape (e4m3 + 128x128 f32 block scales) for comparison */
        {
            int64_t n = shapes[s][0], k = shapes[s][1], sn = (n + 127) / 128, sk = (k + 127) / 128;
            int ncopy = copies((size_t)n * k, pool);
            uint8_t *q = malloc((size_t)n * k * ncopy);
            dsv4_weight *ws = malloc(ncopy * sizeof *ws);
            float *sc = malloc(sn * sk * sizeof(float)), *x = malloc((size_t)T * k * sizeof(float));
            float *y = malloc((size_t)T * n * sizeof(float));
            if (!q || !sc || !x || !y || !ws) {
                fprintf(stderr, "dsv4 bench-exl3: out of memory\n");
                free(q);
                free(sc);
                free(x);
                free(y);
                free(ws);
                return 1;
            }
            uint32_t r = 777;
            for (size_t i = 0; i < (size_t)n * k * ncopy; i += 4) {
                uint32_t v = (r = r * 1664525u + 1013904223u) & 0x77777777u;
                memcpy(q + i, &v, 4);
            }
            for (int64_t i = 0; i < sn * sk; i++)
                sc[i] = 1.0f / 256;
            for (int64_t i = 0; i < (int64_t)T * k; i++)
                x[i] = (float)((i * 7919) % 2001 - 1000) / 1000.0f;
            for (int c = 0; c < ncopy; c++)
                ws[c] = (dsv4_weight){.name = "bench-fp8", .form = DSV4_WF_FP8, .n = n, .k = k, .data = q + (size_t)c * n * k,
                                      .scale = sc, .bn = 128, .bk = 128, .bytes = (size_t)n * k + sn * sk * 4};
            double t1 = time_linear(ws, ncopy, x, 1, y, secs), tT = time_linear(ws, ncopy, x, T, y, secs);
            double gbs = ws[0].bytes / t1 / 1e9;
            char sh[32];
            snprintf(sh, sizeof sh, "%lldx%lld", (long long)n, (long long)k);
            printf("%-11s %4s %9.2f %10.1f %8.2f %6.1f%% %12.2f %9.1fx\n", sh, "fp8", ws[0].bytes / 1048576.0, t1 * 1e6,
                   gbs, 100 * gbs / bw, (double)n * k / t1 / 1e9, t1 * T / tT);
            free(ws);
            free(q);
            free(sc);
            free(x);
            free(y);
        }
        for (int b = 0; b < nbits; b++) {
            int64_t n = shapes[s][0], k = shapes[s][1];
            int K = bits[b];
            size_t nw = (size_t)(k / 16) * (n / 16) * 16 * K;
            int ncopy = copies(nw * 2, pool);
            uint16_t *tr = malloc(nw * 2 * ncopy);
            dsv4_weight *ws = malloc(ncopy * sizeof *ws);
            dsv4_exl3 *es = malloc(ncopy * sizeof *es);
            float *scales = malloc((k + n) * sizeof(float));
            float *x = malloc((size_t)T * k * sizeof(float)), *y = malloc((size_t)T * n * sizeof(float));
            if (!tr || !scales || !x || !y || !ws || !es) {
                fprintf(stderr, "dsv4 bench-exl3: out of memory\n");
                free(ws);
                free(es);
                free(tr);
                free(scales);
                free(x);
                free(y);
                return 1;
            }
            uint32_t r = 12345;
            for (size_t i = 0; i < nw * ncopy; i++)
                tr[i] = (uint16_t)((r = r * 1664525u + 1013904223u) >> 16);
            for (int64_t i = 0; i < k + n; i++)
                scales[i] = i % 3 ? 0.01f : -0.01f;
            for (int64_t i = 0; i < (int64_t)T * k; i++)
                x[i] = (float)((i * 7919) % 2001 - 1000) / 1000.0f;
            for (int c = 0; c < ncopy; c++) {
                es[c] = (dsv4_exl3){.prefix = "bench", .K = K, .cb = qcb, .kp = k, .np = n, .k = k, .n = n,
                                    .trellis = tr + nw * c, .suh = scales, .svh = scales + k, .bytes = nw * 2};
                ws[c] = (dsv4_weight){.name = "bench", .form = DSV4_WF_EXL3, .n = n, .k = k, .data = es[c].trellis,
                                      .exl3 = &es[c], .bytes = nw * 2};
            }
            double t1 = time_linear(ws, ncopy, x, 1, y, secs);
            double tT = time_linear(ws, ncopy, x, T, y, secs);
            double gbs = nw * 2 / t1 / 1e9;
            char sh[32];
            snprintf(sh, sizeof sh, "%lldx%lld", (long long)n, (long long)k);
            printf("%-11s %4d %9.2f %10.1f %8.2f %6.1f%% %12.2f %9.1fx\n", sh, K, nw * 2 / 1048576.0, t1 * 1e6, gbs,
                   100 * gbs / bw, (double)n * k / t1 / 1e9, t1 * T / tT);
            fflush(stdout);
            free(ws);
            free(es);
            free(tr);
            free(scales);
            free(x);
            free(y);
        }
    }
    printf("T-row x: rows per second with %d rows at once over rows per second one at a time\n", T);
    return 0;
}
