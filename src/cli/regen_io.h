/* The files of `dspark regenerate`: the conversations it reads (one per input line) and the
 * output it appends to and resumes from (README "Regenerating answers with the target").
 *
 * Every input line becomes the JSON object that will be written out once its answers are
 * replaced: {"messages": [...]} as given; {"prompt"} / {"text"} as a single user turn (that
 * key replaced by "messages"); in completion mode (no chat template) {"text": PROMPT} (a
 * "prompt" key renamed "text"), a plain-text file's line being such a prompt. Each output
 * line carries "regenerated": {"source_line", "settings", "tokens", "finish"}; a resumed run
 * checks every complete line against the input line it names before appending. */
#ifndef DSPARK_CLI_REGEN_IO_H
#define DSPARK_CLI_REGEN_IO_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "dspark/common.h"

typedef struct {
  size_t off, len; /* the line's bytes in buf (no newline) */
  int64_t line;    /* 1-based line number in the file */
} regen_line;

typedef struct {
  const char *path;
  char *buf;
  size_t len;
  regen_line *v; /* the non-blank lines: the conversations, in order */
  int64_t n;
  int jsonl;       /* .jsonl / .ndjson: JSON lines; else one plain-text prompt per line */
  int completion;  /* prompts continued as text, no chat template */
  int skip_bad;    /* a line that does not convert is skipped (said on stderr, counted), not an error */
  int64_t bad;     /* lines skipped so */
} regen_input;

/* Reads path and checks every line converts (regen_conversation_from_line), so a bad line is
 * reported (file, line, field) before any decoding; with skip_bad it is left out instead
 * (named on stderr, counted in in->bad). */
ds_status regen_input_read(const char *path, int completion, int skip_bad, regen_input *in);
void regen_input_free(regen_input *in);

/* Conversation k of the input as the object to write (see the top of this file); *out is
 * the caller's. This is the one place where an input line is read: a reader of more formats
 * (ShareGPT, compressed files) plugs in here. */
ds_status regen_conversation_from_line(const regen_input *in, int64_t k, cJSON **out);

/* The resume contract. When out_path exists, its complete lines must each parse, carry
 * "regenerated" with this run's settings and a source_line of the input (increasing), and
 * equal that input conversation apart from the regenerated parts (assistant messages, or the
 * text past the prompt in completion mode); otherwise it is refused naming the output line.
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
