/* The memory's streaming rate for the benches: a read-only pass over a buffer with every thread,
 * the roofline of a weight-bound decode step. */
#ifndef DSPARK_BENCH_STREAM_READ_H
#define DSPARK_BENCH_STREAM_READ_H

#include <stdint.h>
#include <stdio.h>

#include "dspark/common.h"

/* Seconds to sum the n floats of a (n a multiple of 4096) with every thread. */
static double stream_read_seconds(const float *a, int64_t n) {
  double t0 = ds_time_sec();
  float s = 0.0f;
#pragma omp parallel for reduction(+ : s) schedule(static)
  for (int64_t b = 0; b < n / 4096; b++) {
    float acc[16] = {0}; /* 16 independent sums: vector adds, bound by memory, not by latency */
    for (int64_t i = b * 4096; i < (b + 1) * 4096; i += 16)
      for (int j = 0; j < 16; j++) acc[j] += a[i + j];
    for (int j = 0; j < 16; j++) s += acc[j];
  }
  double t = ds_time_sec() - t0;
  if (s == 12345.0f) printf("(sum %g)\n", s); /* keeps the loop */
  return t;
}

#endif
