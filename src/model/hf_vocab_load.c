/* The tokenizer of a Hugging Face directory as llama.cpp's converter sees it: the converter
 * calls transformers' AutoTokenizer (5.x), whose result is not always tokenizer.json as the file
 * has it. What transformers 5.25 does, and this file reproduces for byte-level BPE:
 *   - the class: a qwen2 model always gets Qwen2Tokenizer; otherwise tokenizer_config.json's
 *     tokenizer_class (config.json's when absent, "Fast" dropped) picks it: GPT2Tokenizer,
 *     Qwen2Tokenizer, PreTrainedTokenizerFast / TokenizersBackend, or LlamaTokenizer, which on a
 *     byte-level tokenizer.json loads as TokenizersBackend; no class: TokenizersBackend for
 *     llama, Qwen2Tokenizer for qwen3. Any other class is refused naming it.
 *   - TokenizersBackend takes tokenizer.json as it is. GPT2Tokenizer and Qwen2Tokenizer keep its
 *     vocabulary, merges and post-processor and replace the rest: no normalizer and a GPT-2
 *     ByteLevel pre-tokenizer (GPT2Tokenizer), NFC and Qwen2's split regex before a ByteLevel
 *     without regex (Qwen2Tokenizer); BPE options back to their defaults (no ignore_merges).
 *   - add_bos_token / add_eos_token are dropped when tokenizer.json is there: the file's
 *     post-processor stays (none when it has none).
 *   - added tokens: tokenizer_config.json's added_tokens_decoder when it has one, else
 *     tokenizer.json's added_tokens (and special_tokens_map.json's special tokens), are added
 *     over the file's own (TokenizersBackend) or to an empty set (the other classes), each at
 *     the id of its content (an added token's, else the model vocabulary's, else the next free
 *     one), its flags replacing the previous ones; then every special token (bos, eos, unk, sep,
 *     pad, cls, mask, the class's defaults for the absent ones, other "*_token" strings, the
 *     extra / additional special tokens) is added as special: with its added_tokens_decoder
 *     entry's flags when a named one is there, else with default flags.
 * The result is written back into tokenizer.json's tree and loaded by our tokenizer, which
 * encodes the converter's check text and normalizes non-normalized added tokens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_util.h"
#include "dspark/fileio.h"
#include "model/hf_vocab_internal.h"

static const char k_qwen2_split[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";
static const char *const k_named[7] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                       "pad_token", "cls_token", "mask_token"};

int hfv_truthy(const cJSON *v) {
  if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v)) return 0;
  if (cJSON_IsNumber(v)) return v->valuedouble != 0;
  if (cJSON_IsString(v)) return v->valuestring[0] != 0;
  if (cJSON_IsArray(v) || cJSON_IsObject(v)) return v->child != NULL;
  return 1;
}

static const cJSON *get(const cJSON *o, const char *k) { return o ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL; }

/* A JSON file of the directory: *out NULL when absent and not required. */
static ds_status read_json(const char *dir, const char *name, int required, char **path, cJSON **out) {
  *out = NULL;
  *path = ds_path_join(dir, name);
  if (!*path) return DS_FAIL(DS_ERR_NOMEM, "%s/%s", dir, name);
  int exists = 0;
  DS_TRY(ds_path_probe(*path, &exists));
  if (!exists) {
    if (required) return DS_FAIL(DS_ERR_NOT_FOUND, "%s: not found (a target directory for the draft's vocabulary "
                                 "holds config.json and tokenizer.json)", *path);
    return DS_OK;
  }
  char *text = NULL;
  size_t len = 0;
  DS_TRY(ds_read_file(*path, &text, &len));
  ds_status st;
  *out = ds_json_parse(text, len, *path, &st);
  free(text);
  if (*out && !cJSON_IsObject(*out)) {
    cJSON_Delete(*out);
    *out = NULL;
    return DS_FAIL(DS_ERR_FORMAT, "%s: not a JSON object", *path);
  }
  return *out ? DS_OK : st;
}

/* ---------------------------------------------------------------- the class */

static ds_status pick_class(hfv_dir *h, const char *model_type, int byte_level_file) {
  const cJSON *c = get(h->tok_config, "tokenizer_class");
  if (!cJSON_IsString(c)) c = get(h->config, "tokenizer_class");
  char name[128] = "";
  if (cJSON_IsString(c)) {
    snprintf(name, sizeof name, "%s", c->valuestring);
    size_t n = strlen(name);
    if (n > 4 && !strcmp(name + n - 4, "Fast")) name[n - 4] = 0;
  }
  if (!strcmp(model_type, "qwen2") || (!name[0] && !strcmp(model_type, "qwen3")) || !strcmp(name, "Qwen2Tokenizer"))
    h->klass = HFV_QWEN2, h->class_name = "Qwen2Tokenizer";
  else if (!strcmp(name, "GPT2Tokenizer"))
    h->klass = HFV_GPT2, h->class_name = "GPT2Tokenizer";
  else if (!name[0] || !strcmp(name, "PreTrainedTokenizer") || !strcmp(name, "TokenizersBackend") ||
           (!strcmp(name, "LlamaTokenizer") && byte_level_file))
    h->klass = HFV_BACKEND, h->class_name = "TokenizersBackend";
  else
    return DS_FAIL(DS_ERR_UNSUPPORTED, "%s: tokenizer_class '%s': transformers builds that class's own tokenizer, "
                   "which this export does not reproduce (it reproduces GPT2Tokenizer, Qwen2Tokenizer, "
                   "PreTrainedTokenizerFast / TokenizersBackend and a byte-level LlamaTokenizer)",
                   h->tok_config_path, c->valuestring);
  return DS_OK;
}

/* ---------------------------------------------------------------- the model vocabulary */

typedef struct {
  const char *token;
  int64_t id;
} vocab_entry;

typedef struct {
  vocab_entry *by_token; /* model.vocab sorted by token */
  int64_t n;
} vocab_index;

static int by_token(const void *a, const void *b) {
  return strcmp(((const vocab_entry *)a)->token, ((const vocab_entry *)b)->token);
}

static ds_status read_model_vocab(hfv_dir *h, vocab_index *ix) {
  const cJSON *vocab = get(get(h->tok_json, "model"), "vocab");
  if (!cJSON_IsObject(vocab))
    return DS_FAIL(DS_ERR_FORMAT, "%s: model.vocab is not an object of token -> id", h->tok_path);
  int64_t max = -1, n = 0;
  for (const cJSON *e = vocab->child; e; e = e->next, n++) {
    if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > 2147483647.0 ||
        e->valuedouble != (double)(int64_t)e->valuedouble)
      return DS_FAIL(DS_ERR_FORMAT, "%s: model.vocab['%.40s'] is not an id in [0, 2^31)", h->tok_path, e->string);
    if ((int64_t)e->valuedouble > max) max = (int64_t)e->valuedouble;
  }
  /* the table below is sized by the largest id: refuse one far beyond the tokens, as the tokenizer
   * loader does (src/text/tok_load.c), rather than allocate gigabytes for a typo */
  if (max >= 2 * n + 65536)
    return DS_FAIL(DS_ERR_FORMAT, "%s: model.vocab has id %lld, far beyond its %lld tokens: ids must be dense",
                   h->tok_path, (long long)max, (long long)n);
  h->model_ids = max + 1;
  h->model_count = n;
  h->model_token = calloc((size_t)(max + 1 > 0 ? max + 1 : 1), sizeof *h->model_token);
  ix->by_token = malloc((size_t)(n ? n : 1) * sizeof *ix->by_token);
  if (!h->model_token || !ix->by_token)
    return DS_FAIL(DS_ERR_NOMEM, "%s: vocabulary of %lld", h->tok_path, (long long)n);
  for (const cJSON *e = vocab->child; e; e = e->next) {
    int64_t id = (int64_t)e->valuedouble;
    if (h->model_token[id])
      return DS_FAIL(DS_ERR_FORMAT, "%s: model.vocab gives id %lld to '%.40s' and '%.40s'", h->tok_path,
                     (long long)id, h->model_token[id], e->string);
    h->model_token[id] = e->string;
    ix->by_token[ix->n++] = (vocab_entry){e->string, id};
  }
  qsort(ix->by_token, (size_t)ix->n, sizeof *ix->by_token, by_token);
  return DS_OK;
}

static int64_t model_id(const vocab_index *ix, const char *content) {
  vocab_entry key = {content, 0};
  const vocab_entry *e = bsearch(&key, ix->by_token, (size_t)ix->n, sizeof key, by_token);
  return e ? e->id : -1;
}

/* ---------------------------------------------------------------- added tokens */

/* An AddedToken's flags from its JSON (tokenizers' defaults: normalized = not special). */
static ds_status token_from_json(const cJSON *o, const char *where, hfv_added *t) {
  const cJSON *content = get(o, "content");
  if (!cJSON_IsString(content)) return DS_FAIL(DS_ERR_FORMAT, "%s: an added token without a content string", where);
  t->content = content->valuestring;
  t->special = cJSON_IsTrue(get(o, "special"));
  const cJSON *norm = get(o, "normalized");
  t->normalized = cJSON_IsBool(norm) ? cJSON_IsTrue(norm) : !t->special;
  t->lstrip = cJSON_IsTrue(get(o, "lstrip"));
  t->rstrip = cJSON_IsTrue(get(o, "rstrip"));
  t->single_word = cJSON_IsTrue(get(o, "single_word"));
  return DS_OK;
}

/* Adds t (content borrowed) as tokenizers' add_tokens does: at its content's id, else at the
 * next free one; its flags replace an earlier token's. at >= 0: at that id (a tokenizer.json's
 * own added tokens, which tokenizers loads at their ids; our tokenizer refuses ids it would not
 * give). */
static ds_status upsert_at(hfv_dir *h, const vocab_index *ix, hfv_added t, int64_t at) {
  if (!t.content[0]) return DS_OK;
  for (size_t i = 0; i < h->n_added; i++)
    if (!strcmp(h->added[i].content, t.content)) {
      char *keep = h->added[i].content;
      t.id = h->added[i].id;
      h->added[i] = t;
      h->added[i].content = keep;
      return DS_OK;
    }
  t.id = at >= 0 ? at : model_id(ix, t.content);
  if (t.id < 0) {
    int64_t max = -1;
    for (size_t i = 0; i < h->n_added; i++)
      if (h->added[i].id > max) max = h->added[i].id;
    t.id = max < 0 ? h->model_count : (max >= h->model_count || !h->model_count) ? max + 1 : h->model_count;
  }
  hfv_added *p = realloc(h->added, (h->n_added + 1) * sizeof *p);
  if (!p) return DS_FAIL(DS_ERR_NOMEM, "added tokens");
  h->added = p;
  if (!(t.content = strdup(t.content))) return DS_FAIL(DS_ERR_NOMEM, "added tokens");
  h->added[h->n_added++] = t;
  return DS_OK;
}

static ds_status upsert(hfv_dir *h, const vocab_index *ix, hfv_added t) { return upsert_at(h, ix, t, -1); }

/* The declared added tokens in id order: added_tokens_decoder {"id": {...}} or added_tokens [...]. */
typedef struct {
  const cJSON *item;
  int64_t id;
} declared;

static int by_declared_id(const void *a, const void *b) {
  int64_t x = ((const declared *)a)->id, y = ((const declared *)b)->id;
  return (x > y) - (x < y);
}

static ds_status add_declared(hfv_dir *h, const vocab_index *ix, const cJSON *list, int from_config, int at_ids) {
  size_t n = (size_t)cJSON_GetArraySize(list), k = 0;
  declared *d = malloc((n ? n : 1) * sizeof *d);
  if (!d) return DS_FAIL(DS_ERR_NOMEM, "added tokens");
  ds_status st = DS_OK;
  for (const cJSON *e = list->child; e && st == DS_OK; e = e->next) {
    char *end = NULL;
    double id = from_config ? strtod(e->string, &end) : cJSON_IsNumber(get(e, "id")) ? get(e, "id")->valuedouble : -1;
    /* the range before the cast: a double beyond int64_t's (1e999 reads as inf) has no conversion */
    if (!cJSON_IsObject(e) || !(id >= 0 && id <= 9007199254740992.0) || id != (double)(int64_t)id ||
        (from_config && (end == e->string || *end)))
      st = DS_FAIL(DS_ERR_FORMAT, "%s: %s entry %zu is not an added token with an id", from_config ? h->tok_config_path
                   : h->tok_path, from_config ? "added_tokens_decoder" : "added_tokens", k);
    else
      d[k++] = (declared){e, (int64_t)id};
  }
  qsort(d, k, sizeof *d, by_declared_id);
  for (size_t i = 0; i < k && st == DS_OK; i++) {
    hfv_added t;
    st = token_from_json(d[i].item, from_config ? h->tok_config_path : h->tok_path, &t);
    if (st == DS_OK) st = upsert_at(h, ix, t, at_ids ? d[i].id : -1);
  }
  free(d);
  return st;
}

/* A special token given as a string or an AddedToken object: content and flags (defaults for a
 * string), special. 0 when v is neither (absent, null). */
static int special_spec(const cJSON *v, hfv_added *t) {
  memset(t, 0, sizeof *t);
  if (cJSON_IsString(v)) t->content = v->valuestring;
  else if (cJSON_IsObject(v) && cJSON_IsString(get(v, "content"))) token_from_json(v, "", t);
  else return 0;
  t->special = 1;
  return 1;
}

/* What tokenizer_config.json (and special_tokens_map.json when it has no added_tokens_decoder)
 * make special, in the order transformers adds them. */
static ds_status add_specials(hfv_dir *h, const vocab_index *ix, const cJSON *stm, const cJSON *declared_list) {
  const cJSON *named[7];
  int given[7];
  for (int i = 0; i < 7; i++) {
    given[i] = get(h->tok_config, k_named[i]) != NULL;
    named[i] = get(h->tok_config, k_named[i]);
    if (get(stm, k_named[i])) given[i] = 1, named[i] = get(stm, k_named[i]);
  }
  /* the class's defaults for the tokens the files leave out */
  static const cJSON s_eot = {.type = cJSON_String, .valuestring = (char *)"<|endoftext|>"};
  for (int i = 0; i < 7; i++) {
    if (given[i]) continue;
    int bos = i == 0, eos = i == 1, unk = i == 2, pad = i == 4;
    if ((h->klass == HFV_GPT2 && (bos || eos || unk)) || (h->klass == HFV_QWEN2 && (eos || unk || pad)))
      named[i] = &s_eot;
  }
  for (int i = 0; i < 7; i++) {
    hfv_added t;
    if (!special_spec(named[i], &t)) continue;
    /* a named token that is a declared added token takes that entry's flags */
    for (const cJSON *e = declared_list ? declared_list->child : NULL; given[i] && e; e = e->next)
      if (cJSON_IsString(get(e, "content")) && !strcmp(get(e, "content")->valuestring, t.content)) {
        token_from_json(e, "", &t);
        t.special = 1;
      }
    DS_TRY(upsert(h, ix, t));
  }
  /* other "*_token" strings of tokenizer_config.json, and extra_special_tokens given as an object */
  for (const cJSON *e = h->tok_config ? h->tok_config->child : NULL; e; e = e->next) {
    size_t n = strlen(e->string);
    int standard = 0;
    for (int i = 0; i < 7; i++) standard |= !strcmp(e->string, k_named[i]);
    hfv_added t;
    if (!standard && n > 6 && !strcmp(e->string + n - 6, "_token") && cJSON_IsString(e) && special_spec(e, &t))
      DS_TRY(upsert(h, ix, t));
  }
  const cJSON *extra = get(h->tok_config, "extra_special_tokens");
  for (const cJSON *e = cJSON_IsObject(extra) ? extra->child : NULL; e; e = e->next) {
    hfv_added t;
    if (cJSON_IsString(e) && special_spec(e, &t)) DS_TRY(upsert(h, ix, t));
  }
  /* the extra special tokens: extra_special_tokens, else additional_special_tokens; then the map's */
  const cJSON *lists[3] = {cJSON_IsArray(extra) && extra->child ? extra : get(h->tok_config, "additional_special_tokens"),
                           get(stm, "additional_special_tokens"), get(stm, "extra_special_tokens")};
  for (int l = 0; l < 3; l++)
    for (const cJSON *e = cJSON_IsArray(lists[l]) ? lists[l]->child : NULL; e; e = e->next) {
      hfv_added t;
      if (!special_spec(e, &t))
        return DS_FAIL(DS_ERR_FORMAT, "%s: an extra special token is neither a string nor an AddedToken",
                       l ? "special_tokens_map.json" : h->tok_config_path);
      DS_TRY(upsert(h, ix, t));
    }
  return DS_OK;
}

static int by_id(const void *a, const void *b) {
  int64_t x = ((const hfv_added *)a)->id, y = ((const hfv_added *)b)->id;
  return (x > y) - (x < y);
}

static ds_status effective_added(hfv_dir *h, const vocab_index *ix) {
  const cJSON *atd = get(h->tok_config, "added_tokens_decoder");
  cJSON *stm = NULL;
  char *stm_path = NULL, *atj_path = NULL;
  ds_status st = DS_OK;
  if (atd && !cJSON_IsObject(atd))
    return DS_FAIL(DS_ERR_FORMAT, "%s: added_tokens_decoder is not an object", h->tok_config_path);
  if (!atd) {
    /* the legacy files transformers reads only then */
    st = read_json(h->dir, "special_tokens_map.json", 0, &stm_path, &stm);
    int exists = 0;
    atj_path = ds_path_join(h->dir, "added_tokens.json");
    if (st == DS_OK && !atj_path) st = DS_FAIL(DS_ERR_NOMEM, "%s", h->dir);
    if (st == DS_OK) st = ds_path_probe(atj_path, &exists);
    if (st == DS_OK && exists)
      st = DS_FAIL(DS_ERR_UNSUPPORTED, "%s: transformers' legacy added-tokens file is not reproduced by this export "
                   "(tokenizer.json's added_tokens are)", atj_path);
    for (const cJSON *e = stm ? stm->child : NULL; st == DS_OK && e; e = e->next) {
      int known = !strcmp(e->string, "additional_special_tokens") || !strcmp(e->string, "extra_special_tokens");
      for (int i = 0; i < 7; i++) known |= !strcmp(e->string, k_named[i]);
      if (!known)
        st = DS_FAIL(DS_ERR_UNSUPPORTED, "%s: key '%s' is not reproduced by this export (the seven named special "
                     "tokens and the additional / extra lists are)", stm_path, e->string);
    }
  }
  if (st == DS_OK && h->klass == HFV_BACKEND && cJSON_IsArray(h->raw_added))
    st = add_declared(h, ix, h->raw_added, 0, 1); /* the file's own, kept by TokenizersBackend */
  const cJSON *declared_list = atd ? atd : h->raw_added;
  if (st == DS_OK && cJSON_IsArray(declared_list)) st = add_declared(h, ix, declared_list, 0, 0);
  else if (st == DS_OK && atd) st = add_declared(h, ix, atd, 1, 0);
  if (st == DS_OK) st = add_specials(h, ix, stm, declared_list);
  if (st == DS_OK) qsort(h->added, h->n_added, sizeof *h->added, by_id);
  cJSON_Delete(stm);
  free(stm_path);
  free(atj_path);
  return st;
}

/* ---------------------------------------------------------------- the effective tokenizer */

static cJSON *byte_level(int add_prefix_space, int use_regex) {
  cJSON *b = cJSON_CreateObject();
  cJSON_AddStringToObject(b, "type", "ByteLevel");
  cJSON_AddBoolToObject(b, "add_prefix_space", add_prefix_space);
  cJSON_AddBoolToObject(b, "trim_offsets", 1);
  cJSON_AddBoolToObject(b, "use_regex", use_regex);
  return b;
}

static void replace(cJSON *o, const char *key, cJSON *v) {
  if (cJSON_GetObjectItemCaseSensitive(o, key)) cJSON_ReplaceItemInObjectCaseSensitive(o, key, v);
  else cJSON_AddItemToObject(o, key, v);
}

/* The class's pipeline and the effective added tokens written into tok_json. */
static ds_status rebuild(hfv_dir *h) {
  cJSON *root = h->tok_json, *model = cJSON_GetObjectItemCaseSensitive(root, "model");
  const cJSON *aps = get(h->tok_config, "add_prefix_space");
  if (aps && !cJSON_IsBool(aps) && !cJSON_IsNull(aps))
    return DS_FAIL(DS_ERR_FORMAT, "%s: add_prefix_space is not a boolean", h->tok_config_path);
  int prefix = cJSON_IsTrue(aps);
  if (h->klass != HFV_BACKEND) {
    replace(model, "dropout", cJSON_CreateNull());
    replace(model, "unk_token", cJSON_CreateNull());
    replace(model, "continuing_subword_prefix", cJSON_CreateString(""));
    replace(model, "end_of_word_suffix", cJSON_CreateString(""));
    replace(model, "fuse_unk", cJSON_CreateFalse());
    replace(model, "byte_fallback", cJSON_CreateFalse());
    replace(model, "ignore_merges", cJSON_CreateFalse());
    replace(root, "decoder", byte_level(1, 1));
  }
  if (h->klass == HFV_GPT2) {
    replace(root, "normalizer", cJSON_CreateNull());
    replace(root, "pre_tokenizer", byte_level(prefix, 1));
  } else if (h->klass == HFV_QWEN2) {
    cJSON *nfc = cJSON_CreateObject(), *seq = cJSON_CreateObject(), *split = cJSON_CreateObject();
    cJSON_AddStringToObject(nfc, "type", "NFC");
    replace(root, "normalizer", nfc);
    cJSON_AddStringToObject(seq, "type", "Sequence");
    cJSON *list = cJSON_AddArrayToObject(seq, "pretokenizers");
    cJSON_AddStringToObject(split, "type", "Split");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(split, "pattern"), "Regex", k_qwen2_split);
    cJSON_AddStringToObject(split, "behavior", "Isolated");
    cJSON_AddBoolToObject(split, "invert", 0);
    cJSON_AddItemToArray(list, split);
    cJSON_AddItemToArray(list, byte_level(prefix, 0));
    replace(root, "pre_tokenizer", seq);
  }
  cJSON *added = cJSON_CreateArray();
  for (size_t i = 0; i < h->n_added; i++) {
    const hfv_added *a = &h->added[i];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)a->id);
    cJSON_AddStringToObject(o, "content", a->content);
    cJSON_AddBoolToObject(o, "single_word", a->single_word);
    cJSON_AddBoolToObject(o, "lstrip", a->lstrip);
    cJSON_AddBoolToObject(o, "rstrip", a->rstrip);
    cJSON_AddBoolToObject(o, "normalized", a->normalized);
    cJSON_AddBoolToObject(o, "special", a->special);
    cJSON_AddItemToArray(added, o);
  }
  replace(root, "added_tokens", added);
  char *text = cJSON_PrintUnformatted(root);
  if (!text) return DS_FAIL(DS_ERR_NOMEM, "%s: the effective tokenizer", h->tok_path);
  char label[512];
  snprintf(label, sizeof label, "%s (as transformers loads it: %s)", h->tok_path, h->class_name);
  ds_status st = ds_tokenizer_load_memory(text, strlen(text), label, &h->tok);
  free(text);
  return st;
}

/* ---------------------------------------------------------------- open / close */

static ds_status check_architecture(hfv_dir *h, const char **model_type) {
  const cJSON *archs = get(h->config, "architectures"), *mt = get(h->config, "model_type");
  const cJSON *a0 = cJSON_IsArray(archs) ? archs->child : NULL;
  const char *arch = cJSON_IsString(a0) ? a0->valuestring : "";
  if (strcmp(arch, "LlamaForCausalLM") && strcmp(arch, "Qwen2ForCausalLM") && strcmp(arch, "Qwen3ForCausalLM"))
    return DS_FAIL(DS_ERR_UNSUPPORTED, "%s: architectures[0] '%s': llama.cpp's converter takes a target's vocabulary "
                   "with the rules of its architecture, and this export reproduces LlamaForCausalLM, "
                   "Qwen2ForCausalLM and Qwen3ForCausalLM", h->config_path, arch);
  *model_type = cJSON_IsString(mt) ? mt->valuestring : "";
  if (strcmp(*model_type, "llama") && strcmp(*model_type, "qwen2") && strcmp(*model_type, "qwen3"))
    return DS_FAIL(DS_ERR_UNSUPPORTED, "%s: model_type '%s' (llama, qwen2 or qwen3; transformers picks the tokenizer "
                   "class from it)", h->config_path, *model_type);
  h->llama = !strcmp(arch, "LlamaForCausalLM");
  return DS_OK;
}

/* The converter's route to a byte-level BPE ("gpt2") vocabulary: no SentencePiece model, a BPE
 * tokenizer.json, no byte fallback (a Llama directory with one is converted as a 'llama' one). */
static ds_status check_bpe(hfv_dir *h, int *byte_level_file, const char *text) {
  char *spm = ds_path_join(h->dir, "tokenizer.model");
  int exists = 0;
  ds_status st = spm ? ds_path_probe(spm, &exists) : DS_FAIL(DS_ERR_NOMEM, "%s", h->dir);
  if (st == DS_OK && exists)
    st = DS_FAIL(DS_ERR_UNSUPPORTED, "%s: a SentencePiece tokenizer, which llama.cpp's converter writes as a 'llama' "
                 "vocabulary; this export writes byte-level BPE ('gpt2') vocabularies only", spm);
  free(spm);
  DS_TRY(st);
  const cJSON *model = get(h->tok_json, "model"), *type = get(model, "type");
  const char *t = cJSON_IsString(type) ? type->valuestring : "(none)";
  if (strcmp(t, "BPE"))
    return DS_FAIL(DS_ERR_UNSUPPORTED, "%s: model.type '%s': not a BPE tokenizer; this export writes byte-level BPE "
                   "('gpt2') vocabularies only (WordPiece, Unigram and WordLevel are refused)", h->tok_path, t);
  if (cJSON_IsTrue(get(model, "byte_fallback")))
    return DS_FAIL(DS_ERR_UNSUPPORTED, "%s: a BPE with byte_fallback (SentencePiece-style, not byte-level), which "
                   "llama.cpp's converter writes as a 'llama' vocabulary; this export writes byte-level BPE ('gpt2') "
                   "vocabularies only", h->tok_path);
  *byte_level_file = strstr(text, "\"ByteLevel\"") != NULL;
  const cJSON *split = get(h->tok_config, "split_special_tokens");
  if (cJSON_IsTrue(split))
    return DS_FAIL(DS_ERR_UNSUPPORTED, "%s: split_special_tokens true is not reproduced by this export",
                   h->tok_config_path);
  if (get(h->tok_config, "auto_map"))
    return DS_FAIL(DS_ERR_UNSUPPORTED, "%s: auto_map (a tokenizer of remote code) is not reproduced by this export",
                   h->tok_config_path);
  return DS_OK;
}

ds_status hfv_open(const char *dir, hfv_dir *h) {
  memset(h, 0, sizeof *h);
  h->dir = dir;
  vocab_index ix = {0};
  char *text = NULL;
  size_t len = 0;
  const char *model_type = NULL;
  int byte_level_file = 0;
  ds_status st = read_json(dir, "config.json", 1, &h->config_path, &h->config);
  if (st == DS_OK) st = check_architecture(h, &model_type);
  if (st == DS_OK) st = read_json(dir, "tokenizer_config.json", 0, &h->tok_config_path, &h->tok_config);
  if (st == DS_OK && !(h->tok_path = ds_path_join(dir, "tokenizer.json"))) st = DS_FAIL(DS_ERR_NOMEM, "%s", dir);
  if (st == DS_OK) st = ds_read_file(h->tok_path, &text, &len);
  if (st == DS_OK) h->tok_json = ds_json_parse(text, len, h->tok_path, &st);
  if (st == DS_OK && !cJSON_IsObject(h->tok_json)) st = DS_FAIL(DS_ERR_FORMAT, "%s: not a JSON object", h->tok_path);
  if (st == DS_OK) st = check_bpe(h, &byte_level_file, text);
  free(text);
  if (st == DS_OK) st = pick_class(h, model_type, byte_level_file);
  if (st == DS_OK) {
    h->raw_added = cJSON_Duplicate(get(h->tok_json, "added_tokens"), 1);
    h->raw_post = cJSON_Duplicate(get(h->tok_json, "post_processor"), 1);
    h->raw_normalizer = cJSON_Duplicate(get(h->tok_json, "normalizer"), 1);
    if (h->raw_added && !cJSON_IsArray(h->raw_added))
      st = DS_FAIL(DS_ERR_FORMAT, "%s: added_tokens is not an array", h->tok_path);
  }
  if (st == DS_OK) st = read_model_vocab(h, &ix);
  if (st == DS_OK) st = effective_added(h, &ix);
  if (st == DS_OK) st = rebuild(h);
  free(ix.by_token);
  if (st != DS_OK) hfv_close(h);
  return st;
}

void hfv_close(hfv_dir *h) {
  for (size_t i = 0; i < h->n_added; i++) free(h->added[i].content);
  free(h->added);
  free(h->model_token);
  ds_tokenizer_free(h->tok);
  cJSON_Delete(h->config);
  cJSON_Delete(h->tok_json);
  cJSON_Delete(h->raw_added);
  cJSON_Delete(h->raw_post);
  cJSON_Delete(h->raw_normalizer);
  cJSON_Delete(h->tok_config);
  free(h->tok_path);
  free(h->config_path);
  free(h->tok_config_path);
  memset(h, 0, sizeof *h);
}

const hfv_added *hfv_added_at(const hfv_dir *h, int64_t id) {
  size_t lo = 0, hi = h->n_added;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (h->added[mid].id == id) return &h->added[mid];
    if (h->added[mid].id < id) lo = mid + 1;
    else hi = mid;
  }
  return NULL;
}
