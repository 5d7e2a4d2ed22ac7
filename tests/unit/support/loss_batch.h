/* Test support for the DSpark loss tests: a random batch of n_blocks x g rows over V, one
 * call of ds_dspark_loss with everything it produces, bitwise comparisons, and the
 * double-precision reference of spec/dspark.md section 4 written from the spec. */
#ifndef DSPARK_TEST_LOSS_BATCH_H
#define DSPARK_TEST_LOSS_BATCH_H

#include <stddef.h>
#include <stdint.h>

#include "dspark/dspark_loss.h"
#include "dspark/rng.h"

/* ---- a batch of n_blocks x g rows over V ---- */
typedef struct {
  int64_t nb, g, V, R;
  float *draft, *target, *conf; /* [R, V], [R, V], [R] */
  int32_t *ids;                 /* [R] */
  uint8_t *em, *bk;             /* [R], [nb] */
} batch;

/* Everything one call produces. */
typedef struct {
  ds_status st;
  ds_dspark_loss_result res;
  double *pos_acc, *pos_cnt;          /* [g] */
  double *ce, *l1, *acc, *bce;        /* [R] */
  float *gd, *gc;                     /* [R, V], [R] */
} run_out;

/* ---- the double-precision reference, written from the spec ---- */
typedef struct {
  double num, W, ce, l1, bce, acc, acc_den, tau, tau_den;
  int64_t tokens;
  double pos_acc[64], pos_cnt[64];
} ref_out;

batch batch_new(ds_rng *rng, int64_t nb, int64_t g, int64_t V, float s);
batch batch_copy(const batch *a);
void batch_free(batch *b);
ds_dspark_loss_inputs inputs_of(const batch *b, const ds_dspark_loss_config *cfg);
run_out run_loss(const ds_dspark_loss_config *cfg, const batch *b, double scale);
void run_free(run_out *o);
int same_bits(const void *a, const void *b, size_t n);
int results_identical(const ds_dspark_loss_result *a, const ds_dspark_loss_result *b);
int runs_identical(const run_out *a, const run_out *b, const batch *shape);
double ref_decay(const ds_dspark_loss_config *cfg, int64_t k, int64_t g);
void ref_loss(const ds_dspark_loss_config *cfg, const batch *b, const double *draft, const double *target,
                     const double *conf, const double *accept_fixed, double *accept_out, ref_out *o);
double *to_double(const float *x, int64_t n);
void ref_of_batch(const ds_dspark_loss_config *cfg, const batch *b, ref_out *o);
ds_dspark_loss_config cfg_with(int teacher, int conf);
double rel_err_fd(const float *a, const double *b, int64_t n);

#endif
