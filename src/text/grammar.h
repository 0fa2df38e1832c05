/* grammar — constrained decoding's automata: a JSON-shaped grammar compiled from a JSON Schema
 * (or "any JSON object", or a forced DSML tool call) and a matcher that runs it over bytes.
 *
 * A grammar is a graph of nodes: leaves that read bytes (a literal, a set of literals, bounded
 * whitespace, a byte class repeated min..max times, a JSON string, a JSON number, raw text
 * that may not contain a marker) and composites that push children (sequence, alternation,
 * repetition with a separator). The matcher is a pushdown machine: a state is a small set of
 * stacks of frames (node, two counters), one stack per live parse, so alternatives that share a
 * prefix (anyOf, a number that may end or go on, whitespace before a comma or a bracket) are
 * followed together until the bytes tell them apart. A state is a plain value: copy it with
 * memcpy of dsv4_gstate_size bytes; equal states have equal bytes (threads are kept in the order
 * they arise, duplicates dropped), which is what the mask cache keys on.
 *
 * Termination: every grammar ends where its value ends; dsv4_gstate_accepts says the bytes so
 * far form a whole reply (end of sequence allowed) and dsv4_gstate_open that more bytes may
 * still follow. Every live thread can be completed: nesting is bounded (generic JSON turns to
 * scalars once a thread is 4·DSV4_G_NEST frames deep: 31 nested arrays), whitespace runs are
 * bounded (max_ws bytes), numbers are bounded in digits, so the only unbounded parts are string
 * and reasoning contents, which max_tokens bounds.
 *
 * Object members are generated in the schema's property order (a required one must appear, an
 * optional one may be skipped), as OpenAI's structured outputs write them; a JSON text with
 * the same members in another order is valid for the schema but not matched. */
#ifndef DSV4_TEXT_GRAMMAR_H
#define DSV4_TEXT_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "core/err.h"

#define DSV4_G_MAXT 16  /* live threads in one state */
#define DSV4_G_MAXD 96  /* frames in one thread */
#define DSV4_G_NEST 16  /* generic JSON: past 4·DSV4_G_NEST frames only scalars are allowed */

typedef struct dsv4_grammar dsv4_grammar;

typedef struct dsv4_gframe {
    uint32_t node, a, b;
} dsv4_gframe;

typedef struct dsv4_gstate {
    uint16_t nt, nf;               /* threads, frames over all threads */
    uint16_t len[DSV4_G_MAXT];     /* frames of each thread, bottom first, threads in order */
    dsv4_gframe f[DSV4_G_MAXT * DSV4_G_MAXD];
} dsv4_gstate;

typedef struct dsv4_grammar_opts {
    int max_ws;     /* bytes in one whitespace run between JSON tokens; 0: 8, -1: none */
    int thinking;   /* the reply starts inside reasoning: free text, then "</think>", then the value */
    int dsml_v4;    /* tool calls: the V4 (0731) tags instead of V4.1's */
    int max_calls;  /* tool calls in one block for tool_choice "required"; 0: 8 */
} dsv4_grammar_opts;

/* response_format {"type": "json_object"}: any JSON object. */
dsv4_grammar *dsv4_grammar_json_object(const dsv4_grammar_opts *o, dsv4_err *err);
/* response_format json_schema: the value must validate against schema (the subset in
 * docs/constrain.md; any other keyword that constrains values is refused, named in err). */
dsv4_grammar *dsv4_grammar_json_schema(const cJSON *schema, const dsv4_grammar_opts *o, dsv4_err *err);
/* A forced DSML tool call block: tools is an OpenAI tools array ({"type": "function",
 * "function": {"name", "parameters"}} or the bare function objects); name NULL allows one to
 * max_calls calls of any of them (tool_choice "required"), a name exactly one call of that one. */
dsv4_grammar *dsv4_grammar_tool_call(const cJSON *tools, const char *name, const dsv4_grammar_opts *o,
                                     dsv4_err *err);
void dsv4_grammar_free(dsv4_grammar *g);
int dsv4_grammar_n_nodes(const dsv4_grammar *g);

/* The start state. */
void dsv4_gstate_init(const dsv4_grammar *g, dsv4_gstate *s);
/* Bytes of s that matter: copy or compare this many from its start. */
size_t dsv4_gstate_size(const dsv4_gstate *s);
/* out = s after byte c; returns 0 (and out is garbage) when no thread takes c. out != s. */
int dsv4_gstate_feed(const dsv4_grammar *g, const dsv4_gstate *s, uint8_t c, dsv4_gstate *out);
/* Feeds n bytes in place; returns 0 when one is refused (s is then left as it was). */
int dsv4_gstate_feed_bytes(const dsv4_grammar *g, dsv4_gstate *s, const void *bytes, size_t n);
/* 1 when the bytes so far form a whole reply. */
int dsv4_gstate_accepts(const dsv4_grammar *g, const dsv4_gstate *s);
/* 1 when some byte may still follow (0 once the reply is complete and nothing can extend it). */
int dsv4_gstate_open(const dsv4_grammar *g, const dsv4_gstate *s);

/* Where the state sits in free text, for the mask's shortcut:
 * - DSV4_FREE_STRING: some thread is inside a JSON string at a character boundary; any run of
 *   string-safe characters, at most *str_room of them, keeps it alive (*str_room is UINT32_MAX
 *   without a maximum length, else the most characters any such thread may still take);
 * - DSV4_FREE_RAW: some thread is inside raw text without a maximum whose marker starts with
 *   '<', at a character boundary, with no marker byte pending: any run of characters without
 *   '<' or NUL keeps it alive;
 * - DSV4_FREE_RAW_AFTER: as FREE_RAW but with part of the marker just read; then such a run
 *   keeps it alive unless it starts with the rest of the marker (*raw_rest, *raw_rest_n bytes). */
enum { DSV4_FREE_STRING = 1, DSV4_FREE_RAW = 2, DSV4_FREE_RAW_AFTER = 4 };
int dsv4_gstate_free_text(const dsv4_grammar *g, const dsv4_gstate *s, uint32_t *str_room, const uint8_t **raw_rest,
                          size_t *raw_rest_n);

/* Whole-text check: 1 when text[0..n) is a complete reply of g. */
int dsv4_grammar_matches(const dsv4_grammar *g, const char *text, size_t n);

#endif
