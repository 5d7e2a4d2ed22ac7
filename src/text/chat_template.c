/* Chat templates (include/dspark/chat_template.h): finding a model's template, rendering a
 * conversation through the Jinja interpreter, and turning the render into ids and a loss
 * mask. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "dspark/chat_template.h"
#include "dspark/fileio.h"
#include "text/jinja_internal.h"
#include "text/tok_internal.h"

enum { MAX_VARS = 32 };

struct ds_chat_template {
  jarena arena; /* the syntax tree and the variables' strings */
  jnode *root;
  int has_generation;
  uint64_t text_xxh64;
  char *label;
  ds_status deferred;   /* a template that did not parse, kept to fail when first rendered */
  char *deferred_msg;
  const char *var_names[MAX_VARS], *var_values[MAX_VARS];
  size_t n_vars;
};

ds_status ds_chat_template_parse(const char *text, size_t len, const char *label, ds_chat_template **out) {
  *out = NULL;
  if (!text) return DS_FAIL(DS_ERR_ARG, "ds_chat_template_parse: NULL text");
  ds_chat_template *t = calloc(1, sizeof *t);
  if (!t || !(t->label = strdup(label ? label : "chat template"))) {
    free(t);
    return DS_FAIL(DS_ERR_NOMEM, "chat template: out of memory");
  }
  /* the tree points into its source: keep a copy in the arena */
  char *src = jarena_strdup(&t->arena, text, len);
  ds_status st = src ? DS_OK : DS_FAIL(DS_ERR_NOMEM, "chat template: out of memory");
  t->text_xxh64 = XXH64(text, len, 0);
  if (st == DS_OK) t->root = jinja_parse(&t->arena, src, len, t->label, &st, &t->has_generation);
  if (st != DS_OK) {
    ds_chat_template_free(t);
    return st;
  }
  *out = t;
  return DS_OK;
}

void ds_chat_template_free(ds_chat_template *t) {
  if (!t) return;
  jarena_free(&t->arena);
  free(t->label);
  free(t->deferred_msg);
  free(t);
}

const char *ds_chat_template_label(const ds_chat_template *t) { return t ? t->label : "ChatML"; }

uint64_t ds_chat_template_hash(const ds_chat_template *t) { return t ? t->text_xxh64 : 0; }

ds_status ds_chat_template_set_var(ds_chat_template *t, const char *name, const char *value) {
  for (size_t i = 0; i < t->n_vars; i++)
    if (!strcmp(t->var_names[i], name)) {
      t->var_values[i] = jarena_strdup(&t->arena, value, strlen(value));
      return t->var_values[i] ? DS_OK : DS_FAIL(DS_ERR_NOMEM, "chat template: out of memory");
    }
  if (t->n_vars == MAX_VARS) return DS_FAIL(DS_ERR_RANGE, "chat template: more than %d special-token variables", MAX_VARS);
  t->var_names[t->n_vars] = jarena_strdup(&t->arena, name, strlen(name));
  t->var_values[t->n_vars] = jarena_strdup(&t->arena, value, strlen(value));
  if (!t->var_names[t->n_vars] || !t->var_values[t->n_vars]) return DS_FAIL(DS_ERR_NOMEM, "chat template: out of memory");
  t->n_vars++;
  return DS_OK;
}

/* ------------------------------------------------------------------ loading */

static char *dir_of(const char *tokenizer_path) {
  struct stat sb;
  if (stat(tokenizer_path, &sb) == 0 && S_ISDIR(sb.st_mode)) return strdup(tokenizer_path);
  const char *slash = strrchr(tokenizer_path, '/');
  if (!slash) return strdup(".");
  size_t n = (size_t)(slash - tokenizer_path);
  char *d = malloc(n + 2);
  if (!d) return NULL;
  memcpy(d, tokenizer_path, n ? n : 1);
  d[n ? n : 1] = 0;
  if (!n) d[0] = '/';
  return d;
}

/* A special token as tokenizer_config.json writes it: "text" or {"content": "text", ...}. */
static const char *token_text(const cJSON *v) {
  if (cJSON_IsString(v)) return v->valuestring;
  const cJSON *c = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "content") : NULL;
  return cJSON_IsString(c) ? c->valuestring : NULL;
}

/* transformers' special-token attributes: a value that is no token (a number, a list, an object
 * without a string "content") makes transformers refuse the tokenizer; rendered here it would be
 * an empty string. null is "not set", as there. Other "*_token" keys (add_bos_token, ...) are not
 * tokens to transformers and are passed to the template only when they hold text. */
static ds_status check_special_token(const cJSON *it, const char *cfg_path) {
  static const char *const attrs[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                      "pad_token", "cls_token", "mask_token"};
  for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++)
    if (!strcmp(it->string, attrs[i]) && !cJSON_IsNull(it) && !token_text(it))
      return DS_FAIL(DS_ERR_FORMAT, "%s: \"%s\" must be a string, an object with a string \"content\", or null "
                     "(got %s)", cfg_path, it->string,
                     cJSON_IsObject(it) ? "an object without a string \"content\"" : cJSON_IsArray(it) ? "a list"
                     : cJSON_IsNumber(it) ? "a number" : cJSON_IsBool(it) ? "a boolean" : "another type");
  return DS_OK;
}

static ds_status template_from_config(const cJSON *cfg, const char *cfg_path, const char **text) {
  const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template"), *it;
  *text = NULL;
  if (!ct || cJSON_IsNull(ct)) return DS_OK;
  if (cJSON_IsString(ct)) {
    *text = ct->valuestring;
    return DS_OK;
  }
  if (!cJSON_IsArray(ct)) return DS_FAIL(DS_ERR_FORMAT, "%s: chat_template must be a string or a list of {name, template}", cfg_path);
  cJSON_ArrayForEach(it, ct) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(it, "name"), *tmpl = cJSON_GetObjectItemCaseSensitive(it, "template");
    if (!cJSON_IsString(name) || !cJSON_IsString(tmpl))
      return DS_FAIL(DS_ERR_FORMAT, "%s: chat_template list entries need string 'name' and 'template'", cfg_path);
    if (!strcmp(name->valuestring, "default")) *text = tmpl->valuestring;
  }
  if (!*text) return DS_FAIL(DS_ERR_NOT_FOUND, "%s: chat_template lists named templates but none is called \"default\"", cfg_path);
  return DS_OK;
}

ds_status ds_chat_template_load_texts(const ds_chat_template_source *src, const char *override_path,
                                      ds_chat_template **out) {
  *out = NULL;
  const char *cfg_path = src->config_label ? src->config_label : "tokenizer_config.json";
  char *file_text = NULL, *label = NULL;
  size_t file_len = 0;
  cJSON *cfg = NULL;
  ds_status st = DS_OK;
  if (src->config) {
    cfg = cJSON_ParseWithLength(src->config, src->config_len);
    if (!cfg || !cJSON_IsObject(cfg)) st = DS_FAIL(DS_ERR_FORMAT, "%s: malformed JSON (an object expected)", cfg_path);
  }
  const char *text = NULL;
  size_t text_len = 0;
  if (st == DS_OK && override_path) {
    if ((st = ds_read_file(override_path, &file_text, &file_len)) == DS_OK) {
      text = file_text;
      text_len = file_len;
      label = strdup(override_path);
    }
  } else if (st == DS_OK && src->jinja) {
    text = src->jinja;
    text_len = src->jinja_len;
    label = strdup(src->jinja_label ? src->jinja_label : "chat_template.jinja");
  } else if (st == DS_OK && cfg && (st = template_from_config(cfg, cfg_path, &text)) == DS_OK && text) {
    text_len = strlen(text);
    size_t n = strlen(cfg_path) + 32;
    if ((label = malloc(n))) snprintf(label, n, "%s:chat_template", cfg_path);
  }
  if (st == DS_OK && text && !label) st = DS_FAIL(DS_ERR_NOMEM, "chat template: out of memory");
  if (st == DS_OK && text && (st = ds_chat_template_parse(text, text_len, label, out)) != DS_OK) {
    /* A model's template this interpreter cannot run must not stop plain-text work with that
     * model: the error is kept and given when a conversation is first rendered. */
    ds_chat_template *broken = calloc(1, sizeof *broken);
    if (broken && (broken->label = strdup(label)) && (broken->deferred_msg = strdup(ds_last_error()))) {
      char *where = strrchr(broken->deferred_msg, '['); /* the recording's " [file.c:line]": re-added on failure */
      if (where && where > broken->deferred_msg && where[-1] == ' ') where[-1] = 0;
      broken->deferred = st;
      broken->text_xxh64 = XXH64(text, text_len, 0);
      *out = broken;
      st = DS_OK;
    } else {
      ds_chat_template_free(broken);
    }
  }
  if (st == DS_OK && *out && cfg) {
    const cJSON *it;
    cJSON_ArrayForEach(it, cfg) {
      size_t kl = strlen(it->string);
      const char *v = token_text(it);
      if ((st = check_special_token(it, cfg_path)) != DS_OK) break;
      if (kl > 6 && !strcmp(it->string + kl - 6, "_token") && v && (st = ds_chat_template_set_var(*out, it->string, v)) != DS_OK)
        break;
    }
    if (st != DS_OK) {
      ds_chat_template_free(*out);
      *out = NULL;
    }
  }
  cJSON_Delete(cfg);
  free(file_text);
  free(label);
  return st;
}

ds_status ds_chat_template_load(const char *tokenizer_path, const char *override_path, ds_chat_template **out) {
  *out = NULL;
  char *dir = dir_of(tokenizer_path);
  char *cfg_path = dir ? ds_path_join(dir, "tokenizer_config.json") : NULL;
  char *jinja_path = dir ? ds_path_join(dir, "chat_template.jinja") : NULL;
  ds_chat_template_source src = {.config_label = cfg_path, .jinja_label = jinja_path};
  char *cfg_text = NULL, *jinja_text = NULL;
  ds_status st = dir && cfg_path && jinja_path ? DS_OK : DS_FAIL(DS_ERR_NOMEM, "chat template: out of memory");
  if (st == DS_OK && ds_file_exists(cfg_path) && (st = ds_read_file(cfg_path, &cfg_text, &src.config_len)) == DS_OK)
    src.config = cfg_text;
  /* the Jinja file is read only when no --chat-template replaces it, as before */
  if (st == DS_OK && !override_path && ds_file_exists(jinja_path) &&
      (st = ds_read_file(jinja_path, &jinja_text, &src.jinja_len)) == DS_OK)
    src.jinja = jinja_text;
  if (st == DS_OK) st = ds_chat_template_load_texts(&src, override_path, out);
  free(cfg_text);
  free(jinja_text);
  free(jinja_path);
  free(cfg_path);
  free(dir);
  return st;
}

/* ------------------------------------------------------------------ rendering */

/* One render of msgs into o: the variables transformers passes (messages, tools=None,
 * documents=None, add_generation_prompt, enable_thinking when set, the special tokens). */
static ds_status render_once(const ds_chat_template *t, const ds_chat_message *msgs, size_t n, int add_gen,
                             int enable_thinking, jinja_output *o) {
  jarena a = {0};
  jdict *vars = jdict_new(&a);
  jlist *list = jlist_new(&a);
  const jdict **dicts = jarena_alloc(&a, (n + 1) * sizeof *dicts);
  int bad = !vars || !list || !dicts;
  for (size_t i = 0; i < n && !bad; i++) {
    const ds_chat_message *m = &msgs[i];
    jdict *d = jdict_new(&a);
    if (!d || !m->role || !m->content) {
      ds_status st = d ? DS_FAIL(DS_ERR_ARG, "chat message %zu has no %s", i, m->role ? "content" : "role") : DS_ERR_NOMEM;
      jarena_free(&a);
      return st == DS_ERR_NOMEM ? DS_FAIL(st, "chat template: out of memory") : st;
    }
    size_t cl = m->content_len ? m->content_len : strlen(m->content);
    jv reasoning = m->reasoning ? jv_str(m->reasoning, m->reasoning_len ? m->reasoning_len : strlen(m->reasoning)) : jv_none();
    /* as transformers aliases it: thinking first, reasoning_content last */
    if (m->reasoning) bad |= jdict_set(&a, d, "thinking", 8, reasoning);
    bad |= jdict_set(&a, d, "role", 4, jv_str(m->role, strlen(m->role))) || jdict_set(&a, d, "content", 7, jv_str(m->content, cl));
    if (m->reasoning) bad |= jdict_set(&a, d, "reasoning_content", 17, reasoning);
    jv dv = {JV_DICT, {.dict = d}, NULL};
    bad |= jlist_push(&a, list, dv);
    dicts[i] = d;
  }
  jv lv = {JV_LIST, {.list = list}, NULL};
  if (!bad) bad = jdict_set(&a, vars, "messages", 8, lv) || jdict_set(&a, vars, "tools", 5, jv_none()) ||
                  jdict_set(&a, vars, "documents", 9, jv_none()) ||
                  jdict_set(&a, vars, "add_generation_prompt", 21, jv_bool(add_gen));
  if (!bad && enable_thinking >= 0) bad = jdict_set(&a, vars, "enable_thinking", 15, jv_bool(enable_thinking));
  for (size_t i = 0; i < t->n_vars && !bad; i++)
    bad = jdict_set(&a, vars, t->var_names[i], strlen(t->var_names[i]), jv_str(t->var_values[i], strlen(t->var_values[i])));
  ds_status st = bad ? DS_FAIL(DS_ERR_NOMEM, "chat template: out of memory")
                     : jinja_render(t->root, &a, t->label, vars, (const jdict *const *)dicts, n, o);
  jarena_free(&a);
  return st;
}

static void output_free(jinja_output *o) {
  free(o->text);
  free(o->owner);
  free(o->generation);
  memset(o, 0, sizeof *o);
}

/* The generation prompt: what add_generation_prompt puts at the end of this conversation.
 * The two renders agree up to some piece of output (a text or a {{ }}); what follows in the
 * one with the prompt is the prompt. Pieces, not bytes: Phi-3 ends with "<|endoftext|>"
 * without the prompt and "<|assistant|>\n" with it, which share "<|" but no piece. *g is
 * malloc'd. */
static ds_status generation_prompt(const ds_chat_template *t, const ds_chat_message *msgs, size_t n, int enable_thinking,
                                   char **g, size_t *glen) {
  jinja_output without = {0}, with = {0};
  ds_status st = render_once(t, msgs, n, 0, enable_thinking, &without);
  if (st == DS_OK) st = render_once(t, msgs, n, 1, enable_thinking, &with);
  *glen = 0;
  if (st == DS_OK) {
    size_t p = 0;
    while (p < with.len && p < without.len && with.text[p] == without.text[p]) p++;
    while (p > 0 && !(p == without.len || ((without.generation[p] & JOUT_CHUNK_START) &&
                                           (p == with.len || (with.generation[p] & JOUT_CHUNK_START)))))
      p--;
    *glen = with.len - p;
  }
  if (st == DS_OK && !(*g = malloc(*glen + 1))) st = DS_FAIL(DS_ERR_NOMEM, "chat template: out of memory");
  if (st == DS_OK) memcpy(*g, with.text + with.len - *glen, *glen);
  output_free(&without);
  output_free(&with);
  return st;
}

/* Marks each assistant message's bytes after its header (see the header comment). */
static ds_status assistant_mask(const ds_chat_template *t, const ds_chat_message *msgs, size_t n,
                                const ds_chat_options *opt, const jinja_output *o, uint8_t *train) {
  char *g[2] = {NULL, NULL};
  size_t gl[2] = {0, 0};
  int any = 0;
  for (size_t m = 0; m < n; m++) any |= !strcmp(msgs[m].role, "assistant");
  if (!any) return DS_OK;
  ds_status st = generation_prompt(t, msgs, n, opt->enable_thinking, &g[0], &gl[0]);
  if (st == DS_OK && opt->enable_thinking >= 0) st = generation_prompt(t, msgs, n, -1, &g[1], &gl[1]);
  /* each message's first and last emitted byte, in one pass over the output */
  size_t *first = st == DS_OK ? malloc(2 * n * sizeof *first) : NULL, *last = first ? first + n : NULL;
  if (st == DS_OK && !first) st = DS_FAIL(DS_ERR_NOMEM, "chat template: out of memory");
  for (size_t m = 0; first && m < n; m++) first[m] = SIZE_MAX, last[m] = 0;
  for (size_t i = 0; first && i < o->len; i++) {
    int32_t m = o->owner[i];
    if (m < 0 || (size_t)m >= n) continue;
    if (first[m] == SIZE_MAX) first[m] = i;
    last[m] = i + 1;
  }
  for (size_t m = 0; m < n && st == DS_OK; m++) {
    if (strcmp(msgs[m].role, "assistant") || first[m] == SIZE_MAX) continue;
    size_t s = first[m], e = last[m];
    /* the longest header candidate the turn starts with; else their common prefix */
    size_t skip = 0, lcp = 0;
    for (int k = 0; k < 2; k++) {
      if (!g[k]) continue;
      size_t c = 0;
      while (c < gl[k] && s + c < e && o->text[s + c] == g[k][c]) c++;
      if (c == gl[k] && c > skip) skip = c;
      if (c > lcp) lcp = c;
    }
    if (!skip) skip = lcp;
    for (size_t i = s + skip; i < e; i++) train[i] = o->owner[i] == (int32_t)m;
  }
  free(first);
  free(g[0]);
  free(g[1]);
  return st;
}

ds_status ds_chat_template_render(const ds_chat_template *t, const ds_chat_message *msgs, size_t n,
                                  const ds_chat_options *opt, char **text, size_t *len, uint8_t **train) {
  if (!t || !text || !len || (!msgs && n)) return DS_FAIL(DS_ERR_ARG, "ds_chat_template_render: NULL argument");
  if (t->deferred) return DS_FAIL(t->deferred, "%s", t->deferred_msg);
  ds_chat_options def = {0, -1};
  if (!opt) opt = &def;
  jinja_output o = {0};
  ds_status st = render_once(t, msgs, n, opt->add_generation_prompt, opt->enable_thinking, &o);
  uint8_t *mask = NULL;
  if (st == DS_OK && train && !(mask = calloc(o.len + 1, 1))) st = DS_FAIL(DS_ERR_NOMEM, "chat template: out of memory");
  if (st == DS_OK && mask) {
    if (t->has_generation)
      for (size_t i = 0; i < o.len; i++) mask[i] = o.generation[i] & JOUT_GENERATION;
    else st = assistant_mask(t, msgs, n, opt, &o, mask);
  }
  if (st != DS_OK) {
    free(mask);
    output_free(&o);
    return st;
  }
  *text = o.text;
  *len = o.len;
  if (train) *train = mask;
  free(o.owner);
  free(o.generation);
  return DS_OK;
}

/* ------------------------------------------------------------------ tokens */

/* The render as the tokenizer sees it: under an NFC normalizer, each run of equally masked
 * bytes is normalized on its own so that the mask stays aligned with the bytes the tokens
 * decode to. */
static ds_status normalize_runs(const ds_tokenizer *tok, const char *text, size_t len, const uint8_t *train, tk_buf *out,
                                tk_buf *out_train) {
  for (size_t b = 0; b < len;) {
    size_t e = b + 1;
    while (e < len && train[e] == train[b]) e++;
    size_t before = out->len;
    DS_TRY(tk_nfc_append(tok->nfc, (const unsigned char *)text + b, e - b, out));
    for (size_t i = before; i < out->len; i++) DS_TRY(tk_buf_append(out_train, &train[b], 1));
    b = e;
  }
  return DS_OK;
}

/* Bytes of the Unicode White_Space character at s (what HF's lstrip / rstrip remove), else 0. */
static size_t white_space_len(const char *s, size_t n) {
  const unsigned char *p = (const unsigned char *)s;
  if (p[0] == ' ' || (p[0] >= 9 && p[0] <= 13)) return 1;
  if (n >= 2 && p[0] == 0xC2 && (p[1] == 0x85 || p[1] == 0xA0)) return 2;
  if (n >= 3 && p[0] == 0xE1 && p[1] == 0x9A && p[2] == 0x80) return 3; /* U+1680 */
  if (n >= 3 && p[0] == 0xE2 && p[1] == 0x80 && (p[2] <= 0x8A || p[2] == 0xA8 || p[2] == 0xA9 || p[2] == 0xAF))
    return 3; /* U+2000..200A, 2028, 2029, 202F */
  if (n >= 3 && p[0] == 0xE2 && p[1] == 0x81 && p[2] == 0x9F) return 3; /* U+205F */
  if (n >= 3 && p[0] == 0xE3 && p[1] == 0x80 && p[2] == 0x80) return 3; /* U+3000 */
  return 0;
}

/* Does added token id strip white space on its left (left = 1, lstrip) or right (rstrip)? Nothing else
 * swallows text without decoding to it. */
static int added_strips(const ds_tokenizer *tok, int32_t id, int left) {
  for (size_t k = 0; k < tok->n_added; k++)
    if (tok->added[k].id == id) return left ? tok->added[k].lstrip : tok->added[k].rstrip;
  return 0;
}

ds_status ds_chat_encode(const ds_tokenizer *tok, const ds_chat_template *t, const ds_chat_message *msgs, size_t n,
                         const ds_chat_options *opt, ds_ids *ids, ds_ids *loss_mask) {
  if (!t) return ds_chat_encode_chatml(tok, msgs, n, opt ? opt->add_generation_prompt : 0, ids, loss_mask);
  if (!tok || !ids || !loss_mask) return DS_FAIL(DS_ERR_ARG, "ds_chat_encode: NULL argument");
  char *text = NULL;
  size_t len = 0;
  uint8_t *train = NULL;
  DS_TRY(ds_chat_template_render(t, msgs, n, opt, &text, &len, &train));
  tk_buf norm = {0}, norm_train = {0};
  ds_status st = DS_OK;
  const char *src = text;
  const uint8_t *src_train = train;
  if (tok->nfc && !tk_nfc_is_quick(tok->nfc, (const unsigned char *)text, len)) {
    st = normalize_runs(tok, text, len, train, &norm, &norm_train);
    src = (const char *)norm.p;
    src_train = norm_train.p;
    len = norm.len;
  }
  size_t ids0 = ids->len, mask0 = loss_mask->len;
  if (st == DS_OK) st = ds_tokenizer_encode(tok, src ? src : "", len, 0, ids);
  /* Each token's decoded bytes are found in the text in order. White space between them is
   * what an added token with rstrip (after it) or lstrip (before it) consumed without decoding
   * to it; it belongs to that token, as in HF's offsets. */
  size_t at = 0;
  for (size_t i = ids0; i <= ids->len && st == DS_OK; i++) {
    int32_t id = i < ids->len ? ids->ids[i] : -1;
    const char *tb = id >= 0 ? (const char *)tok->decs.p + tok->dec_off[id] : "";
    size_t bl = id >= 0 ? tk_token_byte_len(tok, id) : 0, from = at;
    size_t ws;
    while (at < len && (id < 0 || at + bl > len || memcmp(src + at, tb, bl)) && (ws = white_space_len(src + at, len - at)))
      at += ws;
    if (from < at && i > ids0 && added_strips(tok, ids->ids[i - 1], 0))
      for (size_t k = from; k < at; k++) loss_mask->ids[loss_mask->len - 1] |= src_train[k];
    else if (from < at && id >= 0)
      bl += at - from, at = from; /* the skipped white space starts this token's span */
    if (id < 0) {
      if (at < len)
        st = DS_FAIL(DS_ERR_INTERNAL, "%s: the tokens of the rendered conversation end at byte %zu of %zu",
                     ds_chat_template_label(t), at, len);
      break;
    }
    if (at + bl > len || memcmp(src + at + bl - tk_token_byte_len(tok, id), tb, tk_token_byte_len(tok, id))) {
      st = DS_FAIL(DS_ERR_INTERNAL, "%s: token %zu (id %d) does not match the rendered text at byte %zu: the loss "
                   "mask cannot be aligned", ds_chat_template_label(t), i - ids0, (int)id, at);
      break;
    }
    int trained = 0;
    for (size_t k = at; k < at + bl; k++) trained |= src_train[k];
    at += bl;
    st = ds_ids_push(loss_mask, trained);
  }
  if (st != DS_OK) {
    ids->len = ids0;
    loss_mask->len = mask0;
  }
  tk_buf_free(&norm);
  tk_buf_free(&norm_train);
  free(text);
  free(train);
  return st;
}

