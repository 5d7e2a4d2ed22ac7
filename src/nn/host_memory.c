/* Host backends' memory entries: plain aligned malloc and memcpy (see host_memory.h). */
#include "nn/host_memory.h"

#include <string.h>

#include "dspark/common.h"

/* alloc(0) still returns a pointer that free accepts, as the seam promises. */
void *ds_host_alloc(size_t nbytes, const char *what) { return ds_malloc_aligned(nbytes ? nbytes : 1, what); }

void ds_host_free(void *p) { ds_free_aligned(p); }

/* memcpy with a zero size and a NULL pointer is undefined in C; the seam allows nbytes 0. */
void ds_host_copy(void *dst, const void *src, size_t nbytes) {
  if (nbytes) memcpy(dst, src, nbytes);
}

void ds_host_copy_rows(float *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows, int64_t cols) {
  if (cols <= 0) return;
  for (int64_t r = 0; r < rows; r++) memcpy(dst + r * ld_dst, src + r * ld_src, (size_t)cols * sizeof(float));
}

void ds_host_memset_zero(void *p, size_t nbytes) {
  if (nbytes) memset(p, 0, nbytes);
}

/* Host kernels finish before they return: nothing to wait for. */
void ds_host_synchronize(void) {}

/* Nothing is converted, so nothing is kept. */
void ds_host_operand_hold(const float *p, size_t n) { (void)p, (void)n; }
void ds_host_operand_release(const float *p) { (void)p; }
