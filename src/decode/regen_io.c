/* See regen_io.h. */
#include "decode/regen_io.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dspark/dataset.h"
#include "dspark/fileio.h"
#include "dspark/progress.h"
#include "text/json_text.h"

/* A message {"role", "content"[, "reasoning_content"]} of the reader's. */
static cJSON *message_object(const ds_chat_message *m) {
  cJSON *o = cJSON_CreateObject();
  char *content = strndup(m->content ? m->content : "", m->content_len);
  char *reasoning = m->reasoning ? strndup(m->reasoning, m->reasoning_len) : NULL;
  int ok = o && content && (!m->reasoning || reasoning) && cJSON_AddStringToObject(o, "role", m->role) &&
           cJSON_AddStringToObject(o, "content", content) &&
           (!reasoning || cJSON_AddStringToObject(o, "reasoning_content", reasoning));
  free(content);
  free(reasoning);
  if (!ok) {
    cJSON_Delete(o);
    return NULL;
  }
  return o;
}

/* Replaces obj's member `key` by a member `name` holding item, at the same place. */
static void replace_member(cJSON *obj, const char *key, const char *name, cJSON *item) {
  cJSON *old = cJSON_GetObjectItemCaseSensitive(obj, key);
  char *k = strdup(name);
  free(item->string);
  item->string = k;
  cJSON_ReplaceItemViaPointer(obj, old, item);
}

/* Record rec as the object to write (see regen_io.h); errors without the record's place,
 * which ds_data_reader_reject adds. */
static ds_status record_object(const ds_data_record *rec, int completion, cJSON **out) {
  *out = NULL;
  cJSON *o = NULL, *item = NULL;
  if (!rec->json) { /* a plain-text line: the prompt */
    o = cJSON_CreateObject();
    if (o && completion) {
      char *t = strndup(rec->text, rec->text_len);
      item = t ? cJSON_AddStringToObject(o, "text", t) : NULL;
      free(t);
    } else if (o) {
      cJSON *m = message_object(&(ds_chat_message){.role = "user", .content = rec->text, .content_len = rec->text_len});
      if (m && (item = cJSON_AddArrayToObject(o, "messages"))) cJSON_AddItemToArray(item, m);
      else cJSON_Delete(m);
    }
    if (!item) {
      cJSON_Delete(o);
      return DS_FAIL(DS_ERR_NOMEM, "out of memory");
    }
    *out = o;
    return DS_OK;
  }
  if (tk_json_find_nul(rec->json, rec->json_len) < rec->json_len) /* cJSON cannot write such a string back */
    return DS_FAIL(DS_ERR_FORMAT, "a string holds \\u0000, which the output cannot keep");
  ds_status st = DS_OK;
  if (!(o = tk_json_parse_text(rec->json, rec->json_len, "the line", &st))) return st;
  const char *field = rec->field, *target = completion ? "text" : "messages";
  const cJSON *taken = cJSON_GetObjectItemCaseSensitive(o, target);
  if (strcmp(field, target) && taken) { /* e.g. {"prompt", "text": null}: the key written would be there twice */
    if (!cJSON_IsNull(taken)) {
      cJSON_Delete(o);
      return DS_FAIL(DS_ERR_FORMAT, "both '%s' and '%s': which one is the prompt?", field, target);
    }
    cJSON_DeleteItemFromObjectCaseSensitive(o, target);
  }
  if (completion) {
    if (rec->messages) st = DS_FAIL(DS_ERR_FORMAT, "--completion continues {\"text\": PROMPT} or {\"prompt\": PROMPT}, "
                                    "not a conversation ('%s')", field);
    else if (!strcmp(field, "prompt")) item = cJSON_CreateString(cJSON_GetObjectItemCaseSensitive(o, "prompt")->valuestring);
  } else if (!strcmp(field, "messages")) {
    return (*out = o), DS_OK; /* as given (the reader checked it) */
  } else {
    item = cJSON_CreateArray();
    if (rec->messages) { /* ShareGPT, as the reader mapped it */
      for (size_t i = 0; item && i < rec->n_messages; i++) {
        cJSON *m = message_object(&rec->messages[i]);
        if (!m) {
          cJSON_Delete(item);
          item = NULL;
        } else {
          cJSON_AddItemToArray(item, m);
        }
      }
      if (cJSON_IsString(cJSON_GetObjectItemCaseSensitive(o, "system"))) /* folded in by the reader */
        cJSON_DeleteItemFromObjectCaseSensitive(o, "system");
    } else { /* {"text"} / {"prompt"}: one user turn */
      cJSON *m = message_object(&(ds_chat_message){.role = "user", .content = rec->text, .content_len = rec->text_len});
      if (item && m) cJSON_AddItemToArray(item, m);
      else cJSON_Delete(m), cJSON_Delete(item), item = NULL;
    }
  }
  if (st == DS_OK && item) replace_member(o, field, target, item);
  else if (st == DS_OK && !(completion && !strcmp(field, "text"))) st = DS_FAIL(DS_ERR_NOMEM, "out of memory");
  if (st != DS_OK) {
    cJSON_Delete(o);
    return st;
  }
  *out = o;
  return DS_OK;
}

/* Appends record rec (converted to *obj) to in. */
static ds_status push_record(regen_input *in, int64_t *cap, const ds_data_record *rec, const cJSON *obj) {
  if (!in->n_files || strcmp(in->files[in->n_files - 1], rec->file)) {
    char **f = realloc(in->files, (in->n_files + 1) * sizeof *f);
    if (!f) return DS_FAIL(DS_ERR_NOMEM, "out of memory");
    in->files = f;
    if (!(f[in->n_files] = strdup(rec->file))) return DS_FAIL(DS_ERR_NOMEM, "out of memory");
    in->n_files++;
  }
  if (in->n == *cap) {
    *cap = *cap ? 2 * *cap : 1024;
    regen_record *v = realloc(in->v, (size_t)*cap * sizeof *v);
    if (!v) return DS_FAIL(DS_ERR_NOMEM, "out of memory for %lld conversations", (long long)*cap);
    in->v = v;
  }
  char *text = cJSON_PrintUnformatted(obj);
  if (!text) return DS_FAIL(DS_ERR_NOMEM, "out of memory");
  in->v[in->n++] = (regen_record){text, in->n_files - 1, (int64_t)rec->line};
  return DS_OK;
}

ds_status regen_input_read(const char *data, int completion, int skip_bad, size_t max_line_bytes, regen_input *in) {
  memset(in, 0, sizeof *in);
  in->data = data;
  in->completion = completion;
  ds_data_options opt = {.format = DS_DATA_AUTO, .skip_bad_lines = skip_bad, .text_lines = 1, .prompt_field = 1,
                         .max_line_bytes = max_line_bytes};
  ds_data_reader *r = NULL;
  DS_TRY(ds_data_reader_open(data, &opt, &r));
  ds_status st = DS_OK;
  int64_t cap = 0;
  for (;;) {
    ds_data_record rec;
    int got = 0;
    if ((st = ds_data_reader_next(r, &rec, &got)) != DS_OK || !got) break;
    if (!rec.line) { /* a whole plain-text file: not with text_lines */
      st = DS_FAIL(DS_ERR_FORMAT, "%s: a document without lines", rec.file);
      break;
    }
    cJSON *obj = NULL;
    st = record_object(&rec, completion, &obj);
    if (st == DS_OK) st = push_record(in, &cap, &rec, obj);
    else if (st != DS_ERR_NOMEM) st = ds_data_reader_reject(r, st); /* counted, or the error with FILE:LINE */
    cJSON_Delete(obj);
    if (st != DS_OK) break;
  }
  ds_data_stats stats;
  ds_data_reader_stats(r, &stats);
  in->bad = stats.bad_lines;
  in->files_read = stats.files;
  ds_data_reader_close(r);
  if (st == DS_OK && in->n == 0) st = DS_FAIL(DS_ERR_FORMAT, "%s: no conversation in the data", data);
  if (st != DS_OK) regen_input_free(in);
  return st;
}

void regen_input_free(regen_input *in) {
  for (int64_t k = 0; k < in->n; k++) free(in->v[k].obj);
  for (size_t i = 0; i < in->n_files; i++) free(in->files[i]);
  free(in->v);
  free(in->files);
  memset(in, 0, sizeof *in);
}

const char *regen_source(const regen_input *in, int64_t k, char *buf, size_t n) {
  snprintf(buf, n, "%s:%lld", in->files[in->v[k].file], (long long)in->v[k].line);
  return buf;
}

ds_status regen_conversation(const regen_input *in, int64_t k, cJSON **out) {
  char label[1100];
  ds_status st = DS_OK;
  *out = tk_json_parse_text(in->v[k].obj, strlen(in->v[k].obj), regen_source(in, k, label, sizeof label), &st);
  return *out ? DS_OK : st;
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
 * previous line's, updated to the one after this line's. */
static ds_status check_line(const char *out_path, int64_t j, const char *text, size_t n, const regen_input *in,
                            const char *settings, int64_t *k) {
  char label[1100], source[1100];
  snprintf(label, sizeof label, "%s:%lld", out_path, (long long)j);
  static const char k_hint[] = "regenerate into another --out, or delete it to start over";
  ds_status st = DS_OK;
  cJSON *o = tk_json_parse_text(text, n, label, &st);
  if (!o) return ds_error_wrap(st, "%s is not a `dspark regenerate` output (%s)", out_path, k_hint);
  const cJSON *r = cJSON_GetObjectItemCaseSensitive(o, "regenerated");
  const cJSON *index = cJSON_GetObjectItemCaseSensitive(r, "index");
  const cJSON *set = cJSON_GetObjectItemCaseSensitive(r, "settings");
  const cJSON *was = cJSON_GetObjectItemCaseSensitive(r, "source");
  if (!cJSON_IsNumber(index) || !cJSON_IsString(set)) {
    st = DS_FAIL(DS_ERR_FORMAT, "%s: no \"regenerated\": {\"index\", \"settings\"}: not a `dspark regenerate` "
                 "output line (%s)", label, k_hint);
  } else if (strcmp(set->valuestring, settings)) {
    st = DS_FAIL(DS_ERR_FORMAT, "%s: written with other settings (%s, this run %s: target template, sampling, "
                 "--max-new-tokens, --thinking or --completion differ); %s", label, set->valuestring, settings, k_hint);
  } else if (index->valuedouble < (double)*k || index->valuedouble >= (double)in->n ||
             index->valuedouble != (double)(int64_t)index->valuedouble) {
    st = DS_FAIL(DS_ERR_FORMAT, "%s: index %.0f (%s) is not a conversation of %s after the previous line's (%lld "
                 "conversations); %s", label, index->valuedouble, cJSON_IsString(was) ? was->valuestring : "?",
                 in->data, (long long)in->n, k_hint);
  } else {
    *k = (int64_t)index->valuedouble;
    cJSON *want = NULL;
    st = regen_conversation(in, *k, &want);
    const char *why = st == DS_OK ? mismatch(want, o, in->completion) : NULL;
    if (why)
      st = DS_FAIL(DS_ERR_FORMAT, "%s does not continue from %s (conversation %lld): %s; %s", label,
                   regen_source(in, *k, source, sizeof source), (long long)*k, why, k_hint);
    cJSON_Delete(want);
    ++*k;
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
