/* ds_backend_cuda in a build without CUDA (DSPARK_CUDA=OFF, the default): there is no device
 * backend, so asking for it fails with the reason, and callers fall back or refuse clearly.
 * With DSPARK_CUDA=ON this file is left out and src/nn/cuda/ defines both functions. */
#include "dspark/backend.h"
#include "dspark/common.h"

const ds_backend *ds_backend_cuda(void) {
  DS_FAIL(DS_ERR_UNSUPPORTED, "this build has no CUDA backend (configure with -DDSPARK_CUDA=ON and the CUDA toolkit)");
  return NULL;
}

/* No GEMM to configure: the setting is always fp32 here. */
int ds_cuda_set_bf16_gemm(int on) {
  (void)on;
  return 0;
}
