/* Private pieces shared by the safetensors reader (safetensors_read.c), the HF checkpoint
 * directory (safetensors_dir.c) and the writer (safetensors_write.c); defined in
 * safetensors_util.c. */
#ifndef DSPARK_IO_SAFETENSORS_INTERNAL_H
#define DSPARK_IO_SAFETENSORS_INTERNAL_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "dspark/safetensors.h"

/* The Rust crate's MAX_HEADER_SIZE: a larger prefix means a corrupt or hostile file. */
#define ST_MAX_HEADER ((uint64_t)100000000)
/* Largest integer a JSON number (parsed as double by cJSON) represents exactly. */
#define ST_MAX_JSON_INT ((double)(UINT64_C(1) << 53))
#define ST_META_KEY "__metadata__"

typedef struct {
  char *key, *value;
} st_meta;

uint64_t st_read_le64(const unsigned char *p);
char *st_dup_str(const char *s, const char *what);
/* Strict UTF-8 (no overlongs, no surrogates, <= U+10FFFF), as Rust's str::from_utf8.
 * Returns the offset of the first bad byte, or len if all valid. */
size_t st_utf8_invalid_at(const unsigned char *s, size_t len);
void st_format_shape(char *buf, size_t cap, int ndim, const int64_t *shape);
/* Reads a JSON number that must be an exact integer in [0, 2^53]. Returns 1 on success;
 * on failure *val holds the number (or NAN when it is not a number) for the message. */
int st_json_index(const cJSON *j, uint64_t *out, double *val);
/* xxh64 of the metadata entries (sorted by key) other than skip_key: key, NUL, value, NUL. */
uint64_t st_metadata_hash(const st_meta *meta, size_t n, const char *skip_key);
/* qsort comparators: views by name, C strings, metadata entries by key. */
int st_cmp_view_name(const void *a, const void *b);
int st_cmp_cstr(const void *a, const void *b);
int st_cmp_meta_key(const void *a, const void *b);
/* An image's memory (ds_st_writer_image): an anonymous mapping of its own, so that a tensor's
 * pages can be given back when it has been read (ds_ckpt_read_once); freed by ds_st_image_free.
 * NULL (error recorded, naming label) when out of memory. */
unsigned char *st_image_alloc(size_t size, const char *label);
/* Binary search in views sorted by name; NULL when absent. */
const ds_tensor_view *st_find_in_sorted(const ds_tensor_view *const *by_name, size_t n, const char *name);

#endif
