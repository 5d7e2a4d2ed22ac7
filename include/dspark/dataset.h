/* Training data: plain text or JSONL ({"text": ...} documents, or conversations as OpenAI-style
 * {"messages": [...]} or ShareGPT {"conversations": [...]}) -> token ids + loss mask ->
 * sequences of at most seq_len tokens.
 *
 * Inputs: a file, a directory (its data files, recursively) or a glob pattern, each file
 * plain, gzip or zstd (ds_data_reader_open below says how they are found and ordered). The
 * training loaders, capture and `dspark tokenize --chat` all read through ds_data_reader, so
 * they see the same records; a program that needs the conversations themselves (prompts for
 * regeneration) reads them the same way.
 *
 * Plain text (a .txt file, or {"text"} lines): documents are tokenized, joined with the EOS
 * token and cut into consecutive windows of seq_len tokens; every token is supervised.
 * Chat: each conversation is rendered with the model's chat template (ds_dataset_load_chat;
 * ChatML with ds_dataset_load) and is one sequence (truncated to seq_len), supervised on the
 * assistant turns only (include/dspark/chat_template.h says which tokens). The format is
 * the file's suffix or content unless the caller names it (ds_data_format). */
#ifndef DSPARK_DATASET_H
#define DSPARK_DATASET_H

#include "dspark/chat_template.h"
#include "dspark/common.h"
#include "dspark/sequences.h"
#include "dspark/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How a data file is read. AUTO: by suffix, case-insensitive (.jsonl, .ndjson, .json: JSONL;
 * .txt: plain text), else by content (a first non-blank line that parses as a JSON object:
 * JSONL, anything else: plain text; the choice is noted on stderr). */
typedef enum { DS_DATA_AUTO = 0, DS_DATA_TEXT, DS_DATA_JSONL } ds_data_format;

/* "auto", "text", "jsonl" -> *out; 0 for any other name. */
int ds_data_format_parse(const char *name, ds_data_format *out);
const char *ds_data_format_name(ds_data_format f);

/* How inputs are read. skip_bad_lines: a JSONL line that is malformed (JSON, UTF-8, a missing
 * or mistyped field) or that the chat template refuses (raise_exception) is skipped, counted
 * and reported on stderr (the first few with their error) instead of stopping the read.
 * For readers of prompts (`dspark regenerate`): text_lines: a plain-text file gives one
 * document per non-blank line (its line number, a trailing CR dropped; invalid UTF-8 is then a
 * bad line) instead of one per file; prompt_field: a JSONL line with none of text / messages /
 * conversations may hold {"prompt": TEXT}, a document.
 * max_line_bytes (0: DS_DATA_MAX_LINE_DEFAULT): the most bytes of one line, or of a plain-text
 * file read whole as one document, that the reader holds; a longer one stops the read (never
 * skipped) with an error naming the file, the line and the limit, after reading no more than
 * the limit. A JSONL line whose first byte after blanks is not '{' is refused at that byte,
 * the rest of it unread (skipped, never kept, with skip_bad_lines). */
#define DS_DATA_MAX_LINE_DEFAULT ((size_t)64 << 20)
typedef struct {
  ds_data_format format;
  int skip_bad_lines;
  int text_lines;
  int prompt_field;
  size_t max_line_bytes;
} ds_data_options;

/* One item of the data: a document (text != NULL: a plain-text file, line 0 (or one of its
 * lines with text_lines), or a {"text"} line) or a conversation (messages; ShareGPT turns already mapped to roles). Everything
 * points into the reader and is valid until its next call. */
typedef struct {
  const char *text;
  size_t text_len;
  const ds_chat_message *messages;
  size_t n_messages;
  const char *file; /* which input file */
  size_t line;      /* 1-based line in it; 0 for a whole plain-text file */
  const char *json; /* the line itself (its other fields, e.g. an id, for a program that writes
                       the record back out); NULL for a plain-text file */
  size_t json_len;
  const char *field; /* the key the record was read from: "text", "messages", "conversations" or
                        "prompt"; NULL for plain text */
} ds_data_record;

typedef struct {
  size_t files;       /* input files (all of them, once the end is reached) */
  int64_t records;    /* documents and conversations returned and not rejected */
  int64_t bad_lines;  /* lines skipped by skip_bad_lines (refused ones included) */
  uint64_t hash;      /* the data's xxh64 (ds_data_hash); complete at the end */
} ds_data_stats;

typedef struct ds_data_reader ds_data_reader;

/* inputs: an existing file is itself; an existing directory gives every file under it,
 * recursively, whose name ends in .jsonl .ndjson .json or .txt (any case), optionally
 * followed by .gz or .zst (names starting with '.' skipped); otherwise a glob(3) pattern
 * (* ? [..] and {a,b} braces; matched directories walked the same way). All files are read
 * in one order: sorted by path, byte order. A file is gzip or zstd by its magic bytes (a .gz
 * / .zst name without them is refused) and decompressed as it streams. opt NULL: auto format,
 * no skipping. Each file's format is resolved by its name without .gz / .zst as
 * ds_data_format says. */
ds_status ds_data_reader_open(const char *inputs, const ds_data_options *opt, ds_data_reader **out);
/* The next record: *got = 1, or 0 at the end. A bad line is an error naming file:line and
 * the field (or skipped, with skip_bad_lines); so is a key that occurs twice in one object of
 * a line. Data without a single record (empty files, blank lines only, every line skipped or
 * rejected) is an error naming the input at the end. An empty plain-text file holds no
 * document. */
ds_status ds_data_reader_next(ds_data_reader *r, ds_data_record *rec, int *got);
/* The caller could not use the last record (st: its error, e.g. the chat template's): with
 * skip_bad_lines and an error about the line's content (DS_ERR_FORMAT, or DS_ERR_ARG as
 * raise_exception gives), it is counted as a bad line and DS_OK returned; otherwise st with
 * "FILE:LINE: " before its message. */
ds_status ds_data_reader_reject(ds_data_reader *r, ds_status st);
void ds_data_reader_stats(const ds_data_reader *r, ds_data_stats *out);
void ds_data_reader_close(ds_data_reader *r);
/* The data's xxh64, without parsing: one file, the xxh64 of its (decompressed) bytes, which
 * is the plain file hash of earlier versions; several, the xxh64 of their (xxh64, byte count)
 * pairs as little-endian u64s, in reading order. A run of more than max_line_bytes (0: the
 * default) without a line break is refused, as the reader refuses it: an endless stream such as
 * /dev/zero is not data. */
ds_status ds_data_hash(const char *inputs, size_t max_line_bytes, uint64_t *out);

/* Loads and packs the data of inputs (as ds_data_reader_open). eos_id < 0: plain-text documents are joined without a
 * separator. min_len: sequences shorter than this are dropped (at least 2: a draft needs a
 * token to predict). Refused, naming the file (and line and column where there is one):
 * invalid UTF-8, malformed JSON lines, and data with no supervised token at all (chat lines
 * without an assistant turn). A chat role other than system / user / assistant is rendered
 * as is, never supervised, and warned about on stderr (file, line, role). JSON strings keep
 * "\u0000" as a NUL character, as HF tokenizers sees it. */
ds_status ds_dataset_load(const char *path, ds_data_format format, const ds_tokenizer *tok, int64_t seq_len,
                          int32_t eos_id, int64_t min_len, ds_dataset *out);
/* The same with chat lines rendered by tmpl (NULL: ChatML, whose unknown roles are warned
 * about) with enable_thinking as in ds_chat_options (-1: not passed); a template's error
 * (raise_exception, an unsupported construct) names the line. */
ds_status ds_dataset_load_chat(const char *path, ds_data_format format, const ds_tokenizer *tok,
                               const ds_chat_template *tmpl, int enable_thinking, int64_t seq_len, int32_t eos_id,
                               int64_t min_len, ds_dataset *out);
/* The same with all reading options; out->bad_lines counts what skip_bad_lines skipped, and
 * a summary line on stderr says so. */
ds_status ds_dataset_read(const char *inputs, const ds_data_options *opt, const ds_tokenizer *tok,
                          const ds_chat_template *tmpl, int enable_thinking, int64_t seq_len, int32_t eos_id,
                          int64_t min_len, ds_dataset *out);

/* ds_dataset_read's sequences one at a time, none kept: fn gets each (ids [n] and mask [n], 1
 * where supervised; valid during the call) in ds_dataset_read's order, and an error it returns
 * ends the read with that error. The same checks, warnings and summary as ds_dataset_read; for a
 * consumer that needs one pass over the tokens (the corpus n-gram table), where ds_dataset's
 * arrays hold seq_len slots a sequence. source_hash, bad_lines: set as ds_dataset's, or NULL. */
typedef ds_status (*ds_sequence_fn)(void *user, const int32_t *ids, const uint8_t *mask, int64_t n);
ds_status ds_dataset_stream(const char *inputs, const ds_data_options *opt, const ds_tokenizer *tok,
                            const ds_chat_template *tmpl, int enable_thinking, int64_t seq_len, int32_t eos_id,
                            int64_t min_len, ds_sequence_fn fn, void *user, uint64_t *source_hash,
                            int64_t *bad_lines);

#ifdef __cplusplus
}
#endif
#endif
