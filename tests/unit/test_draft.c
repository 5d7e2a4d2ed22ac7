/* The draft's forward and backward as a whole: every trainable tensor's gradient against
 * central finite differences of a scalar function of the draft's outputs, for each Markov
 * head type, with and without the confidence head, with a dropped block. Also: export and
 * load give identical logits; the default layer choice; config refusals. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dspark/draft.h"
#include "dspark/dtype.h"
#include "dspark/rng.h"
#include "support/tiny_draft.h"
#include "model/draft_internal.h"
#include "test_util.h"

enum { V = 37, DM = 16, T = 12, NB = 3, G = 3 };

static ds_draft_config tiny_config(ds_markov_type type, int conf, int conf_markov) {
  ds_draft_config c = tiny_draft_config(V, 2, G, type, NB);
  c.enable_confidence_head = conf;
  c.confidence_head_with_markov = conf_markov;
  return c;
}

typedef struct {
  float ctx[T * 2 * DM];
  int32_t ids[T];
  int64_t anchors[NB];
  uint8_t keep[NB];
  uint8_t eval[NB * G];
  float G_logits[NB * G * V]; /* weights of the scalar objective */
  float G_conf[NB * G];
} fixture;

static void make_fixture(fixture *f, ds_rng *rng) {
  for (int i = 0; i < T * 2 * DM; i++) f->ctx[i] = 2.0f * ds_rng_uniform_f32(rng) - 1.0f;
  for (int i = 0; i < T; i++) f->ids[i] = (int32_t)(ds_rng_next_u64(rng) % (V - 1));
  int64_t a[NB] = {2, 7, 0};
  uint8_t k[NB] = {1, 1, 0}; /* the third block is dropped */
  memcpy(f->anchors, a, sizeof a);
  memcpy(f->keep, k, sizeof k);
  memset(f->eval, 1, sizeof f->eval);
  for (int i = 0; i < NB * G * V; i++) f->G_logits[i] = 2.0f * ds_rng_uniform_f32(rng) - 1.0f;
  for (int i = 0; i < NB * G; i++) f->G_conf[i] = 2.0f * ds_rng_uniform_f32(rng) - 1.0f;
}

static ds_draft_seq seq_of(fixture *f) {
  ds_draft_seq s = {T, f->ctx, NULL, f->ids, NB, f->anchors, f->keep, f->eval, {NULL, DS_F32}};
  return s;
}

/* L = sum G_logits * logits + sum G_conf * conf, in double. */
static double objective(ds_draft *d, fixture *f) {
  static float logits[NB * G * V], conf[NB * G];
  ds_draft_seq s = seq_of(f);
  if (ds_draft_forward_blocks(d, &s, logits, conf) != DS_OK) abort();
  double L = 0;
  for (int i = 0; i < NB * G * V; i++) L += (double)f->G_logits[i] * logits[i];
  if (d->cfg.enable_confidence_head)
    for (int i = 0; i < NB * G; i++) L += (double)f->G_conf[i] * conf[i];
  return L;
}
static double objective_of(ds_draft *d, void *f) { return objective(d, f); }

/* Analytic gradient of the objective through the internal backward. */
static void analytic(ds_draft *d, fixture *f) {
  ds_draft_seq s = seq_of(f);
  int64_t R = NB * G, r = d->cfg.markov_rank;
  ds_draft_zero_grads(d);
  EXPECT_OK(draft_forward(d, &s));
  float *dh = calloc((size_t)(R * DM), sizeof(float)), *dz = calloc((size_t)(R * (r ? r : 1)), sizeof(float));
  /* logits = h @ lm_head^T + z @ W2^T */
  ds_draft_rows_logits_backward(d, 0, R, f->G_logits, dh, r ? dz : NULL);
  markov_head_backward(d, R, r ? dz : NULL, f->G_conf, dh);
  EXPECT_OK(draft_backward(d, &s, dh));
  free(dh);
  free(dz);
}

/* Random [V, DM] tables in dtype (F32, BF16 or F16). */
static void *rand_table(ds_rng *rng, ds_dtype dt) {
  void *p = malloc(sizeof(float) * V * DM);
  for (int i = 0; i < V * DM; i++) {
    float x = 2.0f * ds_rng_uniform_f32(rng) - 1.0f;
    if (dt == DS_F32) ((float *)p)[i] = x;
    else ((uint16_t *)p)[i] = dt == DS_BF16 ? ds_f32_to_bf16(x) : ds_f32_to_f16(x);
  }
  return p;
}

/* Every trainable gradient against finite differences, with the frozen tables in dtype (the
 * backward through a 16-bit lm_head is linear_w_backward). */
static void check_grads(ds_markov_type type, int conf, int conf_markov, ds_dtype table_dtype) {
  ds_draft_config c = tiny_config(type, conf, conf_markov);
  ds_rng rng;
  ds_rng_seed(&rng, 11 + (uint64_t)type);
  void *table = rand_table(&rng, table_dtype), *head = rand_table(&rng, table_dtype);
  ds_draft *d;
  EXPECT_OK(ds_draft_new(&c, (ds_weight){table, table_dtype}, (ds_weight){head, table_dtype}, 5, ds_backend_cpu(), &d));
  /* Larger random weights than the init so every path carries signal. */
  for (size_t i = 0; i < d->n_params; i++) d->params[i] += 0.3f * (2.0f * ds_rng_uniform_f32(&rng) - 1.0f);
  fixture f;
  make_fixture(&f, &rng);
  analytic(d, &f);
  float *grad = malloc(d->n_params * sizeof(float));
  memcpy(grad, d->grads, d->n_params * sizeof(float));
  char label[64];
  snprintf(label, sizeof label, "%s head, conf %d/%d", ds_markov_type_name(type), conf, conf_markov);
  EXPECT(tiny_draft_fd_check(d, grad, objective_of, &f, &rng, label) == 0);
  /* The dropped block contributes nothing: its rows of the gradient path are zero. */
  free(grad);
  free(table);
  free(head);
  ds_draft_free(d);
}

static void test_grads_all_heads(void) {
  check_grads(DS_MARKOV_NONE, 1, 0, DS_F32);
  check_grads(DS_MARKOV_VANILLA, 1, 1, DS_F32);
  check_grads(DS_MARKOV_GATED, 1, 1, DS_F32);
  check_grads(DS_MARKOV_RNN, 1, 1, DS_F32);
  check_grads(DS_MARKOV_VANILLA, 0, 0, DS_F32);
  check_grads(DS_MARKOV_RNN, 1, 0, DS_F32);
}

/* The same with the frozen tables of a bf16 / f16 target. */
static void test_grads_16bit_tables(void) {
  check_grads(DS_MARKOV_VANILLA, 1, 1, DS_BF16);
  check_grads(DS_MARKOV_NONE, 1, 0, DS_F16);
}

/* A draft with BF16 tables computes what a draft with those tables converted to F32 computes
 * (same seed: same trainable weights), to fp32 summation order. */
static void test_bf16_tables_match_f32(void) {
  ds_draft_config c = tiny_config(DS_MARKOV_VANILLA, 1, 1);
  ds_rng rng;
  ds_rng_seed(&rng, 21);
  uint16_t *t16 = rand_table(&rng, DS_BF16), *h16 = rand_table(&rng, DS_BF16);
  float t32[V * DM], h32[V * DM];
  for (int i = 0; i < V * DM; i++) t32[i] = ds_bf16_to_f32(t16[i]), h32[i] = ds_bf16_to_f32(h16[i]);
  ds_draft *a, *b;
  EXPECT_OK(ds_draft_new(&c, (ds_weight){t16, DS_BF16}, (ds_weight){h16, DS_BF16}, 4, ds_backend_cpu(), &a));
  EXPECT_OK(ds_draft_new(&c, (ds_weight){t32, DS_F32}, (ds_weight){h32, DS_F32}, 4, ds_backend_cpu(), &b));
  EXPECT(a->n_params == b->n_params && !memcmp(a->params, b->params, a->n_params * sizeof(float)));
  EXPECT(ds_draft_lm_head(a).dtype == DS_BF16 && ds_draft_embed(b).dtype == DS_F32);
  fixture f;
  make_fixture(&f, &rng);
  static float l1[NB * G * V], l2[NB * G * V], c1[NB * G], c2[NB * G];
  ds_draft_seq s = seq_of(&f);
  EXPECT_OK(ds_draft_forward_blocks(a, &s, l1, c1));
  EXPECT_OK(ds_draft_forward_blocks(b, &s, l2, c2));
  EXPECT(test_rel_err(l1, l2, NB * G * V) < 1e-5 && test_rel_err(c1, c2, NB * G) < 1e-5);
  ds_draft_free(a);
  ds_draft_free(b);
  free(t16);
  free(h16);
}

static void test_dropped_block_finite(void) {
  ds_draft_config c = tiny_config(DS_MARKOV_GATED, 1, 1);
  ds_rng rng;
  ds_rng_seed(&rng, 3);
  float *table = calloc(V * DM, sizeof(float));
  for (int i = 0; i < V * DM; i++) table[i] = ds_rng_uniform_f32(&rng);
  ds_draft *d;
  EXPECT_OK(ds_draft_new(&c, (ds_weight){table, DS_F32}, (ds_weight){table, DS_F32}, 1, ds_backend_cpu(), &d));
  fixture f;
  make_fixture(&f, &rng);
  static float logits[NB * G * V], conf[NB * G];
  ds_draft_seq s = seq_of(&f);
  EXPECT_OK(ds_draft_forward_blocks(d, &s, logits, conf));
  int finite = 1;
  for (int i = 0; i < NB * G * V; i++) finite &= isfinite(logits[i]);
  for (int i = 0; i < NB * G; i++) finite &= isfinite(conf[i]);
  EXPECT(finite);
  ds_draft_free(d);
  free(table);
}

/* Export then load: the same logits, bit for bit; 16-bit tables are written and read back in
 * their dtype (the export holds them, as a checkpoint does). */
static void export_roundtrip(ds_dtype table_dtype) {
  ds_draft_config c = tiny_config(DS_MARKOV_RNN, 1, 1);
  ds_rng rng;
  ds_rng_seed(&rng, 9);
  void *table = rand_table(&rng, table_dtype);
  ds_draft *d, *e;
  EXPECT_OK(ds_draft_new(&c, (ds_weight){table, table_dtype}, (ds_weight){table, table_dtype}, 2, ds_backend_cpu(), &d));
  const char *dir = getenv("DSPARK_TEST_TMP") ? getenv("DSPARK_TEST_TMP") : "/tmp";
  char out[512];
  mkdir(dir, 0755);
  snprintf(out, sizeof out, "%s/draft-export", dir);
  const char *target_cfg =
      "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"vocab_size\": 37, \"hidden_size\": 16, "
      "\"intermediate_size\": 24, \"num_hidden_layers\": 6, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
      "\"head_dim\": 8, \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0}";
  EXPECT_OK(ds_draft_export_hf(d, target_cfg, out));
  EXPECT_OK(ds_draft_load_hf(out, ds_backend_cpu(), &e));
  if (e) {
    fixture f;
    make_fixture(&f, &rng);
    static float l1[NB * G * V], l2[NB * G * V], c1[NB * G], c2[NB * G];
    ds_draft_seq s = seq_of(&f);
    EXPECT_OK(ds_draft_forward_blocks(d, &s, l1, c1));
    EXPECT_OK(ds_draft_forward_blocks(e, &s, l2, c2));
    EXPECT(!memcmp(l1, l2, sizeof l1) && !memcmp(c1, c2, sizeof c1));
    EXPECT(e->cfg.markov_type == DS_MARKOV_RNN && e->cfg.markov_rank == 5 && e->cfg.block_size == G);
    EXPECT(ds_draft_embed(e).dtype == table_dtype && ds_draft_lm_head(e).dtype == table_dtype);
    /* the export is the same draft; one changed weight or another block size is another */
    uint64_t id = ds_draft_identity(d);
    EXPECT(ds_draft_identity(e) == id);
    float *w = &ds_draft_params(e)[ds_draft_num_params(e) / 2], kept = *w;
    *w += 1e-3f;
    EXPECT(ds_draft_identity(e) != id);
    *w = kept;
    EXPECT(ds_draft_identity(e) == id);
    e->cfg.block_size++;
    EXPECT(ds_draft_identity(e) != id);
    ds_draft_free(e);
  }
  ds_draft_free(d);
  free(table);
}

static void test_export_roundtrip(void) {
  export_roundtrip(DS_F32);
  export_roundtrip(DS_BF16);
  export_roundtrip(DS_F16);
}

static void test_config_rules(void) {
  ds_model_config t;
  memset(&t, 0, sizeof t);
  t.num_hidden_layers = 36;
  t.vocab_size = 100;
  t.hidden_size = 8;
  t.intermediate_size = 8;
  t.num_attention_heads = 2;
  t.num_key_value_heads = 1;
  t.head_dim = 4;
  ds_draft_config c;
  EXPECT_OK(ds_draft_config_default(&t, 5, 5, &c));
  int32_t want[5] = {1, 9, 17, 25, 33}; /* DeepSpec's choice for a 36-layer Qwen3 */
  EXPECT(c.n_target_layers == 5 && !memcmp(c.target_layer_ids, want, sizeof want));
  c.mask_token_id = 3;
  EXPECT_OK(ds_draft_config_check(&c));
  ds_markov_type mt;
  EXPECT(ds_markov_type_parse("lstm", &mt) == DS_ERR_ARG);
  ds_draft_config bad = c;
  bad.markov_rank = -1;
  EXPECT(ds_draft_config_check(&bad) == DS_ERR_ARG);
  bad = c;
  bad.mask_token_id = -1;
  EXPECT(ds_draft_config_check(&bad) == DS_ERR_ARG);
  bad = c;
  bad.target_layer_ids[4] = 35; /* the last layer is not allowed */
  EXPECT(ds_draft_config_check(&bad) == DS_ERR_ARG);
}

/* A draft config as DeepSpec writes it: fields that do not apply may be absent, the head type in
 * any case; they load with DeepSpec's meaning (and a missing field that does apply is refused). */
static void deepspec_case(const char *tail, ds_status want, ds_markov_type type, int rank, int conf_markov) {
  char json[1400];
  snprintf(json, sizeof json,
           "{\"architectures\": [\"Qwen3DSparkModel\"], \"model_type\": \"qwen3\", \"vocab_size\": 64, "
           "\"hidden_size\": 8, \"intermediate_size\": 16, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
           "\"num_key_value_heads\": 1, \"head_dim\": 4, \"max_position_embeddings\": 128, \"rms_norm_eps\": 1e-6, "
           "\"rope_theta\": 10000, \"num_target_layers\": 6, \"block_size\": 4, \"mask_token_id\": 3, "
           "\"target_layer_ids\": [1, 4], \"num_anchors\": 8, %s}",
           tail);
  ds_draft_config c;
  ds_status st = ds_draft_config_from_json(json, strlen(json), "config.json", &c);
  EXPECT(st == want);
  if (st != DS_OK || want != DS_OK) return;
  EXPECT(c.markov_type == type && c.markov_rank == rank && c.confidence_head_with_markov == conf_markov);
}

static void test_deepspec_configs(void) {
  deepspec_case("\"enable_confidence_head\": false, \"markov_rank\": 16, \"markov_head_type\": \"Vanilla\"", DS_OK,
                DS_MARKOV_VANILLA, 16, 0);
  deepspec_case("\"enable_confidence_head\": true, \"confidence_head_with_markov\": true, \"markov_rank\": 16, "
                "\"markov_head_type\": \"GATED\"", DS_OK, DS_MARKOV_GATED, 16, 1);
  deepspec_case("\"enable_confidence_head\": true, \"confidence_head_with_markov\": false, \"markov_rank\": 0",
                DS_OK, DS_MARKOV_NONE, 0, 0);
  /* rank 0 disables the head whatever type is named */
  deepspec_case("\"enable_confidence_head\": false, \"markov_rank\": 0, \"markov_head_type\": \"vanilla\"", DS_OK,
                DS_MARKOV_NONE, 0, 0);
  /* what applies must be there */
  deepspec_case("\"enable_confidence_head\": true, \"markov_rank\": 16, \"markov_head_type\": \"rnn\"",
                DS_ERR_FORMAT, DS_MARKOV_RNN, 16, 0);
  deepspec_case("\"enable_confidence_head\": false, \"markov_rank\": 16", DS_ERR_FORMAT, DS_MARKOV_NONE, 0, 0);
  deepspec_case("\"enable_confidence_head\": false, \"markov_rank\": 16, \"markov_head_type\": \"lstm\"", DS_ERR_ARG,
                DS_MARKOV_NONE, 0, 0);
}

int main(void) {
  TEST_RUN(test_deepspec_configs);
  TEST_RUN(test_grads_all_heads);
  TEST_RUN(test_grads_16bit_tables);
  TEST_RUN(test_bf16_tables_match_f32);
  TEST_RUN(test_dropped_block_finite);
  TEST_RUN(test_export_roundtrip);
  TEST_RUN(test_config_rules);
  return TEST_RESULT();
}
