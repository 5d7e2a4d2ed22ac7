/* Causal attention entries of the CUDA backend: decoding against a KV cache and training over
 * packed sequences (forward with lse, backward). They describe their work as tiles for the
 * shared flash kernels (cuda_flash.cu); seq_off is host memory (include/dspark/backend.h), so
 * the tiles are built here on the host. Contracts in include/dspark/backend.h. */
#include <stdlib.h>

#include "nn/cuda/cuda_flash.h"

namespace {

/* Query tiles of the packed sequences: DS_ATTN_QUERY_WARPS rows of one sequence at a time;
 * row p of a sequence sees its keys 0 .. p. */
ds_attn_qtile *causal_query_tiles(const int64_t *seq_off, int64_t n_seqs, int64_t *n_tiles) {
  int64_t count = 0;
  for (int64_t s = 0; s < n_seqs; s++) {
    int64_t len = seq_off[s + 1] - seq_off[s];
    DS_CHECK(len >= 0);
    count += (len + DS_ATTN_QUERY_WARPS - 1) / DS_ATTN_QUERY_WARPS;
  }
  ds_attn_qtile *tiles = (ds_attn_qtile *)ds_cuda_host_array((size_t)count, sizeof *tiles, "causal attention tiles");
  int64_t k = 0;
  for (int64_t s = 0; s < n_seqs; s++) {
    int64_t first = seq_off[s], len = seq_off[s + 1] - first;
    for (int64_t r0 = 0; r0 < len; r0 += DS_ATTN_QUERY_WARPS) {
      int64_t nr = len - r0 < DS_ATTN_QUERY_WARPS ? len - r0 : DS_ATTN_QUERY_WARPS;
      tiles[k++] = ds_attn_qtile{first + r0, nr, first, len, 0, 0, r0 + 1, 0};
    }
  }
  *n_tiles = count;
  return tiles;
}

/* Key tiles: DS_ATTN_KEY_WARPS keys of one sequence, seen by the rows of the sequence at or
 * after them. */
ds_attn_ktile *causal_key_tiles(const int64_t *seq_off, int64_t n_seqs, int64_t *n_tiles) {
  int64_t count = 0;
  for (int64_t s = 0; s < n_seqs; s++)
    count += (seq_off[s + 1] - seq_off[s] + DS_ATTN_KEY_WARPS - 1) / DS_ATTN_KEY_WARPS;
  ds_attn_ktile *tiles = (ds_attn_ktile *)ds_cuda_host_array((size_t)count, sizeof *tiles, "causal attention key tiles");
  int64_t k = 0;
  for (int64_t s = 0; s < n_seqs; s++) {
    int64_t first = seq_off[s], len = seq_off[s + 1] - first;
    for (int64_t k0 = 0; k0 < len; k0 += DS_ATTN_KEY_WARPS) {
      int64_t nk = len - k0 < DS_ATTN_KEY_WARPS ? len - k0 : DS_ATTN_KEY_WARPS;
      tiles[k++] = ds_attn_ktile{0, first + k0, nk, first + k0, len - k0, DS_ATTN_SEE_CAUSAL};
    }
  }
  *n_tiles = count;
  return tiles;
}

/* Training layout: q [rows, n_heads * hd], k and v [rows, n_kv_heads * hd]. */
ds_attn_geom train_geom(const float *q, const float *k, const float *v, int64_t n_heads, int64_t n_kv_heads,
                        int64_t hd, float scale) {
  return ds_attn_geom_make(q, k, v, n_heads, n_kv_heads, hd, scale);
}

}  // namespace

/* Decoding: query i (position past + i) sees cache keys 0 .. past + i of its kv head; the
 * cache is [n_kv_heads, cap, hd], so a key row is hd floats and a head cap * hd. */
void ds_cuda_attention_causal(float *out, const float *q, int64_t q_stride, const float *k, const float *v, int64_t n,
                              int64_t past, int64_t cap, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                              float scale) {
  if (n == 0 || n_heads == 0) return;
  DS_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0 && past >= 0 && past + n <= cap);
  ds_attn_geom g = {};
  g.q = q;
  g.q_stride = q_stride;
  g.ka = k;
  g.va = v;
  g.k_row_stride = head_dim;
  g.k_head_stride = cap * head_dim;
  g.n_heads = n_heads;
  g.group = n_heads / n_kv_heads;
  g.hd = head_dim;
  g.scale = scale;
  int64_t n_tiles = (n + DS_ATTN_QUERY_WARPS - 1) / DS_ATTN_QUERY_WARPS;
  ds_attn_qtile *tiles = (ds_attn_qtile *)ds_cuda_host_array((size_t)n_tiles, sizeof *tiles, "decode attention tiles");
  for (int64_t i0 = 0, t = 0; i0 < n; i0 += DS_ATTN_QUERY_WARPS, t++) {
    int64_t nr = n - i0 < DS_ATTN_QUERY_WARPS ? n - i0 : DS_ATTN_QUERY_WARPS;
    tiles[t] = ds_attn_qtile{i0, nr, 0, past + n, 0, 0, past + i0 + 1, 0};
  }
  ds_cuda_attn_forward(&g, tiles, n_tiles, out, NULL);
  free(tiles);
}

void ds_cuda_attention_causal_train(float *out, float *lse, const float *q, const float *k, const float *v,
                                    const int64_t *seq_off, int64_t n_seqs, int64_t n_heads, int64_t n_kv_heads,
                                    int64_t head_dim, float scale) {
  if (n_seqs == 0 || n_heads == 0) return;
  DS_CHECK(seq_off[0] == 0);
  ds_attn_geom g = train_geom(q, k, v, n_heads, n_kv_heads, head_dim, scale);
  int64_t n_tiles = 0;
  ds_attn_qtile *tiles = causal_query_tiles(seq_off, n_seqs, &n_tiles);
  ds_cuda_attn_forward(&g, tiles, n_tiles, out, lse);
  free(tiles);
}

void ds_cuda_attention_causal_train_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                             const float *lse, const float *q, const float *k, const float *v,
                                             const int64_t *seq_off, int64_t n_seqs, int64_t n_heads,
                                             int64_t n_kv_heads, int64_t head_dim, float scale) {
  if (n_seqs == 0 || n_heads == 0 || (!dq && !dk && !dv)) return;
  DS_CHECK(seq_off[0] == 0 && lse != NULL);
  ds_attn_geom g = train_geom(q, k, v, n_heads, n_kv_heads, head_dim, scale);
  const float *D = ds_cuda_attn_rowsum(dout, out, seq_off[n_seqs], n_heads, head_dim);
  if (dq) {
    int64_t n_tiles = 0;
    ds_attn_qtile *tiles = causal_query_tiles(seq_off, n_seqs, &n_tiles);
    ds_cuda_attn_dq(&g, tiles, n_tiles, dout, lse, D, dq);
    free(tiles);
  }
  if (dk || dv) {
    int64_t n_tiles = 0;
    ds_attn_ktile *tiles = causal_key_tiles(seq_off, n_seqs, &n_tiles);
    ds_cuda_attn_dkdv(&g, tiles, n_tiles, n_kv_heads, dout, lse, D, dk, dv, NULL, NULL);
    free(tiles);
  }
}
