/* Prompts of the decoding stage (dspark/prompts.h). */
#include "dspark/prompts.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/dataset.h"
#include "dspark/progress.h"

ds_status ds_prompt_chat_load(ds_model_source *src, const char *override_path, ds_prompt_chat *cc) {
  DS_TRY(ds_model_source_chat_template(src, override_path, &cc->tmpl));
  if (!cc->tmpl)
    ds_note("dspark: note: no chat template for %s (chat_template.jinja or tokenizer_config.json's "
            "chat_template): chat prompts are rendered with ChatML", ds_model_source_path(src));
  return DS_OK;
}

ds_status ds_prompt_render(const ds_tokenizer *tok, const ds_chat_template *tmpl, const ds_chat_message *m, size_t n,
                           int enable_thinking, ds_ids *ids) {
  ds_ids mask = {0};
  ds_chat_options opt = {1, enable_thinking};
  ds_status st = ds_chat_encode(tok, tmpl, m, n, &opt, ids, &mask);
  ds_ids_free(&mask);
  return st;
}

/* A text prompt: tokenized with special tokens, or with chat as a user turn followed by the
 * assistant prompt. text may hold NULs (a JSON "\u0000"), hence its length. */
static ds_status text_prompt(const ds_tokenizer *tok, const ds_prompt_chat *cc, const char *text, size_t len, int chat,
                             ds_ids *ids) {
  if (!chat) return ds_tokenizer_encode(tok, text, len, 1, ids);
  ds_chat_message msg = {.role = "user", .content = text, .content_len = len};
  return ds_prompt_render(tok, cc ? cc->tmpl : NULL, &msg, 1, cc ? cc->enable_thinking : -1, ids);
}

ds_status ds_prompt_ids(const ds_tokenizer *tok, const ds_prompt_chat *cc, const char *prompt, const int32_t *given,
                        int64_t n_given, int chat, ds_ids *ids) {
  if (given) {
    for (int64_t i = 0; i < n_given; i++) DS_TRY(ds_ids_push(ids, given[i]));
    return DS_OK;
  }
  return text_prompt(tok, cc, prompt, strlen(prompt), chat, ids);
}

/* One record of the data: a conversation (a final assistant turn left out, since the answer is
 * what gets generated, and the assistant prompt added) or a text. */
static ds_status record_prompt(const ds_tokenizer *tok, const ds_prompt_chat *cc, const ds_data_record *rec, int chat,
                               ds_ids *ids) {
  if (!rec->messages) return text_prompt(tok, cc, rec->text, rec->text_len, chat, ids);
  size_t k = rec->n_messages;
  if (k > 0 && !strcmp(rec->messages[k - 1].role, "assistant")) k--;
  return ds_prompt_render(tok, cc ? cc->tmpl : NULL, rec->messages, k, cc ? cc->enable_thinking : -1, ids);
}

ds_status ds_prompt_batch_read(const ds_tokenizer *tok, const ds_prompt_chat *cc, const char *path, int chat,
                               size_t max_line_bytes, ds_prompt_batch *out) {
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
  if (st != DS_OK) ds_prompt_batch_free(out);
  return st;
}

void ds_prompt_batch_free(ds_prompt_batch *p) {
  for (int i = 0; i < p->n; i++) ds_ids_free(&p->v[i]);
  free(p->v);
  memset(p, 0, sizeof *p);
}
