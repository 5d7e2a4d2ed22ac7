/* Anchor sampling and evaluation masks for DSpark training (spec section 5). */
#ifndef DSPARK_ANCHORS_H
#define DSPARK_ANCHORS_H

#include "dspark/common.h"
#include "dspark/rng.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Eligible anchors: a in [0, T-2] with loss_mask[a] and loss_mask[a+1]. Draws up to
 * max_anchors of them uniformly without replacement, sorted ascending; the remaining slots
 * are dummies (anchor 0, block_keep 0). Then eval_mask[b*g + k] =
 * cumprod_k(a+k+1 < T AND loss_mask[a+k+1] AND keep_b). Returns the number of real blocks.
 *   anchors[max_anchors], block_keep[max_anchors], eval_mask[max_anchors * g] */
int64_t ds_sample_anchors(const uint8_t *loss_mask, int64_t T, int64_t max_anchors, int64_t g, ds_rng *rng,
                          int64_t *anchors, uint8_t *block_keep, uint8_t *eval_mask);

/* The eval mask alone, for given anchors (used by tools that take anchors from the user). */
void ds_anchor_eval_mask(const uint8_t *loss_mask, int64_t T, const int64_t *anchors, const uint8_t *block_keep,
                         int64_t n_blocks, int64_t g, uint8_t *eval_mask);

/* The per-(seed, rank, step, sequence) stream: reproducible under any data-parallel layout. */
uint64_t ds_anchor_seed(uint64_t seed, int64_t rank, int64_t step, int64_t sequence);

#ifdef __cplusplus
}
#endif
#endif
