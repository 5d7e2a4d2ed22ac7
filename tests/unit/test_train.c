/* Training utilities: anchor sampling (spec section 5), the eval-mask prefix rule, AdamW
 * against hand-computed PyTorch-order updates, the warmup + cosine schedule, gradient
 * clipping. The trainer core and its checkpoints: test_trainer_core.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/anchors.h"
#include "dspark/optim.h"
#include "test_util.h"

static void test_anchors(void) {
  enum { T = 20, MAXA = 8, G = 4 };
  uint8_t mask[T];
  for (int t = 0; t < T; t++) mask[t] = (t >= 3 && t < 9) || t >= 12; /* two supervised spans */
  int64_t anchors[MAXA];
  uint8_t keep[MAXA], eval[MAXA * G];
  ds_rng rng;
  ds_rng_seed(&rng, 1);
  int64_t n = ds_sample_anchors(mask, T, MAXA, G, &rng, anchors, keep, eval);
  EXPECT(n == MAXA);
  for (int64_t b = 0; b < n; b++) {
    int64_t a = anchors[b];
    EXPECT(keep[b] && a >= 0 && a <= T - 2 && mask[a] && mask[a + 1]);
    if (b) EXPECT(anchors[b] > anchors[b - 1]); /* sorted, without replacement */
    int alive = 1;
    for (int k = 0; k < G; k++) {
      int64_t t = a + k + 1;
      alive = alive && t < T && mask[t];
      EXPECT(eval[b * G + k] == alive); /* a contiguous prefix */
    }
  }
  /* Fewer eligible anchors than slots: the rest are dummies with an all-zero eval mask. */
  uint8_t few[T] = {0};
  few[5] = few[6] = few[7] = 1; /* eligible: 5, 6 */
  ds_rng_seed(&rng, 2);
  n = ds_sample_anchors(few, T, MAXA, G, &rng, anchors, keep, eval);
  EXPECT(n == 2 && anchors[0] == 5 && anchors[1] == 6);
  EXPECT(eval[0] == 1 && eval[1] == 1 && eval[2] == 0); /* 6, 7 supervised; 8 not */
  EXPECT(eval[G] == 1 && eval[G + 1] == 0);
  for (int b = 2; b < MAXA; b++) {
    EXPECT(!keep[b]);
    for (int k = 0; k < G; k++) EXPECT(eval[b * G + k] == 0);
  }
  /* Same seed, same draw; the derived seeds differ by rank, step and sequence. */
  int64_t a1[MAXA], a2[MAXA];
  ds_rng_seed(&rng, ds_anchor_seed(7, 0, 3, 1));
  ds_sample_anchors(mask, T, 5, G, &rng, a1, keep, eval);
  ds_rng_seed(&rng, ds_anchor_seed(7, 0, 3, 1));
  ds_sample_anchors(mask, T, 5, G, &rng, a2, keep, eval);
  EXPECT(!memcmp(a1, a2, 5 * sizeof(int64_t)));
  EXPECT(ds_anchor_seed(7, 0, 3, 1) != ds_anchor_seed(7, 1, 3, 1));
  EXPECT(ds_anchor_seed(7, 0, 3, 1) != ds_anchor_seed(7, 0, 4, 1));
}

static void test_adamw(void) {
  ds_adamw opt;
  EXPECT_OK(ds_adamw_init(&opt, 2));
  ds_adamw_config cfg = {0.9, 0.999, 1e-8, 0.1};
  float p[2] = {1.0f, -2.0f}, g[2] = {0.5f, -1.0f};
  ds_adamw_step(&opt, &cfg, 0.01, p, g);
  /* Step 1: m = 0.1 g, v = 0.001 g^2, bias-corrected m/sqrt(v) = sign(g); decay first. */
  EXPECT_CLOSE(p[0], 1.0 * (1 - 0.001) - 0.01 * 1.0, 1e-6, 1e-7);
  EXPECT_CLOSE(p[1], -2.0 * (1 - 0.001) + 0.01 * 1.0, 1e-6, 1e-7);
  ds_adamw_step(&opt, &cfg, 0.01, p, g);
  EXPECT(opt.step == 2);
  ds_adamw_free(&opt);

  EXPECT_CLOSE(ds_lr_at(0, 100, 0.04, 1.0), 0.25, 1e-12, 0);  /* warmup 4 steps: 1/4 */
  EXPECT_CLOSE(ds_lr_at(3, 100, 0.04, 1.0), 1.0, 1e-12, 0);
  EXPECT_CLOSE(ds_lr_at(4, 100, 0.04, 1.0), 1.0, 1e-12, 0);   /* cosine starts at the peak */
  EXPECT_CLOSE(ds_lr_at(52, 100, 0.04, 1.0), 0.5, 1e-12, 0);  /* halfway through the cosine */
  EXPECT_CLOSE(ds_lr_at(100, 100, 0.04, 1.0), 0.0, 0, 1e-12);

  float gr[3] = {3, 4, 0};
  EXPECT_CLOSE(ds_clip_grad_norm(gr, 3, 1.0), 5.0, 1e-12, 0);
  EXPECT_CLOSE(ds_grad_norm(gr, 3), 1.0, 1e-6, 0);
  float gs[2] = {0.3f, 0.4f};
  ds_clip_grad_norm(gs, 2, 1.0); /* below the threshold: untouched */
  EXPECT(gs[0] == 0.3f && gs[1] == 0.4f);
}

int main(void) {
  TEST_RUN(test_anchors);
  TEST_RUN(test_adamw);
  return TEST_RESULT();
}
