/* The flash-style attention kernels (see cuda_flash.h for the tiling): forward with the
 * log-sum-exp saved, and the backward in two deterministic passes (dq per query row, dk / dv
 * per key row), both recomputing the probabilities from the lse:
 *   P_t = exp(s_t - lse),  dP_t = dO . v_t,  D = dO . O (= sum_t P_t dP_t),
 *   dS_t = P_t (dP_t - D),  dq += scale sum_t dS_t k_t,  dk_t += scale dS_t q,  dv_t += P_t dO.
 * All in fp32 with accurate expf / logf (no fast-math), as the cpu backend. */
#include <math.h>

#include "nn/cuda/cuda_flash.h"

namespace {

constexpr int kChunks = (int)(DS_ATTN_MAX_HEAD_DIM / 32); /* dims a lane holds: lane + 32c */
constexpr int kKeyTile = (int)DS_ATTN_KEY_TILE;
constexpr int kPairChunk = 16; /* (query row, head) pairs per shared-memory chunk in dk / dv */

__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* a . b over hd dims, a in registers (lane's dims), b a row in shared memory; every lane gets it. */
__device__ float dot_row(const float (&a)[kChunks], const float *b, int64_t hd, int lane) {
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < kChunks; c++) {
    int64_t e = lane + 32 * c;
    if (e < hd) s += a[c] * b[e];
  }
  return warp_sum(s);
}

/* Key t of a query tile (kv head kvh): a row of tensor A or of tensor B. */
__device__ const float *key_row(const ds_attn_geom &g, const ds_attn_qtile &t, int64_t key, int64_t kvh,
                                bool value) {
  int64_t off = kvh * g.k_head_stride;
  if (key < t.na) return (value ? g.va : g.ka) + (t.a0 + key) * g.k_row_stride + off;
  return (value ? g.vb : g.kb) + (t.b0 + key - t.na) * g.k_row_stride + off;
}

/* Keys 0 .. tile_keys-1 of the tile that any of its rows sees. */
__device__ int64_t tile_key_count(const ds_attn_qtile &t) {
  int64_t total = t.na + t.nb;
  if (t.vis0 < 0) return total;
  int64_t last = t.vis0 + t.n_rows - 1;
  return last < total ? last : total;
}

/* Keys row w of the tile sees. */
__device__ int64_t row_key_count(const ds_attn_qtile &t, int w) {
  int64_t total = t.na + t.nb;
  if (t.vis0 < 0) return total;
  int64_t v = t.vis0 + w;
  return v < total ? v : total;
}

/* Loads keys t0 .. t0+nk-1 (and, when vs != NULL, their values) into shared memory [nk, hd]. */
__device__ void load_key_tile(float *ks, float *vs, const ds_attn_geom &g, const ds_attn_qtile &t, int64_t kvh,
                              int64_t t0, int64_t nk) {
  for (int64_t idx = threadIdx.x; idx < nk * g.hd; idx += blockDim.x) {
    int64_t j = idx / g.hd, e = idx % g.hd;
    ks[idx] = key_row(g, t, t0 + j, kvh, false)[e];
    if (vs) vs[idx] = key_row(g, t, t0 + j, kvh, true)[e];
  }
}

/* grid (tiles, n_heads), DS_ATTN_QUERY_WARPS warps; shared memory 2 * kKeyTile * hd floats. */
__global__ void attn_forward_kernel(ds_attn_geom g, const ds_attn_qtile *tiles, float *out, float *lse) {
  extern __shared__ float smem[];
  float *ks = smem, *vs = smem + kKeyTile * g.hd;
  const ds_attn_qtile t = tiles[blockIdx.x];
  int64_t h = blockIdx.y, kvh = h / g.group, hd = g.hd, out_stride = g.n_heads * hd;
  int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  bool active = w < t.n_rows;
  int64_t row = t.q_row0 + w;
  if (t.dropped) { /* uniform over the block: no key is seen, the output is 0 */
    if (active) {
      for (int64_t e = lane; e < hd; e += 32) out[row * out_stride + h * hd + e] = 0.0f;
      if (lse && lane == 0) lse[row * g.n_heads + h] = -INFINITY;
    }
    return;
  }
  float qr[kChunks], o[kChunks];
#pragma unroll
  for (int c = 0; c < kChunks; c++) {
    int64_t e = lane + 32 * c;
    qr[c] = active && e < hd ? g.q[row * g.q_stride + h * hd + e] : 0.0f;
    o[c] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  int64_t vis = row_key_count(t, w), keys = tile_key_count(t);
  for (int64_t t0 = 0; t0 < keys; t0 += kKeyTile) {
    int64_t nk = keys - t0 < kKeyTile ? keys - t0 : kKeyTile;
    load_key_tile(ks, vs, g, t, kvh, t0, nk);
    __syncthreads();
    if (active && t0 < vis) { /* uniform over the warp */
      int64_t nv = vis - t0 < nk ? vis - t0 : nk;
      float s[kKeyTile], mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < kKeyTile; j++) {
        s[j] = j < nv ? dot_row(qr, ks + j * hd, hd, lane) * g.scale : -INFINITY;
        mx = fmaxf(mx, s[j]);
      }
      float m_new = fmaxf(m, mx), alpha = expf(m - m_new); /* m = -inf at first: alpha = 0 */
      l *= alpha;
#pragma unroll
      for (int c = 0; c < kChunks; c++) o[c] *= alpha;
#pragma unroll
      for (int j = 0; j < kKeyTile; j++) {
        if (j >= nv) break;
        float p = expf(s[j] - m_new);
        l += p;
#pragma unroll
        for (int c = 0; c < kChunks; c++) {
          int64_t e = lane + 32 * c;
          if (e < hd) o[c] += p * vs[j * hd + e];
        }
      }
      m = m_new;
    }
    __syncthreads();
  }
  if (!active) return;
  float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
  for (int c = 0; c < kChunks; c++) {
    int64_t e = lane + 32 * c;
    if (e < hd) out[row * out_stride + h * hd + e] = o[c] * inv;
  }
  if (lse && lane == 0) lse[row * g.n_heads + h] = l > 0.0f ? m + logf(l) : -INFINITY;
}

/* One warp per (row, head): D = dout . out. */
__global__ void attn_rowsum_kernel(float *D, const float *dout, const float *out, int64_t rows, int64_t n_heads,
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

/* The forward's tiling: dq[row, h] += scale * sum_t dS_t k_t. */
__global__ void attn_dq_kernel(ds_attn_geom g, const ds_attn_qtile *tiles, const float *dout, const float *lse,
                               const float *D, float *dq) {
  extern __shared__ float smem[];
  float *ks = smem, *vs = smem + kKeyTile * g.hd;
  const ds_attn_qtile t = tiles[blockIdx.x];
  if (t.dropped) return; /* no gradient */
  int64_t h = blockIdx.y, kvh = h / g.group, hd = g.hd, out_stride = g.n_heads * hd;
  int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  bool active = w < t.n_rows;
  int64_t row = t.q_row0 + w;
  float qr[kChunks], dor[kChunks], acc[kChunks];
#pragma unroll
  for (int c = 0; c < kChunks; c++) {
    int64_t e = lane + 32 * c;
    qr[c] = active && e < hd ? g.q[row * g.q_stride + h * hd + e] : 0.0f;
    dor[c] = active && e < hd ? dout[row * out_stride + h * hd + e] : 0.0f;
    acc[c] = 0.0f;
  }
  float row_lse = active ? lse[row * g.n_heads + h] : 0.0f, row_d = active ? D[row * g.n_heads + h] : 0.0f;
  int64_t vis = row_key_count(t, w), keys = tile_key_count(t);
  for (int64_t t0 = 0; t0 < keys; t0 += kKeyTile) {
    int64_t nk = keys - t0 < kKeyTile ? keys - t0 : kKeyTile;
    load_key_tile(ks, vs, g, t, kvh, t0, nk);
    __syncthreads();
    if (active && t0 < vis) {
      int64_t nv = vis - t0 < nk ? vis - t0 : nk;
      for (int64_t j = 0; j < nv; j++) {
        float p = expf(dot_row(qr, ks + j * hd, hd, lane) * g.scale - row_lse);
        float ds = p * (dot_row(dor, vs + j * hd, hd, lane) - row_d);
#pragma unroll
        for (int c = 0; c < kChunks; c++) {
          int64_t e = lane + 32 * c;
          if (e < hd) acc[c] += ds * ks[j * hd + e];
        }
      }
    }
    __syncthreads();
  }
  if (!active) return;
#pragma unroll
  for (int c = 0; c < kChunks; c++) {
    int64_t e = lane + 32 * c;
    if (e < hd) dq[row * out_stride + h * hd + e] += g.scale * acc[c];
  }
}

__device__ bool sees(const ds_attn_geom &g, int64_t rule, int64_t q_row, int64_t k_row) {
  if (rule == DS_ATTN_SEE_CAUSAL) return q_row >= k_row;
  if (rule == DS_ATTN_SEE_CTX) return g.ctx_len[q_row / g.g] > k_row;
  return true;
}

/* grid (key tiles, n_kv_heads), DS_ATTN_KEY_WARPS warps; shared memory 2 * kPairChunk * hd floats
 * (q and dout rows of the chunk) plus 2 * kPairChunk floats and kPairChunk rows. */
__global__ void attn_dkdv_kernel(ds_attn_geom g, const ds_attn_ktile *tiles, const float *dout, const float *lse,
                                 const float *D, float *dka, float *dva, float *dkb, float *dvb) {
  extern __shared__ float smem[];
  int64_t hd = g.hd, out_stride = g.n_heads * hd;
  float *qs = smem, *dos = smem + kPairChunk * hd, *ls = dos + kPairChunk * hd, *ds_ = ls + kPairChunk;
  __shared__ int64_t rows_s[kPairChunk];
  const ds_attn_ktile t = tiles[blockIdx.x];
  int64_t kvh = blockIdx.y;
  int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  bool active = w < t.n_keys;
  int64_t key = t.k_row0 + w, koff = key * g.k_row_stride + kvh * g.k_head_stride;
  const float *K = t.which ? g.kb : g.ka, *V = t.which ? g.vb : g.va;
  float kr[kChunks], vr[kChunks], dk[kChunks], dv[kChunks];
#pragma unroll
  for (int c = 0; c < kChunks; c++) {
    int64_t e = lane + 32 * c;
    kr[c] = active && e < hd ? K[koff + e] : 0.0f;
    vr[c] = active && e < hd ? V[koff + e] : 0.0f;
    dk[c] = dv[c] = 0.0f;
  }
  int64_t pairs = t.n_qrows * g.group;
  for (int64_t p0 = 0; p0 < pairs; p0 += kPairChunk) {
    int64_t np = pairs - p0 < kPairChunk ? pairs - p0 : kPairChunk;
    for (int64_t idx = threadIdx.x; idx < np * hd; idx += blockDim.x) {
      int64_t j = idx / hd, e = idx % hd, pr = p0 + j;
      int64_t row = t.q_row0 + pr / g.group, h = kvh * g.group + pr % g.group;
      qs[idx] = g.q[row * g.q_stride + h * hd + e];
      dos[idx] = dout[row * out_stride + h * hd + e];
    }
    if ((int64_t)threadIdx.x < np) {
      int64_t pr = p0 + threadIdx.x, row = t.q_row0 + pr / g.group, h = kvh * g.group + pr % g.group;
      ls[threadIdx.x] = lse[row * g.n_heads + h];
      ds_[threadIdx.x] = D[row * g.n_heads + h];
      rows_s[threadIdx.x] = row;
    }
    __syncthreads();
    if (active) {
      for (int64_t j = 0; j < np; j++) {
        if (!sees(g, t.rule, rows_s[j], key)) continue; /* uniform over the warp */
        float qa[kChunks], da[kChunks];
#pragma unroll
        for (int c = 0; c < kChunks; c++) {
          int64_t e = lane + 32 * c;
          qa[c] = e < hd ? qs[j * hd + e] : 0.0f;
          da[c] = e < hd ? dos[j * hd + e] : 0.0f;
        }
        float p = expf(dot_row(kr, qs + j * hd, hd, lane) * g.scale - ls[j]);
        float dsc = p * (dot_row(vr, dos + j * hd, hd, lane) - ds_[j]);
#pragma unroll
        for (int c = 0; c < kChunks; c++) {
          dk[c] += dsc * qa[c];
          dv[c] += p * da[c];
        }
      }
    }
    __syncthreads();
  }
  if (!active) return;
  float *dK = t.which ? dkb : dka, *dV = t.which ? dvb : dva;
#pragma unroll
  for (int c = 0; c < kChunks; c++) {
    int64_t e = lane + 32 * c;
    if (e >= hd) continue;
    if (dK) dK[koff + e] += g.scale * dk[c];
    if (dV) dV[koff + e] += dv[c];
  }
}

}  // namespace

void ds_cuda_attn_check_head_dim(int64_t hd) {
  DS_CHECK(hd >= 1 && hd <= DS_ATTN_MAX_HEAD_DIM && "the CUDA attention kernels take head_dim <= 256");
}

void ds_cuda_attn_forward(const ds_attn_geom *geom, const ds_attn_qtile *tiles, int64_t n_tiles, float *out,
                          float *lse) {
  if (n_tiles == 0) return;
  ds_cuda_attn_check_head_dim(geom->hd);
  DS_CHECK(n_tiles <= INT32_MAX && geom->n_heads <= 65535);
  const ds_attn_qtile *dev =
      (const ds_attn_qtile *)ds_cuda_upload(DS_CUDA_SLOT_TILES, tiles, (size_t)n_tiles * sizeof(ds_attn_qtile));
  size_t smem = 2 * (size_t)kKeyTile * (size_t)geom->hd * sizeof(float);
  dim3 grid((unsigned)n_tiles, (unsigned)geom->n_heads);
  attn_forward_kernel<<<grid, (unsigned)(32 * DS_ATTN_QUERY_WARPS), smem, DS_CUDA_STREAM>>>(*geom, dev, out, lse);
  DS_CUDA_LAUNCHED("attn_forward_kernel");
}

float *ds_cuda_attn_rowsum(const float *dout, const float *out, int64_t rows, int64_t n_heads, int64_t hd) {
  float *D = (float *)ds_cuda_scratch(DS_CUDA_SLOT_ROWSUM, (size_t)(rows * n_heads) * sizeof(float));
  if (rows * n_heads == 0) return D;
  attn_rowsum_kernel<<<ds_cuda_blocks(rows * n_heads, 8), 256, 0, DS_CUDA_STREAM>>>(D, dout, out, rows, n_heads, hd);
  DS_CUDA_LAUNCHED("attn_rowsum_kernel");
  return D;
}

void ds_cuda_attn_dq(const ds_attn_geom *geom, const ds_attn_qtile *tiles, int64_t n_tiles, const float *dout,
                     const float *lse, const float *D, float *dq) {
  if (n_tiles == 0 || !dq) return;
  ds_cuda_attn_check_head_dim(geom->hd);
  DS_CHECK(n_tiles <= INT32_MAX && geom->n_heads <= 65535);
  const ds_attn_qtile *dev =
      (const ds_attn_qtile *)ds_cuda_upload(DS_CUDA_SLOT_TILES, tiles, (size_t)n_tiles * sizeof(ds_attn_qtile));
  size_t smem = 2 * (size_t)kKeyTile * (size_t)geom->hd * sizeof(float);
  dim3 grid((unsigned)n_tiles, (unsigned)geom->n_heads);
  attn_dq_kernel<<<grid, (unsigned)(32 * DS_ATTN_QUERY_WARPS), smem, DS_CUDA_STREAM>>>(*geom, dev, dout, lse, D, dq);
  DS_CUDA_LAUNCHED("attn_dq_kernel");
}

void ds_cuda_attn_dkdv(const ds_attn_geom *geom, const ds_attn_ktile *tiles, int64_t n_tiles, int64_t n_kv_heads,
                       const float *dout, const float *lse, const float *D, float *dka, float *dva, float *dkb,
                       float *dvb) {
  if (n_tiles == 0) return;
  ds_cuda_attn_check_head_dim(geom->hd);
  DS_CHECK(n_tiles <= INT32_MAX && n_kv_heads <= 65535);
  const ds_attn_ktile *dev =
      (const ds_attn_ktile *)ds_cuda_upload(DS_CUDA_SLOT_TILES2, tiles, (size_t)n_tiles * sizeof(ds_attn_ktile));
  size_t smem = (2 * (size_t)kPairChunk * (size_t)geom->hd + 2 * kPairChunk) * sizeof(float);
  dim3 grid((unsigned)n_tiles, (unsigned)n_kv_heads);
  attn_dkdv_kernel<<<grid, (unsigned)(32 * DS_ATTN_KEY_WARPS), smem, DS_CUDA_STREAM>>>(*geom, dev, dout, lse, D, dka, dva, dkb,
                                                                          dvb);
  DS_CUDA_LAUNCHED("attn_dkdv_kernel");
}
