/* Intermediate-layer distillation losses (include/dspark/kd_intermediate.h): the option's
 * parser, and one pair's loss and its gradient, forward and backward side by side. The
 * projection is the backend's linear and linear_backward; only the per-row comparison is here. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/kd_intermediate.h"

/* torch.nn.functional.cosine_similarity's floor on each norm */
#define COSINE_NORM_FLOOR 1e-8

const char *ds_kd_inter_kind_name(ds_kd_inter_kind kind) { return kind == DS_KD_INTER_MSE ? "mse" : "cosine"; }

static int parse_layer(const char *s, char **end, int64_t *out) {
  errno = 0;
  long long v = strtoll(s, end, 10);
  if (*end == s || errno || v < -1 || v > (1 << 20)) return 0;
  *out = v;
  return 1;
}

ds_status ds_kd_inter_parse(const char *spec, ds_kd_inter_pair *out) {
  char *end;
  memset(out, 0, sizeof *out);
  out->kind = DS_KD_INTER_COSINE;
  int ok = spec && parse_layer(spec, &end, &out->student_layer) && *end == ':' &&
           parse_layer(end + 1, &end, &out->teacher_layer);
  if (ok && *end == ':') {
    if (!strcmp(end + 1, "cosine")) out->kind = DS_KD_INTER_COSINE;
    else if (!strcmp(end + 1, "mse")) out->kind = DS_KD_INTER_MSE;
    else ok = 0;
  } else if (ok && *end) {
    ok = 0;
  }
  if (!ok)
    return DS_FAIL(DS_ERR_ARG, "--intermediate expects S:T[:cosine|mse] (student layer S, teacher layer T, each >= "
                   "-1; -1 = the embedding output), got '%s'", spec ? spec : "(null)");
  return DS_OK;
}

/* a.b, a.a, b.b in double, in feature order. */
static void row_dots(const float *a, const float *b, int64_t n, double *ab, double *aa, double *bb) {
  double x = 0, y = 0, z = 0;
  for (int64_t k = 0; k < n; k++) {
    x += (double)a[k] * b[k];
    y += (double)a[k] * a[k];
    z += (double)b[k] * b[k];
  }
  *ab = x, *aa = y, *bb = z;
}

/* The row's comparison: a (the projected student row), b (the teacher row), n features. */
static double row_loss(ds_kd_inter_kind kind, const float *a, const float *b, int64_t n) {
  if (kind == DS_KD_INTER_MSE) {
    double s = 0;
    for (int64_t k = 0; k < n; k++) s += ((double)a[k] - b[k]) * ((double)a[k] - b[k]);
    return s / (double)n;
  }
  double ab, aa, bb;
  row_dots(a, b, n, &ab, &aa, &bb);
  double na = fmax(sqrt(aa), COSINE_NORM_FLOOR), nb = fmax(sqrt(bb), COSINE_NORM_FLOOR);
  return 1.0 - ab / (na * nb);
}

/* dy = weight * d row_loss / d a. Below the floor a norm is a constant (as torch's clamp). */
static void row_grad(ds_kd_inter_kind kind, const float *a, const float *b, int64_t n, double weight, float *dy) {
  if (kind == DS_KD_INTER_MSE) {
    double c = 2.0 * weight / (double)n;
    for (int64_t k = 0; k < n; k++) dy[k] = (float)(c * ((double)a[k] - b[k]));
    return;
  }
  double ab, aa, bb;
  row_dots(a, b, n, &ab, &aa, &bb);
  double ra = sqrt(aa), na = fmax(ra, COSINE_NORM_FLOOR), nb = fmax(sqrt(bb), COSINE_NORM_FLOOR);
  double cos = ab / (na * nb);
  double cb = -weight / (na * nb), ca = ra > COSINE_NORM_FLOOR ? weight * cos / (na * na) : 0.0;
  for (int64_t k = 0; k < n; k++) dy[k] = (float)(cb * b[k] + ca * a[k]);
}

ds_status ds_kd_inter_forward(const ds_backend *be, const ds_kd_inter_in *in, float *projected, double *rows_out,
                              double *sum) {
  int64_t R = in->rows, dt = in->d_teacher;
  const float *a = in->student;
  if (in->proj) {
    be->linear(projected, in->student, in->proj, NULL, R, in->d_student, dt);
    a = projected;
  }
#pragma omp parallel for schedule(static) if (R > 16)
  for (int64_t r = 0; r < R; r++)
    rows_out[r] = in->mask[r] ? row_loss(in->kind, a + r * dt, in->teacher + r * in->teacher_stride, dt) : 0.0;
  double s = 0;
  for (int64_t r = 0; r < R; r++) {
    if (!isfinite(rows_out[r]))
      return DS_FAIL(DS_ERR_NUMERIC, "intermediate %s loss at row %lld is %g (student or teacher hidden state not "
                     "finite)", ds_kd_inter_kind_name(in->kind), (long long)r, rows_out[r]);
    s += rows_out[r];
  }
  *sum = s;
  return DS_OK;
}

void ds_kd_inter_backward(const ds_backend *be, const ds_kd_inter_in *in, const float *projected, double weight,
                          float *dy, float *dstudent, float *dproj) {
  int64_t R = in->rows, dt = in->d_teacher;
  const float *a = in->proj ? projected : in->student;
#pragma omp parallel for schedule(static) if (R > 16)
  for (int64_t r = 0; r < R; r++) {
    if (in->mask[r]) row_grad(in->kind, a + r * dt, in->teacher + r * in->teacher_stride, dt, weight, dy + r * dt);
    else memset(dy + r * dt, 0, (size_t)dt * sizeof(float));
  }
  if (in->proj) be->linear_backward(dstudent, dproj, NULL, dy, in->student, in->proj, R, in->d_student, dt);
  else be->add(dstudent, dy, R * dt);
}
