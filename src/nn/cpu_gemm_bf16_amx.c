/* The AMX weight layouts of oneDNN's bf16 matmul, written directly (contract in
 * nn/cpu_gemm_bf16.h). */
#include "nn/cpu_gemm_bf16.h"

#include <string.h>

#include "nn/cpu_kernels.h"

#if defined(DSPARK_GEMM_ONEDNN)
/* The layouts BA16a{16,32,48,64}b2a (oneDNN's own reorder from the transposed plain layout runs
 * at about 1.3 GB/s here, as long as a product): blocks of 32 k x NB n, n-blocks outermost;
 * inside a block, k pair (k % 32) / 2, then n, then k % 2; padding zeros. */
int ds_pack_amx(const dnnl_memory_desc_t *md, const uint16_t *w, int tb, int64_t n, int64_t k, uint16_t *dst,
                size_t bytes) {
  static const dnnl_format_tag_t tags[] = {dnnl_BA16a64b2a, dnnl_BA16a48b2a, dnnl_BA16a32b2a, dnnl_BA16a16b2a};
  static const int widths[] = {64, 48, 32, 16};
  int nb = 0;
  for (int i = 0; i < 4 && !nb; i++) {
    dnnl_dims_t sh = {k, n};
    dnnl_memory_desc_t t;
    if (dnnl_memory_desc_init_by_tag(&t, 2, sh, dnnl_bf16, tags[i]) == dnnl_success && dnnl_memory_desc_equal(&t, md))
      nb = widths[i];
  }
  int64_t ka = (k + 31) / 32, nbl = (n + nb - 1) / (nb ? nb : 1);
  if (!nb || bytes != (size_t)(ka * nbl * 32 * nb) * sizeof(uint16_t)) return 0;
  memset(dst, 0, bytes);
#define AMX_AT(a, o) dst[((o) / nb * ka + (a) / 32) * 32 * nb + ((a) % 32 / 2 * nb + (o) % nb) * 2 + (a) % 2]
  if (tb) { /* W[n, k]: walk each row of W */
    DS_OMP(parallel for schedule(static) if (n * k > 65536))
    for (int64_t o = 0; o < n; o++)
      for (int64_t a = 0; a < k; a++) AMX_AT(a, o) = w[o * k + a];
  } else { /* W[k, n]: each thread owns whole n-blocks, walked row by row */
    DS_OMP(parallel for schedule(static) if (n * k > 65536))
    for (int64_t bo = 0; bo < nbl; bo++) {
      int64_t o1 = (bo + 1) * nb < n ? (bo + 1) * nb : n;
      for (int64_t a = 0; a < k; a++)
        for (int64_t o = bo * nb; o < o1; o++) AMX_AT(a, o) = w[a * n + o];
    }
  }
#undef AMX_AT
  return 1;
}
#endif
