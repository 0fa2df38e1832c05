/* dsv4 engram-bench: Engram table rows/s on a synthetic table file of a few GB, cold and warm,
 * resident (through the mapping) and streamed (pread by row address, O_DIRECT or buffered),
 * and what that adds per token at the released layout (24 rows per token per Engram layer,
 * 2 layers). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "cli/cli.h"
#include "core/core.h"
#include "model/engram.h"

#define PREFIX "layers.1.engram.embed"
#define ROWS_PER_TOKEN 24
#define LAYERS 2

/* Drops the file's clean pages from the page cache (nothing of it may be mapped). */
static void evict(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
        fdatasync(fd); /* dirty pages cannot be dropped */
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
}

/* One pass over the rows: rows/s, and bytes read per row. */
static int pass(const char *path, int64_t R, int mode, const int64_t *rows, int n, double *rate, double *bpr)
{
    dsv4_err err = {0};
    dsv4_st *st = dsv4_st_open_file(path, &err);
    dsv4_etable t;
    float *out = malloc((size_t)n * 256 * sizeof(float));
    uint64_t bytes = 0;
    int rc = !st || !out || dsv4_etable_open(&t, st, PREFIX, R, 256, mode > 0, mode == 2, &err);
    if (!rc) {
        double t0 = dsv4_now();
        rc = dsv4_etable_rows(&t, rows, n, out, &bytes, &err);
        *rate = n / (dsv4_now() - t0);
        *bpr = (double)bytes / n;
        dsv4_etable_close(&t);
    }
    if (rc)
        fprintf(stderr, "dsv4 engram-bench: %s\n", err.msg);
    free(out);
    dsv4_st_close(st);
    return rc;
}

int dsv4_cmd_engram_bench(int argc, char **argv)
{
    const char *path = "/tmp/dsv4-engram-bench.safetensors";
    double gb = 4;
    int tokens = 2000, keep = 0;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            printf("usage: dsv4 engram-bench [--file PATH] [--gb G] [--tokens N] [--keep]\n"
                   "Writes (or reuses) a synthetic Engram table of G GB (256 e4m3 + 8 e8m0 bytes per row), then\n"
                   "reads N tokens' worth of random rows (24 per token) resident and streamed, cold and warm.\n"
                   "  --file PATH   table file (default %s; removed afterwards unless --keep)\n"
                   "  --gb G        table size in GB (default 4)\n"
                   "  --tokens N    tokens of rows per pass (default 2000)\n",
                   path);
            return 0;
        }
        if (!strcmp(argv[i], "--file") && i + 1 < argc)
            path = argv[++i];
        else if (!strcmp(argv[i], "--gb") && i + 1 < argc)
            gb = atof(argv[++i]);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
            tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--keep"))
            keep = 1;
        else {
            fprintf(stderr, "dsv4 engram-bench: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    int64_t R = (int64_t)(gb * 1e9 / 264);
    struct stat sb;
    dsv4_err err = {0};
    if (stat(path, &sb) || sb.st_size < R * 264) {
        double t0 = dsv4_now();
        if (dsv4_etable_synth(path, PREFIX, R, 256, 1, 0, &err)) {
            fprintf(stderr, "dsv4 engram-bench: %s\n", err.msg);
            return 1;
        }
        printf("wrote %s: %lld rows, %.2f GB in %.1f s\n", path, (long long)R, R * 264 / 1e9, dsv4_now() - t0);
    }
    int n = tokens * ROWS_PER_TOKEN;
    int64_t *rows = malloc((size_t)n * sizeof(int64_t));
    uint64_t s = 12345;
    for (int i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        rows[i] = (int64_t)((s >> 20) % (uint64_t)R);
    }
    static const struct { const char *name; int mode, cold; } runs[] = {
        {"resident (mmap), cold", 0, 1}, {"resident (mmap), warm", 0, 0}, {"streamed O_DIRECT", 2, 1},
        {"streamed buffered, cold", 1, 1}, {"streamed buffered, warm", 1, 0},
    };
    printf("%d rows (%d tokens x %d rows) per pass over %.2f GB; added time per token = %d layers x %d rows / rate\n", n,
           tokens, ROWS_PER_TOKEN, R * 264 / 1e9, LAYERS, ROWS_PER_TOKEN);
    int rc = 0;
    for (size_t k = 0; k < sizeof runs / sizeof runs[0] && !rc; k++) {
        double rate = 0, bpr = 0;
        if (runs[k].cold)
            evict(path);
        rc = pass(path, R, runs[k].mode, rows, n, &rate, &bpr);
        if (!rc)
            printf("  %-26s %10.0f rows/s  %9.1f us/token  %7.0f B read/row\n", runs[k].name, rate,
                   LAYERS * ROWS_PER_TOKEN / rate * 1e6, bpr);
    }
    free(rows);
    if (!keep)
        unlink(path);
    return rc;
}
