/* libFuzzer target: config.json. Each input is parsed; one that parses is loaded against the
 * fixture checkpoint of its family (v4-tiny-a, v41-tiny-a from tests/fixtures, or $DSV4_FIXTURES), so the
 * values reach the binding, the layout checks and the rope tables. Loading fails with a message
 * or gives a model with finite, positive rope frequencies that runs a short prompt to finite
 * logits; it never crashes, hangs or leaks. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "core/core.h"
#include "io/config.h"
#include "model/model.h"

typedef struct {
    char dir[1024];
    char *img;
    size_t n;
} fixture;

static fixture v4, v41;

static void load_fixture(fixture *f, const char *root, const char *name)
{
    char p[1200];
    snprintf(f->dir, sizeof f->dir, "%s/%s", root, name);
    snprintf(p, sizeof p, "%s/model.safetensors", f->dir);
    dsv4_err err = {0};
    f->img = dsv4_read_file(p, &f->n, &err);
    if (!f->img) {
        fprintf(stderr, "fuzz_config: %s (run from the repository root, or set DSV4_FIXTURES to tests/fixtures)\n", err.msg);
        exit(2);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    const char *s = getenv("DSV4_FIXTURES");
    load_fixture(&v4, s ? s : "tests/fixtures", "v4/v4-tiny-a");
    load_fixture(&v41, s ? s : "tests/fixtures", "v41/v41-tiny-a");
    return 0;
}

/* A model that loads runs a short prompt (past the first compressed windows) to finite logits. */
static void run_prompt(dsv4_model *m)
{
    static const int32_t ids[9] = {0, 5, 17, 200, 3, 900, 42, 7, 1};
    dsv4_err err = {0};
    dsv4_seq *s = dsv4_seq_new(m, &err);
    if (!s)
        abort();
    float *logits = malloc((size_t)m->cfg.vocab * sizeof *logits);
    const int32_t *idp = ids;
    int n = 9;
    dsv4_batch b = {.n_seqs = 1, .seqs = &s, .ids = &idp, .n_ids = &n, .logits = logits};
    if (dsv4_forward(m, &b, &err))
        abort();
    for (int i = 0; i < m->cfg.vocab; i++)
        if (!isfinite(logits[i]))
            abort();
    free(logits);
    dsv4_seq_free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *txt = malloc(size + 1);
    memcpy(txt, data, size);
    txt[size] = 0;
    dsv4_config c;
    dsv4_err err = {0};
    if (dsv4_config_parse(txt, "fuzz/config.json", &c, &err)) {
        if (!err.msg[0])
            abort();
        free(txt);
        return 0;
    }
    const fixture *f = c.family == DSV4_FAMILY_V41 ? &v41 : &v4;
    void *map = mmap(NULL, f->n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED)
        abort();
    memcpy(map, f->img, f->n);
    /* the label is the fixture's folder: V4.1 finds its token_map.json there */
    dsv4_load_opts o = {.n_threads = 1};
    dsv4_model *m = dsv4_model_from_memory(txt, map, f->n, f->dir, &o, &err);
    if (!m && !err.msg[0])
        abort();
    for (int i = 0; m && i < m->cfg.rope_dim / 2; i++) /* an accepted config gives usable rope frequencies */
        if (!(isfinite(m->inv_freq_main[i]) && m->inv_freq_main[i] > 0 && isfinite(m->inv_freq_compress[i]) &&
              m->inv_freq_compress[i] > 0))
            abort();
    if (m)
        run_prompt(m);
    dsv4_model_free(m);
    free(txt);
    return 0;
}
