/* ggml's tensor types (include/dspark/ggml_quant.h): block sizes, and dequantization to fp32 that gives
 * the gguf Python package's values to the bit (gguf.quants): the same fp32 operations in the
 * same order, each rounded on its own (this file is compiled with -ffp-contract=off: a fused
 * multiply-add would round once where numpy rounds twice).
 *
 * Blocks (little-endian; d, dmin, m are IEEE halves):
 *   Q4_0  32 values: d, 16 bytes of nibbles (values 0-15 low, 16-31 high)      x = d * (q - 8)
 *   Q4_1  32: d, m, 16 bytes of nibbles                                         x = d * q + m
 *   Q5_0  32: d, u32 of high bits (bit j: value j), 16 bytes of nibbles         x = d * (q - 16)
 *   Q5_1  32: d, m, u32 of high bits, 16 bytes of nibbles                       x = d * q + m
 *   Q8_0  32: d, 32 int8                                                        x = q * d
 *   Q4_K 256: d, dmin, 12 bytes of 6-bit scales and mins of 8 sub-blocks of 32, 128 bytes of
 *             nibbles (bytes 32g..32g+31: sub-block 2g low, 2g+1 high)   x = (d*sc) * q - dmin*mn
 *   Q5_K 256: as Q4_K, then 32 bytes of high bits (bit j of byte l: sub-block j, value l)
 *   Q6_K 256: 128 bytes of low nibbles, 64 of 2-bit highs, 16 int8 scales (one per 16 values),
 *             d                                                             x = (d * sc) * (q - 32) */
#include <math.h>
#include <string.h>

#include "dspark/dtype.h"
#include "dspark/ggml_quant.h"

typedef struct {
  uint32_t type;
  const char *name;
  int64_t block;
  size_t bytes;
  int dequantizable;
} type_info;

/* every type the layout checks know (gguf.constants.GGML_QUANT_SIZES); Q8_1 and Q8_K are
 * intermediate types llama.cpp never stores */
static const type_info k_types[] = {
    {0, "F32", 1, 4, 1},          {1, "F16", 1, 2, 1},          {2, "Q4_0", 32, 18, 1},
    {3, "Q4_1", 32, 20, 1},       {6, "Q5_0", 32, 22, 1},       {7, "Q5_1", 32, 24, 1},
    {8, "Q8_0", 32, 34, 1},       {9, "Q8_1", 32, 0, 0},        {10, "Q2_K", 256, 84, 0},
    {11, "Q3_K", 256, 110, 0},    {12, "Q4_K", 256, 144, 1},    {13, "Q5_K", 256, 176, 1},
    {14, "Q6_K", 256, 210, 1},    {15, "Q8_K", 256, 0, 0},      {16, "IQ2_XXS", 256, 66, 0},
    {17, "IQ2_XS", 256, 74, 0},   {18, "IQ3_XXS", 256, 98, 0},  {19, "IQ1_S", 256, 50, 0},
    {20, "IQ4_NL", 32, 18, 0},    {21, "IQ3_S", 256, 110, 0},   {22, "IQ2_S", 256, 82, 0},
    {23, "IQ4_XS", 256, 136, 0},  {24, "I8", 1, 1, 0},          {25, "I16", 1, 2, 0},
    {26, "I32", 1, 4, 0},         {27, "I64", 1, 8, 0},         {28, "F64", 1, 8, 0},
    {29, "IQ1_M", 256, 56, 0},    {30, "BF16", 1, 2, 1},        {34, "TQ1_0", 256, 54, 0},
    {35, "TQ2_0", 256, 66, 0},    {39, "MXFP4", 32, 17, 0},
};

static const type_info *info(uint32_t type) {
  for (size_t i = 0; i < sizeof k_types / sizeof k_types[0]; i++)
    if (k_types[i].type == type) return &k_types[i];
  return NULL;
}

const char *ds_ggml_type_name(uint32_t type) {
  const type_info *t = info(type);
  return t ? t->name : NULL;
}

void ds_ggml_type_block(uint32_t type, int64_t *block_elems, size_t *block_bytes) {
  const type_info *t = info(type);
  *block_elems = t ? t->block : 0;
  *block_bytes = t ? t->bytes : 0;
}

int ds_ggml_type_dequantizable(uint32_t type) {
  const type_info *t = info(type);
  return t && t->dequantizable;
}

/* ---------------------------------------------------------------- blocks */

static float half(const unsigned char *p) { return ds_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

static void q4_0(const unsigned char *b, float *y) { /* 18 bytes -> 32 */
  float d = half(b);
  for (int l = 0; l < 16; l++) {
    y[l] = d * (float)((b[2 + l] & 0xF) - 8);
    y[l + 16] = d * (float)((b[2 + l] >> 4) - 8);
  }
}

static void q4_1(const unsigned char *b, float *y) { /* 20 bytes -> 32 */
  float d = half(b), m = half(b + 2);
  for (int l = 0; l < 16; l++) {
    y[l] = d * (float)(b[4 + l] & 0xF) + m;
    y[l + 16] = d * (float)(b[4 + l] >> 4) + m;
  }
}

/* the 5-bit value j of a Q5 block: nibble | high bit j << 4 */
static int q5(const unsigned char *qh, const unsigned char *qs, int j) {
  uint32_t h;
  memcpy(&h, qh, 4);
  int lo = j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4;
  return lo | (int)((h >> j) & 1u) << 4;
}

static void q5_0(const unsigned char *b, float *y) { /* 22 bytes -> 32 */
  float d = half(b);
  for (int j = 0; j < 32; j++) y[j] = d * (float)(q5(b + 2, b + 6, j) - 16);
}

static void q5_1(const unsigned char *b, float *y) { /* 24 bytes -> 32 */
  float d = half(b), m = half(b + 2);
  for (int j = 0; j < 32; j++) y[j] = d * (float)q5(b + 4, b + 8, j) + m;
}

static void q8_0(const unsigned char *b, float *y) { /* 34 bytes -> 32 */
  float d = half(b);
  for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)b[2 + j] * d;
}

void ds_ggml_q4k_scales(const unsigned char *s, uint8_t sc[8], uint8_t mn[8]) {
  for (int j = 0; j < 8; j++) {
    if (j < 4) {
      sc[j] = s[j] & 63;
      mn[j] = s[j + 4] & 63;
    } else {
      sc[j] = (uint8_t)((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
      mn[j] = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
  }
}

/* Q4_K (qh NULL) and Q5_K: 144 / 176 bytes -> 256 */
static void qk_45(const unsigned char *b, const unsigned char *qh, const unsigned char *qs, float *y) {
  float d = half(b), dmin = half(b + 2);
  uint8_t sc[8], mn[8];
  ds_ggml_q4k_scales(b + 4, sc, mn);
  for (int j = 0; j < 8; j++) {
    float ds = d * (float)sc[j], dm = dmin * (float)mn[j];
    const unsigned char *q = qs + 32 * (j / 2);
    int shift = 4 * (j % 2);
    for (int l = 0; l < 32; l++) {
      int v = (q[l] >> shift) & 0xF;
      if (qh) v |= ((qh[l] >> j) & 1) << 4;
      y[32 * j + l] = ds * (float)v - dm;
    }
  }
}

static void q4_k(const unsigned char *b, float *y) { qk_45(b, NULL, b + 16, y); }
static void q5_k(const unsigned char *b, float *y) { qk_45(b, b + 16, b + 48, y); }

static void q6_k(const unsigned char *b, float *y) { /* 210 bytes -> 256 */
  const unsigned char *ql = b, *qh = b + 128;
  const int8_t *sc = (const int8_t *)(b + 192);
  float d = half(b + 208);
  for (int v = 0; v < 256; v++) {
    int group = v / 128, within = v % 128;
    int lo = (ql[64 * group + within % 64] >> (4 * (within / 64))) & 0xF;
    int hi = (qh[32 * group + within % 32] >> (2 * (within / 32))) & 3;
    y[v] = (d * (float)sc[v / 16]) * (float)((lo | hi << 4) - 32);
  }
}

void ds_ggml_dequantize_row(uint32_t type, const void *src, float *dst, int64_t n) {
  const unsigned char *b = src;
  switch (type) {
    case DS_GGML_F32: memcpy(dst, src, (size_t)n * 4); return;
    case DS_GGML_F16: for (int64_t i = 0; i < n; i++) dst[i] = half(b + 2 * i); return;
    case DS_GGML_BF16:
      for (int64_t i = 0; i < n; i++) dst[i] = ds_bf16_to_f32((uint16_t)(b[2 * i] | b[2 * i + 1] << 8));
      return;
    default: break;
  }
  void (*block)(const unsigned char *, float *) = NULL;
  switch (type) {
    case DS_GGML_Q4_0: block = q4_0; break;
    case DS_GGML_Q4_1: block = q4_1; break;
    case DS_GGML_Q5_0: block = q5_0; break;
    case DS_GGML_Q5_1: block = q5_1; break;
    case DS_GGML_Q8_0: block = q8_0; break;
    case DS_GGML_Q4_K: block = q4_k; break;
    case DS_GGML_Q5_K: block = q5_k; break;
    case DS_GGML_Q6_K: block = q6_k; break;
    default: DS_CHECK(!"ds_ggml_dequantize_row: a type it does not convert"); return;
  }
  const type_info *t = info(type);
  for (int64_t i = 0; i < n / t->block; i++) block(b + (size_t)i * t->bytes, dst + i * t->block);
}

/* ggml's reference Q8_0 quantizer (and gguf.quants'): per block of 32, d = max|x| / 127 in
 * fp32, q = round-half-away(x * (1 / d)), d stored as f16 (round to nearest even). */
void ds_ggml_quantize_q8_0(const float *x, void *dst, int64_t n) {
  unsigned char *b = dst;
  for (int64_t i = 0; i < n / 32; i++, b += 34, x += 32) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    uint16_t h = ds_f32_to_f16(d);
    b[0] = (unsigned char)(h & 0xFF), b[1] = (unsigned char)(h >> 8);
    for (int j = 0; j < 32; j++) b[2 + j] = (unsigned char)(int8_t)roundf(x[j] * id);
  }
}

/* ---------------------------------------------------------------- quantized ds_dtypes */

static const struct {
  ds_dtype dt;
  uint32_t ggml;
} k_quant_dtypes[] = {
    {DS_Q8_0, DS_GGML_Q8_0}, {DS_Q4_0, DS_GGML_Q4_0}, {DS_Q4_1, DS_GGML_Q4_1},
    {DS_Q4_K, DS_GGML_Q4_K}, {DS_Q6_K, DS_GGML_Q6_K}, {DS_Q5_0, DS_GGML_Q5_0}, {DS_Q5_1, DS_GGML_Q5_1},
};
enum { N_QUANT_DTYPES = sizeof k_quant_dtypes / sizeof k_quant_dtypes[0] };

int ds_dtype_ggml_type(ds_dtype dt) {
  for (int i = 0; i < N_QUANT_DTYPES; i++)
    if (k_quant_dtypes[i].dt == dt) return (int)k_quant_dtypes[i].ggml;
  return -1;
}

int ds_dtype_of_ggml_type(uint32_t type, ds_dtype *out) {
  for (int i = 0; i < N_QUANT_DTYPES; i++)
    if (k_quant_dtypes[i].ggml == type) {
      *out = k_quant_dtypes[i].dt;
      return 1;
    }
  return 0;
}

int ds_dtype_is_quantized(ds_dtype dt) { return ds_dtype_ggml_type(dt) >= 0; }

int64_t ds_quant_block(ds_dtype dt) {
  int g = ds_dtype_ggml_type(dt);
  return g < 0 ? 0 : info((uint32_t)g)->block;
}

size_t ds_quant_row_bytes(ds_dtype dt, int64_t cols) {
  int g = ds_dtype_ggml_type(dt);
  if (g < 0) return 0;
  const type_info *t = info((uint32_t)g);
  return (size_t)(cols / t->block) * t->bytes;
}

/* an IEEE half's exponent all ones: infinity or NaN */
static int half_nonfinite(const unsigned char *p) { return (p[1] & 0x7C) == 0x7C; }

int64_t ds_quant_first_nonfinite_row(ds_dtype dt, const void *data, int64_t rows, int64_t cols) {
  int g = ds_dtype_ggml_type(dt);
  if (g < 0) return -1;
  const type_info *t = info((uint32_t)g);
  /* where each type keeps its halves: d (and m / dmin after it) */
  size_t at = dt == DS_Q6_K ? 208 : 0;
  int halves = dt == DS_Q4_1 || dt == DS_Q5_1 || dt == DS_Q4_K ? 2 : 1;
  const unsigned char *b = data;
  int64_t per_row = cols / t->block;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t k = 0; k < per_row; k++, b += t->bytes)
      if (half_nonfinite(b + at) || (halves == 2 && half_nonfinite(b + at + 2))) return r;
  return -1;
}
