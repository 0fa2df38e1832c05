/* A device backend's memory plan (kernels/place.h over the model's list of what the device ops
 * read, model/model.c), computed on the CPU over a fixture's weights: the two classes
 * add up to the weights the GPU ops read, experts go to the device in layer order while they
 * fit, the embedding table after them, a hot path larger than the budget is refused, and so is
 * a spill larger than the host memory it would be pinned in. Each
 * check can fail: the expected numbers are computed here from the layers' own byte counts, not
 * from the plan. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "dsv4.h"
#include "model/model.h"

/* The plan for m's arrays against avail device bytes and host bytes for what spills. */
static void plan_host(const dsv4_model *m, size_t avail, size_t host, dsv4_place_plan *p)
{
    dsv4_place_item *items = NULL;
    int64_t n = 0;
    dsv4_err err;
    CHECK(!dsv4_place_items(m, &items, &n, &err) && n > 0, "listing the arrays to place: %s", err.msg);
    dsv4_place_plan_make(items, n, avail, host, p);
    free(items);
}
static void plan(const dsv4_model *m, size_t avail, dsv4_place_plan *p) { plan_host(m, avail, (size_t)-1, p); }

/* Whether w is one of the n items' weights. */
static int listed(const dsv4_place_item *it, int64_t n, const dsv4_weight *w)
{
    for (int64_t i = 0; i < n; i++)
        if (it[i].w == w)
            return 1;
    return 0;
}

/* V4.1 loaded to draft lists its DSpark stages' weights too (a device then holds them), every
 * listed weight a bound one of a known form, and the stages' routed experts counted at their
 * own number; loaded not to draft, none of the stages. */
static void v41_stages(void)
{
    dsv4_err err;
    for (int draft = 1; draft >= 0; draft--) {
        dsv4_load_opts o = {.draft_stages = draft};
        dsv4_model *m = dsv4_model_load(CHECK_FIXTURES "/v41/v41-tiny-a", &o, &err);
        CHECK(m != NULL, "v41 load: %s", err.msg);
        if (!m)
            return;
        const dsv4_config *c = &m->cfg;
        const dsv4_spec *S = &m->spec;
        dsv4_place_item *it = NULL;
        int64_t n = 0, bad = 0, ne = 0;
        CHECK(!dsv4_place_items(m, &it, &n, &err) && n > 0, "v41: listing the arrays to place: %s", err.msg);
        for (int64_t i = 0; i < n; i++) {
            const dsv4_weight *w = it[i].w;
            if (w && (!w->data || !w->name || w->form < 0 || w->form >= DSV4_WF_COUNT || w->n <= 0 || w->k <= 0))
                bad++;
            if (it[i].expert >= 0 && it[i].expert + 1 > ne)
                ne = it[i].expert + 1;
        }
        int64_t want = 0;
        for (int li = 0; li < c->n_layers; li++)
            for (int e = 0; e < c->n_experts && m->layers[li].w1; e++)
                want += m->layers[li].w1[e].data != NULL;
        for (int st = 0; draft && st < S->n; st++)
            for (int e = 0; e < c->spec_experts && S->st[st].w1; e++)
                want += S->st[st].w1[e].data != NULL;
        CHECK(S->n > 0, "v41-tiny-a has DSpark stages");
        CHECK(bad == 0, "v41 (draft %d): %lld listed weights are not bound weights of a known form", draft, (long long)bad);
        CHECK(ne == want, "v41 (draft %d): %lld routed experts listed, want %lld", draft, (long long)ne, (long long)want);
        int stages = S->n > 0 && listed(it, n, &S->main_proj) && listed(it, n, &S->mk_head) &&
                     listed(it, n, &S->st[S->n - 1].wq_a) && listed(it, n, &S->st[0].wo_b);
        CHECK(stages == draft, "v41 (draft %d): the stages' weights %s listed", draft, stages ? "are" : "are not");
        printf("  v41 loaded %sto draft: %lld items, %lld routed experts, the stages %slisted\n", draft ? "" : "not ",
               (long long)n, (long long)ne, stages ? "" : "not ");
        free(it);
        dsv4_model_free(m);
    }
}

/* Several GPUs: rank r of N keeps every item but other ranks' routed experts (slot % N), its
 * own renumbered 0.. in order, so the plan places them as one GPU's list; the ranks' experts
 * together are all of them, each once. Then the plan of rank 1 of 2 within room for the hot
 * path and one expert: exactly its first expert on the device. */
static void ranks(const dsv4_model *m)
{
    dsv4_place_item *it = NULL, *v = NULL;
    int64_t n = 0;
    dsv4_err err;
    CHECK(!dsv4_place_items(m, &it, &n, &err) && n > 0, "listing the arrays to place: %s", err.msg);
    v = malloc((size_t)n * sizeof *v);
    int64_t nh = 0, nx = 0, cnt[8] = {0};
    for (int64_t i = 0; i < n; i++)
        it[i].expert < 0 ? nh++ : nx++;
    for (int N = 1; N <= 3; N++) {
        int64_t seen = 0, bad = 0;
        for (int r = 0; r < N; r++) {
            int64_t k = dsv4_place_items_of_rank(it, n, r, N, v), h = 0, x = 0, last = -1;
            for (int64_t i = 0; i < k; i++) {
                if (v[i].expert < 0) {
                    h++;
                    continue;
                }
                x++;
                bad += v[i].slot % N != r;
                /* renumbered densely: each new expert is the one after the last */
                if (v[i].expert != last) {
                    bad += v[i].expert != last + 1;
                    last = v[i].expert;
                }
            }
            bad += h != nh;
            seen += x;
            cnt[N] += last + 1;
        }
        CHECK(!bad && seen == nx, "%d ranks: %lld misplaced or misnumbered items, %lld expert items of %lld", N,
              (long long)bad, (long long)seen, (long long)nx);
    }
    CHECK(cnt[2] == cnt[1] && cnt[3] == cnt[1], "the ranks' experts add up to one GPU's: %lld, %lld, %lld",
          (long long)cnt[1], (long long)cnt[2], (long long)cnt[3]);
    /* rank 1 of 2 with room for its hot path and one expert */
    int64_t k = dsv4_place_items_of_rank(it, n, 1, 2, v);
    dsv4_place_plan p, p0;
    dsv4_place_plan_make(v, k, (size_t)-1, (size_t)-1, &p0);
    size_t first = 0;
    int64_t mine = 0;
    for (int64_t i = 0; i < k; i++) {
        if (v[i].expert == 0)
            first += dsv4_place_item_bytes(&v[i]);
        if (v[i].expert + 1 > mine)
            mine = v[i].expert + 1;
    }
    dsv4_place_plan_make(v, k, p0.hot + first, (size_t)-1, &p);
    int64_t on = 0, first_on = 1;
    for (int64_t i = 0; i < k; i++)
        if (v[i].expert >= 0 && dsv4_place_on_device(&p, &v[i])) {
            on++;
            first_on &= v[i].expert == 0;
        }
    CHECK(p.fits && p.n_experts_dev == 1 && first_on && on > 0 && p.n_experts == mine && mine < cnt[1],
          "rank 1 of 2, room for one expert: %lld of %lld on the device (want 1 of %lld), the first: %lld",
          (long long)p.n_experts_dev, (long long)p.n_experts, (long long)mine, (long long)first_on);
    printf("  ranks: 1, 2 and 3 ranks hold %lld experts in all, each once; rank 1 of 2 with room for one: %lld of %lld "
           "on the device\n", (long long)cnt[1], (long long)p.n_experts_dev, (long long)p.n_experts);
    free(v);
    free(it);
}

int main(void)
{
    char dir[2048], txt[512];
    dsv4_err err;
    snprintf(dir, sizeof dir, "%s", CHECK_FIXTURES "/v4/v4-tiny-a");
    dsv4_model *m = dsv4_model_load(dir, NULL, &err);
    CHECK(m != NULL, "load: %s", err.msg);
    if (!m)
        return check_summary("place");
    CHECK(!strcmp(dsv4_model_placement(m), ""), "a CPU load has no device plan: '%s'", dsv4_model_placement(m));
    const dsv4_config *c = &m->cfg;
    size_t experts = 0, one = 0;
    for (int li = 0; li < c->n_layers; li++)
        for (int e = 0; e < c->n_experts; e++) {
            const dsv4_layer *L = &m->layers[li];
            size_t b = L->w1[e].bytes + L->w2[e].bytes + L->w3[e].bytes;
            experts += b;
            one = b;
        }
    int64_t ne = (int64_t)c->n_layers * c->n_experts;
    CHECK(ne > 1 && one > 0, "fixture has %lld routed experts", (long long)ne);

    dsv4_place_plan p;
    plan(m, (size_t)-1, &p);
    dsv4_place_plan_text(&p, txt, sizeof txt);
    printf("  unlimited: %s\n", txt);
    CHECK(p.fits && p.experts == experts && p.n_experts == ne && p.n_experts_dev == ne && p.experts_dev == experts,
          "everything on the device: experts %zu (want %zu), %lld of %lld on the device", p.experts, experts,
          (long long)p.n_experts_dev, (long long)p.n_experts);
    CHECK(p.embed == m->embed.bytes && p.embed > 0 && p.embed_dev, "the embedding (%zu bytes, want %zu) on the device: %d",
          p.embed, m->embed.bytes, p.embed_dev);
    /* The hot path is every weight the ops read but the experts and the embedding (host), plus
     * small float arrays: between the weights' sum less those and that sum plus 10%. */
    size_t weights = m->weight_bytes - m->embed.bytes - experts;
    CHECK(p.hot > 0 && p.hot + 1 > weights * 9 / 10 && p.hot < weights + weights / 10 + (1 << 20),
          "hot path %zu bytes vs %zu bytes of non-expert weights", p.hot, weights);

    size_t hot = p.hot;
    plan(m, hot + 2 * one + one / 2, &p);
    dsv4_place_plan_text(&p, txt, sizeof txt);
    printf("  hot + 2.5 experts: %s\n", txt);
    CHECK(p.fits && p.n_experts_dev == 2 && p.experts_dev == 2 * one, "room for 2.5 experts keeps 2: %lld (%zu bytes)",
          (long long)p.n_experts_dev, p.experts_dev);
    CHECK(!p.embed_dev && strstr(txt, "embedding in pinned host memory"), "experts spilled: the embedding spills too: %s",
          txt);
    /* The embedding follows the experts: on the device with exactly room for all of them and
     * it, pinned with one byte less (every expert still on the device). */
    plan(m, hot + experts + m->embed.bytes, &p);
    CHECK(p.embed_dev && p.n_experts_dev == ne, "room for everything: embedding on the device (%d), %lld experts",
          p.embed_dev, (long long)p.n_experts_dev);
    plan(m, hot + experts + m->embed.bytes - 1, &p);
    dsv4_place_plan_text(&p, txt, sizeof txt);
    printf("  everything less 1 byte: %s\n", txt);
    CHECK(!p.embed_dev && p.n_experts_dev == ne, "one byte short: the embedding pinned (%d), %lld experts on the device",
          p.embed_dev, (long long)p.n_experts_dev);
    plan(m, hot, &p);
    CHECK(p.fits && p.n_experts_dev == 0, "room for the hot path alone spills every expert: %lld on the device",
          (long long)p.n_experts_dev);
    /* What spills is pinned on the host: the spilled experts and the embedding must fit its
     * bound, checked before anything moves; exactly enough passes, one byte less is refused. */
    size_t spill = experts - 2 * one + m->embed.bytes;
    plan_host(m, hot + 2 * one + one / 2, spill, &p);
    CHECK(p.fits && p.fits_host && p.pinned == spill, "spilling %zu bytes into exactly that much host memory: fits %d, "
          "pinned %zu", spill, p.fits_host, p.pinned);
    plan_host(m, hot + 2 * one + one / 2, spill - 1, &p);
    dsv4_place_plan_text(&p, txt, sizeof txt);
    printf("  hot + 2.5 experts, host one byte short: %s\n", txt);
    CHECK(p.fits && !p.fits_host && strstr(txt, "do not fit the host"), "a spill one byte over the host bound is refused: "
          "%s", txt);
    plan_host(m, (size_t)-1, 0, &p);
    CHECK(p.fits_host && p.pinned == 0, "nothing spilled needs no host memory: %d, %zu", p.fits_host, p.pinned);
    plan(m, hot - 1, &p);
    dsv4_place_plan_text(&p, txt, sizeof txt);
    printf("  hot - 1 byte: %s\n", txt);
    CHECK(!p.fits && strstr(txt, "does not fit"), "a hot path one byte over the budget is refused: %s", txt);
    ranks(m);
    dsv4_model_free(m);

    /* A synthetic model whose later layers share the first two layers' experts: the same
     * bytes, counted once by the plan. */
    dsv4_model *full = dsv4_model_synthetic("tiny", 4, 0, NULL, &err), *half = dsv4_model_synthetic("tiny", 4, 2, NULL, &err);
    CHECK(full && half, "synthetic tiny: %s", err.msg);
    if (full && half) {
        const dsv4_layer *L = half->layers;
        CHECK(L[2].w1[0].data == L[0].w1[0].data && L[3].w2[5].data == L[1].w2[5].data && L[3].w3[5].scale == L[1].w3[5].scale &&
              L[1].w1[0].data != L[0].w1[0].data && full->layers[2].w1[0].data != full->layers[0].w1[0].data,
              "layers 2 and 3 read layers 0 and 1's experts, and only with --expert-layers");
        dsv4_place_plan pf, ph;
        plan(full, (size_t)-1, &pf);
        plan(half, (size_t)-1, &ph);
        CHECK(ph.experts * 2 == pf.experts && ph.n_experts == pf.n_experts && ph.hot == pf.hot,
              "shared experts counted once: %zu vs %zu bytes, %lld experts", ph.experts, pf.experts, (long long)ph.n_experts);
    }
    dsv4_model_free(full);
    dsv4_model_free(half);
    v41_stages();
    return check_summary("place");
}
