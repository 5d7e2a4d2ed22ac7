/* The one seam between model code and compute: every kernel the models call goes through a
 * ds_backend table, so a CUDA backend is a second table, not a rewrite of the models.
 * Pointers are fp32 buffers in the backend's memory; shapes are row-major and written next
 * to each entry. Forward kernels that have a backward get it added beside them here. */
#ifndef DSPARK_BACKEND_H
#define DSPARK_BACKEND_H

#include "dspark/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds_backend {
  const char *name;

  /* y[n, out] = x[n, in] @ w[out, in]^T (+ bias[out] when bias != NULL). Overwrites y. */
  void (*linear)(float *y, const float *x, const float *w, const float *bias, int64_t n, int64_t in,
                 int64_t out);

  /* y[n, d] = x / sqrt(mean(x^2) + eps) * w[d]; y may alias x. rstd[n] saved when non-NULL
   * (the backward needs it). */
  void (*rmsnorm)(float *y, float *rstd, const float *x, const float *w, int64_t n, int64_t d, float eps);

  /* In place on x[n, heads, head_dim] (row stride `stride` floats between tokens), HF
   * rotate_half convention: pairs (i, i + head_dim/2), angle pos[t] * inv_freq[i]. */
  void (*rope)(float *x, int64_t stride, const int64_t *pos, const float *inv_freq, int64_t n, int64_t heads,
               int64_t head_dim);

  /* Causal attention of n new queries against a KV cache (GQA: query head h reads kv head
   * h / (n_heads / n_kv_heads)).
   *   q[n, q_stride] holding n_heads x head_dim (roped); k, v: [n_kv_heads, cap, head_dim]
   *   with keys 0 .. past+n-1 valid; out[n, n_heads * head_dim].
   * Query i sits at position past + i and sees keys 0 .. past + i. */
  void (*attention_causal)(float *out, const float *q, int64_t q_stride, const float *k, const float *v,
                           int64_t n, int64_t past, int64_t cap, int64_t n_heads, int64_t n_kv_heads,
                           int64_t head_dim, float scale);

  /* out[n, I] = silu(gu[n, 0:I]) * gu[n, I:2I]  (gate and up fused in one row). */
  void (*swiglu)(float *out, const float *gu, int64_t n, int64_t inter);

  /* y[n] += x[n] */
  void (*add)(float *y, const float *x, int64_t n);
} ds_backend;

const ds_backend *ds_backend_cpu(void);
/* The naive reference kernels (plain loops, double accumulation) that tests compare against. */
const ds_backend *ds_backend_reference(void);

/* Threads used by our kernels (OpenMP) and BLAS; 0 keeps the default. */
void ds_set_num_threads(int n);
int ds_get_num_threads(void);
/* Name of the BLAS kernel family in use (e.g. "Haswell", "SkylakeX"), or "none". */
const char *ds_blas_kernel_name(void);

#ifdef __cplusplus
}
#endif
#endif
