/* dspark profile: this machine's verification throughput table SPS(B) (a target pass over B
 * new tokens after a cached context) and, with a draft, the draft's cost per block length;
 * the prefix scheduler (`speculate --policy scheduler --profile FILE`) prices rounds with it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "dspark/backend.h"
#include "dspark/checkpoint.h"
#include "dspark/spec_files.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: dspark profile --target MODEL --out FILE.json [--draft DIR] [options]\n"
          "MODEL: a model directory or a .gguf file (docs/commands.md, \"Models\")\n"
          "Measures the seconds of one target pass verifying B tokens as speculation runs it (with the KV\n"
          "cache of a context, the logits of the first row), B = 1 .. --max-tokens: verify_seconds[B-1] and\n"
          "verify_steps_per_s[B-1] = SPS(B); head_seconds[n-1] = the logits of n more rows (computed when a\n"
          "round's first proposal is accepted); with --draft also draft_block_seconds[L-1] = one draft block\n"
          "and L head steps, each after a target pass.\n"
          CLI_WEIGHTS_HELP
          CLI_KV_CACHE_HELP
          CLI_DRAFT_WEIGHTS_HELP
          "  --max-tokens B   the largest batch of verified tokens (32); the scheduler admits no more\n"
          "  --context C      cached tokens before the measured pass (128)\n"
          "  --reps N         timings per entry, the median kept (3)\n"
          "  --threads N\n");
}

int cmd_profile(int argc, char **argv) {
  const char *target_dir = NULL, *draft_dir = NULL, *out_path = NULL;
  int64_t max_tokens = 32, context = 128, reps = 3, threads = 0, n = 0;
  ds_dtype draft_weights = DS_Q8_0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    if (cli_is_help(a)) { usage(stdout); return 0; }
    else if (!strcmp(a, "--target")) { CLI_VALUE(); target_dir = v; }
    else if (!strcmp(a, "--draft")) { CLI_VALUE(); draft_dir = v; }
    else if (!strcmp(a, "--out")) { CLI_VALUE(); out_path = v; }
    else if (!strcmp(a, "--draft-weights")) CLI_DRAFT_WEIGHTS(draft_weights);
    else if (!strcmp(a, "--max-tokens")) CLI_INT(1, 4096, max_tokens);
    else if (!strcmp(a, "--context")) CLI_INT(1, 1 << 20, context);
    else if (!strcmp(a, "--reps")) CLI_INT(1, 64, reps);
    else if (!strcmp(a, "--threads")) CLI_INT(1, 1024, threads);
    else {
      fprintf(stderr, "dspark profile: %s '%s' (see --help)\n", a[0] == '-' ? "unknown option" : "unexpected argument", a);
      return 2;
    }
  }
  if (!target_dir || !out_path) {
    fprintf(stderr, "dspark profile: --target and --out are required (see --help)\n");
    return 2;
  }
  const ds_input_path inputs[] = {{"--target", target_dir}, {"--draft", draft_dir}};
  int refused = cli_output_refused("profile", "--out", out_path, DS_OUTPUT_FILE, inputs, CLI_N_INPUTS(inputs));
  if (refused) return refused;
  ds_set_num_threads((int)threads);
  int rc = 1;
  ds_target *t = NULL;
  ds_draft *d = NULL;
  double *verify = calloc((size_t)max_tokens, sizeof *verify), *head = calloc((size_t)max_tokens, sizeof *head);
  double *draft = NULL, *sps = NULL;
  int64_t g = 0;
  ds_model_source *src = NULL;
  if (!verify || !head) goto report;
  if (ds_model_source_open(target_dir, &src) != DS_OK || ds_target_load_source(src, ds_backend_cpu(), NULL, &t) != DS_OK)
    goto report;
  if (draft_dir) {
    if (ds_draft_open(draft_dir, ds_backend_cpu(), &d) != DS_OK || ds_draft_set_decode_weights(d, draft_weights) != DS_OK)
      goto report;
    g = ds_draft_get_config(d)->block_size;
    draft = calloc((size_t)g, sizeof *draft);
    if (!draft) goto report;
  }
  const ds_draft_config *dc = d ? ds_draft_get_config(d) : NULL;
  /* with a draft, the pass also captures its layers, as a verification pass does */
  if (ds_spec_profile_verify(t, context, max_tokens, 1, (int)reps, dc ? dc->target_layer_ids : NULL,
                             dc ? dc->n_target_layers : 0, verify, head) != DS_OK)
    goto report;
  if (d && ds_spec_profile_draft(t, d, context, (int)reps, draft) != DS_OK) goto report;
  sps = calloc((size_t)max_tokens, sizeof *sps);
  if (!sps) goto report;
  for (int64_t b = 0; b < max_tokens; b++) sps[b] = 1.0 / verify[b];
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "format", "dspark-profile-1");
  cJSON_AddStringToObject(j, "target", target_dir);
  if (draft_dir) cJSON_AddStringToObject(j, "draft", draft_dir);
  /* speculate --profile refuses the file for another target and drops another draft's costs */
  if (ds_spec_add_target_identity(j, src) != DS_OK) {
    cJSON_Delete(j);
    goto report;
  }
  if (d) ds_spec_add_draft_identity(j, d);
  cJSON_AddNumberToObject(j, "context", (double)context);
  cJSON_AddNumberToObject(j, "reps", (double)reps);
  cJSON_AddStringToObject(j, "gemm", ds_gemm_name());
  cJSON_AddStringToObject(j, "compute", ds_compute_label());
  if (ds_matmul_compute() == DS_COMPUTE_BF16) cJSON_AddStringToObject(j, "gemm_bf16", ds_gemm_bf16_name());
  cJSON_AddStringToObject(j, "weight16_kernels", ds_weight16_kernel_name()); /* the frozen weights' kernels */
  cJSON_AddStringToObject(j, "quantized_kernels", ds_weight_quant_kernel_name());
  cJSON_AddNumberToObject(j, "threads", ds_get_num_threads());
  cJSON_AddItemToObject(j, "verify_seconds", ds_json_number_array(verify, max_tokens));
  cJSON_AddItemToObject(j, "verify_steps_per_s", ds_json_number_array(sps, max_tokens));
  if (max_tokens > 1) cJSON_AddItemToObject(j, "head_seconds", ds_json_number_array(head, max_tokens - 1));
  if (d) cJSON_AddItemToObject(j, "draft_block_seconds", ds_json_number_array(draft, g));
  if (ds_json_write_report("--out", out_path, j) != DS_OK) goto report;
  fprintf(stderr, "profile: verifying 1 token %.3f ms, %lld tokens %.3f ms (%.2fx the cost for %lldx the tokens)",
          verify[0] * 1e3, (long long)max_tokens, verify[max_tokens - 1] * 1e3, verify[max_tokens - 1] / verify[0],
          (long long)max_tokens);
  if (d) fprintf(stderr, "; draft block of %lld: %.3f ms", (long long)g, draft[g - 1] * 1e3);
  fprintf(stderr, "\n");
  rc = 0;
  goto done;
report:
  rc = cli_report_error("profile");
done:
  free(verify);
  free(head);
  free(draft);
  free(sps);
  ds_model_source_close(src);
  ds_draft_free(d);
  ds_target_free(t);
  return rc;
}
