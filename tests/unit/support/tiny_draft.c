#include "support/tiny_draft.h"

#include <math.h>
#include <stdio.h>
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

int tiny_draft_fd_check(ds_draft *d, const float *grad, double (*objective)(ds_draft *, void *), void *ctx,
                        ds_rng *rng, const char *label) {
  float *params = ds_draft_params(d);
  int bad = 0;
  for (size_t t = 0; t < ds_draft_tensor_count(d); t++) {
    const ds_draft_tensor *ten = ds_draft_tensor_at(d, t);
    if (!ten->grad) continue;
    size_t n = (size_t)ten->shape[0] * (size_t)(ten->ndim == 2 ? ten->shape[1] : 1);
    size_t off = (size_t)((float *)ten->data - params);
    double max_err = 0, max_g = 1e-3;
    for (int probe = 0; probe < 12; probe++) {
      size_t i = off + (size_t)(ds_rng_next_u64(rng) % n);
      float keep = params[i], h = 1e-2f;
      params[i] = keep + h;
      double lp = objective(d, ctx);
      params[i] = keep - h;
      double lm = objective(d, ctx);
      params[i] = keep;
      double fd = (lp - lm) / (2.0 * h);
      max_err = fmax(max_err, fabs(fd - grad[i]));
      max_g = fmax(max_g, fabs(grad[i]));
    }
    if (max_err > 2e-2 * max_g) {
      fprintf(stderr, "  %s (%s): FD error %.3g vs max grad %.3g\n", ten->name, label, max_err, max_g);
      bad++;
    }
  }
  return bad;
}
