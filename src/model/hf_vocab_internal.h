/* A Hugging Face directory's vocabulary as llama.cpp's converter reads it for a draft's
 * --target-model-dir (ds_hf_vocab_gguf, include/dspark/gguf_model.h). Three files share this:
 *   hf_vocab_load.c  the tokenizer as transformers (5.x, which the converter calls through
 *                    AutoTokenizer) builds it from the directory: its class, its added tokens
 *                    and their flags, its pipeline; loaded into our tokenizer;
 *   hf_vocab_pre.c   the pre-tokenizer's name, from the SHA-256 of the check text's ids;
 *   hf_vocab_gguf.c  the tokenizer.* keys: tokens and their types, merges, special ids and flags,
 *                    chat template, as convert_hf_to_gguf.py and gguf-py's SpecialVocab write them. */
#ifndef DSPARK_MODEL_HF_VOCAB_INTERNAL_H
#define DSPARK_MODEL_HF_VOCAB_INTERNAL_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "dspark/common.h"
#include "dspark/tokenizer.h"

/* The tokenizer class transformers instantiates: TokenizersBackend takes tokenizer.json as it
 * is; GPT2Tokenizer and Qwen2Tokenizer rebuild it from its vocabulary and merges with their own
 * normalizer and pre-tokenizer. */
typedef enum { HFV_BACKEND, HFV_GPT2, HFV_QWEN2 } hfv_class;

/* An added token (tokenizers' AddedToken) at its id. */
typedef struct {
  char *content;
  int64_t id;
  int special, normalized, lstrip, rstrip, single_word;
} hfv_added;

typedef struct {
  const char *dir;
  char *tok_path, *config_path, *tok_config_path; /* DIR/tokenizer.json, ... (messages) */
  cJSON *config;     /* config.json */
  cJSON *tok_json;   /* tokenizer.json; its pre-tokenizer, normalizer, decoder, model options and
                        added tokens replaced by the effective ones once loaded */
  cJSON *raw_added;  /* tokenizer.json's "added_tokens" as the file has them */
  cJSON *raw_post;   /* its "post_processor" (NULL when absent) */
  cJSON *raw_normalizer;
  cJSON *tok_config; /* tokenizer_config.json; NULL when the directory has none */
  int llama;         /* the target's architecture is LlamaForCausalLM (else Qwen2 / Qwen3) */
  hfv_class klass;
  const char *class_name;   /* in messages */
  const char **model_token; /* (model_ids) model.vocab's token of each id, NULL for a gap */
  int64_t model_ids, model_count; /* max id + 1; entries */
  hfv_added *added;         /* the effective added tokens, in id order */
  size_t n_added;
  ds_tokenizer *tok;        /* the effective tokenizer */
} hfv_dir;

ds_status hfv_open(const char *dir, hfv_dir *out);
void hfv_close(hfv_dir *h);
const hfv_added *hfv_added_at(const hfv_dir *h, int64_t id); /* NULL when id is not an added token */

/* The converter's tokenizer.ggml.pre for tok (the effective tokenizer): *pre points into a
 * static table; hex gets the digest. Unknown: DS_ERR_UNSUPPORTED naming label, klass and the
 * digest. */
ds_status hfv_pre_name(const ds_tokenizer *tok, const char *label, const char *klass, const char **pre,
                       char hex[65]);
size_t hfv_known_pre_count(void);

/* The SpecialVocab keys (ids, add_ flags, chat template, normalizer flags) into w. */
struct ds_gguf_writer;
ds_status hfv_put_special_vocab(struct ds_gguf_writer *w, const hfv_dir *h);

/* Python's truthiness of a JSON value (NULL: absent). */
int hfv_truthy(const cJSON *v);

#endif
