/* Engram table rows, resident or streamed. The released tables are ~95 GB each: on a machine
 * that cannot hold them they stay on disk and each step reads only the rows its tokens hash
 * to (24 per token per layer, 264 B each), by address with pread. O_DIRECT bypasses the page
 * cache where the file system allows it (cold tables: the cache would only evict weights);
 * reads then cover the aligned 4 KiB blocks around a row. Either path decodes the same bytes
 * with the same decoder, so streamed == resident bit for bit. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "core/core.h"
#include "kernels/cpu/weight_decode.h"
#include "model/model.h"

#define DIO_ALIGN 4096

static int verify_checksum(const dsv4_etable *t, const dsv4_st *st, dsv4_err *err);

static int open_pair(const char *path, int direct, int *fd, int *fdd)
{
    *fd = open(path, O_RDONLY);
    *fdd = *fd < 0 || !direct ? -1 : open(path, O_RDONLY | O_DIRECT);
    return *fd < 0 ? -1 : 0;
}

int dsv4_etable_open(dsv4_etable *t, const dsv4_st *st, const char *prefix, int64_t rows, int head_dim, int streamed,
                     int direct, dsv4_err *err)
{
    memset(t, 0, sizeof *t);
    t->fd_w = t->fd_s = t->direct_w = t->direct_s = -1;
    int fp8_block[2] = {1, 32};
    if (dsv4_weight_bind(st, prefix, rows, head_dim, fp8_block, &t->w, err))
        return err->code;
    if (t->w.form != DSV4_WF_FP8 || t->w.bn != 1 || !t->w.scale_e8m0)
        return dsv4_fail(err, DSV4_E_MODEL, "tensor %s: %s, expected F8_E4M3 rows with one F8_E8M0 scale row each", t->w.name,
                         dsv4_wform_name(t->w.form));
    if (verify_checksum(t, st, err))
        return err->code;
    if (!streamed)
        return 0;
    t->streamed = 1;
    char sname[512];
    snprintf(sname, sizeof sname, "%s.scale", prefix);
    const dsv4_tensor *tw = dsv4_st_find(st, t->w.name), *ts = dsv4_st_find(st, sname);
    t->off_w = dsv4_st_file_offset(st, tw);
    t->off_s = dsv4_st_file_offset(st, ts);
    const char *pw = dsv4_st_file_path(st, tw->file), *ps = dsv4_st_file_path(st, ts->file);
    if (t->off_w < 0 || t->off_s < 0 || open_pair(pw, direct, &t->fd_w, &t->direct_w) ||
        open_pair(ps, direct, &t->fd_s, &t->direct_s))
        return dsv4_fail(err, DSV4_E_IO, "%s: cannot open the Engram table %s for streaming: %s", pw, t->w.name, strerror(errno));
    return 0;
}

void dsv4_etable_close(dsv4_etable *t)
{
    if (!t->streamed) /* a resident (or never opened) table holds no descriptors */
        return;
    int fds[4] = {t->fd_w, t->fd_s, t->direct_w, t->direct_s};
    for (int k = 0; k < 4; k++)
        if (fds[k] >= 0)
            close(fds[k]);
    t->fd_w = t->fd_s = t->direct_w = t->direct_s = -1;
}

/* len bytes at file offset off into dst: through the O_DIRECT descriptor when there is one
 * (aligned block reads into blk), else buffered. Returns bytes read from the file or -1. */
static int64_t read_at(int fd, int fdd, void *blk, int64_t off, size_t len, void *dst)
{
    if (fdd >= 0) {
        int64_t a = off & ~(int64_t)(DIO_ALIGN - 1), e = (off + (int64_t)len + DIO_ALIGN - 1) & ~(int64_t)(DIO_ALIGN - 1);
        ssize_t got = pread(fdd, blk, (size_t)(e - a), a);
        if (got >= off - a + (int64_t)len) {
            memcpy(dst, (char *)blk + (off - a), len);
            return got;
        }
    }
    ssize_t got = pread(fd, dst, len, off);
    return got == (ssize_t)len ? got : -1;
}

/* Shared by the reader threads of one dsv4_etable_rows call: rows are claimed 4 at a time. */
typedef struct io_job {
    const dsv4_etable *t;
    const int64_t *rows;
    int n, next;
    float *out;
    uint64_t bytes;
    int64_t bad_row;
    int bad_errno;
    pthread_mutex_t mu;
} io_job;

/* One row [hd] + its scales [sb] as stored, decoded by the resident decoder. */
static void *io_worker(void *arg)
{
    io_job *j = arg;
    const dsv4_etable *t = j->t;
    int64_t hd = t->w.k, sb = hd / t->w.bk;
    size_t blen = ((size_t)hd + 3 * DIO_ALIGN - 1) / DIO_ALIGN * DIO_ALIGN;
    uint8_t *w = malloc(hd), *s = malloc(sb);
    void *blk = aligned_alloc(DIO_ALIGN, blen);
    dsv4_weight one = t->w;
    one.n = 1;
    one.data = w;
    one.scale = s;
    uint64_t got = 0;
    for (;;) {
        pthread_mutex_lock(&j->mu);
        int i0 = j->next;
        j->next += 4;
        pthread_mutex_unlock(&j->mu);
        if (i0 >= j->n)
            break;
        for (int i = i0; i < i0 + 4 && i < j->n; i++) {
            int64_t a = -1, b = -1;
            if (w && s && blk) {
                a = read_at(t->fd_w, t->direct_w, blk, t->off_w + j->rows[i] * hd, (size_t)hd, w);
                b = a < 0 ? -1 : read_at(t->fd_s, t->direct_s, blk, t->off_s + j->rows[i] * sb, (size_t)sb, s);
            }
            if (a < 0 || b < 0) {
                int e = w && s && blk ? errno : ENOMEM;
                pthread_mutex_lock(&j->mu);
                if (j->bad_row < 0) {
                    j->bad_row = j->rows[i];
                    j->bad_errno = e;
                }
                pthread_mutex_unlock(&j->mu);
                continue;
            }
            got += (uint64_t)(a + b);
            dsv4_weight_row(&one, 0, j->out + (int64_t)i * hd);
        }
    }
    pthread_mutex_lock(&j->mu);
    j->bytes += got;
    pthread_mutex_unlock(&j->mu);
    free(w);
    free(s);
    free(blk);
    return NULL;
}

int dsv4_etable_rows(const dsv4_etable *t, const int64_t *rows, int n, float *out, uint64_t *bytes, dsv4_err *err)
{
    int64_t hd = t->w.k, sb = hd / t->w.bk;
    for (int i = 0; i < n; i++)
        if (rows[i] < 0 || rows[i] >= t->w.n)
            return dsv4_fail(err, DSV4_E_STATE, "%s: row %lld outside the table of %lld rows", t->w.name, (long long)rows[i],
                             (long long)t->w.n);
    if (!t->streamed) { /* each row decoded on its own: a prefill's thousands spread over the cores */
#pragma omp parallel for schedule(static) if (n >= 256)
        for (int i = 0; i < n; i++)
            dsv4_weight_row(&t->w, rows[i], out + (int64_t)i * hd);
        *bytes += (uint64_t)n * (hd + sb);
        return 0;
    }
    /* Rows are independent reads: several in flight at once (queue depth is what a drive's
     * random-read rate needs). Plain threads, not an OpenMP team: this runs on the prefetch
     * thread beside the forward's own team. */
    io_job job = {.t = t, .rows = rows, .n = n, .out = out, .bad_row = -1, .mu = PTHREAD_MUTEX_INITIALIZER};
    int nio = n < 16 * 4 ? (n + 3) / 4 : 16, started = 0;
    pthread_t th[16];
    for (int i = 1; i < nio; i++)
        started += !pthread_create(&th[started], NULL, io_worker, &job);
    io_worker(&job);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    *bytes += job.bytes;
    if (job.bad_row >= 0)
        return dsv4_fail(err, DSV4_E_IO, "reading row %lld of %s: %s", (long long)job.bad_row, t->w.name, strerror(job.bad_errno));
    return 0;
}

/* Residency probe: are 64 sampled rows of every table already in the page cache? mincore()
 * asks without touching them, so the probe itself warms nothing. Warm tables are read
 * through the mapping even when they are larger than half of RAM. */
static int tables_warm(const dsv4_model *m)
{
    long pg = sysconf(_SC_PAGESIZE);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    int in = 0, total = 0;
    for (int i = 0; i < m->cfg.n_engram; i++) {
        char name[64];
        snprintf(name, sizeof name, "layers.%d.engram.embed.weight", m->engram[i].layer);
        const dsv4_tensor *t = dsv4_st_find(m->st, name);
        if (!t || !t->nbytes)
            return 0;
        for (int k = 0; k < 64; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            uintptr_t a = ((uintptr_t)t->data + (uintptr_t)((s >> 11) % t->nbytes)) & ~(uintptr_t)(pg - 1);
            unsigned char v = 0;
            total++;
            in += !mincore((void *)a, (size_t)pg, &v) && (v & 1);
        }
    }
    return total && in * 10 >= total * 9;
}

int dsv4_engram_open(dsv4_model *m, int mode, dsv4_err *err)
{
    const dsv4_config *c = &m->cfg;
    if (!c->n_engram)
        return 0;
    if (mode == DSV4_ENGRAM_AUTO) {
        double total = 0, ram = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
        for (int i = 0; i < c->n_engram; i++)
            total += (double)c->engram_rows[i] * c->engram_head_dim * 33 / 32;
        mode = ram > 0 && total * 2 > ram && !tables_warm(m) ? DSV4_ENGRAM_STREAMED : DSV4_ENGRAM_RESIDENT;
    }
    m->engram_streamed = mode == DSV4_ENGRAM_STREAMED;
    for (int i = 0; i < c->n_engram; i++) {
        char p[64];
        snprintf(p, sizeof p, "layers.%d.engram.embed", m->engram[i].layer);
        if (dsv4_etable_open(&m->engram[i].table, m->st, p, c->engram_rows[i], c->engram_head_dim, m->engram_streamed, 1, err))
            return err->code;
        m->weight_bytes += m->engram[i].table.w.bytes;
    }
    return 0;
}

void dsv4_engram_close(dsv4_model *m)
{
    for (int i = 0; m->engram && i < m->cfg.n_engram; i++)
        dsv4_etable_close(&m->engram[i].table);
}

void dsv4_engram_stats(const dsv4_model *m, uint64_t *bytes, uint64_t *tokens, int *streamed)
{
    if (bytes)
        *bytes = m->engram_bytes;
    if (tokens)
        *tokens = m->engram_tokens;
    if (streamed)
        *streamed = m->engram_streamed;
}

void dsv4_engram_times(const dsv4_model *m, double *gather_s, double *stall_s)
{
    if (gather_s)
        *gather_s = m->engram_gather_s;
    if (stall_s)
        *stall_s = m->engram_stall_s;
}

int dsv4_engram_layout(const dsv4_model *m, int64_t *rows, int *cols)
{
    for (int i = 0; rows && i < m->cfg.n_engram; i++)
        rows[i] = m->cfg.engram_rows[i];
    if (cols)
        *cols = m->cfg.n_engram ? m->engram[0].cols : 0;
    return m->cfg.n_engram;
}

uint64_t dsv4_fnv1a64(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Random bytes for part k (0: e4m3 rows, never the NaN codes; 1: e8m0 scales near 2^0). */
static void synth_fill(uint8_t *p, size_t n, int k, uint64_t *s)
{
    for (size_t i = 0; i < n; i++) {
        uint8_t v = (uint8_t)splitmix(s);
        p[i] = k ? (uint8_t)(120 + v % 8) : ((v & 0x7f) == 0x7f ? v ^ 1 : v);
    }
}

void dsv4_etable_synth_data(uint8_t *w, uint8_t *sc, int64_t rows, int head_dim, uint64_t seed)
{
    uint64_t s = seed;
    synth_fill(w, (size_t)(rows * head_dim), 0, &s);
    synth_fill(sc, (size_t)(rows * (head_dim / 32)), 1, &s);
}

int dsv4_etable_synth(const char *path, const char *prefix, int64_t rows, int head_dim, uint64_t seed, int checksum,
                      dsv4_err *err)
{
    int64_t nw = rows * head_dim, ns = rows * (head_dim / 32);
    size_t chunk = (size_t)1 << 22;
    uint8_t *buf = malloc(chunk);
    if (!buf)
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    /* the checksum first (the data is a pure function of the seed), then the file */
    uint64_t h = DSV4_FNV1A64_INIT, s = seed;
    for (int k = 0; k < 2 && checksum; k++)
        for (int64_t done = 0, n = k ? ns : nw; done < n; done += (int64_t)chunk) {
            size_t m = (size_t)(n - done < (int64_t)chunk ? n - done : (int64_t)chunk);
            synth_fill(buf, m, k, &s);
            h = dsv4_fnv1a64(h, buf, m);
        }
    char hdr[1024], md[256] = "";
    if (checksum)
        snprintf(md, sizeof md, "\"%s.weight.fnv1a64\":\"%016llx\"", prefix, (unsigned long long)(checksum == 2 ? h ^ 1 : h));
    int hl = snprintf(hdr, sizeof hdr,
                      "{\"__metadata__\":{%s},"
                      "\"%s.weight\":{\"dtype\":\"F8_E4M3\",\"shape\":[%lld,%d],\"data_offsets\":[0,%lld]},"
                      "\"%s.scale\":{\"dtype\":\"F8_E8M0\",\"shape\":[%lld,%d],\"data_offsets\":[%lld,%lld]}}",
                      md, prefix, (long long)rows, head_dim, (long long)nw, prefix,
                      (long long)rows, head_dim / 32, (long long)nw, (long long)(nw + ns));
    while (hl % 8)
        hdr[hl++] = ' ';
    uint64_t hlen = (uint64_t)hl;
    FILE *f = fopen(path, "wb");
    int rc = !f || fwrite(&hlen, 8, 1, f) != 1 || fwrite(hdr, 1, hl, f) != (size_t)hl;
    s = seed;
    for (int k = 0; k < 2 && !rc; k++)
        for (int64_t done = 0, n = k ? ns : nw; done < n && !rc; done += (int64_t)chunk) {
            size_t m = (size_t)(n - done < (int64_t)chunk ? n - done : (int64_t)chunk);
            synth_fill(buf, m, k, &s);
            rc = fwrite(buf, 1, m, f) != m;
        }
    if (f && fclose(f))
        rc = 1;
    free(buf);
    return rc ? dsv4_fail(err, DSV4_E_IO, "%s: cannot write the synthetic table: %s", path, strerror(errno)) : 0;
}

/* The recorded checksum of a table, if its file's metadata has one: 1 found, 0 none. */
static int recorded_checksum(const dsv4_st *st, const dsv4_tensor *tw, uint64_t *out)
{
    const char *md = dsv4_st_metadata(st, tw->file);
    char key[600];
    snprintf(key, sizeof key, "\"%s.fnv1a64\"", tw->name);
    const char *p = md ? strstr(md, key) : NULL;
    if (!p)
        return 0;
    p += strlen(key);
    while (*p == ':' || *p == ' ' || *p == '"')
        p++;
    *out = strtoull(p, NULL, 16);
    return 1;
}

static int verify_checksum(const dsv4_etable *t, const dsv4_st *st, dsv4_err *err)
{
    const dsv4_tensor *tw = dsv4_st_find(st, t->w.name);
    char sname[600];
    snprintf(sname, sizeof sname, "%.*s.scale", (int)(strlen(t->w.name) - 7), t->w.name);
    const dsv4_tensor *ts = dsv4_st_find(st, sname);
    uint64_t want;
    if (!tw || !ts || !recorded_checksum(st, tw, &want))
        return 0;
    uint64_t h = dsv4_fnv1a64(DSV4_FNV1A64_INIT, tw->data, tw->nbytes);
    h = dsv4_fnv1a64(h, ts->data, ts->nbytes);
    if (h != want)
        return dsv4_fail(err, DSV4_E_MODEL, "%s: tensor %s: checksum %016llx does not match the recorded %016llx (a table from another revision?)",
                         dsv4_st_file_path(st, tw->file), t->w.name, (unsigned long long)h, (unsigned long long)want);
    return 0;
}
