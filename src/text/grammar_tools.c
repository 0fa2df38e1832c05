/* grammar_tools — a forced DSML tool-call block (tool_choice "required" or a named function),
 * each call's parameters following its tool's JSON schema. The shape is what chat.c renders
 * and dsml.c parses: after the reply's start,
 *   "\n\n<calls>\n" invoke ("\n" invoke)* "\n</calls>"
 *   invoke = <invoke name="NAME">\n param ("\n" param)* \n</invoke>
 *   param  = <parameter name="K" string="true">RAW</parameter>   (string schemas: raw text)
 *          | <parameter name="K" string="false">JSON</parameter> (anything else: JSON)
 * with the V4.1 or the V4 (0731) tag spellings. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "text/buf.h"
#include "text/grammar_impl.h"

typedef struct dialect {
    const char *calls, *calls_end, *invoke, *invoke_end, *param, *param_end;
} dialect;

static const dialect v41 = {"<｜DSML｜ calls>", "</｜DSML｜ calls>", "<｜DSML｜ invoke", "</｜DSML｜ invoke>",
                            "<｜DSML｜ parameter", "</｜DSML｜ parameter>"};
static const dialect v4 = {"<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>", "<｜DSML｜invoke", "</｜DSML｜invoke>",
                           "<｜DSML｜parameter", "</｜DSML｜parameter>"};

/* Raw parameter text may not contain this: the parser ends the value at the closing tag. */
#define RAW_MARKER "</｜DSML｜"

static uint32_t lit_of(dsv4_grammar *g, dsv4_buf *b)
{
    uint32_t id = b->oom ? G_INF : g_lit(g, b->p ? b->p : "", b->n);
    dsv4_buf_free(b);
    return id;
}

static uint32_t dsml_member(void *u, g_schema_ctx *c, const char *key, const cJSON *sub, const char *path, dsv4_err *err)
{
    const dialect *d = u;
    dsv4_grammar *g = g_schema_grammar(c);
    const int raw = g_schema_is_string(c, sub);
    dsv4_buf open = {0};
    dsv4_buf_puts(&open, d->param);
    dsv4_buf_puts(&open, " name=\"");
    dsv4_buf_puts(&open, key);
    dsv4_buf_puts(&open, raw ? "\" string=\"true\">" : "\" string=\"false\">");
    const uint32_t o = lit_of(g, &open);
    const uint32_t v = raw ? g_schema_raw_string(c, sub, RAW_MARKER, path, err) : g_schema_value(c, sub, path, err);
    if (v == G_INF || o == G_INF)
        return G_INF;
    return G_SEQ_OF(g, o, v, g_lits(g, d->param_end));
}

/* One invoke of tool f ({"name", "parameters"}). */
static uint32_t invoke(dsv4_grammar *g, const dialect *d, const cJSON *f, const dsv4_grammar_opts *o, dsv4_err *err)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(f, "parameters");
    char path[300];
    snprintf(path, sizeof path, "tool %s parameters", cJSON_IsString(name) ? name->valuestring : "?");
    if (!cJSON_IsString(name) || !name->valuestring[0] || strchr(name->valuestring, '"'))
        return dsv4_fail(err, DSV4_E_ARG, "a tool needs a function name without quotes"), G_INF;
    if (params && !cJSON_IsObject(params))
        return dsv4_fail(err, DSV4_E_ARG, "%s: parameters must be a JSON Schema object", path), G_INF;
    dsv4_buf b = {0};
    dsv4_buf_puts(&b, d->invoke);
    dsv4_buf_puts(&b, " name=\"");
    dsv4_buf_puts(&b, name->valuestring);
    dsv4_buf_puts(&b, "\">\n");
    const uint32_t head = lit_of(g, &b);
    uint32_t body = g_seq(g, NULL, 0);
    if (params) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(params, "type");
        if (t && !(cJSON_IsString(t) && !strcmp(t->valuestring, "object")))
            return dsv4_fail(err, DSV4_E_UNSUPPORTED, "%s: the parameters must be of type object", path), G_INF;
        const cJSON *ap = cJSON_GetObjectItemCaseSensitive(params, "additionalProperties");
        if (ap && !cJSON_IsBool(ap))
            return dsv4_fail(err, DSV4_E_UNSUPPORTED, "%s: additionalProperties as a schema is not supported", path), G_INF;
        const cJSON *k;
        cJSON_ArrayForEach(k, params)
        {
            static const char *const ok[] = {"type", "properties", "required", "additionalProperties", "description",
                                             "title", "$defs", "definitions", "$schema", "$comment", "strict", NULL};
            int known = 0;
            for (const char *const *p = ok; *p; p++)
                known |= !strcmp(*p, k->string);
            if (!known)
                return dsv4_fail(err, DSV4_E_UNSUPPORTED, "%s: keyword \"%s\" is not supported", path, k->string), G_INF;
        }
        g_schema_ctx *c = g_schema_ctx_new(g, params, g_max_ws(o), err);
        if (!c)
            return G_INF;
        body = g_members(c, params, g_lits(g, "\n"), dsml_member, (void *)d, path, err);
        g_schema_ctx_free(c);
        if (body == G_INF)
            return G_INF;
    }
    dsv4_buf_puts(&b, "\n");
    dsv4_buf_puts(&b, d->invoke_end);
    return G_SEQ_OF(g, head, body, lit_of(g, &b));
}

dsv4_grammar *dsv4_grammar_tool_call(const cJSON *tools, const char *name, const dsv4_grammar_opts *o, dsv4_err *err)
{
    if (!cJSON_IsArray(tools) || !cJSON_GetArraySize(tools))
        return dsv4_fail(err, DSV4_E_ARG, "a forced tool call needs a non-empty tools array"), NULL;
    const dialect *d = o && o->dsml_v4 ? &v4 : &v41;
    dsv4_grammar *g = g_new();
    int n = cJSON_GetArraySize(tools), k = 0;
    uint32_t *kids = calloc((size_t)n, sizeof *kids);
    if (!g || !kids) {
        free(kids);
        dsv4_grammar_free(g);
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory"), NULL;
    }
    const cJSON *t;
    cJSON_ArrayForEach(t, tools)
    {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!f)
            f = t;
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(f, "name");
        if (name && !(cJSON_IsString(nm) && !strcmp(nm->valuestring, name)))
            continue;
        kids[k] = invoke(g, d, f, o, err);
        if (kids[k++] == G_INF) {
            free(kids);
            dsv4_grammar_free(g);
            return NULL;
        }
    }
    if (!k) {
        free(kids);
        dsv4_grammar_free(g);
        return dsv4_fail(err, DSV4_E_ARG, "tool_choice names function \"%s\", which is not among the tools", name), NULL;
    }
    const uint32_t one = k == 1 ? kids[0] : g_alt(g, kids, (uint32_t)k);
    free(kids);
    const uint32_t max_calls = name ? 1 : o && o->max_calls > 0 ? (uint32_t)o->max_calls : 8;
    const uint32_t calls = max_calls == 1 ? one : g_rep(g, one, g_lits(g, "\n"), 1, max_calls);
    dsv4_buf open = {0}, close = {0};
    dsv4_buf_puts(&open, "\n\n");
    dsv4_buf_puts(&open, d->calls);
    dsv4_buf_puts(&open, "\n");
    dsv4_buf_puts(&close, "\n");
    dsv4_buf_puts(&close, d->calls_end);
    const uint32_t block = G_SEQ_OF(g, lit_of(g, &open), calls, lit_of(g, &close));
    const uint32_t root = g_reply(g, o, block);
    if (root == G_INF || g_finish(g, root)) {
        dsv4_grammar_free(g);
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory compiling the tool-call grammar"), NULL;
    }
    return g;
}
