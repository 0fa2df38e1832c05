/* dsv4 — a native inference engine for the DeepSeek-V4 family.
 *
 * The public API: load a checkpoint, make sequences, run forward passes over batches of
 * sequences. Everything is an opaque handle; every call that can fail takes a dsv4_err
 * and returns a status (0 = ok) or NULL, leaving a message that names the file, tensor,
 * key or field at fault. Library code never exits or aborts on bad input. */
#ifndef DSV4_H
#define DSV4_H

#include <stddef.h>
#include <stdint.h>
#include "core/err.h" /* errors: dsv4_err, DSV4_OK and the DSV4_E_* codes */

#ifdef __cplusplus
extern "C" {
#endif

/* ---- model ----------------------------------------------------------------------- */
typedef struct dsv4_model dsv4_model;
typedef struct dsv4_seq dsv4_seq;

/* Numerics of the forward pass. FP32: fp32 activations and full-precision caches (the
 * exact mode). REF: the V4.1 release reference's rounding (bf16 activations, fp8
 * activation blocks, cache round trips). DEFAULT picks per model family. */
typedef enum { DSV4_NUMERICS_DEFAULT = 0, DSV4_NUMERICS_FP32 = 1, DSV4_NUMERICS_REF = 2 } dsv4_numerics;

typedef struct dsv4_load_opts {
    int n_threads;          /* 0: all cores */
    int progress;           /* 1: print load progress to stderr (when it is a terminal) */
    dsv4_numerics numerics;
    const char *device;     /* NULL or "cpu" or "cuda" */
    int max_rollback;       /* tokens a sequence can be rolled back; 0: default (256) */
    /* V4.1 Engram tables: DSV4_ENGRAM_AUTO (resident when the tables fit in half of RAM,
     * else streamed), RESIDENT (read through the mapping) or STREAMED (rows read by
     * address with pread, O_DIRECT where the file system allows, fetched ahead per step). */
    int engram_tables;
    /* 1: keep the checkpoint's draft stages running (V4.1 DSpark, V4 MTP; CPU backend): every
     * forward then also fills their windows, so dsv4_spec_draft / dsv4_mtp_draft can propose.
     * 0: the stages are bound (a missing tensor still fails) but cost nothing. */
    int draft_stages;
    /* The KV caches (window rows, compressed entries, indexer keys; docs/kv.md): EXACT keeps
     * them in fp32; PRODUCTION packs them in the production engine's formats (window e4m3 +
     * UE8M0 per 32, entries e2m1 + E4M3 per 16, indexer keys e2m1 + UE8M0 per 32); AUTO is
     * PRODUCTION where the backend has it, else EXACT. DEFAULT (0) is EXACT. */
    int kv;
} dsv4_load_opts;
enum { DSV4_ENGRAM_AUTO = 0, DSV4_ENGRAM_RESIDENT = 1, DSV4_ENGRAM_STREAMED = 2 };
enum { DSV4_KV_DEFAULT = 0, DSV4_KV_EXACT = 1, DSV4_KV_PRODUCTION = 2, DSV4_KV_AUTO = 3 };
/* The loaded model's cache format: "exact" or "production". */
const char *dsv4_model_kv(const dsv4_model *m);

/* Loads a checkpoint folder (config.json + model.safetensors or sharded index). */
dsv4_model *dsv4_model_load(const char *dir, const dsv4_load_opts *opts, dsv4_err *err);
void dsv4_model_free(dsv4_model *m);

typedef struct dsv4_model_info {
    const char *family;     /* "deepseek_v4" or "deepseek_v41" */
    int vocab_size, hidden_size, n_layers, n_heads, head_dim;
    int bos_id, eos_id;
    int64_t max_position;
    size_t weight_bytes;    /* bytes of weights as stored */
} dsv4_model_info;
void dsv4_model_get_info(const dsv4_model *m, dsv4_model_info *out);
/* 1 when some routed experts are read from host memory at every use (the CUDA loader's plan
 * when they do not all fit the device); 0 on the CPU. */
int dsv4_model_experts_in_host(const dsv4_model *m);

/* ---- sequences ------------------------------------------------------------------- */
/* A sequence owns every cache one conversation needs (window rows, compressor windows,
 * compressed entries, indexer keys). It belongs to one model. */
dsv4_seq *dsv4_seq_new(dsv4_model *m, dsv4_err *err);
void dsv4_seq_free(dsv4_seq *s);
int64_t dsv4_seq_len(const dsv4_seq *s);
dsv4_seq *dsv4_seq_copy(const dsv4_seq *s, dsv4_err *err);
/* Serialises the state to a malloc'd buffer (*buf, *len); the bytes restore only into a
 * sequence of the same model. */
int dsv4_seq_save(const dsv4_seq *s, void **buf, size_t *len, dsv4_err *err);
int dsv4_seq_restore(dsv4_seq *s, const void *buf, size_t len, dsv4_err *err);
/* Rolls the sequence back to n_tokens (<= its length, and at most max_rollback tokens back
 * from the furthest point reached since the last save/restore). */
int dsv4_seq_truncate(dsv4_seq *s, int64_t n_tokens, dsv4_err *err);
/* Bytes of state the sequence holds now. */
size_t dsv4_seq_bytes(const dsv4_seq *s);
/* Bytes of state a sequence holds once it has n_tokens of context, in the model's cache format
 * (what dsv4_seq_bytes reports then; the entry buffers grow by doubling, so a sequence's
 * allocation is at most this plus the entries of n_tokens more). */
size_t dsv4_seq_bytes_at(const dsv4_model *m, int64_t n_tokens);
/* Admission: the most tokens of context each of `lanes` sequences can reach within `budget`
 * bytes of state, counting each sequence's allocation as the entry buffers grow (doubling), so
 * no allocation outgrows the budget; 0 when not even an empty sequence fits. */
int64_t dsv4_kv_fit(const dsv4_model *m, int lanes, size_t budget);
/* Bytes free now in the memory the model's sequences live in, where that is a device's (free
 * device memory less what the backend keeps for its ops' scratch); 0 when the state is host
 * memory (the CPU backend), whose share the caller chooses. */
size_t dsv4_model_state_room(const dsv4_model *m);

/* ---- forward --------------------------------------------------------------------- */
/* One step over several sequences: sequence i appends n_ids[i] tokens ids[i][0..]. Rows are
 * computed independently of what else is in the batch (batch-invariant), so a sequence's
 * logits do not depend on its neighbours or on how its prompt was chunked.
 * logits: all_logits ? [sum n_ids, vocab] (row order: seq 0's tokens, then seq 1's, ...)
 *                    : one row per sequence with n_ids > 0 (its last token), in batch order.
 * May be NULL. */
typedef struct dsv4_batch {
    int n_seqs;
    dsv4_seq *const *seqs;
    const int32_t *const *ids;
    const int *n_ids;
    int all_logits;
    float *logits;
} dsv4_batch;
int dsv4_forward(dsv4_model *m, const dsv4_batch *b, dsv4_err *err);

/* ---- DSpark drafting (V4.1 checkpoints with mtp.* stages) ------------------------ */
#define DSV4_MAX_SPEC_BLOCK 64      /* the largest dspark_block_size a config may give */
/* Tokens one DSpark draft proposes (the config's dspark_block_size); 0 when the model has no
 * stages, its backend does not run them, or it was loaded without draft_stages. */
int dsv4_spec_block(const dsv4_model *m);
/* Drafts after `anchor`, the token at position dsv4_seq_len(s) (not yet fed): ids [block + 1]
 * the anchor then the drafts (each the argmax of its row, ties to the lower id), logits
 * [block, vocab] the stages' logits with the Markov bias (may be NULL), conf [block] the
 * confidence head's raw scores (may be NULL). The sequence is not changed: its stage windows
 * are filled by dsv4_forward. */
int dsv4_spec_draft(dsv4_model *m, dsv4_seq *s, int32_t anchor, int32_t *ids, float *logits, float *conf, dsv4_err *err);

/* ---- MTP drafting (V4 checkpoints with an mtp.0 stage) ----------------------------- */
/* 1 when the model's MTP stage is bound and runs (CPU backend, loaded with draft_stages). */
int dsv4_mtp_on(const dsv4_model *m);
/* Drafts k tokens after `anchor`, the token at position dsv4_seq_len(s) (not yet fed), by
 * chaining the stage (docs/mtp.md); each the argmax of its logits, ties to the lower id.
 * Returns how many were written to out (0 for an empty sequence), or minus an error code. The
 * sequence is not changed: dsv4_forward fills its MTP window. */
int dsv4_mtp_draft(dsv4_model *m, dsv4_seq *s, int32_t anchor, int k, int32_t *out, dsv4_err *err);

/* ---- misc ------------------------------------------------------------------------ */
const char *dsv4_version(void);
/* Whether `device` ("cpu", "cuda") can run here: 0 and a description of it in desc[n], or
 * DSV4_E_DEVICE saying why not (not in this build, no usable GPU). */
int dsv4_device_probe(const char *device, char *desc, size_t n, dsv4_err *err);

#ifdef __cplusplus
}
#endif
#endif
