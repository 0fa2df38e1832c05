/* lanes — continuous batching over one model, and the prompt cache. See lanes.h. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "core/core.h"
#include "serve/lanes.h"

typedef struct cache_entry {
    int32_t *ids;          /* the tokens the state covers */
    int n;
    void *buf;             /* dsv4_seq_save bytes */
    size_t len;
    uint64_t tick;         /* last use, for LRU */
} cache_entry;

typedef struct lane {
    dsv4_seq *seq;
    dsv4_request *req;
    dsv4_sampler smp;
    int fed;               /* prompt tokens fed so far */
    int32_t *ids;          /* [cap] tokens in seq, for the cache key */
    int n_ids, cap_ids;
    int32_t next;          /* sampled, to be fed at the next step */
    int decoding;
    /* this step's plan */
    int n_feed;
    const int32_t *feed;
    int32_t dfeed[1 + DSV4_DRAFT_MAX]; /* a drafting lane's rows: its next token, then the proposal */
    int spec_k;            /* DSpark: tokens of its block to propose, drafted outside the lock */
    dsv4_sample_out draws[1 + DSV4_DRAFT_MAX];
    int n_draws;
} lane;

struct dsv4_lanes {
    dsv4_model *m;
    dsv4_lanes_opts o;
    int vocab;
    int64_t max_pos;
    lane *lanes;
    pthread_mutex_t mu;
    pthread_cond_t work;   /* signalled on submit, cancel and shutdown */
    dsv4_request **queue;  /* FIFO ring of queue_max */
    int q_head, q_n;
    int closing, stop, started;
    pthread_t thread;
    cache_entry *cache;
    int n_cache, cap_cache;
    size_t cache_used;
    uint64_t tick;
    dsv4_lanes_stats st;
    float *logits;         /* [n_lanes, vocab] last-token logits of one step */
    float *all_logits;     /* [step_tokens, vocab] for prompt scoring, allocated on demand */
    size_t all_cap;
    double *score_work;    /* [vocab] scratch for scoring */
};

/* ---- requests ---------------------------------------------------------------------- */

dsv4_request *dsv4_request_new(const int32_t *prompt, int n_prompt, dsv4_err *err)
{
    dsv4_request *r = dsv4_xcalloc(1, sizeof *r, err);
    if (!r)
        return NULL;
    r->prompt = dsv4_xmalloc((size_t)(n_prompt > 0 ? n_prompt : 1) * sizeof *r->prompt, err);
    if (!r->prompt) {
        free(r);
        return NULL;
    }
    if (n_prompt > 0)
        memcpy(r->prompt, prompt, (size_t)n_prompt * sizeof *prompt);
    r->n_prompt = n_prompt;
    dsv4_sample_params_default(&r->sp);
    r->max_tokens = 16;
    r->use_cache = 1;
    r->refs = 1;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
    return r;
}

/* Frees r and everything it owns (its last reference is gone). */
static void request_free(dsv4_request *r)
{
    pthread_cond_destroy(&r->cv);
    free(r->prompt);
    free((void *)r->sp.bias_ids);
    free((void *)r->sp.bias_vals);
    free(r->stop_ids);
    free(r->out);
    free(r->prompt_lp);
    free(r->forced);
    dsv4_constraint_free(r->constraint);
    free(r);
}

static void finish_locked(dsv4_lanes *l, dsv4_request *r, int why);
static void unqueue_locked(dsv4_lanes *l, dsv4_request *r);

/* Drops one reference; with the lanes lock held when r has an owner. */
static void unref_locked(dsv4_request *r)
{
    if (--r->refs == 0)
        request_free(r);
}

void dsv4_request_release(dsv4_request *r)
{
    if (!r)
        return;
    dsv4_lanes *l = r->owner;
    if (!l) {
        unref_locked(r);
        return;
    }
    pthread_mutex_lock(&l->mu);
    if (!r->finish) {
        r->cancel = 1;
        unqueue_locked(l, r);
        pthread_cond_signal(&l->work);
    }
    unref_locked(r);
    pthread_mutex_unlock(&l->mu);
}

/* Takes r out of the queue when it waits there, so a client that left gives its slot back
 * before a lane frees. Lock held. */
static void unqueue_locked(dsv4_lanes *l, dsv4_request *r)
{
    int Q = l->o.queue_max;
    for (int k = 0; k < l->q_n; k++) {
        if (l->queue[(l->q_head + k) % Q] != r)
            continue;
        for (int m = k; m + 1 < l->q_n; m++)
            l->queue[(l->q_head + m) % Q] = l->queue[(l->q_head + m + 1) % Q];
        l->q_n--;
        finish_locked(l, r, DSV4_FINISH_CANCELLED);
        return;
    }
}

void dsv4_request_cancel(dsv4_request *r)
{
    dsv4_lanes *l = r->owner;
    if (!l)
        return;
    pthread_mutex_lock(&l->mu);
    r->cancel = 1;
    if (!r->finish)
        unqueue_locked(l, r);
    pthread_cond_signal(&l->work);
    pthread_mutex_unlock(&l->mu);
}

int dsv4_request_ready(dsv4_request *r, int n_seen)
{
    dsv4_lanes *l = r->owner;
    if (!l)
        return 1;
    pthread_mutex_lock(&l->mu);
    int ready = r->n_out > n_seen || r->finish;
    pthread_mutex_unlock(&l->mu);
    return ready;
}

int dsv4_request_take(dsv4_request *r, int n_seen, int max, dsv4_sample_out *dst, double timeout_s, int *finish)
{
    dsv4_lanes *l = r->owner;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double end = ts.tv_sec + ts.tv_nsec * 1e-9 + timeout_s;
    ts.tv_sec = (time_t)end;
    ts.tv_nsec = (long)((end - (double)ts.tv_sec) * 1e9);
    pthread_mutex_lock(&l->mu);
    while (r->n_out <= n_seen && !r->finish)
        if (pthread_cond_timedwait(&r->cv, &l->mu, &ts) == ETIMEDOUT)
            break;
    int n = r->n_out - n_seen;
    n = n < 0 ? 0 : n < max ? n : max;
    if (n > 0)
        memcpy(dst, r->out + n_seen, (size_t)n * sizeof *dst);
    *finish = n_seen + n == r->n_out ? r->finish : 0;
    pthread_mutex_unlock(&l->mu);
    return n;
}

/* ---- prompt cache (all with the lock held) ------------------------------------------ */

/* Removes cache entry i (order is not kept). Lock held. */
static void cache_drop(dsv4_lanes *l, int i)
{
    l->cache_used -= l->cache[i].len;
    free(l->cache[i].ids);
    free(l->cache[i].buf);
    l->cache[i] = l->cache[--l->n_cache];
}

/* Saves lane's state under its ids; replaces an entry with the same ids; evicts LRU. */
static void cache_put(dsv4_lanes *l, lane *ln)
{
    if (!l->o.cache_bytes || ln->n_ids == 0)
        return;
    for (int i = 0; i < l->n_cache; i++)
        if (l->cache[i].n == ln->n_ids && !memcmp(l->cache[i].ids, ln->ids, (size_t)ln->n_ids * sizeof *ln->ids)) {
            l->cache[i].tick = ++l->tick;
            return;
        }
    dsv4_err err = {0};
    void *buf;
    size_t len;
    if (dsv4_seq_save(ln->seq, &buf, &len, &err))
        return; /* a cache miss later is the only consequence */
    if (len > l->o.cache_bytes) {
        free(buf);
        return;
    }
    while (l->n_cache && l->cache_used + len > l->o.cache_bytes) {
        int old = 0;
        for (int i = 1; i < l->n_cache; i++)
            if (l->cache[i].tick < l->cache[old].tick)
                old = i;
        cache_drop(l, old);
    }
    if (l->n_cache == l->cap_cache) {
        int cap = l->cap_cache ? 2 * l->cap_cache : 16;
        cache_entry *c = realloc(l->cache, (size_t)cap * sizeof *c);
        if (!c) {
            free(buf);
            return;
        }
        l->cache = c;
        l->cap_cache = cap;
    }
    int32_t *ids = malloc((size_t)ln->n_ids * sizeof *ids);
    if (!ids) {
        free(buf);
        return;
    }
    memcpy(ids, ln->ids, (size_t)ln->n_ids * sizeof *ids);
    l->cache[l->n_cache++] = (cache_entry){ids, ln->n_ids, buf, len, ++l->tick};
    l->cache_used += len;
}

/* Resets lane's sequence to the best cached state for r's prompt (or empty). Returns the
 * number of prompt tokens now in the sequence. */
static int cache_resume(dsv4_lanes *l, lane *ln, const dsv4_request *r)
{
    dsv4_err err = {0};
    int best = -1, best_c = 0;
    /* at least one prompt token must be fed, for the logits of the first new token */
    const int limit = r->n_prompt - 1;
    for (int i = 0; r->use_cache && !r->prompt_logprobs && i < l->n_cache; i++) {
        const cache_entry *e = &l->cache[i];
        int c = 0, lim = e->n < limit ? e->n : limit;
        while (c < lim && e->ids[c] == r->prompt[c])
            c++;
        if (c > 0 && c >= e->n - l->o.max_rollback && c > best_c) {
            best = i;
            best_c = c;
        }
    }
    if (best >= 0) {
        cache_entry *e = &l->cache[best];
        if (!dsv4_seq_restore(ln->seq, e->buf, e->len, &err) && !dsv4_seq_truncate(ln->seq, best_c, &err)) {
            e->tick = ++l->tick;
            memcpy(ln->ids, e->ids, (size_t)best_c * sizeof *ln->ids);
            ln->n_ids = best_c;
            return best_c;
        }
    }
    ln->n_ids = 0;
    if (dsv4_seq_len(ln->seq) == 0 || !dsv4_seq_truncate(ln->seq, 0, &err))
        return 0;
    dsv4_seq *fresh = dsv4_seq_new(l->m, &err);
    if (fresh) {
        dsv4_seq_free(ln->seq);
        ln->seq = fresh;
    }
    return 0;
}

/* ---- lanes ------------------------------------------------------------------------- */

dsv4_lanes *dsv4_lanes_new(dsv4_model *m, const dsv4_lanes_opts *o, dsv4_err *err)
{
    dsv4_lanes *l = dsv4_xcalloc(1, sizeof *l, err);
    if (!l)
        return NULL;
    l->m = m;
    l->o = *o;
    if (l->o.n_lanes <= 0)
        l->o.n_lanes = 4;
    if (l->o.prefill_chunk <= 0)
        l->o.prefill_chunk = 64;
    if (l->o.step_tokens <= 0)
        l->o.step_tokens = 256;
    if (l->o.step_tokens < l->o.n_lanes)
        l->o.step_tokens = l->o.n_lanes;
    if (l->o.queue_max <= 0)
        l->o.queue_max = 64;
    if (l->o.max_rollback <= 0)
        l->o.max_rollback = 256;
    if (l->o.snapshot_every <= 0)
        l->o.snapshot_every = 1024;
    dsv4_model_info mi;
    dsv4_model_get_info(m, &mi);
    l->vocab = mi.vocab_size;
    l->max_pos = mi.max_position;
    if ((l->o.drafter == DSV4_DRAFTER_DSPARK && !dsv4_spec_block(m)) || (l->o.drafter == DSV4_DRAFTER_MTP && !dsv4_mtp_on(m))) {
        int32_t x[1];
        if (l->o.drafter == DSV4_DRAFTER_DSPARK) /* says why */
            dsv4_spec_draft(m, NULL, 0, x, NULL, NULL, err);
        else
            dsv4_mtp_draft(m, NULL, 0, 1, x, err);
        free(l);
        return NULL;
    }
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->work, NULL);
    l->st.n_lanes = l->o.n_lanes;
    l->lanes = dsv4_xcalloc((size_t)l->o.n_lanes, sizeof *l->lanes, err);
    l->queue = dsv4_xcalloc((size_t)l->o.queue_max, sizeof *l->queue, err);
    l->logits = dsv4_xmalloc((size_t)l->o.n_lanes * l->vocab * sizeof *l->logits, err);
    l->score_work = dsv4_xmalloc((size_t)l->vocab * sizeof *l->score_work, err);
    if (!l->lanes || !l->queue || !l->logits || !l->score_work) {
        dsv4_lanes_free(l);
        return NULL;
    }
    for (int i = 0; i < l->o.n_lanes; i++)
        if (!(l->lanes[i].seq = dsv4_seq_new(m, err)) ||
            dsv4_sampler_init(&l->lanes[i].smp, l->vocab, NULL, 0, err)) {
            dsv4_lanes_free(l);
            return NULL;
        }
    return l;
}

/* Marks r finished, wakes its waiters and drops the lanes' reference. Lock held. */
static void finish_locked(dsv4_lanes *l, dsv4_request *r, int why)
{
    if (!r->finish) {
        r->finish = why;
        r->t_done = dsv4_now();
    }
    pthread_cond_broadcast(&r->cv);
    unref_locked(r);
    if (l->o.notify)
        l->o.notify(l->o.notify_ctx);
}

/* Ends lane's request, saving its state for later turns. */
static void retire_locked(dsv4_lanes *l, lane *ln, int why)
{
    if (why != DSV4_FINISH_ERROR && ln->req->use_cache)
        cache_put(l, ln);
    finish_locked(l, ln->req, why);
    ln->req = NULL;
}

void dsv4_lanes_shutdown(dsv4_lanes *l)
{
    pthread_mutex_lock(&l->mu);
    l->closing = 1;
    while (l->q_n) {
        dsv4_request *r = l->queue[l->q_head];
        l->q_head = (l->q_head + 1) % l->o.queue_max;
        l->q_n--;
        finish_locked(l, r, DSV4_FINISH_CANCELLED);
    }
    for (int i = 0; i < l->o.n_lanes; i++)
        if (l->lanes[i].req)
            l->lanes[i].req->cancel = 1;
    pthread_cond_broadcast(&l->work);
    pthread_mutex_unlock(&l->mu);
}

void dsv4_lanes_free(dsv4_lanes *l)
{
    if (!l)
        return;
    if (l->lanes && l->queue)
        dsv4_lanes_shutdown(l);
    if (l->started) {
        pthread_mutex_lock(&l->mu);
        l->stop = 1;
        pthread_cond_broadcast(&l->work);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->thread, NULL);
    }
    for (int i = 0; l->lanes && i < l->o.n_lanes; i++) {
        lane *ln = &l->lanes[i];
        if (ln->req)
            retire_locked(l, ln, DSV4_FINISH_CANCELLED);
        dsv4_seq_free(ln->seq);
        dsv4_sampler_free(&ln->smp);
        free(ln->ids);
    }
    while (l->n_cache)
        cache_drop(l, 0);
    free(l->cache);
    free(l->lanes);
    free(l->queue);
    free(l->logits);
    free(l->all_logits);
    free(l->score_work);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->work);
    free(l);
}

int dsv4_lanes_submit(dsv4_lanes *l, dsv4_request *r, dsv4_err *err)
{
    if (r->n_prompt <= 0)
        return dsv4_fail(err, DSV4_E_ARG, "the prompt is empty");
    if (r->max_tokens < 0)
        return dsv4_fail(err, DSV4_E_ARG, "max_tokens is negative (%d)", r->max_tokens);
    if ((int64_t)r->n_prompt + r->max_tokens > l->max_pos)
        return dsv4_fail(err, DSV4_E_ARG, "the prompt (%d tokens) plus max_tokens (%d) exceeds the context of %lld tokens",
                         r->n_prompt, r->max_tokens, (long long)l->max_pos);
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= l->vocab)
            return dsv4_fail(err, DSV4_E_ARG, "prompt token %d (id %d) is outside the vocabulary of %d", i, r->prompt[i], l->vocab);
    if (r->forced) {
        if (r->n_forced <= 0 || r->n_forced != r->max_tokens)
            return dsv4_fail(err, DSV4_E_ARG, "forced tokens: give at least one, with max_tokens equal to their number");
        for (int i = 0; i < r->n_forced; i++)
            if (r->forced[i] < 0 || r->forced[i] >= l->vocab)
                return dsv4_fail(err, DSV4_E_ARG, "forced token %d (id %d) is outside the vocabulary of %d", i, r->forced[i], l->vocab);
    }
    if (r->forced && r->constraint)
        return dsv4_fail(err, DSV4_E_ARG, "forced tokens and a constraint cannot be combined");
    if (r->prompt_logprobs && !r->prompt_lp) { /* kept over resubmissions after a full queue */
        r->prompt_lp = dsv4_xmalloc((size_t)r->n_prompt * sizeof *r->prompt_lp, err);
        if (!r->prompt_lp)
            return err->code;
        r->prompt_lp[0] = (dsv4_sample_out){.id = r->prompt[0], .logprob = NAN};
        r->n_prompt_lp = 1;
    }
    pthread_mutex_lock(&l->mu);
    if (l->closing) {
        pthread_mutex_unlock(&l->mu);
        return dsv4_fail(err, DSV4_E_CLOSED, "the server is shutting down");
    }
    if (l->q_n == l->o.queue_max) {
        pthread_mutex_unlock(&l->mu);
        return dsv4_fail(err, DSV4_E_STATE, "the request queue is full (%d waiting)", l->o.queue_max);
    }
    r->owner = l;
    r->refs++;
    r->t_submit = dsv4_now();
    l->queue[(l->q_head + l->q_n) % l->o.queue_max] = r;
    l->q_n++;
    pthread_cond_signal(&l->work);
    pthread_mutex_unlock(&l->mu);
    return 0;
}

/* Grows the lane's id list to hold n tokens (sized in 64 bits: n comes from request fields). */
static int ensure_ids(lane *ln, int64_t n)
{
    if (n <= ln->cap_ids)
        return 0;
    if (n > INT_MAX)
        return -1;
    int64_t cap = ln->cap_ids ? ln->cap_ids : 256;
    while (cap < n)
        cap *= 2;
    if (cap > INT_MAX)
        cap = INT_MAX;
    int32_t *p = realloc(ln->ids, (size_t)cap * sizeof *p);
    if (!p)
        return -1;
    ln->ids = p;
    ln->cap_ids = (int)cap;
    return 0;
}

/* Takes queued requests into free lanes and retires cancelled ones. Lock held. */
static void admit_locked(dsv4_lanes *l)
{
    for (int i = 0; i < l->o.n_lanes; i++) {
        lane *ln = &l->lanes[i];
        if (ln->req && ln->req->cancel)
            retire_locked(l, ln, DSV4_FINISH_CANCELLED);
    }
    for (int i = 0; i < l->o.n_lanes && l->q_n; i++) {
        lane *ln = &l->lanes[i];
        if (ln->req)
            continue;
        dsv4_request *r = l->queue[l->q_head];
        l->q_head = (l->q_head + 1) % l->o.queue_max;
        l->q_n--;
        if (r->cancel) {
            finish_locked(l, r, DSV4_FINISH_CANCELLED);
            i--;
            continue;
        }
        if (ensure_ids(ln, (int64_t)r->n_prompt + 1)) {
            snprintf(r->errmsg, sizeof r->errmsg, "out of memory starting the request");
            finish_locked(l, r, DSV4_FINISH_ERROR);
            i--;
            continue;
        }
        dsv4_sampler_reset(&ln->smp, r->prompt, r->n_prompt);
        ln->req = r;
        r->t_start = dsv4_now();
        ln->fed = r->n_cached = cache_resume(l, ln, r);
        ln->decoding = 0;
        l->st.requests++;
        l->st.prompt_tokens += (uint64_t)r->n_prompt;
        l->st.cached_tokens += (uint64_t)r->n_cached;
    }
}

/* Samples at position pos under the request's constraint (its mask, then its state takes the
 * token). */
static int sample_constrained(lane *ln, dsv4_request *r, const float *row, int64_t pos, dsv4_sample_out *o, dsv4_err *err)
{
    dsv4_sample_params sp = r->sp;
    sp.allow = dsv4_constraint_next_mask(r->constraint, err);
    if (!sp.allow)
        return err->code;
    int rc = dsv4_sample(&ln->smp, &sp, row, pos, o, err);
    return rc ? rc : dsv4_constraint_accept(r->constraint, o->id, err);
}

/* Records one sampled token; returns a finish reason or NONE. Lock held. */
static int take_token_locked(dsv4_lanes *l, lane *ln, const dsv4_sample_out *o)
{
    dsv4_request *r = ln->req;
    if (r->n_out == r->cap_out) {
        int cap = r->cap_out ? 2 * r->cap_out : 32;
        dsv4_sample_out *p = realloc(r->out, (size_t)cap * sizeof *p);
        if (!p) {
            snprintf(r->errmsg, sizeof r->errmsg, "out of memory");
            return DSV4_FINISH_ERROR;
        }
        r->out = p;
        r->cap_out = cap;
    }
    if (!r->n_out)
        r->t_first = dsv4_now();
    r->out[r->n_out++] = *o;
    l->st.generated_tokens++;
    pthread_cond_broadcast(&r->cv);
    if (l->o.notify)
        l->o.notify(l->o.notify_ctx);
    int stop = 0;
    for (int i = 0; i < r->n_stop_ids; i++)
        stop |= o->id == r->stop_ids[i];
    stop |= r->constraint && dsv4_constraint_ended(r->constraint); /* its end-of-sequence id, stop ids or not */
    /* forced tokens all go through; the last one's being a stop id says why it ended */
    if (stop && (!r->forced || r->n_out == r->n_forced))
        return DSV4_FINISH_STOP;
    if (r->n_out >= r->max_tokens || dsv4_seq_len(ln->seq) + 1 >= l->max_pos)
        return DSV4_FINISH_LENGTH;
    return DSV4_FINISH_NONE;
}

/* A decoding lane's proposal for this step into ln->dfeed (after its next token); returns its
 * length. No proposal where it could not be kept: past max_tokens or the context, beyond the
 * rollback reach, or over the step's token budget. Lock held. */
static int plan_draft(dsv4_lanes *l, lane *ln, int budget, int allow)
{
    dsv4_request *r = ln->req;
    if (r->draft <= 0 || r->forced)
        return 0;
    if (allow != DSV4_DRAFT_ON) {
        l->st.draft_off_busy += allow == DSV4_DRAFT_OFF_BUSY;
        l->st.draft_off_host += allow == DSV4_DRAFT_OFF_HOST_EXPERTS;
        return 0;
    }
    int64_t k = dsv4_policy_depth(&r->policy, r->draft, l->o.draft_row_cost);
    if (k == 0) { /* held back: the round still counts towards the next probe */
        dsv4_policy_record(&r->policy, 0, 0);
        return 0;
    }
    /* room: the context check of take_token_locked then sees what plain steps would */
    int64_t left = (int64_t)r->max_tokens - r->n_out - 1, room = l->max_pos - 3 - dsv4_seq_len(ln->seq);
    int reach = l->o.max_rollback ? l->o.max_rollback : 256;
    k = k < left ? k : left;
    k = k < room ? k : room;
    k = k < reach ? k : reach;
    k = k < budget ? k : budget;
    if (l->o.drafter != DSV4_DRAFTER_LOOKUP) {
        int B = l->o.drafter == DSV4_DRAFTER_DSPARK ? dsv4_spec_block(l->m) : DSV4_DRAFT_MAX;
        k = k < B ? k : B;
        ln->spec_k = k > 0 ? (int)k : 0;
        ln->dfeed[0] = ln->next;
        return ln->spec_k;
    }
    if (k <= 0 || ensure_ids(ln, (int64_t)ln->n_ids + 1))
        return 0;
    ln->ids[ln->n_ids] = ln->next; /* the context as lookup reads it: the sequence, then next */
    ln->dfeed[0] = ln->next;
    return dsv4_lookup_draft(ln->ids, ln->n_ids + 1, 1, 3, (int)k, ln->dfeed + 1);
}

/* Draws a drafting lane's rows in order (row t at position L + 1 + t for a sequence of L
 * tokens before the step, as plain steps draw; under the request's constraint when it has one),
 * each recorded in the penalty history (and the constraint) before the next, until one differs
 * from the proposal, is a stop id, ends the constraint, or is the last token the request may
 * take. Returns 0 or an error code (message in se). */
static int draw_rows(lane *ln, const float *row0, int V, dsv4_err *se)
{
    dsv4_request *r = ln->req;
    int nd = ln->n_feed - 1;
    int64_t L0 = dsv4_seq_len(ln->seq) - ln->n_feed;
    ln->n_draws = 0;
    for (int t = 0; t <= nd; t++) {
        dsv4_sample_out *o = &ln->draws[t];
        const float *row = row0 + (size_t)t * V;
        int rc = r->constraint ? sample_constrained(ln, r, row, L0 + 1 + t, o, se)
                               : dsv4_sample(&ln->smp, &r->sp, row, L0 + 1 + t, o, se);
        if (rc)
            return rc;
        dsv4_sampler_accept(&ln->smp, o->id);
        ln->n_draws = t + 1;
        int stop = r->constraint && dsv4_constraint_ended(r->constraint);
        for (int i = 0; i < r->n_stop_ids; i++)
            stop |= o->id == r->stop_ids[i];
        if (t == nd || o->id != ln->dfeed[1 + t] || stop || r->n_out + t + 1 >= r->max_tokens)
            break;
    }
    return 0;
}

/* A drafting lane after its draws: the sequence rolled back to its next token and the kept
 * proposal (the final draw is fed by the next step, as a plain step's draw is), the draws taken
 * in order until one finishes the request (which ends with an error when the rollback fails).
 * Lock held. */
static void commit_draws(dsv4_lanes *l, lane *ln)
{
    dsv4_request *r = ln->req;
    dsv4_err err = {0};
    int nd = ln->n_feed - 1, keep = ln->n_draws; /* rows kept: next and the draws' matches */
    int64_t L0 = dsv4_seq_len(ln->seq) - ln->n_feed;
    if (keep < ln->n_feed && dsv4_seq_truncate(ln->seq, L0 + keep, &err)) {
        snprintf(r->errmsg, sizeof r->errmsg, "%.200s", err.msg);
        retire_locked(l, ln, DSV4_FINISH_ERROR);
        return;
    }
    if (ensure_ids(ln, (int64_t)ln->n_ids + keep)) {
        snprintf(r->errmsg, sizeof r->errmsg, "out of memory");
        retire_locked(l, ln, DSV4_FINISH_ERROR);
        return;
    }
    memcpy(ln->ids + ln->n_ids, ln->dfeed, (size_t)keep * sizeof *ln->ids);
    ln->n_ids += keep;
    int kept = ln->n_draws - 1 + (ln->n_draws - 1 < nd && ln->draws[ln->n_draws - 1].id == ln->dfeed[ln->n_draws]);
    r->draft_steps++;
    r->draft_proposed += nd;
    r->draft_kept += kept;
    l->st.draft_proposed += (uint64_t)nd;
    l->st.draft_kept += (uint64_t)kept;
    dsv4_policy_record(&r->policy, nd, kept);
    for (int i = 0; i < nd && i <= kept; i++) {
        l->st.draft_reached_at[i]++;
        l->st.draft_kept_at[i] += i < kept;
    }
    for (int t = 0; t < ln->n_draws; t++) {
        int why = take_token_locked(l, ln, &ln->draws[t]);
        ln->next = ln->draws[t].id;
        if (why) {
            retire_locked(l, ln, why);
            break;
        }
    }
}

int dsv4_lanes_step(dsv4_lanes *l, dsv4_err *err)
{
    const int L = l->o.n_lanes, V = l->vocab;
    pthread_mutex_lock(&l->mu);
    admit_locked(l);
    /* plan: decoding lanes feed one token, prefilling lanes a chunk within the step budget */
    int budget = l->o.step_tokens, n_busy = 0, n_score = 0, busy = 0;
    for (int i = 0; i < L; i++)
        busy += l->lanes[i].req != NULL;
    int allow = dsv4_policy_allow(busy, l->o.draft_busy_max, dsv4_model_experts_in_host(l->m));
    for (int i = 0; i < L; i++) {
        lane *ln = &l->lanes[i];
        ln->n_feed = 0;
        ln->spec_k = 0;
        if (!ln->req)
            continue;
        n_busy++;
        if (ln->decoding) {
            ln->feed = &ln->next;
            ln->n_feed = 1;
            budget--;
            int nd = plan_draft(l, ln, budget, allow);
            if (nd) {
                ln->feed = ln->dfeed;
                ln->n_feed += nd;
                budget -= nd;
                n_score += 1 + nd;
            }
        }
    }
    for (int i = 0; i < L; i++) {
        lane *ln = &l->lanes[i];
        if (!ln->req || ln->decoding)
            continue;
        int n = ln->req->n_prompt - ln->fed;
        n = n < l->o.prefill_chunk ? n : l->o.prefill_chunk;
        n = n < budget ? n : budget;
        /* chunks end on snapshot boundaries, so snapshots sit at multiples of snapshot_every */
        int to_snap = l->o.snapshot_every - ln->fed % l->o.snapshot_every;
        n = n < to_snap ? n : to_snap;
        if (n <= 0)
            continue;
        ln->feed = ln->req->prompt + ln->fed;
        ln->n_feed = n;
        budget -= n;
        n_score += ln->req->prompt_logprobs ? n : 0;
    }
    pthread_mutex_unlock(&l->mu);
    if (!n_busy)
        return 0;
    /* model-drafting lanes draft now (only this thread touches a lane's sequence); a draft
     * that fails or comes out short leaves the lane that much of a plain step */
    for (int i = 0; i < L; i++) {
        lane *ln = &l->lanes[i];
        int32_t blk[DSV4_MAX_SPEC_BLOCK + 1];
        dsv4_err de = {0};
        if (!ln->spec_k)
            continue;
        int got = ln->spec_k;
        if (l->o.drafter == DSV4_DRAFTER_DSPARK) {
            if (dsv4_spec_draft(l->m, ln->seq, ln->next, blk, NULL, NULL, &de))
                got = 0;
            else
                memcpy(ln->dfeed + 1, blk + 1, (size_t)got * sizeof *blk);
        } else {
            got = dsv4_mtp_draft(l->m, ln->seq, ln->next, ln->spec_k, ln->dfeed + 1, &de);
            got = got > 0 ? got : 0;
        }
        n_score -= ln->spec_k - got + (got == 0);
        ln->n_feed = 1 + got;
        if (!got)
            ln->feed = &ln->next;
    }

    /* two forwards at most: one for last-token logits, one with every row for lanes that
     * score their prompt (rows do not depend on the batch, so the split changes nothing) */
    double t0 = dsv4_now();
    dsv4_seq *seqs[2][L];
    const int32_t *ids[2][L];
    int nids[2][L], who[2][L], ns[2] = {0, 0};
    for (int i = 0; i < L; i++) {
        lane *ln = &l->lanes[i];
        if (!ln->n_feed)
            continue;
        int g = ln->decoding ? ln->n_feed > 1 : ln->req->prompt_logprobs;
        seqs[g][ns[g]] = ln->seq;
        ids[g][ns[g]] = ln->feed;
        nids[g][ns[g]] = ln->n_feed;
        who[g][ns[g]++] = i;
    }
    if (n_score && (size_t)n_score * V > l->all_cap) {
        free(l->all_logits);
        l->all_logits = dsv4_xmalloc((size_t)n_score * V * sizeof *l->all_logits, err);
        l->all_cap = l->all_logits ? (size_t)n_score * V : 0;
        if (!l->all_logits)
            ns[1] = -1;
    }
    int rc = ns[1] < 0 ? -1 : 0;
    float *row_of[L], *row0[L]; /* each lane's last-token logits, and its first row's (all-row lanes) */
    for (int g = 0; g < 2 && !rc; g++) {
        if (ns[g] <= 0)
            continue;
        dsv4_batch b = {.n_seqs = ns[g], .seqs = seqs[g], .ids = ids[g], .n_ids = nids[g], .all_logits = g,
                        .logits = g ? l->all_logits : l->logits};
        rc = dsv4_forward(l->m, &b, err);
        size_t off = 0;
        for (int k = 0; k < ns[g]; k++) {
            off += (size_t)nids[g][k];
            row_of[who[g][k]] = g ? l->all_logits + (off - 1) * V : l->logits + (size_t)k * V;
            row0[who[g][k]] = g ? l->all_logits + (off - nids[g][k]) * V : row_of[who[g][k]];
        }
    }

    /* sample outside the lock, lanes in parallel (each has its own scratch, and a draw depends
     * only on its row and key): each lane that has just read its prompt or fed a token */
    dsv4_sample_out outs[L];
    int sampled[L], serr[L];
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < L; i++) {
        lane *ln = &l->lanes[i];
        sampled[i] = serr[i] = 0;
        if (rc || !ln->n_feed || (!ln->decoding && ln->fed + ln->n_feed < ln->req->n_prompt) || ln->req->max_tokens == 0)
            continue;
        dsv4_err se = {0};
        dsv4_request *r = ln->req;
        if (r->forced) /* n_out changes only on this thread */
            dsv4_score(row_of[i], V, ln->smp.work, r->forced[r->n_out], r->sp.n_top_logprobs, &outs[i]);
        else if (ln->decoding && ln->n_feed > 1)
            serr[i] = draw_rows(ln, row0[i], V, &se);
        else if (r->constraint)
            serr[i] = sample_constrained(ln, r, row_of[i], dsv4_seq_len(ln->seq), &outs[i], &se);
        else
            serr[i] = dsv4_sample(&ln->smp, &r->sp, row_of[i], dsv4_seq_len(ln->seq), &outs[i], &se);
        if (serr[i])
            snprintf(ln->req->errmsg, sizeof ln->req->errmsg, "%.200s", se.msg);
        sampled[i] = 1;
    }

    pthread_mutex_lock(&l->mu);
    l->st.steps++;
    l->st.busy_seconds += dsv4_now() - t0;
    size_t off = 0;
    for (int k = 0; k < ns[1] && !rc; k++) {
        lane *ln = &l->lanes[who[1][k]];
        dsv4_request *r = ln->req;
        for (int t = 0; t < ln->n_feed && !ln->decoding; t++) {
            int at = ln->fed + t + 1; /* prompt[at] is scored by this row */
            if (at < r->n_prompt)
                dsv4_score(l->all_logits + (off + t) * V, V, l->score_work, r->prompt[at], r->sp.n_top_logprobs,
                           &r->prompt_lp[r->n_prompt_lp++]);
        }
        off += (size_t)ln->n_feed;
    }
    for (int i = 0; i < L; i++) {
        lane *ln = &l->lanes[i];
        if (!ln->n_feed)
            continue;
        dsv4_request *r = ln->req;
        if (rc) {
            snprintf(r->errmsg, sizeof r->errmsg, "%.200s", err->msg);
            /* the sequence may be half-written: start the lane afresh */
            ln->n_ids = 0;
            dsv4_seq *fresh = dsv4_seq_new(l->m, NULL);
            if (fresh) {
                dsv4_seq_free(ln->seq);
                ln->seq = fresh;
            }
            retire_locked(l, ln, DSV4_FINISH_ERROR);
            continue;
        }
        if (ln->decoding && ln->n_feed > 1 && !serr[i]) {
            commit_draws(l, ln);
            continue;
        }
        if (ensure_ids(ln, (int64_t)ln->n_ids + ln->n_feed)) {
            snprintf(r->errmsg, sizeof r->errmsg, "out of memory");
            retire_locked(l, ln, DSV4_FINISH_ERROR);
            continue;
        }
        memcpy(ln->ids + ln->n_ids, ln->feed, (size_t)ln->n_feed * sizeof *ln->ids);
        ln->n_ids += ln->n_feed;
        if (!ln->decoding) {
            ln->fed += ln->n_feed;
            /* a long prompt leaves states every snapshot_every tokens on the way, so a later
             * prompt sharing only part of it resumes from the nearest one at or below the match */
            if (ln->fed < r->n_prompt && ln->fed % l->o.snapshot_every == 0 && r->use_cache)
                cache_put(l, ln);
            if (ln->fed < r->n_prompt)
                continue;
            if (r->use_cache)
                cache_put(l, ln); /* the prompt-end state serves prompts sharing this prefix */
            ln->decoding = 1;
            if (r->max_tokens == 0) {
                retire_locked(l, ln, DSV4_FINISH_LENGTH);
                continue;
            }
        }
        if (serr[i]) {
            retire_locked(l, ln, DSV4_FINISH_ERROR);
            continue;
        }
        if (!sampled[i])
            continue;
        dsv4_sampler_accept(&ln->smp, outs[i].id);
        int why = take_token_locked(l, ln, &outs[i]);
        ln->next = outs[i].id;
        if (why)
            retire_locked(l, ln, why);
    }
    pthread_mutex_unlock(&l->mu);
    return rc ? -1 : n_busy;
}

/* The scheduler thread: steps while there is work, sleeps on `work` otherwise. */
static void *run_thread(void *arg)
{
    dsv4_lanes *l = arg;
    pthread_setname_np(pthread_self(), "dsv4-lanes"); /* for per-thread CPU in tests and top */
    /* OpenMP's thread count is per calling thread: the loader's setting does not reach this one */
    if (l->o.n_threads > 0)
        omp_set_num_threads(l->o.n_threads);
    pthread_mutex_lock(&l->mu);
    while (!l->stop) {
        int busy = l->q_n > 0;
        for (int i = 0; i < l->o.n_lanes && !busy; i++)
            busy = l->lanes[i].req != NULL;
        if (!busy) {
            pthread_cond_wait(&l->work, &l->mu);
            continue;
        }
        pthread_mutex_unlock(&l->mu);
        dsv4_err err = {0};
        if (dsv4_lanes_step(l, &err) < 0)
            dsv4_log("lanes: step failed: %s", err.msg);
        pthread_mutex_lock(&l->mu);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

int dsv4_lanes_start(dsv4_lanes *l, dsv4_err *err)
{
    if (pthread_create(&l->thread, NULL, run_thread, l))
        return dsv4_fail(err, DSV4_E_STATE, "cannot start the scheduler thread");
    l->started = 1;
    return 0;
}

void dsv4_lanes_get_stats(dsv4_lanes *l, dsv4_lanes_stats *st)
{
    pthread_mutex_lock(&l->mu);
    *st = l->st;
    st->queued = l->q_n;
    st->busy = 0;
    for (int i = 0; i < l->o.n_lanes; i++)
        st->busy += l->lanes[i].req != NULL;
    st->cache_entries = (size_t)l->n_cache;
    st->cache_bytes = l->cache_used;
    pthread_mutex_unlock(&l->mu);
}
