/* Round records, identity records, calibration files and profile files of speculative decoding
 * (dspark/spec_files.h). */
#include "dspark/spec_files.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_util.h"
#include "dspark/fileio.h"
#include "dspark/progress.h"

void ds_spec_rounds_init(ds_spec_rounds *r, int64_t K) {
  memset(r, 0, sizeof *r);
  r->K = K;
}

void ds_spec_rounds_add(void *user, int request, const float *conf, int64_t n_conf, int64_t n_prop, int64_t n_acc) {
  ds_spec_rounds *r = user;
  if (r->failed) return;
  if (r->n == r->cap) {
    int64_t cap = r->cap ? 2 * r->cap : 256;
    float *z = realloc(r->z, (size_t)(cap * r->K) * sizeof(float));
    if (z) r->z = z;
    int64_t *p = realloc(r->n_prop, (size_t)cap * sizeof(int64_t));
    if (p) r->n_prop = p;
    int64_t *a = realloc(r->n_acc, (size_t)cap * sizeof(int64_t));
    if (a) r->n_acc = a;
    int *q = realloc(r->request, (size_t)cap * sizeof(int));
    if (q) r->request = q;
    if (!z || !p || !a || !q) {
      r->failed = 1;
      return;
    }
    r->cap = cap;
  }
  float *row = r->z + r->n * r->K;
  for (int64_t k = 0; k < r->K; k++) row[k] = k < n_conf ? conf[k] : NAN;
  r->n_prop[r->n] = n_prop;
  r->n_acc[r->n] = n_acc;
  r->request[r->n] = r->request_base + request;
  r->n++;
}

void ds_spec_rounds_free(ds_spec_rounds *r) {
  free(r->z);
  free(r->n_prop);
  free(r->n_acc);
  free(r->request);
  memset(r, 0, sizeof *r);
}

ds_round_set ds_spec_rounds_set(const ds_spec_rounds *r, const uint8_t *use) {
  return (ds_round_set){r->z, r->n_prop, r->n_acc, use, r->n, r->K};
}

cJSON *ds_ece_json(const ds_round_set *s, const double *T) {
  cJSON *a = cJSON_CreateArray();
  for (int64_t k = 0; k < s->K; k++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ds_cumulative_ece(s, k, T, NULL)));
  return a;
}

double ds_ece_mean(const ds_round_set *s, const double *T) {
  double sum = 0;
  int64_t used = 0;
  for (int64_t k = 0; k < s->K; k++) {
    int64_t n = 0;
    double e = ds_cumulative_ece(s, k, T, &n);
    if (n > 0) sum += e, used++;
  }
  return used ? sum / (double)used : 0.0;
}

cJSON *ds_ece_counts_json(const ds_round_set *s) {
  cJSON *a = cJSON_CreateArray();
  for (int64_t k = 0; k < s->K; k++) {
    int64_t n = 0;
    ds_cumulative_ece(s, k, NULL, &n);
    cJSON_AddItemToArray(a, cJSON_CreateNumber((double)n));
  }
  return a;
}

cJSON *ds_json_number_array(const double *v, int64_t n) {
  cJSON *a = cJSON_CreateArray();
  for (int64_t i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
  return a;
}

ds_status ds_json_write_report(const char *option, const char *path, cJSON *j) {
  char *text = cJSON_Print(j);
  cJSON_Delete(j);
  if (!text) return DS_FAIL(DS_ERR_NOMEM, "out of memory writing %s %s", option, path);
  ds_status st = ds_write_file_atomic(path, text, strlen(text));
  free(text);
  return st == DS_OK ? st : ds_error_wrap(st, "%s %s", option, path);
}

/* The positive finite numbers of array `key` of j; *out malloc'd. A missing key gives n = 0
 * when optional. */
static ds_status positive_array(const cJSON *j, const char *path, const char *key, int optional, double **out,
                                int64_t *n) {
  *out = NULL;
  *n = 0;
  const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, key);
  if (!a && optional) return DS_OK;
  if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) < 1)
    return DS_FAIL(DS_ERR_FORMAT, "%s: \"%s\" must be a non-empty array of numbers", path, key);
  int64_t len = cJSON_GetArraySize(a);
  double *v = ds_malloc((size_t)len * sizeof(double), key);
  if (!v) return DS_ERR_NOMEM;
  int64_t i = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, a) {
    if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble) || e->valuedouble <= 0) {
      free(v);
      return DS_FAIL(DS_ERR_FORMAT, "%s: \"%s\"[%lld] must be a finite number > 0", path, key, (long long)i);
    }
    v[i++] = e->valuedouble;
  }
  *out = v;
  *n = len;
  return DS_OK;
}

static ds_status read_json(const char *path, cJSON **out) {
  char *text = NULL;
  size_t len = 0;
  DS_TRY(ds_read_file(path, &text, &len));
  ds_status st;
  *out = ds_json_parse(text, len, path, &st); /* strict: nothing after the value */
  free(text);
  if (!*out) return st;
  if (!cJSON_IsObject(*out)) {
    cJSON_Delete(*out);
    *out = NULL;
    return DS_FAIL(DS_ERR_FORMAT, "%s: not a JSON object", path);
  }
  return DS_OK;
}

void ds_spec_add_draft_identity(cJSON *j, const ds_draft *d) {
  char id[24];
  snprintf(id, sizeof id, "%016llx", (unsigned long long)ds_draft_identity(d));
  cJSON_AddStringToObject(j, "draft_identity", id);
  cJSON_AddNumberToObject(j, "block_size", (double)ds_draft_get_config(d)->block_size);
  cJSON_AddStringToObject(j, "draft_weights", ds_draft_weights_name(ds_draft_decode_weights(d)));
}

/* The file's "draft_weights" (absent: "f32", what every file had before the field) and whether
 * they are d's decoding weights; -1 when the field is not a string. */
static int same_draft_weights(const cJSON *j, const ds_draft *d, const char **theirs) {
  const cJSON *w = cJSON_GetObjectItemCaseSensitive(j, "draft_weights");
  if (w && !cJSON_IsString(w)) return -1;
  *theirs = w ? w->valuestring : "f32";
  return !strcmp(*theirs, ds_draft_weights_name(ds_draft_decode_weights(d)));
}

static ds_status target_config_hash(ds_model_source *target, char out[24]) {
  uint64_t h = 0;
  ds_status st = ds_model_source_hash(target, DS_MODEL_CONFIG, &h);
  snprintf(out, 24, "%016llx", (unsigned long long)h);
  return st;
}

ds_status ds_spec_add_target_identity(cJSON *j, ds_model_source *target) {
  char h[24];
  DS_TRY(target_config_hash(target, h));
  cJSON_AddStringToObject(j, "target_config_xxh64", h);
  return DS_OK;
}

/* The file's "draft_identity" and "block_size" against the draft's. */
static ds_status check_draft(const cJSON *j, const char *path, const ds_draft *d, const char *draft_dir,
                             const char *redo) {
  const cJSON *id = cJSON_GetObjectItemCaseSensitive(j, "draft_identity");
  if (!cJSON_IsString(id))
    return DS_FAIL(DS_ERR_FORMAT, "%s: no \"draft_identity\" string: the draft it was made for is not recorded "
                   "(an older dspark or a file written by hand); re-run `%s --draft %s`", path, redo, draft_dir);
  int64_t bs = 0, g = ds_draft_get_config(d)->block_size;
  DS_TRY(ds_json_int(j, "block_size", 1, 0, 1, 1 << 20, path, &bs));
  if (bs != g)
    return DS_FAIL(DS_ERR_ARG, "%s: field \"block_size\" is %lld, but the draft %s has block size %lld: the file was "
                   "made for another draft; re-run `%s --draft %s`", path, (long long)bs, draft_dir, (long long)g, redo,
                   draft_dir);
  char mine[24];
  snprintf(mine, sizeof mine, "%016llx", (unsigned long long)ds_draft_identity(d));
  if (strcmp(id->valuestring, mine) != 0)
    return DS_FAIL(DS_ERR_ARG, "%s: field \"draft_identity\" is %.40s, but the draft %s is %s (other weights): the "
                   "file was made for another draft; re-run `%s --draft %s`", path, id->valuestring, draft_dir, mine,
                   redo, draft_dir);
  const char *theirs = NULL;
  int same = same_draft_weights(j, d, &theirs);
  if (same < 0) return DS_FAIL(DS_ERR_FORMAT, "%s: field \"draft_weights\" must be a string", path);
  if (!same) /* the confidences move little with the rounding: used, and said */
    ds_note("%s was fitted on the draft's %.16s decoding weights, this run reads %s (--draft-weights): the confidences "
            "may differ slightly; re-run `%s --draft-weights %s` to fit them again", path, theirs,
            ds_draft_weights_name(ds_draft_decode_weights(d)), redo, ds_draft_weights_name(ds_draft_decode_weights(d)));
  return DS_OK;
}

ds_status ds_spec_read_calibration(const char *path, const ds_draft *d, const char *draft_dir, int64_t drafted,
                                   double **T, int64_t *n) {
  *T = NULL;
  *n = 0;
  cJSON *j = NULL;
  DS_TRY(read_json(path, &j));
  int64_t fitted = 0;
  ds_status st = check_draft(j, path, d, draft_dir, "dspark calibrate");
  if (st == DS_OK) st = ds_json_int(j, "draft_len", 1, 0, 1, ds_draft_get_config(d)->block_size, path, &fitted);
  if (st == DS_OK) st = positive_array(j, path, "temperatures", 0, T, n);
  if (st == DS_OK && *n != fitted)
    st = DS_FAIL(DS_ERR_FORMAT, "%s: \"temperatures\" holds %lld values, but field \"draft_len\" is %lld (one "
                 "temperature per fitted position)", path, (long long)*n, (long long)fitted);
  if (st == DS_OK && drafted > fitted)
    st = DS_FAIL(DS_ERR_ARG, "%s: fitted %lld positions (field \"draft_len\"), but %lld are drafted here: pass "
                 "--draft-len %lld, or re-run `dspark calibrate --draft-len %lld`", path, (long long)fitted,
                 (long long)drafted, (long long)fitted, (long long)drafted);
  if (st != DS_OK) free(*T), *T = NULL, *n = 0;
  cJSON_Delete(j);
  return st;
}

/* The profile's target against target (refused when another); its draft costs against d:
 * *drop when they were measured on another draft. */
static ds_status check_profile(const cJSON *j, const char *path, ds_model_source *target, const ds_draft *d,
                               const char *draft_dir, int64_t n_draft, int *drop) {
  *drop = 0;
  const cJSON *th = cJSON_GetObjectItemCaseSensitive(j, "target_config_xxh64");
  if (th && !cJSON_IsString(th))
    return DS_FAIL(DS_ERR_FORMAT, "%s: field \"target_config_xxh64\" must be a string", path);
  if (!th) {
    ds_note("%s records no target (\"target_config_xxh64\"): its costs are taken as given", path);
  } else {
    char mine[24];
    DS_TRY(target_config_hash(target, mine));
    if (strcmp(th->valuestring, mine) != 0)
      return DS_FAIL(DS_ERR_ARG, "%s: field \"target_config_xxh64\" is %.40s, but %s hashes to %s: the "
                     "costs were measured for another target; re-run `dspark profile --target %s`", path,
                     th->valuestring, ds_model_source_label(target, DS_MODEL_CONFIG), mine,
                     ds_model_source_path(target));
  }
  if (n_draft == 0) return DS_OK;
  const cJSON *id = cJSON_GetObjectItemCaseSensitive(j, "draft_identity");
  if (!id) {
    ds_note("%s records no draft (\"draft_identity\"): its draft costs are taken as given", path);
    return DS_OK;
  }
  int64_t bs = 0, g = ds_draft_get_config(d)->block_size;
  if (!cJSON_IsString(id)) return DS_FAIL(DS_ERR_FORMAT, "%s: field \"draft_identity\" must be a string", path);
  DS_TRY(ds_json_int(j, "block_size", 1, 0, 1, 1 << 20, path, &bs));
  if (n_draft != bs)
    return DS_FAIL(DS_ERR_FORMAT, "%s: \"draft_block_seconds\" holds %lld values, but field \"block_size\" is %lld (one "
                   "per block length)", path, (long long)n_draft, (long long)bs);
  char mine[24];
  snprintf(mine, sizeof mine, "%016llx", (unsigned long long)ds_draft_identity(d));
  /* The draft costs are the file's optional part: another draft's are replaced by the cost measured
   * during decoding (as without them), the target's verification costs still apply. */
  const char *theirs = NULL;
  int same = same_draft_weights(j, d, &theirs);
  if (same < 0) return DS_FAIL(DS_ERR_FORMAT, "%s: field \"draft_weights\" must be a string", path);
  if (bs == g && strcmp(id->valuestring, mine) == 0 && !same) {
    ds_note("%s: its draft costs were measured with the draft's %.16s decoding weights, this run reads %s "
            "(--draft-weights): not used, the draft cost is measured during decoding", path, theirs,
            ds_draft_weights_name(ds_draft_decode_weights(d)));
    *drop = 1;
  } else if (bs != g || strcmp(id->valuestring, mine) != 0) {
    ds_note("%s: its draft costs were measured on another draft (field \"draft_identity\" %.40s, \"block_size\" %lld; "
            "the draft %s is %s, block size %lld): not used, the draft cost is measured during decoding", path,
            id->valuestring, (long long)bs, draft_dir, mine, (long long)g);
    *drop = 1;
  }
  return DS_OK;
}

ds_status ds_spec_read_profile(const char *path, ds_model_source *target, const ds_draft *d, const char *draft_dir,
                               double **verify_s, int64_t *n_verify, double **head_s, int64_t *n_head, double **draft_s,
                               int64_t *n_draft) {
  cJSON *j = NULL;
  *verify_s = *head_s = *draft_s = NULL; /* a refusal leaves nothing behind, whatever fails */
  *n_verify = *n_head = *n_draft = 0;
  DS_TRY(read_json(path, &j));
  ds_status st = positive_array(j, path, "verify_seconds", 0, verify_s, n_verify);
  if (st == DS_OK) st = positive_array(j, path, "head_seconds", 1, head_s, n_head);
  if (st == DS_OK) st = positive_array(j, path, "draft_block_seconds", 1, draft_s, n_draft);
  int drop = 0;
  if (st == DS_OK) st = check_profile(j, path, target, d, draft_dir, *n_draft, &drop);
  if (st == DS_OK && drop) free(*draft_s), *draft_s = NULL, *n_draft = 0;
  if (st != DS_OK) {
    free(*verify_s), *verify_s = NULL;
    free(*head_s), *head_s = NULL;
    free(*draft_s), *draft_s = NULL;
    *n_verify = *n_head = *n_draft = 0;
  }
  cJSON_Delete(j);
  return st;
}
