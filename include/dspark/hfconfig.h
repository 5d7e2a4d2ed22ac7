/* config.json of LlamaForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM.
 *
 * Reads both the transformers 4.x spelling (top-level rope_theta / rope_scaling, torch_dtype)
 * and the 5.x one (rope_parameters, dtype). Anything this engine would compute differently
 * from transformers (sliding-window layers, an unknown rope type, a non-SiLU activation) is
 * refused with an error naming the field, never silently ignored. */
#ifndef DSPARK_HFCONFIG_H
#define DSPARK_HFCONFIG_H

#include "dspark/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DS_ARCH_LLAMA = 0, DS_ARCH_QWEN2, DS_ARCH_QWEN3 } ds_arch;
typedef enum { DS_ROPE_DEFAULT = 0, DS_ROPE_LINEAR, DS_ROPE_LLAMA3 } ds_rope_type;

enum { DS_MAX_EOS = 8 };

typedef struct {
  ds_arch arch;
  char architecture[64]; /* "Qwen3ForCausalLM", ... */
  int64_t vocab_size;
  int64_t hidden_size;        /* d */
  int64_t intermediate_size;  /* MLP width */
  int64_t num_hidden_layers;  /* L */
  int64_t num_attention_heads;
  int64_t num_key_value_heads;
  int64_t head_dim;
  int64_t max_position_embeddings;
  double rms_norm_eps;
  double rope_theta;
  ds_rope_type rope_type;
  double rope_factor;          /* linear, llama3 */
  double rope_low_freq_factor; /* llama3 */
  double rope_high_freq_factor;
  int64_t rope_original_max_position_embeddings;
  int tie_word_embeddings;
  int attention_bias; /* bias on q/k/v (Qwen2 always; Llama when attention_bias) */
  int o_proj_bias;    /* Llama attention_bias also puts a bias on o_proj */
  int mlp_bias;       /* Llama mlp_bias */
  int qk_norm;        /* Qwen3 per-head RMSNorm on q and k */
  int64_t bos_token_id; /* -1 if none */
  int64_t eos_token_ids[DS_MAX_EOS];
  int n_eos;
  char dtype[16];       /* "float32", "bfloat16", ... as recorded; informational */
} ds_model_config;

ds_status ds_config_load(const char *path, ds_model_config *out);
ds_status ds_config_parse(const char *json, size_t len, const char *label, ds_model_config *out);
const char *ds_arch_name(ds_arch arch);
/* Number of parameters the checkpoint holds (embedding and lm_head counted once when tied). */
int64_t ds_config_num_params(const ds_model_config *c);

#ifdef __cplusplus
}
#endif
#endif
