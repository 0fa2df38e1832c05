/* Helpers shared by the fixture tests: run a sequence by chunks or by decode steps, compare
 * logits with the tight gate, and check the seams (chunking, copy, save/restore, rollback). */
#ifndef DSV4_TEST_FIXTURES_H
#define DSV4_TEST_FIXTURES_H
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "core/core.h"
#include "dsv4.h"

static char *slurp(const char *path) { return dsv4_read_file(path, NULL, NULL); }

/* Runs ids through a fresh sequence in chunks of `chunk` (0: all at once), all logits. */
static int run_chunks(dsv4_model *m, const int32_t *ids, int T, int chunk, float *out, int V)
{
    dsv4_err err = {0};
    dsv4_seq *s = dsv4_seq_new(m, &err);
    int done = 0, rc = 0;
    while (done < T && !rc) {
        int n = chunk ? (T - done < chunk ? T - done : chunk) : T;
        const int32_t *p = ids + done;
        dsv4_batch b = {.n_seqs = 1, .seqs = &s, .ids = &p, .n_ids = &n, .all_logits = 1, .logits = out + (size_t)done * V};
        rc = dsv4_forward(m, &b, &err);
        if (rc)
            fprintf(stderr, "forward: %s\n", err.msg);
        done += n;
    }
    dsv4_seq_free(s);
    return rc;
}

/* Prefill P tokens, then one token per step. */
static int run_decode(dsv4_model *m, const int32_t *ids, int T, int P, float *out, int V)
{
    dsv4_err err = {0};
    dsv4_seq *s = dsv4_seq_new(m, &err);
    int rc = 0, done = 0;
    while (done < T && !rc) {
        int n = done == 0 ? (P > 0 ? P : 1) : 1;
        const int32_t *p = ids + done;
        dsv4_batch b = {.n_seqs = 1, .seqs = &s, .ids = &p, .n_ids = &n, .all_logits = 1, .logits = out + (size_t)done * V};
        rc = dsv4_forward(m, &b, &err);
        done += n;
    }
    dsv4_seq_free(s);
    return rc;
}

static void compare(const char *what, const float *got, const float *ref, int T, int V)
{
    double mref = 0, md = 0;
    int arg_bad = 0, gated = 0, worst = -1;
    for (size_t i = 0; i < (size_t)T * V; i++)
        mref = fmax(mref, fabs(ref[i]));
    for (int t = 0; t < T; t++) {
        const float *g = got + (size_t)t * V, *r = ref + (size_t)t * V;
        int ag = 0, ar = 0;
        float r1 = -INFINITY, r2 = -INFINITY;
        for (int v = 0; v < V; v++) {
            double dd = fabs((double)g[v] - r[v]);
            if (!(dd <= md)) {
                md = dd;
                worst = t;
            }
            if (g[v] > g[ag])
                ag = v;
            if (r[v] > r1) {
                r2 = r1;
                r1 = r[v];
                ar = v;
            } else if (r[v] > r2)
                r2 = r[v];
        }
        if (r1 - r2 > 1e-3) {
            gated++;
            arg_bad += ag != ar;
        }
    }
    CHECK(md <= 1e-4 * mref, "%s: max|diff| %.3g > 1e-4 * max|ref| (%.3g), worst at position %d", what, md, 1e-4 * mref, worst);
    CHECK(arg_bad == 0, "%s: argmax differs at %d of %d gated positions", what, arg_bad, gated);
    printf("  %-40s max|diff| %.2e (bound %.2e)  argmax ok %d/%d\n", what, md, 1e-4 * mref, gated - arg_bad, gated);
}

static void seams(dsv4_model *m, const char *name, const int32_t *ids, int T, int V, const int *chunks, int n_chunks)
{
    float *ref = malloc((size_t)T * V * sizeof(float)), *got = malloc((size_t)T * V * sizeof(float));
    run_chunks(m, ids, T, 0, ref, V);
    for (int i = 0; i < n_chunks; i++) {
        run_chunks(m, ids, T, chunks[i], got, V);
        CHECK(!memcmp(ref, got, (size_t)T * V * sizeof(float)), "%s: chunks of %d differ from one prefill", name, chunks[i]);
    }
    /* copy, save/restore and rollback at the middle of the sequence */
    dsv4_err err = {0};
    int h = T / 2, rest = T - h;
    const int32_t *p0 = ids, *p1 = ids + h;
    dsv4_seq *s = dsv4_seq_new(m, &err);
    dsv4_batch b = {.n_seqs = 1, .seqs = &s, .ids = &p0, .n_ids = &h, .all_logits = 1, .logits = got};
    dsv4_forward(m, &b, &err);
    void *buf;
    size_t len;
    CHECK(!dsv4_seq_save(s, &buf, &len, &err), "%s: save: %s", name, err.msg);
    dsv4_seq *cp = dsv4_seq_copy(s, &err);
    /* advance the original past the midpoint with other tokens, then roll back */
    int junk = rest < 5 ? rest : 5;
    dsv4_batch bj = {.n_seqs = 1, .seqs = &s, .ids = &p1, .n_ids = &junk, .all_logits = 0, .logits = NULL};
    int32_t *alt = malloc(junk * sizeof *alt);
    for (int i = 0; i < junk; i++)
        alt[i] = (ids[h + i] + 7) % V;
    const int32_t *pa = alt;
    bj.ids = &pa;
    dsv4_forward(m, &bj, &err);
    CHECK(!dsv4_seq_truncate(s, h, &err), "%s: truncate: %s", name, err.msg);
    dsv4_seq *rs = dsv4_seq_new(m, &err);
    CHECK(!dsv4_seq_restore(rs, buf, len, &err), "%s: restore: %s", name, err.msg);
    dsv4_seq *which[3] = {s, cp, rs};
    const char *wn[3] = {"rollback", "copy", "restore"};
    for (int k = 0; k < 3; k++) {
        dsv4_batch bb = {.n_seqs = 1, .seqs = &which[k], .ids = &p1, .n_ids = &rest, .all_logits = 1,
                         .logits = got + (size_t)h * V};
        dsv4_forward(m, &bb, &err);
        CHECK(!memcmp(ref + (size_t)h * V, got + (size_t)h * V, (size_t)rest * V * sizeof(float)),
              "%s: %s then continue differs from an uninterrupted run", name, wn[k]);
    }
    free(alt);
    free(buf);
    dsv4_seq_free(s);
    dsv4_seq_free(cp);
    dsv4_seq_free(rs);
    free(ref);
    free(got);
}

/* REF against exact (fp32) on the same case, teacher-forced: per position the KL divergence of
 * REF's next-token distribution from fp32's, KL(fp32 || ref) in nats, and whether the top-1
 * tokens agree (the count is returned). A measurement, not a gate (docs/numerics.md records
 * it). */
static inline int kl_report(const char *what, const float *exact, const float *ref, int T, int V)
{
    double kl_sum = 0, kl_max = 0;
    int agree = 0;
    for (int t = 0; t < T; t++) {
        const float *a = exact + (size_t)t * V, *b = ref + (size_t)t * V;
        double ma = a[0], mb = b[0], za = 0, zb = 0, kl = 0;
        int ta = 0, tb = 0;
        for (int v = 1; v < V; v++) {
            if (a[v] > a[ta])
                ta = v;
            if (b[v] > b[tb])
                tb = v;
        }
        ma = a[ta], mb = b[tb];
        for (int v = 0; v < V; v++)
            za += exp((double)a[v] - ma), zb += exp((double)b[v] - mb);
        for (int v = 0; v < V; v++) { /* p log p/q with log p = a - ma - log za */
            double la = a[v] - ma - log(za), lb = b[v] - mb - log(zb);
            kl += exp(la) * (la - lb);
        }
        kl_sum += kl;
        kl_max = kl > kl_max ? kl : kl_max;
        agree += ta == tb;
    }
    CHECK(isfinite(kl_sum), "%s: KL is not finite", what);
    printf("  %-40s KL(fp32 || ref) mean %.3g max %.3g nats, top-1 %d/%d\n", what, kl_sum / T, kl_max, agree, T);
    return agree;
}

#endif
