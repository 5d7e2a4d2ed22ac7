/* ggml's block-quantized tensor types (src/core/ggml_quant.c): their numbering, block sizes,
 * and dequantization to fp32 that gives the gguf Python package's values to the bit
 * (gguf.quants). In core because both the GGUF reader (io) and the quantized matmuls of the
 * cpu backend (nn) read these blocks.
 *
 * A quantized frozen weight (ds_weight with dtype DS_Q8_0 ... DS_Q5_1, dspark/common.h) is
 * stored as GGUF stores it: row-major [rows, cols], each row cols / block blocks back to back,
 * no padding, no alignment (blocks are 18 to 210 bytes). */
#ifndef DSPARK_GGML_QUANT_H
#define DSPARK_GGML_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "dspark/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Tensor types (ggml's numbering); those with a name in ds_ggml_type_name are known to the
 * layout checks, those ds_ggml_type_dequantizable says yes to are converted. */
enum {
  DS_GGML_F32 = 0, DS_GGML_F16 = 1, DS_GGML_Q4_0 = 2, DS_GGML_Q4_1 = 3, DS_GGML_Q5_0 = 6, DS_GGML_Q5_1 = 7,
  DS_GGML_Q8_0 = 8, DS_GGML_Q2_K = 10, DS_GGML_Q3_K = 11, DS_GGML_Q4_K = 12, DS_GGML_Q5_K = 13, DS_GGML_Q6_K = 14,
  DS_GGML_I64 = 27, DS_GGML_BF16 = 30,
};

/* ggml types: the name ("Q4_K"; NULL for an unknown type), the block (elements, bytes: 0 when
 * unknown) and whether ds_gguf_dequantize converts it. */
const char *ds_ggml_type_name(uint32_t type);
void ds_ggml_type_block(uint32_t type, int64_t *block_elems, size_t *block_bytes);
int ds_ggml_type_dequantizable(uint32_t type);

/* n values (a multiple of the type's block) of blocks at src (no checks: the caller's). */
void ds_ggml_dequantize_row(uint32_t type, const void *src, float *dst, int64_t n);

/* n values (a multiple of 32) to Q8_0 blocks at dst (n / 32 * 34 bytes), as ggml's reference
 * quantizer and gguf.quants write them, to the bit. */
void ds_ggml_quantize_q8_0(const float *x, void *dst, int64_t n);

/* Q4_K / Q5_K: the 6-bit scales and mins of the 8 sub-blocks of 32 from a block's 12 scale bytes. */
void ds_ggml_q4k_scales(const unsigned char *s12, uint8_t sc[8], uint8_t mn[8]);

/* The quantized ds_dtypes and ggml's types: the ggml type of a quantized dtype (-1 for any
 * other dtype), the dtype of a ggml type kept quantized in place (0 when there is none: DS_F32
 * is not quantized), and the bytes of one row of `cols` values (cols a multiple of the block). */
int ds_dtype_ggml_type(ds_dtype dt);
int ds_dtype_of_ggml_type(uint32_t type, ds_dtype *out);
int ds_dtype_is_quantized(ds_dtype dt);
size_t ds_quant_row_bytes(ds_dtype dt, int64_t cols);
int64_t ds_quant_block(ds_dtype dt); /* values per block (32 or 256), 0 for an unquantized dtype */
/* -1 when every block of the rows x cols weight in dt (quantized) has finite scales (and mins),
 * so every value it dequantizes to is finite; else the first row with a NaN or infinite one. */
int64_t ds_quant_first_nonfinite_row(ds_dtype dt, const void *data, int64_t rows, int64_t cols);

#ifdef __cplusplus
}
#endif
#endif
