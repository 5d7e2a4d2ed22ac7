/* Values of the Jinja interpreter: the render arena, lists and dicts, equality and
 * truthiness with Python's rules, and the two ways a value becomes text: as Jinja prints it
 * (Python's str / repr) and as transformers' tojson filter writes it (json.dumps with
 * ensure_ascii=False). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_internal.h"

/* ------------------------------------------------------------------ arena */

struct jarena_block {
  jarena_block *next;
  size_t used, cap;
  max_align_t data[];
};

static const size_t k_arena_limit = (size_t)JARENA_LIMIT_MIB << 20; /* more: a runaway template */

void *jarena_alloc(jarena *a, size_t n) {
  n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
  if (n == 0) n = sizeof(max_align_t);
  if (n > k_arena_limit || a->used_total + n > k_arena_limit) {
    a->over_limit = 1;
    return NULL;
  }
  jarena_block *b = a->head;
  if (!b || b->cap - b->used < n) {
    size_t cap = n > 65536 ? n : 65536;
    b = malloc(sizeof *b + cap);
    if (!b) return NULL;
    b->next = a->head;
    b->used = 0;
    b->cap = cap;
    a->head = b;
  }
  void *p = (char *)b->data + b->used;
  b->used += n;
  a->used_total += n;
  memset(p, 0, n);
  return p;
}

char *jarena_strdup(jarena *a, const char *s, size_t n) {
  char *p = jarena_alloc(a, n + 1);
  if (p && n) memcpy(p, s, n);
  return p;
}

void jarena_free(jarena *a) {
  while (a->head) {
    jarena_block *next = a->head->next;
    free(a->head);
    a->head = next;
  }
  a->used_total = 0;
}

/* ------------------------------------------------------------------ render errors */
jarena *jctx_arena(jctx *c) { return c->a; }

ds_status jctx_fail(jctx *c, const jnode *at, ds_status st, const char *fmt, ...) {
  char msg[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (c->st == DS_OK) c->st = DS_FAIL(st, "%s:%d: %s", c->label, at ? at->line : 0, msg);
  return c->st;
}

/* ------------------------------------------------------------------ values */

jv jv_undef(const char *name) {
  jv v = {JV_UNDEF, {0}, name};
  return v;
}
jv jv_none(void) {
  jv v = {JV_NONE, {0}, NULL};
  return v;
}
jv jv_bool(int b) {
  jv v = {JV_BOOL, {.b = !!b}, NULL};
  return v;
}
jv jv_int(int64_t i) {
  jv v = {JV_INT, {.i = i}, NULL};
  return v;
}
jv jv_list(jlist *l) {
  jv v = {JV_LIST, {.list = l}, NULL};
  return v;
}
ds_status jctx_nomem(jctx *c, const jnode *at) {
  if (jctx_arena(c)->over_limit) return jctx_fail(c, at, DS_ERR_RANGE, "the render needs more than %d MiB", JARENA_LIMIT_MIB);
  return jctx_fail(c, at, DS_ERR_NOMEM, "out of memory");
}
jv jv_str(const char *p, size_t n) {
  jv v = {JV_STR, {0}, NULL};
  v.u.s.p = p;
  v.u.s.n = n;
  return v;
}

int jv_truthy(const jv *v) {
  switch (v->kind) {
  case JV_BOOL: return v->u.b;
  case JV_INT: return v->u.i != 0;
  case JV_FLOAT: return v->u.f != 0;
  case JV_STR: return v->u.s.n > 0;
  case JV_LIST: return v->u.list->n > 0;
  case JV_DICT: return v->u.dict->n > 0;
  case JV_FUNC: return 1;
  default: return 0;
  }
}

const char *jv_type_name(const jv *v) {
  static const char *names[] = {"Undefined", "NoneType", "bool", "int", "float", "str", "list", "dict", "function"};
  if (v->kind == JV_DICT && v->u.dict->is_namespace) return "Namespace";
  return names[v->kind];
}

int jv_equal(const jv *a, const jv *b) {
  int an = a->kind == JV_INT || a->kind == JV_FLOAT || a->kind == JV_BOOL;
  int bn = b->kind == JV_INT || b->kind == JV_FLOAT || b->kind == JV_BOOL;
  if (an && bn) {
    if (a->kind != JV_FLOAT && b->kind != JV_FLOAT)
      return (a->kind == JV_INT ? a->u.i : a->u.b) == (b->kind == JV_INT ? b->u.i : b->u.b);
    double x = a->kind == JV_FLOAT ? a->u.f : a->kind == JV_INT ? (double)a->u.i : a->u.b;
    double y = b->kind == JV_FLOAT ? b->u.f : b->kind == JV_INT ? (double)b->u.i : b->u.b;
    return x == y;
  }
  if (a->kind != b->kind) return 0;
  switch (a->kind) {
  case JV_UNDEF:
  case JV_NONE: return 1;
  case JV_STR: return a->u.s.n == b->u.s.n && !memcmp(a->u.s.p, b->u.s.p, a->u.s.n);
  case JV_LIST:
    if (a->u.list->n != b->u.list->n) return 0;
    for (size_t i = 0; i < a->u.list->n; i++)
      if (!jv_equal(&a->u.list->items[i], &b->u.list->items[i])) return 0;
    return 1;
  case JV_DICT:
    if (a->u.dict == b->u.dict) return 1;
    if (a->u.dict->n != b->u.dict->n) return 0;
    for (size_t i = 0; i < a->u.dict->n; i++) {
      const jv *o = jdict_get(b->u.dict, a->u.dict->keys[i], a->u.dict->key_lens[i]);
      if (!o || !jv_equal(&a->u.dict->vals[i], o)) return 0;
    }
    return 1;
  case JV_FUNC: return a->u.fn.id == b->u.fn.id && a->u.fn.self == b->u.fn.self;
  default: return 0;
  }
}

jlist *jlist_new(jarena *a) { return jarena_alloc(a, sizeof(jlist)); }

int jlist_push(jarena *a, jlist *l, jv v) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 8;
    jv *items = jarena_alloc(a, cap * sizeof *items);
    if (!items) return -1;
    if (l->n) memcpy(items, l->items, l->n * sizeof *items);
    l->items = items;
    l->cap = cap;
  }
  l->items[l->n++] = v;
  return 0;
}

jdict *jdict_new(jarena *a) { return jarena_alloc(a, sizeof(jdict)); }

const jv *jdict_get(const jdict *d, const char *key, size_t klen) {
  for (size_t i = 0; i < d->n; i++)
    if (d->key_lens[i] == klen && !memcmp(d->keys[i], key, klen)) return &d->vals[i];
  return NULL;
}

int jdict_set(jarena *a, jdict *d, const char *key, size_t klen, jv v) {
  const jv *old = jdict_get(d, key, klen);
  if (old) {
    d->vals[old - d->vals] = v;
    return 0;
  }
  if (d->n == d->cap) {
    size_t cap = d->cap ? d->cap * 2 : 8;
    const char **keys = jarena_alloc(a, cap * sizeof *keys);
    size_t *lens = jarena_alloc(a, cap * sizeof *lens);
    jv *vals = jarena_alloc(a, cap * sizeof *vals);
    if (!keys || !lens || !vals) return -1;
    if (d->n) {
      memcpy(keys, d->keys, d->n * sizeof *keys);
      memcpy(lens, d->key_lens, d->n * sizeof *lens);
      memcpy(vals, d->vals, d->n * sizeof *vals);
    }
    d->keys = keys;
    d->key_lens = lens;
    d->vals = vals;
    d->cap = cap;
  }
  if (!(d->keys[d->n] = jarena_strdup(a, key, klen))) return -1;
  d->key_lens[d->n] = klen;
  d->vals[d->n++] = v;
  return 0;
}

/* ------------------------------------------------------------------ text */

typedef struct {
  jctx *c;
  char *p;
  size_t n, cap;
  int failed;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
  if (b->failed) return;
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 64;
    while (cap < b->n + n + 1) cap *= 2;
    char *p = jarena_alloc(jctx_arena(b->c), cap);
    if (!p) {
      b->failed = 1;
      return;
    }
    if (b->n) memcpy(p, b->p, b->n);
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
}
static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* Python's repr of a float: the shortest text that reads back the same, with ".0" when it
 * looks like an integer (close to Python's; exponent forms may differ in rare cases). */
static void put_float(sbuf *b, double f) {
  char t[40];
  if (isnan(f)) snprintf(t, sizeof t, "nan");
  else if (isinf(f)) snprintf(t, sizeof t, f < 0 ? "-inf" : "inf");
  else {
    for (int prec = 1; prec <= 17; prec++) {
      snprintf(t, sizeof t, "%.*g", prec, f);
      if (strtod(t, NULL) == f) break;
    }
    if (!strpbrk(t, ".en")) strcat(t, ".0");
  }
  sb_str(b, t);
}

static void put_repr_str(sbuf *b, const char *s, size_t n) {
  char q = memchr(s, '\'', n) && !memchr(s, '"', n) ? '"' : '\'';
  sb_put(b, &q, 1);
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    char esc[8];
    if (ch == '\\' || ch == (unsigned char)q) {
      esc[0] = '\\';
      esc[1] = (char)ch;
      sb_put(b, esc, 2);
    } else if (ch == '\n') sb_str(b, "\\n");
    else if (ch == '\r') sb_str(b, "\\r");
    else if (ch == '\t') sb_str(b, "\\t");
    else if (ch < 0x20 || ch == 0x7f) {
      snprintf(esc, sizeof esc, "\\x%02x", ch);
      sb_str(b, esc);
    } else sb_put(b, (const char *)&ch, 1);
  }
  sb_put(b, &q, 1);
}

static void put_text(sbuf *b, const jv *v, int repr, int depth) {
  char t[32];
  if (depth > 100) {
    b->failed = 2;
    return;
  }
  switch (v->kind) {
  case JV_UNDEF: break;
  case JV_NONE: sb_str(b, "None"); break;
  case JV_BOOL: sb_str(b, v->u.b ? "True" : "False"); break;
  case JV_INT:
    snprintf(t, sizeof t, "%lld", (long long)v->u.i);
    sb_str(b, t);
    break;
  case JV_FLOAT: put_float(b, v->u.f); break;
  case JV_STR:
    if (repr) put_repr_str(b, v->u.s.p, v->u.s.n);
    else sb_put(b, v->u.s.p, v->u.s.n);
    break;
  case JV_LIST:
    sb_str(b, "[");
    for (size_t i = 0; i < v->u.list->n; i++) {
      if (i) sb_str(b, ", ");
      put_text(b, &v->u.list->items[i], 1, depth + 1);
    }
    sb_str(b, "]");
    break;
  case JV_DICT:
    sb_str(b, v->u.dict->is_namespace ? "<Namespace {" : "{");
    for (size_t i = 0; i < v->u.dict->n; i++) {
      if (i) sb_str(b, ", ");
      put_repr_str(b, v->u.dict->keys[i], v->u.dict->key_lens[i]);
      sb_str(b, ": ");
      put_text(b, &v->u.dict->vals[i], 1, depth + 1);
    }
    sb_str(b, v->u.dict->is_namespace ? "}>" : "}");
    break;
  case JV_FUNC: sb_str(b, "<built-in function>"); break;
  }
}

ds_status jv_to_text(jctx *c, const jnode *at, const jv *v, jv *out) {
  if (v->kind == JV_STR) {
    *out = *v;
    return DS_OK;
  }
  sbuf b = {c, NULL, 0, 0, 0};
  put_text(&b, v, 0, 0);
  sb_put(&b, "", 0);
  if (b.failed == 2) return jctx_fail(c, at, DS_ERR_RANGE, "value nested too deeply to print");
  if (b.failed && c->a->over_limit) return jctx_fail(c, at, DS_ERR_RANGE, "the render needs more than %d MiB", JARENA_LIMIT_MIB);
  if (b.failed) return jctx_fail(c, at, DS_ERR_NOMEM, "out of memory");
  *out = jv_str(b.p ? b.p : "", b.n);
  return DS_OK;
}

static void put_json_str(sbuf *b, const char *s, size_t n) {
  sb_str(b, "\"");
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    char esc[8];
    if (ch == '"') sb_str(b, "\\\"");
    else if (ch == '\\') sb_str(b, "\\\\");
    else if (ch == '\n') sb_str(b, "\\n");
    else if (ch == '\r') sb_str(b, "\\r");
    else if (ch == '\t') sb_str(b, "\\t");
    else if (ch == '\b') sb_str(b, "\\b");
    else if (ch == '\f') sb_str(b, "\\f");
    else if (ch < 0x20) {
      snprintf(esc, sizeof esc, "\\u%04x", ch);
      sb_str(b, esc);
    } else sb_put(b, (const char *)&ch, 1);
  }
  sb_str(b, "\"");
}

static void newline_indent(sbuf *b, int indent, int level) {
  sb_str(b, "\n");
  for (int i = 0; i < indent * level; i++) sb_str(b, " ");
}

/* json.dumps(v, ensure_ascii=False, indent=None if indent < 0 else indent): ", " and ": "
 * separators, or "," and a newline plus indent spaces per level (indent 0 too, as Python). */
static int put_json(sbuf *b, const jv *v, int indent, int level) {
  char t[32];
  if (level > 100) return -1;
  switch (v->kind) {
  case JV_NONE: sb_str(b, "null"); return 0;
  case JV_BOOL: sb_str(b, v->u.b ? "true" : "false"); return 0;
  case JV_INT:
    snprintf(t, sizeof t, "%lld", (long long)v->u.i);
    sb_str(b, t);
    return 0;
  case JV_FLOAT:
    if (isnan(v->u.f)) sb_str(b, "NaN");
    else if (isinf(v->u.f)) sb_str(b, v->u.f < 0 ? "-Infinity" : "Infinity");
    else put_float(b, v->u.f);
    return 0;
  case JV_STR: put_json_str(b, v->u.s.p, v->u.s.n); return 0;
  case JV_LIST:
  case JV_DICT: {
    int is_list = v->kind == JV_LIST;
    size_t n = is_list ? v->u.list->n : v->u.dict->n;
    sb_str(b, is_list ? "[" : "{");
    for (size_t i = 0; i < n; i++) {
      if (i) sb_str(b, indent >= 0 ? "," : ", ");
      if (indent >= 0) newline_indent(b, indent, level + 1);
      if (!is_list) {
        put_json_str(b, v->u.dict->keys[i], v->u.dict->key_lens[i]);
        sb_str(b, ": ");
      }
      if (put_json(b, is_list ? &v->u.list->items[i] : &v->u.dict->vals[i], indent, level + 1)) return -1;
    }
    if (indent >= 0 && n) newline_indent(b, indent, level);
    sb_str(b, is_list ? "]" : "}");
    return 0;
  }
  default: return -2;
  }
}

ds_status jv_to_json(jctx *c, const jnode *at, const jv *v, int indent, jv *out) {
  sbuf b = {c, NULL, 0, 0, 0};
  int r = put_json(&b, v, indent, 0);
  sb_put(&b, "", 0);
  if (r == -1) return jctx_fail(c, at, DS_ERR_RANGE, "value nested too deeply for tojson");
  if (r == -2) return jctx_fail(c, at, DS_ERR_ARG, "tojson: a value of type '%s' is not JSON serializable", jv_type_name(v));
  if (b.failed && c->a->over_limit) return jctx_fail(c, at, DS_ERR_RANGE, "the render needs more than %d MiB", JARENA_LIMIT_MIB);
  if (b.failed) return jctx_fail(c, at, DS_ERR_NOMEM, "out of memory");
  *out = jv_str(b.p ? b.p : "", b.n);
  return DS_OK;
}
