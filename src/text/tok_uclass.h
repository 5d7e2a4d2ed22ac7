/* The character classes of pre-tokenizer regexes as HF tokenizers matches them, and how PCRE2
 * can match the same set quickly.
 *
 * A class (tk_uclass) is HF's set of code points (from the generated tables, tok_uprops.h)
 * plus, optionally, a "native" PCRE2 spelling (such as \p{L}) and the set PCRE2 matches with
 * it. The regex translator (tok_regex.c) writes each class as the native spelling plus the
 * code points where the two sets differ: PCRE2 keeps its fast property lookup and matches
 * exactly HF's set. The native sets are known only for the PCRE2 Unicode version the tables
 * were measured with; with another PCRE2 (tk_uclass_natives_usable() = 0) every class is
 * written out as explicit ranges: slower, equally exact. */
#ifndef DSPARK_TEXT_TOK_UCLASS_H
#define DSPARK_TEXT_TOK_UCLASS_H

#include <stddef.h>
#include <stdint.h>

#include "text/tok_uprops.h"

enum { TK_MAX_CP = 0x10FFFF };

typedef struct {
  tk_urange *r; /* sorted, disjoint, non-adjacent */
  size_t n, cap;
  int oom;      /* an allocation failed: the set is incomplete */
} tk_uset;

void tk_uset_free(tk_uset *s);
void tk_uset_add(tk_uset *s, uint32_t lo, uint32_t hi); /* appends; tk_uset_normalize after */
void tk_uset_normalize(tk_uset *s);                       /* sorts and merges */
void tk_uset_add_table(tk_uset *s, const tk_urange *t, size_t n); /* union, normalized */
void tk_uset_add_set(tk_uset *s, const tk_uset *a);
void tk_uset_subtract(tk_uset *out, const tk_uset *a, const tk_uset *b); /* out = a \ b (may alias) */
void tk_uset_complement(tk_uset *out, const tk_uset *a);                 /* [0, 0x10FFFF] \ a */
int tk_uset_contains(const tk_uset *s, uint32_t c);
int tk_uset_equal(const tk_uset *a, const tk_uset *b);

typedef struct {
  tk_uset hf;        /* what HF matches (surrogates belong to Cs only) */
  char native[40];   /* PCRE2 spelling, "" when there is none (or natives are off) */
  tk_uset native_set;/* what `native` matches in PCRE2 */
} tk_uclass;

void tk_uclass_free(tk_uclass *c);

/* 1 when the PCRE2 linked at run time has the Unicode version the native exceptions were
 * measured with. */
int tk_uclass_natives_usable(void);

/* The general category or aggregate a property name denotes, as HF's Oniguruma reads it
 * (case, '_', ' ' and '-' ignored): "Lu", "L", "LC", ...; NULL for any other property
 * (scripts, binary properties), which the translator refuses. */
const char *tk_uclass_lookup(const char *name, size_t len);

/* cat: a name tk_uclass_lookup returned. natives: fill native / native_set. */
void tk_uclass_category(const char *cat, int natives, tk_uclass *out);
/* e: one of s d w h v (lower case: the class itself); in_bracket: written inside [...],
 * where Oniguruma's \w differs from the one outside. */
void tk_uclass_escape(char e, int in_bracket, int natives, tk_uclass *out);
/* The \w an added token's single_word checks its neighbours against (the regex crate's). */
void tk_uclass_single_word(int natives, tk_uclass *out);

#endif
