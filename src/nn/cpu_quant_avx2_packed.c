/* The AVX2 direct product on the 8-row packed copies of Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 weights
 * (the kernel in nn/cpu_quant_packed_x86.h, maddubs as its integer dot), and the AVX2 quantizer
 * of x. */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "nn/cpu_quant.h"

#define PT __attribute__((target("avx2,fma,f16c")))
#define PACKED_VNNI 0
#define PACKED_ROWS ds_quant_packed_rows_avx2
#include "nn/cpu_quant_packed_x86.h"

/* ds_qx_quantize_portable's numbers, 32 values at a time: the same maximum, step, reciprocal and
 * product, rounded to nearest even by the conversion (the default rounding mode), NaN lanes 0. */
PT void ds_qx_quantize_avx2(ds_qx *qx, const float *x, int64_t n, int64_t in) {
  const __m256 sign = _mm256_set1_ps(-0.0f), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
  const __m256i ones = _mm256_set1_epi16(1), order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  int64_t nb = in / 32;
  for (int64_t i = 0; i < n; i++)
    for (int64_t b = 0; b < nb; b++) {
      const float *xb = x + i * in + 32 * b;
      __m256 v[4], mx = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
      for (int k = 0; k < 4; k++) {
        v[k] = _mm256_loadu_ps(xb + 8 * k);
        mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[k]));
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v[k], v[k], _CMP_UNORD_Q));
      }
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
      float d = _mm_cvtss_f32(m4) / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
      __m256 idv = _mm256_set1_ps(id);
      __m256i q[4];
      for (int k = 0; k < 4; k++) {
        __m256 r = _mm256_mul_ps(v[k], idv);
        r = _mm256_and_ps(r, _mm256_cmp_ps(r, r, _CMP_ORD_Q)); /* NaN -> 0 */
        q[k] = _mm256_cvtps_epi32(_mm256_max_ps(_mm256_min_ps(r, hi), lo));
      }
      /* int32 -> int8 in order: packs interleave the 128-bit lanes, the permute puts them back */
      __m256i w01 = _mm256_packs_epi32(q[0], q[1]), w23 = _mm256_packs_epi32(q[2], q[3]);
      __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23), order);
      _mm256_storeu_si256((__m256i *)(qx->q + i * in + 32 * b), bytes);
      /* the sums of values 0-15 and 16-31 */
      __m256i a = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(bytes)), ones);
      __m256i c = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(bytes, 1)), ones);
      __m128i a4 = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
      __m128i c4 = _mm_add_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
      a4 = _mm_hadd_epi32(a4, c4);
      a4 = _mm_hadd_epi32(a4, a4);
      int s0 = _mm_cvtsi128_si32(a4), s1 = _mm_extract_epi32(a4, 1);
      if (_mm256_movemask_ps(nan)) d = NAN;
      qx->d[i * nb + b] = d;
      qx->m[i * nb + b] = d * (float)(s0 + s1);
      qx->s[(i * nb + b) * 2] = (int16_t)s0;
      qx->s[(i * nb + b) * 2 + 1] = (int16_t)s1;
    }
}

#endif
