#include "dspark/hfconfig.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/fileio.h"
#include "core/json_util.h"

const char *ds_arch_name(ds_arch arch) {
  switch (arch) {
    case DS_ARCH_LLAMA: return "llama";
    case DS_ARCH_QWEN2: return "qwen2";
    case DS_ARCH_QWEN3: return "qwen3";
  }
  return "?";
}

/* The defaults of transformers' config classes (5.x) for the fields they default differently
 * per family; every family: rms_norm_eps 1e-6, rope_theta 10000 (default_theta), SiLU,
 * tie_word_embeddings false, attention_bias / mlp_bias false. -1 marks a derived default. */
typedef struct {
  int64_t vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads;
  int64_t num_key_value_heads;     /* -1: num_attention_heads */
  int64_t head_dim;                /* -1: hidden_size / num_attention_heads (floor) */
  int64_t max_position_embeddings;
  int64_t bos_token_id, eos_token_id; /* -1: none */
} family_defaults;

static const family_defaults k_defaults[] = {
    [DS_ARCH_LLAMA] = {32000, 4096, 11008, 32, 32, -1, -1, 2048, 1, 2},
    [DS_ARCH_QWEN2] = {151936, 4096, 22016, 32, 32, 32, -1, 32768, -1, -1},
    [DS_ARCH_QWEN3] = {151936, 4096, 22016, 32, 32, 32, 128, 32768, -1, -1},
};

const char *ds_config_class_name(ds_arch arch) {
  switch (arch) {
    case DS_ARCH_LLAMA: return "LlamaConfig";
    case DS_ARCH_QWEN2: return "Qwen2Config";
    case DS_ARCH_QWEN3: return "Qwen3Config";
  }
  return "?";
}

static void note_default(ds_model_config *c, const char *key, const char *value) {
  size_t n = strlen(c->defaulted);
  snprintf(c->defaulted + n, sizeof c->defaulted - n, "%s%s=%s", n ? ", " : "", key, value);
}

/* transformers' strict config classes refuse null for a typed field (only a few fields map
 * null to something; their callers handle that before coming here). */
static ds_status refuse_null(const cJSON *root, const char *key, const char *label, const ds_model_config *c) {
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
  if (it && cJSON_IsNull(it))
    return DS_FAIL(DS_ERR_FORMAT, "%s: field '%s' is null; %s needs a value (leave the field out to take its default)",
                   label, key, ds_config_class_name(c->arch));
  return DS_OK;
}

/* An integer field with a class default: absent -> dflt (noted), null -> refused. */
static ds_status int_field(const cJSON *root, const char *key, int64_t dflt, int64_t lo, int64_t hi, const char *label,
                           ds_model_config *c, int64_t *out) {
  DS_TRY(refuse_null(root, key, label, c));
  if (!cJSON_GetObjectItemCaseSensitive(root, key)) {
    char v[32];
    snprintf(v, sizeof v, "%lld", (long long)dflt);
    note_default(c, key, v);
  }
  return ds_json_int(root, key, 0, dflt, lo, hi, label, out);
}

/* The rope object transformers 5.x uses (RotaryEmbeddingConfigMixin.convert_rope_params_to_dict):
 * a non-empty rope_scaling (4.x's spelling) replaces rope_parameters, so a config holding both is
 * read as transformers reads it. NULL: none (default rope). */
static ds_status rope_object(const cJSON *root, const char *label, const cJSON **obj, const char **key) {
  static const char *const keys[] = {"rope_scaling", "rope_parameters"};
  *obj = NULL;
  *key = NULL;
  for (int i = 0; i < 2; i++) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, keys[i]);
    if (it && !cJSON_IsNull(it) && !cJSON_IsObject(it))
      return DS_FAIL(DS_ERR_FORMAT, "%s: field '%s' must be an object or null", label, keys[i]);
    if (!*obj && cJSON_IsObject(it) && it->child) *obj = it, *key = keys[i];
  }
  return DS_OK;
}

/* rope_theta (> 0) and the scaling: its type must be one ds_rope_inv_freq computes and each of
 * its fields inside its domain, named in the error. */
static ds_status parse_rope(const cJSON *root, const char *label, ds_model_config *c) {
  const cJSON *params;
  const char *params_key;
  DS_TRY(rope_object(root, label, &params, &params_key));
  DS_TRY(refuse_null(root, "rope_theta", label, c));
  DS_TRY(ds_json_positive(root, "rope_theta", 0, 10000.0, label, &c->rope_theta));
  c->rope_type = DS_ROPE_DEFAULT;
  if (!params) return DS_OK;

  char sub[160];
  snprintf(sub, sizeof sub, "%s: %s", label, params_key);
  if (cJSON_GetObjectItemCaseSensitive(params, "rope_theta"))
    DS_TRY(ds_json_positive(params, "rope_theta", 1, 0, sub, &c->rope_theta));
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(params, "rope_type");
  if (!type) type = cJSON_GetObjectItemCaseSensitive(params, "type");
  const char *t = cJSON_IsString(type) ? type->valuestring : (type ? NULL : "default");
  if (!t) return DS_FAIL(DS_ERR_FORMAT, "%s.rope_type must be a string", sub);
  /* As transformers' rope validation: linear needs factor; llama3 needs factor, low_freq_factor
   * and high_freq_factor, and original_max_position_embeddings defaults to
   * max_position_embeddings. */
  if (!strcmp(t, "default")) {
    c->rope_type = DS_ROPE_DEFAULT;
  } else if (!strcmp(t, "linear")) {
    c->rope_type = DS_ROPE_LINEAR;
    DS_TRY(ds_json_positive(params, "factor", 1, 1.0, sub, &c->rope_factor));
  } else if (!strcmp(t, "llama3")) {
    c->rope_type = DS_ROPE_LLAMA3;
    DS_TRY(ds_json_positive(params, "factor", 1, 1.0, sub, &c->rope_factor));
    DS_TRY(ds_json_positive(params, "low_freq_factor", 1, 1.0, sub, &c->rope_low_freq_factor));
    DS_TRY(ds_json_positive(params, "high_freq_factor", 1, 4.0, sub, &c->rope_high_freq_factor));
    DS_TRY(ds_json_int(params, "original_max_position_embeddings", 0, c->max_position_embeddings, 1,
                       DS_CONFIG_MAX_POSITIONS, sub, &c->rope_original_max_position_embeddings));
    if (!(c->rope_high_freq_factor > c->rope_low_freq_factor))
      return DS_FAIL(DS_ERR_FORMAT, "%s: high_freq_factor (%g) must exceed low_freq_factor (%g)", sub,
                     c->rope_high_freq_factor, c->rope_low_freq_factor);
  } else {
    return DS_FAIL(DS_ERR_UNSUPPORTED,
                   "%s.rope_type '%s' is not supported (supported: default, linear, llama3)", sub, t);
  }
  return DS_OK;
}

/* eos_token_id as written: an integer, a list of them, or absent / null (none). */
static ds_status parse_id_list(const cJSON *root, const char *key, const char *label, int64_t lo, int64_t hi,
                               int64_t *ids, int *n) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
  *n = 0;
  if (!v || cJSON_IsNull(v)) return DS_OK;
  if (cJSON_IsNumber(v)) {
    DS_TRY(ds_json_int(root, key, 1, 0, lo, hi, label, &ids[0]));
    *n = 1;
    return DS_OK;
  }
  if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) == 0)
    return DS_FAIL(DS_ERR_FORMAT, "%s: %s must be an integer or a non-empty list of integers", label, key);
  const cJSON *it;
  cJSON_ArrayForEach(it, v) {
    if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble))
      return DS_FAIL(DS_ERR_FORMAT, "%s: field '%s'[%d] must be an integer", label, key, *n);
    if (it->valuedouble < (double)lo || it->valuedouble > (double)hi)
      return DS_FAIL(DS_ERR_FORMAT, "%s: field '%s'[%d] = %.0f is outside [%lld, %lld]", label, key, *n,
                     it->valuedouble, (long long)lo, (long long)hi);
    if (*n == DS_MAX_EOS) return DS_FAIL(DS_ERR_UNSUPPORTED, "%s: more than %d %s entries", label, DS_MAX_EOS, key);
    ids[(*n)++] = (int64_t)it->valuedouble;
  }
  return DS_OK;
}

static ds_status parse_special_ids(const cJSON *root, const char *label, ds_model_config *c) {
  const family_defaults *f = &k_defaults[c->arch];
  const cJSON *bos = cJSON_GetObjectItemCaseSensitive(root, "bos_token_id");
  if (!bos) {
    c->bos_token_id = f->bos_token_id;
    char v[32];
    snprintf(v, sizeof v, "%lld", (long long)f->bos_token_id);
    if (f->bos_token_id >= 0) note_default(c, "bos_token_id", v);
  } else {
    DS_TRY(ds_json_int(root, "bos_token_id", 0, -1, 0, c->vocab_size - 1, label, &c->bos_token_id));
  }
  DS_TRY(parse_id_list(root, "eos_token_id", label, 0, c->vocab_size - 1, c->eos_token_ids, &c->n_eos));
  /* generate()'s stop set without generation_config.json: config.json's value as written. */
  memcpy(c->stop_token_ids, c->eos_token_ids, sizeof c->stop_token_ids);
  c->n_stop = c->n_eos;
  snprintf(c->stop_source, sizeof c->stop_source, "config.json");
  if (!cJSON_GetObjectItemCaseSensitive(root, "eos_token_id") && f->eos_token_id >= 0) {
    c->eos_token_ids[0] = f->eos_token_id;
    c->n_eos = 1;
    char v[32];
    snprintf(v, sizeof v, "%lld", (long long)f->eos_token_id);
    note_default(c, "eos_token_id", v);
  }
  return DS_OK;
}

/* Heads and head_dim with each class's rules: num_key_value_heads null means
 * num_attention_heads in every family, absent means Qwen2/Qwen3's 32; head_dim is 128 in
 * Qwen3Config, hidden_size / num_attention_heads (floor) otherwise, and LlamaConfig refuses a
 * hidden_size that num_attention_heads does not divide. */
static ds_status parse_heads(const cJSON *root, const char *label, ds_model_config *c) {
  const family_defaults *f = &k_defaults[c->arch];
  DS_TRY(int_field(root, "num_attention_heads", f->num_attention_heads, 1, DS_CONFIG_MAX_HEADS, label, c,
                   &c->num_attention_heads));
  const cJSON *kv = cJSON_GetObjectItemCaseSensitive(root, "num_key_value_heads");
  if (kv && cJSON_IsNull(kv)) c->num_key_value_heads = c->num_attention_heads;
  else
    DS_TRY(int_field(root, "num_key_value_heads", f->num_key_value_heads < 0 ? c->num_attention_heads : f->num_key_value_heads,
                     1, DS_CONFIG_MAX_HEADS, label, c, &c->num_key_value_heads));
  if (c->num_attention_heads % c->num_key_value_heads != 0)
    return DS_FAIL(DS_ERR_FORMAT, "%s: num_attention_heads (%lld) is not a multiple of num_key_value_heads (%lld)%s",
                   label, (long long)c->num_attention_heads, (long long)c->num_key_value_heads,
                   kv ? "" : " (num_key_value_heads is not set: that is the class default)");
  if (c->arch == DS_ARCH_LLAMA && c->hidden_size % c->num_attention_heads != 0)
    return DS_FAIL(DS_ERR_FORMAT, "%s: hidden_size (%lld) is not a multiple of num_attention_heads (%lld) (LlamaConfig "
                   "refuses this)", label, (long long)c->hidden_size, (long long)c->num_attention_heads);
  const cJSON *hd = cJSON_GetObjectItemCaseSensitive(root, "head_dim");
  int64_t derived = c->hidden_size / c->num_attention_heads;
  if (hd && cJSON_IsNull(hd) && c->arch != DS_ARCH_LLAMA) DS_TRY(refuse_null(root, "head_dim", label, c));
  if (!hd || cJSON_IsNull(hd)) {
    c->head_dim = f->head_dim > 0 ? f->head_dim : derived;
    char v[32];
    snprintf(v, sizeof v, "%lld", (long long)c->head_dim);
    note_default(c, "head_dim", v);
  } else {
    DS_TRY(ds_json_int(root, "head_dim", 1, 0, 1, DS_CONFIG_MAX_HEAD_DIM, label, &c->head_dim));
  }
  if (c->head_dim < 2 || c->head_dim % 2)
    return DS_FAIL(DS_ERR_FORMAT, "%s: head_dim %lld%s must be even and at least 2 for RoPE", label,
                   (long long)c->head_dim, hd && !cJSON_IsNull(hd) ? "" : " (not set: hidden_size / num_attention_heads)");
  return DS_OK;
}

static ds_status parse_root(const cJSON *root, const char *label, ds_model_config *c) {
  memset(c, 0, sizeof *c);
  if (!cJSON_IsObject(root)) return DS_FAIL(DS_ERR_FORMAT, "%s: top level must be a JSON object", label);

  const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures");
  const cJSON *mtype = cJSON_GetObjectItemCaseSensitive(root, "model_type");
  const char *arch = NULL;
  if (cJSON_IsArray(archs) && cJSON_GetArraySize(archs) == 1 && cJSON_IsString(cJSON_GetArrayItem(archs, 0)))
    arch = cJSON_GetArrayItem(archs, 0)->valuestring;
  else if (archs && !cJSON_IsNull(archs))
    return DS_FAIL(DS_ERR_FORMAT, "%s: field 'architectures' must be a list of one string", label);
  const char *mt = cJSON_IsString(mtype) ? mtype->valuestring : NULL;
  if (arch) {
    if (!strcmp(arch, "LlamaForCausalLM")) c->arch = DS_ARCH_LLAMA;
    else if (!strcmp(arch, "Qwen2ForCausalLM")) c->arch = DS_ARCH_QWEN2;
    else if (!strcmp(arch, "Qwen3ForCausalLM")) c->arch = DS_ARCH_QWEN3;
    else
      return DS_FAIL(DS_ERR_UNSUPPORTED,
                     "%s: architectures[0] = '%s' is not supported (supported: LlamaForCausalLM, "
                     "Qwen2ForCausalLM, Qwen3ForCausalLM)", label, arch);
    snprintf(c->architecture, sizeof c->architecture, "%s", arch);
  } else if (mt) {
    if (!strcmp(mt, "llama")) c->arch = DS_ARCH_LLAMA;
    else if (!strcmp(mt, "qwen2")) c->arch = DS_ARCH_QWEN2;
    else if (!strcmp(mt, "qwen3")) c->arch = DS_ARCH_QWEN3;
    else return DS_FAIL(DS_ERR_UNSUPPORTED, "%s: model_type '%s' is not supported (llama, qwen2, qwen3)", label, mt);
    static const char *names[] = {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"};
    snprintf(c->architecture, sizeof c->architecture, "%s", names[c->arch]);
  } else {
    return DS_FAIL(DS_ERR_FORMAT, "%s: neither 'architectures' nor 'model_type' names the model", label);
  }

  const family_defaults *f = &k_defaults[c->arch];
  DS_TRY(int_field(root, "vocab_size", f->vocab_size, 1, DS_CONFIG_MAX_VOCAB, label, c, &c->vocab_size));
  DS_TRY(int_field(root, "hidden_size", f->hidden_size, 1, DS_CONFIG_MAX_HIDDEN, label, c, &c->hidden_size));
  DS_TRY(int_field(root, "intermediate_size", f->intermediate_size, 1, DS_CONFIG_MAX_INTERMEDIATE, label, c,
                   &c->intermediate_size));
  DS_TRY(int_field(root, "num_hidden_layers", f->num_hidden_layers, 1, DS_CONFIG_MAX_LAYERS, label, c,
                   &c->num_hidden_layers));
  DS_TRY(parse_heads(root, label, c));
  DS_TRY(int_field(root, "max_position_embeddings", f->max_position_embeddings, 1, DS_CONFIG_MAX_POSITIONS, label, c,
                   &c->max_position_embeddings));
  DS_TRY(refuse_null(root, "rms_norm_eps", label, c));
  DS_TRY(ds_json_positive(root, "rms_norm_eps", 0, 1e-6, label, &c->rms_norm_eps));
  DS_TRY(parse_rope(root, label, c));
  DS_TRY(refuse_null(root, "tie_word_embeddings", label, c));
  DS_TRY(ds_json_bool(root, "tie_word_embeddings", 0, 0 /* False for all three families */, label, &c->tie_word_embeddings));

  const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
  if (act && !(cJSON_IsString(act) && !strcmp(act->valuestring, "silu")))
    return DS_FAIL(DS_ERR_UNSUPPORTED, "%s: hidden_act must be \"silu\" (SwiGLU MLP)", label);

  int use_sliding = 0;
  DS_TRY(ds_json_bool(root, "use_sliding_window", 0, 0, label, &use_sliding));
  if (use_sliding && c->arch != DS_ARCH_LLAMA)
    return DS_FAIL(DS_ERR_UNSUPPORTED, "%s: use_sliding_window = true is not supported", label);
  const cJSON *ltypes = cJSON_GetObjectItemCaseSensitive(root, "layer_types");
  if (ltypes && !cJSON_IsNull(ltypes)) {
    if (!cJSON_IsArray(ltypes)) return DS_FAIL(DS_ERR_FORMAT, "%s: layer_types must be a list", label);
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, ltypes) {
      if (!cJSON_IsString(it) || strcmp(it->valuestring, "full_attention") != 0)
        return DS_FAIL(DS_ERR_UNSUPPORTED, "%s: layer_types[%d] must be \"full_attention\" (sliding windows are not supported)", label, i);
      i++;
    }
  }

  switch (c->arch) {
    case DS_ARCH_LLAMA:
      DS_TRY(ds_json_bool(root, "attention_bias", 0, 0, label, &c->attention_bias));
      c->o_proj_bias = c->attention_bias;
      DS_TRY(ds_json_bool(root, "mlp_bias", 0, 0, label, &c->mlp_bias));
      break;
    case DS_ARCH_QWEN2:
      c->attention_bias = 1; /* q/k/v always carry a bias in Qwen2 */
      break;
    case DS_ARCH_QWEN3:
      DS_TRY(ds_json_bool(root, "attention_bias", 0, 0, label, &c->attention_bias));
      c->o_proj_bias = c->attention_bias;
      c->qk_norm = 1;
      break;
  }

  DS_TRY(parse_special_ids(root, label, c));
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(root, "dtype");
  if (!cJSON_IsString(dt)) dt = cJSON_GetObjectItemCaseSensitive(root, "torch_dtype");
  snprintf(c->dtype, sizeof c->dtype, "%s", cJSON_IsString(dt) ? dt->valuestring : "unknown");
  return DS_OK;
}

ds_status ds_config_parse(const char *json, size_t len, const char *label, ds_model_config *out) {
  ds_status st;
  cJSON *root = ds_json_parse(json, len, label, &st);
  if (!root) return st;
  st = parse_root(root, label, out);
  cJSON_Delete(root);
  return st;
}

ds_status ds_config_load(const char *path, ds_model_config *out) {
  char *buf;
  size_t len;
  DS_TRY(ds_read_file(path, &buf, &len));
  ds_status st = ds_config_parse(buf, len, path, out);
  free(buf);
  return st;
}

/* ---------------------------------------------------------------- the model directory */

ds_status ds_config_apply_generation_config(ds_model_config *c, const char *json, size_t len, const char *label) {
  ds_status st;
  cJSON *root = ds_json_parse(json, len, label, &st);
  if (!root) return st;
  int64_t ids[DS_MAX_EOS];
  int n = 0;
  if (!cJSON_IsObject(root)) st = DS_FAIL(DS_ERR_FORMAT, "%s: top level must be a JSON object", label);
  else st = parse_id_list(root, "eos_token_id", label, 0, c->vocab_size - 1, ids, &n);
  cJSON_Delete(root);
  if (st != DS_OK) return st;
  /* As GenerationConfig.from_pretrained: the file replaces config.json's ids outright; without
   * an eos_token_id entry generate() has no stop token at all. */
  memcpy(c->stop_token_ids, ids, sizeof ids);
  c->n_stop = n;
  snprintf(c->stop_source, sizeof c->stop_source, "generation_config.json");
  return DS_OK;
}

ds_status ds_config_parse_model(const char *cfg, size_t cfg_len, const char *cfg_label, const char *gen,
                                size_t gen_len, const char *gen_label, ds_model_config *out) {
  DS_TRY(ds_config_parse(cfg, cfg_len, cfg_label, out));
  return gen ? ds_config_apply_generation_config(out, gen, gen_len, gen_label) : DS_OK;
}

ds_status ds_config_load_dir(const char *model_dir, ds_model_config *out) {
  char *cfg = ds_path_join(model_dir, "config.json"), *gen = ds_path_join(model_dir, "generation_config.json");
  char *cfg_text = NULL, *gen_text = NULL;
  size_t cfg_len = 0, gen_len = 0;
  int there = 0;
  ds_status st = cfg && gen ? DS_OK : DS_ERR_NOMEM;
  if (st == DS_OK) st = ds_read_file(cfg, &cfg_text, &cfg_len);
  if (st == DS_OK) st = ds_path_probe(gen, &there);
  if (st == DS_OK && there) st = ds_read_file(gen, &gen_text, &gen_len);
  if (st == DS_OK) st = ds_config_parse_model(cfg_text, cfg_len, cfg, gen_text, gen_len, gen, out);
  free(cfg_text);
  free(gen_text);
  free(cfg);
  free(gen);
  return st;
}

int ds_config_is_stop_token(const ds_model_config *c, int64_t id) {
  for (int i = 0; i < c->n_stop; i++)
    if (c->stop_token_ids[i] == id) return 1;
  return 0;
}

ds_status ds_config_check_positions(const ds_model_config *c, const char *config_label, int64_t positions,
                                    const char *option) {
  if (positions <= c->max_position_embeddings) return DS_OK;
  return DS_FAIL(DS_ERR_ARG,
                 "%s: max_position_embeddings is %lld%s, but %s asks for %lld positions; lower %s to at most %lld",
                 config_label, (long long)c->max_position_embeddings,
                 strstr(c->defaulted, "max_position_embeddings=") ? " (not set there: the class default)" : "",
                 option, (long long)positions, option, (long long)c->max_position_embeddings);
}

int64_t ds_config_num_params(const ds_model_config *c) {
  int64_t d = c->hidden_size, hd = c->head_dim, I = c->intermediate_size;
  int64_t q = c->num_attention_heads * hd, kv = c->num_key_value_heads * hd;
  int64_t attn = d * q + 2 * d * kv + q * d;
  if (c->attention_bias) attn += q + 2 * kv;
  if (c->o_proj_bias) attn += d;
  if (c->qk_norm) attn += 2 * hd;
  int64_t mlp = 3 * d * I + (c->mlp_bias ? 2 * I + d : 0);
  int64_t layer = attn + mlp + 2 * d;
  int64_t emb = c->vocab_size * d;
  return c->num_hidden_layers * layer + d + emb * (c->tie_word_embeddings ? 1 : 2);
}
