/* Internal to the CPU backend: the kernels behind linear_w / linear_w_backward / embedding_w on
 * BF16 and F16 weights (cpu_linear16.c), in both regimes and for each instruction set, so the
 * tests can run every path the CPU has against the reference kernels. Not a public header;
 * the contracts of the backend entries are in include/dspark/backend.h.
 *
 * Two regimes, one result (fp32 products of exactly converted weights, fp32 accumulation):
 *   direct   reads each weight row once and converts it on the fly in registers: the decode
 *            regime (a few rows of x), where the matmul is bound by reading the weights;
 *   chunked  converts chunk_rows rows of the weight at a time into an fp32 scratch of
 *            chunk_rows * in floats and hands them to ds_gemm_f32: the prefill / training
 *            regime (many rows), where the conversion is amortized over the rows of x and the
 *            compute runs at fp32 GEMM speed. Its result is the fp32 GEMM's on the converted
 *            weights, bit for bit, when chunk_rows covers the whole weight. */
#ifndef DSPARK_NN_CPU_LINEAR16_H
#define DSPARK_NN_CPU_LINEAR16_H

#include "dspark/backend.h"
#include "nn/cpu_isa.h"


/* The forward takes the direct path for at most DS_LINEAR16_DIRECT_MAX_ROWS rows of x (decode,
 * speculative verification), and for more while x stays within DS_LINEAR16_DIRECT_MAX_X_BYTES
 * (it is re-read from cache for every block of weight rows: measured on Qwen3-1.7B's shapes on
 * an Intel Xeon, the direct path beats convert + fp32 GEMM up to about 1 MiB of x, 128 rows of
 * 2048) or, on AMD CPUs, for at most DS_LINEAR16_DIRECT_MAX_ROWS_AMD rows: there the direct
 * kernel's FMAs run at half an Intel core's width, and on an EPYC Zen 4 the chunked path tied
 * with it at 32 rows and ran 1.5-2.3x faster from 64 rows up, on SmolLM2's and Qwen3-1.7B's
 * shapes alike (the teacher logits of a draft over SmolLM2's BF16 lm_head, 128 rows: 78 against
 * 44 ms); the backward up to DS_LINEAR16_BWD_DIRECT_MAX_ROWS rows; the chunked path otherwise. */
enum {
  DS_LINEAR16_DIRECT_MAX_ROWS = 8,
  DS_LINEAR16_DIRECT_MAX_X_BYTES = 1 << 20,
  DS_LINEAR16_DIRECT_MAX_ROWS_AMD = 32,
  DS_LINEAR16_BWD_DIRECT_MAX_ROWS = 4
};
/* The forward's choice above for n rows of x of width in: 1 for the direct path. */
int ds_linear16_direct_wins(int64_t n, int64_t in);
/* The chunk the backend entries use: about 16 MiB of fp32 rows (at least 16 rows, a multiple of
 * 16). Fewer, larger GEMM calls pay off: each call packs x again and synchronizes the threads
 * (Qwen3-1.7B's gate_up and down at 512 rows, 2 threads: 4 MiB chunks took 1.2-2.3x the fp32
 * GEMM's time, more the busier the machine; 16 MiB chunks about 1.3x on the busy machine). */
int64_t ds_linear16_chunk_rows(int64_t in, int64_t out);

/* dst[count] = src[count] (BF16 or F16 bits) as fp32, exactly (the F16C / AVX-512 conversion
 * quiets a signaling F16 NaN; the portable one keeps its payload). */
void ds_convert16(ds_isa isa, float *dst, const uint16_t *src, int64_t count, ds_dtype dtype);

/* y[n, out] (row stride ldy) = x[n, in] @ w[out, in]^T (+ bias[out]); w is BF16 or F16. */
void ds_linear16_direct(ds_isa isa, float *y, int64_t ldy, const float *x, ds_weight w, const float *bias, int64_t n,
                        int64_t in, int64_t out);
/* The same over n_seg (<= 8) weights stored apart (each BF16, F16 or, for
 * ds_cpu_linear_f32_rows, F32; out[s] rows), segment s
 * writing its out[s] columns of y after the previous ones, in one parallel region. */
void ds_linear16_direct_cat(ds_isa isa, float *y, int64_t ldy, const float *x, const ds_weight *w, const int64_t *out,
                            int n_seg, const float *bias, int64_t n, int64_t in);
/* The same through ds_gemm_f32 with a chunk_rows x in fp32 scratch. Returns 0 (nothing
 * written) when the scratch cannot be allocated, 1 otherwise. */
int ds_linear16_chunked(ds_isa isa, float *y, int64_t ldy, const float *x, ds_weight w, const float *bias, int64_t n,
                        int64_t in, int64_t out, int64_t chunk_rows);

/* dx[n, in] += dy[n, out] @ w[out, in]; w is BF16 or F16. The direct path is plain C (each
 * thread owns a band of dx's columns and streams the weight once); the chunked one converts
 * chunk_rows rows at a time and accumulates ds_gemm_f32 products chunk by chunk (returns 0,
 * nothing written, when its scratch cannot be allocated). */
void ds_linear16_backward_direct(float *dx, const float *dy, ds_weight w, int64_t n, int64_t in, int64_t out);
int ds_linear16_backward_chunked(ds_isa isa, float *dx, const float *dy, ds_weight w, int64_t n, int64_t in,
                                 int64_t out, int64_t chunk_rows);

/* A frozen F32 weight (or n_seg <= 8 of them sharing x) at decode: at most
 * DS_F32_DIRECT_MAX_ROWS rows of x, each weight row streamed once through the direct kernels
 * above (the 16-bit ones reading fp32), the best instruction set. SmolLM2 as fp32 decoded 26
 * tokens/s through oneDNN's GEMM (14 GB/s of a 30 GB/s stream) and 43 this way on 1 thread of
 * an AMD EPYC Zen 4, 1.17x faster on 2 threads. From 5 rows of x the GEMM is faster on 1 thread
 * there (8 rows: 50 against 57-65 ms; even on 2), but a row of x gets the same sums here alone as
 * beside others, so a verification's rows equal their decodes, as on 16-bit and quantized
 * weights: that decides the limit. */
enum { DS_F32_DIRECT_MAX_ROWS = 8 };
void ds_cpu_linear_f32_rows(float *y, int64_t ldy, const float *x, const ds_weight *w, const int64_t *out, int n_seg,
                            const float *bias, int64_t n, int64_t in);

/* The cpu backend's entries for 16-bit weights: the path by the number of rows, the best
 * instruction set; the direct path when a chunk's scratch cannot be allocated. */
void ds_cpu_linear16(float *y, int64_t ldy, const float *x, ds_weight w, const float *bias, int64_t n, int64_t in,
                     int64_t out);
void ds_cpu_linear16_backward(float *dx, const float *dy, ds_weight w, int64_t n, int64_t in, int64_t out);
/* linear_w_cat on 16-bit segments when they do not run as one bf16 GEMM: the direct path over
 * all of them in one parallel region (decode), else ds_cpu_linear16 per segment. */
void ds_cpu_linear16_cat(float *y, int64_t ldy, const float *x, const ds_weight *w, const int64_t *out, int n_seg,
                         const float *bias, int64_t n, int64_t in);
/* y[n, d] = table[ids[i]] for a table in any of F32 / BF16 / F16. */
void ds_cpu_embedding_w(float *y, const int32_t *ids, ds_weight table, int64_t n, int64_t d);

#endif
