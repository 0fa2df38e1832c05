/* kernels/cuda — what attn_step's kernels share: the rows of a step as the kernels read them
 * from device memory, and a row's attention geometry (which keys it attends, in what order).
 * C++ only; included by the files of attn_step's kernels. */
#ifndef DSV4_CUDA_STEP_CUH
#define DSV4_CUDA_STEP_CUH

#include "kernels/cuda/internal.h"

namespace dsv4cu {

/* The step's rows (device pointers; dsv4_rows of backend.h) and each sequence's buffers. */
struct rows_dev {
    const int64_t *pos;
    const int32_t *seq;
    const int64_t *start;
    const int32_t *first;
    const dsv4_lbufs *st;
    int R, S;
};

/* Row r's keys: the kept entries (sel[r] when the indexer chose, else entries 0..ns-1), then
 * the window positions j0..p (the step's kv row when the step holds it, else the kv ring).
 * ok is false when the row cannot be attended within the caller's bounds (its position beyond
 * vis_cap, more than nkmax keys, or no position): its output is NaN. */
struct attn_row {
    dsv4_lbufs b;
    int64_t p, start, first, j0;
    int nk, ns;
    bool use_sel, ok;
    const int *rs;

    __device__ __forceinline__ attn_row(const rows_dev &rd, int r, int ratio, int csa, int topk, int64_t vis_cap,
                                        int window, int nkmax, const int *sel)
    {
        p = rd.pos[r];
        int s = rd.seq[r];
        b = rd.st[s];
        start = rd.start[s];
        first = rd.first[s];
        int64_t nvis = ratio ? (p + 1) / ratio : 0;
        use_sel = csa && nvis > topk;
        int64_t nsel = use_sel ? topk : nvis;
        j0 = p - window + 1 < 0 ? 0 : p - window + 1;
        int64_t nk64 = nsel + (p - j0 + 1);
        ok = !(nvis > vis_cap || nk64 > nkmax || p < 0);
        nk = ok ? (int)nk64 : 0;
        ns = ok ? (int)nsel : 0;
        rs = sel ? sel + (int64_t)r * topk : NULL;
    }
    /* Key i's row of d floats (i < nk). */
    __device__ __forceinline__ const float *key(int i, int d, int kv_cap, const float *kv) const
    {
        if (i < ns)
            return b.ent + (use_sel ? (int64_t)rs[i] : (int64_t)i) * d;
        int64_t tok = j0 + (i - ns);
        return tok >= start ? kv + (first + (tok - start)) * d : b.kv + (tok % kv_cap) * d;
    }
};

/* attn_step's attention on tensor cores (attn_tc.cu): whether a head width suits it; the floats
 * of partials the per-chunk form wants for R rows (0: that form is not used); the launch, per
 * chunk when part holds part_n >= attn_tc_part floats, else a block a row and head group.
 * False when a launch failed (the failure is recorded). */
bool attn_tc_fits(int H, int d);
size_t attn_tc_part(int R, int H, int d, int64_t nkmax);
bool attn_tc_launch(const rows_dev &rd, int ratio, int csa, int topk, int64_t vis_cap, int kv_cap, int H, int d,
                    int window, int64_t nkmax, float scale, const float *sink, const float *q, const float *kv,
                    const int *sel, float *o, float *part, size_t part_n);

/* The indexer's scores on the tensor cores (index_tc.cu): whether k_iscore_tc takes a step of
 * these shapes (the tensor-core switch on, ci % 16 == 0, its shared memory within the device's
 * limit: shapes and the device alone, so every step of a process scores one way), and its
 * launch on the op stream: scores[r * vis_cap + w] for the rows and entries k_iscore writes.
 * false: the launch failed (recorded). */
bool iscore_tc_fits(int nI, int ci, int64_t vis_cap);
bool iscore_tc(const rows_dev &rd, int ratio, int topk, int64_t vis_cap, int nI, int ci, float iw_scale, const float *qi,
               const float *wt, float *scores);

} // namespace dsv4cu

#endif
