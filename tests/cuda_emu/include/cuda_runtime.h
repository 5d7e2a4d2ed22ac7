/* CPU emulation of the CUDA execution model (described in tests/cuda_emu/emu_runtime.cpp): the
 * subset of the CUDA runtime the backend in src/nn/cuda/ uses, so its kernels can be run and
 * checked on a machine without a GPU. Not for production: one block at a time, its threads as
 * cooperative user-level threads on one core. */
#ifndef DSPARK_CUDA_EMU_RUNTIME_H
#define DSPARK_CUDA_EMU_RUNTIME_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
extern dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __shared__ static /* blocks run one after another: one copy serves the running block */

typedef int cudaError_t;
#define cudaSuccess 0
typedef void *cudaStream_t;
enum cudaMemcpyKind { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };

const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaMalloc(void **p, size_t n);
template <class T> cudaError_t cudaMalloc(T **p, size_t n) { return cudaMalloc((void **)p, n); }
cudaError_t cudaFree(void *p);
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind k);
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind k, cudaStream_t st);
cudaError_t cudaMemcpy2DAsync(void *d, size_t dpitch, const void *s, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind k, cudaStream_t st);
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t st);
cudaError_t cudaDeviceSynchronize(void);

/* Device intrinsics the kernels use. */
void __syncthreads(void);
float __shfl_xor_sync(unsigned mask, float v, int lane_xor);
static inline float __uint_as_float(unsigned u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* The launch the preprocessing (emu_prepare.py) writes for kernel<<<grid, block, smem, stream>>>(args). */
void emu_launch(dim3 grid, dim3 block, size_t smem, const std::function<void()> &body);
float *emu_dynamic_smem(void);

#endif
