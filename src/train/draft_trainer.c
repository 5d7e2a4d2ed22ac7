/* The DSpark trainer: data -> target features (live target, or an offline cache through
 * draft_trainer_cache.c) -> anchors -> draft loss/backward -> AdamW, with checkpoints, metrics,
 * evaluation and resume. See include/dspark/trainer.h. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dspark/draft_loss.h"
#include "dspark/anchors.h"
#include "dspark/checkpoint.h"
#include "dspark/dataset.h"
#include "dspark/fileio.h"
#include "dspark/optim.h"
#include "dspark/target.h"
#include "dspark/tokenizer.h"
#include "dspark/trainer.h"
#include "core/json_util.h"
#include "train/draft_trainer_internal.h"
#include "dspark/progress.h"

void ds_train_options_default(ds_train_options *o) {
  memset(o, 0, sizeof *o);
  o->seq_len = 512;
  o->eval_seqs = 8;
  o->draft_layers = 1;
  o->block_size = 7;
  o->n_target_layers = 5;
  o->mask_token_id = -1;
  o->markov_type = DS_MARKOV_VANILLA;
  o->markov_rank = 256;
  o->confidence_head = 1;
  o->confidence_with_markov = 1;
  o->num_anchors = 512;
  o->loss = ds_dspark_loss_config_default();
  o->steps = 100;
  o->batch_seqs = 4;
  o->lr = 6e-4;
  o->warmup_frac = 0.04;
  o->weight_decay = 0.0;
  o->grad_clip = 1.0;
  o->save_every = 50;
  o->eval_every = 50;
  o->inject_nan_step = -1;
  o->cache_prefetch = 4;
}

/* ------------------------------------------------------------------ data */

static int64_t train_sequence(trainer *t, int64_t step, int64_t j) {
  return ds_trainer_order(t->o, t->n_train, t->perm, &t->perm_epoch, step, j);
}

/* Anchors of dataset sequence idx under a stream seed; returns the number of blocks kept
 * (the trailing dummy blocks of spec section 5 are dropped: they contribute nothing). */
static int64_t sample_blocks(trainer *t, int64_t idx, uint64_t stream) {
  const ds_dataset *ds = &t->data;
  ds_rng rng;
  ds_rng_seed(&rng, stream);
  int64_t g = t->o->block_size;
  int64_t n = ds_sample_anchors(ds->loss_mask + idx * ds->seq_len, ds->lengths[idx], t->o->num_anchors, g, &rng,
                                t->anchors, t->keep, t->eval);
  return n > 0 ? n : 1; /* a sequence without anchors still runs one (dropped) block */
}

static ds_status target_features(trainer *t, int64_t idx) {
  if (t->fc) return ds_trainer_cache_features(t, idx);
  const ds_dataset *ds = &t->data;
  t->cur_ctx = t->ctx;
  t->cur_last = t->last;
  DS_TRY(ds_kv_cache_crop(t->cache, 0));
  ds_target_seq seq = {ds->ids + idx * ds->seq_len, ds->lengths[idx], t->cache};
  ds_target_outputs out = {t->layer_ids, t->n_layers, t->ctx, t->last, NULL, 0, NULL};
  return ds_target_forward(t->target, &seq, 1, &out);
}

/* with_teacher = 0 gives the CE-only objective; evaluation always uses the teacher so that
 * acceptance and tau are measured the same way for every objective. */
static ds_draft_seq make_seq(trainer *t, int64_t idx, int64_t n_blocks, int with_teacher) {
  const ds_dataset *ds = &t->data;
  ds_draft_seq s = {ds->lengths[idx], t->cur_ctx, with_teacher ? t->cur_last : NULL, ds->ids + idx * ds->seq_len,
                    n_blocks, t->anchors, t->keep, t->eval};
  return s;
}

/* ------------------------------------------------------------------ metrics */

static void pair_json(cJSON *j, const char *name, const ds_dspark_loss_result *r, int pair) {
  if (!r->pair_present[pair]) return;
  double den = r->pair[pair][1];
  cJSON_AddNumberToObject(j, name, den > 0 ? r->pair[pair][0] / den : 0.0);
}

static void write_metrics(trainer *t, const char *kind, const ds_dspark_loss_result *r, const double *pa,
                          const double *pc, double lr, double grad_norm, double tok_s, double elapsed) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "kind", kind);
  cJSON_AddNumberToObject(j, "step", (double)t->step);
  pair_json(j, "loss", r, DS_DSPARK_PAIR_LOSS);
  pair_json(j, "ce", r, DS_DSPARK_PAIR_CE);
  pair_json(j, "l1", r, DS_DSPARK_PAIR_L1);
  pair_json(j, "confidence", r, DS_DSPARK_PAIR_CONF);
  pair_json(j, "accept_rate", r, DS_DSPARK_PAIR_ACCEPT);
  pair_json(j, "tau", r, DS_DSPARK_PAIR_TAU);
  if (r->pair_present[DS_DSPARK_PAIR_ACCEPT]) {
    cJSON *arr = cJSON_CreateArray();
    for (int64_t k = 0; k < t->o->block_size; k++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(pc[k] > 0 ? pa[k] / pc[k] : 0));
    cJSON_AddItemToObject(j, "accept_per_position", arr);
  }
  cJSON_AddNumberToObject(j, "tokens", (double)r->num_tokens);
  if (lr >= 0) cJSON_AddNumberToObject(j, "lr", lr);
  if (grad_norm >= 0) cJSON_AddNumberToObject(j, "grad_norm", grad_norm);
  if (tok_s >= 0) cJSON_AddNumberToObject(j, "tokens_per_s", tok_s);
  cJSON_AddNumberToObject(j, "elapsed_s", elapsed);
  cJSON_AddNumberToObject(j, "peak_rss_mib", ds_peak_rss_mib());
  cJSON_AddNumberToObject(j, "skipped_steps", (double)t->skipped);
  char *text = cJSON_PrintUnformatted(j);
  if (text) {
    fprintf(t->metrics, "%s\n", text);
    fflush(t->metrics);
  }
  free(text);
  cJSON_Delete(j);
}

/* ------------------------------------------------------------------ steps */

static ds_status evaluate(trainer *t, double elapsed) {
  ds_dspark_loss_result r;
  memset(&r, 0, sizeof r);
  double pa[64] = {0}, pc[64] = {0};
  for (int64_t e = 0; e < t->n_eval; e++) {
    int64_t idx = t->n_train + e;
    int64_t nb = sample_blocks(t, idx, ds_anchor_seed(t->o->seed, 0, -1, e)); /* fixed: the same every eval */
    DS_TRY(target_features(t, idx));
    ds_draft_seq s = make_seq(t, idx, nb, 1);
    DS_TRY(ds_draft_loss_seq(t->draft, &s, &t->o->loss, 1.0, 0, &r, pa, pc));
  }
  write_metrics(t, "eval", &r, pa, pc, -1, -1, -1, elapsed);
  if (!t->o->quiet) {
    double acc = r.pair[DS_DSPARK_PAIR_ACCEPT][1] > 0 ? r.pair[DS_DSPARK_PAIR_ACCEPT][0] / r.pair[DS_DSPARK_PAIR_ACCEPT][1] : 0;
    double tau = r.pair[DS_DSPARK_PAIR_TAU][1] > 0 ? r.pair[DS_DSPARK_PAIR_TAU][0] / r.pair[DS_DSPARK_PAIR_TAU][1] : 0;
    fprintf(stderr, "eval at step %lld: loss %.4f accept %.4f tau %.3f (%lld held-out sequences)\n", (long long)t->step,
            r.pair[0][1] > 0 ? r.pair[0][0] / r.pair[0][1] : 0.0, acc, tau, (long long)t->n_eval);
  }
  return DS_OK;
}

static ds_status save(trainer *t, const char *path) {
  ds_checkpoint_info info = {t->step, t->skipped, t->draft_config, t->train_config};
  return ds_checkpoint_save(path, t->draft, &t->opt_state, &info);
}

static int all_finite(const float *x, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!isfinite(x[i])) return 0;
  return 1;
}

static ds_status train_step(trainer *t, double *tokens, ds_dspark_loss_result *r, double *pa, double *pc,
                            double *grad_norm, double *lr) {
  const ds_train_options *o = t->o;
  int64_t g = o->block_size;
  memset(r, 0, sizeof *r);
  /* The GLOBAL weight sum of the step first (it depends only on the masks): every
   * micro-batch's gradient is scaled by 1 / W_step, never by its own count. */
  double W = 0;
  for (int64_t j = 0; j < o->batch_seqs; j++) {
    int64_t idx = train_sequence(t, t->step, j);
    int64_t nb = sample_blocks(t, idx, ds_anchor_seed(o->seed, 0, t->step, j));
    DS_TRY(ds_dspark_loss_weights(&o->loss, nb, g, t->eval, t->keep, t->sup, t->w));
    for (int64_t i = 0; i < nb * g; i++) W += t->w[i];
  }
  ds_draft_zero_grads(t->draft);
  *tokens = 0;
  for (int64_t j = 0; j < o->batch_seqs && (W > 0 || t->stream); j++) {
    int64_t idx = train_sequence(t, t->step, j);
    int64_t nb = sample_blocks(t, idx, ds_anchor_seed(o->seed, 0, t->step, j));
    ds_status st = target_features(t, idx);
    if (st == DS_OK && W <= 0) continue; /* a cache stream delivers the planned features regardless */
    ds_draft_seq s = make_seq(t, idx, nb, !o->no_teacher);
    if (st == DS_OK) st = ds_draft_loss_seq(t->draft, &s, &o->loss, 1.0 / W, 1, r, pa, pc);
    if (st != DS_OK)
      return ds_error_wrap(st, "step %lld, batch sequence %lld (data sequence %lld)", (long long)t->step, (long long)j,
                           (long long)idx);
    *tokens += (double)t->data.lengths[idx];
  }
  *lr = ds_lr_at(t->step, o->steps, o->warmup_frac, o->lr);
  float *grads = ds_draft_grads(t->draft);
  size_t n = ds_draft_num_params(t->draft);
  if (t->step == o->inject_nan_step) grads[n / 2] = NAN; /* fault injection for the tests */
  int finite = isfinite(r->numerator) && all_finite(grads, n);
  if (!finite) {
    if (!o->skip_nonfinite)
      return DS_FAIL(DS_ERR_NUMERIC,
                     "non-finite %s at step %lld (batch sequences %lld..%lld); the last good checkpoint is intact; "
                     "--skip-nonfinite skips such steps instead",
                     isfinite(r->numerator) ? "gradient" : "loss", (long long)t->step,
                     (long long)(t->step * o->batch_seqs), (long long)(t->step * o->batch_seqs + o->batch_seqs - 1));
    t->skipped++;
    *grad_norm = NAN;
    fprintf(stderr, "step %lld: non-finite values, step skipped (%lld so far)\n", (long long)t->step, (long long)t->skipped);
    return DS_OK;
  }
  *grad_norm = ds_clip_grad_norm(grads, n, o->grad_clip);
  if (W > 0) ds_adamw_step(&t->opt_state, &t->acfg, *lr, ds_draft_params(t->draft), grads);
  return DS_OK;
}

/* ------------------------------------------------------------------ setup */

/* Online: the target, its tokenizer and config, and the data packed here. */
static ds_status setup_online(trainer *t) {
  const ds_train_options *o = t->o;
  if (!o->target_dir || !o->data_path) return DS_FAIL(DS_ERR_ARG, "training needs --target and --data (or --cache)");
  DS_TRY(ds_target_load(o->target_dir, ds_backend_cpu(), &t->target));
  const ds_model_config *tc = ds_target_config(t->target);
  char *path = ds_path_join(o->target_dir, "tokenizer.json");
  ds_status st = path ? ds_tokenizer_load(path, &t->tok) : DS_ERR_NOMEM;
  free(path);
  if (st != DS_OK) return st;
  path = ds_path_join(o->target_dir, "config.json");
  size_t len;
  st = path ? ds_read_file(path, &t->target_config, &len) : DS_ERR_NOMEM;
  free(path);
  if (st != DS_OK) return st;
  t->cfg_target = o->target_dir;
  t->cfg_data = o->data_path;
  int32_t eos = tc->n_eos ? (int32_t)tc->eos_token_ids[0] : -1;
  return ds_dataset_load(o->data_path, o->data_format, t->tok, o->seq_len, eos, 2, &t->data);
}

static ds_status setup(trainer *t, const char *ckpt_path) {
  const ds_train_options *o = t->o;
  t->perm_epoch = -1;
  t->plan.perm_epoch = -1;
  if (o->threads > 0) ds_set_num_threads(o->threads);
  if (mkdir(o->out_dir, 0755) != 0 && !ds_file_exists(o->out_dir))
    return DS_FAIL(DS_ERR_IO, "%s: cannot create the run directory", o->out_dir);
  snprintf(t->tokenizer_label, sizeof t->tokenizer_label, "%s/tokenizer.json", o->target_dir ? o->target_dir : "?");
  DS_TRY(o->cache_dir ? ds_trainer_cache_setup(t) : setup_online(t));
  ds_model_config tc;
  DS_TRY(ds_config_parse(t->target_config, strlen(t->target_config), "the target's config.json", &tc));

  t->n_eval = o->eval_seqs < t->data.n_seqs ? o->eval_seqs : t->data.n_seqs - 1;
  t->n_train = t->data.n_seqs - t->n_eval;
  if (t->n_train < 1)
    return DS_FAIL(DS_ERR_ARG, "%s: %lld sequences leave none for training after %lld held out", t->cfg_data,
                   (long long)t->data.n_seqs, (long long)t->n_eval);

  ds_draft_config dc;
  DS_TRY(ds_draft_config_default(&tc, o->draft_layers, o->n_target_layers, &dc));
  if (o->n_explicit_layers) {
    dc.n_target_layers = o->n_explicit_layers;
    memcpy(dc.target_layer_ids, o->target_layer_ids, sizeof(int32_t) * (size_t)o->n_explicit_layers);
  }
  dc.block_size = o->block_size;
  dc.markov_type = o->markov_type;
  dc.markov_rank = o->markov_type == DS_MARKOV_NONE ? 0 : o->markov_rank;
  dc.enable_confidence_head = o->confidence_head;
  dc.confidence_head_with_markov = o->confidence_head && o->confidence_with_markov && dc.markov_rank > 0;
  dc.num_anchors = o->num_anchors;
  DS_TRY(ds_trainer_resolve_mask_token(t, &dc.mask_token_id));
  DS_TRY(ds_draft_config_check(&dc));
  t->n_layers = dc.n_target_layers;
  memcpy(t->layer_ids, dc.target_layer_ids, sizeof(int32_t) * (size_t)dc.n_target_layers);
  DS_TRY(ds_trainer_config_texts(t, &dc, t->data.source_hash));

  ds_status st;
  t->acfg = ds_adamw_defaults();
  t->acfg.weight_decay = o->weight_decay;
  if (o->resume && ds_file_exists(ckpt_path)) {
    ds_checkpoint_info info;
    DS_TRY(ds_checkpoint_load(ckpt_path, ds_backend_cpu(), &t->draft, &t->opt_state, &info));
    st = ds_trainer_check_same_config(info.train_config, t->train_config, ckpt_path);
    t->step = info.step;
    t->skipped = info.skipped_steps;
    ds_checkpoint_info_free(&info);
    if (st != DS_OK) return st;
  } else {
    const float *embed = t->target ? ds_target_embed(t->target) : t->embed;
    const float *lm_head = t->target ? ds_target_lm_head(t->target) : t->lm_head;
    DS_TRY(ds_draft_new(&dc, embed, lm_head, o->seed, ds_backend_cpu(), &t->draft));
    DS_TRY(ds_adamw_init(&t->opt_state, ds_draft_num_params(t->draft)));
  }
  ds_free_aligned(t->embed); /* the draft holds its own replicas */
  ds_free_aligned(t->lm_head);
  t->embed = t->lm_head = NULL;
  DS_TRY(ds_draft_hf_config_json(t->draft, t->target_config, &t->draft_config));

  int64_t S = o->seq_len, A = o->num_anchors, g = o->block_size, d = tc.hidden_size;
  if (t->target) {
    DS_TRY(ds_kv_cache_new(t->target, S, &t->cache));
    t->ctx = ds_malloc_aligned((size_t)(S * t->n_layers * d) * sizeof(float), "target features");
    t->last = ds_malloc_aligned((size_t)(S * d) * sizeof(float), "target features");
    if (!t->ctx || !t->last) return DS_ERR_NOMEM;
  }
  t->anchors = ds_malloc((size_t)A * sizeof(int64_t), "anchors");
  t->keep = ds_malloc((size_t)A, "anchors");
  t->eval = ds_malloc((size_t)(A * g), "anchors");
  t->sup = ds_malloc((size_t)(A * g), "anchors");
  t->w = ds_malloc((size_t)(A * g) * sizeof(double), "anchors");
  t->perm = ds_malloc((size_t)t->n_train * sizeof(int64_t), "data order");
  if (!t->anchors || !t->keep || !t->eval || !t->sup || !t->w || !t->perm) return DS_ERR_NOMEM;
  if (t->fc) DS_TRY(ds_trainer_cache_start(t));

  /* run.json and target_config.json describe the run next to its outputs. */
  char *run_json = ds_path_join(o->out_dir, "run.json"), *tc_json = ds_path_join(o->out_dir, "target_config.json");
  char *metrics = ds_path_join(o->out_dir, "metrics.jsonl");
  st = run_json && tc_json && metrics ? DS_OK : DS_ERR_NOMEM;
  if (st == DS_OK) st = ds_write_file_atomic(run_json, t->run_config, strlen(t->run_config));
  if (st == DS_OK) st = ds_write_file_atomic(tc_json, t->target_config, strlen(t->target_config));
  if (st == DS_OK && t->step > 0) st = ds_trainer_trim_metrics(metrics, t->step);
  if (st == DS_OK) {
    t->metrics = fopen(metrics, t->step > 0 ? "a" : "w");
    if (!t->metrics) st = DS_FAIL(DS_ERR_IO, "%s: cannot open for writing", metrics);
  }
  free(run_json);
  free(tc_json);
  free(metrics);
  return st;
}

static void teardown(trainer *t) {
  if (t->metrics) fclose(t->metrics);
  ds_trainer_cache_free(t);
  ds_draft_free(t->draft);
  ds_adamw_free(&t->opt_state);
  ds_kv_cache_free(t->cache);
  ds_target_free(t->target);
  ds_tokenizer_free(t->tok);
  ds_dataset_free(&t->data);
  ds_free_aligned(t->ctx);
  ds_free_aligned(t->last);
  free(t->anchors);
  free(t->keep);
  free(t->eval);
  free(t->sup);
  free(t->w);
  free(t->perm);
  free(t->target_config);
  free(t->train_config);
  free(t->run_config);
  free(t->draft_config);
}

ds_status ds_train_draft(const ds_train_options *o) {
  if (o->block_size > 64 || o->block_size < 1) return DS_FAIL(DS_ERR_ARG, "--block-size must be in [1, 64]");
  if (o->batch_seqs < 1 || o->steps < 1 || o->num_anchors < 1)
    return DS_FAIL(DS_ERR_ARG, "--steps, --batch-seqs and --num-anchors must be at least 1");
  trainer t;
  memset(&t, 0, sizeof t);
  t.opt = *o;
  t.o = &t.opt;
  o = t.o; /* from here on, the effective options */
  char *ckpt = ds_path_join(o->out_dir, "checkpoint.safetensors");
  if (!ckpt) return DS_ERR_NOMEM;
  ds_status st = setup(&t, ckpt);
  double t0 = ds_time_sec(), tokens_total = 0;
  int64_t first = t.step, done_here = 0;
  if (st == DS_OK && t.step == 0) st = evaluate(&t, 0);
  while (st == DS_OK && t.step < o->steps) {
    ds_dspark_loss_result r;
    double pa[64] = {0}, pc[64] = {0}, tokens = 0, gn = 0, lr = 0;
    st = train_step(&t, &tokens, &r, pa, pc, &gn, &lr);
    if (st != DS_OK) break;
    t.step++;
    done_here++;
    tokens_total += tokens;
    double el = ds_time_sec() - t0, rate = tokens_total / (el > 0 ? el : 1e-9);
    write_metrics(&t, "train", &r, pa, pc, lr, gn, rate, el);
    if (!o->quiet) {
      char extra[160];
      double den = r.pair[0][1] > 0 ? r.pair[0][1] : 1;
      snprintf(extra, sizeof extra, "loss %.4f accept %.3f", r.pair[0][0] / den,
               r.pair[DS_DSPARK_PAIR_ACCEPT][1] > 0 ? r.pair[DS_DSPARK_PAIR_ACCEPT][0] / r.pair[DS_DSPARK_PAIR_ACCEPT][1] : 0.0);
      ds_progress_line(stderr, t.step, o->steps, el, rate, "tok/s", extra);
      (void)first;
    }
    if (t.step % o->save_every == 0 || t.step == o->steps) st = save(&t, ckpt);
    if (st == DS_OK && o->eval_every > 0 && (t.step % o->eval_every == 0 || t.step == o->steps))
      st = evaluate(&t, ds_time_sec() - t0);
    if (st == DS_OK && o->stop_after > 0 && done_here >= o->stop_after && t.step < o->steps) {
      st = save(&t, ckpt);
      if (!o->quiet) fprintf(stderr, "stopping after %lld steps as asked (--stop-after); resume with --resume\n",
                             (long long)done_here);
      break;
    }
  }
  if (t.stream && !o->quiet)
    fprintf(stderr, "cache: the training loop waited %.3f s in total for prefetched features\n",
            ds_cache_stream_wait_s(t.stream));
  teardown(&t);
  free(ckpt);
  return st;
}
