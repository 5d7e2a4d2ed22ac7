/* dspark generate: plain autoregressive decoding with the target (prefill once, then one
 * token per forward through the KV cache), printing the text and tokens per second. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "dspark/backend.h"
#include "dspark/fileio.h"
#include "dspark/rng.h"
#include "dspark/sampling.h"
#include "dspark/target.h"
#include "dspark/tokenizer.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: dspark generate MODEL_DIR (--prompt TEXT | --prompt-ids IDS) [options]\n"
          "  --prompt TEXT         prompt, tokenized with MODEL_DIR/tokenizer.json\n"
          "  --chat                wrap the prompt as a ChatML user turn + assistant prompt\n"
          "  --prompt-ids IDS      prompt as comma-separated token ids (no tokenizer needed)\n"
          "  --max-new-tokens N    tokens to generate (default 64)\n"
          "  --temperature T       0 = greedy (default 0)\n"
          "  --top-p P             nucleus sampling mass (default 1.0 = off)\n"
          "  --seed S              sampling seed (default 0)\n"
          "  --ignore-eos          keep generating past a stop token\n"
          "  --print-ids           print the generated ids (one line) instead of text\n"
          "  --threads N           threads for BLAS and kernels\n"
          "Generation stops where transformers' generate() stops: on any eos_token_id of\n"
          "MODEL_DIR/generation_config.json when that file exists (none listed there: no stop token),\n"
          "else of config.json. The prompt plus --max-new-tokens must fit in the model's\n"
          "max_position_embeddings. Timing (prefill and decode tokens/s) goes to stderr.\n");
}

/* Prints the newly completed text of ids[0..n): decodes everything and emits the suffix past
 * what was printed, holding back an incomplete UTF-8 tail (decoded as U+FFFD). */
static void stream_text(const ds_tokenizer *tok, const int32_t *ids, size_t n, size_t *printed, int final) {
  char *text;
  size_t len;
  if (ds_tokenizer_decode(tok, ids, n, 1, &text, &len) != DS_OK) return;
  int held = !final && len >= 3 && !memcmp(text + len - 3, "\xEF\xBF\xBD", 3);
  if (!held && len > *printed) {
    fwrite(text + *printed, 1, len - *printed, stdout);
    fflush(stdout);
    *printed = len;
  }
  free(text);
}

int cmd_generate(int argc, char **argv) {
  const char *dir = NULL, *prompt = NULL, *prompt_ids = NULL;
  int64_t max_new = 64, seed = 0, threads = 0;
  double temperature = 0.0, top_p = 1.0;
  int chat = 0, print_ids = 0, ignore_eos = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    if (cli_is_help(a)) { usage(stdout); return 0; }
    if (!strcmp(a, "--prompt")) { if (!(prompt = cli_value(argc, argv, &i))) return 2; }
    else if (!strcmp(a, "--prompt-ids")) { if (!(prompt_ids = cli_value(argc, argv, &i))) return 2; }
    else if (!strcmp(a, "--chat")) chat = 1;
    else if (!strcmp(a, "--print-ids")) print_ids = 1;
    else if (!strcmp(a, "--ignore-eos")) ignore_eos = 1;
    else if (!strcmp(a, "--max-new-tokens")) { if (!(v = cli_value(argc, argv, &i)) || !cli_int(a, v, 0, 1 << 24, &max_new)) return 2; }
    else if (!strcmp(a, "--seed")) { if (!(v = cli_value(argc, argv, &i)) || !cli_int(a, v, 0, INT64_MAX, &seed)) return 2; }
    else if (!strcmp(a, "--threads")) { if (!(v = cli_value(argc, argv, &i)) || !cli_int(a, v, 1, 1024, &threads)) return 2; }
    else if (!strcmp(a, "--temperature")) { if (!(v = cli_value(argc, argv, &i)) || !cli_float(a, v, 0, 100, &temperature)) return 2; }
    else if (!strcmp(a, "--top-p")) { if (!(v = cli_value(argc, argv, &i)) || !cli_float(a, v, 1e-6, 1, &top_p)) return 2; }
    else if (a[0] == '-' || dir) { fprintf(stderr, "dspark generate: unexpected argument '%s'\n", a); usage(stderr); return 2; }
    else dir = a;
  }
  if (!dir || (!prompt == !prompt_ids)) {
    fprintf(stderr, "dspark generate: give MODEL_DIR and exactly one of --prompt / --prompt-ids\n");
    usage(stderr);
    return 2;
  }
  /* the prompt ids are an option value: a usage error, before anything is loaded */
  int32_t *given_ids = NULL;
  int64_t n_given = 0;
  if (prompt_ids && (!cli_int_list("--prompt-ids", prompt_ids, &given_ids, &n_given) || n_given == 0)) {
    if (given_ids) fprintf(stderr, "dspark generate: --prompt-ids is empty\n");
    free(given_ids);
    return 2;
  }
  ds_set_num_threads((int)threads);

  int rc = 1;
  ds_target *m = NULL;
  ds_tokenizer *tok = NULL;
  ds_kv_cache *cache = NULL;
  ds_ids ids = {0}, mask = {0};
  float *logits = NULL;
  void *scratch = NULL;
  char *tok_path = ds_path_join(dir, "tokenizer.json");
  if (!tok_path) goto report;
  if (prompt || !print_ids) {
    if (ds_tokenizer_load(tok_path, &tok) != DS_OK) goto report;
  }
  if (prompt_ids) {
    for (int64_t i = 0; i < n_given; i++)
      if (ds_ids_push(&ids, given_ids[i]) != DS_OK) goto report;
  } else if (chat) {
    ds_chat_message msg = {"user", prompt, 0};
    if (ds_chat_encode_chatml(tok, &msg, 1, 1, &ids, &mask) != DS_OK) goto report;
  } else if (ds_tokenizer_encode(tok, prompt, strlen(prompt), 1, &ids) != DS_OK) {
    goto report;
  }
  if (ids.len == 0) { fprintf(stderr, "dspark generate: the prompt has no tokens\n"); rc = 2; goto done; }

  /* The position limit, before the weights are loaded. */
  ds_model_config pre;
  char *cfg_path = ds_path_join(dir, "config.json");
  ds_status cst = cfg_path ? ds_config_load(cfg_path, &pre) : DS_ERR_NOMEM;
  /* The tokenizer against the model, before the weights are loaded too. */
  if (cst == DS_OK && tok) cst = ds_target_check_tokenizer(&pre, tok, cfg_path, tok_path);
  free(cfg_path);
  if (cst != DS_OK) goto report;
  if ((int64_t)ids.len + max_new > pre.max_position_embeddings) {
    int64_t room = pre.max_position_embeddings - (int64_t)ids.len;
    fprintf(stderr,
            "dspark generate: the prompt (%zu tokens) plus --max-new-tokens %lld needs %lld positions, but "
            "max_position_embeddings in %s/config.json is %lld; %s\n",
            ids.len, (long long)max_new, (long long)ids.len + (long long)max_new, dir,
            (long long)pre.max_position_embeddings, room > 0 ? "lower --max-new-tokens" : "shorten the prompt");
    if (room > 0) fprintf(stderr, "  (at most %lld with this prompt)\n", (long long)room);
    rc = 2;
    goto done;
  }
  double t_load = ds_time_sec();
  if (ds_target_load(dir, ds_backend_cpu(), &m) != DS_OK) goto report;
  t_load = ds_time_sec() - t_load;
  const ds_model_config *c = ds_target_config(m);
  size_t prompt_len = ids.len;
  if (ds_kv_cache_new(m, (int64_t)prompt_len + max_new, &cache) != DS_OK) goto report;
  logits = ds_malloc((size_t)c->vocab_size * sizeof(float), "logits");
  scratch = ds_malloc(ds_sampler_scratch_bytes(c->vocab_size), "sampler scratch");
  if (!logits || !scratch) goto report;
  ds_rng rng;
  ds_rng_seed(&rng, (uint64_t)seed);

  /* Prefill: the whole prompt in one forward; logits of its last row only. */
  int64_t last = (int64_t)prompt_len - 1;
  ds_target_seq seq = {ids.ids, (int64_t)prompt_len, cache};
  ds_target_outputs out = {.logit_rows = &last, .n_logit_rows = 1, .logits = logits};
  double t0 = ds_time_sec();
  if (ds_target_forward(m, &seq, 1, &out) != DS_OK) goto report;
  double t_prefill = ds_time_sec() - t0;

  size_t printed = 0;
  int64_t generated = 0, zero = 0;
  out.logit_rows = &zero;
  double t1 = ds_time_sec();
  while (generated < max_new) {
    int32_t next = ds_sample(logits, c->vocab_size, (float)temperature, (float)top_p, &rng, scratch);
    if (ds_ids_push(&ids, next) != DS_OK) goto report;
    generated++;
    if (print_ids) printf("%s%d", generated > 1 ? " " : "", next);
    else stream_text(tok, ids.ids + prompt_len, ids.len - prompt_len, &printed, 0);
    if ((!ignore_eos && ds_config_is_stop_token(c, next)) || generated == max_new) break;
    seq = (ds_target_seq){&ids.ids[ids.len - 1], 1, cache};
    if (ds_target_forward(m, &seq, 1, &out) != DS_OK) goto report;
  }
  double t_decode = ds_time_sec() - t1;
  if (!print_ids) stream_text(tok, ids.ids + prompt_len, ids.len - prompt_len, &printed, 1);
  printf("\n");
  /* Decode rate counts the forwards after the first sampled token (generated - 1 of them). */
  fprintf(stderr, "load: %.3f s; ", t_load);
  fprintf(stderr, "prefill: %zu tokens, %.3f s (%.1f tokens/s); decode: %lld tokens, %.3f s (%.1f tokens/s)\n",
          prompt_len, t_prefill, prompt_len / (t_prefill > 0 ? t_prefill : 1e-9), (long long)generated, t_decode,
          generated > 1 ? (generated - 1) / (t_decode > 0 ? t_decode : 1e-9) : 0.0);
  rc = 0;
  goto done;
report:
  rc = cli_report_error("generate");
done:
  free(given_ids);
  free(tok_path);
  free(logits);
  free(scratch);
  ds_ids_free(&ids);
  ds_ids_free(&mask);
  ds_kv_cache_free(cache);
  ds_tokenizer_free(tok);
  ds_target_free(m);
  return rc;
}
