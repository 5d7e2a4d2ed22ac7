/* See loop_args.h. */
#include "cli/loop_args.h"

#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "dspark/comm.h"

const char *const cli_loop_usage =
    "optimization:\n"
    "  --steps N (100)  --batch-seqs N sequences per step (4)  --lr X (6e-4)  --warmup F (0.04)\n"
    "  --weight-decay X (0)  --grad-clip X (1.0; 0 disables)  --seed S (0)\n"
    "  --skip-nonfinite        skip a step with a non-finite loss, gradient or input instead of stopping\n"
    "run:\n"
    "  --save-every N (50)  --eval-every N (50)\n"
    "  --resume                continue RUN_DIR's run from its checkpoint (refuses changed options by name;\n"
    "                          inputs are recognized by content, so they may have moved)\n"
    "  --overwrite             replace an existing run in RUN_DIR (without it, or --resume, it is refused)\n"
    "  --stop-after N          stop after N steps in this process (as if killed; for tests)\n"
    "  --inject-nan-step N     poison the gradient of step N, counting from 1 (tests the non-finite handling)\n"
    "  --threads N  --quiet  --compute fp32|bf16|int8 (matmul precision; default fp32,\n"
    "                        a GGUF's quantized matrices in int8 as llama.cpp: docs/compute.md)\n"
    "  --profile               print the time and GFLOP/s of each kernel of the trained model at the end\n";

int cli_loop_option(int argc, char **argv, int *i, ds_loop_options *l) {
  const char *a = argv[*i], *v;
  int64_t n;
  double x;
#define VAL() do { if (!(v = cli_value(argc, argv, i))) return -1; } while (0)
#define INT(lo, hi, dst) do { VAL(); if (!cli_int(a, v, lo, hi, &n)) return -1; dst = n; } while (0)
#define NUM(lo, hi, dst) do { VAL(); if (!cli_float(a, v, lo, hi, &x)) return -1; dst = x; } while (0)
  if (!strcmp(a, "--out")) { VAL(); l->out_dir = v; }
  else if (!strcmp(a, "--steps")) INT(1, INT64_MAX / 2, l->steps);
  else if (!strcmp(a, "--batch-seqs")) INT(1, 1 << 20, l->batch_items);
  else if (!strcmp(a, "--lr")) NUM(0, 10, l->lr);
  else if (!strcmp(a, "--warmup")) NUM(0, 1, l->warmup_frac);
  else if (!strcmp(a, "--weight-decay")) NUM(0, 10, l->weight_decay);
  else if (!strcmp(a, "--grad-clip")) NUM(0, 1e9, l->grad_clip);
  else if (!strcmp(a, "--seed")) { INT(0, INT64_MAX, n); l->seed = (uint64_t)n; }
  else if (!strcmp(a, "--skip-nonfinite")) l->skip_nonfinite = 1;
  else if (!strcmp(a, "--save-every")) INT(1, INT64_MAX / 2, l->save_every);
  else if (!strcmp(a, "--eval-every")) INT(0, INT64_MAX / 2, l->eval_every);
  else if (!strcmp(a, "--resume")) l->resume = 1;
  else if (!strcmp(a, "--overwrite")) l->overwrite = 1;
  else if (!strcmp(a, "--stop-after")) INT(0, INT64_MAX / 2, l->stop_after);
  else if (!strcmp(a, "--inject-nan-step")) INT(1, INT64_MAX / 2, l->inject_nan_step);
  else if (!strcmp(a, "--threads")) INT(1, 1024, l->threads);
  else if (!strcmp(a, "--quiet")) l->quiet = 1;
  else if (!strcmp(a, "--profile")) l->profile = 1;
  else return 0;
#undef VAL
#undef INT
#undef NUM
  return 1;
}

int cli_loop_check(const char *command, ds_loop_options *l) {
  if (l->resume && l->overwrite) {
    fprintf(stderr, "dspark %s: --resume and --overwrite contradict each other (see --help)\n", command);
    return 0;
  }
  if (!l->out_dir) {
    fprintf(stderr, "dspark %s: --out RUN_DIR is required (see --help)\n", command);
    return 0;
  }
  l->comm = cli_comm();
  if (ds_comm_rank(l->comm) != 0) l->quiet = 1;
  return 1;
}
