/* The flash-style attention kernels every attention entry of the CUDA backend shares
 * (cuda_flash.cu): the host describes the work as tiles, and the kernels never build a
 * [queries, keys] matrix. Not a public header.
 *
 * Forward (and the backward's dq): a CUDA block takes one query tile (up to
 * DS_ATTN_QUERY_WARPS rows that see the same keys, one warp per row) for one query head,
 * streams the keys through shared memory DS_ATTN_KEY_TILE at a time and keeps an online
 * softmax per row (running max, sum, output in registers: a lane holds dims lane + 32c). The
 * log-sum-exp is saved; the backward recomputes P = exp(s - lse) from it.
 * dk / dv: a CUDA block takes one key tile (up to DS_ATTN_KEY_WARPS key rows, one warp each)
 * for one kv head and streams the (query row, head of its group) pairs that may see them
 * through shared memory in a fixed order. Each gradient element is summed by one thread in a
 * fixed order, with no atomics: results are deterministic.
 *
 * Keys of a query tile are a concatenation: keys 0 .. na-1 are rows a0 .. of tensor A, keys
 * na .. na+nb-1 rows b0 .. of tensor B (block attention: context, then the block's own keys). */
#ifndef DSPARK_NN_CUDA_FLASH_H
#define DSPARK_NN_CUDA_FLASH_H

#include "nn/cuda/cuda_internal.h"

constexpr int64_t DS_ATTN_QUERY_WARPS = 8, DS_ATTN_KEY_WARPS = 8, DS_ATTN_KEY_TILE = 16, DS_ATTN_MAX_HEAD_DIM = 256;

struct ds_attn_qtile {
  int64_t q_row0, n_rows; /* query rows q_row0 .. q_row0 + n_rows - 1 (n_rows <= DS_ATTN_QUERY_WARPS) */
  int64_t a0, na;         /* keys 0 .. na-1: rows a0 .. a0+na-1 of tensor A */
  int64_t b0, nb;         /* keys na .. na+nb-1: rows b0 .. b0+nb-1 of tensor B */
  int64_t vis0;           /* causal: row q_row0 + w sees keys 0 .. vis0 + w - 1; -1: every key */
  int64_t dropped;        /* 1: a dropped block: out 0, lse -inf, no key read */
};

constexpr int64_t DS_ATTN_SEE_ALL = 0, DS_ATTN_SEE_CAUSAL = 1, DS_ATTN_SEE_CTX = 2;

struct ds_attn_ktile {
  int64_t which;          /* 0: the keys are rows of tensor A (gradients into dA), 1: tensor B */
  int64_t k_row0, n_keys; /* key rows k_row0 .. (n_keys <= DS_ATTN_KEY_WARPS) */
  int64_t q_row0, n_qrows; /* the query rows that may see them */
  int64_t rule;           /* DS_ATTN_SEE_ALL; _CAUSAL: query row >= key row (one packed sequence);
                             _CTX: ctx_len[query row / g] > key row (block attention's context) */
};

/* Where the tensors are. Query row r, head h: q + r * q_stride + h * hd; out, dout, dq: row
 * stride n_heads * hd; lse and D: [rows, n_heads]. Key (or value) row t of kv head j: k + t *
 * k_row_stride + j * k_head_stride; the gradients dk, dv have the keys' layout. */
struct ds_attn_geom {
  const float *q;
  int64_t q_stride;
  const float *ka, *va, *kb, *vb;
  int64_t k_row_stride, k_head_stride;
  int64_t n_heads, group, hd; /* group = n_heads / n_kv_heads */
  float scale;
  const int64_t *ctx_len; /* device copy, for DS_ATTN_SEE_CTX */
  int64_t g;              /* block size, for DS_ATTN_SEE_CTX */
};

/* The layout every attention family shares: q [rows, n_heads * hd], keys a (and values a) with
 * rows of n_kv_heads * hd; the block attention adds kb / vb, ctx_len and g. */
static inline ds_attn_geom ds_attn_geom_make(const float *q, const float *ka, const float *va, int64_t n_heads,
                                             int64_t n_kv_heads, int64_t hd, float scale) {
  DS_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0);
  ds_attn_geom g = {};
  g.q = q;
  g.q_stride = n_heads * hd;
  g.ka = ka;
  g.va = va;
  g.k_row_stride = n_kv_heads * hd;
  g.k_head_stride = hd;
  g.n_heads = n_heads;
  g.group = n_heads / n_kv_heads;
  g.hd = hd;
  g.scale = scale;
  return g;
}

/* Checks the head size the kernels support (a row lives in registers). */
void ds_cuda_attn_check_head_dim(int64_t hd);
/* out (and lse when non-NULL) of every row of the tiles (host array, uploaded here). */
void ds_cuda_attn_forward(const ds_attn_geom *geom, const ds_attn_qtile *tiles, int64_t n_tiles, float *out,
                          float *lse);
/* D[rows, n_heads] = sum over the head's dims of dout * out, in scratch (DS_CUDA_SLOT_ROWSUM). */
float *ds_cuda_attn_rowsum(const float *dout, const float *out, int64_t rows, int64_t n_heads, int64_t hd);
/* dq += ... over the (not dropped) query tiles. */
void ds_cuda_attn_dq(const ds_attn_geom *geom, const ds_attn_qtile *tiles, int64_t n_tiles, const float *dout,
                     const float *lse, const float *D, float *dq);
/* dka / dva (which 0) or dkb / dvb (which 1) += ... over the key tiles; NULL skips one. */
void ds_cuda_attn_dkdv(const ds_attn_geom *geom, const ds_attn_ktile *tiles, int64_t n_tiles, int64_t n_kv_heads,
                       const float *dout, const float *lse, const float *D, float *dka, float *dva, float *dkb,
                       float *dvb);

#endif
