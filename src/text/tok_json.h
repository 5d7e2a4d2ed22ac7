/* Helpers shared by the tokenizer.json loader files (tok_load*.c, tok_json.c): a loader
 * context and typed field getters whose failures name the file and the JSON field. */
#ifndef DSPARK_TEXT_TOK_JSON_H
#define DSPARK_TEXT_TOK_JSON_H

#include <cjson/cJSON.h>

#include "text/tok_internal.h"

typedef struct {
  ds_tokenizer *tok;
  const char *label;
  const cJSON *vocab;   /* model.vocab */
  tk_strmap specials;   /* contents of special added tokens */
} tk_loader;

/* Records "LABEL: PATH: message" and returns st. */
ds_status tk_fail(const tk_loader *L, ds_status st, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A printable excerpt of s for messages (about 40 bytes, control bytes escaped) in buf. */
const char *tk_show(const char *s, char buf[200]);
const char *tk_type_name(const cJSON *v); /* "a string", "null", "missing", ... */
int tk_is_null(const cJSON *v);           /* absent or null */
/* Optional boolean (absent or null: def) / required boolean, named key of obj at path. */
ds_status tk_get_bool(const tk_loader *L, const cJSON *obj, const char *key, int def, int *out, const char *path);
ds_status tk_need_bool(const tk_loader *L, const cJSON *obj, const char *key, int *out, const char *path);
/* A token id: an integer in [0, 2^31 - 1). */
ds_status tk_get_id(const tk_loader *L, const cJSON *v, int32_t *out, const char *path);
ds_status tk_check_utf8(const tk_loader *L, const char *s, const char *path);
/* The "type" string of an object; NULL with *st set when obj is not an object with one. */
const char *tk_type_of(const tk_loader *L, const cJSON *obj, const char *path, ds_status *st);

/* The pipeline sections (tok_load_pipeline.c); depth bounds nested Sequences. */
ds_status tk_load_normalizer(tk_loader *L, const cJSON *n, const char *path, int depth);
ds_status tk_load_pretok(tk_loader *L, const cJSON *p, const char *path, int depth);
ds_status tk_load_post(tk_loader *L, const cJSON *p, const char *path, int depth);
ds_status tk_load_decoder(tk_loader *L, const cJSON *d, const char *path, int depth);

#endif
