/* The flash-style attention kernel kept for decoding a handful of queries against a KV cache
 * (cuda_flash.cu; attention_causal in cuda_attention.cu picks it below the thresholds there):
 * at a few query rows the GEMM path (cuda_attn_gemm.cu) is mostly launch overhead. Not a
 * public header.
 *
 * A CUDA block takes one query tile (up to DS_ATTN_QUERY_WARPS consecutive rows, one warp per
 * row) for one query head, streams the tile's keys through shared memory DS_ATTN_KEY_TILE at a
 * time and keeps an online softmax per row (running max, sum, output in registers: a lane holds
 * dims lane + 32c). No [queries, keys] matrix is built. */
#ifndef DSPARK_NN_CUDA_FLASH_H
#define DSPARK_NN_CUDA_FLASH_H

#include "nn/cuda/cuda_internal.h"

constexpr int64_t DS_ATTN_QUERY_WARPS = 8, DS_ATTN_KEY_TILE = 16, DS_ATTN_MAX_HEAD_DIM = 256;

struct ds_attn_qtile {
  int64_t q_row0, n_rows; /* query rows q_row0 .. q_row0 + n_rows - 1 (n_rows <= DS_ATTN_QUERY_WARPS) */
  int64_t n_keys;         /* keys 0 .. n_keys-1 of the cache */
  int64_t vis0;           /* row q_row0 + w sees keys 0 .. vis0 + w - 1 */
};

/* Where the tensors are. Query row r, head h: q + r * q_stride + h * hd; out: row stride
 * n_heads * hd. Key (or value) t of kv head j: k + t * k_row_stride + j * k_head_stride. */
struct ds_attn_geom {
  const float *q;
  int64_t q_stride;
  const float *k, *v;
  int64_t k_row_stride, k_head_stride;
  int64_t n_heads, group, hd; /* group = n_heads / n_kv_heads */
  float scale;
};

/* out of every row of the tiles (host array, uploaded here); head_dim <= DS_ATTN_MAX_HEAD_DIM. */
void ds_cuda_flash_forward(const ds_attn_geom *geom, const ds_attn_qtile *tiles, int64_t n_tiles, float *out);

#endif
