/* Growable byte buffer and the two open-addressing hash maps of the tokenizer: byte string
 * -> id (vocabulary, word cache) and id pair -> (rank, id) (BPE merges). Both use linear
 * probing at load factor <= 1/2, which keeps lookups at one or two cache lines. */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "text/tok_internal.h"

ds_status tk_buf_reserve(tk_buf *b, size_t extra) {
  if (extra <= b->cap - b->len) return DS_OK;
  if (extra > SIZE_MAX / 2 - b->len) return DS_FAIL(DS_ERR_NOMEM, "tokenizer buffer size overflow");
  size_t cap = b->cap ? b->cap : 64;
  while (cap - b->len < extra) cap *= 2;
  unsigned char *p = realloc(b->p, cap);
  if (!p) return DS_FAIL(DS_ERR_NOMEM, "cannot grow a tokenizer buffer to %zu bytes", cap);
  b->p = p;
  b->cap = cap;
  return DS_OK;
}

ds_status tk_buf_append(tk_buf *b, const void *data, size_t n) {
  DS_TRY(tk_buf_reserve(b, n));
  if (n) memcpy(b->p + b->len, data, n);
  b->len += n;
  return DS_OK;
}

void tk_buf_free(tk_buf *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}

/* ---- byte string -> int32 ---- */

struct tk_strmap_slot {
  uint64_t hash;
  uint32_t off, len; /* key in the pool; len == UINT32_MAX: empty slot */
  int32_t val;
};

static ds_status strmap_alloc(struct tk_strmap_slot **slots, size_t cap) {
  *slots = malloc(cap * sizeof **slots);
  if (!*slots) return DS_FAIL(DS_ERR_NOMEM, "cannot allocate a hash table of %zu slots", cap);
  for (size_t i = 0; i < cap; i++) (*slots)[i].len = UINT32_MAX;
  return DS_OK;
}

static ds_status strmap_grow(tk_strmap *m) {
  size_t cap = m->cap ? m->cap * 2 : 64;
  struct tk_strmap_slot *slots;
  DS_TRY(strmap_alloc(&slots, cap));
  for (size_t i = 0; i < m->cap; i++) {
    if (m->slots[i].len == UINT32_MAX) continue;
    size_t j = (size_t)m->slots[i].hash & (cap - 1);
    while (slots[j].len != UINT32_MAX) j = (j + 1) & (cap - 1);
    slots[j] = m->slots[i];
  }
  free(m->slots);
  m->slots = slots;
  m->cap = cap;
  return DS_OK;
}

void tk_strmap_free(tk_strmap *m) {
  free(m->slots);
  tk_buf_free(&m->keys);
  memset(m, 0, sizeof *m);
}

int32_t tk_strmap_get(const tk_strmap *m, const void *key, size_t len) {
  if (!m->cap) return -1;
  uint64_t h = XXH3_64bits(key, len);
  size_t mask = m->cap - 1;
  for (size_t j = (size_t)h & mask;; j = (j + 1) & mask) {
    const struct tk_strmap_slot *s = &m->slots[j];
    if (s->len == UINT32_MAX) return -1;
    if (s->hash == h && s->len == len && !memcmp(m->keys.p + s->off, key, len)) return s->val;
  }
}

ds_status tk_strmap_put(tk_strmap *m, const void *key, size_t len, int32_t val, int32_t *old) {
  if (old) *old = -1;
  if (len >= UINT32_MAX || m->keys.len > UINT32_MAX - len)
    return DS_FAIL(DS_ERR_RANGE, "tokenizer string table over 4 GiB");
  if ((m->count + 1) * 2 > m->cap) DS_TRY(strmap_grow(m));
  uint64_t h = XXH3_64bits(key, len);
  size_t mask = m->cap - 1, j = (size_t)h & mask;
  for (;; j = (j + 1) & mask) {
    struct tk_strmap_slot *s = &m->slots[j];
    if (s->len == UINT32_MAX) break;
    if (s->hash == h && s->len == len && !memcmp(m->keys.p + s->off, key, len)) {
      if (old) *old = s->val;
      s->val = val;
      return DS_OK;
    }
  }
  uint32_t off = (uint32_t)m->keys.len;
  DS_TRY(tk_buf_append(&m->keys, key, len));
  m->slots[j] = (struct tk_strmap_slot){h, off, (uint32_t)len, val};
  m->count++;
  return DS_OK;
}

/* ---- (id, id) -> (rank, id) ---- */

struct tk_pairmap_slot {
  uint64_t key; /* a << 32 | b; UINT64_MAX: empty (ids are < 2^31) */
  uint32_t rank;
  int32_t val;
};

static size_t pair_hash(uint64_t key, size_t mask) {
  /* Fibonacci hashing: the high bits of the product mix both ids. */
  return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}

static ds_status pairmap_grow(tk_pairmap *m) {
  size_t cap = m->cap ? m->cap * 2 : 64;
  struct tk_pairmap_slot *slots = malloc(cap * sizeof *slots);
  if (!slots) return DS_FAIL(DS_ERR_NOMEM, "cannot allocate a merge table of %zu slots", cap);
  for (size_t i = 0; i < cap; i++) slots[i].key = UINT64_MAX;
  for (size_t i = 0; i < m->cap; i++) {
    if (m->slots[i].key == UINT64_MAX) continue;
    size_t j = pair_hash(m->slots[i].key, cap - 1);
    while (slots[j].key != UINT64_MAX) j = (j + 1) & (cap - 1);
    slots[j] = m->slots[i];
  }
  free(m->slots);
  m->slots = slots;
  m->cap = cap;
  return DS_OK;
}

void tk_pairmap_free(tk_pairmap *m) {
  free(m->slots);
  memset(m, 0, sizeof *m);
}

int tk_pairmap_get(const tk_pairmap *m, uint32_t a, uint32_t b, uint32_t *rank, int32_t *val) {
  if (!m->cap) return 0;
  uint64_t key = (uint64_t)a << 32 | b;
  size_t mask = m->cap - 1;
  for (size_t j = pair_hash(key, mask);; j = (j + 1) & mask) {
    const struct tk_pairmap_slot *s = &m->slots[j];
    if (s->key == key) {
      *rank = s->rank;
      *val = s->val;
      return 1;
    }
    if (s->key == UINT64_MAX) return 0;
  }
}

ds_status tk_pairmap_put(tk_pairmap *m, uint32_t a, uint32_t b, uint32_t rank, int32_t val) {
  if ((m->count + 1) * 2 > m->cap) DS_TRY(pairmap_grow(m));
  uint64_t key = (uint64_t)a << 32 | b;
  size_t mask = m->cap - 1, j = pair_hash(key, mask);
  while (m->slots[j].key != UINT64_MAX && m->slots[j].key != key) j = (j + 1) & mask;
  if (m->slots[j].key == UINT64_MAX) m->count++;
  m->slots[j] = (struct tk_pairmap_slot){key, rank, val};
  return DS_OK;
}
