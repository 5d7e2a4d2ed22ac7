/* Causal-LM objectives of the trainer core (dspark/trainer.h): pretraining a student
 * (`dspark pretrain`: the LM cross-entropy, kd_loss_alpha = 0) and distilling it from a frozen
 * teacher (`dspark distill`: the ghost-token sparse KL of spec/kd.md mixed with the LM loss by
 * kd_loss_alpha), the teacher live (its top-K selected per row by the capture's code, or its
 * full distribution for the dense KL) or from an offline cache written by
 * `dspark capture --topk`. The student is dspark/student.h; the loss dspark/kd_loss.h, row
 * chunked (no [tokens, V] tensor). Data, order, evaluation split, checkpoints, resume, metrics
 * and progress are the core's. Checkpoint format "dspark-student-checkpoint": tensors
 * "student.<HF name>", "intermediate.<i>.proj.weight" [d_teacher, d_student] for the
 * --intermediate pairs with a projection, metadata "student_config" (the student's config.json
 * text). */
#ifndef DSPARK_LM_TRAINER_H
#define DSPARK_LM_TRAINER_H

#include "dspark/dataset.h"
#include "dspark/kd_intermediate.h"
#include "dspark/kd_loss.h"
#include "dspark/trainer.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DS_STUDENT_CHECKPOINT_FORMAT "dspark-student-checkpoint"

typedef struct {
  ds_loop_options loop;
  /* the student: one of the two */
  const char *student_dir;      /* an HF checkpoint to continue */
  const char *student_config;   /* a config.json for a fresh student (seeded by loop.seed) */
  const char *tokenizer_path;   /* tokenizer.json (default: the student dir's, else the teacher's or cache's) */
  /* data (not with cache_dir, which brings its own sequences) */
  const char *data_path;
  ds_data_format data_format;
  const char *chat_template;    /* a Jinja file overriding the tokenizer's template for chat data; NULL: the
                                 * template beside the tokenizer (chat_template.jinja / tokenizer_config.json) */
  int enable_thinking;          /* passed to the template as enable_thinking: 0 / 1; -1: not passed */
  int skip_bad_lines;           /* skip (and count) malformed data lines instead of stopping */
  size_t max_line_bytes;        /* the longest data line read (0: DS_DATA_MAX_LINE_DEFAULT; ds_data_options) */
  int64_t seq_len;              /* 512 */
  int64_t eval_seqs;            /* 8 */
  /* distillation: none of the two for pretraining */
  const char *teacher_dir;      /* the live teacher */
  const char *cache_dir;        /* an offline KD cache (top-K log-probs) */
  ds_kd_loss_config kd;         /* kd_loss_alpha 0 for pretraining; top_k 0 with a live teacher: dense KL */
  int distill;                  /* 1: `distill` (a teacher or cache is required) */
  /* intermediate-layer pairs (--intermediate S:T[:cosine|mse], dspark/kd_intermediate.h): part
   * of the KD term, balanced against the logits KD per micro-batch (kd.md section 3) */
  ds_kd_inter_pair intermediate[DS_KD_MAX_INTERMEDIATE];
  int n_intermediate;
} ds_lm_train_options;

void ds_lm_train_options_default(ds_lm_train_options *o, int distill);
ds_status ds_train_lm(const ds_lm_train_options *o);

#ifdef __cplusplus
}
#endif
#endif
