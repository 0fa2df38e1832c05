/* unicode — brings PCRE2's character classes to the Unicode version of the peer tokenizer.
 *
 * Hugging Face tokenizers (Rust, Oniguruma) classifies code points by Unicode 16; Debian 12's
 * PCRE2 10.42 by Unicode 14, and its \s also takes U+180E, which is no longer White_Space. The
 * pre-tokenizer patterns are rewritten before compiling so that \p{L} \p{M} \p{N} \p{P} \p{S}
 * also cover the code points assigned between those versions, and \s / \S mean White_Space
 * exactly. tests/unit/test_unicode.c checks every code point against the peer's classes. */
#ifndef DSV4_TEXT_UNICODE_H
#define DSV4_TEXT_UNICODE_H

/* Returns a malloc'd rewritten copy of an Oniguruma/PCRE2 pattern, or NULL when out of memory.
 * \P{X} inside a bracket class is left as it is (no such pattern in this family). */
char *dsv4_regex_adapt(const char *pattern);

#endif
