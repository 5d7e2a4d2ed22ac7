/* The bf16 GEMM (ds_gemm_bf16, nn/cpu_gemm_bf16.h) and the cpu backend's matmuls under
 * DS_COMPUTE_BF16, against a double-precision reference on the bf16-rounded inputs. The
 * inputs of the reference are exactly the values the GEMM multiplies, so the only error left is
 * fp32 summation order: each entry must be within (k + 2) * 2^-24 * (sum |a_p b_p| + |C0|)
 * (the first-order bound of a k-term fp32 sum, plus the beta term). A bf16 rounding slip would
 * be ~2^-9 relative, hundreds of times that bound; a check that rounding happens at all
 * guards against the bound passing an fp32 GEMM of the unrounded inputs. Both paths: the
 * native one (oneDNN bf16 matmul where this build and CPU have it) and the portable one. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/backend.h"
#include "dspark/dtype.h"
#include "dspark/rng.h"
#include "nn/cpu_gemm_bf16.h"
#include "nn/cpu_gemm_mkl.h"
#include "nn/cpu_kernels.h"
#include "test_util.h"

static ds_rng g_rng;

static float urand(void) { return 2.0f * ds_rng_uniform_f32(&g_rng) - 1.0f; }

static float *rand_f32(size_t n) {
  float *p = malloc((n ? n : 1) * sizeof(float));
  for (size_t i = 0; i < n; i++) p[i] = urand();
  return p;
}

static double rb(float x) { return ds_bf16_to_f32(ds_f32_to_bf16(x)); }

/* Checks C (after the GEMM) against the reference of the rounded inputs; returns the count of
 * entries whose result differs from the fp32 product of the UNrounded inputs by more than the
 * bound (evidence that the inputs were rounded). */
static int check_gemm(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *B,
                      const uint16_t *Bh, int64_t ldb, float beta, const float *C0, const float *C, int64_t ldc,
                      const char *what) {
  int rounded_evidence = 0, bad = 0;
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double ref = 0, mag = 0, raw = 0;
      for (int64_t p = 0; p < k; p++) {
        float a = ta ? A[p * lda + i] : A[i * lda + p];
        int64_t bi = tb ? j * ldb + p : p * ldb + j;
        double b = Bh ? ds_bf16_to_f32(Bh[bi]) : rb(B[bi]), braw = Bh ? b : B[bi];
        ref += rb(a) * b;
        mag += fabs(rb(a) * b);
        raw += (double)a * braw;
      }
      double c0 = beta != 0.0f ? C0[i * ldc + j] : 0.0;
      ref += c0;
      raw += c0;
      double bound = (double)(k + 2) * 0x1p-24 * (mag + fabs(c0)) + 1e-30;
      double got = C[i * ldc + j];
      if (!(fabs(got - ref) <= bound)) {
        if (bad++ < 5)
          fprintf(stderr, "%s ta=%d tb=%d m=%lld n=%lld k=%lld beta=%g: C[%lld,%lld] = %.9g, reference %.9g (bound %g)\n",
                  what, ta, tb, (long long)m, (long long)n, (long long)k, beta, (long long)i, (long long)j, got, ref,
                  bound);
      }
      if (fabs(raw - ref) > 4 * bound) rounded_evidence++;
    }
  EXPECT(bad == 0);
  /* the untouched padding of C (ldc > n) stays as it was */
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = n; j < ldc; j++) EXPECT(C[i * ldc + j] == C0[i * ldc + j]);
  return rounded_evidence;
}

static void run_case(ds_bf16_path path, int ta, int tb, int64_t m, int64_t n, int64_t k, int pad, float beta,
                     int b_bits, int *evidence) {
  int64_t lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
  int64_t ar = ta ? k : m, br = tb ? n : k;
  float *A = rand_f32((size_t)(ar * lda)), *B = rand_f32((size_t)(br * ldb));
  float *C0 = rand_f32((size_t)(m * ldc)), *C = malloc((size_t)(m * ldc) * sizeof(float));
  uint16_t *Bh = NULL;
  if (b_bits) {
    Bh = malloc((size_t)(br * ldb) * sizeof(uint16_t));
    for (int64_t i = 0; i < br * ldb; i++) Bh[i] = ds_f32_to_bf16(B[i]);
  }
  memcpy(C, C0, (size_t)(m * ldc) * sizeof(float));
  if (beta == 0.0f) /* C is never read: NaNs there must not leak into the result */
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) C[i * ldc + j] = NAN;
  ds_cpu_gemm_bf16(path, ta, tb, m, n, k, A, lda, b_bits ? NULL : B, Bh, ldb, beta, C, ldc);
  *evidence += check_gemm(ta, tb, m, n, k, A, lda, B, Bh, ldb, beta, C0, C, ldc,
                          path == DS_BF16_PORTABLE ? "portable" : "auto");
  free(A), free(B), free(C0), free(C), free(Bh);
}

static void test_gemm_all_cases(void) {
  static const int64_t shapes[][3] = {{1, 1, 1}, {1, 37, 50}, {7, 13, 5}, {33, 65, 129}, {64, 48, 80}, {70, 3, 300}};
  for (int path = DS_BF16_AUTO; path <= DS_BF16_PORTABLE; path++) {
    int evidence = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
      for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
          for (int pad = 0; pad <= 3; pad += 3)
            for (int beta = 0; beta < 2; beta++)
              for (int bits = 0; bits < 2; bits++)
                run_case((ds_bf16_path)path, ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], pad, (float)beta, bits,
                         &evidence);
    EXPECT(evidence > 0);
  }
}

/* A zero-size product: k = 0 gives beta * C (0 overwrites), m or n = 0 touches nothing. */
static void test_gemm_empty(void) {
  float C[6] = {1, 2, 3, 4, 5, 6}, A[1] = {1}, B[1] = {1};
  ds_gemm_bf16(0, 1, 2, 3, 0, A, 1, B, 1, 1.0f, C, 3);
  EXPECT(C[0] == 1 && C[5] == 6);
  ds_gemm_bf16(0, 1, 2, 3, 0, A, 1, B, 1, 0.0f, C, 3);
  EXPECT(C[0] == 0 && C[5] == 0);
  C[0] = 7;
  ds_gemm_bf16(0, 1, 0, 3, 5, A, 1, B, 1, 0.0f, C, 3);
  EXPECT(C[0] == 7);
}

/* The backend's matmuls under DS_COMPUTE_BF16 with enough rows to take the bf16 GEMM, against
 * the same reference; back under DS_COMPUTE_F32, bit for bit the fp32 GEMM. */
static void test_backend_under_bf16(void) {
  const ds_backend *be = ds_backend_cpu();
  int64_t n = 3 + (DS_BF16_MIN_ROWS_DW > DS_BF16_MIN_ROWS_F32W ? DS_BF16_MIN_ROWS_DW : DS_BF16_MIN_ROWS_F32W);
  int64_t in = 40, out = 24;
  EXPECT(n >= DS_BF16_MIN_ROWS_BF16W);
  float *x = rand_f32((size_t)(n * in)), *w = rand_f32((size_t)(out * in)), *bias = rand_f32((size_t)out);
  float *dy = rand_f32((size_t)(n * out)), *y = malloc((size_t)(n * out) * sizeof(float));
  float *dx = calloc((size_t)(n * in), sizeof(float)), *dw = calloc((size_t)(out * in), sizeof(float));
  float *dx0 = calloc((size_t)(n * in), sizeof(float)), *dw0 = calloc((size_t)(out * in), sizeof(float));
  float *y32 = malloc((size_t)(n * out) * sizeof(float));
  uint16_t *wh = malloc((size_t)(out * in) * sizeof(uint16_t));
  for (int64_t i = 0; i < out * in; i++) wh[i] = ds_f32_to_bf16(w[i]);
  ds_weight wbf = {.data = wh, .dtype = DS_BF16};
  int ev = 0;

  ds_set_matmul_compute(DS_COMPUTE_BF16);
  EXPECT(ds_matmul_compute() == DS_COMPUTE_BF16);
  /* y = x @ w^T (no bias: the bias is added in fp32 before, checked below) */
  be->linear(y, x, w, NULL, n, in, out);
  float *zeros = calloc((size_t)(n * out), sizeof(float));
  ev += check_gemm(0, 1, n, out, in, x, in, w, NULL, in, 0.0f, zeros, y, out, "linear");
  /* with bias: C0 = bias broadcast, beta = 1 */
  float *yb0 = malloc((size_t)(n * out) * sizeof(float));
  for (int64_t i = 0; i < n; i++) memcpy(yb0 + i * out, bias, (size_t)out * sizeof(float));
  be->linear(y, x, w, bias, n, in, out);
  ev += check_gemm(0, 1, n, out, in, x, in, w, NULL, in, 1.0f, yb0, y, out, "linear+bias");
  /* linear_backward: dx += dy @ w, dw += dy^T @ x (accumulating into non-zero gradients) */
  for (int64_t i = 0; i < n * in; i++) dx[i] = dx0[i] = urand();
  for (int64_t i = 0; i < out * in; i++) dw[i] = dw0[i] = urand();
  be->linear_backward(dx, dw, NULL, dy, x, w, n, in, out);
  ev += check_gemm(0, 0, n, in, out, dy, out, w, NULL, in, 1.0f, dx0, dx, in, "linear_backward dx");
  ev += check_gemm(1, 0, out, in, n, dy, out, x, NULL, in, 1.0f, dw0, dw, in, "linear_backward dw");
  /* a frozen BF16 weight, used in place */
  be->linear_w(y, out, x, wbf, NULL, n, in, out);
  ev += check_gemm(0, 1, n, out, in, x, in, NULL, wh, in, 0.0f, zeros, y, out, "linear_w bf16");
  memcpy(dx, dx0, (size_t)(n * in) * sizeof(float));
  be->linear_w_backward(dx, dy, wbf, n, in, out);
  ev += check_gemm(0, 0, n, in, out, dy, out, NULL, wh, in, 1.0f, dx0, dx, in, "linear_w_backward bf16");
  EXPECT(ev > 0);

  /* one row (decode) keeps the fp32 path: bit for bit the fp32 GEMM */
  be->linear(y, x, w, NULL, 1, in, out);
  ds_gemm_f32(0, 1, 1, out, in, x, in, w, in, 0.0f, y32, out);
  EXPECT(memcmp(y, y32, (size_t)out * sizeof(float)) == 0);

  /* fp32 compute: the fp32 GEMM, bit for bit */
  ds_set_matmul_compute(DS_COMPUTE_F32);
  be->linear(y, x, w, NULL, n, in, out);
  ds_gemm_f32(0, 1, n, out, in, x, in, w, in, 0.0f, y32, out);
  EXPECT(memcmp(y, y32, (size_t)(n * out) * sizeof(float)) == 0);
  free(x), free(w), free(bias), free(dy), free(y), free(dx), free(dw), free(dx0), free(dw0), free(y32), free(wh);
  free(zeros), free(yb0);
}

#if defined(DSPARK_GEMM_ONEDNN)
enum { ONEDNN_BUILD = 1 }; /* the packed-copy cache is in oneDNN builds only */
#else
enum { ONEDNN_BUILD = 0 };
#endif

/* Frozen weights through their packed copies (ds_cpu_gemm_bf16_frozen), in both uses: the
 * forward (B = W[n, k]^T) and the input gradient (B = W[k, n]), each its own copy on the native
 * route, one rounded copy of an F32 W for both on the sgemm route. The first use runs in place,
 * the second packs, the third reuses the copy; every result within the bound of the reference, a
 * padded C (ldc > n) with beta = 1 included. Our own AMX packer equals oneDNN's reorder bit for
 * bit; a weight rewritten in place is repacked (not served stale); release frees every copy.
 * Shapes off the AMX blocks (k % 32, n % 64 != 0) check the padding. */

static void test_packed_frozen(void) {
  /* m, n, k; the last in several bands of the sgemm route (BAND_BYTES in cpu_gemm_bf16_sgemm.c) */
  static const int64_t shapes[][3] = {{24, 100, 40}, {16, 256, 64}, {9, 72, 96}, {9, 1100, 2048}};
  int ev = 0;
  for (int s = 0; s < 4; s++)
    for (int tb = 1; tb >= 0; tb--) {
      int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2], ldc = n + 5, ldb = tb ? k : n;
      const char *use_name = tb ? "forward" : "input gradient";
      float *A = rand_f32((size_t)(m * k)), *W = rand_f32((size_t)(n * k)), *C0 = rand_f32((size_t)(m * ldc));
      float *C = malloc((size_t)(m * ldc) * sizeof(float)), *first = malloc((size_t)(m * ldc) * sizeof(float));
      uint16_t *Wh = malloc((size_t)(n * k) * sizeof(uint16_t));
      for (int64_t i = 0; i < n * k; i++) Wh[i] = ds_f32_to_bf16(W[i]);
      for (int bits = 0; bits < 2; bits++) {
        const float *Bf = bits ? NULL : W;
        const uint16_t *Bh = bits ? Wh : NULL;
        ds_release_packed_weights();
        for (int use = 0; use < 4; use++) { /* the last with beta 0 */
          float beta = use == 3 ? 0.0f : 1.0f;
          memcpy(C, C0, (size_t)(m * ldc) * sizeof(float));
          ds_cpu_gemm_bf16_frozen(tb, m, n, k, A, k, Bf, Bh, beta, C, ldc);
          ev += check_gemm(0, tb, m, n, k, A, k, W, Bh, ldb, beta, C0, C, ldc, bits ? "frozen bf16" : "frozen f32");
          for (int64_t i = 0; i < m; i++) /* the padding columns of C are not touched */
            EXPECT(memcmp(C + i * ldc + n, C0 + i * ldc + n, 5 * sizeof(float)) == 0);
          if (use == 1) memcpy(first, C, (size_t)(m * ldc) * sizeof(float));
          if (use == 2) EXPECT(memcmp(first, C, (size_t)(m * ldc) * sizeof(float)) == 0);
        }
        /* copies kept: the native route's packed ones; the sgemm route's rounded copy of an F32 W */
        int kept = ds_gemm_bf16_native() || (!bits && ONEDNN_BUILD);
        EXPECT((ds_packed_weight_bytes() > 0) == kept);
        if (tb == 0 && kept) {
          /* the same weight in the other use: on the native route a second copy (its own layout),
           * on the sgemm route the same rounded copy (or, for a forward MKL runs, its MKL-packed
           * one: the last shape); not the first one misread either way */
          size_t one = ds_packed_weight_bytes();
          float *X = rand_f32((size_t)(m * n)), *Y = calloc((size_t)(m * k), sizeof(float));
          for (int use = 0; use < 2; use++) ds_cpu_gemm_bf16_frozen(1, m, k, n, X, n, Bf, Bh, 0.0f, Y, k);
          ev += check_gemm(0, 1, m, k, n, X, n, W, Bh, n, 0.0f, Y, Y, k, "frozen, both uses");
          if (ds_gemm_bf16_native() && ds_packed_weight_bytes() <= one)
            fprintf(stderr, "%s: no second packed copy\n", use_name);
          int mkl_fwd = ONEDNN_BUILD && m * n * k >= DS_MKL_SGEMM_MIN && ds_mkl_sgemm_available();
          EXPECT(ds_gemm_bf16_native() || mkl_fwd ? ds_packed_weight_bytes() > one : ds_packed_weight_bytes() == one);
          free(X), free(Y);
        }
        /* oneDNN's reorder instead of ours: the same packed bits, the same product */
        ds_release_packed_weights();
        EXPECT(ds_packed_weight_bytes() == 0);
        setenv("DSPARK_BF16_PACK_ONEDNN", "1", 1);
        for (int use = 0; use < 2; use++) {
          memcpy(C, C0, (size_t)(m * ldc) * sizeof(float));
          ds_cpu_gemm_bf16_frozen(tb, m, n, k, A, k, Bf, Bh, 1.0f, C, ldc);
        }
        unsetenv("DSPARK_BF16_PACK_ONEDNN");
        EXPECT(memcmp(first, C, (size_t)(m * ldc) * sizeof(float)) == 0);
      }
      /* rewritten in place after packing (both dtypes): the new values are used */
      for (int use = 0; use < 2; use++) ds_cpu_gemm_bf16_frozen(tb, m, n, k, A, k, W, NULL, 1.0f, C, ldc);
      for (int64_t i = 0; i < n * k; i++) Wh[i] = ds_f32_to_bf16(-W[i] * 0.5f);
      for (int64_t i = 0; i < n * k; i++) W[i] = ds_bf16_to_f32(Wh[i]);
      for (int bits = 0; bits < 2; bits++) {
        memcpy(C, C0, (size_t)(m * ldc) * sizeof(float));
        ds_cpu_gemm_bf16_frozen(tb, m, n, k, A, k, bits ? NULL : W, bits ? Wh : NULL, 1.0f, C, ldc);
        ev += check_gemm(0, tb, m, n, k, A, k, W, Wh, ldb, 1.0f, C0, C, ldc, "frozen rewritten");
      }
      ds_release_packed_weights();
      EXPECT(ds_packed_weight_bytes() == 0);
      free(A), free(W), free(C0), free(C), free(first), free(Wh);
    }
  EXPECT(ev > 0);
}

/* MKL's bf16 GEMM on the packed frozen weights it takes (nn/cpu_gemm_mkl.h), forced onto small
 * weights ($DSPARK_MKL_BF16_MIN=1): the forward of a frozen F32 or BF16 weight and of a
 * concatenation (linear_w_cat's path), each within the reference's bound on its first use (in
 * place, oneDNN), its second (packs in MKL's layout) and later ones with another row count than
 * the packing's (the packed copy serves any m), beta 0 and 1, a padded C. Skipped where the
 * build found no MKL or the CPU runs no native bf16. */
static void test_mkl_frozen(void) {
  if (!ds_gemm_bf16_native() || !ds_mkl_bf16_available()) {
    fprintf(stderr, "MKL bf16 GEMM not here (%s): skipped\n", ds_mkl_bf16_status());
    return;
  }
  setenv("DSPARK_MKL_BF16_MIN", "1", 1);
  int ev = 0;
  const int64_t n = 136, k = 72, ldc = n + 3, ms[] = {16, 16, 5, 33};
  float *W = rand_f32((size_t)(n * k)), *C0 = rand_f32((size_t)(40 * ldc)), *C = malloc((size_t)(40 * ldc) * 4);
  float *A = rand_f32((size_t)(40 * k));
  uint16_t *Wh = malloc((size_t)(n * k) * sizeof(uint16_t));
  for (int64_t i = 0; i < n * k; i++) Wh[i] = ds_f32_to_bf16(W[i]);
  for (int bits = 0; bits < 2; bits++) {
    ds_release_packed_weights();
    for (int use = 0; use < 4; use++) {
      int64_t m = ms[use];
      float beta = use % 2 ? 1.0f : 0.0f;
      memcpy(C, C0, (size_t)(40 * ldc) * sizeof(float));
      ds_cpu_gemm_bf16_frozen(1, m, n, k, A, k, bits ? NULL : W, bits ? Wh : NULL, beta, C, ldc);
      ev += check_gemm(0, 1, m, n, k, A, k, W, bits ? Wh : NULL, k, beta, C0, C, ldc, "MKL frozen");
      for (int64_t i = 0; i < m; i++) EXPECT(memcmp(C + i * ldc + n, C0 + i * ldc + n, 3 * sizeof(float)) == 0);
      if (use == 1) EXPECT(ds_packed_weight_bytes() > 0); /* the second use packed */
    }
  }
  /* a concatenation of two segments read as one weight */
  const void *segs[2] = {Wh, Wh + 40 * k};
  const int64_t rows[2] = {40, n - 40};
  ds_release_packed_weights();
  for (int use = 0; use < 3; use++) {
    memcpy(C, C0, (size_t)(40 * ldc) * sizeof(float));
    ds_cpu_gemm_bf16_frozen_cat(ms[use], segs, 0, rows, 2, k, A, k, 0.0f, C, ldc);
    ev += check_gemm(0, 1, ms[use], n, k, A, k, W, Wh, k, 0.0f, C0, C, ldc, "MKL frozen concatenation");
  }
  EXPECT(ds_packed_weight_bytes() > 0);
  ds_release_packed_weights();
  unsetenv("DSPARK_MKL_BF16_MIN");
  EXPECT(ev > 0);
  free(W), free(C0), free(C), free(A), free(Wh);
}

/* ds_cpu_gemm_bf16_frozen_cat on segments whose rows cross the sgemm route's bands (4 MiB of
 * fp32 rows of k = 64: 16384 rows, so the first band holds segments 0 and 1 and part of 2), F32
 * and BF16, beta 0 and 1, each use within the reference's bound on the concatenated weight (on
 * the native route: in place, then packed). */
static void test_frozen_cat_bands(void) {
  const int64_t rows[3] = {7000, 6000, 5000}, n = 18000, k = 64, m = 5, ldc = n + 3;
  float *W = rand_f32((size_t)(n * k)), *A = rand_f32((size_t)(m * k)), *C0 = rand_f32((size_t)(m * ldc));
  float *C = malloc((size_t)(m * ldc) * sizeof(float));
  uint16_t *Wh = malloc((size_t)(n * k) * sizeof(uint16_t));
  for (int64_t i = 0; i < n * k; i++) Wh[i] = ds_f32_to_bf16(W[i]);
  int ev = 0;
  for (int bits = 0; bits < 2; bits++) {
    const void *segs[3];
    for (int s = 0, row = 0; s < 3; row += (int)rows[s], s++)
      segs[s] = bits ? (const void *)(Wh + (int64_t)row * k) : (const void *)(W + (int64_t)row * k);
    ds_release_packed_weights();
    for (int use = 0; use < 3; use++) {
      float beta = use == 1 ? 0.0f : 1.0f;
      memcpy(C, C0, (size_t)(m * ldc) * sizeof(float));
      ds_cpu_gemm_bf16_frozen_cat(m, segs, !bits, rows, 3, k, A, k, beta, C, ldc);
      ev += check_gemm(0, 1, m, n, k, A, k, W, bits ? Wh : NULL, k, beta, C0, C, ldc, "frozen concatenation");
    }
  }
  ds_release_packed_weights();
  EXPECT(ev > 0);
  free(W), free(A), free(C0), free(C), free(Wh);
}

/* attention_causal under DS_COMPUTE_BF16 (bf16 QK^T and PV, fp32 softmax) against the fp32
 * kernel: within 2^-6 * max|v| (measured: about 2^-10 on these inputs; a wrong mask, row or
 * head would be O(max|v|)), different from it (the products did run in bf16), the same bits on
 * a second run (the threads' tiles are independent), and below DS_BF16_ATTN_MIN_ROWS query rows
 * the fp32 kernel bit for bit. Shapes: a prompt after a cached prefix, chunks not full. */
static void test_attention_bf16(void) {
  const int64_t H = 6, KV = 2, hd = 32, past = 30, cap = 200;
  const int64_t ns[] = {100, DS_BF16_ATTN_MIN_ROWS - 1};
  for (int c = 0; c < 2; c++) {
    int64_t n = ns[c];
    float *q = rand_f32((size_t)(n * H * hd)), *k = rand_f32((size_t)(KV * cap * hd));
    float *v = rand_f32((size_t)(KV * cap * hd));
    size_t ob = (size_t)(n * H * hd) * sizeof(float);
    float *o32 = malloc(ob), *o16 = malloc(ob), *o16b = malloc(ob);
    float scale = 1.0f / sqrtf((float)hd);
    ds_set_matmul_compute(DS_COMPUTE_F32);
    ds_backend_cpu()->attention_causal(o32, q, H * hd, k, v, n, past, cap, H, KV, hd, scale);
    ds_set_matmul_compute(DS_COMPUTE_BF16);
    ds_backend_cpu()->attention_causal(o16, q, H * hd, k, v, n, past, cap, H, KV, hd, scale);
    ds_backend_cpu()->attention_causal(o16b, q, H * hd, k, v, n, past, cap, H, KV, hd, scale);
    ds_set_matmul_compute(DS_COMPUTE_F32);
    double worst = 0;
    for (int64_t i = 0; i < n * H * hd; i++) worst = fmax(worst, fabs((double)o16[i] - o32[i]));
    EXPECT(memcmp(o16, o16b, ob) == 0);
    if (n < DS_BF16_ATTN_MIN_ROWS || !ds_bf16_tiles_native()) {
      EXPECT(memcmp(o16, o32, ob) == 0);
    } else {
      EXPECT(worst <= 0x1p-6);
      EXPECT(worst > 0);
      fprintf(stderr, "attention bf16 vs fp32, n=%lld: max |diff| %.3g\n", (long long)n, worst);
    }
    free(q), free(k), free(v), free(o32), free(o16), free(o16b);
  }
}

/* The bf16 attention's softmax row (ds_exp_row_bf16): both instruction-set forms give the same
 * bits (probabilities and sum) on every row length around the 16-lane blocks, a NaN score
 * included; the values are the rounded exps of a double reference (within bf16's half ulp plus
 * the exp's 3e-7), the padding is zero, and the sum matches the reference to fp32 order. */
static void test_exp_row_bf16(void) {
  const int64_t lens[] = {1, 15, 16, 17, 63, 64, 100, 257};
  const float scale = 0.125f;
  for (int c = 0; c < 8; c++) {
    int64_t vis = lens[c], kp = (vis + 63) / 64 * 64;
    float *row = rand_f32((size_t)kp);
    for (int64_t j = 0; j < kp; j++) row[j] *= 40.0f; /* scaled scores in [-5, 5] */
    for (int nan = 0; nan < 2; nan++) {
      if (nan) row[vis / 2] = NAN;
      uint16_t *pa = malloc((size_t)kp * 2), *pp = malloc((size_t)kp * 2);
      memset(pa, 0xff, (size_t)kp * 2), memset(pp, 0xff, (size_t)kp * 2);
      float sa = ds_exp_row_bf16(DS_ISA_AVX512, pa, row, vis, kp, scale);
      float sp = ds_exp_row_bf16(DS_ISA_PORTABLE, pp, row, vis, kp, scale);
      EXPECT(memcmp(pa, pp, (size_t)kp * 2) == 0);
      EXPECT(memcmp(&sa, &sp, sizeof sa) == 0);
      for (int64_t j = vis; j < kp; j++) EXPECT(pp[j] == 0);
      if (nan) {
        EXPECT(isnan(sp) && isnan(ds_bf16_to_f32(pp[vis / 2])));
      } else {
        double m = -INFINITY, sum = 0;
        for (int64_t j = 0; j < vis; j++) m = fmax(m, (double)(row[j] * scale));
        for (int64_t j = 0; j < vis; j++) {
          double e = exp((double)row[j] * scale - m), got = ds_bf16_to_f32(pp[j]);
          sum += e;
          EXPECT(fabs(got - e) <= e * (0x1p-8 + 4e-7)); /* bf16: 8 significant bits */
        }
        EXPECT(fabs(sp - sum) <= sum * ((double)vis * 0x1p-24 + 4e-7));
      }
      free(pa), free(pp);
    }
    free(row);
  }
}

static void test_compute_names(void) {
  ds_compute c = DS_COMPUTE_F32;
  EXPECT(ds_compute_parse("bf16", &c) && c == DS_COMPUTE_BF16);
  EXPECT(ds_compute_parse("fp32", &c) && c == DS_COMPUTE_F32);
  EXPECT(!ds_compute_parse("fp16", &c));
  EXPECT(!strcmp(ds_compute_name(DS_COMPUTE_BF16), "bf16"));
  const char *name = ds_gemm_bf16_name();
  EXPECT(name && name[0]);
  /* the warning is there exactly when no native bf16 kernel runs (not even the attention tiles) */
  EXPECT((ds_gemm_bf16_warning() == NULL) == ds_bf16_tiles_native());
  fprintf(stderr, "bf16 GEMM: %s\n", name);
}

/* Held operands (the cpu backend's operand_hold / operand_release): while A and B are held,
 * products read their kept copies (bf16 bits; bf16 values in fp32 on the sgemm route), one per
 * stored shape (a plain and a transposed use of the same memory, as a chunk's dlogits is read by
 * dx and dW), with the same bits as without the hold; nested holds keep the copy until the last
 * release; after it, new values are read. */
static void test_held_operands(void) {
  const ds_backend *be = ds_backend_cpu();
  enum { M = 40, N = 72, K = 96 };
  float *A = rand_f32(M * K), *B = rand_f32(N * K), *want = malloc(sizeof(float) * M * N);
  float *got = malloc(sizeof(float) * M * N), *wantT = malloc(sizeof(float) * K * N), *gotT = malloc(sizeof(float) * K * N);
  float *B2 = rand_f32(M * N);
  ds_cpu_gemm_bf16(DS_BF16_AUTO, 0, 1, M, N, K, A, K, B, NULL, K, 0.0f, want, N);  /* A @ B^T */
  ds_cpu_gemm_bf16(DS_BF16_AUTO, 1, 0, K, N, M, A, K, B2, NULL, N, 0.0f, wantT, N); /* A^T @ B2 */
  be->operand_hold(A, M * K);
  be->operand_hold(B, N * K);
  be->operand_hold(A, M * K); /* nested */
  for (int rep = 0; rep < 2; rep++) {
    ds_cpu_gemm_bf16(DS_BF16_AUTO, 0, 1, M, N, K, A, K, B, NULL, K, 0.0f, got, N);
    EXPECT(memcmp(got, want, sizeof(float) * M * N) == 0);
    ds_cpu_gemm_bf16(DS_BF16_AUTO, 1, 0, K, N, M, A, K, B2, NULL, N, 0.0f, gotT, N);
    EXPECT(memcmp(gotT, wantT, sizeof(float) * K * N) == 0);
  }
  be->operand_release(A); /* still held once */
  { /* the kept copy is what is read (on either route): a change the caller promised not to make goes unseen */
    float a0 = A[0];
    A[0] += 1.0f;
    ds_cpu_gemm_bf16(DS_BF16_AUTO, 0, 1, M, N, K, A, K, B, NULL, K, 0.0f, got, N);
    EXPECT(memcmp(got, want, sizeof(float) * M * N) == 0);
    A[0] = a0;
  }
  be->operand_release(A);
  be->operand_release(B);
  be->operand_release(B); /* an extra release: nothing happens */
  for (int i = 0; i < M * K; i++) A[i] = -A[i]; /* released: the new values are read */
  ds_cpu_gemm_bf16(DS_BF16_AUTO, 0, 1, M, N, K, A, K, B, NULL, K, 0.0f, got, N);
  for (int i = 0; i < M * N; i++) EXPECT(got[i] == -want[i]);
  free(A), free(B), free(B2), free(want), free(got), free(wantT), free(gotT);
}

/* linear_w_cat (q, k, v stored apart, read as one weight) on the cpu backend: under bf16, with F32
 * and BF16 segments and a bias, uses 1 (the segments in place), 2 (packing the concatenation) and
 * 3 (its packed copy) each within the bound of the reference on the concatenated weight, 2 and 3
 * the same bits;
 * under fp32, bit for bit one linear_w per segment; the reference backend's equals its own
 * linear_w per segment. */
static void test_linear_w_cat(void) {
  const ds_backend *be = ds_backend_cpu(), *ref = ds_backend_reference();
  enum { N = 48, IN = 64, S = 3 };
  const int64_t out[S] = {40, 24, 24};
  int64_t total = 88;
  float *x = rand_f32(N * IN), *wcat = rand_f32((size_t)(total * IN)), *bias = rand_f32((size_t)total);
  uint16_t *hcat = malloc((size_t)(total * IN) * sizeof(uint16_t));
  for (int64_t i = 0; i < total * IN; i++) hcat[i] = ds_f32_to_bf16(wcat[i]);
  float *segf[S], *y = malloc(sizeof(float) * N * total), *y2 = malloc(sizeof(float) * N * total);
  float *c0 = malloc(sizeof(float) * N * total), *first = malloc(sizeof(float) * N * total);
  uint16_t *segh[S];
  for (int s = 0, row = 0; s < S; row += (int)out[s], s++) { /* apart, as a checkpoint stores them */
    segf[s] = malloc(sizeof(float) * (size_t)(out[s] * IN));
    segh[s] = malloc(sizeof(uint16_t) * (size_t)(out[s] * IN));
    memcpy(segf[s], wcat + row * IN, sizeof(float) * (size_t)(out[s] * IN));
    memcpy(segh[s], hcat + row * IN, sizeof(uint16_t) * (size_t)(out[s] * IN));
  }
  for (int64_t i = 0; i < N; i++) memcpy(c0 + i * total, bias, sizeof(float) * (size_t)total);
  int ev = 0;
  for (int bits = 0; bits < 2; bits++) {
    ds_weight w[S];
    for (int s = 0; s < S; s++) w[s] = bits ? (ds_weight){.data = segh[s], .dtype = DS_BF16}
                                             : (ds_weight){.data = segf[s], .dtype = DS_F32};
    ds_set_matmul_compute(DS_COMPUTE_BF16);
    ds_release_packed_weights();
    for (int use = 0; use < 3; use++) {
      be->linear_w_cat(y, total, x, w, out, S, bias, N, IN);
      ev += check_gemm(0, 1, N, total, IN, x, IN, bits ? NULL : wcat, bits ? hcat : NULL, IN, 1.0f, c0, y, total,
                       bits ? "linear_w_cat bf16" : "linear_w_cat f32");
      if (use == 1) memcpy(first, y, sizeof(float) * N * total);
      if (use == 2) EXPECT(memcmp(first, y, sizeof(float) * N * total) == 0);
    }
    ds_release_packed_weights();
    ds_set_matmul_compute(DS_COMPUTE_F32);
    be->linear_w_cat(y, total, x, w, out, S, bias, N, IN);
    for (int s = 0, col = 0; s < S; col += (int)out[s], s++) be->linear_w(y2 + col, total, x, w[s], bias + col, N, IN, out[s]);
    EXPECT(memcmp(y, y2, sizeof(float) * N * total) == 0);
    ref->linear_w_cat(y, total, x, w, out, S, bias, N, IN);
    for (int s = 0, col = 0; s < S; col += (int)out[s], s++) ref->linear_w(y2 + col, total, x, w[s], bias + col, N, IN, out[s]);
    EXPECT(memcmp(y, y2, sizeof(float) * N * total) == 0);
  }
  EXPECT(ev > 0);
  for (int s = 0; s < S; s++) free(segf[s]), free(segh[s]);
  free(x), free(wcat), free(bias), free(hcat), free(y), free(y2), free(c0), free(first);
}

int main(void) {
  ds_rng_seed(&g_rng, 2024);
  TEST_RUN(test_gemm_all_cases);
  TEST_RUN(test_gemm_empty);
  TEST_RUN(test_backend_under_bf16);
  TEST_RUN(test_packed_frozen);
  TEST_RUN(test_mkl_frozen);
  TEST_RUN(test_held_operands);
  TEST_RUN(test_linear_w_cat);
  TEST_RUN(test_frozen_cat_bands);
  TEST_RUN(test_attention_bf16);
  TEST_RUN(test_exp_row_bf16);
  TEST_RUN(test_compute_names);
  return TEST_RESULT();
}
