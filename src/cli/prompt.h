/* The command line's side of prompts: the chat options of argv and the output on stdout. The
 * prompts themselves (--prompt-ids, --prompt, --chat, --data) are the decoding stage's
 * (dspark/prompts.h). */
#ifndef DSPARK_CLI_PROMPT_H
#define DSPARK_CLI_PROMPT_H

#include "dspark/tokenizer.h"

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
