#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/rng.h"
#include "model/draft_internal.h"
#include "model/rope_freq.h"

/* ---------------------------------------------------------------- tensor table */

typedef struct {
  tensor_spec *v;
  size_t n, cap;
  int failed;
} spec_list;

static void add_spec(spec_list *l, const char *name, int64_t rows, int64_t cols, int trainable, int init,
                     float **slot, float **grad_slot, ds_weight *table) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 64;
    tensor_spec *v = realloc(l->v, cap * sizeof *v);
    if (!v) { l->failed = 1; return; }
    l->v = v;
    l->cap = cap;
  }
  char *copy = strdup(name);
  if (!copy) { l->failed = 1; return; }
  l->v[l->n++] = (tensor_spec){copy, rows, cols, trainable, init, 0, slot, grad_slot, table,
                                table ? table->dtype : DS_F32};
}

/* The export order and names of spec section 7. */
static void build_specs(ds_draft *d, spec_list *l) {
  const ds_draft_config *c = &d->cfg;
  int64_t dm = c->hidden_size, V = c->vocab_size, I = c->intermediate_size, r = c->markov_rank;
  int64_t hd = c->head_dim, N = d->n_vocab;
  char name[128];
  add_spec(l, "embed_tokens.weight", V, dm, 0, 0, NULL, NULL, &d->embed);
  add_spec(l, "lm_head.weight", N, dm, 0, 0, NULL, NULL, &d->lm_head);
  for (int64_t i = 0; i < c->num_layers; i++) {
    draft_layer *w = &d->w.layers[i], *g = &d->g.layers[i];
#define LAYER(suffix, rows, cols, init, field)                              \
  snprintf(name, sizeof name, "layers.%lld.%s", (long long)i, suffix);      \
  add_spec(l, name, rows, cols, 1, init, &w->field, &g->field, NULL)
    LAYER("self_attn.q_proj.weight", d->q_dim, dm, 0, wq);
    LAYER("self_attn.k_proj.weight", d->kv_dim, dm, 0, wk);
    LAYER("self_attn.v_proj.weight", d->kv_dim, dm, 0, wv);
    LAYER("self_attn.o_proj.weight", dm, d->q_dim, 0, wo);
    LAYER("self_attn.q_norm.weight", hd, 0, 1, q_norm);
    LAYER("self_attn.k_norm.weight", hd, 0, 1, k_norm);
    LAYER("mlp.gate_proj.weight", I, dm, 0, w_gate);
    LAYER("mlp.up_proj.weight", I, dm, 0, w_up);
    LAYER("mlp.down_proj.weight", dm, I, 0, w_down);
    LAYER("input_layernorm.weight", dm, 0, 1, in_norm);
    LAYER("post_attention_layernorm.weight", dm, 0, 1, post_norm);
#undef LAYER
  }
  add_spec(l, "fc.weight", dm, (int64_t)c->n_target_layers * dm, 1, 0, &d->w.fc, &d->g.fc, NULL);
  add_spec(l, "hidden_norm.weight", dm, 0, 1, 1, &d->w.hidden_norm, &d->g.hidden_norm, NULL);
  add_spec(l, "norm.weight", dm, 0, 1, 1, &d->w.norm, &d->g.norm, NULL);
  if (r > 0) {
    add_spec(l, "markov_head.markov_w1.weight", V, r, 1, 0, &d->w.markov_w1, &d->g.markov_w1, NULL);
    add_spec(l, "markov_head.markov_w2.weight", N, r, 1, 0, &d->w.markov_w2, &d->g.markov_w2, NULL);
  }
  if (c->markov_type == DS_MARKOV_GATED) {
    add_spec(l, "markov_head.gate_proj.weight", r, dm + r, 1, 0, &d->w.gate_w, &d->g.gate_w, NULL);
    add_spec(l, "markov_head.gate_proj.bias", r, 0, 1, 2, &d->w.gate_b, &d->g.gate_b, NULL);
  } else if (c->markov_type == DS_MARKOV_RNN) {
    add_spec(l, "markov_head.joint_proj.weight", 3 * r, 2 * r + dm, 1, 0, &d->w.joint_w, &d->g.joint_w, NULL);
    add_spec(l, "markov_head.joint_proj.bias", 3 * r, 0, 1, 2, &d->w.joint_b, &d->g.joint_b, NULL);
  }
  if (c->enable_confidence_head) {
    int64_t in = dm + (c->confidence_head_with_markov ? r : 0);
    add_spec(l, "confidence_head.proj.weight", 1, in, 1, 0, &d->w.conf_w, &d->g.conf_w, NULL);
    add_spec(l, "confidence_head.proj.bias", 1, 0, 1, 2, &d->w.conf_b, &d->g.conf_b, NULL);
  }
  if (c->draft_vocab_size > 0) { /* S, as EAGLE-3 / speculators / vLLM name and shape it */
    add_spec(l, "d2t", N, 0, 0, 0, NULL, NULL, NULL);
    if (!l->failed) l->v[l->n - 1].dtype = DS_I64;
    add_spec(l, "t2d", V, 0, 0, 0, NULL, NULL, NULL);
    if (!l->failed) l->v[l->n - 1].dtype = DS_BOOL;
  }
}

static size_t spec_numel(const tensor_spec *s) { return (size_t)s->rows * (size_t)(s->cols ? s->cols : 1); }

/* Box-Muller normal from the seeded stream: the same seed gives the same weights. */
static float normal01(ds_rng *rng) {
  double u1 = ds_rng_uniform_f64(rng), u2 = ds_rng_uniform_f64(rng);
  if (u1 < 1e-300) u1 = 1e-300;
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static int table_dtype_ok(ds_dtype dt) { return dt == DS_F32 || dt == DS_BF16 || dt == DS_F16; }

int64_t ds_draft_config_vocab_rows(const ds_draft_config *c) {
  return c->draft_vocab_size > 0 ? c->draft_vocab_size : c->vocab_size;
}

ds_status ds_draft_new(const ds_draft_config *cfg, ds_weight embed, ds_weight lm_head, uint64_t seed,
                       const ds_backend *backend, ds_draft **out) {
  return ds_draft_new_vocab(cfg, embed, lm_head, NULL, seed, backend, out);
}

/* S [N]: strictly increasing ids in [0, V). */
static ds_status check_vocab_ids(const int32_t *ids, int64_t N, int64_t V) {
  for (int64_t j = 0; j < N; j++)
    if (ids[j] < 0 || ids[j] >= V || (j > 0 && ids[j] <= ids[j - 1]))
      return DS_FAIL(DS_ERR_ARG, "draft: vocabulary id %d at %lld is outside [0, %lld) or not above the one before it "
                     "(a draft vocabulary is strictly increasing)", ids[j], (long long)j, (long long)V);
  return DS_OK;
}

ds_status ds_draft_new_vocab(const ds_draft_config *cfg, ds_weight embed, ds_weight lm_head, const int32_t *vocab_ids,
                             uint64_t seed, const ds_backend *backend, ds_draft **out) {
  return draft_new(cfg, embed, lm_head, vocab_ids, seed, 1, backend, out);
}

ds_status draft_new(const ds_draft_config *cfg, ds_weight embed, ds_weight lm_head, const int32_t *vocab_ids,
                    uint64_t seed, int init, const ds_backend *backend, ds_draft **out) {
  *out = NULL;
  DS_TRY(ds_draft_config_check(cfg));
  if (!table_dtype_ok(embed.dtype) || !table_dtype_ok(lm_head.dtype))
    return DS_FAIL(DS_ERR_ARG, "draft: the frozen tables must be F32, BF16 or F16 (got %s and %s)",
                   ds_dtype_name(embed.dtype), ds_dtype_name(lm_head.dtype));
  if ((cfg->draft_vocab_size > 0) != (vocab_ids != NULL))
    return DS_FAIL(DS_ERR_ARG, "draft: draft_vocab_size %lld %s the vocabulary's ids", (long long)cfg->draft_vocab_size,
                   vocab_ids ? "without a reduced vocabulary, but given" : "needs");
  if (vocab_ids) DS_TRY(check_vocab_ids(vocab_ids, cfg->draft_vocab_size, cfg->vocab_size));
  ds_draft *d = ds_calloc(1, sizeof *d, "draft");
  if (!d) return DS_ERR_NOMEM;
  d->cfg = *cfg;
  d->n_vocab = ds_draft_config_vocab_rows(cfg);
  d->be = backend ? backend : ds_backend_cpu();
  d->q_dim = cfg->num_attention_heads * cfg->head_dim;
  d->kv_dim = cfg->num_key_value_heads * cfg->head_dim;
  d->embed.dtype = embed.dtype;
  d->lm_head.dtype = lm_head.dtype;
  d->w.layers = ds_calloc((size_t)cfg->num_layers, sizeof(draft_layer), "draft layers");
  d->g.layers = ds_calloc((size_t)cfg->num_layers, sizeof(draft_layer), "draft layers");
  d->inv_freq = ds_malloc((size_t)cfg->head_dim / 2 * sizeof(float), "rope table");
  if (vocab_ids) {
    d->vocab_ids = ds_malloc((size_t)d->n_vocab * sizeof(int32_t), "draft vocabulary");
    d->vocab_index = ds_malloc((size_t)cfg->vocab_size * sizeof(int32_t), "draft vocabulary index");
  }
  spec_list l = {0};
  ds_status st = DS_ERR_NOMEM;
  if (!d->w.layers || !d->g.layers || !d->inv_freq || (vocab_ids && (!d->vocab_ids || !d->vocab_index))) goto fail;
  ds_rope_inv_freq(&cfg->rope_source, d->inv_freq);
  build_specs(d, &l);
  d->specs = l.v;
  d->n_specs = l.n;
  if (l.failed) goto fail;
  size_t n_train = 0, frozen_bytes = 0;
  for (size_t i = 0; i < l.n; i++) {
    tensor_spec *s = &l.v[i];
    if (s->trainable) {
      s->offset = n_train;
      n_train += spec_numel(s);
    } else {
      s->offset = frozen_bytes;
      frozen_bytes += (spec_numel(s) * ds_dtype_size(s->dtype) + 63) & ~(size_t)63;
    }
  }
  d->n_params = n_train;
  d->params = ds_malloc_aligned(n_train * sizeof(float), "draft parameters");
  d->grads = ds_malloc_aligned(n_train * sizeof(float), "draft gradients");
  d->frozen = ds_malloc_aligned(frozen_bytes, "draft frozen tables");
  d->tensors = ds_calloc(l.n, sizeof *d->tensors, "draft tensor table");
  if (!d->params || !d->grads || !d->frozen || !d->tensors) goto fail;
  ds_rng rng;
  ds_rng_seed(&rng, seed);
  for (size_t i = 0; i < l.n; i++) {
    tensor_spec *s = &l.v[i];
    size_t n = spec_numel(s);
    void *data;
    if (s->trainable) {
      *s->slot = d->params + s->offset;
      *s->grad_slot = d->grads + s->offset;
      for (size_t k = 0; init && k < n; k++) (*s->slot)[k] = s->init == 1 ? 1.0f : s->init == 2 ? 0.0f : 0.02f * normal01(&rng);
      data = *s->slot;
    } else {
      data = (char *)d->frozen + s->offset;
      if (s->table) s->table->data = data;
      else if (s->dtype == DS_I64) d->d2t = data;
      else d->t2d = data;
    }
    d->tensors[i] = (ds_draft_tensor){s->name, data, s->trainable ? *s->grad_slot : NULL, s->cols ? 2 : 1,
                                      {s->rows, s->cols}, s->dtype};
  }
  /* Replicas, not aliases: the draft owns its copies (spec section 1), in the dtype given;
   * of the target's lm_head, the rows S of a reduced vocabulary. */
  size_t cells = (size_t)cfg->vocab_size * (size_t)cfg->hidden_size;
  const ds_weight src[2] = {embed, lm_head};
  ds_weight *dst[2] = {&d->embed, &d->lm_head};
  for (int k = 0; k < 2; k++) {
    size_t row = (size_t)cfg->hidden_size * ds_dtype_size(src[k].dtype);
    if (!src[k].data && init) memset((void *)dst[k]->data, 0, (k ? (size_t)d->n_vocab : (size_t)cfg->vocab_size) * row);
    else if (!src[k].data) continue; /* the caller fills it */
    else if (k == 0 || !vocab_ids) memcpy((void *)dst[k]->data, src[k].data, cells * ds_dtype_size(src[k].dtype));
    else
      for (int64_t j = 0; j < d->n_vocab; j++)
        memcpy((char *)dst[k]->data + (size_t)j * row, (const char *)src[k].data + (size_t)vocab_ids[j] * row, row);
  }
  if (vocab_ids) {
    memset(d->t2d, 0, (size_t)cfg->vocab_size);
    for (int64_t v = 0; v < cfg->vocab_size; v++) d->vocab_index[v] = -1;
    for (int64_t j = 0; j < d->n_vocab; j++) {
      d->vocab_ids[j] = vocab_ids[j];
      d->vocab_index[vocab_ids[j]] = (int32_t)j;
      d->d2t[j] = (int64_t)vocab_ids[j] - j;
      d->t2d[vocab_ids[j]] = 1;
    }
  }
  ds_draft_zero_grads(d);
  /* The MLP runs gate and up as one (2I, d) matmul: they must be adjacent. */
  for (int64_t i = 0; i < cfg->num_layers; i++)
    DS_CHECK(d->w.layers[i].w_up == d->w.layers[i].w_gate + cfg->intermediate_size * cfg->hidden_size);
  *out = d;
  return DS_OK;
fail:
  if (!d->specs) d->specs = l.v, d->n_specs = l.n;
  ds_draft_free(d);
  return st;
}

static void acts_free(draft_acts *a) {
  ds_free_aligned(a->arena);
  free(a->layers);
  free(a->pos_blk);
  free(a->pos_ctx);
  free(a->ctx_len);
  free(a->prev_ids);
  memset(a, 0, sizeof *a);
}

void ds_draft_free(ds_draft *d) {
  if (!d) return;
  ds_release_packed_weights(); /* bf16 copies keyed by the addresses freed below */
  draft_decode_copies_free(d);
  acts_free(&d->acts);
  ds_free_aligned(d->dscratch);
  ds_free_aligned(d->workspace);
  for (size_t i = 0; i < d->n_specs; i++) free((char *)d->specs[i].name);
  free(d->specs);
  free(d->tensors);
  ds_free_aligned(d->params);
  ds_free_aligned(d->grads);
  ds_free_aligned(d->frozen);
  ds_st_close(d->tables_file);
  free(d->w.layers);
  free(d->g.layers);
  free(d->inv_freq);
  free(d->vocab_ids);
  free(d->vocab_index);
  free(d);
}

const ds_draft_config *ds_draft_get_config(const ds_draft *d) { return &d->cfg; }
float *ds_draft_params(ds_draft *d) { return d->params; }
float *ds_draft_grads(ds_draft *d) { return d->grads; }
size_t ds_draft_num_params(const ds_draft *d) { return d->n_params; }
void ds_draft_zero_grads(ds_draft *d) { memset(d->grads, 0, d->n_params * sizeof(float)); }
ds_weight ds_draft_embed(const ds_draft *d) { return d->embed; }
ds_weight ds_draft_lm_head(const ds_draft *d) { return d->lm_head; }
int64_t ds_draft_vocab_size(const ds_draft *d) { return d->n_vocab; }
const int32_t *ds_draft_vocab_ids(const ds_draft *d) { return d->vocab_ids; }
const int32_t *ds_draft_vocab_index(const ds_draft *d) { return d->vocab_index; }
size_t ds_draft_tensor_count(const ds_draft *d) { return d->n_specs; }
const ds_draft_tensor *ds_draft_tensor_at(const ds_draft *d, size_t i) { return i < d->n_specs ? &d->tensors[i] : NULL; }

/* ---------------------------------------------------------------- activations */

/* Carves the arena for R block rows and T context rows; with base NULL only counts. */
static size_t layout_acts(ds_draft *d, draft_acts *a, float *base, int64_t R, int64_t T) {
  const ds_draft_config *c = &d->cfg;
  size_t off = 0;
  int64_t dm = c->hidden_size, I = c->intermediate_size, r = c->markov_rank;
  int64_t Hq = c->num_attention_heads, Hkv = c->num_key_value_heads;
#define TAKE(ptr, count)                                     \
  do {                                                       \
    if (base) (ptr) = base + off;                            \
    off += ((size_t)(count) + 15) & ~(size_t)15; /* 64 B */  \
  } while (0)
  TAKE(a->fc_out, T * dm);
  TAKE(a->hctx_rstd, T);
  TAKE(a->hctx, T * dm);
  for (int64_t l = 0; l < c->num_layers; l++) {
    layer_acts tmp, *la = base ? &a->layers[l] : &tmp;
    TAKE(la->h_in, R * dm);
    TAKE(la->hn, R * dm);
    TAKE(la->rstd_in, R);
    TAKE(la->q_pre, R * d->q_dim);
    TAKE(la->q_rstd, R * Hq);
    TAKE(la->q, R * d->q_dim);
    TAKE(la->kb_pre, R * d->kv_dim);
    TAKE(la->kb_rstd, R * Hkv);
    TAKE(la->kb, R * d->kv_dim);
    TAKE(la->vb, R * d->kv_dim);
    TAKE(la->kc_pre, T * d->kv_dim);
    TAKE(la->kc_rstd, T * Hkv);
    TAKE(la->kc, T * d->kv_dim);
    TAKE(la->vc, T * d->kv_dim);
    TAKE(la->attn, R * d->q_dim);
    TAKE(la->lse, R * Hq);
    TAKE(la->h_mid, R * dm);
    TAKE(la->hp, R * dm);
    TAKE(la->rstd_post, R);
    TAKE(la->gu, R * 2 * I);
    TAKE(la->act, R * I);
  }
  TAKE(a->h_last, R * dm);
  TAKE(a->h, R * dm);
  TAKE(a->rstd_final, R);
  TAKE(a->e, R * r);
  TAKE(a->z, R * r);
  TAKE(a->gate, c->markov_type == DS_MARKOV_GATED ? R * r : 0);
  TAKE(a->rnn_s, c->markov_type == DS_MARKOV_RNN ? R * r : 0);
  TAKE(a->rnn_aco, c->markov_type == DS_MARKOV_RNN ? R * 3 * r : 0);
  TAKE(a->conf, R);
#undef TAKE
  return off;
}

static ds_status acts_reserve(ds_draft *d, int64_t R, int64_t T, int64_t n_blocks) {
  draft_acts *a = &d->acts;
  if (R <= a->R && T <= a->T && a->arena) return DS_OK;
  int64_t newR = R > a->R ? R : a->R, newT = T > a->T ? T : a->T;
  acts_free(a);
  a->layers = ds_calloc((size_t)d->cfg.num_layers, sizeof(layer_acts), "draft activations");
  size_t n = layout_acts(d, a, NULL, newR, newT);
  a->arena = ds_malloc_aligned(n * sizeof(float), "draft activations");
  a->pos_blk = ds_malloc((size_t)newR * sizeof(int64_t), "positions");
  a->pos_ctx = ds_malloc((size_t)newT * sizeof(int64_t), "positions");
  a->ctx_len = ds_malloc((size_t)newR * sizeof(int64_t), "context lengths"); /* n_blocks <= R */
  a->prev_ids = ds_malloc((size_t)newR * sizeof(int32_t), "previous ids");
  if (!a->layers || !a->arena || !a->pos_blk || !a->pos_ctx || !a->ctx_len || !a->prev_ids) {
    acts_free(a);
    return DS_ERR_NOMEM;
  }
  a->arena_floats = n;
  layout_acts(d, a, a->arena, newR, newT);
  a->R = newR;
  a->T = newT;
  (void)n_blocks;
  return DS_OK;
}

/* ---------------------------------------------------------------- forward */

static ds_status check_seq(const ds_draft *d, const ds_draft_seq *s) {
  const ds_draft_config *c = &d->cfg;
  if (s->T < 2) return DS_FAIL(DS_ERR_ARG, "draft: sequence of %lld tokens (need at least 2)", (long long)s->T);
  if (s->n_blocks < 1) return DS_FAIL(DS_ERR_ARG, "draft: no blocks");
  for (int64_t t = 0; t < s->T; t++)
    if (s->ids[t] < 0 || s->ids[t] >= c->vocab_size)
      return DS_FAIL(DS_ERR_RANGE, "draft: token id %d at position %lld outside the vocabulary [0, %lld)", s->ids[t],
                     (long long)t, (long long)c->vocab_size);
  for (int64_t b = 0; b < s->n_blocks; b++)
    if (s->block_keep[b] && (s->anchors[b] < 0 || s->anchors[b] > s->T - 2))
      return DS_FAIL(DS_ERR_RANGE, "draft: anchor %lld of block %lld outside [0, %lld]", (long long)s->anchors[b],
                     (long long)b, (long long)(s->T - 2));
  return DS_OK;
}

/* q/k normalization per head, then rope. x_pre (n, H*hd) -> x (n, H*hd). */
static void norm_rope(const ds_draft *d, float *x, float *rstd, const float *x_pre, const float *w, const int64_t *pos,
                      int64_t n, int64_t heads) {
  const ds_backend *be = d->be;
  int64_t hd = d->cfg.head_dim;
  be->rmsnorm(x, rstd, x_pre, w, n * heads, hd, (float)d->cfg.rms_norm_eps);
  be->rope(x, heads * hd, pos, d->inv_freq, n, heads, hd);
}

ds_status draft_forward(ds_draft *d, const ds_draft_seq *s) {
  const ds_draft_config *c = &d->cfg;
  const ds_backend *be = d->be;
  DS_TRY(check_seq(d, s));
  int64_t g = c->block_size, R = s->n_blocks * g, T = s->T, dm = c->hidden_size, I = c->intermediate_size;
  int64_t m = c->n_target_layers;
  float eps = (float)c->rms_norm_eps;
  DS_TRY(acts_reserve(d, R, T, s->n_blocks));
  draft_acts *a = &d->acts;

  for (int64_t t = 0; t < T; t++) a->pos_ctx[t] = t;
  for (int64_t b = 0; b < s->n_blocks; b++) {
    int64_t anchor = s->block_keep[b] ? s->anchors[b] : 0;
    a->ctx_len[b] = s->block_keep[b] ? anchor : -1; /* context keys j < a; none for a dropped block */
    for (int64_t k = 0; k < g; k++) {
      int64_t row = b * g + k, p = anchor + k;
      a->pos_blk[row] = p;
      /* Teacher forcing: slot k's previous token is x_{a+k} (the anchor for k = 0). Past the
       * sequence end the slot is unsupervised; any valid id will do there. */
      a->prev_ids[row] = p < T ? s->ids[p] : 0;
    }
  }

  /* Context projection, once per sequence: H_ctx = hidden_norm(ctx @ fc^T). */
  be->linear(a->fc_out, s->ctx, d->w.fc, NULL, T, m * dm, dm);
  be->rmsnorm(a->hctx, a->hctx_rstd, a->fc_out, d->w.hidden_norm, T, dm, eps);

  /* Block input: [x_a, M, ..., M] embedded with the frozen table. */
  float *h = a->layers[0].h_in;
  for (int64_t b = 0; b < s->n_blocks; b++)
    for (int64_t k = 0; k < g; k++) {
      int32_t tok = k == 0 && s->block_keep[b] ? s->ids[s->anchors[b]] : c->mask_token_id;
      be->embedding_w(h + (b * g + k) * dm, &tok, d->embed, 1, dm);
    }

  float scale = 1.0f / sqrtf((float)c->head_dim);
  for (int64_t l = 0; l < c->num_layers; l++) {
    const draft_layer *w = &d->w.layers[l];
    layer_acts *la = &a->layers[l];
    be->rmsnorm(la->hn, la->rstd_in, la->h_in, w->in_norm, R, dm, eps);
    be->linear(la->q_pre, la->hn, w->wq, NULL, R, dm, d->q_dim);
    be->linear(la->kb_pre, la->hn, w->wk, NULL, R, dm, d->kv_dim);
    be->linear(la->vb, la->hn, w->wv, NULL, R, dm, d->kv_dim);
    /* The same k/v projections serve the context, computed once for all blocks. */
    be->linear(la->kc_pre, a->hctx, w->wk, NULL, T, dm, d->kv_dim);
    be->linear(la->vc, a->hctx, w->wv, NULL, T, dm, d->kv_dim);
    norm_rope(d, la->q, la->q_rstd, la->q_pre, w->q_norm, a->pos_blk, R, c->num_attention_heads);
    norm_rope(d, la->kb, la->kb_rstd, la->kb_pre, w->k_norm, a->pos_blk, R, c->num_key_value_heads);
    norm_rope(d, la->kc, la->kc_rstd, la->kc_pre, w->k_norm, a->pos_ctx, T, c->num_key_value_heads);
    be->block_attention(la->attn, la->lse, la->q, la->kc, la->vc, la->kb, la->vb, a->ctx_len, T, s->n_blocks, g,
                        c->num_attention_heads, c->num_key_value_heads, c->head_dim, scale);
    /* h_mid = h_in + o_proj(attn) */
    be->linear(la->h_mid, la->attn, w->wo, NULL, R, d->q_dim, dm);
    be->add(la->h_mid, la->h_in, R * dm);
    be->rmsnorm(la->hp, la->rstd_post, la->h_mid, w->post_norm, R, dm, eps);
    /* gate_proj and up_proj are adjacent in the parameter buffer: one (2I, d) matmul. */
    be->linear(la->gu, la->hp, w->w_gate, NULL, R, dm, 2 * I);
    be->swiglu(la->act, la->gu, R, I);
    float *out = l + 1 < c->num_layers ? a->layers[l + 1].h_in : a->h_last;
    be->linear(out, la->act, w->w_down, NULL, R, I, dm);
    be->add(out, la->h_mid, R * dm);
  }
  be->rmsnorm(a->h, a->rstd_final, a->h_last, d->w.norm, R, dm, eps);
  markov_head_forward(d, R);
  return DS_OK;
}

void draft_block_logits(ds_draft *d, int64_t r0, int64_t c, float *logits, float *scratch) {
  const ds_draft_config *cfg = &d->cfg;
  int64_t dm = cfg->hidden_size, V = d->n_vocab, r = cfg->markov_rank; /* the draft's N columns */
  d->be->linear_w(logits, V, d->acts.h + r0 * dm, d->lm_head, NULL, c, dm, V);
  if (r > 0) {
    /* logits += z @ W2^T: the Markov bias of each slot's previous token. */
    d->be->linear(scratch, d->acts.z + r0 * r, d->w.markov_w2, NULL, c, r, V);
    d->be->add(logits, scratch, c * V);
  }
}

ds_status ds_draft_forward_blocks(ds_draft *d, const ds_draft_seq *seq, float *logits, float *conf_logits) {
  DS_TRY(draft_forward(d, seq));
  int64_t R = seq->n_blocks * d->cfg.block_size, V = d->n_vocab;
  if (logits) {
    /* Row chunks keep the Markov-bias scratch at O(chunk * V). */
    enum { CHUNK = 128 };
    float *scratch = d->cfg.markov_rank > 0 ? ds_malloc_aligned((size_t)(CHUNK * V) * sizeof(float), "logit scratch") : NULL;
    if (d->cfg.markov_rank > 0 && !scratch) return DS_ERR_NOMEM;
    for (int64_t r0 = 0; r0 < R; r0 += CHUNK)
      draft_block_logits(d, r0, R - r0 < CHUNK ? R - r0 : CHUNK, logits + r0 * V, scratch);
    ds_free_aligned(scratch);
  }
  if (conf_logits && d->cfg.enable_confidence_head) memcpy(conf_logits, d->acts.conf, (size_t)R * sizeof(float));
  return DS_OK;
}
