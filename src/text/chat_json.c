/* See chat_json.h. */
#include "text/chat_json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/json_text.h"
#include "text/tok_json.h"

/* The reasoning of one message (item of list[i]), from the first of its three spellings that
 * is not null. */
static ds_status read_reasoning(const cJSON *it, const char *label, const char *list, size_t i, ds_chat_message *m) {
  static const char *const keys[] = {"reasoning_content", "thinking", "reasoning"};
  for (int k = 0; k < 3 && !m->reasoning; k++) {
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(it, keys[k]);
    if (cJSON_IsString(r)) m->reasoning = tk_json_str(r, &m->reasoning_len);
    else if (r && !cJSON_IsNull(r))
      return DS_FAIL(DS_ERR_FORMAT, "%s: %s[%zu].%s must be a string", label, list, i, keys[k]);
  }
  return DS_OK;
}

ds_status tk_chat_messages(const cJSON *msgs, const char *label, ds_chat_message **out, size_t *n) {
  *out = NULL;
  *n = 0;
  if (!cJSON_IsArray(msgs)) return DS_FAIL(DS_ERR_FORMAT, "%s: 'messages' must be an array", label);
  ds_chat_message *m = calloc((size_t)cJSON_GetArraySize(msgs) + 1, sizeof *m);
  if (!m) return DS_FAIL(DS_ERR_NOMEM, "%s: out of memory", label);
  size_t i = 0;
  const cJSON *it;
  ds_status st = DS_OK;
  cJSON_ArrayForEach(it, msgs) {
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
    if (!cJSON_IsString(role) || !cJSON_IsString(content)) {
      st = DS_FAIL(DS_ERR_FORMAT, "%s: messages[%zu] needs string 'role' and 'content' (%s is %s)", label, i,
                   !cJSON_IsString(role) ? "role" : "content", tk_type_name(!cJSON_IsString(role) ? role : content));
      break;
    }
    size_t role_len;
    m[i].role = tk_json_str(role, &role_len);
    if (role_len != strlen(m[i].role)) {
      st = DS_FAIL(DS_ERR_FORMAT, "%s: messages[%zu].role holds a NUL character (\\u0000)", label, i);
      break;
    }
    m[i].content = tk_json_str(content, &m[i].content_len);
    if ((st = read_reasoning(it, label, "messages", i, &m[i])) != DS_OK) break;
    i++;
  }
  if (st != DS_OK) {
    free(m);
    return st;
  }
  *out = m;
  *n = i;
  return DS_OK;
}

const char *tk_sharegpt_role(const char *from) {
  static const char *const user[] = {"human", "user"};
  static const char *const assistant[] = {"gpt", "assistant", "chatgpt", "bing", "bard", "model"};
  for (size_t k = 0; k < sizeof user / sizeof *user; k++)
    if (!strcmp(from, user[k])) return "user";
  for (size_t k = 0; k < sizeof assistant / sizeof *assistant; k++)
    if (!strcmp(from, assistant[k])) return "assistant";
  if (!strcmp(from, "system")) return "system";
  if (!strcmp(from, "tool")) return "tool";
  return from;
}

ds_status tk_chat_sharegpt(const cJSON *conv, const cJSON *system, const char *label, ds_chat_message **out,
                           size_t *n) {
  *out = NULL;
  *n = 0;
  if (!cJSON_IsArray(conv)) return DS_FAIL(DS_ERR_FORMAT, "%s: 'conversations' must be an array", label);
  if (system && !cJSON_IsNull(system) && !cJSON_IsString(system))
    return DS_FAIL(DS_ERR_FORMAT, "%s: 'system' must be a string (it is %s)", label, tk_type_name(system));
  ds_chat_message *m = calloc((size_t)cJSON_GetArraySize(conv) + 2, sizeof *m);
  if (!m) return DS_FAIL(DS_ERR_NOMEM, "%s: out of memory", label);
  size_t i = 0, k = 0;
  const cJSON *first = conv->child, *first_from = first ? cJSON_GetObjectItemCaseSensitive(first, "from") : NULL;
  if (cJSON_IsString(system) && !(cJSON_IsString(first_from) && !strcmp(first_from->valuestring, "system"))) {
    m[k].role = "system";
    m[k++].content = tk_json_str(system, &m[0].content_len);
  }
  const cJSON *it;
  ds_status st = DS_OK;
  cJSON_ArrayForEach(it, conv) {
    const cJSON *from = cJSON_GetObjectItemCaseSensitive(it, "from");
    const cJSON *value = cJSON_GetObjectItemCaseSensitive(it, "value");
    if (!cJSON_IsObject(it)) {
      st = DS_FAIL(DS_ERR_FORMAT, "%s: conversations[%zu] must be an object with 'from' and 'value' (it is %s)", label,
                   i, tk_type_name(it));
      break;
    }
    if (!cJSON_IsString(from) || !cJSON_IsString(value)) {
      st = DS_FAIL(DS_ERR_FORMAT, "%s: conversations[%zu].%s must be a string (it is %s)", label, i,
                   !cJSON_IsString(from) ? "from" : "value", tk_type_name(!cJSON_IsString(from) ? from : value));
      break;
    }
    size_t from_len;
    const char *f = tk_json_str(from, &from_len);
    if (from_len != strlen(f)) {
      st = DS_FAIL(DS_ERR_FORMAT, "%s: conversations[%zu].from holds a NUL character (\\u0000)", label, i);
      break;
    }
    m[k].role = tk_sharegpt_role(f);
    m[k].content = tk_json_str(value, &m[k].content_len);
    if ((st = read_reasoning(it, label, "conversations", i, &m[k])) != DS_OK) break;
    i++;
    k++;
  }
  if (st != DS_OK) {
    free(m);
    return st;
  }
  *out = m;
  *n = k;
  return DS_OK;
}

ds_status tk_data_line(const cJSON *obj, const char *label, const char **text, size_t *text_len,
                       ds_chat_message **msgs, size_t *n) {
  *text = NULL;
  *text_len = 0;
  *msgs = NULL;
  *n = 0;
  if (!cJSON_IsObject(obj)) return DS_FAIL(DS_ERR_FORMAT, "%s: a line must be a JSON object (it is %s)", label,
                                           tk_type_name(obj));
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(obj, "text");
  const cJSON *m = cJSON_GetObjectItemCaseSensitive(obj, "messages");
  const cJSON *c = cJSON_GetObjectItemCaseSensitive(obj, "conversations");
  if (t && !cJSON_IsNull(t)) {
    if (!cJSON_IsString(t)) return DS_FAIL(DS_ERR_FORMAT, "%s: 'text' must be a string (it is %s)", label,
                                           tk_type_name(t));
    *text = tk_json_str(t, text_len);
    return DS_OK;
  }
  if (m && !cJSON_IsNull(m)) return tk_chat_messages(m, label, msgs, n);
  if (c && !cJSON_IsNull(c))
    return tk_chat_sharegpt(c, cJSON_GetObjectItemCaseSensitive(obj, "system"), label, msgs, n);
  return DS_FAIL(DS_ERR_FORMAT, "%s: a line needs a string 'text', a list 'messages' (role / content) or a list "
                 "'conversations' (ShareGPT from / value); it has none of them", label);
}
