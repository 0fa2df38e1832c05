/* io/st_write — writes one .safetensors file from tensors held in memory. */
#ifndef DSV4_ST_WRITE_H
#define DSV4_ST_WRITE_H

#include <stddef.h>
#include <stdint.h>
#include "io/safetensors.h"

typedef struct dsv4_st_out {
    const char *name;
    dsv4_dtype dtype;
    int ndim;                         /* 0 for a scalar */
    int64_t shape[DSV4_MAX_DIMS];
    const void *data;                 /* numel * dtype size bytes, not copied */
} dsv4_st_out;

/* Writes the n tensors, in the given order, to path (replacing it): a JSON header padded with
 * spaces to a multiple of 8 bytes, then the data back to back. metadata: NULL or a JSON object
 * text for "__metadata__" (string values only, as the format asks). */
int dsv4_st_write(const char *path, const dsv4_st_out *t, int n, const char *metadata, dsv4_err *err);

#endif
