/* Naive reference kernels: plain loops with double accumulation, written for clarity, used
 * by the tests to check the optimized backend. Never used on a hot path. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/backend.h"

static void ref_linear(float *y, const float *x, const float *w, const float *bias, int64_t n, int64_t in,
                       int64_t out) {
  for (int64_t i = 0; i < n; i++)
    for (int64_t o = 0; o < out; o++) {
      double s = bias ? bias[o] : 0.0;
      for (int64_t p = 0; p < in; p++) s += (double)x[i * in + p] * w[o * in + p];
      y[i * out + o] = (float)s;
    }
}

static void ref_rmsnorm(float *y, float *rstd, const float *x, const float *w, int64_t n, int64_t d, float eps) {
  for (int64_t i = 0; i < n; i++) {
    double ss = 0.0;
    for (int64_t j = 0; j < d; j++) ss += (double)x[i * d + j] * x[i * d + j];
    double r = 1.0 / sqrt(ss / (double)d + eps);
    if (rstd) rstd[i] = (float)r;
    for (int64_t j = 0; j < d; j++) y[i * d + j] = (float)(w[j] * (x[i * d + j] * r));
  }
}

static void ref_rope(float *x, int64_t stride, const int64_t *pos, const float *inv_freq, int64_t n, int64_t heads,
                     int64_t head_dim) {
  int64_t half = head_dim / 2;
  for (int64_t t = 0; t < n; t++)
    for (int64_t h = 0; h < heads; h++) {
      float *v = x + t * stride + h * head_dim;
      for (int64_t i = 0; i < half; i++) {
        double ang = (double)pos[t] * inv_freq[i];
        double a = v[i], b = v[i + half];
        v[i] = (float)(a * cos(ang) - b * sin(ang));
        v[i + half] = (float)(b * cos(ang) + a * sin(ang));
      }
    }
}

static void ref_attention_causal(float *out, const float *q, int64_t q_stride, const float *k, const float *v,
                                 int64_t n, int64_t past, int64_t cap, int64_t n_heads, int64_t n_kv_heads,
                                 int64_t head_dim, float scale) {
  int64_t group = n_heads / n_kv_heads;
  double *p = malloc((size_t)(past + n) * sizeof(double));
  if (!p) abort();
  for (int64_t i = 0; i < n; i++)
    for (int64_t h = 0; h < n_heads; h++) {
      const float *qi = q + i * q_stride + h * head_dim;
      const float *kh = k + (h / group) * cap * head_dim, *vh = v + (h / group) * cap * head_dim;
      int64_t visible = past + i + 1;
      double mx = -INFINITY, sum = 0.0;
      for (int64_t j = 0; j < visible; j++) {
        double s = 0.0;
        for (int64_t e = 0; e < head_dim; e++) s += (double)qi[e] * kh[j * head_dim + e];
        p[j] = s * scale;
        if (p[j] > mx) mx = p[j];
      }
      for (int64_t j = 0; j < visible; j++) sum += (p[j] = exp(p[j] - mx));
      for (int64_t e = 0; e < head_dim; e++) {
        double o = 0.0;
        for (int64_t j = 0; j < visible; j++) o += p[j] / sum * vh[j * head_dim + e];
        out[i * n_heads * head_dim + h * head_dim + e] = (float)o;
      }
    }
  free(p);
}

static void ref_swiglu(float *out, const float *gu, int64_t n, int64_t inter) {
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < inter; j++) {
      double g = gu[i * 2 * inter + j], u = gu[i * 2 * inter + inter + j];
      out[i * inter + j] = (float)(g / (1.0 + exp(-g)) * u);
    }
}

static void ref_add(float *y, const float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

static const ds_backend k_reference = {
    .name = "reference",
    .linear = ref_linear,
    .rmsnorm = ref_rmsnorm,
    .rope = ref_rope,
    .attention_causal = ref_attention_causal,
    .swiglu = ref_swiglu,
    .add = ref_add,
};

const ds_backend *ds_backend_reference(void) { return &k_reference; }
