/* The draft's block attention on the CUDA backend (forward with lse, backward), on the GEMM
 * path (cuda_attn_gemm.cu). Block b's g query slots see context keys 0 .. ctx_len[b]-1 and the
 * block's own g keys; a dropped block (ctx_len < 0) outputs 0 with lse -inf and gets no
 * gradient. The blocks are ordered by ctx_len (ctx_len is host memory) and cut into chunks of
 * whole blocks with similar context lengths: a chunk's context GEMMs run over its longest
 * context, so the products the shorter ones mask away stay few. Contracts in
 * include/dspark/backend.h. */
#include <stdlib.h>

#include "nn/cuda/cuda_attn_gemm.h"

namespace {

/* A chunk takes the next block (in ctx_len order) while its context is at most the chunk's
 * first one plus max(kSpreadKeys, first / kSpreadDiv): the wasted products stay under about
 * a fifth, and short contexts still share one chunk (few launches). */
constexpr int64_t kSpreadKeys = 128, kSpreadDiv = 4;

struct block_ctx {
  int64_t ctx, b;
};

int by_ctx_then_block(const void *x, const void *y) {
  const block_ctx *a = (const block_ctx *)x, *c = (const block_ctx *)y;
  if (a->ctx != c->ctx) return a->ctx < c->ctx ? -1 : 1;
  return a->b < c->b ? -1 : (a->b > c->b);
}

/* The blocks in chunk order (ctx_len ascending, then index; dropped blocks first, or left out
 * without keep_dropped), their rows on the device as row[] then vis[] (n * g each), and the
 * longest context. */
struct block_plan {
  block_ctx *order;
  int64_t n;
  const int64_t *dev;
  int64_t max_ctx;
};

block_plan plan_blocks(const int64_t *ctx_len, int64_t n_ctx, int64_t n_blocks, int64_t g, int keep_dropped) {
  block_plan p = {(block_ctx *)ds_cuda_host_array((size_t)n_blocks, sizeof(block_ctx), "block attention order"), 0,
                  NULL, 0};
  for (int64_t b = 0; b < n_blocks; b++) {
    DS_CHECK(ctx_len[b] <= n_ctx);
    if (ctx_len[b] > p.max_ctx) p.max_ctx = ctx_len[b];
    if (ctx_len[b] >= 0 || keep_dropped) p.order[p.n++] = block_ctx{ctx_len[b], b};
  }
  qsort(p.order, (size_t)p.n, sizeof(block_ctx), by_ctx_then_block);
  int64_t rows = p.n * g;
  int64_t *h = (int64_t *)ds_cuda_host_array((size_t)(2 * rows), sizeof(int64_t), "block attention rows");
  for (int64_t i = 0; i < p.n; i++)
    for (int64_t t = 0; t < g; t++) {
      h[i * g + t] = p.order[i].b * g + t;
      h[rows + i * g + t] = p.order[i].ctx;
    }
  p.dev = (const int64_t *)ds_cuda_upload(DS_CUDA_SLOT_INDEX, h, (size_t)(2 * rows) * sizeof(int64_t));
  free(h);
  return p;
}

/* Runs the plan's chunks in order: whole blocks while the scores (elem_bytes each) fit the
 * budget, the [n_heads, rows, hd] buffers DS_ATTN_ROW_BYTES and the contexts the spread above;
 * one block at least. */
template <class Run>
void block_chunks(const block_plan &p, int64_t g, int64_t n_heads, int64_t hd, int64_t elem_bytes,
                  const ds_attn_keys &k, const ds_attn_keys &v, Run run) {
  int64_t budget = ds_attn_score_budget(), rows = p.n * g;
  for (int64_t i = 0; i < p.n;) {
    int64_t c0 = p.order[i].ctx > 0 ? p.order[i].ctx : 0, spread = c0 / kSpreadDiv, nb = 1;
    if (spread < kSpreadKeys) spread = kSpreadKeys;
    for (; i + nb < p.n; nb++) {
      int64_t cn = p.order[i + nb].ctx > 0 ? p.order[i + nb].ctx : 0, r = (nb + 1) * g;
      if (cn > c0 + spread || n_heads * r * ds_attn_ld(cn, g) * elem_bytes > budget ||
          n_heads * r * hd * (int64_t)sizeof(float) > DS_ATTN_ROW_BYTES)
        break;
    }
    int64_t Lc = p.order[i + nb - 1].ctx > 0 ? p.order[i + nb - 1].ctx : 0;
    ds_attn_chunk c = {p.dev + i * g, NULL, p.dev + rows + i * g, nb * g, k, v, Lc, NULL, NULL};
    run(c);
    i += nb;
  }
}

ds_attn_job block_job(const float *q, const float *k_blk, const float *v_blk, int64_t g, int64_t n_heads,
                      int64_t n_kv_heads, int64_t hd, float scale) {
  ds_attn_job j = ds_attn_job_make(q, n_heads, n_kv_heads, hd, scale);
  j.kb = k_blk;
  j.vb = v_blk;
  j.g = g;
  return j;
}

/* The context keys and values 0 .. p.max_ctx-1, ready for the job's GEMM mode. */
void context_keys(const ds_attn_job &j, const float *k_ctx, const float *v_ctx, int64_t max_ctx, ds_attn_keys *k,
                  ds_attn_keys *v) {
  int64_t kvs = j.n_kv * j.hd;
  *k = ds_attn_keys_ready(k_ctx, max_ctx, kvs, j.hd, j.n_kv, j.hd, j.bf16, DS_CUDA_SLOT_ATTN_K16);
  *v = ds_attn_keys_ready(v_ctx, max_ctx, kvs, j.hd, j.n_kv, j.hd, j.bf16, DS_CUDA_SLOT_ATTN_V16);
}

}  // namespace

void ds_cuda_block_attention(float *out, float *lse, const float *q, const float *k_ctx, const float *v_ctx,
                             const float *k_blk, const float *v_blk, const int64_t *ctx_len, int64_t n_ctx,
                             int64_t n_blocks, int64_t g, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                             float scale) {
  if (n_blocks == 0 || g == 0 || n_heads == 0) return;
  ds_attn_job j = block_job(q, k_blk, v_blk, g, n_heads, n_kv_heads, head_dim, scale);
  j.out = out;
  j.lse = lse;
  block_plan p = plan_blocks(ctx_len, n_ctx, n_blocks, g, 1);
  ds_attn_keys k, v;
  context_keys(j, k_ctx, v_ctx, p.max_ctx, &k, &v);
  block_chunks(p, g, n_heads, head_dim, ds_attn_score_elem_bytes(j.bf16, 0), k, v,
               [&](const ds_attn_chunk &c) { ds_attn_gemm_forward(&j, &c); });
  free(p.order);
}

/* The live blocks' chunks in order: dq and the block keys' gradients per chunk, the context
 * keys' dk / dv added chunk after chunk. */
void ds_cuda_block_attention_backward(float *dq, float *dk_ctx, float *dv_ctx, float *dk_blk, float *dv_blk,
                                      const float *dout, const float *out, const float *lse, const float *q,
                                      const float *k_ctx, const float *v_ctx, const float *k_blk, const float *v_blk,
                                      const int64_t *ctx_len, int64_t n_ctx, int64_t n_blocks, int64_t g,
                                      int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale) {
  if (n_blocks == 0 || g == 0 || n_heads == 0) return;
  if (!dq && !dk_ctx && !dv_ctx && !dk_blk && !dv_blk) return;
  DS_CHECK(lse != NULL);
  ds_attn_job j = block_job(q, k_blk, v_blk, g, n_heads, n_kv_heads, head_dim, scale);
  j.dout = dout;
  j.lse_in = lse;
  j.D = ds_cuda_attn_rowsum(dout, out, n_blocks * g, n_heads, head_dim);
  j.dq = dq;
  j.dkb = dk_blk;
  j.dvb = dv_blk;
  block_plan p = plan_blocks(ctx_len, n_ctx, n_blocks, g, 0);
  ds_attn_keys k, v;
  context_keys(j, k_ctx, v_ctx, p.max_ctx, &k, &v);
  block_chunks(p, g, n_heads, head_dim, ds_attn_score_elem_bytes(j.bf16, 1), k, v, [&](ds_attn_chunk c) {
    c.dk = dk_ctx;
    c.dv = dv_ctx;
    ds_attn_gemm_backward(&j, &c);
  });
  free(p.order);
}
