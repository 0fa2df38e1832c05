/* safetensors reader. Format: u64 little-endian header length N, N bytes of JSON
 * {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the data;
 * offsets are relative to the end of the header. Every field is checked before use, and
 * every failure names the file and the tensor. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "core/core.h"
#include "io/safetensors.h"

typedef struct st_file {
    char *path;
    void *map;
    size_t size;
    char *metadata;
} st_file;

struct dsv4_st {
    char *label;        /* the folder or file it was opened from */
    st_file *files;
    int n_files;
    dsv4_tensor *t;
    int n, cap;
    int *slots; /* open-addressing hash of tensor names, -1 empty */
    int n_slots;
};

static const struct { const char *name; size_t size; } dtypes[DSV4_DT_COUNT] = {
    [DSV4_DT_F32] = {"F32", 4}, [DSV4_DT_F16] = {"F16", 2}, [DSV4_DT_BF16] = {"BF16", 2},
    [DSV4_DT_F64] = {"F64", 8}, [DSV4_DT_F8_E4M3] = {"F8_E4M3", 1}, [DSV4_DT_F8_E5M2] = {"F8_E5M2", 1},
    [DSV4_DT_F8_E8M0] = {"F8_E8M0", 1}, [DSV4_DT_I8] = {"I8", 1}, [DSV4_DT_U8] = {"U8", 1},
    [DSV4_DT_I16] = {"I16", 2}, [DSV4_DT_U16] = {"U16", 2}, [DSV4_DT_I32] = {"I32", 4},
    [DSV4_DT_U32] = {"U32", 4}, [DSV4_DT_I64] = {"I64", 8}, [DSV4_DT_U64] = {"U64", 8},
    [DSV4_DT_BOOL] = {"BOOL", 1},
};

const char *dsv4_dtype_name(dsv4_dtype t) { return t < DSV4_DT_COUNT ? dtypes[t].name : "?"; }
size_t dsv4_dtype_size(dsv4_dtype t) { return t < DSV4_DT_COUNT ? dtypes[t].size : 0; }

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    while (*s)
        h = (h ^ (unsigned char)*s++) * 1099511628211ull;
    return h;
}

static int index_build(dsv4_st *st, dsv4_err *err)
{
    free(st->slots);
    st->n_slots = 16;
    while (st->n_slots < 2 * st->n + 2)
        st->n_slots *= 2;
    st->slots = malloc(st->n_slots * sizeof *st->slots);
    if (!st->slots)
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory indexing tensors");
    memset(st->slots, 0xff, st->n_slots * sizeof *st->slots);
    for (int i = 0; i < st->n; i++) {
        uint64_t h = hash_str(st->t[i].name) & (st->n_slots - 1);
        while (st->slots[h] >= 0)
            h = (h + 1) & (st->n_slots - 1);
        st->slots[h] = i;
    }
    return 0;
}

const dsv4_tensor *dsv4_st_find(const dsv4_st *st, const char *name)
{
    if (!st->slots)
        return NULL;
    uint64_t h = hash_str(name) & (st->n_slots - 1);
    while (st->slots[h] >= 0) {
        const dsv4_tensor *t = &st->t[st->slots[h]];
        if (!strcmp(t->name, name))
            return t;
        h = (h + 1) & (st->n_slots - 1);
    }
    return NULL;
}

int dsv4_st_count(const dsv4_st *st) { return st->n; }
const dsv4_tensor *dsv4_st_at(const dsv4_st *st, int i) { return &st->t[i]; }
const char *dsv4_st_file_path(const dsv4_st *st, int f) { return st->files[f].path; }
const char *dsv4_st_label(const dsv4_st *st) { return st->label; }
const char *dsv4_st_metadata(const dsv4_st *st, int f) { return st->files[f].metadata; }

int64_t dsv4_st_file_offset(const dsv4_st *st, const dsv4_tensor *t)
{
    const st_file *f = &st->files[t->file];
    if (!f->path || !f->map)
        return -1;
    return (int64_t)((const char *)t->data - (const char *)f->map);
}

size_t dsv4_st_total_bytes(const dsv4_st *st)
{
    size_t s = 0;
    for (int i = 0; i < st->n; i++)
        s += st->t[i].nbytes;
    return s;
}

void dsv4_st_close(dsv4_st *st)
{
    if (!st)
        return;
    for (int i = 0; i < st->n_files; i++) {
        if (st->files[i].map)
            munmap(st->files[i].map, st->files[i].size);
        free(st->files[i].path);
        free(st->files[i].metadata);
    }
    for (int i = 0; i < st->n; i++)
        free(st->t[i].name);
    free(st->label);
    free(st->files);
    free(st->t);
    free(st->slots);
    free(st);
}

static int map_file(st_file *f, dsv4_err *err)
{
    int fd = open(f->path, O_RDONLY);
    if (fd < 0)
        return dsv4_fail(err, DSV4_E_IO, "%s: cannot open: %s", f->path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) < 0) {
        close(fd);
        return dsv4_fail(err, DSV4_E_IO, "%s: cannot stat: %s", f->path, strerror(errno));
    }
    f->size = (size_t)sb.st_size;
    if (f->size < 8) {
        close(fd);
        return dsv4_fail(err, DSV4_E_FORMAT, "%s: truncated: %zu bytes, shorter than the 8-byte header length",
                         f->path, f->size);
    }
    f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        return dsv4_fail(err, DSV4_E_IO, "%s: cannot map: %s", f->path, strerror(errno));
    }
    return 0;
}

static int parse_dtype(const char *s, dsv4_dtype *out)
{
    for (int i = 0; i < DSV4_DT_COUNT; i++)
        if (!strcmp(s, dtypes[i].name)) {
            *out = (dsv4_dtype)i;
            return 0;
        }
    return -1;
}

/* Adds the file's tensors. only: when non-NULL, a predicate (the index's weight map) that
 * says whether this file is the home of a tensor; others are skipped. */
static int load_file(dsv4_st *st, int fi, int (*only)(void *, const char *, const char *), void *ctx,
                     dsv4_err *err)
{
    st_file *f = &st->files[fi];
    if (!f->map && map_file(f, err))
        return err->code;
    if (f->size < 8) /* map_file checks its files; an image in memory arrives here unchecked */
        return dsv4_fail(err, DSV4_E_FORMAT, "%s: truncated: %zu bytes, shorter than the 8-byte header length", f->path,
                         f->size);
    uint64_t hlen;
    memcpy(&hlen, f->map, 8);
    if (hlen > f->size - 8)
        return dsv4_fail(err, DSV4_E_FORMAT, "%s: truncated: header claims %llu bytes but the file has %zu after the length",
                         f->path, (unsigned long long)hlen, f->size - 8);
    const char *hdr = (const char *)f->map + 8;
    cJSON *j = cJSON_ParseWithLength(hdr, (size_t)hlen);
    if (!j || !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return dsv4_fail(err, DSV4_E_FORMAT, "%s: bad header JSON (%llu bytes)", f->path, (unsigned long long)hlen);
    }
    const uint8_t *data = (const uint8_t *)f->map + 8 + hlen;
    size_t dsize = f->size - 8 - hlen;
    int rc = 0;
    for (cJSON *e = j->child; e && !rc; e = e->next) {
        const char *name = e->string;
        if (!strcmp(name, "__metadata__")) {
            free(f->metadata); /* a repeated key: the last one counts */
            f->metadata = cJSON_PrintUnformatted(e);
            continue;
        }
        if (only && !only(ctx, name, f->path))
            continue;
        cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        cJSON *js = cJSON_GetObjectItemCaseSensitive(e, "shape");
        cJSON *jo = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        dsv4_tensor t = {0};
        if (!cJSON_IsString(jd) || !cJSON_IsArray(js) || !cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2) {
            rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: tensor %s: header entry lacks dtype, shape or data_offsets", f->path, name);
            break;
        }
        if (parse_dtype(jd->valuestring, &t.dtype)) {
            rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: tensor %s: unknown dtype '%s'", f->path, name, jd->valuestring);
            break;
        }
        t.ndim = cJSON_GetArraySize(js);
        if (t.ndim > DSV4_MAX_DIMS) {
            rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: tensor %s: %d dimensions (at most %d)", f->path, name, t.ndim, DSV4_MAX_DIMS);
            break;
        }
        t.numel = 1;
        int k = 0;
        for (cJSON *d = js->child; d; d = d->next, k++) {
            if (!cJSON_IsNumber(d) || d->valuedouble < 0 || d->valuedouble > 9.0e15 || d->valuedouble != (double)(int64_t)d->valuedouble) {
                rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: tensor %s: bad shape entry", f->path, name);
                break;
            }
            t.shape[k] = (int64_t)d->valuedouble;
            if (__builtin_mul_overflow(t.numel, t.shape[k], &t.numel)) {
                rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: tensor %s: the shape's element count overflows 64 bits", f->path, name);
                break;
            }
        }
        if (rc)
            break;
        double b = cJSON_GetArrayItem(jo, 0)->valuedouble, en = cJSON_GetArrayItem(jo, 1)->valuedouble;
        if (!cJSON_IsNumber(cJSON_GetArrayItem(jo, 0)) || !cJSON_IsNumber(cJSON_GetArrayItem(jo, 1)) || !(b >= 0) || !(en >= b) ||
            b != floor(b) || en != floor(en)) {
            rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: tensor %s: bad data_offsets", f->path, name);
            break;
        }
        if (en > (double)dsize) {
            rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: tensor %s: data_offsets [%.0f, %.0f] out of range: the data section has %zu bytes (truncated file?)",
                           f->path, name, b, en, dsize);
            break;
        }
        t.nbytes = (size_t)en - (size_t)b;
        int64_t need;
        if (__builtin_mul_overflow(t.numel, (int64_t)dtypes[t.dtype].size, &need) || (uint64_t)need != t.nbytes) {
            rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: tensor %s: %zu bytes of data but shape x %s needs %.0f", f->path, name,
                           t.nbytes, dtypes[t.dtype].name, (double)t.numel * (double)dtypes[t.dtype].size);
            break;
        }
        t.data = data + (size_t)b;
        t.file = fi;
        t.name = strdup(name);
        if (st->n == st->cap) {
            st->cap = st->cap ? 2 * st->cap : 256;
            dsv4_tensor *nt = realloc(st->t, st->cap * sizeof *nt);
            if (!nt) {
                free(t.name);
                rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory reading %s", f->path);
                break;
            }
            st->t = nt;
        }
        st->t[st->n++] = t;
    }
    cJSON_Delete(j);
    return rc;
}

static dsv4_st *st_new(int n_files)
{
    dsv4_st *st = calloc(1, sizeof *st);
    if (st)
        st->files = calloc(n_files ? n_files : 1, sizeof *st->files);
    if (st && !st->files) {
        free(st);
        return NULL;
    }
    return st;
}

static char *join(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    char *s = malloc(la + lb + 2);
    memcpy(s, a, la);
    s[la] = '/';
    memcpy(s + la + 1, b, lb + 1);
    return s;
}

static int check_duplicates(dsv4_st *st, dsv4_err *err)
{
    if (index_build(st, err))
        return err->code;
    for (int i = 0; i < st->n; i++)
        if (dsv4_st_find(st, st->t[i].name) != &st->t[i])
            return dsv4_fail(err, DSV4_E_FORMAT, "tensor %s appears in both %s and %s", st->t[i].name,
                             st->files[dsv4_st_find(st, st->t[i].name)->file].path, st->files[st->t[i].file].path);
    return 0;
}

dsv4_st *dsv4_st_open_file(const char *path, dsv4_err *err)
{
    dsv4_st *st = st_new(1);
    if (!st) {
        dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
        return NULL;
    }
    st->n_files = 1;
    st->label = strdup(path);
    st->files[0].path = strdup(path);
    if (load_file(st, 0, NULL, NULL, err) || check_duplicates(st, err)) {
        dsv4_st_close(st);
        return NULL;
    }
    return st;
}

dsv4_st *dsv4_st_open_memory(void *map, size_t size, const char *label, dsv4_err *err)
{
    dsv4_st *st = st_new(1);
    if (!st) {
        munmap(map, size);
        dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
        return NULL;
    }
    st->n_files = 1;
    st->label = strdup(label);
    st->files[0].path = strdup(label);
    st->files[0].map = map;
    st->files[0].size = size;
    if (load_file(st, 0, NULL, NULL, err) || check_duplicates(st, err)) {
        dsv4_st_close(st);
        return NULL;
    }
    return st;
}

int dsv4_st_add_file(dsv4_st *st, const char *path, dsv4_err *err)
{
    st_file *nf = realloc(st->files, (st->n_files + 1) * sizeof *nf);
    if (!nf)
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory adding %s", path);
    st->files = nf;
    memset(&nf[st->n_files], 0, sizeof *nf);
    nf[st->n_files].path = strdup(path);
    int fi = st->n_files++;
    if (load_file(st, fi, NULL, NULL, err) || check_duplicates(st, err))
        return err->code;
    return 0;
}

typedef struct { cJSON *map; } index_ctx;

static int index_owns(void *ctx, const char *name, const char *path)
{
    cJSON *e = cJSON_GetObjectItemCaseSensitive(((index_ctx *)ctx)->map, name);
    if (!cJSON_IsString(e))
        return 0;
    const char *base = strrchr(path, '/');
    return !strcmp(e->valuestring, base ? base + 1 : path);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

dsv4_st *dsv4_st_open_dir(const char *dir, dsv4_err *err)
{
    char *ipath = join(dir, "model.safetensors.index.json");
    struct stat sb;
    dsv4_st *st = NULL;
    if (stat(ipath, &sb) == 0) {
        char *txt = dsv4_read_file(ipath, NULL, err);
        cJSON *j = txt ? cJSON_Parse(txt) : NULL;
        free(txt);
        cJSON *map = j ? cJSON_GetObjectItemCaseSensitive(j, "weight_map") : NULL;
        if (!cJSON_IsObject(map)) {
            if (txt || !err->code)
                dsv4_fail(err, DSV4_E_FORMAT, "%s: bad index JSON (no weight_map object)", ipath);
            cJSON_Delete(j);
            free(ipath);
            return NULL;
        }
        /* The distinct shard names, sorted so load order is stable. */
        int n = 0, cap = cJSON_GetArraySize(map);
        char **names = malloc((cap + 1) * sizeof *names);
        for (cJSON *e = map->child; e; e = e->next) {
            if (!cJSON_IsString(e)) {
                dsv4_fail(err, DSV4_E_FORMAT, "%s: weight_map entry %s is not a file name", ipath, e->string);
                free(names);
                cJSON_Delete(j);
                free(ipath);
                return NULL;
            }
            int seen = 0;
            for (int i = 0; i < n && !seen; i++)
                seen = !strcmp(names[i], e->valuestring);
            if (!seen)
                names[n++] = e->valuestring;
        }
        qsort(names, n, sizeof *names, cmp_str);
        st = st_new(n);
        st->n_files = n;
        st->label = strdup(dir);
        index_ctx ctx = {map};
        int rc = 0;
        for (int i = 0; i < n && !rc; i++) {
            st->files[i].path = join(dir, names[i]);
            rc = load_file(st, i, index_owns, &ctx, err);
        }
        if (!rc)
            rc = check_duplicates(st, err);
        for (cJSON *e = map->child; e && !rc; e = e->next)
            if (!dsv4_st_find(st, e->string))
                rc = dsv4_fail(err, DSV4_E_FORMAT, "%s: tensor %s is listed in the index but missing from %s/%s", ipath,
                               e->string, dir, e->valuestring);
        free(names);
        cJSON_Delete(j);
        free(ipath);
        if (rc) {
            dsv4_st_close(st);
            return NULL;
        }
        return st;
    }
    free(ipath);
    char *single = join(dir, "model.safetensors");
    if (stat(single, &sb) == 0) {
        st = dsv4_st_open_file(single, err);
        free(single);
        return st;
    }
    free(single);
    DIR *d = opendir(dir);
    if (!d) {
        dsv4_fail(err, DSV4_E_IO, "%s: cannot open folder: %s", dir, strerror(errno));
        return NULL;
    }
    int n = 0, cap = 16;
    char **names = malloc(cap * sizeof *names);
    for (struct dirent *de; (de = readdir(d));) {
        size_t l = strlen(de->d_name);
        if (l > 12 && !strcmp(de->d_name + l - 12, ".safetensors")) {
            if (n == cap)
                names = realloc(names, (cap *= 2) * sizeof *names);
            names[n++] = strdup(de->d_name);
        }
    }
    closedir(d);
    if (!n) {
        free(names);
        dsv4_fail(err, DSV4_E_IO, "%s: no model.safetensors, index or *.safetensors file", dir);
        return NULL;
    }
    qsort(names, n, sizeof *names, cmp_str);
    st = st_new(n);
    st->n_files = n;
    st->label = strdup(dir);
    int rc = 0;
    for (int i = 0; i < n; i++) {
        st->files[i].path = join(dir, names[i]);
        if (!rc)
            rc = load_file(st, i, NULL, NULL, err);
        free(names[i]);
    }
    free(names);
    if (!rc)
        rc = check_duplicates(st, err);
    if (rc) {
        dsv4_st_close(st);
        return NULL;
    }
    return st;
}

const char *dsv4_tensor_shape(const dsv4_tensor *t, char *buf, size_t n)
{
    size_t o = snprintf(buf, n, "[");
    for (int i = 0; i < t->ndim && o < n; i++)
        o += snprintf(buf + o, n - o, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    if (o < n)
        snprintf(buf + o, n - o, "]");
    return buf;
}
