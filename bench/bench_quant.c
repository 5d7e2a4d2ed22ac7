/* The matmul on quantized frozen weights (nn/cpu_quant.h) in its two regimes, to choose the row
 * count where the backend switches from the direct path (x quantized to int8, integer block
 * dots) to the chunked one (dequantized rows into the fp32 GEMM): per type, on SmolLM2-135M's
 * shapes (gate|up [3072, 576], down [576, 1536], the tied head [49152, 576]), for a range of
 * rows, best of R runs; the direct path's weight bytes read per second at each row count.
 * --decode instead: a decode step's weight reads, one row of x through SmolLM2-135M's 30 layers
 * (q|k|v, o, gate|up, down in --type, default Q4_1) and its Q8_0 head in order, 97 MB that no
 * cache holds: the direct path's rate from memory against the stream read of 256 MiB in 2 MiB
 * pages (bench/stream_read.h), the two alternated, R rounds (the host's rate moves between
 * runs: the round's ratio is the figure). --rows N: N rows of x through every product, as a
 * verification of N tokens reads the weights once for all of them; with its multiply-adds per
 * second, which bound a verification's cost per row once the weights' bytes no longer do.
 * --peak: this core's rate of AVX-512 VNNI dpbusd alone (12 independent chains, 256 and 512 bits,
 * one thread), the ceiling of the int8 products' multiply-adds.
 *   bench_quant [--threads N] [--reps R] [--chunk-kb K: chunks of K KiB of fp32 rows]
 *               [--isa portable|avx2|avx2-packed|vnni: the direct path's kernel, capped at the CPU's]
 *               [--decode [--type Q4_1|Q4_0|Q8_0|...] [--rows N]] [--peak] */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/backend.h"
#include "dspark/dtype.h"
#include "dspark/ggml_quant.h"
#include "../src/nn/cpu_quant.h" /* the per-path kernels (internal to the cpu backend) */
#include "stream_read.h"

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

/* A decode's matrix-vector products in a model's order, each round's best of 3 passes beside a
 * stream read of 256 MiB (after a pass that packs the copies and warms): SmolLM2-135M's shapes,
 * its layers' matrices in dt, the head in Q8_0. Medians over the rounds. */
static int decode_pass(ds_qisa isa, ds_dtype dt, int rounds, int64_t n) {
  enum { LAYERS = 30, D = 576, V = 49152, ROUNDS_MAX = 1000 };
  const int64_t outs[5] = {960, 576, 3072, 576, V}, ins[5] = {D, D, D, 1536, D}, stream_floats = (int64_t)64 << 20;
  if (rounds > ROUNDS_MAX) rounds = ROUNDS_MAX;
  ds_weight w[LAYERS * 4 + 1];
  double bytes = 0, macs = 0;
  for (int i = 0; i < LAYERS * 4 + 1; i++) {
    int s = i < LAYERS * 4 ? i % 4 : 4;
    ds_dtype t = s == 4 ? DS_Q8_0 : dt;
    w[i] = (ds_weight){make_weight(t, outs[s], ins[s]), t};
    bytes += (double)ds_quant_row_bytes(t, ins[s]) * (double)outs[s];
    macs += (double)outs[s] * (double)ins[s] * (double)n;
  }
  float *x = calloc((size_t)(n * 1536), sizeof(float)), *y = calloc((size_t)(n * V), sizeof(float));
  float *stream = ds_malloc_huge((size_t)stream_floats * sizeof(float), "stream read");
  if (!stream) return 1;
  for (int64_t k = 0; k < stream_floats; k++) stream[k] = (float)(k % 3);
  for (int64_t k = 0; k < n * 1536; k++) x[k] = (float)(k % 7) - 3.0f;
  static double dec[ROUNDS_MAX], str[ROUNDS_MAX], ratio[ROUNDS_MAX];
  for (int r = -1; r < rounds; r++) {
    double best = 1e30;
    for (int p = 0; p < 3; p++) {
      double t0 = ds_time_sec();
      for (int i = 0; i < LAYERS * 4 + 1; i++) {
        int s = i < LAYERS * 4 ? i % 4 : 4;
        ds_quant_direct_cat(isa, y, outs[s], x, &w[i], &outs[s], 1, NULL, n, ins[s]);
      }
      double t = ds_time_sec() - t0;
      if (t < best) best = t;
    }
    double ts = stream_read_seconds(stream, stream_floats);
    if (r < 0) continue; /* the warm-up round */
    dec[r] = bytes / best / 1e9, str[r] = (double)stream_floats * 4 / ts / 1e9, ratio[r] = dec[r] / str[r];
  }
  double rm = ds_median(ratio, rounds), dm = ds_median(dec, rounds), sm = ds_median(str, rounds);
  printf("decode pass (SmolLM2-135M, layers %s, head Q8_0: %.1f MB), %lld row(s) of x, %s, %d rounds: %.2f GB/s "
         "(%.3f ms), stream read %.2f GB/s, share %.0f%%; %.1f GMAC/s, %.1f a thread (medians)\n", ds_dtype_name(dt),
         bytes / 1e6, (long long)n, ds_qisa_name(isa), rounds, dm, 1e3 * bytes / dm / 1e9, sm, 100 * rm,
         macs / (bytes / dm), macs / (bytes / dm) / ds_get_num_threads());
  for (int i = 0; i < LAYERS * 4 + 1; i++) free((void *)w[i].data);
  free(x);
  free(y);
  ds_free_aligned(stream);
  return 0;
}

#if defined(__x86_64__)
/* dpbusd's rate on one thread: 12 chains hide its latency, nothing else in the loop. The chains
 * are 12 named registers: as an array indexed in the loop GCC kept them in memory, a load and a
 * store around every dpbusd, and the figure was the store forwarding's (about half the rate). */
#define VNNI_T __attribute__((target("avx2,avx512f,avx512bw,avx512vl,avx512vnni")))
#define DOT12(f, w, x) \
  a0 = f(a0, w, x), a1 = f(a1, w, x), a2 = f(a2, w, x), a3 = f(a3, w, x), a4 = f(a4, w, x), a5 = f(a5, w, x), \
  a6 = f(a6, w, x), a7 = f(a7, w, x), a8 = f(a8, w, x), a9 = f(a9, w, x), a10 = f(a10, w, x), a11 = f(a11, w, x)
#define PIN12(c)                                                                                                  \
  __asm__("" : "+" c(a0), "+" c(a1), "+" c(a2), "+" c(a3), "+" c(a4), "+" c(a5), "+" c(a6), "+" c(a7), "+" c(a8), \
          "+" c(a9), "+" c(a10), "+" c(a11))
/* peak_256 / peak_512: seconds for n rounds of the 12 chains at one register width */
#define PEAK_FN(name, V, pre, con, reduce)                                                                        \
  VNNI_T static double name(long n, int32_t *sink) {                                                            \
    V w = pre##_set1_epi8(3), x = pre##_set1_epi8(5);                                                           \
    V a0 = pre##_set1_epi32(0), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0, a9 = a0, \
      a10 = a0, a11 = a0;                                                                                       \
    double t0 = ds_time_sec();                                                                                  \
    for (long i = 0; i < n; i++) {                                                                              \
      DOT12(pre##_dpbusd_epi32, w, x);                                                                          \
      PIN12(con);                                                                                               \
    }                                                                                                           \
    double t = ds_time_sec() - t0;                                                                              \
    V s = pre##_add_epi32(pre##_add_epi32(pre##_add_epi32(a0, a1), pre##_add_epi32(a2, a3)),                    \
                          pre##_add_epi32(pre##_add_epi32(a4, a5), pre##_add_epi32(a6, a7)));                   \
    s = pre##_add_epi32(s, pre##_add_epi32(pre##_add_epi32(a8, a9), pre##_add_epi32(a10, a11)));                \
    *sink += reduce(s);                                                                                         \
    return t;                                                                                                   \
  }
VNNI_T static int32_t first_lane(__m256i s) { return _mm256_extract_epi32(s, 0); }
PEAK_FN(peak_256, __m256i, _mm256, "x", first_lane)
PEAK_FN(peak_512, __m512i, _mm512, "v", _mm512_reduce_add_epi32)
VNNI_T static void peak_dpbusd(void) {
  enum { CHAINS = 12 };
  const long n = 50 * 1000 * 1000;
  int32_t sink = 0;
  double t256 = peak_256(n, &sink), t512 = peak_512(n, &sink);
  printf("dpbusd alone, one thread: 256-bit %.2f G/s = %.1f GMAC/s, 512-bit %.2f G/s = %.1f GMAC/s (%d)\n",
         CHAINS * n / t256 / 1e9, 32.0 * CHAINS * n / t256 / 1e9, CHAINS * n / t512 / 1e9, 64.0 * CHAINS * n / t512 / 1e9,
         sink & 1);
}
#endif

int main(int argc, char **argv) {
  int threads = 0, reps = 5, chunk_kb = 0, decode = 0, decode_rows = 1;
  ds_dtype decode_type = DS_Q4_1;
  ds_qisa isa = ds_qisa_best();
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--decode")) decode = 1;
    else if (!strcmp(argv[i], "--peak")) {
#if defined(__x86_64__)
      if (ds_qisa_best() == DS_QISA_VNNI) {
        peak_dpbusd();
        return 0;
      }
#endif
      fprintf(stderr, "bench_quant: --peak measures AVX-512 VNNI, which this CPU does not have\n");
      return 2;
    }
    else if (i + 1 == argc) break;
    else if (!strcmp(argv[i], "--type")) {
      const char *v = argv[++i];
      int found = 0;
      for (ds_dtype t = 0; t < DS_DTYPE_COUNT && !found; t++)
        if (ds_dtype_is_quantized(t) && !strcmp(v, ds_dtype_name(t))) decode_type = t, found = 1;
      if (!found) {
        fprintf(stderr, "bench_quant: --type %s is not a quantized type (Q4_1, Q8_0, ...)\n", v);
        return 2;
      }
    }
    else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--rows")) {
      decode_rows = atoi(argv[++i]);
      if (decode_rows < 1 || decode_rows > 128) {
        fprintf(stderr, "bench_quant: --rows %s is not in 1 .. 128\n", argv[i]);
        return 2;
      }
    }
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
  if (decode) return decode_pass(isa, decode_type, reps, decode_rows);
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
