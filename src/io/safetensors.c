/* safetensors reading (validated, zero-copy over a mapping), HF checkpoint directories
 * (single file or index + shards) and atomic writing.
 *
 * Validation mirrors the Rust `safetensors` crate, which is what Python and transformers
 * use: header length <= 100 MB, header is a UTF-8 JSON object, every tensor has a known
 * dtype, a shape of non-negative integers whose byte size fits (checked multiplication) and
 * equals end - begin, and the tensors sorted by offset tile the data section exactly: the
 * first starts at 0, each starts where the previous ended (no gap, no overlap) and the last
 * ends at the end of the file (no truncation, no trailing bytes). Everything is checked
 * before a single tensor byte is exposed. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include "dspark/safetensors.h"
#include "io/json_util.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/dtype.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; views are exposed without byte swapping"
#endif

/* The Rust crate's MAX_HEADER_SIZE: a larger prefix means a corrupt or hostile file. */
#define ST_MAX_HEADER ((uint64_t)100000000)
/* Largest integer a JSON number (parsed as double by cJSON) represents exactly. */
#define ST_MAX_JSON_INT ((double)(UINT64_C(1) << 53))

static const char k_meta_key[] = "__metadata__";

typedef struct {
  char *key, *value;
} st_meta;

struct ds_safetensors {
  char *path; /* label for messages; also ds_tensor_view.file */
  ds_mapping map;
  int mapped;
  ds_tensor_view *tensors; /* sorted by data offset (= file order) */
  size_t n;
  const ds_tensor_view **by_name; /* sorted by name, for ds_st_find */
  st_meta *meta;                  /* sorted by key */
  size_t n_meta;
};

/* ---------------------------------------------------------------- small helpers */

static uint64_t read_le64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static char *dup_str(const char *s, const char *what) {
  size_t n = strlen(s) + 1;
  char *p = ds_malloc(n, what);
  if (p) memcpy(p, s, n);
  return p;
}

/* Strict UTF-8 (no overlongs, no surrogates, <= U+10FFFF), as Rust's str::from_utf8.
 * Returns the offset of the first bad byte, or len if all valid. */
static size_t utf8_invalid_at(const unsigned char *s, size_t len) {
  size_t i = 0;
  while (i < len) {
    unsigned c = s[i];
    if (c < 0x80) { i++; continue; }
    size_t need;
    unsigned lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) need = 1;
    else if (c == 0xe0) { need = 2; lo = 0xa0; }
    else if (c >= 0xe1 && c <= 0xec) need = 2;
    else if (c == 0xed) { need = 2; hi = 0x9f; }
    else if (c >= 0xee && c <= 0xef) need = 2;
    else if (c == 0xf0) { need = 3; lo = 0x90; }
    else if (c >= 0xf1 && c <= 0xf3) need = 3;
    else if (c == 0xf4) { need = 3; hi = 0x8f; }
    else return i;
    if (len - i <= need) return i;
    if (s[i + 1] < lo || s[i + 1] > hi) return i;
    for (size_t k = 2; k <= need; k++)
      if ((s[i + k] & 0xc0) != 0x80) return i;
    i += need + 1;
  }
  return len;
}

static void format_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
  size_t used = 0;
  int w = snprintf(buf, cap, "[");
  used = w > 0 ? (size_t)w : 0;
  for (int d = 0; d < ndim && used < cap; d++) {
    w = snprintf(buf + used, cap - used, "%s%" PRId64, d ? ", " : "", shape[d]);
    if (w < 0) break;
    used += (size_t)w;
  }
  if (used < cap) snprintf(buf + used, cap - used, "]");
}

/* Reads a JSON number that must be an exact integer in [0, 2^53]. Returns 1 on success;
 * on failure *val holds the number (or NAN when it is not a number) for the message. */
static int json_index(const cJSON *j, uint64_t *out, double *val) {
  *val = NAN;
  if (!cJSON_IsNumber(j)) return 0;
  double d = j->valuedouble;
  *val = d;
  if (!(d >= 0.0 && d <= ST_MAX_JSON_INT) || d != floor(d)) return 0;
  *out = (uint64_t)d;
  return 1;
}

static int cmp_view_name(const void *a, const void *b) {
  const ds_tensor_view *x = *(const ds_tensor_view *const *)a;
  const ds_tensor_view *y = *(const ds_tensor_view *const *)b;
  return strcmp(x->name, y->name);
}

static int cmp_cstr(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int cmp_meta_key(const void *a, const void *b) {
  return strcmp(((const st_meta *)a)->key, ((const st_meta *)b)->key);
}

static const ds_tensor_view *find_in_sorted(const ds_tensor_view *const *by_name, size_t n,
                                            const char *name) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(by_name[mid]->name, name);
    if (c == 0) return by_name[mid];
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return NULL;
}

/* ---------------------------------------------------------------- reader */

/* A tensor while parsing: its view plus offsets and header position for sorting. */
typedef struct {
  ds_tensor_view v;
  uint64_t begin, end;
  size_t order;
} st_entry;

static int cmp_entry_offset(const void *a, const void *b) {
  const st_entry *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return x->order < y->order ? -1 : (x->order > y->order);
}

void ds_st_close(ds_safetensors *st) {
  if (!st) return;
  for (size_t i = 0; i < st->n; i++) free((char *)st->tensors[i].name);
  for (size_t i = 0; i < st->n_meta; i++) {
    free(st->meta[i].key);
    free(st->meta[i].value);
  }
  free(st->tensors);
  free(st->by_name);
  free(st->meta);
  if (st->mapped) ds_unmap_file(&st->map);
  free(st->path);
  free(st);
}

static ds_status parse_metadata(ds_safetensors *st, const cJSON *obj) {
  const char *p = st->path;
  if (!cJSON_IsObject(obj))
    return DS_FAIL(DS_ERR_FORMAT, "%s: header field '%s' must be an object of strings", p, k_meta_key);
  size_t n = 0;
  for (const cJSON *c = obj->child; c; c = c->next) n++;
  st->meta = ds_calloc(n, sizeof *st->meta, "safetensors metadata");
  if (!st->meta) return DS_ERR_NOMEM;
  for (const cJSON *c = obj->child; c; c = c->next) {
    if (!cJSON_IsString(c))
      return DS_FAIL(DS_ERR_FORMAT, "%s: %s['%s'] must be a string", p, k_meta_key, c->string);
    st_meta *m = &st->meta[st->n_meta];
    m->key = dup_str(c->string, "metadata key");
    m->value = m->key ? dup_str(c->valuestring, "metadata value") : NULL;
    if (!m->key || !m->value) {
      free(m->key);
      return DS_ERR_NOMEM;
    }
    st->n_meta++;
  }
  qsort(st->meta, st->n_meta, sizeof *st->meta, cmp_meta_key);
  for (size_t i = 1; i < st->n_meta; i++)
    if (strcmp(st->meta[i - 1].key, st->meta[i].key) == 0)
      return DS_FAIL(DS_ERR_FORMAT, "%s: %s key '%s' appears more than once", p, k_meta_key,
                     st->meta[i].key);
  return DS_OK;
}

/* Validates one tensor entry against the data section size and fills e. */
static ds_status parse_entry(const ds_safetensors *st, const cJSON *j, uint64_t data_size,
                             const unsigned char *data, st_entry *e) {
  const char *p = st->path, *name = j->string;
  if (!cJSON_IsObject(j))
    return DS_FAIL(DS_ERR_FORMAT,
                   "%s: tensor '%s': entry must be an object with dtype, shape, data_offsets", p, name);
  const cJSON *jd = cJSON_GetObjectItemCaseSensitive(j, "dtype");
  const cJSON *js = cJSON_GetObjectItemCaseSensitive(j, "shape");
  const cJSON *jo = cJSON_GetObjectItemCaseSensitive(j, "data_offsets");

  if (!cJSON_IsString(jd))
    return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s': missing or non-string 'dtype'", p, name);
  if (!ds_dtype_from_name(jd->valuestring, &e->v.dtype)) {
    static const char *const k_other[] = {"U16", "U32", "U64", "F8_E4M3", "F8_E5M2", "F8_E8M0",
                                          "F6_E2M3", "F6_E3M2", "F4", "C64"};
    for (size_t i = 0; i < sizeof k_other / sizeof k_other[0]; i++)
      if (strcmp(jd->valuestring, k_other[i]) == 0)
        return DS_FAIL(DS_ERR_UNSUPPORTED, "%s: tensor '%s': dtype '%s' is not supported by dspark",
                       p, name, jd->valuestring);
    return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s': unknown dtype '%s'", p, name, jd->valuestring);
  }

  if (!cJSON_IsArray(js))
    return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s': missing or non-array 'shape'", p, name);
  int ndim = 0;
  uint64_t numel = 1;
  int overflow = 0;
  for (const cJSON *d = js->child; d; d = d->next, ndim++) {
    uint64_t dim;
    double val;
    if (ndim >= DS_MAX_DIMS)
      return DS_FAIL(DS_ERR_UNSUPPORTED, "%s: tensor '%s': shape has more than %d dimensions", p,
                     name, DS_MAX_DIMS);
    if (!json_index(d, &dim, &val)) {
      if (val < 0)
        return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s': shape[%d] = %.17g is negative", p, name,
                       ndim, val);
      if (val == val)
        return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s': shape[%d] = %.17g is not an integer in [0, 2^53]",
                       p, name, ndim, val);
      return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s': shape[%d] is not a number", p, name, ndim);
    }
    e->v.shape[ndim] = (int64_t)dim;
    /* Checked like the Rust crate: any intermediate overflow is an error, even if a later
     * dimension is 0. */
    if (__builtin_mul_overflow(numel, dim, &numel)) overflow = 1;
  }
  e->v.ndim = ndim;
  size_t esize = ds_dtype_size(e->v.dtype);
  uint64_t nbytes = 0;
  if (overflow || numel > (uint64_t)INT64_MAX || __builtin_mul_overflow(numel, (uint64_t)esize, &nbytes)
      || nbytes > (uint64_t)SIZE_MAX) {
    char sh[256];
    format_shape(sh, sizeof sh, ndim, e->v.shape);
    return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s': shape %s overflows 64 bits (%s elements of %zu bytes)",
                   p, name, sh, jd->valuestring, esize);
  }
  e->v.numel = (int64_t)numel;
  e->v.nbytes = (size_t)nbytes;

  if (!cJSON_IsArray(jo) || !jo->child || !jo->child->next || jo->child->next->next)
    return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s': 'data_offsets' must be an array [begin, end]",
                   p, name);
  double vb, ve;
  int ok_b = json_index(jo->child, &e->begin, &vb), ok_e = json_index(jo->child->next, &e->end, &ve);
  if (!ok_b || !ok_e)
    return DS_FAIL(DS_ERR_FORMAT,
                   "%s: tensor '%s': data_offsets must be integers in [0, 2^53], got [%.17g, %.17g]",
                   p, name, vb, ve);
  if (e->begin > e->end)
    return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] have begin > end",
                   p, name, e->begin, e->end);
  if (e->end - e->begin != nbytes) {
    char sh[256];
    format_shape(sh, sizeof sh, ndim, e->v.shape);
    return DS_FAIL(DS_ERR_FORMAT,
                   "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64
                   " bytes but %s x %s needs %" PRIu64,
                   p, name, e->begin, e->end, e->end - e->begin, jd->valuestring, sh, nbytes);
  }
  if (e->end > data_size)
    return DS_FAIL(DS_ERR_FORMAT,
                   "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] run past the data section "
                   "of %" PRIu64 " bytes (file truncated?)",
                   p, name, e->begin, e->end, data_size);
  e->v.data = data + e->begin;
  e->v.file = st->path;
  e->v.name = NULL; /* set by the caller once all checks passed */
  return DS_OK;
}

/* Parses and validates buf[0..size) into st (whose path is set). */
static ds_status st_parse(ds_safetensors *st, const unsigned char *buf, size_t size) {
  const char *p = st->path;
  if (size < 8)
    return DS_FAIL(DS_ERR_FORMAT, "%s: file is %zu bytes, shorter than the 8-byte header length", p, size);
  uint64_t hlen = read_le64(buf);
  if (hlen > ST_MAX_HEADER)
    return DS_FAIL(DS_ERR_FORMAT,
                   "%s: header length %" PRIu64 " exceeds the %" PRIu64 "-byte limit (not a safetensors file?)",
                   p, hlen, ST_MAX_HEADER);
  if (hlen > (uint64_t)(size - 8))
    return DS_FAIL(DS_ERR_FORMAT,
                   "%s: header length %" PRIu64 " is larger than the %zu bytes after the length prefix "
                   "(truncated file?)",
                   p, hlen, size - 8);
  const unsigned char *hdr = buf + 8;
  const unsigned char *data = hdr + hlen;
  uint64_t data_size = (uint64_t)(size - 8) - hlen;
  /* Leading JSON whitespace is accepted, as Python safetensors 0.8 does. */
  size_t lead = 0;
  while (lead < hlen && (hdr[lead] == ' ' || hdr[lead] == '\t' || hdr[lead] == '\n' || hdr[lead] == '\r'))
    lead++;
  if (lead == hlen || hdr[lead] != '{')
    return DS_FAIL(DS_ERR_FORMAT, "%s: header does not start with '{' (not a safetensors file?)", p);
  if (memchr(hdr, 0, (size_t)hlen))
    return DS_FAIL(DS_ERR_FORMAT, "%s: header contains a NUL byte", p);
  size_t bad = utf8_invalid_at(hdr, (size_t)hlen);
  if (bad != (size_t)hlen)
    return DS_FAIL(DS_ERR_FORMAT, "%s: header is not valid UTF-8 (byte %zu)", p, bad);

  /* cJSON is not built with our sanitizers: hand it a NUL-terminated private copy so a parser
   * slip can never read past the caller's buffer. */
  char *text = ds_malloc((size_t)hlen + 1, "safetensors header");
  if (!text) return DS_ERR_NOMEM;
  memcpy(text, hdr, (size_t)hlen);
  text[hlen] = 0;
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(text, (size_t)hlen, &end, 0);
  ds_status status = DS_OK;
  st_entry *ents = NULL;
  if (!root) {
    size_t at = end ? (size_t)(end - text) : 0;
    status = DS_FAIL(DS_ERR_FORMAT, "%s: header is not valid JSON (error near byte %zu of %" PRIu64 ")",
                     p, at, hlen);
    goto done;
  }
  for (const char *q = end; q < text + hlen; q++)
    if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r') {
      status = DS_FAIL(DS_ERR_FORMAT, "%s: header has trailing garbage after the JSON object (byte %zu)",
                       p, (size_t)(q - text));
      goto done;
    }
  if (!cJSON_IsObject(root)) {
    status = DS_FAIL(DS_ERR_FORMAT, "%s: header is not a JSON object", p);
    goto done;
  }

  size_t n_entries = 0;
  int seen_meta = 0;
  for (const cJSON *c = root->child; c; c = c->next) {
    if (strcmp(c->string, k_meta_key) == 0) {
      if (seen_meta++) {
        status = DS_FAIL(DS_ERR_FORMAT, "%s: header has more than one '%s'", p, k_meta_key);
        goto done;
      }
      /* null means "no metadata" (the Rust crate reads it as an Option) */
      if (!cJSON_IsNull(c) && (status = parse_metadata(st, c)) != DS_OK) goto done;
    } else {
      n_entries++;
    }
  }
  ents = ds_calloc(n_entries, sizeof *ents, "safetensors tensor table");
  if (!ents) { status = DS_ERR_NOMEM; goto done; }
  size_t k = 0;
  for (const cJSON *c = root->child; c; c = c->next) {
    if (strcmp(c->string, k_meta_key) == 0) continue;
    if ((status = parse_entry(st, c, data_size, data, &ents[k])) != DS_OK) goto done;
    ents[k].order = k;
    ents[k].v.name = c->string; /* borrowed from root until copied below */
    k++;
  }

  /* Duplicate names first: a repeated entry would otherwise be reported as an overlap. */
  {
    const char **names = ds_calloc(n_entries, sizeof *names, "safetensors name check");
    if (!names) { status = DS_ERR_NOMEM; goto done; }
    for (size_t i = 0; i < n_entries; i++) names[i] = ents[i].v.name;
    qsort(names, n_entries, sizeof *names, cmp_cstr);
    for (size_t i = 1; i < n_entries && status == DS_OK; i++)
      if (strcmp(names[i - 1], names[i]) == 0)
        status = DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' appears more than once in the header", p, names[i]);
    free(names);
    if (status != DS_OK) goto done;
  }

  /* The tensors sorted by offset must tile [0, data_size) exactly. */
  qsort(ents, n_entries, sizeof *ents, cmp_entry_offset);
  uint64_t pos = 0;
  for (size_t i = 0; i < n_entries; i++) {
    if (ents[i].begin != pos) {
      if (ents[i].begin > pos)
        status = DS_FAIL(DS_ERR_FORMAT,
                         "%s: tensor '%s': data_offsets begin at %" PRIu64 " leaving a gap after byte %" PRIu64
                         " (safetensors data must be contiguous)",
                         p, ents[i].v.name, ents[i].begin, pos);
      else
        status = DS_FAIL(DS_ERR_FORMAT,
                         "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] overlap tensor '%s' "
                         "which ends at %" PRIu64,
                         p, ents[i].v.name, ents[i].begin, ents[i].end, ents[i - 1].v.name, pos);
      goto done;
    }
    pos = ents[i].end;
  }
  if (pos != data_size) {
    status = DS_FAIL(DS_ERR_FORMAT,
                     "%s: the tensors cover %" PRIu64 " bytes but the data section has %" PRIu64
                     " (trailing bytes after the last tensor)",
                     p, pos, data_size);
    goto done;
  }

  st->tensors = ds_calloc(n_entries, sizeof *st->tensors, "safetensors tensor views");
  st->by_name = ds_calloc(n_entries, sizeof *st->by_name, "safetensors name index");
  if (!st->tensors || !st->by_name) { status = DS_ERR_NOMEM; goto done; }
  for (size_t i = 0; i < n_entries; i++) {
    st->tensors[i] = ents[i].v;
    st->tensors[i].name = dup_str(ents[i].v.name, "tensor name");
    if (!st->tensors[i].name) { status = DS_ERR_NOMEM; goto done; }
    st->n = i + 1;
    st->by_name[i] = &st->tensors[i];
  }
  qsort(st->by_name, st->n, sizeof *st->by_name, cmp_view_name);

done:
  free(ents);
  cJSON_Delete(root);
  free(text);
  return status;
}

static ds_status st_new(const char *label, ds_safetensors **out) {
  *out = NULL;
  ds_safetensors *st = ds_calloc(1, sizeof *st, "safetensors handle");
  if (!st) return DS_ERR_NOMEM;
  st->map.fd = -1;
  st->path = dup_str(label, "path");
  if (!st->path) { free(st); return DS_ERR_NOMEM; }
  *out = st;
  return DS_OK;
}

ds_status ds_st_open_memory(const void *buf, size_t size, const char *label, ds_safetensors **out) {
  if (!out) return DS_FAIL(DS_ERR_ARG, "ds_st_open_memory: out is NULL");
  *out = NULL;
  if (!label) label = "<memory>";
  if (!buf && size) return DS_FAIL(DS_ERR_ARG, "%s: buffer is NULL", label);
  ds_safetensors *st;
  DS_TRY(st_new(label, &st));
  ds_status status = st_parse(st, buf, size);
  if (status != DS_OK) { ds_st_close(st); return status; }
  *out = st;
  return DS_OK;
}

ds_status ds_st_open(const char *path, ds_safetensors **out) {
  if (!out) return DS_FAIL(DS_ERR_ARG, "ds_st_open: out is NULL");
  *out = NULL;
  if (!path) return DS_FAIL(DS_ERR_ARG, "ds_st_open: path is NULL");
  ds_safetensors *st;
  DS_TRY(st_new(path, &st));
  ds_status status = ds_map_file(path, &st->map);
  if (status == DS_OK) {
    st->mapped = 1;
    status = st_parse(st, st->map.data, st->map.size);
  }
  if (status != DS_OK) { ds_st_close(st); return status; }
  *out = st;
  return DS_OK;
}

size_t ds_st_count(const ds_safetensors *st) { return st ? st->n : 0; }

const ds_tensor_view *ds_st_tensor(const ds_safetensors *st, size_t i) {
  return st && i < st->n ? &st->tensors[i] : NULL;
}

const ds_tensor_view *ds_st_find(const ds_safetensors *st, const char *name) {
  if (!st || !name) return NULL;
  return find_in_sorted(st->by_name, st->n, name);
}

const char *ds_st_metadata(const ds_safetensors *st, const char *key) {
  if (!st || !key || st->n_meta == 0) return NULL; /* bsearch on a NULL array is undefined */
  st_meta probe = {(char *)key, NULL};
  const st_meta *m = bsearch(&probe, st->meta, st->n_meta, sizeof *st->meta, cmp_meta_key);
  return m ? m->value : NULL;
}

size_t ds_st_metadata_count(const ds_safetensors *st) { return st ? st->n_meta : 0; }

const char *ds_st_metadata_key(const ds_safetensors *st, size_t i) {
  return st && i < st->n_meta ? st->meta[i].key : NULL;
}

const char *ds_st_path(const ds_safetensors *st) { return st ? st->path : NULL; }

/* ---------------------------------------------------------------- checkpoint directory */

static const char k_single_name[] = "model.safetensors";
static const char k_index_name[] = "model.safetensors.index.json";

struct ds_checkpoint {
  char *dir;
  ds_safetensors **shards;
  size_t n_shards;
  const ds_tensor_view **views;   /* listing order: file order, or weight_map order */
  const ds_tensor_view **by_name; /* sorted by name */
  size_t n;
};

void ds_ckpt_close(ds_checkpoint *ck) {
  if (!ck) return;
  for (size_t i = 0; i < ck->n_shards; i++) ds_st_close(ck->shards[i]);
  free(ck->shards);
  free(ck->views);
  free(ck->by_name);
  free(ck->dir);
  free(ck);
}

/* A shard name must stay inside the checkpoint directory: relative, no ".." component. */
static int shard_name_ok(const char *s) {
  if (!s[0] || s[0] == '/') return 0;
  for (const char *c = s; *c;) {
    size_t len = strcspn(c, "/");
    if (len == 2 && c[0] == '.' && c[1] == '.') return 0;
    c += len;
    if (*c == '/') c++;
  }
  return 1;
}

static ds_status ckpt_add_shard(ds_checkpoint *ck, ds_safetensors *st) {
  ds_safetensors **s = realloc(ck->shards, (ck->n_shards + 1) * sizeof *s);
  if (!s) {
    ds_st_close(st);
    return DS_FAIL(DS_ERR_NOMEM, "%s: cannot grow the shard table", ck->dir);
  }
  ck->shards = s;
  ck->shards[ck->n_shards++] = st;
  return DS_OK;
}

static ds_status ckpt_open_index(ds_checkpoint *ck, const char *index_path) {
  char *text = NULL;
  size_t len = 0;
  DS_TRY(ds_read_file(index_path, &text, &len));
  ds_status status = DS_OK;
  cJSON *root = ds_json_parse(text, len, index_path, &status);
  const char **shard_names = NULL; /* parallel to ck->shards, borrowed from root */
  char *shard_path = NULL;
  if (!root) goto done;
  const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
  if (!cJSON_IsObject(root) || !cJSON_IsObject(wm)) {
    status = DS_FAIL(DS_ERR_FORMAT, "%s: missing object 'weight_map'", index_path);
    goto done;
  }
  size_t n = 0;
  for (const cJSON *c = wm->child; c; c = c->next) n++;
  ck->views = ds_calloc(n, sizeof *ck->views, "checkpoint tensor table");
  ck->by_name = ds_calloc(n, sizeof *ck->by_name, "checkpoint name index");
  shard_names = ds_calloc(n, sizeof *shard_names, "checkpoint shard names");
  if (!ck->views || !ck->by_name || !shard_names) { status = DS_ERR_NOMEM; goto done; }

  for (const cJSON *c = wm->child; c; c = c->next) {
    if (!cJSON_IsString(c)) {
      status = DS_FAIL(DS_ERR_FORMAT, "%s: weight_map['%s'] must be a shard file name", index_path, c->string);
      goto done;
    }
    const char *shard = c->valuestring;
    if (!shard_name_ok(shard)) {
      status = DS_FAIL(DS_ERR_FORMAT,
                       "%s: weight_map['%s'] = '%s' is not a file name inside the checkpoint directory",
                       index_path, c->string, shard);
      goto done;
    }
    /* Shards are few (tens), tensors many: a linear scan over open shards is enough. */
    size_t si = 0;
    while (si < ck->n_shards && strcmp(shard_names[si], shard) != 0) si++;
    if (si == ck->n_shards) {
      shard_path = ds_path_join(ck->dir, shard);
      if (!shard_path) { status = DS_ERR_NOMEM; goto done; }
      if (!ds_file_exists(shard_path)) {
        status = DS_FAIL(DS_ERR_NOT_FOUND, "%s: weight_map['%s'] names shard '%s', but %s does not exist",
                         index_path, c->string, shard, shard_path);
        goto done;
      }
      ds_safetensors *st;
      if ((status = ds_st_open(shard_path, &st)) != DS_OK) {
        ds_error_wrap(status, "%s: shard '%s'", index_path, shard);
        goto done;
      }
      if ((status = ckpt_add_shard(ck, st)) != DS_OK) goto done;
      shard_names[si] = shard;
      free(shard_path);
      shard_path = NULL;
    }
    const ds_tensor_view *v = ds_st_find(ck->shards[si], c->string);
    if (!v) {
      status = DS_FAIL(DS_ERR_NOT_FOUND, "%s: weight_map lists tensor '%s' in shard '%s', but %s does not contain it",
                       index_path, c->string, shard, ds_st_path(ck->shards[si]));
      goto done;
    }
    ck->views[ck->n] = v;
    ck->by_name[ck->n] = v;
    ck->n++;
  }
  qsort(ck->by_name, ck->n, sizeof *ck->by_name, cmp_view_name);
  for (size_t i = 1; i < ck->n; i++)
    if (strcmp(ck->by_name[i - 1]->name, ck->by_name[i]->name) == 0) {
      status = DS_FAIL(DS_ERR_FORMAT, "%s: weight_map lists tensor '%s' more than once", index_path,
                       ck->by_name[i]->name);
      goto done;
    }

done:
  free(shard_path);
  free(shard_names);
  cJSON_Delete(root);
  free(text);
  return status;
}

ds_status ds_ckpt_open(const char *dir, ds_checkpoint **out) {
  if (!out) return DS_FAIL(DS_ERR_ARG, "ds_ckpt_open: out is NULL");
  *out = NULL;
  if (!dir) return DS_FAIL(DS_ERR_ARG, "ds_ckpt_open: dir is NULL");
  ds_checkpoint *ck = ds_calloc(1, sizeof *ck, "checkpoint");
  if (!ck) return DS_ERR_NOMEM;
  ds_status status = DS_OK;
  char *single = NULL, *index = NULL;
  ck->dir = dup_str(dir, "path");
  single = ds_path_join(dir, k_single_name);
  index = ds_path_join(dir, k_index_name);
  if (!ck->dir || !single || !index) { status = DS_ERR_NOMEM; goto done; }

  /* Same preference as transformers: the single file wins over an index. */
  if (ds_file_exists(single)) {
    ds_safetensors *st;
    if ((status = ds_st_open(single, &st)) != DS_OK) goto done;
    if ((status = ckpt_add_shard(ck, st)) != DS_OK) goto done;
    ck->n = ds_st_count(st);
    ck->views = ds_calloc(ck->n, sizeof *ck->views, "checkpoint tensor table");
    ck->by_name = ds_calloc(ck->n, sizeof *ck->by_name, "checkpoint name index");
    if (!ck->views || !ck->by_name) { status = DS_ERR_NOMEM; goto done; }
    for (size_t i = 0; i < ck->n; i++) ck->views[i] = ck->by_name[i] = ds_st_tensor(st, i);
    qsort(ck->by_name, ck->n, sizeof *ck->by_name, cmp_view_name);
  } else if (ds_file_exists(index)) {
    status = ckpt_open_index(ck, index);
  } else {
    status = DS_FAIL(DS_ERR_NOT_FOUND, "%s: neither %s nor %s found (not a Hugging Face checkpoint directory?)",
                     dir, k_single_name, k_index_name);
  }

done:
  free(single);
  free(index);
  if (status != DS_OK) {
    ds_ckpt_close(ck);
    return status;
  }
  *out = ck;
  return DS_OK;
}

const ds_tensor_view *ds_ckpt_find(const ds_checkpoint *ck, const char *name) {
  if (!ck || !name) return NULL;
  return find_in_sorted(ck->by_name, ck->n, name);
}

size_t ds_ckpt_count(const ds_checkpoint *ck) { return ck ? ck->n : 0; }

const ds_tensor_view *ds_ckpt_tensor(const ds_checkpoint *ck, size_t i) {
  return ck && i < ck->n ? ck->views[i] : NULL;
}

ds_status ds_ckpt_read_f32(const ds_checkpoint *ck, const char *name, int ndim, const int64_t *shape,
                           float *dst) {
  if (!ck || !name || !dst || ndim < 0 || ndim > DS_MAX_DIMS || (ndim > 0 && !shape))
    return DS_FAIL(DS_ERR_ARG, "ds_ckpt_read_f32: invalid arguments for tensor '%s'", name ? name : "(null)");
  const ds_tensor_view *v = ds_ckpt_find(ck, name);
  if (!v)
    return DS_FAIL(DS_ERR_NOT_FOUND, "%s: tensor '%s' not found in the checkpoint (%zu tensors)",
                   ck->dir, name, ck->n);
  int match = v->ndim == ndim;
  for (int d = 0; match && d < ndim; d++)
    if (shape[d] >= 0 && shape[d] != v->shape[d]) match = 0;
  if (!match) {
    char have[256], want[256];
    format_shape(have, sizeof have, v->ndim, v->shape);
    format_shape(want, sizeof want, ndim, shape);
    return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' has shape %s but %s was expected (-1 = any)",
                   v->file, name, have, want);
  }
  if (v->dtype != DS_F32 && v->dtype != DS_F16 && v->dtype != DS_BF16 && v->dtype != DS_F64)
    return DS_FAIL(DS_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s; only F32/F16/BF16/F64 convert to F32",
                   v->file, name, ds_dtype_name(v->dtype));
  /* Convert in cache-sized chunks and check each chunk while it is hot: non-finite weights
   * mean a corrupt checkpoint, and must not be trained on silently. */
  const size_t chunk = 16384, esize = ds_dtype_size(v->dtype), numel = (size_t)v->numel;
  const unsigned char *src = v->data;
  for (size_t off = 0; off < numel; off += chunk) {
    size_t m = numel - off < chunk ? numel - off : chunk;
    ds_status status = ds_convert_to_f32(dst + off, src + off * esize, v->dtype, m);
    if (status != DS_OK) return ds_error_wrap(status, "%s: tensor '%s'", v->file, name);
    for (size_t i = 0; i < m; i++)
      if (!isfinite(dst[off + i]))
        return DS_FAIL(DS_ERR_NUMERIC, "%s: tensor '%s': element %zu is %g (non-finite weight)",
                       v->file, name, off + i, (double)dst[off + i]);
  }
  return DS_OK;
}

/* ---------------------------------------------------------------- writer */

typedef struct {
  char *name;
  ds_dtype dtype;
  int ndim;
  int64_t shape[DS_MAX_DIMS];
  const void *data;
  uint64_t nbytes;
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
  return utf8_invalid_at((const unsigned char *)s, n) == n;
}

ds_status ds_st_writer_add(ds_st_writer *w, const char *name, ds_dtype dtype, int ndim,
                           const int64_t *shape, const void *data) {
  if (!w || !name) return DS_FAIL(DS_ERR_ARG, "ds_st_writer_add: writer or name is NULL");
  if (!name[0] || strcmp(name, k_meta_key) == 0 || !valid_text(name))
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
  if (nbytes > 0 && !data)
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
  t->name = dup_str(name, "tensor name");
  if (!t->name) return DS_ERR_NOMEM;
  t->dtype = dtype;
  t->ndim = ndim;
  for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
  t->data = data;
  t->nbytes = nbytes;
  w->n++;
  return DS_OK;
}

ds_status ds_st_writer_set_metadata(ds_st_writer *w, const char *key, const char *value) {
  if (!w || !key || !value) return DS_FAIL(DS_ERR_ARG, "ds_st_writer_set_metadata: NULL argument");
  if (!valid_text(key) || !valid_text(value))
    return DS_FAIL(DS_ERR_ARG, "safetensors writer: metadata '%s' is not valid UTF-8", key);
  char *v = dup_str(value, "metadata value");
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
  char *k = dup_str(key, "metadata key");
  if (!k) { free(v); return DS_ERR_NOMEM; }
  w->meta[w->n_meta].key = k;
  w->meta[w->n_meta].value = v;
  w->n_meta++;
  return DS_OK;
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

ds_status ds_st_writer_write(ds_st_writer *w, const char *path) {
  if (!w || !path) return DS_FAIL(DS_ERR_ARG, "ds_st_writer_write: writer or path is NULL");
  /* Header: "__metadata__" first, then tensors in insertion order, laid out back to back. */
  strbuf b = {0};
  char num[64];
  sb_puts(&b, "{");
  if (w->n_meta) {
    sb_json_string(&b, k_meta_key);
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
