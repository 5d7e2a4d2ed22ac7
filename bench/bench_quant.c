/* The matmul on quantized frozen weights (nn/cpu_quant.h) in its two regimes, to choose the row
 * count where the backend switches from the direct path (x quantized to int8, integer block
 * dots) to the chunked one (dequantized rows into the fp32 GEMM): per type, on SmolLM2-135M's
 * shapes (gate|up [3072, 576], down [576, 1536], the tied head [49152, 576]), for a range of
 * rows, best of R runs; the direct path's weight bytes read per second at each row count.
 *   bench_quant [--threads N] [--reps R] [--chunk-kb K: chunks of K KiB of fp32 rows]
 *               [--isa portable|avx2|avx2-packed|vnni: the direct path's kernel, capped at the CPU's] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/backend.h"
#include "dspark/dtype.h"
#include "dspark/ggml_quant.h"
#include "../src/nn/cpu_quant.h" /* the per-path kernels (internal to the cpu backend) */

static unsigned char *make_weight(ds_dtype dt, int64_t rows, int64_t cols) {
  size_t nb = ds_quant_row_bytes(dt, cols) * (size_t)rows;
  unsigned char *w = malloc(nb);
  for (size_t i = 0; i < nb; i++) w[i] = (unsigned char)(i * 2654435761u >> 13);
  /* small finite f16 scales where the blocks keep them; the rest of the bytes are quants */
  size_t bb = ds_quant_row_bytes(dt, ds_quant_block(dt)), at = dt == DS_Q6_K ? 208 : 0;
  for (size_t b = 0; b < nb / bb; b++) {
    w[b * bb + at] = 0x00, w[b * bb + at + 1] = 0x20;
    if (dt == DS_Q4_1 || dt == DS_Q5_1 || dt == DS_Q4_K) w[b * bb + 2] = 0x00, w[b * bb + 3] = 0x20;
  }
  return w;
}

int main(int argc, char **argv) {
  int threads = 0, reps = 5, chunk_kb = 0;
  ds_qisa isa = ds_qisa_best();
  for (int i = 1; i + 1 < argc; i++) {
    if (!strcmp(argv[i], "--threads")) threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--chunk-kb")) chunk_kb = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--isa")) {
      const char *v = argv[++i];
      isa = !strcmp(v, "portable") ? DS_QISA_PORTABLE : !strcmp(v, "avx2") ? DS_QISA_AVX2
            : !strcmp(v, "avx2-packed") ? DS_QISA_AVX2_PACKED : DS_QISA_VNNI;
      if (isa > ds_qisa_best()) isa = ds_qisa_best();
    }
  }
  if (threads) ds_set_num_threads(threads);
  printf("quantized kernels: %s, GEMM: %s, threads %d\n", ds_qisa_name(isa), ds_gemm_name(), ds_get_num_threads());
  const ds_dtype types[] = {DS_Q4_1, DS_Q8_0, DS_Q4_0, DS_Q4_K, DS_Q6_K, DS_Q5_0, DS_Q5_1};
  const int64_t shapes[3][2] = {{3072, 576}, {576, 1536}, {49152, 576}};
  const int64_t rows[] = {1, 2, 4, 8, 12, 16, 24, 32, 64, 128};
  printf("%-5s %-13s %5s %10s %10s %8s %8s\n", "type", "shape", "rows", "direct ms", "chunked ms", "ratio", "GB/s");
  for (size_t t = 0; t < sizeof types / sizeof *types; t++)
    for (int s = 0; s < 3; s++) {
      int64_t out = shapes[s][0], in = shapes[s][1];
      if (in % ds_quant_block(types[t])) continue;
      unsigned char *w = make_weight(types[t], out, in);
      ds_weight qw = {w, types[t]};
      float *x = malloc((size_t)(128 * in) * sizeof(float)), *y = malloc((size_t)(128 * out) * sizeof(float));
      for (int64_t i = 0; i < 128 * in; i++) x[i] = (float)((i * 7919) % 201) / 100.0f - 1.0f;
      for (size_t r = 0; r < sizeof rows / sizeof *rows; r++) {
        int64_t n = rows[r];
        double best[2] = {1e30, 1e30};
        for (int k = 0; k < reps; k++)
          for (int path = 0; path < 2; path++) {
            double t0 = ds_time_sec();
            if (path == 0) ds_quant_direct_cat(isa, y, out, x, &qw, &out, 1, NULL, n, in);
            else ds_quant_chunked(y, out, x, qw, NULL, n, in, out, chunk_kb ? chunk_kb * 256 / in : ds_quant_chunk_rows(in, out));
            double dt = ds_time_sec() - t0;
            if (dt < best[path]) best[path] = dt;
          }
        char shape[32];
        snprintf(shape, sizeof shape, "%lldx%lld", (long long)out, (long long)in);
        printf("%-5s %-13s %5lld %10.3f %10.3f %8.2f %8.1f\n", ds_dtype_name(types[t]), shape, (long long)n,
               best[0] * 1e3, best[1] * 1e3, best[0] / best[1],
               (double)ds_quant_row_bytes(types[t], in) * (double)out / best[0] / 1e9);
      }
      free(w), free(x), free(y);
    }
  return 0;
}
