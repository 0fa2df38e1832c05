/* CUDA linear ops: linear, linear_blocks and linear_multi over every storage form (EXL3 through
 * exl3.cu), each row summed in an order fixed by the weight's form and shape alone. */
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cuda/internal.h"
#include "kernels/cuda/exl3_cuda.h"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/wgmma.cuh"
#include "kernels/cuda/rounding.cuh"

using namespace dsv4cu;

/* A single linear: the weight's parameters at fixed offsets. */
template <int F, bool VEC, int TT>
__global__ void __launch_bounds__(LIN_WARPS * 32) k_linear(wdev w, int64_t r0, int nr, dense_map m, int T)
{
    PDL_WAIT();
    linear_rows<F, VEC, TT>(w, r0, nr, m, T, blockIdx.x);
}

/* A group: job blockIdx.x / bpj. Kept apart from k_linear because a run-time job index into the
 * parameters costs the single launches registers and time (docs/bench.md, "Linear kernel designs
 * measured"). The T = 1 build is held to 64 registers (4 blocks a multiprocessor). */
template <int F, bool VEC, int TT>
__global__ void __launch_bounds__(LIN_WARPS * 32, VEC && TT == 1 ? 4 : 1) k_linear_group(lin_jobs J, int T)
{
    PDL_WAIT();
    int j = blockIdx.x / J.bpj;
    dense_map m = {J.x[j], J.y[j], J.ldx, J.ldy};
    linear_rows<F, VEC, TT>(J.w[j], J.r0[j], J.nr, m, T, blockIdx.x % J.bpj);
}

/* A multi launch: job j owns blocks b0[j] .. b0[j + 1] - 1 (a scan of at most
 * DSV4_CUDA_GROUP_MAX bounds, uniform in the block). Its own kernel, so the group and single
 * launches keep their parameters and registers. The T = 1 chunk build is held to 64 registers
 * (4 blocks a multiprocessor), what k_linear's FP8 build uses unbounded (the job lookup took it
 * to 74); the others have no minimum (0), as in k_linear. */
template <int F, bool VEC, int TT>
__global__ void __launch_bounds__(LIN_WARPS * 32, VEC && TT == 1 ? 4 : 0) k_linear_multi(lin_jobs J, int T)
{
    PDL_WAIT();
    int j = 0, b = (int)blockIdx.x;
    while (j + 1 < J.n && b >= J.b0[j + 1])
        j++;
    dense_map m = {J.x[j], J.y[j], J.ldx, J.nrj[j]};
    linear_rows<F, VEC, TT>(J.w[j], J.r0[j], J.nrj[j], m, T, b - J.b0[j]);
}

/* The tensor-core builds of the three (mma.cuh): NT n-tiles a pass; blockIdx.y takes tokens
 * y TB .. y TB + TB - 1, blockIdx.z is the slice of a split launch. */
template <int F, int NT, int E>
__global__ void TC_BOUNDS(NT) k_tc_linear(wdev w, int64_t r0, int nr, dense_map m, int T, int TB, float *part)
{
    PDL_WAIT();
    int tb = (int)blockIdx.y * TB;
    /* a split launch's slabs are [T, nr] dense, shifted with the tokens */
    tc_rows<F, NT, dense_map, E>(w, r0, nr, m.at(tb), min(TB, T - tb), blockIdx.x, part ? part + (int64_t)tb * nr : NULL, nr,
                   (int64_t)T * nr, (int)blockIdx.z, (int)gridDim.z);
}

/* The many-token pass on warpgroup MMAs (wgmma.cuh), a single job: x staged by k_wg_stage (a
 * block a tile: blockIdx.y the run, blockIdx.z the token block; its mid/lo flag into xf), then
 * k_wg_linear (blockIdx.y the token block). */
template <int F, int E>
__global__ void __launch_bounds__(wg_stage_threads<F>()) k_wg_stage(dense_map m, int T, int k, int nrun, uint8_t *xb,
                                                                   uint8_t *xf)
{
    PDL_WAIT();
    int tb = (int)blockIdx.z * WG_N;
    bool wide = wg_stage<F, E>(m.at(tb), min(WG_N, T - tb), k, (int)blockIdx.y, (int)threadIdx.x,
                               xb + (int64_t)blockIdx.z * nrun * wg_tile_bytes<F, E>());
    if (E > 1) {
        int any = __syncthreads_or(wide);
        if (threadIdx.x == 0)
            xf[(int64_t)blockIdx.z * nrun + blockIdx.y] = any != 0;
    }
}

template <int F, int E, int DA, int NB>
__global__ void __launch_bounds__(WG_THREADS, 1)
    k_wg_linear(wdev w, int64_t r0, int nr, dense_map m, int T, const uint8_t *xb, const uint8_t *xf, int nrun,
                float *part)
{
    PDL_WAIT();
    const wg_tblocks<NB> L = {m, T, (int)blockIdx.y, (int)gridDim.y, nrun, (int64_t)nrun * wg_tile_bytes<F, E>(), nr,
                              xb, xf, part};
    wg_rows<F, E, wg_tblocks<NB>, DA, NB>(w, r0, nr, L, (int)blockIdx.x, nr, (int64_t)T * nr, (int)blockIdx.z,
                                             (int)gridDim.z);
}

template <int F, int NT>
__global__ void TC_BOUNDS(NT) k_tc_group(lin_jobs J, int T, int TB)
{
    PDL_WAIT();
    int j = blockIdx.x / J.bpj, tb = (int)blockIdx.y * TB;
    dense_map m = {J.x[j], J.y[j], J.ldx, J.ldy};
    float *pt = J.part[j];
    if (!pt && blockIdx.z)
        return;
    tc_rows<F, NT>(J.w[j], J.r0[j], J.nr, m.at(tb), min(TB, T - tb), blockIdx.x % J.bpj, pt ? pt + (int64_t)tb * J.nr : NULL,
                   J.nr, (int64_t)T * J.nr, (int)blockIdx.z, J.zj[j]);
}

template <int F, int NT>
__global__ void TC_BOUNDS(NT) k_tc_multi(lin_jobs J, int T, int TB)
{
    PDL_WAIT();
    int j = 0, b = (int)blockIdx.x, tb = (int)blockIdx.y * TB;
    while (j + 1 < J.n && b >= J.b0[j + 1])
        j++;
    dense_map m = {J.x[j], J.y[j], J.ldx, J.nrj[j]};
    float *pt = J.part[j];
    if (!pt && blockIdx.z)
        return;
    tc_rows<F, NT>(J.w[j], J.r0[j], J.nrj[j], m.at(tb), min(TB, T - tb), b - J.b0[j],
                   pt ? pt + (int64_t)tb * J.nrj[j] : NULL, J.nrj[j], (int64_t)T * J.nrj[j], (int)blockIdx.z, J.zj[j]);
}

/* y = the left-to-right sum of S slabs (mma.cuh, tc_fold). */
__global__ void k_tc_fold(const float *part, int S, int64_t rows, int nr, int64_t pld, int64_t slab, float *y,
                          int64_t ldy, int rb)
{
    PDL_WAIT();
    int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= rows * nr)
        return;
    int64_t r = e / nr, i = e % nr;
    const float *p = part + r * pld + i;
    float v = p[0];
    for (int s = 1; s < S; s++)
        v += p[s * slab];
    y[r * ldy + i] = rb ? rt_bf16(v) : v;
}

void dsv4cu::tc_fold(const float *part, int S, int64_t rows, int nr, int64_t pld, int64_t slab, float *y, int64_t ldy,
                     cudaStream_t st, int rb)
{
    launch_k(k_tc_fold, (unsigned)cdiv(rows * nr, 256), 256, 0, st, part, S, rows, nr, pld, slab, y, ldy, rb);
}

/* The device's multiprocessors (device 0: the backend runs on one). */
static int sm_count(void)
{
    static int n;
    if (!n && cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, ordinal) != cudaSuccess)
        n = 132;
    return n;
}

/* A launch of `blocks` blocks is split into Z slice groups, a power of two up to S, chosen for
 * the fewest waves per group of the device's block slots (two a multiprocessor: TC_BOUNDS):
 * a group's blocks walk S / Z slices each, so the time goes as waves(blocks Z) / Z. Ties and
 * gains under 1/8 keep the smaller Z (fewer slabs to fold). The 64-token pass (nt > 2) splits
 * into single slices below one wave, or not at all (mma.cuh). */
int dsv4cu::tc_groups(int S, int64_t blocks, int nt)
{
    const int64_t slots = 2 * (int64_t)sm_count();
    if (nt > 2)
        return blocks < slots ? S : 1;
    int best = 1;
    double best_t = (double)cdiv(blocks, slots);
    for (int Z = 2; Z <= S; Z *= 2) {
        double t = (double)cdiv(blocks * Z, slots) / Z;
        if (t < best_t * 0.875) {
            best = Z;
            best_t = t;
        }
    }
    return best;
}

/* Slice partials: grows, never freed (a recorded graph may still read an outgrown one). */
static growbuf g_part;

float *dsv4cu::tc_part_buf(size_t n) { return grow_buf(&g_part, n, n, NULL); }

/* x staged for the wgmma pass, two buffers (a launch's and, for the experts, the second
 * product's): they grow, never freed (a recorded graph may still read an outgrown one). */
static growbuf g_wgx[2];

uint8_t *dsv4cu::wg_buf(int which, size_t bytes)
{
    growbuf *b = &g_wgx[which];
    size_t n = bytes / 4 + 1;
    if (n <= b->n)
        return (uint8_t *)b->p;
    float *p = NULL;
    if (cudaMalloc((void **)&p, n * sizeof(float)) != cudaSuccess) {
        cudaGetLastError(); /* no room: the caller takes the mma.sync pass, which needs none */
        return NULL;
    }
    b->p = p;
    b->n = n;
    return (uint8_t *)p;
}

bool dsv4cu::wg_use(int F, int T)
{
    static int mode = -1; /* 0 off, 1 every form past the few-token passes, 2 the default */
    if (mode < 0) {
        const char *e = getenv("DSV4_CUDA_WG");
        mode = e && !strcmp(e, "0") ? 0 : e && !strcmp(e, "1") ? 1 : 2;
    }
    if (mode == 1)
        return true;
    return mode == 2 && F != DSV4_WF_BF16 && T > TC_TN;
}

template <int F, int E, int DA, int NB>
static void launch_wg_rows(lin_jobs &J, int T, int Z, float *part, const dense_map &m, const uint8_t *xb,
                           const uint8_t *xf, int nrun, cudaStream_t st)
{
    const size_t smem = wg_smem<F, E, NB>();
    static bool attr = false;
    if (!attr) {
        cudaFuncSetAttribute(k_wg_linear<F, E, DA, NB>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        attr = true;
    }
    /* groups of NB token blocks a block walks through one ring: one, or DSV4_CUDA_WG_P=n (an
     * experiment) */
    const int rbs = wg_blocks(J.nr), tgs = (int)cdiv(cdiv(T, WG_N), NB);
    static int walk = -1;
    if (walk < 0) {
        const char *e = getenv("DSV4_CUDA_WG_P");
        walk = e ? atoi(e) : 1;
        walk = walk < 1 ? 1 : walk;
    }
    const int Y = (int)cdiv(tgs, walk);
    dim3 grid((unsigned)rbs, (unsigned)Y, (unsigned)Z);
    launch_k(k_wg_linear<F, E, DA, NB>, grid, WG_THREADS, smem, st, J.w[0], J.r0[0], J.nr, m, T, xb,
             xf, nrun, part);
}

int dsv4cu::wg_variant(void)
{
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("DSV4_CUDA_WG_V");
        v = e && e[0] >= '4' && e[0] <= '6' && !e[1] ? e[0] - '0' : 4;
    }
    return v;
}

/* One job's many-token pass on wgmma: x staged, then the rows, split into Z slice groups when
 * part is given (folded by the caller). False, launching nothing, when the staged x has no room. */
template <int F, int E>
static bool launch_wg(lin_jobs &J, int T, int Z, float *part, cudaStream_t st)
{
    enum { G = tcf<F>::G, TB = wg_tile_bytes<F, E>() };
    const int k = (int)J.w[0].k, nrun = (int)cdiv(k, 16 * G), tbs = (int)cdiv(T, WG_N);
    const size_t bytes = (size_t)tbs * nrun * TB;
    uint8_t *xb = wg_buf(0, bytes + (size_t)tbs * nrun);
    if (!xb)
        return false;
    uint8_t *xf = xb + bytes;
    dense_map m = {J.x[0], J.y[0], J.ldx, J.ldy, J.rb};
    launch_k(k_wg_stage<F, E>, dim3(1u, (unsigned)nrun, (unsigned)tbs), wg_stage_threads<F>(), 0, st, m, T, k, nrun, xb, xf);
    wg_shape([&](auto sh) {
        typedef decltype(sh) S;
        launch_wg_rows<F, E, S::DA, S::NB>(J, T, Z, part, m, xb, xf, nrun, st);
    });
    return true;
}

template <int F>
static void tc_run_shape_of(int *G, int *RT)
{
    *G = (int)tcf<F>::G;
    *RT = tc_ks<F, 1>() / *G;
}
/* A tensor-core kind's run (mma.cuh, tcf): k-steps a run (G), and runs a few-token k-tile (RT). */
static void tc_run_shape(int kind, int *G, int *RT)
{
    switch (kind) {
    case DSV4_WF_FP8: tc_run_shape_of<DSV4_WF_FP8>(G, RT); break;
    case TC_FP8_32: tc_run_shape_of<TC_FP8_32>(G, RT); break;
    case DSV4_WF_FP4: tc_run_shape_of<DSV4_WF_FP4>(G, RT); break;
    default: tc_run_shape_of<DSV4_WF_BF16>(G, RT); break;
    }
}

/* FP8 takes 64-element runs where its scale blocks hold whole ones, else 32-element runs. */
int dsv4cu::tc_kind(const dsv4_weight *w)
{
    if (w->form == DSV4_WF_FP8 && w->bk > 0 && w->bk % (16 * (int)tcf<DSV4_WF_FP8>::G) != 0)
        return TC_FP8_32;
    return w->form;
}

/* The tensor-core switch (cuda.h): -1 until read from DSV4_CUDA_TC or set. */
static int g_tc = -1;

extern "C" void dsv4_cuda_set_tensor_cores(int mode)
{
    g_tc = mode == DSV4_CUDA_TC_ALL || mode == DSV4_CUDA_TC_ATTN ? mode : DSV4_CUDA_TC_OFF;
}

extern "C" int dsv4_cuda_tensor_cores(void)
{
    if (g_tc < 0) {
        const char *e = getenv("DSV4_CUDA_TC");
        g_tc = e && !strcmp(e, "1") ? DSV4_CUDA_TC_ALL : e && !strcmp(e, "0") ? DSV4_CUDA_TC_OFF : DSV4_CUDA_TC_ATTN;
    }
    return g_tc;
}

/* Whether a kernel family ("linear": the linear and expert kernels; "attn": the attention;
 * "index": the indexer scores) takes the tensor cores: the switch's mode has it (ATTN: the
 * attention and the indexer), and it is named in DSV4_CUDA_TC_ONLY when that is set (a comma
 * list, to find which family a difference of numerics comes from). */
bool dsv4cu::tc_family(const char *fam)
{
    int mode = dsv4_cuda_tensor_cores();
    if (mode == DSV4_CUDA_TC_OFF || (mode == DSV4_CUDA_TC_ATTN && strcmp(fam, "attn") && strcmp(fam, "index")))
        return false;
    const char *only = getenv("DSV4_CUDA_TC_ONLY");
    if (!only)
        return true;
    size_t n = strlen(fam);
    for (const char *p = only; *p;) {
        const char *q = strchr(p, ',');
        size_t len = q ? (size_t)(q - p) : strlen(p);
        if (len == n && !strncmp(p, fam, n))
            return true;
        p = q ? q + 1 : p + len;
    }
    return false;
}

/* Whether a weight takes the tensor-core path: the mode has the linears (DSV4_CUDA_TC=1), a
 * form exact in bf16, rows whose thread chunks (4 G elements) tile them, and a power-of-two
 * number of whole runs a scale block. */
bool dsv4cu::tc_ok(const dsv4_weight *w)
{
    if (!tc_family("linear"))
        return false;
    if (w->form != DSV4_WF_BF16 && w->form != DSV4_WF_FP8 && w->form != DSV4_WF_FP4)
        return false;
    int G, RT;
    tc_run_shape(tc_kind(w), &G, &RT);
    if (w->k <= 0 || w->k % (4 * G) || w->k > INT32_MAX / 2)
        return false;
    int rps = w->bk > 0 ? w->bk / (16 * G) : 0;
    return w->form == DSV4_WF_BF16 || (w->scale && w->bk > 0 && w->bk % (16 * G) == 0 && !(rps & (rps - 1)) && w->bn > 0);
}

/* n-tiles of 8 tokens a pass for T tokens (each gives a token the same bits). */
int dsv4cu::tc_nt(int T)
{
    return T <= 8 ? 1 : T <= 16 ? 2 : TC_TN / 8;
}

/* Whether the weight's path reads x with float4 loads (x rows must be 16-byte aligned). */
static bool reads_x4(const dsv4_weight *w)
{
    return tc_ok(w) || vec_ok(w);
}

/* A tensor-core launch of J, NT n-tiles a pass, each job split into slice partials where
 * tc_split says so, then folded into its y; E terms of x (one: a single job whose x is bf16). */
template <int F, int NT, int E>
static void launch_tc_nt(lin_jobs &J, int T, cudaStream_t st)
{
    if (NT == TC_TN / 8 && (J.multi || J.n > 1) && wg_use(F, T)) {
        /* the wgmma pass takes one job a launch, each job summed as it is alone */
        for (int j = 0; j < J.n; j++) {
            lin_jobs one = {};
            one.w[0] = J.w[j];
            one.r0[0] = J.r0[j];
            one.x[0] = J.x[j];
            one.y[0] = J.y[j];
            one.n = 1;
            one.nr = J.multi ? J.nrj[j] : J.nr;
            one.ldx = J.ldx;
            one.ldy = J.multi ? J.nrj[j] : J.ldy;
            launch_tc_nt<F, NT, E>(one, T, st);
        }
        return;
    }
    const int TB = 8 * NT, threads = TC_TW * 32;
    unsigned ty = (unsigned)cdiv(T, TB);
    int nb = 0, S = 1;
    size_t need = 0;
    int64_t nrj[DSV4_CUDA_GROUP_MAX];
    for (int j = 0; j < J.n; j++) {
        nrj[j] = J.multi ? J.nrj[j] : J.nr;
        nb += tc_blocks(nrj[j]);
        S = J.w[j].tcs > S ? J.w[j].tcs : S;
    }
    /* one grouping a launch, from its whole grid; a job of fewer slices takes as many groups as
     * it has (blocks past them exit), and one of a single group writes y itself */
    int Z = tc_groups(S, (int64_t)nb * ty, NT);
    for (int j = 0; j < J.n; j++) {
        J.zj[j] = J.w[j].tcs < Z ? J.w[j].tcs : Z;
        if (J.zj[j] > 1)
            need += (size_t)J.w[j].tcs * T * nrj[j];
    }
    float *p = need ? tc_part_buf(need) : NULL;
    if (need && !p)
        return;
    for (int j = 0; j < J.n; j++) {
        J.part[j] = J.zj[j] > 1 ? p : NULL;
        if (J.zj[j] > 1)
            p += (size_t)J.w[j].tcs * T * nrj[j];
    }
    dim3 grid(0, ty, (unsigned)Z);
    if ((E != TC_X3 || J.rb) && (J.multi || J.n > 1)) {
        fail(DSV4_E_ARG, "cuda: one-term and rounded tensor-core launches take a single job");
        return;
    }
    if (J.multi) {
        J.b0[0] = 0;
        for (int j = 0; j < J.n; j++)
            J.b0[j + 1] = J.b0[j] + tc_blocks(J.nrj[j]);
        grid.x = (unsigned)J.b0[J.n];
        launch_k(k_tc_multi<F, NT>, grid, threads, 0, st, J, T, TB);
    } else if (J.n > 1) {
        J.bpj = tc_blocks(J.nr);
        grid.x = (unsigned)(J.bpj * J.n);
        launch_k(k_tc_group<F, NT>, grid, threads, 0, st, J, T, TB);
    } else if (!(NT == TC_TN / 8 && wg_use(F, T) && launch_wg<F, E>(J, T, Z, J.part[0], st))) {
        dense_map m = {J.x[0], J.y[0], J.ldx, J.ldy, J.rb};
        grid.x = (unsigned)tc_blocks(J.nr);
        launch_k(k_tc_linear<F, NT, E>, grid, threads, 0, st, J.w[0], J.r0[0], J.nr, m, T, TB, J.part[0]);
    }
    for (int j = 0; j < J.n; j++)
        if (J.part[j])
            tc_fold(J.part[j], J.w[j].tcs, T, (int)nrj[j], nrj[j], (int64_t)T * nrj[j], J.y[j],
                    J.multi ? nrj[j] : J.ldy, st, J.rb);
}

template <int F, int E>
static void launch_tc_e(lin_jobs &J, int T, cudaStream_t st)
{
    switch (tc_nt(T)) {
    case 1: launch_tc_nt<F, 1, E>(J, T, st); break;
    case 2: launch_tc_nt<F, 2, E>(J, T, st); break;
    default: launch_tc_nt<F, TC_TN / 8, E>(J, T, st); break;
    }
}

template <int F>
static void launch_tc(lin_jobs &J, int T, cudaStream_t st)
{
    if (J.x1)
        launch_tc_e<F, TC_X1>(J, T, st);
    else
        launch_tc_e<F, TC_X3>(J, T, st);
}

/* Whether the 8-element chunk path tiles this weight's rows (and its scale blocks). */
bool dsv4cu::vec_ok(const dsv4_weight *w)
{
    bool scaled = w->form == DSV4_WF_FP8 || w->form == DSV4_WF_FP4;
    return w->form < DSV4_WF_EXL3 && w->k % 8 == 0 && (!scaled || w->bk % 8 == 0);
}

template <int F>
static ck_shape ck_shape_of(void) { return ck_shape{(int)ck<F>::R, (int)ck<F>::U}; }
ck_shape dsv4cu::chunk_shape(int form)
{
    switch (form) {
    case DSV4_WF_F32: return ck_shape_of<DSV4_WF_F32>();
    case DSV4_WF_BF16: return ck_shape_of<DSV4_WF_BF16>();
    case DSV4_WF_F16: return ck_shape_of<DSV4_WF_F16>();
    case DSV4_WF_FP8: return ck_shape_of<DSV4_WF_FP8>();
    default: return ck_shape_of<DSV4_WF_FP4>();
    }
}

/* Output rows one block of a launch covers: LIN_WARPS / wpr row groups of R (chunk path), or
 * LIN_WARPS rows (element path). */
template <int F>
static int rows_per_block(const wdev &w, bool vec)
{
    return vec ? LIN_WARPS / w.wpr * (int)ck<F>::R : LIN_WARPS;
}

/* A linear kernel's build for the call: T = 1 on the chunk path (fewer registers), the chunk
 * path, or the element path; the three take the same arguments. */
template <class K, class... A>
static void launch_build(K k1, K kc, K ke, bool vec, int T, dim3 grid, cudaStream_t st, A... args)
{
    launch_k(vec && T == 1 ? k1 : vec ? kc : ke, grid, LIN_WARPS * 32, 0, st, args...);
}

template <int F>
static void launch_form(lin_jobs &J, bool vec, int T, cudaStream_t st)
{
    if (J.rb && (J.multi || J.n > 1)) {
        fail(DSV4_E_ARG, "cuda: rounded linear launches take a single job");
        return;
    }
    if (J.multi) {
        J.b0[0] = 0;
        for (int j = 0; j < J.n; j++)
            J.b0[j + 1] = J.b0[j] + (int)cdiv(J.nrj[j], rows_per_block<F>(J.w[j], vec));
        launch_build(k_linear_multi<F, true, 1>, k_linear_multi<F, true, LIN_TT>, k_linear_multi<F, false, LIN_TT>, vec,
                     T, dim3((unsigned)J.b0[J.n]), st, J, T);
        return;
    }
    J.bpj = (int)cdiv(J.nr, rows_per_block<F>(J.w[0], vec));
    dim3 grid((unsigned)(J.bpj * J.n));
    if (J.n > 1) {
        launch_build(k_linear_group<F, true, 1>, k_linear_group<F, true, LIN_TT>, k_linear_group<F, false, LIN_TT>, vec, T,
                     grid, st, J, T);
        return;
    }
    dense_map m = {J.x[0], J.y[0], J.ldx, J.ldy, J.rb};
    launch_build(k_linear<F, true, 1>, k_linear<F, true, LIN_TT>, k_linear<F, false, LIN_TT>, vec, T, grid, st, J.w[0],
                 J.r0[0], J.nr, m, T);
}

/* Launches J's jobs, whose weights all have w's form and path (and, but in a multi launch, its
 * shape). */
static void launch_linear(const dsv4_weight *w, lin_jobs &J, int T, cudaStream_t st)
{
    if (tc_ok(w)) {
        switch (tc_kind(w)) {
        case DSV4_WF_BF16: launch_tc<DSV4_WF_BF16>(J, T, st); break;
        case DSV4_WF_FP8: launch_tc<DSV4_WF_FP8>(J, T, st); break;
        case TC_FP8_32: launch_tc<TC_FP8_32>(J, T, st); break;
        default: launch_tc<DSV4_WF_FP4>(J, T, st); break;
        }
        return;
    }
    bool vec = vec_ok(w);
    switch (w->form) {
    case DSV4_WF_F32: launch_form<DSV4_WF_F32>(J, vec, T, st); break;
    case DSV4_WF_BF16: launch_form<DSV4_WF_BF16>(J, vec, T, st); break;
    case DSV4_WF_F16: launch_form<DSV4_WF_F16>(J, vec, T, st); break;
    case DSV4_WF_FP8: launch_form<DSV4_WF_FP8>(J, vec, T, st); break;
    default: launch_form<DSV4_WF_FP4>(J, vec, T, st); break;
    }
}

/* One job: rows [r0, r0 + nr) of a weight. */
static lin_jobs one_job(const wdev &wd, int64_t r0, int nr, const float *dx, float *dy)
{
    lin_jobs J;
    memset(&J, 0, sizeof J);
    J.w[0] = wd;
    J.r0[0] = r0;
    J.x[0] = dx;
    J.y[0] = dy;
    J.n = 1;
    J.nr = nr;
    J.ldx = wd.k;
    J.ldy = nr;
    return J;
}

/* Warps per row group: doubled (up to LIN_WARPS) while the weight has too few row groups to
 * give the device LIN_MIN_WARPS warps and each lane would still get its U chunks (splitting
 * further only adds blocks, and a second wave). From the weight's form and shape alone, so
 * every call over that weight sums a row the same way. */


/* As wdev_of for a weight that runs beside mats - 1 others of its shape in every launch (the
 * active experts of a row): the warps per row group count the others' rows too, so a small
 * matrix is not split finer than the launch needs. From the shape and mats alone. */
wdev dsv4cu::wdev_of_n(const dsv4_weight *w, const void *q, const void *s, int mats)
{
    wdev d;
    d.q = (const uint8_t *)q;
    d.s = s;
    d.form = w->form;
    d.e8m0 = w->scale_e8m0;
    d.bn = w->bn > 0 ? w->bn : 1;
    d.bk = w->bk > 0 ? w->bk : 1;
    d.k = w->k;
    d.sk = w->form == DSV4_WF_FP8 ? cdiv(w->k, d.bk) : w->k / d.bk;
    d.cpb = d.bk / 8 > 0 ? d.bk / 8 : 1;
    d.cshift = (d.cpb & (d.cpb - 1)) ? -1 : __builtin_ctz((unsigned)d.cpb);
    int64_t nch = w->k / 8, groups = cdiv(w->n, chunk_shape(w->form).R) * (mats > 0 ? mats : 1);
    d.wpr = 1;
    while (d.wpr < LIN_WARPS && groups * d.wpr < LIN_MIN_WARPS && nch >= (int64_t)32 * chunk_shape(w->form).U * d.wpr * 2)
        d.wpr *= 2;
    /* the tensor-core path: run slices of a row, as many as keep two few-token k-tiles each
     * (the launch then groups them as the device's size asks: tc_groups) */
    int G, RT;
    tc_run_shape(tc_kind(w), &G, &RT);
    int64_t nrun = cdiv(w->k, 16 * G);
    d.tcs = 1;
    while (d.tcs < TC_SMAX && nrun >= (int64_t)RT * d.tcs * 4)
        d.tcs *= 2;
    int rps = d.bk / (16 * G); /* runs a scale block */
    d.kss = d.bk % (16 * G) == 0 && rps > 0 && !(rps & (rps - 1)) ? __builtin_ctz((unsigned)rps) : 0;
    return d;
}

/* Device x rows the chunk path cannot read in place (float4 loads need a 16-byte aligned row
 * start) are packed into this buffer first. It only grows, and a buffer it outgrew is kept
 * (never freed), since a recorded graph may still read it. */
static growbuf g_pack;

static float *pack_buf(size_t n) { return grow_buf(&g_pack, n, n, NULL); }

/* EXL3 rows (exl3.cu) over device buffers; its failures are kept here like every op's. */
static void exl3_linear(const dsv4_weight *w, int64_t r0, int64_t r1, const float *x, int T, int64_t ldx, float *y,
                        int64_t ldy)
{
    int64_t nr = r1 - r0;
    dsv4_err e;
    memset(&e, 0, sizeof e);
    /* the launch's own error and the pack's kept one are both read, so neither is lost */
    int bad = !poison_rows(y, T, nr, ldy) || dsv4_cuda_exl3_linear(w, r0, r1, x, T, ldx, y, ldy, stream);
    int kept = dsv4_cuda_exl3_check(&e);
    if (bad || kept) {
        fail(e.code ? e.code : DSV4_E_DEVICE, "%s", e.code ? e.msg : "cuda: EXL3 linear failed");
        fail_rows(y, T, nr, ldy);
    }
}

void dsv4cu::cu_linear(const dsv4_weight *w, int64_t r0, int64_t r1, const float *x, int T, int64_t ldx, float *y,
                      int64_t ldy)
{
    linear_x(w, r0, r1, x, T, ldx, y, ldy, 0, 0);
}

void dsv4cu::cu_linear_rb(const dsv4_weight *w, int64_t r0, int64_t r1, const float *x, int T, int64_t ldx, float *y,
                         int64_t ldy, int quant)
{
    if (quant)
        linear_q_x(w, r0, r1, x, T, ldx, y, ldy, 1);
    else
        linear_x(w, r0, r1, x, T, ldx, y, ldy, 0, 1);
}

void dsv4cu::linear_x(const dsv4_weight *w, int64_t r0, int64_t r1, const float *x, int T, int64_t ldx, float *y,
                      int64_t ldy, int x1, int rb)
{
    int64_t nr = r1 - r0;
    if (T <= 0 || nr <= 0)
        return;
    op_begin_at("cu_linear"); /* the op it serves, in the profile */
    if (!given("linear", {x, y})) {
        fail_rows(y, T, nr, ldy);
        op_end();
        return;
    }
    if (w->form == DSV4_WF_EXL3) { /* EXL3's kernels write as they are: the rounding follows */
        exl3_linear(w, r0, r1, x, T, ldx, y, ldy);
        if (rb)
            round_bf16_rows_launch(y, T, nr, ldy);
        op_end();
        return;
    }
    int ok = w->form < DSV4_WF_EXL3 && w->data;
    if (!ok)
        fail(DSV4_E_UNSUPPORTED, "cuda: weight %s: %s%s", w->name ? w->name : "?",
             w->form < DSV4_WF_EXL3 ? "no data" : dsv4_wform_name(w->form),
             w->form < DSV4_WF_EXL3 ? "" : " has no CUDA kernel");
    const char *nm = w->name ? w->name : "weight";
    const void *q = ok ? dev_const(w->data, "linear", nm) : NULL;
    const void *s = q && w->scale ? dev_const(w->scale, "linear", nm) : NULL;
    const float *dx = NULL;
    int64_t dldx = ldx;
    if (q && (s || !w->scale)) {
        bool aligned = ((uintptr_t)x & 15) == 0 && (T == 1 || ldx % 4 == 0);
        if (aligned || !reads_x4(w))
            dx = x;
        else {
            float *pk = pack_buf((size_t)T * w->k);
            if (pk && !CK(cudaMemcpy2DAsync(pk, w->k * sizeof(float), x, ldx * sizeof(float), w->k * sizeof(float), T,
                                            cudaMemcpyDeviceToDevice, stream))) {
                dx = pk;
                dldx = w->k;
            }
        }
    }
    bool ran = dx && poison_rows(y, T, nr, ldy);
    if (ran) {
        lin_jobs J = one_job(wdev_of(w, q, s), r0, (int)nr, dx, y);
        J.ldx = dldx;
        J.ldy = ldy;
        J.x1 = x1;
        J.rb = rb;
        launch_linear(w, J, T, stream);
    }
    finish_rows(ran, "linear", y, T, nr, ldy);
    op_end();
}

/* The G blocks in one launch (jobs of one weight at row offsets g n/G, strided x and y) when
 * the shape allows it; else block by block. */
void dsv4cu::cu_linear_blocks(const dsv4_weight *w, int G, const float *x, int T, float *y)
{
    int64_t rk = w->n / G;
    if (T <= 0 || G < 1)
        return;
    if (!x || !y) {
        op_begin();
        given("linear_blocks", {x, y});
        fail_rows(y, T, w->n, w->n);
        op_end();
        return;
    }
    bool one = G <= DSV4_CUDA_GROUP_MAX && w->form < DSV4_WF_EXL3 && reads_x4(w) &&
               ((uintptr_t)x & 15) == 0 && (w->k * G) % 4 == 0 && w->k % 4 == 0;
    if (!one) {
        for (int g = 0; g < G; g++)
            cu_linear(w, g * rk, (g + 1) * rk, x + g * w->k, T, (int64_t)G * w->k, y + g * rk, w->n);
        return;
    }
    op_begin();
    const char *nm = w->name ? w->name : "weight";
    const void *q = dev_const(w->data, "linear_blocks", nm);
    if (!w->data)
        fail(DSV4_E_ARG, "cuda: linear_blocks: weight %s has no data", nm);
    const void *s = q && w->scale ? dev_const(w->scale, "linear_blocks", nm) : NULL;
    if (q && (s || !w->scale) && poison_out(y, (size_t)T * w->n * sizeof(float))) {
        lin_jobs J;
        memset(&J, 0, sizeof J);
        J.n = G;
        J.nr = (int)rk;
        J.ldx = (int64_t)G * w->k;
        J.ldy = w->n;
        for (int g = 0; g < G; g++) {
            J.w[g] = wdev_of(w, q, s);
            J.r0[g] = g * rk;
            J.x[g] = x + g * w->k;
            J.y[g] = y + g * rk;
        }
        launch_linear(w, J, T, stream);
        if (!launched("linear blocks"))
            fail_rows(y, T, w->n, w->n);
    } else
        fail_rows(y, T, w->n, w->n);
    op_end();
}

/* The weights of each storage form in one launch (x shared, y[j] dense [T, W_j.n]), each job
 * summed as cu_linear sums it alone: the same wdev_of, path and grid within the job. A weight
 * the launches cannot take (EXL3, not on the device, the chunk path over an x it would have to
 * pack) runs alone through cu_linear (which reports one not on the device). Past
 * DSV4_CUDA_GROUP_MAX weights, slice by slice. */
void dsv4cu::cu_linear_multi(int nw, const dsv4_weight *const *w, const float *x, int T, int64_t ldx, float *const *y)
{
    if (nw > DSV4_CUDA_GROUP_MAX) {
        cu_linear_multi(DSV4_CUDA_GROUP_MAX, w, x, T, ldx, y);
        cu_linear_multi(nw - DSV4_CUDA_GROUP_MAX, w + DSV4_CUDA_GROUP_MAX, x, T, ldx, y + DSV4_CUDA_GROUP_MAX);
        return;
    }
    if (T <= 0 || nw <= 0)
        return;
    bool all = x != NULL;
    for (int j = 0; j < nw; j++)
        all = all && y[j];
    if (!all) {
        op_begin();
        fail(DSV4_E_ARG, "cuda: linear_multi: a buffer it reads or writes is NULL");
        for (int j = 0; j < nw; j++)
            fail_rows(y[j], T, w[j]->n, w[j]->n);
        op_end();
        return;
    }
    bool aligned = ((uintptr_t)x & 15) == 0 && (T == 1 || ldx % 4 == 0);
    int state[DSV4_CUDA_GROUP_MAX]; /* 0: for a launch, 1: launched, -1: alone */
    wdev wd[DSV4_CUDA_GROUP_MAX];
    op_begin();
    for (int j = 0; j < nw; j++) {
        const dsv4_weight *a = w[j];
        const void *q = a->form < DSV4_WF_EXL3 && a->n > 0 ? dev_known(a->data) : NULL;
        const void *s = q && a->scale ? dev_known(a->scale) : NULL;
        state[j] = q && (s || !a->scale) && (aligned || !reads_x4(a)) ? 0 : -1;
        if (!state[j])
            wd[j] = wdev_of(a, q, s);
    }
    for (int j0 = 0; j0 < nw; j0++) {
        if (state[j0])
            continue;
        bool vec = vec_ok(w[j0]), tc = tc_ok(w[j0]);
        lin_jobs J;
        memset(&J, 0, sizeof J);
        J.multi = 1;
        J.ldx = ldx;
        for (int j = j0; j < nw; j++) {
            if (state[j] || w[j]->form != w[j0]->form || vec_ok(w[j]) != vec || tc_ok(w[j]) != tc ||
                (tc && tc_kind(w[j]) != tc_kind(w[j0])))
                continue;
            state[j] = 1;
            if (!poison_out(y[j], (size_t)T * w[j]->n * sizeof(float))) {
                fail_rows(y[j], T, w[j]->n, w[j]->n);
                continue;
            }
            J.w[J.n] = wd[j];
            J.x[J.n] = x;
            J.y[J.n] = y[j];
            J.nrj[J.n++] = (int)w[j]->n;
        }
        if (!J.n)
            continue;
        launch_linear(w[j0], J, T, stream);
        if (!launched("linear multi"))
            for (int i = 0; i < J.n; i++)
                fail_rows(J.y[i], T, J.nrj[i], J.nrj[i]);
    }
    op_end();
    for (int j = 0; j < nw; j++)
        if (state[j] < 0)
            cu_linear(w[j], 0, w[j]->n, x, T, ldx, y[j], w[j]->n);
}

static int linear_dev(const dsv4_weight *w, int64_t r0, int64_t r1, const float *dx, int T, float *dy, void *stream,
                      int x1, dsv4_err *err)
{
    if (w->form == DSV4_WF_EXL3) {
        int rc = dsv4_cuda_exl3_linear(w, r0, r1, dx, T, w->k, dy, r1 - r0, stream);
        int kept = dsv4_cuda_exl3_check(err); /* names the failure of rc */
        return kept ? kept : rc;
    }
    pthread_mutex_lock(&dsv4cu::lock);
    resident *rq = resident_of(w->data), *rs = w->scale ? resident_of(w->scale) : NULL;
    pthread_mutex_unlock(&dsv4cu::lock);
    if (w->form > DSV4_WF_EXL3 || !rq || (w->scale && !rs))
        return dsv4_fail(err, DSV4_E_ARG, "cuda: weight %s is not resident on the device (dsv4_cuda_put_weight first)",
                         w->name ? w->name : "?");
    lin_jobs J = one_job(wdev_of(w, rq->dev, rs ? rs->dev : NULL), r0, (int)(r1 - r0), dx, dy);
    J.x1 = x1;
    launch_linear(w, J, T, (cudaStream_t)stream);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return dsv4_fail(err, DSV4_E_DEVICE, "cuda: linear launch: %s", cudaGetErrorString(e));
    return 0;
}

extern "C" int dsv4_cuda_linear_dev(const dsv4_weight *w, int64_t r0, int64_t r1, const float *dx, int T, float *dy,
                                    void *stream, dsv4_err *err)
{
    return linear_dev(w, r0, r1, dx, T, dy, stream, 0, err);
}

extern "C" int dsv4_cuda_linear_dev_bf16x(const dsv4_weight *w, int64_t r0, int64_t r1, const float *dx, int T,
                                          float *dy, void *stream, dsv4_err *err)
{
    return linear_dev(w, r0, r1, dx, T, dy, stream, 1, err);
}

extern "C" int dsv4_cuda_linear_group_dev(const dsv4_weight *const *w, int n, const float *const *dx, int T,
                                          float *const *dy, void *stream, dsv4_err *err)
{
    if (n < 1 || n > DSV4_CUDA_GROUP_MAX)
        return dsv4_fail(err, DSV4_E_ARG, "cuda: a linear group holds 1 to %d weights, not %d", DSV4_CUDA_GROUP_MAX, n);
    lin_jobs J;
    memset(&J, 0, sizeof J);
    J.n = n;
    J.nr = (int)w[0]->n;
    J.ldx = w[0]->k;
    J.ldy = w[0]->n;
    for (int j = 0; j < n; j++) {
        const dsv4_weight *a = w[j], *b = w[0];
        if (a->form != b->form || a->n != b->n || a->k != b->k || a->bn != b->bn || a->bk != b->bk ||
            a->scale_e8m0 != b->scale_e8m0 || (a->scale == NULL) != (b->scale == NULL))
            return dsv4_fail(err, DSV4_E_ARG, "cuda: linear group: weight %s differs from %s in form, shape or blocks",
                             a->name ? a->name : "?", b->name ? b->name : "?");
        pthread_mutex_lock(&dsv4cu::lock);
        resident *rq = resident_of(a->data), *rs = a->scale ? resident_of(a->scale) : NULL;
        pthread_mutex_unlock(&dsv4cu::lock);
        if (a->form >= DSV4_WF_EXL3 || !rq || (a->scale && !rs))
            return dsv4_fail(err, DSV4_E_ARG, "cuda: weight %s is not resident on the device (dsv4_cuda_put_weight first)",
                             a->name ? a->name : "?");
        J.w[j] = wdev_of(a, rq->dev, rs ? rs->dev : NULL);
        J.x[j] = dx[j];
        J.y[j] = dy[j];
    }
    launch_linear(w[0], J, T, (cudaStream_t)stream);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return dsv4_fail(err, DSV4_E_DEVICE, "cuda: linear group launch: %s", cudaGetErrorString(e));
    return 0;
}
