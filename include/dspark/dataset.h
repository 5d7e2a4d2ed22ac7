/* Training text: plain text or JSONL (plain {"text": ...} or chat {"messages": [...]}) ->
 * token ids + loss mask -> sequences of at most seq_len tokens.
 *
 * Plain text (a .txt file, or {"text"} lines): documents are tokenized, joined with the EOS
 * token and cut into consecutive windows of seq_len tokens; every token is supervised.
 * Chat ({"messages"} lines): each conversation is rendered with the model's chat template
 * (ds_dataset_load_chat; ChatML with ds_dataset_load) and is one sequence (truncated to
 * seq_len), supervised on the assistant turns only (include/dspark/chat_template.h says
 * which tokens). The format is
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

/* Loads and packs a data file. eos_id < 0: plain-text documents are joined without a
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

#ifdef __cplusplus
}
#endif
#endif
