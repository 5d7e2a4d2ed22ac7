/* The KD loss's engine contracts (include/dspark/kd_loss.h): chunked == unchunked and the
 * trainer's per-chunk path bit for bit, determinism across thread counts, masked rows poisoned
 * with sentinels and NaN / inf change nothing, kd_loss_alpha 1 / 0 compute one term only (the
 * other's inputs may be NULL), the LM term at temperature 1, global-token normalization over
 * uneven micro-batches, grad_scale, a stored K wider than top_k, empty masks, and every refusal
 * naming its tensor, row and entry. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/backend.h"
#include "dspark/kd_loss.h"
#include "dspark/rng.h"
#include "support/kd_batch.h"
#include "test_util.h"

static ds_rng g_rng;

static ds_kd_loss_config cfg_of(int64_t top_k, double alpha, double T, int reverse) {
  ds_kd_loss_config c = ds_kd_loss_config_default();
  c.top_k = top_k, c.kd_loss_alpha = alpha, c.temperature = T, c.reverse = reverse;
  return c;
}

static int has(const char *needle) {
  int ok = strstr(ds_last_error(), needle) != NULL;
  if (!ok) fprintf(stderr, "  message lacks '%s': %s\n", needle, ds_last_error());
  return ok;
}

/* The variants every contract runs over: sparse / dense x forward / reverse x alpha x T. */
typedef struct {
  int dense, reverse;
  double alpha, T, top_p;
} variant;

static const variant k_variants[] = {
    {0, 0, 1.0, 1.0, 1.0}, {0, 1, 1.0, 1.0, 1.0}, {0, 0, 0.4, 1.0, 0.7}, {0, 1, 0.4, 2.5, 1.0},
    {1, 0, 1.0, 1.0, 1.0}, {1, 1, 0.4, 1.0, 1.0}, {1, 0, 0.4, 0.5, 1.0}, {1, 1, 1.0, 2.0, 1.0},
    {0, 0, 0.0, 1.0, 1.0}, {0, 0, 0.0, 3.0, 1.0}};
enum { N_VARIANTS = sizeof k_variants / sizeof k_variants[0] };

static ds_kd_loss_config cfg_variant(const variant *v, int64_t K) {
  ds_kd_loss_config c = cfg_of(v->dense ? 0 : K, v->alpha, v->T, v->reverse);
  c.top_p = v->top_p;
  c.min_k = 2;
  return c;
}

/* Chunked == unchunked bit for bit (chunks 1, 3, 7, R, R + 1, 1000); the trainer's path (the
 * core per chunk with the gradient written over the student logits, then finish) too. */
static void test_chunked_equals_unchunked(void) {
  const int64_t R = 13, V = 77, K = 9;
  kd_batch b = kd_batch_new(&g_rng, R, V, K, 3.0f, 1.0, 1.0, 1);
  b.mask[4] = b.mask[11] = 0;
  for (int iv = 0; iv < N_VARIANTS; iv++) {
    ds_kd_loss_config c = cfg_variant(&k_variants[iv], K);
    kd_run ref = kd_run_loss(&c, &b, 0.125);
    EXPECT_OK(ref.st);
    const int64_t chunks[] = {1, 3, 7, R, R + 1, 1000};
    for (int i = 0; i < 6; i++) {
      c.chunk_rows = chunks[i];
      kd_run o = kd_run_loss(&c, &b, 0.125);
      EXPECT_OK(o.st);
      EXPECT(kd_runs_identical(&o, &ref, &b));
      kd_run_free(&o);
    }
    kd_batch cp = kd_batch_copy(&b);
    double kd[13], lm[13];
    for (int64_t r0 = 0; r0 < R; r0 += 4) {
      int64_t n = R - r0 < 4 ? R - r0 : 4;
      ds_kd_rows_in in = kd_inputs(&cp, &c);
      in.student += r0 * V, in.labels += r0, in.mask += r0;
      if (in.topk_ids) in.topk_ids += r0 * K, in.topk_lp += r0 * K;
      if (in.teacher) in.teacher += r0 * V;
      EXPECT_OK(ds_kd_loss_rows(&c, r0, n, V, &in, 0.125, kd + r0, lm + r0, cp.s + r0 * V));
    }
    ds_kd_loss_result res;
    EXPECT_OK(ds_kd_loss_finish(&c, R, b.mask, kd, lm, &res));
    EXPECT(kd_same_bits(cp.s, ref.grad, (size_t)(R * V) * sizeof(float)));
    EXPECT(kd_same_bits(&res, &ref.res, sizeof res));
    EXPECT(kd_same_bits(kd, ref.kd, sizeof kd) && kd_same_bits(lm, ref.lm, sizeof lm));
    kd_batch_free(&cp);
    kd_run_free(&ref);
  }
  kd_batch_free(&b);
}

/* Same inputs, same bits: 1 / 2 / 3 threads, repeated. */
static void test_determinism(void) {
  const int64_t R = 11, V = 500, K = 40;
  kd_batch b = kd_batch_new(&g_rng, R, V, K, 4.0f, 1.0, 1.0, 1);
  b.mask[3] = 0;
  int saved = ds_get_num_threads();
  for (int iv = 0; iv < N_VARIANTS; iv++) {
    ds_kd_loss_config c = cfg_variant(&k_variants[iv], K);
    c.chunk_rows = 4;
    ds_set_num_threads(1);
    kd_run one = kd_run_loss(&c, &b, 0.3);
    EXPECT_OK(one.st);
    for (int th = 1; th <= 3; th++) {
      ds_set_num_threads(th);
      for (int rep = 0; rep < 2; rep++) {
        kd_run o = kd_run_loss(&c, &b, 0.3);
        EXPECT(kd_runs_identical(&o, &one, &b));
        kd_run_free(&o);
      }
    }
    kd_run_free(&one);
  }
  ds_set_num_threads(saved);
  kd_batch_free(&b);
}

/* Masked rows poisoned (sentinel ids -5 / V / 2^30 and dropped entries anywhere, labels -100 / V,
 * NaN / +inf / -inf in the student, the teacher and the log-probs) give every output bit for bit
 * as clean padding, and gradient rows of exactly +0.0. */
static void test_poisoned_masked_rows(void) {
  const int64_t R = 9, V = 37, K = 8;
  kd_batch clean = kd_batch_new(&g_rng, R, V, K, 3.0f, 1.0, 1.0, 1);
  clean.mask[0] = clean.mask[4] = clean.mask[5] = clean.mask[8] = 0;
  for (int64_t r = 0; r < R; r++) {
    if (clean.mask[r]) continue;
    clean.labels[r] = 0;
    for (int64_t v = 0; v < V; v++) clean.s[r * V + v] = clean.t[r * V + v] = 0.0f;
    for (int64_t i = 0; i < K; i++) clean.ids[r * K + i] = -1, clean.lq[r * K + i] = -INFINITY;
  }
  kd_batch bad = kd_batch_copy(&clean);
  const int32_t sentinel_ids[3] = {-5, (int32_t)V, 1 << 30}, sentinel_labels[3] = {-100, (int32_t)V, -1};
  const float poison[3] = {NAN, INFINITY, -INFINITY};
  int n = 0;
  for (int64_t r = 0; r < R; r++) {
    if (bad.mask[r]) continue;
    bad.labels[r] = sentinel_labels[n % 3];
    for (int64_t v = 0; v < V; v++) {
      bad.s[r * V + v] = poison[(v + n) % 3];
      bad.t[r * V + v] = poison[(v + n + 1) % 3];
    }
    for (int64_t i = 0; i < K; i++) {
      bad.ids[r * K + i] = i % 2 ? -1 : sentinel_ids[(i + n) % 3];
      bad.lq[r * K + i] = poison[(i + n) % 3];
    }
    n++;
  }
  EXPECT(n == 4);
  for (int iv = 0; iv < N_VARIANTS; iv++) {
    ds_kd_loss_config c = cfg_variant(&k_variants[iv], K);
    for (int64_t chunk = 1; chunk <= 64; chunk *= 4) {
      c.chunk_rows = chunk;
      kd_run oc = kd_run_loss(&c, &clean, 0.5), ob = kd_run_loss(&c, &bad, 0.5);
      EXPECT_OK(oc.st);
      EXPECT_OK(ob.st);
      EXPECT(kd_runs_identical(&oc, &ob, &clean));
      for (int64_t r = 0; r < R; r++) {
        if (bad.mask[r]) continue;
        for (int64_t v = 0; v < V; v++) EXPECT(ob.grad[r * V + v] == 0.0f && !signbit(ob.grad[r * V + v]));
        EXPECT(ob.kd[r] == 0.0 && ob.lm[r] == 0.0);
      }
      EXPECT(isfinite(ob.res.numerator) && ob.res.num_tokens == 5);
      kd_run_free(&oc), kd_run_free(&ob);
    }
  }
  kd_batch_free(&clean), kd_batch_free(&bad);
}

/* alpha = 1: the LM term is not computed (labels NULL is fine, its pair absent, lm 0);
 * alpha = 0: the KD term is not computed (no teacher input at all), the gradient is
 * softmax(s) - onehot(label) at any temperature; in between the numerator and the gradient are
 * the alpha-mix of the two. */
static void test_alpha_terms(void) {
  const int64_t R = 6, V = 45, K = 7;
  kd_batch b = kd_batch_new(&g_rng, R, V, K, 3.0f, 1.0, 1.0, 1);
  b.mask[2] = 0;
  for (int dense = 0; dense < 2; dense++) {
    ds_kd_loss_config c1 = cfg_of(dense ? 0 : K, 1.0, 1.0, 0), c0 = c1, cm = c1;
    c0.kd_loss_alpha = 0.0, cm.kd_loss_alpha = 0.4;
    kd_run o1 = kd_run_loss(&c1, &b, 1.0), o0 = kd_run_loss(&c0, &b, 1.0), om = kd_run_loss(&cm, &b, 1.0);
    EXPECT_OK(o1.st);
    EXPECT_OK(o0.st);
    EXPECT_OK(om.st);
    /* alpha = 1 without labels, alpha = 0 without a teacher: same bits */
    ds_kd_rows_in in = kd_inputs(&b, &c1);
    in.labels = NULL;
    ds_kd_loss_result res;
    float *g = malloc((size_t)(R * V) * sizeof(float));
    EXPECT_OK(ds_kd_loss(&c1, R, V, &in, 1.0, &res, NULL, NULL, g));
    EXPECT(kd_same_bits(&res, &o1.res, sizeof res) && kd_same_bits(g, o1.grad, (size_t)(R * V) * sizeof(float)));
    in = kd_inputs(&b, &c0);
    in.topk_ids = NULL, in.topk_lp = NULL, in.teacher = NULL;
    EXPECT_OK(ds_kd_loss(&c0, R, V, &in, 1.0, &res, NULL, NULL, g));
    EXPECT(kd_same_bits(&res, &o0.res, sizeof res) && kd_same_bits(g, o0.grad, (size_t)(R * V) * sizeof(float)));
    EXPECT(o1.res.pair_present[DS_KD_PAIR_KD] && !o1.res.pair_present[DS_KD_PAIR_LM]);
    EXPECT(!o0.res.pair_present[DS_KD_PAIR_KD] && o0.res.pair_present[DS_KD_PAIR_LM]);
    EXPECT(om.res.pair_present[DS_KD_PAIR_KD] && om.res.pair_present[DS_KD_PAIR_LM]);
    EXPECT(o1.res.numerator == o1.res.pair[DS_KD_PAIR_KD][0] && o0.res.numerator == o0.res.pair[DS_KD_PAIR_LM][0]);
    EXPECT(o1.res.pair[DS_KD_PAIR_LM][1] == 0.0 && o0.res.pair[DS_KD_PAIR_KD][1] == 0.0);
    EXPECT(o1.res.num_tokens == 5 && o0.res.num_tokens == 5 && o1.res.pair[DS_KD_PAIR_LOSS][1] == 5.0);
    EXPECT(om.res.numerator == 0.6 * om.res.pair[DS_KD_PAIR_LM][0] + 0.4 * om.res.pair[DS_KD_PAIR_KD][0]);
    double num = 0, den = 0;
    for (int64_t r = 0; r < R; r++) {
      EXPECT(o1.lm[r] == 0.0 && o0.kd[r] == 0.0);
      EXPECT_CLOSE(om.kd[r], o1.kd[r], 1e-12, 0);
      EXPECT_CLOSE(om.lm[r], o0.lm[r], 1e-12, 0);
      /* alpha = 0: softmax(s) - onehot, from a direct computation */
      double m = -INFINITY, s = 0;
      for (int64_t v = 0; v < V; v++) m = fmax(m, b.s[r * V + v]);
      for (int64_t v = 0; v < V; v++) s += exp(b.s[r * V + v] - m);
      for (int64_t v = 0; v < V; v++) {
        double want = b.mask[r] ? exp(b.s[r * V + v] - m) / s - (v == b.labels[r]) : 0.0;
        EXPECT_CLOSE(o0.grad[r * V + v], want, 1e-6, 1e-7);
        double mix = 0.6 * o0.grad[r * V + v] + 0.4 * o1.grad[r * V + v];
        num = fmax(num, fabs(mix - om.grad[r * V + v])), den = fmax(den, fabs(mix));
      }
    }
    EXPECT(num / den < 1e-6);
    free(g);
    kd_run_free(&o1), kd_run_free(&o0), kd_run_free(&om);
  }
  /* the LM term is at temperature 1 whatever T is: alpha = 0 gives the same bits at any T, and
   * alpha = 0.4 the same lm */
  ds_kd_loss_config a = cfg_of(K, 0.0, 1.0, 0), t3 = a, m1 = cfg_of(K, 0.4, 1.0, 0), m3 = m1;
  t3.temperature = 3.0, m3.temperature = 3.0;
  kd_run oa = kd_run_loss(&a, &b, 1.0), ot = kd_run_loss(&t3, &b, 1.0);
  kd_run om1 = kd_run_loss(&m1, &b, 1.0), om3 = kd_run_loss(&m3, &b, 1.0);
  EXPECT(kd_runs_identical(&oa, &ot, &b));
  for (int64_t r = 0; r < R; r++) EXPECT_CLOSE(om3.lm[r], om1.lm[r], 1e-12, 0);
  kd_run_free(&oa), kd_run_free(&ot), kd_run_free(&om1), kd_run_free(&om3);
  kd_batch_free(&b);
}

/* Uneven micro-batches: numerators and token counts summed over micro-batches and divided once
 * give the full batch's loss, and with grad_scale = 1 / global tokens the full batch's gradient
 * bit for bit; the mean of per-micro-batch means does not. */
static void test_uneven_microbatches(void) {
  const int64_t R = 12, V = 41, K = 6;
  kd_batch b = kd_batch_new(&g_rng, R, V, K, 3.0f, 1.0, 1.0, 1);
  for (int64_t r = 8; r < R; r++) { /* micro-batch 2: one supervised row of 4, a sharper student */
    b.mask[r] = r == 9;
    for (int64_t v = 0; v < V; v++) b.s[r * V + v] *= 6.0f;
  }
  ds_kd_loss_config c = cfg_of(K, 0.7, 1.0, 0);
  kd_run full = kd_run_loss(&c, &b, 1.0);
  double N = (double)full.res.num_tokens;
  EXPECT(N == 9.0);
  kd_run fullg = kd_run_loss(&c, &b, 1.0 / N);
  kd_batch m1 = b, m2 = b;
  m1.R = 8;
  m2.R = 4, m2.s += 8 * V, m2.t += 8 * V, m2.ids += 8 * K, m2.lq += 8 * K, m2.labels += 8, m2.mask += 8;
  kd_run o1 = kd_run_loss(&c, &m1, 1.0 / N), o2 = kd_run_loss(&c, &m2, 1.0 / N);
  ds_kd_loss_result sum = o1.res;
  ds_kd_loss_result_add(&sum, &o2.res);
  EXPECT(sum.num_tokens == full.res.num_tokens);
  for (int i = 0; i < DS_KD_PAIR_COUNT; i++) {
    EXPECT_CLOSE(sum.pair[i][0] / sum.pair[i][1], full.res.pair[i][0] / full.res.pair[i][1], 1e-14, 0);
    EXPECT(sum.pair_present[i]);
  }
  EXPECT(kd_same_bits(o1.grad, fullg.grad, (size_t)(8 * V) * sizeof(float)));
  EXPECT(kd_same_bits(o2.grad, fullg.grad + 8 * V, (size_t)(4 * V) * sizeof(float)));
  double global = full.res.numerator / N;
  double mean_of_means = 0.5 * (o1.res.numerator / (double)o1.res.num_tokens + o2.res.numerator / (double)o2.res.num_tokens);
  fprintf(stderr, "  uneven micro-batches: global %.6f, mean of means %.6f\n", global, mean_of_means);
  EXPECT(fabs(mean_of_means - global) / global > 0.1);
  kd_run_free(&full), kd_run_free(&fullg), kd_run_free(&o1), kd_run_free(&o2);
  kd_batch_free(&b);
}

/* grad_scale multiplies the gradient (a power of two: exactly) and nothing else; a gradient
 * written over the student logits equals the separate one; a stored K wider than top_k uses its
 * leading top_k entries; no gradient asked, the values are the same. */
static void test_scale_alias_stride(void) {
  const int64_t R = 5, V = 33, K = 10;
  kd_batch b = kd_batch_new(&g_rng, R, V, K, 3.0f, 1.0, 1.0, 1);
  ds_kd_loss_config c = cfg_of(K, 0.5, 1.3, 1);
  kd_run a = kd_run_loss(&c, &b, 1.0), q = kd_run_loss(&c, &b, 0.25);
  EXPECT(kd_same_bits(&a.res, &q.res, sizeof a.res));
  for (int64_t i = 0; i < R * V; i++) EXPECT(q.grad[i] == 0.25f * a.grad[i]);
  kd_batch cp = kd_batch_copy(&b);
  ds_kd_rows_in in = kd_inputs(&cp, &c);
  ds_kd_loss_result res;
  double kd[5], lm[5];
  EXPECT_OK(ds_kd_loss(&c, R, V, &in, 1.0, &res, kd, lm, cp.s));
  EXPECT(kd_same_bits(cp.s, a.grad, (size_t)(R * V) * sizeof(float)) && kd_same_bits(&res, &a.res, sizeof res));
  in = kd_inputs(&b, &c);
  EXPECT_OK(ds_kd_loss(&c, R, V, &in, 1.0, &res, kd, lm, NULL));
  EXPECT(kd_same_bits(&res, &a.res, sizeof res) && kd_same_bits(kd, a.kd, sizeof kd));
  /* top_k 4 of a stored 10 == a batch stored with K = 4 */
  kd_batch narrow = kd_batch_copy(&b);
  narrow.K = 4;
  for (int64_t r = 0; r < R; r++)
    for (int64_t i = 0; i < 4; i++) narrow.ids[r * 4 + i] = b.ids[r * K + i], narrow.lq[r * 4 + i] = b.lq[r * K + i];
  ds_kd_loss_config c4 = c;
  c4.top_k = 4;
  kd_run w = kd_run_loss(&c4, &b, 1.0), nw = kd_run_loss(&c4, &narrow, 1.0);
  EXPECT_OK(w.st);
  EXPECT(kd_runs_identical(&w, &nw, &b));
  kd_run_free(&a), kd_run_free(&q), kd_run_free(&w), kd_run_free(&nw);
  kd_batch_free(&cp), kd_batch_free(&narrow), kd_batch_free(&b);
}

/* Nothing supervised: numerator 0, no tokens, zero gradients, no NaN; no rows at all is fine. */
static void test_empty(void) {
  kd_batch b = kd_batch_new(&g_rng, 4, 19, 5, 3.0f, 1.0, 1.0, 1);
  memset(b.mask, 0, 4);
  for (int iv = 0; iv < N_VARIANTS; iv++) {
    ds_kd_loss_config c = cfg_variant(&k_variants[iv], 5);
    kd_run o = kd_run_loss(&c, &b, 1.0);
    EXPECT_OK(o.st);
    EXPECT(o.res.numerator == 0.0 && o.res.num_tokens == 0);
    for (int i = 0; i < DS_KD_PAIR_COUNT; i++) EXPECT(o.res.pair[i][0] == 0.0 && o.res.pair[i][1] == 0.0);
    for (int64_t i = 0; i < 4 * 19; i++) EXPECT(o.grad[i] == 0.0f);
    kd_run_free(&o);
  }
  kd_batch e = kd_batch_new(&g_rng, 0, 19, 5, 3.0f, 1.0, 1.0, 1);
  ds_kd_loss_config c = cfg_of(5, 0.5, 1.0, 0);
  kd_run o = kd_run_loss(&c, &e, 1.0);
  EXPECT_OK(o.st);
  EXPECT(o.res.numerator == 0.0 && o.res.num_tokens == 0);
  kd_run_free(&o);
  kd_batch_free(&e), kd_batch_free(&b);
}

/* Runs cfg on a copy of b changed by `edit`, expecting status want and a message with each needle. */
static void expect_refused(const ds_kd_loss_config *cfg, kd_batch *b, ds_status want, const char *n1, const char *n2) {
  kd_run o = kd_run_loss(cfg, b, 1.0);
  EXPECT(o.st == want);
  if (o.st != want) fprintf(stderr, "  got %s: %s\n", ds_status_name(o.st), ds_last_error());
  EXPECT(has(n1));
  if (n2) EXPECT(has(n2));
  kd_run_free(&o);
}

/* Every refusal at a supervised row names the tensor, the index and the row; the same values
 * at a masked row are fine. */
static void test_errors(void) {
  const int64_t R = 6, V = 20, K = 5;
  kd_batch b = kd_batch_new(&g_rng, R, V, K, 3.0f, 1.0, 1.0, 1);
  ds_kd_loss_config c = cfg_of(K, 0.5, 1.0, 0), cp = c, cd = cfg_of(0, 0.5, 1.0, 0);
  cp.top_p = 0.9;
  for (int what = 0; what < 14; what++) {
    kd_batch x = kd_batch_copy(&b);
    const ds_kd_loss_config *use = &c;
    ds_status want = DS_ERR_ARG;
    const char *n1 = NULL, *n2 = NULL;
    switch (what) {
    case 0: x.ids[3 * K + 2] = (int32_t)V, want = DS_ERR_RANGE, n1 = "'topk_ids' holds 20 at [3, 2]", n2 = "row 3"; break;
    case 1: x.ids[3 * K + 2] = -7, want = DS_ERR_RANGE, n1 = "'topk_ids' holds -7 at [3, 2]"; break;
    case 2: x.ids[3 * K + 1] = -1, n1 = "after the sentinel -1 at [3, 1]", n2 = "prefix"; break;
    case 3: for (int64_t i = 0; i < K; i++) x.ids[3 * K + i] = -1;
            n1 = "keeps no entry in row 3"; break;
    case 4: x.ids[3 * K + 4] = x.ids[3 * K + 1], n1 = "twice in row 3, at [3, 1] and [3, 4]"; break;
    case 5: x.lq[3 * K + 2] = NAN, want = DS_ERR_NUMERIC, n1 = "'topk_logprobs' holds NaN at [3, 2]"; break;
    case 6: x.lq[3 * K + 3] = x.lq[3 * K + 1], use = &cp, n1 = "increases at [3, 3]", n2 = "--top-p"; break;
    case 7: for (int64_t i = 0; i < K; i++) x.lq[3 * K + i] = 2.0f;
            n1 = "row 3: the kept teacher probabilities sum to more than 1.1", n2 = "not logits"; break;
    case 8: x.s[3 * V + 6] = NAN, want = DS_ERR_NUMERIC, n1 = "'student_logits' holds NaN at [3, 6]"; break;
    case 9: x.s[3 * V + 6] = INFINITY, want = DS_ERR_NUMERIC, n1 = "'student_logits' holds +inf at [3, 6]"; break;
    case 10: x.labels[3] = (int32_t)V, want = DS_ERR_RANGE, n1 = "'labels' holds 20 at [3]"; break;
    case 11: x.s[3 * V + x.labels[3]] = -INFINITY, want = DS_ERR_NUMERIC, n1 = "cross-entropy of supervised row 3"; break;
    case 12: x.s[3 * V + x.ids[3 * K]] = -INFINITY, want = DS_ERR_NUMERIC, n1 = "KL of supervised row 3 is infinite"; break;
    default: x.t[3 * V + 6] = NAN, use = &cd, want = DS_ERR_NUMERIC, n1 = "'teacher_logits' holds NaN at [3, 6]"; break;
    }
    if (what == 11 && x.ids[3 * K] == x.labels[3]) x.labels[3] = x.ids[3 * K + 1]; /* keep the cases apart */
    expect_refused(use, &x, want, n1, n2);
    x.mask[3] = 0; /* at a masked row the same values are never read */
    kd_run o = kd_run_loss(use, &x, 1.0);
    EXPECT_OK(o.st);
    kd_run_free(&o);
    kd_batch_free(&x);
  }
  /* the same unsorted entries are fine without top-p (the order is not read) */
  {
    kd_batch x = kd_batch_copy(&b);
    float tmp = x.lq[3 * K + 1];
    x.lq[3 * K + 1] = x.lq[3 * K + 3], x.lq[3 * K + 3] = tmp;
    int32_t ti = x.ids[3 * K + 1];
    x.ids[3 * K + 1] = x.ids[3 * K + 3], x.ids[3 * K + 3] = ti;
    kd_run o = kd_run_loss(&c, &x, 1.0), ref = kd_run_loss(&c, &b, 1.0);
    EXPECT_OK(o.st);
    EXPECT_CLOSE(o.kd[3], ref.kd[3], 1e-12, 0);
    kd_run_free(&o), kd_run_free(&ref);
    kd_batch_free(&x);
  }
  /* the reverse KL with a -inf student logit at a kept id is finite (probability 0 weighs 0) */
  {
    kd_batch x = kd_batch_copy(&b);
    x.s[3 * V + x.ids[3 * K + 2]] = -INFINITY;
    if (x.labels[3] == x.ids[3 * K + 2]) x.labels[3] = x.ids[3 * K];
    ds_kd_loss_config r = c;
    r.reverse = 1;
    kd_run o = kd_run_loss(&r, &x, 1.0);
    EXPECT_OK(o.st);
    EXPECT(isfinite(o.kd[3]) && o.grad[3 * V + x.ids[3 * K + 2]] == 0.0f);
    kd_run_free(&o);
    kd_batch_free(&x);
  }
  /* missing inputs and inconsistent sizes */
  ds_kd_rows_in in = kd_inputs(&b, &c);
  ds_kd_loss_result res;
  in.labels = NULL;
  EXPECT(ds_kd_loss(&c, R, V, &in, 1.0, &res, NULL, NULL, NULL) == DS_ERR_ARG && has("labels are required"));
  in = kd_inputs(&b, &cd);
  in.teacher = NULL;
  EXPECT(ds_kd_loss(&cd, R, V, &in, 1.0, &res, NULL, NULL, NULL) == DS_ERR_ARG && has("teacher logits"));
  in = kd_inputs(&b, &c);
  in.k_stride = 3;
  EXPECT(ds_kd_loss(&c, R, V, &in, 1.0, &res, NULL, NULL, NULL) == DS_ERR_ARG && has("--topk 5"));
  in = kd_inputs(&b, &c);
  EXPECT(ds_kd_loss(&c, R, V, &in, NAN, &res, NULL, NULL, NULL) == DS_ERR_ARG);
  in.mask = NULL;
  EXPECT(ds_kd_loss(&c, R, V, &in, 1.0, &res, NULL, NULL, NULL) == DS_ERR_ARG);
  ds_kd_loss_config big = c;
  big.top_k = 21;
  in = kd_inputs(&b, &c);
  EXPECT(ds_kd_loss(&big, R, V, &in, 1.0, &res, NULL, NULL, NULL) == DS_ERR_ARG && has("--topk 21"));
  /* the core names global rows from row0 */
  kd_batch x = kd_batch_copy(&b);
  x.labels[1] = -3;
  in = kd_inputs(&x, &c);
  EXPECT(ds_kd_loss_rows(&c, 40, 2, V, &in, 1.0, NULL, NULL, NULL) == DS_ERR_RANGE && has("at [41]"));
  kd_batch_free(&x);
  kd_batch_free(&b);
}

int main(void) {
  ds_rng_seed(&g_rng, 20261203);
  TEST_RUN(test_chunked_equals_unchunked);
  TEST_RUN(test_determinism);
  TEST_RUN(test_poisoned_masked_rows);
  TEST_RUN(test_alpha_terms);
  TEST_RUN(test_uneven_microbatches);
  TEST_RUN(test_scale_alias_stride);
  TEST_RUN(test_empty);
  TEST_RUN(test_errors);
  return TEST_RESULT();
}
