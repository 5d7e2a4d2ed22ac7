/* dspark convert MODEL.gguf --out DIR [--dtype bf16|f32]: a llama.cpp model file as a Hugging Face
 * model directory (include/dspark/gguf_model.h does the work). */
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "dspark/fileio.h"
#include "dspark/gguf_model.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: dspark convert MODEL.gguf --out DIR [--dtype bf16|f32] [--overwrite]\n"
          "Writes DIR as a Hugging Face model directory: config.json, model.safetensors (every tensor\n"
          "dequantized: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K), tokenizer.json,\n"
          "tokenizer_config.json (with the chat template) and generation_config.json, as transformers\n"
          "reads the same file (from_pretrained(..., gguf_file=...)). Architectures llama, qwen2 and\n"
          "qwen3 with a byte-level BPE tokenizer (tokenizer.ggml.model gpt2); anything else is refused\n"
          "naming the key or tensor.\n"
          "Converting is not needed to use a GGUF file: every command that takes a model directory\n"
          "takes MODEL.gguf itself and converts it in memory at each load, exactly as --dtype f32\n"
          "writes it (the same texts and fp32 weights; nothing is written; quantized weights are\n"
          "dequantized to fp32: docs/commands.md, \"Models\"). Convert writes those files, for other\n"
          "tools or to save the conversion at each load.\n"
          "  --out DIR        a directory that does not exist or is empty\n"
          "  --dtype bf16|f32 the weights' dtype in model.safetensors (f32)\n"
          "  --overwrite      write into a non-empty DIR (its files of the same names are replaced)\n");
}

int cmd_convert(int argc, char **argv) {
  const char *in = NULL, *out = NULL;
  ds_dtype dtype = DS_F32;
  int overwrite = 0;
  for (int i = 1; i < argc; i++) {
    const char *v;
    if (cli_is_help(argv[i])) {
      usage(stdout);
      return 0;
    } else if (!strcmp(argv[i], "--out")) {
      if (!(out = cli_value(argc, argv, &i))) return 2;
    } else if (!strcmp(argv[i], "--dtype")) {
      if (!(v = cli_value(argc, argv, &i))) return 2;
      if (!strcmp(v, "bf16")) dtype = DS_BF16;
      else if (!strcmp(v, "f32") || !strcmp(v, "fp32")) dtype = DS_F32;
      else {
        fprintf(stderr, "dspark convert: --dtype '%s': bf16 or f32\n", v);
        return 2;
      }
    } else if (!strcmp(argv[i], "--overwrite")) {
      overwrite = 1;
    } else if (argv[i][0] == '-' || in) {
      fprintf(stderr, "dspark convert: unexpected argument '%s'\n", argv[i]);
      return 2;
    } else {
      in = argv[i];
    }
  }
  if (!in || !out) {
    fprintf(stderr, "usage: dspark convert MODEL.gguf --out DIR [--dtype bf16|f32] [--overwrite]\n");
    return 2;
  }
  const ds_input_path inputs[] = {{"MODEL.gguf", in}};
  int refused = cli_output_refused("convert", "--out", out, DS_OUTPUT_DIR, inputs, CLI_N_INPUTS(inputs));
  if (refused) return refused;
  if (!ds_dir_is_empty(out) && !overwrite) {
    fprintf(stderr, "dspark convert: --out %s is not empty (--overwrite replaces the files convert writes)\n", out);
    return 2;
  }
  if (ds_gguf_convert(in, out, dtype) != DS_OK) return cli_report_error("convert");
  fprintf(stderr, "converted %s to %s (%s weights)\n", in, out, dtype == DS_BF16 ? "bf16" : "f32");
  return 0;
}
