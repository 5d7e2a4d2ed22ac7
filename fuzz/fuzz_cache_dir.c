/* libFuzzer target: an offline feature cache's directory as `dspark train --cache` and `distill
 * --cache` read it (src/io/cache_reader.c, cache_stream.c), from arbitrary bytes. A cache is input
 * a user may get from elsewhere. The input is split at each "\n\x01\n" into manifest.json,
 * target_config.json, tokenizer.json, target_weights.safetensors, shard-000000.safetensors and
 * shard-000001.safetensors; a file the input does not reach is absent. The manifest is sealed as
 * `capture` writes it: the checksums it records of the other files are set to theirs, then its
 * own, so that mutations reach the shards' checks and reads rather than stopping at a checksum.
 * Findings: a crash or undefined behaviour; an opened cache whose tokens break the reader's
 * promises (lengths in [1, S], ids in the vocabulary, masks 0 or 1, zero padding); a sample read
 * with a NaN or infinite feature or a NaN or +inf log-prob; the prefetching stream giving other
 * values than a direct read of the same sample. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <xxhash.h>

#include "dspark/cache.h"
#include "dspark/fileio.h"
#include "dspark/sequences.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { P_MANIFEST, P_CONFIG, P_TOKENIZER, P_WEIGHTS, P_SHARD0, P_SHARD1, N_PARTS };
static const char *const k_files[N_PARTS] = {"manifest.json",  "target_config.json",      "tokenizer.json",
                                             "target_weights.safetensors", "shard-000000.safetensors",
                                             "shard-000001.safetensors"};
/* the manifest's field holding each part's checksum (shards: shards[i].xxh64) */
static const char *const k_hash_fields[N_PARTS] = {NULL, "target_config_xxh64", "tokenizer_xxh64",
                                                   "target_weights_file_xxh64", NULL, NULL};
enum { MAX_SAMPLES = 48 }; /* samples read per input: enough for two small shards, bounded time */

static char g_dir[256];

static void part_path(int i, char *path, size_t n) { snprintf(path, n, "%s/%s", g_dir, k_files[i]); }

/* the directory and its files, removed when the fuzzer exits */
static void remove_dir(void) {
  char path[512];
  for (int i = 0; i < N_PARTS; i++) {
    part_path(i, path, sizeof path);
    unlink(path);
  }
  snprintf(path, sizeof path, "%s/.lock", g_dir);
  unlink(path);
  rmdir(g_dir);
}

static void write_file(int i, const void *p, size_t n) {
  char path[512];
  part_path(i, path, sizeof path);
  FILE *f = fopen(path, "wb");
  DS_CHECK(f != NULL);
  DS_CHECK(fwrite(p, 1, n, f) == n || n == 0);
  fclose(f);
}

static void set_hex(cJSON *o, const char *key, uint64_t h) {
  char hex[17];
  ds_cache_hex(h, hex);
  if (cJSON_GetObjectItemCaseSensitive(o, key)) cJSON_ReplaceItemInObjectCaseSensitive(o, key, cJSON_CreateString(hex));
}

/* The manifest with the checksums of the parts present set to theirs and its own sealed; the
 * input as it is when it is not a JSON object. */
static void write_manifest(const uint8_t *text, size_t n, const uint8_t *const *part, const size_t *len,
                           const int *present) {
  cJSON *j = cJSON_ParseWithLength((const char *)text, n);
  if (!cJSON_IsObject(j)) {
    cJSON_Delete(j);
    write_file(P_MANIFEST, text, n);
    return;
  }
  for (int i = P_CONFIG; i <= P_WEIGHTS; i++)
    if (present[i]) set_hex(j, k_hash_fields[i], XXH64(part[i], len[i], 0));
  cJSON *shards = cJSON_GetObjectItemCaseSensitive(j, "shards");
  for (int s = 0; s < 2; s++) {
    cJSON *sh = cJSON_GetArrayItem(shards, s);
    int k = P_SHARD0 + s;
    if (present[k] && cJSON_IsObject(sh)) set_hex(sh, "xxh64", XXH64(part[k], len[k], 0));
  }
  char *out = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  if (!out) return;
  size_t m = strlen(out);
  (void)ds_cache_manifest_seal(out, m);
  write_file(P_MANIFEST, out, m);
  free(out);
}

static void check_tokens(const ds_cache_manifest *m, const ds_dataset *ds) {
  if (ds->n_seqs != m->num_samples || ds->seq_len != m->seq_length) __builtin_trap();
  for (int64_t q = 0; q < ds->n_seqs; q++) {
    int64_t len = ds->lengths[q];
    if (len < 1 || len > ds->seq_len) __builtin_trap();
    for (int64_t t = 0; t < ds->seq_len; t++) {
      int32_t id = ds->ids[q * ds->seq_len + t];
      uint8_t mk = ds->loss_mask[q * ds->seq_len + t];
      if (mk > 1 || id < 0 || id >= m->vocab_size) __builtin_trap();
      if (t >= len && (id != 0 || mk != 0)) __builtin_trap();
    }
  }
}

static void check_finite(const float *x, int64_t n, int allow_neg_inf) {
  for (int64_t i = 0; i < n; i++)
    if (isnan(x[i]) || (isinf(x[i]) && !(allow_neg_inf && x[i] < 0))) __builtin_trap();
}

/* one sample's fp32 rows as ds_cache_read_sample gives them */
typedef struct {
  float *ctx, *last, *lp;
  int32_t *ids;
} sample_buf;

static void read_and_stream(ds_cache *c, const ds_cache_manifest *m) {
  int64_t S = m->seq_length, md = m->hidden_size * m->n_layers, d = m->hidden_size, K = m->kd_topk;
  int64_t n = m->num_samples < MAX_SAMPLES ? m->num_samples : MAX_SAMPLES;
  if (n <= 0) return;
  int feat = m->features, kd = K > 0;
  sample_buf b = {feat ? malloc((size_t)(S * md) * 4) : NULL, feat ? malloc((size_t)(S * d) * 4) : NULL,
                  kd ? malloc((size_t)(S * K) * 4) : NULL, kd ? malloc((size_t)(S * K) * 4) : NULL};
  int64_t ok_upto = 0; /* samples [0, ok_upto) read well, in order */
  for (int64_t i = 0; i < n; i++) {
    if (ds_cache_read_sample(c, i, b.ctx, b.last, b.ids, b.lp) != DS_OK) break;
    int64_t len = ds_cache_sample_length(c, i);
    if (len < 1 || len > S) __builtin_trap();
    if (feat) {
      check_finite(b.ctx, len * md, 0);
      check_finite(b.last, len * d, 0);
    }
    if (kd) check_finite(b.lp, len * K, 1);
    ok_upto = i + 1;
  }
  /* The stream over the samples that read well: the same values, bit for bit, in order. */
  ds_cache_stream *s = NULL;
  if (ok_upto > 0 && ds_cache_stream_start(c, 2, kd, &s) == DS_OK) {
    int64_t pushed = 0;
    for (int64_t i = 0; i < ok_upto; i++) {
      while (pushed < ok_upto && ds_cache_stream_space(s) > 0)
        if (ds_cache_stream_push(s, pushed++) != DS_OK) __builtin_trap();
      ds_cache_sample got;
      if (ds_cache_stream_next(s, &got) != DS_OK) __builtin_trap(); /* the direct read of it passed */
      int64_t len = ds_cache_sample_length(c, i);
      if (got.index != i || got.length != len) __builtin_trap();
      if (ds_cache_read_sample(c, i, b.ctx, b.last, b.ids, b.lp) != DS_OK) __builtin_trap();
      if (feat && (memcmp(got.ctx, b.ctx, (size_t)(len * md) * 4) || memcmp(got.last, b.last, (size_t)(len * d) * 4)))
        __builtin_trap();
      if (kd && (memcmp(got.topk_ids, b.ids, (size_t)(len * K) * 4) ||
                 memcmp(got.topk_logprobs, b.lp, (size_t)(len * K) * 4)))
        __builtin_trap();
    }
    ds_cache_stream_free(s);
  }
  free(b.ctx);
  free(b.last);
  free(b.lp);
  free(b.ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!g_dir[0]) {
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/fuzz_cache_dir.%ld", tmp && tmp[0] ? tmp : "/tmp", (long)getpid());
    DS_CHECK(ds_mkdir_p(g_dir) == DS_OK);
    atexit(remove_dir);
  }
  const uint8_t *part[N_PARTS] = {0};
  size_t len[N_PARTS] = {0};
  int present[N_PARTS] = {0};
  const uint8_t *p = data, *end = data + size;
  for (int i = 0; i < N_PARTS && p <= end; i++) {
    const uint8_t *sep = NULL;
    for (const uint8_t *q = p; q + 3 <= end; q++)
      if (q[0] == '\n' && q[1] == 1 && q[2] == '\n') {
        sep = q;
        break;
      }
    part[i] = p;
    len[i] = (size_t)((sep ? sep : end) - p);
    present[i] = 1;
    if (!sep) break;
    p = sep + 3;
  }
  for (int i = 0; i < N_PARTS; i++) {
    char path[512];
    part_path(i, path, sizeof path);
    unlink(path);
    if (i != P_MANIFEST && present[i]) write_file(i, part[i], len[i]);
  }
  write_manifest(part[0], len[0], part, len, present);

  ds_cache_expect e;
  ds_cache_expect_any(&e);
  ds_cache *c = NULL;
  if (ds_cache_open(g_dir, &e, &c) != DS_OK) return 0;
  const ds_cache_manifest *m = ds_cache_get_manifest(c);
  char *text = NULL;
  size_t n = 0;
  if (ds_cache_read_target_config(c, &text, &n) == DS_OK) free(text);
  if (ds_cache_read_tokenizer(c, &text, &n) == DS_OK) free(text);
  ds_weight embed, lm_head;
  if (ds_cache_load_target_weights(c, &embed, &lm_head) == DS_OK) {
    ds_free_aligned((void *)embed.data);
    ds_free_aligned((void *)lm_head.data);
  }
  (void)ds_cache_verify_all(c);
  read_and_stream(c, m);
  ds_dataset ds;
  if (ds_cache_take_tokens(c, &ds) == DS_OK) {
    check_tokens(m, &ds);
    ds_dataset_free(&ds);
  }
  ds_cache_close(c);
  return 0;
}
