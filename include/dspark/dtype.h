/* fp16 / bf16 <-> fp32 conversion. Rounding is round-to-nearest-even, as torch does. */
#ifndef DSPARK_DTYPE_H
#define DSPARK_DTYPE_H

#include "dspark/common.h"

#ifdef __cplusplus
extern "C" {
#endif

float ds_bf16_to_f32(uint16_t h);
uint16_t ds_f32_to_bf16(float f);
float ds_f16_to_f32(uint16_t h);
uint16_t ds_f32_to_f16(float f);

/* Converts n elements of a float dtype (F32/F16/BF16/F64) to fp32. src may be unaligned. */
ds_status ds_convert_to_f32(float *dst, const void *src, ds_dtype src_dtype, size_t n);
/* Converts n fp32 values to a float storage dtype (F32/F16/BF16). */
ds_status ds_convert_from_f32(void *dst, ds_dtype dst_dtype, const float *src, size_t n);

#ifdef __cplusplus
}
#endif
#endif
