/* CUDA backend: the dsv4_backend op table over the GPU, fp32 activations and fp32 accumulation.
 *
 * Batch invariance: every kernel gives each output row one fixed reduction order that
 * depends only on the op's shape (k, dim, n...), never on T or on the row's place in the
 * batch: a row is owned by one warp or one block, lanes take fixed strides, and partial
 * sums meet in a fixed shuffle tree. A batch of rows therefore equals the rows one at a time,
 * bit for bit. The order differs from the CPU's, so GPU and CPU agree to rounding only.
 *
 * Buffers: every op reads and writes device buffers only (the forward's step arena and sequence
 * state), without copies or waits; the constant arrays it reads are their resident copies,
 * placed at load, or device memory (internal.h: dev_const).
 *
 * Files: runtime.cu (device, residency, constants, memory, graphs), linear.cu,
 * rounding.cu (REF's roundings), experts.cu, norm.cu (rmsnorm, rope), hc.cu, attend.cu, elementwise.cu, embed.cu, step.cu
 * (V4's stateful attention step and routing), step41.cu (V4.1's), exl3.cu. */
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cuda/internal.h"

using namespace dsv4cu;

static void cu_attn_step(const dsv4_attn_args *a) { dsv4cu::attn_step(a); }
static size_t cu_attn_work(const dsv4_attn_args *a) { return dsv4cu::attn_work(a); }

static void cu_attn_step41(const dsv4_attn41_args *a) { dsv4cu::attn_step41(a); }
static size_t cu_attn41_work(const dsv4_attn41_args *a) { return dsv4cu::attn41_work(a); }

static void cu_route(const float *lg, int R, int E, int K, const float *bias, const int32_t *tid2eid, const int32_t *ids,
                     int norm, float route_scale, int32_t *eid, float *wts)
{
    dsv4cu::route(lg, R, E, K, bias, tid2eid, ids, norm, route_scale, eid, wts);
}

static void cu_describe(char *buf, size_t n) { snprintf(buf, n, "cuda: %s", dsv4_cuda_device_name()); }

static dsv4_backend make_table(void)
{
    dsv4_backend t;
    memset(&t, 0, sizeof t);
    t.name = "cuda";
    t.alloc = cu_alloc;
    t.free = cu_free;
    t.upload = cu_upload;
    t.download = cu_download;
    t.copy = cu_copy;
    t.copy2d = cu_copy2d;
    t.linear = cu_linear;
    t.linear_q = cu_linear_q;
    t.linear_rb = cu_linear_rb;
    t.linear_blocks = cu_linear_blocks;
    t.linear_multi = cu_linear_multi;
    t.embed = cu_embed;
    t.rmsnorm = cu_rmsnorm;
    t.rope = cu_rope;
    t.rmsnorm_rb = cu_rmsnorm_rb;
    t.rope_rb = cu_rope_rb;
    t.hc_pre = cu_hc_pre;
    t.hc_collapse = cu_hc_collapse;
    t.engram_gate = cu_engram_gate;
    t.hc_post = cu_hc_post;
    t.hc_post_rb = cu_hc_post_rb;
    t.attend = cu_attend;
    t.attn_step = cu_attn_step;
    t.attn_work = cu_attn_work;
    t.attn_step41 = cu_attn_step41;
    t.attn41_work = cu_attn41_work;
    t.kv_production = 1;
    t.state_room = dsv4_cuda_state_room;
    t.route = cu_route;
    t.experts = cu_experts;
    t.round_bf16 = cu_round_bf16;
    t.roundtrip = cu_roundtrip;
    t.add = cu_add;
    t.scale = cu_scale;
    t.swiglu = cu_swiglu;
    t.graph_begin = cu_graph_begin;
    t.graph_end = cu_graph_end;
    t.graph_run = cu_graph_run;
    t.graph_free = cu_graph_free;
    t.check = cuda_check;
    t.place = dsv4_cuda_place;
    t.unplace = dsv4_cuda_unplace;
    t.describe = cu_describe;
    t.copy_bandwidth = dsv4_cuda_copy_bandwidth;
    t.host_bytes = dsv4_cuda_host_bytes;
    t.host_read_bandwidth = dsv4_cuda_host_read_bandwidth;
    t.capture = dsv4_cuda_capture;
    return t;
}

static const dsv4_backend cuda_backend = make_table();

extern "C" const dsv4_backend *dsv4_backend_cuda(void) { return &cuda_backend; }
