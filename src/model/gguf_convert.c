/* dspark convert: a GGUF file's model (gguf_internal.h) written as a Hugging Face model directory
 * (include/dspark/gguf_model.h): the texts and the weights' image a model source holds in memory,
 * written to files. */
#include <stdlib.h>

#include "dspark/fileio.h"
#include "dspark/gguf_model.h"
#include "dspark/safetensors.h"
#include "model/gguf_internal.h"

static ds_status write_file(const char *out_dir, const char *name, const void *data, size_t len) {
  char *file = ds_path_join(out_dir, name);
  ds_status st = file ? ds_write_file_atomic(file, data, len) : DS_FAIL(DS_ERR_NOMEM, "%s", name);
  free(file);
  return st;
}

ds_status ds_gguf_convert(const char *path, const char *out_dir, ds_dtype dtype) {
  if (dtype != DS_F32 && dtype != DS_BF16) return DS_FAIL(DS_ERR_ARG, "convert: the weights' dtype must be f32 or bf16");
  ds_gguf_model *m;
  DS_TRY(ds_gguf_model_open(path, dtype, &m));
  /* Every tensor is checked while the image is built, before anything is written: a refused file
   * leaves no directory behind; config.json comes last, so a directory that has it is whole. */
  static const ds_model_file files[] = {DS_MODEL_TOKENIZER, DS_MODEL_TOKENIZER_CONFIG, DS_MODEL_GENERATION_CONFIG,
                                        DS_MODEL_CONFIG};
  unsigned char *image = NULL;
  size_t size = 0;
  ds_status st = ds_gguf_model_weights(m, dtype, NULL, 0, 0, &image, &size);
  if (st == DS_OK) st = ds_mkdir_p(out_dir);
  if (st == DS_OK) st = write_file(out_dir, "model.safetensors", image, size);
  ds_st_image_free(image, size);
  for (size_t i = 0; st == DS_OK && i < sizeof files / sizeof files[0]; i++) {
    size_t len;
    const char *text = ds_gguf_model_text(m, files[i], &len);
    st = write_file(out_dir, ds_model_file_name(files[i]), text, len);
  }
  ds_gguf_model_close(m);
  return st;
}
