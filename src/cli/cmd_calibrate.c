/* dspark calibrate: Sequential Temperature Scaling of the draft's confidence head (spec/dspark.md
 * section 8). Decodes the prompts speculatively (fixed policy), records every round's
 * confidence logits and accepted prefix, fits one temperature per draft position left to right
 * on one part of the rounds and reports the cumulative-acceptance ECE before and after on the
 * fit rounds and on held-out rounds the fit never saw. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/prompt.h"
#include "dspark/backend.h"
#include "dspark/checkpoint.h"
#include "dspark/fileio.h"
#include "dspark/prompts.h"
#include "dspark/spec_files.h"
#include "dspark/speculate.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: dspark calibrate --target MODEL --draft DIR --data FILE --out FILE.json [options]\n"
          "MODEL: a model directory or a .gguf file (docs/commands.md, \"Models\")\n"
          "Runs speculative rounds on the prompts of FILE (as `speculate --data`), fits one temperature per\n"
          "draft position by Sequential Temperature Scaling (%d log-spaced values in [1/8, 8], each position\n"
          "minimizing the ECE of the cumulative acceptance prod sigmoid(z_i / T_i) with the earlier ones\n"
          "frozen) and prints that ECE per position before and after. Every 4th request (index 3, 7, ..) is\n"
          "held out of the fit and scored separately (with fewer than 4 requests, every 4th round).\n"
          "`dspark speculate --calibration FILE.json` applies the temperatures, to this draft only (the file\n"
          "records its identity and block size) and for at most the positions fitted (--draft-len).\n"
          CLI_WEIGHTS_HELP
          CLI_KV_CACHE_HELP
          CLI_DRAFT_WEIGHTS_HELP
          "  --max-new-tokens N (64)  --draft-len L (the block size)  --temperature T (0)  --top-p P  --seed S\n"
          "  --chat  --chat-template FILE  --enable-thinking on|off  --ignore-eos  --threads N   as for\n"
          "                           `dspark speculate`\n"
          CLI_MAX_LINE_HELP,
          DS_STS_GRID);
}

/* Marks the held-out rounds; returns the split's description. */
static const char *split_rounds(const ds_spec_rounds *r, int requests, uint8_t *fit, uint8_t *held) {
  int by_request = requests >= 4;
  for (int64_t i = 0; i < r->n; i++) {
    int out = by_request ? r->request[i] % 4 == 3 : i % 4 == 3;
    held[i] = (uint8_t)out;
    fit[i] = (uint8_t)!out;
  }
  return by_request ? "held out: requests with index % 4 == 3; fit: the other requests"
                    : "held out: rounds with index % 4 == 3 (fewer than 4 requests); fit: the other rounds";
}

static cJSON *ece_block(const ds_round_set *s, const double *T, double *before_mean, double *after_mean) {
  cJSON *o = cJSON_CreateObject();
  cJSON *before = ds_ece_json(s, NULL), *after = ds_ece_json(s, T);
  *before_mean = ds_ece_mean(s, NULL);
  *after_mean = ds_ece_mean(s, T);
  int64_t rounds = 0;
  for (int64_t i = 0; i < s->n; i++) rounds += !s->use || s->use[i];
  cJSON_AddNumberToObject(o, "rounds", (double)rounds);
  cJSON_AddItemToObject(o, "before", before);
  cJSON_AddItemToObject(o, "after", after);
  cJSON_AddItemToObject(o, "count", ds_ece_counts_json(s));
  cJSON_AddNumberToObject(o, "before_mean", *before_mean);
  cJSON_AddNumberToObject(o, "after_mean", *after_mean);
  return o;
}

int cmd_calibrate(int argc, char **argv) {
  const char *target_dir = NULL, *draft_dir = NULL, *data = NULL, *out_path = NULL;
  ds_spec_options o;
  ds_spec_options_default(&o);
  int chat = 0, R = 0, thinking = -1, taken;
  const char *chat_template = NULL;
  size_t max_line = 0;
  int64_t threads = 0, n = 0;
  ds_dtype draft_weights = DS_Q8_0;
  double x = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    if (cli_is_help(a)) { usage(stdout); return 0; }
    else if (!strcmp(a, "--target")) { CLI_VALUE(); target_dir = v; }
    else if (!strcmp(a, "--draft")) { CLI_VALUE(); draft_dir = v; }
    else if (!strcmp(a, "--draft-weights")) CLI_DRAFT_WEIGHTS(draft_weights);
    else if (!strcmp(a, "--data")) { CLI_VALUE(); data = v; }
    else if (!strcmp(a, "--max-line-bytes")) { if (cli_max_line_option(argc, argv, &i, &max_line) < 0) return 2; }
    else if (!strcmp(a, "--out")) { CLI_VALUE(); out_path = v; }
    else if (!strcmp(a, "--chat")) chat = 1;
    else if ((taken = cli_chat_option("calibrate", argc, argv, &i, &chat_template, &thinking)) != 0) {
      if (taken < 0) return 2;
    }
    else if (!strcmp(a, "--ignore-eos")) o.ignore_eos = 1;
    else if (!strcmp(a, "--max-new-tokens")) CLI_INT(1, 1 << 24, o.max_new_tokens);
    else if (!strcmp(a, "--seed")) { CLI_INT(0, INT64_MAX, n); o.seed = (uint64_t)n; }
    else if (!strcmp(a, "--threads")) CLI_INT(1, 1024, threads);
    else if (!strcmp(a, "--temperature")) CLI_NUM(0, 100, o.temperature);
    else if (!strcmp(a, "--top-p")) CLI_NUM(1e-6, 1, o.top_p);
    else if (!strcmp(a, "--draft-len")) CLI_INT(1, DS_SPEC_MAX_LEN, o.draft_len);
    else {
      fprintf(stderr, "dspark calibrate: %s '%s' (see --help)\n", a[0] == '-' ? "unknown option" : "unexpected argument", a);
      return 2;
    }
  }
  if (!target_dir || !draft_dir || !data || !out_path) {
    fprintf(stderr, "dspark calibrate: --target, --draft, --data and --out are required (see --help)\n");
    return 2;
  }
  const ds_input_path inputs[] = {{"--target", target_dir}, {"--draft", draft_dir}, {"--data", data},
                                  {"--chat-template", chat_template}};
  int refused = cli_output_refused("calibrate", "--out", out_path, DS_OUTPUT_FILE, inputs, CLI_N_INPUTS(inputs));
  if (refused) return refused;
  ds_set_num_threads((int)threads);
  int rc = 1;
  ds_target *t = NULL;
  ds_draft *d = NULL;
  ds_tokenizer *tok = NULL;
  ds_prompt_chat cc = {NULL, thinking};
  ds_prompt_batch batch = {0};
  ds_spec_rounds rounds;
  ds_spec_rounds_init(&rounds, 0);
  ds_spec_result *res = NULL;
  const int32_t **pv = NULL;
  int64_t *pn = NULL;
  uint8_t *fit = NULL, *held = NULL;
  double *T = NULL;
  ds_model_source *src = NULL;
  if (ds_model_source_open(target_dir, &src) != DS_OK || ds_model_source_tokenizer(src, &tok) != DS_OK) goto report;
  if (ds_prompt_chat_load(src, chat_template, &cc) != DS_OK) goto report;
  if (ds_prompt_batch_read(tok, &cc, data, chat, max_line, &batch) != DS_OK) goto report;
  if (ds_target_load_source(src, ds_backend_cpu(), NULL, &t) != DS_OK ||
      ds_draft_open(draft_dir, ds_backend_cpu(), &d) != DS_OK || ds_draft_set_decode_weights(d, draft_weights) != DS_OK)
    goto report;
  const ds_draft_config *dc = ds_draft_get_config(d);
  if (!dc->enable_confidence_head) {
    fprintf(stderr, "dspark calibrate: the draft %s has no confidence head: there is nothing to calibrate\n", draft_dir);
    rc = 2;
    goto done;
  }
  int64_t g = dc->block_size, K = o.draft_len > 0 && o.draft_len < g ? o.draft_len : g;
  R = batch.n;
  ds_spec_rounds_init(&rounds, g);
  pv = calloc((size_t)R, sizeof *pv);
  pn = calloc((size_t)R, sizeof *pn);
  res = calloc((size_t)R, sizeof *res);
  T = calloc((size_t)g, sizeof *T);
  if (!pv || !pn || !res || !T) goto report;
  for (int i = 0; i < R; i++) pv[i] = batch.v[i].ids, pn[i] = (int64_t)batch.v[i].len;
  o.policy = DS_SPEC_FIXED;
  o.on_round = ds_spec_rounds_add;
  o.round_user = &rounds;
  if (ds_speculate_batch(t, d, pv, pn, R, &o, res) != DS_OK) goto report;
  if (rounds.failed) {
    fprintf(stderr, "dspark calibrate: out of memory recording the rounds\n");
    goto done;
  }
  rounds.K = K; /* positions past the proposal length carry no labels */
  fit = calloc((size_t)(rounds.n > 0 ? rounds.n : 1), 1);
  held = calloc((size_t)(rounds.n > 0 ? rounds.n : 1), 1);
  if (!fit || !held) goto report;
  /* the rows are recorded g wide; a shorter proposal length keeps the first K of each row */
  if (K < g)
    for (int64_t i = 0; i < rounds.n; i++) memmove(rounds.z + i * K, rounds.z + i * g, (size_t)K * sizeof(float));
  const char *split = split_rounds(&rounds, R, fit, held);
  ds_round_set fit_set = ds_spec_rounds_set(&rounds, fit), held_set = ds_spec_rounds_set(&rounds, held);
  ds_sts_fit(&fit_set, T);
  double fb, fa, hb, ha;
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "format", "dspark-calibration-2");
  cJSON_AddStringToObject(j, "method", "sequential temperature scaling: confidence_k = sigmoid(logit_k / T_k), "
                                       "T_k fitted left to right minimizing the ECE of the cumulative acceptance");
  cJSON_AddStringToObject(j, "draft", draft_dir);
  ds_spec_add_draft_identity(j, d); /* speculate --calibration refuses the file for another draft */
  cJSON_AddStringToObject(j, "target", target_dir);
  cJSON_AddNumberToObject(j, "draft_len", (double)K);
  cJSON_AddNumberToObject(j, "temperature", o.temperature);
  cJSON_AddNumberToObject(j, "requests", R);
  cJSON_AddNumberToObject(j, "rounds", (double)rounds.n);
  cJSON_AddNumberToObject(j, "grid_values", DS_STS_GRID);
  cJSON_AddNumberToObject(j, "grid_min", ds_sts_grid_value(0));
  cJSON_AddNumberToObject(j, "grid_max", ds_sts_grid_value(DS_STS_GRID - 1));
  cJSON_AddNumberToObject(j, "ece_bins", DS_ECE_BINS);
  cJSON_AddStringToObject(j, "split", split);
  cJSON_AddItemToObject(j, "temperatures", ds_json_number_array(T, K));
  cJSON *ece = cJSON_CreateObject();
  cJSON *fit_block = ece_block(&fit_set, T, &fb, &fa), *held_block = ece_block(&held_set, T, &hb, &ha);
  int64_t n_fit = 0, n_held = 0;
  for (int64_t i = 0; i < rounds.n; i++) n_fit += fit[i], n_held += held[i];
  cJSON_SetNumberValue(cJSON_GetObjectItem(fit_block, "rounds"), (double)n_fit);
  cJSON_SetNumberValue(cJSON_GetObjectItem(held_block, "rounds"), (double)n_held);
  cJSON_AddItemToObject(ece, "fit", fit_block);
  cJSON_AddItemToObject(ece, "heldout", held_block);
  cJSON_AddItemToObject(j, "ece", ece);
  fprintf(stderr, "calibrate: %lld rounds (%lld fit, %lld held out; %s)\n", (long long)rounds.n, (long long)n_fit,
          (long long)n_held, split);
  fprintf(stderr, "position  temperature  ECE fit before -> after  ECE held-out before -> after  (cumulative acceptance)\n");
  for (int64_t k = 0; k < K; k++)
    fprintf(stderr, "%8lld  %11.3f  %10.4f -> %.4f  %15.4f -> %.4f\n", (long long)k + 1, T[k],
            ds_cumulative_ece(&fit_set, k, NULL, NULL), ds_cumulative_ece(&fit_set, k, T, NULL),
            ds_cumulative_ece(&held_set, k, NULL, NULL), ds_cumulative_ece(&held_set, k, T, NULL));
  fprintf(stderr, "mean      %11s  %10.4f -> %.4f  %15.4f -> %.4f\n", "", fb, fa, hb, ha);
  if (ds_json_write_report("--out", out_path, j) != DS_OK) goto report;
  rc = 0;
  goto done;
report:
  rc = cli_report_error("calibrate");
done:
  for (int i = 0; res && i < R; i++) ds_spec_result_free(&res[i]);
  free(res);
  free(pv);
  free(pn);
  free(fit);
  free(held);
  free(T);
  ds_model_source_close(src);
  ds_spec_rounds_free(&rounds);
  ds_prompt_batch_free(&batch);
  ds_tokenizer_free(tok);
  ds_chat_template_free(cc.tmpl);
  ds_draft_free(d);
  ds_target_free(t);
  return rc;
}
