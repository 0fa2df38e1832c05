/* Expert parallelism on one GPU (docs/multigpu.md): the experts op run as each rank r of N in
 * turn, its pair outputs taken before the sum (dsv4_cuda_set_pairs_hook), must give
 *   - for each pair whose expert e has e % N == r: the one-GPU pair output, bit for bit;
 *   - for every other pair: -0 exactly (the identity of the all-reduce's sum);
 * and the ranks' outputs added in any order, handed back to the last rank's op as the all-reduce
 * would, must give the one-GPU y bit for bit. N = 2, 3 and 4 (3 does not divide E), every
 * weight form, decode and prefill tiles, REF and fp32. Planted control: a partition that leaves
 * out one rank does not pass. Then placement: rank 1 of 2 puts only its own experts on the
 * device. Then, with NCCL in the build, a communicator of one rank: the all-gather returns the
 * input and the experts op through the real all-reduce equals the one-GPU y bit for bit.
 * Several ranks on one GPU are refused by NCCL itself (one communicator may not hold a GPU
 * twice), so the runs with N > 1 processes need a machine with several GPUs. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "check.h"
#include "core/core.h"
#include "kernels/backend.h"
#include "kernels/place.h"
#include "kernels/cuda/cuda.h"

static const dsv4_backend *gpu;
#include "test_rng.h"
#include "op_check.h"

static uint32_t bits(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
}

static void free_weight(dsv4_weight *w)
{
    free((void *)w->data);
    free((void *)w->scale);
}

#include "dev_buf.h"

/* The hook: rank `rank`'s pair outputs to pairs[rank]; at the last rank, the sum over every
 * rank so far (in the order given) back into the device buffer, as the all-reduce leaves it. */
typedef struct {
    float **pairs;
    int rank, last, reverse;
    size_t n;
} hook_ctx;

static void take_pairs(float *dev, size_t n, void *p)
{
    hook_ctx *h = p;
    h->n = n;
    /* inside the op, under its lock: plain copies, not the table's (the op stream is a blocking one) */
    CHECK(cudaMemcpy(h->pairs[h->rank], dev, n * 4, cudaMemcpyDeviceToHost) == cudaSuccess, "hook: copy out");
    if (!h->last)
        return;
    float *s = falloc(n);
    for (size_t i = 0; i < n; i++) {
        float v = -0.0f;
        for (int j = 0; j <= h->rank; j++)
            v += h->pairs[h->reverse ? h->rank - j : j][i];
        s[i] = v;
    }
    CHECK(cudaMemcpy(dev, s, n * 4, cudaMemcpyHostToDevice) == cudaSuccess, "hook: copy back");
    free(s);
}

static int ranks_pass(const char *what, const dsv4_experts_args *ga, float **pairs, const int32_t *eid, int R, int K,
                      int D, int N, int wrong, const float *Yfull, const float *yfull, int quiet)
{
    dsv4_err err = {0};
    size_t n = (size_t)R * K * D;
    float *y = falloc((size_t)R * D);
    int ok = 1;
    for (int r = 0; r < N; r++) {
        int as = r == wrong ? (r + 1) % N : r; /* control: rank `wrong` computes the next rank's share */
        hook_ctx h = {pairs, r, r == N - 1, N % 2, 0};
        CHECK(!dsv4_cuda_set_experts_rank(as, N, &err), "%s: %s", what, err.msg);
        dsv4_cuda_set_pairs_hook(take_pairs, &h);
        gpu->experts(ga);
        CHECK(!gpu->check(&err), "%s: rank %d of %d: %s", what, r, N, err.msg);
        CHECK(h.n == n, "%s: the hook saw %zu pair values, not %zu", what, h.n, n);
    }
    dsv4_cuda_set_pairs_hook(NULL, NULL);
    dsv4_cuda_set_experts_rank(0, 1, &err);
    gpu->download(y, ga->y, (size_t)R * D * 4);
    for (int r = 0; r < N && ok; r++)
        for (size_t p = 0; p < (size_t)R * K && ok; p++) {
            int mine = eid[p] % N == r;
            for (int d = 0; d < D; d++) {
                float v = pairs[r][p * D + d];
                if (mine ? bits(v) != bits(Yfull[p * D + d]) : bits(v) != 0x80000000u) {
                    if (!quiet)
                        printf("  %s: N=%d rank %d pair %zu (expert %d) [%d] = %a, want %a\n", what, N, r, p, eid[p], d, v,
                               mine ? Yfull[p * D + d] : -0.0f);
                    ok = 0;
                    break;
                }
            }
        }
    for (size_t i = 0; i < (size_t)R * D && ok; i++)
        if (bits(y[i]) != bits(yfull[i])) {
            if (!quiet)
                printf("  %s: N=%d y[%zu] = %a, one GPU %a\n", what, N, i, y[i], yfull[i]);
            ok = 0;
        }
    free(y);
    return ok;
}

/* An experts op's random inputs (R rows, K distinct experts each of E) on the device. */
typedef struct {
    float *x, *wts, *dx, *dw, *dy, *dwork;
    int32_t *eid, *de;
    dsv4_experts_args a;
} ex_case;

static void ex_case_make(ex_case *c, const dsv4_weight *w1, const dsv4_weight *w2, const dsv4_weight *w3, int R, int E,
                         int K, int D, int I, int pre_weight, int ref)
{
    int RK = R * K;
    c->x = falloc((size_t)R * D), c->wts = falloc(RK);
    c->eid = malloc((size_t)RK * 4);
    fill(c->x, (size_t)R * D, -1, 1);
    fill(c->wts, RK, 0.1f, 1.0f);
    distinct_experts(c->eid, R, K, E);
    c->dx = to_dev(c->x, (size_t)R * D * 4), c->dw = to_dev(c->wts, RK * 4), c->dy = to_dev(NULL, (size_t)R * D * 4);
    c->de = to_dev(c->eid, RK * 4);
    c->dwork = to_dev(NULL, DSV4_EXPERTS_WORK(R, K, D, I, E) * 4);
    c->a = (dsv4_experts_args){w1, w2, w3, E, K, R, D, I, c->de, c->dw, c->dx, 0.0f, pre_weight, ref, c->dy, c->dwork};
}

static void ex_case_free(ex_case *c)
{
    gpu->free(c->dx), gpu->free(c->dw), gpu->free(c->dy), gpu->free(c->de), gpu->free(c->dwork);
    free(c->x), free(c->wts), free(c->eid);
}

static void test_partition(dsv4_wform form, int fp8_block, int R, int E, int K, int D, int I, int pre_weight, int ref)
{
    char what[160];
    snprintf(what, sizeof what, "experts %s%s R=%d E=%d K=%d%s%s", dsv4_wform_name(form),
             form == DSV4_WF_FP8 && fp8_block != 128 ? " [32,32]" : "", R, E, K, pre_weight ? " pre-weighted" : "",
             ref ? " REF" : "");
    int bn = form == DSV4_WF_FP8 ? fp8_block : 1, bk = form == DSV4_WF_FP8 ? fp8_block : 32;
    dsv4_weight *w1 = calloc(E, sizeof *w1), *w2 = calloc(E, sizeof *w2), *w3 = calloc(E, sizeof *w3);
    dsv4_err err = {0};
    for (int e = 0; e < E; e++) {
        make_weight(form, I, D, bn, bk, 1, &w1[e]);
        make_weight(form, D, I, bn, bk, 1, &w2[e]);
        make_weight(form, I, D, bn, bk, 1, &w3[e]);
        CHECK(!dsv4_cuda_put_weight(&w1[e], &err) && !dsv4_cuda_put_weight(&w2[e], &err) &&
              !dsv4_cuda_put_weight(&w3[e], &err), "%s: put: %s", what, err.msg);
    }
    ex_case c;
    ex_case_make(&c, w1, w2, w3, R, E, K, D, I, pre_weight, ref);
    dsv4_experts_args ga = c.a;
    int RK = R * K;
    float *yfull = falloc((size_t)R * D), *dy = c.dy;
    int32_t *eid = c.eid;
    /* the one-GPU result: y, and the pair outputs through the hook (a world of one) */
    size_t n = (size_t)RK * D;
    float *pairs[4];
    for (int r = 0; r < 4; r++)
        pairs[r] = falloc(n);
    float *Yfull = falloc(n);
    hook_ctx h1 = {&Yfull, 0, 0, 0, 0};
    dsv4_cuda_set_pairs_hook(take_pairs, &h1);
    gpu->experts(&ga);
    dsv4_cuda_set_pairs_hook(NULL, NULL);
    CHECK(!gpu->check(&err), "%s: %s", what, err.msg);
    gpu->experts(&ga);
    CHECK(!gpu->check(&err), "%s: %s", what, err.msg);
    gpu->download(yfull, dy, (size_t)R * D * 4);
    int ok = 1;
    for (int N = 2; N <= 4; N++)
        ok &= ranks_pass(what, &ga, pairs, eid, R, K, D, N, -1, Yfull, yfull, 0);
    CHECK(ok, "%s: the ranks' pair outputs or their sum differ from one GPU's", what);
    /* planted control: rank 1's share replaced by rank 2's (of 3) must not pass */
    int ctl = ranks_pass(what, &ga, pairs, eid, R, K, D, 3, 1, Yfull, yfull, 1);
    CHECK(!ctl, "%s: control: a partition without rank 1 passed", what);
    printf("  %-52s N=2,3,4 %s; control %s\n", what, ok ? "equal to one GPU, bit for bit" : "DIFFERENT",
           ctl ? "PASSED (bad)" : "fails");
    for (int r = 0; r < 4; r++)
        free(pairs[r]);
    for (int e = 0; e < E; e++) {
        dsv4_cuda_drop_weight(&w1[e]);
        dsv4_cuda_drop_weight(&w2[e]);
        dsv4_cuda_drop_weight(&w3[e]);
        free_weight(&w1[e]);
        free_weight(&w2[e]);
        free_weight(&w3[e]);
    }
    ex_case_free(&c);
    free(w1), free(w2), free(w3), free(yfull), free(Yfull);
}

/* Rank 1 of 2 places a layer's hot weight and 4 experts (slots 0..3): the hot weight and
 * experts 1 and 3 reach the device, 0 and 2 do not. */
static void test_place(void)
{
    dsv4_err err = {0};
    dsv4_weight hot, ex[4][3];
    make_weight(DSV4_WF_BF16, 64, 64, 1, 1, 0, &hot);
    hot.bytes = dsv4_cuda_weight_bytes(&hot); /* the plan sizes items by their stored bytes, as a loader sets them */
    dsv4_place_item it[13];
    int n = 0;
    it[n++] = (dsv4_place_item){.w = &hot, .expert = DSV4_PLACE_HOT, .slot = -1};
    for (int e = 0; e < 4; e++)
        for (int m = 0; m < 3; m++) {
            make_weight(DSV4_WF_BF16, 64, 64, 1, 1, 0, &ex[e][m]);
            ex[e][m].bytes = hot.bytes;
            it[n++] = (dsv4_place_item){.w = &ex[e][m], .expert = e, .slot = e};
        }
    CHECK(!dsv4_cuda_set_experts_rank(1, 2, &err), "place: %s", err.msg);
    char rep[512];
    int host = 0;
    size_t d0, p0, d1, p1;
    dsv4_cuda_usage(&d0, &p0);
    CHECK(!dsv4_cuda_place(it, n, rep, sizeof rep, &host, &err), "place: %s", err.msg);
    dsv4_cuda_usage(&d1, &p1);
    size_t one = dsv4_cuda_weight_bytes(&hot);
    CHECK(d1 - d0 == 7 * one && p1 == p0, "place as rank 1 of 2: %zu bytes on the device and %zu pinned, want 7 "
          "weights of %zu on the device (the hot one and experts 1 and 3)", d1 - d0, p1 - p0, one);
    CHECK(strstr(rep, "2 of 2 experts") != NULL, "place as rank 1 of 2: the plan must count this rank's 2 experts: %s",
          rep);
    printf("  placement as rank 1 of 2: %zu of 13 weights on the device (%s)\n", (d1 - d0) / one, rep);
    dsv4_cuda_unplace(it, n);
    /* a budget of the hot weight and one expert: expert 1 on the device, expert 3 pinned */
    char b[32];
    snprintf(b, sizeof b, "%zu", 4 * one);
    setenv("DSV4_CUDA_BUDGET", b, 1);
    dsv4_cuda_usage(&d0, &p0);
    CHECK(!dsv4_cuda_place(it, n, rep, sizeof rep, &host, &err), "place with a budget: %s", err.msg);
    dsv4_cuda_usage(&d1, &p1);
    unsetenv("DSV4_CUDA_BUDGET");
    CHECK(d1 - d0 == 4 * one && p1 - p0 == 3 * one && host,
          "place as rank 1 of 2 within 4 weights: %zu bytes on the device and %zu pinned, want 4 and 3 weights of %zu",
          d1 - d0, p1 - p0, one);
    printf("  within 4 weights of budget: %zu on the device, %zu pinned (%s)\n", (d1 - d0) / one, (p1 - p0) / one, rep);
    dsv4_cuda_unplace(it, n);
    dsv4_cuda_set_experts_rank(0, 1, &err);
    free_weight(&hot);
    for (int e = 0; e < 4; e++)
        for (int m = 0; m < 3; m++)
            free_weight(&ex[e][m]);
}

/* A communicator of one rank: the all-gather, and the experts op through the all-reduce. */
static void test_world_one(void)
{
    dsv4_err err = {0};
    unsigned char id[DSV4_CUDA_COMM_ID_BYTES];
    CHECK(!dsv4_cuda_comm_id(id, &err) && !dsv4_cuda_comm_init(1, 0, id, &err), "nccl, one rank: %s", err.msg);
    uint64_t in = 0x0123456789abcdefull, out = 0;
    CHECK(!dsv4_cuda_allgather(&in, sizeof in, &out, &err), "nccl all-gather: %s", err.msg);
    CHECK(out == in, "nccl all-gather of one rank returned %llx", (unsigned long long)out);
    int R = 24, E = 8, K = 3, D = 256, I = 128;
    dsv4_weight *w = calloc(3 * E, sizeof *w);
    for (int e = 0; e < 3 * E; e++) {
        make_weight(DSV4_WF_FP8, e < 2 * E && e >= E ? D : I, e < 2 * E && e >= E ? I : D, 128, 128, 1, &w[e]);
        CHECK(!dsv4_cuda_put_weight(&w[e], &err), "put: %s", err.msg);
    }
    ex_case c;
    ex_case_make(&c, w, w + E, w + 2 * E, R, E, K, D, I, 0, 0);
    dsv4_experts_args ga = c.a;
    float *y0 = falloc((size_t)R * D), *y1 = falloc((size_t)R * D), *dy = c.dy;
    gpu->experts(&ga); /* through the all-reduce of one rank */
    CHECK(!gpu->check(&err), "experts through nccl: %s", err.msg);
    gpu->download(y1, dy, (size_t)R * D * 4);
    dsv4_cuda_comm_free();
    gpu->experts(&ga); /* without a communicator */
    CHECK(!gpu->check(&err), "experts: %s", err.msg);
    gpu->download(y0, dy, (size_t)R * D * 4);
    CHECK(!memcmp(y0, y1, (size_t)R * D * 4), "experts through a one-rank all-reduce differ from one GPU");
    printf("  nccl, one rank: all-gather returns the input; experts through the all-reduce equal one GPU, bit for bit\n");
    for (int e = 0; e < 3 * E; e++) {
        dsv4_cuda_drop_weight(&w[e]);
        free_weight(&w[e]);
    }
    ex_case_free(&c);
    free(w), free(y0), free(y1);
}

int main(void)
{
    dsv4_err err = {0};
    if (dsv4_cuda_init(&err)) {
        fprintf(stderr, "test_cuda_ranks: %s\n", err.msg);
        return 1;
    }
    gpu = dsv4_backend_cuda();
    const char *sd = getenv("DSV4_SEED");
    rng = sd ? strtoull(sd, NULL, 10) : (uint64_t)time(NULL);
    printf("test_cuda_ranks on %s (seed %llu)\n", dsv4_cuda_device_name(), (unsigned long long)rng);
    /* decode-sized (8-pair tiles) and prefill-sized (64-pair tiles on the tensor cores) */
    test_partition(DSV4_WF_FP8, 128, 5, 8, 3, 256, 256, 0, 0);
    test_partition(DSV4_WF_FP8, 128, 96, 8, 3, 256, 256, 0, 0);
    test_partition(DSV4_WF_FP8, 32, 40, 6, 4, 256, 384, 0, 1);
    test_partition(DSV4_WF_FP4, 0, 40, 8, 3, 256, 128, 1, 0);
    test_partition(DSV4_WF_FP4, 0, 7, 8, 3, 256, 128, 0, 1);
    test_partition(DSV4_WF_BF16, 0, 30, 6, 2, 128, 128, 0, 0);
    /* I = 2048: a decode grid small enough that the tensor cores split W2's k range into slices
     * folded afterwards (every pair's row), the fold of other ranks' pairs then -0 too */
    test_partition(DSV4_WF_FP8, 128, 2, 8, 3, 256, 2048, 0, 0);
    test_partition(DSV4_WF_FP4, 0, 2, 8, 3, 256, 2048, 0, 1);
    test_place();
    if (dsv4_cuda_comm_built())
        test_world_one();
    else
        printf("  (built without NCCL: the one-rank communicator is not checked)\n");
    return check_summary("test_cuda_ranks");
}
