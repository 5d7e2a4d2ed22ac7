#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "dspark/draft.h"

const char *ds_markov_type_name(ds_markov_type t) {
  switch (t) {
    case DS_MARKOV_NONE: return "none";
    case DS_MARKOV_VANILLA: return "vanilla";
    case DS_MARKOV_GATED: return "gated";
    case DS_MARKOV_RNN: return "rnn";
  }
  return "?";
}

/* Case-insensitive: DeepSpec's configs may spell the type "Vanilla"; the meaning is the same. */
ds_status ds_markov_type_parse(const char *name, ds_markov_type *out) {
  static const ds_markov_type all[] = {DS_MARKOV_NONE, DS_MARKOV_VANILLA, DS_MARKOV_GATED, DS_MARKOV_RNN};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (!strcasecmp(name, ds_markov_type_name(all[i]))) {
      *out = all[i];
      return DS_OK;
    }
  return DS_FAIL(DS_ERR_ARG, "markov head type '%s' is unknown (expected none, vanilla, gated or rnn)", name);
}

ds_status ds_draft_config_check(const ds_draft_config *c) {
  if (c->vocab_size <= 0 || c->hidden_size <= 0 || c->intermediate_size <= 0 || c->head_dim <= 0 ||
      c->head_dim % 2 || c->num_attention_heads <= 0 || c->num_key_value_heads <= 0 ||
      c->num_attention_heads % c->num_key_value_heads)
    return DS_FAIL(DS_ERR_ARG, "draft config: inconsistent sizes (vocab %lld, hidden %lld, heads %lld/%lld, head_dim %lld)",
                   (long long)c->vocab_size, (long long)c->hidden_size, (long long)c->num_attention_heads,
                   (long long)c->num_key_value_heads, (long long)c->head_dim);
  if (c->num_layers < 1 || c->num_layers > 256)
    return DS_FAIL(DS_ERR_ARG, "draft config: num_layers = %lld must be in [1, 256]", (long long)c->num_layers);
  if (c->block_size < 1 || c->block_size > 64)
    return DS_FAIL(DS_ERR_ARG, "draft config: block_size = %lld must be in [1, 64]", (long long)c->block_size);
  if (c->markov_rank < 0)
    return DS_FAIL(DS_ERR_ARG, "draft config: markov_rank = %lld must not be negative", (long long)c->markov_rank);
  if ((c->markov_rank == 0) != (c->markov_type == DS_MARKOV_NONE))
    return DS_FAIL(DS_ERR_ARG, "draft config: markov_rank %lld with head type '%s' (rank 0 means no head)",
                   (long long)c->markov_rank, ds_markov_type_name(c->markov_type));
  if (c->confidence_head_with_markov && c->enable_confidence_head && c->markov_rank == 0)
    return DS_FAIL(DS_ERR_ARG, "draft config: confidence_head_with_markov needs a Markov head (markov_rank > 0)");
  if (c->mask_token_id < 0 || c->mask_token_id >= c->vocab_size)
    return DS_FAIL(DS_ERR_ARG, "draft config: mask_token_id %d outside the vocabulary [0, %lld)", c->mask_token_id,
                   (long long)c->vocab_size);
  if (c->draft_vocab_size < 0 || c->draft_vocab_size > c->vocab_size)
    return DS_FAIL(DS_ERR_ARG, "draft config: draft_vocab_size %lld outside [1, %lld] (the target's vocabulary), or 0 "
                   "for none", (long long)c->draft_vocab_size, (long long)c->vocab_size);
  if (c->n_target_layers < 1 || c->n_target_layers > DS_MAX_TARGET_LAYERS)
    return DS_FAIL(DS_ERR_ARG, "draft config: %d target layers (need 1..%d)", c->n_target_layers, DS_MAX_TARGET_LAYERS);
  for (int i = 0; i < c->n_target_layers; i++) {
    int32_t id = c->target_layer_ids[i];
    if (id < -1 || id > c->num_target_layers - 2)
      return DS_FAIL(DS_ERR_ARG, "draft config: target_layer_ids[%d] = %d outside [-1, %lld] (the last layer is excluded)",
                     i, id, (long long)(c->num_target_layers - 2));
    if (i && id <= c->target_layer_ids[i - 1])
      return DS_FAIL(DS_ERR_ARG, "draft config: target_layer_ids must be strictly increasing (%d after %d)", id,
                     c->target_layer_ids[i - 1]);
  }
  return DS_OK;
}

ds_status ds_draft_config_default(const ds_model_config *t, int64_t num_layers, int n_target_layers,
                                  ds_draft_config *out) {
  memset(out, 0, sizeof *out);
  out->vocab_size = t->vocab_size;
  out->hidden_size = t->hidden_size;
  out->intermediate_size = t->intermediate_size;
  out->num_attention_heads = t->num_attention_heads;
  out->num_key_value_heads = t->num_key_value_heads;
  out->head_dim = t->head_dim;
  out->rms_norm_eps = t->rms_norm_eps;
  out->rope_source = *t;
  out->num_layers = num_layers;
  out->block_size = 7;
  out->num_target_layers = t->num_hidden_layers;
  out->markov_type = DS_MARKOV_VANILLA;
  out->markov_rank = 256;
  out->enable_confidence_head = 1;
  out->confidence_head_with_markov = 1;
  out->num_anchors = 512;
  out->mask_token_id = -1; /* the caller resolves it from the tokenizer */
  /* m ids spread evenly over [1, L-2] (spec section 1); fewer layers than asked if the target
   * is too shallow. */
  int64_t lo = 1, hi = t->num_hidden_layers - 2;
  if (hi < lo) lo = hi = t->num_hidden_layers >= 2 ? t->num_hidden_layers - 2 : -1;
  int64_t span = hi - lo + 1;
  int m = n_target_layers < span ? n_target_layers : (int)span;
  if (m < 1) m = 1;
  /* A whole-number stride, as DeepSpec: [1, 9, 17, 25, 33] for a 36-layer target. */
  int64_t stride = m > 1 ? (hi - lo) / (m - 1) : 0;
  for (int i = 0; i < m; i++) out->target_layer_ids[i] = (int32_t)(lo + i * stride);
  out->n_target_layers = m;
  return DS_OK;
}
