/* The sequential (Markov) heads and the confidence head of spec section 3, forward and
 * backward side by side. Rows are block-major (row = b*g + k); the previous token of each
 * slot is the teacher-forced acts.prev_ids[row]. Shapes: h (R, d), e = W1[prev] (R, r),
 * z (R, r) is what W2 maps to the vocabulary bias, B = z @ W2^T. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/draft_internal.h"

static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

/* dst (n, a + b) = [x (n, a) ; y (n, b)] row by row. */
static void concat_rows(float *dst, const float *x, int64_t a, const float *y, int64_t b, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    memcpy(dst + i * (a + b), x + i * a, (size_t)a * sizeof(float));
    memcpy(dst + i * (a + b) + a, y + i * b, (size_t)b * sizeof(float));
  }
}

/* z_in (nb, 2r + d) of slot k of every block: [s_{k-1} ; e_k ; h_k], with s_{-1} = 0. */
static void rnn_inputs(const ds_draft *d, float *zin, int64_t k, int64_t nb) {
  const draft_acts *a = &d->acts;
  int64_t r = d->cfg.markov_rank, dm = d->cfg.hidden_size, g = d->cfg.block_size, in = 2 * r + dm;
  for (int64_t b = 0; b < nb; b++) {
    int64_t row = b * g + k;
    float *zi = zin + b * in;
    if (k == 0) memset(zi, 0, (size_t)r * sizeof(float));
    else memcpy(zi, a->rnn_s + (row - 1) * r, (size_t)r * sizeof(float));
    memcpy(zi + r, a->e + row * r, (size_t)r * sizeof(float));
    memcpy(zi + 2 * r, a->h + row * dm, (size_t)dm * sizeof(float));
  }
}

static void rnn_forward(ds_draft *d, int64_t R) {
  const ds_draft_config *c = &d->cfg;
  draft_acts *a = &d->acts;
  int64_t r = c->markov_rank, dm = c->hidden_size, g = c->block_size, nb = R / g, in = 2 * r + dm;
  float *zin = ds_malloc_aligned((size_t)(nb * in) * sizeof(float), "rnn head input");
  float *aco = ds_malloc_aligned((size_t)(nb * 3 * r) * sizeof(float), "rnn head gates");
  DS_CHECK(zin && aco);
  for (int64_t k = 0; k < g; k++) {
    rnn_inputs(d, zin, k, nb);
    d->be->linear(aco, zin, d->w.joint_w, d->w.joint_b, nb, in, 3 * r);
    for (int64_t b = 0; b < nb; b++) {
      int64_t row = b * g + k;
      const float *pre = aco + b * 3 * r, *s_prev = zin + b * in;
      memcpy(a->rnn_aco + row * 3 * r, pre, (size_t)(3 * r) * sizeof(float));
      for (int64_t j = 0; j < r; j++) {
        float sa = sigmoidf(pre[j]);
        a->rnn_s[row * r + j] = sa * s_prev[j] + (1.0f - sa) * tanhf(pre[r + j]);
        a->z[row * r + j] = tanhf(pre[2 * r + j]); /* the bias uses the old state's z */
      }
    }
  }
  ds_free_aligned(zin);
  ds_free_aligned(aco);
}

void markov_head_forward(ds_draft *d, int64_t R) {
  const ds_draft_config *c = &d->cfg;
  draft_acts *a = &d->acts;
  int64_t r = c->markov_rank, dm = c->hidden_size;
  if (r > 0)
    for (int64_t i = 0; i < R; i++) memcpy(a->e + i * r, d->w.markov_w1 + (int64_t)a->prev_ids[i] * r, (size_t)r * sizeof(float));
  switch (c->markov_type) {
    case DS_MARKOV_NONE: break;
    case DS_MARKOV_VANILLA: memcpy(a->z, a->e, (size_t)(R * r) * sizeof(float)); break;
    case DS_MARKOV_GATED: {
      float *he = ds_malloc_aligned((size_t)(R * (dm + r)) * sizeof(float), "gated head input");
      DS_CHECK(he != NULL);
      concat_rows(he, a->h, dm, a->e, r, R);
      d->be->linear(a->gate, he, d->w.gate_w, d->w.gate_b, R, dm + r, r);
      for (int64_t i = 0; i < R * r; i++) {
        a->gate[i] = sigmoidf(a->gate[i]);
        a->z[i] = a->gate[i] * a->e[i];
      }
      ds_free_aligned(he);
      break;
    }
    case DS_MARKOV_RNN: rnn_forward(d, R); break;
  }
  if (c->enable_confidence_head) {
    int with_e = c->confidence_head_with_markov;
    for (int64_t i = 0; i < R; i++) {
      double s = d->w.conf_b[0];
      for (int64_t j = 0; j < dm; j++) s += (double)d->w.conf_w[j] * a->h[i * dm + j];
      if (with_e)
        for (int64_t j = 0; j < r; j++) s += (double)d->w.conf_w[dm + j] * a->e[i * r + j];
      a->conf[i] = (float)s;
    }
  }
}

static void rnn_backward(ds_draft *d, int64_t R, const float *dz, float *de, float *dh) {
  const ds_draft_config *c = &d->cfg;
  draft_acts *a = &d->acts;
  int64_t r = c->markov_rank, dm = c->hidden_size, g = c->block_size, nb = R / g, in = 2 * r + dm;
  float *zin = ds_malloc_aligned((size_t)(nb * in) * sizeof(float), "rnn head input");
  float *dzin = ds_malloc_aligned((size_t)(nb * in) * sizeof(float), "rnn head input grad");
  float *daco = ds_malloc_aligned((size_t)(nb * 3 * r) * sizeof(float), "rnn head gate grad");
  float *ds = ds_calloc((size_t)(nb * r), sizeof(float), "rnn state grad"); /* dL/ds_k carried back */
  DS_CHECK(zin && dzin && daco && ds);
  for (int64_t k = g - 1; k >= 0; k--) {
    rnn_inputs(d, zin, k, nb);
    for (int64_t b = 0; b < nb; b++) {
      int64_t row = b * g + k;
      const float *zi = zin + b * in;
      const float *pre = a->rnn_aco + row * 3 * r;
      float *dp = daco + b * 3 * r;
      for (int64_t j = 0; j < r; j++) {
        float sa = sigmoidf(pre[j]), tc = tanhf(pre[r + j]), to = a->z[row * r + j];
        float dsk = ds[b * r + j];
        dp[j] = dsk * (zi[j] - tc) * sa * (1.0f - sa);     /* da */
        dp[r + j] = dsk * (1.0f - sa) * (1.0f - tc * tc);  /* dc */
        dp[2 * r + j] = dz[row * r + j] * (1.0f - to * to); /* do */
        ds[b * r + j] = dsk * sa;                           /* direct path to s_{k-1} */
      }
    }
    memset(dzin, 0, (size_t)(nb * in) * sizeof(float));
    d->be->linear_backward(dzin, d->g.joint_w, d->g.joint_b, daco, zin, d->w.joint_w, nb, in, 3 * r);
    for (int64_t b = 0; b < nb; b++) {
      int64_t row = b * g + k;
      const float *dzi = dzin + b * in;
      for (int64_t j = 0; j < r; j++) {
        ds[b * r + j] += dzi[j];
        de[row * r + j] += dzi[r + j];
      }
      for (int64_t j = 0; j < dm; j++) dh[row * dm + j] += dzi[2 * r + j];
    }
  }
  ds_free_aligned(zin);
  ds_free_aligned(dzin);
  ds_free_aligned(daco);
  free(ds);
}

void markov_head_backward(ds_draft *d, int64_t R, float *dz, const float *dconf, float *dh) {
  const ds_draft_config *c = &d->cfg;
  draft_acts *a = &d->acts;
  int64_t r = c->markov_rank, dm = c->hidden_size;
  float *de = r > 0 ? ds_calloc((size_t)(R * r), sizeof(float), "markov embedding grad") : NULL;
  DS_CHECK(r == 0 || de != NULL);
  if (c->enable_confidence_head && dconf) {
    int with_e = c->confidence_head_with_markov;
    double db = 0;
    for (int64_t i = 0; i < R; i++) {
      float g = dconf[i];
      if (g == 0.0f) continue;
      db += g;
      for (int64_t j = 0; j < dm; j++) {
        d->g.conf_w[j] += g * a->h[i * dm + j];
        dh[i * dm + j] += g * d->w.conf_w[j];
      }
      if (with_e)
        for (int64_t j = 0; j < r; j++) {
          d->g.conf_w[dm + j] += g * a->e[i * r + j];
          de[i * r + j] += g * d->w.conf_w[dm + j];
        }
    }
    d->g.conf_b[0] += (float)db;
  }
  switch (c->markov_type) {
    case DS_MARKOV_NONE: break;
    case DS_MARKOV_VANILLA:
      for (int64_t i = 0; i < R * r; i++) de[i] += dz[i];
      break;
    case DS_MARKOV_GATED: {
      float *he = ds_malloc_aligned((size_t)(R * (dm + r)) * sizeof(float), "gated head input");
      float *dhe = ds_calloc((size_t)(R * (dm + r)), sizeof(float), "gated head input grad");
      DS_CHECK(he && dhe);
      concat_rows(he, a->h, dm, a->e, r, R);
      /* z = gate * e: dgate = dz * e, de += dz * gate; dpre = dgate * gate * (1 - gate), in place in dz */
      for (int64_t i = 0; i < R * r; i++) {
        float gt = a->gate[i];
        de[i] += dz[i] * gt;
        dz[i] = dz[i] * a->e[i] * gt * (1.0f - gt);
      }
      d->be->linear_backward(dhe, d->g.gate_w, d->g.gate_b, dz, he, d->w.gate_w, R, dm + r, r);
      for (int64_t i = 0; i < R; i++) {
        for (int64_t j = 0; j < dm; j++) dh[i * dm + j] += dhe[i * (dm + r) + j];
        for (int64_t j = 0; j < r; j++) de[i * r + j] += dhe[i * (dm + r) + dm + j];
      }
      ds_free_aligned(he);
      free(dhe);
      break;
    }
    case DS_MARKOV_RNN: rnn_backward(d, R, dz, de, dh); break;
  }
  /* W1 is an embedding: scatter-add, serially in row order so the result is deterministic. */
  if (r > 0)
    for (int64_t i = 0; i < R; i++) {
      float *gw = d->g.markov_w1 + (int64_t)a->prev_ids[i] * r;
      for (int64_t j = 0; j < r; j++) gw[j] += de[i * r + j];
    }
  free(de);
}
