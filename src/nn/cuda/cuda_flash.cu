/* The flash-style decode kernel (see cuda_flash.h for the tiling): the forward only, in fp32
 * with accurate expf (no fast-math), as the cpu backend. */
#include <math.h>

#include "nn/cuda/cuda_flash.h"

namespace {

constexpr int kChunks = (int)(DS_ATTN_MAX_HEAD_DIM / 32); /* dims a lane holds: lane + 32c */
constexpr int kKeyTile = (int)DS_ATTN_KEY_TILE;

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

/* Keys 0 .. tile_keys-1 of the tile that any of its rows sees. */
__device__ int64_t tile_key_count(const ds_attn_qtile &t) {
  int64_t last = t.vis0 + t.n_rows - 1;
  return last < t.n_keys ? last : t.n_keys;
}

/* Keys row w of the tile sees. */
__device__ int64_t row_key_count(const ds_attn_qtile &t, int w) {
  int64_t v = t.vis0 + w;
  return v < t.n_keys ? v : t.n_keys;
}

/* Loads keys t0 .. t0+nk-1 and their values into shared memory [nk, hd] each. */
__device__ void load_key_tile(float *ks, float *vs, const ds_attn_geom &g, int64_t kvh, int64_t t0, int64_t nk) {
  for (int64_t idx = threadIdx.x; idx < nk * g.hd; idx += blockDim.x) {
    int64_t off = (t0 + idx / g.hd) * g.k_row_stride + kvh * g.k_head_stride + idx % g.hd;
    ks[idx] = g.k[off];
    vs[idx] = g.v[off];
  }
}

/* out[row, h] for the rows of a tile: grid (tiles, n_heads), DS_ATTN_QUERY_WARPS warps; shared
 * memory 2 * kKeyTile * hd floats (a key tile and its values). */
__global__ void flash_forward_kernel(ds_attn_geom g, const ds_attn_qtile *tiles, float *out) {
  extern __shared__ float smem[];
  float *ks = smem, *vs = smem + kKeyTile * g.hd;
  const ds_attn_qtile t = tiles[blockIdx.x];
  int64_t h = blockIdx.y, kvh = h / g.group, hd = g.hd, out_stride = g.n_heads * hd;
  int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  bool active = w < t.n_rows;
  int64_t row = t.q_row0 + w;
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
    load_key_tile(ks, vs, g, kvh, t0, nk);
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
}

}  // namespace

void ds_cuda_flash_forward(const ds_attn_geom *geom, const ds_attn_qtile *tiles, int64_t n_tiles, float *out) {
  if (n_tiles == 0) return;
  DS_CHECK(geom->hd >= 1 && geom->hd <= DS_ATTN_MAX_HEAD_DIM && "the flash kernel takes head_dim <= 256");
  DS_CHECK(n_tiles <= INT32_MAX && geom->n_heads <= 65535);
  const ds_attn_qtile *dev =
      (const ds_attn_qtile *)ds_cuda_upload(DS_CUDA_SLOT_TILES, tiles, (size_t)n_tiles * sizeof(ds_attn_qtile));
  size_t smem = 2 * (size_t)kKeyTile * (size_t)geom->hd * sizeof(float);
  dim3 grid((unsigned)n_tiles, (unsigned)geom->n_heads);
  flash_forward_kernel<<<grid, (unsigned)(32 * DS_ATTN_QUERY_WARPS), smem, DS_CUDA_STREAM>>>(*geom, dev, out);
  DS_CUDA_LAUNCHED("flash_forward_kernel");
}
