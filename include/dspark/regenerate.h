/* Regeneration: each conversation's assistant turns replaced by the target's own answers, so a
 * draft trains on what its target says (docs/speculative-decoding.md "Regenerating answers with
 * the target"; `dspark regenerate` is this stage behind a command line).
 *
 * A turn's prompt is the conversation up to it, its earlier answers already regenerated, rendered
 * by the chat template with the generation prompt (or, in completion mode, the text itself).
 * Turn r of conversation k (its index in the reader's order) samples with the seed
 * mix(mix(S, k), r), so neither the batching nor a resume changes a byte.
 *
 * Plain decoding batches continuously: up to `batch` turns decode together and a finished turn's
 * place goes at once to the next one (a conversation's next turn first, then the next
 * conversation). With a draft (speculative decoding, the same output when greedy) conversations
 * go in groups of `batch`, one round per turn index. Lines are appended in input order and
 * fsync'd; a rerun after a kill checks the lines written (decode/regen_io.h) and goes on after
 * the last one, so the file ends byte for byte as an uninterrupted run writes it. */
#ifndef DSPARK_REGENERATE_H
#define DSPARK_REGENERATE_H

#include "dspark/chat_template.h"
#include "dspark/draft.h"
#include "dspark/target.h"
#include "dspark/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DS_THINK_DEFAULT = 0, DS_THINK_ON, DS_THINK_OFF, DS_THINK_KEEP } ds_regen_thinking;

typedef struct {
  const char *data;      /* conversations: a file, directory or glob, as the trainers read them */
  const char *out;       /* the JSONL output, appended to (and resumed from) */
  double temperature;    /* 0 = greedy */
  double top_p;          /* 1 = off */
  int64_t max_new;       /* tokens per answer at most */
  int64_t seed;
  int64_t batch;         /* turns decoded together */
  ds_regen_thinking thinking;
  int completion;        /* no chat template: {"text"} / {"prompt"} continued as text */
  int ignore_eos;
  int skip_bad;          /* skip (and count) a malformed line or a conversation the template refuses */
  int speculative;       /* a draft will decode (part of the settings: sampled output differs) */
  size_t max_line_bytes; /* 0: the reader's default */
} ds_regen_options;

typedef struct {
  size_t files;            /* input files read */
  int64_t conversations;   /* in the input */
  int64_t resumed_after;   /* conversations the output already held */
  int64_t lines_kept, lines_written;
  int64_t skipped;         /* too long for the positions, or empty */
  int64_t bad;             /* bad lines and refused conversations (skip_bad) */
  int64_t bad_lines;       /* of which lines the reader skipped (not among the conversations) */
  int64_t turns, tokens, eos, length;
  double seconds;
  char settings[17];       /* the hash of what changes the output's bytes */
} ds_regen_summary;

typedef struct ds_regen ds_regen;

/* Reads every conversation of o->data (a bad line is reported before any decoding), locks
 * o->out against a second writer and checks what it already holds. tmpl NULL: ChatML (unused in
 * completion mode); tok, tmpl and o must outlive the regeneration; max_positions is the target's
 * max_position_embeddings (a turn whose prompt plus max_new exceeds it is skipped and named). */
ds_status ds_regen_open(const ds_regen_options *o, const ds_tokenizer *tok, const ds_chat_template *tmpl,
                        int64_t max_positions, ds_regen **out);
/* Conversations still to regenerate (0: the output is complete; no target is needed). */
int64_t ds_regen_remaining(const ds_regen *g);
/* Regenerates the remaining conversations with target (and draft, NULL for plain decoding),
 * with a progress line (rate, ETA) on stderr. */
ds_status ds_regen_run(ds_regen *g, ds_target *target, ds_draft *draft);
/* The counts so far; the output is closed (flushed, fsync'd) by ds_regen_run. */
void ds_regen_get_summary(const ds_regen *g, ds_regen_summary *s);
void ds_regen_close(ds_regen *g);

#ifdef __cplusplus
}
#endif
#endif
