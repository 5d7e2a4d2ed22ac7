/* Training utilities: anchor sampling (spec section 5), the eval-mask prefix rule, AdamW
 * against hand-computed PyTorch-order updates, the warmup + cosine schedule, gradient
 * clipping, and checkpoint save/load (bit-exact, with refusals). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dspark/anchors.h"
#include "dspark/checkpoint.h"
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

static void test_checkpoint(void) {
  ds_draft_config c;
  memset(&c, 0, sizeof c);
  c.vocab_size = 11; c.hidden_size = 8; c.intermediate_size = 12; c.num_attention_heads = 2;
  c.num_key_value_heads = 1; c.head_dim = 4; c.rms_norm_eps = 1e-6; c.num_layers = 1; c.block_size = 3;
  c.num_target_layers = 4; c.target_layer_ids[0] = 1; c.n_target_layers = 1; c.mask_token_id = 10;
  c.markov_type = DS_MARKOV_GATED; c.markov_rank = 3; c.enable_confidence_head = 1;
  c.confidence_head_with_markov = 1; c.num_anchors = 4;
  c.rope_source.head_dim = 4; c.rope_source.rope_theta = 10000;
  float table[11 * 8];
  for (int i = 0; i < 88; i++) table[i] = (float)i / 88.0f;
  ds_draft *d;
  EXPECT_OK(ds_draft_new(&c, table, table, 4, ds_backend_cpu(), &d));
  ds_adamw opt;
  EXPECT_OK(ds_adamw_init(&opt, ds_draft_num_params(d)));
  for (size_t i = 0; i < opt.n; i++) opt.m[i] = (float)i, opt.v[i] = 1.0f / (float)(i + 1);
  opt.step = 17;
  const char *target_cfg = "{\"model_type\": \"qwen3\", \"vocab_size\": 11, \"hidden_size\": 8, \"intermediate_size\": 12, "
                           "\"num_hidden_layers\": 4, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 4}";
  char *cfg_json = NULL;
  EXPECT_OK(ds_draft_hf_config_json(d, target_cfg, &cfg_json));
  const char *dir = getenv("DSPARK_TEST_TMP") ? getenv("DSPARK_TEST_TMP") : "/tmp";
  mkdir(dir, 0755);
  char path[512];
  snprintf(path, sizeof path, "%s/ckpt-test.safetensors", dir);
  ds_checkpoint_info info = {42, 1, cfg_json, "{\"lr\": 0.1}"};
  EXPECT_OK(ds_checkpoint_save(path, d, &opt, &info));
  ds_draft *e = NULL;
  ds_adamw opt2;
  ds_checkpoint_info info2;
  EXPECT_OK(ds_checkpoint_load(path, ds_backend_cpu(), &e, &opt2, &info2));
  if (e) {
    EXPECT(info2.step == 42 && info2.skipped_steps == 1 && opt2.step == 17);
    EXPECT(!strcmp(info2.train_config, "{\"lr\": 0.1}"));
    EXPECT(!memcmp(ds_draft_params(d), ds_draft_params(e), ds_draft_num_params(d) * sizeof(float)));
    EXPECT(!memcmp(ds_draft_embed(d), ds_draft_embed(e), sizeof table));
    EXPECT(!memcmp(opt.m, opt2.m, opt.n * sizeof(float)) && !memcmp(opt.v, opt2.v, opt.n * sizeof(float)));
    ds_draft_free(e);
    ds_adamw_free(&opt2);
    ds_checkpoint_info_free(&info2);
  }
  /* A safetensors file that is not a checkpoint is refused by name. */
  char other[512];
  snprintf(other, sizeof other, "%s/not-a-ckpt.safetensors", dir);
  ds_st_writer *w = ds_st_writer_new();
  int64_t one = 1;
  float x = 0;
  ds_st_writer_add(w, "x", DS_F32, 1, &one, &x);
  EXPECT_OK(ds_st_writer_write(w, other));
  ds_st_writer_free(w);
  EXPECT(ds_checkpoint_load(other, ds_backend_cpu(), &e, &opt2, &info2) == DS_ERR_FORMAT);
  EXPECT(strstr(ds_last_error(), "format") != NULL);
  free(cfg_json);
  ds_adamw_free(&opt);
  ds_draft_free(d);
}

int main(void) {
  TEST_RUN(test_anchors);
  TEST_RUN(test_adamw);
  TEST_RUN(test_checkpoint);
  return TEST_RESULT();
}
