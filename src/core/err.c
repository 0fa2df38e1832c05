#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include "core/core.h"

int dsv4_fail(dsv4_err *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

int dsv4_err_prefix(dsv4_err *err, const char *fmt, ...)
{
    if (!err)
        return DSV4_E_ARG;
    char head[512], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    snprintf(err->msg, sizeof err->msg, "%.500s: %.500s", head, old);
    return err->code;
}

void dsv4_err_clear(dsv4_err *err)
{
    if (err) {
        err->code = 0;
        err->msg[0] = 0;
    }
}

void *dsv4_xmalloc(size_t n, dsv4_err *err)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        dsv4_fail(err, DSV4_E_NOMEM, "out of memory allocating %zu bytes", n);
    return p;
}

void *dsv4_xcalloc(size_t n, size_t sz, dsv4_err *err)
{
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p)
        dsv4_fail(err, DSV4_E_NOMEM, "out of memory allocating %zu x %zu bytes", n, sz);
    return p;
}

const char *dsv4_version(void) { return "0.1.0"; }
