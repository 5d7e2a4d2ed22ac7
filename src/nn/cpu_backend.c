/* CPU backend: BLAS sgemm for the matmuls, OpenMP loops for the rest. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/backend.h"

#ifdef DSPARK_USE_BLAS
#include <cblas.h>
#endif
#ifdef DSPARK_USE_OPENMP
#include <omp.h>
#endif

/* C[m, n] = A[m, k] (row stride lda) @ B[n, k]^T (row stride ldb), C row stride ldc; beta 0 or 1. */
static void sgemm_nt(int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *B, int64_t ldb,
                     float beta, float *C, int64_t ldc) {
#ifdef DSPARK_USE_BLAS
  if (m == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, (blasint)n, (blasint)k, 1.0f, B, (blasint)ldb, A, 1, beta, C, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)m, (blasint)n, (blasint)k, 1.0f, A, (blasint)lda,
              B, (blasint)ldb, beta, C, (blasint)ldc);
#else
#pragma omp parallel for collapse(2) schedule(static) if (m * n * k > 65536)
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      const float *a = A + i * lda, *b = B + j * ldb;
      float s = 0.0f;
      for (int64_t p = 0; p < k; p++) s += a[p] * b[p];
      C[i * ldc + j] = (beta != 0.0f ? C[i * ldc + j] : 0.0f) + s;
    }
#endif
}

/* C[m, n] = A[m, k] (row stride lda) @ B[k, n] (row stride ldb); overwrites C (stride ldc). */
static void sgemm_nn(int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *B, int64_t ldb,
                     float *C, int64_t ldc) {
#ifdef DSPARK_USE_BLAS
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)m, (blasint)n, (blasint)k, 1.0f, A, (blasint)lda,
              B, (blasint)ldb, 0.0f, C, (blasint)ldc);
#else
  for (int64_t i = 0; i < m; i++) {
    float *c = C + i * ldc;
    for (int64_t j = 0; j < n; j++) c[j] = 0.0f;
    for (int64_t p = 0; p < k; p++) {
      float a = A[i * lda + p];
      const float *b = B + p * ldb;
      for (int64_t j = 0; j < n; j++) c[j] += a * b[j];
    }
  }
#endif
}

static void cpu_linear(float *y, const float *x, const float *w, const float *bias, int64_t n, int64_t in,
                       int64_t out) {
  float beta = 0.0f;
  if (bias) {
#pragma omp parallel for schedule(static) if (n * out > 65536)
    for (int64_t i = 0; i < n; i++) memcpy(y + i * out, bias, (size_t)out * sizeof(float));
    beta = 1.0f;
  }
  sgemm_nt(n, out, in, x, in, w, in, beta, y, out);
}

static void cpu_rmsnorm(float *y, float *rstd, const float *x, const float *w, int64_t n, int64_t d, float eps) {
#pragma omp parallel for schedule(static) if (n * d > 32768)
  for (int64_t i = 0; i < n; i++) {
    const float *xi = x + i * d;
    float *yi = y + i * d;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < d; j++) ss += xi[j] * xi[j];
    float r = 1.0f / sqrtf(ss / (float)d + eps);
    if (rstd) rstd[i] = r;
    /* HF order: normalize in fp32, then scale by the weight. */
    for (int64_t j = 0; j < d; j++) yi[j] = w[j] * (xi[j] * r);
  }
}

static void cpu_rope(float *x, int64_t stride, const int64_t *pos, const float *inv_freq, int64_t n, int64_t heads,
                     int64_t head_dim) {
  int64_t half = head_dim / 2;
#pragma omp parallel for schedule(static) if (n * heads * head_dim > 32768)
  for (int64_t t = 0; t < n; t++) {
    float cs[1024], sn[1024]; /* head_dim <= 2048 is checked at model load */
    float p = (float)pos[t];
    for (int64_t i = 0; i < half; i++) {
      /* fp32 angle, as transformers computes inv_freq @ position_ids in fp32. */
      float ang = p * inv_freq[i];
      cs[i] = cosf(ang);
      sn[i] = sinf(ang);
    }
    for (int64_t h = 0; h < heads; h++) {
      float *v = x + t * stride + h * head_dim;
      for (int64_t i = 0; i < half; i++) {
        float a = v[i], b = v[i + half];
        v[i] = a * cs[i] - b * sn[i];
        v[i + half] = b * cs[i] + a * sn[i];
      }
    }
  }
}

enum { ATTN_QCHUNK = 64 };

static void cpu_attention_causal(float *out, const float *q, int64_t q_stride, const float *k, const float *v,
                                 int64_t n, int64_t past, int64_t cap, int64_t n_heads, int64_t n_kv_heads,
                                 int64_t head_dim, float scale) {
  int64_t group = n_heads / n_kv_heads;
  int64_t n_chunks = (n + ATTN_QCHUNK - 1) / ATTN_QCHUNK;
  int64_t out_stride = n_heads * head_dim;
#pragma omp parallel
  {
    /* Scores for one (head, query chunk): [ATTN_QCHUNK, past + n]. */
    float *scores = malloc((size_t)ATTN_QCHUNK * (size_t)(past + n) * sizeof(float));
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t h = 0; h < n_heads; h++)
      for (int64_t c = 0; c < n_chunks; c++) {
        if (!scores) continue; /* allocation failed: checked after the region */
        int64_t q0 = c * ATTN_QCHUNK, qn = n - q0 < ATTN_QCHUNK ? n - q0 : ATTN_QCHUNK;
        int64_t kend = past + q0 + qn; /* keys visible to the last query of the chunk */
        const float *kh = k + (h / group) * cap * head_dim;
        const float *vh = v + (h / group) * cap * head_dim;
        sgemm_nt(qn, kend, head_dim, q + q0 * q_stride + h * head_dim, q_stride, kh, head_dim, 0.0f, scores, kend);
        for (int64_t i = 0; i < qn; i++) {
          float *s = scores + i * kend;
          int64_t visible = past + q0 + i + 1;
          float mx = -INFINITY;
          for (int64_t j = 0; j < visible; j++) {
            s[j] *= scale;
            mx = s[j] > mx ? s[j] : mx;
          }
          float sum = 0.0f;
          for (int64_t j = 0; j < visible; j++) {
            s[j] = expf(s[j] - mx);
            sum += s[j];
          }
          float inv = 1.0f / sum;
          for (int64_t j = 0; j < visible; j++) s[j] *= inv;
          for (int64_t j = visible; j < kend; j++) s[j] = 0.0f;
        }
        sgemm_nn(qn, head_dim, kend, scores, kend, vh, head_dim, out + q0 * out_stride + h * head_dim, out_stride);
      }
    free(scores);
  }
}

static void cpu_swiglu(float *out, const float *gu, int64_t n, int64_t inter) {
#pragma omp parallel for schedule(static) if (n * inter > 32768)
  for (int64_t i = 0; i < n; i++) {
    const float *g = gu + i * 2 * inter, *u = g + inter;
    float *o = out + i * inter;
    for (int64_t j = 0; j < inter; j++) o[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
  }
}

static void cpu_add(float *y, const float *x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

static const ds_backend k_cpu = {
    .name = "cpu",
    .linear = cpu_linear,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .attention_causal = cpu_attention_causal,
    .swiglu = cpu_swiglu,
    .add = cpu_add,
};

const ds_backend *ds_backend_cpu(void) { return &k_cpu; }

#ifdef DSPARK_USE_BLAS
/* OpenBLAS extensions (declared in its cblas.h on Debian, repeated for other BLAS builds). */
void openblas_set_num_threads(int num_threads);
char *openblas_get_corename(void);
#endif

void ds_set_num_threads(int n) {
  if (n <= 0) return;
#ifdef DSPARK_USE_OPENMP
  omp_set_num_threads(n);
#endif
#ifdef DSPARK_USE_BLAS
  openblas_set_num_threads(n);
#endif
}

int ds_get_num_threads(void) {
#ifdef DSPARK_USE_OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

const char *ds_blas_kernel_name(void) {
#ifdef DSPARK_USE_BLAS
  return openblas_get_corename();
#else
  return "none";
#endif
}
