/* The CPU backend's matmul (every linear and attention product goes through ds_cpu_sgemm)
 * and its thread count: BLAS when built with it, plain loops otherwise. */
#include <string.h>

#include "dspark/backend.h"
#include "nn/cpu_kernels.h"

#ifdef DSPARK_USE_BLAS
#include <cblas.h>
#endif
#ifdef DSPARK_USE_OPENMP
#include <omp.h>
#endif

/* C[m, n] = op(A)[m, k] @ op(B)[k, n] + beta * C (contract in cpu_kernels.h). */
void ds_cpu_sgemm(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *B,
                  int64_t ldb, float beta, float *C, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    if (beta == 0.0f)
      for (int64_t i = 0; i < m; i++) memset(C + i * ldc, 0, (size_t)n * sizeof(float));
    return;
  }
#ifdef DSPARK_USE_BLAS
  if (m == 1 && !ta && tb) { /* one row: GEMV is faster than a 1-row GEMM */
    cblas_sgemv(CblasRowMajor, CblasNoTrans, (blasint)n, (blasint)k, 1.0f, B, (blasint)ldb, A, 1, beta, C, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (blasint)m,
              (blasint)n, (blasint)k, 1.0f, A, (blasint)lda, B, (blasint)ldb, beta, C, (blasint)ldc);
#else
  DS_OMP(parallel for schedule(static) if (m * n * k > 65536))
  for (int64_t i = 0; i < m; i++) {
    float *c = C + i * ldc;
    if (tb) { /* dot products with the rows of B */
      for (int64_t j = 0; j < n; j++) {
        const float *b = B + j * ldb;
        float s = 0.0f;
        for (int64_t p = 0; p < k; p++) s += (ta ? A[p * lda + i] : A[i * lda + p]) * b[p];
        c[j] = (beta != 0.0f ? c[j] : 0.0f) + s;
      }
    } else { /* row i of C accumulates rows of B */
      if (beta == 0.0f) memset(c, 0, (size_t)n * sizeof(float));
      for (int64_t p = 0; p < k; p++) {
        float a = ta ? A[p * lda + i] : A[i * lda + p];
        const float *b = B + p * ldb;
        for (int64_t j = 0; j < n; j++) c[j] += a * b[j];
      }
    }
  }
#endif
}

int ds_cpu_threads(void) {
#ifdef DSPARK_USE_OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

void ds_set_num_threads(int n) {
  if (n <= 0) return;
#ifdef DSPARK_USE_OPENMP
  omp_set_num_threads(n);
#endif
#ifdef DSPARK_USE_BLAS
  openblas_set_num_threads(n);
#endif
}

int ds_get_num_threads(void) { return ds_cpu_threads(); }

const char *ds_blas_kernel_name(void) {
#ifdef DSPARK_USE_BLAS
  return openblas_get_corename();
#else
  return "none";
#endif
}

void ds_gemm_f32(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *B,
                 int64_t ldb, float beta, float *C, int64_t ldc) {
  ds_cpu_sgemm(ta, tb, m, n, k, A, lda, B, ldb, beta, C, ldc);
}

const char *ds_gemm_name(void) { return ds_blas_kernel_name(); }
