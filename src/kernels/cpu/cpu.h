/* kernels/cpu — the CPU backend's ops that live outside ops.c (step.c, step41.c), for its op
 * table, and the CPU pieces they share (the model calls none of these: it uses the table). */
#ifndef DSV4_CPU_H
#define DSV4_CPU_H
#include "kernels/backend.h"

void *dsv4_cpu_alloc(size_t bytes);
void dsv4_cpu_free(void *p);
void dsv4_cpu_copy(void *dst, const void *src, size_t bytes);
void dsv4_cpu_attn_step(const dsv4_attn_args *a);
size_t dsv4_cpu_attn_work(const dsv4_attn_args *a);
void dsv4_cpu_engram_gate(float *X, const float *kv, const float *w, int T, int n, int D, float eps, int round_bf16);
void dsv4_cpu_route(const float *lg, int R, int E, int K, const float *bias, const int32_t *tid2eid, const int32_t *ids,
                    int norm, float route_scale, int32_t *eid, float *wts);
void dsv4_cpu_experts(const dsv4_experts_args *a);
void dsv4_cpu_add(const float *a, const float *b, int64_t n, float *y);
void dsv4_cpu_scale(const float *x, int64_t n, float s, float *y);
void dsv4_cpu_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows);
void dsv4_cpu_attn_step41(const dsv4_attn41_args *a);

/* Seconds the CPU has spent scoring indexer keys (V4's attn_step, V4.1's attn_step41) since
 * the process started, for the benchmark's indexer share of a step. One forward at a time
 * updates it. */
double dsv4_index_seconds(void);
void dsv4_index_seconds_add(double s);

/* Pooled group w of a compressor: per channel, softmax over the group's slots of z (+ ape)
 * weighting c, rings [c_cap, (1 + overlap) dim] by position mod c_cap; out [dim]. */
void dsv4_pool_group(const dsv4_pool *cp, const float *cring, const float *zring, int c_cap, int64_t w, float *out);
/* A scored entry for the family's top-k selections: descending score, ties to the lower index. */
typedef struct dsv4_scored { float s; int64_t w; } dsv4_scored;
/* The min(k, nvis) best of tmp[0..nvis) (reordered) into sel, ascending entry order; returns the count. */
int dsv4_topk_ascending(dsv4_scored *tmp, int64_t nvis, int k, int64_t *sel);
/* The min(k, n) best of v moved to v[0..) in no particular order; returns the count. */
int64_t dsv4_best_k(dsv4_scored *v, int64_t n, int k);

#endif
