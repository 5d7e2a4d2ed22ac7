/* GGUF writing: the file layout include/dspark/gguf.h describes (version 3, little-endian,
 * alignment 32), built in memory as key-values and tensors, then written atomically.
 *
 * Key-values keep the order of their first setting; setting a key again replaces its value in
 * place (as the gguf Python package's writer does). Tensors are written in the order they are
 * added, each one's data at a multiple of the alignment, zero padding between. The writer
 * refuses what ds_gguf_open would refuse (empty or NUL-holding keys and names, a name twice,
 * 0 or more than 4 dimensions, a dimension < 1, a row that is not a whole number of the type's
 * blocks, an unknown type), so that everything it writes reads back with our own reader; a name
 * of 64 bytes or more is refused too (ggml's GGML_MAX_NAME). */
#ifndef DSPARK_GGUF_WRITE_H
#define DSPARK_GGUF_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "dspark/common.h"
#include "dspark/gguf.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds_gguf_writer ds_gguf_writer;

ds_gguf_writer *ds_gguf_writer_new(void); /* NULL when out of memory */
void ds_gguf_writer_free(ds_gguf_writer *w);

ds_status ds_gguf_set_u32(ds_gguf_writer *w, const char *key, uint32_t v);
ds_status ds_gguf_set_i32(ds_gguf_writer *w, const char *key, int32_t v);
ds_status ds_gguf_set_f32(ds_gguf_writer *w, const char *key, float v);
ds_status ds_gguf_set_bool(ds_gguf_writer *w, const char *key, int v);
ds_status ds_gguf_set_str(ds_gguf_writer *w, const char *key, const char *s, size_t len);
/* An array of count numeric values of elem_type (not string, not array), little-endian at data. */
ds_status ds_gguf_set_array(ds_gguf_writer *w, const char *key, ds_gguf_vtype elem_type, uint64_t count,
                            const void *data);
/* An array of count strings (each NUL-terminated, written without the NUL). */
ds_status ds_gguf_set_str_array(ds_gguf_writer *w, const char *key, uint64_t count, const char *const *strs);
/* A key-value of an open file, copied as it is (type, value, array elements). */
ds_status ds_gguf_copy_kv(ds_gguf_writer *w, const ds_gguf_kv *kv);
size_t ds_gguf_writer_kv_count(const ds_gguf_writer *w);

/* A tensor of ggml type `type`, ne[0..ndim) fastest-varying first; data holds its
 * ds_ggml_type_block-sized bytes. With own = 1 the writer takes data (malloc'd) and frees it,
 * also when the call fails; with own = 0 data must stay valid until ds_gguf_writer_write. */
ds_status ds_gguf_add_tensor(ds_gguf_writer *w, const char *name, uint32_t type, int ndim, const int64_t *ne,
                             void *data, int own);
size_t ds_gguf_writer_tensor_count(const ds_gguf_writer *w);

/* Writes the file atomically (a temp file, fsync, rename). */
ds_status ds_gguf_writer_write(const ds_gguf_writer *w, const char *path);

#ifdef __cplusplus
}
#endif
#endif
