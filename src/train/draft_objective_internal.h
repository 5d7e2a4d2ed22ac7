/* The draft objective's state, shared by its ops (draft_objective.c), its offline-cache
 * feature source (draft_objective_cache.c) and its configuration (draft_objective_config.c).
 * Not a public header. */
#ifndef DSPARK_TRAIN_DRAFT_OBJECTIVE_INTERNAL_H
#define DSPARK_TRAIN_DRAFT_OBJECTIVE_INTERNAL_H

#include "dspark/cache.h"
#include "dspark/draft_trainer.h"
#include "dspark/dspark_loss.h"
#include "dspark/sequences.h"
#include "dspark/target.h"
#include "dspark/tokenizer.h"

typedef struct {
  ds_draft_train_options opt; /* the effective options (seq_len and layers resolved from a cache) */
  const ds_draft_train_options *o; /* == &opt */
  const ds_trainer *core;     /* set at start */
  ds_target *target;          /* online only */
  ds_tokenizer *tok;
  ds_dataset data;
  int64_t n_train, n_eval;
  ds_model_config tc;         /* the target's config */
  ds_draft_config dc;         /* the draft this run trains (from the options) */
  ds_draft *draft;
  ds_kv_cache *kv;
  float *ctx, *last;          /* (S, m*d), (S, d) online feature buffers */
  const float *cur_ctx, *cur_last; /* the features of the sequence being trained on */
  int64_t *anchors;           /* (A) */
  uint8_t *keep, *eval;       /* (A), (A * g) */
  uint8_t *sup;               /* (A * g) */
  double *w;                  /* (A * g) */
  char *target_config;        /* the target's config.json text */
  char *train_config, *run_info, *draft_config;
  char tokenizer_label[1024]; /* where the tokenizer came from (messages) */
  char config_label[1100];    /* where target_config came from (messages) */
  /* content hashes of what defines the trajectory (recorded in train_config, so a resume after
   * moving files works and one with changed files is refused) */
  uint64_t weights_xxh64, config_xxh64, tokenizer_xxh64, sequences_xxh64;
  char chat_template[600]; /* what rendered the chat data: "PATH (xxh64 HEX)" or "ChatML"; "" without data */
  const char *cfg_target, *cfg_data; /* paths recorded in run.json (the capture's, with a cache) */
  const char *feature_dtype;  /* NULL for fp32 features (online or f32 cache) */
  char cache_weights[16];     /* the cache's target_weights ("" online, or a cache that records none) */
  /* offline cache */
  ds_cache *fc;
  ds_cache_stream *stream;
  ds_trainer_plan plan;
  float *pre_ctx, *pre_last;  /* preload: (n, S, m*d), (n, S, d) */
  ds_weight embed, lm_head;   /* (V, d) frozen tables read from the cache (fresh runs, and lm_head for
                                 a reduced vocabulary's teacher on resume too; owned) */
  /* --draft-vocab (spec section 4a) */
  ds_ids vocab_mandatory;     /* ids every S holds: the template's assistant-turn ids, stop / eos ids */
  int32_t *vocab_ids;         /* [N] S, sorted; NULL without --draft-vocab */
  uint64_t vocab_xxh64;       /* of S (train_config: a resume must select the same S) */
  double vocab_coverage;      /* share of the training split's supervised tokens whose id is in S */
  ds_weight teacher_head;     /* [V, d] the target's lm_head, the teacher of a reduced draft (not owned) */
  ds_dspark_teacher_stat **memo; /* [n_train + n_eval] each sample's teacher stats per position, or NULL
                                    (draft_loss.h: a reduced vocabulary's full teacher product once) */
  size_t memo_bytes;
} draft_run;

/* draft_objective_config.c */
ds_status ds_draft_run_mask_token(const draft_run *t, int32_t *out);
/* Checks the options against the target and the data (limits named), builds t->dc. */
ds_status ds_draft_run_config(draft_run *t);
/* train_config (compared on resume) and run_info (paths, cache) as JSON texts. */
ds_status ds_draft_run_config_texts(draft_run *t);
/* A checkpoint's draft config must be the one the options build, field by field. */
ds_status ds_draft_run_check_loaded(const draft_run *t, const ds_draft_config *saved, const char *ckpt_path);

/* The target's config.json (t->target_config, copied) and the hashes of it and of its
 * tokenizer.json (as the cache records them), with the labels that name them. */
ds_status ds_draft_target_texts(draft_run *t, ds_model_source *src);

/* draft_objective_vocab.c */
/* Appends to t->vocab_mandatory the ids tmpl (NULL: ChatML) emits in an assistant turn: the
 * supervised ids of a probe conversation whose answer is empty. */
ds_status ds_draft_run_template_ids(draft_run *t, const ds_chat_template *tmpl, int thinking);
/* With --draft-vocab N: adds the stop and eos ids of stops, counts the supervised target tokens of
 * the training split, selects S (t->vocab_ids, t->dc.draft_vocab_size = N) and notes its coverage. */
ds_status ds_draft_run_vocab(draft_run *t, const ds_model_config *stops);

/* draft_objective_cache.c */
/* Opens the cache, checks it against the options, and fills data, tokenizer, target config,
 * hashes, layer ids and the effective options. */
ds_status ds_draft_cache_setup(draft_run *t);
/* Starts the prefetch stream (or the preload) in the core's plan order. */
ds_status ds_draft_cache_start(draft_run *t);
/* Points cur_ctx / cur_last at sample idx's features (the next one in plan order). */
ds_status ds_draft_cache_features(draft_run *t, int64_t idx);
void ds_draft_cache_free(draft_run *t);

#endif
