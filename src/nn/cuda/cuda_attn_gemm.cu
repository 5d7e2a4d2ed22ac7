/* The GEMM-based attention (cuda_attn_gemm.h for the chunk layout). Per chunk, forward:
 *   Qh = gather(q);  S[:, :, 0:Lc] = scale Qh K^T;  S[:, :, Lc:Lc+g] = block dots;
 *   P = masked softmax(S) (lse saved);  Oh = P[:, :, 0:Lc] V;  out = scatter(Oh + P_blk V_blk).
 * Backward (P recomputed from the saved lse, D = rowsum(dO * O)):
 *   S, dP = dOh V^T (+ block dots);  P = exp(S - lse), dS = P (dP - D);
 *   dq += scale dS K (+ block part);  dK += scale dS^T Qh;  dV += P^T dOh;  block keys' dk, dv.
 * GEMMs: cuBLAS strided-batched, one batch entry per kv head (the group's query heads stacked
 * as rows), CUBLAS_COMPUTE_32F (no TF32 in the fp32 mode; bf16 inputs on tensor cores in the
 * bf16 mode). Kernels: fp32, accurate expf / logf, sums in a fixed order (no atomics). */
#include <cuda_bf16.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>

#include "nn/cuda/cuda_attn_gemm.h"

namespace {

constexpr int kThreads = 256;
constexpr int64_t kWarps = kThreads / 32;

__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* Column c of a chunk's score row is seen when it is a visible context key (lo <= c < nv) or
 * one of the block's own keys (c >= Lc). */
__device__ bool col_seen(int64_t c, int64_t lo, int64_t nv, int64_t Lc) { return (c >= lo && c < nv) || c >= Lc; }

/* dst[h, r, e] (dt: F32, or BF16 rounded to nearest even) = src[row(r) * row_stride + h *
 * head_stride + e], row(r) = row ? row[r] : r.  dst [H, R, hd]. */
__global__ void gather_heads_kernel(void *dst, ds_dtype dt, const float *src, int64_t row_stride,
                                    int64_t head_stride, const int64_t *row, int64_t R, int64_t H, int64_t hd) {
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < H * R * hd;
       idx += (int64_t)gridDim.x * blockDim.x) {
    int64_t e = idx % hd, r = (idx / hd) % R, h = idx / (hd * R);
    float x = src[(row ? row[r] : r) * row_stride + h * head_stride + e];
    if (dt == DS_BF16) ((__nv_bfloat16 *)dst)[idx] = __float2bfloat16_rn(x);
    else ((float *)dst)[idx] = x;
  }
}

/* S[h, r, Lc + j] = alpha * x[row[r], h] . y[b0 + j, h / group], j < g, b0 = row[r] / g * g (the
 * block's first row): the block keys' scores, g x g per block and head.  S [H, R, ld]; x rows of
 * x_stride floats, head h at h * hd; y [rows, n_kv * hd]. One warp per (h, r); dropped rows
 * (vis < 0) are left alone (the softmax does not read them). */
__global__ void block_dots_kernel(float *S, int64_t ld, int64_t Lc, const float *x, int64_t x_stride,
                                  const float *y, float alpha, const int64_t *row, const int64_t *vis, int64_t R,
                                  int64_t H, int64_t n_kv, int64_t hd, int64_t g) {
  int lane = threadIdx.x & 31;
  int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5), group = H / n_kv;
  for (int64_t w = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5); w < H * R; w += warps) {
    int64_t h = w / R, r = w % R;
    if (vis[r] < 0) continue; /* uniform over the warp */
    const float *xr = x + row[r] * x_stride + h * hd;
    const float *yb = y + (row[r] / g * g) * n_kv * hd + (h / group) * hd;
    for (int64_t j = 0; j < g; j++) {
      float s = 0.0f;
      for (int64_t e = lane; e < hd; e += 32) s += xr[e] * yb[j * n_kv * hd + e];
      s = warp_sum(s);
      if (lane == 0) S[w * ld + Lc + j] = alpha * s;
    }
  }
}

/* Row w = (h, r) of S [H, R, ld]: P = softmax over the seen columns (col_seen, lo = lo[r] or 0
 * when lo is NULL, nv = min(vis[r], Lc)), 0 on the other columns of 0 .. Lc+g-1; in place, or, when P16 [H, R, ld] is non-NULL,
 * rounded to bf16 there and in place only on the block keys' columns (the only fp32 ones read
 * after: less memory traffic); lse[row[r] * H + h] = log-sum-exp when lse != NULL. A dropped row (vis <
 * 0) or one that sees nothing: P = 0, lse = -inf. One warp per row: each lane keeps an online
 * max and sum, then a butterfly combines them (commutative steps: every lane gets the same bits). */
__global__ void softmax_kernel(float *S, __nv_bfloat16 *P16, int64_t ld, int64_t Lc, int64_t g,
                               const int64_t *row, const int64_t *lo, const int64_t *vis, float *lse, int64_t R,
                               int64_t H) {
  int lane = threadIdx.x & 31;
  int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5), n = Lc + g;
  for (int64_t w = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5); w < H * R; w += warps) {
    int64_t r = w % R, nv = vis[r] < Lc ? vis[r] : Lc, lo_r = lo ? lo[r] : 0;
    float *s = S + w * ld, m = -INFINITY, l = 0.0f;
    if (vis[r] >= 0) { /* uniform over the warp */
      for (int64_t c = lane; c < n; c += 32) {
        if (!col_seen(c, lo_r, nv, Lc)) continue;
        float x = s[c];
        if (x > m) {
          l = l * expf(m - x) + 1.0f; /* m = -inf at first: l = 0 * 0 + 1 */
          m = x;
        } else {
          l += expf(x - m);
        }
      }
      for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), l2 = __shfl_xor_sync(0xffffffffu, l, o);
        float mn = fmaxf(m, m2);
        l = mn == -INFINITY ? 0.0f : l * expf(m - mn) + l2 * expf(m2 - mn);
        m = mn;
      }
    }
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int64_t c = lane; c < n; c += 32) {
      float p = l > 0.0f && col_seen(c, lo_r, nv, Lc) ? expf(s[c] - m) * inv : 0.0f;
      if (!P16 || c >= Lc) s[c] = p;
      if (P16) P16[w * ld + c] = __float2bfloat16_rn(p);
    }
    if (lse && lane == 0) lse[row[r] * H + w / R] = l > 0.0f ? m + logf(l) : -INFINITY;
  }
}

/* Row w = (h, r), the backward: on the seen columns P = exp(S - lse[row[r], h]) and dS = P * (dP -
 * D[row[r], h]), 0 elsewhere (of 0 .. Lc+g-1). P over S and dS over dP, or, when P16 and dS16
 * are non-NULL, rounded to bf16 there and over S / dP only on the block keys' columns (all
 * [H, R, ld]). One warp per row. */
__global__ void dsoftmax_kernel(float *S, float *dP, __nv_bfloat16 *P16, __nv_bfloat16 *dS16, int64_t ld,
                                int64_t Lc, int64_t g, const int64_t *row, const int64_t *lo, const int64_t *vis,
                                const float *lse, const float *D, int64_t R, int64_t H) {
  int lane = threadIdx.x & 31;
  int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5), n = Lc + g;
  for (int64_t w = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5); w < H * R; w += warps) {
    int64_t r = w % R, h = w / R, nv = vis[r] < Lc ? vis[r] : Lc, lo_r = lo ? lo[r] : 0;
    float row_lse = lse[row[r] * H + h], row_d = D[row[r] * H + h];
    bool live = vis[r] >= 0 && row_lse != -INFINITY;
    for (int64_t c = lane; c < n; c += 32) {
      int64_t i = w * ld + c;
      float p = live && col_seen(c, lo_r, nv, Lc) ? expf(S[i] - row_lse) : 0.0f;
      float ds = p == 0.0f ? 0.0f : p * (dP[i] - row_d);
      if (!P16 || c >= Lc) {
        S[i] = p;
        dP[i] = ds;
      }
      if (P16) {
        P16[i] = __float2bfloat16_rn(p);
        dS16[i] = __float2bfloat16_rn(ds);
      }
    }
  }
}

/* dst[row[r] * H * hd + h * hd + e] (add: +=, else =) Oh[h, r, e] (when Oh != NULL) + alpha *
 * sum_{j<g} W[h, r, Lc + j] * y[(b0 + j) * n_kv * hd + (h / group) * hd + e], b0 = row[r] / g *
 * g: a chunk's rows back in place, with the block keys' share (P_blk V_blk, or dS_blk K_blk).
 * A dropped row (vis < 0) gets 0 (forward) or nothing (add). Oh [H, R, hd], W [H, R, ld]. */
__global__ void scatter_kernel(float *dst, int add, const float *Oh, const float *W, int64_t ld, int64_t Lc,
                               const float *y, float alpha, const int64_t *row, const int64_t *vis, int64_t R,
                               int64_t H, int64_t n_kv, int64_t hd, int64_t g) {
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < H * R * hd;
       idx += (int64_t)gridDim.x * blockDim.x) {
    int64_t e = idx % hd, r = (idx / hd) % R, h = idx / (hd * R);
    float *d = dst + row[r] * H * hd + h * hd + e;
    if (vis[r] < 0) {
      if (!add) *d = 0.0f;
      continue;
    }
    float x = Oh ? Oh[idx] : 0.0f, b = 0.0f;
    if (g > 0) {
      const float *w = W + (h * R + r) * ld + Lc, *yb = y + (row[r] / g * g) * n_kv * hd + (h / (H / n_kv)) * hd + e;
      for (int64_t j = 0; j < g; j++) b += w[j] * yb[j * n_kv * hd];
      x += alpha * b;
    }
    *d = add ? *d + x : x;
  }
}

/* The block keys' gradient: dy[(b0 + j) * n_kv * hd + kvh * hd + e] += alpha * sum over the
 * heads h of kv head kvh, then the rows t < g of the block (in that order) of W[h, i * g + t,
 * Lc + j] * x[row[i * g + t] * x_stride + h * hd + e], for block i of the chunk (rows i * g ..
 * i * g + g - 1, b0 = row[i * g]), j < g.  W [H, R, ld]. One thread per (i, j, kvh, e): each
 * element is summed by one thread. */
__global__ void block_kv_grad_kernel(float *dy, const float *W, int64_t ld, int64_t Lc, const float *x,
                                     int64_t x_stride, float alpha, const int64_t *row, int64_t R, int64_t H,
                                     int64_t n_kv, int64_t hd, int64_t g) {
  int64_t group = H / n_kv;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < R * n_kv * hd;
       idx += (int64_t)gridDim.x * blockDim.x) {
    int64_t e = idx % hd, kvh = (idx / hd) % n_kv, ij = idx / (hd * n_kv), j = ij % g, i = ij / g;
    float acc = 0.0f;
    for (int64_t h = kvh * group; h < (kvh + 1) * group; h++)
      for (int64_t t = 0; t < g; t++) {
        int64_t r = i * g + t;
        acc += W[(h * R + r) * ld + Lc + j] * x[row[r] * x_stride + h * hd + e];
      }
    dy[(row[i * g] + j) * n_kv * hd + kvh * hd + e] += alpha * acc;
  }
}

/* One warp per (row, head): D = dout . out. */
__global__ void rowsum_kernel(float *D, const float *dout, const float *out, int64_t rows, int64_t n_heads,
                              int64_t hd) {
  int lane = threadIdx.x & 31;
  int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
  for (int64_t rh = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5); rh < rows * n_heads; rh += warps) {
    const float *a = dout + rh * hd, *b = out + rh * hd; /* [rows, n_heads, hd] contiguous */
    float s = 0.0f;
    for (int64_t e = lane; e < hd; e += 32) s += a[e] * b[e];
    s = warp_sum(s);
    if (lane == 0) D[rh] = s;
  }
}

/* ---------------------------------------------------------------- host side */

/* A GEMM operand: row-major matrices of dtype dt, row stride ld, one every `stride` elements. */
struct mat {
  const void *p;
  ds_dtype dt;
  int64_t ld, stride;
};

/* C_b[m, n] (row-major, ldc; C_b = C + b * strideC) = alpha op(A_b) op(B_b) + beta C_b for b <
 * batch, flags and shapes as ds_gemm_f32 (op(A) [m, k], op(B) [k, n]). Row-major on cuBLAS's
 * column-major: the swapped product C^T = op(B)^T op(A)^T, as cuda_gemm in cuda_backend.cu. */
void gemm_batched(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, mat A, mat B, float beta, float *C,
                  int64_t ldc, int64_t strideC, int64_t batch) {
  if (m == 0 || n == 0 || batch == 0) return;
  DS_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && batch <= INT_MAX && ldc <= INT_MAX &&
           A.ld <= INT_MAX && B.ld <= INT_MAX && A.dt == B.dt);
  cudaDataType_t t = A.dt == DS_BF16 ? CUDA_R_16BF : CUDA_R_32F;
  DS_CUBLAS(cublasGemmStridedBatchedEx(ds_cuda_blas(), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                       (int)n, (int)m, (int)k, &alpha, B.p, t, (int)B.ld, (long long)B.stride, A.p, t,
                                       (int)A.ld, (long long)A.stride, &beta, C, CUDA_R_32F, (int)ldc,
                                       (long long)strideC, (int)batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

unsigned warp_blocks(int64_t rows) { return ds_cuda_blocks(rows, (int)kWarps); }

void gather_heads(void *dst, ds_dtype dt, const float *src, int64_t row_stride, int64_t head_stride,
                  const int64_t *row, int64_t R, int64_t H, int64_t hd) {
  gather_heads_kernel<<<ds_cuda_blocks(H * R * hd, kThreads), kThreads, 0, DS_CUDA_STREAM>>>(
      dst, dt, src, row_stride, head_stride, row, R, H, hd);
  DS_CUDA_LAUNCHED("gather_heads_kernel");
}

void block_dots(float *S, int64_t ld, int64_t Lc, const float *x, int64_t x_stride, const float *y, float alpha,
                const ds_attn_job *j, const ds_attn_chunk *c) {
  block_dots_kernel<<<warp_blocks(j->n_heads * c->R), kThreads, 0, DS_CUDA_STREAM>>>(
      S, ld, Lc, x, x_stride, y, alpha, c->row, c->vis, c->R, j->n_heads, j->n_kv, j->hd, j->g);
  DS_CUDA_LAUNCHED("block_dots_kernel");
}

void scatter(float *dst, int add, const float *Oh, const float *W, int64_t ld, const float *y, float alpha,
             const ds_attn_job *j, const ds_attn_chunk *c) {
  int64_t n = j->n_heads * c->R * j->hd;
  scatter_kernel<<<ds_cuda_blocks(n, kThreads), kThreads, 0, DS_CUDA_STREAM>>>(
      dst, add, Oh, W, ld, c->Lc, y, alpha, c->row, c->vis, c->R, j->n_heads, j->n_kv, j->hd, j->g);
  DS_CUDA_LAUNCHED("scatter_kernel");
}

void block_kv_grad(float *dy, const float *W, int64_t ld, const float *x, int64_t x_stride, float alpha,
                   const ds_attn_job *j, const ds_attn_chunk *c) {
  int64_t n = c->R * j->n_kv * j->hd;
  block_kv_grad_kernel<<<ds_cuda_blocks(n, kThreads), kThreads, 0, DS_CUDA_STREAM>>>(
      dy, W, ld, c->Lc, x, x_stride, alpha, c->row, c->R, j->n_heads, j->n_kv, j->hd, j->g);
  DS_CUDA_LAUNCHED("block_kv_grad_kernel");
}

/* The chunk's queries (or dout rows) head-major in the GEMM dtype: [H, R, hd] in `slot`. */
mat gathered_rows(const float *src, int64_t stride, const ds_attn_job *j, const ds_attn_chunk *c, int slot) {
  ds_dtype dt = j->bf16 ? DS_BF16 : DS_F32;
  int64_t H = j->n_heads, hd = j->hd, group = H / j->n_kv;
  void *dst = ds_cuda_scratch(slot, (size_t)(H * c->R * hd) * ds_dtype_size(dt));
  gather_heads(dst, dt, src, stride, hd, c->row, c->R, H, hd);
  mat m = {dst, dt, hd, group * c->R * hd};
  return m;
}

mat keys_mat(const ds_attn_keys &k) {
  mat m = {k.p, k.dt, k.row, k.head};
  return m;
}

}  // namespace

int64_t ds_attn_score_budget(void) {
  const char *env = getenv("DSPARK_CUDA_ATTN_SCORE_BYTES");
  long long v = env ? strtoll(env, NULL, 10) : 0;
  return v > 0 ? (int64_t)v : (int64_t)256 << 20;
}

ds_attn_keys ds_attn_keys_ready(const float *k, int64_t rows, int64_t row_stride, int64_t head_stride, int64_t n_kv,
                                int64_t hd, int bf16, int slot) {
  if (!bf16 || rows == 0) {
    ds_attn_keys view = {k, DS_F32, row_stride, head_stride};
    return view;
  }
  void *dst = ds_cuda_scratch(slot, (size_t)(n_kv * rows * hd) * sizeof(__nv_bfloat16));
  gather_heads(dst, DS_BF16, k, row_stride, head_stride, NULL, rows, n_kv, hd);
  ds_attn_keys view = {dst, DS_BF16, hd, rows * hd};
  return view;
}

ds_attn_job ds_attn_job_make(const float *q, int64_t n_heads, int64_t n_kv, int64_t hd, float scale) {
  DS_CHECK(n_kv > 0 && n_heads % n_kv == 0);
  ds_attn_job j = {};
  j.q = q;
  j.q_stride = n_heads * hd;
  j.n_heads = n_heads;
  j.n_kv = n_kv;
  j.hd = hd;
  j.scale = scale;
  j.bf16 = ds_cuda_bf16_gemm();
  j.dk_row = n_kv * hd;
  j.dk_head = hd;
  return j;
}

void ds_attn_gemm_forward(const ds_attn_job *j, const ds_attn_chunk *c) {
  int64_t H = j->n_heads, hd = j->hd, R = c->R, Lc = c->Lc, gr = H / j->n_kv * R, ld = ds_attn_ld(Lc, j->g);
  if (R == 0 || H == 0) return;
  ds_dtype dt = j->bf16 ? DS_BF16 : DS_F32;
  float *S = (float *)ds_cuda_scratch(DS_CUDA_SLOT_ATTN_S, (size_t)(H * R * ld) * sizeof(float));
  __nv_bfloat16 *P16 = j->bf16 ? (__nv_bfloat16 *)ds_cuda_scratch(DS_CUDA_SLOT_ATTN_P16,
                                                                  (size_t)(H * R * ld) * sizeof(__nv_bfloat16))
                               : NULL;
  if (Lc > 0) {
    mat Qh = gathered_rows(j->q, j->q_stride, j, c, DS_CUDA_SLOT_ATTN_Q);
    gemm_batched(0, 1, gr, Lc, hd, j->scale, Qh, keys_mat(c->k), 0.0f, S, ld, gr * ld, j->n_kv);
  }
  if (j->g > 0) block_dots(S, ld, Lc, j->q, j->q_stride, j->kb, j->scale, j, c);
  softmax_kernel<<<warp_blocks(H * R), kThreads, 0, DS_CUDA_STREAM>>>(S, P16, ld, Lc, j->g, c->row, c->lo, c->vis,
                                                                     j->lse, R, H);
  DS_CUDA_LAUNCHED("softmax_kernel");
  float *Oh = NULL;
  if (Lc > 0) {
    Oh = (float *)ds_cuda_scratch(DS_CUDA_SLOT_ATTN_O, (size_t)(H * R * hd) * sizeof(float));
    mat P = {P16 ? (const void *)P16 : (const void *)S, dt, ld, gr * ld};
    gemm_batched(0, 0, gr, hd, Lc, 1.0f, P, keys_mat(c->v), 0.0f, Oh, hd, gr * hd, j->n_kv);
  }
  scatter(j->out, 0, Oh, S, ld, j->vb, 1.0f, j, c);
}

void ds_attn_gemm_backward(const ds_attn_job *j, const ds_attn_chunk *c) {
  int64_t H = j->n_heads, hd = j->hd, R = c->R, Lc = c->Lc, gr = H / j->n_kv * R, ld = ds_attn_ld(Lc, j->g);
  if (R == 0 || H == 0) return;
  ds_dtype dt = j->bf16 ? DS_BF16 : DS_F32;
  size_t n = (size_t)(H * R * ld);
  float *S = (float *)ds_cuda_scratch(DS_CUDA_SLOT_ATTN_S, n * sizeof(float));
  float *dP = (float *)ds_cuda_scratch(DS_CUDA_SLOT_ATTN_DP, n * sizeof(float));
  __nv_bfloat16 *P16 = NULL, *dS16 = NULL;
  if (j->bf16) {
    P16 = (__nv_bfloat16 *)ds_cuda_scratch(DS_CUDA_SLOT_ATTN_P16, 2 * n * sizeof(__nv_bfloat16));
    dS16 = P16 + n;
  }
  mat Qh = {NULL, dt, 0, 0}, dOh = Qh;
  if (Lc > 0) {
    Qh = gathered_rows(j->q, j->q_stride, j, c, DS_CUDA_SLOT_ATTN_Q);
    dOh = gathered_rows(j->dout, H * hd, j, c, DS_CUDA_SLOT_ATTN_DO);
    gemm_batched(0, 1, gr, Lc, hd, j->scale, Qh, keys_mat(c->k), 0.0f, S, ld, gr * ld, j->n_kv);
    gemm_batched(0, 1, gr, Lc, hd, 1.0f, dOh, keys_mat(c->v), 0.0f, dP, ld, gr * ld, j->n_kv);
  }
  if (j->g > 0) {
    block_dots(S, ld, Lc, j->q, j->q_stride, j->kb, j->scale, j, c);
    block_dots(dP, ld, Lc, j->dout, H * hd, j->vb, 1.0f, j, c);
  }
  dsoftmax_kernel<<<warp_blocks(H * R), kThreads, 0, DS_CUDA_STREAM>>>(S, dP, P16, dS16, ld, Lc, j->g, c->row, c->lo,
                                                                      c->vis, j->lse_in, j->D, R, H);
  DS_CUDA_LAUNCHED("dsoftmax_kernel");
  /* the GEMMs read P and dS in their dtype; the block keys' part reads the fp32 ones */
  mat P = {P16 ? (const void *)P16 : (const void *)S, dt, ld, gr * ld};
  mat dS = {dS16 ? (const void *)dS16 : (const void *)dP, dt, ld, gr * ld};
  if (j->dq) {
    float *dQh = NULL;
    if (Lc > 0) {
      dQh = (float *)ds_cuda_scratch(DS_CUDA_SLOT_ATTN_O, (size_t)(H * R * hd) * sizeof(float));
      gemm_batched(0, 0, gr, hd, Lc, j->scale, dS, keys_mat(c->k), 0.0f, dQh, hd, gr * hd, j->n_kv);
    }
    scatter(j->dq, 1, dQh, dP, ld, j->kb, j->scale, j, c);
  }
  /* dK[kv head] += scale dS^T Qh over the group's stacked rows; chunks add in order */
  if (c->dk && Lc > 0) gemm_batched(1, 0, Lc, hd, gr, j->scale, dS, Qh, 1.0f, c->dk, j->dk_row, j->dk_head, j->n_kv);
  if (c->dv && Lc > 0) gemm_batched(1, 0, Lc, hd, gr, 1.0f, P, dOh, 1.0f, c->dv, j->dk_row, j->dk_head, j->n_kv);
  if (j->g > 0) {
    if (j->dkb) block_kv_grad(j->dkb, dP, ld, j->q, j->q_stride, j->scale, j, c);
    if (j->dvb) block_kv_grad(j->dvb, S, ld, j->dout, H * hd, 1.0f, j, c);
  }
}

float *ds_cuda_attn_rowsum(const float *dout, const float *out, int64_t rows, int64_t n_heads, int64_t hd) {
  float *D = (float *)ds_cuda_scratch(DS_CUDA_SLOT_ROWSUM, (size_t)(rows * n_heads) * sizeof(float));
  if (rows * n_heads == 0) return D;
  rowsum_kernel<<<warp_blocks(rows * n_heads), kThreads, 0, DS_CUDA_STREAM>>>(D, dout, out, rows, n_heads, hd);
  DS_CUDA_LAUNCHED("rowsum_kernel");
  return D;
}
