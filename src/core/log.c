#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include "core/core.h"

double dsv4_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void dsv4_log(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

void dsv4_progress_begin(dsv4_progress *p, const char *label, uint64_t total, int enabled)
{
    p->label = label;
    p->total = total;
    p->done = 0;
    p->t0 = p->last = dsv4_now();
    p->enabled = enabled && isatty(2);
}

void dsv4_progress_step(dsv4_progress *p, uint64_t add)
{
    p->done += add;
    if (!p->enabled)
        return;
    double t = dsv4_now();
    if (t - p->last < 0.1 && p->done < p->total)
        return;
    p->last = t;
    fprintf(stderr, "\r%s %llu/%llu (%.0f%%) %.1fs", p->label, (unsigned long long)p->done,
            (unsigned long long)p->total, p->total ? 100.0 * p->done / p->total : 100.0, t - p->t0);
}

void dsv4_progress_end(dsv4_progress *p)
{
    if (p->enabled)
        fprintf(stderr, "\r%s %llu/%llu done in %.2fs\n", p->label, (unsigned long long)p->done,
                (unsigned long long)p->total, dsv4_now() - p->t0);
}
