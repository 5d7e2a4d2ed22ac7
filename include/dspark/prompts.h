/* The prompts of the decoding stage, built one way for `generate`, `speculate`, `calibrate` and
 * regeneration so their outputs compare token for token: ids as given, a text tokenized with
 * special tokens (the tokenizer's template), or with chat a user turn followed by the assistant
 * prompt, rendered by the target's chat template (ds_prompt_chat; ChatML when it has none); and
 * a batch of them read from a data file by the training data's reader. */
#ifndef DSPARK_PROMPTS_H
#define DSPARK_PROMPTS_H

#include "dspark/chat_template.h"
#include "dspark/model_source.h"
#include "dspark/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How chat prompts are rendered: the template (NULL: ChatML; the caller frees it with
 * ds_chat_template_free) and enable_thinking as in ds_chat_options (-1: not passed). */
typedef struct {
  ds_chat_template *tmpl;
  int enable_thinking;
} ds_prompt_chat;

/* cc->tmpl: override_path, else the model's chat template (ds_model_source_chat_template); NULL
 * means ChatML, which is said in a note on stderr. cc->enable_thinking is left as it is. */
ds_status ds_prompt_chat_load(ds_model_source *src, const char *override_path, ds_prompt_chat *cc);

/* Appends the ids of messages m[0..n) rendered by tmpl (NULL: ChatML) with the assistant
 * prompt after them (the prompt of the next assistant turn); enable_thinking as in
 * ds_chat_options. */
ds_status ds_prompt_render(const ds_tokenizer *tok, const ds_chat_template *tmpl, const ds_chat_message *m, size_t n,
                           int enable_thinking, ds_ids *ids);

/* Appends one prompt's ids to ids: given[0..n_given) when given is not NULL (tok may then be
 * NULL), else prompt tokenized with special tokens, or with chat as a user turn (cc may be NULL:
 * ChatML, enable_thinking not passed). */
ds_status ds_prompt_ids(const ds_tokenizer *tok, const ds_prompt_chat *cc, const char *prompt, const int32_t *given,
                        int64_t n_given, int chat, ds_ids *ids);

/* Prompts of a batch from PATH, read by the training data's reader (ds_data_reader: a file,
 * directory or glob, plain / .gz / .zst, lines bounded by max_line_bytes, 0: the default): a
 * JSONL line holds {"messages": [...]} or ShareGPT {"conversations": [...]} (rendered with cc;
 * a final assistant turn is left out and the assistant prompt added) or {"text": TEXT} /
 * {"prompt": TEXT}; a plain-text file holds one prompt per non-blank line. A text is tokenized
 * like ds_prompt_ids' prompt, or as a user turn with chat. Errors name the file and the line;
 * data without a prompt is an error. */
typedef struct {
  ds_ids *v; /* [n] */
  int n;
} ds_prompt_batch;
ds_status ds_prompt_batch_read(const ds_tokenizer *tok, const ds_prompt_chat *cc, const char *path, int chat,
                               size_t max_line_bytes, ds_prompt_batch *out);
void ds_prompt_batch_free(ds_prompt_batch *p);

#ifdef __cplusplus
}
#endif
#endif
