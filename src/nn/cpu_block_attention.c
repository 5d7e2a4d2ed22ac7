/* CPU block attention of the DSpark draft with its backward (training; include/dspark/backend.h,
 * block_attention).
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

#include "dspark/backend.h"
#include "nn/cpu_kernels.h"
#include "nn/fast_exp.h"

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
