/* dspark: train DSpark drafts, distill students, and run speculative decoding. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "dspark/common.h"
#include "dspark/progress.h"

typedef struct {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *summary;
} command;

static const command k_commands[] = {
    {"info", cmd_info, "print a model directory's architecture, sizes and tensors"},
    {"generate", cmd_generate, "generate text with a target model (greedy or sampled)"},
    {"forward", cmd_forward, "run the target over token ids; write logits and captured hidden states"},
    {"tokenize", cmd_tokenize, "encode text / decode ids with a tokenizer.json; ChatML rendering"},
    {"train", cmd_train, "train a DSpark draft against the live target or from a cache"},
    {"capture", cmd_capture, "run the target once; write the offline feature / KD cache (resumable)"},
    {"inspect", cmd_inspect, "print a cache's manifest, counts and bytes per token; verify its checksums"},
    {"export", cmd_export, "write a trained draft in the HF layout serving engines load"},
    {"draft-forward", cmd_draft_forward, "run a draft on given features and anchors; logits, loss and gradients"},
    {"loss", cmd_loss, "evaluate the DSpark loss and its gradients on tensors from a safetensors file"},
};

int cli_report_error(const char *what) {
  ds_progress_break(stderr); /* a progress line left open on a terminal */
  fprintf(stderr, "dspark %s: %s\n", what, ds_last_error());
  return 1;
}

static void usage(FILE *f) {
  fprintf(f, "usage: dspark COMMAND [options]   (dspark COMMAND --help for details)\n\ncommands:\n");
  for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
    fprintf(f, "  %-14s %s\n", k_commands[i].name, k_commands[i].summary);
}

int main(int argc, char **argv) {
  /* Past a file-size limit (ulimit -f) a write fails with EFBIG, which every writer reports
   * naming the file and leaves resumable, instead of a SIGXFSZ that kills the process with
   * no message and a stale temp file. */
  signal(SIGXFSZ, SIG_IGN);
  if (argc < 2) { usage(stderr); return 2; }
  if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
    usage(stdout);
    return 0;
  }
  for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
    if (!strcmp(argv[1], k_commands[i].name)) return k_commands[i].run(argc - 1, argv + 1);
  fprintf(stderr, "dspark: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
