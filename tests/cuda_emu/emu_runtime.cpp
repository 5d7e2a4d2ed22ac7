/* A CPU emulation of the CUDA execution model, enough to run the kernels of src/nn/cuda/ on a
 * machine without a GPU (the cuda_kernel_check_emu program, ctest unit.cuda_emu_kernel_check;
 * CMakeLists.txt builds it from emu_prepare.py's rewrite of each .cu file): device memory is host memory, a launch
 * runs its blocks one after another, and a block's threads are cooperative user-level threads
 * on one core (each on its own stack; started with makecontext, switched with _setjmp /
 * _longjmp). A thread runs until it reaches __syncthreads or a warp shuffle; the scheduler
 * then releases a warp once all 32 of its lanes wait at a shuffle, and the block once all its
 * live threads wait at __syncthreads. A shuffle that not all lanes of a warp reach, or a
 * barrier that can never be released, is reported as the bug it would be on a GPU. cuBLAS's
 * cublasGemmEx and cublasGemmStridedBatchedEx are computed from their documented column-major
 * definitions, in double.
 * It checks the kernels' logic (indexing, tiling, masking, reductions), not their speed or
 * the device's rounding details. */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>

#include <vector>

#include "cublas_v2.h"
#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "dspark/dtype.h"

dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace {

enum { READY, AT_SYNC, AT_WARP, DONE };
constexpr size_t kStack = 256 * 1024;

struct emu_thread {
  jmp_buf jb;
  ucontext_t uc;
  char *stack;
  int state;
  bool started;
};

std::vector<emu_thread> g_th;
jmp_buf g_sched;
ucontext_t g_sched_uc;
int g_cur;
const std::function<void()> *g_body;
std::vector<float> g_smem;
float g_shfl[32][32]; /* [warp][lane] exchange slots */

/* The running thread stops here until the scheduler resumes it. */
void block_on(int state) {
  g_th[g_cur].state = state;
  if (!_setjmp(g_th[g_cur].jb)) _longjmp(g_sched, 1);
}

void thread_entry() {
  (*g_body)();
  g_th[g_cur].state = DONE;
  _longjmp(g_sched, 1);
}

[[noreturn]] void emu_fail(const char *what) {
  fprintf(stderr, "cuda-emu: %s in block (%u, %u); thread states:", what, blockIdx.x, blockIdx.y);
  for (size_t i = 0; i < g_th.size() && i < blockDim.x; i++) fprintf(stderr, " %d", g_th[i].state);
  fprintf(stderr, "\n");
  abort();
}

void run_block() {
  unsigned n = blockDim.x;
  if (n > 1024 || n % 32) emu_fail("block size not a multiple of 32 up to 1024");
  if (g_th.size() < n) {
    size_t old = g_th.size();
    g_th.resize(n);
    for (size_t i = old; i < n; i++) g_th[i].stack = (char *)malloc(kStack);
  }
  for (unsigned i = 0; i < n; i++) {
    g_th[i].state = READY;
    g_th[i].started = false;
  }
  for (;;) {
    for (unsigned i = 0; i < n; i++) {
      if (g_th[i].state != READY) continue;
      g_cur = (int)i;
      threadIdx = dim3(i);
      if (!_setjmp(g_sched)) {
        if (!g_th[i].started) {
          g_th[i].started = true;
          getcontext(&g_th[i].uc);
          g_th[i].uc.uc_stack.ss_sp = g_th[i].stack;
          g_th[i].uc.uc_stack.ss_size = kStack;
          g_th[i].uc.uc_link = NULL;
          makecontext(&g_th[i].uc, thread_entry, 0);
          swapcontext(&g_sched_uc, &g_th[i].uc);
        } else {
          _longjmp(g_th[i].jb, 1);
        }
      }
    }
    /* every thread now waits or is done: release what can be released */
    unsigned done = 0, at_sync = 0;
    bool released = false;
    for (unsigned w = 0; w < n / 32; w++) {
      unsigned at_warp = 0;
      for (unsigned l = 0; l < 32; l++) at_warp += g_th[w * 32 + l].state == AT_WARP;
      if (at_warp == 32) {
        for (unsigned l = 0; l < 32; l++) g_th[w * 32 + l].state = READY;
        released = true;
      } else if (at_warp) {
        emu_fail("a warp shuffle that not every lane of the warp reaches");
      }
    }
    for (unsigned i = 0; i < n; i++) {
      done += g_th[i].state == DONE;
      at_sync += g_th[i].state == AT_SYNC;
    }
    if (done == n) return;
    if (released) continue;
    if (at_sync + done == n) {
      for (unsigned i = 0; i < n; i++)
        if (g_th[i].state == AT_SYNC) g_th[i].state = READY;
      continue;
    }
    emu_fail("deadlock");
  }
}

}  // namespace

void __syncthreads(void) { block_on(AT_SYNC); }

float __shfl_xor_sync(unsigned mask, float v, int lane_xor) {
  unsigned t = threadIdx.x, w = t / 32, lane = t % 32;
  if (mask != 0xffffffffu) emu_fail("partial shuffle mask");
  g_shfl[w][lane] = v;
  block_on(AT_WARP); /* every lane has written */
  float r = g_shfl[w][lane ^ (unsigned)lane_xor];
  block_on(AT_WARP); /* every lane has read before the slots are reused */
  return r;
}

void emu_launch(dim3 grid, dim3 block, size_t smem, const std::function<void()> &body) {
  if (grid.x == 0 || grid.y == 0 || block.x == 0) {
    fprintf(stderr, "cuda-emu: empty launch configuration\n");
    abort();
  }
  if (smem > 48 * 1024) {
    fprintf(stderr, "cuda-emu: %zu bytes of dynamic shared memory (over 48 KiB without opt-in)\n", smem);
    abort();
  }
  gridDim = grid;
  blockDim = block;
  g_smem.assign(smem / sizeof(float) + 1, NAN); /* uninitialised shared memory reads show as NaN */
  g_body = &body;
  for (unsigned y = 0; y < grid.y; y++)
    for (unsigned x = 0; x < grid.x; x++) {
      blockIdx = dim3(x, y);
      run_block();
    }
}

float *emu_dynamic_smem(void) { return g_smem.data(); }

/* ---- runtime API: device memory is host memory */
const char *cudaGetErrorString(cudaError_t e) { return e ? "emulated error" : "no error"; }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaGetDeviceCount(int *n) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : 1; }
cudaError_t cudaMalloc(void **p, size_t n) {
  *p = aligned_alloc(256, (n + 255) / 256 * 256);
  if (*p) memset(*p, 0xff, n); /* garbage (NaN floats) until written, as on a device */
  return *p ? cudaSuccess : 2;
}
cudaError_t cudaFree(void *p) {
  free(p);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind) {
  memmove(d, s, n);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind k, cudaStream_t) {
  return cudaMemcpy(d, s, n, k);
}
cudaError_t cudaMemcpy2DAsync(void *d, size_t dpitch, const void *s, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind, cudaStream_t) {
  for (size_t r = 0; r < height; r++) memcpy((char *)d + r * dpitch, (const char *)s + r * spitch, width);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t) {
  memset(p, v, n);
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

float __half2float(__half h) { return ds_f16_to_f32(h.x); }
__nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{ds_f32_to_bf16(f)}; }

/* ---- cuBLAS */
struct emu_cublas {
  int unused;
};
cublasStatus_t cublasCreate(cublasHandle_t *h) {
  *h = new emu_cublas();
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
const char *cublasGetStatusString(cublasStatus_t s) { return s ? "emulated cuBLAS error" : "success"; }

static double elem(const void *p, cudaDataType_t t, long idx) {
  if (t == CUDA_R_32F) return ((const float *)p)[idx];
  return ds_bf16_to_f32(((const unsigned short *)p)[idx]);
}

/* Column-major: op(A) is m x k, op(B) k x n, C m x n with leading dimensions lda, ldb, ldc. */
cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType_t at, int lda, const void *B,
                            cudaDataType_t bt, int ldb, const void *beta, void *C, cudaDataType_t ct, int ldc,
                            cublasComputeType_t, cublasGemmAlgo_t) {
  if (ct != CUDA_R_32F) return 7;
  if (lda < (ta == CUBLAS_OP_N ? m : k) || ldb < (tb == CUBLAS_OP_N ? k : n) || ldc < m) return 7; /* as cuBLAS */
  float a = *(const float *)alpha, b = *(const float *)beta;
  float *c = (float *)C;
  for (int j = 0; j < n; j++)
    for (int i = 0; i < m; i++) {
      double s = 0;
      for (int l = 0; l < k; l++) {
        double x = ta == CUBLAS_OP_N ? elem(A, at, i + (long)l * lda) : elem(A, at, l + (long)i * lda);
        double y = tb == CUBLAS_OP_N ? elem(B, bt, l + (long)j * ldb) : elem(B, bt, j + (long)l * ldb);
        s += x * y;
      }
      float old = b != 0.0f ? c[i + (long)j * ldc] : 0.0f; /* beta 0: C is not read */
      c[i + (long)j * ldc] = (float)(a * s + b * old);
    }
  return CUBLAS_STATUS_SUCCESS;
}

/* Column-major, for i < batchCount: C_i = alpha op(A_i) op(B_i) + beta C_i with A_i = A + i *
 * strideA elements of A's type (B_i, C_i likewise): each a cublasGemmEx. */
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void *alpha, const void *A, cudaDataType_t at, int lda,
                                          long long strideA, const void *B, cudaDataType_t bt, int ldb,
                                          long long strideB, const void *beta, void *C, cudaDataType_t ct, int ldc,
                                          long long strideC, int batchCount, cublasComputeType_t ctype,
                                          cublasGemmAlgo_t algo) {
  if (batchCount < 0 || ct != CUDA_R_32F) return 7;
  size_t ae = at == CUDA_R_32F ? 4 : 2, be = bt == CUDA_R_32F ? 4 : 2;
  for (int i = 0; i < batchCount; i++) {
    cublasStatus_t s = cublasGemmEx(h, ta, tb, m, n, k, alpha, (const char *)A + (size_t)(i * strideA) * ae, at, lda,
                                    (const char *)B + (size_t)(i * strideB) * be, bt, ldb, beta,
                                    (float *)C + i * strideC, ct, ldc, ctype, algo);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
  }
  return CUBLAS_STATUS_SUCCESS;
}
