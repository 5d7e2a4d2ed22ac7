/* Training text: plain text or JSONL (plain {"text": ...} or chat {"messages": [...]}) ->
 * token ids + loss mask -> sequences of at most seq_len tokens.
 *
 * Plain text (a .txt file, or {"text"} lines): documents are tokenized, joined with the EOS
 * token and cut into consecutive windows of seq_len tokens; every token is supervised.
 * Chat ({"messages"} lines): each conversation is rendered with the ChatML template and is
 * one sequence (truncated to seq_len), supervised on the assistant turns only. */
#ifndef DSPARK_DATASET_H
#define DSPARK_DATASET_H

#include "dspark/common.h"
#include "dspark/sequences.h"
#include "dspark/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* eos_id < 0: plain-text documents are joined without a separator. min_len: sequences
 * shorter than this are dropped (at least 2: a draft needs a token to predict). */
ds_status ds_dataset_load(const char *path, const ds_tokenizer *tok, int64_t seq_len, int32_t eos_id,
                          int64_t min_len, ds_dataset *out);

#ifdef __cplusplus
}
#endif
#endif
