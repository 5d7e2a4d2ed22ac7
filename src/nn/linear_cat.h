/* linear_w_cat (include/dspark/backend.h): as one linear_w per segment, each writing its out[s]
 * columns of y after the previous ones (every backend's path when the segments do not run as
 * one product), and the block table of the cpu kernels that run every segment in one parallel
 * loop (16-bit and quantized weights). Internal to src/nn; plain C, also compiled as CUDA C++. */
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

/* One parallel loop over every segment's blocks of weight rows (a decode step's k and v are too
 * small to pay a fork / join each): segment s owns blocks first[s] .. first[s+1]-1 of `rows`
 * rows each and writes y's columns from col[s]. At most DS_CAT_SEG_MAX segments. */
enum { DS_CAT_SEG_MAX = 8 };
typedef struct {
  int64_t first[DS_CAT_SEG_MAX + 1], col[DS_CAT_SEG_MAX], blocks, total, rows;
} ds_cat_blocks;

static inline void ds_cat_blocks_init(ds_cat_blocks *c, const int64_t *out, int n_seg, int64_t rows) {
  c->blocks = c->total = 0;
  c->rows = rows;
  for (int s = 0; s < n_seg; s++) {
    c->first[s] = c->blocks, c->col[s] = c->total;
    c->blocks += (out[s] + rows - 1) / rows;
    c->total += out[s];
  }
  c->first[n_seg] = c->blocks;
}

/* Block b: its segment and its rows [*o0, *o1) of that segment's weight. */
static inline int ds_cat_block(const ds_cat_blocks *c, const int64_t *out, int64_t b, int64_t *o0, int64_t *o1) {
  int s = 0;
  while (b >= c->first[s + 1]) s++;
  *o0 = (b - c->first[s]) * c->rows;
  *o1 = *o0 + c->rows < out[s] ? *o0 + c->rows : out[s];
  return s;
}

/* The part of segment s within blocks [b0, b1): its rows [*o0, *o1) (empty when o0 >= o1). A
 * thread that takes a contiguous share of the blocks makes one call per segment it touches. */
static inline void ds_cat_span(const ds_cat_blocks *c, const int64_t *out, int s, int64_t b0, int64_t b1, int64_t *o0,
                               int64_t *o1) {
  int64_t lo = b0 > c->first[s] ? b0 : c->first[s], hi = b1 < c->first[s + 1] ? b1 : c->first[s + 1];
  *o0 = (lo - c->first[s]) * c->rows;
  *o1 = hi <= lo ? *o0 : (hi - c->first[s]) * c->rows < out[s] ? (hi - c->first[s]) * c->rows : out[s];
}

#endif
