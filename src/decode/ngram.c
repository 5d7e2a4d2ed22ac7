/* The corpus n-gram table of speculative proposals (include/dspark/ngram.h): open addressing on
 * 64-bit context hashes, the most frequent next token kept as counts grow. */
#include "dspark/ngram.h"

#include <stdlib.h>
#include <string.h>

/* A context (or, while building, a context and its next token) and its counts. */
typedef struct {
  uint64_t key;  /* 0: empty */
  int32_t tok;   /* the most frequent next token */
  uint32_t best; /* its count (a pair's own count while building) */
  uint32_t seen; /* supervised tokens after the context */
} slot;

typedef struct {
  slot *s;
  int64_t cap, used; /* cap a power of two, used < cap / 2 */
} table;

struct ds_ngram {
  table ctx;
  int64_t tokens;
};

static uint64_t mix(uint64_t x) { /* splitmix64's finalizer */
  x ^= x >> 30, x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27, x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/* The hash of a context one token longer: tok, n tokens back from the predicted one. */
static uint64_t extend(uint64_t h, int32_t tok, int64_t n) { return mix(h ^ ((uint64_t)(uint32_t)tok | (uint64_t)n << 32)); }
static const uint64_t EMPTY_CONTEXT = 0x9e3779b97f4a7c15ULL;
static uint64_t pair_key(uint64_t h, int32_t next) { return mix(h + 0x632be59bd9b4e019ULL * ((uint64_t)(uint32_t)next + 1)); }

static slot *find(const table *t, uint64_t key) { /* key's slot, or the empty one where it would go */
  uint64_t m = (uint64_t)t->cap - 1;
  for (uint64_t i = key & m;; i = (i + 1) & m)
    if (t->s[i].key == key || t->s[i].key == 0) return &t->s[i];
}

static ds_status grow(table *t) {
  int64_t cap = t->cap ? 2 * t->cap : 1 << 12;
  slot *s = calloc((size_t)cap, sizeof(slot));
  if (!s) return DS_FAIL(DS_ERR_NOMEM, "n-gram table: %lld entries", (long long)cap);
  table bigger = {s, cap, t->used};
  for (int64_t i = 0; i < t->cap; i++)
    if (t->s[i].key) *find(&bigger, t->s[i].key) = t->s[i];
  free(t->s);
  *t = bigger;
  return DS_OK;
}

/* key's slot, inserted (zero counts) when absent; NULL when memory ran out. */
static slot *upsert(table *t, uint64_t key) {
  key = key ? key : 1;
  if (2 * (t->used + 1) > t->cap && grow(t) != DS_OK) return NULL;
  slot *e = find(t, key);
  if (!e->key) e->key = key, t->used++;
  return e;
}

static const slot *lookup(const table *t, uint64_t key) {
  key = key ? key : 1;
  const slot *e = find(t, key);
  return e->key ? e : NULL;
}

void ds_ngram_free(ds_ngram *g) {
  if (!g) return;
  free(g->ctx.s);
  free(g);
}

/* The table as sequences arrive (ds_sequence_fn): the contexts, and the (context, next token)
 * pairs' counts that decide each context's most frequent follower. */
typedef struct {
  ds_ngram *g;
  table pairs;
} builder;

static ds_status add_sequence(void *user, const int32_t *ids, const uint8_t *mask, int64_t n) {
  builder *b = user;
  ds_ngram *g = b->g;
  for (int64_t t = 1; t < n; t++) {
    if (!mask[t]) continue;
    g->tokens++;
    uint64_t h = EMPTY_CONTEXT;
    for (int64_t m = 1; m <= DS_NGRAM_MAX_CONTEXT && m <= t; m++) {
      h = extend(h, ids[t - m], m);
      slot *c = upsert(&g->ctx, h), *p = c ? upsert(&b->pairs, pair_key(h, ids[t])) : NULL;
      if (!p) return DS_FAIL(DS_ERR_NOMEM, "n-gram table: out of memory at %lld contexts", (long long)g->ctx.used);
      c->seen++, p->best++;
      if (p->best > c->best) c->best = p->best, c->tok = ids[t]; /* ties keep the token seen first */
    }
  }
  return DS_OK;
}

/* Ends a build: the table on success, everything freed otherwise. */
static ds_status finish(builder *b, ds_status st, ds_ngram **out) {
  free(b->pairs.s);
  if (st == DS_OK && b->g->tokens == 0) st = DS_FAIL(DS_ERR_FORMAT, "n-gram table: the data has no supervised token");
  if (st != DS_OK) {
    ds_ngram_free(b->g);
    return st;
  }
  *out = b->g;
  return DS_OK;
}

ds_status ds_ngram_build(const ds_dataset *data, ds_ngram **out) {
  *out = NULL;
  builder b = {calloc(1, sizeof(ds_ngram)), {0}};
  if (!b.g) return DS_ERR_NOMEM;
  ds_status st = DS_OK;
  for (int64_t i = 0; i < data->n_seqs && st == DS_OK; i++)
    st = add_sequence(&b, data->ids + i * data->seq_len, data->loss_mask + i * data->seq_len, data->lengths[i]);
  return finish(&b, st, out);
}

/* One pass over the data's sequences (ds_dataset_stream), none of them kept. */
ds_status ds_ngram_load(const char *inputs, const ds_data_options *opt, const ds_tokenizer *tok,
                        const ds_chat_template *tmpl, int enable_thinking, int32_t eos_id, ds_ngram **out) {
  *out = NULL;
  builder b = {calloc(1, sizeof(ds_ngram)), {0}};
  if (!b.g) return DS_ERR_NOMEM;
  ds_status st = ds_dataset_stream(inputs, opt, tok, tmpl, enable_thinking, DS_NGRAM_SEQ_LEN, eos_id, 2, add_sequence,
                                   &b, NULL, NULL);
  return finish(&b, st, out);
}

int64_t ds_ngram_contexts(const ds_ngram *g) { return g->ctx.used; }
int64_t ds_ngram_tokens(const ds_ngram *g) { return g->tokens; }

int64_t ds_ngram_propose(const ds_ngram *g, const int32_t *ctx, int64_t n, int64_t L, double min_chain, int32_t *out,
                         double *share) {
  enum { M = DS_NGRAM_MAX_CONTEXT };
  int32_t buf[M + 64];
  int64_t have = n < M ? n : M, got = 0;
  if (L > 64) L = 64;
  memcpy(buf, ctx + n - have, (size_t)have * sizeof(int32_t));
  double chain = 1.0;
  while (got < L) {
    const int32_t *end = buf + have + got; /* the next token's context ends before it */
    const slot *best = NULL;
    uint64_t h = EMPTY_CONTEXT;
    for (int64_t m = 1; m <= M && m <= have + got; m++) { /* the longest context that occurred */
      h = extend(h, end[-m], m);
      const slot *e = lookup(&g->ctx, h);
      if (!e) break; /* a longer context occurred only if this one did */
      best = e;
    }
    if (!best) break;
    double s = (double)best->best / ((double)best->seen + 1.0);
    if ((chain *= s) < min_chain) break;
    buf[have + got] = out[got] = best->tok;
    share[got++] = s;
  }
  return got;
}
