/* The model fingerprint the ranks of `--gpus N` compare before their first step
 * (docs/multigpu.md): the same checkpoint with the same options gives the same value; another
 * checkpoint, other numerics, or one byte changed at the start of a tensor gives another. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "dsv4.h"
#include "model/diag.h"

static uint64_t print_of(const char *dir, dsv4_numerics nm, int *ok)
{
    dsv4_load_opts o = {.numerics = nm};
    dsv4_err err = {0};
    dsv4_model *m = dsv4_model_load(dir, &o, &err);
    CHECK(m != NULL, "load %s: %s", dir, err.msg);
    *ok = m != NULL;
    uint64_t h = m ? dsv4_model_fingerprint(m) : 0;
    dsv4_model_free(m);
    return h;
}

static int copy_file(const char *from, const char *to)
{
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    int ok = a && b;
    char buf[1 << 16];
    size_t n;
    while (ok && (n = fread(buf, 1, sizeof buf, a)) > 0)
        ok = fwrite(buf, 1, n, b) == n;
    if (a)
        fclose(a);
    if (b && fclose(b))
        ok = 0;
    return ok;
}

int main(void)
{
    const char *a = CHECK_FIXTURES "/v4/v4-tiny-a", *b = CHECK_FIXTURES "/v4/v4-tiny-b",
               *v41 = CHECK_FIXTURES "/v41/v41-tiny-a";
    int ok1, ok2, ok3, ok4, ok5, ok6;
    uint64_t ha = print_of(a, DSV4_NUMERICS_DEFAULT, &ok1), ha2 = print_of(a, DSV4_NUMERICS_DEFAULT, &ok2);
    uint64_t hb = print_of(b, DSV4_NUMERICS_DEFAULT, &ok3);
    uint64_t hf = print_of(v41, DSV4_NUMERICS_FP32, &ok4), hr = print_of(v41, DSV4_NUMERICS_REF, &ok5);
    CHECK(ok1 && ok2 && ha == ha2, "two loads of one checkpoint: %016llx, %016llx", (unsigned long long)ha,
          (unsigned long long)ha2);
    CHECK(ok3 && ha != hb, "two checkpoints of one architecture share a fingerprint");
    CHECK(ok4 && ok5 && hf != hr, "fp32 and REF numerics share a fingerprint");
    /* a copy of v4-tiny-a with the first byte of the data region (some tensor's first) changed */
    char dir[] = "/tmp/dsv4-fpXXXXXX", p[256], q[256];
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(p, sizeof p, "%s/config.json", a);
    snprintf(q, sizeof q, "%s/config.json", dir);
    int copied = copy_file(p, q);
    snprintf(p, sizeof p, "%s/model.safetensors", a);
    snprintf(q, sizeof q, "%s/model.safetensors", dir);
    copied = copied && copy_file(p, q);
    CHECK(copied, "copying %s to %s", a, dir);
    FILE *f = fopen(q, "r+b");
    uint64_t hl = 0;
    unsigned char hdr[8], c = 0;
    if (f && fread(hdr, 1, 8, f) == 8) {
        for (int i = 7; i >= 0; i--)
            hl = hl << 8 | hdr[i];
        if (!fseek(f, (long)(8 + hl), SEEK_SET) && fread(&c, 1, 1, f) == 1 && !fseek(f, (long)(8 + hl), SEEK_SET)) {
            c ^= 0x01;
            fwrite(&c, 1, 1, f);
        }
    }
    if (f)
        fclose(f);
    uint64_t hc = print_of(dir, DSV4_NUMERICS_DEFAULT, &ok6);
    CHECK(ok6 && hc != ha, "one byte changed at a tensor's start left the fingerprint as it was");
    /* control: the copy unchanged gives the original's */
    if (copy_file(p, q)) {
        int ok7;
        uint64_t hs = print_of(dir, DSV4_NUMERICS_DEFAULT, &ok7);
        CHECK(ok7 && hs == ha, "an unchanged copy in another folder has another fingerprint");
    }
    unlink(q);
    snprintf(q, sizeof q, "%s/config.json", dir);
    unlink(q);
    rmdir(dir);
    printf("  v4-tiny-a %016llx, v4-tiny-b %016llx, v41-tiny-a fp32 %016llx / REF %016llx, one byte changed %016llx\n",
           (unsigned long long)ha, (unsigned long long)hb, (unsigned long long)hf, (unsigned long long)hr,
           (unsigned long long)hc);
    return check_summary("fingerprint");
}
