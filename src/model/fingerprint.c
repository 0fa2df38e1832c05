/* A loaded model's fingerprint, which the ranks of a several-GPU run compare before their
 * first step (docs/multigpu.md): the shapes the config gives and the checkpoint's tensor
 * directory (names, dtypes, shapes, byte counts) with each tensor's first bytes, so two
 * checkpoints of one architecture (V4.1-Flash and its 1017 release) differ too. */
#include <string.h>
#include "model/model.h"

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

#define MIX(h, v) fnv((h), &(v), sizeof(v))

uint64_t dsv4_model_fingerprint(const dsv4_model *m)
{
    uint64_t h = 0xcbf29ce484222325ull;
    dsv4_model_info in;
    dsv4_model_get_info(m, &in);
    h = fnv(h, in.family, strlen(in.family));
    int dims[] = {in.vocab_size, in.hidden_size, in.n_layers, in.n_heads, in.head_dim, in.bos_id, in.eos_id,
                  m->cfg.n_experts, m->cfg.n_active, (int)m->numerics, m->kv_prod};
    h = fnv(h, dims, sizeof dims);
    h = MIX(h, in.max_position);
    h = MIX(h, in.weight_bytes);
    int n = m->st ? dsv4_st_count(m->st) : 0;
    for (int i = 0; i < n; i++) {
        const dsv4_tensor *t = dsv4_st_at(m->st, i);
        h = fnv(h, t->name, strlen(t->name) + 1);
        int dt = (int)t->dtype;
        h = MIX(h, dt);
        h = fnv(h, t->shape, (size_t)t->ndim * sizeof t->shape[0]);
        h = MIX(h, t->nbytes);
        h = fnv(h, t->data, t->nbytes < 16 ? t->nbytes : 16);
    }
    return h;
}
