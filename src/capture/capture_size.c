/* `dspark capture --estimate` (the cache's size from the data and options, before anything is
 * written) and the free-space check a capture makes before its first file (statvfs of the
 * output directory's filesystem). The sizes come from ds_cache_estimate (io/cache_size.c). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>

#include "capture/capture_size.h"

/* Test-only: DSPARK_TEST_FREE_BYTES=N stands for the filesystem's free space (the refusal is
 * tested without filling a disk). */
#define FREE_BYTES_OVERRIDE "DSPARK_TEST_FREE_BYTES"

/* Free bytes (for an unprivileged writer) on the filesystem holding dir, or its nearest
 * existing ancestor when dir does not exist yet. -1 when unknown. */
static int64_t free_bytes(const char *dir) {
  const char *t = getenv(FREE_BYTES_OVERRIDE);
  if (t && t[0]) return strtoll(t, NULL, 10);
  char path[4096];
  snprintf(path, sizeof path, "%s", dir && dir[0] ? dir : ".");
  for (;;) {
    struct statvfs sv;
    if (statvfs(path, &sv) == 0) return (int64_t)sv.f_bavail * (int64_t)sv.f_frsize;
    if (errno != ENOENT && errno != ENOTDIR) return -1;
    char *slash = strrchr(path, '/');
    while (slash && slash > path && slash[1] == 0) { /* "a/b/" */
      *slash = 0;
      slash = strrchr(path, '/');
    }
    if (!slash) snprintf(path, sizeof path, ".");
    else if (slash == path) path[1] = 0; /* "/" */
    else *slash = 0;
    if (!strcmp(path, ".") && statvfs(path, &sv) != 0) return -1;
  }
}

static const char *human(int64_t n, char *buf, size_t cap) {
  const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double x = (double)n;
  int u = 0;
  while (x >= 1024 && u < 4) {
    x /= 1024;
    u++;
  }
  snprintf(buf, cap, u ? "%.1f %s" : "%.0f %s", x, unit[u]);
  return buf;
}

void capture_print_estimate(const ds_cache_size *z, const ds_cache_manifest *m, const char *out_dir, int quiet) {
  int64_t fb = out_dir && out_dir[0] ? free_bytes(out_dir) : -1;
  double per_token = z->tokens > 0 ? (double)z->total_bytes / (double)z->tokens : 0.0;
  char h1[32], h2[32], h3[32], h4[32], h5[32];
  if (!quiet) {
    fprintf(stderr, "capture estimate (nothing written): %lld samples in %lld shards of %lld, seq_len %lld, dtype %s\n",
            (long long)z->samples, (long long)z->n_shards, (long long)m->shard_size, (long long)m->seq_length,
            ds_cache_dtype_label(m->dtype));
    fprintf(stderr, "  %lld real tokens in %lld stored positions (every sample stores seq_len positions, "
            "padding too: %.1f%% filled)\n", (long long)z->tokens, (long long)z->positions,
            z->positions > 0 ? 100.0 * (double)z->tokens / (double)z->positions : 0.0);
    fprintf(stderr, "  bytes per stored position:\n");
    for (int i = 0; i < z->n_tensors; i++)
      fprintf(stderr, "    %-34s %8lld\n", z->tensor[i], (long long)z->per_position[i]);
    fprintf(stderr, "    %-34s %8lld  (+ 8 per sample for lengths, + each shard's header)\n", "total",
            (long long)z->position_bytes);
    fprintf(stderr, "  shards                       %15lld bytes (%s)\n", (long long)z->shard_bytes,
            human(z->shard_bytes, h1, sizeof h1));
    fprintf(stderr, "  target_weights.safetensors   %15lld bytes (%s)\n", (long long)z->weights_bytes,
            human(z->weights_bytes, h2, sizeof h2));
    fprintf(stderr, "  config, tokenizer, manifest  %15lld bytes (%s)\n", (long long)z->other_bytes,
            human(z->other_bytes, h3, sizeof h3));
    fprintf(stderr, "  total                        %15lld bytes (%s), %.1f bytes per real token\n",
            (long long)z->total_bytes, human(z->total_bytes, h4, sizeof h4), per_token);
    if (fb >= 0)
      fprintf(stderr, "  free space                   %15lld bytes (%s) on the filesystem of %s\n", (long long)fb,
              human(fb, h5, sizeof h5), out_dir);
  }
  printf("{\"estimate\": true, \"dtype\": \"%s\", \"samples\": %lld, \"tokens\": %lld, \"positions\": %lld, "
         "\"shards\": %lld, \"bytes_per_position\": {", ds_cache_dtype_label(m->dtype), (long long)z->samples,
         (long long)z->tokens, (long long)z->positions, (long long)z->n_shards);
  for (int i = 0; i < z->n_tensors; i++)
    printf("%s\"%s\": %lld", i ? ", " : "", z->tensor[i], (long long)z->per_position[i]);
  printf("}, \"shard_bytes\": %lld, \"weights_bytes\": %lld, \"other_bytes\": %lld, \"total_bytes\": %lld, "
         "\"bytes_per_token\": %.3f, \"free_bytes\": ", (long long)z->shard_bytes, (long long)z->weights_bytes,
         (long long)z->other_bytes, (long long)z->total_bytes, per_token);
  if (fb >= 0) printf("%lld}\n", (long long)fb);
  else printf("null}\n");
  fflush(stdout);
}

ds_status capture_check_space(const ds_cache_size *z, const char *out_dir, int64_t first_shard, int weights_ok) {
  int64_t need = z->other_bytes + (weights_ok ? 0 : z->weights_bytes);
  for (int64_t k = first_shard; k < z->n_shards; k++)
    need += k == z->n_shards - 1 ? z->last_shard_bytes : z->full_shard_bytes;
  int64_t fb = free_bytes(out_dir);
  if (fb < 0 || fb >= need) return DS_OK; /* unknown (statvfs failed): the write errors stay resumable */
  char a[32], b[32];
  return DS_FAIL(DS_ERR_IO, "the cache needs %lld more bytes (%s%s) but the filesystem of %s has %lld bytes "
                 "(%s) free%s: free some space, choose another --out, or pass --no-space-check (see `dspark capture "
                 "--estimate`)", (long long)need, human(need, a, sizeof a),
                 first_shard ? ", resuming" : "", out_dir, (long long)fb, human(fb, b, sizeof b),
                 getenv(FREE_BYTES_OVERRIDE) && getenv(FREE_BYTES_OVERRIDE)[0] ? " (" FREE_BYTES_OVERRIDE ")" : "");
}
