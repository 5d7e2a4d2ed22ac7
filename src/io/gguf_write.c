/* GGUF writing (include/dspark/gguf_write.h): key-values serialized as they are set, tensor
 * infos laid out at write time, the file streamed through an atomic temp file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/fileio.h"
#include "dspark/gguf_write.h"

enum { GGUF_MAGIC = 0x46554747u, GGUF_VERSION = 3, GGUF_ALIGNMENT = 32, GGML_MAX_NAME = 64 };

typedef struct {
  char *key;
  unsigned char *bytes; /* the whole entry: key string, value type, value */
  size_t len;
} wkv;

typedef struct {
  char *name;
  uint32_t type;
  int ndim;
  int64_t ne[4];
  void *data;
  size_t nbytes;
  int own;
} wtensor;

struct ds_gguf_writer {
  wkv *kvs;
  size_t n_kvs, cap_kvs;
  wtensor *tensors;
  size_t n_tensors, cap_tensors;
};

/* ---------------------------------------------------------------- a growable byte buffer */

typedef struct {
  unsigned char *p;
  size_t len, cap;
  int failed;
} buf;

static void put(buf *b, const void *src, size_t n) {
  if (b->failed) return;
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + n) cap *= 2;
    unsigned char *p = realloc(b->p, cap);
    if (!p) {
      b->failed = 1;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, src, n);
  b->len += n;
}
static void put_u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(buf *b, const char *s, size_t n) {
  put_u64(b, n);
  put(b, s, n);
}

/* ---------------------------------------------------------------- key-values */

ds_gguf_writer *ds_gguf_writer_new(void) { return calloc(1, sizeof(ds_gguf_writer)); }

void ds_gguf_writer_free(ds_gguf_writer *w) {
  if (!w) return;
  for (size_t i = 0; i < w->n_kvs; i++) {
    free(w->kvs[i].key);
    free(w->kvs[i].bytes);
  }
  for (size_t i = 0; i < w->n_tensors; i++) {
    free(w->tensors[i].name);
    if (w->tensors[i].own) free(w->tensors[i].data);
  }
  free(w->kvs);
  free(w->tensors);
  free(w);
}

size_t ds_gguf_writer_kv_count(const ds_gguf_writer *w) { return w->n_kvs; }
size_t ds_gguf_writer_tensor_count(const ds_gguf_writer *w) { return w->n_tensors; }

static size_t vsize(ds_gguf_vtype t) {
  switch (t) {
    case DS_GGUF_U8: case DS_GGUF_I8: case DS_GGUF_BOOL: return 1;
    case DS_GGUF_U16: case DS_GGUF_I16: return 2;
    case DS_GGUF_U32: case DS_GGUF_I32: case DS_GGUF_F32: return 4;
    case DS_GGUF_U64: case DS_GGUF_I64: case DS_GGUF_F64: return 8;
    default: return 0;
  }
}

/* Stores the entry b (key, type, value) under key: in place when the key exists. Takes b. */
static ds_status store(ds_gguf_writer *w, const char *key, buf *b) {
  if (b->failed) {
    free(b->p);
    return DS_FAIL(DS_ERR_NOMEM, "GGUF key '%s': out of memory", key);
  }
  for (size_t i = 0; i < w->n_kvs; i++)
    if (!strcmp(w->kvs[i].key, key)) {
      free(w->kvs[i].bytes);
      w->kvs[i].bytes = b->p;
      w->kvs[i].len = b->len;
      return DS_OK;
    }
  if (w->n_kvs == w->cap_kvs) {
    size_t cap = w->cap_kvs ? 2 * w->cap_kvs : 32;
    wkv *p = realloc(w->kvs, cap * sizeof *p);
    if (!p) {
      free(b->p);
      return DS_FAIL(DS_ERR_NOMEM, "GGUF key '%s': out of memory", key);
    }
    w->kvs = p;
    w->cap_kvs = cap;
  }
  char *k = strdup(key);
  if (!k) {
    free(b->p);
    return DS_FAIL(DS_ERR_NOMEM, "GGUF key '%s': out of memory", key);
  }
  w->kvs[w->n_kvs++] = (wkv){k, b->p, b->len};
  return DS_OK;
}

/* A new entry's key and type; refuses an empty key. */
static ds_status begin(const char *key, ds_gguf_vtype type, buf *b) {
  if (!key || !key[0]) return DS_FAIL(DS_ERR_ARG, "GGUF writer: a key is empty");
  put_str(b, key, strlen(key));
  put_u32(b, (uint32_t)type);
  return DS_OK;
}

static ds_status set_scalar(ds_gguf_writer *w, const char *key, ds_gguf_vtype type, const void *v) {
  buf b = {0};
  DS_TRY(begin(key, type, &b));
  put(&b, v, vsize(type));
  return store(w, key, &b);
}

ds_status ds_gguf_set_u32(ds_gguf_writer *w, const char *key, uint32_t v) { return set_scalar(w, key, DS_GGUF_U32, &v); }
ds_status ds_gguf_set_i32(ds_gguf_writer *w, const char *key, int32_t v) { return set_scalar(w, key, DS_GGUF_I32, &v); }
ds_status ds_gguf_set_f32(ds_gguf_writer *w, const char *key, float v) { return set_scalar(w, key, DS_GGUF_F32, &v); }
ds_status ds_gguf_set_bool(ds_gguf_writer *w, const char *key, int v) {
  unsigned char c = v ? 1 : 0;
  return set_scalar(w, key, DS_GGUF_BOOL, &c);
}

ds_status ds_gguf_set_str(ds_gguf_writer *w, const char *key, const char *s, size_t len) {
  buf b = {0};
  DS_TRY(begin(key, DS_GGUF_STRING, &b));
  put_str(&b, s, len);
  return store(w, key, &b);
}

ds_status ds_gguf_set_array(ds_gguf_writer *w, const char *key, ds_gguf_vtype elem_type, uint64_t count,
                            const void *data) {
  size_t es = vsize(elem_type);
  if (!es) return DS_FAIL(DS_ERR_ARG, "GGUF key '%s': arrays of %s are not numeric", key, ds_gguf_vtype_name(elem_type));
  buf b = {0};
  DS_TRY(begin(key, DS_GGUF_ARRAY, &b));
  put_u32(&b, (uint32_t)elem_type);
  put_u64(&b, count);
  put(&b, data, (size_t)count * es);
  return store(w, key, &b);
}

ds_status ds_gguf_set_str_array(ds_gguf_writer *w, const char *key, uint64_t count, const char *const *strs) {
  buf b = {0};
  DS_TRY(begin(key, DS_GGUF_ARRAY, &b));
  put_u32(&b, (uint32_t)DS_GGUF_STRING);
  put_u64(&b, count);
  for (uint64_t i = 0; i < count; i++) put_str(&b, strs[i], strlen(strs[i]));
  return store(w, key, &b);
}

ds_status ds_gguf_copy_kv(ds_gguf_writer *w, const ds_gguf_kv *kv) {
  buf b = {0};
  DS_TRY(begin(kv->key, kv->type, &b));
  if (kv->type == DS_GGUF_ARRAY) {
    put_u32(&b, (uint32_t)kv->elem_type);
    put_u64(&b, kv->count);
  }
  if (kv->elem_type == DS_GGUF_STRING)
    for (uint64_t i = 0; i < kv->count; i++) put_str(&b, kv->strs[i].p, (size_t)kv->strs[i].len);
  else
    put(&b, kv->data, (size_t)kv->count * vsize(kv->elem_type));
  return store(w, kv->key, &b);
}

/* ---------------------------------------------------------------- tensors */

static ds_status check_tensor(const ds_gguf_writer *w, const char *name, uint32_t type, int ndim, const int64_t *ne,
                              size_t *nbytes) {
  if (!name || !name[0] || strlen(name) >= GGML_MAX_NAME)
    return DS_FAIL(DS_ERR_ARG, "GGUF writer: tensor name '%s' is empty or longer than %d bytes", name ? name : "",
                   GGML_MAX_NAME - 1);
  for (size_t i = 0; i < w->n_tensors; i++)
    if (!strcmp(w->tensors[i].name, name)) return DS_FAIL(DS_ERR_ARG, "GGUF writer: tensor '%s' added twice", name);
  const char *tn = ds_ggml_type_name(type);
  int64_t be;
  size_t bb;
  ds_ggml_type_block(type, &be, &bb);
  if (!tn || !bb) return DS_FAIL(DS_ERR_ARG, "GGUF writer: tensor '%s': unknown ggml type %u", name, type);
  if (ndim < 1 || ndim > 4) return DS_FAIL(DS_ERR_ARG, "GGUF writer: tensor '%s' has %d dimensions (1..4)", name, ndim);
  int64_t numel = 1;
  for (int d = 0; d < ndim; d++) {
    if (ne[d] < 1 || ne[d] > INT64_MAX / numel)
      return DS_FAIL(DS_ERR_ARG, "GGUF writer: tensor '%s': dimension %d is %lld", name, d, (long long)ne[d]);
    numel *= ne[d];
  }
  if (ne[0] % be)
    return DS_FAIL(DS_ERR_ARG, "GGUF writer: tensor '%s': a row of %lld values is not a whole number of %s blocks",
                   name, (long long)ne[0], tn);
  *nbytes = (size_t)(numel / be) * bb;
  return DS_OK;
}

ds_status ds_gguf_add_tensor(ds_gguf_writer *w, const char *name, uint32_t type, int ndim, const int64_t *ne,
                             void *data, int own) {
  size_t nbytes = 0;
  ds_status st = check_tensor(w, name, type, ndim, ne, &nbytes);
  if (st == DS_OK && w->n_tensors == w->cap_tensors) {
    size_t cap = w->cap_tensors ? 2 * w->cap_tensors : 32;
    wtensor *p = realloc(w->tensors, cap * sizeof *p);
    if (!p) st = DS_FAIL(DS_ERR_NOMEM, "GGUF tensor '%s': out of memory", name);
    else w->tensors = p, w->cap_tensors = cap;
  }
  char *n = st == DS_OK ? strdup(name) : NULL;
  if (st == DS_OK && !n) st = DS_FAIL(DS_ERR_NOMEM, "GGUF tensor '%s': out of memory", name);
  if (st != DS_OK) {
    if (own) free(data);
    return st;
  }
  wtensor *t = &w->tensors[w->n_tensors++];
  *t = (wtensor){.name = n, .type = type, .ndim = ndim, .ne = {1, 1, 1, 1}, .data = data, .nbytes = nbytes, .own = own};
  for (int d = 0; d < ndim; d++) t->ne[d] = ne[d];
  return DS_OK;
}

/* ---------------------------------------------------------------- the file */

static size_t pad_to(size_t x) { return (x + GGUF_ALIGNMENT - 1) / GGUF_ALIGNMENT * GGUF_ALIGNMENT; }

ds_status ds_gguf_writer_write(const ds_gguf_writer *w, const char *path) {
  buf h = {0};
  put_u32(&h, GGUF_MAGIC);
  put_u32(&h, GGUF_VERSION);
  put_u64(&h, w->n_tensors);
  put_u64(&h, w->n_kvs);
  for (size_t i = 0; i < w->n_kvs; i++) put(&h, w->kvs[i].bytes, w->kvs[i].len);
  size_t offset = 0;
  for (size_t i = 0; i < w->n_tensors; i++) {
    const wtensor *t = &w->tensors[i];
    put_str(&h, t->name, strlen(t->name));
    put_u32(&h, (uint32_t)t->ndim);
    for (int d = 0; d < t->ndim; d++) put_u64(&h, (uint64_t)t->ne[d]);
    put_u32(&h, t->type);
    put_u64(&h, offset);
    offset = pad_to(offset + t->nbytes);
  }
  static const unsigned char zeros[GGUF_ALIGNMENT];
  put(&h, zeros, pad_to(h.len) - h.len);
  if (h.failed) {
    free(h.p);
    return DS_FAIL(DS_ERR_NOMEM, "%s: GGUF header: out of memory", path);
  }
  ds_atomic_file f;
  ds_status st = ds_atomic_open(&f, path);
  if (st != DS_OK) {
    free(h.p);
    return st;
  }
  st = ds_atomic_write(&f, h.p, h.len);
  free(h.p);
  for (size_t i = 0; st == DS_OK && i < w->n_tensors; i++) {
    const wtensor *t = &w->tensors[i];
    st = ds_atomic_write(&f, t->data, t->nbytes);
    if (st == DS_OK) st = ds_atomic_write(&f, zeros, pad_to(t->nbytes) - t->nbytes);
  }
  if (st != DS_OK) {
    ds_atomic_abort(&f);
    return st;
  }
  return ds_atomic_commit(&f);
}
