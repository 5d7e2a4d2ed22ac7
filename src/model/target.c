/* The target's forward and KV cache (include/dspark/target.h); loading is target_load.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/target_internal.h"

/* ---------------------------------------------------------------- KV cache */

/* Set by ds_set_kv_cache_dtype (--kv-cache); unset, each target picks (ds_kv_cache_dtype). */
static ds_dtype g_kv_dtype = DS_F32;
static int g_kv_set = 0;

ds_status ds_set_kv_cache_dtype(ds_dtype dt) {
  if (dt != DS_F32 && dt != DS_F16)
    return DS_FAIL(DS_ERR_ARG, "a KV cache holds f32 or f16 values, not %s", ds_dtype_name(dt));
  g_kv_dtype = dt;
  g_kv_set = 1;
  return DS_OK;
}

void ds_unset_kv_cache_dtype(void) { g_kv_set = 0, g_kv_dtype = DS_F32; }

static int backend_has_f16_cache(const ds_target *m) {
  return m->be->attention_causal_f16 && m->be->copy_rows_f16;
}

ds_dtype ds_kv_cache_dtype(const ds_target *m) {
  if (g_kv_set) return g_kv_dtype;
  /* a GGUF's matrices held quantized as stored: their cache in f16, as llama.cpp holds it (the
   * rounding, 8e-4 of SmolLM2's logits, is far below the weights' own 2-3e-2 from fp32) */
  return m && m->n_quant_mapped > 0 && backend_has_f16_cache(m) ? DS_F16 : DS_F32;
}

ds_status ds_kv_cache_new(const ds_target *m, int64_t capacity, ds_kv_cache **out) {
  return ds_kv_cache_new_typed(m, capacity, ds_kv_cache_dtype(m), out);
}

ds_status ds_kv_cache_new_typed(const ds_target *m, int64_t capacity, ds_dtype dtype, ds_kv_cache **out) {
  *out = NULL;
  if (capacity <= 0) return DS_FAIL(DS_ERR_ARG, "KV cache capacity must be positive (got %lld)", (long long)capacity);
  if (dtype != DS_F32 && dtype != DS_F16)
    return DS_FAIL(DS_ERR_ARG, "a KV cache holds f32 or f16 values, not %s", ds_dtype_name(dtype));
  int f16 = dtype == DS_F16;
  if (f16 && !backend_has_f16_cache(m))
    return DS_FAIL(DS_ERR_UNSUPPORTED, "an f16 KV cache (--kv-cache f16) needs the cpu backend; the %s backend keeps "
                   "fp32 caches", m->be->name);
  ds_kv_cache *c = ds_calloc(1, sizeof *c, "KV cache");
  if (!c) return DS_ERR_NOMEM;
  c->be = m->be;
  c->cap = capacity;
  c->n_layers = m->cfg.num_hidden_layers;
  c->n_kv_heads = m->cfg.num_key_value_heads;
  c->head_dim = m->cfg.head_dim;
  size_t n = (size_t)c->n_layers * (size_t)c->n_kv_heads * (size_t)capacity * (size_t)c->head_dim;
  if (f16) {
    c->k16 = m->be->alloc(n * sizeof(uint16_t), "KV cache keys");
    c->v16 = m->be->alloc(n * sizeof(uint16_t), "KV cache values");
  } else {
    c->k = m->be->alloc(n * sizeof(float), "KV cache keys");
    c->v = m->be->alloc(n * sizeof(float), "KV cache values");
  }
  if (f16 ? !c->k16 || !c->v16 : !c->k || !c->v) {
    ds_kv_cache_free(c);
    return DS_ERR_NOMEM;
  }
  *out = c;
  return DS_OK;
}

void ds_kv_cache_free(ds_kv_cache *c) {
  if (!c) return;
  c->be->free(c->k);
  c->be->free(c->v);
  c->be->free(c->k16);
  c->be->free(c->v16);
  free(c);
}

int64_t ds_kv_cache_len(const ds_kv_cache *c) { return c->len; }
int64_t ds_kv_cache_capacity(const ds_kv_cache *c) { return c->cap; }

ds_status ds_kv_cache_crop(ds_kv_cache *c, int64_t len) {
  if (len < 0 || len > c->len)
    return DS_FAIL(DS_ERR_RANGE, "KV cache crop to %lld outside [0, %lld]", (long long)len, (long long)c->len);
  c->len = len; /* entries past len are simply overwritten by the next forward */
  return DS_OK;
}

/* ---------------------------------------------------------------- forward */

void target_workspace_free(const ds_backend *be, workspace *ws) {
  float *bufs[] = {ws->h, ws->x, ws->mix, ws->logits, ws->picked};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(bufs[i]);
  free(ws->pos);
  free(ws->stage);
  memset(ws, 0, sizeof *ws);
}

/* n floats rounded up to whole 64-byte lines: where the second view of `mix` starts */
static size_t lines(size_t n) { return (n + 15) / 16 * 16; }

static ds_status workspace_reserve(ds_target *m, int64_t rows) {
  workspace *ws = &m->ws;
  if (rows <= ws->rows) return DS_OK;
  const ds_backend *be = m->be;
  target_workspace_free(be, ws);
  const ds_model_config *c = &m->cfg;
  size_t R = (size_t)rows, d = (size_t)c->hidden_size, I = (size_t)c->intermediate_size;
  size_t attn_at = lines(R * (size_t)m->qkv_dim), act_at = lines(R * 2 * I);
  size_t mix = attn_at + R * (size_t)m->q_dim > act_at + R * I ? attn_at + R * (size_t)m->q_dim : act_at + R * I;
  ws->h = be->alloc(R * d * sizeof(float), "activations");
  ws->x = be->alloc(R * d * sizeof(float), "activations");
  ws->mix = be->alloc(mix * sizeof(float), "activations");
  ws->pos = ds_malloc(R * sizeof(int64_t), "positions");
  if (!ws->h || !ws->x || !ws->mix || !ws->pos) {
    target_workspace_free(be, ws);
    return DS_ERR_NOMEM;
  }
  ws->tmp = ws->x;
  ws->qkv = ws->mix, ws->attn = ws->mix + attn_at;
  ws->gu = ws->mix, ws->act = ws->mix + act_at;
  ws->rows = rows;
  return DS_OK;
}

/* *buf: backend memory for `rows` rows of `width` floats, grown (never shrunk) as forwards ask;
 * *have its rows. The logits of a device backend's forward, and the normed rows a forward of
 * several passes gathers for them. */
static ds_status rows_reserve(const ds_backend *be, float **buf, int64_t *have, int64_t rows, int64_t width,
                              const char *what) {
  if (rows <= *have) return DS_OK;
  be->free(*buf);
  *buf = be->alloc((size_t)rows * (size_t)width * sizeof(float), what);
  *have = *buf ? rows : 0;
  return *buf ? DS_OK : DS_ERR_NOMEM;
}

ds_status ds_target_check_capture_layers(const ds_target *m, const int32_t *ids, int n) {
  int64_t L = m->cfg.num_hidden_layers;
  for (int i = 0; i < n; i++) {
    if (ids[i] < -1 || ids[i] > L - 2)
      return DS_FAIL(DS_ERR_ARG,
                     "capture layer %d is outside [-1, %lld]: -1 is the embedding output, and the last "
                     "layer (%lld) is excluded because its HF output is already final-normed; use the "
                     "final hidden state instead", ids[i], (long long)(L - 2), (long long)(L - 1));
    if (i > 0 && ids[i] <= ids[i - 1])
      return DS_FAIL(DS_ERR_ARG, "capture layers must be strictly increasing (%d after %d)", ids[i], ids[i - 1]);
  }
  return DS_OK;
}

/* The caller's captured[] (host memory) gets h's rows when `layer` is captured; a device
 * backend's h comes through the host staging buffer. */
static ds_status capture_rows(ds_target *m, const ds_target_outputs *out, int64_t layer, const float *h, int64_t r0,
                              int64_t rows, int64_t d) {
  if (!out->captured) return DS_OK;
  for (int c = 0; c < out->n_capture; c++) {
    if (out->capture_layers[c] != layer) continue;
    if (m->be->device_memory) {
      if (!m->ws.stage && !(m->ws.stage = ds_malloc((size_t)m->ws.rows * (size_t)d * sizeof(float), "captured layer")))
        return DS_ERR_NOMEM;
      m->be->copy_to_host(m->ws.stage, h, (size_t)(rows * d) * sizeof(float));
      h = m->ws.stage;
    }
    int64_t stride = (int64_t)out->n_capture * d;
    for (int64_t r = 0; r < rows; r++)
      memcpy(out->captured + (r0 + r) * stride + c * d, h + r * d, (size_t)d * sizeof(float));
  }
  return DS_OK;
}

/* Stores this layer's new K/V rows (already roped) of every sequence in its cache: per
 * sequence and kv head, its n rows (stride qkv_dim in qkv) become n consecutive cache rows. */
static void append_kv(const ds_target *m, int64_t layer, const ds_target_seq *seqs, int n_seqs, const float *qkv) {
  const ds_model_config *c = &m->cfg;
  int64_t hd = c->head_dim, hkv = c->num_key_value_heads;
  int64_t row = 0;
  for (int s = 0; s < n_seqs; s++) {
    ds_kv_cache *kc = seqs[s].cache;
    size_t layer_off = (size_t)layer * (size_t)hkv * (size_t)kc->cap * (size_t)hd;
    const float *kr = qkv + row * m->qkv_dim + m->q_dim, *vr = kr + m->kv_dim;
    for (int64_t h = 0; h < hkv; h++) {
      size_t at = layer_off + ((size_t)h * (size_t)kc->cap + (size_t)kc->len) * (size_t)hd;
      if (kc->k16) {
        m->be->copy_rows_f16(kc->k16 + at, hd, kr + h * hd, m->qkv_dim, seqs[s].n, hd);
        m->be->copy_rows_f16(kc->v16 + at, hd, vr + h * hd, m->qkv_dim, seqs[s].n, hd);
      } else {
        m->be->copy_rows(kc->k + at, hd, kr + h * hd, m->qkv_dim, seqs[s].n, hd);
        m->be->copy_rows(kc->v + at, hd, vr + h * hd, m->qkv_dim, seqs[s].n, hd);
      }
    }
    row += seqs[s].n;
  }
}

/* y[rows, ldy], columns col .. col + heads hd of each row: from a llama GGUF's q / k order (in a
 * head, column 2i + j) to HF's (column j hd / 2 + i). Host memory: quantized weights run on the
 * host backends only. */
static void row_to_hf_order(float *y, int64_t heads, int64_t hd) {
  float pair[2048]; /* head_dim <= 2048, checked at load */
  int64_t half = hd / 2;
  for (int64_t h = 0; h < heads; h++) {
    float *v = y + h * hd;
    memcpy(pair, v, (size_t)hd * sizeof *v);
    for (int64_t i = 0; i < half; i++) v[i] = pair[2 * i], v[half + i] = pair[2 * i + 1];
  }
}

static void columns_to_hf_order(float *y, int64_t ldy, int64_t rows, int64_t col, int64_t heads, int64_t hd) {
  if (rows * heads * hd <= 65536) { /* outside any OpenMP region: an if(false) one costs a futex call */
    for (int64_t r = 0; r < rows; r++) row_to_hf_order(y + r * ldy + col, heads, hd);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; r++) row_to_hf_order(y + r * ldy + col, heads, hd);
}

/* y[rows, out] = x[rows, in] @ W^T (+ bias), W's row segments (q, k, v; gate, up) each writing
 * their columns of y (row stride out): one linear_w_cat, which the backend may run as one product. */
static void run_linear(const ds_target *m, float *y, const float *x, const target_linear *w, const float *bias,
                       int64_t rows, int64_t in) {
  int64_t out = 0;
  for (int s = 0; s < w->n_seg; s++) out += w->seg_rows[s];
  if (w->n_seg == 1) m->be->linear_w(y, out, x, w->seg[0], bias, rows, in, out);
  else m->be->linear_w_cat(y, out, x, w->seg, w->seg_rows, w->n_seg, bias, rows, in);
  for (int s = 0, col = 0; s < w->n_seg; col += (int)w->seg_rows[s++])
    if (w->seg_pair_heads[s])
      columns_to_hf_order(y, out, rows, col, w->seg_pair_heads[s], w->seg_rows[s] / w->seg_pair_heads[s]);
}

/* The sequences' attention in one backend call (batched decoding: their work spread over the
 * threads together, where a call a sequence made a parallel region each); 0 when the backend has
 * no such entry or the caches differ in type. */
static int attention_seqs(ds_target *m, int64_t layer, const ds_target_seq *seqs, int n_seqs, float scale) {
  const ds_model_config *c = &m->cfg;
  int f16 = seqs[0].cache->k16 != NULL;
  if (!m->be->attention_causal_seqs) return 0;
  for (int s = 1; s < n_seqs; s++)
    if ((seqs[s].cache->k16 != NULL) != f16) return 0;
  const void **kv = malloc((size_t)n_seqs * 2 * sizeof *kv);
  int64_t *len = malloc((size_t)n_seqs * 3 * sizeof *len);
  DS_CHECK(kv != NULL && len != NULL);
  for (int s = 0; s < n_seqs; s++) {
    const ds_kv_cache *kc = seqs[s].cache;
    size_t off = (size_t)layer * (size_t)kc->n_kv_heads * (size_t)kc->cap * (size_t)c->head_dim;
    kv[s] = f16 ? (const void *)(kc->k16 + off) : (const void *)(kc->k + off);
    kv[n_seqs + s] = f16 ? (const void *)(kc->v16 + off) : (const void *)(kc->v + off);
    len[s] = seqs[s].n, len[n_seqs + s] = kc->len, len[2 * n_seqs + s] = kc->cap;
  }
  m->be->attention_causal_seqs(m->ws.attn, m->ws.qkv, m->qkv_dim, kv, kv + n_seqs, f16, len, len + n_seqs,
                               len + 2 * n_seqs, n_seqs, c->num_attention_heads, c->num_key_value_heads, c->head_dim,
                               scale);
  free(kv), free(len);
  return 1;
}

static void attention_block(ds_target *m, int64_t layer, const ds_target_seq *seqs, int n_seqs, int64_t rows) {
  const ds_model_config *c = &m->cfg;
  const ds_backend *be = m->be;
  workspace *ws = &m->ws;
  int64_t d = c->hidden_size, hd = c->head_dim;
  const layer_weights *w = &m->layers[layer];

  be->rmsnorm(ws->x, NULL, ws->h, w->in_norm, rows, d, (float)c->rms_norm_eps);
  run_linear(m, ws->qkv, ws->x, &w->qkv, w->bqkv, rows, d);
  if (c->qk_norm) {
    be->rmsnorm_heads(ws->qkv, m->qkv_dim, w->q_norm, rows, c->num_attention_heads, hd, (float)c->rms_norm_eps);
    be->rmsnorm_heads(ws->qkv + m->q_dim, m->qkv_dim, w->k_norm, rows, c->num_key_value_heads, hd,
                      (float)c->rms_norm_eps);
  }
  be->rope(ws->qkv, m->qkv_dim, ws->pos, m->inv_freq, rows, c->num_attention_heads, hd);
  be->rope(ws->qkv + m->q_dim, m->qkv_dim, ws->pos, m->inv_freq, rows, c->num_key_value_heads, hd);
  append_kv(m, layer, seqs, n_seqs, ws->qkv);

  float scale = 1.0f / sqrtf((float)hd);
  int together = n_seqs > 1 && attention_seqs(m, layer, seqs, n_seqs, scale); /* else a call a sequence */
  int64_t row = 0;
  for (int s = 0; s < n_seqs && !together; s++) {
    const ds_kv_cache *kc = seqs[s].cache;
    size_t layer_off = (size_t)layer * (size_t)kc->n_kv_heads * (size_t)kc->cap * (size_t)hd;
    if (kc->k16)
      be->attention_causal_f16(ws->attn + row * m->q_dim, ws->qkv + row * m->qkv_dim, m->qkv_dim, kc->k16 + layer_off,
                               kc->v16 + layer_off, seqs[s].n, kc->len, kc->cap, c->num_attention_heads,
                               c->num_key_value_heads, hd, scale);
    else
      be->attention_causal(ws->attn + row * m->q_dim, ws->qkv + row * m->qkv_dim, m->qkv_dim, kc->k + layer_off,
                           kc->v + layer_off, seqs[s].n, kc->len, kc->cap, c->num_attention_heads,
                           c->num_key_value_heads, hd, scale);
    row += seqs[s].n;
  }
  run_linear(m, ws->tmp, ws->attn, &w->wo, w->bo, rows, m->q_dim);
  be->add(ws->h, ws->tmp, rows * d);
}

static void mlp_block(ds_target *m, int64_t layer, int64_t rows) {
  const ds_model_config *c = &m->cfg;
  const ds_backend *be = m->be;
  workspace *ws = &m->ws;
  int64_t d = c->hidden_size, I = c->intermediate_size;
  const layer_weights *w = &m->layers[layer];
  be->rmsnorm(ws->x, NULL, ws->h, w->post_norm, rows, d, (float)c->rms_norm_eps);
  run_linear(m, ws->gu, ws->x, &w->gate_up, w->b_gate_up, rows, d);
  be->swiglu(ws->act, ws->gu, rows, I);
  run_linear(m, ws->tmp, ws->act, &w->down, w->b_down, rows, I);
  be->add(ws->h, ws->tmp, rows * d);
}

static ds_status check_inputs(const ds_target *m, const ds_target_seq *seqs, int n_seqs,
                              const ds_target_outputs *out, int64_t *rows_out) {
  int64_t rows = 0, V = m->cfg.vocab_size;
  for (int s = 0; s < n_seqs; s++) {
    const ds_target_seq *q = &seqs[s];
    if (!q->cache || q->n < 0) return DS_FAIL(DS_ERR_ARG, "sequence %d: missing cache or negative length", s);
    if (q->cache->len + q->n > q->cache->cap)
      return DS_FAIL(DS_ERR_RANGE, "sequence %d: %lld cached + %lld new tokens exceed the KV cache capacity %lld", s,
                     (long long)q->cache->len, (long long)q->n, (long long)q->cache->cap);
    if (q->cache->len + q->n > m->cfg.max_position_embeddings)
      return DS_FAIL(DS_ERR_RANGE,
                     "%s: sequence %d reaches position %lld (%lld cached + %lld new tokens), beyond the model's "
                     "max_position_embeddings = %lld in %s; use shorter sequences (--seq-len for train "
                     "and capture, the prompt plus --max-new-tokens for generate)",
                     m->dir, s, (long long)(q->cache->len + q->n - 1), (long long)q->cache->len, (long long)q->n,
                     (long long)m->cfg.max_position_embeddings, m->config_label);
    for (int64_t t = 0; t < q->n; t++)
      if (q->ids[t] < 0 || q->ids[t] >= V)
        return DS_FAIL(DS_ERR_RANGE, "sequence %d, token %lld: id %d outside the vocabulary [0, %lld)", s,
                       (long long)t, q->ids[t], (long long)V);
    for (int z = 0; z < s; z++)
      if (seqs[z].cache == q->cache) return DS_FAIL(DS_ERR_ARG, "sequences %d and %d share one KV cache", z, s);
    rows += q->n;
  }
  if (out->captured) DS_TRY(ds_target_check_capture_layers(m, out->capture_layers, out->n_capture));
  if (out->logits && out->logit_rows && out->n_logit_rows > rows)
    return DS_FAIL(DS_ERR_ARG, "%lld logit rows asked for a forward of %lld rows", (long long)out->n_logit_rows,
                   (long long)rows);
  if (out->logits && out->logit_rows)
    for (int64_t i = 0; i < out->n_logit_rows; i++)
      if (out->logit_rows[i] < 0 || out->logit_rows[i] >= rows)
        return DS_FAIL(DS_ERR_RANGE, "logit row %lld outside [0, %lld)", (long long)out->logit_rows[i], (long long)rows);
  *rows_out = rows;
  return DS_OK;
}

/* logits [n, V] (host memory) = x [n, d] (the backend's memory) @ lm_head^T: a forward's and
 * ds_target_logits' vocabulary product. */
static ds_status vocab_product(ds_target *m, const float *x, int64_t n, float *logits) {
  const ds_backend *be = m->be;
  int64_t d = m->cfg.hidden_size, V = m->cfg.vocab_size;
  if (!be->device_memory) {
    be->linear_w(logits, V, x, m->lm_head, NULL, n, d, V);
    return DS_OK;
  }
  DS_TRY(rows_reserve(m->be, &m->ws.logits, &m->ws.logit_rows, n, m->cfg.vocab_size, "logits"));
  be->linear_w(m->ws.logits, V, x, m->lm_head, NULL, n, d, V);
  be->copy_to_host(logits, m->ws.logits, (size_t)n * (size_t)V * sizeof(float));
  return DS_OK;
}

ds_status ds_target_logits(ds_target *m, const float *hidden, int64_t n, float *logits) {
  if (n < 0 || (n > 0 && (!hidden || !logits))) return DS_FAIL(DS_ERR_ARG, "target logits: %lld rows, NULL buffers", (long long)n);
  if (n == 0) return DS_OK;
  if (!m->be->device_memory) return vocab_product(m, hidden, n, logits);
  DS_TRY(workspace_reserve(m, n));
  m->be->copy_to_device(m->ws.x, hidden, (size_t)(n * m->cfg.hidden_size) * sizeof(float));
  return vocab_product(m, m->ws.x, n, logits);
}

/* Rows one pass of the layers takes at most. A longer forward (a long prompt, a capture batch) runs
 * in passes, a sequence's later rows reading its earlier ones from the KV cache as decoding does,
 * so the activations (about 28 KiB a row on SmolLM2-135M) stay bounded whatever the prompt's
 * length; 512 rows keep the matmuls' efficiency (docs/performance.md, "Memory"). */
enum { FORWARD_PASS_ROWS = 512 };

/* One pass over seqs (parts of the caller's sequences, rows r0 .. r0 + rows of the forward): the
 * layers, the caches' lengths advanced, the final norm into ws->x, the outputs of these rows. */
static ds_status forward_pass(ds_target *m, const ds_target_seq *seqs, int n_seqs, int64_t r0, int64_t rows,
                              const ds_target_outputs *out, int single) {
  const ds_model_config *c = &m->cfg;
  const ds_backend *be = m->be;
  workspace *ws = &m->ws;
  int64_t d = c->hidden_size, V = c->vocab_size;
  int64_t row = 0;
  for (int s = 0; s < n_seqs; s++) {
    be->embedding_w(ws->h + row * d, seqs[s].ids, m->embed, seqs[s].n, d);
    for (int64_t t = 0; t < seqs[s].n; t++, row++) ws->pos[row] = seqs[s].cache->len + t;
  }
  DS_TRY(capture_rows(m, out, -1, ws->h, r0, rows, d));
  for (int64_t l = 0; l < c->num_hidden_layers; l++) {
    attention_block(m, l, seqs, n_seqs, rows);
    mlp_block(m, l, rows);
    DS_TRY(capture_rows(m, out, l, ws->h, r0, rows, d));
  }
  for (int s = 0; s < n_seqs; s++) seqs[s].cache->len += seqs[s].n;

  be->rmsnorm(ws->x, NULL, ws->h, m->norm, rows, d, (float)c->rms_norm_eps);
  if (out->final_hidden) be->copy_to_host(out->final_hidden + r0 * d, ws->x, (size_t)(rows * d) * sizeof(float));
  if (!out->logits) return DS_OK;
  if (!out->logit_rows) return vocab_product(m, ws->x, rows, out->logits + r0 * V);
  /* the asked rows gathered (into h, free now, when this is the only pass) for one vocabulary
   * matmul at the end */
  float *to = single ? ws->h : ws->picked;
  for (int64_t i = 0; i < out->n_logit_rows; i++) {
    int64_t r = out->logit_rows[i] - r0;
    if (r >= 0 && r < rows) be->copy_rows(to + i * d, d, ws->x + r * d, d, 1, d);
  }
  return DS_OK;
}

ds_status ds_target_forward(ds_target *m, const ds_target_seq *seqs, int n_seqs, ds_target_outputs *out) {
  const ds_backend *be = m->be;
  int64_t rows = 0;
  DS_TRY(check_inputs(m, seqs, n_seqs, out, &rows));
  if (rows == 0) return DS_OK;
  int64_t pass = rows < FORWARD_PASS_ROWS ? rows : FORWARD_PASS_ROWS;
  int single = pass == rows;
  DS_TRY(workspace_reserve(m, pass));
  if (!single && out->logits && out->logit_rows)
    DS_TRY(rows_reserve(be, &m->ws.picked, &m->ws.picked_rows, out->n_logit_rows, m->cfg.hidden_size, "logit rows"));
  ds_target_seq *part = ds_malloc((size_t)n_seqs * sizeof *part, "forward passes");
  int64_t *len0 = ds_malloc((size_t)n_seqs * sizeof *len0, "forward passes");
  ds_status st = part && len0 ? DS_OK : DS_ERR_NOMEM;
  for (int s = 0; st == DS_OK && s < n_seqs; s++) len0[s] = seqs[s].cache->len;
  /* Passes of up to `pass` rows in the sequences' order. A sequence is cut only at multiples of
   * `pass` from its own first new row, and a piece that would cross a pass's end opens the next
   * pass: the rows after a cut attend to the earlier ones through the cache, summed in another
   * order than a pass's own rows (f16 caches also round them), so cuts placed by the other
   * sequences of a batch would give a request other numbers (and, at a near-tie, other tokens)
   * than it gets alone. */
  int s = 0;
  int64_t t = 0;
  for (int64_t r0 = 0; st == DS_OK && r0 < rows;) {
    int n = 0;
    int64_t take = 0;
    while (s < n_seqs) {
      int64_t k = seqs[s].n - t < pass ? seqs[s].n - t : pass; /* its next piece: rows t .. t + k */
      if (take + k > pass) break;
      if (k > 0) part[n++] = (ds_target_seq){seqs[s].ids + t, k, seqs[s].cache};
      take += k, t += k;
      if (t == seqs[s].n) s++, t = 0;
    }
    st = forward_pass(m, part, n, r0, take, out, single);
    r0 += take;
  }
  if (st == DS_OK && out->logits && out->logit_rows)
    st = vocab_product(m, single ? m->ws.h : m->ws.picked, out->n_logit_rows, out->logits);
  if (st != DS_OK && len0) /* a failed forward leaves the caches as it found them */
    for (int z = 0; z < n_seqs; z++) seqs[z].cache->len = len0[z];
  free(part);
  free(len0);
  DS_TRY(st);
  if (be->device_memory && !out->logits && !out->final_hidden) be->synchronize(); /* a forward ends done */
  return DS_OK;
}
