/* The DSpark loss over a reduced draft vocabulary (spec/dspark.md section 4a) against a
 * double-precision reference written here from the spec (q over S, p the teacher's FULL
 * softmax, CE only where x* is in S, l1 = sum_S |q - p| + (1 - sum_S p)), its gradients
 * against central finite differences of that reference in double, the CE pair's denominator,
 * the regression fact "S = all of V in order gives the unrestricted loss bit for bit", poisoned
 * padding, chunking and thread independence, and the vocabulary checks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/backend.h"
#include "dspark/dspark_loss.h"
#include "dspark/rng.h"
#include "support/loss_batch.h"
#include "test_util.h"

static ds_rng g_rng;

/* A vocabulary S of n ids drawn from [0, V) (sorted), with its index; or, with n == V, the identity. */
typedef struct {
  int32_t *ids, *index;
  ds_dspark_vocab vb;
} vocab;

static vocab vocab_new(int64_t V, int64_t n) {
  vocab v;
  v.ids = malloc((size_t)n * sizeof(int32_t));
  v.index = malloc((size_t)V * sizeof(int32_t));
  uint8_t *in = calloc((size_t)V, 1);
  for (int64_t k = 0; k < n;) { /* n distinct ids */
    int64_t id = n == V ? k : (int64_t)(ds_rng_next_u64(&g_rng) % (uint64_t)V);
    if (!in[id]) in[id] = 1, k++;
  }
  int64_t j = 0;
  for (int64_t id = 0; id < V; id++) {
    v.index[id] = in[id] ? (int32_t)j : -1;
    if (in[id]) v.ids[j++] = (int32_t)id;
  }
  free(in);
  v.vb = (ds_dspark_vocab){n, v.ids, v.index};
  return v;
}

static void vocab_free(vocab *v) { free(v->ids), free(v->index); }

/* The batch's draft logits restricted to S: [R, N], the columns ids[j] of the full rows. */
static float *restrict_draft(const batch *b, const vocab *v) {
  int64_t N = v->vb.n;
  float *x = malloc((size_t)(b->R * N) * sizeof(float));
  for (int64_t r = 0; r < b->R; r++)
    for (int64_t j = 0; j < N; j++) x[r * N + j] = b->draft[r * b->V + v->ids[j]];
  return x;
}

typedef struct {
  ds_status st;
  ds_dspark_loss_result res;
  double pos_acc[64], pos_cnt[64];
  double *ce, *l1, *acc, *bce; /* [R] */
  uint8_t *ce_on;              /* [R] */
  float *gd, *gc;              /* [R, N], [R] */
} vrun;

/* ds_dspark_loss over the draft rows x [R, N] (the vocabulary vb, or NULL with N = V). */
static vrun run_vocab(const ds_dspark_loss_config *cfg, const batch *b, const float *x, const ds_dspark_vocab *vb,
                      double scale) {
  vrun o;
  memset(&o, 0, sizeof o);
  int64_t N = vb ? vb->n : b->V;
  size_t R = (size_t)b->R;
  o.ce = malloc(R * sizeof(double)), o.l1 = malloc(R * sizeof(double));
  o.acc = malloc(R * sizeof(double)), o.bce = malloc(R * sizeof(double));
  o.ce_on = malloc(R);
  o.gd = malloc((size_t)(b->R * N) * sizeof(float)), o.gc = malloc(R * sizeof(float));
  memset(o.gd, 0x7f, (size_t)(b->R * N) * sizeof(float)); /* garbage: a missed write shows */
  memset(o.gc, 0x7f, R * sizeof(float));
  ds_dspark_row_stats rows = {o.ce, o.l1, o.acc, o.bce, vb ? o.ce_on : NULL};
  ds_dspark_loss_inputs in = {x, cfg->has_teacher ? b->target : NULL, b->ids, b->em, b->bk,
                              cfg->has_conf ? b->conf : NULL, vb};
  o.st = ds_dspark_loss(cfg, b->nb, b->g, b->V, &in, scale, &o.res, o.pos_acc, o.pos_cnt, o.gd, o.gc, &rows);
  return o;
}

static void vrun_free(vrun *o) {
  free(o->ce), free(o->l1), free(o->acc), free(o->bce), free(o->ce_on), free(o->gd), free(o->gc);
}

static int vruns_identical(const vrun *a, const vrun *b, int64_t R, int64_t N, int64_t g) {
  int ok = a->st == b->st && results_identical(&a->res, &b->res);
  ok = ok && same_bits(a->pos_acc, b->pos_acc, (size_t)g * sizeof(double)) &&
       same_bits(a->pos_cnt, b->pos_cnt, (size_t)g * sizeof(double));
  size_t n = (size_t)R * sizeof(double);
  ok = ok && same_bits(a->ce, b->ce, n) && same_bits(a->l1, b->l1, n) && same_bits(a->acc, b->acc, n) &&
       same_bits(a->bce, b->bce, n);
  return ok && same_bits(a->gd, b->gd, (size_t)(R * N) * sizeof(float)) && same_bits(a->gc, b->gc, (size_t)R * sizeof(float));
}

/* The section 4a reference in double: draft x [R, N] over S, target t [R, V], conf z [R];
 * accept_fixed holds the detached label fixed (finite differences), accept_out receives it. */
typedef struct {
  double num, W, W_ce, ce, l1, bce, acc, tau;
  int64_t tokens;
} vref;

static void ref_vocab(const ds_dspark_loss_config *cfg, const batch *b, const vocab *v, const double *x,
                      const double *t, const double *z, const double *accept_fixed, double *accept_out, vref *o) {
  memset(o, 0, sizeof *o);
  int64_t V = b->V, N = v->vb.n;
  int teacher = cfg->has_teacher, conf_on = cfg->has_teacher && cfg->has_conf;
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
      const double *xr = x + r * N;
      double m = xr[0], s = 0;
      for (int64_t j = 1; j < N; j++) m = fmax(m, xr[j]);
      for (int64_t j = 0; j < N; j++) s += exp(xr[j] - m);
      o->tokens++, o->W += w;
      int32_t js = v->index[b->ids[r]];
      if (js >= 0) o->W_ce += w, o->ce += w * -(xr[js] - m - log(s));
      if (!teacher) continue;
      const double *tr = t + r * V;
      double mt = tr[0], st = 0, l1 = 0, in_s = 0;
      for (int64_t u = 1; u < V; u++) mt = fmax(mt, tr[u]);
      for (int64_t u = 0; u < V; u++) st += exp(tr[u] - mt);
      for (int64_t j = 0; j < N; j++) {
        double p = exp(tr[v->ids[j]] - mt) / st, q = exp(xr[j] - m) / s;
        l1 += fabs(q - p), in_s += p;
      }
      l1 += 1.0 - in_s; /* the full p's mass outside S: the draft puts none there */
      double a = fmin(1.0, fmax(0.0, 1.0 - 0.5 * l1));
      if (accept_out) accept_out[r] = a;
      if (accept_fixed) a = accept_fixed[r];
      o->l1 += w * l1, o->acc += a;
      cum *= a, tau_b += cum;
      if (conf_on) {
        double zz = z[r], ls = -log1p(exp(-zz)), lns = -log1p(exp(zz));
        o->bce += w * -(a * ls + (1 - a) * lns);
      }
    }
    if (valid) o->tau += tau_b;
  }
  o->num = cfg->alpha_ce * o->ce + cfg->alpha_l1 * o->l1 + cfg->alpha_conf * o->bce;
}

/* Values and gradients against the reference, and the gradients against central finite
 * differences of the reference numerator with the detached label held fixed; every mode
 * (teacher + conf, teacher, CE only), targets both in and outside S, an unsupervised row. */
static void test_matches_reference_and_fd(void) {
  for (int mode = 0; mode < 3; mode++) {
    batch b = batch_new(&g_rng, 2, 4, 23, 1.5f);
    vocab v = vocab_new(b.V, 9);
    b.ids[0] = v.ids[3], b.ids[1] = v.ids[0], b.ids[5] = v.ids[8]; /* some x* in S ... */
    for (int32_t id = 0; id < b.V; id++)
      if (v.index[id] < 0) { b.ids[2] = b.ids[4] = id; break; } /* ... and some outside */
    b.em[3] = 0; /* unsupervised: exactly 0 */
    ds_dspark_loss_config cfg = cfg_with(mode != 2, mode == 0);
    cfg.alpha_ce = 0.3, cfg.alpha_l1 = 0.9, cfg.alpha_conf = 0.7;
    float *xf = restrict_draft(&b, &v);
    vrun o = run_vocab(&cfg, &b, xf, &v.vb, 1.0);
    EXPECT_OK(o.st);
    int64_t N = v.vb.n, n = b.R * N;
    double *x = to_double(xf, n), *t = to_double(b.target, b.R * b.V), *z = to_double(b.conf, b.R);
    double *acc = calloc((size_t)b.R, sizeof(double)), *fd = calloc((size_t)n, sizeof(double));
    double *fdz = calloc((size_t)b.R, sizeof(double));
    vref r0, rp, rm;
    ref_vocab(&cfg, &b, &v, x, t, z, NULL, acc, &r0);
    EXPECT_CLOSE(o.res.numerator, r0.num, 1e-5, 1e-9);
    EXPECT_CLOSE(o.res.W, r0.W, 1e-12, 0);
    EXPECT(o.res.num_tokens == r0.tokens);
    EXPECT_CLOSE(o.res.pair[DS_DSPARK_PAIR_CE][0], r0.ce, 1e-5, 1e-9);
    EXPECT_CLOSE(o.res.pair[DS_DSPARK_PAIR_CE][1], r0.W_ce, 1e-12, 0); /* the CE denominator: x* in S only */
    EXPECT(r0.W_ce < r0.W);
    EXPECT_CLOSE(o.res.pair[DS_DSPARK_PAIR_L1][0], r0.l1, 1e-5, 1e-9);
    EXPECT_CLOSE(o.res.pair[DS_DSPARK_PAIR_CONF][0], r0.bce, 1e-5, 1e-9);
    if (mode != 2) {
      EXPECT_CLOSE(o.res.pair[DS_DSPARK_PAIR_ACCEPT][0], r0.acc, 1e-5, 1e-9);
      EXPECT_CLOSE(o.res.pair[DS_DSPARK_PAIR_TAU][0], r0.tau, 1e-5, 1e-9);
    }
    EXPECT(o.ce_on[0] == 1 && o.ce_on[2] == 0 && o.ce_on[3] == 0 && o.ce_on[4] == 0 && o.ce_on[5] == 1);
    EXPECT(o.ce[2] == 0.0 && o.ce[4] == 0.0);
    const double h = 1e-5;
    for (int64_t i = 0; i < n; i++) {
      double x0 = x[i];
      x[i] = x0 + h, ref_vocab(&cfg, &b, &v, x, t, z, acc, NULL, &rp);
      x[i] = x0 - h, ref_vocab(&cfg, &b, &v, x, t, z, acc, NULL, &rm);
      fd[i] = (rp.num - rm.num) / (2 * h);
      x[i] = x0;
    }
    for (int64_t r = 0; r < b.R; r++) {
      double z0 = z[r];
      z[r] = z0 + h, ref_vocab(&cfg, &b, &v, x, t, z, acc, NULL, &rp);
      z[r] = z0 - h, ref_vocab(&cfg, &b, &v, x, t, z, acc, NULL, &rm);
      fdz[r] = (rp.num - rm.num) / (2 * h);
      z[r] = z0;
    }
    double e = rel_err_fd(o.gd, fd, n), ez = rel_err_fd(o.gc, fdz, b.R);
    fprintf(stderr, "  mode %d: draft grad vs FD %.2e, conf grad vs FD %.2e\n", mode, e, ez);
    EXPECT(e < 1e-5);
    EXPECT(ez < 1e-5 || mode != 0);
    for (int64_t j = 0; j < N; j++) EXPECT(o.gd[3 * N + j] == 0.0f && fd[3 * N + j] == 0.0);
    if (mode == 2) /* CE only and x* outside S: the row sends no gradient at all */
      for (int64_t j = 0; j < N; j++) EXPECT(o.gd[2 * N + j] == 0.0f);
    free(x), free(t), free(z), free(acc), free(fd), free(fdz), free(xf);
    vrun_free(&o);
    vocab_free(&v);
    batch_free(&b);
  }
}

/* Section 4a's regression fact: S = all of V in order is the unrestricted loss, bit for bit
 * (values, pairs, rows, both gradients), in every mode, chunked or not. */
static void test_identity_is_unrestricted(void) {
  for (int mode = 0; mode < 3; mode++) {
    batch b = batch_new(&g_rng, 5, 7, 301, 4);
    b.em[9] = 0, b.bk[2] = 0;
    vocab v = vocab_new(b.V, b.V);
    ds_dspark_loss_config cfg = cfg_with(mode != 2, mode == 0);
    cfg.chunk_rows = 8;
    vrun full = run_vocab(&cfg, &b, b.draft, NULL, 0.37), id = run_vocab(&cfg, &b, b.draft, &v.vb, 0.37);
    EXPECT_OK(full.st);
    EXPECT_OK(id.st);
    EXPECT(vruns_identical(&full, &id, b.R, b.V, b.g));
    for (int64_t r = 0; r < b.R; r++) EXPECT(id.ce_on[r] == (b.em[r] && b.bk[r / b.g]));
    vrun_free(&full), vrun_free(&id);
    vocab_free(&v);
    batch_free(&b);
  }
}

/* Facts of the restricted objective: a draft equal to the teacher on S reaches l1 = the mass
 * outside S (accept = 1 - that / 2), and S covering the teacher's whole support gives l1 = 0. */
static void test_outside_mass(void) {
  batch b = batch_new(&g_rng, 1, 3, 40, 2);
  vocab v = vocab_new(b.V, 10);
  int64_t N = v.vb.n;
  ds_dspark_loss_config cfg = cfg_with(1, 0);
  /* draft = teacher's logits on S: q_j = p_{S[j]} / sum_S p */
  for (int64_t r = 0; r < b.R; r++) {
    if (r == 2) /* the teacher's support inside S */
      for (int64_t u = 0; u < b.V; u++) b.target[r * b.V + u] = v.index[u] >= 0 ? b.target[r * b.V + u] : -INFINITY;
  }
  float *x = malloc((size_t)(b.R * N) * sizeof(float));
  for (int64_t r = 0; r < b.R; r++)
    for (int64_t j = 0; j < N; j++) x[r * N + j] = b.target[r * b.V + v.ids[j]];
  vrun o = run_vocab(&cfg, &b, x, &v.vb, 1.0);
  EXPECT_OK(o.st);
  for (int64_t r = 0; r < b.R; r++) {
    const float *t = b.target + r * b.V;
    double m = -INFINITY, s = 0, out = 0, ins = 0;
    for (int64_t u = 0; u < b.V; u++) m = fmax(m, t[u]);
    for (int64_t u = 0; u < b.V; u++) s += exp(t[u] - m);
    for (int64_t u = 0; u < b.V; u++) {
      if (v.index[u] < 0) out += exp(t[u] - m) / s;
      else ins += exp(t[u] - m) / s;
    }
    EXPECT_CLOSE(out + ins, 1.0, 1e-12, 1e-12); /* the two masses split p */
    /* q = p / ins on S: sum_S |q - p| = (1 - ins) = out, plus out outside */
    EXPECT_CLOSE(o.l1[r], 2 * out, 1e-5, 1e-6);
    if (r == 2) EXPECT(o.l1[r] < 1e-6 && o.acc[r] > 1 - 1e-6);
  }
  free(x);
  vrun_free(&o);
  vocab_free(&v);
  batch_free(&b);
}

/* Robustness of section 4: unsupervised rows may hold sentinel ids and non-finite logits in
 * the restricted draft rows and in the full teacher rows; nothing changes; results do not
 * depend on the chunking or the thread count. */
static void test_poison_chunks_threads(void) {
  batch b = batch_new(&g_rng, 6, 7, 257, 3);
  vocab v = vocab_new(b.V, 60);
  b.em[4] = 0, b.bk[3] = 0;
  ds_dspark_loss_config cfg = cfg_with(1, 1);
  cfg.chunk_rows = 5;
  float *x = restrict_draft(&b, &v);
  int saved = ds_get_num_threads();
  ds_set_num_threads(1);
  vrun ref = run_vocab(&cfg, &b, x, &v.vb, 0.5);
  EXPECT_OK(ref.st);
  batch p = batch_copy(&b);
  float *xp = restrict_draft(&b, &v);
  int64_t N = v.vb.n;
  int64_t bad_rows[] = {4, 3 * 7 + 1, 3 * 7 + 6};
  for (int i = 0; i < 3; i++) {
    int64_t r = bad_rows[i];
    p.ids[r] = i == 0 ? -1 : i == 1 ? (int32_t)b.V : -100;
    xp[r * N] = NAN, xp[r * N + 1] = INFINITY, p.target[r * b.V + 5] = NAN, p.conf[r] = -INFINITY;
  }
  for (int th = 1; th <= 3; th++) {
    ds_set_num_threads(th);
    ds_dspark_loss_config c2 = cfg;
    c2.chunk_rows = th == 2 ? 128 : th;
    vrun o = run_vocab(&c2, &p, xp, &v.vb, 0.5);
    EXPECT_OK(o.st);
    EXPECT(vruns_identical(&o, &ref, b.R, N, b.g));
    vrun_free(&o);
  }
  ds_set_num_threads(saved);
  free(x), free(xp);
  vrun_free(&ref);
  batch_free(&p);
  vocab_free(&v);
  batch_free(&b);
}

/* The teacher given as its S columns and per-row stats (what a trainer keeps per position)
 * gives the full rows' values and gradients bit for bit; a row without a finite value is
 * refused by the stats. */
static void test_stats_path(void) {
  batch b = batch_new(&g_rng, 6, 7, 257, 3);
  vocab v = vocab_new(b.V, 60);
  b.em[4] = 0, b.bk[3] = 0;
  int64_t N = v.vb.n, R = b.R;
  ds_dspark_loss_config cfg = cfg_with(1, 1);
  float *x = restrict_draft(&b, &v);
  uint8_t *sup = malloc((size_t)R);
  double *w = malloc((size_t)R * sizeof(double)), *out[2][4];
  float *ts = malloc((size_t)(R * N) * sizeof(float)), *gd[2], *gc[2];
  ds_dspark_teacher_stat *st = calloc((size_t)R, sizeof *st);
  uint8_t on[2][64];
  EXPECT_OK(ds_dspark_loss_weights(&cfg, b.nb, b.g, b.em, b.bk, sup, w));
  for (int64_t r = 0; r < R; r++) {
    for (int64_t j = 0; j < N; j++) ts[r * N + j] = b.target[r * b.V + v.ids[j]];
    if (sup[r]) EXPECT_OK(ds_dspark_teacher_stats(b.target + r * b.V, b.V, &v.vb, &st[r]));
  }
  for (int k = 0; k < 2; k++) {
    for (int i = 0; i < 4; i++) out[k][i] = malloc((size_t)R * sizeof(double));
    gd[k] = malloc((size_t)(R * N) * sizeof(float)), gc[k] = malloc((size_t)R * sizeof(float));
    ds_dspark_row_stats rows = {out[k][0], out[k][1], out[k][2], out[k][3], on[k]};
    ds_status s2 = k == 0 ? ds_dspark_loss_rows_vocab(&cfg, &v.vb, 0, b.g, R, b.V, x, b.target, b.ids, sup, w, b.conf,
                                                       0.3, &rows, gd[k], gc[k])
                          : ds_dspark_loss_rows_stats(&cfg, &v.vb, 0, b.g, R, b.V, x, ts, st, b.ids, sup, w, b.conf,
                                                       0.3, &rows, gd[k], gc[k]);
    EXPECT_OK(s2);
  }
  for (int i = 0; i < 4; i++) EXPECT(same_bits(out[0][i], out[1][i], (size_t)R * sizeof(double)));
  EXPECT(same_bits(on[0], on[1], (size_t)R));
  EXPECT(same_bits(gd[0], gd[1], (size_t)(R * N) * sizeof(float)) && same_bits(gc[0], gc[1], (size_t)R * sizeof(float)));
  b.target[7] = NAN;
  ds_dspark_teacher_stat bad;
  EXPECT(ds_dspark_teacher_stats(b.target, b.V, &v.vb, &bad) == DS_ERR_NUMERIC);
  for (int k = 0; k < 2; k++) {
    for (int i = 0; i < 4; i++) free(out[k][i]);
    free(gd[k]), free(gc[k]);
  }
  free(x), free(sup), free(w), free(ts), free(st);
  vocab_free(&v);
  batch_free(&b);
}

/* A vocabulary that is not strictly increasing, out of range, or whose index is not its
 * inverse is refused before anything is computed. */
static void test_bad_vocab(void) {
  batch b = batch_new(&g_rng, 1, 2, 12, 1);
  vocab v = vocab_new(b.V, 5);
  float *x = restrict_draft(&b, &v);
  ds_dspark_loss_config cfg = cfg_with(1, 1);
  EXPECT_OK(ds_dspark_vocab_check(&v.vb, b.V));
  int32_t keep = v.ids[2];
  v.ids[2] = v.ids[1]; /* not increasing */
  vrun o = run_vocab(&cfg, &b, x, &v.vb, 1.0);
  EXPECT(o.st == DS_ERR_ARG && strstr(ds_last_error(), "strictly increasing"));
  vrun_free(&o);
  v.ids[2] = keep;
  v.index[keep] = 0; /* not the inverse */
  EXPECT(ds_dspark_vocab_check(&v.vb, b.V) == DS_ERR_ARG);
  v.index[keep] = 2;
  ds_dspark_vocab big = {b.V + 1, v.ids, v.index};
  EXPECT(ds_dspark_vocab_check(&big, b.V) == DS_ERR_ARG);
  EXPECT(ds_dspark_vocab_check(&v.vb, v.ids[4]) == DS_ERR_ARG); /* an id outside [0, V) */
  free(x);
  vocab_free(&v);
  batch_free(&b);
}

int main(void) {
  ds_rng_seed(&g_rng, 20260802);
  TEST_RUN(test_matches_reference_and_fd);
  TEST_RUN(test_identity_is_unrestricted);
  TEST_RUN(test_outside_mass);
  TEST_RUN(test_poison_chunks_threads);
  TEST_RUN(test_stats_path);
  TEST_RUN(test_bad_vocab);
  return TEST_RESULT();
}
