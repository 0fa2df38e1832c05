/* buf — a growable byte string for the text layer. An allocation failure sets `oom` and turns
 * later appends into no-ops, so builders check once at the end. */
#ifndef DSV4_TEXT_BUF_H
#define DSV4_TEXT_BUF_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct dsv4_buf {
    char *p; /* NUL-terminated once anything was appended */
    size_t n, cap;
    int oom;
} dsv4_buf;

static inline void dsv4_buf_put(dsv4_buf *b, const void *s, size_t n)
{
    if (b->oom || n > (SIZE_MAX - 64) / 2 - b->n) { /* the doubled size would wrap */
        b->oom = 1;
        return;
    }
    if (b->n + n + 1 > b->cap) {
        size_t c = (b->n + n + 1) * 2 + 32;
        char *q = (char *)realloc(b->p, c);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = c;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static inline void dsv4_buf_puts(dsv4_buf *b, const char *s) { dsv4_buf_put(b, s, strlen(s)); }

static inline void dsv4_buf_free(dsv4_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

#endif
