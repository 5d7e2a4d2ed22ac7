/* Loading a HF tokenizer.json into a ds_tokenizer: the BPE model, the added tokens, the
 * per-id tables; the pipeline sections are in tok_load_pipeline.c. Every refusal names the
 * file and the JSON field ("tokenizer.json: model.merges[12]: unknown token 'xy'");
 * anything this build does not implement is refused as unsupported rather than
 * approximated. Ids follow HF exactly: added tokens get the id HF assigns (their vocab id,
 * or the next free one in file order), and a file whose stated ids disagree is refused
 * instead of silently renumbered. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/fileio.h"
#include "core/json_util.h"
#include "text/json_text.h"
#include "text/tok_json.h"

/* ---- the GPT-2 byte <-> character map ---- */

/* Printable bytes stand for themselves; the 68 others for U+0100.. in byte order. */
static void byte_map(uint32_t b2u[256]) {
  uint32_t n = 0;
  for (uint32_t b = 0; b < 256; b++) {
    int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    b2u[b] = printable ? b : 256 + n++;
  }
}

/* The bytes a byte-level token string stands for; 0 when a character is outside the
 * alphabet (then HF's decoder emits the string's own UTF-8 bytes). */
static int byte_level_bytes(const char *s, const int16_t u2b[324], tk_buf *out, ds_status *st) {
  const unsigned char *p = (const unsigned char *)s;
  size_t n = strlen(s), start = out->len;
  *st = DS_OK;
  for (size_t i = 0; i < n;) {
    size_t l;
    uint32_t cp = tk_utf8_decode(p + i, &l);
    if (cp >= 324 || u2b[cp] < 0) { out->len = start; return 0; }
    unsigned char b = (unsigned char)u2b[cp];
    if ((*st = tk_buf_append(out, &b, 1)) != DS_OK) return 0;
    i += l;
  }
  return 1;
}

/* ---- model ---- */

static ds_status load_model(tk_loader *L, const cJSON *m) {
  ds_tokenizer *tok = L->tok;
  ds_status st;
  const char *type = tk_type_of(L, m, "model", &st);
  if (!type) return st;
  if (strcmp(type, "BPE"))
    return tk_fail(L, DS_ERR_UNSUPPORTED, "model.type", "model type '%s' is not supported (only BPE)", type);
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, "dropout");
  if (!tk_is_null(v) && !(cJSON_IsNumber(v) && v->valuedouble == 0.0))
    return tk_fail(L, DS_ERR_UNSUPPORTED, "model.dropout", "BPE dropout is not supported (must be null)");
  const char *affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
  for (size_t i = 0; i < 2; i++) {
    v = cJSON_GetObjectItemCaseSensitive(m, affixes[i]);
    if (!tk_is_null(v) && !(cJSON_IsString(v) && !v->valuestring[0]))
      return tk_fail(L, DS_ERR_UNSUPPORTED, "model", "'%s' is not supported (must be null or \"\")", affixes[i]);
  }
  int byte_fallback;
  DS_TRY(tk_get_bool(L, m, "ignore_merges", 0, &tok->ignore_merges, "model"));
  DS_TRY(tk_get_bool(L, m, "byte_fallback", 0, &byte_fallback, "model"));
  int fuse;
  DS_TRY(tk_get_bool(L, m, "fuse_unk", 0, &fuse, "model"));
  const cJSON *unk = cJSON_GetObjectItemCaseSensitive(m, "unk_token");
  if (!tk_is_null(unk) && !cJSON_IsString(unk))
    return tk_fail(L, DS_ERR_FORMAT, "model.unk_token", "must be a string or null, got %s", tk_type_name(unk));

  /* vocab: string -> id */
  const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(m, "vocab"), *it;
  if (!cJSON_IsObject(vocab))
    return tk_fail(L, DS_ERR_FORMAT, "model.vocab", "must be an object of token -> id, got %s", tk_type_name(vocab));
  L->vocab = vocab;
  uint32_t b2u[256];
  int16_t u2b[324];
  byte_map(b2u);
  memset(u2b, 0xFF, sizeof u2b);
  for (int b = 0; b < 256; b++) u2b[b2u[b]] = (int16_t)b;
  tk_buf bytes = {0};
  st = DS_OK;
  cJSON_ArrayForEach(it, vocab) {
    char path[300], sb[200];
    snprintf(path, sizeof path, "model.vocab['%s']", tk_show(it->string, sb));
    int32_t id = 0;
    if ((st = tk_check_utf8(L, it->string, path)) != DS_OK || (st = tk_get_id(L, it, &id, path)) != DS_OK ||
        (st = tk_strmap_put(&tok->model_str, it->string, strlen(it->string), id, NULL)) != DS_OK)
      break;
    bytes.len = 0;
    if (byte_level_bytes(it->string, u2b, &bytes, &st))
      st = tk_strmap_put(&tok->vocab_bytes, bytes.p, bytes.len, id, NULL);
    if (st != DS_OK) break;
  }
  if (st != DS_OK) {
    tk_buf_free(&bytes);
    return st;
  }
  for (int b = 0; b < 256; b++) {
    unsigned char c = (unsigned char)b;
    tok->byte_id[b] = tk_strmap_get(&tok->vocab_bytes, &c, 1);
    if (tok->byte_id[b] < 0 && (!tk_is_null(unk) || byte_fallback)) {
      tk_buf_free(&bytes);
      return tk_fail(L, DS_ERR_UNSUPPORTED, "model.vocab",
                  "byte 0x%02X has no token and unk_token/byte_fallback are not supported", b);
    }
  }

  /* merges: "a b" strings or [a, b] pairs; rank = position, a repeated pair keeps the last */
  const cJSON *merges = cJSON_GetObjectItemCaseSensitive(m, "merges");
  if (!cJSON_IsArray(merges)) {
    tk_buf_free(&bytes);
    return tk_fail(L, DS_ERR_FORMAT, "model.merges", "must be an array, got %s", tk_type_name(merges));
  }
  uint32_t rank = 0;
  size_t i = 0;
  st = DS_OK;
  cJSON_ArrayForEach(it, merges) {
    char path[64], sa[200], sbb[200];
    snprintf(path, sizeof path, "model.merges[%zu]", i++);
    const char *a = NULL, *b = NULL;
    size_t alen = 0;
    if (cJSON_IsString(it)) {
      const char *s = it->valuestring;
      if (!strncmp(s, "#version", 8)) continue; /* legacy merges.txt header */
      const char *sp = strchr(s, ' ');
      if (!sp || strchr(sp + 1, ' ')) {
        st = tk_fail(L, DS_ERR_FORMAT, path, "expected \"left right\" with exactly one space, got '%s'", tk_show(s, sa));
        break;
      }
      a = s;
      alen = (size_t)(sp - s);
      b = sp + 1;
    } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(it->child) &&
               cJSON_IsString(it->child->next)) {
      a = it->child->valuestring;
      alen = strlen(a);
      b = it->child->next->valuestring;
    } else {
      st = tk_fail(L, DS_ERR_FORMAT, path, "expected a \"left right\" string or a [left, right] pair, got %s",
                tk_type_name(it));
      break;
    }
    size_t blen = strlen(b);
    int32_t a_id = tk_strmap_get(&tok->model_str, a, alen), b_id = tk_strmap_get(&tok->model_str, b, blen);
    if (a_id < 0 || b_id < 0) {
      char tmp[256];
      snprintf(tmp, sizeof tmp, "%.*s", (int)(a_id < 0 ? (alen < 200 ? alen : 200) : (blen < 200 ? blen : 200)),
               a_id < 0 ? a : b);
      st = tk_fail(L, DS_ERR_FORMAT, path, "unknown token '%s'", tk_show(tmp, sa));
      break;
    }
    bytes.len = 0;
    if ((st = tk_buf_append(&bytes, a, alen)) != DS_OK || (st = tk_buf_append(&bytes, b, blen)) != DS_OK) break;
    int32_t new_id = tk_strmap_get(&tok->model_str, bytes.p, bytes.len);
    if (new_id < 0) {
      if ((st = tk_buf_append(&bytes, "", 1)) != DS_OK) break;
      st = tk_fail(L, DS_ERR_FORMAT, path, "merged token '%s' is not in model.vocab", tk_show((char *)bytes.p, sbb));
      break;
    }
    if ((st = tk_pairmap_put(&tok->merges, (uint32_t)a_id, (uint32_t)b_id, rank++, new_id)) != DS_OK) break;
  }
  tk_buf_free(&bytes);
  return st;
}

/* ---- added tokens ---- */

static ds_status load_added(tk_loader *L, const cJSON *arr) {
  ds_tokenizer *tok = L->tok;
  if (tk_is_null(arr)) return DS_OK;
  if (!cJSON_IsArray(arr))
    return tk_fail(L, DS_ERR_FORMAT, "added_tokens", "must be an array, got %s", tk_type_name(arr));
  size_t cap = (size_t)cJSON_GetArraySize(arr);
  tok->added = calloc(cap ? cap : 1, sizeof *tok->added);
  if (!tok->added) return DS_FAIL(DS_ERR_NOMEM, "cannot allocate %zu added tokens", cap);
  /* HF's AddedVocabulary::add_tokens: new ids continue from the model's vocab size. */
  int64_t next_id = (int64_t)tok->model_str.count;
  const cJSON *it;
  size_t i = 0;
  cJSON_ArrayForEach(it, arr) {
    char path[64], sb[200];
    snprintf(path, sizeof path, "added_tokens[%zu]", i++);
    if (!cJSON_IsObject(it)) return tk_fail(L, DS_ERR_FORMAT, path, "expected an object, got %s", tk_type_name(it));
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
    if (!cJSON_IsString(content))
      return tk_fail(L, DS_ERR_FORMAT, path, "'content' must be a string, got %s", tk_type_name(content));
    DS_TRY(tk_check_utf8(L, content->valuestring, path));
    int32_t file_id = 0;
    char idpath[80];
    snprintf(idpath, sizeof idpath, "%s.id", path);
    DS_TRY(tk_get_id(L, cJSON_GetObjectItemCaseSensitive(it, "id"), &file_id, idpath));
    tk_added a = {0};
    int f[5];
    DS_TRY(tk_get_bool(L, it, "single_word", 0, &f[0], path));
    DS_TRY(tk_get_bool(L, it, "lstrip", 0, &f[1], path));
    DS_TRY(tk_get_bool(L, it, "rstrip", 0, &f[2], path));
    DS_TRY(tk_get_bool(L, it, "normalized", 1, &f[3], path));
    DS_TRY(tk_get_bool(L, it, "special", 0, &f[4], path));
    a.single_word = f[0] != 0;
    a.lstrip = f[1] != 0;
    a.rstrip = f[2] != 0;
    a.normalized = f[3] != 0;
    a.special = f[4] != 0;
    const char *c = content->valuestring;
    size_t clen = strlen(c);
    if (!clen) continue; /* HF ignores empty added tokens */
    int32_t id = tk_strmap_get(&tok->added_str, c, clen);
    size_t slot = tok->n_added;
    if (id >= 0) {
      for (slot = 0; slot < tok->n_added && tok->added[slot].id != id; slot++) {}
      const tk_added *o = &tok->added[slot];
      if (o->single_word == a.single_word && o->lstrip == a.lstrip && o->rstrip == a.rstrip &&
          o->normalized == a.normalized && o->special == a.special)
        continue; /* an identical repeat: HF skips it */
    } else {
      id = tk_strmap_get(&tok->model_str, c, clen);
      if (id < 0) {
        if (next_id >= INT32_MAX) return tk_fail(L, DS_ERR_RANGE, path, "too many tokens");
        id = (int32_t)next_id++;
      }
      for (slot = 0; slot < tok->n_added && tok->added[slot].id != id; slot++) {}
    }
    if (id != file_id)
      return tk_fail(L, DS_ERR_FORMAT, idpath,
                  "'%s' has id %d but HF tokenizers gives it id %d (its model.vocab id, or the next free id "
                  "after the vocab in file order)", tk_show(c, sb), (int)file_id, (int)id);
    DS_TRY(tk_strmap_put(&tok->added_str, c, clen, id, NULL));
    if (a.special) DS_TRY(tk_strmap_put(&L->specials, c, clen, 1, NULL));
    a.id = id;
    a.content = strdup(c);
    if (!a.content) return DS_FAIL(DS_ERR_NOMEM, "cannot copy an added token");
    if (slot < tok->n_added) {
      free(tok->added[slot].content);
      tok->added[slot] = a;
    } else {
      tok->added[tok->n_added++] = a;
    }
  }
  return DS_OK;
}

/* Patterns (NFC'd for normalized tokens under an NFC normalizer) go into the two tries. */
static ds_status build_added_tries(tk_loader *L) {
  ds_tokenizer *tok = L->tok;
  int need_word = 0;
  for (size_t i = 0; i < tok->n_added; i++) {
    tk_added *a = &tok->added[i];
    size_t len = strlen(a->content);
    tk_buf p = {0};
    if (a->normalized && tok->nfc) DS_TRY(tk_nfc_append(tok->nfc, (const unsigned char *)a->content, len, &p));
    else DS_TRY(tk_buf_append(&p, a->content, len));
    ds_status st = tk_buf_append(&p, "", 1);
    if (st != DS_OK) { tk_buf_free(&p); return st; }
    a->pattern = (char *)p.p;
    a->pattern_len = p.len - 1;
    DS_TRY(tk_trie_insert(a->normalized ? &tok->norm_trie : &tok->raw_trie, (const unsigned char *)a->pattern,
                          a->pattern_len, (int32_t)i));
    need_word |= a->single_word;
  }
  if (need_word) {
    /* The regex crate's \w, which HF's single_word uses (measured: tok_uprops_index.c). */
    int jit;
    char err[256];
    tok->word_re = tk_regex_compile_single_word(&jit, err, sizeof err);
    if (!tok->word_re) return DS_FAIL(DS_ERR_INTERNAL, "single_word regex: %s", err);
  }
  return DS_OK;
}

/* ---- per-id tables ---- */

static ds_status set_id(tk_loader *L, int32_t id, const char *str, const char *dec_str, int added,
                        const int16_t u2b[324]) {
  ds_tokenizer *tok = L->tok;
  ds_status st;
  tok->str_off[id] = (uint32_t)tok->strs.len;
  DS_TRY(tk_buf_append(&tok->strs, str, strlen(str) + 1));
  tok->dec_off[id] = (uint32_t)tok->decs.len;
  if (!byte_level_bytes(dec_str, u2b, &tok->decs, &st)) {
    DS_TRY(st);
    DS_TRY(tk_buf_append(&tok->decs, dec_str, strlen(dec_str)));
  }
  tok->dec_len[id] = (uint32_t)(tok->decs.len - tok->dec_off[id]);
  /* HF skips a token as special when the string it decodes is a special token's content. */
  tok->id_flags[id] = (uint8_t)(TK_ID_PRESENT | (added ? TK_ID_ADDED : 0) |
                                (tk_strmap_get(&L->specials, dec_str, strlen(dec_str)) >= 0 ? TK_ID_SPECIAL : 0));
  if (tok->strs.len > UINT32_MAX || tok->decs.len > UINT32_MAX)
    return DS_FAIL(DS_ERR_RANGE, "%s: token strings over 4 GiB", L->label);
  return DS_OK;
}

/* A whole-word cache computed once: the tokens whose own bytes BPE-merge back into exactly
 * themselves. A pre-tokenized word equal to such a token is emitted with one lookup (most
 * words of real text are single tokens), with ids identical to running the merges. */
static ds_status mark_self_merging(tk_loader *L, const int16_t u2b[324]) {
  ds_tokenizer *tok = L->tok;
  tk_buf bytes = {0};
  tk_bpe_scratch scratch = {0};
  ds_ids ids = {0};
  ds_status st = DS_OK;
  const cJSON *it;
  cJSON_ArrayForEach(it, L->vocab) {
    int32_t id = (int32_t)it->valuedouble;
    bytes.len = 0;
    if (!byte_level_bytes(it->string, u2b, &bytes, &st)) {
      if (st != DS_OK) break;
      continue;
    }
    if (bytes.len < 2 || tk_strmap_get(&tok->vocab_bytes, bytes.p, bytes.len) != id) continue;
    ids.len = 0;
    if ((st = tk_bpe_word(tok, bytes.p, bytes.len, &scratch, &ids)) != DS_OK) break;
    if (ids.len == 1 && ids.ids[0] == id) tok->id_flags[id] |= TK_ID_SELF;
  }
  tk_buf_free(&bytes);
  tk_bpe_scratch_free(&scratch);
  ds_ids_free(&ids);
  return st;
}

static ds_status build_ids(tk_loader *L) {
  ds_tokenizer *tok = L->tok;
  int64_t max_id = -1;
  const cJSON *it;
  cJSON_ArrayForEach(it, L->vocab) if ((int64_t)it->valuedouble > max_id) max_id = (int64_t)it->valuedouble;
  for (size_t i = 0; i < tok->n_added; i++) if (tok->added[i].id > max_id) max_id = tok->added[i].id;
  /* Per-id tables are sized by the largest id: refuse ids far beyond the number of tokens
   * (real vocabularies are dense) rather than allocate gigabytes for a typo. */
  size_t n_tokens = tok->model_str.count + tok->n_added;
  if ((uint64_t)max_id >= 2 * (uint64_t)n_tokens + 65536)
    return tk_fail(L, DS_ERR_FORMAT, "model.vocab", "id %lld is far beyond the %zu tokens: ids must be dense",
                (long long)max_id, n_tokens);
  tok->n_ids = max_id + 1;
  size_t n = (size_t)tok->n_ids;
  tok->str_off = calloc(n ? n : 1, sizeof *tok->str_off);
  tok->dec_off = calloc(n ? n : 1, sizeof *tok->dec_off);
  tok->dec_len = calloc(n ? n : 1, sizeof *tok->dec_len);
  tok->id_flags = calloc(n ? n : 1, sizeof *tok->id_flags);
  if (!tok->str_off || !tok->dec_off || !tok->dec_len || !tok->id_flags)
    return DS_FAIL(DS_ERR_NOMEM, "cannot allocate tables for %zu token ids", n);
  uint32_t b2u[256];
  int16_t u2b[324];
  byte_map(b2u);
  memset(u2b, 0xFF, sizeof u2b);
  for (int b = 0; b < 256; b++) u2b[b2u[b]] = (int16_t)b;
  cJSON_ArrayForEach(it, L->vocab) {
    int32_t id = (int32_t)it->valuedouble;
    /* a key repeated in the JSON object: the last occurrence wins, as in HF */
    if (tk_strmap_get(&L->tok->model_str, it->string, strlen(it->string)) != id) continue;
    if (tok->id_flags[id]) {
      char sa[200], sb[200];
      return tk_fail(L, DS_ERR_FORMAT, "model.vocab", "id %d is used by both '%s' and '%s'", (int)id,
                  tk_show((const char *)tok->strs.p + tok->str_off[id], sa), tk_show(it->string, sb));
    }
    DS_TRY(set_id(L, id, it->string, it->string, 0, u2b));
  }
  for (size_t i = 0; i < tok->n_added; i++) {
    const tk_added *a = &tok->added[i];
    /* decode uses the normalized form of a normalized token (HF's simple_id_to_token) */
    DS_TRY(set_id(L, a->id, a->content, a->pattern, 1, u2b));
  }
  DS_TRY(mark_self_merging(L, u2b));
  for (size_t k = 0; k < tok->post_prefix.len + tok->post_suffix.len; k++) {
    int32_t id = k < tok->post_prefix.len ? tok->post_prefix.ids[k] : tok->post_suffix.ids[k - tok->post_prefix.len];
    if (id >= tok->n_ids || !tok->id_flags[id])
      return tk_fail(L, DS_ERR_FORMAT, "post_processor", "template token id %d is not in the vocabulary", (int)id);
  }
  return DS_OK;
}

static ds_status load_root(tk_loader *L, const cJSON *root) {
  ds_tokenizer *tok = L->tok;
  if (!cJSON_IsObject(root)) return DS_FAIL(DS_ERR_FORMAT, "%s: top level must be a JSON object", L->label);
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "version");
  if (!tk_is_null(v) && !(cJSON_IsString(v) && !strcmp(v->valuestring, "1.0")))
    return tk_fail(L, DS_ERR_UNSUPPORTED, "version", "tokenizer.json version must be \"1.0\"");
  DS_TRY(tk_load_normalizer(L, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), "normalizer", 0));
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
  if (!model) return tk_fail(L, DS_ERR_FORMAT, "model", "missing");
  DS_TRY(load_model(L, model));
  DS_TRY(load_added(L, cJSON_GetObjectItemCaseSensitive(root, "added_tokens")));
  DS_TRY(build_added_tries(L));
  const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
  if (tk_is_null(pre)) return tk_fail(L, DS_ERR_UNSUPPORTED, "pre_tokenizer", "a ByteLevel pre-tokenizer is required");
  DS_TRY(tk_load_pretok(L, pre, "pre_tokenizer", 0));
  for (size_t i = 0; i < tok->n_steps; i++)
    if (tok->steps[i].byte_level != (i + 1 == tok->n_steps))
      return tk_fail(L, DS_ERR_UNSUPPORTED, "pre_tokenizer",
                  "ByteLevel must be the last step (after any Split), and present exactly once");
  DS_TRY(tk_load_post(L, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), "post_processor", 0));
  DS_TRY(tk_load_decoder(L, cJSON_GetObjectItemCaseSensitive(root, "decoder"), "decoder", 0));
  return build_ids(L);
}

ds_status ds_tokenizer_load_memory(const char *json, size_t len, const char *label, ds_tokenizer **out) {
  if (!out) return DS_FAIL(DS_ERR_ARG, "ds_tokenizer_load_memory: out is NULL");
  *out = NULL;
  if (!label) label = "tokenizer.json";
  if (!json) return DS_FAIL(DS_ERR_ARG, "%s: no JSON text given", label);
  /* cJSON would cut a string at a "\u0000" escape (a vocabulary entry, an added token, a
   * pattern): such a file is refused rather than loaded with different strings. */
  const char *raw = memchr(json, 0, len);
  size_t nul = raw ? (size_t)(raw - json) : tk_json_find_nul(json, len);
  if (nul < len) {
    size_t line, col;
    tk_text_line_col(json, nul, &line, &col);
    return DS_FAIL(raw ? DS_ERR_FORMAT : DS_ERR_UNSUPPORTED, "%s: line %zu, column %zu: %s", label, line, col,
                   raw ? "a raw NUL byte (not JSON text)" : "a string holds \\u0000 (U+0000), which is not supported");
  }
  ds_status st;
  cJSON *root = ds_json_parse(json, len, label, &st);
  if (!root) return st;
  tk_loader L = {0};
  L.label = label;
  L.tok = calloc(1, sizeof *L.tok);
  if (!L.tok || !(L.tok->label = strdup(label))) {
    cJSON_Delete(root);
    free(L.tok);
    return DS_FAIL(DS_ERR_NOMEM, "%s: cannot allocate the tokenizer", label);
  }
  for (int b = 0; b < 256; b++) L.tok->byte_id[b] = -1;
  st = load_root(&L, root);
  cJSON_Delete(root);
  tk_strmap_free(&L.specials);
  if (st != DS_OK) {
    ds_tokenizer_free(L.tok);
    return st;
  }
  *out = L.tok;
  return DS_OK;
}

ds_status ds_tokenizer_load(const char *path, ds_tokenizer **out) {
  if (!out || !path) return DS_FAIL(DS_ERR_ARG, "ds_tokenizer_load: NULL argument");
  *out = NULL;
  char *json;
  size_t len;
  DS_TRY(ds_read_file(path, &json, &len));
  ds_status st = ds_tokenizer_load_memory(json, len, path, out);
  free(json);
  return st;
}

void ds_tokenizer_free(ds_tokenizer *tok) {
  if (!tok) return;
  free(tok->label);
  free(tok->str_off);
  free(tok->dec_off);
  free(tok->dec_len);
  free(tok->id_flags);
  tk_buf_free(&tok->strs);
  tk_buf_free(&tok->decs);
  tk_strmap_free(&tok->model_str);
  tk_strmap_free(&tok->added_str);
  tk_strmap_free(&tok->vocab_bytes);
  tk_pairmap_free(&tok->merges);
  tk_nfc_free(tok->nfc);
  for (size_t i = 0; i < tok->n_added; i++) {
    free(tok->added[i].content);
    free(tok->added[i].pattern);
  }
  free(tok->added);
  tk_trie_free(&tok->raw_trie);
  tk_trie_free(&tok->norm_trie);
  if (tok->word_re) pcre2_code_free(tok->word_re);
  for (size_t i = 0; i < tok->n_steps; i++)
    if (tok->steps[i].re) pcre2_code_free(tok->steps[i].re);
  ds_ids_free(&tok->post_prefix);
  ds_ids_free(&tok->post_suffix);
  free(tok);
}
