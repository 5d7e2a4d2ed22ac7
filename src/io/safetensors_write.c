/* safetensors writing: tensors and metadata collected, then written atomically (temp file,
 * fsync, rename) with the header sorted as the Rust crate writes it
 * (include/dspark/safetensors.h). */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "core/json_util.h"
#include "dspark/dtype.h"
#include "dspark/fileio.h"
#include "dspark/safetensors.h"
#include "io/safetensors_internal.h"

/* ---------------------------------------------------------------- writer */

typedef struct {
  char *name;
  ds_dtype dtype;
  int ndim;
  int64_t shape[DS_MAX_DIMS];
  const void *data;
  uint64_t nbytes;
  int reserved; /* added without data: filled in place in an image (ds_st_writer_image) */
} wr_tensor;

struct ds_st_writer {
  wr_tensor *t;
  size_t n, cap;
  st_meta *meta;
  size_t n_meta, meta_cap;
};

ds_st_writer *ds_st_writer_new(void) { return ds_calloc(1, sizeof(ds_st_writer), "safetensors writer"); }

void ds_st_writer_free(ds_st_writer *w) {
  if (!w) return;
  for (size_t i = 0; i < w->n; i++) free(w->t[i].name);
  for (size_t i = 0; i < w->n_meta; i++) {
    free(w->meta[i].key);
    free(w->meta[i].value);
  }
  free(w->t);
  free(w->meta);
  free(w);
}

static int valid_text(const char *s) {
  size_t n = strlen(s);
  return st_utf8_invalid_at((const unsigned char *)s, n) == n;
}

static ds_status writer_add(ds_st_writer *w, const char *name, ds_dtype dtype, int ndim, const int64_t *shape,
                            const void *data, int reserve) {
  if (!w || !name) return DS_FAIL(DS_ERR_ARG, "ds_st_writer_add: writer or name is NULL");
  if (!name[0] || strcmp(name, ST_META_KEY) == 0 || !valid_text(name))
    return DS_FAIL(DS_ERR_ARG, "safetensors writer: tensor name '%s' is empty, reserved or not UTF-8", name);
  if ((unsigned)dtype >= DS_DTYPE_COUNT)
    return DS_FAIL(DS_ERR_ARG, "safetensors writer: tensor '%s': invalid dtype %d", name, (int)dtype);
  if (ndim < 0 || ndim > DS_MAX_DIMS || (ndim > 0 && !shape))
    return DS_FAIL(DS_ERR_ARG, "safetensors writer: tensor '%s': ndim %d outside [0, %d]", name, ndim,
                   DS_MAX_DIMS);
  uint64_t numel = 1;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 0)
      return DS_FAIL(DS_ERR_ARG, "safetensors writer: tensor '%s': shape[%d] = %" PRId64 " is negative",
                     name, d, shape[d]);
    if (__builtin_mul_overflow(numel, (uint64_t)shape[d], &numel))
      return DS_FAIL(DS_ERR_ARG, "safetensors writer: tensor '%s': shape overflows 64 bits", name);
  }
  uint64_t nbytes;
  if (numel > (uint64_t)INT64_MAX || __builtin_mul_overflow(numel, (uint64_t)ds_dtype_size(dtype), &nbytes))
    return DS_FAIL(DS_ERR_ARG, "safetensors writer: tensor '%s': byte size overflows 64 bits", name);
  if (nbytes > 0 && !data && !reserve)
    return DS_FAIL(DS_ERR_ARG, "safetensors writer: tensor '%s': data is NULL", name);
  for (size_t i = 0; i < w->n; i++)
    if (strcmp(w->t[i].name, name) == 0)
      return DS_FAIL(DS_ERR_ARG, "safetensors writer: tensor '%s' added twice", name);
  if (w->n == w->cap) {
    size_t cap = w->cap ? 2 * w->cap : 16;
    wr_tensor *t = realloc(w->t, cap * sizeof *t);
    if (!t) return DS_FAIL(DS_ERR_NOMEM, "safetensors writer: cannot grow the tensor table");
    w->t = t;
    w->cap = cap;
  }
  wr_tensor *t = &w->t[w->n];
  memset(t, 0, sizeof *t);
  t->name = st_dup_str(name, "tensor name");
  if (!t->name) return DS_ERR_NOMEM;
  t->dtype = dtype;
  t->ndim = ndim;
  for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
  t->data = data;
  t->nbytes = nbytes;
  t->reserved = reserve;
  w->n++;
  return DS_OK;
}

ds_status ds_st_writer_add(ds_st_writer *w, const char *name, ds_dtype dtype, int ndim,
                           const int64_t *shape, const void *data) {
  return writer_add(w, name, dtype, ndim, shape, data, 0);
}

ds_status ds_st_writer_reserve(ds_st_writer *w, const char *name, ds_dtype dtype, int ndim, const int64_t *shape) {
  return writer_add(w, name, dtype, ndim, shape, NULL, 1);
}

ds_status ds_st_writer_set_metadata(ds_st_writer *w, const char *key, const char *value) {
  if (!w || !key || !value) return DS_FAIL(DS_ERR_ARG, "ds_st_writer_set_metadata: NULL argument");
  if (!valid_text(key) || !valid_text(value))
    return DS_FAIL(DS_ERR_ARG, "safetensors writer: metadata '%s' is not valid UTF-8", key);
  char *v = st_dup_str(value, "metadata value");
  if (!v) return DS_ERR_NOMEM;
  for (size_t i = 0; i < w->n_meta; i++)
    if (strcmp(w->meta[i].key, key) == 0) {
      free(w->meta[i].value);
      w->meta[i].value = v;
      return DS_OK;
    }
  if (w->n_meta == w->meta_cap) {
    size_t cap = w->meta_cap ? 2 * w->meta_cap : 8;
    st_meta *m = realloc(w->meta, cap * sizeof *m);
    if (!m) { free(v); return DS_FAIL(DS_ERR_NOMEM, "safetensors writer: cannot grow the metadata table"); }
    w->meta = m;
    w->meta_cap = cap;
  }
  char *k = st_dup_str(key, "metadata key");
  if (!k) { free(v); return DS_ERR_NOMEM; }
  w->meta[w->n_meta].key = k;
  w->meta[w->n_meta].value = v;
  w->n_meta++;
  return DS_OK;
}

ds_status ds_st_writer_add_checksums(ds_st_writer *w) {
  if (!w) return DS_FAIL(DS_ERR_ARG, "ds_st_writer_add_checksums: writer is NULL");
  cJSON *j = cJSON_CreateObject();
  char hex[17];
  for (size_t i = 0; j && i < w->n; i++) {
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH64(w->t[i].data, (size_t)w->t[i].nbytes, 0));
    if (!cJSON_AddStringToObject(j, w->t[i].name, hex)) { cJSON_Delete(j); j = NULL; }
  }
  char *text = j ? cJSON_PrintUnformatted(j) : NULL;
  cJSON_Delete(j);
  if (!text) return DS_FAIL(DS_ERR_NOMEM, "safetensors writer: out of memory for the checksums");
  ds_status st = ds_st_writer_set_metadata(w, "checksums", text);
  free(text);
  if (st != DS_OK) return st;
  qsort(w->meta, w->n_meta, sizeof *w->meta, st_cmp_meta_key);
  snprintf(hex, sizeof hex, "%016llx", (unsigned long long)st_metadata_hash(w->meta, w->n_meta, "metadata_xxh64"));
  return ds_st_writer_set_metadata(w, "metadata_xxh64", hex);
}

/* A growable byte buffer for the header; `failed` latches the first allocation failure. */
typedef struct {
  char *p;
  size_t len, cap;
  int failed;
} strbuf;

static void sb_put(strbuf *b, const char *s, size_t n) {
  if (b->failed) return;
  if (b->cap - b->len < n + 1) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) { b->failed = 1; return; }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
}

static void sb_puts(strbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_json_string(strbuf *b, const char *s) {
  sb_put(b, "\"", 1);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    char esc[8];
    if (c == '"' || c == '\\') { esc[0] = '\\'; esc[1] = (char)c; sb_put(b, esc, 2); }
    else if (c < 0x20) { snprintf(esc, sizeof esc, "\\u%04x", c); sb_put(b, esc, 6); }
    else sb_put(b, (const char *)&c, 1);
  }
  sb_put(b, "\"", 1);
}

/* The header text (8-byte aligned with spaces) and the data section's size; path names the
 * file in messages. On success out->p is malloc'd. */
static ds_status build_header(const ds_st_writer *w, const char *path, strbuf *out, uint64_t *data_bytes) {
  /* Header: "__metadata__" first, then tensors in insertion order, laid out back to back. */
  strbuf b = {0};
  char num[64];
  sb_puts(&b, "{");
  if (w->n_meta) {
    sb_json_string(&b, ST_META_KEY);
    sb_puts(&b, ":{");
    for (size_t i = 0; i < w->n_meta; i++) {
      if (i) sb_puts(&b, ",");
      sb_json_string(&b, w->meta[i].key);
      sb_puts(&b, ":");
      sb_json_string(&b, w->meta[i].value);
    }
    sb_puts(&b, "}");
  }
  uint64_t off = 0;
  for (size_t i = 0; i < w->n; i++) {
    const wr_tensor *t = &w->t[i];
    if (i || w->n_meta) sb_puts(&b, ",");
    sb_json_string(&b, t->name);
    sb_puts(&b, ":{\"dtype\":");
    sb_json_string(&b, ds_dtype_name(t->dtype));
    sb_puts(&b, ",\"shape\":[");
    for (int d = 0; d < t->ndim; d++) {
      snprintf(num, sizeof num, "%s%" PRId64, d ? "," : "", t->shape[d]);
      sb_puts(&b, num);
    }
    if (__builtin_add_overflow(off, t->nbytes, &off)) {
      free(b.p);
      return DS_FAIL(DS_ERR_ARG, "%s: total tensor size overflows 64 bits at tensor '%s'", path, t->name);
    }
    snprintf(num, sizeof num, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", off - t->nbytes, off);
    sb_puts(&b, num);
  }
  sb_puts(&b, "}");
  /* Pad with spaces (valid JSON whitespace) so the data section starts 8-byte aligned. */
  while (!b.failed && (8 + b.len) % 8 != 0) sb_puts(&b, " ");
  if (b.failed) {
    free(b.p);
    return DS_FAIL(DS_ERR_NOMEM, "%s: cannot allocate the safetensors header", path);
  }
  if ((uint64_t)b.len > ST_MAX_HEADER) {
    free(b.p);
    return DS_FAIL(DS_ERR_ARG, "%s: header of %zu bytes exceeds the %" PRIu64 "-byte safetensors limit",
                   path, b.len, ST_MAX_HEADER);
  }
  *out = b;
  *data_bytes = off;
  return DS_OK;
}

ds_status ds_st_writer_file_size(const ds_st_writer *w, uint64_t *bytes) {
  if (!w || !bytes) return DS_FAIL(DS_ERR_ARG, "ds_st_writer_file_size: writer or output is NULL");
  strbuf b;
  uint64_t data = 0;
  DS_TRY(build_header(w, "(size estimate)", &b, &data));
  free(b.p);
  *bytes = 8 + (uint64_t)b.len + data;
  return DS_OK;
}

ds_status ds_st_writer_image(const ds_st_writer *w, const char *label, unsigned char **image, size_t *size,
                             size_t *offsets) {
  if (!w || !image || !size) return DS_FAIL(DS_ERR_ARG, "ds_st_writer_image: NULL argument");
  *image = NULL;
  *size = 0;
  if (!label) label = "<memory>";
  strbuf b;
  uint64_t data = 0, total;
  DS_TRY(build_header(w, label, &b, &data));
  if (__builtin_add_overflow(8 + (uint64_t)b.len, data, &total) || total > (uint64_t)SIZE_MAX) {
    free(b.p);
    return DS_FAIL(DS_ERR_NOMEM, "%s: an image of %llu + %zu bytes does not fit in memory", label,
                   (unsigned long long)data, b.len + 8);
  }
  unsigned char *p = st_image_alloc((size_t)total, label);
  if (!p) {
    free(b.p);
    return DS_ERR_NOMEM;
  }
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)((uint64_t)b.len >> (8 * i));
  memcpy(p + 8, b.p, b.len);
  size_t at = 8 + b.len;
  for (size_t i = 0; i < w->n; i++) {
    if (offsets) offsets[i] = at;
    if (w->t[i].data && w->t[i].nbytes) memcpy(p + at, w->t[i].data, (size_t)w->t[i].nbytes);
    at += (size_t)w->t[i].nbytes;
  }
  free(b.p);
  *image = p;
  *size = (size_t)total;
  return DS_OK;
}

ds_status ds_st_writer_write(ds_st_writer *w, const char *path) {
  if (!w || !path) return DS_FAIL(DS_ERR_ARG, "ds_st_writer_write: writer or path is NULL");
  for (size_t i = 0; i < w->n; i++)
    if (w->t[i].reserved && w->t[i].nbytes)
      return DS_FAIL(DS_ERR_ARG, "%s: tensor '%s' was reserved without data (for an image): nothing to write", path,
                     w->t[i].name);
  strbuf b;
  uint64_t data = 0;
  DS_TRY(build_header(w, path, &b, &data));
  unsigned char prefix[8];
  for (int i = 0; i < 8; i++) prefix[i] = (unsigned char)((uint64_t)b.len >> (8 * i));
  ds_atomic_file f;
  ds_status status = ds_atomic_open(&f, path);
  if (status != DS_OK) { free(b.p); return status; }
  status = ds_atomic_write(&f, prefix, sizeof prefix);
  if (status == DS_OK) status = ds_atomic_write(&f, b.p, b.len);
  for (size_t i = 0; status == DS_OK && i < w->n; i++)
    if (w->t[i].nbytes) status = ds_atomic_write(&f, w->t[i].data, (size_t)w->t[i].nbytes);
  free(b.p);
  if (status != DS_OK) {
    ds_atomic_abort(&f);
    return status;
  }
  return ds_atomic_commit(&f);
}

ds_status ds_st_writer_write_hf_dir(ds_st_writer *w, const char *out_dir, const char *config_json) {
  DS_TRY(ds_mkdir_p(out_dir));
  char *st_path = ds_path_join(out_dir, "model.safetensors"), *cfg_path = ds_path_join(out_dir, "config.json");
  ds_status st = !st_path || !cfg_path ? DS_FAIL(DS_ERR_NOMEM, "%s: out of memory", out_dir) : DS_OK;
  if (st == DS_OK) st = ds_st_writer_set_metadata(w, "format", "pt");
  if (st == DS_OK) st = ds_st_writer_write(w, st_path);
  if (st == DS_OK) st = ds_write_file_atomic(cfg_path, config_json, strlen(config_json));
  free(st_path);
  free(cfg_path);
  return st;
}
