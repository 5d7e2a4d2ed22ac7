/* The machine's sgemm peak as the benchmarks' roofline: times cblas_sgemm at the shapes a
 * transformer step uses and at a large square shape, and prints GFLOP/s and the OpenBLAS
 * kernel family in use (OPENBLAS_CORETYPE changes it).
 *   bench_sgemm [threads]   -> lines "sgemm M N K GFLOPS" and "peak GFLOPS" */
#include <stdio.h>
#include <stdlib.h>

#include "dspark/backend.h"

#ifdef DSPARK_USE_BLAS
#include <cblas.h>
#endif

int main(int argc, char **argv) {
#ifndef DSPARK_USE_BLAS
  fprintf(stderr, "bench_sgemm: built without BLAS\n");
  return 1;
#else
  if (argc > 1) ds_set_num_threads(atoi(argv[1]));
  int shapes[][3] = {{512, 2304, 768}, {512, 4096, 768}, {512, 768, 2048}, {512, 32000, 768}, {2048, 2048, 2048}};
  double peak = 0;
  printf("blas_kernel %s threads %d\n", ds_blas_kernel_name(), ds_get_num_threads());
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
    float *A = malloc(sizeof(float) * (size_t)M * K), *B = malloc(sizeof(float) * (size_t)N * K);
    float *C = malloc(sizeof(float) * (size_t)M * N);
    for (size_t i = 0; i < (size_t)M * K; i++) A[i] = (float)(i % 7) * 0.1f;
    for (size_t i = 0; i < (size_t)N * K; i++) B[i] = (float)(i % 5) * 0.1f;
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
      double t0 = ds_time_sec();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, A, K, B, K, 0.0f, C, N);
      double dt = ds_time_sec() - t0;
      best = dt < best ? dt : best;
    }
    double gf = 2.0 * M * N * K / best / 1e9;
    peak = gf > peak ? gf : peak;
    printf("sgemm %d %d %d %.1f\n", M, N, K, gf);
    free(A); free(B); free(C);
  }
  printf("peak %.1f\n", peak);
  return 0;
#endif
}
