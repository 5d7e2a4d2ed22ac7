#include "dspark/sampling.h"

#include <math.h>
#include <stdlib.h>

int32_t ds_argmax(const float *logits, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; i++)
    if (logits[i] > logits[best]) best = i;
  return (int32_t)best;
}

size_t ds_sampler_scratch_bytes(int64_t n) { return (size_t)n * (sizeof(float) + sizeof(int32_t)); }

/* qsort has no context argument in C11: the probabilities travel in a thread-local. */
static _Thread_local const float *t_sort_probs;

static int cmp_desc(const void *a, const void *b) {
  float pa = t_sort_probs[*(const int32_t *)a], pb = t_sort_probs[*(const int32_t *)b];
  if (pa != pb) return pa > pb ? -1 : 1;
  return *(const int32_t *)a - *(const int32_t *)b; /* deterministic order for equal mass */
}

int32_t ds_sample(const float *logits, int64_t n, float temperature, float top_p, ds_rng *rng, void *scratch) {
  if (!(temperature > 0.0f)) return ds_argmax(logits, n);
  float *prob = scratch;
  int32_t *order = (int32_t *)(prob + n);
  float mx = logits[ds_argmax(logits, n)];
  double sum = 0.0;
  for (int64_t i = 0; i < n; i++) {
    prob[i] = expf((logits[i] - mx) / temperature);
    sum += prob[i];
  }
  double u = ds_rng_uniform_f64(rng);
  if (!(top_p < 1.0f)) {
    double target = u * sum, acc = 0.0;
    for (int64_t i = 0; i < n; i++) {
      acc += prob[i];
      if (acc > target) return (int32_t)i;
    }
    return ds_argmax(logits, n);
  }
  for (int64_t i = 0; i < n; i++) order[i] = (int32_t)i;
  t_sort_probs = prob;
  qsort(order, (size_t)n, sizeof *order, cmp_desc);
  /* Keep the smallest prefix whose mass reaches top_p; the top token always stays. */
  double kept = 0.0;
  int64_t k = 0;
  while (k < n) {
    kept += prob[order[k++]];
    if (kept >= top_p * sum) break;
  }
  double target = u * kept, acc = 0.0;
  for (int64_t i = 0; i < k; i++) {
    acc += prob[order[i]];
    if (acc > target) return order[i];
  }
  return order[0];
}
