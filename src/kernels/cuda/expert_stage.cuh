/* kernels/cuda — staging a step's routed experts that sit in pinned host memory into device
 * memory before the expert kernels read them (expert_stage.cu). C++ only. */
#ifndef DSV4_CUDA_EXPERT_STAGE_CUH
#define DSV4_CUDA_EXPERT_STAGE_CUH

#include "kernels/cuda/forms.cuh"

namespace dsv4cu {

/* A layer's three expert tables (w1, w2, w3: E entries each, device memory) and, for each, a
 * device array of E flags (1: that expert's matrix is in pinned host memory), or NULL when
 * none of that matrix's experts is. Passed to kernels by value. */
struct ex_tables {
    const wdev *t[3];
    const int *host[3];
};
/* Bytes of one expert's matrix m as stored (data, scales: uniform over the experts); off is set
 * by stage_experts (the matrix's place in a staging slot). */
struct ex_sizes {
    size_t data[3], scale[3], off[3];
};

/* Queues, on the op stream, the copy of each routed expert in host memory whose first tile is
 * one of the first few (tiles, ntiles: the grouping's, NT tiles at most) into a staging slot,
 * and a copy of the tables pointing there; out[m] is the table the expert kernels read (t.t[m]
 * itself when nothing is in host memory or no staging memory could be had). False when a launch
 * failed (recorded in the op's error). */
bool stage_experts(const ex_tables &t, const ex_sizes &z, int E, const int *tiles, const int *ntiles, int NT,
                   const wdev *out[3]);

} // namespace dsv4cu

#endif
