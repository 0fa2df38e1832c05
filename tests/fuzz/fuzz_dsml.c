/* libFuzzer target: the DSML output parser. The first byte picks the mode (bit 0: start inside
 * reasoning, bit 1: the V4 tags) and a piece length; the rest is model output. It is parsed once
 * whole and once fed in pieces: the two must give the same content, reasoning and calls, as the
 * parser promises for pieces of any size. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "text/dsml.h"

static int parse(const char *s, size_t n, size_t piece, int flags, dsv4_dsml_out *out)
{
    dsv4_err err = {0};
    dsv4_dsml *p = dsv4_dsml_new_family(flags & 1, (flags >> 1) & 1, &err);
    if (!p)
        abort();
    dsv4_dsml_out_init(out);
    int rc = 0;
    for (size_t at = 0; at < n && !rc; at += piece)
        rc = dsv4_dsml_feed(p, s + at, n - at < piece ? n - at : piece, out, &err);
    if (!rc)
        rc = dsv4_dsml_finish(p, out, &err);
    dsv4_dsml_free(p);
    return rc;
}

static int same_buf(const dsv4_buf *a, const dsv4_buf *b)
{
    return a->n == b->n && (!a->n || !memcmp(a->p, b->p, a->n));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int flags = data[0] & 3;
    size_t piece = 1 + (data[0] >> 2);
    const char *s = (const char *)data + 1;
    size_t n = size - 1;
    dsv4_dsml_out whole, parts;
    int r1 = parse(s, n, n ? n : 1, flags, &whole);
    int r2 = parse(s, n, piece, flags, &parts);
    if (r1 != r2)
        abort();
    if (!r1) {
        char *c1 = cJSON_PrintUnformatted(whole.calls), *c2 = cJSON_PrintUnformatted(parts.calls);
        if (!same_buf(&whole.content, &parts.content) || !same_buf(&whole.reasoning, &parts.reasoning) || strcmp(c1, c2) ||
            whole.malformed != parts.malformed || whole.has_reasoning != parts.has_reasoning)
            abort();
        free(c1);
        free(c2);
    }
    dsv4_dsml_out_free(&whole);
    dsv4_dsml_out_free(&parts);
    return 0;
}
