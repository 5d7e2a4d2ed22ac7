/* Built-ins of the Jinja subset: the filters, tests, global functions and string / dict
 * methods that chat templates use. Each behaves as its Jinja2 / Python counterpart for the
 * values chat templates handle; upper/lower/title/capitalize change ASCII letters only. A
 * name that is not here is refused with DS_ERR_UNSUPPORTED naming it and the template line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text/jinja_internal.h"

/* ------------------------------------------------------------------ UTF-8 helpers */

static size_t cp_len(const char *s, size_t i, size_t n) {
  size_t k = 1;
  while (i + k < n && ((unsigned char)s[i + k] & 0xC0) == 0x80) k++;
  return k;
}

static size_t cp_start_before(const char *s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
  return i;
}

static uint32_t cp_value(const char *s, size_t i, size_t len) {
  const unsigned char *p = (const unsigned char *)s + i;
  if (len == 1) return p[0];
  uint32_t cp = p[0] & (0x7F >> len);
  for (size_t k = 1; k < len; k++) cp = cp << 6 | (p[k] & 0x3F);
  return cp;
}

/* Python's str.isspace(). */
static int is_py_space(uint32_t cp) {
  return (cp >= 9 && cp <= 13) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* Is the code point at s[i..i+len) one of chars (NULL: white space)? */
static int in_strip_set(const char *s, size_t i, size_t len, const jv *chars) {
  if (!chars) return is_py_space(cp_value(s, i, len));
  for (size_t k = 0; k < chars->u.s.n;) {
    size_t cl = cp_len(chars->u.s.p, k, chars->u.s.n);
    if (cl == len && !memcmp(chars->u.s.p + k, s + i, len)) return 1;
    k += cl;
  }
  return 0;
}

jv jinja_strip(const jv *s, const jv *chars, int which) {
  size_t b = 0, e = s->u.s.n;
  if (which & 1)
    while (b < e && in_strip_set(s->u.s.p, b, cp_len(s->u.s.p, b, e), chars)) b += cp_len(s->u.s.p, b, e);
  if (which & 2)
    while (e > b) {
      size_t st = cp_start_before(s->u.s.p, e);
      if (!in_strip_set(s->u.s.p, st, e - st, chars)) break;
      e = st;
    }
  return jv_str(s->u.s.p + b, e - b);
}

ds_status jinja_map_ascii(jctx *c, const jnode *at, const jv *s, int mode, jv *out) {
  char *p = jarena_strdup(jctx_arena(c), s->u.s.p, s->u.s.n);
  if (!p) return jctx_nomem(c, at);
  int word_start = 1;
  for (size_t i = 0; i < s->u.s.n; i++) {
    char ch = p[i];
    int alpha = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z');
    int up = mode == 0 || ((mode == 2 || mode == 3) && word_start && (mode == 2 || i == 0));
    if (alpha) p[i] = up ? (char)(ch >= 'a' && ch <= 'z' ? ch - 32 : ch) : (char)(ch >= 'A' && ch <= 'Z' ? ch + 32 : ch);
    word_start = mode == 2 ? !alpha : 0;
  }
  *out = jv_str(p, s->u.s.n);
  return DS_OK;
}

ds_status jinja_replace(jctx *c, const jnode *at, const jv *s, const jv *old, const jv *new_, int64_t count, jv *out) {
  size_t hits = 0;
  for (size_t i = 0; i + old->u.s.n <= s->u.s.n && old->u.s.n; i++)
    if (!memcmp(s->u.s.p + i, old->u.s.p, old->u.s.n)) hits++, i += old->u.s.n - 1;
  if (!old->u.s.n) return jctx_fail(c, at, DS_ERR_UNSUPPORTED, "unsupported construct: replace() of an empty string");
  if (count >= 0 && (size_t)count < hits) hits = (size_t)count;
  size_t len = s->u.s.n - hits * old->u.s.n + hits * new_->u.s.n;
  char *p = jarena_alloc(jctx_arena(c), len + 1);
  if (!p) return jctx_nomem(c, at);
  size_t o = 0, done = 0;
  for (size_t i = 0; i < s->u.s.n;) {
    if (done < hits && i + old->u.s.n <= s->u.s.n && !memcmp(s->u.s.p + i, old->u.s.p, old->u.s.n)) {
      memcpy(p + o, new_->u.s.p, new_->u.s.n);
      o += new_->u.s.n;
      i += old->u.s.n;
      done++;
    } else {
      p[o++] = s->u.s.p[i++];
    }
  }
  *out = jv_str(p, o);
  return DS_OK;
}

static ds_status split(jctx *c, const jnode *at, const jv *s, const jv *sep, int64_t maxsplit, jv *out) {
  jarena *a = jctx_arena(c);
  jlist *l = jlist_new(a);
  if (!l) return jctx_nomem(c, at);
  const char *p = s->u.s.p;
  size_t n = s->u.s.n;
  if (!sep) { /* runs of white space separate; none at the ends */
    size_t i = 0;
    while (i < n) {
      while (i < n && is_py_space(cp_value(p, i, cp_len(p, i, n)))) i += cp_len(p, i, n);
      if (i >= n) break;
      size_t b = i;
      if (maxsplit >= 0 && (int64_t)l->n >= maxsplit) {
        size_t e = n;
        while (e > b && is_py_space(cp_value(p, cp_start_before(p, e), e - cp_start_before(p, e)))) e = cp_start_before(p, e);
        if (jlist_push(a, l, jv_str(p + b, e - b))) return jctx_nomem(c, at);
        break;
      }
      while (i < n && !is_py_space(cp_value(p, i, cp_len(p, i, n)))) i += cp_len(p, i, n);
      if (jlist_push(a, l, jv_str(p + b, i - b))) return jctx_nomem(c, at);
    }
  } else {
    if (!sep->u.s.n) return jctx_fail(c, at, DS_ERR_ARG, "split(): empty separator");
    size_t b = 0;
    for (size_t i = 0; i + sep->u.s.n <= n;) {
      if ((maxsplit < 0 || (int64_t)l->n < maxsplit) && !memcmp(p + i, sep->u.s.p, sep->u.s.n)) {
        if (jlist_push(a, l, jv_str(p + b, i - b))) return jctx_nomem(c, at);
        i += sep->u.s.n;
        b = i;
      } else {
        i++;
      }
    }
    if (jlist_push(a, l, jv_str(p + b, n - b))) return jctx_nomem(c, at);
  }
  *out = jv_list(l);
  return DS_OK;
}

/* ------------------------------------------------------------------ argument helpers */

typedef struct {
  jctx *c;
  const jnode *at;
  const char *fname;
  const jv *args;
  size_t n;
  const char **kw;
  const jv *kwv;
  size_t n_kw;
} argv_t;

/* Argument i (or keyword name); NULL when not given. */
static const jv *arg(const argv_t *A, size_t i, const char *name) {
  if (i < A->n) return &A->args[i];
  for (size_t k = 0; name && k < A->n_kw; k++)
    if (!strcmp(A->kw[k], name)) return &A->kwv[k];
  return NULL;
}

static ds_status need_kind(const argv_t *A, const jv *v, jv_kind kind, const char *what) {
  static const char *names[] = {"undefined", "none", "a boolean", "an integer", "a float", "a string", "a list", "a dict", "a function"};
  if (v && v->kind == kind) return DS_OK;
  if (v && v->kind == JV_UNDEF)
    return jctx_fail(A->c, A->at, DS_ERR_ARG, "%s: %s is undefined ('%s')", A->fname, what, v->name ? v->name : "?");
  return jctx_fail(A->c, A->at, DS_ERR_ARG, "%s: %s must be %s, not '%s'", A->fname, what, names[kind],
                   v ? jv_type_name(v) : "missing");
}

static ds_status check_arity(const argv_t *A, size_t max_pos, const char *const *kw_ok) {
  if (A->n > max_pos) return jctx_fail(A->c, A->at, DS_ERR_ARG, "%s: too many arguments (%zu)", A->fname, A->n);
  for (size_t k = 0; k < A->n_kw; k++) {
    int ok = 0;
    for (const char *const *o = kw_ok; o && *o; o++) ok |= !strcmp(*o, A->kw[k]);
    if (!ok) return jctx_fail(A->c, A->at, DS_ERR_UNSUPPORTED, "%s: unsupported keyword argument '%s'", A->fname, A->kw[k]);
  }
  return DS_OK;
}

static ds_status opt_int(const argv_t *A, size_t i, const char *name, int64_t def, int64_t *out) {
  const jv *v = arg(A, i, name);
  *out = def;
  if (!v || v->kind == JV_NONE) return DS_OK;
  DS_TRY(need_kind(A, v, JV_INT, name ? name : "argument"));
  *out = v->u.i;
  return DS_OK;
}

/* ------------------------------------------------------------------ methods and globals */

static const struct {
  const char *name;
  int id;
  int on_str; /* 1: a string method, 0: a dict method, -1: a global function */
} k_funcs[] = {
    {"raise_exception", JF_RAISE_EXCEPTION, -1}, {"namespace", JF_NAMESPACE, -1}, {"strftime_now", JF_STRFTIME_NOW, -1},
    {"range", JF_RANGE, -1}, {"dict", JF_DICT, -1},
    {"startswith", JF_STARTSWITH, 1}, {"endswith", JF_ENDSWITH, 1}, {"split", JF_SPLIT, 1}, {"strip", JF_STRIP, 1},
    {"lstrip", JF_LSTRIP, 1}, {"rstrip", JF_RSTRIP, 1}, {"replace", JF_REPLACE, 1}, {"upper", JF_UPPER, 1},
    {"lower", JF_LOWER, 1}, {"title", JF_TITLE, 1}, {"capitalize", JF_CAPITALIZE, 1}, {"find", JF_FIND, 1},
    {"count", JF_COUNT, 1},
    {"items", JF_ITEMS, 0}, {"keys", JF_KEYS, 0}, {"values", JF_VALUES, 0}, {"get", JF_GET, 0},
};

static const char *func_name(int id) {
  for (size_t i = 0; i < sizeof k_funcs / sizeof *k_funcs; i++)
    if (k_funcs[i].id == id) return k_funcs[i].name;
  return "?";
}

jv jinja_global(const char *name, size_t n) {
  for (size_t i = 0; i < sizeof k_funcs / sizeof *k_funcs; i++)
    if (k_funcs[i].on_str < 0 && strlen(k_funcs[i].name) == n && !memcmp(k_funcs[i].name, name, n)) {
      jv v = {JV_FUNC, {0}, NULL};
      v.u.fn.id = k_funcs[i].id;
      return v;
    }
  return jv_undef(NULL);
}

ds_status jinja_getattr(jctx *c, const jnode *at, const jv *obj, const char *name, size_t n, jv *out) {
  *out = jv_undef(NULL);
  int want = obj->kind == JV_STR ? 1 : obj->kind == JV_DICT && !obj->u.dict->is_namespace ? 0 : -2;
  for (size_t i = 0; i < sizeof k_funcs / sizeof *k_funcs; i++)
    if (k_funcs[i].on_str == want && strlen(k_funcs[i].name) == n && !memcmp(k_funcs[i].name, name, n)) {
      jv *self = jarena_alloc(jctx_arena(c), sizeof *self);
      if (!self) return jctx_nomem(c, at);
      *self = *obj;
      out->kind = JV_FUNC;
      out->u.fn.id = k_funcs[i].id;
      out->u.fn.self = self;
      return DS_OK;
    }
  if (obj->kind == JV_DICT) {
    const jv *v = jdict_get(obj->u.dict, name, n);
    if (v) *out = *v;
  }
  return DS_OK;
}

static ds_status dict_view(jctx *c, const jnode *at, const jdict *d, int id, jv *out) {
  jarena *a = jctx_arena(c);
  jlist *l = jlist_new(a);
  if (!l) return jctx_nomem(c, at);
  for (size_t i = 0; i < d->n; i++) {
    jv key = jv_str(d->keys[i], d->key_lens[i]), item = id == JF_VALUES ? d->vals[i] : key;
    if (id == JF_ITEMS) {
      jlist *pair = jlist_new(a);
      if (!pair || jlist_push(a, pair, key) || jlist_push(a, pair, d->vals[i])) return jctx_nomem(c, at);
      item = jv_list(pair);
    }
    if (jlist_push(a, l, item)) return jctx_nomem(c, at);
  }
  *out = jv_list(l);
  return DS_OK;
}

static ds_status call_string_method(const argv_t *A, int id, const jv *s, jv *out) {
  jctx *c = A->c;
  static const char *const none[] = {NULL};
  const jv *a0 = arg(A, 0, NULL), *a1 = arg(A, 1, NULL);
  switch (id) {
  case JF_STARTSWITH:
  case JF_ENDSWITH:
    DS_TRY(check_arity(A, 1, none));
    DS_TRY(need_kind(A, a0, JV_STR, "the prefix"));
    *out = jv_bool(a0->u.s.n <= s->u.s.n &&
                   !memcmp(s->u.s.p + (id == JF_STARTSWITH ? 0 : s->u.s.n - a0->u.s.n), a0->u.s.p, a0->u.s.n));
    return DS_OK;
  case JF_SPLIT: {
    static const char *const kw[] = {"sep", "maxsplit", NULL};
    DS_TRY(check_arity(A, 2, kw));
    const jv *sep = arg(A, 0, "sep");
    if (sep && sep->kind == JV_NONE) sep = NULL;
    if (sep) DS_TRY(need_kind(A, sep, JV_STR, "the separator"));
    int64_t maxsplit;
    DS_TRY(opt_int(A, 1, "maxsplit", -1, &maxsplit));
    return split(c, A->at, s, sep, maxsplit, out);
  }
  case JF_STRIP:
  case JF_LSTRIP:
  case JF_RSTRIP:
    DS_TRY(check_arity(A, 1, none));
    if (a0 && a0->kind == JV_NONE) a0 = NULL;
    if (a0) DS_TRY(need_kind(A, a0, JV_STR, "the characters"));
    *out = jinja_strip(s, a0, id == JF_STRIP ? 3 : id == JF_LSTRIP ? 1 : 2);
    return DS_OK;
  case JF_REPLACE: {
    DS_TRY(check_arity(A, 3, none));
    DS_TRY(need_kind(A, a0, JV_STR, "the old text"));
    DS_TRY(need_kind(A, a1, JV_STR, "the new text"));
    int64_t count;
    DS_TRY(opt_int(A, 2, NULL, -1, &count));
    return jinja_replace(c, A->at, s, a0, a1, count, out);
  }
  case JF_UPPER:
  case JF_LOWER:
  case JF_TITLE:
  case JF_CAPITALIZE:
    DS_TRY(check_arity(A, 0, none));
    if (id == JF_CAPITALIZE) {
      DS_TRY(jinja_map_ascii(c, A->at, s, 1, out)); /* all lower, then the first letter up */
      if (out->u.s.n && out->u.s.p[0] >= 'a' && out->u.s.p[0] <= 'z') ((char *)out->u.s.p)[0] -= 32;
      return DS_OK;
    }
    return jinja_map_ascii(c, A->at, s, id == JF_UPPER ? 0 : id == JF_LOWER ? 1 : 2, out);
  case JF_FIND:
  case JF_COUNT: {
    DS_TRY(check_arity(A, 1, none));
    DS_TRY(need_kind(A, a0, JV_STR, "the text"));
    int64_t found = -1, count = 0, cps = 0;
    for (size_t i = 0; i + a0->u.s.n <= s->u.s.n; i++) {
      if (!memcmp(s->u.s.p + i, a0->u.s.p, a0->u.s.n)) {
        if (found < 0) found = cps;
        count++;
        if (a0->u.s.n) {
          for (size_t k = 0; k < a0->u.s.n; k++) cps += ((unsigned char)s->u.s.p[i + k] & 0xC0) != 0x80;
          i += a0->u.s.n - 1;
          continue;
        }
      }
      cps += ((unsigned char)s->u.s.p[i] & 0xC0) != 0x80;
    }
    *out = jv_int(id == JF_FIND ? found : count);
    return DS_OK;
  }
  default: return jctx_fail(c, A->at, DS_ERR_INTERNAL, "string method %d", id);
  }
}

ds_status jinja_call(jctx *c, const jnode *at, const jv *fn, const jv *args, size_t n, const char **kw, const jv *kwv,
                     size_t n_kw, jv *out) {
  argv_t A = {c, at, func_name(fn->u.fn.id), args, n, kw, kwv, n_kw};
  static const char *const none[] = {NULL};
  jarena *a = jctx_arena(c);
  int id = fn->u.fn.id;
  if (fn->u.fn.self && fn->u.fn.self->kind == JV_STR) return call_string_method(&A, id, fn->u.fn.self, out);
  switch (id) {
  case JF_RAISE_EXCEPTION: {
    jv msg = jv_str("", 0);
    if (n) DS_TRY(jv_to_text(c, at, &args[0], &msg));
    return jctx_fail(c, at, DS_ERR_ARG, "the template raised an exception: %.*s", (int)(msg.u.s.n > 400 ? 400 : msg.u.s.n),
                     msg.u.s.p);
  }
  case JF_NAMESPACE:
  case JF_DICT: {
    if (n > 1 || (n == 1 && args[0].kind != JV_DICT))
      return jctx_fail(c, at, DS_ERR_UNSUPPORTED, "%s(): only keyword arguments or one dict are supported", A.fname);
    jdict *d = jdict_new(a);
    if (!d) return jctx_nomem(c, at);
    d->is_namespace = id == JF_NAMESPACE;
    for (size_t i = 0; n == 1 && i < args[0].u.dict->n; i++)
      if (jdict_set(a, d, args[0].u.dict->keys[i], args[0].u.dict->key_lens[i], args[0].u.dict->vals[i])) return jctx_nomem(c, at);
    for (size_t i = 0; i < n_kw; i++)
      if (jdict_set(a, d, kw[i], strlen(kw[i]), kwv[i])) return jctx_nomem(c, at);
    out->kind = JV_DICT;
    out->u.dict = d;
    return DS_OK;
  }
  case JF_STRFTIME_NOW: {
    DS_TRY(check_arity(&A, 1, none));
    DS_TRY(need_kind(&A, arg(&A, 0, NULL), JV_STR, "the format"));
    char fmt[256], buf[512];
    const jv *f = &args[0];
    if (f->u.s.n >= sizeof fmt || memchr(f->u.s.p, 0, f->u.s.n))
      return jctx_fail(c, at, DS_ERR_ARG, "strftime_now: format too long or holding a NUL");
    memcpy(fmt, f->u.s.p, f->u.s.n);
    fmt[f->u.s.n] = 0;
    time_t now = time(NULL);
    struct tm tmv;
    size_t len = localtime_r(&now, &tmv) ? strftime(buf, sizeof buf, fmt, &tmv) : 0;
    char *p = jarena_strdup(a, buf, len);
    if (!p) return jctx_nomem(c, at);
    *out = jv_str(p, len);
    return DS_OK;
  }
  case JF_RANGE: {
    DS_TRY(check_arity(&A, 3, none));
    int64_t lo = 0, hi, step = 1;
    if (n == 0) return jctx_fail(c, at, DS_ERR_ARG, "range() expects at least one argument");
    for (size_t i = 0; i < n; i++) DS_TRY(need_kind(&A, &args[i], JV_INT, "an argument"));
    if (n == 1) hi = args[0].u.i;
    else lo = args[0].u.i, hi = args[1].u.i;
    if (n == 3) step = args[2].u.i;
    if (step == 0) return jctx_fail(c, at, DS_ERR_ARG, "range() step must not be zero");
    jlist *l = jlist_new(a);
    if (!l) return jctx_nomem(c, at);
    for (int64_t v = lo; step > 0 ? v < hi : v > hi; v += step) {
      if (l->n >= 1000000) return jctx_fail(c, at, DS_ERR_RANGE, "range() of more than 1000000 items");
      if (jlist_push(a, l, jv_int(v))) return jctx_nomem(c, at);
    }
    *out = jv_list(l);
    return DS_OK;
  }
  case JF_ITEMS:
  case JF_KEYS:
  case JF_VALUES:
    DS_TRY(check_arity(&A, 0, none));
    return dict_view(c, at, fn->u.fn.self->u.dict, id, out);
  case JF_GET: {
    DS_TRY(check_arity(&A, 2, none));
    const jv *k = arg(&A, 0, NULL), *def = arg(&A, 1, NULL);
    const jv *v = k && k->kind == JV_STR ? jdict_get(fn->u.fn.self->u.dict, k->u.s.p, k->u.s.n) : NULL;
    *out = v ? *v : def ? *def : jv_none();
    return DS_OK;
  }
  default: return jctx_fail(c, at, DS_ERR_INTERNAL, "function %d", id);
  }
}
