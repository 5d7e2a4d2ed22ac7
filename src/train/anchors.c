#include "dspark/anchors.h"

#include <stdlib.h>

void ds_anchor_eval_mask(const uint8_t *loss_mask, int64_t T, const int64_t *anchors, const uint8_t *block_keep,
                         int64_t n_blocks, int64_t g, uint8_t *eval_mask) {
  for (int64_t b = 0; b < n_blocks; b++) {
    /* A dropped block, or an anchor outside [0, T), supervises nothing; its anchor is never
     * used in arithmetic (a hostile one could overflow). */
    uint8_t alive = block_keep[b] && anchors[b] >= 0 && anchors[b] < T;
    for (int64_t k = 0; k < g; k++) {
      alive = alive && anchors[b] + k + 1 < T && loss_mask[anchors[b] + k + 1];
      eval_mask[b * g + k] = alive;
    }
  }
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

int64_t ds_sample_anchors(const uint8_t *loss_mask, int64_t T, int64_t max_anchors, int64_t g, ds_rng *rng,
                          int64_t *anchors, uint8_t *block_keep, uint8_t *eval_mask) {
  /* Partial Fisher-Yates over the eligible positions: uniform without replacement. */
  int64_t n_elig = 0;
  int64_t *elig = malloc((size_t)(T > 1 ? T : 1) * sizeof *elig);
  DS_CHECK(elig != NULL);
  for (int64_t a = 0; a + 1 < T; a++)
    if (loss_mask[a] && loss_mask[a + 1]) elig[n_elig++] = a;
  int64_t take = n_elig < max_anchors ? n_elig : max_anchors;
  for (int64_t i = 0; i < take; i++) {
    int64_t j = i + (int64_t)(ds_rng_next_u64(rng) % (uint64_t)(n_elig - i));
    int64_t t = elig[i];
    elig[i] = elig[j];
    elig[j] = t;
  }
  qsort(elig, (size_t)take, sizeof *elig, cmp_i64);
  for (int64_t b = 0; b < max_anchors; b++) {
    anchors[b] = b < take ? elig[b] : 0;
    block_keep[b] = b < take;
  }
  free(elig);
  ds_anchor_eval_mask(loss_mask, T, anchors, block_keep, max_anchors, g, eval_mask);
  return take;
}

uint64_t ds_anchor_seed(uint64_t seed, int64_t rank, int64_t step, int64_t sequence) {
  return ds_seed_mix(ds_seed_mix(ds_seed_mix(seed, (uint64_t)rank + 1), (uint64_t)step + 1), (uint64_t)sequence + 1);
}
