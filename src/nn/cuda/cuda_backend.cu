/* The CUDA backend's table: device memory entries, the GEMM entries through cuBLAS, and the
 * other kernels from the sibling files (cuda_norm_rope.cu, cuda_embedding.cu,
 * cuda_attention.cu, cuda_block_attention.cu). Contracts in include/dspark/backend.h.
 *
 * Row-major on cuBLAS's column-major: a row-major C[m, n] is the column-major C^T[n, m], and
 * C^T = op(B)^T op(A)^T, so each GEMM calls cuBLAS with the operands swapped (B first, then A)
 * and the sizes n, m, k; a row-major operand not transposed is, read column-major, already
 * the transpose the swapped product needs (CUBLAS_OP_N), a transposed one takes CUBLAS_OP_T. */
#include <limits.h>

#include "nn/cuda/cuda_internal.h"
#include "nn/linear_cat.h"

/* ---------------------------------------------------------------- memory */

static void *cuda_alloc(size_t nbytes, const char *what) {
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, nbytes ? nbytes : 1);
  if (e != cudaSuccess) {
    (void)cudaGetLastError(); /* an out-of-memory error is not sticky: clear it for the caller */
    DS_FAIL(DS_ERR_NOMEM, "cudaMalloc of %zu bytes for %s failed: %s", nbytes, what, cudaGetErrorString(e));
    return NULL;
  }
  return p;
}

static void cuda_free(void *p) {
  if (p) DS_CUDA(cudaFree(p));
}

static void cuda_copy_to_device(void *dst, const void *src_host, size_t nbytes) {
  if (nbytes) DS_CUDA(cudaMemcpy(dst, src_host, nbytes, cudaMemcpyHostToDevice));
}

static void cuda_copy_to_host(void *dst_host, const void *src, size_t nbytes) {
  if (nbytes) DS_CUDA(cudaMemcpy(dst_host, src, nbytes, cudaMemcpyDeviceToHost));
}

static void cuda_copy(void *dst, const void *src, size_t nbytes) {
  if (nbytes) DS_CUDA(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, DS_CUDA_STREAM));
}

static void cuda_copy_rows(float *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows, int64_t cols) {
  if (rows > 0 && cols > 0)
    DS_CUDA(cudaMemcpy2DAsync(dst, (size_t)ld_dst * sizeof(float), src, (size_t)ld_src * sizeof(float),
                              (size_t)cols * sizeof(float), (size_t)rows, cudaMemcpyDeviceToDevice, DS_CUDA_STREAM));
}

static void cuda_memset_zero(void *p, size_t nbytes) {
  if (nbytes) DS_CUDA(cudaMemsetAsync(p, 0, nbytes, DS_CUDA_STREAM));
}

static void cuda_synchronize(void) { DS_CUDA(cudaDeviceSynchronize()); }
/* cuBLAS's bf16 mode converts on the device per product; no copy is kept (yet). */
static void cuda_operand_hold(const float *p, size_t n) { (void)p, (void)n; }
static void cuda_operand_release(const float *p) { (void)p; }

/* ---------------------------------------------------------------- GEMM */

/* An operand in device memory: row-major rows x cols with row stride ld, in F32, BF16 or F16. */
struct gemm_operand {
  const void *p;
  ds_dtype dt;
  int64_t ld;
};

/* The operand in the dtype the GEMM runs in (F32, or BF16 in the bf16 mode): as it is when it
 * already is, else converted densely (ld = cols) into a scratch slot. */
static gemm_operand gemm_ready(gemm_operand a, int64_t rows, int64_t cols, ds_dtype want, int slot) {
  if (a.dt == want) return a;
  void *dst = ds_cuda_scratch(slot, (size_t)(rows * cols) * ds_dtype_size(want));
  ds_cuda_convert(dst, want, a.p, a.dt, rows, cols, a.ld);
  gemm_operand c = {dst, want, cols};
  return c;
}

static cudaDataType_t cuda_type(ds_dtype dt) { return dt == DS_BF16 ? CUDA_R_16BF : CUDA_R_32F; }

/* C[m, n] (row stride ldc, fp32) = op(A) @ op(B) + beta * C, with ds_gemm_f32's conventions
 * (include/dspark/backend.h): op(A) is [m, k] (A stored [m, k], or [k, m] when ta), op(B) is
 * [k, n] (B stored [k, n], or [n, k] when tb); beta 0 or 1. fp32 mode: 16-bit operands are
 * converted to fp32 and the product runs with CUBLAS_COMPUTE_32F; bf16 mode: both operands
 * in bf16, fp32 accumulation (CUBLAS_COMPUTE_32F on bf16 inputs uses the tensor cores). */
static void cuda_gemm(int ta, int tb, int64_t m, int64_t n, int64_t k, gemm_operand A, gemm_operand B, float beta,
                      float *C, int64_t ldc) {
  if (m == 0 || n == 0) return;
  DS_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && ldc <= INT_MAX && A.ld <= INT_MAX && B.ld <= INT_MAX);
  ds_dtype want = ds_cuda_bf16_gemm() ? DS_BF16 : DS_F32;
  A = gemm_ready(A, ta ? k : m, ta ? m : k, want, DS_CUDA_SLOT_CONV_A);
  B = gemm_ready(B, tb ? n : k, tb ? k : n, want, DS_CUDA_SLOT_CONV_B);
  float alpha = 1.0f;
  DS_CUBLAS(cublasGemmEx(ds_cuda_blas(), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n,
                         (int)m, (int)k, &alpha, B.p, cuda_type(B.dt), (int)B.ld, A.p, cuda_type(A.dt), (int)A.ld,
                         &beta, C, CUDA_R_32F, (int)ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

static gemm_operand f32_operand(const float *p, int64_t ld) {
  gemm_operand o = {p, DS_F32, ld};
  return o;
}

/* ---------------------------------------------------------------- linear */

/* y[n, out] (row stride ldy) = x[n, in] @ w[out, in]^T (+ bias), w F32. */
static void linear_f32(float *y, int64_t ldy, const float *x, const float *w, const float *bias, int64_t n,
                       int64_t in, int64_t out) {
  float beta = 0.0f;
  if (bias) {
    ds_cuda_fill_rows(y, ldy, bias, n, out);
    beta = 1.0f;
  }
  cuda_gemm(0, 1, n, out, in, f32_operand(x, in), f32_operand(w, in), beta, y, ldy);
}

static void cuda_linear(float *y, const float *x, const float *w, const float *bias, int64_t n, int64_t in,
                        int64_t out) {
  linear_f32(y, out, x, w, bias, n, in, out);
}

/* dx += dy @ w;  dw += dy^T @ x;  db += column sums of dy (rows in order: deterministic). */
static void cuda_linear_backward(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w,
                                 int64_t n, int64_t in, int64_t out) {
  if (dx) cuda_gemm(0, 0, n, in, out, f32_operand(dy, out), f32_operand(w, in), 1.0f, dx, in);
  if (dw) cuda_gemm(1, 0, out, in, n, f32_operand(dy, out), f32_operand(x, in), 1.0f, dw, in);
  if (db) ds_cuda_colsum_add(db, dy, n, out, out);
}

/* Rows of a 16-bit weight converted to fp32 at a time in the fp32 mode (256 MiB of scratch at
 * most), so a vocabulary-sized head is not copied whole; the bf16 mode reads BF16 weights as
 * stored and converts others whole (at most the size of the weight itself). */
static int64_t weight_rows_per_pass(ds_dtype dt, int64_t in, int64_t out) {
  if (dt == DS_F32 || ds_cuda_bf16_gemm()) return out > 0 ? out : 1;
  int64_t rows = ((int64_t)64 << 20) / (in > 0 ? in : 1);
  return rows < 1 ? 1 : rows;
}

static gemm_operand weight_rows(ds_weight w, int64_t row0, int64_t in) {
  DS_CHECK(w.dtype == DS_F32 || w.dtype == DS_BF16 || w.dtype == DS_F16);
  gemm_operand o = {(const char *)w.data + (size_t)(row0 * in) * ds_dtype_size(w.dtype), w.dtype, in};
  return o;
}

/* y[n, out] (row stride ldy) = x[n, in] @ w[out, in]^T (+ bias), w frozen in F32 / BF16 / F16:
 * columns o0 .. o0+oc of y from the weight's rows o0 .. o0+oc. */
static void cuda_linear_w(float *y, int64_t ldy, const float *x, ds_weight w, const float *bias, int64_t n,
                          int64_t in, int64_t out) {
  if (w.dtype == DS_F32) {
    linear_f32(y, ldy, x, (const float *)w.data, bias, n, in, out);
    return;
  }
  float beta = 0.0f;
  if (bias) {
    ds_cuda_fill_rows(y, ldy, bias, n, out);
    beta = 1.0f;
  }
  int64_t step = weight_rows_per_pass(w.dtype, in, out);
  for (int64_t o0 = 0; o0 < out; o0 += step) {
    int64_t oc = out - o0 < step ? out - o0 : step;
    cuda_gemm(0, 1, n, oc, in, f32_operand(x, in), weight_rows(w, o0, in), beta, y + o0, ldy);
  }
}

/* dx[n, in] += dy[n, out] @ w[out, in], over the same row passes of w (each adds its share). */
/* One rmsnorm launch per token (a strided kernel is not written yet). */
static void cuda_rmsnorm_heads(float *x, int64_t stride, const float *w, int64_t n, int64_t heads, int64_t head_dim,
                               float eps) {
  for (int64_t t = 0; t < n; t++) ds_cuda_rmsnorm(x + t * stride, NULL, x + t * stride, w, heads, head_dim, eps);
}

/* One product per segment (cuBLAS runs each at full width; a fused copy is not kept yet). */
static void cuda_linear_w_cat(float *y, int64_t ldy, const float *x, const ds_weight *w, const int64_t *out, int n_seg,
                              const float *bias, int64_t n, int64_t in) {
  ds_linear_w_each_segment(cuda_linear_w, y, ldy, x, w, out, n_seg, bias, n, in);
}

static void cuda_linear_w_backward(float *dx, const float *dy, ds_weight w, int64_t n, int64_t in, int64_t out) {
  int64_t step = weight_rows_per_pass(w.dtype, in, out);
  for (int64_t o0 = 0; o0 < out; o0 += step) {
    int64_t oc = out - o0 < step ? out - o0 : step;
    cuda_gemm(0, 0, n, in, oc, f32_operand(dy + o0, out), weight_rows(w, o0, in), 1.0f, dx, in);
  }
}

/* ---------------------------------------------------------------- the table */

/* Frozen weights are read as stored (device memory, 16-bit or fp32), converted per product. */
static void cuda_prepare_weight(ds_weight w, int64_t rows, int64_t in) { (void)w, (void)rows, (void)in; }

/* Filled by assignment (C++17 has no designated initializers); every entry is set but the f16
 * caches' and the batched attention's (NULL: no f16 caches here, a call a sequence). */
static ds_backend make_table() {
  ds_backend t = {};
  t.device_memory = 1;
  t.name = "cuda";
  t.linear = cuda_linear;
  t.rmsnorm = ds_cuda_rmsnorm;
  t.rope = ds_cuda_rope;
  t.attention_causal = ds_cuda_attention_causal;
  t.swiglu = ds_cuda_swiglu;
  t.add = ds_cuda_add;
  t.linear_w = cuda_linear_w;
  t.linear_w_cat = cuda_linear_w_cat;
  t.rmsnorm_heads = cuda_rmsnorm_heads;
  t.linear_w_backward = cuda_linear_w_backward;
  t.embedding_w = ds_cuda_embedding_w;
  t.prepare_weight = cuda_prepare_weight;
  t.linear_backward = cuda_linear_backward;
  t.rmsnorm_backward = ds_cuda_rmsnorm_backward;
  t.rope_backward = ds_cuda_rope_backward;
  t.swiglu_backward = ds_cuda_swiglu_backward;
  t.block_attention = ds_cuda_block_attention;
  t.block_attention_backward = ds_cuda_block_attention_backward;
  t.attention_causal_train = ds_cuda_attention_causal_train;
  t.attention_causal_train_backward = ds_cuda_attention_causal_train_backward;
  t.embedding = ds_cuda_embedding;
  t.embedding_backward = ds_cuda_embedding_backward;
  t.alloc = cuda_alloc;
  t.free = cuda_free;
  t.copy_to_device = cuda_copy_to_device;
  t.copy_to_host = cuda_copy_to_host;
  t.copy = cuda_copy;
  t.copy_rows = cuda_copy_rows;
  t.memset_zero = cuda_memset_zero;
  t.synchronize = cuda_synchronize;
  t.operand_hold = cuda_operand_hold;
  t.operand_release = cuda_operand_release;
  return t;
}

static const ds_backend k_cuda = make_table();


const ds_backend *ds_backend_cuda(void) { return ds_cuda_init() ? &k_cuda : NULL; }
