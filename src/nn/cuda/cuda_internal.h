/* Internal to the CUDA backend (src/nn/cuda/, built with DSPARK_CUDA=ON): error checks that
 * name the failing call, the device context (cuBLAS handle, one stream, grow-only scratch), and
 * the entries each .cu file contributes to the table in cuda_backend.cu. Not a public header.
 *
 * Memory rule (include/dspark/backend.h): float pointers and ds_weight data are device memory;
 * integer index arrays (pos, ids, ctx_len, seq_off) are host memory, uploaded here into
 * scratch. Everything runs in order on the legacy default stream, so scratch reused by the
 * next call is never overwritten while a kernel still reads it. */
#ifndef DSPARK_NN_CUDA_INTERNAL_H
#define DSPARK_NN_CUDA_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "dspark/backend.h"
#include "dspark/common.h"

/* A failed CUDA / cuBLAS call is fatal (the kernels return void): the message names the call,
 * the file and line, and the library's reason, then DS_CHECK's abort path runs. */
[[noreturn]] void ds_cuda_fail(const char *file, int line, const char *call, const char *reason);
#define DS_CUDA(call)                                                                      \
  do {                                                                                     \
    cudaError_t ds_cuda_e_ = (call);                                                       \
    if (ds_cuda_e_ != cudaSuccess) ds_cuda_fail(__FILE__, __LINE__, #call, cudaGetErrorString(ds_cuda_e_)); \
  } while (0)
#define DS_CUBLAS(call)                                                                    \
  do {                                                                                     \
    cublasStatus_t ds_cublas_s_ = (call);                                                  \
    if (ds_cublas_s_ != CUBLAS_STATUS_SUCCESS)                                             \
      ds_cuda_fail(__FILE__, __LINE__, #call, cublasGetStatusString(ds_cublas_s_));        \
  } while (0)
/* After a kernel launch: a bad configuration surfaces here, naming the kernel. */
#define DS_CUDA_LAUNCHED(kernel_name)                                                      \
  do {                                                                                     \
    cudaError_t ds_cuda_e_ = cudaGetLastError();                                           \
    if (ds_cuda_e_ != cudaSuccess) ds_cuda_fail(__FILE__, __LINE__, "launch of " kernel_name, cudaGetErrorString(ds_cuda_e_)); \
  } while (0)

/* The stream every kernel, copy and GEMM of the backend runs on (the legacy default stream). */
#define DS_CUDA_STREAM ((cudaStream_t)0)

/* Scratch slots: each a grow-only device buffer, reused call after call (stream order keeps
 * that safe). One call uses each slot for one purpose at a time. */
enum {
  DS_CUDA_SLOT_TILES = 0, /* decode attention tile list (cuda_flash.cu) */
  DS_CUDA_SLOT_INDEX,     /* uploaded pos / ids / attention rows and visible keys */
  DS_CUDA_SLOT_INDEX2,    /* embedding backward: rows grouped by id */
  DS_CUDA_SLOT_INDEX3,    /* embedding backward: group offsets */
  DS_CUDA_SLOT_ROWSUM,    /* attention backward: D = rowsum(dout * out) */
  DS_CUDA_SLOT_CONV_A,    /* GEMM operand A converted (bf16 or fp32) */
  DS_CUDA_SLOT_CONV_B,    /* GEMM operand B converted */
  DS_CUDA_SLOT_ATTN_Q,    /* attention chunk (cuda_attn_gemm.cu): queries head-major */
  DS_CUDA_SLOT_ATTN_DO,   /* its dout rows head-major */
  DS_CUDA_SLOT_ATTN_O,    /* its PV (or dS K) product head-major */
  DS_CUDA_SLOT_ATTN_S,    /* its scores, then P */
  DS_CUDA_SLOT_ATTN_DP,   /* the backward's dP, then dS */
  DS_CUDA_SLOT_ATTN_P16,  /* bf16 mode: P (and dS) rounded for the GEMMs */
  DS_CUDA_SLOT_ATTN_K16,  /* bf16 mode: the context keys, head-major */
  DS_CUDA_SLOT_ATTN_V16,  /* bf16 mode: the context values, head-major */
  DS_CUDA_SLOT_COUNT
};

/* The context, created on first use by ds_backend_cuda (NULL + ds_last_error when no device). */
int ds_cuda_init(void); /* 1 when ready */
cublasHandle_t ds_cuda_blas(void);
int ds_cuda_bf16_gemm(void);
void *ds_cuda_scratch(int slot, size_t nbytes);
/* Copies nbytes of host memory into a scratch slot and returns the device copy. */
void *ds_cuda_upload(int slot, const void *host, size_t nbytes);

/* count * size bytes of host memory (the tile lists); running out is fatal, as for scratch. */
void *ds_cuda_host_array(size_t count, size_t size, const char *what);

/* Grid size for n elements at `threads` per block, capped (the kernels loop grid-stride). */
static inline unsigned ds_cuda_blocks(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  return (unsigned)(b > 65535 * 16 ? 65535 * 16 : b);
}

/* ---- entries of the table, by file (shapes and contracts in include/dspark/backend.h) */
/* cuda_norm_rope.cu */
void ds_cuda_rmsnorm(float *y, float *rstd, const float *x, const float *w, int64_t n, int64_t d, float eps);
void ds_cuda_rmsnorm_backward(float *dx, float *dw, const float *dy, const float *x, const float *w, const float *rstd,
                              int64_t n, int64_t d);
void ds_cuda_rope(float *x, int64_t stride, const int64_t *pos, const float *inv_freq, int64_t n, int64_t heads,
                  int64_t head_dim);
void ds_cuda_rope_backward(float *dx, int64_t stride, const int64_t *pos, const float *inv_freq, int64_t n,
                           int64_t heads, int64_t head_dim);
void ds_cuda_swiglu(float *out, const float *gu, int64_t n, int64_t inter);
void ds_cuda_swiglu_backward(float *dgu, const float *dout, const float *gu, int64_t n, int64_t inter);
void ds_cuda_add(float *y, const float *x, int64_t n);
/* dst[j] += sum over i < n of src[i * ld + j], rows in order (linear's db). */
void ds_cuda_colsum_add(float *dst, const float *src, int64_t n, int64_t cols, int64_t ld);
/* y[i * ldy + o] = bias[o] for i < n, o < out (linear's bias before a beta = 1 GEMM). */
void ds_cuda_fill_rows(float *y, int64_t ldy, const float *bias, int64_t n, int64_t out);

/* cuda_embedding.cu */
void ds_cuda_embedding(float *out, const float *table, const int32_t *ids, int64_t n, int64_t d);
void ds_cuda_embedding_backward(float *dtable, const float *dout, const int32_t *ids, int64_t n, int64_t d,
                                int64_t skip_id);
void ds_cuda_embedding_w(float *y, const int32_t *ids, ds_weight table, int64_t n, int64_t d);
/* dst[rows, cols] (dense) = src[rows, cols] (row stride ld) converted from src_dt (F32, BF16,
 * F16) to dst_dt (F32 or BF16; bf16 rounds to nearest even). */
void ds_cuda_convert(void *dst, ds_dtype dst_dt, const void *src, ds_dtype src_dt, int64_t rows, int64_t cols,
                     int64_t ld);

/* cuda_attention.cu */
void ds_cuda_attention_causal(float *out, const float *q, int64_t q_stride, const float *k, const float *v, int64_t n,
                              int64_t past, int64_t cap, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                              float scale);
void ds_cuda_attention_causal_train(float *out, float *lse, const float *q, const float *k, const float *v,
                                    const int64_t *seq_off, int64_t n_seqs, int64_t n_heads, int64_t n_kv_heads,
                                    int64_t head_dim, float scale);
void ds_cuda_attention_causal_train_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                             const float *lse, const float *q, const float *k, const float *v,
                                             const int64_t *seq_off, int64_t n_seqs, int64_t n_heads,
                                             int64_t n_kv_heads, int64_t head_dim, float scale);

/* cuda_block_attention.cu */
void ds_cuda_block_attention(float *out, float *lse, const float *q, const float *k_ctx, const float *v_ctx,
                             const float *k_blk, const float *v_blk, const int64_t *ctx_len, int64_t n_ctx,
                             int64_t n_blocks, int64_t g, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                             float scale);
void ds_cuda_block_attention_backward(float *dq, float *dk_ctx, float *dv_ctx, float *dk_blk, float *dv_blk,
                                      const float *dout, const float *out, const float *lse, const float *q,
                                      const float *k_ctx, const float *v_ctx, const float *k_blk, const float *v_blk,
                                      const int64_t *ctx_len, int64_t n_ctx, int64_t n_blocks, int64_t g,
                                      int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale);

#endif
