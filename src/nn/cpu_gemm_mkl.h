/* Internal to the CPU backend: MKL's bf16 GEMM (cblas_gemm_bf16bf16f32 on a packed B) for the
 * large frozen weights of a bf16-compute forward (cpu_gemm_mkl.c). MKL is loaded at run time
 * from the libmkl_rt the build found (CMake DSPARK_MKL_RT; scripts/setup.sh installs PyPI's
 * `mkl` into the venv) or from $DSPARK_MKL (a path, or "none"); without it every product stays
 * on oneDNN. Why: over a Qwen3-1.7B's layers, whose weights stream from memory, MKL's kernels
 * ran 1.42x oneDNN 2.6's; over a 100M model's, which stay in cache, oneDNN ran 1.2x MKL's
 * (bench/gemm_bf16_libs.sh --layers; docs/performance.md, "GEMM kernels"). Not a public header. */
#ifndef DSPARK_NN_CPU_GEMM_MKL_H
#define DSPARK_NN_CPU_GEMM_MKL_H

#include <stddef.h>
#include <stdint.h>

/* 1 when MKL is loaded (the first call, from any thread, tries once). */
int ds_mkl_bf16_available(void);
/* "MKL <version>" or why it is not used. */
const char *ds_mkl_bf16_status(void);
/* Frozen weights of at least this many elements go to MKL (default 4 Mi, 8 MiB in bf16: a
 * Qwen3-1.7B's smallest, none of a 100M model's; $DSPARK_MKL_BF16_MIN overrides, the tests
 * use 1). */
int64_t ds_mkl_bf16_min_elems(void);
/* Bytes of the packed copy of B = W^T for W[n, k] (bf16, row-major). */
size_t ds_mkl_bf16_pack_size(int64_t m, int64_t n, int64_t k);
/* dst <- the packed W^T (dst holds ds_mkl_bf16_pack_size bytes). */
void ds_mkl_bf16_pack(void *dst, const uint16_t *w, int64_t m, int64_t n, int64_t k);
/* C[m, n] (row stride ldc) = A[m, k] (bf16, row stride lda) @ W^T (packed) + beta * C, fp32
 * accumulation; beta 0 or 1. */
void ds_mkl_bf16_gemm(int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t lda, const void *packed, float beta,
                      float *C, int64_t ldc);

/* MKL's fp32 GEMM, which the fp32 GEMM (ds_cpu_sgemm) takes for products of at least
 * DS_MKL_SGEMM_MIN multiply-adds: on the models' shapes it ran 278-311 GFLOP/s against 239-276 for
 * oneDNN 2.6's dnnl_sgemm (Intel Xeon model 207, 2 threads; a probe of the same shapes).
 * _available is ds_mkl_bf16_available (the same library and rules). Shapes and flags as
 * ds_cpu_sgemm. */
enum { DS_MKL_SGEMM_MIN = 1 << 22 };
/* ... and of at least this many rows of C: below it MKL packs B on every call (a verification
 * pass of 3-15 tokens through SmolLM2-135M cost 2.2-3x one token with it, 1.4-2.6x with oneDNN;
 * AMD EPYC Zen 4, 2 threads, `dspark profile`), where oneDNN reads B in place. */
enum { DS_MKL_SGEMM_MIN_ROWS = 16 };
int ds_mkl_sgemm_available(void);
void ds_mkl_sgemm(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *B,
                  int64_t ldb, float beta, float *C, int64_t ldc);
/* ... and on a packed B = W^T for W[n, k] (fp32, row-major), as the bf16 pair above: the sgemm
 * route's frozen F32 weights (nn/cpu_gemm_bf16.h). A copy packed for one m serves any m. Packed,
 * the draft step's lm_head forward (128 x 32000 x 512) ran 256 GFLOP/s against 197 unpacked. */
size_t ds_mkl_sgemm_pack_size(int64_t m, int64_t n, int64_t k);
void ds_mkl_sgemm_pack(float *dst, const float *w, int64_t m, int64_t n, int64_t k);
void ds_mkl_sgemm_packed(int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *packed, float beta,
                         float *C, int64_t ldc);

#endif
