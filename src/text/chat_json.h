/* The one reader of a chat line's "messages" array, shared by `dspark tokenize --chat`, the
 * training data loader and the prompt readers, so that every path sees the same fields. */
#ifndef DSPARK_TEXT_CHAT_JSON_H
#define DSPARK_TEXT_CHAT_JSON_H

#include <cjson/cJSON.h>

#include "dspark/tokenizer.h"

/* msgs (from tk_json_parse_text, so strings keep "\u0000" as NUL) -> *out, a malloc'd array
 * of *n messages pointing into the cJSON tree. Each needs string role and content; an
 * assistant's reasoning is read from reasoning_content, thinking or reasoning (the first
 * that is not null), as transformers aliases them. Errors name label and messages[i].field. */
ds_status tk_chat_messages(const cJSON *msgs, const char *label, ds_chat_message **out, size_t *n);

#endif
