/* A GGUF file's tokenizer as the texts of tokenizer.json and tokenizer_config.json
 * (include/dspark/gguf_model.h), built as transformers builds it from the same file
 * (integrations/gguf): byte-level BPE over the file's tokens and merges, control tokens (type 3)
 * as special added tokens and user-defined ones (type 4) as added tokens, and the split of the
 * pre-tokenizer the file names. */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf_internal.h"

/* The pre-tokenizers (`tokenizer.ggml.pre`) and the split transformers uses for each; NULL: the
 * GPT-2 regex of a plain byte-level pre-tokenizer. */
static const char k_llama3_split[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";
static const char k_qwen2_split[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

static const struct {
  const char *pre, *split;
} k_pre[] = {
    {"default", NULL},         {"gpt2", NULL},           {"gpt-2", NULL},          {"smollm", NULL},
    {"starcoder", NULL},       {"llama3", k_llama3_split}, {"llama-v3", k_llama3_split}, {"llama-bpe", k_llama3_split},
    {"smaug-bpe", k_llama3_split}, {"dbrx", k_llama3_split}, {"qwen2", k_qwen2_split}, {"deepseek-r1-qwen", k_qwen2_split},
};

static int str_is(ds_gguf_str s, const char *c) { return s.len == strlen(c) && !memcmp(s.p, c, (size_t)s.len); }

static char *dup_str(ds_gguf_str s) {
  char *c = malloc((size_t)s.len + 1);
  if (c) {
    memcpy(c, s.p, (size_t)s.len);
    c[s.len] = 0;
  }
  return c;
}

ds_status ds_gguf_special_tokens(const ds_gguf *g, int64_t vocab, ds_gguf_special *out) {
  static const char *const keys[4] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                      "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id"};
  int64_t *dst[4] = {&out->bos, &out->eos, &out->unk, &out->pad};
  for (int i = 0; i < 4; i++) {
    *dst[i] = -1;
    DS_TRY(ds_gguf_get_int(g, keys[i], 0, dst[i]));
    if (*dst[i] != -1 && (*dst[i] < 0 || *dst[i] >= vocab))
      return DS_FAIL(DS_ERR_RANGE, "%s: %s %lld is outside the vocabulary of %lld", ds_gguf_path(g), keys[i],
                     (long long)*dst[i], (long long)vocab);
  }
  out->add_bos = 0;
  return ds_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", 0, &out->add_bos);
}

/* GPT-2's byte alphabet: byte b is spelled by itself when printable (33-126, 161-172, 174-255),
 * else by 256 + its rank among the others. */
static int printable_byte(unsigned b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255); }

static unsigned g_byte_chars[256];
static void fill_byte_chars(void) {
  for (unsigned x = 0, n = 0; x < 256; x++) g_byte_chars[x] = printable_byte(x) ? x : 256 + n++;
}

static unsigned byte_char(unsigned b) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, fill_byte_chars);
  return g_byte_chars[b & 255];
}

static size_t put_utf8(char *o, unsigned cp) {
  if (cp < 0x80) return o[0] = (char)cp, 1;
  o[0] = (char)(0xC0 | cp >> 6);
  o[1] = (char)(0x80 | (cp & 0x3F));
  return 2; /* the alphabet stays below U+0800 */
}

/* 1 when every character of s (UTF-8) is in the byte alphabet, as transformers asks before it
 * keeps a token's spelling; 0 also for bytes that are not UTF-8. */
static int in_alphabet(ds_gguf_str s) {
  const unsigned char *p = (const unsigned char *)s.p, *e = p + s.len;
  while (p < e) {
    unsigned cp;
    if (p[0] < 0x80) cp = *p++;
    else if ((p[0] & 0xE0) == 0xC0 && e - p >= 2 && (p[1] & 0xC0) == 0x80) cp = (p[0] & 0x1Fu) << 6 | (p[1] & 0x3Fu), p += 2;
    else return 0; /* three-byte characters and more are above the alphabet (at most U+0143) */
    if (cp < 256 ? byte_char(cp) != cp : cp > 256 + 67) return 0;
  }
  return 1;
}

/* A token as the vocabulary spells it: itself when in the alphabet, else its UTF-8 bytes spelled
 * one by one (what transformers does with such tokens). */
static char *spelled(ds_gguf_str s) {
  if (in_alphabet(s)) return dup_str(s);
  char *o = malloc((size_t)s.len * 2 + 1);
  if (!o) return NULL;
  size_t n = 0;
  for (uint64_t i = 0; i < s.len; i++) n += put_utf8(o + n, byte_char((unsigned char)s.p[i]));
  o[n] = 0;
  return o;
}

/* qsort has no context argument: the spellings being sorted (one conversion at a time) */
static char *const *g_sort_names;
static int by_spelling(const void *a, const void *b) {
  size_t x = *(const size_t *)a, y = *(const size_t *)b;
  int c = strcmp(g_sort_names[x], g_sort_names[y]);
  return c ? c : (x > y) - (x < y); /* equal spellings in id order: the last one is kept */
}

static cJSON *byte_level(int use_regex) {
  cJSON *b = cJSON_CreateObject();
  cJSON_AddStringToObject(b, "type", "ByteLevel");
  cJSON_AddBoolToObject(b, "add_prefix_space", 0);
  cJSON_AddBoolToObject(b, "trim_offsets", 1);
  cJSON_AddBoolToObject(b, "use_regex", use_regex);
  return b;
}

static ds_status pre_tokenizer(const ds_gguf *g, cJSON **out) {
  ds_gguf_str pre = {"default", 7};
  DS_TRY(ds_gguf_get_str(g, "tokenizer.ggml.pre", 0, &pre));
  for (size_t i = 0; i < sizeof k_pre / sizeof k_pre[0]; i++) {
    if (!str_is(pre, k_pre[i].pre)) continue;
    if (!k_pre[i].split) {
      *out = byte_level(1);
      return DS_OK;
    }
    cJSON *seq = cJSON_CreateObject(), *list = cJSON_AddArrayToObject(seq, "pretokenizers"),
          *split = cJSON_CreateObject(), *pattern = cJSON_AddObjectToObject(split, "pattern");
    cJSON_AddStringToObject(seq, "type", "Sequence");
    cJSON_AddStringToObject(split, "type", "Split");
    cJSON_AddStringToObject(pattern, "Regex", k_pre[i].split);
    cJSON_AddStringToObject(split, "behavior", "Isolated");
    cJSON_AddBoolToObject(split, "invert", 0);
    cJSON_AddItemToArray(list, split);
    cJSON_AddItemToArray(list, byte_level(0));
    *out = seq;
    return DS_OK;
  }
  return DS_FAIL(DS_ERR_UNSUPPORTED, "%s: tokenizer.ggml.pre '%.*s' is not a pre-tokenizer this engine maps (default, "
                 "gpt2, smollm, starcoder, the llama3 and qwen2 families)", ds_gguf_path(g),
                 pre.len > 48 ? 48 : (int)pre.len, pre.p);
}

static cJSON *added_token(int64_t id, const char *content, int special) {
  cJSON *a = cJSON_CreateObject();
  cJSON_AddNumberToObject(a, "id", (double)id);
  cJSON_AddStringToObject(a, "content", content);
  cJSON_AddBoolToObject(a, "single_word", 0);
  cJSON_AddBoolToObject(a, "lstrip", 0);
  cJSON_AddBoolToObject(a, "rstrip", 0);
  cJSON_AddBoolToObject(a, "normalized", 0);
  cJSON_AddBoolToObject(a, "special", special);
  return a;
}

/* j as the file's text (indented), and j freed; NULL when out of memory. */
static char *json_text(cJSON *j) {
  char *text = j ? cJSON_Print(j) : NULL;
  cJSON_Delete(j);
  return text;
}

static ds_status tokenizer_json(const ds_gguf *g, const ds_gguf_kv *tokens, const ds_gguf_kv *types,
                                const ds_gguf_kv *merges, char **out) {
  cJSON *root = cJSON_CreateObject(), *added = cJSON_AddArrayToObject(root, "added_tokens"), *pre = NULL;
  ds_status st = pre_tokenizer(g, &pre);
  cJSON_AddStringToObject(root, "version", "1.0");
  cJSON_AddNullToObject(root, "truncation");
  cJSON_AddNullToObject(root, "padding");
  cJSON_AddNullToObject(root, "normalizer");
  if (pre) cJSON_AddItemToObject(root, "pre_tokenizer", pre);
  cJSON_AddNullToObject(root, "post_processor");
  cJSON_AddItemToObject(root, "decoder", byte_level(1));
  cJSON *model = cJSON_AddObjectToObject(root, "model"), *vocab = cJSON_CreateObject();
  cJSON_AddStringToObject(model, "type", "BPE");
  cJSON_AddNullToObject(model, "dropout");
  cJSON_AddNullToObject(model, "unk_token");
  cJSON_AddStringToObject(model, "continuing_subword_prefix", "");
  cJSON_AddStringToObject(model, "end_of_word_suffix", "");
  cJSON_AddBoolToObject(model, "fuse_unk", 0);
  cJSON_AddBoolToObject(model, "byte_fallback", 0);
  cJSON_AddBoolToObject(model, "ignore_merges", 0);
  cJSON_AddItemToObject(model, "vocab", vocab);
  size_t n = (size_t)tokens->count;
  char **sp = calloc(n ? n : 1, sizeof *sp);
  size_t *order = malloc((n ? n : 1) * sizeof *order);
  if (!sp || !order) st = DS_FAIL(DS_ERR_NOMEM, "tokenizer.json");
  for (size_t i = 0; st == DS_OK && i < n; i++) {
    order[i] = i;
    if (!(sp[i] = spelled(tokens->strs[i]))) st = DS_FAIL(DS_ERR_NOMEM, "tokenizer.json");
  }
  /* a spelling twice: transformers' dict keeps the last id, so the earlier ones leave the vocab */
  if (st == DS_OK) {
    g_sort_names = sp;
    qsort(order, n, sizeof *order, by_spelling);
    for (size_t i = 0; i + 1 < n; i++)
      if (!strcmp(sp[order[i]], sp[order[i + 1]])) {
        free(sp[order[i]]);
        sp[order[i]] = NULL;
      }
  }
  for (size_t i = 0; st == DS_OK && i < n; i++) {
    if (!sp[i]) continue;
    cJSON_AddItemToObject(vocab, sp[i], cJSON_CreateNumber((double)i));
    int64_t type = types ? ds_gguf_array_i64(types, i) : 1;
    /* control tokens in the alphabet are special; user-defined ones are plain added tokens */
    if ((type == 3 && in_alphabet(tokens->strs[i])) || type == 4)
      cJSON_AddItemToArray(added, added_token((int64_t)i, sp[i], type == 3));
  }
  for (size_t i = 0; sp && i < n; i++) free(sp[i]);
  free(sp);
  free(order);
  cJSON *m = cJSON_AddArrayToObject(model, "merges");
  for (uint64_t i = 0; st == DS_OK && merges && i < merges->count; i++) {
    char *t = dup_str(merges->strs[i]);
    if (!t) st = DS_FAIL(DS_ERR_NOMEM, "tokenizer.json");
    else cJSON_AddItemToArray(m, cJSON_CreateString(t));
    free(t);
  }
  if (st != DS_OK) {
    cJSON_Delete(root);
    return st;
  }
  *out = json_text(root);
  return *out ? DS_OK : DS_FAIL(DS_ERR_NOMEM, "%s: tokenizer.json", ds_gguf_path(g));
}

static ds_status tokenizer_config(const ds_gguf *g, const ds_gguf_kv *tokens, const ds_gguf_special *sp,
                                  char **out) {
  cJSON *c = cJSON_CreateObject();
  static const char *const names[4] = {"bos_token", "eos_token", "unk_token", "pad_token"};
  const int64_t ids[4] = {sp->bos, sp->eos, sp->unk, sp->pad};
  ds_status st = DS_OK;
  for (int i = 0; i < 4 && st == DS_OK; i++) {
    if (ids[i] < 0 || (uint64_t)ids[i] >= tokens->count) {
      cJSON_AddNullToObject(c, names[i]);
      continue;
    }
    char *t = spelled(tokens->strs[ids[i]]);
    if (!t) st = DS_FAIL(DS_ERR_NOMEM, "tokenizer_config.json");
    else cJSON_AddStringToObject(c, names[i], t);
    free(t);
  }
  cJSON_AddBoolToObject(c, "add_bos_token", sp->add_bos);
  cJSON_AddStringToObject(c, "tokenizer_class", "GPT2Tokenizer");
  ds_gguf_str tmpl = {0};
  if (st == DS_OK) st = ds_gguf_get_str(g, "tokenizer.chat_template", 0, &tmpl);
  if (st == DS_OK && tmpl.p) {
    char *t = dup_str(tmpl);
    if (!t || memchr(tmpl.p, 0, (size_t)tmpl.len))
      st = t ? DS_FAIL(DS_ERR_FORMAT, "%s: tokenizer.chat_template holds a NUL byte", ds_gguf_path(g))
             : DS_FAIL(DS_ERR_NOMEM, "chat template");
    else
      cJSON_AddStringToObject(c, "chat_template", t);
    free(t);
  }
  if (st != DS_OK) {
    cJSON_Delete(c);
    return st;
  }
  *out = json_text(c);
  return *out ? DS_OK : DS_FAIL(DS_ERR_NOMEM, "%s: tokenizer_config.json", ds_gguf_path(g));
}

ds_status ds_gguf_tokenizer_texts(const ds_gguf *g, const ds_gguf_special *sp, char **tokenizer, char **config) {
  *tokenizer = *config = NULL;
  const char *path = ds_gguf_path(g);
  ds_gguf_str model = {0};
  DS_TRY(ds_gguf_get_str(g, "tokenizer.ggml.model", 1, &model));
  if (!str_is(model, "gpt2"))
    return DS_FAIL(DS_ERR_UNSUPPORTED, "%s: tokenizer.ggml.model '%.*s': only byte-level BPE ('gpt2') is supported",
                   path, model.len > 32 ? 32 : (int)model.len, model.p);
  const ds_gguf_kv *tokens = NULL, *types = NULL, *merges = NULL;
  DS_TRY(ds_gguf_get_array(g, "tokenizer.ggml.tokens", DS_GGUF_STRING, 1, &tokens));
  DS_TRY(ds_gguf_get_array(g, "tokenizer.ggml.token_type", DS_GGUF_I32, 0, &types));
  DS_TRY(ds_gguf_get_array(g, "tokenizer.ggml.merges", DS_GGUF_STRING, 1, &merges));
  if (types && types->count != tokens->count)
    return DS_FAIL(DS_ERR_FORMAT, "%s: tokenizer.ggml.token_type has %llu entries for %llu tokens", path,
                   (unsigned long long)types->count, (unsigned long long)tokens->count);
  for (uint64_t i = 0; i < tokens->count; i++)
    if (memchr(tokens->strs[i].p, 0, (size_t)tokens->strs[i].len))
      return DS_FAIL(DS_ERR_FORMAT, "%s: tokenizer.ggml.tokens[%llu] holds a NUL byte", path, (unsigned long long)i);
  for (uint64_t i = 0; i < merges->count; i++)
    if (memchr(merges->strs[i].p, 0, (size_t)merges->strs[i].len))
      return DS_FAIL(DS_ERR_FORMAT, "%s: tokenizer.ggml.merges[%llu] holds a NUL byte", path, (unsigned long long)i);
  DS_TRY(tokenizer_json(g, tokens, types, merges, tokenizer));
  ds_status st = tokenizer_config(g, tokens, sp, config);
  if (st != DS_OK) {
    free(*tokenizer);
    *tokenizer = NULL;
  }
  return st;
}
