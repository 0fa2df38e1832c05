#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "core/core.h"
#include "io/st_write.h"

static size_t out_bytes(const dsv4_st_out *t)
{
    size_t n = dsv4_dtype_size(t->dtype);
    for (int d = 0; d < t->ndim; d++)
        n *= (size_t)t->shape[d];
    return n;
}

int dsv4_st_write(const char *path, const dsv4_st_out *t, int n, const char *metadata, dsv4_err *err)
{
    cJSON *h = cJSON_CreateObject();
    if (metadata) {
        cJSON *m = cJSON_Parse(metadata);
        if (!m || !cJSON_IsObject(m)) {
            cJSON_Delete(m);
            cJSON_Delete(h);
            return dsv4_fail(err, DSV4_E_ARG, "%s: metadata is not a JSON object", path);
        }
        cJSON_AddItemToObject(h, "__metadata__", m);
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        cJSON *e = cJSON_CreateObject(), *sh = cJSON_CreateArray(), *of = cJSON_CreateArray();
        cJSON_AddStringToObject(e, "dtype", dsv4_dtype_name(t[i].dtype));
        for (int d = 0; d < t[i].ndim; d++)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t[i].shape[d]));
        cJSON_AddItemToObject(e, "shape", sh);
        size_t nb = out_bytes(&t[i]);
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)(off + nb)));
        cJSON_AddItemToObject(e, "data_offsets", of);
        cJSON_AddItemToObject(h, t[i].name, e);
        off += nb;
    }
    char *js = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    if (!js)
        return dsv4_fail(err, DSV4_E_NOMEM, "%s: cannot build the header", path);
    size_t hl = strlen(js), pad = (8 - hl % 8) % 8;
    uint64_t hlen = hl + pad;
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(js);
        return dsv4_fail(err, DSV4_E_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    int ok = fwrite(&hlen, 8, 1, f) == 1 && fwrite(js, 1, hl, f) == hl;
    for (size_t i = 0; ok && i < pad; i++)
        ok = fputc(' ', f) != EOF;
    free(js);
    for (int i = 0; ok && i < n; i++) {
        size_t nb = out_bytes(&t[i]);
        ok = !nb || fwrite(t[i].data, 1, nb, f) == nb;
    }
    if (fclose(f) || !ok)
        return dsv4_fail(err, DSV4_E_IO, "%s: write failed: %s", path, strerror(errno));
    return 0;
}
