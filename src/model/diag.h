/* model/diag — the bench, info and diagnostic entry points beside the public API (include/dsv4.h):
 * synthetic models, the cost model a benchmark reports against, device measurement hooks and
 * the loader's placement report. For the CLI's bench, synth and info commands and the tests;
 * the server uses only the public API. */
#ifndef DSV4_MODEL_DIAG_H
#define DSV4_MODEL_DIAG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "dsv4.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- synthetic models ------------------------------------------------------------ */
/* A model with random weights at a release model's real shapes and storage forms, built in
 * memory (no file): preset "v4-flash"; n_layers of its compressed layers (CSA, HCA, ...).
 * expert_layers > 0: only that many layers own routed experts and layer i uses those of layer
 * i % expert_layers (the same bytes), so all 43 layers' shapes fit a machine that cannot hold
 * 43 layers of experts; each layer still reads its own active experts once per token. */
dsv4_model *dsv4_model_synthetic(const char *preset, int n_layers, int expert_layers, const dsv4_load_opts *opts,
                                 dsv4_err *err);
/* The presets, for messages and help. */
#define DSV4_SYNTHETIC_PRESETS "v4-flash, v4.1-flash, v4.1-tiny, tiny"
/* V4.1 presets ("v4.1-flash" at the release's shapes, "v4.1-tiny" the same structure at width 64):
 * N of the release's 40 layers with their CSA2 roles (N = 40: all; fewer: first those of every
 * role, see docs/v41.md), the Engram layers among them, the three DSpark stages (their experts
 * are layer 0's bytes), and an Engram token map of id mod 99,092. The Engram tables have
 * about engram_rows rows each (the layout's primes after engram_rows / 24): in the image when
 * the load options ask for resident (or auto) tables, else written to files in engram_dir and
 * streamed from there (the files are unlinked once the model holds them). */
typedef struct dsv4_synth_opts {
    int n_layers, expert_layers;
    int64_t engram_rows;    /* 0: the preset's default (v4.1-flash 2^22, v4.1-tiny 48,000) */
    const char *engram_dir; /* NULL: $TMPDIR, else /tmp */
} dsv4_synth_opts;
dsv4_model *dsv4_model_synthetic_ext(const char *preset, const dsv4_synth_opts *so, const dsv4_load_opts *opts,
                                     dsv4_err *err);
/* The config.json text a preset's model of n_layers has (nothing is built), into buf [n]. */
int dsv4_synthetic_config(const char *preset, int n_layers, int64_t engram_rows, char *buf, size_t n, dsv4_err *err);
/* Writes the same as a checkpoint folder (config.json + model.safetensors, and for V4.1 the
 * token_map.json), any preset ("tiny": real vocabulary, width 64, every V4 layer kind). */
int dsv4_synthetic_write(const char *preset, int n_layers, const char *dir, dsv4_err *err);

/* ---- diagnostics ----------------------------------------------------------------- */
/* Engram table traffic since load: bytes of rows read (or touched, when resident), and the
 * tokens they served. streamed: 1 if the tables are streamed. */
void dsv4_engram_stats(const dsv4_model *m, uint64_t *bytes, uint64_t *tokens, int *streamed);
/* Engram time since load, in seconds: reading and decoding rows (on the fetch thread when
 * streamed), and the part of it the forward waited for (all of it when read in line). */
void dsv4_engram_times(const dsv4_model *m, double *gather_s, double *stall_s);
/* Engram layers; their tables' rows into rows [n] (may be NULL), row ids a token looks up per
 * layer into *cols (may be NULL). Returns the number of Engram layers. */
int dsv4_engram_layout(const dsv4_model *m, int64_t *rows, int *cols);

/* What a sequence's window rows, compressed entries and indexer keys hold at `ctx` tokens of
 * context, in bytes: in exact caches (fp32) and, the _q figures, in production caches (window
 * e4m3 + UE8M0/32, entries e2m1 + E4M3/16, index keys e2m1 + UE8M0/32; docs/kv.md). */
typedef struct dsv4_state_cost_t {
    double window_bytes, entry_bytes, ikey_bytes;
    double window_bytes_q, entry_bytes_q, ikey_bytes_q;
} dsv4_state_cost_t;
void dsv4_state_cost(const dsv4_model *m, int64_t ctx, dsv4_state_cost_t *out);

/* Bytes of weights one decoded token reads (every dense weight, the active experts at their
 * mean size, the head, one embedding row). */
size_t dsv4_decode_weight_bytes(const dsv4_model *m);
/* Of those, the bytes read from pinned host memory over the bus, where the device backend's
 * placement left weights there (spilled experts, at their mean per layer; an embedding row):
 * 0 on the CPU or when everything is on the device. */
double dsv4_decode_host_bytes(const dsv4_model *m);
/* Cache bytes a decoded token reads at context ctx (fp32 state): per layer the window rows, and
 * the kept compressed entries (CSA: index_topk of them, after scoring every indexer key; HCA:
 * all). */
size_t dsv4_decode_state_bytes(const dsv4_model *m, int64_t ctx);
/* Bytes one decode step of `lanes` sequences at context ctx reads: the dense weights and head
 * once, per layer the expected number of distinct experts the lanes route to (K of E each,
 * uniformly: E (1 - (1 - K/E)^lanes)), and each lane's cache. */
double dsv4_decode_step_bytes(const dsv4_model *m, int lanes, int64_t ctx);
/* Weight elements a token multiplies through (dense, the active experts, not the head):
 * 2x this is the token's matmul FLOPs. */
double dsv4_token_params(const dsv4_model *m);
/* The memory ceiling of a device in GB/s: "cuda" its device-to-device copy rate (bytes read
 * + written); 0 when not measurable (the CPU: benchmarks measure their own read rate). */
double dsv4_device_bandwidth(const char *device);
/* The rate in GB/s at which the device's kernels read pinned host memory (the ceiling for
 * spilled weights); 0 on the CPU or when not measurable. */
double dsv4_device_host_bandwidth(const char *device);
/* Opens (on) or closes the range a device profiler records (`ncu --profile-from-start off`
 * records the kernels launched inside it); nothing on the CPU. */
void dsv4_device_capture(const char *device, int on);

/* Where the weights went: the CUDA loader's plan (hot path and routed experts against the
 * device memory available, what is on the GPU, what is in pinned host memory); "" on the CPU. */
const char *dsv4_model_placement(const dsv4_model *m);
/* A hash of what decides the model's results (config shapes, numerics, cache format, the
 * checkpoint's tensor directory and each tensor's first bytes): the ranks of a several-GPU
 * run compare theirs before the first step. fingerprint.c. */
uint64_t dsv4_model_fingerprint(const dsv4_model *m);

/* Prints config, layer schedule, tensors by dtype and state cost (for `dsv4 info`). */
void dsv4_model_print_info(const dsv4_model *m, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
