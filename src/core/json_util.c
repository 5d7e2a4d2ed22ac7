#include "core/json_util.h"

#include <math.h>

static void line_col(const char *buf, size_t at, size_t *line, size_t *col) {
  *line = 1;
  *col = 1;
  for (size_t i = 0; i < at; i++) {
    if (buf[i] == '\n') { (*line)++; *col = 1; }
    else (*col)++;
  }
}

cJSON *ds_json_parse(const char *buf, size_t len, const char *label, ds_status *st) {
  const char *end = NULL;
  /* require_null_terminated = 0: cJSON needs a NUL inside the length otherwise; trailing
   * content is checked below instead. */
  cJSON *root = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
  size_t at = end && end >= buf && end <= buf + len ? (size_t)(end - buf) : 0;
  if (root) {
    while (at < len && (buf[at] == ' ' || buf[at] == '\t' || buf[at] == '\n' || buf[at] == '\r')) at++;
    if (at == len) {
      *st = DS_OK;
      return root;
    }
    cJSON_Delete(root);
  }
  size_t line, col;
  line_col(buf, at, &line, &col);
  *st = DS_FAIL(DS_ERR_FORMAT, "%s: malformed JSON at line %zu, column %zu%s", label, line, col,
                root ? " (content after the end of the JSON value)" : "");
  return NULL;
}

/* Field readers: absent -> default (or an error when required); present with a wrong type
 * or out of range -> an error naming the field. */
ds_status ds_json_int(const cJSON *obj, const char *key, int required, int64_t dflt, int64_t lo,
                         int64_t hi, const char *label, int64_t *out) {
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (!it || cJSON_IsNull(it)) {
    if (required) return DS_FAIL(DS_ERR_FORMAT, "%s: required field '%s' is missing", label, key);
    *out = dflt;
    return DS_OK;
  }
  if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble))
    return DS_FAIL(DS_ERR_FORMAT, "%s: field '%s' must be an integer", label, key);
  double v = it->valuedouble;
  if (v < (double)lo || v > (double)hi)
    return DS_FAIL(DS_ERR_FORMAT, "%s: field '%s' = %.0f is outside [%lld, %lld]", label, key, v,
                   (long long)lo, (long long)hi);
  *out = (int64_t)v;
  return DS_OK;
}

ds_status ds_json_num(const cJSON *obj, const char *key, int required, double dflt, const char *label,
                         double *out) {
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (!it || cJSON_IsNull(it)) {
    if (required) return DS_FAIL(DS_ERR_FORMAT, "%s: required field '%s' is missing", label, key);
    *out = dflt;
    return DS_OK;
  }
  if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble))
    return DS_FAIL(DS_ERR_FORMAT, "%s: field '%s' must be a finite number", label, key);
  *out = it->valuedouble;
  return DS_OK;
}

ds_status ds_json_positive(const cJSON *obj, const char *key, int required, double dflt, const char *label,
                           double *out) {
  DS_TRY(ds_json_num(obj, key, required, dflt, label, out));
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (it && !cJSON_IsNull(it) && !(*out > 0))
    return DS_FAIL(DS_ERR_FORMAT, "%s: field '%s' = %g must be > 0", label, key, *out);
  return DS_OK;
}

ds_status ds_json_bool(const cJSON *obj, const char *key, int required, int dflt, const char *label, int *out) {
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (!it || cJSON_IsNull(it)) {
    if (required) return DS_FAIL(DS_ERR_FORMAT, "%s: required field '%s' is missing", label, key);
    *out = dflt;
    return DS_OK;
  }
  if (!cJSON_IsBool(it)) return DS_FAIL(DS_ERR_FORMAT, "%s: field '%s' must be true or false", label, key);
  *out = cJSON_IsTrue(it);
  return DS_OK;
}

