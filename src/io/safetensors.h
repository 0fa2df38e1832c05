/* io/safetensors — tensors over mmap, from one file or a sharded checkpoint folder.
 * Nothing is converted: each tensor points into the mapped file as stored. */
#ifndef DSV4_SAFETENSORS_H
#define DSV4_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include "core/err.h"

typedef enum {
    DSV4_DT_F32, DSV4_DT_F16, DSV4_DT_BF16, DSV4_DT_F64,
    DSV4_DT_F8_E4M3, DSV4_DT_F8_E5M2, DSV4_DT_F8_E8M0,
    DSV4_DT_I8, DSV4_DT_U8, DSV4_DT_I16, DSV4_DT_U16, DSV4_DT_I32, DSV4_DT_U32, DSV4_DT_I64, DSV4_DT_U64,
    DSV4_DT_BOOL,
    DSV4_DT_COUNT
} dsv4_dtype;

const char *dsv4_dtype_name(dsv4_dtype t);
size_t dsv4_dtype_size(dsv4_dtype t);

#define DSV4_MAX_DIMS 8
typedef struct dsv4_tensor {
    char *name;
    dsv4_dtype dtype;
    int ndim;
    int64_t shape[DSV4_MAX_DIMS];
    int64_t numel;
    const void *data;   /* into the mapping */
    size_t nbytes;
    int file;           /* index into the set's files */
} dsv4_tensor;
/* "[a, b, ...]" of a tensor's shape into buf (n bytes, truncated to fit); returns buf. */
const char *dsv4_tensor_shape(const dsv4_tensor *t, char *buf, size_t n);

typedef struct dsv4_st dsv4_st;

/* A folder: model.safetensors.index.json (each tensor from the shard its weight_map names),
 * else model.safetensors, else every *.safetensors in it. */
dsv4_st *dsv4_st_open_dir(const char *dir, dsv4_err *err);
/* One .safetensors file. */
dsv4_st *dsv4_st_open_file(const char *path, dsv4_err *err);
/* A safetensors image built in memory (an mmap'd region the set takes over and unmaps). */
dsv4_st *dsv4_st_open_memory(void *map, size_t size, const char *label, dsv4_err *err);
/* Adds the tensors of one more .safetensors file to a set (a name already in it is refused). */
int dsv4_st_add_file(dsv4_st *st, const char *path, dsv4_err *err);
void dsv4_st_close(dsv4_st *st);

const dsv4_tensor *dsv4_st_find(const dsv4_st *st, const char *name);
int dsv4_st_count(const dsv4_st *st);
const dsv4_tensor *dsv4_st_at(const dsv4_st *st, int i);
const char *dsv4_st_file_path(const dsv4_st *st, int file);
/* The folder or file the set was opened from (for messages). */
const char *dsv4_st_label(const dsv4_st *st);
/* Byte offset of a tensor's data in its file, or -1 when the set is not backed by files. */
int64_t dsv4_st_file_offset(const dsv4_st *st, const dsv4_tensor *t);
/* The JSON text of a file's "__metadata__" object, or NULL. */
const char *dsv4_st_metadata(const dsv4_st *st, int file);
size_t dsv4_st_total_bytes(const dsv4_st *st);

#endif
