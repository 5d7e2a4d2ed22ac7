/* The DSpark draft trainer: online (the live target runs on each batch) or from an offline
 * cache written by `dspark capture` (include/dspark/cache.h), in which case the cache's
 * sequences, features and frozen tables replace the target and the target need not be loaded.
 * Everything else (order, anchors, evaluation split, loss) is the same code, so training from
 * an f32 cache is bit-identical to online training with the same data and seed; from a bf16 /
 * f16 cache the only difference is the features' rounding to that dtype (round to nearest
 * even, as ds_convert_from_f32). One call runs a whole training job into a run directory:
 *   RUN/run.json              the full configuration (written at start)
 *   RUN/target_config.json    the target's config.json (export needs it)
 *   RUN/metrics.jsonl         one JSON object per step, and one per evaluation
 *   RUN/checkpoint.safetensors the last completed step (atomic; see checkpoint.h)
 * Data order, anchors and initialization are functions of (seed, step, sequence), so a run
 * killed and resumed (resume = 1) continues the identical trajectory. */
#ifndef DSPARK_TRAINER_H
#define DSPARK_TRAINER_H

#include "dspark/common.h"
#include "dspark/dataset.h"
#include "dspark/draft.h"
#include "dspark/dspark_loss.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  const char *target_dir;   /* optional with cache_dir: then its weight, config and tokenizer hashes are checked */
  const char *data_path;    /* optional with cache_dir: then its hash is checked */
  const char *out_dir;
  int resume;
  /* offline cache */
  const char *cache_dir;    /* NULL: online */
  int cache_preload;        /* convert the whole cache to fp32 in memory before training (benchmarks) */
  int cache_prefetch;       /* prefetch ring slots (4) */
  /* data; with cache_dir, seq_len 0 and n_target_layers 0 (without explicit ids) mean "the
   * cache's", any other value must equal the cache's */
  int64_t seq_len;          /* 512 */
  int64_t eval_seqs;        /* held-out sequences taken from the end of the data (8) */
  /* draft */
  int64_t draft_layers;     /* n_d (1) */
  int64_t block_size;       /* g (7) */
  int n_target_layers;      /* m (5) */
  int32_t target_layer_ids[DS_MAX_TARGET_LAYERS]; /* explicit list when n_explicit_layers > 0 */
  int n_explicit_layers;
  int32_t mask_token_id;    /* -1: the tokenizer's mask token */
  ds_markov_type markov_type;
  int64_t markov_rank;      /* 256 (0 with DS_MARKOV_NONE) */
  int confidence_head;      /* 1 */
  int confidence_with_markov; /* 1 */
  int64_t num_anchors;      /* 512 */
  /* loss */
  ds_dspark_loss_config loss;
  int no_teacher;           /* CE only (DFlash-style objective) */
  /* optimization */
  int64_t steps;            /* 100 */
  int64_t batch_seqs;       /* sequences per step (4); each is one micro-batch */
  double lr;                /* 6e-4 */
  double warmup_frac;       /* 0.04 */
  double weight_decay;      /* 0 */
  double grad_clip;         /* 1.0 */
  uint64_t seed;            /* 0 */
  int skip_nonfinite;       /* 0: stop on a non-finite loss or gradient */
  /* bookkeeping */
  int64_t save_every;       /* checkpoint every N steps (50) and at the end */
  int64_t eval_every;       /* evaluate every N steps (50), at step 0 and at the end */
  int64_t stop_after;       /* stop (as if killed) after this many steps in this process; 0 = never */
  int64_t inject_nan_step;  /* testing aid: poison the gradient at this step (0-based); -1 = never */
  int threads;              /* 0 = default */
  int quiet;                /* no progress line */
  ds_data_format data_format; /* how data_path is read (DS_DATA_AUTO: by suffix, then content) */
} ds_train_options;

void ds_train_options_default(ds_train_options *o);
ds_status ds_train_draft(const ds_train_options *o);

#ifdef __cplusplus
}
#endif
#endif
