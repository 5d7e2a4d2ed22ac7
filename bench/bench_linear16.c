/* The frozen-weight matmul on BF16 weights (the backend's linear_w) against the fp32 linear on
 * the same weights converted, on Qwen3-1.7B's shapes, for a few row counts: the direct
 * (convert-on-the-fly) path, the chunked (convert + fp32 GEMM) path and what the backend
 * picks. For the direct path it also prints the weight bytes read per second, to compare
 * with the machine's streaming bandwidth (measured here by a copy of 1 GiB, and by a read-only
 * pass over 1 GiB with every thread: the roofline of a weight-bound decode; with --stream-only
 * that pass also over 1 GiB in 2 MiB pages, as the engine holds quantized weights' copies).
 * --decode instead: a decode's pass over the 100M Qwen3's weights, per instruction set.
 *   bench_linear16 [--threads N] [--reps R] [--rows 1,4,8,...] [--stream-only | --decode] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/backend.h"
#include "dspark/dtype.h"
#include "../src/nn/cpu_linear16.h" /* the per-path kernels (internal to the cpu backend) */
#include "stream_read.h"

static double best_of(int reps, void (*fn)(void *), void *arg) {
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    double t0 = ds_time_sec();
    fn(arg);
    double t = ds_time_sec() - t0;
    if (t < best) best = t;
  }
  return best;
}

typedef struct {
  int mode; /* 0 fp32 linear, 1 direct, 2 chunked, 3 backend linear_w */
  float *y, *x, *wf;
  uint16_t *w16;
  int64_t n, in, out;
} job;

static void run(void *p) {
  job *j = p;
  ds_weight w = {j->w16, DS_BF16};
  switch (j->mode) {
    case 0: ds_backend_cpu()->linear(j->y, j->x, j->wf, NULL, j->n, j->in, j->out); break;
    case 1: ds_linear16_direct(ds_isa_best(), j->y, j->out, j->x, w, NULL, j->n, j->in, j->out); break;
    case 2: ds_linear16_chunked(ds_isa_best(), j->y, j->out, j->x, w, NULL, j->n, j->in, j->out,
                                ds_linear16_chunk_rows(j->in, j->out)); break;
    default: ds_backend_cpu()->linear_w(j->y, j->out, j->x, w, NULL, j->n, j->in, j->out); break;
  }
}

static void copy_job(void *p) {
  void **b = p;
  memcpy(b[0], b[1], (size_t)1 << 30);
}

/* Sums 1 GiB of floats with every thread: the read bandwidth a weight-bound kernel can reach. */
static void read_job(void *p) { (void)stream_read_seconds(p, ((int64_t)1 << 30) / 4); }

/* A decode's weight reads: one row of x through every linear of the 100M Qwen3 (12 layers of
 * q/k/v, o, gate/up, down, then the tied 32000 x 768 head; 198 MB of distinct BF16 weights),
 * the direct path with each instruction set the CPU has. Weights read per second, the best pass
 * of reps. */
static void decode_pass(int reps) {
  enum { LAYERS = 12 };
  const int64_t outs[5] = {1280, 768, 4096, 768, 32000}, ins[5] = {768, 768, 768, 2048, 768};
  uint16_t *w[LAYERS * 4 + 1];
  double bytes = 0;
  for (int i = 0; i < LAYERS * 4 + 1; i++) {
    int s = i < LAYERS * 4 ? i % 4 : 4;
    size_t nw = (size_t)(outs[s] * ins[s]);
    w[i] = malloc(nw * 2);
    for (size_t k = 0; k < nw; k++) w[i][k] = ds_f32_to_bf16((float)((k * 2654435761u) % 1000) / 1000.0f - 0.5f);
    bytes += (double)nw * 2;
  }
  float *x = calloc(2048, sizeof(float)), *y = calloc(32000, sizeof(float));
  for (int k = 0; k < 2048; k++) x[k] = (float)(k % 7) - 3.0f;
  for (ds_isa isa = DS_ISA_PORTABLE; isa <= ds_isa_best(); isa++) {
    double best = 1e30;
    for (int r = 0; r < reps + 1; r++) { /* the first pass also warms */
      double t0 = ds_time_sec();
      for (int i = 0; i < LAYERS * 4 + 1; i++) {
        int s = i < LAYERS * 4 ? i % 4 : 4;
        ds_linear16_direct(isa, y, outs[s], x, (ds_weight){w[i], DS_BF16}, NULL, 1, ins[s], outs[s]);
      }
      double t = ds_time_sec() - t0;
      if (r > 0 && t < best) best = t;
    }
    printf("decode pass (100M Qwen3, %.0f MB of bf16 weights), %-8s %7.2f ms  %6.2f GB/s\n", bytes / 1e6,
           ds_isa_name(isa), 1e3 * best, bytes / best / 1e9);
  }
  for (int i = 0; i < LAYERS * 4 + 1; i++) free(w[i]);
  free(x);
  free(y);
}

int main(int argc, char **argv) {
  int threads = 0, reps = 5, stream_only = 0, decode_only = 0;
  const char *rows_arg = "1,2,4,8,16,32,128,512";
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--stream-only")) stream_only = 1;
    else if (!strcmp(argv[i], "--decode")) decode_only = 1;
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--rows") && i + 1 < argc) rows_arg = argv[++i];
  }
  ds_set_num_threads(threads);
  printf("threads %d, GEMM %s, 16-bit kernels %s\n", ds_get_num_threads(), ds_gemm_name(), ds_weight16_kernel_name());
  void *bufs[2] = {malloc((size_t)1 << 30), malloc((size_t)1 << 30)};
  memset(bufs[0], 1, (size_t)1 << 30);
  memset(bufs[1], 2, (size_t)1 << 30);
  double tr = best_of(3, read_job, bufs[0]);
  printf("stream read 1 GiB, %d threads: %.2f GB/s\n", ds_get_num_threads(), 1.073741824 / tr);
  if (stream_only) { /* and in 2 MiB pages, as the engine holds frozen weights (ds_malloc_huge) */
    free(bufs[1]);
    void *huge = ds_malloc_huge((size_t)1 << 30, "stream read");
    if (!huge) return 1;
    memset(huge, 1, (size_t)1 << 30);
    tr = best_of(3, read_job, huge);
    printf("stream read 1 GiB in 2 MiB pages, %d threads: %.2f GB/s\n", ds_get_num_threads(), 1.073741824 / tr);
    ds_free_aligned(huge);
    return 0;
  }
  if (decode_only) {
    decode_pass(reps);
    return 0;
  }
  double tc = best_of(3, copy_job, bufs);
  printf("memcpy 1 GiB: %.2f GB/s read (+ the same written)\n", 1.073741824 / tc);
  free(bufs[0]);
  free(bufs[1]);
  const struct { const char *name; int64_t in, out; } shapes[] = {
      {"qkv", 2048, 4096}, {"gate_up", 2048, 12288}, {"down", 6144, 2048}, {"lm_head", 2048, 151936}};
  printf("%-8s %5s %10s %10s %10s %10s %9s\n", "shape", "rows", "fp32 ms", "direct ms", "chunk ms", "entry ms",
         "direct GB/s");
  for (int s = 0; s < 4; s++) {
    int64_t in = shapes[s].in, out = shapes[s].out;
    size_t nw = (size_t)(in * out);
    uint16_t *w16 = malloc(nw * 2);
    float *wf = malloc(nw * 4);
    for (size_t k = 0; k < nw; k++) {
      w16[k] = ds_f32_to_bf16((float)((k * 2654435761u) % 1000) / 1000.0f - 0.5f);
      wf[k] = ds_bf16_to_f32(w16[k]);
    }
    for (const char *r = rows_arg; *r;) {
      int64_t n = strtoll(r, (char **)&r, 10);
      if (*r == ',') r++;
      float *x = malloc((size_t)(n * in) * 4), *y = malloc((size_t)(n * out) * 4);
      for (int64_t k = 0; k < n * in; k++) x[k] = (float)(k % 7) - 3.0f;
      double t[4];
      for (int mode = 0; mode < 4; mode++) {
        job j = {mode, y, x, wf, w16, n, in, out};
        run(&j); /* warm */
        t[mode] = best_of(reps, run, &j);
      }
      printf("%-8s %5lld %10.3f %10.3f %10.3f %10.3f %9.2f\n", shapes[s].name, (long long)n, 1e3 * t[0], 1e3 * t[1],
             1e3 * t[2], 1e3 * t[3], (double)nw * 2 / t[1] / 1e9);
      free(x);
      free(y);
    }
    free(w16);
    free(wf);
  }
  return 0;
}
