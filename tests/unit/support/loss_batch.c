/* See loss_batch.h. */
#include "support/loss_batch.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float urand(ds_rng *rng, float lo, float hi) { return lo + (hi - lo) * ds_rng_uniform_f32(rng); }

/* Random logits (scale s), ids, conf logits; every slot supervised unless changed. */
batch batch_new(ds_rng *rng, int64_t nb, int64_t g, int64_t V, float s) {
  batch b = {nb, g, V, nb * g, NULL, NULL, NULL, NULL, NULL, NULL};
  b.draft = malloc((size_t)(b.R * V) * sizeof(float));
  b.target = malloc((size_t)(b.R * V) * sizeof(float));
  b.conf = malloc((size_t)(b.R ? b.R : 1) * sizeof(float));
  b.ids = malloc((size_t)(b.R ? b.R : 1) * sizeof(int32_t));
  b.em = malloc((size_t)(b.R ? b.R : 1));
  b.bk = malloc((size_t)(nb ? nb : 1));
  for (int64_t i = 0; i < b.R * V; i++) b.draft[i] = urand(rng, -s, s), b.target[i] = urand(rng, -s, s);
  for (int64_t r = 0; r < b.R; r++) {
    b.conf[r] = urand(rng, -3, 3);
    b.ids[r] = (int32_t)(ds_rng_next_u64(rng) % (uint64_t)V);
    b.em[r] = 1;
  }
  for (int64_t k = 0; k < nb; k++) b.bk[k] = 1;
  return b;
}

batch batch_copy(const batch *a) {
  batch b = *a;
  size_t rv = (size_t)(a->R * a->V) * sizeof(float), r = (size_t)(a->R ? a->R : 1);
  b.draft = malloc(rv), b.target = malloc(rv), b.conf = malloc(r * sizeof(float));
  b.ids = malloc(r * sizeof(int32_t)), b.em = malloc(r), b.bk = malloc((size_t)(a->nb ? a->nb : 1));
  memcpy(b.draft, a->draft, rv), memcpy(b.target, a->target, rv), memcpy(b.conf, a->conf, r * sizeof(float));
  memcpy(b.ids, a->ids, r * sizeof(int32_t)), memcpy(b.em, a->em, r), memcpy(b.bk, a->bk, (size_t)(a->nb ? a->nb : 1));
  return b;
}

void batch_free(batch *b) {
  free(b->draft), free(b->target), free(b->conf), free(b->ids), free(b->em), free(b->bk);
}

ds_dspark_loss_inputs inputs_of(const batch *b, const ds_dspark_loss_config *cfg) {
  ds_dspark_loss_inputs in = {b->draft, cfg->has_teacher ? b->target : NULL, b->ids, b->em, b->bk,
                              cfg->has_conf ? b->conf : NULL, NULL};
  return in;
}

run_out run_loss(const ds_dspark_loss_config *cfg, const batch *b, double scale) {
  run_out o;
  memset(&o, 0, sizeof o);
  size_t R = (size_t)(b->R ? b->R : 1);
  o.pos_acc = malloc((size_t)b->g * sizeof(double)), o.pos_cnt = malloc((size_t)b->g * sizeof(double));
  o.ce = malloc(R * sizeof(double)), o.l1 = malloc(R * sizeof(double));
  o.acc = malloc(R * sizeof(double)), o.bce = malloc(R * sizeof(double));
  o.gd = malloc((size_t)(b->R * b->V) * sizeof(float) + 4), o.gc = malloc(R * sizeof(float));
  /* outputs start as garbage so that a missed write shows */
  memset(o.gd, 0x7f, (size_t)(b->R * b->V) * sizeof(float));
  memset(o.gc, 0x7f, R * sizeof(float));
  ds_dspark_row_stats rows = {o.ce, o.l1, o.acc, o.bce, NULL};
  ds_dspark_loss_inputs in = inputs_of(b, cfg);
  o.st = ds_dspark_loss(cfg, b->nb, b->g, b->V, &in, scale, &o.res, o.pos_acc, o.pos_cnt, o.gd, o.gc, &rows);
  return o;
}

void run_free(run_out *o) {
  free(o->pos_acc), free(o->pos_cnt), free(o->ce), free(o->l1), free(o->acc), free(o->bce), free(o->gd), free(o->gc);
}

int same_bits(const void *a, const void *b, size_t n) { return memcmp(a, b, n) == 0; }

/* Bitwise equality of two results: numerator, counts, every pair and its presence. */
int results_identical(const ds_dspark_loss_result *a, const ds_dspark_loss_result *b) {
  int ok = same_bits(&a->numerator, &b->numerator, sizeof(double)) && a->num_tokens == b->num_tokens &&
           same_bits(&a->W, &b->W, sizeof(double));
  for (int i = 0; i < DS_DSPARK_PAIR_COUNT; i++)
    ok = ok && a->pair_present[i] == b->pair_present[i] && same_bits(a->pair[i], b->pair[i], 2 * sizeof(double));
  return ok;
}

/* Bitwise equality of two runs over the same shapes: result, pairs, per-position, rows, grads. */
int runs_identical(const run_out *a, const run_out *b, const batch *shape) {
  size_t R = (size_t)shape->R, g = (size_t)shape->g;
  int ok = a->st == b->st && results_identical(&a->res, &b->res);
  ok = ok && same_bits(a->pos_acc, b->pos_acc, g * sizeof(double)) && same_bits(a->pos_cnt, b->pos_cnt, g * sizeof(double));
  ok = ok && same_bits(a->ce, b->ce, R * sizeof(double)) && same_bits(a->l1, b->l1, R * sizeof(double)) &&
       same_bits(a->acc, b->acc, R * sizeof(double)) && same_bits(a->bce, b->bce, R * sizeof(double));
  ok = ok && same_bits(a->gd, b->gd, R * (size_t)shape->V * sizeof(float)) && same_bits(a->gc, b->gc, R * sizeof(float));
  return ok;
}

double ref_decay(const ds_dspark_loss_config *cfg, int64_t k, int64_t g) {
  if (cfg->decay == DS_DSPARK_DECAY_PAPER) return exp(-(double)((k + 1) - 1) / (double)g); /* 1-based k + 1 */
  return cfg->decay_gamma > 0 ? exp(-(double)k / cfg->decay_gamma) : 1.0;
}

/* draft/target [R, V] and conf [R] in double; accept_fixed [R] replaces the computed label
 * (a detached label held fixed for finite differences); accept_out [R] receives it. */
void ref_loss(const ds_dspark_loss_config *cfg, const batch *b, const double *draft, const double *target,
                     const double *conf, const double *accept_fixed, double *accept_out, ref_out *o) {
  memset(o, 0, sizeof *o);
  int64_t V = b->V;
  int teacher = cfg->has_teacher, conf_on = cfg->has_teacher && cfg->has_conf;
  double *q = malloc((size_t)V * sizeof(double)), *p = malloc((size_t)V * sizeof(double));
  for (int64_t blk = 0; blk < b->nb; blk++) {
    double cum = 1, tau_b = 1;
    int valid = 0;
    for (int64_t k = 0; k < b->g; k++) {
      int64_t r = blk * b->g + k;
      if (!(b->em[r] && b->bk[blk])) {
        cum = 0;
        continue;
      }
      valid = 1;
      double w = ref_decay(cfg, k, b->g);
      const double *x = draft + r * V;
      double m = x[0], s = 0;
      for (int64_t v = 1; v < V; v++) m = fmax(m, x[v]);
      for (int64_t v = 0; v < V; v++) s += exp(x[v] - m);
      for (int64_t v = 0; v < V; v++) q[v] = exp(x[v] - m) / s;
      double ce = -(x[b->ids[r]] - m - log(s));
      o->tokens++, o->W += w, o->ce += w * ce;
      if (teacher) {
        const double *t = target + r * V;
        double mt = t[0], st = 0, l1 = 0;
        for (int64_t v = 1; v < V; v++) mt = fmax(mt, t[v]);
        for (int64_t v = 0; v < V; v++) st += exp(t[v] - mt);
        for (int64_t v = 0; v < V; v++) p[v] = exp(t[v] - mt) / st, l1 += fabs(q[v] - p[v]);
        double a = fmin(1.0, fmax(0.0, 1.0 - 0.5 * l1));
        if (accept_out) accept_out[r] = a;
        if (accept_fixed) a = accept_fixed[r];
        o->l1 += w * l1, o->acc += a, o->acc_den += 1;
        cum *= a, tau_b += cum;
        o->pos_acc[k] += a, o->pos_cnt[k] += 1;
        if (conf_on) {
          double z = conf[r];
          /* BCE_with_logits(z, a) = -(a log sigmoid(z) + (1 - a) log(1 - sigmoid(z))) */
          double ls = -log1p(exp(-z)), lns = -log1p(exp(z));
          o->bce += w * -(a * ls + (1 - a) * lns);
        }
      }
    }
    if (valid) o->tau += tau_b, o->tau_den += 1;
  }
  o->num = cfg->alpha_ce * o->ce + cfg->alpha_l1 * o->l1 + cfg->alpha_conf * o->bce;
  free(q), free(p);
}

double *to_double(const float *x, int64_t n) {
  double *d = malloc((size_t)(n ? n : 1) * sizeof(double));
  for (int64_t i = 0; i < n; i++) d[i] = x[i];
  return d;
}

void ref_of_batch(const ds_dspark_loss_config *cfg, const batch *b, ref_out *o) {
  double *d = to_double(b->draft, b->R * b->V), *t = to_double(b->target, b->R * b->V), *z = to_double(b->conf, b->R);
  ref_loss(cfg, b, d, t, z, NULL, NULL, o);
  free(d), free(t), free(z);
}

ds_dspark_loss_config cfg_with(int teacher, int conf) {
  ds_dspark_loss_config c = ds_dspark_loss_config_default();
  c.has_teacher = teacher, c.has_conf = conf;
  return c;
}

/* max |a - b| / max |b| */
double rel_err_fd(const float *a, const double *b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) num = fmax(num, fabs((double)a[i] - b[i])), den = fmax(den, fabs(b[i]));
  return num / (den > 0 ? den : 1);
}

