/* The files of regeneration (dspark/regenerate.h, `dspark regenerate`): the conversations it reads (one per record of the data,
 * read by ds_data_reader as the trainers read it) and the output it appends to and resumes
 * from (docs/speculative-decoding.md "Regenerating answers with the target").
 *
 * Every record becomes the JSON object that will be written out once its answers are
 * replaced, in the OpenAI shape the trainers read: {"messages": [...]} as given; ShareGPT
 * {"conversations": [...]} as the reader maps it (roles, reasoning_content), under "messages"
 * in that key's place, a top-level "system" folded in as the reader does; {"prompt"} /
 * {"text"} as a single user turn (that key replaced by "messages"); in completion mode (no
 * chat template) {"text": PROMPT} (a "prompt" key renamed "text"); a plain-text file's line
 * is such a prompt. Other top-level fields are kept. Each output line carries "regenerated":
 * {"index", "source", "settings", "tokens", "finish"}; a resumed run checks every complete
 * line against the record it names before appending. */
#ifndef DSPARK_DECODE_REGEN_IO_H
#define DSPARK_DECODE_REGEN_IO_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "dspark/common.h"

typedef struct {
  char *obj;   /* the object to write, without answers (compact JSON) */
  size_t file; /* index in regen_input.files */
  int64_t line; /* 1-based line in that file */
} regen_record;

typedef struct {
  const char *data;  /* --data as given */
  char **files;      /* the input files the records come from, in reading order */
  size_t n_files;
  regen_record *v;   /* the conversations, in the reader's order: record k is index k */
  int64_t n;
  int completion;    /* prompts continued as text, no chat template */
  int64_t bad;       /* lines skipped by --skip-bad-lines (the reader's count) */
  size_t files_read; /* input files, those without a conversation included */
} regen_input;

/* Reads every record of data (a file, directory or glob; ds_data_reader_open) and converts it
 * (see the top of this file), so a bad line is reported (file, line, field) before any
 * decoding; with skip_bad it is skipped and counted as the trainers do. The conversations are
 * held in memory (about the size of the decompressed data). */
ds_status regen_input_read(const char *data, int completion, int skip_bad, size_t max_line_bytes, regen_input *in);
void regen_input_free(regen_input *in);

/* Conversation k as the object to write; *out is the caller's. */
ds_status regen_conversation(const regen_input *in, int64_t k, cJSON **out);
/* "FILE:LINE" of conversation k into buf. */
const char *regen_source(const regen_input *in, int64_t k, char *buf, size_t n);

/* The resume contract. When out_path exists, its complete lines must each parse, carry
 * "regenerated" with this run's settings and the index of a conversation of the input
 * (increasing), and equal that conversation apart from the regenerated parts (assistant
 * messages, or the text past the prompt in completion mode); otherwise it is refused naming
 * the output line. The index (the record's place in the reader's order: files sorted by path,
 * lines in order) identifies the record; "source" (FILE:LINE) is for people and tools, so
 * data moved or named another way still resumes when its records are the same.
 * A torn last line (no newline: the writer was killed mid-line) is cut off. *next is the
 * index of the first conversation after the last line written (0 for a new file);
 * *lines the complete lines kept. */
ds_status regen_resume_scan(const char *out_path, const regen_input *in, const char *settings, int64_t *next,
                            int64_t *lines);

/* The assistant turns conversation obj gets: one per assistant message, plus one appended
 * when the last message is not the assistant's (none for an empty conversation). 1 in
 * completion mode. */
int regen_turns(const cJSON *obj, int completion);

#endif
