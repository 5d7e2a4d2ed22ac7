/* The trainable student (include/dspark/student.h) as a whole:
 *   - every tensor's gradient against central finite differences of a scalar function of the
 *     student's outputs (logits of every row, plus an intermediate hidden state through the
 *     extra-gradient hook), for each family: Qwen3 (q/k norms, GQA, untied), Qwen2 (q/k/v biases,
 *     tied: one table with both gradients), Llama (attention_bias + mlp_bias, llama3 rope, MHA);
 *   - the cpu backend against the reference backend, bitwise determinism, accumulation;
 *   - packing: two sequences in one batch equal each run alone, padding ids never read;
 *   - export: ds_target_load reads the export and gives our logits; ds_student_load_hf reads
 *     it back bit for bit; tying as transformers decides it; fresh initialization statistics;
 *   - pad_token_id: no lookup gradient on its row; refusals naming what is wrong.
 * The comparison with transformers / PyTorch autograd is tests/conformance/test_student_torch.py. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dspark/rng.h"
#include "dspark/safetensors.h"
#include "dspark/student.h"
#include "dspark/target.h"
#include "test_util.h"

enum { V = 37, S = 6, B = 2 };

static const char *k_qwen3 =
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"vocab_size\": 37, \"hidden_size\": 16, \"intermediate_size\": 24,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 6,"
    " \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": false,"
    " \"initializer_range\": 0.3}";
static const char *k_qwen2 =
    "{\"architectures\": [\"Qwen2ForCausalLM\"], \"vocab_size\": 37, \"hidden_size\": 16, \"intermediate_size\": 20,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 1,"
    " \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-5, \"tie_word_embeddings\": true,"
    " \"rope_theta\": 1000.0, \"initializer_range\": 0.3}";
static const char *k_llama =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 37, \"hidden_size\": 16, \"intermediate_size\": 24,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 2, \"num_key_value_heads\": 2,"
    " \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-6, \"attention_bias\": true, \"mlp_bias\": true,"
    " \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0,"
    " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8}, \"initializer_range\": 0.3,"
    " \"pad_token_id\": 36}";

static const char *tmp_dir(void) {
  const char *t = getenv("DSPARK_TEST_TMP");
  return t ? t : "/tmp";
}

static ds_student *make(const char *json, uint64_t seed, const ds_backend *be) {
  ds_student *s = NULL;
  EXPECT_OK(ds_student_new(json, strlen(json), "test config", seed, be, &s));
  if (!s) abort();
  /* non-trivial norms and biases: a kernel that ignores one cannot pass */
  ds_rng rng;
  ds_rng_seed(&rng, seed + 99);
  for (size_t i = 0; i < ds_student_tensor_count(s); i++) {
    const ds_student_tensor *t = ds_student_tensor_at(s, i);
    size_t n = (size_t)t->shape[0] * (size_t)(t->ndim == 2 ? t->shape[1] : 1);
    if (t->ndim == 1)
      for (size_t k = 0; k < n; k++) t->data[k] += 0.3f * (2.0f * ds_rng_uniform_f32(&rng) - 1.0f);
  }
  return s;
}

typedef struct {
  int32_t ids[B * S];
  int64_t lengths[B];
  float *G;      /* (rows, V) weights of the logits in the objective */
  float *Gh;     /* (rows, d) weights of the intermediate hidden state */
  int64_t layer; /* its layer */
} fixture;

static void make_fixture(fixture *f, ds_rng *rng, int64_t d, int64_t avoid) {
  f->lengths[0] = 6, f->lengths[1] = 4;
  for (int i = 0; i < B * S; i++) {
    int32_t id;
    do id = (int32_t)(ds_rng_next_u64(rng) % V);
    while (id == avoid);
    f->ids[i] = id;
  }
  f->ids[1 * S + 4] = -7, f->ids[1 * S + 5] = 1000; /* past sequence 1's length: never read */
  int64_t rows = f->lengths[0] + f->lengths[1];
  f->G = malloc((size_t)(rows * V) * sizeof(float));
  f->Gh = malloc((size_t)(rows * d) * sizeof(float));
  for (int64_t i = 0; i < rows * V; i++) f->G[i] = 2.0f * ds_rng_uniform_f32(rng) - 1.0f;
  for (int64_t i = 0; i < rows * d; i++) f->Gh[i] = 2.0f * ds_rng_uniform_f32(rng) - 1.0f;
  f->layer = 0;
}

static ds_student_batch batch_of(fixture *f) {
  ds_student_batch b = {f->ids, B, S, f->lengths};
  return b;
}

/* L = sum G * logits + sum Gh * hidden(layer), in double. */
static double objective(ds_student *s, fixture *f) {
  ds_student_batch b = batch_of(f);
  if (ds_student_forward(s, &b) != DS_OK) abort();
  int64_t rows = ds_student_rows(s), d = ds_student_config(s)->hidden_size;
  float *logits = malloc((size_t)(rows * V) * sizeof(float));
  ds_student_rows_logits(s, 0, rows, logits);
  double L = 0;
  for (int64_t i = 0; i < rows * V; i++) L += (double)f->G[i] * logits[i];
  const float *h = ds_student_hidden(s, f->layer);
  for (int64_t i = 0; i < rows * d; i++) L += (double)f->Gh[i] * h[i];
  free(logits);
  return L;
}

/* The analytic gradient of the objective, through the hooks in two row chunks. */
static void analytic(ds_student *s, fixture *f) {
  ds_student_batch b = batch_of(f);
  ds_student_zero_grads(s);
  EXPECT_OK(ds_student_forward(s, &b));
  int64_t rows = ds_student_rows(s), d = ds_student_config(s)->hidden_size, half = rows / 2;
  float *dh = calloc((size_t)(rows * d), sizeof(float));
  ds_student_rows_logits_backward(s, 0, half, f->G, dh);
  ds_student_rows_logits_backward(s, half, rows - half, f->G + half * V, dh + half * d);
  ds_student_hidden_grad extra = {f->layer, f->Gh};
  EXPECT_OK(ds_student_backward(s, dh, &extra, 1));
  free(dh);
}

static size_t numel(const ds_student_tensor *t) { return (size_t)t->shape[0] * (size_t)(t->ndim == 2 ? t->shape[1] : 1); }

/* The model is fp32, so the step is a compromise: at h = 1e-2 the central difference's
 * truncation error (O(h^2): measured 9x smaller from h = 3e-2 to 1e-2) dominates the
 * rounding noise (which takes over below h = 3e-3). Richardson extrapolation of the central
 * differences at h and 2h cancels the h^2 term: (4 D(h) - D(2h)) / 3, leaving the noise
 * (measured worst error / max |grad| per tensor: 6e-5 Qwen3, 1e-4 Qwen2, 4.1e-4 Llama). */
#define FD_H 1e-2f
#define FD_TOL 1e-3

static double central(ds_student *s, fixture *f, float *x, float h) {
  float keep = *x;
  *x = keep + h;
  double lp = objective(s, f);
  *x = keep - h;
  double lm = objective(s, f);
  *x = keep;
  return (lp - lm) / (2.0 * (double)h);
}

static double richardson_fd(ds_student *s, fixture *f, float *x, float h) {
  return (4.0 * central(s, f, x, h) - central(s, f, x, 2.0f * h)) / 3.0;
}

static void check_fd(const char *json, const char *label, int64_t layer) {
  ds_rng rng;
  ds_rng_seed(&rng, 7);
  ds_student *s = make(json, 3, ds_backend_reference()); /* double accumulation: a cleaner FD */
  fixture f;
  make_fixture(&f, &rng, ds_student_config(s)->hidden_size, ds_student_pad_token_id(s));
  f.layer = layer;
  analytic(s, &f);
  float *grad = malloc(ds_student_num_params(s) * sizeof(float)), *p = ds_student_params(s);
  memcpy(grad, ds_student_grads(s), ds_student_num_params(s) * sizeof(float));
  int bad = 0;
  double worst = 0;
  for (size_t ti = 0; ti < ds_student_tensor_count(s); ti++) {
    const ds_student_tensor *t = ds_student_tensor_at(s, ti);
    size_t n = numel(t), off = (size_t)(t->data - p);
    double max_err = 0, max_g = 1e-3;
    for (size_t k = 0; k < n; k++) max_g = fmax(max_g, fabs(grad[off + k]));
    int probes = n < 24 ? (int)n : 24;
    for (int probe = 0; probe < probes; probe++) {
      size_t i = off + (n < 24 ? (size_t)probe : (size_t)(ds_rng_next_u64(&rng) % n));
      double fd = richardson_fd(s, &f, p + i, FD_H);
      max_err = fmax(max_err, fabs(fd - grad[i]));
    }
    worst = fmax(worst, max_err / max_g);
    if (max_err > FD_TOL * max_g) {
      fprintf(stderr, "  %s %s: FD error %.3g vs max grad %.3g\n", label, t->name, max_err, max_g);
      bad++;
    }
  }
  if (getenv("DSPARK_TEST_VERBOSE")) fprintf(stderr, "  %s: worst FD error / max grad %.3g\n", label, worst);
  EXPECT(bad == 0);
  free(grad);
  free(f.G);
  free(f.Gh);
  ds_student_free(s);
}

static void test_fd(void) {
  check_fd(k_qwen3, "qwen3 untied qk-norm gqa", 0);
  check_fd(k_qwen2, "qwen2 tied bias mqa", 1); /* the last layer's pre-norm output */
  check_fd(k_llama, "llama attn+mlp bias llama3-rope", -1);
}

/* cpu vs reference (1e-4 normwise: fp32 sums in different orders through two layers),
 * bitwise determinism of the cpu backend, and accumulation (a second backward doubles). */
static void test_backends(void) {
  const char *cfgs[3] = {k_qwen3, k_qwen2, k_llama};
  for (int c = 0; c < 3; c++) {
    ds_rng rng;
    ds_rng_seed(&rng, 11);
    ds_student *a = make(cfgs[c], 5, ds_backend_cpu()), *r = make(cfgs[c], 5, ds_backend_reference());
    fixture f;
    make_fixture(&f, &rng, ds_student_config(a)->hidden_size, -1);
    analytic(a, &f);
    analytic(r, &f);
    size_t n = ds_student_num_params(a);
    int64_t rows = ds_student_rows(a), d = ds_student_config(a)->hidden_size;
    double eh = test_rel_err(ds_student_final_hidden(a), ds_student_final_hidden(r), (size_t)(rows * d));
    double eg = test_rel_err(ds_student_grads(a), ds_student_grads(r), n);
    EXPECT(eh < 1e-5);
    EXPECT(eg < 1e-4);
    if (getenv("DSPARK_TEST_VERBOSE")) fprintf(stderr, "  cpu vs ref: h %.3g grads %.3g\n", eh, eg);
    float *g1 = malloc(n * sizeof(float));
    memcpy(g1, ds_student_grads(a), n * sizeof(float));
    analytic(a, &f);
    EXPECT(memcmp(g1, ds_student_grads(a), n * sizeof(float)) == 0);
    /* a second backward of the same forward adds the same gradient again */
    float *dh = calloc((size_t)(rows * d), sizeof(float));
    ds_student_rows_logits_backward(a, 0, rows, f.G, dh);
    ds_student_hidden_grad extra = {f.layer, f.Gh};
    EXPECT_OK(ds_student_backward(a, dh, &extra, 1));
    float *want = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) want[i] = 2.0f * g1[i];
    EXPECT(test_rel_err(ds_student_grads(a), want, n) < 1e-5);
    free(dh); free(want); free(g1); free(f.G); free(f.Gh);
    ds_student_free(a);
    ds_student_free(r);
  }
}

/* Two sequences packed in one batch give each sequence's rows as a batch of its own would;
 * lengths NULL means every sequence is seq_len long. */
static void test_packing(void) {
  ds_student *s = make(k_qwen3, 2, ds_backend_cpu());
  int64_t d = ds_student_config(s)->hidden_size;
  int32_t ids[2 * S] = {3, 9, 1, 4, 4, 30, 7, 2, 8, 0, -1, -1};
  int64_t lens[2] = {6, 4};
  ds_student_batch both = {ids, 2, S, lens};
  EXPECT_OK(ds_student_forward(s, &both));
  EXPECT(ds_student_rows(s) == 10 && ds_student_seq_offsets(s)[1] == 6 && ds_student_seq_offsets(s)[2] == 10);
  float *h = malloc(10 * (size_t)d * sizeof(float));
  memcpy(h, ds_student_final_hidden(s), 10 * (size_t)d * sizeof(float));
  ds_student_batch first = {ids, 1, S, NULL}, second = {ids + S, 1, 4, NULL};
  EXPECT_OK(ds_student_forward(s, &first));
  EXPECT(test_rel_err(h, ds_student_final_hidden(s), 6 * (size_t)d) < 1e-5);
  EXPECT_OK(ds_student_forward(s, &second));
  EXPECT(test_rel_err(h + 6 * d, ds_student_final_hidden(s), 4 * (size_t)d) < 1e-5);
  free(h);
  ds_student_free(s);
}

/* A target's forward over a batch gives each sequence the numbers it gets alone, bit for bit,
 * also where the batch passes the 512 rows of one pass: a sequence is cut only at multiples of
 * 512 of its own rows (a cut placed by the other sequences changed its rows after it). An fp32
 * and an f16 cache; a 600-row sequence after a 100-row one and among single decode rows. */
static void test_target_batch_invariance(void) {
  static const char *cfg =
      "{\"architectures\": [\"Qwen3ForCausalLM\"], \"vocab_size\": 37, \"hidden_size\": 16, \"intermediate_size\": 24,"
      " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 6,"
      " \"max_position_embeddings\": 2048, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": false,"
      " \"initializer_range\": 0.3}";
  char dir[512];
  snprintf(dir, sizeof dir, "%s/test_student_batch_invariance", tmp_dir());
  ds_student *st = make(cfg, 11, ds_backend_cpu());
  EXPECT_OK(ds_student_export_hf(st, dir));
  ds_student_free(st);
  ds_target *t = NULL;
  EXPECT_OK(ds_target_load(dir, ds_backend_cpu(), &t));
  if (!t) return;
  enum { NA = 600, NB = 100 };
  int32_t a[NA], b[NB], one = 5;
  for (int i = 0; i < NA; i++) a[i] = (int32_t)((i * 7 + 3) % V);
  for (int i = 0; i < NB; i++) b[i] = (int32_t)((i * 11 + 1) % V);
  float *alone = malloc((size_t)NA * V * sizeof(float)), *batch = malloc((size_t)(NA + NB + 1) * V * sizeof(float));
  const ds_dtype types[2] = {DS_F32, DS_F16};
  for (int ti = 0; ti < 2 && alone && batch; ti++) {
    ds_kv_cache *ka = NULL, *kb = NULL, *ka2 = NULL, *kc = NULL;
    EXPECT_OK(ds_kv_cache_new_typed(t, NA + 2, types[ti], &ka));
    EXPECT_OK(ds_kv_cache_new_typed(t, NB + 2, types[ti], &kb));
    EXPECT_OK(ds_kv_cache_new_typed(t, NA + 2, types[ti], &ka2));
    EXPECT_OK(ds_kv_cache_new_typed(t, NB + 2, types[ti], &kc));
    if (!ka || !kb || !ka2 || !kc) abort();
    ds_target_seq alone_seq = {a, NA, ka};
    ds_target_outputs out = {0};
    out.logits = alone;
    EXPECT_OK(ds_target_forward(t, &alone_seq, 1, &out));
    /* c has its prompt in its cache already: in the batch it is one decode row */
    ds_target_seq c_prompt = {b, NB, kc};
    out.logits = batch;
    EXPECT_OK(ds_target_forward(t, &c_prompt, 1, &out));
    ds_target_seq seqs[3] = {{&one, 1, kc}, {b, NB, kb}, {a, NA, ka2}};
    EXPECT_OK(ds_target_forward(t, seqs, 3, &out));
    EXPECT(memcmp(alone, batch + (size_t)(1 + NB) * V, (size_t)NA * V * sizeof(float)) == 0);
    ds_kv_cache_free(ka), ds_kv_cache_free(kb), ds_kv_cache_free(ka2), ds_kv_cache_free(kc);
  }
  free(alone);
  free(batch);
  ds_target_free(t);
}

/* Export: the target loader reads it and gives our logits; the student loader reads it back
 * bit for bit; the exported config says what the student is. */
static void test_export(void) {
  const char *cfgs[3] = {k_qwen3, k_qwen2, k_llama};
  for (int c = 0; c < 3; c++) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/test_student_export_%d", tmp_dir(), c);
    ds_student *s = make(cfgs[c], 8, ds_backend_cpu());
    EXPECT_OK(ds_student_export_hf(s, dir));
    int32_t ids[7] = {5, 1, 36, 0, 12, 12, 3};
    ds_student_batch b = {ids, 1, 7, NULL};
    EXPECT_OK(ds_student_forward(s, &b));
    float ours[7 * V], theirs[7 * V];
    ds_student_rows_logits(s, 0, 7, ours);
    ds_target *t = NULL;
    EXPECT_OK(ds_target_load(dir, ds_backend_cpu(), &t));
    if (t) {
      ds_kv_cache *kv = NULL;
      EXPECT_OK(ds_kv_cache_new(t, 16, &kv));
      ds_target_seq seq = {ids, 7, kv};
      ds_target_outputs out = {0};
      out.logits = theirs;
      EXPECT_OK(ds_target_forward(t, &seq, 1, &out));
      EXPECT(test_rel_err(ours, theirs, 7 * V) < 1e-5);
      EXPECT(ds_target_head_is_embedding(t) == ds_student_is_tied(s));
      ds_kv_cache_free(kv);
      /* an fp32 model's default cache is fp32; one asked for in f16 gives nearly the same
       * logits; a cache in another type is refused naming it */
      EXPECT(ds_kv_cache_dtype(t) == DS_F32);
      float half[7 * V];
      kv = NULL;
      EXPECT_OK(ds_kv_cache_new_typed(t, 16, DS_F16, &kv));
      seq.cache = kv, out.logits = half;
      if (kv) EXPECT_OK(ds_target_forward(t, &seq, 1, &out));
      double e16 = test_rel_err(half, theirs, 7 * V);
      EXPECT(e16 > 0 && e16 < 1e-2);
      ds_kv_cache_free(kv);
      EXPECT(ds_kv_cache_new_typed(t, 16, DS_BF16, &kv) == DS_ERR_ARG && strstr(ds_last_error(), "BF16"));
      ds_target_free(t);
    }
    ds_student *r = NULL;
    EXPECT_OK(ds_student_load_hf(dir, ds_backend_cpu(), &r));
    if (r) {
      EXPECT(ds_student_num_params(r) == ds_student_num_params(s) && ds_student_is_tied(r) == ds_student_is_tied(s));
      EXPECT(memcmp(ds_student_params(r), ds_student_params(s), ds_student_num_params(s) * sizeof(float)) == 0);
      EXPECT(ds_student_pad_token_id(r) == ds_student_pad_token_id(s));
      ds_student_free(r);
    }
    ds_student_free(s);
  }
}

/* tie_word_embeddings with both tables stored: tied when equal, untied (and exported with
 * tie_word_embeddings false) when not; only lm_head.weight stored: the embedding is it. */
static void test_tying(void) {
  ds_student *s = make(k_qwen2, 4, ds_backend_cpu()); /* tied */
  const ds_model_config *c = ds_student_config(s);
  int64_t shape[2] = {c->vocab_size, c->hidden_size};
  const ds_student_tensor *emb = ds_student_tensor_at(s, 0);
  float *other = malloc((size_t)(V * c->hidden_size) * sizeof(float));
  for (int variant = 0; variant < 3; variant++) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/test_student_tying_%d", tmp_dir(), variant);
    EXPECT_OK(ds_student_export_hf(s, dir));
    /* rewrite model.safetensors: 0 both equal, 1 both different, 2 only lm_head */
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    memcpy(other, emb->data, (size_t)(V * c->hidden_size) * sizeof(float));
    if (variant == 1) other[5] += 1.0f;
    ds_st_writer *w = ds_st_writer_new();
    for (size_t i = 0; i < ds_student_tensor_count(s); i++) {
      const ds_student_tensor *t = ds_student_tensor_at(s, i);
      if (variant == 2 && i == 0) continue;
      EXPECT_OK(ds_st_writer_add(w, t->name, DS_F32, t->ndim, t->shape, t->data));
    }
    EXPECT_OK(ds_st_writer_add(w, "lm_head.weight", DS_F32, 2, shape, other));
    EXPECT_OK(ds_st_writer_write(w, path));
    ds_st_writer_free(w);
    ds_student *r = NULL;
    EXPECT_OK(ds_student_load_hf(dir, ds_backend_cpu(), &r));
    if (!r) continue;
    EXPECT(ds_student_is_tied(r) == (variant != 1));
    if (variant == 1) {
      char *json = NULL;
      EXPECT_OK(ds_student_config_json(r, &json));
      EXPECT(json && strstr(json, "\"tie_word_embeddings\":\tfalse"));
      free(json);
      const ds_student_tensor *head = ds_student_tensor_at(r, ds_student_tensor_count(r) - 1);
      EXPECT(!strcmp(head->name, "lm_head.weight") && head->data[5] == other[5]);
    } else {
      EXPECT(memcmp(ds_student_params(r), emb->data, (size_t)(V * c->hidden_size) * sizeof(float)) == 0);
    }
    ds_student_free(r);
  }
  free(other);
  ds_student_free(s);
}

/* Fresh weights: normal(0, initializer_range) matrices, unit norms, zero biases, a zero
 * pad_token_id row; the same seed gives the same weights. */
static void test_init(void) {
  ds_student *a = NULL, *b = NULL, *c = NULL;
  EXPECT_OK(ds_student_new(k_llama, strlen(k_llama), "llama", 42, NULL, &a));
  EXPECT_OK(ds_student_new(k_llama, strlen(k_llama), "llama", 42, NULL, &b));
  EXPECT_OK(ds_student_new(k_llama, strlen(k_llama), "llama", 43, NULL, &c));
  if (!a || !b || !c) return;
  size_t n = ds_student_num_params(a);
  EXPECT(memcmp(ds_student_params(a), ds_student_params(b), n * sizeof(float)) == 0);
  EXPECT(memcmp(ds_student_params(a), ds_student_params(c), n * sizeof(float)) != 0);
  double ss = 0, sum = 0;
  size_t cnt = 0;
  for (size_t i = 0; i < ds_student_tensor_count(a); i++) {
    const ds_student_tensor *t = ds_student_tensor_at(a, i);
    size_t m = numel(t);
    int is_norm = strstr(t->name, "norm") != NULL, is_bias = strstr(t->name, ".bias") != NULL;
    for (size_t k = 0; k < m; k++) {
      if (is_norm) EXPECT(t->data[k] == 1.0f);
      else if (is_bias) EXPECT(t->data[k] == 0.0f);
      else if (!(i == 0 && k / 16 == 36)) ss += (double)t->data[k] * t->data[k], sum += t->data[k], cnt++;
    }
    if (i == 0)
      for (int k = 0; k < 16; k++) EXPECT(t->data[36 * 16 + k] == 0.0f); /* pad_token_id 36 */
  }
  double mean = sum / (double)cnt, sd = sqrt(ss / (double)cnt - mean * mean);
  EXPECT(fabs(sd - 0.3) < 0.015 && fabs(mean) < 0.01);
  EXPECT(ds_student_pad_token_id(a) == 36 && !ds_student_is_tied(a));
  ds_student_free(a);
  ds_student_free(b);
  ds_student_free(c);
}

/* pad_token_id in the input: its embedding row gets no gradient from the lookup (untied). */
static void test_padding_idx(void) {
  ds_student *s = make(k_llama, 6, ds_backend_cpu());
  int64_t d = ds_student_config(s)->hidden_size;
  int32_t ids[5] = {36, 4, 36, 9, 1};
  ds_student_batch b = {ids, 1, 5, NULL};
  ds_student_zero_grads(s);
  EXPECT_OK(ds_student_forward(s, &b));
  float *dh = malloc((size_t)(5 * d) * sizeof(float));
  for (int64_t i = 0; i < 5 * d; i++) dh[i] = 1.0f + (float)(i % 7);
  EXPECT_OK(ds_student_backward(s, dh, NULL, 0));
  const float *g = ds_student_tensor_at(s, 0)->grad;
  int zero = 1, nonzero = 0;
  for (int64_t k = 0; k < d; k++) zero &= g[36 * d + k] == 0.0f, nonzero |= g[4 * d + k] != 0.0f;
  EXPECT(zero && nonzero);
  free(dh);
  ds_student_free(s);
}

static void test_refusals(void) {
  ds_student *s = make(k_qwen3, 1, ds_backend_cpu());
  int32_t ids[4] = {1, 2, 37, 3};
  ds_student_batch b = {ids, 1, 4, NULL};
  EXPECT(ds_student_forward(s, &b) == DS_ERR_RANGE && strstr(ds_last_error(), "token id 37"));
  EXPECT(ds_student_backward(s, NULL, NULL, 0) == DS_ERR_ARG); /* no valid forward */
  int64_t lens[1] = {5};
  ds_student_batch b2 = {ids, 1, 4, lens};
  EXPECT(ds_student_forward(s, &b2) == DS_ERR_RANGE && strstr(ds_last_error(), "length 5"));
  int32_t many[65] = {0};
  ds_student_batch b3 = {many, 1, 65, NULL};
  EXPECT(ds_student_forward(s, &b3) == DS_ERR_RANGE && strstr(ds_last_error(), "max_position_embeddings"));
  ds_student_batch ok = {ids, 1, 2, NULL};
  EXPECT_OK(ds_student_forward(s, &ok));
  float g[2 * 16] = {0};
  ds_student_hidden_grad bad = {2, g};
  EXPECT(ds_student_backward(s, NULL, &bad, 1) == DS_ERR_ARG && strstr(ds_last_error(), "layer 2"));
  EXPECT(ds_student_hidden(s, 2) == NULL && ds_student_hidden(s, -1) != NULL && ds_student_hidden(s, 1) != NULL);
  ds_student_free(s);
  ds_student *t = NULL;
  const char *bad_cfg = "{\"architectures\": [\"Qwen3ForCausalLM\"], \"vocab_size\": 8, \"pad_token_id\": 8}";
  EXPECT(ds_student_new(bad_cfg, strlen(bad_cfg), "cfg", 0, NULL, &t) != DS_OK && strstr(ds_last_error(), "pad_token_id"));
  EXPECT(ds_student_load_hf("/nonexistent-student-dir", NULL, &t) != DS_OK && t == NULL);
}

/* Extra params (a loss's own weights, e.g. --intermediate projections): the model's values and
 * gradients survive the move, the tensor views and the tied head follow, the extras start at 0,
 * zeroing covers them, and a forward + backward gives the same gradients as before. */
static void test_extra_params(void) {
  ds_student *s = make(k_qwen2, 4, ds_backend_cpu()); /* tied: the head must follow the table */
  size_t n = ds_student_num_params(s);
  int32_t ids[6] = {1, 5, 9, 2, 7, 3};
  ds_student_batch b = {ids, 1, 6, NULL};
  EXPECT(ds_student_extra_params(s) == NULL);
  EXPECT_OK(ds_student_forward(s, &b));
  EXPECT_OK(ds_student_backward(s, ds_student_final_hidden(s), NULL, 0));
  float *p0 = malloc(n * sizeof(float)), *g0 = malloc(n * sizeof(float));
  memcpy(p0, ds_student_params(s), n * sizeof(float));
  memcpy(g0, ds_student_grads(s), n * sizeof(float));
  EXPECT_OK(ds_student_set_extra_params(s, 100));
  EXPECT(ds_student_num_params(s) == n + 100);
  EXPECT(memcmp(ds_student_params(s), p0, n * sizeof(float)) == 0);
  EXPECT(memcmp(ds_student_grads(s), g0, n * sizeof(float)) == 0);
  EXPECT(ds_student_extra_params(s) == ds_student_params(s) + n && ds_student_extra_grads(s) == ds_student_grads(s) + n);
  for (int i = 0; i < 100; i++) EXPECT(ds_student_extra_params(s)[i] == 0.0f && ds_student_extra_grads(s)[i] == 0.0f);
  EXPECT(ds_student_tensor_at(s, 0)->data == ds_student_params(s));
  ds_student_extra_grads(s)[7] = 3.0f;
  ds_student_zero_grads(s);
  EXPECT(ds_student_extra_grads(s)[7] == 0.0f);
  /* the same forward + backward through the moved buffers: the same gradients, extras untouched */
  EXPECT_OK(ds_student_forward(s, &b));
  EXPECT_OK(ds_student_backward(s, ds_student_final_hidden(s), NULL, 0));
  EXPECT(memcmp(ds_student_grads(s), g0, n * sizeof(float)) == 0);
  for (int i = 0; i < 100; i++) EXPECT(ds_student_extra_grads(s)[i] == 0.0f);
  free(p0);
  free(g0);
  ds_student_free(s);
}

int main(void) {
  ds_set_num_threads(2);
  mkdir(tmp_dir(), 0755);
  TEST_RUN(test_fd);
  TEST_RUN(test_backends);
  TEST_RUN(test_packing);
  TEST_RUN(test_export);
  TEST_RUN(test_target_batch_invariance);
  TEST_RUN(test_tying);
  TEST_RUN(test_init);
  TEST_RUN(test_padding_idx);
  TEST_RUN(test_refusals);
  TEST_RUN(test_extra_params);
  return TEST_RESULT();
}
