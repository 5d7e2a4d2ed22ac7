/* Backward of the draft's layers (the heads and the fused loss pass produce dh, the gradient
 * of the final-normed hidden state; this file takes it down to the fc projection). Each step
 * mirrors a line of draft_forward in reverse; kernels accumulate into parameter gradients. */
#include <math.h>
#include <string.h>

#include "model/draft_internal.h"

/* Backward of norm_rope: dx (n, H*hd) holds the gradient of the roped output; it is rotated
 * back in place, then pushed through the per-head rmsnorm into dx_pre (accumulated). */
static void norm_rope_backward(const ds_draft *d, float *dx_pre, float *dw, float *dx, const float *x_pre,
                               const float *w, const float *rstd, const int64_t *pos, int64_t n, int64_t heads) {
  int64_t hd = d->cfg.head_dim;
  d->be->rope_backward(dx, heads * hd, pos, d->inv_freq, n, heads, hd);
  d->be->rmsnorm_backward(dx_pre, dw, dx, x_pre, w, rstd, n * heads, hd);
}

static ds_status scratch_reserve(ds_draft *d, size_t floats) {
  if (floats <= d->dscratch_floats) return DS_OK;
  ds_free_aligned(d->dscratch);
  d->dscratch = ds_malloc_aligned(floats * sizeof(float), "draft backward scratch");
  d->dscratch_floats = d->dscratch ? floats : 0;
  return d->dscratch ? DS_OK : DS_ERR_NOMEM;
}

ds_status draft_backward(ds_draft *d, const ds_draft_seq *s, const float *dh_final) {
  const ds_draft_config *c = &d->cfg;
  const ds_backend *be = d->be;
  draft_acts *a = &d->acts;
  int64_t g = c->block_size, R = s->n_blocks * g, T = s->T, dm = c->hidden_size, I = c->intermediate_size;
  int64_t m = c->n_target_layers, qd = d->q_dim, kvd = d->kv_dim;
  float scale = 1.0f / sqrtf((float)c->head_dim);

  /* Scratch: dH (R,d) residual grad, dx (R,d), dctx (T,d) accumulated over layers, plus
   * per-layer temporaries sized for the largest. */
  size_t n_dH = (size_t)(R * dm), n_dx = (size_t)(R * dm), n_dctx = (size_t)(T * dm);
  size_t n_dq = (size_t)(R * qd), n_dkb = (size_t)(R * kvd), n_dvb = n_dkb, n_dkc = (size_t)(T * kvd), n_dvc = n_dkc;
  size_t n_dgu = (size_t)(R * 2 * I), n_dact = (size_t)(R * I), n_dqp = n_dq, n_dkbp = n_dkb, n_dkcp = n_dkc;
  size_t n_dattn = n_dq, n_dfc = n_dctx;
  size_t total = n_dH + n_dx + n_dctx + n_dq + n_dkb + n_dvb + n_dkc + n_dvc + n_dgu + n_dact + n_dqp + n_dkbp +
                 n_dkcp + n_dattn + n_dfc;
  DS_TRY(scratch_reserve(d, total));
  float *p = d->dscratch;
  float *dH = p; p += n_dH;
  float *dx = p; p += n_dx;
  float *dctx = p; p += n_dctx;
  float *dq = p; p += n_dq;
  float *dkb = p; p += n_dkb;
  float *dvb = p; p += n_dvb;
  float *dkc = p; p += n_dkc;
  float *dvc = p; p += n_dvc;
  float *dgu = p; p += n_dgu;
  float *dact = p; p += n_dact;
  float *dq_pre = p; p += n_dqp;
  float *dkb_pre = p; p += n_dkbp;
  float *dkc_pre = p; p += n_dkcp;
  float *dattn = p; p += n_dattn;
  float *dfc_out = p;

  memset(dH, 0, n_dH * sizeof(float));
  memset(dctx, 0, n_dctx * sizeof(float));
  /* final norm: h = norm(h_last) */
  be->rmsnorm_backward(dH, d->g.norm, dh_final, a->h_last, d->w.norm, a->rstd_final, R, dm);

  for (int64_t l = c->num_layers - 1; l >= 0; l--) {
    const draft_layer *w = &d->w.layers[l];
    draft_layer *gw = &d->g.layers[l];
    layer_acts *la = &a->layers[l];
    /* MLP: out = h_mid + down(swiglu(gate_up(post_norm(h_mid)))); dH is d(out). */
    memset(dact, 0, n_dact * sizeof(float));
    be->linear_backward(dact, gw->w_down, NULL, dH, la->act, w->w_down, R, I, dm);
    memset(dgu, 0, n_dgu * sizeof(float));
    be->swiglu_backward(dgu, dact, la->gu, R, I);
    memset(dx, 0, n_dx * sizeof(float));
    be->linear_backward(dx, gw->w_gate, NULL, dgu, la->hp, w->w_gate, R, dm, 2 * I);
    be->rmsnorm_backward(dH, gw->post_norm, dx, la->h_mid, w->post_norm, la->rstd_post, R, dm); /* dH is now d(h_mid) */

    /* Attention: h_mid = h_in + o_proj(attn). */
    memset(dattn, 0, n_dattn * sizeof(float));
    be->linear_backward(dattn, gw->wo, NULL, dH, la->attn, w->wo, R, qd, dm);
    memset(dq, 0, n_dq * sizeof(float));
    memset(dkb, 0, n_dkb * sizeof(float));
    memset(dvb, 0, n_dvb * sizeof(float));
    memset(dkc, 0, n_dkc * sizeof(float));
    memset(dvc, 0, n_dvc * sizeof(float));
    be->block_attention_backward(dq, dkc, dvc, dkb, dvb, dattn, la->attn, la->lse, la->q, la->kc, la->vc, la->kb,
                                 la->vb, a->ctx_len, T, s->n_blocks, g, c->num_attention_heads,
                                 c->num_key_value_heads, c->head_dim, scale);
    memset(dq_pre, 0, n_dqp * sizeof(float));
    memset(dkb_pre, 0, n_dkbp * sizeof(float));
    memset(dkc_pre, 0, n_dkcp * sizeof(float));
    norm_rope_backward(d, dq_pre, gw->q_norm, dq, la->q_pre, w->q_norm, la->q_rstd, a->pos_blk, R,
                       c->num_attention_heads);
    norm_rope_backward(d, dkb_pre, gw->k_norm, dkb, la->kb_pre, w->k_norm, la->kb_rstd, a->pos_blk, R,
                       c->num_key_value_heads);
    norm_rope_backward(d, dkc_pre, gw->k_norm, dkc, la->kc_pre, w->k_norm, la->kc_rstd, a->pos_ctx, T,
                       c->num_key_value_heads);
    /* Projections: block rows into d(hn), context rows into d(H_ctx). */
    memset(dx, 0, n_dx * sizeof(float));
    be->linear_backward(dx, gw->wq, NULL, dq_pre, la->hn, w->wq, R, dm, qd);
    be->linear_backward(dx, gw->wk, NULL, dkb_pre, la->hn, w->wk, R, dm, kvd);
    be->linear_backward(dx, gw->wv, NULL, dvb, la->hn, w->wv, R, dm, kvd);
    be->linear_backward(dctx, gw->wk, NULL, dkc_pre, a->hctx, w->wk, T, dm, kvd);
    be->linear_backward(dctx, gw->wv, NULL, dvc, a->hctx, w->wv, T, dm, kvd);
    /* h_in feeds both the residual (dH passes through) and input_layernorm. */
    be->rmsnorm_backward(dH, gw->in_norm, dx, la->h_in, w->in_norm, la->rstd_in, R, dm);
  }
  /* The block input is the frozen embedding: no gradient. The context path: H_ctx =
   * hidden_norm(ctx @ fc^T); ctx is a frozen input. */
  memset(dfc_out, 0, n_dfc * sizeof(float));
  be->rmsnorm_backward(dfc_out, d->g.hidden_norm, dctx, a->fc_out, d->w.hidden_norm, a->hctx_rstd, T, dm);
  be->linear_backward(NULL, d->g.fc, NULL, dfc_out, s->ctx, d->w.fc, T, m * dm, dm);
  return DS_OK;
}
