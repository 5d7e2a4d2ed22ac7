/* The draft as a llama.cpp GGUF (ds_draft_export_gguf, include/dspark/draft.h): architecture
 * "dflash" plus the DSpark Markov and confidence tensors, the file llama.cpp's converter
 * (convert_hf_to_gguf.py, its DSparkModel class) makes of our HF export, key for key and tensor
 * for tensor (tests/conformance/test_gguf_draft.py compares them).
 *
 * Its conventions, as that converter and llama.cpp's draft-dspark runtime read them:
 * - hyperparameters come from the exported config.json (ds_draft_hf_config_json), under the
 *   "dflash." prefix; dflash.target_layers holds our target_layer_ids plus one (llama.cpp counts
 *   the hidden state entering layer i, we count the one leaving layer i);
 * - dflash.sample_from_anchor is true: slot 0 of a block is the anchor, the drafted tokens
 *   follow (DFlash's layout, not EAGLE-3's 1+N bonus block);
 * - tokenizer.ggml.mask_token_id is the block's mask token;
 * - the vocabulary is the target's (llama.cpp checks the pair's vocabularies match): its
 *   tokenizer.* keys, copied from the target's GGUF, or built from the target's HF directory as
 *   the converter builds them (ds_hf_vocab_gguf, src/model/hf_vocab_*.c);
 * - the draft's lm_head is the target's output head with the whole vocabulary and is left out
 *   (llama.cpp uses the target's); a reduced vocabulary writes it as output.weight [N, d] and
 *   d2t as I64 absolute target ids [N];
 * - 1-D tensors, norms and biases are F32, the matrices in the chosen dtype. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/json_util.h"
#include "dspark/draft.h"
#include "dspark/dtype.h"
#include "dspark/ggml_quant.h"
#include "dspark/gguf.h"
#include "dspark/gguf_model.h"
#include "dspark/gguf_write.h"
#include "dspark/model_source.h"

#define ARCH "dflash"

/* ---------------------------------------------------------------- names */

/* The GGUF name of an HF export tensor; NULL for one llama.cpp does not take. */
static int gguf_name(const char *hf, char *out, size_t cap) {
  static const struct { const char *hf, *gguf; } top[] = {
      {"embed_tokens.weight", "token_embd.weight"},
      {"lm_head.weight", "output.weight"},
      {"fc.weight", "fc.weight"},
      {"hidden_norm.weight", "enc.output_norm.weight"},
      {"norm.weight", "output_norm.weight"},
      {"markov_head.markov_w1.weight", "markov_w1.weight"},
      {"markov_head.markov_w2.weight", "markov_w2.weight"},
      {"confidence_head.proj.weight", "conf_proj.weight"},
      {"confidence_head.proj.bias", "conf_proj.bias"},
  };
  static const struct { const char *hf, *gguf; } layer[] = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
  };
  for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
    if (!strcmp(hf, top[i].hf)) return snprintf(out, cap, "%s", top[i].gguf) < (int)cap;
  int bid = -1, n = 0;
  if (sscanf(hf, "layers.%d.%n", &bid, &n) == 1 && n > 0 && bid >= 0)
    for (size_t i = 0; i < sizeof layer / sizeof layer[0]; i++)
      if (!strcmp(hf + n, layer[i].hf)) return snprintf(out, cap, "blk.%d.%s", bid, layer[i].gguf) < (int)cap;
  return 0;
}

/* ---------------------------------------------------------------- metadata */

/* gguf-py's Metadata.id_to_title of a directory name (ASCII letters): '-' as a space, each
 * all-lowercase word title-cased unless it is a version (v1.2) or starts with a digit. */
static void id_to_title(const char *id, char *out, size_t cap) {
  size_t o = 0;
  const char *p = id;
  while (*p && o + 1 < cap) {
    while (*p == '-' || *p == ' ' || *p == '\t') p++;
    if (!*p) break;
    const char *e = p;
    while (*e && *e != '-' && *e != ' ' && *e != '\t') e++;
    int has_lower = 0, has_upper = 0, version = *p >= '0' && *p <= '9';
    for (const char *q = p; q < e; q++) has_lower |= *q >= 'a' && *q <= 'z', has_upper |= *q >= 'A' && *q <= 'Z';
    if (*p == 'v' && e - p > 1) {
      version = 1;
      for (const char *q = p + 1; q < e; q++) version &= (*q >= '0' && *q <= '9') || *q == '.';
      version &= p[1] != '.' && e[-1] != '.' && !strstr(p, "..");
    }
    int title = has_lower && !has_upper && !version;
    if (o && o + 1 < cap) out[o++] = ' ';
    int prev_cased = 0;
    for (const char *q = p; q < e && o + 1 < cap; q++) {
      char c = *q;
      int cased = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
      if (title && cased) c = prev_cased ? (char)(c | 0x20) : (char)(c & ~0x20);
      prev_cased = cased;
      out[o++] = c;
    }
    p = e;
  }
  out[o] = 0;
}

/* gguf-py's size label: the parameter count in K / M / B / T with at least two digits. */
static void size_label(int64_t n, char *out, size_t cap) {
  double x = (double)n, s;
  const char *suffix;
  if (x > 1e12) s = x * 1e-12, suffix = "T";
  else if (x > 1e9) s = x * 1e-9, suffix = "B";
  else if (x > 1e6) s = x * 1e-6, suffix = "M";
  else s = x * 1e-3, suffix = "K";
  char digits[32];
  snprintf(digits, sizeof digits, "%.0f", nearbyint(s)); /* Python's round: half to even */
  const char *d = digits;
  while (*d == '0') d++;
  int fix = 2 - (int)strlen(d);
  snprintf(out, cap, "%.*f%s", fix > 0 ? fix : 0, s, suffix);
}

static const cJSON *obj(const cJSON *o, const char *key) { return o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL; }
static int is_num(const cJSON *j) { return cJSON_IsNumber(j); }

/* A key of the config that must be an integer in range, as a u32 under name. */
static ds_status put_u32_key(ds_gguf_writer *w, const cJSON *cfg, const char *key, const char *name, int required) {
  const cJSON *v = obj(cfg, key);
  if (!v || cJSON_IsNull(v)) {
    if (required) return DS_FAIL(DS_ERR_FORMAT, "draft config.json: '%s' is missing", key);
    return DS_OK;
  }
  if (!is_num(v) || v->valuedouble < 0 || v->valuedouble > 4294967295.0 || v->valuedouble != floor(v->valuedouble))
    return DS_FAIL(DS_ERR_FORMAT, "draft config.json: '%s' is not an integer in [0, 2^32)", key);
  return ds_gguf_set_u32(w, name, (uint32_t)v->valuedouble);
}

/* The RoPE keys the converter writes for a Llama / Qwen config: the base frequency, and a
 * linear scaling; the other scalings, which our drafts do not train with, are refused. */
static ds_status put_rope(ds_gguf_writer *w, const cJSON *cfg) {
  const cJSON *rp = obj(cfg, "rope_parameters");
  if (!rp) rp = obj(cfg, "rope_scaling");
  if (!cJSON_IsObject(rp)) rp = NULL;
  if (obj(rp, "full_attention") || obj(rp, "sliding_attention") || obj(rp, "mrope_section") ||
      obj(rp, "partial_rotary_factor") || obj(cfg, "partial_rotary_factor"))
    return DS_FAIL(DS_ERR_UNSUPPORTED, "draft config.json: per-layer, multimodal or partial RoPE is not exported to GGUF");
  const cJSON *type = obj(rp, "rope_type");
  if (!type) type = obj(rp, "type");
  if (cJSON_IsString(type)) {
    const char *t = type->valuestring;
    const cJSON *factor = obj(rp, "factor");
    if (!strcmp(t, "linear") && is_num(factor)) {
      DS_TRY(ds_gguf_set_str(w, ARCH ".rope.scaling.type", "linear", 6));
      DS_TRY(ds_gguf_set_f32(w, ARCH ".rope.scaling.factor", (float)factor->valuedouble));
    } else if (strcmp(t, "default") && strcmp(t, "llama3") && strcmp(t, "linear") && strcmp(t, "dynamic")) {
      return DS_FAIL(DS_ERR_UNSUPPORTED, "draft config.json: RoPE type '%s' is not exported to GGUF (default, "
                     "linear and llama3 are)", t);
    }
  }
  static const char *theta_keys[] = {"global_rope_theta", "rope_global_theta", "rope_theta_global", "rope_theta",
                                     "rotary_emb_base"};
  const cJSON *theta = obj(rp, "rope_theta");
  for (size_t i = 0; !theta && i < sizeof theta_keys / sizeof theta_keys[0]; i++)
    if (!cJSON_IsNull(obj(cfg, theta_keys[i]))) theta = obj(cfg, theta_keys[i]);
  if (theta && !is_num(theta)) return DS_FAIL(DS_ERR_FORMAT, "draft config.json: rope_theta is not a number");
  if (theta) DS_TRY(ds_gguf_set_f32(w, ARCH ".rope.freq_base", (float)theta->valuedouble));
  return DS_OK;
}

static ds_status put_params(ds_gguf_writer *w, const cJSON *cfg, const ds_draft_config *c, uint32_t file_type,
                            int has_conf) {
  DS_TRY(put_u32_key(w, cfg, "num_hidden_layers", ARCH ".block_count", 1));
  DS_TRY(put_u32_key(w, cfg, "max_position_embeddings", ARCH ".context_length", 0));
  DS_TRY(put_u32_key(w, cfg, "hidden_size", ARCH ".embedding_length", 1));
  DS_TRY(put_u32_key(w, cfg, "intermediate_size", ARCH ".feed_forward_length", 1));
  DS_TRY(put_u32_key(w, cfg, "num_attention_heads", ARCH ".attention.head_count", 1));
  DS_TRY(put_u32_key(w, cfg, "num_key_value_heads", ARCH ".attention.head_count_kv", 0));
  const cJSON *causal = obj(cfg, "is_causal");
  if (cJSON_IsFalse(causal)) DS_TRY(ds_gguf_set_bool(w, ARCH ".attention.causal", 0));
  DS_TRY(put_rope(w, cfg));
  const cJSON *eps = obj(cfg, "rms_norm_eps");
  if (is_num(eps)) DS_TRY(ds_gguf_set_f32(w, ARCH ".attention.layer_norm_rms_epsilon", (float)eps->valuedouble));
  DS_TRY(put_u32_key(w, cfg, "head_dim", ARCH ".attention.key_length", 0));
  DS_TRY(put_u32_key(w, cfg, "head_dim", ARCH ".attention.value_length", 0));
  DS_TRY(ds_gguf_set_u32(w, "general.file_type", file_type));
  /* what the DFlash and DSpark classes add */
  DS_TRY(ds_gguf_set_u32(w, ARCH ".block_size", (uint32_t)c->block_size));
  int32_t layers[DS_MAX_TARGET_LAYERS];
  for (int i = 0; i < c->n_target_layers; i++) layers[i] = c->target_layer_ids[i] + 1;
  DS_TRY(ds_gguf_set_array(w, ARCH ".target_layers", DS_GGUF_I32, (uint64_t)c->n_target_layers, layers));
  if (cJSON_IsBool(causal)) DS_TRY(ds_gguf_set_bool(w, ARCH ".attention.causal", cJSON_IsTrue(causal)));
  DS_TRY(ds_gguf_set_bool(w, ARCH ".sample_from_anchor", 1));
  DS_TRY(ds_gguf_set_bool(w, ARCH ".has_confidence_head", has_conf));
  return ds_gguf_set_u32(w, "general.quantization_version", 2);
}

/* The target's vocabulary: every tokenizer.* key of its GGUF, in its order; or, for a model
 * directory, the keys the converter builds from its tokenizer files (ds_hf_vocab_gguf). Then the
 * mask token. */
static ds_status put_vocab(ds_gguf_writer *w, const char *target, const ds_draft_config *c) {
  struct stat sb;
  if (!ds_model_path_is_gguf(target)) {
    if (stat(target, &sb) || !S_ISDIR(sb.st_mode))
      return DS_FAIL(DS_ERR_ARG, "%s: the target for the draft's vocabulary is neither a .gguf file nor a model "
                     "directory", target);
    DS_TRY(ds_hf_vocab_gguf(target, c->vocab_size, w));
    return ds_gguf_set_u32(w, "tokenizer.ggml.mask_token_id", (uint32_t)c->mask_token_id);
  }
  ds_gguf *g = NULL;
  DS_TRY(ds_gguf_open(target, &g));
  const ds_gguf_kv *tokens = NULL;
  ds_status st = ds_gguf_get_array(g, "tokenizer.ggml.tokens", DS_GGUF_STRING, 1, &tokens);
  if (st == DS_OK && tokens->count != (uint64_t)c->vocab_size)
    st = DS_FAIL(DS_ERR_FORMAT, "%s: its vocabulary has %llu tokens, the draft's target %lld (vocab_size): not the "
                 "draft's target", target, (unsigned long long)tokens->count, (long long)c->vocab_size);
  for (size_t i = 0; st == DS_OK && i < ds_gguf_kv_count(g); i++) {
    const ds_gguf_kv *kv = ds_gguf_kv_at(g, i);
    if (!strncmp(kv->key, "tokenizer.", 10)) st = ds_gguf_copy_kv(w, kv);
  }
  ds_gguf_close(g);
  if (st != DS_OK) return st;
  return ds_gguf_set_u32(w, "tokenizer.ggml.mask_token_id", (uint32_t)c->mask_token_id);
}

/* ---------------------------------------------------------------- tensors */

static int by_name(const void *a, const void *b) {
  return strcmp((*(const ds_draft_tensor *const *)a)->name, (*(const ds_draft_tensor *const *)b)->name);
}

static int ends_with(const char *s, const char *tail) {
  size_t n = strlen(s), m = strlen(tail);
  return n >= m && !strcmp(s + n - m, tail);
}

/* One draft tensor as the converter writes it: 1-D, norms and non-weights F32, others in dtype
 * (Q8_0: gguf.quants' blocks, to the bit; a matrix whose rows are not whole blocks F16). */
static ds_status add_tensor(ds_gguf_writer *w, const ds_draft_tensor *t, const char *name, ds_dtype dtype,
                            int64_t *params) {
  int64_t ne[2] = {t->ndim == 2 ? t->shape[1] : t->shape[0], t->shape[0]};
  size_t n = (size_t)(ne[0] * (t->ndim == 2 ? ne[1] : 1));
  ds_dtype out = (t->ndim <= 1 || ends_with(name, "_norm.weight") || !ends_with(name, ".weight")) ? DS_F32 : dtype;
  if (out == DS_Q8_0 && ne[0] % 32) out = DS_F16; /* the converter's fallback for rows of partial blocks */
  uint32_t type = out == DS_F32 ? DS_GGML_F32 : out == DS_F16 ? DS_GGML_F16 : out == DS_Q8_0 ? DS_GGML_Q8_0 : DS_GGML_BF16;
  size_t bytes = out == DS_F32 ? n * 4 : out == DS_Q8_0 ? n / 32 * 34 : n * 2;
  float *f = malloc(n * sizeof *f);
  void *data = out == DS_F32 ? (void *)f : malloc(bytes);
  if (!f || !data) {
    free(f);
    if (data != f) free(data);
    return DS_FAIL(DS_ERR_NOMEM, "GGUF export: tensor '%s' (%zu values)", t->name, n);
  }
  ds_status st = ds_convert_to_f32(f, t->data, t->dtype, n);
  if (st == DS_OK && out == DS_Q8_0) ds_ggml_quantize_q8_0(f, data, (int64_t)n);
  else if (st == DS_OK && out != DS_F32) st = ds_convert_from_f32(data, out, f, n);
  if (out != DS_F32) free(f);
  if (st != DS_OK) {
    free(data);
    return st;
  }
  *params += (int64_t)n;
  return ds_gguf_add_tensor(w, name, type, t->ndim, ne, data, 1);
}

/* d2t as absolute target ids, I64 [N]. */
static ds_status add_d2t(ds_gguf_writer *w, const ds_draft_tensor *t, int64_t *params) {
  int64_t n = t->shape[0];
  int64_t *ids = malloc((size_t)n * sizeof *ids);
  if (!ids) return DS_FAIL(DS_ERR_NOMEM, "GGUF export: d2t");
  const int64_t *off = t->data;
  for (int64_t j = 0; j < n; j++) ids[j] = off[j] + j;
  *params += n;
  return ds_gguf_add_tensor(w, "d2t", DS_GGML_I64, 1, &n, ids, 1);
}

static ds_status add_tensors(ds_gguf_writer *w, const ds_draft *d, ds_dtype dtype, int reduced, int *has_conf,
                             int64_t *params) {
  size_t n = ds_draft_tensor_count(d);
  const ds_draft_tensor **order = malloc((n ? n : 1) * sizeof *order);
  if (!order) return DS_FAIL(DS_ERR_NOMEM, "GGUF export: tensor table");
  for (size_t i = 0; i < n; i++) order[i] = ds_draft_tensor_at(d, i);
  qsort(order, n, sizeof *order, by_name); /* the HF file's order, which the converter follows */
  ds_status st = DS_OK;
  const ds_draft_tensor *d2t = NULL;
  for (size_t i = 0; st == DS_OK && i < n; i++) {
    const ds_draft_tensor *t = order[i];
    char name[64];
    if (!strcmp(t->name, "t2d")) continue;
    if (!strcmp(t->name, "d2t")) {
      d2t = t;
      continue;
    }
    if (!strcmp(t->name, "lm_head.weight") && !reduced) continue;
    if (!gguf_name(t->name, name, sizeof name)) {
      st = DS_FAIL(DS_ERR_UNSUPPORTED, "GGUF export: tensor '%s' has no llama.cpp name", t->name);
      break;
    }
    if (!strncmp(name, "conf_proj.", 10)) *has_conf = 1;
    st = add_tensor(w, t, name, dtype, params);
  }
  if (st == DS_OK && d2t) st = add_d2t(w, d2t, params);
  free(order);
  return st;
}

/* ---------------------------------------------------------------- the file */

ds_status ds_draft_export_gguf(const ds_draft *d, const char *draft_config_json, const char *target,
                               ds_dtype dtype, const char *name, const char *out_path) {
  const ds_draft_config *c = ds_draft_get_config(d);
  if (dtype != DS_F32 && dtype != DS_F16 && dtype != DS_BF16 && dtype != DS_Q8_0)
    return DS_FAIL(DS_ERR_ARG, "GGUF export: dtype %s (f32, f16, bf16 or q8_0)", ds_dtype_name(dtype));
  if (c->markov_type != DS_MARKOV_VANILLA)
    return DS_FAIL(DS_ERR_UNSUPPORTED,
                   "this draft has %s Markov head; llama.cpp's DSpark drafts (draft-dspark, architecture dflash) "
                   "implement the vanilla head only and its converter refuses markov_head_type '%s'. Train with "
                   "--markov vanilla to serve with llama.cpp",
                   c->markov_type == DS_MARKOV_NONE ? "no" : c->markov_type == DS_MARKOV_GATED ? "a gated" : "an rnn",
                   ds_markov_type_name(c->markov_type));
  char *text = NULL;
  DS_TRY(ds_draft_hf_config_json(d, draft_config_json, &text));
  ds_status st;
  cJSON *cfg = ds_json_parse(text, strlen(text), "draft config.json", &st);
  free(text);
  if (!cfg) return st;
  ds_gguf_writer *w = ds_gguf_writer_new();
  if (!w) {
    cJSON_Delete(cfg);
    return DS_FAIL(DS_ERR_NOMEM, "GGUF export: writer");
  }
  int has_conf = 0;
  int64_t params = 0;
  uint32_t file_type = dtype == DS_F32 ? 0 : dtype == DS_F16 ? 1 : dtype == DS_Q8_0 ? 7 : 32; /* llama_ftype */
  char title[256], label[32];
  /* the header keys first, as the converter orders them; the size label once the tensors are counted */
  id_to_title(name && name[0] ? name : "draft", title, sizeof title);
  st = ds_gguf_set_str(w, "general.architecture", ARCH, strlen(ARCH));
  if (st == DS_OK) st = ds_gguf_set_str(w, "general.type", "model", 5);
  if (st == DS_OK) st = ds_gguf_set_str(w, "general.name", title, strlen(title));
  if (st == DS_OK) st = ds_gguf_set_str(w, "general.size_label", "", 0);
  if (st == DS_OK) st = add_tensors(w, d, dtype, c->draft_vocab_size > 0 && c->draft_vocab_size < c->vocab_size,
                                    &has_conf, &params);
  if (st == DS_OK) {
    size_label(params, label, sizeof label);
    st = ds_gguf_set_str(w, "general.size_label", label, strlen(label));
  }
  if (st == DS_OK) st = put_params(w, cfg, c, file_type, has_conf);
  if (st == DS_OK) st = put_vocab(w, target, c);
  if (st == DS_OK) st = ds_gguf_writer_write(w, out_path);
  ds_gguf_writer_free(w);
  cJSON_Delete(cfg);
  return st;
}
