#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "text/buf.h"
#include "text/chat.h"
#include "text/jinja.h"

/* ---- lexer ----------------------------------------------------------------------------
 * The template becomes one token stream: text runs, the delimiters of {{ }} and {% %}, and the
 * expression tokens inside them. */

enum { T_TEXT, T_OUT, T_OUT_END, T_STMT, T_STMT_END, T_NAME, T_STR, T_NUM, T_OP, T_EOF };

typedef struct tok {
    int kind;
    char *s; /* text, name, string value or operator (owned) */
    size_t n;
    double num;
    int isfloat;
} tok;

typedef struct lexer {
    tok *t;
    int n, cap;
} lexer;

static int push_tok(lexer *L, int kind, const char *s, size_t n)
{
    if (L->n == L->cap) {
        int c = L->cap ? L->cap * 2 : 256;
        tok *t = realloc(L->t, (size_t)c * sizeof *t);
        if (!t)
            return -1;
        L->t = t;
        L->cap = c;
    }
    tok *k = &L->t[L->n++];
    memset(k, 0, sizeof *k);
    k->kind = kind;
    k->s = malloc(n + 1);
    if (!k->s)
        return -1;
    if (n)
        memcpy(k->s, s, n);
    k->s[n] = 0;
    k->n = n;
    return 0;
}

static void lexer_free(lexer *L)
{
    for (int i = 0; i < L->n; i++)
        free(L->t[i].s);
    free(L->t);
}

static const char *const ops2[] = {"//", "==", "!=", "<=", ">=", NULL};

/* Expression tokens from p up to the closing delimiter (`%}` or `}}`); returns the position after
 * it, with *trim_after set by a "-" before it, or NULL on error. */
static const char *lex_expr(lexer *L, const char *p, const char *close, int *trim_after, dsv4_err *err)
{
    for (;;) {
        while (*p && isspace((unsigned char)*p))
            p++;
        if (!*p) {
            dsv4_fail(err, DSV4_E_FORMAT, "template: missing \"%s\"", close);
            return NULL;
        }
        if (p[0] == '-' && !strncmp(p + 1, close, 2)) {
            *trim_after = 1;
            return p + 3;
        }
        if (!strncmp(p, close, 2)) {
            *trim_after = 0;
            return p + 2;
        }
        if (*p == '\'' || *p == '"') {
            char q = *p++;
            dsv4_buf b = {0};
            dsv4_buf_put(&b, "", 0);
            while (*p && *p != q) {
                char c = *p++;
                if (c == '\\' && *p) {
                    c = *p++;
                    c = c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c;
                }
                dsv4_buf_put(&b, &c, 1);
            }
            if (!*p) {
                dsv4_buf_free(&b);
                dsv4_fail(err, DSV4_E_FORMAT, "template: unterminated string");
                return NULL;
            }
            p++;
            int rc = b.oom || push_tok(L, T_STR, b.p, b.n);
            dsv4_buf_free(&b);
            if (rc) {
                dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
                return NULL;
            }
            continue;
        }
        if (isdigit((unsigned char)*p)) {
            char *end;
            double v = strtod(p, &end);
            int isf = memchr(p, '.', (size_t)(end - p)) || memchr(p, 'e', (size_t)(end - p));
            if (push_tok(L, T_NUM, p, (size_t)(end - p))) {
                dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
                return NULL;
            }
            L->t[L->n - 1].num = v;
            L->t[L->n - 1].isfloat = isf;
            p = end;
            continue;
        }
        if (isalpha((unsigned char)*p) || *p == '_') {
            const char *s = p;
            while (isalnum((unsigned char)*p) || *p == '_')
                p++;
            if (push_tok(L, T_NAME, s, (size_t)(p - s))) {
                dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
                return NULL;
            }
            continue;
        }
        size_t k = 1;
        for (int i = 0; ops2[i]; i++)
            if (!strncmp(p, ops2[i], 2))
                k = 2;
        if (!strchr("+-*/%~()[]{},.:|=<>!", *p)) {
            dsv4_fail(err, DSV4_E_FORMAT, "template: unexpected character '%c'", *p);
            return NULL;
        }
        if (push_tok(L, T_OP, p, k)) {
            dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
            return NULL;
        }
        p += k;
    }
}

static int lex(lexer *L, const char *src, dsv4_err *err)
{
    const char *p = src;
    int trim_next = 0, block_before = 0;
    while (*p) {
        const char *o = strchr(p, '{');
        while (o && o[1] != '{' && o[1] != '%' && o[1] != '#')
            o = strchr(o + 1, '{');
        const char *end = o ? o : p + strlen(p);
        /* the text run, with whitespace control applied at both ends */
        const char *ts = p, *te = end;
        if (trim_next)
            while (ts < te && isspace((unsigned char)*ts))
                ts++;
        else if (block_before && ts < te && *ts == '\n')
            ts++; /* trim_blocks */
        if (o && o[2] == '-')
            while (te > ts && isspace((unsigned char)te[-1]))
                te--;
        else if (o && (o[1] == '%' || o[1] == '#') && o[2] != '+') {
            /* lstrip_blocks: spaces and tabs from the line start up to a block tag */
            const char *q = te;
            while (q > ts && (q[-1] == ' ' || q[-1] == '\t'))
                q--;
            if (q == src || q[-1] == '\n')
                te = q;
        }
        if (te > ts && push_tok(L, T_TEXT, ts, (size_t)(te - ts)))
            return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
        if (!o)
            break;
        const char *q = o + 2;
        if (*q == '-' || *q == '+')
            q++;
        if (o[1] == '#') {
            const char *c = strstr(q, "#}");
            if (!c)
                return dsv4_fail(err, DSV4_E_FORMAT, "template: unterminated comment");
            trim_next = c > q && c[-1] == '-';
            block_before = 1;
            p = c + 2;
            continue;
        }
        int out = o[1] == '{';
        if (push_tok(L, out ? T_OUT : T_STMT, "", 0))
            return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
        p = lex_expr(L, q, out ? "}}" : "%}", &trim_next, err);
        if (!p)
            return err->code;
        if (push_tok(L, out ? T_OUT_END : T_STMT_END, "", 0))
            return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
        block_before = !out;
    }
    return push_tok(L, T_EOF, "", 0) ? dsv4_fail(err, DSV4_E_NOMEM, "out of memory") : 0;
}

/* ---- syntax tree ------------------------------------------------------------------------ */

enum {
    E_LIT, E_NAME, E_ATTR, E_INDEX, E_SLICE, E_CALL, E_FILTER, E_TEST, E_NOT, E_NEG, E_BIN, E_AND, E_OR, E_COND,
    E_LIST, E_DICT,
    S_TEXT, S_OUT, S_IF, S_FOR, S_SET, S_BLOCK
};

typedef struct node node;
struct node {
    int kind;
    const char *name;  /* names, attributes, operators, filters, tests, set targets */
    cJSON *lit;        /* E_LIT (owned) */
    node **kid;        /* operands, arguments, statements */
    int nkid;
    char **kw;         /* keyword argument names for E_CALL/E_FILTER (parallel to the last nkw kids) */
    int nkw;
    int neg;           /* E_TEST: is not; E_BIN "not in" */
    int isfloat;
};

typedef struct parser {
    lexer *L;
    int i;
    node **all; /* every node, for freeing */
    int nall, capall;
    dsv4_err *err;
    int failed;
    int depth; /* nesting of expressions and blocks, bounded so that no template exhausts the stack */
} parser;

#define MAX_DEPTH 200

static node *mk(parser *P, int kind)
{
    node *n = calloc(1, sizeof *n);
    if (!n || (P->nall == P->capall && (P->capall = P->capall ? P->capall * 2 : 256,
                                        !(P->all = realloc(P->all, (size_t)P->capall * sizeof *P->all))))) {
        free(n);
        P->failed = 1;
        dsv4_fail(P->err, DSV4_E_NOMEM, "out of memory");
        return NULL;
    }
    P->all[P->nall++] = n;
    n->kind = kind;
    return n;
}

static int add_kid(parser *P, node *n, node *k)
{
    if (!n || !k) { /* a part that failed has said why; one that is simply absent has not */
        if (!P->failed)
            dsv4_fail(P->err, DSV4_E_FORMAT, "template: an expression is missing");
        P->failed = 1;
        return -1;
    }
    node **v = realloc(n->kid, (size_t)(n->nkid + 1) * sizeof *v);
    if (!v) {
        P->failed = 1;
        return dsv4_fail(P->err, DSV4_E_NOMEM, "out of memory");
    }
    n->kid = v;
    n->kid[n->nkid++] = k;
    return 0;
}

static void free_nodes(parser *P)
{
    for (int i = 0; i < P->nall; i++) {
        cJSON_Delete(P->all[i]->lit);
        free(P->all[i]->kid);
        free(P->all[i]->kw);
        free(P->all[i]);
    }
    free(P->all);
}

static tok *peek(parser *P) { return &P->L->t[P->i]; }
static int is_op(parser *P, const char *o) { return peek(P)->kind == T_OP && !strcmp(peek(P)->s, o); }
static int is_name(parser *P, const char *o) { return peek(P)->kind == T_NAME && !strcmp(peek(P)->s, o); }

static node *fail_at(parser *P, const char *what)
{
    if (!P->failed)
        dsv4_fail(P->err, DSV4_E_FORMAT, "template: %s near \"%s\"", what, peek(P)->s);
    P->failed = 1;
    return NULL;
}

static int expect_op(parser *P, const char *o)
{
    if (!is_op(P, o)) {
        char m[32];
        snprintf(m, sizeof m, "expected \"%s\"", o);
        fail_at(P, m);
        return -1;
    }
    P->i++;
    return 0;
}

static node *expr(parser *P);

/* Arguments of a call or filter: positional, then name=value. */
static int args(parser *P, node *n)
{
    if (expect_op(P, "("))
        return -1;
    while (!is_op(P, ")")) {
        if (peek(P)->kind == T_NAME && P->L->t[P->i + 1].kind == T_OP && !strcmp(P->L->t[P->i + 1].s, "=")) {
            char **kw = realloc(n->kw, (size_t)(n->nkw + 1) * sizeof *kw);
            if (!kw)
                return -1;
            n->kw = kw;
            n->kw[n->nkw++] = peek(P)->s;
            P->i += 2;
        } else if (n->nkw) {
            fail_at(P, "positional argument after keyword argument");
            return -1;
        }
        if (add_kid(P, n, expr(P)))
            return -1;
        if (!is_op(P, ","))
            break;
        P->i++;
    }
    return expect_op(P, ")");
}

static node *primary(parser *P)
{
    tok *t = peek(P);
    node *n;
    if (t->kind == T_STR || t->kind == T_NUM) {
        n = mk(P, E_LIT);
        if (!n)
            return NULL;
        n->lit = t->kind == T_STR ? cJSON_CreateString(t->s) : cJSON_CreateNumber(t->num);
        n->isfloat = t->isfloat;
        P->i++;
        /* adjacent string literals concatenate */
        while (t->kind == T_STR && peek(P)->kind == T_STR) {
            size_t a = strlen(n->lit->valuestring), b = peek(P)->n;
            char *s = malloc(a + b + 1);
            if (!s)
                return fail_at(P, "out of memory");
            memcpy(s, n->lit->valuestring, a);
            memcpy(s + a, peek(P)->s, b + 1);
            cJSON_Delete(n->lit);
            n->lit = cJSON_CreateString(s);
            free(s);
            P->i++;
        }
        return n->lit ? n : fail_at(P, "out of memory");
    }
    if (t->kind == T_NAME) {
        P->i++;
        if (!strcmp(t->s, "true") || !strcmp(t->s, "True") || !strcmp(t->s, "false") || !strcmp(t->s, "False")) {
            n = mk(P, E_LIT);
            if (n)
                n->lit = cJSON_CreateBool(t->s[0] == 't' || t->s[0] == 'T');
            return n;
        }
        if (!strcmp(t->s, "none") || !strcmp(t->s, "None")) {
            n = mk(P, E_LIT);
            if (n)
                n->lit = cJSON_CreateNull();
            return n;
        }
        n = mk(P, E_NAME);
        if (n)
            n->name = t->s;
        return n;
    }
    if (is_op(P, "(")) {
        P->i++;
        n = expr(P);
        return expect_op(P, ")") ? NULL : n;
    }
    if (is_op(P, "[")) {
        P->i++;
        n = mk(P, E_LIST);
        while (n && !is_op(P, "]")) {
            if (add_kid(P, n, expr(P)))
                return NULL;
            if (!is_op(P, ","))
                break;
            P->i++;
        }
        return expect_op(P, "]") ? NULL : n;
    }
    if (is_op(P, "{")) {
        P->i++;
        n = mk(P, E_DICT);
        while (n && !is_op(P, "}")) {
            if (add_kid(P, n, expr(P)) || expect_op(P, ":") || add_kid(P, n, expr(P)))
                return NULL;
            if (!is_op(P, ","))
                break;
            P->i++;
        }
        return expect_op(P, "}") ? NULL : n;
    }
    return fail_at(P, "unexpected token");
}

static node *postfix(parser *P)
{
    node *n = primary(P);
    while (n) {
        if (is_op(P, ".")) {
            P->i++;
            if (peek(P)->kind != T_NAME)
                return fail_at(P, "expected an attribute name");
            node *a = mk(P, E_ATTR);
            if (!a || add_kid(P, a, n))
                return NULL;
            a->name = peek(P)->s;
            P->i++;
            n = a;
        } else if (is_op(P, "[")) {
            P->i++;
            node *parts[3] = {NULL, NULL, NULL};
            int colons = 0;
            for (;;) {
                if (is_op(P, ":")) {
                    if (++colons > 2)
                        return fail_at(P, "bad slice");
                    P->i++;
                } else if (is_op(P, "]"))
                    break;
                else {
                    parts[colons] = expr(P);
                    if (!parts[colons])
                        return NULL;
                }
            }
            P->i++;
            node *x = mk(P, colons ? E_SLICE : E_INDEX);
            if (!x || add_kid(P, x, n))
                return NULL;
            if (!colons) {
                if (!parts[0])
                    return fail_at(P, "empty subscript");
                if (add_kid(P, x, parts[0]))
                    return NULL;
            } else
                for (int k = 0; k < 3; k++) {
                    node *e = parts[k];
                    if (!e) {
                        e = mk(P, E_LIT);
                        if (!e)
                            return NULL;
                        e->lit = cJSON_CreateNull();
                    }
                    if (add_kid(P, x, e))
                        return NULL;
                }
            n = x;
        } else if (is_op(P, "(")) {
            node *c = mk(P, E_CALL);
            if (!c || add_kid(P, c, n) || args(P, c))
                return NULL;
            n = c;
        } else
            break;
    }
    return n;
}

/* Filters bind tighter than arithmetic: `a + b | f` filters b. */
static node *filtered(parser *P)
{
    node *n = postfix(P);
    while (n && is_op(P, "|")) {
        P->i++;
        if (peek(P)->kind != T_NAME)
            return fail_at(P, "expected a filter name");
        node *f = mk(P, E_FILTER);
        if (!f || add_kid(P, f, n))
            return NULL;
        f->name = peek(P)->s;
        P->i++;
        if (is_op(P, "(") && args(P, f))
            return NULL;
        n = f;
    }
    return n;
}

static node *unary(parser *P)
{
    if (is_op(P, "-")) {
        if (++P->depth > MAX_DEPTH)
            return fail_at(P, "nesting too deep");
        P->i++;
        node *n = mk(P, E_NEG);
        int bad = !n || add_kid(P, n, unary(P));
        P->depth--;
        return bad ? NULL : n;
    }
    return filtered(P);
}

static node *bin(parser *P, node *l, const char *op, node *(*next)(parser *))
{
    node *n = mk(P, E_BIN);
    if (!n || add_kid(P, n, l))
        return NULL;
    n->name = op;
    return add_kid(P, n, next(P)) ? NULL : n;
}

static node *mul(parser *P)
{
    node *n = unary(P);
    while (n && (is_op(P, "*") || is_op(P, "/") || is_op(P, "%") || is_op(P, "//"))) {
        const char *op = peek(P)->s;
        P->i++;
        n = bin(P, n, op, unary);
    }
    return n;
}

static node *add(parser *P)
{
    node *n = mul(P);
    while (n && (is_op(P, "+") || is_op(P, "-") || is_op(P, "~"))) {
        const char *op = peek(P)->s;
        P->i++;
        n = bin(P, n, op, mul);
    }
    return n;
}

static node *cmp(parser *P)
{
    node *n = add(P);
    while (n) {
        if (is_op(P, "==") || is_op(P, "!=") || is_op(P, "<") || is_op(P, ">") || is_op(P, "<=") || is_op(P, ">=")) {
            const char *op = peek(P)->s;
            P->i++;
            n = bin(P, n, op, add);
        } else if (is_name(P, "in") || (is_name(P, "not") && P->L->t[P->i + 1].kind == T_NAME && !strcmp(P->L->t[P->i + 1].s, "in"))) {
            int neg = is_name(P, "not");
            P->i += neg ? 2 : 1;
            n = bin(P, n, "in", add);
            if (n)
                n->neg = neg;
        } else if (is_name(P, "is")) {
            P->i++;
            node *t = mk(P, E_TEST);
            if (!t || add_kid(P, t, n))
                return NULL;
            if (is_name(P, "not")) {
                t->neg = 1;
                P->i++;
            }
            if (peek(P)->kind != T_NAME)
                return fail_at(P, "expected a test name");
            t->name = peek(P)->s;
            P->i++;
            n = t;
        } else
            break;
    }
    return n;
}

static node *not_(parser *P)
{
    if (is_name(P, "not")) {
        if (++P->depth > MAX_DEPTH)
            return fail_at(P, "nesting too deep");
        P->i++;
        node *n = mk(P, E_NOT);
        int bad = !n || add_kid(P, n, not_(P));
        P->depth--;
        return bad ? NULL : n;
    }
    return cmp(P);
}

static node *and_(parser *P)
{
    node *n = not_(P);
    while (n && is_name(P, "and")) {
        P->i++;
        node *a = mk(P, E_AND);
        if (!a || add_kid(P, a, n) || add_kid(P, a, not_(P)))
            return NULL;
        n = a;
    }
    return n;
}

static node *or_(parser *P)
{
    node *n = and_(P);
    while (n && is_name(P, "or")) {
        P->i++;
        node *a = mk(P, E_OR);
        if (!a || add_kid(P, a, n) || add_kid(P, a, and_(P)))
            return NULL;
        n = a;
    }
    return n;
}

static node *expr_(parser *P);

static node *expr(parser *P)
{
    if (++P->depth > MAX_DEPTH) {
        P->depth--;
        return fail_at(P, "nesting too deep");
    }
    node *n = expr_(P);
    P->depth--;
    return n;
}

static node *expr_(parser *P)
{
    node *n = or_(P);
    if (n && is_name(P, "if")) {
        P->i++;
        node *c = mk(P, E_COND);
        if (!c || add_kid(P, c, or_(P)) || add_kid(P, c, n))
            return NULL;
        if (is_name(P, "else")) {
            P->i++;
            if (add_kid(P, c, expr(P)))
                return NULL;
        }
        return c;
    }
    return n;
}

/* Statements until one of the stop keywords (opening a {% %} tag) or the end. */
static node *block_(parser *P, const char *const *stops);

static node *block(parser *P, const char *const *stops)
{
    if (++P->depth > MAX_DEPTH) {
        P->depth--;
        return fail_at(P, "nesting too deep");
    }
    node *b = block_(P, stops);
    P->depth--;
    return b;
}

static node *block_(parser *P, const char *const *stops)
{
    node *b = mk(P, S_BLOCK);
    while (b && !P->failed) {
        tok *t = peek(P);
        if (t->kind == T_EOF) {
            if (stops)
                return fail_at(P, "unclosed block");
            return b;
        }
        if (t->kind == T_TEXT) {
            node *n = mk(P, S_TEXT);
            if (!n || add_kid(P, b, n))
                return NULL;
            n->name = t->s;
            P->i++;
            continue;
        }
        if (t->kind == T_OUT) {
            P->i++;
            node *n = mk(P, S_OUT);
            if (!n || add_kid(P, n, expr(P)) || add_kid(P, b, n))
                return NULL;
            if (peek(P)->kind != T_OUT_END)
                return fail_at(P, "expected \"}}\"");
            P->i++;
            continue;
        }
        if (t->kind != T_STMT)
            return fail_at(P, "unexpected token");
        tok *kw = &P->L->t[P->i + 1];
        if (kw->kind != T_NAME)
            return fail_at(P, "expected a statement");
        for (int k = 0; stops && stops[k]; k++)
            if (!strcmp(kw->s, stops[k]))
                return b; /* the caller consumes the stop tag */
        P->i += 2;
        node *n;
        if (!strcmp(kw->s, "if")) {
            static const char *const st[] = {"elif", "else", "endif", NULL};
            n = mk(P, S_IF);
            for (;;) {
                if (!n || add_kid(P, n, expr(P)) || peek(P)->kind != T_STMT_END)
                    return fail_at(P, "bad if");
                P->i++;
                if (add_kid(P, n, block(P, st)))
                    return NULL;
                const char *w = P->L->t[P->i + 1].s;
                P->i += 2;
                if (!strcmp(w, "elif"))
                    continue;
                if (!strcmp(w, "else")) {
                    static const char *const st2[] = {"endif", NULL};
                    if (peek(P)->kind != T_STMT_END)
                        return fail_at(P, "bad else");
                    P->i++;
                    node *always = mk(P, E_LIT);
                    if (!always)
                        return NULL;
                    always->lit = cJSON_CreateTrue();
                    if (add_kid(P, n, always) || add_kid(P, n, block(P, st2)))
                        return NULL;
                    P->i += 2;
                }
                break;
            }
        } else if (!strcmp(kw->s, "for")) {
            static const char *const st[] = {"else", "endfor", NULL};
            n = mk(P, S_FOR);
            if (!n)
                return NULL;
            /* kid 0..: target names as E_NAME, then the iterable, the body, optional else body */
            node *targets = mk(P, S_BLOCK);
            if (!targets || add_kid(P, n, targets))
                return NULL;
            while (peek(P)->kind == T_NAME && strcmp(peek(P)->s, "in")) {
                node *v = mk(P, E_NAME);
                if (!v || add_kid(P, targets, v))
                    return NULL;
                v->name = peek(P)->s;
                P->i++;
                if (!is_op(P, ","))
                    break;
                P->i++;
            }
            if (!is_name(P, "in") || !targets->nkid)
                return fail_at(P, "bad for");
            P->i++;
            if (add_kid(P, n, or_(P)) || peek(P)->kind != T_STMT_END)
                return fail_at(P, "bad for (only `for x in expr` is supported)");
            P->i++;
            if (add_kid(P, n, block(P, st)))
                return NULL;
            if (!strcmp(P->L->t[P->i + 1].s, "else")) {
                static const char *const st2[] = {"endfor", NULL};
                P->i += 3;
                if (add_kid(P, n, block(P, st2)))
                    return NULL;
            }
            P->i += 2;
        } else if (!strcmp(kw->s, "set")) {
            n = mk(P, S_SET);
            if (!n || peek(P)->kind != T_NAME)
                return fail_at(P, "bad set");
            node *target = mk(P, E_NAME);
            if (!target || add_kid(P, n, target))
                return NULL;
            target->name = peek(P)->s;
            P->i++;
            if (is_op(P, ".")) {
                P->i++;
                if (peek(P)->kind != T_NAME)
                    return fail_at(P, "bad set");
                n->name = peek(P)->s; /* attribute of a namespace */
                P->i++;
            }
            if (expect_op(P, "=") || add_kid(P, n, expr(P)))
                return NULL;
        } else {
            char m[96];
            snprintf(m, sizeof m, "statement \"%s\" is not supported", kw->s);
            return fail_at(P, m);
        }
        if (peek(P)->kind != T_STMT_END)
            return fail_at(P, "expected \"%}\"");
        P->i++;
        if (add_kid(P, b, n))
            return NULL;
    }
    return P->failed ? NULL : b;
}

/* ---- evaluation -------------------------------------------------------------------------- */

typedef struct var {
    const char *name;
    cJSON *v;
} var;

typedef struct env {
    var *vars;
    int n, cap;
    cJSON **tmp; /* every value made while rendering, freed at the end */
    int ntmp, captmp;
    dsv4_buf out;
    dsv4_err *err;
    size_t made; /* bytes of the values made (an estimate) and of the output */
} env;

/* What one render may make, so that no template takes all memory or runs for hours: strings or
 * lists doubled in a loop, loop nests that never end in practice (each iteration makes its
 * `loop` record, so this bounds iterations too). A chat template over a long conversation
 * stays far below it. */
#define MAX_MADE ((size_t)64 << 20)

/* Bytes a value holds, roughly (cJSON's nodes and strings). */
static size_t json_size(const cJSON *v)
{
    size_t n = sizeof *v + (v->string ? strlen(v->string) : 0) + (v->valuestring ? strlen(v->valuestring) : 0);
    for (const cJSON *c = v->child; c; c = c->next)
        n += json_size(c);
    return n;
}

static int eval_fail(env *E, const char *fmt, const char *what);

/* Counts bytes made; past the budget the render fails. */
static void spend(env *E, size_t n)
{
    E->made += n;
    if (E->made > MAX_MADE)
        eval_fail(E, "template: rendering it makes more than %s of values and output", "64 MiB");
}

/* Registers a new value for freeing; NULL in, NULL out. */
static cJSON *own(env *E, cJSON *v)
{
    if (!v)
        return NULL;
    if (E->ntmp == E->captmp) {
        int c = E->captmp ? E->captmp * 2 : 256;
        cJSON **t = realloc(E->tmp, (size_t)c * sizeof *t);
        if (!t) {
            cJSON_Delete(v);
            return NULL;
        }
        E->tmp = t;
        E->captmp = c;
    }
    E->tmp[E->ntmp++] = v;
    spend(E, json_size(v));
    return v;
}

static int setvar(env *E, int frame, const char *name, cJSON *v)
{
    for (int i = E->n - 1; i >= frame; i--)
        if (!strcmp(E->vars[i].name, name)) {
            E->vars[i].v = v;
            return 0;
        }
    if (E->n == E->cap) {
        int c = E->cap ? E->cap * 2 : 64;
        var *x = realloc(E->vars, (size_t)c * sizeof *x);
        if (!x)
            return dsv4_fail(E->err, DSV4_E_NOMEM, "out of memory");
        E->vars = x;
        E->cap = c;
    }
    E->vars[E->n++] = (var){name, v};
    return 0;
}

static cJSON *getvar(env *E, const char *name)
{
    for (int i = E->n - 1; i >= 0; i--)
        if (!strcmp(E->vars[i].name, name))
            return E->vars[i].v;
    return NULL;
}

static cJSON undef_marker; /* stands for "undefined" where a value pointer must be non-NULL */

static int truthy(const cJSON *v)
{
    if (!v || v == &undef_marker || cJSON_IsNull(v) || cJSON_IsFalse(v))
        return 0;
    if (cJSON_IsNumber(v))
        return v->valuedouble != 0;
    if (cJSON_IsString(v))
        return v->valuestring[0] != 0;
    if (cJSON_IsArray(v) || cJSON_IsObject(v))
        return v->child != NULL;
    return 1;
}

static int is_undef(const cJSON *v) { return !v || v == &undef_marker; }

static void put_num(dsv4_buf *b, double d)
{
    char t[40];
    if (d == floor(d) && fabs(d) < 1e15)
        snprintf(t, sizeof t, "%.0f", d);
    else
        snprintf(t, sizeof t, "%.17g", d);
    dsv4_buf_puts(b, t);
}

/* How {{ }} prints a value (as @huggingface/jinja does for the kinds templates print). */
static void print_val(dsv4_buf *b, const cJSON *v)
{
    if (is_undef(v) || cJSON_IsNull(v))
        return;
    if (cJSON_IsString(v))
        dsv4_buf_puts(b, v->valuestring);
    else if (cJSON_IsBool(v))
        dsv4_buf_puts(b, cJSON_IsTrue(v) ? "true" : "false");
    else if (cJSON_IsNumber(v))
        put_num(b, v->valuedouble);
    else if (cJSON_IsArray(v)) {
        const cJSON *e;
        int first = 1;
        cJSON_ArrayForEach(e, v)
        {
            if (!first)
                dsv4_buf_puts(b, ",");
            first = 0;
            print_val(b, e);
        }
    } else
        dsv4_py_json(b, v);
}

static cJSON *str_val(env *E, const char *s, size_t n)
{
    char *c = malloc(n + 1);
    if (!c)
        return NULL;
    memcpy(c, s, n);
    c[n] = 0;
    cJSON *v = own(E, cJSON_CreateString(c));
    free(c);
    return v;
}

static cJSON *to_string(env *E, const cJSON *v)
{
    dsv4_buf b = {0};
    dsv4_buf_put(&b, "", 0);
    print_val(&b, v);
    cJSON *r = b.oom ? NULL : own(E, cJSON_CreateString(b.p));
    dsv4_buf_free(&b);
    return r;
}

static int equal(const cJSON *a, const cJSON *b)
{
    if (is_undef(a) || is_undef(b))
        return is_undef(a) && is_undef(b);
    if (cJSON_IsNumber(a) && cJSON_IsNumber(b))
        return a->valuedouble == b->valuedouble;
    return cJSON_Compare(a, b, 1);
}

static cJSON *eval(env *E, const node *n);

static int eval_fail(env *E, const char *fmt, const char *what)
{
    if (!E->err->code)
        dsv4_fail(E->err, DSV4_E_ARG, fmt, what);
    return E->err->code;
}

/* A number as an index or step: saturated far beyond any length (a cast of a larger double is
 * undefined); NaN counts as 0. */
static int to_index(double x)
{
    return x != x ? 0 : x > 1e9 ? 1000000000 : x < -1e9 ? -1000000000 : (int)x;
}

/* Python-style index: negative counts from the end; clamped for slices. */
static int slice_bounds(env *E, const node *n, int len, int *a, int *b, int *step)
{
    const cJSON *x = eval(E, n->kid[1]), *y = eval(E, n->kid[2]), *z = eval(E, n->kid[3]);
    if (E->err->code)
        return -1;
    *step = cJSON_IsNumber(z) ? to_index(z->valuedouble) : 1;
    if (*step == 0)
        return eval_fail(E, "template: slice step %s", "0");
    int lo = *step > 0 ? 0 : len - 1, hi = *step > 0 ? len : -1;
    if (cJSON_IsNumber(x)) {
        lo = to_index(x->valuedouble);
        if (lo < 0)
            lo += len;
        lo = *step > 0 ? (lo < 0 ? 0 : lo > len ? len : lo) : (lo < -1 ? -1 : lo > len - 1 ? len - 1 : lo);
    }
    if (cJSON_IsNumber(y)) {
        hi = to_index(y->valuedouble);
        if (hi < 0)
            hi += len;
        hi = *step > 0 ? (hi < 0 ? 0 : hi > len ? len : hi) : (hi < -1 ? -1 : hi > len - 1 ? len - 1 : hi);
    }
    *a = lo;
    *b = hi;
    return 0;
}

static cJSON *new_array(env *E) { return own(E, cJSON_CreateArray()); }

/* Adds a copy of v to array a (copies: containers own their items). */
static int append(env *E, cJSON *a, const cJSON *v)
{
    cJSON *c = is_undef(v) ? cJSON_CreateNull() : cJSON_Duplicate(v, 1);
    if (c)
        spend(E, json_size(c));
    return c && cJSON_AddItemToArray(a, c) ? 0 : -1;
}

static cJSON *call_method(env *E, const cJSON *self, const char *m, cJSON **av, int ac)
{
    if (cJSON_IsString(self)) {
        const char *s = self->valuestring;
        size_t n = strlen(s);
        if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
            const char *chars = ac > 0 && cJSON_IsString(av[0]) ? av[0]->valuestring : " \t\n\r\f\v";
            size_t b = 0, e = n;
            if (m[0] != 'r')
                while (b < e && strchr(chars, s[b]))
                    b++;
            if (m[0] != 'l')
                while (e > b && strchr(chars, s[e - 1]))
                    e--;
            return str_val(E, s + b, e - b);
        }
        if ((!strcmp(m, "startswith") || !strcmp(m, "endswith")) && ac == 1 && cJSON_IsString(av[0])) {
            size_t k = strlen(av[0]->valuestring);
            int r = k <= n && !memcmp(m[0] == 's' ? s : s + n - k, av[0]->valuestring, k);
            return own(E, cJSON_CreateBool(r));
        }
        if (!strcmp(m, "upper") || !strcmp(m, "lower") || !strcmp(m, "title")) {
            cJSON *r = str_val(E, s, n);
            int start = 1;
            for (char *p = r ? r->valuestring : NULL; p && *p; p++) {
                int up = m[0] == 'u' || (m[0] == 't' && start);
                *p = (char)(up ? toupper((unsigned char)*p) : tolower((unsigned char)*p));
                start = !isalpha((unsigned char)*p);
            }
            return r;
        }
        if (!strcmp(m, "split")) {
            cJSON *a = new_array(E);
            const char *sep = ac > 0 && cJSON_IsString(av[0]) ? av[0]->valuestring : NULL;
            const char *p = s;
            while (a) {
                if (!sep) {
                    while (*p && isspace((unsigned char)*p))
                        p++;
                    if (!*p)
                        break;
                    const char *q = p;
                    while (*q && !isspace((unsigned char)*q))
                        q++;
                    char *w = malloc((size_t)(q - p) + 1);
                    if (!w)
                        return NULL;
                    memcpy(w, p, (size_t)(q - p));
                    w[q - p] = 0;
                    cJSON_AddItemToArray(a, cJSON_CreateString(w));
                    free(w);
                    p = q;
                } else {
                    const char *q = *sep ? strstr(p, sep) : NULL;
                    size_t k = q ? (size_t)(q - p) : strlen(p);
                    char *w = malloc(k + 1);
                    if (!w)
                        return NULL;
                    memcpy(w, p, k);
                    w[k] = 0;
                    cJSON_AddItemToArray(a, cJSON_CreateString(w));
                    free(w);
                    if (!q)
                        break;
                    p = q + strlen(sep);
                }
            }
            return a;
        }
        if (!strcmp(m, "replace") && ac == 2 && cJSON_IsString(av[0]) && cJSON_IsString(av[1])) {
            dsv4_buf b = {0};
            dsv4_buf_put(&b, "", 0);
            const char *f = av[0]->valuestring, *t = av[1]->valuestring, *p = s;
            size_t fl = strlen(f);
            const char *q;
            while (fl && (q = strstr(p, f))) {
                dsv4_buf_put(&b, p, (size_t)(q - p));
                dsv4_buf_puts(&b, t);
                p = q + fl;
            }
            dsv4_buf_puts(&b, p);
            cJSON *r = b.oom ? NULL : own(E, cJSON_CreateString(b.p));
            dsv4_buf_free(&b);
            return r;
        }
    } else if (cJSON_IsObject(self)) {
        if (!strcmp(m, "get") && ac >= 1 && cJSON_IsString(av[0])) {
            cJSON *v = cJSON_GetObjectItemCaseSensitive(self, av[0]->valuestring);
            return v ? v : ac > 1 ? av[1] : own(E, cJSON_CreateNull());
        }
        if (!strcmp(m, "items") || !strcmp(m, "keys") || !strcmp(m, "values")) {
            cJSON *a = new_array(E);
            const cJSON *e;
            cJSON_ArrayForEach(e, self)
            {
                if (!a)
                    return NULL;
                if (m[0] == 'k')
                    cJSON_AddItemToArray(a, cJSON_CreateString(e->string));
                else if (m[0] == 'v')
                    append(E, a, e);
                else {
                    cJSON *pair = cJSON_CreateArray();
                    cJSON_AddItemToArray(pair, cJSON_CreateString(e->string));
                    append(E, pair, e);
                    cJSON_AddItemToArray(a, pair);
                }
            }
            return a;
        }
    }
    eval_fail(E, "template: method \"%s\" is not supported here", m);
    return NULL;
}

static cJSON *apply_filter(env *E, const node *n, cJSON *v)
{
    const char *f = n->name;
    int ac = n->nkid - 1;
    cJSON *av[4] = {NULL, NULL, NULL, NULL};
    for (int i = 0; i < ac && i < 4; i++)
        av[i] = eval(E, n->kid[i + 1]);
    if (E->err->code)
        return NULL;
    if (!strcmp(f, "length") || !strcmp(f, "count"))
        return own(E, cJSON_CreateNumber(cJSON_IsString(v) ? (double)strlen(v->valuestring) : (double)cJSON_GetArraySize(v)));
    if (!strcmp(f, "safe"))
        return v;
    if (!strcmp(f, "default") || !strcmp(f, "d"))
        return is_undef(v) || (ac > 1 && truthy(av[1]) && !truthy(v)) ? (ac ? av[0] : own(E, cJSON_CreateString(""))) : v;
    if (!strcmp(f, "tojson")) {
        dsv4_buf b = {0};
        dsv4_buf_put(&b, "", 0);
        if (is_undef(v))
            dsv4_buf_puts(&b, "null");
        else
            dsv4_py_json(&b, v);
        cJSON *r = b.oom ? NULL : own(E, cJSON_CreateString(b.p));
        dsv4_buf_free(&b);
        return r;
    }
    if (!strcmp(f, "string"))
        return to_string(E, v);
    if (!strcmp(f, "list")) {
        cJSON *a = new_array(E);
        if (cJSON_IsArray(v))
            return v;
        if (a && cJSON_IsString(v))
            for (const char *p = v->valuestring; *p;) {
                int k = 1;
                while (((unsigned char)p[k] & 0xc0) == 0x80)
                    k++;
                char w[8] = {0};
                memcpy(w, p, (size_t)(k < 7 ? k : 7));
                cJSON_AddItemToArray(a, cJSON_CreateString(w));
                p += k;
            }
        return a;
    }
    if (!strcmp(f, "int"))
        return own(E, cJSON_CreateNumber(cJSON_IsNumber(v) ? trunc(v->valuedouble) : cJSON_IsString(v) ? (double)strtoll(v->valuestring, NULL, 10) : 0));
    if (!strcmp(f, "first") || !strcmp(f, "last")) {
        int k = cJSON_GetArraySize(v);
        if (cJSON_IsArray(v))
            return k ? cJSON_GetArrayItem(v, f[0] == 'f' ? 0 : k - 1) : &undef_marker;
        if (cJSON_IsString(v)) {
            size_t len = strlen(v->valuestring);
            if (!len)
                return &undef_marker;
            if (f[0] == 'f') {
                int c = 1;
                while (((unsigned char)v->valuestring[c] & 0xc0) == 0x80)
                    c++;
                return str_val(E, v->valuestring, (size_t)c);
            }
            size_t p = len - 1;
            while (p > 0 && ((unsigned char)v->valuestring[p] & 0xc0) == 0x80)
                p--;
            return str_val(E, v->valuestring + p, len - p);
        }
    }
    if (!strcmp(f, "join")) {
        dsv4_buf b = {0};
        dsv4_buf_put(&b, "", 0);
        const cJSON *e, *arr = cJSON_IsArray(v) ? v : NULL;
        int first = 1;
        cJSON_ArrayForEach(e, arr)
        {
            if (!first && ac > 0)
                print_val(&b, av[0]);
            first = 0;
            print_val(&b, e);
        }
        cJSON *r = b.oom ? NULL : own(E, cJSON_CreateString(b.p));
        dsv4_buf_free(&b);
        return r;
    }
    if (cJSON_IsString(v)) {
        if (!strcmp(f, "trim"))
            return call_method(E, v, "strip", NULL, 0);
        if (!strcmp(f, "upper") || !strcmp(f, "lower"))
            return call_method(E, v, f, NULL, 0);
        if (!strcmp(f, "capitalize")) {
            cJSON *r = call_method(E, v, "lower", NULL, 0);
            if (r && r->valuestring[0])
                r->valuestring[0] = (char)toupper((unsigned char)r->valuestring[0]);
            return r;
        }
        if (!strcmp(f, "replace"))
            return call_method(E, v, "replace", av, ac);
    }
    eval_fail(E, "template: filter \"%s\" is not supported here", f);
    return NULL;
}

static cJSON *eval_test(env *E, const node *n)
{
    const cJSON *v = eval(E, n->kid[0]);
    const char *t = n->name;
    int r;
    if (!strcmp(t, "defined"))
        r = !is_undef(v);
    else if (!strcmp(t, "undefined"))
        r = is_undef(v);
    else if (!strcmp(t, "none"))
        r = !is_undef(v) && cJSON_IsNull(v);
    else if (!strcmp(t, "string"))
        r = cJSON_IsString(v);
    else if (!strcmp(t, "number"))
        r = cJSON_IsNumber(v);
    else if (!strcmp(t, "integer"))
        r = cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble);
    else if (!strcmp(t, "mapping"))
        r = cJSON_IsObject(v);
    else if (!strcmp(t, "iterable") || !strcmp(t, "sequence"))
        r = cJSON_IsArray(v) || cJSON_IsString(v) || cJSON_IsObject(v);
    else if (!strcmp(t, "boolean"))
        r = cJSON_IsBool(v);
    else if (!strcmp(t, "true") || !strcmp(t, "false"))
        r = t[0] == 't' ? cJSON_IsTrue(v) : cJSON_IsFalse(v);
    else if (!strcmp(t, "odd") || !strcmp(t, "even"))
        r = cJSON_IsNumber(v) && (fmod(trunc(v->valuedouble), 2) != 0) == (t[0] == 'o');
    else {
        eval_fail(E, "template: test \"%s\" is not supported", t);
        return NULL;
    }
    return own(E, cJSON_CreateBool(r != n->neg));
}

static cJSON *eval_call(env *E, const node *n)
{
    const node *fn = n->kid[0];
    int npos = n->nkid - 1 - n->nkw;
    cJSON *av[8] = {0};
    if (n->nkid - 1 > 8) {
        eval_fail(E, "template: too many arguments%s", "");
        return NULL;
    }
    for (int i = 1; i < n->nkid; i++)
        av[i - 1] = eval(E, n->kid[i]);
    if (E->err->code)
        return NULL;
    if (fn->kind == E_ATTR) {
        const cJSON *self = eval(E, fn->kid[0]);
        if (E->err->code)
            return NULL;
        return call_method(E, self, fn->name, av, npos);
    }
    if (fn->kind != E_NAME) {
        eval_fail(E, "template: this call is not supported%s", "");
        return NULL;
    }
    if (!strcmp(fn->name, "namespace")) {
        cJSON *ns = own(E, cJSON_CreateObject());
        for (int k = 0; ns && k < n->nkw; k++) {
            cJSON *v = av[npos + k];
            cJSON_AddItemToObject(ns, n->kw[k], is_undef(v) ? cJSON_CreateNull() : cJSON_Duplicate(v, 1));
        }
        return ns;
    }
    if (!strcmp(fn->name, "range")) {
        double a = 0, b = 0, s = 1;
        if (npos == 1 && cJSON_IsNumber(av[0]))
            b = av[0]->valuedouble;
        else if (npos >= 2 && cJSON_IsNumber(av[0]) && cJSON_IsNumber(av[1])) {
            a = av[0]->valuedouble;
            b = av[1]->valuedouble;
            if (npos == 3 && cJSON_IsNumber(av[2]))
                s = av[2]->valuedouble;
        }
        double cnt = s ? ceil((b - a) / s) : NAN; /* by count: x += s can stand still on large x */
        if (!(cnt <= 1e6)) {
            eval_fail(E, "template: range() of more than a million items or with step %s", "0");
            return NULL;
        }
        long items = cnt > 0 ? (long)cnt : 0;
        cJSON *r = new_array(E);
        for (long i = 0; r && i < items; i++)
            cJSON_AddItemToArray(r, cJSON_CreateNumber(a + (double)i * s));
        if (r)
            spend(E, (size_t)items * sizeof(cJSON));
        return r;
    }
    if (!strcmp(fn->name, "raise_exception")) {
        E->err->code = 0;
        dsv4_fail(E->err, DSV4_E_ARG, "template raised: %s", npos && cJSON_IsString(av[0]) ? av[0]->valuestring : "(no message)");
        return NULL;
    }
    eval_fail(E, "template: function \"%s\" is not supported", fn->name);
    return NULL;
}

static cJSON *eval_bin(env *E, const node *n)
{
    const char *op = n->name;
    cJSON *a = eval(E, n->kid[0]), *b = eval(E, n->kid[1]);
    if (E->err->code)
        return NULL;
    if (!strcmp(op, "==") || !strcmp(op, "!="))
        return own(E, cJSON_CreateBool(equal(a, b) == (op[0] == '=')));
    if (!strcmp(op, "in")) {
        int r = 0;
        if (cJSON_IsString(b) && cJSON_IsString(a))
            r = strstr(b->valuestring, a->valuestring) != NULL;
        else if (cJSON_IsArray(b)) {
            const cJSON *e;
            cJSON_ArrayForEach(e, b) r |= equal(a, e);
        } else if (cJSON_IsObject(b) && cJSON_IsString(a))
            r = cJSON_GetObjectItemCaseSensitive(b, a->valuestring) != NULL;
        return own(E, cJSON_CreateBool(r != n->neg));
    }
    if (!strcmp(op, "~")) {
        dsv4_buf s = {0};
        dsv4_buf_put(&s, "", 0);
        print_val(&s, a);
        print_val(&s, b);
        cJSON *r = s.oom ? NULL : own(E, cJSON_CreateString(s.p));
        dsv4_buf_free(&s);
        return r;
    }
    if (!strcmp(op, "+") && cJSON_IsString(a) && cJSON_IsString(b)) {
        size_t x = strlen(a->valuestring), y = strlen(b->valuestring);
        char *s = malloc(x + y + 1);
        if (!s)
            return NULL;
        memcpy(s, a->valuestring, x);
        memcpy(s + x, b->valuestring, y + 1);
        cJSON *r = own(E, cJSON_CreateString(s));
        free(s);
        return r;
    }
    if (!strcmp(op, "+") && cJSON_IsArray(a) && cJSON_IsArray(b)) {
        cJSON *r = new_array(E);
        const cJSON *e;
        cJSON_ArrayForEach(e, a) append(E, r, e);
        cJSON_ArrayForEach(e, b) append(E, r, e);
        return r;
    }
    if (cJSON_IsString(a) && cJSON_IsString(b) && op[0] && strchr("<>", op[0])) {
        int c = strcmp(a->valuestring, b->valuestring);
        int r = op[0] == '<' ? (op[1] ? c <= 0 : c < 0) : (op[1] ? c >= 0 : c > 0);
        return own(E, cJSON_CreateBool(r));
    }
    if (!cJSON_IsNumber(a) || !cJSON_IsNumber(b)) {
        eval_fail(E, "template: operator \"%s\" needs numbers here", op);
        return NULL;
    }
    double x = a->valuedouble, y = b->valuedouble, r;
    if (!strcmp(op, "<"))
        return own(E, cJSON_CreateBool(x < y));
    if (!strcmp(op, ">"))
        return own(E, cJSON_CreateBool(x > y));
    if (!strcmp(op, "<="))
        return own(E, cJSON_CreateBool(x <= y));
    if (!strcmp(op, ">="))
        return own(E, cJSON_CreateBool(x >= y));
    if (!strcmp(op, "+"))
        r = x + y;
    else if (!strcmp(op, "-"))
        r = x - y;
    else if (!strcmp(op, "*"))
        r = x * y;
    else if (y == 0) {
        eval_fail(E, "template: division by zero%s", "");
        return NULL;
    } else if (!strcmp(op, "/"))
        r = x / y;
    else if (!strcmp(op, "//"))
        r = floor(x / y);
    else
        r = x - y * floor(x / y);
    return own(E, cJSON_CreateNumber(r));
}

static cJSON *eval(env *E, const node *n)
{
    if (E->err->code || !n)
        return NULL;
    switch (n->kind) {
    case E_LIT:
        return n->lit;
    case E_NAME: {
        cJSON *v = getvar(E, n->name);
        return v ? v : &undef_marker;
    }
    case E_ATTR:
    case E_INDEX: {
        cJSON *o = eval(E, n->kid[0]);
        if (E->err->code)
            return NULL;
        if (n->kind == E_ATTR) {
            cJSON *v = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, n->name) : NULL;
            return v ? v : &undef_marker;
        }
        cJSON *k = eval(E, n->kid[1]);
        if (E->err->code)
            return NULL;
        if (cJSON_IsObject(o) && cJSON_IsString(k)) {
            cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k->valuestring);
            return v ? v : &undef_marker;
        }
        if (cJSON_IsNumber(k) && (cJSON_IsArray(o) || cJSON_IsString(o))) {
            int len = cJSON_IsArray(o) ? cJSON_GetArraySize(o) : (int)strlen(o->valuestring);
            int i = to_index(k->valuedouble);
            if (i < 0)
                i += len;
            if (i < 0 || i >= len)
                return &undef_marker;
            return cJSON_IsArray(o) ? cJSON_GetArrayItem(o, i) : str_val(E, o->valuestring + i, 1);
        }
        return &undef_marker;
    }
    case E_SLICE: {
        cJSON *o = eval(E, n->kid[0]);
        if (E->err->code)
            return NULL;
        int str = cJSON_IsString(o);
        if (!str && !cJSON_IsArray(o)) {
            eval_fail(E, "template: slicing needs a list or a string%s", "");
            return NULL;
        }
        int len = str ? (int)strlen(o->valuestring) : cJSON_GetArraySize(o), a = 0, b = 0, step = 1;
        if (slice_bounds(E, n, len, &a, &b, &step))
            return NULL;
        if (str) {
            dsv4_buf s = {0};
            dsv4_buf_put(&s, "", 0);
            for (int i = a; step > 0 ? i < b : i > b; i += step)
                dsv4_buf_put(&s, o->valuestring + i, 1);
            cJSON *r = s.oom ? NULL : own(E, cJSON_CreateString(s.p));
            dsv4_buf_free(&s);
            return r;
        }
        cJSON *r = new_array(E);
        for (int i = a; r && (step > 0 ? i < b : i > b); i += step)
            append(E, r, cJSON_GetArrayItem(o, i));
        return r;
    }
    case E_CALL:
        return eval_call(E, n);
    case E_FILTER: {
        cJSON *v = eval(E, n->kid[0]);
        return E->err->code ? NULL : apply_filter(E, n, v);
    }
    case E_TEST:
        return eval_test(E, n);
    case E_NOT: {
        cJSON *v = eval(E, n->kid[0]);
        return E->err->code ? NULL : own(E, cJSON_CreateBool(!truthy(v)));
    }
    case E_NEG: {
        cJSON *v = eval(E, n->kid[0]);
        if (!cJSON_IsNumber(v)) {
            eval_fail(E, "template: unary minus needs a number%s", "");
            return NULL;
        }
        return own(E, cJSON_CreateNumber(-v->valuedouble));
    }
    case E_BIN:
        return eval_bin(E, n);
    case E_AND:
    case E_OR: {
        cJSON *a = eval(E, n->kid[0]);
        if (E->err->code)
            return NULL;
        if (truthy(a) == (n->kind == E_OR))
            return a;
        return eval(E, n->kid[1]);
    }
    case E_COND: {
        cJSON *c = eval(E, n->kid[0]);
        if (E->err->code)
            return NULL;
        if (truthy(c))
            return eval(E, n->kid[1]);
        return n->nkid > 2 ? eval(E, n->kid[2]) : &undef_marker;
    }
    case E_LIST: {
        cJSON *r = new_array(E);
        for (int i = 0; r && i < n->nkid; i++) {
            cJSON *v = eval(E, n->kid[i]);
            if (E->err->code)
                return NULL;
            append(E, r, v);
        }
        return r;
    }
    case E_DICT: {
        cJSON *r = own(E, cJSON_CreateObject());
        for (int i = 0; r && i + 1 < n->nkid; i += 2) {
            cJSON *k = eval(E, n->kid[i]), *v = eval(E, n->kid[i + 1]);
            if (E->err->code)
                return NULL;
            if (!cJSON_IsString(k)) {
                eval_fail(E, "template: dict keys must be strings%s", "");
                return NULL;
            }
            cJSON_AddItemToObject(r, k->valuestring, is_undef(v) ? cJSON_CreateNull() : cJSON_Duplicate(v, 1));
        }
        return r;
    }
    default:
        eval_fail(E, "template: bad expression%s", "");
        return NULL;
    }
}

static int run(env *E, const node *b, int frame);

static int run_for(env *E, const node *n, int frame)
{
    const node *targets = n->kid[0];
    cJSON *it = eval(E, n->kid[1]);
    if (E->err->code)
        return E->err->code;
    cJSON *items = it;
    if (cJSON_IsObject(it)) { /* iterating a dict gives its keys */
        items = new_array(E);
        const cJSON *e;
        cJSON_ArrayForEach(e, it) cJSON_AddItemToArray(items, cJSON_CreateString(e->string));
    } else if (is_undef(it) || cJSON_IsNull(it))
        items = NULL;
    else if (!cJSON_IsArray(it))
        return eval_fail(E, "template: cannot loop over this value%s", "");
    int len = cJSON_GetArraySize(items), i = 0;
    if (len == 0) {
        if (n->nkid > 3)
            return run(E, n->kid[3], frame);
        return 0;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, items)
    {
        int f = E->n;
        cJSON *loop = own(E, cJSON_CreateObject());
        if (!loop)
            return dsv4_fail(E->err, DSV4_E_NOMEM, "out of memory");
        cJSON_AddNumberToObject(loop, "index0", i);
        cJSON_AddNumberToObject(loop, "index", i + 1);
        cJSON_AddNumberToObject(loop, "revindex", len - i);
        cJSON_AddNumberToObject(loop, "revindex0", len - i - 1);
        cJSON_AddBoolToObject(loop, "first", i == 0);
        cJSON_AddBoolToObject(loop, "last", i == len - 1);
        cJSON_AddNumberToObject(loop, "length", len);
        spend(E, json_size(loop));
        if (setvar(E, f, "loop", loop))
            return E->err->code;
        if (targets->nkid == 1) {
            if (setvar(E, f, targets->kid[0]->name, (cJSON *)e))
                return E->err->code;
        } else {
            for (int k = 0; k < targets->nkid; k++) {
                cJSON *x = cJSON_GetArrayItem(e, k);
                if (setvar(E, f, targets->kid[k]->name, x ? x : &undef_marker))
                    return E->err->code;
            }
        }
        int rc = run(E, n->kid[2], f);
        E->n = f;
        if (rc)
            return rc;
        i++;
    }
    return 0;
}

/* Runs a block; `frame` is where the innermost loop's variables start (set writes there). */
static int run(env *E, const node *b, int frame)
{
    for (int i = 0; i < b->nkid && !E->err->code; i++) {
        const node *n = b->kid[i];
        switch (n->kind) {
        case S_TEXT: {
            size_t was = E->out.n;
            dsv4_buf_puts(&E->out, n->name);
            spend(E, E->out.n - was);
            break;
        }
        case S_OUT: {
            cJSON *v = eval(E, n->kid[0]);
            size_t was = E->out.n;
            if (!E->err->code)
                print_val(&E->out, v);
            spend(E, E->out.n - was);
            break;
        }
        case S_IF:
            for (int k = 0; k + 1 < n->nkid; k += 2) {
                cJSON *c = eval(E, n->kid[k]);
                if (E->err->code)
                    break;
                if (truthy(c)) {
                    run(E, n->kid[k + 1], frame);
                    break;
                }
            }
            break;
        case S_FOR:
            run_for(E, n, frame);
            break;
        case S_SET: {
            cJSON *v = eval(E, n->kid[1]);
            if (E->err->code)
                break;
            if (n->name) {
                cJSON *ns = getvar(E, n->kid[0]->name);
                if (!cJSON_IsObject(ns)) {
                    eval_fail(E, "template: \"%s\" is not a namespace", n->kid[0]->name);
                    break;
                }
                cJSON *c = is_undef(v) ? cJSON_CreateNull() : cJSON_Duplicate(v, 1);
                if (cJSON_GetObjectItemCaseSensitive(ns, n->name))
                    cJSON_ReplaceItemInObjectCaseSensitive(ns, n->name, c);
                else
                    cJSON_AddItemToObject(ns, n->name, c);
            } else
                setvar(E, frame, n->kid[0]->name, v ? v : &undef_marker);
            break;
        }
        default:
            break;
        }
    }
    return E->err->code;
}

int dsv4_jinja_render(const char *tmpl, const cJSON *ctx, char **out, size_t *out_len, dsv4_err *err)
{
    dsv4_err_clear(err);
    lexer L = {0};
    parser P = {.L = &L, .err = err};
    env E = {.err = err};
    int rc = lex(&L, tmpl, err);
    node *root = rc ? NULL : block(&P, NULL);
    if (!rc && !root)
        rc = err->code ? err->code : dsv4_fail(err, DSV4_E_FORMAT, "template: cannot be parsed");
    if (!rc) {
        dsv4_buf_put(&E.out, "", 0);
        const cJSON *v;
        cJSON_ArrayForEach(v, ctx) setvar(&E, 0, v->string, (cJSON *)v);
        rc = run(&E, root, 0);
        if (!rc && E.out.oom)
            rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    }
    if (!rc) {
        *out = E.out.p;
        *out_len = E.out.n;
    } else
        dsv4_buf_free(&E.out);
    for (int i = 0; i < E.ntmp; i++)
        cJSON_Delete(E.tmp[i]);
    free(E.tmp);
    free(E.vars);
    free_nodes(&P);
    lexer_free(&L);
    return rc;
}
