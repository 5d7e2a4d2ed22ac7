/* The causal-LM objectives (include/dspark/lm_trainer.h): pretraining and distillation of a
 * student, the trainer core's second client. Per item (one sequence): the student's forward,
 * then row chunks of its logits through the KD loss core (alpha 0: the LM cross-entropy only)
 * with the teacher's rows of that chunk (a cache's top-K, or the live teacher's logits, its
 * top-K selected by the capture's ds_kd_select), the gradient back through the head, and the
 * student's backward. Row t of a sequence predicts token t + 1: supervised when that token is
 * (loss mask) and exists. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/cache.h"
#include "dspark/fileio.h"
#include "dspark/kd_select.h"
#include "dspark/lm_trainer.h"
#include "dspark/student.h"
#include "dspark/target.h"
#include "dspark/tokenizer.h"
#include "train/lm_objective_internal.h"

void ds_lm_train_options_default(ds_lm_train_options *o, int distill) {
  memset(o, 0, sizeof *o);
  ds_loop_options_default(&o->loop);
  o->seq_len = 512;
  o->eval_seqs = 8;
  o->enable_thinking = -1;
  o->kd.kd_loss_alpha = distill ? 1.0 : 0.0;
  o->kd.temperature = 1.0;
  o->kd.top_k = distill ? 64 : 0;
  o->kd.top_p = 1.0;
  o->kd.min_k = 1;
  o->kd.chunk_rows = 128;
  o->distill = distill;
}

/* ------------------------------------------------------------------ one sequence */

/* Supervised rows of data item idx: row t predicts token t + 1. */
static double item_weight(const lm_run *t, int64_t idx) {
  const ds_dataset *ds = &t->data;
  const uint8_t *m = ds->loss_mask + idx * ds->seq_len;
  double w = 0;
  for (int64_t r = 0; r + 1 < ds->lengths[idx]; r++) w += m[r + 1] != 0;
  return w;
}

/* Labels and mask of the rows of item idx into t->labels / t->mask. */
static void rows_targets(lm_run *t, int64_t idx) {
  const ds_dataset *ds = &t->data;
  int64_t T = ds->lengths[idx];
  const int32_t *ids = ds->ids + idx * ds->seq_len;
  const uint8_t *m = ds->loss_mask + idx * ds->seq_len;
  for (int64_t r = 0; r < T; r++) {
    int sup = r + 1 < T && m[r + 1];
    t->labels[r] = sup ? ids[r + 1] : 0;
    t->mask[r] = (uint8_t)sup;
  }
}

/* The teacher's rows [r0, r0 + c) of the current sequence for the loss core. */
static ds_status teacher_rows(lm_run *t, int64_t r0, int64_t c, ds_kd_rows_in *in) {
  const ds_kd_loss_config *kd = &t->cfg;
  if (kd->kd_loss_alpha <= 0) return DS_OK;
  if (t->fc) { /* the cache's top-K rows */
    in->topk_ids = t->cur_topk_ids + r0 * t->k_stride;
    in->topk_lp = t->cur_topk_lp + r0 * t->k_stride;
    in->k_stride = t->k_stride;
    return DS_OK;
  }
  if (kd->top_k > 0) { /* selected with the sample's forward (teacher_features) */
    in->topk_ids = t->topk_ids + r0 * kd->top_k;
    in->topk_lp = t->topk_lp + r0 * kd->top_k;
    in->k_stride = kd->top_k;
    return DS_OK;
  }
  /* dense KL against the full distribution */
  int64_t V = t->V, d = ds_target_config(t->teacher)->hidden_size;
  ds_backend_cpu()->linear_w(t->tlogits, V, t->thidden + r0 * d, ds_target_lm_head(t->teacher), NULL, c, d, V);
  in->teacher = t->tlogits;
  return DS_OK;
}

/* The teacher's pass over item idx (live: its final hidden rows; cache: the next sample). */
static ds_status teacher_features(lm_run *t, int64_t idx) {
  if (t->o->kd.kd_loss_alpha <= 0 && !t->fc) return DS_OK;
  if (t->fc) return ds_lm_cache_features(t, idx);
  DS_TRY(ds_kv_cache_crop(t->kv, 0));
  ds_target_seq seq = {t->data.ids + idx * t->data.seq_len, t->data.lengths[idx], t->kv};
  /* the layers of the --intermediate pairs too (none without them) */
  ds_target_outputs out = {t->n_tlayers ? t->tlayers : NULL, t->n_tlayers, t->tcaptured, t->thidden, NULL, 0, NULL};
  DS_TRY(ds_target_forward(t->teacher, &seq, 1, &out));
  t->cur_tfeat = t->tcaptured;
  ds_status st = ds_target_check_finite(t->teacher, &out, seq.n);
  if (st != DS_OK) return ds_error_wrap(st, "%s: data sequence %lld", t->data_label, (long long)idx);
  const ds_kd_loss_config *kd = &t->cfg;
  /* the capture's selection in the capture's products (kd_select.h), at the loss temperature:
   * what a cache captured with the same options holds, to the bit */
  if (kd->kd_loss_alpha > 0 && kd->top_k > 0)
    ds_kd_teacher_select(t->thidden, seq.n, ds_target_config(t->teacher)->hidden_size, ds_target_lm_head(t->teacher),
                         t->V, kd->temperature, kd->top_k, 1.0, 1, t->tlogits, t->select_scratch, t->topk_ids,
                         t->topk_lp, NULL, NULL);
  return DS_OK;
}

/* Forward, the loss over row chunks, the intermediate pairs, and (with scale > 0) the backward
 * of item idx. *balanced: what the intermediate pairs add to the kd numerator (NULL: not wanted). */
static ds_status run_item(lm_run *t, int64_t idx, const ds_kd_loss_config *cfg, double scale, ds_report *r,
                          double *balanced) {
  int64_t T = t->data.lengths[idx], V = t->V, d = t->d, chunk = cfg->chunk_rows < T ? cfg->chunk_rows : T;
  ds_student_batch b = {t->data.ids + idx * t->data.seq_len, 1, t->data.seq_len, &t->data.lengths[idx]};
  DS_TRY(ds_student_forward(t->student, &b));
  rows_targets(t, idx);
  if (scale > 0) memset(t->dh, 0, (size_t)(T * d) * sizeof(float));
  ds_status st = DS_OK;
  ds_student_rows_begin(t->student);
  for (int64_t r0 = 0; r0 < T && st == DS_OK; r0 += chunk) {
    int64_t c = T - r0 < chunk ? T - r0 : chunk;
    ds_student_rows_logits(t->student, r0, c, t->logits);
    ds_kd_rows_in in = {t->logits, NULL, NULL, 0, NULL, t->labels + r0, t->mask + r0};
    st = teacher_rows(t, r0, c, &in);
    if (st == DS_OK)
      st = ds_kd_loss_rows(cfg, r0, c, V, &in, scale, t->kd_rows + r0, t->lm_rows + r0, scale > 0 ? t->logits : NULL);
    if (st == DS_OK && scale > 0) ds_student_rows_logits_backward(t->student, r0, c, t->logits, t->dh + r0 * d);
  }
  ds_student_rows_end(t->student);
  DS_TRY(st);
  ds_kd_loss_result res;
  DS_TRY(ds_kd_loss_finish(cfg, T, t->mask, cfg->kd_loss_alpha > 0 ? t->kd_rows : NULL,
                           cfg->kd_loss_alpha < 1 ? t->lm_rows : NULL, &res));
  /* the pairs are balanced against this item's logits KD, normalized like it (by the step's
   * tokens; an evaluation has no step: its own tokens, the ratio is what matters) */
  lm_inter_item inter;
  double norm = scale > 0 ? 1.0 / scale : res.num_tokens > 0 ? (double)res.num_tokens : 1.0;
  DS_TRY(ds_lm_inter_item(t, T, cfg->kd_loss_alpha, res.pair[DS_KD_PAIR_LM][0], res.pair[DS_KD_PAIR_KD][0], norm,
                          scale, &inter));
  if (scale > 0) DS_TRY(ds_student_backward(t->student, t->dh, inter.extra, inter.n_extra));
  if (balanced) *balanced = inter.balanced;
  res.numerator += cfg->kd_loss_alpha * inter.balanced;
  res.pair[DS_KD_PAIR_LOSS][0] += cfg->kd_loss_alpha * inter.balanced;
  if (t->n_inter) {
    r->pair[LM_PAIR_INTERMEDIATE][0] += inter.mean_sum;
    r->pair[LM_PAIR_INTERMEDIATE][1] += (double)res.num_tokens;
    r->pair_present[LM_PAIR_INTERMEDIATE] = 1;
  }
  r->numerator += res.numerator;
  r->W += (double)res.num_tokens;
  r->num_tokens += (double)res.num_tokens;
  r->seen_tokens += (double)T;
  for (int i = 0; i < DS_KD_PAIR_COUNT; i++) {
    r->pair[i][0] += res.pair[i][0];
    r->pair[i][1] += res.pair[i][1];
    r->pair_present[i] |= res.pair_present[i];
  }
  return DS_OK;
}

/* ------------------------------------------------------------------ the objective's ops */

static ds_status op_init(void *self, uint64_t seed) {
  lm_run *t = self;
  const ds_backend *be = ds_loop_backend(&t->o->loop);
  if (t->o->student_dir) DS_TRY(ds_student_load_hf(t->o->student_dir, be, &t->student));
  else DS_TRY(ds_student_new(t->student_json, strlen(t->student_json), t->o->student_config, seed, be, &t->student));
  return ds_lm_inter_params(t, NULL);
}

static ds_status op_load(void *self, const ds_safetensors *ck) {
  lm_run *t = self;
  const char *json = ds_st_metadata(ck, "student_config");
  if (!json) return DS_FAIL(DS_ERR_FORMAT, "%s: metadata 'student_config' is missing", ds_st_path(ck));
  DS_TRY(ds_student_new(json, strlen(json), ds_st_path(ck), 0, ds_loop_backend(&t->o->loop), &t->student));
  const ds_model_config *c = ds_student_config(t->student);
  if (c->vocab_size != t->V || c->hidden_size != t->d)
    return DS_FAIL(DS_ERR_FORMAT, "%s: the checkpoint's student (vocabulary %lld, hidden %lld) is not this run's "
                   "(%lld, %lld)", ds_st_path(ck), (long long)c->vocab_size, (long long)c->hidden_size,
                   (long long)t->V, (long long)t->d);
  DS_TRY(ds_student_read_tensors(t->student, ck, "student."));
  return ds_lm_inter_params(t, ck);
}

static ds_status op_start(void *self, const ds_trainer *core) {
  lm_run *t = self;
  t->core = core;
  DS_TRY(ds_lm_buffers(t));
  return t->fc ? ds_lm_cache_start(t) : DS_OK;
}

static float *op_params(void *self) { return ds_student_params(((lm_run *)self)->student); }
static float *op_grads(void *self) { return ds_student_grads(((lm_run *)self)->student); }
static size_t op_num_params(void *self) { return ds_student_num_params(((lm_run *)self)->student); }
static void op_zero_grads(void *self) { ds_student_zero_grads(((lm_run *)self)->student); }

static ds_status op_weight(void *self, const ds_step_item *it, double *w) {
  *w = item_weight(self, it->index);
  return DS_OK;
}

static ds_status op_micro_step(void *self, const ds_step_item *it, double W, ds_report *r) {
  lm_run *t = self;
  if (W <= 0 && !t->stream) return DS_OK;
  DS_TRY(teacher_features(t, it->index)); /* a cache stream delivers the planned sample regardless */
  if (W <= 0) return DS_OK;
  return run_item(t, it->index, &t->cfg, 1.0 / W, r, NULL);
}

static ds_status op_eval_item(void *self, int64_t e, ds_report *r) {
  lm_run *t = self;
  int64_t idx = t->n_train + e;
  DS_TRY(teacher_features(t, idx));
  /* Evaluations report the student's CE on the true next token and, distilling, the KD loss:
   * both terms computed (alpha in (0, 1)); "loss" is then recombined with the run's alpha. */
  ds_kd_loss_config cfg = t->cfg;
  if (cfg.kd_loss_alpha > 0) cfg.kd_loss_alpha = 0.5;
  ds_report one;
  memset(&one, 0, sizeof one);
  double balanced = 0;
  DS_TRY(run_item(t, idx, &cfg, 0, &one, &balanced));
  double a = t->cfg.kd_loss_alpha;
  one.pair[DS_KD_PAIR_LOSS][0] =
      (1 - a) * one.pair[DS_KD_PAIR_LM][0] + (a > 0 ? a * (one.pair[DS_KD_PAIR_KD][0] + balanced) : 0);
  one.numerator = one.pair[DS_KD_PAIR_LOSS][0];
  r->numerator += one.numerator;
  r->W += one.W;
  r->num_tokens += one.num_tokens;
  for (int i = 0; i < LM_PAIR_COUNT; i++) {
    r->pair[i][0] += one.pair[i][0];
    r->pair[i][1] += one.pair[i][1];
    r->pair_present[i] |= one.pair_present[i];
  }
  return DS_OK;
}

static ds_status op_save(void *self, ds_st_writer *w) {
  lm_run *t = self;
  char name[320];
  for (size_t i = 0; i < ds_student_tensor_count(t->student); i++) {
    const ds_student_tensor *x = ds_student_tensor_at(t->student, i);
    snprintf(name, sizeof name, "student.%s", x->name);
    DS_TRY(ds_st_writer_add(w, name, DS_F32, x->ndim, x->shape, x->data));
  }
  DS_TRY(ds_lm_inter_save(t, w));
  if (!t->saved_config) DS_TRY(ds_student_config_json(t->student, &t->saved_config));
  return ds_st_writer_set_metadata(w, "student_config", t->saved_config);
}

static ds_status op_setup(void *self, ds_objective *obj) {
  lm_run *t = self;
  DS_TRY(ds_lm_setup(t));
  obj->n_train = t->n_train;
  obj->n_eval = t->n_eval;
  obj->train_config = t->train_config;
  obj->run_info = t->run_info;
  obj->data_label = t->data_label;
  return DS_OK;
}

static const char *const k_pairs[LM_PAIR_COUNT] = {"loss", "kd", "lm", "intermediate"};

ds_status ds_train_lm(const ds_lm_train_options *o) {
  if (o->loop.threads > 0) ds_set_num_threads(o->loop.threads);
  lm_run t;
  memset(&t, 0, sizeof t);
  t.opt = *o;
  t.o = &t.opt;
  t.cfg = o->kd;
  ds_objective_ops ops = {
      .name = o->distill ? "distill" : "pretrain",
      .checkpoint_format = DS_STUDENT_CHECKPOINT_FORMAT,
      .pair_names = k_pairs,
      .n_pairs = LM_PAIR_COUNT,
      .progress_pair = o->kd.kd_loss_alpha > 0 && o->kd.kd_loss_alpha < 1 ? DS_KD_PAIR_KD : -1,
      .progress_label = "kd",
      .exp_name = "ppl",
      .exp_pair = DS_KD_PAIR_LM,
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
  ds_objective obj = {&ops, &t, 0, 0, NULL, NULL, NULL};
  ds_status st = ds_trainer_run(&obj, &t.opt.loop);
  ds_lm_free(&t);
  return st;
}
