/* The student's training forward (include/dspark/student.h): a batch of packed sequences
 * through the decoder layers, keeping what the backward needs, and the hooks a loss uses
 * (final hidden state, intermediate layers, logits of a row chunk and their backward). Each
 * step is one call of the backend seam, the same kernels as the target and the draft. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/student_internal.h"

/* ---------------------------------------------------------------- activations */

/* Carves the arena for R rows; with base NULL only counts (floats). */
static size_t layout_acts(const ds_student *s, student_acts *a, float *base, int64_t R) {
  const ds_model_config *c = &s->cfg;
  int64_t d = c->hidden_size, I = c->intermediate_size, Hq = c->num_attention_heads, Hkv = c->num_key_value_heads;
  int64_t qn = c->qk_norm ? 1 : 0;
  size_t off = 0;
#define TAKE(ptr, count)                                    \
  do {                                                      \
    if (base) (ptr) = (count) != 0 ? base + off : NULL;     \
    off += ((size_t)(count) + 15) & ~(size_t)15; /* 64 B */ \
  } while (0)
  for (int64_t l = 0; l < c->num_hidden_layers; l++) {
    student_layer_acts tmp, *la = base ? &a->layers[l] : &tmp;
    TAKE(la->h_in, R * d);
    TAKE(la->hn, R * d);
    TAKE(la->rstd_in, R);
    TAKE(la->q_pre, qn * R * s->q_dim);
    TAKE(la->q_rstd, qn * R * Hq);
    TAKE(la->q, R * s->q_dim);
    TAKE(la->k_pre, qn * R * s->kv_dim);
    TAKE(la->k_rstd, qn * R * Hkv);
    TAKE(la->k, R * s->kv_dim);
    TAKE(la->v, R * s->kv_dim);
    TAKE(la->attn, R * s->q_dim);
    TAKE(la->lse, R * Hq);
    TAKE(la->h_mid, R * d);
    TAKE(la->hp, R * d);
    TAKE(la->rstd_post, R);
    TAKE(la->gu, R * 2 * I);
    TAKE(la->act, R * I);
  }
  TAKE(a->h_last, R * d);
  TAKE(a->h, R * d);
  TAKE(a->rstd_final, R);
#undef TAKE
  return off;
}

void student_acts_free(student_acts *a) {
  ds_free_aligned(a->arena);
  free(a->layers);
  free(a->ids);
  free(a->pos);
  free(a->seq_off);
  memset(a, 0, sizeof *a);
}

static ds_status acts_reserve(ds_student *s, int64_t R, int64_t n_seqs) {
  student_acts *a = &s->acts;
  if (a->arena && R <= a->R && n_seqs <= a->n_seqs_cap) return DS_OK;
  int64_t newR = R > a->R ? R : a->R, newS = n_seqs > a->n_seqs_cap ? n_seqs : a->n_seqs_cap;
  student_acts_free(a);
  a->layers = ds_calloc((size_t)s->cfg.num_hidden_layers, sizeof(student_layer_acts), "student activations");
  size_t n = layout_acts(s, a, NULL, newR);
  a->arena = ds_malloc_aligned(n * sizeof(float), "student activations");
  a->ids = ds_malloc((size_t)newR * sizeof(int32_t), "student token ids");
  a->pos = ds_malloc((size_t)newR * sizeof(int64_t), "student positions");
  a->seq_off = ds_malloc((size_t)(newS + 1) * sizeof(int64_t), "student sequence offsets");
  if (!a->layers || !a->arena || !a->ids || !a->pos || !a->seq_off) {
    student_acts_free(a);
    return DS_FAIL(DS_ERR_NOMEM, "student: out of memory keeping the activations of %lld rows", (long long)R);
  }
  layout_acts(s, a, a->arena, newR);
  a->R = newR;
  a->n_seqs_cap = newS;
  return DS_OK;
}

/* ---------------------------------------------------------------- forward */

static ds_status check_batch(const ds_student *s, const ds_student_batch *b, int64_t *rows) {
  const ds_model_config *c = &s->cfg;
  if (b->n_seqs < 1 || b->seq_len < 1 || !b->ids)
    return DS_FAIL(DS_ERR_ARG, "student: a batch needs at least one sequence of at least one token (got %lld x %lld)",
                   (long long)b->n_seqs, (long long)b->seq_len);
  *rows = 0;
  for (int64_t q = 0; q < b->n_seqs; q++) {
    int64_t len = b->lengths ? b->lengths[q] : b->seq_len;
    if (len < 1 || len > b->seq_len)
      return DS_FAIL(DS_ERR_RANGE, "student: sequence %lld has length %lld, outside [1, %lld]", (long long)q,
                     (long long)len, (long long)b->seq_len);
    if (len > c->max_position_embeddings)
      return DS_FAIL(DS_ERR_RANGE, "student: sequence %lld has %lld tokens, beyond max_position_embeddings = %lld",
                     (long long)q, (long long)len, (long long)c->max_position_embeddings);
    for (int64_t t = 0; t < len; t++) {
      int32_t id = b->ids[q * b->seq_len + t];
      if (id < 0 || id >= c->vocab_size)
        return DS_FAIL(DS_ERR_RANGE, "student: sequence %lld, position %lld: token id %d outside the vocabulary "
                       "[0, %lld)", (long long)q, (long long)t, id, (long long)c->vocab_size);
    }
    *rows += len;
  }
  return DS_OK;
}

/* The pre-norm projection output x_pre (n, H*hd) -> x: per-head rmsnorm (Qwen3) then rope. Without
 * q/k norms the projection wrote x itself and only rope runs. */
static void norm_rope(const ds_student *s, float *x, float *rstd, const float *x_pre, const float *w,
                      const int64_t *pos, int64_t n, int64_t heads) {
  int64_t hd = s->cfg.head_dim;
  if (w) s->be->rmsnorm(x, rstd, x_pre, w, n * heads, hd, (float)s->cfg.rms_norm_eps);
  s->be->rope(x, heads * hd, pos, s->inv_freq, n, heads, hd);
}

ds_status ds_student_forward(ds_student *s, const ds_student_batch *b) {
  const ds_model_config *c = &s->cfg;
  const ds_backend *be = s->be;
  int64_t R = 0;
  s->acts.valid = 0;
  DS_TRY(check_batch(s, b, &R));
  DS_TRY(acts_reserve(s, R, b->n_seqs));
  student_acts *a = &s->acts;
  int64_t d = c->hidden_size, I = c->intermediate_size, Hq = c->num_attention_heads, Hkv = c->num_key_value_heads;
  float eps = (float)c->rms_norm_eps;
  a->seq_off[0] = 0;
  for (int64_t q = 0; q < b->n_seqs; q++) {
    int64_t len = b->lengths ? b->lengths[q] : b->seq_len, r0 = a->seq_off[q];
    memcpy(a->ids + r0, b->ids + q * b->seq_len, (size_t)len * sizeof(int32_t));
    for (int64_t t = 0; t < len; t++) a->pos[r0 + t] = t;
    a->seq_off[q + 1] = r0 + len;
  }
  a->rows = R;
  a->n_seqs = b->n_seqs;

  be->embedding(a->layers[0].h_in, s->w.embed, a->ids, R, d);
  float scale = 1.0f / sqrtf((float)c->head_dim);
  for (int64_t l = 0; l < c->num_hidden_layers; l++) {
    const student_layer *w = &s->w.layers[l];
    student_layer_acts *la = &a->layers[l];
    be->rmsnorm(la->hn, la->rstd_in, la->h_in, w->in_norm, R, d, eps);
    be->linear(c->qk_norm ? la->q_pre : la->q, la->hn, w->wq, w->bq, R, d, s->q_dim);
    be->linear(c->qk_norm ? la->k_pre : la->k, la->hn, w->wk, w->bk, R, d, s->kv_dim);
    be->linear(la->v, la->hn, w->wv, w->bv, R, d, s->kv_dim);
    norm_rope(s, la->q, la->q_rstd, la->q_pre, w->q_norm, a->pos, R, Hq);
    norm_rope(s, la->k, la->k_rstd, la->k_pre, w->k_norm, a->pos, R, Hkv);
    be->attention_causal_train(la->attn, la->lse, la->q, la->k, la->v, a->seq_off, b->n_seqs, Hq, Hkv, c->head_dim,
                               scale);
    /* h_mid = h_in + o_proj(attn) */
    be->linear(la->h_mid, la->attn, w->wo, w->bo, R, s->q_dim, d);
    be->add(la->h_mid, la->h_in, R * d);
    be->rmsnorm(la->hp, la->rstd_post, la->h_mid, w->post_norm, R, d, eps);
    /* gate_proj and up_proj (and their biases) are adjacent: one (2I, d) matmul. */
    be->linear(la->gu, la->hp, w->w_gate, w->b_gate, R, d, 2 * I);
    be->swiglu(la->act, la->gu, R, I);
    float *out = l + 1 < c->num_hidden_layers ? a->layers[l + 1].h_in : a->h_last;
    be->linear(out, la->act, w->w_down, w->b_down, R, I, d);
    be->add(out, la->h_mid, R * d);
  }
  be->rmsnorm(a->h, a->rstd_final, a->h_last, s->w.norm, R, d, eps);
  a->valid = 1;
  return DS_OK;
}

/* ---------------------------------------------------------------- hooks */

int64_t ds_student_rows(const ds_student *s) { return s->acts.valid ? s->acts.rows : 0; }
const int64_t *ds_student_seq_offsets(const ds_student *s) { return s->acts.valid ? s->acts.seq_off : NULL; }
const float *ds_student_final_hidden(const ds_student *s) { return s->acts.valid ? s->acts.h : NULL; }

const float *ds_student_hidden(const ds_student *s, int64_t layer) {
  int64_t L = s->cfg.num_hidden_layers;
  if (!s->acts.valid || layer < -1 || layer > L - 1) return NULL;
  return layer + 1 < L ? s->acts.layers[layer + 1].h_in : s->acts.h_last;
}

void ds_student_rows_begin(ds_student *s) {
  s->be->operand_hold(s->w.lm_head, (size_t)(s->cfg.vocab_size * s->cfg.hidden_size));
}

void ds_student_rows_end(ds_student *s) { s->be->operand_release(s->w.lm_head); }

void ds_student_rows_logits(ds_student *s, int64_t r0, int64_t c, float *logits) {
  int64_t d = s->cfg.hidden_size;
  DS_CHECK(s->acts.valid && r0 >= 0 && c >= 0 && r0 + c <= s->acts.rows);
  s->be->linear(logits, s->acts.h + r0 * d, s->w.lm_head, NULL, c, d, s->cfg.vocab_size);
}

void ds_student_rows_logits_backward(ds_student *s, int64_t r0, int64_t c, const float *dlogits, float *dh) {
  int64_t d = s->cfg.hidden_size;
  DS_CHECK(s->acts.valid && r0 >= 0 && c >= 0 && r0 + c <= s->acts.rows);
  /* tied: g.lm_head is g.embed, so both uses of the table add into one gradient */
  s->be->operand_hold(dlogits, (size_t)(c * s->cfg.vocab_size)); /* read by dh's and dW's products */
  s->be->linear_backward(dh, s->g.lm_head, NULL, dlogits, s->acts.h + r0 * d, s->w.lm_head, c, d, s->cfg.vocab_size);
  s->be->operand_release(dlogits);
}
