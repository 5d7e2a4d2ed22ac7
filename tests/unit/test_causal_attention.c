/* The training causal attention (attention_causal_train and its backward) and the embedding
 * lookup with its backward, three ways, as tests/unit/test_backward.c checks the other kernels:
 *   1. against central finite differences of a double-precision forward written here (with a
 *      mask over every key of the batch, unlike the kernels' per-sequence key ranges), loss
 *      L = sum(dout * out);
 *   2. the cpu backend against the reference backend at 1, 2 and 3 threads (one part per
 *      (sequence, kv head), and the per-part buffers), with sequences longer than a query
 *      chunk, empty sequences, MHA / GQA / MQA;
 *   3. the contract: backward ADDS (twice = double), NULL skips a gradient, lse may be NULL in
 *      the forward, two runs are bitwise identical, and the forward equals the KV-cache causal
 *      attention the target uses.
 * The PyTorch autograd comparison is tests/conformance/test_kernels_torch.py (case "cattn"). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/backend.h"
#include "dspark/rng.h"
#include "test_util.h"

static ds_rng g_rng;

/* Tolerances as in test_backward.c (normwise, max |a - b| / max |b|): the reference kernels
 * accumulate in double (measured <= 1e-7 against FD), the cpu kernels in fp32. */
#define FD_TOL_REF 1e-6
#define FD_TOL_CPU 1e-5
#define SAME_TOL 1e-5
#define FD_H 1e-5

static float *rand_buf(size_t n, float scale) {
  float *p = malloc((n ? n : 1) * sizeof(float));
  for (size_t i = 0; i < n; i++) p[i] = (2.0f * ds_rng_uniform_f32(&g_rng) - 1.0f) * scale;
  return p;
}

static float *zeros(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

static float *dup_f(const float *x, size_t n) {
  float *p = malloc((n ? n : 1) * sizeof(float));
  memcpy(p, x, n * sizeof(float));
  return p;
}

static double rel_err_d(const float *a, const double *b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    num = fmax(num, fabs((double)a[i] - b[i]));
    den = fmax(den, fabs(b[i]));
  }
  return num / (den > 0 ? den : 1);
}

static void expect_err(double err, double tol, const char *what) {
  if (!(err <= tol)) {
    fprintf(stderr, "  %s: normwise relative error %.3g > %.3g\n", what, err, tol);
    g_test_failures++;
  } else if (getenv("DSPARK_TEST_VERBOSE")) {
    fprintf(stderr, "  %s: %.3g\n", what, err);
  }
}

static int all_finite(const float *x, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!isfinite(x[i])) return 0;
  return 1;
}

static const ds_backend *backend(int i) { return i == 0 ? ds_backend_cpu() : ds_backend_reference(); }

/* ---------------------------------------------------------------- one problem */

typedef struct {
  int64_t n_seqs, rows, nh, nkv, hd;
  int64_t seq_off[9];
  float scale;
  float *q, *k, *v, *dout;
} case_t;

static size_t nq_of(const case_t *c) { return (size_t)(c->rows * c->nh * c->hd); }
static size_t nk_of(const case_t *c) { return (size_t)(c->rows * c->nkv * c->hd); }
static size_t nl_of(const case_t *c) { return (size_t)(c->rows * c->nh); }

static case_t case_make(int n_seqs, const int64_t *lens, int64_t nh, int64_t nkv, int64_t hd, float amp) {
  case_t c = {n_seqs, 0, nh, nkv, hd, {0}, 1.0f / sqrtf((float)hd), NULL, NULL, NULL, NULL};
  for (int s = 0; s < n_seqs; s++) c.seq_off[s + 1] = c.seq_off[s] + lens[s];
  c.rows = c.seq_off[n_seqs];
  c.q = rand_buf(nq_of(&c), amp), c.k = rand_buf(nk_of(&c), amp), c.v = rand_buf(nk_of(&c), 1);
  c.dout = rand_buf(nq_of(&c), 1);
  return c;
}

static void case_free(case_t *c) { free(c->q); free(c->k); free(c->v); free(c->dout); }

typedef struct {
  float *out, *lse, *dq, *dk, *dv;
} res_t;

static res_t run(const ds_backend *be, const case_t *c) {
  res_t r = {zeros(nq_of(c)), zeros(nl_of(c)), zeros(nq_of(c)), zeros(nk_of(c)), zeros(nk_of(c))};
  be->attention_causal_train(r.out, r.lse, c->q, c->k, c->v, c->seq_off, c->n_seqs, c->nh, c->nkv, c->hd, c->scale);
  be->attention_causal_train_backward(r.dq, r.dk, r.dv, c->dout, r.out, r.lse, c->q, c->k, c->v, c->seq_off,
                                      c->n_seqs, c->nh, c->nkv, c->hd, c->scale);
  return r;
}

static void res_free(res_t *r) { free(r->out); free(r->lse); free(r->dq); free(r->dk); free(r->dv); }

/* ---------------------------------------------------------------- finite differences */

typedef struct {
  const case_t *c;
  double *q, *k, *v, *dout;
} dctx;

/* The double forward over a mask on ALL rows of the batch: key row u is visible to query row
 * i iff both lie in one sequence and u <= i. */
static void forward_d(const dctx *x, double *out, double *lse) {
  const case_t *c = x->c;
  int64_t kvs = c->nkv * c->hd, qs = c->nh * c->hd;
  double *s = malloc((size_t)(c->rows + 1) * sizeof(double));
  int64_t *seq_of = malloc((size_t)(c->rows + 1) * sizeof(int64_t));
  for (int64_t sq = 0; sq < c->n_seqs; sq++)
    for (int64_t r = c->seq_off[sq]; r < c->seq_off[sq + 1]; r++) seq_of[r] = sq;
  for (int64_t i = 0; i < c->rows; i++)
    for (int64_t h = 0; h < c->nh; h++) {
      int64_t kvh = h / (c->nh / c->nkv);
      double mx = -INFINITY, sum = 0;
      for (int64_t u = 0; u < c->rows; u++) {
        double dot = 0;
        for (int64_t e = 0; e < c->hd; e++) dot += x->q[i * qs + h * c->hd + e] * x->k[u * kvs + kvh * c->hd + e];
        s[u] = seq_of[u] == seq_of[i] && u <= i ? dot * c->scale : -INFINITY;
        mx = fmax(mx, s[u]);
      }
      for (int64_t u = 0; u < c->rows; u++) sum += (s[u] = exp(s[u] - mx));
      if (lse) lse[i * c->nh + h] = mx + log(sum);
      for (int64_t e = 0; e < c->hd; e++) {
        double o = 0;
        for (int64_t u = 0; u < c->rows; u++) o += s[u] / sum * x->v[u * kvs + kvh * c->hd + e];
        out[i * qs + h * c->hd + e] = o;
      }
    }
  free(s);
  free(seq_of);
}

static double loss_d(const dctx *x) {
  size_t nq = nq_of(x->c);
  double *out = malloc((nq ? nq : 1) * sizeof(double)), l = 0;
  forward_d(x, out, NULL);
  for (size_t j = 0; j < nq; j++) l += x->dout[j] * out[j];
  free(out);
  return l;
}

static double *to_double(const float *x, size_t n) {
  double *p = malloc((n ? n : 1) * sizeof(double));
  for (size_t i = 0; i < n; i++) p[i] = x[i];
  return p;
}

static void check_fd(const case_t *c, const char *label) {
  size_t nq = nq_of(c), nk = nk_of(c), nl = nl_of(c);
  dctx x = {c, to_double(c->q, nq), to_double(c->k, nk), to_double(c->v, nk), to_double(c->dout, nq)};
  double *out = malloc((nq ? nq : 1) * sizeof(double)), *lse = malloc((nl ? nl : 1) * sizeof(double));
  forward_d(&x, out, lse);
  double *params[3] = {x.q, x.k, x.v}, *fd[3];
  size_t sizes[3] = {nq, nk, nk};
  for (int p = 0; p < 3; p++) {
    fd[p] = malloc((sizes[p] ? sizes[p] : 1) * sizeof(double));
    for (size_t i = 0; i < sizes[p]; i++) {
      double keep = params[p][i];
      params[p][i] = keep + FD_H;
      double lp = loss_d(&x);
      params[p][i] = keep - FD_H;
      double lm = loss_d(&x);
      params[p][i] = keep;
      fd[p][i] = (lp - lm) / (2 * FD_H);
    }
  }
  static const char *names[3] = {"dq", "dk", "dv"};
  for (int b = 0; b < 2; b++) {
    res_t r = run(backend(b), c);
    double tol = b ? FD_TOL_REF : FD_TOL_CPU;
    char what[128];
    snprintf(what, sizeof what, "%s %s out vs double", label, backend(b)->name);
    expect_err(rel_err_d(r.out, out, nq), tol, what);
    int lse_ok = 1;
    for (size_t j = 0; j < nl; j++) lse_ok &= fabs(r.lse[j] - lse[j]) <= 1e-6 * fmax(1, fabs(lse[j]));
    if (!lse_ok) fprintf(stderr, "  %s %s: lse differs from the double forward\n", label, backend(b)->name);
    EXPECT(lse_ok);
    float *g[3] = {r.dq, r.dk, r.dv};
    for (int p = 0; p < 3; p++) {
      snprintf(what, sizeof what, "%s %s %s vs FD", label, backend(b)->name, names[p]);
      expect_err(rel_err_d(g[p], fd[p], sizes[p]), tol, what);
    }
    res_free(&r);
  }
  for (int p = 0; p < 3; p++) free(fd[p]);
  free(x.q); free(x.k); free(x.v); free(x.dout); free(out); free(lse);
}

static void test_fd(void) {
  int64_t l1[2] = {5, 3};
  case_t c = case_make(2, l1, 4, 2, 8, 1.5f); /* GQA 2, two sequences */
  check_fd(&c, "gqa2");
  case_free(&c);
  int64_t l2[1] = {7};
  c = case_make(1, l2, 3, 3, 4, 1.0f); /* MHA */
  check_fd(&c, "mha");
  case_free(&c);
  int64_t l3[3] = {4, 0, 6};
  c = case_make(3, l3, 6, 1, 4, 1.0f); /* MQA and an empty sequence */
  check_fd(&c, "mqa-empty");
  case_free(&c);
  int64_t l4[2] = {6, 2};
  c = case_make(2, l4, 2, 1, 8, 4.0f); /* sharp softmax */
  check_fd(&c, "sharp");
  case_free(&c);
  int64_t l5[2] = {70, 3};
  c = case_make(2, l5, 2, 1, 4, 1.0f); /* longer than a query chunk (64) */
  check_fd(&c, "two-chunks");
  case_free(&c);
}

/* ---------------------------------------------------------------- cpu vs reference */

static void check_same(const case_t *c, int threads, const char *label) {
  ds_set_num_threads(threads);
  res_t r0 = run(ds_backend_cpu(), c), r1 = run(ds_backend_reference(), c);
  const char *names[5] = {"out", "lse", "dq", "dk", "dv"};
  float *x0[5] = {r0.out, r0.lse, r0.dq, r0.dk, r0.dv}, *x1[5] = {r1.out, r1.lse, r1.dq, r1.dk, r1.dv};
  size_t n[5] = {nq_of(c), nl_of(c), nq_of(c), nk_of(c), nk_of(c)};
  char what[160];
  for (int p = 0; p < 5; p++) {
    snprintf(what, sizeof what, "%s (%d threads) %s cpu vs ref", label, threads, names[p]);
    expect_err(test_rel_err(x0[p], x1[p], n[p]), SAME_TOL, what);
    EXPECT(all_finite(x0[p], n[p]));
  }
  res_free(&r0);
  res_free(&r1);
}

static void test_same(void) {
  int64_t l1[5] = {150, 64, 1, 0, 97};
  case_t c = case_make(5, l1, 8, 2, 32, 1.0f);
  for (int t = 1; t <= 3; t++) check_same(&c, t, "batch");
  case_free(&c);
  int64_t l2[1] = {200};
  c = case_make(1, l2, 4, 1, 64, 1.0f); /* MQA, one sequence: parts on 2 and 3 threads */
  for (int t = 1; t <= 3; t++) check_same(&c, t, "mqa");
  case_free(&c);
  int64_t l3[2] = {65, 130};
  c = case_make(2, l3, 6, 3, 16, 2.0f);
  check_same(&c, 2, "kv3");
  case_free(&c);
  ds_set_num_threads(2);
}

/* ---------------------------------------------------------------- contract */

/* A second backward doubles; a single non-NULL gradient equals its share of the full call;
 * the forward without lse gives the same output. */
static void test_accumulate(void) {
  int64_t lens[3] = {80, 9, 33};
  case_t c = case_make(3, lens, 4, 2, 16, 1.0f);
  size_t n[3] = {nq_of(&c), nk_of(&c), nk_of(&c)};
  for (int b = 0; b < 2; b++)
    for (int threads = 1; threads <= 3; threads += 2) {
      ds_set_num_threads(threads);
      const ds_backend *be = backend(b);
      res_t r = run(be, &c);
      float *once[3] = {r.dq, r.dk, r.dv}, *twice[3];
      for (int p = 0; p < 3; p++) twice[p] = dup_f(once[p], n[p]);
      be->attention_causal_train_backward(twice[0], twice[1], twice[2], c.dout, r.out, r.lse, c.q, c.k, c.v,
                                          c.seq_off, c.n_seqs, c.nh, c.nkv, c.hd, c.scale);
      for (int p = 0; p < 3; p++) {
        float *want = dup_f(once[p], n[p]);
        for (size_t i = 0; i < n[p]; i++) want[i] *= 2.0f;
        expect_err(test_rel_err(twice[p], want, n[p]), 1e-6, "causal attention grad twice");
        free(want);
        float *alone[3] = {NULL, NULL, NULL};
        alone[p] = zeros(n[p]);
        be->attention_causal_train_backward(alone[0], alone[1], alone[2], c.dout, r.out, r.lse, c.q, c.k, c.v,
                                            c.seq_off, c.n_seqs, c.nh, c.nkv, c.hd, c.scale);
        expect_err(test_rel_err(alone[p], once[p], n[p]), 1e-6, "causal attention grad alone (others NULL)");
        free(alone[p]);
        free(twice[p]);
      }
      float *out2 = zeros(n[0]);
      be->attention_causal_train(out2, NULL, c.q, c.k, c.v, c.seq_off, c.n_seqs, c.nh, c.nkv, c.hd, c.scale);
      EXPECT(memcmp(out2, r.out, n[0] * sizeof(float)) == 0);
      free(out2);
      res_free(&r);
    }
  ds_set_num_threads(2);
  case_free(&c);
}

/* Same inputs, same thread count: bitwise identical outputs and gradients. */
static void test_determinism(void) {
  int64_t lens[3] = {190, 70, 5};
  case_t c = case_make(3, lens, 8, 2, 32, 1.0f);
  size_t n[5] = {nq_of(&c), nl_of(&c), nq_of(&c), nk_of(&c), nk_of(&c)};
  for (int threads = 2; threads <= 3; threads++) {
    ds_set_num_threads(threads);
    res_t r0 = run(ds_backend_cpu(), &c), r1 = run(ds_backend_cpu(), &c);
    float *x0[5] = {r0.out, r0.lse, r0.dq, r0.dk, r0.dv}, *x1[5] = {r1.out, r1.lse, r1.dq, r1.dk, r1.dv};
    for (int p = 0; p < 5; p++) EXPECT(memcmp(x0[p], x1[p], n[p] * sizeof(float)) == 0);
    res_free(&r0);
    res_free(&r1);
  }
  ds_set_num_threads(2);
  case_free(&c);
}

/* The forward of each sequence equals the KV-cache causal attention (the target's) over that
 * sequence alone, keys laid out [n_kv, cap, hd]. */
static void test_vs_kv_cache(void) {
  int64_t lens[2] = {90, 17}, nh = 6, nkv = 2, hd = 16;
  case_t c = case_make(2, lens, nh, nkv, hd, 1.0f);
  float *out = zeros(nq_of(&c));
  ds_backend_cpu()->attention_causal_train(out, NULL, c.q, c.k, c.v, c.seq_off, 2, nh, nkv, hd, c.scale);
  for (int s = 0; s < 2; s++) {
    int64_t L = lens[s], base = c.seq_off[s], qs = nh * hd, kvs = nkv * hd;
    float *kc = zeros((size_t)(nkv * L * hd)), *vc = zeros((size_t)(nkv * L * hd)), *ref = zeros((size_t)(L * qs));
    for (int64_t h = 0; h < nkv; h++)
      for (int64_t t = 0; t < L; t++) {
        memcpy(kc + (h * L + t) * hd, c.k + (base + t) * kvs + h * hd, (size_t)hd * sizeof(float));
        memcpy(vc + (h * L + t) * hd, c.v + (base + t) * kvs + h * hd, (size_t)hd * sizeof(float));
      }
    ds_backend_cpu()->attention_causal(ref, c.q + base * qs, qs, kc, vc, L, 0, L, nh, nkv, hd, c.scale);
    expect_err(test_rel_err(out + base * qs, ref, (size_t)(L * qs)), SAME_TOL, "train forward vs KV-cache attention");
    free(kc); free(vc); free(ref);
  }
  free(out);
  case_free(&c);
}

/* ---------------------------------------------------------------- embedding */

static void test_embedding(void) {
  int64_t V = 11, d = 70, n = 40; /* d spans two column chunks */
  float *table = rand_buf((size_t)(V * d), 1), *dout = rand_buf((size_t)(n * d), 1);
  int32_t ids[40];
  for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)(ds_rng_next_u64(&g_rng) % (uint64_t)V);
  ids[0] = ids[1] = ids[2] = 3; /* repeats */
  for (int b = 0; b < 2; b++) {
    float *out = zeros((size_t)(n * d));
    backend(b)->embedding(out, table, ids, n, d);
    int same = 1;
    for (int64_t i = 0; i < n; i++) same &= memcmp(out + i * d, table + ids[i] * d, (size_t)d * sizeof(float)) == 0;
    EXPECT(same);
    free(out);
  }
  /* backward: the cpu kernel equals the reference bit for bit at any thread count, skips
   * skip_id's row and adds onto what is there */
  for (int64_t skip = -1; skip <= 3; skip += 4) {
    float *start = rand_buf((size_t)(V * d), 1), *want = dup_f(start, (size_t)(V * d));
    ds_backend_reference()->embedding_backward(want, dout, ids, n, d, skip);
    for (int threads = 1; threads <= 3; threads++) {
      ds_set_num_threads(threads);
      float *got = dup_f(start, (size_t)(V * d));
      ds_backend_cpu()->embedding_backward(got, dout, ids, n, d, skip);
      EXPECT(memcmp(got, want, (size_t)(V * d) * sizeof(float)) == 0);
      free(got);
    }
    /* by hand: row r = start + sum of dout rows with id r (not for the skipped id) */
    int ok = 1;
    for (int64_t r = 0; r < V; r++)
      for (int64_t j = 0; j < d; j++) {
        double s = start[r * d + j];
        for (int64_t i = 0; i < n; i++)
          if (ids[i] == r && r != skip) s += dout[i * d + j];
        ok &= fabs(want[r * d + j] - s) <= 1e-5 * fmax(1, fabs(s));
      }
    EXPECT(ok);
    if (skip >= 0) EXPECT(memcmp(want + skip * d, start + skip * d, (size_t)d * sizeof(float)) == 0);
    free(start);
    free(want);
  }
  ds_set_num_threads(2);
  free(table);
  free(dout);
}

int main(void) {
  ds_rng_seed(&g_rng, 4321);
  ds_set_num_threads(2);
  TEST_RUN(test_fd);
  TEST_RUN(test_same);
  TEST_RUN(test_accumulate);
  TEST_RUN(test_determinism);
  TEST_RUN(test_vs_kv_cache);
  TEST_RUN(test_embedding);
  return TEST_RESULT();
}
