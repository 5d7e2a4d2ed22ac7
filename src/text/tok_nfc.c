/* NFC normalization (UAX #15) for the tokenizer's "NFC" normalizer (Qwen2/Qwen3).
 *
 * Most text is already NFC, so the work is a quick check: per code point a flags byte says
 * whether it may change under NFC (quick-check No/Maybe, or a non-zero combining class out
 * of order). Only the segments around such code points, from the last stable starter to the
 * next one, are decomposed, canonically reordered and recomposed. The data (combining
 * classes, one-level canonical decompositions) is in tok_unicode_data.c, generated to match
 * HF tokenizers' NFC exactly. */
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"

enum { F_NO = 1, F_MAYBE = 2, F_CCC = 4 };

/* Hangul syllables are composed algorithmically (Unicode chapter 3.12). */
enum {
  S_BASE = 0xAC00, L_BASE = 0x1100, V_BASE = 0x1161, T_BASE = 0x11A7,
  L_COUNT = 19, V_COUNT = 21, T_COUNT = 28, N_COUNT = V_COUNT * T_COUNT, S_COUNT = L_COUNT * N_COUNT
};

struct tk_nfc {
  uint8_t flags[0x10000]; /* BMP code point -> F_* */
  uint8_t ccc[0x10000];   /* BMP code point -> canonical combining class */
  uint32_t *supp_maybe;   /* sorted supplementary code points that compose with a previous one */
  size_t n_supp_maybe;
  tk_pairmap compose;     /* (first, second) -> primary composite */
};

static uint8_t ccc_search(uint32_t cp) {
  size_t lo = 0, hi = tk_ccc_count;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (cp < tk_ccc_ranges[mid].first) hi = mid;
    else if (cp > tk_ccc_ranges[mid].last) lo = mid + 1;
    else return tk_ccc_ranges[mid].ccc;
  }
  return 0;
}

static const tk_decomp *decomp_search(uint32_t cp) {
  size_t lo = 0, hi = tk_decomp_count;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (cp < tk_decomps[mid].cp) hi = mid;
    else if (cp > tk_decomps[mid].cp) lo = mid + 1;
    else return &tk_decomps[mid];
  }
  return NULL;
}

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return (x > y) - (x < y);
}

ds_status tk_nfc_build(tk_nfc **out) {
  *out = NULL;
  tk_nfc *n = calloc(1, sizeof *n);
  if (!n) return DS_FAIL(DS_ERR_NOMEM, "cannot allocate the NFC tables");
  ds_status st = DS_OK;
  for (size_t i = 0; i < tk_ccc_count; i++)
    for (uint32_t c = tk_ccc_ranges[i].first; c <= tk_ccc_ranges[i].last && c < 0x10000; c++) {
      n->ccc[c] = tk_ccc_ranges[i].ccc;
      n->flags[c] |= F_CCC;
    }
  size_t n_maybe = 0;
  for (size_t i = 0; i < tk_decomp_count; i++) {
    const tk_decomp *d = &tk_decomps[i];
    if (d->excluded) {
      if (d->cp < 0x10000) n->flags[d->cp] |= F_NO;
    } else if (d->b) {
      if ((st = tk_pairmap_put(&n->compose, d->a, d->b, 0, (int32_t)d->cp)) != DS_OK) goto fail;
      if (d->b < 0x10000) n->flags[d->b] |= F_MAYBE;
      else n_maybe++;
    }
  }
  for (uint32_t c = V_BASE; c < V_BASE + V_COUNT; c++) n->flags[c] |= F_MAYBE;
  for (uint32_t c = T_BASE + 1; c < T_BASE + T_COUNT; c++) n->flags[c] |= F_MAYBE;
  n->supp_maybe = malloc((n_maybe ? n_maybe : 1) * sizeof *n->supp_maybe);
  if (!n->supp_maybe) { st = DS_FAIL(DS_ERR_NOMEM, "cannot allocate the NFC tables"); goto fail; }
  for (size_t i = 0; i < tk_decomp_count; i++)
    if (!tk_decomps[i].excluded && tk_decomps[i].b >= 0x10000)
      n->supp_maybe[n->n_supp_maybe++] = tk_decomps[i].b;
  qsort(n->supp_maybe, n->n_supp_maybe, sizeof *n->supp_maybe, cmp_u32);
  *out = n;
  return DS_OK;
fail:
  tk_nfc_free(n);
  return st;
}

void tk_nfc_free(tk_nfc *n) {
  if (!n) return;
  free(n->supp_maybe);
  tk_pairmap_free(&n->compose);
  free(n);
}

static uint8_t get_ccc(const tk_nfc *n, uint32_t cp) { return cp < 0x10000 ? n->ccc[cp] : ccc_search(cp); }

static uint8_t get_flags(const tk_nfc *n, uint32_t cp) {
  if (cp < 0x10000) return n->flags[cp];
  uint8_t f = ccc_search(cp) ? F_CCC : 0;
  const tk_decomp *d = decomp_search(cp);
  if (d && d->excluded) f |= F_NO;
  if (bsearch(&cp, n->supp_maybe, n->n_supp_maybe, sizeof cp, cmp_u32)) f |= F_MAYBE;
  return f;
}

/* Decodes the code point at s[i]; code points below U+0300 (lead byte < 0xCC) are all
 * stable starters, which the callers test first without decoding. */
static uint32_t next_cp(const unsigned char *s, size_t i, size_t *len) { return tk_utf8_decode(s + i, len); }

int tk_nfc_is_quick(const tk_nfc *n, const unsigned char *s, size_t len) {
  uint8_t last_ccc = 0;
  size_t i = 0;
  while (i < len) {
    while (i + 8 <= len) { /* ASCII eight bytes at a time */
      uint64_t v;
      memcpy(&v, s + i, 8);
      if (v & 0x8080808080808080ull) break;
      i += 8;
      last_ccc = 0;
    }
    if (i >= len) break;
    unsigned char b = s[i];
    if (b < 0xCC) {
      i += b < 0x80 ? 1 : 2;
      last_ccc = 0;
      continue;
    }
    size_t l;
    uint32_t cp = next_cp(s, i, &l);
    uint8_t f = get_flags(n, cp);
    if (f & (F_NO | F_MAYBE)) return 0;
    uint8_t c = (f & F_CCC) ? get_ccc(n, cp) : 0;
    if (c && c < last_ccc) return 0;
    last_ccc = c;
    i += l;
  }
  return 1;
}

/* ---- the slow path: one segment ---- */

typedef struct {
  uint32_t *v;
  size_t len, cap;
} cp_vec;

static ds_status cp_push(cp_vec *a, uint32_t cp) {
  if (a->len == a->cap) {
    size_t cap = a->cap ? a->cap * 2 : 64;
    uint32_t *v = realloc(a->v, cap * sizeof *v);
    if (!v) return DS_FAIL(DS_ERR_NOMEM, "cannot grow the NFC buffer");
    a->v = v;
    a->cap = cap;
  }
  a->v[a->len++] = cp;
  return DS_OK;
}

static ds_status decompose(cp_vec *a, uint32_t cp, int depth) {
  if (cp >= S_BASE && cp < S_BASE + S_COUNT) {
    uint32_t s = cp - S_BASE;
    DS_TRY(cp_push(a, L_BASE + s / N_COUNT));
    DS_TRY(cp_push(a, V_BASE + (s % N_COUNT) / T_COUNT));
    if (s % T_COUNT) DS_TRY(cp_push(a, T_BASE + s % T_COUNT));
    return DS_OK;
  }
  const tk_decomp *d = depth < 8 ? decomp_search(cp) : NULL; /* real depth is <= 4 */
  if (!d) return cp_push(a, cp);
  DS_TRY(decompose(a, d->a, depth + 1));
  return d->b ? decompose(a, d->b, depth + 1) : DS_OK;
}

static uint32_t compose_pair(const tk_nfc *n, uint32_t a, uint32_t b) {
  if (a >= L_BASE && a < L_BASE + L_COUNT && b >= V_BASE && b < V_BASE + V_COUNT)
    return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT;
  if (a >= S_BASE && a < S_BASE + S_COUNT && (a - S_BASE) % T_COUNT == 0 && b > T_BASE &&
      b < T_BASE + T_COUNT)
    return a + (b - T_BASE);
  uint32_t rank;
  int32_t c;
  return tk_pairmap_get(&n->compose, a, b, &rank, &c) ? (uint32_t)c : 0;
}

/* Stable sort of a run of non-starters by combining class: insertion sort for the usual
 * few marks, a counting sort for long runs (a text of 100k stacked marks stays linear). */
static ds_status sort_run(const tk_nfc *n, uint32_t *v, size_t len) {
  if (len <= 16) {
    for (size_t i = 1; i < len; i++) {
      uint32_t cp = v[i];
      uint8_t c = get_ccc(n, cp);
      size_t j = i;
      while (j > 0 && get_ccc(n, v[j - 1]) > c) { v[j] = v[j - 1]; j--; }
      v[j] = cp;
    }
    return DS_OK;
  }
  size_t start[257] = {0};
  for (size_t i = 0; i < len; i++) start[get_ccc(n, v[i]) + 1]++;
  for (size_t c = 1; c < 257; c++) start[c] += start[c - 1];
  uint32_t *tmp = malloc(len * sizeof *tmp);
  if (!tmp) return DS_FAIL(DS_ERR_NOMEM, "cannot sort %zu combining marks", len);
  for (size_t i = 0; i < len; i++) tmp[start[get_ccc(n, v[i])]++] = v[i];
  memcpy(v, tmp, len * sizeof *tmp);
  free(tmp);
  return DS_OK;
}

static ds_status normalize_segment(const tk_nfc *n, const unsigned char *s, size_t len, cp_vec *a,
                                   tk_buf *out) {
  a->len = 0;
  for (size_t i = 0; i < len;) {
    size_t l;
    DS_TRY(decompose(a, next_cp(s, i, &l), 0));
    i += l;
  }
  /* Canonical ordering: a stable sort of each run of non-starters by class. */
  for (size_t i = 0; i < a->len;) {
    size_t j = i;
    while (j < a->len && get_ccc(n, a->v[j])) j++;
    if (j == i) {
      i++;
      continue;
    }
    DS_TRY(sort_run(n, a->v + i, j - i));
    i = j;
  }
  /* Canonical composition (the UAX #15 sample algorithm). */
  if (a->len) {
    size_t starter = 0, w = 1;
    int last_ccc = get_ccc(n, a->v[0]) ? 256 : 0; /* a leading non-starter blocks */
    for (size_t i = 1; i < a->len; i++) {
      uint32_t cp = a->v[i];
      int c = get_ccc(n, cp);
      uint32_t comp = compose_pair(n, a->v[starter], cp);
      if (comp && (last_ccc < c || last_ccc == 0)) {
        a->v[starter] = comp;
      } else {
        if (c == 0) starter = w;
        last_ccc = c;
        a->v[w++] = cp;
      }
    }
    a->len = w;
  }
  for (size_t i = 0; i < a->len; i++) {
    unsigned char u[4];
    DS_TRY(tk_buf_append(out, u, tk_utf8_encode(a->v[i], u)));
  }
  return DS_OK;
}

ds_status tk_nfc_append(const tk_nfc *n, const unsigned char *s, size_t len, tk_buf *out) {
  cp_vec a = {0};
  ds_status st = DS_OK;
  size_t copied = 0, last_safe = 0, i = 0;
  uint8_t last_ccc = 0;
  while (i < len) {
    unsigned char b = s[i];
    if (b < 0xCC) {
      last_safe = i;
      last_ccc = 0;
      i += b < 0x80 ? 1 : 2;
      continue;
    }
    size_t l;
    uint32_t cp = next_cp(s, i, &l);
    uint8_t f = get_flags(n, cp);
    if (!f) {
      last_safe = i;
      last_ccc = 0;
      i += l;
      continue;
    }
    uint8_t c = (f & F_CCC) ? get_ccc(n, cp) : 0;
    if (!(f & (F_NO | F_MAYBE)) && c >= last_ccc) {
      last_ccc = c;
      i += l;
      continue;
    }
    /* Re-normalize from the last stable starter up to the next one. */
    size_t j = i + l;
    while (j < len) {
      size_t l2;
      if (s[j] < 0xCC) break;
      uint32_t cp2 = next_cp(s, j, &l2);
      if (!get_flags(n, cp2)) break;
      j += l2;
    }
    if ((st = tk_buf_append(out, s + copied, last_safe - copied)) != DS_OK) break;
    if ((st = normalize_segment(n, s + last_safe, j - last_safe, &a, out)) != DS_OK) break;
    copied = last_safe = i = j;
    last_ccc = 0;
  }
  if (st == DS_OK) st = tk_buf_append(out, s + copied, len - copied);
  free(a.v);
  return st;
}
