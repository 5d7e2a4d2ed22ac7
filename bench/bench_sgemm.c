/* The machine's sgemm peak as the benchmarks' roofline: times the engine's GEMM (ds_gemm_f32,
 * the library the build selected) at the shapes a transformer step uses and at a large square
 * shape, and prints GFLOP/s and the library and kernel in use (bench/bench_gemm.c compares the
 * candidate libraries side by side).
 *   bench_sgemm [threads]   -> lines "sgemm M N K GFLOPS" and "peak GFLOPS" */
#include <stdio.h>
#include <stdlib.h>

#include "dspark/backend.h"


int main(int argc, char **argv) {
  if (argc > 1) ds_set_num_threads(atoi(argv[1]));
  int shapes[][3] = {{512, 2304, 768}, {512, 4096, 768}, {512, 768, 2048}, {512, 32000, 768}, {2048, 2048, 2048}};
  double peak = 0;
  printf("gemm %s | threads %d\n", ds_gemm_name(), ds_get_num_threads());
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
    float *A = malloc(sizeof(float) * (size_t)M * K), *B = malloc(sizeof(float) * (size_t)N * K);
    float *C = malloc(sizeof(float) * (size_t)M * N);
    for (size_t i = 0; i < (size_t)M * K; i++) A[i] = (float)(i % 7) * 0.1f;
    for (size_t i = 0; i < (size_t)N * K; i++) B[i] = (float)(i % 5) * 0.1f;
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
      double t0 = ds_time_sec();
      ds_gemm_f32(0, 1, M, N, K, A, K, B, K, 0.0f, C, N);
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
}
