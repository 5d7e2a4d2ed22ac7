/* CUDA emulation (see cuda_runtime.h): the half conversions the backend uses. */
#ifndef DSPARK_CUDA_EMU_FP16_H
#define DSPARK_CUDA_EMU_FP16_H
#include "cuda_runtime.h"
struct __half {
  unsigned short x;
};
static inline __half __ushort_as_half(unsigned short h) { return __half{h}; }
float __half2float(__half h);
#endif
