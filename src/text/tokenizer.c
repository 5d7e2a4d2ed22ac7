/* Encode and decode (the data flow is described in tok_internal.h).
 *
 * Pieces stream through the stages by recursion instead of being collected into lists:
 * each stage hands every sub-piece to the next one at once, so a 10 MB text needs no
 * per-word bookkeeping beyond the BPE word cache. The cache lives for one encode call,
 * which keeps ds_tokenizer read-only and safe to share between threads. */
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"

enum {
  CACHE_MAX_WORD = 256,      /* longer words are not cached (as HF's MAX_LENGTH) */
  CACHE_MAX_ENTRIES = 1 << 20,
  JIT_STACK_MAX = 64 << 20
};

typedef struct {
  const ds_tokenizer *tok;
  ds_ids *out;
  pcre2_match_data *md;
  pcre2_match_context *mctx; /* only once a JIT stack beyond the default 32 KiB is needed */
  pcre2_jit_stack *jstack;
  tk_bpe_scratch bpe;
  tk_strmap cache;           /* word bytes -> index into spans */
  uint32_t *spans;           /* (2 per entry) offset and count in cache_ids */
  size_t n_spans, cap_spans;
  ds_ids cache_ids;
  tk_buf nfc;                /* the NFC form of the current piece */
  tk_buf prefixed[TK_MAX_STEPS]; /* per step: the current piece with ByteLevel's prefix space */
} enc_ctx;

typedef ds_status (*piece_fn)(enc_ctx *c, const unsigned char *s, size_t n);

/* ---- BPE of one pre-tokenized word, through the cache ---- */

static ds_status cache_store(enc_ctx *c, const unsigned char *w, size_t n, size_t first) {
  if (n > CACHE_MAX_WORD || c->cache.count >= CACHE_MAX_ENTRIES) return DS_OK;
  if (c->n_spans == c->cap_spans) {
    size_t cap = c->cap_spans ? c->cap_spans * 2 : 1024;
    uint32_t *p = realloc(c->spans, cap * 2 * sizeof *p);
    if (!p) return DS_FAIL(DS_ERR_NOMEM, "cannot grow the BPE word cache");
    c->spans = p;
    c->cap_spans = cap;
  }
  size_t count = c->out->len - first;
  c->spans[2 * c->n_spans] = (uint32_t)c->cache_ids.len;
  c->spans[2 * c->n_spans + 1] = (uint32_t)count;
  for (size_t i = 0; i < count; i++) DS_TRY(ds_ids_push(&c->cache_ids, c->out->ids[first + i]));
  DS_TRY(tk_strmap_put(&c->cache, w, n, (int32_t)c->n_spans, NULL));
  c->n_spans++;
  return DS_OK;
}

static ds_status bpe_piece(enc_ctx *c, const unsigned char *w, size_t n) {
  const ds_tokenizer *tok = c->tok;
  if (n == 1) return tok->byte_id[w[0]] >= 0 ? ds_ids_push(c->out, tok->byte_id[w[0]]) : DS_OK;
  /* A word that is a token: taken whole under ignore_merges (Llama-3), else when its
   * merges are known (at load) to rebuild exactly it. */
  int32_t id = tk_strmap_get(&tok->vocab_bytes, w, n);
  if (id >= 0 && (tok->ignore_merges || (tok->id_flags[id] & TK_ID_SELF))) return ds_ids_push(c->out, id);
  if (n <= CACHE_MAX_WORD) {
    int32_t e = tk_strmap_get(&c->cache, w, n);
    if (e >= 0) {
      const uint32_t *sp = &c->spans[2 * (size_t)e];
      for (uint32_t i = 0; i < sp[1]; i++) DS_TRY(ds_ids_push(c->out, c->cache_ids.ids[sp[0] + i]));
      return DS_OK;
    }
  }
  size_t first = c->out->len;
  DS_TRY(tk_bpe_word(tok, w, n, &c->bpe, c->out));
  return cache_store(c, w, n, first);
}

/* ---- regex matching ---- */

/* Finds the next match in s[0..n) at or after pos: 1 with [*ms, *me), 0 when none. */
static int re_find(enc_ctx *c, const tk_pretok_step *st, const unsigned char *s, size_t n, size_t pos,
                   size_t *ms, size_t *me, ds_status *err) {
  for (;;) {
    int rc = st->jit ? pcre2_jit_match(st->re, s, n, pos, 0, c->md, c->mctx)
                     : pcre2_match(st->re, s, n, pos, PCRE2_NO_UTF_CHECK, c->md, c->mctx);
    if (rc >= 0) { /* 0: ovector too small for the groups; group 0 is still set */
      PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
      *ms = ov[0];
      *me = ov[1];
      return 1;
    }
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !c->jstack) {
      /* Deep backtracking on a long piece: retry once with a larger, growable stack. */
      c->jstack = pcre2_jit_stack_create(64 << 10, JIT_STACK_MAX, NULL);
      if (!c->mctx) c->mctx = pcre2_match_context_create(NULL);
      if (c->jstack && c->mctx) {
        pcre2_jit_stack_assign(c->mctx, NULL, c->jstack);
        continue;
      }
    }
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof msg);
    *err = DS_FAIL(DS_ERR_INTERNAL, "pre-tokenizer regex failed on a piece of %zu bytes: %s", n, (const char *)msg);
    return -1;
  }
}

/* ---- pre-tokenizer steps ---- */

static ds_status run_step(enc_ctx *c, size_t step, const unsigned char *s, size_t n);

/* The split behaviours of HF's NormalizedString::split, computed on the fly: HF folds the
 * list of (piece, is_match) into the output; here each piece arrives in order and at most
 * one output piece waits for its successor. */
typedef struct {
  enc_ctx *c;
  size_t step;
  const unsigned char *s;
  tk_split_behavior behavior;
  int has;           /* a pending output piece [ps, pe) */
  size_t ps, pe;
  int pend_match;    /* MergedWithNext: the pending piece is a lone match; Contiguous: its flag */
  int prev_match;    /* the flag of the previous input piece */
} splitter;

static ds_status out_piece(splitter *sp, size_t a, size_t b) {
  return b > a ? run_step(sp->c, sp->step + 1, sp->s + a, b - a) : DS_OK; /* HF drops empty pieces */
}

static ds_status flush_pending(splitter *sp) {
  if (!sp->has) return DS_OK;
  sp->has = 0;
  return out_piece(sp, sp->ps, sp->pe);
}

static ds_status feed(splitter *sp, size_t a, size_t b, int m) {
  switch (sp->behavior) {
    case TK_SPLIT_ISOLATED: return out_piece(sp, a, b);
    case TK_SPLIT_REMOVED: return m ? DS_OK : out_piece(sp, a, b);
    case TK_SPLIT_MERGED_WITH_PREVIOUS:
      if (m && !sp->prev_match && sp->has) {
        sp->pe = b;
      } else {
        DS_TRY(flush_pending(sp));
        sp->has = 1, sp->ps = a, sp->pe = b;
      }
      sp->prev_match = m;
      return DS_OK;
    case TK_SPLIT_MERGED_WITH_NEXT: /* a match joins the piece after it unless that is a match */
      if (sp->has && sp->pend_match && !m) {
        sp->has = 0;
        return out_piece(sp, sp->ps, b);
      }
      DS_TRY(flush_pending(sp));
      if (!m) return out_piece(sp, a, b);
      sp->has = 1, sp->ps = a, sp->pe = b, sp->pend_match = 1;
      return DS_OK;
    case TK_SPLIT_CONTIGUOUS:
      if (sp->has && sp->pend_match == m) {
        sp->pe = b;
      } else {
        DS_TRY(flush_pending(sp));
        sp->has = 1, sp->ps = a, sp->pe = b, sp->pend_match = m;
      }
      return DS_OK;
  }
  return DS_FAIL(DS_ERR_INTERNAL, "bad split behavior %d", (int)sp->behavior);
}

/* Splits s by the step's regex into (piece, is_match) as HF's Pattern::find_matches over
 * Oniguruma's find_iter, whose rule for empty matches is kept: an empty match right where
 * the previous match ended is skipped by advancing one character. */
static ds_status split_regex(enc_ctx *c, size_t step, const unsigned char *s, size_t n) {
  const tk_pretok_step *st = &c->tok->steps[step];
  splitter sp = {c, step, s, st->behavior, 0, 0, 0, 0, 0};
  int inv = st->invert != 0;
  size_t pos = 0, prev = 0, last_end = SIZE_MAX, ms, me;
  ds_status err = DS_OK;
  while (pos <= n) {
    int r = re_find(c, st, s, n, pos, &ms, &me, &err);
    if (r < 0) return err;
    if (!r) break;
    if (ms == me && me == last_end) {
      if (pos >= n) break;
      size_t l;
      tk_utf8_decode(s + pos, &l);
      pos += l;
      continue;
    }
    pos = last_end = me;
    if (ms > prev) DS_TRY(feed(&sp, prev, ms, inv));
    DS_TRY(feed(&sp, ms, me, !inv));
    prev = me;
  }
  if (prev < n) DS_TRY(feed(&sp, prev, n, inv));
  return flush_pending(&sp);
}

static ds_status run_step(enc_ctx *c, size_t step, const unsigned char *s, size_t n) {
  if (step == c->tok->n_steps) return bpe_piece(c, s, n);
  const tk_pretok_step *st = &c->tok->steps[step];
  if (st->add_prefix_space && s[0] != ' ') {
    tk_buf *b = &c->prefixed[step];
    b->len = 0;
    DS_TRY(tk_buf_append(b, " ", 1));
    DS_TRY(tk_buf_append(b, s, n));
    s = b->p;
    n = b->len;
  }
  return st->re ? split_regex(c, step, s, n) : run_step(c, step + 1, s, n);
}

/* ---- added tokens ---- */

static int is_word_char(enc_ctx *c, const unsigned char *s, size_t len) {
  return pcre2_match(c->tok->word_re, s, len, 0, PCRE2_ANCHORED | PCRE2_NO_UTF_CHECK, c->md, NULL) >= 0;
}

/* Start of the last character of s[0..end). */
static size_t char_before(const unsigned char *s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (s[i] & 0xC0) == 0x80) i--;
  return i;
}

/* HF's AddedVocabulary::find_matches + split_with_indices: leftmost-longest matches of the
 * trie's patterns become their ids, the text between them goes to next(). */
static ds_status split_added(enc_ctx *c, const tk_trie *t, const unsigned char *s, size_t n, piece_fn next) {
  const ds_tokenizer *tok = c->tok;
  size_t start_offset = 0, i = 0;
  while (t->n && i < n) {
    if (!t->first[s[i]]) { i++; continue; }
    size_t mlen;
    int32_t k = tk_trie_longest(t, s + i, n - i, &mlen);
    if (k < 0) { i++; continue; }
    const tk_added *a = &tok->added[k];
    size_t start = i, stop = i + mlen;
    i = stop; /* the search resumes after the match, whatever becomes of it */
    if (a->single_word) {
      int start_space = start == 0 || !is_word_char(c, s + char_before(s, start), start - char_before(s, start));
      size_t l = 0;
      if (stop < n) tk_utf8_decode(s + stop, &l);
      int stop_space = stop == n || !is_word_char(c, s + stop, l);
      if (!start_space || !stop_space) continue;
    }
    if (a->lstrip) {
      size_t ns = start;
      while (ns > 0) {
        size_t p = char_before(s, ns), l;
        if (!tk_is_white_space(tk_utf8_decode(s + p, &l))) break;
        ns = p;
      }
      start = ns > start_offset ? ns : start_offset;
    }
    if (a->rstrip) {
      while (stop < n) {
        size_t l;
        if (!tk_is_white_space(tk_utf8_decode(s + stop, &l))) break;
        stop += l;
      }
    }
    if (start_offset < start) DS_TRY(next(c, s + start_offset, start - start_offset));
    DS_TRY(ds_ids_push(c->out, a->id));
    start_offset = stop;
  }
  return start_offset < n ? next(c, s + start_offset, n - start_offset) : DS_OK;
}

static ds_status stage_pretok(enc_ctx *c, const unsigned char *s, size_t n) { return run_step(c, 0, s, n); }

static ds_status stage_normalize(enc_ctx *c, const unsigned char *s, size_t n) {
  const tk_nfc *nfc = c->tok->nfc;
  if (nfc && !tk_nfc_is_quick(nfc, s, n)) {
    c->nfc.len = 0;
    DS_TRY(tk_nfc_append(nfc, s, n, &c->nfc));
    s = c->nfc.p;
    n = c->nfc.len;
  }
  return split_added(c, &c->tok->norm_trie, s, n, stage_pretok);
}

static void ctx_free(enc_ctx *c) {
  pcre2_match_data_free(c->md);
  pcre2_match_context_free(c->mctx);
  pcre2_jit_stack_free(c->jstack);
  tk_bpe_scratch_free(&c->bpe);
  tk_strmap_free(&c->cache);
  free(c->spans);
  ds_ids_free(&c->cache_ids);
  tk_buf_free(&c->nfc);
  for (size_t i = 0; i < TK_MAX_STEPS; i++) tk_buf_free(&c->prefixed[i]);
}

ds_status ds_tokenizer_encode(const ds_tokenizer *tok, const char *text, size_t len, int add_special,
                              ds_ids *out) {
  if (!tok || !out || (!text && len)) return DS_FAIL(DS_ERR_ARG, "ds_tokenizer_encode: NULL argument");
  const unsigned char *s = (const unsigned char *)text;
  size_t valid = tk_utf8_valid_prefix(s, len);
  if (valid != len)
    return DS_FAIL(DS_ERR_ARG, "text to encode is not valid UTF-8 (at byte %zu of %zu)", valid, len);
  enc_ctx c = {0};
  c.tok = tok;
  c.out = out;
  size_t start_len = out->len;
  ds_status st = DS_OK;
  if (!(c.md = pcre2_match_data_create(1, NULL))) st = DS_FAIL(DS_ERR_NOMEM, "cannot allocate regex match data");
  for (size_t i = 0; st == DS_OK && add_special && i < tok->post_prefix.len; i++)
    st = ds_ids_push(out, tok->post_prefix.ids[i]);
  if (st == DS_OK) st = split_added(&c, &tok->raw_trie, s, len, stage_normalize);
  for (size_t i = 0; st == DS_OK && add_special && i < tok->post_suffix.len; i++)
    st = ds_ids_push(out, tok->post_suffix.ids[i]);
  if (st != DS_OK) out->len = start_len;
  ctx_free(&c);
  return st;
}

/* ---- decode and lookups ---- */

ds_status ds_tokenizer_decode(const ds_tokenizer *tok, const int32_t *ids, size_t n, int skip_special,
                              char **out, size_t *out_len) {
  if (!tok || !out || (!ids && n)) return DS_FAIL(DS_ERR_ARG, "ds_tokenizer_decode: NULL argument");
  *out = NULL;
  if (out_len) *out_len = 0;
  tk_buf raw = {0}, fixed = {0};
  ds_status st = DS_OK;
  for (size_t i = 0; i < n && st == DS_OK; i++) {
    int32_t id = ids[i];
    if (id < 0 || id >= tok->n_ids || !(tok->id_flags[id] & TK_ID_PRESENT)) {
      st = DS_FAIL(DS_ERR_RANGE, "cannot decode id %d at position %zu: not in the vocabulary of %s (size %lld)",
                   (int)id, i, tok->label, (long long)tok->n_ids);
      break;
    }
    if (skip_special && (tok->id_flags[id] & TK_ID_SPECIAL)) continue;
    st = tk_buf_append(&raw, tok->decs.p + tok->dec_off[id], tok->dec_len[id]);
  }
  /* Tokens may split a character: the bytes are joined first, then repaired once. */
  if (st == DS_OK && tk_utf8_valid_prefix(raw.p, raw.len) != raw.len) {
    st = tk_utf8_lossy_append(&fixed, raw.p, raw.len);
    tk_buf_free(&raw);
    raw = fixed;
  }
  if (st == DS_OK) st = tk_buf_append(&raw, "", 1);
  if (st != DS_OK) {
    tk_buf_free(&raw);
    return st;
  }
  *out = (char *)raw.p;
  if (out_len) *out_len = raw.len - 1;
  return DS_OK;
}

int64_t ds_tokenizer_vocab_size(const ds_tokenizer *tok) { return tok ? tok->n_ids : 0; }

int32_t ds_tokenizer_token_to_id(const ds_tokenizer *tok, const char *token) {
  if (!tok || !token) return -1;
  size_t n = strlen(token);
  int32_t id = tk_strmap_get(&tok->added_str, token, n);
  return id >= 0 ? id : tk_strmap_get(&tok->model_str, token, n);
}

const char *ds_tokenizer_id_to_token(const ds_tokenizer *tok, int32_t id) {
  if (!tok || id < 0 || id >= tok->n_ids || !(tok->id_flags[id] & TK_ID_PRESENT)) return NULL;
  return (const char *)tok->strs.p + tok->str_off[id];
}

int ds_tokenizer_is_special(const ds_tokenizer *tok, int32_t id) {
  return tok && id >= 0 && id < tok->n_ids && (tok->id_flags[id] & TK_ID_PRESENT) && (tok->id_flags[id] & TK_ID_SPECIAL);
}

size_t tk_token_byte_len(const ds_tokenizer *tok, int32_t id) {
  if (id < 0 || id >= tok->n_ids || !(tok->id_flags[id] & TK_ID_PRESENT)) return 0;
  return tok->dec_len[id];
}
