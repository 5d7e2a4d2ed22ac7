/* Parser of the Jinja subset used by chat templates: expressions with Jinja's precedence
 * and statements (if / for / set / break / continue / generation) into a tree. Constructs
 * outside the subset are refused here by name and line, before anything renders.
 *
 * Node layout by kind: JN_ATTR a.name; JN_ITEM a[b]; JN_SLICE a[b:c:d] (missing parts NULL);
 * JN_CALL a(kids, the last n_kw named kw_names); JN_FILTER a|name(kids); JN_TEST a is
 * [not] name(kids), op 1 when negated; JN_NOT/JN_NEG a; JN_BINOP a op b; JN_COMPARE a then
 * kids[i] compared with operator kids[i]->op (kids hold the right operands in order);
 * JN_AND/JN_OR a, b; JN_COND a if b else c; JN_LIST / JN_DICT kids (dict: key, value pairs);
 * JN_IF a: condition, b: then-body, c: else (a body or NULL); JN_FOR kids: target names
 * (JN_NAME), a: iterable, b: filter condition or NULL, c: body, d: else-body or NULL;
 * JN_SET name (and a: the namespace NAME for `set ns.attr`), b: value, or c: the body of a
 * block set; JN_MACRO name, kids: parameters (JN_NAME, a: default or NULL), c: body; JN_OUTPUT a;
 * JN_BODY / JN_GENERATION kids. */
#include <stdlib.h>
#include <string.h>

#include "text/jinja_lex.h"

enum { MAX_DEPTH = 200 };


/* ------------------------------------------------------------------ expressions */

static const tok *peek(parser *P) { return &P->toks[P->ti]; }
static int is_op(const tok *t, const char *op) { return t->kind == T_OP && t->n == strlen(op) && !memcmp(t->p, op, t->n); }
static int is_name(const tok *t, const char *nm) { return t->kind == T_NAME && t->n == strlen(nm) && !memcmp(t->p, nm, t->n); }
static int accept_op(parser *P, const char *op) {
  if (!is_op(peek(P), op)) return 0;
  P->ti++;
  return 1;
}
static int accept_name(parser *P, const char *nm) {
  if (!is_name(peek(P), nm)) return 0;
  P->ti++;
  return 1;
}
static ds_status expect_op(parser *P, const char *op) {
  if (accept_op(P, op)) return DS_OK;
  const tok *t = peek(P);
  return jl_fail(P, t->line, DS_ERR_FORMAT, "expected '%s', found '%.*s'", op, (int)t->n, t->p);
}

static jnode *new_node(parser *P, jnode_kind kind, int line) {
  jnode *n = jarena_alloc(P->a, sizeof *n);
  if (!n) jl_fail(P, line, DS_ERR_NOMEM, "out of memory");
  else {
    n->kind = kind;
    n->line = line;
  }
  return n;
}

/* Appends kid to n->kids (grown in the arena). */
static int add_kid(parser *P, jnode *n, jnode *kid) {
  if (!kid) return -1;
  if ((n->n_kids & (n->n_kids - 1)) == 0) { /* at powers of two: 0, 1, 2, 4, ... */
    size_t cap = n->n_kids ? n->n_kids * 2 : 1;
    jnode **k = jarena_alloc(P->a, cap * sizeof *k);
    if (!k) return jl_fail(P, n->line, DS_ERR_NOMEM, "out of memory"), -1;
    if (n->n_kids) memcpy(k, n->kids, n->n_kids * sizeof *k);
    n->kids = k;
  }
  n->kids[n->n_kids++] = kid;
  return 0;
}

static jnode *parse_expr(parser *P, int with_cond);
static jnode *parse_unary(parser *P);
static jnode *parse_primary(parser *P);

/* "(a, b, name=c)" after the opening parenthesis: into n's kids and kw_names. */
static int parse_args(parser *P, jnode *n) {
  const char *kw[64];
  size_t n_kw = 0;
  while (!accept_op(P, ")")) {
    if (n->n_kids && expect_op(P, ",") != DS_OK) return -1;
    if (accept_op(P, ")")) break;
    const tok *t = peek(P);
    if (t->kind == T_NAME && is_op(&P->toks[P->ti + 1], "=")) {
      if (n_kw == 64) return jl_fail(P, t->line, DS_ERR_UNSUPPORTED, "too many keyword arguments"), -1;
      kw[n_kw++] = jarena_strdup(P->a, t->p, t->n);
      P->ti += 2;
    } else if (n_kw) {
      return jl_fail(P, t->line, DS_ERR_FORMAT, "positional argument after a keyword argument"), -1;
    } else if (is_op(t, "*") || is_op(t, "**")) {
      return jl_fail(P, t->line, DS_ERR_UNSUPPORTED, "unsupported construct '*args' in a call"), -1;
    }
    if (add_kid(P, n, parse_expr(P, 1))) return -1;
  }
  if (n_kw) {
    n->kw_names = jarena_alloc(P->a, n_kw * sizeof *n->kw_names);
    if (!n->kw_names) return jl_fail(P, n->line, DS_ERR_NOMEM, "out of memory"), -1;
    memcpy(n->kw_names, kw, n_kw * sizeof *kw);
    n->n_kw = n_kw;
  }
  return 0;
}

static jnode *parse_postfix(parser *P, jnode *node) {
  while (node && P->st == DS_OK) {
    const tok *t = peek(P);
    if (accept_op(P, ".")) {
      const tok *nm = peek(P);
      if (nm->kind != T_NAME && nm->kind != T_INT) {
        jl_fail(P, nm->line, DS_ERR_FORMAT, "expected an attribute name after '.'");
        return NULL;
      }
      jnode *n = new_node(P, nm->kind == T_NAME ? JN_ATTR : JN_ITEM, t->line);
      if (!n) return NULL;
      n->a = node;
      if (nm->kind == T_NAME) {
        n->name = jarena_strdup(P->a, nm->p, nm->n);
        n->name_len = nm->n;
      } else if ((n->b = new_node(P, JN_LITERAL, t->line))) {
        n->b->lit = jv_int(nm->i);
      }
      P->ti++;
      node = n;
    } else if (accept_op(P, "[")) {
      jnode *parts[3] = {NULL, NULL, NULL};
      int colons = 0;
      for (;;) {
        if (!is_op(peek(P), ":") && !is_op(peek(P), "]") && !(parts[colons] = parse_expr(P, 1))) return NULL;
        if (colons < 2 && accept_op(P, ":")) colons++;
        else break;
      }
      if (expect_op(P, "]") != DS_OK) return NULL;
      jnode *n = new_node(P, colons ? JN_SLICE : JN_ITEM, t->line);
      if (!n) return NULL;
      if (!colons && !parts[0]) {
        jl_fail(P, t->line, DS_ERR_FORMAT, "empty subscript '[]'");
        return NULL;
      }
      n->a = node;
      n->b = parts[0];
      n->c = parts[1];
      n->d = parts[2];
      node = n;
    } else if (accept_op(P, "(")) {
      jnode *n = new_node(P, JN_CALL, t->line);
      if (!n) return NULL;
      n->a = node;
      if (parse_args(P, n)) return NULL;
      node = n;
    } else {
      break;
    }
  }
  return P->st == DS_OK ? node : NULL;
}

/* Names that end a test without argument (`x is defined and y`). */
static int starts_test_arg(const tok *t) {
  if (t->kind == T_NAME)
    return !is_name(t, "else") && !is_name(t, "or") && !is_name(t, "and") && !is_name(t, "if") && !is_name(t, "in") &&
           !is_name(t, "not") && !is_name(t, "is");
  return t->kind == T_STRING || t->kind == T_INT || t->kind == T_FLOAT || is_op(t, "(") || is_op(t, "[") || is_op(t, "{");
}

static jnode *parse_filters(parser *P, jnode *node) {
  while (node && P->st == DS_OK) {
    const tok *t = peek(P);
    int is_filter = is_op(t, "|");
    if (!is_filter && !is_name(t, "is")) break;
    P->ti++;
    jnode *n = new_node(P, is_filter ? JN_FILTER : JN_TEST, t->line);
    if (!n) return NULL;
    n->a = node;
    if (!is_filter && accept_name(P, "not")) n->op = 1;
    const tok *nm = peek(P);
    if (nm->kind != T_NAME) {
      jl_fail(P, nm->line, DS_ERR_FORMAT, "expected a %s name after '%s'", is_filter ? "filter" : "test",
              is_filter ? "|" : "is");
      return NULL;
    }
    n->name = jarena_strdup(P->a, nm->p, nm->n);
    P->ti++;
    if (is_op(peek(P), ".")) { /* Jinja allows dotted filter / test names; no chat template uses them */
      jl_fail(P, nm->line, DS_ERR_UNSUPPORTED, "unsupported construct: dotted %s name", is_filter ? "filter" : "test");
      return NULL;
    }
    if (accept_op(P, "(")) {
      if (parse_args(P, n)) return NULL;
    } else if (!is_filter && starts_test_arg(peek(P))) {
      if (add_kid(P, n, parse_postfix(P, parse_primary(P)))) return NULL;
    }
    node = n;
  }
  return P->st == DS_OK ? node : NULL;
}

static jnode *parse_primary(parser *P) {
  const tok *t = peek(P);
  if (++P->depth > MAX_DEPTH) {
    jl_fail(P, t->line, DS_ERR_UNSUPPORTED, "expression nested deeper than %d", MAX_DEPTH);
    return NULL;
  }
  jnode *n = NULL;
  if (t->kind == T_NAME) {
    static const char *lits[] = {"true", "True", "false", "False", "none", "None"};
    int k = -1;
    for (int i = 0; i < 6; i++)
      if (is_name(t, lits[i])) k = i;
    if ((n = new_node(P, k >= 0 ? JN_LITERAL : JN_NAME, t->line))) {
      if (k >= 0) n->lit = k < 4 ? jv_bool(k < 2) : jv_none();
      else {
        n->name = jarena_strdup(P->a, t->p, t->n);
        n->name_len = t->n;
      }
    }
    P->ti++;
  } else if (t->kind == T_STRING) {
    /* adjacent literals concatenate, as in Python */
    size_t total = 0, j = P->ti;
    for (; P->toks[j].kind == T_STRING; j++) total += P->toks[j].n;
    char *s = jarena_alloc(P->a, total + 1);
    if ((n = new_node(P, JN_LITERAL, t->line)) && s) {
      size_t off = 0;
      for (; P->ti < j; P->ti++) {
        memcpy(s + off, P->toks[P->ti].p, P->toks[P->ti].n);
        off += P->toks[P->ti].n;
      }
      n->lit = jv_str(s, total);
    }
  } else if (t->kind == T_INT || t->kind == T_FLOAT) {
    if ((n = new_node(P, JN_LITERAL, t->line))) {
      if (t->kind == T_INT) n->lit = jv_int(t->i);
      else {
        n->lit.kind = JV_FLOAT;
        n->lit.u.f = t->f;
      }
    }
    P->ti++;
  } else if (accept_op(P, "(")) {
    n = parse_expr(P, 1);
    if (n && is_op(peek(P), ",")) { /* a tuple: a list here */
      jnode *l = new_node(P, JN_LIST, t->line);
      if (!l || add_kid(P, l, n)) return NULL;
      while (accept_op(P, ",") && !is_op(peek(P), ")"))
        if (add_kid(P, l, parse_expr(P, 1))) return NULL;
      n = l;
    }
    if (n && expect_op(P, ")") != DS_OK) n = NULL;
  } else if (is_op(t, "[") || is_op(t, "{")) {
    int is_dict = is_op(t, "{");
    P->ti++;
    if ((n = new_node(P, is_dict ? JN_DICT : JN_LIST, t->line))) {
      const char *close = is_dict ? "}" : "]";
      while (!accept_op(P, close)) {
        if (n->n_kids && expect_op(P, ",") != DS_OK) return NULL;
        if (accept_op(P, close)) break;
        if (add_kid(P, n, parse_expr(P, 1))) return NULL;
        if (is_dict && (expect_op(P, ":") != DS_OK || add_kid(P, n, parse_expr(P, 1)))) return NULL;
      }
    }
  } else {
    jl_fail(P, t->line, DS_ERR_FORMAT, "unexpected '%.*s' in an expression", (int)t->n, t->p);
  }
  P->depth--;
  return P->st == DS_OK ? n : NULL;
}

static jnode *parse_unary(parser *P) {
  const tok *t = peek(P);
  if (is_op(t, "-") || is_op(t, "+")) {
    P->ti++;
    if (++P->depth > MAX_DEPTH) {
      jl_fail(P, t->line, DS_ERR_UNSUPPORTED, "expression nested deeper than %d", MAX_DEPTH);
      return NULL;
    }
    jnode *inner = parse_unary(P);
    P->depth--;
    if (!inner || t->p[0] == '+') return inner;
    jnode *n = new_node(P, JN_NEG, t->line);
    if (n) n->a = inner;
    return n;
  }
  return parse_filters(P, parse_postfix(P, parse_primary(P)));
}

static jnode *binop(parser *P, jnode_kind kind, int op, jnode *a, jnode *b, int line) {
  if (!a || !b) return NULL;
  jnode *n = new_node(P, kind, line);
  if (n) {
    n->op = op;
    n->a = a;
    n->b = b;
  }
  return n;
}

/* Binary levels, lowest first: ** ; * / // % ; ~ ; + - (Jinja's order). */
static jnode *parse_binary(parser *P, int level) {
  static const char *ops[4][4] = {{"+", "-"}, {"~"}, {"*", "/", "//", "%"}, {"**"}};
  static const int codes[4][4] = {{JOP_ADD, JOP_SUB}, {JOP_CONCAT}, {JOP_MUL, JOP_DIV, JOP_FLOORDIV, JOP_MOD}, {JOP_POW}};
  jnode *left = level == 3 ? parse_unary(P) : parse_binary(P, level + 1);
  for (;;) {
    const tok *t = peek(P);
    int k = -1;
    for (int i = 0; i < 4 && ops[level][i]; i++)
      if (is_op(t, ops[level][i])) k = i;
    if (k < 0 || !left) return left;
    P->ti++;
    left = binop(P, JN_BINOP, codes[level][k], left, level == 3 ? parse_unary(P) : parse_binary(P, level + 1), t->line);
  }
}

static jnode *parse_compare(parser *P) {
  jnode *left = parse_binary(P, 0), *n = NULL;
  int ops_buf[64];
  for (;;) {
    const tok *t = peek(P);
    static const char *ops[] = {"==", "!=", "<", "<=", ">", ">="};
    static const int codes[] = {JOP_EQ, JOP_NE, JOP_LT, JOP_LE, JOP_GT, JOP_GE};
    int op = -1;
    for (int i = 0; i < 6; i++)
      if (is_op(t, ops[i])) op = codes[i];
    if (op < 0 && is_name(t, "in")) op = JOP_IN;
    if (op < 0 && is_name(t, "not") && is_name(&P->toks[P->ti + 1], "in")) {
      op = JOP_NOT_IN;
      P->ti++;
    }
    if (op < 0 || !left) break;
    P->ti++;
    if (!n && !(n = new_node(P, JN_COMPARE, t->line))) return NULL;
    n->a = left;
    if (n->n_kids == 64) {
      jl_fail(P, t->line, DS_ERR_UNSUPPORTED, "more than 64 chained comparisons");
      return NULL;
    }
    ops_buf[n->n_kids] = op;
    if (add_kid(P, n, parse_binary(P, 0))) return NULL;
  }
  if (!n || !left) return left;
  if (!(n->ops = jarena_alloc(P->a, n->n_kids * sizeof *n->ops))) {
    jl_fail(P, n->line, DS_ERR_NOMEM, "out of memory");
    return NULL;
  }
  memcpy(n->ops, ops_buf, n->n_kids * sizeof *n->ops);
  return n;
}

static jnode *parse_not(parser *P) {
  const tok *t = peek(P);
  if (is_name(t, "not") && !is_name(&P->toks[P->ti + 1], "in")) {
    P->ti++;
    if (++P->depth > MAX_DEPTH) {
      jl_fail(P, t->line, DS_ERR_UNSUPPORTED, "expression nested deeper than %d", MAX_DEPTH);
      return NULL;
    }
    jnode *inner = parse_not(P);
    P->depth--;
    jnode *n = inner ? new_node(P, JN_NOT, t->line) : NULL;
    if (n) n->a = inner;
    return n;
  }
  return parse_compare(P);
}

static jnode *parse_and_or(parser *P, int is_or) {
  jnode *left = is_or ? parse_and_or(P, 0) : parse_not(P);
  while (left && is_name(peek(P), is_or ? "or" : "and")) {
    int line = peek(P)->line;
    P->ti++;
    left = binop(P, is_or ? JN_OR : JN_AND, 0, left, is_or ? parse_and_or(P, 0) : parse_not(P), line);
  }
  return left;
}

/* with_cond: allow `a if b else c` (not in a for loop's iterable, whose `if` filters). */
static jnode *parse_expr(parser *P, int with_cond) {
  if (++P->depth > MAX_DEPTH) {
    jl_fail(P, peek(P)->line, DS_ERR_UNSUPPORTED, "expression nested deeper than %d", MAX_DEPTH);
    return NULL;
  }
  jnode *n = parse_and_or(P, 1);
  while (n && with_cond && is_name(peek(P), "if")) {
    jnode *c = new_node(P, JN_COND, peek(P)->line);
    P->ti++;
    if (!c) return NULL;
    c->a = n;
    if (!(c->b = parse_and_or(P, 1))) return NULL;
    if (accept_name(P, "else") && !(c->c = parse_expr(P, 1))) return NULL;
    n = c;
  }
  P->depth--;
  return P->st == DS_OK ? n : NULL;
}

/* ------------------------------------------------------------------ statements */

static ds_status expect_end(parser *P, const char *what) {
  const tok *t = peek(P);
  if (t->kind == T_END) return DS_OK;
  return jl_fail(P, t->line, DS_ERR_FORMAT, "unexpected '%.*s' after %s", (int)t->n, t->p, what);
}

static jnode *parse_body(parser *P, const char *const *stops, const char **hit, int in_loop, int open_line,
                         const char *opener);

static jnode *parse_if(parser *P, int line, int in_loop) {
  static const char *const stops[] = {"elif", "else", "endif", NULL};
  jnode *n = new_node(P, JN_IF, line);
  if (!n || !(n->a = parse_expr(P, 1)) || expect_end(P, "the condition") != DS_OK) return NULL;
  const char *hit = NULL;
  if (!(n->b = parse_body(P, stops, &hit, in_loop, line, "if"))) return NULL;
  if (!strcmp(hit, "elif")) {
    jnode *rest = parse_if(P, P->toks[0].line, in_loop); /* the elif tag's tokens are current */
    if (!rest) return NULL;
    if ((n->c = new_node(P, JN_BODY, rest->line)) && add_kid(P, n->c, rest)) return NULL;
  } else if (!strcmp(hit, "else")) {
    static const char *const end_only[] = {"endif", NULL};
    if (expect_end(P, "else") != DS_OK || !(n->c = parse_body(P, end_only, &hit, in_loop, line, "if"))) return NULL;
    if (expect_end(P, "endif") != DS_OK) return NULL;
  } else if (expect_end(P, "endif") != DS_OK) {
    return NULL;
  }
  return P->st == DS_OK ? n : NULL;
}

static jnode *parse_for(parser *P, int line) {
  jnode *n = new_node(P, JN_FOR, line);
  if (!n) return NULL;
  int paren = accept_op(P, "(");
  do {
    const tok *t = peek(P);
    if (t->kind != T_NAME) {
      jl_fail(P, t->line, DS_ERR_FORMAT, "expected a loop variable name after 'for'");
      return NULL;
    }
    jnode *nm = new_node(P, JN_NAME, t->line);
    if (!nm) return NULL;
    nm->name = jarena_strdup(P->a, t->p, t->n);
    nm->name_len = t->n;
    if (add_kid(P, n, nm)) return NULL;
    P->ti++;
  } while (accept_op(P, ","));
  if (paren && expect_op(P, ")") != DS_OK) return NULL;
  if (!accept_name(P, "in")) {
    jl_fail(P, peek(P)->line, DS_ERR_FORMAT, "expected 'in' in the for loop");
    return NULL;
  }
  if (!(n->a = parse_expr(P, 0))) return NULL;
  if (accept_name(P, "if") && !(n->b = parse_expr(P, 0))) return NULL;
  if (is_name(peek(P), "recursive")) {
    jl_fail(P, line, DS_ERR_UNSUPPORTED, "unsupported construct 'recursive' loop");
    return NULL;
  }
  if (expect_end(P, "the for loop's header") != DS_OK) return NULL;
  static const char *const stops[] = {"else", "endfor", NULL}, *const end_only[] = {"endfor", NULL};
  const char *hit = NULL;
  if (!(n->c = parse_body(P, stops, &hit, 1, line, "for"))) return NULL;
  if (!strcmp(hit, "else") &&
      (expect_end(P, "else") != DS_OK || !(n->d = parse_body(P, end_only, &hit, 0, line, "for"))))
    return NULL;
  return expect_end(P, "endfor") == DS_OK ? n : NULL;
}

static jnode *parse_set(parser *P, int line) {
  const tok *t = peek(P);
  if (t->kind != T_NAME) {
    jl_fail(P, t->line, DS_ERR_FORMAT, "expected a variable name after 'set'");
    return NULL;
  }
  jnode *n = new_node(P, JN_SET, line);
  if (!n) return NULL;
  n->name = jarena_strdup(P->a, t->p, t->n);
  n->name_len = t->n;
  P->ti++;
  if (accept_op(P, ".")) { /* set ns.attr = ...: name becomes attr, a the namespace */
    const tok *attr = peek(P);
    if (attr->kind != T_NAME) {
      jl_fail(P, attr->line, DS_ERR_FORMAT, "expected an attribute name after '.' in set");
      return NULL;
    }
    if (!(n->a = new_node(P, JN_NAME, line))) return NULL;
    n->a->name = n->name;
    n->a->name_len = n->name_len;
    n->name = jarena_strdup(P->a, attr->p, attr->n);
    n->name_len = attr->n;
    P->ti++;
  }
  if (is_op(peek(P), ",")) {
    jl_fail(P, line, DS_ERR_UNSUPPORTED, "unsupported construct: set with several targets");
    return NULL;
  }
  if (peek(P)->kind == T_END) { /* {% set x %}...{% endset %}: x is the body's output */
    static const char *const end_only[] = {"endset", NULL};
    const char *hit = NULL;
    if (!(n->c = parse_body(P, end_only, &hit, 0, line, "set")) || expect_end(P, "endset") != DS_OK) return NULL;
    return n;
  }
  if (expect_op(P, "=") != DS_OK || !(n->b = parse_expr(P, 1)) || expect_end(P, "the set value") != DS_OK) return NULL;
  return n;
}

static jnode *parse_macro(parser *P, int line) {
  const tok *t = peek(P);
  if (t->kind != T_NAME) {
    jl_fail(P, t->line, DS_ERR_FORMAT, "expected a macro name");
    return NULL;
  }
  jnode *n = new_node(P, JN_MACRO, line);
  if (!n) return NULL;
  n->name = jarena_strdup(P->a, t->p, t->n);
  n->name_len = t->n;
  P->ti++;
  if (expect_op(P, "(") != DS_OK) return NULL;
  while (!accept_op(P, ")")) {
    if (n->n_kids && expect_op(P, ",") != DS_OK) return NULL;
    const tok *p = peek(P);
    if (p->kind != T_NAME) {
      jl_fail(P, p->line, DS_ERR_FORMAT, "expected a parameter name in macro %s", n->name);
      return NULL;
    }
    jnode *param = new_node(P, JN_NAME, p->line);
    if (!param) return NULL;
    param->name = jarena_strdup(P->a, p->p, p->n);
    param->name_len = p->n;
    P->ti++;
    if (accept_op(P, "=") && !(param->a = parse_expr(P, 1))) return NULL;
    if (add_kid(P, n, param)) return NULL;
  }
  if (expect_end(P, "the macro's parameters") != DS_OK) return NULL;
  static const char *const end_only[] = {"endmacro", NULL};
  const char *hit = NULL;
  if (!(n->c = parse_body(P, end_only, &hit, 0, line, "macro"))) return NULL;
  if (peek(P)->kind == T_NAME) P->ti++; /* {% endmacro name %} */
  return expect_end(P, "endmacro") == DS_OK ? n : NULL;
}

static int in_list(const tok *t, const char *const *names) {
  for (; names && *names; names++)
    if (is_name(t, *names)) return 1;
  return 0;
}

/* Statements until one of stops (the block tag whose keyword is *hit is then current, its
 * tokens after the keyword unread) or, with no stops, the end of the template. */
static jnode *parse_body(parser *P, const char *const *stops, const char **hit, int in_loop, int open_line,
                         const char *opener) {
  jnode *body = new_node(P, JN_BODY, open_line);
  if (!body) return NULL;
  if (++P->depth > MAX_DEPTH) {
    jl_fail(P, open_line, DS_ERR_UNSUPPORTED, "blocks nested deeper than %d", MAX_DEPTH);
    return NULL;
  }
  while (P->si < P->n_segs && P->st == DS_OK) {
    const seg *s = &P->segs[P->si++];
    if (s->kind == SEG_COMMENT) continue;
    if (s->kind == SEG_TEXT) {
      if (s->end == s->begin) continue;
      jnode *t = new_node(P, JN_TEXT, s->line);
      if (!t) return NULL;
      t->name = P->src + s->begin;
      t->name_len = s->end - s->begin;
      if (add_kid(P, body, t)) return NULL;
      continue;
    }
    if (jl_lex_tag(P, s) != DS_OK) return NULL;
    if (s->kind == SEG_VAR) {
      jnode *o = new_node(P, JN_OUTPUT, s->line);
      if (!o || !(o->a = parse_expr(P, 1)) || expect_end(P, "the expression") != DS_OK || add_kid(P, body, o))
        return NULL;
      continue;
    }
    const tok *kw = peek(P);
    int line = kw->line;
    if (kw->kind != T_NAME) {
      jl_fail(P, line, DS_ERR_FORMAT, "expected a statement name after '{%%'");
      return NULL;
    }
    if (in_list(kw, stops)) {
      for (const char *const *st = stops; *st; st++)
        if (is_name(kw, *st)) *hit = *st;
      P->ti++;
      P->depth--;
      return body;
    }
    P->ti++;
    jnode *stmt = NULL;
    if (is_name(kw, "if")) {
      stmt = parse_if(P, line, in_loop);
    } else if (is_name(kw, "for")) {
      stmt = parse_for(P, line);
    } else if (is_name(kw, "set")) {
      stmt = parse_set(P, line);
    } else if (is_name(kw, "macro")) {
      stmt = parse_macro(P, line);
    } else if (is_name(kw, "break") || is_name(kw, "continue")) {
      if (!in_loop) {
        jl_fail(P, line, DS_ERR_FORMAT, "'%.*s' outside a for loop", (int)kw->n, kw->p);
        return NULL;
      }
      if ((stmt = new_node(P, is_name(kw, "break") ? JN_BREAK : JN_CONTINUE, line)) && expect_end(P, "break") != DS_OK)
        return NULL;
    } else if (is_name(kw, "generation")) {
      static const char *const end_only[] = {"endgeneration", NULL};
      const char *h = NULL;
      P->has_generation = 1;
      jnode *inner = expect_end(P, "generation") == DS_OK ? parse_body(P, end_only, &h, in_loop, line, "generation") : NULL;
      if (inner && expect_end(P, "endgeneration") == DS_OK) {
        inner->kind = JN_GENERATION;
        stmt = inner;
      }
    } else {
      static const char *const known[] = {"call", "filter", "include", "import", "from", "extends", "block",
                                          "with", "raw", "autoescape", "do", "trans", NULL};
      static const char *const ends[] = {"endif", "endfor", "elif", "else", "endgeneration", "endset", "endmacro", NULL};
      if (in_list(kw, known))
        jl_fail(P, line, DS_ERR_UNSUPPORTED, "unsupported construct '{%% %.*s %%}'", (int)kw->n, kw->p);
      else if (in_list(kw, ends))
        jl_fail(P, line, DS_ERR_FORMAT, "unexpected '{%% %.*s %%}' (no open block it could close)", (int)kw->n, kw->p);
      else
        jl_fail(P, line, DS_ERR_UNSUPPORTED, "unknown tag '{%% %.*s %%}'", (int)kw->n, kw->p);
      return NULL;
    }
    if (add_kid(P, body, stmt)) return NULL;
  }
  if (P->st != DS_OK) return NULL;
  if (stops) {
    jl_fail(P, open_line, DS_ERR_FORMAT, "'{%% %s %%}' is never closed (expected '{%% %s %%}')", opener,
            stops[0] && !strcmp(stops[0], "elif") ? "endif" : stops[0] && !strcmp(stops[0], "else") ? "endfor" : stops[0]);
    return NULL;
  }
  P->depth--;
  return body;
}

jnode *jinja_parse(jarena *a, const char *src, size_t len, const char *label, ds_status *st, int *has_generation) {
  parser P = {0};
  P.a = a;
  P.src = src;
  P.label = label ? label : "chat template";
  P.line_no = 1;
  /* keep_trailing_newline off: one final newline is not part of the output */
  if (len && src[len - 1] == '\n') len -= len > 1 && src[len - 2] == '\r' ? 2 : 1;
  P.len = len;
  jnode *root = NULL;
  if (jl_split_segments(&P) == DS_OK) root = parse_body(&P, NULL, NULL, 0, 1, NULL);
  *st = root ? DS_OK : P.st != DS_OK ? P.st : DS_ERR_NOMEM;
  if (has_generation) *has_generation = P.has_generation;
  return root;
}
