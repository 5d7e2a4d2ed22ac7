/* The CUDA backend's device context: first-use initialisation (device check, cuBLAS handle),
 * the bf16 GEMM setting, grow-only scratch buffers, host-index uploads, and the fatal-error
 * path every checked call goes through. One context per process, used from one host thread. */
#include <stdio.h>

#include "nn/cuda/cuda_internal.h"

namespace {
struct cuda_context {
  int ready;
  cublasHandle_t blas;
  int bf16_gemm;
  void *slot[DS_CUDA_SLOT_COUNT];
  size_t slot_bytes[DS_CUDA_SLOT_COUNT];
};
cuda_context g_ctx;
}  // namespace

void ds_cuda_fail(const char *file, int line, const char *call, const char *reason) {
  char msg[480];
  snprintf(msg, sizeof msg, "CUDA backend: %s failed: %s", call, reason ? reason : "(no reason given)");
  ds_check_failed(file, line, msg);
}

/* Finds a device and creates the cuBLAS handle; a machine without a usable device is an
 * ordinary error (recorded, 0 returned), not an abort. */
int ds_cuda_init(void) {
  if (g_ctx.ready) return 1;
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    DS_FAIL(DS_ERR_UNSUPPORTED, "CUDA backend: cudaGetDeviceCount failed: %s (no driver or no device?)",
            cudaGetErrorString(e));
    return 0;
  }
  if (count < 1) {
    DS_FAIL(DS_ERR_UNSUPPORTED, "CUDA backend: no CUDA device is visible");
    return 0;
  }
  e = cudaSetDevice(0);
  if (e != cudaSuccess) {
    DS_FAIL(DS_ERR_UNSUPPORTED, "CUDA backend: cudaSetDevice(0) failed: %s", cudaGetErrorString(e));
    return 0;
  }
  cublasStatus_t s = cublasCreate(&g_ctx.blas);
  if (s != CUBLAS_STATUS_SUCCESS) {
    DS_FAIL(DS_ERR_UNSUPPORTED, "CUDA backend: cublasCreate failed: %s", cublasGetStatusString(s));
    return 0;
  }
  DS_CUBLAS(cublasSetStream(g_ctx.blas, DS_CUDA_STREAM));
  /* fp32 GEMMs stay fp32: no TF32 tensor-core shortcut (the bf16 mode is asked for explicitly). */
  DS_CUBLAS(cublasSetMathMode(g_ctx.blas, CUBLAS_DEFAULT_MATH));
  g_ctx.ready = 1;
  return 1;
}

cublasHandle_t ds_cuda_blas(void) { return g_ctx.blas; }

int ds_cuda_bf16_gemm(void) { return g_ctx.bf16_gemm; }

int ds_cuda_set_bf16_gemm(int on) {
  int old = g_ctx.bf16_gemm;
  g_ctx.bf16_gemm = on ? 1 : 0;
  return old;
}

/* Grows a slot to at least nbytes. The old buffer may still be read by a queued kernel, so
 * the device is drained before it is freed (growth is rare: sizes settle after a step). */
void *ds_cuda_scratch(int slot, size_t nbytes) {
  DS_CHECK(slot >= 0 && slot < DS_CUDA_SLOT_COUNT);
  if (nbytes > g_ctx.slot_bytes[slot] || !g_ctx.slot[slot]) {
    size_t grown = nbytes + nbytes / 4 + 256;
    if (g_ctx.slot[slot]) {
      DS_CUDA(cudaDeviceSynchronize());
      DS_CUDA(cudaFree(g_ctx.slot[slot]));
      g_ctx.slot[slot] = NULL;
    }
    DS_CUDA(cudaMalloc(&g_ctx.slot[slot], grown));
    g_ctx.slot_bytes[slot] = grown;
  }
  return g_ctx.slot[slot];
}

/* In stream order: the copy waits for the kernels queued before it (which may still read this
 * slot's previous contents) and the host buffer is free to reuse on return. */
void *ds_cuda_upload(int slot, const void *host, size_t nbytes) {
  void *dev = ds_cuda_scratch(slot, nbytes);
  if (nbytes) DS_CUDA(cudaMemcpyAsync(dev, host, nbytes, cudaMemcpyHostToDevice, DS_CUDA_STREAM));
  return dev;
}

void *ds_cuda_host_array(size_t count, size_t size, const char *what) {
  void *p = ds_malloc((count ? count : 1) * size, what);
  if (!p) ds_cuda_fail(__FILE__, __LINE__, "host allocation", ds_last_error());
  return p;
}
