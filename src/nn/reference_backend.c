/* Naive reference kernels: plain loops with double accumulation, written for clarity, used
 * by the tests to check the optimized backend. Never used on a hot path. Each forward sits
 * next to its backward; backward kernels ADD into the gradient buffers they are given and
 * skip the NULL ones (include/dspark/backend.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/backend.h"
#include "dspark/common.h"
#include "dspark/dtype.h"
#include "dspark/ggml_quant.h"
#include "nn/host_memory.h"
#include "nn/linear_cat.h"

static void ref_linear(float *y, const float *x, const float *w, const float *bias, int64_t n, int64_t in,
                       int64_t out) {
  for (int64_t i = 0; i < n; i++)
    for (int64_t o = 0; o < out; o++) {
      double s = bias ? bias[o] : 0.0;
      for (int64_t p = 0; p < in; p++) s += (double)x[i * in + p] * w[o * in + p];
      y[i * out + o] = (float)s;
    }
}

/* dx[n, in] += dy[n, out] @ w[out, in];  dw[out, in] += dy^T @ x;  db[out] += sum_n dy. */
static void ref_linear_backward(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w,
                                int64_t n, int64_t in, int64_t out) {
  for (int64_t i = 0; dx && i < n; i++)
    for (int64_t p = 0; p < in; p++) {
      double s = 0.0;
      for (int64_t o = 0; o < out; o++) s += (double)dy[i * out + o] * w[o * in + p];
      dx[i * in + p] += (float)s;
    }
  for (int64_t o = 0; dw && o < out; o++)
    for (int64_t p = 0; p < in; p++) {
      double s = 0.0;
      for (int64_t i = 0; i < n; i++) s += (double)dy[i * out + o] * x[i * in + p];
      dw[o * in + p] += (float)s;
    }
  for (int64_t o = 0; db && o < out; o++) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += dy[i * out + o];
    db[o] += (float)s;
  }
}

/* Element idx of a frozen weight, converted with the core's scalar conversions. */
static double ref_weight_at(ds_weight w, int64_t idx) {
  if (w.dtype == DS_F32) return ((const float *)w.data)[idx];
  uint16_t h = ((const uint16_t *)w.data)[idx];
  DS_CHECK(w.dtype == DS_BF16 || w.dtype == DS_F16);
  return w.dtype == DS_BF16 ? ds_bf16_to_f32(h) : ds_f16_to_f32(h);
}

/* A quantized weight [rows, cols] dequantized whole (the core's dequantizers: gguf.quants' values
 * to the bit) into a malloc'd F32 weight; any other weight as it is. */
static ds_weight ref_dequantized(ds_weight w, int64_t rows, int64_t cols) {
  if (!ds_dtype_is_quantized(w.dtype)) return w;
  float *f = malloc((size_t)(rows * cols) * sizeof *f);
  DS_CHECK(f != NULL);
  size_t rb = ds_quant_row_bytes(w.dtype, cols);
  for (int64_t r = 0; r < rows; r++)
    ds_ggml_dequantize_row((uint32_t)ds_dtype_ggml_type(w.dtype), (const unsigned char *)w.data + (size_t)r * rb,
                           f + r * cols, cols);
  return (ds_weight){f, DS_F32};
}

static void ref_release(ds_weight used, ds_weight given) {
  if (used.data != given.data) free((void *)used.data);
}

/* y[n, out] (row stride ldy) = x[n, in] @ w[out, in]^T (+ bias[out]), w in F32 / BF16 / F16 or
 * quantized (dequantized first). */
static void ref_linear_w(float *y, int64_t ldy, const float *x, ds_weight given, const float *bias, int64_t n,
                         int64_t in, int64_t out) {
  ds_weight w = ref_dequantized(given, out, in);
  for (int64_t i = 0; i < n; i++)
    for (int64_t o = 0; o < out; o++) {
      double s = bias ? bias[o] : 0.0;
      for (int64_t p = 0; p < in; p++) s += (double)x[i * in + p] * ref_weight_at(w, o * in + p);
      y[i * ldy + o] = (float)s;
    }
  ref_release(w, given);
}

static void ref_linear_w_cat(float *y, int64_t ldy, const float *x, const ds_weight *w, const int64_t *out, int n_seg,
                             const float *bias, int64_t n, int64_t in) {
  ds_linear_w_each_segment(ref_linear_w, y, ldy, x, w, out, n_seg, bias, n, in);
}

/* dx[n, in] += dy[n, out] @ w[out, in] */
static void ref_linear_w_backward(float *dx, const float *dy, ds_weight given, int64_t n, int64_t in, int64_t out) {
  ds_weight w = ref_dequantized(given, out, in);
  for (int64_t i = 0; i < n; i++)
    for (int64_t p = 0; p < in; p++) {
      double s = 0.0;
      for (int64_t o = 0; o < out; o++) s += (double)dy[i * out + o] * ref_weight_at(w, o * in + p);
      dx[i * in + p] += (float)s;
    }
  ref_release(w, given);
}

/* y[n, d] = table[ids[i], :] */
/* The reference reads every weight as stored: nothing to prepare. */
static void ref_prepare_weight(ds_weight w, int64_t rows, int64_t in) { (void)w, (void)rows, (void)in; }

static void ref_embedding_w(float *y, const int32_t *ids, ds_weight table, int64_t n, int64_t d) {
  if (ds_dtype_is_quantized(table.dtype)) { /* one row at a time: the table may be a vocabulary */
    size_t rb = ds_quant_row_bytes(table.dtype, d);
    for (int64_t i = 0; i < n; i++)
      ds_ggml_dequantize_row((uint32_t)ds_dtype_ggml_type(table.dtype),
                             (const unsigned char *)table.data + (size_t)ids[i] * rb, y + i * d, d);
    return;
  }
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < d; j++) y[i * d + j] = (float)ref_weight_at(table, (int64_t)ids[i] * d + j);
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

static void ref_rmsnorm_heads(float *x, int64_t stride, const float *w, int64_t n, int64_t heads, int64_t head_dim,
                              float eps) {
  for (int64_t t = 0; t < n; t++) ref_rmsnorm(x + t * stride, NULL, x + t * stride, w, heads, head_dim, eps);
}

/* With r = rstd[i] (the forward's): y_j = w_j x_j r and dr/dx_k = -r^3 x_k / d, so
 * dx[n, d] += r (w dy - x r^2 mean(w dy x));  dw[d] += sum_n dy x r. */
static void ref_rmsnorm_backward(float *dx, float *dw, const float *dy, const float *x, const float *w,
                                 const float *rstd, int64_t n, int64_t d) {
  for (int64_t i = 0; dx && i < n; i++) {
    const float *xi = x + i * d, *dyi = dy + i * d;
    double r = rstd[i], dot = 0.0;
    for (int64_t j = 0; j < d; j++) dot += (double)w[j] * dyi[j] * xi[j];
    for (int64_t j = 0; j < d; j++)
      dx[i * d + j] += (float)(r * ((double)w[j] * dyi[j] - xi[j] * r * r * dot / (double)d));
  }
  for (int64_t j = 0; dw && j < d; j++) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)dy[i * d + j] * x[i * d + j] * rstd[i];
    dw[j] += (float)s;
  }
}

/* Rotates x[n, heads, head_dim] (row stride `stride`) in place by sign * angle; the angle is
 * pos * inv_freq rounded to fp32 as transformers computes it, its cos/sin in double. */
static void ref_rope_rotate(float *x, int64_t stride, const int64_t *pos, const float *inv_freq, int64_t n,
                            int64_t heads, int64_t head_dim, double sign) {
  int64_t half = head_dim / 2;
  for (int64_t t = 0; t < n; t++)
    for (int64_t h = 0; h < heads; h++) {
      float *v = x + t * stride + h * head_dim;
      for (int64_t i = 0; i < half; i++) {
        double ang = (double)((float)pos[t] * inv_freq[i]);
        double c = cos(ang), s = sign * sin(ang);
        double a = v[i], b = v[i + half];
        v[i] = (float)(a * c - b * s);
        v[i + half] = (float)(b * c + a * s);
      }
    }
}

/* x[n, heads, head_dim] rotated in place (pairs i, i + head_dim/2). */
static void ref_rope(float *x, int64_t stride, const int64_t *pos, const float *inv_freq, int64_t n, int64_t heads,
                     int64_t head_dim) {
  ref_rope_rotate(x, stride, pos, inv_freq, n, heads, head_dim, 1.0);
}

/* dx[n, heads, head_dim] rotated back in place (the transpose of the rotation). */
static void ref_rope_backward(float *dx, int64_t stride, const int64_t *pos, const float *inv_freq, int64_t n,
                              int64_t heads, int64_t head_dim) {
  ref_rope_rotate(dx, stride, pos, inv_freq, n, heads, head_dim, -1.0);
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

/* dgu[n, 2I] += (dout * up * silu'(gate) | dout * silu(gate)), silu'(g) = s (1 + g (1 - s)). */
static void ref_swiglu_backward(float *dgu, const float *dout, const float *gu, int64_t n, int64_t inter) {
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < inter; j++) {
      double g = gu[i * 2 * inter + j], u = gu[i * 2 * inter + inter + j], d = dout[i * inter + j];
      double s = 1.0 / (1.0 + exp(-g));
      dgu[i * 2 * inter + j] += (float)(d * u * s * (1.0 + g * (1.0 - s)));
      dgu[i * 2 * inter + inter + j] += (float)(d * g * s);
    }
}

static void ref_add(float *y, const float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

/* ---- block attention. Key t of block b (for kv head kvh) is context row t when t < ctx_len[b],
 * else row b*g + (t - ctx_len[b]) of the block keys. */
static const float *ref_key_row(const float *x_ctx, const float *x_blk, int64_t L, int64_t b, int64_t g, int64_t t,
                                int64_t kvs, int64_t kvh, int64_t hd) {
  return t < L ? x_ctx + t * kvs + kvh * hd : x_blk + (b * g + t - L) * kvs + kvh * hd;
}

/* p[0..L+g) = softmax over the visible keys of query row (block b, slot i, head h), in double;
 * returns the log-sum-exp. */
static double ref_block_probs(double *p, const float *q, const float *k_ctx, const float *k_blk, int64_t L, int64_t b,
                              int64_t i, int64_t h, int64_t g, int64_t n_heads, int64_t n_kv_heads, int64_t hd,
                              float scale) {
  int64_t kvh = h / (n_heads / n_kv_heads), kvs = n_kv_heads * hd;
  const float *qi = q + (b * g + i) * n_heads * hd + h * hd;
  double mx = -INFINITY, sum = 0.0;
  for (int64_t t = 0; t < L + g; t++) {
    const float *kt = ref_key_row(k_ctx, k_blk, L, b, g, t, kvs, kvh, hd);
    double s = 0.0;
    for (int64_t e = 0; e < hd; e++) s += (double)qi[e] * kt[e];
    p[t] = s * scale;
    if (p[t] > mx) mx = p[t];
  }
  for (int64_t t = 0; t < L + g; t++) sum += (p[t] = exp(p[t] - mx));
  for (int64_t t = 0; t < L + g; t++) p[t] /= sum;
  return mx + log(sum);
}

/* out[n_blocks*g, n_heads*hd] = softmax(q k^T * scale over context 0..ctx_len[b]-1 and the
 * block's own g keys) v; lse[n_blocks*g, n_heads]. Dropped blocks (ctx_len < 0): 0 and -inf. */
static void ref_block_attention(float *out, float *lse, const float *q, const float *k_ctx, const float *v_ctx,
                                const float *k_blk, const float *v_blk, const int64_t *ctx_len, int64_t n_ctx,
                                int64_t n_blocks, int64_t g, int64_t n_heads, int64_t n_kv_heads, int64_t hd,
                                float scale) {
  int64_t kvs = n_kv_heads * hd, group = n_heads / n_kv_heads;
  double *p = malloc((size_t)(n_ctx + g) * sizeof(double));
  DS_CHECK(p != NULL);
  for (int64_t b = 0; b < n_blocks; b++)
    for (int64_t i = 0; i < g; i++)
      for (int64_t h = 0; h < n_heads; h++) {
        int64_t L = ctx_len[b], row = b * g + i;
        float *o = out + row * n_heads * hd + h * hd;
        if (L < 0) {
          for (int64_t e = 0; e < hd; e++) o[e] = 0.0f;
          if (lse) lse[row * n_heads + h] = -INFINITY;
          continue;
        }
        DS_CHECK(L <= n_ctx);
        double l = ref_block_probs(p, q, k_ctx, k_blk, L, b, i, h, g, n_heads, n_kv_heads, hd, scale);
        if (lse) lse[row * n_heads + h] = (float)l;
        for (int64_t e = 0; e < hd; e++) {
          double s = 0.0;
          for (int64_t t = 0; t < L + g; t++) s += p[t] * ref_key_row(v_ctx, v_blk, L, b, g, t, kvs, h / group, hd)[e];
          o[e] = (float)s;
        }
      }
  free(p);
}

/* Recomputes the probabilities in double (out and lse are not needed here) and, per query row:
 *   dP_t = dO . v_t,  dS_t = P_t (dP_t - sum_u P_u dP_u),
 *   dq += scale sum_t dS_t k_t,  dk_t += scale dS_t q,  dv_t += P_t dO,
 * accumulated in double buffers that are added to the caller's at the end. */
static void ref_block_attention_backward(float *dq, float *dk_ctx, float *dv_ctx, float *dk_blk, float *dv_blk,
                                         const float *dout, const float *out, const float *lse, const float *q,
                                         const float *k_ctx, const float *v_ctx, const float *k_blk,
                                         const float *v_blk, const int64_t *ctx_len, int64_t n_ctx, int64_t n_blocks,
                                         int64_t g, int64_t n_heads, int64_t n_kv_heads, int64_t hd, float scale) {
  int64_t kvs = n_kv_heads * hd, qs = n_heads * hd, group = n_heads / n_kv_heads;
  size_t nq = (size_t)(n_blocks * g * qs), nc = (size_t)(n_ctx * kvs), nb = (size_t)(n_blocks * g * kvs);
  double *p = malloc((size_t)(n_ctx + g) * sizeof(double)), *dp = malloc((size_t)(n_ctx + g) * sizeof(double));
  double *gq = calloc(nq + 1, sizeof(double)), *gkc = calloc(nc + 1, sizeof(double));
  double *gvc = calloc(nc + 1, sizeof(double)), *gkb = calloc(nb + 1, sizeof(double));
  double *gvb = calloc(nb + 1, sizeof(double));
  DS_CHECK(p && dp && gq && gkc && gvc && gkb && gvb);
  for (int64_t b = 0; b < n_blocks; b++) {
    int64_t L = ctx_len[b];
    if (L < 0) continue; /* dropped: no gradient */
    DS_CHECK(L <= n_ctx);
    for (int64_t i = 0; i < g; i++)
      for (int64_t h = 0; h < n_heads; h++) {
        int64_t row = b * g + i, kvh = h / group;
        const float *qi = q + row * qs + h * hd, *doi = dout + row * qs + h * hd;
        ref_block_probs(p, q, k_ctx, k_blk, L, b, i, h, g, n_heads, n_kv_heads, hd, scale);
        double pdp = 0.0;
        for (int64_t t = 0; t < L + g; t++) {
          const float *vt = ref_key_row(v_ctx, v_blk, L, b, g, t, kvs, kvh, hd);
          double s = 0.0;
          for (int64_t e = 0; e < hd; e++) s += (double)doi[e] * vt[e];
          dp[t] = s;
          pdp += p[t] * s;
        }
        for (int64_t t = 0; t < L + g; t++) {
          double ds = p[t] * (dp[t] - pdp) * scale;
          const float *kt = ref_key_row(k_ctx, k_blk, L, b, g, t, kvs, kvh, hd);
          /* key t's gradient rows: context row t or block row b*g + t - L */
          double *gk = t < L ? gkc + t * kvs : gkb + (b * g + t - L) * kvs;
          double *gv = t < L ? gvc + t * kvs : gvb + (b * g + t - L) * kvs;
          for (int64_t e = 0; e < hd; e++) {
            gq[row * qs + h * hd + e] += ds * kt[e];
            gk[kvh * hd + e] += ds * qi[e];
            gv[kvh * hd + e] += p[t] * doi[e];
          }
        }
      }
  }
  for (size_t j = 0; dq && j < nq; j++) dq[j] += (float)gq[j];
  for (size_t j = 0; dk_ctx && j < nc; j++) dk_ctx[j] += (float)gkc[j];
  for (size_t j = 0; dv_ctx && j < nc; j++) dv_ctx[j] += (float)gvc[j];
  for (size_t j = 0; dk_blk && j < nb; j++) dk_blk[j] += (float)gkb[j];
  for (size_t j = 0; dv_blk && j < nb; j++) dv_blk[j] += (float)gvb[j];
  free(p); free(dp); free(gq); free(gkc); free(gvc); free(gkb); free(gvb);
}

/* ---- causal attention over packed sequences. Query row i of sequence s (position p = i -
 * seq_off[s]) sees rows seq_off[s] .. i. */

/* p[0..pos] = softmax over the visible keys of query row `row` (position pos), head h, in
 * double; returns the log-sum-exp. */
static double ref_causal_probs(double *p, const float *q, const float *k, int64_t first, int64_t row, int64_t h,
                               int64_t n_heads, int64_t n_kv_heads, int64_t hd, float scale) {
  int64_t kvh = h / (n_heads / n_kv_heads), kvs = n_kv_heads * hd, n = row - first + 1;
  const float *qi = q + row * n_heads * hd + h * hd;
  double mx = -INFINITY, sum = 0.0;
  for (int64_t t = 0; t < n; t++) {
    const float *kt = k + (first + t) * kvs + kvh * hd;
    double s = 0.0;
    for (int64_t e = 0; e < hd; e++) s += (double)qi[e] * kt[e];
    p[t] = s * scale;
    if (p[t] > mx) mx = p[t];
  }
  for (int64_t t = 0; t < n; t++) sum += (p[t] = exp(p[t] - mx));
  for (int64_t t = 0; t < n; t++) p[t] /= sum;
  return mx + log(sum);
}

/* out[rows, n_heads*hd] = softmax(q k^T * scale, causal within each sequence) v; lse[rows, n_heads]. */
/* The f16 cache widened to fp32 whole, then the reference attention. */
static void ref_attention_causal_f16(float *out, const float *q, int64_t q_stride, const uint16_t *k, const uint16_t *v,
                                     int64_t n, int64_t past, int64_t cap, int64_t n_heads, int64_t n_kv_heads,
                                     int64_t head_dim, float scale) {
  size_t cells = (size_t)(n_kv_heads * cap * head_dim);
  float *kf = malloc(cells * sizeof(float)), *vf = malloc(cells * sizeof(float));
  if (!kf || !vf) abort();
  for (size_t i = 0; i < cells; i++) kf[i] = ds_f16_to_f32(k[i]), vf[i] = ds_f16_to_f32(v[i]);
  ref_attention_causal(out, q, q_stride, kf, vf, n, past, cap, n_heads, n_kv_heads, head_dim, scale);
  free(kf);
  free(vf);
}

static void ref_copy_rows_f16(uint16_t *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows,
                              int64_t cols) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) dst[r * ld_dst + c] = ds_f32_to_f16(src[r * ld_src + c]);
}

static void ref_attention_causal_train(float *out, float *lse, const float *q, const float *k, const float *v,
                                       const int64_t *seq_off, int64_t n_seqs, int64_t n_heads, int64_t n_kv_heads,
                                       int64_t hd, float scale) {
  int64_t kvs = n_kv_heads * hd, group = n_heads / n_kv_heads, max_len = 0;
  for (int64_t s = 0; s < n_seqs; s++)
    if (seq_off[s + 1] - seq_off[s] > max_len) max_len = seq_off[s + 1] - seq_off[s];
  double *p = malloc((size_t)(max_len + 1) * sizeof(double));
  DS_CHECK(p != NULL);
  for (int64_t s = 0; s < n_seqs; s++)
    for (int64_t row = seq_off[s]; row < seq_off[s + 1]; row++)
      for (int64_t h = 0; h < n_heads; h++) {
        double l = ref_causal_probs(p, q, k, seq_off[s], row, h, n_heads, n_kv_heads, hd, scale);
        if (lse) lse[row * n_heads + h] = (float)l;
        for (int64_t e = 0; e < hd; e++) {
          double o = 0.0;
          for (int64_t t = 0; t <= row - seq_off[s]; t++) o += p[t] * v[(seq_off[s] + t) * kvs + (h / group) * hd + e];
          out[row * n_heads * hd + h * hd + e] = (float)o;
        }
      }
  free(p);
}

/* Recomputes the probabilities in double (out and lse are not needed here) and, per query row:
 *   dP_t = dO . v_t,  dS_t = P_t (dP_t - sum_u P_u dP_u),
 *   dq += scale sum_t dS_t k_t,  dk_t += scale dS_t q,  dv_t += P_t dO,
 * accumulated in double buffers that are added to the caller's at the end. */
static void ref_attention_causal_train_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                                const float *lse, const float *q, const float *k, const float *v,
                                                const int64_t *seq_off, int64_t n_seqs, int64_t n_heads,
                                                int64_t n_kv_heads, int64_t hd, float scale) {
  int64_t kvs = n_kv_heads * hd, qs = n_heads * hd, group = n_heads / n_kv_heads, rows = n_seqs ? seq_off[n_seqs] : 0;
  int64_t max_len = 0;
  for (int64_t s = 0; s < n_seqs; s++)
    if (seq_off[s + 1] - seq_off[s] > max_len) max_len = seq_off[s + 1] - seq_off[s];
  size_t nq = (size_t)(rows * qs), nk = (size_t)(rows * kvs);
  double *p = malloc((size_t)(max_len + 1) * sizeof(double)), *dp = malloc((size_t)(max_len + 1) * sizeof(double));
  double *gq = calloc(nq + 1, sizeof(double)), *gk = calloc(nk + 1, sizeof(double)), *gv = calloc(nk + 1, sizeof(double));
  DS_CHECK(p && dp && gq && gk && gv);
  for (int64_t s = 0; s < n_seqs; s++)
    for (int64_t row = seq_off[s]; row < seq_off[s + 1]; row++)
      for (int64_t h = 0; h < n_heads; h++) {
        int64_t kvh = h / group, n = row - seq_off[s] + 1;
        const float *qi = q + row * qs + h * hd, *doi = dout + row * qs + h * hd;
        ref_causal_probs(p, q, k, seq_off[s], row, h, n_heads, n_kv_heads, hd, scale);
        double pdp = 0.0;
        for (int64_t t = 0; t < n; t++) {
          const float *vt = v + (seq_off[s] + t) * kvs + kvh * hd;
          double acc = 0.0;
          for (int64_t e = 0; e < hd; e++) acc += (double)doi[e] * vt[e];
          dp[t] = acc;
          pdp += p[t] * acc;
        }
        for (int64_t t = 0; t < n; t++) {
          double ds = p[t] * (dp[t] - pdp) * scale;
          int64_t key = (seq_off[s] + t) * kvs + kvh * hd;
          for (int64_t e = 0; e < hd; e++) {
            gq[row * qs + h * hd + e] += ds * k[key + e];
            gk[key + e] += ds * qi[e];
            gv[key + e] += p[t] * doi[e];
          }
        }
      }
  for (size_t j = 0; dq && j < nq; j++) dq[j] += (float)gq[j];
  for (size_t j = 0; dk && j < nk; j++) dk[j] += (float)gk[j];
  for (size_t j = 0; dv && j < nk; j++) dv[j] += (float)gv[j];
  free(p); free(dp); free(gq); free(gk); free(gv);
}

/* ---- embedding */

static void ref_embedding(float *out, const float *table, const int32_t *ids, int64_t n, int64_t d) {
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < d; j++) out[i * d + j] = table[(int64_t)ids[i] * d + j];
}

/* dtable[ids[i]] += dout[i] (rows in order), skipping ids[i] == skip_id. */
static void ref_embedding_backward(float *dtable, const float *dout, const int32_t *ids, int64_t n, int64_t d,
                                   int64_t skip_id) {
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; ids[i] != skip_id && j < d; j++) dtable[(int64_t)ids[i] * d + j] += dout[i * d + j];
}

/* A call a sequence. */
static void ref_attention_causal_seqs(float *out, const float *q, int64_t q_stride, const void *const *k,
                                      const void *const *v, int f16, const int64_t *n, const int64_t *past,
                                      const int64_t *cap, int n_seqs, int64_t n_heads, int64_t n_kv_heads,
                                      int64_t head_dim, float scale) {
  int64_t row = 0;
  for (int s = 0; s < n_seqs; row += n[s++])
    if (f16)
      ref_attention_causal_f16(out + row * n_heads * head_dim, q + row * q_stride, q_stride, k[s], v[s], n[s], past[s],
                               cap[s], n_heads, n_kv_heads, head_dim, scale);
    else
      ref_attention_causal(out + row * n_heads * head_dim, q + row * q_stride, q_stride, k[s], v[s], n[s], past[s],
                           cap[s], n_heads, n_kv_heads, head_dim, scale);
}

static const ds_backend k_reference = {
    .name = "reference",
    .linear = ref_linear,
    .rmsnorm = ref_rmsnorm,
    .rope = ref_rope,
    .attention_causal = ref_attention_causal,
    .attention_causal_f16 = ref_attention_causal_f16,
    .attention_causal_seqs = ref_attention_causal_seqs,
    .swiglu = ref_swiglu,
    .add = ref_add,
    .linear_backward = ref_linear_backward,
    .rmsnorm_backward = ref_rmsnorm_backward,
    .rope_backward = ref_rope_backward,
    .swiglu_backward = ref_swiglu_backward,
    .block_attention = ref_block_attention,
    .block_attention_backward = ref_block_attention_backward,
    .attention_causal_train = ref_attention_causal_train,
    .attention_causal_train_backward = ref_attention_causal_train_backward,
    .embedding = ref_embedding,
    .embedding_backward = ref_embedding_backward,
    .linear_w = ref_linear_w,
    .linear_w_backward = ref_linear_w_backward,
    .embedding_w = ref_embedding_w,
    .prepare_weight = ref_prepare_weight,
    .alloc = ds_host_alloc,
    .free = ds_host_free,
    .copy_to_device = ds_host_copy,
    .copy_to_host = ds_host_copy,
    .copy = ds_host_copy,
    .copy_rows = ds_host_copy_rows,
    .copy_rows_f16 = ref_copy_rows_f16,
    .memset_zero = ds_host_memset_zero,
    .synchronize = ds_host_synchronize,
    .linear_w_cat = ref_linear_w_cat,
    .rmsnorm_heads = ref_rmsnorm_heads,
    .operand_hold = ds_host_operand_hold,
    .operand_release = ds_host_operand_release,
};

const ds_backend *ds_backend_reference(void) { return &k_reference; }
