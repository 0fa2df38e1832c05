/* Device buffers for the CUDA tests, through the backend `gpu` the including file defines. */
#ifndef DSV4_DEV_BUF_H
#define DSV4_DEV_BUF_H

/* A device copy of n bytes of host (the backend's alloc + upload); host NULL: uninitialised. */
static void *to_dev(const void *host, size_t bytes)
{
    void *d = gpu->alloc(bytes);
    CHECK(d != NULL, "alloc %zu bytes failed", bytes);
    if (d && host)
        gpu->upload(d, host, bytes);
    return d;
}

/* The host copy of a device buffer (malloc'd). */
static void *from_dev(const void *d, size_t bytes)
{
    void *h = malloc(bytes ? bytes : 1);
    gpu->download(h, d, bytes);
    return h;
}

/* Whether a device buffer holds exactly the host bytes. */
static inline int dev_equal(const void *d, const void *host, size_t bytes)
{
    void *h = from_dev(d, bytes);
    int same = !memcmp(h, host, bytes);
    free(h);
    return same;
}
#endif
