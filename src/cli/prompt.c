/* See prompt.h. */
#include "cli/prompt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "dspark/fileio.h"
#include "text/chat_json.h"
#include "text/json_text.h"

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

static int has_suffix_ci(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  if (a < b) return 0;
  for (size_t i = 0; i < b; i++) {
    char c = s[a - b + i];
    if ((c >= 'A' && c <= 'Z' ? c + 32 : c) != suffix[i]) return 0;
  }
  return 1;
}

/* One JSONL line: messages (the assistant prompt appended) or a prompt text. */
static ds_status json_prompt(const ds_tokenizer *tok, const cli_chat *cc, const char *line, size_t len,
                             const char *path, int lineno, int chat, ds_ids *ids) {
  char label[600];
  snprintf(label, sizeof label, "%s:%d", path, lineno);
  ds_status st = DS_OK;
  cJSON *j = tk_json_parse_text(line, len, label, &st);
  if (!j) return st;
  const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(j, "messages");
  const cJSON *conv = cJSON_GetObjectItemCaseSensitive(j, "conversations");
  const cJSON *text = cJSON_GetObjectItemCaseSensitive(j, "prompt");
  if (cJSON_IsArray(msgs) || cJSON_IsArray(conv)) { /* OpenAI messages or ShareGPT, as the training data */
    ds_chat_message *m = NULL;
    size_t k = 0;
    st = cJSON_IsArray(msgs) ? tk_chat_messages(msgs, label, &m, &k)
                             : tk_chat_sharegpt(conv, cJSON_GetObjectItemCaseSensitive(j, "system"), label, &m, &k);
    if (st == DS_OK && k > 0 && !strcmp(m[k - 1].role, "assistant")) k--; /* the answer is what gets generated */
    ds_ids mask = {0};
    ds_chat_options opt = {1, cc ? cc->enable_thinking : -1};
    if (st == DS_OK) st = ds_chat_encode(tok, cc ? cc->tmpl : NULL, m, k, &opt, ids, &mask);
    ds_ids_free(&mask);
    free(m);
  } else if (cJSON_IsString(text)) {
    st = cli_prompt_ids(tok, cc, text->valuestring, NULL, 0, chat, ids);
  } else {
    st = DS_FAIL(DS_ERR_FORMAT, "%s:%d: expected {\"messages\": [...]}, {\"conversations\": [...]} or {\"prompt\": TEXT}",
                 path, lineno);
  }
  cJSON_Delete(j);
  return st;
}

ds_status cli_read_prompts(const ds_tokenizer *tok, const cli_chat *cc, const char *path, int chat, cli_prompts *out) {
  memset(out, 0, sizeof *out);
  char *text;
  size_t len;
  DS_TRY(ds_read_file(path, &text, &len));
  int jsonl = has_suffix_ci(path, ".jsonl") || has_suffix_ci(path, ".ndjson");
  ds_status st = DS_OK;
  int lineno = 0;
  for (char *line = text; st == DS_OK && line < text + len;) {
    char *nl = memchr(line, '\n', (size_t)(text + len - line));
    size_t full = nl ? (size_t)(nl - line) : (size_t)(text + len - line), l = full;
    lineno++;
    if (l > 0 && line[l - 1] == '\r') l--;
    if (l > 0) {
      ds_ids *v = realloc(out->v, (size_t)(out->n + 1) * sizeof *v);
      if (!v) { st = DS_FAIL(DS_ERR_NOMEM, "out of memory"); break; }
      out->v = v;
      memset(&out->v[out->n], 0, sizeof *out->v);
      char save = line[l];
      line[l] = 0;
      st = jsonl ? json_prompt(tok, cc, line, l, path, lineno, chat, &out->v[out->n])
                 : cli_prompt_ids(tok, cc, line, NULL, 0, chat, &out->v[out->n]);
      line[l] = save;
      if (st == DS_OK && out->v[out->n].len == 0) st = DS_FAIL(DS_ERR_FORMAT, "%s:%d: the prompt has no tokens", path, lineno);
      out->n++;
    }
    line += full + (nl ? 1 : 0);
  }
  free(text);
  if (st == DS_OK && out->n == 0) st = DS_FAIL(DS_ERR_FORMAT, "%s: no prompt in the file", path);
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

ds_status cli_load_chat_template(const char *tok_path, const char *override_path, cli_chat *cc) {
  DS_TRY(ds_chat_template_load(tok_path, override_path, &cc->tmpl));
  if (!cc->tmpl)
    fprintf(stderr, "dspark: note: no chat template beside %s (chat_template.jinja or tokenizer_config.json's "
                    "chat_template): chat prompts are rendered with ChatML\n", tok_path);
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
