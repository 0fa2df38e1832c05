/* kernels/backend — the op table the model's forward is written against. The CPU backend
 * (kernels/cpu) is the reference; a GPU backend supplies the same ops over device buffers.
 *
 * Every op computes each output row the same way whatever else is in the batch and however
 * many threads run (threads split rows, never one row's sum): chunked prefill, batched lanes
 * and drafted decode then give bit-identical rows. Shapes are row-major; T = rows. */
#ifndef DSV4_BACKEND_H
#define DSV4_BACKEND_H

#include <stdint.h>
#include "io/weight.h"
#include "kernels/place.h"

/* What one sequence keeps for one layer (model/seq.c owns the buffers; backend memory): kv
 * [kv_cap, d] window rows and c, z [c_cap, cw] compressor inputs, rings by position mod cap;
 * ent [ent_cap, d] compressed entries and ikey [ent_cap, ci] indexer keys, by entry index; ic,
 * iz [c_cap, 2 ci] the indexer compressor's inputs. Absent parts are NULL. With production
 * caches (kernels/kv_format.h) the window rows, entries and keys are packed rows instead: pkv
 * [kv_cap] WINDOW rows of d, pent [ent_cap] MAIN rows of d, pikey [ent_cap] INDEX rows of ci
 * (kv, ent and ikey are then NULL). ent_cap: the entry rows allocated (the owner grows them;
 * the ops read within dsv4_attn_args.vis_cap). */
typedef struct dsv4_lbufs {
    float *kv, *c, *z, *ent, *ic, *iz, *ikey;
    uint8_t *pkv, *pent, *pikey;
    int64_t ent_cap;
} dsv4_lbufs;

/* Largest compression ratio a compressor pools over (V4-Flash HCA: 128). */
#define DSV4_MAX_RATIO 1024

/* A compressor's pooling parameters: entry w pools tokens [w m, (w+1) m) (with overlap also
 * window w-1's first half: rows of width (1 + overlap) dim). ape [m, (1 + overlap) dim] or NULL;
 * norm [dim]. */
typedef struct dsv4_pool { int ratio, dim, overlap; const float *ape, *norm; } dsv4_pool;

/* The rows of one forward step, in backend memory except R and S. Rows of a sequence are
 * consecutive and in position order. */
typedef struct dsv4_rows {
    int R, S;                /* rows, sequences */
    const int64_t *pos;      /* [R] absolute position of each row */
    const int32_t *seq;      /* [R] sequence of each row, 0..S-1 */
    const int64_t *start;    /* [S] position of each sequence's first row in this step */
    const int32_t *first;    /* [S] its row index */
} dsv4_rows;

/* The stateful part of one V4 attention layer over a step (spec §5), for every row r of
 * sequence s at position p (start = the sequence's first position in the step):
 *  1. each compressed entry w that the step completes ((w+1) m - 1 in the step) is pooled
 *     from the compressor inputs of its tokens (a token before start from the rings, else from
 *     the step's rows cc, zz), RMS-normed and roped at position w m into ent[w] (and, CSA,
 *     the indexer's from ic, iz into ikey[w]);
 *  2. CSA: the indexer keeps the topk entries w < (p+1)/m of highest score
 *     sum_h (wt[r,h] iw_scale) relu(qi[r,h] . ikey[w]) / sqrt(ci), ties to the lower w, in
 *     ascending order; HCA keeps every entry w < (p+1)/m;
 *  3. o[r] = attend(q[r]) over the kept entries then the window rows p-W+1..p (a position
 *     before start from the kv ring, else the step's kv row), with the sink;
 *  4. the rings take the step's rows (the last cap of each sequence).
 * Every row reads only what it must see, so the rows may run in any order and a row's result
 * does not depend on the step it is in. */
typedef struct dsv4_attn_args {
    dsv4_rows rows;
    const dsv4_lbufs *st;    /* [S] this layer's buffers of each sequence (backend memory) */
    int kv_cap, c_cap;       /* ring rows */
    int64_t vis_cap;         /* bound on (p+1)/m over the rows (entry capacity) */
    int H, d, rd, window;    /* heads of width d, rope dims, window W */
    float scale, eps;        /* attention 1/sqrt(d), norm eps */
    const float *sink;       /* [H] */
    const float *inv_freq;   /* [rd/2]: the compressed entries' rope */
    int ratio, csa;          /* 0: sliding only */
    dsv4_pool comp, icomp;
    int nI, ci, topk;        /* indexer heads, width, entries kept */
    float iw_scale;          /* the indexer head weights' factor */
    const float *q;          /* [R, H d] */
    const float *kv;         /* [R, d] */
    const float *cc, *zz;    /* [R, (1 + csa) d] */
    const float *ic, *iz;    /* [R, 2 ci] */
    const float *qi, *wt;    /* [R, nI ci], [R, nI] */
    float *o;                /* [R, H d] */
    float *work;             /* work_n >= DSV4_ATTN_WORK floats of backend scratch (attn_work's) */
    size_t work_n;
    /* Production caches: the step's window rows, each emitted entry and key are stored packed
     * and every read (this step's rows too) sees the stored value, so a row's result still does
     * not depend on the step it is in. */
    int kv_prod;
} dsv4_attn_args;
#define DSV4_ATTN_WORK(R, vis_cap, topk) ((size_t)(R) * ((size_t)(vis_cap) + (size_t)(topk) + 1))

/* The stateful part of one V4.1 attention layer over a step (CSA2, spec §5-§7), for every row
 * r of sequence s at position p, with compression ratio m (0: sliding only), rows in position
 * order:
 *  1. the window ring takes kv[r] at p mod kv_cap; a KV source (own_ent) with m > 1 also puts
 *     cc[r], zz[r] into its rings at p mod c_cap;
 *  2. a KV source whose group w = p / m completes at p ((p+1) mod m = 0) emits entry w into
 *     st[s].ent: m > 1: pooled from its rings (dsv4_pool over cc, zz) and RMS-normed with
 *     comp.norm; m = 1: cc[r] as it is. With own_ikey it first derives the index key from
 *     that unrotated entry, ikey[w] = rmsnorm(iwk . entry, ik_norm) roped at w m; the entry is
 *     then roped at w m (inv_freq). REF (ref): bf16 rounding after each of these steps, the
 *     iwk product's input through e4m3 blocks of 32 when iwk is FP8/FP4, and the stored key
 *     and entry through their fp4 round trips; with kv_prod the packed rows instead;
 *  3. an index source scores the entries w < (p+1)/m against ist[s]'s keys (the layer owning
 *     them, spec: index-key ownership), score = sum_h wt[r,h] relu(qi[r,h] . ikey[w]) (wt
 *     already carries every factor; REF: bf16 per term). A candidate source keeps in cand[r]
 *     the best cand_k blocks of cand_bs entries by their best score (the block of the newest
 *     entry always, blocks of no finite score never), ncand[r] of them; a candidate filter
 *     sets the scores outside cand[r] (as an earlier layer left it) to -inf. The topk best
 *     remaining go to sel[r] in ascending order, nsel[r] of them; ties to the lower index;
 *  4. o[r] = attend(q[r]) over est[s]'s entries sel[r][0..nsel[r]) (a layer that is no index
 *     source reads the selection an earlier layer of the step left) then the window rows
 *     p-W+1..p from the ring, with the sink. REF: the scores, the softmax and the weighted sum
 *     in double, o[r] rounded to float once, as the reference's attention (float64, one
 *     rounding): an fp32 sum may leave o on the other side of a bf16 rounding, and REF's later
 *     roundings and index selections turn one such flip into a different trajectory.
 * A row reads only entries and keys complete at its position, written by this step or before,
 * so its result does not depend on the step it is in. st, est and ist may be the same arrays
 * (a layer that owns its entries and keys); sel, nsel, cand, ncand are the step's slots shared
 * across layers, [R, topk], [R], [R, cand_k], [R]. Every buffer is in the backend's memory (the
 * constant arrays sink, inv_freq, comp's, ik_norm may be arrays the backend holds, as for attn_step). */
typedef struct dsv4_attn41_args {
    dsv4_rows rows;
    const dsv4_lbufs *st;    /* [S] this layer's buffers: window ring, and when own_ent its rings, entries, keys */
    const dsv4_lbufs *est;   /* [S] the KV source layer's: the entries attended */
    const dsv4_lbufs *ist;   /* [S] the index keys' owner: the keys scored (index sources) */
    int kv_cap, c_cap;       /* ring rows */
    int64_t vis_cap;         /* bound on (p+1)/m over the rows */
    int H, d, rd, window;    /* heads of width d, rope dims, window W */
    float scale, eps;        /* attention 1/sqrt(d), norm eps */
    const float *sink;       /* [H] */
    const float *inv_freq;   /* [rd/2]: the compressed entries' and keys' rope */
    int ratio;
    int own_ent, own_ikey, index_source, cand_source, cand_filter;
    dsv4_pool comp;          /* the KV source's pooling (ratio, dim = d, norm) */
    const dsv4_weight *iwk;  /* [ci, d] index key projection (own_ikey) */
    const float *ik_norm;    /* [ci] */
    int nI, ci, topk;        /* index heads, width, entries kept */
    int cand_bs, cand_k;     /* candidate block size, blocks kept */
    int ref, kv_prod;        /* REF numerics; production caches */
    const float *q;          /* [R, H d] */
    const float *kv;         /* [R, d] */
    const float *cc, *zz;    /* [R, d] (own_ent; zz only for m > 1) */
    const float *qi, *wt;    /* [R, nI ci], [R, nI] (index sources) */
    int64_t *sel, *cand;     /* [R, topk], [R, cand_k] */
    int *nsel, *ncand;       /* [R] */
    float *o;                /* [R, H d] */
    float *work;             /* attn41_work's floats of scratch (NULL there: DSV4_ATTN41_WORK) */
} dsv4_attn41_args;
/* Production index keys are unpacked this many at a time. */
#define DSV4_ATTN41_TILE 1024
#define DSV4_ATTN41_WORK(vis_cap, topk, window, H, d, ci)                                                   \
    ((2 + 2 * (size_t)(H)) * ((size_t)(window) + ((topk) > 0 ? (size_t)(topk) : 1) + 1) +                 \
     2 * (size_t)(H) * (size_t)(d) + 8 * ((size_t)(vis_cap) + 1) +                                         \
     ((size_t)(window) + ((topk) > 0 ? (size_t)(topk) : 1) + 2) * (size_t)(d) +                           \
     (DSV4_ATTN41_TILE + 1) * ((ci) > 0 ? (size_t)(ci) : 1) + ((size_t)(vis_cap) + 4) / 4 + 1)

/* Routed experts of a MoE layer. For row r and its k-th expert e = eid[r, k] with weight
 * w = wts[r, k]: h = swiglu(W1[e] x_r, W3[e] x_r, limit) (times w when pre_weight), and
 * y_r = sum over k in order of (pre_weight ? 1 : w) * W2[e] h. Each product is computed as
 * linear computes that row. ref (REF numerics): inputs of FP8/FP4 products go through e4m3
 * blocks of dsv4_act_block of their weight (as linear_q takes them), products and h are
 * rounded to bf16. */
typedef struct dsv4_experts_args {
    const dsv4_weight *w1, *w2, *w3;   /* [E] each: [I, D], [D, I], [I, D] */
    int E, K, R, D, I;
    const int32_t *eid;      /* [R, K] */
    const float *wts;        /* [R, K] */
    const float *x;          /* [R, D] */
    float limit;
    int pre_weight, ref;
    float *y;                /* [R, D] */
    float *work;             /* DSV4_EXPERTS_WORK(R, K, D, I, E) floats of backend scratch */
} dsv4_experts_args;
#define DSV4_EXPERTS_WORK(R, K, D, I, E) \
    ((size_t)(R) * (K) * (2 * (size_t)(I) + (size_t)(D) + 4) + 2 * (size_t)(E) + 64)

/* REF's activation block of an FP8/FP4 product: the input is quantized to e4m3 per this many
 * consecutive channels, as the release reference's act_quant does: an FP8 weight's column
 * block (32 on V4.1, 128 on V4-Flash), and 32 for FP4 (its scale block). */
static inline int dsv4_act_block(const dsv4_weight *w) { return w->form == DSV4_WF_FP8 && w->bk > 0 ? w->bk : 32; }

/* The codes of the roundtrip op. */
enum { DSV4_RT_FP8 = 0,      /* e4m3, ue8m0 scale per block */
       DSV4_RT_FP4 = 1,      /* e2m1, ue8m0 scale per block */
       DSV4_RT_FP4_E4M3 = 2  /* e2m1, e4m3 scale per block */ };

typedef struct dsv4_backend {
    const char *name;
    /* The memory activations and sequence state live in (host memory on the CPU, device
     * memory on a GPU). Every buffer an op reads or writes is in it (a host buffer handed to a
     * GPU backend's op is a caller's bug, not a slower path); the constant arrays an op reads
     * (weights, norm weights, hc params, sinks, rope tables, router bias, tid2eid) are the
     * model's, which a device backend reads where place() put them. alloc: zeroed, NULL when
     * out of memory; download waits for the queued ops. */
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
    void (*upload)(void *dst, const void *host, size_t bytes);
    void (*download)(void *host, const void *src, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes);
    /* rows copies of `width` bytes from src (row pitch spitch bytes) to dst (pitch dpitch), both
     * in the backend's memory (a strided gather or scatter of rows in one call). */
    void (*copy2d)(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows);
    /* y[t, i] = sum_k W[r0 + i, k] * x[t, k] for i < r1 - r0: rows [r0, r1) of W.
     * x: [T, W.k] with row stride ldx; y: [T, r1 - r0] with row stride ldy. */
    void (*linear)(const dsv4_weight *w, int64_t r0, int64_t r1, const float *x, int T, int64_t ldx, float *y, int64_t ldy);
    /* REF's FP8/FP4 product (V4.1 spec §3): linear of x' where each row of x' is the row of x
     * with every block of dsv4_act_block(w) values through e4m3 (dsv4_fp8_roundtrip); x is not
     * changed. Each row is what linear gives for that x' row. */
    void (*linear_q)(const dsv4_weight *w, int64_t r0, int64_t r1, const float *x, int T, int64_t ldx, float *y,
                     int64_t ldy);
    /* REF's product and its output rounding in one op: linear (quant 0) or linear_q (quant 1),
     * then every written y value through bf16 as round_bf16 does; bit for bit those ops in
     * turn (a device writes each value rounded, saving a launch a product). Optional: without it
     * the model calls the two ops. */
    void (*linear_rb)(const dsv4_weight *w, int64_t r0, int64_t r1, const float *x, int T, int64_t ldx, float *y,
                      int64_t ldy, int quant);
    /* V4's grouped output projection: G row blocks of W [n, k], block g times its own slice of
     * x: y[t, g n/G + i] = sum_j W[g n/G + i, j] x[t, g k + j]; x [T, G k], y [T, n]. Each
     * block's rows as linear computes them. */
    void (*linear_blocks)(const dsv4_weight *w, int G, const float *x, int T, float *y);
    /* Several projections of one input: y[j][t, i] = sum_k W_j[i, k] x[t, k] for every row i
     * of W_j, j < nw; every W_j has k = W_0.k. x: [T, k] with row stride ldx; y[j]: [T, W_j.n]
     * dense, overlapping neither x nor another y. Each y[j] is bit for bit what
     * linear(w[j], 0, W_j.n, x, T, ldx, y[j], W_j.n) gives; a backend may run them in fewer
     * launches. */
    void (*linear_multi)(int nw, const dsv4_weight *const *w, const float *x, int T, int64_t ldx, float *const *y);
    /* The embedding lookup: every one of the n streams of row t is row ids[t] of W, decoded
     * exactly (X[t, i, :] = W[ids[t], :]). ids [T] (0 <= id < W.n), X [T, n, W.k]. */
    void (*embed)(const dsv4_weight *w, const int32_t *ids, int T, int n, float *X);
    /* y = x / sqrt(mean(x^2) + eps) * (w ? w : 1), per row of `dim`; x and y may alias. */
    void (*rmsnorm)(const float *x, int64_t rows, int dim, const float *w, float eps, float *y);
    /* Interleaved rope on the last rd channels of each of `heads` heads of width d in each
     * row (row stride `stride`), at pos[t]; inverse rotates by -angle. inv_freq: [rd/2]. Pair
     * i's angle is the fp32 product (float)pos[t] * inv_freq[i]: at large positions its
     * rounding shows in the result, so every backend computes it so. */
    void (*rope)(float *x, int T, int64_t stride, int heads, int d, int rd, const float *inv_freq, const int64_t *pos,
                 int inverse);
    /* REF's forms of rmsnorm and rope, each the op and then round_bf16 over a range, bit for bit
     * those ops in turn (a device writes each value rounded, saving the rounding's launch):
     * rmsnorm_rb rounds the rows * dim values of y; rope_rb rounds all heads * d values of each
     * of the T rows (the unrotated first d - rd channels of each head too, and with rd = 0 only
     * those), never the row padding past heads * d. */
    void (*rmsnorm_rb)(const float *x, int64_t rows, int dim, const float *w, float eps, float *y);
    void (*rope_rb)(float *x, int T, int64_t stride, int heads, int d, int rd, const float *inv_freq, const int64_t *pos,
                    int inverse);
    /* Hyper-connection site: from the n streams X [T, n, D], the mixes pre [T, n], post [T, n],
     * comb [T, n, n] (Sinkhorn-normalised) and the collapse h [T, D] = sum_i pre_i X_i.
     * fn [(2+n)n, nD], base [(2+n)n], scale [3]. post/comb may be NULL (head collapse, where
     * fn is [n, nD] and scale [1]). h may be NULL (mixes only). hw [D]: when given, h is the
     * collapse RMS-normed (norm_eps) times hw, exactly as rmsnorm(h, hw) would make it (the
     * forward's next step, done where h already is). */
    void (*hc_pre)(const float *X, int T, int n, int D, const float *fn, const float *base, const float *scale, int iters,
                   float hc_eps, float norm_eps, float *pre, float *post, float *comb, float *h, const float *hw);
    /* h [T, D] = sum_i pre_i X_i with given pre [T, n] (V4.1 collapses with the previous site's pre). */
    void (*hc_collapse)(const float *X, int T, int n, int D, const float *pre, float *h);
    /* Engram's gate (V4.1 spec §9.4) over T rows of n streams of width D, in place. kv [T,
     * (n + 1) D] holds each row's n keys, then its value; w [n, D] the streams' query weights.
     * For row t and stream k, with x = X[t, k], key = kv[t, k], val = kv[t, n]:
     *   s = (sum_j x_j w_kj key_j) rx rk / sqrt(D), rx = 1 / sqrt(x.x / D + eps), rk the same of key;
     *   gate = sigmoid(sign(s) sqrt(max(|s|, 1e-6))); x_j += gate val_j; then, when round_bf16,
     *   x through bf16 (nearest even).
     * A (row, stream) reads only its own x, key, val and w_k: batch invariant. */
    void (*engram_gate)(float *X, const float *kv, const float *w, int T, int n, int D, float eps, int round_bf16);
    /* X[k] = post[k] * y + sum_j comb[j][k] * X[j], per row. */
    void (*hc_post)(float *X, const float *y, int T, int n, int D, const float *post, const float *comb);
    /* hc_post and then round_bf16 over all T n D values of X, bit for bit (REF's streams). */
    void (*hc_post_rb)(float *X, const float *y, int T, int n, int D, const float *post, const float *comb);
    /* Attention of one query row over nk keys (K = V, rows of width d at keys[i]; the table
     * keys [nk] and the rows it points at are in the backend's memory):
     * for each of H heads: softmax over (q_h . k_i * scale, sink[h]) and out_h = sum p_i k_i. */
    void (*attend)(const float *q, int H, int d, const float *const *keys, int nk, float scale, const float *sink, float *out);
    /* The V4 attention layer's stateful part, above. */
    void (*attn_step)(const dsv4_attn_args *a);
    /* The V4.1 attention layer's stateful part, above (NULL: the backend has none). */
    void (*attn_step41)(const dsv4_attn41_args *a);
    /* Routing of R rows over E experts: s = sqrt(softplus(lg[r])); the K experts are
     * tid2eid[ids[r]] when tid2eid is given (hash layers), else the K best of s + bias (bias
     * may be NULL), ties to the lower expert, best first; wts[r, k] = s_e (over the K's sum +
     * 1e-20 when norm) * route_scale. lg [R, E], ids [R], eid and wts [R, K]. */
    void (*route)(const float *lg, int R, int E, int K, const float *bias, const int32_t *tid2eid, const int32_t *ids,
                  int norm, float route_scale, int32_t *eid, float *wts);
    void (*experts)(const dsv4_experts_args *a);
    /* REF's roundings, in place over [n] values: round_bf16 takes each value through bf16
     * (nearest even, dsv4_round_bf16); roundtrip takes each block of `block` consecutive values
     * through its code (DSV4_RT_*: dsv4_fp8_roundtrip, dsv4_fp4_roundtrip), bit for bit the
     * CPU's formulas. */
    void (*round_bf16)(float *x, int64_t n);
    void (*roundtrip)(float *x, int64_t n, int block, int code);
    /* y = a + b, [n] values (y may alias either). */
    void (*add)(const float *a, const float *b, int64_t n, float *y);
    /* y = x * s, [n] values, each one rounded product (y may alias x). */
    void (*scale)(const float *x, int64_t n, float s, float *y);
    /* h = silu(min(g, limit)) * clamp(u, -limit, limit) (limit <= 0: no clamp); [n] values. */
    void (*swiglu)(const float *g, const float *u, int64_t n, float limit, float *h);
    /* Recording a step to replay it (NULL where the backend has none, as on the CPU):
     * graph_begin() makes the ops called until graph_end() be recorded instead of run (they
     * must take backend buffers only; 0 when recording started); graph_end() returns the recording, NULL when it failed
     * (then nothing ran: run the ops again); graph_run(g) queues it; graph_free(g). A recording
     * keeps the buffers and values it was given: replays see new contents of the same buffers. */
    int (*graph_begin)(void);
    void *(*graph_end)(void);
    void (*graph_run)(void *g);
    void (*graph_free)(void *g);
    /* The ops return nothing; a backend whose ops can fail (device errors) keeps the first
     * failure, and check() reports it into err and clears it (returns its code, 0 if none).
     * NULL where the ops cannot fail. */
    int (*check)(dsv4_err *err);
    /* Floats of scratch attn_step would take in `work` for these arguments (NULL:
     * DSV4_ATTN_WORK(R, vis_cap, topk)); given less (at least DSV4_ATTN_WORK), it computes the
     * same bits another way. */
    size_t (*attn_work)(const dsv4_attn_args *a);
    /* Floats of scratch attn_step41 takes in `work` for these arguments (NULL:
     * DSV4_ATTN41_WORK, a bound that does not grow with the rows). */
    size_t (*attn41_work)(const dsv4_attn41_args *a);
    /* 1 when attn_step reads and writes production caches (kv_prod); a model with production
     * caches refuses a backend without them. */
    int kv_production;
    /* Device backends (NULL on the CPU, whose state is host memory): the bytes of its memory
     * free now for sequence state, less what it keeps for its ops' scratch. */
    size_t (*state_room)(void);
    /* Device backends only (NULL on the CPU, which reads the weights where they are mapped):
     * place() makes the backend hold the listed arrays (every one its ops read) as
     * kernels/place.h plans them against the device memory free now, writes that plan in words
     * into report [report_n] and sets *experts_host when routed experts stay in pinned host
     * memory; it fails when the hot path does not fit. unplace() drops whatever place() took
     * from the same list, after a failed place() too. */
    int (*place)(const dsv4_place_item *items, int64_t n, char *report, size_t report_n, int *experts_host,
                 dsv4_err *err);
    void (*unplace)(const dsv4_place_item *items, int64_t n);
    /* The device in words ("cpu: 16 threads"), for `dsv4 devices`. */
    void (*describe)(char *buf, size_t n);
    /* The device's copy rate in GB/s (bytes read + written), a benchmark's memory ceiling; NULL
     * where not measurable (the CPU: benchmarks measure their own read rate). */
    double (*copy_bandwidth)(void);
    /* Device backends only (NULL on the CPU): the bytes of weight w (data and scales) that its
     * kernels read from pinned host memory, where place() left them (0 when on the device or
     * not placed); and the rate in GB/s at which a kernel reads pinned host memory over the
     * bus, the ceiling for those bytes. */
    size_t (*host_bytes)(const dsv4_weight *w);
    double (*host_read_bandwidth)(void);
    /* Opens (on) or closes the range a device profiler records; NULL where there is none. */
    void (*capture)(int on);
} dsv4_backend;

const dsv4_backend *dsv4_backend_cpu(void);
/* The backend a device name selects ("cpu" or NULL, "cuda"), ready to run; NULL after err
 * (DSV4_E_DEVICE) when the name is unknown, this build lacks it or no usable device is there
 * (kernels/device.c: the one place that knows which backends a build has). */
const dsv4_backend *dsv4_backend_named(const char *device, dsv4_err *err);

#endif
