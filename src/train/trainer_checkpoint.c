/* The trainer core's checkpoint (include/dspark/trainer.h, format_version 2): the
 * objective's tensors and metadata, the AdamW moments, the position in the run and its
 * configuration, every tensor and the metadata checksummed. Written atomically; on resume
 * verified, compared option by option with the current run, and checked for values outside
 * their domain before anything is used. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_util.h"
#include "train/trainer_internal.h"

ds_status ds_trainer_save(ds_trainer *t) {
  ds_st_writer *w = ds_st_writer_new();
  if (!w) return DS_FAIL(DS_ERR_NOMEM, "%s: out of memory", t->ckpt_path);
  ds_status st = t->ops->save(t->self, w);
  int64_t n = (int64_t)t->opt.n;
  char num[32];
  if (st == DS_OK) st = ds_st_writer_add(w, "optim.m", DS_F32, 1, &n, t->opt.m);
  if (st == DS_OK) st = ds_st_writer_add(w, "optim.v", DS_F32, 1, &n, t->opt.v);
  if (st == DS_OK) st = ds_st_writer_set_metadata(w, "format", t->ops->checkpoint_format);
  if (st == DS_OK) st = ds_st_writer_set_metadata(w, "format_version", DS_CHECKPOINT_FORMAT_VERSION);
  snprintf(num, sizeof num, "%" PRId64, t->step);
  if (st == DS_OK) st = ds_st_writer_set_metadata(w, "step", num);
  snprintf(num, sizeof num, "%" PRId64, t->opt.step);
  if (st == DS_OK) st = ds_st_writer_set_metadata(w, "optim_step", num);
  snprintf(num, sizeof num, "%" PRId64, t->skipped);
  if (st == DS_OK) st = ds_st_writer_set_metadata(w, "skipped_steps", num);
  if (st == DS_OK) st = ds_st_writer_set_metadata(w, "train_config", t->train_config);
  if (st == DS_OK) st = ds_st_writer_add_checksums(w);
  if (st == DS_OK) st = ds_st_writer_write(w, t->ckpt_path);
  ds_st_writer_free(w);
  return st;
}

ds_status ds_trainer_checkpoint_int(const ds_safetensors *ck, const char *key, int64_t *out) {
  const char *v = ds_st_metadata(ck, key);
  char *end;
  if (!v) return DS_FAIL(DS_ERR_FORMAT, "%s: metadata '%s' is missing", ds_st_path(ck), key);
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (errno || end == v || *end || x < 0)
    return DS_FAIL(DS_ERR_FORMAT, "%s: metadata '%s' = '%s' is not a non-negative integer", ds_st_path(ck), key, v);
  *out = x;
  return DS_OK;
}

ds_status ds_trainer_checkpoint_verify(const ds_safetensors *ck, const char *format, int *version_out) {
  const char *path = ds_st_path(ck);
  const char *fmt = ds_st_metadata(ck, "format"), *ver = ds_st_metadata(ck, "format_version");
  if (!fmt || strcmp(fmt, format) != 0)
    return DS_FAIL(DS_ERR_FORMAT, "%s: metadata 'format' is '%s', expected '%s'", path, fmt ? fmt : "(missing)",
                   format);
  int version = ver && !strcmp(ver, "1") ? 1 : ver && !strcmp(ver, DS_CHECKPOINT_FORMAT_VERSION) ? 2 : 0;
  if (!version)
    return DS_FAIL(DS_ERR_UNSUPPORTED, "%s: checkpoint format_version '%s'; this build reads 1 and %s", path,
                   ver ? ver : "(missing)", DS_CHECKPOINT_FORMAT_VERSION);
  if (version_out) *version_out = version;
  if (version == 1) return DS_OK; /* written before checksums existed */
  int present = 0;
  DS_TRY(ds_st_verify_checksums(ck, &present));
  if (!present)
    return DS_FAIL(DS_ERR_FORMAT, "%s: metadata 'checksums' is missing (format_version %s checkpoints carry them)",
                   path, DS_CHECKPOINT_FORMAT_VERSION);
  return DS_OK;
}

ds_status ds_check_finite_tensor(const char *file, const char *name, const float *x, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!isfinite(x[i]))
      return DS_FAIL(DS_ERR_NUMERIC, "%s: tensor '%s' holds a non-finite value (%g at flat index %zu)", file, name,
                     (double)x[i], i);
  return DS_OK;
}

/* A resumed run must be the same run: every field equal, or an error naming it. */
static ds_status check_same_config(const char *saved, const char *now, const char *ckpt_path) {
  ds_status st;
  cJSON *a = ds_json_parse(saved, strlen(saved), ckpt_path, &st), *b = NULL;
  if (!a) return st;
  b = ds_json_parse(now, strlen(now), "current options", &st);
  if (!b) { cJSON_Delete(a); return st; }
  st = DS_OK;
  const cJSON *it;
  cJSON_ArrayForEach(it, b) {
    const cJSON *other = cJSON_GetObjectItemCaseSensitive(a, it->string);
    if (!other || !cJSON_Compare(it, other, 1)) {
      char *x = other ? cJSON_PrintUnformatted(other) : NULL, *y = cJSON_PrintUnformatted(it);
      st = DS_FAIL(DS_ERR_ARG, "cannot resume from %s: option '%s' was %s, now %s", ckpt_path, it->string,
                   x ? x : "(absent)", y ? y : "?");
      free(x);
      free(y);
      break;
    }
  }
  cJSON_ArrayForEach(it, a) {
    if (st != DS_OK) break;
    if (!cJSON_GetObjectItemCaseSensitive(b, it->string)) {
      char *x = cJSON_PrintUnformatted(it);
      st = DS_FAIL(DS_ERR_ARG, "cannot resume from %s: option '%s' was %s, now (absent)", ckpt_path, it->string,
                   x ? x : "?");
      free(x);
    }
  }
  cJSON_Delete(a);
  cJSON_Delete(b);
  return st;
}

/* optim.m / optim.v: F32 [n], finite, and v (a mean of squares) never negative. */
static ds_status load_moment(const ds_safetensors *ck, const char *name, float *dst, size_t n, int nonneg) {
  const char *path = ds_st_path(ck);
  const ds_tensor_view *v = ds_st_find(ck, name);
  if (!v || v->dtype != DS_F32 || v->ndim != 1 || v->numel != (int64_t)n)
    return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' missing or not F32 [%zu] (the model has %zu trainable parameters)",
                   path, name, n, n);
  memcpy(dst, v->data, n * sizeof(float));
  DS_TRY(ds_check_finite_tensor(path, name, dst, n));
  if (nonneg)
    for (size_t i = 0; i < n; i++)
      if (dst[i] < 0)
        return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' holds a negative second moment (%g at index %zu)", path, name,
                       (double)dst[i], i);
  return DS_OK;
}

static ds_status load_from(ds_trainer *t, const ds_safetensors *ck) {
  const char *path = t->ckpt_path;
  int version = 0;
  DS_TRY(ds_trainer_checkpoint_verify(ck, t->ops->checkpoint_format, &version));
  if (version < 2)
    return DS_FAIL(DS_ERR_UNSUPPORTED, "%s: format_version 1 (written before checkpoints carried checksums) can be "
                   "exported but not resumed by this build, which resumes format_version %s; start a new run "
                   "(--overwrite) or finish this one with the dspark that wrote it", path, DS_CHECKPOINT_FORMAT_VERSION);
  int64_t step, optim_step, skipped;
  DS_TRY(ds_trainer_checkpoint_int(ck, "step", &step));
  DS_TRY(ds_trainer_checkpoint_int(ck, "optim_step", &optim_step));
  DS_TRY(ds_trainer_checkpoint_int(ck, "skipped_steps", &skipped));
  const char *saved = ds_st_metadata(ck, "train_config");
  if (!saved) return DS_FAIL(DS_ERR_FORMAT, "%s: metadata 'train_config' is missing", path);
  DS_TRY(check_same_config(saved, t->train_config, path));
  if (step > t->o.steps || skipped > step || optim_step > step - skipped)
    return DS_FAIL(DS_ERR_FORMAT, "%s: inconsistent position: step %lld of %lld, %lld optimizer updates, %lld skipped "
                   "steps", path, (long long)step, (long long)t->o.steps, (long long)optim_step, (long long)skipped);
  DS_TRY(t->ops->load(t->self, ck));
  size_t n = t->ops->num_params(t->self);
  DS_TRY(ds_adamw_init(&t->opt, n));
  DS_TRY(load_moment(ck, "optim.m", t->opt.m, n, 0));
  DS_TRY(load_moment(ck, "optim.v", t->opt.v, n, 1));
  t->opt.step = optim_step;
  t->step = step;
  t->skipped = skipped;
  return DS_OK;
}

ds_status ds_trainer_load(ds_trainer *t) {
  ds_safetensors *ck;
  DS_TRY(ds_st_open(t->ckpt_path, &ck));
  ds_status st = load_from(t, ck);
  ds_st_close(ck);
  return st;
}
