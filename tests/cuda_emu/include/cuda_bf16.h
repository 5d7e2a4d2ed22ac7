/* CUDA emulation (see cuda_runtime.h): the bf16 type and its rounding conversion. */
#ifndef DSPARK_CUDA_EMU_BF16_H
#define DSPARK_CUDA_EMU_BF16_H
#include "cuda_runtime.h"
struct __nv_bfloat16 {
  unsigned short x;
};
__nv_bfloat16 __float2bfloat16_rn(float f);
#endif
