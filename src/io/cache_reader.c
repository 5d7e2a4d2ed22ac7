/* Cache reader: the manifest checked against the run, every shard's header and shapes checked
 * against the manifest at open, tokens validated, checksums verified on a shard's first
 * feature read, samples converted to fp32 from read-only mappings. See include/dspark/cache.h. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include "dspark/cache.h"
#include "dspark/dtype.h"
#include "dspark/fileio.h"
#include "dspark/safetensors.h"

enum { MAX_OPEN_SHARDS = 16 };

struct ds_cache {
  char *dir;
  char *manifest_path;
  ds_cache_manifest m;
  int64_t S, d, md, K, n_samples; /* n_samples: in the listed shards */
  ds_dataset tokens;               /* moved out by ds_cache_take_tokens */
  int tokens_taken;
  int64_t *lengths;                /* [n_samples] own copy */
  ds_safetensors **shard;          /* [n_shards], NULL while closed */
  int64_t *last_use;               /* [n_shards] LRU clock */
  uint8_t *verified;               /* [n_shards] */
  int n_open;
  int64_t clock;
};

const ds_cache_manifest *ds_cache_get_manifest(const ds_cache *c) { return &c->m; }
const char *ds_cache_path(const ds_cache *c) { return c->dir; }
int64_t ds_cache_sample_length(const ds_cache *c, int64_t idx) { return c->lengths[idx]; }

/* ---------------------------------------------------------------- shard checks */

static void shape_text(const int64_t *shape, int ndim, char *buf, size_t cap) {
  size_t at = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < ndim && at < cap; i++)
    at += (size_t)snprintf(buf + at, cap - at, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (at < cap) snprintf(buf + at, cap - at, "]");
}

static ds_status expect_tensor(const ds_safetensors *st, const char *name, ds_dtype dt, int ndim,
                               const int64_t *shape, const char *why) {
  const ds_tensor_view *v = ds_st_find(st, name);
  if (!v)
    return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' is missing (%s)", ds_st_path(st), name, why);
  int same = v->dtype == dt && v->ndim == ndim;
  for (int i = 0; same && i < ndim; i++) same = v->shape[i] == shape[i];
  if (!same) {
    char a[128], b[128];
    shape_text(v->shape, v->ndim, a, sizeof a);
    shape_text(shape, ndim, b, sizeof b);
    return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' is %s %s but the manifest says %s %s", ds_st_path(st), name,
                   ds_dtype_name(v->dtype), a, ds_dtype_name(dt), b);
  }
  return DS_OK;
}

static ds_status check_shard(const ds_cache_manifest *m, const ds_safetensors *st, int64_t n) {
  int64_t S = m->seq_length, d = m->hidden_size, md = d * m->n_layers, K = m->kd_topk;
  int64_t s1[1] = {n}, s2[2] = {n, S}, sf[3] = {n, S, md}, sl[3] = {n, S, d}, sk[3] = {n, S, K};
  size_t want = 3;
  DS_TRY(expect_tensor(st, "lengths", DS_I64, 1, s1, "every shard has it"));
  DS_TRY(expect_tensor(st, "input_ids", DS_I32, 2, s2, "every shard has it"));
  DS_TRY(expect_tensor(st, "loss_mask", DS_U8, 2, s2, "every shard has it"));
  if (m->features) {
    DS_TRY(expect_tensor(st, "target_hidden_states", m->dtype, 3, sf, "the manifest says features: true"));
    DS_TRY(expect_tensor(st, "target_last_hidden_states", m->dtype, 3, sl, "the manifest says features: true"));
    want += 2;
    if (m->dtype == DS_I8) {
      int64_t sc[3] = {n, S, m->n_layers};
      DS_TRY(expect_tensor(st, "target_hidden_states_scale", DS_F32, 3, sc, "the manifest says dtype int8"));
      DS_TRY(expect_tensor(st, "target_last_hidden_states_scale", DS_F32, 2, s2, "the manifest says dtype int8"));
      want += 2;
    }
  }
  if (K) {
    DS_TRY(expect_tensor(st, "topk_ids", DS_I32, 3, sk, "the manifest has kd"));
    DS_TRY(expect_tensor(st, "topk_logprobs", ds_cache_logprob_dtype(m->dtype), 3, sk, "the manifest has kd"));
    want += 2;
  }
  if (ds_st_count(st) != want)
    return DS_FAIL(DS_ERR_FORMAT, "%s: %zu tensors, but the manifest describes %zu", ds_st_path(st), ds_st_count(st),
                   want);
  return DS_OK;
}

/* Copies and validates the token tensors of shard i into the sample table at `first`. */
static ds_status read_tokens(ds_cache *c, const ds_safetensors *st, int64_t first, int64_t n) {
  const ds_cache_manifest *m = &c->m;
  int64_t S = c->S;
  const ds_tensor_view *L = ds_st_find(st, "lengths"), *I = ds_st_find(st, "input_ids"), *M = ds_st_find(st, "loss_mask");
  memcpy(c->tokens.lengths + first, L->data, (size_t)n * sizeof(int64_t));
  memcpy(c->tokens.ids + first * S, I->data, (size_t)(n * S) * sizeof(int32_t));
  memcpy(c->tokens.loss_mask + first * S, M->data, (size_t)(n * S));
  for (int64_t s = 0; s < n; s++) {
    int64_t len = c->tokens.lengths[first + s];
    const int32_t *ids = c->tokens.ids + (first + s) * S;
    const uint8_t *mask = c->tokens.loss_mask + (first + s) * S;
    if (len < m->min_length || len > S)
      return DS_FAIL(DS_ERR_FORMAT, "%s: lengths[%lld] = %lld is outside [min_length %lld, seq_length %lld]",
                     ds_st_path(st), (long long)s, (long long)len, (long long)m->min_length, (long long)S);
    for (int64_t t = 0; t < S; t++) {
      int pad = t >= len;
      if (pad ? ids[t] != 0 : (ids[t] < 0 || ids[t] >= m->vocab_size))
        return DS_FAIL(DS_ERR_FORMAT, "%s: input_ids[%lld, %lld] = %d %s", ds_st_path(st), (long long)s, (long long)t,
                       ids[t], pad ? "at padding (must be 0)" : "outside the vocabulary");
      if (mask[t] > 1 || (pad && mask[t]))
        return DS_FAIL(DS_ERR_FORMAT, "%s: loss_mask[%lld, %lld] = %u (must be 0 or 1, and 0 at padding)",
                       ds_st_path(st), (long long)s, (long long)t, mask[t]);
    }
  }
  return DS_OK;
}

/* ---------------------------------------------------------------- open / close */

static ds_status shard_path(const ds_cache *c, int64_t i, char **out) {
  *out = ds_path_join(c->dir, c->m.shards[i].file);
  return *out ? DS_OK : DS_ERR_NOMEM;
}

/* The cache's copy of one of the target's files (target_config.json, tokenizer.json) against
 * its hash in the manifest, streamed (tokenizer.json may be large). */
static ds_status check_copy(const ds_cache *c, const char *name, uint64_t want, const char *field) {
  char *path = ds_path_join(c->dir, name);
  if (!path) return DS_ERR_NOMEM;
  uint64_t have = 0;
  ds_status st = ds_cache_hash_file(path, &have);
  if (st != DS_OK) {
    ds_error_wrap(st, "the cache's copy of the target's %s cannot be read (rerun the same `dspark capture` command "
                  "to restore it)", name);
  } else if (have != want) {
    char a[17], b[17];
    ds_cache_hex(have, a);
    ds_cache_hex(want, b);
    st = DS_FAIL(DS_ERR_FORMAT, "%s: checksum mismatch: xxh64 is %s but the manifest's '%s' is %s: the cache's copy of "
                 "the target's file was changed (rerun the same `dspark capture` command to restore it)", path, a,
                 field, b);
  }
  free(path);
  return st;
}

static ds_status open_all(ds_cache *c, const ds_cache_expect *e) {
  char *text;
  size_t len;
  c->manifest_path = ds_path_join(c->dir, "manifest.json");
  if (!c->manifest_path) return DS_ERR_NOMEM;
  ds_status st = ds_read_file(c->manifest_path, &text, &len);
  if (st != DS_OK)
    return ds_error_wrap(st, "%s is not a readable dspark cache (no manifest.json; was the capture ever started?)",
                         c->dir);
  st = ds_cache_manifest_parse(text, len, c->manifest_path, &c->m);
  free(text);
  if (st != DS_OK) return st;
  DS_TRY(ds_cache_manifest_check(&c->m, e, c->manifest_path));
  const ds_cache_manifest *m = &c->m;
  if (m->complete) { /* the copies are written before the shards: a complete cache has them */
    DS_TRY(check_copy(c, "target_config.json", m->target_config_xxh64, "target_config_xxh64"));
    DS_TRY(check_copy(c, "tokenizer.json", m->tokenizer_xxh64, "tokenizer_xxh64"));
  }
  c->S = m->seq_length;
  c->d = m->hidden_size;
  c->md = c->d * m->n_layers;
  c->K = m->kd_topk;
  for (int64_t i = 0; i < m->n_shards; i++) c->n_samples += m->shards[i].num_samples;
  int64_t n = c->n_samples, S = c->S, nsh = m->n_shards;
  c->tokens.ids = ds_malloc((size_t)(n * S) * sizeof(int32_t) + 1, "cache tokens");
  c->tokens.loss_mask = ds_malloc((size_t)(n * S) + 1, "cache tokens");
  c->tokens.lengths = ds_malloc((size_t)n * sizeof(int64_t) + 1, "cache tokens");
  c->shard = ds_calloc((size_t)nsh + 1, sizeof *c->shard, "cache shards");
  c->last_use = ds_calloc((size_t)nsh + 1, sizeof *c->last_use, "cache shards");
  c->verified = ds_calloc((size_t)nsh + 1, 1, "cache shards");
  if (!c->tokens.ids || !c->tokens.loss_mask || !c->tokens.lengths || !c->shard || !c->last_use || !c->verified)
    return DS_ERR_NOMEM;
  c->tokens.n_seqs = n;
  c->tokens.seq_len = S;
  c->tokens.source_hash = m->data_xxh64;
  int64_t first = 0, tokens = 0;
  for (int64_t i = 0; i < nsh; i++) {
    char *path;
    DS_TRY(shard_path(c, i, &path));
    ds_safetensors *sf;
    st = ds_st_open(path, &sf);
    free(path);
    if (st != DS_OK) return st;
    st = check_shard(m, sf, m->shards[i].num_samples);
    if (st == DS_OK) st = read_tokens(c, sf, first, m->shards[i].num_samples);
    ds_st_close(sf);
    if (st != DS_OK) return st;
    first += m->shards[i].num_samples;
  }
  for (int64_t s = 0; s < n; s++) tokens += c->tokens.lengths[s];
  c->lengths = ds_malloc((size_t)n * sizeof(int64_t) + 1, "cache lengths");
  if (!c->lengths) return DS_ERR_NOMEM;
  memcpy(c->lengths, c->tokens.lengths, (size_t)n * sizeof(int64_t));
  if (m->complete && tokens != m->num_tokens)
    return DS_FAIL(DS_ERR_FORMAT, "%s: the shards hold %lld tokens but num_tokens is %lld", c->manifest_path,
                   (long long)tokens, (long long)m->num_tokens);
  return DS_OK;
}

ds_status ds_cache_open(const char *dir, const ds_cache_expect *e, ds_cache **out) {
  *out = NULL;
  ds_cache *c = ds_calloc(1, sizeof *c, "cache");
  if (!c) return DS_ERR_NOMEM;
  c->dir = ds_malloc(strlen(dir) + 1, "cache path");
  if (!c->dir) { free(c); return DS_ERR_NOMEM; }
  strcpy(c->dir, dir);
  ds_status st = open_all(c, e);
  if (st != DS_OK) {
    ds_cache_close(c);
    return st;
  }
  *out = c;
  return DS_OK;
}

void ds_cache_close(ds_cache *c) {
  if (!c) return;
  for (int64_t i = 0; c->shard && i < c->m.n_shards; i++) ds_st_close(c->shard[i]);
  free(c->shard);
  free(c->last_use);
  free(c->verified);
  free(c->lengths);
  if (!c->tokens_taken) ds_dataset_free(&c->tokens);
  ds_cache_manifest_free(&c->m);
  free(c->manifest_path);
  free(c->dir);
  free(c);
}

ds_status ds_cache_take_tokens(ds_cache *c, ds_dataset *out) {
  if (c->tokens_taken) return DS_FAIL(DS_ERR_ARG, "%s: the tokens were already taken", c->dir);
  *out = c->tokens;
  c->tokens_taken = 1;
  return DS_OK;
}

/* ---------------------------------------------------------------- side files */

static ds_status read_checked(const ds_cache *c, const char *name, uint64_t want, const char *field, char **text,
                              size_t *len) {
  char *path = ds_path_join(c->dir, name);
  if (!path) return DS_ERR_NOMEM;
  ds_status st = ds_read_file(path, text, len);
  if (st == DS_OK && XXH64(*text, *len, 0) != want) {
    char a[17], b[17];
    ds_cache_hex(XXH64(*text, *len, 0), a);
    ds_cache_hex(want, b);
    st = DS_FAIL(DS_ERR_FORMAT, "%s: xxh64 is %s but the manifest's '%s' is %s (the file was changed)", path, a, field, b);
    free(*text);
    *text = NULL;
  }
  free(path);
  return st;
}

ds_status ds_cache_read_target_config(const ds_cache *c, char **text, size_t *len) {
  return read_checked(c, "target_config.json", c->m.target_config_xxh64, "target_config_xxh64", text, len);
}

ds_status ds_cache_read_tokenizer(const ds_cache *c, char **text, size_t *len) {
  return read_checked(c, "tokenizer.json", c->m.tokenizer_xxh64, "tokenizer_xxh64", text, len);
}

static ds_status verify_weights_file(const ds_cache *c, const char *path) {
  uint64_t h;
  DS_TRY(ds_cache_hash_file(path, &h));
  if (h != c->m.target_weights_file_xxh64) {
    char a[17], b[17];
    ds_cache_hex(h, a);
    ds_cache_hex(c->m.target_weights_file_xxh64, b);
    return DS_FAIL(DS_ERR_FORMAT, "%s: checksum mismatch: xxh64 is %s but the manifest's 'target_weights_file_xxh64' is %s",
                   path, a, b);
  }
  return DS_OK;
}

/* One frozen table [V, d]: F32 / BF16 / F16 as stored, copied to aligned memory, finite. */
static ds_status load_table(const ds_safetensors *st, const char *name, const int64_t *shape, const char *why,
                            ds_weight *out) {
  const ds_tensor_view *v = ds_st_find(st, name);
  ds_dtype dt = v && (v->dtype == DS_BF16 || v->dtype == DS_F16) ? v->dtype : DS_F32;
  DS_TRY(expect_tensor(st, name, dt, 2, shape, why));
  void *data = ds_malloc_aligned(v->nbytes, why);
  if (!data) return DS_ERR_NOMEM;
  memcpy(data, v->data, v->nbytes);
  for (int64_t k = 0; k < v->numel; k++) {
    float x;
    if (dt == DS_F32) memcpy(&x, (const char *)data + 4 * k, 4);
    else x = dt == DS_BF16 ? ds_bf16_to_f32(((const uint16_t *)data)[k]) : ds_f16_to_f32(((const uint16_t *)data)[k]);
    if (!isfinite(x)) {
      ds_free_aligned(data);
      return DS_FAIL(DS_ERR_NUMERIC, "%s: tensor '%s' holds %g at element %lld (%s)", ds_st_path(st), name, (double)x,
                     (long long)k, why);
    }
  }
  *out = (ds_weight){data, dt};
  return DS_OK;
}

ds_status ds_cache_load_target_weights(const ds_cache *c, ds_weight *embed, ds_weight *lm_head) {
  *embed = *lm_head = (ds_weight){NULL, DS_F32};
  char *path = ds_path_join(c->dir, "target_weights.safetensors");
  if (!path) return DS_ERR_NOMEM;
  ds_safetensors *st = NULL;
  ds_status s = verify_weights_file(c, path);
  if (s == DS_OK) s = ds_st_open(path, &st);
  free(path);
  if (s != DS_OK) return s;
  int64_t shape[2] = {c->m.vocab_size, c->d};
  s = load_table(st, "embed_tokens.weight", shape, "the frozen embedding", embed);
  if (s == DS_OK) s = load_table(st, "lm_head.weight", shape, "the frozen lm_head", lm_head);
  ds_st_close(st);
  if (s != DS_OK) {
    ds_free_aligned((void *)embed->data);
    ds_free_aligned((void *)lm_head->data);
    *embed = *lm_head = (ds_weight){NULL, DS_F32};
  }
  return s;
}

/* ---------------------------------------------------------------- shards */

ds_status ds_cache_verify_shard(ds_cache *c, int64_t i) {
  if (c->verified[i]) return DS_OK;
  char *path;
  DS_TRY(shard_path(c, i, &path));
  uint64_t h = 0;
  ds_status st = ds_cache_hash_file(path, &h);
  if (st == DS_OK && h != c->m.shards[i].xxh64) {
    char a[17], b[17];
    ds_cache_hex(h, a);
    ds_cache_hex(c->m.shards[i].xxh64, b);
    st = DS_FAIL(DS_ERR_FORMAT,
                 "%s: checksum mismatch: xxh64 is %s but the manifest records %s (the shard is corrupt; rerunning the "
                 "`dspark capture` command rewrites it and every later shard)",
                 path, a, b);
  }
  free(path);
  if (st == DS_OK) c->verified[i] = 1;
  return st;
}

ds_status ds_cache_verify_all(ds_cache *c) {
  for (int64_t i = 0; i < c->m.n_shards; i++) DS_TRY(ds_cache_verify_shard(c, i));
  char *path = ds_path_join(c->dir, "target_weights.safetensors"), *text = NULL;
  if (!path) return DS_ERR_NOMEM;
  ds_status st = verify_weights_file(c, path);
  free(path);
  size_t len;
  if (st == DS_OK) st = ds_cache_read_target_config(c, &text, &len);
  free(text);
  text = NULL;
  if (st == DS_OK) st = ds_cache_read_tokenizer(c, &text, &len);
  free(text);
  return st;
}

static ds_status get_shard(ds_cache *c, int64_t i, ds_safetensors **out) {
  c->last_use[i] = ++c->clock;
  if (!c->shard[i]) {
    if (c->n_open >= MAX_OPEN_SHARDS) { /* close the least recently used */
      int64_t lru = -1;
      for (int64_t k = 0; k < c->m.n_shards; k++)
        if (c->shard[k] && (lru < 0 || c->last_use[k] < c->last_use[lru])) lru = k;
      ds_st_close(c->shard[lru]);
      c->shard[lru] = NULL;
      c->n_open--;
    }
    char *path;
    DS_TRY(shard_path(c, i, &path));
    ds_status st = ds_st_open(path, &c->shard[i]);
    free(path);
    if (st == DS_OK) st = check_shard(&c->m, c->shard[i], c->m.shards[i].num_samples);
    if (st != DS_OK) {
      ds_st_close(c->shard[i]);
      c->shard[i] = NULL;
      return st;
    }
    c->n_open++;
  }
  *out = c->shard[i];
  return DS_OK;
}

/* Drops the mapped pages of a range once converted: they stay in the page cache, but the
 * process's resident memory stays bounded by the prefetch ring. */
static void drop_pages(const void *p, size_t n) {
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p, b = a + n;
  a = (a + page - 1) / page * page;
  b = b / page * page;
  if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

static ds_status convert_rows(float *dst, const ds_tensor_view *v, int64_t offset, int64_t count) {
  size_t es = ds_dtype_size(v->dtype);
  const unsigned char *src = (const unsigned char *)v->data + (size_t)offset * es;
  if (v->dtype == DS_BF16) { /* exact: bf16 is the top half of an fp32 */
    for (int64_t i = 0; i < count; i++) {
      uint16_t h;
      memcpy(&h, src + 2 * i, 2);
      uint32_t u = (uint32_t)h << 16;
      memcpy(dst + i, &u, 4);
    }
  } else {
    DS_TRY(ds_convert_to_f32(dst, src, v->dtype, (size_t)count));
  }
  drop_pages(src, (size_t)count * es);
  return DS_OK;
}

/* int8 features (cache.h "int8 features"): rows [first, first + rows) of `tensor` [.., cols]
 * with their scales from `tensor`_scale, dequantized to fp32. A scale that is negative or not
 * finite is refused by position (and layer, for target_hidden_states). */
static ds_status dequantize_rows(const ds_cache *c, const ds_safetensors *st, const char *tensor, int64_t si,
                                 int64_t row, float *dst, int64_t first, int64_t rows, int64_t cols) {
  char scale_name[64];
  snprintf(scale_name, sizeof scale_name, "%s_scale", tensor);
  const ds_tensor_view *q = ds_st_find(st, tensor), *sv = ds_st_find(st, scale_name);
  const int8_t *qs = (const int8_t *)q->data + first * cols;
  const unsigned char *sb = (const unsigned char *)sv->data + (size_t)first * 4;
  int64_t groups = !strcmp(tensor, "target_hidden_states") ? c->m.n_layers : 1;
  for (int64_t r = 0; r < rows; r++) {
    float s;
    memcpy(&s, sb + 4 * r, 4); /* the mapping gives 8-byte alignment to the tensor, not to a row */
    if (!(s >= 0.0f) || isinf(s)) {
      char layer[64] = "";
      if (groups > 1) snprintf(layer, sizeof layer, ", captured layer %d", c->m.target_layer_ids[r % groups]);
      return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' holds the scale %g at row %lld of shard %lld, position %lld%s "
                     "(a scale must be finite and >= 0)", ds_st_path(st), scale_name, (double)s, (long long)row,
                     (long long)si, (long long)(r / groups), layer);
    }
    ds_cache_dequantize_i8(dst + r * cols, qs + r * cols, &s, 1, cols);
  }
  drop_pages(qs, (size_t)(rows * cols));
  drop_pages(sb, (size_t)rows * 4);
  return DS_OK;
}

/* Index of the first NaN or infinite value of x[0..n) (-inf allowed when allow_neg_inf), or -1.
 * A branch-free scan first (it vectorizes), the search only when it found one. */
static int64_t first_nonfinite(const float *x, int64_t n, int allow_neg_inf) {
  uint32_t any = 0, neg_ok = allow_neg_inf ? 1u : 0u;
  for (int64_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, x + i, 4);
    any |= (uint32_t)((u & 0x7f800000u) == 0x7f800000u) & ~(neg_ok & (uint32_t)(u == 0xff800000u));
  }
  if (!any) return -1;
  for (int64_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, x + i, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && !(allow_neg_inf && u == 0xff800000u)) return i;
  }
  return -1;
}

/* Converted rows of sample idx (row `row` of shard si) must be finite: a NaN that reached the
 * cache is named where it is, not later as "draft logits hold NaN". cols: values per position. */
static ds_status check_finite(const ds_cache *c, const ds_safetensors *st, const char *tensor, int64_t idx, int64_t si,
                              int64_t row, const float *x, int64_t len, int64_t cols, int allow_neg_inf) {
  int64_t bad = first_nonfinite(x, len * cols, allow_neg_inf);
  if (bad < 0) return DS_OK;
  int64_t t = bad / cols, j = bad % cols;
  const char *what = x[bad] != x[bad] ? "NaN" : x[bad] > 0 ? "+inf" : "-inf";
  char layer[64] = "";
  if (!strcmp(tensor, "target_hidden_states"))
    snprintf(layer, sizeof layer, ", captured layer %d", c->m.target_layer_ids[j / c->d]);
  return DS_FAIL(DS_ERR_NUMERIC, "%s: tensor '%s' holds %s at [%lld, %lld, %lld] (sample %lld of the cache, row %lld "
                 "of shard %lld, position %lld, value %lld%s): the target produced a non-finite value when this cache "
                 "was captured", ds_st_path(st), tensor, what, (long long)row, (long long)t, (long long)j,
                 (long long)idx, (long long)row, (long long)si, (long long)t, (long long)j, layer);
}

ds_status ds_cache_read_sample(ds_cache *c, int64_t idx, float *ctx, float *last, int32_t *topk_ids,
                               float *topk_logprobs) {
  if (idx < 0 || idx >= c->n_samples)
    return DS_FAIL(DS_ERR_RANGE, "%s: sample %lld outside [0, %lld)", c->dir, (long long)idx, (long long)c->n_samples);
  int64_t si = idx / c->m.shard_size, row = idx % c->m.shard_size, S = c->S, len = c->lengths[idx];
  ds_safetensors *st;
  DS_TRY(get_shard(c, si, &st));
  DS_TRY(ds_cache_verify_shard(c, si));
  if ((ctx || last) && !c->m.features)
    return DS_FAIL(DS_ERR_ARG, "%s: the cache holds no DSpark features (captured with --no-features)", c->dir);
  if ((topk_ids || topk_logprobs) && !c->K)
    return DS_FAIL(DS_ERR_ARG, "%s: the cache holds no KD data (captured without --topk)", c->dir);
  int i8 = c->m.dtype == DS_I8, nl = c->m.n_layers;
  if (ctx) {
    if (i8) DS_TRY(dequantize_rows(c, st, "target_hidden_states", si, row, ctx, row * S * nl, len * nl, c->d));
    else DS_TRY(convert_rows(ctx, ds_st_find(st, "target_hidden_states"), row * S * c->md, len * c->md));
    DS_TRY(check_finite(c, st, "target_hidden_states", idx, si, row, ctx, len, c->md, 0));
  }
  if (last) {
    if (i8) DS_TRY(dequantize_rows(c, st, "target_last_hidden_states", si, row, last, row * S, len, c->d));
    else DS_TRY(convert_rows(last, ds_st_find(st, "target_last_hidden_states"), row * S * c->d, len * c->d));
    DS_TRY(check_finite(c, st, "target_last_hidden_states", idx, si, row, last, len, c->d, 0));
  }
  if (topk_ids) {
    const ds_tensor_view *v = ds_st_find(st, "topk_ids");
    const unsigned char *src = (const unsigned char *)v->data + (size_t)(row * S * c->K) * 4;
    memcpy(topk_ids, src, (size_t)(len * c->K) * 4);
    drop_pages(src, (size_t)(len * c->K) * 4);
  }
  if (topk_logprobs) { /* -inf is the log-prob of a dropped entry */
    DS_TRY(convert_rows(topk_logprobs, ds_st_find(st, "topk_logprobs"), row * S * c->K, len * c->K));
    DS_TRY(check_finite(c, st, "topk_logprobs", idx, si, row, topk_logprobs, len, c->K, 1));
  }
  return DS_OK;
}
