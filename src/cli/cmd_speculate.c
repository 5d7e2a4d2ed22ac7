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
#include "dspark/ngram.h"
#include "dspark/prompts.h"
#include "dspark/spec_files.h"
#include "dspark/speculate.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: dspark speculate --target MODEL --draft DIR (--prompt TEXT | --prompt-ids IDS) [options]\n"
          "MODEL: a model directory or a .gguf file (docs/commands.md, \"Models\")\n"
          "Decodes with the target, proposing tokens with the draft and verifying them in one target pass\n"
          "per round; the output is the target's own (greedy: token for token what `dspark generate` prints).\n"
          CLI_WEIGHTS_HELP
          CLI_KV_CACHE_HELP
          CLI_DRAFT_WEIGHTS_HELP
          "  --draft DIR           an export (`dspark export`) or a run directory (its checkpoint)\n"
          "  --prompt TEXT  --chat  --prompt-ids IDS  --max-new-tokens N (64)  --temperature T (0 = greedy)\n"
          "  --data FILE           a batch of requests (one plain-text prompt per line, or JSONL with\n"
          "                        {\"messages\": [...]} / {\"prompt\": TEXT}): one target pass per round verifies\n"
          "                        every request's candidates; one output line per request (ids, or the text as\n"
          "                        a JSON string); request i samples with seed S + i. Chat prompts (--chat,\n"
          "                        {\"messages\"}) use the target's chat template, as `dspark generate --chat`\n"
          CLI_MAX_LINE_HELP
          "  --one-at-a-time       with --data: decode the requests one after another, each alone (the\n"
          "                        single-request serving case; --baseline likewise), into one report\n"
          "  --top-p P  --seed S  --ignore-eos  --print-ids  --chat-template FILE  --enable-thinking on|off\n"
          "                        as for `dspark generate`\n"
          "  --policy scheduler|fixed|threshold  scheduler (the default): the prefix scheduler picks each\n"
          "                        request's length, up to --draft-len, to maximize expected tokens per second\n"
          "                        from the (calibrated) confidences and the profiled costs, and switches\n"
          "                        speculation off for a request (plain decoding, same output) while it does\n"
          "                        not pay; fixed: propose --draft-len tokens every round (the draft's own\n"
          "                        acceptance at that length); threshold: propose while the product of the\n"
          "                        confidence head's probabilities stays >= --threshold\n"
          "  --calibration FILE.json  temperatures `dspark calibrate` fitted for this draft, applied to the\n"
          "                        confidences (another draft's file is refused)\n"
          "  --profile FILE.json   costs from `dspark profile` for the scheduler (without it: the verification\n"
          "                        table is measured in-process before decoding, the draft cost during it)\n"
          "  --profile-costs       the scheduler prices verification by the profile's table as it is, not\n"
          "                        corrected by the passes the loop times (reproducible picks)\n"
          "  --draft-len L         tokens proposed per round, the most with the scheduler (default: the\n"
          "                        draft's block size; at most it)\n"
          "  --threshold C         for --policy threshold (0.5; refused with another policy)\n"
          "  --lookup M            prompt lookup: where the request's last M to 4 tokens occurred before in\n"
          "                        its prompt or output, propose the tokens that followed (the longest match,\n"
          "                        latest first) instead of running the draft that round, while such proposals\n"
          "                        are accepted at least as often as the draft's; 0 = off; default 2 with the\n"
          "                        scheduler, 0 with the fixed and threshold policies (they measure the draft)\n"
          "  --lookup-corpus DATA  corpus lookup: from the answers in DATA (what `train` reads, e.g. the\n"
          "                        regenerated answers, rendered with the chat template; conversations cut at\n"
          "                        4096 tokens), the token that most often followed the request's last 1 to 4\n"
          "                        tokens (the longest context seen), chained, proposed where prompt lookup\n"
          "                        finds nothing and the draft's first token is accepted less often\n"
          "  --baseline            also decode the prompt plainly in the same run and report the speedup\n"
          "                        (with --one-at-a-time each request's plain decoding runs beside it)\n"
          "  --report FILE.json    write the report (tau, acceptance per position, rounds, timings)\n"
          "  --repeat N            decode the prompt N times with seeds S .. S+N-1 (one output line each;\n"
          "                        the report aggregates them)\n"
          "  --test-bias-acceptance  accept every draft token: NOT lossless; for the tests that must fail\n"
          "  --threads N  --compute fp32|bf16|int8 (matmul precision; default fp32,\n"
          "                        a GGUF's quantized matrices in int8 as llama.cpp: docs/compute.md)\n"
          "Report convention: tau = tokens committed per target verification pass, the bonus or replacement\n"
          "token counted; acceptance per position conditional (accepted / proposed there) and unconditional\n"
          "(accepted / rounds); the report's \"convention\" field says so.\n");
}

/* Sums of the per-request results (ids dropped); the timings are the batch's, counted once. */
static void accumulate(ds_spec_result *acc, const ds_spec_result *r, int with_time) {
  acc->n += r->n;
  acc->rounds += r->rounds;
  acc->plain_rounds += r->plain_rounds;
  acc->switched_off += r->switched_off;
  acc->proposed += r->proposed;
  acc->lookup_rounds += r->lookup_rounds, acc->lookup_proposed += r->lookup_proposed;
  acc->lookup_accepted += r->lookup_accepted;
  acc->corpus_rounds += r->corpus_rounds, acc->corpus_proposed += r->corpus_proposed;
  acc->corpus_accepted += r->corpus_accepted;
  for (int k = 0; k < DS_SPEC_MAX_LEN; k++) acc->pos_proposed[k] += r->pos_proposed[k], acc->pos_accepted[k] += r->pos_accepted[k];
  for (int c = 0; c < DS_SPEC_MAX_LEN + 2; c++) acc->committed_hist[c] += r->committed_hist[c];
  for (int b = 0; b < DS_SPEC_MAX_LEN + 1 && with_time; b++)
    acc->passes_by_rows[b] += r->passes_by_rows[b], acc->pass_s_by_rows[b] += r->pass_s_by_rows[b];
  if (with_time)
    acc->prefill_s += r->prefill_s, acc->draft_s += r->draft_s, acc->verify_s += r->verify_s, acc->total_s += r->total_s,
    acc->steps += r->steps;
}

/* One request decoded plainly (--baseline with --one-at-a-time), summed into plain. */
static ds_status plain_one(ds_target *t, const int32_t **p, const int64_t *n, const ds_spec_options *o,
                           ds_spec_result *plain) {
  ds_spec_result r;
  DS_TRY(ds_generate_batch(t, p, n, 1, o, &r));
  accumulate(plain, &r, 1);
  ds_spec_result_free(&r);
  return DS_OK;
}

/* Tokens per second after the prefill over `requests` requests: each request's first token
 * comes from the prefill, the rest from the rounds (as `generate` reports its decode rate). */
static double decode_rate(const ds_spec_result *r, int64_t requests) {
  double t = r->total_s - r->prefill_s;
  return r->n > requests && t > 0 ? (double)(r->n - requests) / t : 0.0;
}

/* What the report says beyond the sums of the results. */
typedef struct {
  const char *policy;
  const char *calibration_path; /* NULL: none */
  const double *T;              /* [g] the temperatures (1 past the file's), NULL without calibration */
  const ds_spec_rounds *rounds; /* NULL without the confidence head */
  const char *profile_source;   /* scheduler only */
  int64_t requests_switched_off;
  const char *corpus;           /* --lookup-corpus, NULL: none */
} report_extras;

static const char k_convention[] =
    "tau = tokens committed per target verification pass (the bonus or replacement token counted); "
    "accept_conditional[k] = accepted / proposed at draft position k+1 (given the earlier ones were "
    "accepted); accept_unconditional[k] = accepted at position k+1 / rounds; both count the draft's "
    "proposals and rounds, not prompt lookup's (its own field lookup); "
    "tokens_per_round_histogram[i] = rounds that committed i+1 tokens; per_round times are per "
    "verification pass of the batch (bookkeeping = total - prefill - draft - verify); ECE = expected "
    "calibration error (10 equal-width bins) of the cumulative acceptance prediction prod_{i<=k} "
    "confidence_i against whether positions 1..k+1 were all accepted, over the rounds that proposed "
    "position k+1; learned = what the run learned over all its requests, per position: proposals and "
    "acceptances of the draft and of prompt lookup, and where the verification reached a position, the "
    "confidences' and corpus lookup's predicted acceptance summed against the acceptances";

/* {"rounds", "proposed", "accepted"} of a lookup's proposals, into obj. */
static void add_round_counts(cJSON *obj, int64_t rounds, int64_t proposed, int64_t accepted) {
  cJSON_AddNumberToObject(obj, "rounds", (double)rounds);
  cJSON_AddNumberToObject(obj, "proposed", (double)proposed);
  cJSON_AddNumberToObject(obj, "accepted", (double)accepted);
}

static ds_status write_report(const char *path, const ds_spec_options *o, int64_t g, int64_t requests,
                              const ds_spec_result *s, const ds_spec_result *plain, const report_extras *x) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "convention", k_convention);
  cJSON_AddNumberToObject(j, "requests", (double)requests);
  cJSON_AddStringToObject(j, "policy", x->policy);
  cJSON_AddNumberToObject(j, "draft_len", (double)(o->draft_len > 0 ? o->draft_len : g));
  cJSON_AddNumberToObject(j, "temperature", o->temperature);
  cJSON_AddNumberToObject(j, "generated_tokens", (double)s->n);
  cJSON_AddNumberToObject(j, "rounds", (double)s->rounds);
  cJSON_AddNumberToObject(j, "verification_passes", (double)s->steps);
  cJSON_AddNumberToObject(j, "tau", ds_spec_tau(s));
  cJSON *cond = cJSON_CreateArray(), *uncond = cJSON_CreateArray(), *hist = cJSON_CreateArray();
  for (int64_t k = 0; k < g; k++) {
    cJSON_AddItemToArray(cond, cJSON_CreateNumber(s->pos_proposed[k] > 0 ? s->pos_accepted[k] / s->pos_proposed[k] : 0));
    double own = (double)(s->rounds - s->lookup_rounds); /* the rounds the draft proposed in or decoded plainly */
    cJSON_AddItemToArray(uncond, cJSON_CreateNumber(own > 0 ? s->pos_accepted[k] / own : 0));
  }
  for (int64_t c = 1; c <= g + 1; c++) cJSON_AddItemToArray(hist, cJSON_CreateNumber((double)s->committed_hist[c]));
  cJSON_AddItemToObject(j, "accept_conditional", cond);
  cJSON_AddItemToObject(j, "accept_unconditional", uncond);
  cJSON_AddItemToObject(j, "tokens_per_round_histogram", hist); /* index i: rounds that committed i + 1 tokens */
  double book = s->total_s - s->prefill_s - s->draft_s - s->verify_s;
  cJSON_AddNumberToObject(j, "prefill_s", s->prefill_s);
  cJSON_AddNumberToObject(j, "draft_s", s->draft_s);
  cJSON_AddNumberToObject(j, "verify_s", s->verify_s);
  cJSON_AddNumberToObject(j, "bookkeeping_s", book > 0 ? book : 0);
  cJSON_AddNumberToObject(j, "total_s", s->total_s);
  cJSON *per = cJSON_CreateObject();
  double steps = s->steps > 0 ? (double)s->steps : 1.0;
  cJSON_AddNumberToObject(per, "draft_s", s->draft_s / steps);
  cJSON_AddNumberToObject(per, "verify_s", s->verify_s / steps);
  cJSON_AddNumberToObject(per, "bookkeeping_s", (book > 0 ? book : 0) / steps);
  cJSON_AddItemToObject(j, "per_round", per);
  cJSON *by_rows = cJSON_CreateArray(); /* what a pass of B rows cost in the loop, against a plain step */
  for (int64_t b = 0; b <= g; b++) {
    if (!s->passes_by_rows[b]) continue;
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "rows", (double)(b + 1));
    cJSON_AddNumberToObject(e, "passes", (double)s->passes_by_rows[b]);
    cJSON_AddNumberToObject(e, "mean_s", s->pass_s_by_rows[b] / (double)s->passes_by_rows[b]);
    cJSON_AddItemToArray(by_rows, e);
  }
  cJSON_AddItemToObject(j, "passes_by_rows", by_rows);
  if (plain && plain->rounds > 0) cJSON_AddNumberToObject(j, "plain_step_s", plain->verify_s / (double)plain->rounds);
  cJSON_AddNumberToObject(j, "decode_tokens_per_s", decode_rate(s, requests));
  if (plain) {
    cJSON_AddNumberToObject(j, "plain_generated_tokens", (double)plain->n);
    cJSON_AddNumberToObject(j, "plain_decode_tokens_per_s", decode_rate(plain, requests));
    cJSON_AddNumberToObject(j, "speedup", decode_rate(plain, requests) > 0 ? decode_rate(s, requests) / decode_rate(plain, requests) : 0);
  }
  if (x->rounds) {
    cJSON *cal = cJSON_CreateObject();
    ds_round_set set = ds_spec_rounds_set(x->rounds, NULL);
    if (x->calibration_path) cJSON_AddStringToObject(cal, "file", x->calibration_path);
    else cJSON_AddNullToObject(cal, "file");
    cJSON *raw = ds_ece_json(&set, NULL);
    cJSON_AddNumberToObject(cal, "ece_raw_mean", ds_ece_mean(&set, NULL));
    cJSON_AddItemToObject(cal, "ece_raw", raw);
    if (x->T) {
      cJSON *after = ds_ece_json(&set, x->T);
      cJSON_AddNumberToObject(cal, "ece_calibrated_mean", ds_ece_mean(&set, x->T));
      cJSON_AddItemToObject(cal, "ece_calibrated", after);
      cJSON_AddItemToObject(cal, "temperatures", ds_json_number_array(x->T, g));
    }
    cJSON_AddItemToObject(cal, "count", ds_ece_counts_json(&set));
    cJSON_AddItemToObject(j, "calibration", cal);
  } else {
    cJSON_AddNullToObject(j, "calibration"); /* no confidence head */
  }
  if (o->lookup > 0) {
    cJSON *lk = cJSON_CreateObject();
    cJSON_AddNumberToObject(lk, "suffix_min", (double)o->lookup);
    add_round_counts(lk, s->lookup_rounds, s->lookup_proposed, s->lookup_accepted);
    cJSON_AddItemToObject(j, "lookup", lk);
  } else {
    cJSON_AddNullToObject(j, "lookup");
  }
  cJSON *lj = cJSON_CreateObject();
  const ds_spec_learned *l = o->learned;
  struct { const char *name, *a_name, *b_name; const double *a, *b; } sets[] = {
      {"draft", "proposed", "accepted", l->seen_prop, l->seen_acc},
      {"lookup", "proposed", "accepted", l->lk_prop, l->lk_acc},
      {"confidence", "predicted", "accepted", l->pred_sum, l->pred_acc},
      {"corpus_lookup", "predicted", "accepted", l->corpus_pred, l->corpus_acc}};
  for (size_t i = 0; i < sizeof sets / sizeof *sets; i++) {
    cJSON *e = cJSON_CreateObject();
    cJSON_AddItemToObject(e, sets[i].a_name, cJSON_CreateDoubleArray(sets[i].a, (int)g));
    cJSON_AddItemToObject(e, sets[i].b_name, cJSON_CreateDoubleArray(sets[i].b, (int)g));
    cJSON_AddItemToObject(lj, sets[i].name, e);
  }
  cJSON_AddItemToObject(j, "learned", lj);
  if (x->corpus) {
    cJSON *cp = cJSON_CreateObject();
    cJSON_AddStringToObject(cp, "data", x->corpus);
    cJSON_AddNumberToObject(cp, "tokens", (double)ds_ngram_tokens(o->corpus));
    cJSON_AddNumberToObject(cp, "contexts", (double)ds_ngram_contexts(o->corpus));
    add_round_counts(cp, s->corpus_rounds, s->corpus_proposed, s->corpus_accepted);
    cJSON_AddItemToObject(j, "corpus_lookup", cp);
  } else {
    cJSON_AddNullToObject(j, "corpus_lookup");
  }
  if (o->policy == DS_SPEC_SCHEDULER) {
    cJSON *sc = cJSON_CreateObject();
    cJSON_AddStringToObject(sc, "profile", x->profile_source);
    cJSON_AddNumberToObject(sc, "switch_offs", (double)s->switched_off);
    cJSON_AddNumberToObject(sc, "rounds_switched_off", (double)s->plain_rounds);
    cJSON_AddNumberToObject(sc, "requests_switched_off", (double)x->requests_switched_off);
    cJSON_AddItemToObject(j, "scheduler", sc);
  }
  cJSON_AddStringToObject(j, "gemm", ds_gemm_name());
  cJSON_AddStringToObject(j, "compute", ds_compute_label());
  if (ds_matmul_compute() == DS_COMPUTE_BF16) cJSON_AddStringToObject(j, "gemm_bf16", ds_gemm_bf16_name());
  cJSON_AddStringToObject(j, "weight16_kernels", ds_weight16_kernel_name()); /* the frozen weights' kernels */
  cJSON_AddStringToObject(j, "quantized_kernels", ds_weight_quant_kernel_name());
  cJSON_AddNumberToObject(j, "threads", ds_get_num_threads());
  return ds_json_write_report("--report", path, j);
}

int cmd_speculate(int argc, char **argv) {
  const char *target_dir = NULL, *draft_dir = NULL, *prompt = NULL, *prompt_ids = NULL, *report = NULL, *data = NULL;
  const char *calibration = NULL, *profile = NULL, *corpus_data = NULL;
  ds_spec_options o;
  ds_spec_options_default(&o);
  /* The command's default is the prefix scheduler, which decodes plainly wherever drafting does not
   * pay: a fixed length is the library's default and a measurement (`--policy fixed`), but a weak
   * draft at a fixed 7 proposals decodes at a third of plain speed (docs/speculative-decoding.md). */
  o.policy = DS_SPEC_SCHEDULER;
  o.lookup = -1; /* not given: 2 under the scheduler, off under the policies that measure the draft */
  int chat = 0, print_ids = 0, baseline = 0, one_at_a_time = 0, thinking = -1, taken, threshold_given = 0;
  const char *chat_template = NULL;
  size_t max_line = 0;
  int64_t repeat = 1, threads = 0, n = 0;
  ds_dtype draft_weights = DS_Q8_0;
  double x = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    if (cli_is_help(a)) { usage(stdout); return 0; }
    else if (!strcmp(a, "--target")) { CLI_VALUE(); target_dir = v; }
    else if (!strcmp(a, "--draft")) { CLI_VALUE(); draft_dir = v; }
    else if (!strcmp(a, "--draft-weights")) CLI_DRAFT_WEIGHTS(draft_weights);
    else if (!strcmp(a, "--prompt")) { CLI_VALUE(); prompt = v; }
    else if (!strcmp(a, "--prompt-ids")) { CLI_VALUE(); prompt_ids = v; }
    else if (!strcmp(a, "--data")) { CLI_VALUE(); data = v; }
    else if (!strcmp(a, "--max-line-bytes")) { if (cli_max_line_option(argc, argv, &i, &max_line) < 0) return 2; }
    else if (!strcmp(a, "--chat")) chat = 1;
    else if ((taken = cli_chat_option("speculate", argc, argv, &i, &chat_template, &thinking)) != 0) {
      if (taken < 0) return 2;
    }
    else if (!strcmp(a, "--print-ids")) print_ids = 1;
    else if (!strcmp(a, "--ignore-eos")) o.ignore_eos = 1;
    else if (!strcmp(a, "--baseline")) baseline = 1;
    else if (!strcmp(a, "--one-at-a-time")) one_at_a_time = 1;
    else if (!strcmp(a, "--test-bias-acceptance")) o.test_bias = 1;
    else if (!strcmp(a, "--report")) { CLI_VALUE(); report = v; }
    else if (!strcmp(a, "--calibration")) { CLI_VALUE(); calibration = v; }
    else if (!strcmp(a, "--profile")) { CLI_VALUE(); profile = v; }
    else if (!strcmp(a, "--profile-costs")) o.profile_costs = 1;
    else if (!strcmp(a, "--max-new-tokens")) CLI_INT(0, 1 << 24, o.max_new_tokens);
    else if (!strcmp(a, "--seed")) { CLI_INT(0, INT64_MAX, n); o.seed = (uint64_t)n; }
    else if (!strcmp(a, "--repeat")) CLI_INT(1, 1 << 24, repeat);
    else if (!strcmp(a, "--threads")) CLI_INT(1, 1024, threads);
    else if (!strcmp(a, "--temperature")) CLI_NUM(0, 100, o.temperature);
    else if (!strcmp(a, "--top-p")) CLI_NUM(1e-6, 1, o.top_p);
    else if (!strcmp(a, "--draft-len")) CLI_INT(0, DS_SPEC_MAX_LEN, o.draft_len);
    else if (!strcmp(a, "--lookup")) CLI_INT(0, DS_SPEC_LOOKUP_MAX, o.lookup);
    else if (!strcmp(a, "--lookup-corpus")) { CLI_VALUE(); corpus_data = v; }
    else if (!strcmp(a, "--threshold")) { CLI_NUM(0, 1, o.threshold); threshold_given = 1; }
    else if (!strcmp(a, "--policy")) {
      CLI_VALUE();
      if (!strcmp(v, "fixed")) o.policy = DS_SPEC_FIXED;
      else if (!strcmp(v, "threshold")) o.policy = DS_SPEC_THRESHOLD;
      else if (!strcmp(v, "scheduler")) o.policy = DS_SPEC_SCHEDULER;
      else {
        fprintf(stderr, "dspark speculate: --policy expects fixed, threshold or scheduler, got '%s'\n", v);
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
  if (o.lookup < 0) o.lookup = o.policy == DS_SPEC_SCHEDULER ? 2 : 0;
  if (threshold_given && o.policy != DS_SPEC_THRESHOLD) { /* not a silent no-op under another policy */
    fprintf(stderr, "dspark speculate: --threshold is the threshold policy's: add --policy threshold\n");
    return 2;
  }
  if (one_at_a_time && !data) {
    fprintf(stderr, "dspark speculate: --one-at-a-time needs --data\n");
    return 2;
  }
  const ds_input_path inputs[] = {{"--target", target_dir}, {"--draft", draft_dir}, {"--data", data},
                                  {"--calibration", calibration}, {"--profile", profile},
                                  {"--chat-template", chat_template}, {"--lookup-corpus", corpus_data}};
  int refused =
      report ? cli_output_refused("speculate", "--report", report, DS_OUTPUT_FILE, inputs, CLI_N_INPUTS(inputs)) : 0;
  if (refused) return refused;
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
  ds_prompt_chat cc = {NULL, thinking};
  ds_ids ids = {0};
  ds_prompt_batch batch = {0};
  ds_ngram *corpus = NULL;
  ds_spec_result sum, plain_sum, *res = NULL;
  double *temps = NULL, *T = NULL, *verify = NULL, *head = NULL, *draft_cost = NULL;
  int64_t n_temps = 0, n_verify = 0, n_head = 0, n_draft_cost = 0, requests_off = 0;
  char profile_source[512] = "";
  ds_spec_rounds rounds;
  /* one process, one set of learned rates: every request (and --repeat) starts from what the
   * ones before it taught the scheduler, as a server's would */
  ds_spec_learned learned;
  memset(&learned, 0, sizeof learned);
  o.learned = &learned;
  ds_spec_rounds_init(&rounds, 0);
  memset(&sum, 0, sizeof sum);
  memset(&plain_sum, 0, sizeof plain_sum);
  ds_model_source *src = NULL;
  if (ds_model_source_open(target_dir, &src) != DS_OK) goto report;
  if ((prompt || data || !print_ids) && ds_model_source_tokenizer(src, &tok) != DS_OK) goto report;
  if ((chat || data || corpus_data) && tok && ds_prompt_chat_load(src, chat_template, &cc) != DS_OK) goto report;
  if (corpus_data) {
    ds_model_config mc;
    ds_data_options dopt = {.max_line_bytes = max_line};
    if (ds_model_source_config(src, &mc) != DS_OK ||
        ds_ngram_load(corpus_data, &dopt, tok, cc.tmpl, cc.enable_thinking, mc.n_eos ? (int32_t)mc.eos_token_ids[0] : -1,
                      &corpus) != DS_OK)
      goto report;
    fprintf(stderr, "speculate: corpus lookup from %s: %lld answer tokens, %lld contexts\n", corpus_data,
            (long long)ds_ngram_tokens(corpus), (long long)ds_ngram_contexts(corpus));
  }
  o.corpus = corpus;
  if (data) {
    if (ds_prompt_batch_read(tok, &cc, data, chat, max_line, &batch) != DS_OK) goto report;
  } else {
    if (ds_prompt_ids(tok, &cc, prompt, given, n_given, chat, &ids) != DS_OK) goto report;
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
  if (ds_target_load_source(src, ds_backend_cpu(), NULL, &t) != DS_OK || ds_draft_open(draft_dir, ds_backend_cpu(), &d) != DS_OK ||
      ds_draft_set_decode_weights(d, draft_weights) != DS_OK) {
    free(pv), free(pn);
    goto report;
  }
  const ds_draft_config *dc = ds_draft_get_config(d);
  int64_t g = dc->block_size, drafted = o.draft_len > 0 && o.draft_len < g ? o.draft_len : g;
  if (calibration) {
    if (ds_spec_read_calibration(calibration, d, draft_dir, drafted, &temps, &n_temps) != DS_OK) {
      free(pv), free(pn);
      goto report;
    }
    if (!dc->enable_confidence_head)
      fprintf(stderr, "speculate: the draft has no confidence head: --calibration changes nothing\n");
    o.calibration = temps;
    o.n_calibration = n_temps;
  }
  T = malloc((size_t)g * sizeof *T);
  if (!T) { free(pv), free(pn); goto report; }
  for (int64_t k = 0; k < g; k++) T[k] = k < n_temps ? temps[k] : 1.0;
  if (o.policy == DS_SPEC_SCHEDULER) {
    if (profile) {
      if (ds_spec_read_profile(profile, src, d, draft_dir, &verify, &n_verify, &head, &n_head, &draft_cost,
                               &n_draft_cost) != DS_OK) {
        free(pv), free(pn);
        goto report;
      }
      snprintf(profile_source, sizeof profile_source, "file %s", profile);
      if (n_draft_cost >= drafted) o.draft_block_s = draft_cost[drafted - 1];
      else snprintf(profile_source + strlen(profile_source), sizeof profile_source - strlen(profile_source),
                    " (no draft cost for block length %lld: measured during decoding)", (long long)drafted);
    } else {
      /* a quick table up to this batch's largest pass (at most 64 tokens: the scheduler extends
       * it linearly), timed at one request's counts and their multiples, interpolated between;
       * `dspark profile` measures a steadier one */
      double t0 = ds_time_sec();
      /* --one-at-a-time verifies one request a pass */
      if (ds_spec_profile_quick(t, d, one_at_a_time ? 1 : R, drafted, &verify, &head, &n_verify) != DS_OK) {
        free(pv), free(pn);
        goto report;
      }
      n_head = n_verify - 1;
      snprintf(profile_source, sizeof profile_source, "measured in-process before decoding (B = 1 .. %lld, %.2f s; "
               "the draft cost measured during decoding)", (long long)n_verify, ds_time_sec() - t0);
      fprintf(stderr, "speculate: no --profile: verification costs %s\n", profile_source);
    }
    o.verify_s = verify;
    o.n_verify = n_verify;
    o.head_s = head;
    o.n_head = n_head;
  }
  if (dc->enable_confidence_head) {
    ds_spec_rounds_init(&rounds, g);
    o.on_round = ds_spec_rounds_add;
    o.round_user = &rounds;
  }
  uint64_t seed0 = o.seed;
  ds_status st = DS_OK;
  for (int64_t rep = 0; rep < repeat && st == DS_OK; rep++) {
    cli_stream out = {tok, print_ids, 0};
    o.seed = seed0 + (uint64_t)rep * (uint64_t)R;
    o.on_token = R == 1 ? cli_stream_token : NULL; /* stream a single request as generate does */
    o.user = &out;
    rounds.request_base = (int)(rep * R);
    ds_spec_options po = o; /* the plain decoding of --baseline */
    po.on_token = NULL;
    if (!one_at_a_time) {
      st = ds_speculate_batch(t, d, pv, pn, R, &o, res);
    } else { /* request i alone, with the seed and index it has in the batch; with --baseline its
              * plain decoding beside it, first for every other request: both see the shared host
              * of the same moment (all plain runs after all speculative ones moved with its load) */
      for (int i = 0; st == DS_OK && i < R; i++) {
        ds_spec_options oi = o, pi = po;
        oi.seed = pi.seed = o.seed + (uint64_t)i;
        rounds.request_base = (int)(rep * R + i);
        if (baseline && i % 2) st = plain_one(t, &pv[i], &pn[i], &pi, &plain_sum);
        if (st == DS_OK) st = ds_speculate_batch(t, d, &pv[i], &pn[i], 1, &oi, &res[i]);
        if (st == DS_OK && baseline && i % 2 == 0) st = plain_one(t, &pv[i], &pn[i], &pi, &plain_sum);
      }
    }
    for (int i = 0; st == DS_OK && i < R; i++) {
      requests_off += res[i].switched_off > 0;
      if (R == 1 && !print_ids) cli_print_text(tok, res[i].ids, (size_t)res[i].n, &out.printed, 1);
      else if (R > 1) cli_print_result(tok, print_ids, res[i].ids, res[i].n);
      printf("\n");
      accumulate(&sum, &res[i], i == 0 || one_at_a_time); /* a batch's results share its timings */
      ds_spec_result_free(&res[i]);
    }
    fflush(stdout);
    if (st == DS_OK && baseline && !one_at_a_time) {
      st = ds_generate_batch(t, pv, pn, R, &po, res);
      for (int i = 0; st == DS_OK && i < R; i++) {
        accumulate(&plain_sum, &res[i], i == 0); /* a batch's results share its timings */
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
  double steps = sum.steps > 0 ? (double)sum.steps : 1.0, book = sum.total_s - sum.prefill_s - sum.draft_s - sum.verify_s;
  fprintf(stderr, "\nper round: draft %.3f ms, verify %.3f ms, bookkeeping %.3f ms", 1e3 * sum.draft_s / steps,
          1e3 * sum.verify_s / steps, 1e3 * (book > 0 ? book : 0) / steps);
  if (rounds.n > 0 && !rounds.failed) {
    ds_round_set set = ds_spec_rounds_set(&rounds, NULL);
    fprintf(stderr, "\ncalibration: mean ECE of the cumulative acceptance %.4f", ds_ece_mean(&set, NULL));
    if (calibration) fprintf(stderr, " raw -> %.4f calibrated", ds_ece_mean(&set, T));
  }
  if (o.lookup > 0)
    fprintf(stderr, "\nprompt lookup: %lld rounds, %lld of %lld proposed tokens accepted", (long long)sum.lookup_rounds,
            (long long)sum.lookup_accepted, (long long)sum.lookup_proposed);
  if (corpus)
    fprintf(stderr, "\ncorpus lookup: %lld rounds, %lld of %lld proposed tokens accepted", (long long)sum.corpus_rounds,
            (long long)sum.corpus_accepted, (long long)sum.corpus_proposed);
  if (o.policy == DS_SPEC_SCHEDULER)
    fprintf(stderr, "\nscheduler: speculation switched off %lld times (%lld plain rounds, %lld of %lld requests)",
            (long long)sum.switched_off, (long long)sum.plain_rounds, (long long)requests_off, (long long)(R * repeat));
  fprintf(stderr, "\n");
  report_extras extras = {o.policy == DS_SPEC_SCHEDULER ? "scheduler" : o.policy == DS_SPEC_THRESHOLD ? "threshold" : "fixed",
                          calibration, calibration ? T : NULL, rounds.n > 0 && !rounds.failed ? &rounds : NULL,
                          profile_source, requests_off, corpus_data};
  if (report && write_report(report, &o, g, R * repeat, &sum, baseline ? &plain_sum : NULL, &extras) != DS_OK) goto report;
  rc = 0;
  goto done;
report:
  rc = cli_report_error("speculate");
done:
  free(temps);
  free(T);
  free(verify);
  free(head);
  free(draft_cost);
  ds_spec_rounds_free(&rounds);
  ds_ngram_free(corpus);
  free(given);
  ds_model_source_close(src);
  ds_ids_free(&ids);
  ds_prompt_batch_free(&batch);
  free(res);
  ds_tokenizer_free(tok);
  ds_chat_template_free(cc.tmpl);
  ds_draft_free(d);
  ds_target_free(t);
  return rc;
}
