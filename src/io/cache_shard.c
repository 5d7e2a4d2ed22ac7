/* A cache shard in memory (filled one sample at a time) and its atomic write. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dspark/cache.h"
#include "dspark/dtype.h"
#include "dspark/safetensors.h"

ds_status ds_shard_buf_alloc(ds_shard_buf *b, const ds_cache_manifest *m, int64_t n) {
  memset(b, 0, sizeof *b);
  int64_t S = m->seq_length, d = m->hidden_size, md = d * m->n_layers, K = m->kd_topk;
  size_t es = ds_dtype_size(m->dtype), les = ds_dtype_size(ds_cache_logprob_dtype(m->dtype));
  b->len = ds_malloc((size_t)n * sizeof(int64_t), "shard");
  b->ids = ds_malloc((size_t)(n * S) * sizeof(int32_t), "shard");
  b->mask = ds_malloc((size_t)(n * S), "shard");
  if (!b->len || !b->ids || !b->mask) return DS_ERR_NOMEM;
  if (m->features) {
    b->ctx = ds_malloc((size_t)(n * S * md) * es, "shard features");
    b->last = ds_malloc((size_t)(n * S * d) * es, "shard features");
    if (!b->ctx || !b->last) return DS_ERR_NOMEM;
    if (m->dtype == DS_I8) {
      b->ctx_scale = ds_malloc((size_t)(n * S * m->n_layers) * sizeof(float), "shard feature scales");
      b->last_scale = ds_malloc((size_t)(n * S) * sizeof(float), "shard feature scales");
      if (!b->ctx_scale || !b->last_scale) return DS_ERR_NOMEM;
    }
  }
  if (K) {
    b->kid = ds_malloc((size_t)(n * S * K) * sizeof(int32_t), "shard KD ids");
    b->klp = ds_malloc((size_t)(n * S * K) * les, "shard KD log-probs");
    if (!b->kid || !b->klp) return DS_ERR_NOMEM;
  }
  return DS_OK;
}

void ds_shard_buf_free(ds_shard_buf *b) {
  free(b->len);
  free(b->ids);
  free(b->mask);
  free(b->ctx);
  free(b->last);
  free(b->ctx_scale);
  free(b->last_scale);
  free(b->kid);
  free(b->klp);
  memset(b, 0, sizeof *b);
}

ds_status ds_shard_store(ds_shard_buf *b, const ds_cache_manifest *m, int64_t j, int64_t len, const int32_t *ids,
                         const uint8_t *mask, const float *ctx, const float *last, const int32_t *kd_ids,
                         const float *kd_lp) {
  int64_t S = m->seq_length, d = m->hidden_size, nl = m->n_layers, md = d * nl, K = m->kd_topk;
  int64_t es = (int64_t)ds_dtype_size(m->dtype);
  b->len[j] = len;
  memcpy(b->ids + j * S, ids, (size_t)S * sizeof(int32_t));
  memcpy(b->mask + j * S, mask, (size_t)S);
  if (m->features) {
    unsigned char *dc = b->ctx + j * S * md * es, *dl = b->last + j * S * d * es;
    if (m->dtype == DS_I8) { /* one scale per position and captured layer */
      float *sc = b->ctx_scale + j * S * nl, *sl = b->last_scale + j * S;
      ds_cache_quantize_i8((int8_t *)dc, sc, ctx, len * nl, d);
      ds_cache_quantize_i8((int8_t *)dl, sl, last, len, d);
      memset(sc + len * nl, 0, (size_t)((S - len) * nl) * sizeof(float));
      memset(sl + len, 0, (size_t)(S - len) * sizeof(float));
    } else {
      DS_TRY(ds_convert_from_f32(dc, m->dtype, ctx, (size_t)(len * md)));
      DS_TRY(ds_convert_from_f32(dl, m->dtype, last, (size_t)(len * d)));
    }
    memset(dc + len * md * es, 0, (size_t)((S - len) * md * es));
    memset(dl + len * d * es, 0, (size_t)((S - len) * d * es));
  }
  if (K) {
    ds_dtype ldt = ds_cache_logprob_dtype(m->dtype);
    int64_t les = (int64_t)ds_dtype_size(ldt);
    int32_t *ki = b->kid + j * S * K;
    unsigned char *kl = b->klp + j * S * K * les, ninf[4];
    float minus_inf = -INFINITY;
    memcpy(ki, kd_ids, (size_t)(len * K) * sizeof(int32_t));
    DS_TRY(ds_convert_from_f32(kl, ldt, kd_lp, (size_t)(len * K)));
    DS_TRY(ds_convert_from_f32(ninf, ldt, &minus_inf, 1));
    for (int64_t t = len * K; t < S * K; t++) {
      ki[t] = -1;
      memcpy(kl + t * les, ninf, (size_t)les);
    }
  }
  return DS_OK;
}

/* The shard's tensors, in file order, borrowed from b (rows [0, n)). */
static ds_status shard_writer(const ds_shard_buf *b, const ds_cache_manifest *m, int64_t n, ds_st_writer **out) {
  int64_t S = m->seq_length, d = m->hidden_size, md = d * m->n_layers, K = m->kd_topk;
  int64_t s1[1] = {n}, s2[2] = {n, S}, sf[3] = {n, S, md}, sl[3] = {n, S, d}, sk[3] = {n, S, K};
  int64_t scf[3] = {n, S, m->n_layers};
  int i8 = m->dtype == DS_I8;
  ds_st_writer *w = ds_st_writer_new();
  ds_status st = w ? DS_OK : DS_ERR_NOMEM;
  if (st == DS_OK) st = ds_st_writer_set_metadata(w, "format", "dspark-cache-shard");
  if (st == DS_OK) st = ds_st_writer_set_metadata(w, "format_version", "1");
  if (st == DS_OK) st = ds_st_writer_add(w, "lengths", DS_I64, 1, s1, b->len);
  if (st == DS_OK) st = ds_st_writer_add(w, "input_ids", DS_I32, 2, s2, b->ids);
  if (st == DS_OK) st = ds_st_writer_add(w, "loss_mask", DS_U8, 2, s2, b->mask);
  if (st == DS_OK && m->features) st = ds_st_writer_add(w, "target_hidden_states", m->dtype, 3, sf, b->ctx);
  if (st == DS_OK && m->features && i8)
    st = ds_st_writer_add(w, "target_hidden_states_scale", DS_F32, 3, scf, b->ctx_scale);
  if (st == DS_OK && m->features) st = ds_st_writer_add(w, "target_last_hidden_states", m->dtype, 3, sl, b->last);
  if (st == DS_OK && m->features && i8)
    st = ds_st_writer_add(w, "target_last_hidden_states_scale", DS_F32, 2, s2, b->last_scale);
  if (st == DS_OK && K) st = ds_st_writer_add(w, "topk_ids", DS_I32, 3, sk, b->kid);
  if (st == DS_OK && K)
    st = ds_st_writer_add(w, "topk_logprobs", ds_cache_logprob_dtype(m->dtype), 3, sk, b->klp);
  if (st != DS_OK) {
    ds_st_writer_free(w);
    return st;
  }
  *out = w;
  return DS_OK;
}

ds_status ds_shard_write(const ds_shard_buf *b, const ds_cache_manifest *m, int64_t n, const char *path,
                         uint64_t *hash, int64_t *bytes) {
  ds_st_writer *w = NULL;
  ds_status st = shard_writer(b, m, n, &w);
  if (st == DS_OK) st = ds_st_writer_write(w, path);
  if (st == DS_OK) st = ds_cache_hash_file(path, hash);
  struct stat sb;
  if (st == DS_OK) *bytes = stat(path, &sb) == 0 ? (int64_t)sb.st_size : 0;
  ds_st_writer_free(w);
  return st;
}

ds_status ds_cache_shard_file_bytes(const ds_cache_manifest *m, int64_t n_samples, int64_t *bytes) {
  /* Sizes only: the writer is never written, so every tensor may borrow the same dummy byte. */
  static int64_t never_read;
  void *p = &never_read;
  ds_shard_buf b = {p, p, p, p, p, p, p, p, p};
  ds_st_writer *w = NULL;
  DS_TRY(shard_writer(&b, m, n_samples, &w));
  uint64_t size = 0;
  ds_status st = ds_st_writer_file_size(w, &size);
  ds_st_writer_free(w);
  *bytes = (int64_t)size;
  return st;
}
