/* JSON string values for the line-oriented commands. cJSON strings end at the first NUL, so a
 * "\u0000" in the text would be cut short; these helpers carry explicit lengths instead. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"

static int hex4(const char *p, unsigned *v)
{
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return -1;
        *v = *v * 16 + (unsigned)d;
    }
    return 0;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | cp >> 12);
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | cp >> 18);
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

int cli_json_string_parse(const char *line, size_t n, char **out, size_t *out_len)
{
    size_t i = 0;
    while (i < n && (line[i] == ' ' || line[i] == '\t'))
        i++;
    if (i >= n || line[i] != '"')
        return -1;
    i++;
    char *o = malloc(n + 1); /* decoding never grows the text */
    if (!o)
        return -1;
    size_t k = 0;
    for (;;) {
        if (i >= n)
            goto bad;
        char c = line[i++];
        if (c == '"')
            break;
        if (c != '\\') {
            o[k++] = c;
            continue;
        }
        if (i >= n)
            goto bad;
        c = line[i++];
        switch (c) {
        case '"': o[k++] = '"'; break;
        case '\\': o[k++] = '\\'; break;
        case '/': o[k++] = '/'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'n': o[k++] = '\n'; break;
        case 'r': o[k++] = '\r'; break;
        case 't': o[k++] = '\t'; break;
        case 'u': {
            unsigned v, w;
            if (i + 4 > n || hex4(line + i, &v))
                goto bad;
            i += 4;
            if (v >= 0xd800 && v <= 0xdbff && i + 6 <= n && line[i] == '\\' && line[i + 1] == 'u' && !hex4(line + i + 2, &w) &&
                w >= 0xdc00 && w <= 0xdfff) {
                v = 0x10000 + ((v - 0xd800) << 10) + (w - 0xdc00);
                i += 6;
            } else if (v >= 0xd800 && v <= 0xdfff) {
                v = 0xfffd; /* a lone surrogate has no UTF-8 form */
            }
            k += put_utf8(o + k, v);
            break;
        }
        default:
            goto bad;
        }
    }
    while (i < n && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r' || line[i] == '\n'))
        i++;
    if (i != n)
        goto bad;
    o[k] = 0;
    *out = o;
    *out_len = k;
    return 0;
bad:
    free(o);
    return -1;
}

void cli_json_string_write(FILE *f, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\b': fputs("\\b", f); break;
        case '\f': fputs("\\f", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        default:
            if (c < 0x20) {
                fputs("\\u00", f);
                fputc(hex[c >> 4], f);
                fputc(hex[c & 15], f);
            } else
                fputc(c, f);
        }
    }
    fputc('"', f);
}

int cli_lines(int (*fn)(void *ctx, const char *line, size_t n, long lineno), void *ctx)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long lineno = 0;
    int rc = 0;
    while (!rc && (n = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        if (strspn(line, " \t\r\n") != (size_t)n)
            rc = fn(ctx, line, (size_t)n, lineno) ? 1 : 0;
    }
    free(line);
    return rc;
}

typedef struct string_lines {
    const char *cmd;
    int (*fn)(void *ctx, const char *s, size_t len, long lineno);
    void *ctx;
} string_lines;

static int string_line(void *ctx, const char *line, size_t n, long lineno)
{
    const string_lines *c = ctx;
    char *s;
    size_t len;
    if (cli_json_string_parse(line, n, &s, &len)) {
        fprintf(stderr, "dsv4 %s: line %ld is not a JSON string\n", c->cmd, lineno);
        return 1;
    }
    int rc = c->fn(c->ctx, s, len, lineno);
    free(s);
    return rc;
}

int cli_json_lines(const char *cmd, int (*fn)(void *ctx, const char *s, size_t len, long lineno), void *ctx)
{
    string_lines c = {cmd, fn, ctx};
    return cli_lines(string_line, &c);
}
