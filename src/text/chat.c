/* ChatML rendering (Qwen): "<|im_start|>{role}\n{content}<|im_end|>\n" per message.
 *
 * Each message is rendered and encoded as one string, so its ids are exactly what HF gives
 * for the rendered conversation (a message ends with "\n" and the next one starts with the
 * added token <|im_start|>, so no token spans two messages). The loss mask is found from
 * the bytes each token decodes to: within an assistant message, every token that ends past
 * "<|im_start|>assistant\n" gets 1, i.e. the content and the "<|im_end|>\n" closing; a
 * token straddling that boundary (a content starting with a newline can merge with the
 * template's) contains content bytes, so it is trained on too. */
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"

static const char k_start[] = "<|im_start|>", k_end[] = "<|im_end|>";

/* Bytes the tokens of "<|im_start|>{role}\n" decode to: the role may change under NFC. */
static ds_status header_len(const ds_tokenizer *tok, const char *role, size_t *out) {
  size_t rl = strlen(role);
  *out = strlen(k_start) + rl + 1;
  if (!tok->nfc || tk_nfc_is_quick(tok->nfc, (const unsigned char *)role, rl)) return DS_OK;
  tk_buf b = {0};
  ds_status st = tk_nfc_append(tok->nfc, (const unsigned char *)role, rl, &b);
  *out = strlen(k_start) + b.len + 1;
  tk_buf_free(&b);
  return st;
}

ds_status ds_chat_encode_chatml(const ds_tokenizer *tok, const ds_chat_message *msgs, size_t n,
                                int add_generation_prompt, ds_ids *ids, ds_ids *loss_mask) {
  if (!tok || !ids || !loss_mask || (!msgs && n)) return DS_FAIL(DS_ERR_ARG, "ds_chat_encode_chatml: NULL argument");
  if (ds_tokenizer_token_to_id(tok, k_start) < 0 || ds_tokenizer_token_to_id(tok, k_end) < 0)
    return DS_FAIL(DS_ERR_NOT_FOUND, "%s has no %s / %s tokens: not a ChatML tokenizer", tok->label, k_start, k_end);
  size_t ids0 = ids->len, mask0 = loss_mask->len;
  tk_buf text = {0};
  ds_status st = DS_OK;
  for (size_t m = 0; m <= n && st == DS_OK; m++) {
    const char *role = m < n ? msgs[m].role : "assistant";
    const char *content = m < n ? msgs[m].content : NULL;
    if (m == n && !add_generation_prompt) break;
    if (!role || (m < n && !content)) {
      st = DS_FAIL(DS_ERR_ARG, "chat message %zu has no %s", m, role ? "content" : "role");
      break;
    }
    text.len = 0;
    if ((st = tk_buf_append(&text, k_start, strlen(k_start))) != DS_OK ||
        (st = tk_buf_append(&text, role, strlen(role))) != DS_OK || (st = tk_buf_append(&text, "\n", 1)) != DS_OK)
      break;
    size_t content_len = content ? (m < n && msgs[m].content_len ? msgs[m].content_len : strlen(content)) : 0;
    if (content && ((st = tk_buf_append(&text, content, content_len)) != DS_OK ||
                    (st = tk_buf_append(&text, k_end, strlen(k_end))) != DS_OK ||
                    (st = tk_buf_append(&text, "\n", 1)) != DS_OK))
      break;
    size_t first = ids->len, head = 0;
    if ((st = ds_tokenizer_encode(tok, (const char *)text.p, text.len, 0, ids)) != DS_OK) {
      ds_error_wrap(st, "chat message %zu", m);
      break;
    }
    int train = content && !strcmp(role, "assistant");
    if (train && (st = header_len(tok, role, &head)) != DS_OK) break;
    size_t bytes = 0;
    for (size_t i = first; i < ids->len && st == DS_OK; i++) {
      bytes += tk_token_byte_len(tok, ids->ids[i]);
      st = ds_ids_push(loss_mask, train && bytes > head ? 1 : 0);
    }
  }
  tk_buf_free(&text);
  if (st != DS_OK) {
    ids->len = ids0;
    loss_mask->len = mask0;
  }
  return st;
}
