/* dspark export RUN_DIR --out DIR: the trained draft in the HF layout of spec section 7. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "dspark/checkpoint.h"
#include "dspark/fileio.h"

int cmd_export(int argc, char **argv) {
  const char *run = NULL, *out = NULL;
  for (int i = 1; i < argc; i++) {
    if (cli_is_help(argv[i])) {
      printf("usage: dspark export RUN_DIR --out DIR\n"
             "Writes DIR/config.json (the target's config plus the DSpark keys: architectures\n"
             "[\"Qwen3DSparkModel\"], num_hidden_layers, block_size, mask_token_id, target_layer_ids,\n"
             "markov_rank, markov_head_type, ...) and DIR/model.safetensors (F32, spec section 7 names)\n"
             "from RUN_DIR/checkpoint.safetensors. Serving: vLLM --speculative-config\n"
             "'{\"method\": \"dspark\", \"model\": DIR, \"num_speculative_tokens\": 7}'.\n");
      return 0;
    } else if (!strcmp(argv[i], "--out")) {
      if (!(out = cli_value(argc, argv, &i))) return 2;
    } else if (argv[i][0] == '-' || run) {
      fprintf(stderr, "dspark export: unexpected argument '%s'\n", argv[i]);
      return 2;
    } else {
      run = argv[i];
    }
  }
  if (!run || !out) {
    fprintf(stderr, "usage: dspark export RUN_DIR --out DIR\n");
    return 2;
  }
  char *ckpt = ds_path_join(run, "checkpoint.safetensors"), *tcfg = ds_path_join(run, "target_config.json");
  char *text = NULL;
  size_t len;
  ds_draft *d = NULL;
  ds_checkpoint_info info;
  int rc = 1;
  if (!ckpt || !tcfg) goto done;
  if (ds_read_file(tcfg, &text, &len) != DS_OK) goto report;
  if (ds_checkpoint_load_draft(ckpt, ds_backend_cpu(), &d, &info) != DS_OK) goto report;
  if (ds_draft_export_hf(d, text, out) != DS_OK) {
    ds_checkpoint_info_free(&info);
    goto report;
  }
  fprintf(stderr, "exported the draft of %s (step %lld) to %s\n", run, (long long)info.step, out);
  ds_checkpoint_info_free(&info);
  rc = 0;
  goto done;
report:
  rc = cli_report_error("export");
done:
  ds_draft_free(d);
  free(text);
  free(ckpt);
  free(tcfg);
  return rc;
}
