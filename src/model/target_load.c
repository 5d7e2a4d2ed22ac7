/* Loading a target (include/dspark/target.h): config, checkpoint, and the weights either
 * converted to fp32 into one buffer or, when the checkpoint stores them in BF16 / F16, used
 * where they lie in its memory mapping (no copy). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __GLIBC__
#include <malloc.h> /* malloc_trim */
#endif

#include "dspark/cache.h"
#include "dspark/dtype.h"
#include "dspark/fileio.h"
#include "dspark/ggml_quant.h"
#include "model/gguf_internal.h"
#include "model/rope_freq.h"
#include "model/target_internal.h"

static const char k_embed_name[] = "model.embed_tokens.weight", k_head_name[] = "lm_head.weight";

/* ---------------------------------------------------------------- the plan */

static int is16(ds_dtype dt) { return dt == DS_BF16 || dt == DS_F16; }

/* Whether the checkpoint stores `name` in BF16 / F16 (an absent tensor is not: the fp32 read
 * reports it). */
static int stored16(const ds_checkpoint *ck, const char *name) {
  const ds_tensor_view *v = ds_ckpt_find(ck, name);
  return v && is16(v->dtype);
}

/* A group of tensors that feed one matmul stays in its checkpoint dtype when every one of them
 * is BF16 / F16; otherwise it is converted to fp32 as a whole (fused, one matmul). */
static int group16(const ds_checkpoint *ck, int64_t layer, const char *const *suffixes, int n) {
  char name[256];
  for (int i = 0; i < n; i++) {
    snprintf(name, sizeof name, "model.layers.%lld.%s", (long long)layer, suffixes[i]);
    if (!stored16(ck, name)) return 0;
  }
  return 1;
}

static const char *const k_qkv[3] = {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"};
static const char *const k_o[1] = {"self_attn.o_proj.weight"};
static const char *const k_gate_up[2] = {"mlp.gate_proj.weight", "mlp.up_proj.weight"};
static const char *const k_down[1] = {"mlp.down_proj.weight"};

/* The name the embedding is read from: a tied checkpoint holding only lm_head.weight ties the
 * embedding to it. */
static const char *embed_source(const ds_target *m, const ds_checkpoint *ck) {
  int from_head = m->cfg.tie_word_embeddings && !ds_ckpt_find(ck, k_embed_name) && ds_ckpt_find(ck, k_head_name);
  return from_head ? k_head_name : k_embed_name;
}

/* --weights as-stored on a GGUF: the quantized dtype the GGUF tensor behind `name` is kept in
 * (one of the types the kernels run), else DS_F32 (the tensor comes from the dequantized image). */
static ds_dtype stored_quant(const ds_model_source *src, const char *name, const ds_gguf_tensor **t, int *qk_heads) {
  const ds_gguf_model *g = ds_model_source_gguf(src);
  ds_dtype dt = DS_F32;
  *t = g && ds_target_weights() == DS_WEIGHTS_AS_STORED ? ds_gguf_model_tensor_of(g, name, qk_heads) : NULL;
  if (*t && !ds_dtype_of_ggml_type((*t)->type, &dt)) dt = DS_F32;
  return dt;
}

static int group_quant(const ds_model_source *src, int64_t layer, const char *const *suffixes, int n) {
  char name[256];
  for (int i = 0; i < n; i++) {
    snprintf(name, sizeof name, "model.layers.%lld.%s", (long long)layer, suffixes[i]);
    const ds_gguf_tensor *t;
    int qk;
    if (stored_quant(src, name, &t, &qk) == DS_F32) return 0;
  }
  return 1;
}

/* The HF names of the tensors plan_storage will keep quantized (same rule, decided from the GGUF
 * alone), so that the image of the GGUF's weights leaves them unconverted: a quantized model
 * loads without a transient fp32 copy of itself. *names is malloc'd (256 bytes a name). */
static int quant_names(const ds_target *m, const ds_model_source *src, char (**names)[256]) {
  int64_t L = m->cfg.num_hidden_layers;
  const char *const *suffixes[4] = {k_qkv, k_o, k_gate_up, k_down};
  int counts[4] = {3, 1, 2, 1}, n = 0;
  *names = malloc((size_t)(7 * L + 2) * sizeof **names);
  if (!*names) return -1;
  for (int64_t l = 0; l < L; l++)
    for (int k = 0; k < 4; k++)
      if (group_quant(src, l, suffixes[k], counts[k]))
        for (int i = 0; i < counts[k]; i++)
          snprintf((*names)[n++], 256, "model.layers.%lld.%s", (long long)l, suffixes[k][i]);
  const char *tables[2] = {k_embed_name, k_head_name};
  for (int i = 0; i < 2; i++) {
    const ds_gguf_tensor *t;
    int qk;
    if (stored_quant(src, tables[i], &t, &qk) != DS_F32) snprintf((*names)[n++], 256, "%s", tables[i]);
  }
  return n;
}

/* Each group: quantized in place (2), 16-bit in place (1) or fp32 (0). --weights f32 converts
 * everything (converted16 says whether that converted a 16-bit matrix). */
static void plan_storage(ds_target *m, const ds_checkpoint *ck, const ds_model_source *src) {
  int keep = ds_target_weights() != DS_WEIGHTS_F32;
  for (int64_t l = 0; l < m->cfg.num_hidden_layers; l++) {
    layer_weights *w = &m->layers[l];
    target_linear *lin[4] = {&w->qkv, &w->wo, &w->gate_up, &w->down};
    const char *const *suffixes[4] = {k_qkv, k_o, k_gate_up, k_down};
    int counts[4] = {3, 1, 2, 1};
    for (int k = 0; k < 4; k++) {
      int g16 = group16(ck, l, suffixes[k], counts[k]);
      lin[k]->mapped = !keep ? 0 : group_quant(src, l, suffixes[k], counts[k]) ? 2 : g16;
      m->converted16 |= !keep && g16;
    }
  }
  const ds_gguf_tensor *t;
  int qk;
  int e16 = stored16(ck, embed_source(m, ck)), h16 = m->own_head && stored16(ck, k_head_name);
  m->converted16 |= !keep && (e16 || h16);
  ds_dtype q = stored_quant(src, embed_source(m, ck), &t, &qk);
  m->embed.dtype = q != DS_F32 ? q : keep && e16 ? ds_ckpt_find(ck, embed_source(m, ck))->dtype : DS_F32;
  q = stored_quant(src, k_head_name, &t, &qk);
  m->lm_head.dtype = !m->own_head ? m->embed.dtype
                     : q != DS_F32 ? q
                     : keep && h16 ? ds_ckpt_find(ck, k_head_name)->dtype : DS_F32;
}

/* Tied embeddings as transformers (5.x) ties them when loading: with tie_word_embeddings a
 * checkpoint holding both tables keeps them apart (tied only when equal, which computes the
 * same), one holding only lm_head.weight ties the embedding to it; untied needs both. */
static void plan_head(ds_target *m, const ds_checkpoint *ck) {
  int has_head = ds_ckpt_find(ck, k_head_name) != NULL;
  m->own_head = !m->cfg.tie_word_embeddings || (has_head && ds_ckpt_find(ck, k_embed_name));
}

/* ---------------------------------------------------------------- the fp32 buffer */

static void set_fused(target_linear *t, float *p, int64_t rows) {
  t->seg[0] = (ds_weight){p, DS_F32};
  t->seg_rows[0] = rows;
  t->n_seg = 1;
}

/* Carves the fp32 buffer into named pointers; called twice: once to count (base NULL), once
 * to assign, so the size table and the layout cannot disagree. Groups kept in 16 bits take
 * no room here. */
static size_t layout_params(ds_target *m, float *base) {
  const ds_model_config *c = &m->cfg;
  size_t off = 0;
#define TAKE(ptr, count)                       \
  do {                                         \
    if (base) (ptr) = base + off;              \
    off += (size_t)(count);                    \
  } while (0)
#define TAKE_LINEAR(lin, rows, cols)                                 \
  do {                                                               \
    if (!(lin).mapped) {                                             \
      if (base) set_fused(&(lin), base + off, (rows));               \
      off += (size_t)(rows) * (size_t)(cols);                        \
    }                                                                \
  } while (0)
  int64_t d = c->hidden_size, I = c->intermediate_size, V = c->vocab_size;
  float *p = NULL;
  if (m->embed.dtype == DS_F32) {
    TAKE(p, V * d);
    if (base) m->embed.data = p;
  }
  if (!m->own_head) {
    if (base) m->lm_head = m->embed;
  } else if (m->lm_head.dtype == DS_F32) {
    TAKE(p, V * d);
    if (base) m->lm_head.data = p;
  }
  TAKE(m->norm, d);
  for (int64_t l = 0; l < c->num_hidden_layers; l++) {
    layer_weights *w = &m->layers[l];
    TAKE_LINEAR(w->qkv, m->qkv_dim, d);
    if (c->attention_bias) TAKE(w->bqkv, m->qkv_dim);
    if (c->qk_norm) {
      TAKE(w->q_norm, c->head_dim);
      TAKE(w->k_norm, c->head_dim);
    }
    TAKE_LINEAR(w->wo, d, m->q_dim);
    if (c->o_proj_bias) TAKE(w->bo, d);
    TAKE_LINEAR(w->gate_up, 2 * I, d);
    if (c->mlp_bias) TAKE(w->b_gate_up, 2 * I);
    TAKE_LINEAR(w->down, d, I);
    if (c->mlp_bias) TAKE(w->b_down, d);
    TAKE(w->in_norm, d);
    TAKE(w->post_norm, d);
  }
#undef TAKE_LINEAR
#undef TAKE
  return off;
}

/* ---------------------------------------------------------------- checks before allocating */

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

/* ---------------------------------------------------------------- reading */

static ds_status read2(const ds_checkpoint *ck, const char *name, int64_t rows, int64_t cols, float *dst) {
  int64_t shape[2] = {rows, cols};
  return ds_ckpt_read_f32(ck, name, 2, shape, dst);
}

static ds_status read1(const ds_checkpoint *ck, const char *name, int64_t n, float *dst) {
  return ds_ckpt_read_f32(ck, name, 1, &n, dst);
}

/* A buffer of nbytes the target owns (freed with it). */
static ds_status own(ds_target *m, size_t nbytes, void **out) {
  void **owned = realloc(m->owned, (size_t)(m->n_owned + 1) * sizeof *owned);
  if (!owned) return DS_FAIL(DS_ERR_NOMEM, "out of memory");
  m->owned = owned;
  if (!(*out = ds_malloc_aligned(nbytes ? nbytes : 1, "aligned copy of a 16-bit tensor"))) return DS_ERR_NOMEM;
  m->owned[m->n_owned++] = *out;
  return DS_OK;
}

/* A BF16 / F16 tensor [rows, cols], checked (shape, finite values) and used where it lies; a
 * tensor at an odd offset in its file (possible, if unusual) is copied to aligned memory
 * first, still in its dtype. */
static ds_status map16(ds_target *m, const char *name, int64_t rows, int64_t cols, ds_weight *out) {
  int64_t shape[2] = {rows, cols};
  const ds_tensor_view *v;
  DS_TRY(ds_ckpt_view_checked(m->ck, name, 2, shape, &v));
  DS_CHECK(is16(v->dtype));
  const void *data = v->data;
  if ((uintptr_t)data % 2 != 0) {
    void *copy = NULL;
    DS_TRY(own(m, v->nbytes, &copy));
    memcpy(copy, data, v->nbytes);
    data = copy;
  } else {
    m->ck_mapped = 1; /* used where it lies: the checkpoint stays open */
  }
  *out = (ds_weight){data, v->dtype};
  m->mapped_bytes += v->nbytes;
  m->mapped_of[v->dtype] += v->nbytes;
  m->mapped_dtype = m->mapped_dtype == DS_F32 ? v->dtype : m->mapped_dtype;
  return DS_OK;
}

/* A GGUF tensor kept in its quantized type as the HF tensor `name` [rows, cols], used where it
 * lies in the target's own mapping of the file. llama's q / k rows stay in the file's interleaved
 * order: *pair_heads gets their heads (0 for any other tensor), and the forward reorders the
 * product's columns (a copy of the rows in HF order would be held beside their packed copy). */
static ds_status map_quant(ds_target *m, const ds_model_source *src, const char *name, int64_t rows, int64_t cols,
                           ds_weight *out, int64_t *pair_heads) {
  const ds_gguf_tensor *st;
  int qk;
  ds_dtype dt = stored_quant(src, name, &st, &qk);
  DS_CHECK(dt != DS_F32 && m->gguf);
  const ds_gguf_tensor *t = ds_gguf_find_tensor(m->gguf, st->name);
  if (!t || t->type != st->type || t->ndim != 2 || t->ne[0] != cols || t->ne[1] != rows || cols % ds_quant_block(dt))
    return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' (%s) is not the [%lld, %lld] matrix of %s (or the file changed)",
                   m->dir, st->name, ds_dtype_name(dt), (long long)rows, (long long)cols, name);
  size_t rb = ds_quant_row_bytes(dt, cols);
  if (t->nbytes != rb * (size_t)rows)
    return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' holds %zu bytes, not %zu", m->dir, t->name, t->nbytes, rb * (size_t)rows);
  int64_t bad = ds_quant_first_nonfinite_row(dt, t->data, rows, cols);
  if (bad >= 0)
    return DS_FAIL(DS_ERR_NUMERIC, "%s: tensor '%s' (%s): a scale of row %lld is not finite (NaN or infinity)", m->dir,
                   t->name, ds_dtype_name(dt), (long long)bad);
  if (qk && (!pair_heads || rows % qk || (rows / qk) % 2))
    return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s': %lld rows are not %d heads of an even size", m->dir, t->name,
                   (long long)rows, qk);
  if (pair_heads) *pair_heads = qk;
  const void *data = t->data;
  *out = (ds_weight){data, dt};
  m->be->prepare_weight(*out, rows, cols); /* the cpu kernels' packed copy, the pages dropped */
  m->mapped_bytes += t->nbytes;
  m->mapped_of[dt] += t->nbytes;
  m->n_quant_mapped++;
  m->mapped_dtype = m->mapped_dtype == DS_F32 ? dt : m->mapped_dtype;
  return DS_OK;
}

/* One group of tensors (suffixes, each rows[i] x cols): into the fp32 buffer one after the
 * other (the fused segment layout_params placed), or mapped, one segment each. */
static ds_status load_linear(ds_target *m, const ds_model_source *src, int64_t layer, target_linear *t,
                             const char *const *suffixes, const int64_t *rows, int n, int64_t cols) {
  char name[256];
  float *dst = t->mapped ? NULL : (float *)t->seg[0].data;
  for (int i = 0; i < n; i++) {
    snprintf(name, sizeof name, "model.layers.%lld.%s", (long long)layer, suffixes[i]);
    if (t->mapped) {
      if (t->mapped == 2) DS_TRY(map_quant(m, src, name, rows[i], cols, &t->seg[i], &t->seg_pair_heads[i]));
      else DS_TRY(map16(m, name, rows[i], cols, &t->seg[i]));
      t->seg_rows[i] = rows[i];
    } else {
      DS_TRY(read2(m->ck, name, rows[i], cols, dst));
      dst += rows[i] * cols;
    }
  }
  if (t->mapped) t->n_seg = n;
  return DS_OK;
}

static ds_status load_weights(ds_target *m, const ds_model_source *src) {
  const ds_model_config *c = &m->cfg;
  const ds_checkpoint *ck = m->ck;
  int64_t d = c->hidden_size, I = c->intermediate_size, V = c->vocab_size;
  char name[256];
  if (m->embed.dtype == DS_F32) DS_TRY(read2(ck, embed_source(m, ck), V, d, (float *)m->embed.data));
  else if (ds_dtype_is_quantized(m->embed.dtype)) DS_TRY(map_quant(m, src, embed_source(m, ck), V, d, &m->embed, NULL));
  else DS_TRY(map16(m, embed_source(m, ck), V, d, &m->embed));
  if (!m->own_head) m->lm_head = m->embed;
  else if (m->lm_head.dtype == DS_F32) DS_TRY(read2(ck, k_head_name, V, d, (float *)m->lm_head.data));
  else if (ds_dtype_is_quantized(m->lm_head.dtype)) DS_TRY(map_quant(m, src, k_head_name, V, d, &m->lm_head, NULL));
  else DS_TRY(map16(m, k_head_name, V, d, &m->lm_head));
  DS_TRY(read1(ck, "model.norm.weight", d, m->norm));
  int64_t qkv_rows[3] = {m->q_dim, m->kv_dim, m->kv_dim}, d_rows[1] = {d}, gu_rows[2] = {I, I};
  for (int64_t l = 0; l < c->num_hidden_layers; l++) {
    layer_weights *w = &m->layers[l];
#define NAME(fmt) (snprintf(name, sizeof name, "model.layers.%lld." fmt, (long long)l), name)
    DS_TRY(load_linear(m, src, l, &w->qkv, k_qkv, qkv_rows, 3, d));
    if (c->attention_bias) {
      DS_TRY(read1(ck, NAME("self_attn.q_proj.bias"), m->q_dim, w->bqkv));
      DS_TRY(read1(ck, NAME("self_attn.k_proj.bias"), m->kv_dim, w->bqkv + m->q_dim));
      DS_TRY(read1(ck, NAME("self_attn.v_proj.bias"), m->kv_dim, w->bqkv + m->q_dim + m->kv_dim));
    }
    if (c->qk_norm) {
      DS_TRY(read1(ck, NAME("self_attn.q_norm.weight"), c->head_dim, w->q_norm));
      DS_TRY(read1(ck, NAME("self_attn.k_norm.weight"), c->head_dim, w->k_norm));
    }
    DS_TRY(load_linear(m, src, l, &w->wo, k_o, d_rows, 1, m->q_dim));
    if (c->o_proj_bias) DS_TRY(read1(ck, NAME("self_attn.o_proj.bias"), d, w->bo));
    DS_TRY(load_linear(m, src, l, &w->gate_up, k_gate_up, gu_rows, 2, d));
    DS_TRY(load_linear(m, src, l, &w->down, k_down, d_rows, 1, I));
    if (c->mlp_bias) {
      DS_TRY(read1(ck, NAME("mlp.gate_proj.bias"), I, w->b_gate_up));
      DS_TRY(read1(ck, NAME("mlp.up_proj.bias"), I, w->b_gate_up + I));
      DS_TRY(read1(ck, NAME("mlp.down_proj.bias"), d, w->b_down));
    }
    DS_TRY(read1(ck, NAME("input_layernorm.weight"), d, w->in_norm));
    DS_TRY(read1(ck, NAME("post_attention_layernorm.weight"), d, w->post_norm));
#undef NAME
    /* a GGUF's quantized weights are read from the target's own mapping: what the reads of this
     * layer's small tensors mapped of the model source's (their neighbours, a folio around each
     * read) is dropped as it goes, not at the end: the load's peak is the steady state's */
    if (m->gguf && !m->ck_mapped) ds_gguf_model_release_pages(ds_model_source_gguf(src));
  }
  return DS_OK;
}

/* ---------------------------------------------------------------- device backends */

/* A host pointer into m->params, moved to the same offset in its device copy. */
static float *rebased(const ds_target *m, float *dev_params, float *p) {
  if (!p || p < m->params || p >= m->params + m->n_params) return p;
  return dev_params + (p - m->params);
}

/* A weight in device memory: fp32 ones are in the device copy of params; a 16-bit one (used in
 * place on the host) is uploaded once, in its dtype (a tied table: once for both uses). */
static ds_status upload_weight(ds_target *m, float *dev_params, ds_weight *w, const void *const *host_of,
                               void *const *dev_of, int n_known) {
  if (w->dtype == DS_F32) {
    w->data = rebased(m, dev_params, (float *)w->data);
    return DS_OK;
  }
  for (int i = 0; i < n_known; i++)
    if (host_of[i] == w->data) {
      w->data = dev_of[i];
      return DS_OK;
    }
  return DS_FAIL(DS_ERR_ARG, "internal: a 16-bit weight was not uploaded");
}

/* Moves every weight (and the rope table) into the backend's memory, after a host load: one
 * copy of params, one buffer per 16-bit tensor; the host copies are released. */
static ds_status upload_weights(ds_target *m) {
  const ds_backend *be = m->be;
  const ds_model_config *c = &m->cfg;
  /* the 16-bit tensors in place: every distinct one */
  int cap = 2 + 3 * 4 * (int)c->num_hidden_layers, n16 = 0;
  const void **host_of = calloc((size_t)cap, sizeof *host_of);
  void **dev_of = calloc((size_t)cap, sizeof *dev_of);
  m->dev_weights = calloc((size_t)cap + 2, sizeof *m->dev_weights);
  if (!host_of || !dev_of || !m->dev_weights) {
    free(host_of), free(dev_of);
    return DS_FAIL(DS_ERR_NOMEM, "out of memory for the weight table");
  }
  ds_status st = DS_OK;
  float *dev_params = be->alloc((m->n_params ? m->n_params : 1) * sizeof(float), "model weights");
  float *dev_freq = be->alloc((size_t)c->head_dim / 2 * sizeof(float), "rope table");
  if (!dev_params || !dev_freq) st = DS_ERR_NOMEM;
  m->dev_weights[m->n_dev_weights++] = dev_params; /* dev_freq becomes m->inv_freq */
  if (st == DS_OK) {
    be->copy_to_device(dev_params, m->params, m->n_params * sizeof(float));
    be->copy_to_device(dev_freq, m->inv_freq, (size_t)c->head_dim / 2 * sizeof(float));
  }
  /* every ds_weight of the model, then the plain fp32 vectors */
  ds_weight *ws[2 + 7 * 512];
  int nw = 0;
  ws[nw++] = &m->embed;
  ws[nw++] = &m->lm_head;
  for (int64_t l = 0; st == DS_OK && l < c->num_hidden_layers; l++) {
    layer_weights *w = &m->layers[l];
    target_linear *lin[] = {&w->qkv, &w->wo, &w->gate_up, &w->down};
    for (int k = 0; k < 4; k++)
      for (int s = 0; s < lin[k]->n_seg; s++) {
        ds_weight *x = &lin[k]->seg[s];
        if (x->dtype == DS_F32) { x->data = rebased(m, dev_params, (float *)x->data); continue; }
        if (nw == (int)(sizeof ws / sizeof *ws)) { st = DS_FAIL(DS_ERR_UNSUPPORTED, "too many layers"); break; }
        ws[nw++] = x;
      }
    float **vec[] = {&w->bqkv, &w->q_norm, &w->k_norm, &w->bo, &w->b_gate_up, &w->b_down, &w->in_norm, &w->post_norm};
    for (int k = 0; k < 8; k++) *vec[k] = rebased(m, dev_params, *vec[k]);
  }
  for (int i = 0; st == DS_OK && i < nw; i++) {
    ds_weight *w = ws[i];
    if (w->dtype == DS_F32) continue;
    int known = 0;
    for (int k = 0; k < n16; k++) known |= host_of[k] == w->data;
    if (known) continue;
    size_t nbytes = (size_t)ds_dtype_size(w->dtype) *
                    (size_t)(w == &m->embed || w == &m->lm_head ? c->vocab_size * c->hidden_size : 0);
    if (!nbytes) { /* a layer segment: its size from the segment table */
      for (int64_t l = 0; !nbytes && l < c->num_hidden_layers; l++) {
        layer_weights *lw = &m->layers[l];
        target_linear *lin[] = {&lw->qkv, &lw->wo, &lw->gate_up, &lw->down};
        int64_t cols[] = {c->hidden_size, m->q_dim, c->hidden_size, c->intermediate_size};
        for (int k = 0; k < 4; k++)
          for (int s = 0; s < lin[k]->n_seg; s++)
            if (&lin[k]->seg[s] == w) nbytes = (size_t)ds_dtype_size(w->dtype) * (size_t)(lin[k]->seg_rows[s] * cols[k]);
      }
    }
    void *d = be->alloc(nbytes, "model weights (16-bit)");
    if (!d) { st = DS_ERR_NOMEM; break; }
    be->copy_to_device(d, w->data, nbytes);
    host_of[n16] = w->data;
    dev_of[n16++] = d;
    m->dev_weights[m->n_dev_weights++] = d;
  }
  for (int i = 0; st == DS_OK && i < nw; i++) st = upload_weight(m, dev_params, ws[i], host_of, dev_of, n16);
  if (st == DS_OK) { /* fp32 embed / head (not in ws' 16-bit pass) and the final norm */
    m->norm = rebased(m, dev_params, m->norm);
    be->synchronize();
  }
  free(host_of);
  free(dev_of);
  /* the host copies go, whatever happened: from here on the target's pointers are the backend's */
  ds_free_aligned(m->params);
  m->params = NULL;
  for (int i = 0; i < m->n_owned; i++) ds_free_aligned(m->owned[i]);
  m->n_owned = 0;
  ds_ckpt_close(m->ck);
  m->ck = NULL;
  free(m->inv_freq);
  m->inv_freq = dev_freq;
  return st;
}

ds_status ds_target_load_source(ds_model_source *src, const ds_backend *backend, uint64_t *weights_xxh64,
                                ds_target **out) {
  *out = NULL;
#ifdef __GLIBC__
  /* what was freed before (a GGUF tokenizer's conversion: about 10 MB on SmolLM2) given back to
   * the system: the weights' copies lie in their own huge-page memory and would not reuse it */
  malloc_trim(0);
#endif
  ds_target *m = ds_calloc(1, sizeof *m, "target model");
  if (!m) return DS_ERR_NOMEM;
  m->be = backend ? backend : ds_backend_cpu();
  m->mapped_dtype = DS_F32;
  m->dir = strdup(ds_model_source_path(src));
  m->config_label = strdup(ds_model_source_label(src, DS_MODEL_CONFIG));
  if (!m->dir || !m->config_label) { ds_target_free(m); return DS_FAIL(DS_ERR_NOMEM, "path"); }
  ds_status st = ds_model_source_config(src, &m->cfg);
  if (st != DS_OK) goto fail;
  const ds_model_config *c = &m->cfg;
  if (c->head_dim > 2048) {
    st = DS_FAIL(DS_ERR_UNSUPPORTED, "%s: head_dim %lld exceeds 2048", m->config_label, (long long)c->head_dim);
    goto fail;
  }
  m->q_dim = c->num_attention_heads * c->head_dim;
  m->kv_dim = c->num_key_value_heads * c->head_dim;
  m->qkv_dim = m->q_dim + 2 * m->kv_dim;
  m->layers = ds_calloc((size_t)c->num_hidden_layers, sizeof *m->layers, "layer table");
  m->inv_freq = ds_malloc((size_t)c->head_dim / 2 * sizeof(float), "rope table");
  if (!m->layers || !m->inv_freq) { st = DS_ERR_NOMEM; goto fail; }
  char(*skip)[256] = NULL;
  int n_skip = 0;
  int gguf = ds_model_source_gguf(src) != NULL;
  ds_weights_mode mode = ds_target_weights();
  m->from_gguf = gguf;
  /* the hash names the model (ds_model_source_weights' fp32 image), not how it is held: a GGUF
   * held as stored or in bf16 is converted to fp32 once more for it, the image then freed */
  int hashed = weights_xxh64 && gguf && (mode == DS_WEIGHTS_AS_STORED || mode == DS_WEIGHTS_BF16);
  if (hashed && (st = ds_model_source_weights_hash(src, weights_xxh64)) != DS_OK) goto fail;
  /* as stored: a GGUF's F16 / BF16 matrices used in place through the 16-bit path, as a
   * directory's are, and its quantized ones left out of the image */
  int as_stored = gguf && mode == DS_WEIGHTS_AS_STORED;
  if (as_stored && (n_skip = quant_names(m, src, &skip)) < 0) {
    st = DS_FAIL(DS_ERR_NOMEM, "out of memory");
    goto fail;
  }
  const char **skip_ptrs = n_skip ? malloc((size_t)n_skip * sizeof *skip_ptrs) : NULL;
  for (int i = 0; skip_ptrs && i < n_skip; i++) skip_ptrs[i] = skip[i];
  st = n_skip && !skip_ptrs ? DS_FAIL(DS_ERR_NOMEM, "out of memory")
                            : ds_model_source_weights_except(src, skip_ptrs, skip_ptrs ? n_skip : 0, as_stored, &m->ck);
  free(skip_ptrs);
  free(skip);
  if (st != DS_OK) goto fail;
  if (weights_xxh64 && !hashed && (st = ds_cache_hash_checkpoint(m->ck, weights_xxh64)) != DS_OK) goto fail;
  plan_head(m, m->ck);
  plan_storage(m, m->ck, src);
  if (as_stored && (st = ds_gguf_open(ds_model_source_path(src), &m->gguf)) != DS_OK) goto fail;
  m->n_params = layout_params(m, NULL);
  if ((st = preflight(m, m->ck)) == DS_OK) {
    m->params = ds_malloc_huge((m->n_params ? m->n_params : 1) * sizeof(float), "model weights");
    if (!m->params) st = DS_ERR_NOMEM;
  }
  if (st == DS_OK) {
    layout_params(m, m->params);
    ds_rope_inv_freq(c, m->inv_freq);
    /* every tensor converted once (none used in place): an in-memory checkpoint (a GGUF's) gives
     * each one back as it is read, so the weights are not held twice while they load */
    int any16 = 0;
    for (size_t i = 0; i < ds_ckpt_count(m->ck); i++) any16 |= is16(ds_ckpt_tensor(m->ck, i)->dtype);
    if (!any16) ds_ckpt_read_once(m->ck);
    st = load_weights(m, src);
  }
  /* every tensor left out of the image was taken from the GGUF, none read as the image's zeros */
  if (st == DS_OK && n_skip && m->n_quant_mapped < n_skip)
    st = DS_FAIL(DS_ERR_INTERNAL, "%s: %d of the %d tensors kept quantized were used", m->dir, m->n_quant_mapped, n_skip);
  if (st == DS_OK && !m->ck_mapped) {
    ds_ckpt_close(m->ck); /* nothing lies in it: the mapping (or a GGUF's image) is not needed */
    m->ck = NULL;
  }
  if (st == DS_OK && m->gguf && m->mapped_bytes == 0) {
    ds_gguf_close(m->gguf); /* no tensor of a type kept quantized */
    m->gguf = NULL;
  }
  if (st == DS_OK && m->gguf && m->be->device_memory)
    st = DS_FAIL(DS_ERR_UNSUPPORTED, "%s: quantized weights run on the cpu backend only; give --weights bf16 or f32 "
                 "for the %s backend", m->dir, m->be->name);
  if ((st == DS_ERR_FORMAT || st == DS_ERR_NOT_FOUND) && c->defaulted[0])
    ds_error_wrap(st, "%s leaves these fields to %s's defaults (as transformers does): %s", m->config_label,
                  ds_config_class_name(c->arch), c->defaulted);
  /* what it holds, recorded before a device backend takes the weights over */
  m->held = m->mapped_bytes == 0 ? DS_WEIGHTS_F32 : gguf && mode == DS_WEIGHTS_BF16 ? DS_WEIGHTS_BF16
                                                                                   : DS_WEIGHTS_AS_STORED;
  if (st == DS_OK && m->be->device_memory) st = upload_weights(m);
  if (st != DS_OK) goto fail;
  /* the metadata (a tokenizer's megabytes among it) was read: its pages need not stay resident
   * beside the weights, twice (the model source's mapping and this one); nor, when no weight
   * lies in it, any page of the model source's mapping: reading its small tensors to convert
   * them mapped megabytes of their neighbours (SmolLM2 Q4_1: 40 MB of it resident after load) */
  ds_gguf_release_header(m->gguf);
  if (m->ck_mapped) ds_gguf_model_release_header(ds_model_source_gguf(src));
  else ds_gguf_model_release_pages(ds_model_source_gguf(src));
  *out = m;
  return DS_OK;
fail:
  ds_target_free(m);
  return st;
}

ds_status ds_target_load(const char *model, const ds_backend *backend, ds_target **out) {
  *out = NULL;
  ds_model_source *src;
  DS_TRY(ds_model_source_open(model, &src));
  ds_status st = ds_target_load_source(src, backend, NULL, out);
  ds_model_source_close(src);
  return st;
}

void ds_target_free(ds_target *m) {
  if (!m) return;
  ds_release_packed_weights(); /* bf16 copies keyed by the addresses freed below */
  target_workspace_free(m->be, &m->ws);
  ds_free_aligned(m->params);
  for (int i = 0; i < m->n_dev_weights; i++) m->be->free(m->dev_weights[i]);
  free(m->dev_weights);
  for (int i = 0; i < m->n_owned; i++) ds_free_aligned(m->owned[i]);
  free(m->owned);
  ds_ckpt_close(m->ck); /* after the last use of a mapped weight */
  ds_gguf_close(m->gguf);
  free(m->layers);
  if (m->be->device_memory) m->be->free(m->inv_freq);
  else free(m->inv_freq);
  free(m->dir);
  free(m->config_label);
  free(m);
}

const ds_model_config *ds_target_config(const ds_target *m) { return &m->cfg; }
ds_weight ds_target_embed(const ds_target *m) { return m->embed; }
ds_weight ds_target_lm_head(const ds_target *m) { return m->lm_head; }
int ds_target_head_is_embedding(const ds_target *m) { return !m->own_head; }

ds_weights_mode ds_target_weights_held(const ds_target *m) { return m->held; }

/* a GGUF: DS_WEIGHTS_DEQUANTIZED converts every tensor to fp32; a directory: it keeps the
 * 16-bit matrices in place, as every mode but f32 does */
int ds_target_weights_as_before(const ds_target *m) {
  return m->from_gguf ? m->mapped_bytes == 0 : !m->converted16;
}

size_t ds_target_mapped_bytes(const ds_target *m, ds_dtype dt) {
  return (unsigned)dt < DS_DTYPE_COUNT ? m->mapped_of[dt] : 0;
}

void ds_target_weight_memory(const ds_target *m, size_t *f32_bytes, size_t *mapped_bytes, ds_dtype *mapped_dtype) {
  if (f32_bytes) *f32_bytes = m->n_params * sizeof(float);
  if (mapped_bytes) *mapped_bytes = m->mapped_bytes;
  if (mapped_dtype) *mapped_dtype = m->mapped_dtype;
}
