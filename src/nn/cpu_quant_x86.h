/* The x86 row kernel of the quantized matmuls (nn/cpu_quant.h), one source for two instruction
 * sets: cpu_quant_avx2.c and cpu_quant_avx512.c include it after defining
 *   QT            the target attribute of every function here,
 *   QDOT(u, s)    32 unsigned bytes u times 32 signed bytes s, summed in fours into 8 int32
 *                 (AVX2: maddubs then madd with ones; never saturates here, as |u| <= 128 with
 *                 |s| <= 127 (Q8_0) or u <= 63 (the rest); AVX-512 VNNI: one dpbusd),
 *   QROWS         the name of the row kernel they export.
 * Only the integer dot product differs between the two, so the rest is written once; a header
 * of static functions, included by those two files only, because each must compile it under its
 * own target. Every block's integer sum is scaled in fp32 by (weight scale * x's step) into 8
 * lanes of fp32 accumulators (the min / offset terms in a scalar), reduced once per row. */
#ifndef DSPARK_NN_CPU_QUANT_X86_H
#define DSPARK_NN_CPU_QUANT_X86_H

#include <immintrin.h>
#include <string.h>

#include "nn/cpu_quant.h"

#define QI static inline __attribute__((always_inline)) QT

QI float q_f16(const unsigned char *p) {
  uint16_t h;
  memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

QI float q_hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

QI __m256i q_load(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* 16 bytes of nibbles -> their 32 values in GGUF's order (low nibbles 0-15, high 16-31) */
QI __m256i q_nibbles16(const unsigned char *qs) {
  __m128i b = _mm_loadu_si128((const __m128i *)qs);
  __m256i v = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

QI __m256 q_fma(__m256i isum, float scale, __m256 acc) {
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(scale), acc);
}

/* One weight row [in] (type dt, a constant after inlining) dotted with one quantized x row:
 * xq[in], xd[in / 32], xs[in / 16]. */
QI float q_dot_row(const unsigned char *w, ds_dtype dt, const int8_t *xq, const float *xd, const int16_t *xs,
                   int64_t in) {
  __m256 acc = _mm256_setzero_ps();
  float extra = 0.0f; /* the min / offset terms */
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
  if (dt == DS_Q8_0) {
    for (int64_t b = 0; b < in / 32; b++, w += 34) {
      __m256i wq = q_load(w + 2), xv = q_load(xq + 32 * b);
      __m256i p = QDOT(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xv, wq));
      acc = q_fma(p, q_f16(w) * xd[b], acc);
    }
  } else if (dt == DS_Q4_0 || dt == DS_Q4_1) {
    int q41 = dt == DS_Q4_1;
    for (int64_t b = 0; b < in / 32; b++, w += q41 ? 20 : 18) {
      __m256i p = QDOT(q_nibbles16(w + (q41 ? 4 : 2)), q_load(xq + 32 * b));
      float dw = q_f16(w) * xd[b];
      int xsum = xs[2 * b] + xs[2 * b + 1];
      acc = q_fma(p, dw, acc);
      extra += q41 ? q_f16(w + 2) * xd[b] * (float)xsum : -8.0f * dw * (float)xsum;
    }
  } else if (dt == DS_Q4_K) {
    for (int64_t b = 0; b < in / 256; b++, w += 144) {
      float d = q_f16(w), dmin = q_f16(w + 2);
      uint8_t sc[8], mn[8];
      ds_ggml_q4k_scales(w + 4, sc, mn);
      for (int g = 0; g < 4; g++) { /* 32 bytes: sub-block 2g in the low nibbles, 2g + 1 high */
        __m256i q = q_load(w + 16 + 32 * g);
        int64_t k = 8 * b + 2 * g;
        __m256i p0 = QDOT(_mm256_and_si256(q, m4), q_load(xq + 32 * k));
        __m256i p1 = QDOT(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), q_load(xq + 32 * (k + 1)));
        acc = q_fma(p0, d * (float)sc[2 * g] * xd[k], acc);
        acc = q_fma(p1, d * (float)sc[2 * g + 1] * xd[k + 1], acc);
        extra -= dmin * ((float)mn[2 * g] * xd[k] * (float)(xs[2 * k] + xs[2 * k + 1]) +
                         (float)mn[2 * g + 1] * xd[k + 1] * (float)(xs[2 * k + 2] + xs[2 * k + 3]));
      }
    }
  } else { /* DS_Q6_K */
    for (int64_t b = 0; b < in / 256; b++, w += 210) {
      const unsigned char *ql = w, *qh = w + 128;
      const int8_t *sc = (const int8_t *)(w + 192);
      float d = q_f16(w + 208);
      for (int c = 0; c < 8; c++) { /* values 32c .. 32c + 31: half c / 4, quarter c % 4 of it */
        int h = c / 4, q = c % 4;
        __m256i lo = _mm256_and_si256(_mm256_srl_epi16(q_load(ql + 64 * h + 32 * (q & 1)), _mm_cvtsi32_si128(4 * (q >> 1))), m4);
        __m256i hi = _mm256_and_si256(_mm256_srl_epi16(q_load(qh + 32 * h), _mm_cvtsi32_si128(2 * q)), m2);
        int64_t k = 8 * b + c, G = 16 * b + 2 * c; /* x's block of 32, its first group of 16 */
        __m256i p = QDOT(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), q_load(xq + 32 * k));
        /* lanes 0-3 sum values 0-15 (scale sc[2c]), lanes 4-7 values 16-31 (sc[2c + 1]) */
        float s0 = d * (float)sc[2 * c] * xd[k], s1 = d * (float)sc[2 * c + 1] * xd[k];
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set_m128(_mm_set1_ps(s1), _mm_set1_ps(s0)), acc);
        extra -= 32.0f * (s0 * (float)xs[G] + s1 * (float)xs[G + 1]); /* x = d sc (q - 32) */
      }
    }
  }
  return q_hsum(acc) + extra;
}

QI void q_rows(float *y, int64_t ldy, const ds_qx *x, int64_t n, const unsigned char *w, ds_dtype dt, int64_t in,
               int64_t o0, int64_t o1, const float *bias) {
  size_t rb = ds_quant_row_bytes(dt, in);
  for (int64_t o = o0; o < o1; o++)
    for (int64_t i = 0; i < n; i++)
      y[i * ldy + o] = q_dot_row(w + (size_t)o * rb, dt, x->q + i * in, x->d + i * (in / 32), x->s + i * (in / 16), in) +
                       (bias ? bias[o] : 0.0f);
}

/* The exported kernel: the type's branch chosen once, outside the loops. */
QT void QROWS(float *y, int64_t ldy, const ds_qx *x, int64_t n, const unsigned char *w, ds_dtype dt, int64_t in,
              int64_t o0, int64_t o1, const float *bias) {
  switch (dt) {
    case DS_Q8_0: q_rows(y, ldy, x, n, w, DS_Q8_0, in, o0, o1, bias); break;
    case DS_Q4_0: q_rows(y, ldy, x, n, w, DS_Q4_0, in, o0, o1, bias); break;
    case DS_Q4_1: q_rows(y, ldy, x, n, w, DS_Q4_1, in, o0, o1, bias); break;
    case DS_Q4_K: q_rows(y, ldy, x, n, w, DS_Q4_K, in, o0, o1, bias); break;
    case DS_Q6_K: q_rows(y, ldy, x, n, w, DS_Q6_K, in, o0, o1, bias); break;
    default: DS_CHECK(!"a quantized dtype the kernels do not know");
  }
}

#endif
