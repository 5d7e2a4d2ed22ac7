/* The readers of `calibrate` and `profile` files (include/dspark/spec_files.h) on a tiny draft and
 * a target directory holding only config.json: a file of this draft and target is read whole,
 * and every refusal (no JSON, another target, a bad cost) leaves no array and no count behind,
 * whatever the caller's variables held (fuzz/fuzz_spec_files found a refused profile leaving
 * its verification count, and a file that is no JSON leaving both untouched); the JSON is read
 * strictly, as every other reader's (text after the value is refused). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dspark/backend.h"
#include "dspark/draft.h"
#include "dspark/model_source.h"
#include "dspark/spec_files.h"
#include "support/tiny_draft.h"
#include "test_util.h"

enum { V = 41, DM = 16, G = 7 };

static char g_dir[512];
static ds_draft *g_draft;
static ds_model_source *g_target;
static char g_id[24], g_hash[24];

static ds_draft *tiny_draft(float *table) {
  ds_draft_config c = tiny_draft_config(V, 1, G, DS_MARKOV_VANILLA, 1);
  c.num_target_layers = 4; /* layers 1 and 2 of 4, rank 4: the identity the seeds carry */
  c.target_layer_ids[1] = 2;
  c.markov_rank = 4;
  for (int i = 0; i < V * DM; i++) table[i] = (float)(i % 13 - 6) / 64;
  ds_draft *d = NULL;
  EXPECT_OK(ds_draft_new(&c, (ds_weight){table, DS_F32}, (ds_weight){table, DS_F32}, 1, ds_backend_cpu(), &d));
  return d;
}

/* DIR/name with the text; its path in a static buffer. */
static const char *write_file(const char *name, const char *text) {
  static char path[600];
  snprintf(path, sizeof path, "%s/%s", g_dir, name);
  FILE *f = fopen(path, "wb");
  EXPECT(f != NULL);
  if (f) {
    fputs(text, f);
    fclose(f);
  }
  return path;
}

/* A profile with the given target hash and verification costs, of this draft. */
static const char *profile(const char *name, const char *hash, const char *verify) {
  char text[1024];
  snprintf(text, sizeof text,
           "{\"target_config_xxh64\": \"%s\", \"draft_identity\": \"%s\", \"block_size\": %d, \"verify_seconds\": %s, "
           "\"head_seconds\": [1e-4, 2e-4], \"draft_block_seconds\": [1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3]}",
           hash, g_id, G, verify);
  return write_file(name, text);
}

/* Reads path as a profile from outputs set to garbage; on a refusal all of them must be cleared. */
static ds_status read_profile(const char *path, int64_t *n_verify, int64_t *n_head, int64_t *n_draft) {
  double junk[1], *v = junk, *h = junk, *d = junk;
  *n_verify = *n_head = *n_draft = 99;
  ds_status st = ds_spec_read_profile(path, g_target, g_draft, "tiny-draft", &v, n_verify, &h, n_head, &d, n_draft);
  if (st != DS_OK) EXPECT(!v && !h && !d && *n_verify == 0 && *n_head == 0 && *n_draft == 0);
  else EXPECT(v && h && d && v[0] > 0);
  if (st == DS_OK) free(v), free(h), free(d);
  return st;
}

static void test_profile(void) {
  int64_t nv, nh, nd;
  EXPECT_OK(read_profile(profile("good.json", g_hash, "[1e-3, 2e-3, 3e-3]"), &nv, &nh, &nd));
  EXPECT(nv == 3 && nh == 2 && nd == G);
  /* refused after the verification costs were read: another target, a bad later field */
  EXPECT(read_profile(profile("other-target.json", "0123456789abcdef", "[1e-3]"), &nv, &nh, &nd) == DS_ERR_ARG);
  EXPECT(read_profile(write_file("bad-head.json", "{\"verify_seconds\": [1e-3], \"head_seconds\": [0]}"), &nv, &nh,
                      &nd) == DS_ERR_FORMAT);
  /* refused before anything was read: no JSON, a bad first cost, no file */
  EXPECT(read_profile(write_file("not-json.json", "not json"), &nv, &nh, &nd) == DS_ERR_FORMAT);
  EXPECT(read_profile(profile("bad-verify.json", g_hash, "[1e-3, -1]"), &nv, &nh, &nd) == DS_ERR_FORMAT);
  /* strict JSON: text after the value (a file cut and pasted together), a value that is no object */
  EXPECT(read_profile(write_file("trailing.json", "{\"verify_seconds\": [1e-3]}\n}"), &nv, &nh, &nd) == DS_ERR_FORMAT);
  EXPECT(strstr(ds_last_error(), "trailing.json") && strstr(ds_last_error(), "after the end"));
  EXPECT(read_profile(write_file("array.json", "[1e-3]"), &nv, &nh, &nd) == DS_ERR_FORMAT);
  char missing[600];
  snprintf(missing, sizeof missing, "%s/missing.json", g_dir);
  EXPECT(read_profile(missing, &nv, &nh, &nd) != DS_OK);
}

static void test_calibration(void) {
  char text[512];
  snprintf(text, sizeof text, "{\"draft_identity\": \"%s\", \"block_size\": %d, \"draft_len\": 3, "
           "\"temperatures\": [1.5, 0.5, 0.125]}", g_id, G);
  const char *path = write_file("calibration.json", text);
  double junk[1], *T = junk;
  int64_t n = 99;
  EXPECT_OK(ds_spec_read_calibration(path, g_draft, "tiny-draft", 3, &T, &n));
  EXPECT(n == 3 && T && T[2] == 0.125);
  free(T);
  /* four positions drafted, three fitted; then no JSON */
  T = junk, n = 99;
  EXPECT(ds_spec_read_calibration(path, g_draft, "tiny-draft", 4, &T, &n) == DS_ERR_ARG);
  EXPECT(!T && n == 0);
  T = junk, n = 99;
  EXPECT(ds_spec_read_calibration(write_file("cal-not-json.json", "[1"), g_draft, "tiny-draft", 1, &T, &n) != DS_OK);
  EXPECT(!T && n == 0);
}

/* The mean ECE of a report counts the positions some round drafted, not those none reached (a
 * scheduler's report held 0.70 at position 2 from 2 rounds and nothing after: the mean over all 7
 * was 0.108, over the two drafted 0.38). */
static void test_ece_mean(void) {
  ds_spec_rounds r;
  ds_spec_rounds_init(&r, 3);
  float conf[3] = {1.5f, -0.5f, 0.25f};
  for (int i = 0; i < 8; i++) ds_spec_rounds_add(&r, 0, conf, 1, 1, i % 3 == 0); /* position 1 only */
  ds_spec_rounds_add(&r, 0, conf, 2, 2, 1);                                       /* one reaches 2 */
  ds_round_set set = ds_spec_rounds_set(&r, NULL);
  int64_t n[3];
  double e[3];
  for (int k = 0; k < 3; k++) e[k] = ds_cumulative_ece(&set, k, NULL, &n[k]);
  EXPECT(n[0] == 9 && n[1] == 1 && n[2] == 0 && e[0] > 0 && e[1] > 0);
  EXPECT_CLOSE(ds_ece_mean(&set, NULL), (e[0] + e[1]) / 2, 1e-15, 0);
  double T[3] = {2, 0.5, 1};
  EXPECT_CLOSE(ds_ece_mean(&set, T), (ds_cumulative_ece(&set, 0, T, NULL) + ds_cumulative_ece(&set, 1, T, NULL)) / 2,
               1e-15, 0);
  ds_round_set none = set;
  none.n = 0;
  EXPECT(ds_ece_mean(&none, NULL) == 0);
  ds_spec_rounds_free(&r);
}

int main(void) {
  const char *base = getenv("DSPARK_TEST_TMP") ? getenv("DSPARK_TEST_TMP") : "/tmp";
  mkdir(base, 0755);
  snprintf(g_dir, sizeof g_dir, "%s/spec-files", base);
  mkdir(g_dir, 0755);
  write_file("config.json", "{\"model_type\": \"qwen3\", \"vocab_size\": 41, \"hidden_size\": 16}\n");
  static float table[V * DM];
  g_draft = tiny_draft(table);
  EXPECT_OK(ds_model_source_open(g_dir, &g_target));
  if (!g_draft || !g_target) return 1;
  cJSON *ids = cJSON_CreateObject();
  ds_spec_add_draft_identity(ids, g_draft);
  EXPECT_OK(ds_spec_add_target_identity(ids, g_target));
  snprintf(g_id, sizeof g_id, "%s", cJSON_GetObjectItem(ids, "draft_identity")->valuestring);
  snprintf(g_hash, sizeof g_hash, "%s", cJSON_GetObjectItem(ids, "target_config_xxh64")->valuestring);
  cJSON_Delete(ids);
  TEST_RUN(test_profile);
  TEST_RUN(test_calibration);
  TEST_RUN(test_ece_mean);
  ds_model_source_close(g_target);
  ds_draft_free(g_draft);
  return TEST_RESULT();
}
