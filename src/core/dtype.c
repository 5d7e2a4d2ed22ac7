#include "dspark/dtype.h"

#include <math.h>
#include <string.h>

static const struct { const char *name; size_t size; } k_dtypes[DS_DTYPE_COUNT] = {
    [DS_F32] = {"F32", 4}, [DS_F16] = {"F16", 2}, [DS_BF16] = {"BF16", 2},
    [DS_F64] = {"F64", 8}, [DS_I64] = {"I64", 8}, [DS_I32] = {"I32", 4},
    [DS_I16] = {"I16", 2}, [DS_I8] = {"I8", 1},   [DS_U8] = {"U8", 1},
    [DS_BOOL] = {"BOOL", 1},
    /* block-quantized: no element size (ggml_quant.h has their blocks) */
    [DS_Q8_0] = {"Q8_0", 0}, [DS_Q4_0] = {"Q4_0", 0}, [DS_Q4_1] = {"Q4_1", 0},
    [DS_Q4_K] = {"Q4_K", 0}, [DS_Q6_K] = {"Q6_K", 0}, [DS_Q5_0] = {"Q5_0", 0}, [DS_Q5_1] = {"Q5_1", 0},
};

size_t ds_dtype_size(ds_dtype dt) { return (unsigned)dt < DS_DTYPE_COUNT ? k_dtypes[dt].size : 0; }
const char *ds_dtype_name(ds_dtype dt) { return (unsigned)dt < DS_DTYPE_COUNT ? k_dtypes[dt].name : "?"; }

int ds_dtype_from_name(const char *name, ds_dtype *out) {
  for (int i = 0; i <= DS_BOOL; i++) /* a safetensors name: never a quantized type */
    if (strcmp(name, k_dtypes[i].name) == 0) { *out = (ds_dtype)i; return 1; }
  return 0;
}

static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float ds_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t ds_f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
  return (uint16_t)(u >> 16);
}

float ds_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (man << 13));
  if (exp == 0) { /* zero or subnormal: value = man * 2^-24 */
    float v = (float)man * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

uint16_t ds_f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;                 /* NaN */
  if (a >= 0x477ff000u) return sign | 0x7c00u;                /* overflow (rounds to inf) */
  if (a < 0x38800000u) {                                      /* subnormal or zero in f16 */
    /* Scale into the integer mantissa and let the FPU round to nearest even. */
    float v = bits_f32(a) * 16777216.0f; /* 2^24 */
    return sign | (uint16_t)lrintf(v);
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - (112u << 23);
  return sign | (uint16_t)(r >> 13);
}

ds_status ds_convert_to_f32(float *dst, const void *src, ds_dtype src_dtype, size_t n) {
  const unsigned char *s = (const unsigned char *)src;
  switch (src_dtype) {
    case DS_F32: memcpy(dst, src, n * 4); return DS_OK;
    case DS_BF16:
      for (size_t i = 0; i < n; i++) { uint16_t h; memcpy(&h, s + 2 * i, 2); dst[i] = ds_bf16_to_f32(h); }
      return DS_OK;
    case DS_F16:
      for (size_t i = 0; i < n; i++) { uint16_t h; memcpy(&h, s + 2 * i, 2); dst[i] = ds_f16_to_f32(h); }
      return DS_OK;
    case DS_F64:
      for (size_t i = 0; i < n; i++) { double d; memcpy(&d, s + 8 * i, 8); dst[i] = (float)d; }
      return DS_OK;
    default:
      return DS_FAIL(DS_ERR_UNSUPPORTED, "cannot convert dtype %s to F32", ds_dtype_name(src_dtype));
  }
}

ds_status ds_convert_from_f32(void *dst, ds_dtype dst_dtype, const float *src, size_t n) {
  unsigned char *d = (unsigned char *)dst;
  switch (dst_dtype) {
    case DS_F32: memcpy(dst, src, n * 4); return DS_OK;
    case DS_BF16:
      for (size_t i = 0; i < n; i++) { uint16_t h = ds_f32_to_bf16(src[i]); memcpy(d + 2 * i, &h, 2); }
      return DS_OK;
    case DS_F16:
      for (size_t i = 0; i < n; i++) { uint16_t h = ds_f32_to_f16(src[i]); memcpy(d + 2 * i, &h, 2); }
      return DS_OK;
    default:
      return DS_FAIL(DS_ERR_UNSUPPORTED, "cannot store F32 values as dtype %s", ds_dtype_name(dst_dtype));
  }
}
