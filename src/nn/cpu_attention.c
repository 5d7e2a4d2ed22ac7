/* CPU attention kernels: causal attention over a KV cache (inference) and the draft's block
 * attention with its backward (training).
 *
 * Block attention works on one (block, kv head) tile at a time: the query heads of the GQA
 * group are stacked into one [group * g, head_dim] tile (row r = slot i * group + head j), so
 * every sgemm has group * g rows and streams the shared context keys once per tile. Scores
 * for a tile are [group * g, ctx_len + g]: the O(g * (n_ctx + g)) scratch per thread. The
 * backward recomputes the probabilities from the saved log-sum-exp (no stored probability
 * tensor) and accumulates dk_ctx / dv_ctx, which all blocks share, into per-part buffers
 * reduced in a fixed order at the end: results are bitwise reproducible for a given number
 * of threads (no atomics, no order that depends on scheduling). */
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
/* f16 keys (values) widened to fp32 at a time, a multiple of 8 (group_scores' step): 4 KiB at
 * hd 64, taken from L1; a block's 32 KiB of keys and 32 KiB of values widened whole went to L2
 * before they were read (SmolLM2 Q4_1 after a 1024-token prompt with an f16 cache decodes 1.25x
 * faster on 1 thread of an AMD EPYC Zen 4 this way) */
enum { WIDEN_KEYS = 16 };

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
 * heads at once, each value row (16C values: whole rows, read in order) loaded once
 * for the H heads; every column sums over t in order, as mix_avx2 does, so the numbers are its. */
static inline __attribute__((always_inline)) void mixg_avx512(float *const *out, const float *p, const float *v,
                                                              int64_t nk, int64_t hd, int H, int C, int add) {
  __m512 a[4][8];
  for (int h = 0; h < H; h++)
    for (int c = 0; c < C; c++) a[h][c] = add ? _mm512_loadu_ps(out[h] + 16 * c) : _mm512_setzero_ps();
  for (int64_t t = 0; t < nk; t++) {
    __m512 vv[8];
    for (int c = 0; c < C; c++) vv[c] = _mm512_loadu_ps(v + t * hd + 16 * c);
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

/* acc[p][hd] = sum_t w_p[t] v_t for P weight rows w (ATTN_KEY_BLOCK apart) over the nk value rows
 * from vh: block_mix's numbers (add as there); with AVX-512 each value row is read once for up to
 * 4 of them. */
static void group_mix(float *const *acc, const float *w, int64_t P, const float *vh, int64_t nk, int64_t hd,
                      int add) {
#ifdef DECODE_AVX512
  if (hd == 64 || hd == 128) {
    int hmax = hd == 64 ? 4 : 2;
    for (int64_t p0 = 0; p0 < P; p0 += hmax) {
      float *const *o = acc + p0;
      const float *wp = w + p0 * ATTN_KEY_BLOCK;
      int H = P - p0 < hmax ? (int)(P - p0) : hmax;
      if (hd == 64) /* constant counts: registers */
        switch (H) {
          case 4: mixg_avx512(o, wp, vh, nk, hd, 4, 4, add); break;
          case 3: mixg_avx512(o, wp, vh, nk, hd, 3, 4, add); break;
          case 2: mixg_avx512(o, wp, vh, nk, hd, 2, 4, add); break;
          default: mixg_avx512(o, wp, vh, nk, hd, 1, 4, add); break;
        }
      else if (H == 2) mixg_avx512(o, wp, vh, nk, hd, 2, 8, add);
      else mixg_avx512(o, wp, vh, nk, hd, 1, 8, add);
    }
    return;
  }
#endif
  for (int64_t p = 0; p < P; p++) block_mix(acc[p], w + p * ATTN_KEY_BLOCK, vh, nk, hd, add);
}

/* p[nk] = exp(score - max) in place; returns the max, *sum the exps' sum: their maximum and sum
 * in lanes (a running maximum made every key wait for the previous one's dot product). */
static float softmax_parts(float *score, int64_t nk, float *sum_out) {
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

/* task t = (kv head g, key block b) */
static void decode_task(const decode_tasks *a, int64_t t, decode_scratch *w) {
  int64_t hd = a->hd, G = a->n_heads / a->n_kv, g = t / a->nb_max, b = t % a->nb_max, j0 = b * ATTN_KEY_BLOCK;
  int64_t i0 = j0 - a->past > 0 ? j0 - a->past : 0; /* the first row that sees key j0 */
  if (i0 >= a->n) return;
  int64_t jmax = j0 + ATTN_KEY_BLOCK < a->past + a->n ? j0 + ATTN_KEY_BLOCK : a->past + a->n;
  size_t at = (size_t)((g * a->cap + j0) * hd); /* key j0's row */
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
        w->parts[P] = a->part + ((r * a->n_heads + h) * a->nb_max + b) * a->pstride;
        w->accs[P] = w->parts[P] + 2;
      }
    /* each pair's partial softmax: [0] max, [1] sum of exps, [2 ..] the exps' weighted values */
    if (!a->f16) {
      group_scores(w->score, w->qs, P, (const float *)a->k + at, nk, hd, a->scale);
      for (int64_t p = 0; p < P; p++) w->parts[p][0] = softmax_parts(w->score + p * ATTN_KEY_BLOCK, nk, &w->parts[p][1]);
      group_mix(w->accs, w->score, P, (const float *)a->v + at, nk, hd, 0);
      continue;
    }
    /* f16: WIDEN_KEYS keys (then values) widened at a time into L1 and taken there; the same
     * operations in the same order as on fp32 (the pieces are a multiple of 8 keys, the mix
     * continues its sums), so the numbers are the fp32 path's on the widened values. */
    const uint16_t *k16 = (const uint16_t *)a->k + at, *v16 = (const uint16_t *)a->v + at;
    for (int64_t c0 = 0; c0 < nk; c0 += WIDEN_KEYS) {
      int64_t cn = nk - c0 < WIDEN_KEYS ? nk - c0 : WIDEN_KEYS;
      widen_f16(w->kw, k16 + c0 * hd, cn * hd);
      group_scores(w->score + c0, w->qs, P, w->kw, cn, hd, a->scale);
    }
    for (int64_t p = 0; p < P; p++) w->parts[p][0] = softmax_parts(w->score + p * ATTN_KEY_BLOCK, nk, &w->parts[p][1]);
    for (int64_t c0 = 0; c0 < nk; c0 += WIDEN_KEYS) {
      int64_t cn = nk - c0 < WIDEN_KEYS ? nk - c0 : WIDEN_KEYS;
      widen_f16(w->vw, v16 + c0 * hd, cn * hd);
      group_mix(w->accs, w->score + c0, P, w->vw, cn, hd, c0 > 0);
    }
  }
}

/* k, v: fp32, or f16 bits when f16 (each task widens its keys and values WIDEN_KEYS at a time into
 * its thread's scratch: a long context's cache is read at half the bytes). */
static void attention_decode(float *out, const float *q, int64_t q_stride, const void *k, const void *v, int f16,
                             int64_t n, int64_t past, int64_t cap, int64_t n_heads, int64_t n_kv, int64_t hd,
                             float scale) {
  int64_t nb_max = (past + n + ATTN_KEY_BLOCK - 1) / ATTN_KEY_BLOCK, pstride = hd + 2, tasks = n_kv * nb_max;
  float *part = malloc((size_t)(n * n_heads * nb_max * pstride) * sizeof(float));
  DS_CHECK(part != NULL);
  decode_tasks a = {part, q, q_stride, k, v, f16, n, past, cap, n_heads, n_kv, hd, nb_max, pstride, scale};
  if (tasks <= 1 || (past + n) * n_heads * hd <= 32768) { /* no region (cpu_kernels.h) */
    decode_scratch w;
    DS_CHECK(decode_scratch_new(&a, &w));
    for (int64_t t = 0; t < tasks; t++) decode_task(&a, t, &w);
    decode_scratch_free(&w);
  } else {
    DS_OMP(parallel)
    {
      decode_scratch w;
      DS_CHECK(decode_scratch_new(&a, &w));
      DS_OMP(for schedule(dynamic))
      for (int64_t t = 0; t < tasks; t++) decode_task(&a, t, &w);
      decode_scratch_free(&w);
    }
  }
  /* merge each (query, head)'s blocks in order: out = sum_b e^(m_b - M) acc_b / sum_b e^(m_b - M) l_b */
  for (int64_t i = 0; i < n; i++)
    for (int64_t h = 0; h < n_heads; h++) {
      int64_t nb = (past + i + 1 + ATTN_KEY_BLOCK - 1) / ATTN_KEY_BLOCK;
      const float *pb = part + (i * n_heads + h) * nb_max * pstride;
      float M = -INFINITY, L = 0.0f, *o = out + i * n_heads * hd + h * hd;
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
  free(part);
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

/* ---------------------------------------------------------------- block attention */

/* The problem, as the backend.h entry describes it. */
typedef struct {
  int64_t n_ctx, n_blocks, g, n_heads, n_kv, hd;
  int64_t group; /* query heads per kv head */
  int64_t qs;    /* row stride of q, out, dq: n_heads * hd */
  int64_t kvs;   /* row stride of the k / v buffers: n_kv * hd */
  int64_t m;     /* rows of a tile: group * g */
  float scale;
} battn;

static battn battn_make(int64_t n_ctx, int64_t n_blocks, int64_t g, int64_t n_heads, int64_t n_kv, int64_t hd,
                        float scale) {
  DS_CHECK(n_kv > 0 && n_heads % n_kv == 0 && g > 0 && hd > 0 && n_ctx >= 0 && n_blocks >= 0);
  battn a = {n_ctx, n_blocks, g, n_heads, n_kv, hd, n_heads / n_kv, n_heads * hd, n_kv * hd, 0, scale};
  a.m = a.group * g;
  return a;
}

/* Tile rows of block b, kv head kvh: row r = i * group + j is (slot i, query head kvh*group + j)
 * of x[n_blocks * g, n_heads * hd]; for a fixed slot the group's heads are contiguous. */
static void tile_gather(float *tile, const float *x, const battn *a, int64_t b, int64_t kvh) {
  for (int64_t i = 0; i < a->g; i++)
    memcpy(tile + i * a->group * a->hd, x + (b * a->g + i) * a->qs + kvh * a->group * a->hd,
           (size_t)(a->group * a->hd) * sizeof(float));
}

/* x[rows of the tile] (+)= tile * (row_scale[r] when given). */
static void tile_scatter(float *x, const float *tile, const float *row_scale, int accumulate, const battn *a,
                         int64_t b, int64_t kvh) {
  for (int64_t i = 0; i < a->g; i++)
    for (int64_t j = 0; j < a->group; j++) {
      int64_t r = i * a->group + j;
      const float *src = tile + r * a->hd;
      float *dst = x + (b * a->g + i) * a->qs + (kvh * a->group + j) * a->hd;
      float s = row_scale ? row_scale[r] : 1.0f;
      for (int64_t e = 0; e < a->hd; e++) dst[e] = (accumulate ? dst[e] : 0.0f) + s * src[e];
    }
}

/* Index into lse[n_blocks * g, n_heads] of tile row r. */
static int64_t lse_index(const battn *a, int64_t b, int64_t kvh, int64_t r) {
  return (b * a->g + r / a->group) * a->n_heads + kvh * a->group + r % a->group;
}

/* s[m, T] = tile[m, hd] @ [x_ctx[0:L] ; x_blk[block b]]^T for the kv head's columns. */
static void tile_scores(float *s, const float *tile, const float *x_ctx, const float *x_blk, const battn *a,
                        int64_t b, int64_t kvh, int64_t L) {
  int64_t T = L + a->g;
  ds_cpu_sgemm(0, 1, a->m, L, a->hd, tile, a->hd, x_ctx + kvh * a->hd, a->kvs, 0.0f, s, T);
  ds_cpu_sgemm(0, 1, a->m, a->g, a->hd, tile, a->hd, x_blk + b * a->g * a->kvs + kvh * a->hd, a->kvs, 0.0f, s + L, T);
}

/* o[m, hd] = s[m, T] @ [x_ctx[0:L] ; x_blk[block b]] for the kv head's columns. */
static void tile_mix(float *o, const float *s, const float *x_ctx, const float *x_blk, const battn *a, int64_t b,
                     int64_t kvh, int64_t L) {
  int64_t T = L + a->g;
  ds_cpu_sgemm(0, 0, a->m, a->hd, L, s, T, x_ctx + kvh * a->hd, a->kvs, 0.0f, o, a->hd);
  ds_cpu_sgemm(0, 0, a->m, a->hd, a->g, s + L, T, x_blk + b * a->g * a->kvs + kvh * a->hd, a->kvs, L > 0 ? 1.0f : 0.0f,
               o, a->hd);
}

/* One (block, kv head) tile of the forward. Scratch: s[m, n_ctx + g], qt and ot [m, hd], inv[m]. */
static void block_forward_tile(float *out, float *lse, const float *q, const float *k_ctx, const float *v_ctx,
                               const float *k_blk, const float *v_blk, const int64_t *ctx_len, const battn *a,
                               int64_t b, int64_t kvh, float *s, float *qt, float *ot, float *inv) {
  int64_t L = ctx_len[b];
  if (L < 0) { /* dropped block: no visible key, output 0 */
    memset(ot, 0, (size_t)(a->m * a->hd) * sizeof(float));
    tile_scatter(out, ot, NULL, 0, a, b, kvh);
    if (lse)
      for (int64_t r = 0; r < a->m; r++) lse[lse_index(a, b, kvh, r)] = -INFINITY;
    return;
  }
  DS_CHECK(L <= a->n_ctx);
  int64_t T = L + a->g;
  tile_gather(qt, q, a, b, kvh);
  tile_scores(s, qt, k_ctx, k_blk, a, b, kvh, L);
  for (int64_t r = 0; r < a->m; r++) {
    float *row = s + r * T, mx;
    float sum = ds_softmax_row_exp(row, T, a->scale, &mx);
    inv[r] = 1.0f / sum;
    if (lse) lse[lse_index(a, b, kvh, r)] = mx + logf(sum);
  }
  tile_mix(ot, s, v_ctx, v_blk, a, b, kvh, L); /* unnormalized; rows scaled on the way out */
  tile_scatter(out, ot, inv, 0, a, b, kvh);
}

/* out[nb*g, H*hd], lse[nb*g, H] <- q[nb*g, H*hd], k/v_ctx[n_ctx, KV*hd], k/v_blk[nb*g, KV*hd].
 * Work items are (block, kv head) tiles. */
void ds_cpu_block_attention(float *out, float *lse, const float *q, const float *k_ctx, const float *v_ctx,
                            const float *k_blk, const float *v_blk, const int64_t *ctx_len, int64_t n_ctx,
                            int64_t n_blocks, int64_t g, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                            float scale) {
  battn a = battn_make(n_ctx, n_blocks, g, n_heads, n_kv_heads, head_dim, scale);
  int64_t items = n_blocks * n_kv_heads;
  DS_OMP(parallel if (items > 1))
  {
    float *s = malloc((size_t)(a.m * (n_ctx + g)) * sizeof(float));
    float *qt = malloc((size_t)(2 * a.m * head_dim + a.m) * sizeof(float));
    DS_CHECK(s != NULL && qt != NULL);
    float *ot = qt + a.m * head_dim, *inv = ot + a.m * head_dim;
    DS_OMP(for schedule(dynamic))
    for (int64_t it = 0; it < items; it++)
      block_forward_tile(out, lse, q, k_ctx, v_ctx, k_blk, v_blk, ctx_len, &a, it / n_kv_heads, it % n_kv_heads, s,
                         qt, ot, inv);
    free(s);
    free(qt);
  }
}

/* Gradient destinations of one backward work item: the row stride of each context buffer
 * (dk_ctx / dv_ctx columns of the kv head, or a private [n_ctx, hd] part buffer). */
typedef struct {
  float *dq, *dk_ctx, *dv_ctx, *dk_blk, *dv_blk;
  int64_t ld_ctx;
} bgrads;

/* Scratch of one thread for the backward. */
typedef struct {
  float *p, *ds;       /* [m, n_ctx + g]: probabilities, then dP -> dS */
  float *qt, *dot, *t; /* [m, hd]: q tile, dout tile, dq tile */
  float *delta;        /* [m]: rowsum(dout * out) */
} bscratch;

/* One (block, kv head) tile of the backward: P = exp(S * scale - lse), dV += P^T dO,
 * dS = P * (dO V^T - rowsum(dO * O)) * scale, dQ += dS K, dK += dS^T Q. */
static void block_backward_tile(const bgrads *gr, const float *dout, const float *out, const float *lse,
                                const float *q, const float *k_ctx, const float *v_ctx, const float *k_blk,
                                const float *v_blk, const battn *a, int64_t b, int64_t kvh, int64_t L,
                                const bscratch *w) {
  int64_t T = L + a->g, hd = a->hd, m = a->m;
  float *dkb = gr->dk_blk ? gr->dk_blk + b * a->g * a->kvs + kvh * hd : NULL;
  float *dvb = gr->dv_blk ? gr->dv_blk + b * a->g * a->kvs + kvh * hd : NULL;
  tile_gather(w->qt, q, a, b, kvh);
  tile_gather(w->dot, dout, a, b, kvh);
  tile_scores(w->p, w->qt, k_ctx, k_blk, a, b, kvh, L);
  for (int64_t r = 0; r < m; r++) {
    float *row = w->p + r * T, l = lse[lse_index(a, b, kvh, r)], scale = a->scale;
    DS_OMP(simd)
    for (int64_t t = 0; t < T; t++) row[t] = ds_fast_expf(row[t] * scale - l);
  }
  /* dV: P^T @ dO, context rows then the block's own rows. */
  if (gr->dv_ctx) ds_cpu_sgemm(1, 0, L, hd, m, w->p, T, w->dot, hd, 1.0f, gr->dv_ctx, gr->ld_ctx);
  if (dvb) ds_cpu_sgemm(1, 0, a->g, hd, m, w->p + L, T, w->dot, hd, 1.0f, dvb, a->kvs);
  if (!gr->dq && !gr->dk_ctx && !dkb) return;

  for (int64_t r = 0; r < m; r++) { /* delta[r] = dO . O = sum_t P dP (softmax backward) */
    int64_t i = r / a->group, j = r % a->group;
    const float *o = out + (b * a->g + i) * a->qs + (kvh * a->group + j) * hd, *d = w->dot + r * hd;
    float acc = 0.0f;
    DS_OMP(simd reduction(+ : acc))
    for (int64_t e = 0; e < hd; e++) acc += d[e] * o[e];
    w->delta[r] = acc;
  }
  tile_scores(w->ds, w->dot, v_ctx, v_blk, a, b, kvh, L); /* dP = dO @ V^T */
  for (int64_t r = 0; r < m; r++) {
    float *dsr = w->ds + r * T, delta = w->delta[r], scale = a->scale;
    const float *pr = w->p + r * T;
    DS_OMP(simd)
    for (int64_t t = 0; t < T; t++) dsr[t] = pr[t] * (dsr[t] - delta) * scale;
  }
  if (gr->dq) {
    tile_mix(w->t, w->ds, k_ctx, k_blk, a, b, kvh, L);
    tile_scatter(gr->dq, w->t, NULL, 1, a, b, kvh);
  }
  if (gr->dk_ctx) ds_cpu_sgemm(1, 0, L, hd, m, w->ds, T, w->qt, hd, 1.0f, gr->dk_ctx, gr->ld_ctx);
  if (dkb) ds_cpu_sgemm(1, 0, a->g, hd, m, w->ds + L, T, w->qt, hd, 1.0f, dkb, a->kvs);
}

/* Splits blocks into n_parts contiguous ranges of about equal work (visible keys per block):
 * bounds[p] .. bounds[p+1]-1 is part p. Depends only on ctx_len and n_parts. */
static void split_blocks(int64_t *bounds, int64_t n_parts, const int64_t *ctx_len, int64_t n_blocks, int64_t g) {
  int64_t total = 0, acc = 0, p = 1;
  for (int64_t b = 0; b < n_blocks; b++) total += ctx_len[b] >= 0 ? ctx_len[b] + g : 1;
  bounds[0] = 0;
  for (int64_t b = 0; b < n_blocks && p < n_parts; b++) {
    acc += ctx_len[b] >= 0 ? ctx_len[b] + g : 1;
    while (p < n_parts && acc * n_parts >= total * p) bounds[p++] = b + 1;
  }
  while (p <= n_parts) bounds[p++] = n_blocks;
}

/* dq[nb*g, H*hd], dk/dv_ctx[n_ctx, KV*hd], dk/dv_blk[nb*g, KV*hd] += ... <- dout, out[nb*g, H*hd],
 * lse[nb*g, H] and the forward's inputs. Work items are (kv head, part of the blocks). When
 * several parts share a kv head, each accumulates its dk_ctx / dv_ctx into a private buffer,
 * and the buffers are added to the caller's in part order at the end. */
void ds_cpu_block_attention_backward(float *dq, float *dk_ctx, float *dv_ctx, float *dk_blk, float *dv_blk,
                                     const float *dout, const float *out, const float *lse, const float *q,
                                     const float *k_ctx, const float *v_ctx, const float *k_blk, const float *v_blk,
                                     const int64_t *ctx_len, int64_t n_ctx, int64_t n_blocks, int64_t g,
                                     int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale) {
  battn a = battn_make(n_ctx, n_blocks, g, n_heads, n_kv_heads, head_dim, scale);
  if (n_blocks == 0 || (!dq && !dk_ctx && !dv_ctx && !dk_blk && !dv_blk)) return;
  int64_t lmax = 0;
  for (int64_t b = 0; b < n_blocks; b++) {
    DS_CHECK(ctx_len[b] <= n_ctx);
    lmax = ctx_len[b] > lmax ? ctx_len[b] : lmax;
  }
  /* One part per kv head when the kv heads spread evenly over the threads; else about two
   * items per thread. The part count (and so the summation order) depends on the thread
   * count only. */
  int64_t nthr = ds_cpu_threads(), n_parts = 1;
  if (nthr > 1 && n_kv_heads % nthr != 0) n_parts = (2 * nthr + n_kv_heads - 1) / n_kv_heads;
  if (n_parts > n_blocks) n_parts = n_blocks;
  int partial = n_parts > 1 && (dk_ctx || dv_ctx);
  int64_t part_size = lmax * head_dim; /* floats of one private [lmax, hd] buffer */
  int64_t *bounds = malloc((size_t)(n_parts + 1) * sizeof(int64_t));
  float *pk = NULL, *pv = NULL;
  if (partial && dk_ctx) pk = calloc((size_t)(n_kv_heads * n_parts * part_size) + 1, sizeof(float));
  if (partial && dv_ctx) pv = calloc((size_t)(n_kv_heads * n_parts * part_size) + 1, sizeof(float));
  DS_CHECK(bounds != NULL && (!partial || !dk_ctx || pk) && (!partial || !dv_ctx || pv));
  split_blocks(bounds, n_parts, ctx_len, n_blocks, g);

  int64_t items = n_kv_heads * n_parts;
  DS_OMP(parallel if (items > 1))
  {
    size_t tile = (size_t)(a.m * (n_ctx + g)), small = (size_t)(a.m * head_dim);
    float *buf = malloc((2 * tile + 3 * small + (size_t)a.m) * sizeof(float));
    DS_CHECK(buf != NULL);
    bscratch w = {buf, buf + tile, buf + 2 * tile, buf + 2 * tile + small, buf + 2 * tile + 2 * small,
                  buf + 2 * tile + 3 * small};
    DS_OMP(for schedule(dynamic))
    for (int64_t it = 0; it < items; it++) {
      int64_t kvh = it % n_kv_heads, part = it / n_kv_heads;
      bgrads gr = {dq, dk_ctx ? dk_ctx + kvh * head_dim : NULL, dv_ctx ? dv_ctx + kvh * head_dim : NULL, dk_blk,
                   dv_blk, a.kvs};
      if (partial) {
        int64_t off = (kvh * n_parts + part) * part_size;
        gr.dk_ctx = pk ? pk + off : NULL;
        gr.dv_ctx = pv ? pv + off : NULL;
        gr.ld_ctx = head_dim;
      }
      for (int64_t b = bounds[part]; b < bounds[part + 1]; b++)
        if (ctx_len[b] >= 0) /* a dropped block saw nothing: no gradient */
          block_backward_tile(&gr, dout, out, lse, q, k_ctx, v_ctx, k_blk, v_blk, &a, b, kvh, ctx_len[b], &w);
    }
    free(buf);
  }

  if (partial) { /* dk_ctx[j, kvh] += sum over parts, in part order */
    DS_OMP(parallel for schedule(static) if (lmax * a.kvs * n_parts > 65536))
    for (int64_t j = 0; j < lmax; j++)
      for (int64_t kvh = 0; kvh < n_kv_heads; kvh++)
        for (int64_t part = 0; part < n_parts; part++) {
          int64_t off = (kvh * n_parts + part) * part_size + j * head_dim;
          float *dk = dk_ctx ? dk_ctx + j * a.kvs + kvh * head_dim : NULL;
          float *dv = dv_ctx ? dv_ctx + j * a.kvs + kvh * head_dim : NULL;
          for (int64_t e = 0; e < head_dim; e++) {
            if (dk) dk[e] += pk[off + e];
            if (dv) dv[e] += pv[off + e];
          }
        }
  }
  free(bounds);
  free(pk);
  free(pv);
}
