/* safetensors: validated mmap reading, sharded HF checkpoints, atomic writing.
 *
 * File layout: u64 little-endian header length N, N bytes of JSON header
 *   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 *    "__metadata__": {"k": "v"}}
 * then the data section; offsets are relative to its start. Opening validates everything
 * before any tensor is touched: JSON well formed, dtypes known, offsets inside the file,
 * end - begin == dtype size x product(shape) (no overflow), no two tensors overlapping.
 * As in the Rust `safetensors` crate (what Python and transformers use), the tensors sorted by
 * offset must tile the data section exactly: no gaps, no trailing bytes, header <= 100 MB. */
#ifndef DSPARK_SAFETENSORS_H
#define DSPARK_SAFETENSORS_H

#include "dspark/common.h"
#include "dspark/fileio.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { DS_MAX_DIMS = 8 };

typedef struct {
  const char *name;
  ds_dtype dtype;
  int ndim;
  int64_t shape[DS_MAX_DIMS];
  int64_t numel;
  const void *data; /* inside the mapping; may be unaligned */
  size_t nbytes;
  const char *file; /* path of the file that holds it (for messages) */
} ds_tensor_view;

typedef struct ds_safetensors ds_safetensors; /* one mapped file */

ds_status ds_st_open(const char *path, ds_safetensors **out);
/* Parses from memory (the fuzz target and tests use it); buf must outlive the handle. */
ds_status ds_st_open_memory(const void *buf, size_t size, const char *label, ds_safetensors **out);
void ds_st_close(ds_safetensors *st);
/* A second holder of a file's handle (its views stay valid until every holder has called
 * ds_st_close): st itself, or NULL when st was not opened from a file (ds_st_open_memory's
 * buffer belongs to its caller). Not thread-safe: holders open and close on one thread. */
ds_safetensors *ds_st_retain_mapped(const ds_safetensors *st);
size_t ds_st_count(const ds_safetensors *st);
const ds_tensor_view *ds_st_tensor(const ds_safetensors *st, size_t i); /* in file (offset) order */
const ds_tensor_view *ds_st_find(const ds_safetensors *st, const char *name); /* NULL if absent */
const char *ds_st_metadata(const ds_safetensors *st, const char *key);       /* NULL if absent */
/* The "__metadata__" keys, sorted, for copying a file's metadata. */
size_t ds_st_metadata_count(const ds_safetensors *st);
const char *ds_st_metadata_key(const ds_safetensors *st, size_t i);
const char *ds_st_path(const ds_safetensors *st);

/* A HF checkpoint directory: model.safetensors, or model.safetensors.index.json + shards
 * (model.safetensors wins if both exist, as in transformers). With an index, the checkpoint
 * holds exactly the tensors its "weight_map" lists, in its order; every shard must exist inside
 * the directory (no absolute or ".." names) and contain the tensors listed for it. */
typedef struct ds_checkpoint ds_checkpoint;

ds_status ds_ckpt_open(const char *dir, ds_checkpoint **out);
/* A checkpoint over a safetensors image in memory (ds_st_writer_image), validated as a file is;
 * it takes the image in every case: freed by ds_ckpt_close, or at once on failure. label names
 * it in messages, as a directory's path does. */
ds_status ds_ckpt_open_memory(unsigned char *image, size_t size, const char *label, ds_checkpoint **out);
/* For a loader that converts every tensor once and keeps only its copy (the target): from now
 * on a tensor of an in-memory checkpoint is given back to the system as soon as
 * ds_ckpt_read_f32 has converted it (its whole pages), and reading it again is refused naming
 * it; the weights are then held about once, not twice, while they are loaded. A checkpoint of
 * files is not affected (its pages are the page cache's, read again when touched). */
void ds_ckpt_read_once(ds_checkpoint *ck);
void ds_ckpt_close(ds_checkpoint *ck);
const ds_tensor_view *ds_ckpt_find(const ds_checkpoint *ck, const char *name);
size_t ds_ckpt_count(const ds_checkpoint *ck);
const ds_tensor_view *ds_ckpt_tensor(const ds_checkpoint *ck, size_t i);

/* Looks up name, checks ndim/shape (a shape entry < 0 matches anything), and converts to
 * fp32 into dst (numel floats). Errors name the checkpoint, the tensor and both shapes.
 * Integer dtypes are refused (DS_ERR_UNSUPPORTED); a NaN/Inf value is DS_ERR_NUMERIC. */
ds_status ds_ckpt_read_f32(const ds_checkpoint *ck, const char *name, int ndim,
                           const int64_t *shape, float *dst);
/* The same checks without a copy: name, ndim / shape, a float dtype (F32/F16/BF16/F64) and
 * every value finite (DS_ERR_NUMERIC naming the element otherwise); *out is the tensor's view,
 * whose data lies in the checkpoint's mapping (valid until ds_ckpt_close; it may be
 * unaligned). For weights used where they lie instead of converted. */
ds_status ds_ckpt_view_checked(const ds_checkpoint *ck, const char *name, int ndim, const int64_t *shape,
                               const ds_tensor_view **out);

/* Writer: collects tensors (borrowed pointers, which must stay valid until write), then
 * writes the whole file atomically. Tensors are laid out in insertion order, 8-byte aligned
 * header as HF does. */
typedef struct ds_st_writer ds_st_writer;

ds_st_writer *ds_st_writer_new(void);
ds_status ds_st_writer_add(ds_st_writer *w, const char *name, ds_dtype dtype, int ndim,
                           const int64_t *shape, const void *data);
/* A tensor laid out like ds_st_writer_add's but without data: it is filled in place in an image
 * (ds_st_writer_image), so a large tensor built there is never held twice. ds_st_writer_write
 * refuses a writer holding one. */
ds_status ds_st_writer_reserve(ds_st_writer *w, const char *name, ds_dtype dtype, int ndim, const int64_t *shape);
ds_status ds_st_writer_set_metadata(ds_st_writer *w, const char *key, const char *value);
ds_status ds_st_writer_write(ds_st_writer *w, const char *path);
/* An HF model directory from w: out_dir (created when missing) / model.safetensors, its metadata
 * "format" = "pt" as transformers expects, then out_dir / config.json = config_json; each file
 * written atomically, the config last, so that a directory with a config.json holds its weights. */
ds_status ds_st_writer_write_hf_dir(ds_st_writer *w, const char *out_dir, const char *config_json);
/* The bytes ds_st_writer_write would write, in one buffer of their own (*image, *size bytes; the
 * caller frees it with ds_st_image_free, or hands it to ds_ckpt_open_memory): the tensors added
 * with data copied in, the reserved ones left for the caller to fill. offsets (one per tensor, in
 * insertion order; may be NULL) receives where each tensor's data starts in the image. label
 * names the image in errors. */
ds_status ds_st_writer_image(const ds_st_writer *w, const char *label, unsigned char **image, size_t *size,
                             size_t *offsets);
void ds_st_image_free(unsigned char *image, size_t size);
/* The size in bytes of the file ds_st_writer_write would write now (header and data). */
ds_status ds_st_writer_file_size(const ds_st_writer *w, uint64_t *bytes);
void ds_st_writer_free(ds_st_writer *w);

/* Checksums (xxh64, seed 0, as 16 lowercase hex digits), for files whose corruption must be
 * detected (checkpoints): metadata "checksums" = a JSON object mapping every tensor's name to
 * the hash of its raw bytes, and "metadata_xxh64" = the hash over every other metadata key and
 * value in key order, each followed by a NUL byte. Call after the last add / set_metadata. */
ds_status ds_st_writer_add_checksums(ds_st_writer *w);
/* Verifies them: every tensor listed and matching, every listed name a tensor, the metadata
 * hash matching; errors name the file and the tensor or field. A file without "checksums"
 * passes with *present = 0 (present may be NULL). */
ds_status ds_st_verify_checksums(const ds_safetensors *st, int *present);

#ifdef __cplusplus
}
#endif
#endif
