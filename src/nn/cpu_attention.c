/* CPU causal attention over a KV cache (inference: decode, verification, prefill; fp32 or f16
 * caches). The draft's block attention is in cpu_block_attention.c, the training causal
 * attention in cpu_causal_attention.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include "dspark/backend.h"
#include "dspark/dtype.h"
#include "nn/cpu_kernels.h"
#include "nn/fast_exp.h"

/* ---------------------------------------------------------------- causal attention (KV cache) */

/* Queries per sgemm; a call of at most ATTN_ROWWISE_MAX queries (decode, verification of a short
 * draft) takes attention_decode below, each query over exactly its visible keys, so a row's output
 * does not depend on the other rows of its call: the target's numbers for a token are then the
 * same in a verification as in plain decoding (with quantized weights, whose activations are
 * rounded to 8 bits, a last-bit difference here could flip a rounding and part `speculate` from
 * `generate`; nn/cpu_quant.h's direct path is row-independent up to the same count). */
enum { ATTN_QCHUNK = 64, ATTN_ROWWISE_MAX = 8 };

/* ---- decode and short verification: n <= ATTN_ROWWISE_MAX queries ----
 * Each query reads its visible keys in blocks of ATTN_KEY_BLOCK, a task per (kv head, key block)
 * for every query row that sees the block and every query head of the GQA group: the block's
 * keys are read once and taken 8 at a time by each (row, head) pair while in L1, and with
 * AVX-512 its value rows once for up to 4 pairs (a task per row and query head read the block
 * again from L2 each time: a verification of 8 tokens at 1024 of context took 1.2-1.35x longer).
 * The blocks spread a long context over the threads, and each pair keeps its unnormalized
 * partial softmax (max, sum, weighted values), merged in block order after. Blocks are fixed by
 * key position and each pair's operations run in the same order whatever else the task holds,
 * so a query's numbers do not depend on the other rows of the call or on the thread count.
 * Scores, exps and sums run in DS_LANES lanes the compiler vectorizes (the sgemm this replaced,
 * one row at a time, and libm's expf for every score made decoding after a 2048-token prompt
 * 3.2x slower than from an empty context). */
enum { ATTN_KEY_BLOCK = 128, DS_LANES = 16, MIX_COLS = 32 }; /* 128 keys of 64 fp32 values: 32 KiB */
/* Where the kernels cannot widen f16 keys (values) in registers (a head size not a multiple of 8,
 * no F16C; values without AVX-512): widened this many at a time into an L1 scratch, a multiple of
 * 8 (group_scores' step): 4 KiB at hd 64 (a block's 64 KiB widened whole went to L2 first) */
enum { WIDEN_KEYS = 16 };
/* How many keys ahead group_scores_f16 asks for the keys it reads next (its first pass over a
 * block); with the values of the keys it scores asked for then, for the mix after the softmax. */
enum { PREFETCH_KEYS_AHEAD = 8 };

/* The block a thread will likely take next (its keys' and values' first bytes, and how many),
 * asked for into L2 while it scores the current one; bytes 0: none. */
typedef struct {
  const char *k, *v;
  int64_t bytes;
} next_block;

/* The DS_LANES partial sums added as a tree (halves onto halves: vector adds, where a left-to-right
 * sum was 15 dependent scalar adds a key). */
static inline float lanes_sum(float *acc) {
  _Static_assert(DS_LANES == 16, "the tree below adds 16 lanes");
  for (int l = 0; l < 8; l++) acc[l] += acc[l + 8]; /* constant widths: unrolled, in registers */
  for (int l = 0; l < 4; l++) acc[l] += acc[l + 4];
  for (int l = 0; l < 2; l++) acc[l] += acc[l + 2];
  return acc[0] + acc[1];
}

/* q . k over hd values, in DS_LANES partial sums added in a fixed order. */
static inline float dot_lanes(const float *q, const float *k, int64_t hd) {
  float acc[DS_LANES] = {0};
  int64_t e = 0;
  for (; e + DS_LANES <= hd; e += DS_LANES)
    for (int l = 0; l < DS_LANES; l++) acc[l] += q[e + l] * k[e + l];
  for (int l = 0; e + l < hd; l++) acc[l] += q[e + l] * k[e + l];
  return lanes_sum(acc);
}

#if defined(__AVX2__) && defined(__FMA__)
#define DECODE_AVX2 1

/* Four keys' 8-lane sums, each added pairwise by hadd. */
static inline __m128 sum4_avx2(__m256 s0, __m256 s1, __m256 s2, __m256 s3) {
  __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(s0, s1), _mm256_hadd_ps(s2, s3));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* score[0..4) = q . k0..k3 (hd a multiple of 8): lane sums of 8-wide products, added pairwise by
 * hadd (key 0 of a call with fewer keys passes copies of itself and gets the same bits). */
static inline __m128 dot4_avx2(const float *q, const float *k0, const float *k1, const float *k2, const float *k3,
                               int64_t hd) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (int64_t e = 0; e < hd; e += 8) {
    __m256 qv = _mm256_loadu_ps(q + e);
    s0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + e), s0);
    s1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + e), s1);
    s2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + e), s2);
    s3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + e), s3);
  }
  return sum4_avx2(s0, s1, s2, s3);
}

/* out[0 .. 8C) = sum_t score[t] v_t[0 .. 8C) (v rows hd apart), C accumulators in registers;
 * with add, the sums continue from out's values (a block's keys taken in pieces: the same
 * additions in the same order). */
static inline __attribute__((always_inline)) void mix_avx2(float *out, const float *score, const float *v,
                                                           int64_t nk, int64_t hd, int C, int add) {
  __m256 a[8];
  for (int c = 0; c < C; c++) a[c] = add ? _mm256_loadu_ps(out + 8 * c) : _mm256_setzero_ps();
  for (int64_t t = 0; t < nk; t++) {
    __m256 p = _mm256_broadcast_ss(score + t);
    for (int c = 0; c < C; c++) a[c] = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + t * hd + 8 * c), a[c]);
  }
  for (int c = 0; c < C; c++) _mm256_storeu_ps(out + 8 * c, a[c]);
}

#if defined(__AVX512F__)
#define DECODE_AVX512 1
/* out[h][0 .. 16C) = sum_t p_h[t] v_t[0 .. 16C) (p_h rows ATTN_KEY_BLOCK apart) for H query
 * heads at once, each value row (16C values: whole rows, read in order; fp32, or f16 bits when
 * f16) loaded once for the H heads; every column sums over t in order, as mix_avx2 does, so the
 * numbers are its. */
static inline __attribute__((always_inline)) void mixg_avx512(float *const *out, const float *p, const void *v,
                                                              int f16, int64_t nk, int64_t hd, int H, int C, int add) {
  __m512 a[4][8];
  for (int h = 0; h < H; h++)
    for (int c = 0; c < C; c++) a[h][c] = add ? _mm512_loadu_ps(out[h] + 16 * c) : _mm512_setzero_ps();
  for (int64_t t = 0; t < nk; t++) {
    __m512 vv[8]; /* an f16 row widened in registers, once for the H heads (exact: the same sums) */
    for (int c = 0; c < C; c++)
      vv[c] = f16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)((const uint16_t *)v + t * hd +
                                                                                          16 * c)))
                  : _mm512_loadu_ps((const float *)v + t * hd + 16 * c);
    for (int h = 0; h < H; h++) {
      __m512 w = _mm512_set1_ps(p[h * ATTN_KEY_BLOCK + t]);
      for (int c = 0; c < C; c++) a[h][c] = _mm512_fmadd_ps(w, vv[c], a[h][c]);
    }
  }
  for (int h = 0; h < H; h++)
    for (int c = 0; c < C; c++) _mm512_storeu_ps(out[h] + 16 * c, a[h][c]);
}
#endif

/* score[0..8) = scale * q . k_0..k_7, the keys hd apart from k (hd a multiple of 8): dot4_avx2's
 * numbers for each key, with 8 independent sums in flight where 4 left the FMA units waiting on
 * their latency (the scores were 60% of a decode step's attention on AMD Zen 4). */
static inline void dot8_avx2(float *score, const float *q, const float *k, int64_t hd, __m128 sc) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
  for (int64_t e = 0; e < hd; e += 8) {
    __m256 qv = _mm256_loadu_ps(q + e);
    s0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + e), s0);
    s1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + hd + e), s1);
    s2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 2 * hd + e), s2);
    s3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 3 * hd + e), s3);
    s4 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 4 * hd + e), s4);
    s5 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 5 * hd + e), s5);
    s6 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 6 * hd + e), s6);
    s7 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 7 * hd + e), s7);
  }
  _mm_storeu_ps(score, _mm_mul_ps(sc, sum4_avx2(s0, s1, s2, s3)));
  _mm_storeu_ps(score + 4, _mm_mul_ps(sc, sum4_avx2(s4, s5, s6, s7)));
}

#ifdef __F16C__
#define DECODE_F16_SCORES 1
/* The query vectors dot4_f16 takes at once: with AVX-512's 32 registers 6 (24 sums, 4 keys, a
 * query), each key widened once for more of them (5% of a 4-row verification's attention on AMD
 * Zen 4); AVX2's 16 hold 3. */
#if defined(__AVX512F__)
enum { F16_SCORE_VECTORS = 6 };
#else
enum { F16_SCORE_VECTORS = 3 };
#endif
/* score_p[0..4) (rows ATTN_KEY_BLOCK apart) = scale * q_p . k_0..k_3 for P <= F16_SCORE_VECTORS query vectors and
 * four f16 keys (k[u] rows; a tail repeats a key), each key widened in registers once for the P
 * vectors: per key and vector the lane sums and the hadd tree of dot8_avx2 / dot4_avx2, so the
 * numbers are the fp32 path's on the widened keys, without widening them through memory (a block's
 * keys stored to L1 and read back for each vector took half of an f16 cache's decode attention). */
static inline __attribute__((always_inline)) void dot4_f16(float *score, const float *const *q, int P,
                                                           const uint16_t *const *k, int64_t hd, __m128 sc) {
  __m256 s[F16_SCORE_VECTORS][4];
  for (int p = 0; p < P; p++)
    for (int u = 0; u < 4; u++) s[p][u] = _mm256_setzero_ps();
  for (int64_t e = 0; e < hd; e += 8) {
    __m256 kv[4];
    for (int u = 0; u < 4; u++)
      kv[u] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(k[u] + e)));
    for (int p = 0; p < P; p++) {
      __m256 qv = _mm256_loadu_ps(q[p] + e);
#if defined(__AVX512F__)
      /* in a register: GCC folded the load into each of the 4 multiply-adds, and AMD Zen 4's two
       * vector loads a cycle, not its multiply-adds, bound the scores (24% of a decode's
       * attention, the same numbers); AVX2's 16 registers have no room for it */
      __asm__("" : "+x"(qv));
#endif
      for (int u = 0; u < 4; u++) s[p][u] = _mm256_fmadd_ps(qv, kv[u], s[p][u]);
    }
  }
  for (int p = 0; p < P; p++)
    _mm_storeu_ps(score + p * ATTN_KEY_BLOCK, _mm_mul_ps(sc, sum4_avx2(s[p][0], s[p][1], s[p][2], s[p][3])));
}

/* group_scores' numbers for f16 keys (hd a multiple of 8): the vectors F16_SCORE_VECTORS at a time,
 * the keys four at a time (a key's score does not depend on the others of its call); vh: the values
 * of the same keys, asked for from memory here, with the next block (nx) spread over the keys. */
static void group_scores_f16(float *score, const float *const *q, int64_t P, const uint16_t *kh,
                             const uint16_t *vh, int64_t nk, int64_t hd, float scale, const next_block *nx) {
  __m128 sc = _mm_set1_ps(scale);
  int64_t nx_asked = 0;
  for (int64_t p0 = 0; p0 < P; p0 += F16_SCORE_VECTORS) {
    int np = P - p0 < F16_SCORE_VECTORS ? (int)(P - p0) : F16_SCORE_VECTORS;
    for (int64_t j = 0; j < nk; j += 4) {
      if (p0 == 0) { /* the cache comes from memory: after a layer's weights went through, the
                      * hardware's prefetch alone left a task's block waiting on it (docs/compute.md,
                      * "The KV cache"; the same numbers) */
        int64_t ja = j + PREFETCH_KEYS_AHEAD, row = hd * (int64_t)sizeof(uint16_t);
        int64_t vbytes = (nk - j < 4 ? nk - j : 4) * row, kbytes = ja < nk ? (nk - ja < 4 ? nk - ja : 4) * row : 0;
        const char *vp = (const char *)(vh + j * hd), *kp = kbytes ? (const char *)(kh + ja * hd) : NULL;
        for (int64_t off = 0; off < vbytes; off += 64) _mm_prefetch(vp + off, _MM_HINT_T0);
        for (int64_t off = 0; off < kbytes; off += 64) _mm_prefetch(kp + off, _MM_HINT_T0);
        for (int64_t upto = j + 4 >= nk ? nx->bytes : nx->bytes * (j + 4) / nk; nx_asked < upto; nx_asked += 64)
          _mm_prefetch(nx->k + nx_asked, _MM_HINT_T1), _mm_prefetch(nx->v + nx_asked, _MM_HINT_T1);
      }
      const uint16_t *k[4];
      for (int u = 0; u < 4; u++) k[u] = kh + (j + u < nk ? j + u : j) * hd;
      float *out = score + p0 * ATTN_KEY_BLOCK + j, tail[F16_SCORE_VECTORS * ATTN_KEY_BLOCK];
      float *dst = j + 4 <= nk ? out : tail; /* a tail's 4 stores would pass the row's end */
      switch (np) { /* constant counts: registers */
#if defined(__AVX512F__)
        case 6: dot4_f16(dst, q + p0, 6, k, hd, sc); break;
        case 5: dot4_f16(dst, q + p0, 5, k, hd, sc); break;
        case 4: dot4_f16(dst, q + p0, 4, k, hd, sc); break;
#endif
        case 3: dot4_f16(dst, q + p0, 3, k, hd, sc); break;
        case 2: dot4_f16(dst, q + p0, 2, k, hd, sc); break;
        default: dot4_f16(dst, q + p0, 1, k, hd, sc); break;
      }
      if (dst == tail)
        for (int p = 0; p < np; p++)
          for (int64_t u = 0; j + u < nk; u++) out[p * ATTN_KEY_BLOCK + u] = tail[p * ATTN_KEY_BLOCK + u];
    }
  }
}
#endif
#endif /* AVX2 */

/* score[j] = scale * q . k_j for the nk keys from kh (rows of hd). */
static void block_scores(float *score, const float *q, const float *kh, int64_t nk, int64_t hd, float scale) {
#ifdef DECODE_AVX2
  if (hd % 8 == 0) {
    __m128 sc = _mm_set1_ps(scale);
    int64_t j = 0;
    for (; j + 8 <= nk; j += 8) dot8_avx2(score + j, q, kh + j * hd, hd, sc);
    for (; j < nk; j += 4) {
      const float *k0 = kh + j * hd, *k1 = j + 1 < nk ? k0 + hd : k0, *k2 = j + 2 < nk ? k0 + 2 * hd : k0;
      const float *k3 = j + 3 < nk ? k0 + 3 * hd : k0;
      float s4[4];
      _mm_storeu_ps(s4, _mm_mul_ps(sc, dot4_avx2(q, k0, k1, k2, k3, hd)));
      for (int u = 0; u < 4 && j + u < nk; u++) score[j + u] = s4[u];
    }
    return;
  }
#endif
  for (int64_t j = 0; j < nk; j++) score[j] = scale * dot_lanes(q, kh + j * hd, hd);
}

/* acc[hd] = sum_t score[t] v_t over the nk value rows from vh (with add: acc += the same sums,
 * continued from acc's values, the additions in mix order). */
static void block_mix(float *acc, const float *score, const float *vh, int64_t nk, int64_t hd, int add) {
#ifdef DECODE_AVX2
  if (hd % 8 == 0) {
    for (int64_t e0 = 0; e0 < hd; e0 += 64) /* 8 registers of columns at a time: constant counts */
      switch ((hd - e0) / 8 < 8 ? (int)((hd - e0) / 8) : 8) {
        case 8: mix_avx2(acc + e0, score, vh + e0, nk, hd, 8, add); break;
        case 7: mix_avx2(acc + e0, score, vh + e0, nk, hd, 7, add); break;
        case 6: mix_avx2(acc + e0, score, vh + e0, nk, hd, 6, add); break;
        case 5: mix_avx2(acc + e0, score, vh + e0, nk, hd, 5, add); break;
        case 4: mix_avx2(acc + e0, score, vh + e0, nk, hd, 4, add); break;
        case 3: mix_avx2(acc + e0, score, vh + e0, nk, hd, 3, add); break;
        case 2: mix_avx2(acc + e0, score, vh + e0, nk, hd, 2, add); break;
        default: mix_avx2(acc + e0, score, vh + e0, nk, hd, 1, add); break;
      }
    return;
  }
#endif
  /* MIX_COLS columns at a time in a local accumulator: summed into acc directly, each key's row
   * was a load and a store of every column */
  for (int64_t e0 = 0; e0 < hd; e0 += MIX_COLS) {
    int64_t ne = hd - e0 < MIX_COLS ? hd - e0 : MIX_COLS;
    float a[MIX_COLS] = {0};
    if (add) memcpy(a, acc + e0, (size_t)ne * sizeof(float));
    for (int64_t t = 0; t < nk; t++)
      for (int64_t l = 0; l < ne; l++) a[l] += score[t] * vh[t * hd + e0 + l];
    memcpy(acc + e0, a, (size_t)ne * sizeof(float));
  }
}

/* score_p[j] (rows ATTN_KEY_BLOCK apart) = scale * q[p] . k_j for P query vectors (heads of a
 * GQA group, of one or more query rows) and the nk keys from kh: block_scores' numbers, the
 * vectors taking 8 keys in turn while those keys are in L1. */
static void group_scores(float *score, const float *const *q, int64_t P, const float *kh, int64_t nk, int64_t hd,
                         float scale) {
#ifdef DECODE_AVX2
  if (hd % 8 == 0) {
    __m128 sc = _mm_set1_ps(scale);
    int64_t j = 0;
    for (; j + 8 <= nk; j += 8)
      for (int64_t p = 0; p < P; p++) dot8_avx2(score + p * ATTN_KEY_BLOCK + j, q[p], kh + j * hd, hd, sc);
    if (j < nk)
      for (int64_t p = 0; p < P; p++) block_scores(score + p * ATTN_KEY_BLOCK + j, q[p], kh + j * hd, nk - j, hd, scale);
    return;
  }
#endif
  for (int64_t p = 0; p < P; p++) block_scores(score + p * ATTN_KEY_BLOCK, q[p], kh, nk, hd, scale);
}

#ifdef DECODE_AVX512
/* group_mix's AVX-512 path: each value row (fp32, or f16 bits when f16) read once for up to 4
 * weight rows; 0 when hd is not 64 or 128. */
static int group_mix_avx512(float *const *acc, const float *w, int64_t P, const void *vh, int f16, int64_t nk,
                            int64_t hd, int add) {
  if (hd != 64 && hd != 128) return 0;
  int hmax = hd == 64 ? 4 : 2;
  for (int64_t p0 = 0; p0 < P; p0 += hmax) {
    float *const *o = acc + p0;
    const float *wp = w + p0 * ATTN_KEY_BLOCK;
    int H = P - p0 < hmax ? (int)(P - p0) : hmax;
#define MIXG(h, c) (f16 ? mixg_avx512(o, wp, vh, 1, nk, hd, h, c, add) : mixg_avx512(o, wp, vh, 0, nk, hd, h, c, add))
    if (hd == 64) /* constant counts: registers */
      switch (H) {
        case 4: MIXG(4, 4); break;
        case 3: MIXG(3, 4); break;
        case 2: MIXG(2, 4); break;
        default: MIXG(1, 4); break;
      }
    else if (H == 2) MIXG(2, 8);
    else MIXG(1, 8);
#undef MIXG
  }
  return 1;
}
#endif

/* acc[p][hd] = sum_t w_p[t] v_t for P weight rows w (ATTN_KEY_BLOCK apart) over the nk value rows
 * from vh: block_mix's numbers (add as there); with AVX-512 each value row is read once for up to
 * 4 of them. */
static void group_mix(float *const *acc, const float *w, int64_t P, const float *vh, int64_t nk, int64_t hd,
                      int add) {
#ifdef DECODE_AVX512
  if (group_mix_avx512(acc, w, P, vh, 0, nk, hd, add)) return;
#endif
  for (int64_t p = 0; p < P; p++) block_mix(acc[p], w + p * ATTN_KEY_BLOCK, vh, nk, hd, add);
}

/* p[nk] = exp(score - max) in place; returns the max, *sum the exps' sum: their maximum and sum
 * in lanes (a running maximum made every key wait for the previous one's dot product). */
static float softmax_parts(float *score, int64_t nk, float *sum_out) {
#if defined(DECODE_AVX512) && defined(DS_HAVE_FAST_EXP_AVX512)
  /* The same lanes in one AVX-512 register, the last keys under a mask (-inf for the max, left
   * out of the sums): the same numbers. GCC left the max's ternary scalar and the last keys'
   * exps too (a 128-key block's softmax took 97-123 ns, now 67-82, on AMD Zen 4). */
  _Static_assert(DS_LANES == 16, "one 16-lane register");
  float mxl[DS_LANES], suml[DS_LANES];
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  __m512 m = ninf;
  int64_t j = 0;
  for (; j + DS_LANES <= nk; j += DS_LANES) m = _mm512_max_ps(_mm512_loadu_ps(score + j), m); /* score > m ? score : m */
  __mmask16 tail = (__mmask16)((1u << (nk - j)) - 1);
  _mm512_storeu_ps(mxl, _mm512_max_ps(_mm512_mask_loadu_ps(ninf, tail, score + j), m));
  float mx = mxl[0];
  for (int l = 1; l < DS_LANES; l++) mx = mxl[l] > mx ? mxl[l] : mx;
  __m512 vmx = _mm512_set1_ps(mx), sum = _mm512_setzero_ps();
  for (j = 0; j + DS_LANES <= nk; j += DS_LANES) {
    __m512 e = ds_fast_exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(score + j), vmx));
    _mm512_storeu_ps(score + j, e);
    sum = _mm512_add_ps(sum, e);
  }
  __m512 e = ds_fast_exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, score + j), vmx));
  _mm512_mask_storeu_ps(score + j, tail, e);
  _mm512_storeu_ps(suml, _mm512_mask_add_ps(sum, tail, sum, e));
  *sum_out = lanes_sum(suml);
  return mx;
#else
  float mxl[DS_LANES];
  for (int l = 0; l < DS_LANES; l++) mxl[l] = -INFINITY;
  int64_t j = 0;
  for (; j + DS_LANES <= nk; j += DS_LANES)
    for (int l = 0; l < DS_LANES; l++) mxl[l] = score[j + l] > mxl[l] ? score[j + l] : mxl[l];
  for (int l = 0; j + l < nk; l++) mxl[l] = score[j + l] > mxl[l] ? score[j + l] : mxl[l];
  float mx = mxl[0];
  for (int l = 1; l < DS_LANES; l++) mx = mxl[l] > mx ? mxl[l] : mx;
  float sum[DS_LANES] = {0};
  j = 0;
  for (; j + DS_LANES <= nk; j += DS_LANES)
    for (int l = 0; l < DS_LANES; l++) sum[l] += score[j + l] = ds_fast_expf(score[j + l] - mx);
  for (int l = 0; j + l < nk; l++) sum[l] += score[j + l] = ds_fast_expf(score[j + l] - mx);
  *sum_out = lanes_sum(sum);
  return mx;
#endif
}

/* dst[0 .. n) = the f16 values src widened to fp32 (exact). */
static void widen_f16(float *dst, const uint16_t *src, int64_t n) {
  int64_t i = 0;
#ifdef __AVX512F__
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(src + i))));
#endif
#ifdef __F16C__
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
#endif
  for (; i < n; i++) dst[i] = ds_f16_to_f32(src[i]);
}

void ds_cpu_copy_rows_f16(uint16_t *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; r++) {
    uint16_t *d = dst + r * ld_dst;
    const float *x = src + r * ld_src;
    int64_t c = 0;
#ifdef __F16C__ /* the conversion instruction rounds to nearest even, as ds_f32_to_f16 does */
    for (; c + 8 <= cols; c += 8)
      _mm_storeu_si128((__m128i *)(d + c), _mm256_cvtps_ph(_mm256_loadu_ps(x + c), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; c < cols; c++) d[c] = ds_f32_to_f16(x[c]);
  }
}

/* What attention_decode's tasks share. A task: one kv head's keys [j0, j0 + ATTN_KEY_BLOCK)
 * for every query row that sees them and every query head of the group: the rows of a
 * verification read the block once, where a task per row read it again from L2 for each row;
 * each (row, head) still gets the numbers it gets alone (its own visible keys, the same order of
 * operations), so verification and decoding agree bit for bit. */
typedef struct {
  float *part; /* [n, n_heads, nb_max, pstride] partial softmaxes */
  const float *q;
  int64_t q_stride;
  const void *k, *v;
  int f16;
  int64_t n, past, cap, n_heads, n_kv, hd, nb_max, pstride;
  float scale;
} decode_tasks;

/* a thread's scratch: scores [n * group, ATTN_KEY_BLOCK], f16 keys and values widened
 * [2, WIDEN_KEYS, hd], the (row, head) pairs' query and output pointers */
typedef struct {
  float *score, *kw, *vw;
  const float **qs;
  float **parts, **accs;
} decode_scratch;

/* one allocation a call and thread (30 a SmolLM2 token): the floats, then the 3 P pointers */
static int decode_scratch_new(const decode_tasks *a, decode_scratch *w) {
  int64_t P = a->n * (a->n_heads / a->n_kv), floats = ATTN_KEY_BLOCK * P + (a->f16 ? 2 * WIDEN_KEYS * a->hd : 0);
  w->score = malloc((size_t)floats * sizeof(float) + (size_t)(3 * P) * sizeof(float *));
  if (!w->score) return 0;
  w->kw = a->f16 ? w->score + P * ATTN_KEY_BLOCK : NULL;
  w->vw = w->kw ? w->kw + WIDEN_KEYS * a->hd : NULL;
  w->qs = (const float **)(void *)(w->score + floats); /* floats is a multiple of 16: aligned */
  w->parts = (float **)(void *)(w->qs + P);
  w->accs = w->parts + P;
  return 1;
}

static void decode_scratch_free(decode_scratch *w) { free(w->score); }

/* Task t's block: its first key and the end of the keys any row of the call sees in it. */
static void task_block(const decode_tasks *a, int64_t t, int64_t *g, int64_t *j0, int64_t *jmax) {
  *g = t % a->n_kv, *j0 = t / a->n_kv * ATTN_KEY_BLOCK;
  *jmax = *j0 + ATTN_KEY_BLOCK < a->past + a->n ? *j0 + ATTN_KEY_BLOCK : a->past + a->n;
}

/* task t = (key block b, kv head g), block-major: the short last blocks come last, so the
 * threads' dynamic schedule ends on small tasks (kv-head-major ended on whole blocks, one thread
 * idle for up to a block of the other's at every layer). ahead: the tasks between this one and
 * the one this thread likely takes next (the region's threads take them in turn), whose f16
 * block is asked for while this one is scored; 0 for none. */
static void decode_task(const decode_tasks *a, int64_t t, int64_t ahead, decode_scratch *w) {
  int64_t hd = a->hd, G = a->n_heads / a->n_kv, g, j0, jmax;
  task_block(a, t, &g, &j0, &jmax);
  int64_t i0 = j0 - a->past > 0 ? j0 - a->past : 0; /* the first row that sees key j0 */
  if (i0 >= a->n) return;
  size_t at = (size_t)((g * a->cap + j0) * hd); /* key j0's row */
#ifdef DECODE_F16_SCORES /* the kernel that asks for it */
  next_block nx = {NULL, NULL, 0};
  if (a->f16 && ahead > 0 && t + ahead < a->n_kv * a->nb_max) {
    int64_t gn, jn, jnmax;
    task_block(a, t + ahead, &gn, &jn, &jnmax);
    size_t atn = (size_t)((gn * a->cap + jn) * hd);
    nx = (next_block){(const char *)((const uint16_t *)a->k + atn), (const char *)((const uint16_t *)a->v + atn),
                      (jnmax - jn) * hd * (int64_t)sizeof(uint16_t)};
  }
#else
  (void)ahead;
#endif
  /* rows in runs that see the same keys of the block (every row that sees all of it, then each
   * of the others alone) */
  for (int64_t i = i0, i1; i < a->n; i = i1) {
    int64_t nk = (a->past + i + 1 < jmax ? a->past + i + 1 : jmax) - j0;
    for (i1 = i + 1; i1 < a->n && (a->past + i1 + 1 < jmax ? a->past + i1 + 1 : jmax) - j0 == nk; i1++) {
    }
    int64_t P = 0;
    for (int64_t r = i; r < i1; r++)
      for (int64_t h = g * G; h < (g + 1) * G; h++, P++) {
        w->qs[P] = a->q + r * a->q_stride + h * hd;
        w->parts[P] = a->part + ((r * a->n_heads + h) * a->nb_max + j0 / ATTN_KEY_BLOCK) * a->pstride;
        w->accs[P] = w->parts[P] + 2;
      }
    /* each pair's partial softmax: [0] max, [1] sum of exps, [2 ..] the exps' weighted values */
    if (!a->f16) {
      group_scores(w->score, w->qs, P, (const float *)a->k + at, nk, hd, a->scale);
      for (int64_t p = 0; p < P; p++) w->parts[p][0] = softmax_parts(w->score + p * ATTN_KEY_BLOCK, nk, &w->parts[p][1]);
      group_mix(w->accs, w->score, P, (const float *)a->v + at, nk, hd, 0);
      continue;
    }
    /* f16: keys widened in registers (group_scores_f16), values too with AVX-512 (the value mix
     * reads f16 rows); otherwise WIDEN_KEYS at a time into L1 and taken there. Either way the same
     * operations in the same order as on fp32 (the pieces are a multiple of 8 keys, the mix
     * continues its sums), so the numbers are the fp32 path's on the widened values. */
    const uint16_t *k16 = (const uint16_t *)a->k + at, *v16 = (const uint16_t *)a->v + at;
#ifdef DECODE_F16_SCORES
    if (hd % 8 == 0) { /* widened in registers: the same numbers */
      group_scores_f16(w->score, w->qs, P, k16, v16, nk, hd, a->scale, &nx);
      nx.bytes = 0; /* the next block asked for once, not again by the block's other runs of rows */
    } else
#endif
      for (int64_t c0 = 0; c0 < nk; c0 += WIDEN_KEYS) {
        int64_t cn = nk - c0 < WIDEN_KEYS ? nk - c0 : WIDEN_KEYS;
        widen_f16(w->kw, k16 + c0 * hd, cn * hd);
        group_scores(w->score + c0, w->qs, P, w->kw, cn, hd, a->scale);
      }
    for (int64_t p = 0; p < P; p++) w->parts[p][0] = softmax_parts(w->score + p * ATTN_KEY_BLOCK, nk, &w->parts[p][1]);
#ifdef DECODE_AVX512
    if (group_mix_avx512(w->accs, w->score, P, v16, 1, nk, hd, 0)) continue;
#endif
    for (int64_t c0 = 0; c0 < nk; c0 += WIDEN_KEYS) {
      int64_t cn = nk - c0 < WIDEN_KEYS ? nk - c0 : WIDEN_KEYS;
      widen_f16(w->vw, v16 + c0 * hd, cn * hd);
      group_mix(w->accs, w->score + c0, P, w->vw, cn, hd, c0 > 0);
    }
  }
}

/* One sequence of attention_decode_seqs: its rows' queries and outputs, its cache. */
typedef struct {
  float *out;
  const float *q;
  const void *k, *v;
  int64_t n, past, cap;
} decode_seq;

/* out for (query row, head) pair p = i * n_heads + h of a sequence: its blocks' partial softmaxes
 * merged in block order, out = sum_b e^(m_b - M) acc_b / sum_b e^(m_b - M) l_b */
static void decode_merge(const decode_seq *sq, const decode_tasks *a, int64_t p) {
  int64_t i = p / a->n_heads, h = p % a->n_heads, hd = a->hd, pstride = a->pstride;
  int64_t nb = (sq->past + i + 1 + ATTN_KEY_BLOCK - 1) / ATTN_KEY_BLOCK;
  const float *pb = a->part + p * a->nb_max * pstride;
  float M = -INFINITY, L = 0.0f, *o = sq->out + i * a->n_heads * hd + h * hd;
  for (int64_t b = 0; b < nb; b++) M = pb[b * pstride] > M ? pb[b * pstride] : M;
  for (int64_t e = 0; e < hd; e++) o[e] = 0.0f;
  for (int64_t b = 0; b < nb; b++) {
    float w = ds_fast_expf(pb[b * pstride] - M);
    L += w * pb[b * pstride + 1];
    for (int64_t e = 0; e < hd; e++) o[e] += w * pb[b * pstride + 2 + e];
  }
  float inv = 1.0f / L;
  for (int64_t e = 0; e < hd; e++) o[e] *= inv;
}

/* The sequences' tasks (a kv head and a key block of one sequence each) run in one parallel region:
 * the batched decoding of many requests, a call per request, was a region a layer and request,
 * each of a few tasks that two threads split unevenly. k, v: fp32, or f16 bits when f16. Each
 * sequence gets the numbers it gets alone (its tasks and merge are the same). */
static void attention_decode_seqs(const decode_seq *sq, int n_seqs, int64_t q_stride, int f16, int64_t n_heads,
                                  int64_t n_kv, int64_t hd, float scale) {
  int64_t pstride = hd + 2, tasks = 0, parts = 0, work = 0, n_max = 1;
  decode_tasks *a = malloc((size_t)n_seqs * sizeof *a);
  int64_t *first = malloc(2 * (size_t)(n_seqs + 1) * sizeof *first); /* each sequence's first task */
  DS_CHECK(a != NULL && first != NULL);
  int64_t *pairs = first + n_seqs + 1; /* each sequence's first (row, head) pair */
  pairs[0] = 0;
  for (int s = 0; s < n_seqs; s++) {
    int64_t nb_max = (sq[s].past + sq[s].n + ATTN_KEY_BLOCK - 1) / ATTN_KEY_BLOCK;
    a[s] = (decode_tasks){NULL, sq[s].q, q_stride, sq[s].k, sq[s].v, f16, sq[s].n, sq[s].past, sq[s].cap,
                          n_heads, n_kv, hd, nb_max, pstride, scale};
    first[s] = tasks, tasks += n_kv * nb_max, parts += sq[s].n * n_heads * nb_max * pstride;
    work += (sq[s].past + sq[s].n) * n_heads * hd;
    n_max = sq[s].n > n_max ? sq[s].n : n_max;
    pairs[s + 1] = pairs[s] + sq[s].n * n_heads;
  }
  first[n_seqs] = tasks;
  float *part = malloc((size_t)parts * sizeof(float));
  DS_CHECK(part != NULL);
  int64_t off = 0;
  for (int s = 0; s < n_seqs; off += sq[s].n * n_heads * a[s].nb_max * pstride, s++) a[s].part = part + off;
  /* the scratch for the most rows (decode_scratch_new reads the shapes) */
  decode_tasks most = {NULL, NULL, q_stride, NULL, NULL, f16, n_max, 0, 0, n_heads, n_kv, hd, 0, pstride, scale};
  if (tasks <= 1 || work <= 32768) { /* no region (cpu_kernels.h) */
    decode_scratch w;
    DS_CHECK(decode_scratch_new(&most, &w));
    for (int s = 0; s < n_seqs; s++)
      for (int64_t t = 0; t < first[s + 1] - first[s]; t++) decode_task(&a[s], t, 1, &w);
    decode_scratch_free(&w);
    for (int s = 0; s < n_seqs; s++)
      for (int64_t p = 0; p < sq[s].n * n_heads; p++) decode_merge(&sq[s], &a[s], p);
  } else {
    int64_t ahead = ds_get_num_threads(); /* the threads take the tasks in turn */
    DS_OMP(parallel)
    {
      decode_scratch w;
      DS_CHECK(decode_scratch_new(&most, &w));
      DS_OMP(for schedule(dynamic))
      for (int64_t t = 0; t < tasks; t++) {
        int s = 0;
        while (first[s + 1] <= t) s++;
        decode_task(&a[s], t - first[s], ahead, &w);
      }
      decode_scratch_free(&w);
      /* the merges split over the threads too (one thread merging them all left the other
       * waiting at every layer) */
      DS_OMP(for schedule(static))
      for (int64_t p = 0; p < pairs[n_seqs]; p++) {
        int s = 0;
        while (pairs[s + 1] <= p) s++;
        decode_merge(&sq[s], &a[s], p - pairs[s]);
      }
    }
  }
  free(part), free(a), free(first);
}

static void attention_decode(float *out, const float *q, int64_t q_stride, const void *k, const void *v, int f16,
                             int64_t n, int64_t past, int64_t cap, int64_t n_heads, int64_t n_kv, int64_t hd,
                             float scale) {
  decode_seq one = {out, q, k, v, n, past, cap};
  attention_decode_seqs(&one, 1, q_stride, f16, n_heads, n_kv, hd, scale);
}

/* out[n, n_heads*hd] = softmax(q k^T * scale, causal) v; k, v: [n_kv_heads, cap, hd]. */
void ds_cpu_attention_causal(float *out, const float *q, int64_t q_stride, const float *k, const float *v, int64_t n,
                             int64_t past, int64_t cap, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                             float scale) {
  if (ds_matmul_compute() == DS_COMPUTE_BF16 && n >= DS_BF16_ATTN_MIN_ROWS &&
      ds_cpu_attention_causal_bf16(out, q, q_stride, k, v, n, past, cap, n_heads, n_kv_heads, head_dim, scale))
    return;
  if (n <= ATTN_ROWWISE_MAX) {
    attention_decode(out, q, q_stride, k, v, 0, n, past, cap, n_heads, n_kv_heads, head_dim, scale);
    return;
  }
  int64_t group = n_heads / n_kv_heads;
  int64_t qchunk = ATTN_QCHUNK;
  int64_t n_chunks = (n + qchunk - 1) / qchunk;
  int64_t out_stride = n_heads * head_dim;
  DS_OMP(parallel)
  {
    /* Scores for one (head, query chunk): [ATTN_QCHUNK, past + n]. */
    float *scores = malloc((size_t)ATTN_QCHUNK * (size_t)(past + n) * sizeof(float));
    DS_CHECK(scores != NULL);
    DS_OMP(for collapse(2) schedule(dynamic))
    for (int64_t h = 0; h < n_heads; h++)
      for (int64_t c = 0; c < n_chunks; c++) {
        int64_t q0 = c * qchunk, qn = n - q0 < qchunk ? n - q0 : qchunk;
        int64_t kend = past + q0 + qn; /* keys visible to the last query of the chunk */
        const float *kh = k + (h / group) * cap * head_dim;
        const float *vh = v + (h / group) * cap * head_dim;
        ds_cpu_sgemm(0, 1, qn, kend, head_dim, q + q0 * q_stride + h * head_dim, q_stride, kh, head_dim, 0.0f,
                     scores, kend);
        for (int64_t i = 0; i < qn; i++) {
          float *s = scores + i * kend;
          int64_t visible = past + q0 + i + 1;
          for (int64_t j = 0; j < visible; j++) s[j] *= scale;
          /* the maximum and the sum in lanes, the engine's exp (libm's expf and a running maximum
           * were 9% of a SmolLM2 prefill's samples on 2 threads) */
          float sum;
          (void)softmax_parts(s, visible, &sum);
          float inv = 1.0f / sum;
          for (int64_t j = 0; j < visible; j++) s[j] *= inv;
          for (int64_t j = visible; j < kend; j++) s[j] = 0.0f;
        }
        ds_cpu_sgemm(0, 0, qn, head_dim, kend, scores, kend, vh, head_dim, 0.0f, out + q0 * out_stride + h * head_dim,
                     out_stride);
      }
    free(scores);
  }
}

void ds_cpu_attention_causal_f16(float *out, const float *q, int64_t q_stride, const uint16_t *k, const uint16_t *v,
                                 int64_t n, int64_t past, int64_t cap, int64_t n_heads, int64_t n_kv_heads,
                                 int64_t head_dim, float scale) {
  if (n <= ATTN_ROWWISE_MAX) {
    attention_decode(out, q, q_stride, k, v, 1, n, past, cap, n_heads, n_kv_heads, head_dim, scale);
    return;
  }
  /* a prefill's many rows: the visible keys and values widened once, then the fp32 kernel */
  int64_t len = past + n;
  size_t cells = (size_t)(n_kv_heads * len * head_dim);
  float *kf = malloc(2 * cells * sizeof(float)), *vf = kf ? kf + cells : NULL;
  DS_CHECK(kf != NULL);
  DS_OMP(parallel for schedule(static) if (cells > 65536))
  for (int64_t g = 0; g < n_kv_heads; g++) {
    widen_f16(kf + g * len * head_dim, k + g * cap * head_dim, len * head_dim);
    widen_f16(vf + g * len * head_dim, v + g * cap * head_dim, len * head_dim);
  }
  ds_cpu_attention_causal(out, q, q_stride, kf, vf, n, past, len, n_heads, n_kv_heads, head_dim, scale);
  free(kf);
}

void ds_cpu_attention_causal_seqs(float *out, const float *q, int64_t q_stride, const void *const *k,
                                  const void *const *v, int f16, const int64_t *n, const int64_t *past,
                                  const int64_t *cap, int n_seqs, int64_t n_heads, int64_t n_kv_heads,
                                  int64_t head_dim, float scale) {
  int rowwise = n_seqs > 0;
  for (int s = 0; s < n_seqs; s++) rowwise &= n[s] <= ATTN_ROWWISE_MAX;
  if (!rowwise) { /* a prefill among them: a call each */
    int64_t row = 0;
    for (int s = 0; s < n_seqs; row += n[s++])
      if (f16)
        ds_cpu_attention_causal_f16(out + row * n_heads * head_dim, q + row * q_stride, q_stride, k[s], v[s], n[s],
                                    past[s], cap[s], n_heads, n_kv_heads, head_dim, scale);
      else
        ds_cpu_attention_causal(out + row * n_heads * head_dim, q + row * q_stride, q_stride, k[s], v[s], n[s],
                                past[s], cap[s], n_heads, n_kv_heads, head_dim, scale);
    return;
  }
  decode_seq *sq = malloc((size_t)n_seqs * sizeof *sq);
  DS_CHECK(sq != NULL);
  int64_t row = 0;
  for (int s = 0; s < n_seqs; row += n[s++])
    sq[s] = (decode_seq){out + row * n_heads * head_dim, q + row * q_stride, k[s], v[s], n[s], past[s], cap[s]};
  attention_decode_seqs(sq, n_seqs, q_stride, f16, n_heads, n_kv_heads, head_dim, scale);
  free(sq);
}
