/* The AVX2 direct product on the 8-row packed copies of Q4_0 / Q4_1 / Q8_0 weights (layout in
 * nn/cpu_quant.h): the 8 lanes of a vector are 8 weight rows, so a block of 32 values is 8 (Q8_0)
 * or 4 (Q4) loads of 32 bytes, each 4 values of every row, dotted with 4 of x's int8 values
 * broadcast to every lane. Per block and row of x that is one scaling multiply-add for 8 outputs
 * and no horizontal sums, where the row kernel (cpu_quant_x86.h) spends a conversion, a scale and
 * a multiply-add on each output; each row of x is summed on its own, in the same order whatever
 * the other rows, so decode and verification give the same numbers. */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "nn/cpu_quant.h"

#define PT __attribute__((target("avx2,fma,f16c")))
#define PI static inline __attribute__((always_inline)) PT

PI __m256i bcast4(const int8_t *p) { /* 4 bytes of x in every lane */
  int32_t v;
  memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

/* Keeps v in a register as it is: without it GCC reassociates the integer sums of a block into a
 * tree that holds every product at once, and spills them (measured: 2x slower). */
#define PIN(v) __asm__("" : "+x"(v))

PI __m256 f16x8(const unsigned char *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* acc[r] (lanes: the group's 8 weight rows) += the group's nb blocks (bb8 bytes each) dotted with R
 * rows of x. */
PI void group_dot(const unsigned char *g, ds_dtype dt, size_t bb8, int64_t nb, const ds_qx *x, int64_t in, int64_t i0,
                  int R, __m256 *acc) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const int64_t xb = in / 32;
  for (int64_t b = 0; b < nb; b++) {
    const unsigned char *blk = g + (size_t)b * bb8;
    __m256 dw = f16x8(blk);
    if (dt == DS_Q8_0) {
      const unsigned char *qs = blk + 16;
      __m256i s[4];
      for (int j = 0; j < 8; j++) { /* values 4j .. 4j+3 of the 8 rows */
        __m256i w = _mm256_loadu_si256((const __m256i *)(qs + 32 * j)), a = _mm256_sign_epi8(w, w);
        for (int r = 0; r < R; r++) {
          __m256i xv = _mm256_sign_epi8(bcast4(x->q + (i0 + r) * in + 32 * b + 4 * j), w);
          __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(a, xv), ones); /* |w| <= 128, |x| <= 127 */
          s[r] = j ? _mm256_add_epi32(s[r], p) : p;
          PIN(s[r]);
        }
      }
      for (int r = 0; r < R; r++)
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[r]), _mm256_mul_ps(dw, _mm256_set1_ps(x->d[(i0 + r) * xb + b])),
                                 acc[r]);
    } else {
      int q41 = dt == DS_Q4_1;
      __m256 mw = q41 ? f16x8(blk + 16) : _mm256_mul_ps(dw, _mm256_set1_ps(-8.0f)); /* Q4_0: w = d (q - 8) */
      const unsigned char *qs = blk + (q41 ? 32 : 16);
      __m256i s[4];
      for (int j = 0; j < 4; j++) { /* low nibbles: values 4j .. 4j+3, high: 16 + 4j .. */
        __m256i w = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
        __m256i lo = _mm256_and_si256(w, m4), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
        for (int r = 0; r < R; r++) {
          const int8_t *xq = x->q + (i0 + r) * in + 32 * b + 4 * j;
          /* int16 sums: each pair <= 2 * 15 * 127, eight of them <= 30480 */
          __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, bcast4(xq)), _mm256_maddubs_epi16(hi, bcast4(xq + 16)));
          s[r] = j ? _mm256_add_epi16(s[r], p) : p;
          PIN(s[r]);
        }
      }
      for (int r = 0; r < R; r++) {
        int64_t k = (i0 + r) * xb + b;
        __m256 isum = _mm256_cvtepi32_ps(_mm256_madd_epi16(s[r], ones));
        acc[r] = _mm256_fmadd_ps(isum, _mm256_mul_ps(dw, _mm256_set1_ps(x->d[k])), acc[r]);
        acc[r] = _mm256_fmadd_ps(mw, _mm256_set1_ps(x->m[k]), acc[r]); /* the offset times x's block sum */
      }
    }
  }
}

PI void packed_rows(float *y, int64_t ldy, const ds_qx *x, int64_t n, const unsigned char *p, ds_dtype dt,
                    int64_t in, int64_t o0, int64_t o1, const float *bias) {
  /* the block size once per call (ds_quant_row_bytes per group was 1% of a speculative decode) */
  int64_t nb = in / 32;
  size_t bb8 = 8 * ds_quant_row_bytes(dt, 32), gb = bb8 * (size_t)nb;
  for (int64_t o = o0; o < o1; o += 8) {
    const unsigned char *g = p + (size_t)(o / 8) * gb;
    __m256 bv = bias ? _mm256_loadu_ps(bias + o) : _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 4) { /* 4 rows of x per pass over the group (read from L1) */
      int R = n - i < 4 ? (int)(n - i) : 4;
      __m256 acc[4];
      for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
      switch (R) {
        case 4: group_dot(g, dt, bb8, nb, x, in, i, 4, acc); break;
        case 3: group_dot(g, dt, bb8, nb, x, in, i, 3, acc); break;
        case 2: group_dot(g, dt, bb8, nb, x, in, i, 2, acc); break;
        default: group_dot(g, dt, bb8, nb, x, in, i, 1, acc); break;
      }
      for (int r = 0; r < R; r++) _mm256_storeu_ps(y + (i + r) * ldy + o, _mm256_add_ps(acc[r], bv));
    }
  }
}

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

PT void ds_quant_packed_rows_avx2(float *y, int64_t ldy, const ds_qx *x, int64_t n, const unsigned char *packed,
                                  ds_dtype dt, int64_t in, int64_t o0, int64_t o1, const float *bias) {
  DS_CHECK(o0 % 8 == 0 && o1 % 8 == 0);
  switch (dt) { /* the type's branch chosen once, outside the loops */
    case DS_Q8_0: packed_rows(y, ldy, x, n, packed, DS_Q8_0, in, o0, o1, bias); break;
    case DS_Q4_0: packed_rows(y, ldy, x, n, packed, DS_Q4_0, in, o0, o1, bias); break;
    case DS_Q4_1: packed_rows(y, ldy, x, n, packed, DS_Q4_1, in, o0, o1, bias); break;
    default: DS_CHECK(!"a type without a packed layout");
  }
}
#endif
