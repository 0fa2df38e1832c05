/* dsml — parses DeepSeek model output into reasoning, visible content and tool calls.
 *
 * Output shape (V4.1): [reasoning] "</think>" content ["\n\n<｜DSML｜ calls>" invokes
 * "</｜DSML｜ calls>"] ["<｜end▁of▁sentence｜>"], where an invoke is
 *   <｜DSML｜ invoke name="NAME">\n<｜DSML｜ parameter name="K" string="true|false">V</｜DSML｜ parameter>...\n</｜DSML｜ invoke>
 * The parser is incremental: feed text as it is generated, in pieces of any size. Text that may
 * still turn out to be markup is held back, so no DSML byte ever reaches the content; a block
 * cut short at the end is dropped from its first marker on. Values with string="false" are
 * JSON (kept as a string when they do not parse); string="true" values are text; a parameter
 * named twice in one invoke keeps its first value. A malformed invoke (bad tag, missing name) is
 * dropped and counted in `malformed`. Nothing after an end-of-sentence marker counts. */
#ifndef DSV4_TEXT_DSML_H
#define DSV4_TEXT_DSML_H

#include <stddef.h>
#include <cjson/cJSON.h>
#include "core/err.h"
#include "text/buf.h"

typedef struct dsv4_dsml dsv4_dsml;

/* What the parser has produced; feed and finish append to it (reset the buffers between calls
 * to get deltas). calls: a cJSON array of {"name": ..., "arguments": {...}}. */
typedef struct dsv4_dsml_out {
    dsv4_buf content, reasoning;
    cJSON *calls;
    int has_reasoning; /* a reasoning part was seen (even an empty one) */
    int malformed;     /* invokes dropped as malformed or truncated */
    int truncated;     /* dsv4_dsml_finish_cut kept the last call as far as it parsed */
} dsv4_dsml_out;

/* in_reasoning: the generation started inside <think> (thinking mode), so text before
 * "</think>" is reasoning. With 0 the text is content, unless it opens with "<think>". */
dsv4_dsml *dsv4_dsml_new(int in_reasoning, dsv4_err *err);
/* v4: the older V4 (0731) tags, "<｜DSML｜tool_calls>" / "<｜DSML｜invoke" / "<｜DSML｜parameter". */
dsv4_dsml *dsv4_dsml_new_family(int in_reasoning, int v4, dsv4_err *err);
void dsv4_dsml_free(dsv4_dsml *p);
int dsv4_dsml_feed(dsv4_dsml *p, const char *s, size_t n, dsv4_dsml_out *out, dsv4_err *err);
/* Ends the stream: held-back text that cannot be markup comes out; an open block is dropped. */
int dsv4_dsml_finish(dsv4_dsml *p, dsv4_dsml_out *out, dsv4_err *err);
/* As dsv4_dsml_finish for a reply cut short (max_tokens): an invoke left open whose opening tag
 * is whole becomes the last call, with the parameters complete so far (out->truncated set). */
int dsv4_dsml_finish_cut(dsv4_dsml *p, dsv4_dsml_out *out, dsv4_err *err);
/* The invoke being read, as far as it parsed: {"name", "arguments": {the parameters complete so
 * far}}, or NULL when none is open (or its opening tag is not whole yet). Owned by the parser,
 * valid until the next call on it. Its arguments printed are a prefix, but for the closing
 * brace, of the finished call's. */
const cJSON *dsv4_dsml_open_call(dsv4_dsml *p);

void dsv4_dsml_out_init(dsv4_dsml_out *o);
void dsv4_dsml_out_free(dsv4_dsml_out *o);

#endif
