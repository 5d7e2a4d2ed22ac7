/* libFuzzer target for the chat-template interpreter: the input is a template's text. A
 * template that parses is rendered over a fixed conversation (system, user, an assistant turn
 * with reasoning, a final user turn), with add_generation_prompt and enable_thinking taken
 * from the input's length, and with the loss mask. Any outcome but a crash, a hang past the
 * interpreter's limits or an error without "fuzz:LINE" in its message is a finding. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/chat_template.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ds_chat_template *t = NULL;
  if (ds_chat_template_parse((const char *)data, size, "fuzz", &t) != DS_OK) {
    if (!strstr(ds_last_error(), "fuzz:")) abort();
    return 0;
  }
  if (ds_chat_template_set_var(t, "bos_token", "<s>") != DS_OK || ds_chat_template_set_var(t, "eos_token", "</s>") != DS_OK)
    abort();
  ds_chat_message msgs[] = {{.role = "system", .content = "sys"},
                            {.role = "user", .content = "hi"},
                            {.role = "assistant", .content = "<think>\nr\n</think>\n\nyo", .reasoning = "why"},
                            {.role = "user", .content = "and?"}};
  ds_chat_options opt = {(int)(size & 1), (int)(size >> 1) % 3 - 1};
  char *text = NULL;
  uint8_t *train = NULL;
  size_t len = 0;
  if (ds_chat_template_render(t, msgs, 4, &opt, &text, &len, &train) == DS_OK) {
    if (!text || !train || strlen(text) > len) abort();
    for (size_t i = 0; i < len; i++)
      if (train[i] > 1) abort();
  } else if (!strstr(ds_last_error(), "fuzz:")) {
    abort();
  }
  free(text);
  free(train);
  ds_chat_template_free(t);
  return 0;
}
