/* Internal to the CPU backend: the sgemm helper that every matmul goes through, the OpenMP
 * pragma macro, and the attention kernels (cpu_attention.c, cpu_block_attention.c,
 * cpu_causal_attention.c) that the table in cpu_backend.c points at. Not a public header. */
#ifndef DSPARK_NN_CPU_KERNELS_H
#define DSPARK_NN_CPU_KERNELS_H

#include <math.h>
#include <stdint.h>

#include "nn/cpu_linear16.h"
#include "nn/fast_exp.h"

/* DS_OMP(parallel for ...) is `#pragma omp parallel for ...` in OpenMP builds and nothing
 * otherwise (no -Wunknown-pragmas noise, and the loops run serially). */
/* A region whose `if` clause is false still costs what a parallel one does (libgomp makes a
 * team of one and ends it with a futex call: 0.7 us against 0.04 for the loop itself on an AMD
 * EPYC Zen 4), so the small ops of a decode step (270 a token on SmolLM2) test their size first
 * and run their loop outside any region when it is small. */
#define DS_PRAGMA_(x) _Pragma(#x)
#ifdef DSPARK_USE_OPENMP
#define DS_OMP(...) DS_PRAGMA_(omp __VA_ARGS__)
#else
#define DS_OMP(...)
#endif

/* C[m, n] = op(A) @ op(B) + beta * C, row-major, op(X) = X^T when the flag is set:
 *   op(A) is [m, k] (A stored [m, k] with row stride lda, or [k, m] when ta),
 *   op(B) is [k, n] (B stored [k, n] with row stride ldb, or [n, k] when tb).
 * beta is 0 (C overwritten, never read) or 1 (accumulate). Any zero size is allowed.
 * OpenBLAS when built with it (single-threaded inside an OpenMP region), loops otherwise. */
void ds_cpu_sgemm(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *B,
                  int64_t ldb, float beta, float *C, int64_t ldc);

/* Products ds_cpu_sgemm ran with operands copied to rows of another stride (the oneDNN build on a
 * CPU without AVX-512, nn/cpu_gemm.c): for the tests. */
long ds_cpu_sgemm_padded_count(void);

/* Threads the kernels' OpenMP regions use (1 without OpenMP). */
int ds_cpu_threads(void);

/* The attention entries of the cpu table; shapes and semantics in include/dspark/backend.h. */
/* ds_cpu_attention_causal over an f16 cache (backend.h attention_causal_f16), and its appends. */
void ds_cpu_attention_causal_f16(float *out, const float *q, int64_t q_stride, const uint16_t *k, const uint16_t *v,
                                 int64_t n, int64_t past, int64_t cap, int64_t n_heads, int64_t n_kv_heads,
                                 int64_t head_dim, float scale);
void ds_cpu_copy_rows_f16(uint16_t *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows, int64_t cols);
/* backend.h attention_causal_seqs: the sequences' decode tasks in one parallel region */
void ds_cpu_attention_causal_seqs(float *out, const float *q, int64_t q_stride, const void *const *k,
                                  const void *const *v, int f16, const int64_t *n, const int64_t *past,
                                  const int64_t *cap, int n_seqs, int64_t n_heads, int64_t n_kv_heads,
                                  int64_t head_dim, float scale);
void ds_cpu_attention_causal(float *out, const float *q, int64_t q_stride, const float *k, const float *v, int64_t n,
                             int64_t past, int64_t cap, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                             float scale);
/* ds_cpu_attention_causal with bf16 products (cpu_attention_bf16.c), which it runs under
 * DS_COMPUTE_BF16 for n >= DS_BF16_ATTN_MIN_ROWS query rows; 0 when oneDNN's native bf16
 * kernels are not there (nothing written: the caller runs the fp32 path). */
int ds_cpu_attention_causal_bf16(float *out, const float *q, int64_t q_stride, const float *k, const float *v,
                                 int64_t n, int64_t past, int64_t cap, int64_t n_heads, int64_t n_kv_heads,
                                 int64_t head_dim, float scale);
enum { DS_BF16_ATTN_MIN_ROWS = 32 };
/* Its softmax row, kept separate for the tests: prow[0 : kp] <- bf16(exp(scale * row[j] - max))
 * for j < vis (max over those), zeros after; returns the sum of the unrounded exps (about 1 or
 * more: the max's term is exp(0) up to the fused multiply-subtract's rounding), in
 * 16 partial sums (lane j % 16 takes column j) added in lane order. kp >= vis and a multiple
 * of 16. isa: DS_ISA_AVX512 runs the 16-lane form where the CPU has it (the same bits), any
 * other the portable loop. */
float ds_exp_row_bf16(ds_isa isa, uint16_t *prow, const float *row, int64_t vis, int64_t kp, float scale);
void ds_cpu_block_attention(float *out, float *lse, const float *q, const float *k_ctx, const float *v_ctx,
                            const float *k_blk, const float *v_blk, const int64_t *ctx_len, int64_t n_ctx,
                            int64_t n_blocks, int64_t g, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                            float scale);
void ds_cpu_block_attention_backward(float *dq, float *dk_ctx, float *dv_ctx, float *dk_blk, float *dv_blk,
                                     const float *dout, const float *out, const float *lse, const float *q,
                                     const float *k_ctx, const float *v_ctx, const float *k_blk, const float *v_blk,
                                     const int64_t *ctx_len, int64_t n_ctx, int64_t n_blocks, int64_t g,
                                     int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale);
/* The training causal attention (cpu_causal_attention.c). */
void ds_cpu_attention_causal_train(float *out, float *lse, const float *q, const float *k, const float *v,
                                   const int64_t *seq_off, int64_t n_seqs, int64_t n_heads, int64_t n_kv_heads,
                                   int64_t head_dim, float scale);
void ds_cpu_attention_causal_train_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                            const float *lse, const float *q, const float *k, const float *v,
                                            const int64_t *seq_off, int64_t n_seqs, int64_t n_heads,
                                            int64_t n_kv_heads, int64_t head_dim, float scale);

/* One softmax row of every attention kernel, unnormalized, so their numerics cannot drift apart:
 * row[0:n] <- exp(scale * row - max), *mx = the scaled max; returns the sum (>= 1: the maximum
 * contributes exp(0)). n >= 1. */
static inline float ds_softmax_row_exp(float *row, int64_t n, float scale, float *mx) {
  float m = -INFINITY, sum = 0.0f;
  DS_OMP(simd reduction(max : m))
  for (int64_t j = 0; j < n; j++) {
    row[j] *= scale;
    m = row[j] > m ? row[j] : m;
  }
  DS_OMP(simd reduction(+ : sum))
  for (int64_t j = 0; j < n; j++) {
    row[j] = ds_fast_expf(row[j] - m);
    sum += row[j];
  }
  *mx = m;
  return sum;
}

#endif
