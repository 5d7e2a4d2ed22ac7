/* The fixed-lane row kernels shared by the losses of this folder (the DSpark loss, the KD
 * loss): vector types, padded loads and stores, double partial sums, the engine's fast exp
 * lane-wise, and the two passes every log-softmax starts with (max + validity, log-sum-exp).
 * Internal to src/loss/; everything is static inline, so each loss compiles it into its own
 * row loops and no symbol crosses files. */
#ifndef DSPARK_LOSS_LOSS_LANES_H
#define DSPARK_LOSS_LOSS_LANES_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "nn/fast_exp.h"

/* Row loops work on blocks of LANES floats with GCC/clang vector extensions: the lanes, and
 * so the order of every partial sum, are fixed by the source and the instruction set the build
 * targets (16 lanes with AVX-512, 8 otherwise), not by threads, chunking or the compiler's
 * choices. 8 without AVX-512 because GCC lowers comparisons and selects of 64-byte vectors lane
 * by lane through memory on AVX2, which made every row loop 3-4x slower there. */
#ifdef __AVX512F__
enum { LANES = 16 };
#else
enum { LANES = 8 };
#endif
typedef float vf __attribute__((vector_size(LANES * 4)));   /* LANES floats */
typedef int32_t vi __attribute__((vector_size(LANES * 4))); /* LANES int32, and comparison masks of vf */
typedef double vd __attribute__((vector_size(LANES * 8)));  /* LANES doubles: the partial sums of a vf */
/* Vectors never cross a function boundary by value (that would tie the code to AVX-512's
 * calling convention): helpers take pointers or are macros, and inline away. */
#define VF_SPLAT(a) ((vf){0} + (float)(a))
/* mask ? a : b lane-wise, mask lanes all-ones or zero (a comparison result) */
#define VF_SELECT(mask, a, b) ((vf)(((vi)(a) & (mask)) | ((vi)(b) & ~(mask))))
/* sign(q - p) lane-wise in {-1, 0, 1} */
#define VF_SIGN_DIFF(q, p) (VF_SELECT((q) > (p), VF_SPLAT(1), VF_SPLAT(0)) - VF_SELECT((q) < (p), VF_SPLAT(1), VF_SPLAT(0)))

/* *r = p[0 .. n-1] padded with `pad` up to LANES lanes (unaligned is fine). */
static inline void vf_load(vf *r, const float *p, int64_t n, float pad) {
  if (n >= LANES) {
    memcpy(r, p, sizeof *r);
  } else {
    float tmp[LANES];
    for (int j = 0; j < LANES; j++) tmp[j] = j < n ? p[j] : pad;
    memcpy(r, tmp, sizeof *r);
  }
}

/* p[0 .. min(n, LANES)-1] = lanes of *v */
static inline void vf_store(float *p, const vf *v, int64_t n) {
  if (n >= LANES) {
    memcpy(p, v, sizeof *v);
  } else {
    float tmp[LANES];
    memcpy(tmp, v, sizeof tmp);
    for (int j = 0; j < n; j++) p[j] = tmp[j];
  }
}

/* *acc += *v lane-wise, in double */
static inline void vd_accumulate(vd *acc, const vf *v) { *acc += __builtin_convertvector(*v, vd); }

/* The lanes' sum in lane order. */
static inline double vd_sum(const vd *acc) {
  double s = 0.0;
  for (int j = 0; j < LANES; j++) s += (*acc)[j];
  return s;
}

/* *out = exp(*x) lane-wise with the engine's one fast exp (nn/fast_exp.h); the lane loop
 * vectorizes. */
static inline void vexp(vf *out, const vf *x) {
  for (int j = 0; j < LANES; j++) (*out)[j] = ds_fast_expf((*x)[j]);
}

/* x [V] -> max over x; *bad = 1 if x holds a NaN or +inf. */
static inline float row_scan(const float *x, int64_t V, int *bad) {
  vf m = VF_SPLAT(-INFINITY), xv;
  vi b = {0};
  /* signed compares of the non-negative magnitudes: AVX2 has no unsigned ones, and GCC would
   * lower them lane by lane */
  const vi abs_mask = (vi){0} + 0x7fffffff, inf_bits = (vi){0} + 0x7f800000;
  for (int64_t v = 0; v < V; v += LANES) {
    vf_load(&xv, x + v, V - v, -INFINITY);
    vi u = (vi)xv;
    b |= ((u & abs_mask) > inf_bits) | (u == inf_bits);
    m = VF_SELECT(xv > m, xv, m);
  }
  float mx = m[0];
  int any = b[0] != 0;
  for (int j = 1; j < LANES; j++) mx = m[j] > mx ? m[j] : mx, any |= b[j] != 0;
  *bad = any;
  return mx;
}

/* x [V], finite mx = max x -> log sum_v exp(x_v - mx) (in [0, log V]). */
static inline double row_log_sumexp(const float *x, int64_t V, float mx) {
  vd acc = {0};
  vf xv, e = {0}; /* initialized: gcc 12 with -march=native on AVX-512 FP16 parts warns otherwise */
  for (int64_t v = 0; v < V; v += LANES) {
    vf_load(&xv, x + v, V - v, -INFINITY); /* padding lanes: exp(-inf) = 0 */
    xv = xv - mx;
    vexp(&e, &xv);
    vd_accumulate(&acc, &e);
  }
  return log(vd_sum(&acc));
}

#endif
