/* The prompt of `generate` and `speculate`, built one way for both so their outputs compare
 * token for token: --prompt-ids as given, --prompt tokenized with special tokens (the
 * tokenizer's template), or with --chat as a user turn followed by the assistant prompt,
 * rendered by the target's chat template (cli_chat; ChatML when it has none). */
#ifndef DSPARK_CLI_PROMPT_H
#define DSPARK_CLI_PROMPT_H

#include "dspark/chat_template.h"
#include "dspark/model_source.h"
#include "dspark/tokenizer.h"

/* ids receives the prompt; tok may be NULL when given is used. */
/* How chat prompts are rendered: the template (NULL: ChatML) and enable_thinking as in
 * ds_chat_options (-1: not passed). */
typedef struct {
  ds_chat_template *tmpl;
  int enable_thinking;
} cli_chat;

ds_status cli_prompt_ids(const ds_tokenizer *tok, const cli_chat *cc, const char *prompt, const int32_t *given,
                         int64_t n_given, int chat, ds_ids *ids);
/* Prompts of a batch from FILE, read by the training data's reader (ds_data_reader: a file,
 * directory or glob, plain / .gz / .zst, lines bounded by max_line_bytes, 0: the default): a
 * JSONL line holds {"messages": [...]} or ShareGPT {"conversations": [...]} (rendered with cc;
 * a final assistant turn is left out and the assistant prompt added) or {"text": TEXT} /
 * {"prompt": TEXT}; a plain-text file holds one prompt per non-blank line. A text is tokenized
 * like --prompt, or as a user turn with chat. Errors name the file and the line; data without
 * a prompt is an error. */
typedef struct {
  ds_ids *v;
  int n;
} cli_prompts;
ds_status cli_read_prompts(const ds_tokenizer *tok, const cli_chat *cc, const char *path, int chat,
                           size_t max_line_bytes, cli_prompts *out);
void cli_prompts_free(cli_prompts *p);

/* cc->tmpl: override_path, else the model's chat template (ds_model_source_chat_template); NULL
 * means ChatML, which is said on stderr. */
ds_status cli_load_chat_template(ds_model_source *src, const char *override_path, cli_chat *cc);
/* --chat-template FILE / --enable-thinking on|off at argv[*i]: 1 when taken (values stored,
 * *i advanced), 0 when argv[*i] is neither, -1 on a bad value (reported; a usage error). */
int cli_chat_option(const char *cmd, int argc, char **argv, int *i, const char **template_path, int *enable_thinking);

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
