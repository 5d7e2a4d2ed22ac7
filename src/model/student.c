/* The student's construction: its tensor table (HF names and shapes, the layout of the flat
 * parameter and gradient buffers), seeded initialization as transformers draws it, and the
 * accessors of include/dspark/student.h. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_util.h"
#include "dspark/fileio.h"
#include "dspark/rng.h"
#include "model/rope_freq.h"
#include "model/student_internal.h"

/* ---------------------------------------------------------------- tensor table */

typedef struct {
  student_spec *v;
  size_t n, cap;
  int failed;
} spec_list;

static void add_spec(spec_list *l, const char *name, int64_t rows, int64_t cols, int init, float **slot,
                     float **grad_slot) {
  if (l->failed) return;
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 64;
    student_spec *v = realloc(l->v, cap * sizeof *v);
    if (!v) { l->failed = 1; return; }
    l->v = v;
    l->cap = cap;
  }
  char *copy = strdup(name);
  if (!copy) { l->failed = 1; return; }
  l->v[l->n++] = (student_spec){copy, rows, cols, init, 0, slot, grad_slot};
}

enum { INIT_NORMAL = 0, INIT_ONES = 1, INIT_ZEROS = 2 };

/* HF names in the order of the flat buffers. gate/up weights and their biases are adjacent
 * (the MLP runs them as one (2I, d) matmul). */
static void build_specs(ds_student *s, spec_list *l) {
  const ds_model_config *c = &s->cfg;
  int64_t d = c->hidden_size, V = c->vocab_size, I = c->intermediate_size, hd = c->head_dim;
  char name[160];
  add_spec(l, "model.embed_tokens.weight", V, d, INIT_NORMAL, &s->w.embed, &s->g.embed);
  for (int64_t i = 0; i < c->num_hidden_layers; i++) {
    student_layer *w = &s->w.layers[i], *g = &s->g.layers[i];
#define LAYER(suffix, rows, cols, init, field)                                 \
  do {                                                                         \
    snprintf(name, sizeof name, "model.layers.%lld.%s", (long long)i, suffix); \
    add_spec(l, name, rows, cols, init, &w->field, &g->field);                 \
  } while (0)
    LAYER("self_attn.q_proj.weight", s->q_dim, d, INIT_NORMAL, wq);
    if (c->attention_bias) LAYER("self_attn.q_proj.bias", s->q_dim, 0, INIT_ZEROS, bq);
    LAYER("self_attn.k_proj.weight", s->kv_dim, d, INIT_NORMAL, wk);
    if (c->attention_bias) LAYER("self_attn.k_proj.bias", s->kv_dim, 0, INIT_ZEROS, bk);
    LAYER("self_attn.v_proj.weight", s->kv_dim, d, INIT_NORMAL, wv);
    if (c->attention_bias) LAYER("self_attn.v_proj.bias", s->kv_dim, 0, INIT_ZEROS, bv);
    LAYER("self_attn.o_proj.weight", d, s->q_dim, INIT_NORMAL, wo);
    if (c->o_proj_bias) LAYER("self_attn.o_proj.bias", d, 0, INIT_ZEROS, bo);
    if (c->qk_norm) {
      LAYER("self_attn.q_norm.weight", hd, 0, INIT_ONES, q_norm);
      LAYER("self_attn.k_norm.weight", hd, 0, INIT_ONES, k_norm);
    }
    LAYER("mlp.gate_proj.weight", I, d, INIT_NORMAL, w_gate);
    LAYER("mlp.up_proj.weight", I, d, INIT_NORMAL, w_up);
    if (c->mlp_bias) {
      LAYER("mlp.gate_proj.bias", I, 0, INIT_ZEROS, b_gate);
      LAYER("mlp.up_proj.bias", I, 0, INIT_ZEROS, b_up);
    }
    LAYER("mlp.down_proj.weight", d, I, INIT_NORMAL, w_down);
    if (c->mlp_bias) LAYER("mlp.down_proj.bias", d, 0, INIT_ZEROS, b_down);
    LAYER("input_layernorm.weight", d, 0, INIT_ONES, in_norm);
    LAYER("post_attention_layernorm.weight", d, 0, INIT_ONES, post_norm);
#undef LAYER
  }
  add_spec(l, "model.norm.weight", d, 0, INIT_ONES, &s->w.norm, &s->g.norm);
  if (!s->tied) add_spec(l, "lm_head.weight", V, d, INIT_NORMAL, &s->w.lm_head, &s->g.lm_head);
}

static size_t spec_numel(const student_spec *sp) { return (size_t)sp->rows * (size_t)(sp->cols ? sp->cols : 1); }

/* Points the weight structs and the tensor table into the flat buffers (again after they move). */
static void point_views(ds_student *s) {
  for (size_t i = 0; i < s->n_specs; i++) {
    student_spec *sp = &s->specs[i];
    *sp->slot = s->params + sp->offset;
    *sp->grad_slot = s->grads + sp->offset;
    s->tensors[i] = (ds_student_tensor){sp->name, *sp->slot, *sp->grad_slot, sp->cols ? 2 : 1, {sp->rows, sp->cols}};
  }
  if (s->tied) {
    s->w.lm_head = s->w.embed;
    s->g.lm_head = s->g.embed;
  }
}

ds_status student_create(const ds_model_config *cfg, const char *config_json, int tied, double init_range,
                         int64_t pad_token_id, const ds_backend *be, ds_student **out) {
  *out = NULL;
  if (cfg->head_dim > 2048)
    return DS_FAIL(DS_ERR_UNSUPPORTED, "student: head_dim %lld exceeds 2048", (long long)cfg->head_dim);
  ds_student *s = ds_calloc(1, sizeof *s, "student");
  if (!s) return DS_ERR_NOMEM;
  s->cfg = *cfg;
  s->tied = tied;
  s->initializer_range = init_range;
  s->pad_token_id = pad_token_id;
  s->be = be ? be : ds_backend_cpu();
  s->q_dim = cfg->num_attention_heads * cfg->head_dim;
  s->kv_dim = cfg->num_key_value_heads * cfg->head_dim;
  s->config_json = strdup(config_json);
  s->w.layers = ds_calloc((size_t)cfg->num_hidden_layers, sizeof(student_layer), "student layers");
  s->g.layers = ds_calloc((size_t)cfg->num_hidden_layers, sizeof(student_layer), "student layers");
  s->inv_freq = ds_malloc((size_t)cfg->head_dim / 2 * sizeof(float), "rope table");
  spec_list l = {0};
  if (!s->config_json || !s->w.layers || !s->g.layers || !s->inv_freq) goto nomem;
  ds_rope_inv_freq(cfg, s->inv_freq);
  build_specs(s, &l);
  s->specs = l.v;
  s->n_specs = l.n;
  if (l.failed) goto nomem;
  size_t n = 0;
  for (size_t i = 0; i < l.n; i++) {
    l.v[i].offset = n;
    n += spec_numel(&l.v[i]);
  }
  s->n_params = n;
  s->params = ds_malloc_aligned(n * sizeof(float), "student parameters");
  s->grads = ds_malloc_aligned(n * sizeof(float), "student gradients");
  s->tensors = ds_calloc(l.n, sizeof *s->tensors, "student tensor table");
  if (!s->params || !s->grads || !s->tensors) goto nomem;
  memset(s->params, 0, n * sizeof(float));
  memset(s->grads, 0, n * sizeof(float));
  point_views(s);
  /* The MLP runs gate and up as one (2I, d) matmul (with one (2I) bias). */
  for (int64_t i = 0; i < cfg->num_hidden_layers; i++) {
    const student_layer *w = &s->w.layers[i];
    DS_CHECK(w->w_up == w->w_gate + cfg->intermediate_size * cfg->hidden_size);
    DS_CHECK(!cfg->mlp_bias || w->b_up == w->b_gate + cfg->intermediate_size);
  }
  *out = s;
  return DS_OK;
nomem:
  if (!s->specs) s->specs = l.v, s->n_specs = l.n;
  ds_student_free(s);
  return DS_FAIL(DS_ERR_NOMEM, "student: out of memory building a model of %lld parameters",
                 (long long)ds_config_num_params(cfg));
}

void ds_student_free(ds_student *s) {
  if (!s) return;
  student_acts_free(&s->acts);
  ds_free_aligned(s->dscratch);
  ds_free_aligned(s->workspace);
  for (size_t i = 0; i < s->n_specs; i++) free((char *)s->specs[i].name);
  free(s->specs);
  free(s->tensors);
  ds_free_aligned(s->params);
  ds_free_aligned(s->grads);
  free(s->w.layers);
  free(s->g.layers);
  free(s->inv_freq);
  free(s->config_json);
  free(s);
}

/* ---------------------------------------------------------------- fresh students */

ds_status student_config_extras(const char *json, size_t len, const char *label, const ds_model_config *cfg,
                                double *init_range, int64_t *pad_token_id) {
  ds_status st;
  cJSON *root = ds_json_parse(json, len, label, &st);
  if (!root) return st;
  *init_range = 0.02;
  *pad_token_id = -1;
  const cJSON *ir = cJSON_GetObjectItemCaseSensitive(root, "initializer_range");
  if (ir && !cJSON_IsNull(ir)) {
    st = ds_json_num(root, "initializer_range", 1, 0.02, label, init_range);
    if (st == DS_OK && !(*init_range >= 0 && *init_range <= 1))
      st = DS_FAIL(DS_ERR_FORMAT, "%s: initializer_range %g outside [0, 1]", label, *init_range);
    if (*init_range == 0) *init_range = 0.02; /* transformers: `config.initializer_range or 0.02` */
  }
  const cJSON *pad = cJSON_GetObjectItemCaseSensitive(root, "pad_token_id");
  if (st == DS_OK && pad && !cJSON_IsNull(pad))
    st = ds_json_int(root, "pad_token_id", 1, -1, 0, cfg->vocab_size - 1, label, pad_token_id);
  cJSON_Delete(root);
  return st;
}

/* Box-Muller normal from the seeded stream: the same seed gives the same weights. */
static float normal01(ds_rng *rng) {
  double u1 = ds_rng_uniform_f64(rng), u2 = ds_rng_uniform_f64(rng);
  if (u1 < 1e-300) u1 = 1e-300;
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

ds_status ds_student_new(const char *config_json, size_t len, const char *label, uint64_t seed,
                         const ds_backend *backend, ds_student **out) {
  *out = NULL;
  ds_model_config cfg;
  double init_range;
  int64_t pad;
  DS_TRY(ds_config_parse(config_json, len, label, &cfg));
  DS_TRY(student_config_extras(config_json, len, label, &cfg, &init_range, &pad));
  char *text = ds_malloc(len + 1, "config text");
  if (!text) return DS_ERR_NOMEM;
  memcpy(text, config_json, len);
  text[len] = 0;
  ds_status st = student_create(&cfg, text, cfg.tie_word_embeddings, init_range, pad, backend, out);
  free(text);
  if (st != DS_OK) return st;
  ds_student *s = *out;
  ds_rng rng;
  ds_rng_seed(&rng, seed);
  float std = (float)init_range;
  for (size_t i = 0; i < s->n_specs; i++) {
    const student_spec *sp = &s->specs[i];
    float *x = s->params + sp->offset;
    size_t n = spec_numel(sp);
    for (size_t k = 0; k < n; k++)
      x[k] = sp->init == INIT_ONES ? 1.0f : sp->init == INIT_ZEROS ? 0.0f : std * normal01(&rng);
  }
  if (pad >= 0) memset(s->w.embed + pad * cfg.hidden_size, 0, (size_t)cfg.hidden_size * sizeof(float));
  return DS_OK;
}

ds_status ds_student_new_from_file(const char *config_path, uint64_t seed, const ds_backend *backend,
                                   ds_student **out) {
  char *text;
  size_t len;
  *out = NULL;
  DS_TRY(ds_read_file(config_path, &text, &len));
  ds_status st = ds_student_new(text, len, config_path, seed, backend, out);
  free(text);
  return st;
}

/* ---------------------------------------------------------------- accessors */

const ds_model_config *ds_student_config(const ds_student *s) { return &s->cfg; }
int ds_student_is_tied(const ds_student *s) { return s->tied; }
int64_t ds_student_pad_token_id(const ds_student *s) { return s->pad_token_id; }
const ds_backend *ds_student_backend(const ds_student *s) { return s->be; }
float *ds_student_params(ds_student *s) { return s->params; }
float *ds_student_grads(ds_student *s) { return s->grads; }
size_t ds_student_num_params(const ds_student *s) { return s->n_params + s->n_extra; }
void ds_student_zero_grads(ds_student *s) { memset(s->grads, 0, (s->n_params + s->n_extra) * sizeof(float)); }
float *ds_student_extra_params(ds_student *s) { return s->n_extra ? s->params + s->n_params : NULL; }
float *ds_student_extra_grads(ds_student *s) { return s->n_extra ? s->grads + s->n_params : NULL; }

ds_status ds_student_set_extra_params(ds_student *s, size_t n) {
  size_t keep = s->n_params + (n < s->n_extra ? n : s->n_extra), total = s->n_params + n;
  float *p = ds_malloc_aligned((total ? total : 1) * sizeof(float), "student parameters");
  float *g = ds_malloc_aligned((total ? total : 1) * sizeof(float), "student gradients");
  if (!p || !g) {
    ds_free_aligned(p);
    ds_free_aligned(g);
    return DS_FAIL(DS_ERR_NOMEM, "student: out of memory for %zu extra parameters", n);
  }
  memcpy(p, s->params, keep * sizeof(float));
  memcpy(g, s->grads, keep * sizeof(float));
  memset(p + keep, 0, (total - keep) * sizeof(float));
  memset(g + keep, 0, (total - keep) * sizeof(float));
  ds_free_aligned(s->params);
  ds_free_aligned(s->grads);
  s->params = p;
  s->grads = g;
  s->n_extra = n;
  point_views(s);
  return DS_OK;
}
size_t ds_student_tensor_count(const ds_student *s) { return s->n_specs; }
const ds_student_tensor *ds_student_tensor_at(const ds_student *s, size_t i) {
  return i < s->n_specs ? &s->tensors[i] : NULL;
}

void *ds_student_workspace(ds_student *s, size_t bytes) {
  if (bytes > s->workspace_bytes) {
    ds_free_aligned(s->workspace);
    s->workspace = ds_malloc_aligned(bytes, "student workspace");
    s->workspace_bytes = s->workspace ? bytes : 0;
  }
  return s->workspace;
}
