/* CPU backend: BLAS sgemm for the matmuls, OpenMP loops for the rest. Each forward kernel sits
 * next to its backward; the attention kernels live in cpu_attention.c. Backward kernels ADD
 * into the gradient buffers they are given (NULL skips one); see include/dspark/backend.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/backend.h"
#include "nn/cpu_gemm_bf16.h"
#include "nn/cpu_kernels.h"
#include "nn/cpu_linear16.h"
#include "nn/cpu_quant.h"
#include "nn/fast_exp.h"
#include "nn/host_memory.h"
#include "nn/linear_cat.h"

#ifdef DSPARK_USE_OPENMP
#include <omp.h>
#endif

/* ---------------------------------------------------------------- linear */

/* y[n, out] (row stride ldy) = x[n, in] @ w[out, in]^T (+ bias[out]). */
static void linear_f32(float *y, int64_t ldy, const float *x, const float *w, const float *bias, int64_t n,
                       int64_t in, int64_t out) {
  float beta = 0.0f;
  if (bias) {
    DS_OMP(parallel for schedule(static) if (n * out > 65536))
    for (int64_t i = 0; i < n; i++) memcpy(y + i * ldy, bias, (size_t)out * sizeof(float));
    beta = 1.0f;
  }
  ds_cpu_matmul_w(0, 1, n, out, in, x, in, w, in, beta, y, ldy, n, DS_BF16_MIN_ROWS_F32W);
}

/* y[n, out] = x[n, in] @ w[out, in]^T (+ bias[out]). */
static void cpu_linear(float *y, const float *x, const float *w, const float *bias, int64_t n, int64_t in,
                       int64_t out) {
  linear_f32(y, out, x, w, bias, n, in, out);
}

/* y[n, out] (row stride ldy) = x[n, in] @ w[out, in]^T (+ bias[out]), w frozen in F32 / BF16 / F16:
 * F32 is the fp32 linear itself; 16-bit weights go to cpu_linear16.c. */
static void cpu_linear_w(float *y, int64_t ldy, const float *x, ds_weight w, const float *bias, int64_t n,
                         int64_t in, int64_t out) {
  if (w.dtype == DS_F32 && ds_matmul_compute() == DS_COMPUTE_BF16 && n >= DS_BF16_MIN_ROWS_F32W) {
    /* frozen: its bf16 copy is packed once (trainable weights take linear_f32, rounded per call) */
    if (bias) {
      DS_OMP(parallel for schedule(static) if (n * out > 65536))
      for (int64_t i = 0; i < n; i++) memcpy(y + i * ldy, bias, (size_t)out * sizeof(float));
    }
    ds_cpu_gemm_bf16_frozen(1, n, out, in, x, in, w.data, NULL, bias ? 1.0f : 0.0f, y, ldy);
  } else if (w.dtype == DS_F32 && n <= DS_F32_DIRECT_MAX_ROWS) {
    ds_cpu_linear_f32_rows(y, ldy, x, &w, &out, 1, bias, n, in); /* decode: streams w once */
  } else if (w.dtype == DS_F32) {
    linear_f32(y, ldy, x, w.data, bias, n, in, out);
  } else if (ds_dtype_is_quantized(w.dtype)) {
    ds_cpu_linear_quant(y, ldy, x, w, bias, n, in, out);
  } else {
    ds_cpu_linear16(y, ldy, x, w, bias, n, in, out);
  }
}

enum { CAT_MAX = 8 }; /* segments fused into one bf16 product */

/* linear_w over segments sharing x. Under DS_COMPUTE_BF16, F32 or BF16 segments of one dtype
 * with enough rows run as one bf16 GEMM over their concatenation (q, k and v: one dense product
 * instead of three narrow ones into a strided y); otherwise one cpu_linear_w per segment. */
static void cpu_linear_w_cat(float *y, int64_t ldy, const float *x, const ds_weight *w, const int64_t *out, int n_seg,
                             const float *bias, int64_t n, int64_t in) {
  int fuse = n_seg > 1 && n_seg <= CAT_MAX && ds_matmul_compute() == DS_COMPUTE_BF16 &&
             (w[0].dtype == DS_F32 ? n >= DS_BF16_MIN_ROWS_F32W : w[0].dtype == DS_BF16 && n >= DS_BF16_MIN_ROWS_BF16W);
  int64_t total = 0;
  int all16 = 1, allq = 1, all32 = n <= DS_F32_DIRECT_MAX_ROWS && n_seg <= DS_CAT_SEG_MAX;
  const void *segs[CAT_MAX];
  for (int s = 0; s < n_seg; s++) {
    fuse = fuse && w[s].dtype == w[0].dtype;
    all16 = all16 && (w[s].dtype == DS_BF16 || w[s].dtype == DS_F16);
    allq = allq && ds_dtype_is_quantized(w[s].dtype);
    all32 = all32 && w[s].dtype == DS_F32;
    if (s < CAT_MAX) segs[s] = w[s].data;
    total += out[s];
  }
  if (!fuse) {
    if (all16) ds_cpu_linear16_cat(y, ldy, x, w, out, n_seg, bias, n, in);
    else if (allq) ds_cpu_linear_quant_cat(y, ldy, x, w, out, n_seg, bias, n, in);
    else if (all32) ds_cpu_linear_f32_rows(y, ldy, x, w, out, n_seg, bias, n, in); /* one region at decode */
    else ds_linear_w_each_segment(cpu_linear_w, y, ldy, x, w, out, n_seg, bias, n, in);
    return;
  }
  if (bias) {
    DS_OMP(parallel for schedule(static) if (n * total > 65536))
    for (int64_t i = 0; i < n; i++) memcpy(y + i * ldy, bias, (size_t)total * sizeof(float));
  }
  ds_cpu_gemm_bf16_frozen_cat(n, segs, w[0].dtype == DS_F32, out, n_seg, in, x, in, bias ? 1.0f : 0.0f, y, ldy);
}

/* dx[n, in] += dy[n, out] @ w[out, in], w frozen (no dw). */
static void cpu_linear_w_backward(float *dx, const float *dy, ds_weight w, int64_t n, int64_t in, int64_t out) {
  if (w.dtype == DS_F32 && ds_matmul_compute() == DS_COMPUTE_BF16 && n >= DS_BF16_MIN_ROWS_F32W)
    ds_cpu_gemm_bf16_frozen(0, n, in, out, dy, out, w.data, NULL, 1.0f, dx, in); /* its own packed copy */
  else if (w.dtype == DS_F32) ds_cpu_matmul_w(0, 0, n, in, out, dy, out, w.data, in, 1.0f, dx, in, n, DS_BF16_MIN_ROWS_F32W);
  else if (ds_dtype_is_quantized(w.dtype)) ds_cpu_linear_quant_backward(dx, dy, w, n, in, out);
  else ds_cpu_linear16_backward(dx, dy, w, n, in, out);
}

/* y[n, d] = table[ids[i]]: quantized tables here, the others in cpu_linear16.c. */
static void cpu_embedding_w(float *y, const int32_t *ids, ds_weight table, int64_t n, int64_t d) {
  if (ds_dtype_is_quantized(table.dtype)) ds_cpu_embedding_quant(y, ids, table, n, d);
  else ds_cpu_embedding_w(y, ids, table, n, d);
}

static void cpu_prepare_weight(ds_weight w, int64_t rows, int64_t in) {
  if (ds_dtype_is_quantized(w.dtype)) ds_cpu_prepare_quant_weight(w, rows, in); /* 16-bit and F32 are read as stored */
}

enum { COL_CHUNK = 64 }; /* columns per task when summing over rows */

/* dx[n, in] += dy[n, out] @ w[out, in];  dw[out, in] += dy^T @ x[n, in];  db[out] += sum_n dy. */
static void cpu_linear_backward(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w,
                                int64_t n, int64_t in, int64_t out) {
  if (dx) ds_cpu_matmul_w(0, 0, n, in, out, dy, out, w, in, 1.0f, dx, in, n, DS_BF16_MIN_ROWS_F32W);
  /* dw's operands are both activations: only n x (in + out) values to round */
  if (dw) ds_cpu_matmul_w(1, 0, out, in, n, dy, out, x, in, 1.0f, dw, in, n, DS_BF16_MIN_ROWS_DW);
  if (db) {
    /* Each task owns COL_CHUNK columns and sums the rows in order: no race, fixed order. */
    DS_OMP(parallel for schedule(static) if (n * out > 65536))
    for (int64_t o0 = 0; o0 < out; o0 += COL_CHUNK) {
      int64_t oc = out - o0 < COL_CHUNK ? out - o0 : COL_CHUNK;
      float acc[COL_CHUNK] = {0};
      for (int64_t i = 0; i < n; i++)
        for (int64_t o = 0; o < oc; o++) acc[o] += dy[i * out + o0 + o];
      for (int64_t o = 0; o < oc; o++) db[o0 + o] += acc[o];
    }
  }
}

/* ---------------------------------------------------------------- rmsnorm */

/* y[d] = w[d] * (x * r), r = 1 / sqrt(mean(x^2) + eps) (returned) */
static inline float rmsnorm_row(float *y, const float *x, const float *w, int64_t d, float eps) {
  float ss = 0.0f;
  DS_OMP(simd reduction(+ : ss))
  for (int64_t j = 0; j < d; j++) ss += x[j] * x[j];
  float r = 1.0f / sqrtf(ss / (float)d + eps);
  /* HF order: normalize in fp32, then scale by the weight. */
  for (int64_t j = 0; j < d; j++) y[j] = w[j] * (x[j] * r);
  return r;
}

/* y[n, d] = w[d] * (x * rstd), rstd[n] = 1 / sqrt(mean(x^2) + eps) saved for the backward. */
static void cpu_rmsnorm(float *y, float *rstd, const float *x, const float *w, int64_t n, int64_t d, float eps) {
  if (n * d <= 32768) { /* no region (cpu_kernels.h) */
    for (int64_t i = 0; i < n; i++) {
      float r = rmsnorm_row(y + i * d, x + i * d, w, d, eps);
      if (rstd) rstd[i] = r;
    }
    return;
  }
  DS_OMP(parallel for schedule(static))
  for (int64_t i = 0; i < n; i++) {
    float r = rmsnorm_row(y + i * d, x + i * d, w, d, eps);
    if (rstd) rstd[i] = r;
  }
}

/* cpu_rmsnorm on each token's heads in place, the tokens in parallel (one call per token ran
 * serially, 7% of a bf16 prefill). */
static void cpu_rmsnorm_heads(float *x, int64_t stride, const float *w, int64_t n, int64_t heads, int64_t head_dim,
                              float eps) {
  if (n * heads * head_dim <= 32768) {
    for (int64_t t = 0; t < n; t++) cpu_rmsnorm(x + t * stride, NULL, x + t * stride, w, heads, head_dim, eps);
    return;
  }
  DS_OMP(parallel for schedule(static))
  for (int64_t t = 0; t < n; t++) cpu_rmsnorm(x + t * stride, NULL, x + t * stride, w, heads, head_dim, eps);
}

/* dx[n, d] += rstd * (w*dy - x * rstd^2 * mean(w*dy*x));  dw[d] += sum_n dy * x * rstd. */
static void cpu_rmsnorm_backward(float *dx, float *dw, const float *dy, const float *x, const float *w,
                                 const float *rstd, int64_t n, int64_t d) {
  if (dx) {
    DS_OMP(parallel for schedule(static) if (n * d > 32768))
    for (int64_t i = 0; i < n; i++) {
      const float *xi = x + i * d, *dyi = dy + i * d;
      float *dxi = dx + i * d;
      float dot = 0.0f;
      DS_OMP(simd reduction(+ : dot))
      for (int64_t j = 0; j < d; j++) dot += w[j] * dyi[j] * xi[j];
      float r = rstd[i], c = dot * r * r / (float)d;
      for (int64_t j = 0; j < d; j++) dxi[j] += r * (w[j] * dyi[j] - xi[j] * c);
    }
  }
  if (dw) {
    DS_OMP(parallel for schedule(static) if (n * d > 32768))
    for (int64_t j0 = 0; j0 < d; j0 += COL_CHUNK) {
      int64_t jc = d - j0 < COL_CHUNK ? d - j0 : COL_CHUNK;
      float acc[COL_CHUNK] = {0};
      for (int64_t i = 0; i < n; i++) {
        const float *xi = x + i * d + j0, *dyi = dy + i * d + j0;
        float r = rstd[i];
        for (int64_t j = 0; j < jc; j++) acc[j] += dyi[j] * (xi[j] * r);
      }
      for (int64_t j = 0; j < jc; j++) dw[j0 + j] += acc[j];
    }
  }
}

/* ---------------------------------------------------------------- rope */

/* cos and sin of angle = pos[t] * inv_freq[i] in fp32 (as transformers computes inv_freq @
 * position_ids) for the rows of a call. q and k of every layer rotate the same positions, so the
 * calling thread keeps the last table and reuses it when positions and frequencies are the same
 * (n + half compares instead of 2 n half libm calls, which took 7% of a prefill). */
typedef struct {
  int64_t n, half;          /* of the table held */
  int64_t cap, cap_half;    /* what the buffers hold */
  int64_t *pos;
  float *freq, *cs, *sn;
} rope_table;

static _Thread_local rope_table tl_rope;

/* cs[i], sn[i] = cos, sin of (float)p * inv_freq[i] */
static inline void rope_angles(float p, const float *inv_freq, int64_t half, float *cs, float *sn) {
  for (int64_t i = 0; i < half; i++) {
    float ang = p * inv_freq[i];
    cs[i] = cosf(ang);
    sn[i] = sinf(ang);
  }
}

static const rope_table *rope_table_for(const int64_t *pos, const float *inv_freq, int64_t n, int64_t half) {
  rope_table *r = &tl_rope;
  if (n <= 0 || half <= 0) return NULL;
  if (r->n == n && r->half == half && memcmp(r->pos, pos, (size_t)n * sizeof *pos) == 0 &&
      memcmp(r->freq, inv_freq, (size_t)half * sizeof *inv_freq) == 0)
    return r;
  if (n > r->cap || half > r->cap_half) {
    int64_t cap = n > r->cap ? n : r->cap, h = half > r->cap_half ? half : r->cap_half;
    free(r->pos), free(r->freq), free(r->cs), free(r->sn);
    r->pos = malloc((size_t)cap * sizeof *r->pos);
    r->freq = malloc((size_t)h * sizeof *r->freq);
    r->cs = malloc((size_t)(cap * h) * sizeof *r->cs);
    r->sn = malloc((size_t)(cap * h) * sizeof *r->sn);
    r->n = r->half = r->cap = r->cap_half = 0;
    if (!r->pos || !r->freq || !r->cs || !r->sn) return NULL; /* the caller computes per row */
    r->cap = cap, r->cap_half = h;
  }
  memcpy(r->pos, pos, (size_t)n * sizeof *pos);
  memcpy(r->freq, inv_freq, (size_t)half * sizeof *inv_freq);
  if (n * half <= 4096) {
    for (int64_t t = 0; t < n; t++) rope_angles((float)pos[t], inv_freq, half, r->cs + t * half, r->sn + t * half);
  } else {
    DS_OMP(parallel for schedule(static))
    for (int64_t t = 0; t < n; t++) rope_angles((float)pos[t], inv_freq, half, r->cs + t * half, r->sn + t * half);
  }
  r->n = n, r->half = half;
  return r;
}

/* Token t's heads of x (row stride `stride`) rotated in place by sign * angle, its cos and sin
 * from the table (or computed, without one). */
static inline void rope_row(float *x, int64_t stride, const int64_t *pos, const float *inv_freq, const rope_table *tab,
                            int64_t t, int64_t heads, int64_t head_dim, float sign) {
  int64_t half = head_dim / 2;
  float cs[1024], sn[1024]; /* head_dim <= 2048 is checked at model load */
  const float *c = cs, *s = sn;
  if (tab) c = tab->cs + t * half, s = tab->sn + t * half;
  else rope_angles((float)pos[t], inv_freq, half, cs, sn); /* no table (out of memory) */
  for (int64_t i = 0; i < half; i++) sn[i] = sign * s[i]; /* sign is +-1: exact */
  for (int64_t h = 0; h < heads; h++) {
    float *v = x + t * stride + h * head_dim;
    for (int64_t i = 0; i < half; i++) {
      float a = v[i], b = v[i + half];
      v[i] = a * c[i] - b * sn[i];
      v[i + half] = b * c[i] + a * sn[i];
    }
  }
}

/* Rotates x[n, heads, head_dim] (row stride `stride`) in place by sign * angle; pairs (i, i + head_dim/2). */
static void rope_rotate(float *x, int64_t stride, const int64_t *pos, const float *inv_freq, int64_t n,
                        int64_t heads, int64_t head_dim, float sign) {
  const rope_table *tab = rope_table_for(pos, inv_freq, n, head_dim / 2);
  if (n * heads * head_dim <= 32768) { /* no region (cpu_kernels.h) */
    for (int64_t t = 0; t < n; t++) rope_row(x, stride, pos, inv_freq, tab, t, heads, head_dim, sign);
    return;
  }
  DS_OMP(parallel for schedule(static))
  for (int64_t t = 0; t < n; t++) rope_row(x, stride, pos, inv_freq, tab, t, heads, head_dim, sign);
}

/* x[n, heads, head_dim] (row stride `stride`) rotated in place. */
static void cpu_rope(float *x, int64_t stride, const int64_t *pos, const float *inv_freq, int64_t n, int64_t heads,
                     int64_t head_dim) {
  rope_rotate(x, stride, pos, inv_freq, n, heads, head_dim, 1.0f);
}

/* dx[n, heads, head_dim] (row stride `stride`) rotated back in place: the transpose of rope. */
static void cpu_rope_backward(float *dx, int64_t stride, const int64_t *pos, const float *inv_freq, int64_t n,
                              int64_t heads, int64_t head_dim) {
  rope_rotate(dx, stride, pos, inv_freq, n, heads, head_dim, -1.0f);
}

/* ---------------------------------------------------------------- swiglu */

/* out[n, I] = silu(gate) * up, gu[n, 2I] = (gate | up); with the vectorizing exp (2e-7 relative,
 * nn/fast_exp.h) instead of libm's scalar expf: about 10x cheaper, and 7% of a pretraining step
 * with expf (29M Qwen3, AMD EPYC Zen 4). */
static inline void swiglu_row(float *o, const float *g, const float *u, int64_t inter) {
  DS_OMP(simd)
  for (int64_t j = 0; j < inter; j++) o[j] = g[j] / (1.0f + ds_fast_expf(-g[j])) * u[j];
}

static void cpu_swiglu(float *out, const float *gu, int64_t n, int64_t inter) {
  if (n * inter <= 32768) { /* no region (cpu_kernels.h) */
    for (int64_t i = 0; i < n; i++) swiglu_row(out + i * inter, gu + i * 2 * inter, gu + i * 2 * inter + inter, inter);
    return;
  }
  DS_OMP(parallel for schedule(static))
  for (int64_t i = 0; i < n; i++) swiglu_row(out + i * inter, gu + i * 2 * inter, gu + i * 2 * inter + inter, inter);
}

/* dgu[n, 2I] += (dout * up * silu'(gate) | dout * silu(gate)), silu'(g) = s (1 + g (1 - s)), s = sigmoid(g). */
static void cpu_swiglu_backward(float *dgu, const float *dout, const float *gu, int64_t n, int64_t inter) {
  DS_OMP(parallel for schedule(static) if (n * inter > 32768))
  for (int64_t i = 0; i < n; i++) {
    const float *g = gu + i * 2 * inter, *u = g + inter, *d = dout + i * inter;
    float *dg = dgu + i * 2 * inter, *du = dg + inter;
    DS_OMP(simd)
    for (int64_t j = 0; j < inter; j++) {
      float s = 1.0f / (1.0f + ds_fast_expf(-g[j]));
      dg[j] += d[j] * u[j] * s * (1.0f + g[j] * (1.0f - s));
      du[j] += d[j] * g[j] * s;
    }
  }
}

/* ---------------------------------------------------------------- add */

/* y[n] += x[n] */
static void cpu_add(float *y, const float *x, int64_t n) {
  if (n <= 65536) { /* no region (cpu_kernels.h) */
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
    return;
  }
  DS_OMP(parallel for simd schedule(static))
  for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

/* ---------------------------------------------------------------- embedding */

/* out[n, d] = table[ids[i]] rows. */
static void cpu_embedding(float *out, const float *table, const int32_t *ids, int64_t n, int64_t d) {
  if (n * d <= 65536) { /* no region (cpu_kernels.h) */
    for (int64_t i = 0; i < n; i++) memcpy(out + i * d, table + (int64_t)ids[i] * d, (size_t)d * sizeof(float));
    return;
  }
  DS_OMP(parallel for schedule(static))
  for (int64_t i = 0; i < n; i++) memcpy(out + i * d, table + (int64_t)ids[i] * d, (size_t)d * sizeof(float));
}

/* dtable[V, d] += dout[i] at row ids[i] (ids[i] != skip_id). Each task owns COL_CHUNK columns
 * and walks the rows in order: no race, and the same sums for any thread count. */
static void cpu_embedding_backward(float *dtable, const float *dout, const int32_t *ids, int64_t n, int64_t d,
                                   int64_t skip_id) {
  DS_OMP(parallel for schedule(static) if (n * d > 65536))
  for (int64_t j0 = 0; j0 < d; j0 += COL_CHUNK) {
    int64_t jc = d - j0 < COL_CHUNK ? d - j0 : COL_CHUNK;
    for (int64_t i = 0; i < n; i++) {
      if (ids[i] == skip_id) continue;
      float *dst = dtable + (int64_t)ids[i] * d + j0;
      const float *src = dout + i * d + j0;
      for (int64_t j = 0; j < jc; j++) dst[j] += src[j];
    }
  }
}

static const ds_backend k_cpu = {
    .name = "cpu",
    .linear = cpu_linear,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .attention_causal = ds_cpu_attention_causal,
    .attention_causal_f16 = ds_cpu_attention_causal_f16,
    .attention_causal_seqs = ds_cpu_attention_causal_seqs,
    .swiglu = cpu_swiglu,
    .add = cpu_add,
    .linear_backward = cpu_linear_backward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .rope_backward = cpu_rope_backward,
    .swiglu_backward = cpu_swiglu_backward,
    .block_attention = ds_cpu_block_attention,
    .block_attention_backward = ds_cpu_block_attention_backward,
    .attention_causal_train = ds_cpu_attention_causal_train,
    .attention_causal_train_backward = ds_cpu_attention_causal_train_backward,
    .embedding = cpu_embedding,
    .embedding_backward = cpu_embedding_backward,
    .linear_w = cpu_linear_w,
    .linear_w_cat = cpu_linear_w_cat,
    .rmsnorm_heads = cpu_rmsnorm_heads,
    .linear_w_backward = cpu_linear_w_backward,
    .embedding_w = cpu_embedding_w,
    .prepare_weight = cpu_prepare_weight,
    .alloc = ds_host_alloc,
    .free = ds_host_free,
    .copy_to_device = ds_host_copy,
    .copy_to_host = ds_host_copy,
    .copy = ds_host_copy,
    .copy_rows = ds_host_copy_rows,
    .copy_rows_f16 = ds_cpu_copy_rows_f16,
    .memset_zero = ds_host_memset_zero,
    .synchronize = ds_host_synchronize,
    .operand_hold = ds_cpu_bf16_hold,
    .operand_release = ds_cpu_bf16_release,
};

const ds_backend *ds_backend_cpu(void) { return &k_cpu; }


