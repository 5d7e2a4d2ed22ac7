/* CPU causal self-attention over whole packed sequences, for training (include/dspark/backend.h,
 * attention_causal_train and its backward), written like the draft's block attention in
 * cpu_block_attention.c.
 *
 * Work is split into (sequence, kv head, query chunk) tiles: the query heads of the GQA group
 * are stacked into one [group * qn, head_dim] tile (row r = query i * group + head j), so every
 * sgemm has group * qn rows and streams the shared keys once per tile. The queries of a chunk
 * at positions q0 .. q0+qn-1 see keys 0 .. q0+qn-1: the scores of a tile are
 * [group * qn, q0 + qn], the O(chunk * len) scratch per thread; the causal mask only bites
 * inside the chunk's own keys. No [len, len] tensor exists anywhere.
 *
 * The forward saves the log-sum-exp of every softmax row; the backward recomputes the
 * probabilities from it. In the backward, a (sequence, kv head) pair owns the dk / dv rows and
 * columns of its keys, and its query chunks run in order. When those pairs do not spread
 * evenly over the threads, each pair's chunks are cut into parts of about equal work; each
 * part accumulates its dk / dv into a private buffer and the buffers are added in part order
 * at the end. The part count depends on the thread count and the shapes only: results are
 * bitwise reproducible for a given thread count (no atomics). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/backend.h"
#include "nn/cpu_kernels.h"
#include "nn/fast_exp.h"

enum { CHUNK = 64 }; /* query positions per tile */

/* The problem, as the backend.h entry describes it. */
typedef struct {
  const int64_t *seq_off;
  int64_t n_seqs, n_heads, n_kv, hd, group;
  int64_t qs;  /* row stride of q, out, dq, dout: n_heads * hd */
  int64_t kvs; /* row stride of k, v, dk, dv: n_kv * hd */
  int64_t max_len;
  float scale;
} cattn;

static cattn cattn_make(const int64_t *seq_off, int64_t n_seqs, int64_t n_heads, int64_t n_kv, int64_t hd,
                        float scale) {
  DS_CHECK(n_kv > 0 && n_heads % n_kv == 0 && hd > 0 && n_seqs >= 0 && (n_seqs == 0 || seq_off[0] == 0));
  cattn a = {seq_off, n_seqs, n_heads, n_kv, hd, n_heads / n_kv, n_heads * hd, n_kv * hd, 0, scale};
  for (int64_t s = 0; s < n_seqs; s++) {
    int64_t len = seq_off[s + 1] - seq_off[s];
    DS_CHECK(len >= 0);
    a.max_len = len > a.max_len ? len : a.max_len;
  }
  return a;
}

static int64_t n_chunks(int64_t len) { return (len + CHUNK - 1) / CHUNK; }

/* One tile: sequence s, kv head kvh, query chunk c. */
typedef struct {
  int64_t base;  /* first row of the sequence */
  int64_t q0, qn;/* first query position of the chunk, and its count */
  int64_t kend;  /* keys 0 .. kend-1 are visible to the chunk's last query */
  int64_t kvh, m;/* kv head; tile rows group * qn */
} tile;

static tile tile_make(const cattn *a, int64_t s, int64_t kvh, int64_t c) {
  int64_t len = a->seq_off[s + 1] - a->seq_off[s], q0 = c * CHUNK;
  int64_t qn = len - q0 < CHUNK ? len - q0 : CHUNK;
  tile t = {a->seq_off[s], q0, qn, q0 + qn, kvh, a->group * qn};
  return t;
}

/* tile[m, hd] <- rows q0 .. q0+qn-1 of x[rows, n_heads * hd], the kv head's group of heads. */
static void tile_gather(float *dst, const float *x, const cattn *a, const tile *t) {
  for (int64_t i = 0; i < t->qn; i++)
    memcpy(dst + i * a->group * a->hd, x + (t->base + t->q0 + i) * a->qs + t->kvh * a->group * a->hd,
           (size_t)(a->group * a->hd) * sizeof(float));
}

/* Offset of the tile's sequence and kv head in a [rows, KV*hd] buffer: key p at off + p * kvs. */
static int64_t kv_off(const cattn *a, const tile *t) { return t->base * a->kvs + t->kvh * a->hd; }

/* Index into lse[rows, n_heads] of tile row r. */
static int64_t lse_index(const cattn *a, const tile *t, int64_t r) {
  return (t->base + t->q0 + r / a->group) * a->n_heads + t->kvh * a->group + r % a->group;
}

/* One forward tile. Scratch: s[m, kend], ot[m, hd]. */
static void forward_tile(float *out, float *lse, const float *q, const float *k, const float *v, const cattn *a,
                         const tile *t, float *s, float *qt, float *ot) {
  int64_t T = t->kend, hd = a->hd;
  tile_gather(qt, q, a, t);
  ds_cpu_sgemm(0, 1, t->m, T, hd, qt, hd, k + kv_off(a, t), a->kvs, 0.0f, s, T);
  for (int64_t r = 0; r < t->m; r++) {
    int64_t vis = t->q0 + r / a->group + 1; /* keys 0 .. position */
    float *row = s + r * T, mx;
    float sum = ds_softmax_row_exp(row, vis, a->scale, &mx);
    for (int64_t j = vis; j < T; j++) row[j] = 0.0f;
    float inv = 1.0f / sum; /* sum >= 1: the maximum contributes exp(0) */
    for (int64_t j = 0; j < vis; j++) row[j] *= inv;
    if (lse) lse[lse_index(a, t, r)] = mx + logf(sum);
  }
  ds_cpu_sgemm(0, 0, t->m, hd, T, s, T, v + kv_off(a, t), a->kvs, 0.0f, ot, hd);
  for (int64_t i = 0; i < t->qn; i++)
    memcpy(out + (t->base + t->q0 + i) * a->qs + t->kvh * a->group * hd, ot + i * a->group * hd,
           (size_t)(a->group * hd) * sizeof(float));
}

/* out[rows, H*hd], lse[rows, H] <- q[rows, H*hd], k, v[rows, KV*hd]; tiles (seq, kv head, chunk). */
void ds_cpu_attention_causal_train(float *out, float *lse, const float *q, const float *k, const float *v,
                                   const int64_t *seq_off, int64_t n_seqs, int64_t n_heads, int64_t n_kv_heads,
                                   int64_t head_dim, float scale) {
  cattn a = cattn_make(seq_off, n_seqs, n_heads, n_kv_heads, head_dim, scale);
  if (a.max_len == 0) return;
  /* Items: every (sequence, kv head, chunk), numbered through a prefix sum of chunk counts. */
  int64_t *first = malloc((size_t)(n_seqs + 1) * sizeof(int64_t));
  DS_CHECK(first != NULL);
  first[0] = 0;
  for (int64_t s = 0; s < n_seqs; s++) first[s + 1] = first[s] + n_chunks(seq_off[s + 1] - seq_off[s]) * n_kv_heads;
  int64_t items = first[n_seqs];
  DS_OMP(parallel if (items > 1))
  {
    int64_t m = a.group * CHUNK;
    float *s = malloc((size_t)(m * a.max_len) * sizeof(float));
    float *qt = malloc((size_t)(2 * m * head_dim) * sizeof(float));
    DS_CHECK(s != NULL && qt != NULL);
    DS_OMP(for schedule(dynamic))
    for (int64_t it = 0; it < items; it++) {
      int64_t sq = 0;
      while (first[sq + 1] <= it) sq++;
      int64_t local = it - first[sq];
      tile t = tile_make(&a, sq, local % n_kv_heads, local / n_kv_heads);
      forward_tile(out, lse, q, k, v, &a, &t, s, qt, qt + m * head_dim);
    }
    free(s);
    free(qt);
  }
  free(first);
}

/* Scratch of one thread for the backward. */
typedef struct {
  float *p, *ds;       /* [m, len]: probabilities, then dP -> dS */
  float *qt, *dot, *t; /* [m, hd]: q tile, dout tile, dq tile */
  float *delta;        /* [m]: rowsum(dout * out) */
} bscratch;

/* Where a backward item's dk / dv go: the caller's buffers, or a private copy of their
 * shape for one part (then written with the same row stride kvs). */
typedef struct {
  float *dq, *dk, *dv;
} bdest;

/* One backward tile: P = exp(S * scale - lse) (0 past the diagonal), dV += P^T dO,
 * dS = P * (dO V^T - rowsum(dO * O)) * scale, dQ += dS K, dK += dS^T Q. */
static void backward_tile(const bdest *dst, const float *dout, const float *out, const float *lse, const float *q,
                          const float *k, const float *v, const cattn *a, const tile *t, const bscratch *w) {
  int64_t T = t->kend, hd = a->hd, m = t->m;
  tile_gather(w->qt, q, a, t);
  tile_gather(w->dot, dout, a, t);
  ds_cpu_sgemm(0, 1, m, T, hd, w->qt, hd, k + kv_off(a, t), a->kvs, 0.0f, w->p, T);
  for (int64_t r = 0; r < m; r++) {
    int64_t vis = t->q0 + r / a->group + 1;
    float *row = w->p + r * T, l = lse[lse_index(a, t, r)], scale = a->scale;
    DS_OMP(simd)
    for (int64_t j = 0; j < vis; j++) row[j] = ds_fast_expf(row[j] * scale - l);
    for (int64_t j = vis; j < T; j++) row[j] = 0.0f;
  }
  if (dst->dv) ds_cpu_sgemm(1, 0, T, hd, m, w->p, T, w->dot, hd, 1.0f, dst->dv + kv_off(a, t), a->kvs);
  if (!dst->dq && !dst->dk) return;
  for (int64_t r = 0; r < m; r++) { /* delta[r] = dO . O = sum_j P dP (softmax backward) */
    const float *o = out + (t->base + t->q0 + r / a->group) * a->qs + (t->kvh * a->group + r % a->group) * hd;
    const float *d = w->dot + r * hd;
    float acc = 0.0f;
    DS_OMP(simd reduction(+ : acc))
    for (int64_t e = 0; e < hd; e++) acc += d[e] * o[e];
    w->delta[r] = acc;
  }
  ds_cpu_sgemm(0, 1, m, T, hd, w->dot, hd, v + kv_off(a, t), a->kvs, 0.0f, w->ds, T); /* dP = dO V^T */
  for (int64_t r = 0; r < m; r++) {
    float *dsr = w->ds + r * T, delta = w->delta[r], scale = a->scale;
    const float *pr = w->p + r * T;
    DS_OMP(simd)
    for (int64_t j = 0; j < T; j++) dsr[j] = pr[j] * (dsr[j] - delta) * scale; /* P = 0 past the diagonal */
  }
  if (dst->dq) {
    ds_cpu_sgemm(0, 0, m, hd, T, w->ds, T, k + kv_off(a, t), a->kvs, 0.0f, w->t, hd);
    for (int64_t r = 0; r < m; r++) {
      float *dq = dst->dq + (t->base + t->q0 + r / a->group) * a->qs + (t->kvh * a->group + r % a->group) * hd;
      const float *src = w->t + r * hd;
      for (int64_t e = 0; e < hd; e++) dq[e] += src[e];
    }
  }
  if (dst->dk) ds_cpu_sgemm(1, 0, T, hd, m, w->ds, T, w->qt, hd, 1.0f, dst->dk + kv_off(a, t), a->kvs);
}

/* Chunks of a sequence of len tokens cut into n_parts contiguous ranges of about equal work
 * (chunk c costs its key count): part p is chunks bounds[p] .. bounds[p+1]-1. */
static void split_chunks(int64_t *bounds, int64_t n_parts, int64_t len) {
  int64_t nc = n_chunks(len), total = 0, acc = 0, p = 1;
  for (int64_t c = 0; c < nc; c++) total += (c + 1) * CHUNK < len ? (c + 1) * CHUNK : len;
  bounds[0] = 0;
  for (int64_t c = 0; c < nc && p < n_parts; c++) {
    acc += (c + 1) * CHUNK < len ? (c + 1) * CHUNK : len;
    while (p < n_parts && acc * n_parts >= total * p) bounds[p++] = c + 1;
  }
  while (p <= n_parts) bounds[p++] = nc;
}

/* dq[rows, H*hd], dk, dv[rows, KV*hd] += ... <- dout, out[rows, H*hd], lse[rows, H] and the
 * forward's inputs. Items are (sequence, kv head, part). */
void ds_cpu_attention_causal_train_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                            const float *lse, const float *q, const float *k, const float *v,
                                            const int64_t *seq_off, int64_t n_seqs, int64_t n_heads,
                                            int64_t n_kv_heads, int64_t head_dim, float scale) {
  cattn a = cattn_make(seq_off, n_seqs, n_heads, n_kv_heads, head_dim, scale);
  if (a.max_len == 0 || (!dq && !dk && !dv)) return;
  /* One part per (sequence, kv head) when those spread evenly over the threads, else about
   * two items per thread. */
  int64_t nthr = ds_cpu_threads(), pairs = n_seqs * n_kv_heads, n_parts = 1;
  if (nthr > 1 && pairs % nthr != 0) n_parts = (2 * nthr + pairs - 1) / pairs;
  if (n_parts > n_chunks(a.max_len)) n_parts = n_chunks(a.max_len);
  int partial = n_parts > 1 && (dk || dv);
  int64_t rows = seq_off[n_seqs];
  size_t part_floats = (size_t)(rows * a.kvs);
  int64_t *bounds = malloc((size_t)(n_seqs * (n_parts + 1)) * sizeof(int64_t));
  float *pk = NULL, *pv = NULL;
  if (partial && dk) pk = calloc((size_t)n_parts * part_floats + 1, sizeof(float));
  if (partial && dv) pv = calloc((size_t)n_parts * part_floats + 1, sizeof(float));
  DS_CHECK(bounds != NULL && (!partial || !dk || pk) && (!partial || !dv || pv));
  for (int64_t s = 0; s < n_seqs; s++) split_chunks(bounds + s * (n_parts + 1), n_parts, seq_off[s + 1] - seq_off[s]);

  int64_t items = pairs * n_parts;
  DS_OMP(parallel if (items > 1))
  {
    size_t m = (size_t)(a.group * CHUNK), big = m * (size_t)a.max_len, small = m * (size_t)head_dim;
    float *buf = malloc((2 * big + 3 * small + m) * sizeof(float));
    DS_CHECK(buf != NULL);
    bscratch w = {buf, buf + big, buf + 2 * big, buf + 2 * big + small, buf + 2 * big + 2 * small,
                  buf + 2 * big + 3 * small};
    DS_OMP(for schedule(dynamic))
    for (int64_t it = 0; it < items; it++) {
      int64_t part = it % n_parts, kvh = (it / n_parts) % n_kv_heads, s = it / (n_parts * n_kv_heads);
      bdest dst = {dq, dk, dv};
      if (partial) {
        dst.dk = pk ? pk + (size_t)part * part_floats : NULL;
        dst.dv = pv ? pv + (size_t)part * part_floats : NULL;
      }
      const int64_t *bd = bounds + s * (n_parts + 1);
      for (int64_t c = bd[part]; c < bd[part + 1]; c++) {
        tile t = tile_make(&a, s, kvh, c);
        backward_tile(&dst, dout, out, lse, q, k, v, &a, &t, &w);
      }
    }
    free(buf);
  }

  if (partial) { /* dk += the parts' buffers, in part order */
    DS_OMP(parallel for schedule(static) if (part_floats * (size_t)n_parts > 65536))
    for (int64_t j = 0; j < (int64_t)part_floats; j++)
      for (int64_t p = 0; p < n_parts; p++) {
        if (dk) dk[j] += pk[(size_t)p * part_floats + (size_t)j];
        if (dv) dv[j] += pv[(size_t)p * part_floats + (size_t)j];
      }
  }
  free(bounds);
  free(pk);
  free(pv);
}
