/* dspark speculate: lossless speculative decoding with a DSpark draft (include/dspark/speculate.h),
 * with the same prompt and output options as `dspark generate`, so the two compare output for
 * output; a report of tau, acceptance per position and the round costs, and plain decoding of
 * the same prompt in the same run for the speedup. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/prompt.h"
#include "dspark/backend.h"
#include "dspark/checkpoint.h"
#include "dspark/fileio.h"
#include "dspark/speculate.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: dspark speculate --target DIR --draft DIR (--prompt TEXT | --prompt-ids IDS) [options]\n"
          "Decodes with the target, proposing tokens with the draft and verifying them in one target pass\n"
          "per round; the output is the target's own (greedy: token for token what `dspark generate` prints).\n"
          "  --draft DIR           an export (`dspark export`) or a run directory (its checkpoint)\n"
          "  --prompt TEXT  --chat  --prompt-ids IDS  --max-new-tokens N (64)  --temperature T (0 = greedy)\n"
          "  --data FILE           a batch of requests (one plain-text prompt per line, or JSONL with\n"
          "                        {\"messages\": [...]} / {\"prompt\": TEXT}): one target pass per round verifies\n"
          "                        every request's candidates; one output line per request (ids, or the text as\n"
          "                        a JSON string); request i samples with seed S + i. Chat prompts (--chat,\n"
          "                        {\"messages\"}) use the target's chat template, as `dspark generate --chat`\n"
          "  --top-p P  --seed S  --ignore-eos  --print-ids  --chat-template FILE  --enable-thinking on|off\n"
          "                        as for `dspark generate`\n"
          "  --policy fixed|threshold  fixed: propose --draft-len tokens every round; threshold: propose while\n"
          "                        the product of the confidence head's probabilities stays >= --threshold\n"
          "  --draft-len L         tokens proposed per round (default: the draft's block size; at most it)\n"
          "  --threshold C         for --policy threshold (0.5)\n"
          "  --baseline            also decode the prompt plainly in the same run and report the speedup\n"
          "  --report FILE.json    write the report (tau, acceptance per position, rounds, timings)\n"
          "  --repeat N            decode the prompt N times with seeds S .. S+N-1 (one output line each;\n"
          "                        the report aggregates them)\n"
          "  --test-bias-acceptance  accept every draft token: NOT lossless; for the tests that must fail\n"
          "  --threads N\n"
          "Report convention: tau = tokens committed per target verification pass, the bonus or replacement\n"
          "token counted; acceptance per position conditional (accepted / proposed there) and unconditional\n"
          "(accepted / rounds).\n");
}

/* Sums of the per-request results (ids dropped); the timings are the batch's, counted once. */
static void accumulate(ds_spec_result *acc, const ds_spec_result *r, int with_time) {
  acc->n += r->n;
  acc->rounds += r->rounds;
  acc->proposed += r->proposed;
  for (int k = 0; k < DS_SPEC_MAX_LEN; k++) acc->pos_proposed[k] += r->pos_proposed[k], acc->pos_accepted[k] += r->pos_accepted[k];
  for (int c = 0; c < DS_SPEC_MAX_LEN + 2; c++) acc->committed_hist[c] += r->committed_hist[c];
  if (with_time)
    acc->prefill_s += r->prefill_s, acc->draft_s += r->draft_s, acc->verify_s += r->verify_s, acc->total_s += r->total_s;
}

/* Tokens per second after the prefill over `requests` requests: each request's first token
 * comes from the prefill, the rest from the rounds (as `generate` reports its decode rate). */
static double decode_rate(const ds_spec_result *r, int64_t requests) {
  double t = r->total_s - r->prefill_s;
  return r->n > requests && t > 0 ? (double)(r->n - requests) / t : 0.0;
}

static ds_status write_report(const char *path, const ds_spec_options *o, int64_t g, int64_t requests,
                              const ds_spec_result *s, const ds_spec_result *plain) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "convention", "tau = tokens committed per target verification pass (bonus counted); "
                                           "conditional = accepted / proposed at the position; unconditional = "
                                           "accepted / rounds");
  cJSON_AddNumberToObject(j, "requests", (double)requests);
  cJSON_AddStringToObject(j, "policy", o->policy == DS_SPEC_THRESHOLD ? "threshold" : "fixed");
  cJSON_AddNumberToObject(j, "draft_len", (double)(o->draft_len > 0 ? o->draft_len : g));
  cJSON_AddNumberToObject(j, "temperature", o->temperature);
  cJSON_AddNumberToObject(j, "generated_tokens", (double)s->n);
  cJSON_AddNumberToObject(j, "rounds", (double)s->rounds);
  cJSON_AddNumberToObject(j, "tau", ds_spec_tau(s));
  cJSON *cond = cJSON_CreateArray(), *uncond = cJSON_CreateArray(), *hist = cJSON_CreateArray();
  for (int64_t k = 0; k < g; k++) {
    cJSON_AddItemToArray(cond, cJSON_CreateNumber(s->pos_proposed[k] > 0 ? s->pos_accepted[k] / s->pos_proposed[k] : 0));
    cJSON_AddItemToArray(uncond, cJSON_CreateNumber(s->rounds > 0 ? s->pos_accepted[k] / (double)s->rounds : 0));
  }
  for (int64_t c = 1; c <= g + 1; c++) cJSON_AddItemToArray(hist, cJSON_CreateNumber((double)s->committed_hist[c]));
  cJSON_AddItemToObject(j, "accept_conditional", cond);
  cJSON_AddItemToObject(j, "accept_unconditional", uncond);
  cJSON_AddItemToObject(j, "tokens_per_round_histogram", hist); /* index i: rounds that committed i + 1 tokens */
  cJSON_AddNumberToObject(j, "prefill_s", s->prefill_s);
  cJSON_AddNumberToObject(j, "draft_s", s->draft_s);
  cJSON_AddNumberToObject(j, "verify_s", s->verify_s);
  cJSON_AddNumberToObject(j, "total_s", s->total_s);
  cJSON_AddNumberToObject(j, "decode_tokens_per_s", decode_rate(s, requests));
  if (plain) {
    cJSON_AddNumberToObject(j, "plain_decode_tokens_per_s", decode_rate(plain, requests));
    cJSON_AddNumberToObject(j, "speedup", decode_rate(plain, requests) > 0 ? decode_rate(s, requests) / decode_rate(plain, requests) : 0);
  }
  cJSON_AddStringToObject(j, "gemm", ds_gemm_name());
  cJSON_AddNumberToObject(j, "threads", ds_get_num_threads());
  char *text = cJSON_Print(j);
  cJSON_Delete(j);
  if (!text) return DS_FAIL(DS_ERR_NOMEM, "out of memory");
  ds_status st = ds_write_file_atomic(path, text, strlen(text));
  free(text);
  return st;
}

int cmd_speculate(int argc, char **argv) {
  const char *target_dir = NULL, *draft_dir = NULL, *prompt = NULL, *prompt_ids = NULL, *report = NULL, *data = NULL;
  ds_spec_options o;
  ds_spec_options_default(&o);
  int chat = 0, print_ids = 0, baseline = 0, thinking = -1, taken;
  const char *chat_template = NULL;
  int64_t repeat = 1, threads = 0, n = 0;
  double x = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    if (cli_is_help(a)) { usage(stdout); return 0; }
    else if (!strcmp(a, "--target")) { CLI_VALUE(); target_dir = v; }
    else if (!strcmp(a, "--draft")) { CLI_VALUE(); draft_dir = v; }
    else if (!strcmp(a, "--prompt")) { CLI_VALUE(); prompt = v; }
    else if (!strcmp(a, "--prompt-ids")) { CLI_VALUE(); prompt_ids = v; }
    else if (!strcmp(a, "--data")) { CLI_VALUE(); data = v; }
    else if (!strcmp(a, "--chat")) chat = 1;
    else if ((taken = cli_chat_option("speculate", argc, argv, &i, &chat_template, &thinking)) != 0) {
      if (taken < 0) return 2;
    }
    else if (!strcmp(a, "--print-ids")) print_ids = 1;
    else if (!strcmp(a, "--ignore-eos")) o.ignore_eos = 1;
    else if (!strcmp(a, "--baseline")) baseline = 1;
    else if (!strcmp(a, "--test-bias-acceptance")) o.test_bias = 1;
    else if (!strcmp(a, "--report")) { CLI_VALUE(); report = v; }
    else if (!strcmp(a, "--max-new-tokens")) CLI_INT(0, 1 << 24, o.max_new_tokens);
    else if (!strcmp(a, "--seed")) { CLI_INT(0, INT64_MAX, n); o.seed = (uint64_t)n; }
    else if (!strcmp(a, "--repeat")) CLI_INT(1, 1 << 24, repeat);
    else if (!strcmp(a, "--threads")) CLI_INT(1, 1024, threads);
    else if (!strcmp(a, "--temperature")) CLI_NUM(0, 100, o.temperature);
    else if (!strcmp(a, "--top-p")) CLI_NUM(1e-6, 1, o.top_p);
    else if (!strcmp(a, "--draft-len")) CLI_INT(0, DS_SPEC_MAX_LEN, o.draft_len);
    else if (!strcmp(a, "--threshold")) CLI_NUM(0, 1, o.threshold);
    else if (!strcmp(a, "--policy")) {
      CLI_VALUE();
      if (!strcmp(v, "fixed")) o.policy = DS_SPEC_FIXED;
      else if (!strcmp(v, "threshold")) o.policy = DS_SPEC_THRESHOLD;
      else {
        fprintf(stderr, "dspark speculate: --policy expects fixed or threshold, got '%s'\n", v);
        return 2;
      }
    } else {
      fprintf(stderr, "dspark speculate: %s '%s' (see --help)\n", a[0] == '-' ? "unknown option" : "unexpected argument", a);
      return 2;
    }
  }
  if (!target_dir || !draft_dir || (!!prompt + !!prompt_ids + !!data) != 1) {
    fprintf(stderr, "dspark speculate: --target, --draft and exactly one of --prompt / --prompt-ids / --data are required (see --help)\n");
    return 2;
  }
  int32_t *given = NULL;
  int64_t n_given = 0;
  if (prompt_ids && (!cli_int_list("--prompt-ids", prompt_ids, &given, &n_given) || n_given == 0)) {
    if (given) fprintf(stderr, "dspark speculate: --prompt-ids is empty\n");
    free(given);
    return 2;
  }
  ds_set_num_threads((int)threads);
  int rc = 1;
  ds_target *t = NULL;
  ds_draft *d = NULL;
  ds_tokenizer *tok = NULL;
  cli_chat cc = {NULL, thinking};
  ds_ids ids = {0};
  cli_prompts batch = {0};
  ds_spec_result sum, plain_sum, *res = NULL;
  memset(&sum, 0, sizeof sum);
  memset(&plain_sum, 0, sizeof plain_sum);
  char *tok_path = ds_path_join(target_dir, "tokenizer.json");
  if (!tok_path) goto report;
  if ((prompt || data || !print_ids) && ds_tokenizer_load(tok_path, &tok) != DS_OK) goto report;
  if ((chat || data) && tok && cli_load_chat_template(tok_path, chat_template, &cc) != DS_OK) goto report;
  if (data) {
    if (cli_read_prompts(tok, &cc, data, chat, &batch) != DS_OK) goto report;
  } else {
    if (cli_prompt_ids(tok, &cc, prompt, given, n_given, chat, &ids) != DS_OK) goto report;
    if (ids.len == 0) { fprintf(stderr, "dspark speculate: the prompt has no tokens\n"); rc = 2; goto done; }
  }
  int R = data ? batch.n : 1;
  const int32_t **pv = calloc((size_t)R, sizeof *pv);
  int64_t *pn = calloc((size_t)R, sizeof *pn);
  res = calloc((size_t)R, sizeof *res);
  if (!pv || !pn || !res) { free(pv); free(pn); goto report; }
  for (int i = 0; i < R; i++) {
    const ds_ids *v = data ? &batch.v[i] : &ids;
    pv[i] = v->ids;
    pn[i] = (int64_t)v->len;
  }
  if (ds_target_load(target_dir, ds_backend_cpu(), &t) != DS_OK || ds_draft_open(draft_dir, ds_backend_cpu(), &d) != DS_OK) {
    free(pv), free(pn);
    goto report;
  }
  int64_t g = ds_draft_get_config(d)->block_size;
  uint64_t seed0 = o.seed;
  ds_status st = DS_OK;
  for (int64_t rep = 0; rep < repeat && st == DS_OK; rep++) {
    cli_stream out = {tok, print_ids, 0};
    o.seed = seed0 + (uint64_t)rep * (uint64_t)R;
    o.on_token = R == 1 ? cli_stream_token : NULL; /* stream a single request as generate does */
    o.user = &out;
    st = ds_speculate_batch(t, d, pv, pn, R, &o, res);
    for (int i = 0; st == DS_OK && i < R; i++) {
      if (R == 1 && !print_ids) cli_print_text(tok, res[i].ids, (size_t)res[i].n, &out.printed, 1);
      else if (R > 1) cli_print_result(tok, print_ids, res[i].ids, res[i].n);
      printf("\n");
      accumulate(&sum, &res[i], i == 0);
      ds_spec_result_free(&res[i]);
    }
    fflush(stdout);
    if (st == DS_OK && baseline) {
      ds_spec_options po = o;
      po.on_token = NULL;
      st = ds_generate_batch(t, pv, pn, R, &po, res);
      for (int i = 0; st == DS_OK && i < R; i++) {
        accumulate(&plain_sum, &res[i], i == 0);
        ds_spec_result_free(&res[i]);
      }
    }
  }
  free(pv);
  free(pn);
  if (st != DS_OK) goto report;
  fprintf(stderr, "speculate: %lld tokens in %lld rounds: tau %.3f (tokens per target pass, bonus counted); "
          "%.1f tokens/s decoding (draft %.3f s, verify %.3f s)", (long long)sum.n, (long long)sum.rounds,
          ds_spec_tau(&sum), decode_rate(&sum, R * repeat), sum.draft_s, sum.verify_s);
  if (baseline)
    fprintf(stderr, "; plain decoding %.1f tokens/s: speedup %.2fx", decode_rate(&plain_sum, R * repeat),
            decode_rate(&plain_sum, R * repeat) > 0 ? decode_rate(&sum, R * repeat) / decode_rate(&plain_sum, R * repeat) : 0.0);
  fprintf(stderr, "\nacceptance per position (conditional):");
  for (int64_t k = 0; k < g; k++)
    fprintf(stderr, " %.3f", sum.pos_proposed[k] > 0 ? sum.pos_accepted[k] / sum.pos_proposed[k] : 0.0);
  fprintf(stderr, "\n");
  if (report && write_report(report, &o, g, R * repeat, &sum, baseline ? &plain_sum : NULL) != DS_OK) goto report;
  rc = 0;
  goto done;
report:
  rc = cli_report_error("speculate");
done:
  free(given);
  free(tok_path);
  ds_ids_free(&ids);
  cli_prompts_free(&batch);
  free(res);
  ds_tokenizer_free(tok);
  ds_chat_template_free(cc.tmpl);
  ds_draft_free(d);
  ds_target_free(t);
  return rc;
}
