/* The BPE merge loop of one word, as HF tokenizers' Word::merge_all.
 *
 * Symbols start as the word's bytes (the byte-level alphabet has one symbol per byte).
 * Short words use a flat array (bpe_small). Long ones form a doubly linked list and a
 * min-heap holds candidate merges keyed by (rank, position).
 * Popping gives the lowest-rank pair, leftmost on ties; an entry is stale when its symbol
 * was absorbed by its left neighbour or the pair at its position now merges into a different
 * id (a merged symbol is longer, so its pair's concatenation, hence merged id, differs).
 * Each merge pushes at most two new pairs: O(n log n) for a word of n bytes, so 100k
 * spaces or digits cost milliseconds, not minutes. */
#include <stdlib.h>

#include "text/tok_internal.h"

struct tk_sym {
  int32_t id;   /* -1: absorbed by the left neighbour */
  int32_t prev; /* -1: first */
  int32_t next; /* -1: last */
};

struct tk_merge {
  uint32_t rank;
  uint32_t pos;   /* index of the left symbol */
  int32_t new_id;
};

void tk_bpe_scratch_free(tk_bpe_scratch *s) {
  free(s->syms);
  free(s->heap);
  s->syms = NULL;
  s->heap = NULL;
  s->syms_cap = s->heap_cap = 0;
}

static ds_status reserve(tk_bpe_scratch *s, size_t n) {
  if (n > INT32_MAX / 4) return DS_FAIL(DS_ERR_RANGE, "a pre-tokenized word of %zu bytes is too long", n);
  if (n > s->syms_cap) {
    struct tk_sym *p = realloc(s->syms, n * sizeof *p);
    if (!p) return DS_FAIL(DS_ERR_NOMEM, "cannot allocate BPE symbols for %zu bytes", n);
    s->syms = p;
    s->syms_cap = n;
  }
  size_t h = 3 * n; /* n - 1 initial pairs + at most 2 per merge */
  if (h > s->heap_cap) {
    struct tk_merge *p = realloc(s->heap, h * sizeof *p);
    if (!p) return DS_FAIL(DS_ERR_NOMEM, "cannot allocate the BPE heap for %zu bytes", n);
    s->heap = p;
    s->heap_cap = h;
  }
  return DS_OK;
}

static int less(const struct tk_merge *a, const struct tk_merge *b) {
  return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(struct tk_merge *h, size_t *n, struct tk_merge m) {
  size_t i = (*n)++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!less(&m, &h[p])) break;
    h[i] = h[p];
    i = p;
  }
  h[i] = m;
}

static struct tk_merge heap_pop(struct tk_merge *h, size_t *n) {
  struct tk_merge top = h[0], last = h[--*n];
  size_t i = 0, len = *n;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= len) break;
    if (c + 1 < len && less(&h[c + 1], &h[c])) c++;
    if (!less(&h[c], &last)) break;
    h[i] = h[c];
    i = c;
  }
  if (len) h[i] = last;
  return top;
}

/* Initial symbols: one per byte that has a token; bytes without one are dropped, as HF
 * drops characters missing from the vocabulary when there is no unk token. */
static size_t init_symbols(const ds_tokenizer *tok, const unsigned char *w, size_t n, struct tk_sym *syms) {
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    int32_t id = tok->byte_id[w[i]];
    if (id < 0) continue;
    syms[m] = (struct tk_sym){id, (int32_t)m - 1, (int32_t)m + 1};
    m++;
  }
  if (m) syms[m - 1].next = -1;
  return m;
}

static ds_status emit(const struct tk_sym *syms, size_t m, ds_ids *out) {
  for (int32_t i = m ? 0 : -1; i >= 0; i = syms[i].next) DS_TRY(ds_ids_push(out, syms[i].id));
  return DS_OK;
}

enum { SMALL_WORD = 48 };

/* Short words (nearly all of them): the symbols in a flat array with the rank of each
 * adjacent pair; each merge scans for the lowest rank (leftmost on ties, so the result is
 * the reference's) and looks up only the two pairs it changes. No heap, no stale entries. */
static ds_status bpe_small(const ds_tokenizer *tok, const unsigned char *w, size_t n, ds_ids *out) {
  int32_t ids[SMALL_WORD], merged[SMALL_WORD];
  uint32_t ranks[SMALL_WORD];
  size_t m = 0;
  for (size_t i = 0; i < n; i++)
    if (tok->byte_id[w[i]] >= 0) ids[m++] = tok->byte_id[w[i]];
  for (size_t i = 0; i + 1 < m; i++)
    if (!tk_pairmap_get(&tok->merges, (uint32_t)ids[i], (uint32_t)ids[i + 1], &ranks[i], &merged[i]))
      ranks[i] = UINT32_MAX;
  while (m > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < m; i++)
      if (ranks[i] < ranks[best]) best = i;
    if (ranks[best] == UINT32_MAX) break;
    ids[best] = merged[best];
    m--;
    for (size_t i = best + 1; i < m; i++) ids[i] = ids[i + 1]; /* drop symbol best + 1 */
    for (size_t i = best + 1; i + 1 < m; i++) {                /* pairs after it move down */
      ranks[i] = ranks[i + 1];
      merged[i] = merged[i + 1];
    }
    if (best > 0 &&
        !tk_pairmap_get(&tok->merges, (uint32_t)ids[best - 1], (uint32_t)ids[best], &ranks[best - 1], &merged[best - 1]))
      ranks[best - 1] = UINT32_MAX;
    if (best + 1 < m &&
        !tk_pairmap_get(&tok->merges, (uint32_t)ids[best], (uint32_t)ids[best + 1], &ranks[best], &merged[best]))
      ranks[best] = UINT32_MAX;
  }
  for (size_t i = 0; i < m; i++) DS_TRY(ds_ids_push(out, ids[i]));
  return DS_OK;
}

ds_status tk_bpe_word(const ds_tokenizer *tok, const unsigned char *w, size_t n, tk_bpe_scratch *s,
                      ds_ids *out) {
  if (n <= SMALL_WORD) return bpe_small(tok, w, n, out);
  DS_TRY(reserve(s, n));
  struct tk_sym *syms = s->syms;
  struct tk_merge *heap = s->heap;
  size_t m = init_symbols(tok, w, n, syms), hn = 0;
  uint32_t rank;
  int32_t id;
  for (size_t i = 0; i + 1 < m; i++)
    if (tk_pairmap_get(&tok->merges, (uint32_t)syms[i].id, (uint32_t)syms[i + 1].id, &rank, &id))
      heap_push(heap, &hn, (struct tk_merge){rank, (uint32_t)i, id});
  while (hn) {
    struct tk_merge top = heap_pop(heap, &hn);
    struct tk_sym *l = &syms[top.pos];
    if (l->id < 0 || l->next < 0) continue;
    struct tk_sym *r = &syms[l->next];
    if (!tk_pairmap_get(&tok->merges, (uint32_t)l->id, (uint32_t)r->id, &rank, &id) || id != top.new_id)
      continue; /* stale */
    l->id = top.new_id;
    r->id = -1;
    l->next = r->next;
    if (l->next >= 0) syms[l->next].prev = (int32_t)top.pos;
    if (l->prev >= 0 &&
        tk_pairmap_get(&tok->merges, (uint32_t)syms[l->prev].id, (uint32_t)l->id, &rank, &id))
      heap_push(heap, &hn, (struct tk_merge){rank, (uint32_t)l->prev, id});
    if (l->next >= 0 &&
        tk_pairmap_get(&tok->merges, (uint32_t)l->id, (uint32_t)syms[l->next].id, &rank, &id))
      heap_push(heap, &hn, (struct tk_merge){rank, top.pos, id});
  }
  return emit(syms, m, out);
}

ds_status tk_bpe_word_naive(const ds_tokenizer *tok, const unsigned char *w, size_t n, ds_ids *out) {
  struct tk_sym *syms = malloc((n ? n : 1) * sizeof *syms);
  if (!syms) return DS_FAIL(DS_ERR_NOMEM, "cannot allocate BPE symbols for %zu bytes", n);
  size_t m = init_symbols(tok, w, n, syms);
  for (;;) {
    int32_t best = -1, best_id = -1;
    uint32_t best_rank = UINT32_MAX, rank;
    int32_t id;
    for (int32_t i = m ? 0 : -1; i >= 0 && syms[i].next >= 0; i = syms[i].next)
      if (tk_pairmap_get(&tok->merges, (uint32_t)syms[i].id, (uint32_t)syms[syms[i].next].id, &rank, &id) &&
          (best < 0 || rank < best_rank)) {
        best = i;
        best_rank = rank;
        best_id = id;
      }
    if (best < 0) break;
    struct tk_sym *l = &syms[best], *r = &syms[l->next];
    l->id = best_id;
    r->id = -1;
    l->next = r->next;
    if (l->next >= 0) syms[l->next].prev = best;
  }
  ds_status st = emit(syms, m, out);
  free(syms);
  return st;
}
