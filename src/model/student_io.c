/* The student in HF layout (include/dspark/student.h): loading a checkpoint directory as the
 * target (and transformers) reads it, reading its tensors back from a checkpoint, and export:
 * config.json of its family with every size resolved plus model.safetensors with the family's
 * tensor names, which transformers and ds_target_load read unchanged. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_util.h"
#include "dspark/dtype.h"
#include "dspark/fileio.h"
#include "dspark/model_source.h"
#include "model/student_internal.h"

static const char k_embed[] = "model.embed_tokens.weight", k_head[] = "lm_head.weight";

/* ---------------------------------------------------------------- loading */

/* Shape of one 2-D tensor, checked before the weights are allocated: a config whose sizes
 * disagree with the checkpoint (often a field left to its class default) is refused before
 * allocating what those sizes would need. */
static ds_status expect_shape(const ds_checkpoint *ck, const char *name, int64_t rows, int64_t cols) {
  const ds_tensor_view *v = ds_ckpt_find(ck, name);
  if (!v || (v->ndim == 2 && v->shape[0] == rows && v->shape[1] == cols)) return DS_OK; /* absent: the read says */
  return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' has %d dims [%lld, ...] but [%lld, %lld] was expected", v->file, name,
                 v->ndim, (long long)v->shape[0], (long long)rows, (long long)cols);
}

static ds_status preflight(const ds_model_config *c, const ds_checkpoint *ck) {
  int64_t d = c->hidden_size, hd = c->head_dim;
  DS_TRY(expect_shape(ck, k_embed, c->vocab_size, d));
  DS_TRY(expect_shape(ck, k_head, c->vocab_size, d));
  DS_TRY(expect_shape(ck, "model.layers.0.self_attn.q_proj.weight", c->num_attention_heads * hd, d));
  DS_TRY(expect_shape(ck, "model.layers.0.self_attn.k_proj.weight", c->num_key_value_heads * hd, d));
  DS_TRY(expect_shape(ck, "model.layers.0.mlp.gate_proj.weight", c->intermediate_size, d));
  return DS_OK;
}

/* With tie_word_embeddings and both tables stored, transformers ties them only when they are
 * equal; *equal says whether they are. */
static ds_status tables_equal(const ds_checkpoint *ck, const ds_model_config *c, int *equal) {
  size_t n = (size_t)(c->vocab_size * c->hidden_size);
  int64_t shape[2] = {c->vocab_size, c->hidden_size};
  float *e = ds_malloc_aligned(n * sizeof(float), "embedding table"), *h = ds_malloc_aligned(n * sizeof(float), "head");
  ds_status st = e && h ? DS_OK : DS_ERR_NOMEM;
  if (st == DS_OK) st = ds_ckpt_read_f32(ck, k_embed, 2, shape, e);
  if (st == DS_OK) st = ds_ckpt_read_f32(ck, k_head, 2, shape, h);
  if (st == DS_OK) *equal = memcmp(e, h, n * sizeof(float)) == 0;
  ds_free_aligned(e);
  ds_free_aligned(h);
  return st;
}

static ds_status read_all(ds_student *s, const ds_checkpoint *ck, int embed_from_head) {
  for (size_t i = 0; i < s->n_specs; i++) {
    const ds_student_tensor *t = &s->tensors[i];
    const char *name = embed_from_head && t->data == s->w.embed ? k_head : t->name;
    int64_t shape[2] = {t->shape[0], t->shape[1]};
    DS_TRY(ds_ckpt_read_f32(ck, name, t->ndim, shape, t->data));
  }
  return DS_OK;
}

ds_status ds_student_load_hf(const char *model_dir, const ds_backend *backend, ds_student **out) {
  *out = NULL;
  ds_model_source *src;
  DS_TRY(ds_model_source_open(model_dir, &src));
  ds_model_config cfg;
  const char *text = NULL, *label = ds_model_source_label(src, DS_MODEL_CONFIG);
  size_t len = 0;
  double init_range = 0.02;
  int64_t pad = -1;
  ds_checkpoint *ck = NULL;
  ds_status st = ds_model_source_config(src, &cfg);
  if (st == DS_OK) st = ds_model_source_text(src, DS_MODEL_CONFIG, 1, &text, &len);
  if (st == DS_OK) st = student_config_extras(text, len, label, &cfg, &init_range, &pad);
  if (st == DS_OK) st = ds_model_source_weights(src, &ck);
  if (st == DS_OK) st = preflight(&cfg, ck);
  int tied = cfg.tie_word_embeddings, has_embed = 0, has_head = 0;
  if (st == DS_OK) {
    has_embed = ds_ckpt_find(ck, k_embed) != NULL;
    has_head = ds_ckpt_find(ck, k_head) != NULL;
    if (tied && has_embed && has_head) st = tables_equal(ck, &cfg, &tied);
  }
  if (st == DS_OK) st = student_create(&cfg, text, tied, init_range, pad, backend, out);
  if (st == DS_OK) st = read_all(*out, ck, tied && !has_embed && has_head);
  if ((st == DS_ERR_FORMAT || st == DS_ERR_NOT_FOUND) && cfg.defaulted[0])
    ds_error_wrap(st, "%s leaves these fields to %s's defaults (as transformers does): %s", label,
                  ds_config_class_name(cfg.arch), cfg.defaulted);
  if (st != DS_OK) {
    ds_student_free(*out);
    *out = NULL;
  }
  ds_ckpt_close(ck);
  ds_model_source_close(src);
  return st;
}

ds_status ds_student_read_tensors(ds_student *s, const ds_safetensors *st, const char *prefix) {
  char name[256];
  for (size_t i = 0; i < s->n_specs; i++) {
    const ds_student_tensor *t = &s->tensors[i];
    snprintf(name, sizeof name, "%s%s", prefix, t->name);
    const ds_tensor_view *v = ds_st_find(st, name);
    if (!v) return DS_FAIL(DS_ERR_NOT_FOUND, "%s: tensor '%s' is missing", ds_st_path(st), name);
    if (v->ndim != t->ndim || v->shape[0] != t->shape[0] || (t->ndim == 2 && v->shape[1] != t->shape[1]))
      return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' has shape [%lld%s%lld] but the student needs [%lld, %lld]",
                     ds_st_path(st), name, (long long)v->shape[0], v->ndim > 1 ? ", " : " ",
                     (long long)(v->ndim > 1 ? v->shape[1] : 0), (long long)t->shape[0], (long long)t->shape[1]);
    ds_status cs = ds_convert_to_f32(t->data, v->data, v->dtype, (size_t)v->numel);
    if (cs != DS_OK) return ds_error_wrap(cs, "%s: tensor '%s'", ds_st_path(st), name);
    for (int64_t k = 0; k < v->numel; k++)
      if (!isfinite(t->data[k]))
        return DS_FAIL(DS_ERR_NUMERIC, "%s: tensor '%s' holds %s at element %lld (a non-finite weight)", ds_st_path(st),
                       name, isnan(t->data[k]) ? "NaN" : t->data[k] > 0 ? "+inf" : "-inf", (long long)k);
  }
  return DS_OK;
}

/* ---------------------------------------------------------------- export */

static ds_status set_item(cJSON *obj, const char *key, cJSON *item) {
  if (!item) return DS_FAIL(DS_ERR_NOMEM, "student config.json: cannot build key '%s'", key);
  if (cJSON_GetObjectItemCaseSensitive(obj, key)) cJSON_ReplaceItemInObjectCaseSensitive(obj, key, item);
  else cJSON_AddItemToObject(obj, key, item);
  return DS_OK;
}

static ds_status set_num(cJSON *obj, const char *key, double v) { return set_item(obj, key, cJSON_CreateNumber(v)); }

static ds_status add_student_keys(const ds_student *s, cJSON *root) {
  const ds_model_config *c = &s->cfg;
  const char *arch[] = {c->architecture};
  DS_TRY(set_item(root, "architectures", cJSON_CreateStringArray(arch, 1)));
  DS_TRY(set_item(root, "model_type", cJSON_CreateString(ds_arch_name(c->arch))));
  DS_TRY(set_num(root, "vocab_size", (double)c->vocab_size));
  DS_TRY(set_num(root, "hidden_size", (double)c->hidden_size));
  DS_TRY(set_num(root, "intermediate_size", (double)c->intermediate_size));
  DS_TRY(set_num(root, "num_hidden_layers", (double)c->num_hidden_layers));
  DS_TRY(set_num(root, "num_attention_heads", (double)c->num_attention_heads));
  DS_TRY(set_num(root, "num_key_value_heads", (double)c->num_key_value_heads));
  DS_TRY(set_num(root, "head_dim", (double)c->head_dim));
  DS_TRY(set_num(root, "max_position_embeddings", (double)c->max_position_embeddings));
  DS_TRY(set_num(root, "rms_norm_eps", c->rms_norm_eps));
  DS_TRY(set_num(root, "initializer_range", s->initializer_range));
  DS_TRY(set_item(root, "hidden_act", cJSON_CreateString("silu")));
  DS_TRY(set_item(root, "tie_word_embeddings", cJSON_CreateBool(s->tied)));
  if (c->arch == DS_ARCH_LLAMA) DS_TRY(set_item(root, "mlp_bias", cJSON_CreateBool(c->mlp_bias)));
  if (c->arch != DS_ARCH_QWEN2) DS_TRY(set_item(root, "attention_bias", cJSON_CreateBool(c->attention_bias)));
  DS_TRY(set_item(root, "dtype", cJSON_CreateString("float32")));
  if (cJSON_GetObjectItemCaseSensitive(root, "torch_dtype"))
    DS_TRY(set_item(root, "torch_dtype", cJSON_CreateString("float32")));
  return DS_OK;
}

ds_status ds_student_config_json(const ds_student *s, char **out) {
  *out = NULL;
  ds_status st;
  cJSON *root = ds_json_parse(s->config_json, strlen(s->config_json), "student config.json", &st);
  if (!root) return st;
  if ((st = add_student_keys(s, root)) == DS_OK) {
    *out = cJSON_Print(root);
    if (!*out) st = DS_FAIL(DS_ERR_NOMEM, "student config.json: out of memory");
  }
  cJSON_Delete(root);
  return st;
}

ds_status ds_student_export_hf(const ds_student *s, const char *out_dir) {
  char *text = NULL;
  DS_TRY(ds_student_config_json(s, &text));
  ds_st_writer *w = ds_st_writer_new();
  ds_status st = w ? DS_OK : DS_FAIL(DS_ERR_NOMEM, "student export: out of memory");
  for (size_t i = 0; st == DS_OK && i < s->n_specs; i++) {
    const ds_student_tensor *t = &s->tensors[i];
    int64_t shape[2] = {t->shape[0], t->shape[1]};
    st = ds_st_writer_add(w, t->name, DS_F32, t->ndim, shape, t->data);
  }
  if (st == DS_OK) st = ds_st_writer_write_hf_dir(w, out_dir, text);
  ds_st_writer_free(w);
  free(text);
  return st;
}
