/* The draft at decoding time (spec/dspark.md section 8; include/dspark/draft.h, "Decoding"):
 * per request, the context K/V of every draft layer grow with the target's captured rows of
 * the committed tokens; one backbone pass per block over [x_s, M, ..., M] at positions
 * s .. s+g-1 attending to the whole cached context and the block (no mask); then the
 * sequential head one slot at a time with the token actually chosen before it. The math is
 * the training forward's (draft.c, markov_head.c) on one block; test_draft_decode checks they
 * agree. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/draft_internal.h"

struct ds_draft_state {
  int64_t len, cap;        /* context positions cached, capacity */
  float *k, *v;            /* per layer [cap, kv_dim] (k normed and roped), layer-major */
  float *rnn_s;            /* (r) the rnn head's state s_{k-1} within the current block */
  /* one block's scratch */
  float *h, *hn, *q, *kb, *vb, *attn, *lse, *mid, *hp, *gu, *act, *tmp; /* g rows each */
  float *hctx, *hrstd, *rstd;                                           /* context append scratch */
  float *bias;                                                          /* (N) a slot's Markov bias */
  int64_t hctx_rows;
};

static size_t kv_floats(const ds_draft *d, int64_t cap) { return (size_t)(d->cfg.num_layers * cap * d->kv_dim); }

ds_status ds_draft_state_new(const ds_draft *d, int64_t capacity, ds_draft_state **out) {
  *out = NULL;
  const ds_draft_config *c = &d->cfg;
  if (capacity < 1) return DS_FAIL(DS_ERR_ARG, "draft state: capacity %lld must be >= 1", (long long)capacity);
  ds_draft_state *s = ds_calloc(1, sizeof *s, "draft state");
  if (!s) return DS_ERR_NOMEM;
  int64_t g = c->block_size, dm = c->hidden_size, I = c->intermediate_size, r = c->markov_rank;
  int64_t Hq = c->num_attention_heads;
  s->cap = capacity;
  s->k = ds_malloc_aligned(kv_floats(d, capacity) * sizeof(float), "draft context keys");
  s->v = ds_malloc_aligned(kv_floats(d, capacity) * sizeof(float), "draft context values");
  s->rnn_s = ds_calloc((size_t)(r ? r : 1), sizeof(float), "rnn state");
  size_t rows = (size_t)g;
#define ALLOC(p, n) (p) = ds_malloc_aligned((size_t)(n) * sizeof(float), "draft block scratch")
  ALLOC(s->h, rows * dm);
  ALLOC(s->hn, rows * dm);
  ALLOC(s->q, rows * d->q_dim);
  ALLOC(s->kb, rows * d->kv_dim);
  ALLOC(s->vb, rows * d->kv_dim);
  ALLOC(s->attn, rows * d->q_dim);
  ALLOC(s->lse, rows * Hq);
  ALLOC(s->mid, rows * dm);
  ALLOC(s->hp, rows * dm);
  ALLOC(s->gu, rows * 2 * I);
  ALLOC(s->act, rows * I);
  ALLOC(s->tmp, rows * (d->q_dim > dm ? d->q_dim : dm) + 3 * (r + dm) + 8);
  ALLOC(s->rstd, rows * (Hq > 1 ? Hq : 1) + rows);
  ALLOC(s->bias, d->n_vocab);
#undef ALLOC
  if (!s->k || !s->v || !s->rnn_s || !s->h || !s->hn || !s->q || !s->kb || !s->vb || !s->attn || !s->lse || !s->mid ||
      !s->hp || !s->gu || !s->act || !s->tmp || !s->rstd || !s->bias) {
    ds_draft_state_free(s);
    return DS_ERR_NOMEM;
  }
  *out = s;
  return DS_OK;
}

void ds_draft_state_free(ds_draft_state *s) {
  if (!s) return;
  float *bufs[] = {s->k, s->v, s->h, s->hn, s->q, s->kb, s->vb, s->attn, s->lse, s->mid, s->hp, s->gu, s->act, s->tmp,
                   s->hctx, s->hrstd, s->rstd, s->bias};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) ds_free_aligned(bufs[i]);
  free(s->rnn_s);
  free(s);
}

int64_t ds_draft_state_len(const ds_draft_state *s) { return s->len; }

ds_status ds_draft_state_crop(ds_draft_state *s, int64_t len) {
  if (len < 0 || len > s->len)
    return DS_FAIL(DS_ERR_ARG, "draft state: cannot crop %lld positions to %lld", (long long)s->len, (long long)len);
  s->len = len;
  return DS_OK;
}

/* y (n, out) = x (n, in) @ W^T: from the decoding copy wc when there is one, else the fp32 w */
static void dec_linear(const ds_draft *d, float *y, const float *x, const float *w, ds_weight wc, int64_t n, int64_t in,
                       int64_t out) {
  if (wc.data) d->be->linear_w(y, out, x, wc, NULL, n, in, out);
  else d->be->linear(y, x, w, NULL, n, in, out);
}

/* x (n, heads*hd) in place: per-head rmsnorm with w, then rope at positions pos. */
static void norm_rope_rows(const ds_draft *d, float *x, float *rstd, const float *w, const int64_t *pos, int64_t n,
                           int64_t heads) {
  int64_t hd = d->cfg.head_dim;
  d->be->rmsnorm(x, rstd, x, w, n * heads, hd, (float)d->cfg.rms_norm_eps);
  d->be->rope(x, heads * hd, pos, d->inv_freq, n, heads, hd);
}

ds_status ds_draft_state_append(ds_draft *d, ds_draft_state *s, const float *ctx, int64_t n) {
  const ds_draft_config *c = &d->cfg;
  if (n < 0 || s->len + n > s->cap)
    return DS_FAIL(DS_ERR_RANGE, "draft state: %lld + %lld context positions exceed its capacity %lld",
                   (long long)s->len, (long long)n, (long long)s->cap);
  if (n == 0) return DS_OK;
  int64_t dm = c->hidden_size, m = c->n_target_layers, Hkv = c->num_key_value_heads;
  if (n > s->hctx_rows) {
    ds_free_aligned(s->hctx);
    ds_free_aligned(s->hrstd);
    s->hctx = ds_malloc_aligned((size_t)(n * (dm > d->kv_dim ? dm : d->kv_dim)) * 2 * sizeof(float), "draft context");
    s->hrstd = ds_malloc_aligned((size_t)(n * (Hkv > 1 ? Hkv : 1) + n) * sizeof(float), "draft context");
    s->hctx_rows = s->hctx && s->hrstd ? n : 0;
    if (!s->hctx_rows) return DS_ERR_NOMEM;
  }
  int64_t *pos = malloc((size_t)n * sizeof *pos);
  if (!pos) return DS_FAIL(DS_ERR_NOMEM, "draft state: out of memory");
  for (int64_t i = 0; i < n; i++) pos[i] = s->len + i;
  /* H_ctx = hidden_norm(ctx @ fc^T), as in training (draft.c). */
  float *fc_out = s->hctx + n * dm, *hctx = s->hctx;
  dec_linear(d, fc_out, ctx, d->w.fc, d->dec.fc, n, m * dm, dm);
  d->be->rmsnorm(hctx, s->hrstd, fc_out, d->w.hidden_norm, n, dm, (float)c->rms_norm_eps);
  for (int64_t l = 0; l < c->num_layers; l++) {
    const draft_layer *w = &d->w.layers[l];
    const decode_layer *dw = d->dec.layers ? &d->dec.layers[l] : &(decode_layer){0};
    float *kl = s->k + (size_t)(l * s->cap + s->len) * d->kv_dim, *vl = s->v + (size_t)(l * s->cap + s->len) * d->kv_dim;
    dec_linear(d, kl, hctx, w->wk, dw->wk, n, dm, d->kv_dim);
    dec_linear(d, vl, hctx, w->wv, dw->wv, n, dm, d->kv_dim);
    norm_rope_rows(d, kl, s->hrstd, w->k_norm, pos, n, Hkv);
  }
  free(pos);
  s->len += n;
  return DS_OK;
}

ds_status ds_draft_block(ds_draft *d, ds_draft_state *s, int32_t anchor, float *h_out, float *base_logits) {
  const ds_draft_config *c = &d->cfg;
  const ds_backend *be = d->be;
  int64_t g = c->block_size, dm = c->hidden_size, I = c->intermediate_size, V = c->vocab_size, N = d->n_vocab;
  if (anchor < 0 || anchor >= V)
    return DS_FAIL(DS_ERR_RANGE, "draft: anchor token %d outside the vocabulary [0, %lld)", anchor, (long long)V);
  float eps = (float)c->rms_norm_eps, scale = 1.0f / sqrtf((float)c->head_dim);
  int64_t pos[64], ctx_len = s->len;
  for (int64_t k = 0; k < g; k++) pos[k] = s->len + k;
  for (int64_t k = 0; k < g; k++) {
    int32_t tok = k == 0 ? anchor : c->mask_token_id;
    be->embedding_w(s->h + k * dm, &tok, d->embed, 1, dm);
  }
  for (int64_t l = 0; l < c->num_layers; l++) {
    const draft_layer *w = &d->w.layers[l];
    const decode_layer *dw = d->dec.layers ? &d->dec.layers[l] : &(decode_layer){0};
    const float *kc = s->k + (size_t)(l * s->cap) * d->kv_dim, *vc = s->v + (size_t)(l * s->cap) * d->kv_dim;
    be->rmsnorm(s->hn, s->rstd, s->h, w->in_norm, g, dm, eps);
    dec_linear(d, s->q, s->hn, w->wq, dw->wq, g, dm, d->q_dim);
    dec_linear(d, s->kb, s->hn, w->wk, dw->wk, g, dm, d->kv_dim);
    dec_linear(d, s->vb, s->hn, w->wv, dw->wv, g, dm, d->kv_dim);
    norm_rope_rows(d, s->q, s->rstd, w->q_norm, pos, g, c->num_attention_heads);
    norm_rope_rows(d, s->kb, s->rstd, w->k_norm, pos, g, c->num_key_value_heads);
    be->block_attention(s->attn, s->lse, s->q, kc, vc, s->kb, s->vb, &ctx_len, s->len, 1, g, c->num_attention_heads,
                        c->num_key_value_heads, c->head_dim, scale);
    dec_linear(d, s->mid, s->attn, w->wo, dw->wo, g, d->q_dim, dm);
    be->add(s->mid, s->h, g * dm);
    be->rmsnorm(s->hp, s->rstd, s->mid, w->post_norm, g, dm, eps);
    dec_linear(d, s->gu, s->hp, w->w_gate, dw->w_gu, g, dm, 2 * I);
    be->swiglu(s->act, s->gu, g, I);
    dec_linear(d, s->h, s->act, w->w_down, dw->w_down, g, I, dm);
    be->add(s->h, s->mid, g * dm);
  }
  be->rmsnorm(h_out, s->rstd, s->h, d->w.norm, g, dm, eps);
  if (base_logits) be->linear_w(base_logits, N, h_out, d->dec.lm_head.data ? d->dec.lm_head : d->lm_head, NULL, g, dm, N);
  memset(s->rnn_s, 0, (size_t)(c->markov_rank ? c->markov_rank : 1) * sizeof(float)); /* s_0 = 0 per block */
  return DS_OK;
}

static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

ds_status ds_draft_head_step(ds_draft *d, ds_draft_state *s, const float *h_k, int32_t prev, float *logits,
                             float *conf_logit) {
  const ds_draft_config *c = &d->cfg;
  int64_t r = c->markov_rank, dm = c->hidden_size, V = c->vocab_size, N = d->n_vocab;
  if (prev < 0 || prev >= V)
    return DS_FAIL(DS_ERR_RANGE, "draft: previous token %d outside the vocabulary [0, %lld)", prev, (long long)V);
  const float *e = r > 0 ? d->w.markov_w1 + (int64_t)prev * r : NULL; /* W1[prev] (r) */
  float *z = s->tmp, *zin = s->tmp + (r > 0 ? r : 1), *pre = zin + 2 * r + dm; /* (r), (2r + d), (3r) */
  switch (c->markov_type) {
    case DS_MARKOV_NONE: break;
    case DS_MARKOV_VANILLA: memcpy(z, e, (size_t)r * sizeof(float)); break;
    case DS_MARKOV_GATED:
      memcpy(zin, h_k, (size_t)dm * sizeof(float));
      memcpy(zin + dm, e, (size_t)r * sizeof(float));
      d->be->linear(pre, zin, d->w.gate_w, d->w.gate_b, 1, dm + r, r);
      for (int64_t j = 0; j < r; j++) z[j] = sigmoidf(pre[j]) * e[j];
      break;
    case DS_MARKOV_RNN:
      memcpy(zin, s->rnn_s, (size_t)r * sizeof(float));
      memcpy(zin + r, e, (size_t)r * sizeof(float));
      memcpy(zin + 2 * r, h_k, (size_t)dm * sizeof(float));
      d->be->linear(pre, zin, d->w.joint_w, d->w.joint_b, 1, 2 * r + dm, 3 * r);
      for (int64_t j = 0; j < r; j++) {
        float sa = sigmoidf(pre[j]);
        s->rnn_s[j] = sa * s->rnn_s[j] + (1.0f - sa) * tanhf(pre[r + j]);
        z[j] = tanhf(pre[2 * r + j]); /* the bias uses the old state's z */
      }
      break;
  }
  if (logits && r > 0) { /* logits += z @ W2^T, the Markov bias of the previous token (over the draft's N) */
    dec_linear(d, s->bias, z, d->w.markov_w2, d->dec.markov_w2, 1, r, N);
    d->be->add(logits, s->bias, N);
  }
  if (conf_logit) {
    if (!c->enable_confidence_head) {
      *conf_logit = NAN;
    } else {
      double acc = d->w.conf_b[0];
      for (int64_t j = 0; j < dm; j++) acc += (double)d->w.conf_w[j] * h_k[j];
      if (c->confidence_head_with_markov)
        for (int64_t j = 0; j < r; j++) acc += (double)d->w.conf_w[dm + j] * e[j];
      *conf_logit = (float)acc;
    }
  }
  return DS_OK;
}
