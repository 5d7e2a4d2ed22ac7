/* Internal to the GGUF conversion: a GGUF file read as a Hugging Face model directory
 * (gguf_model.c: the config and the weights; gguf_tokenizer.c: the tokenizer's files), for
 * `dspark convert` (gguf_convert.c, which writes them) and for a model source (model_source.c,
 * which keeps them in memory): one mapping, two destinations. */
#ifndef DSPARK_MODEL_GGUF_INTERNAL_H
#define DSPARK_MODEL_GGUF_INTERNAL_H

#include "dspark/gguf.h"
#include "dspark/model_source.h"

/* tokenizer.ggml.{bos,eos,unknown,padding}_token_id, -1 when absent; each inside the vocabulary */
typedef struct {
  int64_t bos, eos, unk, pad;
  int add_bos; /* tokenizer.ggml.add_bos_token (0 when absent) */
} ds_gguf_special;

ds_status ds_gguf_special_tokens(const ds_gguf *g, int64_t vocab, ds_gguf_special *out);
/* tokenizer.json and tokenizer_config.json's texts (malloc'd, as written: cJSON_Print). */
ds_status ds_gguf_tokenizer_texts(const ds_gguf *g, const ds_gguf_special *sp, char **tokenizer, char **config);

/* The model a GGUF file holds: opened (validated: architecture, hyper-parameters, special tokens,
 * tokenizer) with the texts of its files built, config.json's torch_dtype saying dtype (DS_F32 or
 * DS_BF16: what `dspark convert --dtype` writes the weights in). */
typedef struct ds_gguf_model ds_gguf_model;

ds_status ds_gguf_model_open(const char *path, ds_dtype dtype, ds_gguf_model **out);
/* The same from a GGUF already open (ds_gguf_open_memory: the fuzzer), which m then owns: closed
 * with it, or at once when this fails. */
ds_status ds_gguf_model_from(ds_gguf *g, ds_dtype dtype, ds_gguf_model **out);
void ds_gguf_model_close(ds_gguf_model *m);
/* ds_gguf_release_header on the model's file: its metadata was read into the model source */
void ds_gguf_model_release_header(const ds_gguf_model *m);
/* ds_gguf_release_pages on the model's file: no tensor of it is read in place */
void ds_gguf_model_release_pages(const ds_gguf_model *m);
const char *ds_gguf_model_path(const ds_gguf_model *m);
/* A file's text (NULL for a file a GGUF never gives: chat_template.jinja), owned by m. */
const char *ds_gguf_model_text(const ds_gguf_model *m, ds_model_file f, size_t *len);
/* The weights as a safetensors image (ds_st_writer_image; malloc'd, the caller's): every tensor
 * checked, renamed and dequantized in place into the image, in dtype (DS_F32 or DS_BF16); the n_skip
 * tensors named in skip (HF names: those a target uses quantized in place) are reserved but
 * neither converted nor checked, and read as zeros (their pages are never touched). keep16: a
 * matrix stored as F16 or BF16 stays in that dtype (the same values, exactly: what a target
 * running its weights as stored uses in place through the 16-bit path). */
ds_status ds_gguf_model_weights(const ds_gguf_model *m, ds_dtype dtype, const char *const *skip, int n_skip,
                                int keep16, unsigned char **image, size_t *size);

/* The GGUF tensor that becomes the HF tensor `hf` (NULL when none does) and, for llama's q / k,
 * the heads whose rows llama.cpp's converter interleaved (*qk_heads 0: rows in HF order). */
const ds_gguf_tensor *ds_gguf_model_tensor_of(const ds_gguf_model *m, const char *hf, int *qk_heads);
/* The GGUF model of a source opened from a GGUF file, NULL for a directory (model_source.c). */
const ds_gguf_model *ds_model_source_gguf(const ds_model_source *s);
/* The weights as a target holding them under ds_target_weights() reads them: a GGUF's image in
 * bf16 under DS_WEIGHTS_BF16 (else fp32, as ds_model_source_weights), its tensors named in skip
 * left unconverted and, with keep16, its F16 / BF16 matrices in their dtype (above); a
 * directory's checkpoint is opened as ds_model_source_weights opens it. */
ds_status ds_model_source_weights_except(ds_model_source *s, const char *const *skip, int n_skip, int keep16,
                                         ds_checkpoint **out);

#endif
