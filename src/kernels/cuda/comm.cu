/* Several GPUs, one process each (docs/multigpu.md): the device this process uses, its NCCL
 * communicator, the routed experts it owns, and the one collective the forward needs, the
 * all-reduce of an experts op's pair outputs. Without NCCL in the build (DSV4_NCCL unset) the
 * world is one process and every call that needs a communicator says so. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>
#ifdef DSV4_NCCL
#include <nccl.h>
#endif
#include "kernels/cuda/internal.h"

using namespace dsv4cu;

int dsv4cu::ordinal;            /* the device dsv4_cuda_init selects */
int dsv4cu::ep_rank, dsv4cu::ep_world = 1;
static dsv4_cuda_pairs_hook g_hook;
static void *g_hook_ctx;
#ifdef DSV4_NCCL
static ncclComm_t g_comm;
static bool comm_live(void) { return g_comm != NULL; }
#else
static bool comm_live(void) { return false; }
#endif

extern "C" int dsv4_cuda_select(int dev, dsv4_err *err)
{
    if (dev < 0)
        return dsv4_fail(err, DSV4_E_ARG, "device 'cuda': device number %d is negative", dev);
    ordinal = dev;
    return 0;
}

extern "C" int dsv4_cuda_gpu_count(dsv4_err *err)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        dsv4_fail(err, DSV4_E_DEVICE, "device 'cuda': %s", cudaGetErrorString(e));
        return 0;
    }
    return n;
}

extern "C" int dsv4_cuda_comm_built(void)
{
#ifdef DSV4_NCCL
    return 1;
#else
    return 0;
#endif
}

extern "C" int dsv4_cuda_set_experts_rank(int rank, int world, dsv4_err *err)
{
    if (world < 1 || rank < 0 || rank >= world)
        return dsv4_fail(err, DSV4_E_ARG, "experts rank %d of %d: expected 0 <= rank < world", rank, world);
    pthread_mutex_lock(&dsv4cu::lock);
    if (rank != ep_rank || world != ep_world)
        drops++; /* the cached expert tables name this rank's experts only */
    ep_rank = rank;
    ep_world = world;
    pthread_mutex_unlock(&dsv4cu::lock);
    return 0;
}

extern "C" int dsv4_cuda_expert_owned(int64_t slot) { return slot < 0 || slot % ep_world == ep_rank; }

extern "C" void dsv4_cuda_experts_rank(int *rank, int *world)
{
    *rank = ep_rank;
    *world = ep_world;
}

extern "C" void dsv4_cuda_set_pairs_hook(dsv4_cuda_pairs_hook fn, void *ctx)
{
    g_hook = fn;
    g_hook_ctx = ctx;
}

#ifdef DSV4_NCCL
static int nccl_fail(dsv4_err *err, ncclResult_t r, const char *what)
{
    const char *last = ncclGetLastError(g_comm);
    return dsv4_fail(err, DSV4_E_DEVICE, "nccl: %s: %s%s%s", what, ncclGetErrorString(r), last && *last ? ": " : "",
                     last ? last : "");
}
#endif

extern "C" int dsv4_cuda_comm_id(void *id, dsv4_err *err)
{
#ifdef DSV4_NCCL
    static_assert(sizeof(ncclUniqueId) == DSV4_CUDA_COMM_ID_BYTES, "ncclUniqueId size");
    ncclResult_t r = ncclGetUniqueId((ncclUniqueId *)id);
    return r == ncclSuccess ? 0 : nccl_fail(err, r, "making the communicator's id");
#else
    (void)id;
    return dsv4_fail(err, DSV4_E_UNSUPPORTED, "several GPUs need NCCL: this build has none (make CUDA=1 NCCL=1)");
#endif
}

extern "C" int dsv4_cuda_comm_init(int world, int rank, const void *id, dsv4_err *err)
{
#ifdef DSV4_NCCL
    if (dsv4_cuda_init(err))
        return err->code;
    if (g_comm)
        return dsv4_fail(err, DSV4_E_ARG, "nccl: this process already has a communicator");
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    pthread_mutex_lock(&dsv4cu::lock);
    ncclResult_t r = ncclCommInitRank(&g_comm, world, u, rank);
    pthread_mutex_unlock(&dsv4cu::lock);
    if (r != ncclSuccess) {
        g_comm = NULL;
        return nccl_fail(err, r, "joining the communicator");
    }
    return 0;
#else
    (void)world, (void)rank, (void)id;
    return dsv4_fail(err, DSV4_E_UNSUPPORTED, "several GPUs need NCCL: this build has none (make CUDA=1 NCCL=1)");
#endif
}

extern "C" int dsv4_cuda_allgather(const void *in, size_t bytes, void *out, dsv4_err *err)
{
#ifdef DSV4_NCCL
    if (!g_comm)
        return dsv4_fail(err, DSV4_E_ARG, "nccl: no communicator");
    int world = 0;
    ncclCommCount(g_comm, &world);
    pthread_mutex_lock(&dsv4cu::lock);
    char *d = NULL;
    int rc = 0;
    cudaError_t e = cudaMalloc((void **)&d, bytes * (world + 1));
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(d, in, bytes, cudaMemcpyHostToDevice, stream);
    if (e != cudaSuccess)
        rc = dsv4_fail(err, DSV4_E_DEVICE, "nccl: all-gather buffers: %s", cudaGetErrorString(e));
    else {
        ncclResult_t r = ncclAllGather(d, d + bytes, bytes, ncclChar, g_comm, stream);
        if (r != ncclSuccess)
            rc = nccl_fail(err, r, "all-gather");
        else if ((e = cudaMemcpyAsync(out, d + bytes, bytes * world, cudaMemcpyDeviceToHost, stream)) != cudaSuccess ||
                 (e = cudaStreamSynchronize(stream)) != cudaSuccess)
            rc = dsv4_fail(err, DSV4_E_DEVICE, "nccl: all-gather: %s", cudaGetErrorString(e));
    }
    cudaFree(d);
    pthread_mutex_unlock(&dsv4cu::lock);
    return rc;
#else
    (void)in, (void)bytes, (void)out;
    return dsv4_fail(err, DSV4_E_UNSUPPORTED, "several GPUs need NCCL: this build has none (make CUDA=1 NCCL=1)");
#endif
}

extern "C" void dsv4_cuda_comm_free(void)
{
#ifdef DSV4_NCCL
    if (g_comm) {
        pthread_mutex_lock(&dsv4cu::lock);
        cudaStreamSynchronize(stream);
        ncclCommDestroy(g_comm);
        g_comm = NULL;
        pthread_mutex_unlock(&dsv4cu::lock);
    }
#endif
}

/* Each pair's output comes from the one rank that owns its expert; the others hold -0 there,
 * and -0 is the identity of IEEE addition for every value (+0 + -0 = +0), so the sum over
 * ranks, in whatever order NCCL adds, is that rank's value bit for bit. */
void dsv4cu::ep_reduce(float *Y, size_t n)
{
    if (g_hook) {
        g_hook(Y, n, g_hook_ctx);
        return;
    }
    if (ep_world == 1 && !comm_live())
        return;
#ifdef DSV4_NCCL
    if (!g_comm) {
        fail(DSV4_E_ARG, "experts: rank %d of %d has no communicator (dsv4_cuda_comm_init)", ep_rank, ep_world);
        return;
    }
    ncclResult_t r = ncclAllReduce(Y, Y, n, ncclFloat32, ncclSum, g_comm, stream);
    if (r != ncclSuccess) {
        const char *last = ncclGetLastError(g_comm);
        fail(DSV4_E_DEVICE, "nccl: experts all-reduce: %s%s%s", ncclGetErrorString(r), last && *last ? ": " : "",
             last ? last : "");
    }
#else
    fail(DSV4_E_UNSUPPORTED, "experts: rank %d of %d in a build without NCCL", ep_rank, ep_world);
#endif
}

__global__ void k_fill_neg0(float *y, int64_t n)
{
    PDL_WAIT();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = -0.0f;
}

void dsv4cu::ep_clear(float *Y, int64_t n)
{
    if (ep_world > 1 || g_hook || comm_live())
        launch_k(k_fill_neg0, (unsigned)cdiv(n, 256), 256, 0, stream, Y, n);
}
