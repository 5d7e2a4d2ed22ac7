/* dspark info MODEL: loads the model (a directory or a .gguf file; loading validates every
 * tensor) and prints it. */
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "dspark/backend.h"
#include "dspark/fileio.h"
#include "dspark/model_source.h"
#include "dspark/safetensors.h"
#include "dspark/target.h"

static const char *rope_name(ds_rope_type t) {
  return t == DS_ROPE_LLAMA3 ? "llama3" : t == DS_ROPE_LINEAR ? "linear" : "default";
}

static void print_ids(const int64_t *ids, int n) {
  printf("[");
  for (int i = 0; i < n; i++) printf("%s%lld", i ? ", " : "", (long long)ids[i]);
  printf("]");
}

/* The configuration as resolved (class defaults applied), one JSON object, weights unread. */
static int print_config(ds_model_source *src) {
  ds_model_config c;
  if (ds_model_source_config(src, &c) != DS_OK) return cli_report_error("info");
  printf("{\"architecture\": \"%s\", \"config_class\": \"%s\", \"vocab_size\": %lld, \"hidden_size\": %lld, "
         "\"intermediate_size\": %lld, \"num_hidden_layers\": %lld, \"num_attention_heads\": %lld, "
         "\"num_key_value_heads\": %lld, \"head_dim\": %lld, \"max_position_embeddings\": %lld, "
         "\"rms_norm_eps\": %.17g, \"rope_theta\": %.17g, \"rope_type\": \"%s\", \"tie_word_embeddings\": %s, "
         "\"attention_bias\": %s, \"mlp_bias\": %s, \"qk_norm\": %s, ",
         c.architecture, ds_config_class_name(c.arch), (long long)c.vocab_size, (long long)c.hidden_size,
         (long long)c.intermediate_size, (long long)c.num_hidden_layers, (long long)c.num_attention_heads,
         (long long)c.num_key_value_heads, (long long)c.head_dim, (long long)c.max_position_embeddings, c.rms_norm_eps,
         c.rope_theta, rope_name(c.rope_type), c.tie_word_embeddings ? "true" : "false",
         c.attention_bias ? "true" : "false", c.mlp_bias ? "true" : "false", c.qk_norm ? "true" : "false");
  if (c.rope_type != DS_ROPE_DEFAULT) printf("\"rope_factor\": %.17g, ", c.rope_factor);
  if (c.rope_type == DS_ROPE_LLAMA3)
    printf("\"rope_low_freq_factor\": %.17g, \"rope_high_freq_factor\": %.17g, "
           "\"rope_original_max_position_embeddings\": %lld, ", c.rope_low_freq_factor, c.rope_high_freq_factor,
           (long long)c.rope_original_max_position_embeddings);
  if (c.bos_token_id >= 0) printf("\"bos_token_id\": %lld, ", (long long)c.bos_token_id);
  else printf("\"bos_token_id\": null, ");
  printf("\"eos_token_id\": ");
  print_ids(c.eos_token_ids, c.n_eos);
  printf(", \"stop_token_ids\": ");
  print_ids(c.stop_token_ids, c.n_stop);
  printf(", \"stop_source\": \"%s\", \"defaulted\": \"%s\"}\n", c.stop_source, c.defaulted);
  return 0;
}

/* "3.44 GB", "12.5 MB", "96.0 kB", "512 B" (powers of 1000). */
static const char *human_bytes(size_t n, char buf[32]) {
  double x = (double)n;
  if (x >= 1e9) snprintf(buf, 32, "%.2f GB", x / 1e9);
  else if (x >= 1e6) snprintf(buf, 32, "%.1f MB", x / 1e6);
  else if (x >= 1e3) snprintf(buf, 32, "%.1f kB", x / 1e3);
  else snprintf(buf, 32, "%zu B", n);
  return buf;
}

/* The model loaded (t0: when its opening began), and its tensors with list_tensors. */
static int print_model(ds_model_source *src, double t0, int list_tensors) {
  ds_target *m;
  if (ds_target_load_source(src, ds_backend_cpu(), NULL, &m) != DS_OK) return cli_report_error("info");
  double load_s = ds_time_sec() - t0;
  const ds_model_config *c = ds_target_config(m);
  printf("model:              %s%s\n", ds_model_source_path(src),
         ds_model_source_is_gguf(src) ? (ds_target_weights() == DS_WEIGHTS_AS_STORED ? " (GGUF file: converted in memory at load, quantized matrices kept as stored)"
          : " (GGUF file: converted in memory at load, weights dequantized)") : "");
  printf("architecture:       %s (%s)\n", c->architecture, ds_arch_name(c->arch));
  /* a tied config whose checkpoint stores its own head holds both tables */
  int64_t n_params = ds_config_num_params(c) +
                     (c->tie_word_embeddings && !ds_target_head_is_embedding(m) ? c->vocab_size * c->hidden_size : 0);
  printf("parameters:         %lld (%.1f M)\n", (long long)n_params, n_params / 1e6);
  printf("stored dtype:       %s\n", c->dtype);
  printf("vocab_size:         %lld\n", (long long)c->vocab_size);
  printf("hidden_size:        %lld\n", (long long)c->hidden_size);
  printf("intermediate_size:  %lld\n", (long long)c->intermediate_size);
  printf("layers:             %lld\n", (long long)c->num_hidden_layers);
  printf("heads:              %lld query, %lld key/value (GQA group %lld), head_dim %lld\n",
         (long long)c->num_attention_heads, (long long)c->num_key_value_heads,
         (long long)(c->num_attention_heads / c->num_key_value_heads), (long long)c->head_dim);
  printf("rope:               %s, theta %g", rope_name(c->rope_type), c->rope_theta);
  if (c->rope_type != DS_ROPE_DEFAULT) printf(", factor %g", c->rope_factor);
  printf("\nrms_norm_eps:       %g\n", c->rms_norm_eps);
  printf("tied embeddings:    %s\n", !c->tie_word_embeddings ? "no"
                                      : ds_target_head_is_embedding(m)
                                          ? "yes"
                                          : "no: config.json ties them, but the checkpoint stores its own lm_head.weight "
                                            "(used, as transformers does)");
  printf("attention bias:     %s%s\n", c->attention_bias ? "q/k/v" : "none", c->o_proj_bias ? " + o" : "");
  printf("q/k norm:           %s\n", c->qk_norm ? "yes" : "no");
  printf("eos ids:           ");
  for (int i = 0; i < c->n_eos; i++) printf(" %lld", (long long)c->eos_token_ids[i]);
  printf("%s\nstop ids:          ", c->n_eos ? "" : " none");
  for (int i = 0; i < c->n_stop; i++) printf(" %lld", (long long)c->stop_token_ids[i]);
  printf("%s (generation stops here; from %s)\n", c->n_stop ? "" : " none", c->stop_source);
  if (c->defaulted[0]) printf("class defaults:     %s (%s)\n", c->defaulted, ds_config_class_name(c->arch));
  size_t f32_bytes, mapped_bytes;
  ds_dtype mapped_dtype;
  ds_target_weight_memory(m, &f32_bytes, &mapped_bytes, &mapped_dtype);
  char all[32], mapped[32], f32[32];
  printf("weights in memory:  %s", human_bytes(f32_bytes + mapped_bytes, all));
  if (mapped_bytes) {
    const char *sep = ": ";
    for (int dt = 0; dt < DS_DTYPE_COUNT; dt++)
      if (ds_target_mapped_bytes(m, (ds_dtype)dt)) {
        printf("%s%s %s", sep, human_bytes(ds_target_mapped_bytes(m, (ds_dtype)dt), mapped), ds_dtype_name((ds_dtype)dt));
        sep = " + ";
      }
    printf(" used in place (memory-mapped checkpoint), %s F32 (converted at load)", human_bytes(f32_bytes, f32));
    (void)mapped_dtype;
  } else
    printf(" F32 (converted at load)");
  printf("\n");
  printf("loaded in:          %.2f s (%s compute, GEMM %s, 16-bit weight kernels %s, quantized weight kernels %s, "
         "%d threads)\n", load_s, ds_compute_label(), ds_gemm_name(), ds_weight16_kernel_name(),
         ds_weight_quant_kernel_name(), ds_get_num_threads());
  printf("bf16 compute GEMM:  %s (--compute bf16)\n", ds_gemm_bf16_name());
  ds_target_free(m);

  if (list_tensors) {
    ds_checkpoint *ck;
    if (ds_model_source_weights(src, &ck) != DS_OK) return cli_report_error("info");
    for (size_t i = 0; i < ds_ckpt_count(ck); i++) {
      const ds_tensor_view *t = ds_ckpt_tensor(ck, i);
      printf("  %-56s %-5s [", t->name, ds_dtype_name(t->dtype));
      for (int k = 0; k < t->ndim; k++) printf("%s%lld", k ? ", " : "", (long long)t->shape[k]);
      printf("]\n");
    }
    ds_ckpt_close(ck);
  }
  return 0;
}

int cmd_info(int argc, char **argv) {
  const char *dir = NULL;
  int list_tensors = 0, config_only = 0;
  for (int i = 1; i < argc; i++) {
    if (cli_is_help(argv[i])) {
      printf("usage: dspark info MODEL [--tensors | --config]\n"
             "MODEL: a model directory or a .gguf file (converted in memory: docs/commands.md, \"Models\").\n"
             "Loads config.json and the safetensors checkpoint (validating every tensor's\n"
             "presence, dtype and shape) and prints the architecture and sizes. Fields config.json\n"
             "leaves out take the defaults of the family's transformers config class (LlamaConfig,\n"
             "Qwen2Config, Qwen3Config).\n"
             "  --tensors   also list every tensor with dtype and shape\n"
             "  --weights as-stored|bf16|f32  how the target holds its weights (default as-stored: a GGUF's\n"
             "              quantized matrices in place; docs/compute.md)\n"
             "  --config    print only the resolved configuration as one JSON object (defaults applied,\n"
             "              the generation stop set and where it comes from); the weights are not read\n");
      return 0;
    } else if (!strcmp(argv[i], "--tensors")) {
      list_tensors = 1;
    } else if (!strcmp(argv[i], "--config")) {
      config_only = 1;
    } else if (argv[i][0] == '-' || dir) {
      fprintf(stderr, "dspark info: unexpected argument '%s' (see --help)\n", argv[i]);
      return 2;
    } else {
      dir = argv[i];
    }
  }
  if (!dir) {
    fprintf(stderr, "usage: dspark info MODEL [--tensors | --config]\n");
    return 2;
  }
  ds_model_source *src;
  double t0 = ds_time_sec();
  if (ds_model_source_open(dir, &src) != DS_OK) return cli_report_error("info");
  int rc = config_only ? print_config(src) : print_model(src, t0, list_tensors);
  ds_model_source_close(src);
  return rc;
}
