/* jinja — a Jinja subset for chat templates that checkpoints ship in tokenizer_config.json.
 *
 * Supported: text with {{ }}, {% %}, {# #}, "-" whitespace control, trim_blocks and
 * lstrip_blocks (on, as transformers and @huggingface/jinja render chat templates); statements
 * if/elif/else, for (with loop.index/index0/first/last/length/revindex, tuple targets, else),
 * set (names and namespace attributes); expressions with literals (strings, numbers, true/false/
 * none, lists, dicts), attributes, subscripts and slices, calls, filters, tests (is [not]),
 * not/and/or, comparisons, in/not in, + - * / % ~, and `a if c else b`; functions namespace(),
 * range(), raise_exception(); string methods strip/lstrip/rstrip/startswith/endswith/split/
 * upper/lower/replace/title; dict methods get/items/keys/values; filters length, count, trim,
 * tojson, upper, lower, string, first, last, join, default/d, safe, list, capitalize, replace,
 * int. Output of values follows @huggingface/jinja (none and undefined print nothing; true/false
 * print in lower case). Anything else is an error naming what is not supported. */
#ifndef DSV4_TEXT_JINJA_H
#define DSV4_TEXT_JINJA_H

#include <stddef.h>
#include <cjson/cJSON.h>
#include "core/err.h"

/* Renders template text with the variables of ctx (a JSON object: messages, tools, bos_token,
 * add_generation_prompt, ...). *out is malloc'd and NUL-terminated. */
int dsv4_jinja_render(const char *tmpl, const cJSON *ctx, char **out, size_t *out_len, dsv4_err *err);

#endif
