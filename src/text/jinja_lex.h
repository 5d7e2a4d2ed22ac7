/* The lexer of the Jinja subset (jinja_lex.c) as the parser (jinja_parse.c) sees it: the
 * template split into text and tag segments with whitespace control applied, and the tokens
 * of one tag at a time. Private to those two files. */
#ifndef DSPARK_TEXT_JINJA_LEX_H
#define DSPARK_TEXT_JINJA_LEX_H

#include "text/jinja_internal.h"

typedef enum { SEG_TEXT, SEG_VAR, SEG_BLOCK, SEG_COMMENT } seg_kind;
typedef struct {
  seg_kind kind;
  size_t begin, end; /* TEXT: its bytes after whitespace control; tags: the inner expression */
  int line;
  int lminus, lplus, rminus, rplus;
} seg;

typedef enum { T_END, T_NAME, T_INT, T_FLOAT, T_STRING, T_OP } tok_kind;
typedef struct {
  tok_kind kind;
  const char *p; /* T_STRING: the unescaped value (arena) */
  size_t n;
  int line;
  double f;
  int64_t i;
} tok;

typedef struct {
  jarena *a;
  const char *src, *label;
  size_t len;
  seg *segs;
  size_t n_segs, si;
  tok *toks; /* the tokens of the current tag */
  size_t n_toks, cap_toks, ti;
  int depth, has_generation;
  size_t line_at; /* line_of's position and the line there */
  int line_no;
  ds_status st;
} parser;

/* Records "LABEL:LINE: message" once (the first failure wins) and returns it. */
ds_status jl_fail(parser *P, int line, ds_status st, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Splits P->src into P->segs with trim_blocks / lstrip_blocks / "-" / "+" applied to the texts. */
ds_status jl_split_segments(parser *P);
/* The tokens of tag s into P->toks (ending with T_END); P->ti = 0. */
ds_status jl_lex_tag(parser *P, const seg *s);

#endif
