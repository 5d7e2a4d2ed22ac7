/* int8 cache features: symmetric per-row absmax quantization (the formula is in
 * include/dspark/cache.h, "int8 features"). One row is one captured layer of one position. */
#include <math.h>

#include "dspark/cache.h"

/* q [rows, cols], scale [rows] <- x [rows, cols] */
void ds_cache_quantize_i8(int8_t *q, float *scale, const float *x, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; r++) {
    const float *v = x + r * cols;
    int8_t *out = q + r * cols;
    float amax = 0.0f;
    for (int64_t i = 0; i < cols; i++) amax = fmaxf(amax, fabsf(v[i]));
    float s = amax / 127.0f;
    scale[r] = s;
    for (int64_t i = 0; i < cols; i++) {
      /* nearbyintf rounds half to even in the default rounding mode, as torch.round does */
      float k = s > 0.0f ? nearbyintf(v[i] / s) : 0.0f;
      out[i] = (int8_t)(k > 127.0f ? 127.0f : k < -127.0f ? -127.0f : k);
    }
  }
}

/* x [rows, cols] <- q [rows, cols] * scale [rows] */
void ds_cache_dequantize_i8(float *x, const int8_t *q, const float *scale, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; r++) {
    float s = scale[r];
    const int8_t *in = q + r * cols;
    float *out = x + r * cols;
    for (int64_t i = 0; i < cols; i++) out[i] = (float)in[i] * s;
  }
}
