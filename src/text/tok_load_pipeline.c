/* Loading the pipeline sections of tokenizer.json: normalizer, pre_tokenizer,
 * post_processor and decoder. Each accepts exactly what tok_internal.h's pipeline runs and
 * refuses anything else as unsupported, naming the field. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tok_json.h"

/* ---- normalizer ---- */

ds_status tk_load_normalizer(tk_loader *L, const cJSON *n, const char *path, int depth) {
  if (tk_is_null(n)) return DS_OK;
  ds_status st;
  const char *type = tk_type_of(L, n, path, &st);
  if (!type) return st;
  if (!strcmp(type, "NFC")) {
    if (!L->tok->nfc) DS_TRY(tk_nfc_build(&L->tok->nfc));
    return DS_OK;
  }
  if (!strcmp(type, "Sequence") && depth < 4) {
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(n, "normalizers"), *it;
    if (!cJSON_IsArray(arr))
      return tk_fail(L, DS_ERR_FORMAT, path, "'normalizers' must be an array, got %s", tk_type_name(arr));
    size_t i = 0;
    cJSON_ArrayForEach(it, arr) {
      char sub[96];
      snprintf(sub, sizeof sub, "%s.normalizers[%zu]", path, i++);
      DS_TRY(tk_load_normalizer(L, it, sub, depth + 1));
    }
    return DS_OK;
  }
  return tk_fail(L, DS_ERR_UNSUPPORTED, path, "normalizer type '%s' is not supported (only NFC)", type);
}

/* ---- pre-tokenizer ---- */

static ds_status add_step(tk_loader *L, const char *path, tk_pretok_step s) {
  ds_tokenizer *tok = L->tok;
  if (tok->n_steps == TK_MAX_STEPS) {
    if (s.re) pcre2_code_free(s.re);
    return tk_fail(L, DS_ERR_UNSUPPORTED, path, "more than %d pre-tokenizer steps", TK_MAX_STEPS);
  }
  tok->steps[tok->n_steps++] = s;
  return DS_OK;
}

ds_status tk_load_pretok(tk_loader *L, const cJSON *p, const char *path, int depth) {
  ds_status st;
  const char *type = tk_type_of(L, p, path, &st);
  if (!type) return st;
  char err[512];
  if (!strcmp(type, "ByteLevel")) {
    tk_pretok_step s = {0};
    int use_regex;
    s.byte_level = 1;
    s.behavior = TK_SPLIT_ISOLATED;
    DS_TRY(tk_need_bool(L, p, "add_prefix_space", &s.add_prefix_space, path));
    DS_TRY(tk_get_bool(L, p, "use_regex", 1, &use_regex, path));
    if (use_regex && !(s.re = tk_regex_compile(tk_gpt2_pattern, 0, &s.jit, err, sizeof err)))
      return DS_FAIL(DS_ERR_INTERNAL, "GPT-2 regex: %s", err);
    return add_step(L, path, s);
  }
  if (!strcmp(type, "Split")) {
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                        "Contiguous"};
    tk_pretok_step s = {0};
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    const cJSON *str = cJSON_GetObjectItemCaseSensitive(pat, "String");
    const cJSON *beh = cJSON_GetObjectItemCaseSensitive(p, "behavior");
    if (!cJSON_IsObject(pat) || !(cJSON_IsString(re) || cJSON_IsString(str)))
      return tk_fail(L, DS_ERR_FORMAT, path, "'pattern' must be {\"Regex\": string} or {\"String\": string}");
    if (!cJSON_IsString(beh)) return tk_fail(L, DS_ERR_FORMAT, path, "'behavior' must be a string, got %s", tk_type_name(beh));
    size_t b = 0;
    while (b < 5 && strcmp(beh->valuestring, names[b])) b++;
    if (b == 5) return tk_fail(L, DS_ERR_FORMAT, path, "unknown split behavior '%s'", beh->valuestring);
    s.behavior = (tk_split_behavior)b;
    DS_TRY(tk_need_bool(L, p, "invert", &s.invert, path));
    const char *text = cJSON_IsString(re) ? re->valuestring : str->valuestring;
    DS_TRY(tk_check_utf8(L, text, path));
    s.re = tk_regex_compile(text, !cJSON_IsString(re), &s.jit, err, sizeof err);
    if (!s.re) return tk_fail(L, DS_ERR_FORMAT, path, "pattern: %s", err);
    return add_step(L, path, s);
  }
  if (!strcmp(type, "Sequence") && depth < 4) {
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers"), *it;
    if (!cJSON_IsArray(arr))
      return tk_fail(L, DS_ERR_FORMAT, path, "'pretokenizers' must be an array, got %s", tk_type_name(arr));
    size_t i = 0;
    cJSON_ArrayForEach(it, arr) {
      char sub[128];
      snprintf(sub, sizeof sub, "%s.pretokenizers[%zu]", path, i++);
      DS_TRY(tk_load_pretok(L, it, sub, depth + 1));
    }
    return DS_OK;
  }
  return tk_fail(L, DS_ERR_UNSUPPORTED, path,
              "pre-tokenizer type '%s' is not supported (ByteLevel, Split, Sequence)", type);
}

/* ---- post-processor ---- */

static ds_status push_template_ids(tk_loader *L, const cJSON *specials, const char *name, ds_ids *dst,
                                   const char *path) {
  const cJSON *sp = cJSON_GetObjectItemCaseSensitive(specials, name);
  const cJSON *ids = cJSON_GetObjectItemCaseSensitive(sp, "ids"), *it;
  char sb[200];
  if (!cJSON_IsArray(ids))
    return tk_fail(L, DS_ERR_FORMAT, path, "special token '%s' is not in special_tokens (with an 'ids' array)",
                tk_show(name, sb));
  cJSON_ArrayForEach(it, ids) {
    int32_t id = 0;
    DS_TRY(tk_get_id(L, it, &id, path));
    DS_TRY(ds_ids_push(dst, id));
  }
  return DS_OK;
}

ds_status tk_load_post(tk_loader *L, const cJSON *p, const char *path, int depth) {
  ds_tokenizer *tok = L->tok;
  if (tk_is_null(p)) return DS_OK;
  ds_status st;
  const char *type = tk_type_of(L, p, path, &st);
  if (!type) return st;
  if (!strcmp(type, "ByteLevel")) return DS_OK; /* only trims offsets */
  if (!strcmp(type, "TemplateProcessing")) {
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(p, "single"), *it;
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(p, "special_tokens");
    if (!cJSON_IsArray(single))
      return tk_fail(L, DS_ERR_FORMAT, path, "'single' must be an array, got %s", tk_type_name(single));
    ds_ids pre = {0}, suf = {0};
    int seen_a = 0;
    size_t i = 0;
    st = DS_OK;
    cJSON_ArrayForEach(it, single) {
      char sub[128];
      snprintf(sub, sizeof sub, "%s.single[%zu]", path, i++);
      const cJSON *sp = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
      const cJSON *seq = cJSON_GetObjectItemCaseSensitive(it, "Sequence");
      const cJSON *id = cJSON_GetObjectItemCaseSensitive(sp ? sp : seq, "id");
      if (!(sp || seq) || !cJSON_IsString(id)) {
        st = tk_fail(L, DS_ERR_FORMAT, sub, "expected {\"SpecialToken\": {\"id\": ...}} or {\"Sequence\": {\"id\": \"A\"}}");
        break;
      }
      if (seq) {
        if (strcmp(id->valuestring, "A") || seen_a) {
          st = tk_fail(L, DS_ERR_UNSUPPORTED, sub, "a single-sequence template must contain sequence A exactly once");
          break;
        }
        seen_a = 1;
      } else if ((st = push_template_ids(L, specials, id->valuestring, seen_a ? &suf : &pre, sub)) != DS_OK) {
        break;
      }
    }
    if (st == DS_OK && !seen_a) st = tk_fail(L, DS_ERR_FORMAT, path, "'single' has no {\"Sequence\": {\"id\": \"A\"}}");
    /* A later processor wraps the earlier result: prefix = new + old, suffix = old + new. */
    for (size_t k = 0; st == DS_OK && k < tok->post_prefix.len; k++) st = ds_ids_push(&pre, tok->post_prefix.ids[k]);
    for (size_t k = 0; st == DS_OK && k < suf.len; k++) st = ds_ids_push(&tok->post_suffix, suf.ids[k]);
    ds_ids_free(&suf);
    if (st != DS_OK) { ds_ids_free(&pre); return st; }
    ds_ids_free(&tok->post_prefix);
    tok->post_prefix = pre;
    return DS_OK;
  }
  if (!strcmp(type, "Sequence") && depth < 4) {
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(p, "processors"), *it;
    if (!cJSON_IsArray(arr))
      return tk_fail(L, DS_ERR_FORMAT, path, "'processors' must be an array, got %s", tk_type_name(arr));
    size_t i = 0;
    cJSON_ArrayForEach(it, arr) {
      char sub[128];
      snprintf(sub, sizeof sub, "%s.processors[%zu]", path, i++);
      DS_TRY(tk_load_post(L, it, sub, depth + 1));
    }
    return DS_OK;
  }
  return tk_fail(L, DS_ERR_UNSUPPORTED, path,
              "post-processor type '%s' is not supported (ByteLevel, TemplateProcessing, Sequence)", type);
}

ds_status tk_load_decoder(tk_loader *L, const cJSON *d, const char *path, int depth) {
  ds_status st;
  if (tk_is_null(d)) return tk_fail(L, DS_ERR_UNSUPPORTED, path, "a ByteLevel decoder is required, got null");
  const char *type = tk_type_of(L, d, path, &st);
  if (!type) return st;
  if (!strcmp(type, "ByteLevel")) return DS_OK;
  if (!strcmp(type, "Sequence") && depth < 4) {
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(d, "decoders"), *it;
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) != 1)
      return tk_fail(L, DS_ERR_UNSUPPORTED, path, "only a Sequence of one ByteLevel decoder is supported");
    cJSON_ArrayForEach(it, arr) DS_TRY(tk_load_decoder(L, it, "decoder.decoders[0]", depth + 1));
    return DS_OK;
  }
  return tk_fail(L, DS_ERR_UNSUPPORTED, path, "decoder type '%s' is not supported (only ByteLevel)", type);
}
