/* dspark regenerate: the options of regeneration (include/dspark/regenerate.h, the library stage
 * behind this command), the target and tokenizer it runs, and its summary. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/prompt.h"
#include "dspark/backend.h"
#include "dspark/checkpoint.h"
#include "dspark/fileio.h"
#include "dspark/model_source.h"
#include "dspark/progress.h"
#include "dspark/prompts.h"
#include "dspark/regenerate.h"
#include "dspark/spec_files.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: dspark regenerate --target MODEL --data FILE|DIR|GLOB --out FILE.jsonl [options]\n"
          "MODEL: a model directory or a .gguf file (docs/commands.md, \"Models\")\n"
          "Replaces every assistant turn of each conversation by the target's own answer (a conversation\n"
          "ending with a user turn gets one appended) and appends it to --out, one line per conversation.\n"
          CLI_WEIGHTS_HELP
          CLI_KV_CACHE_HELP
          "  --data INPUTS         read as `dspark train --data` reads them (a file, a directory, a glob; .gz /\n"
          "                        .zst): JSONL {\"messages\": [{\"role\", \"content\"[, \"reasoning_content\"]}, ...]},\n"
          "                        ShareGPT {\"conversations\": [{\"from\", \"value\"}, ...]} (written out as\n"
          "                        \"messages\"), or {\"text\": TEXT} / {\"prompt\": TEXT} as a single user turn; a\n"
          "                        plain-text file: one user turn per non-blank line\n"
          "  --out FILE            the output (JSONL); when it exists the run resumes after its last complete\n"
          "                        line, after checking every line against --data and these settings\n"
          "  --max-new-tokens N    tokens per answer at most (default 256)\n"
          "  --temperature T       0 = greedy (default 0)\n"
          "  --top-p P             nucleus sampling mass (default 1.0 = off)\n"
          "  --seed S              turn r of conversation k samples with mix(mix(S, k), r) (default 0)\n"
          "  --thinking on|off|keep  on/off: enable_thinking passed to the template (Qwen3); keep: a source turn\n"
          "                        with reasoning keeps it, as the start of the answer, and only the content\n"
          "                        after it is generated; one without is generated with thinking off. Default:\n"
          "                        the template's own default. A generated <think>..</think> block becomes the\n"
          "                        turn's reasoning_content when the template renders reasoning.\n"
          "  --chat-template FILE  this Jinja template instead of the target's\n"
          "  --completion          no chat template: each {\"text\"} / {\"prompt\"} (or plain-text line) is\n"
          "                        continued as text; the output's \"text\" is the prompt plus the continuation\n"
          "  --ignore-eos          generate --max-new-tokens every time\n"
          "  --skip-bad-lines      a malformed line, or a conversation the chat template refuses, is skipped\n"
          "                        (named on stderr, counted in the summary) instead of ending the run\n"
          CLI_MAX_LINE_HELP
          "  --draft DIR           decode speculatively with this DSpark draft (greedy: the same output, the\n"
          "                        confidence scheduler choosing how many tokens it proposes; sampled: its\n"
          "                        whole block every round, so that a resumed run writes the same bytes)\n"
          "  --batch N             turns decoded together (default 16): plain decoding refills a place as\n"
          "                        soon as its answer ends; with --draft, groups of N conversations\n"
          "  --summary FILE        the run's summary (JSON) there instead of stdout\n"
          "  --threads N\n"
          "Answers stop on the target's stop tokens (generation_config.json's eos_token_id, as `dspark\n"
          "generate`), or after --max-new-tokens. Each line gets \"regenerated\": {\"index\", \"source\":\n"
          "\"FILE:LINE\", \"settings\", \"tokens\": [per turn], \"finish\": [\"eos\" | \"length\" per turn]}.\n"
          "A conversation whose prompt plus --max-new-tokens exceeds max_position_embeddings is skipped\n"
          "(named on stderr, counted); a run that skips every conversation fails.\n");
}


typedef struct {
  const char *target_dir, *draft_dir, *summary, *chat_template;
  int64_t threads;
  ds_regen_options r;
} regen_options;

static ds_status summary(const regen_options *o, const ds_regen_summary *g) {
  cJSON *j = cJSON_CreateObject();
  if (!j) return DS_FAIL(DS_ERR_NOMEM, "out of memory");
  cJSON_AddStringToObject(j, "data", o->r.data);
  cJSON_AddStringToObject(j, "out", o->r.out);
  cJSON_AddNumberToObject(j, "files", (double)g->files);
  cJSON_AddNumberToObject(j, "conversations", (double)g->conversations);
  cJSON_AddNumberToObject(j, "resumed_after", (double)g->resumed_after); /* conversations of the input done before */
  cJSON_AddNumberToObject(j, "lines_kept", (double)g->lines_kept);
  cJSON_AddNumberToObject(j, "lines_written", (double)g->lines_written);
  cJSON_AddNumberToObject(j, "skipped", (double)g->skipped);
  cJSON_AddNumberToObject(j, "bad_lines_skipped", (double)g->bad);
  cJSON_AddNumberToObject(j, "turns_regenerated", (double)g->turns);
  cJSON_AddNumberToObject(j, "tokens_generated", (double)g->tokens);
  cJSON *fin = cJSON_AddObjectToObject(j, "finish");
  cJSON_AddNumberToObject(fin, "eos", (double)g->eos);
  cJSON_AddNumberToObject(fin, "length", (double)g->length);
  cJSON_AddNumberToObject(j, "seconds", g->seconds);
  cJSON_AddNumberToObject(j, "tokens_per_s", g->seconds > 0 ? (double)g->tokens / g->seconds : 0);
  cJSON_AddStringToObject(j, "decoder", o->r.speculative ? "speculative" : "plain");
  cJSON_AddStringToObject(j, "settings", g->settings);
  if (o->summary) return ds_json_write_report("--summary", o->summary, j);
  char *s = cJSON_Print(j);
  cJSON_Delete(j);
  if (!s) return DS_FAIL(DS_ERR_NOMEM, "out of memory");
  printf("%s\n", s);
  free(s);
  return DS_OK;
}

static int parse_options(int argc, char **argv, regen_options *o) {
  memset(o, 0, sizeof *o);
  ds_regen_options *r = &o->r;
  r->max_new = 256;
  r->top_p = 1.0;
  r->batch = 16;
  int unused_thinking = -1, taken;
  int64_t n = 0;
  double x = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    if (cli_is_help(a)) { usage(stdout); return 0; }
    else if (!strcmp(a, "--target")) { CLI_VALUE(); o->target_dir = v; }
    else if (!strcmp(a, "--draft")) { CLI_VALUE(); o->draft_dir = v; }
    else if (!strcmp(a, "--data")) { CLI_VALUE(); r->data = v; }
    else if (!strcmp(a, "--out")) { CLI_VALUE(); r->out = v; }
    else if (!strcmp(a, "--summary")) { CLI_VALUE(); o->summary = v; }
    else if (!strcmp(a, "--completion")) r->completion = 1;
    else if (!strcmp(a, "--ignore-eos")) r->ignore_eos = 1;
    else if (!strcmp(a, "--skip-bad-lines")) r->skip_bad = 1;
    else if (!strcmp(a, "--max-line-bytes")) { if (cli_max_line_option(argc, argv, &i, &r->max_line_bytes) < 0) return 2; }
    else if (!strcmp(a, "--max-new-tokens")) CLI_INT(1, 1 << 24, r->max_new);
    else if (!strcmp(a, "--seed")) CLI_INT(0, INT64_MAX, r->seed);
    else if (!strcmp(a, "--batch")) CLI_INT(1, 4096, r->batch);
    else if (!strcmp(a, "--threads")) CLI_INT(1, 1024, o->threads);
    else if (!strcmp(a, "--temperature")) CLI_NUM(0, 100, r->temperature);
    else if (!strcmp(a, "--top-p")) CLI_NUM(1e-6, 1, r->top_p);
    else if (!strcmp(a, "--thinking")) {
      CLI_VALUE();
      if (!strcmp(v, "on")) r->thinking = DS_THINK_ON;
      else if (!strcmp(v, "off")) r->thinking = DS_THINK_OFF;
      else if (!strcmp(v, "keep")) r->thinking = DS_THINK_KEEP;
      else {
        fprintf(stderr, "dspark regenerate: --thinking takes on, off or keep, not '%s'\n", v);
        return 2;
      }
    } else if (!strcmp(a, "--enable-thinking")) {
      fprintf(stderr, "dspark regenerate: use --thinking on|off|keep\n");
      return 2;
    } else if ((taken = cli_chat_option("regenerate", argc, argv, &i, &o->chat_template, &unused_thinking)) != 0) {
      if (taken < 0) return 2;
    } else {
      fprintf(stderr, "dspark regenerate: %s '%s' (see --help)\n", a[0] == '-' ? "unknown option" : "unexpected argument", a);
      return 2;
    }
  }
  r->speculative = o->draft_dir != NULL;
  if (!o->target_dir || !r->data || !r->out) {
    fprintf(stderr, "dspark regenerate: --target, --data and --out are required (see --help)\n");
    return 2;
  }
  /* --out is read back on a resume by design: it is an output here, and an input of --summary */
  const ds_input_path inputs[] = {{"--target", o->target_dir}, {"--draft", o->draft_dir}, {"--data", r->data},
                                  {"--chat-template", o->chat_template}, {"--out", r->out}};
  int refused = cli_output_refused("regenerate", "--out", r->out, DS_OUTPUT_FILE, inputs, CLI_N_INPUTS(inputs) - 1);
  if (!refused && o->summary)
    refused = cli_output_refused("regenerate", "--summary", o->summary, DS_OUTPUT_FILE, inputs, CLI_N_INPUTS(inputs));
  if (refused) return refused;
  if (r->completion && (r->thinking != DS_THINK_DEFAULT || o->chat_template)) {
    fprintf(stderr, "dspark regenerate: --completion uses no chat template: --thinking / --chat-template do not apply\n");
    return 2;
  }
  return -1;
}

int cmd_regenerate(int argc, char **argv) {
  regen_options o;
  int prc = parse_options(argc, argv, &o);
  if (prc >= 0) return prc;
  ds_set_num_threads((int)o.threads);
  int rc = 1;
  ds_tokenizer *tok = NULL;
  ds_prompt_chat cc = {NULL, -1};
  ds_regen *g = NULL;
  ds_target *target = NULL;
  ds_draft *draft = NULL;
  ds_model_source *src = NULL;
  ds_model_config pre;
  if (ds_model_source_open(o.target_dir, &src) != DS_OK || ds_model_source_tokenizer(src, &tok) != DS_OK) goto report;
  if (!o.r.completion && ds_prompt_chat_load(src, o.chat_template, &cc) != DS_OK) goto report;
  /* the tokenizer against config.json, before the weights are loaded */
  const char *cfg_label = ds_model_source_label(src, DS_MODEL_CONFIG);
  if (ds_model_source_config(src, &pre) != DS_OK ||
      ds_target_check_tokenizer(&pre, tok, cfg_label, ds_model_source_label(src, DS_MODEL_TOKENIZER)) != DS_OK)
    goto report;
  if (o.r.max_new >= pre.max_position_embeddings) { /* every prompt needs a position: all would be skipped */
    fprintf(stderr, "dspark regenerate: %s: max_position_embeddings is %lld, so --max-new-tokens %lld leaves no "
            "position for a prompt; give at most %lld (and fewer than that minus the longest prompt)\n",
            cfg_label, (long long)pre.max_position_embeddings, (long long)o.r.max_new,
            (long long)pre.max_position_embeddings - 1);
    rc = 2;
    goto done;
  }
  if (ds_regen_open(&o.r, tok, cc.tmpl, pre.max_position_embeddings, &g) != DS_OK) goto report;
  if (ds_regen_remaining(g) > 0) {
    if (ds_target_load_source(src, ds_backend_cpu(), NULL, &target) != DS_OK) goto report;
    if (o.draft_dir && ds_draft_open(o.draft_dir, ds_backend_cpu(), &draft) != DS_OK) goto report;
  }
  if (ds_regen_run(g, target, draft) != DS_OK) goto report;
  ds_regen_summary s;
  ds_regen_get_summary(g, &s);
  if (summary(&o, &s) != DS_OK) goto report;
  int64_t passed = s.skipped + s.bad; /* each was named in a note above */
  if (passed > 0 && s.lines_written + s.lines_kept == 0) {
    DS_FAIL(DS_ERR_ARG, "nothing was regenerated: all %lld conversations of %s were skipped (%lld too long for "
            "max_position_embeddings %lld with --max-new-tokens %lld, or empty; %lld bad); %s holds no line",
            (long long)(s.conversations + s.bad_lines), o.r.data, (long long)s.skipped,
            (long long)pre.max_position_embeddings, (long long)o.r.max_new, (long long)s.bad, o.r.out);
    goto report;
  }
  if (passed > 0)
    ds_note("regenerate: %lld of %lld conversations skipped (%lld too long or empty, %lld bad): see the notes above",
            (long long)passed, (long long)(s.conversations + s.bad_lines), (long long)s.skipped, (long long)s.bad);
  rc = 0;
  goto done;
report:
  rc = cli_report_error("regenerate");
done:
  ds_regen_close(g);
  ds_tokenizer_free(tok);
  ds_chat_template_free(cc.tmpl);
  ds_draft_free(draft);
  ds_target_free(target);
  ds_model_source_close(src);
  return rc;
}
