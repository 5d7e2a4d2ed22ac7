/* HF's regex classes from the generated tables, and their PCRE2 spellings (tok_uclass.h). */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "text/tok_internal.h" /* pcre2.h, configured for 8-bit code units */
#include "text/tok_uclass.h"

static const struct {
  const char *name;
  const char *members; /* leaf categories, space separated */
} k_aggregates[] = {
    {"L", "Lu Ll Lt Lm Lo"}, {"LC", "Lu Ll Lt"},  {"M", "Mn Mc Me"}, {"N", "Nd Nl No"},
    {"P", "Pc Pd Ps Pe Pi Pf Po"}, {"S", "Sm Sc Sk So"}, {"Z", "Zs Zl Zp"}, {"C", "Cc Cf Cs Co Cn"},
};

void tk_uclass_free(tk_uclass *c) {
  tk_uset_free(&c->hf);
  tk_uset_free(&c->native_set);
  c->native[0] = 0;
}

int tk_uclass_natives_usable(void) {
  char v[64] = {0};
  if (pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, v) < 0) return 0;
  return !strcmp(v, tk_uprops_pcre2_unicode);
}

const char *tk_uclass_lookup(const char *name, size_t len) {
  char key[64];
  size_t k = 0;
  for (size_t i = 0; i < len; i++) {
    char c = name[i];
    if (c == '_' || c == ' ' || c == '-') continue;
    if (k + 1 >= sizeof key) return NULL;
    key[k++] = (char)tolower((unsigned char)c);
  }
  key[k] = 0;
  for (size_t i = 0; i < tk_ugc_names_n; i++)
    if (!strcmp(key, tk_ugc_names[i].key)) return tk_ugc_names[i].cat;
  return NULL;
}

static const tk_ugc *leaf(const char *name, size_t len) {
  for (size_t i = 0; i < tk_ugc_leaves_n; i++)
    if (strlen(tk_ugc_leaves[i].name) == len && !memcmp(tk_ugc_leaves[i].name, name, len)) return &tk_ugc_leaves[i];
  return NULL;
}

/* Every measured leaf (all but Cn and Cs), HF's or PCRE2's. */
static void all_leaves(int native, tk_uset *out);

/* One leaf category into hf (HF's set) and, when nat, nat (PCRE2's). */
static void add_leaf(const char *name, size_t len, tk_uset *hf, tk_uset *nat) {
  if (len == 2 && !memcmp(name, "Cs", 2)) {
    tk_uset_add(hf, 0xD800, 0xDFFF);
    tk_uset_normalize(hf);
    if (nat) {
      tk_uset_add(nat, 0xD800, 0xDFFF);
      tk_uset_normalize(nat);
    }
    return;
  }
  if (len == 2 && !memcmp(name, "Cn", 2)) { /* the complement of every other category */
    for (int side = 0; side < (nat ? 2 : 1); side++) {
      tk_uset assigned = {0}, rest = {0};
      all_leaves(side, &assigned);
      tk_uset_add(&assigned, 0xD800, 0xDFFF);
      tk_uset_normalize(&assigned);
      tk_uset_complement(&rest, &assigned);
      tk_uset_add_set(side ? nat : hf, &rest);
      tk_uset_free(&assigned);
      tk_uset_free(&rest);
    }
    return;
  }
  const tk_ugc *g = leaf(name, len);
  if (!g) return; /* not reached: the names come from the generated index */
  tk_uset_add_table(hf, g->hf, *g->n_hf);
  if (nat) { /* PCRE2's = (HF's - add) + rem */
    tk_uset own = {0}, add = {0};
    tk_uset_add_table(&own, g->hf, *g->n_hf);
    tk_uset_add_table(&add, g->add, *g->n_add);
    tk_uset_subtract(&own, &own, &add);
    tk_uset_add_table(&own, g->rem, *g->n_rem);
    tk_uset_add_set(nat, &own);
    tk_uset_free(&own);
    tk_uset_free(&add);
  }
}

static void all_leaves(int native, tk_uset *out) {
  for (size_t i = 0; i < tk_ugc_leaves_n; i++) {
    tk_uset hf = {0}, nat = {0};
    add_leaf(tk_ugc_leaves[i].name, strlen(tk_ugc_leaves[i].name), &hf, native ? &nat : NULL);
    tk_uset_add_set(out, native ? &nat : &hf);
    tk_uset_free(&hf);
    tk_uset_free(&nat);
  }
}

/* Adds the categories of cat (a leaf or an aggregate) to hf and nat. */
static void add_category(const char *cat, tk_uset *hf, tk_uset *nat) {
  for (size_t a = 0; a < sizeof k_aggregates / sizeof k_aggregates[0]; a++) {
    if (strcmp(cat, k_aggregates[a].name)) continue;
    for (const char *p = k_aggregates[a].members; *p;) {
      size_t n = strcspn(p, " ");
      add_leaf(p, n, hf, nat);
      p += n;
      if (*p == ' ') p++;
    }
    return;
  }
  add_leaf(cat, strlen(cat), hf, nat);
}

void tk_uclass_category(const char *cat, int natives, tk_uclass *out) {
  memset(out, 0, sizeof *out);
  add_category(cat, &out->hf, natives ? &out->native_set : NULL);
  if (natives) {
    if (!strcmp(cat, "LC")) snprintf(out->native, sizeof out->native, "\\p{Lu}\\p{Ll}\\p{Lt}");
    else snprintf(out->native, sizeof out->native, "\\p{%s}", cat);
  }
}

/* \w: L|M|Nd|Nl|Pc plus add minus rem; natively the five properties. */
static void word(const tk_urange *add, size_t n_add, const tk_urange *rem, size_t n_rem, int natives, tk_uclass *out) {
  static const char *const base[] = {"L", "M", "Nd", "Nl", "Pc"};
  memset(out, 0, sizeof *out);
  for (size_t i = 0; i < 5; i++) add_category(base[i], &out->hf, natives ? &out->native_set : NULL);
  tk_uset a = {0}, r = {0};
  tk_uset_add_table(&a, add, n_add);
  tk_uset_add_table(&r, rem, n_rem);
  tk_uset_add_set(&out->hf, &a);
  tk_uset_subtract(&out->hf, &out->hf, &r);
  tk_uset_free(&a);
  tk_uset_free(&r);
  if (natives) snprintf(out->native, sizeof out->native, "\\p{L}\\p{M}\\p{Nd}\\p{Nl}\\p{Pc}");
}

void tk_uclass_escape(char e, int in_bracket, int natives, tk_uclass *out) {
  memset(out, 0, sizeof *out);
  if (e == 'd') {
    tk_uclass_category("Nd", natives, out);
  } else if (e == 'w' && in_bracket) {
    word(tk_uesc_wb_add, tk_uesc_wb_add_n, tk_uesc_wb_rem, tk_uesc_wb_rem_n, natives, out);
  } else if (e == 'w') {
    word(tk_uesc_w_add, tk_uesc_w_add_n, tk_uesc_w_rem, tk_uesc_w_rem_n, natives, out);
  } else if (e == 's') {
    tk_uset_add_table(&out->hf, tk_uesc_s, tk_uesc_s_n);
  } else if (e == 'h') {
    tk_uset_add_table(&out->hf, tk_uesc_h, tk_uesc_h_n);
  } else if (e == 'v') {
    tk_uset_add(&out->hf, 0x0B, 0x0B); /* Ruby syntax: the vertical tab alone */
  }
}

void tk_uclass_single_word(int natives, tk_uclass *out) {
  word(tk_uword_add, tk_uword_add_n, tk_uword_rem, tk_uword_rem_n, natives, out);
}
