/* See prompt.h. */
#include "cli/prompt.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "dspark/dataset.h"

ds_status cli_prompt_ids(const ds_tokenizer *tok, const cli_chat *cc, const char *prompt, const int32_t *given,
                         int64_t n_given, int chat, ds_ids *ids) {
  if (given) {
    for (int64_t i = 0; i < n_given; i++) DS_TRY(ds_ids_push(ids, given[i]));
    return DS_OK;
  }
  if (chat) {
    ds_ids mask = {0};
    ds_chat_message msg = {.role = "user", .content = prompt};
    ds_chat_options opt = {1, cc ? cc->enable_thinking : -1};
    ds_status st = ds_chat_encode(tok, cc ? cc->tmpl : NULL, &msg, 1, &opt, ids, &mask);
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

/* A text prompt: tokenized as --prompt (special tokens), or with chat as a user turn followed
 * by the assistant prompt. text may hold NULs (a JSON "\u0000"), hence its length. */
static ds_status text_prompt(const ds_tokenizer *tok, const cli_chat *cc, const char *text, size_t len, int chat,
                             ds_ids *ids) {
  if (!chat) return ds_tokenizer_encode(tok, text, len, 1, ids);
  ds_ids mask = {0};
  ds_chat_message msg = {.role = "user", .content = text, .content_len = len};
  ds_chat_options opt = {1, cc ? cc->enable_thinking : -1};
  ds_status st = ds_chat_encode(tok, cc ? cc->tmpl : NULL, &msg, 1, &opt, ids, &mask);
  ds_ids_free(&mask);
  return st;
}

/* One record of the data: a conversation (a final assistant turn left out, since the answer is
 * what gets generated, and the assistant prompt added) or a text. */
static ds_status record_prompt(const ds_tokenizer *tok, const cli_chat *cc, const ds_data_record *rec, int chat,
                               ds_ids *ids) {
  if (!rec->messages) return text_prompt(tok, cc, rec->text, rec->text_len, chat, ids);
  size_t k = rec->n_messages;
  if (k > 0 && !strcmp(rec->messages[k - 1].role, "assistant")) k--;
  ds_ids mask = {0};
  ds_chat_options opt = {1, cc ? cc->enable_thinking : -1};
  ds_status st = ds_chat_encode(tok, cc ? cc->tmpl : NULL, rec->messages, k, &opt, ids, &mask);
  ds_ids_free(&mask);
  return st;
}

ds_status cli_read_prompts(const ds_tokenizer *tok, const cli_chat *cc, const char *path, int chat,
                           size_t max_line_bytes, cli_prompts *out) {
  memset(out, 0, sizeof *out);
  /* the training data's reader: files, directories, globs, .gz / .zst, its bounds and errors */
  ds_data_options opt = {.format = DS_DATA_AUTO, .text_lines = 1, .prompt_field = 1, .max_line_bytes = max_line_bytes};
  ds_data_reader *r;
  DS_TRY(ds_data_reader_open(path, &opt, &r));
  ds_status st;
  ds_data_record rec;
  int got;
  while ((st = ds_data_reader_next(r, &rec, &got)) == DS_OK && got) {
    ds_ids *v = out->n < INT_MAX ? realloc(out->v, (size_t)(out->n + 1) * sizeof *v) : NULL;
    if (!v) {
      st = DS_FAIL(DS_ERR_NOMEM, "out of memory for %d prompts", out->n);
      break;
    }
    out->v = v;
    memset(&out->v[out->n], 0, sizeof *out->v);
    ds_ids *ids = &out->v[out->n++];
    st = record_prompt(tok, cc, &rec, chat, ids);
    if (st == DS_OK && ids->len == 0) st = DS_FAIL(DS_ERR_FORMAT, "the prompt has no tokens");
    if ((st = ds_data_reader_reject(r, st)) != DS_OK) break; /* "FILE:LINE: " before the error */
  }
  ds_data_reader_close(r);
  if (st != DS_OK) cli_prompts_free(out);
  return st;
}

void cli_prompts_free(cli_prompts *p) {
  for (int i = 0; i < p->n; i++) ds_ids_free(&p->v[i]);
  free(p->v);
  memset(p, 0, sizeof *p);
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

ds_status cli_load_chat_template(ds_model_source *src, const char *override_path, cli_chat *cc) {
  DS_TRY(ds_model_source_chat_template(src, override_path, &cc->tmpl));
  if (!cc->tmpl)
    fprintf(stderr, "dspark: note: no chat template for %s (chat_template.jinja or tokenizer_config.json's "
                    "chat_template): chat prompts are rendered with ChatML\n", ds_model_source_path(src));
  return DS_OK;
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
