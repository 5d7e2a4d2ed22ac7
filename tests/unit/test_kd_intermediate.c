/* Intermediate-layer KD losses (include/dspark/kd_intermediate.h): the --intermediate parser,
 * the cosine and mse row losses against a double reference, and the gradients of the student
 * rows and of the projection against central finite differences, with and without the
 * projection, masked rows sending nothing. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/backend.h"
#include "dspark/kd_intermediate.h"
#include "dspark/rng.h"
#include "test_util.h"

static ds_rng g_rng;

static void test_parse(void) {
  ds_kd_inter_pair p;
  EXPECT_OK(ds_kd_inter_parse("3:7", &p));
  EXPECT(p.student_layer == 3 && p.teacher_layer == 7 && p.kind == DS_KD_INTER_COSINE);
  EXPECT_OK(ds_kd_inter_parse("-1:0:mse", &p));
  EXPECT(p.student_layer == -1 && p.teacher_layer == 0 && p.kind == DS_KD_INTER_MSE);
  EXPECT_OK(ds_kd_inter_parse("2:2:cosine", &p));
  EXPECT(p.kind == DS_KD_INTER_COSINE);
  const char *bad[] = {"", "3", "3:", ":3", "a:1", "1:b", "1:2:", "1:2:l1", "1:2:mse:x", "-2:1", "1:-5", "1:2 "};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    EXPECT(ds_kd_inter_parse(bad[i], &p) == DS_ERR_ARG);
    EXPECT(strstr(ds_last_error(), "--intermediate") != NULL);
  }
}

static float uni(void) { return (float)(2.0 * ds_rng_uniform_f64(&g_rng) - 1.0); }

/* weight * sum_r l_r in double from a (projected or not) */
static double reference(ds_kd_inter_kind kind, const float *s, const float *w, const float *t, const uint8_t *mask,
                        int64_t R, int64_t ds, int64_t dt) {
  double total = 0;
  for (int64_t r = 0; r < R; r++) {
    if (!mask[r]) continue;
    double ab = 0, aa = 0, bb = 0, se = 0;
    for (int64_t i = 0; i < dt; i++) {
      double a = 0;
      if (w) for (int64_t j = 0; j < ds; j++) a += (double)w[i * ds + j] * s[r * ds + j];
      else a = s[r * ds + i];
      double b = t[r * dt + i];
      ab += a * b, aa += a * a, bb += b * b, se += (a - b) * (a - b);
    }
    total += kind == DS_KD_INTER_MSE ? se / (double)dt : 1.0 - ab / (fmax(sqrt(aa), 1e-8) * fmax(sqrt(bb), 1e-8));
  }
  return total;
}

static void check_case(ds_kd_inter_kind kind, int64_t ds, int64_t dt) {
  const ds_backend *be = ds_backend_cpu();
  int64_t R = 6;
  int with_proj = ds != dt;
  float *s = malloc((size_t)(R * ds) * sizeof(float)), *t = malloc((size_t)(R * dt) * sizeof(float));
  float *w = with_proj ? malloc((size_t)(dt * ds) * sizeof(float)) : NULL;
  float *proj_out = malloc((size_t)(R * dt) * sizeof(float)), *dy = malloc((size_t)(R * dt) * sizeof(float));
  float *ds_grad = calloc((size_t)(R * ds), sizeof(float));
  float *dw = with_proj ? calloc((size_t)(dt * ds), sizeof(float)) : NULL;
  double rows[6];
  uint8_t mask[6] = {1, 1, 0, 1, 1, 1};
  for (int64_t i = 0; i < R * ds; i++) s[i] = uni();
  for (int64_t i = 0; i < R * dt; i++) t[i] = uni();
  for (int64_t i = 0; with_proj && i < dt * ds; i++) w[i] = 0.5f * uni();
  ds_kd_inter_in in = {kind, R, ds, dt, s, t, dt, w, mask};
  double sum, weight = 0.75;
  EXPECT_OK(ds_kd_inter_forward(be, &in, proj_out, rows, &sum));
  EXPECT_CLOSE(sum, reference(kind, s, w, t, mask, R, ds, dt), 1e-5, 1e-6);
  EXPECT(rows[2] == 0.0);
  ds_kd_inter_backward(be, &in, proj_out, weight, dy, ds_grad, dw);
  for (int64_t j = 0; j < ds; j++) EXPECT(ds_grad[2 * ds + j] == 0.0f); /* the masked row */
  /* central differences in double through the float inputs */
  float *params[2] = {s, w};
  float *grads[2] = {ds_grad, dw};
  int64_t sizes[2] = {R * ds, with_proj ? dt * ds : 0};
  double worst = 0;
  for (int k = 0; k < 2; k++)
    for (int64_t i = 0; i < sizes[k]; i += 3) {
      float keep = params[k][i], h = 1e-3f;
      params[k][i] = keep + h;
      double up = reference(kind, s, w, t, mask, R, ds, dt);
      params[k][i] = keep - h;
      double down = reference(kind, s, w, t, mask, R, ds, dt);
      params[k][i] = keep;
      double fd = weight * (up - down) / (2.0 * h);
      double e = fabs(fd - grads[k][i]) / fmax(1e-3, fabs(fd));
      if (e > worst) worst = e;
    }
  EXPECT(worst < 2e-3);
  free(s), free(t), free(w), free(proj_out), free(dy), free(ds_grad), free(dw);
}

static void test_gradients(void) {
  check_case(DS_KD_INTER_COSINE, 8, 8);
  check_case(DS_KD_INTER_MSE, 8, 8);
  check_case(DS_KD_INTER_COSINE, 6, 10);
  check_case(DS_KD_INTER_MSE, 12, 5);
}

int main(void) {
  ds_rng_seed(&g_rng, 20261203);
  TEST_RUN(test_parse);
  TEST_RUN(test_gradients);
  return TEST_RESULT();
}
