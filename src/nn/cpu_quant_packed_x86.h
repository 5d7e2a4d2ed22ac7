/* The direct product on the 8-row packed copies of Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 weights
 * (layout in nn/cpu_quant.h), one source for two instruction sets: cpu_quant_avx2_packed.c and
 * cpu_quant_vnni_packed.c include it after defining
 *   PT            the target attribute of every function here,
 *   PACKED_VNNI   1 to sum each 4 byte products with one AVX-512 VNNI dpbusd (256 bits: the packed
 *                 group is 8 rows), 0 for AVX2's maddubs (pairs into int16) and madd,
 *   PACKED_ROWS   the name of the exported kernel.
 * The 8 lanes of a vector are 8 weight rows, so a block of 32 values is 8 (Q8_0) or 4 (Q4) loads
 * of 32 bytes, each 4 values of every row, dotted with 4 of x's int8 values broadcast to every
 * lane. Per block and row of x that is one scaling multiply-add for 8 outputs and no horizontal
 * sums, where the row kernel (cpu_quant_x86.h) spends a conversion, a scale and a multiply-add on
 * each output; each row of x is summed on its own, in the same order whatever the other rows, so
 * decode and verification give the same numbers. The two instruction sets form the same exact
 * integer sums of a block, so they give the same numbers too. A pass takes up to 4 rows of x over
 * one group, or with VNNI from 8 rows of x over two groups (group_pair_dot4). */
#ifndef DSPARK_NN_CPU_QUANT_PACKED_X86_H
#define DSPARK_NN_CPU_QUANT_PACKED_X86_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "nn/cpu_quant.h"

#define PI static inline __attribute__((always_inline)) PT

#if PACKED_VNNI
/* acc + dpbusd(w, x's 4 bytes at p in every lane): the broadcast is dpbusd's own memory operand,
 * one operation where a broadcast load and a dpbusd were two (GCC does not fold it); with the
 * weights' chunk loaded once below, 4 rows of Q4_1 ran 8-11% faster in cache on AMD Zen 4,
 * whose two vector loads a cycle, not dpbusd, bound that pass (docs/compute.md) */
PI __m256i dpbusd_bcast(__m256i acc, __m256i w, const int8_t *p) {
  __asm__("vpdpbusd %2%{1to8%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)(const void *)p));
  return acc;
}
#endif

PI __m256i bcast4(const int8_t *p) { /* 4 bytes of x in every lane */
  int32_t v;
  memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

/* Keeps v in a register as it is: without it GCC reassociates the integer sums of a block into a
 * tree that holds every product at once, and spills them (measured: 2x slower). */
#define PIN(v) __asm__("" : "+x"(v))

PI __m256 f16x8(const unsigned char *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* The 8 rows' 6-bit scale (or min) of Q4_K sub-block j from the 12 scale bytes, each byte i of
 * the 8 rows at sc + 8 i (ds_ggml_q4k_scales' rule, 8 rows at once), as fp32 lanes. */
PI __m256 q4k_six_bits(const unsigned char *sc, int j, int mins) {
  const __m128i m6 = _mm_set1_epi8(63), m4 = _mm_set1_epi8(0x0F), top = _mm_set1_epi8(0x30);
  __m128i v;
  if (j < 4) {
    v = _mm_and_si128(_mm_loadl_epi64((const __m128i *)(sc + 8 * (j + 4 * mins))), m6);
  } else { /* low 4 bits from byte j + 4 (low or high nibble), top 2 from byte j - 4 (or j) bits 6-7 */
    __m128i lo = _mm_loadl_epi64((const __m128i *)(sc + 8 * (j + 4)));
    __m128i hi = _mm_loadl_epi64((const __m128i *)(sc + 8 * (mins ? j : j - 4)));
    lo = _mm_and_si128(mins ? _mm_srli_epi16(lo, 4) : lo, m4);
    v = _mm_or_si128(lo, _mm_and_si128(_mm_srli_epi16(hi, 2), top));
  }
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
}

/* acc[r] += one Q4_K super-block (256 values: 8 sub-blocks of 32, x's blocks kx .. kx + 7) of the
 * 8 rows, packed as nn/cpu_quant.h lays it out: sub-block 2g in chunk g's low nibbles, 2g + 1 in
 * its high ones, each with its 6-bit scale and min. */
PI void q4k_superblock(const unsigned char *blk, const ds_qx *x, int64_t in, int64_t xb, int64_t i0, int64_t kx,
                       int R, __m256 *acc) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
#if !PACKED_VNNI
  const __m256i ones = _mm256_set1_epi16(1);
#endif
  __m256 d = f16x8(blk), dmin = f16x8(blk + 16);
  const unsigned char *sc = blk + 32, *qs = blk + 128;
  for (int g = 0; g < 4; g++) {
    __m256 s0 = _mm256_mul_ps(d, q4k_six_bits(sc, 2 * g, 0)), s1 = _mm256_mul_ps(d, q4k_six_bits(sc, 2 * g + 1, 0));
    __m256 n0 = _mm256_mul_ps(dmin, q4k_six_bits(sc, 2 * g, 1)), n1 = _mm256_mul_ps(dmin, q4k_six_bits(sc, 2 * g + 1, 1));
    __m256i t0[4], t1[4];
#if PACKED_VNNI
    /* with 4 rows the sums run in dpbusd itself, t0 / t1 the even chunks', u0 / u1 the odd ones':
     * 16 chains of 4 (4 rows of Q4_K 20% faster in cache on AMD Zen 4, the same sums) */
    __m256i u0[4], u1[4];
    if (R == 4)
      for (int r = 0; r < 4; r++) t0[r] = t1[r] = u0[r] = u1[r] = _mm256_setzero_si256();
#endif
    for (int c = 0; c < 8; c++) { /* values 4c .. 4c+3 of both sub-blocks */
      __m256i w = _mm256_loadu_si256((const __m256i *)(qs + 32 * (8 * g + c)));
      __m256i lo = _mm256_and_si256(w, m4), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
      for (int r = 0; r < R; r++) {
        const int8_t *xq = x->q + (i0 + r) * in + 32 * (kx + 2 * g) + 4 * c;
#if PACKED_VNNI
        if (R == 4) {
          if (c & 1) u0[r] = dpbusd_bcast(u0[r], lo, xq), u1[r] = dpbusd_bcast(u1[r], hi, xq + 32);
          else t0[r] = dpbusd_bcast(t0[r], lo, xq), t1[r] = dpbusd_bcast(t1[r], hi, xq + 32);
          PIN(u0[r]);
          PIN(u1[r]);
        } else {
          __m256i p0 = dpbusd_bcast(_mm256_setzero_si256(), lo, xq);
          __m256i p1 = dpbusd_bcast(_mm256_setzero_si256(), hi, xq + 32);
          t0[r] = c ? _mm256_add_epi32(t0[r], p0) : p0, t1[r] = c ? _mm256_add_epi32(t1[r], p1) : p1;
        }
#else /* int16 sums: 8 pairs of at most 2 * 15 * 127 */
        __m256i p0 = _mm256_maddubs_epi16(lo, bcast4(xq)), p1 = _mm256_maddubs_epi16(hi, bcast4(xq + 32));
        t0[r] = c ? _mm256_add_epi16(t0[r], p0) : p0, t1[r] = c ? _mm256_add_epi16(t1[r], p1) : p1;
#endif
        PIN(t0[r]);
        PIN(t1[r]);
      }
    }
    for (int r = 0; r < R; r++) {
      int64_t k = (i0 + r) * xb + kx + 2 * g;
#if PACKED_VNNI
      if (R == 4) t0[r] = _mm256_add_epi32(t0[r], u0[r]), t1[r] = _mm256_add_epi32(t1[r], u1[r]);
      __m256 i0f = _mm256_cvtepi32_ps(t0[r]), i1f = _mm256_cvtepi32_ps(t1[r]);
#else
      __m256 i0f = _mm256_cvtepi32_ps(_mm256_madd_epi16(t0[r], ones));
      __m256 i1f = _mm256_cvtepi32_ps(_mm256_madd_epi16(t1[r], ones));
#endif
      acc[r] = _mm256_fmadd_ps(i0f, _mm256_mul_ps(s0, _mm256_set1_ps(x->d[k])), acc[r]);
      acc[r] = _mm256_fmadd_ps(i1f, _mm256_mul_ps(s1, _mm256_set1_ps(x->d[k + 1])), acc[r]);
      acc[r] = _mm256_fnmadd_ps(n0, _mm256_set1_ps(x->m[k]), acc[r]); /* x = d sc q - dmin mn */
      acc[r] = _mm256_fnmadd_ps(n1, _mm256_set1_ps(x->m[k + 1]), acc[r]);
    }
  }
}

/* acc[r] += one Q6_K super-block (256 values, x's blocks kx .. kx + 7) of the 8 rows, packed as
 * nn/cpu_quant.h lays it out. Values 32c .. 32c + 31 (c = 0 .. 7, half h = c / 4): low 4 bits in
 * ql bytes 64 h + 32 (c % 2) + l (the high nibbles when c % 4 >= 2), high 2 bits in qh bytes
 * 32 h + l at bit 2 (c % 4); each 16 values have their int8 scale; x = d sc (q - 32). */
PI void q6k_superblock(const unsigned char *blk, const ds_qx *x, int64_t in, int64_t xb, int64_t i0, int64_t kx,
                       int R, __m256 *acc) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
#if !PACKED_VNNI
  const __m256i ones = _mm256_set1_epi16(1);
#endif
  __m256 d = f16x8(blk);
  const unsigned char *sc = blk + 16, *ql = blk + 144, *qh = ql + 32 * 32;
  for (int c = 0; c < 8; c++) {
    int h = c / 4, shift_lo = 4 * ((c % 4) / 2), shift_hi = 2 * (c % 4);
    /* the 8 rows' scales of values 0-15 and 16-31 of this group, times d */
    __m256 sa = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 8 * (2 * c))))));
    __m256 sb = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 8 * (2 * c + 1))))));
    __m256i ta[4], tb[4];
#if PACKED_VNNI
    if (R == 4) /* with 4 rows the sums run in dpbusd itself, 8 chains of 4 (27% faster, Zen 4) */
      for (int r = 0; r < 4; r++) ta[r] = tb[r] = _mm256_setzero_si256();
#endif
    for (int t = 0; t < 8; t++) { /* values 4t .. 4t+3 of the group */
      __m256i lo = _mm256_and_si256(
          _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)(ql + 32 * (16 * h + 8 * (c % 2) + t))), _mm_cvtsi32_si128(shift_lo)),
          m4);
      __m256i hi = _mm256_and_si256(
          _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)(qh + 32 * (8 * h + t))), _mm_cvtsi32_si128(shift_hi)), m2);
      __m256i q = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)); /* <= 63 */
      for (int r = 0; r < R; r++) {
        const int8_t *xq = x->q + (i0 + r) * in + 32 * (kx + c) + 4 * t;
#if PACKED_VNNI
        if (R == 4) {
          if (t < 4) ta[r] = dpbusd_bcast(ta[r], q, xq);
          else tb[r] = dpbusd_bcast(tb[r], q, xq);
          PIN(ta[r]);
          PIN(tb[r]);
          continue;
        }
        __m256i p = dpbusd_bcast(_mm256_setzero_si256(), q, xq);
#else /* pairs reach 2 * 63 * 127: int32 at each step */
        __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(q, bcast4(xq)), ones);
#endif
        if (t < 4) ta[r] = t ? _mm256_add_epi32(ta[r], p) : p;
        else tb[r] = t > 4 ? _mm256_add_epi32(tb[r], p) : p;
        PIN(ta[r]);
        PIN(tb[r]);
      }
    }
    for (int r = 0; r < R; r++) {
      int64_t k = (i0 + r) * xb + kx + c;
      __m256 xd = _mm256_set1_ps(x->d[k]);
      __m256 fa = _mm256_sub_ps(_mm256_cvtepi32_ps(ta[r]), _mm256_set1_ps(32.0f * (float)x->s[2 * k]));
      __m256 fb = _mm256_sub_ps(_mm256_cvtepi32_ps(tb[r]), _mm256_set1_ps(32.0f * (float)x->s[2 * k + 1]));
      acc[r] = _mm256_fmadd_ps(fa, _mm256_mul_ps(sa, xd), acc[r]);
      acc[r] = _mm256_fmadd_ps(fb, _mm256_mul_ps(sb, xd), acc[r]);
    }
  }
}

/* Q4_0 / Q4_1 / Q5_0 / Q5_1 blocks of a group: where the nibbles start, the offset term's weight
 * (Q4_1 / Q5_1 their min; Q4_0: w = d (q - 8), Q5_0: d (q - 16)), and chunk j's low and high
 * nibbles (values 4j .. 4j+3 and 16 + 4j ..), Q5's fifth bits added: bit j of each byte of e for
 * the low nibbles of chunk j, bit 4 + j for the high ones (layout in nn/cpu_quant.h), moved to
 * bit 4 (0x10). once: the chunk is loaded into a register once, where GCC otherwise folds its load
 * into both masks (two loads, the cheaper form where loads do not bind: one row, the pair pass). */
PI const unsigned char *q45_nibbles_at(const unsigned char *blk, int has_m, int q5) {
  return blk + (has_m ? 32 : 16) + (q5 ? 32 : 0);
}
PI __m256 q45_offset(const unsigned char *blk, __m256 dw, int has_m, int q5) {
  return has_m ? f16x8(blk + 16) : _mm256_mul_ps(dw, _mm256_set1_ps(q5 ? -16.0f : -8.0f));
}
PI void q45_chunk(const unsigned char *qs, __m256i e, int j, int q5, int once, __m256i *lo, __m256i *hi) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m5 = _mm256_set1_epi8(0x10);
  __m256i w = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
  if (once) PIN(w);
  *lo = _mm256_and_si256(w, m4), *hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
  if (q5) {
    *lo = _mm256_or_si256(*lo, _mm256_and_si256(_mm256_slli_epi32(e, 4 - j), m5));
    *hi = _mm256_or_si256(*hi, _mm256_and_si256(_mm256_srli_epi32(e, j), m5));
  }
}

/* acc += a block's integer sums isum (8 rows) scaled by the rows' scales dw and x's step, plus the
 * offset term mw times x's block sum where the type has one: every packed pass's float steps. */
PI __m256 scale_block(__m256 acc, __m256i isum, __m256 dw, __m256 mw, const ds_qx *x, int64_t k, int offset) {
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, _mm256_set1_ps(x->d[k])), acc);
  return offset ? _mm256_fmadd_ps(mw, _mm256_set1_ps(x->m[k]), acc) : acc;
}

/* acc[r] (lanes: the group's 8 weight rows) += the group's nb blocks (bb8 bytes each) dotted with R
 * rows of x. */
PI void group_dot(const unsigned char *g, ds_dtype dt, size_t bb8, int64_t nb, const ds_qx *x, int64_t in, int64_t i0,
                  int R, __m256 *acc, size_t pf) {
#if !PACKED_VNNI
  const __m256i ones = _mm256_set1_epi16(1);
#endif
  const int64_t xb = in / 32;
  for (int64_t b = 0; b < nb; b++) {
    const unsigned char *blk = g + (size_t)b * bb8;
    /* a prefetch never faults, so past the weight's end it reads nothing and costs a hint (the
     * address formed as an integer: a pointer past its object's end would be undefined in C) */
    if (pf)
      for (size_t c = 0; c < bb8; c += 64) _mm_prefetch((const char *)((uintptr_t)blk + pf + c), _MM_HINT_T0);
    if (dt == DS_Q4_K || dt == DS_Q6_K) { /* b a super-block of 8 of x's blocks */
      if (dt == DS_Q4_K) q4k_superblock(blk, x, in, xb, i0, 8 * b, R, acc);
      else q6k_superblock(blk, x, in, xb, i0, 8 * b, R, acc);
      continue;
    }
    __m256 dw = f16x8(blk);
    if (dt == DS_Q8_0) {
      const unsigned char *qs = blk + 16;
      __m256i s[4];
#if PACKED_VNNI /* w + 128 as unsigned bytes (w ^ 0x80) dotted with x as it is, then 128 times x's block
                 * sum taken back: AVX2's integer sums with no sign operations (dpbusd's int32
                 * sums cannot saturate, maddubs' int16 pairs would) */
      const __m256i flip = _mm256_set1_epi8((char)0x80);
      __m256i t[4]; /* with 4 rows: the odd chunks' sums, s the even ones' (as Q4's below) */
      if (R == 4)
        for (int r = 0; r < 4; r++) s[r] = t[r] = _mm256_setzero_si256();
      for (int j = 0; j < 8; j++) { /* values 4j .. 4j+3 of the 8 rows */
        __m256i u = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(qs + 32 * j)), flip);
        for (int r = 0; r < R; r++) {
          const int8_t *xq = x->q + (i0 + r) * in + 32 * b + 4 * j;
          if (R == 4) { /* 8 chains of 4 in dpbusd itself: 4 rows 20% faster in cache (Zen 4) */
            if (j & 1) t[r] = dpbusd_bcast(t[r], u, xq);
            else s[r] = dpbusd_bcast(s[r], u, xq);
            PIN(t[r]);
          } else {
            __m256i p = dpbusd_bcast(_mm256_setzero_si256(), u, xq);
            s[r] = j ? _mm256_add_epi32(s[r], p) : p; /* p off s's chain: see below */
          }
          PIN(s[r]);
        }
      }
      if (R == 4)
        for (int r = 0; r < 4; r++) s[r] = _mm256_add_epi32(s[r], t[r]);
      for (int r = 0; r < R; r++) {
        const int16_t *xs = x->s + ((i0 + r) * xb + b) * 2;
        s[r] = _mm256_sub_epi32(s[r], _mm256_set1_epi32(128 * ((int32_t)xs[0] + xs[1])));
      }
#else
      for (int j = 0; j < 8; j++) { /* values 4j .. 4j+3 of the 8 rows */
        __m256i w = _mm256_loadu_si256((const __m256i *)(qs + 32 * j)), a = _mm256_sign_epi8(w, w);
        for (int r = 0; r < R; r++) {
          __m256i xv = _mm256_sign_epi8(bcast4(x->q + (i0 + r) * in + 32 * b + 4 * j), w);
          __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(a, xv), ones); /* |w| <= 128, |x| <= 127 */
          s[r] = j ? _mm256_add_epi32(s[r], p) : p;
          PIN(s[r]);
        }
      }
#endif
      for (int r = 0; r < R; r++) acc[r] = scale_block(acc[r], s[r], dw, dw, x, (i0 + r) * xb + b, 0);
    } else { /* Q4_0, Q4_1, Q5_0, Q5_1 */
      int has_m = dt == DS_Q4_1 || dt == DS_Q5_1, q5 = dt == DS_Q5_0 || dt == DS_Q5_1;
      __m256 mw = q45_offset(blk, dw, has_m, q5);
      const unsigned char *qs = q45_nibbles_at(blk, has_m, q5);
      __m256i e = q5 ? _mm256_loadu_si256((const __m256i *)(qs - 32)) : _mm256_setzero_si256(); /* fifth bits */
      __m256i s[4];
#if PACKED_VNNI
      /* With 4 rows of x, each row's low and high nibbles accumulate in dpbusd itself: 8 chains
       * of 4 hide its latency, and the adds between the products go (the integer sums are exact,
       * so the same numbers as the other row counts' order) */
      __m256i t[4];
      if (R == 4)
        for (int r = 0; r < 4; r++) s[r] = t[r] = _mm256_setzero_si256();
#endif
      for (int j = 0; j < 4; j++) { /* low nibbles: values 4j .. 4j+3, high: 16 + 4j .. */
        __m256i lo, hi;
        q45_chunk(qs, e, j, q5, PACKED_VNNI && R == 4, &lo, &hi);
        for (int r = 0; r < R; r++) {
          const int8_t *xq = x->q + (i0 + r) * in + 32 * b + 4 * j;
#if PACKED_VNNI /* int32 sums; under 4 rows each j's from zero, so s's chain is the adds (s as dpbusd's
                  * accumulator, a chain of 8 dpbusd a block, decoded a quarter slower) */
          if (R == 4) {
            s[r] = dpbusd_bcast(s[r], lo, xq);
            t[r] = dpbusd_bcast(t[r], hi, xq + 16);
            PIN(t[r]);
          } else {
            __m256i p = dpbusd_bcast(dpbusd_bcast(_mm256_setzero_si256(), lo, xq), hi, xq + 16);
            s[r] = j ? _mm256_add_epi32(s[r], p) : p;
          }
#else /* Q4: int16 sums, each pair <= 2 * 15 * 127, eight of them <= 30480; Q5's pairs reach
       * 2 * 31 * 127, so its sums widen to int32 at each j */
          __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, bcast4(xq)), _mm256_maddubs_epi16(hi, bcast4(xq + 16)));
          if (q5) p = _mm256_madd_epi16(p, ones), s[r] = j ? _mm256_add_epi32(s[r], p) : p;
          else s[r] = j ? _mm256_add_epi16(s[r], p) : p;
#endif
          PIN(s[r]);
        }
      }
      for (int r = 0; r < R; r++) {
#if PACKED_VNNI
        __m256i isum = R == 4 ? _mm256_add_epi32(s[r], t[r]) : s[r];
#else
        __m256i isum = q5 ? s[r] : _mm256_madd_epi16(s[r], ones);
#endif
        acc[r] = scale_block(acc[r], isum, dw, mw, x, (i0 + r) * xb + b, 1);
      }
    }
  }
}

#if PACKED_VNNI
/* Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0: acc[r][h] (lanes: the 8 rows of group h, the second group at
 * g + gb) += both groups' nb blocks dotted with 4 rows of x. Each x broadcast feeds both groups'
 * dpbusd, where one group alone loads a broadcast for every dpbusd it issues. Per row and group
 * the same exact integer sum of a block and the same float steps as group_dot: the same numbers. */
PI void group_pair_dot4(const unsigned char *g, size_t gb, ds_dtype dt, size_t bb8, int64_t nb, const ds_qx *x,
                        int64_t in, int64_t i0, __m256 acc[4][2]) {
  const __m256i flip = _mm256_set1_epi8((char)0x80);
  const int64_t xb = in / 32;
  int q8 = dt == DS_Q8_0, has_m = dt == DS_Q4_1 || dt == DS_Q5_1, q5 = dt == DS_Q5_0 || dt == DS_Q5_1;
  for (int64_t b = 0; b < nb; b++) {
    const unsigned char *blk[2] = {g + (size_t)b * bb8, g + gb + (size_t)b * bb8};
    /* the next pair's block b: two streams that jump every group defeat the hardware prefetcher
     * (the model's head, read from memory, ran slower than one group at a time) */
    for (size_t c = 0; c < bb8; c += 64) {
      _mm_prefetch((const char *)blk[0] + 2 * gb + c, _MM_HINT_T0);
      _mm_prefetch((const char *)blk[1] + 2 * gb + c, _MM_HINT_T0);
    }
    __m256i s[4][2], e[2];
    const unsigned char *qs[2];
    for (int h = 0; h < 2; h++) {
      qs[h] = q8 ? blk[h] + 16 : q45_nibbles_at(blk[h], has_m, q5);
      e[h] = q5 ? _mm256_loadu_si256((const __m256i *)(qs[h] - 32)) : _mm256_setzero_si256();
      for (int r = 0; r < 4; r++) s[r][h] = _mm256_setzero_si256();
    }
    if (q8) { /* as group_dot: w + 128 (w XOR 0x80) against x, 128 times x's block sum taken back */
      for (int j = 0; j < 8; j++) {
        __m256i u0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(qs[0] + 32 * j)), flip);
        __m256i u1 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(qs[1] + 32 * j)), flip);
        for (int r = 0; r < 4; r++) {
          __m256i xv = bcast4(x->q + (i0 + r) * in + 32 * b + 4 * j);
          s[r][0] = _mm256_dpbusd_epi32(s[r][0], u0, xv);
          s[r][1] = _mm256_dpbusd_epi32(s[r][1], u1, xv);
          PIN(s[r][0]);
          PIN(s[r][1]);
        }
      }
      for (int r = 0; r < 4; r++) {
        const int16_t *xs = x->s + ((i0 + r) * xb + b) * 2;
        __m256i back = _mm256_set1_epi32(128 * ((int32_t)xs[0] + xs[1]));
        s[r][0] = _mm256_sub_epi32(s[r][0], back), s[r][1] = _mm256_sub_epi32(s[r][1], back);
      }
    } else {
      for (int j = 0; j < 4; j++) { /* low nibbles: values 4j .. 4j+3, high: 16 + 4j .. */
        __m256i lo[2], hi[2];
        for (int h = 0; h < 2; h++) q45_chunk(qs[h], e[h], j, q5, 0, &lo[h], &hi[h]);
        for (int r = 0; r < 4; r++) {
          const int8_t *xq = x->q + (i0 + r) * in + 32 * b + 4 * j;
          __m256i xl = bcast4(xq), xh = bcast4(xq + 16);
          s[r][0] = _mm256_dpbusd_epi32(s[r][0], lo[0], xl);
          s[r][1] = _mm256_dpbusd_epi32(s[r][1], lo[1], xl);
          s[r][0] = _mm256_dpbusd_epi32(s[r][0], hi[0], xh);
          s[r][1] = _mm256_dpbusd_epi32(s[r][1], hi[1], xh);
          PIN(s[r][0]);
          PIN(s[r][1]);
        }
      }
    }
    for (int h = 0; h < 2; h++) {
      __m256 dw = f16x8(blk[h]), mw = q8 ? dw : q45_offset(blk[h], dw, has_m, q5);
      for (int r = 0; r < 4; r++) { /* scale_block's steps written out: through it GCC ran Q8_0 7% slower at 32 rows */
        int64_t k = (i0 + r) * xb + b;
        acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[r][h]), _mm256_mul_ps(dw, _mm256_set1_ps(x->d[k])), acc[r][h]);
        if (!q8) acc[r][h] = _mm256_fmadd_ps(mw, _mm256_set1_ps(x->m[k]), acc[r][h]);
      }
    }
  }
}
#endif

PI void packed_rows(float *y, int64_t ldy, const ds_qx *x, int64_t n, const unsigned char *p, ds_dtype dt,
                    int64_t in, int64_t o0, int64_t o1, const float *bias, size_t pf) {
  /* the block size once per call (ds_quant_row_bytes per group was 1% of a speculative decode) */
  int64_t blk = ds_quant_block(dt), nb = in / blk;
  size_t bb8 = 8 * ds_quant_row_bytes(dt, blk), gb = bb8 * (size_t)nb;
  for (int64_t o = o0; o < o1; o += 8) {
    const unsigned char *g = p + (size_t)(o / 8) * gb;
    __m256 bv = bias ? _mm256_loadu_ps(bias + o) : _mm256_setzero_ps();
    int64_t i = 0;
    int pair = 0; /* the next group done too */
#if PACKED_VNNI
    if (o + 16 <= o1 && n >= 8 && dt != DS_Q4_K && dt != DS_Q6_K) {
      /* two groups at once for every 4 rows of x, the rest of x's rows one group at a time below;
       * from 8 rows: with fewer the weights' bytes bound the product, and the head at 4 rows read
       * them slower two groups at once than one */
      __m256 bv1 = bias ? _mm256_loadu_ps(bias + o + 8) : _mm256_setzero_ps();
      for (; i + 4 <= n; i += 4) {
        __m256 acc[4][2];
        for (int r = 0; r < 4; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
        group_pair_dot4(g, gb, dt, bb8, nb, x, in, i, acc);
        for (int r = 0; r < 4; r++) {
          _mm256_storeu_ps(y + (i + r) * ldy + o, _mm256_add_ps(acc[r][0], bv));
          _mm256_storeu_ps(y + (i + r) * ldy + o + 8, _mm256_add_ps(acc[r][1], bv1));
        }
      }
      for (int64_t i1 = i; i1 < n; i1 += 4) { /* the second group's last rows */
        int R = n - i1 < 4 ? (int)(n - i1) : 4;
        __m256 acc[4];
        for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
        switch (R) {
          case 3: group_dot(g + gb, dt, bb8, nb, x, in, i1, 3, acc, 0); break;
          case 2: group_dot(g + gb, dt, bb8, nb, x, in, i1, 2, acc, 0); break;
          default: group_dot(g + gb, dt, bb8, nb, x, in, i1, 1, acc, 0); break;
        }
        for (int r = 0; r < R; r++) _mm256_storeu_ps(y + (i1 + r) * ldy + o + 8, _mm256_add_ps(acc[r], bv1));
      }
      pair = 1;
    }
#endif
    for (; i < n; i += 4) { /* 4 rows of x per pass over the group (read from L1) */
      int R = n - i < 4 ? (int)(n - i) : 4;
      size_t pfi = i ? 0 : pf; /* the first pass brings the group in; the pair pass prefetched its own */
      __m256 acc[4];
      for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
      switch (R) {
        case 4: group_dot(g, dt, bb8, nb, x, in, i, 4, acc, pfi); break;
        case 3: group_dot(g, dt, bb8, nb, x, in, i, 3, acc, pfi); break;
        case 2: group_dot(g, dt, bb8, nb, x, in, i, 2, acc, pfi); break;
        default: group_dot(g, dt, bb8, nb, x, in, i, 1, acc, pfi); break;
      }
      for (int r = 0; r < R; r++) _mm256_storeu_ps(y + (i + r) * ldy + o, _mm256_add_ps(acc[r], bv));
    }
    o += 8 * pair;
  }
}

PT void PACKED_ROWS(float *y, int64_t ldy, const ds_qx *x, int64_t n, const unsigned char *packed,
                                  ds_dtype dt, int64_t in, int64_t o0, int64_t o1, const float *bias, size_t pf) {
  DS_CHECK(o0 % 8 == 0 && o1 % 8 == 0);
  switch (dt) { /* the type's branch chosen once, outside the loops */
    case DS_Q8_0: packed_rows(y, ldy, x, n, packed, DS_Q8_0, in, o0, o1, bias, pf); break;
    case DS_Q4_0: packed_rows(y, ldy, x, n, packed, DS_Q4_0, in, o0, o1, bias, pf); break;
    case DS_Q4_1: packed_rows(y, ldy, x, n, packed, DS_Q4_1, in, o0, o1, bias, pf); break;
    case DS_Q5_0: packed_rows(y, ldy, x, n, packed, DS_Q5_0, in, o0, o1, bias, pf); break;
    case DS_Q5_1: packed_rows(y, ldy, x, n, packed, DS_Q5_1, in, o0, o1, bias, pf); break;
    case DS_Q4_K: packed_rows(y, ldy, x, n, packed, DS_Q4_K, in, o0, o1, bias, pf); break;
    case DS_Q6_K: packed_rows(y, ldy, x, n, packed, DS_Q6_K, in, o0, o1, bias, pf); break;
    default: DS_CHECK(!"a type without a packed layout");
  }
}

#endif
