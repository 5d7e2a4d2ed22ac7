/* Causal attention entries of the CUDA backend: against a KV cache (decode, prefill) and over
 * packed sequences (training: forward with lse, backward). Each sequence is cut into chunks
 * of consecutive query rows that run through the GEMM path (cuda_attn_gemm.cu); a chunk's
 * keys are the sequence's 0 .. last row's position, its rows see causal prefixes of them. A
 * handful of decode queries over a short cache run the flash kernel (cuda_flash.cu) instead.
 * seq_off is host memory (include/dspark/backend.h), so the chunks are planned here on the
 * host. Contracts in include/dspark/backend.h. */
#include <stdlib.h>

#include "nn/cuda/cuda_attn_gemm.h"
#include "nn/cuda/cuda_flash.h"

namespace {

/* Query rows per chunk at most: the GEMMs compute the whole [rows, keys] rectangle, so the
 * masked upper triangle of a chunk's own rows is wasted work; at 256 rows a 2048-token
 * sequence wastes 1/8 of the products, and a GEMM of 256 * group rows still fills the GPU. */
constexpr int64_t kCausalRows = 256;
/* attention_causal takes the flash kernel up to this many queries over this many keys (past +
 * n): below it the GEMM path is mostly launch overhead. Estimated, not measured: the flash
 * kernel streams the keys through one warp per query row. */
constexpr int64_t kFlashMaxQueries = 16, kFlashMaxKeys = 512;

/* Rows of the chunk starting at a query that sees `first_keys` keys, with `left` rows left:
 * halved until the scores (elem_bytes each, keys up to its last row) fit the budget and its
 * [n_heads, rows, hd] buffers DS_ATTN_ROW_BYTES; one row at least. */
int64_t causal_chunk_rows(int64_t first_keys, int64_t left, int64_t n_heads, int64_t hd, int64_t elem_bytes) {
  int64_t budget = ds_attn_score_budget(), cq = left < kCausalRows ? left : kCausalRows;
  while (cq > 1 && (n_heads * cq * ds_attn_ld(first_keys + cq - 1, 0) * elem_bytes > budget ||
                    n_heads * cq * hd * (int64_t)sizeof(float) > DS_ATTN_ROW_BYTES))
    cq = (cq + 1) / 2;
  return cq;
}

/* The chunks' row[] and vis[] of every query row, uploaded as one array [2 * rows]: row[i] = i,
 * vis[i] = keys row i sees (first_vis[s] + its index in sequence s). Returns the device copy. */
const int64_t *upload_causal_rows(const int64_t *seq_off, int64_t n_seqs, int64_t first_vis) {
  int64_t rows = seq_off[n_seqs];
  int64_t *h = (int64_t *)ds_cuda_host_array((size_t)(2 * rows), sizeof(int64_t), "causal attention rows");
  for (int64_t s = 0; s < n_seqs; s++)
    for (int64_t i = seq_off[s]; i < seq_off[s + 1]; i++) {
      h[i] = i;
      h[rows + i] = first_vis + (i - seq_off[s]);
    }
  const int64_t *d = (const int64_t *)ds_cuda_upload(DS_CUDA_SLOT_INDEX, h, (size_t)(2 * rows) * sizeof(int64_t));
  free(h);
  return d;
}

void check_seq_off(const int64_t *seq_off, int64_t n_seqs) {
  DS_CHECK(seq_off[0] == 0);
  for (int64_t s = 0; s < n_seqs; s++) DS_CHECK(seq_off[s + 1] >= seq_off[s]);
}

/* Query rows q0 .. of one sequence (global rows first + q0 ..) as chunks of the GEMM path, in
 * order; keys are the sequence's (k, v views at its key 0), past of them before its row 0. */
template <class Run>
void causal_chunks(const int64_t *dev_rows, int64_t total_rows, int64_t first, int64_t len, int64_t past,
                   const ds_attn_keys &k, const ds_attn_keys &v, int64_t n_heads, int64_t hd, int64_t elem_bytes,
                   Run run) {
  for (int64_t q0 = 0; q0 < len;) {
    int64_t cq = causal_chunk_rows(past + q0 + 1, len - q0, n_heads, hd, elem_bytes);
    ds_attn_chunk c = {dev_rows + first + q0, dev_rows + total_rows + first + q0, cq, k, v, past + q0 + cq,
                       NULL, NULL};
    run(c);
    q0 += cq;
  }
}

/* The job of q [rows, n_heads * hd] against keys [rows, n_kv_heads * hd] (the training layout). */
ds_attn_job train_job(const float *q, int64_t n_heads, int64_t n_kv_heads, int64_t hd, float scale) {
  ds_attn_job j = {};
  j.q = q;
  j.q_stride = n_heads * hd;
  j.n_heads = n_heads;
  j.n_kv = n_kv_heads;
  j.hd = hd;
  j.scale = scale;
  j.bf16 = ds_cuda_bf16_gemm();
  j.dk_row = n_kv_heads * hd;
  j.dk_head = hd;
  return j;
}

/* The flash kernel's tiles for n queries at positions past .. past+n-1 of a cache. */
void decode_flash(float *out, const float *q, int64_t q_stride, const float *k, const float *v, int64_t n,
                  int64_t past, int64_t cap, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale) {
  ds_attn_geom g = {q, q_stride, k, v, head_dim, cap * head_dim, n_heads, n_heads / n_kv_heads, head_dim, scale};
  int64_t n_tiles = (n + DS_ATTN_QUERY_WARPS - 1) / DS_ATTN_QUERY_WARPS;
  ds_attn_qtile *tiles = (ds_attn_qtile *)ds_cuda_host_array((size_t)n_tiles, sizeof *tiles, "decode attention tiles");
  for (int64_t i0 = 0, t = 0; i0 < n; i0 += DS_ATTN_QUERY_WARPS, t++) {
    int64_t nr = n - i0 < DS_ATTN_QUERY_WARPS ? n - i0 : DS_ATTN_QUERY_WARPS;
    tiles[t] = ds_attn_qtile{i0, nr, past + n, past + i0 + 1};
  }
  ds_cuda_flash_forward(&g, tiles, n_tiles, out);
  free(tiles);
}

}  // namespace

/* Query i (position past + i) sees cache keys 0 .. past + i of its kv head; the cache is
 * [n_kv_heads, cap, hd]: a key row is hd floats, a head cap * hd. */
void ds_cuda_attention_causal(float *out, const float *q, int64_t q_stride, const float *k, const float *v, int64_t n,
                              int64_t past, int64_t cap, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                              float scale) {
  if (n == 0 || n_heads == 0) return;
  DS_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0 && past >= 0 && past + n <= cap);
  if (n <= kFlashMaxQueries && past + n <= kFlashMaxKeys && head_dim <= DS_ATTN_MAX_HEAD_DIM) {
    decode_flash(out, q, q_stride, k, v, n, past, cap, n_heads, n_kv_heads, head_dim, scale);
    return;
  }
  int64_t seq_off[2] = {0, n};
  const int64_t *dev_rows = upload_causal_rows(seq_off, 1, past + 1);
  ds_attn_job j = train_job(q, n_heads, n_kv_heads, head_dim, scale);
  j.q_stride = q_stride;
  j.out = out;
  ds_attn_keys kk = ds_attn_keys_ready(k, past + n, head_dim, cap * head_dim, n_kv_heads, head_dim, j.bf16,
                                       DS_CUDA_SLOT_ATTN_K16);
  ds_attn_keys vv = ds_attn_keys_ready(v, past + n, head_dim, cap * head_dim, n_kv_heads, head_dim, j.bf16,
                                       DS_CUDA_SLOT_ATTN_V16);
  causal_chunks(dev_rows, n, 0, n, past, kk, vv, n_heads, head_dim, ds_attn_score_elem_bytes(j.bf16, 0),
                [&](const ds_attn_chunk &c) { ds_attn_gemm_forward(&j, &c); });
}

void ds_cuda_attention_causal_train(float *out, float *lse, const float *q, const float *k, const float *v,
                                    const int64_t *seq_off, int64_t n_seqs, int64_t n_heads, int64_t n_kv_heads,
                                    int64_t head_dim, float scale) {
  if (n_seqs == 0 || n_heads == 0) return;
  check_seq_off(seq_off, n_seqs);
  DS_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0);
  int64_t rows = seq_off[n_seqs], kvs = n_kv_heads * head_dim;
  if (rows == 0) return;
  const int64_t *dev_rows = upload_causal_rows(seq_off, n_seqs, 1);
  ds_attn_job j = train_job(q, n_heads, n_kv_heads, head_dim, scale);
  j.out = out;
  j.lse = lse;
  for (int64_t s = 0; s < n_seqs; s++) {
    int64_t first = seq_off[s], len = seq_off[s + 1] - first;
    if (len == 0) continue;
    ds_attn_keys kk = ds_attn_keys_ready(k + first * kvs, len, kvs, head_dim, n_kv_heads, head_dim, j.bf16,
                                         DS_CUDA_SLOT_ATTN_K16);
    ds_attn_keys vv = ds_attn_keys_ready(v + first * kvs, len, kvs, head_dim, n_kv_heads, head_dim, j.bf16,
                                         DS_CUDA_SLOT_ATTN_V16);
    causal_chunks(dev_rows, rows, first, len, 0, kk, vv, n_heads, head_dim, ds_attn_score_elem_bytes(j.bf16, 0),
                  [&](const ds_attn_chunk &c) { ds_attn_gemm_forward(&j, &c); });
  }
}

void ds_cuda_attention_causal_train_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                             const float *lse, const float *q, const float *k, const float *v,
                                             const int64_t *seq_off, int64_t n_seqs, int64_t n_heads,
                                             int64_t n_kv_heads, int64_t head_dim, float scale) {
  if (n_seqs == 0 || n_heads == 0 || (!dq && !dk && !dv)) return;
  check_seq_off(seq_off, n_seqs);
  DS_CHECK(lse != NULL && n_kv_heads > 0 && n_heads % n_kv_heads == 0);
  int64_t rows = seq_off[n_seqs], kvs = n_kv_heads * head_dim;
  if (rows == 0) return;
  ds_attn_job j = train_job(q, n_heads, n_kv_heads, head_dim, scale);
  j.dout = dout;
  j.lse_in = lse;
  j.D = ds_cuda_attn_rowsum(dout, out, rows, n_heads, head_dim);
  j.dq = dq;
  const int64_t *dev_rows = upload_causal_rows(seq_off, n_seqs, 1);
  for (int64_t s = 0; s < n_seqs; s++) {
    int64_t first = seq_off[s], len = seq_off[s + 1] - first;
    if (len == 0) continue;
    ds_attn_keys kk = ds_attn_keys_ready(k + first * kvs, len, kvs, head_dim, n_kv_heads, head_dim, j.bf16,
                                         DS_CUDA_SLOT_ATTN_K16);
    ds_attn_keys vv = ds_attn_keys_ready(v + first * kvs, len, kvs, head_dim, n_kv_heads, head_dim, j.bf16,
                                         DS_CUDA_SLOT_ATTN_V16);
    causal_chunks(dev_rows, rows, first, len, 0, kk, vv, n_heads, head_dim, ds_attn_score_elem_bytes(j.bf16, 1),
                  [&](ds_attn_chunk c) {
                    c.dk = dk ? dk + first * kvs : NULL;
                    c.dv = dv ? dv + first * kvs : NULL;
                    ds_attn_gemm_backward(&j, &c);
                  });
  }
}
