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

/* One block of 32 values (xb) as ds_qx_quantize_portable does it, as block k of qx: the same
 * maximum, step, reciprocal and product, rounded to nearest even by the conversion (the default
 * rounding mode), NaN lanes 0. */
PI void qx_block(ds_qx *qx, const float *xb, int64_t k) {
  const __m256 sign = _mm256_set1_ps(-0.0f), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
  const __m256i ones = _mm256_set1_epi16(1), order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  __m256 v[4], mx = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
  for (int c = 0; c < 4; c++) {
    v[c] = _mm256_loadu_ps(xb + 8 * c);
    mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[c]));
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v[c], v[c], _CMP_UNORD_Q));
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  float d = _mm_cvtss_f32(m4) / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
  __m256 idv = _mm256_set1_ps(id);
  __m256i q[4];
  for (int c = 0; c < 4; c++) {
    __m256 r = _mm256_mul_ps(v[c], idv);
    r = _mm256_and_ps(r, _mm256_cmp_ps(r, r, _CMP_ORD_Q)); /* NaN -> 0 */
    q[c] = _mm256_cvtps_epi32(_mm256_max_ps(_mm256_min_ps(r, hi), lo));
  }
  /* int32 -> int8 in order: packs interleave the 128-bit lanes, the permute puts them back */
  __m256i w01 = _mm256_packs_epi32(q[0], q[1]), w23 = _mm256_packs_epi32(q[2], q[3]);
  __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23), order);
  _mm256_storeu_si256((__m256i *)(qx->q + 32 * k), bytes);
  /* the sums of values 0-15 and 16-31 */
  __m256i a = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(bytes)), ones);
  __m256i c = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(bytes, 1)), ones);
  __m128i a4 = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
  __m128i c4 = _mm_add_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
  a4 = _mm_hadd_epi32(a4, c4);
  a4 = _mm_hadd_epi32(a4, a4);
  int s0 = _mm_cvtsi128_si32(a4), s1 = _mm_extract_epi32(a4, 1);
  if (_mm256_movemask_ps(nan)) d = NAN;
  qx->d[k] = d;
  qx->m[k] = d * (float)(s0 + s1);
  qx->s[2 * k] = (int16_t)s0;
  qx->s[2 * k + 1] = (int16_t)s1;
}

/* [max(a0, a1), max(a2, a3), max(b0, b1), max(b2, b3) | the same of lanes 4-7]: twice over four
 * vectors and once across the halves, lane j holds the maximum of vector j's 8 lanes */
PI __m256 hmax_pairs(__m256 a, __m256 b) {
  return _mm256_max_ps(_mm256_shuffle_ps(a, b, 0x88), _mm256_shuffle_ps(a, b, 0xDD));
}

/* Blocks k .. k + 7 (256 values at xb) with the same numbers as qx_block where every value and
 * every reciprocal of a step is finite (returns 0, nothing written, otherwise): their maxima
 * reduced side by side, so each block's step and reciprocal come from one division of 8 lanes and
 * its sums from shared horizontal adds, where a block alone waits on a chain of reductions and
 * two scalar divisions (15 ns a block on AMD Zen 4, the quantizing thread alone while the other
 * waits). With both finite, qx_block's NaN mask and clamps change nothing: |x| <= max|x| keeps
 * x times the rounded reciprocal within 127 (1 + 1e-6) (the step's rounding is coarser only where
 * it is denormal, and by at most 5e-7 while its reciprocal is finite), which converts to 127 at
 * most. */
PI int qx_group8(ds_qx *qx, const float *xb, int64_t k) {
  const __m256 sign = _mm256_set1_ps(-0.0f), inf = _mm256_set1_ps(INFINITY);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  __m256 mx[8], sum = _mm256_setzero_ps(); /* NaN or infinite if a value is (or the sum overflows) */
  for (int j = 0; j < 8; j++) {
    mx[j] = _mm256_setzero_ps();
    for (int c = 0; c < 4; c++) {
      __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + 32 * j + 8 * c));
      mx[j] = _mm256_max_ps(mx[j], a);
      sum = _mm256_add_ps(sum, a);
    }
  }
  __m256 h03 = hmax_pairs(hmax_pairs(mx[0], mx[1]), hmax_pairs(mx[2], mx[3]));
  __m256 h47 = hmax_pairs(hmax_pairs(mx[4], mx[5]), hmax_pairs(mx[6], mx[7]));
  __m256 amax = _mm256_max_ps(_mm256_permute2f128_ps(h03, h47, 0x20), _mm256_permute2f128_ps(h03, h47, 0x31));
  __m256 d = _mm256_div_ps(amax, _mm256_set1_ps(127.0f));
  __m256 id = _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(1.0f), d), _mm256_cmp_ps(d, _mm256_setzero_ps(), _CMP_GT_OQ));
  if (_mm256_movemask_ps(_mm256_or_ps(_mm256_cmp_ps(sum, inf, _CMP_NLT_UQ), _mm256_cmp_ps(id, inf, _CMP_EQ_OQ))))
    return 0;
  float ids[8];
  _mm256_storeu_ps(ids, id);
  __m256i tu[8]; /* block j: [t01, t23, u01, u23 | t45, t67, u45, u67], t / u its values 0-15 / 16-31 */
  for (int j = 0; j < 8; j++) {
    __m256 idv = _mm256_set1_ps(ids[j]);
    __m256i q[4];
    for (int c = 0; c < 4; c++) q[c] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 32 * j + 8 * c), idv));
    __m256i w01 = _mm256_packs_epi32(q[0], q[1]), w23 = _mm256_packs_epi32(q[2], q[3]);
    _mm256_storeu_si256((__m256i *)(qx->q + 32 * (k + j)),
                        _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23), order));
    tu[j] = _mm256_hadd_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
  }
  __m128i st[4]; /* blocks 2p, 2p + 1: [s0, s1, s0, s1], qx->s's order */
  for (int p = 0; p < 4; p++) {
    __m256i h = _mm256_hadd_epi32(tu[2 * p], tu[2 * p + 1]);
    st[p] = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  }
  _mm_storeu_si128((__m128i *)(qx->s + 2 * k), _mm_packs_epi32(st[0], st[1]));
  _mm_storeu_si128((__m128i *)(qx->s + 2 * k + 8), _mm_packs_epi32(st[2], st[3]));
  __m256i sums = _mm256_set_m128i(_mm_hadd_epi32(st[2], st[3]), _mm_hadd_epi32(st[0], st[1]));
  _mm256_storeu_ps(qx->d + k, d);
  _mm256_storeu_ps(qx->m + k, _mm256_mul_ps(d, _mm256_cvtepi32_ps(sums)));
  return 1;
}

/* ds_qx_quantize_portable's numbers. The rows' blocks lie one after the other in x and in qx
 * (in a multiple of 32), so they are taken as one run, 8 at a time where no value is NaN or
 * infinite. */
PT void ds_qx_quantize_avx2(ds_qx *qx, const float *x, int64_t n, int64_t in) {
  DS_CHECK(in % 32 == 0);
  int64_t blocks = n * (in / 32), k = 0;
  for (; k + 8 <= blocks; k += 8)
    if (!qx_group8(qx, x + 32 * k, k))
      for (int j = 0; j < 8; j++) qx_block(qx, x + 32 * (k + j), k + j);
  for (; k < blocks; k++) qx_block(qx, x + 32 * k, k);
}

#endif
