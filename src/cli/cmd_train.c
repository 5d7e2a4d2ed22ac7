/* dspark train: trains a DSpark draft for a target, online (the target runs on every batch) or
 * from an offline cache written by `dspark capture`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/loop_args.h"
#include "cli/prompt.h"
#include "dspark/draft_trainer.h"

static void usage(FILE *f) {
  fprintf(f,
    "usage: dspark train --target MODEL --data FILE --out RUN_DIR [options]\n"
    "       dspark train --cache CACHE --out RUN_DIR [--target MODEL] [--data FILE] [options]\n"
    "MODEL: a model directory or a .gguf file (docs/commands.md, \"Models\")\n"
    "Trains a DSpark draft (spec/dspark.md) against the live target, or from a cache written by\n"
    "`dspark capture` (its sequences and features; the target is not loaded), and writes RUN_DIR/\n"
    "{run.json, target_config.json, metrics.jsonl, checkpoint.safetensors}.\n"
    "cache:\n"
    "  --cache CACHE           train from CACHE; every manifest field is checked against the options\n"
    "                          (seq len, layers; with --target its weights, config and tokenizer hashes;\n"
    "                          with --data its hash). --seq-len / --target-layers default to the cache's.\n"
    "                          An f32 cache gives the online run bit for bit; bf16/f16 round the features.\n"
    "  --cache-prefetch N      samples converted ahead by the prefetch thread (4; at least 2)\n"
    "  --cache-preload         convert the whole cache to fp32 in memory first (benchmarks, small caches)\n"
    "data:\n"
    "  --data INPUT            a file, a directory (its data files, recursively) or a glob ('data/*.jsonl.gz'):\n"
    "                          plain text, or JSONL ({\"text\"}, {\"messages\"} or ShareGPT {\"conversations\"}\n"
    "                          per line), each file optionally .gz / .zst; docs/data.md\n"
    "  --skip-bad-lines        skip a malformed line (counted and reported) instead of stopping at it\n"
    CLI_MAX_LINE_HELP
    "  --data-format F         auto (default: .jsonl/.ndjson/.json are JSONL and .txt is text, any case;\n"
    "                          other names by content: a first line that is a JSON object means JSONL),\n"
    "                          text or jsonl\n"
    "  --chat-template FILE    Jinja template for {\"messages\"} lines (default: the target's\n"
    "                          chat_template.jinja or tokenizer_config.json chat_template, ChatML if none)\n"
    "  --enable-thinking on|off  pass enable_thinking to the chat template (Qwen3; default: not passed)\n"
    "  --seq-len N             tokens per training sequence (512)\n"
    "  --eval-seqs N           sequences held out from the end of the data for evaluation (8)\n"
    "draft:\n"
    "  --draft-layers N        draft depth n_d (1)\n"
    "  --block-size G          block size gamma (7)\n"
    "  --target-layers N       number of captured target layers, spread over [1, L-2] (5)\n"
    "  --target-layer-ids L,.. explicit captured layer ids (strictly increasing, at most L-2)\n"
    "  --mask-token-id ID      mask token (default: the tokenizer's reserved mask token, else the last\n"
    "                          special token that is no bos/eos and that the data never contains)\n"
    "  --markov TYPE           sequential head: vanilla (default), gated, rnn, none\n"
    "  --markov-rank R         Markov rank r (256); 0 means none\n"
    "  --no-confidence-head    train without the confidence head\n"
    "  --confidence-no-markov  confidence head sees h only (not the previous token's embedding)\n"
    "  --num-anchors N         anchors per sequence (512)\n"
    "  --draft-vocab N         predict over N target ids only (spec 4a): the chat template's assistant-turn\n"
    "                          ids, the stop / eos ids, then the most frequent supervised tokens of the\n"
    "                          training split; the head GEMMs run over N rows (docs/training.md)\n"
    "loss:\n"
    "  --alpha-ce A --alpha-l1 B --alpha-conf C   term weights (0.1, 0.9, 1.0)\n"
    "  --decay-gamma X         weights exp(-k/X) per slot (4.0); 0 disables\n"
    "  --decay-paper           the paper's exp(-(k-1)/g) instead\n"
    "  --ce-only               no teacher: CE only (DFlash-style objective)\n"
    "  --chunk-rows N          rows per fused logits/loss chunk (128)\n");
  fputs(cli_loop_usage, f);
}

int cmd_train(int argc, char **argv) {
  ds_draft_train_options o;
  ds_draft_train_options_default(&o);
  ds_loop_options *l = &o.loop;
  int seq_len_given = 0, layers_given = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = NULL;
    int64_t n;
    double x;
    if (cli_is_help(a)) { usage(stdout); return 0; }
    int loop = cli_loop_option(argc, argv, &i, l);
    if (loop < 0) return 2;
    if (loop) continue;
    int data = cli_chat_option("train", argc, argv, &i, &o.chat_template, &o.enable_thinking);
    if (!data) data = cli_data_format_option("train", argc, argv, &i, &o.data_format);
    if (data < 0) return 2;
    if (data) continue;
    if (!strcmp(a, "--target")) { CLI_VALUE(); o.target_dir = v; }
    else if (!strcmp(a, "--data")) { CLI_VALUE(); o.data_path = v; }
    else if (!strcmp(a, "--skip-bad-lines")) o.skip_bad_lines = 1;
    else if (!strcmp(a, "--max-line-bytes")) { if (cli_max_line_option(argc, argv, &i, &o.max_line_bytes) < 0) return 2; }
    else if (!strcmp(a, "--cache")) { CLI_VALUE(); o.cache_dir = v; }
    else if (!strcmp(a, "--cache-prefetch")) CLI_INT(2, 1024, o.cache_prefetch);
    else if (!strcmp(a, "--cache-preload")) o.cache_preload = 1;
    else if (!strcmp(a, "--seq-len")) { CLI_INT(2, 1 << 20, o.seq_len); seq_len_given = 1; }
    else if (!strcmp(a, "--eval-seqs")) CLI_INT(0, 1 << 20, o.eval_seqs);
    else if (!strcmp(a, "--draft-layers")) CLI_INT(1, 256, o.draft_layers);
    else if (!strcmp(a, "--block-size")) CLI_INT(1, 64, o.block_size);
    else if (!strcmp(a, "--target-layers")) {
      CLI_INT(1, DS_MAX_TARGET_LAYERS, o.n_target_layers);
      layers_given = o.target_layers_given = 1;
    }
    else if (!strcmp(a, "--target-layer-ids")) {
      CLI_VALUE();
      if (!cli_layer_ids(a, v, o.target_layer_ids, &o.n_explicit_layers, DS_MAX_TARGET_LAYERS)) return 2;
    }
    else if (!strcmp(a, "--mask-token-id")) CLI_INT(0, INT32_MAX, o.mask_token_id);
    else if (!strcmp(a, "--markov")) {
      CLI_VALUE();
      if (!cli_markov_type(a, v, &o.markov_type)) return 2;
    }
    else if (!strcmp(a, "--markov-rank")) CLI_INT(0, 1 << 20, o.markov_rank);
    else if (!strcmp(a, "--no-confidence-head")) o.confidence_head = 0;
    else if (!strcmp(a, "--confidence-no-markov")) o.confidence_with_markov = 0;
    else if (!strcmp(a, "--num-anchors")) CLI_INT(1, 1 << 20, o.num_anchors);
    else if (!strcmp(a, "--draft-vocab")) CLI_INT(1, INT32_MAX, o.draft_vocab);
    else if (!strcmp(a, "--alpha-ce")) CLI_NUM(0, 1e6, o.loss.alpha_ce);
    else if (!strcmp(a, "--alpha-l1")) CLI_NUM(0, 1e6, o.loss.alpha_l1);
    else if (!strcmp(a, "--alpha-conf")) CLI_NUM(0, 1e6, o.loss.alpha_conf);
    else if (!strcmp(a, "--decay-gamma")) CLI_NUM(-1e6, 1e6, o.loss.decay_gamma);
    else if (!strcmp(a, "--decay-paper")) o.loss.decay = DS_DSPARK_DECAY_PAPER;
    else if (!strcmp(a, "--ce-only")) o.no_teacher = 1;
    else if (!strcmp(a, "--chunk-rows")) CLI_INT(1, 1 << 20, o.loss.chunk_rows);
    else {
      fprintf(stderr, "dspark train: %s '%s' (see --help)\n", a[0] == '-' ? "unknown option" : "unexpected argument", a);
      return 2;
    }
  }
  if (layers_given && o.n_explicit_layers) {
    fprintf(stderr, "dspark train: --target-layers and --target-layer-ids are alternatives; give one (see --help)\n");
    return 2;
  }
  if (!cli_loop_check("train", l)) return 2;
  if (!l->out_dir || (!o.cache_dir && (!o.target_dir || !o.data_path))) {
    fprintf(stderr, "dspark train: --out and either --cache or both --target and --data are required (see --help)\n");
    return 2;
  }
  /* a resume reads the run directory back by design: it is an output, never one of these */
  const ds_input_path inputs[] = {{"--target", o.target_dir}, {"--data", o.data_path}, {"--cache", o.cache_dir},
                                  {"--chat-template", o.chat_template}};
  int refused = cli_output_refused("train", "--out", l->out_dir, DS_OUTPUT_DIR, inputs, CLI_N_INPUTS(inputs));
  if (refused) return refused;
  if (o.cache_dir) { /* unset: the cache's */
    if (!seq_len_given) o.seq_len = 0;
    if (!layers_given) o.n_target_layers = 0;
  }
  if (o.markov_type == DS_MARKOV_NONE) o.markov_rank = 0;
  else if (o.markov_rank == 0) o.markov_type = DS_MARKOV_NONE;
  if (ds_train_draft(&o) != DS_OK) return cli_report_error("train");
  return 0;
}
