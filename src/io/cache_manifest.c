/* The cache manifest: deterministic JSON writing, strict parsing, and the field-by-field checks
 * against what a run expects. See include/dspark/cache.h. */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "dspark/cache.h"
#include "core/json_util.h"

const char *ds_cache_dtype_label(ds_dtype dt) {
  switch (dt) {
    case DS_BF16: return "bf16";
    case DS_F16: return "f16";
    case DS_F32: return "f32";
    case DS_I8: return "int8";
    default: return "?";
  }
}

int ds_cache_dtype_from_label(const char *s, ds_dtype *out) {
  if (!strcmp(s, "bf16")) *out = DS_BF16;
  else if (!strcmp(s, "f16")) *out = DS_F16;
  else if (!strcmp(s, "f32")) *out = DS_F32;
  else if (!strcmp(s, "int8")) *out = DS_I8;
  else return 0;
  return 1;
}

ds_dtype ds_cache_logprob_dtype(ds_dtype dt) { return dt == DS_I8 ? DS_BF16 : dt; }

void ds_cache_hex(uint64_t h, char out[17]) { snprintf(out, 17, "%016" PRIx64, h); }

void ds_cache_shard_name(int64_t i, char *buf, size_t n) {
  snprintf(buf, n, "shard-%06d.safetensors", (int)(i < 0 ? 0 : i > INT32_MAX ? INT32_MAX : i));
}

void ds_cache_manifest_free(ds_cache_manifest *m) {
  free(m->target_path);
  free(m->data_path);
  free(m->shards);
  memset(m, 0, sizeof *m);
}

/* ---------------------------------------------------------------- writing */

static void add_hex(cJSON *j, const char *key, uint64_t h) {
  char hex[17];
  ds_cache_hex(h, hex);
  cJSON_AddStringToObject(j, key, hex);
}

/* The 16 hex digits of the leading "manifest_xxh64" field in a manifest's text, or NULL. The
 * field is the object's first, so the first occurrence of the key is the field. */
static const char *self_hash_digits(const char *text, size_t len) {
  static const char key[] = "\"manifest_xxh64\"";
  const char *end = text + len, *p = text;
  while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
  if (p == end || *p++ != '{') return NULL;
  while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
  if ((size_t)(end - p) < sizeof key - 1 || memcmp(p, key, sizeof key - 1)) return NULL;
  p += sizeof key - 1;
  while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
  if (p == end || *p++ != ':') return NULL;
  while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
  if (end - p < 18 || *p != '"' || p[17] != '"') return NULL;
  return p + 1;
}

/* xxh64 of text with the 16 digits at `digits` read as '0' (DS_CACHE_MANIFEST_HASH). */
static uint64_t self_hash(const char *text, size_t len, const char *digits) {
  static const char zeros[16] = "0000000000000000";
  XXH64_state_t *h = XXH64_createState();
  if (!h) return 0;
  size_t at = (size_t)(digits - text);
  XXH64_reset(h, 0);
  XXH64_update(h, text, at);
  XXH64_update(h, zeros, sizeof zeros);
  XXH64_update(h, digits + 16, len - at - 16);
  uint64_t v = XXH64_digest(h);
  XXH64_freeState(h);
  return v;
}

char *ds_cache_manifest_json(const ds_cache_manifest *m) {
  cJSON *j = cJSON_CreateObject();
  if (!j) return NULL;
  cJSON_AddStringToObject(j, "manifest_xxh64", "0000000000000000"); /* filled in last */
  cJSON_AddStringToObject(j, "format", DS_CACHE_FORMAT);
  cJSON_AddNumberToObject(j, "format_version", m->format_version);
  cJSON_AddBoolToObject(j, "complete", m->complete);
  cJSON_AddStringToObject(j, "target_path", m->target_path ? m->target_path : "");
  cJSON_AddStringToObject(j, "target_architecture", m->target_architecture);
  add_hex(j, "target_weights_xxh64", m->target_weights_xxh64);
  cJSON_AddStringToObject(j, "target_weights_hash_covers", DS_CACHE_WEIGHTS_HASH_COVERS);
  if (m->target_weights[0]) cJSON_AddStringToObject(j, "target_weights", m->target_weights);
  add_hex(j, "target_config_xxh64", m->target_config_xxh64);
  add_hex(j, "tokenizer_xxh64", m->tokenizer_xxh64);
  cJSON_AddStringToObject(j, "chat_template", m->chat_template);
  add_hex(j, "chat_template_xxh64", m->chat_template_xxh64);
  cJSON_AddNumberToObject(j, "vocab_size", (double)m->vocab_size);
  cJSON_AddNumberToObject(j, "hidden_size", (double)m->hidden_size);
  cJSON_AddNumberToObject(j, "num_hidden_layers", (double)m->num_hidden_layers);
  cJSON_AddItemToObject(j, "target_layer_ids", cJSON_CreateIntArray(m->target_layer_ids, m->n_layers));
  cJSON_AddStringToObject(j, "dtype", ds_cache_dtype_label(m->dtype));
  cJSON_AddNumberToObject(j, "seq_length", (double)m->seq_length);
  cJSON_AddNumberToObject(j, "eos_token_id", (double)m->eos_token_id);
  cJSON_AddNumberToObject(j, "min_length", (double)m->min_length);
  cJSON_AddNumberToObject(j, "num_samples", (double)m->num_samples);
  cJSON_AddNumberToObject(j, "num_tokens", (double)m->num_tokens);
  cJSON_AddNumberToObject(j, "shard_size", (double)m->shard_size);
  cJSON_AddStringToObject(j, "data_path", m->data_path ? m->data_path : "");
  add_hex(j, "data_xxh64", m->data_xxh64);
  cJSON_AddNumberToObject(j, "seed", (double)m->seed);
  cJSON_AddBoolToObject(j, "features", m->features);
  if (m->kd_topk > 0) {
    cJSON *kd = cJSON_CreateObject();
    cJSON_AddNumberToObject(kd, "topk", (double)m->kd_topk);
    cJSON_AddNumberToObject(kd, "top_p", m->kd_top_p);
    cJSON_AddNumberToObject(kd, "min_k", (double)m->kd_min_k);
    cJSON_AddNumberToObject(kd, "temperature", m->kd_temperature);
    cJSON_AddItemToObject(j, "kd", kd);
  } else {
    cJSON_AddNullToObject(j, "kd");
  }
  if (m->target_weights_file_xxh64) add_hex(j, "target_weights_file_xxh64", m->target_weights_file_xxh64);
  else cJSON_AddNullToObject(j, "target_weights_file_xxh64");
  cJSON *shards = cJSON_AddArrayToObject(j, "shards");
  for (int64_t i = 0; shards && i < m->n_shards; i++) {
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "file", m->shards[i].file);
    cJSON_AddNumberToObject(s, "num_samples", (double)m->shards[i].num_samples);
    add_hex(s, "xxh64", m->shards[i].xxh64);
    cJSON_AddItemToArray(shards, s);
  }
  char *text = cJSON_Print(j);
  cJSON_Delete(j);
  if (!text) return NULL;
  /* One trailing newline, so the file reads well with cat. */
  size_t n = strlen(text);
  char *out = realloc(text, n + 2);
  if (!out) { free(text); return NULL; }
  out[n] = '\n';
  out[n + 1] = 0;
  if (!ds_cache_manifest_seal(out, n + 1)) { free(out); return NULL; }
  return out;
}

int ds_cache_manifest_seal(char *text, size_t len) {
  char *digits = (char *)self_hash_digits(text, len);
  if (!digits) return 0;
  char hex[17];
  ds_cache_hex(self_hash(text, len, digits), hex);
  memcpy(digits, hex, 16);
  return 1;
}

/* ---------------------------------------------------------------- parsing */

static const char *k_fields[] = {
    "manifest_xxh64", "format", "format_version", "complete", "target_path", "target_architecture", "target_weights_xxh64",
    "target_weights_hash_covers", "target_weights", "target_config_xxh64", "tokenizer_xxh64", "chat_template",
    "chat_template_xxh64", "vocab_size", "hidden_size", "num_hidden_layers", "target_layer_ids", "dtype", "seq_length", "eos_token_id",
    "min_length", "num_samples", "num_tokens", "shard_size", "data_path", "data_xxh64", "seed", "features", "kd",
    "target_weights_file_xxh64", "shards"};

static const cJSON *field(const cJSON *o, const char *key, const char *label, ds_status *st) {
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!it) *st = DS_FAIL(DS_ERR_FORMAT, "%s: required field '%s' is missing", label, key);
  return it;
}

static ds_status get_i64(const cJSON *o, const char *key, int64_t lo, int64_t hi, const char *label, int64_t *out) {
  ds_status st = DS_OK;
  const cJSON *it = field(o, key, label, &st);
  if (!it) return st;
  if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble))
    return DS_FAIL(DS_ERR_FORMAT, "%s: field '%s' must be an integer", label, key);
  if (it->valuedouble < (double)lo || it->valuedouble > (double)hi)
    return DS_FAIL(DS_ERR_FORMAT, "%s: field '%s' = %.0f is outside [%lld, %lld]", label, key, it->valuedouble,
                   (long long)lo, (long long)hi);
  *out = (int64_t)it->valuedouble;
  return DS_OK;
}

static ds_status get_f64(const cJSON *o, const char *key, double lo, double hi, const char *label, double *out) {
  ds_status st = DS_OK;
  const cJSON *it = field(o, key, label, &st);
  if (!it) return st;
  if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) || it->valuedouble < lo || it->valuedouble > hi)
    return DS_FAIL(DS_ERR_FORMAT, "%s: field '%s' must be a number in [%g, %g]", label, key, lo, hi);
  *out = it->valuedouble;
  return DS_OK;
}

static ds_status get_str(const cJSON *o, const char *key, const char *label, const char **out) {
  ds_status st = DS_OK;
  const cJSON *it = field(o, key, label, &st);
  if (!it) return st;
  if (!cJSON_IsString(it)) return DS_FAIL(DS_ERR_FORMAT, "%s: field '%s' must be a string", label, key);
  *out = it->valuestring;
  return DS_OK;
}

static ds_status get_bool(const cJSON *o, const char *key, const char *label, int *out) {
  ds_status st = DS_OK;
  const cJSON *it = field(o, key, label, &st);
  if (!it) return st;
  if (!cJSON_IsBool(it)) return DS_FAIL(DS_ERR_FORMAT, "%s: field '%s' must be true or false", label, key);
  *out = cJSON_IsTrue(it);
  return DS_OK;
}

static ds_status parse_hex(const char *s, const char *key, const char *label, uint64_t *out) {
  uint64_t v = 0;
  size_t n = strlen(s);
  if (n != 16) return DS_FAIL(DS_ERR_FORMAT, "%s: field '%s' = \"%s\" is not 16 hex digits", label, key, s);
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return DS_FAIL(DS_ERR_FORMAT, "%s: field '%s' = \"%s\" is not 16 lowercase hex digits", label, key, s);
    v = v << 4 | (uint64_t)d;
  }
  *out = v;
  return DS_OK;
}

static ds_status get_hex(const cJSON *o, const char *key, const char *label, uint64_t *out) {
  const char *s = NULL;
  DS_TRY(get_str(o, key, label, &s));
  return parse_hex(s, key, label, out);
}

static ds_status copy_str(char *dst, size_t cap, const char *src, const char *key, const char *label) {
  if (strlen(src) >= cap) return DS_FAIL(DS_ERR_FORMAT, "%s: field '%s' is longer than %zu bytes", label, key, cap - 1);
  strcpy(dst, src);
  return DS_OK;
}

static ds_status dup_str(char **dst, const char *src) {
  *dst = ds_malloc(strlen(src) + 1, "manifest string");
  if (!*dst) return DS_ERR_NOMEM;
  strcpy(*dst, src);
  return DS_OK;
}

static ds_status parse_layers(const cJSON *root, const char *label, ds_cache_manifest *m) {
  ds_status st = DS_OK;
  const cJSON *ids = field(root, "target_layer_ids", label, &st);
  if (!ids) return st;
  if (!cJSON_IsArray(ids)) return DS_FAIL(DS_ERR_FORMAT, "%s: field 'target_layer_ids' must be a list", label);
  int n = cJSON_GetArraySize(ids);
  if (n < 1 || n > DS_CACHE_MAX_LAYERS)
    return DS_FAIL(DS_ERR_FORMAT, "%s: field 'target_layer_ids' has %d entries (need 1..%d)", label, n,
                   DS_CACHE_MAX_LAYERS);
  const cJSON *it;
  int i = 0;
  cJSON_ArrayForEach(it, ids) {
    if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) || it->valuedouble < -1 ||
        it->valuedouble > (double)m->num_hidden_layers - 2)
      return DS_FAIL(DS_ERR_FORMAT, "%s: target_layer_ids[%d] must be an integer in [-1, %lld]", label, i,
                     (long long)m->num_hidden_layers - 2);
    m->target_layer_ids[i] = (int32_t)it->valuedouble;
    if (i && m->target_layer_ids[i] <= m->target_layer_ids[i - 1])
      return DS_FAIL(DS_ERR_FORMAT, "%s: target_layer_ids must be strictly increasing", label);
    i++;
  }
  m->n_layers = n;
  return DS_OK;
}

static ds_status parse_kd(const cJSON *root, const char *label, ds_cache_manifest *m) {
  ds_status st = DS_OK;
  const cJSON *kd = field(root, "kd", label, &st);
  if (!kd) return st;
  if (cJSON_IsNull(kd)) {
    m->kd_topk = 0;
    m->kd_top_p = 1;
    m->kd_min_k = 1;
    m->kd_temperature = 1;
    return DS_OK;
  }
  if (!cJSON_IsObject(kd)) return DS_FAIL(DS_ERR_FORMAT, "%s: field 'kd' must be an object or null", label);
  char sub[600];
  snprintf(sub, sizeof sub, "%s: kd", label);
  DS_TRY(get_i64(kd, "topk", 1, m->vocab_size, sub, &m->kd_topk));
  DS_TRY(get_f64(kd, "top_p", 1e-300, 1.0, sub, &m->kd_top_p));
  DS_TRY(get_i64(kd, "min_k", 0, m->kd_topk, sub, &m->kd_min_k));
  DS_TRY(get_f64(kd, "temperature", 1e-6, 1e6, sub, &m->kd_temperature));
  return DS_OK;
}

static ds_status parse_shards(const cJSON *root, const char *label, ds_cache_manifest *m) {
  ds_status st = DS_OK;
  const cJSON *shards = field(root, "shards", label, &st);
  if (!shards) return st;
  if (!cJSON_IsArray(shards)) return DS_FAIL(DS_ERR_FORMAT, "%s: field 'shards' must be a list", label);
  int64_t n = cJSON_GetArraySize(shards), total = 0;
  m->shards = ds_calloc((size_t)(n ? n : 1), sizeof *m->shards, "manifest shards");
  if (!m->shards) return DS_ERR_NOMEM;
  const cJSON *it;
  int64_t i = 0;
  cJSON_ArrayForEach(it, shards) {
    char sub[600], want[32];
    snprintf(sub, sizeof sub, "%s: shards[%lld]", label, (long long)i);
    if (!cJSON_IsObject(it)) return DS_FAIL(DS_ERR_FORMAT, "%s must be an object", sub);
    ds_cache_shard_info *s = &m->shards[i];
    const char *file = NULL;
    DS_TRY(get_str(it, "file", sub, &file));
    ds_cache_shard_name(i, want, sizeof want);
    if (strcmp(file, want))
      return DS_FAIL(DS_ERR_FORMAT, "%s: file is \"%s\", expected \"%s\" (shards are numbered in order)", sub, file,
                     want);
    strcpy(s->file, want);
    DS_TRY(get_i64(it, "num_samples", 1, m->shard_size, sub, &s->num_samples));
    DS_TRY(get_hex(it, "xxh64", sub, &s->xxh64));
    if (cJSON_GetArraySize(it) != 3) return DS_FAIL(DS_ERR_FORMAT, "%s has fields other than file, num_samples, xxh64", sub);
    total += s->num_samples;
    i++;
  }
  m->n_shards = n;
  /* Every shard but the last is full; together they hold at most num_samples. */
  for (int64_t k = 0; k + 1 < n; k++)
    if (m->shards[k].num_samples != m->shard_size)
      return DS_FAIL(DS_ERR_FORMAT, "%s: shards[%lld] holds %lld samples; every shard but the last holds shard_size = %lld",
                     label, (long long)k, (long long)m->shards[k].num_samples, (long long)m->shard_size);
  if (total > m->num_samples)
    return DS_FAIL(DS_ERR_FORMAT, "%s: the shards hold %lld samples, more than num_samples = %lld", label,
                   (long long)total, (long long)m->num_samples);
  if (m->complete && total != m->num_samples)
    return DS_FAIL(DS_ERR_FORMAT, "%s: complete, but the shards hold %lld of num_samples = %lld samples", label,
                   (long long)total, (long long)m->num_samples);
  if (n && m->shards[n - 1].num_samples != m->shard_size && total != m->num_samples)
    return DS_FAIL(DS_ERR_FORMAT, "%s: a partial shard (shards[%lld]) that is not the last one of the capture", label,
                   (long long)(n - 1));
  return DS_OK;
}

/* "target_weights": optional (a cache written before it has none: ""), else one of the modes. */
static ds_status parse_target_weights(const cJSON *root, const char *label, ds_cache_manifest *m) {
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, "target_weights");
  m->target_weights[0] = 0;
  if (!it) return DS_OK;
  static const char *const k_modes[] = {"as-stored", "bf16", "f32"};
  for (size_t i = 0; cJSON_IsString(it) && i < sizeof k_modes / sizeof k_modes[0]; i++)
    if (!strcmp(it->valuestring, k_modes[i])) {
      snprintf(m->target_weights, sizeof m->target_weights, "%s", k_modes[i]);
      return DS_OK;
    }
  return DS_FAIL(DS_ERR_FORMAT, "%s: field 'target_weights' must be \"as-stored\", \"bf16\" or \"f32\"", label);
}

static ds_status parse_root(const cJSON *root, const char *label, ds_cache_manifest *m) {
  if (!cJSON_IsObject(root)) return DS_FAIL(DS_ERR_FORMAT, "%s: the manifest must be a JSON object", label);
  const cJSON *it;
  cJSON_ArrayForEach(it, root) {
    size_t k = 0, n = sizeof k_fields / sizeof k_fields[0];
    while (k < n && strcmp(k_fields[k], it->string)) k++;
    if (k == n) return DS_FAIL(DS_ERR_FORMAT, "%s: unknown field '%s'", label, it->string);
  }
  const char *s = NULL;
  int64_t v = 0;
  DS_TRY(get_str(root, "format", label, &s));
  if (strcmp(s, DS_CACHE_FORMAT))
    return DS_FAIL(DS_ERR_FORMAT, "%s: field 'format' is \"%s\", expected \"%s\"", label, s, DS_CACHE_FORMAT);
  DS_TRY(get_i64(root, "format_version", 0, INT32_MAX, label, &v));
  if (v != DS_CACHE_FORMAT_VERSION)
    return DS_FAIL(DS_ERR_UNSUPPORTED, "%s: field 'format_version' is %lld; this build reads version %d (recapture)",
                   label, (long long)v, DS_CACHE_FORMAT_VERSION);
  DS_TRY(get_hex(root, "manifest_xxh64", label, &m->manifest_xxh64));
  m->format_version = (int)v;
  DS_TRY(get_bool(root, "complete", label, &m->complete));
  DS_TRY(get_str(root, "target_path", label, &s));
  DS_TRY(dup_str(&m->target_path, s));
  DS_TRY(get_str(root, "target_architecture", label, &s));
  DS_TRY(copy_str(m->target_architecture, sizeof m->target_architecture, s, "target_architecture", label));
  DS_TRY(get_hex(root, "target_weights_xxh64", label, &m->target_weights_xxh64));
  DS_TRY(get_str(root, "target_weights_hash_covers", label, &s));
  DS_TRY(parse_target_weights(root, label, m));
  DS_TRY(get_hex(root, "target_config_xxh64", label, &m->target_config_xxh64));
  DS_TRY(get_hex(root, "tokenizer_xxh64", label, &m->tokenizer_xxh64));
  DS_TRY(get_str(root, "chat_template", label, &s));
  DS_TRY(copy_str(m->chat_template, sizeof m->chat_template, s, "chat_template", label));
  DS_TRY(get_hex(root, "chat_template_xxh64", label, &m->chat_template_xxh64));
  DS_TRY(get_i64(root, "vocab_size", 1, INT32_MAX, label, &m->vocab_size));
  DS_TRY(get_i64(root, "hidden_size", 1, 1 << 20, label, &m->hidden_size));
  DS_TRY(get_i64(root, "num_hidden_layers", 1, 1 << 16, label, &m->num_hidden_layers));
  DS_TRY(parse_layers(root, label, m));
  DS_TRY(get_str(root, "dtype", label, &s));
  if (!ds_cache_dtype_from_label(s, &m->dtype))
    return DS_FAIL(DS_ERR_FORMAT, "%s: field 'dtype' is \"%s\" (expected bf16, f16, f32 or int8)", label, s);
  DS_TRY(get_i64(root, "seq_length", 2, 1 << 24, label, &m->seq_length));
  DS_TRY(get_i64(root, "eos_token_id", -1, m->vocab_size - 1, label, &m->eos_token_id));
  DS_TRY(get_i64(root, "min_length", 2, m->seq_length, label, &m->min_length));
  DS_TRY(get_i64(root, "num_samples", 1, INT64_C(1) << 40, label, &m->num_samples));
  DS_TRY(get_i64(root, "num_tokens", 0, m->num_samples * m->seq_length, label, &m->num_tokens));
  DS_TRY(get_i64(root, "shard_size", 1, INT64_C(1) << 30, label, &m->shard_size));
  DS_TRY(get_str(root, "data_path", label, &s));
  DS_TRY(dup_str(&m->data_path, s));
  DS_TRY(get_hex(root, "data_xxh64", label, &m->data_xxh64));
  DS_TRY(get_i64(root, "seed", 0, INT64_C(1) << 53, label, &v));
  m->seed = (uint64_t)v;
  DS_TRY(get_bool(root, "features", label, &m->features));
  DS_TRY(parse_kd(root, label, m));
  if (!m->features && !m->kd_topk)
    return DS_FAIL(DS_ERR_FORMAT, "%s: neither features nor kd: the cache holds no supervision", label);
  ds_status st = DS_OK;
  const cJSON *wf = field(root, "target_weights_file_xxh64", label, &st);
  if (!wf) return st;
  m->target_weights_file_xxh64 = 0;
  if (!cJSON_IsNull(wf)) DS_TRY(get_hex(root, "target_weights_file_xxh64", label, &m->target_weights_file_xxh64));
  if (m->complete && !m->target_weights_file_xxh64)
    return DS_FAIL(DS_ERR_FORMAT, "%s: complete, but target_weights_file_xxh64 is null", label);
  return parse_shards(root, label, m);
}

/* The manifest's own checksum, verified after every field is known to be valid (so a damaged
 * field is still named by its own message). */
static ds_status check_self_hash(const cJSON *root, const char *json, size_t len, const char *label, uint64_t want) {
  const char *digits = self_hash_digits(json, len);
  if (!root->child || strcmp(root->child->string, "manifest_xxh64") || !digits)
    return DS_FAIL(DS_ERR_FORMAT, "%s: field 'manifest_xxh64' must be the object's first field, written as "
                   "\"manifest_xxh64\": \"<16 hex digits>\" (the manifest was rewritten by another program)", label);
  uint64_t have = self_hash(json, len, digits);
  if (have == want) return DS_OK;
  char a[17], b[17];
  ds_cache_hex(have, a);
  ds_cache_hex(want, b);
  return DS_FAIL(DS_ERR_FORMAT, "%s: checksum mismatch: the manifest's bytes hash to %s but its field 'manifest_xxh64' "
                 "is %s: the manifest was edited or damaged after `dspark capture` wrote it (%s); recapture into "
                 "a new directory", label, a, b, DS_CACHE_MANIFEST_HASH);
}

ds_status ds_cache_manifest_parse(const char *json, size_t len, const char *label, ds_cache_manifest *out) {
  memset(out, 0, sizeof *out);
  ds_status st;
  cJSON *root = ds_json_parse(json, len, label, &st);
  if (!root) return st;
  st = parse_root(root, label, out);
  if (st == DS_OK) st = check_self_hash(root, json, len, label, out->manifest_xxh64);
  cJSON_Delete(root);
  if (st != DS_OK) ds_cache_manifest_free(out);
  return st;
}

/* ---------------------------------------------------------------- checks */

void ds_cache_expect_any(ds_cache_expect *e) {
  memset(e, 0, sizeof *e);
  e->seq_length = -1;
  e->n_layers = -1;
  e->dtype = -1;
  e->vocab_size = e->hidden_size = e->num_hidden_layers = -1;
}

static void layers_text(const int32_t *ids, int n, char *buf, size_t cap) {
  size_t at = 0;
  buf[0] = 0;
  at += (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < n && at < cap; i++) at += (size_t)snprintf(buf + at, cap - at, "%s%d", i ? "," : "", ids[i]);
  if (at < cap) snprintf(buf + at, cap - at, "]");
}

#define MISMATCH_I(name, have, want)                                                                             \
  DS_FAIL(DS_ERR_ARG, "%s: field '%s' is %lld in the cache but %lld in this run", label, name, (long long)(have), \
          (long long)(want))

static ds_status check_hash(const char *label, const char *name, uint64_t have, uint64_t want, const char *hint) {
  if (have == want) return DS_OK;
  char a[17], b[17];
  ds_cache_hex(have, a);
  ds_cache_hex(want, b);
  return DS_FAIL(DS_ERR_ARG, "%s: field '%s' is %s in the cache but %s in this run (%s)", label, name, a, b, hint);
}

ds_status ds_cache_manifest_check(const ds_cache_manifest *m, const ds_cache_expect *e, const char *label) {
  if (!m->complete && !e->allow_incomplete) {
    int64_t have = 0;
    for (int64_t i = 0; i < m->n_shards; i++) have += m->shards[i].num_samples;
    return DS_FAIL(DS_ERR_ARG,
                   "%s: field 'complete' is false: the capture was interrupted after %lld of %lld samples; rerun the "
                   "same `dspark capture` command to finish it",
                   label, (long long)have, (long long)m->num_samples);
  }
  if (e->seq_length >= 0 && e->seq_length != m->seq_length) return MISMATCH_I("seq_length", m->seq_length, e->seq_length);
  if (e->vocab_size >= 0 && e->vocab_size != m->vocab_size) return MISMATCH_I("vocab_size", m->vocab_size, e->vocab_size);
  if (e->hidden_size >= 0 && e->hidden_size != m->hidden_size)
    return MISMATCH_I("hidden_size", m->hidden_size, e->hidden_size);
  if (e->num_hidden_layers >= 0 && e->num_hidden_layers != m->num_hidden_layers)
    return MISMATCH_I("num_hidden_layers", m->num_hidden_layers, e->num_hidden_layers);
  if (e->n_layers >= 0 &&
      (e->n_layers != m->n_layers || memcmp(e->layer_ids, m->target_layer_ids, sizeof(int32_t) * (size_t)m->n_layers))) {
    char a[512], b[512];
    layers_text(m->target_layer_ids, m->n_layers, a, sizeof a);
    layers_text(e->layer_ids, e->n_layers, b, sizeof b);
    return DS_FAIL(DS_ERR_ARG, "%s: field 'target_layer_ids' is %s in the cache but %s in this run", label, a, b);
  }
  if (e->dtype >= 0 && (ds_dtype)e->dtype != m->dtype)
    return DS_FAIL(DS_ERR_ARG, "%s: field 'dtype' is %s in the cache but %s in this run", label,
                   ds_cache_dtype_label(m->dtype), ds_cache_dtype_label((ds_dtype)e->dtype));
  if (e->check_weights)
    DS_TRY(check_hash(label, "target_weights_xxh64", m->target_weights_xxh64, e->target_weights_xxh64,
                      "the target's weights differ from the captured ones"));
  if (e->check_config)
    DS_TRY(check_hash(label, "target_config_xxh64", m->target_config_xxh64, e->target_config_xxh64,
                      "the target's config.json differs"));
  if (e->check_tokenizer)
    DS_TRY(check_hash(label, "tokenizer_xxh64", m->tokenizer_xxh64, e->tokenizer_xxh64,
                      "the target's tokenizer.json differs"));
  if (e->check_data)
    DS_TRY(check_hash(label, "data_xxh64", m->data_xxh64, e->data_xxh64, "the data file differs"));
  if (e->need_features && !m->features)
    return DS_FAIL(DS_ERR_ARG, "%s: field 'features' is false in the cache (captured with --no-features) but this run "
                   "needs the DSpark features", label);
  if (e->need_kd && !m->kd_topk)
    return DS_FAIL(DS_ERR_ARG, "%s: field 'kd' is null in the cache (captured without --topk) but this run needs the "
                   "KD top-K log-probs", label);
  return DS_OK;
}

ds_status ds_cache_manifest_same_capture(const ds_cache_manifest *have, const ds_cache_manifest *want,
                                         const char *label) {
#define SAME_S(f)                                                                                                 \
  if (strcmp(have->f, want->f))                                                                                   \
    return DS_FAIL(DS_ERR_ARG, "%s: field '" #f "' is \"%s\" in the cache but \"%s\" in this run", label, have->f, \
                   want->f);
#define SAME_I(f) \
  if (have->f != want->f) return MISMATCH_I(#f, have->f, want->f);
#define SAME_H(f) DS_TRY(check_hash(label, #f, have->f, want->f, "a different capture"));
#define SAME_F(f)                                                                                                  \
  if (have->f != want->f)                                                                                          \
    return DS_FAIL(DS_ERR_ARG, "%s: field 'kd.%s' is %.17g in the cache but %.17g in this run", label, #f, have->f, \
                   want->f);
  SAME_I(format_version)
  SAME_S(target_path)
  SAME_S(target_architecture)
  SAME_H(target_weights_xxh64)
  if (strcmp(have->target_weights, want->target_weights))
    return DS_FAIL(DS_ERR_ARG, "%s: field 'target_weights' is %s%s%s in the cache but \"%s\" in this run (how the "
                   "target held its weights: --weights)", label, have->target_weights[0] ? "\"" : "",
                   have->target_weights[0] ? have->target_weights
                                           : "absent (an older capture, which held a GGUF's weights in fp32 and a "
                                             "directory's 16-bit matrices in place)",
                   have->target_weights[0] ? "\"" : "", want->target_weights);
  SAME_H(target_config_xxh64)
  SAME_H(tokenizer_xxh64)
  SAME_S(chat_template)
  SAME_H(chat_template_xxh64)
  SAME_I(vocab_size)
  SAME_I(hidden_size)
  SAME_I(num_hidden_layers)
  ds_cache_expect e;
  ds_cache_expect_any(&e);
  e.allow_incomplete = 1;
  e.n_layers = want->n_layers;
  memcpy(e.layer_ids, want->target_layer_ids, sizeof e.layer_ids);
  e.dtype = (int)want->dtype;
  DS_TRY(ds_cache_manifest_check(have, &e, label));
  SAME_I(seq_length)
  SAME_I(eos_token_id)
  SAME_I(min_length)
  SAME_I(num_samples)
  SAME_I(num_tokens)
  SAME_I(shard_size)
  SAME_S(data_path)
  SAME_H(data_xxh64)
  SAME_I(seed)
  SAME_I(features)
  SAME_I(kd_topk)
  SAME_F(kd_top_p)
  SAME_I(kd_min_k)
  SAME_F(kd_temperature)
#undef SAME_S
#undef SAME_I
#undef SAME_H
#undef SAME_F
  return DS_OK;
}
