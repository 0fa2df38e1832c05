/* openai — the OpenAI-compatible API surface of the server: a request body (completions, chat
 * completions) checked whole and turned into dsv4_requests, and their tokens turned back into
 * replies, stream chunks and error bodies. No sockets here: serve/http.c moves the bytes
 * (libmicrohttpd, suspension, auth, limits) and calls these.
 *
 * A generation (oai_gen) owns its request and everything between its tokens and the client's
 * bytes: the detokenizer, its stop strings (applied to the text as it grows; a hit cuts the
 * text and cancels the request), the DSML parser of a chat, and the pending SSE bytes of a
 * stream. One generation is used by one thread at a time. */
#ifndef DSV4_SERVE_OPENAI_H
#define DSV4_SERVE_OPENAI_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "dsv4.h"
#include "serve/lanes.h"
#include "text/buf.h"
#include "text/dsml.h"
#include "text/tokenizer.h"
#include "text/tokmask.h"

enum { OAI_MAX_STOPS = 16, OAI_MAX_BATCH = 1024, OAI_MAX_BODY = 16 << 20 };

/* The API surfaces: POST /v1/completions, /v1/chat/completions, /v1/responses. */
enum { OAI_COMPLETIONS = 0, OAI_CHAT = 1, OAI_RESPONSES = 2 };

/* What the API knows of the served model and the server's defaults. */
typedef struct oai_api {
    dsv4_tokenizer *tok;
    const dsv4_vocab_trie *trie; /* the vocabulary's byte trie, built once: constrained requests' masks */
    const char *name, *family;   /* the served model's name; "deepseek_v4" or "deepseek_v41" (chat format, DSML tags) */
    int vocab, eos;
    int64_t ctx;
    int kv_limited;              /* ctx is what the KV-cache budget holds for each lane (below the model's) */
    int max_score_tokens;        /* given tokens one request may score (--max-score-tokens) */
    int max_tokens;              /* a chat's default max_tokens (--max-tokens) */
    int draft;                   /* requests' default proposal length (--draft) */
    uint64_t seed_base;          /* unseeded requests' seeds and reply ids derive from it */
    atomic_uint_fast64_t id_counter;
    atomic_int active;           /* generations not yet freed (shutdown waits for them) */
} oai_api;

/* A refusal: HTTP status, offending field, OpenAI error code and message. */
typedef struct oai_bad {
    int status;
    const char *param, *code;
    char msg[512];
    char param_buf[64];          /* a param naming a place in the request (messages[2].content[0]) */
} oai_bad;

/* A Responses stream's progress (serve/responses.c): the output item being written. */
typedef struct oai_resp_stream {
    int seq;                   /* the next event's sequence_number */
    int started;               /* response.created and response.in_progress went out */
    int n_items;               /* output items added so far */
    int kind;                  /* the open item: 0 none, 1 reasoning, 2 message, 3 function call */
    int call;                  /* a function call item: its call's index */
    int had_message;           /* a message item was opened */
    char item_id[96];
    dsv4_buf text, name;       /* its text or arguments so far; a call's name */
    cJSON *output;             /* the items done, for the final response */
} oai_resp_stream;

/* One generation (a completion, a chat, or a response), from parse to the last byte sent. */
typedef struct oai_gen {
    oai_api *s;
    dsv4_request *r;
    int api;                   /* OAI_COMPLETIONS, OAI_CHAT or OAI_RESPONSES (which is a chat underneath) */
    cJSON *echo;               /* responses: the request's fields that the Response object repeats */
    oai_resp_stream rs;
    int chat, stream, include_usage, want_ids, echo_prompt;
    int n_logprobs;            /* -1: none; else top_logprobs per token */
    char id[48];
    long created;
    dsv4_detok dt;
    dsv4_buf text;             /* generated text so far, cut at a stop string */
    size_t *off;               /* [cap] where each consumed token's piece starts in text */
    dsv4_sample_out *tok;      /* [cap] consumed tokens */
    int n_tok, cap_tok;
    char *stops[OAI_MAX_STOPS];
    int n_stops;
    size_t max_stop;
    int stop_string, finish, role_sent, final_sent;
    size_t emitted;            /* text bytes already streamed */
    int n_streamed;            /* tokens already streamed */
    dsv4_dsml *dsml;           /* chat: splits text into reasoning, content and tool calls */
    dsv4_dsml_out dout;        /* its output not yet sent (buffers reset after each send) */
    size_t parsed;             /* text bytes fed to the parser */
    int n_calls_sent;          /* tool calls streamed whole */
    int call_head_sent;        /* the next call's name went out (its arguments follow in fragments) */
    dsv4_buf args_sent;        /* the next call's argument text streamed so far */
    char *prompt_text;         /* echo */
    dsv4_buf sse;              /* a stream's bytes not yet handed out */
    double t0;
    const char *path;
} oai_gen;

/* OpenAI's error body {"error": {"message", "type", "param", "code"}}, the message made valid
 * UTF-8. Returns it, not consumed. */
cJSON *oai_error_json(int status, const char *param, const char *code, const char *msg);
/* Sets b to a 400 with param and the message; returns -1. */
int oai_fail(oai_bad *b, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* The body as a JSON object: valid UTF-8, well-formed, one object and nothing after it but
 * white space. NULL with b set otherwise. */
cJSON *oai_parse_body(const char *p, size_t n, oai_bad *b);
/* A request j of api (raw[0..raw_n): its text) checked whole, rendered and tokenized: its
 * generations, one, or one per prompt of a completions list, not yet queued. Returns their
 * number with *out set, or 0 with *b set. */
int oai_parse_all(oai_api *s, const cJSON *j, const char *raw, size_t raw_n, int api, const char *path, oai_gen ***out,
                  oai_bad *b);
/* Releases the request (cancelling it if still running) and everything g holds. */
void oai_gen_free(oai_gen *g);

/* Takes every token there is without waiting, detokenized, stop strings applied. Returns 1 when
 * the generation has ended (g->finish set). */
int oai_drain(oai_gen *g);
/* Appends to g->sse the events for what is new: deltas, then at the end the finish chunk, the
 * usage chunk and [DONE]. */
void oai_stream_events(oai_gen *g);
/* The whole reply of finished generations gs[0..n) (their choices, usage summed). */
cJSON *oai_reply(oai_gen **gs, int n);
/* OpenAI's finish_reason for how g ended. */
const char *oai_finish_name(const oai_gen *g);

/* Shared with serve/responses.c. */
/* A chat request j (chat completions fields) as one generation; prompt: a completion's. */
oai_gen *oai_gen_parse(oai_api *s, const cJSON *j, const char *raw, size_t raw_n, int chat, const cJSON *prompt,
                       const char *path, oai_bad *b);
/* Bytes of g->text safe to send (all once finished, else all but what may grow into a stop string). */
size_t oai_safe_len(const oai_gen *g);
/* Feeds a chat's DSML parser the text up to upto (and ends it once the generation has). */
void oai_chat_parse(oai_gen *g, size_t upto);
/* Appends the new tool-call deltas in chat form: a head {index, id, type, function: {name,
 * arguments: ""}} when a call's name is read, then {index, function: {arguments: fragment}};
 * g->n_calls_sent counts the calls whose deltas are all out. */
void oai_call_deltas(oai_gen *g, cJSON *frags);
/* The call id of tool call i. */
void oai_call_id(const oai_gen *g, int i, char *out, size_t cap);
/* Appends one SSE event: "event: NAME" (when name) and "data: JSON" (j consumed). */
void oai_sse(oai_gen *g, const char *name, cJSON *j);

/* serve/responses.c: POST /v1/responses. */
/* The request as a chat generation (input items to messages, tools, text.format, reasoning,
 * max_output_tokens). NULL with *b set on refusal. */
oai_gen *oai_responses_parse(oai_api *s, const cJSON *j, const char *raw, size_t raw_n, const char *path, oai_bad *b);
/* The Response object of a finished generation. */
cJSON *oai_responses_reply(oai_gen *g);
/* The stream's new events (response.created, output items and their deltas, response.completed). */
void oai_responses_events(oai_gen *g);

#endif
