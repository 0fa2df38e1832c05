/* http — the OpenAI-compatible server. See http.h.
 *
 * libmicrohttpd runs a small pool of polling threads over epoll, so no handler may block: a
 * generation request, once queued, suspends its connection. The lanes call back on every new
 * token and every finish; a waker thread then resumes the connections whose requests have news
 * (and every idle second a stream's, for its keep-alive comment; and any whose client closed
 * its end, so a client that left frees its lane or queue slot at once). A resumed handler or
 * stream callback takes what is there without waiting and suspends again. The lanes thread
 * does all model work.
 *
 * Every connection is counted by client address: one past the per-client or the total limit
 * closes the idlest idle connection (of that client, or of all) to make room, and when every
 * connection is busy the newcomer's requests get 503. */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "core/core.h"
#include "serve/http.h"
#include "serve/lanes.h"
#include "serve/webui.h"
#include "text/buf.h"
#include "text/chat.h"
#include "text/dsml.h"
#include "text/tokenizer.h"

enum { MAX_BODY = 16 << 20, MAX_STOPS = 16, TAKE = 64, MAX_BATCH = 1024, N_BUCKETS = 12,
       HTTP_THREADS = 4,     /* libmicrohttpd's polling threads */
       REFUSED_SLACK = 128,  /* connections past max_connections that can still be told 503 */
       TICK_MS = 50 };       /* the waker's longest sleep: batch retries, disconnect checks */
static const double ROOM_RETRY_S = 0.02; /* a list of prompts waiting for queue room tries again */

/* Upper bounds (seconds) of the latency histograms' buckets; the last is +Inf. */
static const double bucket_le[N_BUCKETS - 1] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};

/* A Prometheus histogram of seconds, filled from the HTTP threads. */
typedef struct histo {
    atomic_uint_fast64_t count[N_BUCKETS]; /* per bucket, not cumulative */
    _Atomic double sum;
} histo;

typedef struct gen gen;

/* One open connection (libmicrohttpd's socket context). */
typedef struct sock {
    struct sock *prev, *next;
    int fd;
    uint32_t ip;              /* the client's IPv4 address, network order */
    double t_last;            /* end of its last request, or its opening */
    int busy;                 /* a request is in progress */
    int leaving;              /* shut down to make room; no longer counted */
    int refused;              /* over the limits with none to close: its requests get 503 */
} sock;

/* A suspended connection and what resumes it. */
typedef struct waiter {
    struct waiter *next;
    struct MHD_Connection *c;
    int fd;
    gen **gs;                 /* the generations it waits on */
    int n;
    double wake_at;           /* resume by then in any case (a stream's keep-alive, a list of prompts
                               * retrying for queue room); 0: none */
    double next_check;        /* when to look for a closed client end next */
    int gone;                 /* the client closed its end while suspended */
} waiter;

#define KV_LIMIT_NOTE " (what the KV-cache budget, --kv-budget-mb, holds for each lane)"

typedef struct server {
    dsv4_model *m;
    dsv4_tokenizer *tok;
    dsv4_lanes *lanes;
    const char *name, *api_key;
    const char *family;       /* "deepseek_v4" or "deepseek_v41": the chat format and DSML tags */
    int vocab, eos;
    int64_t ctx;
    int kv_limited;           /* ctx is what the KV-cache budget holds for each lane (below the model's) */
    atomic_uint_fast64_t http_requests, http_errors, id_counter;
    atomic_int active;        /* generations not yet freed (shutdown waits for them) */
    histo ttft, duration;     /* time to first token and whole request, of successful generations */
    uint64_t seed_base;
    int max_score_tokens;
    int draft;                /* requests' default proposal length (--draft) */
    /* open connections */
    pthread_mutex_t smu;
    sock *socks;
    int max_conns, client_conns;
    atomic_uint_fast64_t conns_closed_idle, conns_refused;
    /* suspended connections */
    pthread_mutex_t wmu;
    waiter *waiting;
    int efd;                  /* eventfd: the lanes' progress calls */
    int final;                /* stopping: resume everything, suspend nothing more */
    atomic_int waker_stop;
} server;

/* One HTTP request: its body as it arrives, then the generations it waits on. */
typedef struct conn {
    dsv4_buf body;
    int too_big;
    int deny_status;          /* answered with this error once the body is in (auth), body discarded */
    const char *deny_code, *deny_msg;
    gen **gs;                 /* a non-streamed generation request: its prompts, n_sub of them queued */
    int n, n_sub;
    int chat;
    waiter w;
} conn;

/* One generation (completion or chat), from parse to the last byte sent. */
struct gen {
    server *s;
    dsv4_request *r;
    int chat, stream, include_usage, want_ids, echo;
    int n_logprobs;            /* -1: none; else top_logprobs per token */
    char id[48];
    long created;
    dsv4_detok dt;
    dsv4_buf text;             /* generated text so far, cut at a stop string */
    size_t *off;               /* [cap] where each consumed token's piece starts in text */
    dsv4_sample_out *tok;      /* [cap] consumed tokens */
    int n_tok, cap_tok;
    char *stops[MAX_STOPS];
    int n_stops;
    size_t max_stop;
    int stop_string, finish, role_sent, final_sent;
    size_t emitted;            /* text bytes already streamed */
    int n_streamed;            /* tokens already streamed */
    dsv4_dsml *dsml;           /* chat: splits text into reasoning, content and tool calls */
    dsv4_dsml_out dout;        /* its output not yet sent (buffers reset after each send) */
    size_t parsed;             /* text bytes fed to the parser */
    int n_calls_sent;
    char *prompt_text;         /* echo */
    dsv4_buf sse;
    size_t sse_pos;
    double t0;
    const char *path;
    struct MHD_Connection *c; /* a stream's connection */
    waiter w;                 /* a stream's suspension */
    gen *self;
    double last_sent;         /* when the stream last handed out bytes */
};

/* ---- responses ------------------------------------------------------------------- */

/* Queues a response owning body[0..n) (freed by libmicrohttpd). */
static enum MHD_Result send_text(struct MHD_Connection *c, int status, const char *type, char *body, size_t n)
{
    if (!body)
        return MHD_NO;
    struct MHD_Response *rs = MHD_create_response_from_buffer(n, body, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(rs, "Content-Type", type);
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, rs);
    MHD_destroy_response(rs);
    return ok;
}

/* Queues j (consumed) as a JSON response. */
static enum MHD_Result send_json(struct MHD_Connection *c, int status, cJSON *j)
{
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!s)
        return MHD_NO;
    return send_text(c, status, "application/json", s, strlen(s));
}

static cJSON *error_json(int status, const char *param, const char *code, const char *msg);

/* OpenAI's error body (error_json) as the reply. */
static enum MHD_Result send_error(server *s, struct MHD_Connection *c, int status, const char *param, const char *code,
                                  const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static enum MHD_Result send_error(server *s, struct MHD_Connection *c, int status, const char *param, const char *code,
                                  const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    atomic_fetch_add(&s->http_errors, 1);
    return send_json(c, status, error_json(status, param, code, msg));
}

/* As send_error, and the connection is closed after the reply (its framing cannot be trusted,
 * or it is over the connection limits). */
static enum MHD_Result send_error_close(server *s, struct MHD_Connection *c, int status, const char *code, const char *msg)
{
    atomic_fetch_add(&s->http_errors, 1);
    cJSON *e = error_json(status, NULL, code, msg);
    char *b = cJSON_PrintUnformatted(e);
    cJSON_Delete(e);
    if (!b)
        return MHD_NO;
    struct MHD_Response *rs = MHD_create_response_from_buffer(strlen(b), b, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(rs, "Content-Type", "application/json");
    MHD_add_response_header(rs, "Connection", "close");
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, rs);
    MHD_destroy_response(rs);
    return ok;
}

/* OpenAI's error body: {"error": {"message", "type", "param", "code"}}. The message may quote
 * the request (a model name, a URL), so it is made valid UTF-8 first. Returns it, not consumed. */
static cJSON *error_json(int status, const char *param, const char *code, const char *msg)
{
    /* OpenAI's types: client errors (401 and 404 included) are invalid_request_error; `code`
     * says more (invalid_api_key, model_not_found, context_length_exceeded) */
    const char *type = status >= 500 ? "server_error" : "invalid_request_error";
    cJSON *e = cJSON_CreateObject(), *o = cJSON_AddObjectToObject(e, "error");
    size_t ml;
    char *clean = dsv4_utf8_sanitize(msg, strlen(msg), &ml);
    cJSON_AddStringToObject(o, "message", clean ? clean : "?");
    free(clean);
    cJSON_AddStringToObject(o, "type", type);
    if (param)
        cJSON_AddStringToObject(o, "param", param);
    else
        cJSON_AddNullToObject(o, "param");
    if (code)
        cJSON_AddStringToObject(o, "code", code);
    else
        cJSON_AddNullToObject(o, "code");
    return e;
}

/* ---- request parsing ------------------------------------------------------------- */

/* A parse failure: HTTP status, offending field and message. */
typedef struct bad {
    int status;
    const char *param, *code;
    char msg[512];
} bad;

static int fail_bad(bad *b, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail_bad(bad *b, const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->msg, sizeof b->msg, fmt, ap);
    va_end(ap);
    b->status = 400;
    b->param = param;
    return -1;
}

/* Reads an optional number field within [lo, hi]; null or absent keeps *v. */
static int get_num(const cJSON *j, const char *key, double lo, double hi, double *v, bad *b)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!x || cJSON_IsNull(x))
        return 0;
    if (!cJSON_IsNumber(x))
        return fail_bad(b, key, "'%s' must be a number", key);
    if (!(x->valuedouble >= lo && x->valuedouble <= hi))
        return fail_bad(b, key, "'%s' must be between %g and %g", key, lo, hi);
    *v = x->valuedouble;
    return 0;
}

/* As get_num, for integral values. */
static int get_int(const cJSON *j, const char *key, double lo, double hi, int64_t *v, bad *b)
{
    double d = (double)*v;
    if (get_num(j, key, lo, hi, &d, b))
        return -1;
    if (d != floor(d))
        return fail_bad(b, key, "'%s' must be an integer", key);
    *v = (int64_t)d;
    return 0;
}

/* Reads an optional boolean field; null or absent keeps *v. */
static int get_bool(const cJSON *j, const char *key, int *v, bad *b)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!x || cJSON_IsNull(x))
        return 0;
    if (!cJSON_IsBool(x))
        return fail_bad(b, key, "'%s' must be a boolean", key);
    *v = cJSON_IsTrue(x);
    return 0;
}

/* Prompt ids from a string or an array of ids (or a one-element array of either). */
static int parse_prompt(server *s, const cJSON *p, dsv4_ids *ids, char **text, bad *b)
{
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 &&
        (cJSON_IsString(p->child) || cJSON_IsArray(p->child)))
        p = p->child;
    dsv4_err err = {0};
    if (cJSON_IsString(p)) {
        *text = strdup(p->valuestring);
        if (dsv4_tokenizer_encode(s->tok, p->valuestring, strlen(p->valuestring), ids, &err))
            return fail_bad(b, "prompt", "cannot tokenize the prompt: %s", err.msg);
        return 0;
    }
    if (!cJSON_IsArray(p))
        return fail_bad(b, "prompt", "'prompt' must be a string or an array of token ids");
    const cJSON *x;
    cJSON_ArrayForEach(x, p)
    {
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble))
            return fail_bad(b, "prompt", "'prompt' arrays hold integer token ids (one prompt per request)");
        if (x->valuedouble < 0 || x->valuedouble >= s->vocab)
            return fail_bad(b, "prompt", "token id %.0f is outside the vocabulary of %d", x->valuedouble, s->vocab);
        if (ids->n == ids->cap) {
            size_t cap = ids->cap ? 2 * ids->cap : 64;
            int32_t *v = realloc(ids->v, cap * sizeof *v);
            if (!v)
                return fail_bad(b, "prompt", "out of memory");
            ids->v = v;
            ids->cap = cap;
        }
        ids->v[ids->n++] = (int32_t)x->valuedouble;
    }
    return 0;
}

/* Skips one JSON value at p (valid JSON: cJSON has parsed it); returns the byte after it. */
static const char *skip_value(const char *p, const char *end)
{
    int depth = 0;
    do {
        if (p >= end)
            return end;
        if (*p == '"') {
            for (p++; p < end && *p != '"'; p++)
                if (*p == '\\')
                    p++;
            p++;
        } else if (*p == '{' || *p == '[') {
            depth++;
            p++;
        } else if (*p == '}' || *p == ']') {
            depth--;
            p++;
        } else if (depth == 0) {
            while (p < end && !strchr(",}] \t\r\n", *p))
                p++;
        } else {
            p++;
        }
    } while (depth > 0);
    return p < end ? p : end;
}

/* The raw text of the first member named key (written without escapes) of the object that is
 * the JSON text p[0..n), or NULL. */
static const char *raw_member(const char *p, size_t n, const char *key, size_t *len)
{
    const char *end = p + n, *ws = " \t\r\n";
    size_t kl = strlen(key);
    while (p < end && strchr(ws, *p))
        p++;
    if (p >= end || *p++ != '{')
        return NULL;
    for (;;) {
        while (p < end && (strchr(ws, *p) || *p == ','))
            p++;
        if (p >= end || *p != '"')
            return NULL;
        const char *k = p + 1, *ke = skip_value(p, end) - 1;
        p = ke + 1;
        while (p < end && (strchr(ws, *p) || *p == ':'))
            p++;
        const char *v = p;
        p = skip_value(p, end);
        if ((size_t)(ke - k) == kl && !memcmp(k, key, kl)) {
            *len = (size_t)(p - v);
            return v;
        }
    }
}

/* The seed, exactly: an integer in [-2^63, 2^64), negative ones taken modulo 2^64 (so -1 is
 * 2^64 - 1). cJSON keeps numbers as doubles, which hold integers exactly only to 2^53, so an
 * integer literal is read from the body's text; other spellings (1e3, 7.0) must be integers
 * within 2^53. */
static int parse_seed(const cJSON *j, const char *raw, size_t raw_n, int *have, uint64_t *seed, bad *b)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, "seed");
    if (!x || cJSON_IsNull(x))
        return 0;
    if (!cJSON_IsNumber(x))
        return fail_bad(b, "seed", "'seed' must be an integer");
    size_t n = 0;
    const char *t = raw ? raw_member(raw, raw_n, "seed", &n) : NULL;
    size_t neg = t && n && *t == '-', digits = 0;
    while (t && neg + digits < n && t[neg + digits] >= '0' && t[neg + digits] <= '9')
        digits++;
    if (t && digits && neg + digits == n) {
        uint64_t v = 0;
        for (size_t i = 0; i < digits; i++) {
            unsigned d = (unsigned)(t[neg + i] - '0');
            if (v > (UINT64_MAX - d) / 10)
                return fail_bad(b, "seed", "'seed' must be an integer in [-2^63, 2^64)");
            v = v * 10 + d;
        }
        if (neg && v > (uint64_t)1 << 63)
            return fail_bad(b, "seed", "'seed' must be an integer in [-2^63, 2^64)");
        *seed = neg ? (uint64_t)0 - v : v;
    } else {
        double d = x->valuedouble;
        if (d != floor(d) || fabs(d) > 9007199254740992.0)
            return fail_bad(b, "seed", "'seed' must be an integer: written with a fraction or exponent it must be within 2^53");
        *seed = (uint64_t)(int64_t)d;
    }
    *have = 1;
    return 0;
}

/* Sampling and stopping fields shared by both endpoints. raw[0..raw_n): the body's text. */
static int parse_sampling(server *s, gen *g, const cJSON *j, const char *raw, size_t raw_n, dsv4_request *r, bad *b)
{
    dsv4_sample_params *sp = &r->sp;
    double t = 1.0, top_p = 1.0, min_p = 0, pp = 0, fp = 0, rp = 1.0;
    int64_t top_k = 0, n = 1, max_tokens = -1, draft = s->draft;
    uint64_t seed = 0;
    int have_seed = 0;
    if (get_num(j, "temperature", 0, 2, &t, b) || get_num(j, "top_p", 0, 1, &top_p, b) ||
        get_num(j, "min_p", 0, 1, &min_p, b) || get_num(j, "presence_penalty", -2, 2, &pp, b) ||
        get_num(j, "frequency_penalty", -2, 2, &fp, b) || get_num(j, "repetition_penalty", 0.01, 10, &rp, b) ||
        get_int(j, "top_k", -1, 1e9, &top_k, b) || get_int(j, "n", 1, 1, &n, b) ||
        parse_seed(j, raw, raw_n, &have_seed, &seed, b) || get_int(j, "max_tokens", 0, 1e9, &max_tokens, b) ||
        get_int(j, "max_completion_tokens", 0, 1e9, &max_tokens, b) || get_int(j, "draft", 0, DSV4_DRAFT_MAX, &draft, b))
        return -1;
    r->draft = (int)draft;
    if (top_p == 0)
        return fail_bad(b, "top_p", "'top_p' must be greater than 0");
    sp->temperature = t;
    sp->top_p = top_p;
    sp->min_p = min_p;
    sp->presence_penalty = pp;
    sp->frequency_penalty = fp;
    sp->repetition_penalty = rp;
    sp->top_k = top_k < 0 ? 0 : (int)top_k;
    sp->seed = have_seed ? seed
                         : s->seed_base ^ (atomic_fetch_add(&s->id_counter, 1) * 0xD1B54A32D192ED03ull);
    int64_t room = s->ctx - r->n_prompt;
    if (room <= 0) {
        b->code = "context_length_exceeded";
        return fail_bad(b, g->chat ? "messages" : "prompt", "the prompt has %d tokens; the context holds %lld%s", r->n_prompt,
                        (long long)s->ctx, s->kv_limited ? KV_LIMIT_NOTE : "");
    }
    /* teacher forcing: the continuation is given; its tokens are scored, not sampled */
    const cJSON *ft = cJSON_GetObjectItemCaseSensitive(j, "forced_tokens");
    if (ft && !cJSON_IsNull(ft)) {
        dsv4_ids f = {0};
        char *unused = NULL;
        int bad_f = parse_prompt(s, ft, &f, &unused, b);
        free(unused);
        if (!bad_f && f.n == 0)
            bad_f = fail_bad(b, "forced_tokens", "'forced_tokens' is empty");
        if (bad_f) {
            b->param = "forced_tokens";
            dsv4_ids_free(&f);
            return -1;
        }
        r->forced = f.v;
        r->n_forced = (int)f.n;
        max_tokens = r->n_forced;
    }
    if (max_tokens < 0) /* a chat may fill the context; the request counts tokens in an int */
        max_tokens = g->chat ? (room < INT_MAX - r->n_prompt ? room : INT_MAX - r->n_prompt) : 16;
    if (max_tokens > room) {
        b->code = "context_length_exceeded";
        return fail_bad(b, "max_tokens", "the prompt (%d tokens) plus max_tokens (%lld) exceeds the context of %lld tokens%s",
                        r->n_prompt, (long long)max_tokens, (long long)s->ctx, s->kv_limited ? KV_LIMIT_NOTE : "");
    }
    r->max_tokens = (int)max_tokens;

    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(j, "logit_bias");
    if (lb && !cJSON_IsNull(lb)) {
        if (!cJSON_IsObject(lb))
            return fail_bad(b, "logit_bias", "'logit_bias' must be an object of token id -> bias");
        int k = cJSON_GetArraySize(lb), i = 0;
        int32_t *ids = malloc((size_t)(k ? k : 1) * sizeof *ids);
        float *vals = malloc((size_t)(k ? k : 1) * sizeof *vals);
        sp->bias_ids = ids;
        sp->bias_vals = vals;
        if (!ids || !vals)
            return fail_bad(b, "logit_bias", "out of memory");
        const cJSON *x;
        cJSON_ArrayForEach(x, lb)
        {
            char *end;
            long id = strtol(x->string, &end, 10);
            if (*end || end == x->string || id < 0 || id >= s->vocab)
                return fail_bad(b, "logit_bias", "logit_bias key '%s' is not a token id", x->string);
            if (!cJSON_IsNumber(x) || x->valuedouble < -100 || x->valuedouble > 100)
                return fail_bad(b, "logit_bias", "logit_bias values are numbers in [-100, 100]");
            ids[i] = (int32_t)id;
            vals[i++] = (float)x->valuedouble;
            sp->n_bias = i;
        }
    }

    /* stop strings and ids; EOS stops unless ignore_eos */
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "stop");
    if (st && !cJSON_IsNull(st)) {
        if (cJSON_IsString(st)) {
            if (*st->valuestring)
                g->stops[g->n_stops++] = strdup(st->valuestring);
        } else if (cJSON_IsArray(st) && cJSON_GetArraySize(st) <= MAX_STOPS) {
            const cJSON *x;
            cJSON_ArrayForEach(x, st)
            {
                if (!cJSON_IsString(x))
                    return fail_bad(b, "stop", "'stop' must be a string or an array of strings");
                if (*x->valuestring)
                    g->stops[g->n_stops++] = strdup(x->valuestring);
            }
        } else {
            return fail_bad(b, "stop", "'stop' must be a string or an array of at most %d strings", MAX_STOPS);
        }
        for (int i = 0; i < g->n_stops; i++)
            if (strlen(g->stops[i]) > g->max_stop)
                g->max_stop = strlen(g->stops[i]);
    }
    int ignore_eos = 0;
    if (get_bool(j, "ignore_eos", &ignore_eos, b))
        return -1;
    const cJSON *sti = cJSON_GetObjectItemCaseSensitive(j, "stop_token_ids");
    int n_sti = cJSON_IsArray(sti) ? cJSON_GetArraySize(sti) : 0;
    if (sti && !cJSON_IsNull(sti) && !cJSON_IsArray(sti))
        return fail_bad(b, "stop_token_ids", "'stop_token_ids' must be an array of token ids");
    r->stop_ids = malloc((size_t)(n_sti + 1) * sizeof *r->stop_ids);
    if (!r->stop_ids)
        return fail_bad(b, NULL, "out of memory");
    if (!ignore_eos)
        r->stop_ids[r->n_stop_ids++] = s->eos;
    const cJSON *x;
    cJSON_ArrayForEach(x, sti)
    {
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= s->vocab)
            return fail_bad(b, "stop_token_ids", "'stop_token_ids' must be token ids");
        r->stop_ids[r->n_stop_ids++] = (int32_t)x->valuedouble;
    }

    if (get_bool(j, "stream", &g->stream, b) || get_bool(j, "return_token_ids", &g->want_ids, b))
        return -1;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(j, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so))
            return fail_bad(b, "stream_options", "'stream_options' must be an object");
        if (get_bool(so, "include_usage", &g->include_usage, b))
            return -1;
    }
    int cache = 1;
    if (get_bool(j, "cache_prompt", &cache, b))
        return -1;
    r->use_cache = cache;
    return 0;
}

/* ---- generation ------------------------------------------------------------------ */

/* Releases the request (cancelling it if still running) and everything the generation holds. */
static void gen_free(gen *g)
{
    if (!g)
        return;
    atomic_fetch_sub(&g->s->active, 1);
    dsv4_request_release(g->r);
    dsv4_detok_free(&g->dt);
    dsv4_dsml_free(g->dsml);
    dsv4_dsml_out_free(&g->dout);
    dsv4_buf_free(&g->text);
    dsv4_buf_free(&g->sse);
    free(g->off);
    free(g->tok);
    free(g->prompt_text);
    for (int i = 0; i < g->n_stops; i++)
        free(g->stops[i]);
    free(g);
}

/* OpenAI's finish_reason for how the generation ended. */
static const char *finish_name(const gen *g)
{
    switch (g->finish) {
    case DSV4_FINISH_STOP: return cJSON_GetArraySize(g->dout.calls) > 0 ? "tool_calls" : "stop";
    case DSV4_FINISH_LENGTH: return "length";
    case DSV4_FINISH_CANCELLED: return g->stop_string ? "stop" : "cancelled";
    default: return "error";
    }
}

/* Waits up to timeout_s for tokens, detokenizes them and applies stop strings. Returns 1 when
 * the generation has ended (g->finish set), else 0. */
static int gen_pull(gen *g, double timeout_s)
{
    if (g->finish)
        return 1;
    dsv4_sample_out buf[TAKE];
    int fin = 0;
    int n = dsv4_request_take(g->r, g->n_tok, TAKE, buf, timeout_s, &fin);
    for (int k = 0; k < n; k++) {
        if (g->n_tok == g->cap_tok) {
            int cap = g->cap_tok ? 2 * g->cap_tok : 64;
            size_t *o = realloc(g->off, (size_t)cap * sizeof *o);
            if (o)
                g->off = o;
            dsv4_sample_out *t = realloc(g->tok, (size_t)cap * sizeof *t);
            if (t)
                g->tok = t;
            if (!o || !t) {
                g->finish = DSV4_FINISH_ERROR;
                dsv4_request_cancel(g->r);
                return 1;
            }
            g->cap_tok = cap;
        }
        g->tok[g->n_tok] = buf[k];
        g->off[g->n_tok++] = g->text.n;
        size_t len;
        dsv4_err err = {0};
        const char *piece = dsv4_detok_push(&g->dt, buf[k].id, &len, &err);
        size_t before = g->text.n;
        if (piece)
            dsv4_buf_put(&g->text, piece, len);
        for (int i = 0; i < g->n_stops; i++) {
            size_t from = before > g->max_stop ? before - g->max_stop : 0;
            char *hit = g->text.n ? memmem(g->text.p + from, g->text.n - from, g->stops[i], strlen(g->stops[i])) : NULL;
            if (hit) {
                g->text.n = (size_t)(hit - g->text.p);
                g->text.p[g->text.n] = 0;
                g->stop_string = 1;
            }
        }
        if (g->stop_string) {
            dsv4_request_cancel(g->r);
            g->finish = DSV4_FINISH_CANCELLED;
            return 1;
        }
    }
    if (fin) {
        size_t len;
        const char *rest = dsv4_detok_flush(&g->dt, &len);
        if (rest)
            dsv4_buf_put(&g->text, rest, len);
        g->finish = fin;
        return 1;
    }
    return 0;
}

/* Bytes of text safe to stream: all once finished, else all but the longest suffix that
 * could still grow into a stop string. */
static size_t gen_safe_len(const gen *g)
{
    if (g->finish)
        return g->text.n;
    size_t hold = 0;
    for (int i = 0; i < g->n_stops; i++) {
        size_t L = strlen(g->stops[i]);
        for (size_t k = L - 1; k > hold; k--)
            if (k <= g->text.n && !memcmp(g->text.p + g->text.n - k, g->stops[i], k)) {
                hold = k;
                break;
            }
    }
    return g->text.n - hold;
}

/* A token's text for logprobs: its raw bytes made valid UTF-8. */
static cJSON *token_string(server *s, int32_t id)
{
    size_t n, m;
    const char *b = dsv4_tokenizer_id_bytes(s->tok, id, &n);
    char *u = dsv4_utf8_sanitize(b ? b : "", b ? n : 0, &m);
    cJSON *j = cJSON_CreateString(u ? u : "");
    free(u);
    return j;
}

/* The token's raw bytes as numbers (chat logprobs' "bytes"). */
static cJSON *bytes_array(server *s, int32_t id)
{
    size_t n;
    const char *b = dsv4_tokenizer_id_bytes(s->tok, id, &n);
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; b && i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)b[i]));
    return a;
}

/* The text piece of consumed token k (as detokenized in order, so pieces concatenate). */
static cJSON *piece_string(const gen *g, int k)
{
    size_t a = g->off[k], b = k + 1 < g->n_tok ? g->off[k + 1] : g->text.n;
    a = a < g->text.n ? a : g->text.n;
    b = b < g->text.n ? b : g->text.n;
    char *t = strndup(g->text.p ? g->text.p + a : "", b > a ? b - a : 0);
    cJSON *j = cJSON_CreateString(t ? t : "");
    free(t);
    return j;
}

/* Chat logprobs: {"content": [{token, logprob, bytes, top_logprobs}]} for tokens [from, to). */
static cJSON *chat_logprobs(gen *g, int from, int to)
{
    cJSON *lp = cJSON_CreateObject(), *content = cJSON_AddArrayToObject(lp, "content");
    for (int k = from; k < to; k++) {
        const dsv4_sample_out *t = &g->tok[k];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddItemToObject(e, "token", piece_string(g, k));
        cJSON_AddNumberToObject(e, "logprob", t->logprob);
        cJSON_AddItemToObject(e, "bytes", bytes_array(g->s, t->id));
        cJSON *top = cJSON_AddArrayToObject(e, "top_logprobs");
        for (int i = 0; i < t->n_top; i++) {
            cJSON *x = cJSON_CreateObject();
            cJSON_AddItemToObject(x, "token", token_string(g->s, t->top_ids[i]));
            cJSON_AddNumberToObject(x, "logprob", t->top_logprobs[i]);
            cJSON_AddItemToObject(x, "bytes", bytes_array(g->s, t->top_ids[i]));
            cJSON_AddItemToArray(top, x);
        }
        cJSON_AddItemToArray(content, e);
    }
    return lp;
}

/* The completions API's top_logprobs entry: {token string: logprob}. Two ids spelling the
 * same string keep the more likely one (the object cannot hold both). */
static cJSON *top_map(server *s, const dsv4_sample_out *t)
{
    cJSON *m = cJSON_CreateObject();
    for (int i = 0; i < t->n_top; i++) {
        cJSON *name = token_string(s, t->top_ids[i]);
        if (!cJSON_GetObjectItemCaseSensitive(m, name->valuestring))
            cJSON_AddNumberToObject(m, name->valuestring, t->top_logprobs[i]);
        cJSON_Delete(name);
    }
    return m;
}

/* Completions logprobs: {tokens, token_logprobs, top_logprobs, text_offset}, with the prompt's
 * tokens first when echoing. base: text offset of the generated text. */
static cJSON *completion_logprobs(gen *g, int from, int to, size_t base, int with_prompt)
{
    cJSON *lp = cJSON_CreateObject();
    cJSON *toks = cJSON_AddArrayToObject(lp, "tokens"), *tlp = cJSON_AddArrayToObject(lp, "token_logprobs");
    cJSON *top = cJSON_AddArrayToObject(lp, "top_logprobs"), *off = cJSON_AddArrayToObject(lp, "text_offset");
    dsv4_request *r = g->r;
    if (with_prompt) {
        dsv4_detok d;
        dsv4_detok_init(&d, g->s->tok, 0);
        size_t at = 0;
        for (int i = 0; i < r->n_prompt; i++) {
            size_t len = 0;
            dsv4_err err = {0};
            const char *p = dsv4_detok_push(&d, r->prompt[i], &len, &err);
            char *t = strndup(p ? p : "", len);
            cJSON_AddItemToArray(toks, cJSON_CreateString(t ? t : ""));
            free(t);
            cJSON_AddItemToArray(off, cJSON_CreateNumber((double)at));
            at += len;
            if (i == 0 || i >= r->n_prompt_lp) {
                cJSON_AddItemToArray(tlp, cJSON_CreateNull());
                cJSON_AddItemToArray(top, cJSON_CreateNull());
            } else {
                cJSON_AddItemToArray(tlp, cJSON_CreateNumber(r->prompt_lp[i].logprob));
                cJSON_AddItemToArray(top, top_map(g->s, &r->prompt_lp[i]));
            }
        }
        dsv4_detok_free(&d);
    }
    for (int k = from; k < to; k++) {
        const dsv4_sample_out *t = &g->tok[k];
        cJSON_AddItemToArray(toks, piece_string(g, k));
        cJSON_AddItemToArray(tlp, cJSON_CreateNumber(t->logprob));
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)(base + g->off[k])));
        cJSON_AddItemToArray(top, top_map(g->s, t));
    }
    return lp;
}

/* usage: prompt, completion and total tokens, and the prompt tokens served from the cache. */
/* The usage extension "draft": what drafting did (it never changes the tokens). */
static void draft_usage(cJSON *u, int64_t steps, int64_t proposed, int64_t kept)
{
    cJSON *d = cJSON_AddObjectToObject(u, "draft");
    cJSON_AddNumberToObject(d, "steps", (double)steps);
    cJSON_AddNumberToObject(d, "proposed_tokens", (double)proposed);
    cJSON_AddNumberToObject(d, "kept_tokens", (double)kept);
}

static cJSON *usage_json(const gen *g)
{
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", g->r->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", g->n_tok);
    cJSON_AddNumberToObject(u, "total_tokens", g->r->n_prompt + g->n_tok);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", g->r->n_cached);
    if (g->r->draft_steps)
        draft_usage(u, g->r->draft_steps, g->r->draft_proposed, g->r->draft_kept);
    return u;
}

/* The ids of consumed tokens [from, to) (the return_token_ids extension). */
static cJSON *ids_json(const gen *g, int from, int to)
{
    cJSON *a = cJSON_CreateArray();
    for (int k = from; k < to; k++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(g->tok[k].id));
    return a;
}

/* The fields every response and chunk starts with: id, object, created, model. */
static cJSON *envelope(const gen *g, const char *object)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", g->id);
    cJSON_AddStringToObject(j, "object", object);
    cJSON_AddNumberToObject(j, "created", (double)g->created);
    cJSON_AddStringToObject(j, "model", g->s->name);
    return j;
}

/* Feeds the parser the text up to `upto` (and ends it when the generation has ended). */
static void chat_parse(gen *g, size_t upto)
{
    dsv4_err err = {0};
    if (upto > g->parsed) {
        dsv4_dsml_feed(g->dsml, g->text.p + g->parsed, upto - g->parsed, &g->dout, &err);
        g->parsed = upto;
    }
    if (g->finish && g->parsed == g->text.n && g->dsml) {
        dsv4_dsml_finish(g->dsml, &g->dout, &err);
        dsv4_dsml_free(g->dsml);
        g->dsml = NULL;
    }
}

/* OpenAI tool_calls from the parser's calls [from, n); with_index for stream deltas. */
static cJSON *tool_calls_json(gen *g, int from, int with_index)
{
    cJSON *a = cJSON_CreateArray();
    int n = cJSON_GetArraySize(g->dout.calls);
    for (int i = from; i < n; i++) {
        const cJSON *c = cJSON_GetArrayItem(g->dout.calls, i);
        cJSON *t = cJSON_CreateObject(), *f;
        char id[sizeof g->id + 24];
        snprintf(id, sizeof id, "call_%s_%d", g->id, i);
        if (with_index)
            cJSON_AddNumberToObject(t, "index", i);
        cJSON_AddStringToObject(t, "id", id);
        cJSON_AddStringToObject(t, "type", "function");
        f = cJSON_AddObjectToObject(t, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(c, "name");
        cJSON_AddStringToObject(f, "name", cJSON_IsString(name) ? name->valuestring : "");
        char *args = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(c, "arguments"));
        cJSON_AddStringToObject(f, "arguments", args ? args : "{}");
        free(args);
        cJSON_AddItemToArray(a, t);
    }
    return a;
}

/* The one log line per generation request: status, token counts, queue wait, time to first
 * token, generation speed and total time. */
/* Counts x (seconds) into its bucket and the sum. */
static void histo_add(histo *h, double x)
{
    int b = 0;
    while (b < N_BUCKETS - 1 && x > bucket_le[b])
        b++;
    atomic_fetch_add(&h->count[b], 1);
    double old = atomic_load(&h->sum);
    while (!atomic_compare_exchange_weak(&h->sum, &old, old + x))
        ;
}

/* Writes h as a Prometheus histogram (cumulative buckets, sum, count). */
static void histo_write(FILE *f, const char *name, const char *help, histo *h)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int b = 0; b < N_BUCKETS; b++) {
        cum += (uint64_t)atomic_load(&h->count[b]);
        if (b < N_BUCKETS - 1)
            fprintf(f, "%s_bucket{le=\"%g\"} %" PRIu64 "\n", name, bucket_le[b], cum);
        else
            fprintf(f, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name, cum);
    }
    fprintf(f, "%s_sum %.6f\n%s_count %" PRIu64 "\n", name, atomic_load(&h->sum), name, cum);
}

static void log_line(gen *g, int status)
{
    const dsv4_request *r = g->r;
    double now = dsv4_now();
    double queue = r && r->t_start > 0 ? r->t_start - r->t_submit : 0;
    double ttft = r && r->t_first > 0 ? r->t_first - r->t_submit : 0;
    double gen_s = r && r->t_first > 0 && r->t_done > r->t_first ? r->t_done - r->t_first : 0;
    if (status == 200) {
        if (r && r->t_first > 0)
            histo_add(&g->s->ttft, ttft);
        histo_add(&g->s->duration, now - g->t0);
    }
    char drafted[64] = "";
    if (r && r->draft_steps)
        snprintf(drafted, sizeof drafted, " draft=%lld/%lld", (long long)r->draft_kept, (long long)r->draft_proposed);
    dsv4_log("%s %s %d prompt=%d cached=%d generated=%d finish=%s queue=%.3fs ttft=%.3fs gen=%.3fs (%.1f tok/s) total=%.3fs%s",
             g->id, g->path, status, r ? r->n_prompt : 0, r ? r->n_cached : 0, g->n_tok, g->finish ? finish_name(g) : "-",
             queue, ttft, gen_s, gen_s > 0 && g->n_tok > 1 ? (g->n_tok - 1) / gen_s : 0.0, now - g->t0, drafted);
}

/* ---- streaming ------------------------------------------------------------------- */

/* Appends j (consumed) to the pending SSE bytes as one data event. */
static void sse_event(gen *g, cJSON *j)
{
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    dsv4_buf_puts(&g->sse, "data: ");
    dsv4_buf_puts(&g->sse, s ? s : "{}");
    dsv4_buf_puts(&g->sse, "\n\n");
    free(s);
}

/* Appends the events for what is new: a delta with the streamable text (and its tokens'
 * logprobs and ids), then on the end the finish chunk, the usage chunk and [DONE]. */
static void stream_events(gen *g)
{
    size_t safe = gen_safe_len(g);
    if (g->chat)
        chat_parse(g, safe);
    /* tokens whose piece starts before `safe` go out with this chunk; at the end, all of them,
     * as the whole reply lists them: the one that completed a stop string too, though its piece
     * lies past the cut */
    int to = g->n_streamed;
    while (to < g->n_tok && (g->off[to] < safe || g->finish))
        to++;
    /* the first chunk: a chat's role, or an echoed prompt once its scores exist (after the
     * first token or the end: both come after the prompt was read) */
    int fresh_role = !g->role_sent && (g->chat || (g->echo && (g->n_tok > 0 || g->finish)));
    int new_calls = g->chat && cJSON_GetArraySize(g->dout.calls) > g->n_calls_sent;
    int chat_text = g->chat && (g->dout.content.n || g->dout.reasoning.n);
    if ((!g->chat && safe > g->emitted) || chat_text || new_calls || to > g->n_streamed || fresh_role) {
        cJSON *j = envelope(g, g->chat ? "chat.completion.chunk" : "text_completion");
        cJSON *ch = cJSON_AddArrayToObject(j, "choices"), *c0 = cJSON_CreateObject();
        cJSON_AddItemToArray(ch, c0);
        cJSON_AddNumberToObject(c0, "index", 0);
        if (g->chat) {
            cJSON *d = cJSON_AddObjectToObject(c0, "delta");
            if (fresh_role)
                cJSON_AddStringToObject(d, "role", "assistant");
            if (g->dout.reasoning.n)
                cJSON_AddStringToObject(d, "reasoning_content", g->dout.reasoning.p);
            if (g->dout.content.n || !g->dout.reasoning.n)
                cJSON_AddStringToObject(d, "content", g->dout.content.n ? g->dout.content.p : "");
            if (new_calls) {
                cJSON_AddItemToObject(d, "tool_calls", tool_calls_json(g, g->n_calls_sent, 1));
                g->n_calls_sent = cJSON_GetArraySize(g->dout.calls);
            }
            g->dout.content.n = g->dout.reasoning.n = 0;
            if (g->n_logprobs >= 0 && to > g->n_streamed)
                cJSON_AddItemToObject(c0, "logprobs", chat_logprobs(g, g->n_streamed, to));
            else
                cJSON_AddNullToObject(c0, "logprobs");
        } else {
            size_t a = g->emitted, b = safe > a ? safe : a;
            dsv4_buf t = {0};
            if (!g->role_sent && g->echo && g->prompt_text)
                dsv4_buf_puts(&t, g->prompt_text);
            dsv4_buf_put(&t, g->text.p ? g->text.p + a : "", b - a);
            cJSON_AddStringToObject(c0, "text", t.p ? t.p : "");
            dsv4_buf_free(&t);
            /* echo: the prompt (and its scores) lead the first chunk; offsets count from its start */
            int lead = !g->role_sent && g->echo;
            size_t base = g->echo && g->prompt_text ? strlen(g->prompt_text) : 0;
            if (g->n_logprobs >= 0)
                cJSON_AddItemToObject(c0, "logprobs", completion_logprobs(g, g->n_streamed, to, base, lead));
            else
                cJSON_AddNullToObject(c0, "logprobs");
        }
        cJSON_AddNullToObject(c0, "finish_reason");
        if (g->want_ids)
            cJSON_AddItemToObject(c0, "token_ids", ids_json(g, g->n_streamed, to));
        sse_event(g, j);
        g->role_sent = 1;
        g->emitted = safe > g->emitted ? safe : g->emitted;
        g->n_streamed = to;
    }
    if (g->finish && !g->final_sent) {
        g->final_sent = 1;
        if (g->finish == DSV4_FINISH_ERROR) {
            cJSON *e = cJSON_CreateObject(), *o = cJSON_AddObjectToObject(e, "error");
            cJSON_AddStringToObject(o, "message", g->r->errmsg[0] ? g->r->errmsg : "generation failed");
            cJSON_AddStringToObject(o, "type", "server_error");
            sse_event(g, e);
        } else {
            cJSON *j = envelope(g, g->chat ? "chat.completion.chunk" : "text_completion");
            cJSON *ch = cJSON_AddArrayToObject(j, "choices"), *c0 = cJSON_CreateObject();
            cJSON_AddItemToArray(ch, c0);
            cJSON_AddNumberToObject(c0, "index", 0);
            if (g->chat)
                cJSON_AddObjectToObject(c0, "delta");
            else
                cJSON_AddStringToObject(c0, "text", "");
            cJSON_AddNullToObject(c0, "logprobs");
            cJSON_AddStringToObject(c0, "finish_reason", finish_name(g));
            sse_event(g, j);
            if (g->include_usage) {
                cJSON *u = envelope(g, g->chat ? "chat.completion.chunk" : "text_completion");
                cJSON_AddArrayToObject(u, "choices");
                cJSON_AddItemToObject(u, "usage", usage_json(g));
                sse_event(g, u);
            }
        }
        dsv4_buf_puts(&g->sse, "data: [DONE]\n\n");
    }
}

/* ---- suspension ------------------------------------------------------------------ */

/* 1 when the peer of fd closed its end or reset it (a read would not wait for more). */
static int fd_gone(int fd)
{
    char b;
    ssize_t r = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* The lanes' progress call (lanes lock held): wakes the waker. */
static void lanes_notify(void *ctx)
{
    server *s = ctx;
    uint64_t one = 1;
    ssize_t w = write(s->efd, &one, sizeof one);
    (void)w; /* a full counter still wakes the waker */
}

/* Suspends c until one of gs[0..n) has news (or the other reasons in waiter). Called from the
 * connection's handler or content callback. Returns -1 when the server is stopping (then it is
 * not suspended and the caller ends the request). */
static int suspend_on(server *s, struct MHD_Connection *c, waiter *w, gen **gs, int n, double wake_at)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    pthread_mutex_lock(&s->wmu);
    if (s->final) {
        pthread_mutex_unlock(&s->wmu);
        return -1;
    }
    w->c = c;
    w->fd = ci ? ci->connect_fd : -1;
    w->gs = gs;
    w->n = n;
    w->wake_at = wake_at;
    w->gone = 0;
    MHD_suspend_connection(c);
    w->next = s->waiting;
    s->waiting = w;
    pthread_mutex_unlock(&s->wmu);
    lanes_notify(s); /* news may have come before the waiter was listed */
    return 0;
}

/* 1 when w should be resumed now. */
static int waiter_due(server *s, waiter *w, double now)
{
    if (s->final || (w->wake_at > 0 && now >= w->wake_at))
        return 1;
    for (int i = 0; i < w->n; i++) { /* one that has ended has no news (its list waits for the others) */
        gen *g = w->gs[i];
        if (!g->finish && dsv4_request_ready(g->r, g->n_tok))
            return 1;
    }
    if (now >= w->next_check) {
        w->next_check = now + 0.1;
        if (w->fd >= 0 && fd_gone(w->fd)) {
            w->gone = 1;
            return 1;
        }
    }
    return 0;
}

/* Resumes the suspended connections that are due, on every progress call and every tick. */
static void *waker_main(void *arg)
{
    server *s = arg;
    pthread_setname_np(pthread_self(), "dsv4-waker");
    struct pollfd pf = {.fd = s->efd, .events = POLLIN};
    while (!atomic_load(&s->waker_stop)) {
        poll(&pf, 1, TICK_MS);
        uint64_t v;
        ssize_t r = read(s->efd, &v, sizeof v);
        (void)r;
        double now = dsv4_now();
        pthread_mutex_lock(&s->wmu);
        for (waiter **pp = &s->waiting; *pp;) {
            waiter *w = *pp;
            if (waiter_due(s, w, now)) {
                *pp = w->next;
                w->next = NULL;
                MHD_resume_connection(w->c);
            } else {
                pp = &w->next;
            }
        }
        pthread_mutex_unlock(&s->wmu);
    }
    return NULL;
}

/* Takes every token there is without waiting. Returns 1 when the generation has ended. */
static int gen_drain(gen *g)
{
    for (;;) {
        int before = g->n_tok;
        if (gen_pull(g, 0))
            return 1;
        if (g->n_tok == before)
            return 0;
    }
}

/* ---- streaming, continued ---------------------------------------------------------- */

/* libmicrohttpd's content callback for a stream: hands out pending SSE bytes; with none, takes
 * what tokens there are, and with nothing new either suspends until there is (or a second has
 * passed: then a keep-alive comment, which also shows a client that left). */
static ssize_t stream_reader(void *cls, uint64_t pos, char *out, size_t max)
{
    (void)pos;
    gen *g = cls;
    while (g->sse_pos == g->sse.n) {
        if (g->final_sent)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (g->w.gone)
            return MHD_CONTENT_READER_END_WITH_ERROR;
        g->sse.n = 0;
        g->sse_pos = 0;
        gen_drain(g);
        stream_events(g);
        if (g->sse.oom)
            return MHD_CONTENT_READER_END_WITH_ERROR;
        if (g->sse.n)
            break;
        double now = dsv4_now();
        if (now - g->last_sent >= 1.0) {
            dsv4_buf_puts(&g->sse, ": keep-alive\n\n");
            break;
        }
        if (suspend_on(g->s, g->c, &g->w, &g->self, 1, g->last_sent + 1.0))
            return MHD_CONTENT_READER_END_WITH_ERROR;
        return 0;
    }
    size_t n = g->sse.n - g->sse_pos;
    n = n < max ? n : max;
    memcpy(out, g->sse.p + g->sse_pos, n);
    g->sse_pos += n;
    g->last_sent = dsv4_now();
    return (ssize_t)n;
}

/* Called when the stream's response is dropped: finished, or the client went away (499). */
static void stream_done(void *cls)
{
    gen *g = cls;
    if (!g->finish) {
        g->finish = DSV4_FINISH_CANCELLED;
        log_line(g, 499); /* the client closed the stream */
    } else {
        log_line(g, 200);
    }
    gen_free(g);
}

/* ---- endpoints ------------------------------------------------------------------- */

/* 1 when the client closed its end (a read would return end of file). */
static int client_gone(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
        return 0;
    char b;
    return recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

/* tools: [{"type": "function", "function": {"name": str, "description"?: str, "parameters"?: object}}];
 * tool_choice: "none" | "auto" | "required" | {"type": "function", "function": {"name": one of them}}.
 * "required" and a named choice are accepted but not enforced (decoding is not constrained). */
static int check_tools(const cJSON *tools, const cJSON *choice, bad *b)
{
    if (tools && !cJSON_IsNull(tools)) {
        if (!cJSON_IsArray(tools))
            return fail_bad(b, "tools", "'tools' must be an array");
        const cJSON *t;
        int i = 0;
        cJSON_ArrayForEach(t, tools)
        {
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
            const cJSON *params = cJSON_GetObjectItemCaseSensitive(f, "parameters");
            const cJSON *desc = cJSON_GetObjectItemCaseSensitive(f, "description");
            if (!cJSON_IsObject(t) || !cJSON_IsString(type) || strcmp(type->valuestring, "function"))
                return fail_bad(b, "tools", "tools[%d]: 'type' must be \"function\"", i);
            if (!cJSON_IsObject(f) || !cJSON_IsString(name) || !*name->valuestring)
                return fail_bad(b, "tools", "tools[%d]: 'function.name' must be a non-empty string", i);
            if (params && !cJSON_IsNull(params) && !cJSON_IsObject(params))
                return fail_bad(b, "tools", "tools[%d]: 'function.parameters' must be a JSON Schema object", i);
            if (desc && !cJSON_IsNull(desc) && !cJSON_IsString(desc))
                return fail_bad(b, "tools", "tools[%d]: 'function.description' must be a string", i);
            i++;
        }
    }
    if (!choice || cJSON_IsNull(choice))
        return 0;
    if (cJSON_IsString(choice)) {
        const char *c = choice->valuestring;
        if (strcmp(c, "none") && strcmp(c, "auto") && strcmp(c, "required"))
            return fail_bad(b, "tool_choice", "'tool_choice' must be none, auto, required or a named function");
        if (!strcmp(c, "required") && cJSON_GetArraySize(tools) == 0)
            return fail_bad(b, "tool_choice", "'tool_choice' required needs 'tools'");
        return 0;
    }
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(choice, "function");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
    if (!cJSON_IsObject(choice) || !cJSON_IsString(name))
        return fail_bad(b, "tool_choice", "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}");
    const cJSON *t;
    cJSON_ArrayForEach(t, tools)
    {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "name");
        if (!strcmp(n->valuestring, name->valuestring))
            return 0;
    }
    return fail_bad(b, "tool_choice", "'tool_choice' names '%s', which is not among the tools", name->valuestring);
}

/* Parses a generation request (prompt: the completions prompt to use, NULL for chat; raw: the
 * body's text), renders and tokenizes it. Returns the generation, not yet queued, or NULL with
 * *b set. */
static gen *gen_parse(server *s, const cJSON *j, const char *raw, size_t raw_n, int chat, const cJSON *prompt, const char *path,
                      bad *b)
{
    gen *g = calloc(1, sizeof *g);
    if (!g) {
        fail_bad(b, NULL, "out of memory");
        b->status = 500;
        return NULL;
    }
    g->s = s;
    g->self = g;
    atomic_fetch_add(&s->active, 1);
    g->chat = chat;
    g->path = path;
    g->t0 = dsv4_now();
    dsv4_dsml_out_init(&g->dout);
    g->n_logprobs = -1;
    g->created = (long)time(NULL);
    snprintf(g->id, sizeof g->id, "%s-%016" PRIx64, chat ? "chatcmpl" : "cmpl",
             (uint64_t)(s->seed_base ^ (atomic_fetch_add(&s->id_counter, 1) * 0x9E3779B97F4A7C15ull)));
    dsv4_detok_init(&g->dt, s->tok, 1);
    dsv4_ids ids = {0};
    dsv4_err err = {0};
    int rc = -1;

    const cJSON *model = cJSON_GetObjectItemCaseSensitive(j, "model");
    if (model && !cJSON_IsNull(model) && (!cJSON_IsString(model) || strcmp(model->valuestring, s->name))) {
        b->status = 404;
        b->param = "model";
        b->code = "model_not_found";
        snprintf(b->msg, sizeof b->msg, "the model '%s' does not exist; this server serves '%s'",
                 cJSON_IsString(model) ? model->valuestring : "?", s->name);
        goto out;
    }
    if (chat) {
        const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(j, "messages");
        if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0) {
            fail_bad(b, "messages", "'messages' must be a non-empty array");
            goto out;
        }
        const cJSON *tools = cJSON_GetObjectItemCaseSensitive(j, "tools");
        const cJSON *choice = cJSON_GetObjectItemCaseSensitive(j, "tool_choice");
        if (check_tools(tools, choice, b))
            goto out;
        /* the render request: the client's fields, defaulting to non-thinking chat */
        cJSON *rq = cJSON_Duplicate(j, 1);
        if (cJSON_IsString(choice) && !strcmp(choice->valuestring, "none")) {
            cJSON_DeleteItemFromObjectCaseSensitive(rq, "tools");
        } else if (cJSON_GetArraySize(tools) > 0) {
            /* the encoder keeps tools on a system message: give the conversation an empty one */
            cJSON *ms = cJSON_GetObjectItemCaseSensitive(rq, "messages");
            const cJSON *role = cJSON_GetObjectItemCaseSensitive(ms->child, "role");
            if (!cJSON_IsString(role) || strcmp(role->valuestring, "system")) {
                cJSON *sys = cJSON_CreateObject();
                cJSON_AddStringToObject(sys, "role", "system");
                cJSON_AddStringToObject(sys, "content", "");
                cJSON_InsertItemInArray(ms, 0, sys);
            }
        }
        if (!cJSON_GetObjectItemCaseSensitive(rq, "family"))
            cJSON_AddStringToObject(rq, "family", s->family);
        if (!cJSON_GetObjectItemCaseSensitive(rq, "thinking_mode")) {
            const cJSON *re = cJSON_GetObjectItemCaseSensitive(j, "reasoning_effort");
            cJSON_AddStringToObject(rq, "thinking_mode", re && !cJSON_IsNull(re) ? "thinking" : "chat");
        }
        const cJSON *tm = cJSON_GetObjectItemCaseSensitive(rq, "thinking_mode");
        const cJSON *fam = cJSON_GetObjectItemCaseSensitive(rq, "family");
        g->dsml = dsv4_dsml_new_family(cJSON_IsString(tm) && !strcmp(tm->valuestring, "thinking"),
                                       cJSON_IsString(fam) && !strcmp(fam->valuestring, "deepseek_v4"), &err);
        if (!g->dsml) {
            cJSON_Delete(rq);
            fail_bad(b, NULL, "%s", err.msg);
            goto out;
        }
        char *text = NULL;
        size_t len = 0;
        int r = dsv4_chat_render(rq, &text, &len, &err);
        cJSON_Delete(rq);
        if (r) {
            fail_bad(b, "messages", "%s", err.msg);
            goto out;
        }
        r = dsv4_tokenizer_encode(s->tok, text, len, &ids, &err);
        free(text);
        if (r) {
            fail_bad(b, "messages", "%s", err.msg);
            goto out;
        }
        int lp = 0;
        int64_t top = 0;
        if (get_bool(j, "logprobs", &lp, b) || get_int(j, "top_logprobs", 0, DSV4_MAX_TOP_LOGPROBS, &top, b))
            goto out;
        if (top > 0 && !lp) {
            fail_bad(b, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
            goto out;
        }
        g->n_logprobs = lp ? (int)top : -1;
    } else {
        if (parse_prompt(s, prompt, &ids, &g->prompt_text, b))
            goto out;
        int64_t lp = -1;
        if (get_int(j, "logprobs", 0, DSV4_MAX_TOP_LOGPROBS, &lp, b) || get_bool(j, "echo", &g->echo, b))
            goto out;
        g->n_logprobs = (int)lp;
    }
    if (ids.n == 0) {
        fail_bad(b, chat ? "messages" : "prompt", "the prompt is empty");
        goto out;
    }
    g->r = dsv4_request_new(ids.v, (int)ids.n, &err);
    if (!g->r) {
        fail_bad(b, NULL, "out of memory");
        goto out;
    }
    if (parse_sampling(s, g, j, raw, raw_n, g->r, b))
        goto out;
    g->r->sp.n_top_logprobs = g->n_logprobs > 0 ? g->n_logprobs : 0;
    if (g->echo) {
        if (!g->prompt_text) {
            char *t = NULL;
            size_t tl;
            if (!dsv4_tokenizer_decode(s->tok, ids.v, ids.n, 0, &t, &tl, &err))
                g->prompt_text = t;
        }
        g->r->prompt_logprobs = g->n_logprobs >= 0;
    }
    rc = 0;
out:
    dsv4_ids_free(&ids);
    if (rc) {
        if (!b->status)
            b->status = 400;
        gen_free(g);
        return NULL;
    }
    return g;
}

/* Queues g. Returns 0 when queued, 1 when the queue is full (room may come), -1 with *b set
 * otherwise (503 while shutting down). */
static int gen_submit(gen *g, bad *b)
{
    dsv4_err err = {0};
    int rc = dsv4_lanes_submit(g->s->lanes, g->r, &err);
    if (rc == 0)
        return 0;
    if (rc == DSV4_E_STATE) {
        b->status = 503;
        snprintf(b->msg, sizeof b->msg, "%.400s; retry later", err.msg);
        return 1;
    }
    if (rc == DSV4_E_CLOSED) {
        b->status = 503;
        snprintf(b->msg, sizeof b->msg, "%.400s", err.msg);
    } else {
        fail_bad(b, g->chat ? "messages" : "prompt", "%s", err.msg);
    }
    return -1;
}

/* Frees gs[0..n) (the list too), logging each with status. */
static void gens_free(gen **gs, int n, int status)
{
    for (int i = 0; gs && i < n; i++) {
        if (status)
            log_line(gs[i], status);
        gen_free(gs[i]);
    }
    free(gs);
}

/* Parses a generation request into its prompts' generations: one, or one per prompt of a
 * completions list. Returns their number with *out set, or 0 with *b set. */
static int gen_parse_all(server *s, const cJSON *j, const char *raw, size_t raw_n, int chat, const char *path, gen ***out, bad *b)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prompt");
    if (!chat && !p) {
        fail_bad(b, "prompt", "'prompt' is required");
        return 0;
    }
    int n = !chat && cJSON_IsArray(p) && (cJSON_IsString(p->child) || cJSON_IsArray(p->child)) ? cJSON_GetArraySize(p) : 1;
    if (n > 1) {
        int stream = 0;
        if (get_bool(j, "stream", &stream, b))
            return 0;
        if (stream)
            fail_bad(b, "stream", "a list of prompts is answered whole: 'stream' takes one prompt");
        else if (n > MAX_BATCH)
            fail_bad(b, "prompt", "at most %d prompts per request", MAX_BATCH);
        if (stream || n > MAX_BATCH)
            return 0;
    }
    gen **gs = calloc((size_t)n, sizeof *gs);
    if (!gs) {
        fail_bad(b, NULL, "out of memory");
        b->status = 500;
        return 0;
    }
    const cJSON *pi = n > 1 ? p->child : p;
    int64_t scored = 0;
    for (int i = 0; i < n; i++, pi = pi ? pi->next : NULL) {
        if (!(gs[i] = gen_parse(s, j, raw, raw_n, chat, pi, path, b))) {
            gens_free(gs, i, 0);
            return 0;
        }
        scored += (gs[i]->r->prompt_logprobs ? gs[i]->r->n_prompt : 0) + gs[i]->r->n_forced;
    }
    /* scoring replies grow with the tokens scored times the alternatives each lists */
    if (scored > s->max_score_tokens) {
        gens_free(gs, n, 0);
        b->code = "max_score_tokens_exceeded";
        fail_bad(b, "prompt", "the request scores %lld given tokens (echoed prompt with logprobs, forced_tokens); "
                 "this server scores at most %d per request (--max-score-tokens)", (long long)scored, s->max_score_tokens);
        return 0;
    }
    *out = gs;
    return n;
}

/* One choice of a finished non-streaming reply. */
static cJSON *choice_json(gen *g, int index)
{
    const int chat = g->chat;
    if (chat)
        chat_parse(g, g->text.n);
    cJSON *c0 = cJSON_CreateObject();
    cJSON_AddNumberToObject(c0, "index", index);
    if (chat) {
        cJSON *msg = cJSON_AddObjectToObject(c0, "message");
        cJSON_AddStringToObject(msg, "role", "assistant");
        int n_calls = cJSON_GetArraySize(g->dout.calls);
        if (n_calls && !g->dout.content.n)
            cJSON_AddNullToObject(msg, "content");
        else
            cJSON_AddStringToObject(msg, "content", g->dout.content.n ? g->dout.content.p : "");
        if (g->dout.has_reasoning)
            cJSON_AddStringToObject(msg, "reasoning_content", g->dout.reasoning.n ? g->dout.reasoning.p : "");
        if (n_calls)
            cJSON_AddItemToObject(msg, "tool_calls", tool_calls_json(g, 0, 0));
        if (g->n_logprobs >= 0)
            cJSON_AddItemToObject(c0, "logprobs", chat_logprobs(g, 0, g->n_tok));
        else
            cJSON_AddNullToObject(c0, "logprobs");
    } else {
        dsv4_buf t = {0};
        size_t base = 0;
        if (g->echo && g->prompt_text) {
            dsv4_buf_puts(&t, g->prompt_text);
            base = t.n;
        }
        dsv4_buf_put(&t, g->text.p ? g->text.p : "", g->text.n);
        cJSON_AddStringToObject(c0, "text", t.p ? t.p : "");
        dsv4_buf_free(&t);
        if (g->n_logprobs >= 0)
            cJSON_AddItemToObject(c0, "logprobs", completion_logprobs(g, 0, g->n_tok, base, g->echo));
        else
            cJSON_AddNullToObject(c0, "logprobs");
    }
    cJSON_AddStringToObject(c0, "finish_reason", finish_name(g));
    if (g->want_ids)
        cJSON_AddItemToObject(c0, "token_ids", ids_json(g, 0, g->n_tok));
    return c0;
}

/* A non-streamed generation request, each time its handler runs: queues the prompts that wait
 * for room, takes the tokens there are, answers when every prompt has ended, else suspends. */
static enum MHD_Result gen_continue(server *s, struct MHD_Connection *c, conn *k)
{
    bad b = {0};
    if (k->w.gone || client_gone(c)) {
        for (int i = 0; i < k->n; i++)
            if (!k->gs[i]->finish)
                k->gs[i]->finish = DSV4_FINISH_CANCELLED;
        gens_free(k->gs, k->n, 499);
        k->gs = NULL;
        return MHD_NO;
    }
    while (k->n_sub < k->n) {
        int rc = gen_submit(k->gs[k->n_sub], &b);
        if (rc > 0)
            break;
        if (rc < 0) {
            gens_free(k->gs, k->n, b.status);
            k->gs = NULL;
            return send_error(s, c, b.status, b.param, b.code, "%s", b.msg);
        }
        k->n_sub++;
    }
    int done = k->n_sub == k->n;
    for (int i = 0; i < k->n_sub; i++)
        done &= gen_drain(k->gs[i]);
    if (!done) {
        double retry = k->n_sub < k->n ? dsv4_now() + ROOM_RETRY_S : 0; /* submit the rest then */
        if (suspend_on(s, c, &k->w, k->gs, k->n_sub, retry) == 0)
            return MHD_YES;
        gens_free(k->gs, k->n, 503); /* stopping */
        k->gs = NULL;
        return send_error(s, c, 503, NULL, NULL, "the server is shutting down");
    }
    gen **gs = k->gs;
    int n = k->n, failed = -1;
    for (int i = 0; i < n && failed < 0; i++)
        if (gs[i]->finish == DSV4_FINISH_ERROR)
            failed = i;
    enum MHD_Result res;
    if (failed >= 0) {
        res = send_error(s, c, 500, NULL, NULL, "generation failed: %s", gs[failed]->r->errmsg);
    } else {
        cJSON *resp = envelope(gs[0], k->chat ? "chat.completion" : "text_completion");
        cJSON *ch = cJSON_AddArrayToObject(resp, "choices");
        int prompt = 0, cached = 0, completion = 0;
        int64_t dsteps = 0, dprop = 0, dkept = 0;
        for (int i = 0; i < n; i++) {
            cJSON_AddItemToArray(ch, choice_json(gs[i], i));
            prompt += gs[i]->r->n_prompt;
            cached += gs[i]->r->n_cached;
            completion += gs[i]->n_tok;
            dsteps += gs[i]->r->draft_steps;
            dprop += gs[i]->r->draft_proposed;
            dkept += gs[i]->r->draft_kept;
        }
        cJSON *u = cJSON_AddObjectToObject(resp, "usage");
        cJSON_AddNumberToObject(u, "prompt_tokens", prompt);
        cJSON_AddNumberToObject(u, "completion_tokens", completion);
        cJSON_AddNumberToObject(u, "total_tokens", prompt + completion);
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "prompt_tokens_details"), "cached_tokens", cached);
        if (dsteps)
            draft_usage(u, dsteps, dprop, dkept);
        res = send_json(c, 200, resp);
    }
    gens_free(gs, n, failed >= 0 ? 500 : 200);
    k->gs = NULL;
    return res;
}

/* /v1/completions (chat 0) and /v1/chat/completions (chat 1): parse and queue the generation,
 * then answer with a stream, or wait (suspended) for the whole reply. A completions prompt may
 * be a list of prompts (strings or id lists): one choice each, not streamed; when the queue
 * fills, the later ones wait for room (a first one is refused with 503). */
static enum MHD_Result generate(server *s, struct MHD_Connection *c, conn *k, const cJSON *j, int chat, const char *path)
{
    bad b = {0};
    gen **gs = NULL;
    int n = gen_parse_all(s, j, k->body.p, k->body.n, chat, path, &gs, &b);
    if (n > 0 && gen_submit(gs[0], &b) != 0) {
        gens_free(gs, n, b.status);
        n = 0;
        gs = NULL;
    } else if (n == 0) {
        gen tmp = {.s = s, .path = path, .id = "-", .t0 = dsv4_now()};
        log_line(&tmp, b.status ? b.status : 400);
    }
    if (n == 0)
        return send_error(s, c, b.status ? b.status : 400, b.param, b.code, "%s", b.msg);
    gen *g = gs[0];
    if (g->stream) {
        free(gs);
        g->c = c;
        g->last_sent = dsv4_now();
        struct MHD_Response *rs = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, g, stream_done);
        MHD_add_response_header(rs, "Content-Type", "text/event-stream");
        MHD_add_response_header(rs, "Cache-Control", "no-cache");
        enum MHD_Result ok = MHD_queue_response(c, 200, rs);
        MHD_destroy_response(rs);
        return ok;
    }
    k->gs = gs;
    k->n = n;
    k->n_sub = 1;
    k->chat = chat;
    return gen_continue(s, c, k);
}

/* POST /tokenize {"prompt": str}: the ids, no BOS added. */
static enum MHD_Result tokenize(server *s, struct MHD_Connection *c, const cJSON *j)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prompt");
    if (!p)
        p = cJSON_GetObjectItemCaseSensitive(j, "text");
    if (!cJSON_IsString(p))
        return send_error(s, c, 400, "prompt", NULL, "'prompt' must be a string");
    dsv4_ids ids = {0};
    dsv4_err err = {0};
    if (dsv4_tokenizer_encode(s->tok, p->valuestring, strlen(p->valuestring), &ids, &err)) {
        dsv4_ids_free(&ids);
        return send_error(s, c, 400, "prompt", NULL, "%s", err.msg);
    }
    cJSON *r = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(r, "tokens");
    for (size_t i = 0; i < ids.n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(ids.v[i]));
    cJSON_AddNumberToObject(r, "count", (double)ids.n);
    cJSON_AddNumberToObject(r, "max_model_len", (double)s->ctx);
    dsv4_ids_free(&ids);
    return send_json(c, 200, r);
}

/* POST /detokenize {"tokens": [...]}: the text, special tokens included. */
static enum MHD_Result detokenize(server *s, struct MHD_Connection *c, const cJSON *j)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "tokens");
    if (!cJSON_IsArray(t))
        return send_error(s, c, 400, "tokens", NULL, "'tokens' must be an array of token ids");
    int n = cJSON_GetArraySize(t), i = 0;
    int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
    if (!ids)
        return send_error(s, c, 500, NULL, NULL, "out of memory");
    const cJSON *x;
    cJSON_ArrayForEach(x, t)
    {
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= s->vocab || x->valuedouble != floor(x->valuedouble)) {
            free(ids);
            return send_error(s, c, 400, "tokens", NULL, "'tokens' must hold token ids in [0, %d)", s->vocab);
        }
        ids[i++] = (int32_t)x->valuedouble;
    }
    char *out = NULL;
    size_t len;
    dsv4_err err = {0};
    int rc = dsv4_tokenizer_decode(s->tok, ids, (size_t)n, 0, &out, &len, &err);
    free(ids);
    if (rc)
        return send_error(s, c, 400, "tokens", NULL, "%s", err.msg);
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "prompt", out);
    free(out);
    return send_json(c, 200, r);
}

/* GET /metrics in Prometheus text format. */
static enum MHD_Result metrics(server *s, struct MHD_Connection *c)
{
    dsv4_lanes_stats st;
    dsv4_lanes_get_stats(s->lanes, &st);
    char *b = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&b, &n);
    if (!f)
        return MHD_NO;
#define M(name, type, help, fmt, v) fprintf(f, "# HELP " name " " help "\n# TYPE " name " " type "\n" name " " fmt "\n", v)
    M("dsv4_http_requests_total", "counter", "HTTP requests received.", "%" PRIu64, (uint64_t)atomic_load(&s->http_requests));
    M("dsv4_http_errors_total", "counter", "HTTP requests answered with an error.", "%" PRIu64, (uint64_t)atomic_load(&s->http_errors));
    M("dsv4_requests_total", "counter", "Generation requests started.", "%" PRIu64, st.requests);
    M("dsv4_prompt_tokens_total", "counter", "Prompt tokens of started requests.", "%" PRIu64, st.prompt_tokens);
    M("dsv4_cached_prompt_tokens_total", "counter", "Prompt tokens served from the prompt cache.", "%" PRIu64, st.cached_tokens);
    M("dsv4_generated_tokens_total", "counter", "Tokens generated.", "%" PRIu64, st.generated_tokens);
    M("dsv4_draft_proposed_tokens_total", "counter", "Tokens proposed by drafts.", "%" PRIu64, st.draft_proposed);
    M("dsv4_draft_kept_tokens_total", "counter", "Proposed tokens kept (each equal to the plain draw).", "%" PRIu64,
      st.draft_kept);
    M("dsv4_steps_total", "counter", "Scheduler steps (batched forward passes).", "%" PRIu64, st.steps);
    M("dsv4_busy_seconds_total", "counter", "Seconds spent in steps.", "%.6f", st.busy_seconds);
    M("dsv4_lanes", "gauge", "Concurrent sequences.", "%d", st.n_lanes);
    M("dsv4_lanes_busy", "gauge", "Lanes serving a request.", "%d", st.busy);
    M("dsv4_queue_length", "gauge", "Requests waiting for a lane.", "%d", st.queued);
    M("dsv4_cache_entries", "gauge", "Saved states in the prompt cache.", "%zu", st.cache_entries);
    M("dsv4_cache_bytes", "gauge", "Bytes held by the prompt cache.", "%zu", st.cache_bytes);
    int open = 0;
    pthread_mutex_lock(&s->smu);
    for (const sock *x = s->socks; x; x = x->next)
        open += !x->leaving;
    pthread_mutex_unlock(&s->smu);
    M("dsv4_http_connections", "gauge", "Open HTTP connections.", "%d", open);
    M("dsv4_http_connections_closed_idle_total", "counter", "Idle connections closed to make room for new ones.", "%" PRIu64,
      (uint64_t)atomic_load(&s->conns_closed_idle));
    M("dsv4_http_connections_refused_total", "counter", "Connections over the limits with none idle to close (told 503).",
      "%" PRIu64, (uint64_t)atomic_load(&s->conns_refused));
#undef M
    histo_write(f, "dsv4_time_to_first_token_seconds", "Submission to first generated token, successful requests.", &s->ttft);
    histo_write(f, "dsv4_request_duration_seconds", "Whole generation requests, successful ones.", &s->duration);
    fclose(f);
    return send_text(c, 200, "text/plain; version=0.0.4", b, n);
}

/* The model object of /v1/models. */
static cJSON *model_json(const server *s)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", s->name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", 0);
    cJSON_AddStringToObject(m, "owned_by", "dsv4");
    cJSON_AddNumberToObject(m, "max_model_len", (double)s->ctx);
    cJSON_AddStringToObject(m, "family", s->family);
    return m;
}

/* The body as a JSON object: valid UTF-8 (RFC 8259; also, nothing echoed from it can make a
 * reply invalid), well-formed, one object and nothing after it but white space. NULL with b->msg set otherwise. */
static cJSON *parse_body(const char *p, size_t n, bad *b)
{
    int incomplete = 0;
    size_t ok = dsv4_utf8_valid_prefix((const unsigned char *)(p ? p : ""), n, &incomplete);
    if (ok < n) {
        fail_bad(b, NULL, "the body is not valid UTF-8 (at byte %zu)", ok);
        return NULL;
    }
    const char *end = NULL;
    cJSON *j = n ? cJSON_ParseWithLengthOpts(p, n, &end, 0) : NULL;
    while (j && end && end < p + n && strchr(" \t\r\n", *end) && *end)
        end++;
    if (!j || !cJSON_IsObject(j) || (end && end < p + n)) {
        cJSON_Delete(j);
        fail_bad(b, NULL, "the body must be one JSON object");
        return NULL;
    }
    return j;
}

/* The request's framing and credentials, counted over every header of the request. */
typedef struct head_scan {
    int n_auth, n_length, n_te;
    const char *auth, *length, *te;
    int lengths_differ;
} head_scan;

static enum MHD_Result scan_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    head_scan *h = cls;
    if (!key)
        return MHD_YES;
    if (!strcasecmp(key, "Authorization")) {
        h->n_auth++;
        h->auth = value;
    } else if (!strcasecmp(key, "Content-Length")) {
        if (h->n_length++ && strcmp(h->length, value ? value : ""))
            h->lengths_differ = 1;
        h->length = value ? value : "";
    } else if (!strcasecmp(key, "Transfer-Encoding")) {
        h->n_te++;
        h->te = value ? value : "";
    }
    return MHD_YES;
}

/* 1 when a and b are equal, in time that depends only on their lengths. */
static int same_secret(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    unsigned char d = na != nb;
    for (size_t i = 0; i < na && i < nb; i++)
        d |= (unsigned char)(a[i] ^ b[i]);
    return d == 0;
}

/* "Bearer <key>" with the scheme in any case (RFC 9110 11.1), from exactly one header. */
static int auth_ok(const server *s, const head_scan *h)
{
    if (h->n_auth != 1 || !h->auth || strncasecmp(h->auth, "Bearer ", 7))
        return 0;
    const char *t = h->auth + 7;
    while (*t == ' ')
        t++;
    return same_secret(t, s->api_key);
}

/* The socket record of c (NULL only when out of memory at its opening). */
static sock *sock_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* A request's first call (its headers are in): marks its connection busy, and refuses a
 * connection over the limits and a request whose framing is ambiguous (two lengths, or a
 * length beside Transfer-Encoding: a proxy in front may read it otherwise) at once; a bad
 * credential is answered once the body is read (and dropped). */
static enum MHD_Result request_start(server *s, struct MHD_Connection *c, const char *url, conn *k)
{
    sock *sk = sock_of(c);
    int refused = 0;
    if (sk) {
        pthread_mutex_lock(&s->smu);
        sk->busy = 1;
        refused = sk->refused;
        pthread_mutex_unlock(&s->smu);
    }
    if (refused)
        return send_error_close(s, c, 503, NULL, "the server is at its connection limit; retry later");
    head_scan h = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, scan_header, &h);
    if (h.n_length > 1 && h.lengths_differ)
        return send_error_close(s, c, 400, "bad_framing", "the request has Content-Length headers that differ");
    if (h.n_length && h.n_te)
        return send_error_close(s, c, 400, "bad_framing", "the request has both Content-Length and Transfer-Encoding");
    if (h.n_te > 1)
        return send_error_close(s, c, 400, "bad_framing", "the request has more than one Transfer-Encoding header");
    /* RFC 9112 6.1: without chunked last there is no length to find; and only the very word is
     * taken, as libmicrohttpd reads it (it ignores "chunked " with a space) */
    if (h.n_te && strcasecmp(h.te, "chunked"))
        return send_error_close(s, c, 400, "bad_framing", "Transfer-Encoding other than chunked is not supported");
    if (s->api_key && strcmp(url, "/health") && strcmp(url, "/") && !auth_ok(s, &h)) {
        k->deny_status = 401;
        k->deny_code = "invalid_api_key";
        k->deny_msg = h.n_auth > 1 ? "send one Authorization header, not several"
                                   : "a valid API key is required (Authorization: Bearer ...)";
    }
    return MHD_YES;
}

/* libmicrohttpd's request handler: collects the body over calls, then routes; a suspended
 * generation's handler runs again on each resume. */
static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    (void)version;
    server *s = cls;
    conn *k = *con_cls;
    if (!k) {
        k = calloc(1, sizeof *k);
        if (!k)
            return MHD_NO;
        *con_cls = k;
        atomic_fetch_add(&s->http_requests, 1);
        return request_start(s, c, url, k);
    }
    if (k->gs)
        return gen_continue(s, c, k);
    if (*upload_size) {
        if (k->deny_status)
            ; /* not kept */
        else if (k->body.n + *upload_size > MAX_BODY)
            k->too_big = 1;
        else
            dsv4_buf_put(&k->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (k->deny_status)
        return send_error(s, c, k->deny_status, NULL, k->deny_code, "%s", k->deny_msg);
    int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (!strcmp(url, "/") && get) /* the page is public; its API calls carry the key */
        return send_text(c, 200, "text/html; charset=utf-8", strdup(dsv4_webui_html), strlen(dsv4_webui_html));
    if (!strcmp(url, "/health") && get) {
        cJSON *r = cJSON_CreateObject();
        cJSON_AddStringToObject(r, "status", "ok");
        return send_json(c, 200, r);
    }
    if (!strcmp(url, "/v1/models") && get) {
        cJSON *r = cJSON_CreateObject(), *d = cJSON_AddArrayToObject(r, "data");
        cJSON_AddStringToObject(r, "object", "list");
        cJSON_AddItemToArray(d, model_json(s));
        return send_json(c, 200, r);
    }
    if (!strncmp(url, "/v1/models/", 11) && get) {
        if (strcmp(url + 11, s->name))
            return send_error(s, c, 404, "model", "model_not_found", "the model '%s' does not exist", url + 11);
        return send_json(c, 200, model_json(s));
    }
    if (!strcmp(url, "/metrics") && get)
        return metrics(s, c);
    static const char *posts[] = {"/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"};
    int which = -1;
    for (int i = 0; i < 4; i++)
        if (!strcmp(url, posts[i]))
            which = i;
    if (which < 0) {
        if (!strcmp(url, "/health") || !strncmp(url, "/v1/models", 10) || !strcmp(url, "/metrics") || !strcmp(url, "/"))
            return send_error(s, c, 405, NULL, NULL, "%s %s is not allowed", method, url);
        return send_error(s, c, 404, NULL, NULL, "no route for %s %s", method, url);
    }
    if (!post)
        return send_error(s, c, 405, NULL, NULL, "%s needs POST", url);
    if (k->too_big || k->body.oom)
        return send_error(s, c, 413, NULL, NULL, "the request body exceeds %d bytes", MAX_BODY);
    bad b = {0};
    cJSON *j = parse_body(k->body.p, k->body.n, &b);
    if (!j)
        return send_error(s, c, 400, NULL, "invalid_json", "%s", b.msg);
    enum MHD_Result res = which == 0   ? generate(s, c, k, j, 0, posts[0])
                          : which == 1 ? generate(s, c, k, j, 1, posts[1])
                          : which == 2 ? tokenize(s, c, j)
                                       : detokenize(s, c, j);
    cJSON_Delete(j);
    return res;
}

/* Frees a request's state once libmicrohttpd is done with it; its connection is idle again. */
static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode why)
{
    (void)why;
    server *s = cls;
    conn *k = *con_cls;
    if (k) {
        gens_free(k->gs, k->n, 499);
        dsv4_buf_free(&k->body);
        free(k);
    }
    *con_cls = NULL;
    sock *sk = sock_of(c);
    if (sk) {
        pthread_mutex_lock(&s->smu);
        sk->busy = 0;
        sk->t_last = dsv4_now();
        pthread_mutex_unlock(&s->smu);
    }
}

/* Closes x to make room (the polling thread that owns it sees end of file and frees it).
 * Connections lock held. */
static void sock_close_locked(server *s, sock *x)
{
    x->leaving = 1;
    shutdown(x->fd, SHUT_RDWR);
    atomic_fetch_add(&s->conns_closed_idle, 1);
}

/* libmicrohttpd's connection callback: counts connections by client address, making room for
 * a new one past a limit by closing the idlest idle connection (that client's, or anyone's). */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode toe)
{
    server *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        sock *k = *socket_context;
        if (!k)
            return;
        pthread_mutex_lock(&s->smu);
        if (k->prev)
            k->prev->next = k->next;
        else
            s->socks = k->next;
        if (k->next)
            k->next->prev = k->prev;
        pthread_mutex_unlock(&s->smu);
        free(k);
        *socket_context = NULL;
        return;
    }
    sock *k = calloc(1, sizeof *k);
    if (!k)
        return;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    k->fd = ci ? ci->connect_fd : -1;
    ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (ci && ci->client_addr && ci->client_addr->sa_family == AF_INET)
        k->ip = ((const struct sockaddr_in *)ci->client_addr)->sin_addr.s_addr;
    k->t_last = dsv4_now();
    pthread_mutex_lock(&s->smu);
    int total = 0, mine = 0;
    sock *idlest = NULL, *idlest_mine = NULL;
    for (sock *x = s->socks; x; x = x->next) {
        if (x->leaving)
            continue;
        int same = x->ip == k->ip;
        total++;
        mine += same;
        if (x->busy || x->fd < 0)
            continue;
        if (!idlest || x->t_last < idlest->t_last)
            idlest = x;
        if (same && (!idlest_mine || x->t_last < idlest_mine->t_last))
            idlest_mine = x;
    }
    if (mine >= s->client_conns) {
        if (idlest_mine)
            sock_close_locked(s, idlest_mine);
        else
            k->refused = 1;
    } else if (total >= s->max_conns) {
        if (idlest)
            sock_close_locked(s, idlest);
        else
            k->refused = 1;
    }
    if (k->refused)
        atomic_fetch_add(&s->conns_refused, 1);
    k->next = s->socks;
    if (s->socks)
        s->socks->prev = k;
    s->socks = k;
    pthread_mutex_unlock(&s->smu);
    *socket_context = k;
}

enum { FD_SPARE = 256 }; /* open files besides connections: model shards, epoll, eventfds */

/* Raises the open-file limit to what *max_conns connections need, up to the hard limit. Past
 * it, a --max-connections given is refused and the default lowered to fit. */
static int raise_fd_limit(int *max_conns, int given, dsv4_err *err)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur == RLIM_INFINITY)
        return 0;
    rlim_t need = (rlim_t)*max_conns + REFUSED_SLACK + FD_SPARE;
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need) {
        if (given || rl.rlim_max < REFUSED_SLACK + FD_SPARE + 64)
            return dsv4_fail(err, DSV4_E_ARG, "%d connections need %llu open files; the hard limit is %llu (ulimit -Hn)", *max_conns,
                             (unsigned long long)need, (unsigned long long)rl.rlim_max);
        *max_conns = (int)(rl.rlim_max - REFUSED_SLACK - FD_SPARE);
        need = rl.rlim_max;
        dsv4_log("dsv4 serve: the open-file hard limit %llu allows %d connections (--max-connections)",
                 (unsigned long long)rl.rlim_max, *max_conns);
    }
    if (rl.rlim_cur < need) {
        rl.rlim_cur = need;
        if (setrlimit(RLIMIT_NOFILE, &rl))
            return dsv4_fail(err, DSV4_E_ARG, "cannot raise the open-file limit to %llu", (unsigned long long)need);
    }
    return 0;
}

int dsv4_serve(const dsv4_server_opts *o, dsv4_err *err)
{
    if (o->api_key && !*o->api_key)
        return dsv4_fail(err, DSV4_E_ARG, "the API key is empty (an empty Bearer token would be valid)");
    server s = {.efd = -1};
    s.max_conns = o->max_connections > 0 ? o->max_connections : DSV4_DEFAULT_MAX_CONNECTIONS;
    s.client_conns = o->client_connections > 0 ? o->client_connections : DSV4_DEFAULT_CLIENT_CONNECTIONS;
    s.max_score_tokens = o->max_score_tokens > 0 ? o->max_score_tokens : DSV4_DEFAULT_MAX_SCORE_TOKENS;
    s.draft = o->draft;
    unsigned idle = o->idle_timeout_s > 0 ? (unsigned)o->idle_timeout_s : DSV4_DEFAULT_IDLE_TIMEOUT;
    if (s.max_conns > 1 << 20)
        return dsv4_fail(err, DSV4_E_ARG, "--max-connections %d is over 1048576", s.max_conns);
    if (raise_fd_limit(&s.max_conns, o->max_connections > 0, err))
        return err->code;
    if (s.client_conns > s.max_conns)
        s.client_conns = s.max_conns;
    s.m = dsv4_model_load(o->model_dir, &o->load, err);
    if (!s.m)
        return err->code;
    s.tok = dsv4_tokenizer_load(o->tokenizer ? o->tokenizer : o->model_dir, err);
    if (!s.tok) {
        dsv4_err_prefix(err, "tokenizer (give --tokenizer DIR when the model folder has none)");
        dsv4_model_free(s.m);
        return err->code;
    }
    dsv4_model_info mi;
    dsv4_model_get_info(s.m, &mi);
    s.vocab = mi.vocab_size;
    s.eos = mi.eos_id;
    s.ctx = mi.max_position;
    s.family = mi.family;
    { /* admission: the context each lane can reach within the KV-cache budget, before any allocation */
        int lanes = o->n_lanes ? o->n_lanes : 4;
        size_t budget = o->kv_budget;
        if (!budget) {
            long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
            budget = pages > 0 && psz > 0 ? (size_t)pages * (size_t)psz / 2 : (size_t)8 << 30;
        }
        int64_t fit = dsv4_kv_fit(s.m, lanes, budget);
        if (fit < 1) {
            dsv4_fail(err, DSV4_E_ARG, "the KV-cache budget (%.1f MB) does not hold one empty sequence for each of %d lanes "
                      "(%.1f MB each)", budget / 1048576.0, lanes, dsv4_seq_bytes_at(s.m, 0) / 1048576.0);
            dsv4_tokenizer_free(s.tok);
            dsv4_model_free(s.m);
            return err->code;
        }
        if (fit < s.ctx) {
            s.ctx = fit;
            s.kv_limited = 1;
        }
        dsv4_log("dsv4 serve: %s KV caches; %lld tokens of context for each of %d lanes within %.0f MB of KV-cache budget "
                 "(%.1f B/token)", dsv4_model_kv(s.m), (long long)s.ctx, lanes, budget / 1048576.0,
                 (double)(dsv4_seq_bytes_at(s.m, 1 << 20) - dsv4_seq_bytes_at(s.m, 0)) / (1 << 20));
    }
    s.api_key = o->api_key;
    const char *base = strrchr(o->model_dir, '/');
    char name[256];
    snprintf(name, sizeof name, "%s", o->model_name ? o->model_name : base && base[1] ? base + 1 : o->model_dir);
    size_t nl = strlen(name);
    while (nl > 1 && name[nl - 1] == '/')
        name[--nl] = 0;
    char *clean_name = dsv4_utf8_sanitize(name, nl, &nl); /* it appears in JSON replies */
    s.name = clean_name ? clean_name : name;
    s.seed_base = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(dsv4_now() * 1e9);
    pthread_mutex_init(&s.smu, NULL);
    pthread_mutex_init(&s.wmu, NULL);
    s.efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    pthread_t waker;
    int waker_started = 0;
    struct MHD_Daemon *d = NULL;
    if (s.efd < 0) {
        dsv4_fail(err, DSV4_E_IO, "eventfd: %s", strerror(errno));
        goto fail;
    }
    dsv4_lanes_opts lop = {.n_lanes = o->n_lanes, .queue_max = o->queue_max, .max_rollback = o->load.max_rollback,
                           .n_threads = o->load.n_threads,
                           .cache_bytes = o->cache_bytes ? o->cache_bytes : (size_t)1 << 30,
                           .notify = lanes_notify, .notify_ctx = &s};
    s.lanes = dsv4_lanes_new(s.m, &lop, err);
    if (!s.lanes || dsv4_lanes_start(s.lanes, err))
        goto fail;
    if (pthread_create(&waker, NULL, waker_main, &s)) {
        dsv4_fail(err, DSV4_E_STATE, "cannot start the waker thread");
        goto fail;
    }
    waker_started = 1;

    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o->port)};
    if (inet_pton(AF_INET, o->host ? o->host : "127.0.0.1", &addr.sin_addr) != 1) {
        dsv4_fail(err, DSV4_E_ARG, "--host %s is not an IPv4 address", o->host);
        goto fail;
    }
    d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ITC,
                         0, NULL, NULL, handler, &s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                         MHD_OPTION_THREAD_POOL_SIZE, (unsigned)HTTP_THREADS,
                         MHD_OPTION_CONNECTION_LIMIT, (unsigned)(s.max_conns + REFUSED_SLACK),
                         MHD_OPTION_CONNECTION_TIMEOUT, idle,
                         MHD_OPTION_NOTIFY_COMPLETED, completed, &s,
                         MHD_OPTION_NOTIFY_CONNECTION, on_connection, &s, MHD_OPTION_END);
    if (!d) {
        dsv4_fail(err, DSV4_E_IO, "cannot listen on %s:%d", o->host ? o->host : "127.0.0.1", o->port);
        goto fail;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    dsv4_log("dsv4 serve: %s (%d lanes) listening on http://%s:%u", s.name, lop.n_lanes ? lop.n_lanes : 4,
             o->host ? o->host : "127.0.0.1", di ? di->port : (unsigned)o->port);

    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    int sig = 0;
    sigwait(&set, &sig);
    dsv4_log("dsv4 serve: signal %d, shutting down", sig);
    /* refuse new work and cancel what runs: every suspended request is resumed with its end
     * (a list of prompts waiting for room is told 503) */
    dsv4_lanes_shutdown(s.lanes);
    MHD_socket lfd = MHD_quiesce_daemon(d); /* stop accepting; the socket is ours to close */
    if (lfd != MHD_INVALID_SOCKET)
        close(lfd);
    /* let cancelled streams send their last events before connections are closed */
    for (double t0 = dsv4_now(); atomic_load(&s.active) > 0 && dsv4_now() - t0 < 10;) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    /* libmicrohttpd must not be stopped with a connection suspended: resume them all for good */
    pthread_mutex_lock(&s.wmu);
    s.final = 1;
    pthread_mutex_unlock(&s.wmu);
    lanes_notify(&s);
    for (double t0 = dsv4_now(); dsv4_now() - t0 < 5;) {
        pthread_mutex_lock(&s.wmu);
        int left = s.waiting != NULL;
        pthread_mutex_unlock(&s.wmu);
        if (!left)
            break;
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    MHD_stop_daemon(d);
    d = NULL;
    atomic_store(&s.waker_stop, 1);
    pthread_join(waker, NULL);
    waker_started = 0;
    dsv4_lanes_free(s.lanes);
    s.lanes = NULL;
    dsv4_log("dsv4 serve: stopped");
    dsv4_err_clear(err);
fail:
    if (d) {
        MHD_stop_daemon(d);
    }
    if (waker_started) {
        atomic_store(&s.waker_stop, 1);
        pthread_join(waker, NULL);
    }
    dsv4_lanes_free(s.lanes);
    if (s.efd >= 0)
        close(s.efd);
    pthread_mutex_destroy(&s.smu);
    pthread_mutex_destroy(&s.wmu);
    free(clean_name);
    dsv4_tokenizer_free(s.tok);
    dsv4_model_free(s.m);
    return err->code;
}

int dsv4_serve_parse(const dsv4_parse_model *pm, const char *path, const char *body, size_t n, dsv4_request **first, char *msg,
                     size_t cap)
{
    server s = {.tok = pm->tok, .name = pm->name ? pm->name : "model", .family = pm->family ? pm->family : "deepseek_v4",
                .vocab = pm->vocab, .eos = pm->eos, .ctx = pm->ctx,
                .max_score_tokens = pm->max_score_tokens > 0 ? pm->max_score_tokens : DSV4_DEFAULT_MAX_SCORE_TOKENS};
    if (first)
        *first = NULL;
    int chat = !strcmp(path, "/v1/chat/completions");
    bad b = {0};
    if (!chat && strcmp(path, "/v1/completions")) {
        b.status = 404;
        snprintf(b.msg, sizeof b.msg, "no route for POST %s", path);
    } else {
        cJSON *j = parse_body(body, n, &b);
        gen **gs = NULL;
        int ng = j ? gen_parse_all(&s, j, body, n, chat, path, &gs, &b) : 0;
        cJSON_Delete(j);
        if (ng > 0) {
            if (first) {
                *first = gs[0]->r;
                gs[0]->r = NULL;
            }
            gens_free(gs, ng, 0);
            b.status = 200;
        }
    }
    if (!b.status)
        b.status = 400;
    if (msg && cap)
        snprintf(msg, cap, "%s", b.status == 200 ? "" : b.msg);
    return b.status;
}
