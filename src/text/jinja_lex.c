/* Lexer of the Jinja subset: segments (text and tags, with the whitespace control that
 * transformers' environment uses: trim_blocks, lstrip_blocks, "-" and "+") and the tokens of a
 * tag (names, numbers, Python string literals with their escapes, operators).
 *
 * Whitespace follows the environment transformers renders chat templates in: trim_blocks and
 * lstrip_blocks on (a newline right after a {% %} or {# #} tag is dropped, and the spaces
 * and tabs before such a tag at the start of a line are dropped), "-" inside a tag strips
 * all white space on that side, "+" turns trim/lstrip off for that tag, and one newline at
 * the very end of the template is dropped (keep_trailing_newline off). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_lex.h"

ds_status jl_fail(parser *P, int line, ds_status st, const char *fmt, ...) {
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (P->st == DS_OK) P->st = DS_FAIL(st, "%s:%d: %s", P->label, line, msg);
  return P->st;
}

/* 1-based line of src[at]; segments are scanned in order, so it counts on from the last call. */
static int line_of(parser *P, size_t at) {
  if (at < P->line_at) P->line_at = 0, P->line_no = 1;
  for (; P->line_at < at && P->line_at < P->len; P->line_at++) P->line_no += P->src[P->line_at] == '\n';
  return P->line_no;
}

static int is_space(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v'; }

/* ------------------------------------------------------------------ segments */

/* Finds the end of a tag opened at `at` ("{{", "{%" or "{#"); string literals are skipped
 * and, in {{ }}, braces balanced, so "}}" inside a string or a dict does not end it. */
static ds_status scan_tag(parser *P, size_t at, seg *s, size_t *after) {
  const char *src = P->src;
  char open = src[at + 1];
  char close = open == '{' ? '}' : open == '%' ? '%' : '#';
  s->kind = open == '{' ? SEG_VAR : open == '%' ? SEG_BLOCK : SEG_COMMENT;
  s->line = line_of(P, at);
  size_t i = at + 2;
  if (i < P->len && (src[i] == '-' || src[i] == '+')) {
    s->lminus = src[i] == '-';
    s->lplus = src[i] == '+';
    i++;
  }
  s->begin = i;
  int depth = 0;
  for (; i + 1 < P->len; i++) {
    char ch = src[i];
    if (s->kind != SEG_COMMENT && (ch == '\'' || ch == '"')) {
      for (i++; i < P->len && src[i] != ch; i++)
        if (src[i] == '\\') i++;
      if (i >= P->len) break;
      continue;
    }
    if (s->kind == SEG_VAR && ch == '{') depth++;
    if (ch == close && src[i + 1] == '}' && !(s->kind == SEG_VAR && depth > 0)) {
      s->end = i;
      if (s->end > s->begin && (src[i - 1] == '-' || src[i - 1] == '+')) {
        s->rminus = src[i - 1] == '-';
        s->rplus = src[i - 1] == '+';
        s->end--;
      }
      *after = i + 2;
      return DS_OK;
    }
    if (s->kind == SEG_VAR && ch == '}') depth--;
  }
  return jl_fail(P, s->line, DS_ERR_FORMAT, "unclosed '%c%c' tag", '{', open);
}

static ds_status push_seg(parser *P, seg s, size_t *cap) {
  if (P->n_segs == *cap) {
    size_t nc = *cap ? *cap * 2 : 64;
    seg *ns = jarena_alloc(P->a, nc * sizeof *ns);
    if (!ns) return DS_FAIL(DS_ERR_NOMEM, "chat template: out of memory");
    if (P->n_segs) memcpy(ns, P->segs, P->n_segs * sizeof *ns);
    P->segs = ns;
    *cap = nc;
  }
  P->segs[P->n_segs++] = s;
  return DS_OK;
}

ds_status jl_split_segments(parser *P) {
  size_t cap = 0, pos = 0;
  while (pos <= P->len) {
    size_t t = pos;
    while (t + 1 < P->len && !(P->src[t] == '{' && (P->src[t + 1] == '{' || P->src[t + 1] == '%' || P->src[t + 1] == '#'))) t++;
    if (t + 1 >= P->len) t = P->len;
    seg text = {SEG_TEXT, pos, t, line_of(P, pos), 0, 0, 0, 0};
    DS_TRY(push_seg(P, text, &cap));
    if (t >= P->len) break;
    seg tag = {0};
    DS_TRY(scan_tag(P, t, &tag, &pos));
    DS_TRY(push_seg(P, tag, &cap));
  }
  /* whitespace control on each text from its neighbouring tags */
  for (size_t k = 0; k < P->n_segs; k++) {
    seg *s = &P->segs[k];
    if (s->kind != SEG_TEXT) continue;
    const seg *prev = k ? &P->segs[k - 1] : NULL, *next = k + 1 < P->n_segs ? &P->segs[k + 1] : NULL;
    if (prev && prev->rminus) {
      while (s->begin < s->end && is_space(P->src[s->begin])) s->begin++;
    } else if (prev && prev->kind != SEG_VAR && !prev->rplus) {
      if (s->begin < s->end && P->src[s->begin] == '\n') s->begin++;
      else if (s->begin + 1 < s->end && P->src[s->begin] == '\r' && P->src[s->begin + 1] == '\n') s->begin += 2;
    }
    if (next && next->lminus) {
      while (s->end > s->begin && is_space(P->src[s->end - 1])) s->end--;
    } else if (next && next->kind != SEG_VAR && !next->lplus) {
      size_t e = s->end;
      while (e > s->begin && (P->src[e - 1] == ' ' || P->src[e - 1] == '\t')) e--;
      if ((e > s->begin && P->src[e - 1] == '\n') || (e == s->begin && (e == 0 || P->src[e - 1] == '\n'))) s->end = e;
    }
  }
  return DS_OK;
}

/* ------------------------------------------------------------------ tag tokens */

static ds_status push_tok(parser *P, tok t) {
  if (P->n_toks == P->cap_toks) {
    size_t nc = P->cap_toks ? P->cap_toks * 2 : 32;
    tok *nt = jarena_alloc(P->a, nc * sizeof *nt);
    if (!nt) return DS_FAIL(DS_ERR_NOMEM, "chat template: out of memory");
    if (P->n_toks) memcpy(nt, P->toks, P->n_toks * sizeof *nt);
    P->toks = nt;
    P->cap_toks = nc;
  }
  P->toks[P->n_toks++] = t;
  return DS_OK;
}

static int hexval(char ch) {
  return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
}

static size_t put_utf8(char *o, uint32_t cp) {
  if (cp < 0x80) { o[0] = (char)cp; return 1; }
  if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 63)); return 2; }
  if (cp < 0x10000) {
    o[0] = (char)(0xE0 | cp >> 12); o[1] = (char)(0x80 | (cp >> 6 & 63)); o[2] = (char)(0x80 | (cp & 63));
    return 3;
  }
  o[0] = (char)(0xF0 | cp >> 18); o[1] = (char)(0x80 | (cp >> 12 & 63));
  o[2] = (char)(0x80 | (cp >> 6 & 63)); o[3] = (char)(0x80 | (cp & 63));
  return 4;
}

/* A Python string literal's escapes (\n \t \r \\ \' \" \xHH \uXXXX \UXXXXXXXX \0); an
 * unknown escape keeps its backslash, as Python does. */
static ds_status lex_string(parser *P, size_t *i, size_t end, int line, tok *t) {
  const char *src = P->src;
  char quote = src[*i];
  size_t j = *i + 1;
  char *out = jarena_alloc(P->a, end - j + 1);
  if (!out) return DS_FAIL(DS_ERR_NOMEM, "chat template: out of memory");
  size_t n = 0;
  for (; j < end && src[j] != quote; j++) {
    if (src[j] != '\\' || j + 1 >= end) {
      out[n++] = src[j];
      continue;
    }
    char e = src[++j];
    int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
    if (digits) {
      uint32_t cp = 0;
      for (int k = 1; k <= digits; k++) {
        int h = j + (size_t)k < end ? hexval(src[j + (size_t)k]) : -1;
        if (h < 0) return jl_fail(P, line, DS_ERR_FORMAT, "malformed \\%c escape in a string literal", e);
        cp = cp * 16 + (uint32_t)h;
      }
      if (cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000))
        return jl_fail(P, line, DS_ERR_FORMAT, "escape \\%c of an invalid code point in a string literal", e);
      n += put_utf8(out + n, cp); /* never longer than the escape itself */
      j += (size_t)digits;
      continue;
    }
    const char *from = "ntr\\'\"0abfv", *to = "\n\t\r\\'\"\0\a\b\f\v";
    const char *hit = e ? strchr(from, e) : NULL;
    if (hit) {
      out[n++] = to[hit - from];
    } else if (e == '\n') {
      /* a backslash-newline continues the line */
    } else {
      out[n++] = '\\';
      out[n++] = e;
    }
  }
  if (j >= end) return jl_fail(P, line, DS_ERR_FORMAT, "unterminated string literal");
  t->kind = T_STRING;
  t->p = out;
  t->n = n;
  *i = j + 1;
  return DS_OK;
}

ds_status jl_lex_tag(parser *P, const seg *s) {
  P->n_toks = P->ti = 0;
  const char *src = P->src;
  int line = s->line;
  for (size_t i = s->begin; i < s->end;) {
    char ch = src[i];
    if (is_space(ch)) {
      line += ch == '\n';
      i++;
      continue;
    }
    tok t = {T_OP, src + i, 1, line, 0, 0};
    if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_') {
      size_t j = i;
      while (j < s->end && ((src[j] >= 'a' && src[j] <= 'z') || (src[j] >= 'A' && src[j] <= 'Z') || src[j] == '_' ||
                            (src[j] >= '0' && src[j] <= '9')))
        j++;
      t.kind = T_NAME;
      t.n = j - i;
      i = j;
    } else if (ch >= '0' && ch <= '9') {
      size_t j = i;
      while (j < s->end && src[j] >= '0' && src[j] <= '9') j++;
      int is_float = j + 1 < s->end && src[j] == '.' && src[j + 1] >= '0' && src[j + 1] <= '9';
      if (is_float)
        for (j++; j < s->end && src[j] >= '0' && src[j] <= '9';) j++;
      size_t e = j + 1 < s->end && (src[j] == 'e' || src[j] == 'E') ? j + 1 : 0; /* an exponent: 2.5e-3, 1e6 */
      if (e && e + 1 < s->end && (src[e] == '+' || src[e] == '-')) e++;
      if (e && e < s->end && src[e] >= '0' && src[e] <= '9') {
        for (j = e; j < s->end && src[j] >= '0' && src[j] <= '9';) j++;
        is_float = 1;
      }
      char num[64];
      size_t nl = j - i < sizeof num - 1 ? j - i : sizeof num - 1;
      memcpy(num, src + i, nl);
      num[nl] = 0;
      t.kind = is_float ? T_FLOAT : T_INT;
      if (is_float) t.f = strtod(num, NULL);
      else if (nl > 18) return jl_fail(P, line, DS_ERR_UNSUPPORTED, "integer literal %s is too large", num);
      else t.i = strtoll(num, NULL, 10);
      t.n = j - i;
      i = j;
    } else if (ch == '\'' || ch == '"') {
      DS_TRY(lex_string(P, &i, s->end, line, &t));
    } else {
      static const char *two[] = {"**", "//", "==", "!=", "<=", ">="};
      int matched = 0;
      for (size_t k = 0; k < sizeof two / sizeof *two && i + 1 < s->end; k++)
        if (src[i] == two[k][0] && src[i + 1] == two[k][1]) matched = 1;
      if (matched) {
        t.n = 2;
      } else if (!strchr("+-*/%~|.,:()[]{}<>=", ch)) {
        return jl_fail(P, line, DS_ERR_FORMAT, "unexpected character '%c' in a tag", ch);
      }
      i += t.n;
    }
    DS_TRY(push_tok(P, t));
  }
  tok end = {T_END, "end of tag", 10, line, 0, 0};
  return push_tok(P, end);
}

