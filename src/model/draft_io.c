/* The HF layout of an exported draft (spec section 7): config.json = the target's config
 * plus the draft keys, model.safetensors with the section 7 tensor names. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "dspark/fileio.h"
#include "core/json_util.h"
#include "dspark/dtype.h"
#include "model/draft_internal.h"

static ds_status set_item(cJSON *obj, const char *key, cJSON *item) {
  if (!item) return DS_FAIL(DS_ERR_NOMEM, "cannot build config.json key '%s'", key);
  if (cJSON_GetObjectItemCaseSensitive(obj, key)) cJSON_ReplaceItemInObjectCaseSensitive(obj, key, item);
  else cJSON_AddItemToObject(obj, key, item);
  return DS_OK;
}

static ds_status add_draft_keys(const ds_draft_config *c, cJSON *root) {
  const char *arch[] = {"Qwen3DSparkModel"};
  cJSON *ids = cJSON_CreateIntArray(c->target_layer_ids, c->n_target_layers);
  cJSON *types = cJSON_CreateArray();
  for (int64_t i = 0; types && i < c->num_layers; i++) cJSON_AddItemToArray(types, cJSON_CreateString("full_attention"));
  DS_TRY(set_item(root, "architectures", cJSON_CreateStringArray(arch, 1)));
  DS_TRY(set_item(root, "num_hidden_layers", cJSON_CreateNumber((double)c->num_layers)));
  DS_TRY(set_item(root, "num_target_layers", cJSON_CreateNumber((double)c->num_target_layers)));
  DS_TRY(set_item(root, "block_size", cJSON_CreateNumber((double)c->block_size)));
  DS_TRY(set_item(root, "mask_token_id", cJSON_CreateNumber(c->mask_token_id)));
  DS_TRY(set_item(root, "target_layer_ids", ids));
  DS_TRY(set_item(root, "num_anchors", cJSON_CreateNumber((double)c->num_anchors)));
  DS_TRY(set_item(root, "enable_confidence_head", cJSON_CreateBool(c->enable_confidence_head)));
  DS_TRY(set_item(root, "confidence_head_with_markov", cJSON_CreateBool(c->confidence_head_with_markov)));
  DS_TRY(set_item(root, "markov_rank", cJSON_CreateNumber((double)c->markov_rank)));
  DS_TRY(set_item(root, "markov_head_type", cJSON_CreateString(ds_markov_type_name(c->markov_type))));
  DS_TRY(set_item(root, "tie_word_embeddings", cJSON_CreateFalse()));
  DS_TRY(set_item(root, "layer_types", types));
  /* A reduced vocabulary: EAGLE-3 / speculators / vLLM's key (lm_head and markov_w2 rows; d2t
   * and t2d map them). A full-vocabulary draft writes none, as before. */
  if (c->draft_vocab_size > 0) DS_TRY(set_item(root, "draft_vocab_size", cJSON_CreateNumber((double)c->draft_vocab_size)));
  else cJSON_DeleteItemFromObjectCaseSensitive(root, "draft_vocab_size");
  /* The draft's layers are Qwen3-style whatever the target family: no attention bias. */
  DS_TRY(set_item(root, "attention_bias", cJSON_CreateFalse()));
  DS_TRY(set_item(root, "head_dim", cJSON_CreateNumber((double)c->head_dim)));
  /* The sizes as resolved from the target's config: a field the target's config.json leaves to
   * its family's class default (Llama's num_key_value_heads, Qwen's max_position_embeddings)
   * would take Qwen3Config's default in a reader of this file, which differs. */
  DS_TRY(set_item(root, "vocab_size", cJSON_CreateNumber((double)c->vocab_size)));
  DS_TRY(set_item(root, "hidden_size", cJSON_CreateNumber((double)c->hidden_size)));
  DS_TRY(set_item(root, "intermediate_size", cJSON_CreateNumber((double)c->intermediate_size)));
  DS_TRY(set_item(root, "num_attention_heads", cJSON_CreateNumber((double)c->num_attention_heads)));
  DS_TRY(set_item(root, "num_key_value_heads", cJSON_CreateNumber((double)c->num_key_value_heads)));
  DS_TRY(set_item(root, "rms_norm_eps", cJSON_CreateNumber(c->rms_norm_eps)));
  if (c->rope_source.max_position_embeddings > 0) /* 0: a config built by hand, without a target's */
    DS_TRY(set_item(root, "max_position_embeddings", cJSON_CreateNumber((double)c->rope_source.max_position_embeddings)));
  /* vLLM versions that size fc from dflash_config.target_layer_ids (m*d inputs) read the
   * captured layers there, not from the top-level keys; newer vLLM and NeMo AutoModel ignore
   * it. Both copies are written, and a reader refuses a file where they disagree. */
  cJSON *dflash = cJSON_CreateObject();
  if (dflash) {
    cJSON_AddItemToObject(dflash, "target_layer_ids", cJSON_CreateIntArray(c->target_layer_ids, c->n_target_layers));
    cJSON_AddItemToObject(dflash, "mask_token_id", cJSON_CreateNumber(c->mask_token_id));
  }
  DS_TRY(set_item(root, "dflash_config", dflash));
  return DS_OK;
}

/* dflash_config, when present, must repeat the top-level target_layer_ids and mask_token_id. */
static ds_status check_dflash_config(const cJSON *root, const char *label, const ds_draft_config *c) {
  const cJSON *dc = cJSON_GetObjectItemCaseSensitive(root, "dflash_config");
  if (!dc || cJSON_IsNull(dc)) return DS_OK;
  if (!cJSON_IsObject(dc)) return DS_FAIL(DS_ERR_FORMAT, "%s: field 'dflash_config' must be an object", label);
  const cJSON *ids = cJSON_GetObjectItemCaseSensitive(dc, "target_layer_ids");
  if (ids) {
    int same = cJSON_IsArray(ids) && cJSON_GetArraySize(ids) == c->n_target_layers;
    for (int i = 0; same && i < c->n_target_layers; i++) {
      const cJSON *it = cJSON_GetArrayItem(ids, i);
      same = cJSON_IsNumber(it) && it->valuedouble == (double)c->target_layer_ids[i];
    }
    if (!same)
      return DS_FAIL(DS_ERR_FORMAT, "%s: dflash_config.target_layer_ids disagrees with the top-level target_layer_ids "
                     "(%d layers); both must name the same captured layers", label, c->n_target_layers);
  }
  const cJSON *mask = cJSON_GetObjectItemCaseSensitive(dc, "mask_token_id");
  if (mask && !(cJSON_IsNumber(mask) && mask->valuedouble == (double)c->mask_token_id))
    return DS_FAIL(DS_ERR_FORMAT, "%s: dflash_config.mask_token_id disagrees with the top-level mask_token_id %d", label,
                   c->mask_token_id);
  return DS_OK;
}

ds_status ds_draft_hf_config_json(const ds_draft *d, const char *target_config_json, char **out) {
  *out = NULL;
  ds_status st;
  cJSON *root = ds_json_parse(target_config_json, strlen(target_config_json), "target config.json", &st);
  if (!root) return st;
  if ((st = add_draft_keys(&d->cfg, root)) == DS_OK) {
    *out = cJSON_Print(root);
    if (!*out) st = DS_FAIL(DS_ERR_NOMEM, "draft config.json: out of memory");
  }
  cJSON_Delete(root);
  return st;
}

ds_status ds_draft_export_hf(const ds_draft *d, const char *target_config_json, const char *out_dir) {
  char *text = NULL;
  DS_TRY(ds_draft_hf_config_json(d, target_config_json, &text));
  ds_st_writer *w = ds_st_writer_new();
  ds_status st = w ? DS_OK : DS_FAIL(DS_ERR_NOMEM, "export: out of memory");
  for (size_t i = 0; st == DS_OK && i < d->n_specs; i++) {
    const ds_draft_tensor *t = &d->tensors[i];
    int64_t shape[2] = {t->shape[0], t->shape[1]};
    st = ds_st_writer_add(w, t->name, t->dtype, t->ndim, shape, t->data);
  }
  /* Marks the file as ours: an export interrupted before config.json is still recognized. */
  if (st == DS_OK) st = ds_st_writer_set_metadata(w, DS_EXPORT_MARKER_KEY, "1");
  if (st == DS_OK) st = ds_st_writer_write_hf_dir(w, out_dir, text);
  ds_st_writer_free(w);
  free(text);
  return st;
}

static ds_status parse_draft_object(cJSON *root, const char *label, ds_draft_config *c) {
  memset(c, 0, sizeof *c);
  int64_t n_layers = 0, n_target = 0, v = 0;
  DS_TRY(ds_json_int(root, "num_hidden_layers", 1, 0, 1, 256, label, &n_layers));
  DS_TRY(ds_json_int(root, "num_target_layers", 1, 0, 1, 4096, label, &n_target));
  /* The target fields (sizes, rope) go through the target parser: present the object as the
   * target it was copied from. */
  const char *arch[] = {"Qwen3ForCausalLM"};
  DS_TRY(set_item(root, "architectures", cJSON_CreateStringArray(arch, 1)));
  DS_TRY(set_item(root, "num_hidden_layers", cJSON_CreateNumber((double)n_target)));
  cJSON_DeleteItemFromObjectCaseSensitive(root, "layer_types");
  char *text = cJSON_PrintUnformatted(root);
  if (!text) return DS_FAIL(DS_ERR_NOMEM, "%s: out of memory", label);
  ds_model_config tc;
  ds_status st = ds_config_parse(text, strlen(text), label, &tc);
  free(text);
  if (st != DS_OK) return st;
  c->vocab_size = tc.vocab_size;
  c->hidden_size = tc.hidden_size;
  c->intermediate_size = tc.intermediate_size;
  c->num_attention_heads = tc.num_attention_heads;
  c->num_key_value_heads = tc.num_key_value_heads;
  c->head_dim = tc.head_dim;
  c->rms_norm_eps = tc.rms_norm_eps;
  c->rope_source = tc;
  c->num_layers = n_layers;
  c->num_target_layers = n_target;
  DS_TRY(ds_json_int(root, "block_size", 1, 0, 1, 64, label, &c->block_size));
  DS_TRY(ds_json_int(root, "mask_token_id", 1, 0, 0, tc.vocab_size - 1, label, &v));
  c->mask_token_id = (int32_t)v;
  DS_TRY(ds_json_int(root, "num_anchors", 1, 0, 1, INT32_MAX, label, &c->num_anchors));
  DS_TRY(ds_json_int(root, "markov_rank", 1, 0, 0, 1 << 20, label, &c->markov_rank));
  DS_TRY(ds_json_bool(root, "enable_confidence_head", 1, 0, label, &c->enable_confidence_head));
  /* DeepSpec's own configs (its released drafts) leave out what does not apply, with its
   * meaning: confidence_head_with_markov when the confidence head is off (false), and
   * markov_head_type when markov_rank is 0 (no head, whatever type is named). */
  DS_TRY(ds_json_bool(root, "confidence_head_with_markov", c->enable_confidence_head, 0, label,
                      &c->confidence_head_with_markov));
  const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "markov_head_type");
  if (mt && !cJSON_IsNull(mt) && !cJSON_IsString(mt))
    return DS_FAIL(DS_ERR_FORMAT, "%s: field 'markov_head_type' must be a string", label);
  if (cJSON_IsString(mt)) {
    st = ds_markov_type_parse(mt->valuestring, &c->markov_type);
    if (st != DS_OK) return ds_error_wrap(st, "%s", label);
  } else if (c->markov_rank > 0) {
    return DS_FAIL(DS_ERR_FORMAT, "%s: field 'markov_head_type' is missing (markov_rank %lld names a head)", label,
                   (long long)c->markov_rank);
  }
  if (c->markov_rank == 0) {
    c->markov_type = DS_MARKOV_NONE;
    c->confidence_head_with_markov = 0; /* no Markov embedding to feed it */
  }
  /* absent or null: the whole vocabulary (vLLM's reading too) */
  DS_TRY(ds_json_int(root, "draft_vocab_size", 0, 0, 1, tc.vocab_size, label, &c->draft_vocab_size));
  const cJSON *ids = cJSON_GetObjectItemCaseSensitive(root, "target_layer_ids");
  if (!cJSON_IsArray(ids) || cJSON_GetArraySize(ids) < 1 || cJSON_GetArraySize(ids) > DS_MAX_TARGET_LAYERS)
    return DS_FAIL(DS_ERR_FORMAT, "%s: field 'target_layer_ids' must be a list of 1..%d integers", label,
                   DS_MAX_TARGET_LAYERS);
  const cJSON *it;
  cJSON_ArrayForEach(it, ids) {
    /* The range check happens before the cast: a huge value must not overflow int32. */
    if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) || it->valuedouble < -1 ||
        it->valuedouble > 1 << 20)
      return DS_FAIL(DS_ERR_FORMAT, "%s: target_layer_ids entries must be integers in [-1, 2^20]", label);
    c->target_layer_ids[c->n_target_layers++] = (int32_t)it->valuedouble;
  }
  st = ds_draft_config_check(c);
  if (st != DS_OK) return ds_error_wrap(st, "%s", label);
  return check_dflash_config(root, label, c);
}

ds_status ds_draft_config_from_json(const char *json, size_t len, const char *label, ds_draft_config *out) {
  ds_status st;
  cJSON *root = ds_json_parse(json, len, label, &st);
  if (!root) return st;
  st = parse_draft_object(root, label, out);
  cJSON_Delete(root);
  return st;
}

static ds_status nonfinite(const ds_safetensors *st, const char *name, double value, int64_t k) {
  return DS_FAIL(DS_ERR_NUMERIC, "%s: tensor '%s' holds %s at element %lld (a non-finite weight)", ds_st_path(st), name,
                 isnan(value) ? "NaN" : value > 0 ? "+inf" : "-inf", (long long)k);
}

/* The integer value k of an I64 / I32 / U8 / BOOL tensor view. */
static int64_t view_int(const ds_tensor_view *v, int64_t k) {
  switch (v->dtype) {
    case DS_I64: { int64_t x; memcpy(&x, (const char *)v->data + 8 * k, 8); return x; }
    case DS_I32: { int32_t x; memcpy(&x, (const char *)v->data + 4 * k, 4); return x; }
    default: return ((const uint8_t *)v->data)[k];
  }
}

/* A reduced vocabulary's tensors as read back: d2t (I64 or I32 [N]) and, when present, t2d
 * (BOOL or U8 [V]) must hold exactly the draft's own S. */
static ds_status check_vocab_tensor(const ds_draft *d, const ds_draft_tensor *t, const ds_safetensors *st,
                                    const char *name) {
  const ds_tensor_view *v = ds_st_find(st, name);
  int is_d2t = t->dtype == DS_I64;
  if (!v) {
    if (!is_d2t) return DS_OK; /* t2d is derived from d2t; readers such as vLLM ignore it */
    return DS_FAIL(DS_ERR_NOT_FOUND, "%s: tensor '%s' is missing (draft_vocab_size %lld needs the map of the draft's "
                   "vocabulary)", ds_st_path(st), name, (long long)d->n_vocab);
  }
  int dtype_ok = is_d2t ? v->dtype == DS_I64 || v->dtype == DS_I32 : v->dtype == DS_BOOL || v->dtype == DS_U8;
  if (!dtype_ok || v->ndim != 1 || v->shape[0] != t->shape[0])
    return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' must be %s [%lld] (got %s, %d dimensions)", ds_st_path(st), name,
                   is_d2t ? "I64" : "BOOL", (long long)t->shape[0], ds_dtype_name(v->dtype), v->ndim);
  for (int64_t k = 0; k < t->shape[0]; k++) {
    int64_t want = is_d2t ? d->d2t[k] : d->t2d[k], got = view_int(v, k);
    if (got != want)
      return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' holds %lld at [%lld] where the draft's vocabulary has %lld%s",
                     ds_st_path(st), name, (long long)got, (long long)k, (long long)want,
                     is_d2t ? "" : " (t2d must mark exactly the ids d2t maps to)");
  }
  return DS_OK;
}

/* memcpy from a checkpoint's file mapping a piece at a time, each piece's pages dropped once
 * copied (ds_release_mapped_pages; nothing happens elsewhere): the tensor is never resident
 * twice, the file's pages beside the draft's copy. */
static void copy_released(void *dst, const void *src, size_t n) {
  enum { PIECE = 8 << 20 };
  for (size_t off = 0; off < n; off += PIECE) {
    size_t k = n - off < PIECE ? n - off : PIECE;
    memcpy((char *)dst + off, (const char *)src + off, k);
    ds_release_mapped_pages((const char *)src + off, k);
  }
}

/* A frozen table used in place in the checkpoint's file mapping, as the target's weights are,
 * when it is stored in the draft's dtype for it and aligned for that dtype: the draft holds the
 * file (ds_st_retain_mapped) and only the rows it reads become resident (decoding reads two rows
 * of the 113 MB embedding of a 49k vocabulary a round). No kernel needs more than the element's
 * alignment (every vector load is unaligned); 16 bytes, once required here, held or not by the
 * length of the file's header (a checkpoint's tables lie 8 or 16 bytes past a multiple of 16
 * by chance: SmolLM2's rank-256 draft copied them, 159 MB more resident). Returns 0 where it
 * must be copied. */
static int table_in_place(ds_draft *d, size_t i, const ds_tensor_view *v, const ds_safetensors *st) {
  ds_draft_tensor *t = &d->tensors[i];
  tensor_spec *s = &d->specs[i];
  if (!s->table || v->dtype != t->dtype || (uintptr_t)v->data % ds_dtype_size(v->dtype)) return 0;
  if (!d->tables_file && !(d->tables_file = ds_st_retain_mapped(st))) return 0;
  if (d->tables_file != st) return 0; /* both tables from the one file the draft holds */
  t->data = (void *)v->data; /* never written: the frozen tables are read only */
  s->table->data = v->data;
  return 1;
}

/* No NaN or inf in the n values of a table (F32, BF16 or F16). */
static ds_status table_finite(const ds_safetensors *st, const char *name, const void *data, ds_dtype dt, int64_t n) {
  if (dt == DS_F32) {
    const float *f = data;
    for (int64_t k = 0; k < n; k++)
      if (!isfinite(f[k])) return nonfinite(st, name, f[k], k);
    return DS_OK;
  }
  const uint16_t *h = data;
  uint16_t mask = dt == DS_BF16 ? 0x7f80u : 0x7c00u;
  for (int64_t k = 0; k < n; k++)
    if ((h[k] & mask) == mask) return nonfinite(st, name, dt == DS_BF16 ? ds_bf16_to_f32(h[k]) : ds_f16_to_f32(h[k]), k);
  return DS_OK;
}

ds_status ds_draft_read_tensors(ds_draft *d, const ds_safetensors *st, const char *prefix) {
  char name[256];
  for (size_t i = 0; i < d->n_specs; i++) {
    const ds_draft_tensor *t = &d->tensors[i];
    snprintf(name, sizeof name, "%s%s", prefix, t->name);
    if (t->dtype == DS_I64 || t->dtype == DS_BOOL) { /* d2t / t2d */
      DS_TRY(check_vocab_tensor(d, t, st, name));
      continue;
    }
    const ds_tensor_view *v = ds_st_find(st, name);
    if (!v) return DS_FAIL(DS_ERR_NOT_FOUND, "%s: tensor '%s' is missing", ds_st_path(st), name);
    int ok = v->ndim == t->ndim && v->shape[0] == t->shape[0] && (t->ndim == 1 || v->shape[1] == t->shape[1]);
    if (!ok)
      return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' has shape [%lld%s%lld] but the draft config needs [%lld, %lld]",
                     ds_st_path(st), name, (long long)v->shape[0], v->ndim > 1 ? ", " : " ",
                     (long long)(v->ndim > 1 ? v->shape[1] : 0), (long long)t->shape[0], (long long)t->shape[1]);
    if (table_in_place(d, i, v, st)) { /* checked, then its pages given back until read */
      DS_TRY(table_finite(st, name, v->data, v->dtype, v->numel));
      ds_release_mapped_pages(v->data, v->nbytes);
      continue;
    }
    if (t->dtype != DS_F32) {
      /* A 16-bit table is read as it is stored, never rounded from another dtype. */
      if (v->dtype != t->dtype)
        return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' is %s but the draft holds it in %s", ds_st_path(st), name,
                       ds_dtype_name(v->dtype), ds_dtype_name(t->dtype));
      copy_released(t->data, v->data, v->nbytes);
      DS_TRY(table_finite(st, name, t->data, t->dtype, v->numel));
      continue;
    }
    float *f = t->data;
    ds_status cs = v->dtype == DS_F32 ? (copy_released(f, v->data, v->nbytes), DS_OK)
                                      : ds_convert_to_f32(f, v->data, v->dtype, (size_t)v->numel);
    if (cs != DS_OK) return ds_error_wrap(cs, "%s: tensor '%s'", ds_st_path(st), name);
    ds_release_mapped_pages(v->data, v->nbytes);
    /* a non-finite weight is a damaged file: named here, not later as NaN logits */
    for (int64_t k = 0; k < v->numel; k++)
      if (!isfinite(f[k])) return nonfinite(st, name, f[k], k);
  }
  return DS_OK;
}

/* The dtype a table is kept in when read from st: its stored BF16 / F16, else F32. */
static ds_dtype table_dtype(const ds_safetensors *st, const char *prefix, const char *name) {
  char full[256];
  snprintf(full, sizeof full, "%s%s", prefix, name);
  const ds_tensor_view *v = ds_st_find(st, full);
  return v && (v->dtype == DS_BF16 || v->dtype == DS_F16) ? v->dtype : DS_F32;
}

/* S of a reduced vocabulary from the tensor d2t (offset form, S[j] = j + d2t[j]): *ids (malloc'd,
 * [N]) or, for a config that says N = V and a file without d2t, NULL (a full-vocabulary draft
 * as vLLM's configs write it). */
static ds_status read_vocab_ids(const ds_draft_config *cfg, const ds_safetensors *st, const char *prefix,
                                int32_t **ids) {
  *ids = NULL;
  char name[256];
  snprintf(name, sizeof name, "%sd2t", prefix);
  const ds_tensor_view *v = ds_st_find(st, name);
  int64_t N = cfg->draft_vocab_size, V = cfg->vocab_size;
  if (!v) {
    if (N == V) return DS_OK;
    return DS_FAIL(DS_ERR_NOT_FOUND, "%s: tensor '%s' is missing (draft_vocab_size %lld < vocab_size %lld needs the "
                   "map of the draft's vocabulary to the target's)", ds_st_path(st), name, (long long)N, (long long)V);
  }
  if ((v->dtype != DS_I64 && v->dtype != DS_I32) || v->ndim != 1 || v->shape[0] != N)
    return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' must be I64 [%lld] (draft_vocab_size), got %s with %d dimensions%s",
                   ds_st_path(st), name, (long long)N, ds_dtype_name(v->dtype), v->ndim,
                   v->ndim == 1 ? " of another length" : "");
  int32_t *s = ds_malloc((size_t)N * sizeof *s, "draft vocabulary");
  if (!s) return DS_ERR_NOMEM;
  for (int64_t j = 0; j < N; j++) {
    int64_t off = view_int(v, j), id = off > INT64_MAX - j ? INT64_MAX : j + off;
    if (off < -j || id >= V) {
      free(s);
      return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' holds %lld at [%lld]: it maps draft id %lld to target id %lld, "
                     "outside the vocabulary [0, %lld)", ds_st_path(st), name, (long long)off, (long long)j,
                     (long long)j, (long long)id, (long long)V);
    }
    if (j > 0 && id <= s[j - 1]) {
      int32_t before = s[j - 1];
      free(s);
      return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' holds %lld at [%lld]: it maps draft id %lld to target id %lld, "
                     "not above draft id %lld's %d (the target ids of a draft vocabulary strictly increase)",
                     ds_st_path(st), name, (long long)off, (long long)j, (long long)j, (long long)id,
                     (long long)(j - 1), before);
    }
    s[j] = (int32_t)id;
  }
  *ids = s;
  return DS_OK;
}

ds_status ds_draft_load_tensors(const ds_draft_config *cfg_in, const ds_safetensors *st, const char *prefix,
                                const ds_backend *backend, ds_draft **out) {
  *out = NULL;
  ds_weight embed = {NULL, table_dtype(st, prefix, "embed_tokens.weight")};
  ds_weight lm_head = {NULL, table_dtype(st, prefix, "lm_head.weight")};
  ds_draft_config cfg = *cfg_in;
  int32_t *ids = NULL;
  if (cfg.draft_vocab_size > 0) {
    DS_TRY(ds_draft_config_check(&cfg));
    DS_TRY(read_vocab_ids(&cfg, st, prefix, &ids));
    if (!ids) cfg.draft_vocab_size = 0;
  }
  ds_draft *d = NULL;
  ds_status s = draft_new(&cfg, embed, lm_head, ids, 0, 0, backend, &d); /* every tensor is read next */
  free(ids);
  if (s == DS_OK) s = ds_draft_read_tensors(d, st, prefix);
  if (s != DS_OK) {
    ds_draft_free(d);
    return s;
  }
  *out = d;
  return DS_OK;
}

ds_status ds_draft_load_hf(const char *dir, const ds_backend *backend, ds_draft **out) {
  *out = NULL;
  char *cfg_path = ds_path_join(dir, "config.json"), *st_path = ds_path_join(dir, "model.safetensors");
  char *text = NULL;
  size_t len = 0;
  ds_safetensors *st = NULL;
  ds_draft *d = NULL;
  ds_draft_config cfg;
  ds_status s = cfg_path && st_path ? DS_OK : DS_ERR_NOMEM;
  if (s == DS_OK) s = ds_read_file(cfg_path, &text, &len);
  if (s == DS_OK) s = ds_draft_config_from_json(text, len, cfg_path, &cfg);
  if (s == DS_OK) s = ds_st_open(st_path, &st);
  /* Frozen tables come from the file too, in the dtype it stores them in. */
  if (s == DS_OK) s = ds_draft_load_tensors(&cfg, st, "", backend, &d);
  ds_st_close(st);
  free(text);
  free(cfg_path);
  free(st_path);
  if (s != DS_OK) return s;
  *out = d;
  return DS_OK;
}

/* Chained: each piece hashed with the previous digest as its seed (no streaming state to allocate). */
static uint64_t hash_i64(uint64_t h, int64_t v) {
  unsigned char b[8];
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)v >> (8 * i));
  return XXH64(b, 8, h);
}

uint64_t ds_draft_identity(const ds_draft *d) {
  const ds_draft_config *c = &d->cfg;
  const int64_t fields[] = {c->block_size, c->mask_token_id, c->markov_type, c->markov_rank,
                            c->enable_confidence_head, c->confidence_head_with_markov, c->n_target_layers};
  uint64_t h = 0;
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) h = hash_i64(h, fields[i]);
  for (int i = 0; i < c->n_target_layers; i++) h = hash_i64(h, c->target_layer_ids[i]);
  if (d->vocab_ids) /* a reduced vocabulary: which ids the draft proposes (a full draft's value is unchanged) */
    h = XXH64(d->vocab_ids, (size_t)d->n_vocab * sizeof(int32_t), hash_i64(h, d->n_vocab));
  for (size_t i = 0; i < d->n_specs; i++) {
    const ds_draft_tensor *t = &d->tensors[i];
    if (!t->grad) continue; /* a frozen table of the target's */
    h = XXH64(t->name, strlen(t->name) + 1, h);
    h = hash_i64(hash_i64(h, t->dtype), t->ndim);
    int64_t n = 1;
    for (int k = 0; k < t->ndim; k++) h = hash_i64(h, t->shape[k]), n *= t->shape[k];
    h = XXH64(t->data, (size_t)n * ds_dtype_size(t->dtype), h);
  }
  return h;
}
