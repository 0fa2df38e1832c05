/* PCRE2 with the adapted classes must classify every code point as the peer tokenizer does.
 * tests/data/unicode_classes_hf.txt is the peer's side (tests/node/unicode_classes.cjs). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include "check.h"
#include "text/unicode.h"

static unsigned char peer[6][0x110000];
static const char classes[] = "LMNPSs";

static int utf8(unsigned c, unsigned char *b)
{
    if (c < 0x80) {
        b[0] = (unsigned char)c;
        return 1;
    }
    if (c < 0x800) {
        b[0] = (unsigned char)(0xc0 | c >> 6);
        b[1] = (unsigned char)(0x80 | (c & 63));
        return 2;
    }
    if (c < 0x10000) {
        b[0] = (unsigned char)(0xe0 | c >> 12);
        b[1] = (unsigned char)(0x80 | ((c >> 6) & 63));
        b[2] = (unsigned char)(0x80 | (c & 63));
        return 3;
    }
    b[0] = (unsigned char)(0xf0 | c >> 18);
    b[1] = (unsigned char)(0x80 | ((c >> 12) & 63));
    b[2] = (unsigned char)(0x80 | ((c >> 6) & 63));
    b[3] = (unsigned char)(0x80 | (c & 63));
    return 4;
}

static pcre2_code *compile(const char *pat)
{
    char *a = dsv4_regex_adapt(pat);
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = a ? pcre2_compile((PCRE2_SPTR)a, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL) : NULL;
    free(a);
    return re;
}

static int matches(pcre2_code *re, pcre2_match_data *md, unsigned c)
{
    unsigned char b[4];
    int n = utf8(c, b);
    return pcre2_match(re, b, (size_t)n, 0, 0, md, NULL) >= 0;
}

int main(void)
{
    FILE *f = fopen("tests/data/unicode_classes_hf.txt", "r");
    CHECK(f != NULL, "tests/data/unicode_classes_hf.txt is missing");
    if (!f)
        return check_summary("unicode");
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        const char *k = strchr(classes, line[0]);
        if (!k || !line[0])
            continue;
        char *p = line + 2;
        while (*p && *p != '\n') {
            unsigned long a = strtoul(p, &p, 16), b = a;
            if (*p == '-')
                b = strtoul(p + 1, &p, 16);
            for (unsigned long c = a; c <= b && c < 0x110000; c++)
                peer[k - classes][c] = 1;
            if (*p == ',')
                p++;
        }
    }
    free(line);
    fclose(f);

    /* each class alone, inside a bracket class, negated, and \S, as the patterns use them */
    const char *pats[6][3] = {
        {"^\\p{L}$", "^[x\\p{L}]$", "^\\P{L}$"}, {"^\\p{M}$", "^[x\\p{M}]$", "^\\P{M}$"},
        {"^\\p{N}$", "^[x\\p{N}]$", "^\\P{N}$"}, {"^\\p{P}$", "^[x\\p{P}]$", "^\\P{P}$"},
        {"^\\p{S}$", "^[x\\p{S}]$", "^\\P{S}$"}, {"^\\s$", "^[x\\s]$", "^\\S$"},
    };
    pcre2_match_data *md = pcre2_match_data_create(4, NULL);
    for (int k = 0; k < 6; k++) {
        pcre2_code *re[3];
        for (int v = 0; v < 3; v++)
            re[v] = compile(pats[k][v]);
        CHECK(re[0] && re[1] && re[2], "class %c: pattern does not compile", classes[k]);
        if (!re[0] || !re[1] || !re[2])
            continue;
        long bad[3] = {0, 0, 0};
        unsigned first[3] = {0, 0, 0};
        for (unsigned c = 0; c < 0x110000; c++) {
            if ((c >= 0xd800 && c <= 0xdfff) || c == 1) /* 1 is the peer dump's separator */
                continue;
            int want = peer[k][c];
            int got[3] = {matches(re[0], md, c), matches(re[1], md, c) && c != 'x', !matches(re[2], md, c)};
            if (c == 'x')
                got[1] = want;
            for (int v = 0; v < 3; v++)
                if (got[v] != want && !bad[v]++)
                    first[v] = c;
        }
        for (int v = 0; v < 3; v++) {
            CHECK(bad[v] == 0, "%s: %ld code points classified unlike the peer (first U+%04X)", pats[k][v], bad[v], first[v]);
            pcre2_code_free(re[v]);
        }
    }
    pcre2_match_data_free(md);
    return check_summary("unicode");
}
