/* One fast exp for every softmax in the engine (attention, the DSpark loss, later the KD
 * loss), so their numerics cannot drift apart.
 *
 * exp(x) in fp32, relative error about 2e-7 (within 2 ulp of expf): Cephes range reduction
 * x = n ln2 + r, |r| <= ln2/2, a degree-6 polynomial, 2^n built from the exponent bits.
 * Branch-free (the clamps are selects, the final choices bit masks), so loops calling it vectorize.
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

/* a * b + c, fused (one rounding) where the target has FMA: every multiply-add of the exp is
 * written with it, so no step is left for the compiler to fuse or not (-ffp-contract would
 * otherwise decide, differently in scalar and vectorized copies of the same loop), and the
 * AVX-512 form below gives the same bits. */
#ifdef __FMA__
#define DS_EXP_MADD(a, b, c) __builtin_fmaf((a), (b), (c))
#else
#define DS_EXP_MADD(a, b, c) ((a) * (b) + (c))
#endif

static inline float ds_fast_expf(float x) {
  const float lo = -87.3365448f, hi = 88.0f;
  float xc = x > lo ? x : lo; /* NaN -> lo */
  xc = xc < hi ? xc : hi;
  /* round(x / ln2) to an integer in [-126, 127] (the 1.5 * 2^23 trick) */
  float fn = DS_EXP_MADD(xc, 1.44269504088896341f, 12582912.0f) - 12582912.0f;
  float r = DS_EXP_MADD(-fn, 0.693359375f, xc); /* ln 2 split in two for an exact first step */
  r = DS_EXP_MADD(-fn, -2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = DS_EXP_MADD(p, r, 1.3981999507e-3f);
  p = DS_EXP_MADD(p, r, 8.3334519073e-3f);
  p = DS_EXP_MADD(p, r, 4.1665795894e-2f);
  p = DS_EXP_MADD(p, r, 1.6666665459e-1f);
  p = DS_EXP_MADD(p, r, 5.0000001201e-1f);
  p = DS_EXP_MADD(p, r * r, r) + 1.0f;
  uint32_t bits = (uint32_t)((int32_t)fn + 127) << 23;
  float two_n;
  memcpy(&two_n, &bits, sizeof two_n);
  float y = p * two_n;
  /* y = x < lo ? 0 : y, then NaN in, NaN out; written as bit masks because GCC 12 cannot
   * if-convert the two selects for AVX2 (no masked registers) and leaves every loop calling
   * this scalar there. */
  uint32_t yb, xb;
  memcpy(&yb, &y, sizeof yb);
  memcpy(&xb, &x, sizeof xb);
  uint32_t under = -(uint32_t)(x < lo), nan = -(uint32_t)(x != x);
  yb = (yb & ~under & ~nan) | (xb & nan);
  memcpy(&y, &yb, sizeof y);
  return y;
}

/* Only where the scalar one is fused too (an FMA target), or their bits would differ. */
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__)) && defined(__FMA__)
#include <immintrin.h>
#define DS_HAVE_FAST_EXP_AVX512 1
/* ds_fast_expf on 16 lanes in AVX-512F, for hot loops whose compiler-vectorized form is slow
 * (GCC splits a vector-extension loop into 256-bit halves and reloads them through memory).
 * The scalar function's steps, fused as it fuses them, so both give the same bits
 * (unit.test_fast_exp compares them on a dense sweep and the special values). Callers must
 * check the CPU (ds_isa_best). */
static inline __attribute__((always_inline, target("avx512f"))) __m512 ds_fast_exp_avx512(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.3365448f), magic = _mm512_set1_ps(12582912.0f);
  __m512 xc = _mm512_min_ps(_mm512_max_ps(x, lo), _mm512_set1_ps(88.0f)); /* max(NaN, lo) = lo */
  __m512 fn = _mm512_sub_ps(_mm512_fmadd_ps(xc, _mm512_set1_ps(1.44269504088896341f), magic), magic);
  __m512 r = _mm512_fnmadd_ps(fn, _mm512_set1_ps(0.693359375f), xc);
  r = _mm512_fnmadd_ps(fn, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  __m512i two_n = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fn), _mm512_set1_epi32(127)), 23);
  __m512 y = _mm512_mul_ps(p, _mm512_castsi512_ps(two_n));
  y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ), y, _mm512_setzero_ps());
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), y, x); /* NaN in, NaN out */
}
#endif

#endif
