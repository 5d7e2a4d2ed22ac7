/* ds_data_reader (dspark/dataset.h): the records of every input file in order, each file
 * streamed (data_input.c) and each JSONL line classified (chat_json.c); bad lines are
 * errors naming file, line and field, or skipped and counted. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "dspark/dataset.h"
#include "text/chat_json.h"
#include "text/data_input.h"
#include "text/json_text.h"
#include "text/tok_json.h"
#include "text/tok_internal.h"

enum { BAD_LINES_SHOWN = 5 }; /* skipped lines whose error is printed; the rest are counted */

struct ds_data_reader {
  ds_data_options opt;
  char *spec;
  tk_input_list files;
  size_t next_file;    /* index of the file to open next */
  const char *file;    /* the open file's path (files.paths[next_file - 1]) */
  tk_stream *s;        /* NULL between files */
  ds_data_format fmt;  /* the open file's resolved format */
  size_t line;         /* lines read from the open file */
  cJSON *obj;          /* the current record's JSON line */
  ds_chat_message *msgs;
  char *doc;           /* the current plain-text document */
  size_t rec_line;     /* the current record's line, for ds_data_reader_reject */
  const char *rec_file;
  uint64_t *hashes, *sizes; /* per finished file */
  ds_data_stats stats;
};

/* Refuses bytes that are not UTF-8, naming the file, line and column (line0: the line
 * number of buf[0], which starts a line). */
static ds_status check_utf8(const char *path, const char *buf, size_t len, size_t line0) {
  size_t valid = tk_utf8_valid_prefix((const unsigned char *)buf, len);
  if (valid == len) return DS_OK;
  size_t line, col;
  tk_text_line_col(buf, valid, &line, &col);
  return DS_FAIL(DS_ERR_FORMAT, "%s:%zu:%zu: invalid UTF-8 (byte 0x%02X): data must be UTF-8 text", path,
                 line0 + line - 1, col, (unsigned)(unsigned char)buf[valid]);
}

static int is_blank(const char *p, size_t n) {
  size_t k = 0;
  while (k < n && (p[k] == ' ' || p[k] == '\t' || p[k] == '\r')) k++;
  return k == n;
}

/* Does this line parse as a JSON object? (A UTF-8 BOM before it is skipped.) */
static int is_json_object_line(const char *p, size_t n) {
  if (n >= 3 && !memcmp(p, "\xEF\xBB\xBF", 3)) p += 3, n -= 3;
  while (n && (*p == ' ' || *p == '\t')) p++, n--;
  if (!n || *p != '{') return 0;
  ds_status st;
  cJSON *obj = tk_json_parse_text(p, n, "first line", &st);
  int ok = obj && cJSON_IsObject(obj);
  cJSON_Delete(obj);
  ds_error_clear();
  return ok;
}

/* The first non-blank line of a document held in memory. */
static int doc_starts_with_json(const char *buf, size_t len) {
  const char *p = buf, *end = buf + len;
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
    if (!is_blank(p, n)) return is_json_object_line(p, n);
    p += n + 1;
  }
  return 0;
}

static int name_has(const char *path, const char *suffix) {
  size_t n = tk_data_name_len(path), b = strlen(suffix);
  return n >= b && !strncasecmp(path + n - b, suffix, b);
}

static size_t max_line(const ds_data_reader *r) {
  return r->opt.max_line_bytes ? r->opt.max_line_bytes : DS_DATA_MAX_LINE_DEFAULT;
}

/* Opens path with the bounds of its format (data_input.h). */
static ds_status open_stream(ds_data_reader *r, const char *path, int json_object) {
  DS_TRY(tk_stream_open(path, &r->s));
  tk_stream_limit(r->s, max_line(r), json_object);
  return DS_OK;
}

/* Opens files.paths[next_file] and decides its format (AUTO: by name, else by its first
 * non-blank line, read and then reopened so the hash covers the file once). */
static ds_status open_next(ds_data_reader *r) {
  const char *path = r->files.paths[r->next_file++];
  r->file = path;
  r->line = 0;
  r->fmt = r->opt.format;
  if (r->fmt == DS_DATA_AUTO) {
    if (name_has(path, ".jsonl") || name_has(path, ".ndjson") || name_has(path, ".json")) r->fmt = DS_DATA_JSONL;
    else if (name_has(path, ".txt")) r->fmt = DS_DATA_TEXT; /* warned about in next_document when it holds JSON */
  }
  DS_TRY(open_stream(r, path, r->fmt != DS_DATA_TEXT)); /* AUTO: a first line without '{' is text, seen at once */
  if (r->fmt != DS_DATA_AUTO) return DS_OK;
  char *line;
  size_t n;
  int jsonl = 0;
  do {
    DS_TRY(tk_stream_line(r->s, &line, &n));
  } while (line && is_blank(line, n));
  if (line) jsonl = is_json_object_line(line, n);
  tk_stream_close(r->s);
  r->s = NULL;
  fprintf(stderr, "dspark: %s: no .txt / .jsonl / .ndjson / .json name: read as %s (its first line %s); "
                  "--data-format text|jsonl decides otherwise\n",
          path, jsonl ? "JSONL" : "plain text", jsonl ? "is a JSON object" : "is not a JSON object");
  r->fmt = jsonl ? DS_DATA_JSONL : DS_DATA_TEXT;
  return open_stream(r, path, jsonl);
}

static ds_status finish_file(ds_data_reader *r) {
  size_t i = r->stats.files;
  uint64_t *h = realloc(r->hashes, (i + 1) * sizeof *h);
  if (h) r->hashes = h;
  uint64_t *z = realloc(r->sizes, (i + 1) * sizeof *z);
  if (z) r->sizes = z;
  if (!h || !z) return DS_FAIL(DS_ERR_NOMEM, "out of memory");
  r->hashes[i] = tk_stream_hash(r->s);
  r->sizes[i] = tk_stream_bytes(r->s);
  r->stats.files = i + 1;
  r->stats.hash = tk_data_hash_combine(r->hashes, r->sizes, i + 1);
  tk_stream_close(r->s);
  r->s = NULL;
  return DS_OK;
}

static void drop_record(ds_data_reader *r) {
  cJSON_Delete(r->obj);
  r->obj = NULL;
  free(r->msgs);
  r->msgs = NULL;
  free(r->doc);
  r->doc = NULL;
}

/* A line whose content is bad: skipped and counted with skip_bad_lines, else the error. */
static ds_status bad_line(ds_data_reader *r, ds_status st) {
  if (!r->opt.skip_bad_lines) return st;
  r->stats.bad_lines++;
  if (r->stats.bad_lines <= BAD_LINES_SHOWN)
    fprintf(stderr, "dspark: warning: skipped a bad line (--skip-bad-lines): %s\n", ds_last_error());
  else if (r->stats.bad_lines == BAD_LINES_SHOWN + 1)
    fprintf(stderr, "dspark: warning: more bad lines skipped: only their count is reported from here on\n");
  ds_error_clear();
  return DS_OK;
}

ds_status ds_data_reader_reject(ds_data_reader *r, ds_status st) {
  if (st == DS_OK) return DS_OK;
  if (r->rec_line) ds_error_wrap(st, "%s:%zu", r->rec_file, r->rec_line);
  else ds_error_wrap(st, "%s", r->rec_file ? r->rec_file : r->spec);
  if (!r->opt.skip_bad_lines || !r->rec_line || (st != DS_ERR_FORMAT && st != DS_ERR_ARG)) return st;
  r->stats.records--; /* counted as a bad line instead */
  return bad_line(r, st);
}

ds_status ds_data_reader_open(const char *inputs, const ds_data_options *opt, ds_data_reader **out) {
  *out = NULL;
  ds_data_options def = {.format = DS_DATA_AUTO};
  if (!opt) opt = &def;
  if (opt->format != DS_DATA_AUTO && opt->format != DS_DATA_TEXT && opt->format != DS_DATA_JSONL)
    return DS_FAIL(DS_ERR_ARG, "data: unknown data format %d", (int)opt->format);
  ds_data_reader *r = calloc(1, sizeof *r);
  if (!r || !(r->spec = strdup(inputs))) {
    free(r);
    return DS_FAIL(DS_ERR_NOMEM, "out of memory");
  }
  r->opt = *opt;
  ds_status st = tk_inputs_expand(inputs, &r->files);
  if (st != DS_OK) {
    ds_data_reader_close(r);
    return st;
  }
  *out = r;
  return DS_OK;
}

/* The whole open file as one document (*got 0 for an empty file, which holds none). */
static ds_status next_document(ds_data_reader *r, ds_data_record *rec, int *got) {
  size_t len;
  *got = 0;
  DS_TRY(tk_stream_rest(r->s, &r->doc, &len));
  if (!len) return finish_file(r);
  *got = 1;
  DS_TRY(check_utf8(r->file, r->doc, len, 1));
  if (r->opt.format == DS_DATA_AUTO && doc_starts_with_json(r->doc, len))
    fprintf(stderr,
            "dspark: warning: %s: read as plain text (its name) although its first line is a JSON object; "
            "--data-format jsonl reads it as JSONL\n",
            r->file);
  rec->text = r->doc;
  rec->text_len = len;
  rec->file = r->rec_file = r->file;
  rec->line = r->rec_line = 0;
  return finish_file(r);
}

static int has_value(const cJSON *obj, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  return v && !cJSON_IsNull(v);
}

/* What a JSONL line holds (tk_data_line, plus {"prompt"} with prompt_field); *field: its key. */
static ds_status line_fields(const ds_data_reader *r, const cJSON *obj, const char *label, const char **text,
                             size_t *text_len, ds_chat_message **msgs, size_t *n, const char **field) {
  *field = NULL;
  if (r->opt.prompt_field && cJSON_IsObject(obj) && !has_value(obj, "text") && !has_value(obj, "messages") &&
      !has_value(obj, "conversations")) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(obj, "prompt");
    if (!p || cJSON_IsNull(p))
      return DS_FAIL(DS_ERR_FORMAT, "%s: a line needs a string 'text' or 'prompt', a list 'messages' (role / content) "
                     "or a list 'conversations' (ShareGPT from / value); it has none of them", label);
    if (!cJSON_IsString(p))
      return DS_FAIL(DS_ERR_FORMAT, "%s: 'prompt' must be a string (it is %s)", label, tk_type_name(p));
    *text = tk_json_str(p, text_len);
    *field = "prompt";
    return DS_OK;
  }
  DS_TRY(tk_data_line(obj, label, text, text_len, msgs, n));
  *field = *text ? "text" : has_value(obj, "messages") ? "messages" : "conversations";
  return DS_OK;
}

/* A JSONL line must hold an object: its first byte after blanks is '{' (the stream cut a
 * line at any other byte, data_input.h). */
static ds_status check_object_start(const char *label, const char *p, size_t n) {
  size_t k = 0;
  while (k < n && (p[k] == ' ' || p[k] == '\t' || p[k] == '\r')) k++;
  if (k == n || p[k] == '{') return DS_OK;
  unsigned char c = (unsigned char)p[k];
  char shown[16];
  if (c >= 0x20 && c < 0x7F) snprintf(shown, sizeof shown, "'%c'", c);
  else snprintf(shown, sizeof shown, "byte 0x%02X", c);
  return DS_FAIL(DS_ERR_FORMAT, "%s:%zu: a JSONL line holds a JSON object, which starts with '{', not %s "
                 "(the rest of the line is not read)", label, k + 1, shown);
}

/* A key twice in one object of the line: refused, as readers disagree on which value counts. */
static ds_status check_unique_keys(const char *label, const cJSON *obj) {
  char where[256];
  const char *key = tk_json_duplicate_key(obj, where, sizeof where);
  if (!key) return DS_OK;
  return DS_FAIL(DS_ERR_FORMAT, "%s: key '%.80s' appears twice in %s%s (JSON readers differ on which value "
                 "counts: Python's json takes the last, cJSON the first)", label, key, where[0] ? "" : "the line's object",
                 where);
}

/* The next record of the open JSONL file, or (text_lines) line of its plain-text file: *got 0
 * at its end. */
static ds_status next_line(ds_data_reader *r, ds_data_record *rec, int *got) {
  *got = 0;
  for (;;) {
    char *p;
    size_t n;
    DS_TRY(tk_stream_line(r->s, &p, &n));
    if (!p) return finish_file(r);
    if (++r->line == 1 && n >= 3 && !memcmp(p, "\xEF\xBB\xBF", 3)) p += 3, n -= 3; /* a UTF-8 BOM */
    if (is_blank(p, n)) continue;
    char label[1100];
    snprintf(label, sizeof label, "%s:%zu", r->file, r->line);
    ds_status st = r->fmt == DS_DATA_TEXT ? DS_OK : check_object_start(label, p, n);
    if (st == DS_OK) st = check_utf8(r->file, p, n, r->line);
    const char *text = NULL, *field = NULL;
    size_t text_len = 0, n_msgs = 0;
    if (r->fmt == DS_DATA_TEXT) { /* text_lines: the line is the document */
      text = p;
      text_len = n > 0 && p[n - 1] == '\r' ? n - 1 : n;
    } else {
      if (st == DS_OK && !(r->obj = tk_json_parse_text(p, n, label, &st)) && st == DS_OK) st = DS_ERR_FORMAT;
      if (st == DS_OK) st = check_unique_keys(label, r->obj);
      if (st == DS_OK) st = line_fields(r, r->obj, label, &text, &text_len, &r->msgs, &n_msgs, &field);
    }
    if (st != DS_OK) {
      drop_record(r);
      DS_TRY(bad_line(r, st));
      continue;
    }
    rec->text = text;
    rec->text_len = text_len;
    rec->messages = r->msgs;
    rec->n_messages = n_msgs;
    rec->file = r->rec_file = r->file;
    rec->line = r->rec_line = r->line;
    rec->json = r->fmt == DS_DATA_TEXT ? NULL : p;
    rec->json_len = r->fmt == DS_DATA_TEXT ? 0 : n;
    rec->field = field;
    *got = 1;
    return DS_OK;
  }
}

ds_status ds_data_reader_next(ds_data_reader *r, ds_data_record *rec, int *got) {
  memset(rec, 0, sizeof *rec);
  *got = 0;
  drop_record(r);
  r->rec_file = NULL;
  r->rec_line = 0;
  for (;;) {
    if (!r->s) {
      if (r->next_file < r->files.n) {
        DS_TRY(open_next(r));
        continue;
      }
      if (r->stats.records > 0) return DS_OK;
      if (r->stats.bad_lines > 0)
        return DS_FAIL(DS_ERR_FORMAT, "%s: no record in the data: all %lld non-blank lines were bad and skipped "
                       "(--skip-bad-lines)", r->spec, (long long)r->stats.bad_lines);
      return DS_FAIL(DS_ERR_FORMAT, "%s: no record in the data (%s)", r->spec,
                     r->files.n > 1 ? "its files are empty or hold blank lines only"
                                    : "the file is empty or holds blank lines only");
    }
    if (r->fmt == DS_DATA_TEXT && !r->opt.text_lines) {
      DS_TRY(next_document(r, rec, got));
    } else {
      DS_TRY(next_line(r, rec, got));
    }
    if (*got) {
      r->stats.records++;
      return DS_OK;
    }
  }
}

void ds_data_reader_stats(const ds_data_reader *r, ds_data_stats *out) { *out = r->stats; }

void ds_data_reader_close(ds_data_reader *r) {
  if (!r) return;
  drop_record(r);
  tk_stream_close(r->s);
  tk_inputs_free(&r->files);
  free(r->hashes);
  free(r->sizes);
  free(r->spec);
  free(r);
}

ds_status ds_data_hash(const char *inputs, size_t max_line_bytes, uint64_t *out) {
  tk_input_list files;
  DS_TRY(tk_inputs_expand(inputs, &files));
  uint64_t *h = calloc(files.n, sizeof *h), *z = calloc(files.n, sizeof *z);
  ds_status st = h && z ? DS_OK : DS_FAIL(DS_ERR_NOMEM, "out of memory");
  for (size_t i = 0; st == DS_OK && i < files.n; i++) {
    tk_stream *s;
    if ((st = tk_stream_open(files.paths[i], &s)) != DS_OK) break;
    st = tk_stream_drain(s, max_line_bytes ? max_line_bytes : DS_DATA_MAX_LINE_DEFAULT);
    h[i] = tk_stream_hash(s);
    z[i] = tk_stream_bytes(s);
    tk_stream_close(s);
  }
  if (st == DS_OK) *out = tk_data_hash_combine(h, z, files.n);
  free(h);
  free(z);
  tk_inputs_free(&files);
  return st;
}
