/* libFuzzer target for the files `dspark speculate` reads from `calibrate` and `profile`
 * (ds_spec_read_calibration, ds_spec_read_profile): a user may pass any JSON as --calibration or
 * --profile. Each input is written to a file and read by both readers as it is, then once more
 * sealed (its "draft_identity", "block_size", "draft_weights" and "target_config_xxh64" set to
 * those of the tiny draft and target made at start, as the commands write them) so that mutations
 * reach acceptance. Findings: a crash or undefined behaviour; an accepted file whose values
 * break the readers' promises (counts as the file's arrays and "draft_len" give them, every
 * value finite and > 0 and the file's own, drafted <= fitted <= block size, draft costs per
 * block length of this draft or none); a refusal that leaves an array or a count behind. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dspark/backend.h"
#include "dspark/draft.h"
#include "dspark/model_source.h"
#include "dspark/spec_files.h"
#include "support/tiny_draft.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { V = 41, DM = 16, G = 7 }; /* G: the commands' default block size */

static ds_draft *g_draft;
static ds_model_source *g_target;
static char g_dir[64], g_input[96], g_config[96];
static char g_draft_id[24], g_target_hash[24];

/* The unit tests' tiny draft (tests/unit/support/tiny_draft.h) with fixed weights, so that its
 * identity is the same on every machine: the seeds in fuzz/corpus/spec_files carry it. */
static ds_draft *tiny_draft(void) {
  ds_draft_config c = tiny_draft_config(V, 1, G, DS_MARKOV_VANILLA, 1);
  c.num_target_layers = 4; /* layers 1 and 2 of 4, rank 4: the identity the seeds carry */
  c.target_layer_ids[1] = 2;
  c.markov_rank = 4;
  static float table[V * DM];
  for (int i = 0; i < V * DM; i++) table[i] = (float)(i % 13 - 6) / 64;
  ds_draft *d = NULL;
  if (ds_draft_new(&c, (ds_weight){table, DS_F32}, (ds_weight){table, DS_F32}, 1, ds_backend_cpu(), &d) != DS_OK)
    abort();
  float *p = ds_draft_params(d);
  for (size_t i = 0; i < ds_draft_num_params(d); i++) p[i] = (float)((int)(i % 29) - 14) / 256;
  return d;
}

static void cleanup(void) {
  unlink(g_input);
  unlink(g_config);
  rmdir(g_dir);
}

/* The draft, and a target directory holding only config.json (all the readers hash), in a
 * mkdtemp folder removed at exit. */
static void init(void) {
  snprintf(g_dir, sizeof g_dir, "/tmp/fuzz_spec_files.XXXXXX");
  if (!mkdtemp(g_dir)) abort();
  snprintf(g_input, sizeof g_input, "%s/input.json", g_dir);
  snprintf(g_config, sizeof g_config, "%s/config.json", g_dir);
  atexit(cleanup);
  static const char config[] =
      "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"vocab_size\": 41, \"hidden_size\": 16, "
      "\"intermediate_size\": 24, \"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
      "\"head_dim\": 8, \"rms_norm_eps\": 1e-06, \"rope_theta\": 10000.0, \"max_position_embeddings\": 512}\n";
  FILE *f = fopen(g_config, "wb");
  if (!f || fwrite(config, 1, sizeof config - 1, f) != sizeof config - 1 || fclose(f)) abort();
  if (ds_model_source_open(g_dir, &g_target) != DS_OK) abort();
  g_draft = tiny_draft();
  cJSON *ids = cJSON_CreateObject();
  ds_spec_add_draft_identity(ids, g_draft);
  if (ds_spec_add_target_identity(ids, g_target) != DS_OK) abort();
  snprintf(g_draft_id, sizeof g_draft_id, "%s", cJSON_GetObjectItem(ids, "draft_identity")->valuestring);
  snprintf(g_target_hash, sizeof g_target_hash, "%s", cJSON_GetObjectItem(ids, "target_config_xxh64")->valuestring);
  cJSON_Delete(ids);
}

static void write_input(const char *text, size_t len) {
  unlink(g_input); /* a new file: ext4 flushes a file truncated and rewritten at close (8 ms) */
  FILE *f = fopen(g_input, "wb");
  if (!f || (len && fwrite(text, 1, len, f) != len) || fclose(f)) abort();
}

static const cJSON *field(const cJSON *j, const char *key) { return cJSON_GetObjectItemCaseSensitive(j, key); }

/* v[0..n) is the file's array `key`, entry for entry, each finite and > 0. */
static void check_array(const cJSON *j, const char *key, const double *v, int64_t n) {
  const cJSON *a = field(j, key);
  if (!v || n < 1 || !cJSON_IsArray(a) || cJSON_GetArraySize(a) != n) __builtin_trap();
  int64_t i = 0;
  for (const cJSON *e = a->child; e; e = e->next, i++)
    if (!cJSON_IsNumber(e) || !isfinite(v[i]) || !(v[i] > 0) || v[i] != e->valuedouble) __builtin_trap();
}

static int is_string(const cJSON *j, const char *key, const char *want) {
  const cJSON *s = field(j, key);
  return cJSON_IsString(s) && !strcmp(s->valuestring, want);
}

/* The file names this draft: identity, block size and weights ("f32" when absent). */
static int names_the_draft(const cJSON *j) {
  const cJSON *bs = field(j, "block_size"), *w = field(j, "draft_weights");
  return is_string(j, "draft_identity", g_draft_id) && cJSON_IsNumber(bs) && bs->valuedouble == G &&
         (!w || is_string(j, "draft_weights", ds_draft_weights_name(ds_draft_decode_weights(g_draft))));
}

static void read_calibration(const char *text, size_t len, int64_t drafted) {
  write_input(text, len);
  double sentinel, *T = &sentinel; /* the reader must clear it */
  int64_t n = -1;
  if (ds_spec_read_calibration(g_input, g_draft, "fuzz-draft", drafted, &T, &n) != DS_OK) {
    if (T || n) __builtin_trap();
    return;
  }
  /* accepted: the file is an object of this draft, one temperature per fitted position */
  cJSON *j = cJSON_ParseWithLength(text, len);
  const cJSON *fitted = field(j, "draft_len");
  if (!cJSON_IsObject(j) || !is_string(j, "draft_identity", g_draft_id) || !cJSON_IsNumber(field(j, "block_size")) ||
      field(j, "block_size")->valuedouble != G || !cJSON_IsNumber(fitted) || fitted->valuedouble != (double)n ||
      n > G || drafted > n)
    __builtin_trap();
  check_array(j, "temperatures", T, n);
  cJSON_Delete(j);
  free(T);
}

static void read_profile(const char *text, size_t len) {
  write_input(text, len);
  double sentinel, *verify = &sentinel, *head = &sentinel, *draft = &sentinel; /* the reader must clear them */
  int64_t n_verify = -1, n_head = -1, n_draft = -1;
  if (ds_spec_read_profile(g_input, g_target, g_draft, "fuzz-draft", &verify, &n_verify, &head, &n_head, &draft,
                           &n_draft) != DS_OK) {
    if (verify || head || draft || n_verify || n_head || n_draft) __builtin_trap();
    return;
  }
  cJSON *j = cJSON_ParseWithLength(text, len);
  if (!cJSON_IsObject(j)) __builtin_trap();
  /* another target's costs are refused; none recorded is taken as given */
  if (field(j, "target_config_xxh64") && !is_string(j, "target_config_xxh64", g_target_hash)) __builtin_trap();
  check_array(j, "verify_seconds", verify, n_verify);
  if (field(j, "head_seconds")) check_array(j, "head_seconds", head, n_head);
  else if (head || n_head) __builtin_trap();
  /* draft costs: kept when they are this draft's (one per block length) or name no draft,
   * dropped when another's */
  if (!field(j, "draft_block_seconds") || (field(j, "draft_identity") && !names_the_draft(j))) {
    if (draft || n_draft) __builtin_trap();
  } else {
    check_array(j, "draft_block_seconds", draft, n_draft);
    if (field(j, "draft_identity") && n_draft != G) __builtin_trap();
  }
  cJSON_Delete(j);
  free(verify);
  free(head);
  free(draft);
}

static void set_field(cJSON *j, const char *key, cJSON *v) {
  if (field(j, key)) cJSON_ReplaceItemInObjectCaseSensitive(j, key, v);
  else cJSON_AddItemToObject(j, key, v);
}

/* The input with the identity fields of the tiny draft and target; NULL when it is no object. */
static char *sealed(const uint8_t *data, size_t size) {
  cJSON *j = cJSON_ParseWithLength((const char *)data, size);
  if (!cJSON_IsObject(j)) {
    cJSON_Delete(j);
    return NULL;
  }
  set_field(j, "draft_identity", cJSON_CreateString(g_draft_id));
  set_field(j, "block_size", cJSON_CreateNumber(G));
  set_field(j, "draft_weights", cJSON_CreateString(ds_draft_weights_name(ds_draft_decode_weights(g_draft))));
  set_field(j, "target_config_xxh64", cJSON_CreateString(g_target_hash));
  char *text = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  return text;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!g_draft) init();
  int64_t drafted = 1 + (int64_t)(size % G); /* speculate's --draft-len, 1 .. G */
  read_calibration((const char *)data, size, drafted);
  read_profile((const char *)data, size);
  char *text = sealed(data, size);
  if (text) {
    read_calibration(text, strlen(text), drafted);
    read_profile(text, strlen(text));
    free(text);
  }
  return 0;
}
