/* `dspark capture`: runs the frozen target once over the training sequences and writes the
 * offline cache (format: dspark/cache.h): DSpark features and/or sparse KD log-probs. */
#ifndef DSPARK_CAPTURE_H
#define DSPARK_CAPTURE_H

#include "dspark/cache.h"
#include "dspark/comm.h"
#include "dspark/dataset.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  const char *target_dir, *data_path, *out_dir;
  int n_target_layers;           /* 5 (spread over [1, L-2] as `dspark train`) */
  int32_t target_layer_ids[DS_CACHE_MAX_LAYERS];
  int n_explicit_layers;
  ds_dtype dtype;                /* DS_BF16; DS_I8: int8 features (dspark/cache.h) */
  int64_t seq_len;               /* 512 */
  int64_t shard_size;            /* 64 */
  int features;                  /* 1; 0 = KD data only */
  int64_t topk;                  /* 0 = no KD data */
  double top_p, temperature;     /* 1, 1 */
  int64_t min_k;                 /* 1 */
  uint64_t seed;
  int threads, quiet;
  int forward_only;              /* benchmark: run the target (and the logits for KD) only; write nothing */
  int64_t throttle_ms;           /* testing aid: sleep after each shard */
  int estimate;                  /* print the cache's size (ds_cache_estimate) and write nothing */
  int no_space_check;            /* skip the refusal when the free disk space is smaller than that */
  ds_data_format data_format;    /* how data_path is read (DS_DATA_AUTO: by suffix, then content) */
  int skip_bad_lines;            /* skip (and count, in the summary) malformed data lines instead of stopping */
  size_t max_line_bytes;         /* the longest data line read (0: DS_DATA_MAX_LINE_DEFAULT; ds_data_options) */
  /* Several ranks (NULL: one process): shard k is computed and written by rank k mod world
   * (counting from the first shard still to write), rank 0 writes everything else; the cache is
   * the same, file for file, as one process writes. The output directory must be shared. */
  ds_comm *comm;
  const char *chat_template;     /* as ds_draft_train_options.chat_template */
  int enable_thinking;           /* as ds_draft_train_options.enable_thinking */
} ds_capture_options;

void ds_capture_options_default(ds_capture_options *o);
/* Captures (or resumes capturing) into o->out_dir. Prints progress on stderr unless quiet and
 * one JSON summary line on stdout. A write error leaves the cache resumable and says so. */
ds_status ds_capture_run(const ds_capture_options *o);

#ifdef __cplusplus
}
#endif
#endif
