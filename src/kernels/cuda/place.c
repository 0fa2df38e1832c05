/* The CUDA loader's placement (the table's place and unplace): the plan of kernels/place.h
 * against the device memory free now, then the uploads it admits. */
#include <stdio.h>
#include <stdlib.h>
#include "core/core.h"
#include "kernels/cuda/cuda.h"
#include "kernels/place.h"

/* "123", "64K", "1.5G" (binary units) as bytes; -1 when malformed. */
static double parse_bytes(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    double u = 1;
    switch (*end) {
    case 'K': case 'k': u = 1024.0; end++; break;
    case 'M': case 'm': u = 1048576.0; end++; break;
    case 'G': case 'g': u = 1073741824.0; end++; break;
    case 'T': case 't': u = 1099511627776.0; end++; break;
    default: break;
    }
    return end == s || *end || v < 0 ? -1 : v * u;
}

/* Device memory kept free at load for what is allocated later: the step arena (a prefill
 * chunk's activations), the ops' grow-only buffers, the CUDA context's own growth. */
#define CUDA_RESERVE ((size_t)1 << 30)

size_t dsv4_cuda_state_room(void)
{
    size_t fr = 0, tot = 0;
    dsv4_err err = {0};
    if (dsv4_cuda_mem(&fr, &tot, &err))
        return 0;
    return fr > CUDA_RESERVE ? fr - CUDA_RESERVE : 0;
}

/* Host memory kept free at load beside the pinned weights: the process's own buffers, caches
 * that live in host memory (V4.1's), the mapped checkpoint's working pages. */
#define HOST_RESERVE ((size_t)2 << 30)

/* *v lowered to the bytes environment variable `name` gives (K/M/G/T suffixes) when that is
 * smaller; *set says whether it was given. */
static int env_bound(const char *name, size_t *v, int *set, dsv4_err *err)
{
    const char *s = getenv(name);
    *set = s && *s;
    if (!*set)
        return 0;
    double b = parse_bytes(s);
    if (b < 0)
        return dsv4_fail(err, DSV4_E_ARG, "%s='%s': expected bytes, optionally with K, M, G or T", name, s);
    if (b < (double)*v)
        *v = (size_t)b;
    return 0;
}

/* The host memory the pinned copies may take: MemAvailable (/proc/meminfo) less HOST_RESERVE,
 * (size_t)-1 where it cannot be read; DSV4_HOST_BUDGET when smaller. */
static int host_avail(size_t *out, dsv4_err *err)
{
    size_t a = (size_t)-1;
    FILE *f = fopen("/proc/meminfo", "r");
    char line[128];
    unsigned long long kb;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
            size_t b = (size_t)kb * 1024;
            a = b > HOST_RESERVE ? b - HOST_RESERVE : 0;
            break;
        }
    if (f)
        fclose(f);
    int set;
    if (env_bound("DSV4_HOST_BUDGET", &a, &set, err))
        return err->code;
    *out = a;
    return 0;
}

static int place_mine(const dsv4_place_item *items, int64_t n, char *report, size_t report_n, int *experts_host,
                      dsv4_err *err);

/* This process places its own items only: every one in a world of one (kernels/place.h). */
int dsv4_cuda_place(const dsv4_place_item *items, int64_t n, char *report, size_t report_n, int *experts_host,
                    dsv4_err *err)
{
    int rank, world;
    dsv4_cuda_experts_rank(&rank, &world);
    dsv4_place_item *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    if (!v)
        return dsv4_fail(err, DSV4_E_NOMEM, "placement: out of host memory for %lld items", (long long)n);
    int rc = place_mine(v, dsv4_place_items_of_rank(items, n, rank, world, v), report, report_n, experts_host, err);
    free(v);
    return rc;
}

/* Available for weights: free device memory less CUDA_RESERVE, or DSV4_CUDA_BUDGET when that is
 * smaller; it lets the spill path be exercised on a GPU where everything fits. What spills must
 * fit host_avail, checked before anything moves. */
static int place_mine(const dsv4_place_item *items, int64_t n, char *report, size_t report_n, int *experts_host,
                      dsv4_err *err)
{
    size_t fr, tot;
    if (dsv4_cuda_mem(&fr, &tot, err))
        return err->code;
    size_t avail = fr > CUDA_RESERVE ? fr - CUDA_RESERVE : 0;
    int budget;
    if (env_bound("DSV4_CUDA_BUDGET", &avail, &budget, err))
        return err->code;
    size_t host = 0;
    if (host_avail(&host, err))
        return err->code;
    dsv4_place_plan p;
    dsv4_place_plan_make(items, n, avail, host, &p);
    char txt[384];
    dsv4_place_plan_text(&p, txt, sizeof txt);
    snprintf(report, report_n, "%s (device %.1f of %.1f GiB free%s)", txt, fr / 1073741824.0, tot / 1073741824.0,
             budget ? ", DSV4_CUDA_BUDGET set" : "");
    if (!p.fits)
        return dsv4_fail(err, DSV4_E_NOMEM, "does not fit the GPU: %s", report);
    if (!p.fits_host)
        return dsv4_fail(err, DSV4_E_NOMEM, "does not fit the GPU and the host: %s", report);
    *experts_host = p.n_experts_dev < p.n_experts;
    /* what the plan leaves off the device is read from pinned host memory by the same kernels */
    for (int64_t i = 0; i < n; i++) {
        const dsv4_place_item *it = &items[i];
        int rc = !it->w ? dsv4_cuda_put(it->a, (size_t)it->n * sizeof(float), err)
                 : dsv4_place_on_device(&p, it) ? dsv4_cuda_put_weight(it->w, err)
                                                : dsv4_cuda_pin_weight(it->w, err);
        if (rc)
            return rc;
    }
    return 0;
}

void dsv4_cuda_unplace(const dsv4_place_item *items, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        if (items[i].w)
            dsv4_cuda_drop_weight(items[i].w);
        else
            dsv4_cuda_drop(items[i].a);
    }
}
