/* Engram table rows, resident or streamed. The released tables are ~95 GB each: on a machine
 * that cannot hold them they stay on disk and each step reads only the rows its tokens hash
 * to (24 per token per layer, 264 B each), by address with pread. O_DIRECT bypasses the page
 * cache where the file system allows it (cold tables: the cache would only evict weights);
 * reads then cover the aligned 4 KiB blocks around a row. Either path decodes the same bytes
 * with the same decoder, so streamed == resident bit for bit. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "core/core.h"
#include "model/model.h"

#define DIO_ALIGN 4096

static int open_pair(const char *path, int *fd, int *fdd)
{
    *fd = open(path, O_RDONLY);
    *fdd = *fd < 0 ? -1 : open(path, O_RDONLY | O_DIRECT);
    return *fd < 0 ? -1 : 0;
}

int dsv4_engram_open(dsv4_model *m, int mode, dsv4_err *err)
{
    const dsv4_config *c = &m->cfg;
    for (int i = 0; i < c->n_engram; i++)
        m->engram[i].fd_w = m->engram[i].fd_s = m->engram[i].direct_w = m->engram[i].direct_s = -1;
    if (!c->n_engram)
        return 0;
    if (mode == DSV4_ENGRAM_AUTO) {
        double total = 0, ram = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
        for (int i = 0; i < c->n_engram; i++)
            total += (double)m->engram[i].table.bytes;
        mode = ram > 0 && total * 2 > ram ? DSV4_ENGRAM_STREAMED : DSV4_ENGRAM_RESIDENT;
    }
    if (mode != DSV4_ENGRAM_STREAMED)
        return 0;
    m->engram_streamed = 1;
    for (int i = 0; i < c->n_engram; i++) {
        dsv4_engram *e = &m->engram[i];
        char sname[128];
        snprintf(sname, sizeof sname, "layers.%d.engram.embed.scale", e->layer);
        const dsv4_tensor *tw = dsv4_st_find(m->st, e->table.name), *ts = dsv4_st_find(m->st, sname);
        if (!tw || !ts || e->table.bn != 1 || !e->table.scale_e8m0)
            return dsv4_fail(err, DSV4_E_MODEL, "tensor %s: streaming needs one e8m0 scale row per table row", e->table.name);
        e->off_w = dsv4_st_file_offset(m->st, tw);
        e->off_s = dsv4_st_file_offset(m->st, ts);
        const char *pw = dsv4_st_file_path(m->st, tw->file), *ps = dsv4_st_file_path(m->st, ts->file);
        if (e->off_w < 0 || e->off_s < 0 || open_pair(pw, &e->fd_w, &e->direct_w) || open_pair(ps, &e->fd_s, &e->direct_s))
            return dsv4_fail(err, DSV4_E_IO, "%s: cannot open the Engram table %s for streaming: %s", pw, e->table.name,
                             strerror(errno));
    }
    return 0;
}

void dsv4_engram_close(dsv4_model *m)
{
    for (int i = 0; m->engram && i < m->cfg.n_engram; i++) {
        dsv4_engram *e = &m->engram[i];
        int fds[4] = {e->fd_w, e->fd_s, e->direct_w, e->direct_s};
        for (int k = 0; k < 4; k++)
            if (fds[k] >= 0)
                close(fds[k]);
    }
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

int dsv4_engram_rows(const dsv4_model *m, int ei, const int64_t *rows, int n, float *out, uint64_t *bytes, dsv4_err *err)
{
    const dsv4_engram *e = &m->engram[ei];
    int64_t hd = e->table.k, sb = hd / e->table.bk;
    for (int i = 0; i < n; i++)
        if (rows[i] < 0 || rows[i] >= e->table.n)
            return dsv4_fail(err, DSV4_E_STATE, "Engram layer %d: row %lld outside the table of %lld rows", e->layer,
                             (long long)rows[i], (long long)e->table.n);
    if (!m->engram_streamed) {
        for (int i = 0; i < n; i++)
            dsv4_weight_row(&e->table, rows[i], out + (int64_t)i * hd);
        *bytes += (uint64_t)n * (hd + sb);
        return 0;
    }
    /* one row [hd] + its scales [sb] as stored, decoded by the resident decoder */
    size_t blen = (size_t)(hd + 2 * DIO_ALIGN);
    uint8_t *w = malloc(hd), *s = malloc(sb);
    void *blk = aligned_alloc(DIO_ALIGN, (blen + DIO_ALIGN - 1) / DIO_ALIGN * DIO_ALIGN);
    int rc = 0;
    if (!w || !s || !blk)
        rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory reading Engram rows");
    dsv4_weight one = e->table;
    one.n = 1;
    one.data = w;
    one.scale = s;
    for (int i = 0; i < n && !rc; i++) {
        int64_t a = read_at(e->fd_w, e->direct_w, blk, e->off_w + rows[i] * hd, (size_t)hd, w);
        int64_t b = a < 0 ? -1 : read_at(e->fd_s, e->direct_s, blk, e->off_s + rows[i] * sb, (size_t)sb, s);
        if (a < 0 || b < 0) {
            rc = dsv4_fail(err, DSV4_E_IO, "%s: reading row %lld of %s: %s", dsv4_st_file_path(m->st, 0), (long long)rows[i],
                           e->table.name, strerror(errno));
            break;
        }
        *bytes += (uint64_t)(a + b);
        dsv4_weight_row(&one, 0, out + (int64_t)i * hd);
    }
    free(w);
    free(s);
    free(blk);
    return rc;
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
