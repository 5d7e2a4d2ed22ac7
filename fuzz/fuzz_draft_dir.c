/* libFuzzer target: an exported draft directory (config.json + model.safetensors, the HF layout
 * `dspark export --out` writes and `speculate --draft DIR` reads, ours or another writer's) from
 * arbitrary bytes: the input is split at the first "\n\x01\n" into the two files, written to a
 * directory of this process's own under TMPDIR (or /tmp), and loaded by ds_draft_load_hf, which
 * checks every tensor against the config (shapes, dtypes, a reduced vocabulary's d2t / t2d). A
 * draft that loads must export again (its config.json standing for the target's, as an exported
 * config may) and load back from that export (a second directory) with the same configuration. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dspark/backend.h"
#include "dspark/draft.h"
#include "dspark/fileio.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_in[256], g_out[256 + 8]; /* g_out: g_in ".export" */

/* the two directories and their files, removed when the fuzzer exits */
static void remove_dirs(void) {
  static const char *const names[] = {"config.json", "model.safetensors"};
  const char *dirs[2] = {g_in, g_out};
  for (int i = 0; i < 2; i++) {
    char path[512];
    for (int k = 0; k < 2; k++) {
      snprintf(path, sizeof path, "%s/%s", dirs[i], names[k]);
      unlink(path);
    }
    rmdir(dirs[i]);
  }
}

static void write_part(const char *dir, const char *name, const uint8_t *p, size_t n) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  DS_CHECK(f != NULL);
  DS_CHECK(n == 0 || fwrite(p, 1, n, f) == n);
  fclose(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!g_in[0]) {
    const char *tmp = getenv("TMPDIR");
    snprintf(g_in, sizeof g_in, "%s/fuzz_draft_dir.%ld", tmp && tmp[0] ? tmp : "/tmp", (long)getpid());
    snprintf(g_out, sizeof g_out, "%s.export", g_in);
    DS_CHECK(ds_mkdir_p(g_in) == DS_OK && ds_mkdir_p(g_out) == DS_OK);
    atexit(remove_dirs);
  }
  const uint8_t *sep = NULL;
  for (size_t i = 0; i + 3 <= size; i++)
    if (data[i] == '\n' && data[i + 1] == 1 && data[i + 2] == '\n') { sep = data + i; break; }
  if (!sep) return 0;
  write_part(g_in, "config.json", data, (size_t)(sep - data));
  write_part(g_in, "model.safetensors", sep + 3, (size_t)(data + size - sep - 3));
  ds_draft *d = NULL;
  if (ds_draft_load_hf(g_in, ds_backend_cpu(), &d) != DS_OK) return 0;
  if (memchr(data, 0, (size_t)(sep - data))) { /* a NUL the reader skipped (in a key it ignores) ends the text */
    ds_draft_free(d);
    return 0;
  }
  /* what loaded exports, and the export loads to the same configuration */
  char *cfg = malloc((size_t)(sep - data) + 1);
  DS_CHECK(cfg != NULL);
  memcpy(cfg, data, (size_t)(sep - data));
  cfg[sep - data] = 0;
  DS_CHECK(ds_draft_export_hf(d, cfg, g_out) == DS_OK);
  free(cfg);
  ds_draft *back = NULL;
  DS_CHECK(ds_draft_load_hf(g_out, ds_backend_cpu(), &back) == DS_OK);
  const ds_draft_config *a = ds_draft_get_config(d), *b = ds_draft_get_config(back);
  DS_CHECK(a->markov_type == b->markov_type && a->markov_rank == b->markov_rank &&
           a->block_size == b->block_size && a->draft_vocab_size == b->draft_vocab_size);
  ds_draft_free(back);
  ds_draft_free(d);
  return 0;
}
