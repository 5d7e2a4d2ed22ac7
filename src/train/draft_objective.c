/* The DSpark draft objective (include/dspark/draft_trainer.h): data -> target features (the
 * live target, or an offline cache through draft_objective_cache.c) -> anchors -> the fused
 * draft loss and backward. The loop, the optimizer, checkpoints and metrics are the trainer
 * core's (include/dspark/trainer.h); this file is the first client of its interface. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/anchors.h"
#include "dspark/dataset.h"
#include "dspark/draft_loss.h"
#include "dspark/fileio.h"
#include "dspark/progress.h"
#include "train/draft_objective_internal.h"

void ds_draft_train_options_default(ds_draft_train_options *o) {
  memset(o, 0, sizeof *o);
  ds_loop_options_default(&o->loop);
  o->seq_len = 512;
  o->eval_seqs = 8;
  o->draft_layers = 1;
  o->block_size = 7;
  o->n_target_layers = 5;
  o->mask_token_id = -1;
  o->enable_thinking = -1;
  o->markov_type = DS_MARKOV_VANILLA;
  o->markov_rank = 256;
  o->confidence_head = 1;
  o->confidence_with_markov = 1;
  o->num_anchors = 512;
  o->loss = ds_dspark_loss_config_default();
  o->cache_prefetch = 4;
}

/* ------------------------------------------------------------------ data */

/* Anchors of dataset sequence idx under a stream seed; returns the number of blocks kept
 * (the trailing dummy blocks of spec section 5 are dropped: they contribute nothing). */
static int64_t sample_blocks(draft_run *t, int64_t idx, uint64_t stream) {
  const ds_dataset *ds = &t->data;
  ds_rng rng;
  ds_rng_seed(&rng, stream);
  int64_t n = ds_sample_anchors(ds->loss_mask + idx * ds->seq_len, ds->lengths[idx], t->o->num_anchors,
                                t->o->block_size, &rng, t->anchors, t->keep, t->eval);
  return n > 0 ? n : 1; /* a sequence without anchors still runs one (dropped) block */
}

static ds_status target_features(draft_run *t, int64_t idx) {
  if (t->fc) return ds_draft_cache_features(t, idx);
  const ds_dataset *ds = &t->data;
  t->cur_ctx = t->ctx;
  t->cur_last = t->last;
  DS_TRY(ds_kv_cache_crop(t->kv, 0));
  ds_target_seq seq = {ds->ids + idx * ds->seq_len, ds->lengths[idx], t->kv};
  ds_target_outputs out = {t->dc.target_layer_ids, t->dc.n_target_layers, t->ctx, t->last, NULL, 0, NULL};
  DS_TRY(ds_target_forward(t->target, &seq, 1, &out));
  ds_status st = ds_target_check_finite(t->target, &out, seq.n);
  return st == DS_OK ? DS_OK : ds_error_wrap(st, "%s: data sequence %lld", t->cfg_data, (long long)idx);
}

/* with_teacher = 0 gives the CE-only objective; evaluation always uses the teacher so that
 * acceptance and tau are measured the same way for every objective. */
static ds_draft_seq make_seq(draft_run *t, int64_t idx, int64_t n_blocks, int with_teacher) {
  const ds_dataset *ds = &t->data;
  ds_draft_seq s = {ds->lengths[idx], t->cur_ctx, with_teacher ? t->cur_last : NULL, ds->ids + idx * ds->seq_len,
                    n_blocks, t->anchors, t->keep, t->eval, t->teacher_head};
  return s;
}

/* Sample idx's teacher stats per position (ds_draft_loss_seq_memo), kept for the run: a reduced
 * vocabulary's full-vocabulary teacher product then runs once per position, not once per visit.
 * NULL, the plain product, without a teacher or a reduced vocabulary, or past the memo's cap. */
#define TEACHER_MEMO_CAP_BYTES ((size_t)256 << 20)
static ds_dspark_teacher_stat *teacher_memo(draft_run *t, int64_t idx, int with_teacher) {
  if (!with_teacher || !t->vocab_ids) return NULL;
  if (!t->memo && !(t->memo = calloc((size_t)(t->n_train + t->n_eval), sizeof *t->memo))) return NULL;
  if (!t->memo[idx]) {
    size_t n = (size_t)t->data.lengths[idx], bytes = n * sizeof(ds_dspark_teacher_stat);
    if (t->memo_bytes + bytes > TEACHER_MEMO_CAP_BYTES || !(t->memo[idx] = malloc(bytes))) return NULL;
    for (size_t i = 0; i < n; i++) t->memo[idx][i].lse = NAN; /* not yet known */
    t->memo_bytes += bytes;
  }
  return t->memo[idx];
}

/* The loss result of one sequence into the core's report (sums, so the order of additions is
 * the order of the sequences, as before the core existed). */
static void add_result(ds_report *r, const ds_dspark_loss_result *res, const double *pa, const double *pc, int64_t g) {
  r->numerator += res->numerator;
  r->W += res->W;
  r->num_tokens += (double)res->num_tokens;
  for (int i = 0; i < DS_DSPARK_PAIR_COUNT; i++) {
    r->pair[i][0] += res->pair[i][0];
    r->pair[i][1] += res->pair[i][1];
    r->pair_present[i] |= res->pair_present[i];
  }
  for (int64_t k = 0; k < g; k++) {
    r->vec[k][0] += pa[k];
    r->vec[k][1] += pc[k];
  }
}

/* ------------------------------------------------------------------ the objective's ops */

static ds_status op_init(void *self, uint64_t seed) {
  draft_run *t = self;
  /* The replicas keep the target's dtype: fp32 tables for an fp32 target, its BF16 / F16 ones
   * otherwise (as the cache stores them). */
  ds_weight embed = t->target ? ds_target_embed(t->target) : t->embed;
  ds_weight lm_head = t->target ? ds_target_lm_head(t->target) : t->lm_head;
  /* a reduced vocabulary copies the rows S of the target's lm_head */
  DS_TRY(ds_draft_new_vocab(&t->dc, embed, lm_head, t->vocab_ids, seed, ds_loop_backend(&t->o->loop), &t->draft));
  ds_free_aligned((void *)t->embed.data); /* the draft holds its own replicas */
  t->embed = (ds_weight){NULL, DS_F32};
  if (!t->vocab_ids) { /* else the cache's lm_head stays: the teacher (t->teacher_head) */
    ds_free_aligned((void *)t->lm_head.data);
    t->lm_head = (ds_weight){NULL, DS_F32};
  }
  return DS_OK;
}

static ds_status op_load(void *self, const ds_safetensors *ck) {
  draft_run *t = self;
  const char *path = ds_st_path(ck), *json = ds_st_metadata(ck, "draft_config");
  if (!json) return DS_FAIL(DS_ERR_FORMAT, "%s: metadata 'draft_config' is missing", path);
  ds_draft_config saved;
  DS_TRY(ds_draft_config_from_json(json, strlen(json), path, &saved));
  DS_TRY(ds_draft_run_check_loaded(t, &saved, path));
  /* Tables in the dtype the checkpoint stores them in; every tensor is checked finite. */
  DS_TRY(ds_draft_load_tensors(&t->dc, ck, "draft.", ds_loop_backend(&t->o->loop), &t->draft));
  /* a reduced vocabulary: the checkpoint's S (its d2t, checked well formed on load) must be the
   * one this run selects from its data */
  const int32_t *saved_ids = ds_draft_vocab_ids(t->draft);
  for (int64_t j = 0; t->vocab_ids && j < t->dc.draft_vocab_size; j++)
    if (!saved_ids || saved_ids[j] != t->vocab_ids[j])
      return DS_FAIL(DS_ERR_FORMAT, "%s: tensor 'draft.d2t' maps draft id %lld to target id %d, but this run's data "
                     "selects %d: the checkpoint's draft vocabulary is not this run's", path, (long long)j,
                     saved_ids ? saved_ids[j] : (int)j, t->vocab_ids[j]);
  return DS_OK;
}

static ds_status op_start(void *self, const ds_trainer *core) {
  draft_run *t = self;
  t->core = core;
  DS_TRY(ds_draft_hf_config_json(t->draft, t->target_config, &t->draft_config));
  if (!ds_trainer_is_writer(core)) return t->fc ? ds_draft_cache_start(t) : DS_OK; /* rank 0 writes the run directory */
  char *tc_json = ds_path_join(t->o->loop.out_dir, "target_config.json");
  ds_status st = tc_json ? ds_write_file_atomic(tc_json, t->target_config, strlen(t->target_config)) : DS_ERR_NOMEM;
  free(tc_json);
  if (st != DS_OK) return st;
  return t->fc ? ds_draft_cache_start(t) : DS_OK;
}

static float *op_params(void *self) { return ds_draft_params(((draft_run *)self)->draft); }
static float *op_grads(void *self) { return ds_draft_grads(((draft_run *)self)->draft); }
static size_t op_num_params(void *self) { return ds_draft_num_params(((draft_run *)self)->draft); }
static void op_zero_grads(void *self) { ds_draft_zero_grads(((draft_run *)self)->draft); }

static ds_status op_weight(void *self, const ds_step_item *it, double *w) {
  draft_run *t = self;
  int64_t g = t->o->block_size;
  int64_t nb = sample_blocks(t, it->index, ds_anchor_seed(t->o->loop.seed, 0, it->step, it->j));
  DS_TRY(ds_dspark_loss_weights(&t->o->loss, nb, g, t->eval, t->keep, t->sup, t->w));
  double W = 0;
  for (int64_t i = 0; i < nb * g; i++) W += t->w[i];
  *w = W;
  return DS_OK;
}

static ds_status op_micro_step(void *self, const ds_step_item *it, double W, ds_report *r) {
  draft_run *t = self;
  if (W <= 0 && !t->stream) return DS_OK; /* nothing supervised in the step: the target need not run */
  int64_t idx = it->index, g = t->o->block_size;
  int64_t nb = sample_blocks(t, idx, ds_anchor_seed(t->o->loop.seed, 0, it->step, it->j));
  DS_TRY(target_features(t, idx));         /* a cache stream delivers the planned features regardless */
  if (W <= 0) return DS_OK;
  ds_draft_seq s = make_seq(t, idx, nb, !t->o->no_teacher);
  ds_dspark_loss_result res;
  memset(&res, 0, sizeof res);
  double pa[64] = {0}, pc[64] = {0};
  DS_TRY(ds_draft_loss_seq_memo(t->draft, &s, teacher_memo(t, idx, s.last != NULL), &t->o->loss, 1.0 / W, 1, &res,
                                pa, pc));
  add_result(r, &res, pa, pc, g);
  r->seen_tokens += (double)t->data.lengths[idx];
  return DS_OK;
}

static ds_status op_eval_item(void *self, int64_t e, ds_report *r) {
  draft_run *t = self;
  int64_t idx = t->n_train + e, g = t->o->block_size;
  int64_t nb = sample_blocks(t, idx, ds_anchor_seed(t->o->loop.seed, 0, -1, e)); /* fixed: the same every eval */
  DS_TRY(target_features(t, idx));
  ds_draft_seq s = make_seq(t, idx, nb, 1);
  ds_dspark_loss_result res;
  memset(&res, 0, sizeof res);
  double pa[64] = {0}, pc[64] = {0};
  DS_TRY(ds_draft_loss_seq_memo(t->draft, &s, teacher_memo(t, idx, 1), &t->o->loss, 1.0, 0, &res, pa, pc));
  add_result(r, &res, pa, pc, g);
  return DS_OK;
}

static ds_status op_save(void *self, ds_st_writer *w) {
  draft_run *t = self;
  char name[320];
  for (size_t i = 0; i < ds_draft_tensor_count(t->draft); i++) {
    const ds_draft_tensor *x = ds_draft_tensor_at(t->draft, i);
    int64_t shape[2] = {x->shape[0], x->shape[1]};
    snprintf(name, sizeof name, "draft.%s", x->name);
    DS_TRY(ds_st_writer_add(w, name, x->dtype, x->ndim, shape, x->data));
  }
  return ds_st_writer_set_metadata(w, "draft_config", t->draft_config);
}

static ds_status op_setup(void *self, ds_objective *obj);

static const char *const k_pair_names[DS_DSPARK_PAIR_COUNT] = {"loss", "ce", "l1", "confidence", "accept_rate", "tau"};

static const ds_objective_ops k_draft_ops = {
    .name = "draft",
    .checkpoint_format = DS_DRAFT_CHECKPOINT_FORMAT,
    .pair_names = k_pair_names,
    .n_pairs = DS_DSPARK_PAIR_COUNT,
    .progress_pair = DS_DSPARK_PAIR_ACCEPT,
    .progress_label = "accept",
    .vec_name = "accept_per_position",
    .vec_pair = DS_DSPARK_PAIR_ACCEPT,
    .vec_len = 0, /* set per run: the block size */
    .setup = op_setup,
    .init = op_init,
    .load = op_load,
    .start = op_start,
    .params = op_params,
    .grads = op_grads,
    .num_params = op_num_params,
    .zero_grads = op_zero_grads,
    .weight = op_weight,
    .micro_step = op_micro_step,
    .eval_item = op_eval_item,
    .save = op_save,
};

/* ------------------------------------------------------------------ setup */

/* Online: the target, its tokenizer and config, and the data packed here. */
static ds_status setup_online_from(draft_run *t, ds_model_source *src) {
  const ds_draft_train_options *o = t->o;
  DS_TRY(ds_model_source_check_positions(src, o->seq_len, "--seq-len")); /* before loading the weights */
  DS_TRY(ds_target_load_source(src, ds_backend_cpu(), &t->weights_xxh64, &t->target));
  const ds_model_config *tc = ds_target_config(t->target);
  DS_TRY(ds_draft_target_texts(t, src));
  DS_TRY(ds_model_source_tokenizer(src, &t->tok));
  DS_TRY(ds_target_check_tokenizer(tc, t->tok, t->config_label, t->tokenizer_label));
  t->cfg_target = o->target_dir;
  t->cfg_data = o->data_path;
  int32_t eos = tc->n_eos ? (int32_t)tc->eos_token_ids[0] : -1;
  /* chat data in the target's own template, exactly as `dspark capture` renders it */
  ds_chat_template *tmpl = NULL;
  DS_TRY(ds_model_source_chat_template(src, o->chat_template, &tmpl));
  int thinking = o->enable_thinking;
  ds_data_options dopt = {.format = o->data_format, .skip_bad_lines = o->skip_bad_lines,
                          .max_line_bytes = o->max_line_bytes};
  ds_status st = ds_dataset_read(o->data_path, &dopt, t->tok, tmpl, thinking, o->seq_len, eos, 2, &t->data);
  /* --draft-vocab: the ids this template emits in an assistant turn belong to S */
  if (st == DS_OK && o->draft_vocab > 0) st = ds_draft_run_template_ids(t, tmpl, thinking);
  if (tmpl)
    snprintf(t->chat_template, sizeof t->chat_template, "%s (xxh64 %016llx)%s", ds_chat_template_label(tmpl),
             (unsigned long long)ds_chat_template_hash(tmpl),
             thinking < 0 ? "" : thinking ? ", enable_thinking true" : ", enable_thinking false");
  else
    snprintf(t->chat_template, sizeof t->chat_template, "ChatML");
  ds_chat_template_free(tmpl);
  return st;
}

static ds_status setup_online(draft_run *t) {
  const ds_draft_train_options *o = t->o;
  if (!o->target_dir || !o->data_path) return DS_FAIL(DS_ERR_ARG, "training needs --target and --data (or --cache)");
  ds_model_source *src;
  DS_TRY(ds_model_source_open(o->target_dir, &src));
  ds_status st = setup_online_from(t, src);
  ds_model_source_close(src);
  return st;
}

static ds_status op_setup(void *self, ds_objective *obj) {
  draft_run *t = self;
  const ds_draft_train_options *o = t->o;
  DS_TRY(o->cache_dir ? ds_draft_cache_setup(t) : setup_online(t));
  DS_TRY(ds_config_parse(t->target_config, strlen(t->target_config), t->config_label, &t->tc));
  DS_TRY(ds_config_check_positions(&t->tc, t->config_label, o->seq_len, "--seq-len"));
  if (o->cache_dir) /* online runs checked it before reading the data */
    DS_TRY(ds_target_check_tokenizer(&t->tc, t->tok, t->config_label, t->tokenizer_label));
  DS_TRY(ds_draft_run_config(t));
  DS_TRY(ds_draft_run_config_texts(t));
  /* a reduced draft's teacher: the target's whole lm_head (online the target's, from a cache its copy) */
  if (t->vocab_ids) t->teacher_head = t->target ? ds_target_lm_head(t->target) : t->lm_head;
  int64_t S = o->seq_len, A = o->num_anchors, g = o->block_size, d = t->tc.hidden_size;
  if (t->target) {
    DS_TRY(ds_kv_cache_new_typed(t->target, S, DS_F32, &t->kv)); /* a prefill's cache: fp32 */
    t->ctx = ds_malloc_aligned((size_t)(S * t->dc.n_target_layers * d) * sizeof(float), "target features");
    t->last = ds_malloc_aligned((size_t)(S * d) * sizeof(float), "target features");
    if (!t->ctx || !t->last) return DS_ERR_NOMEM;
  }
  t->anchors = ds_malloc((size_t)A * sizeof(int64_t), "anchors");
  t->keep = ds_malloc((size_t)A, "anchors");
  t->eval = ds_malloc((size_t)(A * g), "anchors");
  t->sup = ds_malloc((size_t)(A * g), "anchors");
  t->w = ds_malloc((size_t)(A * g) * sizeof(double), "anchors");
  if (!t->anchors || !t->keep || !t->eval || !t->sup || !t->w) return DS_ERR_NOMEM;
  obj->n_train = t->n_train;
  obj->n_eval = t->n_eval;
  obj->train_config = t->train_config;
  obj->run_info = t->run_info;
  obj->data_label = t->cfg_data;
  return DS_OK;
}

static void teardown(draft_run *t) {
  ds_draft_cache_free(t);
  ds_draft_free(t->draft);
  ds_kv_cache_free(t->kv);
  ds_target_free(t->target);
  ds_tokenizer_free(t->tok);
  ds_dataset_free(&t->data);
  ds_free_aligned(t->ctx);
  ds_free_aligned(t->last);
  for (int64_t i = 0; t->memo && i < t->n_train + t->n_eval; i++) free(t->memo[i]);
  free(t->memo);
  free(t->anchors);
  free(t->keep);
  free(t->eval);
  free(t->sup);
  free(t->w);
  free(t->target_config);
  free(t->train_config);
  free(t->run_info);
  free(t->draft_config);
  ds_ids_free(&t->vocab_mandatory);
  free(t->vocab_ids);
}

ds_status ds_train_draft(const ds_draft_train_options *o) {
  if (o->block_size > 64 || o->block_size < 1) return DS_FAIL(DS_ERR_ARG, "--block-size must be in [1, 64]");
  if (o->num_anchors < 1) return DS_FAIL(DS_ERR_ARG, "--num-anchors must be at least 1");
  if (o->loop.threads > 0) ds_set_num_threads(o->loop.threads);
  draft_run t;
  memset(&t, 0, sizeof t);
  t.opt = *o;
  t.o = &t.opt;
  ds_objective_ops ops = k_draft_ops;
  ops.vec_len = (int)t.o->block_size;
  ds_objective obj = {&ops, &t, 0, 0, NULL, NULL, NULL};
  ds_status st = ds_trainer_run(&obj, &t.o->loop);
  if (t.stream && !t.o->loop.quiet)
    ds_note("cache: the training loop waited %.3f s in total for prefetched features", ds_cache_stream_wait_s(t.stream));
  teardown(&t);
  return st;
}
