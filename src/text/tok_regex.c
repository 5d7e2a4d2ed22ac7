/* Pre-tokenizer regexes: HF tokenizers runs them with Oniguruma (Ruby syntax, Unicode 16
 * tables); we run them with PCRE2 (UTF + UCP, JIT), whose Unicode tables are those of its own
 * version (14 for 10.42) and whose escapes partly mean other things. Both are backtracking
 * engines with the same semantics for the patterns of GPT-2, Qwen2/Qwen3, Llama-3, o200k or
 * DeepSeek; what differs is translated here, before compiling:
 *   - every character class follows HF's tables, measured code point by code point
 *     (tok_uclass.h): \p{..} / \P{..} / \p{^..} of a general category or an aggregate (short
 *     or long name), \s \d \w \h and their negations, alone or inside [...] (where
 *     Oniguruma's \w is not quite the one outside), and \b \B (built on \w). A class is
 *     written as PCRE2's own property plus the code points where the tables differ, so
 *     matching keeps PCRE2's fast lookup;
 *   - Ruby's meanings: \h is a hex digit, \v the vertical tab, \V the letter V, \O any
 *     character, \uHHHH a code point, (?m) makes '.' match a newline (PCRE2's (?s));
 *   - '.' and '^' / '$' see only LF as a newline, as Oniguruma does.
 * Refused, naming the construct (each would match differently): other properties (scripts,
 * binary properties: \p{Han}), POSIX brackets ([:alpha:]), nested classes and && inside
 * [...], \X \y \Y (grapheme / text-segment boundaries), \pL without braces (Oniguruma reads
 * the letters "pL"), and a \p{..} under (?i) (Oniguruma folds its case, PCRE2 does not). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"
#include "text/tok_uclass.h"

const char tk_gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

enum { MAX_DEPTH = 200, MAX_ITEMS = 64 };

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
    if (!p) {
      b->oom = 1;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
}
static void puts_(sbuf *b, const char *s) { put(b, s, strlen(s)); }

/* One class inside a bracket (or alone): HF's set, negated or not. */
typedef struct {
  tk_uclass cls;
  int negated;
  int property; /* \p{..}: case-sensitive sets, refused under (?i) */
} citem;

typedef struct {
  const char *pat;
  size_t n, i;
  sbuf out;
  int natives;
  unsigned char caseless[MAX_DEPTH + 1]; /* per open group; [depth] is the current scope */
  int depth;
  char *err;
  size_t errcap;
  int failed;
} xlat;

static int fail(xlat *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(xlat *x, const char *fmt, ...) {
  if (!x->failed) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->err, x->errcap, fmt, ap);
    va_end(ap);
  }
  x->failed = 1;
  return 0;
}

static int hexval(char c) {
  return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* "\uHHHH" at at: the code point, or -1. */
static long ruby_u(const xlat *x, size_t at) {
  if (at + 6 > x->n || x->pat[at + 1] != 'u') return -1;
  long v = 0;
  for (int k = 2; k < 6; k++) {
    int d = hexval(x->pat[at + (size_t)k]);
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

/* The class escape at x->pat[at] ('\'): \s \S \d \D \w \W \h \H or \p{..} \P{..}, inside [...]
 * or not. Returns the bytes used, 0 when it is no class escape, or 0 with x->failed set. */
static size_t class_escape(xlat *x, size_t at, int in_bracket, citem *it) {
  const char *p = x->pat;
  char e = p[at + 1];
  memset(it, 0, sizeof *it);
  if (strchr("sSdDwWhH", e)) {
    it->negated = e >= 'A' && e <= 'Z';
    tk_uclass_escape((char)(e | 0x20), in_bracket, x->natives, &it->cls);
    return 2;
  }
  if (e != 'p' && e != 'P') return 0;
  if (at + 2 >= x->n || p[at + 2] != '{') {
    fail(x, "\\%c%c: a property without braces, which Oniguruma reads as the letters '%c%c'; write \\%c{..}", e,
         at + 2 < x->n ? p[at + 2] : ' ', e, at + 2 < x->n ? p[at + 2] : ' ', e);
    return 0;
  }
  const char *close = memchr(p + at + 3, '}', x->n - at - 3);
  if (!close) {
    fail(x, "\\%c{ without a closing brace", e);
    return 0;
  }
  const char *name = p + at + 3;
  size_t len = (size_t)(close - name);
  it->negated = e == 'P';
  if (len && name[0] == '^') {
    it->negated = !it->negated;
    name++;
    len--;
  }
  const char *cat = tk_uclass_lookup(name, len);
  if (!cat) {
    fail(x, "\\%c{%.*s}: only general categories (L, Lu, M, N, P, S, Z, C, ... and their long names) are "
            "supported, because HF's Unicode tables are used for them",
         e, (int)len, name);
    return 0;
  }
  tk_uclass_category(cat, x->natives, &it->cls);
  it->property = 1;
  return (size_t)(close - (p + at)) + 1;
}

/* Explicit ranges, surrogates left out (PCRE2's UTF mode refuses them; text never has them). */
static void put_ranges(sbuf *b, const tk_uset *s) {
  char tmp[48];
  for (size_t k = 0; k < s->n; k++) {
    uint32_t lo = s->r[k].lo, hi = s->r[k].hi;
    for (int part = 0; part < 2; part++) {
      uint32_t a = part ? (lo > 0xE000 ? lo : 0xE000) : lo, z = part ? hi : (hi < 0xD7FF ? hi : 0xD7FF);
      if (a > z) continue;
      if (a == z) snprintf(tmp, sizeof tmp, "\\x{%X}", (unsigned)a);
      else snprintf(tmp, sizeof tmp, "\\x{%X}-\\x{%X}", (unsigned)a, (unsigned)z);
      puts_(b, tmp);
    }
  }
}

static int has_text(const tk_uset *s) {
  for (size_t k = 0; k < s->n; k++)
    if (s->r[k].lo < 0xD800 || s->r[k].hi > 0xDFFF) return 1;
  return 0;
}

/* Drops from r the code points the literal members [lits] match (compiled alone by PCRE2). */
static void drop_literal_members(tk_uset *r, const char *lits, size_t lits_len) {
  sbuf pat = {0};
  puts_(&pat, "[");
  put(&pat, lits, lits_len);
  puts_(&pat, "]");
  int code;
  PCRE2_SIZE off;
  pcre2_code *re = pat.oom ? NULL : pcre2_compile((PCRE2_SPTR)pat.p, pat.len, PCRE2_UTF | PCRE2_UCP, &code, &off, NULL);
  pcre2_match_data *md = re ? pcre2_match_data_create(1, NULL) : NULL;
  free(pat.p);
  if (!md) {
    pcre2_code_free(re);
    return; /* compile errors surface with the whole pattern */
  }
  tk_uset keep = {0};
  for (size_t k = 0; k < r->n; k++)
    for (uint32_t c = r->r[k].lo; c <= r->r[k].hi; c++) {
      unsigned char u[4];
      size_t ul = c >= 0xD800 && c <= 0xDFFF ? 0 : tk_utf8_encode(c, u);
      if (!ul || pcre2_match(re, u, ul, 0, PCRE2_ANCHORED, md, NULL) < 0) tk_uset_add(&keep, c, c);
    }
  tk_uset_normalize(&keep);
  tk_uset_free(r);
  *r = keep;
  pcre2_match_data_free(md);
  pcre2_code_free(re);
}

/* Writes [(^)lits items...] as PCRE2 syntax matching what HF matches:
 *   [body] or [^body], body = lits, the native spellings, the code points HF adds;
 *   when a native spelling matches code points HF's class does not (R):
 *   (?:(?![R])[body]) or (?:[^body]|[R]). */
static void render(sbuf *o, int neg, const char *lits, size_t lits_len, citem *items, size_t n_items) {
  /* [^\S] is [\s], a lone \S is [^\s], ...: a positive native spelling needs no exceptions
   * where HF's tables only add code points. */
  if (!lits_len && n_items == 1 && items[0].negated) {
    neg = !neg;
    items[0].negated = 0;
  }
  tk_uset want = {0}, nat = {0}, add = {0}, rem = {0}, tmp = {0};
  sbuf natives = {0};
  put(&natives, "", 0);
  for (size_t k = 0; k < n_items; k++) {
    citem *it = &items[k];
    if (it->negated) {
      tk_uset_complement(&tmp, &it->cls.hf);
      tk_uset_add_set(&want, &tmp);
    } else {
      tk_uset_add_set(&want, &it->cls.hf);
    }
    /* A native spelling: as given, or negated when it is one property. */
    int one_prop = it->cls.native[0] && !strchr(it->cls.native + 1, '\\');
    if (it->cls.native[0] && (!it->negated || one_prop)) {
      if (it->negated) {
        char neg_prop[sizeof it->cls.native];
        snprintf(neg_prop, sizeof neg_prop, "%s", it->cls.native);
        neg_prop[1] = 'P';
        puts_(&natives, neg_prop);
        tk_uset_complement(&tmp, &it->cls.native_set);
        tk_uset_add_set(&nat, &tmp);
      } else {
        puts_(&natives, it->cls.native);
        tk_uset_add_set(&nat, &it->cls.native_set);
      }
    }
  }
  tk_uset_subtract(&add, &want, &nat);
  tk_uset_subtract(&rem, &nat, &want);
  if (has_text(&rem) && lits_len) drop_literal_members(&rem, lits, lits_len);
  sbuf body = {0};
  put(&body, lits, lits_len);
  puts_(&body, natives.p);
  put_ranges(&body, &add);
  if (!body.len) {
    puts_(o, neg ? "(?s:.)" : "(?!)");
  } else if (!has_text(&rem)) {
    puts_(o, neg ? "[^" : "[");
    puts_(o, body.p);
    puts_(o, "]");
  } else {
    puts_(o, neg ? "(?:[^" : "(?:(?![");
    if (!neg) put_ranges(o, &rem), puts_(o, "])[");
    puts_(o, body.p);
    puts_(o, neg ? "]|[" : "])");
    if (neg) put_ranges(o, &rem), puts_(o, "])");
  }
  if (want.oom || nat.oom || add.oom || rem.oom || tmp.oom || natives.oom || body.oom) o->oom = 1;
  tk_uset_free(&want);
  tk_uset_free(&nat);
  tk_uset_free(&add);
  tk_uset_free(&rem);
  tk_uset_free(&tmp);
  free(natives.p);
  free(body.p);
}

static void free_items(citem *items, size_t n) {
  for (size_t k = 0; k < n; k++) tk_uclass_free(&items[k].cls);
}

/* \b / \B: lookarounds on HF's \w. */
static void word_boundary(xlat *x, int non_boundary) {
  citem w;
  memset(&w, 0, sizeof w);
  tk_uclass_escape('w', 0, x->natives, &w.cls);
  sbuf W = {0};
  render(&W, 0, "", 0, &w, 1);
  tk_uclass_free(&w.cls);
  if (W.oom) {
    x->out.oom = 1;
    free(W.p);
    return;
  }
  const char *parts[] = {"(?:(?<=", W.p, non_boundary ? ")(?=" : ")(?!", W.p, ")|(?<!", W.p,
                         non_boundary ? ")(?!" : ")(?=", W.p, "))"};
  for (size_t k = 0; k < sizeof parts / sizeof parts[0]; k++) puts_(&x->out, parts[k]);
  free(W.p);
}

/* [...] at x->i; leaves x->i at its ']'. */
static int bracket(xlat *x) {
  const char *p = x->pat;
  size_t i = x->i + 1;
  int neg = 0, first = 1;
  if (i < x->n && p[i] == '^') {
    neg = 1;
    i++;
  }
  sbuf lits = {0};
  put(&lits, "", 0);
  citem items[MAX_ITEMS];
  size_t n_items = 0;
  while (i < x->n && !x->failed) {
    char c = p[i];
    if (c == ']' && !first) break;
    first = 0;
    long u;
    if (c == '\\' && i + 1 < x->n) {
      size_t used;
      if (n_items == MAX_ITEMS) {
        fail(x, "more than %d classes inside one [...]", MAX_ITEMS);
      } else if ((used = class_escape(x, i, 1, &items[n_items])) > 0) {
        n_items++;
        i += used;
      } else if (!x->failed && (u = ruby_u(x, i)) >= 0) {
        char tmp[32];
        snprintf(tmp, sizeof tmp, "\\x{%X}", (unsigned)(u & 0xFFFF));
        puts_(&lits, tmp);
        i += 6;
      } else if (!x->failed) {
        if (p[i + 1] == 'v') puts_(&lits, "\\x{B}"); /* Ruby: the vertical tab */
        else if (p[i + 1] == 'V') puts_(&lits, "V");
        else put(&lits, p + i, 2);
        i += 2;
      }
      continue;
    }
    if (c == '[') {
      if (i + 1 < x->n && p[i + 1] == ':') {
        const char *end = strstr(p + i + 2, ":]");
        int len = end ? (int)(end - (p + i)) + 2 : 2;
        fail(x, "%.*s: POSIX bracket classes are not supported (their Unicode sets differ between HF and PCRE2)", len,
             p + i);
      } else {
        fail(x, "a nested character class ([...[...]...]) is not supported");
      }
      break;
    }
    if (c == '&' && i + 1 < x->n && p[i + 1] == '&') {
      fail(x, "class intersection (&&) inside [...] is not supported");
      break;
    }
    /* A bare '^' first would negate the rebuilt class, a bare '-' last would make a range
     * with what follows it: escape both. */
    if (c == '^' && lits.len == 0) puts_(&lits, "\\^");
    else if (c == '-' && i + 1 < x->n && p[i + 1] == ']') puts_(&lits, "\\-");
    else put(&lits, &c, 1);
    i++;
  }
  if (!x->failed && i >= x->n) fail(x, "a character class without its closing ']'");
  for (size_t k = 0; k < n_items && !x->failed; k++)
    if (items[k].property && x->caseless[x->depth])
      fail(x, "a \\p{..} class under (?i) is not supported (Oniguruma folds its case, PCRE2 does not)");
  if (!x->failed) {
    if (!n_items) {
      puts_(&x->out, neg ? "[^" : "[");
      puts_(&x->out, lits.p);
      puts_(&x->out, "]");
    } else {
      render(&x->out, neg, lits.p, lits.len, items, n_items);
    }
  }
  if (lits.oom) x->out.oom = 1;
  free_items(items, n_items);
  free(lits.p);
  x->i = i;
  return !x->failed;
}

/* '(' at x->i: tracks (?i) scopes and writes Ruby's (?m) as PCRE2's (?s). Leaves x->i at the
 * last byte consumed. */
static int group(xlat *x) {
  const char *p = x->pat;
  size_t i = x->i;
  if (x->depth == MAX_DEPTH) return fail(x, "groups nested deeper than %d", MAX_DEPTH);
  int caseless = x->caseless[x->depth];
  if (i + 1 >= x->n || p[i + 1] != '?') {
    x->caseless[++x->depth] = (unsigned char)caseless;
    puts_(&x->out, "(");
    return 1;
  }
  size_t j = i + 2;
  if (j < x->n && p[j] == '#') { /* a comment: copied through its ')' */
    const char *end = memchr(p + j, ')', x->n - j);
    size_t stop = end ? (size_t)(end - p) : x->n - 1;
    put(&x->out, p + i, stop - i + 1);
    x->i = stop;
    return 1;
  }
  size_t k = j;
  while (k < x->n && ((p[k] >= 'a' && p[k] <= 'z') || (p[k] >= 'A' && p[k] <= 'Z') || p[k] == '-')) k++;
  if (k > j && k < x->n && (p[k] == ')' || p[k] == ':')) { /* options: (?imx-imx) or (?imx-imx:...) */
    int on = 1, ci = caseless;
    puts_(&x->out, "(?");
    for (size_t f = j; f < k; f++) {
      char c = p[f];
      if (!strchr("imx-", c)) return fail(x, "group option '%c' in (?%.*s) is not one of Oniguruma's i, m, x", c,
                                          (int)(k - j + 1), p + j);
      if (c == '-') on = 0;
      else if (c == 'i') ci = on;
      put(&x->out, c == 'm' ? "s" : &p[f], 1); /* Ruby's m is dot-all */
    }
    put(&x->out, &p[k], 1);
    if (p[k] == ')') x->caseless[x->depth] = (unsigned char)ci;
    else x->caseless[++x->depth] = (unsigned char)ci;
    x->i = k;
    return 1;
  }
  x->caseless[++x->depth] = (unsigned char)caseless; /* (?: (?= (?! (?<= (?<! (?> (?<name> */
  puts_(&x->out, "(?");
  x->i = i + 1;
  return 1;
}

char *tk_regex_translate(const char *pattern, int natives, char *err, size_t errcap) {
  xlat x;
  memset(&x, 0, sizeof x);
  x.pat = pattern;
  x.n = strlen(pattern);
  x.natives = natives;
  x.err = err;
  x.errcap = errcap;
  put(&x.out, "", 0);
  for (x.i = 0; x.i < x.n && !x.failed; x.i++) {
    const char *p = x.pat;
    char c = p[x.i];
    if (c == '\\' && x.i + 1 < x.n) {
      char e = p[x.i + 1];
      citem it;
      size_t used;
      long u;
      if ((used = class_escape(&x, x.i, 0, &it)) > 0) {
        if (it.property && x.caseless[x.depth])
          fail(&x, "a \\p{..} class under (?i) is not supported (Oniguruma folds its case, PCRE2 does not)");
        else render(&x.out, 0, "", 0, &it, 1);
        tk_uclass_free(&it.cls);
        x.i += used - 1;
      } else if (x.failed) {
        break;
      } else if (e == 'b' || e == 'B') {
        word_boundary(&x, e == 'B');
        x.i++;
      } else if (e == 'X' || e == 'y' || e == 'Y') {
        fail(&x, "\\%c (grapheme cluster / text segment boundaries) is not supported: its rules follow the Unicode "
                 "version", e);
      } else if ((u = ruby_u(&x, x.i)) >= 0) {
        char tmp[32];
        snprintf(tmp, sizeof tmp, "\\x{%X}", (unsigned)(u & 0xFFFF));
        puts_(&x.out, tmp);
        x.i += 5;
      } else {
        if (e == 'v') puts_(&x.out, "\\x{B}"); /* Ruby: the vertical tab, the letter V, any character */
        else if (e == 'V') puts_(&x.out, "V");
        else if (e == 'O') puts_(&x.out, "(?s:.)");
        else put(&x.out, p + x.i, 2);
        x.i++;
      }
    } else if (c == '[') {
      bracket(&x);
    } else if (c == '(') {
      group(&x);
    } else {
      if (c == ')' && x.depth > 0) x.depth--;
      put(&x.out, &c, 1);
    }
  }
  if (x.out.oom && !x.failed) fail(&x, "out of memory");
  if (x.failed) {
    free(x.out.p);
    return NULL;
  }
  return x.out.p;
}

static pcre2_code *compile_raw(const char *pat, size_t len, uint32_t opts, int *jit, char *err, size_t errcap) {
  int code;
  PCRE2_SIZE off;
  pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
  if (!cc) {
    snprintf(err, errcap, "out of memory");
    return NULL;
  }
  pcre2_set_newline(cc, PCRE2_NEWLINE_LF); /* Oniguruma: only '\n' ends a line */
  pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, len, opts, &code, &off, cc);
  pcre2_compile_context_free(cc);
  if (!re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(code, msg, sizeof msg);
    snprintf(err, errcap, "cannot compile the regex: %s (at offset %zu of the translated pattern)",
             (const char *)msg, (size_t)off);
  } else if (pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0) {
    *jit = 1; /* without JIT (unsupported CPU), pcre2_match is used: same results, slower */
  }
  return re;
}

pcre2_code *tk_regex_compile(const char *pattern, int literal, int *jit, char *err, size_t errcap) {
  *jit = 0;
  if (literal) /* PCRE2_LITERAL accepts neither UCP nor MULTILINE, and needs neither */
    return compile_raw(pattern, strlen(pattern), PCRE2_UTF | PCRE2_LITERAL, jit, err, errcap);
  char *pat = tk_regex_translate(pattern, tk_uclass_natives_usable(), err, errcap);
  if (!pat) return NULL;
  /* Ruby syntax (Oniguruma's default) has multi-line anchors: ^ and $ match at line breaks. */
  pcre2_code *re = compile_raw(pat, strlen(pat), PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, jit, err, errcap);
  free(pat);
  return re;
}

pcre2_code *tk_regex_compile_single_word(int *jit, char *err, size_t errcap) {
  *jit = 0;
  citem w;
  memset(&w, 0, sizeof w);
  tk_uclass_single_word(tk_uclass_natives_usable(), &w.cls);
  sbuf b = {0};
  render(&b, 0, "", 0, &w, 1);
  tk_uclass_free(&w.cls);
  pcre2_code *re = b.oom ? NULL : compile_raw(b.p, b.len, PCRE2_UTF | PCRE2_UCP, jit, err, errcap);
  if (b.oom) snprintf(err, errcap, "out of memory");
  free(b.p);
  return re;
}
