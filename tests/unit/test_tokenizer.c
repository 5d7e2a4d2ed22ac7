/* Tokenizer: a small hand-written byte-level BPE tokenizer.json (merges, added tokens, NFC,
 * template post-processor, ChatML), the heap BPE against the naive reference on random
 * merges, and malformed files, each refused with a message naming the field. Identity with
 * HF tokenizers on real text is checked by tests/conformance/test_tokenizer.py. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dspark/fileio.h"
#include "dspark/tokenizer.h"
#include "test_util.h"
#include "text/tok_internal.h"

/* ---------------------------------------------------------------- building tokenizer.json */

typedef struct {
  char *p;
  size_t len, cap;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (b->len + (size_t)n + 1 > b->cap) {
    b->cap = (b->len + (size_t)n + 1) * 2;
    b->p = realloc(b->p, b->cap);
    if (!b->p) abort();
  }
  va_start(ap, fmt);
  vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
}

/* The GPT-2 byte -> character map, as UTF-8 (what a byte-level vocab is written in). */
static void byte_char(int b, char out[4]) {
  int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  int cp = b;
  if (!printable) {
    int n = 0;
    for (int k = 0; k < b; k++)
      if (!((k >= 0x21 && k <= 0x7E) || (k >= 0xA1 && k <= 0xAC) || k >= 0xAE)) n++;
    cp = 256 + n;
  }
  if (cp < 0x80) {
    out[0] = (char)cp;
    out[1] = 0;
  } else {
    out[0] = (char)(0xC0 | cp >> 6);
    out[1] = (char)(0x80 | (cp & 0x3F));
    out[2] = 0;
  }
}

/* A JSON string literal body for a byte-level token. */
static void put_token(sbuf *b, const char *tok) {
  for (const char *p = tok; *p; p++) {
    if (*p == '"' || *p == '\\') sb_printf(b, "\\%c", *p);
    else sb_printf(b, "%c", *p);
  }
}

typedef struct {
  const char *extra_vocab[64]; /* tokens after the 256 bytes, ids 256.. */
  const char *merges[64][2];
  const char *added;           /* JSON array body of added_tokens, or NULL */
  const char *normalizer;      /* JSON value */
  const char *pre_tokenizer;
  const char *post_processor;
  const char *decoder;
  const char *model_extra;     /* extra fields inside "model", starting with ',' */
} spec;

static char *make_json(const spec *s) {
  sbuf b = {0};
  sb_printf(&b, "{\"version\": \"1.0\", \"added_tokens\": [%s],\n", s->added ? s->added : "");
  sb_printf(&b, "\"normalizer\": %s,\n", s->normalizer ? s->normalizer : "null");
  sb_printf(&b, "\"pre_tokenizer\": %s,\n",
            s->pre_tokenizer ? s->pre_tokenizer
                             : "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true}");
  sb_printf(&b, "\"post_processor\": %s,\n", s->post_processor ? s->post_processor : "null");
  sb_printf(&b, "\"decoder\": %s,\n", s->decoder ? s->decoder : "{\"type\": \"ByteLevel\"}");
  sb_printf(&b, "\"model\": {\"type\": \"BPE\", \"dropout\": null%s, \"vocab\": {",
            s->model_extra ? s->model_extra : "");
  for (int i = 0; i < 256; i++) {
    char c[4];
    byte_char(i, c);
    sb_printf(&b, "%s\"", i ? ", " : "");
    put_token(&b, c);
    sb_printf(&b, "\": %d", i);
  }
  for (int i = 0; i < 64 && s->extra_vocab[i]; i++) {
    sb_printf(&b, ", \"");
    put_token(&b, s->extra_vocab[i]);
    sb_printf(&b, "\": %d", 256 + i);
  }
  sb_printf(&b, "}, \"merges\": [");
  for (int i = 0; i < 64 && s->merges[i][0]; i++) {
    sb_printf(&b, "%s[\"", i ? ", " : "");
    put_token(&b, s->merges[i][0]);
    sb_printf(&b, "\", \"");
    put_token(&b, s->merges[i][1]);
    sb_printf(&b, "\"]");
  }
  sb_printf(&b, "]}}\n");
  return b.p;
}

#define ADDED(id, content, special)                                                                  \
  "{\"id\": " #id ", \"content\": \"" content "\", \"single_word\": false, \"lstrip\": false, "     \
  "\"rstrip\": false, \"normalized\": false, \"special\": " #special "}"

/* "hello world 12": merges make hello (259), Ġworld (264), 12 (266). */
static spec base_spec(void) {
  spec s = {{"he", "ll", "hell", "hello", "Ġw", "or", "Ġwor", "ld", "Ġworld", "ĠĠ", "12"},
            {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"Ġ", "w"}, {"o", "r"}, {"Ġw", "or"},
             {"l", "d"}, {"Ġwor", "ld"}, {"Ġ", "Ġ"}, {"1", "2"}},
            ADDED(267, "<|endoftext|>", true) ", " ADDED(268, "<|im_start|>", true) ", "
            ADDED(269, "<|im_end|>", true),
            NULL, NULL, NULL, NULL, NULL};
  return s;
}

/* byte b is token b (the vocab lists the 256 bytes first, in order) */
enum { ID_SPACE = ' ', ID_HELLO = 259, ID_GWORLD = 264, ID_GG = 265, ID_12 = 266, ID_EOT = 267, ID_IM_START = 268, ID_IM_END = 269 };

static ds_tokenizer *load_spec(const spec *s) {
  char *json = make_json(s);
  ds_tokenizer *tok = NULL;
  EXPECT_OK(ds_tokenizer_load_memory(json, strlen(json), "test.json", &tok));
  free(json);
  return tok;
}

static int ids_eq(const ds_ids *v, const int32_t *want, size_t n) {
  if (v->len != n) return 0;
  for (size_t i = 0; i < n; i++) if (v->ids[i] != want[i]) return 0;
  return 1;
}

static void print_ids(const char *what, const ds_ids *v) {
  fprintf(stderr, "  %s:", what);
  for (size_t i = 0; i < v->len; i++) fprintf(stderr, " %d", (int)v->ids[i]);
  fprintf(stderr, "\n");
}

#define EXPECT_IDS(v, ...)                                                       \
  do {                                                                           \
    const int32_t want_[] = {__VA_ARGS__};                                       \
    int ok_ = ids_eq((v), want_, sizeof want_ / sizeof want_[0]);                \
    EXPECT(ok_ && #v " == {" #__VA_ARGS__ "}");                                 \
    if (!ok_) print_ids(#v, (v));                                                \
  } while (0)

static ds_ids encode(const ds_tokenizer *tok, const char *text, int add_special) {
  ds_ids v = {0};
  EXPECT_OK(ds_tokenizer_encode(tok, text, strlen(text), add_special, &v));
  return v;
}

static void expect_round_trip(const ds_tokenizer *tok, const char *text) {
  ds_ids v = encode(tok, text, 0);
  char *out = NULL;
  size_t n = 0;
  EXPECT_OK(ds_tokenizer_decode(tok, v.ids, v.len, 0, &out, &n));
  EXPECT(out && n == strlen(text) && !memcmp(out, text, n));
  if (out && strcmp(out, text)) fprintf(stderr, "  round trip of '%s' gave '%s'\n", text, out);
  free(out);
  ds_ids_free(&v);
}

/* ---------------------------------------------------------------- tests */

static void test_merges_and_added_tokens(void) {
  spec s = base_spec();
  ds_tokenizer *tok = load_spec(&s);
  if (!tok) return;
  EXPECT(ds_tokenizer_vocab_size(tok) == 270);
  EXPECT(ds_tokenizer_token_to_id(tok, "hello") == ID_HELLO);
  EXPECT(ds_tokenizer_token_to_id(tok, "Ġworld") == ID_GWORLD);
  EXPECT(ds_tokenizer_token_to_id(tok, "<|im_end|>") == ID_IM_END);
  EXPECT(ds_tokenizer_token_to_id(tok, "nope") == -1);
  EXPECT(ds_tokenizer_id_to_token(tok, ID_GWORLD) && !strcmp(ds_tokenizer_id_to_token(tok, ID_GWORLD), "Ġworld"));
  EXPECT(ds_tokenizer_id_to_token(tok, 270) == NULL && ds_tokenizer_id_to_token(tok, -1) == NULL);

  ds_ids v = encode(tok, "hello world", 0);
  EXPECT_IDS(&v, ID_HELLO, ID_GWORLD);
  ds_ids_free(&v);
  /* GPT-2 regex: "  world" is " " + " world"; "12" merges; specials split the text */
  v = encode(tok, "hello  world<|endoftext|>12<|im_start|><|im_end|>", 0);
  EXPECT_IDS(&v, ID_HELLO, ID_SPACE, ID_GWORLD, ID_EOT, ID_12, ID_IM_START, ID_IM_END);
  ds_ids_free(&v);
  v = encode(tok, "", 1);
  EXPECT(v.len == 0);
  ds_ids_free(&v);
  /* bytes without merges stay single-byte tokens: U+00FF is the bytes C3 BF */
  v = encode(tok, "\xc3\xbf", 0);
  EXPECT_IDS(&v, 0xC3, 0xBF);
  ds_ids_free(&v);

  expect_round_trip(tok, "hello world");
  expect_round_trip(tok, "  tabs\tand\nnewlines\r\n  <|im_start|>x<|im_end|>  ");
  expect_round_trip(tok, "北京 café 😀 e\xcc\x81");

  /* decode: skip_special, bytes split across tokens, invalid bytes, unknown ids */
  const int32_t ids[] = {ID_IM_START, ID_HELLO, ID_IM_END};
  char *out;
  size_t n;
  EXPECT_OK(ds_tokenizer_decode(tok, ids, 3, 1, &out, &n));
  EXPECT(!strcmp(out, "hello") && n == 5);
  free(out);
  const int32_t broken[] = {0xE5, 0x8C, ID_HELLO, 0xFF}; /* a truncated 3-byte sequence, then 0xFF */
  EXPECT_OK(ds_tokenizer_decode(tok, broken, 4, 0, &out, &n));
  EXPECT(!strcmp(out, "\xEF\xBF\xBDhello\xEF\xBF\xBD"));
  free(out);
  const int32_t bad[] = {ID_HELLO, 9999};
  EXPECT(ds_tokenizer_decode(tok, bad, 2, 0, &out, &n) == DS_ERR_RANGE);
  EXPECT(strstr(ds_last_error(), "9999") != NULL);

  /* text that is not UTF-8 is refused */
  ds_ids w = {0};
  EXPECT(ds_tokenizer_encode(tok, "ab\xC3(", 4, 0, &w) == DS_ERR_ARG);
  EXPECT(strstr(ds_last_error(), "UTF-8") != NULL && w.len == 0);
  ds_tokenizer_free(tok);
}

static void test_pretokenizer_variants(void) {
  /* Qwen2-style Split + NFC: "e" + U+0301 becomes "é" before BPE; digits split one by one. */
  spec s = base_spec();
  s.normalizer = "{\"type\": \"NFC\"}";
  s.pre_tokenizer =
      "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": "
      "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*"
      "|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"}, \"behavior\": \"Isolated\", \"invert\": false}, "
      "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": false, \"use_regex\": false}]}";
  ds_tokenizer *tok = load_spec(&s);
  if (!tok) return;
  ds_ids a = encode(tok, "caf\xc3\xa9 12", 0), b = encode(tok, "cafe\xcc\x81 12", 0);
  EXPECT(a.len == b.len && a.len > 0 && !memcmp(a.ids, b.ids, a.len * sizeof *a.ids));
  EXPECT(a.len >= 2 && a.ids[a.len - 1] == '2' && a.ids[a.len - 2] == '1'); /* \p{N}: no "12" */
  ds_ids_free(&a);
  ds_ids_free(&b);
  ds_tokenizer_free(tok);

  /* ByteLevel with add_prefix_space, a template post-processor adding <|endoftext|> around */
  s = base_spec();
  s.pre_tokenizer = "{\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true}";
  s.post_processor =
      "{\"type\": \"Sequence\", \"processors\": [{\"type\": \"ByteLevel\", \"trim_offsets\": false}, "
      "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<|im_start|>\", \"type_id\": 0}}, "
      "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, {\"SpecialToken\": {\"id\": \"<|im_end|>\", \"type_id\": 0}}], "
      "\"special_tokens\": {\"<|im_start|>\": {\"id\": \"<|im_start|>\", \"ids\": [268], \"tokens\": [\"<|im_start|>\"]}, "
      "\"<|im_end|>\": {\"id\": \"<|im_end|>\", \"ids\": [269], \"tokens\": [\"<|im_end|>\"]}}}]}";
  tok = load_spec(&s);
  if (!tok) return;
  ds_ids v = encode(tok, "world", 1);
  EXPECT_IDS(&v, ID_IM_START, ID_GWORLD, ID_IM_END);
  ds_ids_free(&v);
  v = encode(tok, "world", 0);
  EXPECT_IDS(&v, ID_GWORLD);
  ds_ids_free(&v);
  /* the prefix space is added to each piece between added tokens */
  v = encode(tok, "world<|endoftext|>world", 0);
  EXPECT_IDS(&v, ID_GWORLD, ID_EOT, ID_GWORLD);
  ds_ids_free(&v);
  ds_tokenizer_free(tok);
}

static void test_added_token_flags(void) {
  spec s = base_spec();
  s.added = "{\"id\": 267, \"content\": \"<m>\", \"lstrip\": true, \"rstrip\": true, \"normalized\": false, "
            "\"special\": true}, {\"id\": 268, \"content\": \"ab\", \"single_word\": true, \"special\": false}";
  ds_tokenizer *tok = load_spec(&s);
  if (!tok) return;
  ds_ids v = encode(tok, "hello  <m>  hello", 0); /* strips the spaces on both sides */
  EXPECT_IDS(&v, ID_HELLO, 267, ID_HELLO);
  ds_ids_free(&v);
  v = encode(tok, "ab cab ab", 0); /* "ab" only as a whole word */
  EXPECT_IDS(&v, 268, ID_SPACE, 'c', 'a', 'b', ID_SPACE, 268);
  ds_ids_free(&v);
  ds_tokenizer_free(tok);
}

static void test_chatml(void) {
  spec s = base_spec();
  ds_tokenizer *tok = load_spec(&s);
  if (!tok) return;
  ds_chat_message m[] = {{.role = "user", .content = "hello"}, {.role = "assistant", .content = "hello world"}};
  ds_ids ids = {0}, mask = {0};
  EXPECT_OK(ds_chat_encode_chatml(tok, m, 2, 1, &ids, &mask));
  /* <|im_start|>user\nhello<|im_end|>\n <|im_start|>assistant\nhello world<|im_end|>\n <|im_start|>assistant\n */
  ds_ids want = {0};
  const char *render = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\nhello world<|im_end|>\n"
                       "<|im_start|>assistant\n";
  EXPECT_OK(ds_tokenizer_encode(tok, render, strlen(render), 0, &want));
  EXPECT(ids.len == want.len && !memcmp(ids.ids, want.ids, ids.len * sizeof *ids.ids));
  EXPECT(mask.len == ids.len);
  /* the mask covers exactly "hello world<|im_end|>\n" of the assistant message */
  size_t first = 0, n1 = 0;
  for (size_t i = 0; i < mask.len; i++) {
    if (mask.ids[i] && !n1) first = i;
    n1 += (size_t)mask.ids[i];
  }
  EXPECT(n1 == 4);
  if (n1 == 4) {
    EXPECT(ids.ids[first] == ID_HELLO && ids.ids[first + 1] == ID_GWORLD && ids.ids[first + 2] == ID_IM_END &&
           ids.ids[first + 3] == '\n');
  }
  ds_ids_free(&ids);
  ds_ids_free(&mask);
  ds_ids_free(&want);
  ds_chat_message bad[] = {{.role = "user", .content = NULL}};
  EXPECT(ds_chat_encode_chatml(tok, bad, 1, 0, &ids, &mask) == DS_ERR_ARG && ids.len == 0 && mask.len == 0);
  ds_tokenizer_free(tok);
}

/* Heap-based BPE against the naive reference: random merge tables over {a, b, c}. */
static void test_bpe_heap_vs_naive(void) {
  uint64_t rng = 12345;
#define RND() (rng = rng * 6364136223846793005ull + 1442695040888963407ull, (uint32_t)(rng >> 33))
  for (int trial = 0; trial < 20; trial++) {
    /* every string over {a,b,c} of length 2..4 is a token; each gets one merge from a random
     * split, in random order (several merges may then compete for the same symbols) */
    static char toks[120][5];
    int nt = 0;
    for (int len = 2; len <= 4; len++) {
      int count = len == 2 ? 9 : len == 3 ? 27 : 81;
      for (int k = 0; k < count; k++) {
        int x = k;
        for (int i = 0; i < len; i++) { toks[nt][i] = (char)('a' + x % 3); x /= 3; }
        toks[nt][len] = 0;
        nt++;
      }
    }
    static char parts[120][2][5];
    int order[120];
    for (int i = 0; i < nt; i++) {
      int len = (int)strlen(toks[i]), k = 1 + (int)(RND() % (uint32_t)(len - 1));
      memcpy(parts[i][0], toks[i], (size_t)k);
      parts[i][0][k] = 0;
      strcpy(parts[i][1], toks[i] + k);
      order[i] = i;
    }
    for (int i = nt - 1; i > 0; i--) {
      int j = (int)(RND() % (uint32_t)(i + 1)), t = order[i];
      order[i] = order[j];
      order[j] = t;
    }
    sbuf b = {0};
    sb_printf(&b, "{\"model\": {\"type\": \"BPE\", \"vocab\": {");
    for (int i = 0; i < 256; i++) {
      char c[4];
      byte_char(i, c);
      sb_printf(&b, "%s\"", i ? ", " : "");
      put_token(&b, c);
      sb_printf(&b, "\": %d", i);
    }
    for (int i = 0; i < nt; i++) sb_printf(&b, ", \"%s\": %d", toks[i], 256 + i);
    sb_printf(&b, "}, \"merges\": [");
    int first = 1;
    for (int r = 0; r < nt; r++) {
      int i = order[r];
      sb_printf(&b, "%s\"%s %s\"", first ? "" : ", ", parts[i][0], parts[i][1]);
      first = 0;
    }
    sb_printf(&b, "]}, \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
                  "\"use_regex\": false}, \"decoder\": {\"type\": \"ByteLevel\"}}");
    ds_tokenizer *tok = NULL;
    EXPECT_OK(ds_tokenizer_load_memory(b.p, b.len, "random.json", &tok));
    free(b.p);
    if (!tok) return;
    tk_bpe_scratch scratch = {0};
    for (int w = 0; w < 300; w++) {
      unsigned char word[128];
      size_t n = 1 + RND() % 120; /* both the flat-array path and the heap path */
      for (size_t i = 0; i < n; i++) word[i] = (unsigned char)('a' + RND() % 3);
      ds_ids h = {0}, r = {0}, e = {0};
      EXPECT_OK(tk_bpe_word(tok, word, n, &scratch, &h));
      EXPECT_OK(tk_bpe_word_naive(tok, word, n, &r));
      EXPECT(h.len == r.len && !memcmp(h.ids, r.ids, h.len * sizeof *h.ids));
      /* the whole encode path (use_regex false: the word is one piece) agrees too */
      EXPECT_OK(ds_tokenizer_encode(tok, (const char *)word, n, 0, &e));
      EXPECT(e.len == r.len && !memcmp(e.ids, r.ids, e.len * sizeof *e.ids));
      ds_ids_free(&h);
      ds_ids_free(&r);
      ds_ids_free(&e);
    }
    /* and a long word is fast (heap, not quadratic) */
    unsigned char *big = malloc(200000);
    for (size_t i = 0; i < 200000; i++) big[i] = (unsigned char)('a' + RND() % 3);
    ds_ids h = {0};
    double t0 = ds_time_sec();
    EXPECT_OK(tk_bpe_word(tok, big, 200000, &scratch, &h));
    EXPECT(ds_time_sec() - t0 < 2.0);
    free(big);
    ds_ids_free(&h);
    tk_bpe_scratch_free(&scratch);
    ds_tokenizer_free(tok);
  }
#undef RND
}

/* Each bad file is refused with a non-OK status and a message naming the field. */
static void expect_refused(const char *json, const char *needle) {
  ds_tokenizer *tok = (ds_tokenizer *)1;
  ds_status st = ds_tokenizer_load_memory(json, strlen(json), "bad.json", &tok);
  EXPECT(st != DS_OK && tok == NULL);
  int named = strstr(ds_last_error(), needle) != NULL && strstr(ds_last_error(), "bad.json") != NULL;
  EXPECT(named);
  if (st == DS_OK || !named)
    fprintf(stderr, "  expected a refusal naming '%s', got %s: %s\n", needle, ds_status_name(st), ds_last_error());
  if (st == DS_OK) ds_tokenizer_free(tok);
}

static void expect_spec_refused(const spec *s, const char *needle) {
  char *json = make_json(s);
  expect_refused(json, needle);
  free(json);
}

static void test_bad_input(void) {
  expect_refused("{", "malformed JSON");
  expect_refused("[1, 2]", "object");
  expect_refused("{}", "model");
  expect_refused("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", "model.type");
  expect_refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a x\"]}}",
                 "model.merges[0]: unknown token 'x'");
  expect_refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"0\"}, \"merges\": []}}", "model.vocab['a']");
  expect_refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -3}, \"merges\": []}}", "model.vocab['a']");
  expect_refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": {}}}", "model.merges");
  expect_refused("{\"model\": {\"type\": \"BPE\", \"vocab\": [], \"merges\": []}}", "model.vocab");
  expect_refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a a\"]}}",
                 "model.merges[0]: merged token 'aa'");
  expect_refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a  a\"]}}", "model.merges[0]");
  expect_refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [[\"a\"]]}}", "model.merges[0]");
  expect_refused("{\"model\": {\"type\": \"BPE\", \"dropout\": 0.1, \"vocab\": {}, \"merges\": []}}", "model.dropout");
  expect_refused("{\"model\": {\"type\": \"BPE\", \"continuing_subword_prefix\": \"##\", \"vocab\": {}, \"merges\": []}}",
                 "continuing_subword_prefix");
  expect_refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": []}, "
                 "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false}, "
                 "\"decoder\": {\"type\": \"ByteLevel\"}}",
                 "id 0 is used by both");
  expect_refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [], \"ignore_merges\": 1}}",
                 "ignore_merges");
  spec s = base_spec();
  s.added = "{\"id\": 267, \"content\": 5}";
  expect_spec_refused(&s, "added_tokens[0]");
  s.added = "{\"id\": 300, \"content\": \"<x>\"}";
  expect_spec_refused(&s, "added_tokens[0].id");
  s.added = "{\"id\": 267, \"content\": \"<x>\", \"special\": \"yes\"}";
  expect_spec_refused(&s, "special");
  s = base_spec();
  s.normalizer = "{\"type\": \"NFKC\"}";
  expect_spec_refused(&s, "normalizer");
  s = base_spec();
  s.decoder = "null";
  expect_spec_refused(&s, "decoder");
  s.decoder = "{\"type\": \"WordPiece\"}";
  expect_spec_refused(&s, "decoder");
  s = base_spec();
  s.pre_tokenizer = "{\"type\": \"ByteLevel\"}";
  expect_spec_refused(&s, "add_prefix_space");
  s.pre_tokenizer = "{\"type\": \"Whitespace\"}";
  expect_spec_refused(&s, "pre_tokenizer");
  s.pre_tokenizer = "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, "
                    "\"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false}]}";
  expect_spec_refused(&s, "pre_tokenizer.pretokenizers[0]");
  s.pre_tokenizer = "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, "
                    "\"behavior\": \"Sideways\", \"invert\": false}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false}]}";
  expect_spec_refused(&s, "Sideways");
  s.pre_tokenizer = "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"ByteLevel\", \"add_prefix_space\": false}, "
                    "{\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, \"behavior\": \"Isolated\", \"invert\": false}]}";
  expect_spec_refused(&s, "ByteLevel must be the last step");
  s = base_spec();
  s.post_processor = "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, "
                     "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"special_tokens\": {}}";
  expect_spec_refused(&s, "post_processor.single[0]");
  s.post_processor = "{\"type\": \"RobertaProcessing\"}";
  expect_spec_refused(&s, "post_processor");
  s = base_spec();
  s.model_extra = ", \"unk_token\": 3";
  expect_spec_refused(&s, "unk_token");
  s.model_extra = ", \"byte_fallback\": \"no\"";
  expect_spec_refused(&s, "byte_fallback");
  /* an unk token is accepted when every byte has a token: it can never be produced */
  s.model_extra = ", \"unk_token\": \"<unk>\", \"byte_fallback\": false";
  ds_tokenizer *ok = load_spec(&s);
  ds_tokenizer_free(ok);

  /* a valid file cut short anywhere is refused, never crashes */
  s = base_spec();
  char *json = make_json(&s);
  size_t n = strlen(json);
  for (size_t cut = 0; cut < n; cut += n / 97 + 1) {
    ds_tokenizer *tok = NULL;
    EXPECT(ds_tokenizer_load_memory(json, cut, "cut.json", &tok) != DS_OK && tok == NULL);
  }
  free(json);
}

static void test_files(const char *dir) {
  spec s = base_spec();
  char *json = make_json(&s);
  char path[1100];
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  EXPECT_OK(ds_write_file_atomic(path, json, strlen(json)));
  free(json);
  ds_tokenizer *tok = NULL;
  EXPECT_OK(ds_tokenizer_load(path, &tok));
  ds_tokenizer_free(tok);
  snprintf(path, sizeof path, "%s/missing.json", dir);
  EXPECT(ds_tokenizer_load(path, &tok) == DS_ERR_IO && tok == NULL);
  EXPECT(strstr(ds_last_error(), "missing.json") != NULL);
}

static int mkdir_p(const char *path) { return ds_mkdir_p(path) == DS_OK ? 0 : -1; }

static char g_dir[1024];
static void test_files_run(void) { test_files(g_dir); }

int main(void) {
  const char *base = getenv("DSPARK_TEST_TMP");
  snprintf(g_dir, sizeof g_dir, "%s/test_tokenizer.%ld", base && base[0] ? base : "/tmp", (long)getpid());
  if (mkdir_p(g_dir) != 0) {
    fprintf(stderr, "cannot create %s: %s\n", g_dir, strerror(errno));
    return 2;
  }
  TEST_RUN(test_merges_and_added_tokens);
  TEST_RUN(test_pretokenizer_variants);
  TEST_RUN(test_added_token_flags);
  TEST_RUN(test_chatml);
  TEST_RUN(test_bpe_heap_vs_naive);
  TEST_RUN(test_bad_input);
  TEST_RUN(test_files_run);
  return TEST_RESULT();
}
