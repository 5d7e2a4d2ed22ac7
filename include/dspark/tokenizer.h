/* Byte-level BPE tokenizer loaded from a HF tokenizer.json, and the ChatML chat template.
 *
 * Supported (anything else is refused with an error naming the field):
 *   model.type "BPE" with byte_level vocabulary (GPT-2 byte-to-unicode alphabet), merges as
 *   "a b" strings or [a, b] pairs, ignore_merges;
 *   pre_tokenizer: ByteLevel (GPT-2 regex when use_regex), or Sequence of Split(Regex, Isolated
 *   / Removed...) + ByteLevel(use_regex=false) as used by Qwen2/Qwen3 and Llama-3;
 *   normalizer: null or NFC (NFC only when the text is already NFC-stable... see below);
 *   added_tokens (special or not) matched before pre-tokenization, honouring lstrip/rstrip/
 *   single_word/normalized flags as HF does;
 *   post_processor: null, ByteLevel, TemplateProcessing (adds e.g. BOS) or Sequence of them;
 *   decoder: ByteLevel. */
#ifndef DSPARK_TOKENIZER_H
#define DSPARK_TOKENIZER_H

#include "dspark/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds_tokenizer ds_tokenizer;

typedef struct {
  int32_t *ids;
  size_t len, cap;
} ds_ids;

void ds_ids_free(ds_ids *v);
ds_status ds_ids_push(ds_ids *v, int32_t id);

ds_status ds_tokenizer_load(const char *path, ds_tokenizer **out);
ds_status ds_tokenizer_load_memory(const char *json, size_t len, const char *label, ds_tokenizer **out);
void ds_tokenizer_free(ds_tokenizer *tok);

/* Appends the ids of text to out. add_special: apply the post-processor (BOS etc.) as HF's
 * encode(text, add_special_tokens=True) does. Added/special tokens in the text are always
 * recognised, as in HF. */
ds_status ds_tokenizer_encode(const ds_tokenizer *tok, const char *text, size_t len, int add_special,
                              ds_ids *out);
/* Decodes ids to UTF-8 (bytes invalid as UTF-8 become U+FFFD as HF does). skip_special drops
 * special added tokens. *out is malloc'd and NUL-terminated. */
ds_status ds_tokenizer_decode(const ds_tokenizer *tok, const int32_t *ids, size_t n, int skip_special,
                              char **out, size_t *out_len);

int64_t ds_tokenizer_vocab_size(const ds_tokenizer *tok); /* max id + 1, added tokens included */
int32_t ds_tokenizer_token_to_id(const ds_tokenizer *tok, const char *token); /* -1 if absent */
const char *ds_tokenizer_id_to_token(const ds_tokenizer *tok, int32_t id);   /* NULL if absent */

/* ChatML (Qwen): "<|im_start|>{role}\n{content}<|im_end|>\n" per message, plus
 * "<|im_start|>assistant\n" when add_generation_prompt. loss_mask[i] = 1 for the tokens of
 * an assistant message's content and its "<|im_end|>\n" closing, 0 elsewhere. */
typedef struct {
  const char *role;    /* "system", "user", "assistant", ... */
  const char *content;
} ds_chat_message;

ds_status ds_chat_encode_chatml(const ds_tokenizer *tok, const ds_chat_message *msgs, size_t n,
                                int add_generation_prompt, ds_ids *ids, ds_ids *loss_mask);

#ifdef __cplusplus
}
#endif
#endif
