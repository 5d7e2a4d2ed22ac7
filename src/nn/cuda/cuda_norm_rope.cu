/* CUDA kernels of the row-wise and elementwise entries: rmsnorm, rope, swiglu, add (each
 * forward beside its backward), and the column sums linear's db needs. Contracts in
 * include/dspark/backend.h; the arithmetic follows the cpu backend's (fp32, the same
 * formulas) so the two agree to fp32 rounding. Sums over rows run in row order per column
 * (no atomics): results are deterministic. */
#include "nn/cuda/cuda_internal.h"

namespace {

constexpr int kThreads = 256;

__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* Sum of v over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it. */
__device__ float block_sum(float v) {
  __shared__ float part[32];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads(); /* part[] may still be read from the previous call */
  if (lane == 0) part[warp] = v;
  __syncthreads();
  v = (int)threadIdx.x < n_warps ? part[threadIdx.x] : 0.0f;
  if (warp == 0) v = warp_sum(v);
  if (threadIdx.x == 0) part[0] = v;
  __syncthreads();
  return part[0];
}

/* One block per row: y = w * (x * rstd), rstd = 1 / sqrt(mean(x^2) + eps). y may alias x: each
 * thread rewrites only the elements it read, after the reduction. */
__global__ void rmsnorm_kernel(float *y, float *rstd, const float *x, const float *w, int64_t n, int64_t d,
                               float eps) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const float *xi = x + i * d;
    float ss = 0.0f;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) ss += xi[j] * xi[j];
    ss = block_sum(ss);
    float r = 1.0f / sqrtf(ss / (float)d + eps);
    if (rstd && threadIdx.x == 0) rstd[i] = r;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) y[i * d + j] = w[j] * (xi[j] * r);
  }
}

/* One block per row: dx += r * (w dy - x r^2 mean(w dy x)). */
__global__ void rmsnorm_dx_kernel(float *dx, const float *dy, const float *x, const float *w, const float *rstd,
                                  int64_t n, int64_t d) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const float *xi = x + i * d, *dyi = dy + i * d;
    float dot = 0.0f;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) dot += w[j] * dyi[j] * xi[j];
    dot = block_sum(dot);
    float r = rstd[i], c = dot * r * r / (float)d;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) dx[i * d + j] += r * (w[j] * dyi[j] - xi[j] * c);
  }
}

/* One thread per column: dw[j] += sum over rows (in order) of dy * x * rstd. */
__global__ void rmsnorm_dw_kernel(float *dw, const float *dy, const float *x, const float *rstd, int64_t n,
                                  int64_t d) {
  for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < d; j += (int64_t)gridDim.x * blockDim.x) {
    float acc = 0.0f;
    for (int64_t i = 0; i < n; i++) acc += dy[i * d + j] * (x[i * d + j] * rstd[i]);
    dw[j] += acc;
  }
}

/* One thread per (token, head, pair i < head_dim/2): rotate (v[i], v[i + half]) by sign *
 * angle, angle = (float)pos * inv_freq[i] in fp32 (as transformers), accurate cosf / sinf. */
__global__ void rope_kernel(float *x, int64_t stride, const int64_t *pos, const float *inv_freq, int64_t n,
                            int64_t heads, int64_t head_dim, float sign) {
  int64_t half = head_dim / 2, total = n * heads * half;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total;
       idx += (int64_t)gridDim.x * blockDim.x) {
    int64_t i = idx % half, h = (idx / half) % heads, t = idx / (half * heads);
    float ang = (float)pos[t] * inv_freq[i];
    float c = cosf(ang), s = sign * sinf(ang);
    float *v = x + t * stride + h * head_dim;
    float a = v[i], b = v[i + half];
    v[i] = a * c - b * s;
    v[i + half] = b * c + a * s;
  }
}

__global__ void swiglu_kernel(float *out, const float *gu, int64_t n, int64_t inter) {
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < n * inter;
       idx += (int64_t)gridDim.x * blockDim.x) {
    int64_t i = idx / inter, j = idx % inter;
    float g = gu[i * 2 * inter + j], u = gu[i * 2 * inter + inter + j];
    out[idx] = g / (1.0f + expf(-g)) * u;
  }
}

/* dgate += dout * up * s (1 + gate (1 - s)), dup += dout * silu(gate), s = sigmoid(gate). */
__global__ void swiglu_backward_kernel(float *dgu, const float *dout, const float *gu, int64_t n, int64_t inter) {
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < n * inter;
       idx += (int64_t)gridDim.x * blockDim.x) {
    int64_t i = idx / inter, j = idx % inter;
    float g = gu[i * 2 * inter + j], u = gu[i * 2 * inter + inter + j], d = dout[idx];
    float s = 1.0f / (1.0f + expf(-g));
    dgu[i * 2 * inter + j] += d * u * s * (1.0f + g * (1.0f - s));
    dgu[i * 2 * inter + inter + j] += d * g * s;
  }
}

__global__ void add_kernel(float *y, const float *x, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    y[i] += x[i];
}

__global__ void colsum_add_kernel(float *dst, const float *src, int64_t n, int64_t cols, int64_t ld) {
  for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < cols; j += (int64_t)gridDim.x * blockDim.x) {
    float acc = 0.0f;
    for (int64_t i = 0; i < n; i++) acc += src[i * ld + j];
    dst[j] += acc;
  }
}

__global__ void fill_rows_kernel(float *y, int64_t ldy, const float *bias, int64_t n, int64_t out) {
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < n * out;
       idx += (int64_t)gridDim.x * blockDim.x)
    y[(idx / out) * ldy + idx % out] = bias[idx % out];
}

/* One block per row, at most 65535 * 16 blocks (the kernels loop over the rest). */
unsigned row_blocks(int64_t n) { return (unsigned)(n < 1 ? 1 : (n > 65535 * 16 ? 65535 * 16 : n)); }

void rope_launch(float *x, int64_t stride, const int64_t *pos, const float *inv_freq, int64_t n, int64_t heads,
                 int64_t head_dim, float sign) {
  if (n == 0 || heads == 0 || head_dim < 2) return;
  const int64_t *pos_dev = (const int64_t *)ds_cuda_upload(DS_CUDA_SLOT_INDEX, pos, (size_t)n * sizeof(int64_t));
  rope_kernel<<<ds_cuda_blocks(n * heads * (head_dim / 2), kThreads), kThreads, 0, DS_CUDA_STREAM>>>(
      x, stride, pos_dev, inv_freq, n, heads, head_dim, sign);
  DS_CUDA_LAUNCHED("rope_kernel");
}

}  // namespace

void ds_cuda_rmsnorm(float *y, float *rstd, const float *x, const float *w, int64_t n, int64_t d, float eps) {
  if (n == 0) return;
  rmsnorm_kernel<<<row_blocks(n), kThreads, 0, DS_CUDA_STREAM>>>(y, rstd, x, w, n, d, eps);
  DS_CUDA_LAUNCHED("rmsnorm_kernel");
}

void ds_cuda_rmsnorm_backward(float *dx, float *dw, const float *dy, const float *x, const float *w, const float *rstd,
                              int64_t n, int64_t d) {
  if (n == 0 || d == 0) return;
  if (dx) {
    rmsnorm_dx_kernel<<<row_blocks(n), kThreads, 0, DS_CUDA_STREAM>>>(dx, dy, x, w, rstd, n, d);
    DS_CUDA_LAUNCHED("rmsnorm_dx_kernel");
  }
  if (dw) {
    rmsnorm_dw_kernel<<<ds_cuda_blocks(d, kThreads), kThreads, 0, DS_CUDA_STREAM>>>(dw, dy, x, rstd, n, d);
    DS_CUDA_LAUNCHED("rmsnorm_dw_kernel");
  }
}

void ds_cuda_rope(float *x, int64_t stride, const int64_t *pos, const float *inv_freq, int64_t n, int64_t heads,
                  int64_t head_dim) {
  rope_launch(x, stride, pos, inv_freq, n, heads, head_dim, 1.0f);
}

/* The transpose of the rotation: the same pairs turned by the negative angle, in place. */
void ds_cuda_rope_backward(float *dx, int64_t stride, const int64_t *pos, const float *inv_freq, int64_t n,
                           int64_t heads, int64_t head_dim) {
  rope_launch(dx, stride, pos, inv_freq, n, heads, head_dim, -1.0f);
}

void ds_cuda_swiglu(float *out, const float *gu, int64_t n, int64_t inter) {
  if (n * inter == 0) return;
  swiglu_kernel<<<ds_cuda_blocks(n * inter, kThreads), kThreads, 0, DS_CUDA_STREAM>>>(out, gu, n, inter);
  DS_CUDA_LAUNCHED("swiglu_kernel");
}

void ds_cuda_swiglu_backward(float *dgu, const float *dout, const float *gu, int64_t n, int64_t inter) {
  if (n * inter == 0) return;
  swiglu_backward_kernel<<<ds_cuda_blocks(n * inter, kThreads), kThreads, 0, DS_CUDA_STREAM>>>(dgu, dout, gu, n,
                                                                                               inter);
  DS_CUDA_LAUNCHED("swiglu_backward_kernel");
}

void ds_cuda_add(float *y, const float *x, int64_t n) {
  if (n == 0) return;
  add_kernel<<<ds_cuda_blocks(n, kThreads), kThreads, 0, DS_CUDA_STREAM>>>(y, x, n);
  DS_CUDA_LAUNCHED("add_kernel");
}

void ds_cuda_colsum_add(float *dst, const float *src, int64_t n, int64_t cols, int64_t ld) {
  if (cols == 0) return;
  colsum_add_kernel<<<ds_cuda_blocks(cols, kThreads), kThreads, 0, DS_CUDA_STREAM>>>(dst, src, n, cols, ld);
  DS_CUDA_LAUNCHED("colsum_add_kernel");
}

void ds_cuda_fill_rows(float *y, int64_t ldy, const float *bias, int64_t n, int64_t out) {
  if (n * out == 0) return;
  fill_rows_kernel<<<ds_cuda_blocks(n * out, kThreads), kThreads, 0, DS_CUDA_STREAM>>>(y, ldy, bias, n, out);
  DS_CUDA_LAUNCHED("fill_rows_kernel");
}
