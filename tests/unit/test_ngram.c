/* The corpus n-gram table (include/dspark/ngram.h): proposals worked out by hand on a small
 * corpus (longest context, shares, chaining, the chain floor, ties, unsupervised tokens), then
 * against a brute-force count over the sequences themselves on random data. */
#include "dspark/ngram.h"
#include "dspark/rng.h"
#include "test_util.h"

enum { P = 1, A = 2, B = 3, C = 4, D = 5, Q = 6, E = 7, F = 8, R = 9, G = 10, X = 11 };

/* Sequences of up to 8 tokens, 0 ending each; a negative token is an unsupervised one. */
static ds_dataset make(const int seqs[][8], int n) {
  ds_dataset ds = {0};
  ds.n_seqs = n, ds.seq_len = 8;
  ds.ids = calloc((size_t)n * 8, sizeof(int32_t));
  ds.loss_mask = calloc((size_t)n * 8, 1);
  ds.lengths = calloc((size_t)n, sizeof(int64_t));
  for (int i = 0; i < n; i++)
    for (int t = 0; t < 8 && seqs[i][t]; t++) {
      ds.ids[i * 8 + t] = abs(seqs[i][t]);
      ds.loss_mask[i * 8 + t] = seqs[i][t] > 0;
      ds.lengths[i] = t + 1;
    }
  return ds;
}

static void test_hand_example(void) {
  const int seqs[][8] = {{-P, A, B, C, A, B, D},   /* the first token is never predicted */
                         {-P, A, B, C},
                         {-Q, E}, {-Q, F},          /* after Q: E and F once each */
                         {-R, -G}};                 /* nothing supervised */
  ds_dataset ds = make(seqs, 5);
  ds_ngram *g = NULL;
  EXPECT_OK(ds_ngram_build(&ds, &g));
  if (!g) return;
  EXPECT(ds_ngram_tokens(g) == 6 + 3 + 1 + 1);
  int32_t out[8];
  double share[8];
  /* after P A B: C twice in two, 2/3; then A (after A B C, seen once: 1/2), B (1/2), then D at
   * 1/2 would take the chain to 1/12, below 0.1 */
  const int32_t pab[] = {P, A, B};
  int64_t n = ds_ngram_propose(g, pab, 3, 8, 0.1, out, share);
  EXPECT(n == 3 && out[0] == C && out[1] == A && out[2] == B);
  EXPECT_CLOSE(share[0], 2.0 / 3.0, 1e-12, 0);
  EXPECT_CLOSE(share[1], 0.5, 1e-12, 0);
  EXPECT_CLOSE(share[2], 0.5, 1e-12, 0);
  /* without the floor D too, then nothing ever followed D */
  n = ds_ngram_propose(g, pab, 3, 8, 0.0, out, share);
  EXPECT(n == 4 && out[3] == D);
  /* L caps it */
  EXPECT(ds_ngram_propose(g, pab, 3, 2, 0.0, out, share) == 2);
  /* X C A B: the longest context that occurred is C A B (followed by D once), not A B (C twice) */
  const int32_t xcab[] = {X, C, A, B};
  n = ds_ngram_propose(g, xcab, 4, 1, 0.0, out, share);
  EXPECT(n == 1 && out[0] == D);
  EXPECT_CLOSE(share[0], 0.5, 1e-12, 0);
  /* X B: only B occurred, followed by C twice and D once: C at 2/4 */
  const int32_t xb[] = {X, B};
  n = ds_ngram_propose(g, xb, 2, 1, 0.0, out, share);
  EXPECT(n == 1 && out[0] == C);
  EXPECT_CLOSE(share[0], 0.5, 1e-12, 0);
  /* a tie keeps the token seen first */
  const int32_t q[] = {Q};
  n = ds_ngram_propose(g, q, 1, 1, 0.0, out, share);
  EXPECT(n == 1 && out[0] == E);
  EXPECT_CLOSE(share[0], 1.0 / 3.0, 1e-12, 0);
  /* an unsupervised successor is no context; an unseen token, or nothing, proposes nothing */
  const int32_t r[] = {R}, x[] = {X};
  EXPECT(ds_ngram_propose(g, r, 1, 4, 0.0, out, share) == 0);
  EXPECT(ds_ngram_propose(g, x, 1, 4, 0.0, out, share) == 0);
  EXPECT(ds_ngram_propose(g, x, 0, 4, 0.0, out, share) == 0);
  ds_ngram_free(g);
  /* data without a supervised token is refused */
  const int none[][8] = {{-R, -G}};
  ds_dataset_free(&ds);
  ds = make(none, 1);
  g = NULL;
  EXPECT(ds_ngram_build(&ds, &g) == DS_ERR_FORMAT && g == NULL);
  ds_dataset_free(&ds);
}

/* The next token after ctx [n] by counting the sequences: the longest context (<= 4 tokens)
 * followed by a supervised token somewhere; the token whose count first reached the largest. */
static int brute_next(const ds_dataset *ds, const int32_t *ctx, int64_t n, int32_t *tok, double *share) {
  for (int64_t m = n < DS_NGRAM_MAX_CONTEXT ? n : DS_NGRAM_MAX_CONTEXT; m >= 1; m--) {
    uint32_t count[64] = {0}, best = 0, seen = 0;
    for (int64_t i = 0; i < ds->n_seqs; i++)
      for (int64_t t = m; t < ds->lengths[i]; t++) {
        const int32_t *ids = ds->ids + i * ds->seq_len;
        if (!ds->loss_mask[i * ds->seq_len + t] || memcmp(ids + t - m, ctx + n - m, (size_t)m * 4)) continue;
        seen++;
        if (++count[ids[t]] > best) best = count[ids[t]], *tok = ids[t];
      }
    if (seen) {
      *share = (double)best / (seen + 1.0);
      return 1;
    }
  }
  return 0;
}

static void test_against_counting(void) {
  enum { N = 40, S = 60, V = 6 };
  ds_dataset ds = {0};
  ds.n_seqs = N, ds.seq_len = S;
  ds.ids = calloc(N * S, sizeof(int32_t));
  ds.loss_mask = calloc(N * S, 1);
  ds.lengths = calloc(N, sizeof(int64_t));
  ds_rng rng;
  ds_rng_seed(&rng, 7);
  for (int i = 0; i < N; i++) {
    ds.lengths[i] = 10 + (int64_t)(ds_rng_uniform_f64(&rng) * (S - 10));
    for (int t = 0; t < ds.lengths[i]; t++) {
      ds.ids[i * S + t] = (int32_t)(ds_rng_uniform_f64(&rng) * V); /* a small vocabulary: long contexts repeat */
      ds.loss_mask[i * S + t] = t >= 3 && ds_rng_uniform_f64(&rng) < 0.8;
    }
  }
  ds_ngram *g = NULL;
  EXPECT_OK(ds_ngram_build(&ds, &g));
  if (!g) return;
  int mismatches = 0;
  for (int trial = 0; trial < 300; trial++) {
    int32_t ctx[12], out[8];
    double share[8];
    int64_t n = 1 + (int64_t)(ds_rng_uniform_f64(&rng) * 5);
    for (int64_t i = 0; i < n; i++) ctx[i] = (int32_t)(ds_rng_uniform_f64(&rng) * (V + 1)); /* V: never seen */
    int64_t got = ds_ngram_propose(g, ctx, n, 6, 0.0, out, share), want_n = 0;
    int32_t want[6];
    double want_share[6];
    while (want_n < 6 && brute_next(&ds, ctx, n + want_n, &want[want_n], &want_share[want_n])) {
      ctx[n + want_n] = want[want_n]; /* the brute force chained the same way */
      want_n++;
    }
    int same = got == want_n;
    for (int64_t k = 0; same && k < got; k++) same = out[k] == want[k] && fabs(share[k] - want_share[k]) < 1e-12;
    mismatches += !same;
  }
  EXPECT(mismatches == 0);
  ds_ngram_free(g);
  ds_dataset_free(&ds);
}

int main(void) {
  TEST_RUN(test_hand_example);
  TEST_RUN(test_against_counting);
  return TEST_RESULT();
}
