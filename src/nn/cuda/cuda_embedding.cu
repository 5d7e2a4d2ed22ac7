/* CUDA kernels of the table lookups (embedding, embedding_w, embedding_backward) and the dtype
 * conversion the GEMMs use. Contracts in include/dspark/backend.h; ids are host memory and
 * are uploaded here.
 *
 * embedding_backward is deterministic without atomics: the host groups the rows by id (a
 * stable sort of (id, row) pairs, so each group lists its rows in row order), and one CUDA
 * block per distinct id walks its rows in that order per column, adding into the table row
 * exactly as the cpu backend does (dst += dout row by row): the sums are bitwise the cpu's. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdlib.h>

#include "nn/cuda/cuda_internal.h"

namespace {

constexpr int kThreads = 256;

__device__ float load_as_f32(const void *p, ds_dtype dt, int64_t idx) {
  if (dt == DS_F32) return ((const float *)p)[idx];
  unsigned short h = ((const unsigned short *)p)[idx];
  if (dt == DS_BF16) return __uint_as_float((unsigned)h << 16); /* exact */
  return __half2float(__ushort_as_half(h));                      /* exact */
}

__global__ void embedding_kernel(float *out, const void *table, ds_dtype dt, const int32_t *ids, int64_t n,
                                 int64_t d) {
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < n * d;
       idx += (int64_t)gridDim.x * blockDim.x) {
    int64_t i = idx / d, j = idx % d;
    out[idx] = load_as_f32(table, dt, (int64_t)ids[i] * d + j);
  }
}

/* Block per id group: dtable[id, j] += dout[r, j] for the group's rows r, in row order. */
__global__ void embedding_backward_kernel(float *dtable, const float *dout, const int64_t *group_id,
                                          const int64_t *group_off, const int32_t *rows, int64_t n_groups, int64_t d) {
  for (int64_t gi = blockIdx.x; gi < n_groups; gi += gridDim.x) {
    float *dst = dtable + group_id[gi] * d;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      float acc = dst[j];
      for (int64_t k = group_off[gi]; k < group_off[gi + 1]; k++) acc += dout[(int64_t)rows[k] * d + j];
      dst[j] = acc;
    }
  }
}

__global__ void convert_kernel(void *dst, ds_dtype dst_dt, const void *src, ds_dtype src_dt, int64_t rows,
                               int64_t cols, int64_t ld) {
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < rows * cols;
       idx += (int64_t)gridDim.x * blockDim.x) {
    float v = load_as_f32(src, src_dt, (idx / cols) * ld + idx % cols);
    if (dst_dt == DS_BF16) ((__nv_bfloat16 *)dst)[idx] = __float2bfloat16_rn(v);
    else ((float *)dst)[idx] = v;
  }
}

struct id_row {
  int32_t id, row;
};

int by_id_then_row(const void *a, const void *b) {
  const id_row *x = (const id_row *)a, *y = (const id_row *)b;
  if (x->id != y->id) return x->id < y->id ? -1 : 1;
  return x->row < y->row ? -1 : (x->row > y->row);
}

void lookup(float *out, const void *table, ds_dtype dt, const int32_t *ids, int64_t n, int64_t d) {
  if (n == 0 || d == 0) return;
  DS_CHECK(dt == DS_F32 || dt == DS_BF16 || dt == DS_F16);
  const int32_t *ids_dev = (const int32_t *)ds_cuda_upload(DS_CUDA_SLOT_INDEX, ids, (size_t)n * sizeof(int32_t));
  embedding_kernel<<<ds_cuda_blocks(n * d, kThreads), kThreads, 0, DS_CUDA_STREAM>>>(out, table, dt, ids_dev, n, d);
  DS_CUDA_LAUNCHED("embedding_kernel");
}

}  // namespace

void ds_cuda_embedding(float *out, const float *table, const int32_t *ids, int64_t n, int64_t d) {
  lookup(out, table, DS_F32, ids, n, d);
}

void ds_cuda_embedding_w(float *y, const int32_t *ids, ds_weight table, int64_t n, int64_t d) {
  lookup(y, table.data, table.dtype, ids, n, d);
}

void ds_cuda_embedding_backward(float *dtable, const float *dout, const int32_t *ids, int64_t n, int64_t d,
                                int64_t skip_id) {
  if (n == 0 || d == 0) return;
  id_row *pairs = (id_row *)ds_malloc((size_t)n * sizeof(id_row), "embedding backward row order");
  int64_t *groups = (int64_t *)ds_malloc((size_t)(2 * n + 1) * sizeof(int64_t), "embedding backward groups");
  int32_t *rows = (int32_t *)ds_malloc((size_t)n * sizeof(int32_t), "embedding backward rows");
  DS_CHECK(pairs && groups && rows);
  int64_t kept = 0;
  for (int64_t i = 0; i < n; i++)
    if (ids[i] != skip_id) pairs[kept++] = id_row{ids[i], (int32_t)i};
  qsort(pairs, (size_t)kept, sizeof(id_row), by_id_then_row);
  /* groups[0 .. m) = distinct ids, groups[m .. 2m] = offsets of their rows in rows[]. */
  int64_t m = 0;
  for (int64_t k = 0; k < kept; k++) {
    if (k == 0 || pairs[k].id != pairs[k - 1].id) m++;
    rows[k] = pairs[k].row;
  }
  int64_t *group_id = groups, *group_off = groups + m, g = -1;
  for (int64_t k = 0; k < kept; k++) {
    if (k == 0 || pairs[k].id != pairs[k - 1].id) {
      g++;
      group_id[g] = pairs[k].id;
      group_off[g] = k;
    }
  }
  group_off[m] = kept;
  if (m > 0) {
    const int32_t *rows_dev =
        (const int32_t *)ds_cuda_upload(DS_CUDA_SLOT_INDEX2, rows, (size_t)kept * sizeof(int32_t));
    const int64_t *groups_dev =
        (const int64_t *)ds_cuda_upload(DS_CUDA_SLOT_INDEX3, groups, (size_t)(2 * m + 1) * sizeof(int64_t));
    unsigned blocks = (unsigned)(m > 65535 * 16 ? 65535 * 16 : m);
    embedding_backward_kernel<<<blocks, kThreads, 0, DS_CUDA_STREAM>>>(dtable, dout, groups_dev, groups_dev + m,
                                                                       rows_dev, m, d);
    DS_CUDA_LAUNCHED("embedding_backward_kernel");
  }
  free(pairs);
  free(groups);
  free(rows);
}

void ds_cuda_convert(void *dst, ds_dtype dst_dt, const void *src, ds_dtype src_dt, int64_t rows, int64_t cols,
                     int64_t ld) {
  DS_CHECK(dst_dt == DS_F32 || dst_dt == DS_BF16);
  DS_CHECK(src_dt == DS_F32 || src_dt == DS_BF16 || src_dt == DS_F16);
  if (rows * cols == 0) return;
  convert_kernel<<<ds_cuda_blocks(rows * cols, kThreads), kThreads, 0, DS_CUDA_STREAM>>>(dst, dst_dt, src, src_dt,
                                                                                         rows, cols, ld);
  DS_CUDA_LAUNCHED("convert_kernel");
}
