/* The offline cache's library pieces: the KD top-K / top-p / min_k selection with full-vocabulary
 * log-probs (spec/kd.md sections 1 and 4), the manifest's JSON round trip, its strict parsing
 * and the field-by-field checks against a run, and the reader + prefetch stream on a small
 * synthetic cache (values, order, a corrupted shard reported through the stream). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dspark/cache.h"
#include "dspark/kd_select.h"
#include "dspark/fileio.h"
#include "dspark/rng.h"
#include "dspark/safetensors.h"
#include "test_util.h"

static char g_dir[512];

/* ---------------------------------------------------------------- KD selection */

/* log_softmax(x / T) in double. */
static void ref_logprobs(const float *x, int64_t V, double T, double *out) {
  double m = -INFINITY, s = 0;
  for (int64_t i = 0; i < V; i++) m = fmax(m, (double)(x[i] * (float)(1.0 / T)));
  for (int64_t i = 0; i < V; i++) s += exp((double)(x[i] * (float)(1.0 / T)) - m);
  for (int64_t i = 0; i < V; i++) out[i] = (double)(x[i] * (float)(1.0 / T)) - m - log(s);
}

static void random_logits(float *x, int64_t V, uint64_t seed, float scale) {
  ds_rng r;
  ds_rng_seed(&r, seed);
  for (int64_t i = 0; i < V; i++) x[i] = scale * (2.0f * ds_rng_uniform_f32(&r) - 1.0f);
}

static void test_kd_full_vocab(void) {
  enum { V = 97 };
  float x[V], scratch[V], lp[V];
  int32_t ids[V];
  double ref[V];
  const double temps[] = {1.0, 0.5, 2.0, 3.7};
  for (size_t ti = 0; ti < sizeof temps / sizeof temps[0]; ti++) {
    random_logits(x, V, 11 + ti, 6.0f);
    ref_logprobs(x, V, temps[ti], ref);
    int64_t kept = ds_kd_select(x, V, temps[ti], V, 1.0, 1, scratch, ids, lp);
    EXPECT(kept == V);
    /* K = V recovers the full distribution: a permutation, sorted, summing to 1. */
    int seen[V] = {0}, sorted = 1;
    double sum = 0, err = 0;
    for (int i = 0; i < V; i++) {
      EXPECT(ids[i] >= 0 && ids[i] < V);
      if (ids[i] >= 0 && ids[i] < V) seen[ids[i]]++;
      if (i && lp[i] > lp[i - 1]) sorted = 0;
      sum += exp((double)lp[i]);
      if (ids[i] >= 0 && ids[i] < V) err = fmax(err, fabs((double)lp[i] - ref[ids[i]]));
    }
    for (int i = 0; i < V; i++) EXPECT(seen[i] == 1);
    EXPECT(sorted);
    EXPECT_CLOSE(sum, 1.0, 0, 1e-6);
    EXPECT(err < 1e-6);
  }
}

static void test_kd_topk_and_ties(void) {
  enum { V = 50, K = 8 };
  float x[V], scratch[V], lp[K];
  int32_t ids[K];
  for (int i = 0; i < V; i++) x[i] = (float)(i % 10); /* five ids share each value */
  ds_kd_select(x, V, 1.0, K, 1.0, 1, scratch, ids, lp);
  /* The largest value 9 at ids 9, 19, 29, 39, 49, then 8 at 8, 18, 28: ties by smaller id. */
  const int32_t want[K] = {9, 19, 29, 39, 49, 8, 18, 28};
  for (int i = 0; i < K; i++) EXPECT(ids[i] == want[i]);
  double ref[V];
  ref_logprobs(x, V, 1.0, ref);
  for (int i = 0; i < K; i++) EXPECT_CLOSE(lp[i], ref[ids[i]], 0, 1e-6); /* full-vocabulary, not renormalized */
}

static void test_kd_top_p(void) {
  enum { V = 64, K = 16 };
  float x[V], scratch[V], lp[K];
  int32_t ids[K];
  random_logits(x, V, 3, 8.0f);
  /* top-p 1e-6 with min_k 3 keeps exactly the first 3; the rest are sentinels. */
  int64_t kept = ds_kd_select(x, V, 1.0, K, 1e-6, 3, scratch, ids, lp);
  EXPECT(kept == 3);
  for (int i = 0; i < K; i++) {
    if (i < 3) EXPECT(ids[i] >= 0 && isfinite(lp[i]));
    else EXPECT(ids[i] == -1 && isinf(lp[i]) && lp[i] < 0);
  }
  /* min_k 0 still keeps the top-1. */
  EXPECT(ds_kd_select(x, V, 1.0, K, 1e-6, 0, scratch, ids, lp) == 1);
  /* top-p 0.5: keep i iff the mass before it is < 0.5 (a prefix), checked against the full run. */
  float full_lp[K];
  int32_t full_ids[K];
  ds_kd_select(x, V, 1.0, K, 1.0, 1, scratch, full_ids, full_lp);
  kept = ds_kd_select(x, V, 1.0, K, 0.5, 1, scratch, ids, lp);
  double cum = 0;
  int64_t want = 0;
  for (int i = 0; i < K; i++) {
    if (cum < 0.5) want = i + 1;
    cum += exp((double)full_lp[i]);
  }
  EXPECT(kept == want && kept < K && kept >= 1);
  for (int i = 0; i < kept; i++) EXPECT(ids[i] == full_ids[i] && lp[i] == full_lp[i]);
}

/* ---------------------------------------------------------------- manifest */

static void sample_manifest(ds_cache_manifest *m) {
  memset(m, 0, sizeof *m);
  m->format_version = DS_CACHE_FORMAT_VERSION;
  m->complete = 1;
  m->target_path = strdup("models/t");
  snprintf(m->target_architecture, sizeof m->target_architecture, "Qwen3ForCausalLM");
  m->target_weights_xxh64 = 0x0123456789abcdefull;
  m->target_config_xxh64 = 2;
  m->tokenizer_xxh64 = 3;
  snprintf(m->chat_template, sizeof m->chat_template, "%s", DS_CACHE_CHAT_TEMPLATE);
  m->chat_template_xxh64 = ds_cache_hash_string(DS_CACHE_CHAT_TEMPLATE);
  m->vocab_size = 37;
  m->hidden_size = 8;
  m->num_hidden_layers = 4;
  m->n_layers = 2;
  m->target_layer_ids[0] = 0;
  m->target_layer_ids[1] = 2;
  m->dtype = DS_BF16;
  m->seq_length = 6;
  m->eos_token_id = 1;
  m->min_length = 2;
  m->num_samples = 5;
  m->num_tokens = 20;
  m->shard_size = 2;
  m->data_path = strdup("data.txt");
  m->data_xxh64 = 4;
  m->seed = 9;
  m->features = 1;
  m->kd_topk = 4;
  m->kd_top_p = 0.9;
  m->kd_min_k = 2;
  m->kd_temperature = 1.5;
  m->target_weights_file_xxh64 = 5;
  m->n_shards = 3;
  m->shards = calloc(3, sizeof *m->shards);
  for (int i = 0; i < 3; i++) {
    ds_cache_shard_name(i, m->shards[i].file, sizeof m->shards[i].file);
    m->shards[i].num_samples = i < 2 ? 2 : 1;
    m->shards[i].xxh64 = 100u + (unsigned)i;
  }
}

static int has(const char *msg, const char *a, const char *b, const char *c) {
  return strstr(msg, a) && (!b || strstr(msg, b)) && (!c || strstr(msg, c));
}

static void test_manifest_round_trip(void) {
  ds_cache_manifest m, back;
  sample_manifest(&m);
  char *text = ds_cache_manifest_json(&m);
  EXPECT(text != NULL);
  EXPECT_OK(ds_cache_manifest_parse(text, strlen(text), "m.json", &back));
  char *again = ds_cache_manifest_json(&back);
  EXPECT(again && !strcmp(text, again)); /* deterministic and lossless */
  EXPECT(back.kd_top_p == 0.9 && back.kd_temperature == 1.5 && back.target_weights_xxh64 == m.target_weights_xxh64);
  EXPECT_OK(ds_cache_manifest_same_capture(&back, &m, "m.json"));
  back.shard_size = 3;
  EXPECT(ds_cache_manifest_same_capture(&back, &m, "m.json") != DS_OK &&
         has(ds_last_error(), "shard_size", "3", "2"));
  free(again);
  free(text);
  ds_cache_manifest_free(&back);
  ds_cache_manifest_free(&m);
}

/* target_weights: written when set, read back; a manifest without it (an older capture) reads
 * as ""; a resume compares it like every other capture setting. */
static void test_manifest_target_weights(void) {
  ds_cache_manifest m, back;
  sample_manifest(&m);
  char *text = ds_cache_manifest_json(&m);
  EXPECT(text && !strstr(text, "\"target_weights\":"));
  EXPECT_OK(ds_cache_manifest_parse(text, strlen(text), "m.json", &back));
  EXPECT(back.target_weights[0] == 0);
  free(text);
  ds_cache_manifest_free(&back);
  snprintf(m.target_weights, sizeof m.target_weights, "as-stored");
  text = ds_cache_manifest_json(&m);
  EXPECT(text && strstr(text, "\"target_weights\":\t\"as-stored\""));
  EXPECT_OK(ds_cache_manifest_parse(text, strlen(text), "m.json", &back));
  EXPECT(!strcmp(back.target_weights, "as-stored"));
  EXPECT_OK(ds_cache_manifest_same_capture(&back, &m, "m.json"));
  snprintf(back.target_weights, sizeof back.target_weights, "f32");
  EXPECT(ds_cache_manifest_same_capture(&back, &m, "m.json") == DS_ERR_ARG &&
         has(ds_last_error(), "'target_weights'", "\"f32\" in the cache", "\"as-stored\" in this run"));
  back.target_weights[0] = 0;
  EXPECT(ds_cache_manifest_same_capture(&back, &m, "m.json") == DS_ERR_ARG &&
         has(ds_last_error(), "'target_weights'", "absent (an older capture", "\"as-stored\" in this run"));
  free(text);
  ds_cache_manifest_free(&back);
  ds_cache_manifest_free(&m);
}

static void test_manifest_checks(void) {
  ds_cache_manifest m;
  sample_manifest(&m);
  ds_cache_expect e;
  ds_cache_expect_any(&e);
  EXPECT_OK(ds_cache_manifest_check(&m, &e, "C/manifest.json"));
#define REFUSED(setup, a, b, c)                                                     \
  do {                                                                              \
    ds_cache_expect_any(&e);                                                        \
    setup;                                                                          \
    EXPECT(ds_cache_manifest_check(&m, &e, "C/manifest.json") == DS_ERR_ARG);       \
    if (!has(ds_last_error(), a, b, c)) fprintf(stderr, "message: %s\n", ds_last_error()); \
    EXPECT(has(ds_last_error(), a, b, c));                                          \
  } while (0)
  REFUSED(e.seq_length = 8, "'seq_length'", "6", "8");
  REFUSED(e.vocab_size = 40, "'vocab_size'", "37", "40");
  REFUSED(e.hidden_size = 16, "'hidden_size'", "8", "16");
  REFUSED((e.n_layers = 2, e.layer_ids[0] = 1, e.layer_ids[1] = 2), "'target_layer_ids'", "[0,2]", "[1,2]");
  REFUSED((e.n_layers = 1, e.layer_ids[0] = 0), "'target_layer_ids'", "[0,2]", "[0]");
  REFUSED(e.dtype = DS_F32, "'dtype'", "bf16", "f32");
  REFUSED((e.check_weights = 1, e.target_weights_xxh64 = 7), "'target_weights_xxh64'", "0123456789abcdef",
          "0000000000000007");
  REFUSED((e.check_tokenizer = 1, e.tokenizer_xxh64 = 8), "'tokenizer_xxh64'", "0000000000000003", "0000000000000008");
  REFUSED((e.check_data = 1, e.data_xxh64 = 1), "'data_xxh64'", NULL, NULL);
  m.features = 0;
  REFUSED(e.need_features = 1, "'features'", "--no-features", NULL);
  m.kd_topk = 0;
  REFUSED(e.need_kd = 1, "'kd'", "--topk", NULL);
  m.complete = 0;
  REFUSED((void)0, "'complete'", "rerun", NULL);
  ds_cache_expect_any(&e);
  e.allow_incomplete = 1;
  EXPECT_OK(ds_cache_manifest_check(&m, &e, "C/manifest.json"));
#undef REFUSED
  ds_cache_manifest_free(&m);
}

/* Replaces the first occurrence of `from` in the manifest's JSON and parses. */
static ds_status parse_edited(const char *from, const char *to) {
  ds_cache_manifest m, out;
  sample_manifest(&m);
  char *text = ds_cache_manifest_json(&m);
  ds_cache_manifest_free(&m);
  char *at = strstr(text, from);
  if (!at) {
    fprintf(stderr, "test bug: '%s' not in the manifest\n", from);
    free(text);
    return DS_ERR_INTERNAL;
  }
  size_t n = strlen(text) + strlen(to) + 1;
  char *edited = malloc(n);
  snprintf(edited, n, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
  ds_status st = ds_cache_manifest_parse(edited, strlen(edited), "m.json", &out);
  if (st == DS_OK) ds_cache_manifest_free(&out);
  free(text);
  free(edited);
  return st;
}

static void test_manifest_parse_refusals(void) {
#define BAD(from, to, word)                                                            \
  do {                                                                                 \
    ds_status st_ = parse_edited(from, to);                                            \
    EXPECT(st_ != DS_OK && st_ != DS_ERR_INTERNAL);                                    \
    if (!strstr(ds_last_error(), word)) fprintf(stderr, "message: %s\n", ds_last_error()); \
    EXPECT(strstr(ds_last_error(), word) != NULL);                                     \
  } while (0)
  BAD("\"format_version\":\t2", "\"format_version\":\t1", "format_version");
  BAD("\"seed\"", "\"sed\"", "unknown field 'sed'");
  BAD("\"vocab_size\":\t37", "\"vocab_size\":\t\"37\"", "'vocab_size'");
  BAD("\"dtype\":\t\"bf16\"", "\"dtype\":\t\"int4\"", "'dtype'");
  BAD("\"tokenizer_xxh64\":\t\"0000000000000003\"", "\"tokenizer_xxh64\":\t\"xyz\"", "tokenizer_xxh64");
  BAD("\"target_layer_ids\":\t[0, 2]", "\"target_layer_ids\":\t[2, 0]", "strictly increasing");
  BAD("\"target_layer_ids\":\t[0, 2]", "\"target_layer_ids\":\t[0, 3]", "target_layer_ids[1]");
  BAD("shard-000001", "shard-000007", "shards[1]");
  BAD("\"num_samples\":\t5", "\"num_samples\":\t9", "complete, but the shards hold 5");
  BAD("\"complete\":\ttrue", "\"complete\":\t1", "'complete'");
  BAD("\"features\":\ttrue", "\"features\":\tfalse, \"x\": 1", "unknown field 'x'");
  BAD("\"target_config_xxh64\"", "\"target_weights\": \"q4\", \"target_config_xxh64\"", "'target_weights'");
  BAD("\"target_config_xxh64\"", "\"target_weights\": 1, \"target_config_xxh64\"", "'target_weights'");
  BAD("{", "[", "malformed JSON");
#undef BAD
}

/* ---------------------------------------------------------------- reader and stream */

enum { N = 5, S = 6, D = 8, M = 2, NSHARD = 2 };

static float feature_value(int64_t sample, int64_t t, int64_t j) { return (float)(sample * 1000 + t * 10) + 0.125f * (float)j; }

/* A synthetic f32 cache with N samples, shards of NSHARD (the last partial), lengths 6,5,4,3,2. */
static void write_cache(const char *dir) {
  ds_mkdir_p(dir);
  ds_cache_manifest m;
  sample_manifest(&m);
  m.dtype = DS_F32;
  m.kd_topk = 0;
  m.num_samples = N;
  m.shard_size = NSHARD;
  m.seq_length = S;
  m.hidden_size = D;
  m.n_layers = M;
  m.num_tokens = 0;
  for (int s = 0; s < 3; s++) {
    int64_t n = s < 2 ? NSHARD : 1, lengths[NSHARD];
    int32_t ids[NSHARD * S] = {0};
    uint8_t mask[NSHARD * S] = {0};
    float ctx[NSHARD * S * M * D] = {0}, last[NSHARD * S * D] = {0};
    for (int64_t r = 0; r < n; r++) {
      int64_t sample = s * NSHARD + r, len = S - sample;
      lengths[r] = len;
      m.num_tokens += len;
      for (int64_t t = 0; t < len; t++) {
        ids[r * S + t] = (int32_t)((sample + t) % 37);
        mask[r * S + t] = 1;
        for (int64_t j = 0; j < M * D; j++) ctx[(r * S + t) * M * D + j] = feature_value(sample, t, j);
        for (int64_t j = 0; j < D; j++) last[(r * S + t) * D + j] = -feature_value(sample, t, j);
      }
    }
    int64_t s1[1] = {n}, s2[2] = {n, S}, sf[3] = {n, S, M * D}, sl[3] = {n, S, D};
    ds_st_writer *w = ds_st_writer_new();
    ds_st_writer_add(w, "lengths", DS_I64, 1, s1, lengths);
    ds_st_writer_add(w, "input_ids", DS_I32, 2, s2, ids);
    ds_st_writer_add(w, "loss_mask", DS_U8, 2, s2, mask);
    ds_st_writer_add(w, "target_hidden_states", DS_F32, 3, sf, ctx);
    ds_st_writer_add(w, "target_last_hidden_states", DS_F32, 3, sl, last);
    char *path = ds_path_join(dir, m.shards[s].file);
    EXPECT_OK(ds_st_writer_write(w, path));
    EXPECT_OK(ds_cache_hash_file(path, &m.shards[s].xxh64));
    m.shards[s].num_samples = n;
    free(path);
    ds_st_writer_free(w);
  }
  /* the copies of the target's files that a complete cache holds */
  const char *copies[2] = {"target_config.json", "tokenizer.json"};
  for (int i = 0; i < 2; i++) {
    char *p = ds_path_join(dir, copies[i]);
    EXPECT_OK(ds_write_file_atomic(p, "{}", 2));
    free(p);
  }
  m.target_config_xxh64 = m.tokenizer_xxh64 = ds_cache_hash_string("{}");
  char *text = ds_cache_manifest_json(&m), *path = ds_path_join(dir, "manifest.json");
  EXPECT_OK(ds_write_file_atomic(path, text, strlen(text)));
  free(text);
  free(path);
  ds_cache_manifest_free(&m);
}

static int sample_ok(const ds_cache_sample *s, int64_t idx) {
  if (s->index != idx || s->length != S - idx) return 0;
  for (int64_t t = 0; t < s->length; t++) {
    for (int64_t j = 0; j < M * D; j++)
      if (s->ctx[t * M * D + j] != feature_value(idx, t, j)) return 0;
    for (int64_t j = 0; j < D; j++)
      if (s->last[t * D + j] != -feature_value(idx, t, j)) return 0;
  }
  return 1;
}

static void test_reader_and_stream(void) {
  char dir[600];
  snprintf(dir, sizeof dir, "%s/cache", g_dir);
  write_cache(dir);
  ds_cache_expect e;
  ds_cache_expect_any(&e);
  e.need_features = 1;
  e.seq_length = S;
  ds_cache *c;
  EXPECT_OK(ds_cache_open(dir, &e, &c));
  if (!c) return;
  ds_dataset tok;
  EXPECT_OK(ds_cache_take_tokens(c, &tok));
  EXPECT(tok.n_seqs == N && tok.lengths[4] == 2 && tok.ids[1 * S + 2] == 3 && tok.loss_mask[4 * S + 2] == 0);
  EXPECT(ds_cache_take_tokens(c, &tok) != DS_OK);
  ds_dataset_free(&tok);
  /* An order across shards, with repeats, through rings of depth 2 and 3. */
  const int64_t order[] = {4, 0, 3, 3, 1, 2, 0, 4, 1, 2, 2, 0};
  const int n_order = (int)(sizeof order / sizeof order[0]);
  for (int depth = 2; depth <= 3; depth++) {
    ds_cache_stream *s;
    EXPECT_OK(ds_cache_stream_start(c, depth, 0, &s));
    if (!s) break;
    int pushed = 0, good = 0;
    while (pushed < n_order && ds_cache_stream_space(s) > 0) EXPECT_OK(ds_cache_stream_push(s, order[pushed++]));
    EXPECT(pushed == depth);
    EXPECT(ds_cache_stream_push(s, 0) == DS_ERR_INTERNAL); /* full */
    for (int i = 0; i < n_order; i++) {
      ds_cache_sample smp;
      EXPECT_OK(ds_cache_stream_next(s, &smp));
      good += sample_ok(&smp, order[i]);
      while (pushed < n_order && ds_cache_stream_space(s) > 0) EXPECT_OK(ds_cache_stream_push(s, order[pushed++]));
    }
    EXPECT(good == n_order);
    ds_cache_sample smp;
    EXPECT(ds_cache_stream_next(s, &smp) == DS_ERR_INTERNAL); /* nothing pushed */
    ds_cache_stream_free(s);
  }
  ds_cache_close(c);

  /* A flipped byte in shard 1: opening still works (headers and tokens are fine); the first
   * read of its features reports the checksum through the stream, naming the shard. */
  char path[700];
  snprintf(path, sizeof path, "%s/shard-000001.safetensors", dir);
  FILE *f = fopen(path, "r+b");
  fseek(f, -3, SEEK_END);
  int b = fgetc(f);
  fseek(f, -3, SEEK_END);
  fputc(b ^ 0x40, f);
  fclose(f);
  EXPECT_OK(ds_cache_open(dir, &e, &c));
  if (!c) return;
  ds_cache_stream *s;
  EXPECT_OK(ds_cache_stream_start(c, 2, 0, &s));
  ds_cache_sample smp;
  EXPECT_OK(ds_cache_stream_push(s, 0));
  EXPECT_OK(ds_cache_stream_push(s, 2));
  EXPECT_OK(ds_cache_stream_next(s, &smp));
  EXPECT(sample_ok(&smp, 0));
  EXPECT(ds_cache_stream_next(s, &smp) == DS_ERR_FORMAT);
  EXPECT(has(ds_last_error(), "shard-000001.safetensors", "checksum", NULL));
  ds_cache_stream_free(s);
  ds_cache_close(c);
}

int main(void) {
  const char *base = getenv("DSPARK_TEST_TMP");
  snprintf(g_dir, sizeof g_dir, "%s/test_cache.%ld", base && base[0] ? base : "/tmp", (long)getpid());
  if (ds_mkdir_p(g_dir) != DS_OK) {
    fprintf(stderr, "cannot create %s: %s\n", g_dir, ds_last_error());
    return 2;
  }
  TEST_RUN(test_kd_full_vocab);
  TEST_RUN(test_kd_topk_and_ties);
  TEST_RUN(test_kd_top_p);
  TEST_RUN(test_manifest_round_trip);
  TEST_RUN(test_manifest_checks);
  TEST_RUN(test_manifest_parse_refusals);
  TEST_RUN(test_manifest_target_weights);
  TEST_RUN(test_reader_and_stream);
  return TEST_RESULT();
}
