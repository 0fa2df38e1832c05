/* The device placement plan (kernels/place.h): the same for every device backend, so it is
 * tested on the CPU over real fixtures. */
#include <stdio.h>
#include <string.h>
#include "kernels/place.h"

size_t dsv4_place_item_bytes(const dsv4_place_item *it)
{
    return it->w ? it->w->bytes : (size_t)it->n * sizeof(float);
}

/* The device side of the plan: the sums, then what the device holds. */
static void plan_devices(const dsv4_place_item *items, int64_t n, dsv4_place_plan *p)
{
    size_t avail = p->avail;
    for (int64_t i = 0; i < n; i++) {
        const dsv4_place_item *it = &items[i];
        size_t b = dsv4_place_item_bytes(it);
        if (it->expert == DSV4_PLACE_EMBED)
            p->embed += b;
        else if (it->expert < 0)
            p->hot += b;
        else {
            if (!it->shared)
                p->experts += b;
            p->n_experts = it->expert + 1;
        }
    }
    p->fits = p->hot <= avail;
    if (!p->fits)
        return;
    /* Experts go to the device in their order while they fit, the rest to pinned host memory:
     * the first layers' experts resident, the last layers' spilled. */
    size_t room = avail - p->hot;
    for (int64_t i = 0; i < n;) {
        int64_t e = items[i].expert;
        if (e < 0) {
            i++;
            continue;
        }
        size_t b = 0;
        for (; i < n && items[i].expert == e; i++)
            b += items[i].shared ? 0 : dsv4_place_item_bytes(&items[i]);
        if (b > room)
            return;
        room -= b;
        p->experts_dev += b;
        p->n_experts_dev++;
    }
    p->embed_dev = p->embed <= room;
}

void dsv4_place_plan_make(const dsv4_place_item *items, int64_t n, size_t avail, size_t host_avail, dsv4_place_plan *p)
{
    memset(p, 0, sizeof *p);
    p->avail = avail;
    p->host_avail = host_avail;
    plan_devices(items, n, p);
    if (p->fits)
        p->pinned = p->experts - p->experts_dev + (p->embed_dev ? 0 : p->embed);
    p->fits_host = p->fits && p->pinned <= host_avail;
}

int dsv4_place_on_device(const dsv4_place_plan *p, const dsv4_place_item *it)
{
    if (it->expert == DSV4_PLACE_EMBED)
        return p->embed_dev;
    return it->expert < p->n_experts_dev;
}

/* "1.23 GiB", or MiB below one GiB (fixtures, small budgets). */
static const char *human(size_t b, char *buf)
{
    if (b >= ((size_t)1 << 30))
        snprintf(buf, 24, "%.2f GiB", b / 1073741824.0);
    else
        snprintf(buf, 24, "%.2f MiB", b / 1048576.0);
    return buf;
}

void dsv4_place_plan_text(const dsv4_place_plan *p, char *buf, size_t n)
{
    char a[24], b[24], c[24], c2[24], d[24], e[24], f[24];
    if (!p->fits)
        snprintf(buf, n, "hot path %s + routed experts %s, %s available for weights: the hot path does not fit",
                 human(p->hot, a), human(p->experts, b), human(p->avail, c));
    else if (!p->fits_host)
        snprintf(buf, n, "hot path %s + routed experts %s + embedding %s, %s available for weights: %lld of %lld experts "
                 "(%s) on the GPU would leave %s to pinned host memory, %s available there: the spilled weights do not "
                 "fit the host", human(p->hot, a), human(p->experts, b), human(p->embed, f), human(p->avail, c),
                 (long long)p->n_experts_dev, (long long)p->n_experts, human(p->experts_dev, d), human(p->pinned, e),
                 human(p->host_avail, c2));
    else
        snprintf(buf, n, "hot path %s + routed experts %s + embedding %s, %s available for weights: hot path and %lld of "
                 "%lld experts (%s) on the GPU, %lld (%s) in pinned host memory, embedding %s", human(p->hot, a),
                 human(p->experts, b), human(p->embed, f), human(p->avail, c), (long long)p->n_experts_dev,
                 (long long)p->n_experts, human(p->experts_dev, d), (long long)(p->n_experts - p->n_experts_dev),
                 human(p->experts - p->experts_dev, e), p->embed_dev ? "on the GPU" : "in pinned host memory");
}

int64_t dsv4_place_items_of_rank(const dsv4_place_item *items, int64_t n, int rank, int world, dsv4_place_item *out)
{
    int64_t k = 0, last = -1, num = -1;
    for (int64_t i = 0; i < n; i++) {
        const dsv4_place_item *it = &items[i];
        if (it->expert >= 0 && it->slot % world != rank)
            continue;
        out[k] = *it;
        if (it->expert >= 0) {
            if (it->expert != last)
                num++, last = it->expert;
            out[k].expert = num;
        }
        k++;
    }
    return k;
}
