/* Constrained decoding:
 *  - the schema corpus (tests/fixtures/schemas): each compiles, accepts its `match` texts whole
 *    and refuses its `no_match` ones; refused.json's schemas are refused naming the keyword;
 *  - the forced DSML tool call: a rendered call matches, and dsml.c parses what it matches;
 *  - the sampler's mask: greedy ties to the lower allowed id, logprobs of the masked
 *    distribution, draws only of allowed ids, an empty mask an error;
 *  - the trie mask equals brute force (every id's bytes fed to the state), with and without
 *    the cache, along generated replies;
 *  - generation with models/mini (its 4,096-id tokenizer) under every corpus schema, json_object
 *    and a forced tool call, several seeds: every reply parses (cJSON) and validates against its
 *    schema (a validator written here, apart from the automaton); bounded schemas must finish;
 *  - lanes: a constrained request gives the same tokens and logprobs alone and beside others;
 *  - with --deepseek TOKENIZER_DIR (tests/suite_constrain.sh): the same generation with the
 *    random-weight v4-tiny-v and the DeepSeek tokenizer (129k ids). */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "check.h"
#include "core/core.h"
#include "serve/lanes.h"
#include "serve/sampler.h"
#include "text/dsml.h"
#include "text/grammar.h"
#include "text/tokenizer.h"
#include "text/tokmask.h"

#define SCHEMAS "tests/fixtures/schemas"

/* ---- an independent validator for the subset ---------------------------------------- */

static const cJSON *deref(const cJSON *root, const cJSON *s)
{
    const cJSON *r;
    while (s && (r = cJSON_GetObjectItemCaseSensitive(s, "$ref"))) {
        const char *p = r->valuestring;
        if (!strcmp(p, "#"))
            s = root;
        else if (!strncmp(p, "#/$defs/", 8))
            s = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "$defs"), p + 8);
        else
            s = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "definitions"), p + 14);
    }
    return s;
}

static size_t utf8_chars(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static int digits(const char *s, int n)
{
    for (int i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return 0;
    return 1;
}

static int num2(const char *s, int lo, int hi)
{
    if (!digits(s, 2))
        return 0;
    int v = (s[0] - '0') * 10 + s[1] - '0';
    return v >= lo && v <= hi;
}

static int is_date(const char *s) { return strlen(s) >= 10 && digits(s, 4) && s[4] == '-' && num2(s + 5, 1, 12) && s[7] == '-' && num2(s + 8, 1, 31); }

static int is_time(const char *s)
{
    if (!(num2(s, 0, 23) && s[2] == ':' && num2(s + 3, 0, 59) && s[5] == ':' && num2(s + 6, 0, 60)))
        return 0;
    s += 8;
    if (*s == '.') {
        int k = 0;
        for (s++; *s >= '0' && *s <= '9'; s++)
            k++;
        if (k < 1 || k > 6)
            return 0;
    }
    if (!strcmp(s, "Z"))
        return 1;
    return (s[0] == '+' || s[0] == '-') && num2(s + 1, 0, 23) && s[3] == ':' && num2(s + 4, 0, 59) && !s[6];
}

static int is_format(const char *f, const char *s)
{
    if (!strcmp(f, "date"))
        return strlen(s) == 10 && is_date(s);
    if (!strcmp(f, "time"))
        return is_time(s);
    if (!strcmp(f, "date-time"))
        return is_date(s) && s[10] == 'T' && is_time(s + 11);
    if (!strcmp(f, "uuid")) {
        if (strlen(s) != 36)
            return 0;
        for (int i = 0; i < 36; i++)
            if ((i == 8 || i == 13 || i == 18 || i == 23) ? s[i] != '-' : !strchr("0123456789abcdefABCDEF", s[i]) || !s[i])
                return 0;
        return 1;
    }
    if (!strcmp(f, "email")) {
        const char *at = strchr(s, '@');
        return at && at > s && strchr(at + 1, '.') && at[1] != '.' && s[strlen(s) - 1] != '.' && !strstr(at, "..");
    }
    return 0;
}

static int type_ok(const char *t, const cJSON *v)
{
    if (!strcmp(t, "object")) return cJSON_IsObject(v);
    if (!strcmp(t, "array")) return cJSON_IsArray(v);
    if (!strcmp(t, "string")) return cJSON_IsString(v);
    if (!strcmp(t, "number")) return cJSON_IsNumber(v);
    if (!strcmp(t, "integer")) return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble);
    if (!strcmp(t, "boolean")) return cJSON_IsBool(v);
    if (!strcmp(t, "null")) return cJSON_IsNull(v);
    return 0;
}

static int valid(const cJSON *root, const cJSON *s, const cJSON *v)
{
    s = deref(root, s);
    if (!s)
        return 0;
    const cJSON *k;
    if ((k = cJSON_GetObjectItemCaseSensitive(s, "anyOf"))) {
        const cJSON *a;
        cJSON_ArrayForEach(a, k) if (valid(root, a, v)) return 1;
        return 0;
    }
    if ((k = cJSON_GetObjectItemCaseSensitive(s, "const")) && !cJSON_Compare(k, v, 1))
        return 0;
    if ((k = cJSON_GetObjectItemCaseSensitive(s, "enum"))) {
        int any = 0;
        const cJSON *a;
        cJSON_ArrayForEach(a, k) any |= cJSON_Compare(a, v, 1);
        if (!any)
            return 0;
    }
    if ((k = cJSON_GetObjectItemCaseSensitive(s, "type"))) {
        int any = 0;
        if (cJSON_IsString(k))
            any = type_ok(k->valuestring, v);
        else {
            const cJSON *a;
            cJSON_ArrayForEach(a, k) any |= type_ok(a->valuestring, v);
        }
        if (!any)
            return 0;
    }
    if (cJSON_IsObject(v)) {
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties"), *m;
        const cJSON *ap = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
        cJSON_ArrayForEach(m, v)
        {
            const cJSON *ps = props ? cJSON_GetObjectItemCaseSensitive(props, m->string) : NULL;
            if (ps ? !valid(root, ps, m) : cJSON_IsFalse(ap))
                return 0;
        }
        cJSON_ArrayForEach(m, cJSON_GetObjectItemCaseSensitive(s, "required")) if (!cJSON_GetObjectItemCaseSensitive(v, m->valuestring)) return 0;
    }
    if (cJSON_IsArray(v)) {
        int n = cJSON_GetArraySize(v);
        const cJSON *lo = cJSON_GetObjectItemCaseSensitive(s, "minItems"), *hi = cJSON_GetObjectItemCaseSensitive(s, "maxItems");
        if ((lo && n < lo->valueint) || (hi && n > hi->valueint))
            return 0;
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items"), *e;
        if (items)
            cJSON_ArrayForEach(e, v) if (!valid(root, items, e)) return 0;
    }
    if (cJSON_IsString(v)) {
        size_t n = utf8_chars(v->valuestring);
        const cJSON *lo = cJSON_GetObjectItemCaseSensitive(s, "minLength"), *hi = cJSON_GetObjectItemCaseSensitive(s, "maxLength");
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(s, "format");
        if ((lo && n < (size_t)lo->valueint) || (hi && n > (size_t)hi->valueint) || (f && !is_format(f->valuestring, v->valuestring)))
            return 0;
    }
    return 1;
}

/* ---- corpus ---------------------------------------------------------------------------- */

static cJSON *load_json(const char *path)
{
    char *t = dsv4_read_file(path, NULL, NULL);
    cJSON *j = t ? cJSON_Parse(t) : NULL;
    free(t);
    return j;
}

typedef struct fixture {
    char name[64];
    cJSON *doc; /* {"schema", "match", "no_match", "bounded"} */
} fixture;

static int load_corpus(fixture *fx, int max)
{
    DIR *d = opendir(SCHEMAS);
    CHECK(d != NULL, "no %s (run from the checkout)", SCHEMAS);
    if (!d)
        return 0;
    int n = 0;
    char *names[64];
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        size_t l = strlen(e->d_name);
        if (l > 5 && !strcmp(e->d_name + l - 5, ".json") && strcmp(e->d_name, "refused.json"))
            names[n++] = strdup(e->d_name);
    }
    closedir(d);
    for (int i = 1; i < n; i++) /* a fixed order, whatever the directory's */
        for (int j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            char *x = names[j];
            names[j] = names[j - 1];
            names[j - 1] = x;
        }
    for (int i = 0; i < n; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", SCHEMAS, names[i]);
        snprintf(fx[i].name, sizeof fx[i].name, "%s", names[i]);
        fx[i].doc = load_json(path);
        CHECK(fx[i].doc != NULL, "%s does not parse", path);
        free(names[i]);
    }
    return n;
}

static void corpus(fixture *fx, int n)
{
    for (int i = 0; i < n; i++) {
        if (!fx[i].doc)
            continue;
        const cJSON *schema = cJSON_GetObjectItemCaseSensitive(fx[i].doc, "schema");
        dsv4_err err = {0};
        dsv4_grammar *g = dsv4_grammar_json_schema(schema, NULL, &err);
        CHECK(g != NULL, "%s: %s", fx[i].name, err.msg);
        if (!g)
            continue;
        const cJSON *t;
        cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(fx[i].doc, "match"))
        {
            const char *s = t->valuestring;
            CHECK(dsv4_grammar_matches(g, s, strlen(s)), "%s: refuses %s", fx[i].name, s);
            cJSON *v = cJSON_Parse(s);
            CHECK(v && valid(schema, schema, v), "%s: the validator refuses %s", fx[i].name, s);
            cJSON_Delete(v);
            /* every proper prefix is live and (but for whole values) not yet accepted */
            dsv4_gstate *st = malloc(sizeof *st);
            dsv4_gstate_init(g, st);
            int live = 1;
            for (size_t k = 0; s[k] && live; k++)
                live = dsv4_gstate_feed_bytes(g, st, s + k, 1);
            CHECK(live && dsv4_gstate_accepts(g, st), "%s: prefix walk of %s", fx[i].name, s);
            free(st);
        }
        cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(fx[i].doc, "no_match"))
            CHECK(!dsv4_grammar_matches(g, t->valuestring, strlen(t->valuestring)), "%s: accepts %s", fx[i].name, t->valuestring);
        dsv4_grammar_free(g);
    }
    cJSON *ref = load_json(SCHEMAS "/refused.json");
    CHECK(ref != NULL, "refused.json");
    const cJSON *c;
    cJSON_ArrayForEach(c, ref)
    {
        dsv4_err err = {0};
        dsv4_grammar *g = dsv4_grammar_json_schema(cJSON_GetObjectItemCaseSensitive(c, "schema"), NULL, &err);
        const char *want = cJSON_GetObjectItemCaseSensitive(c, "error")->valuestring;
        CHECK(!g && strstr(err.msg, want), "refused: wanted an error with '%s', got '%s'", want, g ? "(compiled)" : err.msg);
        dsv4_grammar_free(g);
    }
    cJSON_Delete(ref);

    /* json_object: objects only, whitespace bounded, nothing after the value */
    dsv4_err err = {0};
    dsv4_grammar *g = dsv4_grammar_json_object(NULL, &err);
    const char *yes[] = {"{}", "{\"a\":[1,{\"b\":null},\"x\"],\"a\":true}", "{ \"k\" : -1.5E+7 }"};
    const char *no[] = {"[]", "\"s\"", "{} ", "{\"a\":}", "{\"a\":1,}", "{                  }", "{'a':1}"};
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++)
        CHECK(dsv4_grammar_matches(g, yes[i], strlen(yes[i])), "json_object refuses %s", yes[i]);
    for (size_t i = 0; i < sizeof no / sizeof *no; i++)
        CHECK(!dsv4_grammar_matches(g, no[i], strlen(no[i])), "json_object accepts %s", no[i]);
    /* deep nesting is cut off: past the bound only scalars, so the automaton cannot recurse forever */
    char deep[256];
    int k = 0;
    for (; k < 100; k++)
        deep[k] = '[';
    deep[k] = 0;
    char obj[300];
    snprintf(obj, sizeof obj, "{\"a\":%s", deep);
    CHECK(!dsv4_grammar_matches(g, obj, strlen(obj)), "json_object nests 100 deep");
    dsv4_gstate *st = malloc(sizeof *st);
    dsv4_gstate_init(g, st);
    CHECK(dsv4_gstate_feed_bytes(g, st, "{\"a\":[[[[", 9) && dsv4_gstate_open(g, st) && !dsv4_gstate_accepts(g, st),
          "json_object: an open prefix");
    dsv4_gstate_init(g, st);
    CHECK(dsv4_gstate_feed_bytes(g, st, "{}", 2) && !dsv4_gstate_open(g, st) && dsv4_gstate_accepts(g, st),
          "json_object: nothing after the object");
    free(st);
    dsv4_grammar_free(g);
}

/* ---- DSML tool calls ------------------------------------------------------------------- */

static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":10},\"unit\":{\"enum\":[\"C\",\"F\"]},"
    "\"days\":{\"type\":\"integer\"},\"hourly\":{\"type\":\"boolean\"},\"note\":{\"type\":\"string\"}},\"required\":[\"city\",\"unit\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"noop\",\"parameters\":{\"type\":\"object\",\"properties\":{}}}}]";

/* Parses a reply with dsml.c: returns the calls (a cJSON array) or NULL. */
static cJSON *parse_calls(const char *text, int v4)
{
    dsv4_err err = {0};
    dsv4_dsml *p = dsv4_dsml_new_family(0, v4, &err);
    dsv4_dsml_out o;
    dsv4_dsml_out_init(&o);
    dsv4_dsml_feed(p, text, strlen(text), &o, &err);
    dsv4_dsml_finish(p, &o, &err);
    cJSON *calls = o.malformed ? NULL : cJSON_Duplicate(o.calls, 1);
    dsv4_dsml_out_free(&o);
    dsv4_dsml_free(p);
    return calls;
}

/* Checks a tool-call reply: parsed by dsml.c, names among tools (or the one named), arguments
 * valid for the tool's parameters. */
static int calls_valid(const char *text, const cJSON *tools, const char *name, int v4)
{
    cJSON *calls = parse_calls(text, v4);
    int ok = calls && cJSON_GetArraySize(calls) > 0 && (!name || cJSON_GetArraySize(calls) == 1);
    const cJSON *c;
    cJSON_ArrayForEach(c, calls)
    {
        const char *cn = cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring;
        const cJSON *t, *params = NULL;
        cJSON_ArrayForEach(t, tools)
        {
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
            if (!strcmp(cJSON_GetObjectItemCaseSensitive(f, "name")->valuestring, cn))
                params = cJSON_GetObjectItemCaseSensitive(f, "parameters");
        }
        ok &= params && (!name || !strcmp(name, cn));
        if (ok)
            ok &= valid(params, params, cJSON_GetObjectItemCaseSensitive(c, "arguments"));
    }
    cJSON_Delete(calls);
    return ok;
}

static void tool_calls(void)
{
    cJSON *tools = cJSON_Parse(TOOLS);
    for (int v4 = 0; v4 < 2; v4++) {
        dsv4_grammar_opts o = {.dsml_v4 = v4};
        dsv4_err err = {0};
        dsv4_grammar *any = dsv4_grammar_tool_call(tools, NULL, &o, &err);
        dsv4_grammar *named = dsv4_grammar_tool_call(tools, "noop", &o, &err);
        CHECK(any && named, "tool grammars: %s", err.msg);
        const char *P = v4 ? "｜DSML｜parameter" : "｜DSML｜ parameter", *I = v4 ? "｜DSML｜invoke" : "｜DSML｜ invoke",
                   *C = v4 ? "｜DSML｜tool_calls" : "｜DSML｜ calls";
        char text[2048];
        snprintf(text, sizeof text,
                 "\n\n<%s>\n<%s name=\"get_weather\">\n<%s name=\"city\" string=\"true\">Paris <3</%s>\n"
                 "<%s name=\"unit\" string=\"true\">C</%s>\n<%s name=\"days\" string=\"false\">3</%s>\n</%s>\n"
                 "<%s name=\"noop\">\n\n</%s>\n</%s>",
                 C, I, P, P, P, P, P, P, I, I, I, C);
        CHECK(any && dsv4_grammar_matches(any, text, strlen(text)), "v4=%d: the rendered calls do not match", v4);
        CHECK(calls_valid(text, tools, NULL, v4), "v4=%d: dsml.c does not parse the calls", v4);
        CHECK(named && !dsv4_grammar_matches(named, text, strlen(text)), "v4=%d: a named choice takes two calls", v4);
        snprintf(text, sizeof text, "\n\n<%s>\n<%s name=\"noop\">\n\n</%s>\n</%s>", C, I, I, C);
        CHECK(named && dsv4_grammar_matches(named, text, strlen(text)), "v4=%d: the named call", v4);
        snprintf(text, sizeof text, "\n\n<%s>\n<%s name=\"get_weather\">\n<%s name=\"city\" string=\"true\">a</｜DSML｜x</%s>\n"
                 "<%s name=\"unit\" string=\"true\">C</%s>\n</%s>\n</%s>", C, I, P, P, P, P, I, C);
        CHECK(any && !dsv4_grammar_matches(any, text, strlen(text)), "v4=%d: a DSML marker inside a raw value", v4);
        snprintf(text, sizeof text, "\n\n<%s>\n<%s name=\"get_weather\">\n<%s name=\"unit\" string=\"true\">C</%s>\n</%s>\n</%s>",
                 C, I, P, P, I, C);
        CHECK(any && !dsv4_grammar_matches(any, text, strlen(text)), "v4=%d: a required parameter missing", v4);
        dsv4_grammar_free(any);
        dsv4_grammar_free(named);
    }
    /* thinking: free reasoning, then the block */
    dsv4_grammar_opts o = {.thinking = 1};
    dsv4_err err = {0};
    dsv4_grammar *g = dsv4_grammar_tool_call(tools, "noop", &o, &err);
    const char *t = "let me think </thin> ok</think>\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"noop\">\n\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";
    CHECK(g && dsv4_grammar_matches(g, t, strlen(t)), "thinking tool call");
    dsv4_grammar_free(g);
    g = dsv4_grammar_tool_call(tools, "nope", NULL, &err);
    CHECK(!g && strstr(err.msg, "nope"), "an unknown tool name: %s", err.msg);
    cJSON_Delete(tools);
}

/* ---- the sampler's mask step ------------------------------------------------------------ */

static void sampler_mask(void)
{
    enum { V = 130 };
    float logits[V];
    for (int v = 0; v < V; v++)
        logits[v] = (float)((v * 37) % 11) * 0.5f;
    logits[3] = 9.0f;  /* the unmasked favourite, masked out below */
    logits[70] = 4.0f; /* tied best among the allowed ids */
    logits[90] = 4.0f;
    logits[5] = 1.0f;
    logits[129] = -2.0f;
    uint64_t allow[(V + 63) / 64] = {0};
    const int ok_ids[] = {5, 70, 90, 129};
    for (int i = 0; i < 4; i++)
        allow[ok_ids[i] >> 6] |= 1ull << (ok_ids[i] & 63);
    dsv4_err err = {0};
    dsv4_sampler s;
    dsv4_sampler_init(&s, V, NULL, 0, &err);
    dsv4_sample_params p;
    dsv4_sample_params_default(&p);
    p.temperature = 0;
    p.n_top_logprobs = 6;
    p.allow = allow;
    dsv4_sample_out o;
    CHECK(!dsv4_sample(&s, &p, logits, 0, &o, &err) && o.id == 70, "mask, greedy: %d (want 70, the lower of a tie)", o.id);
    /* logprobs are of the masked distribution: the allowed ids' probabilities sum to one, and
     * only they are listed */
    double sum = 0;
    for (int i = 0; i < o.n_top; i++)
        sum += exp(o.top_logprobs[i]);
    int listed_ok = o.n_top == 4;
    for (int i = 0; i < o.n_top; i++)
        listed_ok &= allow[o.top_ids[i] >> 6] >> (o.top_ids[i] & 63) & 1;
    CHECK(listed_ok && fabs(sum - 1) < 1e-12, "mask: top alternatives %d, mass %.17g", o.n_top, sum);
    const double lse = log(exp(logits[5]) + exp(logits[70]) + exp(logits[90]) + exp(logits[129]));
    CHECK(fabs(o.logprob - (logits[70] - lse)) < 1e-12, "mask: logprob %.17g", o.logprob);
    /* seeded draws only ever give allowed ids, and the same key the same id */
    p.temperature = 1.0;
    p.top_p = 0.9;
    for (int pos = 0; pos < 200; pos++) {
        p.seed = 99;
        dsv4_sample_out a, b;
        dsv4_sample(&s, &p, logits, pos, &a, &err);
        dsv4_sample(&s, &p, logits, pos, &b, &err);
        CHECK((allow[a.id >> 6] >> (a.id & 63) & 1) && a.id == b.id, "mask: draw at %d gave %d", pos, a.id);
    }
    /* a mask that allows nothing is an error, not a draw */
    uint64_t none[(V + 63) / 64] = {0};
    p.allow = none;
    CHECK(dsv4_sample(&s, &p, logits, 0, &o, &err) && strstr(err.msg, "allows no token"), "mask: empty: %s", err.msg);
    dsv4_sampler_free(&s);
}

/* ---- masks ----------------------------------------------------------------------------- */

/* The mask by brute force: every id's bytes through the state. */
static void brute_mask(const dsv4_tokenizer *tok, int32_t n_ids, const dsv4_grammar *g, const dsv4_gstate *s, int32_t eos,
                       uint64_t *mask)
{
    dsv4_gstate *t = malloc(sizeof *t);
    memset(mask, 0, dsv4_mask_words(n_ids) * 8);
    for (int32_t id = 0; id < n_ids && id < dsv4_tokenizer_n_vocab(tok); id++) {
        size_t len;
        const char *b = dsv4_tokenizer_id_bytes(tok, id, &len);
        int ok;
        if (id == eos)
            ok = dsv4_gstate_accepts(g, s);
        else {
            if (!b || !len || dsv4_tokenizer_is_special(tok, id))
                continue;
            memcpy(t, s, dsv4_gstate_size(s));
            ok = dsv4_gstate_feed_bytes(g, t, b, len);
        }
        if (ok)
            mask[id >> 6] |= 1ull << (id & 63);
    }
    free(t);
}

/* Masks at chosen states (free and bounded strings, raw text with a marker prefix just read,
 * a character cut in two) against brute force. */
static void mask_cases(const dsv4_tokenizer *tok, const dsv4_vocab_trie *trie, int32_t n_ids, int32_t eos, const char *label)
{
    cJSON *tools = cJSON_Parse(TOOLS);
    const char *schema_s = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{\"type\":\"string\","
                           "\"maxLength\":3},\"c\":{\"anyOf\":[{\"type\":\"string\",\"maxLength\":2},{\"enum\":[\"abcdefgh\"]}]}},"
                           "\"required\":[\"a\",\"b\",\"c\"],\"additionalProperties\":false}";
    cJSON *schema = cJSON_Parse(schema_s);
    const char *P = "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n<｜DSML｜ parameter name=\"city\" string=\"true\">";
    const char *N = "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n<｜DSML｜ parameter name=\"city\" string=\"true\">"
                    "x</｜DSML｜ parameter>\n<｜DSML｜ parameter name=\"unit\" string=\"true\">C</｜DSML｜ parameter>\n"
                    "<｜DSML｜ parameter name=\"note\" string=\"true\">";
    struct {
        int kind; /* 0 schema, 1 tools, 2 thinking json_object */
        const char *head, *tail;
    } cases[] = {
        {0, "{\"a\":\"", ""}, {0, "{\"a\":\"x", "\xc3"}, {0, "{\"a\":\"x", "\xe6\x97"}, {0, "{\"a\":\"x\\", ""},
        {0, "{\"a\":\"\",\"b\":\"", ""}, {0, "{\"a\":\"\",\"b\":\"ab", ""}, {0, "{\"a\":\"\",\"b\":\"abc", ""},
        {0, "{\"a\":\"\",\"b\":\"\",\"c\":\"", ""}, {0, "{\"a\":\"\",\"b\":\"\",\"c\":\"ab", ""},
        {1, P, ""}, {1, P, "Par"}, {1, N, ""}, {1, N, "some <"}, {1, N, "a</"}, {1, N, "a</｜"}, {1, N, "a</｜DSM"},
        {2, "", ""}, {2, "hmm </", ""}, {2, "hmm </th", ""}, {2, "x</think>", ""},
    };
    dsv4_err err = {0};
    dsv4_grammar_opts th = {.thinking = 1};
    dsv4_grammar *gs[3] = {dsv4_grammar_json_schema(schema, NULL, &err), dsv4_grammar_tool_call(tools, NULL, NULL, &err),
                           dsv4_grammar_json_object(&th, &err)};
    CHECK(gs[0] && gs[1] && gs[2], "mask cases: %s", err.msg);
    const size_t W = dsv4_mask_words(n_ids);
    uint64_t *a = malloc(W * 8), *b = malloc(W * 8);
    dsv4_gstate *st = malloc(sizeof *st);
    for (size_t i = 0; i < sizeof cases / sizeof *cases && gs[0] && gs[1] && gs[2]; i++) {
        const dsv4_grammar *g = gs[cases[i].kind];
        dsv4_gstate_init(g, st);
        int ok = dsv4_gstate_feed_bytes(g, st, cases[i].head, strlen(cases[i].head)) &&
                 dsv4_gstate_feed_bytes(g, st, cases[i].tail, strlen(cases[i].tail));
        CHECK(ok, "%s mask case %zu: the prefix is refused", label, i);
        if (!ok)
            continue;
        int n = dsv4_vocab_trie_mask(trie, g, st, &eos, 1, a, NULL, &err);
        brute_mask(tok, n_ids, g, st, eos, b);
        CHECK(n >= 0 && !memcmp(a, b, W * 8), "%s mask case %zu (%s|%s): the trie mask differs from brute force", label, i,
              cases[i].head, cases[i].tail);
    }
    free(st);
    free(a);
    free(b);
    for (int k = 0; k < 3; k++)
        dsv4_grammar_free(gs[k]);
    cJSON_Delete(schema);
    cJSON_Delete(tools);
}

/* ---- generation ------------------------------------------------------------------------ */

typedef struct gen_env {
    dsv4_model *m;
    dsv4_tokenizer *tok;
    dsv4_vocab_trie *trie;
    int32_t eos, bos, vocab;
    const char *label;
    int brute;        /* also check each mask against brute force */
} gen_env;

/* Generates under g (owned) with the lanes; returns the reply text (malloc'd) and whether it
 * ended complete. */
static char *generate(gen_env *e, dsv4_grammar *g, uint64_t seed, double temp, int max_tokens, int *complete)
{
    dsv4_err err = {0};
    dsv4_constraint *c = dsv4_constraint_new(g, e->trie, &e->eos, 1, 64, &err);
    CHECK(c != NULL, "%s: constraint: %s", e->label, err.msg);
    if (!c)
        return NULL;
    int32_t prompt[1] = {e->bos};
    dsv4_sampler smp;
    dsv4_sampler_init(&smp, e->vocab, prompt, 1, &err);
    dsv4_sample_params sp;
    dsv4_sample_params_default(&sp);
    sp.temperature = temp;
    sp.seed = seed;
    dsv4_seq *s = dsv4_seq_new(e->m, &err);
    float *lg = malloc((size_t)e->vocab * sizeof *lg);
    uint64_t *m1 = malloc(dsv4_mask_words(e->vocab) * 8), *m2 = malloc(dsv4_mask_words(e->vocab) * 8);
    int32_t *ids = malloc((size_t)max_tokens * sizeof *ids);
    int n = 0, rc = 0;
    const int32_t *feed = prompt;
    int n_feed = 1;
    dsv4_gstate *shadow = malloc(sizeof *shadow); /* the state, tracked here from the token bytes */
    dsv4_gstate_init(dsv4_constraint_grammar(c), shadow);
    while (n < max_tokens && !rc) {
        dsv4_batch b = {.n_seqs = 1, .seqs = &s, .ids = &feed, .n_ids = &n_feed, .logits = lg};
        if ((rc = dsv4_forward(e->m, &b, &err)))
            break;
        sp.allow = dsv4_constraint_next_mask(c, &err);
        if (e->brute && sp.allow) {
            brute_mask(e->tok, e->vocab, dsv4_constraint_grammar(c), shadow, e->eos, m1);
            CHECK(!memcmp(m1, sp.allow, dsv4_mask_words(e->vocab) * 8), "%s: token %d: the trie mask differs from brute force",
                  e->label, n);
        }
        dsv4_sample_out o;
        if (!sp.allow || (rc = dsv4_sample(&smp, &sp, lg, dsv4_seq_len(s), &o, &err)) || (rc = dsv4_constraint_accept(c, o.id, &err))) {
            CHECK(0, "%s: sampling: %s", e->label, err.msg);
            rc = -1;
            break;
        }
        dsv4_sampler_accept(&smp, o.id);
        ids[n++] = o.id;
        if (o.id == e->eos)
            break;
        size_t len;
        const char *by = dsv4_tokenizer_id_bytes(e->tok, o.id, &len);
        dsv4_gstate_feed_bytes(dsv4_constraint_grammar(c), shadow, by, len);
        feed = &ids[n - 1];
        n_feed = 1;
    }
    *complete = !rc && dsv4_constraint_ended(c);
    char *text = NULL;
    size_t tl;
    if (!rc)
        dsv4_tokenizer_decode(e->tok, ids, (size_t)n, 1, &text, &tl, &err);
    free(shadow);
    free(ids);
    free(m1);
    free(m2);
    free(lg);
    dsv4_seq_free(s);
    dsv4_sampler_free(&smp);
    dsv4_constraint_free(c);
    return text;
}

/* Masks along a reply, with and without the cache: the same bits every time. */
static void cache_identity(gen_env *e, const cJSON *schema, const char *reply_text)
{
    dsv4_err err = {0};
    dsv4_ids ids = {0};
    dsv4_tokenizer_encode(e->tok, reply_text, strlen(reply_text), &ids, &err);
    dsv4_constraint *a = dsv4_constraint_new(dsv4_grammar_json_schema(schema, NULL, &err), e->trie, &e->eos, 1, 0, &err);
    dsv4_constraint *b = dsv4_constraint_new(dsv4_grammar_json_schema(schema, NULL, &err), e->trie, &e->eos, 1, 4, &err);
    CHECK(a && b, "cache identity: %s", err.msg);
    size_t W = dsv4_mask_words(e->vocab);
    uint64_t *ma = malloc(W * 8), *mb = malloc(W * 8);
    int same = 1, accepted = 1;
    /* twice over the same tokens: the second pass is served from the cache where it can */
    for (int pass = 0; pass < 2 && a && b; pass++) {
        for (size_t i = 0; i < ids.n && accepted; i++) {
            int na = dsv4_constraint_mask(a, ma, &err), nb = dsv4_constraint_mask(b, mb, &err);
            same &= na == nb && !memcmp(ma, mb, W * 8);
            accepted = !dsv4_constraint_accept(a, ids.v[i], &err) && !dsv4_constraint_accept(b, ids.v[i], &err);
        }
        dsv4_constraint_free(b);
        b = dsv4_constraint_new(dsv4_grammar_json_schema(schema, NULL, &err), e->trie, &e->eos, 1, 4, &err);
        dsv4_constraint_free(a);
        a = dsv4_constraint_new(dsv4_grammar_json_schema(schema, NULL, &err), e->trie, &e->eos, 1, 0, &err);
    }
    CHECK(accepted, "cache identity: the reply's tokens are refused: %s", err.msg);
    CHECK(same, "cache identity: masks differ with the cache");
    dsv4_constraint_free(a);
    dsv4_constraint_free(b);
    free(ma);
    free(mb);
    dsv4_ids_free(&ids);
}

static void gen_schemas(gen_env *e, fixture *fx, int n, const uint64_t *seeds, int n_seeds, int max_tokens)
{
    for (int i = 0; i < n; i++) {
        if (!fx[i].doc)
            continue;
        const cJSON *schema = cJSON_GetObjectItemCaseSensitive(fx[i].doc, "schema");
        const int bounded = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(fx[i].doc, "bounded"));
        for (int k = 0; k < n_seeds; k++) {
            dsv4_err err = {0};
            dsv4_grammar_opts o = {.max_ws = 2};
            dsv4_grammar *g = dsv4_grammar_json_schema(schema, &o, &err);
            int complete = 0, brute = e->brute;
            e->brute = brute && k == 0; /* brute force on the first seed's masks */
            char *text = g ? generate(e, g, seeds[k], k == 0 ? 0.0 : 1.0, max_tokens, &complete) : NULL;
            e->brute = brute;
            CHECK(text != NULL, "%s %s: generation failed", e->label, fx[i].name);
            if (!text)
                continue;
            if (bounded)
                CHECK(complete, "%s %s seed %llu: a bounded reply did not finish: %s", e->label, fx[i].name,
                      (unsigned long long)seeds[k], text);
            if (complete) {
                cJSON *v = cJSON_Parse(text);
                CHECK(v && valid(schema, schema, v), "%s %s seed %llu: invalid reply %s", e->label, fx[i].name,
                      (unsigned long long)seeds[k], text);
                cJSON_Delete(v);
            }
            free(text);
        }
    }
    /* a forced tool call, any tool and a named one */
    cJSON *tools = cJSON_Parse(TOOLS);
    for (int k = 0; k < n_seeds; k++) {
        const char *name = k % 2 ? "get_weather" : NULL;
        dsv4_err err = {0};
        dsv4_grammar *g = dsv4_grammar_tool_call(tools, name, NULL, &err);
        int complete = 0;
        char *text = g ? generate(e, g, seeds[k], 1.0, max_tokens, &complete) : NULL;
        if (text && complete)
            CHECK(calls_valid(text, tools, name, 0), "%s tool call seed %llu: %s", e->label, (unsigned long long)seeds[k], text);
        CHECK(text != NULL, "%s: tool-call generation failed", e->label);
        free(text);
    }
    cJSON_Delete(tools);
}

static int open_env(gen_env *e, const char *model_dir, const char *tok_dir, const char *label)
{
    dsv4_err err = {0};
    dsv4_load_opts lo = {0};
    memset(e, 0, sizeof *e);
    e->label = label;
    e->m = dsv4_model_load(model_dir, &lo, &err);
    CHECK(e->m != NULL, "%s: %s", label, err.msg);
    e->tok = e->m ? dsv4_tokenizer_load(tok_dir, &err) : NULL;
    CHECK(e->tok != NULL, "%s: tokenizer: %s", label, err.msg);
    if (!e->tok)
        return -1;
    dsv4_model_info info;
    dsv4_model_get_info(e->m, &info);
    e->vocab = info.vocab_size;
    e->eos = info.eos_id;
    e->bos = info.bos_id;
    e->trie = dsv4_vocab_trie_new(e->tok, e->vocab, &err);
    CHECK(e->trie != NULL, "%s: trie: %s", label, err.msg);
    return e->trie ? 0 : -1;
}

static void close_env(gen_env *e)
{
    dsv4_vocab_trie_free(e->trie);
    dsv4_tokenizer_free(e->tok);
    dsv4_model_free(e->m);
}

/* ---- lanes: constrained solo == constrained beside others ------------------------------ */

typedef struct lane_result {
    int n, n_cached, finish;
    int64_t proposed, kept;    /* drafted requests: proposal tokens made and kept */
    int32_t id[128];
    double lp[128];
} lane_result;

static dsv4_request *constrained_req(gen_env *e, const cJSON *schema, uint64_t seed)
{
    dsv4_err err = {0};
    int32_t p[3] = {e->bos, 100 + (int32_t)seed, 200};
    dsv4_request *r = dsv4_request_new(p, 3, &err);
    r->max_tokens = 48;
    r->sp.temperature = 1.0;
    r->sp.seed = seed;
    r->sp.n_top_logprobs = 2;
    r->stop_ids = malloc(sizeof *r->stop_ids);
    r->stop_ids[0] = e->eos;
    r->n_stop_ids = 1;
    if (schema) {
        dsv4_grammar_opts o = {.max_ws = 2};
        r->constraint = dsv4_constraint_new(dsv4_grammar_json_schema(schema, &o, &err), e->trie, &e->eos, 1, 16, &err);
    }
    return r;
}

static void run_on(dsv4_lanes *l, dsv4_request **rs, int n, lane_result *out);

static void run_lanes(gen_env *e, dsv4_request **rs, int n, int n_lanes, lane_result *out)
{
    dsv4_err err = {0};
    dsv4_lanes_opts lo = {.n_lanes = n_lanes};
    dsv4_lanes *l = dsv4_lanes_new(e->m, &lo, &err);
    run_on(l, rs, n, out);
    dsv4_lanes_free(l);
}

static void run_on(dsv4_lanes *l, dsv4_request **rs, int n, lane_result *out)
{
    dsv4_err err = {0};
    for (int i = 0; i < n; i++)
        CHECK(!dsv4_lanes_submit(l, rs[i], &err), "submit: %s", err.msg);
    while (dsv4_lanes_step(l, &err) > 0)
        ;
    for (int i = 0; i < n; i++) {
        out[i].n = rs[i]->n_out;
        out[i].n_cached = rs[i]->n_cached;
        out[i].finish = rs[i]->finish;
        out[i].proposed = rs[i]->draft_proposed;
        out[i].kept = rs[i]->draft_kept;
        for (int k = 0; k < rs[i]->n_out && k < 128; k++) {
            out[i].id[k] = rs[i]->out[k].id;
            out[i].lp[k] = rs[i]->out[k].logprob;
        }
        dsv4_request_release(rs[i]);
    }
}

static int same_result(const lane_result *a, const lane_result *b)
{
    int same = a->n == b->n;
    for (int k = 0; same && k < a->n; k++)
        same = a->id[k] == b->id[k] && !memcmp(&a->lp[k], &b->lp[k], sizeof(double));
    return same;
}

static int64_t g_draft_proposed, g_draft_kept; /* over the drafted lanes cases */

static void lanes_case(gen_env *e, const cJSON *schema)
{
    lane_result solo, mixed[3];
    dsv4_request *r = constrained_req(e, schema, 7);
    run_lanes(e, &r, 1, 1, &solo);
    dsv4_request *rs[3] = {constrained_req(e, NULL, 3), constrained_req(e, schema, 7), constrained_req(e, schema, 9)};
    run_lanes(e, rs, 3, 3, mixed);
    CHECK(same_result(&solo, &mixed[1]) && solo.n > 0, "lanes: a constrained request differs beside others (%d vs %d tokens)",
          solo.n, mixed[1].n);
    CHECK(solo.n > 0 && solo.id[solo.n - 1] == e->eos, "lanes: the constrained reply did not end with EOS");
    /* resumed == fresh: the same request again on lanes with a prompt cache resumes its prompt
     * from the first run's state, and the constraint starts afresh all the same */
    dsv4_err err = {0};
    dsv4_lanes_opts lo = {.n_lanes = 2, .cache_bytes = 64u << 20};
    dsv4_lanes *l = dsv4_lanes_new(e->m, &lo, &err);
    lane_result first, again;
    dsv4_request *a = constrained_req(e, schema, 7);
    run_on(l, &a, 1, &first);
    dsv4_request *b = constrained_req(e, schema, 7);
    run_on(l, &b, 1, &again);
    CHECK(again.n_cached > 0, "lanes: the second run did not resume from the cache");
    dsv4_lanes_free(l);
    CHECK(same_result(&first, &solo) && same_result(&again, &solo), "lanes: a resumed constrained request differs from a fresh one");
    /* without stop ids the constraint's end still stops the request */
    lane_result bare;
    dsv4_request *c = constrained_req(e, schema, 7);
    free(c->stop_ids);
    c->stop_ids = NULL;
    c->n_stop_ids = 0;
    run_lanes(e, &c, 1, 1, &bare);
    CHECK(same_result(&bare, &solo) && bare.finish == DSV4_FINISH_STOP, "lanes: the constraint's end did not stop the request (finish %d)",
          bare.finish);
    /* drafted == plain under the constraint: prompt-lookup proposals drawn under the mask, alone
     * and beside others */
    lane_result dsolo, dmixed[3];
    dsv4_request *d = constrained_req(e, schema, 7);
    d->draft = 4;
    run_lanes(e, &d, 1, 1, &dsolo);
    CHECK(same_result(&dsolo, &solo), "lanes: a drafted constrained request differs from the plain one (%d vs %d tokens)",
          dsolo.n, solo.n);
    dsv4_request *ds[3] = {constrained_req(e, NULL, 3), constrained_req(e, schema, 7), constrained_req(e, schema, 9)};
    for (int i = 0; i < 3; i++)
        ds[i]->draft = 6;
    run_lanes(e, ds, 3, 3, dmixed);
    CHECK(same_result(&dmixed[1], &solo), "lanes: a drafted constrained request beside others differs from the plain one");
    g_draft_proposed += dsolo.proposed + dmixed[1].proposed;
    g_draft_kept += dsolo.kept + dmixed[1].kept;
}

int main(int argc, char **argv)
{
    const char *deepseek = NULL;
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--deepseek"))
            deepseek = argv[i + 1];
    fixture fx[64];
    int n = load_corpus(fx, 64);
    corpus(fx, n);
    tool_calls();
    sampler_mask();

    static const uint64_t seeds[] = {0, 1, 2};
    gen_env e;
    if (!open_env(&e, "models/mini", "models/mini", "mini")) {
        e.brute = 1; /* 4,096 ids: brute force is cheap */
        mask_cases(e.tok, e.trie, e.vocab, e.eos, "mini");
        gen_schemas(&e, fx, n, seeds, 3, 200);
        /* json_object with the trained model: whatever it writes is a prefix of an object, and
         * when it ends, it is one */
        dsv4_err err = {0};
        int complete = 0;
        char *text = generate(&e, dsv4_grammar_json_object(NULL, &err), 5, 0.7, 200, &complete);
        if (text && complete) {
            cJSON *v = cJSON_Parse(text);
            CHECK(cJSON_IsObject(v), "mini json_object: %s", text);
            cJSON_Delete(v);
        }
        free(text);
        /* thinking: free reasoning (raw text up to </think>), then the object */
        dsv4_grammar_opts th = {.thinking = 1};
        text = generate(&e, dsv4_grammar_json_object(&th, &err), 6, 1.0, 120, &complete);
        CHECK(text != NULL, "mini thinking json_object");
        if (text && complete) {
            const char *end = strstr(text, "</think>");
            cJSON *v = end ? cJSON_Parse(end + 8) : NULL;
            CHECK(cJSON_IsObject(v), "mini thinking json_object: %s", text);
            cJSON_Delete(v);
        }
        free(text);
        for (int i = 0; i < n; i++) {
            const cJSON *m = cJSON_GetObjectItemCaseSensitive(fx[i].doc, "match");
            if (m && m->child)
                cache_identity(&e, cJSON_GetObjectItemCaseSensitive(fx[i].doc, "schema"), m->child->valuestring);
        }
        for (int i = 0; i < n; i++)
            if (!strcmp(fx[i].name, "enums.json"))
                lanes_case(&e, cJSON_GetObjectItemCaseSensitive(fx[i].doc, "schema"));
        CHECK(g_draft_proposed > 0, "lanes: the drafted constrained requests proposed nothing");
        printf("  drafted under a constraint: %lld of %lld proposed tokens kept\n", (long long)g_draft_kept,
               (long long)g_draft_proposed);
    }
    close_env(&e);

    if (deepseek) {
        char model[512];
        snprintf(model, sizeof model, "%s/v4/v4-tiny-v", CHECK_FIXTURES);
        if (!open_env(&e, model, deepseek, "v4-tiny-v")) {
            e.brute = 1; /* on the first seed: the mask against every one of the 129k ids */
            mask_cases(e.tok, e.trie, e.vocab, e.eos, "v4-tiny-v");
            static const uint64_t ds_seeds[] = {11, 12};
            fixture sub[64];
            int m = 0;
            for (int i = 0; i < n; i++) /* the bounded schemas: a random model must finish them */
                if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(fx[i].doc, "bounded")))
                    sub[m++] = fx[i];
            gen_schemas(&e, sub, m, ds_seeds, 2, 160);
            for (int i = 0; i < n; i++) {
                const cJSON *mt = cJSON_GetObjectItemCaseSensitive(fx[i].doc, "match");
                if (mt && mt->child)
                    cache_identity(&e, cJSON_GetObjectItemCaseSensitive(fx[i].doc, "schema"), mt->child->valuestring);
            }
        }
        close_env(&e);
    }
    for (int i = 0; i < n; i++)
        cJSON_Delete(fx[i].doc);
    return check_summary("grammar");
}
