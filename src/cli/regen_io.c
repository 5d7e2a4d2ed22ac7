/* See regen_io.h. */
#include "cli/regen_io.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dspark/fileio.h"
#include "dspark/progress.h"
#include "text/chat_json.h"
#include "text/json_text.h"

static int has_suffix_ci(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  if (a < b) return 0;
  for (size_t i = 0; i < b; i++) {
    char c = s[a - b + i];
    if ((c >= 'A' && c <= 'Z' ? c + 32 : c) != suffix[i]) return 0;
  }
  return 1;
}

static int is_blank(const char *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != ' ' && p[i] != '\t' && p[i] != '\r') return 0;
  return 1;
}

/* A user turn {"role": "user", "content": text}. */
static cJSON *user_turn(const char *text) {
  cJSON *m = cJSON_CreateObject();
  if (m && (!cJSON_AddStringToObject(m, "role", "user") || !cJSON_AddStringToObject(m, "content", text))) {
    cJSON_Delete(m);
    return NULL;
  }
  return m;
}

/* Replaces obj's member `key` by a member `name` holding item, at the same place. */
static void replace_member(cJSON *obj, const char *key, const char *name, cJSON *item) {
  cJSON *old = cJSON_GetObjectItemCaseSensitive(obj, key);
  char *k = strdup(name);
  free(item->string);
  item->string = k;
  cJSON_ReplaceItemViaPointer(obj, old, item);
}

ds_status regen_conversation_from_line(const regen_input *in, int64_t k, cJSON **out) {
  *out = NULL;
  const regen_line *l = &in->v[k];
  const char *p = in->buf + l->off;
  char label[1100];
  snprintf(label, sizeof label, "%s:%lld", in->path, (long long)l->line);
  size_t n = l->len;
  if (n > 0 && p[n - 1] == '\r') n--;
  if (!in->jsonl) { /* a plain-text prompt */
    char *text = strndup(p, n);
    cJSON *o = text ? cJSON_CreateObject() : NULL, *item = NULL;
    if (o && in->completion) item = cJSON_AddStringToObject(o, "text", text);
    else if (o && (item = cJSON_AddArrayToObject(o, "messages"))) {
      cJSON *u = user_turn(text);
      if (!u) item = NULL;
      else cJSON_AddItemToArray(item, u);
    }
    free(text);
    if (!item) {
      cJSON_Delete(o);
      return DS_FAIL(DS_ERR_NOMEM, "%s: out of memory", label);
    }
    *out = o;
    return DS_OK;
  }
  if (tk_json_find_nul(p, n) < n) /* cJSON cannot write such a string back */
    return DS_FAIL(DS_ERR_FORMAT, "%s: a string holds \\u0000, which the output cannot keep", label);
  ds_status st = DS_OK;
  cJSON *o = tk_json_parse_text(p, n, label, &st);
  if (!o) return st;
  if (!cJSON_IsObject(o)) {
    cJSON_Delete(o);
    return DS_FAIL(DS_ERR_FORMAT, "%s: expected a JSON object", label);
  }
  const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(o, "messages");
  const char *key = cJSON_IsString(cJSON_GetObjectItemCaseSensitive(o, "prompt")) ? "prompt"
                    : cJSON_IsString(cJSON_GetObjectItemCaseSensitive(o, "text")) ? "text" : NULL;
  if (in->completion) {
    if (!key) st = DS_FAIL(DS_ERR_FORMAT, "%s: --completion expects {\"text\": PROMPT} or {\"prompt\": PROMPT}", label);
    else if (!strcmp(key, "prompt")) {
      if (cJSON_GetObjectItemCaseSensitive(o, "text"))
        st = DS_FAIL(DS_ERR_FORMAT, "%s: both \"prompt\" and \"text\": which one is the prompt?", label);
      else
        replace_member(o, "prompt", "text", cJSON_CreateString(cJSON_GetObjectItemCaseSensitive(o, "prompt")->valuestring));
    }
  } else if (msgs) {
    ds_chat_message *m = NULL;
    size_t nm = 0;
    st = tk_chat_messages(msgs, label, &m, &nm); /* role and content strings, reasoning fields */
    free(m);
  } else if (key) {
    cJSON *arr = cJSON_CreateArray(), *u = user_turn(cJSON_GetObjectItemCaseSensitive(o, key)->valuestring);
    if (!arr || !u) {
      cJSON_Delete(arr);
      cJSON_Delete(u);
      st = DS_FAIL(DS_ERR_NOMEM, "%s: out of memory", label);
    } else {
      cJSON_AddItemToArray(arr, u);
      replace_member(o, key, "messages", arr);
    }
  } else {
    st = DS_FAIL(DS_ERR_FORMAT, "%s: expected {\"messages\": [...]}, {\"prompt\": TEXT} or {\"text\": TEXT}", label);
  }
  if (st != DS_OK) {
    cJSON_Delete(o);
    return st;
  }
  *out = o;
  return DS_OK;
}

ds_status regen_input_read(const char *path, int completion, int skip_bad, regen_input *in) {
  memset(in, 0, sizeof *in);
  in->path = path;
  in->completion = completion;
  in->skip_bad = skip_bad;
  in->jsonl = has_suffix_ci(path, ".jsonl") || has_suffix_ci(path, ".ndjson");
  DS_TRY(ds_read_file(path, &in->buf, &in->len));
  size_t at = in->len >= 3 && !memcmp(in->buf, "\xEF\xBB\xBF", 3) ? 3 : 0; /* a UTF-8 BOM */
  int64_t line = 0, cap = 0;
  ds_status st = DS_OK;
  while (st == DS_OK && at < in->len) {
    const char *p = in->buf + at, *nl = memchr(p, '\n', in->len - at);
    size_t n = nl ? (size_t)(nl - p) : in->len - at;
    line++;
    if (!is_blank(p, n)) {
      if (in->n == cap) {
        cap = cap ? 2 * cap : 1024;
        regen_line *v = realloc(in->v, (size_t)cap * sizeof *v);
        if (!v) { st = DS_FAIL(DS_ERR_NOMEM, "%s: out of memory for %lld lines", path, (long long)cap); break; }
        in->v = v;
      }
      in->v[in->n++] = (regen_line){at, n, line};
      cJSON *o = NULL;
      st = regen_conversation_from_line(in, in->n - 1, &o);
      cJSON_Delete(o);
      if (st != DS_OK && st != DS_ERR_NOMEM && skip_bad) {
        ds_note("regenerate: %s; line skipped (--skip-bad-lines)", ds_last_error());
        ds_error_clear();
        st = DS_OK;
        in->n--;
        in->bad++;
      }
    }
    at += n + (nl ? 1 : 0);
  }
  if (st == DS_OK && in->n == 0) st = DS_FAIL(DS_ERR_FORMAT, "%s: no conversation in the file", path);
  if (st != DS_OK) regen_input_free(in);
  return st;
}

void regen_input_free(regen_input *in) {
  free(in->buf);
  free(in->v);
  memset(in, 0, sizeof *in);
}

static int is_assistant(const cJSON *m) {
  const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
  return cJSON_IsString(role) && !strcmp(role->valuestring, "assistant");
}

int regen_turns(const cJSON *obj, int completion) {
  if (completion) return 1;
  const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(obj, "messages"), *m, *last = NULL;
  int n = 0;
  cJSON_ArrayForEach(m, msgs) {
    n += is_assistant(m);
    last = m;
  }
  return n + (last && !is_assistant(last));
}

/* obj without what regeneration writes: "regenerated", and the assistant messages (chat) or
 * the text (completion). */
static cJSON *skeleton(const cJSON *obj, int completion) {
  cJSON *s = cJSON_Duplicate(obj, 1);
  if (!s) return NULL;
  cJSON_DeleteItemFromObjectCaseSensitive(s, "regenerated");
  if (completion) {
    cJSON_DeleteItemFromObjectCaseSensitive(s, "text");
    return s;
  }
  cJSON *msgs = cJSON_GetObjectItemCaseSensitive(s, "messages");
  for (int i = cJSON_GetArraySize(msgs) - 1; i >= 0; i--)
    if (is_assistant(cJSON_GetArrayItem(msgs, i))) cJSON_DeleteItemFromArray(msgs, i);
  return s;
}

/* Why output line `got` is not a regeneration of input conversation `want` (NULL: it is). */
static const char *mismatch(const cJSON *want, const cJSON *got, int completion) {
  if (completion) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(want, "text"), *b = cJSON_GetObjectItemCaseSensitive(got, "text");
    if (!cJSON_IsString(b) || strncmp(b->valuestring, a->valuestring, strlen(a->valuestring)))
      return "its \"text\" does not start with the prompt";
  } else {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(got, "messages"), *m;
    int n = 0;
    cJSON_ArrayForEach(m, msgs) n += is_assistant(m);
    if (!cJSON_IsArray(msgs) || n != regen_turns(want, 0)) return "its assistant turns are not the conversation's";
  }
  cJSON *a = skeleton(want, completion), *b = skeleton(got, completion);
  int same = a && b && cJSON_Compare(a, b, 1);
  cJSON_Delete(a);
  cJSON_Delete(b);
  return same ? NULL : completion ? "its other fields differ" : "its messages or other fields differ";
}

/* Checks output line j (text[0..n)) against the input; *k: the conversation index after the
 * previous line's, updated to this line's. */
static ds_status check_line(const char *out_path, int64_t j, const char *text, size_t n, const regen_input *in,
                            const char *settings, int64_t *k) {
  char label[1100];
  snprintf(label, sizeof label, "%s:%lld", out_path, (long long)j);
  static const char k_hint[] = "regenerate into another --out, or delete it to start over";
  ds_status st = DS_OK;
  cJSON *o = tk_json_parse_text(text, n, label, &st);
  if (!o) return ds_error_wrap(st, "%s is not a `dspark regenerate` output (%s)", out_path, k_hint);
  const cJSON *r = cJSON_GetObjectItemCaseSensitive(o, "regenerated");
  const cJSON *line = cJSON_GetObjectItemCaseSensitive(r, "source_line");
  const cJSON *set = cJSON_GetObjectItemCaseSensitive(r, "settings");
  if (!cJSON_IsNumber(line) || !cJSON_IsString(set)) {
    st = DS_FAIL(DS_ERR_FORMAT, "%s: no \"regenerated\": {\"source_line\", \"settings\"}: not a `dspark regenerate` "
                 "output line (%s)", label, k_hint);
  } else if (strcmp(set->valuestring, settings)) {
    st = DS_FAIL(DS_ERR_FORMAT, "%s: written with other settings (%s, this run %s: target template, sampling, "
                 "--max-new-tokens, --thinking or --completion differ); %s", label, set->valuestring, settings, k_hint);
  } else {
    while (*k < in->n && in->v[*k].line < (int64_t)line->valuedouble) ++*k;
    if (*k == in->n || in->v[*k].line != (int64_t)line->valuedouble) {
      st = DS_FAIL(DS_ERR_FORMAT, "%s: source_line %.0f is not a conversation of %s after the previous line's; %s",
                   label, line->valuedouble, in->path, k_hint);
    } else {
      cJSON *want = NULL;
      st = regen_conversation_from_line(in, *k, &want);
      const char *why = st == DS_OK ? mismatch(want, o, in->completion) : NULL;
      if (why)
        st = DS_FAIL(DS_ERR_FORMAT, "%s does not continue from %s:%lld: %s; %s", label, in->path,
                     (long long)in->v[*k].line, why, k_hint);
      cJSON_Delete(want);
      ++*k;
    }
  }
  cJSON_Delete(o);
  return st;
}

ds_status regen_resume_scan(const char *out_path, const regen_input *in, const char *settings, int64_t *next,
                            int64_t *lines) {
  *next = 0;
  *lines = 0;
  int exists = 0;
  DS_TRY(ds_path_probe(out_path, &exists));
  if (!exists) return DS_OK;
  char *text = NULL;
  size_t len = 0;
  DS_TRY(ds_read_file(out_path, &text, &len));
  size_t complete = len;
  while (complete > 0 && text[complete - 1] != '\n') complete--;
  ds_status st = DS_OK;
  int64_t k = 0, j = 0;
  for (size_t at = 0; st == DS_OK && at < complete;) {
    const char *nl = memchr(text + at, '\n', complete - at);
    size_t n = (size_t)(nl - (text + at));
    st = check_line(out_path, ++j, text + at, n, in, settings, &k);
    at += n + 1;
  }
  free(text);
  if (st != DS_OK) return st;
  if (complete < len) {
    ds_note("regenerate: %s: cutting off a torn last line (%zu bytes without a newline: a killed run); it is "
            "regenerated", out_path, len - complete);
    if (truncate(out_path, (off_t)complete) != 0)
      return DS_FAIL(DS_ERR_IO, "%s: cannot cut off the torn last line: %s", out_path, strerror(errno));
  }
  *next = k;
  *lines = j;
  return DS_OK;
}
