#include "model/rope_freq.h"

#include <math.h>

/* inv_freq[i] = 1 / theta^(2i / head_dim), computed in fp32 as transformers does, then
 * rescaled for the linear and llama3 rope types. */
void ds_rope_inv_freq(const ds_model_config *c, float *inv_freq) {
  int64_t half = c->head_dim / 2;
  for (int64_t i = 0; i < half; i++) {
    float expo = (float)(2 * i) / (float)c->head_dim;
    inv_freq[i] = (float)(1.0 / pow(c->rope_theta, (double)expo));
  }
  if (c->rope_type == DS_ROPE_LINEAR) {
    for (int64_t i = 0; i < half; i++) inv_freq[i] = (float)(inv_freq[i] / c->rope_factor);
  } else if (c->rope_type == DS_ROPE_LLAMA3) {
    /* Long wavelengths are divided by factor, short ones kept, the band between blended. */
    double old_ctx = (double)c->rope_original_max_position_embeddings;
    double low_wavelen = old_ctx / c->rope_low_freq_factor;
    double high_wavelen = old_ctx / c->rope_high_freq_factor;
    for (int64_t i = 0; i < half; i++) {
      double f = inv_freq[i];
      double wavelen = 6.283185307179586 / f; /* 2 pi */
      double scaled = wavelen > low_wavelen ? f / c->rope_factor : f;
      if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
        double smooth = (old_ctx / wavelen - c->rope_low_freq_factor) /
                        (c->rope_high_freq_factor - c->rope_low_freq_factor);
        scaled = (1.0 - smooth) * scaled / c->rope_factor + smooth * scaled;
      }
      inv_freq[i] = (float)scaled;
    }
  }
}
