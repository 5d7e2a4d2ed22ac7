/* The prompt of `generate` and `speculate`, built one way for both so their outputs compare
 * token for token: --prompt-ids as given, --prompt tokenized with special tokens (the
 * tokenizer's template), or with --chat as a user turn followed by the assistant prompt,
 * rendered by the target's chat template tmpl (ChatML when NULL). */
#ifndef DSPARK_CLI_PROMPT_H
#define DSPARK_CLI_PROMPT_H

#include "dspark/chat_template.h"
#include "dspark/tokenizer.h"

/* ids receives the prompt; tok may be NULL when given is used. */
ds_status cli_prompt_ids(const ds_tokenizer *tok, const ds_chat_template *tmpl, const char *prompt, const int32_t *given,
                         int64_t n_given, int chat, ds_ids *ids);
/* Prompts of a batch from FILE: a .jsonl file holds one JSON object per line, either
 * {"messages": [{"role", "content"}, ...]} (rendered with tmpl; a final assistant turn is
 * left out and the assistant prompt added) or {"prompt": TEXT}; any other file holds one
 * plain-text prompt per line (tokenized like --prompt, or as a user turn with chat).
 * Empty lines are skipped. Errors name the file and the line. */
typedef struct {
  ds_ids *v;
  int n;
} cli_prompts;
ds_status cli_read_prompts(const ds_tokenizer *tok, const ds_chat_template *tmpl, const char *path, int chat,
                           cli_prompts *out);
void cli_prompts_free(cli_prompts *p);

/* The chat template beside the tokenizer at tok_path (see ds_chat_template_load); *out NULL
 * means ChatML, which is said on stderr. */
ds_status cli_load_chat_template(const char *tok_path, ds_chat_template **out);

/* The text of ids[0..n) on stdout; with final = 0 an incomplete UTF-8 tail is held back.
 * *printed counts the bytes already written (streaming). */
void cli_print_text(const ds_tokenizer *tok, const int32_t *ids, size_t n, size_t *printed, int final);

/* One request's output on one line (no newline): ids separated by spaces, or the text as a
 * JSON string (a batch's texts may hold newlines). */
void cli_print_result(const ds_tokenizer *tok, int print_ids, const int32_t *ids, int64_t n);

/* Streaming output of generated tokens: ids on one line (print_ids) or text as it completes. */
typedef struct {
  const ds_tokenizer *tok;
  int print_ids;
  size_t printed;
} cli_stream;
/* The on_token callback of ds_spec_options (user = a cli_stream). */
void cli_stream_token(void *user, const int32_t *ids, int64_t n);

#endif
