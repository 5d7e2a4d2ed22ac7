/* Internals of the byte-level BPE tokenizer (src/text/tok_*.c), shared between its files
 * and the unit test. Not part of the public API (include/dspark/tokenizer.h).
 *
 * Data flow of one encode, mirroring HF tokenizers' TokenizerImpl::encode:
 *   text --(added tokens with normalized=false, leftmost-longest)--> pieces
 *        --(normalizer: NFC)--> --(added tokens with normalized=true)--> pieces
 *        --(pre-tokenizer steps: Split regexes, then ByteLevel)--> words
 *        --(BPE merges, per-call word cache)--> ids --(post-processor template)--> ids
 * The byte-level alphabet is handled at load time: vocabulary strings are converted to the
 * raw bytes they stand for, so the pipeline works on the UTF-8 bytes of the text. */
#ifndef DSPARK_TEXT_TOK_INTERNAL_H
#define DSPARK_TEXT_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "dspark/tokenizer.h"

/* ---- growable byte buffer ---- */
typedef struct {
  unsigned char *p;
  size_t len, cap;
} tk_buf;

ds_status tk_buf_reserve(tk_buf *b, size_t extra);
ds_status tk_buf_append(tk_buf *b, const void *data, size_t n);
void tk_buf_free(tk_buf *b);

/* ---- hash maps (tok_hash.c) ---- */

/* Byte string -> int32, open addressing; keys are copied into an owned pool. */
typedef struct {
  struct tk_strmap_slot *slots; /* capacity entries; len == UINT32_MAX marks empty */
  size_t cap, count;
  tk_buf keys;
} tk_strmap;

void tk_strmap_free(tk_strmap *m);
/* Returns the value or -1. */
int32_t tk_strmap_get(const tk_strmap *m, const void *key, size_t len);
/* Inserts or replaces; *old (optional) receives the previous value or -1. */
ds_status tk_strmap_put(tk_strmap *m, const void *key, size_t len, int32_t val, int32_t *old);

/* Pair of ids -> (rank, id), open addressing on the packed 64-bit pair. */
typedef struct {
  struct tk_pairmap_slot *slots;
  size_t cap, count;
} tk_pairmap;

void tk_pairmap_free(tk_pairmap *m);
int tk_pairmap_get(const tk_pairmap *m, uint32_t a, uint32_t b, uint32_t *rank, int32_t *val);
ds_status tk_pairmap_put(tk_pairmap *m, uint32_t a, uint32_t b, uint32_t rank, int32_t val);

/* ---- Unicode (tok_utf8.c, tok_nfc.c, tok_unicode_data.c) ---- */

/* Length of the longest valid UTF-8 prefix of s (== n when all of s is valid). Valid means
 * Rust's str: no overlong forms, no surrogates, nothing above U+10FFFF. */
size_t tk_utf8_valid_prefix(const unsigned char *s, size_t n);
/* Decodes the code point at s[0..] of valid UTF-8; *len receives its byte length. */
uint32_t tk_utf8_decode(const unsigned char *s, size_t *len);
size_t tk_utf8_encode(uint32_t cp, unsigned char out[4]);
/* Unicode White_Space (what Rust's char::is_whitespace and regex \s match). */
int tk_is_white_space(uint32_t cp);
/* Appends s to out, replacing each maximal ill-formed subsequence by U+FFFD exactly as
 * Rust's String::from_utf8_lossy (and so HF's ByteLevel decoder) does. */
ds_status tk_utf8_lossy_append(tk_buf *out, const unsigned char *s, size_t n);

typedef struct {
  uint32_t first, last;
  uint8_t ccc;
} tk_ccc_range;
typedef struct {
  uint32_t cp, a, b; /* one-level canonical decomposition cp -> a b (b == 0: singleton) */
  uint8_t excluded;  /* 1: never recomposed (exclusion, singleton or non-starter) */
} tk_decomp;
extern const tk_ccc_range tk_ccc_ranges[];
extern const size_t tk_ccc_count;
extern const tk_decomp tk_decomps[];
extern const size_t tk_decomp_count;

/* NFC normalizer; its lookup tables are built once per tokenizer. */
typedef struct tk_nfc tk_nfc;
ds_status tk_nfc_build(tk_nfc **out);
void tk_nfc_free(tk_nfc *n);
/* 1 when s (valid UTF-8) is certainly NFC already (the quick check of UAX #15). */
int tk_nfc_is_quick(const tk_nfc *n, const unsigned char *s, size_t len);
/* Appends NFC(s) to out; only the segments that fail the quick check are re-composed. */
ds_status tk_nfc_append(const tk_nfc *n, const unsigned char *s, size_t len, tk_buf *out);

/* ---- pre-tokenizer steps (run in tokenizer.c; regexes in tok_regex.c) ---- */
typedef enum {
  TK_SPLIT_REMOVED,
  TK_SPLIT_ISOLATED,
  TK_SPLIT_MERGED_WITH_PREVIOUS,
  TK_SPLIT_MERGED_WITH_NEXT,
  TK_SPLIT_CONTIGUOUS
} tk_split_behavior;

typedef struct {
  int byte_level;       /* ByteLevel step (always the last one) */
  int add_prefix_space; /* ByteLevel: prepend ' ' to pieces not starting with one */
  pcre2_code *re;       /* Split pattern or ByteLevel's GPT-2 regex; NULL: no splitting */
  int jit;              /* re is JIT-compiled */
  tk_split_behavior behavior;
  int invert;
} tk_pretok_step;

enum { TK_MAX_STEPS = 8 };

/* Compiles an Oniguruma-style pattern (as HF's tokenizers runs it) with PCRE2, translating
 * every character class to HF's Unicode tables and Ruby's escapes to PCRE2's (tok_regex.c),
 * so that both engines match the same characters; a construct that cannot match the same is
 * refused. literal: the pattern is a plain string (SplitPattern::String). On failure returns
 * NULL and writes a message (naming the construct) to err. */
pcre2_code *tk_regex_compile(const char *pattern, int literal, int *jit, char *err, size_t errcap);
/* The PCRE2 pattern tk_regex_compile compiles (malloc'd), or NULL with err set. natives: use
 * PCRE2's own property tables plus exceptions (tk_uclass.h); 0: explicit ranges only. */
char *tk_regex_translate(const char *pattern, int natives, char *err, size_t errcap);
/* One character of the \w an added token's single_word checks (HF uses the regex crate's). */
pcre2_code *tk_regex_compile_single_word(int *jit, char *err, size_t errcap);
extern const char tk_gpt2_pattern[];

/* ---- added tokens (tok_trie.c; matched in tokenizer.c) ---- */
typedef struct {
  int32_t id;
  char *content; /* as in the file */
  char *pattern; /* what is matched: content, or NFC(content) when normalized with NFC */
  size_t pattern_len;
  unsigned single_word : 1, lstrip : 1, rstrip : 1, normalized : 1, special : 1;
} tk_added;

typedef struct {
  struct tk_trie_node *nodes;
  size_t n, cap;
  uint8_t first[256]; /* 1 when some pattern starts with this byte */
} tk_trie;

ds_status tk_trie_insert(tk_trie *t, const unsigned char *s, size_t len, int32_t value);
void tk_trie_free(tk_trie *t);
/* Longest pattern starting at s[0..n): its value (or -1), its length in *len. */
int32_t tk_trie_longest(const tk_trie *t, const unsigned char *s, size_t n, size_t *len);

/* ---- the tokenizer ---- */
enum {
  TK_ID_PRESENT = 1,
  TK_ID_SPECIAL = 2, /* skipped by decode(skip_special) */
  TK_ID_ADDED = 4,
  TK_ID_SELF = 8     /* a model token whose bytes BPE-merge into exactly itself */
};

struct ds_tokenizer {
  char *label;            /* file name for messages */
  int64_t n_ids;          /* max id + 1 */
  uint32_t *str_off;      /* (n_ids) token string (NUL-terminated) in strs */
  uint32_t *dec_off;      /* (n_ids) bytes the ByteLevel decoder gives, in decs */
  uint32_t *dec_len;      /* (n_ids) */
  uint8_t *id_flags;      /* (n_ids) TK_ID_* */
  tk_buf strs, decs;
  tk_strmap model_str;    /* model vocab string -> id */
  tk_strmap added_str;    /* added token content -> id */
  tk_strmap vocab_bytes;  /* byte-level model tokens, as raw bytes -> id */
  int32_t byte_id[256];   /* single-byte tokens; -1 when absent */
  tk_pairmap merges;      /* (left id, right id) -> (rank, merged id) */
  int ignore_merges;      /* a word that is itself a token is not merged (Llama-3) */
  tk_nfc *nfc;            /* normalizer; NULL when none */
  tk_added *added;        /* (n_added) one per distinct added id */
  size_t n_added;
  tk_trie raw_trie;       /* patterns of added tokens with normalized=false */
  tk_trie norm_trie;      /* patterns of added tokens with normalized=true */
  pcre2_code *word_re;    /* one \w character, for single_word; NULL when unused */
  tk_pretok_step steps[TK_MAX_STEPS];
  size_t n_steps;
  ds_ids post_prefix;     /* post-processor template around the sequence (add_special) */
  ds_ids post_suffix;
};

/* ---- BPE (tok_bpe.c) ---- */
typedef struct {
  struct tk_sym *syms;
  size_t syms_cap;
  struct tk_merge *heap;
  size_t heap_cap;
} tk_bpe_scratch;

void tk_bpe_scratch_free(tk_bpe_scratch *s);
/* Appends the BPE ids of one word (raw bytes) to out, as HF's Word::merge_all: repeatedly
 * merges the adjacent pair of lowest rank, leftmost first. A flat array for short words, a
 * heap for long ones (O(n log n)). */
ds_status tk_bpe_word(const ds_tokenizer *tok, const unsigned char *w, size_t n, tk_bpe_scratch *s,
                      ds_ids *out);
/* The same by rescanning all pairs after each merge, O(n^2): the reference for tests. */
ds_status tk_bpe_word_naive(const ds_tokenizer *tok, const unsigned char *w, size_t n, ds_ids *out);

/* Number of bytes the decoder gives for id (0 for an unknown id). */
size_t tk_token_byte_len(const ds_tokenizer *tok, int32_t id);

#endif
