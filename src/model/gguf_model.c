/* A GGUF file as a Hugging Face model directory (include/dspark/gguf_model.h): the config and the
 * weights, and the model object that holds the texts of every file (gguf_internal.h); the
 * tokenizer's files are gguf_tokenizer.c's. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/dtype.h"
#include "dspark/gguf.h"
#include "dspark/gguf_model.h"
#include "dspark/hfconfig.h"
#include "dspark/safetensors.h"
#include "model/gguf_internal.h"

/* The families the loader knows, as transformers names them. */
typedef struct {
  const char *arch, *hf_class, *model_type;
  int permuted_qk; /* llama.cpp's converter interleaves the rotary halves of llama's q / k rows */
} family;

static const family k_families[] = {
    {"llama", "LlamaForCausalLM", "llama", 1},
    {"qwen2", "Qwen2ForCausalLM", "qwen2", 0},
    {"qwen3", "Qwen3ForCausalLM", "qwen3", 0},
};

typedef struct {
  const family *fam;
  int64_t layers, ctx, d, ff, heads, kv_heads, head_dim, vocab;
  double eps, theta, linear_factor; /* linear_factor 0: no rope scaling */
  int tied;
} hparams;

/* <arch>.<key> into *out (left as it is when absent and not required), within [min, max]: the
 * ranges config.json's reader (src/io/hfconfig.c) allows the field it becomes. */
static ds_status get_int_at(const ds_gguf *g, const char *arch, const char *key, int required, int64_t *out,
                            int64_t min, int64_t max) {
  char k[128];
  snprintf(k, sizeof k, "%s.%s", arch, key);
  int64_t v = *out;
  DS_TRY(ds_gguf_get_int(g, k, required, &v));
  if (v < min || v > max)
    return DS_FAIL(DS_ERR_FORMAT, "%s: '%s' is %lld (must be in [%lld, %lld])", ds_gguf_path(g), k, (long long)v,
                   (long long)min, (long long)max);
  *out = v;
  return DS_OK;
}

static ds_status get_float_at(const ds_gguf *g, const char *arch, const char *key, int required, double *out) {
  char k[128];
  snprintf(k, sizeof k, "%s.%s", arch, key);
  DS_TRY(ds_gguf_get_float(g, k, required, out));
  if (!(*out > 0)) return DS_FAIL(DS_ERR_FORMAT, "%s: '%s' is %g (must be > 0)", ds_gguf_path(g), k, *out);
  return DS_OK;
}

static ds_status read_hparams(const ds_gguf *g, hparams *h) {
  const char *path = ds_gguf_path(g);
  ds_gguf_str arch = {0};
  DS_TRY(ds_gguf_get_str(g, "general.architecture", 1, &arch));
  memset(h, 0, sizeof *h);
  for (size_t i = 0; i < sizeof k_families / sizeof k_families[0]; i++)
    if (strlen(k_families[i].arch) == arch.len && !memcmp(k_families[i].arch, arch.p, (size_t)arch.len))
      h->fam = &k_families[i];
  if (!h->fam)
    return DS_FAIL(DS_ERR_UNSUPPORTED, "%s: general.architecture '%.*s' is not one of llama, qwen2, qwen3", path,
                   arch.len > 64 ? 64 : (int)arch.len, arch.p);
  const char *a = h->fam->arch;
  DS_TRY(get_int_at(g, a, "block_count", 1, &h->layers, 1, DS_CONFIG_MAX_LAYERS));
  DS_TRY(get_int_at(g, a, "context_length", 1, &h->ctx, 1, DS_CONFIG_MAX_POSITIONS));
  DS_TRY(get_int_at(g, a, "embedding_length", 1, &h->d, 1, DS_CONFIG_MAX_HIDDEN));
  DS_TRY(get_int_at(g, a, "feed_forward_length", 1, &h->ff, 1, DS_CONFIG_MAX_INTERMEDIATE));
  DS_TRY(get_int_at(g, a, "attention.head_count", 1, &h->heads, 1, DS_CONFIG_MAX_HEADS));
  h->kv_heads = h->heads;
  DS_TRY(get_int_at(g, a, "attention.head_count_kv", 0, &h->kv_heads, 1, DS_CONFIG_MAX_HEADS));
  if (h->heads % h->kv_heads)
    return DS_FAIL(DS_ERR_FORMAT, "%s: %s.attention.head_count %lld is not a multiple of head_count_kv %lld", path, a,
                   (long long)h->heads, (long long)h->kv_heads);
  h->head_dim = h->d / h->heads;
  DS_TRY(get_int_at(g, a, "attention.key_length", 0, &h->head_dim, 2, DS_CONFIG_MAX_HEAD_DIM));
  int64_t vdim = h->head_dim, rot = h->head_dim;
  DS_TRY(get_int_at(g, a, "attention.value_length", 0, &vdim, 1, DS_CONFIG_MAX_HEAD_DIM));
  DS_TRY(get_int_at(g, a, "rope.dimension_count", 0, &rot, 1, DS_CONFIG_MAX_HEAD_DIM));
  if (vdim != h->head_dim || rot != h->head_dim || h->head_dim % 2)
    return DS_FAIL(DS_ERR_UNSUPPORTED, "%s: key length %lld, value length %lld and rope dimensions %lld differ (or are "
                   "odd): only full rotary heads of one size are supported", path, (long long)h->head_dim,
                   (long long)vdim, (long long)rot);
  DS_TRY(get_float_at(g, a, "attention.layer_norm_rms_epsilon", 1, &h->eps));
  h->theta = 10000.0;
  DS_TRY(get_float_at(g, a, "rope.freq_base", 0, &h->theta));
  char key[128];
  snprintf(key, sizeof key, "%s.rope.scaling.type", a);
  ds_gguf_str st = {0};
  DS_TRY(ds_gguf_get_str(g, key, 0, &st));
  if (st.len && !(st.len == 4 && !memcmp(st.p, "none", 4))) {
    if (!(st.len == 6 && !memcmp(st.p, "linear", 6)))
      return DS_FAIL(DS_ERR_UNSUPPORTED, "%s: %s '%.*s': only linear rope scaling is supported", path, key,
                     st.len > 32 ? 32 : (int)st.len, st.p);
    DS_TRY(get_float_at(g, a, "rope.scaling.factor", 1, &h->linear_factor));
  }
  const ds_gguf_tensor *emb = ds_gguf_find_tensor(g, "token_embd.weight");
  if (!emb) return DS_FAIL(DS_ERR_NOT_FOUND, "%s: no tensor 'token_embd.weight'", path);
  if (emb->ndim != 2 || emb->ne[0] != h->d)
    return DS_FAIL(DS_ERR_FORMAT, "%s: token_embd.weight is not [vocabulary, %lld]", path, (long long)h->d);
  h->vocab = emb->ne[1];
  h->tied = ds_gguf_find_tensor(g, "output.weight") == NULL;
  return DS_OK;
}

/* ---------------------------------------------------------------- tensors */

/* The HF name of a GGUF tensor and the shape it must have ({rows, cols}; cols 0: 1-D), or 0. */
static int hf_name(const hparams *h, const char *name, char *out, size_t cap, int64_t shape[2], int *qk_heads) {
  static const struct {
    const char *gguf, *hf;
    int kind; /* 0 norm [d], 1 q, 2 k, 3 v, 4 o, 5 gate/up, 6 down, 7 head-norm [head_dim] */
  } k_layer[] = {
      {"attn_norm.weight", "input_layernorm.weight", 0}, {"ffn_norm.weight", "post_attention_layernorm.weight", 0},
      {"attn_q.weight", "self_attn.q_proj.weight", 1},   {"attn_k.weight", "self_attn.k_proj.weight", 2},
      {"attn_v.weight", "self_attn.v_proj.weight", 3},   {"attn_output.weight", "self_attn.o_proj.weight", 4},
      {"attn_q.bias", "self_attn.q_proj.bias", 1},       {"attn_k.bias", "self_attn.k_proj.bias", 2},
      {"attn_v.bias", "self_attn.v_proj.bias", 3},       {"ffn_gate.weight", "mlp.gate_proj.weight", 5},
      {"ffn_up.weight", "mlp.up_proj.weight", 5},        {"ffn_down.weight", "mlp.down_proj.weight", 6},
      {"attn_q_norm.weight", "self_attn.q_norm.weight", 7}, {"attn_k_norm.weight", "self_attn.k_norm.weight", 7},
  };
  *qk_heads = 0;
  shape[1] = 0;
  if (!strcmp(name, "token_embd.weight")) {
    shape[0] = h->vocab, shape[1] = h->d;
    return snprintf(out, cap, "model.embed_tokens.weight") > 0;
  }
  if (!strcmp(name, "output.weight")) {
    shape[0] = h->vocab, shape[1] = h->d;
    return snprintf(out, cap, "lm_head.weight") > 0;
  }
  if (!strcmp(name, "output_norm.weight")) {
    shape[0] = h->d;
    return snprintf(out, cap, "model.norm.weight") > 0;
  }
  long long layer;
  int used = 0;
  if (sscanf(name, "blk.%lld.%n", &layer, &used) != 1 || used == 0 || layer < 0 || layer >= h->layers) return 0;
  char digits[32];
  snprintf(digits, sizeof digits, "blk.%lld.", layer);
  if (strncmp(name, digits, strlen(digits))) return 0; /* "blk.01." or "blk.+1." */
  const char *rest = name + used;
  for (size_t i = 0; i < sizeof k_layer / sizeof k_layer[0]; i++) {
    if (strcmp(rest, k_layer[i].gguf)) continue;
    int64_t q = h->heads * h->head_dim, kv = h->kv_heads * h->head_dim;
    int bias = strstr(rest, ".bias") != NULL;
    switch (k_layer[i].kind) {
      case 0: shape[0] = h->d; break;
      case 1: shape[0] = q, shape[1] = h->d, *qk_heads = (int)h->heads; break;
      case 2: shape[0] = kv, shape[1] = h->d, *qk_heads = (int)h->kv_heads; break;
      case 3: shape[0] = kv, shape[1] = h->d; break;
      case 4: shape[0] = h->d, shape[1] = q; break;
      case 5: shape[0] = h->ff, shape[1] = h->d; break;
      case 6: shape[0] = h->d, shape[1] = h->ff; break;
      default: shape[0] = h->head_dim; break;
    }
    if (bias) shape[1] = 0;
    if (!h->fam->permuted_qk) *qk_heads = 0;
    return snprintf(out, cap, "model.layers.%lld.%s", layer, k_layer[i].hf) > 0;
  }
  return 0;
}

/* rows [heads * hd] of cols each, back from llama.cpp's order: in each head, row 2i + j of the
 * file is row j * hd / 2 + i of the HF tensor (j = 0, 1: the two rotary halves). */
static ds_status unpermute_rows(float *w, int64_t rows, int64_t cols, int heads) {
  int64_t hd = rows / heads, half = hd / 2;
  float *tmp = malloc((size_t)(hd * cols) * sizeof *tmp);
  if (!tmp) return DS_FAIL(DS_ERR_NOMEM, "q / k rows");
  for (int h = 0; h < heads; h++) {
    float *head = w + (int64_t)h * hd * cols;
    memcpy(tmp, head, (size_t)(hd * cols) * sizeof *tmp);
    for (int64_t i = 0; i < half; i++)
      for (int j = 0; j < 2; j++)
        memcpy(head + (j * half + i) * cols, tmp + (2 * i + j) * cols, (size_t)cols * sizeof *tmp);
  }
  free(tmp);
  return DS_OK;
}

/* One GGUF tensor's place in the image: its HF name and shape, and the q / k heads to unpermute. */
typedef struct {
  char name[160];
  int64_t shape[2];
  int ndim, qk_heads;
  int skip; /* not filled: the target uses this tensor in its quantized type */
} tensor_plan;

/* Every tensor named and checked against the shapes the config gives, and the set complete. */
static ds_status plan_tensors(const ds_gguf *g, const hparams *h, tensor_plan *plan) {
  const char *path = ds_gguf_path(g);
  size_t n = ds_gguf_tensor_count(g);
  /* embed, norm, head; per layer 2 norms, q k v o, 3 mlp (and Qwen3's q / k norms) */
  int64_t want = 3 - h->tied + h->layers * (9 + 2 * !strcmp(h->fam->arch, "qwen3"));
  int64_t found = 0;
  for (size_t i = 0; i < n; i++) {
    const ds_gguf_tensor *t = ds_gguf_tensor_at(g, i);
    tensor_plan *p = &plan[i];
    if (!hf_name(h, t->name, p->name, sizeof p->name, p->shape, &p->qk_heads))
      return DS_FAIL(DS_ERR_UNSUPPORTED, "%s: tensor '%s' has no place in a %s model%s", path, t->name, h->fam->arch,
                     !strcmp(t->name, "rope_freqs.weight") ? " (llama3 rope frequencies: not supported)" : "");
    int ndim = p->ndim = p->shape[1] ? 2 : 1;
    if (t->ndim != ndim || t->ne[0] != (ndim == 2 ? p->shape[1] : p->shape[0]) ||
        (ndim == 2 && t->ne[1] != p->shape[0]))
      return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' is [%lld, %lld] (ggml order), expected [%lld, %lld]", path,
                     t->name, (long long)t->ne[0], (long long)t->ne[1],
                     (long long)(ndim == 2 ? p->shape[1] : p->shape[0]), (long long)(ndim == 2 ? p->shape[0] : 1));
    /* biases are optional; Qwen3's q / k norms are counted in want */
    found += strstr(t->name, ".bias") == NULL &&
             ((!strstr(t->name, "attn_q_norm") && !strstr(t->name, "attn_k_norm")) || !strcmp(h->fam->arch, "qwen3"));
  }
  if (found != want)
    return DS_FAIL(DS_ERR_FORMAT, "%s: %lld of the %lld weight tensors a %lld-layer %s model needs are there", path,
                   (long long)found, (long long)want, (long long)h->layers, h->fam->arch);
  return DS_OK;
}

/* Tensor t dequantized into dst (in dtype): F32 straight into the image, BF16 through one
 * tensor's fp32 scratch. */
static ds_status fill_tensor(const ds_gguf *g, const ds_gguf_tensor *t, const tensor_plan *p, ds_dtype dtype,
                             void *dst) {
  float *f = dtype == DS_F32 ? dst : malloc((size_t)t->numel * sizeof *f);
  if (!f) return DS_FAIL(DS_ERR_NOMEM, "%s: tensor '%s'", ds_gguf_path(g), t->name);
  ds_status st = ds_gguf_dequantize(g, t, f);
  ds_gguf_release(g, t); /* the image holds it now: the file's pages need not stay resident */
  if (st == DS_OK && p->qk_heads) st = unpermute_rows(f, p->shape[0], p->ndim == 2 ? p->shape[1] : 1, p->qk_heads);
  if (dtype != DS_F32) {
    if (st == DS_OK) ds_convert_from_f32(dst, dtype, f, (size_t)t->numel);
    free(f);
  }
  return st;
}

/* The dtype tensor i takes in the image: its own for an F16 / BF16 matrix under keep16. */
static ds_dtype image_dtype(const ds_gguf_tensor *t, const tensor_plan *p, ds_dtype dtype, int keep16) {
  if (!keep16 || p->ndim != 2) return dtype;
  return t->type == DS_GGML_F16 ? DS_F16 : t->type == DS_GGML_BF16 ? DS_BF16 : dtype;
}

static ds_status weights_image(const ds_gguf *g, const hparams *h, ds_dtype dtype, const char *const *skip,
                               int n_skip, int keep16, unsigned char **image, size_t *size) {
  const char *path = ds_gguf_path(g);
  size_t n = ds_gguf_tensor_count(g);
  tensor_plan *plan = calloc(n ? n : 1, sizeof *plan);
  size_t *offsets = calloc(n ? n : 1, sizeof *offsets);
  ds_st_writer *w = ds_st_writer_new();
  ds_status st = plan && offsets && w ? DS_OK : DS_FAIL(DS_ERR_NOMEM, "%s: tensor table", path);
  if (st == DS_OK) st = plan_tensors(g, h, plan);
  for (size_t i = 0; st == DS_OK && i < n; i++) /* reserved, never written: their pages stay unmapped */
    for (int k = 0; k < n_skip; k++) plan[i].skip |= !strcmp(plan[i].name, skip[k]);
  /* The written tensors first, the skipped ones after them: the image is advised huge pages,
   * and a norm between two skipped matrices would fault a whole 2 MiB page of them in (SmolLM2
   * Q4_1 as stored peaked at 250 MiB instead of 126 when the order was the file's). */
  size_t *slot = calloc(n ? n : 1, sizeof *slot), next = 0;
  if (st == DS_OK && !slot) st = DS_FAIL(DS_ERR_NOMEM, "%s: tensor table", path);
  for (int skipped = 0; skipped < 2; skipped++)
    for (size_t i = 0; i < n && st == DS_OK; i++)
      if (plan[i].skip == skipped) {
        slot[i] = next++;
        st = ds_st_writer_reserve(w, plan[i].name, image_dtype(ds_gguf_tensor_at(g, i), &plan[i], dtype, keep16),
                                  plan[i].ndim, plan[i].shape);
      }
  if (st == DS_OK) st = ds_st_writer_image(w, path, image, size, offsets);
  /* Each tensor lands where the image reserved it: the weights are held once. The tensors are
   * shared out between the threads whole (one barrier for the model, not one per tensor: on a
   * busy machine a barrier per tensor cost seconds); a thread's error message stays in that
   * thread, so a failed tensor is converted again here to report it. */
  int64_t failed = -1;
  if (st == DS_OK) {
#pragma omp parallel for schedule(dynamic, 1) reduction(max : failed)
    for (int64_t i = 0; i < (int64_t)n; i++)
      if (!plan[i].skip && failed < 0) {
        const ds_gguf_tensor *t = ds_gguf_tensor_at(g, (size_t)i);
        if (fill_tensor(g, t, &plan[i], image_dtype(t, &plan[i], dtype, keep16), *image + offsets[slot[i]]) != DS_OK)
          failed = i;
      }
  }
  if (st == DS_OK && failed >= 0) {
    const ds_gguf_tensor *t = ds_gguf_tensor_at(g, (size_t)failed);
    st = fill_tensor(g, t, &plan[failed], image_dtype(t, &plan[failed], dtype, keep16), *image + offsets[slot[failed]]);
    if (st == DS_OK) st = DS_FAIL(DS_ERR_NUMERIC, "%s: tensor '%s' failed to convert in a worker thread", path,
                                  ds_gguf_tensor_at(g, (size_t)failed)->name);
  }
  if (st != DS_OK && *image) {
    ds_st_image_free(*image, *size);
    *image = NULL;
    *size = 0;
  }
  ds_st_writer_free(w);
  free(slot);
  free(offsets);
  free(plan);
  return st;
}

/* ---------------------------------------------------------------- config */

static char *print_json(cJSON *j) {
  char *text = j ? cJSON_Print(j) : NULL;
  cJSON_Delete(j);
  return text;
}

static ds_status config_texts(const ds_gguf *g, const hparams *h, const ds_gguf_special *sp, ds_dtype dtype,
                              char **config, char **generation) {
  cJSON *c = cJSON_CreateObject();
  cJSON *arch = cJSON_AddArrayToObject(c, "architectures");
  cJSON_AddItemToArray(arch, cJSON_CreateString(h->fam->hf_class));
  cJSON_AddStringToObject(c, "model_type", h->fam->model_type);
  cJSON_AddNumberToObject(c, "vocab_size", (double)h->vocab);
  cJSON_AddNumberToObject(c, "hidden_size", (double)h->d);
  cJSON_AddNumberToObject(c, "intermediate_size", (double)h->ff);
  cJSON_AddNumberToObject(c, "num_hidden_layers", (double)h->layers);
  cJSON_AddNumberToObject(c, "num_attention_heads", (double)h->heads);
  cJSON_AddNumberToObject(c, "num_key_value_heads", (double)h->kv_heads);
  cJSON_AddNumberToObject(c, "head_dim", (double)h->head_dim);
  cJSON_AddNumberToObject(c, "max_position_embeddings", (double)h->ctx);
  cJSON_AddNumberToObject(c, "rms_norm_eps", h->eps);
  cJSON_AddNumberToObject(c, "rope_theta", h->theta);
  if (h->linear_factor > 0) {
    cJSON *rs = cJSON_AddObjectToObject(c, "rope_scaling");
    cJSON_AddStringToObject(rs, "rope_type", "linear");
    cJSON_AddNumberToObject(rs, "factor", h->linear_factor);
  }
  cJSON_AddBoolToObject(c, "tie_word_embeddings", h->tied);
  cJSON_AddStringToObject(c, "hidden_act", "silu");
  int bias = ds_gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL;
  if (strcmp(h->fam->arch, "qwen2")) cJSON_AddBoolToObject(c, "attention_bias", bias);
  if (sp->bos >= 0) cJSON_AddNumberToObject(c, "bos_token_id", (double)sp->bos);
  if (sp->eos >= 0) cJSON_AddNumberToObject(c, "eos_token_id", (double)sp->eos);
  if (sp->pad >= 0) cJSON_AddNumberToObject(c, "pad_token_id", (double)sp->pad);
  cJSON_AddStringToObject(c, "torch_dtype", dtype == DS_BF16 ? "bfloat16" : "float32");
  *config = print_json(c);
  cJSON *gen = cJSON_CreateObject();
  if (sp->bos >= 0) cJSON_AddNumberToObject(gen, "bos_token_id", (double)sp->bos);
  if (sp->eos >= 0) cJSON_AddNumberToObject(gen, "eos_token_id", (double)sp->eos);
  if (sp->pad >= 0) cJSON_AddNumberToObject(gen, "pad_token_id", (double)sp->pad);
  *generation = print_json(gen);
  return *config && *generation ? DS_OK : DS_FAIL(DS_ERR_NOMEM, "%s: config.json", ds_gguf_path(g));
}

/* ---------------------------------------------------------------- the model */

struct ds_gguf_model {
  ds_gguf *g;
  hparams h;
  char *text[DS_MODEL_FILE_COUNT]; /* NUL-terminated; chat_template.jinja stays NULL */
};

void ds_gguf_model_release_header(const ds_gguf_model *m) {
  if (m) ds_gguf_release_header(m->g);
}

void ds_gguf_model_release_pages(const ds_gguf_model *m) {
  if (m) ds_gguf_release_pages(m->g);
}

void ds_gguf_model_close(ds_gguf_model *m) {
  if (!m) return;
  for (int i = 0; i < DS_MODEL_FILE_COUNT; i++) free(m->text[i]);
  ds_gguf_close(m->g);
  free(m);
}

ds_status ds_gguf_model_open(const char *path, ds_dtype dtype, ds_gguf_model **out) {
  *out = NULL;
  if (dtype != DS_F32 && dtype != DS_BF16) return DS_FAIL(DS_ERR_ARG, "%s: the weights' dtype must be f32 or bf16", path);
  ds_gguf *g = NULL;
  DS_TRY(ds_gguf_open(path, &g));
  return ds_gguf_model_from(g, dtype, out);
}

ds_status ds_gguf_model_from(ds_gguf *g, ds_dtype dtype, ds_gguf_model **out) {
  *out = NULL;
  ds_gguf_model *m = dtype == DS_F32 || dtype == DS_BF16 ? calloc(1, sizeof *m) : NULL;
  if (!m) {
    ds_status st = dtype == DS_F32 || dtype == DS_BF16
                       ? DS_FAIL(DS_ERR_NOMEM, "%s", ds_gguf_path(g))
                       : DS_FAIL(DS_ERR_ARG, "%s: the weights' dtype must be f32 or bf16", ds_gguf_path(g));
    ds_gguf_close(g);
    return st;
  }
  m->g = g;
  ds_gguf_special sp;
  ds_status st = read_hparams(m->g, &m->h);
  if (st == DS_OK) st = ds_gguf_special_tokens(m->g, m->h.vocab, &sp);
  if (st == DS_OK)
    st = ds_gguf_tokenizer_texts(m->g, &sp, &m->text[DS_MODEL_TOKENIZER], &m->text[DS_MODEL_TOKENIZER_CONFIG]);
  if (st == DS_OK)
    st = config_texts(m->g, &m->h, &sp, dtype, &m->text[DS_MODEL_CONFIG], &m->text[DS_MODEL_GENERATION_CONFIG]);
  if (st == DS_OK) { /* what the metadata gives must be a model config.json's reader takes: refused here, not later */
    const char *cfg = m->text[DS_MODEL_CONFIG], *gen = m->text[DS_MODEL_GENERATION_CONFIG];
    ds_model_config c;
    st = ds_config_parse_model(cfg, strlen(cfg), "config.json", gen, strlen(gen), "generation_config.json", &c);
    if (st != DS_OK) st = ds_error_wrap(st, "%s: its metadata describes a model this engine refuses", ds_gguf_path(g));
  }
  if (st != DS_OK) {
    ds_gguf_model_close(m);
    return st;
  }
  *out = m;
  return DS_OK;
}

const char *ds_gguf_model_path(const ds_gguf_model *m) { return ds_gguf_path(m->g); }

const char *ds_gguf_model_text(const ds_gguf_model *m, ds_model_file f, size_t *len) {
  const char *t = (unsigned)f < DS_MODEL_FILE_COUNT ? m->text[f] : NULL;
  if (len) *len = t ? strlen(t) : 0;
  return t;
}

ds_status ds_gguf_model_weights(const ds_gguf_model *m, ds_dtype dtype, const char *const *skip, int n_skip,
                                int keep16, unsigned char **image, size_t *size) {
  *image = NULL;
  *size = 0;
  if (dtype != DS_F32 && dtype != DS_BF16)
    return DS_FAIL(DS_ERR_ARG, "%s: the weights' dtype must be f32 or bf16", ds_gguf_path(m->g));
  return weights_image(m->g, &m->h, dtype, skip, n_skip, keep16, image, size);
}

const ds_gguf_tensor *ds_gguf_model_tensor_of(const ds_gguf_model *m, const char *hf, int *qk_heads) {
  char name[160];
  int64_t shape[2];
  for (size_t i = 0; i < ds_gguf_tensor_count(m->g); i++) {
    const ds_gguf_tensor *t = ds_gguf_tensor_at(m->g, i);
    if (hf_name(&m->h, t->name, name, sizeof name, shape, qk_heads) && !strcmp(name, hf)) return t;
  }
  *qk_heads = 0;
  return NULL;
}
