/* The one reader of a data line's JSON, shared by `dspark tokenize --chat`, the training data
 * loader and the prompt readers, so that every path sees the same fields and shapes. */
#ifndef DSPARK_TEXT_CHAT_JSON_H
#define DSPARK_TEXT_CHAT_JSON_H

#include <cjson/cJSON.h>

#include "dspark/tokenizer.h"

/* msgs (from tk_json_parse_text, so strings keep "\u0000" as NUL) -> *out, a malloc'd array
 * of *n messages pointing into the cJSON tree. Each needs string role and content; an
 * assistant's reasoning is read from reasoning_content, thinking or reasoning (the first
 * that is not null), as transformers aliases them. Errors name label and messages[i].field. */
ds_status tk_chat_messages(const cJSON *msgs, const char *label, ds_chat_message **out, size_t *n);

/* ShareGPT: conv is the "conversations" list of {"from", "value"} turns (reasoning read as in
 * tk_chat_messages); system, when a string, is a top-level system prompt placed first unless
 * the first turn already is one. from maps to a role by tk_sharegpt_role. Errors name label
 * and conversations[i].field. */
ds_status tk_chat_sharegpt(const cJSON *conv, const cJSON *system, const char *label, ds_chat_message **out,
                           size_t *n);
/* human, user -> user; gpt, assistant, chatgpt, bing, bard, model -> assistant; system ->
 * system; tool -> tool; anything else is kept as the role (the template, or ChatML's
 * unknown-role warning, decides what it means). Case-sensitive, as roles are. */
const char *tk_sharegpt_role(const char *from);

/* What one JSONL line holds: a document ({"text": ...}) or a conversation ({"messages": [...]}
 * or {"conversations": [...]}, looked for in that order). For a document *msgs is NULL and
 * *text points into obj; for a conversation *msgs is malloc'd as tk_chat_messages'. A line
 * with none of the three, or with one of the wrong type, is refused naming label and the
 * field. */
ds_status tk_data_line(const cJSON *obj, const char *label, const char **text, size_t *text_len,
                       ds_chat_message **msgs, size_t *n);

#endif
