/* The causal-LM objectives' state, shared by their ops (lm_objective.c) and their setup,
 * buffers and cache source (lm_objective_setup.c). Not a public header. */
#ifndef DSPARK_TRAIN_LM_OBJECTIVE_INTERNAL_H
#define DSPARK_TRAIN_LM_OBJECTIVE_INTERNAL_H

#include "dspark/cache.h"
#include "dspark/chat_template.h"
#include "dspark/lm_trainer.h"
#include "dspark/sequences.h"
#include "dspark/student.h"
#include "dspark/target.h"
#include "dspark/tokenizer.h"

typedef struct {
  ds_lm_train_options opt;
  const ds_lm_train_options *o; /* == &opt */
  ds_kd_loss_config cfg;        /* the loss (checked against the vocabulary) */
  const ds_trainer *core;
  ds_student *student;
  char *student_json;           /* a fresh student's config.json text */
  char *saved_config;           /* the student's config as checkpoints record it */
  int64_t V, d;                 /* the student's vocabulary and hidden size */
  ds_tokenizer *tok;
  char *tok_text;               /* tokenizer.json's bytes (copied into the run directory) */
  ds_chat_template *chat;       /* the template beside the tokenizer for chat data; NULL: ChatML */
  size_t tok_len;
  ds_dataset data;
  int64_t n_train, n_eval;
  const char *data_label;
  char *train_config, *run_info;
  /* the live teacher */
  ds_target *teacher;
  ds_kv_cache *kv;
  float *thidden;               /* [S, d_teacher] its final-normed hidden rows */
  float *tlogits;               /* [chunk, V] a chunk of its logits */
  int32_t *topk_ids;            /* [chunk, K] */
  float *topk_lp, *select_scratch; /* [chunk, K], [V] */
  /* the offline cache */
  ds_cache *fc;
  ds_cache_stream *stream;
  ds_trainer_plan plan;
  int64_t k_stride;             /* the cache's K */
  const int32_t *cur_topk_ids;  /* [T, k_stride] of the current sample */
  const float *cur_topk_lp;
  /* per-sequence buffers */
  float *logits, *dh;           /* [chunk, V], [S, d] */
  double *kd_rows, *lm_rows;    /* [S] */
  int32_t *labels;              /* [S] */
  uint8_t *mask;                /* [S] */
} lm_run;

ds_status ds_lm_setup(lm_run *t);
ds_status ds_lm_buffers(lm_run *t);
ds_status ds_lm_cache_start(lm_run *t);
/* Points cur_topk_* at sample idx's KD rows (the next one in plan order). */
ds_status ds_lm_cache_features(lm_run *t, int64_t idx);
/* RUN/tokenizer.json, so that an export of the student is a complete model directory. */
ds_status ds_lm_write_tokenizer(lm_run *t);
void ds_lm_free(lm_run *t);

#endif
