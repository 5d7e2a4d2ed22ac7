/* dspark inspect: prints a cache's manifest, its sample and token counts and bytes per token,
 * and verifies every checksum (non-zero exit naming the first bad file). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "dspark/cache.h"
#include "dspark/fileio.h"

static void usage(FILE *f) {
  fprintf(f,
    "usage: dspark inspect CACHE [--no-verify]\n"
    "Prints the manifest of a cache written by `dspark capture`, its sample and token counts and\n"
    "bytes per token, checks the manifest's own checksum (manifest_xxh64), every shard's header and\n"
    "shapes against the manifest and the copied target_config.json / tokenizer.json, and verifies\n"
    "every checksum (shards, target_weights.safetensors). The lock file .lock is not part of the\n"
    "cache. Exit status 1 names the first bad file, or says that the cache is incomplete.\n"
    "  --no-verify   skip the shard and weights checksums (the rest is still checked)\n");
}


static int64_t file_size(const char *dir, const char *name) {
  char *p = ds_path_join(dir, name);
  struct stat sb;
  int64_t n = p && stat(p, &sb) == 0 ? (int64_t)sb.st_size : -1;
  free(p);
  return n;
}

static void print_manifest(const ds_cache_manifest *m, const char *dir) {
  char h1[17], h2[17], h3[17], h4[17], h5[17];
  ds_cache_hex(m->target_weights_xxh64, h1);
  ds_cache_hex(m->target_config_xxh64, h2);
  ds_cache_hex(m->tokenizer_xxh64, h3);
  ds_cache_hex(m->chat_template_xxh64, h4);
  ds_cache_hex(m->data_xxh64, h5);
  printf("cache:               %s\n", dir);
  char hm[17];
  ds_cache_hex(m->manifest_xxh64, hm);
  printf("format:              %s version %d, complete: %s\n", DS_CACHE_FORMAT, m->format_version,
         m->complete ? "true" : "false");
  printf("manifest xxh64:      %s (verified)\n", hm);
  printf("target:              %s (%s)\n", m->target_path, m->target_architecture);
  printf("  weights xxh64:     %s (%s)\n", h1, DS_CACHE_WEIGHTS_HASH_COVERS);
  printf("  weights held:      %s\n", m->target_weights[0] ? m->target_weights
                                       : "not recorded (captured before --weights: a GGUF's in fp32, a directory's "
                                         "16-bit matrices in place)");
  printf("  config.json xxh64: %s\n", h2);
  printf("  tokenizer xxh64:   %s\n", h3);
  printf("  chat template:     %s (xxh64 %s)\n", m->chat_template, h4);
  printf("  sizes:             vocab_size %lld, hidden_size %lld, num_hidden_layers %lld\n", (long long)m->vocab_size,
         (long long)m->hidden_size, (long long)m->num_hidden_layers);
  printf("target_layer_ids:    [");
  for (int i = 0; i < m->n_layers; i++) printf("%s%d", i ? ", " : "", m->target_layer_ids[i]);
  printf("] (m = %d)\n", m->n_layers);
  printf("dtype:               %s\n", ds_cache_dtype_label(m->dtype));
  printf("seq_length:          %lld (eos_token_id %lld, min_length %lld)\n", (long long)m->seq_length,
         (long long)m->eos_token_id, (long long)m->min_length);
  printf("data:                %s (xxh64 %s)\n", m->data_path, h5);
  printf("seed:                %llu\n", (unsigned long long)m->seed);
  printf("features:            %s\n", m->features ? "yes (target_hidden_states, target_last_hidden_states)" : "no");
  if (m->kd_topk)
    printf("kd:                  topk %lld, top_p %g, min_k %lld, temperature %g\n", (long long)m->kd_topk, m->kd_top_p,
           (long long)m->kd_min_k, m->kd_temperature);
  else
    printf("kd:                  none\n");
  printf("shard_size:          %lld\n", (long long)m->shard_size);
}

int cmd_inspect(int argc, char **argv) {
  const char *dir = NULL;
  int verify = 1;
  for (int i = 1; i < argc; i++) {
    if (cli_is_help(argv[i])) { usage(stdout); return 0; }
    else if (!strcmp(argv[i], "--no-verify")) verify = 0;
    else if (argv[i][0] == '-') {
      fprintf(stderr, "dspark inspect: unknown option '%s' (see --help)\n", argv[i]);
      return 2;
    } else if (!dir) dir = argv[i];
    else {
      fprintf(stderr, "dspark inspect: one cache directory expected\n");
      return 2;
    }
  }
  if (!dir) {
    fprintf(stderr, "dspark inspect: CACHE is required (see --help)\n");
    return 2;
  }
  ds_cache_expect e;
  ds_cache_expect_any(&e);
  e.allow_incomplete = 1;
  ds_cache *c;
  if (ds_cache_open(dir, &e, &c) != DS_OK) return cli_report_error("inspect");
  const ds_cache_manifest *m = ds_cache_get_manifest(c);
  print_manifest(m, dir);

  int64_t samples = 0, shard_bytes = 0, S = m->seq_length;
  for (int64_t i = 0; i < m->n_shards; i++) {
    samples += m->shards[i].num_samples;
    int64_t b = file_size(dir, m->shards[i].file);
    shard_bytes += b > 0 ? b : 0;
  }
  ds_dataset tok;
  double tokens = 0, supervised = 0;
  if (ds_cache_take_tokens(c, &tok) == DS_OK) {
    for (int64_t s = 0; s < tok.n_seqs; s++) {
      tokens += (double)tok.lengths[s];
      for (int64_t t = 0; t < S; t++) supervised += tok.loss_mask[s * S + t];
    }
    ds_dataset_free(&tok);
  }
  int64_t wbytes = file_size(dir, "target_weights.safetensors");
  double positions = (double)samples * (double)S;
  printf("samples:             %lld of %lld in %lld shards\n", (long long)samples, (long long)m->num_samples,
         (long long)m->n_shards);
  printf("tokens:              %.0f real (%.0f supervised), %.0f positions with padding (%.1f%% filled)\n", tokens,
         supervised, positions, positions > 0 ? 100.0 * tokens / positions : 0.0);
  printf("bytes:               %lld in shards, %lld in target_weights.safetensors\n", (long long)shard_bytes,
         (long long)wbytes);
  /* the per-tensor figures of the estimate `dspark capture --estimate` prints */
  ds_cache_size z;
  int64_t feat = 0, kd = 0;
  if (ds_cache_estimate(m, DS_F32, DS_F32, 0, 0, &z) == DS_OK)
    for (int i = 0; i < z.n_tensors; i++) {
      if (!strncmp(z.tensor[i], "target_", 7)) feat += z.per_position[i];
      if (!strncmp(z.tensor[i], "topk_", 5)) kd += z.per_position[i];
    }
  printf("bytes per token:     %.1f per real token, %.1f per position (features %lld%s, KD %lld, tokens 5 + 8 / S)\n",
         tokens > 0 ? (double)shard_bytes / tokens : 0.0, positions > 0 ? (double)shard_bytes / positions : 0.0,
         (long long)feat, m->dtype == DS_I8 ? " with scales" : "", (long long)kd);

  int bad = 0;
  if (verify) {
    for (int64_t i = 0; i < m->n_shards; i++) {
      char hex[17];
      ds_cache_hex(m->shards[i].xxh64, hex);
      ds_status st = ds_cache_verify_shard(c, i);
      printf("  %s  %6lld samples  xxh64 %s  %s\n", m->shards[i].file, (long long)m->shards[i].num_samples, hex,
             st == DS_OK ? "ok" : "BAD");
      if (st != DS_OK && !bad++) fprintf(stderr, "dspark inspect: %s\n", ds_last_error());
    }
    if (!bad && m->target_weights_file_xxh64) {
      if (ds_cache_verify_all(c) != DS_OK) {
        fprintf(stderr, "dspark inspect: %s\n", ds_last_error());
        bad++;
      }
    }
    if (!bad) printf("checksums:           all %lld shards and the side files verified\n", (long long)m->n_shards);
  }
  int incomplete = !m->complete;
  if (incomplete)
    fprintf(stderr,
            "dspark inspect: %s is incomplete (complete: false, %lld of %lld samples): rerun the same `dspark capture` "
            "command to finish it\n",
            dir, (long long)samples, (long long)m->num_samples);
  ds_cache_close(c);
  return bad || incomplete ? 1 : 0;
}
