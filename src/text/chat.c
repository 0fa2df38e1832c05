#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "text/chat.h"

#define BOS "<｜begin▁of▁sentence｜>"
#define EOS "<｜end▁of▁sentence｜>"
#define SYS "<｜System｜>"
#define USER "<｜User｜>"
#define ASSISTANT "<｜Assistant｜>"
#define REMINDER "<｜latest_reminder｜>"
#define IMAGE "<｜deepseek_image｜>"

/* What differs between the V4.1 and the V4 (0731) encoders. */
typedef struct dialect {
    int v41;
    const char *calls, *invoke, *param; /* DSML tag names, written right after "｜DSML｜" */
} dialect;

static const dialect v41 = {1, " calls", " invoke", " parameter"};
static const dialect v4 = {0, "tool_calls", "invoke", "parameter"};

static const char effort_max_v4[] =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, "
    "rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, "
    "and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

/* Writes text with {C} {I} {P} standing for "｜DSML｜" + the dialect's calls/invoke/parameter. */
static void put_tags(dsv4_buf *b, const dialect *d, const char *t)
{
    for (const char *p = t; *p;) {
        if (p[0] == '{' && p[1] && p[2] == '}' && strchr("CIP", p[1])) {
            dsv4_buf_puts(b, "｜DSML｜");
            dsv4_buf_puts(b, p[1] == 'C' ? d->calls : p[1] == 'I' ? d->invoke : d->param);
            p += 3;
        } else {
            const char *q = strchr(p + 1, '{');
            size_t n = q ? (size_t)(q - p) : strlen(p);
            dsv4_buf_put(b, p, n);
            p += n;
        }
    }
}

/* ---- Python-compatible JSON ------------------------------------------------------------ */

static void py_string(dsv4_buf *b, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    dsv4_buf_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        const char *e = NULL;
        switch (c) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        case '\b': e = "\\b"; break;
        case '\f': e = "\\f"; break;
        default: break;
        }
        if (e)
            dsv4_buf_puts(b, e);
        else if (c < 0x20) {
            char u[7] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15], 0};
            dsv4_buf_puts(b, u);
        } else
            dsv4_buf_put(b, s, 1);
    }
    dsv4_buf_put(b, "\"", 1);
}

/* Python's repr of a float: the shortest digits that round-trip, positional for decimal
 * exponents -4..15 and scientific ("1e-05", "1.5e+16") outside. Integral values below 1e16
 * print as integers, which is what JSON integers (the common case in tool schemas) need. */
static void py_float(dsv4_buf *b, double d)
{
    char t[40];
    if (d == floor(d) && fabs(d) < 1e16) {
        snprintf(t, sizeof t, "%.0f", d);
        dsv4_buf_puts(b, t);
        return;
    }
    int p;
    for (p = 1; p <= 17; p++) {
        snprintf(t, sizeof t, "%.*e", p - 1, d);
        if (strtod(t, NULL) == d)
            break;
    }
    /* t is "[-]d.ddde[+-]XX": split into sign, digits and exponent */
    char digits[24];
    int nd = 0, neg = t[0] == '-';
    const char *q = t + neg;
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9')
            digits[nd++] = *q;
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    int ex = atoi(q + 1);
    char o[64];
    int k = 0;
    if (neg)
        o[k++] = '-';
    if (ex >= -4 && ex < 16) {
        if (ex < 0) {
            o[k++] = '0';
            o[k++] = '.';
            for (int i = 0; i < -ex - 1; i++)
                o[k++] = '0';
            for (int i = 0; i < nd; i++)
                o[k++] = digits[i];
        } else {
            for (int i = 0; i <= ex; i++)
                o[k++] = i < nd ? digits[i] : '0';
            o[k++] = '.';
            if (nd > ex + 1)
                for (int i = ex + 1; i < nd; i++)
                    o[k++] = digits[i];
            else
                o[k++] = '0';
        }
        o[k] = 0;
    } else {
        o[k++] = digits[0];
        if (nd > 1) {
            o[k++] = '.';
            for (int i = 1; i < nd; i++)
                o[k++] = digits[i];
        }
        snprintf(o + k, sizeof o - (size_t)k, "e%c%02d", ex < 0 ? '-' : '+', ex < 0 ? -ex : ex);
    }
    dsv4_buf_puts(b, o);
}

void dsv4_py_json(dsv4_buf *b, const cJSON *v)
{
    if (!v || cJSON_IsNull(v))
        dsv4_buf_puts(b, "null");
    else if (cJSON_IsTrue(v))
        dsv4_buf_puts(b, "true");
    else if (cJSON_IsFalse(v))
        dsv4_buf_puts(b, "false");
    else if (cJSON_IsNumber(v))
        py_float(b, v->valuedouble);
    else if (cJSON_IsString(v))
        py_string(b, v->valuestring);
    else if (cJSON_IsRaw(v))
        dsv4_buf_puts(b, v->valuestring);
    else {
        int obj = cJSON_IsObject(v);
        dsv4_buf_puts(b, obj ? "{" : "[");
        const cJSON *e;
        int first = 1;
        cJSON_ArrayForEach(e, v)
        {
            if (!first)
                dsv4_buf_puts(b, ", ");
            first = 0;
            if (obj) {
                py_string(b, e->string);
                dsv4_buf_puts(b, ": ");
            }
            dsv4_py_json(b, e);
        }
        dsv4_buf_puts(b, obj ? "}" : "]");
    }
}

/* ---- messages ---------------------------------------------------------------------------- */

typedef struct block {
    int tool;            /* 0: text, 1: tool result */
    char *text;          /* owned */
    const char *id;      /* tool_call_id (borrowed) */
} block;

typedef struct msg {
    const char *role;
    char *content;       /* owned; NULL when absent */
    const char *reasoning;
    const cJSON *tools, *response_format, *tool_calls;
    const char *task;
    block *blocks;       /* user messages (after merging) */
    int nblocks;
    int has_blocks;
} msg;

typedef struct conv {
    msg *m;
    int n, cap;
} conv;

static void conv_free(conv *c)
{
    for (int i = 0; i < c->n; i++) {
        free(c->m[i].content);
        for (int j = 0; j < c->m[i].nblocks; j++)
            free(c->m[i].blocks[j].text);
        free(c->m[i].blocks);
    }
    free(c->m);
    memset(c, 0, sizeof *c);
}

static msg *conv_add(conv *c)
{
    if (c->n == c->cap) {
        int cap = c->cap ? c->cap * 2 : 8;
        msg *m = realloc(c->m, (size_t)cap * sizeof *m);
        if (!m)
            return NULL;
        c->m = m;
        c->cap = cap;
    }
    msg *m = &c->m[c->n++];
    memset(m, 0, sizeof *m);
    return m;
}

static int add_block(msg *m, int tool, char *text, const char *id)
{
    block *b = realloc(m->blocks, (size_t)(m->nblocks + 1) * sizeof *b);
    if (!b) {
        free(text);
        return -1;
    }
    m->blocks = b;
    m->blocks[m->nblocks++] = (block){tool, text, id};
    m->has_blocks = 1;
    return 0;
}

static char *dup(const char *s)
{
    size_t k = strlen(s);
    char *d = malloc(k + 1);
    if (d)
        memcpy(d, s, k + 1);
    return d;
}

static const char *str_field(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* Message content as text: a string as is; a list of parts joined by blank lines, images as
 * the image placeholder. *missing is set when there is no content at all. */
static int content_text(const cJSON *c, char **out, int *missing, dsv4_err *err)
{
    *missing = 0;
    if (!c || cJSON_IsNull(c)) {
        *missing = 1;
        *out = dup("");
        return *out ? 0 : dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    }
    if (cJSON_IsString(c)) {
        *out = dup(c->valuestring);
        return *out ? 0 : dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    }
    if (!cJSON_IsArray(c))
        return dsv4_fail(err, DSV4_E_ARG, "message content must be a string or a list of parts");
    dsv4_buf b = {0};
    dsv4_buf_put(&b, "", 0);
    const cJSON *p;
    int first = 1;
    cJSON_ArrayForEach(p, c)
    {
        const char *type = str_field(p, "type");
        const char *text = str_field(p, "text");
        if (!first)
            dsv4_buf_puts(&b, "\n\n");
        first = 0;
        if (type && (!strcmp(type, "text") || !strcmp(type, "input_text") || !strcmp(type, "output_text")) && text)
            dsv4_buf_puts(&b, text);
        else if (type && (!strcmp(type, "image_url") || !strcmp(type, "input_image") || !strcmp(type, "image")))
            dsv4_buf_puts(&b, IMAGE);
        else {
            dsv4_buf_free(&b);
            return dsv4_fail(err, DSV4_E_ARG, "content part of type \"%s\" is not supported (text and image only)",
                             type ? type : "(none)");
        }
    }
    if (b.oom) {
        dsv4_buf_free(&b);
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    }
    *out = b.p;
    return 0;
}

/* Tool results become <tool_result> blocks of user messages; consecutive user turns (and tool
 * results) merge into one user message, as the release encoder does. */
static int build(const cJSON *msgs, const cJSON *top_tools, conv *c, dsv4_err *err)
{
    int i = 0;
    const cJSON *j;
    cJSON_ArrayForEach(j, msgs)
    {
        const char *role = str_field(j, "role");
        if (!role)
            return dsv4_fail(err, DSV4_E_ARG, "message %d has no role", i);
        char *text;
        int missing;
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(j, "content");
        int rc = content_text(content, &text, &missing, err);
        if (rc)
            return dsv4_err_prefix(err, "message %d", i);
        msg *last = c->n ? &c->m[c->n - 1] : NULL;
        if (!strcmp(role, "tool")) {
            const char *id = str_field(j, "tool_call_id");
            if (!(last && !strcmp(last->role, "user") && last->has_blocks)) {
                last = conv_add(c);
                if (!last) {
                    free(text);
                    return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
                }
                last->role = "user";
            }
            if (add_block(last, 1, text, id ? id : ""))
                return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
        } else if (!strcmp(role, "user")) {
            if (!(last && !strcmp(last->role, "user") && last->has_blocks && !last->task)) {
                last = conv_add(c);
                if (!last) {
                    free(text);
                    return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
                }
                last->role = "user";
                last->task = str_field(j, "task");
            }
            if (add_block(last, 0, text, NULL))
                return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
        } else {
            msg *m = conv_add(c);
            if (!m) {
                free(text);
                return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
            }
            m->role = role;
            m->content = missing ? (free(text), (char *)NULL) : text;
            m->reasoning = str_field(j, "reasoning_content");
            if (!m->reasoning)
                m->reasoning = str_field(j, "reasoning");
            m->tools = cJSON_GetObjectItemCaseSensitive(j, "tools");
            m->response_format = cJSON_GetObjectItemCaseSensitive(j, "response_format");
            m->tool_calls = cJSON_GetObjectItemCaseSensitive(j, "tool_calls");
            m->task = str_field(j, "task");
            if (cJSON_IsNull(m->response_format))
                m->response_format = NULL;
        }
        i++;
    }
    if (top_tools && cJSON_GetArraySize(top_tools) > 0) {
        if (!c->n || strcmp(c->m[0].role, "system"))
            return dsv4_fail(err, DSV4_E_ARG, "top-level tools need a system message first (tools live on it)");
        c->m[0].tools = top_tools;
    }
    return 0;
}

static const char *call_id(const cJSON *tc)
{
    const char *id = str_field(tc, "id");
    if (!id)
        id = str_field(cJSON_GetObjectItemCaseSensitive(tc, "function"), "id");
    return id ? id : "";
}

/* Within each user message, tool results follow the order of the calls of the assistant
 * message that last made calls (stable; unknown ids rank as the first call). */
static void sort_results(conv *c)
{
    const cJSON *calls = NULL;
    for (int i = 0; i < c->n; i++) {
        msg *m = &c->m[i];
        if (!strcmp(m->role, "assistant") && cJSON_GetArraySize(m->tool_calls) > 0) {
            calls = m->tool_calls;
            continue;
        }
        if (strcmp(m->role, "user") || !calls)
            continue;
        int nt = 0;
        for (int k = 0; k < m->nblocks; k++)
            nt += m->blocks[k].tool;
        if (nt < 2)
            continue;
        block *tb = malloc((size_t)nt * sizeof *tb);
        int *rank = malloc((size_t)nt * sizeof *rank);
        if (!tb || !rank) {
            free(tb);
            free(rank);
            continue;
        }
        int t = 0;
        for (int k = 0; k < m->nblocks; k++)
            if (m->blocks[k].tool) {
                tb[t] = m->blocks[k];
                rank[t] = 0;
                int idx = 0;
                const cJSON *tc;
                cJSON_ArrayForEach(tc, calls)
                {
                    const char *id = call_id(tc);
                    if (id[0] && !strcmp(id, tb[t].id)) {
                        rank[t] = idx;
                    }
                    idx++;
                }
                t++;
            }
        for (int a = 1; a < nt; a++) /* insertion sort: stable */
            for (int b = a; b > 0 && rank[b] < rank[b - 1]; b--) {
                block x = tb[b];
                tb[b] = tb[b - 1];
                tb[b - 1] = x;
                int r = rank[b];
                rank[b] = rank[b - 1];
                rank[b - 1] = r;
            }
        t = 0;
        for (int k = 0; k < m->nblocks; k++)
            if (m->blocks[k].tool)
                m->blocks[k] = tb[t++];
        free(tb);
        free(rank);
    }
}

/* The last user turn: a user or developer message, or (V4.1) a system message past the first. */
static int last_user(const conv *c, int v41_rules)
{
    for (int i = c->n - 1; i >= 0; i--) {
        const char *r = c->m[i].role;
        if (!strcmp(r, "user") || !strcmp(r, "developer") || (v41_rules && !strcmp(r, "system") && i > 0))
            return i;
    }
    return -1;
}

/* With dropped thinking, history before the last user turn keeps only user/system/reminder
 * messages and assistant answers without their reasoning; other roles there disappear. */
static void drop_history(conv *c, int v41_rules)
{
    int lu = last_user(c, v41_rules), k = 0;
    for (int i = 0; i < c->n; i++) {
        msg *m = &c->m[i];
        const char *r = m->role;
        int keep = !strcmp(r, "user") || !strcmp(r, "system") || !strcmp(r, "tool") || !strcmp(r, "latest_reminder") ||
                   !strcmp(r, "direct_search_results") || i >= lu;
        if (!keep && !strcmp(r, "assistant")) {
            m->reasoning = NULL;
            keep = 1;
        }
        if (keep)
            c->m[k++] = *m;
        else {
            free(m->content);
            for (int j = 0; j < m->nblocks; j++)
                free(m->blocks[j].text);
            free(m->blocks);
        }
    }
    c->n = k;
}

static void render_tools(dsv4_buf *b, const dialect *d, const cJSON *tools)
{
    put_tags(b, d,
        "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by "
        "writing a \"<{C}>\" block like the following:\n\n"
        "<{C}>\n<{I} name=\"$TOOL_NAME\">\n<{P} name=\"$PARAMETER_NAME\" "
        "string=\"true|false\">$PARAMETER_VALUE</{P}>\n...\n</{I}>\n<{I} name=\"$TOOL_NAME2\">\n...\n</{I}>\n</{C}>\n\n"
        "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
        "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
        "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
        "<think>...</think> BEFORE any tool calls or final response.\n\n"
        "Otherwise, output directly after </think> with tool calls or final response.\n\n"
        "### Available Tool Schemas\n\n");
    const cJSON *t;
    int first = 1;
    cJSON_ArrayForEach(t, tools)
    {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!first)
            dsv4_buf_puts(b, "\n");
        first = 0;
        dsv4_py_json(b, f ? f : t);
    }
    dsv4_buf_puts(b, "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n");
}

static void render_extras(dsv4_buf *b, const dialect *d, const msg *m)
{
    if (cJSON_GetArraySize(m->tools) > 0) {
        dsv4_buf_puts(b, "\n\n");
        render_tools(b, d, m->tools);
    }
    if (m->response_format) {
        dsv4_buf_puts(b, "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n");
        dsv4_py_json(b, m->response_format);
    }
}

/* One call's arguments as DSML parameters. Arguments given as JSON text (even twice encoded)
 * are parsed; anything that is not an object becomes the single parameter "arguments". */
static int render_args(dsv4_buf *b, const dialect *d, const cJSON *args)
{
    cJSON *parsed = NULL;
    const cJSON *a = args;
    for (int i = 0; i < 2 && cJSON_IsString(a); i++) {
        cJSON *p = cJSON_ParseWithOpts(a->valuestring, NULL, 1);
        if (!p)
            break;
        cJSON_Delete(parsed);
        parsed = p;
        a = p;
    }
    cJSON *wrap = NULL;
    if (!cJSON_IsObject(a)) {
        wrap = cJSON_CreateObject();
        if (!wrap || !cJSON_AddItemReferenceToObject(wrap, "arguments", (cJSON *)args)) {
            cJSON_Delete(wrap);
            cJSON_Delete(parsed);
            return -1;
        }
        a = wrap;
    }
    const cJSON *v;
    int first = 1;
    cJSON_ArrayForEach(v, a)
    {
        if (!first)
            dsv4_buf_puts(b, "\n");
        first = 0;
        int s = cJSON_IsString(v);
        put_tags(b, d, "<{P} name=\"");
        dsv4_buf_puts(b, v->string);
        dsv4_buf_puts(b, s ? "\" string=\"true\">" : "\" string=\"false\">");
        if (s)
            dsv4_buf_puts(b, v->valuestring);
        else
            dsv4_py_json(b, v);
        put_tags(b, d, "</{P}>");
    }
    cJSON_Delete(wrap);
    cJSON_Delete(parsed);
    return 0;
}

static int render_calls(dsv4_buf *b, const dialect *d, const cJSON *calls, dsv4_err *err)
{
    put_tags(b, d, "\n\n<{C}>\n");
    const cJSON *tc;
    int first = 1;
    cJSON_ArrayForEach(tc, calls)
    {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(tc, "function");
        if (!f)
            f = tc;
        const char *name = str_field(f, "name");
        if (!name)
            return dsv4_fail(err, DSV4_E_ARG, "a tool call has no function name");
        if (!first)
            dsv4_buf_puts(b, "\n");
        first = 0;
        put_tags(b, d, "<{I} name=\"");
        dsv4_buf_puts(b, name);
        dsv4_buf_puts(b, "\">\n");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(f, "arguments");
        cJSON *empty = NULL;
        if (!args)
            args = empty = cJSON_CreateObject();
        int rc = args ? render_args(b, d, args) : -1;
        cJSON_Delete(empty);
        if (rc)
            return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
        put_tags(b, d, "\n</{I}>");
    }
    put_tags(b, d, "\n</{C}>");
    return 0;
}

static const struct {
    const char *name, *token;
} tasks[] = {
    {"action", "<｜action｜>"}, {"query", "<｜query｜>"}, {"authority", "<｜authority｜>"},
    {"domain", "<｜domain｜>"}, {"title", "<｜title｜>"}, {"read_url", "<｜read_url｜>"},
};

typedef struct opts {
    int thinking, drop, add_gen, cont, effort; /* effort: 1..100 (V4.1); V4: 100 = max, else none */
    const dialect *d;
} opts;

static int render_msg(dsv4_buf *b, const conv *c, int idx, const opts *o, dsv4_err *err)
{
    const msg *m = &c->m[idx];
    const dialect *d = o->d;
    const char *role = m->role;
    int lu = last_user(c, d->v41), is_last = idx == c->n - 1;
    int wo_eos = is_last && o->cont;
    char effort[160] = "";
    if (idx == 0 && o->thinking && d->v41)
        snprintf(effort, sizeof effort,
                 "Reasoning Effort: %d (range 1-100, the higher the value, the more thorough the reasoning)\n\n", o->effort);
    /* V4.1 opens with the system marker; V4 has none and writes system text as is */
    if (d->v41 && idx == 0 && (effort[0] || !strcmp(role, "system")))
        dsv4_buf_puts(b, SYS);
    dsv4_buf_puts(b, effort);
    if (!d->v41 && idx == 0 && o->thinking && o->effort == 100)
        dsv4_buf_puts(b, effort_max_v4);

    if (!strcmp(role, "system")) {
        if (idx > 0 && d->v41)
            dsv4_buf_puts(b, SYS);
        dsv4_buf_puts(b, m->content ? m->content : "");
        render_extras(b, d, m);
    } else if (!strcmp(role, "developer")) {
        if (!m->content || !m->content[0])
            return dsv4_fail(err, DSV4_E_ARG, "message %d: a developer message needs content", idx);
        dsv4_buf_puts(b, USER);
        dsv4_buf_puts(b, m->content);
        render_extras(b, d, m);
    } else if (!strcmp(role, "user")) {
        dsv4_buf_puts(b, USER);
        for (int k = 0; k < m->nblocks; k++) {
            if (k)
                dsv4_buf_puts(b, "\n\n");
            if (m->blocks[k].tool)
                dsv4_buf_puts(b, "<tool_result>");
            dsv4_buf_puts(b, m->blocks[k].text);
            if (m->blocks[k].tool)
                dsv4_buf_puts(b, "</tool_result>");
        }
    } else if (!strcmp(role, "latest_reminder")) {
        dsv4_buf_puts(b, REMINDER);
        dsv4_buf_puts(b, m->content ? m->content : "");
    } else if (!strcmp(role, "assistant")) {
        dsv4_buf calls = {0};
        dsv4_buf_put(&calls, "", 0);
        if (cJSON_GetArraySize(m->tool_calls) > 0 && render_calls(&calls, d, m->tool_calls, err)) {
            dsv4_buf_free(&calls);
            return dsv4_err_prefix(err, "message %d", idx);
        }
        const char *content = m->content ? m->content : "";
        const char *rc = m->reasoning ? m->reasoning : "";
        int prev_task = idx > 0 && c->m[idx - 1].task;
        if (o->thinking && !prev_task && (!o->drop || idx > lu)) {
            dsv4_buf_puts(b, rc);
            /* continuing a reply that so far holds only reasoning keeps the thinking open */
            if (!(wo_eos && rc[0] && !content[0] && calls.n == 0))
                dsv4_buf_puts(b, "</think>");
        }
        dsv4_buf_puts(b, content);
        dsv4_buf_put(b, calls.p, calls.n);
        dsv4_buf_free(&calls);
        if (!wo_eos)
            dsv4_buf_puts(b, EOS);
    } else {
        return dsv4_fail(err, DSV4_E_ARG, "message %d: unknown role \"%s\"", idx, role);
    }

    if (is_last && !o->add_gen)
        return 0;
    if (!is_last && strcmp(c->m[idx + 1].role, "assistant") && strcmp(c->m[idx + 1].role, "latest_reminder"))
        return 0;
    if (m->task) {
        const char *tok = NULL;
        for (size_t t = 0; t < sizeof tasks / sizeof tasks[0]; t++)
            if (!strcmp(tasks[t].name, m->task))
                tok = tasks[t].token;
        if (!tok)
            return dsv4_fail(err, DSV4_E_ARG, "message %d: unknown task \"%s\"", idx, m->task);
        if (!strcmp(m->task, "action")) {
            dsv4_buf_puts(b, ASSISTANT);
            dsv4_buf_puts(b, o->thinking ? "<think>" : "</think>");
        }
        dsv4_buf_puts(b, tok);
    } else if (!strcmp(role, "user") || !strcmp(role, "developer") ||
               (d->v41 && ((!strcmp(role, "system") && idx > 0) || (is_last && (!strcmp(role, "system") || !strcmp(role, "assistant")))))) {
        dsv4_buf_puts(b, ASSISTANT);
        dsv4_buf_puts(b, o->thinking && (!o->drop || idx >= lu) ? "<think>" : "</think>");
    }
    return 0;
}

static int get_bool(const cJSON *req, const char *k, int dflt, int *out, dsv4_err *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(req, k);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return 0;
    }
    if (!cJSON_IsBool(v))
        return dsv4_fail(err, DSV4_E_ARG, "\"%s\" must be true or false", k);
    *out = cJSON_IsTrue(v);
    return 0;
}

int dsv4_chat_render(const cJSON *req, char **out, size_t *out_len, dsv4_err *err)
{
    opts o = {0};
    o.d = &v41;
    const cJSON *fam = cJSON_GetObjectItemCaseSensitive(req, "family");
    if (cJSON_IsString(fam) && !strcmp(fam->valuestring, "deepseek_v4"))
        o.d = &v4;
    else if (fam && !cJSON_IsNull(fam) && !(cJSON_IsString(fam) && !strcmp(fam->valuestring, "deepseek_v41")))
        return dsv4_fail(err, DSV4_E_ARG, "request: family must be \"deepseek_v41\" or \"deepseek_v4\"");
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(req, "messages");
    if (!cJSON_IsArray(msgs))
        return dsv4_fail(err, DSV4_E_ARG, "request: \"messages\" must be a list");
    const cJSON *tm = cJSON_GetObjectItemCaseSensitive(req, "thinking_mode");
    if (!tm || cJSON_IsNull(tm) || (cJSON_IsString(tm) && !strcmp(tm->valuestring, "thinking")))
        o.thinking = 1;
    else if (!(cJSON_IsString(tm) && !strcmp(tm->valuestring, "chat")))
        return dsv4_fail(err, DSV4_E_ARG, "request: thinking_mode must be \"chat\" or \"thinking\"");
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(req, "reasoning_effort");
    o.effort = 50;
    if (!o.d->v41) {
        /* V4 knows only "high" (nothing written) and "max" */
        if (cJSON_IsString(re) && !strcmp(re->valuestring, "max"))
            o.effort = 100;
        else if (re && !cJSON_IsNull(re) && !(cJSON_IsString(re) && !strcmp(re->valuestring, "high")))
            return dsv4_fail(err, DSV4_E_ARG, "request: a V4 reasoning_effort is null, \"high\" or \"max\"");
    } else if (cJSON_IsString(re)) {
        const char *s = re->valuestring;
        o.effort = !strcmp(s, "low") ? 25 : !strcmp(s, "high") ? 50 : !strcmp(s, "xhigh") ? 75 : !strcmp(s, "max") ? 100 : 0;
        if (!o.effort)
            return dsv4_fail(err, DSV4_E_ARG, "request: reasoning_effort \"%s\" is not low, high, xhigh or max", s);
    } else if (cJSON_IsNumber(re)) {
        double d = re->valuedouble;
        if (d != floor(d) || d < 1 || d > 100)
            return dsv4_fail(err, DSV4_E_ARG, "request: a numeric reasoning_effort must be an integer in 1..100");
        o.effort = (int)d;
    } else if (re && !cJSON_IsNull(re))
        return dsv4_fail(err, DSV4_E_ARG, "request: reasoning_effort must be null, a level name or 1..100");
    if (get_bool(req, "drop_thinking", 1, &o.drop, err) || get_bool(req, "add_generation_prompt", 1, &o.add_gen, err) ||
        get_bool(req, "continue_final_message", 0, &o.cont, err))
        return err->code;

    conv c = {0};
    int rc = build(msgs, cJSON_GetObjectItemCaseSensitive(req, "tools"), &c, err);
    if (rc) {
        conv_free(&c);
        return rc;
    }
    if (o.cont) {
        if (!c.n || strcmp(c.m[c.n - 1].role, "assistant")) {
            conv_free(&c);
            return dsv4_fail(err, DSV4_E_ARG, "continue_final_message needs a final assistant message");
        }
        o.add_gen = 0;
    }
    sort_results(&c);
    /* tool definitions anywhere keep every turn's reasoning */
    for (int i = 0; i < c.n; i++)
        if (cJSON_GetArraySize(c.m[i].tools) > 0)
            o.drop = 0;
    if (o.thinking && o.drop)
        drop_history(&c, o.d->v41);

    dsv4_buf b = {0};
    dsv4_buf_puts(&b, BOS);
    for (int i = 0; i < c.n && !rc; i++)
        rc = render_msg(&b, &c, i, &o, err);
    conv_free(&c);
    if (!rc && b.oom)
        rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    if (rc) {
        dsv4_buf_free(&b);
        return rc;
    }
    *out = b.p;
    *out_len = b.n;
    return 0;
}
