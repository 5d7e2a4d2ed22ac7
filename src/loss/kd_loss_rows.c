/* The row-chunk core of the KD loss (include/dspark/kd_loss.h): per supervised row one fp32
 * log-softmax of the student at temperature T, shared by the sparse ghost-token KL (or the
 * dense KL), the LM cross-entropy and the gradient row.
 *
 * Per supervised row (s = student row [V], t = teacher row [V] (dense), gr = gradient row [V]):
 *   pass 1  scan:    max and validity of s (and t); O(K) checks of the sparse entries
 *   pass 2  sumexp:  lsT = log sum exp((s - mx) / T), ls1 = log sum exp(s - mx) when T != 1 and
 *                    the LM term is on (same loop, a second exp); the teacher's likewise (dense)
 *   O(K)    sparse:  p_i = (s[id_i] - mx) / T - lsT in double, the K+1 buckets, kd, g_i = d kd / d p_i
 *   pass 3  grad:    gr_v = A softmax(s/T)_v + B softmax(s)_v, then gr[id_i] += a g_i / T and
 *                    gr[label] -= B, with a = scale alpha, A = -a sum(g) / T, B = scale (1 - alpha)
 *                    (dense: the KL's value is summed in the same pass; reverse reads s, t once
 *                    more, since its gradient needs the row's kd)
 * Row sums use LANES fixed partial sums in double, combined in lane order: the result does not
 * depend on threads, chunking or the compiler's vectorization choices. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/kd_loss.h"
#include "dspark/kd_select.h"
#include "loss/loss_lanes.h"

/* Per-row outcome of the parallel part; the first bad row in row order is reported. */
enum {
  ROW_OK = 0,
  ROW_BAD_STUDENT,   /* NaN / +inf, or no finite value */
  ROW_BAD_TEACHER,   /* dense teacher: likewise */
  ROW_LABEL_RANGE,   /* label outside [0, V) */
  ROW_LABEL_ZERO,    /* student logit -inf at the label: infinite CE */
  ROW_ID_RANGE,      /* a topk id outside [0, V) and not -1 (at = entry) */
  ROW_NOT_PREFIX,    /* a kept entry after a dropped one (at = entry) */
  ROW_NONE_KEPT,     /* every entry dropped */
  ROW_DUP_ID,        /* an id kept twice (at = the second entry) */
  ROW_BAD_LP,        /* a kept log-prob NaN or infinite (at = entry) */
  ROW_UNSORTED,      /* top_p < 1 and the kept log-probs increase (at = entry) */
  ROW_MASS,          /* the kept teacher mass exceeds 1.1 */
  ROW_KD_INF,        /* infinite KL: zero student probability where the teacher has mass */
  ROW_NOMEM
};

/* exp(logsumexp) above this is not a set of log-probs (logits given by mistake); room is left
 * for the rounding of bf16 / f16 captures. */
#define KD_MAX_KEPT_MASS 1.1

/* What every row of a call shares. */
typedef struct {
  int64_t V, K, ks;  /* vocabulary, entries used, entries stored per row */
  int want_kd, want_lm, dense, reverse, no_ghost;
  double top_p, inv_t, a, b; /* a = scale alpha (kd), b = scale (1 - alpha) (lm) */
  int64_t min_k;
} row_ctx;

/* Per-thread scratch. */
typedef struct {
  uint8_t *mark; /* [V] zero between rows: duplicate-id marks */
  double *p, *g; /* [K] student log-probs at the kept ids, d kd / d p */
} row_scratch;

/* x [V], finite mx -> log sum exp((x - mx) * it); with ls1, also *ls1 = log sum exp(x - mx). */
static double row_lse(const float *x, int64_t V, float mx, float it, double *ls1) {
  vd acc = {0}, acc1 = {0};
  vf xv, z, e = {0}, e1 = {0}; /* initialized: gcc 12 -march=native on AVX-512 FP16 parts warns otherwise */
  for (int64_t v = 0; v < V; v += LANES) {
    vf_load(&xv, x + v, V - v, -INFINITY); /* padding lanes: exp(-inf) = 0 */
    xv = xv - mx;
    z = xv * it;
    vexp(&e, &z);
    vd_accumulate(&acc, &e);
    if (ls1) {
      vexp(&e1, &xv);
      vd_accumulate(&acc1, &e1);
    }
  }
  if (ls1) *ls1 = log(vd_sum(&acc1));
  return log(vd_sum(&acc));
}

/* gr_v = ca exp((s_v - mx) * it - la) + cb exp((s_v - mx) - lb)  (the second term only when cb != 0).
 *   s [V] (may alias gr), gr [V] */
static void row_grad_softmax(float *gr, const float *s, int64_t V, float mx, float it, float la, float ca, float lb,
                             float cb) {
  vf xv, z, e = {0}, e1 = {0}; /* initialized: see row_lse */
  for (int64_t v = 0; v < V; v += LANES) {
    vf_load(&xv, s + v, V - v, -INFINITY);
    xv = xv - mx;
    z = xv * it - la;
    vexp(&e, &z);
    e = ca * e;
    if (cb != 0.0f) {
      z = xv - lb;
      vexp(&e1, &z);
      e = e + cb * e1;
    }
    vf_store(gr + v, &e, V - v);
  }
}

/* Dense KL of one row in one pass: returns kd, forward sum_v Q_v (q_v - P_v) (terms with Q_v = 0
 * are 0) or reverse sum_v pi_v (P_v - q_v) (terms with pi_v = 0 are 0), where
 * P_v = (s_v - mx) it - ls, q_v = (t_v - mt) it - lt, pi = e^P, Q = e^q; q_v - P_v is formed as
 * ((t_v - mt) - (s_v - mx)) it + dl with dl = ls - lt formed in double by the caller, so that the two
 * normalizers cancel before rounding.
 * With gr (forward KL): gr_v = c_pi pi_v - c_q Q_v + b1 exp((s_v - mx) - l1). */
static double row_dense(float *gr, const float *s, const float *t, int64_t V, float mx, float mt, float it, float ls,
                        float lt, float dl, int reverse, float c_pi, float c_q, float l1, float b1) {
  vd acc = {0};
  vf sv, tv, z, d, pi = {0}, Q = {0}, e1 = {0}, term; /* initialized: see row_lse */
  const vf zero = VF_SPLAT(0);
  for (int64_t v = 0; v < V; v += LANES) {
    vf_load(&sv, s + v, V - v, -INFINITY);
    vf_load(&tv, t + v, V - v, -INFINITY);
    sv = sv - mx;
    tv = tv - mt;
    z = sv * it - ls;
    vexp(&pi, &z);
    z = tv * it - lt;
    vexp(&Q, &z);
    d = (tv - sv) * it + dl; /* q - P */
    if (reverse) term = VF_SELECT(pi > zero, -(pi * d), zero);
    else term = VF_SELECT(Q > zero, Q * d, zero);
    vd_accumulate(&acc, &term);
    if (gr) {
      vf gv = c_pi * pi - c_q * Q;
      if (b1 != 0.0f) {
        z = sv - l1;
        vexp(&e1, &z);
        gv = gv + b1 * e1;
      }
      vf_store(gr + v, &gv, V - v);
    }
  }
  return vd_sum(&acc);
}

/* The dense reverse KL's gradient: gr_v = a_t pi_v (P_v - q_v - kd) (0 where pi_v = 0)
 * + c_pi pi_v + b1 exp((s_v - mx) - l1). Same P, q, pi, dl as row_dense. */
static void row_dense_reverse_grad(float *gr, const float *s, const float *t, int64_t V, float mx, float mt, float it,
                                   float ls, float dl, float kd, float a_t, float c_pi, float l1, float b1) {
  vf sv, tv, z, pi = {0}, e1 = {0}, gv; /* initialized: see row_lse */
  const vf zero = VF_SPLAT(0);
  for (int64_t v = 0; v < V; v += LANES) {
    vf_load(&sv, s + v, V - v, -INFINITY);
    vf_load(&tv, t + v, V - v, -INFINITY);
    sv = sv - mx;
    tv = tv - mt;
    z = sv * it - ls;
    vexp(&pi, &z);
    z = (sv - tv) * it - dl - kd; /* P - q - kd */
    gv = VF_SELECT(pi > zero, a_t * (pi * z), zero) + c_pi * pi;
    if (b1 != 0.0f) {
      z = sv - l1;
      vexp(&e1, &z);
      gv = gv + b1 * e1;
    }
    vf_store(gr + v, &gv, V - v);
  }
}

/* log sum exp x[0 .. n-1] in double; -inf when every value is -inf (or n = 0). */
static double lse_d(const double *x, int64_t n) {
  double m = -INFINITY, s = 0.0;
  for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
  if (m == -INFINITY) return -INFINITY;
  for (int64_t i = 0; i < n; i++) s += exp(x[i] - m);
  return m + log(s);
}

/* The sparse entries of one supervised row: ids [ks], lq [ks] -> *n = the kept prefix after the
 * training-time top-p rule; a ROW_* code (the offending entry in *at). */
static int sparse_check(const row_ctx *x, const int32_t *ids, const float *lq, uint8_t *mark, int64_t *n, int64_t *at) {
  int64_t kept = 0, ended = 0;
  for (int64_t i = 0; i < x->K; i++) {
    int32_t id = ids[i];
    if (id == -1) {
      ended = 1;
      continue;
    }
    *at = i;
    if (id < 0 || (int64_t)id >= x->V) return ROW_ID_RANGE;
    if (ended) return ROW_NOT_PREFIX;
    kept++;
  }
  if (kept == 0) return ROW_NONE_KEPT;
  int code = ROW_OK;
  int64_t i = 0;
  for (; i < kept && code == ROW_OK; i++) {
    *at = i;
    if (mark[ids[i]]) code = ROW_DUP_ID;
    else if (!isfinite(lq[i])) code = ROW_BAD_LP;
    else if (x->top_p < 1.0 && i > 0 && lq[i] > lq[i - 1]) code = ROW_UNSORTED;
    mark[ids[i]] = 1;
  }
  for (int64_t j = 0; j < i; j++) mark[ids[j]] = 0; /* the marks are zero again between rows */
  if (code != ROW_OK) return code;
  double m = lq[0], sum = 0.0; /* the mass check runs on everything the capture kept */
  for (int64_t j = 1; j < kept; j++) m = lq[j] > m ? lq[j] : m;
  for (int64_t j = 0; j < kept; j++) sum += exp((double)lq[j] - m);
  if (m + log(sum) > log(KD_MAX_KEPT_MASS)) return ROW_MASS;
  *n = ds_kd_top_p_count(lq, kept, x->top_p, x->min_k);
  return ROW_OK;
}

/* The K+1-bucket KL of one row (kd.md section 2): p [n] student log-probs at the kept ids,
 * q [n] the teacher's -> kd, g [n] = d kd / d p_i, *G = sum g. */
static double ghost_kd(const row_ctx *x, const double *p, const float *q, int64_t n, double *g, double *G) {
  double *qd = g; /* q in double, in g until g is written (entry by entry, after its use) */
  for (int64_t i = 0; i < n; i++) qd[i] = (double)q[i];
  double Lq = lse_d(qd, n), Lp = lse_d(p, n);
  double gq = ds_kd_ghost_log_mass(Lq), gp = ds_kd_ghost_log_mass(Lp);
  int p_free = Lp <= -DS_KD_GHOST_EPS; /* the clamp passes the gradient (as torch.clamp at equality) */
  double kd = 0.0, sum = 0.0;
  if (!x->reverse) {
    double eg = exp(gq);
    for (int64_t i = 0; i < n; i++) {
      double qi = qd[i], eq = exp(qi);
      kd += eq * (qi - p[i]);
      g[i] = -eq + (p_free ? exp(gq + p[i] - gp) : 0.0);
      sum += g[i];
    }
    kd += eg * (gq - gp);
  } else {
    double c = p_free ? gp - gq + 1.0 : 0.0;
    for (int64_t i = 0; i < n; i++) {
      double qi = qd[i];
      if (p[i] == -INFINITY) { /* probability 0: no term, no gradient */
        g[i] = 0.0;
        continue;
      }
      double ep = exp(p[i]);
      kd += ep * (p[i] - qi);
      g[i] = ep * (p[i] - qi + 1.0) - ep * c;
      sum += g[i];
    }
    kd += exp(gp) * (gp - gq);
  }
  *G = sum;
  return kd;
}

/* The ablation without the ghost bucket (kd_loss.h): both sides renormalized over the n kept
 * entries; same arguments as ghost_kd, *G = sum g = 0 up to rounding. */
static double renormalized_kd(const row_ctx *x, const double *p, const float *q, int64_t n, double *g, double *G) {
  double *qd = g;
  for (int64_t i = 0; i < n; i++) qd[i] = (double)q[i];
  double Lq = lse_d(qd, n), Lp = lse_d(p, n), kd = 0.0, sum = 0.0;
  for (int64_t i = 0; i < n; i++) {
    double qh = qd[i] - Lq, ph = p[i] - Lp;
    if (!x->reverse) {
      kd += exp(qh) * (qh - ph);
      g[i] = exp(ph) - exp(qh);
    } else if (p[i] == -INFINITY) {
      g[i] = 0.0;
    } else {
      kd += exp(ph) * (ph - qh);
      g[i] = ph - qh; /* times e^ph, minus e^ph kd: finished below, once kd is known */
    }
  }
  for (int64_t i = 0; x->reverse && i < n; i++)
    if (p[i] != -INFINITY) g[i] = exp(p[i] - Lp) * (g[i] - kd);
  for (int64_t i = 0; i < n; i++) sum += g[i];
  *G = sum;
  return kd;
}

/* One supervised row: fills kd, lm and the gradient row; returns a ROW_* code (*at: entry).
 *   s [V], ids / lq [ks] or NULL, t [V] or NULL, gr [V] or NULL (may alias s) */
static int row_one(const row_ctx *x, const float *s, const int32_t *ids, const float *lq, const float *t,
                   int32_t label, row_scratch *sc, float *gr, double *kd_out, double *lm_out, int64_t *at) {
  const int64_t V = x->V;
  int bad;
  *kd_out = *lm_out = 0.0;
  float mx = row_scan(s, V, &bad);
  if (bad || mx == -INFINITY) return ROW_BAD_STUDENT;
  if (x->want_lm && (label < 0 || (int64_t)label >= V)) return ROW_LABEL_RANGE;
  int64_t n = 0;
  float mt = 0.0f;
  if (x->want_kd && !x->dense) {
    int code = sparse_check(x, ids, lq, sc->mark, &n, at);
    if (code != ROW_OK) return code;
  } else if (x->want_kd) {
    mt = row_scan(t, V, &bad);
    if (bad || mt == -INFINITY) return ROW_BAD_TEACHER;
  }

  /* the log-softmax normalizers: at T (kd), at 1 (lm) */
  const float it = (float)x->inv_t;
  const int two = x->want_lm && x->want_kd && x->inv_t != 1.0;
  double ls1 = 0.0, lsT = x->want_kd ? row_lse(s, V, mx, it, two ? &ls1 : NULL) : 0.0;
  if (!x->want_kd) ls1 = row_lse(s, V, mx, 1.0f, NULL);
  else if (!two) ls1 = lsT;
  if (x->want_lm) {
    *lm_out = ls1 - ((double)s[label] - (double)mx);
    if (!isfinite(*lm_out)) return ROW_LABEL_ZERO;
  }
  const float b = (float)x->b, l1 = (float)ls1, lT = (float)lsT;

  if (!x->want_kd) {
    if (gr) {
      row_grad_softmax(gr, s, V, mx, 1.0f, l1, b, 0.0f, 0.0f);
      gr[label] -= b;
    }
    return ROW_OK;
  }
  if (x->dense) {
    double lst = row_lse(t, V, mt, it, NULL);
    const float lt = (float)lst, dl = (float)(lsT - lst);
    /* the LM's softmax: pi itself at T = 1 (a coefficient), a second exp otherwise */
    const float a_t = (float)(x->a * x->inv_t), c_lm = x->want_lm && !two ? b : 0.0f, b1 = two ? b : 0.0f;
    double kd;
    if (!x->reverse) {
      kd = row_dense(gr, s, t, V, mx, mt, it, lT, lt, dl, 0, a_t + c_lm, a_t, l1, b1);
    } else {
      kd = row_dense(NULL, s, t, V, mx, mt, it, lT, lt, dl, 1, 0.0f, 0.0f, 0.0f, 0.0f);
      if (gr && isfinite(kd)) row_dense_reverse_grad(gr, s, t, V, mx, mt, it, lT, dl, (float)kd, a_t, c_lm, l1, b1);
    }
    *kd_out = kd;
    if (!isfinite(kd)) return ROW_KD_INF;
    if (gr && x->want_lm) gr[label] -= b;
    return ROW_OK;
  }

  /* sparse: the kept ids' student log-probs, the K+1 buckets, then the gradient row */
  for (int64_t i = 0; i < n; i++) sc->p[i] = ((double)s[ids[i]] - (double)mx) * x->inv_t - lsT;
  double G;
  double kd = x->no_ghost ? renormalized_kd(x, sc->p, lq, n, sc->g, &G) : ghost_kd(x, sc->p, lq, n, sc->g, &G);
  *kd_out = kd;
  if (!isfinite(kd)) return ROW_KD_INF;
  if (gr) {
    if (two) row_grad_softmax(gr, s, V, mx, it, lT, (float)(-x->a * G * x->inv_t), l1, b);
    else row_grad_softmax(gr, s, V, mx, it, lT, (float)(-x->a * G * x->inv_t) + (x->want_lm ? b : 0.0f), 0.0f, 0.0f);
    for (int64_t i = 0; i < n; i++) gr[ids[i]] += (float)(x->a * sc->g[i] * x->inv_t);
    if (x->want_lm) gr[label] -= b;
  }
  return ROW_OK;
}

static const char *value_name(float v) { return v != v ? "NaN" : v > 0 ? "+inf" : "-inf"; }

/* The message of a bad row (global row r, chunk-local index i); the inputs are re-read here,
 * after the parallel part, to name the tensor and the index. */
static ds_status row_error(const row_ctx *x, const ds_kd_rows_in *in, int64_t r, int64_t i, int code, int64_t at) {
  const int64_t V = x->V, ks = x->ks;
  const float *s = in->student + i * V;
  const int32_t *ids = in->topk_ids ? in->topk_ids + i * ks : NULL;
  const float *lq = in->topk_lp ? in->topk_lp + i * ks : NULL;
  const long long R = (long long)r;
  switch (code) {
  case ROW_BAD_STUDENT:
  case ROW_BAD_TEACHER: {
    const float *row = code == ROW_BAD_STUDENT ? s : in->teacher + i * V;
    const char *name = code == ROW_BAD_STUDENT ? "student_logits" : "teacher_logits";
    for (int64_t v = 0; v < V; v++)
      if (row[v] != row[v] || row[v] == INFINITY)
        return DS_FAIL(DS_ERR_NUMERIC, "kd loss: tensor '%s' holds %s at [%lld, %lld] (row %lld is supervised)", name,
                       value_name(row[v]), R, (long long)v, R);
    return DS_FAIL(DS_ERR_NUMERIC, "kd loss: tensor '%s' has no finite value in row %lld (all -inf), a supervised row",
                   name, R);
  }
  case ROW_LABEL_RANGE:
    return DS_FAIL(DS_ERR_RANGE, "kd loss: tensor 'labels' holds %d at [%lld] (row %lld is supervised): outside the "
                   "vocabulary [0, %lld)", (int)in->labels[i], R, R, (long long)V);
  case ROW_LABEL_ZERO:
    return DS_FAIL(DS_ERR_NUMERIC, "kd loss: tensor 'labels' holds %d at [%lld] where tensor 'student_logits' is -inf "
                   "(probability 0): the cross-entropy of supervised row %lld is infinite", (int)in->labels[i], R, R);
  case ROW_ID_RANGE:
    return DS_FAIL(DS_ERR_RANGE, "kd loss: tensor 'topk_ids' holds %d at [%lld, %lld] (row %lld is supervised): "
                   "outside the vocabulary [0, %lld) and not the sentinel -1", (int)ids[at], R, (long long)at, R,
                   (long long)V);
  case ROW_NOT_PREFIX: {
    int64_t first = 0;
    while (ids[first] != -1) first++;
    return DS_FAIL(DS_ERR_ARG, "kd loss: tensor 'topk_ids' holds %d at [%lld, %lld] after the sentinel -1 at [%lld, "
                   "%lld]: the kept entries of a row must be a prefix (row %lld is supervised)", (int)ids[at], R,
                   (long long)at, R, (long long)first, R);
  }
  case ROW_NONE_KEPT:
    return DS_FAIL(DS_ERR_ARG, "kd loss: tensor 'topk_ids' keeps no entry in row %lld (all -1), a supervised row: the "
                   "teacher's top-1 is always kept", R);
  case ROW_DUP_ID: {
    int64_t first = 0;
    while (ids[first] != ids[at]) first++;
    return DS_FAIL(DS_ERR_ARG, "kd loss: tensor 'topk_ids' holds %d twice in row %lld, at [%lld, %lld] and [%lld, "
                   "%lld]: the kept ids must be distinct", (int)ids[at], R, R, (long long)first, R, (long long)at);
  }
  case ROW_BAD_LP:
    return DS_FAIL(DS_ERR_NUMERIC, "kd loss: tensor 'topk_logprobs' holds %s at [%lld, %lld], a kept entry of "
                   "supervised row %lld", value_name(lq[at]), R, (long long)at, R);
  case ROW_UNSORTED:
    return DS_FAIL(DS_ERR_ARG, "kd loss: tensor 'topk_logprobs' increases at [%lld, %lld] (%.9g after %.9g): with "
                   "--top-p < 1 the kept entries must be sorted by descending log-prob, as capture writes them",
                   R, (long long)at, (double)lq[at], (double)lq[at - 1]);
  case ROW_MASS:
    return DS_FAIL(DS_ERR_ARG, "kd loss: tensor 'topk_logprobs' row %lld: the kept teacher probabilities sum to more "
                   "than %g: the values must be full-vocabulary log-probs (log_softmax), not logits", R,
                   KD_MAX_KEPT_MASS);
  case ROW_KD_INF:
    if (x->reverse)
      return DS_FAIL(DS_ERR_NUMERIC, "kd loss: the reverse KL of supervised row %lld is infinite: tensor "
                     "'teacher_logits' is -inf (probability 0) where the student has mass", R);
    return DS_FAIL(DS_ERR_NUMERIC, "kd loss: the KL of supervised row %lld is infinite: tensor 'student_logits' is -inf "
                   "(probability 0) where the teacher has mass", R);
  default:
    return DS_FAIL(DS_ERR_NOMEM, "kd loss: cannot allocate the per-thread scratch (%lld bytes + %lld entries)",
                   (long long)V, (long long)x->K);
  }
}

/* student [c, V], topk ids / lp [c, ks], teacher [c, V], labels [c], mask [c]
 *   -> kd [c], lm [c], grad [c, V] */
ds_status ds_kd_loss_rows(const ds_kd_loss_config *cfg, int64_t row0, int64_t c, int64_t V, const ds_kd_rows_in *in,
                          double grad_scale, double *kd, double *lm, float *grad) {
  DS_TRY(ds_kd_loss_config_check(cfg, V));
  if (c < 0 || V < 1 || row0 < 0)
    return DS_FAIL(DS_ERR_ARG, "kd loss: bad chunk sizes (row0 %lld, rows %lld, V %lld)", (long long)row0,
                   (long long)c, (long long)V);
  if (c > INT64_MAX / V) return DS_FAIL(DS_ERR_ARG, "kd loss: %lld x %lld overflows", (long long)c, (long long)V);
  if (!isfinite(grad_scale)) return DS_FAIL(DS_ERR_ARG, "kd loss: grad_scale %g is not finite", grad_scale);
  if (!in) return DS_FAIL(DS_ERR_ARG, "kd loss: inputs are NULL");
  row_ctx x;
  memset(&x, 0, sizeof x);
  x.V = V;
  x.want_kd = cfg->kd_loss_alpha > 0.0;
  x.want_lm = cfg->kd_loss_alpha < 1.0;
  x.dense = cfg->top_k == 0;
  x.reverse = cfg->reverse != 0;
  x.no_ghost = cfg->no_ghost != 0;
  x.K = cfg->top_k;
  x.ks = in->k_stride;
  x.top_p = cfg->top_p;
  x.min_k = cfg->min_k;
  x.inv_t = 1.0 / cfg->temperature;
  x.a = grad_scale * cfg->kd_loss_alpha;
  x.b = grad_scale * (1.0 - cfg->kd_loss_alpha);
  if (c > 0 && (!in->student || !in->mask))
    return DS_FAIL(DS_ERR_ARG, "kd loss: the student logits and the loss mask are required");
  if (c > 0 && x.want_lm && !in->labels)
    return DS_FAIL(DS_ERR_ARG, "kd loss: labels are required when --kd-loss-alpha %g < 1 (the LM term is on)",
                   cfg->kd_loss_alpha);
  if (c > 0 && x.want_kd && x.dense && !in->teacher)
    return DS_FAIL(DS_ERR_ARG, "kd loss: without --topk (dense KL) the teacher logits are required");
  if (c > 0 && x.want_kd && !x.dense && (!in->topk_ids || !in->topk_lp || in->k_stride < cfg->top_k))
    return DS_FAIL(DS_ERR_ARG, "kd loss: --topk %lld needs topk ids and log-probs with at least %lld entries per row "
                   "(%lld given)", (long long)cfg->top_k, (long long)cfg->top_k, (long long)in->k_stride);
  if (c == 0) return DS_OK;

  uint8_t *status = ds_calloc((size_t)c, 1, "kd loss row status");
  int64_t *at = ds_calloc((size_t)c, sizeof *at, "kd loss row status");
  if (!status || !at) {
    free(status);
    free(at);
    return DS_ERR_NOMEM;
  }
  const int sparse = x.want_kd && !x.dense;

  /* OpenMP over the rows; each row is reduced by one thread in a fixed order */
#ifdef DSPARK_USE_OPENMP
#pragma omp parallel if (c > 1)
#endif
  {
    row_scratch sc = {NULL, NULL, NULL};
    int ok = 1;
    if (sparse) {
      sc.mark = calloc((size_t)V, 1);
      sc.p = malloc((size_t)(x.K > 0 ? x.K : 1) * 2 * sizeof(double));
      sc.g = sc.p ? sc.p + x.K : NULL;
      ok = sc.mark && sc.p;
    }
#ifdef DSPARK_USE_OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
    for (int64_t i = 0; i < c; i++) {
      float *gr = grad ? grad + i * V : NULL;
      double kd_i = 0.0, lm_i = 0.0;
      if (!in->mask[i]) { /* selected out: never read, exact +0.0 everywhere */
        if (gr) memset(gr, 0, (size_t)V * sizeof(float));
      } else if (!ok) {
        status[i] = ROW_NOMEM;
      } else {
        status[i] = (uint8_t)row_one(&x, in->student + i * V, sparse ? in->topk_ids + i * x.ks : NULL,
                                     sparse ? in->topk_lp + i * x.ks : NULL,
                                     x.want_kd && x.dense ? in->teacher + i * V : NULL,
                                     x.want_lm ? in->labels[i] : 0, &sc, gr, &kd_i, &lm_i, &at[i]);
      }
      if (kd) kd[i] = kd_i;
      if (lm) lm[i] = lm_i;
    }
    free(sc.mark);
    free(sc.p);
  }

  ds_status st = DS_OK;
  for (int64_t i = 0; i < c && st == DS_OK; i++)
    if (status[i] != ROW_OK) st = row_error(&x, in, row0 + i, i, status[i], at[i]);
  free(status);
  free(at);
  return st;
}
