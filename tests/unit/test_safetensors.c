/* The safetensors reader on files written here by hand: every dtype, sharded folders whose
 * index decides which shard a duplicated tensor is read from, folders without an index, and
 * the error for a tensor in two shards with no index to choose; element counts that overflow
 * 64 bits; FP8 block sizes that are zero, huge or contradicted by the scales; an image in
 * memory too short for its header length. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "io/safetensors.h"
#include "io/weight.h"

/* Writes a file with tensors of `nbytes` each filled with byte `fill`. */
static void write_st(const char *path, int n, const char *const *names, const char *const *dtypes, const int *numel,
                     const int *esize, const unsigned char *fill)
{
    char hdr[4096];
    size_t hl = 0, off = 0;
    hl += snprintf(hdr + hl, sizeof hdr - hl, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        size_t nb = (size_t)numel[i] * esize[i];
        hl += snprintf(hdr + hl, sizeof hdr - hl, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%d],\"data_offsets\":[%zu,%zu]}",
                       names[i], dtypes[i], numel[i], off, off + nb);
        off += nb;
    }
    hl += snprintf(hdr + hl, sizeof hdr - hl, "}");
    FILE *f = fopen(path, "wb");
    uint64_t l = hl;
    fwrite(&l, 8, 1, f);
    fwrite(hdr, 1, hl, f);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < numel[i] * esize[i]; j++)
            fputc(fill[i], f);
    fclose(f);
}

/* A file of one header (JSON text) and `data` zero bytes. */
static void write_raw(const char *path, const char *hdr, size_t data)
{
    FILE *f = fopen(path, "wb");
    uint64_t l = strlen(hdr);
    fwrite(&l, 8, 1, f);
    fwrite(hdr, 1, l, f);
    for (size_t i = 0; i < data; i++)
        fputc(0, f);
    fclose(f);
}

/* An FP8 weight [4, 8] with one F32 block scale, bound under several configured block sizes:
 * a block of 0 or past the weight's edge is the whole weight, never a division by zero or a
 * block size a kernel would size a tile from. A scale with a zero dimension is refused. */
static void fp8_blocks(const char *dir)
{
    char p[512];
    snprintf(p, sizeof p, "%s/fp8.safetensors", dir);
    write_raw(p, "{\"w.weight\":{\"dtype\":\"F8_E4M3\",\"shape\":[4,8],\"data_offsets\":[0,32]},"
                 "\"w.scale\":{\"dtype\":\"F32\",\"shape\":[1,1],\"data_offsets\":[32,36]},"
                 "\"z.weight\":{\"dtype\":\"F8_E4M3\",\"shape\":[4,8],\"data_offsets\":[36,68]},"
                 "\"z.scale\":{\"dtype\":\"F32\",\"shape\":[0,1],\"data_offsets\":[68,68]}}", 68);
    dsv4_err err = {0};
    dsv4_st *st = dsv4_st_open_file(p, &err);
    CHECK(st != NULL, "fp8 file: %s", err.msg);
    if (!st)
        return;
    const int blocks[][2] = {{0, 0}, {2147483647, 2147483647}, {128, 128}, {4, 8}};
    for (int i = 0; i < 4; i++) {
        dsv4_weight w;
        int rc = dsv4_weight_bind(st, "w", 4, 8, blocks[i], &w, &err);
        CHECK(rc == 0 && w.bn == 4 && w.bk == 8, "block [%d, %d]: rc %d (%s), block %d x %d, want 4 x 8", blocks[i][0],
              blocks[i][1], rc, err.msg, w.bn, w.bk);
    }
    dsv4_weight w;
    int rc = dsv4_weight_bind(st, "z", 4, 8, blocks[2], &w, &err);
    CHECK(rc != 0 && strstr(err.msg, "z.scale"), "a scale with a zero dimension should be refused: %s", err.msg);
    dsv4_st_close(st);
}

/* Shapes whose element count wraps int64 (to 0 here, with 0 bytes of data) are refused. */
static void numel_overflow(const char *dir)
{
    char p[512];
    snprintf(p, sizeof p, "%s/big.safetensors", dir);
    write_raw(p, "{\"big\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", 0);
    dsv4_err err = {0};
    dsv4_st *st = dsv4_st_open_file(p, &err);
    CHECK(st == NULL && strstr(err.msg, "big") && strstr(err.msg, "overflows"), "a 2^64-element shape should be refused: %s",
          st ? "opened" : err.msg);
    dsv4_st_close(st);
    write_raw(p, "{\"big\":{\"dtype\":\"F64\",\"shape\":[1152921504606846976],\"data_offsets\":[0,0]}}", 0);
    st = dsv4_st_open_file(p, &err);
    CHECK(st == NULL && strstr(err.msg, "big"), "2^60 F64 elements (2^63 bytes) should be refused: %s", st ? "opened" : err.msg);
    dsv4_st_close(st);
}

/* An image in memory shorter than the 8-byte header length is refused, not read past. */
static void short_image(void)
{
    void *map = mmap(NULL, 5, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memcpy(map, "\x05\0\0\0\0", 5);
    dsv4_err err = {0};
    dsv4_st *st = dsv4_st_open_memory(map, 5, "short", &err);
    CHECK(st == NULL && strstr(err.msg, "truncated"), "a 5-byte image should be refused as truncated: %s", st ? "opened" : err.msg);
    dsv4_st_close(st);
}

int main(void)
{
    char dir[256], p[512];
    snprintf(dir, sizeof dir, "/tmp/dsv4-st-%d", (int)getpid());
    mkdir(dir, 0755);
    dsv4_err err = {0};

    /* every dtype, one file */
    const char *dts[] = {"F32", "F16", "BF16", "F64", "F8_E4M3", "F8_E5M2", "F8_E8M0", "I8", "U8", "I16", "U16", "I32", "U32", "I64", "U64", "BOOL"};
    const int sz[] = {4, 2, 2, 8, 1, 1, 1, 1, 1, 2, 2, 4, 4, 8, 8, 1};
    const char *nm[16];
    int ne[16];
    unsigned char fl[16];
    char names[16][16];
    for (int i = 0; i < 16; i++) {
        snprintf(names[i], sizeof names[i], "t%d", i);
        nm[i] = names[i];
        ne[i] = 3 + i;
        fl[i] = (unsigned char)(i + 1);
    }
    snprintf(p, sizeof p, "%s/one.safetensors", dir);
    write_st(p, 16, nm, dts, ne, sz, fl);
    dsv4_st *st = dsv4_st_open_file(p, &err);
    CHECK(st != NULL, "open: %s", err.msg);
    for (int i = 0; st && i < 16; i++) {
        const dsv4_tensor *t = dsv4_st_find(st, nm[i]);
        CHECK(t && !strcmp(dsv4_dtype_name(t->dtype), dts[i]) && t->numel == ne[i] && t->nbytes == (size_t)ne[i] * sz[i] &&
                  ((const unsigned char *)t->data)[0] == fl[i],
              "dtype %s", dts[i]);
    }
    CHECK(st && dsv4_st_metadata(st, 0) && strstr(dsv4_st_metadata(st, 0), "pt"), "metadata kept");
    dsv4_st_close(st);

    /* sharded: "w" in both shards, the index names shard 2 */
    char sd[300];
    snprintf(sd, sizeof sd, "%s/sharded", dir);
    mkdir(sd, 0755);
    const char *n1[] = {"a", "w"}, *n2[] = {"w", "b"}, *f32[] = {"F32", "F32"};
    int e2[] = {4, 4}, s4[] = {4, 4};
    unsigned char f1[] = {1, 2}, f2[] = {3, 4};
    snprintf(p, sizeof p, "%s/s1.safetensors", sd);
    write_st(p, 2, n1, f32, e2, s4, f1);
    snprintf(p, sizeof p, "%s/s2.safetensors", sd);
    write_st(p, 2, n2, f32, e2, s4, f2);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", sd);
    FILE *f = fopen(p, "w");
    fputs("{\"metadata\":{},\"weight_map\":{\"a\":\"s1.safetensors\",\"w\":\"s2.safetensors\",\"b\":\"s2.safetensors\"}}", f);
    fclose(f);
    st = dsv4_st_open_dir(sd, &err);
    CHECK(st != NULL, "sharded open: %s", err.msg);
    if (st) {
        const dsv4_tensor *w = dsv4_st_find(st, "w");
        CHECK(w && ((const unsigned char *)w->data)[0] == 3, "a tensor in two shards is read from the shard the index names");
        CHECK(dsv4_st_count(st) == 3, "three tensors, %d found", dsv4_st_count(st));
        dsv4_st_close(st);
    }
    /* the index names a tensor its shard lacks */
    f = fopen(p, "w");
    fputs("{\"weight_map\":{\"a\":\"s1.safetensors\",\"w\":\"s2.safetensors\",\"c\":\"s1.safetensors\"}}", f);
    fclose(f);
    st = dsv4_st_open_dir(sd, &err);
    CHECK(!st && strstr(err.msg, "tensor c") && strstr(err.msg, "s1.safetensors"), "index names a missing tensor: %s", err.msg);
    /* no index: the folder's files; the duplicate is an error naming both files */
    unlink(p);
    st = dsv4_st_open_dir(sd, &err);
    CHECK(!st && strstr(err.msg, "tensor w") && strstr(err.msg, "s1.safetensors") && strstr(err.msg, "s2.safetensors"),
          "duplicate without an index: %s", err.msg);
    /* a file added to an open set: its tensors join; a name already there is refused naming both */
    char a1[512], a2[512];
    snprintf(a1, sizeof a1, "%s/s1.safetensors", sd);
    snprintf(a2, sizeof a2, "%s/s2.safetensors", sd);
    st = dsv4_st_open_file(a1, &err);
    CHECK(st && dsv4_st_add_file(st, a2, &err) && strstr(err.msg, "tensor w") && strstr(err.msg, "s2.safetensors"),
          "adding a file with a tensor already in the set: %s", err.msg);
    dsv4_st_close(st);
    const char *n3[] = {"c"};
    snprintf(a2, sizeof a2, "%s/extra.safetensors", dir);
    write_st(a2, 1, n3, f32, e2, s4, f2);
    st = dsv4_st_open_file(a1, &err);
    CHECK(st && !dsv4_st_add_file(st, a2, &err) && dsv4_st_count(st) == 3 && dsv4_st_find(st, "c") &&
              ((const unsigned char *)dsv4_st_find(st, "c")->data)[0] == 3 && dsv4_st_find(st, "a") &&
              dsv4_st_file_offset(st, dsv4_st_find(st, "c")) >= 8,
          "a file added to a set: %s", err.msg);
    dsv4_st_close(st);
    /* a folder with nothing */
    snprintf(p, sizeof p, "%s/empty", dir);
    mkdir(p, 0755);
    st = dsv4_st_open_dir(p, &err);
    CHECK(!st && strstr(err.msg, "no model.safetensors"), "empty folder: %s", err.msg);
    fp8_blocks(dir);
    numel_overflow(dir);
    short_image();
    snprintf(p, sizeof p, "rm -rf %s", dir);
    if (system(p)) {
    }
    return check_summary("safetensors");
}
