/* Causal attention entries of the CUDA backend: against a KV cache (decode, prefill) and over
 * packed sequences (training: forward with lse, backward), on the GEMM path
 * (cuda_attn_gemm.cu). A long sequence is cut into chunks of consecutive query rows whose keys
 * are the sequence's 0 .. the chunk's last row, each row seeing its causal prefix; consecutive
 * short sequences share one chunk, each row masked to its own sequence. A handful of decode
 * queries over a short cache run the flash kernel (cuda_flash.cu) instead.
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
/* attention_causal takes the flash kernel up to this many queries over up to flash_max_keys()
 * keys (past + n): there the GEMM path is mostly launch overhead, while the flash kernel
 * streams the keys through one warp per query row, slow on a long cache. Estimated, not
 * measured yet (bench_cuda_kernels times both paths). */
constexpr int64_t kFlashMaxQueries = 16, kFlashMaxKeys = 512;

/* kFlashMaxKeys, or DSPARK_CUDA_ATTN_FLASH_KEYS from the environment (read per call; 0: never
 * the flash kernel), for timing both paths at one shape. */
int64_t flash_max_keys(void) {
  const char *env = getenv("DSPARK_CUDA_ATTN_FLASH_KEYS");
  return env && *env ? (int64_t)strtoll(env, NULL, 10) : kFlashMaxKeys;
}

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

/* Rows whose chunks share one key range starting at their first row: sequences s0 .. s1-1.
 * packed: several short sequences (or one) that fit one chunk together, each row masked to
 * its own sequence's keys (the block diagonal's other products are wasted, as a long
 * sequence's masked triangle is, but many short sequences take one chunk's launches, not one
 * each); else a single sequence cut into causal chunks. */
struct span {
  int64_t s0, s1, first, len;
  int packed;
};

void check_seq_off(const int64_t *seq_off, int64_t n_seqs) {
  DS_CHECK(seq_off[0] == 0);
  for (int64_t s = 0; s < n_seqs; s++) DS_CHECK(seq_off[s + 1] >= seq_off[s]);
}

/* The spans of the packed sequences in order (past cached keys before row 0: decode). */
span *plan_spans(const int64_t *seq_off, int64_t n_seqs, int64_t past, int64_t n_heads, int64_t hd,
                 int64_t elem_bytes, int64_t *n_spans) {
  span *sp = (span *)ds_cuda_host_array((size_t)n_seqs, sizeof(span), "causal attention spans");
  int64_t budget = ds_attn_score_budget(), n = 0;
  for (int64_t s = 0; s < n_seqs;) {
    int64_t s0 = s, total = 0;
    for (; s < n_seqs; s++) {
      int64_t t = total + seq_off[s + 1] - seq_off[s];
      if (t > kCausalRows || n_heads * t * ds_attn_ld(past + t, 0) * elem_bytes > budget ||
          n_heads * t * hd * (int64_t)sizeof(float) > DS_ATTN_ROW_BYTES)
        break;
      total = t;
    }
    if (s == s0) { /* this sequence alone is too long for one chunk */
      sp[n++] = span{s0, s0 + 1, seq_off[s0], seq_off[s0 + 1] - seq_off[s0], 0};
      s++;
    } else if (total > 0) {
      sp[n++] = span{s0, s, seq_off[s0], total, 1};
    }
  }
  *n_spans = n;
  return sp;
}

/* The chunks' row[], lo[] and vis[] of every query row, uploaded as one array [3 * rows]: row[i]
 * = i; its visible keys, counted from its span's first row (key 0 of its chunks), are its own
 * sequence's from lo[i] up to itself, vis[i] - 1 (past more in decode). Returns the device copy. */
const int64_t *upload_rows(const int64_t *seq_off, const span *sp, int64_t n_spans, int64_t rows, int64_t past) {
  int64_t *h = (int64_t *)ds_cuda_host_array((size_t)(3 * rows), sizeof(int64_t), "causal attention rows");
  for (int64_t k = 0; k < n_spans; k++)
    for (int64_t s = sp[k].s0; s < sp[k].s1; s++)
      for (int64_t i = seq_off[s]; i < seq_off[s + 1]; i++) {
        h[i] = i;
        h[rows + i] = seq_off[s] - sp[k].first;
        h[2 * rows + i] = past + i - sp[k].first + 1;
      }
  const int64_t *d = (const int64_t *)ds_cuda_upload(DS_CUDA_SLOT_INDEX, h, (size_t)(3 * rows) * sizeof(int64_t));
  free(h);
  return d;
}

/* The chunks of one span in order; k, v: views at the span's key 0. */
template <class Run>
void span_chunks(const int64_t *dev, int64_t rows, const span &sp, int64_t past, const ds_attn_keys &k,
                 const ds_attn_keys &v, int64_t n_heads, int64_t hd, int64_t elem_bytes, Run run) {
  for (int64_t q0 = 0; q0 < sp.len;) {
    int64_t cq = sp.packed ? sp.len : causal_chunk_rows(past + q0 + 1, sp.len - q0, n_heads, hd, elem_bytes);
    int64_t i0 = sp.first + q0;
    ds_attn_chunk c = {dev + i0, dev + rows + i0, dev + 2 * rows + i0, cq, k, v, past + q0 + cq, NULL, NULL};
    run(c);
    q0 += cq;
  }
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
  if (n <= kFlashMaxQueries && past + n <= flash_max_keys() && head_dim <= DS_ATTN_MAX_HEAD_DIM) {
    decode_flash(out, q, q_stride, k, v, n, past, cap, n_heads, n_kv_heads, head_dim, scale);
    return;
  }
  ds_attn_job j = ds_attn_job_make(q, n_heads, n_kv_heads, head_dim, scale);
  j.q_stride = q_stride;
  j.out = out;
  int64_t seq_off[2] = {0, n}, n_spans = 0, eb = ds_attn_score_elem_bytes(j.bf16, 0);
  span *sp = plan_spans(seq_off, 1, past, n_heads, head_dim, eb, &n_spans);
  const int64_t *dev = upload_rows(seq_off, sp, n_spans, n, past);
  ds_attn_keys kk = ds_attn_keys_ready(k, past + n, head_dim, cap * head_dim, n_kv_heads, head_dim, j.bf16,
                                       DS_CUDA_SLOT_ATTN_K16);
  ds_attn_keys vv = ds_attn_keys_ready(v, past + n, head_dim, cap * head_dim, n_kv_heads, head_dim, j.bf16,
                                       DS_CUDA_SLOT_ATTN_V16);
  span_chunks(dev, n, sp[0], past, kk, vv, n_heads, head_dim, eb,
              [&](const ds_attn_chunk &c) { ds_attn_gemm_forward(&j, &c); });
  free(sp);
}

void ds_cuda_attention_causal_train(float *out, float *lse, const float *q, const float *k, const float *v,
                                    const int64_t *seq_off, int64_t n_seqs, int64_t n_heads, int64_t n_kv_heads,
                                    int64_t head_dim, float scale) {
  if (n_seqs == 0 || n_heads == 0) return;
  check_seq_off(seq_off, n_seqs);
  DS_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0);
  int64_t rows = seq_off[n_seqs], kvs = n_kv_heads * head_dim;
  if (rows == 0) return;
  ds_attn_job j = ds_attn_job_make(q, n_heads, n_kv_heads, head_dim, scale);
  j.out = out;
  j.lse = lse;
  int64_t n_spans = 0, eb = ds_attn_score_elem_bytes(j.bf16, 0);
  span *sp = plan_spans(seq_off, n_seqs, 0, n_heads, head_dim, eb, &n_spans);
  const int64_t *dev = upload_rows(seq_off, sp, n_spans, rows, 0);
  for (int64_t i = 0; i < n_spans; i++) {
    ds_attn_keys kk = ds_attn_keys_ready(k + sp[i].first * kvs, sp[i].len, kvs, head_dim, n_kv_heads, head_dim,
                                         j.bf16, DS_CUDA_SLOT_ATTN_K16);
    ds_attn_keys vv = ds_attn_keys_ready(v + sp[i].first * kvs, sp[i].len, kvs, head_dim, n_kv_heads, head_dim,
                                         j.bf16, DS_CUDA_SLOT_ATTN_V16);
    span_chunks(dev, rows, sp[i], 0, kk, vv, n_heads, head_dim, eb,
                [&](const ds_attn_chunk &c) { ds_attn_gemm_forward(&j, &c); });
  }
  free(sp);
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
  ds_attn_job j = ds_attn_job_make(q, n_heads, n_kv_heads, head_dim, scale);
  j.dout = dout;
  j.lse_in = lse;
  j.D = ds_cuda_attn_rowsum(dout, out, rows, n_heads, head_dim);
  j.dq = dq;
  int64_t n_spans = 0, eb = ds_attn_score_elem_bytes(j.bf16, 1);
  span *sp = plan_spans(seq_off, n_seqs, 0, n_heads, head_dim, eb, &n_spans);
  const int64_t *dev = upload_rows(seq_off, sp, n_spans, rows, 0);
  for (int64_t i = 0; i < n_spans; i++) {
    int64_t first = sp[i].first;
    ds_attn_keys kk = ds_attn_keys_ready(k + first * kvs, sp[i].len, kvs, head_dim, n_kv_heads, head_dim, j.bf16,
                                         DS_CUDA_SLOT_ATTN_K16);
    ds_attn_keys vv = ds_attn_keys_ready(v + first * kvs, sp[i].len, kvs, head_dim, n_kv_heads, head_dim, j.bf16,
                                         DS_CUDA_SLOT_ATTN_V16);
    span_chunks(dev, rows, sp[i], 0, kk, vv, n_heads, head_dim, eb, [&](ds_attn_chunk c) {
      c.dk = dk ? dk + first * kvs : NULL;
      c.dv = dv ? dv + first * kvs : NULL;
      ds_attn_gemm_backward(&j, &c);
    });
  }
  free(sp);
}
