/* The synthetic V4.1 presets (model/synth.c). No oracle: random weights; the checks are the
 * shapes and the contracts.
 *  - v4.1-flash's config (nothing built): the release's shapes, and at 40 layers its CSA2
 *    roles, Engram layers, table layout and DSpark targets; fewer layers keep every role;
 *  - v4.1-tiny (the same structure at width 64) loads with the roles of the layers it keeps;
 *  - decode == prefill bit for bit on it, and the Engram layers run: every token gathers its
 *    rows, and tables of another size (other rows) change the logits;
 *  - streamed tables (written to a file, read by row) give the resident tables' logits bit
 *    for bit;
 *  - the DSpark stages exist and draft: drafted == plain through the verify step, ids and
 *    logprobs bit for bit, greedy and seeded. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "core/core.h"
#include "dsv4.h"
#include "io/config.h"
#include "model/diag.h"
#include "serve/draft.h"
#include "serve/sampler.h"

#define T 24       /* prompt tokens */
#define P 17       /* prefilled before the decode steps */
#define N_GEN 12

static dsv4_model *load(int layers, int64_t rows, int tables, int draft)
{
    dsv4_err err = {0};
    dsv4_load_opts o = {0};
    o.engram_tables = tables;
    o.draft_stages = draft;
    dsv4_synth_opts so = {.n_layers = layers, .engram_rows = rows};
    dsv4_model *m = dsv4_model_synthetic_ext("v4.1-tiny", &so, &o, &err);
    CHECK(m, "v4.1-tiny, %d layers, %lld rows: %s", layers, (long long)rows, err.msg);
    return m;
}

static const int32_t prompt[T] = {0, 9, 31, 31, 7, 128000, 4000, 4000, 4000, 17, 99091, 99092, 2, 65, 66, 67,
                                  9, 31, 31, 7, 5, 129279, 11, 12};

static int has(const int *v, int n, int x)
{
    for (int i = 0; i < n; i++)
        if (v[i] == x)
            return 1;
    return 0;
}

static void check_flash_config(void)
{
    static char buf[8192];
    dsv4_err err = {0};
    dsv4_config c;
    CHECK(!dsv4_synthetic_config("v4.1-flash", 40, 0, buf, sizeof buf, &err) &&
          !dsv4_config_parse(buf, "v4.1-flash", &c, &err), "v4.1-flash config: %s", err.msg);
    CHECK(c.family == DSV4_FAMILY_V41 && c.vocab == 129280 && c.dim == 5120 && c.n_layers == 40 && c.n_heads == 64 &&
          c.head_dim == 512 && c.rope_dim == 64 && c.q_lora == 1280 && c.o_groups == 8 && c.o_lora == 1024 &&
          c.window == 128, "v4.1-flash: attention shapes");
    CHECK(c.n_experts == 384 && c.n_active == 6 && c.n_shared == 1 && c.moe_inter == 2304 && c.index_heads == 32 &&
          c.index_dim == 128 && c.index_topk == 512 && c.candidate_topk_blocks == 2048 && c.candidate_block_size == 8,
          "v4.1-flash: experts and indexer");
    int ratios_ok = 1;
    for (int i = 0; i < 40; i++)
        ratios_ok &= c.ratio[i] == (i < 2 ? 0 : i < 20 ? 2 : 1);
    CHECK(ratios_ok, "v4.1-flash: compress ratios [0,0] + [2]*18 + [1]*20");
    static const int kv[] = {2, 8, 14, 20}, ix[] = {2, 8, 14, 20, 24, 28, 32, 36};
    CHECK(c.n_kv_source == 4 && !memcmp(c.kv_source, kv, sizeof kv) && c.n_index_source == 8 &&
          !memcmp(c.index_source, ix, sizeof ix) && c.candidate_source == 20, "v4.1-flash: CSA2 sources");
    CHECK(c.n_engram == 2 && c.engram_layer[0] == 1 && c.engram_layer[1] == 14 && c.engram_heads == 8 &&
          c.engram_head_dim == 256 && c.engram_max_ngram == 4 && c.engram_compressed_vocab == 99092 &&
          c.engram_rows[0] >= (1 << 22) && c.engram_rows[0] < (1 << 22) + 24 * 2000 && c.engram_rows[1] > c.engram_rows[0],
          "v4.1-flash: Engram layers and tables (%lld, %lld rows)", (long long)c.engram_rows[0], (long long)c.engram_rows[1]);
    CHECK(c.n_mtp == 3 && c.spec_block == 5 && c.spec_noise == 128799 && c.spec_markov_rank == 256 &&
          c.spec_experts == 128 && c.spec_active == 3 && c.n_spec_target == 3 && c.spec_target[0] == 37 &&
          c.spec_target[1] == 38 && c.spec_target[2] == 39, "v4.1-flash: DSpark stages and targets");
    /* fewer layers: release layers 1, 14, 20, 24 first, each with its role */
    CHECK(!dsv4_synthetic_config("v4.1-flash", 4, 1000000, buf, sizeof buf, &err) && !dsv4_config_parse(buf, "v4.1-flash/4", &c, &err),
          "v4.1-flash/4 config: %s", err.msg);
    CHECK(c.n_layers == 4 && c.ratio[0] == 0 && c.ratio[1] == 2 && c.ratio[2] == 1 && c.ratio[3] == 1 && c.n_kv_source == 2 &&
          c.kv_source[0] == 1 && c.kv_source[1] == 2 && c.n_index_source == 3 && has(c.index_source, 3, 3) &&
          c.candidate_source == 2 && c.n_engram == 2 && c.engram_layer[0] == 0 && c.engram_layer[1] == 1 &&
          c.engram_rows[0] >= 1000000 && c.engram_rows[0] < 1100000 && c.spec_target[0] == 1 && c.spec_target[2] == 3,
          "v4.1-flash/4: layers 1, 14, 20, 24 of the release with their roles");
    CHECK(dsv4_synthetic_config("v4.1-flash", 41, 0, buf, sizeof buf, &err) == DSV4_E_ARG, "41 layers refused");
    CHECK(dsv4_synthetic_config("v4.1-flash", 2, 3, buf, sizeof buf, &err) == DSV4_E_ARG, "3 Engram rows refused");
    printf("  v4.1-flash config: the release's shapes, roles, Engram and DSpark at 40 layers; 4 layers keep every role\n");
}

static void check_roles(dsv4_model *m)
{
    char *txt = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&txt, &n);
    dsv4_model_print_info(m, f);
    fclose(f);
    CHECK(txt && strstr(txt, "layers    0:engram+SWA 1:engram+r2+kv+idx 2:r2 3:r1+kv+idx+cand 4:r1 5:r1+idx"),
          "v4.1-tiny/6 roles: %s", txt ? txt : "");
    free(txt);
}

/* Logits of the prompt: one prefill [T, V] into a, and P + one token a step into b. */
static void run_logits(dsv4_model *m, float *a, float *b, int V)
{
    dsv4_err err = {0};
    dsv4_seq *s = dsv4_seq_new(m, &err);
    const int32_t *p = prompt;
    int n = T;
    dsv4_batch bt = {.n_seqs = 1, .seqs = &s, .ids = &p, .n_ids = &n, .all_logits = 1, .logits = a};
    CHECK(s && !dsv4_forward(m, &bt, &err), "prefill: %s", err.msg);
    dsv4_seq_free(s);
    s = dsv4_seq_new(m, &err);
    n = P;
    bt.seqs = &s;
    bt.logits = b;
    CHECK(s && !dsv4_forward(m, &bt, &err), "prefill %d: %s", P, err.msg);
    for (int t = P; t < T; t++) {
        p = prompt + t;
        n = 1;
        bt.logits = b + (size_t)t * V;
        CHECK(!dsv4_forward(m, &bt, &err), "decode at %d: %s", t, err.msg);
    }
    dsv4_seq_free(s);
}

/* Plain (draft 0) or DSpark-drafted generation through dsv4_draft_step: ids and logprobs. */
static int generate(dsv4_model *m, const dsv4_sample_params *sp, int draft, int32_t *ids, double *lps, int *proposed)
{
    dsv4_err err = {0};
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    int V = info.vocab_size, B = dsv4_spec_block(m), made = 0, rc;
    dsv4_seq *s = dsv4_seq_new(m, &err);
    dsv4_sampler smp;
    int32_t ctx[T + N_GEN];
    memcpy(ctx, prompt, sizeof prompt);
    float *lg = malloc((size_t)(DSV4_DRAFT_MAX + 1) * V * sizeof(float));
    rc = !s || !lg || dsv4_sampler_init(&smp, V, ctx, T, &err);
    int n = T - 1;
    const int32_t *p = ctx;
    dsv4_batch b = {.n_seqs = 1, .seqs = &s, .ids = &p, .n_ids = &n, .logits = lg};
    rc = rc || dsv4_forward(m, &b, &err);
    *proposed = 0;
    while (!rc && made < N_GEN) {
        int32_t blk[DSV4_MAX_SPEC_BLOCK + 1];
        int nd = 0;
        if (draft) {
            if ((rc = dsv4_spec_draft(m, s, ctx[T + made - 1], blk, NULL, NULL, &err)))
                break;
            nd = B;
            *proposed += nd;
        }
        dsv4_sample_out out[DSV4_DRAFT_MAX + 1];
        int got = 0;
        rc = dsv4_draft_step(m, s, &smp, sp, ctx[T + made - 1], blk + 1, nd, -1, N_GEN - made, lg, out, &got, NULL, &err);
        for (int i = 0; i < got && !rc; i++) {
            ids[made] = ctx[T + made] = out[i].id;
            lps[made++] = out[i].logprob;
        }
    }
    CHECK(!rc, "generation (draft %d): %s", draft, err.msg);
    dsv4_sampler_free(&smp);
    dsv4_seq_free(s);
    free(lg);
    return made;
}

static void check_dspark(void)
{
    dsv4_model *m = load(6, 0, DSV4_ENGRAM_RESIDENT, 1);
    if (!m)
        return;
    CHECK(dsv4_spec_block(m) == 5, "v4.1-tiny: a DSpark block of 5, got %d", dsv4_spec_block(m));
    dsv4_sample_params sp[2];
    dsv4_sample_params_default(&sp[0]);
    sp[0].temperature = 0;
    dsv4_sample_params_default(&sp[1]);
    sp[1].temperature = 0.8;
    sp[1].seed = 7;
    for (int k = 0; k < 2; k++) {
        int32_t a[N_GEN], b[N_GEN];
        double la[N_GEN], lb[N_GEN];
        int pa, pb;
        int na = generate(m, &sp[k], 0, a, la, &pa), nb = generate(m, &sp[k], 1, b, lb, &pb);
        CHECK(na == N_GEN && nb == N_GEN && !memcmp(a, b, sizeof a) && !memcmp(la, lb, sizeof la),
              "%s: DSpark-drafted ids/logprobs differ from plain", k ? "seeded" : "greedy");
        CHECK(pb > 0 && pa == 0, "the drafted run proposed tokens (%d)", pb);
    }
    dsv4_model_free(m);
    printf("  DSpark stages: drafted == plain, greedy and seeded\n");
}

int main(void)
{
    check_flash_config();
    dsv4_model *res = load(6, 0, DSV4_ENGRAM_RESIDENT, 0), *str = load(6, 0, DSV4_ENGRAM_STREAMED, 0);
    dsv4_model *other = load(6, 60000, DSV4_ENGRAM_RESIDENT, 0);
    if (res && str && other) {
        check_roles(res);
        dsv4_model_info info;
        dsv4_model_get_info(res, &info);
        int V = info.vocab_size;
        size_t sz = (size_t)T * V * sizeof(float);
        float *a = malloc(sz), *b = calloc(1, sz), *c = malloc(sz), *d = calloc(1, sz), *e = malloc(sz), *x = calloc(1, sz);
        run_logits(res, a, b, V);
        CHECK(!memcmp(a + (size_t)P * V, b + (size_t)P * V, (size_t)(T - P) * V * sizeof(float)),
              "v4.1-tiny: decode differs from one prefill");
        uint64_t bytes, tokens;
        int streamed;
        dsv4_engram_stats(res, &bytes, &tokens, &streamed);
        CHECK(!streamed && tokens == 2 * T && bytes == (uint64_t)tokens * 48 * (32 + 1),
              "resident Engram: %llu tokens, %llu bytes", (unsigned long long)tokens, (unsigned long long)bytes);
        run_logits(str, c, d, V);
        dsv4_engram_stats(str, &bytes, &tokens, &streamed);
        CHECK(streamed && tokens == 2 * T && bytes > 0, "streamed Engram: %llu tokens", (unsigned long long)tokens);
        CHECK(!memcmp(a, c, sz) && !memcmp(b + (size_t)P * V, d + (size_t)P * V, (size_t)(T - P) * V * sizeof(float)),
              "streamed tables give other logits than resident ones");
        run_logits(other, e, x, V);
        CHECK(memcmp(a, e, sz), "tables of other rows leave the logits unchanged: the Engram layers did not run");
        double gs, ws;
        dsv4_engram_times(str, &gs, &ws);
        CHECK(gs > 0 && ws >= 0, "streamed gather time %g s", gs);
        free(a), free(b), free(c), free(d), free(e), free(x);
        printf("  v4.1-tiny: decode == prefill; streamed == resident; Engram rows change the logits\n");
    }
    dsv4_model_free(res);
    dsv4_model_free(str);
    dsv4_model_free(other);
    check_dspark();
    return check_summary("synth41");
}
