/* The sampler's top-p cut (model/sampling.c) against the rule written out with a full sort: the
 * shortest prefix of the ids in decreasing probability (equal ones by id) whose mass, summed in
 * that order, reaches top_p; the distribution must be the same bit for bit, whatever the share of
 * ids the nucleus holds (a few, most, all, ties at the cut). */
#include <string.h>

#include "dspark/rng.h"
#include "dspark/sampling.h"
#include "test_util.h"

static const float *g_probs;

static int by_prob_then_id(const void *a, const void *b) {
  int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
  if (g_probs[i] != g_probs[j]) return g_probs[i] > g_probs[j] ? -1 : 1;
  return i - j;
}

/* The rule with every id sorted (what ds_sampling_probs did before it sorted only candidates). */
static void reference_probs(const float *logits, int64_t n, float temperature, float top_p, float *probs) {
  float mx = logits[ds_argmax(logits, n)];
  double sum = 0.0;
  for (int64_t i = 0; i < n; i++) sum += probs[i] = expf((logits[i] - mx) / temperature);
  if (top_p < 1.0f) {
    int32_t *order = malloc((size_t)n * sizeof *order);
    for (int64_t i = 0; i < n; i++) order[i] = (int32_t)i;
    g_probs = probs;
    qsort(order, (size_t)n, sizeof *order, by_prob_then_id);
    double kept = 0.0;
    int64_t k = 0;
    while (k < n) {
      kept += probs[order[k++]];
      if (kept >= top_p * sum) break;
    }
    for (int64_t i = k; i < n; i++) probs[order[i]] = 0.0f;
    sum = kept;
    free(order);
  }
  float inv = (float)(1.0 / sum);
  for (int64_t i = 0; i < n; i++) probs[i] *= inv;
}

/* logits of one of several shapes: peaked (a nucleus of a few ids), broad (most ids), flat (all
 * equal: every id tied), or rounded to a coarse grid (many ties, also at the cut). */
static void make_logits(float *l, int64_t n, int shape, ds_rng *rng) {
  for (int64_t i = 0; i < n; i++) {
    float u = ds_rng_uniform_f32(rng);
    switch (shape) {
      case 0: l[i] = 20.0f * u * u * u * u; break;
      case 1: l[i] = 0.5f * u; break;
      case 2: l[i] = 1.0f; break;
      default: l[i] = floorf(8.0f * u) / 2.0f; break;
    }
  }
}

/* ds_argmax against the plain scan (first maximum; NaNs skipped, index 0 when logits[0] is one):
 * random lengths and values, ties, signed zeros, infinities and NaNs placed anywhere. */
static int64_t scan_argmax(const float *l, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; i++)
    if (l[i] > l[best]) best = i;
  return best;
}

static void test_argmax(ds_rng *rng) {
  enum { MAXN = 300 };
  float l[MAXN];
  const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1.0f, -1.0f};
  int bad = 0;
  for (int t = 0; t < 4000; t++) {
    int64_t n = 1 + (int64_t)(ds_rng_uniform_f32(rng) * (MAXN - 1));
    int coarse = t % 3;                          /* few distinct values: many ties */
    float shift = t % 4 == 0 ? -100.0f : 0.0f;    /* every value negative */
    for (int64_t i = 0; i < n; i++)
      l[i] = shift + (coarse ? (float)(int)(ds_rng_uniform_f32(rng) * 4.0f) : ds_rng_uniform_f32(rng) * 10.0f - 5.0f);
    for (int k = 0; k < t % 5; k++)
      l[(int64_t)(ds_rng_uniform_f32(rng) * (float)n) % n] = special[(int)(ds_rng_uniform_f32(rng) * 7.0f) % 7];
    if (ds_argmax(l, n) != (int32_t)scan_argmax(l, n)) bad++;
  }
  EXPECT(bad == 0);
  const float nan0[] = {NAN, 3.0f, 5.0f}, zeros[] = {-0.0f, 0.0f, -0.0f}, late[] = {1.0f, 2.0f, 2.0f, NAN, 2.0f};
  EXPECT(ds_argmax(nan0, 3) == 0 && ds_argmax(zeros, 3) == 0 && ds_argmax(late, 5) == 1);
}

int main(void) {
  ds_rng rng;
  ds_rng_seed(&rng, 7);
  test_argmax(&rng);
  const int64_t sizes[] = {1, 7, 1000, 49152};
  const float tops[] = {0.05f, 0.5f, 0.9f, 0.95f, 0.999f, 0.99999f};
  const float temps[] = {0.3f, 1.0f, 3.0f};
  int cases = 0, fewer_than_all = 0;
  for (size_t a = 0; a < sizeof sizes / sizeof *sizes; a++) {
    int64_t n = sizes[a];
    float *logits = malloc((size_t)n * sizeof(float)), *got = malloc((size_t)n * sizeof(float)),
          *want = malloc((size_t)n * sizeof(float));
    void *scratch = malloc(ds_sampler_scratch_bytes(n));
    for (int shape = 0; shape < 4; shape++) {
      make_logits(logits, n, shape, &rng);
      for (size_t b = 0; b < sizeof tops / sizeof *tops; b++)
        for (size_t c = 0; c < sizeof temps / sizeof *temps; c++) {
          ds_sampling_probs(logits, n, temps[c], tops[b], got, scratch);
          reference_probs(logits, n, temps[c], tops[b], want);
          int same = memcmp(got, want, (size_t)n * sizeof(float)) == 0;
          if (!same)
            fprintf(stderr, "n %lld shape %d top_p %g temperature %g: the cut differs from the full sort's\n",
                    (long long)n, shape, (double)tops[b], (double)temps[c]);
          EXPECT(same);
          int64_t kept = 0;
          for (int64_t i = 0; i < n; i++) kept += got[i] > 0.0f;
          fewer_than_all += kept < n;
          cases++;
        }
    }
    free(logits), free(got), free(want), free(scratch);
  }
  EXPECT(fewer_than_all > cases / 2); /* the cut was exercised, not only the keep-all case */
  return g_test_failures ? 1 : 0;
}
