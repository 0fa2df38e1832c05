/* http — the OpenAI-compatible server over the lanes (libmicrohttpd, one thread per
 * connection). Endpoints: GET / (a chat page), GET /health, GET /v1/models, POST /v1/completions,
 * POST /v1/chat/completions, POST /tokenize, POST /detokenize, GET /metrics. */
#ifndef DSV4_SERVE_HTTP_H
#define DSV4_SERVE_HTTP_H

#include <stddef.h>
#include "dsv4.h"

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
} dsv4_server_opts;

/* Loads the model and tokenizer, serves until SIGTERM or SIGINT, then cancels what is in
 * flight and returns 0. The caller must have blocked SIGTERM and SIGINT in every thread
 * (this function waits for them with sigwait). */
int dsv4_serve(const dsv4_server_opts *o, dsv4_err *err);

#endif
