/* The tiny draft configuration the draft tests and fuzz/fuzz_spec_files share: hidden 16, MLP
 * 24, 4 query / 2 key-value heads of 8, rope theta 1e4, target layers 1 and 3 of 6 captured, the
 * last vocabulary id the mask token, Markov rank 5 (0 without a Markov head), a confidence head
 * that reads the Markov head's input when there is one. Callers set what they vary on top. */
#ifndef DSPARK_TEST_TINY_DRAFT_H
#define DSPARK_TEST_TINY_DRAFT_H

#include "dspark/draft.h"
#include "dspark/rng.h"

ds_draft_config tiny_draft_config(int64_t vocab, int64_t layers, int64_t block, ds_markov_type type,
                                  int64_t anchors);

/* Central differences (h = 1e-2) of objective(d, ctx) at 12 random entries of every trainable
 * tensor of d, against grad (the analytic gradient, copied out before: each probe reruns the
 * forward). A tensor whose largest error exceeds 2% of its largest gradient (at least 1e-3)
 * fails and is named on stderr after label. Returns the failing tensors. */
int tiny_draft_fd_check(ds_draft *d, const float *grad, double (*objective)(ds_draft *, void *), void *ctx,
                        ds_rng *rng, const char *label);

#endif
