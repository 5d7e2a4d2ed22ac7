/* The sgemm route of the bf16 products (contract in nn/cpu_gemm_bf16.h): both operands rounded
 * to bf16 values held in fp32 and multiplied by ds_cpu_sgemm. Every product of two bf16 values
 * is exact in fp32 and the sums are fp32, so the numbers are those of the native bf16 kernels up
 * to the order of summation.
 *
 * It runs every product in builds without oneDNN and on CPUs without native bf16, and the large
 * products where the native bf16 kernels are slower than the fp32 GEMM: AVX512_BF16 without AMX,
 * where one VDPBF16PS (port 0) does the multiply-adds of the two FMA ports' fp32 instructions
 * and the libraries add conversions. Measured on an Intel Xeon (family 6 model 207, AMX not
 * exposed), 2 threads, the models' shapes: the bf16 GEMMs of oneDNN 2.6 and 3.2, MKL 2026.2 and
 * PyTorch 100-220 GFLOP/s, oneDNN's sgemm 210-305 in the same runs (bench/gemm_bf16_libs.sh,
 * build/release/bench_sgemm; docs/performance.md, "GEMM kernels").
 *
 * A frozen BF16 weight is converted a band of rows at a time into a scratch that stays in cache,
 * so it keeps no fp32 copy (it is read in place, as the checkpoint holds it). A frozen F32 weight
 * used again gets one rounded copy instead (cpu_gemm_bf16.c's packed copies, under their cap),
 * and held operands theirs (cpu_gemm_bf16_held.c): the draft step's lm_head was rounded on every
 * chunk's forward and input gradient, 16% of the step (bench_draft_step --compute bf16). */
#include <pthread.h>
#include <stdlib.h>

#include "nn/cpu_gemm_bf16.h"
#include "nn/cpu_gemm_mkl.h"
#include "nn/cpu_kernels.h"

/* dst[r, 0:c] (row stride c) = the bf16 bits src[r, 0:c] (row stride lds) as fp32, exactly. */
static void widen_rows(float *dst, const uint16_t *src, int64_t rows, int64_t cols, int64_t lds) {
  DS_OMP(parallel for schedule(static) if (rows * cols > 65536))
  for (int64_t r = 0; r < rows; r++) {
    uint32_t *d = (uint32_t *)(dst + r * cols);
    for (int64_t j = 0; j < cols; j++) d[j] = (uint32_t)src[r * lds + j] << 16;
  }
}

/* Rows of B's fp32 values: Bf rounded or Bh widened, into dst (row stride cols). */
static void b_rows(float *dst, const float *Bf, const uint16_t *Bh, int64_t rows, int64_t cols, int64_t ldb) {
  if (Bf) ds_bf16_round_rows(dst, 0, Bf, rows, cols, ldb);
  else widen_rows(dst, Bh, rows, cols, ldb);
}

/* One lock for the scratch: the callers are the main thread (the threads are inside the GEMM and
 * the conversion loops), so it is never contended. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static float *g_a, *g_b;
static size_t g_a_cap, g_b_cap;

static float *grow(float **p, size_t *cap, size_t floats) {
  if (floats > *cap) {
    size_t want = (floats + 1023) & ~(size_t)1023;
    float *q = aligned_alloc(64, want * sizeof(float));
    DS_CHECK(q != NULL); /* a matmul cannot report an error: as any allocation failure in a kernel */
    free(*p);
    *p = q;
    *cap = want;
  }
  return *p;
}

/* The stored matrix src[rows, cols] (row stride ld) as bf16 values in fp32, packed (row stride
 * cols): a held operand's copy (ds_bf16_held_copy), else rounded into the scratch *s. Called
 * with g_lock held. */
static const float *rounded(const float *src, int64_t rows, int64_t cols, int64_t ld, float **s, size_t *cap) {
  const float *h = ds_bf16_held_copy(src, rows, cols, ld, 1);
  if (h) return h;
  float *d = grow(s, cap, (size_t)(rows * cols));
  ds_bf16_round_rows(d, 0, src, rows, cols, ld);
  return d;
}

void ds_bf16_sgemm(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *Bf,
                   const uint16_t *Bh, int64_t ldb, float beta, float *C, int64_t ldc) {
  /* stored shapes: A is [m, k] or [k, m]; B is [k, n] or [n, k] */
  int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
  pthread_mutex_lock(&g_lock);
  const float *a = rounded(A, ar, ac, lda, &g_a, &g_a_cap), *b;
  if (Bf) {
    b = rounded(Bf, br, bc, ldb, &g_b, &g_b_cap);
  } else {
    float *w = grow(&g_b, &g_b_cap, (size_t)(br * bc));
    widen_rows(w, Bh, br, bc, ldb);
    b = w;
  }
  ds_cpu_sgemm(ta, tb, m, n, k, a, ac, b, bc, beta, C, ldc);
  pthread_mutex_unlock(&g_lock);
}

void ds_bf16_sgemm_mkl_packed(int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *packed,
                              float beta, float *C, int64_t ldc) {
  pthread_mutex_lock(&g_lock);
  ds_mkl_sgemm_packed(m, n, k, rounded(A, m, k, lda, &g_a, &g_a_cap), k, packed, beta, C, ldc);
  pthread_mutex_unlock(&g_lock);
}

void ds_bf16_sgemm_rounded_b(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda,
                             const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  int64_t ar = ta ? k : m, ac = ta ? m : k;
  pthread_mutex_lock(&g_lock);
  const float *a = rounded(A, ar, ac, lda, &g_a, &g_a_cap);
  ds_cpu_sgemm(ta, tb, m, n, k, a, ac, B, ldb, beta, C, ldc);
  pthread_mutex_unlock(&g_lock);
}

/* Rows of W converted per band: 4 MiB of fp32, still in cache when the GEMM reads it, and at
 * least 512 rows, so each product is wide enough for the GEMM's blocking (the 1.7B shape's down
 * projection, 2048 x 6144, 256 rows, bench_gemm_bf16's w16pk, three runs each: 170-row bands
 * 177-222 GFLOP/s, 512-row bands 209-281). A 512-token prefill of the 100M Qwen3
 * (bf16 weights, 2 threads): 1 MiB bands 1284-1351 tokens/s, 2-8 MiB 1316-1414, whole weights
 * (no band) 1359; the 256-token prefill of the Qwen3-1.7B shape, whose weights stream from
 * memory, 4-16 MiB bands alike within the noise (62-77). */
enum { BAND_BYTES = 4 << 20, BAND_MIN_ROWS = 512 };

static int64_t band_rows(int64_t wr, int64_t wc) {
  int64_t band = (int64_t)(BAND_BYTES / sizeof(float)) / (wc > 0 ? wc : 1);
  band = band < BAND_MIN_ROWS ? BAND_MIN_ROWS : band;
  return band > wr ? wr : band;
}

/* Rows [r0, r0 + c) of the weight [segs[0]; segs[1]; ...] (rows[s] x k each, F32 when f32, else
 * BF16 bits) as fp32 values into dst (row stride k): a band may span segments. */
static void cat_rows(float *dst, const void *const *segs, int f32, const int64_t *rows, int n_seg, int64_t r0,
                     int64_t c, int64_t k) {
  int64_t first = 0; /* the first row of segment s */
  for (int s = 0; s < n_seg && c > 0; first += rows[s], s++) {
    if (r0 >= first + rows[s]) continue;
    int64_t from = r0 - first, take = rows[s] - from < c ? rows[s] - from : c;
    b_rows(dst, f32 ? (const float *)segs[s] + from * k : NULL, f32 ? NULL : (const uint16_t *)segs[s] + from * k,
           take, k, k);
    dst += take * k, r0 += take, c -= take;
  }
}

void ds_bf16_sgemm_frozen_cat(int64_t m, const void *const *segs, int f32, const int64_t *rows, int n_seg, int64_t k,
                              const float *A, int64_t lda, float beta, float *C, int64_t ldc) {
  int64_t n = 0;
  for (int s = 0; s < n_seg; s++) n += rows[s];
  DS_CHECK(m > 0 && n > 0 && k > 0); /* the caller handles empty products */
  int64_t band = band_rows(n, k);
  pthread_mutex_lock(&g_lock);
  const float *a = rounded(A, m, k, lda, &g_a, &g_a_cap); /* once for every segment */
  float *b = grow(&g_b, &g_b_cap, (size_t)(band * k));
  for (int64_t r0 = 0; r0 < n; r0 += band) { /* C's columns band by band, across segments */
    int64_t c = n - r0 < band ? n - r0 : band;
    cat_rows(b, segs, f32, rows, n_seg, r0, c, k);
    ds_cpu_sgemm(0, 1, m, c, k, a, k, b, k, beta, C + r0, ldc);
  }
  pthread_mutex_unlock(&g_lock);
}

void ds_bf16_sgemm_frozen(int tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *Bf,
                          const uint16_t *Bh, float beta, float *C, int64_t ldc) {
  if (tb) { /* C = A W^T: a band of C's columns per band of W's rows */
    const void *seg = Bf ? (const void *)Bf : (const void *)Bh;
    ds_bf16_sgemm_frozen_cat(m, &seg, Bf != NULL, &n, 1, k, A, lda, beta, C, ldc);
    return;
  }
  DS_CHECK(m > 0 && n > 0 && k > 0);
  /* C = A W, W stored [k, n]: a band of the summation per band of W's rows, beta on the first */
  int64_t band = band_rows(k, n);
  pthread_mutex_lock(&g_lock);
  const float *a = rounded(A, m, k, lda, &g_a, &g_a_cap);
  float *b = grow(&g_b, &g_b_cap, (size_t)(band * n));
  for (int64_t r0 = 0; r0 < k; r0 += band) {
    int64_t c = k - r0 < band ? k - r0 : band;
    b_rows(b, Bf ? Bf + r0 * n : NULL, Bf ? NULL : Bh + r0 * n, c, n, n);
    ds_cpu_sgemm(0, 0, m, n, c, a + r0, k, b, n, r0 ? 1.0f : beta, C, ldc);
  }
  pthread_mutex_unlock(&g_lock);
}
