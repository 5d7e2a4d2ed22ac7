/* The DSpark draft objective of the trainer core (dspark/trainer.h): online (the live target
 * runs on each sequence) or from an offline cache written by `dspark capture`
 * (dspark/cache.h), in which case the cache's sequences, features and frozen tables replace the
 * target and the target need not be loaded. Everything else (order, anchors, evaluation
 * split, loss) is the same code, so training from an f32 cache is bit-identical to online
 * training with the same data and seed; from a bf16 / f16 cache the only difference is the
 * features' rounding to that dtype. Besides the core's files the run directory holds
 *   RUN/target_config.json   the target's config.json (for reference; export uses the checkpoint)
 * and the checkpoint's format is "dspark-draft-checkpoint" with the tensors "draft.<export
 * name>" (frozen replicas included, so it is self-contained) and the metadata "draft_config"
 * (the exported config.json text). Anchors and initialization are functions of (seed, step,
 * sequence), so a run killed and resumed continues the identical trajectory. */
#ifndef DSPARK_DRAFT_TRAINER_H
#define DSPARK_DRAFT_TRAINER_H

#include "dspark/common.h"
#include "dspark/dataset.h"
#include "dspark/draft.h"
#include "dspark/dspark_loss.h"
#include "dspark/trainer.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DS_DRAFT_CHECKPOINT_FORMAT "dspark-draft-checkpoint"

typedef struct {
  ds_loop_options loop;     /* steps, batch (sequences per step), optimizer, run directory, ... */
  const char *target_dir;   /* optional with cache_dir: then its weight, config and tokenizer hashes are checked */
  const char *data_path;    /* optional with cache_dir: then its hash is checked */
  ds_data_format data_format; /* how data_path is read (DS_DATA_AUTO: by suffix, then content) */
  int skip_bad_lines;       /* skip (and count) malformed data lines instead of stopping */
  size_t max_line_bytes;    /* the longest data line read (0: DS_DATA_MAX_LINE_DEFAULT; ds_data_options) */
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
  int target_layers_given;  /* m was asked for explicitly: refuse a target too shallow for it */
  int32_t target_layer_ids[DS_MAX_TARGET_LAYERS]; /* explicit list when n_explicit_layers > 0 */
  int n_explicit_layers;
  int32_t mask_token_id;    /* -1: the tokenizer's mask token */
  ds_markov_type markov_type;
  int64_t markov_rank;      /* 256 (0 with DS_MARKOV_NONE); at most the vocabulary size */
  int confidence_head;      /* 1 */
  int confidence_with_markov; /* 1 */
  int64_t num_anchors;      /* 512 */
  /* loss */
  ds_dspark_loss_config loss;
  int no_teacher;           /* CE only (DFlash-style objective) */
  const char *chat_template; /* a Jinja file for chat data; NULL: the target's own (chat_template.jinja or
                                tokenizer_config.json), ChatML when it has none */
  int enable_thinking;      /* passed to the chat template as in ds_chat_options: -1 not passed (the default), 0 false, 1 true */
  int64_t draft_vocab;      /* N > 0: a reduced draft vocabulary of N ids (spec section 4a); 0: the whole vocabulary */
} ds_draft_train_options;

void ds_draft_train_options_default(ds_draft_train_options *o);
/* The reduced draft vocabulary of `train --draft-vocab N`: every mandatory id (n_mandatory of
 * them, duplicates allowed), then the ids of highest counts [V] (NULL: all 0) among the rest,
 * ties by lower id, until N; out [N] sorted ascending. Refused naming --draft-vocab: N outside
 * [1, V], or fewer than the distinct mandatory ids. */
ds_status ds_draft_vocab_select(const int64_t *counts, int64_t V, int64_t N, const int32_t *mandatory,
                                int64_t n_mandatory, int32_t *out);
/* Trains (or resumes) a draft into o->loop.out_dir. */
ds_status ds_train_draft(const ds_draft_train_options *o);

#ifdef __cplusplus
}
#endif
#endif
