/* The tiny draft configuration the draft tests and fuzz/fuzz_spec_files share: hidden 16, MLP
 * 24, 4 query / 2 key-value heads of 8, rope theta 1e4, target layers 1 and 3 of 6 captured, the
 * last vocabulary id the mask token, Markov rank 5 (0 without a Markov head), a confidence head
 * that reads the Markov head's input when there is one. Callers set what they vary on top. */
#ifndef DSPARK_TEST_TINY_DRAFT_H
#define DSPARK_TEST_TINY_DRAFT_H

#include "dspark/draft.h"

ds_draft_config tiny_draft_config(int64_t vocab, int64_t layers, int64_t block, ds_markov_type type,
                                  int64_t anchors);

#endif
