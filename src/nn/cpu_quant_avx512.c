/* The quantized row kernel with AVX-512 VNNI (nn/cpu_quant.h), which since every type reads an
 * 8-row packed copy (cpu_quant_vnni_packed.c) takes a weight's last rows when their count is not
 * a multiple of 8, and a weight whose copy could not be made: Q4_0, Q4_1, Q4_K and Q6_K at 512
 * bits with the weight rows across the lanes; Q8_0, Q5_0 and Q5_1 a weight row at a time
 * (nn/cpu_quant_x86.h at 256 bits, one dpbusd as its integer dot product; why at the dispatch
 * below).
 *
 * Lanes are weight rows: 16 rows' block b is transposed in registers so that vector j holds
 * dword j (4 consecutive quants) of every row, and one dpbusd against x's matching 4 bytes
 * broadcast adds those 4 products for 16 rows at once; 8 such (the low / high nibbles of 4
 * dwords) give each row's integer dot over a block of 32, converted and scaled by dw (a vector
 * of the 16 rows' scales) times x's step, the min / offset term beside it. The
 * transposition is shared by up to 8 rows of x, so verifying a few tokens costs little more than
 * decoding one (against a weight row at a time: every row of x paid the unpacking and the
 * per-block scalar scales again). Each row's sums run in
 * block order whatever the number of rows of x and of weights in the call, so a row's result
 * does not depend on its call (verification equals decoding, bit for bit). */
#if defined(__x86_64__) || defined(__i386__)
#define QT __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define QDOT(u, s) _mm256_dpbusd_epi32(_mm256_setzero_si256(), (u), (s))
#define QROWS q_rows_vnni256
#define QROWS_LINKAGE static
#include "nn/cpu_quant_x86.h"

enum { Z_ROWS = 16, Z_MAX_X = 8 }; /* weight rows per lane vector; rows of x per pass */

static const unsigned char z_zeros[64]; /* the bytes of a missing weight row of a partial group */

/* 16 rows' 16 bytes (row l at p[l]) as 4 vectors of their dwords: out[j] lane l = dword j of row l. */
QI void z_transpose16x4(const unsigned char *const *p, __m512i *out) {
  const __m512i idx = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  __m512i z[4];
  for (int i = 0; i < 4; i++) { /* 128-bit lane m of z[i]: row 4i + m; then lane j: dword j of those 4 rows */
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)p[4 * i]));
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)p[4 * i + 1]), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)p[4 * i + 2]), 2);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)p[4 * i + 3]), 3);
    z[i] = _mm512_permutexvar_epi32(idx, v);
  }
  __m512i t0 = _mm512_shuffle_i64x2(z[0], z[1], _MM_SHUFFLE(1, 0, 1, 0));
  __m512i t1 = _mm512_shuffle_i64x2(z[0], z[1], _MM_SHUFFLE(3, 2, 3, 2));
  __m512i t2 = _mm512_shuffle_i64x2(z[2], z[3], _MM_SHUFFLE(1, 0, 1, 0));
  __m512i t3 = _mm512_shuffle_i64x2(z[2], z[3], _MM_SHUFFLE(3, 2, 3, 2));
  out[0] = _mm512_shuffle_i64x2(t0, t2, _MM_SHUFFLE(2, 0, 2, 0));
  out[1] = _mm512_shuffle_i64x2(t0, t2, _MM_SHUFFLE(3, 1, 3, 1));
  out[2] = _mm512_shuffle_i64x2(t1, t3, _MM_SHUFFLE(2, 0, 2, 0));
  out[3] = _mm512_shuffle_i64x2(t1, t3, _MM_SHUFFLE(3, 1, 3, 1));
}

/* The integer dots of a block of 32 for 16 weight rows: wv[j] holds dword j (values 4j .. 4j + 3)
 * of every row, xq x's 32 bytes. s0 sums values 0-15, s1 values 16-31: two chains, so neither
 * waits on the other, and the halves Q6_K scales apart. */
QI void z_dot32(const __m512i *wv, const int8_t *xq, __m512i *s0, __m512i *s1) {
  int32_t v[8];
  memcpy(v, xq, 32);
  __m512i a = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[0], _mm512_set1_epi32(v[0]));
  __m512i c = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[4], _mm512_set1_epi32(v[4]));
  for (int j = 1; j < 4; j++)
    a = _mm512_dpbusd_epi32(a, wv[j], _mm512_set1_epi32(v[j])), c = _mm512_dpbusd_epi32(c, wv[4 + j], _mm512_set1_epi32(v[4 + j]));
  *s0 = a, *s1 = c;
}

/* One block b of 16 weight rows (row l's at blk[l]; missing rows of a partial group read zeros)
 * against R rows of x from i0: per lane (weight row), accf[r] += (integer dot) * dw * d_x and
 * accm[r] += mw * m_x (the min / offset term). */
QI void z_block16(ds_dtype dt, const unsigned char *blk0, size_t rb, int rows, const ds_qx *x, int64_t i0, int64_t in,
                  int64_t b, int R, __m512 *accf, __m512 *accm) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  __m512i wv[8];
  const unsigned char *p[Z_ROWS];
  int q41 = dt == DS_Q4_1;
  /* the scales: each row's first dword (d, then Q4_1's min); 16 loads measured faster than one
   * gather on an AMD EPYC (Zen 4) */
  int32_t sc[Z_ROWS] = {0};
  for (int l = 0; l < Z_ROWS; l++)
    if (rows == Z_ROWS || l < rows) memcpy(sc + l, blk0 + (size_t)l * rb, 4);
  __m512i g = _mm512_loadu_si512(sc);
  __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
  __m512 mw = q41 ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g, 16))) : dw;
  for (int l = 0; l < Z_ROWS; l++) p[l] = rows == Z_ROWS || l < rows ? blk0 + (size_t)l * rb + (q41 ? 4 : 2) : z_zeros;
  __m512i t[4];
  z_transpose16x4(p, t);
  for (int j = 0; j < 4; j++) /* dword j: values 4j..4j+3 (low nibbles), 16+4j..16+4j+3 (high) */
    wv[j] = _mm512_and_si512(t[j], m4), wv[4 + j] = _mm512_and_si512(_mm512_srli_epi16(t[j], 4), m4);
  for (int r = 0; r < R; r++) { /* the nibbles unsigned, x signed */
    __m512i s0, s1;
    z_dot32(wv, x->q + (i0 + r) * in + 32 * b, &s0, &s1);
    s0 = _mm512_add_epi32(s0, s1);
    int64_t k = (i0 + r) * (in / 32) + b;
    accf[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_mul_ps(dw, _mm512_set1_ps(x->d[k])), accf[r]);
    accm[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(x->m[k]), accm[r]);
  }
}

/* Q4_K (256 values: d, dmin, 12 bytes of 6-bit scales / mins of 8 sub-blocks of 32, then 4 x 32
 * bytes whose low nibbles are sub-block 2g and high nibbles 2g + 1): the first 16 bytes of 16
 * rows transposed give d, dmin and the packed scales as vectors, unpacked for the 16 rows at once;
 * then each sub-block as a Q4_1 block, its scale d * sc and min dmin * mn (accm: subtracted). */
QI void z_block16_q4k(const unsigned char *blk0, size_t rb, int rows, const ds_qx *x, int64_t i0, int64_t in,
                      int64_t b, int R, __m512 *accf, __m512 *accm) {
  const __m512i m4 = _mm512_set1_epi8(0x0F), m6 = _mm512_set1_epi8(0x3F), hi2 = _mm512_set1_epi8(0x30);
  const unsigned char *p[Z_ROWS];
  for (int l = 0; l < Z_ROWS; l++) p[l] = rows == Z_ROWS || l < rows ? blk0 + (size_t)l * rb : z_zeros;
  __m512i h[4];
  z_transpose16x4(p, h); /* h[0]: d | dmin << 16; h[1..3]: scale bytes 0-3, 4-7, 8-11 */
  __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h[0]));
  __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h[0], 16)));
  __m512i sc[2], mn[2]; /* bytes j of sub-blocks j (0-3) and 4 + j */
  sc[0] = _mm512_and_si512(h[1], m6), mn[0] = _mm512_and_si512(h[2], m6);
  sc[1] = _mm512_or_si512(_mm512_and_si512(h[3], m4), _mm512_and_si512(_mm512_srli_epi32(h[1], 2), hi2));
  mn[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(h[3], 4), m4),
                          _mm512_and_si512(_mm512_srli_epi32(h[2], 2), hi2));
  for (int g = 0; g < 4; g++) {
    __m512i t[8];
    for (int l = 0; l < Z_ROWS; l++) p[l] = rows == Z_ROWS || l < rows ? blk0 + (size_t)l * rb + 16 + 32 * g : z_zeros;
    z_transpose16x4(p, t);
    for (int l = 0; l < Z_ROWS; l++) p[l] += rows == Z_ROWS || l < rows ? 16 : 0;
    z_transpose16x4(p, t + 4);
    for (int half = 0; half < 2; half++) { /* sub-block 2g + half: the low, then the high nibbles */
      int j = 2 * g + half;
      __m512i wv[8];
      for (int q = 0; q < 8; q++)
        wv[q] = half ? _mm512_and_si512(_mm512_srli_epi16(t[q], 4), m4) : _mm512_and_si512(t[q], m4);
      __m512i sj = _mm512_and_si512(_mm512_srli_epi32(sc[j / 4], 8 * (j % 4)), _mm512_set1_epi32(0xFF));
      __m512i mj = _mm512_and_si512(_mm512_srli_epi32(mn[j / 4], 8 * (j % 4)), _mm512_set1_epi32(0xFF));
      __m512 ds = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sj)), dm = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(mj));
      for (int r = 0; r < R; r++) {
        int64_t k = (i0 + r) * (in / 32) + 8 * b + j; /* x's block of 32 */
        __m512i s0, s1;
        z_dot32(wv, x->q + (i0 + r) * in + 32 * (8 * b + j), &s0, &s1);
        s0 = _mm512_add_epi32(s0, s1);
        accf[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_mul_ps(ds, _mm512_set1_ps(x->d[k])), accf[r]);
        accm[r] = _mm512_fmadd_ps(dm, _mm512_set1_ps(x->m[k]), accm[r]);
      }
    }
  }
}

/* Q6_K (256 values: ql[128] low 4 bits, qh[64] high 2 bits, 16 int8 scales of 16 values, d):
 * per half h of 128 values, group c (values 32c .. 32c + 31 of the half) takes the low (c < 2) or
 * high (c >= 2) nibbles of ql bytes 64h + 32 (c % 2) .. + 31 and bits 2c, 2c + 1 of qh bytes
 * 32h .. + 31; its first 16 values have scale 8h + 2c, the next 16 scale 8h + 2c + 1. The two
 * integer chains of a group are its two scales' halves; x = d sc (q - 32), the 32 applied
 * through x's sums of 16 (accm). */
QI void z_block16_q6k(const unsigned char *blk0, size_t rb, int rows, const ds_qx *x, int64_t i0, int64_t in,
                      int64_t b, int R, __m512 *accf, __m512 *accm) {
  const __m512i m4 = _mm512_set1_epi8(0x0F), m2 = _mm512_set1_epi8(3);
  const unsigned char *p[Z_ROWS];
  int live[Z_ROWS];
  for (int l = 0; l < Z_ROWS; l++) live[l] = rows == Z_ROWS || l < rows;
  int32_t dh[Z_ROWS] = {0};
  for (int l = 0; l < Z_ROWS; l++)
    if (live[l]) memcpy(dh + l, blk0 + (size_t)l * rb + 208, 2);
  __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_loadu_si512(dh)));
  __m512i sc[4]; /* dword i: scales 4i .. 4i + 3 of the 16 rows */
  for (int l = 0; l < Z_ROWS; l++) p[l] = live[l] ? blk0 + (size_t)l * rb + 192 : z_zeros;
  z_transpose16x4(p, sc);
  for (int h = 0; h < 2; h++) {
    __m512i qh[8], ql[2][8];
    for (int l = 0; l < Z_ROWS; l++) p[l] = live[l] ? blk0 + (size_t)l * rb + 128 + 32 * h : z_zeros;
    z_transpose16x4(p, qh);
    for (int l = 0; l < Z_ROWS; l++) p[l] += live[l] ? 16 : 0;
    z_transpose16x4(p, qh + 4);
    for (int half = 0; half < 2; half++) {
      for (int l = 0; l < Z_ROWS; l++) p[l] = live[l] ? blk0 + (size_t)l * rb + 64 * h + 32 * half : z_zeros;
      z_transpose16x4(p, ql[half]);
      for (int l = 0; l < Z_ROWS; l++) p[l] += live[l] ? 16 : 0;
      z_transpose16x4(p, ql[half] + 4);
    }
    for (int c = 0; c < 4; c++) {
      __m512i wv[8];
      for (int q = 0; q < 8; q++) {
        __m512i lo = c < 2 ? _mm512_and_si512(ql[c % 2][q], m4) : _mm512_and_si512(_mm512_srli_epi16(ql[c % 2][q], 4), m4);
        __m512i hb = _mm512_and_si512(_mm512_srli_epi16(qh[q], 2 * c), m2);
        wv[q] = _mm512_or_si512(lo, _mm512_slli_epi16(hb, 4));
      }
      int i0s = 8 * h + 2 * c; /* the scale of values 0-15 of the group; i0s + 1 of 16-31 */
      __m512i s_a = _mm512_srai_epi32(_mm512_slli_epi32(sc[i0s / 4], 24 - 8 * (i0s % 4)), 24);
      __m512i s_b = _mm512_srai_epi32(_mm512_slli_epi32(sc[(i0s + 1) / 4], 24 - 8 * ((i0s + 1) % 4)), 24);
      __m512 da = _mm512_mul_ps(d, _mm512_cvtepi32_ps(s_a)), db = _mm512_mul_ps(d, _mm512_cvtepi32_ps(s_b));
      int64_t kb = 8 * b + 4 * h + c; /* x's block of 32 */
      for (int r = 0; r < R; r++) {
        int64_t k = (i0 + r) * (in / 32) + kb;
        __m512i s0, s1; /* values 0-15 (scale da), 16-31 (db) */
        z_dot32(wv, x->q + (i0 + r) * in + 32 * kb, &s0, &s1);
        float dx = x->d[k];
        __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(s0), da);
        t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), db, t);
        accf[r] = _mm512_fmadd_ps(t, _mm512_set1_ps(dx), accf[r]);
        __m512 u = _mm512_mul_ps(da, _mm512_set1_ps((float)x->s[2 * k]));
        u = _mm512_fmadd_ps(db, _mm512_set1_ps((float)x->s[2 * k + 1]), u);
        accm[r] = _mm512_fmadd_ps(u, _mm512_set1_ps(dx), accm[r]);
      }
    }
  }
}

/* y[i0 + r, o0 + l] for l < rows (at most 16) and r < R: the group's weight rows against R rows
 * of x. Lane l's sums run in block order whatever R and rows are: a row's result depends on
 * nothing else in its call. */
QI void z_group(float *y, int64_t ldy, const ds_qx *x, int64_t i0, int R, const unsigned char *w, size_t rb,
                ds_dtype dt, int64_t in, int64_t o0, int rows, const float *bias) {
  int64_t blk = ds_quant_block(dt), nb = in / blk;
  size_t bb = ds_quant_row_bytes(dt, blk);
  __mmask16 live = (__mmask16)((1u << rows) - 1);
  __m512 accf[Z_MAX_X], accm[Z_MAX_X];
  for (int r = 0; r < R; r++) accf[r] = accm[r] = _mm512_setzero_ps();
  const unsigned char *g0 = w + (size_t)o0 * rb, *next = g0 + Z_ROWS * rb;
  int64_t ahead = ((int64_t)(Z_ROWS * rb) / nb + 63) & ~(int64_t)63; /* bytes prefetched per block */
  for (int64_t b = 0; b < nb; b++) {
    if (i0 == 0 && rows == Z_ROWS) /* the next group's rows (contiguous), spread over this group's blocks */
      for (int64_t c = 0; c < ahead; c += 64) _mm_prefetch((const char *)next + b * ahead + c, _MM_HINT_T0);
    const unsigned char *gb = g0 + (size_t)b * bb;
    if (dt == DS_Q4_K && rows == Z_ROWS) z_block16_q4k(gb, rb, Z_ROWS, x, i0, in, b, R, accf, accm);
    else if (dt == DS_Q4_K) z_block16_q4k(gb, rb, rows, x, i0, in, b, R, accf, accm);
    else if (dt == DS_Q6_K && rows == Z_ROWS) z_block16_q6k(gb, rb, Z_ROWS, x, i0, in, b, R, accf, accm);
    else if (dt == DS_Q6_K) z_block16_q6k(gb, rb, rows, x, i0, in, b, R, accf, accm);
    else if (rows == Z_ROWS) z_block16(dt, gb, rb, Z_ROWS, x, i0, in, b, R, accf, accm);
    else z_block16(dt, gb, rb, rows, x, i0, in, b, R, accf, accm);
  }
  __m512 bv = bias ? _mm512_maskz_loadu_ps(live, bias + o0) : _mm512_setzero_ps();
  /* Q4_0: x = d (q - 8); Q4_K: x = d sc q - dmin mn; Q6_K: x = d sc (q - 32) */
  __m512 ms = _mm512_set1_ps(dt == DS_Q4_0 ? -8.0f : dt == DS_Q4_K ? -1.0f : dt == DS_Q6_K ? -32.0f : 1.0f);
  for (int r = 0; r < R; r++) {
    __m512 v = _mm512_fmadd_ps(ms, accm[r], accf[r]);
    _mm512_mask_storeu_ps(y + (i0 + r) * ldy + o0, live, _mm512_add_ps(v, bv));
  }
}

QI void z_rows(float *y, int64_t ldy, const ds_qx *x, int64_t n, const unsigned char *w, ds_dtype dt, int64_t in,
               int64_t o0, int64_t o1, const float *bias) {
  size_t rb = ds_quant_row_bytes(dt, in);
  for (int64_t o = o0; o < o1; o += Z_ROWS) {
    int rows = o1 - o < Z_ROWS ? (int)(o1 - o) : Z_ROWS;
    for (int64_t i = 0; i < n; i += Z_MAX_X) {
      int R = n - i < Z_MAX_X ? (int)(n - i) : Z_MAX_X;
      switch (R) {
        case 8: z_group(y, ldy, x, i, 8, w, rb, dt, in, o, rows, bias); break;
        case 7: z_group(y, ldy, x, i, 7, w, rb, dt, in, o, rows, bias); break;
        case 6: z_group(y, ldy, x, i, 6, w, rb, dt, in, o, rows, bias); break;
        case 5: z_group(y, ldy, x, i, 5, w, rb, dt, in, o, rows, bias); break;
        case 4: z_group(y, ldy, x, i, 4, w, rb, dt, in, o, rows, bias); break;
        case 3: z_group(y, ldy, x, i, 3, w, rb, dt, in, o, rows, bias); break;
        case 2: z_group(y, ldy, x, i, 2, w, rb, dt, in, o, rows, bias); break;
        default: z_group(y, ldy, x, i, 1, w, rb, dt, in, o, rows, bias); break;
      }
    }
  }
}

QT void ds_quant_rows_vnni(float *y, int64_t ldy, const ds_qx *x, int64_t n, const unsigned char *w, ds_dtype dt,
                           int64_t in, int64_t o0, int64_t o1, const float *bias) {
  switch (dt) {
    /* Q8_0 a weight row at a time (nn/cpu_quant_x86.h with dpbusd): its 34-byte blocks make a group of 16 rows
     * 2x Q4_1's bytes, 26 KiB on a 1536-wide matrix, and with the next group prefetched beside it
     * the L1 thrashed: SmolLM2 Q8_0 decoded 67 / 105 tokens/s on 1 / 2 threads with the rows
     * across the lanes against 100 / 154 a row at a time (AMD EPYC Zen 4). */
    case DS_Q8_0: q_rows_vnni256(y, ldy, x, n, w, DS_Q8_0, in, o0, o1, bias); break;
    case DS_Q5_0: /* a weight row at a time too (their packed kernel takes every group of 8 rows) */
    case DS_Q5_1: q_rows_vnni256(y, ldy, x, n, w, dt, in, o0, o1, bias); break;
    case DS_Q4_0: z_rows(y, ldy, x, n, w, DS_Q4_0, in, o0, o1, bias); break;
    case DS_Q4_1: z_rows(y, ldy, x, n, w, DS_Q4_1, in, o0, o1, bias); break;
    case DS_Q4_K: z_rows(y, ldy, x, n, w, DS_Q4_K, in, o0, o1, bias); break;
    case DS_Q6_K: z_rows(y, ldy, x, n, w, DS_Q6_K, in, o0, o1, bias); break;
    default: DS_CHECK(!"a quantized dtype the kernels do not know");
  }
}
#endif
