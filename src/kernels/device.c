/* Device names to backends: the one file that knows which backends this build has. */
#include <string.h>
#include "core/core.h"
#include "kernels/backend.h"
#ifdef DSV4_CUDA
#include "kernels/cuda/cuda.h"
#endif

const dsv4_backend *dsv4_backend_named(const char *device, dsv4_err *err)
{
    if (!device || !strcmp(device, "cpu"))
        return dsv4_backend_cpu();
    if (strcmp(device, "cuda")) {
        dsv4_fail(err, DSV4_E_DEVICE, "device '%s' is unknown (devices: cpu, cuda)", device);
        return NULL;
    }
#ifdef DSV4_CUDA
    return dsv4_cuda_init(err) ? NULL : dsv4_backend_cuda();
#else
    dsv4_fail(err, DSV4_E_DEVICE, "device 'cuda' is not available in this build (built without CUDA=1; it has: cpu)");
    return NULL;
#endif
}
