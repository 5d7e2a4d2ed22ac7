#ifndef DSPARK_MODEL_ROPE_FREQ_H
#define DSPARK_MODEL_ROPE_FREQ_H

#include "dspark/hfconfig.h"

/* inv_freq[head_dim / 2] for the config's rope type. */
void ds_rope_inv_freq(const ds_model_config *c, float *inv_freq);

#endif
