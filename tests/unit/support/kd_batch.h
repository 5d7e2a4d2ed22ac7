/* Test support for the KD loss tests: a random batch (student and teacher logits, the teacher's
 * sparse top-K made by the capture's own selection, labels, a loss mask), one call of ds_kd_loss
 * with everything it produces, and the double-precision reference of spec/kd.md section 2
 * written here from the formulas (not from the engine's code). */
#ifndef DSPARK_TEST_KD_BATCH_H
#define DSPARK_TEST_KD_BATCH_H

#include <stddef.h>
#include <stdint.h>

#include "dspark/kd_loss.h"
#include "dspark/rng.h"

typedef struct {
  int64_t R, V, K;
  float *s, *t;      /* [R, V] student, teacher logits */
  int32_t *ids;      /* [R, K] teacher top-K (ds_kd_select of t at the capture's T / top-p / min_k) */
  float *lq;         /* [R, K] their full-vocabulary log-probs */
  int32_t *labels;   /* [R] */
  uint8_t *mask;     /* [R] all 1 unless changed */
} kd_batch;

/* Student logits uniform in [-s_scale, s_scale]; the teacher near the student (student + noise)
 * on odd rows, independent on even rows; the top-K captured at temperature cap_t with
 * cap_top_p / cap_min_k. */
kd_batch kd_batch_new(ds_rng *rng, int64_t R, int64_t V, int64_t K, float s_scale, double cap_t, double cap_top_p,
                      int64_t cap_min_k);
kd_batch kd_batch_copy(const kd_batch *a);
void kd_batch_free(kd_batch *b);
/* The inputs of ds_kd_loss for cfg: sparse (cfg->top_k > 0, k_stride = b->K) or dense. */
ds_kd_rows_in kd_inputs(const kd_batch *b, const ds_kd_loss_config *cfg);

/* Everything one call produces. */
typedef struct {
  ds_status st;
  ds_kd_loss_result res;
  double *kd, *lm; /* [R] */
  float *grad;     /* [R, V] */
} kd_run;

kd_run kd_run_loss(const ds_kd_loss_config *cfg, const kd_batch *b, double scale);
void kd_run_free(kd_run *o);
int kd_same_bits(const void *a, const void *b, size_t n);
int kd_runs_identical(const kd_run *a, const kd_run *b, const kd_batch *shape);

/* ---- the reference, in double ---- */

/* kd and lm of row r with student logits s [V] (double); rows read b's teacher. lm is at
 * temperature 1. The sparse form keeps the prefix of ids != -1, applies the top-p rule
 * (sum_{j<i} e^q_j < top_p or i < min_k), and uses the ghost with log(-expm1(min(., -eps))). */
void kd_ref_row(const ds_kd_loss_config *cfg, const kd_batch *b, int64_t r, const double *s, double *kd, double *lm);
/* The numerator sum_mask (1 - alpha) lm + alpha kd with the student logits s [R, V] (double). */
double kd_ref_numerator(const ds_kd_loss_config *cfg, const kd_batch *b, const double *s);
double *kd_to_double(const float *x, int64_t n);
/* max |a - b| / max |b| */
double kd_rel_err(const float *a, const double *b, int64_t n);

#endif
