/* libFuzzer target: a Hugging Face model directory's tokenizer files as `dspark export --gguf
 * --target DIR` reads them (ds_hf_vocab_gguf: src/model/hf_vocab_*.c), from arbitrary bytes. The
 * input is split at each "\n\x01\n" into config.json, tokenizer.json, tokenizer_config.json,
 * special_tokens_map.json, added_tokens.json and merges.txt, in that order; a file the input does
 * not reach is absent. They are written to a directory of this process's own under TMPDIR (or
 * /tmp) and read from there, as the command reads them; the tokenizer.* keys are built for the
 * vocabulary size the input's first byte chooses. The writer is discarded: a successful read only
 * has to touch every byte it keeps. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dspark/fileio.h"
#include "dspark/gguf_model.h"
#include "dspark/gguf_write.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const k_files[] = {"config.json",          "tokenizer.json",     "tokenizer_config.json",
                                      "special_tokens_map.json", "added_tokens.json", "merges.txt"};
enum { N_FILES = sizeof k_files / sizeof k_files[0] };

static char g_dir[256];

/* the directory and its files, removed when the fuzzer exits */
static void remove_dir(void) {
  for (int i = 0; i < N_FILES; i++) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, k_files[i]);
    unlink(path);
  }
  rmdir(g_dir);
}

static void write_part(const char *name, const uint8_t *p, size_t n) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", g_dir, name);
  FILE *f = fopen(path, "wb");
  DS_CHECK(f != NULL);
  DS_CHECK(fwrite(p, 1, n, f) == n || n == 0);
  fclose(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!g_dir[0]) {
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/fuzz_hf_vocab.%ld", tmp && tmp[0] ? tmp : "/tmp", (long)getpid());
    DS_CHECK(ds_mkdir_p(g_dir) == DS_OK);
    atexit(remove_dir);
  }
  if (size < 1) return 0;
  static const int64_t k_vocab[] = {8, 64, 263, 300, 49152};
  int64_t vocab = k_vocab[data[0] % (sizeof k_vocab / sizeof k_vocab[0])];
  const uint8_t *p = data + 1, *end = data + size;
  for (int i = 0; i < N_FILES; i++) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, k_files[i]);
    unlink(path);
  }
  for (int i = 0; i < N_FILES && p <= end; i++) {
    const uint8_t *sep = NULL;
    for (const uint8_t *q = p; q + 3 <= end; q++)
      if (q[0] == '\n' && q[1] == 1 && q[2] == '\n') { sep = q; break; }
    write_part(k_files[i], p, (size_t)((sep ? sep : end) - p));
    if (!sep) break;
    p = sep + 3;
  }
  ds_gguf_writer *w = ds_gguf_writer_new();
  DS_CHECK(w != NULL);
  (void)ds_hf_vocab_gguf(g_dir, vocab, w);
  ds_gguf_writer_free(w);
  return 0;
}
