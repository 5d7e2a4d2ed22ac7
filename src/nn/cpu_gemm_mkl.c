/* MKL's bf16 GEMM, loaded with dlopen (contract in nn/cpu_gemm_mkl.h). Nothing of MKL is
 * needed to build or run the engine: the symbols are looked up at the first use, and a missing
 * library or symbol leaves every product on oneDNN. MKL runs on GNU OpenMP (its threading layer
 * set before any call), so it shares the engine's threads and their count. */
#define _GNU_SOURCE /* dlopen flags */
#include "nn/cpu_gemm_mkl.h"
#include "nn/cpu_isa.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
  ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112, PACKED = 151, B_MATRIX = 162, /* cblas enums */
  THREADING_GNU = 3, INTERFACE_LP64 = 0,                                       /* mkl_service.h */
  DEFAULT_MIN_ELEMS = 4 << 20
};

typedef int mkl_int; /* the LP64 interface */
typedef size_t (*pack_size_fn)(int id, mkl_int m, mkl_int n, mkl_int k);
typedef void (*pack_fn)(int layout, int id, int trans, mkl_int m, mkl_int n, mkl_int k, const uint16_t *src,
                        mkl_int ld, uint16_t *dst);
typedef void (*compute_fn)(int layout, mkl_int ta, mkl_int tb, mkl_int m, mkl_int n, mkl_int k, float alpha,
                           const uint16_t *a, mkl_int lda, const uint16_t *b, mkl_int ldb, float beta, float *c,
                           mkl_int ldc);
typedef void (*sgemm_fn)(int layout, int ta, int tb, mkl_int m, mkl_int n, mkl_int k, float alpha, const float *a,
                         mkl_int lda, const float *b, mkl_int ldb, float beta, float *c, mkl_int ldc);
typedef size_t (*spack_size_fn)(int id, mkl_int m, mkl_int n, mkl_int k);
typedef void (*spack_fn)(int layout, int id, int trans, mkl_int m, mkl_int n, mkl_int k, float alpha, const float *src,
                         mkl_int ld, float *dst);
typedef void (*scompute_fn)(int layout, mkl_int ta, mkl_int tb, mkl_int m, mkl_int n, mkl_int k, const float *a,
                            mkl_int lda, const float *b, mkl_int ldb, float beta, float *c, mkl_int ldc);
typedef int (*layer_fn)(int code);
typedef void (*version_fn)(char *buf, int len);

static int g_ok;
static pack_size_fn g_pack_size;
static pack_fn g_pack;
static compute_fn g_compute;
static sgemm_fn g_sgemm;
static spack_size_fn g_spack_size;
static spack_fn g_spack;
static scompute_fn g_scompute;
static char g_status[256] = "MKL not tried";
static int g_sgemm_ok; /* the fp32 GEMM too (ds_mkl_sgemm_available) */

#ifndef DSPARK_MKL_RT
#define DSPARK_MKL_RT ""
#endif

/* Loads MKL once (ds_mkl_bf16_available, from any thread). */
static void load(void) {
  const char *path = getenv("DSPARK_MKL");
  if (!path || !*path) path = DSPARK_MKL_RT;
  if (!*path || !strcmp(path, "none")) {
    snprintf(g_status, sizeof g_status, "MKL not used (%s)", *path ? "DSPARK_MKL=none" : "the build found none");
    return;
  }
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) { /* a path was asked for: say once why the large products stay on oneDNN */
    snprintf(g_status, sizeof g_status, "MKL not loaded: %s", dlerror());
    fprintf(stderr, "warning: %s (%s); the large products stay on oneDNN\n", g_status,
            getenv("DSPARK_MKL") && *getenv("DSPARK_MKL") ? "DSPARK_MKL" : "the build's DSPARK_MKL_RT");
    return;
  }
  layer_fn threading = (layer_fn)dlsym(h, "MKL_Set_Threading_Layer");
  layer_fn interface = (layer_fn)dlsym(h, "MKL_Set_Interface_Layer");
  version_fn version = (version_fn)dlsym(h, "mkl_get_version_string");
  g_pack_size = (pack_size_fn)dlsym(h, "cblas_gemm_bf16bf16f32_pack_get_size");
  g_pack = (pack_fn)dlsym(h, "cblas_gemm_bf16bf16f32_pack");
  g_compute = (compute_fn)dlsym(h, "cblas_gemm_bf16bf16f32_compute");
  g_sgemm = (sgemm_fn)dlsym(h, "cblas_sgemm");
  g_spack_size = (spack_size_fn)dlsym(h, "cblas_sgemm_pack_get_size");
  g_spack = (spack_fn)dlsym(h, "cblas_sgemm_pack");
  g_scompute = (scompute_fn)dlsym(h, "cblas_sgemm_compute");
  if (!threading || !interface || !version || !g_pack_size || !g_pack || !g_compute || !g_sgemm || !g_spack_size ||
      !g_spack || !g_scompute) {
    snprintf(g_status, sizeof g_status, "MKL not used: %s lacks the bf16 or packed fp32 GEMM", path);
    fprintf(stderr, "warning: %s; the large products stay on oneDNN\n", g_status);
    return; /* the handle stays open: harmless */
  }
  if (interface(INTERFACE_LP64) != INTERFACE_LP64 || threading(THREADING_GNU) != THREADING_GNU) {
    snprintf(g_status, sizeof g_status, "MKL not used: %s would not take GNU OpenMP threading", path);
    fprintf(stderr, "warning: %s; the large products stay on oneDNN\n", g_status);
    return;
  }
  char v[200];
  version(v, (int)sizeof v);
  for (size_t n = strlen(v); n > 0 && v[n - 1] == ' '; n--) v[n - 1] = 0; /* MKL pads it */
  snprintf(g_status, sizeof g_status, "%.*s", (int)sizeof g_status - 1, v);
  g_ok = 1;
  g_sgemm_ok = !ds_cpu_is_amd();
}

static pthread_once_t g_once = PTHREAD_ONCE_INIT;

int ds_mkl_bf16_available(void) {
  pthread_once(&g_once, load);
  return g_ok;
}

const char *ds_mkl_bf16_status(void) { return g_status; }

int64_t ds_mkl_bf16_min_elems(void) {
  const char *e = getenv("DSPARK_MKL_BF16_MIN");
  char *end = NULL;
  long long v = e && *e ? strtoll(e, &end, 10) : DEFAULT_MIN_ELEMS;
  return e && *e && (*end || v < 1) ? DEFAULT_MIN_ELEMS : (int64_t)v;
}

size_t ds_mkl_bf16_pack_size(int64_t m, int64_t n, int64_t k) {
  return g_pack_size(B_MATRIX, (mkl_int)m, (mkl_int)n, (mkl_int)k);
}

void ds_mkl_bf16_pack(void *dst, const uint16_t *w, int64_t m, int64_t n, int64_t k) {
  g_pack(ROW_MAJOR, B_MATRIX, TRANS, (mkl_int)m, (mkl_int)n, (mkl_int)k, w, (mkl_int)k, dst);
}

void ds_mkl_bf16_gemm(int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t lda, const void *packed, float beta,
                      float *C, int64_t ldc) {
  g_compute(ROW_MAJOR, NO_TRANS, PACKED, (mkl_int)m, (mkl_int)n, (mkl_int)k, 1.0f, A, (mkl_int)lda, packed,
            (mkl_int)k, beta, C, (mkl_int)ldc);
}

/* Not on AMD CPUs: there MKL takes its generic code path (mkl_blas_def_sgemm_kernel_0_zen), slower
 * than oneDNN on 9 of the draft step's 11 shapes (AMD EPYC Zen 4, 2 threads: the draft optimizer
 * step 0.75 s with it against 0.62). */
int ds_mkl_sgemm_available(void) { return ds_mkl_bf16_available() && g_sgemm_ok; }

void ds_mkl_sgemm(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *B,
                  int64_t ldb, float beta, float *C, int64_t ldc) {
  g_sgemm(ROW_MAJOR, ta ? TRANS : NO_TRANS, tb ? TRANS : NO_TRANS, (mkl_int)m, (mkl_int)n, (mkl_int)k, 1.0f, A,
          (mkl_int)lda, B, (mkl_int)ldb, beta, C, (mkl_int)ldc);
}

size_t ds_mkl_sgemm_pack_size(int64_t m, int64_t n, int64_t k) {
  return g_spack_size(B_MATRIX, (mkl_int)m, (mkl_int)n, (mkl_int)k);
}

void ds_mkl_sgemm_pack(float *dst, const float *w, int64_t m, int64_t n, int64_t k) {
  g_spack(ROW_MAJOR, B_MATRIX, TRANS, (mkl_int)m, (mkl_int)n, (mkl_int)k, 1.0f, w, (mkl_int)k, dst);
}

void ds_mkl_sgemm_packed(int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *packed, float beta,
                         float *C, int64_t ldc) {
  g_scompute(ROW_MAJOR, NO_TRANS, PACKED, (mkl_int)m, (mkl_int)n, (mkl_int)k, A, (mkl_int)lda, packed, (mkl_int)k,
             beta, C, (mkl_int)ldc);
}
