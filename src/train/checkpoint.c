#include "dspark/checkpoint.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/dtype.h"

static const char *k_format = "dspark-draft-checkpoint";
static const char *k_version = "1";

ds_status ds_checkpoint_save(const char *path, const ds_draft *d, const ds_adamw *opt, const ds_checkpoint_info *info) {
  ds_st_writer *w = ds_st_writer_new();
  if (!w) return DS_FAIL(DS_ERR_NOMEM, "%s: out of memory", path);
  ds_status st = DS_OK;
  char name[300], num[32];
  for (size_t i = 0; st == DS_OK && i < ds_draft_tensor_count(d); i++) {
    const ds_draft_tensor *t = ds_draft_tensor_at(d, i);
    int64_t shape[2] = {t->shape[0], t->shape[1]};
    snprintf(name, sizeof name, "draft.%s", t->name);
    st = ds_st_writer_add(w, name, DS_F32, t->ndim, shape, t->data);
  }
  int64_t n = (int64_t)opt->n;
  if (st == DS_OK) st = ds_st_writer_add(w, "optim.m", DS_F32, 1, &n, opt->m);
  if (st == DS_OK) st = ds_st_writer_add(w, "optim.v", DS_F32, 1, &n, opt->v);
  if (st == DS_OK) st = ds_st_writer_set_metadata(w, "format", k_format);
  if (st == DS_OK) st = ds_st_writer_set_metadata(w, "format_version", k_version);
  snprintf(num, sizeof num, "%" PRId64, info->step);
  if (st == DS_OK) st = ds_st_writer_set_metadata(w, "step", num);
  snprintf(num, sizeof num, "%" PRId64, opt->step);
  if (st == DS_OK) st = ds_st_writer_set_metadata(w, "optim_step", num);
  snprintf(num, sizeof num, "%" PRId64, info->skipped_steps);
  if (st == DS_OK) st = ds_st_writer_set_metadata(w, "skipped_steps", num);
  if (st == DS_OK) st = ds_st_writer_set_metadata(w, "draft_config", info->draft_config ? info->draft_config : "{}");
  if (st == DS_OK) st = ds_st_writer_set_metadata(w, "train_config", info->train_config ? info->train_config : "{}");
  if (st == DS_OK) st = ds_st_writer_write(w, path);
  ds_st_writer_free(w);
  return st;
}

static ds_status meta_int(const ds_safetensors *st, const char *key, int64_t *out) {
  const char *v = ds_st_metadata(st, key);
  char *end;
  if (!v) return DS_FAIL(DS_ERR_FORMAT, "%s: metadata '%s' is missing", ds_st_path(st), key);
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (errno || end == v || *end || x < 0)
    return DS_FAIL(DS_ERR_FORMAT, "%s: metadata '%s' = '%s' is not a non-negative integer", ds_st_path(st), key, v);
  *out = x;
  return DS_OK;
}

static char *dup_meta(const ds_safetensors *st, const char *key) {
  const char *v = ds_st_metadata(st, key);
  return v ? strdup(v) : NULL;
}

ds_status ds_checkpoint_load(const char *path, const ds_backend *backend, ds_draft **d_out, ds_adamw *opt,
                             ds_checkpoint_info *info) {
  *d_out = NULL;
  memset(info, 0, sizeof *info);
  memset(opt, 0, sizeof *opt);
  ds_safetensors *st;
  DS_TRY(ds_st_open(path, &st));
  ds_draft *d = NULL;
  ds_status s = DS_OK;
  const char *fmt = ds_st_metadata(st, "format"), *ver = ds_st_metadata(st, "format_version");
  if (!fmt || strcmp(fmt, k_format) != 0) {
    s = DS_FAIL(DS_ERR_FORMAT, "%s: metadata 'format' is '%s', expected '%s' (not a dspark checkpoint)", path,
                fmt ? fmt : "(missing)", k_format);
    goto fail;
  }
  if (!ver || strcmp(ver, k_version) != 0) {
    s = DS_FAIL(DS_ERR_UNSUPPORTED, "%s: checkpoint format_version '%s', this build reads '%s'", path,
                ver ? ver : "(missing)", k_version);
    goto fail;
  }
  int64_t optim_step;
  if ((s = meta_int(st, "step", &info->step)) != DS_OK || (s = meta_int(st, "optim_step", &optim_step)) != DS_OK ||
      (s = meta_int(st, "skipped_steps", &info->skipped_steps)) != DS_OK)
    goto fail;
  info->draft_config = dup_meta(st, "draft_config");
  info->train_config = dup_meta(st, "train_config");
  if (!info->draft_config || !info->train_config) {
    s = DS_FAIL(DS_ERR_FORMAT, "%s: metadata 'draft_config' or 'train_config' is missing", path);
    goto fail;
  }
  ds_draft_config cfg;
  if ((s = ds_draft_config_from_json(info->draft_config, strlen(info->draft_config), path, &cfg)) != DS_OK) goto fail;
  float *zeros = ds_calloc((size_t)(cfg.vocab_size * cfg.hidden_size), sizeof(float), "draft tables");
  s = zeros ? ds_draft_new(&cfg, zeros, zeros, 0, backend, &d) : DS_ERR_NOMEM;
  free(zeros);
  if (s != DS_OK) goto fail;
  if ((s = ds_draft_read_tensors(d, st, "draft.")) != DS_OK) goto fail;
  if ((s = ds_adamw_init(opt, ds_draft_num_params(d))) != DS_OK) goto fail;
  const char *names[2] = {"optim.m", "optim.v"};
  float *dst[2] = {opt->m, opt->v};
  for (int i = 0; i < 2; i++) {
    const ds_tensor_view *v = ds_st_find(st, names[i]);
    if (!v || v->dtype != DS_F32 || v->ndim != 1 || v->numel != (int64_t)opt->n) {
      s = DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' missing or not F32 [%zu]", path, names[i], opt->n);
      goto fail;
    }
    memcpy(dst[i], v->data, opt->n * sizeof(float));
  }
  opt->step = optim_step;
  ds_st_close(st);
  *d_out = d;
  return DS_OK;
fail:
  ds_st_close(st);
  ds_draft_free(d);
  ds_adamw_free(opt);
  ds_checkpoint_info_free(info);
  return s;
}

void ds_checkpoint_info_free(ds_checkpoint_info *info) {
  free(info->draft_config);
  free(info->train_config);
  info->draft_config = info->train_config = NULL;
}
