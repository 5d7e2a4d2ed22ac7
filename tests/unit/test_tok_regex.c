/* The pre-tokenizer regex translator (src/text/tok_regex.c, issue 7 item 27):
 *   - each class written with PCRE2's own properties plus exceptions (what runs when the
 *     linked PCRE2 has the Unicode version the tables were measured with) matches exactly
 *     the same code points as the class written out as explicit ranges (what runs with any
 *     other PCRE2), on every code point where a table has an exception, the first 2048 and
 *     every 61st of the rest;
 *   - the explicit form matches HF's measured sets on code points the issue names;
 *   - constructs that cannot match what HF matches are refused, naming the construct. */
#include <string.h>

#include "test_util.h"
#include "text/tok_internal.h"
#include "text/tok_uclass.h"

static pcre2_code *compile(const char *pat) {
  int code;
  PCRE2_SIZE off;
  pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &code, &off, NULL);
  if (!re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(code, msg, sizeof msg);
    fprintf(stderr, "cannot compile %.200s...: %s at %zu\n", pat, (const char *)msg, (size_t)off);
  } else {
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
  }
  return re;
}

/* Does re match the single character c (the whole of it)? */
static int matches(pcre2_code *re, pcre2_match_data *md, uint32_t c) {
  unsigned char u[4];
  size_t n = tk_utf8_encode(c, u);
  int rc = pcre2_match(re, u, n, 0, PCRE2_ANCHORED | PCRE2_ENDANCHORED, md, NULL);
  return rc >= 0;
}

/* The code points compared: every one where some table has an exception (and its
 * neighbours), the first 2048, and every 61st of the rest. */
static tk_uset g_probe;

static void build_probe(void) {
  for (size_t k = 0; k < tk_ugc_leaves_n; k++) {
    const tk_ugc *g = &tk_ugc_leaves[k];
    for (size_t i = 0; i < *g->n_add; i++) tk_uset_add(&g_probe, g->add[i].lo ? g->add[i].lo - 1 : 0, g->add[i].hi + 1);
    for (size_t i = 0; i < *g->n_rem; i++) tk_uset_add(&g_probe, g->rem[i].lo ? g->rem[i].lo - 1 : 0, g->rem[i].hi + 1);
  }
  tk_uset_add(&g_probe, 0, 0x7FF);
  for (uint32_t c = 0; c <= TK_MAX_CP; c += 61) tk_uset_add(&g_probe, c, c);
  tk_uset_add_table(&g_probe, tk_uword_add, tk_uword_add_n);
  tk_uset_add_table(&g_probe, tk_uesc_w_add, tk_uesc_w_add_n);
  tk_uset_normalize(&g_probe);
}

static int probe(uint32_t c) { return !(c >= 0xD800 && c <= 0xDFFF) && tk_uset_contains(&g_probe, c); }

static void test_natives_equal_explicit(void) {
  static const char *const pats[] = {
      "\\p{L}", "\\p{Lu}", "\\p{Ll}", "\\p{Lt}", "\\p{Lm}", "\\p{Lo}", "\\p{LC}", "\\p{M}", "\\p{Mn}", "\\p{N}",
      "\\p{Nd}", "\\p{No}", "\\p{P}", "\\p{Po}", "\\p{S}", "\\p{So}", "\\p{Sk}", "\\p{Z}", "\\p{C}", "\\p{Cn}",
      "\\p{Cf}", "\\P{L}", "\\p{^M}", "\\P{^N}", "\\s", "\\S", "\\d", "\\D", "\\w", "\\W", "\\h", "\\H",
      "[^\\s\\p{L}\\p{N}]", "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]", "[^\\r\\n\\p{L}\\p{P}\\p{S}]", "[\\p{P}\\p{S}]",
      "[\\P{L}x]", "[\\S\\d]", "[^\\S\\p{Cn}]", "[\\W\\p{Cn}a-c]", "[\\p{Other_Letter}\\p{Symbol}-]",
      "[\\P{Cn}\\x{E0001}]", "[\\p{L}^]",
  };
  pcre2_match_data *md = pcre2_match_data_create(1, NULL);
  for (size_t k = 0; k < sizeof pats / sizeof pats[0]; k++) {
    char err[512];
    char *a = tk_regex_translate(pats[k], 1, err, sizeof err), *b = tk_regex_translate(pats[k], 0, err, sizeof err);
    EXPECT(a && b);
    pcre2_code *ra = a ? compile(a) : NULL, *rb = b ? compile(b) : NULL;
    EXPECT(ra && rb);
    size_t diffs = 0;
    for (uint32_t c = 0; ra && rb && c <= TK_MAX_CP; c++) {
      if (!probe(c) || matches(ra, md, c) == matches(rb, md, c)) continue;
      if (diffs++ < 3) fprintf(stderr, "%s: U+%04X: native form %d, explicit form %d\n", pats[k], (unsigned)c,
                               matches(ra, md, c), matches(rb, md, c));
    }
    EXPECT(diffs == 0);
    pcre2_code_free(ra);
    pcre2_code_free(rb);
    free(a);
    free(b);
  }
  pcre2_match_data_free(md);
}

/* Code points the issue names (Unicode 15-16 characters PCRE2 10.42 does not know). */
static void test_hf_sets(void) {
  static const struct {
    const char *pat;
    uint32_t c;
    int want;
  } cases[] = {
      {"\\p{M}", 0x0CF3, 1}, {"\\p{M}", 0x11F00, 1}, {"\\p{S}", 0x1F6DC, 1}, {"\\p{So}", 0x1F6DC, 1},
      {"[^\\r\\n\\p{L}\\p{P}\\p{S}]", 0x1F6DC, 0}, {"\\P{S}", 0x1F6DC, 0}, {"\\p{Lu}", 0x1C89, 1},
      {"\\p{Ll}", 0x1C8A, 1}, {"\\p{Cn}", 0x1F6DC, 0}, {"\\p{Cn}", 0x0378, 1}, {"\\p{P}", 0x1B4E, 1},
      {"\\s", 0x180E, 0}, {"\\s", 0x3000, 1}, {"\\h", 'f', 1}, {"\\h", ' ', 0}, {"\\d", 0x1E5F1, 1},
      {"\\w", 0x24B6, 1}, {"\\w", 0x0CF3, 1}, {"\\w", 0xB2, 1}, {"[\\w]", 0xB2, 0}, {"[\\W]", 0xB2, 1}, {"\\W", '-', 1}, {"\\v", 0x0B, 1}, {"\\v", '\n', 0},
      {"\\V", 'V', 1}, {"\\V", 'a', 0}, {"\\u0041", 'A', 1}, {"[\\u0041-\\u0043]", 'B', 1},
  };
  pcre2_match_data *md = pcre2_match_data_create(1, NULL);
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
    for (int natives = 0; natives < 2; natives++) {
      char err[512];
      char *t = tk_regex_translate(cases[k].pat, natives, err, sizeof err);
      pcre2_code *re = t ? compile(t) : NULL;
      int got = re ? matches(re, md, cases[k].c) : -1;
      if (got != cases[k].want)
        fprintf(stderr, "%s on U+%04X: %d, expected %d (natives %d)\n", cases[k].pat, (unsigned)cases[k].c, got,
                cases[k].want, natives);
      EXPECT(got == cases[k].want);
      pcre2_code_free(re);
      free(t);
    }
  pcre2_match_data_free(md);
}

static void test_refused(void) {
  static const struct {
    const char *pat, *needle;
  } cases[] = {
      {"\\p{Han}+", "\\p{Han}"},        {"[[:alpha:]]", "[:alpha:]"},     {"\\X", "\\X"},
      {"\\pL", "\\pL"},                 {"(?i)\\p{Lu}", "(?i)"},          {"(?i:[\\p{Ll}x])", "(?i)"},
      {"[a-z&&[^aeiou]]", "&&"},        {"[a[b]]", "nested"},            {"(?s).", "'s'"},
      {"\\p{L", "closing brace"},       {"[\\p{L}", "']'"},               {"\\p{Alphabetic}", "Alphabetic"},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    char err[512] = "";
    char *t = tk_regex_translate(cases[k].pat, 1, err, sizeof err);
    if (t || !strstr(err, cases[k].needle))
      fprintf(stderr, "%s: translated to %s, error '%s' (expected a refusal naming %s)\n", cases[k].pat,
              t ? t : "(null)", err, cases[k].needle);
    EXPECT(!t && strstr(err, cases[k].needle));
    free(t);
  }
  /* Accepted: case-insensitive literals and escapes (Llama-3's contractions), \b. */
  static const char *const ok[] = {"(?i:'s|'t|'re)", "(?i)\\w+\\b", "(?m:.)", "(?#note)a", "(?<n>x)\\k<n>"};
  for (size_t k = 0; k < sizeof ok / sizeof ok[0]; k++) {
    char err[512] = "";
    char *t = tk_regex_translate(ok[k], 1, err, sizeof err);
    if (!t) fprintf(stderr, "%s refused: %s\n", ok[k], err);
    EXPECT(t != NULL);
    free(t);
  }
}

int main(void) {
  build_probe();
  TEST_RUN(test_natives_equal_explicit);
  TEST_RUN(test_hf_sets);
  TEST_RUN(test_refused);
  tk_uset_free(&g_probe);
  return TEST_RESULT();
}
