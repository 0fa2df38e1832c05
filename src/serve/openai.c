/* openai — the API surface: request bodies checked and turned into generations, their tokens
 * into replies and stream events. See openai.h. */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "core/core.h"
#include "serve/http.h"
#include "serve/openai.h"
#include "text/chat.h"
#include "text/grammar.h"

/* Said after a context the KV-cache budget bounds. */
#define KV_LIMIT_NOTE " (what the KV-cache budget, --kv-budget-mb, holds for each lane)"

enum { TAKE = 64,            /* tokens taken from the request at a time */
       CONSTRAINT_CACHE = 16 /* masks a constrained request keeps (its recent grammar states) */ };

/* OpenAI's error body: {"error": {"message", "type", "param", "code"}}. The message may quote
 * the request (a model name, a URL), so it is made valid UTF-8 first. Returns it, not consumed. */
cJSON *oai_error_json(int status, const char *param, const char *code, const char *msg)
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

int oai_fail(oai_bad *b, const char *param, const char *fmt, ...)
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
static int get_num(const cJSON *j, const char *key, double lo, double hi, double *v, oai_bad *b)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!x || cJSON_IsNull(x))
        return 0;
    if (!cJSON_IsNumber(x))
        return oai_fail(b, key, "'%s' must be a number", key);
    if (!(x->valuedouble >= lo && x->valuedouble <= hi))
        return oai_fail(b, key, "'%s' must be between %g and %g", key, lo, hi);
    *v = x->valuedouble;
    return 0;
}

/* As get_num, for integral values. */
static int get_int(const cJSON *j, const char *key, double lo, double hi, int64_t *v, oai_bad *b)
{
    double d = (double)*v;
    if (get_num(j, key, lo, hi, &d, b))
        return -1;
    if (d != floor(d))
        return oai_fail(b, key, "'%s' must be an integer", key);
    *v = (int64_t)d;
    return 0;
}

/* Reads an optional boolean field; null or absent keeps *v. */
static int get_bool(const cJSON *j, const char *key, int *v, oai_bad *b)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!x || cJSON_IsNull(x))
        return 0;
    if (!cJSON_IsBool(x))
        return oai_fail(b, key, "'%s' must be a boolean", key);
    *v = cJSON_IsTrue(x);
    return 0;
}

/* Prompt ids from a string or an array of ids (or a one-element array of either). */
static int parse_prompt(oai_api *s, const cJSON *p, dsv4_ids *ids, char **text, oai_bad *b)
{
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 &&
        (cJSON_IsString(p->child) || cJSON_IsArray(p->child)))
        p = p->child;
    dsv4_err err = {0};
    if (cJSON_IsString(p)) {
        *text = strdup(p->valuestring);
        if (dsv4_tokenizer_encode(s->tok, p->valuestring, strlen(p->valuestring), ids, &err))
            return oai_fail(b, "prompt", "cannot tokenize the prompt: %s", err.msg);
        return 0;
    }
    if (!cJSON_IsArray(p))
        return oai_fail(b, "prompt", "'prompt' must be a string or an array of token ids");
    const cJSON *x;
    cJSON_ArrayForEach(x, p)
    {
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble))
            return oai_fail(b, "prompt", "'prompt' arrays hold integer token ids (one prompt per request)");
        if (x->valuedouble < 0 || x->valuedouble >= s->vocab)
            return oai_fail(b, "prompt", "token id %.0f is outside the vocabulary of %d", x->valuedouble, s->vocab);
        if (ids->n == ids->cap) {
            size_t cap = ids->cap ? 2 * ids->cap : 64;
            int32_t *v = realloc(ids->v, cap * sizeof *v);
            if (!v)
                return oai_fail(b, "prompt", "out of memory");
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
static int parse_seed(const cJSON *j, const char *raw, size_t raw_n, int *have, uint64_t *seed, oai_bad *b)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, "seed");
    if (!x || cJSON_IsNull(x))
        return 0;
    if (!cJSON_IsNumber(x))
        return oai_fail(b, "seed", "'seed' must be an integer");
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
                return oai_fail(b, "seed", "'seed' must be an integer in [-2^63, 2^64)");
            v = v * 10 + d;
        }
        if (neg && v > (uint64_t)1 << 63)
            return oai_fail(b, "seed", "'seed' must be an integer in [-2^63, 2^64)");
        *seed = neg ? (uint64_t)0 - v : v;
    } else {
        double d = x->valuedouble;
        if (d != floor(d) || fabs(d) > 9007199254740992.0)
            return oai_fail(b, "seed", "'seed' must be an integer: written with a fraction or exponent it must be within 2^53");
        *seed = (uint64_t)(int64_t)d;
    }
    *have = 1;
    return 0;
}

/* Sampling and stopping fields shared by both endpoints. raw[0..raw_n): the body's text. */
static int parse_sampling(oai_api *s, oai_gen *g, const cJSON *j, const char *raw, size_t raw_n, dsv4_request *r, oai_bad *b)
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
    const cJSON *bo = cJSON_GetObjectItemCaseSensitive(j, "best_of");
    if (bo && !cJSON_IsNull(bo) && (!cJSON_IsNumber(bo) || bo->valuedouble != 1))
        return oai_fail(b, "best_of", "'best_of' must be 1: this server returns the one sequence it samples");
    r->draft = (int)draft;
    if (top_p == 0)
        return oai_fail(b, "top_p", "'top_p' must be greater than 0");
    sp->temperature = t;
    sp->top_p = top_p;
    sp->min_p = min_p;
    sp->presence_penalty = pp;
    sp->frequency_penalty = fp;
    sp->repetition_penalty = rp;
    sp->top_k = top_k < 0 ? 0 : (int)top_k;
    sp->seed = have_seed ? seed
                         : s->seed_base ^ (atomic_fetch_add(&s->id_counter, 1) * 0xD1B54A32D192ED03ull);
    /* teacher forcing: the continuation is given; its tokens are scored, not sampled */
    const cJSON *ft = cJSON_GetObjectItemCaseSensitive(j, "forced_tokens");
    if (ft && !cJSON_IsNull(ft)) {
        dsv4_ids f = {0};
        char *unused = NULL;
        int bad_f = parse_prompt(s, ft, &f, &unused, b);
        free(unused);
        if (!bad_f && f.n == 0)
            bad_f = oai_fail(b, "forced_tokens", "'forced_tokens' is empty");
        if (bad_f) {
            b->param = "forced_tokens";
            dsv4_ids_free(&f);
            return -1;
        }
        r->forced = f.v;
        r->n_forced = (int)f.n;
        max_tokens = r->n_forced;
    }
    r->max_tokens = (int)max_tokens; /* -1: not given (check_room picks the default) */

    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(j, "logit_bias");
    if (lb && !cJSON_IsNull(lb)) {
        if (!cJSON_IsObject(lb))
            return oai_fail(b, "logit_bias", "'logit_bias' must be an object of token id -> bias");
        int k = cJSON_GetArraySize(lb), i = 0;
        int32_t *ids = malloc((size_t)(k ? k : 1) * sizeof *ids);
        float *vals = malloc((size_t)(k ? k : 1) * sizeof *vals);
        sp->bias_ids = ids;
        sp->bias_vals = vals;
        if (!ids || !vals)
            return oai_fail(b, "logit_bias", "out of memory");
        const cJSON *x;
        cJSON_ArrayForEach(x, lb)
        {
            char *end;
            long id = strtol(x->string, &end, 10);
            if (*end || end == x->string || id < 0 || id >= s->vocab)
                return oai_fail(b, "logit_bias", "logit_bias key '%s' is not a token id", x->string);
            if (!cJSON_IsNumber(x) || x->valuedouble < -100 || x->valuedouble > 100)
                return oai_fail(b, "logit_bias", "logit_bias values are numbers in [-100, 100]");
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
        } else if (cJSON_IsArray(st) && cJSON_GetArraySize(st) <= OAI_MAX_STOPS) {
            const cJSON *x;
            cJSON_ArrayForEach(x, st)
            {
                if (!cJSON_IsString(x))
                    return oai_fail(b, "stop", "'stop' must be a string or an array of strings");
                if (*x->valuestring)
                    g->stops[g->n_stops++] = strdup(x->valuestring);
            }
        } else {
            return oai_fail(b, "stop", "'stop' must be a string or an array of at most %d strings", OAI_MAX_STOPS);
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
        return oai_fail(b, "stop_token_ids", "'stop_token_ids' must be an array of token ids");
    r->stop_ids = malloc((size_t)(n_sti + 1) * sizeof *r->stop_ids);
    if (!r->stop_ids)
        return oai_fail(b, NULL, "out of memory");
    if (!ignore_eos)
        r->stop_ids[r->n_stop_ids++] = s->eos;
    const cJSON *x;
    cJSON_ArrayForEach(x, sti)
    {
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= s->vocab)
            return oai_fail(b, "stop_token_ids", "'stop_token_ids' must be token ids");
        r->stop_ids[r->n_stop_ids++] = (int32_t)x->valuedouble;
    }

    if (get_bool(j, "stream", &g->stream, b) || get_bool(j, "return_token_ids", &g->want_ids, b))
        return -1;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(j, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so))
            return oai_fail(b, "stream_options", "'stream_options' must be an object");
        if (get_bool(so, "include_usage", &g->include_usage, b))
            return -1;
    }
    int cache = 1;
    if (get_bool(j, "cache_prompt", &cache, b))
        return -1;
    r->use_cache = cache;
    return 0;
}

/* Once the prompt is tokenized: it and max_tokens (the default when not given: 16 for a
 * completion, --max-tokens for a chat, as far as the context allows) must fit the context. */
static int check_room(const oai_api *s, const oai_gen *g, dsv4_request *r, oai_bad *b)
{
    int64_t room = s->ctx - r->n_prompt, max_tokens = r->max_tokens;
    if (room <= 0) {
        b->code = "context_length_exceeded";
        return oai_fail(b, g->chat ? "messages" : "prompt", "the prompt has %d tokens; the context holds %lld%s", r->n_prompt,
                        (long long)s->ctx, s->kv_limited ? KV_LIMIT_NOTE : "");
    }
    if (max_tokens < 0)
        max_tokens = g->chat ? (room < s->max_tokens ? room : s->max_tokens) : 16;
    if (max_tokens > room) {
        b->code = "context_length_exceeded";
        return oai_fail(b, "max_tokens", "the prompt (%d tokens) plus max_tokens (%lld) exceeds the context of %lld tokens%s",
                        r->n_prompt, (long long)max_tokens, (long long)s->ctx, s->kv_limited ? KV_LIMIT_NOTE : "");
    }
    r->max_tokens = (int)max_tokens;
    return 0;
}

/* ---- generation ------------------------------------------------------------------ */

/* Releases the request (cancelling it if still running) and everything the generation holds. */
void oai_gen_free(oai_gen *g)
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
    dsv4_buf_free(&g->args_sent);
    cJSON_Delete(g->echo);
    dsv4_buf_free(&g->rs.text);
    dsv4_buf_free(&g->rs.name);
    cJSON_Delete(g->rs.output);
    free(g->off);
    free(g->tok);
    free(g->prompt_text);
    for (int i = 0; i < g->n_stops; i++)
        free(g->stops[i]);
    free(g);
}

/* OpenAI's finish_reason for how the generation ended. */
const char *oai_finish_name(const oai_gen *g)
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
static int gen_pull(oai_gen *g, double timeout_s)
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
size_t oai_safe_len(const oai_gen *g)
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
static cJSON *token_string(oai_api *s, int32_t id)
{
    size_t n, m;
    const char *b = dsv4_tokenizer_id_bytes(s->tok, id, &n);
    char *u = dsv4_utf8_sanitize(b ? b : "", b ? n : 0, &m);
    cJSON *j = cJSON_CreateString(u ? u : "");
    free(u);
    return j;
}

/* The token's raw bytes as numbers (chat logprobs' "bytes"). */
static cJSON *bytes_array(oai_api *s, int32_t id)
{
    size_t n;
    const char *b = dsv4_tokenizer_id_bytes(s->tok, id, &n);
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; b && i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)b[i]));
    return a;
}

/* The text piece of consumed token k (as detokenized in order, so pieces concatenate). */
static cJSON *piece_string(const oai_gen *g, int k)
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
static cJSON *chat_logprobs(oai_gen *g, int from, int to)
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
static cJSON *top_map(oai_api *s, const dsv4_sample_out *t)
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

/* Characters (code points) of valid UTF-8 p[0..n): the bytes that do not continue one. */
static size_t n_chars(const char *p, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += ((unsigned char)p[i] & 0xC0) != 0x80;
    return c;
}

/* Completions logprobs: {tokens, token_logprobs, top_logprobs, text_offset}, with the prompt's
 * tokens first when with_prompt. text_offset counts characters (code points, as OpenAI and vLLM
 * count them) from the start of the choice's text: the echoed prompt, when echoing, then the
 * generated text. */
static cJSON *completion_logprobs(oai_gen *g, int from, int to, int with_prompt)
{
    size_t base = g->echo_prompt && g->prompt_text ? n_chars(g->prompt_text, strlen(g->prompt_text)) : 0;
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
            at += n_chars(p ? p : "", len);
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
    size_t at_byte = 0, at_char = 0; /* a position in the generated text, in bytes and characters */
    for (int k = from; k < to; k++) {
        const dsv4_sample_out *t = &g->tok[k];
        size_t ob = g->off[k] < g->text.n ? g->off[k] : g->text.n;
        at_char += n_chars(g->text.p ? g->text.p + at_byte : "", ob - at_byte);
        at_byte = ob;
        cJSON_AddItemToArray(toks, piece_string(g, k));
        cJSON_AddItemToArray(tlp, cJSON_CreateNumber(t->logprob));
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)(base + at_char)));
        cJSON_AddItemToArray(top, top_map(g->s, t));
    }
    return lp;
}

/* usage: prompt, completion and total tokens, and the prompt tokens served from the cache. */
/* The usage extension "draft": what drafting did (it never changes the tokens), with per
 * proposal position how often a round reached it (every position before it kept) and kept it. */
static void draft_usage(cJSON *u, int64_t steps, int64_t proposed, int64_t kept, const long *reached_at, const long *kept_at)
{
    cJSON *d = cJSON_AddObjectToObject(u, "draft");
    cJSON_AddNumberToObject(d, "steps", (double)steps);
    cJSON_AddNumberToObject(d, "proposed_tokens", (double)proposed);
    cJSON_AddNumberToObject(d, "kept_tokens", (double)kept);
    cJSON *ps = cJSON_AddArrayToObject(d, "positions");
    for (int i = 0; i < DSV4_DRAFT_MAX && reached_at[i]; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "reached", (double)reached_at[i]);
        cJSON_AddNumberToObject(e, "kept", (double)kept_at[i]);
        cJSON_AddItemToArray(ps, e);
    }
}

static cJSON *usage_json(const oai_gen *g)
{
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", g->r->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", g->n_tok);
    cJSON_AddNumberToObject(u, "total_tokens", g->r->n_prompt + g->n_tok);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", g->r->n_cached);
    if (g->r->draft_steps)
        draft_usage(u, g->r->draft_steps, g->r->draft_proposed, g->r->draft_kept, g->r->policy.reached, g->r->policy.kept);
    return u;
}

/* The ids of consumed tokens [from, to) (the return_token_ids extension). */
static cJSON *ids_json(const oai_gen *g, int from, int to)
{
    cJSON *a = cJSON_CreateArray();
    for (int k = from; k < to; k++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(g->tok[k].id));
    return a;
}

/* The fields every response and chunk starts with: id, object, created, model. */
static cJSON *envelope(const oai_gen *g, const char *object)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", g->id);
    cJSON_AddStringToObject(j, "object", object);
    cJSON_AddNumberToObject(j, "created", (double)g->created);
    cJSON_AddStringToObject(j, "model", g->s->name);
    return j;
}

/* Feeds the parser the text up to `upto` (and ends it when the generation has ended). */
void oai_chat_parse(oai_gen *g, size_t upto)
{
    dsv4_err err = {0};
    if (upto > g->parsed) {
        dsv4_dsml_feed(g->dsml, g->text.p + g->parsed, upto - g->parsed, &g->dout, &err);
        g->parsed = upto;
    }
    if (g->finish && g->parsed == g->text.n && g->dsml) {
        /* cut by max_tokens: a call being written is kept as far as it parsed */
        if (g->finish == DSV4_FINISH_LENGTH)
            dsv4_dsml_finish_cut(g->dsml, &g->dout, &err);
        else
            dsv4_dsml_finish(g->dsml, &g->dout, &err);
        dsv4_dsml_free(g->dsml);
        g->dsml = NULL;
    }
}

/* The call id of tool call i. */
void oai_call_id(const oai_gen *g, int i, char *out, size_t cap) { snprintf(out, cap, "call_%s_%d", g->id, i); }

/* OpenAI tool_calls from the parser's calls [from, n); with_index for stream deltas. */
static cJSON *tool_calls_json(oai_gen *g, int from, int with_index)
{
    cJSON *a = cJSON_CreateArray();
    int n = cJSON_GetArraySize(g->dout.calls);
    for (int i = from; i < n; i++) {
        const cJSON *c = cJSON_GetArrayItem(g->dout.calls, i);
        cJSON *t = cJSON_CreateObject(), *f;
        char id[sizeof g->id + 24];
        oai_call_id(g, i, id, sizeof id);
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

/* ---- streaming ------------------------------------------------------------------- */

void oai_sse(oai_gen *g, const char *name, cJSON *j)
{
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (name) {
        dsv4_buf_puts(&g->sse, "event: ");
        dsv4_buf_puts(&g->sse, name);
        dsv4_buf_puts(&g->sse, "\n");
    }
    dsv4_buf_puts(&g->sse, "data: ");
    dsv4_buf_puts(&g->sse, s ? s : "{}");
    dsv4_buf_puts(&g->sse, "\n\n");
    free(s);
}

/* A stream's tool-call delta: call i's head (id, type, name, empty arguments), or a fragment of
 * its arguments (name NULL). */
static cJSON *call_delta(const oai_gen *g, int i, const char *name, const char *args, size_t n)
{
    cJSON *t = cJSON_CreateObject(), *f;
    cJSON_AddNumberToObject(t, "index", i);
    if (name) {
        char id[sizeof g->id + 24];
        oai_call_id(g, i, id, sizeof id);
        cJSON_AddStringToObject(t, "id", id);
        cJSON_AddStringToObject(t, "type", "function");
    }
    f = cJSON_AddObjectToObject(t, "function");
    if (name)
        cJSON_AddStringToObject(f, "name", name);
    char *a = strndup(args, n);
    cJSON_AddStringToObject(f, "arguments", a ? a : "");
    free(a);
    return t;
}

/* Appends to frags the tool-call deltas that are new, as OpenAI streams them: a call's name as
 * soon as its opening tag is read, then its arguments in fragments as each parameter closes. */
void oai_call_deltas(oai_gen *g, cJSON *frags)
{
    int n = cJSON_GetArraySize(g->dout.calls);
    while (g->n_calls_sent < n) {
        const cJSON *c = cJSON_GetArrayItem(g->dout.calls, g->n_calls_sent);
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(c, "name");
        if (!g->call_head_sent)
            cJSON_AddItemToArray(frags, call_delta(g, g->n_calls_sent, cJSON_IsString(name) ? name->valuestring : "", "", 0));
        char *a = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(c, "arguments"));
        const char *full = a ? a : "{}";
        size_t have = g->args_sent.n < strlen(full) ? g->args_sent.n : strlen(full);
        if (strlen(full) > have) /* the parser keeps what was streamed a prefix (dsv4_dsml_open_call) */
            cJSON_AddItemToArray(frags, call_delta(g, g->n_calls_sent, NULL, full + have, strlen(full) - have));
        free(a);
        g->call_head_sent = 0;
        g->args_sent.n = 0;
        g->n_calls_sent++;
    }
    const cJSON *open = g->dsml ? dsv4_dsml_open_call(g->dsml) : NULL;
    if (!open)
        return;
    if (!g->call_head_sent) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(open, "name");
        cJSON_AddItemToArray(frags, call_delta(g, g->n_calls_sent, cJSON_IsString(name) ? name->valuestring : "", "", 0));
        g->call_head_sent = 1;
    }
    char *a = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(open, "arguments"));
    size_t k = a && *a ? strlen(a) - 1 : 0; /* all but the closing brace */
    if (k > g->args_sent.n) {
        cJSON_AddItemToArray(frags, call_delta(g, g->n_calls_sent, NULL, a + g->args_sent.n, k - g->args_sent.n));
        dsv4_buf_put(&g->args_sent, a + g->args_sent.n, k - g->args_sent.n);
    }
    free(a);
}

/* A chunk with one choice holding delta (consumed; chat) or text (completions). */
static cJSON *chunk(oai_gen *g, cJSON **c0_out)
{
    cJSON *j = envelope(g, g->chat ? "chat.completion.chunk" : "text_completion");
    cJSON *ch = cJSON_AddArrayToObject(j, "choices"), *c0 = cJSON_CreateObject();
    cJSON_AddItemToArray(ch, c0);
    cJSON_AddNumberToObject(c0, "index", 0);
    *c0_out = c0;
    return j;
}

/* Appends the events for what is new: a delta with the streamable text (and its tokens'
 * logprobs and ids), then on the end the finish chunk, the usage chunk and [DONE]. A chat
 * sends a delta only when it has something: the role first, text, tool-call deltas, or (when
 * asked for) new tokens' logprobs and ids; never an empty content string. */
void oai_stream_events(oai_gen *g)
{
    if (g->api == OAI_RESPONSES) {
        oai_responses_events(g);
        return;
    }
    size_t safe = oai_safe_len(g);
    if (g->chat)
        oai_chat_parse(g, safe);
    /* tokens whose piece starts before `safe` go out with this chunk; at the end, all of them,
     * as the whole reply lists them: the one that completed a stop string too, though its piece
     * lies past the cut */
    int to = g->n_streamed;
    while (to < g->n_tok && (g->off[to] < safe || g->finish))
        to++;
    const int per_token = (g->n_logprobs >= 0 || g->want_ids) && to > g->n_streamed;
    if (g->chat) {
        cJSON *frags = cJSON_CreateArray();
        oai_call_deltas(g, frags);
        const int fresh_role = !g->role_sent;
        const int text = g->dout.content.n || g->dout.reasoning.n;
        int nf = cJSON_GetArraySize(frags);
        /* one chunk for the role, the text and the tokens' extras, then one per call delta */
        for (int i = -1; i < nf; i++) {
            if (i < 0 && !fresh_role && !text && !(per_token && nf == 0))
                continue;
            cJSON *c0, *j = chunk(g, &c0), *d = cJSON_AddObjectToObject(c0, "delta");
            if (i < 0) {
                if (fresh_role)
                    cJSON_AddStringToObject(d, "role", "assistant");
                if (g->dout.reasoning.n)
                    cJSON_AddStringToObject(d, "reasoning_content", g->dout.reasoning.p);
                if (g->dout.content.n)
                    cJSON_AddStringToObject(d, "content", g->dout.content.p);
                g->dout.content.n = g->dout.reasoning.n = 0;
            } else {
                cJSON *tc = cJSON_AddArrayToObject(d, "tool_calls");
                cJSON_AddItemToArray(tc, cJSON_DetachItemFromArray(frags, 0));
            }
            if (g->n_logprobs >= 0 && to > g->n_streamed)
                cJSON_AddItemToObject(c0, "logprobs", chat_logprobs(g, g->n_streamed, to));
            else
                cJSON_AddNullToObject(c0, "logprobs");
            cJSON_AddNullToObject(c0, "finish_reason");
            if (g->want_ids)
                cJSON_AddItemToObject(c0, "token_ids", ids_json(g, g->n_streamed, to));
            oai_sse(g, NULL, j);
            g->role_sent = 1;
            g->n_streamed = to;
        }
        cJSON_Delete(frags);
        g->emitted = safe > g->emitted ? safe : g->emitted;
    } else if (safe > g->emitted || to > g->n_streamed || (!g->role_sent && g->echo_prompt && (g->n_tok > 0 || g->finish))) {
        /* the first chunk of an echo: the prompt once its scores exist (after the first token or
         * the end: both come after the prompt was read) */
        cJSON *c0, *j = chunk(g, &c0);
        size_t a = g->emitted, b = safe > a ? safe : a;
        dsv4_buf t = {0};
        if (!g->role_sent && g->echo_prompt && g->prompt_text)
            dsv4_buf_puts(&t, g->prompt_text);
        dsv4_buf_put(&t, g->text.p ? g->text.p + a : "", b - a);
        cJSON_AddStringToObject(c0, "text", t.p ? t.p : "");
        dsv4_buf_free(&t);
        /* echo: the prompt (and its scores) lead the first chunk; offsets count from its start */
        int lead = !g->role_sent && g->echo_prompt;
        if (g->n_logprobs >= 0)
            cJSON_AddItemToObject(c0, "logprobs", completion_logprobs(g, g->n_streamed, to, lead));
        else
            cJSON_AddNullToObject(c0, "logprobs");
        cJSON_AddNullToObject(c0, "finish_reason");
        if (g->want_ids)
            cJSON_AddItemToObject(c0, "token_ids", ids_json(g, g->n_streamed, to));
        oai_sse(g, NULL, j);
        g->role_sent = 1;
        g->emitted = b;
        g->n_streamed = to;
    }
    if (g->finish && !g->final_sent) {
        g->final_sent = 1;
        if (g->finish == DSV4_FINISH_ERROR) {
            cJSON *e = cJSON_CreateObject(), *o = cJSON_AddObjectToObject(e, "error");
            cJSON_AddStringToObject(o, "message", g->r->errmsg[0] ? g->r->errmsg : "generation failed");
            cJSON_AddStringToObject(o, "type", "server_error");
            oai_sse(g, NULL, e);
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
            cJSON_AddStringToObject(c0, "finish_reason", oai_finish_name(g));
            oai_sse(g, NULL, j);
            if (g->include_usage) {
                cJSON *u = envelope(g, g->chat ? "chat.completion.chunk" : "text_completion");
                cJSON_AddArrayToObject(u, "choices");
                cJSON_AddItemToObject(u, "usage", usage_json(g));
                oai_sse(g, NULL, u);
            }
        }
        dsv4_buf_puts(&g->sse, "data: [DONE]\n\n");
    }
}

/* Takes every token there is without waiting. Returns 1 when the generation has ended. */
int oai_drain(oai_gen *g)
{
    for (;;) {
        int before = g->n_tok;
        if (gen_pull(g, 0))
            return 1;
        if (g->n_tok == before)
            return 0;
    }
}

/* tools: [{"type": "function", "function": {"name": str, "description"?: str, "parameters"?: object}}];
 * tool_choice: "none" | "auto" | "required" | {"type": "function", "function": {"name": one of them}}
 * ("required" and a named choice constrain the reply: parse_constraint). */
static int check_tools(const cJSON *tools, const cJSON *choice, oai_bad *b)
{
    if (tools && !cJSON_IsNull(tools)) {
        if (!cJSON_IsArray(tools))
            return oai_fail(b, "tools", "'tools' must be an array");
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
                return oai_fail(b, "tools", "tools[%d]: 'type' must be \"function\"", i);
            if (!cJSON_IsObject(f) || !cJSON_IsString(name) || !*name->valuestring)
                return oai_fail(b, "tools", "tools[%d]: 'function.name' must be a non-empty string", i);
            if (params && !cJSON_IsNull(params) && !cJSON_IsObject(params))
                return oai_fail(b, "tools", "tools[%d]: 'function.parameters' must be a JSON Schema object", i);
            if (desc && !cJSON_IsNull(desc) && !cJSON_IsString(desc))
                return oai_fail(b, "tools", "tools[%d]: 'function.description' must be a string", i);
            i++;
        }
    }
    if (!choice || cJSON_IsNull(choice))
        return 0;
    if (cJSON_IsString(choice)) {
        const char *c = choice->valuestring;
        if (strcmp(c, "none") && strcmp(c, "auto") && strcmp(c, "required"))
            return oai_fail(b, "tool_choice", "'tool_choice' must be none, auto, required or a named function");
        if (!strcmp(c, "required") && cJSON_GetArraySize(tools) == 0)
            return oai_fail(b, "tool_choice", "'tool_choice' required needs 'tools'");
        return 0;
    }
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(choice, "function");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
    if (!cJSON_IsObject(choice) || !cJSON_IsString(name))
        return oai_fail(b, "tool_choice", "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}");
    const cJSON *t;
    cJSON_ArrayForEach(t, tools)
    {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "name");
        if (!strcmp(n->valuestring, name->valuestring))
            return 0;
    }
    return oai_fail(b, "tool_choice", "'tool_choice' names '%s', which is not among the tools", name->valuestring);
}

/* The grammar a chat reply must follow, from tool_choice and response_format (*out NULL: none).
 * A forced tool choice ("required" or a named function) wins over response_format: the reply is
 * the call. response_format: {"type": "text"} or absent: none; "json_object": any JSON object;
 * "json_schema" with json_schema.schema: a value valid for it. A schema outside the supported
 * subset is refused when json_schema.strict is true; without strict (where OpenAI promises no
 * validation either) it falls back to any JSON object when its type is object or not given, and
 * to no constraint otherwise. thinking: the reply starts inside reasoning; v4: the V4 tags. */
static int parse_constraint(const cJSON *j, int thinking, int v4, dsv4_grammar **out, oai_bad *b)
{
    *out = NULL;
    dsv4_err err = {0};
    dsv4_grammar_opts go = {.thinking = thinking, .dsml_v4 = v4};
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(j, "tools");
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(j, "tool_choice");
    const char *forced = NULL;
    int required = cJSON_IsString(choice) && !strcmp(choice->valuestring, "required");
    if (cJSON_IsObject(choice))
        forced = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(choice, "function"), "name")->valuestring;
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(j, "response_format");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rf, "type");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
    int strict = 0;
    if (rf && !cJSON_IsNull(rf)) {
        if (!cJSON_IsObject(rf) || !cJSON_IsString(type))
            return oai_fail(b, "response_format", "'response_format' must be an object with a 'type'");
        const char *t = type->valuestring;
        if (!strcmp(t, "json_schema")) {
            if (!cJSON_IsObject(js))
                return oai_fail(b, "response_format", "response_format json_schema needs a 'json_schema' object");
            if (!cJSON_IsObject(schema))
                return oai_fail(b, "response_format", "'response_format.json_schema.schema' must be a JSON Schema object");
            if (get_bool(js, "strict", &strict, b)) {
                b->param = "response_format";
                return -1;
            }
        } else if (strcmp(t, "text") && strcmp(t, "json_object")) {
            return oai_fail(b, "response_format", "response_format type '%s' is not one of text, json_object, json_schema", t);
        }
    }
    if (required || forced) {
        *out = dsv4_grammar_tool_call(tools, forced, &go, &err);
        if (!*out)
            return oai_fail(b, "tools", "cannot force the tool call: %s", err.msg);
        return 0;
    }
    if (!rf || cJSON_IsNull(rf) || !strcmp(type->valuestring, "text"))
        return 0;
    if (!strcmp(type->valuestring, "json_object")) {
        *out = dsv4_grammar_json_object(&go, &err);
    } else {
        *out = dsv4_grammar_json_schema(schema, &go, &err);
        if (!*out && !strict) {
            const cJSON *st = cJSON_GetObjectItemCaseSensitive(schema, "type");
            if (!st || (cJSON_IsString(st) && !strcmp(st->valuestring, "object")))
                *out = dsv4_grammar_json_object(&go, &err);
            else
                return 0;
        }
    }
    if (!*out)
        return oai_fail(b, "response_format", "%s", err.msg);
    return 0;
}

/* Refuses what a chat cannot take honestly: image content parts (there is no vision path; the
 * encoder would leave only a placeholder). */
static int check_messages(const cJSON *msgs, oai_bad *b)
{
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs)
    {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content"), *part;
        int k = 0;
        if (cJSON_IsArray(content))
            cJSON_ArrayForEach(part, content)
            {
                const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
                const char *t = cJSON_IsString(type) ? type->valuestring : "";
                if (!strcmp(t, "image_url") || !strcmp(t, "input_image") || !strcmp(t, "image")) {
                    snprintf(b->param_buf, sizeof b->param_buf, "messages[%d].content[%d]", i, k);
                    oai_fail(b, b->param_buf, "messages[%d].content[%d]: image parts are not supported (this model has no vision input)",
                             i, k);
                    return -1;
                }
                k++;
            }
        i++;
    }
    return 0;
}

/* Parses a generation request (prompt: the completions prompt to use, NULL for chat; raw: the
 * body's text), renders and tokenizes it. Returns the generation, not yet queued, or NULL with
 * *b set. */
oai_gen *oai_gen_parse(oai_api *s, const cJSON *j, const char *raw, size_t raw_n, int chat, const cJSON *prompt, const char *path,
                      oai_bad *b)
{
    oai_gen *g = calloc(1, sizeof *g);
    if (!g) {
        oai_fail(b, NULL, "out of memory");
        b->status = 500;
        return NULL;
    }
    g->s = s;
    atomic_fetch_add(&s->active, 1);
    g->chat = chat;
    g->api = chat ? OAI_CHAT : OAI_COMPLETIONS;
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
    dsv4_grammar *grammar = NULL;
    cJSON *render = NULL; /* a chat's render request */
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
            oai_fail(b, "messages", "'messages' must be a non-empty array");
            goto out;
        }
        const cJSON *tools = cJSON_GetObjectItemCaseSensitive(j, "tools");
        const cJSON *choice = cJSON_GetObjectItemCaseSensitive(j, "tool_choice");
        if (check_messages(msgs, b) || check_tools(tools, choice, b))
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
            oai_fail(b, NULL, "%s", err.msg);
            goto out;
        }
        if (parse_constraint(j, cJSON_IsString(tm) && !strcmp(tm->valuestring, "thinking"),
                             cJSON_IsString(fam) && !strcmp(fam->valuestring, "deepseek_v4"), &grammar, b)) {
            cJSON_Delete(rq);
            goto out;
        }
        int lp = 0;
        int64_t top = 0;
        if (get_bool(j, "logprobs", &lp, b) || get_int(j, "top_logprobs", 0, DSV4_MAX_TOP_LOGPROBS, &top, b)) {
            cJSON_Delete(rq);
            goto out;
        }
        if (top > 0 && !lp) {
            cJSON_Delete(rq);
            oai_fail(b, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
            goto out;
        }
        g->n_logprobs = lp ? (int)top : -1;
        render = rq;
    } else {
        int64_t lp = -1;
        if (get_int(j, "logprobs", 0, DSV4_MAX_TOP_LOGPROBS, &lp, b) || get_bool(j, "echo", &g->echo_prompt, b))
            goto out;
        g->n_logprobs = (int)lp;
        if (!cJSON_IsString(prompt) && !cJSON_IsArray(prompt)) {
            oai_fail(b, "prompt", "'prompt' must be a string or an array of token ids");
            goto out;
        }
    }
    /* every field is checked before the prompt is rendered and tokenized */
    g->r = dsv4_request_new(NULL, 0, &err);
    if (!g->r) {
        oai_fail(b, NULL, "out of memory");
        goto out;
    }
    if (parse_sampling(s, g, j, raw, raw_n, g->r, b))
        goto out;
    g->r->sp.n_top_logprobs = g->n_logprobs > 0 ? g->n_logprobs : 0;
    if (grammar && g->r->forced) {
        oai_fail(b, "forced_tokens", "'forced_tokens' cannot be combined with response_format or a forced tool_choice");
        goto out;
    }
    if (render) {
        char *text = NULL;
        size_t len = 0;
        int r = dsv4_chat_render(render, &text, &len, &err);
        if (r) {
            oai_fail(b, "messages", "%s", err.msg);
            goto out;
        }
        r = dsv4_tokenizer_encode(s->tok, text, len, &ids, &err);
        free(text);
        if (r) {
            oai_fail(b, "messages", "%s", err.msg);
            goto out;
        }
    } else if (parse_prompt(s, prompt, &ids, &g->prompt_text, b)) {
        goto out;
    }
    if (ids.n == 0) {
        oai_fail(b, chat ? "messages" : "prompt", "the prompt is empty");
        goto out;
    }
    free(g->r->prompt);
    g->r->prompt = ids.v;
    g->r->n_prompt = (int)ids.n;
    ids.v = NULL;
    ids.n = ids.cap = 0;
    if (check_room(s, g, g->r, b))
        goto out;
    if (grammar) {
        g->r->constraint = dsv4_constraint_new(grammar, s->trie, &s->eos, 1, CONSTRAINT_CACHE, &err);
        grammar = NULL; /* the constraint owns it, or freed it */
        if (!g->r->constraint) {
            oai_fail(b, NULL, "%s", err.msg);
            b->status = 500;
            goto out;
        }
    }
    if (g->echo_prompt) {
        if (!g->prompt_text) {
            char *t = NULL;
            size_t tl;
            if (!dsv4_tokenizer_decode(s->tok, g->r->prompt, (size_t)g->r->n_prompt, 0, &t, &tl, &err))
                g->prompt_text = t;
        }
        g->r->prompt_logprobs = g->n_logprobs >= 0;
    }
    rc = 0;
out:
    cJSON_Delete(render);
    dsv4_ids_free(&ids);
    dsv4_grammar_free(grammar);
    if (rc) {
        if (!b->status)
            b->status = 400;
        oai_gen_free(g);
        return NULL;
    }
    return g;
}

/* Frees gs[0..n) and the list. */
static void gens_drop(oai_gen **gs, int n)
{
    for (int i = 0; gs && i < n; i++)
        oai_gen_free(gs[i]);
    free(gs);
}

/* Parses a generation request into its prompts' generations: one, or one per prompt of a
 * completions list. Returns their number with *out set, or 0 with *b set. */
int oai_parse_all(oai_api *s, const cJSON *j, const char *raw, size_t raw_n, int api, const char *path, oai_gen ***out, oai_bad *b)
{
    const int chat = api != OAI_COMPLETIONS;
    if (api == OAI_RESPONSES) {
        oai_gen **gs = calloc(1, sizeof *gs);
        if (!gs) {
            oai_fail(b, NULL, "out of memory");
            b->status = 500;
            return 0;
        }
        if (!(gs[0] = oai_responses_parse(s, j, raw, raw_n, path, b))) {
            free(gs);
            return 0;
        }
        *out = gs;
        return 1;
    }
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prompt");
    if (!chat && !p) {
        oai_fail(b, "prompt", "'prompt' is required");
        return 0;
    }
    int n = !chat && cJSON_IsArray(p) && (cJSON_IsString(p->child) || cJSON_IsArray(p->child)) ? cJSON_GetArraySize(p) : 1;
    if (n > 1) {
        int stream = 0;
        if (get_bool(j, "stream", &stream, b))
            return 0;
        if (stream)
            oai_fail(b, "stream", "a list of prompts is answered whole: 'stream' takes one prompt");
        else if (n > OAI_MAX_BATCH)
            oai_fail(b, "prompt", "at most %d prompts per request", OAI_MAX_BATCH);
        if (stream || n > OAI_MAX_BATCH)
            return 0;
    }
    oai_gen **gs = calloc((size_t)n, sizeof *gs);
    if (!gs) {
        oai_fail(b, NULL, "out of memory");
        b->status = 500;
        return 0;
    }
    const cJSON *pi = n > 1 ? p->child : p;
    int64_t scored = 0;
    for (int i = 0; i < n; i++, pi = pi ? pi->next : NULL) {
        if (!(gs[i] = oai_gen_parse(s, j, raw, raw_n, chat, pi, path, b))) {
            gens_drop(gs, i);
            return 0;
        }
        scored += (gs[i]->r->prompt_logprobs ? gs[i]->r->n_prompt : 0) + gs[i]->r->n_forced;
    }
    /* scoring replies grow with the tokens scored times the alternatives each lists */
    if (scored > s->max_score_tokens) {
        gens_drop(gs, n);
        b->code = "max_score_tokens_exceeded";
        oai_fail(b, "prompt", "the request scores %lld given tokens (echoed prompt with logprobs, forced_tokens); "
                 "this server scores at most %d per request (--max-score-tokens)", (long long)scored, s->max_score_tokens);
        return 0;
    }
    *out = gs;
    return n;
}

/* One choice of a finished non-streaming reply. */
static cJSON *choice_json(oai_gen *g, int index)
{
    const int chat = g->chat;
    if (chat)
        oai_chat_parse(g, g->text.n);
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
        if (g->echo_prompt && g->prompt_text)
            dsv4_buf_puts(&t, g->prompt_text);
        dsv4_buf_put(&t, g->text.p ? g->text.p : "", g->text.n);
        cJSON_AddStringToObject(c0, "text", t.p ? t.p : "");
        dsv4_buf_free(&t);
        if (g->n_logprobs >= 0)
            cJSON_AddItemToObject(c0, "logprobs", completion_logprobs(g, 0, g->n_tok, g->echo_prompt));
        else
            cJSON_AddNullToObject(c0, "logprobs");
    }
    cJSON_AddStringToObject(c0, "finish_reason", oai_finish_name(g));
    if (g->want_ids)
        cJSON_AddItemToObject(c0, "token_ids", ids_json(g, 0, g->n_tok));
    return c0;
}

cJSON *oai_reply(oai_gen **gs, int n)
{
    if (gs[0]->api == OAI_RESPONSES)
        return oai_responses_reply(gs[0]);
    cJSON *resp = envelope(gs[0], gs[0]->chat ? "chat.completion" : "text_completion");
    cJSON *ch = cJSON_AddArrayToObject(resp, "choices");
    int prompt = 0, cached = 0, completion = 0;
    int64_t dsteps = 0, dprop = 0, dkept = 0;
    long dreach[DSV4_DRAFT_MAX] = {0}, dkat[DSV4_DRAFT_MAX] = {0};
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < DSV4_DRAFT_MAX; j++) {
            dreach[j] += gs[i]->r->policy.reached[j];
            dkat[j] += gs[i]->r->policy.kept[j];
        }
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
        draft_usage(u, dsteps, dprop, dkept, dreach, dkat);
    return resp;
}

/* The body as a JSON object: valid UTF-8 (RFC 8259; also, nothing echoed from it can make a
 * reply invalid), well-formed, one object and nothing after it but white space. NULL with b->msg set otherwise. */
cJSON *oai_parse_body(const char *p, size_t n, oai_bad *b)
{
    int incomplete = 0;
    size_t ok = dsv4_utf8_valid_prefix((const unsigned char *)(p ? p : ""), n, &incomplete);
    if (ok < n) {
        oai_fail(b, NULL, "the body is not valid UTF-8 (at byte %zu)", ok);
        return NULL;
    }
    const char *end = NULL;
    cJSON *j = n ? cJSON_ParseWithLengthOpts(p, n, &end, 0) : NULL;
    while (j && end && end < p + n && strchr(" \t\r\n", *end) && *end)
        end++;
    if (!j || !cJSON_IsObject(j) || (end && end < p + n)) {
        cJSON_Delete(j);
        oai_fail(b, NULL, "the body must be one JSON object");
        return NULL;
    }
    return j;
}

int dsv4_serve_parse(const dsv4_parse_model *pm, const char *path, const char *body, size_t n, dsv4_request **first, char *msg,
                     size_t cap)
{
    oai_api s = {.tok = pm->tok, .trie = pm->trie, .name = pm->name ? pm->name : "model", .family = pm->family ? pm->family : "deepseek_v4",
                .vocab = pm->vocab, .eos = pm->eos, .ctx = pm->ctx,
                .max_score_tokens = pm->max_score_tokens > 0 ? pm->max_score_tokens : DSV4_DEFAULT_MAX_SCORE_TOKENS,
                .max_tokens = pm->max_tokens > 0 ? pm->max_tokens : DSV4_DEFAULT_CHAT_MAX_TOKENS};
    if (first)
        *first = NULL;
    dsv4_vocab_trie *own = NULL;
    if (!s.trie) {
        dsv4_err err = {0};
        s.trie = own = dsv4_vocab_trie_new(pm->tok, pm->vocab, &err);
        if (!own) {
            if (msg && cap)
                snprintf(msg, cap, "%s", err.msg);
            return 500;
        }
    }
    int api = !strcmp(path, "/v1/chat/completions") ? OAI_CHAT : !strcmp(path, "/v1/responses") ? OAI_RESPONSES : OAI_COMPLETIONS;
    oai_bad b = {0};
    if (api == OAI_COMPLETIONS && strcmp(path, "/v1/completions")) {
        b.status = 404;
        snprintf(b.msg, sizeof b.msg, "no route for POST %s", path);
    } else {
        cJSON *j = oai_parse_body(body, n, &b);
        oai_gen **gs = NULL;
        int ng = j ? oai_parse_all(&s, j, body, n, api, path, &gs, &b) : 0;
        cJSON_Delete(j);
        if (ng > 0) {
            if (first) {
                *first = gs[0]->r;
                gs[0]->r = NULL;
            }
            gens_drop(gs, ng);
            b.status = 200;
        }
    }
    if (!b.status)
        b.status = 400;
    if (msg && cap)
        snprintf(msg, cap, "%s", b.status == 200 ? "" : b.msg);
    if (own && first && *first) { /* its constraint would outlive this call's trie */
        dsv4_constraint_free((*first)->constraint);
        (*first)->constraint = NULL;
    }
    dsv4_vocab_trie_free(own);
    return b.status;
}

