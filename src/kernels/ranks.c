/* The several-GPU calls of kernels/ranks.h over the CUDA backend's communicator (comm.cu). */
#include "kernels/ranks.h"
#ifdef DSV4_CUDA
#include "kernels/cuda/cuda.h"
#endif

#ifdef DSV4_CUDA
_Static_assert(DSV4_RANKS_ID_BYTES == DSV4_CUDA_COMM_ID_BYTES, "communicator id size");

int dsv4_ranks_gpus(void)
{
    dsv4_err err = {0};
    return dsv4_cuda_gpu_count(&err);
}

int dsv4_ranks_prepare(int world, int rank, int dev, dsv4_err *err)
{
    if (!dsv4_cuda_comm_built())
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "several GPUs need NCCL: this build has none (make CUDA=1 NCCL=1)");
    if (dsv4_cuda_select(dev, err) || dsv4_cuda_set_experts_rank(rank, world, err))
        return err->code;
    return dsv4_cuda_init(err);
}

int dsv4_ranks_id(void *id, dsv4_err *err) { return dsv4_cuda_comm_id(id, err); }
int dsv4_ranks_join(int world, int rank, const void *id, dsv4_err *err) { return dsv4_cuda_comm_init(world, rank, id, err); }
int dsv4_ranks_allgather(const void *in, size_t bytes, void *out, dsv4_err *err)
{
    return dsv4_cuda_allgather(in, bytes, out, err);
}
#else
static int no_cuda(dsv4_err *err)
{
    return dsv4_fail(err, DSV4_E_DEVICE, "several GPUs need the CUDA backend: this build has none (make CUDA=1)");
}
int dsv4_ranks_gpus(void) { return 0; }
int dsv4_ranks_prepare(int world, int rank, int dev, dsv4_err *err)
{
    (void)world, (void)rank, (void)dev;
    return no_cuda(err);
}
int dsv4_ranks_id(void *id, dsv4_err *err)
{
    (void)id;
    return no_cuda(err);
}
int dsv4_ranks_join(int world, int rank, const void *id, dsv4_err *err)
{
    (void)world, (void)rank, (void)id;
    return no_cuda(err);
}
int dsv4_ranks_allgather(const void *in, size_t bytes, void *out, dsv4_err *err)
{
    (void)in, (void)bytes, (void)out;
    return no_cuda(err);
}
#endif
