/* libFuzzer target for the offline cache's manifest.json parser (a cache folder is input a user
 * may get from elsewhere). Each input is parsed as it is, then once more sealed (its leading
 * "manifest_xxh64" field set to the text's own checksum, as `capture` writes it) so that
 * mutations get past the checksum to the full acceptance path. Findings: a crash, an accepted
 * manifest whose fields break the parser's promises (layers, shards in sequence with their
 * counts), and one that does not survive writing and parsing again unchanged. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/cache.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_accepted(const ds_cache_manifest *m) {
  if (m->n_layers < 1 || m->n_layers > DS_CACHE_MAX_LAYERS || m->n_shards < 0 || m->seq_length <= 0) __builtin_trap();
  int64_t samples = 0;
  for (int64_t i = 0; i < m->n_shards; i++) {
    char name[32];
    ds_cache_shard_name(i, name, sizeof name);
    if (strcmp(name, m->shards[i].file) || m->shards[i].num_samples < 0) __builtin_trap();
    samples += m->shards[i].num_samples;
  }
  if (m->complete && samples != m->num_samples) __builtin_trap();
  /* written and parsed again: the same manifest, the same text */
  char *text = ds_cache_manifest_json(m);
  if (!text) return; /* out of memory */
  ds_cache_manifest again;
  if (ds_cache_manifest_parse(text, strlen(text), "fuzz manifest (rewritten)", &again) != DS_OK) __builtin_trap();
  char *text2 = ds_cache_manifest_json(&again);
  if (text2 && strcmp(text, text2)) __builtin_trap();
  free(text2);
  free(text);
  ds_cache_manifest_free(&again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ds_cache_manifest m;
  if (ds_cache_manifest_parse((const char *)data, size, "fuzz manifest.json", &m) == DS_OK) {
    check_accepted(&m);
    ds_cache_manifest_free(&m);
  }
  char *sealed = malloc(size ? size : 1);
  if (!sealed) return 0;
  memcpy(sealed, data, size);
  if (ds_cache_manifest_seal(sealed, size) &&
      ds_cache_manifest_parse(sealed, size, "fuzz manifest.json (sealed)", &m) == DS_OK) {
    check_accepted(&m);
    ds_cache_manifest_free(&m);
  }
  free(sealed);
  return 0;
}
