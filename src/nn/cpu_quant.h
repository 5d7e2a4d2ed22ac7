/* Internal to the CPU backend: the kernels behind linear_w / linear_w_backward / embedding_w on
 * frozen weights in GGUF's block-quantized types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K; layouts in
 * dspark/ggml_quant.h), in both regimes and for each instruction set, so the tests can run
 * every path the CPU has against the naive reference. Not a public header.
 *
 * Two regimes:
 *   direct   (decode, verification: few rows of x) x is quantized per block of 32 values to
 *            int8 with one fp32 scale (d = max|x| / 127, q = round(x / d)), and each weight
 *            row is read once, its blocks dotted with x's in integers (AVX2 maddubs, AVX-512
 *            VNNI dpbusd, or plain C), each block's integer sum scaled in fp32. The result is
 *            that of the weights' exact values times x rounded to 8 bits per block: per output,
 *            |y - y_ref| <= sum over x's blocks of (d_block / 2) * sum |w| over the block
 *            (the error of each rounded x is at most half a step), plus fp32 rounding.
 *   chunked  (prefill, capture: many rows) chunk_rows rows of W dequantized to fp32 (the
 *            exact values, ds_ggml_dequantize_row) into a scratch, multiplied by ds_gemm_f32:
 *            x stays fp32; the reference's numbers up to fp32 summation order.
 * Activations are quantized per 32 for every type, the K-quants included (llama.cpp uses one
 * scale per 256 for them): a K-quant's sub-blocks are 32 (Q4_K) or 16 (Q6_K) values with their
 * own scales anyway, so this costs one fp32 multiply per sub-block and rounds x more finely. */
#ifndef DSPARK_NN_CPU_QUANT_H
#define DSPARK_NN_CPU_QUANT_H

#include "dspark/backend.h"
#include "dspark/ggml_quant.h"

enum { DS_QX_BLOCK = 32 };

/* The little-endian 32 bits at p (a Q5 block's mask of fifth bits). */
static inline uint32_t ds_quant_le32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* x[n, in] quantized per block of 32 (in a multiple of 32). */
typedef struct {
  int8_t *q;  /* (n, in) */
  float *d;   /* (n, in / 32)  each block's step */
  int16_t *s; /* (n, in / 16)  sum of q over each 16 values (the offset and min terms) */
  float *m;   /* (n, in / 32)  d * sum of q over the block: the sum of x's rounded values there */
} ds_qx;

/* The instruction sets of these kernels: AVX2 a weight row at a time (cpu_quant_avx2.c);
 * AVX2_PACKED the AVX2 kernel on 8-row packed copies of the packable types (below;
 * cpu_quant_avx2_packed.c), the row kernel for the last rows of a weight whose count is not a
 * multiple of 8; VNNI is AVX-512 VNNI (with VL and BW): the same packed kernel with dpbusd
 * (cpu_quant_vnni_packed.c), and for those last rows Q4_0 / Q4_1 / Q4_K / Q6_K at 512 bits with
 * 16 weight rows across the lanes, Q8_0 / Q5_0 / Q5_1 a row at a time (cpu_quant_avx512.c). */
typedef enum { DS_QISA_PORTABLE = 0, DS_QISA_AVX2, DS_QISA_AVX2_PACKED, DS_QISA_VNNI } ds_qisa;
ds_qisa ds_qisa_best(void); /* what this CPU runs, capped by $DSPARK_MAX_ISA as ds_isa_best */
const char *ds_qisa_name(ds_qisa isa);

/* The direct path for at most this many rows of x, the chunked one above. Per matrix
 * (bench_quant, SmolLM2-135M's shapes, 1 thread) the chunked path looked cheaper from 12 rows,
 * but on whole decode steps it is not: `generate --data` of 16 requests on SmolLM2 Q4_1 (2
 * threads, AMD EPYC with VNNI) decoded 69 tokens/s chunked against 254 direct, as each step
 * dequantizes every matrix again; 32 requests ran 322 direct. A row's numbers on the direct path
 * do not depend on the other rows of its call (the causal attention's row-by-row limit, 8 in
 * cpu_attention.c, is what keeps verification equal to plain decoding). */
enum { DS_QUANT_DIRECT_MAX_ROWS = 32 };

/* qx's buffers for n rows of in values (malloc'd, NULL on failure) and x quantized into them. */
int ds_qx_alloc(ds_qx *qx, int64_t n, int64_t in);
void ds_qx_free(ds_qx *qx);
void ds_qx_quantize(ds_qx *qx, const float *x, int64_t n, int64_t in);
/* The two implementations ds_qx_quantize chooses between (AVX2 where the CPU has it), equal bit for
 * bit: the same numbers in C and in vectors of 32. */
void ds_qx_quantize_portable(ds_qx *qx, const float *x, int64_t n, int64_t in);
void ds_qx_quantize_avx2(ds_qx *qx, const float *x, int64_t n, int64_t in);

/* One instruction set's row kernel: y[i, o] (row stride ldy) = dot(w row o, qx row i)
 * (+ bias[o]) for i < n, o in [o0, o1); w holds rows of row_bytes (dtype dt, in values each). */
typedef void (*ds_quant_rows_fn)(float *y, int64_t ldy, const ds_qx *x, int64_t n, const unsigned char *w,
                                 ds_dtype dt, int64_t in, int64_t o0, int64_t o1, const float *bias);
void ds_quant_rows_portable(float *y, int64_t ldy, const ds_qx *x, int64_t n, const unsigned char *w, ds_dtype dt,
                            int64_t in, int64_t o0, int64_t o1, const float *bias);
void ds_quant_rows_avx2(float *y, int64_t ldy, const ds_qx *x, int64_t n, const unsigned char *w, ds_dtype dt,
                        int64_t in, int64_t o0, int64_t o1, const float *bias);
void ds_quant_rows_vnni(float *y, int64_t ldy, const ds_qx *x, int64_t n, const unsigned char *w, ds_dtype dt,
                        int64_t in, int64_t o0, int64_t o1, const float *bias);

/* The 8-row packed layout of a quantized weight [rows, in] (its first 8 * groups rows), every
 * type: group g (rows 8g .. 8g+7), block b (values 32b .. 32b+31; the K-quants' super-blocks of
 * 256) at byte (g * in / K + b) * 8 * B, K the block's values and B its bytes (Q4_0 18, Q4_1 20,
 * Q5_0 22, Q5_1 24, Q8_0 34, Q4_K 144, Q6_K 210), so the copy is as large as the rows it packs.
 * A "chunk" is 32 bytes holding 4 stored bytes of each row, row r's at 4r .. 4r+3. In order:
 *   d[8]     f16, row r's scale at 2r (then Q4_1's / Q5_1's m[8], Q4_K's dmin[8])
 *   e[8]     Q5 only: row r's 32 fifth bits at 4r .. 4r+3, reordered so that byte k bit c holds
 *            value (c < 4 ? 0 : 16) + 4 (c % 4) + k: chunk j's low nibbles find theirs at bit j
 *            of each byte, its high nibbles at bit 4 + j (one shift and a mask each)
 *   sc       Q4_K: its 12 bytes of 6-bit scales and mins; Q6_K: its 16 int8 scales; byte i of
 *            row r at 8 i + r (8 rows' scale of a sub-block decode at once)
 *   quants   chunk j = stored quant bytes 4j .. 4j+3: Q8_0 values 4j .. 4j+3 (8 chunks); Q4 / Q5
 *            low nibbles values 4j .. 4j+3, high nibbles 16 + 4j .. (4 chunks); Q4_K its 128
 *            bytes (32 chunks: sub-block 2g in chunks 8g .. 8g+7's low nibbles, 2g + 1 high);
 *            Q6_K its ql[128] then qh[64] (32 + 16 chunks)
 * Packing moves bytes (and Q5's mask bits) only: the packed kernel reads the stored values,
 * scales and offsets, and ds_quant_unpack_row gives a row's stored bytes back. */
int ds_quant_packable(ds_dtype dt); /* Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K */
void ds_quant_pack8(unsigned char *dst, const unsigned char *w, ds_dtype dt, int64_t groups, int64_t in);
/* The packed copy of w's first rows / 8 * 8 rows, made on first use (parallel over groups) and kept
 * for the process, keyed by w's address, type and shape (ds_release_packed_weights() frees the
 * copies); NULL for a type without the layout, fewer than 8 rows, or no memory (then for good:
 * a weight's products never change kernel midway). Thread-safe. From then on every reader of
 * those rows reads the copy (the chunked path and embedding lookups through
 * ds_quant_unpack_row), so when w lies in a file mapping its pages of them are dropped
 * (ds_release_mapped_pages): the weight is resident once. */
const unsigned char *ds_quant_packed(ds_weight w, int64_t rows, int64_t in);
/* The packed copy already made for the weight at data (type dt, rows of in values), NULL when
 * none; *rows_packed = the rows it holds (a multiple of 8). */
const unsigned char *ds_quant_packed_find(const void *data, ds_dtype dt, int64_t in, int64_t *rows_packed);
/* Row r (< the rows packed) in its stored bytes (ds_quant_row_bytes(dt, in)), read back from the copy. */
void ds_quant_unpack_row(unsigned char *row, const unsigned char *packed, ds_dtype dt, int64_t in, int64_t r);
size_t ds_quant_packed_bytes(void);
void ds_quant_release_packs(void);
/* y[i, o] (+ bias[o]) for i < n and o in [o0, o1) (multiples of 8) from the packed copy; with
 * prefetch > 0, the first pass over each group of 8 weight rows (up to 4 rows of x; the pass over
 * two groups from 8 rows keeps its own prefetch) asks for the bytes that far ahead of each block. */
void ds_quant_packed_rows_avx2(float *y, int64_t ldy, const ds_qx *x, int64_t n, const unsigned char *packed,
                               ds_dtype dt, int64_t in, int64_t o0, int64_t o1, const float *bias, size_t prefetch);
void ds_quant_packed_rows_vnni(float *y, int64_t ldy, const ds_qx *x, int64_t n, const unsigned char *packed,
                               ds_dtype dt, int64_t in, int64_t o0, int64_t o1, const float *bias, size_t prefetch);
/* The packed kernels' prefetch distance in bytes: ds_weight_prefetch_bytes (nn/cpu_isa.h), 0
 * where no CPU rule or $DSPARK_WEIGHT_PREFETCH sets one. On a Zen 5 one row of SmolLM2's decode
 * pass read 82-89% of the stream rate on one thread without it, 101-108% 8 KiB ahead. */
size_t ds_quant_prefetch_bytes(void);

/* y[n, sum(out)] (row stride ldy) = x[n, in] @ [w[0]; w[1]; ...]^T (+ bias), each segment a
 * quantized weight [out[s], in], segment s writing its columns after the previous ones, all in
 * one parallel region (a decode step's k and v are too small to pay a fork / join each).
 * Returns 0 (nothing written) when the quantized x cannot be allocated. */
int ds_quant_direct_cat(ds_qisa isa, float *y, int64_t ldy, const float *x, const ds_weight *w, const int64_t *out,
                        int n_seg, const float *bias, int64_t n, int64_t in);
/* Rows per chunk of the chunked path (see cpu_quant.c). */
int64_t ds_quant_chunk_rows(int64_t in, int64_t out);
/* y[n, out] (ldy) = x[n, in] @ w[out, in]^T (+ bias) through ds_gemm_f32 on chunk_rows
 * dequantized rows at a time. Returns 0 (nothing written) when the scratch cannot be allocated. */
int ds_quant_chunked(float *y, int64_t ldy, const float *x, ds_weight w, const float *bias, int64_t n, int64_t in,
                     int64_t out, int64_t chunk_rows);
/* dst[rows, in] = rows [r0, r0 + rows) of w dequantized (in parallel over rows). */
void ds_quant_dequantize_rows(float *dst, ds_weight w, int64_t in, int64_t r0, int64_t rows);

/* The cpu backend's entries on quantized weights: direct or chunked by the rows of x, the best
 * instruction set; the backward dx[n, in] += dy[n, out] @ w always dequantizes chunks into the
 * GEMM (only a frozen table's backward, rare: a draft's head is never quantized); the
 * embedding dequantizes the rows it looks up. */
void ds_cpu_linear_quant(float *y, int64_t ldy, const float *x, ds_weight w, const float *bias, int64_t n,
                         int64_t in, int64_t out);
void ds_cpu_linear_quant_cat(float *y, int64_t ldy, const float *x, const ds_weight *w, const int64_t *out, int n_seg,
                             const float *bias, int64_t n, int64_t in);
void ds_cpu_linear_quant_backward(float *dx, const float *dy, ds_weight w, int64_t n, int64_t in, int64_t out);
void ds_cpu_embedding_quant(float *y, const int32_t *ids, ds_weight table, int64_t n, int64_t d);
/* The backend's prepare_weight on a quantized weight [rows, in]: where this CPU's kernels read a
 * repacked copy (the 8-row layout of Q4_0 / Q4_1 / Q8_0) it is made now, and the weight's own
 * pages are dropped when they lie in a file mapping (ds_release_mapped_pages): a GGUF's matrix
 * is then held once, and the first prefill reads the copy instead of faulting the file back in. */
void ds_cpu_prepare_quant_weight(ds_weight w, int64_t rows, int64_t in);

#endif
