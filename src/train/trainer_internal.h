/* The trainer core's state, shared by the loop (trainer.c), the run directory and metrics
 * (trainer_run.c) and the checkpoint (trainer_checkpoint.c). Not a public header. */
#ifndef DSPARK_TRAIN_TRAINER_INTERNAL_H
#define DSPARK_TRAIN_TRAINER_INTERNAL_H

#include <stdio.h>

#include "dspark/fileio.h"
#include "dspark/optim.h"
#include "dspark/trainer.h"

struct ds_trainer {
  const ds_objective *obj;
  const ds_objective_ops *ops;
  void *self;
  ds_loop_options o;
  int64_t step;            /* optimizer steps completed (the checkpoint's) */
  int64_t skipped;         /* steps skipped for non-finite values */
  int64_t first_step;      /* where this process started */
  int eval_first;          /* evaluate before the first step of this process (step 0, or one a kill lost) */
  int64_t *perm;           /* (n_train) the current epoch's order */
  int64_t perm_epoch;
  double *grad_sum;        /* (n_params) the step's gradient summed item by item in fp64; NULL when a step
                              has one item on one rank (see train_step) */
  double *report_rows;     /* (max(batch_items, n_eval), REPORT_DOUBLES) one report per item (trainer.c) */
  ds_adamw opt;
  ds_adamw_config acfg;
  char *train_config;      /* the objective's options + the loop's (checkpoint metadata; compared on resume) */
  char *ckpt_path, *metrics_path, *run_json_path;
  FILE *metrics;
  ds_dir_lock lock;
};

/* trainer_run.c: the run directory */
/* Creates it (with parents), takes its lock, refuses an existing run unless resume or
 * overwrite (which removes the run's files), and removes stale temp files. */
ds_status ds_trainer_run_dir_open(ds_trainer *t);
/* The paths of the run's files only (the ranks that read the run directory but never write it). */
ds_status ds_trainer_run_paths(ds_trainer *t);
/* Builds t->train_config from the objective's JSON and the loop options. */
ds_status ds_trainer_build_config(ds_trainer *t);
/* run.json: train_config plus the objective's run_info. */
ds_status ds_trainer_write_run_json(ds_trainer *t);
/* Opens metrics.jsonl: truncated on a fresh run; on resume, records after the checkpoint's
 * step and a torn last line are dropped. *has_eval tells whether an evaluation record for the
 * current step survived. */
ds_status ds_trainer_metrics_open(ds_trainer *t, int *has_eval);
/* One metrics record; a write error (full disk) is an error naming the file. */
ds_status ds_trainer_metrics_write(ds_trainer *t, const char *kind, const ds_report *r, double lr, double grad_norm,
                                   double tok_s, double elapsed);
void ds_trainer_run_dir_close(ds_trainer *t);

/* trainer_checkpoint.c */
ds_status ds_trainer_save(ds_trainer *t);
/* Resume from t->ckpt_path: verifies it, refuses a changed option by name, rebuilds the
 * objective's model and the optimizer state. */
ds_status ds_trainer_load(ds_trainer *t);

#endif
