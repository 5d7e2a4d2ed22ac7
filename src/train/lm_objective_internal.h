/* The causal-LM objectives' state, shared by their ops (lm_objective.c) and their setup,
 * buffers and cache source (lm_objective_setup.c). Not a public header. */
#ifndef DSPARK_TRAIN_LM_OBJECTIVE_INTERNAL_H
#define DSPARK_TRAIN_LM_OBJECTIVE_INTERNAL_H

#include "dspark/cache.h"
#include "dspark/kd_intermediate.h"
#include "dspark/chat_template.h"
#include "dspark/lm_trainer.h"
#include "dspark/sequences.h"
#include "dspark/student.h"
#include "dspark/target.h"
#include "dspark/tokenizer.h"

/* The objectives' metric pairs: kd_loss.h's, then the intermediate pairs' mean loss (the mean
 * over pairs of sum_r l / tokens, present with --intermediate). */
enum { LM_PAIR_INTERMEDIATE = DS_KD_PAIR_COUNT, LM_PAIR_COUNT };

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
  float *tlogits;               /* [DS_KD_TEACHER_ROWS, V] (top-K) or [chunk, V] (dense KL) of its logits */
  int32_t *topk_ids;            /* [S, K] the current sample's targets (top-K) */
  float *topk_lp, *select_scratch; /* [S, K], [DS_KD_TEACHER_ROWS, V] */
  /* the offline cache */
  ds_cache *fc;
  ds_cache_stream *stream;
  ds_trainer_plan plan;
  int64_t k_stride;             /* the cache's K */
  const int32_t *cur_topk_ids;  /* [T, k_stride] of the current sample */
  const float *cur_topk_lp;
  /* intermediate-layer pairs (lm_intermediate.c) */
  int n_inter;
  int64_t dt;                   /* the teacher's hidden size */
  int32_t tlayers[DS_KD_MAX_INTERMEDIATE]; /* the live teacher's capture list (increasing) */
  int n_tlayers;
  int64_t inter_col[DS_KD_MAX_INTERMEDIATE]; /* pair i's teacher layer: its float offset in a feature row */
  int64_t feat_stride;          /* floats per row of the teacher's features */
  float *tcaptured;             /* live: [S, n_tlayers * dt] */
  const float *cur_tfeat;       /* the current item's teacher features (tcaptured, or the cache's) */
  size_t proj_offset[DS_KD_MAX_INTERMEDIATE]; /* pair i's projection in the student's extra params */
  int has_proj[DS_KD_MAX_INTERMEDIATE];
  size_t n_proj_floats;
  float *inter_out;             /* [n_inter, S, dt] projected student rows */
  float *inter_dh;              /* [n_inter, S, d] each pair's gradient at its student layer */
  float *inter_dy;              /* [S, dt] */
  double *inter_rows;           /* [S] */
  /* per-sequence buffers */
  float *logits, *dh;           /* [chunk, V], [S, d] */
  double *kd_rows, *lm_rows;    /* [S] */
  int32_t *labels;              /* [S] */
  uint8_t *mask;                /* [S] */
} lm_run;

/* The intermediate-layer pairs of one item (lm_intermediate.c). */
typedef struct {
  double mean_sum;   /* the pairs' loss sums averaged (unnormalized, like the kd numerator) */
  double balanced;   /* mean_sum * scale: what the balancer adds to the kd numerator */
  int n_extra;
  ds_student_hidden_grad extra[DS_KD_MAX_INTERMEDIATE];
} lm_inter_item;

/* Checks the pairs against the student, the teacher or the cache (each refusal naming
 * --intermediate or the manifest field) and maps each to its teacher feature columns. */
ds_status ds_lm_inter_setup(lm_run *t, const ds_model_config *sc);
ds_status ds_lm_inter_buffers(lm_run *t);
/* The projections in the student's extra params: the rectangular identity (ck NULL) or a
 * checkpoint's "intermediate.<i>.proj.weight". */
ds_status ds_lm_inter_params(lm_run *t, const ds_safetensors *ck);
ds_status ds_lm_inter_save(lm_run *t, ds_st_writer *w);
/* After the forward and the logits loss of an item of T rows: every pair's loss, the balance
 * against the logits KD (sums kd_sum, lm_sum; norm = the step's token count) and, with
 * grad_scale > 0, each pair's gradient at its student layer (out->extra). */
ds_status ds_lm_inter_item(lm_run *t, int64_t T, double alpha, double lm_sum, double kd_sum, double norm,
                           double grad_scale, lm_inter_item *out);
void ds_lm_inter_free(lm_run *t);

ds_status ds_lm_setup(lm_run *t);
ds_status ds_lm_buffers(lm_run *t);
ds_status ds_lm_cache_start(lm_run *t);
/* Points cur_topk_* at sample idx's KD rows (the next one in plan order). */
ds_status ds_lm_cache_features(lm_run *t, int64_t idx);
/* RUN/tokenizer.json, so that an export of the student is a complete model directory. */
ds_status ds_lm_write_tokenizer(lm_run *t);
void ds_lm_free(lm_run *t);

#endif
