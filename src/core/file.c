#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"

char *dsv4_read_file(const char *path, size_t *len, dsv4_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        dsv4_fail(err, DSV4_E_IO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0, k;
    char *b = malloc(cap);
    while (b && (k = fread(b + n, 1, cap - n - 1, f)) > 0) {
        n += k;
        if (n + 1 == cap) {
            char *q = realloc(b, cap *= 2);
            if (!q)
                free(b);
            b = q;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (!b || bad) {
        free(b);
        dsv4_fail(err, b ? DSV4_E_IO : DSV4_E_NOMEM, "%s: %s", path, b ? "read failed" : "out of memory reading it");
        return NULL;
    }
    b[n] = 0;
    if (len)
        *len = n;
    return b;
}
