#include "dspark/dataset.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "dspark/fileio.h"
#include "core/json_util.h"

typedef struct {
  ds_ids ids;
  ds_ids mask; /* 0/1 per token, stored as int32 for reuse of ds_ids */
} token_stream;

typedef struct {
  int64_t S, min_len, n, cap;
  int32_t *ids;
  uint8_t *mask;
  int64_t *len;
} seq_builder;

static ds_status push_seq(seq_builder *b, const int32_t *ids, const int32_t *mask, int64_t n) {
  if (n < b->min_len) return DS_OK;
  if (b->n == b->cap) {
    int64_t cap = b->cap ? 2 * b->cap : 64;
    int32_t *ni = realloc(b->ids, (size_t)(cap * b->S) * sizeof(int32_t));
    if (ni) b->ids = ni;
    uint8_t *nm = realloc(b->mask, (size_t)(cap * b->S));
    if (nm) b->mask = nm;
    int64_t *nl = realloc(b->len, (size_t)cap * sizeof(int64_t));
    if (nl) b->len = nl;
    if (!ni || !nm || !nl) return DS_FAIL(DS_ERR_NOMEM, "dataset: out of memory at %lld sequences", (long long)cap);
    b->cap = cap;
  }
  int32_t *di = b->ids + b->n * b->S;
  uint8_t *dm = b->mask + b->n * b->S;
  for (int64_t t = 0; t < b->S; t++) {
    di[t] = t < n ? ids[t] : 0;
    dm[t] = t < n ? (uint8_t)(mask[t] != 0) : 0;
  }
  b->len[b->n++] = n;
  return DS_OK;
}

/* Plain text: append the document and an EOS to the stream. */
static ds_status add_document(token_stream *s, const ds_tokenizer *tok, const char *text, size_t len, int32_t eos) {
  size_t before = s->ids.len;
  DS_TRY(ds_tokenizer_encode(tok, text, len, 0, &s->ids));
  if (eos >= 0) DS_TRY(ds_ids_push(&s->ids, eos));
  for (size_t i = before; i < s->ids.len; i++) DS_TRY(ds_ids_push(&s->mask, 1));
  return DS_OK;
}

static ds_status add_chat(seq_builder *b, const ds_tokenizer *tok, const cJSON *msgs, const char *path, size_t line) {
  size_t n = (size_t)cJSON_GetArraySize(msgs);
  ds_chat_message *m = calloc(n ? n : 1, sizeof *m);
  if (!m) return DS_FAIL(DS_ERR_NOMEM, "dataset: out of memory");
  size_t i = 0;
  const cJSON *it;
  cJSON_ArrayForEach(it, msgs) {
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
    if (!cJSON_IsString(role) || !cJSON_IsString(content)) {
      free(m);
      return DS_FAIL(DS_ERR_FORMAT, "%s:%zu: messages[%zu] needs string 'role' and 'content'", path, line, i);
    }
    m[i].role = role->valuestring;
    m[i].content = content->valuestring;
    i++;
  }
  ds_ids ids = {0}, mask = {0};
  ds_status st = ds_chat_encode_chatml(tok, m, n, 0, &ids, &mask);
  free(m);
  if (st == DS_OK) st = push_seq(b, ids.ids, mask.ids, (int64_t)(ids.len < (size_t)b->S ? ids.len : (size_t)b->S));
  ds_ids_free(&ids);
  ds_ids_free(&mask);
  return st;
}

static int has_suffix(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && !strcmp(s + a - b, suffix);
}

ds_status ds_dataset_load(const char *path, const ds_tokenizer *tok, int64_t seq_len, int32_t eos_id,
                          int64_t min_len, ds_dataset *out) {
  memset(out, 0, sizeof *out);
  if (seq_len < 2) return DS_FAIL(DS_ERR_ARG, "dataset: sequence length %lld must be at least 2", (long long)seq_len);
  char *buf;
  size_t len;
  DS_TRY(ds_read_file(path, &buf, &len));
  seq_builder b = {seq_len, min_len < 2 ? 2 : min_len, 0, 0, NULL, NULL, NULL};
  token_stream s = {{0}, {0}};
  ds_status st = DS_OK;
  if (has_suffix(path, ".jsonl") || has_suffix(path, ".json")) {
    size_t line = 0;
    for (char *p = buf; st == DS_OK && p < buf + len;) {
      char *nl = memchr(p, '\n', (size_t)(buf + len - p));
      size_t n = nl ? (size_t)(nl - p) : (size_t)(buf + len - p);
      line++;
      size_t k = 0;
      while (k < n && (p[k] == ' ' || p[k] == '\t' || p[k] == '\r')) k++;
      if (k < n) {
        char label[64];
        snprintf(label, sizeof label, "line %zu", line);
        cJSON *obj = ds_json_parse(p, n, label, &st);
        if (obj) {
          const cJSON *text = cJSON_GetObjectItemCaseSensitive(obj, "text");
          const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(obj, "messages");
          if (cJSON_IsString(text)) st = add_document(&s, tok, text->valuestring, strlen(text->valuestring), eos_id);
          else if (cJSON_IsArray(msgs)) st = add_chat(&b, tok, msgs, path, line);
          else st = DS_FAIL(DS_ERR_FORMAT, "%s:%zu: a line needs a string 'text' or a list 'messages'", path, line);
          cJSON_Delete(obj);
        } else {
          st = ds_error_wrap(st, "%s", path);
        }
      }
      p += n + 1;
    }
  } else {
    st = add_document(&s, tok, buf, len, eos_id);
  }
  /* The plain-text stream becomes consecutive windows. */
  for (size_t at = 0; st == DS_OK && at < s.ids.len; at += (size_t)seq_len) {
    size_t n = s.ids.len - at < (size_t)seq_len ? s.ids.len - at : (size_t)seq_len;
    st = push_seq(&b, s.ids.ids + at, s.mask.ids + at, (int64_t)n);
  }
  out->source_hash = XXH64(buf, len, 0);
  free(buf);
  ds_ids_free(&s.ids);
  ds_ids_free(&s.mask);
  if (st == DS_OK && b.n == 0)
    st = DS_FAIL(DS_ERR_FORMAT, "%s: no sequence of at least %lld tokens", path, (long long)b.min_len);
  if (st != DS_OK) {
    free(b.ids);
    free(b.mask);
    free(b.len);
    return st;
  }
  out->n_seqs = b.n;
  out->seq_len = seq_len;
  out->ids = b.ids;
  out->loss_mask = b.mask;
  out->lengths = b.len;
  return DS_OK;
}
