/* dspark capture: runs the target once over the training sequences and writes the offline cache
 * (DSpark features and/or sparse KD log-probs); rerunning the same command resumes it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/prompt.h"
#include "dspark/capture.h"
#include "dspark/comm.h"
#include "dspark/hfconfig.h"
#include "dspark/kd_select.h"
#include "dspark/model_source.h"

static void usage(FILE *f) {
  fprintf(f,
    "usage: dspark capture --target MODEL --data INPUT --out CACHE [options]\n"
    "MODEL: a model directory or a .gguf file (docs/commands.md, \"Models\")\n"
    "Runs the target once over the training sequences (packed exactly as `dspark train` packs them)\n"
    "and writes CACHE/{manifest.json, shard-%%06d.safetensors, target_weights.safetensors,\n"
    "target_config.json, tokenizer.json} (format: docs/file-formats.md, \"File formats\"). Rerunning the same\n"
    "command after an interruption (kill, full disk) resumes from the last complete shard; the\n"
    "finished cache is byte-identical to an uninterrupted capture; rerunning a finished capture checks\n"
    "every file and rewrites a missing or changed one. One capture per directory at a time: CACHE/.lock\n"
    "holds the writer's pid, and a second capture is refused naming it.\n"
    "  --data INPUT             a file, directory or glob of text / JSONL (messages, ShareGPT) files, plain,\n"
    "                           .gz or .zst, as `dspark train`\n"
    "  --data-format F          auto (default), text or jsonl: how --data is read, as `dspark train`\n"
    "  --skip-bad-lines         skip a malformed line (named on stderr, counted in the summary's\n"
    "                           data_bad_lines_skipped) instead of stopping at it, as `dspark train`\n"
    CLI_MAX_LINE_HELP
    "  --chat-template FILE     Jinja template for chat lines instead of the target's own, as `dspark train`\n"
    "  --enable-thinking on|off pass enable_thinking to the chat template, as `dspark train`\n"
    "  --target-layers N        captured layers spread over [1, L-2] (5), as `dspark train`\n"
    "  --target-layer-ids L,..  explicit layer ids (strictly increasing, -1 = embeddings, at most L-2);\n"
    "                           give one of --target-layers and --target-layer-ids\n"
    "  --dtype bf16|f16|f32|int8  storage dtype of the features and KD log-probs (bf16); int8: features\n"
    "                           as I8 with an fp32 scale per position and captured layer (absmax / 127),\n"
    "                           dequantized by `dspark train --cache`; KD log-probs stay bf16\n"
    "  --seq-len N              tokens per sequence (512); at most the target's max_position_embeddings\n"
    "  --shard-size N           samples per shard (64); two shards are held in memory (one written in the background)\n"
    "  --no-features            write no DSpark features (KD data only; needs --topk)\n"
    "KD (spec/kd.md section 1), written when --topk is given:\n"
    "  --topk K                 teacher top-K ids with full-vocabulary log-probs\n"
    "  --top-p P                keep the prefix whose probability mass before each entry is < P (1: all K)\n"
    "  --min-k M                ... but always at least M entries (1; at most K)\n"
    "  --temperature T          log-probs of softmax(x / T) (1)\n"
    "  --seed S                 recorded in the manifest (0)\n"
    "  --threads N  --quiet  --compute fp32|bf16|int8 (matmul precision; default fp32,\n"
    "                        a GGUF's quantized matrices in int8 as llama.cpp: docs/compute.md)\n"
    CLI_WEIGHTS_HELP
    "                        (the manifest records them: target_weights; a resume must hold them alike)\n"
    "  --estimate               print the cache's size for this data and these options (bytes per stored\n"
    "                           position of each tensor, shards, total, free space) and write nothing;\n"
    "                           --out is optional here\n"
    "  --no-space-check         start even when the output's filesystem has less free space than the\n"
    "                           estimate (by default the capture refuses, naming both numbers)\n"
    "  --forward-only           benchmark: run only the target forward (and the KD logits); write nothing\n"
    "  --throttle-ms N          testing aid: sleep N ms after each shard\n");
}

static int parse_dtype(const char *v, ds_dtype *out) {
  if (!strcmp(v, "bf16")) *out = DS_BF16;
  else if (!strcmp(v, "f16")) *out = DS_F16;
  else if (!strcmp(v, "f32")) *out = DS_F32;
  else if (!strcmp(v, "int8")) *out = DS_I8;
  else {
    fprintf(stderr, "dspark capture: --dtype expects bf16, f16, f32 or int8, got '%s'\n", v);
    return 0;
  }
  return 1;
}

int cmd_capture(int argc, char **argv) {
  ds_capture_options o;
  ds_capture_options_default(&o);
  int kd_flags = 0, layers_given = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = NULL;
    int64_t n;
    double x;
    if (cli_is_help(a)) { usage(stdout); return 0; }
    int data = cli_chat_option("capture", argc, argv, &i, &o.chat_template, &o.enable_thinking);
    if (!data) data = cli_data_format_option("capture", argc, argv, &i, &o.data_format);
    if (data < 0) return 2;
    if (data) continue;
    if (!strcmp(a, "--target")) { CLI_VALUE(); o.target_dir = v; }
    else if (!strcmp(a, "--data")) { CLI_VALUE(); o.data_path = v; }
    else if (!strcmp(a, "--out")) { CLI_VALUE(); o.out_dir = v; }
    else if (!strcmp(a, "--target-layers")) { CLI_INT(1, DS_CACHE_MAX_LAYERS, o.n_target_layers); layers_given = 1; }
    else if (!strcmp(a, "--target-layer-ids")) {
      CLI_VALUE();
      if (!cli_layer_ids(a, v, o.target_layer_ids, &o.n_explicit_layers, DS_CACHE_MAX_LAYERS)) return 2;
    }
    else if (!strcmp(a, "--dtype")) { CLI_VALUE(); if (!parse_dtype(v, &o.dtype)) return 2; }
    else if (!strcmp(a, "--seq-len")) CLI_INT(2, 1 << 20, o.seq_len);
    else if (!strcmp(a, "--shard-size")) CLI_INT(1, 1 << 24, o.shard_size);
    else if (!strcmp(a, "--no-features")) o.features = 0;
    else if (!strcmp(a, "--skip-bad-lines")) o.skip_bad_lines = 1;
    else if (!strcmp(a, "--max-line-bytes")) { if (cli_max_line_option(argc, argv, &i, &o.max_line_bytes) < 0) return 2; }
    else if (!strcmp(a, "--topk")) CLI_INT(1, INT32_MAX, o.topk);
    /* their ranges are ds_kd_select_check's, the one check distill makes too */
    else if (!strcmp(a, "--top-p")) { CLI_NUM(-1e30, 1e30, o.top_p); kd_flags = 1; }
    else if (!strcmp(a, "--min-k")) { CLI_INT(INT32_MIN, INT32_MAX, o.min_k); kd_flags = 1; }
    else if (!strcmp(a, "--temperature")) { CLI_NUM(-1e30, 1e30, o.temperature); kd_flags = 1; }
    else if (!strcmp(a, "--seed")) { CLI_INT(0, INT64_C(1) << 53, n); o.seed = (uint64_t)n; }
    else if (!strcmp(a, "--threads")) CLI_INT(1, 1024, o.threads);
    else if (!strcmp(a, "--quiet")) o.quiet = 1;
    else if (!strcmp(a, "--forward-only")) o.forward_only = 1;
    else if (!strcmp(a, "--estimate")) o.estimate = 1;
    else if (!strcmp(a, "--no-space-check")) o.no_space_check = 1;
    else if (!strcmp(a, "--throttle-ms")) CLI_INT(0, 60000, o.throttle_ms);
    else {
      fprintf(stderr, "dspark capture: %s '%s' (see --help)\n", a[0] == '-' ? "unknown option" : "unexpected argument", a);
      return 2;
    }
  }
  if (!o.target_dir || !o.data_path || (!o.out_dir && !o.forward_only && !o.estimate)) {
    fprintf(stderr, "dspark capture: --target, --data and --out are required (see --help)\n");
    return 2;
  }
  if (kd_flags && !o.topk) {
    fprintf(stderr, "dspark capture: --top-p, --min-k and --temperature need --topk\n");
    return 2;
  }
  if (layers_given && o.n_explicit_layers) {
    fprintf(stderr, "dspark capture: give --target-layers or --target-layer-ids, not both\n");
    return 2;
  }
  if (ds_kd_select_check(o.topk, 1, o.top_p, o.min_k, o.temperature, 0) != DS_OK) {
    fprintf(stderr, "dspark capture: %s\n", ds_last_error());
    return 2;
  }
  if (o.dtype == DS_I8 && !o.features) {
    fprintf(stderr, "dspark capture: --dtype int8 quantizes the features; with --no-features give bf16, f16 or f32\n");
    return 2;
  }
  if (!o.features && !o.topk) {
    fprintf(stderr, "dspark capture: --no-features needs --topk (otherwise nothing is captured)\n");
    return 2;
  }
  const ds_input_path inputs[] = {{"--target", o.target_dir}, {"--data", o.data_path},
                                  {"--chat-template", o.chat_template}};
  int refused =
      o.out_dir ? cli_output_refused("capture", "--out", o.out_dir, DS_OUTPUT_DIR, inputs, CLI_N_INPUTS(inputs)) : 0;
  if (refused) return refused;
  o.comm = cli_comm(); /* under mpirun the ranks split the shards; rank 0 reports */
  if (ds_comm_rank(o.comm) != 0) o.quiet = 1;
  if (!o.out_dir) o.out_dir = "";
  /* Up front, from config.json alone: a --seq-len past the target's position limit is a usage
   * error, found before the weights are loaded or the corpus is read. */
  ds_model_source *src = NULL;
  ds_status st = ds_model_source_open(o.target_dir, &src);
  if (st == DS_OK) st = ds_model_source_check_positions(src, o.seq_len, "--seq-len");
  ds_model_source_close(src);
  if (st != DS_OK) {
    cli_report_error("capture");
    return st == DS_ERR_ARG ? 2 : 1;
  }
  if (ds_capture_run(&o) != DS_OK) return cli_report_error("capture");
  return 0;
}
