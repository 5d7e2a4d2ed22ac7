/* linear_w_cat (include/dspark/backend.h) as one linear_w per segment, each writing its out[s]
 * columns of y after the previous ones: every backend's path when the segments do not run as
 * one product. Internal to src/nn; plain C, also compiled as CUDA C++. */
#ifndef DSPARK_NN_LINEAR_CAT_H
#define DSPARK_NN_LINEAR_CAT_H

#include "dspark/backend.h"

typedef void (*ds_linear_w_fn)(float *y, int64_t ldy, const float *x, ds_weight w, const float *bias, int64_t n,
                               int64_t in, int64_t out);

static inline void ds_linear_w_each_segment(ds_linear_w_fn linear_w, float *y, int64_t ldy, const float *x,
                                            const ds_weight *w, const int64_t *out, int n_seg, const float *bias,
                                            int64_t n, int64_t in) {
  int64_t col = 0;
  for (int s = 0; s < n_seg; s++) {
    linear_w(y + col, ldy, x, w[s], bias ? bias + col : NULL, n, in, out[s]);
    col += out[s];
  }
}

#endif
