/* Pre-tokenizer regexes: HF tokenizers runs them with Oniguruma (Ruby syntax, Unicode 16
 * tables); we run them with PCRE2 (UTF + UCP, JIT). The two are both backtracking engines
 * with the same semantics for the patterns of GPT-2, Qwen2/Qwen3 and Llama-3, but a few
 * escapes match different characters:
 *   \s   Oniguruma: White_Space (25 code points); PCRE2 adds U+180E.
 *   \p{L}, \p{N}, \d, \w: PCRE2 10.42 has Unicode 14, Oniguruma 16 (about 9,400 code points
 *        assigned since). \w in Oniguruma is about L|M|Nd|Nl|Pc, in PCRE2 L|N|_.
 *   \h   Oniguruma: a hex digit; PCRE2: horizontal white space.
 * So the pattern is rewritten before compiling: these escapes become explicit classes that
 * match exactly Oniguruma's sets (measured code point by code point against tokenizers
 * 0.23). Inside a character class the negated forms (\S, \P{L}, ...) are left alone. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"

const char tk_gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static const char k_ws[] =
    "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";
/* Letters and numbers of Unicode 15.0-16.0 (in Oniguruma, not in PCRE2 10.42's tables). */
static const char k_extra_l[] =
    "\\x{1C89}-\\x{1C8A}\\x{A7CB}-\\x{A7CD}\\x{A7DA}-\\x{A7DC}\\x{105C0}-\\x{105F3}"
    "\\x{10D4A}-\\x{10D65}\\x{10D6F}-\\x{10D85}\\x{10EC2}-\\x{10EC4}\\x{1123F}-\\x{11240}"
    "\\x{11380}-\\x{11389}\\x{1138B}\\x{1138E}\\x{11390}-\\x{113B5}\\x{113B7}\\x{113D1}\\x{113D3}"
    "\\x{11BC0}-\\x{11BE0}\\x{11F02}\\x{11F04}-\\x{11F10}\\x{11F12}-\\x{11F33}\\x{1342F}"
    "\\x{13441}-\\x{13446}\\x{13460}-\\x{143FA}\\x{16100}-\\x{1611D}\\x{16D40}-\\x{16D6C}"
    "\\x{18CFF}\\x{1B132}\\x{1B155}\\x{1DF25}-\\x{1DF2A}\\x{1E030}-\\x{1E06D}\\x{1E4D0}-\\x{1E4EB}"
    "\\x{1E5D0}-\\x{1E5ED}\\x{1E5F0}\\x{2B739}\\x{2EBF0}-\\x{2EE5D}\\x{31350}-\\x{323AF}";
static const char k_extra_d[] =
    "\\x{10D40}-\\x{10D49}\\x{116D0}-\\x{116E3}\\x{11BF0}-\\x{11BF9}\\x{11F50}-\\x{11F59}"
    "\\x{16130}-\\x{16139}\\x{16D70}-\\x{16D79}\\x{1CCF0}-\\x{1CCF9}\\x{1E4F0}-\\x{1E4F9}"
    "\\x{1E5F1}-\\x{1E5FA}";
static const char k_extra_n_only[] = "\\x{1D2C0}-\\x{1D2D3}";
/* \w members beyond L|M|Nd|Nl|Pc: superscript and fraction digits of Latin-1, other
 * Alphabetic (circled and squared letters) and marks of Unicode 15-16. */
static const char k_extra_w[] =
    "\\x{B2}-\\x{B3}\\x{B9}\\x{BC}-\\x{BE}\\x{897}\\x{CF3}\\x{ECE}\\x{24B6}-\\x{24E9}\\x{10D69}-\\x{10D6D}\\x{10EFC}-\\x{10EFF}"
    "\\x{11241}\\x{113B8}-\\x{113C0}\\x{113C2}\\x{113C5}\\x{113C7}-\\x{113CA}\\x{113CC}-\\x{113D0}"
    "\\x{113D2}\\x{113E1}-\\x{113E2}\\x{11F00}-\\x{11F01}\\x{11F03}\\x{11F34}-\\x{11F3A}"
    "\\x{11F3E}-\\x{11F42}\\x{11F5A}\\x{13440}\\x{13447}-\\x{13455}\\x{1611E}-\\x{1612F}\\x{1E08F}"
    "\\x{1E4EC}-\\x{1E4EF}\\x{1E5EE}-\\x{1E5EF}\\x{1F130}-\\x{1F149}\\x{1F150}-\\x{1F169}"
    "\\x{1F170}-\\x{1F189}";

typedef struct {
  char *p;
  size_t len, cap;
  int oom;
} sbuf;

static void put(sbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (b->len + n + 1 > cap) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) { b->oom = 1; return; }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
}
static void puts_(sbuf *b, const char *s) { put(b, s, strlen(s)); }

/* Puts the members of a class: inside an existing [...] as is, else wrapped in [...] or
 * [^...] (negated). */
static void put_class(sbuf *b, int in_class, int negated, const char *const *parts) {
  if (!in_class) puts_(b, negated ? "[^" : "[");
  for (size_t i = 0; parts[i]; i++) puts_(b, parts[i]);
  if (!in_class) puts_(b, "]");
}

/* Returns the rewritten pattern (malloc'd) or NULL when out of memory. */
static char *rewrite(const char *pat) {
  sbuf b = {0};
  int in_class = 0;
  size_t n = strlen(pat);
  put(&b, "", 0);
  for (size_t i = 0; i < n; i++) {
    char c = pat[i];
    if (c == '\\' && i + 1 < n) {
      char e = pat[i + 1];
      const char *s_parts[] = {k_ws, NULL};
      const char *l_parts[] = {"\\p{L}", k_extra_l, NULL};
      const char *n_parts[] = {"\\p{N}", k_extra_d, k_extra_n_only, NULL};
      const char *d_parts[] = {"\\p{Nd}", k_extra_d, NULL};
      const char *w_parts[] = {"\\p{L}\\p{M}\\p{Nd}\\p{Nl}\\p{Pc}", k_extra_l, k_extra_d, k_extra_w, NULL};
      const char *h_parts[] = {"0-9a-fA-F", NULL};
      const char *const *parts = NULL;
      int negated = 0;
      size_t used = 2;
      if (e == 's' || e == 'S') { parts = s_parts; negated = e == 'S'; }
      else if (e == 'd' || e == 'D') { parts = d_parts; negated = e == 'D'; }
      else if (e == 'w' || e == 'W') { parts = w_parts; negated = e == 'W'; }
      else if (e == 'h' || e == 'H') { parts = h_parts; negated = e == 'H'; }
      else if ((e == 'p' || e == 'P') && i + 4 < n && pat[i + 2] == '{' &&
               (pat[i + 3] == 'L' || pat[i + 3] == 'N') && pat[i + 4] == '}') {
        parts = pat[i + 3] == 'L' ? l_parts : n_parts;
        negated = e == 'P';
        used = 5;
      }
      if (parts && !(negated && in_class)) {
        put_class(&b, in_class, negated, parts);
      } else if (e == 'h' || e == 'H') { /* \H inside a class: no PCRE2 equivalent */
        free(b.p);
        return NULL;
      } else {
        put(&b, pat + i, used);
      }
      i += used - 1;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = 1;
      put(&b, "[", 1);
      if (i + 1 < n && pat[i + 1] == '^') put(&b, pat + ++i, 1);
      if (i + 1 < n && pat[i + 1] == ']') put(&b, pat + ++i, 1); /* a literal ']' first */
      continue;
    }
    if (in_class && c == '[' && i + 1 < n && pat[i + 1] == ':') { /* [:alpha:] */
      const char *end = strstr(pat + i + 2, ":]");
      size_t len = end ? (size_t)(end - (pat + i)) + 2 : 1;
      put(&b, pat + i, len);
      i += len - 1;
      continue;
    }
    if (in_class && c == ']') in_class = 0;
    put(&b, &c, 1);
  }
  if (b.oom) {
    free(b.p);
    return NULL;
  }
  return b.p;
}

pcre2_code *tk_regex_compile(const char *pattern, int literal, int *jit, char *err, size_t errcap) {
  *jit = 0;
  char *pat = literal ? NULL : rewrite(pattern);
  if (!literal && !pat) {
    snprintf(err, errcap, "cannot translate the pattern (\\H inside a class, or out of memory)");
    return NULL;
  }
  int code;
  PCRE2_SIZE off;
  /* Ruby syntax (Oniguruma's default) has multi-line anchors: ^ and $ match at line breaks.
   * PCRE2_LITERAL accepts neither UCP nor MULTILINE, and needs neither. */
  uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP | PCRE2_MULTILINE);
  pcre2_code *re =
      pcre2_compile((PCRE2_SPTR)(literal ? pattern : pat), PCRE2_ZERO_TERMINATED, opts, &code, &off, NULL);
  if (!re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(code, msg, sizeof msg);
    snprintf(err, errcap, "cannot compile the regex: %s (at offset %zu of the translated pattern)",
             (const char *)msg, (size_t)off);
  } else if (pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0) {
    *jit = 1; /* without JIT (unsupported CPU), pcre2_match is used: same results, slower */
  }
  free(pat);
  return re;
}
