/* grammar_impl — the node graph shared by the matcher (grammar.c) and the compilers
 * (grammar_schema.c, grammar_tools.c). Not a public header. */
#ifndef DSV4_TEXT_GRAMMAR_IMPL_H
#define DSV4_TEXT_GRAMMAR_IMPL_H

#include <stdint.h>
#include "text/grammar.h"

enum {
    G_LIT,    /* bytes lit[0..len): a = bytes matched */
    G_LITSET, /* one of n sorted literals: a = first candidate, b = bytes matched */
    G_WS,     /* 0..max JSON whitespace bytes: a = count */
    G_CLASS,  /* min..max bytes of a byte class: a = count */
    G_STR,    /* a JSON string, quotes included, min..max characters: a = phase, b = characters */
    G_RAW,    /* raw UTF-8 text without the marker, min..max characters: a = phase, b = characters */
    G_NUM,    /* a JSON number (integer: no fraction or exponent): a = phase, b = digits in part */
    G_SEQ,    /* children in order: a = next child */
    G_ALT,    /* one of the children: a = 0 before the choice, 1 after */
    G_REP,    /* item (sep item)*, min..max items: a = items, b = phase */
};

enum { G_FLAG_NEST = 1 }; /* G_ALT: a generic JSON value whose container options stop at DSV4_G_NEST */

typedef struct gnode {
    uint8_t kind, flags;
    uint32_t min, max;         /* counts: G_WS, G_CLASS, G_STR, G_RAW (characters), G_REP (items) */
    uint32_t *kids;            /* G_SEQ, G_ALT: children; G_REP: item, sep */
    uint32_t n_kids;
    uint8_t *lit;              /* G_LIT bytes, G_RAW marker */
    uint32_t len;
    uint8_t **lits;            /* G_LITSET, sorted bytewise */
    uint32_t *lens, n_lits;
    uint64_t cls[4];           /* G_CLASS byte set */
    uint8_t integer;           /* G_NUM */
} gnode;

struct dsv4_grammar {
    gnode *nodes;
    uint32_t n, cap;
    uint32_t root;
    uint8_t *nullable;         /* [n] the node can match the empty string */
    uint64_t (*first)[4];      /* [n] the bytes a match of the node can start with */
    int oom;
};

#define G_INF 0xFFFFFFFFu

dsv4_grammar *g_new(void);
/* Builders return the new node's id (the node store grows; never hold gnode pointers across them). */
uint32_t g_lit(dsv4_grammar *g, const void *s, size_t n);
uint32_t g_lits(dsv4_grammar *g, const char *s);
uint32_t g_litset(dsv4_grammar *g, char **lits, const size_t *lens, uint32_t n); /* copies, sorts, dedupes */
uint32_t g_ws(dsv4_grammar *g, uint32_t max);
uint32_t g_class(dsv4_grammar *g, const char *set, uint32_t min, uint32_t max); /* set: "a-z0-9_" ranges */
uint32_t g_str(dsv4_grammar *g, uint32_t min, uint32_t max);
uint32_t g_raw(dsv4_grammar *g, const char *marker, uint32_t min, uint32_t max);
uint32_t g_num(dsv4_grammar *g, int integer);
uint32_t g_seq(dsv4_grammar *g, const uint32_t *kids, uint32_t n);
uint32_t g_alt(dsv4_grammar *g, const uint32_t *kids, uint32_t n);
uint32_t g_rep(dsv4_grammar *g, uint32_t item, uint32_t sep, uint32_t min, uint32_t max);
/* Sets the children of a node made earlier (forward references, recursion). */
void g_set_kids(dsv4_grammar *g, uint32_t node, const uint32_t *kids, uint32_t n);
/* Computes the nullable table; call once the graph is complete. Returns 0, or -1 out of memory. */
int g_finish(dsv4_grammar *g, uint32_t root);

#define G_SEQ_OF(g, ...) g_seq((g), (const uint32_t[]){__VA_ARGS__}, sizeof((const uint32_t[]){__VA_ARGS__}) / sizeof(uint32_t))
#define G_ALT_OF(g, ...) g_alt((g), (const uint32_t[]){__VA_ARGS__}, sizeof((const uint32_t[]){__VA_ARGS__}) / sizeof(uint32_t))

/* Shared by the compilers: a JSON-value grammar for a schema node (grammar_schema.c). raw: a
 * string-typed value is written raw (DSML string="true"), i.e. without quotes or escapes, and
 * may not contain marker. */
typedef struct g_schema_ctx g_schema_ctx;
g_schema_ctx *g_schema_ctx_new(dsv4_grammar *g, const cJSON *root_schema, uint32_t max_ws, dsv4_err *err);
void g_schema_ctx_free(g_schema_ctx *c);
dsv4_grammar *g_schema_grammar(g_schema_ctx *c);
/* Returns the node or G_INF with err set. */
uint32_t g_schema_value(g_schema_ctx *c, const cJSON *schema, const char *path, dsv4_err *err);
/* 1 when the schema's values are all strings (so DSML writes them raw), after $ref. */
int g_schema_is_string(g_schema_ctx *c, const cJSON *schema);
/* The raw (unquoted) grammar of a string schema, for DSML string="true" values. */
uint32_t g_schema_raw_string(g_schema_ctx *c, const cJSON *schema, const char *marker, const char *path, dsv4_err *err);
/* Resolves a "$ref" chain; NULL with err set on a bad reference. */
const cJSON *g_schema_deref(g_schema_ctx *c, const cJSON *schema, const char *path, dsv4_err *err);
/* An object's members in property order (required ones present, optional ones skippable),
 * separated by sep_node; member builds one member's grammar (key and value). */
typedef uint32_t (*g_member_fn)(void *u, g_schema_ctx *c, const char *key, const cJSON *sub, const char *path,
                                dsv4_err *err);
uint32_t g_members(g_schema_ctx *c, const cJSON *schema, uint32_t sep_node, g_member_fn member, void *u,
                   const char *path, dsv4_err *err);
/* The reply around a value (thinking: free reasoning and "</think>" first). */
uint32_t g_reply(dsv4_grammar *g, const dsv4_grammar_opts *o, uint32_t body);
uint32_t g_max_ws(const dsv4_grammar_opts *o);
/* Generic JSON: any object / any value. */
uint32_t g_any_object(g_schema_ctx *c);
uint32_t g_any_value(g_schema_ctx *c);

#endif
