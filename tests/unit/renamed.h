/* Test helper: a copy of a checkpoint folder with one tensor renamed in model.safetensors'
 * header (same length, so the header stays valid), for "a missing tensor is refused by name". */
#ifndef DSV4_TEST_RENAMED_H
#define DSV4_TEST_RENAMED_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "core/core.h"

/* Copies files[0..n) of dir into a fresh folder made from tmpl (mkdtemp), renaming `tensor` in
 * the one named model.safetensors; returns 0 (tmpl then holds the folder's path). */
static int renamed_copy(const char *dir, const char *const *files, int n, const char *tensor, char *tmpl)
{
    int made = mkdtemp(tmpl) != NULL;
    CHECK(made, "mkdtemp %s", tmpl);
    if (!made)
        return -1;
    for (int i = 0; i < n; i++) {
        char src[512], dst[512];
        snprintf(src, sizeof src, "%s/%s", dir, files[i]);
        snprintf(dst, sizeof dst, "%s/%s", tmpl, files[i]);
        size_t len = 0;
        char *b = dsv4_read_file(src, &len, NULL);
        if (b && !strcmp(files[i], "model.safetensors")) {
            char needle[160];
            snprintf(needle, sizeof needle, "\"%s\"", tensor);
            char *at = memmem(b, len, needle, strlen(needle));
            CHECK(at != NULL, "%s not in %s", tensor, src);
            if (at)
                at[1] = 'X';
        }
        FILE *f = fopen(dst, "wb");
        if (b && f)
            fwrite(b, 1, len, f);
        if (f)
            fclose(f);
        free(b);
    }
    return 0;
}

/* Removes what renamed_copy made. */
static void renamed_remove(const char *tmp, const char *const *files, int n)
{
    for (int i = 0; i < n; i++) {
        char dst[512];
        snprintf(dst, sizeof dst, "%s/%s", tmp, files[i]);
        remove(dst);
    }
    rmdir(tmp);
}

#endif
