/* See kd_batch.h. */
#include "support/kd_batch.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/kd_select.h"

static float urand(ds_rng *rng, float lo, float hi) { return lo + (hi - lo) * ds_rng_uniform_f32(rng); }

kd_batch kd_batch_new(ds_rng *rng, int64_t R, int64_t V, int64_t K, float s_scale, double cap_t, double cap_top_p,
                      int64_t cap_min_k) {
  kd_batch b = {R, V, K, NULL, NULL, NULL, NULL, NULL, NULL};
  size_t rv = (size_t)(R * V) + 1, rk = (size_t)(R * K) + 1, r1 = (size_t)R + 1;
  b.s = malloc(rv * sizeof(float)), b.t = malloc(rv * sizeof(float));
  b.ids = malloc(rk * sizeof(int32_t)), b.lq = malloc(rk * sizeof(float));
  b.labels = malloc(r1 * sizeof(int32_t)), b.mask = malloc(r1);
  float *scratch = malloc((size_t)V * sizeof(float));
  for (int64_t r = 0; r < R; r++) {
    for (int64_t v = 0; v < V; v++) {
      float x = urand(rng, -s_scale, s_scale);
      b.s[r * V + v] = x;
      b.t[r * V + v] = (r % 2) ? x + urand(rng, -1.0f, 1.0f) : urand(rng, -s_scale, s_scale);
    }
    b.labels[r] = (int32_t)(ds_rng_next_u64(rng) % (uint64_t)V);
    b.mask[r] = 1;
    if (K > 0) ds_kd_select(b.t + r * V, V, cap_t, K, cap_top_p, cap_min_k, scratch, b.ids + r * K, b.lq + r * K);
  }
  free(scratch);
  return b;
}

kd_batch kd_batch_copy(const kd_batch *a) {
  kd_batch b = *a;
  size_t rv = (size_t)(a->R * a->V) + 1, rk = (size_t)(a->R * a->K) + 1, r1 = (size_t)a->R + 1;
  b.s = malloc(rv * sizeof(float)), b.t = malloc(rv * sizeof(float));
  b.ids = malloc(rk * sizeof(int32_t)), b.lq = malloc(rk * sizeof(float));
  b.labels = malloc(r1 * sizeof(int32_t)), b.mask = malloc(r1);
  memcpy(b.s, a->s, rv * sizeof(float)), memcpy(b.t, a->t, rv * sizeof(float));
  memcpy(b.ids, a->ids, rk * sizeof(int32_t)), memcpy(b.lq, a->lq, rk * sizeof(float));
  memcpy(b.labels, a->labels, r1 * sizeof(int32_t)), memcpy(b.mask, a->mask, r1);
  return b;
}

void kd_batch_free(kd_batch *b) { free(b->s), free(b->t), free(b->ids), free(b->lq), free(b->labels), free(b->mask); }

ds_kd_rows_in kd_inputs(const kd_batch *b, const ds_kd_loss_config *cfg) {
  ds_kd_rows_in in = {b->s, NULL, NULL, b->K, NULL, b->labels, b->mask};
  if (cfg->top_k > 0) in.topk_ids = b->ids, in.topk_lp = b->lq;
  else in.teacher = b->t;
  return in;
}

kd_run kd_run_loss(const ds_kd_loss_config *cfg, const kd_batch *b, double scale) {
  kd_run o;
  memset(&o, 0, sizeof o);
  size_t r1 = (size_t)b->R + 1;
  o.kd = malloc(r1 * sizeof(double)), o.lm = malloc(r1 * sizeof(double));
  o.grad = malloc((size_t)(b->R * b->V) * sizeof(float) + 4);
  /* outputs start as garbage so that a missed write shows */
  memset(o.grad, 0x7f, (size_t)(b->R * b->V) * sizeof(float) + 4);
  memset(o.kd, 0x7f, r1 * sizeof(double)), memset(o.lm, 0x7f, r1 * sizeof(double));
  ds_kd_rows_in in = kd_inputs(b, cfg);
  o.st = ds_kd_loss(cfg, b->R, b->V, &in, scale, &o.res, o.kd, o.lm, o.grad);
  return o;
}

void kd_run_free(kd_run *o) { free(o->kd), free(o->lm), free(o->grad); }

int kd_same_bits(const void *a, const void *b, size_t n) { return memcmp(a, b, n) == 0; }

int kd_runs_identical(const kd_run *a, const kd_run *b, const kd_batch *shape) {
  return a->st == b->st && kd_same_bits(&a->res, &b->res, sizeof a->res) &&
         kd_same_bits(a->kd, b->kd, (size_t)shape->R * sizeof(double)) &&
         kd_same_bits(a->lm, b->lm, (size_t)shape->R * sizeof(double)) &&
         kd_same_bits(a->grad, b->grad, (size_t)(shape->R * shape->V) * sizeof(float));
}

/* ---- the reference ---- */

static void log_softmax_d(const double *x, int64_t n, double scale, double *out) {
  double m = -INFINITY, sum = 0;
  for (int64_t i = 0; i < n; i++) m = fmax(m, x[i] * scale);
  for (int64_t i = 0; i < n; i++) sum += exp(x[i] * scale - m);
  for (int64_t i = 0; i < n; i++) out[i] = x[i] * scale - m - log(sum);
}

static double lse(const double *x, int64_t n) {
  double m = -INFINITY, sum = 0;
  for (int64_t i = 0; i < n; i++) m = fmax(m, x[i]);
  if (m == -INFINITY) return m;
  for (int64_t i = 0; i < n; i++) sum += exp(x[i] - m);
  return m + log(sum);
}

static double ghost(double l) {
  const double eps = 1.1920928955078125e-7;
  return log(-expm1(l < -eps ? l : -eps));
}

void kd_ref_row(const ds_kd_loss_config *cfg, const kd_batch *b, int64_t r, const double *s, double *kd, double *lm) {
  const int64_t V = b->V;
  const double T = cfg->temperature, alpha = cfg->kd_loss_alpha;
  double *P = malloc((size_t)V * sizeof(double)), *P1 = malloc((size_t)V * sizeof(double));
  log_softmax_d(s, V, 1.0 / T, P);
  log_softmax_d(s, V, 1.0, P1);
  *lm = alpha < 1.0 ? -P1[b->labels[r]] : 0.0;
  *kd = 0.0;
  if (alpha > 0.0 && cfg->top_k == 0) {
    double *t = calloc((size_t)V, sizeof(double)), *q = malloc((size_t)V * sizeof(double));
    for (int64_t v = 0; v < V; v++) t[v] = b->t[r * V + v];
    log_softmax_d(t, V, 1.0 / T, q);
    for (int64_t v = 0; v < V; v++) {
      const double *a = cfg->reverse ? P : q, *c = cfg->reverse ? q : P;
      if (exp(a[v]) > 0) *kd += exp(a[v]) * (a[v] - c[v]);
    }
    free(t), free(q);
  } else if (alpha > 0.0) {
    const int32_t *ids = b->ids + r * b->K;
    int64_t n = 0;
    while (n < cfg->top_k && ids[n] != -1) n++;
    /* the top-p rule on what was kept, written from kd.md */
    int64_t keep = 0;
    double cum = 0;
    for (int64_t i = 0; i < n; i++) {
      if (!(cum < cfg->top_p || i < cfg->min_k)) break;
      cum += exp((double)b->lq[r * b->K + i]);
      keep++;
    }
    double *q = malloc((size_t)(keep + 1) * sizeof(double)), *p = malloc((size_t)(keep + 1) * sizeof(double));
    for (int64_t i = 0; i < keep; i++) q[i] = b->lq[r * b->K + i], p[i] = P[ids[i]];
    double gq = ghost(lse(q, keep)), gp = ghost(lse(p, keep));
    const double *a = cfg->reverse ? p : q, *c = cfg->reverse ? q : p;
    for (int64_t i = 0; i < keep; i++)
      if (exp(a[i]) > 0) *kd += exp(a[i]) * (a[i] - c[i]);
    double ga = cfg->reverse ? gp : gq, gc = cfg->reverse ? gq : gp;
    *kd += exp(ga) * (ga - gc);
    free(q), free(p);
  }
  free(P), free(P1);
}

double kd_ref_numerator(const ds_kd_loss_config *cfg, const kd_batch *b, const double *s) {
  double num = 0;
  for (int64_t r = 0; r < b->R; r++) {
    if (!b->mask[r]) continue;
    double kd, lm;
    kd_ref_row(cfg, b, r, s + r * b->V, &kd, &lm);
    num += (1.0 - cfg->kd_loss_alpha) * lm + cfg->kd_loss_alpha * kd;
  }
  return num;
}

double *kd_to_double(const float *x, int64_t n) {
  double *d = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
  for (int64_t i = 0; i < n; i++) d[i] = x[i];
  return d;
}

double kd_rel_err(const float *a, const double *b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    num = fmax(num, fabs((double)a[i] - b[i]));
    den = fmax(den, fabs(b[i]));
  }
  return num / (den > 0 ? den : 1);
}
