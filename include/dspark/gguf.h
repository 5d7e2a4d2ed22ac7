/* GGUF: validated, memory-mapped reading of llama.cpp's model files, and dequantization of their
 * tensor types to fp32.
 *
 * File layout (versions 2 and 3, little-endian): magic "GGUF", u32 version, u64 tensor count,
 * u64 key-value count; the key-values (a string key, a u32 value type, the value); the tensor
 * infos (a string name, u32 dimension count, u64 dimensions with the fastest-varying first, u32
 * ggml type, u64 offset); padding to the alignment (`general.alignment`, 32 by default); the
 * data section, in which each tensor's offset is a multiple of the alignment. A string is a u64
 * length and that many bytes (no terminator); an array is a u32 element type, a u64 count and
 * the elements.
 *
 * Opening checks everything before a tensor is touched: magic and version (1 and big-endian
 * files refused by name), every length and count against the bytes left, value and element types
 * known, no nested arrays, keys and tensor names unique and free of NUL bytes, dimensions >= 1 and
 * their product free of overflow, the first dimension a multiple of the type's block, offsets
 * aligned, each tensor inside the file and no two overlapping. Every error names the file and the
 * key or tensor. */
#ifndef DSPARK_GGUF_H
#define DSPARK_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "dspark/common.h"
#include "dspark/ggml_quant.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Value types of the key-values (the GGUF specification's numbering). */
typedef enum {
  DS_GGUF_U8 = 0,
  DS_GGUF_I8 = 1,
  DS_GGUF_U16 = 2,
  DS_GGUF_I16 = 3,
  DS_GGUF_U32 = 4,
  DS_GGUF_I32 = 5,
  DS_GGUF_F32 = 6,
  DS_GGUF_BOOL = 7,
  DS_GGUF_STRING = 8,
  DS_GGUF_ARRAY = 9,
  DS_GGUF_U64 = 10,
  DS_GGUF_I64 = 11,
  DS_GGUF_F64 = 12,
} ds_gguf_vtype;

/* A string inside the mapping: not NUL-terminated. */
typedef struct {
  const char *p;
  uint64_t len;
} ds_gguf_str;

typedef struct {
  const char *key;      /* NUL-terminated copy */
  ds_gguf_vtype type;   /* DS_GGUF_ARRAY: elements of elem_type, count of them */
  ds_gguf_vtype elem_type;
  uint64_t count;       /* 1 for a scalar or a string */
  const void *data;     /* the raw little-endian value (scalar or array elements; not strings) */
  const ds_gguf_str *strs; /* a string (count 1) or an array of strings: count entries */
} ds_gguf_kv;

typedef struct {
  const char *name;  /* NUL-terminated copy */
  uint32_t type;     /* ggml type */
  int ndim;          /* 1..4 */
  int64_t ne[4];     /* dimensions, fastest-varying first (ne[0] is a row's length); 1 past ndim */
  int64_t numel;
  uint64_t offset;   /* in the data section */
  const void *data;  /* inside the mapping */
  size_t nbytes;
} ds_gguf_tensor;

typedef struct ds_gguf ds_gguf;

ds_status ds_gguf_open(const char *path, ds_gguf **out);
/* Parses from memory (tests and the fuzz target); buf must outlive the handle. */
ds_status ds_gguf_open_memory(const void *buf, size_t size, const char *label, ds_gguf **out);
void ds_gguf_close(ds_gguf *g);
const char *ds_gguf_path(const ds_gguf *g);
uint32_t ds_gguf_version(const ds_gguf *g);
uint32_t ds_gguf_alignment(const ds_gguf *g);

size_t ds_gguf_kv_count(const ds_gguf *g);
const ds_gguf_kv *ds_gguf_kv_at(const ds_gguf *g, size_t i); /* in file order */
const ds_gguf_kv *ds_gguf_find_kv(const ds_gguf *g, const char *key); /* NULL if absent */

/* Typed getters: DS_OK and the value; a missing key with required = 0 leaves *out unchanged and
 * returns DS_OK, with required = 1 fails naming the key; a value of another type, or an integer
 * out of range, fails naming the key, its type and the value. */
ds_status ds_gguf_get_int(const ds_gguf *g, const char *key, int required, int64_t *out); /* any integer type */
ds_status ds_gguf_get_float(const ds_gguf *g, const char *key, int required, double *out); /* f32, f64 or integer */
ds_status ds_gguf_get_bool(const ds_gguf *g, const char *key, int required, int *out);
ds_status ds_gguf_get_str(const ds_gguf *g, const char *key, int required, ds_gguf_str *out);
/* An array of elem_type (its entries in kv->data or kv->strs), refused naming the key otherwise. */
ds_status ds_gguf_get_array(const ds_gguf *g, const char *key, ds_gguf_vtype elem_type, int required,
                            const ds_gguf_kv **out);
/* Element i of an integer or float array as a double / int64 (no check of i: i < count). */
double ds_gguf_array_f64(const ds_gguf_kv *kv, uint64_t i);
int64_t ds_gguf_array_i64(const ds_gguf_kv *kv, uint64_t i);
const char *ds_gguf_vtype_name(ds_gguf_vtype t);

size_t ds_gguf_tensor_count(const ds_gguf *g);
const ds_gguf_tensor *ds_gguf_tensor_at(const ds_gguf *g, size_t i); /* in file order */
const ds_gguf_tensor *ds_gguf_find_tensor(const ds_gguf *g, const char *name); /* NULL if absent */

/* The tensor's values as fp32, dst[numel] in its storage order (row ne[0] fastest), each value
 * to the bit what the gguf Python package's dequantizers give (gguf.quants). A type it does not
 * convert is refused naming the type and the tensor; a non-finite value is DS_ERR_NUMERIC naming
 * the tensor and the element. */
ds_status ds_gguf_dequantize(const ds_gguf *g, const ds_gguf_tensor *t, float *dst);
/* Drops the file pages of t's data from this process's resident set (madvise DONTNEED on the
 * whole pages inside it) once a copy has been made: a later read faults them in again from the
 * file. Nothing for a handle over memory. */
void ds_gguf_release(const ds_gguf *g, const ds_gguf_tensor *t);
/* The same for the header's pages (key-values, tensor infos) once what a caller needs of them is
 * loaded: the strings and arrays the handle gives out stay valid, read from the file again. */
void ds_gguf_release_header(const ds_gguf *g);
/* The same for every page of the file, once nothing is read in place from it any more: a read
 * maps the whole page-cache folio around it (up to 1 MiB a read on a Linux 6.18 guest), so
 * reading the small tensors left resident megabytes of the large ones beside them. */
void ds_gguf_release_pages(const ds_gguf *g);

#ifdef __cplusplus
}
#endif
#endif
