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

static ds_status parse_rope(const cJSON *root, const char *label, ds_model_config *c) {
  /* 5.x: rope_parameters {rope_theta, rope_type, ...}; 4.x: rope_theta + rope_scaling {type|rope_type}. */
  const cJSON *params = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
  const char *params_key = "rope_parameters";
  if (!params || cJSON_IsNull(params)) {
    params = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    params_key = "rope_scaling";
  }
  if (params && !cJSON_IsNull(params) && !cJSON_IsObject(params))
    return DS_FAIL(DS_ERR_FORMAT, "%s: field '%s' must be an object or null", label, params_key);
  DS_TRY(ds_json_num(root, "rope_theta", 0, 10000.0, label, &c->rope_theta));
  c->rope_type = DS_ROPE_DEFAULT;
  if (!params || cJSON_IsNull(params)) return DS_OK;

  char sub[160];
  snprintf(sub, sizeof sub, "%s: %s", label, params_key);
  if (cJSON_GetObjectItemCaseSensitive(params, "rope_theta"))
    DS_TRY(ds_json_num(params, "rope_theta", 1, 0, sub, &c->rope_theta));
  if (!(c->rope_theta > 0)) return DS_FAIL(DS_ERR_FORMAT, "%s: rope_theta must be > 0", label);
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(params, "rope_type");
  if (!type) type = cJSON_GetObjectItemCaseSensitive(params, "type");
  const char *t = cJSON_IsString(type) ? type->valuestring : (type ? NULL : "default");
  if (!t) return DS_FAIL(DS_ERR_FORMAT, "%s.rope_type must be a string", sub);
  if (!strcmp(t, "default")) {
    c->rope_type = DS_ROPE_DEFAULT;
  } else if (!strcmp(t, "linear")) {
    c->rope_type = DS_ROPE_LINEAR;
    DS_TRY(ds_json_num(params, "factor", 1, 1.0, sub, &c->rope_factor));
  } else if (!strcmp(t, "llama3")) {
    c->rope_type = DS_ROPE_LLAMA3;
    DS_TRY(ds_json_num(params, "factor", 1, 1.0, sub, &c->rope_factor));
    DS_TRY(ds_json_num(params, "low_freq_factor", 1, 1.0, sub, &c->rope_low_freq_factor));
    DS_TRY(ds_json_num(params, "high_freq_factor", 1, 4.0, sub, &c->rope_high_freq_factor));
    DS_TRY(ds_json_int(params, "original_max_position_embeddings", 1, 0, 1, INT64_C(1) << 40, sub,
                   &c->rope_original_max_position_embeddings));
    if (!(c->rope_high_freq_factor > c->rope_low_freq_factor))
      return DS_FAIL(DS_ERR_FORMAT, "%s: high_freq_factor must exceed low_freq_factor", sub);
  } else {
    return DS_FAIL(DS_ERR_UNSUPPORTED,
                   "%s.rope_type '%s' is not supported (supported: default, linear, llama3)", sub, t);
  }
  if (c->rope_type != DS_ROPE_DEFAULT && !(c->rope_factor > 0))
    return DS_FAIL(DS_ERR_FORMAT, "%s.factor must be > 0", sub);
  return DS_OK;
}

static ds_status parse_eos(const cJSON *root, const char *label, ds_model_config *c) {
  const cJSON *eos = cJSON_GetObjectItemCaseSensitive(root, "eos_token_id");
  c->n_eos = 0;
  if (!eos || cJSON_IsNull(eos)) return DS_OK;
  if (cJSON_IsNumber(eos)) {
    int64_t v;
    DS_TRY(ds_json_int(root, "eos_token_id", 1, 0, 0, INT32_MAX, label, &v));
    c->eos_token_ids[c->n_eos++] = v;
    return DS_OK;
  }
  if (!cJSON_IsArray(eos)) return DS_FAIL(DS_ERR_FORMAT, "%s: eos_token_id must be an integer or a list", label);
  const cJSON *it;
  cJSON_ArrayForEach(it, eos) {
    if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > INT32_MAX)
      return DS_FAIL(DS_ERR_FORMAT, "%s: eos_token_id entries must be non-negative integers", label);
    if (c->n_eos == DS_MAX_EOS) return DS_FAIL(DS_ERR_UNSUPPORTED, "%s: more than %d eos_token_id entries", label, DS_MAX_EOS);
    c->eos_token_ids[c->n_eos++] = (int64_t)it->valuedouble;
  }
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

  const int64_t big = INT64_C(1) << 31;
  DS_TRY(ds_json_int(root, "vocab_size", 1, 0, 1, big, label, &c->vocab_size));
  DS_TRY(ds_json_int(root, "hidden_size", 1, 0, 1, 1 << 20, label, &c->hidden_size));
  DS_TRY(ds_json_int(root, "intermediate_size", 1, 0, 1, 1 << 24, label, &c->intermediate_size));
  DS_TRY(ds_json_int(root, "num_hidden_layers", 1, 0, 1, 4096, label, &c->num_hidden_layers));
  DS_TRY(ds_json_int(root, "num_attention_heads", 1, 0, 1, 4096, label, &c->num_attention_heads));
  DS_TRY(ds_json_int(root, "num_key_value_heads", 0, c->num_attention_heads, 1, 4096, label, &c->num_key_value_heads));
  if (c->num_attention_heads % c->num_key_value_heads != 0)
    return DS_FAIL(DS_ERR_FORMAT, "%s: num_attention_heads (%lld) is not a multiple of num_key_value_heads (%lld)",
                   label, (long long)c->num_attention_heads, (long long)c->num_key_value_heads);
  int64_t default_hd = c->hidden_size / c->num_attention_heads;
  DS_TRY(ds_json_int(root, "head_dim", 0, default_hd, 2, 4096, label, &c->head_dim));
  if (c->head_dim % 2) return DS_FAIL(DS_ERR_FORMAT, "%s: head_dim (%lld) must be even for RoPE", label, (long long)c->head_dim);
  if (!cJSON_GetObjectItemCaseSensitive(root, "head_dim") && default_hd * c->num_attention_heads != c->hidden_size)
    return DS_FAIL(DS_ERR_FORMAT, "%s: hidden_size %lld is not divisible by num_attention_heads %lld and no head_dim is given",
                   label, (long long)c->hidden_size, (long long)c->num_attention_heads);
  DS_TRY(ds_json_int(root, "max_position_embeddings", 0, 2048, 1, INT64_C(1) << 40, label, &c->max_position_embeddings));
  DS_TRY(ds_json_num(root, "rms_norm_eps", 0, 1e-6, label, &c->rms_norm_eps));
  if (!(c->rms_norm_eps > 0)) return DS_FAIL(DS_ERR_FORMAT, "%s: rms_norm_eps must be > 0", label);
  DS_TRY(parse_rope(root, label, c));
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

  DS_TRY(ds_json_int(root, "bos_token_id", 0, -1, 0, INT32_MAX, label, &c->bos_token_id));
  DS_TRY(parse_eos(root, label, c));
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
