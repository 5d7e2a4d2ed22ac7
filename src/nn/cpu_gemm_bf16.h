/* Internal to the CPU backend: the bf16 GEMM behind DS_COMPUTE_BF16 (cpu_gemm_bf16.c), with
 * the operand B given either in fp32 (rounded on the way in) or as bf16 bits used in place
 * (a frozen BF16 weight: nothing of it is converted). Not a public header; the public entry
 * ds_gemm_bf16 and the contract are in include/dspark/backend.h. */
#ifndef DSPARK_NN_CPU_GEMM_BF16_H
#define DSPARK_NN_CPU_GEMM_BF16_H

#include <stdint.h>
#include <string.h>

/* fp32 -> bf16 bits as ds_f32_to_bf16 (core/dtype.c: nearest even, NaN quieted, overflow to
 * inf), inline so the conversion loops vectorize. */
static inline uint16_t ds_round_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* Which implementation runs the product. */
typedef enum {
  DS_BF16_AUTO = 0,  /* the route chosen for this CPU (below) */
  DS_BF16_PORTABLE,  /* the sgemm route: inputs rounded to bf16 values held in fp32, then ds_cpu_sgemm */
} ds_bf16_path;

/* The route of DS_BF16_AUTO, decided once per process from $DSPARK_BF16_GEMM:
 *   native  oneDNN's bf16 matmul (and MKL's for large frozen weights) wherever the build has
 *           oneDNN and the CPU runs bf16 natively (AVX512_BF16 or AMX);
 *   sgemm   the sgemm route (cpu_gemm_bf16_sgemm.c), the same numbers up to summation order;
 *   auto    (default) native on a CPU with AMX, the sgemm route elsewhere: without AMX the native
 *           bf16 kernels measured slower than the fp32 GEMM (at most 220 against 210-305
 *           GFLOP/s; cpu_gemm_bf16_sgemm.c).
 * The tile products of the bf16 attention (ds_bf16_tile_gemm_*) use the native kernels whenever
 * they are there: small tiles in cache, where they measured faster than the fp32 attention. */

/* dst[r, 0:c] (packed, row stride c) = src[r, 0:c] (row stride lds) rounded to bf16: as bits
 * (bits != 0) or as fp32 values (cpu_gemm_bf16_held.c, with the held operands' copies). */
void ds_bf16_round_rows(void *dst, int bits, const float *src, int64_t rows, int64_t cols, int64_t lds);

/* The sgemm route of ds_cpu_gemm_bf16 (same arguments) and of ds_cpu_gemm_bf16_frozen (same
 * arguments; m, n, k > 0): W converted a band of rows at a time, no copy of it kept. */
void ds_bf16_sgemm(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *Bf,
                   const uint16_t *Bh, int64_t ldb, float beta, float *C, int64_t ldc);
/* ... with B given already rounded to bf16 values held in fp32 (a frozen F32 weight's rounded
 * copy): only A is rounded. */
void ds_bf16_sgemm_rounded_b(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda,
                             const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
/* C[m, n] = bf16(A[m, k]) @ W^T + beta * C on W's MKL-packed copy of bf16 values in fp32
 * (cpu_gemm_mkl.h: ds_mkl_sgemm_pack of the rounded W). */
void ds_bf16_sgemm_mkl_packed(int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *packed,
                              float beta, float *C, int64_t ldc);
void ds_bf16_sgemm_frozen(int tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *Bf,
                          const uint16_t *Bh, float beta, float *C, int64_t ldc);
/* ... and of ds_cpu_gemm_bf16_frozen_cat (same arguments; m, k and the rows > 0): A rounded once,
 * the bands filled across segments, so q, k and v run as one wide product. */
void ds_bf16_sgemm_frozen_cat(int64_t m, const void *const *segs, int f32, const int64_t *rows, int n_seg, int64_t k,
                              const float *A, int64_t lda, float beta, float *C, int64_t ldc);

/* C[m, n] = bf16(op(A)) @ bf16(op(B)) + beta * C with fp32 accumulation and output; shapes and
 * flags as ds_cpu_sgemm (cpu_kernels.h), beta 0 or 1. Exactly one of Bf (fp32, rounded to
 * bf16 here) and Bh (bf16 bits, used as they are) is non-NULL. A is always fp32. */
void ds_cpu_gemm_bf16(ds_bf16_path path, int ta, int tb, int64_t m, int64_t n, int64_t k, const float *A,
                      int64_t lda, const float *Bf, const uint16_t *Bh, int64_t ldb, float beta, float *C,
                      int64_t ldc);

/* C[m, n] = bf16(A[m, k]) @ B + beta * C for a frozen weight W (contiguous; exactly one of
 * Bf / Bh): B = bf16(W[n, k])^T when tb (a forward, x @ W^T), B = bf16(W[k, n]) otherwise (the
 * input gradient, dy @ W). On the native route, W's packed bf16 copy for that use (ds_release_packed_weights
 * in include/dspark/backend.h) when there is room under the cap, else ds_cpu_gemm_bf16 in place;
 * on the sgemm route an F32 W's rounded copy (one for both uses, from its second use, under the
 * same cap), else ds_bf16_sgemm_frozen (a BF16 W keeps no fp32 copy). The same bf16 values
 * either way. */
void ds_cpu_gemm_bf16_frozen(int tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *Bf,
                             const uint16_t *Bh, float beta, float *C, int64_t ldc);

/* C[m, sum rows] = bf16(A[m, k]) @ [W_0; W_1; ...]^T + beta * C for frozen weights stored
 * apart (segs[s]: rows[s] x k, contiguous; all F32 when f32, else all BF16 bits): one product
 * over the packed copy of their concatenation from its second use (under the cap), else
 * ds_cpu_gemm_bf16_frozen per segment. The same bf16 values either way. */
void ds_cpu_gemm_bf16_frozen_cat(int64_t m, const void *const *segs, int f32, const int64_t *rows, int n_seg, int64_t k,
                                 const float *A, int64_t lda, float beta, float *C, int64_t ldc);

/* The cpu backend's operand_hold / operand_release (include/dspark/backend.h): a held fp32
 * operand (A, or an fp32 B) is rounded once into a copy kept until its release, for each stored
 * shape it is read with (bf16 bits for the native route, bf16 values in fp32 for the sgemm one). */
void ds_cpu_bf16_hold(const float *p, size_t n);
void ds_cpu_bf16_release(const float *p);
/* A held operand's copy: the stored matrix src[rows, cols] (row stride ld) rounded to bf16,
 * packed (row stride cols), as bits or (f32) as bf16 values held in fp32; made by the first
 * product that reads it with this shape and kept; NULL when src is not held (or no memory). */
const void *ds_bf16_held_copy(const float *src, int64_t rows, int64_t cols, int64_t ld, int f32);

/* Products of operands already in bf16 for kernels that run their own tiles in an OpenMP
 * region (the attention under DS_COMPUTE_BF16): C[m, n] (row stride ldc, overwritten) =
 * A[m, k] (row stride lda) @ B, B stored [k, n] (tb = 0) or [n, k] (tb = 1) with row stride
 * ldb, fp32 accumulation. _get, from any thread, returns the product's primitive (made on first
 * use and kept for the life of the process), or NULL when oneDNN's native bf16 kernels are not
 * there or its table of shapes is full: the caller then runs its fp32 path. _run may be called
 * from many threads at once (each runs single-threaded inside the caller's parallel region). */
typedef struct ds_bf16_tile_gemm ds_bf16_tile_gemm;
const ds_bf16_tile_gemm *ds_bf16_tile_gemm_get(int tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                                               int64_t ldc);
void ds_bf16_tile_gemm_run(const ds_bf16_tile_gemm *g, const uint16_t *A, const uint16_t *B, float *C);

/* 1 when DS_BF16_AUTO runs oneDNN's native bf16 kernels (not the sgemm route). */
int ds_gemm_bf16_native(void);

/* 1 when ds_bf16_tile_gemm_get can hand out native products (oneDNN's bf16 kernels are there). */
int ds_bf16_tiles_native(void);

/* Rows at or above which the cpu backend's matmuls take the bf16 GEMM under DS_COMPUTE_BF16;
 * below, the fp32 paths run (the numbers then carry no bf16 rounding at all). Measured with
 * bench/bench_gemm_bf16 (2 threads, AMX, W 2304x768 and 768x2048; docs/performance.md, "GEMM
 * kernels"): with a trainable fp32 weight, rounded on every call, bf16 wins from 8-16 rows
 * (16 rows: 82 vs 42-72 GFLOP/s; 1 row: 5 vs 14); on a frozen BF16 weight, read in place, from
 * 8 rows (114-127 vs 85 for the direct 16-bit kernels; 4 rows: 63 vs 76); for the weight
 * gradient dW += dy^T x (k = rows) from 32 rows (126-231 vs 124-134; 16 rows: 65-69 vs 82-109). */
enum { DS_BF16_MIN_ROWS_F32W = 16, DS_BF16_MIN_ROWS_BF16W = 8, DS_BF16_MIN_ROWS_DW = 32 };

/* The cpu backend's product with an fp32 operand B (an fp32 weight, or a quantized weight's
 * dequantized tile): under DS_COMPUTE_BF16 with at least min_rows rows, the bf16 GEMM (B rounded
 * on the way in); otherwise the fp32 one, unchanged. Shapes and flags as ds_cpu_sgemm. */
void ds_cpu_matmul_w(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *B,
                     int64_t ldb, float beta, float *C, int64_t ldc, int64_t rows, int64_t min_rows);

#if defined(DSPARK_GEMM_ONEDNN)
#include <oneapi/dnnl/dnnl.h>
/* The logical B[k, n] of a product (bf16; W[n, k] when tb, W[k, n] otherwise, contiguous) into
 * dst (bytes) in the layout md when md is one of the AMX weight layouts; 0 for any other layout
 * (cpu_gemm_bf16_amx.c). */
int ds_pack_amx(const dnnl_memory_desc_t *md, const uint16_t *w, int tb, int64_t n, int64_t k, uint16_t *dst,
                size_t bytes);
#endif

#endif
