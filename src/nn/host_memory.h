/* The memory entries of the host backends (cpu, reference): backend memory is host memory,
 * so alloc is ds_malloc_aligned and the copies are memcpy (include/dspark/backend.h). Not a
 * public header. */
#ifndef DSPARK_NN_HOST_MEMORY_H
#define DSPARK_NN_HOST_MEMORY_H

#include <stddef.h>
#include <stdint.h>

void *ds_host_alloc(size_t nbytes, const char *what);
void ds_host_free(void *p);
/* dst = src (nbytes); one function serves copy_to_device, copy_to_host and copy. */
void ds_host_copy(void *dst, const void *src, size_t nbytes);
void ds_host_memset_zero(void *p, size_t nbytes);
/* copy_rows: a strided block of floats, one memcpy per row. */
void ds_host_copy_rows(float *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows, int64_t cols);
void ds_host_synchronize(void);
/* operand_hold / operand_release for backends that convert nothing: no-ops. */
void ds_host_operand_hold(const float *p, size_t n);
void ds_host_operand_release(const float *p);

#endif
