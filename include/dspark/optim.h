/* AdamW over a flat fp32 parameter buffer (the parameters are the fp32 master weights), the
 * warmup + cosine learning-rate schedule, and global-norm gradient clipping. */
#ifndef DSPARK_OPTIM_H
#define DSPARK_OPTIM_H

#include "dspark/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  double beta1, beta2, eps, weight_decay; /* defaults: ds_adamw_defaults */
} ds_adamw_config;

typedef struct {
  float *m;      /* (n) first moment */
  float *v;      /* (n) second moment */
  size_t n;
  int64_t step;  /* updates applied so far */
} ds_adamw;

ds_adamw_config ds_adamw_defaults(void);
ds_status ds_adamw_init(ds_adamw *opt, size_t n);
void ds_adamw_free(ds_adamw *opt);
/* One update, in PyTorch's AdamW order: p *= 1 - lr*wd; m, v updated; p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps). */
void ds_adamw_step(ds_adamw *opt, const ds_adamw_config *cfg, double lr, float *params, const float *grads);
/* The same update on grads[i] * grad_scale (the clipped gradient, ds_grad_clip_coef), without
 * writing the scaled gradient back: one pass over the gradient less than clipping in place, and
 * the same bits. */
void ds_adamw_step_scaled(ds_adamw *opt, const ds_adamw_config *cfg, double lr, float *params, const float *grads,
                          float grad_scale);

/* Linear warmup over the first round(warmup_frac * total_steps) steps, then cosine from
 * peak to 0 at total_steps. step counts from 0 (the lr used by the first update). */
double ds_lr_at(int64_t step, int64_t total_steps, double warmup_frac, double peak);

/* L2 norm of grads (double accumulation in a fixed order, so it is deterministic). */
double ds_grad_norm(const float *grads, size_t n);
/* The factor clipping applies to gradients of this norm: PyTorch's max_norm / (norm + 1e-6)
 * when norm > max_norm > 0, else 1. */
float ds_grad_clip_coef(double norm, double max_norm);
/* Scales grads so their norm is at most max_norm (no-op when max_norm <= 0); returns the
 * norm before clipping. */
double ds_clip_grad_norm(float *grads, size_t n, double max_norm);

#ifdef __cplusplus
}
#endif
#endif
