/* The DSpark loss (spec/dspark.md section 4) against a double-precision reference written
 * here from the spec, plus every regression fact of section 4 and of the review threads:
 * draft == target, disjoint supports, chunked == unchunked, dropped anchor == zeroed eval
 * mask, uneven micro-batches, poisoned padding, CE only without a teacher, empty masks,
 * disabled terms, bad ids, raw L1 vs the 1/2 label, decay variants, finite differences in
 * double for both gradients, determinism across threads and chunk sizes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/backend.h"
#include "dspark/dspark_loss.h"
#include "dspark/rng.h"
#include "support/loss_batch.h"
#include "test_util.h"

static ds_rng g_rng;

/* ---- tests ---- */

static void test_config(void) {
  ds_dspark_loss_config c = ds_dspark_loss_config_default();
  EXPECT(c.alpha_ce == 0.1 && c.alpha_l1 == 0.9 && c.alpha_conf == 1.0 && c.decay_gamma == 4.0);
  EXPECT(c.decay == DS_DSPARK_DECAY_DEEPSPEC && c.chunk_rows == 128 && c.has_teacher && c.has_conf);
  EXPECT_OK(ds_dspark_loss_config_check(&c));
  ds_dspark_loss_config bad = c;
  bad.alpha_l1 = -1;
  EXPECT(ds_dspark_loss_config_check(&bad) == DS_ERR_ARG);
  bad = c, bad.alpha_ce = NAN;
  EXPECT(ds_dspark_loss_config_check(&bad) == DS_ERR_ARG);
  bad = c, bad.chunk_rows = 0;
  EXPECT(ds_dspark_loss_config_check(&bad) == DS_ERR_ARG);
  bad = c, bad.decay = (ds_dspark_decay)7;
  EXPECT(ds_dspark_loss_config_check(&bad) == DS_ERR_ARG);
  bad = c, bad.decay_gamma = INFINITY;
  EXPECT(ds_dspark_loss_config_check(&bad) == DS_ERR_ARG);
  EXPECT(!strcmp(ds_dspark_pair_name(DS_DSPARK_PAIR_LOSS), "loss") && !strcmp(ds_dspark_pair_name(DS_DSPARK_PAIR_TAU), "tau"));
  EXPECT(!strcmp(ds_dspark_pair_name(DS_DSPARK_PAIR_CONF), "confidence") && ds_dspark_pair_name(DS_DSPARK_PAIR_COUNT) == NULL);
}

/* Decay variants: DeepSpec exp(-k/gamma), disabled for gamma <= 0, the paper's exp(-(k1-1)/g). */
static void test_decay(void) {
  ds_dspark_loss_config c = ds_dspark_loss_config_default();
  for (int64_t k = 0; k < 7; k++) EXPECT(ds_dspark_loss_decay(&c, k, 7) == exp(-(double)k / 4.0));
  c.decay_gamma = 0;
  for (int64_t k = 0; k < 7; k++) EXPECT(ds_dspark_loss_decay(&c, k, 7) == 1.0);
  c.decay_gamma = -3;
  EXPECT(ds_dspark_loss_decay(&c, 5, 7) == 1.0);
  c.decay = DS_DSPARK_DECAY_PAPER, c.decay_gamma = 4.0;
  for (int64_t k1 = 1; k1 <= 7; k1++) EXPECT_CLOSE(ds_dspark_loss_decay(&c, k1 - 1, 7), exp(-(double)(k1 - 1) / 7.0), 1e-15, 0);
  /* W and the weights through the whole call, for each variant */
  batch b = batch_new(&g_rng, 3, 5, 13, 2);
  b.em[4] = 0, b.em[8] = b.em[9] = 0, b.bk[2] = 0;
  for (int variant = 0; variant < 3; variant++) {
    ds_dspark_loss_config cfg = cfg_with(1, 1);
    if (variant == 1) cfg.decay_gamma = 0;
    if (variant == 2) cfg.decay = DS_DSPARK_DECAY_PAPER;
    uint8_t sup[15];
    double w[15], W = 0;
    EXPECT_OK(ds_dspark_loss_weights(&cfg, 3, 5, b.em, b.bk, sup, w));
    for (int64_t r = 0; r < 15; r++) {
      int want = b.em[r] && b.bk[r / 5];
      EXPECT(sup[r] == want);
      EXPECT(w[r] == (want ? ref_decay(&cfg, r % 5, 5) : 0.0));
      W += w[r];
    }
    run_out o = run_loss(&cfg, &b, 1.0);
    ref_out ref;
    ref_of_batch(&cfg, &b, &ref);
    EXPECT_OK(o.st);
    EXPECT_CLOSE(o.res.W, W, 1e-15, 0);
    EXPECT_CLOSE(o.res.numerator, ref.num, 1e-6, 0);
    EXPECT(o.res.num_tokens == 7);
    run_free(&o);
  }
  batch_free(&b);
}

/* Values, every pair, per-position and per-row values against the double reference, for every
 * combination of teacher / confidence, several shapes (tails of the 16-lane blocks) and a real
 * vocabulary size. */
static void test_matches_reference(void) {
  const int64_t shapes[][3] = {{2, 7, 37}, {3, 4, 16}, {1, 1, 1}, {4, 3, 5}, {2, 3, 151936}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    batch b = batch_new(&g_rng, shapes[s][0], shapes[s][1], shapes[s][2], 4);
    if (b.R > 3) b.em[b.R - 1] = 0, b.em[1] = 0;
    for (int mode = 0; mode < 3; mode++) {
      ds_dspark_loss_config cfg = cfg_with(mode != 2, mode == 0);
      run_out o = run_loss(&cfg, &b, 1.0);
      ref_out ref;
      ref_of_batch(&cfg, &b, &ref);
      EXPECT_OK(o.st);
      EXPECT_CLOSE(o.res.numerator, ref.num, 2e-6, 1e-12);
      EXPECT(o.res.num_tokens == ref.tokens);
      EXPECT_CLOSE(o.res.W, ref.W, 1e-15, 0);
      EXPECT_CLOSE(o.res.pair[DS_DSPARK_PAIR_LOSS][0], ref.num, 2e-6, 1e-12);
      EXPECT_CLOSE(o.res.pair[DS_DSPARK_PAIR_CE][0], ref.ce, 2e-6, 1e-12);
      EXPECT_CLOSE(o.res.pair[DS_DSPARK_PAIR_L1][0], ref.l1, 2e-6, 1e-12);
      EXPECT_CLOSE(o.res.pair[DS_DSPARK_PAIR_CONF][0], ref.bce, 2e-6, 1e-12);
      for (int i = 0; i <= DS_DSPARK_PAIR_CONF; i++) EXPECT(o.res.pair[i][1] == o.res.W && o.res.pair_present[i]);
      EXPECT(o.res.pair_present[DS_DSPARK_PAIR_ACCEPT] == (mode != 2));
      EXPECT(o.res.pair_present[DS_DSPARK_PAIR_TAU] == (mode != 2));
      if (mode != 2) {
        EXPECT_CLOSE(o.res.pair[DS_DSPARK_PAIR_ACCEPT][0], ref.acc, 2e-6, 1e-12);
        EXPECT(o.res.pair[DS_DSPARK_PAIR_ACCEPT][1] == ref.acc_den);
        EXPECT_CLOSE(o.res.pair[DS_DSPARK_PAIR_TAU][0], ref.tau, 2e-6, 1e-12);
        EXPECT(o.res.pair[DS_DSPARK_PAIR_TAU][1] == ref.tau_den);
        for (int64_t k = 0; k < b.g; k++) {
          EXPECT_CLOSE(o.pos_acc[k], ref.pos_acc[k], 2e-6, 1e-12);
          EXPECT(o.pos_cnt[k] == ref.pos_cnt[k]);
        }
      }
      run_free(&o);
    }
    batch_free(&b);
  }
}

/* draft == target: l1 = 0 and accept = 1 exactly, tau = g + 1; the L1 gradient vanishes. */
static void test_draft_equals_target(void) {
  batch b = batch_new(&g_rng, 3, 7, 29, 5);
  memcpy(b.target, b.draft, (size_t)(b.R * b.V) * sizeof(float));
  ds_dspark_loss_config cfg = cfg_with(1, 1);
  run_out o = run_loss(&cfg, &b, 1.0);
  EXPECT_OK(o.st);
  for (int64_t r = 0; r < b.R; r++) EXPECT(o.l1[r] == 0.0 && o.acc[r] == 1.0);
  EXPECT(o.res.pair[DS_DSPARK_PAIR_L1][0] == 0.0);
  EXPECT(o.res.pair[DS_DSPARK_PAIR_ACCEPT][0] == 21.0 && o.res.pair[DS_DSPARK_PAIR_ACCEPT][1] == 21.0);
  EXPECT(o.res.pair[DS_DSPARK_PAIR_TAU][0] == 3.0 * 8.0 && o.res.pair[DS_DSPARK_PAIR_TAU][1] == 3.0);
  for (int64_t k = 0; k < 7; k++) EXPECT(o.pos_acc[k] == 3.0 && o.pos_cnt[k] == 3.0);
  /* the gradient is the CE gradient alone */
  ds_dspark_loss_config ce_only = cfg;
  ce_only.alpha_l1 = 0, ce_only.alpha_conf = 0;
  run_out c = run_loss(&ce_only, &b, 1.0);
  EXPECT(same_bits(o.gd, c.gd, (size_t)(b.R * b.V) * sizeof(float)));
  run_free(&o), run_free(&c);
  batch_free(&b);
}

/* Disjoint supports (+-30 on disjoint one-hots): l1 = 2 exactly, accept = 0 exactly. */
static void test_disjoint_supports(void) {
  const int64_t Vs[] = {2, 16, 40};
  for (int i = 0; i < 3; i++) {
    batch b = batch_new(&g_rng, 2, 3, Vs[i], 1);
    for (int64_t r = 0; r < b.R; r++)
      for (int64_t v = 0; v < b.V; v++) {
        b.draft[r * b.V + v] = v == r % b.V ? 30.0f : -30.0f;
        b.target[r * b.V + v] = v == (r + 1) % b.V ? 30.0f : -30.0f;
      }
    ds_dspark_loss_config cfg = cfg_with(1, 1);
    run_out o = run_loss(&cfg, &b, 1.0);
    EXPECT_OK(o.st);
    for (int64_t r = 0; r < b.R; r++) EXPECT(o.l1[r] == 2.0 && o.acc[r] == 0.0);
    EXPECT(o.res.pair[DS_DSPARK_PAIR_ACCEPT][0] == 0.0);
    EXPECT(o.res.pair[DS_DSPARK_PAIR_TAU][0] == 2.0 && o.res.pair[DS_DSPARK_PAIR_TAU][1] == 2.0);
    EXPECT_CLOSE(o.res.pair[DS_DSPARK_PAIR_L1][0], 2.0 * o.res.W, 1e-15, 0);
    run_free(&o);
    batch_free(&b);
  }
}

/* The training term is the RAW L1; the 1/2 belongs to the label only. V = 2, q = (3/4, 1/4),
 * p = (1/4, 3/4): l1 = 1 (not 1/2), accept = 1/2, d l1 / d x = q (s - q.s) = (3/8, -3/8). */
static void test_raw_l1_half_label(void) {
  batch b = batch_new(&g_rng, 1, 1, 2, 1);
  b.draft[0] = logf(3.0f), b.draft[1] = 0.0f;
  b.target[0] = 0.0f, b.target[1] = logf(3.0f);
  ds_dspark_loss_config cfg = cfg_with(1, 0);
  cfg.alpha_ce = 0, cfg.alpha_l1 = 1;
  run_out o = run_loss(&cfg, &b, 1.0);
  EXPECT_OK(o.st);
  EXPECT_CLOSE(o.l1[0], 1.0, 1e-6, 0);
  EXPECT_CLOSE(o.acc[0], 0.5, 1e-6, 0);
  EXPECT_CLOSE(o.res.numerator, 1.0, 1e-6, 0); /* w = 1 at slot 0 */
  EXPECT_CLOSE(o.res.pair[DS_DSPARK_PAIR_ACCEPT][0], 0.5, 1e-6, 0);
  EXPECT_CLOSE(o.gd[0], 0.375, 1e-6, 0);
  EXPECT_CLOSE(o.gd[1], -0.375, 1e-6, 0);
  run_free(&o);
  batch_free(&b);
}

/* Chunked == unchunked: values, pairs and gradients bitwise for chunk sizes 1, 3, 7, R, > R;
 * the trainer's path (core per chunk, gradient in place over the logits, then finish) too. */
static void test_chunked_equals_unchunked(void) {
  batch b = batch_new(&g_rng, 5, 7, 53, 3);
  b.em[6] = 0, b.em[13] = 0, b.bk[3] = 0;
  for (int mode = 0; mode < 3; mode++) {
    ds_dspark_loss_config cfg = cfg_with(mode != 2, mode == 0);
    run_out ref = run_loss(&cfg, &b, 0.125);
    EXPECT_OK(ref.st);
    const int64_t chunks[] = {1, 3, 7, 35, 36, 1000};
    for (int i = 0; i < 6; i++) {
      cfg.chunk_rows = chunks[i];
      run_out o = run_loss(&cfg, &b, 0.125);
      EXPECT_OK(o.st);
      EXPECT(runs_identical(&o, &ref, &b));
      run_free(&o);
    }
    /* trainer path: weights, then the core on chunks of 4 rows with the gradient written over
     * a copy of the logits, then finish */
    cfg.chunk_rows = 128;
    batch c = batch_copy(&b);
    uint8_t sup[35];
    double w[35], ce[35], l1[35], acc[35], bce[35], pa[7], pc[7];
    float gc[35];
    EXPECT_OK(ds_dspark_loss_weights(&cfg, b.nb, b.g, b.em, b.bk, sup, w));
    for (int64_t r0 = 0; r0 < b.R; r0 += 4) {
      int64_t n = b.R - r0 < 4 ? b.R - r0 : 4;
      ds_dspark_row_stats part = {ce + r0, l1 + r0, acc + r0, bce + r0, NULL};
      EXPECT_OK(ds_dspark_loss_rows(&cfg, r0, b.g, n, b.V, c.draft + r0 * b.V, cfg.has_teacher ? c.target + r0 * b.V : NULL,
                                    c.ids + r0, sup + r0, w + r0, cfg.has_conf ? c.conf + r0 : NULL, 0.125, &part,
                                    c.draft + r0 * b.V, gc + r0));
    }
    ds_dspark_row_stats all = {ce, l1, acc, bce, NULL};
    ds_dspark_loss_result res;
    EXPECT_OK(ds_dspark_loss_finish(&cfg, b.nb, b.g, sup, w, &all, &res, pa, pc));
    EXPECT(same_bits(c.draft, ref.gd, (size_t)(b.R * b.V) * sizeof(float)));
    EXPECT(same_bits(gc, ref.gc, sizeof gc));
    EXPECT(results_identical(&res, &ref.res));
    EXPECT(same_bits(pa, ref.pos_acc, sizeof pa) && same_bits(pc, ref.pos_cnt, sizeof pc));
    batch_free(&c);
    run_free(&ref);
  }
  batch_free(&b);
}

/* Dropping an anchor (block_keep = 0) == zeroing its eval mask: loss, token count, every pair
 * and the gradients identical, and the gradient exactly 0 on the dropped block. */
static void test_drop_anchor_equals_zero_mask(void) {
  batch b = batch_new(&g_rng, 4, 7, 31, 3);
  b.em[5] = b.em[6] = 0; /* a prefix mask elsewhere */
  batch a = batch_copy(&b), z = batch_copy(&b);
  a.bk[2] = 0;
  for (int64_t k = 0; k < 7; k++) z.em[2 * 7 + k] = 0;
  for (int mode = 0; mode < 3; mode++) {
    ds_dspark_loss_config cfg = cfg_with(mode != 2, mode == 0);
    run_out oa = run_loss(&cfg, &a, 1.0), oz = run_loss(&cfg, &z, 1.0), ob = run_loss(&cfg, &b, 1.0);
    EXPECT(runs_identical(&oa, &oz, &b));
    EXPECT(oa.res.num_tokens == ob.res.num_tokens - 7);
    for (int64_t i = 2 * 7 * b.V; i < 3 * 7 * b.V; i++) EXPECT(oa.gd[i] == 0.0f && !signbit(oa.gd[i]));
    for (int64_t r = 14; r < 21; r++) EXPECT(oa.gc[r] == 0.0f && !signbit(oa.gc[r]));
    if (mode != 2) EXPECT(oa.res.pair[DS_DSPARK_PAIR_TAU][1] == 3.0); /* dropped block leaves the denominator */
    run_free(&oa), run_free(&oz), run_free(&ob);
  }
  batch_free(&a), batch_free(&z), batch_free(&b);
}

/* Uneven micro-batches: summing numerators and denominators over micro-batches and dividing
 * once gives the full-batch value (and, with grad_scale = 1 / global W, the full-batch
 * gradient bit for bit); the mean of per-micro-batch means does not. */
static void test_uneven_microbatches(void) {
  batch b = batch_new(&g_rng, 6, 7, 41, 4);
  /* micro-batch 1 = blocks 0..3, fully supervised (28 tokens); micro-batch 2 = blocks 4..5
   * with one supervised slot each (2 tokens), and a sharper draft so its per-token loss differs */
  for (int64_t r = 28; r < 42; r++) {
    b.em[r] = (r % 7) == 0;
    for (int64_t v = 0; v < b.V; v++) b.draft[r * b.V + v] *= 8.0f;
  }
  ds_dspark_loss_config cfg = cfg_with(1, 1);
  run_out full = run_loss(&cfg, &b, 1.0);
  double Wg = full.res.W;
  run_out fullg = run_loss(&cfg, &b, 1.0 / Wg);
  batch m1 = b, m2 = b;
  m1.nb = 4, m1.R = 28;
  m2.nb = 2, m2.R = 14, m2.draft += 28 * b.V, m2.target += 28 * b.V, m2.conf += 28, m2.ids += 28, m2.em += 28, m2.bk += 4;
  run_out o1 = run_loss(&cfg, &m1, 1.0 / Wg), o2 = run_loss(&cfg, &m2, 1.0 / Wg);
  EXPECT_OK(o1.st);
  EXPECT_OK(o2.st);
  ds_dspark_loss_result sum = o1.res;
  ds_dspark_loss_result_add(&sum, &o2.res);
  EXPECT(sum.num_tokens == full.res.num_tokens && sum.num_tokens == 30);
  for (int i = 0; i < DS_DSPARK_PAIR_COUNT; i++) {
    double got = sum.pair[i][0] / sum.pair[i][1], want = full.res.pair[i][0] / full.res.pair[i][1];
    EXPECT_CLOSE(got, want, 1e-14, 0);
    EXPECT(sum.pair_present[i]);
  }
  /* gradients with the global W: the full-batch gradient, bit for bit */
  EXPECT(same_bits(o1.gd, fullg.gd, (size_t)(28 * b.V) * sizeof(float)));
  EXPECT(same_bits(o2.gd, fullg.gd + 28 * b.V, (size_t)(14 * b.V) * sizeof(float)));
  EXPECT(same_bits(o1.gc, fullg.gc, 28 * sizeof(float)) && same_bits(o2.gc, fullg.gc + 28, 14 * sizeof(float)));
  /* the mean of means is biased */
  double loss_full = full.res.numerator / full.res.W;
  double mean_of_means = 0.5 * (o1.res.numerator / o1.res.W + o2.res.numerator / o2.res.W);
  double gap = fabs(mean_of_means - loss_full) / loss_full;
  fprintf(stderr, "  uneven micro-batches: global %.6f, sum/sum %.6f, mean of means %.6f (%.1f%% off)\n", loss_full,
          sum.numerator / sum.W, mean_of_means, 100 * gap);
  EXPECT(gap > 0.1);
  /* and so is its gradient: rows of micro-batch 2 get scale 1/(2 W2) instead of 1/W */
  run_out l1 = run_loss(&cfg, &m1, 0.5 / o1.res.W), l2 = run_loss(&cfg, &m2, 0.5 / o2.res.W);
  double num = 0, den = 0;
  for (int64_t i = 0; i < b.R * b.V; i++) {
    float g = i < 28 * b.V ? l1.gd[i] : l2.gd[i - 28 * b.V];
    num = fmax(num, fabs((double)g - fullg.gd[i])), den = fmax(den, fabs((double)fullg.gd[i]));
  }
  fprintf(stderr, "  mean-of-means gradient: %.0f%% normwise off the global-token gradient\n", 100 * num / den);
  EXPECT(num / den > 0.1);
  run_free(&full), run_free(&fullg), run_free(&o1), run_free(&o2), run_free(&l1), run_free(&l2);
  batch_free(&b);
}

/* numerator = sum alpha * term numerator, and the gradient is linear in the alphas. */
static void test_loss_is_alpha_sum(void) {
  batch b = batch_new(&g_rng, 3, 5, 23, 3);
  ds_dspark_loss_config cfg = cfg_with(1, 1);
  cfg.alpha_ce = 0.3, cfg.alpha_l1 = 0.45, cfg.alpha_conf = 2.5;
  run_out o = run_loss(&cfg, &b, 1.0);
  EXPECT(o.res.numerator == cfg.alpha_ce * o.res.pair[DS_DSPARK_PAIR_CE][0] +
                                cfg.alpha_l1 * o.res.pair[DS_DSPARK_PAIR_L1][0] +
                                cfg.alpha_conf * o.res.pair[DS_DSPARK_PAIR_CONF][0]);
  EXPECT(o.res.pair[DS_DSPARK_PAIR_LOSS][0] == o.res.numerator);
  run_out parts[3];
  for (int i = 0; i < 3; i++) {
    ds_dspark_loss_config one = cfg;
    one.alpha_ce = i == 0, one.alpha_l1 = i == 1, one.alpha_conf = i == 2;
    parts[i] = run_loss(&one, &b, 1.0);
  }
  double num = 0, den = 0;
  for (int64_t j = 0; j < b.R * b.V; j++) {
    double lin = cfg.alpha_ce * parts[0].gd[j] + cfg.alpha_l1 * parts[1].gd[j] + cfg.alpha_conf * parts[2].gd[j];
    num = fmax(num, fabs(lin - o.gd[j])), den = fmax(den, fabs(lin));
  }
  EXPECT(num / den < 1e-6);
  for (int64_t r = 0; r < b.R; r++) EXPECT_CLOSE(o.gc[r], cfg.alpha_conf * parts[2].gc[r], 1e-6, 1e-9);
  EXPECT_CLOSE(o.res.numerator, cfg.alpha_ce * parts[0].res.numerator + cfg.alpha_l1 * parts[1].res.numerator +
                                    cfg.alpha_conf * parts[2].res.numerator, 1e-14, 0);
  for (int i = 0; i < 3; i++) run_free(&parts[i]);
  run_free(&o);
  batch_free(&b);
}

/* Without a teacher: CE only; l1 and confidence report [0, W]; accept and tau are absent;
 * confidence logits, if given, get a zero gradient. */
static void test_ce_only_without_teacher(void) {
  batch b = batch_new(&g_rng, 3, 7, 19, 3);
  b.em[20] = 0;
  for (int conf = 0; conf < 2; conf++) {
    ds_dspark_loss_config cfg = cfg_with(0, conf);
    run_out o = run_loss(&cfg, &b, 1.0);
    EXPECT_OK(o.st);
    ref_out ref;
    ref_of_batch(&cfg, &b, &ref);
    EXPECT_CLOSE(o.res.numerator, 0.1 * ref.ce, 2e-6, 0);
    EXPECT(o.res.W > 0);
    EXPECT(o.res.pair[DS_DSPARK_PAIR_L1][0] == 0.0 && o.res.pair[DS_DSPARK_PAIR_L1][1] == o.res.W);
    EXPECT(o.res.pair[DS_DSPARK_PAIR_CONF][0] == 0.0 && o.res.pair[DS_DSPARK_PAIR_CONF][1] == o.res.W);
    EXPECT(!o.res.pair_present[DS_DSPARK_PAIR_ACCEPT] && !o.res.pair_present[DS_DSPARK_PAIR_TAU]);
    EXPECT(o.res.pair[DS_DSPARK_PAIR_ACCEPT][0] == 0.0 && o.res.pair[DS_DSPARK_PAIR_ACCEPT][1] == 0.0);
    for (int64_t k = 0; k < 7; k++) EXPECT(o.pos_acc[k] == 0.0 && o.pos_cnt[k] == 0.0);
    for (int64_t r = 0; r < b.R; r++) EXPECT(o.gc[r] == 0.0f);
    /* gradient = w alpha_ce (q - onehot) */
    double err = 0, den = 0;
    for (int64_t r = 0; r < b.R; r++) {
      double w = b.em[r] ? exp(-(double)(r % 7) / 4.0) : 0.0, m = -INFINITY, s = 0;
      const float *x = b.draft + r * b.V;
      for (int64_t v = 0; v < b.V; v++) m = fmax(m, x[v]);
      for (int64_t v = 0; v < b.V; v++) s += exp(x[v] - m);
      for (int64_t v = 0; v < b.V; v++) {
        double want = w * 0.1 * (exp(x[v] - m) / s - (v == b.ids[r]));
        err = fmax(err, fabs(o.gd[r * b.V + v] - want)), den = fmax(den, fabs(want));
      }
    }
    EXPECT(err / den < 1e-6);
    run_free(&o);
  }
  batch_free(&b);
}

/* A batch with no supervised slot: numerator 0, count 0, W 0, no NaN anywhere, zero gradients. */
static void test_zero_mask(void) {
  batch b = batch_new(&g_rng, 3, 4, 17, 3);
  memset(b.em, 0, (size_t)b.R);
  for (int mode = 0; mode < 3; mode++) {
    ds_dspark_loss_config cfg = cfg_with(mode != 2, mode == 0);
    run_out o = run_loss(&cfg, &b, 1.0);
    EXPECT_OK(o.st);
    EXPECT(o.res.numerator == 0.0 && o.res.num_tokens == 0 && o.res.W == 0.0);
    for (int i = 0; i < DS_DSPARK_PAIR_COUNT; i++) EXPECT(o.res.pair[i][0] == 0.0 && o.res.pair[i][1] == 0.0);
    for (int64_t i = 0; i < b.R * b.V; i++) EXPECT(o.gd[i] == 0.0f);
    for (int64_t r = 0; r < b.R; r++) EXPECT(o.gc[r] == 0.0f && !isnan(o.ce[r]));
    run_free(&o);
  }
  /* no blocks at all */
  batch e = batch_new(&g_rng, 0, 7, 5, 1);
  ds_dspark_loss_config cfg = cfg_with(1, 1);
  run_out o = run_loss(&cfg, &e, 1.0);
  EXPECT_OK(o.st);
  EXPECT(o.res.numerator == 0.0 && o.res.num_tokens == 0);
  run_free(&o);
  batch_free(&e);
  batch_free(&b);
}

/* With a teacher but no confidence logits, the confidence term reports [0, W], not [0, 0]. */
static void test_disabled_conf_reports_0_over_W(void) {
  batch b = batch_new(&g_rng, 2, 7, 11, 3);
  ds_dspark_loss_config cfg = cfg_with(1, 0);
  run_out o = run_loss(&cfg, &b, 1.0);
  EXPECT_OK(o.st);
  EXPECT(o.res.W > 0);
  EXPECT(o.res.pair[DS_DSPARK_PAIR_CONF][0] == 0.0 && o.res.pair[DS_DSPARK_PAIR_CONF][1] == o.res.W);
  EXPECT(o.res.pair_present[DS_DSPARK_PAIR_CONF]);
  for (int64_t r = 0; r < b.R; r++) EXPECT(o.bce[r] == 0.0 && o.gc[r] == 0.0f);
  EXPECT(o.res.pair_present[DS_DSPARK_PAIR_ACCEPT] && o.res.pair[DS_DSPARK_PAIR_ACCEPT][1] == 14.0);
  run_free(&o);
  batch_free(&b);
}

/* Poisoned padding: sentinel ids (-1, -100, V) and NaN / +inf / -inf in the draft AND the
 * teacher (and confidence) at unsupervised slots, inside eval-masked tails and inside a dropped
 * block: every output bit-identical to clean padding, gradients there exactly +0.0. */
static void test_poisoned_padding(void) {
  batch clean = batch_new(&g_rng, 5, 7, 37, 4);
  for (int64_t k = 3; k < 7; k++) clean.em[7 + k] = 0; /* block 1: prefix of 3 */
  clean.em[4 * 7 + 6] = 0;                              /* block 4: prefix of 6 */
  clean.bk[2] = 0;                                      /* block 2 dropped, its eval mask all ones */
  for (int64_t r = 0; r < clean.R; r++) {
    if (clean.em[r] && clean.bk[r / 7]) continue;
    clean.ids[r] = 0, clean.conf[r] = 0;
    for (int64_t v = 0; v < clean.V; v++) clean.draft[r * clean.V + v] = clean.target[r * clean.V + v] = 0;
  }
  batch bad = batch_copy(&clean);
  const int32_t sentinel[3] = {-1, -100, (int32_t)clean.V};
  const float poison[3] = {NAN, INFINITY, -INFINITY};
  int n = 0;
  for (int64_t r = 0; r < bad.R; r++) {
    if (bad.em[r] && bad.bk[r / 7]) continue;
    bad.ids[r] = sentinel[n % 3];
    bad.conf[r] = poison[n % 3];
    for (int64_t v = 0; v < bad.V; v++) {
      bad.draft[r * bad.V + v] = poison[(v + n) % 3];
      bad.target[r * bad.V + v] = poison[(v + n + 1) % 3];
    }
    n++;
  }
  EXPECT(n == 12);
  for (int mode = 0; mode < 3; mode++) {
    ds_dspark_loss_config cfg = cfg_with(mode != 2, mode == 0);
    for (int64_t chunk = 1; chunk <= 128; chunk *= 8) {
      cfg.chunk_rows = chunk;
      run_out oc = run_loss(&cfg, &clean, 0.5), ob = run_loss(&cfg, &bad, 0.5);
      EXPECT_OK(oc.st);
      EXPECT_OK(ob.st);
      EXPECT(runs_identical(&oc, &ob, &clean));
      for (int64_t r = 0; r < bad.R; r++) {
        if (bad.em[r] && bad.bk[r / 7]) continue;
        for (int64_t v = 0; v < bad.V; v++) EXPECT(ob.gd[r * bad.V + v] == 0.0f && !signbit(ob.gd[r * bad.V + v]));
        EXPECT(ob.gc[r] == 0.0f && !signbit(ob.gc[r]));
      }
      EXPECT(isfinite(ob.res.numerator));
      run_free(&oc), run_free(&ob);
    }
  }
  batch_free(&clean), batch_free(&bad);
}

/* A supervised id outside [0, V) is an error that names block, slot and row; nothing is
 * written. Non-finite values at supervised slots are errors too, as are inconsistent inputs. */
static void test_errors(void) {
  batch b = batch_new(&g_rng, 3, 7, 20, 3);
  ds_dspark_loss_config cfg = cfg_with(1, 1);
  const int32_t bad_ids[3] = {-1, -100, 20};
  for (int i = 0; i < 3; i++) {
    batch c = batch_copy(&b);
    c.ids[17] = bad_ids[i];
    run_out o = run_loss(&cfg, &c, 1.0);
    EXPECT(o.st == DS_ERR_RANGE);
    EXPECT(strstr(ds_last_error(), "block 2 slot 3 (row 17)") != NULL);
    uint32_t untouched;
    memcpy(&untouched, o.gd, 4);
    EXPECT(untouched == 0x7f7f7f7fu); /* checked before any output is written */
    run_free(&o);
    /* unsupervised, the same id is fine */
    c.em[17] = 0;
    o = run_loss(&cfg, &c, 1.0);
    EXPECT_OK(o.st);
    run_free(&o);
    batch_free(&c);
  }
  /* the core names the global row from row0 */
  {
    uint8_t sup[2] = {1, 1};
    double w[2] = {1, 1}, v4[4][2];
    int32_t ids[2] = {3, 99};
    ds_dspark_row_stats rs = {v4[0], v4[1], v4[2], v4[3], NULL};
    ds_dspark_loss_config c0 = cfg_with(0, 0);
    EXPECT(ds_dspark_loss_rows(&c0, 40, 7, 2, 20, b.draft, NULL, ids, sup, w, NULL, 1.0, &rs, NULL, NULL) == DS_ERR_RANGE);
    EXPECT(strstr(ds_last_error(), "block 5 slot 6 (row 41)") != NULL);
  }
  /* non-finite supervised values */
  for (int what = 0; what < 5; what++) {
    batch c = batch_copy(&b);
    if (what == 0) c.draft[9 * 20 + 4] = NAN;
    if (what == 1) c.draft[9 * 20 + 4] = INFINITY;
    if (what == 2) c.target[9 * 20 + 5] = NAN;
    if (what == 3) c.conf[9] = INFINITY;
    if (what == 4) c.draft[9 * 20 + c.ids[9]] = -INFINITY; /* zero probability for the target token */
    run_out o = run_loss(&cfg, &c, 1.0);
    EXPECT(o.st == DS_ERR_NUMERIC);
    EXPECT(strstr(ds_last_error(), "block 1 slot 2 (row 9)") != NULL);
    run_free(&o);
    batch_free(&c);
  }
  /* -inf at a supervised slot elsewhere is a probability of 0, not an error */
  {
    batch c = batch_copy(&b);
    c.draft[9 * 20 + (c.ids[9] + 1) % 20] = -INFINITY;
    c.target[9 * 20 + 3] = -INFINITY;
    run_out o = run_loss(&cfg, &c, 1.0);
    EXPECT_OK(o.st);
    EXPECT(isfinite(o.res.numerator));
    EXPECT(o.gd[9 * 20 + (c.ids[9] + 1) % 20] == 0.0f);
    run_free(&o);
    batch_free(&c);
  }
  /* flags that disagree with the pointers */
  {
    ds_dspark_loss_config c1 = cfg_with(1, 0);
    ds_dspark_loss_inputs in = inputs_of(&b, &c1);
    ds_dspark_loss_result res;
    in.target_logits = NULL;
    EXPECT(ds_dspark_loss(&c1, b.nb, b.g, b.V, &in, 1.0, &res, NULL, NULL, NULL, NULL, NULL) == DS_ERR_ARG);
    in = inputs_of(&b, &c1);
    in.conf_logits = b.conf;
    EXPECT(ds_dspark_loss(&c1, b.nb, b.g, b.V, &in, 1.0, &res, NULL, NULL, NULL, NULL, NULL) == DS_ERR_ARG);
    in = inputs_of(&b, &c1);
    EXPECT(ds_dspark_loss(&c1, b.nb, 0, b.V, &in, 1.0, &res, NULL, NULL, NULL, NULL, NULL) == DS_ERR_ARG);
    EXPECT(ds_dspark_loss(&c1, b.nb, b.g, b.V, &in, NAN, &res, NULL, NULL, NULL, NULL, NULL) == DS_ERR_ARG);
  }
  batch_free(&b);
}

/* Gradients against central finite differences of the double reference numerator, with the
 * detached label held fixed; and a check that without detaching the difference is visible. */
static void test_grad_finite_differences(void) {
  for (int mode = 0; mode < 3; mode++) {
    batch b = batch_new(&g_rng, 2, 4, 11, 1.5f);
    b.em[3] = 0;      /* an unsupervised row: FD 0, ours exactly 0 */
    b.em[6] = b.em[7] = 0;
    ds_dspark_loss_config cfg = cfg_with(mode != 2, mode == 0);
    cfg.alpha_ce = 0.3, cfg.alpha_l1 = 0.9, cfg.alpha_conf = 0.7;
    run_out o = run_loss(&cfg, &b, 1.0);
    EXPECT_OK(o.st);
    int64_t n = b.R * b.V;
    double *d = to_double(b.draft, n), *t = to_double(b.target, n), *z = to_double(b.conf, b.R);
    double *acc = calloc((size_t)b.R, sizeof(double)), *fd = calloc((size_t)n, sizeof(double));
    double *fd_free = calloc((size_t)n, sizeof(double)), *fdz = calloc((size_t)b.R, sizeof(double));
    ref_out r0, rp, rm;
    ref_loss(&cfg, &b, d, t, z, NULL, acc, &r0);
    const double h = 1e-5;
    for (int64_t i = 0; i < n; i++) {
      double x0 = d[i];
      d[i] = x0 + h, ref_loss(&cfg, &b, d, t, z, acc, NULL, &rp);
      d[i] = x0 - h, ref_loss(&cfg, &b, d, t, z, acc, NULL, &rm);
      fd[i] = (rp.num - rm.num) / (2 * h);
      d[i] = x0 + h, ref_loss(&cfg, &b, d, t, z, NULL, NULL, &rp); /* label NOT detached */
      d[i] = x0 - h, ref_loss(&cfg, &b, d, t, z, NULL, NULL, &rm);
      fd_free[i] = (rp.num - rm.num) / (2 * h);
      d[i] = x0;
    }
    for (int64_t r = 0; r < b.R; r++) {
      double z0 = z[r];
      z[r] = z0 + h, ref_loss(&cfg, &b, d, t, z, acc, NULL, &rp);
      z[r] = z0 - h, ref_loss(&cfg, &b, d, t, z, acc, NULL, &rm);
      fdz[r] = (rp.num - rm.num) / (2 * h);
      z[r] = z0;
    }
    double e = rel_err_fd(o.gd, fd, n), ez = rel_err_fd(o.gc, fdz, b.R), ef = rel_err_fd(o.gd, fd_free, n);
    fprintf(stderr, "  mode %d: draft grad vs FD %.2e, conf grad vs FD %.2e, vs FD through the label %.2e\n", mode, e,
            ez, ef);
    EXPECT(e < 1e-5);
    EXPECT(ez < 1e-5 || mode != 0);
    if (mode == 0) EXPECT(ef > 1e-3); /* the detachment is visible: the test can tell */
    for (int64_t v = 0; v < b.V; v++) EXPECT(o.gd[3 * b.V + v] == 0.0f && fd[3 * b.V + v] == 0.0);
    if (mode != 0)
      for (int64_t r = 0; r < b.R; r++) EXPECT(o.gc[r] == 0.0f && fdz[r] == 0.0);
    free(d), free(t), free(z), free(acc), free(fd), free(fd_free), free(fdz);
    run_free(&o);
    batch_free(&b);
  }
}

/* grad_scale multiplies both gradients (a power of two: exactly) and nothing else. */
static void test_grad_scale(void) {
  batch b = batch_new(&g_rng, 2, 7, 33, 3);
  ds_dspark_loss_config cfg = cfg_with(1, 1);
  run_out a = run_loss(&cfg, &b, 1.0), q = run_loss(&cfg, &b, 0.25);
  EXPECT(results_identical(&a.res, &q.res));
  for (int64_t i = 0; i < b.R * b.V; i++) EXPECT(q.gd[i] == 0.25f * a.gd[i]);
  for (int64_t r = 0; r < b.R; r++) EXPECT(q.gc[r] == 0.25f * a.gc[r]);
  run_free(&a), run_free(&q);
  batch_free(&b);
}

/* Same inputs, same bits: repeated calls, 1 / 2 / 3 threads, and the gradient written over
 * the logits in place. */
static void test_determinism(void) {
  batch b = batch_new(&g_rng, 6, 7, 300, 4);
  b.em[10] = 0;
  ds_dspark_loss_config cfg = cfg_with(1, 1);
  cfg.chunk_rows = 16;
  int saved = ds_get_num_threads();
  ds_set_num_threads(1);
  run_out one = run_loss(&cfg, &b, 0.3);
  for (int th = 1; th <= 3; th++) {
    ds_set_num_threads(th);
    for (int rep = 0; rep < 2; rep++) {
      run_out o = run_loss(&cfg, &b, 0.3);
      EXPECT(runs_identical(&o, &one, &b));
      run_free(&o);
    }
  }
  ds_set_num_threads(saved);
  /* in place: grad_draft == draft_logits */
  batch c = batch_copy(&b);
  ds_dspark_loss_inputs in = inputs_of(&c, &cfg);
  ds_dspark_loss_result res;
  float gc[42];
  EXPECT_OK(ds_dspark_loss(&cfg, c.nb, c.g, c.V, &in, 0.3, &res, NULL, NULL, c.draft, gc, NULL));
  EXPECT(same_bits(c.draft, one.gd, (size_t)(b.R * b.V) * sizeof(float)));
  EXPECT(results_identical(&res, &one.res));
  batch_free(&c);
  run_free(&one);
  batch_free(&b);
}

int main(void) {
  ds_rng_seed(&g_rng, 20260711);
  TEST_RUN(test_config);
  TEST_RUN(test_decay);
  TEST_RUN(test_matches_reference);
  TEST_RUN(test_draft_equals_target);
  TEST_RUN(test_disjoint_supports);
  TEST_RUN(test_raw_l1_half_label);
  TEST_RUN(test_chunked_equals_unchunked);
  TEST_RUN(test_drop_anchor_equals_zero_mask);
  TEST_RUN(test_uneven_microbatches);
  TEST_RUN(test_loss_is_alpha_sum);
  TEST_RUN(test_ce_only_without_teacher);
  TEST_RUN(test_zero_mask);
  TEST_RUN(test_disabled_conf_reports_0_over_W);
  TEST_RUN(test_poisoned_padding);
  TEST_RUN(test_errors);
  TEST_RUN(test_grad_finite_differences);
  TEST_RUN(test_grad_scale);
  TEST_RUN(test_determinism);
  return TEST_RESULT();
}
