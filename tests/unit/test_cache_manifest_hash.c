/* The cache manifest's own checksum (issue 7 item 20; include/dspark/cache.h
 * DS_CACHE_MANIFEST_HASH): written first, xxh64 of the file's bytes with its own 16 digits as
 * '0', stable across writes and round trips, verified by the parser after every other check,
 * so an edit of any byte (a valid target_layer_ids, a shard checksum, whitespace) is refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "dspark/cache.h"
#include "test_util.h"

static void make_manifest(ds_cache_manifest *m) {
  memset(m, 0, sizeof *m);
  m->format_version = DS_CACHE_FORMAT_VERSION;
  m->complete = 1;
  m->target_path = strdup("models/t");
  snprintf(m->target_architecture, sizeof m->target_architecture, "Qwen3ForCausalLM");
  snprintf(m->chat_template, sizeof m->chat_template, "%s", DS_CACHE_CHAT_TEMPLATE);
  m->chat_template_xxh64 = ds_cache_hash_string(DS_CACHE_CHAT_TEMPLATE);
  m->target_weights_xxh64 = 11, m->target_config_xxh64 = 12, m->tokenizer_xxh64 = 13;
  m->vocab_size = 50, m->hidden_size = 8, m->num_hidden_layers = 6;
  m->n_layers = 2, m->target_layer_ids[0] = 1, m->target_layer_ids[1] = 3;
  m->dtype = DS_BF16, m->seq_length = 16, m->eos_token_id = 2, m->min_length = 2;
  m->num_samples = 3, m->num_tokens = 30, m->shard_size = 2;
  m->data_path = strdup("d.txt");
  m->data_xxh64 = 14, m->seed = 1, m->features = 1;
  m->kd_top_p = 1, m->kd_min_k = 1, m->kd_temperature = 1;
  m->target_weights_file_xxh64 = 15;
  m->n_shards = 2;
  m->shards = calloc(2, sizeof *m->shards);
  for (int i = 0; i < 2; i++) {
    ds_cache_shard_name(i, m->shards[i].file, sizeof m->shards[i].file);
    m->shards[i].num_samples = i ? 1 : 2;
    m->shards[i].xxh64 = 0xabcdef00u + (unsigned)i;
  }
}

/* Replaces the first occurrence of `from` and parses; returns the status. */
static ds_status parse_with(const char *text, const char *from, const char *to) {
  const char *at = strstr(text, from);
  if (!at) {
    fprintf(stderr, "test bug: '%s' not in the manifest\n", from);
    return DS_ERR_INTERNAL;
  }
  size_t n = strlen(text) + strlen(to) + 1;
  char *edited = malloc(n);
  snprintf(edited, n, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
  ds_cache_manifest out;
  ds_status st = ds_cache_manifest_parse(edited, strlen(edited), "m.json", &out);
  if (st == DS_OK) ds_cache_manifest_free(&out);
  free(edited);
  return st;
}

static void test_written_first_and_documented(void) {
  ds_cache_manifest m, back;
  make_manifest(&m);
  char *text = ds_cache_manifest_json(&m);
  EXPECT(text != NULL);
  if (!text) return;
  EXPECT(!strncmp(text, "{\n\t\"manifest_xxh64\":\t\"", 22));
  /* the documented rule, computed here independently */
  char *zeroed = strdup(text);
  memset(zeroed + 22, '0', 16);
  char hex[17];
  ds_cache_hex(XXH64(zeroed, strlen(zeroed), 0), hex);
  EXPECT(!strncmp(text + 22, hex, 16));
  EXPECT_OK(ds_cache_manifest_parse(text, strlen(text), "m.json", &back));
  EXPECT(back.manifest_xxh64 == strtoull(hex, NULL, 16));
  /* stable: the same manifest, and its round trip, give the same bytes */
  char *again = ds_cache_manifest_json(&m), *round = ds_cache_manifest_json(&back);
  EXPECT(again && round && !strcmp(again, text) && !strcmp(round, text));
  free(again);
  free(round);
  free(zeroed);
  free(text);
  ds_cache_manifest_free(&back);
  ds_cache_manifest_free(&m);
}

static void test_every_edit_refused(void) {
  ds_cache_manifest m;
  make_manifest(&m);
  char *text = ds_cache_manifest_json(&m);
  ds_cache_manifest_free(&m);
#define REFUSED(from, to, word)                                                                  \
  do {                                                                                           \
    ds_status st_ = parse_with(text, from, to);                                                  \
    EXPECT(st_ != DS_OK && st_ != DS_ERR_INTERNAL);                                              \
    if (!strstr(ds_last_error(), word)) fprintf(stderr, "message: %s\n", ds_last_error());       \
    EXPECT(strstr(ds_last_error(), word) != NULL);                                               \
  } while (0)
  /* valid values, so only the checksum can tell */
  REFUSED("\"target_layer_ids\":\t[1, 3]", "\"target_layer_ids\":\t[0, 3]", "checksum mismatch");
  REFUSED("\"seed\":\t1", "\"seed\":\t2", "checksum mismatch");
  REFUSED("\"xxh64\":\t\"00000000abcdef00\"", "\"xxh64\":\t\"00000000abcdef01\"", "checksum mismatch");
  REFUSED("\"complete\":\ttrue", "\"complete\": true", "checksum mismatch");
  REFUSED("\n}", "\n}\n", "checksum mismatch"); /* any byte */
  /* the field must come first, as the writer puts it: move its line after "format" */
  const char *line = strstr(text, "\t\"manifest_xxh64\"");
  const char *next = strchr(line, '\n') + 1;
  const char *fmt_end = strchr(strstr(text, "\t\"format\":"), '\n') + 1;
  size_t n = strlen(text) + 1;
  char *moved = malloc(n);
  snprintf(moved, n, "%.*s%.*s%.*s%s", (int)(line - text), text, (int)(fmt_end - next), next, (int)(next - line),
           line, fmt_end);
  ds_cache_manifest out;
  ds_status st = ds_cache_manifest_parse(moved, strlen(moved), "m.json", &out);
  EXPECT(st != DS_OK && strstr(ds_last_error(), "first field") != NULL);
  if (st == DS_OK) ds_cache_manifest_free(&out);
  else if (!strstr(ds_last_error(), "first field")) fprintf(stderr, "message: %s\n", ds_last_error());
  free(moved);
  /* the other checks come first, so a damaged field is still named by its own message */
  REFUSED(",\n\t\"format\":", ", \"extra\": 1,\n\t\"format\":", "unknown field 'extra'"); /* field checks come first */
  free(text);
#undef REFUSED
}

int main(void) {
  TEST_RUN(test_written_first_and_documented);
  TEST_RUN(test_every_edit_refused);
  return TEST_RESULT();
}
