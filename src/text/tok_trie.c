/* Byte trie of added-token patterns, for HF's leftmost-longest matching (daachorse
 * MatchKind::LeftmostLongest): the caller scans start positions left to right (skipping
 * bytes no pattern starts with) and takes the longest pattern at the first position that
 * has one. Children are sibling lists: added tokens are few and share long prefixes
 * ("<|reserved_special_token_"), so the lists stay short. */
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"

struct tk_trie_node {
  int32_t child;   /* first child, -1 none */
  int32_t sibling; /* next sibling, -1 none */
  int32_t value;   /* pattern value ending here, -1 none */
  unsigned char byte;
};

static ds_status new_node(tk_trie *t, unsigned char byte, int32_t *idx) {
  if (t->n == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 64;
    if (cap > INT32_MAX) return DS_FAIL(DS_ERR_RANGE, "too many added-token trie nodes");
    struct tk_trie_node *nodes = realloc(t->nodes, cap * sizeof *nodes);
    if (!nodes) return DS_FAIL(DS_ERR_NOMEM, "cannot grow the added-token trie");
    t->nodes = nodes;
    t->cap = cap;
  }
  t->nodes[t->n] = (struct tk_trie_node){-1, -1, -1, byte};
  *idx = (int32_t)t->n++;
  return DS_OK;
}

ds_status tk_trie_insert(tk_trie *t, const unsigned char *s, size_t len, int32_t value) {
  if (!len) return DS_OK;
  int32_t cur;
  if (!t->n) DS_TRY(new_node(t, 0, &cur)); /* the root */
  cur = 0;
  for (size_t i = 0; i < len; i++) {
    int32_t c = t->nodes[cur].child, prev = -1;
    while (c >= 0 && t->nodes[c].byte != s[i]) { prev = c; c = t->nodes[c].sibling; }
    if (c < 0) {
      DS_TRY(new_node(t, s[i], &c));
      if (prev >= 0) t->nodes[prev].sibling = c;
      else t->nodes[cur].child = c;
    }
    cur = c;
  }
  t->nodes[cur].value = value; /* a repeated pattern keeps the last value */
  t->first[s[0]] = 1;
  return DS_OK;
}

void tk_trie_free(tk_trie *t) {
  free(t->nodes);
  memset(t, 0, sizeof *t);
}

int32_t tk_trie_longest(const tk_trie *t, const unsigned char *s, size_t n, size_t *len) {
  int32_t best = -1, cur = 0;
  *len = 0;
  if (!t->n) return -1;
  for (size_t i = 0; i < n; i++) {
    int32_t c = t->nodes[cur].child;
    while (c >= 0 && t->nodes[c].byte != s[i]) c = t->nodes[c].sibling;
    if (c < 0) break;
    cur = c;
    if (t->nodes[c].value >= 0) {
      best = t->nodes[c].value;
      *len = i + 1;
    }
  }
  return best;
}
