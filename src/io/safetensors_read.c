/* safetensors reading: validated, zero-copy over a mapping (include/dspark/safetensors.h).
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

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; views are exposed without byte swapping"
#endif

struct ds_safetensors {
  char *path; /* label for messages; also ds_tensor_view.file */
  ds_mapping map;
  int mapped;
  ds_tensor_view *tensors; /* sorted by data offset (= file order) */
  size_t n;
  const ds_tensor_view **by_name; /* sorted by name, for ds_st_find */
  st_meta *meta;                  /* sorted by key */
  size_t n_meta;
  int refs;                       /* ds_st_retain's, beyond the opener's */
};

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
  if (st->refs > 0) {
    st->refs--;
    return;
  }
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
    return DS_FAIL(DS_ERR_FORMAT, "%s: header field '%s' must be an object of strings", p, ST_META_KEY);
  size_t n = 0;
  for (const cJSON *c = obj->child; c; c = c->next) n++;
  st->meta = ds_calloc(n, sizeof *st->meta, "safetensors metadata");
  if (!st->meta) return DS_ERR_NOMEM;
  for (const cJSON *c = obj->child; c; c = c->next) {
    if (!cJSON_IsString(c))
      return DS_FAIL(DS_ERR_FORMAT, "%s: %s['%s'] must be a string", p, ST_META_KEY, c->string);
    st_meta *m = &st->meta[st->n_meta];
    m->key = st_dup_str(c->string, "metadata key");
    m->value = m->key ? st_dup_str(c->valuestring, "metadata value") : NULL;
    if (!m->key || !m->value) {
      free(m->key);
      return DS_ERR_NOMEM;
    }
    st->n_meta++;
  }
  qsort(st->meta, st->n_meta, sizeof *st->meta, st_cmp_meta_key);
  for (size_t i = 1; i < st->n_meta; i++)
    if (strcmp(st->meta[i - 1].key, st->meta[i].key) == 0)
      return DS_FAIL(DS_ERR_FORMAT, "%s: %s key '%s' appears more than once", p, ST_META_KEY,
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
    if (!st_json_index(d, &dim, &val)) {
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
    st_format_shape(sh, sizeof sh, ndim, e->v.shape);
    return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s': shape %s overflows 64 bits (%s elements of %zu bytes)",
                   p, name, sh, jd->valuestring, esize);
  }
  e->v.numel = (int64_t)numel;
  e->v.nbytes = (size_t)nbytes;

  if (!cJSON_IsArray(jo) || !jo->child || !jo->child->next || jo->child->next->next)
    return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s': 'data_offsets' must be an array [begin, end]",
                   p, name);
  double vb, ve;
  int ok_b = st_json_index(jo->child, &e->begin, &vb), ok_e = st_json_index(jo->child->next, &e->end, &ve);
  if (!ok_b || !ok_e)
    return DS_FAIL(DS_ERR_FORMAT,
                   "%s: tensor '%s': data_offsets must be integers in [0, 2^53], got [%.17g, %.17g]",
                   p, name, vb, ve);
  if (e->begin > e->end)
    return DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] have begin > end",
                   p, name, e->begin, e->end);
  if (e->end - e->begin != nbytes) {
    char sh[256];
    st_format_shape(sh, sizeof sh, ndim, e->v.shape);
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
  uint64_t hlen = st_read_le64(buf);
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
  size_t bad = st_utf8_invalid_at(hdr, (size_t)hlen);
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
    if (strcmp(c->string, ST_META_KEY) == 0) {
      if (seen_meta++) {
        status = DS_FAIL(DS_ERR_FORMAT, "%s: header has more than one '%s'", p, ST_META_KEY);
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
    if (strcmp(c->string, ST_META_KEY) == 0) continue;
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
    qsort(names, n_entries, sizeof *names, st_cmp_cstr);
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
    st->tensors[i].name = st_dup_str(ents[i].v.name, "tensor name");
    if (!st->tensors[i].name) { status = DS_ERR_NOMEM; goto done; }
    st->n = i + 1;
    st->by_name[i] = &st->tensors[i];
  }
  qsort(st->by_name, st->n, sizeof *st->by_name, st_cmp_view_name);

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
  st->path = st_dup_str(label, "path");
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

ds_safetensors *ds_st_retain_mapped(const ds_safetensors *st) {
  if (!st || !st->mapped) return NULL;
  ds_safetensors *held = (ds_safetensors *)st; /* the count is the handle's bookkeeping, not its content */
  held->refs++;
  return held;
}

size_t ds_st_count(const ds_safetensors *st) { return st ? st->n : 0; }

const ds_tensor_view *ds_st_tensor(const ds_safetensors *st, size_t i) {
  return st && i < st->n ? &st->tensors[i] : NULL;
}

const ds_tensor_view *ds_st_find(const ds_safetensors *st, const char *name) {
  if (!st || !name) return NULL;
  return st_find_in_sorted(st->by_name, st->n, name);
}

const char *ds_st_metadata(const ds_safetensors *st, const char *key) {
  if (!st || !key || st->n_meta == 0) return NULL; /* bsearch on a NULL array is undefined */
  st_meta probe = {(char *)key, NULL};
  const st_meta *m = bsearch(&probe, st->meta, st->n_meta, sizeof *st->meta, st_cmp_meta_key);
  return m ? m->value : NULL;
}

size_t ds_st_metadata_count(const ds_safetensors *st) { return st ? st->n_meta : 0; }

const char *ds_st_metadata_key(const ds_safetensors *st, size_t i) {
  return st && i < st->n_meta ? st->meta[i].key : NULL;
}

const char *ds_st_path(const ds_safetensors *st) { return st ? st->path : NULL; }


/* XXH64 of a tensor's bytes. From a file mapping, a piece at a time with each piece's pages
 * dropped behind the hash: checking a large tensor (a draft's 113 MB embedding replica) does not
 * make it resident whole beside the copy its reader makes next. */
static ds_status hash_tensor(const ds_safetensors *st, const ds_tensor_view *v, uint64_t *out) {
  enum { PIECE = 8 << 20 };
  if (!st->mapped || v->nbytes <= PIECE) {
    *out = XXH64(v->data, v->nbytes, 0);
    if (st->mapped) ds_release_mapped_pages(v->data, v->nbytes);
    return DS_OK;
  }
  XXH64_state_t *h = XXH64_createState();
  if (!h) return DS_FAIL(DS_ERR_NOMEM, "%s: out of memory hashing tensor '%s'", st->path, v->name);
  XXH64_reset(h, 0);
  const unsigned char *p = v->data;
  for (size_t off = 0; off < v->nbytes; off += PIECE) {
    size_t n = v->nbytes - off < PIECE ? v->nbytes - off : PIECE;
    XXH64_update(h, p + off, n);
    ds_release_mapped_pages(p + off, n);
  }
  *out = XXH64_digest(h);
  XXH64_freeState(h);
  return DS_OK;
}

ds_status ds_st_verify_checksums(const ds_safetensors *st, int *present) {
  if (present) *present = 0;
  const char *text = ds_st_metadata(st, "checksums");
  if (!text) return DS_OK;
  if (present) *present = 1;
  ds_status status = DS_OK;
  cJSON *j = ds_json_parse(text, strlen(text), st->path, &status);
  if (!j) return DS_FAIL(DS_ERR_FORMAT, "%s: metadata 'checksums' is not valid JSON", st->path);
  char hex[17];
  if (!cJSON_IsObject(j)) status = DS_FAIL(DS_ERR_FORMAT, "%s: metadata 'checksums' is not a JSON object", st->path);
  for (size_t i = 0; status == DS_OK && i < st->n; i++) {
    const ds_tensor_view *v = &st->tensors[i];
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(j, v->name);
    if (!cJSON_IsString(h)) {
      status = DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' has no checksum in metadata 'checksums' (the file was "
                       "altered after it was written)", st->path, v->name);
      break;
    }
    uint64_t digest = 0;
    if ((status = hash_tensor(st, v, &digest)) != DS_OK) break;
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)digest);
    if (strcmp(hex, h->valuestring) != 0)
      status = DS_FAIL(DS_ERR_FORMAT, "%s: tensor '%s' fails its checksum (stored %s, computed %s): the file is "
                       "corrupt", st->path, v->name, h->valuestring, hex);
  }
  const cJSON *it;
  cJSON_ArrayForEach(it, j) {
    if (status != DS_OK) break;
    if (!ds_st_find(st, it->string))
      status = DS_FAIL(DS_ERR_FORMAT, "%s: metadata 'checksums' lists tensor '%s', which the file lacks", st->path,
                       it->string);
  }
  cJSON_Delete(j);
  if (status != DS_OK) return status;
  const char *mh = ds_st_metadata(st, "metadata_xxh64");
  snprintf(hex, sizeof hex, "%016llx", (unsigned long long)st_metadata_hash(st->meta, st->n_meta, "metadata_xxh64"));
  if (!mh) return DS_FAIL(DS_ERR_FORMAT, "%s: metadata 'metadata_xxh64' is missing beside 'checksums'", st->path);
  if (strcmp(mh, hex) != 0)
    return DS_FAIL(DS_ERR_FORMAT, "%s: the metadata fails its checksum (stored %s, computed %s): a field was edited "
                   "or the file is corrupt", st->path, mh, hex);
  return DS_OK;
}
