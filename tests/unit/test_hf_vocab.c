/* The vocabulary of a draft's GGUF from a target's HF directory (ds_hf_vocab_gguf): what it
 * refuses, each by name, on a tiny byte-level BPE directory written here. The keys themselves
 * are compared with llama.cpp's converter by tests/conformance/test_gguf_draft.py (this tiny
 * vocabulary is none the converter can name, so here it stops at the pre-tokenizer, as the
 * converter would, with the check text's digest in the message). */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dspark/fileio.h"
#include "dspark/gguf_model.h"
#include "test_util.h"

static char g_dir[1024];

/* The 256 bytes of GPT-2's alphabet as tokens 0..255, <|endoftext|> 256 and one merge, "33"
 * (257): GPT-2's split keeps digits together and so merges them, Qwen2's splits each digit. */
static char *byte_vocab_json(const char *model_type, const char *extra_model) {
  size_t cap = 1 << 16, n = 0;
  char *j = malloc(cap);
  n += (size_t)snprintf(j + n, cap - n, "{\"version\": \"1.0\", \"added_tokens\": [{\"id\": 256, \"content\": "
                        "\"<|endoftext|>\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
                        "\"normalized\": false, \"special\": true}], \"normalizer\": null, \"pre_tokenizer\": "
                        "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": "
                        "true}, \"post_processor\": null, \"decoder\": {\"type\": \"ByteLevel\"}, \"model\": "
                        "{\"type\": \"%s\"%s, \"vocab\": {", model_type, extra_model);
  for (unsigned b = 0, k = 0; b < 256; b++) {
    int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    unsigned cp = printable ? b : 256 + k++;
    char c[4] = {0};
    if (cp < 0x80) c[0] = (char)cp;
    else c[0] = (char)(0xC0 | cp >> 6), c[1] = (char)(0x80 | (cp & 0x3F));
    n += (size_t)snprintf(j + n, cap - n, "%s\"%s%s\": %u", b ? ", " : "", c[0] == '"' || c[0] == '\\' ? "\\" : "", c, b);
  }
  n += (size_t)snprintf(j + n, cap - n, ", \"<|endoftext|>\": 256, \"33\": 257}, \"merges\": [\"3 3\"]}}");
  return j;
}

static void put(const char *dir, const char *name, const char *text) {
  char *p = ds_path_join(dir, name);
  EXPECT_OK(ds_write_file_atomic(p, text, strlen(text)));
  free(p);
}

/* A fresh directory: config.json of arch / model_type / vocab, the byte vocabulary, a
 * tokenizer_config.json; returns its path (static). */
static const char *make_dir(const char *name, const char *arch, const char *model_type, int vocab,
                            const char *model, const char *model_extra, const char *tok_config) {
  static char dir[1200];
  snprintf(dir, sizeof dir, "%s/%s", g_dir, name);
  EXPECT_OK(ds_mkdir_p(dir));
  char cfg[512];
  snprintf(cfg, sizeof cfg, "{\"architectures\": [\"%s\"], \"model_type\": \"%s\", \"vocab_size\": %d}", arch,
           model_type, vocab);
  put(dir, "config.json", cfg);
  char *tj = byte_vocab_json(model, model_extra);
  put(dir, "tokenizer.json", tj);
  free(tj);
  put(dir, "tokenizer_config.json", tok_config);
  return dir;
}

static void expect_refused(const char *dir, int64_t vocab, ds_status want, const char *n1, const char *n2) {
  ds_gguf_writer *w = ds_gguf_writer_new();
  ds_status st = ds_hf_vocab_gguf(dir, vocab, w);
  const char *err = ds_last_error();
  int ok = st == want && strstr(err, n1) && (!n2 || strstr(err, n2));
  if (!ok) fprintf(stderr, "%s: status %s, message: %s\n", dir, ds_status_name(st), err);
  EXPECT(ok);
  EXPECT(ds_gguf_writer_kv_count(w) == 0);
  ds_gguf_writer_free(w);
}

static const char *k_gpt2 = "{\"tokenizer_class\": \"GPT2Tokenizer\", \"eos_token\": \"<|endoftext|>\"}";

static void test_unknown_pre_tokenizer(void) {
  const char *d = make_dir("tiny", "LlamaForCausalLM", "llama", 300, "BPE", "", k_gpt2);
  expect_refused(d, 300, DS_ERR_UNSUPPORTED, "pre-tokenizer", "GPT2Tokenizer");
  /* the message carries the digest: 64 hex digits after "hash to " */
  const char *h = strstr(ds_last_error(), "hash to ");
  int hex = 0;
  for (const char *p = h ? h + 8 : ""; (*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'); p++) hex++;
  EXPECT(hex == 64);
  /* the same directory under another class: Qwen2's split, another digest */
  char first[65] = "";
  if (h) memcpy(first, h + 8, 64), first[64] = 0;
  d = make_dir("tiny-qwen2", "Qwen2ForCausalLM", "qwen2", 300, "BPE", "", k_gpt2);
  expect_refused(d, 300, DS_ERR_UNSUPPORTED, "pre-tokenizer", "Qwen2Tokenizer");
  h = strstr(ds_last_error(), "hash to ");
  EXPECT(h && first[0] && strncmp(h + 8, first, 64));
}

static void test_refusals(void) {
  const char *d = make_dir("wordpiece", "LlamaForCausalLM", "llama", 300, "WordPiece", "", k_gpt2);
  expect_refused(d, 300, DS_ERR_UNSUPPORTED, "'WordPiece'", "not a BPE");
  d = make_dir("fallback", "LlamaForCausalLM", "llama", 300, "BPE", ", \"byte_fallback\": true", k_gpt2);
  expect_refused(d, 300, DS_ERR_UNSUPPORTED, "byte_fallback", NULL);
  d = make_dir("spm", "LlamaForCausalLM", "llama", 300, "BPE", "", k_gpt2);
  put(d, "tokenizer.model", "x");
  expect_refused(d, 300, DS_ERR_UNSUPPORTED, "SentencePiece", "tokenizer.model");
  d = make_dir("bert", "LlamaForCausalLM", "llama", 300, "BPE", "", "{\"tokenizer_class\": \"BertTokenizer\"}");
  expect_refused(d, 300, DS_ERR_UNSUPPORTED, "'BertTokenizer'", NULL);
  d = make_dir("remote", "LlamaForCausalLM", "llama", 300, "BPE", "", "{\"auto_map\": {}}");
  expect_refused(d, 300, DS_ERR_UNSUPPORTED, "auto_map", NULL);
  d = make_dir("gemma", "GemmaForCausalLM", "gemma", 300, "BPE", "", k_gpt2);
  expect_refused(d, 300, DS_ERR_UNSUPPORTED, "'GemmaForCausalLM'", NULL);
  d = make_dir("other-size", "LlamaForCausalLM", "llama", 512, "BPE", "", k_gpt2);
  expect_refused(d, 300, DS_ERR_FORMAT, "vocab_size 512", "not the draft's target");
  d = make_dir("legacy", "LlamaForCausalLM", "llama", 300, "BPE", "", k_gpt2);
  put(d, "added_tokens.json", "{}");
  expect_refused(d, 300, DS_ERR_UNSUPPORTED, "added_tokens.json", NULL);
  d = make_dir("bad-config", "LlamaForCausalLM", "llama", 300, "BPE", "", "{\"tokenizer_class\": ");
  expect_refused(d, 300, DS_ERR_FORMAT, "tokenizer_config.json", "malformed JSON");
  char missing[1200];
  snprintf(missing, sizeof missing, "%s/absent", g_dir);
  expect_refused(missing, 300, DS_ERR_NOT_FOUND, "config.json", NULL);
}

int main(void) {
  const char *base = getenv("DSPARK_TEST_TMP");
  snprintf(g_dir, sizeof g_dir, "%s/test_hf_vocab.%ld", base && base[0] ? base : "/tmp", (long)getpid());
  if (ds_mkdir_p(g_dir) != DS_OK) {
    fprintf(stderr, "cannot create %s: %s\n", g_dir, strerror(errno));
    return 2;
  }
  TEST_RUN(test_unknown_pre_tokenizer);
  TEST_RUN(test_refusals);
  return TEST_RESULT();
}
