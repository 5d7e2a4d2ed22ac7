/* bf16 compute (DS_COMPUTE_BF16) against fp32, per row count, on a linear's shapes: where the
 * cpu backend's row thresholds (nn/cpu_gemm_bf16.h) come from. For y[n, out] = x[n, in] @ W^T
 * it times, best of R:
 *   f32      ds_gemm_f32 on an fp32 W (the fp32 linear);
 *   bf16     ds_gemm_bf16 on the same fp32 W (W and x rounded on every call: a trainable weight);
 *   w16      the fp32-compute path on a frozen BF16 W (direct kernels or convert + fp32 GEMM);
 *   w16bf    the bf16 GEMM reading that BF16 W in place (only x rounded);
 *   w16pk    the bf16 GEMM on that W's packed copy (linear_w's path once W is used again);
 *   dw32 / dwbf  the weight gradient dW[out, in] += dy^T @ x in fp32 / bf16;
 * and prints GFLOP/s. bench_gemm_bf16 [--threads N] [--reps R] [--rows 1,8,...] [--shape OUTxIN] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/backend.h"
#include "dspark/dtype.h"
#include "../src/nn/cpu_gemm_bf16.h" /* the in-place bf16 weight entry (internal to the cpu backend) */
#include "../src/nn/cpu_linear16.h"

typedef struct {
  int mode;
  float *y, *x, *wf, *dy, *dw;
  uint16_t *w16;
  int64_t n, in, out;
} job;

static void run(job *j) {
  ds_weight w = {j->w16, DS_BF16};
  switch (j->mode) {
    case 0: ds_gemm_f32(0, 1, j->n, j->out, j->in, j->x, j->in, j->wf, j->in, 0.0f, j->y, j->out); break;
    case 1: ds_gemm_bf16(0, 1, j->n, j->out, j->in, j->x, j->in, j->wf, j->in, 0.0f, j->y, j->out); break;
    case 2: ds_cpu_linear16(j->y, j->out, j->x, w, NULL, j->n, j->in, j->out); break;
    case 3:
      ds_cpu_gemm_bf16(DS_BF16_AUTO, 0, 1, j->n, j->out, j->in, j->x, j->in, NULL, j->w16, j->in, 0.0f, j->y, j->out);
      break;
    case 6: ds_cpu_gemm_bf16_frozen(1, j->n, j->out, j->in, j->x, j->in, NULL, j->w16, 0.0f, j->y, j->out); break;
    case 4: ds_gemm_f32(1, 0, j->out, j->in, j->n, j->dy, j->out, j->x, j->in, 1.0f, j->dw, j->in); break;
    default: ds_gemm_bf16(1, 0, j->out, j->in, j->n, j->dy, j->out, j->x, j->in, 1.0f, j->dw, j->in); break;
  }
}

int main(int argc, char **argv) {
  int threads = 0, reps = 5;
  const char *rows_s = "1,4,8,16,32,64,128,256,512";
  int64_t out = 2304, in = 768; /* the 100M Qwen3's fused q/k/v */
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--rows") && i + 1 < argc) rows_s = argv[++i];
    else if (!strcmp(argv[i], "--shape") && i + 1 < argc) {
      long long o, n;
      if (sscanf(argv[++i], "%lldx%lld", &o, &n) != 2) { fprintf(stderr, "--shape OUTxIN\n"); return 2; }
      out = o, in = n;
    } else {
      fprintf(stderr, "usage: bench_gemm_bf16 [--threads N] [--reps R] [--rows 1,8,...] [--shape OUTxIN]\n");
      return 2;
    }
  }
  ds_set_num_threads(threads);
  ds_set_matmul_compute(DS_COMPUTE_F32); /* mode 2 is the fp32-compute path of a BF16 weight */
  printf("fp32 GEMM %s; bf16 GEMM %s; %d threads; W [%lld, %lld]\n", ds_gemm_name(), ds_gemm_bf16_name(),
         ds_get_num_threads(), (long long)out, (long long)in);
  printf("%6s %9s %9s %9s %9s %9s %9s %9s   (GFLOP/s)\n", "rows", "f32", "bf16", "w16", "w16bf", "dw32", "dwbf",
         "w16pk");
  int64_t max_rows = 1;
  for (const char *p = rows_s; *p;) {
    int64_t r = strtoll(p, (char **)&p, 10);
    if (r > max_rows) max_rows = r;
    if (*p == ',') p++;
  }
  job j = {.in = in, .out = out};
  j.x = malloc((size_t)(max_rows * in) * sizeof(float));
  j.dy = malloc((size_t)(max_rows * out) * sizeof(float));
  j.y = malloc((size_t)(max_rows * out) * sizeof(float));
  j.wf = malloc((size_t)(out * in) * sizeof(float));
  j.dw = calloc((size_t)(out * in), sizeof(float));
  j.w16 = malloc((size_t)(out * in) * sizeof(uint16_t));
  for (int64_t i = 0; i < max_rows * in; i++) j.x[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
  for (int64_t i = 0; i < max_rows * out; i++) j.dy[i] = (float)((i * 104729) % 1000) / 1e6f;
  for (int64_t i = 0; i < out * in; i++) {
    j.wf[i] = (float)((i * 31337) % 2000) / 40000.0f - 0.025f;
    j.w16[i] = ds_f32_to_bf16(j.wf[i]);
  }
  for (const char *p = rows_s; *p;) {
    j.n = strtoll(p, (char **)&p, 10);
    if (*p == ',') p++;
    printf("%6lld", (long long)j.n);
    for (int mode = 0; mode < 7; mode++) {
      j.mode = mode;
      run(&j); /* warm-up: primitive creation, scratch growth */
      run(&j); /* (w16pk: the second use packs) */
      double best = 1e30;
      for (int r = 0; r < reps; r++) {
        double t0 = ds_time_sec();
        run(&j);
        double t = ds_time_sec() - t0;
        if (t < best) best = t;
      }
      printf(" %9.1f", 2.0 * (double)j.n * (double)in * (double)out / best / 1e9);
    }
    printf("\n");
    fflush(stdout);
  }
  free(j.x), free(j.dy), free(j.y), free(j.wf), free(j.dw), free(j.w16);
  return 0;
}
