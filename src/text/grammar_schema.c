/* grammar_schema — JSON Schema (the structured-outputs subset) to grammar nodes, and the
 * response_format grammars. See docs/constrain.md for the keywords. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "text/grammar_impl.h"

enum { MAX_REF_DEPTH = 32 };

struct g_schema_ctx {
    dsv4_grammar *g;
    const cJSON *root;
    uint32_t max_ws;
    uint32_t any_value, any_object; /* G_INF until first asked for */
    const char *refs[MAX_REF_DEPTH]; /* $refs being expanded, to refuse recursion */
    int n_refs;
};

g_schema_ctx *g_schema_ctx_new(dsv4_grammar *g, const cJSON *root_schema, uint32_t max_ws, dsv4_err *err)
{
    g_schema_ctx *c = dsv4_xcalloc(1, sizeof *c, err);
    if (!c)
        return NULL;
    c->g = g;
    c->root = root_schema;
    c->max_ws = max_ws;
    c->any_value = c->any_object = G_INF;
    return c;
}

void g_schema_ctx_free(g_schema_ctx *c) { free(c); }
dsv4_grammar *g_schema_grammar(g_schema_ctx *c) { return c->g; }

static uint32_t ws(g_schema_ctx *c) { return g_ws(c->g, c->max_ws); }

/* ---- generic JSON ---------------------------------------------------------------------- */

static uint32_t sep(g_schema_ctx *c) { return G_SEQ_OF(c->g, ws(c), g_lits(c->g, ","), ws(c)); }

uint32_t g_any_value(g_schema_ctx *c)
{
    if (c->any_value != G_INF)
        return c->any_value;
    dsv4_grammar *g = c->g;
    const uint32_t val = g_alt(g, NULL, 0); /* children set below: the containers refer back to it */
    c->any_value = val;
    const uint32_t member = G_SEQ_OF(g, g_str(g, 0, G_INF), ws(c), g_lits(g, ":"), ws(c), val);
    const uint32_t obj = G_SEQ_OF(g, g_lits(g, "{"), ws(c),
                                  G_ALT_OF(g, g_lits(g, "}"), G_SEQ_OF(g, g_rep(g, member, sep(c), 1, G_INF), ws(c), g_lits(g, "}"))));
    const uint32_t arr = G_SEQ_OF(g, g_lits(g, "["), ws(c),
                                  G_ALT_OF(g, g_lits(g, "]"), G_SEQ_OF(g, g_rep(g, val, sep(c), 1, G_INF), ws(c), g_lits(g, "]"))));
    char *words[] = {"true", "false", "null"};
    const size_t lens[] = {4, 5, 4};
    /* the containers first: past the nesting bound the matcher skips the first two options */
    g_set_kids(g, val, (const uint32_t[]){obj, arr, g_str(g, 0, G_INF), g_num(g, 0), g_litset(g, words, lens, 3)}, 5);
    if (val != G_INF)
        g->nodes[val].flags |= G_FLAG_NEST;
    c->any_object = obj;
    return val;
}

uint32_t g_any_object(g_schema_ctx *c)
{
    g_any_value(c);
    return c->any_object;
}

/* ---- schema walking -------------------------------------------------------------------- */

static const char *const annotations[] = {"description", "title", "default", "examples", "$schema", "$id", "$comment",
                                          "deprecated", "readOnly", "writeOnly", "$defs", "definitions", NULL};
static const char *const known[] = {"type", "properties", "required", "additionalProperties", "enum", "const", "anyOf",
                                    "items", "minItems", "maxItems", "format", "minLength", "maxLength", "$ref", NULL};

static int in_list(const char *const *l, const char *s)
{
    for (; *l; l++)
        if (!strcmp(*l, s))
            return 1;
    return 0;
}

static int fail_at(dsv4_err *err, const char *path, const char *fmt, const char *arg)
{
    char msg[512];
    snprintf(msg, sizeof msg, fmt, arg);
    return dsv4_fail(err, DSV4_E_UNSUPPORTED, "schema at %s: %s", path, msg);
}

const cJSON *g_schema_deref(g_schema_ctx *c, const cJSON *s, const char *path, dsv4_err *err)
{
    for (int hops = 0; cJSON_IsObject(s); hops++) {
        const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
        if (!ref)
            return s;
        if (!cJSON_IsString(ref) || hops > MAX_REF_DEPTH) {
            fail_at(err, path, "$ref must be a string naming a definition%s", "");
            return NULL;
        }
        const char *r = ref->valuestring;
        if (!strcmp(r, "#"))
            s = c->root;
        else if (!strncmp(r, "#/$defs/", 8) || !strncmp(r, "#/definitions/", 14)) {
            const int defs = r[2] == '$';
            const cJSON *d = cJSON_GetObjectItemCaseSensitive(c->root, defs ? "$defs" : "definitions");
            s = d ? cJSON_GetObjectItemCaseSensitive(d, r + (defs ? 8 : 14)) : NULL;
            if (!s) {
                fail_at(err, path, "$ref \"%s\" names no definition", r);
                return NULL;
            }
        } else {
            fail_at(err, path, "$ref \"%s\" is not supported (only #, #/$defs/NAME and #/definitions/NAME)", r);
            return NULL;
        }
    }
    if (!cJSON_IsObject(s) && !cJSON_IsTrue(s)) {
        fail_at(err, path, "a schema must be an object or true%s", "");
        return NULL;
    }
    return s;
}

static int check_keywords(const cJSON *s, const char *path, dsv4_err *err)
{
    const cJSON *k;
    cJSON_ArrayForEach(k, s)
    {
        if (in_list(known, k->string) || in_list(annotations, k->string))
            continue;
        return fail_at(err, path, "keyword \"%s\" is not supported", k->string);
    }
    return 0;
}

static int get_count(const cJSON *s, const char *key, uint32_t dflt, uint32_t *out, const char *path, dsv4_err *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    *out = dflt;
    if (!v)
        return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e9 || v->valuedouble != (double)(uint32_t)v->valuedouble)
        return fail_at(err, path, "%s must be a non-negative integer", key);
    *out = (uint32_t)v->valuedouble;
    return 0;
}

/* The type names a schema allows, as a bit set; 0 when it has no "type". */
enum { T_OBJECT = 1, T_ARRAY = 2, T_STRING = 4, T_NUMBER = 8, T_INTEGER = 16, T_BOOLEAN = 32, T_NULL = 64 };
static const char *const type_names[] = {"object", "array", "string", "number", "integer", "boolean", "null"};

static int types_of(const cJSON *s, unsigned *out, const char *path, dsv4_err *err)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
    *out = 0;
    if (!t)
        return 0;
    const cJSON *one = t;
    int many = cJSON_IsArray(t);
    if (many)
        one = t->child;
    for (; one; one = many ? one->next : NULL) {
        unsigned bit = 0;
        for (int i = 0; i < 7 && cJSON_IsString(one); i++)
            if (!strcmp(one->valuestring, type_names[i]))
                bit = 1u << i;
        if (!bit)
            return fail_at(err, path, "type %s is not a JSON Schema type", cJSON_IsString(one) ? one->valuestring : "(not a string)");
        *out |= bit;
    }
    if (!*out)
        return fail_at(err, path, "type lists no type%s", "");
    return 0;
}

/* A JSON value's type bits (an integral number is both number and integer). */
static unsigned value_types(const cJSON *v)
{
    if (cJSON_IsObject(v)) return T_OBJECT;
    if (cJSON_IsArray(v)) return T_ARRAY;
    if (cJSON_IsString(v)) return T_STRING;
    if (cJSON_IsBool(v)) return T_BOOLEAN;
    if (cJSON_IsNull(v)) return T_NULL;
    if (cJSON_IsNumber(v)) return T_NUMBER | (v->valuedouble == (double)(long long)v->valuedouble ? T_INTEGER : 0);
    return 0;
}

/* enum / const: the values' JSON texts (raw: strings unquoted), those that fit `types`. */
static uint32_t enum_node(g_schema_ctx *c, const cJSON *s, unsigned types, int raw, const char *path, dsv4_err *err)
{
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (e && k)
        return fail_at(err, path, "enum and const together are not supported%s", ""), G_INF;
    if (e && (!cJSON_IsArray(e) || !cJSON_GetArraySize(e)))
        return fail_at(err, path, "enum must be a non-empty array%s", ""), G_INF;
    int n = e ? cJSON_GetArraySize(e) : 1;
    char **lits = calloc((size_t)n, sizeof *lits);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    uint32_t id = G_INF;
    int m = 0, bad = !lits || !lens;
    const cJSON *v = e ? e->child : k;
    for (; v && !bad; v = e ? v->next : NULL) {
        if (types && !(value_types(v) & types))
            continue;
        if (raw && !cJSON_IsString(v))
            continue; /* raw text can only spell strings */
        lits[m] = raw ? strdup(v->valuestring) : cJSON_PrintUnformatted(v);
        if (!lits[m]) {
            bad = 1;
            break;
        }
        lens[m] = strlen(lits[m]);
        m++;
    }
    if (bad)
        dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    else if (!m)
        fail_at(err, path, "no %s value fits the schema's type", e ? "enum" : "const");
    else
        id = g_litset(c->g, lits, lens, (uint32_t)m);
    for (int i = 0; i < m; i++)
        free(lits[i]);
    free(lits);
    free(lens);
    return id;
}

/* String formats as byte patterns (all ASCII, so the same quoted or raw). */
static uint32_t two_digits(dsv4_grammar *g, const char *first, const char *second)
{
    return G_SEQ_OF(g, g_class(g, first, 1, 1), g_class(g, second, 1, 1));
}

static uint32_t fmt_date(dsv4_grammar *g)
{
    const uint32_t month = G_ALT_OF(g, two_digits(g, "0", "1-9"), two_digits(g, "1", "0-2"));
    const uint32_t day = G_ALT_OF(g, two_digits(g, "0", "1-9"), two_digits(g, "12", "0-9"), two_digits(g, "3", "01"));
    return G_SEQ_OF(g, g_class(g, "0-9", 4, 4), g_lits(g, "-"), month, g_lits(g, "-"), day);
}

static uint32_t fmt_time(dsv4_grammar *g)
{
    const uint32_t hour = G_ALT_OF(g, two_digits(g, "01", "0-9"), two_digits(g, "2", "0-3"));
    const uint32_t min = two_digits(g, "0-5", "0-9");
    const uint32_t frac = G_ALT_OF(g, g_seq(g, NULL, 0), G_SEQ_OF(g, g_lits(g, "."), g_class(g, "0-9", 1, 6)));
    const uint32_t off = G_ALT_OF(g, g_lits(g, "Z"), G_SEQ_OF(g, g_class(g, "+-", 1, 1), hour, g_lits(g, ":"), min));
    return G_SEQ_OF(g, hour, g_lits(g, ":"), min, g_lits(g, ":"), min, frac, off);
}

static uint32_t format_node(dsv4_grammar *g, const char *f, const char *path, dsv4_err *err)
{
    if (!strcmp(f, "date"))
        return fmt_date(g);
    if (!strcmp(f, "time"))
        return fmt_time(g);
    if (!strcmp(f, "date-time"))
        return G_SEQ_OF(g, fmt_date(g), g_lits(g, "T"), fmt_time(g));
    if (!strcmp(f, "uuid")) {
        const char *hx = "0-9a-fA-F";
        return G_SEQ_OF(g, g_class(g, hx, 8, 8), g_lits(g, "-"), g_class(g, hx, 4, 4), g_lits(g, "-"), g_class(g, hx, 4, 4),
                        g_lits(g, "-"), g_class(g, hx, 4, 4), g_lits(g, "-"), g_class(g, hx, 12, 12));
    }
    if (!strcmp(f, "email")) {
        /* the parts' lengths are left open: counted, every state of a long local part would
         * differ and need its own walk */
        const uint32_t label = g_class(g, "A-Za-z0-9-", 1, G_INF);
        return G_SEQ_OF(g, g_class(g, "A-Za-z0-9._%+-", 1, G_INF), g_lits(g, "@"), g_rep(g, label, g_lits(g, "."), 2, 8));
    }
    fail_at(err, path, "string format \"%s\" is not supported (date, time, date-time, uuid, email are)", f);
    return G_INF;
}

/* A string schema's grammar: quoted JSON (raw: unquoted text without marker). */
static uint32_t string_node(g_schema_ctx *c, const cJSON *s, const char *marker, const char *path, dsv4_err *err)
{
    uint32_t minl, maxl;
    if (get_count(s, "minLength", 0, &minl, path, err) || get_count(s, "maxLength", G_INF, &maxl, path, err))
        return G_INF;
    if (minl > maxl)
        return fail_at(err, path, "minLength exceeds maxLength%s", ""), G_INF;
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(s, "format");
    if (f) {
        if (!cJSON_IsString(f))
            return fail_at(err, path, "format must be a string%s", ""), G_INF;
        if (minl || maxl != G_INF)
            return fail_at(err, path, "minLength/maxLength with a format are not supported%s", ""), G_INF;
        uint32_t p = format_node(c->g, f->valuestring, path, err);
        if (p == G_INF || marker)
            return p;
        return G_SEQ_OF(c->g, g_lits(c->g, "\""), p, g_lits(c->g, "\""));
    }
    return marker ? g_raw(c->g, marker, minl, maxl) : g_str(c->g, minl, maxl);
}

static uint32_t array_node(g_schema_ctx *c, const cJSON *s, const char *path, dsv4_err *err)
{
    uint32_t lo, hi;
    if (get_count(s, "minItems", 0, &lo, path, err) || get_count(s, "maxItems", G_INF, &hi, path, err))
        return G_INF;
    if (lo > hi)
        return fail_at(err, path, "minItems exceeds maxItems%s", ""), G_INF;
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    char sub[512];
    snprintf(sub, sizeof sub, "%s/items", path);
    uint32_t item = items ? g_schema_value(c, items, sub, err) : g_any_value(c);
    if (item == G_INF)
        return G_INF;
    dsv4_grammar *g = c->g;
    const uint32_t close = g_lits(g, "]");
    uint32_t body = close;
    if (hi > 0) {
        body = G_SEQ_OF(g, g_rep(g, item, sep(c), lo ? lo : 1, hi), ws(c), close);
        if (lo == 0)
            body = G_ALT_OF(g, close, body);
    }
    return G_SEQ_OF(g, g_lits(g, "["), ws(c), body);
}

/* ---- objects: members in property order --------------------------------------------- */

typedef struct members {
    g_schema_ctx *c;
    const cJSON *props;
    int n;
    uint32_t *member;  /* [n] the member's grammar (key and value) */
    uint8_t *required; /* [n] */
    uint32_t *memo;    /* [2n] rest(k, emitted) */
    uint32_t sep;
} members;

/* The members from k on, given whether one was already written (then a separator leads). */
static uint32_t rest(members *m, int k, int emitted)
{
    dsv4_grammar *g = m->c->g;
    if (k == m->n)
        return g_seq(g, NULL, 0);
    uint32_t *memo = &m->memo[2 * k + emitted];
    if (*memo != G_INF)
        return *memo;
    const uint32_t next = rest(m, k + 1, 1);
    const uint32_t take = emitted ? G_SEQ_OF(g, m->sep, m->member[k], next) : G_SEQ_OF(g, m->member[k], next);
    *memo = m->required[k] ? take : G_ALT_OF(g, take, rest(m, k + 1, emitted));
    return *memo;
}

uint32_t g_members(g_schema_ctx *c, const cJSON *s, uint32_t sep_node, g_member_fn member, void *u, const char *path,
                   dsv4_err *err)
{
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    if (props && !cJSON_IsObject(props))
        return fail_at(err, path, "properties must be an object%s", ""), G_INF;
    if (req && !cJSON_IsArray(req))
        return fail_at(err, path, "required must be an array of property names%s", ""), G_INF;
    members m = {.c = c, .props = props, .n = props ? cJSON_GetArraySize(props) : 0, .sep = sep_node};
    m.member = calloc((size_t)m.n + 1, sizeof *m.member);
    m.required = calloc((size_t)m.n + 1, 1);
    m.memo = malloc((2 * (size_t)m.n + 1) * sizeof *m.memo);
    uint32_t out = G_INF;
    if (!m.member || !m.required || !m.memo) {
        dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < 2 * m.n; i++)
        m.memo[i] = G_INF;
    const cJSON *r;
    cJSON_ArrayForEach(r, req)
    {
        const cJSON *p;
        int i = 0, found = 0;
        if (!cJSON_IsString(r)) {
            fail_at(err, path, "required must be an array of property names%s", "");
            goto done;
        }
        cJSON_ArrayForEach(p, props)
        {
            if (!strcmp(p->string, r->valuestring)) {
                m.required[i] = 1;
                found = 1;
            }
            i++;
        }
        if (!found) {
            fail_at(err, path, "required property \"%s\" is not among the properties", r->valuestring);
            goto done;
        }
    }
    const cJSON *p;
    int i = 0;
    cJSON_ArrayForEach(p, props)
    {
        char sub[512];
        snprintf(sub, sizeof sub, "%s/properties/%s", path, p->string);
        m.member[i] = member(u, c, p->string, p, sub, err);
        if (m.member[i] == G_INF)
            goto done;
        i++;
    }
    out = rest(&m, 0, 0);
done:
    free(m.member);
    free(m.required);
    free(m.memo);
    return out;
}

static uint32_t json_member(void *u, g_schema_ctx *c, const char *key, const cJSON *sub, const char *path, dsv4_err *err)
{
    (void)u;
    cJSON *k = cJSON_CreateString(key);
    char *q = k ? cJSON_PrintUnformatted(k) : NULL;
    cJSON_Delete(k);
    if (!q)
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory"), G_INF;
    const uint32_t key_node = g_lits(c->g, q);
    free(q);
    const uint32_t v = g_schema_value(c, sub, path, err);
    if (v == G_INF)
        return G_INF;
    return G_SEQ_OF(c->g, key_node, ws(c), g_lits(c->g, ":"), ws(c), v);
}

static uint32_t object_node(g_schema_ctx *c, const cJSON *s, const char *path, dsv4_err *err)
{
    const cJSON *ap = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (ap && !cJSON_IsBool(ap))
        return fail_at(err, path, "additionalProperties as a schema is not supported (only true or false)%s", ""), G_INF;
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    /* no declared properties and extra ones allowed: any object. With declared properties only
     * those are written (what additionalProperties allows beyond them is never needed). */
    if (!props && !cJSON_GetObjectItemCaseSensitive(s, "required") && !cJSON_IsFalse(ap))
        return g_any_object(c);
    dsv4_grammar *g = c->g;
    const uint32_t body = g_members(c, s, sep(c), json_member, NULL, path, err);
    if (body == G_INF)
        return G_INF;
    return G_SEQ_OF(g, g_lits(g, "{"), ws(c), body, ws(c), g_lits(g, "}"));
}

/* One "type" (bit) of a schema. */
static uint32_t typed_node(g_schema_ctx *c, const cJSON *s, unsigned bit, const char *path, dsv4_err *err)
{
    dsv4_grammar *g = c->g;
    switch (bit) {
    case T_OBJECT: return object_node(c, s, path, err);
    case T_ARRAY: return array_node(c, s, path, err);
    case T_STRING: return string_node(c, s, NULL, path, err);
    case T_NUMBER: return g_num(g, 0);
    case T_INTEGER: return g_num(g, 1);
    case T_BOOLEAN: {
        char *w[] = {"true", "false"};
        return g_litset(g, w, (const size_t[]){4, 5}, 2);
    }
    default: return g_lits(g, "null");
    }
}

static int push_ref(g_schema_ctx *c, const cJSON *s, const char *path, dsv4_err *err)
{
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    if (!ref || !cJSON_IsString(ref))
        return 0;
    for (int i = 0; i < c->n_refs; i++)
        if (!strcmp(c->refs[i], ref->valuestring))
            return fail_at(err, path, "recursive $ref \"%s\" is not supported", ref->valuestring), -1;
    if (c->n_refs == MAX_REF_DEPTH)
        return fail_at(err, path, "$refs nest too deep%s", ""), -1;
    c->refs[c->n_refs++] = ref->valuestring;
    return 1;
}

uint32_t g_schema_value(g_schema_ctx *c, const cJSON *s0, const char *path, dsv4_err *err)
{
    if (cJSON_IsTrue(s0))
        return g_any_value(c);
    if (cJSON_IsObject(s0) && cJSON_GetObjectItemCaseSensitive(s0, "$ref")) {
        const cJSON *k;
        cJSON_ArrayForEach(k, s0)
        {
            if (strcmp(k->string, "$ref") && !in_list(annotations, k->string))
                return fail_at(err, path, "keyword \"%s\" beside $ref is not supported", k->string), G_INF;
        }
    }
    int pushed = cJSON_IsObject(s0) ? push_ref(c, s0, path, err) : 0;
    if (pushed < 0)
        return G_INF;
    uint32_t out = G_INF;
    const cJSON *s = g_schema_deref(c, s0, path, err);
    if (!s)
        goto done;
    if (cJSON_IsTrue(s)) {
        out = g_any_value(c);
        goto done;
    }
    if (check_keywords(s, path, err))
        goto done;
    unsigned types;
    if (types_of(s, &types, path, err))
        goto done;
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    if (any) {
        if (!cJSON_IsArray(any) || !cJSON_GetArraySize(any)) {
            fail_at(err, path, "anyOf must be a non-empty array of schemas%s", "");
            goto done;
        }
        const cJSON *k;
        cJSON_ArrayForEach(k, s)
        {
            if (strcmp(k->string, "anyOf") && !in_list(annotations, k->string)) {
                fail_at(err, path, "keyword \"%s\" beside anyOf is not supported", k->string);
                goto done;
            }
        }
        int n = cJSON_GetArraySize(any), i = 0;
        uint32_t *kids = calloc((size_t)n, sizeof *kids);
        if (!kids) {
            dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
            goto done;
        }
        const cJSON *a;
        cJSON_ArrayForEach(a, any)
        {
            char sub[512];
            snprintf(sub, sizeof sub, "%s/anyOf/%d", path, i);
            kids[i] = g_schema_value(c, a, sub, err);
            if (kids[i++] == G_INF) {
                free(kids);
                goto done;
            }
        }
        out = g_alt(c->g, kids, (uint32_t)n);
        free(kids);
        goto done;
    }
    if (cJSON_GetObjectItemCaseSensitive(s, "enum") || cJSON_GetObjectItemCaseSensitive(s, "const")) {
        out = enum_node(c, s, types, 0, path, err);
        goto done;
    }
    if (!types) {
        /* no type: the shape the other keywords describe, else any value */
        if (cJSON_GetObjectItemCaseSensitive(s, "properties") || cJSON_GetObjectItemCaseSensitive(s, "required") ||
            cJSON_GetObjectItemCaseSensitive(s, "additionalProperties"))
            types = T_OBJECT;
        else if (cJSON_GetObjectItemCaseSensitive(s, "items") || cJSON_GetObjectItemCaseSensitive(s, "minItems") ||
                 cJSON_GetObjectItemCaseSensitive(s, "maxItems"))
            types = T_ARRAY;
        else if (cJSON_GetObjectItemCaseSensitive(s, "format") || cJSON_GetObjectItemCaseSensitive(s, "minLength") ||
                 cJSON_GetObjectItemCaseSensitive(s, "maxLength"))
            types = T_STRING;
        else {
            out = g_any_value(c);
            goto done;
        }
    }
    /* number and integer together: number covers integer */
    if ((types & T_NUMBER) && (types & T_INTEGER))
        types &= ~(unsigned)T_INTEGER;
    uint32_t kids[7];
    int n = 0;
    for (unsigned bit = 1; bit <= T_NULL; bit <<= 1)
        if (types & bit) {
            kids[n] = typed_node(c, s, bit, path, err);
            if (kids[n++] == G_INF)
                goto done;
        }
    out = n == 1 ? kids[0] : g_alt(c->g, kids, (uint32_t)n);
done:
    if (pushed > 0)
        c->n_refs--;
    return out;
}

int g_schema_is_string(g_schema_ctx *c, const cJSON *s0)
{
    dsv4_err e = {0};
    const cJSON *s = g_schema_deref(c, s0, "", &e);
    if (!s || !cJSON_IsObject(s))
        return 0;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (cJSON_GetObjectItemCaseSensitive(s, "anyOf"))
        return 0;
    if (t)
        return cJSON_IsString(t) && !strcmp(t->valuestring, "string");
    if (k)
        return cJSON_IsString(k);
    if (en) {
        const cJSON *v;
        cJSON_ArrayForEach(v, en)
        {
            if (!cJSON_IsString(v))
                return 0;
        }
        return cJSON_GetArraySize(en) > 0;
    }
    return cJSON_GetObjectItemCaseSensitive(s, "format") != NULL;
}

uint32_t g_schema_raw_string(g_schema_ctx *c, const cJSON *s0, const char *marker, const char *path, dsv4_err *err)
{
    const cJSON *s = g_schema_deref(c, s0, path, err);
    if (!s || check_keywords(s, path, err))
        return G_INF;
    if (cJSON_GetObjectItemCaseSensitive(s, "enum") || cJSON_GetObjectItemCaseSensitive(s, "const"))
        return enum_node(c, s, T_STRING, 1, path, err);
    return string_node(c, s, marker, path, err);
}

/* ---- response_format ---------------------------------------------------------------- */

/* The reply around a value: in thinking mode free reasoning and "</think>" come first. */
uint32_t g_reply(dsv4_grammar *g, const dsv4_grammar_opts *o, uint32_t body)
{
    if (!o || !o->thinking)
        return body;
    return G_SEQ_OF(g, g_raw(g, "</think>", 0, G_INF), g_lits(g, "</think>"), body);
}

uint32_t g_max_ws(const dsv4_grammar_opts *o)
{
    if (!o || o->max_ws == 0)
        return 8;
    return o->max_ws < 0 ? 0 : (uint32_t)o->max_ws;
}

static dsv4_grammar *finish_or_fail(dsv4_grammar *g, uint32_t root, dsv4_err *err)
{
    if (root != G_INF && !g_finish(g, root))
        return g;
    if (!err->code)
        dsv4_fail(err, DSV4_E_NOMEM, "out of memory compiling the grammar");
    dsv4_grammar_free(g);
    return NULL;
}

dsv4_grammar *dsv4_grammar_json_object(const dsv4_grammar_opts *o, dsv4_err *err)
{
    dsv4_grammar *g = g_new();
    g_schema_ctx *c = g ? g_schema_ctx_new(g, NULL, g_max_ws(o), err) : NULL;
    if (!c) {
        dsv4_grammar_free(g);
        dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
        return NULL;
    }
    uint32_t root = g_reply(g, o, g_any_object(c));
    g_schema_ctx_free(c);
    return finish_or_fail(g, root, err);
}

dsv4_grammar *dsv4_grammar_json_schema(const cJSON *schema, const dsv4_grammar_opts *o, dsv4_err *err)
{
    if (!schema)
        return dsv4_fail(err, DSV4_E_ARG, "no schema given"), NULL;
    dsv4_grammar *g = g_new();
    g_schema_ctx *c = g ? g_schema_ctx_new(g, schema, g_max_ws(o), err) : NULL;
    if (!c) {
        dsv4_grammar_free(g);
        dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
        return NULL;
    }
    uint32_t v = g_schema_value(c, schema, "#", err);
    uint32_t root = v == G_INF ? G_INF : g_reply(g, o, v);
    g_schema_ctx_free(c);
    return finish_or_fail(g, root, err);
}
