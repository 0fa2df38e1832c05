/* Test helper: the byte-level BPE alphabet (GPT-2's bytes-to-unicode map, which Hugging Face's
 * ByteLevel pre-tokenizer uses) for tests that build a small tokenizer.json of their own. */
#ifndef DSV4_TEST_BYTELEVEL_H
#define DSV4_TEST_BYTELEVEL_H

#include <stdio.h>
#include <stdlib.h>
#include <cjson/cJSON.h>

/* UTF-8 of the byte-level alphabet character for byte b, NUL-terminated (at most 3 bytes). */
static inline void bytelevel_spell(int b, char *out)
{
    int n = 0, cp = -1;
    for (int x = 0; x < 256; x++) {
        int keep = (x >= '!' && x <= '~') || (x >= 0xa1 && x <= 0xac) || (x >= 0xae && x <= 0xff);
        int c = keep ? x : 256 + n++;
        if (x == b)
            cp = c;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        out[2] = 0;
    }
}

/* Writes root (consumed) to path as the test's tokenizer.json. */
static inline void bytelevel_save(cJSON *root, const char *path)
{
    char *txt = cJSON_Print(root);
    FILE *f = fopen(path, "w");
    if (f && txt)
        fputs(txt, f);
    if (f)
        fclose(f);
    free(txt);
    cJSON_Delete(root);
}

#endif
