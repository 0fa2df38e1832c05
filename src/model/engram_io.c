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

int dsv4_etable_rows(const dsv4_etable *t, const int64_t *rows, int n, float *out, uint64_t *bytes, dsv4_err *err)
{
    int64_t hd = t->w.k, sb = hd / t->w.bk;
    for (int i = 0; i < n; i++)
        if (rows[i] < 0 || rows[i] >= t->w.n)
            return dsv4_fail(err, DSV4_E_STATE, "%s: row %lld outside the table of %lld rows", t->w.name, (long long)rows[i],
                             (long long)t->w.n);
    if (!t->streamed) {
        for (int i = 0; i < n; i++)
            dsv4_weight_row(&t->w, rows[i], out + (int64_t)i * hd);
        *bytes += (uint64_t)n * (hd + sb);
        return 0;
    }
    /* one row [hd] + its scales [sb] as stored, decoded by the resident decoder */
    size_t blen = ((size_t)hd + 2 * DIO_ALIGN + DIO_ALIGN - 1) / DIO_ALIGN * DIO_ALIGN;
    uint8_t *w = malloc(hd), *s = malloc(sb);
    void *blk = aligned_alloc(DIO_ALIGN, blen);
    int rc = 0;
    if (!w || !s || !blk)
        rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory reading Engram rows");
    dsv4_weight one = t->w;
    one.n = 1;
    one.data = w;
    one.scale = s;
    for (int i = 0; i < n && !rc; i++) {
        int64_t a = read_at(t->fd_w, t->direct_w, blk, t->off_w + rows[i] * hd, (size_t)hd, w);
        int64_t b = a < 0 ? -1 : read_at(t->fd_s, t->direct_s, blk, t->off_s + rows[i] * sb, (size_t)sb, s);
        if (a < 0 || b < 0) {
            rc = dsv4_fail(err, DSV4_E_IO, "reading row %lld of %s: %s", (long long)rows[i], t->w.name, strerror(errno));
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

int dsv4_engram_open(dsv4_model *m, int mode, dsv4_err *err)
{
    const dsv4_config *c = &m->cfg;
    if (!c->n_engram)
        return 0;
    if (mode == DSV4_ENGRAM_AUTO) {
        double total = 0, ram = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
        for (int i = 0; i < c->n_engram; i++)
            total += (double)c->engram_rows[i] * c->engram_head_dim * 33 / 32;
        mode = ram > 0 && total * 2 > ram ? DSV4_ENGRAM_STREAMED : DSV4_ENGRAM_RESIDENT;
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
