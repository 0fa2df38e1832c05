/* Engram pieces at the released model's sizes and on synthetic tables:
 * - layout and multipliers for V4.1-Flash (engram layers 1 and 14, 2..4-grams, 8 heads,
 *   prime search from 16,000,000, compressed vocab 99,092) against the values in the spec
 *   (numpy's default_rng(10007 * layer) draw; the table sizes are the config's);
 * - a table read streamed (pread, O_DIRECT where allowed) equals the resident read bit for bit;
 * - a table whose recorded checksum does not match is refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "core/core.h"
#include "model/engram.h"

static void released_layout(void)
{
    int64_t p[48], rows[2] = {0, 0};
    dsv4_engram_primes(2, 4, 8, 16000000, p);
    for (int i = 0; i < 48; i++)
        rows[i / 24] += p[i];
    CHECK(rows[0] == 384006168 && rows[1] == 384016682, "table rows %lld / %lld, config says 384006168 / 384016682",
          (long long)rows[0], (long long)rows[1]);
    CHECK(p[0] == 16000057 && p[23] == 16000463 && p[24] == 16000477 && p[47] == 16000889, "primes %lld %lld %lld %lld",
          (long long)p[0], (long long)p[23], (long long)p[24], (long long)p[47]);
    static const int64_t want[2][4] = {{76632096046245, 4839876093313, 35959672319349, 73987337458391},
                                       {67716810739261, 51510806800915, 30921347202721, 82619226485591}};
    int layers[2] = {1, 14};
    for (int l = 0; l < 2; l++) {
        int64_t m[4];
        CHECK(!dsv4_engram_multipliers(layers[l], 99092, 4, m), "multipliers of layer %d", layers[l]);
        CHECK(!memcmp(m, want[l], sizeof m), "layer %d multipliers %lld %lld %lld %lld", layers[l], (long long)m[0],
              (long long)m[1], (long long)m[2], (long long)m[3]);
    }
}

static void streamed_table(const char *path)
{
    dsv4_err err = {0};
    int64_t R = 5000;
    int hd = 64;
    CHECK(!dsv4_etable_synth(path, "layers.0.engram.embed", R, hd, 7, 1, &err), "synth: %s", err.msg);
    dsv4_st *st = dsv4_st_open_file(path, &err);
    CHECK(st != NULL, "open: %s", err.msg);
    if (!st)
        return;
    dsv4_etable res, str;
    CHECK(!dsv4_etable_open(&res, st, "layers.0.engram.embed", R, hd, 0, 0, &err), "resident: %s", err.msg);
    CHECK(!dsv4_etable_open(&str, st, "layers.0.engram.embed", R, hd, 1, 1, &err), "streamed: %s", err.msg);
    int n = 300;
    int64_t rows[300];
    uint64_t s = 1;
    for (int i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        rows[i] = (int64_t)((s >> 33) % (uint64_t)R);
    }
    rows[0] = 0;
    rows[1] = R - 1; /* the first and last rows: the ends of both tensors */
    float *a = malloc((size_t)n * hd * sizeof(float)), *b = malloc((size_t)n * hd * sizeof(float));
    uint64_t ba = 0, bb = 0;
    CHECK(!dsv4_etable_rows(&res, rows, n, a, &ba, &err), "resident rows: %s", err.msg);
    CHECK(!dsv4_etable_rows(&str, rows, n, b, &bb, &err), "streamed rows: %s", err.msg);
    CHECK(!memcmp(a, b, (size_t)n * hd * sizeof(float)), "streamed rows differ from resident rows");
    CHECK(ba == (uint64_t)n * (hd + hd / 32) && bb >= ba, "bytes: resident %llu, streamed %llu", (unsigned long long)ba,
          (unsigned long long)bb);
    int64_t bad = R;
    CHECK(dsv4_etable_rows(&str, &bad, 1, a, &bb, &err) == DSV4_E_STATE, "a row past the table must be refused");
    dsv4_etable_close(&str);
    free(a);
    free(b);
    dsv4_st_close(st);

    CHECK(!dsv4_etable_synth(path, "layers.0.engram.embed", R, hd, 7, 2, &err), "synth: %s", err.msg);
    st = dsv4_st_open_file(path, &err);
    dsv4_etable t;
    int rc = st ? dsv4_etable_open(&t, st, "layers.0.engram.embed", R, hd, 0, 0, &err) : -1;
    CHECK(rc == DSV4_E_MODEL && strstr(err.msg, "checksum"), "a wrong recorded checksum must be refused (rc %d: %s)", rc, err.msg);
    dsv4_st_close(st);
}

int main(void)
{
    released_layout();
    char path[] = "/tmp/dsv4_engram_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd >= 0) {
        close(fd);
        streamed_table(path);
        unlink(path);
    }
    return check_summary("engram");
}
