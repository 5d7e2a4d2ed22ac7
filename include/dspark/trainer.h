/* The trainer core: one training loop for every objective (the DSpark draft now; student
 * distillation and causal-LM pretraining next). It knows nothing of drafts. It owns:
 *   - the data order: a seeded permutation of the training items per epoch, batch item j of
 *     step s a pure function of (seed, s, j) (ds_trainer_item);
 *   - micro-batches with the GLOBAL denominator: every item's weight is summed first (masks
 *     only, no model), then each micro-step scales its gradient by 1 / W_step (spec/dspark.md
 *     section 4: never a mean of means);
 *   - the one place where a step's gradients are complete: each item's gradient summed in
 *     fp64, all-reduced over the data-parallel ranks (ds_loop_options.comm), rounded once;
 *     then the non-finite policy, clipping, AdamW and the warmup + cosine schedule;
 *   - the run directory: an exclusive lock, run.json, metrics.jsonl (one JSON object per step
 *     and per evaluation), the checkpoint (atomic, self-contained, every tensor and the
 *     metadata checksummed; resume refuses a changed option by name and continues the
 *     identical trajectory), evaluations (at step 0, every eval_every steps and at the end,
 *     re-run on resume when a kill lost one), the progress line with rate and ETA, and the test
 *     hooks (stop_after, inject_nan_step).
 *
 * How an objective plugs in (src/train/draft_objective.c is the example):
 *   1. It fills a ds_objective with its ops table (below) and its state, and calls
 *      ds_trainer_run(&objective, &loop_options), which locks the run directory and then calls:
 *        setup: load the data and the model shapes, fill n_train / n_eval items (sequences;
 *          held-out items are n_train .. n_train + n_eval - 1), the JSON text of the options
 *          that define the trajectory (train_config; compared on resume) and what run.json
 *          records besides (run_info) -- after the lock, so a refused run costs nothing;
 *        init (fresh run) or load (resume, from the checkpoint's tensors and metadata);
 *        start (the data order from where this process begins is known now: a prefetching
 *          source replays ds_trainer_plan_next);
 *        per step: weight(item) for every batch item, then zero_grads and micro_step(item,
 *          W_step) for every item; eval_item over the held-out items at evaluations;
 *        save at checkpoints (its tensors, prefixed, and its metadata).
 *   2. Its flat parameter and gradient buffers (params / grads, n_params floats) are what
 *      clipping, AdamW and the checkpoint's optimizer state cover.
 * Reporting pairs (spec section 4) travel in ds_report: named [numerator, denominator] pairs
 * and an optional per-position vector of pairs; metrics print num / den (0 when den is 0). */
#ifndef DSPARK_TRAINER_H
#define DSPARK_TRAINER_H

#include "dspark/backend.h"
#include "dspark/comm.h"
#include "dspark/common.h"
#include "dspark/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The options every training loop shares. */
typedef struct {
  const char *out_dir;      /* the run directory (created with its parents) */
  int resume;               /* continue from out_dir's checkpoint (a fresh start when there is none) */
  int overwrite;            /* replace an existing run's files; without it (or resume) an existing run is refused */
  int64_t steps;            /* 100 */
  int64_t batch_items;      /* items (sequences) per step (4); each is one micro-batch */
  double lr;                /* 6e-4 */
  double warmup_frac;       /* 0.04 */
  double weight_decay;      /* 0 */
  double grad_clip;         /* 1.0; 0 disables */
  uint64_t seed;            /* 0 */
  int skip_nonfinite;       /* 0: stop on a non-finite loss, gradient or input; 1: skip the step */
  int64_t save_every;       /* checkpoint every N steps (50) and at the end */
  int64_t eval_every;       /* evaluate every N steps (50), at step 0 and at the end; 0: never */
  int64_t stop_after;       /* stop (as if killed) after this many steps in this process; 0 = never */
  int64_t inject_nan_step;  /* testing aid: poison the gradient of this step (1-based, as progress counts); 0 = never */
  int threads;              /* 0 = default */
  int quiet;                /* no progress line */
  int profile;              /* time and GFLOP/s per kernel of the trained model, printed when the loop ends */
  /* Data parallelism (include/dspark/comm.h; NULL: one process). Each rank runs batch items
   * j = rank, rank + world, ... of every step (the global batch does not depend on the number
   * of ranks), gradients and reports are summed over ranks before the step's update, and rank 0
   * alone writes the run directory. */
  ds_comm *comm;
} ds_loop_options;

void ds_loop_options_default(ds_loop_options *o);

/* The backend an objective runs its trained model on: the CPU backend, or with o->profile the
 * profiling backend around it (include/dspark/profile.h), whose table ds_trainer_run prints at
 * its end. Frozen models (a target, a teacher) keep the plain CPU backend. */
const ds_backend *ds_loop_backend(const ds_loop_options *o);

enum { DS_REPORT_MAX_PAIRS = 12, DS_REPORT_MAX_VEC = 64 };

/* What micro-steps and evaluations accumulate (everything is a sum, so reports of micro-batches
 * and of data-parallel ranks add up). */
typedef struct {
  double numerator;                        /* the loss numerator (weighted terms, unnormalized) */
  double W;                                /* its denominator (the weight sum) */
  double num_tokens;                       /* supervised tokens (unweighted count) */
  double seen_tokens;                      /* tokens processed (the rate on the progress line) */
  double pair[DS_REPORT_MAX_PAIRS][2];     /* [numerator, denominator] per named pair */
  int pair_present[DS_REPORT_MAX_PAIRS];
  double vec[DS_REPORT_MAX_VEC][2];        /* per-position pairs (vec_len of them) */
} ds_report;

/* One batch item of a step: batch position j of step `step` (0-based) is data item `index`. */
typedef struct {
  int64_t step, j, index;
} ds_step_item;

typedef struct ds_trainer ds_trainer;
typedef struct ds_objective ds_objective;

typedef struct {
  const char *name;              /* "draft": used in messages */
  const char *checkpoint_format; /* the checkpoint's metadata "format", e.g. "dspark-draft-checkpoint" */
  const char *const *pair_names; /* n_pairs metric names, e.g. "loss", "ce", ...; pair 0 is the loss */
  int n_pairs;
  int progress_pair;             /* a second pair shown on the progress line (-1: none) */
  const char *progress_label;    /* its label there, e.g. "accept" */
  const char *exp_name;          /* a derived metric exp(value of pair exp_pair), e.g. "ppl" (NULL: none) */
  int exp_pair;
  const char *vec_name;          /* per-position vector in metrics (NULL: none), written when pair */
  int vec_pair;                  /* vec_pair is present */
  int vec_len;

  /* Loads data and shapes; fills obj->n_train, n_eval, train_config, run_info, data_label. */
  ds_status (*setup)(void *self, ds_objective *obj);
  /* Fresh run: initialize the model (seeded). */
  ds_status (*init)(void *self, uint64_t seed);
  /* Resume: rebuild the model from the checkpoint (tensors under its own prefix, its metadata),
   * refusing one that disagrees with the options, naming the field. */
  ds_status (*load)(void *self, const ds_safetensors *ckpt);
  /* The data order from where this process begins is known: start streams here. */
  ds_status (*start)(void *self, const ds_trainer *t);
  /* Flat trainable parameters and gradients (the same layout, n_params floats). */
  float *(*params)(void *self);
  float *(*grads)(void *self);
  size_t (*num_params)(void *self);
  void (*zero_grads)(void *self);
  /* The item's share of the step's denominator (masks only, no model). */
  ds_status (*weight)(void *self, const ds_step_item *it, double *w);
  /* Forward and backward on one item; gradients ACCUMULATE scaled by 1 / W_step. When
   * W_step <= 0 nothing is supervised in the whole step: the item contributes nothing (but a
   * streaming source still consumes it). Adds its reporting pairs into r. An input that is
   * not finite is DS_ERR_NUMERIC naming its source (the non-finite policy applies). */
  ds_status (*micro_step)(void *self, const ds_step_item *it, double W_step, ds_report *r);
  /* Held-out item e (data index n_train + e): loss and pairs, no gradient. */
  ds_status (*eval_item)(void *self, int64_t e, ds_report *r);
  /* Checkpoint: adds its tensors (names prefixed, e.g. "draft.") and its metadata to w. */
  ds_status (*save)(void *self, ds_st_writer *w);
} ds_objective_ops;

struct ds_objective {
  const ds_objective_ops *ops;
  void *self;
  /* filled by ops->setup */
  int64_t n_train, n_eval;       /* items; held-out items are n_train .. n_train + n_eval - 1 */
  const char *train_config;      /* JSON object: the options that define the trajectory (the loop's are appended) */
  const char *run_info;          /* JSON object merged into run.json (paths, cache, ...); may be NULL */
  const char *data_label;        /* the data's name in messages */
};

/* Runs (or resumes) a whole training job into o->out_dir:
 *   RUN/run.json                 the configuration (train_config, the loop's options, run_info)
 *   RUN/metrics.jsonl            one object per step ("kind":"train") and per evaluation ("eval")
 *   RUN/checkpoint.safetensors   the last completed step (see ds_trainer_checkpoint_* below)
 *   RUN/.lock                    held while running: a second writer is refused
 * The objective's own files (e.g. target_config.json) are its business. */
ds_status ds_trainer_run(ds_objective *obj, const ds_loop_options *o);

/* Data index of batch item j of step s (the seeded per-epoch permutation). */
int64_t ds_trainer_item(const ds_trainer *t, int64_t step, int64_t j);
/* The loop's options and counts, for objectives that size buffers or seed per step. */
const ds_loop_options *ds_trainer_options(const ds_trainer *t);
/* Whether this process writes the run directory (rank 0 of a data-parallel job, or the only
 * process): an objective's own files are written there by it alone. */
int ds_trainer_is_writer(const ds_trainer *t);

/* The order in which this process's loop will ask for items (evaluations included; on a rank
 * of a data-parallel job, only that rank's share), for a source that prefetches: begin, then
 * next until it returns 0. */
typedef struct {
  const ds_trainer *t;
  int64_t step, j;
  int in_eval;
  int64_t *perm;       /* (n_train) its own copy of the epoch order */
  int64_t perm_epoch;
} ds_trainer_plan;

ds_status ds_trainer_plan_begin(const ds_trainer *t, ds_trainer_plan *p);
int ds_trainer_plan_next(ds_trainer_plan *p, int64_t *index);
void ds_trainer_plan_free(ds_trainer_plan *p);

/* ---- checkpoints (format_version 2) ----
 * One safetensors file: the objective's tensors, "optim.m" and "optim.v" [n_params] F32, and
 * metadata format, format_version = "2", step, optim_step, skipped_steps, train_config, the
 * objective's own keys, "checksums" (JSON: tensor name -> xxh64 hex of its raw bytes) and
 * "metadata_xxh64" (xxh64 over every other metadata key and value, in key order, each
 * followed by a NUL). A flipped bit, a zeroed tensor or an edited field is refused naming
 * it. Format 1 (no checksums) is still read for export; resuming needs format 2. */
#define DS_CHECKPOINT_FORMAT_VERSION "2"

/* Checks the format name, the version (version_out: 1 or 2) and, for format 2, every checksum. */
ds_status ds_trainer_checkpoint_verify(const ds_safetensors *ck, const char *format, int *version_out);
/* A non-negative integer metadata field. */
ds_status ds_trainer_checkpoint_int(const ds_safetensors *ck, const char *key, int64_t *out);
/* Every value of an F32 tensor finite, naming the tensor and the first bad index. */
ds_status ds_check_finite_tensor(const char *file, const char *name, const float *x, size_t n);

#ifdef __cplusplus
}
#endif
#endif
