/* int8 cache features (include/dspark/cache.h "int8 features"): the quantize / dequantize
 * round trip (error within half a step, zero rows, ties, extremes, underflow), and a small int8
 * cache written through the capture's shard writer and read back through the reader: values
 * equal to the round trip, BF16 KD log-probs, and the size estimate equal to the files. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dspark/cache.h"
#include "dspark/dtype.h"
#include "dspark/fileio.h"
#include "dspark/rng.h"
#include "test_util.h"

static char g_dir[512];

static void test_round_trip_random(void) {
  enum { ROWS = 64, COLS = 37 };
  float x[ROWS * COLS], y[ROWS * COLS], s[ROWS];
  int8_t q[ROWS * COLS];
  ds_rng r;
  ds_rng_seed(&r, 7);
  for (int i = 0; i < ROWS; i++) {
    float mag = powf(10.0f, (float)(i % 9) - 4.0f); /* 1e-4 .. 1e4 */
    for (int j = 0; j < COLS; j++) x[i * COLS + j] = mag * (2.0f * ds_rng_uniform_f32(&r) - 1.0f);
  }
  x[5 * COLS + 3] = 1000.0f; /* an outlier: the rest of its row gets few levels */
  ds_cache_quantize_i8(q, s, x, ROWS, COLS);
  ds_cache_dequantize_i8(y, q, s, ROWS, COLS);
  int bad = 0, peak_ok = 1;
  for (int i = 0; i < ROWS; i++) {
    float amax = 0;
    int qmax = 0;
    for (int j = 0; j < COLS; j++) {
      amax = fmaxf(amax, fabsf(x[i * COLS + j]));
      qmax = abs(q[i * COLS + j]) > qmax ? abs(q[i * COLS + j]) : qmax;
      /* half a step, plus the fp32 rounding of v / s and of q * s (127 * 2^-24 steps each) */
      if (fabsf(y[i * COLS + j] - x[i * COLS + j]) > s[i] * (0.5f + 2e-5f)) bad++;
      if (q[i * COLS + j] < -127) bad++;
    }
    EXPECT(s[i] == amax / 127.0f);
    peak_ok &= qmax == 127; /* the row's absmax is stored as +-127 */
  }
  EXPECT(bad == 0);
  EXPECT(peak_ok);
}

static void test_round_trip_edges(void) {
  /* ties round half to even with s = 1 exactly (absmax 127) */
  float ties[8] = {127.0f, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, 126.5f, -127.0f};
  const int8_t want[8] = {127, 0, 2, 2, 0, -2, 126, -127};
  int8_t q[8];
  float s, y[8];
  ds_cache_quantize_i8(q, &s, ties, 1, 8);
  EXPECT(s == 1.0f);
  for (int i = 0; i < 8; i++) EXPECT(q[i] == want[i]);

  /* a zero row: scale 0, q 0, read back as zeros */
  float zero[8] = {0};
  memset(q, 0x55, sizeof q);
  ds_cache_quantize_i8(q, &s, zero, 1, 8);
  ds_cache_dequantize_i8(y, q, &s, 1, 8);
  EXPECT(s == 0.0f);
  for (int i = 0; i < 8; i++) EXPECT(q[i] == 0 && y[i] == 0.0f);

  /* an absmax whose absmax / 127 underflows: stored as zeros, not divided by zero */
  float tiny[2] = {1e-44f, -1e-45f};
  ds_cache_quantize_i8(q, &s, tiny, 1, 2);
  EXPECT(s == 0.0f && q[0] == 0 && q[1] == 0);

  /* large magnitudes stay finite and within half a step; a negative absmax element maps to -127 */
  float big[4] = {1e38f, -1e38f, 3e37f, -1.0f};
  ds_cache_quantize_i8(q, &s, big, 1, 4);
  ds_cache_dequantize_i8(y, q, &s, 1, 4);
  EXPECT(q[0] == 127 && q[1] == -127 && q[3] == 0);
  for (int i = 0; i < 4; i++) EXPECT(isfinite(y[i]) && fabsf(y[i] - big[i]) <= s * (0.5f + 2e-5f));

  /* several rows at once: each its own scale */
  float two[6] = {1, 2, 3, -10, 5, 0};
  int8_t q2[6];
  float s2[2];
  ds_cache_quantize_i8(q2, s2, two, 2, 3);
  EXPECT(s2[0] == 3.0f / 127.0f && s2[1] == 10.0f / 127.0f && q2[2] == 127 && q2[3] == -127 && q2[5] == 0);
}

/* ---------------------------------------------------------------- through the shard writer and reader */

enum { N = 3, S = 5, D = 6, M = 2, K = 2, V = 11 };

static float value(int64_t sample, int64_t t, int64_t j) {
  return (float)((sample + 1) * (t + 2)) * sinf(0.7f * (float)j + (float)sample) + (j == 3 ? 9.0f * (float)t : 0.0f);
}

static void test_cache_files(void) {
  char dir[600];
  snprintf(dir, sizeof dir, "%s/cache", g_dir);
  EXPECT_OK(ds_mkdir_p(dir));
  ds_cache_manifest m;
  memset(&m, 0, sizeof m);
  m.format_version = DS_CACHE_FORMAT_VERSION;
  m.complete = 1;
  m.target_path = strdup("t");
  m.data_path = strdup("d");
  snprintf(m.target_architecture, sizeof m.target_architecture, "Qwen3ForCausalLM");
  snprintf(m.chat_template, sizeof m.chat_template, "%s", DS_CACHE_CHAT_TEMPLATE);
  m.chat_template_xxh64 = ds_cache_hash_string(DS_CACHE_CHAT_TEMPLATE);
  m.target_config_xxh64 = m.tokenizer_xxh64 = ds_cache_hash_string("{}");
  m.vocab_size = V;
  m.hidden_size = D;
  m.num_hidden_layers = 4;
  m.n_layers = M;
  m.target_layer_ids[0] = 0;
  m.target_layer_ids[1] = 2;
  m.dtype = DS_I8;
  m.seq_length = S;
  m.eos_token_id = 1;
  m.min_length = 2;
  m.num_samples = N;
  m.shard_size = N;
  m.features = 1;
  m.kd_topk = K;
  m.kd_top_p = 1.0;
  m.kd_min_k = 1;
  m.kd_temperature = 1.0;
  m.target_weights_file_xxh64 = 5; /* not read here */
  m.n_shards = 1;
  m.shards = calloc(1, sizeof *m.shards);
  ds_cache_shard_name(0, m.shards[0].file, sizeof m.shards[0].file);
  m.shards[0].num_samples = N;

  ds_shard_buf b;
  EXPECT_OK(ds_shard_buf_alloc(&b, &m, N));
  float ctx[S * M * D], last[S * D], lp[S * K];
  int32_t ids[S], kid[S * K];
  uint8_t mask[S];
  for (int64_t i = 0; i < N; i++) {
    int64_t len = S - i;
    memset(ids, 0, sizeof ids);
    memset(mask, 0, sizeof mask);
    for (int64_t t = 0; t < len; t++) {
      ids[t] = (int32_t)((i + t) % V);
      mask[t] = 1;
      for (int64_t j = 0; j < M * D; j++) ctx[t * M * D + j] = value(i, t, j);
      for (int64_t j = 0; j < D; j++) last[t * D + j] = -value(i, t, j + 1);
      for (int64_t k = 0; k < K; k++) {
        kid[t * K + k] = (int32_t)k;
        lp[t * K + k] = -0.3f * (float)(k + 1) - 0.01f * (float)t;
      }
    }
    m.num_tokens += len;
    EXPECT_OK(ds_shard_store(&b, &m, i, len, ids, mask, ctx, last, kid, lp));
  }
  char *path = ds_path_join(dir, m.shards[0].file);
  int64_t bytes = 0, want_bytes = 0;
  EXPECT_OK(ds_shard_write(&b, &m, N, path, &m.shards[0].xxh64, &bytes));
  EXPECT_OK(ds_cache_shard_file_bytes(&m, N, &want_bytes));
  EXPECT(bytes == want_bytes && bytes > 0);
  free(path);
  ds_shard_buf_free(&b);
  const char *copies[2] = {"target_config.json", "tokenizer.json"};
  for (int i = 0; i < 2; i++) {
    char *p = ds_path_join(dir, copies[i]);
    EXPECT_OK(ds_write_file_atomic(p, "{}", 2));
    free(p);
  }
  char *text = ds_cache_manifest_json(&m), *mpath = ds_path_join(dir, "manifest.json");
  EXPECT_OK(ds_write_file_atomic(mpath, text, strlen(text)));
  free(text);
  free(mpath);
  ds_cache_size z;
  EXPECT_OK(ds_cache_estimate(&m, DS_F32, DS_F32, 2, 2, &z));
  EXPECT(z.shard_bytes == bytes && z.n_shards == 1 && z.positions == N * S);
  EXPECT(z.position_bytes == 4 + 1 + M * D + M * 4 + D + 4 + K * 4 + K * 2);

  ds_cache_expect e;
  ds_cache_expect_any(&e);
  e.need_features = 1;
  ds_cache *c = NULL;
  EXPECT_OK(ds_cache_open(dir, &e, &c));
  if (!c) {
    ds_cache_manifest_free(&m);
    return;
  }
  int exact = 1, close = 1;
  for (int64_t i = 0; i < N; i++) {
    int64_t len = S - i;
    float got_ctx[S * M * D], got_last[S * D], got_lp[S * K], ref_ctx[S * M * D], ref_last[S * D], sc[S * M];
    int32_t got_kid[S * K];
    int8_t q[S * M * D];
    EXPECT_OK(ds_cache_read_sample(c, i, got_ctx, got_last, got_kid, got_lp));
    for (int64_t t = 0; t < len; t++) {
      for (int64_t j = 0; j < M * D; j++) ctx[t * M * D + j] = value(i, t, j);
      for (int64_t j = 0; j < D; j++) last[t * D + j] = -value(i, t, j + 1);
    }
    ds_cache_quantize_i8(q, sc, ctx, len * M, D); /* per position and captured layer */
    ds_cache_dequantize_i8(ref_ctx, q, sc, len * M, D);
    ds_cache_quantize_i8(q, sc, last, len, D);
    ds_cache_dequantize_i8(ref_last, q, sc, len, D);
    exact &= !memcmp(got_ctx, ref_ctx, (size_t)(len * M * D) * sizeof(float));
    exact &= !memcmp(got_last, ref_last, (size_t)(len * D) * sizeof(float));
    for (int64_t k = 0; k < len * K; k++) {
      float want = -0.3f * (float)(k % K + 1) - 0.01f * (float)(k / K);
      close &= got_kid[k] == (int32_t)(k % K) && got_lp[k] == ds_bf16_to_f32(ds_f32_to_bf16(want));
    }
  }
  EXPECT(exact);
  EXPECT(close);
  ds_cache_close(c);
  ds_cache_manifest_free(&m);
}

int main(void) {
  const char *base = getenv("DSPARK_TEST_TMP");
  snprintf(g_dir, sizeof g_dir, "%s/test_cache_int8.%ld", base && base[0] ? base : "/tmp", (long)getpid());
  if (ds_mkdir_p(g_dir) != DS_OK) {
    fprintf(stderr, "cannot create %s: %s\n", g_dir, ds_last_error());
    return 2;
  }
  TEST_RUN(test_round_trip_random);
  TEST_RUN(test_round_trip_edges);
  TEST_RUN(test_cache_files);
  return TEST_RESULT();
}
