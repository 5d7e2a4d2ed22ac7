/* A draft read back from a training checkpoint (include/dspark/checkpoint.h). */
#include "dspark/checkpoint.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/json_util.h"
#include "dspark/draft_trainer.h"
#include "dspark/fileio.h"
#include "dspark/lm_trainer.h"
#include "dspark/trainer.h"

static char *dup_meta(const ds_safetensors *st, const char *key) {
  const char *v = ds_st_metadata(st, key);
  return v ? strdup(v) : NULL;
}

/* The draft the checkpoint describes (draft_config) must be the one its run trained
 * (train_config): a file whose two halves disagree was edited or assembled by hand. */
static ds_status check_consistent(const char *path, const ds_draft_config *c, const char *train_config,
                                  const ds_checkpoint_info *info, int64_t optim_step) {
  ds_status st = DS_OK;
  cJSON *j = ds_json_parse(train_config, strlen(train_config), path, &st);
  if (!j) return st;
  const cJSON *steps = cJSON_GetObjectItemCaseSensitive(j, "steps");
  if (info->skipped_steps > info->step || optim_step > info->step - info->skipped_steps ||
      (cJSON_IsNumber(steps) && (double)info->step > steps->valuedouble))
    st = DS_FAIL(DS_ERR_FORMAT, "%s: inconsistent position: step %lld of %g, %lld optimizer updates, %lld skipped "
                 "steps", path, (long long)info->step, cJSON_IsNumber(steps) ? steps->valuedouble : -1.0,
                 (long long)optim_step, (long long)info->skipped_steps);
  struct { const char *key; double value; } f[] = {
      {"block_size", (double)c->block_size},       {"draft_layers", (double)c->num_layers},
      {"markov_rank", (double)c->markov_rank},     {"mask_token_id", (double)c->mask_token_id},
      {"num_anchors", (double)c->num_anchors},     {"confidence_head", (double)c->enable_confidence_head},
      {"confidence_head_with_markov", (double)c->confidence_head_with_markov},
  };
  for (size_t i = 0; st == DS_OK && i < sizeof f / sizeof f[0]; i++) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, f[i].key);
    double x = cJSON_IsBool(v) ? (double)cJSON_IsTrue(v) : cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (v && x != f[i].value)
      st = DS_FAIL(DS_ERR_FORMAT, "%s: metadata 'draft_config' has %s = %g but 'train_config' says %g: the checkpoint "
                   "was altered", path, f[i].key, f[i].value, x);
  }
  /* a reduced vocabulary is in both halves or in neither (absent: the whole vocabulary) */
  const cJSON *nv = cJSON_GetObjectItemCaseSensitive(j, "draft_vocab_size");
  double n_vocab = cJSON_IsNumber(nv) ? nv->valuedouble : nv ? NAN : 0.0;
  if (st == DS_OK && n_vocab != (double)c->draft_vocab_size)
    st = DS_FAIL(DS_ERR_FORMAT, "%s: metadata 'draft_config' has draft_vocab_size = %lld but 'train_config' says %g: "
                 "the checkpoint was altered", path, (long long)c->draft_vocab_size, n_vocab);
  const cJSON *ids = cJSON_GetObjectItemCaseSensitive(j, "target_layer_ids");
  if (st == DS_OK && cJSON_IsArray(ids)) {
    int n = cJSON_GetArraySize(ids), same = n == c->n_target_layers;
    for (int i = 0; same && i < n; i++) {
      const cJSON *x = cJSON_GetArrayItem(ids, i);
      same = cJSON_IsNumber(x) && x->valuedouble == c->target_layer_ids[i];
    }
    if (!same)
      st = DS_FAIL(DS_ERR_FORMAT, "%s: metadata 'draft_config' and 'train_config' disagree on target_layer_ids: the "
                   "checkpoint was altered", path);
  }
  const cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "markov_head_type");
  if (st == DS_OK && cJSON_IsString(mt) && strcmp(mt->valuestring, ds_markov_type_name(c->markov_type)) != 0)
    st = DS_FAIL(DS_ERR_FORMAT, "%s: metadata 'draft_config' has markov_head_type %s but 'train_config' says %s: the "
                 "checkpoint was altered", path, ds_markov_type_name(c->markov_type), mt->valuestring);
  cJSON_Delete(j);
  return st;
}

static ds_status load(const ds_safetensors *st, const ds_backend *backend, ds_draft **d, ds_checkpoint_info *info) {
  const char *path = ds_st_path(st);
  DS_TRY(ds_trainer_checkpoint_verify(st, DS_DRAFT_CHECKPOINT_FORMAT, &info->format_version));
  DS_TRY(ds_trainer_checkpoint_int(st, "step", &info->step));
  DS_TRY(ds_trainer_checkpoint_int(st, "skipped_steps", &info->skipped_steps));
  int64_t optim_step;
  DS_TRY(ds_trainer_checkpoint_int(st, "optim_step", &optim_step));
  info->draft_config = dup_meta(st, "draft_config");
  info->train_config = dup_meta(st, "train_config");
  if (!info->draft_config || !info->train_config)
    return DS_FAIL(DS_ERR_FORMAT, "%s: metadata 'draft_config' or 'train_config' is missing", path);
  ds_draft_config cfg;
  DS_TRY(ds_draft_config_from_json(info->draft_config, strlen(info->draft_config), path, &cfg));
  DS_TRY(check_consistent(path, &cfg, info->train_config, info, optim_step));
  /* Tables in the dtype the checkpoint stores them in; every tensor is checked finite. */
  return ds_draft_load_tensors(&cfg, st, "draft.", backend, d);
}

ds_status ds_checkpoint_load_draft(const char *path, const ds_backend *backend, ds_draft **d, ds_checkpoint_info *info) {
  *d = NULL;
  memset(info, 0, sizeof *info);
  ds_safetensors *st;
  DS_TRY(ds_st_open(path, &st));
  ds_status s = load(st, backend, d, info);
  ds_st_close(st);
  if (s != DS_OK) {
    ds_draft_free(*d);
    *d = NULL;
    ds_checkpoint_info_free(info);
  }
  return s;
}

void ds_checkpoint_info_free(ds_checkpoint_info *info) {
  free(info->draft_config);
  free(info->train_config);
  info->draft_config = info->train_config = NULL;
}

ds_status ds_draft_open(const char *dir, const ds_backend *backend, ds_draft **d) {
  *d = NULL;
  char *ckpt = ds_path_join(dir, "checkpoint.safetensors");
  if (!ckpt) return DS_ERR_NOMEM;
  int there = 0;
  /* A checkpoint name that is there but unreachable (a symlink loop) is an error, not "no
   * checkpoint, so read an export". */
  ds_status st = ds_path_probe(ckpt, &there);
  if (st == DS_OK && there) {
    ds_checkpoint_info info;
    st = ds_checkpoint_load_draft(ckpt, backend, d, &info);
    if (st == DS_OK) ds_checkpoint_info_free(&info);
  } else if (st == DS_OK) {
    st = ds_draft_load_hf(dir, backend, d);
  }
  free(ckpt);
  return st;
}

ds_status ds_checkpoint_format(const char *path, char **format) {
  *format = NULL;
  ds_safetensors *st;
  DS_TRY(ds_st_open(path, &st));
  const char *f = ds_st_metadata(st, "format");
  *format = strdup(f ? f : "");
  ds_st_close(st);
  return *format ? DS_OK : DS_ERR_NOMEM;
}

static ds_status load_student(const ds_safetensors *st, const ds_backend *backend, ds_student **s,
                              ds_checkpoint_info *info) {
  const char *path = ds_st_path(st);
  DS_TRY(ds_trainer_checkpoint_verify(st, DS_STUDENT_CHECKPOINT_FORMAT, &info->format_version));
  DS_TRY(ds_trainer_checkpoint_int(st, "step", &info->step));
  DS_TRY(ds_trainer_checkpoint_int(st, "skipped_steps", &info->skipped_steps));
  info->train_config = dup_meta(st, "train_config");
  const char *json = ds_st_metadata(st, "student_config");
  if (!json || !info->train_config)
    return DS_FAIL(DS_ERR_FORMAT, "%s: metadata 'student_config' or 'train_config' is missing", path);
  DS_TRY(ds_student_new(json, strlen(json), path, 0, backend, s));
  return ds_student_read_tensors(*s, st, "student."); /* refuses a non-finite weight, naming it */
}

ds_status ds_checkpoint_load_student(const char *path, const ds_backend *backend, ds_student **s,
                                     ds_checkpoint_info *info) {
  *s = NULL;
  memset(info, 0, sizeof *info);
  ds_safetensors *st;
  DS_TRY(ds_st_open(path, &st));
  ds_status r = load_student(st, backend, s, info);
  ds_st_close(st);
  if (r != DS_OK) {
    ds_student_free(*s);
    *s = NULL;
    ds_checkpoint_info_free(info);
  }
  return r;
}
