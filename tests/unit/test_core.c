/* dtype conversion (against exhaustive / hand-checked values), the RNG, errors, config.json
 * parsing including every refusal, and the huge-page allocation of frozen weights. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "dspark/dtype.h"
#include "dspark/hfconfig.h"
#include "dspark/rng.h"
#include "test_util.h"

static void test_bf16(void) {
  EXPECT(ds_f32_to_bf16(1.0f) == 0x3f80);
  EXPECT(ds_bf16_to_f32(0x3f80) == 1.0f);
  /* Round to nearest even: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 -> 1 (even). */
  EXPECT(ds_f32_to_bf16(1.0f + 1.0f / 256.0f) == 0x3f80);
  EXPECT(ds_f32_to_bf16(1.0f + 3.0f / 256.0f) == 0x3f82);
  EXPECT(isnan(ds_bf16_to_f32(ds_f32_to_bf16(NAN))));
  EXPECT(ds_bf16_to_f32(ds_f32_to_bf16(INFINITY)) == INFINITY);
  /* Every bf16 value round-trips exactly. */
  int bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = ds_bf16_to_f32((uint16_t)h);
    if (!isnan(f) && ds_f32_to_bf16(f) != h) bad++;
  }
  EXPECT(bad == 0);
}

static void test_f16(void) {
  EXPECT(ds_f16_to_f32(0x3c00) == 1.0f);
  EXPECT(ds_f16_to_f32(0x7bff) == 65504.0f);
  EXPECT(ds_f16_to_f32(0x0001) == ldexpf(1.0f, -24));
  EXPECT(ds_f32_to_f16(65520.0f) == 0x7c00);  /* ties to even past max -> inf */
  EXPECT(ds_f32_to_f16(65519.0f) == 0x7bff);
  EXPECT(ds_f32_to_f16(ldexpf(1.0f, -25)) == 0x0000); /* tie to even -> 0 */
  EXPECT(ds_f32_to_f16(ldexpf(3.0f, -25)) == 0x0002);
  int bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = ds_f16_to_f32((uint16_t)h);
    if (!isnan(f) && ds_f32_to_f16(f) != h) bad++;
  }
  EXPECT(bad == 0);
  float src[3] = {0.5f, -2.0f, 3.0f}, back[3];
  uint16_t mid[3];
  EXPECT_OK(ds_convert_from_f32(mid, DS_F16, src, 3));
  EXPECT_OK(ds_convert_to_f32(back, mid, DS_F16, 3));
  EXPECT(!memcmp(src, back, sizeof src));
  EXPECT(ds_convert_to_f32(back, mid, DS_I32, 3) == DS_ERR_UNSUPPORTED);
}

static void test_rng(void) {
  ds_rng a, b;
  ds_rng_seed(&a, 7);
  ds_rng_seed(&b, 7);
  int same = 1;
  for (int i = 0; i < 100; i++) same &= ds_rng_next_u64(&a) == ds_rng_next_u64(&b);
  EXPECT(same);
  double mean = 0;
  for (int i = 0; i < 100000; i++) {
    float u = ds_rng_uniform_f32(&a);
    EXPECT(u >= 0.0f && u < 1.0f);
    mean += u;
  }
  EXPECT_CLOSE(mean / 100000, 0.5, 0, 0.01);
  EXPECT(ds_seed_mix(1, 2) != ds_seed_mix(2, 1));
}

static ds_status parse(const char *json, ds_model_config *c) {
  return ds_config_parse(json, strlen(json), "config.json", c);
}

#define BASE "\"vocab_size\": 100, \"hidden_size\": 32, \"intermediate_size\": 64, " \
             "\"num_hidden_layers\": 2, \"num_attention_heads\": 4"

static void test_config(void) {
  ds_model_config c;
  EXPECT_OK(parse("{\"architectures\": [\"Qwen3ForCausalLM\"], " BASE ", \"num_key_value_heads\": 2, "
                  "\"head_dim\": 16, \"rope_theta\": 1000000, \"tie_word_embeddings\": true}", &c));
  EXPECT(c.arch == DS_ARCH_QWEN3 && c.qk_norm && !c.attention_bias && c.head_dim == 16 && c.tie_word_embeddings);
  EXPECT(c.rope_theta == 1e6 && c.rope_type == DS_ROPE_DEFAULT && c.num_key_value_heads == 2);

  EXPECT_OK(parse("{\"architectures\": [\"Qwen2ForCausalLM\"], " BASE ", \"num_key_value_heads\": 4, "
                  "\"eos_token_id\": [5, 7]}", &c));
  EXPECT(c.arch == DS_ARCH_QWEN2 && c.attention_bias && !c.o_proj_bias && c.head_dim == 8 && c.n_eos == 2);

  EXPECT_OK(parse("{\"model_type\": \"llama\", " BASE ", \"rope_parameters\": {\"rope_type\": \"llama3\", "
                  "\"rope_theta\": 500000.0, \"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                  "\"original_max_position_embeddings\": 8192}}", &c));
  EXPECT(c.arch == DS_ARCH_LLAMA && c.rope_type == DS_ROPE_LLAMA3 && c.rope_theta == 500000.0 && c.rope_factor == 8.0);

  EXPECT_OK(parse("{\"model_type\": \"llama\", " BASE ", \"rope_theta\": 10000, \"rope_scaling\": {\"type\": \"linear\", "
                  "\"factor\": 2.0}}", &c));
  EXPECT(c.rope_type == DS_ROPE_LINEAR && c.rope_factor == 2.0);
  /* transformers 5: a non-empty rope_scaling replaces rope_parameters (its rope_theta too) */
  EXPECT_OK(parse("{\"model_type\": \"llama\", " BASE ", \"rope_parameters\": {\"rope_type\": \"default\", "
                  "\"rope_theta\": 500.0}, \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}}", &c));
  EXPECT(c.rope_type == DS_ROPE_LINEAR && c.rope_factor == 2.0 && c.rope_theta == 10000.0);

  /* Refusals, each naming the field. */
  struct { const char *json; const char *needle; ds_status st; } bad[] = {
      {"{\"architectures\": [\"GPT2LMHeadModel\"], " BASE "}", "GPT2LMHeadModel", DS_ERR_UNSUPPORTED},
      {"{\"model_type\": \"llama\", \"vocab_size\": null}", "vocab_size", DS_ERR_FORMAT},
      {"{\"model_type\": \"qwen3\", " BASE ", \"num_key_value_heads\": 2, \"head_dim\": null}", "head_dim", DS_ERR_FORMAT},
      {"{\"model_type\": \"llama\", \"hidden_size\": 30, \"num_attention_heads\": 4, \"head_dim\": 16}", "hidden_size",
       DS_ERR_FORMAT},
      {"{\"model_type\": \"qwen3\", " BASE "}", "num_key_value_heads", DS_ERR_FORMAT},
      {"{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8}}",
       "low_freq_factor", DS_ERR_FORMAT},
      {"{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {\"type\": \"linear\"}}", "factor", DS_ERR_FORMAT},
      {"{\"model_type\": \"llama\", " BASE ", \"eos_token_id\": []}", "eos_token_id", DS_ERR_FORMAT},
      {"{\"model_type\": \"llama\", " BASE ", \"num_key_value_heads\": 3}", "num_key_value_heads", DS_ERR_FORMAT},
      {"{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}}", "yarn",
       DS_ERR_UNSUPPORTED},
      {"{\"model_type\": \"qwen2\", " BASE ", \"num_key_value_heads\": 2, \"use_sliding_window\": true}",
       "use_sliding_window", DS_ERR_UNSUPPORTED},
      {"{\"model_type\": \"llama\", " BASE ", \"hidden_act\": \"gelu\"}", "hidden_act", DS_ERR_UNSUPPORTED},
      {"{\"model_type\": \"llama\", \"vocab_size\": -3, \"hidden_size\": 32, \"intermediate_size\": 64, "
       "\"num_hidden_layers\": 2, \"num_attention_heads\": 4}", "vocab_size", DS_ERR_FORMAT},
      {"{\"model_type\": \"llama\", " BASE ", \"rms_norm_eps\": \"x\"}", "rms_norm_eps", DS_ERR_FORMAT},
      {"{\"model_type\": \"llama\", " BASE, "malformed JSON", DS_ERR_FORMAT},
      {"[1, 2]", "object", DS_ERR_FORMAT},
      /* domains: each numeric field, also where rope_parameters sits beside rope_scaling */
      {"{\"model_type\": \"llama\", " BASE ", \"rope_parameters\": {\"rope_type\": \"default\"}, "
       "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}}", "yarn", DS_ERR_UNSUPPORTED},
      {"{\"model_type\": \"llama\", " BASE ", \"rope_theta\": -5}", "'rope_theta' = -5", DS_ERR_FORMAT},
      {"{\"model_type\": \"llama\", " BASE ", \"rope_theta\": 0}", "'rope_theta' = 0", DS_ERR_FORMAT},
      {"{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 0, "
       "\"low_freq_factor\": 1, \"high_freq_factor\": 4}}", "'factor' = 0", DS_ERR_FORMAT},
      {"{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, "
       "\"low_freq_factor\": 1, \"high_freq_factor\": 4, \"original_max_position_embeddings\": 0}}",
       "original_max_position_embeddings", DS_ERR_FORMAT},
      {"{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, "
       "\"low_freq_factor\": 0, \"high_freq_factor\": 4}}", "'low_freq_factor' = 0", DS_ERR_FORMAT},
      {"{\"model_type\": \"llama\", " BASE ", \"rms_norm_eps\": 0}", "'rms_norm_eps' = 0", DS_ERR_FORMAT},
      {"{\"model_type\": \"llama\", " BASE ", \"bos_token_id\": 100}", "'bos_token_id' = 100", DS_ERR_FORMAT},
      {"{\"model_type\": \"llama\", " BASE ", \"eos_token_id\": [5, 100]}", "'eos_token_id'[1] = 100", DS_ERR_FORMAT},
      {"{" BASE "}", "architectures", DS_ERR_FORMAT},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ds_error_clear();
    ds_status st = parse(bad[i].json, &c);
    EXPECT(st == bad[i].st);
    if (!strstr(ds_last_error(), bad[i].needle) || !strstr(ds_last_error(), "config.json"))
      fprintf(stderr, "case %zu: message '%s' lacks '%s'\n", i, ds_last_error(), bad[i].needle), g_test_failures++;
  }
}

/* Fields config.json leaves out take the family's transformers config class defaults
 * (transformers 5.x LlamaConfig / Qwen2Config / Qwen3Config; the conformance test
 * test_hardening_model.py compares every family with the installed transformers). */
static void test_config_defaults(void) {
  ds_model_config c;
  EXPECT_OK(parse("{\"architectures\": [\"Qwen3ForCausalLM\"]}", &c));
  EXPECT(c.vocab_size == 151936 && c.hidden_size == 4096 && c.intermediate_size == 22016 &&
         c.num_hidden_layers == 32 && c.num_attention_heads == 32 && c.num_key_value_heads == 32 &&
         c.head_dim == 128 && c.max_position_embeddings == 32768 && c.rms_norm_eps == 1e-6 &&
         c.rope_theta == 10000.0 && !c.tie_word_embeddings && c.bos_token_id == -1 && c.n_eos == 0);
  EXPECT(strstr(c.defaulted, "head_dim=128") != NULL);
  /* Qwen3's head_dim is 128 whatever hidden_size / num_attention_heads is. */
  EXPECT_OK(parse("{\"model_type\": \"qwen3\", " BASE ", \"num_key_value_heads\": 2}", &c));
  EXPECT(c.head_dim == 128 && c.max_position_embeddings == 32768);
  EXPECT_OK(parse("{\"model_type\": \"qwen2\", \"hidden_size\": 256, \"num_attention_heads\": 6, "
                  "\"num_key_value_heads\": null}", &c));
  EXPECT(c.head_dim == 42 && c.num_key_value_heads == 6 && c.vocab_size == 151936 && c.attention_bias);
  EXPECT_OK(parse("{\"model_type\": \"llama\", \"hidden_size\": 256, \"num_attention_heads\": 8}", &c));
  EXPECT(c.vocab_size == 32000 && c.intermediate_size == 11008 && c.head_dim == 32 && c.num_key_value_heads == 8 &&
         c.max_position_embeddings == 2048 && c.bos_token_id == 1 && c.n_eos == 1 && c.eos_token_ids[0] == 2);
  /* generate()'s stop set without generation_config.json is config.json's value as written. */
  EXPECT(c.n_stop == 0);
  EXPECT_OK(parse("{\"model_type\": \"llama\", " BASE ", \"max_position_embeddings\": 4096, \"rope_scaling\": "
                  "{\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, \"high_freq_factor\": 4}}", &c));
  EXPECT(c.rope_original_max_position_embeddings == 4096);
  /* generation_config.json replaces the stop set; without eos_token_id there is none. */
  EXPECT_OK(parse("{\"model_type\": \"qwen2\", " BASE ", \"num_key_value_heads\": 2, \"eos_token_id\": 7}", &c));
  EXPECT(c.n_stop == 1 && ds_config_is_stop_token(&c, 7));
  const char *gen = "{\"eos_token_id\": [7, 9]}";
  EXPECT_OK(ds_config_apply_generation_config(&c, gen, strlen(gen), "generation_config.json"));
  EXPECT(c.n_stop == 2 && ds_config_is_stop_token(&c, 9) && c.n_eos == 1);
  gen = "{\"do_sample\": true}";
  EXPECT_OK(ds_config_apply_generation_config(&c, gen, strlen(gen), "generation_config.json"));
  EXPECT(c.n_stop == 0 && !ds_config_is_stop_token(&c, 7));
  const char *bad_gen[] = {"{\"eos_token_id\": 100}", "{\"eos_token_id\": \"7\"}", "{\"eos_token_id\": []}", "[7]", "{"};
  for (size_t i = 0; i < sizeof bad_gen / sizeof bad_gen[0]; i++) {
    ds_error_clear();
    EXPECT(ds_config_apply_generation_config(&c, bad_gen[i], strlen(bad_gen[i]), "generation_config.json") != DS_OK);
    EXPECT(strstr(ds_last_error(), "generation_config.json") != NULL);
  }
  /* The position limit names the file, the limit and the option. */
  ds_error_clear();
  EXPECT(ds_config_check_positions(&c, "m/config.json", 32769, "--seq-len") == DS_ERR_ARG);
  EXPECT(strstr(ds_last_error(), "m/config.json") && strstr(ds_last_error(), "32768") &&
         strstr(ds_last_error(), "--seq-len"));
  EXPECT_OK(ds_config_check_positions(&c, "m/config.json", 32768, "--seq-len"));
}

static void test_malloc_huge(void) {
  const size_t mib2 = (size_t)2 << 20;
  unsigned char *small = ds_malloc_huge(1000, "test");
  EXPECT(small != NULL && (uintptr_t)small % 64 == 0);
  if (small) memset(small, 1, 1000);
  ds_free_aligned(small);
  size_t n = 3 * mib2 + 12345; /* not a multiple: the last 2 MiB are the caller's too */
  unsigned char *big = ds_malloc_huge(n, "test");
  EXPECT(big != NULL && (uintptr_t)big % mib2 == 0);
  if (!big) return;
  memset(big, 7, n);
  EXPECT(big[0] == 7 && big[n - 1] == 7);
  long kb = huge_kb_at(big);
  if (kb >= 0 && thp_advised_at_fault()) {
    if (kb < 2048) fprintf(stderr, "a 6 MiB buffer from ds_malloc_huge holds %ld kB of huge pages\n", kb);
    EXPECT(kb >= 2048);
  }
  ds_free_aligned(big);
  EXPECT(ds_malloc_huge(SIZE_MAX - 100, "an impossible size") == NULL); /* refused, not wrapped */
}

static void test_median(void) {
  double odd[] = {3, -1, 2, 9, 0}, even[] = {4, 1, 3, 2}, one[] = {7.5};
  EXPECT(ds_median(odd, 5) == 2);
  EXPECT(odd[0] == -1 && odd[4] == 9); /* sorted in place */
  EXPECT(ds_median(even, 4) == 2.5);
  EXPECT(ds_median(one, 1) == 7.5);
}

int main(void) {
  TEST_RUN(test_median);
  TEST_RUN(test_malloc_huge);
  TEST_RUN(test_bf16);
  TEST_RUN(test_f16);
  TEST_RUN(test_rng);
  TEST_RUN(test_config);
  TEST_RUN(test_config_defaults);
  return TEST_RESULT();
}
