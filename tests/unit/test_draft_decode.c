/* The draft at decoding time (ds_draft_state_*, ds_draft_block, ds_draft_head_step) computes
 * what the training forward computes for the same block: with the context rows of positions
 * < a appended, a block anchored at a and the head fed the teacher-forced previous tokens give
 * the training forward's logits and confidence logits, for every Markov head type, with
 * several anchors in one state (appending between blocks, cropping back). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/backend.h"
#include "dspark/draft.h"
#include "dspark/rng.h"
#include "support/tiny_draft.h"
#include "test_util.h"

enum { V = 41, DM = 16, T = 14, G = 4, M = 2 };

static ds_draft_config tiny_config(ds_markov_type type) { return tiny_draft_config(V, 2, G, type, 1); }

/* A draft of config c over a random embedding / lm_head *table (malloc'd, the caller frees it),
 * its trainable weights the init plus noise of the given size, so that the heads matter. */
static ds_draft *random_draft(const ds_draft_config *c, ds_rng *rng, uint64_t seed, float noise, float **table) {
  int64_t n = c->vocab_size * c->hidden_size;
  *table = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) (*table)[i] = 0.3f * (2.0f * ds_rng_uniform_f32(rng) - 1.0f);
  ds_draft *d = NULL;
  EXPECT_OK(ds_draft_new(c, (ds_weight){*table, DS_F32}, (ds_weight){*table, DS_F32}, seed, ds_backend_cpu(), &d));
  if (!d) return NULL;
  float *p = ds_draft_params(d);
  for (size_t i = 0; i < ds_draft_num_params(d); i++) p[i] += noise * (2.0f * ds_rng_uniform_f32(rng) - 1.0f);
  return d;
}

static void check_type(ds_markov_type type) {
  ds_rng rng;
  ds_rng_seed(&rng, 77 + (uint64_t)type);
  ds_draft_config c = tiny_config(type);
  float *table;
  ds_draft *d = random_draft(&c, &rng, 9, 0.2f, &table);
  if (!d) { free(table); return; }
  float ctx[T * M * DM];
  int32_t ids[T];
  for (int i = 0; i < T * M * DM; i++) ctx[i] = 2.0f * ds_rng_uniform_f32(&rng) - 1.0f;
  for (int i = 0; i < T; i++) ids[i] = (int32_t)(ds_rng_next_u64(&rng) % (V - 1));

  ds_draft_state *st = NULL;
  EXPECT_OK(ds_draft_state_new(d, T, &st));
  int64_t anchors[] = {3, 7, 5, 9}; /* grows, then crops back, then grows again */
  double worst = 0, worst_conf = 0;
  for (size_t ai = 0; st && ai < sizeof anchors / sizeof anchors[0]; ai++) {
    int64_t a = anchors[ai];
    /* training forward: one block anchored at a, every slot supervised */
    uint8_t keep = 1, eval[G];
    for (int k = 0; k < G; k++) eval[k] = 1;
    ds_draft_seq seq = {T, ctx, NULL, ids, 1, &a, &keep, eval, {NULL, DS_F32}};
    float want[G * V], want_conf[G];
    EXPECT_OK(ds_draft_forward_blocks(d, &seq, want, want_conf));
    /* decoding: context rows < a, the block, the head slot by slot */
    int64_t have = ds_draft_state_len(st);
    if (have > a) EXPECT_OK(ds_draft_state_crop(st, a));
    else EXPECT_OK(ds_draft_state_append(d, st, ctx + have * M * DM, a - have));
    EXPECT(ds_draft_state_len(st) == a);
    float h[G * DM], logits[G * V];
    EXPECT_OK(ds_draft_block(d, st, ids[a], h, logits));
    for (int k = 0; k < G; k++) {
      int32_t prev = ids[a + k]; /* teacher forcing: the anchor, then the true tokens */
      float conf;
      EXPECT_OK(ds_draft_head_step(d, st, h + k * DM, prev, logits + k * V, &conf));
      worst_conf = fmax(worst_conf, fabs((double)conf - want_conf[k]));
    }
    worst = fmax(worst, test_rel_err(logits, want, G * V));
  }
  fprintf(stderr, "  %s head: logits rel err %.2e, confidence abs err %.2e\n", ds_markov_type_name(type), worst,
          worst_conf);
  EXPECT(worst < 1e-5);
  EXPECT(worst_conf < 1e-5);
  /* refusals */
  EXPECT(ds_draft_block(d, st, V, NULL, NULL) == DS_ERR_RANGE);
  EXPECT(ds_draft_state_append(d, st, ctx, T) == DS_ERR_RANGE); /* past the capacity */
  EXPECT(ds_draft_state_crop(st, T + 1) == DS_ERR_ARG);
  ds_draft_state_free(st);
  ds_draft_free(d);
  free(table);
}

static void test_vanilla(void) { check_type(DS_MARKOV_VANILLA); }
static void test_gated(void) { check_type(DS_MARKOV_GATED); }
static void test_rnn(void) { check_type(DS_MARKOV_RNN); }
static void test_none(void) { check_type(DS_MARKOV_NONE); }

/* ds_draft_set_decode_weights: the decoder reads bf16 / Q8_0 copies (rows of whole blocks of 32
 * here, so every matrix has one) and gives the fp32 decoder's logits and confidences within their
 * rounding; back to f32 it is the fp32 decoder bit for bit; a training forward drops the copies. */
enum { V2 = 41, DM2 = 64, T2 = 10, G2 = 4 };

static void decode_block(ds_draft *d, const float *ctx, const int32_t *ids, int64_t a, float *logits, float *conf) {
  ds_draft_state *st = NULL;
  EXPECT_OK(ds_draft_state_new(d, T2, &st));
  if (!st) return;
  EXPECT_OK(ds_draft_state_append(d, st, ctx, a));
  float h[G2 * DM2];
  EXPECT_OK(ds_draft_block(d, st, ids[a], h, logits));
  for (int k = 0; k < G2; k++) EXPECT_OK(ds_draft_head_step(d, st, h + k * DM2, ids[a + k], logits + k * V2, conf + k));
  ds_draft_state_free(st);
}

static void test_decode_weights(void) {
  ds_draft_config c = tiny_config(DS_MARKOV_VANILLA);
  c.vocab_size = V2, c.hidden_size = DM2, c.intermediate_size = 96, c.head_dim = 16, c.rope_source.head_dim = 16;
  c.block_size = G2, c.markov_rank = 32, c.mask_token_id = V2 - 1;
  ds_rng rng;
  ds_rng_seed(&rng, 1234);
  float *table;
  ds_draft *d = random_draft(&c, &rng, 3, 0.1f, &table);
  if (!d) { free(table); return; }
  static float ctx[T2 * M * DM2];
  int32_t ids[T2];
  for (int i = 0; i < T2 * M * DM2; i++) ctx[i] = 2.0f * ds_rng_uniform_f32(&rng) - 1.0f;
  for (int i = 0; i < T2; i++) ids[i] = (int32_t)(ds_rng_next_u64(&rng) % (V2 - 1));
  int64_t a = 5;
  float ref[G2 * V2], ref_conf[G2], got[G2 * V2], got_conf[G2];
  EXPECT(ds_draft_decode_weights(d) == DS_F32);
  decode_block(d, ctx, ids, a, ref, ref_conf);
  const ds_dtype kinds[] = {DS_BF16, DS_Q8_0};
  const double tol[] = {2e-2, 5e-2};
  for (int i = 0; i < 2; i++) {
    EXPECT_OK(ds_draft_set_decode_weights(d, kinds[i]));
    EXPECT(ds_draft_decode_weights(d) == kinds[i]);
    size_t packed = ds_packed_weight_bytes(); /* the kernels' packed copies are made at load: */
    decode_block(d, ctx, ids, a, got, got_conf);
    EXPECT(ds_packed_weight_bytes() == packed); /* none on the first block */
    double err = test_rel_err(got, ref, G2 * V2), cerr = 0;
    for (int k = 0; k < G2; k++) cerr = fmax(cerr, fabs((double)got_conf[k] - ref_conf[k]));
    fprintf(stderr, "  %s decoding weights: logits rel err %.2e, confidence abs err %.2e\n",
            ds_draft_weights_name(kinds[i]), err, cerr);
    EXPECT(err > 0 && err < tol[i]); /* the copies are read (not 0) and close */
    EXPECT(cerr < 10 * tol[i]);
  }
  EXPECT_OK(ds_draft_set_decode_weights(d, DS_F32));
  decode_block(d, ctx, ids, a, got, got_conf);
  EXPECT(memcmp(got, ref, sizeof ref) == 0 && memcmp(got_conf, ref_conf, sizeof ref_conf) == 0);
  /* a training forward drops them: the next step changes the weights they copy */
  EXPECT_OK(ds_draft_set_decode_weights(d, DS_Q8_0));
  uint8_t keep = 1, eval[G2] = {1, 1, 1, 1};
  ds_draft_seq seq = {T2, ctx, NULL, ids, 1, &a, &keep, eval, {NULL, DS_F32}};
  EXPECT_OK(ds_draft_forward_train(d, &seq));
  EXPECT(ds_draft_decode_weights(d) == DS_F32);
  EXPECT(ds_draft_set_decode_weights(d, DS_F16) == DS_ERR_ARG);
  ds_dtype parsed = DS_F32;
  EXPECT(ds_draft_weights_parse("q8_0", &parsed) && parsed == DS_Q8_0 && !ds_draft_weights_parse("q4_0", &parsed));
  ds_draft_free(d);
  free(table);
}

int main(void) {
  ds_set_num_threads(2);
  TEST_RUN(test_vanilla);
  TEST_RUN(test_gated);
  TEST_RUN(test_rnn);
  TEST_RUN(test_none);
  TEST_RUN(test_decode_weights);
  return TEST_RESULT();
}
