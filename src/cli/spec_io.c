/* Round records, calibration files and profile files of the speculative-decoding commands
 * (cli/spec_io.h). */
#include "cli/spec_io.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/fileio.h"

void cli_rounds_init(cli_rounds *r, int64_t K) {
  memset(r, 0, sizeof *r);
  r->K = K;
}

void cli_rounds_add(void *user, int request, const float *conf, int64_t n_conf, int64_t n_prop, int64_t n_acc) {
  cli_rounds *r = user;
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

void cli_rounds_free(cli_rounds *r) {
  free(r->z);
  free(r->n_prop);
  free(r->n_acc);
  free(r->request);
  memset(r, 0, sizeof *r);
}

ds_round_set cli_rounds_set(const cli_rounds *r, const uint8_t *use) {
  return (ds_round_set){r->z, r->n_prop, r->n_acc, use, r->n, r->K};
}

cJSON *cli_ece_array(const ds_round_set *s, const double *T) {
  cJSON *a = cJSON_CreateArray();
  for (int64_t k = 0; k < s->K; k++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ds_cumulative_ece(s, k, T, NULL)));
  return a;
}

cJSON *cli_ece_counts(const ds_round_set *s) {
  cJSON *a = cJSON_CreateArray();
  for (int64_t k = 0; k < s->K; k++) {
    int64_t n = 0;
    ds_cumulative_ece(s, k, NULL, &n);
    cJSON_AddItemToArray(a, cJSON_CreateNumber((double)n));
  }
  return a;
}

cJSON *cli_number_array(const double *v, int64_t n) {
  cJSON *a = cJSON_CreateArray();
  for (int64_t i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
  return a;
}

ds_status cli_write_json(const char *option, const char *path, cJSON *j) {
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
  *out = cJSON_ParseWithLength(text, len);
  free(text);
  if (!*out || !cJSON_IsObject(*out)) {
    cJSON_Delete(*out);
    return DS_FAIL(DS_ERR_FORMAT, "%s: not a JSON object", path);
  }
  return DS_OK;
}

ds_status cli_read_calibration(const char *path, double **T, int64_t *n) {
  cJSON *j = NULL;
  DS_TRY(read_json(path, &j));
  ds_status st = positive_array(j, path, "temperatures", 0, T, n);
  cJSON_Delete(j);
  return st;
}

ds_status cli_read_profile(const char *path, double **verify_s, int64_t *n_verify, double **draft_s, int64_t *n_draft) {
  cJSON *j = NULL;
  DS_TRY(read_json(path, &j));
  ds_status st = positive_array(j, path, "verify_seconds", 0, verify_s, n_verify);
  if (st == DS_OK) st = positive_array(j, path, "draft_block_seconds", 1, draft_s, n_draft);
  if (st != DS_OK) free(*verify_s), *verify_s = NULL;
  cJSON_Delete(j);
  return st;
}
