/* gguf-py's SpecialVocab as the converter runs it on the target's directory (load_merges, no
 * n_vocab): special token ids, add_bos / add_eos / add_sep, the chat template and the
 * normalizer's flags, read from tokenizer.json (as the file has it), tokenizer_config.json,
 * chat_template.jinja / .json and config.json, and written in its order (hf_vocab_gguf.c).
 *
 * Its reading, step by step: a tokenizer_config.json without bos_token / eos_token takes
 * cls_token / sep_token for them; the post-processor (each of a Sequence's) sets the flags:
 * ByteLevel add_bos / add_eos false unless set, RobertaProcessing all three true (and fills
 * cls / sep), TemplateProcessing from its single template's first and last special tokens
 * (bos when the first is the bos or cls token, eos when the last is the eos token; a last token
 * that is not the eos token becomes the eos token and the old one eot, or eom) and its pair
 * template's separators (sep); then, only when tokenizer_config.json holds something, its chat
 * template, its add_<type>_token flags (the post-processor's win) and each <type>_token, whose id
 * is the first of tokenizer.json's added tokens with that content; then config.json's
 * <type>_token_id (or text_config's) for the types still without an id. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_util.h"
#include "dspark/fileio.h"
#include "dspark/gguf_write.h"
#include "model/hf_vocab_internal.h"

static const cJSON *get(const cJSON *o, const char *k) { return o ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL; }

enum { MAX_TYPES = 9 };

typedef struct {
  const char *types[MAX_TYPES];
  int n_types;
  struct {
    const char *typ;
    int64_t id;
  } ids[MAX_TYPES];
  int n_ids;
  struct {
    const char *typ;
    int value;
  } flags[MAX_TYPES];
  int n_flags;
  cJSON *tc; /* tokenizer_config.json, changed as SpecialVocab changes it; NULL when absent */
  const hfv_dir *h;
} svocab;

/* Python's x == v for a string x: v is that string. */
static int is_str(const cJSON *v, const char *x) { return x && cJSON_IsString(v) && !strcmp(v->valuestring, x); }
static const char *str_of(const cJSON *v) { return cJSON_IsString(v) ? v->valuestring : NULL; }

static void set_flag(svocab *s, const char *typ, int value, int only_if_unset) {
  for (int i = 0; i < s->n_flags; i++)
    if (!strcmp(s->flags[i].typ, typ)) {
      if (!only_if_unset) s->flags[i].value = value;
      return;
    }
  s->flags[s->n_flags].typ = typ;
  s->flags[s->n_flags++].value = value;
}

static int has_type(const svocab *s, const char *typ) {
  for (int i = 0; i < s->n_types; i++)
    if (!strcmp(s->types[i], typ)) return 1;
  return 0;
}

/* tokenizer_config[key] = v (a copy; NULL: None); the new item, which v's holder must take. */
static const cJSON *set_tc(svocab *s, const char *key, const cJSON *v) {
  cJSON *copy = v ? cJSON_Duplicate(v, 1) : cJSON_CreateNull();
  if (!copy) return NULL;
  if (cJSON_GetObjectItemCaseSensitive(s->tc, key)) cJSON_ReplaceItemInObjectCaseSensitive(s->tc, key, copy);
  else cJSON_AddItemToObject(s->tc, key, copy);
  return copy;
}

static ds_status set_id(svocab *s, const char *typ, const cJSON *v) {
  if (!cJSON_IsNumber(v) && !cJSON_IsBool(v)) return DS_OK; /* not an int: skipped */
  double id = cJSON_IsBool(v) ? cJSON_IsTrue(v) : v->valuedouble;
  if (id != floor(id)) return DS_OK; /* floor, not a cast: an infinite id (1e999) goes on to be refused */
  if (id < 0)
    return DS_FAIL(DS_ERR_FORMAT, "%s: special token type %s has id %.0f (the converter refuses negative ids)",
                   s->h->dir, typ, id);
  if (id > 4294967295.0)
    return DS_FAIL(DS_ERR_RANGE, "%s: special token type %s has id %.0f, over 2^32", s->h->dir, typ, id);
  for (int i = 0; i < s->n_ids; i++)
    if (!strcmp(s->ids[i].typ, typ)) return DS_OK;
  s->ids[s->n_ids].typ = typ;
  s->ids[s->n_ids++].id = (int64_t)id;
  return DS_OK;
}

static const char *special_id_of(const cJSON *item) { return str_of(get(get(item, "SpecialToken"), "id")); }
static const char *sequence_id_of(const cJSON *item) { return str_of(get(get(item, "Sequence"), "id")); }

/* A TemplateProcessing post-processor: its single and pair templates. */
static void template_processing(svocab *s, const cJSON *proc, const cJSON **bos, const cJSON **cls, const cJSON **eos,
                                const cJSON **sep) {
  const cJSON *single = get(proc, "single"), *pair = get(proc, "pair");
  int ns = cJSON_IsArray(single) ? cJSON_GetArraySize(single) : 0;
  const char *first = NULL, *last = NULL;
  if (ns > 1) {
    if ((first = special_id_of(cJSON_GetArrayItem(single, 0))) && !first[0]) first = NULL;
    if (first) {
      if (!hfv_truthy(s->tc)) {
        *bos = get(get(cJSON_GetArrayItem(single, 0), "SpecialToken"), "id");
      } else if (!is_str(*bos, first) && !is_str(*cls, first)) {
        const cJSON *v = get(get(cJSON_GetArrayItem(single, 0), "SpecialToken"), "id");
        if (!hfv_truthy(*bos)) *bos = set_tc(s, "bos_token", v);
        if (!hfv_truthy(*cls)) *cls = set_tc(s, "cls_token", v);
      }
      set_flag(s, "bos", is_str(*bos, first) || is_str(*cls, first), 0);
    }
    const cJSON *last_item = cJSON_GetArrayItem(single, ns - 1);
    if ((last = special_id_of(last_item)) && !last[0]) last = NULL;
    if (last) {
      const cJSON *v = get(get(last_item, "SpecialToken"), "id");
      if (!hfv_truthy(s->tc)) {
        *eos = v;
      } else if (!is_str(*eos, last)) {
        if (!has_type(s, "eot")) s->types[s->n_types++] = "eot", set_tc(s, "eot_token", *eos);
        else if (!has_type(s, "eom")) s->types[s->n_types++] = "eom", set_tc(s, "eom_token", *eos);
        *eos = set_tc(s, "eos_token", v);
      }
      set_flag(s, "eos", is_str(*eos, last), 0);
    }
  }
  int np = cJSON_IsArray(pair) ? cJSON_GetArraySize(pair) : 0;
  if (!np) return;
  int start = first && is_str(get(get(cJSON_GetArrayItem(pair, 0), "SpecialToken"), "id"), first) ? 1 : 0;
  int stop = last && is_str(get(get(cJSON_GetArrayItem(pair, np - 1), "SpecialToken"), "id"), last) ? np - 1 : np;
  if (stop - start <= 0) return;
  const char *a = sequence_id_of(cJSON_GetArrayItem(pair, start)), *b = sequence_id_of(cJSON_GetArrayItem(pair, stop - 1));
  if (!a || !b || strcmp(a, "A") || strcmp(b, "B") || stop - start - 2 <= 0) return;
  /* A [sep] [eos] B: the entries between */
  int add_sep = 0;
  const char *entry = special_id_of(cJSON_GetArrayItem(pair, start + 1));
  if (entry && entry[0] && (is_str(*sep, entry) || is_str(*eos, entry)) && !last) add_sep = 1;
  if (stop - start - 2 == 2) {
    entry = special_id_of(cJSON_GetArrayItem(pair, start + 2));
    if (entry && entry[0] && (is_str(*sep, entry) || is_str(*eos, entry))) add_sep = 1;
  }
  set_flag(s, "sep", add_sep, 0);
  if (add_sep && !hfv_truthy(*sep) && hfv_truthy(s->tc)) *sep = set_tc(s, "sep_token", *eos);
}

static void post_processor(svocab *s) {
  const cJSON *bos = get(s->tc, "bos_token"), *cls = get(s->tc, "cls_token"), *eos = get(s->tc, "eos_token"),
              *sep = get(s->tc, "sep_token");
  if (!hfv_truthy(bos) && hfv_truthy(cls) && hfv_truthy(s->tc)) bos = set_tc(s, "bos_token", cls);
  if (!hfv_truthy(eos) && hfv_truthy(sep) && hfv_truthy(s->tc)) eos = set_tc(s, "eos_token", sep);
  const cJSON *pp = s->h->raw_post;
  if (!hfv_truthy(pp)) return;
  const cJSON *procs = get(pp, "processors");
  const cJSON *one[1] = {pp};
  int n = procs ? cJSON_GetArraySize(procs) : 1;
  for (int i = 0; i < n; i++) {
    const cJSON *p = procs ? cJSON_GetArrayItem(procs, i) : one[0];
    const char *type = str_of(get(p, "type"));
    if (!type) continue;
    if (!strcmp(type, "ByteLevel")) {
      set_flag(s, "bos", 0, 1);
      set_flag(s, "eos", 0, 1);
    } else if (!strcmp(type, "RobertaProcessing")) {
      set_flag(s, "bos", 1, 0);
      set_flag(s, "eos", 1, 0);
      set_flag(s, "sep", 1, 0);
      if (!hfv_truthy(cls) && hfv_truthy(s->tc)) {
        const cJSON *c = get(p, "cls");
        cls = set_tc(s, "cls_token", c ? cJSON_GetArrayItem(c, 0) : bos);
      }
      if (!hfv_truthy(sep) && hfv_truthy(s->tc)) {
        const cJSON *c = get(p, "sep");
        sep = set_tc(s, "sep_token", c ? cJSON_GetArrayItem(c, 0) : eos);
      }
    } else if (!strcmp(type, "TemplateProcessing")) {
      template_processing(s, p, &bos, &cls, &eos, &sep);
    }
  }
}

/* ---------------------------------------------------------------- the chat template */

/* A template file's text as Python reads a text file: UTF-8 checked, newlines universal. */
static ds_status read_text(const char *path, char **out) {
  size_t len = 0;
  DS_TRY(ds_read_file(path, out, &len));
  char *t = *out;
  size_t o = 0;
  for (size_t i = 0; i < len; i++) {
    if (t[i] == '\r') {
      t[o++] = '\n';
      if (i + 1 < len && t[i + 1] == '\n') i++;
    } else {
      t[o++] = t[i];
    }
  }
  t[o] = 0;
  if (memchr(t, 0, o)) return DS_FAIL(DS_ERR_FORMAT, "%s: holds a NUL byte", path);
  /* well-formed UTF-8 (Python's decoder refuses anything else) */
  for (const unsigned char *p = (const unsigned char *)t, *e = p + o; p < e;) {
    unsigned c = *p, n = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : 9;
    unsigned cp = n == 0 ? c : n == 1 ? c & 0x1F : n == 2 ? c & 0x0F : c & 0x07;
    if (n == 9 || (size_t)(e - p) <= n) return DS_FAIL(DS_ERR_FORMAT, "%s: not UTF-8", path);
    for (unsigned k = 1; k <= n; k++) {
      if ((p[k] & 0xC0) != 0x80) return DS_FAIL(DS_ERR_FORMAT, "%s: not UTF-8", path);
      cp = cp << 6 | (p[k] & 0x3F);
    }
    static const unsigned min[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
      return DS_FAIL(DS_ERR_FORMAT, "%s: not UTF-8", path);
    p += n + 1;
  }
  return DS_OK;
}

static int by_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* chat_template.jinja (with additional_chat_templates/NAME.jinja: a list of named templates,
 * sorted by name), else chat_template.json's "chat_template"; *out NULL when neither. */
static ds_status template_files(const char *dir, cJSON **out) {
  *out = NULL;
  char *jinja = ds_path_join(dir, "chat_template.jinja"), *json = ds_path_join(dir, "chat_template.json");
  char *extra = ds_path_join(dir, "additional_chat_templates"), *text = NULL;
  int has_jinja = 0, has_json = 0;
  ds_status st = jinja && json && extra ? DS_OK : DS_FAIL(DS_ERR_NOMEM, "%s", dir);
  if (st == DS_OK) st = ds_path_probe(jinja, &has_jinja);
  if (st == DS_OK) st = ds_path_probe(json, &has_json);
  if (st == DS_OK && has_jinja && (st = read_text(jinja, &text)) == DS_OK) {
    *out = cJSON_CreateString(text);
    DIR *d = opendir(extra);
    char **names = NULL;
    size_t n = 0;
    for (struct dirent *e; d && st == DS_OK && (e = readdir(d));) {
      size_t l = strlen(e->d_name);
      if (l <= 6 || strcmp(e->d_name + l - 6, ".jinja")) continue;
      char **p = realloc(names, (n + 1) * sizeof *p);
      if (!p || !(p[n] = strdup(e->d_name))) st = DS_FAIL(DS_ERR_NOMEM, "%s", extra);
      if (p) names = p, n += p[n] != NULL;
    }
    if (d) closedir(d);
    if (n && st == DS_OK) {
      qsort(names, n, sizeof *names, by_str);
      cJSON *list = cJSON_CreateArray(), *def = cJSON_CreateObject();
      cJSON_AddStringToObject(def, "name", "default");
      cJSON_AddItemToObject(def, "template", *out);
      cJSON_AddItemToArray(list, def);
      *out = list;
      for (size_t i = 0; i < n && st == DS_OK; i++) {
        char *path = ds_path_join(extra, names[i]), *t = NULL;
        if (!path) st = DS_FAIL(DS_ERR_NOMEM, "%s", extra);
        if (st == DS_OK) st = read_text(path, &t);
        if (st == DS_OK) {
          cJSON *one = cJSON_CreateObject();
          names[i][strlen(names[i]) - 6] = 0;
          cJSON_AddStringToObject(one, "name", names[i]);
          cJSON_AddStringToObject(one, "template", t);
          cJSON_AddItemToArray(list, one);
        }
        free(t);
        free(path);
      }
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
  } else if (st == DS_OK && has_json) {
    size_t len = 0;
    cJSON *root = NULL;
    if ((st = ds_read_file(json, &text, &len)) == DS_OK && (root = ds_json_parse(text, len, json, &st))) {
      cJSON *t = cJSON_DetachItemFromObjectCaseSensitive(root, "chat_template");
      *out = t;
    }
    cJSON_Delete(root);
  }
  free(text);
  free(jinja);
  free(json);
  free(extra);
  return st;
}

/* gguf-py's add_chat_template: a string, or a list of {name, template}: "default" is the
 * template, each other one tokenizer.chat_template.NAME (its name's characters outside [A-Za-z0-9]
 * as '_'), their names in tokenizer.chat_templates (the converter lists them in a Python set's
 * order, which no other program can reproduce; here in the list's order). Empty strings are not
 * written. */
static ds_status put_template(ds_gguf_writer *w, const cJSON *t, const char *where) {
  if (cJSON_IsString(t)) {
    if (!t->valuestring[0]) return DS_OK;
    return ds_gguf_set_str(w, "tokenizer.chat_template", t->valuestring, strlen(t->valuestring));
  }
  const char *def = NULL;
  char **names = NULL;
  size_t n = 0;
  ds_status st = DS_OK;
  for (const cJSON *c = t->child; c && st == DS_OK; c = c->next) {
    const cJSON *name = get(c, "name"), *tmpl = get(c, "template");
    if (!tmpl || cJSON_IsNull(tmpl)) continue;
    if (!cJSON_IsString(tmpl) || (name && !cJSON_IsString(name))) {
      st = DS_FAIL(DS_ERR_FORMAT, "%s: a chat template of the list is not a name and a template string", where);
      break;
    }
    char clean[256];
    size_t k = 0;
    for (const char *p = name ? name->valuestring : ""; *p && k + 1 < sizeof clean; p++)
      clean[k++] = ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9')) ? *p : '_';
    clean[k] = 0;
    if (!k) continue;
    if (!strcmp(clean, "default")) {
      def = tmpl->valuestring;
      continue;
    }
    char key[300];
    snprintf(key, sizeof key, "tokenizer.chat_template.%s", clean);
    if (tmpl->valuestring[0]) st = ds_gguf_set_str(w, key, tmpl->valuestring, strlen(tmpl->valuestring));
    int seen = 0;
    for (size_t i = 0; i < n; i++) seen |= !strcmp(names[i], clean);
    if (st == DS_OK && !seen) {
      char **p = realloc(names, (n + 1) * sizeof *p);
      if (!p || !(p[n] = strdup(clean))) st = DS_FAIL(DS_ERR_NOMEM, "chat templates");
      if (p) names = p, n += p[n] != NULL;
    }
  }
  if (st == DS_OK && n) st = ds_gguf_set_str_array(w, "tokenizer.chat_templates", n, (const char *const *)names);
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
  if (st == DS_OK && def && def[0]) st = ds_gguf_set_str(w, "tokenizer.chat_template", def, strlen(def));
  return st;
}

/* ---------------------------------------------------------------- reading and writing */

static void parse_normalizer(const cJSON *n, int *lower, int *strip) {
  const char *type = str_of(get(n, "type"));
  if (!type) return;
  if (!strcmp(type, "Lowercase")) *lower = 1;
  else if (!strcmp(type, "StripAccents")) *strip = 1;
  else if (!strcmp(type, "BertNormalizer")) {
    if (get(n, "lowercase")) *lower = hfv_truthy(get(n, "lowercase"));
    if (get(n, "strip_accents")) *strip = hfv_truthy(get(n, "strip_accents"));
  } else if (!strcmp(type, "Sequence")) {
    for (const cJSON *c = get(n, "normalizers") ? get(n, "normalizers")->child : NULL; c; c = c->next)
      parse_normalizer(c, lower, strip);
  }
}

ds_status hfv_put_special_vocab(ds_gguf_writer *w, const hfv_dir *h) {
  static const char *const key_id[] = {"bos", "tokenizer.ggml.bos_token_id", "eos", "tokenizer.ggml.eos_token_id",
                                       "unk", "tokenizer.ggml.unknown_token_id", "sep",
                                       "tokenizer.ggml.seperator_token_id", "pad", "tokenizer.ggml.padding_token_id",
                                       "mask", "tokenizer.ggml.mask_token_id", "eot", "tokenizer.ggml.eot_token_id",
                                       "eom", "tokenizer.ggml.eom_token_id"};
  static const char *const key_flag[] = {"bos", "tokenizer.ggml.add_bos_token", "eos", "tokenizer.ggml.add_eos_token",
                                         "sep", "tokenizer.ggml.add_sep_token"};
  svocab s = {.types = {"bos", "eos", "unk", "sep", "pad", "cls", "mask"}, .n_types = 7, .h = h};
  cJSON *tmpl = NULL;
  ds_status st = DS_OK;
  if (h->tok_config && !(s.tc = cJSON_Duplicate(h->tok_config, 1))) return DS_FAIL(DS_ERR_NOMEM, "%s", h->dir);
  post_processor(&s);
  int have_template = 0, lower = -1, strip = -1;
  if (hfv_truthy(s.tc)) {
    st = template_files(h->dir, &tmpl);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s.tc, "chat_template") ? get(s.tc, "chat_template") : tmpl;
    if (st == DS_OK && t && (cJSON_IsString(t) || cJSON_IsArray(t))) {
      if (t != tmpl) cJSON_Delete(tmpl), tmpl = cJSON_Duplicate(t, 1);
      have_template = tmpl != NULL;
    }
    for (int i = 0; st == DS_OK && i < s.n_types; i++) {
      char key[32];
      snprintf(key, sizeof key, "add_%s_token", s.types[i]);
      const cJSON *add = get(s.tc, key);
      if (cJSON_IsBool(add)) set_flag(&s, s.types[i], cJSON_IsTrue(add), 1);
      snprintf(key, sizeof key, "%s_token", s.types[i]);
      const cJSON *entry = get(s.tc, key);
      const char *content = cJSON_IsString(entry) ? entry->valuestring : str_of(get(entry, "content"));
      if (!content) continue;
      for (const cJSON *a = h->raw_added ? h->raw_added->child : NULL; a; a = a->next)
        if (is_str(get(a, "content"), content)) {
          st = set_id(&s, s.types[i], get(a, "id"));
          break;
        }
    }
  }
  for (int i = 0; st == DS_OK && i < s.n_types; i++) {
    char key[32];
    snprintf(key, sizeof key, "%s_token_id", s.types[i]);
    const cJSON *v = get(h->config, key);
    if ((!v || cJSON_IsNull(v)) && get(h->config, "text_config")) v = get(get(h->config, "text_config"), key);
    st = set_id(&s, s.types[i], v);
  }
  if (h->raw_normalizer && hfv_truthy(h->raw_normalizer)) parse_normalizer(h->raw_normalizer, &lower, &strip);
  /* written in SpecialVocab's order; types without a GGUF key (cls, the add_ flags of others) are skipped */
  for (int i = 0; st == DS_OK && i < s.n_ids; i++)
    for (size_t k = 0; k < sizeof key_id / sizeof key_id[0]; k += 2)
      if (!strcmp(key_id[k], s.ids[i].typ)) st = ds_gguf_set_u32(w, key_id[k + 1], (uint32_t)s.ids[i].id);
  for (int i = 0; st == DS_OK && i < s.n_flags; i++)
    for (size_t k = 0; k < sizeof key_flag / sizeof key_flag[0]; k += 2)
      if (!strcmp(key_flag[k], s.flags[i].typ)) st = ds_gguf_set_bool(w, key_flag[k + 1], s.flags[i].value);
  if (st == DS_OK && have_template) st = put_template(w, tmpl, h->tok_config_path);
  if (st == DS_OK && lower >= 0) st = ds_gguf_set_bool(w, "tokenizer.ggml.normalizer.lowercase", lower);
  if (st == DS_OK && strip >= 0) st = ds_gguf_set_bool(w, "tokenizer.ggml.normalizer.strip_accents", strip);
  cJSON_Delete(tmpl);
  cJSON_Delete(s.tc);
  return st;
}
