/* Token sampling from logits: greedy, temperature, top-p. */
#ifndef DSPARK_SAMPLING_H
#define DSPARK_SAMPLING_H

#include "dspark/common.h"
#include "dspark/rng.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Index of the largest logit; ties go to the lowest index (as torch.argmax). */
int32_t ds_argmax(const float *logits, int64_t n);

/* temperature <= 0: greedy. Otherwise samples from softmax(logits / temperature) restricted
 * to the smallest set of most probable tokens whose mass reaches top_p (top_p >= 1: all).
 * scratch holds 2 n floats/ints worth of space (see ds_sampler_scratch_bytes). */
size_t ds_sampler_scratch_bytes(int64_t n);
int32_t ds_sample(const float *logits, int64_t n, float temperature, float top_p, ds_rng *rng, void *scratch);

/* The distribution ds_sample draws from, written out: probs [n] sums to 1, zero outside the
 * top-p set; temperature <= 0 gives the one-hot of the argmax. Speculative decoding needs the
 * draft's and the target's distributions under the same rule (spec section 8). scratch as
 * for ds_sample. */
void ds_sampling_probs(const float *logits, int64_t n, float temperature, float top_p, float *probs, void *scratch);
/* Draws from probs [n] (non-negative, summing to mass > 0): the first i whose cumulative mass
 * exceeds u * mass. */
int32_t ds_sample_probs(const float *probs, int64_t n, double mass, ds_rng *rng);

#ifdef __cplusplus
}
#endif
#endif
