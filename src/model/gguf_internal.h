/* Internal to the GGUF conversion (gguf_convert.c, gguf_tokenizer.c). */
#ifndef DSPARK_MODEL_GGUF_INTERNAL_H
#define DSPARK_MODEL_GGUF_INTERNAL_H

#include <cjson/cJSON.h>

#include "dspark/gguf.h"

/* tokenizer.ggml.{bos,eos,unknown,padding}_token_id, -1 when absent; each inside the vocabulary */
typedef struct {
  int64_t bos, eos, unk, pad;
  int add_bos; /* tokenizer.ggml.add_bos_token (0 when absent) */
} ds_gguf_special;

ds_status ds_gguf_special_tokens(const ds_gguf *g, int64_t vocab, ds_gguf_special *out);
/* j written to out_dir/name (atomically, indented). */
ds_status ds_gguf_write_json(const char *out_dir, const char *name, const cJSON *j);
/* tokenizer.json and tokenizer_config.json into out_dir. */
ds_status ds_gguf_write_tokenizer(const ds_gguf *g, const ds_gguf_special *sp, const char *out_dir);

#endif
