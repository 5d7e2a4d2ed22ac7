/* Non-finite values in a target forward's outputs, named by the layer they come from
 * (include/dspark/target.h ds_target_check_finite). */
#include <stdio.h>
#include <string.h>

#include "dspark/target.h"

/* First non-finite value of x[0..n) with stride 1, or -1: a branch-free scan (it vectorizes)
 * before the search. */
static int64_t first_bad(const float *x, int64_t n) {
  uint32_t any = 0;
  for (int64_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, x + i, 4);
    any |= (uint32_t)((u & 0x7f800000u) == 0x7f800000u);
  }
  if (!any) return -1;
  for (int64_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, x + i, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return i;
  }
  return -1;
}

static const char *value_name(float x) { return x != x ? "NaN" : x > 0 ? "+inf" : "-inf"; }

ds_status ds_target_check_finite(const ds_target *m, const ds_target_outputs *out, int64_t rows) {
  int64_t d = ds_target_config(m)->hidden_size;
  if (out->captured) {
    int64_t stride = (int64_t)out->n_capture * d;
    for (int c = 0; c < out->n_capture; c++) /* layers in increasing order: the first bad one is the origin */
      for (int64_t r = 0; r < rows; r++) {
        const float *x = out->captured + r * stride + (int64_t)c * d;
        int64_t j = first_bad(x, d);
        if (j < 0) continue;
        int32_t l = out->capture_layers[c];
        char layer[96];
        if (l < 0) snprintf(layer, sizeof layer, "the target's embedding output (HF hidden_states[0])");
        else snprintf(layer, sizeof layer, "target layer %d (HF hidden_states[%d])", l, l + 1);
        return DS_FAIL(DS_ERR_NUMERIC, "%s holds %s at row %lld, feature %lld (captured layer %d of %d)", layer,
                       value_name(x[j]), (long long)r, (long long)j, c, out->n_capture);
      }
  }
  if (out->final_hidden)
    for (int64_t r = 0; r < rows; r++) {
      const float *x = out->final_hidden + r * d;
      int64_t j = first_bad(x, d);
      if (j >= 0)
        return DS_FAIL(DS_ERR_NUMERIC, "the target's final-normed hidden state holds %s at row %lld, feature %lld",
                       value_name(x[j]), (long long)r, (long long)j);
    }
  return DS_OK;
}
