/* A draft over a reduced vocabulary (spec/dspark.md section 4a; include/dspark/draft.h): the
 * selection rule of `train --draft-vocab`, a reduced draft that computes exactly the columns S
 * of the full draft it was cut from (training forward and the decoding head), every trainable
 * gradient against central finite differences, the d2t / t2d tensors through an export and a
 * load (and the identity that tells S apart), and the refusals. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dspark/draft.h"
#include "dspark/fileio.h"
#include "dspark/draft_loss.h"
#include "dspark/draft_trainer.h"
#include "dspark/rng.h"
#include "support/tiny_draft.h"
#include "model/draft_internal.h"
#include "test_util.h"

enum { V = 41, DM = 16, T = 12, NB = 3, G = 3, N = 11 };

static const int32_t k_vocab[N] = {0, 2, 3, 7, 11, 12, 20, 29, 33, 38, 40}; /* S: mask V-1 = 40 in it too */

static ds_draft_config tiny_config(ds_markov_type type, int64_t n_vocab) {
  ds_draft_config c = tiny_draft_config(V, 1, G, type, NB);
  c.draft_vocab_size = n_vocab;
  return c;
}

typedef struct {
  float ctx[T * 2 * DM];
  int32_t ids[T];
  int64_t anchors[NB];
  uint8_t keep[NB];
  uint8_t eval[NB * G];
  float G_logits[NB * G * N];
  float G_conf[NB * G];
} fixture;

static void make_fixture(fixture *f, ds_rng *rng) {
  for (int i = 0; i < T * 2 * DM; i++) f->ctx[i] = 2.0f * ds_rng_uniform_f32(rng) - 1.0f;
  for (int i = 0; i < T; i++) f->ids[i] = (int32_t)(ds_rng_next_u64(rng) % V); /* in S or not */
  int64_t a[NB] = {2, 7, 0};
  uint8_t k[NB] = {1, 1, 0};
  memcpy(f->anchors, a, sizeof a);
  memcpy(f->keep, k, sizeof k);
  memset(f->eval, 1, sizeof f->eval);
  for (int i = 0; i < NB * G * N; i++) f->G_logits[i] = 2.0f * ds_rng_uniform_f32(rng) - 1.0f;
  for (int i = 0; i < NB * G; i++) f->G_conf[i] = 2.0f * ds_rng_uniform_f32(rng) - 1.0f;
}

static ds_draft_seq seq_of(fixture *f) {
  ds_draft_seq s = {T, f->ctx, NULL, f->ids, NB, f->anchors, f->keep, f->eval, {NULL, DS_F32}};
  return s;
}

static float *rand_table(ds_rng *rng) {
  float *p = malloc(sizeof(float) * V * DM);
  for (int i = 0; i < V * DM; i++) p[i] = 2.0f * ds_rng_uniform_f32(rng) - 1.0f;
  return p;
}

/* A full draft and the reduced draft cut from it: the same trainable weights, W2's rows S. */
static void make_pair(ds_markov_type type, ds_rng *rng, float **tables, ds_draft **full, ds_draft **red) {
  tables[0] = rand_table(rng), tables[1] = rand_table(rng);
  ds_draft_config cf = tiny_config(type, 0), cr = tiny_config(type, N);
  EXPECT_OK(ds_draft_new(&cf, (ds_weight){tables[0], DS_F32}, (ds_weight){tables[1], DS_F32}, 3, ds_backend_cpu(), full));
  EXPECT_OK(ds_draft_new_vocab(&cr, (ds_weight){tables[0], DS_F32}, (ds_weight){tables[1], DS_F32}, k_vocab, 3,
                               ds_backend_cpu(), red));
  ds_draft *a = *full, *b = *red;
  for (size_t i = 0; i < a->n_params; i++) a->params[i] += 0.3f * (2.0f * ds_rng_uniform_f32(rng) - 1.0f);
  for (size_t t = 0; t < ds_draft_tensor_count(a); t++) {
    const ds_draft_tensor *x = ds_draft_tensor_at(a, t), *y = ds_draft_tensor_at(b, t);
    EXPECT(!strcmp(x->name, y->name));
    if (!x->grad) continue;
    int64_t cols = x->ndim == 2 ? x->shape[1] : 1;
    if (x->shape[0] == y->shape[0]) {
      memcpy(y->data, x->data, (size_t)(x->shape[0] * cols) * sizeof(float));
    } else { /* markov_w2: rows S */
      EXPECT(y->shape[0] == N && !strcmp(x->name, "markov_head.markov_w2.weight"));
      for (int j = 0; j < N; j++)
        memcpy((float *)y->data + j * cols, (float *)x->data + k_vocab[j] * cols, (size_t)cols * sizeof(float));
    }
  }
}

/* The rule of `train --draft-vocab`: mandatory ids whatever their counts, then counts descending,
 * ties by lower id; sorted; refusals name --draft-vocab. */
static void test_select(void) {
  int64_t counts[10] = {5, 0, 9, 9, 1, 7, 0, 2, 9, 0};
  int32_t mand[4] = {9, 6, 9, 1}, out[10];
  EXPECT_OK(ds_draft_vocab_select(counts, 10, 6, mand, 4, out));
  const int32_t want[6] = {1, 2, 3, 6, 8, 9}; /* 9, 6, 1 mandatory; then 2, 3, 8 (count 9, lower ids first) */
  EXPECT(!memcmp(out, want, sizeof want));
  EXPECT_OK(ds_draft_vocab_select(counts, 10, 3, mand, 4, out)); /* exactly the mandatory ids */
  EXPECT(out[0] == 1 && out[1] == 6 && out[2] == 9);
  EXPECT_OK(ds_draft_vocab_select(counts, 10, 10, NULL, 0, out));
  for (int i = 0; i < 10; i++) EXPECT(out[i] == i);
  EXPECT_OK(ds_draft_vocab_select(NULL, 10, 2, NULL, 0, out)); /* no counts: the lowest ids */
  EXPECT(out[0] == 0 && out[1] == 1);
  int32_t *two = malloc(2 * sizeof *two); /* out holds N ids, never more (the sanitizer build checks) */
  EXPECT(ds_draft_vocab_select(counts, 10, 2, mand, 4, two) == DS_ERR_ARG &&
         strstr(ds_last_error(), "below the 3 ids") && strstr(ds_last_error(), "--draft-vocab 2"));
  free(two);
  EXPECT(ds_draft_vocab_select(counts, 10, 11, NULL, 0, out) == DS_ERR_ARG && strstr(ds_last_error(), "--draft-vocab 11"));
  int32_t bad[1] = {10};
  EXPECT(ds_draft_vocab_select(counts, 10, 5, bad, 1, out) == DS_ERR_ARG);
}

/* The reduced draft's logits are the full draft's columns S (training forward), and so are the
 * decoding head's; W1 and the confidence head see target ids outside S as before. */
static void test_matches_full_columns(void) {
  ds_markov_type types[3] = {DS_MARKOV_VANILLA, DS_MARKOV_RNN, DS_MARKOV_NONE};
  for (int ti = 0; ti < 3; ti++) {
    ds_rng rng;
    ds_rng_seed(&rng, 31 + (uint64_t)ti);
    float *tables[2];
    ds_draft *full, *red;
    make_pair(types[ti], &rng, tables, &full, &red);
    EXPECT(ds_draft_vocab_size(red) == N && ds_draft_vocab_size(full) == V && !ds_draft_vocab_ids(full));
    EXPECT(ds_draft_vocab_index(red)[7] == 3 && ds_draft_vocab_index(red)[8] == -1 && ds_draft_vocab_ids(red)[4] == 11);
    fixture f;
    make_fixture(&f, &rng);
    static float lf[NB * G * V], lr[NB * G * N], cf[NB * G], cr[NB * G];
    ds_draft_seq s = seq_of(&f);
    EXPECT_OK(ds_draft_forward_blocks(full, &s, lf, cf));
    EXPECT_OK(ds_draft_forward_blocks(red, &s, lr, cr));
    double err = 0, scale = 0;
    for (int r = 0; r < NB * G; r++)
      for (int j = 0; j < N; j++) {
        err = fmax(err, fabs((double)lr[r * N + j] - lf[r * V + k_vocab[j]]));
        scale = fmax(scale, fabs((double)lf[r * V + k_vocab[j]]));
      }
    EXPECT(err <= 1e-6 * scale && !memcmp(cf, cr, sizeof cf));
    /* decoding: one block, then the head slot by slot with target ids (in S and not) */
    ds_draft_state *sf, *sr;
    EXPECT_OK(ds_draft_state_new(full, 32, &sf));
    EXPECT_OK(ds_draft_state_new(red, 32, &sr));
    EXPECT_OK(ds_draft_state_append(full, sf, f.ctx, 6));
    EXPECT_OK(ds_draft_state_append(red, sr, f.ctx, 6));
    float hf[G * DM], hr[G * DM], bf[G * V], br[G * N];
    EXPECT_OK(ds_draft_block(full, sf, 8, hf, bf));
    EXPECT_OK(ds_draft_block(red, sr, 8, hr, br));
    EXPECT(!memcmp(hf, hr, sizeof hf));
    int32_t prev[G] = {8, 7, 39}; /* 8 and 39 outside S */
    err = 0, scale = 0;
    for (int k = 0; k < G; k++) {
      float zf, zr;
      EXPECT_OK(ds_draft_head_step(full, sf, hf + k * DM, prev[k], bf + k * V, &zf));
      EXPECT_OK(ds_draft_head_step(red, sr, hr + k * DM, prev[k], br + k * N, &zr));
      EXPECT(zf == zr);
      for (int j = 0; j < N; j++) {
        err = fmax(err, fabs((double)br[k * N + j] - bf[k * V + k_vocab[j]]));
        scale = fmax(scale, fabs((double)bf[k * V + k_vocab[j]]));
      }
    }
    EXPECT(err <= 1e-6 * scale);
    ds_draft_state_free(sf);
    ds_draft_state_free(sr);
    ds_draft_free(full);
    ds_draft_free(red);
    free(tables[0]), free(tables[1]);
  }
}

/* L = sum G_logits * logits [R, N] + sum G_conf * conf, in double. */
static double objective(ds_draft *d, fixture *f) {
  static float logits[NB * G * N], conf[NB * G];
  ds_draft_seq s = seq_of(f);
  if (ds_draft_forward_blocks(d, &s, logits, conf) != DS_OK) abort();
  double L = 0;
  for (int i = 0; i < NB * G * N; i++) L += (double)f->G_logits[i] * logits[i];
  for (int i = 0; i < NB * G; i++) L += (double)f->G_conf[i] * conf[i];
  return L;
}
static double objective_of(ds_draft *d, void *f) { return objective(d, f); }

/* The loss of a reduced draft with its teacher's stats kept per position (draft_loss.h): the
 * first pass (stats computed) agrees with the plain pass, a second pass (stats read back) equals
 * the first bit for bit, and only the supervised positions are filled. */
static void test_teacher_memo(void) {
  ds_rng rng;
  ds_rng_seed(&rng, 77);
  float *tables[2];
  ds_draft *full, *red;
  make_pair(DS_MARKOV_VANILLA, &rng, tables, &full, &red);
  fixture f;
  make_fixture(&f, &rng);
  float *last = rand_table(&rng); /* [T, DM] rows of it: the teacher's hidden states */
  ds_draft_seq s = seq_of(&f);
  s.last = last;
  s.teacher_head = (ds_weight){tables[1], DS_F32};
  ds_dspark_loss_config lc = ds_dspark_loss_config_default();
  lc.chunk_rows = 4;
  ds_dspark_teacher_stat memo[T];
  for (int i = 0; i < T; i++) memo[i].lse = NAN;
  ds_dspark_loss_result res[3];
  size_t np = ds_draft_num_params(red);
  float *grads[3];
  for (int k = 0; k < 3; k++) {
    memset(&res[k], 0, sizeof res[k]);
    ds_draft_zero_grads(red);
    EXPECT_OK(ds_draft_loss_seq_memo(red, &s, k ? memo : NULL, &lc, 0.5, 1, &res[k], NULL, NULL));
    grads[k] = malloc(np * sizeof(float));
    memcpy(grads[k], ds_draft_grads(red), np * sizeof(float));
  }
  EXPECT_CLOSE(res[1].numerator, res[0].numerator, 1e-6, 1e-9);
  EXPECT_CLOSE(res[1].pair[DS_DSPARK_PAIR_ACCEPT][0], res[0].pair[DS_DSPARK_PAIR_ACCEPT][0], 1e-6, 1e-9);
  double gmax = 0, dmax = 0;
  for (size_t i = 0; i < np; i++) gmax = fmax(gmax, fabs(grads[0][i])), dmax = fmax(dmax, fabs(grads[1][i] - grads[0][i]));
  EXPECT(gmax > 0 && dmax <= 1e-5 * gmax);
  EXPECT(!memcmp(&res[1], &res[2], sizeof res[1]) && !memcmp(grads[1], grads[2], np * sizeof(float)));
  for (int t = 0; t < T; t++) { /* supervised: t = a + k for a kept block's anchor a, k < G, t + 1 < T */
    int want = 0;
    for (int b = 0; b < NB; b++)
      want |= f.keep[b] && t >= f.anchors[b] && t < f.anchors[b] + G && t + 1 < T;
    EXPECT(want == !isnan(memo[t].lse));
  }
  for (int k = 0; k < 3; k++) free(grads[k]);
  free(last), free(tables[0]), free(tables[1]);
  ds_draft_free(full), ds_draft_free(red);
}

/* Every trainable gradient of a reduced draft against central finite differences. */
static void test_grads_fd(void) {
  ds_markov_type types[3] = {DS_MARKOV_VANILLA, DS_MARKOV_GATED, DS_MARKOV_RNN};
  for (int ti = 0; ti < 3; ti++) {
    ds_rng rng;
    ds_rng_seed(&rng, 51 + (uint64_t)ti);
    float *tables[2];
    ds_draft *full, *d;
    make_pair(types[ti], &rng, tables, &full, &d);
    fixture f;
    make_fixture(&f, &rng);
    ds_draft_seq s = seq_of(&f);
    int64_t R = NB * G, r = d->cfg.markov_rank;
    ds_draft_zero_grads(d);
    EXPECT_OK(draft_forward(d, &s));
    float *dh = calloc((size_t)(R * DM), sizeof(float)), *dz = calloc((size_t)(R * r), sizeof(float));
    ds_draft_rows_logits_backward(d, 0, R, f.G_logits, dh, dz);
    markov_head_backward(d, R, dz, f.G_conf, dh);
    EXPECT_OK(draft_backward(d, &s, dh));
    float *grad = malloc(d->n_params * sizeof(float));
    memcpy(grad, d->grads, d->n_params * sizeof(float));
    EXPECT(tiny_draft_fd_check(d, grad, objective_of, &f, &rng, ds_markov_type_name(types[ti])) == 0);
    free(dh), free(dz), free(grad);
    ds_draft_free(full);
    ds_draft_free(d);
    free(tables[0]), free(tables[1]);
  }
}

/* Rewrites DIR/model.safetensors with `extra` spaces ending its header's JSON (the length field
 * updated), so every tensor lies `extra` bytes further into the file; 1 on success. */
static int widen_header(const char *dir, size_t extra) {
  char path[600];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  char *b = NULL;
  size_t n = 0;
  if (ds_read_file(path, &b, &n) != DS_OK) return 0;
  uint64_t hl = 0;
  for (int i = 0; n > 8 && i < 8; i++) hl |= (uint64_t)(unsigned char)b[i] << (8 * i);
  char *w = n > 8 && hl + 8 <= n ? malloc(n + extra) : NULL;
  int ok = w != NULL;
  if (ok) {
    memcpy(w, b, 8 + hl);
    memset(w + 8 + hl, ' ', extra);
    memcpy(w + 8 + hl + extra, b + 8 + hl, n - 8 - hl);
    for (int i = 0; i < 8; i++) w[i] = (char)(unsigned char)((hl + extra) >> (8 * i));
    ok = ds_write_file_atomic(path, w, n + extra) == DS_OK;
  }
  free(w);
  free(b);
  return ok;
}

static void test_export_load(void) {
  ds_rng rng;
  ds_rng_seed(&rng, 71);
  float *tables[2];
  ds_draft *full, *d, *e;
  make_pair(DS_MARKOV_VANILLA, &rng, tables, &full, &d);
  const ds_draft_tensor *d2t = NULL, *t2d = NULL;
  for (size_t t = 0; t < ds_draft_tensor_count(d); t++) {
    const ds_draft_tensor *x = ds_draft_tensor_at(d, t);
    if (!strcmp(x->name, "d2t")) d2t = x;
    if (!strcmp(x->name, "t2d")) t2d = x;
  }
  EXPECT(d2t && d2t->dtype == DS_I64 && d2t->ndim == 1 && d2t->shape[0] == N && !d2t->grad);
  EXPECT(t2d && t2d->dtype == DS_BOOL && t2d->ndim == 1 && t2d->shape[0] == V);
  for (int j = 0; d2t && j < N; j++) EXPECT(((int64_t *)d2t->data)[j] == k_vocab[j] - j);
  int marked = 0;
  for (int v = 0; t2d && v < V; v++) marked += ((uint8_t *)t2d->data)[v];
  EXPECT(marked == N);
  const char *dir = getenv("DSPARK_TEST_TMP") ? getenv("DSPARK_TEST_TMP") : "/tmp";
  char out[512];
  mkdir(dir, 0755);
  snprintf(out, sizeof out, "%s/draft-vocab-export", dir);
  const char *target_cfg =
      "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"vocab_size\": 41, \"hidden_size\": 16, "
      "\"intermediate_size\": 24, \"num_hidden_layers\": 6, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
      "\"head_dim\": 8, \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0}";
  char *json = NULL;
  EXPECT_OK(ds_draft_hf_config_json(d, target_cfg, &json));
  EXPECT(json && strstr(json, "\"draft_vocab_size\":\t11"));
  free(json);
  EXPECT_OK(ds_draft_hf_config_json(full, target_cfg, &json)); /* a full draft writes no such key */
  EXPECT(json && !strstr(json, "draft_vocab_size"));
  free(json);
  EXPECT_OK(ds_draft_export_hf(d, target_cfg, out));
  EXPECT_OK(ds_draft_load_hf(out, ds_backend_cpu(), &e));
  if (e) {
    EXPECT(e->cfg.draft_vocab_size == N && !memcmp(ds_draft_vocab_ids(e), k_vocab, sizeof k_vocab));
    EXPECT(ds_draft_identity(e) == ds_draft_identity(d));
    fixture f;
    make_fixture(&f, &rng);
    static float l1[NB * G * N], l2[NB * G * N], c1[NB * G], c2[NB * G];
    ds_draft_seq s = seq_of(&f);
    EXPECT_OK(ds_draft_forward_blocks(d, &s, l1, c1));
    EXPECT_OK(ds_draft_forward_blocks(e, &s, l2, c2));
    EXPECT(!memcmp(l1, l2, sizeof l1) && !memcmp(c1, c2, sizeof c1));
    /* the frozen tables are read in place in the file's mapping, not copied into the draft */
    EXPECT(e->tables_file && e->embed.data != (char *)e->frozen + e->specs[0].offset &&
           e->lm_head.data != (char *)e->frozen + e->specs[1].offset);
    EXPECT(!memcmp(e->embed.data, d->embed.data, sizeof(float) * V * DM) &&
           !memcmp(e->lm_head.data, d->lm_head.data, sizeof(float) * N * DM));
    /* ... wherever the file puts them: the same file with its header 8 bytes longer (valid
     * safetensors: the header's JSON may end in spaces) moves the tables 8 bytes, so one of the
     * two loads finds them at an address of 8 mod 16; both must read them in place */
    ds_draft *e8 = NULL;
    EXPECT(widen_header(out, 8));
    EXPECT_OK(ds_draft_load_hf(out, ds_backend_cpu(), &e8));
    if (e8) {
      EXPECT(e8->tables_file && e8->embed.data != (char *)e8->frozen + e8->specs[0].offset &&
             e8->lm_head.data != (char *)e8->frozen + e8->specs[1].offset);
      EXPECT(((uintptr_t)e8->embed.data - (uintptr_t)e->embed.data) % 16 == 8);
      EXPECT(!memcmp(e8->embed.data, d->embed.data, sizeof(float) * V * DM) &&
             !memcmp(e8->lm_head.data, d->lm_head.data, sizeof(float) * N * DM));
      ds_draft_free(e8);
    }
    uint64_t id = ds_draft_identity(e);
    e->vocab_ids[3] = 8; /* another S (same weights): another draft */
    EXPECT(ds_draft_identity(e) != id);
    ds_draft_free(e);
  }
  EXPECT(ds_draft_identity(full) != ds_draft_identity(d));
  ds_draft_free(full);
  ds_draft_free(d);
  free(tables[0]), free(tables[1]);
}

static void test_refusals(void) {
  float *tables[2];
  ds_rng rng;
  ds_rng_seed(&rng, 91);
  tables[0] = rand_table(&rng), tables[1] = rand_table(&rng);
  ds_weight e = {tables[0], DS_F32}, h = {tables[1], DS_F32};
  ds_draft_config c = tiny_config(DS_MARKOV_VANILLA, N);
  ds_draft *d = NULL;
  int32_t ids[N];
  memcpy(ids, k_vocab, sizeof ids);
  ids[4] = ids[3]; /* not increasing */
  EXPECT(ds_draft_new_vocab(&c, e, h, ids, 1, ds_backend_cpu(), &d) == DS_ERR_ARG && !d);
  memcpy(ids, k_vocab, sizeof ids);
  ids[N - 1] = V; /* outside the vocabulary */
  EXPECT(ds_draft_new_vocab(&c, e, h, ids, 1, ds_backend_cpu(), &d) == DS_ERR_ARG && !d);
  EXPECT(ds_draft_new(&c, e, h, 1, ds_backend_cpu(), &d) == DS_ERR_ARG && !d); /* N > 0 needs S */
  c.draft_vocab_size = V + 1;
  EXPECT(ds_draft_config_check(&c) == DS_ERR_ARG);
  free(tables[0]), free(tables[1]);
}

int main(void) {
  TEST_RUN(test_select);
  TEST_RUN(test_matches_full_columns);
  TEST_RUN(test_teacher_memo);
  TEST_RUN(test_grads_fd);
  TEST_RUN(test_export_load);
  TEST_RUN(test_refusals);
  return TEST_RESULT();
}
