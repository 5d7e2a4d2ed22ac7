/* Strict JSON parsing shared by every reader (config.json, tokenizer.json, safetensors
 * headers, manifests): the whole buffer must be one JSON value plus optional whitespace,
 * and a failure names the file and the line and column where parsing stopped. */
#ifndef DSPARK_IO_JSON_UTIL_H
#define DSPARK_IO_JSON_UTIL_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "dspark/common.h"

/* Parses buf[0..len) (no NUL terminator needed). On failure returns NULL with an error
 * recorded ("LABEL: malformed JSON at line L, column C") and *st set. Free with cJSON_Delete. */
cJSON *ds_json_parse(const char *buf, size_t len, const char *label, ds_status *st);

/* Field readers. Absent or null: *out = dflt, or an error when required. A wrong type or a
 * value outside [lo, hi] (integers: also a fraction) is an error naming label and key. */
ds_status ds_json_int(const cJSON *obj, const char *key, int required, int64_t dflt, int64_t lo, int64_t hi,
                      const char *label, int64_t *out);
ds_status ds_json_num(const cJSON *obj, const char *key, int required, double dflt, const char *label, double *out);
/* ds_json_num whose value must also be > 0 (a scale, an epsilon, a base): the error names label,
 * key and the value. The default is not checked. */
ds_status ds_json_positive(const cJSON *obj, const char *key, int required, double dflt, const char *label,
                           double *out);
ds_status ds_json_bool(const cJSON *obj, const char *key, int required, int dflt, const char *label, int *out);

#endif
