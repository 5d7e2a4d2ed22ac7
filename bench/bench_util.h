/* Helpers shared by the C benchmarks in bench/. */
#ifndef DSPARK_BENCH_UTIL_H
#define DSPARK_BENCH_UTIL_H

#include <math.h>
#include <stddef.h>

/* max |a - b| / max |b|: the normwise (infinity-norm) relative error of a whole result, the
 * measure the unit tests use (tests/unit/test_util.h test_rel_err). */
static inline double bench_rel_err(const float *a, const float *b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    num = fmax(num, fabs((double)a[i] - b[i]));
    den = fmax(den, fabs((double)b[i]));
  }
  return num / (den > 0 ? den : 1);
}

#endif
