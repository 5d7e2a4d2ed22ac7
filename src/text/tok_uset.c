/* Sets of code points as sorted, disjoint, non-adjacent ranges (tok_uclass.h). */
#include <stdlib.h>
#include <string.h>

#include "text/tok_uclass.h"

void tk_uset_free(tk_uset *s) {
  free(s->r);
  memset(s, 0, sizeof *s);
}

void tk_uset_add(tk_uset *s, uint32_t lo, uint32_t hi) {
  if (s->oom || lo > hi) return;
  if (s->n == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 64;
    tk_urange *r = realloc(s->r, cap * sizeof *r);
    if (!r) {
      s->oom = 1;
      return;
    }
    s->r = r;
    s->cap = cap;
  }
  s->r[s->n].lo = lo;
  s->r[s->n].hi = hi;
  s->n++;
}

static int by_lo(const void *a, const void *b) {
  uint32_t x = ((const tk_urange *)a)->lo, y = ((const tk_urange *)b)->lo;
  return x < y ? -1 : x > y;
}

void tk_uset_normalize(tk_uset *s) {
  if (s->oom || s->n < 2) return;
  qsort(s->r, s->n, sizeof *s->r, by_lo);
  size_t o = 0;
  for (size_t i = 1; i < s->n; i++) {
    if (s->r[i].lo <= s->r[o].hi + 1) {
      if (s->r[i].hi > s->r[o].hi) s->r[o].hi = s->r[i].hi;
    } else {
      s->r[++o] = s->r[i];
    }
  }
  s->n = o + 1;
}

void tk_uset_add_table(tk_uset *s, const tk_urange *t, size_t n) {
  for (size_t i = 0; i < n; i++) tk_uset_add(s, t[i].lo, t[i].hi);
  tk_uset_normalize(s);
}

void tk_uset_add_set(tk_uset *s, const tk_uset *a) {
  if (a->oom) s->oom = 1;
  tk_uset_add_table(s, a->r, a->n);
}

void tk_uset_subtract(tk_uset *out, const tk_uset *a, const tk_uset *b) {
  tk_uset r = {0};
  r.oom = a->oom || b->oom;
  size_t j = 0;
  for (size_t i = 0; i < a->n; i++) {
    uint32_t lo = a->r[i].lo, hi = a->r[i].hi;
    while (j < b->n && b->r[j].hi < lo) j++;
    size_t k = j;
    while (k < b->n && b->r[k].lo <= hi && lo <= hi) {
      if (b->r[k].lo > lo) tk_uset_add(&r, lo, b->r[k].lo - 1);
      if (b->r[k].hi >= hi) {
        lo = 1;
        hi = 0; /* consumed */
        break;
      }
      lo = b->r[k].hi + 1;
      k++;
    }
    if (lo <= hi) tk_uset_add(&r, lo, hi);
  }
  tk_uset_free(out);
  *out = r;
}

void tk_uset_complement(tk_uset *out, const tk_uset *a) {
  tk_uset all = {0};
  tk_uset_add(&all, 0, TK_MAX_CP);
  tk_uset_subtract(out, &all, a);
  if (all.oom) out->oom = 1;
  tk_uset_free(&all);
}

int tk_uset_contains(const tk_uset *s, uint32_t c) {
  size_t lo = 0, hi = s->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (s->r[mid].hi < c) lo = mid + 1;
    else hi = mid;
  }
  return lo < s->n && s->r[lo].lo <= c;
}

int tk_uset_equal(const tk_uset *a, const tk_uset *b) {
  return a->n == b->n && (!a->n || !memcmp(a->r, b->r, a->n * sizeof *a->r));
}
