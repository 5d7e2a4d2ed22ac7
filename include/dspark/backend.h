/* The one seam between model code and compute: every kernel the models call goes through a
 * ds_backend table, so a CUDA backend is a second table, not a rewrite of the models.
 * Pointers are fp32 buffers in the backend's memory; shapes are row-major and written next
 * to each entry. Forward kernels that have a backward get it added beside them here. */
#ifndef DSPARK_BACKEND_H
#define DSPARK_BACKEND_H

#include <stddef.h>

#include "dspark/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds_backend {
  const char *name;
  /* 1 when the memory of this backend (alloc) is not host memory (cuda): callers move data with
   * the copy entries, never with memcpy or by reading it. 0 for the host backends. */
  int device_memory;

  /* y[n, out] = x[n, in] @ w[out, in]^T (+ bias[out] when bias != NULL). Overwrites y. */
  void (*linear)(float *y, const float *x, const float *w, const float *bias, int64_t n, int64_t in,
                 int64_t out);

  /* y[n, d] = w[d] * (x * rstd), rstd = 1 / sqrt(mean(x^2) + eps) (HF order); y may alias x.
   * rstd[n] saved when non-NULL (the backward needs it). */
  void (*rmsnorm)(float *y, float *rstd, const float *x, const float *w, int64_t n, int64_t d, float eps);
  /* In place on x[n, heads, head_dim] (row stride `stride` floats between tokens): each head's
   * head_dim values as rmsnorm's rows, the same bits (Qwen3's q_norm / k_norm on the q or k
   * columns of a fused q|k|v row). Inference only: no rstd. */
  void (*rmsnorm_heads)(float *x, int64_t stride, const float *w, int64_t n, int64_t heads, int64_t head_dim,
                        float eps);

  /* In place on x[n, heads, head_dim] (row stride `stride` floats between tokens), HF
   * rotate_half convention: pairs (i, i + head_dim/2), angle (float)pos[t] * inv_freq[i] in fp32
   * (as transformers computes it). */
  void (*rope)(float *x, int64_t stride, const int64_t *pos, const float *inv_freq, int64_t n, int64_t heads,
               int64_t head_dim);

  /* Causal attention of n new queries against a KV cache (GQA: query head h reads kv head
   * h / (n_heads / n_kv_heads)).
   *   q[n, q_stride] holding n_heads x head_dim (roped); k, v: [n_kv_heads, cap, head_dim]
   *   with keys 0 .. past+n-1 valid; out[n, n_heads * head_dim].
   * Query i sits at position past + i and sees keys 0 .. past + i. */
  void (*attention_causal)(float *out, const float *q, int64_t q_stride, const float *k, const float *v,
                           int64_t n, int64_t past, int64_t cap, int64_t n_heads, int64_t n_kv_heads,
                           int64_t head_dim, float scale);

  /* attention_causal over a KV cache held in IEEE half precision (k, v: [n_kv_heads, cap,
   * head_dim] f16 bits): each key and value widened to fp32 exactly, then attention_causal's
   * numbers on those values. NULL on a backend without f16 caches (dspark --kv-cache f16). */
  void (*attention_causal_f16)(float *out, const float *q, int64_t q_stride, const uint16_t *k, const uint16_t *v,
                               int64_t n, int64_t past, int64_t cap, int64_t n_heads, int64_t n_kv_heads,
                               int64_t head_dim, float scale);

  /* attention_causal (attention_causal_f16 when f16) of n_seqs sequences, each over its own
   * cache, in one call (batched decoding: the backend spreads their work over its threads
   * together): sequence s has n[s] rows of q and out (the sequences' rows one after another),
   * its cache k[s], v[s] ([n_kv_heads, cap[s], head_dim], fp32 or f16 bits) with past[s] keys
   * cached. Each sequence's numbers are those attention_causal(_f16) gives it alone, bit for
   * bit. NULL: the caller makes a call a sequence. */
  void (*attention_causal_seqs)(float *out, const float *q, int64_t q_stride, const void *const *k,
                                const void *const *v, int f16, const int64_t *n, const int64_t *past,
                                const int64_t *cap, int n_seqs, int64_t n_heads, int64_t n_kv_heads,
                                int64_t head_dim, float scale);

  /* out[n, I] = silu(gu[n, 0:I]) * gu[n, I:2I]  (gate and up fused in one row). */
  void (*swiglu)(float *out, const float *gu, int64_t n, int64_t inter);

  /* y[n] += x[n] */
  void (*add)(float *y, const float *x, int64_t n);

  /* ---- frozen weights in their checkpoint dtype (ds_weight, dspark/common.h: F32, BF16 or
   * F16, data aligned to its element size, row-major [out, in] / [rows, d]). Each 16-bit
   * value is converted to fp32 exactly and every product is accumulated in fp32, so the
   * result equals the fp32 entries run on the same weights converted to fp32, up to fp32
   * summation order (activations are never rounded to 16 bits). With an F32 weight they are
   * the fp32 entries themselves: linear_w with ldy == out is linear, bit for bit, except that
   * the cpu backend streams an F32 weight row by row for up to 8 rows of x (decode,
   * verification: fp32 products in another summation order, a row's sums the same whatever
   * rows share the call; nn/cpu_linear16.h). All this under
   * DS_COMPUTE_F32, the default; under DS_COMPUTE_BF16 (ds_set_matmul_compute below) calls with
   * enough rows on F32 or BF16 weights round x (and an F32 weight) to bf16 instead. */

  /* y[n, out] (row stride ldy >= out) = x[n, in] @ w[out, in]^T (+ bias[out] when bias != NULL).
   * Overwrites those n x out values of y, nothing else. */
  void (*linear_w)(float *y, int64_t ldy, const float *x, ds_weight w, const float *bias, int64_t n, int64_t in,
                   int64_t out);
  /* linear_w over n_seg frozen weights stored apart that share x (a checkpoint's q, k, v or gate,
   * up): y[n, sum(out[])] (row stride ldy) = x @ [w[0]; w[1]; ...]^T (+ bias, sum(out[]) values,
   * or NULL); segment s writes its out[s] columns after the previous ones. The same values as
   * one linear_w per segment; a backend may run them as one product (the cpu backend under
   * DS_COMPUTE_BF16: one GEMM, its packed copy of the concatenation when used again). */
  void (*linear_w_cat)(float *y, int64_t ldy, const float *x, const ds_weight *w, const int64_t *out, int n_seg,
                       const float *bias, int64_t n, int64_t in);
  /* Its backward through x only (the weight is frozen: no dw, no db):
   * dx[n, in] += dy[n, out] @ w[out, in]. */
  void (*linear_w_backward)(float *dx, const float *dy, ds_weight w, int64_t n, int64_t in, int64_t out);
  /* y[n, d] = table[ids[i], 0:d] converted to fp32 (exact); ids must be rows of the table
   * (callers check them). No backward: the tables it reads are frozen. */
  void (*embedding_w)(float *y, const int32_t *ids, ds_weight table, int64_t n, int64_t d);
  /* A frozen weight [rows, in] that the model will multiply for its whole life, announced at
   * load time so that the copy the backend's kernels read is made now, not by the first
   * product inside a timed decode (the cpu backend: the 8-row packed layout of Q4_0 / Q4_1 /
   * Q8_0, the file's pages then dropped). Values are unaffected; a no-op where nothing is made. */
  void (*prepare_weight)(ds_weight w, int64_t rows, int64_t in);

  /* ---- training: backward kernels. Rule for every backward below: it ADDS into each
   * gradient buffer it is given (dx, dw, db, ...) so that contributions from several uses
   * accumulate; callers zero them first. A NULL gradient pointer skips that gradient. */

  /* Backward of linear: dx[n, in] += dy[n, out] @ w[out, in];  dw[out, in] += dy^T @ x;
   * db[out] += sum over n of dy. */
  void (*linear_backward)(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w,
                          int64_t n, int64_t in, int64_t out);

  /* Backward of rmsnorm with the rstd[n] the forward saved (r = rstd[i]):
   * dx[n, d] += r * (w * dy - x * r^2 * mean(w * dy * x));  dw[d] += sum over n of dy * x * r. */
  void (*rmsnorm_backward)(float *dx, float *dw, const float *dy, const float *x, const float *w, const float *rstd,
                           int64_t n, int64_t d);

  /* Backward of rope: rotates the gradient dx[n, heads, head_dim] (row stride `stride`) by the
   * negative angle, in place (rope is orthogonal, so this is its transpose). The one exception
   * to the ADD rule: dx holds dL/dy on entry and dL/dx on return; columns past heads * head_dim
   * are untouched. */
  void (*rope_backward)(float *dx, int64_t stride, const int64_t *pos, const float *inv_freq, int64_t n,
                        int64_t heads, int64_t head_dim);

  /* Backward of swiglu: dgu[n, 2I] += d/dgu of sum(dout * silu(gate) * up), i.e.
   * dgate += dout * up * s * (1 + gate * (1 - s)) and dup += dout * silu(gate), s = sigmoid(gate). */
  void (*swiglu_backward)(float *dgu, const float *dout, const float *gu, int64_t n, int64_t inter);

  /* Draft block attention (training and decoding). n_blocks blocks of g query slots; block b
   * sees the first ctx_len[b] context keys (positions 0 .. ctx_len[b]-1 of its sequence) and
   * all g keys of its own block (bidirectional), nothing else. ctx_len[b] < 0 marks a dropped
   * block: it sees no key at all and its output is 0 (finite, never NaN). ctx_len[b] > n_ctx
   * is a caller bug (DS_CHECK).
   *   q:            [n_blocks * g, n_heads * head_dim]      (roped)
   *   k_ctx, v_ctx: [n_ctx, n_kv_heads * head_dim]           (keys roped), shared by all blocks
   *   k_blk, v_blk: [n_blocks * g, n_kv_heads * head_dim]   (keys roped)
   *   out:          [n_blocks * g, n_heads * head_dim]      overwritten
   *   lse:          [n_blocks * g, n_heads]  log-sum-exp of each softmax row, saved for the
   *                 backward (which recomputes the probabilities instead of storing them);
   *                 -inf for dropped blocks; may be NULL in inference. */
  void (*block_attention)(float *out, float *lse, const float *q, const float *k_ctx, const float *v_ctx,
                          const float *k_blk, const float *v_blk, const int64_t *ctx_len, int64_t n_ctx,
                          int64_t n_blocks, int64_t g, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                          float scale);
  /* Its backward: accumulates into dq, dk_ctx, dv_ctx, dk_blk, dv_blk (same shapes as the
   * forward's inputs; NULL skips one) from dout [n_blocks * g, n_heads * head_dim], using the
   * forward's out and lse (required here). Probabilities are recomputed from lse, so scratch
   * is O(g * (n_ctx + g)) per thread (plus, in the cpu backend, two [max ctx_len, head_dim]
   * buffers per kv head and part of the blocks when several threads share a kv head). Dropped blocks
   * contribute nothing. Results are bitwise reproducible for a given thread count. */
  void (*block_attention_backward)(float *dq, float *dk_ctx, float *dv_ctx, float *dk_blk, float *dv_blk,
                                   const float *dout, const float *out, const float *lse, const float *q,
                                   const float *k_ctx, const float *v_ctx, const float *k_blk, const float *v_blk,
                                   const int64_t *ctx_len, int64_t n_ctx, int64_t n_blocks, int64_t g,
                                   int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale);

  /* Causal self-attention over whole sequences (training; inference without lse). n_seqs
   * sequences packed in rows: sequence s holds rows seq_off[s] .. seq_off[s+1]-1 (seq_off[0] =
   * 0, non-decreasing; an empty sequence is allowed) at positions 0 .. len-1, and the query at
   * position i sees the keys at positions 0 .. i of its own sequence, nothing else. GQA: query
   * head h reads kv head h / (n_heads / n_kv_heads).
   *   q:    [rows, n_heads * head_dim]     (roped)
   *   k, v: [rows, n_kv_heads * head_dim]  (keys roped)
   *   out:  [rows, n_heads * head_dim]     overwritten
   *   lse:  [rows, n_heads] log-sum-exp of each softmax row (scaled scores), saved for the
   *         backward, which recomputes the probabilities from it; may be NULL in inference.
   * No [len, len] tensor is kept: scratch is O(chunk * len) per thread. */
  void (*attention_causal_train)(float *out, float *lse, const float *q, const float *k, const float *v,
                                 const int64_t *seq_off, int64_t n_seqs, int64_t n_heads, int64_t n_kv_heads,
                                 int64_t head_dim, float scale);
  /* Its backward: accumulates into dq, dk, dv (the shapes of q, k, v; NULL skips one) from
   * dout [rows, n_heads * head_dim], using the forward's out and lse (required). Probabilities
   * are recomputed from lse (no stored probability tensor). Results are bitwise reproducible
   * for a given thread count. */
  void (*attention_causal_train_backward)(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                          const float *lse, const float *q, const float *k, const float *v,
                                          const int64_t *seq_off, int64_t n_seqs, int64_t n_heads,
                                          int64_t n_kv_heads, int64_t head_dim, float scale);

  /* Embedding lookup: out[n, d] = table[ids[i], :] (the caller checks ids in [0, V)). */
  void (*embedding)(float *out, const float *table, const int32_t *ids, int64_t n, int64_t d);
  /* Its backward: dtable[V, d] += dout[i, :] at row ids[i], for every i with ids[i] !=
   * skip_id (-1: none; as torch's padding_idx, that row gets no gradient from the lookup).
   * Rows that repeat an id add in row order: bitwise reproducible for any thread count. */
  void (*embedding_backward)(float *dtable, const float *dout, const int32_t *ids, int64_t n, int64_t d,
                             int64_t skip_id);

  /* ---- memory (issue 14): model code allocates and moves its buffers through these, so one
   * copy of it runs on host memory (cpu, reference) and on device memory (cuda).
   * Where pointers live, for every entry of this table: every float pointer and every
   * ds_weight's data is this backend's memory (from alloc); the integer index arrays (pos,
   * ids, ctx_len, seq_off) are host memory for every backend (the host builds them, and the
   * cuda backend's launch shapes depend on them; it uploads them itself).
   * Kernels may run asynchronously (cuda: in order on one stream); copy_to_host waits for
   * them. Host backends: alloc is ds_malloc_aligned (64-byte aligned), the copies memcpy,
   * synchronize does nothing. nbytes 0 is allowed everywhere (alloc(0) gives a pointer that
   * free accepts); buffers of a copy do not overlap. */
  /* nbytes of backend memory, or NULL with DS_ERR_NOMEM recorded (naming `what`). */
  void *(*alloc)(size_t nbytes, const char *what);
  /* Frees what alloc returned; NULL does nothing. */
  void (*free)(void *p);
  /* Host -> backend memory; the host buffer may be reused as soon as it returns. */
  void (*copy_to_device)(void *dst, const void *src_host, size_t nbytes);
  /* Backend -> host memory, after every kernel queued before it has finished. */
  void (*copy_to_host)(void *dst_host, const void *src, size_t nbytes);
  /* Backend -> backend memory, in order with the kernels. */
  void (*copy)(void *dst, const void *src, size_t nbytes);
  /* Backend -> backend memory, a strided block of floats: dst[r * ld_dst + c] = src[r * ld_src + c]
   * for r < rows, c < cols (KV-cache appends, row gathers), in order with the kernels. */
  void (*copy_rows)(float *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows, int64_t cols);
  /* copy_rows into f16 bits, each value rounded to nearest even (ds_f32_to_f16): an f16 KV
   * cache's appends. NULL where attention_causal_f16 is. */
  void (*copy_rows_f16)(uint16_t *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows, int64_t cols);
  /* p[0 .. nbytes) = 0 in backend memory (for the ADD rule's zeroed gradients). */
  void (*memset_zero)(void *p, size_t nbytes);
  /* Waits for every kernel and copy queued so far; a device error surfaces here at the latest. */
  void (*synchronize)(void);

  /* ---- a promise about an operand: from operand_hold(p, n) to operand_release(p) the caller
   * does not change the n floats at p, so a backend that converts the operands of its products
   * (the cpu backend under DS_COMPUTE_BF16 rounds them to bf16) may convert them once and use the
   * copy in every product that reads them there (the loss's gradient of a chunk of logits, read
   * by three products; a trainable vocabulary matrix, read by every chunk). Holds of one pointer
   * nest; the last release drops the copy. A backend may ignore both; results are the same bits
   * either way. */
  void (*operand_hold)(const float *p, size_t n);
  void (*operand_release)(const float *p);
} ds_backend;

const ds_backend *ds_backend_cpu(void);
/* The naive reference kernels (plain loops, double accumulation) that tests compare against. */
const ds_backend *ds_backend_reference(void);

/* ---- the CUDA backend (issue 14; built with -DDSPARK_CUDA=ON, src/nn/cuda/). Every entry
 * above on device memory, on the first visible device, one stream. NULL with the reason
 * recorded (ds_last_error) when the build has no CUDA or no device can be used. */
const ds_backend *ds_backend_cuda(void);
/* Its GEMMs (linear, linear_backward, linear_w, linear_w_backward, and the products of the
 * attentions: QK^T, PV and their backward's): 0 (the default) runs them in fp32
 * (CUBLAS_COMPUTE_32F, no TF32), as the cpu backend; 1 converts both operands to bf16 on the
 * device (BF16 weights are used as stored; the attention probabilities and dS after their fp32
 * softmax) and runs them on tensor cores with fp32 accumulation and fp32 outputs. Returns the
 * previous setting (always 0 without CUDA). */
int ds_cuda_set_bf16_gemm(int on);
/* A backend by the name --device takes: "cpu" or "cuda". NULL with the reason recorded
 * (ds_last_error) for another name, or for cuda in a build without it or with no usable device. */
const ds_backend *ds_backend_named(const char *name);

/* Threads used by our kernels (OpenMP) and BLAS; 0 keeps the default. */
void ds_set_num_threads(int n);
int ds_get_num_threads(void);
/* The fp32 GEMM every matmul goes through, row-major:
 *   C[m, n] = op(A) @ op(B) + beta * C, op(X) = X^T when the flag is set; op(A) is [m, k]
 *   (A stored [m, k] with row stride lda, or [k, m] when ta), op(B) is [k, n] (B stored [k, n]
 *   with row stride ldb, or [n, k] when tb). beta is 0 (C overwritten, never read) or 1. */
void ds_gemm_f32(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *B,
                 int64_t ldb, float beta, float *C, int64_t ldc);
/* The GEMM library and kernel that runs, e.g. "oneDNN 2.6.3 avx512_core_amx", "OpenBLAS
 * SkylakeX", "loops (no GEMM library)". */
const char *ds_gemm_name(void);
/* A one-line warning when the matmuls run a slow generic path on a CPU that has a faster one
 * (OpenBLAS's fallback kernel, an ISA cap, no GEMM library), else NULL. */
const char *ds_gemm_warning(void);
/* The precision of the cpu backend's matmuls, process-wide (set it once before computing,
 * from the main thread; the default is DS_COMPUTE_F32):
 *   DS_COMPUTE_F32   every matmul in fp32 (16-bit frozen weights widened exactly), as always;
 *   DS_COMPUTE_BF16  the large matmuls of linear, linear_backward (dx and dw; dw accumulates
 *                    into the fp32 gradient), linear_w and linear_w_backward round both
 *                    operands to bf16 (round to nearest even) and multiply them with fp32
 *                    accumulation into fp32 outputs (ds_gemm_bf16). Master weights, gradients,
 *                    activations between kernels and the optimizer stay fp32; a frozen BF16
 *                    weight is read in place (nothing of it converted), a frozen F16 weight keeps
 *                    its exact fp32 path (rounding it to bf16 would lose 3 bits); a frozen
 *                    block-quantized weight's dequantized tiles (more than 32 rows) are rounded. Calls with few
 *                    rows (decode, small batches: nn/cpu_gemm_bf16.h has the measured
 *                    thresholds) keep their fp32 paths because those are faster, so a bf16
 *                    result is that of bf16-rounded inputs or the fp32 one. attention_causal
 *                    on DS_BF16_ATTN_MIN_ROWS or more new tokens runs QK^T and PV in bf16
 *                    (nn/cpu_kernels.h; softmax fp32). The training attentions, norms and
 *                    everything else stay fp32.
 *   DS_COMPUTE_INT8  every matmul in fp32 as DS_COMPUTE_F32, except the products of block-
 *                    quantized frozen weights (Q4_0 ... Q6_K): those round x to int8 per block
 *                    and take the integer path at any number of rows, as they always do for up
 *                    to DS_QUANT_DIRECT_MAX_ROWS (decode, verification): a prompt's prefill or a
 *                    capture then uses decoding's integer products, as llama.cpp does for every
 *                    batch, and runs 1.3-1.4x faster on AVX2 (docs/compute.md). */
typedef enum { DS_COMPUTE_F32 = 0, DS_COMPUTE_BF16 = 1, DS_COMPUTE_INT8 = 2 } ds_compute;
/* Unset (the default, or after ds_unset_matmul_compute) the matmuls are DS_COMPUTE_F32's, except
 * that block-quantized frozen weights take the integer path at any number of rows, as under
 * DS_COMPUTE_INT8: a quantized GGUF computes as llama.cpp computes it (a 512-token prefill of
 * SmolLM2 Q8_0 1.6-1.7x the dequantized tiles' on an AMD EPYC Zen 4; docs/compute.md). Set to
 * DS_COMPUTE_F32 explicitly, their prompts multiply the dequantized tiles in fp32. */
void ds_set_matmul_compute(ds_compute c);
void ds_unset_matmul_compute(void);
ds_compute ds_matmul_compute(void); /* DS_COMPUTE_F32 when unset */
/* 1 when block-quantized frozen weights take the integer path at any number of rows (set to
 * DS_COMPUTE_INT8, or unset) */
int ds_quant_int8_rows(void);
const char *ds_compute_name(ds_compute c); /* "fp32" / "bf16" / "int8" */
/* The process's setting as reports print it: ds_compute_name's when set, "fp32 (int8 quantized
 * products)" when unset. */
const char *ds_compute_label(void);
/* "fp32" (or "f32") / "bf16" / "int8" -> *out; 0 on anything else. */
int ds_compute_parse(const char *s, ds_compute *out);
/* The bf16 GEMM: C = bf16(op(A)) @ bf16(op(B)) + beta * C, shapes, strides and flags as
 * ds_gemm_f32, fp32 in and out. Both inputs are rounded to bf16 (nearest even) and every
 * product (exact in fp32) accumulates in fp32, so the result equals the fp32 GEMM of the
 * rounded inputs up to fp32 summation order. oneDNN's bf16 matmul (AMX / AVX512_BF16) where
 * the build and CPU have it; otherwise the rounded inputs go through ds_gemm_f32 (same numbers,
 * no speedup). Independent of ds_set_matmul_compute. */
void ds_gemm_bf16(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *B,
                  int64_t ldb, float beta, float *C, int64_t ldc);
/* What runs ds_gemm_bf16, e.g. "oneDNN 2.6.3 matmul brg:avx512_core_amx_bf16", or "bf16-rounded
 * inputs, fp32 GEMM (...)" on the portable path. */
const char *ds_gemm_bf16_name(void);
/* A one-line warning when ds_gemm_bf16 runs the portable path (no speedup), else NULL. */
const char *ds_gemm_bf16_warning(void);
/* Under DS_COMPUTE_BF16 with oneDNN's native kernels, linear_w keeps each frozen weight (F32 or
 * BF16) it multiplies as a second, bf16 copy in the layout the kernel wants, made on first use
 * and reused for the life of the process: no per-call rounding or re-layout. The copies hold at
 * most DSPARK_BF16_PACK_MB MiB (environment, default 4096; 0 turns packing off; past the cap
 * the plain path runs). Keyed by the weight's address: whoever frees or rewrites a frozen
 * weight calls ds_release_packed_weights() first (ds_target_free and ds_draft_free do). */
void ds_release_packed_weights(void);
size_t ds_packed_weight_bytes(void); /* bytes the packed copies hold now */
/* The instruction set the cpu backend's 16-bit weight kernels (linear_w and its backward on
 * BF16 / F16 weights) run on this CPU, chosen at run time from cpuid: "AVX-512", "AVX2" or
 * "portable" (plain C); one binary runs on any x86-64 (and elsewhere, portable). */
const char *ds_weight16_kernel_name(void);
/* The instruction set of the kernels on quantized frozen weights (Q8_0 ... Q5_1: linear_w's
 * integer block dots, nn/cpu_quant.h): "AVX-512 VNNI", "AVX2" or "portable". */
const char *ds_weight_quant_kernel_name(void);

#ifdef __cplusplus
}
#endif
#endif
