/* Intermediate-layer distillation losses (spec/kd.md section 3): the student's hidden state
 * after layer S against the teacher's after layer T, `--intermediate S:T[:cosine|mse]`, through
 * a learned linear projection [d_teacher, d_student] when the hidden sizes differ.
 *
 * Per supervised row r (the rows of the logits loss: the same loss mask), a = proj(h_s[r])
 * (h_s[r] itself when the sizes are equal), b = h_t[r]:
 *   cosine  l = 1 - a.b / (max(|a|, 1e-8) max(|b|, 1e-8))   (torch.nn.functional.cosine_similarity)
 *   mse     l = mean_k (a_k - b_k)^2                          (torch.nn.functional.mse_loss per row)
 * A pair's loss is sum_r l / (the step's global token count), like the logits loss. The
 * objective averages the pairs to I and balances I against the logits KD with
 * ds_kd_balance_losses (dspark/kd_loss.h); that gives each pair's gradient weight.
 *
 * The projection starts as the rectangular identity (W[i][j] = [i == j]): a pair starts as the
 * plain comparison of the leading min(d_s, d_t) features, with nothing seeded to reproduce.
 *
 * Determinism: rows are independent, each reduced in a fixed order in double, and the sum runs
 * over rows in order after the parallel part. */
#ifndef DSPARK_KD_INTERMEDIATE_H
#define DSPARK_KD_INTERMEDIATE_H

#include "dspark/backend.h"
#include "dspark/common.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { DS_KD_MAX_INTERMEDIATE = 16 };

typedef enum { DS_KD_INTER_COSINE = 0, DS_KD_INTER_MSE = 1 } ds_kd_inter_kind;

typedef struct {
  int64_t student_layer; /* -1 = the embedding output, l = after decoder layer l (dspark/student.h) */
  int64_t teacher_layer; /* the same numbering, a layer the teacher can capture: [-1, L-2] */
  ds_kd_inter_kind kind; /* cosine by default */
} ds_kd_inter_pair;

/* "S:T", "S:T:cosine" or "S:T:mse" (integers >= -1). Anything else is DS_ERR_ARG naming
 * --intermediate and the text. Layer ranges are the objective's to check (it knows the models). */
ds_status ds_kd_inter_parse(const char *spec, ds_kd_inter_pair *out);
/* "cosine" / "mse". */
const char *ds_kd_inter_kind_name(ds_kd_inter_kind kind);

/* One pair over `rows` rows of one sequence. */
typedef struct {
  ds_kd_inter_kind kind;
  int64_t rows, d_student, d_teacher;
  const float *student;   /* [rows, d_student] */
  const float *teacher;   /* [rows, teacher_stride]: d_teacher columns from here */
  int64_t teacher_stride;
  const float *proj;      /* [d_teacher, d_student], or NULL when d_student == d_teacher (no projection) */
  const uint8_t *mask;    /* [rows] nonzero = supervised */
} ds_kd_inter_in;

/* The loss: projected [rows, d_teacher] = proj(student) (written only with a projection; the
 * backward reads it), row_loss [rows] (0 at unsupervised rows), *sum = sum_r row_loss in row
 * order. A non-finite row loss is DS_ERR_NUMERIC naming the row. */
ds_status ds_kd_inter_forward(const ds_backend *be, const ds_kd_inter_in *in, float *projected, double *row_loss,
                              double *sum);
/* The gradient of weight * sum: dstudent [rows, d_student] += and, with a projection,
 * dproj [d_teacher, d_student] +=. dy [rows, d_teacher] is scratch. Unsupervised rows send
 * nothing. */
void ds_kd_inter_backward(const ds_backend *be, const ds_kd_inter_in *in, const float *projected, double weight,
                          float *dy, float *dstudent, float *dproj);

#ifdef __cplusplus
}
#endif
#endif
