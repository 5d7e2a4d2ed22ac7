/* dspark export RUN_DIR --out DIR: the trained draft in the HF layout of spec section 7;
 * --gguf FILE: the same draft as llama.cpp serves it (ds_draft_export_gguf).
 *
 * The checkpoint is the single source: the draft's weights and its config.json (the
 * checkpoint's draft_config metadata, the target's config plus the draft keys, recorded when
 * training started) both come from RUN_DIR/checkpoint.safetensors; RUN_DIR/target_config.json
 * is never read, so editing or deleting it cannot change an export. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "dspark/backend.h"
#include "dspark/checkpoint.h"
#include "dspark/fileio.h"
#include "dspark/lm_trainer.h"
#include "dspark/model_source.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: dspark export RUN_DIR --out DIR [--overwrite]\n"
          "       dspark export RUN_DIR --gguf FILE.gguf [--target MODEL] [--dtype f16|bf16|f32|q8_0]\n"
          "Writes DIR/config.json (the target's config plus the DSpark keys: architectures\n"
          "[\"Qwen3DSparkModel\"], num_hidden_layers, block_size, mask_token_id, target_layer_ids,\n"
          "markov_rank, markov_head_type, ..., and dflash_config {target_layer_ids, mask_token_id})\n"
          "and DIR/model.safetensors (F32, spec section 7 names), both taken from\n"
          "RUN_DIR/checkpoint.safetensors alone (its weights and its recorded draft config;\n"
          "RUN_DIR/target_config.json is not read).\n"
          "DIR must not exist, be empty, or hold a previous export (only config.json with\n"
          "architectures [\"Qwen3DSparkModel\"], model.safetensors and their temp files);\n"
          "anything else, a target model for instance, is refused.\n"
          "  --overwrite   write into such a directory anyway: config.json and model.safetensors\n"
          "                are replaced, other files are left as they are\n"
          "Serving: vLLM --speculative-config\n"
          "'{\"method\": \"dspark\", \"model\": DIR, \"num_speculative_tokens\": 7}' loads drafts with the\n"
          "vanilla Markov head only; gated and rnn drafts do not load there (no module\n"
          "markov_head.gate_proj / joint_proj).\n"
          "llama.cpp (GGUF, docs/gguf-export.md):\n"
          "  --gguf FILE     write the draft as llama.cpp serves it (--spec-type draft-dspark): architecture\n"
          "                  dflash plus markov_w1 / markov_w2 / conf_proj, what llama.cpp's\n"
          "                  convert_hf_to_gguf.py makes of the --out export; vanilla Markov heads only\n"
          "                  (llama.cpp implements no other). FILE is replaced atomically, never an input.\n"
          "  --target MODEL  the target, whose vocabulary (tokenizer.* keys) the draft carries (default:\n"
          "                  the run's target): its .gguf, whose keys are copied, or its HF directory\n"
          "                  (config.json, tokenizer.json, tokenizer_config.json), whose keys are built as\n"
          "                  convert_hf_to_gguf.py builds them from a draft's target directory (byte-level\n"
          "                  BPE only; tokenizer.ggml.pre named as the converter names it, an unknown\n"
          "                  pre-tokenizer refused with its digest)\n"
          "  --dtype T       f16 (default), bf16, f32 or q8_0 for the matrices (q8_0: rows of whole blocks of 32,\n"
          "                  others f16, as llama.cpp's converter writes q8_0); 1-D tensors and norms stay f32\n");
}

/* The target the run recorded (RUN_DIR/run.json "target"), malloc'd, or NULL. */
static char *recorded_target(const char *run) {
  char *path = ds_path_join(run, "run.json"), *text = NULL, *target = NULL;
  size_t len = 0;
  if (path && ds_read_file(path, &text, &len) == DS_OK) {
    cJSON *root = cJSON_ParseWithLength(text, len);
    const cJSON *t = root ? cJSON_GetObjectItemCaseSensitive(root, "target") : NULL;
    if (cJSON_IsString(t) && t->valuestring[0]) target = strdup(t->valuestring);
    cJSON_Delete(root);
  }
  ds_error_clear();
  free(path);
  free(text);
  return target;
}

/* --gguf: the draft of RUN_DIR's checkpoint as a llama.cpp GGUF. */
static int export_gguf(const char *run, const char *ckpt, const char *out, const char *target, ds_dtype dtype) {
  char *recorded = target ? NULL : recorded_target(run);
  if (!target) target = recorded;
  struct stat sb;
  if (!target || (!ds_model_path_is_gguf(target) && (stat(target, &sb) || !S_ISDIR(sb.st_mode)))) {
    fprintf(stderr, "dspark export: --gguf needs the target, a .gguf or a model directory, for the draft's "
            "vocabulary: pass --target MODEL%s%s%s\n", target ? " (" : " (the run records no target)",
            target ? target : "", target ? (recorded ? ", the run's target, is neither)" : " is neither)") : "");
    free(recorded);
    return 2;
  }
  const ds_input_path inputs[] = {{"RUN_DIR", run}, {"--target", target}};
  int rc = cli_output_refused("export", "--gguf", out, DS_OUTPUT_FILE, inputs, CLI_N_INPUTS(inputs));
  if (rc) {
    free(recorded);
    return rc;
  }
  ds_draft *d = NULL;
  ds_checkpoint_info info = {0};
  const char *name = strrchr(run, '/');
  char base[256];
  snprintf(base, sizeof base, "%s", name && name[1] ? name + 1 : run);
  for (size_t n = strlen(base); n > 1 && base[n - 1] == '/'; n--) base[n - 1] = 0;
  rc = 1;
  if (ds_checkpoint_load_draft(ckpt, ds_backend_cpu(), &d, &info) == DS_OK &&
      ds_draft_export_gguf(d, info.draft_config, target, dtype, base, out) == DS_OK) {
    fprintf(stderr, "exported the draft of %s (step %lld) to %s (%s, vocabulary of %s)\n", run,
            (long long)info.step, out, ds_dtype_name(dtype), target);
    rc = 0;
  } else {
    rc = cli_report_error("export");
  }
  ds_checkpoint_info_free(&info);
  ds_draft_free(d);
  free(recorded);
  return rc;
}

/* A pretrain / distill run: the student in the HF layout of its family, with the run's
 * tokenizer.json, into a directory that does not exist or is empty (or with --overwrite). Unlike
 * a draft's export (config.json names Qwen3DSparkModel), a student's previous export cannot be
 * told from a target model's directory (the same three files and architectures), so none is
 * replaced without --overwrite. */
static int export_student(const char *run, const char *ckpt, const char *out, int overwrite) {
  ds_student *s = NULL;
  ds_checkpoint_info info = {0};
  char *text = NULL, *tok_src = ds_path_join(run, "tokenizer.json"), *tok_dst = ds_path_join(out, "tokenizer.json");
  size_t len = 0;
  int rc = 1;
  if (!ds_dir_is_empty(out) && !overwrite) {
    fprintf(stderr, "dspark export: %s is not empty; a student is exported into a new or empty directory "
            "(--overwrite replaces its config.json, model.safetensors and tokenizer.json)\n", out);
    rc = 2;
    goto done;
  }
  if (!tok_src || !tok_dst || ds_checkpoint_load_student(ckpt, ds_backend_cpu(), &s, &info) != DS_OK) goto report;
  if (ds_student_export_hf(s, out) != DS_OK) goto report;
  if (ds_file_exists(tok_src) &&
      (ds_read_file(tok_src, &text, &len) != DS_OK || ds_write_file_atomic(tok_dst, text, len) != DS_OK))
    goto report;
  fprintf(stderr, "exported the student of %s (step %lld) to %s\n", run, (long long)info.step, out);
  rc = 0;
  goto done;
report:
  rc = cli_report_error("export");
done:
  ds_checkpoint_info_free(&info);
  ds_student_free(s);
  free(text);
  free(tok_src);
  free(tok_dst);
  return rc;
}

int cmd_export(int argc, char **argv) {
  const char *run = NULL, *out = NULL, *gguf = NULL, *target = NULL, *dtype_name = NULL;
  int overwrite = 0;
  for (int i = 1; i < argc; i++) {
    if (cli_is_help(argv[i])) {
      usage(stdout);
      return 0;
    } else if (!strcmp(argv[i], "--out")) {
      if (!(out = cli_value(argc, argv, &i))) return 2;
    } else if (!strcmp(argv[i], "--gguf")) {
      if (!(gguf = cli_value(argc, argv, &i))) return 2;
    } else if (!strcmp(argv[i], "--target")) {
      if (!(target = cli_value(argc, argv, &i))) return 2;
    } else if (!strcmp(argv[i], "--dtype")) {
      if (!(dtype_name = cli_value(argc, argv, &i))) return 2;
    } else if (!strcmp(argv[i], "--overwrite")) {
      overwrite = 1;
    } else if (argv[i][0] == '-' || run) {
      fprintf(stderr, "dspark export: unexpected argument '%s'\n", argv[i]);
      return 2;
    } else {
      run = argv[i];
    }
  }
  if (!run || !!out == !!gguf) {
    fprintf(stderr, "usage: dspark export RUN_DIR --out DIR [--overwrite]\n"
            "       dspark export RUN_DIR --gguf FILE.gguf [--target MODEL] [--dtype f16|bf16|f32|q8_0]\n");
    return 2;
  }
  if (out && (target || dtype_name)) {
    fprintf(stderr, "dspark export: %s applies to --gguf only\n", target ? "--target" : "--dtype");
    return 2;
  }
  if (gguf && overwrite) {
    fprintf(stderr, "dspark export: --overwrite applies to --out only (--gguf replaces its file)\n");
    return 2;
  }
  ds_dtype dtype = DS_F16;
  if (dtype_name && !strcmp(dtype_name, "bf16")) dtype = DS_BF16;
  else if (dtype_name && !strcmp(dtype_name, "f32")) dtype = DS_F32;
  else if (dtype_name && !strcmp(dtype_name, "q8_0")) dtype = DS_Q8_0;
  else if (dtype_name && strcmp(dtype_name, "f16")) {
    fprintf(stderr, "dspark export: --dtype '%s': expected f16, bf16, f32 or q8_0\n", dtype_name);
    return 2;
  }
  if (gguf) {
    char *ckpt = ds_path_join(run, "checkpoint.safetensors"), *format = NULL;
    int rc = 1;
    if (!ckpt) rc = cli_report_error("export");
    else if (ds_checkpoint_format(ckpt, &format) == DS_OK && !strcmp(format, DS_STUDENT_CHECKPOINT_FORMAT))
      fprintf(stderr, "dspark export: %s holds a student (a causal LM), not a draft: --gguf exports drafts; convert "
              "a student with llama.cpp's convert_hf_to_gguf.py from its --out export\n", run);
    else rc = export_gguf(run, ckpt, gguf, target, dtype);
    free(format);
    free(ckpt);
    return rc;
  }
  const ds_input_path inputs[] = {{"RUN_DIR", run}};
  int refused = cli_output_refused("export", "--out", out, DS_OUTPUT_DIR, inputs, CLI_N_INPUTS(inputs));
  if (refused) return refused;
  char *ckpt = ds_path_join(run, "checkpoint.safetensors"), *format = NULL;
  if (ckpt && ds_checkpoint_format(ckpt, &format) == DS_OK && !strcmp(format, DS_STUDENT_CHECKPOINT_FORMAT)) {
    int rc = export_student(run, ckpt, out, overwrite);
    free(format);
    free(ckpt);
    return rc;
  }
  free(format);
  ds_draft *d = NULL;
  ds_checkpoint_info info = {0};
  int rc = 1, foreign = 0;
  if (!ckpt) goto report;
  if (ds_draft_export_dir_check(out, overwrite, &foreign) != DS_OK) goto report;
  if (ds_checkpoint_load_draft(ckpt, ds_backend_cpu(), &d, &info) != DS_OK) goto report;
  if (ds_draft_export_hf(d, info.draft_config, out) != DS_OK) goto report;
  const ds_draft_config *c = ds_draft_get_config(d);
  fprintf(stderr, "exported the draft of %s (step %lld) to %s\n", run, (long long)info.step, out);
  if (foreign)
    fprintf(stderr, "--overwrite: %s keeps %d file%s that are not part of the export\n", out, foreign,
            foreign > 1 ? "s" : "");
  if (c->markov_type == DS_MARKOV_GATED || c->markov_type == DS_MARKOV_RNN)
    fprintf(stderr,
            "note: this draft has a %s Markov head; vLLM's DSpark model implements the vanilla head only and will "
            "not load it (\"no module or parameter named markov_head.%s\"). Train with --markov vanilla to serve "
            "with vLLM.\n",
            ds_markov_type_name(c->markov_type), c->markov_type == DS_MARKOV_GATED ? "gate_proj" : "joint_proj");
  rc = 0;
  goto done;
report:
  rc = cli_report_error("export");
done:
  ds_checkpoint_info_free(&info);
  ds_draft_free(d);
  free(ckpt);
  return rc;
}
