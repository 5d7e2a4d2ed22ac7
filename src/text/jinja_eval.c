/* Evaluator of the Jinja subset: runs a parsed template over a context of variables into
 * bytes, recording for each output byte which chat message's loop iteration emitted it and
 * whether it was inside a {% generation %} block (the raw material of the loss mask).
 *
 * Semantics follow Jinja2 with its default Undefined, as transformers renders chat
 * templates: a missing variable or key is undefined, which prints as "", is false, has
 * length 0 and iterates as empty, but reading an attribute of it or using it in arithmetic
 * is an error. A for loop has its own scope (a `set` inside it is not seen after it); only
 * namespace() objects carry values out of loops. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_internal.h"

enum { MAX_EVAL_DEPTH = 400 };
static const size_t k_max_steps = 10u * 1000 * 1000, k_max_output = 64u << 20;

/* ------------------------------------------------------------------ output */

static ds_status emit(jctx *c, const jnode *at, const char *p, size_t n) {
  jinja_output *o = c->out;
  if (o->len + n > k_max_output) return jctx_fail(c, at, DS_ERR_RANGE, "output longer than %zu bytes", k_max_output);
  if (o->len + n > o->cap || !o->text) {
    size_t cap = o->cap ? o->cap : 1024;
    while (cap < o->len + n) cap *= 2;
    char *t = realloc(o->text, cap + 1);
    if (t) o->text = t;
    int32_t *w = t ? realloc(o->owner, cap * sizeof *w) : NULL;
    if (w) o->owner = w;
    uint8_t *g = w ? realloc(o->generation, cap) : NULL;
    if (!g) return jctx_nomem(c, at);
    o->generation = g;
    o->cap = cap;
  }
  memcpy(o->text + o->len, p, n);
  for (size_t i = 0; i < n; i++) {
    o->owner[o->len + i] = c->owner;
    o->generation[o->len + i] = (uint8_t)((c->in_generation ? JOUT_GENERATION : 0) | (i == 0 ? JOUT_CHUNK_START : 0));
  }
  o->len += n;
  o->text[o->len] = 0;
  return DS_OK;
}

/* ------------------------------------------------------------------ scopes */

static ds_status push_frame(jctx *c, const jnode *at) {
  if (c->n_frames == c->cap_frames) {
    size_t cap = c->cap_frames ? c->cap_frames * 2 : 8;
    jdict **f = jarena_alloc(c->a, cap * sizeof *f);
    if (!f) return jctx_nomem(c, at);
    if (c->n_frames) memcpy(f, c->frames, c->n_frames * sizeof *f);
    c->frames = f;
    c->cap_frames = cap;
  }
  if (!(c->frames[c->n_frames] = jdict_new(c->a))) return jctx_nomem(c, at);
  c->n_frames++;
  return DS_OK;
}

static ds_status set_var(jctx *c, const jnode *at, const char *name, size_t n, jv v) {
  if (jdict_set(c->a, c->frames[c->n_frames - 1], name, n, v)) return jctx_nomem(c, at);
  return DS_OK;
}

static jv lookup(jctx *c, const char *name, size_t n) {
  for (size_t f = c->n_frames; f-- > 0;) {
    const jv *v = jdict_get(c->frames[f], name, n);
    if (v) return *v;
  }
  return jinja_global(name, n);
}

/* ------------------------------------------------------------------ expressions */

static ds_status eval(jctx *c, const jnode *n, jv *out);
static ds_status exec_body(jctx *c, const jnode *body);

/* Runs body with its output going into a string (a macro's result, a block set's value). */
static ds_status capture_body(jctx *c, const jnode *body, jv *out) {
  jinja_output tmp = {0}, *saved = c->out;
  c->out = &tmp;
  ds_status st = exec_body(c, body);
  c->out = saved;
  if (st == DS_OK) {
    char *p = jarena_strdup(c->a, tmp.text ? tmp.text : "", tmp.len);
    if (p) *out = jv_str(p, tmp.len);
    else st = jctx_nomem(c, body);
  }
  free(tmp.text);
  free(tmp.owner);
  free(tmp.generation);
  return st;
}

/* A {% macro %} call: its parameters bound from the arguments (then their defaults, else
 * undefined) in a new scope over the caller's, its output the result. */
static ds_status call_macro(jctx *c, const jnode *at, const jnode *macro, const jv *args, size_t n_pos,
                            const char **kw, const jv *kwv, size_t n_kw, jv *out) {
  /* calls share the loop budget: macros calling macros could otherwise multiply without bound */
  if (++c->steps > k_max_steps) return jctx_fail(c, at, DS_ERR_RANGE, "more than %zu loop iterations and macro calls", k_max_steps);
  if (n_pos > macro->n_kids)
    return jctx_fail(c, at, DS_ERR_ARG, "macro '%s' takes %zu arguments, %zu given", macro->name, macro->n_kids, n_pos);
  for (size_t k = 0; k < n_kw; k++) {
    int known = 0;
    for (size_t i = 0; i < macro->n_kids; i++) known |= !strcmp(macro->kids[i]->name, kw[k]);
    if (!known) return jctx_fail(c, at, DS_ERR_ARG, "macro '%s' has no parameter '%s'", macro->name, kw[k]);
  }
  jv *vals = jarena_alloc(c->a, (macro->n_kids + 1) * sizeof *vals);
  if (!vals) return jctx_nomem(c, at);
  for (size_t i = 0; i < macro->n_kids; i++) { /* defaults are evaluated in the caller's scope */
    const jnode *p = macro->kids[i];
    vals[i] = jv_undef(p->name);
    if (i < n_pos) vals[i] = args[i];
    for (size_t k = 0; k < n_kw; k++)
      if (!strcmp(p->name, kw[k])) vals[i] = kwv[k];
    if (i >= n_pos && vals[i].kind == JV_UNDEF && p->a) DS_TRY(eval(c, p->a, &vals[i]));
  }
  DS_TRY(push_frame(c, at));
  for (size_t i = 0; i < macro->n_kids; i++) DS_TRY(set_var(c, at, macro->kids[i]->name, macro->kids[i]->name_len, vals[i]));
  ds_status st = capture_body(c, macro->c, out);
  c->n_frames--;
  return st;
}

static int is_num(const jv *v) { return v->kind == JV_INT || v->kind == JV_FLOAT || v->kind == JV_BOOL; }
static double num_f(const jv *v) { return v->kind == JV_FLOAT ? v->u.f : v->kind == JV_INT ? (double)v->u.i : v->u.b; }
static int64_t num_i(const jv *v) { return v->kind == JV_INT ? v->u.i : v->u.b; }

static ds_status undefined_error(jctx *c, const jnode *at, const jv *v) {
  return jctx_fail(c, at, DS_ERR_ARG, "'%s' is undefined", v->name ? v->name : "value");
}

static ds_status concat(jctx *c, const jnode *at, const jv *x, const jv *y, jv *out) {
  char *p = jarena_alloc(c->a, x->u.s.n + y->u.s.n + 1);
  if (!p) return jctx_nomem(c, at);
  memcpy(p, x->u.s.p, x->u.s.n);
  memcpy(p + x->u.s.n, y->u.s.p, y->u.s.n);
  *out = jv_str(p, x->u.s.n + y->u.s.n);
  return DS_OK;
}

static ds_status arith(jctx *c, const jnode *at, int op, const jv *x, const jv *y, jv *out) {
  if (op == JOP_CONCAT) {
    jv sx, sy;
    DS_TRY(jv_to_text(c, at, x, &sx));
    DS_TRY(jv_to_text(c, at, y, &sy));
    return concat(c, at, &sx, &sy, out);
  }
  if (x->kind == JV_UNDEF) return undefined_error(c, at, x);
  if (y->kind == JV_UNDEF) return undefined_error(c, at, y);
  static const char *names[] = {"+", "-", "*", "/", "//", "%", "**"};
  if (op == JOP_ADD && x->kind == JV_STR && y->kind == JV_STR) return concat(c, at, x, y, out);
  if (op == JOP_ADD && x->kind == JV_LIST && y->kind == JV_LIST) {
    jlist *l = jlist_new(c->a);
    if (!l) return jctx_nomem(c, at);
    for (size_t i = 0; i < x->u.list->n; i++)
      if (jlist_push(c->a, l, x->u.list->items[i])) return jctx_nomem(c, at);
    for (size_t i = 0; i < y->u.list->n; i++)
      if (jlist_push(c->a, l, y->u.list->items[i])) return jctx_nomem(c, at);
    out->kind = JV_LIST;
    out->u.list = l;
    return DS_OK;
  }
  if (op == JOP_MOD && x->kind == JV_STR) return jctx_fail(c, at, DS_ERR_UNSUPPORTED, "unsupported construct: '%%' string formatting");
  if (!is_num(x) || !is_num(y))
    return jctx_fail(c, at, DS_ERR_ARG, "unsupported operand types for %s: '%s' and '%s'", names[op], jv_type_name(x),
                     jv_type_name(y));
  int ints = x->kind != JV_FLOAT && y->kind != JV_FLOAT;
  if (ints && op != JOP_DIV && op != JOP_POW) {
    int64_t a = num_i(x), b = num_i(y), r = 0;
    if ((op == JOP_FLOORDIV || op == JOP_MOD) && b == 0) return jctx_fail(c, at, DS_ERR_ARG, "integer division or modulo by zero");
    int overflow = 0;
    switch (op) {
    case JOP_ADD: overflow = __builtin_add_overflow(a, b, &r); break;
    case JOP_SUB: overflow = __builtin_sub_overflow(a, b, &r); break;
    case JOP_MUL: overflow = __builtin_mul_overflow(a, b, &r); break;
    default: /* floor division and modulo with the sign of the divisor, as Python */
      if (a == INT64_MIN && b == -1) overflow = 1;
      else {
        r = op == JOP_FLOORDIV ? a / b : a % b;
        if (op == JOP_FLOORDIV && (a % b != 0) && ((a < 0) != (b < 0))) r--;
        if (op == JOP_MOD && r != 0 && ((r < 0) != (b < 0))) r += b;
      }
    }
    if (overflow) return jctx_fail(c, at, DS_ERR_RANGE, "integer overflow in %s", names[op]);
    *out = jv_int(r);
    return DS_OK;
  }
  double a = num_f(x), b = num_f(y), r;
  if ((op == JOP_DIV || op == JOP_FLOORDIV || op == JOP_MOD) && b == 0) return jctx_fail(c, at, DS_ERR_ARG, "division by zero");
  switch (op) {
  case JOP_ADD: r = a + b; break;
  case JOP_SUB: r = a - b; break;
  case JOP_MUL: r = a * b; break;
  case JOP_DIV: r = a / b; break;
  case JOP_FLOORDIV: r = __builtin_floor(a / b); break;
  case JOP_MOD: r = a - b * __builtin_floor(a / b); break;
  default: r = __builtin_pow(a, b);
  }
  if (ints && op == JOP_POW && r == (double)(int64_t)r && __builtin_fabs(r) < 9e15 && b >= 0) {
    *out = jv_int((int64_t)r);
  } else {
    out->kind = JV_FLOAT;
    out->u.f = r;
  }
  return DS_OK;
}

static ds_status compare(jctx *c, const jnode *at, int op, const jv *x, const jv *y, int *res) {
  if (op == JOP_EQ || op == JOP_NE) {
    *res = jv_equal(x, y) == (op == JOP_EQ);
    return DS_OK;
  }
  if (op == JOP_IN || op == JOP_NOT_IN) {
    int found = 0;
    if (y->kind == JV_STR) {
      if (x->kind != JV_STR) return jctx_fail(c, at, DS_ERR_ARG, "'in <string>' requires a string as left operand, not '%s'", jv_type_name(x));
      if (x->u.s.n == 0) found = 1;
      for (size_t i = 0; !found && i + x->u.s.n <= y->u.s.n; i++) found = !memcmp(y->u.s.p + i, x->u.s.p, x->u.s.n);
    } else if (y->kind == JV_LIST) {
      for (size_t i = 0; !found && i < y->u.list->n; i++) found = jv_equal(x, &y->u.list->items[i]);
    } else if (y->kind == JV_DICT) {
      found = x->kind == JV_STR && jdict_get(y->u.dict, x->u.s.p, x->u.s.n) != NULL;
    } else if (y->kind == JV_UNDEF) {
      found = 0; /* Jinja's Undefined iterates as empty */
    } else {
      return jctx_fail(c, at, DS_ERR_ARG, "argument of type '%s' is not iterable", jv_type_name(y));
    }
    *res = found == (op == JOP_IN);
    return DS_OK;
  }
  int cmp;
  if (is_num(x) && is_num(y)) {
    double a = num_f(x), b = num_f(y);
    cmp = a < b ? -1 : a > b;
  } else if (x->kind == JV_STR && y->kind == JV_STR) {
    size_t m = x->u.s.n < y->u.s.n ? x->u.s.n : y->u.s.n;
    cmp = memcmp(x->u.s.p, y->u.s.p, m); /* UTF-8 byte order is code point order */
    if (!cmp) cmp = x->u.s.n < y->u.s.n ? -1 : x->u.s.n > y->u.s.n;
  } else {
    return jctx_fail(c, at, DS_ERR_ARG, "ordering comparison not supported between '%s' and '%s'", jv_type_name(x),
                     jv_type_name(y));
  }
  *res = op == JOP_LT ? cmp < 0 : op == JOP_LE ? cmp <= 0 : op == JOP_GT ? cmp > 0 : cmp >= 0;
  return DS_OK;
}

/* Code point boundaries of a UTF-8 string: offs[k] is the byte offset of code point k,
 * offs[count] the length. Continuation bytes never start a code point. */
static ds_status cp_offsets(jctx *c, const jnode *at, const jv *s, size_t **offs, size_t *count) {
  size_t n = 0;
  for (size_t i = 0; i < s->u.s.n; i++) n += ((unsigned char)s->u.s.p[i] & 0xC0) != 0x80;
  size_t *o = jarena_alloc(c->a, (n + 1) * sizeof *o);
  if (!o) return jctx_nomem(c, at);
  size_t k = 0;
  for (size_t i = 0; i < s->u.s.n; i++)
    if (((unsigned char)s->u.s.p[i] & 0xC0) != 0x80) o[k++] = i;
  o[n] = s->u.s.n;
  *offs = o;
  *count = n;
  return DS_OK;
}

static ds_status slice_index(jctx *c, const jnode *at, const jnode *expr, int64_t *out, int *given) {
  *given = 0;
  if (!expr) return DS_OK;
  jv v;
  DS_TRY(eval(c, expr, &v));
  if (v.kind == JV_NONE) return DS_OK;
  if (v.kind != JV_INT && v.kind != JV_BOOL) return jctx_fail(c, at, DS_ERR_ARG, "slice indices must be integers, not '%s'", jv_type_name(&v));
  *out = num_i(&v);
  *given = 1;
  return DS_OK;
}

/* Python's x[start:stop:step] on a list or a string (by code points). */
static ds_status eval_slice(jctx *c, const jnode *n, jv *out) {
  jv x;
  DS_TRY(eval(c, n->a, &x));
  int64_t start = 0, stop = 0, step = 1;
  int has_start, has_stop, has_step;
  DS_TRY(slice_index(c, n, n->b, &start, &has_start));
  DS_TRY(slice_index(c, n, n->c, &stop, &has_stop));
  DS_TRY(slice_index(c, n, n->d, &step, &has_step));
  if (!has_step) step = 1;
  if (step == 0) return jctx_fail(c, n, DS_ERR_ARG, "slice step cannot be zero");
  size_t *offs = NULL, len;
  if (x.kind == JV_STR) DS_TRY(cp_offsets(c, n, &x, &offs, &len));
  else if (x.kind == JV_LIST) len = x.u.list->n;
  else if (x.kind == JV_UNDEF) return undefined_error(c, n, &x);
  else return jctx_fail(c, n, DS_ERR_ARG, "'%s' object is not subscriptable", jv_type_name(&x));
  int64_t L = (int64_t)len;
  if (!has_start) start = step > 0 ? 0 : L - 1;
  else if (start < 0) start = start + L < 0 ? (step > 0 ? 0 : -1) : start + L;
  else if (start >= L) start = step > 0 ? L : L - 1;
  if (!has_stop) stop = step > 0 ? L : -1;
  else if (stop < 0) stop = stop + L < 0 ? (step > 0 ? 0 : -1) : stop + L;
  else if (stop >= L) stop = step > 0 ? L : L - 1;
  jlist *l = x.kind == JV_LIST ? jlist_new(c->a) : NULL;
  char *buf = x.kind == JV_STR ? jarena_alloc(c->a, x.u.s.n + 1) : NULL;
  if (!l && !buf) return jctx_nomem(c, n);
  size_t bl = 0;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (l && jlist_push(c->a, l, x.u.list->items[i])) return jctx_nomem(c, n);
    if (buf) {
      memcpy(buf + bl, x.u.s.p + offs[i], offs[i + 1] - offs[i]);
      bl += offs[i + 1] - offs[i];
    }
  }
  if (l) {
    out->kind = JV_LIST;
    out->u.list = l;
  } else {
    *out = jv_str(buf, bl);
  }
  return DS_OK;
}

static ds_status eval_item(jctx *c, const jnode *n, jv *out) {
  jv x, k;
  DS_TRY(eval(c, n->a, &x));
  DS_TRY(eval(c, n->b, &k));
  if (x.kind == JV_UNDEF) return undefined_error(c, n, &x);
  *out = jv_undef("item");
  if (x.kind == JV_DICT) {
    if (k.kind != JV_STR) return DS_OK;
    const jv *v = jdict_get(x.u.dict, k.u.s.p, k.u.s.n);
    if (v) *out = *v;
    else DS_TRY(jinja_getattr(c, n, &x, k.u.s.p, k.u.s.n, out));
    if (out->kind == JV_UNDEF) out->name = jarena_strdup(c->a, k.u.s.p, k.u.s.n);
    return DS_OK;
  }
  if (x.kind != JV_LIST && x.kind != JV_STR) {
    if (k.kind == JV_STR) DS_TRY(jinja_getattr(c, n, &x, k.u.s.p, k.u.s.n, out));
    return DS_OK;
  }
  if (k.kind != JV_INT && k.kind != JV_BOOL) return DS_OK;
  int64_t i = num_i(&k);
  if (x.kind == JV_LIST) {
    int64_t L = (int64_t)x.u.list->n;
    if (i < 0) i += L;
    if (i >= 0 && i < L) *out = x.u.list->items[i];
    return DS_OK;
  }
  size_t *offs, count;
  DS_TRY(cp_offsets(c, n, &x, &offs, &count));
  if (i < 0) i += (int64_t)count;
  if (i >= 0 && i < (int64_t)count) *out = jv_str(x.u.s.p + offs[i], offs[i + 1] - offs[i]);
  return DS_OK;
}

/* The arguments of a call or filter: positional ones, then the keyword ones. */
static ds_status eval_args(jctx *c, const jnode *n, jv **args, size_t *n_pos) {
  *args = jarena_alloc(c->a, (n->n_kids + 1) * sizeof **args);
  if (!*args) return jctx_nomem(c, n);
  for (size_t i = 0; i < n->n_kids; i++) DS_TRY(eval(c, n->kids[i], &(*args)[i]));
  *n_pos = n->n_kids - n->n_kw;
  return DS_OK;
}

static ds_status eval_inner(jctx *c, const jnode *n, jv *out) {
  jv x, y;
  jv *args;
  size_t n_pos;
  switch (n->kind) {
  case JN_LITERAL: *out = n->lit; return DS_OK;
  case JN_NAME:
    *out = lookup(c, n->name, n->name_len);
    if (out->kind == JV_UNDEF) out->name = n->name;
    return DS_OK;
  case JN_ATTR:
    DS_TRY(eval(c, n->a, &x));
    if (x.kind == JV_UNDEF) return undefined_error(c, n, &x);
    DS_TRY(jinja_getattr(c, n, &x, n->name, n->name_len, out));
    if (out->kind == JV_UNDEF) out->name = n->name;
    return DS_OK;
  case JN_ITEM: return eval_item(c, n, out);
  case JN_SLICE: return eval_slice(c, n, out);
  case JN_CALL:
    DS_TRY(eval(c, n->a, &x));
    if (x.kind == JV_UNDEF) return jctx_fail(c, n, DS_ERR_UNSUPPORTED, "'%s' is undefined (not a function this interpreter provides)", x.name ? x.name : "callee");
    if (x.kind != JV_FUNC) return jctx_fail(c, n, DS_ERR_ARG, "'%s' object is not callable", jv_type_name(&x));
    DS_TRY(eval_args(c, n, &args, &n_pos));
    if (x.u.fn.id == JF_MACRO) return call_macro(c, n, x.u.fn.macro, args, n_pos, n->kw_names, args + n_pos, n->n_kw, out);
    return jinja_call(c, n, &x, args, n_pos, n->kw_names, args + n_pos, n->n_kw, out);
  case JN_FILTER:
    DS_TRY(eval(c, n->a, &x));
    DS_TRY(eval_args(c, n, &args, &n_pos));
    return jinja_filter(c, n, n->name, &x, args, n_pos, n->kw_names, args + n_pos, n->n_kw, out);
  case JN_TEST: {
    DS_TRY(eval(c, n->a, &x));
    DS_TRY(eval_args(c, n, &args, &n_pos));
    int r;
    DS_TRY(jinja_test(c, n, n->name, &x, args, n_pos, &r));
    *out = jv_bool(n->op ? !r : r);
    return DS_OK;
  }
  case JN_NOT:
    DS_TRY(eval(c, n->a, &x));
    *out = jv_bool(!jv_truthy(&x));
    return DS_OK;
  case JN_NEG:
    DS_TRY(eval(c, n->a, &x));
    if (x.kind == JV_FLOAT) { /* -x, not 0 - x: -0.0 keeps its sign, as in Python */
      *out = x;
      out->u.f = -x.u.f;
      return DS_OK;
    }
    y = jv_int(0);
    return arith(c, n, JOP_SUB, &y, &x, out);
  case JN_AND:
  case JN_OR:
    DS_TRY(eval(c, n->a, &x));
    if (jv_truthy(&x) == (n->kind == JN_OR)) {
      *out = x;
      return DS_OK;
    }
    return eval(c, n->b, out);
  case JN_COND:
    DS_TRY(eval(c, n->b, &x));
    if (jv_truthy(&x)) return eval(c, n->a, out);
    if (n->c) return eval(c, n->c, out);
    *out = jv_undef("else");
    return DS_OK;
  case JN_BINOP:
    DS_TRY(eval(c, n->a, &x));
    DS_TRY(eval(c, n->b, &y));
    return arith(c, n, n->op, &x, &y, out);
  case JN_COMPARE: {
    DS_TRY(eval(c, n->a, &x));
    int r = 1;
    for (size_t i = 0; i < n->n_kids && r; i++) {
      DS_TRY(eval(c, n->kids[i], &y));
      DS_TRY(compare(c, n, n->ops[i], &x, &y, &r));
      x = y;
    }
    *out = jv_bool(r);
    return DS_OK;
  }
  case JN_LIST: {
    jlist *l = jlist_new(c->a);
    if (!l) return jctx_nomem(c, n);
    for (size_t i = 0; i < n->n_kids; i++) {
      DS_TRY(eval(c, n->kids[i], &x));
      if (jlist_push(c->a, l, x)) return jctx_nomem(c, n);
    }
    out->kind = JV_LIST;
    out->u.list = l;
    return DS_OK;
  }
  case JN_DICT: {
    jdict *d = jdict_new(c->a);
    if (!d) return jctx_nomem(c, n);
    for (size_t i = 0; i + 1 < n->n_kids; i += 2) {
      DS_TRY(eval(c, n->kids[i], &x));
      DS_TRY(eval(c, n->kids[i + 1], &y));
      if (x.kind != JV_STR) return jctx_fail(c, n, DS_ERR_UNSUPPORTED, "unsupported construct: dict key of type '%s'", jv_type_name(&x));
      if (jdict_set(c->a, d, x.u.s.p, x.u.s.n, y)) return jctx_nomem(c, n);
    }
    out->kind = JV_DICT;
    out->u.dict = d;
    return DS_OK;
  }
  default: return jctx_fail(c, n, DS_ERR_INTERNAL, "statement node %d in an expression", (int)n->kind);
  }
}

static ds_status eval(jctx *c, const jnode *n, jv *out) {
  if (++c->depth > MAX_EVAL_DEPTH) return jctx_fail(c, n, DS_ERR_RANGE, "expression nested too deeply");
  ds_status st = eval_inner(c, n, out);
  c->depth--;
  return st;
}

/* ------------------------------------------------------------------ statements */

static ds_status exec_node(jctx *c, const jnode *n);

static ds_status exec_body(jctx *c, const jnode *body) {
  for (size_t i = 0; body && i < body->n_kids && !c->flow; i++) DS_TRY(exec_node(c, body->kids[i]));
  return DS_OK;
}

/* The items a for loop walks: a list's items, a dict's keys, a string's characters. */
static ds_status iter_items(jctx *c, const jnode *at, const jv *x, jlist **out) {
  if (x->kind == JV_LIST) {
    *out = x->u.list;
    return DS_OK;
  }
  jlist *l = jlist_new(c->a);
  if (!l) return jctx_nomem(c, at);
  *out = l;
  if (x->kind == JV_UNDEF) return DS_OK;
  if (x->kind == JV_DICT) {
    for (size_t i = 0; i < x->u.dict->n; i++)
      if (jlist_push(c->a, l, jv_str(x->u.dict->keys[i], x->u.dict->key_lens[i]))) return jctx_nomem(c, at);
    return DS_OK;
  }
  if (x->kind == JV_STR) {
    size_t *offs, count;
    DS_TRY(cp_offsets(c, at, x, &offs, &count));
    for (size_t i = 0; i < count; i++)
      if (jlist_push(c->a, l, jv_str(x->u.s.p + offs[i], offs[i + 1] - offs[i]))) return jctx_nomem(c, at);
    return DS_OK;
  }
  return jctx_fail(c, at, DS_ERR_ARG, "'%s' object is not iterable", jv_type_name(x));
}

static ds_status bind_targets(jctx *c, const jnode *n, const jv *item) {
  if (n->n_kids == 1) return set_var(c, n, n->kids[0]->name, n->kids[0]->name_len, *item);
  if (item->kind != JV_LIST || item->u.list->n != n->n_kids)
    return jctx_fail(c, n, DS_ERR_ARG, "cannot unpack a '%s' into %zu loop variables", jv_type_name(item), n->n_kids);
  for (size_t k = 0; k < n->n_kids; k++)
    DS_TRY(set_var(c, n, n->kids[k]->name, n->kids[k]->name_len, item->u.list->items[k]));
  return DS_OK;
}

/* loop.* for item i; one dict per loop, updated in place, so a long loop allocates nothing. */
static ds_status loop_var(jctx *c, const jnode *n, jdict *d, const jlist *items, size_t i) {
  int64_t len = (int64_t)items->n, k = (int64_t)i;
  int bad = jdict_set(c->a, d, "index0", 6, jv_int(k)) || jdict_set(c->a, d, "index", 5, jv_int(k + 1)) ||
            jdict_set(c->a, d, "revindex0", 9, jv_int(len - k - 1)) || jdict_set(c->a, d, "revindex", 8, jv_int(len - k)) ||
            jdict_set(c->a, d, "first", 5, jv_bool(i == 0)) || jdict_set(c->a, d, "last", 4, jv_bool(k == len - 1)) ||
            jdict_set(c->a, d, "length", 6, jv_int(len)) ||
            jdict_set(c->a, d, "previtem", 8, i ? items->items[i - 1] : jv_undef("loop.previtem")) ||
            jdict_set(c->a, d, "nextitem", 8, k + 1 < len ? items->items[i + 1] : jv_undef("loop.nextitem"));
  if (bad) return jctx_nomem(c, n);
  jv v = {JV_DICT, {.dict = d}, NULL};
  return set_var(c, n, "loop", 4, v);
}

static ds_status exec_for(jctx *c, const jnode *n) {
  jv x;
  DS_TRY(eval(c, n->a, &x));
  jlist *all = NULL;
  DS_TRY(iter_items(c, n, &x, &all));
  DS_TRY(push_frame(c, n));
  jlist *items = all;
  if (n->b) { /* `for x in xs if cond`: filtered first, so loop.length counts the kept ones */
    if (!(items = jlist_new(c->a))) return jctx_nomem(c, n);
    for (size_t i = 0; i < all->n; i++) {
      jv keep;
      DS_TRY(bind_targets(c, n, &all->items[i]));
      DS_TRY(eval(c, n->b, &keep));
      if (jv_truthy(&keep) && jlist_push(c->a, items, all->items[i])) return jctx_nomem(c, n);
    }
  }
  int saved_owner = c->owner;
  jdict *loop = jdict_new(c->a);
  if (!loop) return jctx_nomem(c, n);
  for (size_t i = 0; i < items->n; i++) {
    if (++c->steps > k_max_steps)
      return jctx_fail(c, n, DS_ERR_RANGE, "more than %zu loop iterations and macro calls", k_max_steps);
    const jv *item = &items->items[i];
    /* an iteration over one of the conversation's messages emits that message's text */
    if (item->kind == JV_DICT)
      for (size_t m = 0; m < c->n_messages; m++)
        if (c->messages[m] == item->u.dict) c->owner = (int)m;
    DS_TRY(bind_targets(c, n, item));
    DS_TRY(loop_var(c, n, loop, items, i));
    DS_TRY(exec_body(c, n->c));
    c->owner = saved_owner;
    int flow = c->flow;
    c->flow = 0;
    if (flow == 1) break;
  }
  c->n_frames--;
  if (!items->n && n->d) DS_TRY(exec_body(c, n->d));
  return DS_OK;
}

static ds_status exec_node(jctx *c, const jnode *n) {
  jv x;
  switch (n->kind) {
  case JN_TEXT: return emit(c, n, n->name, n->name_len);
  case JN_OUTPUT:
    DS_TRY(eval(c, n->a, &x));
    DS_TRY(jv_to_text(c, n, &x, &x));
    return emit(c, n, x.u.s.p, x.u.s.n);
  case JN_IF:
    DS_TRY(eval(c, n->a, &x));
    return exec_body(c, jv_truthy(&x) ? n->b : n->c);
  case JN_FOR: return exec_for(c, n);
  case JN_SET:
    if (n->c) DS_TRY(capture_body(c, n->c, &x));
    else DS_TRY(eval(c, n->b, &x));
    if (n->a) {
      jv ns = lookup(c, n->a->name, n->a->name_len);
      if (ns.kind != JV_DICT || !ns.u.dict->is_namespace)
        return jctx_fail(c, n, DS_ERR_ARG, "cannot assign attribute on non-namespace object '%s'", n->a->name);
      if (jdict_set(c->a, ns.u.dict, n->name, n->name_len, x)) return jctx_nomem(c, n);
      return DS_OK;
    }
    return set_var(c, n, n->name, n->name_len, x);
  case JN_BREAK: c->flow = 1; return DS_OK;
  case JN_CONTINUE: c->flow = 2; return DS_OK;
  case JN_GENERATION: {
    int saved = c->in_generation;
    c->in_generation = 1;
    ds_status st = exec_body(c, n);
    c->in_generation = saved;
    return st;
  }
  case JN_BODY: return exec_body(c, n);
  case JN_MACRO: {
    jv fn = {JV_FUNC, {0}, NULL};
    fn.u.fn.id = JF_MACRO;
    fn.u.fn.macro = n;
    return set_var(c, n, n->name, n->name_len, fn);
  }
  default: return jctx_fail(c, n, DS_ERR_INTERNAL, "expression node %d as a statement", (int)n->kind);
  }
}

ds_status jinja_render(const jnode *root, jarena *a, const char *label, jdict *vars, const jdict *const *messages,
                       size_t n_messages, jinja_output *out) {
  jctx c = {0};
  c.a = a;
  c.label = label ? label : "chat template";
  c.out = out;
  c.owner = -1;
  c.messages = messages;
  c.n_messages = n_messages;
  out->len = 0;
  if (push_frame(&c, root) != DS_OK) return c.st;
  c.frames[0] = vars;
  ds_status st = exec_body(&c, root);
  if (st == DS_OK && !out->text) st = emit(&c, root, "", 0); /* an empty render still has a buffer */
  return st == DS_OK ? DS_OK : c.st != DS_OK ? c.st : st;
}
