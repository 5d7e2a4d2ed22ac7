/* `dspark capture --estimate` and the free-space check before a capture (capture_size.c). */
#ifndef DSPARK_CAPTURE_SIZE_H
#define DSPARK_CAPTURE_SIZE_H

#include "dspark/cache.h"

/* Prints the estimate: a table on stderr (unless quiet) and one JSON line on stdout. out_dir
 * may be NULL or empty (then no free space is reported). */
void capture_print_estimate(const ds_cache_size *z, const ds_cache_manifest *m, const char *out_dir, int quiet);
/* Refuses (DS_ERR_IO, naming both numbers) when the free space of out_dir's filesystem is
 * smaller than what is still to be written: the shards from first_shard on, the target
 * weights unless weights_ok, the copies and the manifest. */
ds_status capture_check_space(const ds_cache_size *z, const char *out_dir, int64_t first_shard, int weights_ok);

#endif
