/* kernels/place — which weights a device backend keeps in its own memory when not all of them
 * fit. The model lists every array the device ops read (dsv4_place_item); the plan here decides,
 * the backend's place op (kernels/backend.h) moves the arrays where the plan says. */
#ifndef DSV4_PLACE_H
#define DSV4_PLACE_H

#include <stddef.h>
#include <stdint.h>
#include "io/weight.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An item's class: the hot path (read every step), the embedding table (one row per token), or
 * a routed expert, numbered 0.. in layer order (its w1, w2, w3 are three items with one number,
 * consecutive). */
enum { DSV4_PLACE_HOT = -1, DSV4_PLACE_EMBED = -2 };
typedef struct dsv4_place_item {
    const dsv4_weight *w;    /* a bound weight (its data and scales as stored), or NULL: */
    const float *a;          /* an array of n floats (int32 words are moved as they are) */
    int64_t n;
    int64_t expert;          /* DSV4_PLACE_HOT, DSV4_PLACE_EMBED, or the expert's number */
    int shared;              /* an expert whose bytes an earlier one has: counted once */
    int slot;                /* a routed expert's index among its layer's experts; -1 otherwise */
} dsv4_place_item;

/* Bytes the item holds as stored. */
size_t dsv4_place_item_bytes(const dsv4_place_item *it);

/* The plan: the hot path must fit `avail` device bytes; routed experts follow in their order
 * while they fit, the rest are read from pinned host memory; the embedding table goes to the
 * device only when every expert did (a step reads one row of it per token, the least traffic per
 * byte of anything, so it is the first to spill). What spills is copied into pinned host memory,
 * which must fit `host_avail` bytes ((size_t)-1: no bound): the admission check, made before
 * anything is allocated. Bytes as stored. */
typedef struct dsv4_place_plan {
    size_t avail, host_avail, hot, experts, experts_dev, embed;
    size_t pinned;                      /* bytes the plan puts in pinned host memory */
    int64_t n_experts, n_experts_dev;   /* an expert is its w1, w2, w3 */
    int fits;                           /* the hot path fits the device */
    int fits_host;                      /* and what spills fits the host */
    int embed_dev;                      /* the embedding table on the device (else pinned) */
} dsv4_place_plan;
void dsv4_place_plan_make(const dsv4_place_item *items, int64_t n, size_t avail, size_t host_avail, dsv4_place_plan *p);
/* The plan in words (the loader's report, `dsv4 info`). */
void dsv4_place_plan_text(const dsv4_place_plan *p, char *buf, size_t n);
/* Whether the plan puts the item on the device (else pinned host memory). */
int dsv4_place_on_device(const dsv4_place_plan *p, const dsv4_place_item *it);

/* Rank `rank` of `world` (several GPUs, docs/multigpu.md) holds every item but the routed
 * experts of other ranks: an expert's slot s is rank s % world's. Writes this rank's items to
 * out (n of them at most), their experts renumbered 0.. in order as the plan takes them, and
 * returns how many. */
int64_t dsv4_place_items_of_rank(const dsv4_place_item *items, int64_t n, int rank, int world, dsv4_place_item *out);

#ifdef __cplusplus
}
#endif
#endif
