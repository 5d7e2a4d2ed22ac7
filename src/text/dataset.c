#include "dspark/dataset.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "text/tok_json.h"

typedef struct {
  ds_ids ids;
  ds_ids mask; /* 0/1 per token, stored as int32 for reuse of ds_ids */
} token_stream;

/* Where sequences go: fn gets each one of at least min_len tokens, its mask as 0/1 bytes. */
typedef struct {
  int64_t S, min_len;
  ds_sequence_fn fn;
  void *user;
  uint8_t *m8;                 /* [S] the mask of the sequence being passed */
  int64_t n_seqs, supervised;  /* sequences passed, supervised tokens in them */
} seq_sink;

/* ds_dataset_read's arrays, [n, S] each, grown as sequences arrive. */
typedef struct {
  int64_t S, n, cap;
  int32_t *ids;
  uint8_t *mask;
  int64_t *len;
} seq_builder;

/* A chat role the template does not know: reported once, with its first line and count. */
typedef struct {
  char role[64];
  char where[300]; /* FILE:LINE of its first message */
  size_t count;
} role_note;

enum { MAX_ROLE_NOTES = 8 };

typedef struct {
  const char *path;             /* the inputs as given */
  ds_data_reader *reader;
  const ds_chat_template *tmpl; /* NULL: ChatML */
  int enable_thinking;          /* as ds_chat_options */
  role_note roles[MAX_ROLE_NOTES];
  int n_roles;
  size_t other_roles;                /* lines with unknown roles beyond MAX_ROLE_NOTES distinct */
  size_t chats, chats_unsupervised;  /* conversations kept, and those without a supervised token */
} load_ctx;

static const char *const k_known_roles[] = {"system", "user", "assistant"};

static ds_status push_seq(seq_sink *k, const int32_t *ids, const int32_t *mask, int64_t n) {
  if (n < k->min_len) return DS_OK;
  for (int64_t t = 0; t < n; t++) k->m8[t] = (uint8_t)(mask[t] != 0), k->supervised += k->m8[t];
  k->n_seqs++;
  return k->fn(k->user, ids, k->m8, n);
}

/* ds_dataset_read's sink: each sequence padded to S with zeros. */
static ds_status keep_seq(void *user, const int32_t *ids, const uint8_t *mask, int64_t n) {
  seq_builder *b = user;
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
  memcpy(di, ids, (size_t)n * sizeof(int32_t));
  memcpy(dm, mask, (size_t)n);
  memset(di + n, 0, (size_t)(b->S - n) * sizeof(int32_t));
  memset(dm + n, 0, (size_t)(b->S - n));
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

static void note_role(load_ctx *c, const char *role, const char *file, size_t line) {
  for (size_t k = 0; k < sizeof k_known_roles / sizeof k_known_roles[0]; k++)
    if (!strcmp(role, k_known_roles[k])) return;
  for (int i = 0; i < c->n_roles; i++)
    if (!strcmp(c->roles[i].role, role)) { /* a role cut to fit is noted again: harmless */
      c->roles[i].count++;
      return;
    }
  if (c->n_roles == MAX_ROLE_NOTES) {
    c->other_roles++;
    return;
  }
  role_note *r = &c->roles[c->n_roles++];
  snprintf(r->role, sizeof r->role, "%s", role);
  snprintf(r->where, sizeof r->where, "%s:%zu", file, line);
  r->count = 1;
}

static ds_status add_chat(seq_sink *b, load_ctx *c, const ds_tokenizer *tok, const ds_data_record *rec) {
  if (!c->tmpl) /* the template decides what a role means; ChatML only knows three */
    for (size_t i = 0; i < rec->n_messages; i++) note_role(c, rec->messages[i].role, rec->file, rec->line);
  ds_ids ids = {0}, mask = {0};
  ds_chat_options opt = {0, c->enable_thinking};
  ds_status st = ds_chat_encode(tok, c->tmpl, rec->messages, rec->n_messages, &opt, &ids, &mask);
  if (st != DS_OK) {
    st = ds_data_reader_reject(c->reader, st); /* DS_OK: skipped as a bad line */
  } else {
    int64_t kept = (int64_t)(ids.len < (size_t)b->S ? ids.len : (size_t)b->S), supervised = 0;
    for (int64_t t = 0; t < kept; t++) supervised += mask.ids[t] != 0;
    if (kept >= b->min_len) {
      c->chats++;
      c->chats_unsupervised += supervised == 0;
    }
    st = push_seq(b, ids.ids, mask.ids, kept);
  }
  ds_ids_free(&ids);
  ds_ids_free(&mask);
  return st;
}

static void report_roles(const load_ctx *c) {
  for (int i = 0; i < c->n_roles; i++) {
    const role_note *r = &c->roles[i];
    const char *hint = "";
    char shown[200];
    for (size_t k = 0; k < sizeof k_known_roles / sizeof k_known_roles[0]; k++)
      if (!strcasecmp(r->role, k_known_roles[k])) hint = k_known_roles[k];
    fprintf(stderr,
            "dspark: warning: %s: chat role '%s' is not one the ChatML template knows (system, user, assistant): "
            "rendered as is and never supervised (%zu message%s)%s%s%s\n",
            r->where, tk_show(r->role, shown), r->count, r->count == 1 ? "" : "s", hint[0] ? "; roles are case-sensitive, did you mean '" : "",
            hint, hint[0] ? "'?" : "");
  }
  if (c->other_roles)
    fprintf(stderr, "dspark: warning: %s: %zu more messages with other unknown chat roles\n", c->path, c->other_roles);
}

int ds_data_format_parse(const char *name, ds_data_format *out) {
  static const char *const names[] = {"auto", "text", "jsonl"};
  for (int i = 0; i < 3; i++)
    if (!strcmp(name, names[i])) {
      *out = (ds_data_format)i;
      return 1;
    }
  return 0;
}

const char *ds_data_format_name(ds_data_format f) {
  return f == DS_DATA_TEXT ? "text" : f == DS_DATA_JSONL ? "jsonl" : "auto";
}

ds_status ds_dataset_load(const char *path, ds_data_format format, const ds_tokenizer *tok, int64_t seq_len,
                          int32_t eos_id, int64_t min_len, ds_dataset *out) {
  return ds_dataset_load_chat(path, format, tok, NULL, -1, seq_len, eos_id, min_len, out);
}

ds_status ds_dataset_load_chat(const char *path, ds_data_format format, const ds_tokenizer *tok,
                               const ds_chat_template *tmpl, int enable_thinking, int64_t seq_len, int32_t eos_id,
                               int64_t min_len, ds_dataset *out) {
  ds_data_options opt = {.format = format};
  return ds_dataset_read(path, &opt, tok, tmpl, enable_thinking, seq_len, eos_id, min_len, out);
}

/* Reads every record of the inputs: conversations become sequences, documents the stream. */
static ds_status read_records(load_ctx *c, seq_sink *b, token_stream *s, const ds_tokenizer *tok, int32_t eos_id) {
  ds_data_record rec;
  int got;
  for (;;) {
    DS_TRY(ds_data_reader_next(c->reader, &rec, &got));
    if (!got) return DS_OK;
    if (!rec.text) {
      DS_TRY(add_chat(b, c, tok, &rec));
      continue;
    }
    size_t before = s->ids.len;
    ds_status st = add_document(s, tok, rec.text, rec.text_len, eos_id);
    if (st != DS_OK) { /* a skipped document leaves nothing behind */
      s->ids.len = s->mask.len = before;
      DS_TRY(ds_data_reader_reject(c->reader, st));
    }
  }
}

ds_status ds_dataset_stream(const char *path, const ds_data_options *opt, const ds_tokenizer *tok,
                            const ds_chat_template *tmpl, int enable_thinking, int64_t seq_len, int32_t eos_id,
                            int64_t min_len, ds_sequence_fn fn, void *user, uint64_t *source_hash,
                            int64_t *bad_lines) {
  if (seq_len < 2) return DS_FAIL(DS_ERR_ARG, "dataset: sequence length %lld must be at least 2", (long long)seq_len);
  seq_sink b = {seq_len, min_len < 2 ? 2 : min_len, fn, user, malloc((size_t)seq_len), 0, 0};
  if (!b.m8) return DS_FAIL(DS_ERR_NOMEM, "dataset: a mask of %lld tokens", (long long)seq_len);
  token_stream s = {{0}, {0}};
  load_ctx c;
  memset(&c, 0, sizeof c);
  c.path = path;
  c.tmpl = tmpl;
  c.enable_thinking = enable_thinking;
  ds_status st = ds_data_reader_open(path, opt, &c.reader);
  if (st != DS_OK) {
    free(b.m8);
    return st;
  }
  st = read_records(&c, &b, &s, tok, eos_id);
  /* The plain-text stream becomes consecutive windows. */
  for (size_t at = 0; st == DS_OK && at < s.ids.len; at += (size_t)seq_len) {
    size_t n = s.ids.len - at < (size_t)seq_len ? s.ids.len - at : (size_t)seq_len;
    st = push_seq(&b, s.ids.ids + at, s.mask.ids + at, (int64_t)n);
  }
  free(b.m8);
  ds_data_stats ds;
  ds_data_reader_stats(c.reader, &ds);
  ds_data_reader_close(c.reader);
  if (source_hash) *source_hash = ds.hash;
  if (bad_lines) *bad_lines = ds.bad_lines;
  ds_ids_free(&s.ids);
  ds_ids_free(&s.mask);
  int skipping = opt && opt->skip_bad_lines;
  if (st == DS_OK && (ds.files > 1 || skipping)) { /* the data's summary: what was read, what was skipped */
    char bad[96] = "";
    if (skipping)
      snprintf(bad, sizeof bad, ", %lld bad line%s skipped (--skip-bad-lines)", (long long)ds.bad_lines,
               ds.bad_lines == 1 ? "" : "s");
    fprintf(stderr, "dspark: %s: %zu file%s, %lld record%s read%s\n", path, ds.files, ds.files == 1 ? "" : "s",
            (long long)ds.records, ds.records == 1 ? "" : "s", bad);
  }
  report_roles(&c);
  if (st == DS_OK && !tmpl && c.chats)
    fprintf(stderr, "dspark: note: %s: %zu conversations rendered with ChatML (the tokenizer has no chat template: "
                    "chat_template.jinja or tokenizer_config.json's chat_template)\n",
            path, c.chats);
  if (st == DS_OK && b.n_seqs == 0) {
    st = DS_FAIL(DS_ERR_FORMAT, "%s: no sequence of at least %lld tokens", path, (long long)b.min_len);
  } else if (st == DS_OK && b.supervised == 0) {
    st = DS_FAIL(DS_ERR_FORMAT,
                 "%s: no supervised token in any of its %lld sequences: chat lines are supervised on their "
                 "'assistant' turns only (roles are case-sensitive), and none has one within %lld tokens",
                 path, (long long)b.n_seqs, (long long)seq_len);
  } else if (st == DS_OK && c.chats_unsupervised) {
    fprintf(stderr, "dspark: warning: %s: %zu of %zu conversations have no supervised token (no 'assistant' turn "
                    "within %lld tokens) and train nothing\n",
            path, c.chats_unsupervised, c.chats, (long long)seq_len);
  }
  return st;
}

ds_status ds_dataset_read(const char *path, const ds_data_options *opt, const ds_tokenizer *tok,
                          const ds_chat_template *tmpl, int enable_thinking, int64_t seq_len, int32_t eos_id,
                          int64_t min_len, ds_dataset *out) {
  memset(out, 0, sizeof *out);
  seq_builder b = {seq_len, 0, 0, NULL, NULL, NULL};
  ds_status st = ds_dataset_stream(path, opt, tok, tmpl, enable_thinking, seq_len, eos_id, min_len, keep_seq, &b,
                                   &out->source_hash, &out->bad_lines);
  if (st != DS_OK) {
    free(b.ids);
    free(b.mask);
    free(b.len);
    memset(out, 0, sizeof *out);
    return st;
  }
  out->n_seqs = b.n;
  out->seq_len = seq_len;
  out->ids = b.ids;
  out->loss_mask = b.mask;
  out->lengths = b.len;
  return DS_OK;
}
