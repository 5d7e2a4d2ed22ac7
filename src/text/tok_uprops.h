/* Unicode tables of the regex classes as HF tokenizers matches them (generated into
 * tok_uprops_*.c by scripts/gen_tok_unicode_classes.py, measured against the installed
 * tokenizers and the system PCRE2). Read through tok_uclass.c. */
#ifndef DSPARK_TEXT_TOK_UPROPS_H
#define DSPARK_TEXT_TOK_UPROPS_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  uint32_t lo, hi; /* inclusive; sorted, disjoint and not adjacent within a table */
} tk_urange;

/* One general category: HF's members, and where PCRE2's own \p{name} differs (with the
 * Unicode version tk_uprops_pcre2_unicode): add = in HF only, rem = in PCRE2 only. */
typedef struct {
  const char *name; /* "Lu", ... */
  const tk_urange *hf;
  const size_t *n_hf;
  const tk_urange *add;
  const size_t *n_add;
  const tk_urange *rem;
  const size_t *n_rem;
} tk_ugc;

typedef struct {
  const char *key; /* a property name HF accepts, lower case, without '_' / ' ' / '-' */
  const char *cat; /* the category or aggregate it names: "Lu", "L", "LC", ... */
} tk_ugc_name;

extern const tk_ugc tk_ugc_leaves[]; /* every category but Cn (the complement) and Cs */
extern const size_t tk_ugc_leaves_n;
extern const tk_ugc_name tk_ugc_names[];
extern const size_t tk_ugc_names_n;
extern const char tk_uprops_hf_unicode[];    /* "16.0" */
extern const char tk_uprops_pcre2_unicode[]; /* "14.0.0": the PCRE2 the exceptions were measured on */

/* \s and \h of HF's Oniguruma; \w = L|M|Nd|Nl|Pc + _add - _rem, for patterns outside [...]
 * (tk_uesc_w_*) and inside (tk_uesc_wb_*: Oniguruma's two differ on six Latin-1 characters),
 * and for single_word (tk_uword_*, the regex crate's \w). */
extern const tk_urange tk_uesc_s[], tk_uesc_h[];
extern const size_t tk_uesc_s_n, tk_uesc_h_n;
extern const tk_urange tk_uesc_w_add[], tk_uesc_w_rem[], tk_uesc_wb_add[], tk_uesc_wb_rem[];
extern const size_t tk_uesc_w_add_n, tk_uesc_w_rem_n, tk_uesc_wb_add_n, tk_uesc_wb_rem_n;
extern const tk_urange tk_uword_add[], tk_uword_rem[];
extern const size_t tk_uword_add_n, tk_uword_rem_n;

#endif
