/* GGUF reading (include/dspark/gguf.h): the header, key-values and tensor infos of a mapped file
 * or a buffer, every length and offset checked against the bytes there before anything is used. */
#define _DEFAULT_SOURCE /* madvise */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "dspark/fileio.h"
#include "dspark/gguf.h"

enum { GGUF_MAGIC = 0x46554747u, GGUF_DEFAULT_ALIGNMENT = 32, GGUF_MAX_DIMS = 4 };

struct ds_gguf {
  char *label;
  ds_mapping map;
  int mapped;
  const unsigned char *base;
  size_t size;
  uint32_t version, alignment;
  uint64_t n_kv, n_tensors;
  ds_gguf_kv *kvs;
  ds_gguf_str *strs; /* every string value, arrays' entries included, one table */
  ds_gguf_tensor *tensors;
  char *names; /* the keys' and tensor names' NUL-terminated copies, one buffer */
  size_t data_start;
};

/* ---------------------------------------------------------------- a cursor over the bytes */

typedef struct {
  const ds_gguf *g;
  size_t at;
} cursor;

static size_t left(const cursor *c) { return c->g->size - c->at; }

static ds_status take(cursor *c, size_t n, const void **p, const char *what, const char *whose) {
  if (n > left(c))
    return DS_FAIL(DS_ERR_FORMAT, "%s: %s%s%s needs %zu bytes at offset %zu, the file has %zu left: truncated or "
                   "corrupt", c->g->label, what, whose ? " of " : "", whose ? whose : "", n, c->at, left(c));
  *p = c->g->base + c->at;
  c->at += n;
  return DS_OK;
}

static uint32_t rd32(const void *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
static uint64_t rd64(const void *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

static ds_status take_u32(cursor *c, uint32_t *v, const char *what, const char *whose) {
  const void *p = NULL;
  DS_TRY(take(c, 4, &p, what, whose));
  *v = rd32(p);
  return DS_OK;
}
static ds_status take_u64(cursor *c, uint64_t *v, const char *what, const char *whose) {
  const void *p = NULL;
  DS_TRY(take(c, 8, &p, what, whose));
  *v = rd64(p);
  return DS_OK;
}
static ds_status take_str(cursor *c, ds_gguf_str *s, const char *what, const char *whose) {
  DS_TRY(take_u64(c, &s->len, what, whose));
  if (s->len > left(c))
    return DS_FAIL(DS_ERR_FORMAT, "%s: %s%s%s claims %llu bytes at offset %zu, the file has %zu left", c->g->label,
                   what, whose ? " of " : "", whose ? whose : "", (unsigned long long)s->len, c->at, left(c));
  const void *p = NULL;
  DS_TRY(take(c, (size_t)s->len, &p, what, whose));
  s->p = p;
  return DS_OK;
}

/* ---------------------------------------------------------------- value types */

static const char *const k_vtype_names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array",
                                            "u64", "i64", "f64"};

const char *ds_gguf_vtype_name(ds_gguf_vtype t) {
  return (unsigned)t < sizeof k_vtype_names / sizeof k_vtype_names[0] ? k_vtype_names[t] : "unknown";
}

static size_t vtype_size(ds_gguf_vtype t) {
  switch (t) {
    case DS_GGUF_U8: case DS_GGUF_I8: case DS_GGUF_BOOL: return 1;
    case DS_GGUF_U16: case DS_GGUF_I16: return 2;
    case DS_GGUF_U32: case DS_GGUF_I32: case DS_GGUF_F32: return 4;
    case DS_GGUF_U64: case DS_GGUF_I64: case DS_GGUF_F64: return 8;
    default: return 0; /* string, array, unknown */
  }
}

/* ---------------------------------------------------------------- parsing */

/* Key-values in two passes over the same bytes: the first counts the strings (to size one
 * table), the second fills it; both run the same checks, so the second cannot fail. */
static ds_status parse_kvs(ds_gguf *g, cursor *c, size_t *n_strs, int fill, size_t *names_at) {
  size_t s_at = 0;
  for (uint64_t i = 0; i < g->n_kv; i++) {
    char where[48];
    snprintf(where, sizeof where, "key-value %llu", (unsigned long long)i);
    ds_gguf_str key;
    DS_TRY(take_str(c, &key, "the key", where));
    if (memchr(key.p, 0, (size_t)key.len) || key.len == 0)
      return DS_FAIL(DS_ERR_FORMAT, "%s: %s: a key is empty or holds a NUL byte", g->label, where);
    char shown[96];
    snprintf(shown, sizeof shown, "key '%.*s'", key.len > 64 ? 64 : (int)key.len, key.p);
    uint32_t type;
    DS_TRY(take_u32(c, &type, "the value type", shown));
    ds_gguf_kv kv = {.type = (ds_gguf_vtype)type, .elem_type = (ds_gguf_vtype)type, .count = 1};
    if (type > DS_GGUF_F64)
      return DS_FAIL(DS_ERR_FORMAT, "%s: %s has value type %u, not a GGUF type (0..12)", g->label, shown, type);
    if (type == DS_GGUF_ARRAY) {
      uint32_t et;
      DS_TRY(take_u32(c, &et, "the array's element type", shown));
      if (et > DS_GGUF_F64)
        return DS_FAIL(DS_ERR_FORMAT, "%s: %s: array of type %u, not a GGUF type (0..12)", g->label, shown, et);
      if (et == DS_GGUF_ARRAY)
        return DS_FAIL(DS_ERR_UNSUPPORTED, "%s: %s is an array of arrays: not supported", g->label, shown);
      kv.elem_type = (ds_gguf_vtype)et;
      DS_TRY(take_u64(c, &kv.count, "the array's length", shown));
    }
    if (kv.elem_type == DS_GGUF_STRING) {
      /* each string takes at least its 8-byte length: a count past that cannot be there */
      if (kv.count > left(c) / 8)
        return DS_FAIL(DS_ERR_FORMAT, "%s: %s claims %llu strings, more than the %zu bytes left can hold", g->label,
                       shown, (unsigned long long)kv.count, left(c));
      if (fill) kv.strs = g->strs + s_at;
      for (uint64_t j = 0; j < kv.count; j++) {
        ds_gguf_str s;
        DS_TRY(take_str(c, &s, "a string", shown));
        if (fill) g->strs[s_at] = s;
        s_at++;
      }
    } else {
      size_t es = vtype_size(kv.elem_type);
      if (kv.count > left(c) / es)
        return DS_FAIL(DS_ERR_FORMAT, "%s: %s claims %llu values of %zu bytes, the file has %zu bytes left", g->label,
                       shown, (unsigned long long)kv.count, es, left(c));
      const void *p = NULL;
      DS_TRY(take(c, (size_t)kv.count * es, &p, "the value", shown));
      kv.data = p;
      if (kv.elem_type == DS_GGUF_BOOL)
        for (uint64_t j = 0; j < kv.count; j++)
          if (((const unsigned char *)p)[j] > 1)
            return DS_FAIL(DS_ERR_FORMAT, "%s: %s: bool %llu is %u, not 0 or 1", g->label, shown,
                           (unsigned long long)j, ((const unsigned char *)p)[j]);
    }
    if (fill) {
      char *k = g->names + *names_at;
      memcpy(k, key.p, (size_t)key.len);
      k[key.len] = 0;
      kv.key = k;
      g->kvs[i] = kv;
    }
    *names_at += (size_t)key.len + 1; /* the first pass counts the names' bytes */
  }
  *n_strs = s_at;
  return DS_OK;
}

static int by_name(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* No name twice among n (sorted copies of the pointers: a crafted file may hold millions). */
static ds_status unique(const ds_gguf *g, const char *const *names, size_t n, const char *what) {
  if (n < 2) return DS_OK;
  const char **s = malloc(n * sizeof *s);
  if (!s) return DS_FAIL(DS_ERR_NOMEM, "%s: %s table", g->label, what);
  memcpy(s, names, n * sizeof *s);
  qsort(s, n, sizeof *s, by_name);
  ds_status st = DS_OK;
  for (size_t i = 1; i < n && st == DS_OK; i++)
    if (!strcmp(s[i - 1], s[i])) st = DS_FAIL(DS_ERR_FORMAT, "%s: %s '%s' appears twice", g->label, what, s[i]);
  free(s);
  return st;
}

static ds_status names_unique(const ds_gguf *g) {
  size_t n = (size_t)(g->n_kv > g->n_tensors ? g->n_kv : g->n_tensors);
  const char **names = malloc((n ? n : 1) * sizeof *names);
  if (!names) return DS_FAIL(DS_ERR_NOMEM, "%s: name table", g->label);
  for (uint64_t i = 0; i < g->n_kv; i++) names[i] = g->kvs[i].key;
  ds_status st = unique(g, names, (size_t)g->n_kv, "key");
  for (uint64_t i = 0; st == DS_OK && i < g->n_tensors; i++) names[i] = g->tensors[i].name;
  if (st == DS_OK) st = unique(g, names, (size_t)g->n_tensors, "tensor");
  free(names);
  return st;
}

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static int by_offset(const void *a, const void *b) {
  const ds_gguf_tensor *x = *(const ds_gguf_tensor *const *)a, *y = *(const ds_gguf_tensor *const *)b;
  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* The bytes of the tensor names' NUL-terminated copies, read ahead of parse_tensors so that the
 * names buffer is sized to them, not to the file. It stops where the tensor infos stop making
 * sense: parse_tensors fails there too, having copied no more names than were counted. */
static size_t tensor_name_bytes(const ds_gguf *g, cursor c) {
  size_t bytes = 0;
  for (uint64_t i = 0; i < g->n_tensors; i++) {
    ds_gguf_str name;
    uint32_t nd, type;
    uint64_t v;
    if (take_str(&c, &name, "the name", "a tensor info") != DS_OK) break;
    bytes += (size_t)name.len + 1;
    if (take_u32(&c, &nd, "the dimension count", "a tensor info") != DS_OK || nd < 1 || nd > GGUF_MAX_DIMS) break;
    int ok = 1;
    for (uint32_t d = 0; d < nd && ok; d++) ok = take_u64(&c, &v, "a dimension", "a tensor info") == DS_OK;
    if (!ok || take_u32(&c, &type, "the type", "a tensor info") != DS_OK ||
        take_u64(&c, &v, "the offset", "a tensor info") != DS_OK)
      break;
  }
  return bytes;
}

static ds_status parse_tensors(ds_gguf *g, cursor *c, size_t *names_at) {
  for (uint64_t i = 0; i < g->n_tensors; i++) {
    char where[48];
    snprintf(where, sizeof where, "tensor info %llu", (unsigned long long)i);
    ds_gguf_str name;
    DS_TRY(take_str(c, &name, "the name", where));
    if (name.len == 0 || memchr(name.p, 0, (size_t)name.len))
      return DS_FAIL(DS_ERR_FORMAT, "%s: %s: a tensor name is empty or holds a NUL byte", g->label, where);
    ds_gguf_tensor *t = &g->tensors[i];
    char *n = g->names + *names_at;
    memcpy(n, name.p, (size_t)name.len);
    n[name.len] = 0;
    *names_at += (size_t)name.len + 1;
    t->name = n;
    uint32_t nd;
    DS_TRY(take_u32(c, &nd, "the dimension count", n));
    if (nd < 1 || nd > GGUF_MAX_DIMS)
      return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' has %u dimensions (1..4)", g->label, n, nd);
    t->ndim = (int)nd;
    int64_t numel = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
      uint64_t ne = 1;
      if (d < (int)nd) DS_TRY(take_u64(c, &ne, "a dimension", n));
      if (ne < 1 || ne > (uint64_t)INT64_MAX / (uint64_t)numel)
        return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s': dimension %d is %llu (>= 1, and their product must fit)",
                       g->label, n, d, (unsigned long long)ne);
      t->ne[d] = (int64_t)ne;
      numel *= (int64_t)ne;
    }
    t->numel = numel;
    DS_TRY(take_u32(c, &t->type, "the type", n));
    DS_TRY(take_u64(c, &t->offset, "the offset", n));
    const char *tn = ds_ggml_type_name(t->type);
    int64_t be;
    size_t bb;
    ds_ggml_type_block(t->type, &be, &bb);
    if (!tn || !bb)
      return DS_FAIL(DS_ERR_UNSUPPORTED, "%s: tensor '%s' has ggml type %u%s%s%s, which this reader does not know",
                     g->label, n, t->type, tn ? " (" : "", tn ? tn : "", tn ? ")" : "");
    if (t->ne[0] % be)
      return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s': a row of %lld values is not a whole number of %s blocks (%lld)",
                     g->label, n, (long long)t->ne[0], tn, (long long)be);
    uint64_t blocks = (uint64_t)(numel / be);
    if (blocks > SIZE_MAX / bb)
      return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' is too large", g->label, n);
    t->nbytes = (size_t)blocks * bb;
    if (t->offset % g->alignment)
      return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s': offset %llu is not a multiple of the alignment %u", g->label, n,
                     (unsigned long long)t->offset, g->alignment);
  }
  return DS_OK;
}

static ds_status place_tensors(ds_gguf *g, size_t infos_end) {
  g->data_start = (size_t)align_up(infos_end, g->alignment);
  if (g->n_tensors && g->data_start > g->size)
    return DS_FAIL(DS_ERR_FORMAT, "%s: the data section would start at %zu, past the end of the file (%zu bytes)",
                   g->label, g->data_start, g->size);
  size_t room = g->size > g->data_start ? g->size - g->data_start : 0;
  const ds_gguf_tensor **order = g->n_tensors ? malloc((size_t)g->n_tensors * sizeof *order) : NULL;
  if (g->n_tensors && !order) return DS_FAIL(DS_ERR_NOMEM, "%s: tensor table", g->label);
  ds_status st = DS_OK;
  for (uint64_t i = 0; i < g->n_tensors && st == DS_OK; i++) {
    ds_gguf_tensor *t = &g->tensors[i];
    order[i] = t;
    if (t->offset > room || t->nbytes > room - t->offset)
      st = DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' (%s, %zu bytes at data offset %llu) ends past the end of the file "
                   "(%zu data bytes): truncated or corrupt", g->label, t->name, ds_ggml_type_name(t->type), t->nbytes,
                   (unsigned long long)t->offset, room);
    else
      t->data = g->base + g->data_start + t->offset;
  }
  if (st == DS_OK && g->n_tensors > 1) {
    qsort(order, (size_t)g->n_tensors, sizeof *order, by_offset);
    for (uint64_t i = 1; i < g->n_tensors && st == DS_OK; i++)
      if (order[i - 1]->offset + order[i - 1]->nbytes > order[i]->offset)
        st = DS_FAIL(DS_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap in the data section", g->label,
                     order[i - 1]->name, order[i]->name);
  }
  free(order);
  return st;
}

static ds_status parse(ds_gguf *g) {
  cursor c = {g, 0};
  uint32_t magic;
  if (g->size < 4 || (memcpy(&magic, g->base, 4), magic != GGUF_MAGIC))
    return DS_FAIL(DS_ERR_FORMAT, "%s: not a GGUF file (no 'GGUF' magic at its start)", g->label);
  c.at = 4;
  DS_TRY(take_u32(&c, &g->version, "the version", NULL));
  if (g->version == 1)
    return DS_FAIL(DS_ERR_UNSUPPORTED, "%s: GGUF version 1 (32-bit counts) is not supported: convert it again with a "
                   "current llama.cpp", g->label);
  if (g->version != 2 && g->version != 3) {
    uint32_t swapped = __builtin_bswap32(g->version);
    if (swapped == 2 || swapped == 3)
      return DS_FAIL(DS_ERR_UNSUPPORTED, "%s: a big-endian GGUF file: only little-endian files are supported",
                     g->label);
    return DS_FAIL(DS_ERR_UNSUPPORTED, "%s: GGUF version %u (2 and 3 are supported)", g->label, g->version);
  }
  DS_TRY(take_u64(&c, &g->n_tensors, "the tensor count", NULL));
  DS_TRY(take_u64(&c, &g->n_kv, "the key-value count", NULL));
  /* a key-value takes at least 12 bytes (key length, type) and a tensor info at least 28 */
  if (g->n_kv > left(&c) / 12 || g->n_tensors > left(&c) / 28)
    return DS_FAIL(DS_ERR_FORMAT, "%s: %llu key-values and %llu tensors claimed, more than the %zu bytes left can hold",
                   g->label, (unsigned long long)g->n_kv, (unsigned long long)g->n_tensors, left(&c));
  size_t kv_start = c.at, n_strs = 0, names_at = 0;
  DS_TRY(parse_kvs(g, &c, &n_strs, 0, &names_at)); /* counts and checks */
  /* names: every key and tensor name, NUL-terminated, in one buffer */
  size_t name_bytes = names_at + tensor_name_bytes(g, c);
  g->kvs = calloc((size_t)g->n_kv + 1, sizeof *g->kvs);
  g->strs = calloc(n_strs + 1, sizeof *g->strs);
  g->tensors = calloc((size_t)g->n_tensors + 1, sizeof *g->tensors);
  g->names = malloc(name_bytes + 1);
  if (!g->kvs || !g->strs || !g->tensors || !g->names) return DS_FAIL(DS_ERR_NOMEM, "%s: GGUF tables", g->label);
  c.at = kv_start;
  names_at = 0;
  DS_TRY(parse_kvs(g, &c, &n_strs, 1, &names_at));
  g->alignment = GGUF_DEFAULT_ALIGNMENT;
  const ds_gguf_kv *al = ds_gguf_find_kv(g, "general.alignment");
  if (al) {
    if (al->type != DS_GGUF_U32)
      return DS_FAIL(DS_ERR_FORMAT, "%s: general.alignment is a %s, not a u32", g->label, ds_gguf_vtype_name(al->type));
    uint32_t a = rd32(al->data);
    if (a == 0 || (a & (a - 1)))
      return DS_FAIL(DS_ERR_FORMAT, "%s: general.alignment %u is not a power of two", g->label, a);
    g->alignment = a;
  }
  DS_TRY(parse_tensors(g, &c, &names_at));
  DS_TRY(names_unique(g));
  return place_tensors(g, c.at);
}

/* ---------------------------------------------------------------- open / close */

static ds_status gguf_new(const char *label, ds_gguf **out) {
  ds_gguf *g = calloc(1, sizeof *g);
  if (!g) return DS_FAIL(DS_ERR_NOMEM, "%s: GGUF handle", label);
  g->label = strdup(label);
  g->map.fd = -1;
  if (!g->label) {
    free(g);
    return DS_FAIL(DS_ERR_NOMEM, "%s: GGUF handle", label);
  }
  *out = g;
  return DS_OK;
}

ds_status ds_gguf_open_memory(const void *buf, size_t size, const char *label, ds_gguf **out) {
  if (!out) return DS_FAIL(DS_ERR_ARG, "ds_gguf_open_memory: out is NULL");
  *out = NULL;
  ds_gguf *g = NULL;
  DS_TRY(gguf_new(label ? label : "(memory)", &g));
  g->base = buf;
  g->size = buf ? size : 0;
  ds_status st = parse(g);
  if (st != DS_OK) {
    ds_gguf_close(g);
    return st;
  }
  *out = g;
  return DS_OK;
}

ds_status ds_gguf_open(const char *path, ds_gguf **out) {
  if (!out || !path) return DS_FAIL(DS_ERR_ARG, "ds_gguf_open: NULL argument");
  *out = NULL;
  ds_gguf *g = NULL;
  DS_TRY(gguf_new(path, &g));
  ds_status st = ds_map_file(path, &g->map);
  if (st == DS_OK) {
    g->mapped = 1;
    g->base = g->map.data;
    g->size = g->map.data ? g->map.size : 0;
    st = parse(g);
  }
  if (st != DS_OK) {
    ds_gguf_close(g);
    return st;
  }
  *out = g;
  return DS_OK;
}

void ds_gguf_close(ds_gguf *g) {
  if (!g) return;
  if (g->mapped) ds_unmap_file(&g->map);
  free(g->kvs);
  free(g->strs);
  free(g->tensors);
  free(g->names);
  free(g->label);
  free(g);
}

const char *ds_gguf_path(const ds_gguf *g) { return g->label; }
uint32_t ds_gguf_version(const ds_gguf *g) { return g->version; }
uint32_t ds_gguf_alignment(const ds_gguf *g) { return g->alignment; }
size_t ds_gguf_kv_count(const ds_gguf *g) { return (size_t)g->n_kv; }
const ds_gguf_kv *ds_gguf_kv_at(const ds_gguf *g, size_t i) { return i < g->n_kv ? &g->kvs[i] : NULL; }
size_t ds_gguf_tensor_count(const ds_gguf *g) { return (size_t)g->n_tensors; }
const ds_gguf_tensor *ds_gguf_tensor_at(const ds_gguf *g, size_t i) { return i < g->n_tensors ? &g->tensors[i] : NULL; }

const ds_gguf_kv *ds_gguf_find_kv(const ds_gguf *g, const char *key) {
  for (uint64_t i = 0; g->kvs && i < g->n_kv; i++)
    if (g->kvs[i].key && !strcmp(g->kvs[i].key, key)) return &g->kvs[i];
  return NULL;
}

const ds_gguf_tensor *ds_gguf_find_tensor(const ds_gguf *g, const char *name) {
  for (uint64_t i = 0; i < g->n_tensors; i++)
    if (!strcmp(g->tensors[i].name, name)) return &g->tensors[i];
  return NULL;
}

/* ---------------------------------------------------------------- typed getters */

static int is_int_type(ds_gguf_vtype t) {
  return t == DS_GGUF_U8 || t == DS_GGUF_I8 || t == DS_GGUF_U16 || t == DS_GGUF_I16 || t == DS_GGUF_U32 ||
         t == DS_GGUF_I32 || t == DS_GGUF_U64 || t == DS_GGUF_I64;
}

/* Element i of n-byte values at p of integer type t; *overflow when a u64 does not fit an i64. */
static int64_t int_at(const void *p, ds_gguf_vtype t, uint64_t i, int *overflow) {
  const unsigned char *b = (const unsigned char *)p + i * vtype_size(t);
  switch (t) {
    case DS_GGUF_U8: return b[0];
    case DS_GGUF_I8: return (int8_t)b[0];
    case DS_GGUF_U16: { uint16_t v; memcpy(&v, b, 2); return v; }
    case DS_GGUF_I16: { int16_t v; memcpy(&v, b, 2); return v; }
    case DS_GGUF_U32: return rd32(b);
    case DS_GGUF_I32: return (int32_t)rd32(b);
    case DS_GGUF_I64: return (int64_t)rd64(b);
    case DS_GGUF_U64: {
      uint64_t v = rd64(b);
      if (v > (uint64_t)INT64_MAX && overflow) *overflow = 1;
      return (int64_t)v;
    }
    default: return 0;
  }
}

static double f64_at(const void *p, ds_gguf_vtype t, uint64_t i) {
  if (t == DS_GGUF_F32) {
    float f;
    memcpy(&f, (const unsigned char *)p + 4 * i, 4);
    return f;
  }
  if (t == DS_GGUF_F64) {
    double d;
    memcpy(&d, (const unsigned char *)p + 8 * i, 8);
    return d;
  }
  return (double)int_at(p, t, i, NULL);
}

double ds_gguf_array_f64(const ds_gguf_kv *kv, uint64_t i) { return f64_at(kv->data, kv->elem_type, i); }
int64_t ds_gguf_array_i64(const ds_gguf_kv *kv, uint64_t i) { return int_at(kv->data, kv->elem_type, i, NULL); }

static ds_status scalar(const ds_gguf *g, const char *key, int required, const ds_gguf_kv **kv) {
  *kv = ds_gguf_find_kv(g, key);
  if (!*kv && required) return DS_FAIL(DS_ERR_NOT_FOUND, "%s: the metadata has no '%s'", g->label, key);
  if (*kv && (*kv)->type == DS_GGUF_ARRAY)
    return DS_FAIL(DS_ERR_FORMAT, "%s: '%s' is an array of %llu %s values, not a single value", g->label, key,
                   (unsigned long long)(*kv)->count, ds_gguf_vtype_name((*kv)->elem_type));
  return DS_OK;
}

ds_status ds_gguf_get_int(const ds_gguf *g, const char *key, int required, int64_t *out) {
  const ds_gguf_kv *kv;
  DS_TRY(scalar(g, key, required, &kv));
  if (!kv) return DS_OK;
  if (!is_int_type(kv->type))
    return DS_FAIL(DS_ERR_FORMAT, "%s: '%s' is a %s, not an integer", g->label, key, ds_gguf_vtype_name(kv->type));
  int overflow = 0;
  int64_t v = int_at(kv->data, kv->type, 0, &overflow);
  if (overflow) return DS_FAIL(DS_ERR_RANGE, "%s: '%s' = %llu is out of range", g->label, key,
                               (unsigned long long)rd64(kv->data));
  *out = v;
  return DS_OK;
}

ds_status ds_gguf_get_float(const ds_gguf *g, const char *key, int required, double *out) {
  const ds_gguf_kv *kv;
  DS_TRY(scalar(g, key, required, &kv));
  if (!kv) return DS_OK;
  if (kv->type != DS_GGUF_F32 && kv->type != DS_GGUF_F64 && !is_int_type(kv->type))
    return DS_FAIL(DS_ERR_FORMAT, "%s: '%s' is a %s, not a number", g->label, key, ds_gguf_vtype_name(kv->type));
  double v = f64_at(kv->data, kv->type, 0);
  if (!isfinite(v)) return DS_FAIL(DS_ERR_NUMERIC, "%s: '%s' is %g, not a finite number", g->label, key, v);
  *out = v;
  return DS_OK;
}

ds_status ds_gguf_get_bool(const ds_gguf *g, const char *key, int required, int *out) {
  const ds_gguf_kv *kv;
  DS_TRY(scalar(g, key, required, &kv));
  if (!kv) return DS_OK;
  if (kv->type != DS_GGUF_BOOL)
    return DS_FAIL(DS_ERR_FORMAT, "%s: '%s' is a %s, not a bool", g->label, key, ds_gguf_vtype_name(kv->type));
  *out = ((const unsigned char *)kv->data)[0];
  return DS_OK;
}

ds_status ds_gguf_get_str(const ds_gguf *g, const char *key, int required, ds_gguf_str *out) {
  const ds_gguf_kv *kv;
  DS_TRY(scalar(g, key, required, &kv));
  if (!kv) return DS_OK;
  if (kv->type != DS_GGUF_STRING)
    return DS_FAIL(DS_ERR_FORMAT, "%s: '%s' is a %s, not a string", g->label, key, ds_gguf_vtype_name(kv->type));
  *out = kv->strs[0];
  return DS_OK;
}

ds_status ds_gguf_get_array(const ds_gguf *g, const char *key, ds_gguf_vtype elem_type, int required,
                            const ds_gguf_kv **out) {
  const ds_gguf_kv *kv = ds_gguf_find_kv(g, key);
  if (!kv) {
    if (required) return DS_FAIL(DS_ERR_NOT_FOUND, "%s: the metadata has no '%s'", g->label, key);
    return DS_OK;
  }
  if (kv->type != DS_GGUF_ARRAY || kv->elem_type != elem_type)
    return DS_FAIL(DS_ERR_FORMAT, "%s: '%s' is %s%s, not an array of %s", g->label, key,
                   kv->type == DS_GGUF_ARRAY ? "an array of " : "a ", ds_gguf_vtype_name(kv->elem_type),
                   ds_gguf_vtype_name(elem_type));
  *out = kv;
  return DS_OK;
}

/* ---------------------------------------------------------------- dequantization */

ds_status ds_gguf_dequantize(const ds_gguf *g, const ds_gguf_tensor *t, float *dst) {
  if (!ds_ggml_type_dequantizable(t->type)) {
    const char *name = ds_ggml_type_name(t->type);
    return DS_FAIL(DS_ERR_UNSUPPORTED, "%s: tensor '%s' is of type %s, which this engine does not convert (F32, F16, "
                   "BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)", g->label, t->name,
                   name ? name : "unknown");
  }
  int64_t block;
  size_t block_bytes;
  ds_ggml_type_block(t->type, &block, &block_bytes);
  int64_t rows = t->numel / t->ne[0];
  size_t row_bytes = (size_t)(t->ne[0] / block) * block_bytes;
  int64_t bad = -1;
#pragma omp parallel for schedule(static) reduction(max : bad)
  for (int64_t r = 0; r < rows; r++) {
    float *y = dst + r * t->ne[0];
    ds_ggml_dequantize_row(t->type, (const unsigned char *)t->data + (size_t)r * row_bytes, y, t->ne[0]);
    for (int64_t i = 0; i < t->ne[0]; i++)
      if (!isfinite(y[i]) && bad < 0) bad = r * t->ne[0] + i;
  }
  if (bad >= 0)
    return DS_FAIL(DS_ERR_NUMERIC, "%s: tensor '%s' (%s): element %lld is %g, not finite", g->label, t->name,
                   ds_ggml_type_name(t->type), (long long)bad, (double)dst[bad]);
  return DS_OK;
}

void ds_gguf_release_header(const ds_gguf *g) {
  if (g && g->mapped && g->data_start) ds_release_mapped_pages(g->base, g->data_start);
}

void ds_gguf_release_pages(const ds_gguf *g) {
  if (g && g->mapped && g->size) ds_release_mapped_pages(g->base, g->size);
}

void ds_gguf_release(const ds_gguf *g, const ds_gguf_tensor *t) {
  if (!g || !g->mapped || !t || !t->nbytes) return;
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t lo = ((uintptr_t)t->data + page - 1) / page * page, hi = ((uintptr_t)t->data + t->nbytes) / page * page;
  if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED); /* advice only: a failure loses nothing */
}
