/* dspark: train DSpark drafts, distill students, and run speculative decoding. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "dspark/backend.h"
#include "dspark/comm.h"
#include "dspark/common.h"
#include "dspark/model_source.h"
#include "dspark/progress.h"
#include "dspark/target.h"

typedef struct {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *summary;
  int computes; /* runs matmuls: says once when they would run a slow path on this CPU */
  int weights;  /* runs a frozen target (not one whose tables a draft copies while training): takes --weights */
  int kv;       /* decodes with the target's KV cache: takes --kv-cache */
} command;

static const command k_commands[] = {
    {"info", cmd_info, "print a model's (directory or .gguf) architecture, sizes and tensors", 1, 1, 0},
    {"convert", cmd_convert, "write a llama.cpp GGUF model file as a Hugging Face model directory", 0, 0, 0},
    {"generate", cmd_generate, "generate text with a target model (greedy or sampled)", 1, 1, 1},
    {"forward", cmd_forward, "run the target over token ids; write logits and captured hidden states", 1, 1, 1},
    {"tokenize", cmd_tokenize, "encode text / decode ids with a tokenizer.json; ChatML rendering", 0, 0, 0},
    {"train", cmd_train, "train a DSpark draft against the live target or from a cache", 1, 0, 0},
    {"pretrain", cmd_pretrain, "train a causal LM (a student) from scratch or a checkpoint with the LM loss", 1, 0, 0},
    {"distill", cmd_distill, "distill a student from a teacher (live or cached top-K): ghost-token KD + LM", 1, 1, 0},
    {"capture", cmd_capture, "run the target once; write the offline feature / KD cache (resumable)", 1, 1, 0},
    {"inspect", cmd_inspect, "print a cache's manifest, counts and bytes per token; verify its checksums", 0, 0, 0},
    {"export", cmd_export, "write a trained draft in the HF layout serving engines load", 0, 0, 0},
    {"regenerate", cmd_regenerate, "replace conversations' assistant turns by the target's own answers (resumable)", 1, 1, 1},
    {"speculate", cmd_speculate, "lossless speculative decoding with a DSpark draft; tau, acceptance, speedup", 1, 1, 1},
    {"calibrate", cmd_calibrate, "fit the draft's confidences to its acceptance (Sequential Temperature Scaling)", 1, 1, 1},
    {"profile", cmd_profile, "measure this machine's verification cost per batch of tokens and the draft's cost", 1, 1, 1},
    {"draft-forward", cmd_draft_forward, "run a draft on given features and anchors; logits, loss and gradients", 1, 0, 0},
    {"loss", cmd_loss, "evaluate the DSpark loss and its gradients on tensors from a safetensors file", 0, 0, 0},
    {"plot", cmd_plot, "draw a run's training curves (PNG, with gnuplot) from its metrics.jsonl", 0, 0, 0},
    {"kd-loss", cmd_kd_loss, "evaluate the KD loss (ghost-token top-K / dense KL + LM) and its gradient", 0, 0, 0},
};

/* The program's one communicator (the library keeps none of its own). */
static ds_comm *g_comm;

ds_comm *cli_comm(void) { return g_comm; }

int cli_report_error(const char *what) {
  ds_progress_break(stderr); /* a progress line left open on a terminal */
  if (ds_comm_size(g_comm) > 1)
    fprintf(stderr, "dspark %s (rank %d of %d): %s\n", what, ds_comm_rank(g_comm), ds_comm_size(g_comm),
            ds_last_error());
  else
    fprintf(stderr, "dspark %s: %s\n", what, ds_last_error());
  return 1;
}

/* A command's exit status, ending the whole job when one rank of several failed: the other
 * ranks may be waiting in a collective for it and would wait forever. */
static int finish(int status) {
  if (status != 0 && ds_comm_size(g_comm) > 1) {
    fflush(stdout);
    fprintf(stderr, "dspark: rank %d of %d failed (exit status %d); ending the job\n", ds_comm_rank(g_comm),
            ds_comm_size(g_comm), status);
    ds_comm_abort(g_comm, status);
  }
  ds_comm_close(g_comm);
  g_comm = NULL;
  return status;
}

static void usage(FILE *f) {
  fprintf(f, "usage: dspark COMMAND [options]   (dspark COMMAND --help for details)\n\ncommands:\n");
  for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
    fprintf(f, "  %-14s %s\n", k_commands[i].name, k_commands[i].summary);
  fprintf(f, "\nmatmuls: %s, %d threads\n", ds_gemm_name(), ds_get_num_threads());
  fprintf(f, "bf16 matmuls (--compute bf16): %s\n", ds_gemm_bf16_name());
  fprintf(f, "frozen weights: 16-bit and fp32 %s; quantized %s\n", ds_weight16_kernel_name(),
          ds_weight_quant_kernel_name());
  fprintf(f, "data parallelism: %s\n", ds_comm_mpi_built() ? "MPI (mpirun -np N dspark train|pretrain|distill ...)"
                                                            : "not built (no MPI in this build)");
}

/* The next `opt VALUE` or `opt=VALUE` from argv[2] on (argv[1] is the command), taken out of argv
 * (the final NULL moved with it): 1 with *v its value, NULL when none follows; 0 when none is
 * left. The options main takes this way are shared by many commands, so their own parsers never
 * see them. */
static int take_option(const char *opt, int *argc, char **argv, const char **v) {
  size_t n = strlen(opt);
  for (int i = 2; i < *argc; i++) {
    int used = 0;
    if (!strcmp(argv[i], opt)) {
      *v = i + 1 < *argc ? argv[i + 1] : NULL;
      used = *v ? 2 : 1;
    } else if (!strncmp(argv[i], opt, n) && argv[i][n] == '=') {
      *v = argv[i] + n + 1;
      used = 1;
    }
    if (!used) continue;
    memmove(argv + i, argv + i + used, (size_t)(*argc - i - used + 1) * sizeof *argv);
    *argc -= used;
    return 1;
  }
  return 0;
}

/* The usage message of a value opt does not take; returns 0 (a usage error). */
static int bad_value(const char *cmd, const char *opt, const char *takes, const char *v) {
  fprintf(stderr, "dspark %s: %s takes %s (got %s%s%s)\n", cmd, opt, takes, v ? "'" : "no value", v ? v : "",
          v ? "'" : "");
  return 0;
}

/* --compute fp32|bf16|int8, shared by every command that computes; sets the process-wide matmul
 * precision (include/dspark/backend.h). 1 ok, 0 after a usage message. */
static int take_compute_option(const char *cmd, int *argc, char **argv) {
  const char *v;
  while (take_option("--compute", argc, argv, &v)) {
    ds_compute c;
    if (!v || !ds_compute_parse(v, &c)) return bad_value(cmd, "--compute", "fp32, bf16 or int8", v);
    ds_set_matmul_compute(c);
  }
  return 1;
}

/* --weights as-stored|bf16|f32 of the commands that run a frozen target (capture's, distill's
 * live teacher included: a cache stores a quantized table dequantized); sets how the target holds
 * its weights (model_source.h; the default for them: as-stored). The other commands keep the
 * library's default (a GGUF dequantized to fp32): train copies the live target's tables into the
 * draft it trains. */
static int g_weights_given; /* --weights was on the command line */

int cli_weights_given(void) { return g_weights_given; }

static int take_weights_option(const char *cmd, int *argc, char **argv) {
  ds_set_target_weights(DS_WEIGHTS_AS_STORED);
  const char *v;
  while (take_option("--weights", argc, argv, &v)) {
    ds_weights_mode w;
    if (!v || !ds_weights_mode_parse(v, &w)) return bad_value(cmd, "--weights", "as-stored, bf16 or f32", v);
    ds_set_target_weights(w);
    g_weights_given = 1;
  }
  return 1;
}

/* --kv-cache f32|f16 of the commands that decode with a KV cache (ds_set_kv_cache_dtype). */
static int take_kv_cache_option(const char *cmd, int *argc, char **argv) {
  const char *v;
  while (take_option("--kv-cache", argc, argv, &v)) {
    if (!v || (strcmp(v, "f32") && strcmp(v, "f16"))) return bad_value(cmd, "--kv-cache", "f32 or f16", v);
    (void)ds_set_kv_cache_dtype(strcmp(v, "f16") ? DS_F32 : DS_F16);
  }
  return 1;
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
    if (!strcmp(argv[1], k_commands[i].name)) {
      if (ds_comm_open(&argc, &argv, &g_comm) != DS_OK) return cli_report_error("mpi");
      if (k_commands[i].computes && !take_compute_option(argv[1], &argc, argv)) return finish(2);
      if (k_commands[i].weights && !take_weights_option(argv[1], &argc, argv)) return finish(2);
      if (k_commands[i].kv && !take_kv_cache_option(argv[1], &argc, argv)) return finish(2);
      const char *slow = k_commands[i].computes && ds_comm_rank(g_comm) == 0 ? ds_gemm_warning() : NULL;
      if (slow) fprintf(stderr, "dspark: %s\n", slow);
      slow = ds_matmul_compute() == DS_COMPUTE_BF16 && ds_comm_rank(g_comm) == 0 ? ds_gemm_bf16_warning() : NULL;
      if (slow) fprintf(stderr, "dspark: %s\n", slow);
      return finish(k_commands[i].run(argc - 1, argv + 1));
    }
  fprintf(stderr, "dspark: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
