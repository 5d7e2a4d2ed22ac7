/* Causal attention over a KV cache with bf16 products (DS_COMPUTE_BF16 on a prompt: the
 * prefill), the variant of ds_cpu_attention_causal (cpu_attention.c) that
 * ds_cpu_attention_causal runs under bf16 compute when oneDNN's native bf16 kernels are there.
 *
 * QK^T and PV are oneDNN bf16 products (operands rounded to bf16 nearest even, fp32
 * accumulation); the scores, the softmax's max and sum and the output stay fp32. As in
 * PyTorch's CPU flash attention, the unnormalized exp(s - max) is rounded to bf16 as PV's
 * operand and the output row is divided by the fp32 sum after PV: one pass over a score row
 * (max, then exp + sum + rounding in one sweep) instead of three. Work is split into
 * (kv head, query chunk) tiles with the GQA group's query heads stacked ([group * CHUNK, hd],
 * row r = query i * group + head j), so each product has group * CHUNK rows and reads the
 * shared keys once. Every shape is padded to a multiple of CHUNK (query rows and keys; the
 * padding is zeros and the padded keys get probability 0), so a prompt of any length uses at
 * most (past + n) / CHUNK product shapes, whose primitives are made once per process. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/backend.h"
#include "nn/cpu_gemm_bf16.h"
#include "nn/cpu_kernels.h"
#include "nn/cpu_linear16.h"
#include "nn/fast_exp.h"

enum { CHUNK = 64 }; /* query positions per tile, and the key padding */

static int64_t pad_up(int64_t x) { return (x + CHUNK - 1) / CHUNK * CHUNK; }

/* dst[rows_pad, hd] (bf16) <- src rows 0 .. rows-1 (row stride hd), zeros after. */
static void keys_to_bf16(uint16_t *dst, const float *src, int64_t rows, int64_t rows_pad, int64_t hd) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < hd; j++) dst[r * hd + j] = ds_round_bf16(src[r * hd + j]);
  memset(dst + rows * hd, 0, (size_t)((rows_pad - rows) * hd) * sizeof(uint16_t));
}

/* The 16 partial sums of the exp row summed in lane order: both forms below end this way, so
 * they give the same bits. */
static float lanes_sum(const float part[16]) {
  float sum = 0.0f;
  for (int l = 0; l < 16; l++) sum += part[l];
  return sum;
}

static float exp_row_bf16_portable(uint16_t *prow, const float *row, int64_t vis, int64_t kp, float scale) {
  float m = -INFINITY, part[16] = {0};
  for (int64_t j = 0; j < vis; j++) m = row[j] * scale > m ? row[j] * scale : m;
  for (int64_t j = 0; j < vis; j++) {
    float e = ds_fast_expf(row[j] * scale - m);
    part[j % 16] += e;
    prow[j] = ds_round_bf16(e);
  }
  memset(prow + vis, 0, (size_t)(kp - vis) * sizeof(uint16_t));
  return lanes_sum(part);
}

#ifdef DS_HAVE_FAST_EXP_AVX512
/* The same in 16-lane blocks, masked at the row's end: twice as fast as the compiler's
 * vectorization of the portable loop, which reloads 256-bit halves through memory. */
__attribute__((target("avx512f"))) static float exp_row_bf16_avx512(uint16_t *prow, const float *row, int64_t vis,
                                                                   int64_t kp, float scale) {
  const __m512 vs = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-INFINITY);
  __m512 mv = ninf, sv = _mm512_setzero_ps();
  int64_t b;
  for (b = 0; b < vis; b += 16) {
    __mmask16 k = vis - b >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (vis - b)) - 1);
    mv = _mm512_max_ps(_mm512_mul_ps(_mm512_mask_loadu_ps(ninf, k, row + b), vs), mv); /* x > m ? x : m */
  }
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
  const __m512i half = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1), quiet = _mm512_set1_epi32(0x40);
  for (b = 0; b < vis; b += 16) {
    __mmask16 k = vis - b >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (vis - b)) - 1);
    __m512 x = _mm512_fmsub_ps(_mm512_maskz_loadu_ps(k, row + b), vs, m); /* as GCC fuses the portable loop's */
    __m512 e = _mm512_maskz_mov_ps(k, ds_fast_exp_avx512(x));
    sv = _mm512_add_ps(sv, e);
    /* ds_round_bf16 lane-wise: nearest even, a NaN quieted */
    __m512i u = _mm512_castps_si512(e), top = _mm512_srli_epi32(u, 16);
    __m512i h = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(half, _mm512_and_si512(top, one))), 16);
    h = _mm512_mask_or_epi32(h, _mm512_cmp_ps_mask(e, e, _CMP_UNORD_Q), top, quiet);
    _mm256_storeu_si256((__m256i *)(prow + b), _mm512_cvtepi32_epi16(h)); /* b + 16 <= kp */
  }
  memset(prow + b, 0, (size_t)(kp - b) * sizeof(uint16_t));
  float part[16];
  _mm512_storeu_ps(part, sv);
  return lanes_sum(part);
}
#endif

float ds_exp_row_bf16(ds_isa isa, uint16_t *prow, const float *row, int64_t vis, int64_t kp, float scale) {
#ifdef DS_HAVE_FAST_EXP_AVX512
  if (isa == DS_ISA_AVX512 && ds_isa_best() == DS_ISA_AVX512) return exp_row_bf16_avx512(prow, row, vis, kp, scale);
#endif
  (void)isa;
  return exp_row_bf16_portable(prow, row, vis, kp, scale);
}

int ds_cpu_attention_causal_bf16(float *out, const float *q, int64_t q_stride, const float *k, const float *v,
                                 int64_t n, int64_t past, int64_t cap, int64_t n_heads, int64_t n_kv_heads,
                                 int64_t head_dim, float scale) {
  int64_t group = n_heads / n_kv_heads, hd = head_dim, m = group * CHUNK;
  int64_t total = past + n, tp = pad_up(total), n_chunks = (n + CHUNK - 1) / CHUNK;
  /* Every primitive first (from this thread): a NULL leaves the whole call to the fp32 path. */
  int64_t kp_min = pad_up(past + 1);
  int64_t n_kp = (tp - kp_min) / CHUNK + 1;
  const ds_bf16_tile_gemm **qk = malloc((size_t)n_kp * sizeof *qk), **pv = malloc((size_t)n_kp * sizeof *pv);
  int ok = qk && pv;
  for (int64_t i = 0; ok && i < n_kp; i++) {
    int64_t kp = kp_min + i * CHUNK;
    qk[i] = ds_bf16_tile_gemm_get(1, m, kp, hd, hd, hd, kp); /* S = Q K^T: K stored [kp, hd] */
    pv[i] = ds_bf16_tile_gemm_get(0, m, hd, kp, kp, hd, hd); /* O = P V:   V stored [kp, hd] */
    ok = qk[i] && pv[i];
  }
  uint16_t *kb = ok ? malloc((size_t)(2 * n_kv_heads * tp * hd) * sizeof(uint16_t)) : NULL;
  if (!kb) {
    free(qk);
    free(pv);
    return 0;
  }
  uint16_t *vb = kb + n_kv_heads * tp * hd;
  DS_OMP(parallel for schedule(static) if (n_kv_heads * total * hd > 65536))
  for (int64_t h = 0; h < 2 * n_kv_heads; h++) {
    int64_t kvh = h % n_kv_heads;
    const float *src = (h < n_kv_heads ? k : v) + kvh * cap * hd;
    keys_to_bf16((h < n_kv_heads ? kb : vb) + kvh * tp * hd, src, total, tp, hd);
  }
  int64_t out_stride = n_heads * hd, items = n_kv_heads * n_chunks;
  ds_isa isa = ds_isa_best();
  DS_OMP(parallel if (items > 1))
  {
    uint16_t *qt = malloc((size_t)(m * hd + m * tp) * sizeof(uint16_t));
    float *s = malloc((size_t)(m * tp + m * hd + m) * sizeof(float));
    DS_CHECK(qt != NULL && s != NULL);
    uint16_t *pb = qt + m * hd;
    float *ot = s + m * tp, *inv = ot + m * hd; /* inv[r]: 1 / row r's sum */
    DS_OMP(for schedule(dynamic))
    for (int64_t it = 0; it < items; it++) {
      /* the longest chunks (the last queries) first: dynamic scheduling then ends on short ones */
      int64_t kvh = it % n_kv_heads, c = n_chunks - 1 - it / n_kv_heads;
      int64_t q0 = c * CHUNK, qn = n - q0 < CHUNK ? n - q0 : CHUNK, rows = qn * group;
      int64_t kp = pad_up(past + q0 + qn), ki = (kp - kp_min) / CHUNK;
      for (int64_t i = 0; i < qn; i++) {
        const float *src = q + (q0 + i) * q_stride + kvh * group * hd;
        for (int64_t j = 0; j < group * hd; j++) qt[i * group * hd + j] = ds_round_bf16(src[j]);
      }
      memset(qt + rows * hd, 0, (size_t)((m - rows) * hd) * sizeof(uint16_t));
      ds_bf16_tile_gemm_run(qk[ki], qt, kb + kvh * tp * hd, s);
      for (int64_t r = 0; r < rows; r++) /* query i = r / group sees keys 0 .. past + q0 + i */
        inv[r] = 1.0f / ds_exp_row_bf16(isa, pb + r * kp, s + r * kp, past + q0 + r / group + 1, kp, scale);
      memset(pb + rows * kp, 0, (size_t)((m - rows) * kp) * sizeof(uint16_t));
      ds_bf16_tile_gemm_run(pv[ki], pb, vb + kvh * tp * hd, ot);
      for (int64_t r = 0; r < rows; r++) { /* row r of the tile is query r / group, head r % group */
        float *dst = out + (q0 + r / group) * out_stride + (kvh * group + r % group) * hd;
        const float *src = ot + r * hd;
        for (int64_t j = 0; j < hd; j++) dst[j] = src[j] * inv[r];
      }
    }
    free(qt);
    free(s);
  }
  free(kb);
  free(qk);
  free(pv);
  return 1;
}
