/* concurrent == solo at the engine level: sequences stepped together in one forward call
 * (unequal prompt lengths, prefill of one beside decode of others) give bit-identical logits
 * to each sequence run alone. Also: bad batches are refused with a message.
 * DSV4_TEST_DEVICE=cuda runs it through the CUDA backend (with step recording and replay). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "dsv4.h"

#define NS 4
#define STEPS 6

int main(void)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", CHECK_FIXTURES "/v4/v4-tiny-b");
    dsv4_err err = {0};
    /* DSV4_TEST_DEVICE=cuda (make test-cuda): the same contract through the CUDA backend */
    dsv4_load_opts lo0 = {.device = getenv("DSV4_TEST_DEVICE")};
    dsv4_model *m = dsv4_model_load(dir, &lo0, &err);
    CHECK(m != NULL, "load: %s", err.msg);
    if (!m)
        return check_summary("batch");
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    int V = info.vocab_size;
    const int plen[NS] = {37, 5, 140, 1};
    int32_t *prompt[NS], gen[NS][STEPS];
    float *solo[NS];
    /* solo: prefill, then STEPS greedy decode steps; keep every step's logits */
    for (int i = 0; i < NS; i++) {
        prompt[i] = malloc(plen[i] * sizeof(int32_t));
        for (int j = 0; j < plen[i]; j++)
            prompt[i][j] = (int32_t)((j * 131 + i * 17 + 3) % V);
        solo[i] = malloc((size_t)(STEPS + 1) * V * sizeof(float));
        dsv4_seq *s = dsv4_seq_new(m, &err);
        const int32_t *p = prompt[i];
        int n = plen[i];
        dsv4_batch b = {.n_seqs = 1, .seqs = &s, .ids = &p, .n_ids = &n, .all_logits = 0, .logits = solo[i]};
        CHECK(!dsv4_forward(m, &b, &err), "solo prefill: %s", err.msg);
        for (int t = 0; t < STEPS; t++) {
            const float *lg = solo[i] + (size_t)t * V;
            int best = 0;
            for (int v = 1; v < V; v++)
                if (lg[v] > lg[best])
                    best = v;
            gen[i][t] = best;
            const int32_t *q = &gen[i][t];
            int one = 1;
            dsv4_batch d = {.n_seqs = 1, .seqs = &s, .ids = &q, .n_ids = &one, .all_logits = 0,
                            .logits = solo[i] + (size_t)(t + 1) * V};
            CHECK(!dsv4_forward(m, &d, &err), "solo decode: %s", err.msg);
        }
        dsv4_seq_free(s);
    }
    /* together: sequence i joins at step i (its prefill beside the others' decode steps) */
    dsv4_seq *seqs[NS];
    int step[NS];
    float *lg = malloc((size_t)NS * V * sizeof(float));
    for (int i = 0; i < NS; i++) {
        seqs[i] = dsv4_seq_new(m, &err);
        step[i] = -1;
    }
    int mism = 0;
    for (int round = 0; round < NS + STEPS; round++) {
        dsv4_seq *bs[NS];
        const int32_t *bi[NS];
        int bn[NS], who[NS], k = 0;
        for (int i = 0; i < NS; i++) {
            if (round < i || step[i] >= STEPS)
                continue;
            bs[k] = seqs[i];
            if (step[i] < 0) {
                bi[k] = prompt[i];
                bn[k] = plen[i];
            } else {
                bi[k] = &gen[i][step[i]];
                bn[k] = 1;
            }
            who[k++] = i;
        }
        if (!k)
            break;
        dsv4_batch b = {.n_seqs = k, .seqs = bs, .ids = bi, .n_ids = bn, .all_logits = 0, .logits = lg};
        CHECK(!dsv4_forward(m, &b, &err), "batched step: %s", err.msg);
        for (int j = 0; j < k; j++) {
            int i = who[j];
            step[i]++;
            if (memcmp(lg + (size_t)j * V, solo[i] + (size_t)step[i] * V, V * sizeof(float)))
                mism++;
        }
    }
    CHECK(mism == 0, "%d batched rows differ from the same sequence run alone", mism);
    printf("  %d sequences, joining one per step, %d decode steps each: batched == solo %s\n", NS, STEPS,
           mism ? "FAILED" : "bit for bit");

    /* refused batches */
    int one = 1, bad = V + 5;
    const int32_t *pb = &bad;
    dsv4_batch b1 = {.n_seqs = 1, .seqs = &seqs[0], .ids = &pb, .n_ids = &one};
    CHECK(dsv4_forward(m, &b1, &err) && strstr(err.msg, "outside the vocabulary"), "bad id: %s", err.msg);
    dsv4_seq *twice[2] = {seqs[0], seqs[0]};
    const int32_t *pp[2] = {gen[0], gen[0]};
    int nn[2] = {1, 1};
    dsv4_batch b2 = {.n_seqs = 2, .seqs = twice, .ids = pp, .n_ids = nn};
    CHECK(dsv4_forward(m, &b2, &err) && strstr(err.msg, "same sequence"), "same sequence twice: %s", err.msg);
    int64_t before = dsv4_seq_len(seqs[1]);
    CHECK(dsv4_seq_truncate(seqs[1], before + 1, &err) != 0, "truncate beyond the length must fail");
    /* rollback is bounded by max_rollback; past it the caller must restore a saved state */
    dsv4_load_opts lo = {.max_rollback = 8, .device = getenv("DSV4_TEST_DEVICE")};
    dsv4_model *m8 = dsv4_model_load(dir, &lo, &err);
    dsv4_seq *s8 = m8 ? dsv4_seq_new(m8, &err) : NULL;
    if (s8) {
        const int32_t *p = prompt[2];
        int n = plen[2];
        dsv4_batch b = {.n_seqs = 1, .seqs = &s8, .ids = &p, .n_ids = &n};
        dsv4_forward(m8, &b, &err);
        CHECK(!dsv4_seq_truncate(s8, n - 8, &err), "rollback by max_rollback: %s", err.msg);
        CHECK(dsv4_seq_truncate(s8, n - 9, &err) == DSV4_E_STATE && strstr(err.msg, "restore"), "rollback past it: %s", err.msg);
    }
    dsv4_seq_free(s8);
    dsv4_model_free(m8);
    for (int i = 0; i < NS; i++) {
        dsv4_seq_free(seqs[i]);
        free(prompt[i]);
        free(solo[i]);
    }
    free(lg);
    dsv4_model_free(m);
    return check_summary("batch");
}
