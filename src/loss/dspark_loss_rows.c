/* The row-chunk core of the DSpark loss (include/dspark/dspark_loss.h): per supervised row one
 * fp32 log-softmax of the draft (and of the target) feeding CE, the raw L1, the accept label,
 * the confidence BCE and the gradient rows.
 *
 * Per supervised row (x = draft row [V], t = target row [V], gr = gradient row [V]):
 *   pass 1  scan:   max and validity of x (and t)
 *   pass 2  sumexp: ls = log sum exp(x - max)       -> logq_v = (x_v - max) - ls, ce
 *   pass 3  q, p:   q_v = exp(logq_v), p_v likewise; l1 = sum |q - p|, qs = sum q sign(q - p);
 *                   q is kept in gr (which may be x itself), p in a per-thread scratch row
 *   pass 4  grad:   gr_v = q_v (A + B sign(q_v - p_v)), gr[x*] -= c_ce
 *                   with c_ce = scale w alpha_ce, c_l1 = scale w alpha_l1, A = c_ce - c_l1 qs, B = c_l1
 * Row sums use LANES fixed partial sums in double, combined in lane order: the result does not
 * depend on threads, chunking or the compiler's vectorization choices. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/dspark_loss.h"
#include "loss/loss_lanes.h"

/* Per-row outcome of the parallel part; the first bad row in row order is reported. */
enum { ROW_OK = 0, ROW_BAD_DRAFT, ROW_BAD_TARGET, ROW_BAD_CONF, ROW_BAD_CE, ROW_NOMEM };

/* gq[v] = c * exp((x_v - mx) - ls): the CE gradient without its one-hot part.
 *   x [V] (may alias gq), gq [V] */
static void row_softmax_scaled(float *gq, const float *x, int64_t V, float mx, float ls, float c) {
  vf xv, e = {0}; /* initialized: gcc 12 with -march=native on AVX-512 FP16 parts warns otherwise */
  for (int64_t v = 0; v < V; v += LANES) {
    vf_load(&xv, x + v, V - v, -INFINITY);
    xv = (xv - mx) - ls;
    vexp(&e, &xv);
    e = c * e;
    vf_store(gq + v, &e, V - v);
  }
}

/* *r = t[ids[0 .. n-1]] padded with `pad` up to LANES lanes: the teacher's logits of the draft's
 * columns (a reduced vocabulary). */
static inline void vf_gather(vf *r, const float *t, const int32_t *ids, int64_t n, float pad) {
  float tmp[LANES];
  for (int j = 0; j < LANES; j++) tmp[j] = j < n ? t[ids[j]] : pad;
  memcpy(r, tmp, sizeof *r);
}

/* row_log_sumexp of t [V] (the same lanes, the same bits) that also returns in *outside the sum
 * of exp(t_v - mt) over the ids outside the draft's vocabulary (index[v] < 0): the full
 * softmax's mass outside S is *outside / exp(result). */
static double row_log_sumexp_outside(const float *t, int64_t V, float mt, const int32_t *index, double *outside) {
  vd acc = {0}, out = {0};
  vf tv, e = {0}, eo;
  vi idx;
  for (int64_t v = 0; v < V; v += LANES) {
    vf_load(&tv, t + v, V - v, -INFINITY);
    if (V - v >= LANES) {
      memcpy(&idx, index + v, sizeof idx);
    } else {
      int32_t tmp[LANES];
      for (int j = 0; j < LANES; j++) tmp[j] = j < V - v ? index[v + j] : 0;
      memcpy(&idx, tmp, sizeof idx);
    }
    tv = tv - mt;
    vexp(&e, &tv);
    vd_accumulate(&acc, &e);
    eo = VF_SELECT(idx < 0, e, VF_SPLAT(0));
    vd_accumulate(&out, &eo);
  }
  *outside = vd_sum(&out);
  return log(vd_sum(&acc));
}

/* q = exp((x - mx) - lsx), p = exp((t - mt) - lst): returns l1 = sum |q - p| and *qs = sum q sign(q - p).
 * x [n]; t [n], or with ids (a reduced vocabulary) t [V] read at ids [n]. When gq and sp are
 * non-NULL, q goes to gq [n] (which may alias x) and p to sp [n]. */
static double row_l1(float *gq, float *sp, const float *x, const float *t, const int32_t *ids, int64_t V, float mx,
                     float lsx, float mt, float lst, double *qs) {
  vd l1 = {0}, qsum = {0};
  const vi abs_mask = (vi){0} + 0x7fffffff;
  vf xv, tv, q, p;
  for (int64_t v = 0; v < V; v += LANES) {
    vf_load(&xv, x + v, V - v, -INFINITY); /* padding lanes: q = p = 0 */
    if (ids) vf_gather(&tv, t, ids + v, V - v, -INFINITY);
    else vf_load(&tv, t + v, V - v, -INFINITY);
    xv = (xv - mx) - lsx;
    tv = (tv - mt) - lst;
    vexp(&q, &xv);
    vexp(&p, &tv);
    vf ad = (vf)((vi)(q - p) & abs_mask); /* |q - p| of the fp32 difference */
    vf sq = VF_SIGN_DIFF(q, p) * q;
    vd_accumulate(&l1, &ad);
    vd_accumulate(&qsum, &sq);
    if (gq) {
      vf_store(gq + v, &q, V - v);
      vf_store(sp + v, &p, V - v);
    }
  }
  *qs = vd_sum(&qsum);
  return vd_sum(&l1);
}

/* gq [V] holds q, sp [V] holds p: gq_v = q_v (a + b sign(q_v - p_v)). */
static void row_grad_l1(float *gq, const float *sp, int64_t V, float a, float b) {
  vf q, p;
  for (int64_t v = 0; v < V; v += LANES) {
    vf_load(&q, gq + v, V - v, 0.0f);
    vf_load(&p, sp + v, V - v, 0.0f);
    q = q * (a + b * VF_SIGN_DIFF(q, p));
    vf_store(gq + v, &q, V - v);
  }
}

static double sigmoid(double z) {
  if (z >= 0) return 1.0 / (1.0 + exp(-z));
  double e = exp(z);
  return e / (1.0 + e);
}

/* ids [n], sup [n]: supervised ids in [0, V) */
ds_status ds_dspark_loss_check_ids(int64_t row0, int64_t g, int64_t n, int64_t V, const int32_t *ids,
                                   const uint8_t *sup) {
  if (n > 0 && (!ids || !sup)) return DS_FAIL(DS_ERR_ARG, "dspark loss: target ids or supervision mask is NULL");
  if (g < 1) return DS_FAIL(DS_ERR_ARG, "dspark loss: block size %lld < 1", (long long)g);
  for (int64_t i = 0; i < n; i++)
    if (sup[i] && (ids[i] < 0 || (int64_t)ids[i] >= V)) {
      int64_t r = row0 + i;
      return DS_FAIL(DS_ERR_RANGE,
                     "dspark loss: target id %d at block %lld slot %lld (row %lld) is supervised but outside "
                     "[0, %lld)",
                     (int)ids[i], (long long)(r / g), (long long)(r % g), (long long)r, (long long)V);
    }
  return DS_OK;
}

/* One supervised row: fills the row's values and gradient; returns a ROW_* code. N = V and
 * vocab NULL for a full-vocabulary draft; else the draft's N columns are vocab->ids.
 *   x [N], t [V] or NULL, gr [N] or NULL (may alias x), sp [N] scratch (when t && gr);
 *   *ce_on = whether x* is in the draft's vocabulary (the CE term is on) */
static int row_one(const ds_dspark_loss_config *cfg, const ds_dspark_vocab *vocab, int64_t V, int64_t N,
                   const float *x, const float *t, const ds_dspark_teacher_stat *ts, int32_t id, double w,
                   const float *conf, double scale, float *gr, float *sp, double *ce, double *l1, double *accept,
                   double *bce, float *gconf, uint8_t *ce_on) {
  int bad;
  float mx = row_scan(x, N, &bad);
  if (bad || mx == -INFINITY) return ROW_BAD_DRAFT;
  float mt = 0.0f;
  if (ts) {
    mt = ts->max;
  } else if (t) {
    mt = row_scan(t, V, &bad);
    if (bad || mt == -INFINITY) return ROW_BAD_TARGET;
  }
  int conf_on = t && conf;
  if (conf_on && !isfinite(*conf)) return ROW_BAD_CONF;

  int32_t j = vocab ? vocab->index[id] : id; /* x*'s column, -1 outside S */
  *ce_on = j >= 0;
  double lsx = row_log_sumexp(x, N, mx);
  *ce = j >= 0 ? lsx - ((double)x[j] - (double)mx) : 0.0;
  if (!isfinite(*ce)) return ROW_BAD_CE;
  double c_ce = j >= 0 ? scale * w * cfg->alpha_ce : 0.0, c_l1 = scale * w * cfg->alpha_l1;
  float lsx_f = (float)lsx;
  if (!t) {
    *l1 = *accept = *bce = 0.0;
    if (gr && j >= 0) {
      row_softmax_scaled(gr, x, N, mx, lsx_f, (float)c_ce);
      gr[j] -= (float)c_ce;
    } else if (gr) {
      memset(gr, 0, (size_t)N * sizeof(float)); /* no term reads this row's logits */
    }
    if (gconf) *gconf = 0.0f;
    return ROW_OK;
  }
  double outside = 0.0, lst;
  if (ts) lst = ts->lse, outside = vocab ? ts->outside : 0.0;
  else lst = vocab ? row_log_sumexp_outside(t, V, mt, vocab->index, &outside) : row_log_sumexp(t, V, mt);
  double qs; /* t holds the S columns themselves when ts is given */
  *l1 = row_l1(gr, gr ? sp : NULL, x, t, vocab && !ts ? vocab->ids : NULL, N, mx, lsx_f, mt, (float)lst, &qs);
  /* the full p's mass outside S: |0 - p_v| summed there (0 exactly when S is all of V) */
  if (vocab) *l1 += outside / exp(lst);
  double a = 1.0 - 0.5 * *l1;
  a = a < 0.0 ? 0.0 : (a > 1.0 ? 1.0 : a);
  *accept = a;
  if (gr) {
    row_grad_l1(gr, sp, N, (float)(c_ce - c_l1 * qs), (float)c_l1);
    if (j >= 0) gr[j] -= (float)c_ce;
  }
  if (conf_on) {
    double z = (double)*conf;
    *bce = (z > 0.0 ? z : 0.0) - z * a + log1p(exp(-fabs(z)));
    if (gconf) *gconf = (float)(scale * w * cfg->alpha_conf * (sigmoid(z) - a));
  } else {
    *bce = 0.0;
    if (gconf) *gconf = 0.0f;
  }
  return ROW_OK;
}

ds_status ds_dspark_loss_rows(const ds_dspark_loss_config *cfg, int64_t row0, int64_t g, int64_t c, int64_t V,
                              const float *draft, const float *target, const int32_t *ids, const uint8_t *sup,
                              const double *w, const float *conf, double grad_scale,
                              const ds_dspark_row_stats *rows, float *grad_draft, float *grad_conf) {
  return ds_dspark_loss_rows_vocab(cfg, NULL, row0, g, c, V, draft, target, ids, sup, w, conf, grad_scale, rows,
                                   grad_draft, grad_conf);
}

/* draft [c, N], target [c, V], ids/sup/w/conf [c] -> rows [c] each, grad_draft [c, N], grad_conf [c];
 * N = vocab->n, or V without a vocabulary */
ds_status ds_dspark_teacher_stats(const float *t, int64_t V, const ds_dspark_vocab *vocab, ds_dspark_teacher_stat *out) {
  int bad;
  float mt = row_scan(t, V, &bad);
  if (bad || mt == -INFINITY)
    return DS_FAIL(DS_ERR_NUMERIC, "dspark loss: target logits hold NaN or +inf, or no finite value");
  out->max = mt;
  out->outside = 0.0;
  out->lse = vocab ? row_log_sumexp_outside(t, V, mt, vocab->index, &out->outside) : row_log_sumexp(t, V, mt);
  return DS_OK;
}

static ds_status rows_core(const ds_dspark_loss_config *cfg, const ds_dspark_vocab *vocab, int64_t row0, int64_t g,
                           int64_t c, int64_t V, const float *draft, const float *target,
                           const ds_dspark_teacher_stat *stat, const int32_t *ids, const uint8_t *sup, const double *w,
                           const float *conf, double grad_scale, const ds_dspark_row_stats *rows, float *grad_draft,
                           float *grad_conf);

ds_status ds_dspark_loss_rows_vocab(const ds_dspark_loss_config *cfg, const ds_dspark_vocab *vocab, int64_t row0,
                                    int64_t g, int64_t c, int64_t V, const float *draft, const float *target,
                                    const int32_t *ids, const uint8_t *sup, const double *w, const float *conf,
                                    double grad_scale, const ds_dspark_row_stats *rows, float *grad_draft,
                                    float *grad_conf) {
  return rows_core(cfg, vocab, row0, g, c, V, draft, target, NULL, ids, sup, w, conf, grad_scale, rows, grad_draft,
                   grad_conf);
}

ds_status ds_dspark_loss_rows_stats(const ds_dspark_loss_config *cfg, const ds_dspark_vocab *vocab, int64_t row0,
                                    int64_t g, int64_t c, int64_t V, const float *draft, const float *target_s,
                                    const ds_dspark_teacher_stat *stat, const int32_t *ids, const uint8_t *sup,
                                    const double *w, const float *conf, double grad_scale,
                                    const ds_dspark_row_stats *rows, float *grad_draft, float *grad_conf) {
  if (c > 0 && (!target_s || !stat))
    return DS_FAIL(DS_ERR_ARG, "dspark loss: the teacher's S columns and per-row stats are both required");
  return rows_core(cfg, vocab, row0, g, c, V, draft, target_s, stat, ids, sup, w, conf, grad_scale, rows, grad_draft,
                   grad_conf);
}

/* target [c, V], or [c, N] (the S columns) when stat [c] is given */
static ds_status rows_core(const ds_dspark_loss_config *cfg, const ds_dspark_vocab *vocab, int64_t row0, int64_t g,
                           int64_t c, int64_t V, const float *draft, const float *target,
                           const ds_dspark_teacher_stat *stat, const int32_t *ids, const uint8_t *sup, const double *w,
                           const float *conf, double grad_scale, const ds_dspark_row_stats *rows, float *grad_draft,
                           float *grad_conf) {
  DS_TRY(ds_dspark_loss_config_check(cfg));
  if (vocab && (!vocab->ids || !vocab->index || vocab->n < 1 || vocab->n > V))
    return DS_FAIL(DS_ERR_ARG, "dspark loss: a draft vocabulary of %lld ids over V %lld, or without its ids or index",
                   (long long)vocab->n, (long long)V);
  int64_t N = vocab ? vocab->n : V;
  if (c < 0 || V < 1 || g < 1 || row0 < 0)
    return DS_FAIL(DS_ERR_ARG, "dspark loss: bad chunk sizes (row0 %lld, c %lld, V %lld, g %lld)",
                   (long long)row0, (long long)c, (long long)V, (long long)g);
  if (c > 0 && (!draft || !ids || !sup || !w || !rows || !rows->ce || !rows->l1 || !rows->accept || !rows->bce))
    return DS_FAIL(DS_ERR_ARG, "dspark loss: NULL draft logits, ids, mask, weights or row outputs");
  if (!!cfg->has_teacher != (target != NULL))
    return DS_FAIL(DS_ERR_ARG, "dspark loss: has_teacher is %d but the target logits are %s", cfg->has_teacher,
                   target ? "given" : "NULL");
  if (!!cfg->has_conf != (conf != NULL))
    return DS_FAIL(DS_ERR_ARG, "dspark loss: has_conf is %d but the confidence logits are %s", cfg->has_conf,
                   conf ? "given" : "NULL");
  if (!isfinite(grad_scale)) return DS_FAIL(DS_ERR_ARG, "dspark loss: grad_scale %g is not finite", grad_scale);
  if (c > INT64_MAX / V) return DS_FAIL(DS_ERR_ARG, "dspark loss: %lld x %lld overflows", (long long)c, (long long)V);
  DS_TRY(ds_dspark_loss_check_ids(row0, g, c, V, ids, sup));
  for (int64_t i = 0; i < c; i++)
    if (sup[i] && !(isfinite(w[i]) && w[i] >= 0.0)) {
      int64_t r = row0 + i;
      return DS_FAIL(DS_ERR_ARG, "dspark loss: weight %g at block %lld slot %lld (row %lld) is not finite and >= 0",
                     w[i], (long long)(r / g), (long long)(r % g), (long long)r);
    }
  if (c == 0) return DS_OK;

  uint8_t *status = ds_calloc((size_t)c, 1, "dspark loss row status");
  if (!status) return DS_ERR_NOMEM;
  int need_scratch = target && grad_draft;

  /* OpenMP over the rows; each row is reduced by one thread in a fixed order */
#ifdef DSPARK_USE_OPENMP
#pragma omp parallel if (c > 1)
#endif
  {
    float *sp = need_scratch ? malloc((size_t)N * sizeof(float)) : NULL;
#ifdef DSPARK_USE_OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
    for (int64_t i = 0; i < c; i++) {
      float *gr = grad_draft ? grad_draft + i * N : NULL;
      float *gc = grad_conf ? grad_conf + i : NULL;
      uint8_t on = 0;
      if (!sup[i]) { /* selected out: never read, exact +0.0 everywhere */
        rows->ce[i] = rows->l1[i] = rows->accept[i] = rows->bce[i] = 0.0;
        if (rows->ce_on) rows->ce_on[i] = 0;
        if (gr) memset(gr, 0, (size_t)N * sizeof(float));
        if (gc) *gc = 0.0f;
        continue;
      }
      if (need_scratch && !sp) {
        status[i] = ROW_NOMEM;
        continue;
      }
      status[i] = (uint8_t)row_one(cfg, vocab, V, N, draft + i * N, target ? target + i * (stat ? N : V) : NULL,
                                   stat ? stat + i : NULL, ids[i], w[i], conf ? conf + i : NULL, grad_scale, gr, sp, &rows->ce[i], &rows->l1[i],
                                   &rows->accept[i], &rows->bce[i], gc, &on);
      if (rows->ce_on) rows->ce_on[i] = on;
    }
    free(sp);
  }

  ds_status st = DS_OK;
  for (int64_t i = 0; i < c && st == DS_OK; i++) {
    if (status[i] == ROW_OK) continue;
    int64_t r = row0 + i;
    long long b = (long long)(r / g), k = (long long)(r % g);
    switch (status[i]) {
    case ROW_BAD_DRAFT:
      st = DS_FAIL(DS_ERR_NUMERIC,
                   "dspark loss: draft logits at block %lld slot %lld (row %lld) hold NaN or +inf, or no finite "
                   "value, at a supervised position", b, k, (long long)r);
      break;
    case ROW_BAD_TARGET:
      st = DS_FAIL(DS_ERR_NUMERIC,
                   "dspark loss: target logits at block %lld slot %lld (row %lld) hold NaN or +inf, or no finite "
                   "value, at a supervised position", b, k, (long long)r);
      break;
    case ROW_BAD_CONF:
      st = DS_FAIL(DS_ERR_NUMERIC,
                   "dspark loss: confidence logit at block %lld slot %lld (row %lld) is not finite at a "
                   "supervised position", b, k, (long long)r);
      break;
    case ROW_BAD_CE:
      st = DS_FAIL(DS_ERR_NUMERIC,
                   "dspark loss: target id %d at block %lld slot %lld (row %lld) has draft probability 0 "
                   "(its logit is -inf): infinite cross-entropy", (int)ids[i], b, k, (long long)r);
      break;
    default:
      st = DS_FAIL(DS_ERR_NOMEM, "dspark loss: cannot allocate a %lld-float scratch row", (long long)N);
    }
  }
  free(status);
  return st;
}
