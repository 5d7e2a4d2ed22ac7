/* The training kernels (backward passes and the draft's block attention), three ways:
 *   1. against central finite differences of forwards written here in double precision
 *      (loss L = sum(dy * y) with random dy, so dL/dinput is exactly what backward returns);
 *   2. the optimized cpu backend against the reference backend, forward and backward, at
 *      several thread counts;
 *   3. the contract: backward ADDS into what it is given (twice = double, onto a non-zero
 *      buffer = sum), NULL skips a gradient, dropped blocks give exact zeros, and two runs
 *      give bitwise identical results.
 * The PyTorch autograd comparison is tests/conformance/test_kernels_torch.py, through
 * tests/tools/kernel_dump.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/backend.h"
#include "dspark/rng.h"
#include "dspark/safetensors.h"
#include "test_util.h"

static ds_rng g_rng;

/* Tolerances, normwise (max |a - b| / max |b|). The central differences of the double forward
 * are accurate to ~1e-10 (h = 1e-5), so what an analytic gradient may differ by is its own
 * rounding:
 *   FD_TOL_REF  reference kernels (double accumulation, one fp32 rounding at the end): < 1e-6
 *               (measured <= 8e-8);
 *   FD_TOL_CPU  cpu kernels (fp32 sums of up to a few hundred terms, amplified by sharp
 *               softmaxes): < 1e-5 (measured <= 1.1e-6 on the sharp attention case);
 *   SAME_TOL    cpu vs reference backend (measured <= 4e-7). */
#define FD_TOL_REF 1e-6
#define FD_TOL_CPU 1e-5
#define FD_TOL(k) ((k) ? FD_TOL_REF : FD_TOL_CPU) /* k: 0 cpu, 1 reference */
#define SAME_TOL 1e-5
#define FD_H 1e-5

/* ---------------------------------------------------------------- helpers */

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

static double *to_double(const float *x, size_t n) {
  double *p = malloc((n ? n : 1) * sizeof(double));
  for (size_t i = 0; i < n; i++) p[i] = x[i];
  return p;
}


/* The same against a double reference (finite differences). */
static double rel_err_d(const float *a, const double *b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    num = fmax(num, fabs((double)a[i] - b[i]));
    den = fmax(den, fabs(b[i]));
  }
  return num / (den > 0 ? den : 1);
}

/* Reports the error with a label when it exceeds tol. */
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

static int all_zero(const float *x, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (x[i] != 0.0f) return 0;
  return 1;
}

/* dst = 2 * src exactly? Used for "calling backward twice doubles the gradient". */
static double doubled_err(const float *twice, const float *once, size_t n) {
  float *want = dup_f(once, n);
  for (size_t i = 0; i < n; i++) want[i] *= 2.0f;
  double e = test_rel_err(twice, want, n);
  free(want);
  return e;
}

/* grad[i] = (L(p + h e_i) - L(p - h e_i)) / 2h, p perturbed in place and restored. */
typedef double (*loss_fn)(const void *ctx);
static void fd_grad(double *grad, double *p, size_t n, loss_fn loss, const void *ctx) {
  for (size_t i = 0; i < n; i++) {
    double keep = p[i];
    p[i] = keep + FD_H;
    double lp = loss(ctx);
    p[i] = keep - FD_H;
    double lm = loss(ctx);
    p[i] = keep;
    grad[i] = (lp - lm) / (2 * FD_H);
  }
}

static const ds_backend *backend(int i) { return i == 0 ? ds_backend_cpu() : ds_backend_reference(); }

/* ---------------------------------------------------------------- linear */

typedef struct {
  int64_t n, in, out;
  double *x, *w, *b, *dy; /* b may be NULL */
} lin_ctx;

/* sum(dy * (x w^T + b)) in double. */
static double lin_loss(const void *vc) {
  const lin_ctx *c = vc;
  double l = 0;
  for (int64_t i = 0; i < c->n; i++)
    for (int64_t o = 0; o < c->out; o++) {
      double y = c->b ? c->b[o] : 0.0;
      for (int64_t p = 0; p < c->in; p++) y += c->x[i * c->in + p] * c->w[o * c->in + p];
      l += c->dy[i * c->out + o] * y;
    }
  return l;
}

static void test_linear_backward(void) {
  int64_t shapes[][3] = {{1, 24, 10}, {7, 33, 17}, {70, 64, 40}};
  for (int s = 0; s < 3; s++) {
    int64_t n = shapes[s][0], in = shapes[s][1], out = shapes[s][2];
    size_t nx = (size_t)(n * in), nw = (size_t)(out * in), ny = (size_t)(n * out), nb = (size_t)out;
    float *x = rand_buf(nx, 1), *w = rand_buf(nw, 1), *b = rand_buf(nb, 1), *dy = rand_buf(ny, 1);
    float *g[2][3];
    for (int k = 0; k < 2; k++) {
      g[k][0] = zeros(nx), g[k][1] = zeros(nw), g[k][2] = zeros(nb);
      backend(k)->linear_backward(g[k][0], g[k][1], g[k][2], dy, x, w, n, in, out);
    }
    /* Finite differences of the double forward (run for the two smaller shapes). */
    if (s < 2) {
      lin_ctx c = {n, in, out, to_double(x, nx), to_double(w, nw), to_double(b, nb), to_double(dy, ny)};
      double *fx = malloc(nx * sizeof(double)), *fw = malloc(nw * sizeof(double)), *fb = malloc(nb * sizeof(double));
      fd_grad(fx, c.x, nx, lin_loss, &c);
      fd_grad(fw, c.w, nw, lin_loss, &c);
      fd_grad(fb, c.b, nb, lin_loss, &c);
      for (int k = 0; k < 2; k++) {
        expect_err(rel_err_d(g[k][0], fx, nx), FD_TOL(k), k ? "ref dx vs FD" : "cpu dx vs FD");
        expect_err(rel_err_d(g[k][1], fw, nw), FD_TOL(k), k ? "ref dw vs FD" : "cpu dw vs FD");
        expect_err(rel_err_d(g[k][2], fb, nb), FD_TOL(k), k ? "ref db vs FD" : "cpu db vs FD");
      }
      free(c.x); free(c.w); free(c.b); free(c.dy); free(fx); free(fw); free(fb);
    }
    expect_err(test_rel_err(g[0][0], g[1][0], nx), SAME_TOL, "linear dx cpu vs ref");
    expect_err(test_rel_err(g[0][1], g[1][1], nw), SAME_TOL, "linear dw cpu vs ref");
    expect_err(test_rel_err(g[0][2], g[1][2], nb), SAME_TOL, "linear db cpu vs ref");
    /* Accumulation: a second call doubles; a non-zero start is added to; NULL skips. */
    for (int k = 0; k < 2; k++) {
      float *dx2 = dup_f(g[k][0], nx), *dw2 = dup_f(g[k][1], nw), *db2 = dup_f(g[k][2], nb);
      backend(k)->linear_backward(dx2, dw2, db2, dy, x, w, n, in, out);
      expect_err(doubled_err(dx2, g[k][0], nx), 1e-6, "linear dx twice");
      expect_err(doubled_err(dw2, g[k][1], nw), 1e-6, "linear dw twice");
      expect_err(doubled_err(db2, g[k][2], nb), 1e-6, "linear db twice");
      float *only_dw = zeros(nw), *start = rand_buf(nb, 1), *db_start = dup_f(start, nb);
      backend(k)->linear_backward(NULL, only_dw, NULL, dy, x, w, n, in, out);
      expect_err(test_rel_err(only_dw, g[k][1], nw), 1e-6, "linear dw alone (dx, db NULL)");
      backend(k)->linear_backward(NULL, NULL, db_start, dy, x, w, n, in, out);
      for (size_t i = 0; i < nb; i++) start[i] += g[k][2][i];
      expect_err(test_rel_err(db_start, start, nb), 1e-6, "linear db onto a non-zero buffer");
      free(dx2); free(dw2); free(db2); free(only_dw); free(start); free(db_start);
    }
    for (int k = 0; k < 2; k++) free(g[k][0]), free(g[k][1]), free(g[k][2]);
    free(x); free(w); free(b); free(dy);
  }
}

/* ---------------------------------------------------------------- rmsnorm */

typedef struct {
  int64_t n, d;
  double eps, *x, *w, *dy;
} rms_ctx;

/* sum(dy * w * x / sqrt(mean(x^2) + eps)) in double. */
static double rms_loss(const void *vc) {
  const rms_ctx *c = vc;
  double l = 0;
  for (int64_t i = 0; i < c->n; i++) {
    double ss = 0;
    for (int64_t j = 0; j < c->d; j++) ss += c->x[i * c->d + j] * c->x[i * c->d + j];
    double r = 1.0 / sqrt(ss / (double)c->d + c->eps);
    for (int64_t j = 0; j < c->d; j++) l += c->dy[i * c->d + j] * c->w[j] * c->x[i * c->d + j] * r;
  }
  return l;
}

static void test_rmsnorm_backward(void) {
  int64_t shapes[][2] = {{1, 16}, {9, 80}, {40, 300}};
  float eps = 1e-6f;
  for (int s = 0; s < 3; s++) {
    int64_t n = shapes[s][0], d = shapes[s][1];
    size_t nx = (size_t)(n * d);
    float *x = rand_buf(nx, 3), *w = rand_buf((size_t)d, 1), *dy = rand_buf(nx, 1);
    float *y = zeros(nx), *rstd[2], *dx[2], *dw[2];
    for (int k = 0; k < 2; k++) {
      rstd[k] = zeros((size_t)n), dx[k] = zeros(nx), dw[k] = zeros((size_t)d);
      backend(k)->rmsnorm(y, rstd[k], x, w, n, d, eps);
      backend(k)->rmsnorm_backward(dx[k], dw[k], dy, x, w, rstd[k], n, d);
    }
    if (s < 2) {
      rms_ctx c = {n, d, eps, to_double(x, nx), to_double(w, (size_t)d), to_double(dy, nx)};
      double *fx = malloc(nx * sizeof(double)), *fw = malloc((size_t)d * sizeof(double));
      fd_grad(fx, c.x, nx, rms_loss, &c);
      fd_grad(fw, c.w, (size_t)d, rms_loss, &c);
      for (int k = 0; k < 2; k++) {
        expect_err(rel_err_d(dx[k], fx, nx), FD_TOL(k), k ? "ref rmsnorm dx vs FD" : "cpu rmsnorm dx vs FD");
        expect_err(rel_err_d(dw[k], fw, (size_t)d), FD_TOL(k), k ? "ref rmsnorm dw vs FD" : "cpu rmsnorm dw vs FD");
      }
      free(c.x); free(c.w); free(c.dy); free(fx); free(fw);
    }
    expect_err(test_rel_err(dx[0], dx[1], nx), SAME_TOL, "rmsnorm dx cpu vs ref");
    expect_err(test_rel_err(dw[0], dw[1], (size_t)d), SAME_TOL, "rmsnorm dw cpu vs ref");
    for (int k = 0; k < 2; k++) {
      float *dx2 = dup_f(dx[k], nx), *dw2 = dup_f(dw[k], (size_t)d), *dx_only = zeros(nx);
      backend(k)->rmsnorm_backward(dx2, dw2, dy, x, w, rstd[k], n, d);
      expect_err(doubled_err(dx2, dx[k], nx), 1e-6, "rmsnorm dx twice");
      expect_err(doubled_err(dw2, dw[k], (size_t)d), 1e-6, "rmsnorm dw twice");
      backend(k)->rmsnorm_backward(dx_only, NULL, dy, x, w, rstd[k], n, d);
      expect_err(test_rel_err(dx_only, dx[k], nx), 1e-6, "rmsnorm dx alone (dw NULL)");
      free(dx2); free(dw2); free(dx_only);
      free(rstd[k]); free(dx[k]); free(dw[k]);
    }
    free(x); free(w); free(dy); free(y);
  }
}

/* ---------------------------------------------------------------- rope */

typedef struct {
  int64_t n, stride, heads, hd;
  const int64_t *pos;
  const float *inv_freq;
  double *x, *dy;
} rope_ctx;

/* sum(dy * rope(x)) in double, angle = fp32(pos * inv_freq) as the kernels define it. */
static double rope_loss(const void *vc) {
  const rope_ctx *c = vc;
  int64_t half = c->hd / 2;
  double l = 0;
  for (int64_t t = 0; t < c->n; t++)
    for (int64_t j = 0; j < c->stride; j++) {
      const double *xt = c->x + t * c->stride, *dyt = c->dy + t * c->stride;
      double y = xt[j];
      if (j < c->heads * c->hd) {
        int64_t e = j % c->hd, i = e % half;
        double ang = (double)((float)c->pos[t] * c->inv_freq[i]);
        const double *v = xt + (j - e);
        y = e < half ? v[i] * cos(ang) - v[i + half] * sin(ang) : v[i + half] * cos(ang) + v[i] * sin(ang);
      }
      l += dyt[j] * y;
    }
  return l;
}

static void test_rope_backward(void) {
  int64_t n = 6, heads = 3, hd = 16, stride = 56; /* 8 padding columns per row */
  size_t nx = (size_t)(n * stride);
  int64_t pos[6] = {0, 1, 7, 100, 511, 4000};
  float inv[8];
  for (int i = 0; i < 8; i++) inv[i] = 1.0f / powf(10000.0f, (float)(2 * i) / 16.0f);
  float *x = rand_buf(nx, 1), *dy = rand_buf(nx, 1), *dx[2];
  rope_ctx c = {n, stride, heads, hd, pos, inv, to_double(x, nx), to_double(dy, nx)};
  double *fx = malloc(nx * sizeof(double));
  fd_grad(fx, c.x, nx, rope_loss, &c);
  for (int k = 0; k < 2; k++) {
    dx[k] = dup_f(dy, nx); /* in place: the gradient buffer is rotated back */
    backend(k)->rope_backward(dx[k], stride, pos, inv, n, heads, hd);
    expect_err(rel_err_d(dx[k], fx, nx), FD_TOL(k), k ? "ref rope dx vs FD" : "cpu rope dx vs FD");
    /* padding columns are not touched */
    int same = 1;
    for (int64_t t = 0; t < n; t++)
      for (int64_t j = heads * hd; j < stride; j++) same &= dx[k][t * stride + j] == dy[t * stride + j];
    EXPECT(same);
    /* rope is orthogonal: backward(forward(x)) == x */
    float *r = dup_f(x, nx);
    backend(k)->rope(r, stride, pos, inv, n, heads, hd);
    backend(k)->rope_backward(r, stride, pos, inv, n, heads, hd);
    expect_err(test_rel_err(r, x, nx), 1e-6, "rope round trip");
    free(r);
  }
  expect_err(test_rel_err(dx[0], dx[1], nx), SAME_TOL, "rope dx cpu vs ref");
  free(dx[0]); free(dx[1]); free(x); free(dy); free(c.x); free(c.dy); free(fx);
}

/* ---------------------------------------------------------------- swiglu */

typedef struct {
  int64_t n, inter;
  double *gu, *dout;
} swiglu_ctx;

static double swiglu_loss(const void *vc) {
  const swiglu_ctx *c = vc;
  double l = 0;
  for (int64_t i = 0; i < c->n; i++)
    for (int64_t j = 0; j < c->inter; j++) {
      double g = c->gu[i * 2 * c->inter + j], u = c->gu[i * 2 * c->inter + c->inter + j];
      l += c->dout[i * c->inter + j] * g / (1.0 + exp(-g)) * u;
    }
  return l;
}

static void test_swiglu_backward(void) {
  int64_t n = 5, inter = 37;
  size_t ngu = (size_t)(n * 2 * inter), no = (size_t)(n * inter);
  float *gu = rand_buf(ngu, 6), *dout = rand_buf(no, 1), *dgu[2];
  gu[0] = 40.0f, gu[1] = -40.0f; /* saturated sigmoid both ways */
  swiglu_ctx c = {n, inter, to_double(gu, ngu), to_double(dout, no)};
  double *fg = malloc(ngu * sizeof(double));
  fd_grad(fg, c.gu, ngu, swiglu_loss, &c);
  for (int k = 0; k < 2; k++) {
    dgu[k] = zeros(ngu);
    backend(k)->swiglu_backward(dgu[k], dout, gu, n, inter);
    expect_err(rel_err_d(dgu[k], fg, ngu), FD_TOL(k), k ? "ref swiglu dgu vs FD" : "cpu swiglu dgu vs FD");
    EXPECT(all_finite(dgu[k], ngu));
    float *twice = dup_f(dgu[k], ngu);
    backend(k)->swiglu_backward(twice, dout, gu, n, inter);
    expect_err(doubled_err(twice, dgu[k], ngu), 1e-6, "swiglu dgu twice");
    free(twice);
  }
  expect_err(test_rel_err(dgu[0], dgu[1], ngu), SAME_TOL, "swiglu dgu cpu vs ref");
  free(dgu[0]); free(dgu[1]); free(gu); free(dout); free(c.gu); free(c.dout); free(fg);
}

/* ---------------------------------------------------------------- block attention */

/* One problem: shapes, ctx_len and inputs (fp32), gradient of the output dout. */
typedef struct {
  int64_t n_ctx, n_blocks, g, n_heads, n_kv, hd;
  float scale;
  int64_t *ctx_len;
  float *q, *kc, *vc, *kb, *vb, *dout;
} attn_case;

static size_t nq_of(const attn_case *a) { return (size_t)(a->n_blocks * a->g * a->n_heads * a->hd); }
static size_t nc_of(const attn_case *a) { return (size_t)(a->n_ctx * a->n_kv * a->hd); }
static size_t nb_of(const attn_case *a) { return (size_t)(a->n_blocks * a->g * a->n_kv * a->hd); }

static attn_case attn_make(int64_t n_ctx, int64_t n_blocks, int64_t g, int64_t n_heads, int64_t n_kv, int64_t hd,
                           const int64_t *ctx_len, float amp) {
  attn_case a = {n_ctx, n_blocks, g, n_heads, n_kv, hd, 1.0f / sqrtf((float)hd), NULL, NULL, NULL, NULL, NULL, NULL,
                 NULL};
  a.ctx_len = malloc((size_t)n_blocks * sizeof(int64_t));
  for (int64_t b = 0; b < n_blocks; b++)
    a.ctx_len[b] = ctx_len ? ctx_len[b] : (int64_t)(ds_rng_next_u64(&g_rng) % (uint64_t)(n_ctx + 2)) - 1;
  a.q = rand_buf(nq_of(&a), amp), a.kc = rand_buf(nc_of(&a), amp), a.vc = rand_buf(nc_of(&a), 1);
  a.kb = rand_buf(nb_of(&a), amp), a.vb = rand_buf(nb_of(&a), 1), a.dout = rand_buf(nq_of(&a), 1);
  return a;
}

static void attn_free(attn_case *a) {
  free(a->ctx_len); free(a->q); free(a->kc); free(a->vc); free(a->kb); free(a->vb); free(a->dout);
}

/* Results of one backend: out, lse and the five gradients. */
typedef struct {
  float *out, *lse, *dq, *dkc, *dvc, *dkb, *dvb;
} attn_res;

static attn_res attn_run(const ds_backend *be, const attn_case *a) {
  attn_res r = {zeros(nq_of(a)), zeros((size_t)(a->n_blocks * a->g * a->n_heads)), zeros(nq_of(a)),
                zeros(nc_of(a)), zeros(nc_of(a)), zeros(nb_of(a)), zeros(nb_of(a))};
  be->block_attention(r.out, r.lse, a->q, a->kc, a->vc, a->kb, a->vb, a->ctx_len, a->n_ctx, a->n_blocks, a->g,
                      a->n_heads, a->n_kv, a->hd, a->scale);
  be->block_attention_backward(r.dq, r.dkc, r.dvc, r.dkb, r.dvb, a->dout, r.out, r.lse, a->q, a->kc, a->vc, a->kb,
                               a->vb, a->ctx_len, a->n_ctx, a->n_blocks, a->g, a->n_heads, a->n_kv, a->hd, a->scale);
  return r;
}

static void res_free(attn_res *r) {
  free(r->out); free(r->lse); free(r->dq); free(r->dkc); free(r->dvc); free(r->dkb); free(r->dvb);
}

/* The double-precision forward of the FD check, written with a mask over all n_ctx + g keys
 * (key t < n_ctx is context row t, else block row t - n_ctx), unlike the kernels' key lists. */
typedef struct {
  const attn_case *a;
  double *q, *kc, *vc, *kb, *vb, *dout;
} attn_ctx;

static void attn_forward_d(const attn_ctx *c, double *out, double *lse) {
  const attn_case *a = c->a;
  int64_t T = a->n_ctx + a->g, kvs = a->n_kv * a->hd, qs = a->n_heads * a->hd;
  double *s = malloc((size_t)T * sizeof(double));
  for (int64_t b = 0; b < a->n_blocks; b++)
    for (int64_t i = 0; i < a->g; i++)
      for (int64_t h = 0; h < a->n_heads; h++) {
        int64_t row = b * a->g + i, kvh = h / (a->n_heads / a->n_kv), L = a->ctx_len[b];
        double mx = -INFINITY, sum = 0;
        for (int64_t t = 0; t < T; t++) {
          int visible = L >= 0 && (t < L || t >= a->n_ctx);
          const double *k = t < a->n_ctx ? c->kc + t * kvs : c->kb + (b * a->g + t - a->n_ctx) * kvs;
          double dot = 0;
          for (int64_t e = 0; e < a->hd; e++) dot += c->q[row * qs + h * a->hd + e] * k[kvh * a->hd + e];
          s[t] = visible ? dot * a->scale : -INFINITY;
          mx = fmax(mx, s[t]);
        }
        for (int64_t t = 0; t < T && mx > -INFINITY; t++) sum += (s[t] = exp(s[t] - mx));
        if (lse) lse[row * a->n_heads + h] = mx > -INFINITY ? mx + log(sum) : -INFINITY;
        for (int64_t e = 0; e < a->hd; e++) {
          double o = 0;
          for (int64_t t = 0; t < T && mx > -INFINITY; t++) {
            const double *v = t < a->n_ctx ? c->vc + t * kvs : c->vb + (b * a->g + t - a->n_ctx) * kvs;
            o += s[t] / sum * v[kvh * a->hd + e];
          }
          out[row * qs + h * a->hd + e] = o;
        }
      }
  free(s);
}

static double attn_loss(const void *vc) {
  const attn_ctx *c = vc;
  size_t nq = nq_of(c->a);
  double *out = malloc(nq * sizeof(double)), l = 0;
  attn_forward_d(c, out, NULL);
  for (size_t j = 0; j < nq; j++) l += c->dout[j] * out[j];
  free(out);
  return l;
}

/* Forward, lse and all five gradients of both backends against the double forward and its
 * finite differences. */
static void attn_check_fd(const attn_case *a, const char *label) {
  size_t nq = nq_of(a), nc = nc_of(a), nb = nb_of(a), nl = (size_t)(a->n_blocks * a->g * a->n_heads);
  attn_ctx c = {a, to_double(a->q, nq), to_double(a->kc, nc), to_double(a->vc, nc), to_double(a->kb, nb),
                to_double(a->vb, nb), to_double(a->dout, nq)};
  double *out = malloc(nq * sizeof(double)), *lse = malloc(nl * sizeof(double));
  attn_forward_d(&c, out, lse);
  double *f[5];
  double *params[5] = {c.q, c.kc, c.vc, c.kb, c.vb};
  size_t sizes[5] = {nq, nc, nc, nb, nb};
  for (int p = 0; p < 5; p++) {
    f[p] = malloc((sizes[p] ? sizes[p] : 1) * sizeof(double));
    fd_grad(f[p], params[p], sizes[p], attn_loss, &c);
  }
  static const char *names[5] = {"dq", "dk_ctx", "dv_ctx", "dk_blk", "dv_blk"};
  for (int k = 0; k < 2; k++) {
    attn_res r = attn_run(backend(k), a);
    char what[128];
    snprintf(what, sizeof what, "%s %s out vs double", label, backend(k)->name);
    expect_err(rel_err_d(r.out, out, nq), FD_TOL(k), what);
    /* lse: finite rows compared, dropped rows exactly -inf */
    int lse_ok = 1;
    for (size_t j = 0; j < nl; j++)
      lse_ok &= isinf(lse[j]) ? (isinf(r.lse[j]) && r.lse[j] < 0)
                              : fabs(r.lse[j] - lse[j]) <= 1e-6 * fmax(1, fabs(lse[j]));
    if (!lse_ok) fprintf(stderr, "  %s %s: lse differs from the double forward\n", label, backend(k)->name);
    EXPECT(lse_ok);
    float *g[5] = {r.dq, r.dkc, r.dvc, r.dkb, r.dvb};
    for (int p = 0; p < 5; p++) {
      snprintf(what, sizeof what, "%s %s %s vs FD", label, backend(k)->name, names[p]);
      expect_err(rel_err_d(g[p], f[p], sizes[p]), FD_TOL(k), what);
    }
    res_free(&r);
  }
  for (int p = 0; p < 5; p++) free(f[p]), free(params[p]);
  free(c.dout); free(out); free(lse);
}

/* cpu vs reference: forward, lse and gradients; at the given thread count. */
static void attn_check_same(const attn_case *a, int threads, const char *label) {
  size_t nq = nq_of(a), nc = nc_of(a), nb = nb_of(a), nl = (size_t)(a->n_blocks * a->g * a->n_heads);
  ds_set_num_threads(threads);
  attn_res r0 = attn_run(ds_backend_cpu(), a), r1 = attn_run(ds_backend_reference(), a);
  char what[160];
  const char *names[7] = {"out", "lse", "dq", "dk_ctx", "dv_ctx", "dk_blk", "dv_blk"};
  float *x0[7] = {r0.out, r0.lse, r0.dq, r0.dkc, r0.dvc, r0.dkb, r0.dvb};
  float *x1[7] = {r1.out, r1.lse, r1.dq, r1.dkc, r1.dvc, r1.dkb, r1.dvb};
  size_t n[7] = {nq, nl, nq, nc, nc, nb, nb};
  for (int p = 0; p < 7; p++) {
    if (p == 1) { /* lse: -inf rows must match exactly, the others closely */
      int ok = 1;
      for (size_t j = 0; j < nl; j++)
        ok &= isinf(x1[p][j]) ? x0[p][j] == x1[p][j] : fabsf(x0[p][j] - x1[p][j]) <= 1e-5f * fmaxf(1, fabsf(x1[p][j]));
      EXPECT(ok);
      continue;
    }
    snprintf(what, sizeof what, "%s (%d threads) %s cpu vs ref", label, threads, names[p]);
    expect_err(test_rel_err(x0[p], x1[p], n[p]), SAME_TOL, what);
    EXPECT(all_finite(x0[p], n[p]));
  }
  res_free(&r0);
  res_free(&r1);
}

static void test_block_attention_fd(void) {
  /* ctx_len 0 (own block only), a dropped block, the full context, partial contexts; GQA 2. */
  int64_t cl[5] = {0, 4, -1, 9, 2};
  attn_case a = attn_make(9, 5, 3, 4, 2, 8, cl, 1.5f);
  attn_check_fd(&a, "gqa2");
  attn_free(&a);
  /* no GQA (group 1) and all heads on one kv head (group 6), random contexts */
  int64_t cl2[3] = {3, 0, 5};
  a = attn_make(6, 3, 2, 3, 3, 4, cl2, 1.0f);
  attn_check_fd(&a, "mha");
  attn_free(&a);
  a = attn_make(6, 3, 2, 6, 1, 4, cl2, 1.0f);
  attn_check_fd(&a, "mqa");
  attn_free(&a);
  /* decode: every block sees the whole context */
  int64_t cl3[2] = {7, 7};
  a = attn_make(7, 2, 4, 4, 2, 8, cl3, 1.0f);
  attn_check_fd(&a, "decode");
  attn_free(&a);
  /* sharp softmax (large scores): stability of the max subtraction and of lse */
  int64_t cl4[2] = {5, 1};
  a = attn_make(5, 2, 3, 2, 1, 8, cl4, 4.0f);
  attn_check_fd(&a, "sharp");
  attn_free(&a);
}

static void test_block_attention_same(void) {
  /* Training shapes: g = 7, head_dim 64, GQA 4, random context lengths (some dropped), at
   * thread counts that use one part per kv head (1, 2) and per-part buffers (3). */
  attn_case a = attn_make(150, 20, 7, 8, 2, 64, NULL, 1.0f);
  a.ctx_len[0] = -1, a.ctx_len[1] = 0, a.ctx_len[2] = 150;
  for (int t = 1; t <= 3; t++) attn_check_same(&a, t, "train");
  attn_free(&a);
  /* 3 kv heads on 2 threads (parts), and decode with every block seeing all the context. */
  a = attn_make(40, 9, 5, 6, 3, 16, NULL, 1.0f);
  attn_check_same(&a, 2, "kv3");
  attn_free(&a);
  int64_t full[4] = {33, 33, 33, 33};
  a = attn_make(33, 4, 7, 4, 1, 32, full, 1.0f);
  attn_check_same(&a, 2, "decode");
  attn_free(&a);
  ds_set_num_threads(2);
}

/* Dropped blocks: exactly zero output, -inf lse, exactly zero gradients, never NaN; when every
 * block is dropped, the context gradients stay exactly zero too. */
static void test_block_attention_dropped(void) {
  for (int k = 0; k < 2; k++) {
    int64_t cl[4] = {-1, 5, -1, 0};
    attn_case a = attn_make(8, 4, 3, 4, 2, 8, cl, 1.0f);
    attn_res r = attn_run(backend(k), &a);
    size_t row_q = (size_t)(a.g * a.n_heads * a.hd), row_kv = (size_t)(a.g * a.n_kv * a.hd);
    size_t row_l = (size_t)(a.g * a.n_heads);
    for (int64_t b = 0; b < 4; b += 2) { /* blocks 0 and 2 */
      EXPECT(all_zero(r.out + (size_t)b * row_q, row_q));
      EXPECT(all_zero(r.dq + (size_t)b * row_q, row_q));
      EXPECT(all_zero(r.dkb + (size_t)b * row_kv, row_kv));
      EXPECT(all_zero(r.dvb + (size_t)b * row_kv, row_kv));
      int neg_inf = 1;
      for (size_t j = 0; j < row_l; j++) {
        float l = r.lse[(size_t)b * row_l + j];
        neg_inf &= isinf(l) && l < 0;
      }
      EXPECT(neg_inf);
    }
    EXPECT(all_finite(r.out, nq_of(&a)) && all_finite(r.dq, nq_of(&a)) && all_finite(r.dkc, nc_of(&a)));
    EXPECT(!all_zero(r.out + row_q, row_q)); /* block 1 is live */
    /* rows 5.. of the context are seen by no block */
    EXPECT(all_zero(r.dkc + 5 * a.n_kv * a.hd, (size_t)(3 * a.n_kv * a.hd)));
    res_free(&r);
    for (int64_t b = 0; b < 4; b++) a.ctx_len[b] = -1;
    r = attn_run(backend(k), &a);
    EXPECT(all_zero(r.out, nq_of(&a)) && all_zero(r.dq, nq_of(&a)) && all_zero(r.dkc, nc_of(&a)) &&
           all_zero(r.dvc, nc_of(&a)) && all_zero(r.dkb, nb_of(&a)) && all_zero(r.dvb, nb_of(&a)));
    res_free(&r);
    attn_free(&a);
  }
}

/* Accumulation and NULL: a second backward doubles every gradient; with a single non-NULL
 * gradient the others are skipped and that one is unchanged. */
static void test_block_attention_accumulate(void) {
  attn_case a = attn_make(30, 6, 4, 4, 2, 16, NULL, 1.0f);
  a.ctx_len[0] = -1, a.ctx_len[1] = 0;
  size_t n[5] = {nq_of(&a), nc_of(&a), nc_of(&a), nb_of(&a), nb_of(&a)};
  for (int k = 0; k < 2; k++)
    for (int threads = 1; threads <= 3; threads += 2) {
      ds_set_num_threads(threads);
      const ds_backend *be = backend(k);
      attn_res r = attn_run(be, &a);
      float *once[5] = {r.dq, r.dkc, r.dvc, r.dkb, r.dvb}, *twice[5];
      for (int p = 0; p < 5; p++) twice[p] = dup_f(once[p], n[p]);
      be->block_attention_backward(twice[0], twice[1], twice[2], twice[3], twice[4], a.dout, r.out, r.lse, a.q, a.kc,
                                   a.vc, a.kb, a.vb, a.ctx_len, a.n_ctx, a.n_blocks, a.g, a.n_heads, a.n_kv, a.hd,
                                   a.scale);
      for (int p = 0; p < 5; p++) expect_err(doubled_err(twice[p], once[p], n[p]), 1e-6, "attention grad twice");
      for (int p = 0; p < 5; p++) {
        float *alone[5] = {NULL, NULL, NULL, NULL, NULL};
        alone[p] = zeros(n[p]);
        be->block_attention_backward(alone[0], alone[1], alone[2], alone[3], alone[4], a.dout, r.out, r.lse, a.q,
                                     a.kc, a.vc, a.kb, a.vb, a.ctx_len, a.n_ctx, a.n_blocks, a.g, a.n_heads, a.n_kv,
                                     a.hd, a.scale);
        expect_err(test_rel_err(alone[p], once[p], n[p]), 1e-6, "attention grad alone (others NULL)");
        free(alone[p]);
      }
      /* lse NULL is allowed in the forward (inference) and gives the same output */
      float *out2 = zeros(n[0]);
      be->block_attention(out2, NULL, a.q, a.kc, a.vc, a.kb, a.vb, a.ctx_len, a.n_ctx, a.n_blocks, a.g, a.n_heads,
                          a.n_kv, a.hd, a.scale);
      EXPECT(memcmp(out2, r.out, n[0] * sizeof(float)) == 0);
      free(out2);
      for (int p = 0; p < 5; p++) free(twice[p]);
      res_free(&r);
    }
  ds_set_num_threads(2);
  attn_free(&a);
}

/* The last slot of a block sees exactly what a causal query at position ctx_len + g - 1 sees:
 * the forward must agree with attention_causal over a KV cache holding [context ; block]. */
static void test_block_attention_vs_causal(void) {
  int64_t cl[3] = {11, 0, 4}, n_ctx = 11, g = 5, hq = 6, hkv = 2, hd = 16;
  attn_case a = attn_make(n_ctx, 3, g, hq, hkv, hd, cl, 1.0f);
  float *out = zeros(nq_of(&a));
  ds_backend_cpu()->block_attention(out, NULL, a.q, a.kc, a.vc, a.kb, a.vb, a.ctx_len, n_ctx, 3, g, hq, hkv, hd,
                                    a.scale);
  for (int64_t b = 0; b < 3; b++) {
    int64_t L = cl[b], cap = L + g, qs = hq * hd;
    float *kcache = zeros((size_t)(hkv * cap * hd)), *vcache = zeros((size_t)(hkv * cap * hd));
    for (int64_t h = 0; h < hkv; h++)
      for (int64_t t = 0; t < cap; t++) {
        const float *ks = t < L ? a.kc + t * hkv * hd : a.kb + (b * g + t - L) * hkv * hd;
        const float *vs = t < L ? a.vc + t * hkv * hd : a.vb + (b * g + t - L) * hkv * hd;
        memcpy(kcache + (h * cap + t) * hd, ks + h * hd, (size_t)hd * sizeof(float));
        memcpy(vcache + (h * cap + t) * hd, vs + h * hd, (size_t)hd * sizeof(float));
      }
    float *causal = zeros((size_t)(g * qs));
    ds_backend_reference()->attention_causal(causal, a.q + b * g * qs, qs, kcache, vcache, g, L, cap, hq, hkv, hd,
                                             a.scale);
    expect_err(test_rel_err(out + (b * g + g - 1) * qs, causal + (g - 1) * qs, (size_t)qs), SAME_TOL,
               "block attention last slot vs attention_causal");
    free(kcache); free(vcache); free(causal);
  }
  free(out);
  attn_free(&a);
}

/* Two runs, same inputs, same thread count: bitwise identical outputs and gradients (also for
 * the per-part buffers of 3 threads over 2 kv heads). */
static void test_determinism(void) {
  attn_case a = attn_make(200, 24, 7, 8, 2, 64, NULL, 1.0f);
  size_t n[7] = {nq_of(&a), (size_t)(a.n_blocks * a.g * a.n_heads), nq_of(&a), nc_of(&a), nc_of(&a), nb_of(&a),
                 nb_of(&a)};
  for (int threads = 2; threads <= 3; threads++) {
    ds_set_num_threads(threads);
    attn_res r0 = attn_run(ds_backend_cpu(), &a), r1 = attn_run(ds_backend_cpu(), &a);
    float *x0[7] = {r0.out, r0.lse, r0.dq, r0.dkc, r0.dvc, r0.dkb, r0.dvb};
    float *x1[7] = {r1.out, r1.lse, r1.dq, r1.dkc, r1.dvc, r1.dkb, r1.dvb};
    for (int p = 0; p < 7; p++) EXPECT(memcmp(x0[p], x1[p], n[p] * sizeof(float)) == 0);
    res_free(&r0);
    res_free(&r1);
  }
  /* the other backward kernels */
  int64_t rows = 300, d = 256;
  float *x = rand_buf((size_t)(rows * d), 1), *w = rand_buf((size_t)(d * d), 1), *dy = rand_buf((size_t)(rows * d), 1);
  float *g1[3], *g2[3];
  for (int run = 0; run < 2; run++) {
    float **g = run ? g2 : g1;
    g[0] = zeros((size_t)(rows * d)), g[1] = zeros((size_t)(d * d)), g[2] = zeros((size_t)d);
    ds_backend_cpu()->linear_backward(g[0], g[1], g[2], dy, x, w, rows, d, d);
  }
  EXPECT(memcmp(g1[0], g2[0], (size_t)(rows * d) * sizeof(float)) == 0);
  EXPECT(memcmp(g1[1], g2[1], (size_t)(d * d) * sizeof(float)) == 0);
  EXPECT(memcmp(g1[2], g2[2], (size_t)d * sizeof(float)) == 0);
  for (int i = 0; i < 3; i++) free(g1[i]), free(g2[i]);
  float *rstd = zeros((size_t)rows), *y = zeros((size_t)(rows * d)), *dx1 = zeros((size_t)(rows * d));
  float *dx2 = zeros((size_t)(rows * d)), *dw1 = zeros((size_t)d), *dw2 = zeros((size_t)d);
  ds_backend_cpu()->rmsnorm(y, rstd, x, w, rows, d, 1e-6f);
  ds_backend_cpu()->rmsnorm_backward(dx1, dw1, dy, x, w, rstd, rows, d);
  ds_backend_cpu()->rmsnorm_backward(dx2, dw2, dy, x, w, rstd, rows, d);
  EXPECT(memcmp(dx1, dx2, (size_t)(rows * d) * sizeof(float)) == 0 && memcmp(dw1, dw2, (size_t)d * sizeof(float)) == 0);
  free(rstd); free(y); free(dx1); free(dx2); free(dw1); free(dw2);
  free(x); free(w); free(dy);
  ds_set_num_threads(2);
  attn_free(&a);
}

int main(void) {
  ds_rng_seed(&g_rng, 1234);
  ds_set_num_threads(2);
  TEST_RUN(test_linear_backward);
  TEST_RUN(test_rmsnorm_backward);
  TEST_RUN(test_rope_backward);
  TEST_RUN(test_swiglu_backward);
  TEST_RUN(test_block_attention_fd);
  TEST_RUN(test_block_attention_same);
  TEST_RUN(test_block_attention_dropped);
  TEST_RUN(test_block_attention_accumulate);
  TEST_RUN(test_block_attention_vs_causal);
  TEST_RUN(test_determinism);
  return TEST_RESULT();
}
