/* One fast exp for every softmax in the engine (attention, the DSpark loss, later the KD
 * loss), so their numerics cannot drift apart.
 *
 * exp(x) in fp32, relative error about 2e-7 (within 2 ulp of expf): Cephes range reduction
 * x = n ln2 + r, |r| <= ln2/2, a degree-6 polynomial, 2^n built from the exponent bits.
 * Branch-free (the clamps and the final choices are selects), so loops calling it vectorize.
 * Meant for softmax arguments (x <= ~0): below -87.3365 (exp < FLT_MIN) it returns 0, as it
 * does for -inf; above 88 it saturates (exp(88), also for +inf). NaN gives NaN.
 *
 * Defined for every input: the clamp is written so that a NaN compares false and takes the
 * lower bound, so the float-to-int conversion always sees an integer in [-126, 127] and the
 * exponent shift is done on an unsigned value (C leaves a float-to-int conversion of NaN and
 * a left shift of a negative value undefined; UBSan reports both). The NaN is put back at the
 * end. Elementwise, hence deterministic. */
#ifndef DSPARK_NN_FAST_EXP_H
#define DSPARK_NN_FAST_EXP_H

#include <stdint.h>
#include <string.h>

static inline float ds_fast_expf(float x) {
  const float lo = -87.3365448f, hi = 88.0f;
  float xc = x > lo ? x : lo; /* NaN -> lo */
  xc = xc < hi ? xc : hi;
  float fn = xc * 1.44269504088896341f;
  fn = (fn + 12582912.0f) - 12582912.0f; /* round to nearest integer (1.5 * 2^23 trick): [-126, 127] */
  float r = xc - fn * 0.693359375f;      /* ln 2 split in two for an exact first step */
  r = r - fn * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  uint32_t bits = (uint32_t)((int32_t)fn + 127) << 23;
  float two_n;
  memcpy(&two_n, &bits, sizeof two_n);
  float y = p * two_n;
  y = x < lo ? 0.0f : y;
  return x == x ? y : x; /* NaN in, NaN out */
}

#endif
