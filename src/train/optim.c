#include "dspark/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

ds_adamw_config ds_adamw_defaults(void) {
  /* spec section 5 (DeepSpec): lr 6e-4, weight decay 0; betas and eps are PyTorch's. */
  return (ds_adamw_config){0.9, 0.999, 1e-8, 0.0};
}

ds_status ds_adamw_init(ds_adamw *opt, size_t n) {
  memset(opt, 0, sizeof *opt);
  opt->m = ds_calloc(n, sizeof(float), "AdamW first moment");
  opt->v = ds_calloc(n, sizeof(float), "AdamW second moment");
  if (!opt->m || !opt->v) {
    ds_adamw_free(opt);
    return DS_ERR_NOMEM;
  }
  opt->n = n;
  return DS_OK;
}

void ds_adamw_free(ds_adamw *opt) {
  free(opt->m);
  free(opt->v);
  memset(opt, 0, sizeof *opt);
}

void ds_adamw_step(ds_adamw *opt, const ds_adamw_config *cfg, double lr, float *params, const float *grads) {
  ds_adamw_step_scaled(opt, cfg, lr, params, grads, 1.0f);
}

void ds_adamw_step_scaled(ds_adamw *opt, const ds_adamw_config *cfg, double lr, float *params, const float *grads,
                          float grad_scale) {
  opt->step++;
  double bc1 = 1.0 - pow(cfg->beta1, (double)opt->step);
  double bc2 = 1.0 - pow(cfg->beta2, (double)opt->step);
  float decay = (float)(1.0 - lr * cfg->weight_decay);
  float b1 = (float)cfg->beta1, b2 = (float)cfg->beta2, eps = (float)cfg->eps;
  float step_size = (float)(lr / bc1), inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
  float *m = opt->m, *v = opt->v;
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < opt->n; i++) {
    float g = grads[i] * grad_scale; /* the clipped gradient, the same float as scaling in place */
    float p = params[i] * decay;
    m[i] = b1 * m[i] + (1.0f - b1) * g;
    v[i] = b2 * v[i] + (1.0f - b2) * g * g;
    params[i] = p - step_size * m[i] / (sqrtf(v[i]) * inv_sqrt_bc2 + eps);
  }
}

double ds_lr_at(int64_t step, int64_t total_steps, double warmup_frac, double peak) {
  int64_t warmup = (int64_t)llround(warmup_frac * (double)total_steps);
  if (step < warmup) return peak * (double)(step + 1) / (double)warmup;
  if (total_steps <= warmup) return peak;
  double progress = (double)(step - warmup) / (double)(total_steps - warmup);
  if (progress > 1.0) progress = 1.0;
  return peak * 0.5 * (1.0 + cos(3.141592653589793 * progress));
}

/* LANES values at a time (GCC / Clang vector extensions: one AVX-512 register of doubles). */
typedef float lanes_f32 __attribute__((vector_size(32)));
typedef double lanes_f64 __attribute__((vector_size(64)));

double ds_grad_norm(const float *grads, size_t n) {
  /* Fixed blocks, each summed in LANES interleaved accumulators (one vector of doubles: a
   * single running sum is bound by the add's latency), blocks summed in order: the same bits
   * for any thread count. */
  enum { BLOCK = 4096, LANES = 8 };
  size_t nb = (n + BLOCK - 1) / BLOCK;
  double *partial = malloc((nb ? nb : 1) * sizeof(double));
  DS_CHECK(partial != NULL);
#pragma omp parallel for schedule(static)
  for (size_t b = 0; b < nb; b++) {
    lanes_f64 acc = {0};
    size_t i = b * BLOCK, end = (b + 1) * BLOCK < n ? (b + 1) * BLOCK : n;
    for (; i + LANES <= end; i += LANES) {
      lanes_f32 x;
      memcpy(&x, grads + i, sizeof x);
      lanes_f64 y = __builtin_convertvector(x, lanes_f64);
      acc += y * y;
    }
    double lane[LANES], s = 0;
    memcpy(lane, &acc, sizeof lane);
    for (int j = 0; i < end; i++, j++) lane[j] += (double)grads[i] * grads[i];
    for (int j = 0; j < LANES; j++) s += lane[j];
    partial[b] = s;
  }
  double total = 0;
  for (size_t b = 0; b < nb; b++) total += partial[b];
  free(partial);
  return sqrt(total);
}

float ds_grad_clip_coef(double norm, double max_norm) {
  /* PyTorch: clip_coef = max_norm / (norm + 1e-6), applied when the norm is above max_norm */
  return max_norm > 0 && norm > max_norm ? (float)(max_norm / (norm + 1e-6)) : 1.0f;
}

double ds_clip_grad_norm(float *grads, size_t n, double max_norm) {
  double norm = ds_grad_norm(grads, n);
  float coef = ds_grad_clip_coef(norm, max_norm);
  if (coef != 1.0f) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) grads[i] *= coef;
  }
  return norm;
}
