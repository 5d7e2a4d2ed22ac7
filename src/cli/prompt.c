/* See prompt.h. */
#include "cli/prompt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

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

void cli_print_result(const ds_tokenizer *tok, int print_ids, const int32_t *ids, int64_t n) {
  if (print_ids) {
    for (int64_t i = 0; i < n; i++) printf("%s%d", i ? " " : "", ids[i]);
    return;
  }
  char *text = NULL;
  size_t len = 0;
  if (ds_tokenizer_decode(tok, ids, (size_t)n, 1, &text, &len) != DS_OK) return;
  cJSON *s = cJSON_CreateString(text);
  char *out = s ? cJSON_PrintUnformatted(s) : NULL;
  if (out) fputs(out, stdout);
  free(out);
  cJSON_Delete(s);
  free(text);
}

int cli_chat_option(const char *cmd, int argc, char **argv, int *i, const char **template_path, int *enable_thinking) {
  const char *a = argv[*i];
  int is_template = !strcmp(a, "--chat-template");
  if (!is_template && strcmp(a, "--enable-thinking")) return 0;
  if (*i + 1 >= argc) {
    fprintf(stderr, "dspark %s: %s needs a value\n", cmd, a);
    return -1;
  }
  const char *v = argv[++*i];
  if (is_template) {
    *template_path = v;
  } else if (!strcmp(v, "on") || !strcmp(v, "off")) {
    *enable_thinking = !strcmp(v, "on");
  } else {
    fprintf(stderr, "dspark %s: --enable-thinking takes on or off, not '%s'\n", cmd, v);
    return -1;
  }
  return 1;
}
