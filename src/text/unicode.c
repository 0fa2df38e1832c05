#include <stdlib.h>
#include <string.h>
#include "text/unicode.h"

/* Code points that the Rust peer (tokenizers 0.23.2, Unicode 16) puts in each class and PCRE2
 * 10.42 (Unicode 14) leaves unassigned: found by comparing every code point's class in the two
 * libraries (tests/node/unicode_classes.cjs writes the peer's side). None goes the other way. */
static const struct {
    char cls;
    const char *ranges;
} extra[] = {
    {'L', "\\x{1c89}-\\x{1c8a}\\x{a7cb}-\\x{a7cd}\\x{a7da}-\\x{a7dc}\\x{105c0}-\\x{105f3}"
             "\\x{10d4a}-\\x{10d65}\\x{10d6f}-\\x{10d85}\\x{10ec2}-\\x{10ec4}\\x{1123f}-\\x{11240}"
             "\\x{11380}-\\x{11389}\\x{1138b}\\x{1138e}\\x{11390}-\\x{113b5}\\x{113b7}\\x{113d1}"
             "\\x{113d3}\\x{11bc0}-\\x{11be0}\\x{11f02}\\x{11f04}-\\x{11f10}\\x{11f12}-\\x{11f33}"
             "\\x{1342f}\\x{13441}-\\x{13446}\\x{13460}-\\x{143fa}\\x{16100}-\\x{1611d}"
             "\\x{16d40}-\\x{16d6c}\\x{18cff}\\x{1b132}\\x{1b155}\\x{1df25}-\\x{1df2a}"
             "\\x{1e030}-\\x{1e06d}\\x{1e4d0}-\\x{1e4eb}\\x{1e5d0}-\\x{1e5ed}\\x{1e5f0}\\x{2b739}"
             "\\x{2ebf0}-\\x{2ee5d}\\x{31350}-\\x{323af}"},
    {'M', "\\x{897}\\x{cf3}\\x{ece}\\x{10d69}-\\x{10d6d}\\x{10efc}-\\x{10eff}\\x{11241}"
             "\\x{113b8}-\\x{113c0}\\x{113c2}\\x{113c5}\\x{113c7}-\\x{113ca}\\x{113cc}-\\x{113d0}"
             "\\x{113d2}\\x{113e1}-\\x{113e2}\\x{11f00}-\\x{11f01}\\x{11f03}\\x{11f34}-\\x{11f3a}"
             "\\x{11f3e}-\\x{11f42}\\x{11f5a}\\x{13440}\\x{13447}-\\x{13455}\\x{1611e}-\\x{1612f}"
             "\\x{1e08f}\\x{1e4ec}-\\x{1e4ef}\\x{1e5ee}-\\x{1e5ef}"},
    {'N', "\\x{10d40}-\\x{10d49}\\x{116d0}-\\x{116e3}\\x{11bf0}-\\x{11bf9}\\x{11f50}-\\x{11f59}"
             "\\x{16130}-\\x{16139}\\x{16d70}-\\x{16d79}\\x{1ccf0}-\\x{1ccf9}\\x{1d2c0}-\\x{1d2d3}"
             "\\x{1e4f0}-\\x{1e4f9}\\x{1e5f1}-\\x{1e5fa}"},
    {'P', "\\x{1b4e}-\\x{1b4f}\\x{1b7f}\\x{10d6e}\\x{113d4}-\\x{113d5}\\x{113d7}-\\x{113d8}"
             "\\x{11b00}-\\x{11b09}\\x{11be1}\\x{11f43}-\\x{11f4f}\\x{16d6d}-\\x{16d6f}\\x{1e5ff}"},
    {'S', "\\x{2427}-\\x{2429}\\x{2ffc}-\\x{2fff}\\x{31e4}-\\x{31e5}\\x{31ef}\\x{10d8e}-\\x{10d8f}"
             "\\x{1cc00}-\\x{1ccef}\\x{1cd00}-\\x{1ceb3}\\x{1f6dc}\\x{1f774}-\\x{1f776}"
             "\\x{1f77b}-\\x{1f77f}\\x{1f7d9}\\x{1f8b2}-\\x{1f8bb}\\x{1f8c0}-\\x{1f8c1}"
             "\\x{1fa75}-\\x{1fa77}\\x{1fa87}-\\x{1fa89}\\x{1fa8f}\\x{1faad}-\\x{1faaf}"
             "\\x{1fabb}-\\x{1fabf}\\x{1fac6}\\x{1face}-\\x{1facf}\\x{1fada}-\\x{1fadc}\\x{1fadf}"
             "\\x{1fae8}-\\x{1fae9}\\x{1faf7}-\\x{1faf8}\\x{1fbcb}-\\x{1fbef}"},
};

/* White_Space as Unicode 16 has it (PCRE2 10.42's \s adds U+180E). */
static const char white_space[] = "\\t\\n\\x{b}\\f\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}"
                                  "\\x{202f}\\x{205f}\\x{3000}";

typedef struct obuf {
    char *p;
    size_t n, cap;
    int oom;
} obuf;

static void put(obuf *o, const char *s, size_t n)
{
    if (o->oom)
        return;
    if (o->n + n + 1 > o->cap) {
        size_t c = (o->n + n + 1) * 2;
        char *q = realloc(o->p, c);
        if (!q) {
            o->oom = 1;
            return;
        }
        o->p = q;
        o->cap = c;
    }
    memcpy(o->p + o->n, s, n);
    o->n += n;
    o->p[o->n] = 0;
}

static void puts_(obuf *o, const char *s) { put(o, s, strlen(s)); }

static const char *extra_for(char cls)
{
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++)
        if (extra[i].cls == cls)
            return extra[i].ranges;
    return NULL;
}

char *dsv4_regex_adapt(const char *pat)
{
    obuf o = {0};
    put(&o, "", 0);
    int in_class = 0;
    for (const char *p = pat; *p;) {
        if (*p == '\\' && p[1]) {
            char e = p[1];
            if (e == 'p' || e == 'P') {
                /* \pX or \p{X}: a one-letter general category gets the extra ranges */
                const char *q = p + 2;
                char name[32];
                size_t k = 0;
                if (*q == '{') {
                    q++;
                    while (*q && *q != '}' && k < sizeof name - 1)
                        name[k++] = *q++;
                    if (*q == '}')
                        q++;
                } else if (*q)
                    name[k++] = *q++;
                name[k] = 0;
                const char *x = k == 1 ? extra_for(name[0]) : NULL;
                if (!x || (e == 'P' && in_class)) {
                    put(&o, p, (size_t)(q - p));
                } else if (in_class) {
                    put(&o, p, (size_t)(q - p));
                    puts_(&o, x);
                } else {
                    puts_(&o, e == 'p' ? "[\\p{" : "[^\\p{");
                    puts_(&o, name);
                    puts_(&o, "}");
                    puts_(&o, x);
                    puts_(&o, "]");
                }
                p = q;
                continue;
            }
            if (e == 's' || e == 'S') {
                if (in_class && e == 's')
                    puts_(&o, white_space);
                else if (in_class)
                    puts_(&o, "\\S\\x{180e}");
                else {
                    puts_(&o, e == 's' ? "[" : "[^");
                    puts_(&o, white_space);
                    puts_(&o, "]");
                }
                p += 2;
                continue;
            }
            put(&o, p, 2);
            p += 2;
            continue;
        }
        if (!in_class && *p == '[') {
            in_class = 1;
            put(&o, p++, 1);
            if (*p == '^')
                put(&o, p++, 1);
            if (*p == ']') /* a leading ']' is a literal */
                put(&o, p++, 1);
            continue;
        }
        if (in_class && *p == '[' && p[1] == ':') {
            const char *q = strstr(p, ":]");
            size_t n = q ? (size_t)(q + 2 - p) : 2;
            put(&o, p, n);
            p += n;
            continue;
        }
        if (in_class && *p == ']')
            in_class = 0;
        put(&o, p++, 1);
    }
    if (o.oom) {
        free(o.p);
        return NULL;
    }
    return o.p;
}
