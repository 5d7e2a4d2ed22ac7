/* libFuzzer target for the tokenizer. The first byte picks the mode:
 *   0        the rest is a tokenizer.json for ds_tokenizer_load_memory; a tokenizer that loads
 *            encodes and decodes a fixed text (and the fuzz bytes as text, when UTF-8);
 *   1, 2, 3  the rest is text for a fixed tokenizer built from an embedded tokenizer.json:
 *            GPT-2 style (ByteLevel regex, lstrip/rstrip and single_word added tokens),
 *            Qwen2 style (Split regex + NFC) or Llama-3 style (ignore_merges + template).
 *            For valid UTF-8, decode(encode(x)) must give x back (with NFC: a fixed point,
 *            encode(decode(encode(x))) decodes to the same text), and ChatML rendering of the
 *            text split into two messages must succeed with a mask as long as the ids.
 * Invalid UTF-8 must be refused with DS_ERR_ARG. */
#define _GNU_SOURCE /* memmem */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct {
  char *p;
  size_t len, cap;
} sbuf;

static void put(sbuf *b, const char *s) {
  size_t n = strlen(s);
  if (b->len + n + 1 > b->cap) {
    b->cap = (b->len + n + 1) * 2;
    b->p = realloc(b->p, b->cap);
    if (!b->p) abort();
  }
  memcpy(b->p + b->len, s, n + 1);
  b->len += n;
}

/* The 256 byte-level characters as vocab entries 0..255, then a few merges that build
 * words, whitespace runs, digits and a multi-byte character. */
static char *make_json(int mode) {
  sbuf b = {0};
  char tmp[256];
  put(&b, "{\"added_tokens\": [");
  put(&b, "{\"id\": 268, \"content\": \"<|endoftext|>\", \"normalized\": false, \"special\": true}, "
          "{\"id\": 269, \"content\": \"<|im_start|>\", \"normalized\": false, \"special\": true}, "
          "{\"id\": 270, \"content\": \"<|im_end|>\", \"normalized\": false, \"special\": true}");
  if (mode == 1)
    put(&b, ", {\"id\": 271, \"content\": \"<m>\", \"lstrip\": true, \"rstrip\": true, \"normalized\": false, "
            "\"special\": true}, {\"id\": 272, \"content\": \"ab\", \"single_word\": true}");
  put(&b, "],\n");
  if (mode == 1) {
    put(&b, "\"normalizer\": null, \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false},\n"
            "\"post_processor\": null,\n");
  } else {
    const char *digits = mode == 2 ? "\\\\p{N}" : "\\\\p{N}{1,3}";
    snprintf(tmp, sizeof tmp, "%s", digits);
    put(&b, mode == 2 ? "\"normalizer\": {\"type\": \"NFC\"},\n" : "\"normalizer\": null,\n");
    put(&b, "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
            "{\"Regex\": \"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|");
    put(&b, tmp);
    put(&b, "| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"}, "
            "\"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
            "\"use_regex\": false}]},\n");
    put(&b, mode == 3 ? "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": "
                        "{\"id\": \"<|endoftext|>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], "
                        "\"special_tokens\": {\"<|endoftext|>\": {\"id\": \"<|endoftext|>\", \"ids\": [268]}}},\n"
                      : "\"post_processor\": {\"type\": \"ByteLevel\", \"trim_offsets\": false},\n");
  }
  put(&b, "\"decoder\": {\"type\": \"ByteLevel\"},\n\"model\": {\"type\": \"BPE\", \"ignore_merges\": ");
  put(&b, mode == 3 ? "true" : "false");
  put(&b, ", \"vocab\": {");
  int n = 0;
  for (int c = 0; c < 256; c++) {
    int printable = (c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
    int cp = printable ? c : 256 + n++;
    unsigned char u[3] = {0};
    if (cp < 0x80) u[0] = (unsigned char)cp;
    else { u[0] = (unsigned char)(0xC0 | cp >> 6); u[1] = (unsigned char)(0x80 | (cp & 0x3F)); }
    snprintf(tmp, sizeof tmp, "%s\"%s%s\": %d", c ? ", " : "", (c == '"' || c == '\\') ? "\\" : "", (char *)u, c);
    put(&b, tmp);
  }
  static const char *const extra[] = {"he", "ll", "hell", "hello", "Ġw", "or", "Ġwor", "ld", "Ġworld",
                                      "ĠĠ", "12"};
  static const char *const merges[] = {"h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d",
                                       "Ġwor ld", "Ġ Ġ", "1 2"};
  for (int i = 0; i < 11; i++) {
    snprintf(tmp, sizeof tmp, ", \"%s\": %d", extra[i], 256 + i);
    put(&b, tmp);
  }
  put(&b, ", \"Ã©\": 267}, \"merges\": [");
  for (int i = 0; i < 11; i++) {
    snprintf(tmp, sizeof tmp, "\"%s\", ", merges[i]);
    put(&b, tmp);
  }
  put(&b, "\"Ã ©\"]}}");
  return b.p;
}

static ds_tokenizer *fixed(int mode) {
  static ds_tokenizer *toks[4];
  if (!toks[mode]) {
    char *json = make_json(mode);
    if (ds_tokenizer_load_memory(json, strlen(json), "fuzz-fixed.json", &toks[mode]) != DS_OK) {
      fprintf(stderr, "fixed tokenizer %d: %s\n", mode, ds_last_error());
      abort();
    }
    free(json);
  }
  return toks[mode];
}

/* Encodes then decodes; returns the decoded text (malloc'd) or NULL when refused. */
static char *round_trip(const ds_tokenizer *tok, const char *text, size_t len, size_t *out_len, ds_ids *ids) {
  ids->len = 0;
  ds_status st = ds_tokenizer_encode(tok, text, len, 0, ids);
  if (st != DS_OK) return NULL;
  for (size_t i = 0; i < ids->len; i++) DS_CHECK(ids->ids[i] >= 0 && ids->ids[i] < ds_tokenizer_vocab_size(tok));
  char *out = NULL;
  DS_CHECK(ds_tokenizer_decode(tok, ids->ids, ids->len, 0, &out, out_len) == DS_OK);
  return out;
}

static void text_mode(int mode, const char *text, size_t len) {
  const ds_tokenizer *tok = fixed(mode);
  ds_ids ids = {0};
  size_t n1 = 0;
  char *once = round_trip(tok, text, len, &n1, &ids);
  int has_nul = memchr(text, 0, len) != NULL;
  if (!once) {
    DS_CHECK(strstr(ds_last_error(), "UTF-8") != NULL); /* the only refusal of a loaded tokenizer */
    ds_ids_free(&ids);
    return;
  }
  if (mode == 1 && memmem(text, len, "<m>", 3)) {
    /* lstrip/rstrip: the token absorbs the white space around it, no round trip */
  } else if (mode != 2) {
    DS_CHECK(n1 == len && !memcmp(once, text, len));
  } else {
    size_t n2 = 0;
    char *twice = round_trip(tok, once, n1, &n2, &ids);
    DS_CHECK(twice && n2 == n1 && !memcmp(once, twice, n1));
    free(twice);
  }
  /* add_special wraps the same ids */
  ds_ids with = {0};
  DS_CHECK(ds_tokenizer_encode(tok, text, len, 1, &with) == DS_OK);
  DS_CHECK(with.len == ids.len + (mode == 3));
  ds_ids_free(&with);
  free(once);
  if (!has_nul) { /* ChatML takes C strings: split the text in two at a character boundary */
    size_t k = len / 2;
    while (k < len && ((unsigned char)text[k] & 0xC0) == 0x80) k++;
    char *first = malloc(k + 1), *second = malloc(len - k + 1);
    memcpy(first, text, k);
    first[k] = 0;
    memcpy(second, text + k, len - k);
    second[len - k] = 0;
    ds_chat_message m[2] = {{.role = "user", .content = first}, {.role = "assistant", .content = second}};
    ds_ids cids = {0}, mask = {0};
    DS_CHECK(ds_chat_encode_chatml(tok, m, 2, 1, &cids, &mask) == DS_OK);
    DS_CHECK(cids.len == mask.len && cids.len >= 9);
    ds_ids_free(&cids);
    ds_ids_free(&mask);
    free(first);
    free(second);
  }
  ds_ids_free(&ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  int mode = data[0] & 3;
  const char *rest = (const char *)data + 1;
  size_t n = size - 1;
  if (mode) {
    text_mode(mode, rest, n);
    return 0;
  }
  ds_tokenizer *tok = NULL;
  if (ds_tokenizer_load_memory(rest, n, "fuzz.json", &tok) != DS_OK) {
    DS_CHECK(tok == NULL);
    return 0;
  }
  static const char sample[] = "Hello  world 12345 <|endoftext|> caf\xc3\xa9 e\xcc\x81 \xe5\x8c\x97\n\t x";
  ds_ids ids = {0};
  if (ds_tokenizer_encode(tok, sample, sizeof sample - 1, 1, &ids) == DS_OK) {
    char *out = NULL;
    size_t len;
    DS_CHECK(ds_tokenizer_decode(tok, ids.ids, ids.len, 1, &out, &len) == DS_OK);
    free(out);
  }
  ids.len = 0;
  if (ds_tokenizer_encode(tok, rest, n, 0, &ids) == DS_OK) {
    char *out = NULL;
    size_t len;
    DS_CHECK(ds_tokenizer_decode(tok, ids.ids, ids.len, 0, &out, &len) == DS_OK);
    free(out);
  }
  for (int32_t id = -1; id < 300; id++) (void)ds_tokenizer_id_to_token(tok, id);
  (void)ds_tokenizer_token_to_id(tok, "<|endoftext|>");
  ds_ids_free(&ids);
  ds_tokenizer_free(tok);
  return 0;
}
