/* libFuzzer target: model.safetensors.index.json. A scratch folder holds two small valid shards
 * (a.safetensors: tensor x, b.safetensors: tensor y); each input becomes the folder's index, and
 * opening the folder must fail with a message or give only tensors the index names. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "io/safetensors.h"

static char dir[256], index_path[300];

/* A one-tensor F32 [2] safetensors file. */
static void write_shard(const char *name, const char *tensor)
{
    char hdr[256], path[300];
    int n = snprintf(hdr, sizeof hdr, "{\"%s\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", tensor);
    uint64_t hl = (uint64_t)n;
    float v[2] = {1, 2};
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(&hl, 8, 1, f) != 1 || fwrite(hdr, 1, (size_t)n, f) != (size_t)n || fwrite(v, sizeof v, 1, f) != 1)
        abort();
    fclose(f);
}

static void cleanup(void)
{
    const char *files[] = {"a.safetensors", "b.safetensors", "model.safetensors.index.json"};
    char p[300];
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        unlink(p);
    }
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    /* every input is written to a file: a memory-backed folder keeps the runs fast */
    const char *t = getenv("TMPDIR");
    if (!t || !*t)
        t = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(dir, sizeof dir, "%s/dsv4-fuzz-index-XXXXXX", t);
    if (!mkdtemp(dir))
        abort();
    atexit(cleanup);
    write_shard("a.safetensors", "x");
    write_shard("b.safetensors", "y");
    snprintf(index_path, sizeof index_path, "%s/model.safetensors.index.json", dir);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    FILE *f = fopen(index_path, "wb");
    if (!f || fwrite(data, 1, size, f) != size)
        abort();
    fclose(f);
    dsv4_err err = {0};
    dsv4_st *st = dsv4_st_open_dir(dir, &err);
    if (!st) {
        if (!err.code || !err.msg[0])
            abort();
        return 0;
    }
    for (int i = 0; i < dsv4_st_count(st); i++) {
        const char *n = dsv4_st_at(st, i)->name;
        if (strcmp(n, "x") && strcmp(n, "y"))
            abort();
    }
    dsv4_st_close(st);
    return 0;
}
