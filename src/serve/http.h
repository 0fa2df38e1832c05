/* http — the OpenAI-compatible server over the lanes (libmicrohttpd: a few polling threads over
 * epoll; a request waiting for tokens is suspended, not a blocked thread; the API itself is
 * serve/openai.c's). Endpoints: GET / (a chat page), GET /health, GET /v1/models,
 * POST /v1/completions, POST /v1/chat/completions, POST /tokenize, POST /detokenize,
 * GET /metrics; OPTIONS (CORS preflight) on any route. */
#ifndef DSV4_SERVE_HTTP_H
#define DSV4_SERVE_HTTP_H

#include <stddef.h>
#include "dsv4.h"

struct dsv4_request;

typedef struct dsv4_server_opts {
    const char *model_dir;
    const char *tokenizer;    /* tokenizer.json or its folder; NULL: the model folder */
    const char *host;         /* NULL: 127.0.0.1 */
    int port;                 /* 0: any free port (the log line "listening on ..." names it) */
    int n_lanes;              /* 0: 4 */
    const char *api_key;      /* NULL: no authentication */
    const char *model_name;   /* NULL: the model folder's base name */
    dsv4_load_opts load;      /* threads, device, numerics */
    size_t cache_bytes;       /* prompt cache budget; 0: 1 GiB */
    int queue_max;            /* 0: 64 */
    int max_connections;      /* open connections before the idlest is closed; 0: 1024 */
    int client_connections;   /* open connections per client address; 0: 128 */
    int idle_timeout_s;       /* a connection with nothing to send or receive is closed; 0: 15 */
    int max_score_tokens;     /* given tokens one request may score (echoed prompt, forced); 0: 16384 */
    int draft;                /* proposal length of requests that give no "draft"; 0: none */
    int drafter;              /* DSV4_DRAFTER_* (serve/lanes.h): what proposes */
    int draft_busy_max;       /* busy lanes past which no lane drafts; 0: no bound */
    double draft_row_cost;    /* the draft policy's cost of a verify row; 0: its default */
    int max_tokens;           /* a chat's max_tokens when the request gives none (bounded by the context); 0: 4096 */
    const char *cors;         /* allowed browser origins: NULL or "*": any; "none": no CORS headers; else a
                               * comma-separated list of origins (scheme://host[:port]) */
    size_t kv_budget;         /* bytes the lanes' KV caches may hold; 0: half of physical memory */
} dsv4_server_opts;

enum { DSV4_DEFAULT_MAX_CONNECTIONS = 1024, DSV4_DEFAULT_CLIENT_CONNECTIONS = 128, DSV4_DEFAULT_IDLE_TIMEOUT = 15,
       DSV4_DEFAULT_MAX_SCORE_TOKENS = 16384, DSV4_DEFAULT_CHAT_MAX_TOKENS = 4096 };

/* Loads the model and tokenizer, serves until SIGTERM or SIGINT, then cancels what is in
 * flight and returns 0. The caller must have blocked SIGTERM and SIGINT in every thread
 * (this function waits for them with sigwait). */
int dsv4_serve(const dsv4_server_opts *o, dsv4_err *err);

/* The request parser alone (tests, fuzzing; serve/openai.c): what the server does with a POST body to path
 * (/v1/completions or /v1/chat/completions) up to, not including, queueing it. */
typedef struct dsv4_parse_model {
    struct dsv4_tokenizer *tok;
    const char *name, *family; /* the served model's name; "deepseek_v4" or "deepseek_v41" */
    int vocab, eos;
    int64_t ctx;
    int max_score_tokens;      /* 0: the default */
    int max_tokens;            /* a chat's default max_tokens; 0: the default */
    const struct dsv4_vocab_trie *trie; /* the tokenizer's vocabulary trie (constrained requests); NULL: one is
                                * built for the call, and the returned request's constraint is dropped */
} dsv4_parse_model;

/* Returns the HTTP status the server would answer before generating: 200 when the request is
 * accepted (then *first, when given, gets its first prompt's request, the caller's to release),
 * else the error's status with its message in msg[0..cap). */
int dsv4_serve_parse(const dsv4_parse_model *pm, const char *path, const char *body, size_t n,
                     struct dsv4_request **first, char *msg, size_t cap);

#endif
