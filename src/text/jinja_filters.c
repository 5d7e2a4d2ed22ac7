/* Filters ({{ x | name(args) }}) and tests ({% if x is name %}) of the Jinja subset, as
 * Jinja2 defines them and transformers' environment overrides them (tojson is json.dumps
 * with ensure_ascii=False). Unknown names are DS_ERR_UNSUPPORTED naming the filter/test. */
#include <stdlib.h>
#include <string.h>

#include "text/jinja_internal.h"

static size_t cp_count(const jv *s) {
  size_t n = 0;
  for (size_t i = 0; i < s->u.s.n; i++) n += ((unsigned char)s->u.s.p[i] & 0xC0) != 0x80;
  return n;
}

/* The items of a list, the keys of a dict, the characters of a string. */
static ds_status as_list(jctx *c, const jnode *at, const char *fname, const jv *v, jlist **out) {
  jarena *a = jctx_arena(c);
  if (v->kind == JV_LIST) {
    *out = v->u.list;
    return DS_OK;
  }
  if (!(*out = jlist_new(a))) return jctx_nomem(c, at);
  if (v->kind == JV_UNDEF) return DS_OK;
  if (v->kind == JV_DICT) {
    for (size_t i = 0; i < v->u.dict->n; i++)
      if (jlist_push(a, *out, jv_str(v->u.dict->keys[i], v->u.dict->key_lens[i]))) return jctx_nomem(c, at);
    return DS_OK;
  }
  if (v->kind == JV_STR) {
    for (size_t i = 0; i < v->u.s.n;) {
      size_t k = 1;
      while (i + k < v->u.s.n && ((unsigned char)v->u.s.p[i + k] & 0xC0) == 0x80) k++;
      if (jlist_push(a, *out, jv_str(v->u.s.p + i, k))) return jctx_nomem(c, at);
      i += k;
    }
    return DS_OK;
  }
  return jctx_fail(c, at, DS_ERR_ARG, "%s: '%s' object is not iterable", fname, jv_type_name(v));
}

static const jv *named(const char **kw, const jv *kwv, size_t n_kw, const char *name) {
  for (size_t k = 0; k < n_kw; k++)
    if (!strcmp(kw[k], name)) return &kwv[k];
  return NULL;
}

static ds_status attr_of(jctx *c, const jnode *at, const jv *item, const jv *attr, jv *out) {
  if (attr->kind != JV_STR) return jctx_fail(c, at, DS_ERR_ARG, "attribute name must be a string");
  if (item->kind == JV_UNDEF) {
    *out = *item;
    return DS_OK;
  }
  return jinja_getattr(c, at, item, attr->u.s.p, attr->u.s.n, out);
}

/* select / reject / selectattr / rejectattr: keep the items for which the test (or, with
 * none named, truthiness) of the item (or of its attribute) is `keep`. */
static ds_status select_items(jctx *c, const jnode *at, const char *fname, const jv *in, const jv *args, size_t n,
                              int by_attr, int keep, jv *out) {
  jlist *src, *dst = jlist_new(jctx_arena(c));
  if (!dst) return jctx_nomem(c, at);
  if (!jv_truthy(in)) { /* Jinja filters nothing out of a false value (None, empty): an empty result */
    *out = jv_list(dst);
    return DS_OK;
  }
  DS_TRY(as_list(c, at, fname, in, &src));
  if (by_attr && n < 1) return jctx_fail(c, at, DS_ERR_ARG, "%s: expects an attribute name", fname);
  size_t first_test = by_attr ? 1 : 0;
  const jv *test = n > first_test ? &args[first_test] : NULL;
  if (test && test->kind != JV_STR) return jctx_fail(c, at, DS_ERR_ARG, "%s: the test name must be a string", fname);
  char tname[64];
  if (test) {
    size_t tl = test->u.s.n < sizeof tname - 1 ? test->u.s.n : sizeof tname - 1;
    memcpy(tname, test->u.s.p, tl);
    tname[tl] = 0;
  }
  for (size_t i = 0; i < src->n; i++) {
    jv v = src->items[i];
    if (by_attr) DS_TRY(attr_of(c, at, &src->items[i], &args[0], &v));
    int r;
    if (test) DS_TRY(jinja_test(c, at, tname, &v, args + first_test + 1, n - first_test - 1, &r));
    else r = jv_truthy(&v);
    if (r == keep && jlist_push(jctx_arena(c), dst, src->items[i])) return jctx_nomem(c, at);
  }
  *out = jv_list(dst);
  return DS_OK;
}

ds_status jinja_filter(jctx *c, const jnode *at, const char *name, const jv *in, const jv *args, size_t n,
                       const char **kw, const jv *kwv, size_t n_kw, jv *out) {
  jarena *a = jctx_arena(c);
#define IS(s) (!strcmp(name, s))
  int needs_str = IS("trim") || IS("lower") || IS("upper") || IS("title") || IS("capitalize") || IS("replace");
  if (needs_str && in->kind != JV_STR) {
    if (in->kind == JV_UNDEF && !IS("replace")) {
      *out = jv_str("", 0);
      return DS_OK;
    }
    jv s;
    DS_TRY(jv_to_text(c, at, in, &s));
    return jinja_filter(c, at, name, &s, args, n, kw, kwv, n_kw, out);
  }
  if (IS("trim")) {
    if (n > 1 || (n == 1 && args[0].kind != JV_STR && args[0].kind != JV_NONE))
      return jctx_fail(c, at, DS_ERR_ARG, "trim: expects at most one string of characters");
    *out = jinja_strip(in, n && args[0].kind == JV_STR ? &args[0] : NULL, 3);
    return DS_OK;
  }
  if (IS("length") || IS("count")) {
    if (in->kind == JV_STR) *out = jv_int((int64_t)cp_count(in));
    else if (in->kind == JV_LIST) *out = jv_int((int64_t)in->u.list->n);
    else if (in->kind == JV_DICT) *out = jv_int((int64_t)in->u.dict->n);
    else if (in->kind == JV_UNDEF) *out = jv_int(0);
    else return jctx_fail(c, at, DS_ERR_ARG, "length: object of type '%s' has no len()", jv_type_name(in));
    return DS_OK;
  }
  if (IS("tojson")) {
    const jv *indent = n ? &args[0] : named(kw, kwv, n_kw, "indent");
    for (size_t k = 0; k < n_kw; k++)
      if (strcmp(kw[k], "indent") != 0)
        return jctx_fail(c, at, DS_ERR_UNSUPPORTED, "tojson: unsupported keyword argument '%s'", kw[k]);
    if (indent && indent->kind != JV_INT && indent->kind != JV_NONE)
      return jctx_fail(c, at, DS_ERR_UNSUPPORTED, "tojson: indent must be an integer");
    if (in->kind == JV_UNDEF) return jctx_fail(c, at, DS_ERR_ARG, "tojson: '%s' is undefined", in->name ? in->name : "value");
    int ind = indent && indent->kind == JV_INT ? (int)(indent->u.i > 64 ? 64 : indent->u.i < 0 ? 0 : indent->u.i) : -1;
    return jv_to_json(c, at, in, ind, out);
  }
  if (IS("string")) return jv_to_text(c, at, in, out);
  if (IS("safe")) {
    *out = *in;
    return DS_OK;
  }
  if (IS("lower") || IS("upper") || IS("title")) return jinja_map_ascii(c, at, in, IS("upper") ? 0 : IS("lower") ? 1 : 2, out);
  if (IS("capitalize")) {
    DS_TRY(jinja_map_ascii(c, at, in, 1, out));
    if (out->u.s.n && out->u.s.p[0] >= 'a' && out->u.s.p[0] <= 'z') ((char *)out->u.s.p)[0] -= 32;
    return DS_OK;
  }
  if (IS("replace")) {
    if (n < 2 || args[0].kind != JV_STR || args[1].kind != JV_STR)
      return jctx_fail(c, at, DS_ERR_ARG, "replace: expects two strings");
    return jinja_replace(c, at, in, &args[0], &args[1], n > 2 && args[2].kind == JV_INT ? args[2].u.i : -1, out);
  }
  if (IS("default") || IS("d")) {
    const jv *boolean = n > 1 ? &args[1] : named(kw, kwv, n_kw, "boolean");
    int use_default = in->kind == JV_UNDEF || (boolean && jv_truthy(boolean) && !jv_truthy(in));
    *out = use_default ? (n ? args[0] : jv_str("", 0)) : *in;
    return DS_OK;
  }
  if (IS("first") || IS("last")) {
    jlist *l;
    DS_TRY(as_list(c, at, name, in, &l));
    *out = l->n ? l->items[IS("first") ? 0 : l->n - 1] : jv_undef(name);
    return DS_OK;
  }
  if (IS("list")) {
    jlist *l;
    DS_TRY(as_list(c, at, name, in, &l));
    *out = jv_list(l);
    return DS_OK;
  }
  if (IS("reverse")) {
    jlist *l, *r = jlist_new(a);
    if (!r) return jctx_nomem(c, at);
    DS_TRY(as_list(c, at, name, in, &l));
    for (size_t i = l->n; i-- > 0;)
      if (jlist_push(a, r, l->items[i])) return jctx_nomem(c, at);
    if (in->kind != JV_STR) {
      *out = jv_list(r);
      return DS_OK;
    }
    in = &(jv){JV_LIST, {.list = r}, NULL};
    return jinja_filter(c, at, "join", in, NULL, 0, NULL, NULL, 0, out);
  }
  if (IS("join")) {
    jlist *l;
    DS_TRY(as_list(c, at, name, in, &l));
    const jv *sep = n ? &args[0] : named(kw, kwv, n_kw, "d");
    const jv *attr = named(kw, kwv, n_kw, "attribute");
    jv s = jv_str("", 0), t, item;
    if (sep) DS_TRY(jv_to_text(c, at, sep, &t));
    for (size_t i = 0; i < l->n; i++) {
      jv piece;
      item = l->items[i];
      if (attr) DS_TRY(attr_of(c, at, &l->items[i], attr, &item));
      DS_TRY(jv_to_text(c, at, &item, &piece));
      size_t len = s.u.s.n + (i && sep ? t.u.s.n : 0) + piece.u.s.n;
      char *p = jarena_alloc(a, len + 1);
      if (!p) return jctx_nomem(c, at);
      memcpy(p, s.u.s.p, s.u.s.n);
      if (i && sep) memcpy(p + s.u.s.n, t.u.s.p, t.u.s.n);
      memcpy(p + len - piece.u.s.n, piece.u.s.p, piece.u.s.n);
      s = jv_str(p, len);
    }
    *out = s;
    return DS_OK;
  }
  if (IS("items")) {
    if (in->kind == JV_UNDEF) {
      *out = jv_list(jlist_new(a));
      return out->u.list ? DS_OK : jctx_nomem(c, at);
    }
    if (in->kind != JV_DICT) return jctx_fail(c, at, DS_ERR_ARG, "items: expects a dict, not '%s'", jv_type_name(in));
    jv method;
    DS_TRY(jinja_getattr(c, at, in, "items", 5, &method));
    return jinja_call(c, at, &method, NULL, 0, NULL, NULL, 0, out);
  }
  if (IS("select") || IS("reject")) return select_items(c, at, name, in, args, n, 0, IS("select"), out);
  if (IS("selectattr") || IS("rejectattr")) return select_items(c, at, name, in, args, n, 1, IS("selectattr"), out);
  if (IS("map")) {
    const jv *attr = named(kw, kwv, n_kw, "attribute");
    if (!attr || n) return jctx_fail(c, at, DS_ERR_UNSUPPORTED, "map: only map(attribute=...) is supported");
    jlist *l, *r = jlist_new(a);
    if (!r) return jctx_nomem(c, at);
    if (!jv_truthy(in)) { /* as select: nothing from a false value */
      *out = jv_list(r);
      return DS_OK;
    }
    DS_TRY(as_list(c, at, name, in, &l));
    const jv *def = named(kw, kwv, n_kw, "default");
    for (size_t i = 0; i < l->n; i++) {
      jv v;
      DS_TRY(attr_of(c, at, &l->items[i], attr, &v));
      if (v.kind == JV_UNDEF && def) v = *def;
      if (jlist_push(a, r, v)) return jctx_nomem(c, at);
    }
    *out = jv_list(r);
    return DS_OK;
  }
  if (IS("int")) {
    if (in->kind == JV_INT) *out = *in;
    else if (in->kind == JV_FLOAT) *out = jv_int((int64_t)in->u.f);
    else if (in->kind == JV_BOOL) *out = jv_int(in->u.b);
    else if (in->kind == JV_STR) {
      char buf[32];
      size_t l = in->u.s.n < 31 ? in->u.s.n : 31;
      memcpy(buf, in->u.s.p, l);
      buf[l] = 0;
      char *end;
      long long v = strtoll(buf, &end, 10);
      *out = jv_int(end != buf && !*end ? v : n && args[0].kind == JV_INT ? args[0].u.i : 0);
    } else *out = jv_int(n && args[0].kind == JV_INT ? args[0].u.i : 0);
    return DS_OK;
  }
  if (IS("abs")) {
    if (in->kind == JV_INT) *out = jv_int(in->u.i < 0 ? -in->u.i : in->u.i);
    else if (in->kind == JV_FLOAT) {
      *out = *in;
      out->u.f = in->u.f < 0 ? -in->u.f : in->u.f;
    } else return jctx_fail(c, at, DS_ERR_ARG, "abs: expects a number, not '%s'", jv_type_name(in));
    return DS_OK;
  }
#undef IS
  return jctx_fail(c, at, DS_ERR_UNSUPPORTED, "unsupported filter '%s'", name);
}

ds_status jinja_test(jctx *c, const jnode *at, const char *name, const jv *in, const jv *args, size_t n, int *out) {
#define IS(s) (!strcmp(name, s))
  jv_kind k = in->kind;
  if (IS("defined")) *out = k != JV_UNDEF;
  else if (IS("undefined")) *out = k == JV_UNDEF;
  else if (IS("none")) *out = k == JV_NONE;
  else if (IS("string")) *out = k == JV_STR;
  else if (IS("number")) *out = k == JV_INT || k == JV_FLOAT;
  else if (IS("integer")) *out = k == JV_INT;
  else if (IS("float")) *out = k == JV_FLOAT;
  else if (IS("boolean")) *out = k == JV_BOOL;
  else if (IS("true")) *out = k == JV_BOOL && in->u.b;
  else if (IS("false")) *out = k == JV_BOOL && !in->u.b;
  else if (IS("mapping")) *out = k == JV_DICT;
  else if (IS("iterable")) *out = k == JV_LIST || k == JV_DICT || k == JV_STR || k == JV_UNDEF;
  else if (IS("sequence")) *out = k == JV_LIST || k == JV_DICT || k == JV_STR;
  else if (IS("callable")) *out = k == JV_FUNC;
  else if (IS("lower") || IS("upper")) {
    int any = 0, ok = k == JV_STR;
    for (size_t i = 0; ok && i < in->u.s.n; i++) {
      char ch = in->u.s.p[i];
      if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')) {
        any = 1;
        ok = IS("lower") ? ch >= 'a' : ch <= 'Z';
      }
    }
    *out = ok && any;
  } else if (IS("even") || IS("odd") || IS("divisibleby")) {
    if (k != JV_INT) return jctx_fail(c, at, DS_ERR_ARG, "test '%s' expects an integer, not '%s'", name, jv_type_name(in));
    int64_t d = 2;
    if (IS("divisibleby")) {
      if (n != 1 || args[0].kind != JV_INT || args[0].u.i == 0)
        return jctx_fail(c, at, DS_ERR_ARG, "test 'divisibleby' expects a non-zero integer");
      d = args[0].u.i;
    }
    *out = IS("odd") ? in->u.i % 2 != 0 : in->u.i % d == 0;
  } else if (IS("eq") || IS("equalto") || IS("==") || IS("ne") || IS("!=") || IS("sameas")) {
    if (n != 1) return jctx_fail(c, at, DS_ERR_ARG, "test '%s' expects one argument", name);
    *out = jv_equal(in, &args[0]) == !(IS("ne") || IS("!="));
  } else if (IS("in")) {
    if (n != 1) return jctx_fail(c, at, DS_ERR_ARG, "test 'in' expects one argument");
    int found = 0;
    if (args[0].kind == JV_LIST)
      for (size_t i = 0; i < args[0].u.list->n && !found; i++) found = jv_equal(in, &args[0].u.list->items[i]);
    else if (args[0].kind == JV_DICT && k == JV_STR) found = jdict_get(args[0].u.dict, in->u.s.p, in->u.s.n) != NULL;
    else if (args[0].kind == JV_STR && k == JV_STR)
      for (size_t i = 0; i + in->u.s.n <= args[0].u.s.n && !found; i++)
        found = !memcmp(args[0].u.s.p + i, in->u.s.p, in->u.s.n);
    *out = found;
  } else {
    return jctx_fail(c, at, DS_ERR_UNSUPPORTED, "unsupported test '%s'", name);
  }
#undef IS
  return DS_OK;
}
