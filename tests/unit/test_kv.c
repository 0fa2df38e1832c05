/* Production KV caches (--kv production, docs/kv.md) on every fixture, against exact (fp32)
 * caches: the KL divergence of the next-token distribution and the top-1 agreement at every
 * position of every case, printed with the exact logits' top-two gap where they disagree. The
 * 99% top-1 goal is checked on the trained model (models/mini with its oracle's cases); on the
 * random-weight fixtures (flat next-token distributions over unstructured activations) the
 * 4-bit entries move logits by up to about one, so there the figures are printed, not gated
 * (docs/kv.md has them). V4.1 in REF numerics already rounds its
 * caches as the formats store them: production == exact there, bit for bit. Then, with
 * production caches: prefill == decode bit for bit, the seams (chunked prefill, copy,
 * save/restore == fresh, rollback == uninterrupted), concurrent == solo, and the state's size
 * and admission arithmetic. Saved bytes do not cross formats. DSV4_TEST_DEVICE=cuda runs it all
 * through the CUDA backend. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "core/core.h"
#include "fixtures.h"
#include "model/model.h"

/* KL(p_exact || p_prod) of one position's logits, in nats. */
static double kl_of(const float *e, const float *p, int V)
{
    double me = -INFINITY, mp = -INFINITY, se = 0, sp = 0, kl = 0;
    for (int v = 0; v < V; v++) {
        me = fmax(me, e[v]);
        mp = fmax(mp, p[v]);
    }
    for (int v = 0; v < V; v++) {
        se += exp(e[v] - me);
        sp += exp(p[v] - mp);
    }
    for (int v = 0; v < V; v++) {
        double le = e[v] - me - log(se), lp = p[v] - mp - log(sp);
        kl += exp(le) * (le - lp);
    }
    return kl;
}

static int argmax(const float *x, int V)
{
    int b = 0;
    for (int v = 1; v < V; v++)
        if (x[v] > x[b])
            b = v;
    return b;
}

/* Every sequence stepped together (each joins one round after the previous, prefill beside the
 * others' decode steps) gives each sequence's solo logits bit for bit. */
static void concurrent_check(dsv4_model *m, const char *name, int32_t *const *ids, const int *T, int n, int V)
{
    dsv4_err err = {0};
    float *solo[8], *lg = malloc((size_t)8 * V * sizeof(float));
    dsv4_seq *seqs[8];
    int done[8], mism = 0;
    for (int k = 0; k < n; k++) {
        solo[k] = malloc((size_t)T[k] * V * sizeof(float));
        run_decode(m, ids[k], T[k], T[k] / 2, solo[k], V);
        seqs[k] = dsv4_seq_new(m, &err);
        done[k] = 0;
    }
    for (int round = 0;; round++) {
        dsv4_seq *bs[8];
        const int32_t *bi[8];
        int bn[8], who[8], nb = 0;
        for (int k = 0; k < n; k++)
            if (round >= k && done[k] < T[k]) {
                bs[nb] = seqs[k];
                bi[nb] = ids[k] + done[k];
                bn[nb] = done[k] ? 1 : T[k] / 2 > 0 ? T[k] / 2 : 1;
                who[nb++] = k;
            }
        if (!nb && round >= n)
            break;
        if (!nb)
            continue;
        dsv4_batch b = {.n_seqs = nb, .seqs = bs, .ids = bi, .n_ids = bn, .all_logits = 0, .logits = lg};
        CHECK(!dsv4_forward(m, &b, &err), "%s: batched step: %s", name, err.msg);
        for (int j = 0; j < nb; j++) {
            int k = who[j];
            done[k] += bn[j];
            mism += memcmp(lg + (size_t)j * V, solo[k] + (size_t)(done[k] - 1) * V, V * sizeof(float)) != 0;
        }
    }
    CHECK(mism == 0, "%s: %d batched rows differ from the sequence run alone (production caches)", name, mism);
    printf("  concurrent == solo (%d sequences, production caches): %s\n", n, mism ? "FAILED" : "bit for bit");
    for (int k = 0; k < n; k++) {
        free(solo[k]);
        dsv4_seq_free(seqs[k]);
    }
    free(lg);
}

/* State size and admission: seq_bytes_at is what a sequence reports; fit never admits more than the budget. */
static void size_check(dsv4_model *mx, dsv4_model *mp, const char *name, const int32_t *ids, int T)
{
    dsv4_err err = {0};
    dsv4_model *ms[2] = {mx, mp};
    for (int k = 0; k < 2; k++) {
        dsv4_seq *s = dsv4_seq_new(ms[k], &err);
        dsv4_batch b = {.n_seqs = 1, .seqs = &s, .ids = &ids, .n_ids = &T};
        dsv4_forward(ms[k], &b, &err);
        CHECK(dsv4_seq_bytes(s) == dsv4_seq_bytes_at(ms[k], T), "%s %s: seq_bytes %zu, seq_bytes_at %zu", name,
              dsv4_model_kv(ms[k]), dsv4_seq_bytes(s), dsv4_seq_bytes_at(ms[k], T));
        dsv4_seq_free(s);
        /* the benchmark's synthetic depth: the state of n tokens, and a step on it reads finite rows */
        dsv4_seq *f = dsv4_seq_new(ms[k], &err);
        int one = 1;
        float *lg = malloc(sizeof(float) * 200000);
        dsv4_batch bf = {.n_seqs = 1, .seqs = &f, .ids = &ids, .n_ids = &one, .logits = lg};
        CHECK(!dsv4_seq_fill_synthetic(f, 1000, 7, &err) && dsv4_seq_len(f) == 1000 &&
                  dsv4_seq_bytes(f) == dsv4_seq_bytes_at(ms[k], 1000) && !dsv4_forward(ms[k], &bf, &err) && isfinite(lg[0]),
              "%s %s: a synthetic state of 1000 tokens: %s", name, dsv4_model_kv(ms[k]), err.msg);
        free(lg);
        dsv4_seq_free(f);
        size_t budget = dsv4_seq_bytes_at(ms[k], 4096) * 3;
        int64_t fit = dsv4_kv_fit(ms[k], 3, budget);
        CHECK(fit >= 1 && dsv4_kv_fit(ms[k], 4, budget) <= fit && dsv4_kv_fit(ms[k], 3, 1000) == 0,
              "%s %s: admission for 3 lanes %lld tokens", name, dsv4_model_kv(ms[k]), (long long)fit);
        /* where the state lives in device memory, admission can ask how much of it is free */
        const char *dev = getenv("DSV4_TEST_DEVICE");
        size_t room = dsv4_model_state_room(ms[k]);
        CHECK(dev && !strcmp(dev, "cuda") ? room > dsv4_seq_bytes_at(ms[k], 4096) : room == 0,
              "%s %s: state room %zu bytes on %s", name, dsv4_model_kv(ms[k]), room, dev ? dev : "cpu");
    }
    double px = (double)(dsv4_seq_bytes_at(mx, 1 << 20) - dsv4_seq_bytes_at(mx, 0)) / (1 << 20),
           pp = (double)(dsv4_seq_bytes_at(mp, 1 << 20) - dsv4_seq_bytes_at(mp, 0)) / (1 << 20);
    CHECK(pp < px / 4, "%s: production state grows %.1f B/token, exact %.1f", name, pp, px);
    printf("  state growth: exact %.1f B/token, production %.1f B/token\n", px, pp);
}

/* Bytes saved in one format are refused by the other, with a message saying so. */
static void cross_check(dsv4_model *mx, dsv4_model *mp, const char *name)
{
    dsv4_err err = {0};
    dsv4_seq *a = dsv4_seq_new(mx, &err), *b = dsv4_seq_new(mp, &err);
    void *buf;
    size_t len;
    dsv4_seq_save(a, &buf, &len, &err);
    CHECK(dsv4_seq_restore(b, buf, len, &err) == DSV4_E_ARG && strstr(err.msg, "exact KV caches"),
          "%s: exact bytes into a production sequence: %s", name, err.msg);
    memcpy(buf, "DSV4SEQ1", 8);
    CHECK(dsv4_seq_restore(a, buf, len, &err) == DSV4_E_ARG && strstr(err.msg, "version 1"), "%s: version 1 bytes: %s", name,
          err.msg);
    free(buf);
    dsv4_seq_free(a);
    dsv4_seq_free(b);
}

typedef struct { const char *dir, *cases; dsv4_numerics numerics; int gate; } fixture;

static double gap_of(const float *x, int V)
{
    int a = argmax(x, V);
    double g = INFINITY;
    for (int v = 0; v < V; v++)
        if (v != a)
            g = fmin(g, (double)x[a] - x[v]);
    return g;
}

int main(void)
{
    (void)compare; /* fixtures.h's oracle comparison: this test compares two runs of its own */
    const fixture fx[] = {{"models/mini", CHECK_FIXTURES "/mini/cases.json", 0, 1},
                          {CHECK_FIXTURES "/v4/v4-tiny-a", NULL, 0, 0},
                          {CHECK_FIXTURES "/v4/v4-tiny-b", NULL, 0, 0},
                          {CHECK_FIXTURES "/v4/v4-tiny-v", NULL, 0, 0},
                          {CHECK_FIXTURES "/v4/v4-held-1", NULL, 0, 0},
                          {CHECK_FIXTURES "/v4/v4-held-2", NULL, 0, 0},
                          {CHECK_FIXTURES "/v41/v41-tiny-a", NULL, DSV4_NUMERICS_REF, 2},
                          {CHECK_FIXTURES "/v41/v41-tiny-a", NULL, DSV4_NUMERICS_FP32, 0}};
    for (size_t fi = 0; fi < sizeof fx / sizeof fx[0]; fi++) {
        char dir[512], path[600], name[96];
        snprintf(dir, sizeof dir, "%s", fx[fi].dir);
        snprintf(name, sizeof name, "%s%s", strrchr(fx[fi].dir, '/') + 1,
                 fx[fi].numerics == DSV4_NUMERICS_REF ? " (ref)" : fx[fi].numerics ? " (fp32)" : "");
        printf("%s\n", name);
        dsv4_err err = {0};
        /* DSV4_TEST_DEVICE=cuda (make test-cuda): the same comparisons and contracts through the CUDA backend */
        const char *dev = getenv("DSV4_TEST_DEVICE");
        dsv4_load_opts lx = {.numerics = fx[fi].numerics, .kv = DSV4_KV_EXACT, .device = dev};
        dsv4_load_opts lp = {.numerics = fx[fi].numerics, .kv = DSV4_KV_PRODUCTION, .device = dev};
        dsv4_model *mx = dsv4_model_load(dir, &lx, &err), *mp = mx ? dsv4_model_load(dir, &lp, &err) : NULL;
        CHECK(mx && mp, "%s: load: %s", name, err.msg);
        if (!mx || !mp) {
            dsv4_model_free(mx);
            continue;
        }
        CHECK(!strcmp(dsv4_model_kv(mx), "exact") && !strcmp(dsv4_model_kv(mp), "production"), "%s: kv names", name);
        if (fx[fi].cases)
            snprintf(path, sizeof path, "%s", fx[fi].cases);
        else
            snprintf(path, sizeof path, "%s/cases.json", dir);
        char *txt = slurp(path);
        cJSON *j = txt ? cJSON_Parse(txt) : NULL;
        CHECK(j != NULL, "%s: cases.json", name);
        dsv4_model_info info;
        dsv4_model_get_info(mx, &info);
        int V = info.vocab_size, ci = 0, agree = 0, total = 0;
        double kl_sum = 0, kl_max = 0, gap_bad = 0;
        int identical = 1;
        int32_t *keep[8];
        int keepT[8], nkeep = 0;
        for (cJSON *cs = j ? cJSON_GetObjectItem(j, "cases")->child : NULL; cs; cs = cs->next, ci++) {
            cJSON *jid = cJSON_GetObjectItem(cs, "ids");
            int T = cJSON_GetArraySize(jid), P = cJSON_GetObjectItem(cs, "prefill")->valueint;
            int32_t *ids = malloc(T * sizeof *ids);
            for (int i = 0; i < T; i++)
                ids[i] = cJSON_GetArrayItem(jid, i)->valueint;
            float *ex = malloc((size_t)T * V * sizeof(float)), *pr = malloc((size_t)T * V * sizeof(float)),
                  *pd = malloc((size_t)T * V * sizeof(float));
            CHECK(!run_chunks(mx, ids, T, 0, ex, V) && !run_chunks(mp, ids, T, 0, pr, V) && !run_decode(mp, ids, T, P, pd, V),
                  "%s case%d: forward failed", name, ci);
            CHECK(!memcmp(pr, pd, (size_t)T * V * sizeof(float)), "%s case%d: production prefill != prefill %d + decode", name,
                  ci, P);
            for (int t = 0; t < T; t++) {
                double kl = kl_of(ex + (size_t)t * V, pr + (size_t)t * V, V);
                kl_sum += kl;
                kl_max = fmax(kl_max, kl);
                int same = argmax(ex + (size_t)t * V, V) == argmax(pr + (size_t)t * V, V);
                agree += same;
                if (!same)
                    gap_bad = fmax(gap_bad, gap_of(ex + (size_t)t * V, V));
                total++;
            }
            if (ci == 0) {
                char what[160];
                snprintf(what, sizeof what, "%s case0 (production caches)", name);
                static const int chunks[] = {1, 3, 7};
                seams(mp, what, ids, T, V, chunks, 3);
                size_check(mx, mp, name, ids, T);
            }
            identical &= !memcmp(ex, pr, (size_t)T * V * sizeof(float));
            free(ex);
            free(pr);
            free(pd);
            if (nkeep < 3) {
                keep[nkeep] = ids;
                keepT[nkeep++] = T;
            } else
                free(ids);
        }
        printf("  production vs exact caches: %d positions, top-1 agreement %d/%d (%.2f%%), KL mean %.3g max %.3g nats; "
               "largest exact top-two gap where they differ %.3g\n",
               total, agree, total, 100.0 * agree / (total ? total : 1), kl_sum / (total ? total : 1), kl_max, gap_bad);
        CHECK(total > 0, "%s: no positions", name);
        if (fx[fi].gate)
            CHECK(agree >= 0.99 * total, "%s: top-1 agreement %d/%d is under 99%%", name, agree, total);
        if (fx[fi].gate == 2)
            CHECK(identical, "%s: production caches differ from REF's exact ones (which round the same way)", name);
        if (nkeep)
            concurrent_check(mp, name, keep, keepT, nkeep, V);
        cross_check(mx, mp, name);
        for (int k = 0; k < nkeep; k++)
            free(keep[k]);
        cJSON_Delete(j);
        free(txt);
        dsv4_model_free(mx);
        dsv4_model_free(mp);
    }
    return check_summary("test_kv");
}
