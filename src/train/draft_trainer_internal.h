/* Shared state of the draft trainer (draft_trainer.c: the loop; draft_trainer_cache.c: the
 * offline-cache feature source). Not a public header. */
#ifndef DSPARK_DRAFT_TRAINER_INTERNAL_H
#define DSPARK_DRAFT_TRAINER_INTERNAL_H

#include <stdio.h>

#include "dspark/cache.h"
#include "dspark/dataset.h"
#include "dspark/optim.h"
#include "dspark/target.h"
#include "dspark/tokenizer.h"
#include "dspark/trainer.h"

/* The order in which the trainer will ask for features (evaluations included): the prefetch
 * thread is fed from it, ahead of the loop. */
typedef struct {
  int64_t step, j;
  int in_eval;
  int64_t *perm;              /* (n_train) its own copy of the epoch order */
  int64_t perm_epoch;
} feature_plan;

typedef struct {
  ds_train_options opt;       /* the effective options (seq_len and layers resolved from a cache) */
  const ds_train_options *o;  /* == &opt */
  ds_target *target;          /* online only */
  ds_tokenizer *tok;
  ds_dataset data;
  int64_t n_train, n_eval;
  ds_draft *draft;
  ds_adamw opt_state;
  ds_adamw_config acfg;
  ds_kv_cache *cache;
  int32_t layer_ids[DS_MAX_TARGET_LAYERS];
  int n_layers;
  float *ctx, *last;          /* (S, m*d), (S, d) online feature buffers */
  const float *cur_ctx, *cur_last; /* the features of the sequence being trained on */
  int64_t *anchors;           /* (A) */
  uint8_t *keep, *eval;       /* (A), (A * g) */
  uint8_t *sup;               /* (A * g) */
  double *w;                  /* (A * g) */
  int64_t *perm;              /* (n_train) the current epoch's order */
  int64_t perm_epoch;
  char *target_config, *train_config, *run_config, *draft_config;
  char tokenizer_label[1024]; /* where the mask token was looked up (messages) */
  FILE *metrics;
  int64_t step, skipped;
  /* offline cache */
  ds_cache *fc;
  ds_cache_stream *stream;
  feature_plan plan;
  float *pre_ctx, *pre_last;  /* preload: (n, S, m*d), (n, S, d) */
  float *embed, *lm_head;     /* (V, d) frozen tables read from the cache */
  const char *cfg_target, *cfg_data; /* recorded in run.json (the capture's, with a cache) */
  const char *feature_dtype;  /* NULL for fp32 features (online or f32 cache) */
} trainer;

/* draft_trainer_config.c */
ds_status ds_trainer_resolve_mask_token(const trainer *t, int32_t *out);
/* train_config (checkpoint metadata, compared on resume) and run_config (run.json). */
ds_status ds_trainer_config_texts(trainer *t, const ds_draft_config *dc, uint64_t data_hash);
ds_status ds_trainer_check_same_config(const char *saved, const char *now, const char *ckpt_path);
ds_status ds_trainer_trim_metrics(const char *path, int64_t last_step);

/* Dataset index of batch sequence j of a step: a seeded permutation per epoch. */
int64_t ds_trainer_order(const ds_train_options *o, int64_t n_train, int64_t *perm, int64_t *perm_epoch,
                         int64_t step, int64_t j);

/* Opens the cache, checks it against the options, and fills data, tokenizer, target config,
 * layer ids and the effective options. */
ds_status ds_trainer_cache_setup(trainer *t);
/* Starts the prefetch stream (or the preload) once the first step is known. */
ds_status ds_trainer_cache_start(trainer *t);
/* Points cur_ctx / cur_last at sample idx's features (the next one in plan order). */
ds_status ds_trainer_cache_features(trainer *t, int64_t idx);
void ds_trainer_cache_free(trainer *t);

#endif
