/* fp32 GEMM candidates side by side on the shapes the models use, each loaded with dlopen so
 * that libraries exporting the same symbols (cblas_sgemm) do not collide:
 *   bench_gemm [--threads N] [--seconds S] [--shapes 100m|1.7b|train|pretrain|all] NAME=PATH ...
 * NAME is one of: openblas (cblas_sgemm + openblas_get_corename), scipy-openblas (the PyPI
 * build, scipy_ prefixed symbols), blis (cblas_sgemm), onednn (dnnl_sgemm), ours (the engine's
 * own ds_cpu_sgemm path: whatever the build selected). Every product is
 * C[m, n] = A[m, k] @ B[n, k]^T (x @ W^T, the linear layer's layout) unless the shape says
 * otherwise. Prints one line per (library, shape): GFLOP/s, the best of repeated runs that
 * fill --seconds, and a checksum of C so a wrong result shows. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dspark/backend.h"

typedef void (*cblas_sgemm_fn)(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                               const float *b, int ldb, float beta, float *c, int ldc);
typedef int (*dnnl_sgemm_fn)(char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                             int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
typedef void (*set_threads_fn)(int n);
typedef char *(*corename_fn)(void);

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };

typedef struct {
  const char *name;
  cblas_sgemm_fn cblas;
  dnnl_sgemm_fn dnnl;
  int ours;
  char kernel[96];
} candidate;

typedef struct {
  const char *label;
  int64_t m, n, k;
  int tb; /* 1: B stored [n, k] (x @ W^T); 0: B stored [k, n] */
  int ta; /* 1: A stored [k, m] (the weight gradient dy^T @ x) */
} shape;

static const shape k_100m[] = {
    {"100m qkv    512x2304x768", 512, 2304, 768, 1, 0},   {"100m gateup 512x4096x768", 512, 4096, 768, 1, 0},
    {"100m down   512x768x2048", 512, 768, 2048, 1, 0},   {"100m head   512x32000x768", 512, 32000, 768, 1, 0},
    {"100m gemv   1x4096x768", 1, 4096, 768, 1, 0},
};
static const shape k_17b[] = {
    {"1.7b qkv    256x4096x2048", 256, 4096, 2048, 1, 0},  {"1.7b gateup 256x12288x2048", 256, 12288, 2048, 1, 0},
    {"1.7b down   256x2048x6144", 256, 2048, 6144, 1, 0},  {"1.7b gemv   1x12288x2048", 1, 12288, 2048, 1, 0},
};
static const shape k_train[] = {
    {"draft dX    448x512x1536 (dy@W)", 448, 512, 1536, 0, 0},
    {"draft dW    1536x512x448 (dy^T@x)", 1536, 512, 448, 0, 1},
    {"draft head  128x32000x512", 128, 32000, 512, 1, 0},
    /* backward products whose k runs down a row stride of 512 floats (nn/cpu_gemm.c: copied on
     * AVX2; compare DSPARK_GEMM_PAD=0) */
    {"draft dh    128x512x32000 (dlogits@lm_head)", 128, 512, 32000, 0, 0},
    {"draft dX    448x512x3072 (dy@W_down)", 448, 512, 3072, 0, 0},
    {"draft dW    512x512x448 (dy^T@x)", 512, 512, 448, 0, 1},
};

/* The 29.1M Qwen3 of bench/bench_pretrain_step.py (d 384, q 384, k / v 128, MLP 1536, vocabulary
 * 8192), one sequence of 512 rows a micro-batch, the LM head in chunks of 128 rows. */
static const shape k_pretrain[] = {
    {"pt q        512x384x384", 512, 384, 384, 1, 0},
    {"pt k|v      512x128x384", 512, 128, 384, 1, 0},
    {"pt qkv      512x640x384", 512, 640, 384, 1, 0},
    {"pt gateup   512x3072x384", 512, 3072, 384, 1, 0},
    {"pt down     512x384x1536", 512, 384, 1536, 1, 0},
    {"pt head     128x8192x384", 128, 8192, 384, 1, 0},
    {"pt dX q     512x384x384 (dy@W)", 512, 384, 384, 0, 0},
    {"pt dX k|v   512x384x128 (dy@W)", 512, 384, 128, 0, 0},
    {"pt dX qkv   512x384x640 (dy@W)", 512, 384, 640, 0, 0},
    {"pt dX gu    512x384x3072 (dy@W)", 512, 384, 3072, 0, 0},
    {"pt dX down  512x1536x384 (dy@W)", 512, 1536, 384, 0, 0},
    {"pt dh       128x384x8192 (dy@W)", 128, 384, 8192, 0, 0},
    {"pt dW q     384x384x512 (dy^T@x)", 384, 384, 512, 0, 1},
    {"pt dW k|v   128x384x512 (dy^T@x)", 128, 384, 512, 0, 1},
    {"pt dW qkv   640x384x512 (dy^T@x)", 640, 384, 512, 0, 1},
    {"pt dW gu    3072x384x512 (dy^T@x)", 3072, 384, 512, 0, 1},
    {"pt dW down  384x1536x512 (dy^T@x)", 384, 1536, 512, 0, 1},
    {"pt dW head  8192x384x128 (dy^T@x)", 8192, 384, 128, 0, 1},
};

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void run(const candidate *c, const shape *s, const float *A, const float *B, float *C) {
  int64_t lda = s->ta ? s->m : s->k, ldb = s->tb ? s->k : s->n;
  if (c->cblas)
    c->cblas(ROW_MAJOR, s->ta ? TRANS : NO_TRANS, s->tb ? TRANS : NO_TRANS, (int)s->m, (int)s->n, (int)s->k, 1.0f, A,
             (int)lda, B, (int)ldb, 0.0f, C, (int)s->n);
  else if (c->dnnl)
    c->dnnl(s->ta ? 'T' : 'N', s->tb ? 'T' : 'N', s->m, s->n, s->k, 1.0f, A, lda, B, ldb, 0.0f, C, s->n);
  else
    ds_gemm_f32(s->ta, s->tb, s->m, s->n, s->k, A, lda, B, ldb, 0.0f, C, s->n);
}

static int load(candidate *c, const char *name, const char *path, int threads) {
  memset(c, 0, sizeof *c);
  c->name = name;
  if (!strcmp(name, "ours")) {
    c->ours = 1;
    snprintf(c->kernel, sizeof c->kernel, "%s", ds_gemm_name());
    return 1;
  }
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "bench_gemm: %s: %s\n", path, dlerror());
    return 0;
  }
  const char *prefix = !strcmp(name, "scipy-openblas") ? "scipy_" : "";
  char sym[128];
  if (!strcmp(name, "onednn")) {
    c->dnnl = (dnnl_sgemm_fn)dlsym(h, "dnnl_sgemm");
    snprintf(c->kernel, sizeof c->kernel, "oneDNN JIT (by CPU features)");
  } else {
    snprintf(sym, sizeof sym, "%scblas_sgemm", prefix);
    c->cblas = (cblas_sgemm_fn)dlsym(h, sym);
    snprintf(sym, sizeof sym, "%sopenblas_set_num_threads", prefix);
    set_threads_fn st = (set_threads_fn)dlsym(h, sym);
    if (!st) st = (set_threads_fn)dlsym(h, "bli_thread_set_num_threads");
    if (st) st(threads);
    snprintf(sym, sizeof sym, "%sopenblas_get_corename", prefix);
    corename_fn cn = (corename_fn)dlsym(h, sym);
    snprintf(c->kernel, sizeof c->kernel, "%s", cn ? cn() : "BLIS (configuration by CPU features)");
  }
  if (!c->cblas && !c->dnnl) {
    fprintf(stderr, "bench_gemm: %s: no sgemm symbol\n", path);
    return 0;
  }
  return 1;
}

int main(int argc, char **argv) {
  int threads = 2;
  double seconds = 0.4;
  const char *which = "all";
  candidate cands[8];
  int nc = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
    else if (!strcmp(argv[i], "--shapes") && i + 1 < argc) which = argv[++i];
    else {
      char *eq = strchr(argv[i], '=');
      char name[64] = {0};
      if (eq) memcpy(name, argv[i], (size_t)(eq - argv[i]) < 63 ? (size_t)(eq - argv[i]) : 63);
      else snprintf(name, sizeof name, "%s", argv[i]);
      if (nc < 8 && load(&cands[nc], strdup(name), eq ? eq + 1 : "", threads)) nc++;
    }
  }
  ds_set_num_threads(threads);
  shape shapes[48];
  int ns = 0;
  if (!strcmp(which, "100m") || !strcmp(which, "all"))
    for (size_t i = 0; i < sizeof k_100m / sizeof *k_100m; i++) shapes[ns++] = k_100m[i];
  if (!strcmp(which, "1.7b") || !strcmp(which, "all"))
    for (size_t i = 0; i < sizeof k_17b / sizeof *k_17b; i++) shapes[ns++] = k_17b[i];
  if (!strcmp(which, "train") || !strcmp(which, "all"))
    for (size_t i = 0; i < sizeof k_train / sizeof *k_train; i++) shapes[ns++] = k_train[i];
  if (!strcmp(which, "pretrain") || !strcmp(which, "all"))
    for (size_t i = 0; i < sizeof k_pretrain / sizeof *k_pretrain; i++) shapes[ns++] = k_pretrain[i];
  for (int c = 0; c < nc; c++) printf("library %s: %s\n", cands[c].name, cands[c].kernel);
  for (int si = 0; si < ns; si++) {
    const shape *s = &shapes[si];
    size_t na = (size_t)(s->m * s->k), nb = (size_t)(s->n * s->k), nC = (size_t)(s->m * s->n);
    float *A = malloc(na * sizeof(float)), *B = malloc(nb * sizeof(float)), *C = malloc(nC * sizeof(float));
    srand(1);
    for (size_t i = 0; i < na; i++) A[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (size_t i = 0; i < nb; i++) B[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (int c = 0; c < nc; c++) {
      run(&cands[c], s, A, B, C); /* warm up: JIT, packing buffers, threads */
      double best = 1e30, t_end = now() + seconds;
      int reps = 0;
      do {
        double t0 = now();
        run(&cands[c], s, A, B, C);
        double dt = now() - t0;
        if (dt < best) best = dt;
        reps++;
      } while (now() < t_end || reps < 3);
      double sum = 0;
      for (size_t i = 0; i < nC; i++) sum += C[i];
      printf("%-16s %-36s %8.1f GFLOP/s  (%d runs, checksum %.6g)\n", cands[c].name, s->label,
             2.0 * (double)s->m * (double)s->n * (double)s->k / best * 1e-9, reps, sum);
      fflush(stdout);
    }
    free(A), free(B), free(C);
  }
  return 0;
}
