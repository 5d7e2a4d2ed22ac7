/* dspark generate: plain autoregressive decoding with the target (prefill once, then one
 * token per forward through the KV cache), printing the text and tokens per second. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/prompt.h"
#include "dspark/backend.h"
#include "dspark/fileio.h"
#include "dspark/prompts.h"
#include "dspark/rng.h"
#include "dspark/speculate.h"
#include "dspark/target.h"
#include "dspark/tokenizer.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: dspark generate MODEL (--prompt TEXT | --prompt-ids IDS | --data FILE) [options]\n"
          "MODEL: a model directory or a .gguf file (docs/commands.md, \"Models\")\n"
          CLI_WEIGHTS_HELP
          CLI_KV_CACHE_HELP
          "  --prompt TEXT         prompt, tokenized with the model's tokenizer.json\n"
          "  --chat                wrap the prompt as a user turn + assistant prompt in the target's chat template\n"
          "                        (chat_template.jinja / tokenizer_config.json; ChatML if none)\n"
          "  --chat-template FILE  with --chat: this Jinja template instead of the target's\n"
          "  --enable-thinking on|off  with --chat: pass enable_thinking to the template (Qwen3)\n"
          "  --prompt-ids IDS      prompt as comma-separated token ids (no tokenizer needed)\n"
          "  --data FILE           a batch: one prompt per line (or JSONL {\"prompt\"} / {\"messages\"}), decoded\n"
          "                        together (one forward per step over every request); one output line per\n"
          "                        request: its generated text as a JSON string, or its ids with --print-ids\n"
          CLI_MAX_LINE_HELP
          "  --max-new-tokens N    tokens to generate (default 64)\n"
          "  --temperature T       0 = greedy (default 0)\n"
          "  --top-p P             nucleus sampling mass (default 1.0 = off)\n"
          "  --seed S              sampling seed (default 0)\n"
          "  --ignore-eos          keep generating past a stop token\n"
          "  --print-ids           print the generated ids (one line) instead of text\n"
          "  --threads N           threads for BLAS and kernels\n"
          "  --compute fp32|bf16|int8  matmul precision (default fp32 with a GGUF's quantized matrices in\n"
          "                     int8, as llama.cpp; docs/compute.md)\n"
          "  --device cpu|cuda     where the target runs (default cpu; cuda: a DSPARK_CUDA build, docs/cuda.md)\n"
          "Generation stops where transformers' generate() stops: on any eos_token_id of\n"
          "the model's generation_config.json when it has one (none listed there: no stop token),\n"
          "else of config.json. The prompt plus --max-new-tokens must fit in the model's\n"
          "max_position_embeddings. Timing (prefill and decode tokens/s) goes to stderr.\n");
}

/* --data: every prompt decoded together; one line per request, then the batch's rates. */
static ds_status generate_batch(ds_target *m, const ds_tokenizer *tok, const ds_prompt_batch *b, ds_spec_options *so,
                                int print_ids, double t_load) {
  const int R = b->n;
  const int32_t **pv = malloc((size_t)R * sizeof *pv);
  int64_t *pn = malloc((size_t)R * sizeof *pn), prompt_tokens = 0, generated = 0;
  ds_spec_result *res = calloc((size_t)R, sizeof *res);
  if (!pv || !pn || !res) {
    free(pv);
    free(pn);
    free(res);
    return DS_FAIL(DS_ERR_NOMEM, "out of memory for %d requests", R);
  }
  for (int i = 0; i < R; i++) {
    pv[i] = b->v[i].ids;
    pn[i] = (int64_t)b->v[i].len;
    prompt_tokens += pn[i];
  }
  so->on_token = NULL; /* whole lines, after the batch */
  ds_status st = ds_generate_batch(m, pv, pn, R, so, res);
  for (int i = 0; st == DS_OK && i < R; i++) {
    cli_print_result(tok, print_ids, res[i].ids, res[i].n);
    printf("\n");
    generated += res[i].n;
  }
  fflush(stdout); /* the text before the timings on stderr when both go to one terminal or pipe */
  if (st == DS_OK) {
    double t_decode = res[0].total_s - res[0].prefill_s;
    fprintf(stderr, "load: %.3f s; %d requests; prefill: %lld tokens, %.3f s (%.1f tokens/s); decode: %lld tokens, "
            "%.3f s (%.1f tokens/s)\n", t_load, R, (long long)prompt_tokens, res[0].prefill_s,
            prompt_tokens / (res[0].prefill_s > 0 ? res[0].prefill_s : 1e-9), (long long)generated, t_decode,
            generated / (t_decode > 0 ? t_decode : 1e-9));
  }
  for (int i = 0; i < R; i++) ds_spec_result_free(&res[i]);
  free(res);
  free(pv);
  free(pn);
  return st;
}

int cmd_generate(int argc, char **argv) {
  const char *dir = NULL, *prompt = NULL, *prompt_ids = NULL, *data = NULL;
  int64_t max_new = 64, seed = 0, threads = 0;
  double temperature = 0.0, top_p = 1.0;
  int chat = 0, print_ids = 0, ignore_eos = 0, thinking = -1, taken;
  const char *chat_template = NULL, *device = "cpu";
  size_t max_line = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    if (cli_is_help(a)) { usage(stdout); return 0; }
    if (!strcmp(a, "--prompt")) { if (!(prompt = cli_value(argc, argv, &i))) return 2; }
    else if (!strcmp(a, "--prompt-ids")) { if (!(prompt_ids = cli_value(argc, argv, &i))) return 2; }
    else if (!strcmp(a, "--data")) { if (!(data = cli_value(argc, argv, &i))) return 2; }
    else if (!strcmp(a, "--max-line-bytes")) { if (cli_max_line_option(argc, argv, &i, &max_line) < 0) return 2; }
    else if (!strcmp(a, "--device")) { if (!(device = cli_value(argc, argv, &i))) return 2; }
    else if (!strcmp(a, "--chat")) chat = 1;
    else if ((taken = cli_chat_option("generate", argc, argv, &i, &chat_template, &thinking)) != 0) {
      if (taken < 0) return 2;
    }
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
  if (!dir || (!!prompt + !!prompt_ids + !!data) != 1) {
    fprintf(stderr, "dspark generate: give MODEL and exactly one of --prompt / --prompt-ids / --data\n");
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
  const ds_backend *be = ds_backend_named(device);
  if (!be) return cli_report_error("generate");
  if (be->device_memory) ds_cuda_set_bf16_gemm(ds_matmul_compute() == DS_COMPUTE_BF16);

  int rc = 1;
  ds_target *m = NULL;
  ds_tokenizer *tok = NULL;
  ds_prompt_chat cc = {NULL, thinking};
  ds_ids ids = {0};
  ds_prompt_batch batch = {0};
  ds_model_source *src = NULL;
  if (ds_model_source_open(dir, &src) != DS_OK) goto report;
  /* the tokenizer checked against config.json, before the weights are loaded */
  if ((prompt || data || !print_ids) && ds_model_source_checked_tokenizer(src, &tok) != DS_OK) goto report;
  if ((chat || data) && tok && ds_prompt_chat_load(src, chat_template, &cc) != DS_OK) goto report;
  if (data) {
    if (ds_prompt_batch_read(tok, &cc, data, chat, max_line, &batch) != DS_OK) goto report;
    if (batch.n == 0) { fprintf(stderr, "dspark generate: %s holds no prompt\n", data); rc = 2; goto done; }
    for (int i = 0; i < batch.n; i++)
      if (batch.v[i].len > ids.len) ids.len = batch.v[i].len; /* the longest, for the position check */
  } else {
    if (ds_prompt_ids(tok, &cc, prompt, given_ids, n_given, chat, &ids) != DS_OK) goto report;
  }
  if (ids.len == 0) { fprintf(stderr, "dspark generate: the prompt has no tokens\n"); rc = 2; goto done; }

  /* The position limit, before the weights are loaded. */
  ds_model_config pre;
  if (ds_model_source_config(src, &pre) != DS_OK) goto report;
  if ((int64_t)ids.len + max_new > pre.max_position_embeddings) {
    int64_t room = pre.max_position_embeddings - (int64_t)ids.len;
    fprintf(stderr,
            "dspark generate: the prompt (%zu tokens) plus --max-new-tokens %lld needs %lld positions, but "
            "max_position_embeddings in %s is %lld; %s\n",
            ids.len, (long long)max_new, (long long)ids.len + (long long)max_new,
            ds_model_source_label(src, DS_MODEL_CONFIG), (long long)pre.max_position_embeddings,
            room > 0 ? "lower --max-new-tokens" : "shorten the prompt");
    if (room > 0) fprintf(stderr, "  (at most %lld with this prompt)\n", (long long)room);
    rc = 2;
    goto done;
  }
  double t_load = ds_time_sec();
  if (ds_target_load_source(src, be, NULL, &m) != DS_OK) goto report;
  t_load = ds_time_sec() - t_load;
  size_t prompt_len = ids.len;
  cli_stream st_out = {tok, print_ids, 0};
  ds_spec_options so;
  ds_spec_options_default(&so);
  so.max_new_tokens = max_new;
  so.temperature = temperature;
  so.top_p = top_p;
  so.seed = (uint64_t)seed;
  so.ignore_eos = ignore_eos;
  so.on_token = cli_stream_token;
  so.user = &st_out;
  if (data) {
    if (generate_batch(m, tok, &batch, &so, print_ids, t_load) != DS_OK) goto report;
    rc = 0;
    goto done;
  }
  ds_spec_result res;
  if (ds_generate(m, ids.ids, (int64_t)prompt_len, &so, &res) != DS_OK) goto report;
  if (!print_ids) cli_print_text(tok, res.ids, (size_t)res.n, &st_out.printed, 1);
  printf("\n");
  fflush(stdout); /* the text before the timings on stderr */
  double t_decode = res.total_s - res.prefill_s;
  /* Decode rate counts the forwards after the first sampled token (generated - 1 of them). */
  fprintf(stderr, "load: %.3f s; ", t_load);
  fprintf(stderr, "prefill: %zu tokens, %.3f s (%.1f tokens/s); decode: %lld tokens, %.3f s (%.1f tokens/s)\n",
          prompt_len, res.prefill_s, prompt_len / (res.prefill_s > 0 ? res.prefill_s : 1e-9), (long long)res.n,
          t_decode, res.n > 1 ? (res.n - 1) / (t_decode > 0 ? t_decode : 1e-9) : 0.0);
  ds_spec_result_free(&res);
  rc = 0;
  goto done;
report:
  rc = cli_report_error("generate");
done:
  free(given_ids);
  ds_model_source_close(src);
  if (!data) ds_ids_free(&ids);
  ds_prompt_batch_free(&batch);
  ds_tokenizer_free(tok);
  ds_chat_template_free(cc.tmpl);
  ds_target_free(m);
  return rc;
}
