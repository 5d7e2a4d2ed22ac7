/* dspark pretrain / dspark distill: causal-LM training of a student on the trainer core
 * (include/dspark/lm_trainer.h); pretraining is the LM loss alone, distillation mixes the
 * ghost-token sparse KL (spec/kd.md) in by --kd-loss-alpha. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/loop_args.h"
#include "cli/prompt.h"
#include "dspark/kd_select.h"
#include "dspark/lm_trainer.h"

static void usage(FILE *f, int distill) {
  if (distill)
    fprintf(f,
      "usage: dspark distill (--teacher MODEL | --cache CACHE) (--student MODEL | --student-config FILE) --out RUN [options]\n"
      "MODEL: a model directory or a .gguf file (docs/commands.md, \"Models\")\n"
      "Distills a student from a frozen teacher: total = (1 - alpha) LM + alpha KD per supervised token,\n"
      "divided by the step's global token count; KD is the ghost-token sparse KL over the teacher's top-K\n"
      "(+ the ghost bucket), or the dense KL with a live teacher and --topk 0 (spec/kd.md).\n"
      "  --teacher MODEL       the live teacher (runs on every batch; its top-K selected as capture does)\n"
      CLI_WEIGHTS_HELP
      "                        (the live teacher's; run.json records it as teacher_weights; not with --cache)\n"
      "  --cache CACHE         an offline cache from `dspark capture --topk K` (its sequences; its K must be >=\n"
      "                        --topk, its temperature --temperature; with --teacher too, the teacher is checked)\n"
      "  --student MODEL | --student-config FILE   continue an HF checkpoint (or a .gguf), or a fresh student (seeded)\n"
      "  --tokenizer FILE      tokenizer.json (default: the student's, else the teacher's or the cache's)\n"
      "  --data INPUT  --data-format auto|text|jsonl  --skip-bad-lines  --seq-len N (512)  --eval-seqs N (8)\n"
      "                        (not with --cache; INPUT: a file, directory or glob, as `dspark train`)\n"
      "  --chat-template FILE  chat data rendered by this Jinja template (default: the tokenizer's, from\n"
      "                        chat_template.jinja or tokenizer_config.json beside it; ChatML if none)\n"
      "  --enable-thinking on|off  pass enable_thinking to the chat template (Qwen3; default: not passed)\n"
      "  --topk K (64; 0 = dense KL)  --top-p P (1)  --min-k M (1)  --temperature T (1)  --reverse\n"
      "  --kd-loss-alpha A     in [0, 1] (1: KD only, the LM loss is not computed)\n"
      "  --no-ghost            ablation only: renormalize both sides over the kept top-K (no ghost bucket)\n"
      "  --intermediate S:T[:cosine|mse]   (repeatable) the student's hidden state after layer S against the\n"
      "                        teacher's after layer T (-1 = embeddings), through a learned projection when the\n"
      "                        sizes differ; averaged and rescaled to the logits KD's magnitude (kd.md section 3).\n"
      "                        With --cache, the cache needs features with T in its --target-layer-ids\n"
      "  --chunk-rows N        rows per logits/loss chunk (128)\n"
      CLI_MAX_LINE_HELP);
  else
    fprintf(f,
      "usage: dspark pretrain (--config config.json | --student MODEL) --tokenizer tokenizer.json --data FILE --out RUN [options]\n"
      "MODEL: a model directory or a .gguf file (docs/commands.md, \"Models\")\n"
      "Trains a causal LM (Llama / Qwen2 / Qwen3 config) on text or chat JSONL with the LM cross-entropy over\n"
      "supervised tokens, divided by the step's global token count; evaluations report the held-out\n"
      "cross-entropy and perplexity. `dspark export RUN --out DIR` writes the HF model.\n"
      "  --config FILE         a config.json for a fresh model (weights seeded by --seed)\n"
      "  --student MODEL       continue an HF checkpoint (or a .gguf) instead\n"
      "  --tokenizer FILE      tokenizer.json (default: --student MODEL's)\n"
      "  --data INPUT  --data-format auto|text|jsonl  --skip-bad-lines  --seq-len N (512)  --eval-seqs N (8)\n"
      "                        (INPUT: a file, directory or glob, plain / .gz / .zst, as `dspark train`)\n"
      "  --chat-template FILE  chat data rendered by this Jinja template (default: the tokenizer's, from\n"
      "                        chat_template.jinja or tokenizer_config.json beside it; ChatML if none)\n"
      "  --enable-thinking on|off  pass enable_thinking to the chat template (Qwen3; default: not passed)\n"
      "  --chunk-rows N        rows per logits/loss chunk (128)\n"
      CLI_MAX_LINE_HELP);
  fputs(cli_loop_usage, f);
}

static int lm_command(int argc, char **argv, int distill) {
  const char *name = distill ? "distill" : "pretrain";
  ds_lm_train_options o;
  ds_lm_train_options_default(&o, distill);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    int64_t n;
    double x;
    if (cli_is_help(a)) { usage(stdout, distill); return 0; }
    int loop = cli_loop_option(argc, argv, &i, &o.loop);
    if (loop < 0) return 2;
    if (loop) continue;
    int chat = cli_chat_option(name, argc, argv, &i, &o.chat_template, &o.enable_thinking);
    if (chat < 0) return 2;
    if (chat) continue;
    int format = cli_data_format_option(name, argc, argv, &i, &o.data_format);
    if (format < 0) return 2;
    if (format) continue;
    if (!strcmp(a, "--student")) { CLI_VALUE(); o.student_dir = v; }
    else if (!strcmp(a, distill ? "--student-config" : "--config")) { CLI_VALUE(); o.student_config = v; }
    else if (!strcmp(a, "--tokenizer")) { CLI_VALUE(); o.tokenizer_path = v; }
    else if (!strcmp(a, "--data")) { CLI_VALUE(); o.data_path = v; }
    else if (!strcmp(a, "--skip-bad-lines")) o.skip_bad_lines = 1;
    else if (!strcmp(a, "--max-line-bytes")) { if (cli_max_line_option(argc, argv, &i, &o.max_line_bytes) < 0) return 2; }
    else if (!strcmp(a, "--seq-len")) CLI_INT(2, 1 << 20, o.seq_len);
    else if (!strcmp(a, "--eval-seqs")) CLI_INT(0, 1 << 20, o.eval_seqs);
    else if (!strcmp(a, "--chunk-rows")) CLI_INT(1, 1 << 20, o.kd.chunk_rows);
    else if (distill && !strcmp(a, "--teacher")) { CLI_VALUE(); o.teacher_dir = v; }
    else if (distill && !strcmp(a, "--cache")) { CLI_VALUE(); o.cache_dir = v; }
    else if (distill && !strcmp(a, "--topk")) CLI_INT(0, 1 << 24, o.kd.top_k);
    else if (distill && !strcmp(a, "--top-p")) CLI_NUM(-1e9, 1e9, o.kd.top_p);
    else if (distill && !strcmp(a, "--min-k")) CLI_INT(-(1 << 24), 1 << 24, o.kd.min_k);
    else if (distill && !strcmp(a, "--temperature")) CLI_NUM(-1e9, 1e9, o.kd.temperature);
    else if (distill && !strcmp(a, "--reverse")) o.kd.reverse = 1;
    else if (distill && !strcmp(a, "--no-ghost")) o.kd.no_ghost = 1;
    else if (distill && !strcmp(a, "--kd-loss-alpha")) CLI_NUM(-1e9, 1e9, o.kd.kd_loss_alpha);
    else if (distill && !strcmp(a, "--intermediate")) {
      CLI_VALUE();
      if (o.n_intermediate == DS_KD_MAX_INTERMEDIATE) {
        fprintf(stderr, "dspark %s: --intermediate given more than %d times\n", name, DS_KD_MAX_INTERMEDIATE);
        return 2;
      }
      if (ds_kd_inter_parse(v, &o.intermediate[o.n_intermediate++]) != DS_OK) {
        fprintf(stderr, "dspark %s: %s\n", name, ds_last_error());
        return 2;
      }
    }
    else {
      if (ds_kd_check_removed_option(a) != DS_OK) {
        fprintf(stderr, "dspark %s: %s\n", name, ds_last_error());
        return 2;
      }
      fprintf(stderr, "dspark %s: %s '%s' (see --help)\n", name, a[0] == '-' ? "unknown option" : "unexpected argument", a);
      return 2;
    }
  }
  if (!cli_loop_check(name, &o.loop)) return 2;
  if (distill && o.cache_dir && cli_weights_given()) {
    fprintf(stderr, "dspark distill: --weights sets how the live teacher holds its weights, but with --cache the "
            "teacher does not run: the cache's manifest records the weights it was captured with (target_weights; "
            "`dspark inspect %s`)\n", o.cache_dir);
    return 2;
  }
  const ds_input_path inputs[] = {{"--student", o.student_dir}, {distill ? "--student-config" : "--config", o.student_config},
                                  {"--tokenizer", o.tokenizer_path}, {"--data", o.data_path}, {"--teacher", o.teacher_dir},
                                  {"--cache", o.cache_dir}, {"--chat-template", o.chat_template}};
  int refused = cli_output_refused(name, "--out", o.loop.out_dir, DS_OUTPUT_DIR, inputs, CLI_N_INPUTS(inputs));
  if (refused) return refused;
  /* the loss options' ranges are checked by the library, naming each (spec/kd.md section 3) */
  if (ds_kd_select_check(o.kd.top_k, 1, o.kd.top_p, o.kd.min_k, o.kd.temperature, INT32_MAX) != DS_OK ||
      ds_kd_loss_config_check(&o.kd, INT32_MAX) != DS_OK) {
    fprintf(stderr, "dspark %s: %s\n", name, ds_last_error());
    return 2;
  }
  if (ds_train_lm(&o) != DS_OK) return cli_report_error(name);
  return 0;
}

int cmd_pretrain(int argc, char **argv) { return lm_command(argc, argv, 0); }
int cmd_distill(int argc, char **argv) { return lm_command(argc, argv, 1); }
