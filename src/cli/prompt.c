/* See prompt.h. */
#include "cli/prompt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ds_status cli_prompt_ids(const ds_tokenizer *tok, const char *prompt, const int32_t *given, int64_t n_given, int chat,
                         ds_ids *ids) {
  if (given) {
    for (int64_t i = 0; i < n_given; i++) DS_TRY(ds_ids_push(ids, given[i]));
    return DS_OK;
  }
  if (chat) {
    ds_ids mask = {0};
    ds_chat_message msg = {"user", prompt, 0};
    ds_status st = ds_chat_encode_chatml(tok, &msg, 1, 1, ids, &mask);
    ds_ids_free(&mask);
    return st;
  }
  return ds_tokenizer_encode(tok, prompt, strlen(prompt), 1, ids);
}

/* Prints the newly completed text of ids[0..n): decodes everything and emits the suffix past
 * what was printed, holding back an incomplete UTF-8 tail (decoded as U+FFFD). */
void cli_print_text(const ds_tokenizer *tok, const int32_t *ids, size_t n, size_t *printed, int final) {
  char *text;
  size_t len;
  if (ds_tokenizer_decode(tok, ids, n, 1, &text, &len) != DS_OK) return;
  int held = !final && len >= 3 && !memcmp(text + len - 3, "\xEF\xBF\xBD", 3);
  if (!held && len > *printed) {
    fwrite(text + *printed, 1, len - *printed, stdout);
    fflush(stdout);
    *printed = len;
  }
  free(text);
}


void cli_stream_token(void *user, const int32_t *ids, int64_t n) {
  cli_stream *s = user;
  if (s->print_ids) printf("%s%d", n > 1 ? " " : "", ids[n - 1]);
  else cli_print_text(s->tok, ids, (size_t)n, &s->printed, 0);
  fflush(stdout);
}
