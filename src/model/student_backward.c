/* The student's backward (include/dspark/student.h, ds_student_backward): from the gradient
 * of the final-normed hidden state down to the embedding table. Each step mirrors a line of
 * ds_student_forward in reverse; the kernels ADD into the parameter gradients, so a tied head's
 * gradient (added by ds_student_rows_logits_backward) and the lookup's share one table. */
#include <math.h>
#include <string.h>

#include "model/student_internal.h"

static ds_status scratch_reserve(ds_student *s, size_t floats) {
  if (floats <= s->dscratch_floats) return DS_OK;
  ds_free_aligned(s->dscratch);
  s->dscratch = ds_malloc_aligned(floats * sizeof(float), "student backward scratch");
  s->dscratch_floats = s->dscratch ? floats : 0;
  return s->dscratch ? DS_OK : DS_ERR_NOMEM;
}

/* dH (rows, d) += every extra gradient on the output of `layer`. */
static void add_extra(const ds_student *s, float *dH, int64_t layer, const ds_student_hidden_grad *extra, int n_extra) {
  for (int i = 0; i < n_extra; i++)
    if (extra[i].layer == layer) s->be->add(dH, extra[i].grad, s->acts.rows * s->cfg.hidden_size);
}

/* Backward of norm_rope: dx (n, H*hd) holds the gradient of the normed, roped output; it is
 * rotated back in place, then (Qwen3) pushed through the per-head rmsnorm into dx_pre. Returns
 * the gradient of the projection's output: dx_pre with q/k norms, else dx itself. */
static float *norm_rope_backward(const ds_student *s, float *dx_pre, float *dw, float *dx, const float *x_pre,
                                 const float *w, const float *rstd, int64_t n, int64_t heads) {
  int64_t hd = s->cfg.head_dim;
  s->be->rope_backward(dx, heads * hd, s->acts.pos, s->inv_freq, n, heads, hd);
  if (!w) return dx;
  memset(dx_pre, 0, (size_t)(n * heads * hd) * sizeof(float));
  s->be->rmsnorm_backward(dx_pre, dw, dx, x_pre, w, rstd, n * heads, hd);
  return dx_pre;
}

ds_status ds_student_backward(ds_student *s, const float *dh_final, const ds_student_hidden_grad *extra, int n_extra) {
  const ds_model_config *c = &s->cfg;
  const ds_backend *be = s->be;
  student_acts *a = &s->acts;
  if (!a->valid) return DS_FAIL(DS_ERR_ARG, "student: backward without a forward");
  int64_t L = c->num_hidden_layers;
  for (int i = 0; i < n_extra; i++)
    if (extra[i].layer < -1 || extra[i].layer > L - 1 || !extra[i].grad)
      return DS_FAIL(DS_ERR_ARG, "student: intermediate gradient %d names layer %lld, outside [-1, %lld] (or has no "
                     "data)", i, (long long)extra[i].layer, (long long)(L - 1));
  int64_t R = a->rows, d = c->hidden_size, I = c->intermediate_size, qd = s->q_dim, kvd = s->kv_dim;
  int64_t Hq = c->num_attention_heads, Hkv = c->num_key_value_heads;
  float scale = 1.0f / sqrtf((float)c->head_dim);

  /* Scratch: dH (R, d) the residual stream's gradient, dx (R, d), dattn / dq / dq_pre (R, q_dim),
   * dk / dk_pre / dv (R, kv_dim), dgu (R, 2I), dact (R, I). */
  size_t nd = (size_t)(R * d), nq = (size_t)(R * qd), nk = (size_t)(R * kvd);
  size_t total = 2 * nd + 3 * nq + 3 * nk + (size_t)(R * 3 * I);
  DS_TRY(scratch_reserve(s, total));
  float *p = s->dscratch;
  float *dH = p; p += nd;
  float *dx = p; p += nd;
  float *dattn = p; p += nq;
  float *dq = p; p += nq;
  float *dq_pre = p; p += nq;
  float *dk = p; p += nk;
  float *dk_pre = p; p += nk;
  float *dv = p; p += nk;
  float *dgu = p; p += (size_t)(R * 2 * I);
  float *dact = p;

  memset(dH, 0, nd * sizeof(float));
  if (dh_final) be->rmsnorm_backward(dH, s->g.norm, dh_final, a->h_last, s->w.norm, a->rstd_final, R, d);
  add_extra(s, dH, L - 1, extra, n_extra);
  for (int64_t l = L - 1; l >= 0; l--) {
    const student_layer *w = &s->w.layers[l];
    student_layer *gw = &s->g.layers[l];
    student_layer_acts *la = &a->layers[l];
    /* MLP: out = h_mid + down(swiglu(gate_up(post_norm(h_mid)))); dH is d(out). */
    memset(dact, 0, (size_t)(R * I) * sizeof(float));
    be->linear_backward(dact, gw->w_down, gw->b_down, dH, la->act, w->w_down, R, I, d);
    memset(dgu, 0, (size_t)(R * 2 * I) * sizeof(float));
    be->swiglu_backward(dgu, dact, la->gu, R, I);
    memset(dx, 0, nd * sizeof(float));
    be->linear_backward(dx, gw->w_gate, gw->b_gate, dgu, la->hp, w->w_gate, R, d, 2 * I);
    be->rmsnorm_backward(dH, gw->post_norm, dx, la->h_mid, w->post_norm, la->rstd_post, R, d); /* dH: d(h_mid) */

    /* Attention: h_mid = h_in + o_proj(attn). */
    memset(dattn, 0, nq * sizeof(float));
    be->linear_backward(dattn, gw->wo, gw->bo, dH, la->attn, w->wo, R, qd, d);
    memset(dq, 0, nq * sizeof(float));
    memset(dk, 0, nk * sizeof(float));
    memset(dv, 0, nk * sizeof(float));
    be->attention_causal_train_backward(dq, dk, dv, dattn, la->attn, la->lse, la->q, la->k, la->v, a->seq_off,
                                        a->n_seqs, Hq, Hkv, c->head_dim, scale);
    float *dqp = norm_rope_backward(s, dq_pre, gw->q_norm, dq, la->q_pre, w->q_norm, la->q_rstd, R, Hq);
    float *dkp = norm_rope_backward(s, dk_pre, gw->k_norm, dk, la->k_pre, w->k_norm, la->k_rstd, R, Hkv);
    memset(dx, 0, nd * sizeof(float));
    be->linear_backward(dx, gw->wq, gw->bq, dqp, la->hn, w->wq, R, d, qd);
    be->linear_backward(dx, gw->wk, gw->bk, dkp, la->hn, w->wk, R, d, kvd);
    be->linear_backward(dx, gw->wv, gw->bv, dv, la->hn, w->wv, R, d, kvd);
    /* h_in feeds both the residual (dH passes through) and input_layernorm. */
    be->rmsnorm_backward(dH, gw->in_norm, dx, la->h_in, w->in_norm, la->rstd_in, R, d); /* dH: d(h_in) */
    add_extra(s, dH, l - 1, extra, n_extra);
  }
  /* The embedding lookup (torch's padding_idx row gets nothing). */
  be->embedding_backward(s->g.embed, dH, a->ids, R, d, s->pad_token_id);
  return DS_OK;
}
