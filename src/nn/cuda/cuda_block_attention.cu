/* The draft's block attention on the CUDA backend (forward with lse, backward). Block b's g
 * query slots see context keys 0 .. ctx_len[b]-1 and the block's own g keys; a dropped block
 * (ctx_len < 0) outputs 0 with lse -inf and gets no gradient. ctx_len is host memory, so the
 * tiles are built here for the shared flash kernels (cuda_flash.cu); the backward's context
 * keys need ctx_len on the device too (which blocks see a key), and it is uploaded.
 * Contracts in include/dspark/backend.h. */
#include <stdlib.h>

#include "nn/cuda/cuda_flash.h"

namespace {

ds_attn_geom block_geom(const float *q, const float *k_ctx, const float *v_ctx, const float *k_blk,
                        const float *v_blk, int64_t g_size, int64_t n_heads, int64_t n_kv_heads, int64_t hd,
                        float scale) {
  ds_attn_geom g = ds_attn_geom_make(q, k_ctx, v_ctx, n_heads, n_kv_heads, hd, scale);
  g.kb = k_blk;
  g.vb = v_blk;
  g.g = g_size;
  return g;
}

/* Query tiles: DS_ATTN_QUERY_WARPS slots of one block; with skip_dropped the dropped blocks
 * are left out (the backward), else they are tiles that write 0 and -inf. */
ds_attn_qtile *block_query_tiles(const int64_t *ctx_len, int64_t n_ctx, int64_t n_blocks, int64_t g,
                                 int skip_dropped, int64_t *n_tiles) {
  int64_t per_block = (g + DS_ATTN_QUERY_WARPS - 1) / DS_ATTN_QUERY_WARPS;
  ds_attn_qtile *tiles =
      (ds_attn_qtile *)ds_cuda_host_array((size_t)(n_blocks * per_block), sizeof *tiles, "block attention tiles");
  int64_t k = 0;
  for (int64_t b = 0; b < n_blocks; b++) {
    int64_t L = ctx_len[b];
    DS_CHECK(L <= n_ctx);
    if (L < 0 && skip_dropped) continue;
    for (int64_t i0 = 0; i0 < g; i0 += DS_ATTN_QUERY_WARPS) {
      int64_t nr = g - i0 < DS_ATTN_QUERY_WARPS ? g - i0 : DS_ATTN_QUERY_WARPS;
      tiles[k++] = ds_attn_qtile{b * g + i0, nr, 0, L < 0 ? 0 : L, b * g, g, -1, L < 0 ? 1 : 0};
    }
  }
  *n_tiles = k;
  return tiles;
}

}  // namespace

void ds_cuda_block_attention(float *out, float *lse, const float *q, const float *k_ctx, const float *v_ctx,
                             const float *k_blk, const float *v_blk, const int64_t *ctx_len, int64_t n_ctx,
                             int64_t n_blocks, int64_t g, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                             float scale) {
  if (n_blocks == 0 || g == 0 || n_heads == 0) return;
  ds_attn_geom geom = block_geom(q, k_ctx, v_ctx, k_blk, v_blk, g, n_heads, n_kv_heads, head_dim, scale);
  int64_t n_tiles = 0;
  ds_attn_qtile *tiles = block_query_tiles(ctx_len, n_ctx, n_blocks, g, 0, &n_tiles);
  ds_cuda_attn_forward(&geom, tiles, n_tiles, out, lse);
  free(tiles);
}

/* dq per query tile; dk / dv of the context per tile of DS_ATTN_KEY_WARPS context keys (every
 * block's rows are offered, each warp keeps those whose block sees its key), dk / dv of the
 * block keys per tile of one block's keys (its own g rows see them all). */
void ds_cuda_block_attention_backward(float *dq, float *dk_ctx, float *dv_ctx, float *dk_blk, float *dv_blk,
                                      const float *dout, const float *out, const float *lse, const float *q,
                                      const float *k_ctx, const float *v_ctx, const float *k_blk, const float *v_blk,
                                      const int64_t *ctx_len, int64_t n_ctx, int64_t n_blocks, int64_t g,
                                      int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale) {
  if (n_blocks == 0 || g == 0 || n_heads == 0) return;
  DS_CHECK(lse != NULL);
  ds_attn_geom geom = block_geom(q, k_ctx, v_ctx, k_blk, v_blk, g, n_heads, n_kv_heads, head_dim, scale);
  const float *D = ds_cuda_attn_rowsum(dout, out, n_blocks * g, n_heads, head_dim);
  int64_t max_ctx = 0, live_blocks = 0;
  for (int64_t b = 0; b < n_blocks; b++) {
    DS_CHECK(ctx_len[b] <= n_ctx);
    if (ctx_len[b] > max_ctx) max_ctx = ctx_len[b];
    if (ctx_len[b] >= 0) live_blocks++;
  }
  if (dq) {
    int64_t n_tiles = 0;
    ds_attn_qtile *tiles = block_query_tiles(ctx_len, n_ctx, n_blocks, g, 1, &n_tiles);
    ds_cuda_attn_dq(&geom, tiles, n_tiles, dout, lse, D, dq);
    free(tiles);
  }
  int64_t per_block = (g + DS_ATTN_KEY_WARPS - 1) / DS_ATTN_KEY_WARPS;
  int64_t ctx_tiles = (dk_ctx || dv_ctx) ? (max_ctx + DS_ATTN_KEY_WARPS - 1) / DS_ATTN_KEY_WARPS : 0;
  int64_t blk_tiles = (dk_blk || dv_blk) ? live_blocks * per_block : 0;
  if (ctx_tiles + blk_tiles == 0) return;
  ds_attn_ktile *tiles =
      (ds_attn_ktile *)ds_cuda_host_array((size_t)(ctx_tiles + blk_tiles), sizeof *tiles, "block attention key tiles");
  int64_t k = 0;
  for (int64_t t = 0; t < ctx_tiles; t++) {
    int64_t k0 = t * DS_ATTN_KEY_WARPS, nk = max_ctx - k0 < DS_ATTN_KEY_WARPS ? max_ctx - k0 : DS_ATTN_KEY_WARPS;
    tiles[k++] = ds_attn_ktile{0, k0, nk, 0, n_blocks * g, DS_ATTN_SEE_CTX};
  }
  for (int64_t b = 0; blk_tiles && b < n_blocks; b++) {
    if (ctx_len[b] < 0) continue;
    for (int64_t j0 = 0; j0 < g; j0 += DS_ATTN_KEY_WARPS) {
      int64_t nk = g - j0 < DS_ATTN_KEY_WARPS ? g - j0 : DS_ATTN_KEY_WARPS;
      tiles[k++] = ds_attn_ktile{1, b * g + j0, nk, b * g, g, DS_ATTN_SEE_ALL};
    }
  }
  if (ctx_tiles) geom.ctx_len = (const int64_t *)ds_cuda_upload(DS_CUDA_SLOT_INDEX, ctx_len,
                                                                (size_t)n_blocks * sizeof(int64_t));
  ds_cuda_attn_dkdv(&geom, tiles, k, n_kv_heads, dout, lse, D, dk_ctx, dv_ctx, dk_blk, dv_blk);
  free(tiles);
}
