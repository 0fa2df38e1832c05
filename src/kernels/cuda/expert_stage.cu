/* Spilled experts staged: before a step's expert kernels run, the routed experts that sit in
 * pinned host memory are copied into device memory by a copy kernel, and the kernels read them
 * there. A kernel reading mapped host memory in place issues the small loads of a matrix
 * kernel, which reach well under half of the bus rate; the copy kernel's wide loads reach it.
 * The copy runs on the device from the routing the device computed, so a step still needs no
 * wait on the host and can be recorded. The bytes read are the same, so the results are too. */
#include <cuda_runtime.h>
#include <stdint.h>
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/internal.h"
#include "kernels/cuda/expert_stage.cuh"

using namespace dsv4cu;

/* Staging slots: a slot holds one expert's three matrices; tile tl of a step uses slot tl when
 * tl < EX_STAGE_SLOTS (a step of few rows has one tile per routed expert: decode, lanes). The
 * other tiles read their experts in place. */
enum { EX_STAGE_SLOTS = 8, EX_STAGE_CHUNK = 1 << 16, EX_STAGE_THREADS = 256 };

static uint8_t *g_buf;          /* slots, grown outside recordings, never freed (recordings read it) */
static size_t g_buf_cap;
static wdev *g_tab;             /* the three staged tables, E entries each */
static int g_tab_cap;
static unsigned long g_staged;  /* calls that staged (dsv4_cuda_experts_staged) */

extern "C" unsigned long dsv4_cuda_experts_staged(void) { return g_staged; }

static __host__ __device__ size_t pad16(size_t b) { return (b + 15) & ~(size_t)15; }

/* s[m][e] = t[m][e] for the three matrices. */
__global__ void k_stage_tab(ex_tables t, wdev *s, int E)
{
    PDL_WAIT();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < 3 * E)
        s[i] = t.t[i / E][i % E];
}

/* n bytes from src to dst, block-strided 16-byte words (4 in flight a thread) when both are
 * 16-byte aligned and n is whole words, else byte by byte. */
__device__ void copy_span(uint8_t *dst, const uint8_t *src, size_t n)
{
    if (!(((uintptr_t)dst | (uintptr_t)src | n) & 15)) {
        const uint4 *s = (const uint4 *)src;
        uint4 *d = (uint4 *)dst;
        size_t w = n / 16;
        for (size_t i = threadIdx.x; i < w; i += 4 * blockDim.x) {
            uint4 v[4];
#pragma unroll
            for (int j = 0; j < 4; j++)
                if (i + j * blockDim.x < w)
                    v[j] = s[i + j * blockDim.x];
#pragma unroll
            for (int j = 0; j < 4; j++)
                if (i + j * blockDim.x < w)
                    d[i + j * blockDim.x] = v[j];
        }
        return;
    }
    for (size_t i = threadIdx.x; i < n; i += blockDim.x)
        dst[i] = src[i];
}

/* Block (slot, chunk, matrix m): when tile `slot` is the first tile of its expert e and e's
 * matrix m is in host memory, copies chunk `chunk` of its data and chunk `chunk` of its scales
 * into the slot (the scales 16-byte aligned after the data), and chunk 0 points the staged
 * table's entry there. */
__global__ void k_stage_copy(ex_tables t, wdev *s, int E, const int *tiles, const int *ntiles, uint8_t *buf,
                             size_t slot_bytes, ex_sizes z)
{
    PDL_WAIT();
    int tl = blockIdx.x, m = blockIdx.z;
    if (tl >= *ntiles || !t.host[m])
        return;
    int e = tiles[3 * tl];
    if ((tl > 0 && tiles[3 * (tl - 1)] == e) || !t.host[m][e])
        return;
    const wdev &w = t.t[m][e];
    uint8_t *dq = buf + tl * slot_bytes + z.off[m], *ds = dq + pad16(z.data[m]);
    size_t b0 = (size_t)blockIdx.y * EX_STAGE_CHUNK;
    if (b0 < z.data[m])
        copy_span(dq + b0, w.q + b0, z.data[m] - b0 < EX_STAGE_CHUNK ? z.data[m] - b0 : EX_STAGE_CHUNK);
    if (b0 < z.scale[m])
        copy_span(ds + b0, (const uint8_t *)w.s + b0, z.scale[m] - b0 < EX_STAGE_CHUNK ? z.scale[m] - b0 : EX_STAGE_CHUNK);
    if (blockIdx.y == 0 && threadIdx.x == 0) {
        s[m * E + e].q = dq;
        if (z.scale[m])
            s[m * E + e].s = ds;
    }
}

bool dsv4cu::stage_experts(const ex_tables &t, const ex_sizes &sizes, int E, const int *tiles, const int *ntiles, int NT,
                           const wdev *out[3])
{
    /* a slot: each matrix's data, then its scales, each 16-byte aligned */
    ex_sizes z = sizes;
    size_t slot_bytes = 0;
    for (int m = 0; m < 3; m++) {
        z.off[m] = slot_bytes;
        slot_bytes += pad16(z.data[m]) + pad16(z.scale[m]);
    }
    for (int m = 0; m < 3; m++)
        out[m] = t.t[m];
    if (!t.host[0] && !t.host[1] && !t.host[2])
        return true;
    int slots = NT < EX_STAGE_SLOTS ? NT : EX_STAGE_SLOTS;
    if (slots <= 0)
        return true;
    /* staging memory is taken outside recordings only; without it the kernels read in place */
    if ((size_t)slots * slot_bytes > g_buf_cap || 3 * E > g_tab_cap) {
        if (capturing)
            return true;
        uint8_t *b = NULL;
        wdev *tb = NULL;
        size_t nb = (size_t)EX_STAGE_SLOTS * slot_bytes > g_buf_cap ? (size_t)EX_STAGE_SLOTS * slot_bytes : g_buf_cap;
        int nt = 3 * E > g_tab_cap ? 3 * E : g_tab_cap;
        if (nb > g_buf_cap) {
            if (cudaMalloc((void **)&b, nb) != cudaSuccess) {
                cudaGetLastError(); /* no room: read in place */
                return true;
            }
            g_buf = b;
            g_buf_cap = nb;
        }
        if (nt > g_tab_cap) {
            if (cudaMalloc((void **)&tb, (size_t)nt * sizeof(wdev)) != cudaSuccess) {
                cudaGetLastError();
                return true;
            }
            g_tab = tb;
            g_tab_cap = nt;
        }
    }
    launch_k(k_stage_tab, (unsigned)cdiv(3 * E, 256), 256, 0, stream, t, g_tab, E);
    size_t most = 0;
    for (int m = 0; m < 3; m++) {
        most = z.data[m] > most ? z.data[m] : most;
        most = z.scale[m] > most ? z.scale[m] : most;
    }
    dim3 grid((unsigned)slots, (unsigned)cdiv((int64_t)most, EX_STAGE_CHUNK), 3);
    launch_k(k_stage_copy, grid, EX_STAGE_THREADS, 0, stream, t, g_tab, E, tiles, ntiles, g_buf, slot_bytes, z);
    if (!launched("experts staging"))
        return false;
    for (int m = 0; m < 3; m++)
        out[m] = g_tab + (size_t)m * E;
    g_staged++;
    return true;
}
