/* http — the server's transport: libmicrohttpd, streaming, suspension, auth, limits, CORS.
 * What a request means and what its reply says is serve/openai.c's. See http.h.
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
#include "serve/openai.h"
#include "serve/webui.h"
#include "text/buf.h"
#include "text/tokenizer.h"
#include "text/tokmask.h"

enum { N_BUCKETS = 12,
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


/* One open connection (libmicrohttpd's socket context). */
typedef struct sock {
    struct sock *prev, *next;
    const struct server *srv;
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
    oai_gen **gs;             /* the generations it waits on */
    int n;
    double wake_at;           /* resume by then in any case (a stream's keep-alive, a list of prompts
                               * retrying for queue room); 0: none */
    double next_check;        /* when to look for a closed client end next */
    int gone;                 /* the client closed its end while suspended */
} waiter;

typedef struct server {
    oai_api a;                /* first: a generation's api pointer is its server's */
    dsv4_model *m;
    dsv4_lanes *lanes;
    const char *api_key;
    atomic_uint_fast64_t http_requests, http_errors;
    histo ttft, duration;     /* time to first token and whole request, of successful generations */
    long started;             /* when the server started (the model's "created") */
    /* CORS (--cors): any origin, none (no headers), or the origins listed */
    enum { CORS_ANY, CORS_NONE, CORS_LIST } cors;
    char **cors_origins;
    int n_cors;
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
    oai_gen **gs;             /* a non-streamed generation request: its prompts, n_sub of them queued */
    int n, n_sub;
    waiter w;
} conn;

/* A streamed generation's connection: libmicrohttpd's content callback hands out its SSE bytes. */
typedef struct stream {
    oai_gen *g;
    server *s;
    struct MHD_Connection *c;
    waiter w;                 /* its suspension */
    size_t sse_pos;           /* bytes of g->sse handed out */
    double last_sent;         /* when it last handed out bytes */
} stream;

/* ---- responses ------------------------------------------------------------------- */

static sock *sock_of(struct MHD_Connection *c);

/* The Access-Control-Allow-Origin a reply to origin gets: "*" (any), the origin itself (listed),
 * or NULL (none). */
static const char *cors_allow(const server *s, const char *origin)
{
    if (s->cors == CORS_ANY)
        return "*";
    if (s->cors == CORS_NONE || !origin)
        return NULL;
    for (int i = 0; i < s->n_cors; i++)
        if (!strcmp(s->cors_origins[i], origin))
            return origin;
    return NULL;
}

/* Queues rs (consumed) with the CORS headers the request's origin gets. */
static enum MHD_Result respond(struct MHD_Connection *c, unsigned status, struct MHD_Response *rs)
{
    const sock *k = sock_of(c);
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    const char *allow = k && k->srv ? cors_allow(k->srv, origin) : NULL;
    if (allow) {
        MHD_add_response_header(rs, "Access-Control-Allow-Origin", allow);
        if (strcmp(allow, "*"))
            MHD_add_response_header(rs, "Vary", "Origin");
    }
    enum MHD_Result ok = MHD_queue_response(c, status, rs);
    MHD_destroy_response(rs);
    return ok;
}

/* Queues a response owning body[0..n) (freed by libmicrohttpd). */
static enum MHD_Result send_text(struct MHD_Connection *c, int status, const char *type, char *body, size_t n)
{
    if (!body)
        return MHD_NO;
    struct MHD_Response *rs = MHD_create_response_from_buffer(n, body, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(rs, "Content-Type", type);
    return respond(c, (unsigned)status, rs);
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


/* OpenAI's error body (oai_error_json) as the reply. */
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
    return send_json(c, status, oai_error_json(status, param, code, msg));
}

/* As send_error, and the connection is closed after the reply (its framing cannot be trusted,
 * or it is over the connection limits). */
static enum MHD_Result send_error_close(server *s, struct MHD_Connection *c, int status, const char *code, const char *msg)
{
    atomic_fetch_add(&s->http_errors, 1);
    cJSON *e = oai_error_json(status, NULL, code, msg);
    char *b = cJSON_PrintUnformatted(e);
    cJSON_Delete(e);
    if (!b)
        return MHD_NO;
    struct MHD_Response *rs = MHD_create_response_from_buffer(strlen(b), b, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(rs, "Content-Type", "application/json");
    MHD_add_response_header(rs, "Connection", "close");
    return respond(c, (unsigned)status, rs);
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

static void log_line(oai_gen *g, int status)
{
    server *s = (server *)g->s; /* the api is the server's first member */
    const dsv4_request *r = g->r;
    double now = dsv4_now();
    double queue = r && r->t_start > 0 ? r->t_start - r->t_submit : 0;
    double ttft = r && r->t_first > 0 ? r->t_first - r->t_submit : 0;
    double gen_s = r && r->t_first > 0 && r->t_done > r->t_first ? r->t_done - r->t_first : 0;
    if (status == 200) {
        if (r && r->t_first > 0)
            histo_add(&s->ttft, ttft);
        histo_add(&s->duration, now - g->t0);
    }
    char drafted[64 + 24 * DSV4_DRAFT_MAX] = "";
    if (r && r->draft_steps) { /* kept/proposed, then kept/reached per proposal position */
        int o = snprintf(drafted, sizeof drafted, " draft=%lld/%lld at=", (long long)r->draft_kept, (long long)r->draft_proposed);
        for (int i = 0; i < DSV4_DRAFT_MAX && r->policy.reached[i] && o < (int)sizeof drafted; i++)
            o += snprintf(drafted + o, sizeof drafted - o, i ? ",%ld/%ld" : "%ld/%ld", r->policy.kept[i], r->policy.reached[i]);
    }
    dsv4_log("%s %s %d prompt=%d cached=%d generated=%d finish=%s queue=%.3fs ttft=%.3fs gen=%.3fs (%.1f tok/s) total=%.3fs%s",
             g->id, g->path, status, r ? r->n_prompt : 0, r ? r->n_cached : 0, g->n_tok, g->finish ? oai_finish_name(g) : "-",
             queue, ttft, gen_s, gen_s > 0 && g->n_tok > 1 ? (g->n_tok - 1) / gen_s : 0.0, now - g->t0, drafted);
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
static int suspend_on(server *s, struct MHD_Connection *c, waiter *w, oai_gen **gs, int n, double wake_at)
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
        oai_gen *g = w->gs[i];
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

/* ---- streaming, continued ---------------------------------------------------------- */

/* libmicrohttpd's content callback for a stream: hands out pending SSE bytes; with none, takes
 * what tokens there are, and with nothing new either suspends until there is (or a second has
 * passed: then a keep-alive comment, which also shows a client that left). */
static ssize_t stream_reader(void *cls, uint64_t pos, char *out, size_t max)
{
    (void)pos;
    stream *st = cls;
    oai_gen *g = st->g;
    while (st->sse_pos == g->sse.n) {
        if (g->final_sent)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (st->w.gone)
            return MHD_CONTENT_READER_END_WITH_ERROR;
        g->sse.n = 0;
        st->sse_pos = 0;
        oai_drain(g);
        oai_stream_events(g);
        if (g->sse.oom)
            return MHD_CONTENT_READER_END_WITH_ERROR;
        if (g->sse.n)
            break;
        double now = dsv4_now();
        if (now - st->last_sent >= 1.0) {
            dsv4_buf_puts(&g->sse, ": keep-alive\n\n");
            break;
        }
        if (suspend_on(st->s, st->c, &st->w, &st->g, 1, st->last_sent + 1.0))
            return MHD_CONTENT_READER_END_WITH_ERROR;
        return 0;
    }
    size_t n = g->sse.n - st->sse_pos;
    n = n < max ? n : max;
    memcpy(out, g->sse.p + st->sse_pos, n);
    st->sse_pos += n;
    st->last_sent = dsv4_now();
    return (ssize_t)n;
}

/* Called when the stream's response is dropped: finished, or the client went away (499). */
static void stream_done(void *cls)
{
    stream *st = cls;
    oai_gen *g = st->g;
    if (!g->finish) {
        g->finish = DSV4_FINISH_CANCELLED;
        log_line(g, 499); /* the client closed the stream */
    } else {
        log_line(g, 200);
    }
    oai_gen_free(g);
    free(st);
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

/* Queues g. Returns 0 when queued, 1 when the queue is full (room may come), -1 with *b set
 * otherwise (503 while shutting down). */
static int gen_submit(oai_gen *g, oai_bad *b)
{
    dsv4_err err = {0};
    int rc = dsv4_lanes_submit(((server *)g->s)->lanes, g->r, &err);
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
        oai_fail(b, g->chat ? "messages" : "prompt", "%s", err.msg);
    }
    return -1;
}

/* Frees gs[0..n) (the list too), logging each with status. */
static void gens_free(oai_gen **gs, int n, int status)
{
    for (int i = 0; gs && i < n; i++) {
        if (status)
            log_line(gs[i], status);
        oai_gen_free(gs[i]);
    }
    free(gs);
}

/* A non-streamed generation request, each time its handler runs: queues the prompts that wait
 * for room, takes the tokens there are, answers when every prompt has ended, else suspends. */
static enum MHD_Result gen_continue(server *s, struct MHD_Connection *c, conn *k)
{
    oai_bad b = {0};
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
        done &= oai_drain(k->gs[i]);
    if (!done) {
        double retry = k->n_sub < k->n ? dsv4_now() + ROOM_RETRY_S : 0; /* submit the rest then */
        if (suspend_on(s, c, &k->w, k->gs, k->n_sub, retry) == 0)
            return MHD_YES;
        gens_free(k->gs, k->n, 503); /* stopping */
        k->gs = NULL;
        return send_error(s, c, 503, NULL, NULL, "the server is shutting down");
    }
    oai_gen **gs = k->gs;
    int n = k->n, failed = -1;
    for (int i = 0; i < n && failed < 0; i++)
        if (gs[i]->finish == DSV4_FINISH_ERROR)
            failed = i;
    enum MHD_Result res;
    if (failed >= 0) {
        res = send_error(s, c, 500, NULL, NULL, "generation failed: %s", gs[failed]->r->errmsg);
    } else {
        cJSON *resp = oai_reply(gs, n);
        res = send_json(c, 200, resp);
    }
    gens_free(gs, n, failed >= 0 ? 500 : 200);
    k->gs = NULL;
    return res;
}

/* /v1/completions, /v1/chat/completions and /v1/responses (api: OAI_*): parse and queue the
 * generation, then answer with a stream, or wait (suspended) for the whole reply. A completions
 * prompt may be a list of prompts (strings or id lists): one choice each, not streamed; when
 * the queue fills, the later ones wait for room (a first one is refused with 503). */
static enum MHD_Result generate(server *s, struct MHD_Connection *c, conn *k, const cJSON *j, int api, const char *path)
{
    oai_bad b = {0};
    oai_gen **gs = NULL;
    int n = oai_parse_all(&s->a, j, k->body.p, k->body.n, api, path, &gs, &b);
    if (n > 0 && gen_submit(gs[0], &b) != 0) {
        gens_free(gs, n, b.status);
        n = 0;
        gs = NULL;
    } else if (n == 0) {
        oai_gen tmp = {.s = &s->a, .path = path, .id = "-", .t0 = dsv4_now()};
        log_line(&tmp, b.status ? b.status : 400);
    }
    if (n == 0)
        return send_error(s, c, b.status ? b.status : 400, b.param, b.code, "%s", b.msg);
    oai_gen *g = gs[0];
    if (g->stream) {
        free(gs);
        stream *st = calloc(1, sizeof *st);
        if (!st) {
            log_line(g, 500);
            oai_gen_free(g);
            return send_error(s, c, 500, NULL, NULL, "out of memory");
        }
        st->g = g;
        st->s = s;
        st->c = c;
        st->last_sent = dsv4_now();
        struct MHD_Response *rs = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, st, stream_done);
        MHD_add_response_header(rs, "Content-Type", "text/event-stream");
        MHD_add_response_header(rs, "Cache-Control", "no-cache");
        return respond(c, 200, rs);
    }
    k->gs = gs;
    k->n = n;
    k->n_sub = 1;
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
    if (dsv4_tokenizer_encode(s->a.tok, p->valuestring, strlen(p->valuestring), &ids, &err)) {
        dsv4_ids_free(&ids);
        return send_error(s, c, 400, "prompt", NULL, "%s", err.msg);
    }
    cJSON *r = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(r, "tokens");
    for (size_t i = 0; i < ids.n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(ids.v[i]));
    cJSON_AddNumberToObject(r, "count", (double)ids.n);
    cJSON_AddNumberToObject(r, "max_model_len", (double)s->a.ctx);
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
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= s->a.vocab || x->valuedouble != floor(x->valuedouble)) {
            free(ids);
            return send_error(s, c, 400, "tokens", NULL, "'tokens' must hold token ids in [0, %d)", s->a.vocab);
        }
        ids[i++] = (int32_t)x->valuedouble;
    }
    char *out = NULL;
    size_t len;
    dsv4_err err = {0};
    int rc = dsv4_tokenizer_decode(s->a.tok, ids, (size_t)n, 0, &out, &len, &err);
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
    fprintf(f, "# HELP dsv4_draft_position_reached_total Draft rounds that reached a proposal position (all before it kept).\n"
               "# TYPE dsv4_draft_position_reached_total counter\n");
    for (int i = 0; i < DSV4_DRAFT_MAX; i++)
        fprintf(f, "dsv4_draft_position_reached_total{position=\"%d\"} %" PRIu64 "\n", i, st.draft_reached_at[i]);
    fprintf(f, "# HELP dsv4_draft_position_kept_total Draft rounds that kept a proposal position.\n"
               "# TYPE dsv4_draft_position_kept_total counter\n");
    for (int i = 0; i < DSV4_DRAFT_MAX; i++)
        fprintf(f, "dsv4_draft_position_kept_total{position=\"%d\"} %" PRIu64 "\n", i, st.draft_kept_at[i]);
    fprintf(f, "# HELP dsv4_draft_off_total Lane steps in which the draft policy kept a drafting request from drafting.\n"
               "# TYPE dsv4_draft_off_total counter\n"
               "dsv4_draft_off_total{reason=\"busy_lanes\"} %" PRIu64 "\n"
               "dsv4_draft_off_total{reason=\"experts_in_host_memory\"} %" PRIu64 "\n",
            st.draft_off_busy, st.draft_off_host);
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
    cJSON_AddStringToObject(m, "id", s->a.name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->started);
    cJSON_AddStringToObject(m, "owned_by", "dsv4");
    cJSON_AddNumberToObject(m, "max_model_len", (double)s->a.ctx);
    cJSON_AddStringToObject(m, "family", s->a.family);
    return m;
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
static enum MHD_Result request_start(server *s, struct MHD_Connection *c, const char *url, const char *method, conn *k)
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
    /* a CORS preflight never carries credentials (Fetch standard): it is answered without them */
    int preflight = !strcmp(method, "OPTIONS") && s->cors != CORS_NONE;
    if (s->api_key && !preflight && strcmp(url, "/health") && strcmp(url, "/") && !auth_ok(s, &h)) {
        k->deny_status = 401;
        k->deny_code = "invalid_api_key";
        k->deny_msg = h.n_auth > 1 ? "send one Authorization header, not several"
                                   : "a valid API key is required (Authorization: Bearer ...)";
    }
    return MHD_YES;
}

/* A CORS preflight (OPTIONS): 204 with the methods and the headers asked for, when the origin
 * is allowed; 403 otherwise. Any route is answered: the request that follows gets its own
 * status. */
static enum MHD_Result preflight(server *s, struct MHD_Connection *c)
{
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (!cors_allow(s, origin))
        return send_error(s, c, 403, NULL, "cors_origin_not_allowed", "the origin '%s' is not allowed (--cors)",
                          origin ? origin : "");
    struct MHD_Response *rs = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
    const char *want = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
    MHD_add_response_header(rs, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    MHD_add_response_header(rs, "Access-Control-Allow-Headers", want && *want ? want : "Authorization, Content-Type");
    MHD_add_response_header(rs, "Access-Control-Max-Age", "600");
    return respond(c, 204, rs);
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
        return request_start(s, c, url, method, k);
    }
    if (k->gs)
        return gen_continue(s, c, k);
    if (*upload_size) {
        if (k->deny_status)
            ; /* not kept */
        else if (k->body.n + *upload_size > OAI_MAX_BODY)
            k->too_big = 1;
        else
            dsv4_buf_put(&k->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (k->deny_status)
        return send_error(s, c, k->deny_status, NULL, k->deny_code, "%s", k->deny_msg);
    if (!strcmp(method, "OPTIONS") && s->cors != CORS_NONE)
        return preflight(s, c);
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
        if (strcmp(url + 11, s->a.name))
            return send_error(s, c, 404, "model", "model_not_found", "the model '%s' does not exist", url + 11);
        return send_json(c, 200, model_json(s));
    }
    if (!strcmp(url, "/metrics") && get)
        return metrics(s, c);
    static const char *posts[] = {"/v1/completions", "/v1/chat/completions", "/v1/responses", "/tokenize", "/detokenize"};
    int which = -1;
    for (int i = 0; i < 5; i++)
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
        return send_error(s, c, 413, NULL, NULL, "the request body exceeds %d bytes", OAI_MAX_BODY);
    oai_bad b = {0};
    cJSON *j = oai_parse_body(k->body.p, k->body.n, &b);
    if (!j)
        return send_error(s, c, 400, NULL, "invalid_json", "%s", b.msg);
    enum MHD_Result res = which <= 2   ? generate(s, c, k, j, which, posts[which])
                          : which == 3 ? tokenize(s, c, j)
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
    k->srv = s;
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

/* --cors: NULL or "*" any origin, "none", or origins separated by commas. */
static int cors_parse(server *s, const char *spec, dsv4_err *err)
{
    if (!spec || !strcmp(spec, "*"))
        return s->cors = CORS_ANY, 0;
    if (!strcmp(spec, "none"))
        return s->cors = CORS_NONE, 0;
    s->cors = CORS_LIST;
    for (const char *p = spec; *p;) {
        size_t n = strcspn(p, ",");
        while (n && p[n - 1] == ' ')
            n--;
        if (n) {
            char **v = realloc(s->cors_origins, (size_t)(s->n_cors + 1) * sizeof *v);
            if (!v || !(v[s->n_cors] = strndup(p, n))) {
                s->cors_origins = v ? v : s->cors_origins;
                return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
            }
            s->cors_origins = v;
            if (!strstr(v[s->n_cors], "://") || !strcmp(v[s->n_cors], "*"))
                return dsv4_fail(err, DSV4_E_ARG, "--cors: '%s' is not an origin (scheme://host[:port]), * or none",
                                 v[s->n_cors++]);
            s->n_cors++;
        }
        p += strcspn(p, ",");
        while (*p == ',' || *p == ' ')
            p++;
    }
    if (!s->n_cors)
        return dsv4_fail(err, DSV4_E_ARG, "--cors names no origin");
    return 0;
}

static void cors_free(server *s)
{
    for (int i = 0; i < s->n_cors; i++)
        free(s->cors_origins[i]);
    free(s->cors_origins);
}

int dsv4_serve(const dsv4_server_opts *o, dsv4_err *err)
{
    if (o->api_key && !*o->api_key)
        return dsv4_fail(err, DSV4_E_ARG, "the API key is empty (an empty Bearer token would be valid)");
    server s = {.efd = -1};
    s.max_conns = o->max_connections > 0 ? o->max_connections : DSV4_DEFAULT_MAX_CONNECTIONS;
    s.client_conns = o->client_connections > 0 ? o->client_connections : DSV4_DEFAULT_CLIENT_CONNECTIONS;
    s.a.max_score_tokens = o->max_score_tokens > 0 ? o->max_score_tokens : DSV4_DEFAULT_MAX_SCORE_TOKENS;
    s.a.max_tokens = o->max_tokens > 0 ? o->max_tokens : DSV4_DEFAULT_CHAT_MAX_TOKENS;
    s.a.draft = o->draft;
    s.started = (long)time(NULL);
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
    s.a.tok = dsv4_tokenizer_load(o->tokenizer ? o->tokenizer : o->model_dir, err);
    if (!s.a.tok) {
        dsv4_err_prefix(err, "tokenizer (give --tokenizer DIR when the model folder has none)");
        dsv4_model_free(s.m);
        return err->code;
    }
    dsv4_model_info mi;
    dsv4_model_get_info(s.m, &mi);
    dsv4_vocab_trie *trie = dsv4_vocab_trie_new(s.a.tok, mi.vocab_size, err);
    if (!trie) {
        dsv4_tokenizer_free(s.a.tok);
        dsv4_model_free(s.m);
        return err->code;
    }
    s.a.trie = trie;
    s.a.vocab = mi.vocab_size;
    s.a.eos = mi.eos_id;
    s.a.ctx = mi.max_position;
    s.a.family = mi.family;
    { /* admission: the context each lane can reach within the KV-cache budget, before any allocation */
        int lanes = o->n_lanes ? o->n_lanes : 4;
        size_t budget = o->kv_budget, room = dsv4_model_state_room(s.m);
        const char *where = "KV-cache budget";
        if (room && budget > room)
            dsv4_log("dsv4 serve: --kv-budget-mb %.0f is more than the %.0f MB of device memory free after the weights: "
                     "admitting within that", budget / 1048576.0, room / 1048576.0);
        if (room && (!budget || budget > room)) { /* the state lives in device memory: what the weights left */
            budget = room;
            where = "the device memory free after the weights";
        } else if (!budget) {
            long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
            budget = pages > 0 && psz > 0 ? (size_t)pages * (size_t)psz / 2 : (size_t)8 << 30;
        }
        int64_t fit = dsv4_kv_fit(s.m, lanes, budget);
        if (fit < 1) {
            dsv4_fail(err, DSV4_E_ARG, "the KV-cache budget (%.1f MB) does not hold one empty sequence for each of %d lanes "
                      "(%.1f MB each)", budget / 1048576.0, lanes, dsv4_seq_bytes_at(s.m, 0) / 1048576.0);
            dsv4_vocab_trie_free(trie);
            dsv4_tokenizer_free(s.a.tok);
            dsv4_model_free(s.m);
            return err->code;
        }
        if (fit < s.a.ctx) {
            s.a.ctx = fit;
            s.a.kv_limited = 1;
        }
        dsv4_log("dsv4 serve: %s KV caches; %lld tokens of context for each of %d lanes within %.0f MB of %s "
                 "(%.1f B/token)", dsv4_model_kv(s.m), (long long)s.a.ctx, lanes, budget / 1048576.0, where,
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
    s.a.name = clean_name ? clean_name : name;
    s.a.seed_base = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(dsv4_now() * 1e9);
    pthread_mutex_init(&s.smu, NULL);
    pthread_mutex_init(&s.wmu, NULL);
    pthread_t waker;
    int waker_started = 0;
    struct MHD_Daemon *d = NULL;
    if (cors_parse(&s, o->cors, err))
        goto fail;
    s.efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s.efd < 0) {
        dsv4_fail(err, DSV4_E_IO, "eventfd: %s", strerror(errno));
        goto fail;
    }
    dsv4_lanes_opts lop = {.n_lanes = o->n_lanes, .queue_max = o->queue_max, .max_rollback = o->load.max_rollback,
                           .n_threads = o->load.n_threads,
                           .cache_bytes = o->cache_bytes ? o->cache_bytes : (size_t)1 << 30,
                           .notify = lanes_notify, .notify_ctx = &s, .drafter = o->drafter,
                           .draft_busy_max = o->draft_busy_max, .draft_row_cost = o->draft_row_cost};
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
    dsv4_log("dsv4 serve: %s (%d lanes) listening on http://%s:%u", s.a.name, lop.n_lanes ? lop.n_lanes : 4,
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
    for (double t0 = dsv4_now(); atomic_load(&s.a.active) > 0 && dsv4_now() - t0 < 10;) {
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
    cors_free(&s);
    dsv4_vocab_trie_free(trie); /* after the lanes: constraints of requests refer to it */
    dsv4_tokenizer_free(s.a.tok);
    dsv4_model_free(s.m);
    return err->code;
}
