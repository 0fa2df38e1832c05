/* kernels/cpu — the CPU backend's ops that live outside ops.c (step.c), for its op table. */
#ifndef DSV4_CPU_H
#define DSV4_CPU_H
#include "kernels/backend.h"

void *dsv4_cpu_alloc(size_t bytes);
void dsv4_cpu_free(void *p);
void dsv4_cpu_copy(void *dst, const void *src, size_t bytes);
void dsv4_cpu_attn_step(const dsv4_attn_args *a);
size_t dsv4_cpu_attn_work(int R, int64_t vis_cap, int topk);
void dsv4_cpu_route(const float *lg, int R, int E, int K, const float *bias, const int32_t *tid2eid, const int32_t *ids,
                    int norm, float route_scale, int32_t *eid, float *wts);
void dsv4_cpu_experts(const dsv4_experts_args *a);
void dsv4_cpu_add(const float *a, const float *b, int64_t n, float *y);

#endif
