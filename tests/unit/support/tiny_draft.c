#include "support/tiny_draft.h"

#include <string.h>

ds_draft_config tiny_draft_config(int64_t vocab, int64_t layers, int64_t block, ds_markov_type type,
                                  int64_t anchors) {
  ds_draft_config c;
  memset(&c, 0, sizeof c);
  c.vocab_size = vocab;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.rms_norm_eps = 1e-6;
  c.rope_source.head_dim = 8;
  c.rope_source.rope_theta = 10000.0;
  c.num_layers = layers;
  c.block_size = block;
  c.num_target_layers = 6;
  c.target_layer_ids[0] = 1;
  c.target_layer_ids[1] = 3;
  c.n_target_layers = 2;
  c.mask_token_id = (int32_t)(vocab - 1);
  c.markov_type = type;
  c.markov_rank = type == DS_MARKOV_NONE ? 0 : 5;
  c.enable_confidence_head = 1;
  c.confidence_head_with_markov = type != DS_MARKOV_NONE;
  c.num_anchors = anchors;
  return c;
}
