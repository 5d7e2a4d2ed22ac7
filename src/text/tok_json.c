/* Typed access to tokenizer.json fields; every failure names the file and the field. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "text/tok_json.h"

ds_status tk_fail(const tk_loader *L, ds_status st, const char *path, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return DS_FAIL(st, "%s: %s: %s", L->label, path, msg);
}

/* A printable excerpt of a token for messages: at most 40 bytes, control bytes escaped. */
const char *tk_show(const char *s, char buf[200]) {
  size_t o = 0;
  for (size_t i = 0; s[i] && o < 190; i++) {
    unsigned char c = (unsigned char)s[i];
    if (i >= 40 && (c & 0xC0) != 0x80) { memcpy(buf + o, "...", 3); o += 3; break; } /* at a character start */
    if (c < 0x20 || c == 0x7F) o += (size_t)snprintf(buf + o, 200 - o, "\\x%02X", c);
    else buf[o++] = (char)c;
  }
  buf[o] = 0;
  return buf;
}

const char *tk_type_name(const cJSON *v) {
  if (!v) return "missing";
  if (cJSON_IsNull(v)) return "null";
  if (cJSON_IsBool(v)) return "a boolean";
  if (cJSON_IsNumber(v)) return "a number";
  if (cJSON_IsString(v)) return "a string";
  if (cJSON_IsArray(v)) return "an array";
  return "an object";
}

int tk_is_null(const cJSON *v) { return !v || cJSON_IsNull(v); }

/* Optional boolean: absent or null gives def. */
ds_status tk_get_bool(const tk_loader *L, const cJSON *obj, const char *key, int def, int *out,
                          const char *path) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  *out = def;
  if (tk_is_null(v)) return DS_OK;
  if (!cJSON_IsBool(v)) return tk_fail(L, DS_ERR_FORMAT, path, "'%s' must be a boolean, got %s", key, tk_type_name(v));
  *out = cJSON_IsTrue(v);
  return DS_OK;
}

ds_status tk_need_bool(const tk_loader *L, const cJSON *obj, const char *key, int *out, const char *path) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (!cJSON_IsBool(v)) return tk_fail(L, DS_ERR_FORMAT, path, "'%s' must be a boolean, got %s", key, tk_type_name(v));
  *out = cJSON_IsTrue(v);
  return DS_OK;
}

ds_status tk_get_id(const tk_loader *L, const cJSON *v, int32_t *out, const char *path) {
  double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
  if (!cJSON_IsNumber(v) || d < 0 || d >= (double)INT32_MAX || d != (double)(int64_t)d)
    return tk_fail(L, DS_ERR_FORMAT, path, "token id must be an integer in [0, 2^31-1), got %s",
                cJSON_IsNumber(v) ? "an out-of-range number" : tk_type_name(v));
  *out = (int32_t)d;
  return DS_OK;
}

ds_status tk_check_utf8(const tk_loader *L, const char *s, const char *path) {
  size_t n = strlen(s);
  if (tk_utf8_valid_prefix((const unsigned char *)s, n) != n)
    return tk_fail(L, DS_ERR_FORMAT, path, "string is not valid UTF-8");
  return DS_OK;
}

const char *tk_type_of(const tk_loader *L, const cJSON *obj, const char *path, ds_status *st) {
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(obj, "type");
  *st = DS_OK;
  if (!cJSON_IsObject(obj)) {
    *st = tk_fail(L, DS_ERR_FORMAT, path, "expected an object, got %s", tk_type_name(obj));
    return NULL;
  }
  if (!cJSON_IsString(t)) {
    *st = tk_fail(L, DS_ERR_FORMAT, path, "'type' must be a string, got %s", tk_type_name(t));
    return NULL;
  }
  return t->valuestring;
}
