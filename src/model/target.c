#include "dspark/target.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/fileio.h"
#include "dspark/safetensors.h"
#include "model/rope_freq.h"

typedef struct {
  float *wqkv;      /* (q_dim + 2 kv_dim, d)  rows: q | k | v */
  float *bqkv;      /* (q_dim + 2 kv_dim) or NULL */
  float *q_norm;    /* (head_dim) or NULL */
  float *k_norm;    /* (head_dim) or NULL */
  float *wo;        /* (d, q_dim) */
  float *bo;        /* (d) or NULL */
  float *w_gate_up; /* (2 I, d)  rows: gate | up */
  float *b_gate_up; /* (2 I) or NULL */
  float *w_down;    /* (d, I) */
  float *b_down;    /* (d) or NULL */
  float *in_norm;   /* (d) */
  float *post_norm; /* (d) */
} layer_weights;

/* Grow-only scratch for one forward; R = rows of the largest forward so far. */
typedef struct {
  int64_t rows;
  float *h;       /* (R, d) residual stream */
  float *x;       /* (R, d) normed input of a sub-block */
  float *qkv;     /* (R, q_dim + 2 kv_dim) */
  float *attn;    /* (R, q_dim) */
  float *gu;      /* (R, 2 I) */
  float *act;     /* (R, I) */
  float *tmp;     /* (R, d) */
  int64_t *pos;   /* (R) */
} workspace;

struct ds_target {
  ds_model_config cfg;
  char *dir;      /* the model directory, for messages */
  int own_head;   /* lm_head has its own weights (untied, or tied in config.json but stored: transformers unties) */
  const ds_backend *be;
  int64_t q_dim, kv_dim, qkv_dim;
  float *params; /* one buffer holding every weight below */
  size_t n_params;
  float *embed;   /* (V, d) */
  float *lm_head; /* (V, d), == embed when tied */
  float *norm;    /* (d) */
  layer_weights *layers;
  float *inv_freq; /* (head_dim / 2) */
  workspace ws;
};

struct ds_kv_cache {
  int64_t len, cap;
  int64_t n_layers, n_kv_heads, head_dim;
  float *k; /* (L, n_kv_heads, cap, head_dim) */
  float *v; /* (L, n_kv_heads, cap, head_dim) */
};

/* ---------------------------------------------------------------- loading */

/* Carves the parameter buffer into named pointers; called twice: once to count (base NULL),
 * once to assign, so the size table and the layout cannot disagree. */
static size_t layout_params(ds_target *m, float *base) {
  const ds_model_config *c = &m->cfg;
  size_t off = 0;
#define TAKE(ptr, count)                       \
  do {                                         \
    if (base) (ptr) = base + off;              \
    off += (size_t)(count);                    \
  } while (0)
  int64_t d = c->hidden_size, I = c->intermediate_size;
  TAKE(m->embed, c->vocab_size * d);
  if (!m->own_head) {
    if (base) m->lm_head = m->embed;
  } else {
    TAKE(m->lm_head, c->vocab_size * d);
  }
  TAKE(m->norm, d);
  for (int64_t l = 0; l < c->num_hidden_layers; l++) {
    layer_weights *w = base ? &m->layers[l] : &(layer_weights){0};
    TAKE(w->wqkv, m->qkv_dim * d);
    if (c->attention_bias) TAKE(w->bqkv, m->qkv_dim);
    if (c->qk_norm) {
      TAKE(w->q_norm, c->head_dim);
      TAKE(w->k_norm, c->head_dim);
    }
    TAKE(w->wo, d * m->q_dim);
    if (c->o_proj_bias) TAKE(w->bo, d);
    TAKE(w->w_gate_up, 2 * I * d);
    if (c->mlp_bias) TAKE(w->b_gate_up, 2 * I);
    TAKE(w->w_down, d * I);
    if (c->mlp_bias) TAKE(w->b_down, d);
    TAKE(w->in_norm, d);
    TAKE(w->post_norm, d);
  }
#undef TAKE
  return off;
}

static ds_status read2(const ds_checkpoint *ck, const char *name, int64_t rows, int64_t cols, float *dst) {
  int64_t shape[2] = {rows, cols};
  return ds_ckpt_read_f32(ck, name, 2, shape, dst);
}

static ds_status read1(const ds_checkpoint *ck, const char *name, int64_t n, float *dst) {
  return ds_ckpt_read_f32(ck, name, 1, &n, dst);
}

static const char k_embed_name[] = "model.embed_tokens.weight", k_head_name[] = "lm_head.weight";

/* Tied embeddings as transformers (5.x) ties them when loading: with tie_word_embeddings a
 * checkpoint holding both tables keeps them apart (tied only when equal, which computes the
 * same), one holding only lm_head.weight ties the embedding to it; untied needs both. */
static void plan_head(ds_target *m, const ds_checkpoint *ck) {
  int has_head = ds_ckpt_find(ck, k_head_name) != NULL;
  m->own_head = !m->cfg.tie_word_embeddings || (has_head && ds_ckpt_find(ck, k_embed_name));
}

/* Shape of one 2-D tensor, checked before the weight buffer is allocated: a config whose
 * sizes disagree with the checkpoint (often a field left to its class default) is refused
 * without first allocating what those sizes would need. */
static ds_status expect_shape(const ds_checkpoint *ck, const char *name, int64_t rows, int64_t cols) {
  const ds_tensor_view *v = ds_ckpt_find(ck, name);
  if (!v) return DS_OK; /* reported by the full read, which names every missing tensor */
  if (v->ndim == 2 && v->shape[0] == rows && v->shape[1] == cols) return DS_OK;
  char have[128] = "[";
  for (int i = 0; i < v->ndim; i++) {
    size_t n = strlen(have);
    snprintf(have + n, sizeof have - n, "%s%lld", i ? ", " : "", (long long)v->shape[i]);
  }
  strncat(have, "]", sizeof have - strlen(have) - 1);
  return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' has shape %s but [%lld, %lld] was expected", v->file, name, have,
                 (long long)rows, (long long)cols);
}

static ds_status preflight(const ds_target *m, const ds_checkpoint *ck) {
  const ds_model_config *c = &m->cfg;
  int64_t d = c->hidden_size;
  DS_TRY(expect_shape(ck, k_embed_name, c->vocab_size, d));
  DS_TRY(expect_shape(ck, k_head_name, c->vocab_size, d));
  DS_TRY(expect_shape(ck, "model.layers.0.self_attn.q_proj.weight", m->q_dim, d));
  DS_TRY(expect_shape(ck, "model.layers.0.self_attn.k_proj.weight", m->kv_dim, d));
  DS_TRY(expect_shape(ck, "model.layers.0.mlp.gate_proj.weight", c->intermediate_size, d));
  char name[96];
  snprintf(name, sizeof name, "model.layers.%lld.input_layernorm.weight", (long long)(c->num_hidden_layers - 1));
  if (!ds_ckpt_find(ck, name))
    return DS_FAIL(DS_ERR_NOT_FOUND, "%s: tensor '%s' not found: the checkpoint has fewer than num_hidden_layers = %lld "
                   "layers", m->dir, name, (long long)c->num_hidden_layers);
  return DS_OK;
}

static ds_status load_weights(ds_target *m, const ds_checkpoint *ck) {
  const ds_model_config *c = &m->cfg;
  int64_t d = c->hidden_size, I = c->intermediate_size, V = c->vocab_size;
  char name[256];
  int embed_from_head = c->tie_word_embeddings && !ds_ckpt_find(ck, k_embed_name) && ds_ckpt_find(ck, k_head_name);
  DS_TRY(read2(ck, embed_from_head ? k_head_name : k_embed_name, V, d, m->embed));
  if (m->own_head) DS_TRY(read2(ck, k_head_name, V, d, m->lm_head));
  DS_TRY(read1(ck, "model.norm.weight", d, m->norm));
  for (int64_t l = 0; l < c->num_hidden_layers; l++) {
    layer_weights *w = &m->layers[l];
#define NAME(fmt) (snprintf(name, sizeof name, "model.layers.%lld." fmt, (long long)l), name)
    DS_TRY(read2(ck, NAME("self_attn.q_proj.weight"), m->q_dim, d, w->wqkv));
    DS_TRY(read2(ck, NAME("self_attn.k_proj.weight"), m->kv_dim, d, w->wqkv + m->q_dim * d));
    DS_TRY(read2(ck, NAME("self_attn.v_proj.weight"), m->kv_dim, d, w->wqkv + (m->q_dim + m->kv_dim) * d));
    if (c->attention_bias) {
      DS_TRY(read1(ck, NAME("self_attn.q_proj.bias"), m->q_dim, w->bqkv));
      DS_TRY(read1(ck, NAME("self_attn.k_proj.bias"), m->kv_dim, w->bqkv + m->q_dim));
      DS_TRY(read1(ck, NAME("self_attn.v_proj.bias"), m->kv_dim, w->bqkv + m->q_dim + m->kv_dim));
    }
    if (c->qk_norm) {
      DS_TRY(read1(ck, NAME("self_attn.q_norm.weight"), c->head_dim, w->q_norm));
      DS_TRY(read1(ck, NAME("self_attn.k_norm.weight"), c->head_dim, w->k_norm));
    }
    DS_TRY(read2(ck, NAME("self_attn.o_proj.weight"), d, m->q_dim, w->wo));
    if (c->o_proj_bias) DS_TRY(read1(ck, NAME("self_attn.o_proj.bias"), d, w->bo));
    DS_TRY(read2(ck, NAME("mlp.gate_proj.weight"), I, d, w->w_gate_up));
    DS_TRY(read2(ck, NAME("mlp.up_proj.weight"), I, d, w->w_gate_up + I * d));
    DS_TRY(read2(ck, NAME("mlp.down_proj.weight"), d, I, w->w_down));
    if (c->mlp_bias) {
      DS_TRY(read1(ck, NAME("mlp.gate_proj.bias"), I, w->b_gate_up));
      DS_TRY(read1(ck, NAME("mlp.up_proj.bias"), I, w->b_gate_up + I));
      DS_TRY(read1(ck, NAME("mlp.down_proj.bias"), d, w->b_down));
    }
    DS_TRY(read1(ck, NAME("input_layernorm.weight"), d, w->in_norm));
    DS_TRY(read1(ck, NAME("post_attention_layernorm.weight"), d, w->post_norm));
#undef NAME
  }
  return DS_OK;
}

ds_status ds_target_load(const char *model_dir, const ds_backend *backend, ds_target **out) {
  *out = NULL;
  ds_target *m = ds_calloc(1, sizeof *m, "target model");
  if (!m) return DS_ERR_NOMEM;
  m->be = backend ? backend : ds_backend_cpu();
  ds_checkpoint *ck = NULL;
  m->dir = ds_malloc(strlen(model_dir) + 1, "path");
  if (!m->dir) { ds_target_free(m); return DS_ERR_NOMEM; }
  strcpy(m->dir, model_dir);
  ds_status st = ds_config_load_dir(model_dir, &m->cfg);
  if (st != DS_OK) goto fail;
  const ds_model_config *c = &m->cfg;
  if (c->head_dim > 2048) {
    st = DS_FAIL(DS_ERR_UNSUPPORTED, "%s/config.json: head_dim %lld exceeds 2048", model_dir, (long long)c->head_dim);
    goto fail;
  }
  m->q_dim = c->num_attention_heads * c->head_dim;
  m->kv_dim = c->num_key_value_heads * c->head_dim;
  m->qkv_dim = m->q_dim + 2 * m->kv_dim;
  m->layers = ds_calloc((size_t)c->num_hidden_layers, sizeof *m->layers, "layer table");
  m->inv_freq = ds_malloc((size_t)c->head_dim / 2 * sizeof(float), "rope table");
  if (!m->layers || !m->inv_freq) { st = DS_ERR_NOMEM; goto fail; }
  if ((st = ds_ckpt_open(model_dir, &ck)) != DS_OK) goto fail;
  plan_head(m, ck);
  m->n_params = layout_params(m, NULL);
  if ((st = preflight(m, ck)) == DS_OK) {
    m->params = ds_malloc_aligned(m->n_params * sizeof(float), "model weights");
    if (!m->params) st = DS_ERR_NOMEM;
  }
  if (st == DS_OK) {
    layout_params(m, m->params);
    ds_rope_inv_freq(c, m->inv_freq);
    st = load_weights(m, ck);
  }
  ds_ckpt_close(ck);
  if ((st == DS_ERR_FORMAT || st == DS_ERR_NOT_FOUND) && c->defaulted[0])
    ds_error_wrap(st, "%s/config.json leaves these fields to %s's defaults (as transformers does): %s", model_dir,
                  ds_config_class_name(c->arch), c->defaulted);
  if (st != DS_OK) goto fail;
  *out = m;
  return DS_OK;
fail:
  ds_target_free(m);
  return st;
}

static void workspace_free(workspace *ws) {
  ds_free_aligned(ws->h);
  ds_free_aligned(ws->x);
  ds_free_aligned(ws->qkv);
  ds_free_aligned(ws->attn);
  ds_free_aligned(ws->gu);
  ds_free_aligned(ws->act);
  ds_free_aligned(ws->tmp);
  free(ws->pos);
  memset(ws, 0, sizeof *ws);
}

void ds_target_free(ds_target *m) {
  if (!m) return;
  workspace_free(&m->ws);
  ds_free_aligned(m->params);
  free(m->layers);
  free(m->inv_freq);
  free(m->dir);
  free(m);
}

const ds_model_config *ds_target_config(const ds_target *m) { return &m->cfg; }
const float *ds_target_embed(const ds_target *m) { return m->embed; }
const float *ds_target_lm_head(const ds_target *m) { return m->lm_head; }
int ds_target_head_is_embedding(const ds_target *m) { return !m->own_head; }

/* ---------------------------------------------------------------- KV cache */

ds_status ds_kv_cache_new(const ds_target *m, int64_t capacity, ds_kv_cache **out) {
  *out = NULL;
  if (capacity <= 0) return DS_FAIL(DS_ERR_ARG, "KV cache capacity must be positive (got %lld)", (long long)capacity);
  ds_kv_cache *c = ds_calloc(1, sizeof *c, "KV cache");
  if (!c) return DS_ERR_NOMEM;
  c->cap = capacity;
  c->n_layers = m->cfg.num_hidden_layers;
  c->n_kv_heads = m->cfg.num_key_value_heads;
  c->head_dim = m->cfg.head_dim;
  size_t n = (size_t)c->n_layers * (size_t)c->n_kv_heads * (size_t)capacity * (size_t)c->head_dim;
  c->k = ds_malloc_aligned(n * sizeof(float), "KV cache keys");
  c->v = ds_malloc_aligned(n * sizeof(float), "KV cache values");
  if (!c->k || !c->v) {
    ds_kv_cache_free(c);
    return DS_ERR_NOMEM;
  }
  *out = c;
  return DS_OK;
}

void ds_kv_cache_free(ds_kv_cache *c) {
  if (!c) return;
  ds_free_aligned(c->k);
  ds_free_aligned(c->v);
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

static ds_status workspace_reserve(ds_target *m, int64_t rows) {
  workspace *ws = &m->ws;
  if (rows <= ws->rows) return DS_OK;
  workspace_free(ws);
  const ds_model_config *c = &m->cfg;
  size_t R = (size_t)rows, d = (size_t)c->hidden_size, I = (size_t)c->intermediate_size;
  ws->h = ds_malloc_aligned(R * d * sizeof(float), "activations");
  ws->x = ds_malloc_aligned(R * d * sizeof(float), "activations");
  ws->qkv = ds_malloc_aligned(R * (size_t)m->qkv_dim * sizeof(float), "activations");
  ws->attn = ds_malloc_aligned(R * (size_t)m->q_dim * sizeof(float), "activations");
  ws->gu = ds_malloc_aligned(R * 2 * I * sizeof(float), "activations");
  ws->act = ds_malloc_aligned(R * I * sizeof(float), "activations");
  ws->tmp = ds_malloc_aligned(R * d * sizeof(float), "activations");
  ws->pos = ds_malloc(R * sizeof(int64_t), "positions");
  if (!ws->h || !ws->x || !ws->qkv || !ws->attn || !ws->gu || !ws->act || !ws->tmp || !ws->pos) {
    workspace_free(ws);
    return DS_ERR_NOMEM;
  }
  ws->rows = rows;
  return DS_OK;
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

static void capture_rows(const ds_target_outputs *out, int64_t layer, const float *h, int64_t rows, int64_t d) {
  if (!out->captured) return;
  for (int c = 0; c < out->n_capture; c++) {
    if (out->capture_layers[c] != layer) continue;
    int64_t stride = (int64_t)out->n_capture * d;
    for (int64_t r = 0; r < rows; r++)
      memcpy(out->captured + r * stride + c * d, h + r * d, (size_t)d * sizeof(float));
  }
}

/* Stores this layer's new K/V rows (already roped) of every sequence in its cache. */
static void append_kv(const ds_target *m, int64_t layer, const ds_target_seq *seqs, int n_seqs, const float *qkv) {
  const ds_model_config *c = &m->cfg;
  int64_t hd = c->head_dim, hkv = c->num_key_value_heads;
  int64_t row = 0;
  for (int s = 0; s < n_seqs; s++) {
    ds_kv_cache *kc = seqs[s].cache;
    size_t layer_off = (size_t)layer * (size_t)hkv * (size_t)kc->cap * (size_t)hd;
    for (int64_t t = 0; t < seqs[s].n; t++, row++) {
      const float *kr = qkv + row * m->qkv_dim + m->q_dim, *vr = kr + m->kv_dim;
      int64_t p = kc->len + t;
      for (int64_t h = 0; h < hkv; h++) {
        size_t at = layer_off + ((size_t)h * (size_t)kc->cap + (size_t)p) * (size_t)hd;
        memcpy(kc->k + at, kr + h * hd, (size_t)hd * sizeof(float));
        memcpy(kc->v + at, vr + h * hd, (size_t)hd * sizeof(float));
      }
    }
  }
}

static void attention_block(ds_target *m, int64_t layer, const ds_target_seq *seqs, int n_seqs, int64_t rows) {
  const ds_model_config *c = &m->cfg;
  const ds_backend *be = m->be;
  workspace *ws = &m->ws;
  int64_t d = c->hidden_size, hd = c->head_dim;
  const layer_weights *w = &m->layers[layer];

  be->rmsnorm(ws->x, NULL, ws->h, w->in_norm, rows, d, (float)c->rms_norm_eps);
  be->linear(ws->qkv, ws->x, w->wqkv, w->bqkv, rows, d, m->qkv_dim);
  if (c->qk_norm) {
    for (int64_t r = 0; r < rows; r++) {
      float *q = ws->qkv + r * m->qkv_dim, *k = q + m->q_dim;
      be->rmsnorm(q, NULL, q, w->q_norm, c->num_attention_heads, hd, (float)c->rms_norm_eps);
      be->rmsnorm(k, NULL, k, w->k_norm, c->num_key_value_heads, hd, (float)c->rms_norm_eps);
    }
  }
  be->rope(ws->qkv, m->qkv_dim, ws->pos, m->inv_freq, rows, c->num_attention_heads, hd);
  be->rope(ws->qkv + m->q_dim, m->qkv_dim, ws->pos, m->inv_freq, rows, c->num_key_value_heads, hd);
  append_kv(m, layer, seqs, n_seqs, ws->qkv);

  float scale = 1.0f / sqrtf((float)hd);
  int64_t row = 0;
  for (int s = 0; s < n_seqs; s++) {
    const ds_kv_cache *kc = seqs[s].cache;
    size_t layer_off = (size_t)layer * (size_t)kc->n_kv_heads * (size_t)kc->cap * (size_t)hd;
    be->attention_causal(ws->attn + row * m->q_dim, ws->qkv + row * m->qkv_dim, m->qkv_dim, kc->k + layer_off,
                         kc->v + layer_off, seqs[s].n, kc->len, kc->cap, c->num_attention_heads,
                         c->num_key_value_heads, hd, scale);
    row += seqs[s].n;
  }
  be->linear(ws->tmp, ws->attn, w->wo, w->bo, rows, m->q_dim, d);
  be->add(ws->h, ws->tmp, rows * d);
}

static void mlp_block(ds_target *m, int64_t layer, int64_t rows) {
  const ds_model_config *c = &m->cfg;
  const ds_backend *be = m->be;
  workspace *ws = &m->ws;
  int64_t d = c->hidden_size, I = c->intermediate_size;
  const layer_weights *w = &m->layers[layer];
  be->rmsnorm(ws->x, NULL, ws->h, w->post_norm, rows, d, (float)c->rms_norm_eps);
  be->linear(ws->gu, ws->x, w->w_gate_up, w->b_gate_up, rows, d, 2 * I);
  be->swiglu(ws->act, ws->gu, rows, I);
  be->linear(ws->tmp, ws->act, w->w_down, w->b_down, rows, I, d);
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
                     "max_position_embeddings = %lld in %s/config.json; use shorter sequences (--seq-len for train "
                     "and capture, the prompt plus --max-new-tokens for generate)",
                     m->dir, s, (long long)(q->cache->len + q->n - 1), (long long)q->cache->len, (long long)q->n,
                     (long long)m->cfg.max_position_embeddings, m->dir);
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

ds_status ds_target_forward(ds_target *m, const ds_target_seq *seqs, int n_seqs, ds_target_outputs *out) {
  const ds_model_config *c = &m->cfg;
  const ds_backend *be = m->be;
  int64_t rows = 0, d = c->hidden_size, V = c->vocab_size;
  DS_TRY(check_inputs(m, seqs, n_seqs, out, &rows));
  if (rows == 0) return DS_OK;
  DS_TRY(workspace_reserve(m, rows));
  workspace *ws = &m->ws;

  int64_t row = 0;
  for (int s = 0; s < n_seqs; s++)
    for (int64_t t = 0; t < seqs[s].n; t++, row++) {
      ws->pos[row] = seqs[s].cache->len + t;
      memcpy(ws->h + row * d, m->embed + (int64_t)seqs[s].ids[t] * d, (size_t)d * sizeof(float));
    }
  capture_rows(out, -1, ws->h, rows, d);

  for (int64_t l = 0; l < c->num_hidden_layers; l++) {
    attention_block(m, l, seqs, n_seqs, rows);
    mlp_block(m, l, rows);
    capture_rows(out, l, ws->h, rows, d);
  }
  for (int s = 0; s < n_seqs; s++) seqs[s].cache->len += seqs[s].n;

  be->rmsnorm(ws->x, NULL, ws->h, m->norm, rows, d, (float)c->rms_norm_eps);
  if (out->final_hidden) memcpy(out->final_hidden, ws->x, (size_t)(rows * d) * sizeof(float));
  if (out->logits) {
    if (!out->logit_rows) {
      be->linear(out->logits, ws->x, m->lm_head, NULL, rows, d, V);
    } else {
      /* Gather the asked rows into h (free now) so the vocabulary matmul runs once. */
      for (int64_t i = 0; i < out->n_logit_rows; i++)
        memcpy(ws->h + i * d, ws->x + out->logit_rows[i] * d, (size_t)d * sizeof(float));
      be->linear(out->logits, ws->h, m->lm_head, NULL, out->n_logit_rows, d, V);
    }
  }
  return DS_OK;
}
