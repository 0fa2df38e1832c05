#include <stdlib.h>
#include <string.h>
#include "text/tokenizer.h"

int dsv4_utf8_decode1(const unsigned char *s, size_t len, uint32_t *cp)
{
    if (len == 0)
        return 0;
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int n;
    uint32_t v;
    unsigned lo = 0x80, hi = 0xbf; /* allowed range of the second byte (excludes overlongs and surrogates) */
    if (c >= 0xc2 && c <= 0xdf) {
        n = 2;
        v = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        v = c & 0x0f;
        if (c == 0xe0)
            lo = 0xa0;
        else if (c == 0xed)
            hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        v = c & 0x07;
        if (c == 0xf0)
            lo = 0x90;
        else if (c == 0xf4)
            hi = 0x8f;
    } else {
        return 0;
    }
    if (len < (size_t)n)
        return 0;
    if (s[1] < lo || s[1] > hi)
        return 0;
    v = (v << 6) | (s[1] & 0x3f);
    for (int i = 2; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        v = (v << 6) | (s[i] & 0x3f);
    }
    *cp = v;
    return n;
}

size_t dsv4_utf8_invalid_len(const unsigned char *s, size_t len)
{
    unsigned c = s[0];
    size_t need;
    unsigned lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf)
        need = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        need = 3;
        if (c == 0xe0)
            lo = 0xa0;
        else if (c == 0xed)
            hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 4;
        if (c == 0xf0)
            lo = 0x90;
        else if (c == 0xf4)
            hi = 0x8f;
    } else
        return 1;
    size_t k = 1;
    if (k < len && k < need && s[k] >= lo && s[k] <= hi) {
        k++;
        while (k < len && k < need && (s[k] & 0xc0) == 0x80)
            k++;
    }
    return k;
}

size_t dsv4_utf8_valid_prefix(const unsigned char *s, size_t len, int *incomplete)
{
    size_t i = 0;
    *incomplete = 0;
    while (i < len) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int n = dsv4_utf8_decode1(s + i, len - i, &cp);
        if (n == 0) {
            size_t k = dsv4_utf8_invalid_len(s + i, len - i);
            if (i + k == len && k < 4) {
                /* a truncated but so far well-formed sequence at the very end */
                unsigned c = s[i];
                size_t need = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
                if (c >= 0xc2 && c <= 0xf4 && k < need)
                    *incomplete = 1;
            }
            return i;
        }
        i += (size_t)n;
    }
    return i;
}

char *dsv4_utf8_sanitize(const char *s, size_t len, size_t *out_len)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t cap = len + 1, n = 0;
    char *o = malloc(cap);
    if (!o)
        return NULL;
    size_t i = 0;
    while (i < len) {
        int inc;
        size_t ok = dsv4_utf8_valid_prefix(u + i, len - i, &inc);
        if (n + ok + 4 > cap) {
            cap = (n + ok + 4) * 2;
            char *p = realloc(o, cap);
            if (!p) {
                free(o);
                return NULL;
            }
            o = p;
        }
        memcpy(o + n, u + i, ok);
        n += ok;
        i += ok;
        if (i < len) {
            i += dsv4_utf8_invalid_len(u + i, len - i);
            memcpy(o + n, "\xef\xbf\xbd", 3);
            n += 3;
        }
    }
    o[n] = 0;
    *out_len = n;
    return o;
}
