/* A backend that wraps another and accounts time and floating-point work per kernel, so a
 * run can report where its time goes and at how many GFLOP/s its matmuls run. Not
 * thread-safe: wrap the backend of one model driven by one thread (kernels may still use
 * many threads inside). */
#ifndef DSPARK_PROFILE_H
#define DSPARK_PROFILE_H

#include <stdio.h>

#include "dspark/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  DS_KERNEL_LINEAR = 0, DS_KERNEL_RMSNORM, DS_KERNEL_ROPE, DS_KERNEL_ATTENTION, DS_KERNEL_SWIGLU, DS_KERNEL_ADD,
  DS_KERNEL_LINEAR_BWD, DS_KERNEL_RMSNORM_BWD, DS_KERNEL_ROPE_BWD, DS_KERNEL_SWIGLU_BWD, DS_KERNEL_BLOCK_ATTN,
  DS_KERNEL_BLOCK_ATTN_BWD, DS_KERNEL_CAUSAL_ATTN, DS_KERNEL_CAUSAL_ATTN_BWD, DS_KERNEL_EMBEDDING,
  DS_KERNEL_EMBEDDING_BWD, DS_KERNEL_LINEAR16, DS_KERNEL_LINEAR16_BWD, DS_KERNEL_EMBEDDING_W,
  DS_KERNEL_COUNT /* grow only before this */
} ds_kernel_kind;

typedef struct {
  int64_t calls[DS_KERNEL_COUNT];
  double seconds[DS_KERNEL_COUNT];
  double flops[DS_KERNEL_COUNT]; /* multiply-adds count 2 */
} ds_profile;

/* Returns a backend that forwards to inner and adds to *prof. Only one profiled backend can
 * exist at a time (the table is static); a second call re-targets it. */
const ds_backend *ds_backend_profiled(const ds_backend *inner, ds_profile *prof);
/* Prints one line per kernel: calls, seconds, share of total_seconds, GFLOP/s. */
void ds_profile_print(const ds_profile *prof, double total_seconds, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
