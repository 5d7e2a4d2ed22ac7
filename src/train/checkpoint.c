/* A draft read back from a training checkpoint (include/dspark/checkpoint.h). */
#include "dspark/checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/draft_trainer.h"
#include "dspark/trainer.h"

static char *dup_meta(const ds_safetensors *st, const char *key) {
  const char *v = ds_st_metadata(st, key);
  return v ? strdup(v) : NULL;
}

static ds_status load(const ds_safetensors *st, const ds_backend *backend, ds_draft **d, ds_checkpoint_info *info) {
  const char *path = ds_st_path(st);
  DS_TRY(ds_trainer_checkpoint_verify(st, DS_DRAFT_CHECKPOINT_FORMAT, &info->format_version));
  DS_TRY(ds_trainer_checkpoint_int(st, "step", &info->step));
  DS_TRY(ds_trainer_checkpoint_int(st, "skipped_steps", &info->skipped_steps));
  info->draft_config = dup_meta(st, "draft_config");
  info->train_config = dup_meta(st, "train_config");
  if (!info->draft_config || !info->train_config)
    return DS_FAIL(DS_ERR_FORMAT, "%s: metadata 'draft_config' or 'train_config' is missing", path);
  ds_draft_config cfg;
  DS_TRY(ds_draft_config_from_json(info->draft_config, strlen(info->draft_config), path, &cfg));
  float *zeros = ds_calloc((size_t)(cfg.vocab_size * cfg.hidden_size), sizeof(float), "draft tables");
  if (!zeros) return DS_ERR_NOMEM;
  ds_status s = ds_draft_new(&cfg, zeros, zeros, 0, backend, d);
  free(zeros);
  if (s != DS_OK) return s;
  DS_TRY(ds_draft_read_tensors(*d, st, "draft."));
  char name[320];
  for (size_t i = 0; i < ds_draft_tensor_count(*d); i++) {
    const ds_draft_tensor *x = ds_draft_tensor_at(*d, i);
    snprintf(name, sizeof name, "draft.%s", x->name);
    DS_TRY(ds_check_finite_tensor(path, name, x->data, (size_t)x->shape[0] * (size_t)(x->ndim > 1 ? x->shape[1] : 1)));
  }
  return DS_OK;
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
