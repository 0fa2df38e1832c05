/* A human-readable summary of a loaded model: config, layer schedule, tensors by storage
 * form, and what a sequence's state costs per token of context. */
#include <stdio.h>
#include <unistd.h>
#include <string.h>
#include "core/core.h"
#include "kernels/kv_format.h"
#include "model/model.h"

void dsv4_state_cost(const dsv4_model *m, int64_t ctx, dsv4_state_cost_t *out)
{
    const dsv4_config *c = &m->cfg;
    memset(out, 0, sizeof *out);
    for (int i = 0; i < c->n_layers; i++) {
        const dsv4_layer *L = &m->layers[i];
        int64_t win = ctx < c->window ? ctx : c->window;
        out->window_bytes += (double)win * c->head_dim * 4;
        out->window_bytes_q += (double)win * dsv4_kv_row_bytes(DSV4_KV_WINDOW, c->head_dim);
        if (!L->own_ent)
            continue;
        int64_t ne = ctx / L->ratio;
        out->entry_bytes += (double)ne * c->head_dim * 4;
        out->entry_bytes_q += (double)ne * dsv4_kv_row_bytes(DSV4_KV_MAIN, c->head_dim);
        if (L->own_ikey) {
            out->ikey_bytes += (double)ne * c->index_dim * 4;
            out->ikey_bytes_q += (double)ne * dsv4_kv_row_bytes(DSV4_KV_INDEX, c->index_dim);
        }
    }
}

void dsv4_model_print_info(const dsv4_model *m, FILE *f)
{
    const dsv4_config *c = &m->cfg;
    fprintf(f, "model     %s (%s)\n", m->dir, c->family == DSV4_FAMILY_V41 ? "deepseek_v41" : "deepseek_v4");
    fprintf(f, "shape     vocab %d, width %d, %d layers, %d heads x %d (rope %d), q rank %d, out %d groups x %d, window %d\n",
            c->vocab, c->dim, c->n_layers, c->n_heads, c->head_dim, c->rope_dim, c->q_lora, c->o_groups, c->o_lora, c->window);
    fprintf(f, "moe       %d experts, %d active, %d shared, inter %d, route scale %g, swiglu limit %g\n", c->n_experts,
            c->n_active, c->n_shared, c->moe_inter, c->route_scale, c->swiglu_limit);
    fprintf(f, "indexer   %d heads x %d, top-%d\n", c->index_heads, c->index_dim, c->index_topk);
    fprintf(f, "hc        %d streams, %d Sinkhorn iterations, eps %g; norm eps %g\n", c->hc_mult, c->hc_iters, c->hc_eps,
            c->norm_eps);
    fprintf(f, "rope      main theta %g; compressed theta %g", c->rope_main.theta, c->rope_compress.theta);
    if (c->rope_compress.yarn)
        fprintf(f, " with YaRN factor %g, original %g, beta %g/%g", c->rope_compress.factor, c->rope_compress.orig_max_pos,
                c->rope_compress.beta_fast, c->rope_compress.beta_slow);
    fprintf(f, "\nnumerics  %s\n", m->numerics == DSV4_NUMERICS_REF ? "ref" : "fp32");
    if (c->family == DSV4_FAMILY_V41) {
        fprintf(f, "csa2      kv sources");
        for (int i = 0; i < c->n_kv_source; i++)
            fprintf(f, " %d", c->kv_source[i]);
        fprintf(f, "; index sources");
        for (int i = 0; i < c->n_index_source; i++)
            fprintf(f, " %d", c->index_source[i]);
        fprintf(f, "; candidate source %d (top %d blocks of %d)\n", c->candidate_source, c->candidate_topk_blocks,
                c->candidate_block_size);
    }
    if (c->n_engram) { /* the memory admission plan: weights resident, tables by their mode */
        double tb = 0, ram = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
        for (int i = 0; i < c->n_engram; i++)
            tb += (double)m->engram[i].table.w.bytes;
        fprintf(f, "engram    layers");
        for (int i = 0; i < c->n_engram; i++)
            fprintf(f, " %d (%lld rows)", c->engram_layer[i], (long long)c->engram_rows[i]);
        fprintf(f, "; 2..%d-grams x %d heads of %d; tables %.3f GB, %s\n", c->engram_max_ngram, c->engram_heads,
                c->engram_head_dim, tb / 1e9, m->engram_streamed ? "streamed" : "resident");
        fprintf(f, "memory    weights resident %.3f GB + tables %s %.3f GB; RAM %.1f GB\n", (m->weight_bytes - tb) / 1e9,
                m->engram_streamed ? "on disk" : "mapped", tb / 1e9, ram / 1e9);
    }
    fprintf(f, "layers   ");
    for (int i = 0; i < c->n_layers; i++) {
        const dsv4_layer *L = &m->layers[i];
        if (c->family == DSV4_FAMILY_V41) { /* CSA2 roles: kv = KV source, idx = index source, cand = candidate source */
            fprintf(f, " %d:%s", i, L->engram >= 0 ? "engram+" : "");
            if (!L->ratio)
                fprintf(f, "SWA");
            else
                fprintf(f, "r%d%s%s%s", L->ratio, L->own_ent ? "+kv" : "", L->index_source ? "+idx" : "", L->cand_source ? "+cand" : "");
            continue;
        }
        fprintf(f, " %d:%s%s", i, !L->ratio ? "SWA" : L->csa ? "CSA" : "HCA", L->hash ? "+hash" : "");
        if (L->ratio)
            fprintf(f, "/%d", L->ratio);
    }
    fprintf(f, "\n");
    int nt = dsv4_st_count(m->st);
    size_t by_dtype[DSV4_DT_COUNT] = {0}, n_dtype[DSV4_DT_COUNT] = {0};
    for (int i = 0; i < nt; i++) {
        const dsv4_tensor *t = dsv4_st_at(m->st, i);
        by_dtype[t->dtype] += t->nbytes;
        n_dtype[t->dtype]++;
    }
    fprintf(f, "tensors   %d in %s, %.1f MB as stored\n", nt, m->dir, dsv4_st_total_bytes(m->st) / 1e6);
    for (int d = 0; d < DSV4_DT_COUNT; d++)
        if (n_dtype[d])
            fprintf(f, "  %-8s %6zu tensors %12.3f MB\n", dsv4_dtype_name((dsv4_dtype)d), n_dtype[d], by_dtype[d] / 1e6);
    int64_t ctxs[] = {4096, 131072};
    for (int k = 0; k < 2; k++) {
        dsv4_state_cost_t sc;
        dsv4_state_cost(m, ctxs[k], &sc);
        double tot = sc.window_bytes + sc.entry_bytes + sc.ikey_bytes, totq = sc.window_bytes_q + sc.entry_bytes_q + sc.ikey_bytes_q;
        fprintf(f, "state @%lld tokens: exact caches %.1f MB (window %.1f, entries %.1f, index keys %.1f) = %.0f B/token; "
                   "production caches %.1f MB = %.0f B/token\n",
                (long long)ctxs[k], tot / 1e6, sc.window_bytes / 1e6, sc.entry_bytes / 1e6, sc.ikey_bytes / 1e6,
                tot / ctxs[k], totq / 1e6, totq / ctxs[k]);
    }
}

static size_t wbytes(const dsv4_weight *w) { return w->data ? w->bytes : 0; }

/* Every weight a token of layer L multiplies through but the routed experts. */
#define DENSE 16
static void dense_of(const dsv4_layer *L, const dsv4_weight **out)
{
    const dsv4_weight *all[DENSE] = {&L->wq_a, &L->wq_b, &L->wkv, &L->wo_a, &L->wo_b, &L->comp.wkv, &L->comp.wgate,
                                     &L->icomp.wkv, &L->icomp.wgate, &L->iwq_b, &L->iweights, &L->gate,
                                     &L->sw1, &L->sw2, &L->sw3, &L->iwk};
    memcpy(out, all, sizeof all);
}

size_t dsv4_decode_weight_bytes(const dsv4_model *m)
{
    const dsv4_config *c = &m->cfg;
    size_t s = wbytes(&m->head) + (size_t)c->dim * 2;
    for (int i = 0; i < c->n_layers; i++) {
        const dsv4_layer *L = &m->layers[i];
        const dsv4_weight *all[DENSE];
        dense_of(L, all);
        for (size_t k = 0; k < DENSE; k++)
            s += wbytes(all[k]);
        size_t ex = 0;
        for (int e = 0; e < c->n_experts; e++)
            ex += wbytes(&L->w1[e]) + wbytes(&L->w2[e]) + wbytes(&L->w3[e]);
        s += ex / c->n_experts * c->n_active;
        if (L->engram >= 0) /* the projection; table rows are counted by the Engram reader */
            s += wbytes(&m->engram[L->engram].wkv);
    }
    return s;
}

double dsv4_decode_host_bytes(const dsv4_model *m)
{
    const dsv4_config *c = &m->cfg;
    size_t (*hb)(const dsv4_weight *) = m->be ? m->be->host_bytes : NULL;
    if (!hb)
        return 0;
    double s = (double)hb(&m->head) + (m->embed.n > 0 ? (double)hb(&m->embed) / m->embed.n : 0);
    for (int i = 0; i < c->n_layers; i++) {
        const dsv4_layer *L = &m->layers[i];
        const dsv4_weight *all[DENSE];
        dense_of(L, all);
        for (size_t k = 0; k < DENSE; k++)
            s += all[k]->data ? (double)hb(all[k]) : 0;
        double ex = 0;
        for (int e = 0; e < c->n_experts && L->w1; e++)
            ex += (double)hb(&L->w1[e]) + hb(&L->w2[e]) + hb(&L->w3[e]);
        s += ex / c->n_experts * c->n_active;
    }
    return s;
}

size_t dsv4_decode_state_bytes(const dsv4_model *m, int64_t ctx)
{
    const dsv4_config *c = &m->cfg;
    size_t s = 0, d = (size_t)c->head_dim * sizeof(float);
    for (int i = 0; i < c->n_layers; i++) {
        const dsv4_layer *L = &m->layers[i];
        s += (size_t)(ctx < c->window ? ctx : c->window) * d;
        if (!L->ratio)
            continue;
        int64_t nvis = ctx / L->ratio;
        if (L->csa)
            s += (size_t)(nvis < c->index_topk ? nvis : c->index_topk) * d + (size_t)nvis * c->index_dim * sizeof(float);
        else
            s += (size_t)nvis * d;
    }
    return s;
}

static double welems(const dsv4_weight *w) { return w->data ? (double)w->n * (double)w->k : 0; }

double dsv4_token_params(const dsv4_model *m)
{
    const dsv4_config *c = &m->cfg;
    double s = 0;
    for (int i = 0; i < c->n_layers; i++) {
        const dsv4_layer *L = &m->layers[i];
        const dsv4_weight *all[DENSE];
        dense_of(L, all);
        for (size_t k = 0; k < DENSE; k++)
            s += welems(all[k]);
        if (L->w1)
            s += c->n_active * (welems(&L->w1[0]) + welems(&L->w2[0]) + welems(&L->w3[0]));
    }
    return s;
}

double dsv4_decode_step_bytes(const dsv4_model *m, int lanes, int64_t ctx)
{
    const dsv4_config *c = &m->cfg;
    double ex = 0, miss = 1;
    for (int i = 0; i < c->n_layers; i++) {
        const dsv4_layer *L = &m->layers[i];
        if (L->w1)
            ex += (double)(wbytes(&L->w1[0]) + wbytes(&L->w2[0]) + wbytes(&L->w3[0]));
    }
    for (int i = 0; i < lanes; i++)
        miss *= 1.0 - (double)c->n_active / c->n_experts;
    double dense = (double)dsv4_decode_weight_bytes(m) - ex * c->n_active;
    return dense + ex * c->n_experts * (1.0 - miss) + (double)dsv4_decode_state_bytes(m, ctx) * lanes;
}
