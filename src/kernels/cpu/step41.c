/* CPU backend, V4.1's stateful attention (attn_step41, kernels/backend.h): CSA2's entry
 * emission, the two-level index selection and the attention, row by row in position order.
 * The per-row ops (linear, rmsnorm, rope, attend) are the CPU table's. */
#include <math.h>
#include <string.h>
#include "core/core.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu.h"
#include "kernels/kv_format.h"

_Static_assert(sizeof(dsv4_scored) <= 4 * sizeof(float), "a scored entry fits DSV4_ATTN41_WORK's 4 floats");
_Static_assert(sizeof(void *) <= 2 * sizeof(float), "a key pointer fits DSV4_ATTN41_WORK's 2 floats");

static void rnd(int ref, float *x, int64_t n)
{
    if (ref)
        dsv4_round_bf16(x, n);
}

/* Index scores of one query over the nvis visible keys: sum_h w_h relu(q_h . k) (REF: bf16
 * per-head products, weighted terms and sum, as the reference's bf16 einsum). Production keys
 * are unpacked a tile at a time into kt [DSV4_ATTN41_TILE, ci]. */
static void index_scores(const dsv4_attn41_args *a, const float *qi, const float *wt, const dsv4_lbufs *src, int64_t nvis,
                         float *kt, dsv4_scored *out)
{
    int nI = a->nI, ci = a->ci, ref = a->ref;
    int rb = dsv4_kv_row_bytes(DSV4_KV_INDEX, ci);
    for (int64_t w0 = 0; w0 < nvis; w0 += DSV4_ATTN41_TILE) {
        int64_t nt = nvis - w0 < DSV4_ATTN41_TILE ? nvis - w0 : DSV4_ATTN41_TILE;
        const float *keys = a->kv_prod ? kt : src->ikey + w0 * ci;
        if (a->kv_prod)
            for (int64_t i = 0; i < nt; i++)
                dsv4_kv_unpack(DSV4_KV_INDEX, src->pikey + (w0 + i) * rb, ci, kt + i * ci);
        /* entries are independent: threads split them, each score summed in one order */
#pragma omp parallel for schedule(static) if (nt * nI * ci > 1 << 20)
        for (int64_t i = 0; i < nt; i++) {
            float s = 0;
            for (int h = 0; h < nI; h++) {
                float dp = dsv4_dot(qi + (int64_t)h * ci, keys + i * ci, ci);
                if (ref)
                    dp = dsv4_bf16_to_f32(dsv4_f32_to_bf16(dp));
                float t = wt[h] * (dp > 0 ? dp : 0);
                s += ref ? dsv4_bf16_to_f32(dsv4_f32_to_bf16(t)) : t;
            }
            out[w0 + i].s = ref ? dsv4_bf16_to_f32(dsv4_f32_to_bf16(s)) : s;
            out[w0 + i].w = w0 + i;
        }
    }
}

/* The candidate source's block filter for one query: block score = max over its entries,
 * the block of the newest visible entry forced in, the best cand_k kept. */
static int candidate_blocks(const dsv4_attn41_args *a, const dsv4_scored *sc, int64_t nvis, int64_t *blocks,
                            dsv4_scored *tmp)
{
    int bs = a->cand_bs;
    int64_t nb = (nvis + bs - 1) / bs;
    for (int64_t b = 0; b < nb; b++) {
        float mx = -INFINITY;
        for (int64_t w = b * bs; w < nvis && w < (b + 1) * bs; w++)
            mx = fmaxf(mx, sc[w].s);
        tmp[b].s = b == (nvis - 1) / bs ? INFINITY : mx;
        tmp[b].w = b;
    }
    int64_t n = dsv4_best_k(tmp, nb, a->cand_k);
    int k = 0;
    for (int64_t i = 0; i < n; i++) /* blocks with no finite score are not kept */
        if (tmp[i].s != -INFINITY)
            blocks[k++] = tmp[i].w;
    return k;
}

/* REF's attention of one row (backend.h, attn_step41 step 4): for each head h, scores
 * s_i = scale q_h . k_i, m = max(sink_h, s), o_h = sum_i e^(s_i - m) k_i / (sum_i e^(s_i - m)
 * + e^(sink_h - m)), all in double, o rounded to float once. q [H, d], keys nk rows of d;
 * p [H, nk] and acc [H, d] scratch. Heads are independent, so threads split them. The dot
 * keeps 8 independent running sums (column j to sum j % 8, then added in order), which the
 * compiler may run in vector lanes; in double the order moves the float result only in the
 * rarest ties. */
static void attend_f64(const float *q, int H, int d, const float *const *keys, int nk, float scale, const float *sink,
                       double *p_all, double *acc_all, float *out)
{
#pragma omp parallel for schedule(static) if ((int64_t)H * nk * d > 262144)
    for (int h = 0; h < H; h++) {
        const float *qh = q + (int64_t)h * d;
        double *p = p_all + (int64_t)h * nk, *acc = acc_all + (int64_t)h * d, mx = sink[h];
        for (int i = 0; i < nk; i++) {
            double s8[8] = {0};
            int j = 0;
            for (; j + 8 <= d; j += 8)
                for (int u = 0; u < 8; u++)
                    s8[u] += (double)qh[j + u] * keys[i][j + u];
            for (; j < d; j++)
                s8[j % 8] += (double)qh[j] * keys[i][j];
            double s = s8[0];
            for (int u = 1; u < 8; u++)
                s += s8[u];
            p[i] = s * scale;
            mx = p[i] > mx ? p[i] : mx;
        }
        double den = 0;
        for (int i = 0; i < nk; i++)
            den += p[i] = exp(p[i] - mx);
        den += exp(sink[h] - mx);
        for (int j = 0; j < d; j++)
            acc[j] = 0;
        for (int i = 0; i < nk; i++)
            for (int j = 0; j < d; j++)
                acc[j] += p[i] * keys[i][j];
        for (int j = 0; j < d; j++)
            out[(int64_t)h * d + j] = (float)(acc[j] / den);
    }
}

/* A compressed entry's rope at its group's first position, then (REF) its cache round trip. */
static void rope_at(const dsv4_backend *be, const dsv4_attn41_args *a, float *x, int width, int64_t p)
{
    be->rope(x, 1, width, 1, width, a->rd, a->inv_freq, &p, 0);
    rnd(a->ref, x, width);
}

/* Group w of positions [w m, (w + 1) m) is complete: pools the group's projected inputs (m > 1:
 * per channel, softmax over the group's gate scores weighting its kv; m = 1: the row's normed
 * latent as it is), derives the index key from the unrotated latent, then ropes and stores the
 * entry. xq [d]: the REF product's quantized input. */
static void emit_group(const dsv4_backend *be, const dsv4_attn41_args *a, const dsv4_lbufs *ls, int64_t w,
                       const float *lat1, float *lat, float *kk, float *xq)
{
    int d = a->d, m = a->ratio, ci = a->ci, ref = a->ref;
    if (m > 1) {
        dsv4_pool_group(&a->comp, ls->c, ls->z, a->c_cap, w, lat);
        rnd(ref, lat, d);
        be->rmsnorm(lat, 1, d, a->comp.norm, a->eps, lat);
        rnd(ref, lat, d);
    } else
        memcpy(lat, lat1, d * sizeof(float));
    int64_t p = w * m;
    if (a->own_ikey) {
        const dsv4_weight *wk = a->iwk;
        const float *x = lat;
        if (ref && (wk->form == DSV4_WF_FP8 || wk->form == DSV4_WF_FP4)) { /* the REF product's e4m3 input */
            memcpy(xq, lat, d * sizeof(float));
            dsv4_fp8_roundtrip(xq, d, dsv4_act_block(wk));
            x = xq;
        }
        be->linear(wk, 0, ci, x, 1, d, kk, ci);
        rnd(ref, kk, ci);
        be->rmsnorm(kk, 1, ci, a->ik_norm, a->eps, kk);
        rnd(ref, kk, ci);
        rope_at(be, a, kk, ci, p);
        if (a->kv_prod) /* the stored format is the round trip */
            dsv4_kv_pack(DSV4_KV_INDEX, kk, ci, ls->pikey + w * dsv4_kv_row_bytes(DSV4_KV_INDEX, ci));
        else {
            if (ref)
                dsv4_fp4_roundtrip(kk, ci, 32, 0);
            memcpy(ls->ikey + w * ci, kk, ci * sizeof(float));
        }
    }
    rope_at(be, a, lat, d, p);
    if (a->kv_prod)
        dsv4_kv_pack(DSV4_KV_MAIN, lat, d, ls->pent + w * dsv4_kv_row_bytes(DSV4_KV_MAIN, d));
    else {
        if (ref)
            dsv4_fp4_roundtrip(lat, d, 16, 1);
        memcpy(ls->ent + w * d, lat, d * sizeof(float));
    }
}

void dsv4_cpu_attn_step41(const dsv4_attn41_args *a)
{
    const dsv4_backend *be = dsv4_backend_cpu();
    const dsv4_rows *rw = &a->rows;
    int R = rw->R, H = a->H, d = a->d, W = a->window, K = a->topk, nI = a->nI, ci = a->ci;
    int64_t Hd = (int64_t)H * d, vis = a->ratio ? a->vis_cap : 0;
    int K1 = K > 0 ? K : 1, ci1 = ci > 0 ? ci : 1;
    /* the scratch, in DSV4_ATTN41_WORK's order: 8-byte pieces first */
    float *wp = a->work;
    const float **keys = (const float **)(void *)wp;
    wp += 2 * (size_t)(W + K1 + 1);
    double *pf = (double *)(void *)wp, *accf = pf + (size_t)H * (W + K1 + 1); /* REF's attention */
    wp += 2 * (size_t)H * (W + K1 + 1) + 2 * (size_t)H * d;
    dsv4_scored *tmp = (dsv4_scored *)(void *)wp;
    wp += 4 * (size_t)(vis + 1);
    dsv4_scored *btmp = (dsv4_scored *)(void *)wp;
    wp += 4 * (size_t)(vis + 1);
    float *wk = wp, *ek = wk + (size_t)W * d, *kt = ek + (size_t)K1 * d, *lat = kt + (size_t)DSV4_ATTN41_TILE * ci1;
    float *kk = lat + d, *xq = kk + ci1;
    uint8_t *bmask = (uint8_t *)(xq + d);
    size_t wrb = (size_t)dsv4_kv_row_bytes(DSV4_KV_WINDOW, d), erb = (size_t)dsv4_kv_row_bytes(DSV4_KV_MAIN, d);
    for (int r = 0; r < R; r++) {
        int s = rw->seq[r];
        const dsv4_lbufs *ls = &a->st[s];
        int64_t p = rw->pos[r];
        if (a->kv_prod)
            dsv4_kv_pack(DSV4_KV_WINDOW, a->kv + (int64_t)r * d, d, ls->pkv + (p % a->kv_cap) * wrb);
        else
            memcpy(ls->kv + (p % a->kv_cap) * d, a->kv + (int64_t)r * d, d * sizeof(float));
        int nk = 0;
        if (a->ratio) {
            if (a->own_ent) {
                if (a->ratio > 1) {
                    int64_t slot = p % a->c_cap;
                    memcpy(ls->c + slot * d, a->cc + (int64_t)r * d, d * sizeof(float));
                    memcpy(ls->z + slot * d, a->zz + (int64_t)r * d, d * sizeof(float));
                }
                if ((p + 1) % a->ratio == 0)
                    emit_group(be, a, ls, p / a->ratio, a->cc + (int64_t)r * d, lat, kk, xq);
            }
            int64_t nvis = (p + 1) / a->ratio;
            int64_t *sel = a->sel + (int64_t)r * K, *cand = a->cand + (int64_t)r * a->cand_k;
            if (a->index_source) {
                double t0 = dsv4_now();
                index_scores(a, a->qi + (int64_t)r * nI * ci, a->wt + (int64_t)r * nI, &a->ist[s], nvis, kt, tmp);
                if (a->cand_source)
                    a->ncand[r] = candidate_blocks(a, tmp, nvis, cand, btmp);
                if (a->cand_filter) { /* outside the kept blocks: -inf, chosen only to fill the k slots */
                    int bs = a->cand_bs;
                    memset(bmask, 0, (size_t)(nvis + bs - 1) / bs);
                    for (int i = 0; i < a->ncand[r]; i++)
                        if (cand[i] * bs < nvis)
                            bmask[cand[i]] = 1;
                    for (int64_t w = 0; w < nvis; w++)
                        if (!bmask[w / bs])
                            tmp[w].s = -INFINITY;
                }
                a->nsel[r] = dsv4_topk_ascending(tmp, nvis, K, sel);
                dsv4_index_seconds_add(dsv4_now() - t0);
            }
            const dsv4_lbufs *es = &a->est[s];
            for (int i = 0; i < a->nsel[r]; i++) {
                int64_t w = sel[i];
                if (a->kv_prod)
                    dsv4_kv_unpack(DSV4_KV_MAIN, es->pent + w * erb, d, ek + (int64_t)i * d);
                keys[nk++] = a->kv_prod ? ek + (int64_t)i * d : es->ent + w * d;
            }
        }
        int nw = 0;
        for (int64_t j = p - W + 1 < 0 ? 0 : p - W + 1; j <= p; j++, nw++) {
            if (a->kv_prod)
                dsv4_kv_unpack(DSV4_KV_WINDOW, ls->pkv + (j % a->kv_cap) * wrb, d, wk + (int64_t)nw * d);
            keys[nk++] = a->kv_prod ? wk + (int64_t)nw * d : ls->kv + (j % a->kv_cap) * d;
        }
        if (a->ref)
            attend_f64(a->q + (int64_t)r * Hd, H, d, keys, nk, a->scale, a->sink, pf, accf, a->o + (int64_t)r * Hd);
        else
            be->attend(a->q + (int64_t)r * Hd, H, d, keys, nk, a->scale, a->sink, a->o + (int64_t)r * Hd);
    }
}

