/* libFuzzer target: a safetensors file image (header length, header JSON, data). Whatever the
 * bytes, opening fails with a message or gives tensors that lie inside the image and whose
 * byte counts match their shapes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!size)
        return 0;
    void *map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED)
        return 0;
    memcpy(map, data, size);
    dsv4_err err = {0};
    dsv4_st *st = dsv4_st_open_memory(map, size, "fuzz.safetensors", &err);
    if (!st) {
        if (!err.code || !err.msg[0])
            abort(); /* a failure always says why */
        return 0;
    }
    const uint8_t *lo = map, *hi = lo + size;
    for (int i = 0; i < dsv4_st_count(st); i++) {
        const dsv4_tensor *t = dsv4_st_at(st, i);
        const uint8_t *p = t->data;
        if (p < lo || p > hi || t->nbytes > (size_t)(hi - p) || (uint64_t)t->numel * dsv4_dtype_size(t->dtype) != t->nbytes)
            abort();
        if (dsv4_st_find(st, t->name) != t)
            abort();
        char sh[96];
        dsv4_tensor_shape(t, sh, sizeof sh);
    }
    dsv4_st_close(st);
    return 0;
}
