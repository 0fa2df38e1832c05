/* text — the text layer in one include: tokenizer (tokenizer.h), HF normalizers (normalize.h),
 * chat rendering (chat.h), DSML tool-call parsing (dsml.h), the Engram token map (token_map.h).
 * docs/text.md describes what each does and how it is tested. */
#ifndef DSV4_TEXT_TEXT_H
#define DSV4_TEXT_TEXT_H

#include "text/chat.h"
#include "text/dsml.h"
#include "text/normalize.h"
#include "text/token_map.h"
#include "text/tokenizer.h"

#endif
