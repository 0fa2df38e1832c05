/* kernels/ranks — a process's place in a several-GPU run (docs/multigpu.md): one process a
 * GPU, rank r on GPU r, joined by an NCCL communicator. Each rank holds every weight but the
 * routed experts, which are spread over the ranks; the experts op sums their pair outputs
 * over the ranks, so every rank computes the one-GPU forward bit for bit. Only the CUDA
 * backend has ranks; elsewhere each call says why not. */
#ifndef DSV4_RANKS_H
#define DSV4_RANKS_H

#include <stddef.h>
#include <stdint.h>
#include "core/core.h"

#define DSV4_RANKS_ID_BYTES 128

/* GPUs this machine has (0 when none or no CUDA in the build). */
int dsv4_ranks_gpus(void);
/* Before the model loads: this process is rank `rank` of `world` on GPU `dev`; initialises the
 * device and leaves other ranks' experts off it. */
int dsv4_ranks_prepare(int world, int rank, int dev, dsv4_err *err);
/* Rank 0 makes the communicator's id; every rank joins with it. */
int dsv4_ranks_id(void *id, dsv4_err *err);
int dsv4_ranks_join(int world, int rank, const void *id, dsv4_err *err);
/* out [world * bytes]: every rank's in, in rank order (waits). */
int dsv4_ranks_allgather(const void *in, size_t bytes, void *out, dsv4_err *err);

#endif
