/* The x86 row kernel of the quantized matmuls (nn/cpu_quant.h), a weight row at a time, one
 * source for two instruction sets: cpu_quant_avx2.c (every type) and cpu_quant_avx512.c (Q8_0,
 * Q5_0 and Q5_1; its other types lie across the lanes there) include it after defining
 *   QT            the target attribute of every function here,
 *   QDOT(u, s)    32 unsigned bytes u times 32 signed bytes s, summed in fours into 8 int32
 *                 (AVX2: maddubs then madd with ones; never saturates here, as |u| <= 128 with
 *                 |s| <= 127 (Q8_0) or u <= 63 (the rest); AVX-512 VNNI: one dpbusd),
 *   QROWS         the name of the row kernel they define (exported, or with QROWS_LINKAGE
 *                 defined as static, kept to the including file).
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

/* Q5's fifth bits: byte l = bit l of qh, moved to 0x10 (values 0-15 the low nibbles' bits 0-15,
 * 16-31 the high nibbles' 16-31, GGUF's order) */
QI __m256i q_bits5(const unsigned char *qh) {
  uint32_t h;
  memcpy(&h, qh, 4);
  const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, /* qh bytes 0, 1 */
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3); /* 2, 3 */
  const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
  __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)h), spread), bit);
  return _mm256_and_si256(_mm256_cmpeq_epi8(v, bit), _mm256_set1_epi8(0x10));
}

QI __m256 q_fma(__m256i isum, float scale, __m256 acc) {
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(scale), acc);
}

/* Up to 4 rows of quantized x (xq[in], xd[in / 32], xs[in / 16] each). */
typedef struct {
  const int8_t *q[4];
  const float *d[4], *m[4];
  const int16_t *s[4];
} q_xrows;

/* One block of a weight row (block b: 32 values, or 256 for the K-quants) against R rows of x:
 * acc[r] (8 lanes) and extra[r] (the min / offset terms) accumulate. dt and R are constants after
 * inlining: the weight block is unpacked once for the R rows. */
QI void q_block(ds_dtype dt, const unsigned char *w, int64_t b, const q_xrows *x, int R, __m256 *acc, float *extra) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
  if (dt == DS_Q8_0) {
    __m256i wq = q_load(w + 2), wa = _mm256_sign_epi8(wq, wq);
    float dw = q_f16(w);
    for (int r = 0; r < R; r++)
      acc[r] = q_fma(QDOT(wa, _mm256_sign_epi8(q_load(x->q[r] + 32 * b), wq)), dw * x->d[r][b], acc[r]);
  } else if (dt == DS_Q4_0 || dt == DS_Q4_1) {
    int q41 = dt == DS_Q4_1;
    __m256i u = q_nibbles16(w + (q41 ? 4 : 2));
    float dw = q_f16(w), mw = q41 ? q_f16(w + 2) : -8.0f * dw; /* Q4_0: x = d (q - 8) */
    for (int r = 0; r < R; r++) {
      float dx = x->d[r][b];
      acc[r] = q_fma(QDOT(u, q_load(x->q[r] + 32 * b)), dw * dx, acc[r]);
      extra[r] += mw * x->m[r][b];
    }
  } else if (dt == DS_Q5_0 || dt == DS_Q5_1) {
    int q51 = dt == DS_Q5_1;
    const unsigned char *qh = w + (q51 ? 4 : 2);
    __m256i u = _mm256_or_si256(q_nibbles16(qh + 4), q_bits5(qh)); /* <= 31 */
    float dw = q_f16(w), mw = q51 ? q_f16(w + 2) : -16.0f * dw; /* Q5_0: x = d (q - 16) */
    for (int r = 0; r < R; r++) {
      acc[r] = q_fma(QDOT(u, q_load(x->q[r] + 32 * b)), dw * x->d[r][b], acc[r]);
      extra[r] += mw * x->m[r][b];
    }
  } else if (dt == DS_Q4_K) {
    float d = q_f16(w), dmin = q_f16(w + 2);
    uint8_t sc[8], mn[8];
    ds_ggml_q4k_scales(w + 4, sc, mn);
    for (int g = 0; g < 4; g++) { /* 32 bytes: sub-block 2g in the low nibbles, 2g + 1 high */
      __m256i q = q_load(w + 16 + 32 * g);
      __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      int64_t k = 8 * b + 2 * g; /* x's blocks k, k + 1 */
      float s0 = d * (float)sc[2 * g], s1 = d * (float)sc[2 * g + 1];
      float n0 = dmin * (float)mn[2 * g], n1 = dmin * (float)mn[2 * g + 1];
      for (int r = 0; r < R; r++) {
        const float *xd = x->d[r];
        acc[r] = q_fma(QDOT(lo, q_load(x->q[r] + 32 * k)), s0 * xd[k], acc[r]);
        acc[r] = q_fma(QDOT(hi, q_load(x->q[r] + 32 * (k + 1))), s1 * xd[k + 1], acc[r]);
        extra[r] -= n0 * x->m[r][k] + n1 * x->m[r][k + 1];
      }
    }
  } else { /* DS_Q6_K */
    const unsigned char *ql = w, *qh = w + 128;
    const int8_t *sc = (const int8_t *)(w + 192);
    float d = q_f16(w + 208);
    for (int c = 0; c < 8; c++) { /* values 32c .. 32c + 31: half c / 4, quarter c % 4 of it */
      int h = c / 4, q = c % 4;
      __m256i lo = _mm256_and_si256(_mm256_srl_epi16(q_load(ql + 64 * h + 32 * (q & 1)), _mm_cvtsi32_si128(4 * (q >> 1))), m4);
      __m256i hi = _mm256_and_si256(_mm256_srl_epi16(q_load(qh + 32 * h), _mm_cvtsi32_si128(2 * q)), m2);
      __m256i v = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
      int64_t k = 8 * b + c, G = 16 * b + 2 * c; /* x's block of 32, its first group of 16 */
      float t0 = d * (float)sc[2 * c], t1 = d * (float)sc[2 * c + 1];
      for (int r = 0; r < R; r++) {
        /* lanes 0-3 sum values 0-15 (scale sc[2c]), lanes 4-7 values 16-31 (sc[2c + 1]) */
        float s0 = t0 * x->d[r][k], s1 = t1 * x->d[r][k];
        __m256i p = QDOT(v, q_load(x->q[r] + 32 * k));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set_m128(_mm_set1_ps(s1), _mm_set1_ps(s0)), acc[r]);
        extra[r] -= 32.0f * (s0 * (float)x->s[r][G] + s1 * (float)x->s[r][G + 1]); /* x = d sc (q - 32) */
      }
    }
  }
}

/* out[r] = one weight row (type dt, nb blocks of bb bytes) dotted with R rows of x. Blocks
 * alternate between two sets of accumulators, so consecutive blocks do not wait on one another's
 * adds. */
QI void q_dot_rows(const unsigned char *w, ds_dtype dt, size_t bb, int64_t nb, const q_xrows *x, int R, float *out) {
  __m256 a0[4], a1[4];
  float e0[4] = {0}, e1[4] = {0};
  for (int r = 0; r < R; r++) a0[r] = a1[r] = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    q_block(dt, w + (size_t)b * bb, b, x, R, a0, e0);
    q_block(dt, w + (size_t)(b + 1) * bb, b + 1, x, R, a1, e1);
  }
  if (b < nb) q_block(dt, w + (size_t)b * bb, b, x, R, a0, e0);
  for (int r = 0; r < R; r++) out[r] = q_hsum(_mm256_add_ps(a0[r], a1[r])) + (e0[r] + e1[r]);
}

QI void q_rows(float *y, int64_t ldy, const ds_qx *x, int64_t n, const unsigned char *w, ds_dtype dt, int64_t in,
               int64_t o0, int64_t o1, const float *bias) {
  int64_t blk = ds_quant_block(dt), nb = in / blk;
  size_t rb = ds_quant_row_bytes(dt, in), bb = ds_quant_row_bytes(dt, blk);
  for (int64_t o = o0; o < o1; o++)
    for (int64_t i = 0; i < n; i += 4) { /* 4 rows of x per pass over the weight row (read from L1) */
      int R = n - i < 4 ? (int)(n - i) : 4;
      q_xrows xr;
      for (int r = 0; r < R; r++)
        xr.q[r] = x->q + (i + r) * in, xr.d[r] = x->d + (i + r) * (in / 32), xr.s[r] = x->s + (i + r) * (in / 16),
        xr.m[r] = x->m + (i + r) * (in / 32);
      float out[4] = {0};
      const unsigned char *wr = w + (size_t)o * rb;
      switch (R) {
        case 4: q_dot_rows(wr, dt, bb, nb, &xr, 4, out); break;
        case 3: q_dot_rows(wr, dt, bb, nb, &xr, 3, out); break;
        case 2: q_dot_rows(wr, dt, bb, nb, &xr, 2, out); break;
        default: q_dot_rows(wr, dt, bb, nb, &xr, 1, out); break;
      }
      for (int r = 0; r < R; r++) y[(i + r) * ldy + o] = out[r] + (bias ? bias[o] : 0.0f);
    }
}

#ifndef QROWS_LINKAGE
#define QROWS_LINKAGE
#endif

/* The row kernel: the type's branch chosen once, outside the loops. */
QROWS_LINKAGE QT void QROWS(float *y, int64_t ldy, const ds_qx *x, int64_t n, const unsigned char *w, ds_dtype dt, int64_t in,
              int64_t o0, int64_t o1, const float *bias) {
  switch (dt) {
    case DS_Q8_0: q_rows(y, ldy, x, n, w, DS_Q8_0, in, o0, o1, bias); break;
    case DS_Q4_0: q_rows(y, ldy, x, n, w, DS_Q4_0, in, o0, o1, bias); break;
    case DS_Q4_1: q_rows(y, ldy, x, n, w, DS_Q4_1, in, o0, o1, bias); break;
    case DS_Q4_K: q_rows(y, ldy, x, n, w, DS_Q4_K, in, o0, o1, bias); break;
    case DS_Q6_K: q_rows(y, ldy, x, n, w, DS_Q6_K, in, o0, o1, bias); break;
    case DS_Q5_0: q_rows(y, ldy, x, n, w, DS_Q5_0, in, o0, o1, bias); break;
    case DS_Q5_1: q_rows(y, ldy, x, n, w, DS_Q5_1, in, o0, o1, bias); break;
    default: DS_CHECK(!"a quantized dtype the kernels do not know");
  }
}

#endif
