/* responses — POST /v1/responses, OpenAI's Responses API, over the chat path: the request's
 * input items become chat messages (instructions a system message first; function_call items an
 * assistant turn's tool calls; function_call_output items tool messages), its function tools
 * and tool_choice the chat's, text.format its response_format, reasoning.effort the thinking
 * mode and max_output_tokens its max_tokens; the generation is then a chat's, and its output is
 * written as Response output items (reasoning, message, function_call), whole or as the
 * Responses stream's events. Nothing is stored: previous_response_id and item references are
 * refused. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "core/core.h"
#include "serve/openai.h"

enum { ITEM_NONE, ITEM_REASONING, ITEM_MESSAGE, ITEM_CALL };

/* ---- request ---------------------------------------------------------------------- */

/* The text of a content given as a string or as parts of the given text types; image and file
 * parts are refused, named at where[k]. NULL (with *b set) on refusal. */
static char *content_text(const cJSON *c, const char *where, oai_bad *b)
{
    if (cJSON_IsString(c))
        return strdup(c->valuestring);
    if (!cJSON_IsArray(c)) {
        snprintf(b->param_buf, sizeof b->param_buf, "%s", where);
        oai_fail(b, b->param_buf, "%s must be a string or an array of content parts", where);
        return NULL;
    }
    dsv4_buf t = {0};
    dsv4_buf_put(&t, "", 0);
    const cJSON *p;
    int k = 0;
    cJSON_ArrayForEach(p, c)
    {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(p, "text");
        const char *ty = cJSON_IsString(type) ? type->valuestring : "";
        if ((!strcmp(ty, "input_text") || !strcmp(ty, "output_text") || !strcmp(ty, "text")) && cJSON_IsString(text)) {
            if (t.n)
                dsv4_buf_puts(&t, "\n\n");
            dsv4_buf_puts(&t, text->valuestring);
        } else if (!strcmp(ty, "refusal")) {
            const cJSON *r = cJSON_GetObjectItemCaseSensitive(p, "refusal");
            if (cJSON_IsString(r))
                dsv4_buf_puts(&t, r->valuestring);
        } else {
            snprintf(b->param_buf, sizeof b->param_buf, "%s[%d]", where, k);
            oai_fail(b, b->param_buf, "%s[%d]: content parts of type '%s' are not supported (text only: this model has no "
                                      "image or file input)", where, k, ty);
            dsv4_buf_free(&t);
            return NULL;
        }
        k++;
    }
    if (t.oom) {
        dsv4_buf_free(&t);
        oai_fail(b, NULL, "out of memory");
        return NULL;
    }
    return t.p;
}

/* A string field of item, required. */
static const char *item_str(const cJSON *item, const char *key, int i, oai_bad *b)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(item, key);
    if (cJSON_IsString(x))
        return x->valuestring;
    snprintf(b->param_buf, sizeof b->param_buf, "input[%d].%s", i, key);
    oai_fail(b, b->param_buf, "input[%d]: '%s' must be a string", i, key);
    return NULL;
}

/* input (a string, or an array of items) as chat messages appended to msgs. */
static int input_messages(const cJSON *input, cJSON *msgs, oai_bad *b)
{
    if (cJSON_IsString(input)) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", input->valuestring);
        cJSON_AddItemToArray(msgs, m);
        return 0;
    }
    if (!cJSON_IsArray(input))
        return oai_fail(b, "input", "'input' must be a string or an array of input items");
    int i = 0;
    const cJSON *item;
    cJSON *calls_to = NULL; /* the assistant message function_call items join */
    cJSON_ArrayForEach(item, input)
    {
        if (!cJSON_IsObject(item)) {
            snprintf(b->param_buf, sizeof b->param_buf, "input[%d]", i);
            return oai_fail(b, b->param_buf, "input[%d] must be an object", i);
        }
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(item, "type");
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(item, "role");
        const char *ty = cJSON_IsString(type) ? type->valuestring : role ? "message" : "";
        char where[64];
        if (!strcmp(ty, "message")) {
            const char *r = cJSON_IsString(role) ? role->valuestring : "";
            if (strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "system") && strcmp(r, "developer")) {
                snprintf(b->param_buf, sizeof b->param_buf, "input[%d].role", i);
                return oai_fail(b, b->param_buf, "input[%d]: 'role' must be user, assistant, system or developer", i);
            }
            snprintf(where, sizeof where, "input[%d].content", i);
            char *text = content_text(cJSON_GetObjectItemCaseSensitive(item, "content"), where, b);
            if (!text)
                return -1;
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", r);
            cJSON_AddStringToObject(m, "content", text);
            free(text);
            cJSON_AddItemToArray(msgs, m);
            calls_to = !strcmp(r, "assistant") ? m : NULL;
        } else if (!strcmp(ty, "function_call")) {
            const char *name = item_str(item, "name", i, b), *args = name ? item_str(item, "arguments", i, b) : NULL;
            const char *call_id = args ? item_str(item, "call_id", i, b) : NULL;
            if (!call_id)
                return -1;
            if (!calls_to) {
                calls_to = cJSON_CreateObject();
                cJSON_AddStringToObject(calls_to, "role", "assistant");
                cJSON_AddNullToObject(calls_to, "content");
                cJSON_AddItemToArray(msgs, calls_to);
            }
            cJSON *tc = cJSON_GetObjectItemCaseSensitive(calls_to, "tool_calls");
            if (!tc)
                tc = cJSON_AddArrayToObject(calls_to, "tool_calls");
            cJSON *c = cJSON_CreateObject(), *f;
            cJSON_AddStringToObject(c, "id", call_id);
            cJSON_AddStringToObject(c, "type", "function");
            f = cJSON_AddObjectToObject(c, "function");
            cJSON_AddStringToObject(f, "name", name);
            cJSON_AddStringToObject(f, "arguments", args);
            cJSON_AddItemToArray(tc, c);
        } else if (!strcmp(ty, "function_call_output")) {
            const char *call_id = item_str(item, "call_id", i, b);
            if (!call_id)
                return -1;
            snprintf(where, sizeof where, "input[%d].output", i);
            char *text = content_text(cJSON_GetObjectItemCaseSensitive(item, "output"), where, b);
            if (!text)
                return -1;
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", "tool");
            cJSON_AddStringToObject(m, "tool_call_id", call_id);
            cJSON_AddStringToObject(m, "content", text);
            free(text);
            cJSON_AddItemToArray(msgs, m);
            calls_to = NULL;
        } else if (!strcmp(ty, "reasoning")) {
            /* earlier reasoning is not shown to the model again (the chat encoder drops it too) */
        } else {
            snprintf(b->param_buf, sizeof b->param_buf, "input[%d].type", i);
            return oai_fail(b, b->param_buf, "input[%d]: items of type '%s' are not supported (message, function_call, "
                                             "function_call_output, reasoning; nothing is stored to refer to)", i, ty);
        }
        i++;
    }
    return 0;
}

/* tools [{"type": "function", "name", "description", "parameters", "strict"}] as chat tools. */
static cJSON *chat_tools(const cJSON *tools, oai_bad *b)
{
    if (!cJSON_IsArray(tools)) {
        oai_fail(b, "tools", "'tools' must be an array");
        return NULL;
    }
    cJSON *out = cJSON_CreateArray();
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools)
    {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function")) {
            snprintf(b->param_buf, sizeof b->param_buf, "tools[%d].type", i);
            oai_fail(b, b->param_buf, "tools[%d]: only function tools are supported (no built-in tools here)", i);
            cJSON_Delete(out);
            return NULL;
        }
        cJSON *c = cJSON_CreateObject(), *f;
        cJSON_AddStringToObject(c, "type", "function");
        f = cJSON_AddObjectToObject(c, "function");
        static const char *keys[] = {"name", "description", "parameters"};
        for (int k = 0; k < 3; k++) {
            const cJSON *x = cJSON_GetObjectItemCaseSensitive(t, keys[k]);
            if (x && !cJSON_IsNull(x))
                cJSON_AddItemToObject(f, keys[k], cJSON_Duplicate(x, 1));
        }
        cJSON_AddItemToArray(out, c);
        i++;
    }
    return out;
}

/* The members copied as they are: sampling, stopping and this server's extensions. */
static const char *const passed[] = {"model", "temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty",
                                     "frequency_penalty", "repetition_penalty", "logit_bias", "stop", "stop_token_ids",
                                     "ignore_eos", "draft", "cache_prompt", "stream", "thinking_mode"};

oai_gen *oai_responses_parse(oai_api *s, const cJSON *j, const char *raw, size_t raw_n, const char *path, oai_bad *b)
{
    const cJSON *prev = cJSON_GetObjectItemCaseSensitive(j, "previous_response_id");
    const cJSON *conv = cJSON_GetObjectItemCaseSensitive(j, "conversation");
    const cJSON *bg = cJSON_GetObjectItemCaseSensitive(j, "background");
    if (prev && !cJSON_IsNull(prev))
        return oai_fail(b, "previous_response_id", "this server stores no responses: send the whole conversation as 'input'"),
               NULL;
    if (conv && !cJSON_IsNull(conv))
        return oai_fail(b, "conversation", "this server stores no conversations: send the whole conversation as 'input'"), NULL;
    if (cJSON_IsTrue(bg))
        return oai_fail(b, "background", "background responses are not supported"), NULL;
    const cJSON *input = cJSON_GetObjectItemCaseSensitive(j, "input");
    const cJSON *instr = cJSON_GetObjectItemCaseSensitive(j, "instructions");
    if (!input)
        return oai_fail(b, "input", "'input' is required"), NULL;
    if (instr && !cJSON_IsNull(instr) && !cJSON_IsString(instr))
        return oai_fail(b, "instructions", "'instructions' must be a string"), NULL;

    cJSON *chat = cJSON_CreateObject(), *msgs = cJSON_AddArrayToObject(chat, "messages");
    oai_gen *g = NULL;
    if (cJSON_IsString(instr)) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", instr->valuestring);
        cJSON_AddItemToArray(msgs, m);
    }
    if (input_messages(input, msgs, b))
        goto out;
    for (size_t k = 0; k < sizeof passed / sizeof *passed; k++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, passed[k]);
        if (x)
            cJSON_AddItemToObject(chat, passed[k], cJSON_Duplicate(x, 1));
    }
    const cJSON *mot = cJSON_GetObjectItemCaseSensitive(j, "max_output_tokens");
    if (mot && !cJSON_IsNull(mot)) {
        if (!cJSON_IsNumber(mot) || mot->valuedouble < 1) {
            oai_fail(b, "max_output_tokens", "'max_output_tokens' must be a positive integer");
            goto out;
        }
        cJSON_AddNumberToObject(chat, "max_tokens", mot->valuedouble);
    }
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(j, "tools");
    if (tools && !cJSON_IsNull(tools)) {
        cJSON *ct = chat_tools(tools, b);
        if (!ct)
            goto out;
        cJSON_AddItemToObject(chat, "tools", ct);
    }
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(j, "tool_choice");
    if (cJSON_IsString(choice)) {
        cJSON_AddStringToObject(chat, "tool_choice", choice->valuestring);
    } else if (choice && !cJSON_IsNull(choice)) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(choice, "type");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(choice, "name");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") || !cJSON_IsString(name)) {
            oai_fail(b, "tool_choice", "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"name\": ...}");
            goto out;
        }
        cJSON *c = cJSON_CreateObject();
        cJSON_AddStringToObject(c, "type", "function");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(c, "function"), "name", name->valuestring);
        cJSON_AddItemToObject(chat, "tool_choice", c);
    }
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(j, "text");
    const cJSON *format = cJSON_GetObjectItemCaseSensitive(text, "format");
    if (text && !cJSON_IsNull(text) && !cJSON_IsObject(text)) {
        oai_fail(b, "text", "'text' must be an object");
        goto out;
    }
    if (format && !cJSON_IsNull(format)) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(format, "type");
        const char *ty = cJSON_IsString(type) ? type->valuestring : "";
        cJSON *rf = cJSON_CreateObject();
        cJSON_AddStringToObject(rf, "type", ty);
        if (!strcmp(ty, "json_schema")) {
            cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
            static const char *keys[] = {"name", "schema", "strict", "description"};
            for (int k = 0; k < 4; k++) {
                const cJSON *x = cJSON_GetObjectItemCaseSensitive(format, keys[k]);
                if (x)
                    cJSON_AddItemToObject(js, keys[k], cJSON_Duplicate(x, 1));
            }
        } else if (strcmp(ty, "text") && strcmp(ty, "json_object")) {
            cJSON_Delete(rf);
            oai_fail(b, "text.format", "text.format type '%s' is not one of text, json_object, json_schema", ty);
            goto out;
        }
        cJSON_AddItemToObject(chat, "response_format", rf);
    }
    const cJSON *reasoning = cJSON_GetObjectItemCaseSensitive(j, "reasoning");
    const cJSON *effort = cJSON_GetObjectItemCaseSensitive(reasoning, "effort");
    if (reasoning && !cJSON_IsNull(reasoning) && !cJSON_IsObject(reasoning)) {
        oai_fail(b, "reasoning", "'reasoning' must be an object");
        goto out;
    }
    if (effort && !cJSON_IsNull(effort)) {
        if (!cJSON_IsString(effort)) {
            oai_fail(b, "reasoning", "'reasoning.effort' must be a string");
            goto out;
        }
        /* the model has one thinking mode; any effort but "none" turns it on */
        if (strcmp(effort->valuestring, "none"))
            cJSON_AddStringToObject(chat, "reasoning_effort", effort->valuestring);
    }

    g = oai_gen_parse(s, chat, raw, raw_n, 1, NULL, path, b);
    if (!g)
        goto out;
    g->api = OAI_RESPONSES;
    /* "chatcmpl-HEX" -> "resp_HEX", as OpenAI spells response ids */
    char hex[33];
    snprintf(hex, sizeof hex, "%.32s", strchr(g->id, '-') + 1);
    snprintf(g->id, sizeof g->id, "resp_%s", hex);
    /* what the Response object repeats of the request */
    cJSON *e = g->echo = cJSON_CreateObject();
    if (cJSON_IsString(instr))
        cJSON_AddStringToObject(e, "instructions", instr->valuestring);
    else
        cJSON_AddNullToObject(e, "instructions");
    if (mot && cJSON_IsNumber(mot))
        cJSON_AddNumberToObject(e, "max_output_tokens", mot->valuedouble);
    else
        cJSON_AddNullToObject(e, "max_output_tokens");
    cJSON_AddNumberToObject(e, "temperature", g->r->sp.temperature);
    cJSON_AddNumberToObject(e, "top_p", g->r->sp.top_p);
    if (choice && !cJSON_IsNull(choice))
        cJSON_AddItemToObject(e, "tool_choice", cJSON_Duplicate(choice, 1));
    else
        cJSON_AddStringToObject(e, "tool_choice", "auto");
    cJSON_AddItemToObject(e, "tools", tools && !cJSON_IsNull(tools) ? cJSON_Duplicate(tools, 1) : cJSON_CreateArray());
    cJSON *tx = cJSON_AddObjectToObject(e, "text");
    if (format && !cJSON_IsNull(format))
        cJSON_AddItemToObject(tx, "format", cJSON_Duplicate(format, 1));
    else
        cJSON_AddStringToObject(cJSON_AddObjectToObject(tx, "format"), "type", "text");
    cJSON *re = cJSON_AddObjectToObject(e, "reasoning");
    if (effort && cJSON_IsString(effort))
        cJSON_AddStringToObject(re, "effort", effort->valuestring);
    else
        cJSON_AddNullToObject(re, "effort");
    cJSON_AddNullToObject(re, "summary");
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(j, "metadata");
    cJSON_AddItemToObject(e, "metadata", cJSON_IsObject(meta) ? cJSON_Duplicate(meta, 1) : cJSON_CreateObject());
    const cJSON *ptc = cJSON_GetObjectItemCaseSensitive(j, "parallel_tool_calls");
    cJSON_AddBoolToObject(e, "parallel_tool_calls", !cJSON_IsFalse(ptc));
out:
    cJSON_Delete(chat);
    return g;
}

/* ---- reply ------------------------------------------------------------------------ */

/* Output item ids: the response's unique part and the item's place. */
static void item_id(const oai_gen *g, const char *kind, int index, char *out, size_t cap)
{
    snprintf(out, cap, "%s_%s_%d", kind, strchr(g->id, '_') + 1, index);
}

static cJSON *reasoning_item(const char *id, const char *text, const char *status)
{
    cJSON *it = cJSON_CreateObject();
    cJSON_AddStringToObject(it, "id", id);
    cJSON_AddStringToObject(it, "type", "reasoning");
    cJSON_AddArrayToObject(it, "summary");
    cJSON *c = cJSON_AddArrayToObject(it, "content");
    if (text) {
        cJSON *p = cJSON_CreateObject();
        cJSON_AddStringToObject(p, "type", "reasoning_text");
        cJSON_AddStringToObject(p, "text", text);
        cJSON_AddItemToArray(c, p);
    }
    cJSON_AddStringToObject(it, "status", status);
    return it;
}

static cJSON *text_part(const char *text)
{
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", "output_text");
    cJSON_AddStringToObject(p, "text", text);
    cJSON_AddArrayToObject(p, "annotations");
    cJSON_AddArrayToObject(p, "logprobs");
    return p;
}

static cJSON *message_item(const char *id, const char *text, const char *status)
{
    cJSON *it = cJSON_CreateObject();
    cJSON_AddStringToObject(it, "id", id);
    cJSON_AddStringToObject(it, "type", "message");
    cJSON_AddStringToObject(it, "role", "assistant");
    cJSON_AddStringToObject(it, "status", status);
    cJSON *c = cJSON_AddArrayToObject(it, "content");
    if (text)
        cJSON_AddItemToArray(c, text_part(text));
    return it;
}

static cJSON *call_item(const oai_gen *g, const char *id, int call, const char *name, const char *args, const char *status)
{
    char call_id[160];
    oai_call_id(g, call, call_id, sizeof call_id);
    cJSON *it = cJSON_CreateObject();
    cJSON_AddStringToObject(it, "id", id);
    cJSON_AddStringToObject(it, "type", "function_call");
    cJSON_AddStringToObject(it, "status", status);
    cJSON_AddStringToObject(it, "call_id", call_id);
    cJSON_AddStringToObject(it, "name", name);
    cJSON_AddStringToObject(it, "arguments", args);
    return it;
}

/* Generated tokens that wrote the reasoning (those whose text starts before "</think>"). */
static int reasoning_tokens(const oai_gen *g)
{
    if (!g->dout.has_reasoning)
        return 0;
    const char *e = g->text.n ? memmem(g->text.p, g->text.n, "</think>", 8) : NULL;
    size_t end = e ? (size_t)(e - g->text.p) : g->text.n;
    int n = 0;
    while (n < g->n_tok && g->off[n] < end)
        n++;
    return n;
}

/* The Response object: status, the request's repeated fields, output (consumed) and usage. */
static cJSON *response_obj(const oai_gen *g, const char *status, cJSON *output, int with_usage)
{
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "id", g->id);
    cJSON_AddStringToObject(r, "object", "response");
    cJSON_AddNumberToObject(r, "created_at", (double)g->created);
    cJSON_AddStringToObject(r, "status", status);
    if (!strcmp(status, "failed")) {
        cJSON *e = cJSON_AddObjectToObject(r, "error");
        cJSON_AddStringToObject(e, "code", "server_error");
        cJSON_AddStringToObject(e, "message", g->r->errmsg[0] ? g->r->errmsg : "generation failed");
    } else {
        cJSON_AddNullToObject(r, "error");
    }
    if (!strcmp(status, "incomplete"))
        cJSON_AddStringToObject(cJSON_AddObjectToObject(r, "incomplete_details"), "reason", "max_output_tokens");
    else
        cJSON_AddNullToObject(r, "incomplete_details");
    cJSON_AddStringToObject(r, "model", g->s->name);
    cJSON_AddItemToObject(r, "output", output);
    for (const cJSON *x = g->echo ? g->echo->child : NULL; x; x = x->next)
        cJSON_AddItemToObject(r, x->string, cJSON_Duplicate(x, 1));
    cJSON_AddNullToObject(r, "previous_response_id");
    cJSON_AddBoolToObject(r, "store", 0);
    cJSON_AddStringToObject(r, "truncation", "disabled");
    if (with_usage) {
        cJSON *u = cJSON_AddObjectToObject(r, "usage");
        cJSON_AddNumberToObject(u, "input_tokens", g->r->n_prompt);
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "input_tokens_details"), "cached_tokens", g->r->n_cached);
        cJSON_AddNumberToObject(u, "output_tokens", g->n_tok);
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "output_tokens_details"), "reasoning_tokens", reasoning_tokens(g));
        cJSON_AddNumberToObject(u, "total_tokens", g->r->n_prompt + g->n_tok);
    } else {
        cJSON_AddNullToObject(r, "usage");
    }
    return r;
}

/* How the generation ended, as a Response status. */
static const char *status_of(const oai_gen *g)
{
    return g->finish == DSV4_FINISH_ERROR ? "failed" : g->finish == DSV4_FINISH_LENGTH ? "incomplete" : "completed";
}

cJSON *oai_responses_reply(oai_gen *g)
{
    oai_chat_parse(g, g->text.n);
    cJSON *out = cJSON_CreateArray();
    const char *st = strcmp(status_of(g), "incomplete") ? "completed" : "incomplete";
    int n_calls = cJSON_GetArraySize(g->dout.calls), idx = 0;
    char id[96];
    if (g->dout.has_reasoning && g->dout.reasoning.n) {
        item_id(g, "rs", idx++, id, sizeof id);
        cJSON_AddItemToArray(out, reasoning_item(id, g->dout.reasoning.p, "completed"));
    }
    if (g->dout.content.n || !n_calls) {
        item_id(g, "msg", idx++, id, sizeof id);
        cJSON_AddItemToArray(out, message_item(id, g->dout.content.n ? g->dout.content.p : "", n_calls ? "completed" : st));
    }
    for (int i = 0; i < n_calls; i++) {
        const cJSON *c = cJSON_GetArrayItem(g->dout.calls, i);
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(c, "name");
        char *args = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(c, "arguments"));
        item_id(g, "fc", idx++, id, sizeof id);
        cJSON_AddItemToArray(out, call_item(g, id, i, cJSON_IsString(name) ? name->valuestring : "", args ? args : "{}",
                                            i + 1 == n_calls && g->dout.truncated ? "incomplete" : "completed"));
        free(args);
    }
    return response_obj(g, status_of(g), out, 1);
}

/* ---- stream ----------------------------------------------------------------------- */

/* A new event of type with its sequence number; the caller adds the rest and emits it. */
static cJSON *event(oai_gen *g, const char *type)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "type", type);
    cJSON_AddNumberToObject(e, "sequence_number", g->rs.seq++);
    return e;
}

static void emit(oai_gen *g, cJSON *e)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(e, "type");
    char name[64];
    snprintf(name, sizeof name, "%s", type->valuestring);
    oai_sse(g, name, e);
}

/* An item event's place: item_id, output_index (and content_index for text). */
static cJSON *item_event(oai_gen *g, const char *type, int with_content)
{
    cJSON *e = event(g, type);
    cJSON_AddStringToObject(e, "item_id", g->rs.item_id);
    cJSON_AddNumberToObject(e, "output_index", g->rs.n_items - 1);
    if (with_content)
        cJSON_AddNumberToObject(e, "content_index", 0);
    return e;
}

/* Closes the open item: its done events, and the item joins the output. */
static void close_item(oai_gen *g, const char *status)
{
    oai_resp_stream *rs = &g->rs;
    const char *text = rs->text.p ? rs->text.p : "";
    cJSON *item = NULL, *e;
    if (rs->kind == ITEM_REASONING || rs->kind == ITEM_MESSAGE) {
        const int r = rs->kind == ITEM_REASONING;
        e = item_event(g, r ? "response.reasoning_text.done" : "response.output_text.done", 1);
        cJSON_AddStringToObject(e, "text", text);
        if (!r)
            cJSON_AddArrayToObject(e, "logprobs");
        emit(g, e);
        e = item_event(g, "response.content_part.done", 1);
        if (r) {
            cJSON *p = cJSON_AddObjectToObject(e, "part");
            cJSON_AddStringToObject(p, "type", "reasoning_text");
            cJSON_AddStringToObject(p, "text", text);
        } else {
            cJSON_AddItemToObject(e, "part", text_part(text));
        }
        emit(g, e);
        item = r ? reasoning_item(rs->item_id, text, status) : message_item(rs->item_id, text, status);
    } else if (rs->kind == ITEM_CALL) {
        const char *name = rs->name.p ? rs->name.p : "";
        e = item_event(g, "response.function_call_arguments.done", 0);
        cJSON_AddStringToObject(e, "name", name);
        cJSON_AddStringToObject(e, "arguments", text);
        emit(g, e);
        item = call_item(g, rs->item_id, rs->call, name, text, status);
    } else {
        return;
    }
    e = event(g, "response.output_item.done");
    cJSON_AddNumberToObject(e, "output_index", rs->n_items - 1);
    cJSON_AddItemToObject(e, "item", cJSON_Duplicate(item, 1));
    emit(g, e);
    if (!rs->output)
        rs->output = cJSON_CreateArray();
    cJSON_AddItemToArray(rs->output, item);
    rs->kind = ITEM_NONE;
    rs->text.n = rs->name.n = 0;
}

/* Opens an item of kind (closing the open one): its added events. */
static void open_item(oai_gen *g, int kind, int call, const char *name)
{
    oai_resp_stream *rs = &g->rs;
    close_item(g, "completed");
    rs->kind = kind;
    rs->call = call;
    rs->had_message |= kind == ITEM_MESSAGE;
    item_id(g, kind == ITEM_REASONING ? "rs" : kind == ITEM_MESSAGE ? "msg" : "fc", rs->n_items++, rs->item_id,
            sizeof rs->item_id);
    dsv4_buf_put(&rs->text, "", 0);
    dsv4_buf_put(&rs->name, "", 0);
    if (name)
        dsv4_buf_puts(&rs->name, name);
    cJSON *e = event(g, "response.output_item.added");
    cJSON_AddNumberToObject(e, "output_index", rs->n_items - 1);
    cJSON_AddItemToObject(e, "item", kind == ITEM_REASONING ? reasoning_item(rs->item_id, NULL, "in_progress")
                                     : kind == ITEM_MESSAGE ? message_item(rs->item_id, NULL, "in_progress")
                                                            : call_item(g, rs->item_id, call, name, "", "in_progress"));
    emit(g, e);
    if (kind == ITEM_CALL)
        return;
    e = item_event(g, "response.content_part.added", 1);
    if (kind == ITEM_REASONING) {
        cJSON *p = cJSON_AddObjectToObject(e, "part");
        cJSON_AddStringToObject(p, "type", "reasoning_text");
        cJSON_AddStringToObject(p, "text", "");
    } else {
        cJSON_AddItemToObject(e, "part", text_part(""));
    }
    emit(g, e);
}

/* Text for the open item of kind (opening it when another is open): a delta event. */
static void text_delta(oai_gen *g, int kind, dsv4_buf *t)
{
    if (!t->n)
        return;
    if (g->rs.kind != kind)
        open_item(g, kind, 0, NULL);
    cJSON *e = item_event(g, kind == ITEM_REASONING ? "response.reasoning_text.delta" : "response.output_text.delta", 1);
    cJSON_AddStringToObject(e, "delta", t->p);
    if (kind == ITEM_MESSAGE)
        cJSON_AddArrayToObject(e, "logprobs");
    emit(g, e);
    dsv4_buf_put(&g->rs.text, t->p, t->n);
    t->n = 0;
    t->p[0] = 0;
}

void oai_responses_events(oai_gen *g)
{
    oai_resp_stream *rs = &g->rs;
    oai_chat_parse(g, oai_safe_len(g));
    if (!rs->started) {
        rs->started = 1;
        cJSON *e = event(g, "response.created");
        cJSON_AddItemToObject(e, "response", response_obj(g, "in_progress", cJSON_CreateArray(), 0));
        emit(g, e);
        e = event(g, "response.in_progress");
        cJSON_AddItemToObject(e, "response", response_obj(g, "in_progress", cJSON_CreateArray(), 0));
        emit(g, e);
    }
    text_delta(g, ITEM_REASONING, &g->dout.reasoning);
    text_delta(g, ITEM_MESSAGE, &g->dout.content);
    cJSON *frags = cJSON_CreateArray();
    oai_call_deltas(g, frags);
    const cJSON *f;
    cJSON_ArrayForEach(f, frags)
    {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(f, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        const cJSON *index = cJSON_GetObjectItemCaseSensitive(f, "index");
        if (cJSON_IsString(name))
            open_item(g, ITEM_CALL, index->valueint, name->valuestring);
        if (cJSON_IsString(args) && *args->valuestring) {
            cJSON *e = item_event(g, "response.function_call_arguments.delta", 0);
            cJSON_AddStringToObject(e, "delta", args->valuestring);
            emit(g, e);
            dsv4_buf_puts(&rs->text, args->valuestring);
        }
    }
    cJSON_Delete(frags);
    if (rs->kind == ITEM_CALL && rs->call < g->n_calls_sent && !(g->finish && g->dout.truncated))
        close_item(g, "completed");
    if (g->finish && !g->final_sent) {
        g->final_sent = 1;
        const char *st = status_of(g);
        if (!rs->had_message && !cJSON_GetArraySize(g->dout.calls)) /* as the whole reply: a message, if empty */
            open_item(g, ITEM_MESSAGE, 0, NULL);
        close_item(g, strcmp(st, "incomplete") ? "completed" : "incomplete");
        if (!rs->output)
            rs->output = cJSON_CreateArray();
        cJSON *e = event(g, !strcmp(st, "failed") ? "response.failed" : !strcmp(st, "incomplete") ? "response.incomplete"
                                                                                                  : "response.completed");
        cJSON_AddItemToObject(e, "response", response_obj(g, st, rs->output, 1));
        rs->output = NULL;
        emit(g, e);
    }
}
