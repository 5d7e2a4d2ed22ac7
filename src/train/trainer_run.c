/* The trainer core's run directory: creation and the one-writer lock, refusing to overwrite
 * an existing run, the configuration texts (train_config, run.json) and metrics.jsonl. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/json_util.h"
#include "dspark/backend.h"
#include "dspark/progress.h"
#include "train/trainer_internal.h"

/* The files a run writes (an --overwrite removes exactly these). */
static const char *const k_run_files[] = {"checkpoint.safetensors", "metrics.jsonl", "run.json", "target_config.json"};

static int dir_has_run_files(const char *dir) {
  for (size_t i = 0; i < sizeof k_run_files / sizeof k_run_files[0]; i++) {
    char *p = ds_path_join(dir, k_run_files[i]);
    int e = p && ds_file_exists(p);
    free(p);
    if (e) return 1;
  }
  return 0;
}

ds_status ds_trainer_run_dir_open(ds_trainer *t) {
  const char *dir = t->o.out_dir;
  ds_status st = ds_mkdir_p(dir);
  if (st != DS_OK) return ds_error_wrap(st, "cannot create the run directory %s", dir);
  DS_TRY(ds_dir_lock_acquire(dir, "run directory", &t->lock));
  if (dir_has_run_files(dir) && !t->o.resume && !t->o.overwrite)
    return DS_FAIL(DS_ERR_ARG, "%s already holds a training run; pass --resume to continue it or --overwrite to "
                   "replace it", dir);
  if (t->o.overwrite && !t->o.resume)
    for (size_t i = 0; i < sizeof k_run_files / sizeof k_run_files[0]; i++) {
      char *p = ds_path_join(dir, k_run_files[i]);
      if (!p) return DS_ERR_NOMEM;
      if (unlink(p) != 0 && errno != ENOENT) {
        st = DS_FAIL(DS_ERR_IO, "%s: cannot remove (--overwrite): %s", p, strerror(errno));
        free(p);
        return st;
      }
      free(p);
    }
  int removed = 0;
  DS_TRY(ds_remove_stale_temps(dir, &removed));
  if (removed && !t->o.quiet) ds_note("%s: removed %d stale temporary file(s) of an interrupted run", dir, removed);
  return ds_trainer_run_paths(t);
}

ds_status ds_trainer_run_paths(ds_trainer *t) {
  const char *dir = t->o.out_dir;
  t->ckpt_path = ds_path_join(dir, "checkpoint.safetensors");
  t->metrics_path = ds_path_join(dir, "metrics.jsonl");
  t->run_json_path = ds_path_join(dir, "run.json");
  return t->ckpt_path && t->metrics_path && t->run_json_path ? DS_OK : DS_ERR_NOMEM;
}

void ds_trainer_run_dir_close(ds_trainer *t) {
  if (t->metrics) fclose(t->metrics);
  t->metrics = NULL;
  ds_dir_unlock(&t->lock);
  free(t->ckpt_path);
  free(t->metrics_path);
  free(t->run_json_path);
  t->ckpt_path = t->metrics_path = t->run_json_path = NULL;
}

/* ------------------------------------------------------------------ configuration */

/* A 64-bit integer as a decimal string: JSON numbers are doubles to most readers (and to
 * cJSON), which cannot tell 2^53 from 2^53 + 1. */
static void add_u64_string(cJSON *j, const char *key, uint64_t v) {
  char buf[32];
  snprintf(buf, sizeof buf, "%" PRIu64, v);
  cJSON_AddStringToObject(j, key, buf);
}

ds_status ds_trainer_build_config(ds_trainer *t) {
  const ds_loop_options *o = &t->o;
  ds_status st = DS_OK;
  cJSON *j = ds_json_parse(t->obj->train_config, strlen(t->obj->train_config), "the objective's train_config", &st);
  if (!j) return st;
  cJSON_AddNumberToObject(j, "steps", (double)o->steps);
  cJSON_AddNumberToObject(j, "batch_seqs", (double)o->batch_items);
  cJSON_AddNumberToObject(j, "lr", o->lr);
  cJSON_AddNumberToObject(j, "warmup_frac", o->warmup_frac);
  cJSON_AddNumberToObject(j, "weight_decay", o->weight_decay);
  cJSON_AddNumberToObject(j, "grad_clip", o->grad_clip);
  add_u64_string(j, "seed", o->seed);
  cJSON_AddBoolToObject(j, "skip_nonfinite", o->skip_nonfinite);
  t->train_config = cJSON_Print(j);
  cJSON_Delete(j);
  return t->train_config ? DS_OK : DS_FAIL(DS_ERR_NOMEM, "out of memory");
}

ds_status ds_trainer_write_run_json(ds_trainer *t) {
  ds_status st = DS_OK;
  cJSON *j = ds_json_parse(t->train_config, strlen(t->train_config), "train_config", &st);
  if (!j) return st;
  if (t->obj->run_info) {
    cJSON *info = ds_json_parse(t->obj->run_info, strlen(t->obj->run_info), "run_info", &st);
    if (!info) { cJSON_Delete(j); return st; }
    cJSON *it = info->child;
    while (it) {
      cJSON *next = it->next;
      cJSON_AddItemToObject(j, it->string, cJSON_DetachItemViaPointer(info, it));
      it = next;
    }
    cJSON_Delete(info);
  }
  /* what ran (not part of the trajectory's definition) */
  cJSON_AddStringToObject(j, "gemm", ds_gemm_name());
  cJSON_AddStringToObject(j, "compute", ds_compute_label());
  if (ds_matmul_compute() == DS_COMPUTE_BF16) cJSON_AddStringToObject(j, "gemm_bf16", ds_gemm_bf16_name());
  cJSON_AddNumberToObject(j, "threads", ds_get_num_threads());
  cJSON_AddNumberToObject(j, "world_size", ds_comm_size(t->o.comm)); /* free to change on resume */
  cJSON_AddStringToObject(j, "comm", ds_comm_name(t->o.comm));
  char *text = cJSON_Print(j);
  cJSON_Delete(j);
  if (!text) return DS_FAIL(DS_ERR_NOMEM, "out of memory");
  st = ds_write_file_atomic(t->run_json_path, text, strlen(text));
  free(text);
  return st;
}

/* ------------------------------------------------------------------ metrics */

/* The step of a metrics line, and whether it is an evaluation; 0 when the line does not
 * parse as a record (a torn write). */
static int parse_record(const char *line, size_t len, int64_t *step, int *is_eval) {
  cJSON *j = cJSON_ParseWithLength(line, len);
  if (!j) return 0;
  const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "step"), *k = cJSON_GetObjectItemCaseSensitive(j, "kind");
  /* a step the cast can hold (a hand-edited 1e999 would have no conversion) */
  int ok = cJSON_IsNumber(s) && cJSON_IsString(k) && s->valuedouble >= 0 && s->valuedouble <= 9007199254740992.0;
  if (ok) {
    *step = (int64_t)s->valuedouble;
    *is_eval = !strcmp(k->valuestring, "eval");
  }
  cJSON_Delete(j);
  return ok;
}

/* Keeps the records up to the checkpoint's step that are whole lines; returns whether an
 * evaluation record of that step is among them. */
static ds_status trim_metrics(const char *path, int64_t last_step, int *has_eval) {
  *has_eval = 0;
  if (!ds_file_exists(path)) return DS_OK;
  char *text;
  size_t len;
  DS_TRY(ds_read_file(path, &text, &len));
  char *out = ds_malloc(len + 1, "metrics");
  if (!out) { free(text); return DS_ERR_NOMEM; }
  size_t n = 0;
  for (char *line = text; line < text + len;) {
    char *nl = memchr(line, '\n', (size_t)(text + len - line));
    if (!nl) break; /* a torn last line (killed mid-write): dropped */
    size_t l = (size_t)(nl - line) + 1;
    int64_t step;
    int is_eval;
    if (parse_record(line, l - 1, &step, &is_eval) && step <= last_step) {
      memcpy(out + n, line, l);
      n += l;
      if (is_eval && step == last_step) *has_eval = 1;
    }
    line += l;
  }
  ds_status st = ds_write_file_atomic(path, out, n);
  free(text);
  free(out);
  return st;
}

ds_status ds_trainer_metrics_open(ds_trainer *t, int *has_eval) {
  *has_eval = 0;
  if (t->step > 0) DS_TRY(trim_metrics(t->metrics_path, t->step, has_eval));
  t->metrics = fopen(t->metrics_path, t->step > 0 ? "a" : "w");
  if (!t->metrics) return DS_FAIL(DS_ERR_IO, "%s: cannot open for writing: %s", t->metrics_path, strerror(errno));
  return DS_OK;
}

static void add_pair(cJSON *j, const char *name, const double *pair) {
  cJSON_AddNumberToObject(j, name, pair[1] > 0 ? pair[0] / pair[1] : 0.0);
}

ds_status ds_trainer_metrics_write(ds_trainer *t, const char *kind, const ds_report *r, double lr, double grad_norm,
                                   double tok_s, double elapsed) {
  const ds_objective_ops *ops = t->ops;
  cJSON *j = cJSON_CreateObject();
  if (!j) return DS_FAIL(DS_ERR_NOMEM, "out of memory");
  cJSON_AddStringToObject(j, "kind", kind);
  cJSON_AddNumberToObject(j, "step", (double)t->step);
  for (int i = 0; i < ops->n_pairs; i++)
    if (r->pair_present[i]) add_pair(j, ops->pair_names[i], r->pair[i]);
  if (ops->exp_name && r->pair_present[ops->exp_pair] && r->pair[ops->exp_pair][1] > 0)
    cJSON_AddNumberToObject(j, ops->exp_name, exp(r->pair[ops->exp_pair][0] / r->pair[ops->exp_pair][1]));
  if (ops->vec_name && r->pair_present[ops->vec_pair]) {
    cJSON *arr = cJSON_CreateArray();
    for (int k = 0; k < ops->vec_len; k++)
      cJSON_AddItemToArray(arr, cJSON_CreateNumber(r->vec[k][1] > 0 ? r->vec[k][0] / r->vec[k][1] : 0));
    cJSON_AddItemToObject(j, ops->vec_name, arr);
  }
  cJSON_AddNumberToObject(j, "tokens", r->num_tokens);
  if (lr >= 0) cJSON_AddNumberToObject(j, "lr", lr);
  if (grad_norm >= 0) cJSON_AddNumberToObject(j, "grad_norm", grad_norm);
  if (tok_s >= 0) cJSON_AddNumberToObject(j, "tokens_per_s", tok_s);
  cJSON_AddNumberToObject(j, "elapsed_s", elapsed);
  cJSON_AddNumberToObject(j, "peak_rss_mib", ds_peak_rss_mib());
  cJSON_AddNumberToObject(j, "skipped_steps", (double)t->skipped);
  char *text = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  if (!text) return DS_FAIL(DS_ERR_NOMEM, "out of memory");
  int bad = fprintf(t->metrics, "%s\n", text) < 0;
  bad |= fflush(t->metrics) != 0;
  bad |= ferror(t->metrics) != 0;
  int err = errno;
  free(text);
  if (bad)
    return DS_FAIL(DS_ERR_IO, "%s: cannot write the metrics: %s", t->metrics_path, strerror(err ? err : EIO));
  return DS_OK;
}
