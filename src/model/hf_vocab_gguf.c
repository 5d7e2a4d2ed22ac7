/* The tokenizer.* keys llama.cpp's converter writes for a draft whose --target-model-dir is a
 * Hugging Face directory (ds_hf_vocab_gguf, include/dspark/gguf_model.h): the target's own
 * vocabulary rules (LlamaModel / Qwen2Model / Qwen3Model set_vocab) on the byte-level BPE route
 * (_set_vocab_gpt2), in its order:
 *   [Llama: tokenizer.ggml.add_space_prefix, when tokenizer_config.json sets add_prefix_space]
 *   tokenizer.ggml.model "gpt2", .pre (hf_vocab_pre.c), .tokens and .token_type over the draft's
 *   vocab_size ids: a model token is NORMAL (1); an added token is CONTROL (3) when special or
 *   when it looks like one (<|...|> and a few names), else USER_DEFINED (4, its U+2581 as
 *   spaces), a non-normalized one spelled as decoding its own encoding gives; an id nobody has is
 *   "[PAD<id>]", UNUSED (5);
 *   then what gguf-py's SpecialVocab reads from tokenizer.json, tokenizer_config.json and
 *   config.json: .merges, the special ids (bos, eos, unknown, seperator, padding, mask, eot, eom:
 *   tokenizer_config.json's tokens found among tokenizer.json's added tokens first, then
 *   config.json's *_token_id), add_bos / add_eos / add_sep (the post-processor's, then
 *   tokenizer_config.json's), tokenizer.chat_template (tokenizer_config.json's, else
 *   chat_template.jinja, else chat_template.json), the normalizer's lowercase / strip_accents;
 *   [Llama with 49152 tokens: add_bos_token false].
 * The draft's export adds tokenizer.ggml.mask_token_id after these. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/fileio.h"
#include "dspark/gguf_model.h"
#include "model/hf_vocab_internal.h"

static const cJSON *get(const cJSON *o, const char *k) { return o ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL; }

/* ---------------------------------------------------------------- tokens and their types */

enum { TT_NORMAL = 1, TT_CONTROL = 3, TT_USER_DEFINED = 4, TT_UNUSED = 5 };

static int starts(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }
static int ends(const char *s, const char *t) {
  size_t n = strlen(s), m = strlen(t);
  return n >= m && !strcmp(s + n - m, t);
}

/* The converter's does_token_look_special. */
static int looks_special(const char *t) {
  return !strcmp(t, "<pad>") || !strcmp(t, "<mask>") || !strcmp(t, "<2mass>") || !strcmp(t, "[@BOS@]") ||
         (starts(t, "<|") && ends(t, "|>")) || (starts(t, "<\xef\xbd\x9c") && ends(t, "\xef\xbd\x9c>")) ||
         (starts(t, "<unused") && ends(t, ">"));
}

/* s with every U+2581 (the SentencePiece space) as ' ', in place. */
static void spaces_for_sp(char *s) {
  char *o = s;
  for (const char *p = s; *p;)
    if (starts(p, "\xe2\x96\x81")) *o++ = ' ', p += 3;
    else *o++ = *p++;
  *o = 0;
}

static ds_status put_tokens(ds_gguf_writer *w, const hfv_dir *h, int64_t vocab_size) {
  int64_t max = h->model_ids - 1;
  for (size_t i = 0; i < h->n_added; i++)
    if (h->added[i].id > max) max = h->added[i].id;
  if (max >= vocab_size)
    return DS_FAIL(DS_ERR_RANGE, "%s: the tokenizer (as transformers loads it) has id %lld, but the draft's "
                   "vocab_size is %lld: not the draft's target (llama.cpp's converter stops there too)",
                   h->tok_path, (long long)max, (long long)vocab_size);
  char **tokens = calloc((size_t)vocab_size, sizeof *tokens);
  int32_t *types = malloc((size_t)vocab_size * sizeof *types);
  ds_status st = tokens && types ? DS_OK : DS_FAIL(DS_ERR_NOMEM, "token list of %lld", (long long)vocab_size);
  for (int64_t i = 0; st == DS_OK && i < vocab_size; i++) {
    const hfv_added *a = hfv_added_at(h, i);
    if (a) {
      if (a->normalized) {
        tokens[i] = strdup(a->content);
      } else { /* the converter's decode(encode(token)) */
        ds_ids ids = {0};
        st = ds_tokenizer_encode(h->tok, a->content, strlen(a->content), 0, &ids);
        if (st == DS_OK) st = ds_tokenizer_decode(h->tok, ids.ids, ids.len, 0, &tokens[i], NULL);
        ds_ids_free(&ids);
      }
      if (st == DS_OK && tokens[i] && !(a->special || looks_special(tokens[i]))) {
        spaces_for_sp(tokens[i]);
        types[i] = TT_USER_DEFINED;
      } else {
        types[i] = TT_CONTROL;
      }
    } else if (i < h->model_ids && h->model_token[i]) {
      tokens[i] = strdup(h->model_token[i]);
      types[i] = TT_NORMAL;
    } else {
      char pad[32];
      snprintf(pad, sizeof pad, "[PAD%lld]", (long long)i);
      tokens[i] = strdup(pad);
      types[i] = TT_UNUSED;
    }
    if (st == DS_OK && !tokens[i]) st = DS_FAIL(DS_ERR_NOMEM, "token list");
  }
  if (st == DS_OK) st = ds_gguf_set_str_array(w, "tokenizer.ggml.tokens", (uint64_t)vocab_size,
                                              (const char *const *)tokens);
  if (st == DS_OK) st = ds_gguf_set_array(w, "tokenizer.ggml.token_type", DS_GGUF_I32, (uint64_t)vocab_size, types);
  for (int64_t i = 0; tokens && i < vocab_size; i++) free(tokens[i]);
  free(tokens);
  free(types);
  return st;
}

/* ---------------------------------------------------------------- merges */

/* tokenizer.json's merges: "a b" strings as they are, [a, b] pairs joined with a space, a space
 * inside a part spelled U+0120. */
static ds_status put_merges(ds_gguf_writer *w, const hfv_dir *h) {
  const cJSON *merges = get(get(h->tok_json, "model"), "merges");
  int n = cJSON_IsArray(merges) ? cJSON_GetArraySize(merges) : 0;
  if (!n) {
    char *txt = ds_path_join(h->dir, "merges.txt");
    int exists = 0;
    ds_status st = txt ? ds_path_probe(txt, &exists) : DS_FAIL(DS_ERR_NOMEM, "%s", h->dir);
    if (st == DS_OK && exists)
      st = DS_FAIL(DS_ERR_UNSUPPORTED, "%s: tokenizer.json has no merges and the converter would read them from "
                   "merges.txt, which this export does not", txt);
    free(txt);
    return st;
  }
  int pairs = cJSON_IsArray(merges->child);
  if (!pairs && !cJSON_IsString(merges->child))
    return DS_FAIL(DS_ERR_FORMAT, "%s: model.merges: unknown merges format", h->tok_path);
  char **m = calloc((size_t)n, sizeof *m);
  ds_status st = m ? DS_OK : DS_FAIL(DS_ERR_NOMEM, "merges");
  int i = 0;
  for (const cJSON *e = merges->child; st == DS_OK && e; e = e->next, i++) {
    if (!pairs) {
      if (!cJSON_IsString(e)) st = DS_FAIL(DS_ERR_FORMAT, "%s: model.merges[%d] is not a string", h->tok_path, i);
      else if (!(m[i] = strdup(e->valuestring))) st = DS_FAIL(DS_ERR_NOMEM, "merges");
      continue;
    }
    const cJSON *a = cJSON_GetArrayItem(e, 0), *b = cJSON_GetArrayItem(e, 1);
    if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 2 || !cJSON_IsString(a) || !cJSON_IsString(b)) {
      st = DS_FAIL(DS_ERR_FORMAT, "%s: model.merges[%d] is not a pair of strings", h->tok_path, i);
      break;
    }
    size_t la = strlen(a->valuestring), lb = strlen(b->valuestring);
    char *o = m[i] = malloc(2 * (la + lb) + 2);
    if (!o) {
      st = DS_FAIL(DS_ERR_NOMEM, "merges");
      break;
    }
    for (const cJSON *part = a; part; part = part == a ? b : NULL) {
      for (const char *p = part->valuestring; *p; p++)
        if (*p == ' ') *o++ = (char)0xC4, *o++ = (char)0xA0; /* U+0120 */
        else *o++ = *p;
      if (part == a) *o++ = ' ';
    }
    *o = 0;
  }
  if (st == DS_OK) st = ds_gguf_set_str_array(w, "tokenizer.ggml.merges", (uint64_t)n, (const char *const *)m);
  for (int k = 0; m && k < n; k++) free(m[k]);
  free(m);
  return st;
}

/* ---------------------------------------------------------------- the keys */

ds_status ds_hf_vocab_gguf(const char *dir, int64_t vocab_size, ds_gguf_writer *w) {
  if (vocab_size < 1 || vocab_size > INT32_MAX)
    return DS_FAIL(DS_ERR_ARG, "ds_hf_vocab_gguf: vocab_size %lld", (long long)vocab_size);
  hfv_dir h;
  DS_TRY(hfv_open(dir, &h));
  ds_status st = DS_OK;
  const cJSON *cfg_vocab = get(h.config, "vocab_size");
  if (cJSON_IsNumber(cfg_vocab) && cfg_vocab->valuedouble != (double)vocab_size)
    st = DS_FAIL(DS_ERR_FORMAT, "%s: vocab_size %.0f, the draft's target %lld: not the draft's target",
                 h.config_path, cfg_vocab->valuedouble, (long long)vocab_size);
  if (st == DS_OK && h.llama && vocab_size == 32016)
    st = DS_FAIL(DS_ERR_UNSUPPORTED, "%s: a Llama vocabulary of 32016 tokens gets CodeLlama's infill tokens from "
                 "llama.cpp's converter, which this export does not reproduce", h.config_path);
  const char *pre = NULL;
  char hex[65];
  if (st == DS_OK) st = hfv_pre_name(h.tok, dir, h.class_name, &pre, hex);
  const cJSON *aps = get(h.tok_config, "add_prefix_space");
  if (st == DS_OK && h.llama && aps && !cJSON_IsNull(aps))
    st = ds_gguf_set_bool(w, "tokenizer.ggml.add_space_prefix", cJSON_IsTrue(aps));
  if (st == DS_OK) st = ds_gguf_set_str(w, "tokenizer.ggml.model", "gpt2", 4);
  if (st == DS_OK) st = ds_gguf_set_str(w, "tokenizer.ggml.pre", pre, strlen(pre));
  if (st == DS_OK) st = put_tokens(w, &h, vocab_size);
  if (st == DS_OK) st = put_merges(w, &h);
  if (st == DS_OK) st = hfv_put_special_vocab(w, &h);
  /* LlamaModel.set_vocab: granite's small models (49152 tokens) never add a BOS */
  if (st == DS_OK && h.llama && vocab_size == 49152) st = ds_gguf_set_bool(w, "tokenizer.ggml.add_bos_token", 0);
  hfv_close(&h);
  return st;
}
