/* Internal to regeneration (dspark/regenerate.h): regenerate.c schedules the turns and writes
 * the lines, regen_turns.c renders a turn's prompt and writes its answer into the conversation. */
#ifndef DSPARK_DECODE_REGEN_INTERNAL_H
#define DSPARK_DECODE_REGEN_INTERNAL_H

#include <cjson/cJSON.h>
#include <stdio.h>

#include "decode/regen_io.h"
#include "dspark/regenerate.h"
#include "dspark/speculate.h"

struct ds_regen {
  ds_regen_options o;
  const ds_tokenizer *tok;
  const ds_chat_template *tmpl;
  int64_t max_pos;
  int split_reasoning; /* the template renders reasoning: split a generated <think> block */
  regen_input in;
  FILE *f;             /* the output, locked, appending */
  int64_t next;        /* the first conversation not written yet */
  ds_regen_summary sum;
  int64_t kill_at;     /* the test hook (regenerate.c) */
};

/* One conversation in flight. */
typedef struct {
  int64_t index;
  cJSON *obj, *tokens, *finish; /* the output object; its per-turn counts */
  int turns, turn;              /* assistant turns; the one being decoded */
  int skipped;                  /* 1 too long or empty, 2 a bad conversation (skip_bad) */
  int kept;                     /* the current turn keeps the source's reasoning */
  int complete;                 /* every turn answered (or skipped): ready to write */
  ds_ids prompt;                /* the current turn's prompt while it decodes */
} regen_conv;

/* "FILE:LINE" of c into buf. */
const char *regen_conv_label(const ds_regen *g, const regen_conv *c, char *buf, size_t n);
/* Renders c's turn c->turn into c->prompt: 1 when it is to be decoded, 0 when the conversation
 * is skipped (too long, empty, or refused by the template under skip_bad: named on stderr). */
ds_status regen_turn_prompt(ds_regen *g, regen_conv *c, int *decode);
/* Writes the answer of turn c->turn (ids, stopped) into c and counts it. */
ds_status regen_apply_answer(ds_regen *g, regen_conv *c, const ds_spec_result *res);
/* What changes the output's bytes, hashed into g->sum.settings; whether the template renders
 * reasoning into g->split_reasoning. */
void regen_settings(ds_regen *g);

#endif
