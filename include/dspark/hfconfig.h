/* config.json of LlamaForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM.
 *
 * Reads both the transformers 4.x spelling (top-level rope_theta / rope_scaling, torch_dtype)
 * and the 5.x one (rope_parameters, dtype). A field config.json leaves out takes the default
 * of the family's transformers config class (LlamaConfig, Qwen2Config, Qwen3Config of
 * transformers 5.x: e.g. Qwen3's head_dim is 128, not hidden_size / num_attention_heads, and
 * Qwen2/Qwen3's num_key_value_heads is 32); a null where transformers refuses one is refused.
 * Anything this engine would compute differently from transformers (sliding-window layers,
 * an unknown rope type, a non-SiLU activation) is refused with an error naming the field,
 * never silently ignored. */
#ifndef DSPARK_HFCONFIG_H
#define DSPARK_HFCONFIG_H

#include "dspark/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DS_ARCH_LLAMA = 0, DS_ARCH_QWEN2, DS_ARCH_QWEN3 } ds_arch;
typedef enum { DS_ROPE_DEFAULT = 0, DS_ROPE_LINEAR, DS_ROPE_LLAMA3 } ds_rope_type;

enum { DS_MAX_EOS = 16 };
/* The largest values config.json's reader accepts; a GGUF's metadata is held to the same, so that
 * a refusal names the GGUF key. */
#define DS_CONFIG_MAX_VOCAB (INT64_C(1) << 31)
#define DS_CONFIG_MAX_HIDDEN (INT64_C(1) << 20)
#define DS_CONFIG_MAX_INTERMEDIATE (INT64_C(1) << 24)
#define DS_CONFIG_MAX_POSITIONS (INT64_C(1) << 40)
enum { DS_CONFIG_MAX_LAYERS = 4096, DS_CONFIG_MAX_HEADS = 4096, DS_CONFIG_MAX_HEAD_DIM = 4096 };

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
  int64_t eos_token_ids[DS_MAX_EOS]; /* config.json's eos_token_id (LlamaConfig's default: 2) */
  int n_eos;
  char dtype[16];       /* "float32", "bfloat16", ... as recorded; informational */
  /* The stop set: where transformers' generate() stops. generation_config.json's eos_token_id
   * when MODEL_DIR has that file (an absent or null entry there means no stop token at all),
   * else config.json's eos_token_id exactly as written (no class default). ds_config_parse
   * fills it from config.json; ds_config_load_dir applies generation_config.json. Generation,
   * speculative decoding and regeneration stop on any of these ids (ds_config_is_stop_token). */
  int64_t stop_token_ids[DS_MAX_EOS];
  int n_stop;
  char stop_source[32];  /* "config.json" or "generation_config.json" */
  /* The fields config.json leaves out that took a class default, "name=value, ..." ("" if
   * none); a shape error at load mentions them. */
  char defaulted[256];
} ds_model_config;

/* config.json alone (path names the file). */
ds_status ds_config_load(const char *path, ds_model_config *out);
ds_status ds_config_parse(const char *json, size_t len, const char *label, ds_model_config *out);
const char *ds_arch_name(ds_arch arch);
/* "LlamaConfig", "Qwen2Config", "Qwen3Config": whose defaults a family takes. */
const char *ds_config_class_name(ds_arch arch);

/* A model directory's configuration as transformers loads it: MODEL_DIR/config.json, then
 * MODEL_DIR/generation_config.json when present, whose eos_token_id (an integer or a list of
 * ids in [0, vocab_size)) replaces the stop set. A generation_config.json that is there but
 * unreadable or malformed is an error naming it (transformers would silently fall back to
 * config.json). */
ds_status ds_config_load_dir(const char *model_dir, ds_model_config *out);
/* The same from texts (a model source's: include/dspark/model_source.h): config.json's, and
 * generation_config.json's or NULL when there is none; the labels name them in errors. */
ds_status ds_config_parse_model(const char *cfg, size_t cfg_len, const char *cfg_label, const char *gen,
                                size_t gen_len, const char *gen_label, ds_model_config *out);
/* Applies generation_config.json's text (label names it in errors) to a parsed config. */
ds_status ds_config_apply_generation_config(ds_model_config *c, const char *json, size_t len, const char *label);
/* 1 when id is in the stop set. */
int ds_config_is_stop_token(const ds_model_config *c, int64_t id);

/* Position limit (max_position_embeddings): a run over positions 0 .. positions-1 must stay
 * inside it. Otherwise an error naming the config (config_label, e.g. "DIR/config.json"), the
 * limit, the option that asked for more (option, e.g. "--seq-len") and the largest value that
 * fits. (A model source checks it before loading the weights: ds_model_source_check_positions.) */
ds_status ds_config_check_positions(const ds_model_config *c, const char *config_label, int64_t positions,
                                    const char *option);
/* Number of parameters the checkpoint holds (embedding and lm_head counted once when tied). */
int64_t ds_config_num_params(const ds_model_config *c);

#ifdef __cplusplus
}
#endif
#endif
