/* lanes — one model, several requests decoding together (continuous batching) with a prompt
 * cache.
 *
 * Each step gathers every busy lane into one dsv4_forward batch: decoding lanes feed their
 * last sampled token, prefilling lanes feed the next chunk of their prompt (at most
 * prefill_chunk tokens, and at most step_tokens over the whole step), so a long prompt
 * interleaves with the others' decode steps. Requests join and leave between steps. The
 * forward pass computes each row independently of the batch and of chunking, and the sampler
 * keys its draws by (seed, position), so a request's tokens and logprobs are the same alone
 * or beside others, and resumed from the cache or cold.
 *
 * Drafts (serve/draft.h): a decoding lane whose request asks for them feeds its last token
 * and a proposal (prompt lookup, or the DSpark stages' block drafted before the step) in the
 * same step; its rows are drawn in order at the positions a
 * plain step would use, the proposal is kept while it equals the draws, and the lane's sequence
 * is rolled back to what was kept. Drafted requests give the tokens and logprobs of plain ones.
 *
 * Prompt cache: when a request finishes, when its prompt is fully read, and every
 * snapshot_every prompt tokens on the way, the lane's state is saved with the token ids it
 * covers. A new request resumes from the saved state sharing
 * the longest prefix with its prompt that is reachable: restore, then roll back to the match
 * when it lies below the saved length (at most max_rollback tokens). Entries are evicted least
 * recently used beyond cache_bytes.
 *
 * Threads: dsv4_lanes_start runs steps on a thread of its own; clients submit requests and
 * wait on them from any thread. Tests may instead call dsv4_lanes_step directly. */
#ifndef DSV4_SERVE_LANES_H
#define DSV4_SERVE_LANES_H

#include <pthread.h>
#include "dsv4.h"
#include "serve/draft.h"
#include "serve/draft_policy.h"
#include "serve/sampler.h"
#include "text/tokmask.h"

typedef struct dsv4_lanes dsv4_lanes;

typedef struct dsv4_lanes_opts {
    int n_lanes;          /* concurrent sequences; 0: 4 */
    int prefill_chunk;    /* prompt tokens one lane feeds per step; 0: 64 */
    int step_tokens;      /* tokens one step feeds over all lanes; 0: 256 */
    int queue_max;        /* waiting requests before submit refuses; 0: 64 */
    size_t cache_bytes;   /* prompt cache budget; 0: no cache */
    int max_rollback;     /* as loaded (dsv4_load_opts.max_rollback); 0: 256 */
    int snapshot_every;   /* prompt tokens between cached states while prefilling; 0: 1024 */
    int n_threads;        /* OpenMP threads of the scheduler thread (forward, sampling); 0: default */
    /* called whenever a request gains tokens or finishes, with the lanes lock held: it may only
     * signal (write an eventfd, set a flag), never call back into the lanes */
    void (*notify)(void *ctx);
    void *notify_ctx;
    int drafter;          /* what proposes a drafting request's tokens: DSV4_DRAFTER_* */
    /* the draft policy (serve/draft_policy.h): a verify row's cost as a fraction of a step
     * (0: DSV4_POLICY_ROW_COST), and the busy lanes past which no lane drafts (0: no bound) */
    double draft_row_cost;
    int draft_busy_max;
} dsv4_lanes_opts;

/* Drafters: prompt lookup (any checkpoint), the V4.1 checkpoint's DSpark stages (its block,
 * at most the request's "draft" tokens of it) or the V4 checkpoint's MTP stage (chained for the
 * request's "draft" tokens); dsv4_lanes_new refuses a model-drafter the model lacks. */
enum { DSV4_DRAFTER_LOOKUP = 0, DSV4_DRAFTER_DSPARK = 1, DSV4_DRAFTER_MTP = 2 };

enum {
    DSV4_FINISH_NONE = 0,
    DSV4_FINISH_STOP,      /* a stop id (or EOS, or the constraint's end) was sampled; it is the last output token */
    DSV4_FINISH_LENGTH,    /* max_tokens reached */
    DSV4_FINISH_CANCELLED, /* the client cancelled (disconnect, stop string, shutdown) */
    DSV4_FINISH_ERROR,
};

typedef struct dsv4_request {
    /* inputs: set before submit, read-only afterwards */
    int32_t *prompt;       /* owned (freed with the request) */
    int n_prompt;
    dsv4_sample_params sp; /* bias arrays owned */
    int max_tokens;        /* tokens to generate; 0 allowed (prompt only) */
    int32_t *stop_ids;     /* owned */
    int n_stop_ids;
    int use_cache;         /* resume from / save to the prompt cache */
    int prompt_logprobs;   /* also score every prompt token (implies no cache resume) */
    int32_t *forced;       /* owned; when set, the output is these n_forced tokens (teacher forcing):
                            * each is scored (dsv4_score: logprob, top alternatives) instead of
                            * sampled; max_tokens must equal n_forced */
    int n_forced;
    int draft;             /* proposal length per step, 0..DSV4_DRAFT_MAX (0: none) */
    dsv4_constraint *constraint; /* owned; when set, every token is drawn under its mask (sampler
                            * step 2) and advances it; it starts at its grammar's start (not with
                            * forced tokens). Its state is the request's alone, so a constrained
                            * request gives the same tokens solo, beside others and resumed. The
                            * constraint's end-of-sequence id finishes the request (STOP). */

    /* outputs: guarded by the lanes lock; wait with dsv4_request_wait */
    dsv4_sample_out *out;  /* generated tokens */
    int n_out, cap_out;
    dsv4_sample_out *prompt_lp; /* [n_prompt] prompt[i] scored given prompt[0..i) (logprob and
                                 * sp.n_top_logprobs alternatives); [0] has logprob NAN */
    int n_prompt_lp;
    int n_cached;          /* prompt tokens served from the cache */
    int finish;            /* DSV4_FINISH_*; NONE while running */
    char errmsg[256];
    double t_submit, t_start, t_first, t_done; /* dsv4_now() seconds */
    int64_t draft_steps, draft_proposed, draft_kept; /* drafted steps, proposed and kept tokens */
    dsv4_draft_policy policy; /* this request's rounds: per proposal position, how often reached and kept */

    /* private */
    int cancel, refs;
    pthread_cond_t cv;
    dsv4_lanes *owner;
} dsv4_request;

dsv4_lanes *dsv4_lanes_new(dsv4_model *m, const dsv4_lanes_opts *o, dsv4_err *err);
/* Stops the thread (if started), cancels everything in flight, frees lanes and cache.
 * Callers release their submitted requests first (a request refers to its lanes' lock). */
void dsv4_lanes_free(dsv4_lanes *l);

/* A request with copies of prompt; defaults: default sampling, max_tokens 16, cache on. */
dsv4_request *dsv4_request_new(const int32_t *prompt, int n_prompt, dsv4_err *err);
/* Drops the caller's reference (cancelling first when still running). */
void dsv4_request_release(dsv4_request *r);

/* Queues r (the lanes take a reference). DSV4_E_STATE when the queue is full (a later submit of
 * the same request may succeed), DSV4_E_CLOSED when the lanes are shutting down; DSV4_E_ARG for
 * a prompt that is empty or does not fit the context, or a negative max_tokens. */
int dsv4_lanes_submit(dsv4_lanes *l, dsv4_request *r, dsv4_err *err);
/* Asks the lanes to stop r; its lane is freed at the next step, its queue slot at once. */
void dsv4_request_cancel(dsv4_request *r);
/* Waits until r has output tokens past n_seen or has finished, or timeout_s passes; copies
 * at most max new tokens (from index n_seen) into dst and returns how many. *finish is set
 * (non-zero) only once every output token up to the end has been copied. */
int dsv4_request_take(dsv4_request *r, int n_seen, int max, dsv4_sample_out *dst, double timeout_s, int *finish);
/* 1 when r has output tokens past n_seen, or has finished; never waits. */
int dsv4_request_ready(dsv4_request *r, int n_seen);

/* One step of the scheduler. Returns the number of lanes that took part (0: nothing to do),
 * or -1 with err set on a forward failure (the requests in that step finish with an error). */
int dsv4_lanes_step(dsv4_lanes *l, dsv4_err *err);
/* Runs steps on a background thread until dsv4_lanes_free / dsv4_lanes_shutdown. */
int dsv4_lanes_start(dsv4_lanes *l, dsv4_err *err);
/* Refuses new requests and cancels queued and running ones (graceful stop on SIGTERM). */
void dsv4_lanes_shutdown(dsv4_lanes *l);

typedef struct dsv4_lanes_stats {
    int n_lanes, busy, queued;
    uint64_t requests, prompt_tokens, cached_tokens, generated_tokens, steps;
    uint64_t draft_proposed, draft_kept;
    uint64_t draft_reached_at[DSV4_DRAFT_MAX], draft_kept_at[DSV4_DRAFT_MAX]; /* per proposal position */
    uint64_t draft_off_busy, draft_off_host; /* steps in which the policy kept drafting lanes from drafting */
    size_t cache_entries, cache_bytes;
    double busy_seconds;
} dsv4_lanes_stats;
void dsv4_lanes_get_stats(dsv4_lanes *l, dsv4_lanes_stats *st);

#endif
