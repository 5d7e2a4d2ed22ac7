/* Causal attention over a KV cache with bf16 products (DS_COMPUTE_BF16 on a prompt: the
 * prefill), the variant of ds_cpu_attention_causal (cpu_attention.c) that
 * ds_cpu_attention_causal runs under bf16 compute when oneDNN's native bf16 kernels are there.
 *
 * QK^T and PV are oneDNN bf16 products (operands rounded to bf16 nearest even, fp32
 * accumulation); the scores, the softmax and the output stay fp32, and the probabilities are
 * rounded to bf16 only as PV's operand (as PyTorch's bf16 attention does). Work is split into
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
#include "nn/fast_exp.h"

enum { CHUNK = 64 }; /* query positions per tile, and the key padding */

static int64_t pad_up(int64_t x) { return (x + CHUNK - 1) / CHUNK * CHUNK; }

/* dst[rows_pad, hd] (bf16) <- src rows 0 .. rows-1 (row stride hd), zeros after. */
static void keys_to_bf16(uint16_t *dst, const float *src, int64_t rows, int64_t rows_pad, int64_t hd) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < hd; j++) dst[r * hd + j] = ds_round_bf16(src[r * hd + j]);
  memset(dst + rows * hd, 0, (size_t)((rows_pad - rows) * hd) * sizeof(uint16_t));
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
  DS_OMP(parallel if (items > 1))
  {
    uint16_t *qt = malloc((size_t)(m * hd + m * tp) * sizeof(uint16_t));
    float *s = malloc((size_t)(m * tp + m * hd) * sizeof(float));
    DS_CHECK(qt != NULL && s != NULL);
    uint16_t *pb = qt + m * hd;
    float *ot = s + m * tp;
    DS_OMP(for schedule(dynamic))
    for (int64_t it = 0; it < items; it++) {
      int64_t kvh = it % n_kv_heads, c = it / n_kv_heads;
      int64_t q0 = c * CHUNK, qn = n - q0 < CHUNK ? n - q0 : CHUNK, rows = qn * group;
      int64_t kp = pad_up(past + q0 + qn), ki = (kp - kp_min) / CHUNK;
      for (int64_t i = 0; i < qn; i++) {
        const float *src = q + (q0 + i) * q_stride + kvh * group * hd;
        for (int64_t j = 0; j < group * hd; j++) qt[i * group * hd + j] = ds_round_bf16(src[j]);
      }
      memset(qt + rows * hd, 0, (size_t)((m - rows) * hd) * sizeof(uint16_t));
      ds_bf16_tile_gemm_run(qk[ki], qt, kb + kvh * tp * hd, s);
      for (int64_t r = 0; r < rows; r++) {
        int64_t vis = past + q0 + r / group + 1; /* keys 0 .. position */
        float *row = s + r * kp, mx;
        uint16_t *prow = pb + r * kp;
        float inv = 1.0f / ds_softmax_row_exp(row, vis, scale, &mx);
        for (int64_t j = 0; j < vis; j++) prow[j] = ds_round_bf16(row[j] * inv);
        memset(prow + vis, 0, (size_t)(kp - vis) * sizeof(uint16_t));
      }
      memset(pb + rows * kp, 0, (size_t)((m - rows) * kp) * sizeof(uint16_t));
      ds_bf16_tile_gemm_run(pv[ki], pb, vb + kvh * tp * hd, ot);
      for (int64_t i = 0; i < qn; i++)
        memcpy(out + (q0 + i) * out_stride + kvh * group * hd, ot + i * group * hd,
               (size_t)(group * hd) * sizeof(float));
    }
    free(qt);
    free(s);
  }
  free(kb);
  free(qk);
  free(pv);
  return 1;
}
