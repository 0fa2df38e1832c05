/* DSML parser: round trip with the chat encoder, incremental feeding, the open call as it is
 * read, a reply cut short, and a fuzz run (random
 * bytes and mutated valid blocks) that must never crash, leak markup into content, or depend
 * on how the text is cut into pieces. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "text/chat.h"
#include "text/dsml.h"

#define D "｜DSML｜"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

typedef struct result {
    dsv4_dsml_out o;
    char *calls;
} result;

/* Parses text fed in pieces of `step` bytes (0: random sizes). */
static int parse_family(const char *s, size_t n, int thinking, int v4, size_t step, result *r)
{
    dsv4_err err = {0};
    dsv4_dsml *p = dsv4_dsml_new_family(thinking, v4, &err);
    dsv4_dsml_out_init(&r->o);
    int rc = p ? 0 : -1;
    for (size_t i = 0; !rc && i < n;) {
        size_t k = step ? step : 1 + rnd() % 17;
        if (k > n - i)
            k = n - i;
        rc = dsv4_dsml_feed(p, s + i, k, &r->o, &err);
        i += k;
    }
    if (!rc)
        rc = dsv4_dsml_finish(p, &r->o, &err);
    dsv4_dsml_free(p);
    r->calls = cJSON_PrintUnformatted(r->o.calls);
    return rc;
}

static int parse(const char *s, size_t n, int thinking, size_t step, result *r)
{
    return parse_family(s, n, thinking, 0, step, r);
}

static void result_free(result *r)
{
    dsv4_dsml_out_free(&r->o);
    free(r->calls);
}

static int same(const result *a, const result *b)
{
    return a->o.content.n == b->o.content.n && !memcmp(a->o.content.p, b->o.content.p, a->o.content.n) &&
           a->o.reasoning.n == b->o.reasoning.n && !memcmp(a->o.reasoning.p, b->o.reasoning.p, a->o.reasoning.n) &&
           a->o.has_reasoning == b->o.has_reasoning && a->o.malformed == b->o.malformed && !strcmp(a->calls, b->calls);
}

static const char *pick(const char *const *v, size_t n) { return v[rnd() % n]; }

static cJSON *random_value(int depth)
{
    static const char *const strs[] = {"Beijing", "", "  spaced  ", "line1\nline2", "ünïcödé 日本 😀", "a \"quote\"",
                                       "<tag>", "{\"not\": \"parsed\"}", "42", "true", "</think>"};
    switch (rnd() % (depth > 1 ? 5 : 7)) {
    case 0: return cJSON_CreateString(pick(strs, sizeof strs / sizeof strs[0]));
    case 1: return cJSON_CreateNumber((double)(int)(rnd() % 2000) - 1000);
    case 2: return cJSON_CreateNumber((double)(rnd() % 100000) / 64.0);
    case 3: return cJSON_CreateBool(rnd() & 1);
    case 4: return cJSON_CreateNull();
    case 5: {
        cJSON *a = cJSON_CreateArray();
        for (int i = (int)(rnd() % 4); i > 0; i--)
            cJSON_AddItemToArray(a, random_value(depth + 1));
        return a;
    }
    default: {
        cJSON *o = cJSON_CreateObject();
        for (int i = (int)(rnd() % 4); i > 0; i--) {
            char k[16];
            snprintf(k, sizeof k, "k%d", i);
            cJSON_AddItemToObject(o, k, random_value(depth + 1));
        }
        return o;
    }
    }
}

/* An assistant turn with random calls, rendered by the encoder (V4.1, or V4 on odd pairs); the
 * parser must give the calls, content and reasoning back. */
static void round_trip(int iter)
{
    int thinking = iter & 1, v4 = (iter >> 1) & 1;
    cJSON *calls = cJSON_CreateArray();
    int ncalls = 1 + (int)(rnd() % 3);
    for (int c = 0; c < ncalls; c++) {
        cJSON *call = cJSON_CreateObject(), *args = cJSON_CreateObject();
        char name[32];
        snprintf(name, sizeof name, "tool_%u", rnd() % 100);
        for (int a = (int)(rnd() % 4); a > 0; a--) {
            char k[16];
            snprintf(k, sizeof k, "p%d", a);
            cJSON_AddItemToObject(args, k, random_value(0));
        }
        cJSON *fn = cJSON_CreateObject();
        cJSON_AddStringToObject(fn, "name", name);
        char *as = cJSON_PrintUnformatted(args);
        cJSON_AddStringToObject(fn, "arguments", as); /* OpenAI shape: arguments as JSON text */
        free(as);
        cJSON_AddStringToObject(call, "type", "function");
        cJSON_AddItemToObject(call, "function", fn);
        cJSON_AddItemToArray(calls, call);
        cJSON_AddStringToObject(args, "name", name); /* kept aside as the expected call */
        cJSON_AddItemToObject(call, "expect", args);
    }
    static const char *const contents[] = {"", "Let me look that up.", "Two calls:\n- first\n- second", "日本語で"};
    const char *content = pick(contents, 4);
    cJSON *req = cJSON_CreateObject();
    cJSON_AddStringToObject(req, "thinking_mode", thinking ? "thinking" : "chat");
    cJSON_AddStringToObject(req, "family", v4 ? "deepseek_v4" : "deepseek_v41");
    cJSON_AddFalseToObject(req, "add_generation_prompt");
    cJSON *msgs = cJSON_AddArrayToObject(req, "messages");
    cJSON *u = cJSON_CreateObject();
    cJSON_AddStringToObject(u, "role", "user");
    cJSON_AddStringToObject(u, "content", "question");
    cJSON_AddItemToArray(msgs, u);
    cJSON *a = cJSON_CreateObject();
    cJSON_AddStringToObject(a, "role", "assistant");
    cJSON_AddStringToObject(a, "content", content);
    cJSON_AddStringToObject(a, "reasoning_content", "I should call tools.");
    cJSON_AddItemReferenceToObject(a, "tool_calls", calls);
    cJSON_AddItemToArray(msgs, a);
    char *prompt = NULL;
    size_t plen;
    dsv4_err err = {0};
    int rc = dsv4_chat_render(req, &prompt, &plen, &err);
    CHECK(rc == 0, "round trip %d: render failed: %s", iter, err.msg);
    if (rc == 0) {
        const char *hdr = thinking ? "<｜Assistant｜><think>" : "<｜Assistant｜></think>";
        const char *gen = strstr(prompt, hdr) + strlen(hdr);
        result r;
        CHECK(strstr(gen, v4 ? "<" D "tool_calls>" : "<" D " calls>") != NULL, "round trip %d: the family's tags", iter);
        parse_family(gen, strlen(gen), thinking, v4, 0, &r);
        CHECK(!strcmp(r.o.content.p, content), "round trip %d: content \"%s\" != \"%s\"", iter, r.o.content.p, content);
        if (thinking)
            CHECK(r.o.has_reasoning && !strcmp(r.o.reasoning.p, "I should call tools."), "round trip %d: reasoning \"%s\"", iter,
                  r.o.reasoning.p);
        CHECK(cJSON_GetArraySize(r.o.calls) == ncalls && r.o.malformed == 0, "round trip %d: %d calls, %d malformed (want %d)", iter,
              cJSON_GetArraySize(r.o.calls), r.o.malformed, ncalls);
        for (int c = 0; c < ncalls && c < cJSON_GetArraySize(r.o.calls); c++) {
            cJSON *got = cJSON_GetArrayItem(r.o.calls, c), *want = cJSON_GetObjectItem(cJSON_GetArrayItem(calls, c), "expect");
            cJSON *wname = cJSON_DetachItemFromObject(want, "name");
            int ok = !strcmp(cJSON_GetObjectItem(got, "name")->valuestring, wname->valuestring) &&
                     cJSON_Compare(cJSON_GetObjectItem(got, "arguments"), want, 1);
            char *g = cJSON_PrintUnformatted(got), *w = cJSON_PrintUnformatted(want);
            CHECK(ok, "round trip %d call %d: got %s want %s", iter, c, g, w);
            free(g);
            free(w);
            cJSON_Delete(wname);
        }
        result_free(&r);
    }
    free(prompt);
    cJSON_Delete(req);
    cJSON_Delete(calls);
}

static const char *const pieces[] = {
    "<" D " calls>", "</" D " calls>", "<" D " invoke name=\"f\">", "</" D " invoke>", "<" D " parameter name=\"x\" string=\"true\">",
    "<" D " parameter name=\"y\" string=\"false\">", "</" D " parameter>", "<think>", "</think>", "<｜end▁of▁sentence｜>",
    "\n", "\n\n", " ", "hello", "[1, 2]", "{\"a\": 1}", "<", "</", "<｜", "<" D, "\"", "=", ">", "日本", "\xff", "\xe6\x97"};

/* Valid blocks, then cut, spliced, duplicated or overwritten at random. */
static size_t mutated(char *buf, size_t cap)
{
    size_t n = 0;
    int k = 2 + (int)(rnd() % 30);
    for (int i = 0; i < k; i++) {
        const char *p = pieces[rnd() % (sizeof pieces / sizeof pieces[0])];
        size_t l = strlen(p);
        if (n + l >= cap)
            break;
        memcpy(buf + n, p, l);
        n += l;
    }
    for (int m = (int)(rnd() % 4); m > 0 && n > 1; m--) {
        size_t at = rnd() % n;
        switch (rnd() % 3) {
        case 0: n = at; break;                                 /* cut */
        case 1: buf[at] = (char)rnd(); break;                  /* overwrite a byte */
        default: memmove(buf + at, buf + at + 1, n - at - 1); n--; /* delete a byte */
        }
    }
    return n;
}

static void fuzz(const char *s, size_t n, const char *what, int i)
{
    int thinking = (int)(rnd() & 1);
    result whole, bytes, random;
    int r1 = parse(s, n, thinking, n ? n : 1, &whole), r2 = parse(s, n, thinking, 1, &bytes), r3 = parse(s, n, thinking, 0, &random);
    CHECK(r1 == 0 && r2 == 0 && r3 == 0, "%s %d: parse failed", what, i);
    CHECK(same(&whole, &bytes) && same(&whole, &random), "%s %d: the result depends on the piece sizes", what, i);
    CHECK(!memmem(whole.o.content.p, whole.o.content.n, "<" D, strlen("<" D)), "%s %d: markup in content", what, i);
    result_free(&whole);
    result_free(&bytes);
    result_free(&random);
}

int main(void)
{
    for (int i = 0; i < 300; i++)
        round_trip(i);

    /* a truncated block is cut at its first marker; text before it survives */
    {
        const char *t = "Answer.\n\n<" D " calls>\n<" D " invoke name=\"f\">\n<" D " parameter name=\"x\" string=\"true\">par";
        result r;
        parse(t, strlen(t), 0, 3, &r);
        CHECK(!strcmp(r.o.content.p, "Answer.") && cJSON_GetArraySize(r.o.calls) == 0 && r.o.malformed == 1,
              "truncated block: content \"%s\"", r.o.content.p);
        result_free(&r);
    }
    /* malformed invoke dropped, the good one kept; an untyped value that is not JSON stays text */
    {
        const char *t = "<" D " calls>\n<" D " invoke nom=\"f\">\n</" D " invoke>\n<" D " invoke name=\"g\">\n<" D
                        " parameter name=\"v\" string=\"false\">not json</" D " parameter>\n</" D " invoke>\n</" D " calls>";
        result r;
        parse(t, strlen(t), 0, 0, &r);
        CHECK(r.o.malformed == 1 && r.calls && !strcmp(r.calls, "[{\"name\":\"g\",\"arguments\":{\"v\":\"not json\"}}]"),
              "malformed: %s (%d)", r.calls, r.o.malformed);
        result_free(&r);
        /* JSON followed by more text is not JSON */
        const char *u = "<" D " calls>\n<" D " invoke name=\"g\">\n<" D " parameter name=\"v\" string=\"false\">1 2</" D
                        " parameter>\n</" D " invoke>\n</" D " calls>";
        parse(u, strlen(u), 0, 0, &r);
        CHECK(r.calls && !strcmp(r.calls, "[{\"name\":\"g\",\"arguments\":{\"v\":\"1 2\"}}]"), "trailing text: %s", r.calls);
        result_free(&r);
    }

    /* the invoke being read, byte by byte: its name once the opening tag is whole, then its
     * parameters as each closes, every print (but the brace) a prefix of the whole call's; a
     * repeated parameter keeps its first value */
    {
        const char *t = "Sure.\n\n<" D " calls>\n<" D " invoke name=\"f\">\n<" D " parameter name=\"x\" string=\"true\">par</" D
                        " parameter>\n<" D " parameter name=\"n\" string=\"false\">12</" D " parameter>\n<" D
                        " parameter name=\"x\" string=\"true\">again</" D " parameter>\n</" D " invoke>\n</" D " calls>";
        const char *whole = "{\"x\":\"par\",\"n\":12}";
        dsv4_err err = {0};
        dsv4_dsml *p = dsv4_dsml_new(0, &err);
        dsv4_dsml_out o;
        dsv4_dsml_out_init(&o);
        const char *name_at = strstr(t, "name=\"f\">") + strlen("name=\"f\">");
        int ok = 1, named = 0, grew = 0;
        size_t last = 0;
        for (size_t i = 0; t[i]; i++) {
            dsv4_dsml_feed(p, t + i, 1, &o, &err);
            const cJSON *c = dsv4_dsml_open_call(p);
            if (cJSON_GetArraySize(o.calls) > 0) {
                ok &= c == NULL;
                continue;
            }
            const cJSON *nm = c ? cJSON_GetObjectItemCaseSensitive(c, "name") : NULL;
            ok &= (t + i + 1 >= name_at) == (c != NULL);
            if (!c)
                continue;
            named |= cJSON_IsString(nm) && !strcmp(nm->valuestring, "f");
            char *a = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(c, "arguments"));
            size_t k = a ? strlen(a) - 1 : 0;
            ok &= a && !strncmp(a, whole, k) && k >= last;
            grew += k > last;
            last = k;
            free(a);
        }
        dsv4_dsml_finish(p, &o, &err);
        char *calls = cJSON_PrintUnformatted(o.calls);
        CHECK(ok && named && grew == 3 && calls && !strcmp(calls, "[{\"name\":\"f\",\"arguments\":{\"x\":\"par\",\"n\":12}}]"),
              "the open call as it is read (ok %d named %d grew %d): %s", ok, named, grew, calls);
        free(calls);
        dsv4_dsml_out_free(&o);
        dsv4_dsml_free(p);
    }
    /* a reply cut short: finish drops the open invoke, finish_cut keeps it as far as it parsed */
    {
        const char *t = "<" D " calls>\n<" D " invoke name=\"f\">\n<" D " parameter name=\"x\" string=\"true\">par</" D
                        " parameter>\n<" D " parameter name=\"n\" string=\"false\">1";
        for (int cut = 0; cut < 2; cut++) {
            dsv4_err err = {0};
            dsv4_dsml *p = dsv4_dsml_new(0, &err);
            dsv4_dsml_out o;
            dsv4_dsml_out_init(&o);
            dsv4_dsml_feed(p, t, strlen(t), &o, &err);
            if (cut)
                dsv4_dsml_finish_cut(p, &o, &err);
            else
                dsv4_dsml_finish(p, &o, &err);
            char *calls = cJSON_PrintUnformatted(o.calls);
            CHECK(cut ? !strcmp(calls, "[{\"name\":\"f\",\"arguments\":{\"x\":\"par\"}}]") && o.truncated && !o.malformed
                      : !strcmp(calls, "[]") && !o.truncated && o.malformed == 1,
                  "cut %d: %s", cut, calls);
            free(calls);
            dsv4_dsml_out_free(&o);
            dsv4_dsml_free(p);
        }
        /* cut inside the opening tag: nothing to keep */
        const char *u = "<" D " calls>\n<" D " invoke name=\"f";
        dsv4_err err = {0};
        dsv4_dsml *p = dsv4_dsml_new(0, &err);
        dsv4_dsml_out o;
        dsv4_dsml_out_init(&o);
        dsv4_dsml_feed(p, u, strlen(u), &o, &err);
        dsv4_dsml_finish_cut(p, &o, &err);
        CHECK(cJSON_GetArraySize(o.calls) == 0 && o.malformed == 1, "cut in the opening tag: no call");
        dsv4_dsml_out_free(&o);
        dsv4_dsml_free(p);
    }

    char buf[4096];
    for (int i = 0; i < 3000; i++) {
        size_t n = rnd() % 300;
        for (size_t k = 0; k < n; k++)
            buf[k] = (char)rnd();
        fuzz(buf, n, "random bytes", i);
    }
    for (int i = 0; i < 5000; i++) {
        size_t n = mutated(buf, sizeof buf);
        fuzz(buf, n, "mutated block", i);
    }
    return check_summary("dsml");
}
