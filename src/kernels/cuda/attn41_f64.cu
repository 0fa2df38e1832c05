/* CUDA backend: REF's attention for V4.1's rows (attn_step41 step 4, backend.h): every sum in
 * double, o rounded to float once, as the reference computes it. Two kernels; which one runs
 * is fixed by the model's shapes (H, d, topk + window), so a row gets the same bits in any step.
 *
 * k41_attn_dmma, on the FP64 tensor cores (mma m8n8k4): a block takes one row, 8 heads (the
 * MMA's M side; heads past H are zero rows) and a slice of o's columns, with 8 warps:
 *   scores  S[8, nk] = Q[8, d] K^T, warp w the key tiles of 8 w, w + 8, ...; d in steps of 4
 *           where, within each 16 columns, thread t4 of a group holds columns 4 t4 .. 4 t4 + 3
 *           (the same for q and the keys: the k order is a fixed permutation of d);
 *   softmax warp h the head h: its maximum with the sink, p = e^(s - m), the denominator
 *           sum_i p_i (lanes over i = lane, lane + 32, ..., then the warp's tree) + e^(sink - m);
 *   values  O[8, cols] = P[8, nk] K, warp w the column tiles of 8 w, w + 8, ... of its slice,
 *           the keys in steps of 4 in order; o = O / denominator.
 * Every block of a row computes the row's scores the same way, so slicing the columns (to give a
 * small step blocks enough) leaves every value as it is. Keys past the row's nk are zeros, which
 * add nothing.
 *
 * k41_attn_f64, on the CUDA cores, where the tensor-core form does not fit (d not a multiple of
 * 16, or the scores of topk + window keys over shared memory): a block per row and group of G
 * heads (8 when the step has rows enough, else 1), warp per key for the scores, thread per
 * column over the keys in order for o; a head's sums are the same for either G. */
#include <math.h>
#include "kernels/cuda/step.cuh"

using namespace dsv4cu;

namespace {

enum { F_NW = 16, D_NW = 8 }; /* warps of a k41_attn_f64 and of a k41_attn_dmma block */

/* REF's attention (backend.h, attn_step41 step 4): block (row r, heads h0 .. h0 + G - 1),
 * every sum in double and o rounded to float once. For each head: scores by warp (key i to
 * warp i % F_NW, lane l over columns l, l + 32, ... in order, then the warp's tree); the
 * denominator by the block's fixed-order sum plus the sink's term; out_j by thread j over the
 * keys in order, divided by the denominator at the end. A head's order is the same for every
 * G (G only shares the key loads among heads), so a row's bits do not depend on the launch.
 * Dynamic shared memory: pd [G, nkmax] doubles, kp [nkmax] key pointers, qs [G, d] floats. */
template <int G>
__global__ void __launch_bounds__(F_NW * 32) k41_attn_f64(geo41 g, int H, int d, int nkmax, float scale,
                                                            const float *sink, const float *q, float *o)
{
    PDL_WAIT();
    extern __shared__ double pd[];
    __shared__ double sh[F_NW + 1], dens[G];
    const void **kp = (const void **)(pd + (size_t)G * nkmax);
    float *qs = (float *)(kp + nkmax);
    const int NT = F_NW * 32;
    int r = blockIdx.x, h0 = blockIdx.y * G, lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    geo41::Row row(g, r, d);
    if (!row.ok) {
        for (int x = threadIdx.x; x < G * d; x += NT)
            o[((int64_t)r * H + h0) * d + x] = __int_as_float(0x7fc00000);
        return;
    }
    int nk = row.nk;
    for (int i = threadIdx.x; i < nk; i += NT)
        kp[i] = row.key(i).p;
    for (int x = threadIdx.x; x < G * d; x += NT)
        qs[x] = q[((int64_t)r * H + h0) * d + x];
    __syncthreads();
    for (int i = wid; i < nk; i += F_NW) {
        const crow k = {kp[i], row.kfmt(i), d};
        float kr[ATT_C];
#pragma unroll
        for (int c = 0; c < ATT_C; c++)
            kr[c] = lane + 32 * c < d ? k[lane + 32 * c] : 0.0f;
        for (int hh = 0; hh < G; hh++) {
            double a = 0.0;
#pragma unroll
            for (int c = 0; c < ATT_C; c++)
                if (lane + 32 * c < d)
                    a = fma((double)qs[hh * d + lane + 32 * c], (double)kr[c], a);
#pragma unroll
            for (int off = 16; off > 0; off >>= 1)
                a += __shfl_xor_sync(0xffffffffu, a, off);
            if (lane == 0)
                pd[(size_t)hh * nkmax + i] = a * (double)scale;
        }
    }
    __syncthreads();
    for (int hh = 0; hh < G; hh++) {
        double den = block_softmax<F_NW>(pd + (size_t)hh * nkmax, nk, (double)sink[h0 + hh], sh);
        if (threadIdx.x == 0)
            dens[hh] = den;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < d; j += NT) {
        double acc[G];
#pragma unroll
        for (int hh = 0; hh < G; hh++)
            acc[hh] = 0.0;
#pragma unroll 8
        for (int i = 0; i < nk; i++) {
            double kv = crow{kp[i], row.kfmt(i), d}[j];
#pragma unroll
            for (int hh = 0; hh < G; hh++)
                acc[hh] = fma(pd[(size_t)hh * nkmax + i], kv, acc[hh]);
        }
#pragma unroll
        for (int hh = 0; hh < G; hh++)
            o[((int64_t)r * H + h0 + hh) * d + j] = (float)(acc[hh] / dens[hh]);
    }
}

/* k41_attn_f64's dynamic shared memory for G heads a block. */
size_t f64_smem(int G, int64_t nkmax, int d)
{
    size_t n = (size_t)(nkmax > 0 ? nkmax : 1);
    return n * G * sizeof(double) + n * sizeof(float *) + (size_t)G * d * sizeof(float);
}

/* Heads a block of k41_attn_f64 takes: 8 when they divide H, the step has rows enough to fill
 * the device and the block's scores fit 160 KiB (every head's sums are the same either way). */
int f64_group(int R, int H, int64_t nkmax, int d)
{
    return H % 8 == 0 && (int64_t)R * H / 8 >= 1024 && f64_smem(8, nkmax, d) <= 160 * 1024 ? 8 : 1;
}


/* D = A B + D on the FP64 tensor cores, m8n8k4: lane (g = lane / 4, t = lane % 4) holds A[g][t],
 * B[t][g] and D[g][2 t], D[g][2 t + 1]. */
__device__ __forceinline__ void dmma(double (&c)[2], double a, double b)
{
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};"
                 : "+d"(c[0]), "+d"(c[1])
                 : "d"(a), "d"(b));
}

/* k41_attn_dmma's dynamic shared memory for rows of at most nk keys: pd [8, nkpad] doubles, kp
 * [nkpad] key pointers, qs [8, d] floats (nkpad: nk rounded up to 8). */
size_t dmma_smem(int64_t nk, int d)
{
    size_t nkpad = (size_t)cdiv(nk > 0 ? nk : 1, 8) * 8;
    return nkpad * 8 * sizeof(double) + nkpad * sizeof(float *) + (size_t)8 * d * sizeof(float);
}

/* Block (row r, heads 8 blockIdx.y .., column slice blockIdx.z of sw columns). */
__global__ void __launch_bounds__(D_NW * 32) k41_attn_dmma(geo41 g, int H, int d, int nkpad, int sw, float scale,
                                                          const float *sink, const float *q, float *o)
{
    PDL_WAIT();
    extern __shared__ double pd[];
    __shared__ double dens[8];
    const void **kp = (const void **)(pd + (size_t)8 * nkpad);
    float *qs = (float *)(kp + nkpad);
    const int NT = D_NW * 32;
    int r = blockIdx.x, h0 = blockIdx.y * 8, c_lo = blockIdx.z * sw;
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, gq = lane >> 2, t4 = lane & 3;
    geo41::Row row(g, r, d);
    if (!row.ok) {
        for (int x = threadIdx.x; x < 8 * sw; x += NT)
            if (h0 + x / sw < H)
                o[((int64_t)r * H + h0 + x / sw) * d + c_lo + x % sw] = __int_as_float(0x7fc00000);
        return;
    }
    int nk = row.nk;
    for (int i = threadIdx.x; i < nkpad; i += NT)
        kp[i] = i < nk ? row.key(i).p : NULL;
    for (int x = threadIdx.x; x < 8 * d; x += NT)
        qs[x] = h0 + x / d < H ? q[((int64_t)r * H + h0) * d + x] : 0.0f;
    __syncthreads();
    for (int n0 = 8 * wid; n0 < nk; n0 += 8 * D_NW) {
        const crow kr = {kp[n0 + gq], row.kfmt(n0 + gq), d};
        const float *qr = qs + gq * d + 4 * t4;
        double c[2] = {0.0, 0.0};
        for (int j = 0; j < d; j += 16) {
            float4 k4 = kr.p ? kr.ld4(j + 4 * t4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            float4 q4 = *(const float4 *)(qr + j);
            dmma(c, q4.x, k4.x);
            dmma(c, q4.y, k4.y);
            dmma(c, q4.z, k4.z);
            dmma(c, q4.w, k4.w);
        }
#pragma unroll
        for (int e = 0; e < 2; e++)
            if (n0 + 2 * t4 + e < nk)
                pd[gq * nkpad + n0 + 2 * t4 + e] = c[e] * (double)scale;
    }
    __syncthreads();
    {
        int hh = wid; /* D_NW == 8: warp hh takes head h0 + hh */
        double *p = pd + (size_t)hh * nkpad;
        if (h0 + hh < H) {
            double mx = sink[h0 + hh];
            for (int i = lane; i < nk; i += 32)
                mx = fmax(mx, p[i]);
#pragma unroll
            for (int off = 16; off > 0; off >>= 1)
                mx = fmax(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            double sum = 0.0;
            for (int i = lane; i < nk; i += 32) {
                double e = exp(p[i] - mx);
                p[i] = e;
                sum += e;
            }
#pragma unroll
            for (int off = 16; off > 0; off >>= 1)
                sum += __shfl_xor_sync(0xffffffffu, sum, off);
            if (lane == 0)
                dens[hh] = sum + exp((double)sink[h0 + hh] - mx);
            for (int i = nk + lane; i < nkpad; i += 32)
                p[i] = 0.0;
        } else
            for (int i = lane; i < nkpad; i += 32)
                p[i] = 0.0;
    }
    __syncthreads();
    int nk4 = (int)cdiv(nk, 4) * 4;
    for (int c0 = c_lo + 8 * wid; c0 < c_lo + sw; c0 += 8 * D_NW) {
        double c[2] = {0.0, 0.0};
#pragma unroll 4
        for (int i0 = 0; i0 < nk4; i0 += 4) {
            const crow kr = {kp[i0 + t4], row.kfmt(i0 + t4), d};
            double b = kr.p ? (double)kr[c0 + gq] : 0.0;
            dmma(c, pd[gq * nkpad + i0 + t4], b);
        }
        if (h0 + gq < H)
#pragma unroll
            for (int e = 0; e < 2; e++)
                o[((int64_t)r * H + h0 + gq) * d + c0 + 2 * t4 + e] = (float)(c[e] / dens[gq]);
    }
}

/* Shared memory a block may opt into, once. */
int optin_smem()
{
    static int v = -1;
    if (v < 0) {
        int dev = 0;
        if (CK(cudaGetDevice(&dev)) || CK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev)))
            v = 0;
    }
    return v;
}

/* Raises a kernel's dynamic shared memory limit to bytes (kept in *set); false when it failed. */
template <class K>
bool allow_smem(K kernel, size_t bytes, int *set)
{
    if (bytes <= 48 * 1024 - 1024 || (int)bytes <= *set)
        return true;
    if (CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes)))
        return false;
    *set = (int)bytes;
    return true;
}

int dmma_set, f64_set[2];

} // namespace

bool dsv4cu::attn41_f64_launch(const geo41 &g, int H, int d, int64_t nkbound, float scale, const float *sink,
                               const float *q, float *o)
{
    int R = g.rd.R;
    int64_t nkmax = g.nkmax;
    int optin = optin_smem();
    if (d % 16 == 0 && dmma_smem(nkbound, d) + 1024 <= (size_t)optin) {
        size_t smem = dmma_smem(nkmax, d);
        int hg = (int)cdiv(H, 8), ntc = d / 8, cs = 1; /* column slices while the step's blocks are few */
        while ((int64_t)R * hg * cs < 264 && ntc / (2 * cs) >= D_NW && (ntc / (2 * cs)) * 2 * cs == ntc)
            cs *= 2;
        if (!allow_smem(k41_attn_dmma, smem, &dmma_set))
            return false;
        launch_k(k41_attn_dmma, dim3((unsigned)R, (unsigned)hg, (unsigned)cs), D_NW * 32, smem, stream, g, H, d,
                 (int)(cdiv(nkmax > 0 ? nkmax : 1, 8) * 8), d / cs, scale, sink, q, o);
        return launched("attn_step41 attention (REF, tensor cores)");
    }
    int G = f64_group(R, H, nkmax, d);
    size_t smem = f64_smem(G, nkmax, d);
    if (smem + (F_NW + 9) * sizeof(double) > (size_t)optin) {
        fail(DSV4_E_UNSUPPORTED, "cuda: attn_step41: %lld keys a row do not fit shared memory (%d bytes)",
             (long long)nkmax, optin);
        return false;
    }
    if (G == 8) {
        if (!allow_smem(k41_attn_f64<8>, smem, &f64_set[1]))
            return false;
        launch_k(k41_attn_f64<8>, dim3((unsigned)R, (unsigned)(H / 8)), F_NW * 32, smem, stream, g, H, d, (int)nkmax,
                 scale, sink, q, o);
    } else {
        if (!allow_smem(k41_attn_f64<1>, smem, &f64_set[0]))
            return false;
        launch_k(k41_attn_f64<1>, dim3((unsigned)R, (unsigned)H), F_NW * 32, smem, stream, g, H, d, (int)nkmax, scale,
                 sink, q, o);
    }
    return launched("attn_step41 attention (REF)");
}
