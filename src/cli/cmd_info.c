/* dspark info MODEL_DIR: loads the model (which validates every tensor) and prints it. */
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "dspark/backend.h"
#include "dspark/fileio.h"
#include "dspark/safetensors.h"
#include "dspark/target.h"

static const char *rope_name(ds_rope_type t) {
  return t == DS_ROPE_LLAMA3 ? "llama3" : t == DS_ROPE_LINEAR ? "linear" : "default";
}

int cmd_info(int argc, char **argv) {
  const char *dir = NULL;
  int list_tensors = 0;
  for (int i = 1; i < argc; i++) {
    if (cli_is_help(argv[i])) {
      printf("usage: dspark info MODEL_DIR [--tensors]\n"
             "Loads config.json and the safetensors checkpoint (validating every tensor's\n"
             "presence, dtype and shape) and prints the architecture and sizes.\n"
             "  --tensors   also list every tensor with dtype and shape\n");
      return 0;
    } else if (!strcmp(argv[i], "--tensors")) {
      list_tensors = 1;
    } else if (argv[i][0] == '-' || dir) {
      fprintf(stderr, "dspark info: unexpected argument '%s' (see --help)\n", argv[i]);
      return 2;
    } else {
      dir = argv[i];
    }
  }
  if (!dir) {
    fprintf(stderr, "usage: dspark info MODEL_DIR [--tensors]\n");
    return 2;
  }
  double t0 = ds_time_sec();
  ds_target *m;
  if (ds_target_load(dir, ds_backend_cpu(), &m) != DS_OK) return cli_report_error("info");
  double load_s = ds_time_sec() - t0;
  const ds_model_config *c = ds_target_config(m);
  printf("model:              %s\n", dir);
  printf("architecture:       %s (%s)\n", c->architecture, ds_arch_name(c->arch));
  printf("parameters:         %lld (%.1f M)\n", (long long)ds_config_num_params(c), ds_config_num_params(c) / 1e6);
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
  printf("tied embeddings:    %s\n", c->tie_word_embeddings ? "yes" : "no");
  printf("attention bias:     %s%s\n", c->attention_bias ? "q/k/v" : "none", c->o_proj_bias ? " + o" : "");
  printf("q/k norm:           %s\n", c->qk_norm ? "yes" : "no");
  printf("eos ids:           ");
  for (int i = 0; i < c->n_eos; i++) printf(" %lld", (long long)c->eos_token_ids[i]);
  printf("%s\nloaded in:          %.2f s (fp32 compute, BLAS kernel %s, %d threads)\n", c->n_eos ? "" : " none",
         load_s, ds_blas_kernel_name(), ds_get_num_threads());
  ds_target_free(m);

  if (list_tensors) {
    ds_checkpoint *ck;
    if (ds_ckpt_open(dir, &ck) != DS_OK) return cli_report_error("info");
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
