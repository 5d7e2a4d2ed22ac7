/* Byte-level BPE tokenizer loaded from a HF tokenizer.json, and the ChatML chat template.
 * Ids are identical to HF tokenizers' Tokenizer.encode() (checked on real text by
 * tests/conformance/test_tokenizer.py).
 *
 * Supported (anything else is refused with an error naming the file and JSON field):
 *   model.type "BPE" with a byte-level vocabulary (GPT-2 byte-to-unicode alphabet), merges as
 *   "a b" strings or [a, b] pairs, ignore_merges; unk_token / byte_fallback only when every
 *   byte has a token (they can then never apply); continuing_subword_prefix and
 *   end_of_word_suffix null or ""; dropout null or 0;
 *   pre_tokenizer: ByteLevel (add_prefix_space; the GPT-2 regex when use_regex), or a Sequence
 *   of Split (Regex or String pattern, every behavior, invert) ending with ByteLevel, as in
 *   Qwen2/Qwen3, Llama-3, o200k or DeepSeek. Patterns run on PCRE2, translated so that every
 *   class (\p{..} of general categories, \s \d \w \h, \b, inside [...] or not) matches
 *   exactly what HF's Oniguruma matches with its Unicode 16 tables; other properties (\p{Han}),
 *   POSIX brackets, \X and \p{..} under (?i) are refused naming the class;
 *   normalizer: null, NFC, or a Sequence of NFC (Qwen2): an exact NFC with HF's Unicode
 *   tables; text that is already NFC (the quick check) is not copied;
 *   added_tokens (special or not) matched leftmost-longest before pre-tokenization, with
 *   HF's lstrip / rstrip / single_word / normalized semantics; their ids are the ones HF
 *   assigns, and a file stating other ids is refused;
 *   post_processor: null, ByteLevel, TemplateProcessing (single: e.g. Llama-3's
 *   <|begin_of_text|>) or a Sequence of them;
 *   decoder: ByteLevel.
 * Ignored: truncation and padding (encode always returns every id), offsets. Refused: a
 * tokenizer.json string holding \u0000 (cJSON would cut it there).
 * Differences from HF, on purpose: text that is not valid UTF-8 is refused (HF takes only
 * str), and decoding an id outside the vocabulary is an error (HF silently drops it).
 *
 * A loaded ds_tokenizer is read-only: any number of threads may encode and decode with it
 * at once. */
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
/* label names the JSON in error messages (e.g. its path); NULL gives "tokenizer.json". */
ds_status ds_tokenizer_load_memory(const char *json, size_t len, const char *label, ds_tokenizer **out);
void ds_tokenizer_free(ds_tokenizer *tok);

/* Appends the ids of text (len bytes of UTF-8) to out. add_special: apply the post-processor
 * (BOS etc.) as HF's encode(text, add_special_tokens=True) does. Added/special tokens in the
 * text are always recognised, as in HF. On error out is left as it was. */
ds_status ds_tokenizer_encode(const ds_tokenizer *tok, const char *text, size_t len, int add_special,
                              ds_ids *out);
/* Decodes ids to UTF-8 as HF's decode(ids, skip_special_tokens) with the ByteLevel decoder:
 * the tokens' bytes are joined, then each ill-formed sequence becomes U+FFFD (as Rust's
 * from_utf8_lossy). skip_special drops special added tokens. *out is malloc'd and
 * NUL-terminated; *out_len (optional) excludes the NUL. An unknown id is DS_ERR_RANGE. */
ds_status ds_tokenizer_decode(const ds_tokenizer *tok, const int32_t *ids, size_t n, int skip_special,
                              char **out, size_t *out_len);

int64_t ds_tokenizer_vocab_size(const ds_tokenizer *tok); /* max id + 1, added tokens included */
int32_t ds_tokenizer_token_to_id(const ds_tokenizer *tok, const char *token); /* -1 if absent */
const char *ds_tokenizer_id_to_token(const ds_tokenizer *tok, int32_t id);   /* NULL if absent */
/* 1 when id is a special added token (the ones decode(skip_special) drops), else 0. */
int ds_tokenizer_is_special(const ds_tokenizer *tok, int32_t id);

/* ChatML (Qwen): "<|im_start|>{role}\n{content}<|im_end|>\n" per message, plus
 * "<|im_start|>assistant\n" when add_generation_prompt; the ids are those HF gives for the
 * rendered string (no post-processor). loss_mask[i] = 1 for the tokens of an assistant
 * message's content and its "<|im_end|>\n" closing, 0 elsewhere (a token that merges the
 * template's "\n" with a content starting with a newline counts as content). Appends to
 * ids and loss_mask (same length); DS_ERR_NOT_FOUND when the tokenizer lacks <|im_start|>
 * or <|im_end|>. */
typedef struct {
  const char *role;    /* "system", "user", "assistant", ... */
  const char *content;
  size_t content_len;  /* bytes of content, which may hold NULs; 0: strlen(content) */
  const char *reasoning; /* an assistant's reasoning_content (thinking); NULL when none */
  size_t reasoning_len;  /* as content_len */
} ds_chat_message;

ds_status ds_chat_encode_chatml(const ds_tokenizer *tok, const ds_chat_message *msgs, size_t n,
                                int add_generation_prompt, ds_ids *ids, ds_ids *loss_mask);

#ifdef __cplusplus
}
#endif
#endif
