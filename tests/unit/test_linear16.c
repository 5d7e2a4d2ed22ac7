/* The kernels on frozen BF16 / F16 weights (nn/cpu_linear16.h, the backend's linear_w,
 * linear_w_backward and embedding_w) against the naive reference kernels: every instruction
 * set this CPU has (AVX-512, AVX2, portable), both regimes (direct and chunked, chunks that do
 * and do not divide the rows), random shapes with odd sizes, n = 1 and large, with and
 * without bias, an output row stride; the direct kernels on F32 weights (the decode of a frozen
 * fp32 weight); the exactness contract (chunked = fp32 GEMM on the converted weights, bit for
 * bit; F32 weights beyond the decode's rows = the fp32 linear, bit for bit); the conversion of
 * every 16-bit pattern; and the backward against finite differences. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/backend.h"
#include "dspark/dtype.h"
#include "dspark/rng.h"
#include "nn/cpu_linear16.h"
#include "test_util.h"

static ds_rng g_rng;

static float urand(void) { return 2.0f * ds_rng_uniform_f32(&g_rng) - 1.0f; }

static float *rand_f32(size_t n, float scale) {
  float *p = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) p[i] = urand() * scale;
  return p;
}

/* A random weight in dtype (values of magnitude up to `scale`) and its exact fp32 copy. */
static uint16_t *rand_w16(size_t n, ds_dtype dt, float scale, float **as_f32) {
  uint16_t *w = malloc(n * sizeof(uint16_t));
  float *f = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) {
    float v = urand() * scale;
    w[i] = dt == DS_BF16 ? ds_f32_to_bf16(v) : ds_f32_to_f16(v);
    f[i] = dt == DS_BF16 ? ds_bf16_to_f32(w[i]) : ds_f16_to_f32(w[i]);
  }
  *as_f32 = f;
  return w;
}

/* rand_w16, or for DS_F32 the fp32 weight itself (*as_f32 a copy of it). */
static void *rand_w(size_t n, ds_dtype dt, float scale, float **as_f32) {
  if (dt != DS_F32) return rand_w16(n, dt, scale, as_f32);
  float *w = rand_f32(n, scale), *f = malloc(n * sizeof(float));
  memcpy(f, w, n * sizeof(float));
  *as_f32 = f;
  return w;
}

static const ds_dtype k_dtypes[2] = {DS_BF16, DS_F16};
static const ds_dtype k_direct_dtypes[3] = {DS_BF16, DS_F16, DS_F32}; /* the direct kernels' weights */

typedef struct {
  int64_t n, in, out;
} shape3;

/* n = 1 (decode), n up to the direct limit and beyond, sizes that are not multiples of the
 * SIMD width (tails) and one that is (full vectors only). */
static const shape3 k_shapes[] = {{1, 64, 96}, {1, 37, 19}, {2, 2048, 33}, {3, 100, 45}, {5, 16, 7},
                                  {8, 129, 66}, {9, 64, 50},  {33, 130, 70}, {130, 64, 200}};
enum { N_SHAPES = sizeof k_shapes / sizeof k_shapes[0] };

static void test_forward_paths(void) {
  const ds_backend *ref = ds_backend_reference();
  for (int s = 0; s < N_SHAPES; s++)
    for (int t = 0; t < 3; t++) {
      int64_t n = k_shapes[s].n, in = k_shapes[s].in, out = k_shapes[s].out, ldy = out + 3;
      ds_dtype dt = k_direct_dtypes[t];
      float *wf, *x = rand_f32((size_t)(n * in), 1), *b = rand_f32((size_t)out, 1);
      void *w16 = rand_w((size_t)(out * in), dt, 0.5f, &wf);
      ds_weight w = {w16, dt};
      size_t ny = (size_t)(n * ldy);
      float *want = malloc(ny * sizeof(float)), *got = malloc(ny * sizeof(float));
      for (int with_bias = 0; with_bias < 2; with_bias++) {
        const float *bias = with_bias ? b : NULL;
        for (size_t k = 0; k < ny; k++) want[k] = got[k] = 7.0f; /* the gap columns stay untouched */
        ref->linear_w(want, ldy, x, w, bias, n, in, out);
        for (int isa = DS_ISA_PORTABLE; isa <= (int)ds_isa_best(); isa++) {
          memcpy(got, want, ny * sizeof(float));
          for (int64_t i = 0; i < n; i++)
            for (int64_t o = 0; o < out; o++) got[i * ldy + o] = NAN;
          ds_linear16_direct((ds_isa)isa, got, ldy, x, w, bias, n, in, out);
          double err = test_rel_err(got, want, ny);
          if (!(err < 2e-6))
            fprintf(stderr, "direct %s %s n=%lld in=%lld out=%lld bias=%d: rel err %.2e\n", ds_isa_name((ds_isa)isa),
                    ds_dtype_name(dt), (long long)n, (long long)in, (long long)out, with_bias, err);
          EXPECT(err < 2e-6);
          int64_t chunks[3] = {5, 16, out};
          for (int c = 0; c < 3 && dt != DS_F32; c++) { /* nothing to convert in an F32 weight */
            for (int64_t i = 0; i < n; i++)
              for (int64_t o = 0; o < out; o++) got[i * ldy + o] = NAN;
            EXPECT(ds_linear16_chunked((ds_isa)isa, got, ldy, x, w, bias, n, in, out, chunks[c]));
            err = test_rel_err(got, want, ny);
            if (!(err < 2e-6))
              fprintf(stderr, "chunked(%lld) %s %s n=%lld in=%lld out=%lld: rel err %.2e\n", (long long)chunks[c],
                      ds_isa_name((ds_isa)isa), ds_dtype_name(dt), (long long)n, (long long)in,
                      (long long)out, err);
            EXPECT(err < 2e-6);
          }
        }
        /* The backend entry (whichever path it picks). */
        for (int64_t i = 0; i < n; i++)
          for (int64_t o = 0; o < out; o++) got[i * ldy + o] = NAN;
        ds_backend_cpu()->linear_w(got, ldy, x, w, bias, n, in, out);
        EXPECT(test_rel_err(got, want, ny) < 2e-6);
      }
      free(x); free(b); free(wf); free(w16); free(want); free(got);
    }
}

/* A row of x gets the same numbers, bit for bit, alone (decode) as among others (verification
 * of a draft): the direct path's sums for a row do not depend on the other rows of the call,
 * which keeps speculation on 16-bit and fp32 weights lossless; the backend's F32 entry at
 * decode's rows is the direct path. */
static void test_rows_independent(void) {
  int64_t n = 9, in = 200, out = 37;
  for (int t = 0; t < 3; t++) {
    ds_dtype dt = k_direct_dtypes[t];
    float *wf, *x = rand_f32((size_t)(n * in), 1);
    void *w16 = rand_w((size_t)(out * in), dt, 0.5f, &wf);
    ds_weight w = {w16, dt};
    float *all = malloc((size_t)(n * out) * sizeof(float)), *one = malloc((size_t)out * sizeof(float));
    for (int isa = DS_ISA_PORTABLE; isa <= (int)ds_isa_best(); isa++) {
      ds_linear16_direct((ds_isa)isa, all, out, x, w, NULL, n, in, out);
      int same = 1;
      for (int64_t i = 0; i < n; i++) {
        ds_linear16_direct((ds_isa)isa, one, out, x + i * in, w, NULL, 1, in, out);
        same &= memcmp(one, all + i * out, (size_t)out * sizeof(float)) == 0;
      }
      if (!same) fprintf(stderr, "%s %s: rows depend on their call\n", ds_isa_name((ds_isa)isa), ds_dtype_name(dt));
      EXPECT(same);
    }
    if (dt == DS_F32) { /* linear_w and linear_w_cat on up to DS_F32_DIRECT_MAX_ROWS rows: the direct path */
      int64_t m = DS_F32_DIRECT_MAX_ROWS, o1 = 20, outs[2] = {o1, out - o1};
      ds_weight segs[2] = {w, {(float *)w16 + o1 * in, DS_F32}};
      ds_linear16_direct(ds_isa_best(), all, out, x, w, NULL, m, in, out);
      float *got = malloc((size_t)(m * out) * sizeof(float));
      ds_backend_cpu()->linear_w(got, out, x, w, NULL, m, in, out);
      EXPECT(memcmp(got, all, (size_t)(m * out) * sizeof(float)) == 0);
      ds_backend_cpu()->linear_w_cat(got, out, x, segs, outs, 2, NULL, m, in);
      EXPECT(memcmp(got, all, (size_t)(m * out) * sizeof(float)) == 0);
      free(got);
    }
    free(x), free(wf), free(w16), free(all), free(one);
  }
}

/* The exactness contract: the chunked path is the fp32 GEMM on the converted weights (bit for
 * bit when one chunk covers the weight), and an F32 weight is the fp32 linear itself. */
static void test_exactness(void) {
  int64_t n = 300, in = 1024, out = 40; /* x over 1 MiB: the backend takes the chunked path */
  for (int t = 0; t < 2; t++) {
    float *wf, *x = rand_f32((size_t)(n * in), 1), *b = rand_f32((size_t)out, 1);
    uint16_t *w16 = rand_w16((size_t)(out * in), k_dtypes[t], 1.0f, &wf);
    size_t ny = (size_t)(n * out);
    float *a = malloc(ny * sizeof(float)), *g = malloc(ny * sizeof(float));
    ds_backend_cpu()->linear(a, x, wf, b, n, in, out);
    for (int isa = DS_ISA_PORTABLE; isa <= (int)ds_isa_best(); isa++) {
      EXPECT(ds_linear16_chunked((ds_isa)isa, g, out, x, (ds_weight){w16, k_dtypes[t]}, b, n, in, out, out));
      EXPECT(memcmp(a, g, ny * sizeof(float)) == 0);
    }
    /* Through the backend (the chunked path, its default chunk: here one): the same bits. */
    ds_backend_cpu()->linear_w(g, out, x, (ds_weight){w16, k_dtypes[t]}, b, n, in, out);
    EXPECT(memcmp(a, g, ny * sizeof(float)) == 0);
    /* F32: linear_w is linear. */
    ds_backend_cpu()->linear_w(g, out, x, (ds_weight){wf, DS_F32}, b, n, in, out);
    EXPECT(memcmp(a, g, ny * sizeof(float)) == 0);
    /* Its backward too: dx += dy @ w, the same bits as linear_backward's dx. */
    float *dy = rand_f32(ny, 1), *dx1 = calloc((size_t)(n * in), sizeof(float)), *dx2 = calloc((size_t)(n * in), sizeof(float));
    ds_backend_cpu()->linear_backward(dx1, NULL, NULL, dy, x, wf, n, in, out);
    ds_backend_cpu()->linear_w_backward(dx2, dy, (ds_weight){wf, DS_F32}, n, in, out);
    EXPECT(memcmp(dx1, dx2, (size_t)(n * in) * sizeof(float)) == 0);
    free(x); free(b); free(wf); free(w16); free(a); free(g); free(dy); free(dx1); free(dx2);
  }
}

static void test_backward_paths(void) {
  const ds_backend *ref = ds_backend_reference();
  for (int s = 0; s < N_SHAPES; s++)
    for (int t = 0; t < 2; t++) {
      int64_t n = k_shapes[s].n, in = k_shapes[s].in, out = k_shapes[s].out;
      float *wf, *dy = rand_f32((size_t)(n * out), 1), *init = rand_f32((size_t)(n * in), 1);
      uint16_t *w16 = rand_w16((size_t)(out * in), k_dtypes[t], 0.5f, &wf);
      ds_weight w = {w16, k_dtypes[t]};
      size_t nx = (size_t)(n * in);
      float *want = malloc(nx * sizeof(float)), *got = malloc(nx * sizeof(float));
      memcpy(want, init, nx * sizeof(float)); /* ADDS into dx */
      ref->linear_w_backward(want, dy, w, n, in, out);
      memcpy(got, init, nx * sizeof(float));
      ds_linear16_backward_direct(got, dy, w, n, in, out);
      EXPECT(test_rel_err(got, want, nx) < 2e-6);
      for (int isa = DS_ISA_PORTABLE; isa <= (int)ds_isa_best(); isa++) {
        int64_t chunks[3] = {5, 16, out};
        for (int c = 0; c < 3; c++) {
          memcpy(got, init, nx * sizeof(float));
          EXPECT(ds_linear16_backward_chunked((ds_isa)isa, got, dy, w, n, in, out, chunks[c]));
          double err = test_rel_err(got, want, nx);
          if (!(err < 2e-6))
            fprintf(stderr, "bwd chunked(%lld) %s n=%lld in=%lld out=%lld: rel err %.2e\n", (long long)chunks[c],
                    ds_isa_name((ds_isa)isa), (long long)n, (long long)in, (long long)out, err);
          EXPECT(err < 2e-6);
        }
      }
      memcpy(got, init, nx * sizeof(float));
      ds_backend_cpu()->linear_w_backward(got, dy, w, n, in, out);
      EXPECT(test_rel_err(got, want, nx) < 2e-6);
      free(dy); free(init); free(wf); free(w16); free(want); free(got);
    }
}

/* L(x) = sum dy * linear_w(x): dL/dx by central differences in double against the backward
 * kernel (one path per regime). */
static void test_backward_finite_differences(void) {
  int64_t in = 24, out = 31;
  for (int t = 0; t < 2; t++)
    for (int64_t n = 1; n <= 12; n += 11) {
      float *wf, *x = rand_f32((size_t)(n * in), 1), *dy = rand_f32((size_t)(n * out), 1);
      uint16_t *w16 = rand_w16((size_t)(out * in), k_dtypes[t], 1.0f, &wf);
      ds_weight w = {w16, k_dtypes[t]};
      float *dx = calloc((size_t)(n * in), sizeof(float)), *y = malloc((size_t)(n * out) * sizeof(float));
      ds_backend_cpu()->linear_w_backward(dx, dy, w, n, in, out);
      double max_err = 0, max_ref = 0;
      for (int64_t k = 0; k < n * in; k++) {
        float keep = x[k];
        double h = 1e-2, L[2];
        for (int side = 0; side < 2; side++) {
          x[k] = keep + (float)(side ? -h : h);
          ds_backend_reference()->linear_w(y, out, x, w, NULL, n, in, out);
          double s = 0;
          for (int64_t j = 0; j < n * out; j++) s += (double)dy[j] * y[j];
          L[side] = s;
        }
        x[k] = keep;
        double fd = (L[0] - L[1]) / (2 * h);
        max_err = fmax(max_err, fabs(fd - dx[k]));
        max_ref = fmax(max_ref, fabs(fd));
      }
      EXPECT(max_err / max_ref < 1e-4);
      free(x); free(dy); free(wf); free(w16); free(dx); free(y);
    }
}

/* Equal bits, or both NaN: the F16C / AVX-512 conversion quiets a signaling NaN (the core's
 * scalar one keeps the payload as it is); weights are checked finite at load anyway. */
static int same_values(const float *a, const float *b, int n) {
  for (int i = 0; i < n; i++)
    if (memcmp(a + i, b + i, sizeof(float)) != 0 && !(isnan(a[i]) && isnan(b[i]))) return 0;
  return 1;
}

/* Every 16-bit pattern through the lookup and the conversions of every instruction set: the
 * same fp32 bits as the core's scalar conversion (subnormals exact, NaN stays NaN). */
static void test_conversion_all_patterns(void) {
  enum { N = 65536, D = 256 };
  uint16_t *table = malloc(N * sizeof(uint16_t));
  float *want = malloc(N * sizeof(float)), *got = malloc(N * sizeof(float));
  int32_t ids[N / D];
  for (int i = 0; i < N / D; i++) ids[i] = N / D - 1 - i; /* rows out of order */
  for (int i = 0; i < N; i++) table[i] = (uint16_t)i;
  for (int t = 0; t < 2; t++) {
    for (int i = 0; i < N; i++) want[i] = k_dtypes[t] == DS_BF16 ? ds_bf16_to_f32((uint16_t)i) : ds_f16_to_f32((uint16_t)i);
    for (int isa = DS_ISA_PORTABLE; isa <= (int)ds_isa_best(); isa++) {
      memset(got, 0, N * sizeof(float));
      ds_convert16((ds_isa)isa, got, table, N, k_dtypes[t]);
      EXPECT(same_values(got, want, N));
      if (isa == DS_ISA_PORTABLE) EXPECT(memcmp(got, want, N * sizeof(float)) == 0); /* payloads too */
    }
    memset(got, 0, N * sizeof(float));
    ds_backend_cpu()->embedding_w(got, ids, (ds_weight){table, k_dtypes[t]}, N / D, D);
    int same = 1;
    for (int r = 0; r < N / D; r++) same &= same_values(got + r * D, want + ids[r] * D, D);
    EXPECT(same);
    ds_backend_reference()->embedding_w(got, ids, (ds_weight){table, k_dtypes[t]}, N / D, D);
    same = 1;
    for (int r = 0; r < N / D; r++) same &= same_values(got + r * D, want + ids[r] * D, D); /* via double */
    EXPECT(same);
  }
  /* F32 tables are copied as they are. */
  int32_t two[2] = {3, 1};
  float tab[4 * 5], y[2 * 5];
  for (int i = 0; i < 20; i++) tab[i] = (float)i - 0.5f;
  ds_backend_cpu()->embedding_w(y, two, (ds_weight){tab, DS_F32}, 2, 5);
  EXPECT(memcmp(y, tab + 15, 5 * sizeof(float)) == 0 && memcmp(y + 5, tab + 5, 5 * sizeof(float)) == 0);
  free(table); free(want); free(got);
}

static void test_chunk_rows(void) {
  EXPECT(ds_linear16_chunk_rows(2048, 151936) == 2048);
  EXPECT(ds_linear16_chunk_rows(6144, 2048) == 672);
  EXPECT(ds_linear16_chunk_rows(1 << 20, 100) == 16);
  EXPECT(ds_linear16_chunk_rows(64, 10) == 10);
  fprintf(stderr, "16-bit weight kernels on this CPU: %s\n", ds_weight16_kernel_name());
}

int main(void) {
  ds_rng_seed(&g_rng, 99);
  TEST_RUN(test_forward_paths);
  TEST_RUN(test_exactness);
  TEST_RUN(test_rows_independent);
  TEST_RUN(test_backward_paths);
  TEST_RUN(test_backward_finite_differences);
  TEST_RUN(test_conversion_all_patterns);
  TEST_RUN(test_chunk_rows);
  return TEST_RESULT();
}
