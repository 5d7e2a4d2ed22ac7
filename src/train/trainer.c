/* The trainer core's loop (include/dspark/trainer.h): data order, the step (global
 * denominator, micro-batches, non-finite policy, clipping, AdamW), evaluations, checkpoints,
 * progress. The objective supplies the model and the loss through ds_objective_ops.
 *
 * Data parallelism (o.comm with several ranks) changes three things and nothing else: each
 * rank runs the batch items j = rank, rank + world, ... of a step (the global batch, its order
 * and its denominator do not depend on the number of ranks); the step's gradient and report
 * are summed over the ranks before anything reads them (one all-reduce of the flat gradient,
 * one of the report); rank 0 alone writes the run directory. Every rank computes the step's
 * global denominator itself from the weights of all the step's items (masks only, cheap): the
 * same additions in the same order as one process, so W is bit-identical for any world size;
 * reports are kept per item and added in item order after the exchange (reduce_rows), so the
 * metrics are bit-identical too.
 *
 * The gradient is the same for any world size too, to the bit in practice: each item's
 * gradient is computed alone (from zeroed gradients, so it does not depend on which items
 * preceded it on its rank) and added into an fp64 sum; the ranks' fp64 sums are all-reduced
 * and rounded to fp32 once. fp32 partial sums would depend on how the items were split (a few
 * 1e-6 of the loss after 20 steps); fp64 sums of fp32 terms are exact or within 1e-16, so the
 * final rounding almost never tells the splits apart. It costs 8 bytes per parameter. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "dspark/backend.h"
#include "dspark/profile.h"
#include "dspark/progress.h"
#include "dspark/rng.h"
#include "train/trainer_internal.h"

void ds_loop_options_default(ds_loop_options *o) {
  memset(o, 0, sizeof *o);
  o->steps = 100;
  o->batch_items = 4;
  o->lr = 6e-4;
  o->warmup_frac = 0.04;
  o->weight_decay = 0.0;
  o->grad_clip = 1.0;
  o->save_every = 50;
  o->eval_every = 50;
}

const ds_loop_options *ds_trainer_options(const ds_trainer *t) { return &t->o; }

static int rank_of(const ds_trainer *t) { return ds_comm_rank(t->o.comm); }
static int world_of(const ds_trainer *t) { return ds_comm_size(t->o.comm); }

int ds_trainer_is_writer(const ds_trainer *t) { return rank_of(t) == 0; }

/* ------------------------------------------------------------------ data order */

/* Item j of step s: position step * batch + j of an endless stream of epochs, each a seeded
 * permutation of the training items. */
static int64_t order_at(const ds_loop_options *o, int64_t n_train, int64_t *perm, int64_t *perm_epoch, int64_t step,
                        int64_t j) {
  int64_t i = step * o->batch_items + j, epoch = i / n_train;
  if (epoch != *perm_epoch) {
    ds_rng rng;
    ds_rng_seed(&rng, ds_seed_mix(o->seed ^ 0x5eed5eedull, (uint64_t)epoch));
    for (int64_t k = 0; k < n_train; k++) perm[k] = k;
    for (int64_t k = n_train - 1; k > 0; k--) {
      int64_t r = (int64_t)(ds_rng_next_u64(&rng) % (uint64_t)(k + 1)), tmp = perm[k];
      perm[k] = perm[r];
      perm[r] = tmp;
    }
    *perm_epoch = epoch;
  }
  return perm[i % n_train];
}

int64_t ds_trainer_item(const ds_trainer *t, int64_t step, int64_t j) {
  ds_trainer *m = (ds_trainer *)t; /* the permutation is a cache of a pure function */
  return order_at(&t->o, t->obj->n_train, m->perm, &m->perm_epoch, step, j);
}

static int is_eval_step(const ds_loop_options *o, int64_t step) {
  return o->eval_every > 0 && (step % o->eval_every == 0 || step == o->steps);
}

ds_status ds_trainer_plan_begin(const ds_trainer *t, ds_trainer_plan *p) {
  memset(p, 0, sizeof *p);
  p->t = t;
  p->step = t->step;
  p->in_eval = t->eval_first;
  p->perm_epoch = -1;
  p->perm = ds_malloc((size_t)t->obj->n_train * sizeof(int64_t), "prefetch order");
  return p->perm ? DS_OK : DS_ERR_NOMEM;
}

int ds_trainer_plan_next(ds_trainer_plan *p, int64_t *index) {
  const ds_trainer *t = p->t;
  for (;;) {
    if (p->in_eval) {
      if (p->j < t->obj->n_eval) {
        int64_t e = p->j++;
        if (e % world_of(t) != rank_of(t)) continue; /* another rank's held-out item */
        *index = t->obj->n_train + e;
        return 1;
      }
      p->in_eval = 0;
      p->j = 0;
      continue;
    }
    if (p->step >= t->o.steps) return 0;
    if (p->j < t->o.batch_items) {
      int64_t j = p->j++;
      if (j % world_of(t) != rank_of(t)) continue; /* another rank's batch item */
      *index = order_at(&t->o, t->obj->n_train, p->perm, &p->perm_epoch, p->step, j);
      return 1;
    }
    p->step++;
    p->j = 0;
    p->in_eval = is_eval_step(&t->o, p->step);
  }
}

void ds_trainer_plan_free(ds_trainer_plan *p) {
  free(p->perm);
  p->perm = NULL;
}

/* ------------------------------------------------------------------ reports over ranks */

/* Each item's report travels as one row of doubles; the last one flags an item that failed
 * under the skip policy. */
enum { REPORT_DOUBLES = 4 + 2 * DS_REPORT_MAX_PAIRS + DS_REPORT_MAX_PAIRS + 2 * DS_REPORT_MAX_VEC + 1 };

static void report_to_row(const ds_report *r, int bad, double *row) {
  size_t k = 0;
  row[k++] = r->numerator, row[k++] = r->W, row[k++] = r->num_tokens, row[k++] = r->seen_tokens;
  for (int i = 0; i < DS_REPORT_MAX_PAIRS; i++) row[k++] = r->pair[i][0], row[k++] = r->pair[i][1];
  for (int i = 0; i < DS_REPORT_MAX_PAIRS; i++) row[k++] = r->pair_present[i] ? 1.0 : 0.0;
  for (int i = 0; i < DS_REPORT_MAX_VEC; i++) row[k++] = r->vec[i][0], row[k++] = r->vec[i][1];
  row[k] = bad ? 1.0 : 0.0;
}

static void add_row(ds_report *r, const double *row, int *bad) {
  size_t k = 0;
  r->numerator += row[k++], r->W += row[k++], r->num_tokens += row[k++], r->seen_tokens += row[k++];
  for (int i = 0; i < DS_REPORT_MAX_PAIRS; i++) r->pair[i][0] += row[k++], r->pair[i][1] += row[k++];
  for (int i = 0; i < DS_REPORT_MAX_PAIRS; i++) r->pair_present[i] |= row[k++] > 0;
  for (int i = 0; i < DS_REPORT_MAX_VEC; i++) r->vec[i][0] += row[k++], r->vec[i][1] += row[k++];
  *bad |= row[k] > 0;
}

/* t->report_rows [n][REPORT_DOUBLES] holds this rank's items' reports and zeros for the others';
 * after the all-reduce every row is its item's report, exactly (x + 0 = x), and every rank adds
 * the rows in item order: the same report, to the bit, for any number of ranks. The
 * normalization num / den happens afterwards, once, over the global sums (spec section 4). */
static ds_status reduce_rows(ds_trainer *t, int64_t n, ds_report *r, int *bad) {
  DS_TRY(ds_comm_allreduce_sum_f64(t->o.comm, t->report_rows, (size_t)n * REPORT_DOUBLES));
  memset(r, 0, sizeof *r);
  *bad = 0;
  for (int64_t j = 0; j < n; j++) add_row(r, t->report_rows + j * REPORT_DOUBLES, bad);
  return DS_OK;
}

/* ------------------------------------------------------------------ evaluation */

static double pair_value(const ds_report *r, int i) { return r->pair[i][1] > 0 ? r->pair[i][0] / r->pair[i][1] : 0.0; }

static ds_status evaluate(ds_trainer *t, double elapsed) {
  /* No held-out split (--eval-seqs 0): nothing to measure, and no eval record to write. */
  if (t->obj->n_eval <= 0) return DS_OK;
  ds_report r;
  memset(t->report_rows, 0, (size_t)t->obj->n_eval * REPORT_DOUBLES * sizeof(double));
  for (int64_t e = rank_of(t); e < t->obj->n_eval; e += world_of(t)) {
    memset(&r, 0, sizeof r);
    ds_status st = t->ops->eval_item(t->self, e, &r);
    if (st != DS_OK)
      return ds_error_wrap(st, "evaluation at step %lld, held-out item %lld", (long long)t->step, (long long)e);
    report_to_row(&r, 0, t->report_rows + e * REPORT_DOUBLES);
  }
  int unused;
  DS_TRY(reduce_rows(t, t->obj->n_eval, &r, &unused));
  if (!ds_trainer_is_writer(t)) return DS_OK;
  DS_TRY(ds_trainer_metrics_write(t, "eval", &r, -1, -1, -1, elapsed));
  if (!t->o.quiet) {
    char line[512] = "";
    size_t at = 0;
    for (int i = 0; i < t->ops->n_pairs && at < sizeof line; i++)
      if (r.pair_present[i])
        at += (size_t)snprintf(line + at, sizeof line - at, " %s %.4f", t->ops->pair_names[i], pair_value(&r, i));
    if (t->ops->exp_name && r.pair_present[t->ops->exp_pair] && at < sizeof line)
      at += (size_t)snprintf(line + at, sizeof line - at, " %s %.3f", t->ops->exp_name,
                             exp(pair_value(&r, t->ops->exp_pair)));
    ds_note("eval at step %lld:%s (%lld held-out items)", (long long)t->step, line, (long long)t->obj->n_eval);
  }
  return DS_OK;
}

/* ------------------------------------------------------------------ the step */

/* sum (+)= x: the first item of a step sets the sum (no zeroing pass), the others add. */
static void add_to_sum(double *sum, const float *x, size_t n, int first) {
  if (first) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) sum[i] = x[i];
    return;
  }
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; i++) sum[i] += x[i];
}

static void round_sum(float *x, const double *sum, size_t n) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; i++) x[i] = (float)sum[i];
}

/* One optimizer step (t->step is the 0-based index of the step being taken; messages say
 * t->step + 1, as the progress line counts). */
static ds_status train_step(ds_trainer *t, ds_report *r, double *grad_norm, double *lr) {
  const ds_loop_options *o = &t->o;
  int64_t shown = t->step + 1;
  memset(r, 0, sizeof *r);
  /* The GLOBAL denominator of the step first (masks only): every micro-batch's gradient is
   * scaled by 1 / W_step, never by its own count. */
  double W = 0;
  for (int64_t j = 0; j < o->batch_items; j++) {
    ds_step_item it = {t->step, j, ds_trainer_item(t, t->step, j)};
    double w = 0;
    ds_status st = t->ops->weight(t->self, &it, &w);
    if (st != DS_OK)
      return ds_error_wrap(st, "step %lld, batch item %lld (data item %lld)", (long long)shown, (long long)j,
                           (long long)it.index);
    W += w;
  }
  float *grads = t->ops->grads(t->self);
  size_t n = t->ops->num_params(t->self);
  t->ops->zero_grads(t->self);
  int summed = 0; /* items added into t->grad_sum so far */
  memset(t->report_rows, 0, (size_t)o->batch_items * REPORT_DOUBLES * sizeof(double));
  ds_status bad = DS_OK; /* a non-finite input (DS_ERR_NUMERIC) under the skip policy */
  for (int64_t j = rank_of(t); j < o->batch_items; j += world_of(t)) { /* this rank's share */
    ds_step_item it = {t->step, j, ds_trainer_item(t, t->step, j)};
    if (t->grad_sum && j != rank_of(t)) t->ops->zero_grads(t->self); /* each item's gradient alone */
    /* After a skipped failure the remaining items are still consumed (W 0), so a streaming
     * source stays in step with the plan. */
    ds_report item_report;
    memset(&item_report, 0, sizeof item_report);
    ds_status st = t->ops->micro_step(t->self, &it, bad == DS_OK ? W : 0.0, &item_report);
    if (st == DS_ERR_NUMERIC && o->skip_nonfinite && bad == DS_OK) {
      ds_note("step %lld: %s", (long long)shown, ds_last_error());
      bad = st;
      report_to_row(&item_report, 1, t->report_rows + j * REPORT_DOUBLES);
      continue;
    }
    if (st != DS_OK)
      return ds_error_wrap(st, "step %lld, batch item %lld (data item %lld)", (long long)shown, (long long)j,
                           (long long)it.index);
    report_to_row(&item_report, 0, t->report_rows + j * REPORT_DOUBLES);
    if (t->grad_sum) add_to_sum(t->grad_sum, grads, n, summed++ == 0);
  }
  *lr = ds_lr_at(t->step, o->steps, o->warmup_frac, o->lr);
  /* The step's gradient and report are complete once summed over the ranks; from here on
   * every rank holds the same values and takes the same decisions. */
  int any_bad = 0;
  if (t->grad_sum) {
    if (!summed) memset(t->grad_sum, 0, n * sizeof *t->grad_sum); /* no item here (or only a failed one) */
    DS_TRY(ds_comm_allreduce_sum_f64(o->comm, t->grad_sum, n));
    round_sum(grads, t->grad_sum, n);
  }
  DS_TRY(reduce_rows(t, o->batch_items, r, &any_bad));
  if (shown == o->inject_nan_step && n > 0) grads[n / 2] = NAN; /* fault injection for the tests */
  /* The norm is finite exactly when every gradient is: a float squared is below 2^256, so a sum
   * of squares in double cannot overflow. One pass serves the check and the clipping. */
  double norm = ds_grad_norm(grads, n);
  int finite = !any_bad && isfinite(r->numerator) && isfinite(norm);
  if (!finite) {
    const char *what = any_bad ? "input" : isfinite(r->numerator) ? "gradient" : "loss";
    if (!o->skip_nonfinite)
      return DS_FAIL(DS_ERR_NUMERIC,
                     "non-finite %s at step %lld (batch items %lld..%lld of the data order); the last good "
                     "checkpoint (step %lld or earlier) is intact; --skip-nonfinite skips such steps instead",
                     what, (long long)shown, (long long)(t->step * o->batch_items),
                     (long long)(t->step * o->batch_items + o->batch_items - 1), (long long)t->step);
    t->skipped++;
    *grad_norm = NAN;
    memset(r, 0, sizeof *r); /* a skipped step reports nothing */
    if (ds_trainer_is_writer(t)) /* every rank skips; one says so */
      ds_note("step %lld: non-finite %s, step skipped (%lld so far)", (long long)shown, what, (long long)t->skipped);
    return DS_OK;
  }
  *grad_norm = norm;
  if (W > 0) /* clipped on the way in: grads are not rewritten (they are zeroed before the next step) */
    ds_adamw_step_scaled(&t->opt, &t->acfg, *lr, t->ops->params(t->self), grads,
                         ds_grad_clip_coef(*grad_norm, o->grad_clip));
  return DS_OK;
}

/* ------------------------------------------------------------------ the run */

static ds_status check_options(const ds_loop_options *o) {
  if (!o->out_dir || !*o->out_dir) return DS_FAIL(DS_ERR_ARG, "the run directory (--out) is not set");
  if (o->steps < 1 || o->batch_items < 1 || o->save_every < 1)
    return DS_FAIL(DS_ERR_ARG, "--steps, --batch-seqs and --save-every must be at least 1");
  if (o->eval_every < 0 || o->stop_after < 0 || o->inject_nan_step < 0)
    return DS_FAIL(DS_ERR_ARG, "--eval-every, --stop-after and --inject-nan-step must be >= 0");
  if (!(o->lr >= 0) || !(o->warmup_frac >= 0 && o->warmup_frac <= 1) || !(o->weight_decay >= 0) ||
      !(o->grad_clip >= 0))
    return DS_FAIL(DS_ERR_ARG, "--lr, --weight-decay, --grad-clip must be >= 0 and --warmup in [0, 1]");
  return DS_OK;
}

/* What rank 0 decided from the run directory, given to every rank (the others read the
 * checkpoint too, but never metrics.jsonl), and a check that every rank loaded the same job:
 * the same options and inputs (train_config holds the data's and the model's hashes), the
 * same number of parameters and items, the same checkpoint step. */
static ds_status agree_on_start(ds_trainer *t) {
  uint64_t config_hash = XXH64(t->train_config, strlen(t->train_config), 0);
  int64_t mine[6] = {t->step, t->skipped, t->eval_first, (int64_t)t->ops->num_params(t->self), t->obj->n_train,
                     t->obj->n_eval};
  int64_t s[6];
  uint64_t h = config_hash;
  memcpy(s, mine, sizeof s);
  DS_TRY(ds_comm_broadcast(t->o.comm, s, sizeof s, 0));
  DS_TRY(ds_comm_broadcast(t->o.comm, &h, sizeof h, 0));
  if (h != config_hash || s[3] != mine[3] || s[4] != mine[4] || s[5] != mine[5])
    return DS_FAIL(DS_ERR_ARG, "rank %d loaded a different job than rank 0 (options, data or model: %lld "
                   "parameters, %lld + %lld items here, %lld and %lld + %lld on rank 0): every rank must be given "
                   "the same command and see the same files (a shared filesystem)", rank_of(t), (long long)mine[3],
                   (long long)mine[4], (long long)mine[5], (long long)s[3], (long long)s[4], (long long)s[5]);
  if (s[0] != t->step)
    return DS_FAIL(DS_ERR_IO, "%s: rank %d read step %lld from the checkpoint, rank 0 step %lld: the ranks must "
                   "see the same run directory (a shared filesystem)", t->ckpt_path, rank_of(t), (long long)t->step,
                   (long long)s[0]);
  t->skipped = s[1];
  t->eval_first = (int)s[2];
  return DS_OK;
}

static ds_status setup(ds_trainer *t, ds_objective *obj) {
  /* Rank 0 creates, locks and (with --overwrite) clears the run directory before any other
   * rank looks into it. */
  if (ds_trainer_is_writer(t)) DS_TRY(ds_trainer_run_dir_open(t));
  DS_TRY(ds_comm_barrier(t->o.comm));
  if (!ds_trainer_is_writer(t)) DS_TRY(ds_trainer_run_paths(t));
  DS_TRY(t->ops->setup(t->self, obj));
  if (obj->n_train < 1) return DS_FAIL(DS_ERR_ARG, "%s: no training items", obj->data_label);
  DS_TRY(ds_trainer_build_config(t));
  t->perm_epoch = -1;
  t->perm = ds_malloc((size_t)t->obj->n_train * sizeof(int64_t), "data order");
  if (!t->perm) return DS_ERR_NOMEM;
  t->acfg = ds_adamw_defaults();
  t->acfg.weight_decay = t->o.weight_decay;
  int have_ckpt = 0; /* a checkpoint that is there but unreachable (a symlink loop) is an error, not "start fresh" */
  if (t->o.resume) DS_TRY(ds_path_probe(t->ckpt_path, &have_ckpt));
  if (have_ckpt) {
    DS_TRY(ds_trainer_load(t));
  } else {
    DS_TRY(t->ops->init(t->self, t->o.seed));
    DS_TRY(ds_adamw_init(&t->opt, t->ops->num_params(t->self)));
  }
  /* One item per step on one process needs no sum: its gradient is the step's. */
  if (t->o.batch_items > 1 || world_of(t) > 1) {
    t->grad_sum = ds_malloc(t->ops->num_params(t->self) * sizeof(double) + 1, "the step's gradient sum");
    if (!t->grad_sum) return DS_ERR_NOMEM;
  }
  int64_t rows = t->o.batch_items > obj->n_eval ? t->o.batch_items : obj->n_eval;
  t->report_rows = ds_malloc((size_t)rows * REPORT_DOUBLES * sizeof(double), "the step's reports");
  if (!t->report_rows) return DS_ERR_NOMEM;
  t->first_step = t->step;
  int has_eval = 0;
  if (ds_trainer_is_writer(t)) DS_TRY(ds_trainer_metrics_open(t, &has_eval));
  /* Step 0 always evaluates first; a resumed run redoes an evaluation that a kill lost (the
   * checkpoint is written before the evaluation of its step). */
  t->eval_first = t->step == 0 || (is_eval_step(&t->o, t->step) && !has_eval);
  DS_TRY(agree_on_start(t));
  if (ds_trainer_is_writer(t)) DS_TRY(ds_trainer_write_run_json(t));
  return t->ops->start(t->self, t);
}

/* The trained model's kernels under --profile: one table, as one loop runs at a time. */
static ds_profile g_profile;

const ds_backend *ds_loop_backend(const ds_loop_options *o) {
  return o && o->profile ? ds_backend_profiled(ds_backend_cpu(), &g_profile) : ds_backend_cpu();
}

ds_status ds_trainer_run(ds_objective *obj, const ds_loop_options *o) {
  DS_TRY(check_options(o));
  memset(&g_profile, 0, sizeof g_profile);
  double t_run = ds_time_sec();
  ds_trainer t;
  memset(&t, 0, sizeof t);
  t.obj = obj;
  t.ops = obj->ops;
  t.self = obj->self;
  t.o = *o;
  t.lock.fd = -1;
  if (o->threads > 0) ds_set_num_threads(o->threads);
  ds_status st = setup(&t, obj);
  double t0 = ds_time_sec(), seen = 0;
  int64_t done_here = 0;
  if (st == DS_OK && t.eval_first) st = evaluate(&t, 0);
  if (st == DS_OK && t.step >= o->steps && !o->quiet)
    ds_note("%s: the run is already complete at step %lld of %lld; nothing to do", o->out_dir, (long long)t.step,
            (long long)o->steps);
  while (st == DS_OK && t.step < o->steps) {
    ds_report r;
    double gn = 0, lr = 0;
    st = train_step(&t, &r, &gn, &lr);
    if (st != DS_OK) break;
    t.step++;
    done_here++;
    seen += r.seen_tokens;
    double el = ds_time_sec() - t0, rate = seen / (el > 0 ? el : 1e-9);
    if (ds_trainer_is_writer(&t)) st = ds_trainer_metrics_write(&t, "train", &r, lr, gn, rate, el);
    if (st == DS_OK && !t.o.quiet) {
      char extra[160];
      int pp = t.ops->progress_pair;
      if (pp >= 0 && r.pair_present[pp]) /* absent: not computed this run (e.g. --ce-only), not 0 */
        snprintf(extra, sizeof extra, "loss %.4f %s %.3f", pair_value(&r, 0), t.ops->progress_label,
                 pair_value(&r, pp));
      else
        snprintf(extra, sizeof extra, "loss %.4f", pair_value(&r, 0));
      ds_progress_line(stderr, "step", t.step, o->steps, done_here, el, rate, "tok/s", extra);
    }
    int writer = ds_trainer_is_writer(&t);
    if (st == DS_OK && writer && (t.step % o->save_every == 0 || t.step == o->steps)) st = ds_trainer_save(&t);
    if (st == DS_OK && is_eval_step(o, t.step)) st = evaluate(&t, ds_time_sec() - t0);
    if (st == DS_OK && o->stop_after > 0 && done_here >= o->stop_after && t.step < o->steps) {
      if (writer) st = ds_trainer_save(&t);
      if (st == DS_OK && !t.o.quiet)
        ds_note("stopping after %lld steps as asked (--stop-after); resume with --resume", (long long)done_here);
      break;
    }
  }
  ds_progress_break(stderr);
  const ds_comm_stats *cs = ds_comm_get_stats(o->comm);
  if (st == DS_OK && !t.o.quiet && world_of(&t) > 1 && cs)
    ds_note("data parallel: %d ranks (%s), %lld all-reduces of %.1f MB in all, %.3f s in them on rank 0",
            world_of(&t), ds_comm_name(o->comm), (long long)cs->allreduce_calls, cs->allreduce_bytes / 1e6,
            cs->allreduce_s);
  ds_progress_break(stderr);
  if (st == DS_OK && o->profile && ds_trainer_is_writer(&t)) {
    fprintf(stderr, "kernels of the trained model over the whole run (%lld steps here, evaluations included):\n",
            (long long)done_here);
    ds_profile_print(&g_profile, ds_time_sec() - t_run, stderr);
  }
  ds_trainer_run_dir_close(&t);
  ds_adamw_free(&t.opt);
  free(t.perm);
  free(t.grad_sum);
  free(t.report_rows);
  free(t.train_config);
  return st;
}
