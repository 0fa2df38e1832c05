#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "text/dsml.h"

#define M_DSML "<｜DSML｜"
#define M_CALLS (p->tags->calls)
#define M_CALLS_END (p->tags->calls_end)
#define M_INVOKE (p->tags->invoke)
#define M_INVOKE_END (p->tags->invoke_end)
#define M_PARAM (p->tags->param)
#define M_PARAM_END (p->tags->param_end)
#define M_THINK "<think>"
#define M_THINK_END "</think>"
#define M_EOS "<｜end▁of▁sentence｜>"

enum { S_START, S_REASONING, S_CONTENT, S_BLOCK, S_DONE };

typedef struct tags {
    const char *calls, *calls_end, *invoke, *invoke_end, *param, *param_end;
} tags;

static const tags tags_v41 = {"<｜DSML｜ calls>", "</｜DSML｜ calls>", "<｜DSML｜ invoke", "</｜DSML｜ invoke>",
                              "<｜DSML｜ parameter", "</｜DSML｜ parameter>"};
static const tags tags_v4 = {"<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>", "<｜DSML｜invoke", "</｜DSML｜invoke>",
                             "<｜DSML｜parameter", "</｜DSML｜parameter>"};

struct dsv4_dsml {
    const tags *tags;
    int state;
    dsv4_buf pend; /* text received but not yet placed */
    size_t off;    /* start of the unprocessed part of pend */
    int think_checked; /* the reasoning's opening <think> (if any) was removed */
    int junk;          /* inside a stretch of a block that is not markup (counted once) */
    int cut;           /* finishing a reply cut short: an open invoke is kept as far as it parsed */
    cJSON *open;       /* dsv4_dsml_open_call's answer */
};

void dsv4_dsml_out_init(dsv4_dsml_out *o)
{
    memset(o, 0, sizeof *o);
    dsv4_buf_put(&o->content, "", 0);
    dsv4_buf_put(&o->reasoning, "", 0);
    o->calls = cJSON_CreateArray();
}

void dsv4_dsml_out_free(dsv4_dsml_out *o)
{
    dsv4_buf_free(&o->content);
    dsv4_buf_free(&o->reasoning);
    cJSON_Delete(o->calls);
    memset(o, 0, sizeof *o);
}

dsv4_dsml *dsv4_dsml_new(int in_reasoning, dsv4_err *err) { return dsv4_dsml_new_family(in_reasoning, 0, err); }

dsv4_dsml *dsv4_dsml_new_family(int in_reasoning, int v4, dsv4_err *err)
{
    dsv4_dsml *p = calloc(1, sizeof *p);
    if (!p) {
        dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
        return NULL;
    }
    p->state = in_reasoning ? S_REASONING : S_START;
    p->tags = v4 ? &tags_v4 : &tags_v41;
    return p;
}

void dsv4_dsml_free(dsv4_dsml *p)
{
    if (!p)
        return;
    dsv4_buf_free(&p->pend);
    cJSON_Delete(p->open);
    free(p);
}

static const char *find(const char *s, size_t n, const char *m)
{
    size_t k = strlen(m);
    if (k > n)
        return NULL;
    return memmem(s, n, m, k);
}

/* Length of the longest suffix of s[0..n) that is a proper prefix of marker m. */
static size_t partial(const char *s, size_t n, const char *m)
{
    size_t k = strlen(m);
    for (size_t l = k - 1 < n ? k - 1 : n; l > 0; l--)
        if (!memcmp(s + n - l, m, l))
            return l;
    return 0;
}

static int is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/* Parses `name="..."` right after a tag name; returns the end of the attribute or NULL. */
static const char *attr(const char *s, const char *end, const char *name, const char **v, size_t *vn)
{
    while (s < end && *s == ' ')
        s++;
    size_t k = strlen(name);
    if ((size_t)(end - s) < k + 2 || memcmp(s, name, k) || s[k] != '=' || s[k + 1] != '"')
        return NULL;
    s += k + 2;
    const char *q = memchr(s, '"', (size_t)(end - s));
    if (!q)
        return NULL;
    *v = s;
    *vn = (size_t)(q - s);
    return q + 1;
}

static char *ndup(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

/* One invoke, s[0..n) from "<｜DSML｜ invoke" to the end of its closing tag. Returns the call
 * object, or NULL when it is malformed. partial: s[0..n) is an invoke not yet closed; the call
 * holds its name and the parameters complete so far (NULL until the opening tag is whole). */
static cJSON *parse_invoke(const dsv4_dsml *p0, const char *s, size_t n, int partial)
{
    const tags *tg = p0->tags;
    const char *end = s + n - (partial ? 0 : strlen(tg->invoke_end)), *p = s + strlen(tg->invoke);
    const char *name;
    size_t nn;
    p = attr(p, end, "name", &name, &nn);
    if (!p || p >= end || *p != '>' || nn == 0)
        return NULL;
    p++;
    cJSON *call = cJSON_CreateObject(), *args = cJSON_CreateObject();
    char *nm = ndup(name, nn);
    if (!call || !args || !nm)
        goto bad;
    cJSON_AddStringToObject(call, "name", nm);
    free(nm);
    nm = NULL;
    for (;;) {
        while (p < end && is_ws(*p))
            p++;
        if (p == end)
            break;
        size_t pl = strlen(tg->param);
        if (partial && ((size_t)(end - p) < pl || !find(p, (size_t)(end - p), tg->param_end)))
            break; /* the parameter being written */
        if ((size_t)(end - p) < pl || memcmp(p, tg->param, pl))
            goto bad;
        const char *k, *sv = NULL;
        size_t kn, svn = 0;
        const char *q = attr(p + pl, end, "name", &k, &kn);
        if (!q || kn == 0)
            goto bad;
        const char *q2 = attr(q, end, "string", &sv, &svn);
        if (q2)
            q = q2;
        if (q >= end || *q != '>')
            goto bad;
        q++;
        const char *ve = find(q, (size_t)(end - q), tg->param_end);
        if (!ve)
            goto bad;
        char *key = ndup(k, kn), *val = ndup(q, (size_t)(ve - q));
        if (!key || !val) {
            free(key);
            free(val);
            goto bad;
        }
        cJSON *item = NULL;
        if (!(sv && svn == 4 && !memcmp(sv, "true", 4)))
            item = cJSON_ParseWithOpts(val, NULL, 1); /* typed (string="false") or untyped: JSON when it parses */
        if (!item)
            item = cJSON_CreateString(val);
        /* a repeated parameter is ignored: the first one stands, so the arguments of a call
         * being written only ever grow (streamed fragments are a prefix of the whole) */
        if (cJSON_GetObjectItemCaseSensitive(args, key))
            cJSON_Delete(item);
        else
            cJSON_AddItemToObject(args, key, item);
        free(key);
        free(val);
        p = ve + strlen(tg->param_end);
    }
    cJSON_AddItemToObject(call, "arguments", args);
    return call;
bad:
    free(nm);
    cJSON_Delete(call);
    cJSON_Delete(args);
    return NULL;
}

/* Processes what it can of pend; `final` at the end of the stream. */
static void step(dsv4_dsml *p, dsv4_dsml_out *o, int final)
{
    for (;;) {
        const char *s = p->pend.p + p->off;
        size_t n = p->pend.n - p->off;
        if (p->state == S_DONE) {
            p->off = p->pend.n;
            return;
        }
        if (p->state == S_START) {
            /* a reply that opens with <think> reasons first */
            size_t k = strlen(M_THINK);
            if (n >= k && !memcmp(s, M_THINK, k)) {
                p->off += k;
                p->state = S_REASONING;
                p->think_checked = 1;
                continue;
            }
            if (n < k && !memcmp(s, M_THINK, n) && !final)
                return;
            p->state = S_CONTENT;
            continue;
        }
        if (p->state == S_REASONING) {
            o->has_reasoning = 1;
            if (!p->think_checked) {
                size_t k = strlen(M_THINK);
                if (n < k && !memcmp(s, M_THINK, n) && !final)
                    return;
                p->think_checked = 1;
                if (n >= k && !memcmp(s, M_THINK, k)) {
                    p->off += k;
                    continue;
                }
            }
            const char *e = find(s, n, M_THINK_END), *eos = find(s, n, M_EOS);
            if (eos && (!e || eos < e)) {
                dsv4_buf_put(&o->reasoning, s, (size_t)(eos - s));
                p->state = S_DONE;
                continue;
            }
            if (e) {
                dsv4_buf_put(&o->reasoning, s, (size_t)(e - s));
                p->off += (size_t)(e - s) + strlen(M_THINK_END);
                p->state = S_CONTENT;
                continue;
            }
            size_t hold = final ? 0 : partial(s, n, M_THINK_END);
            size_t h2 = final ? 0 : partial(s, n, M_EOS);
            if (h2 > hold)
                hold = h2;
            dsv4_buf_put(&o->reasoning, s, n - hold);
            p->off += n - hold;
            return;
        }
        if (p->state == S_CONTENT) {
            const char *d = find(s, n, M_DSML), *eos = find(s, n, M_EOS);
            if (eos && (!d || eos < d)) {
                dsv4_buf_put(&o->content, s, (size_t)(eos - s));
                p->state = S_DONE;
                continue;
            }
            if (d) {
                /* the blank lines the encoder puts before a block belong to the markup */
                const char *c = d;
                while (c > s && is_ws(c[-1]))
                    c--;
                dsv4_buf_put(&o->content, s, (size_t)(c - s));
                p->off += (size_t)(d - s);
                p->state = S_BLOCK;
                continue;
            }
            size_t hold = partial(s, n, M_DSML), h2 = partial(s, n, M_EOS);
            if (h2 > hold)
                hold = h2;
            if (final) {
                /* a marker cut short is markup: dropped; a lone "<" is text */
                hold = hold >= 2 ? hold : 0;
                dsv4_buf_put(&o->content, s, n - hold);
                p->off = p->pend.n;
                return;
            }
            size_t keep = n - hold;
            while (keep > 0 && is_ws(s[keep - 1]))
                keep--;
            dsv4_buf_put(&o->content, s, keep);
            p->off += keep;
            return;
        }
        /* S_BLOCK: s starts at a DSML marker or inside a block */
        while (n && is_ws(*s)) {
            s++;
            n--;
            p->off++;
        }
        if (!n) {
            if (final)
                p->state = S_DONE;
            return;
        }
        size_t kc = strlen(M_CALLS), ke = strlen(M_CALLS_END), ki = strlen(M_INVOKE);
        if (n >= kc && !memcmp(s, M_CALLS, kc)) {
            p->off += kc;
            p->junk = 0;
            continue;
        }
        if (n >= ke && !memcmp(s, M_CALLS_END, ke)) {
            p->off += ke;
            p->state = S_CONTENT;
            p->junk = 0;
            continue;
        }
        if (n >= ki && !memcmp(s, M_INVOKE, ki)) {
            p->junk = 0;
            const char *e = find(s, n, M_INVOKE_END);
            if (!e) {
                if (final) {
                    cJSON *call = p->cut ? parse_invoke(p, s, n, 1) : NULL;
                    if (call) {
                        cJSON_AddItemToArray(o->calls, call);
                        o->truncated = 1;
                    } else {
                        o->malformed++; /* truncated */
                    }
                    p->state = S_DONE;
                    continue;
                }
                return;
            }
            size_t len = (size_t)(e - s) + strlen(M_INVOKE_END);
            cJSON *call = parse_invoke(p, s, len, 0);
            if (call)
                cJSON_AddItemToArray(o->calls, call);
            else
                o->malformed++;
            p->off += len;
            continue;
        }
        /* still possibly the start of a known tag: wait for more */
        if (!final && ((n < kc && !memcmp(s, M_CALLS, n)) || (n < ke && !memcmp(s, M_CALLS_END, n)) ||
                       (n < ki && !memcmp(s, M_INVOKE, n))))
            return;
        /* anything else inside a block is malformed: skip to the next marker */
        if (!p->junk)
            o->malformed++;
        p->junk = 1;
        const char *next = n > 1 ? find(s + 1, n - 1, M_DSML) : NULL;
        const char *nx2 = n > 1 ? find(s + 1, n - 1, "</｜DSML｜") : NULL;
        if (nx2 && (!next || nx2 < next))
            next = nx2;
        if (!next) {
            if (final) {
                p->state = S_DONE;
                continue;
            }
            /* keep a possible marker start; drop the rest */
            size_t hold = partial(s, n, "</｜DSML｜");
            size_t h2 = partial(s, n, M_DSML);
            if (h2 > hold)
                hold = h2;
            p->off += n - hold;
            return;
        }
        p->off += (size_t)(next - s);
    }
}

int dsv4_dsml_feed(dsv4_dsml *p, const char *s, size_t n, dsv4_dsml_out *o, dsv4_err *err)
{
    if (p->off > 4096 && p->off * 2 > p->pend.n) {
        /* drop the consumed prefix now and then so pend stays small */
        memmove(p->pend.p, p->pend.p + p->off, p->pend.n - p->off);
        p->pend.n -= p->off;
        p->pend.p[p->pend.n] = 0;
        p->off = 0;
    }
    dsv4_buf_put(&p->pend, s, n);
    if (!p->pend.p)
        dsv4_buf_put(&p->pend, "", 0);
    if (p->pend.oom || !o->calls)
        return dsv4_fail(err, DSV4_E_NOMEM, "dsml: out of memory");
    step(p, o, 0);
    if (o->content.oom || o->reasoning.oom)
        return dsv4_fail(err, DSV4_E_NOMEM, "dsml: out of memory");
    return 0;
}

int dsv4_dsml_finish(dsv4_dsml *p, dsv4_dsml_out *o, dsv4_err *err)
{
    if (!p->pend.p)
        dsv4_buf_put(&p->pend, "", 0);
    if (p->pend.oom || !o->calls)
        return dsv4_fail(err, DSV4_E_NOMEM, "dsml: out of memory");
    step(p, o, 1);
    if (o->content.oom || o->reasoning.oom)
        return dsv4_fail(err, DSV4_E_NOMEM, "dsml: out of memory");
    return 0;
}

int dsv4_dsml_finish_cut(dsv4_dsml *p, dsv4_dsml_out *o, dsv4_err *err)
{
    p->cut = 1;
    return dsv4_dsml_finish(p, o, err);
}

const cJSON *dsv4_dsml_open_call(dsv4_dsml *p)
{
    cJSON_Delete(p->open);
    p->open = NULL;
    if (p->state != S_BLOCK)
        return NULL;
    const char *s = p->pend.p + p->off;
    size_t n = p->pend.n - p->off, ki = strlen(M_INVOKE);
    while (n && is_ws(*s)) {
        s++;
        n--;
    }
    if (n < ki || memcmp(s, M_INVOKE, ki) || find(s, n, M_INVOKE_END))
        return NULL;
    p->open = parse_invoke(p, s, n, 1);
    return p->open;
}
