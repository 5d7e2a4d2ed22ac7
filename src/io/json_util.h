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

#endif
