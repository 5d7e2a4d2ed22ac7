/* Private pieces of the cache writer shared by cache_capture.c and cache_shard.c. */
#ifndef DSPARK_IO_CACHE_INTERNAL_H
#define DSPARK_IO_CACHE_INTERNAL_H

#include "dspark/cache.h"

/* One shard being filled, in the cache's layout (include/dspark/cache.h). */
typedef struct {
  int64_t *len;        /* (n) */
  int32_t *ids;        /* (n, S) */
  uint8_t *mask;       /* (n, S) */
  unsigned char *ctx;  /* (n, S, m*d) dtype */
  unsigned char *last; /* (n, S, d) dtype */
  int32_t *kid;        /* (n, S, K) */
  unsigned char *klp;  /* (n, S, K) dtype */
} ds_shard_buf;

ds_status ds_shard_buf_alloc(ds_shard_buf *b, const ds_cache_manifest *m, int64_t n);
void ds_shard_buf_free(ds_shard_buf *b);
/* Row j from one sample's fp32 outputs (ctx [len, m*d], last [len, d], kd_ids / kd_lp [len, K];
 * unused ones may be NULL): padding becomes zeros, KD padding the sentinels. */
ds_status ds_shard_store(ds_shard_buf *b, const ds_cache_manifest *m, int64_t j, int64_t len, const int32_t *ids,
                         const uint8_t *mask, const float *ctx, const float *last, const int32_t *kd_ids,
                         const float *kd_lp);
/* Writes rows [0, n) atomically to path; returns the file's xxh64 and size. */
ds_status ds_shard_write(const ds_shard_buf *b, const ds_cache_manifest *m, int64_t n, const char *path,
                         uint64_t *hash, int64_t *bytes);

#endif
