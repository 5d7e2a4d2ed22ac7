/* The kernels on frozen block-quantized weights (nn/cpu_quant.h; the backend's linear_w,
 * linear_w_cat, linear_w_backward and embedding_w on Q8_0, Q4_0, Q4_1, Q4_K, Q6_K) against the
 * naive reference (the core's dequantizers, tested to the bit against gguf.quants, then an fp32
 * matmul accumulated in double), for every type, every instruction set this CPU has, n = 1, 3,
 * 17, 64 rows, and output sizes that are not multiples of the kernels' tile of 16 rows.
 *
 * Tolerances, per output value y[i, o] (w the dequantized weight, x the fp32 activations):
 *   direct path (x rounded to int8 per block of 32 with step d_b = max|x_b| / 127, so each
 *   |x - x_rounded| <= d_b / 2): |y - ref| <= sum over blocks b of d_b / 2 * sum_b |w|, times
 *   1 + 1e-5 (the rounding of 1 / d_b), plus fp32 accumulation, bounded by in * 2^-23 * sum |w x|
 *   (and the same for the rounded x);
 *   chunked path (dequantized weights, x in fp32, the fp32 GEMM): the reference up to fp32
 *   summation order, |y - ref| <= in * 2^-23 * sum |w x|;
 *   embedding: the dequantized rows, bit for bit. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/backend.h"
#include "dspark/dtype.h"
#include "dspark/ggml_quant.h"
#include "dspark/rng.h"
#include "nn/cpu_quant.h"
#include "test_util.h"

static ds_rng g_rng;

static float urand(void) { return 2.0f * ds_rng_uniform_f32(&g_rng) - 1.0f; }

static void put_f16(unsigned char *p, float v) {
  uint16_t h = ds_f32_to_f16(v);
  p[0] = (unsigned char)h, p[1] = (unsigned char)(h >> 8);
}

static const ds_dtype k_types[] = {DS_Q8_0, DS_Q4_0, DS_Q4_1, DS_Q4_K, DS_Q6_K, DS_Q5_0, DS_Q5_1};
enum { N_TYPES = sizeof k_types / sizeof k_types[0] };

/* A random weight [rows, cols] in dt: random quant bytes (every bit pattern of the nibbles,
 * 6-bit and 2-bit fields, scales and mins), finite random f16 scales. Q8_0's -128 is kept out
 * (llama.cpp's quantizer never writes it; the AVX2 sign trick relies on it). */
static unsigned char *rand_weight(ds_dtype dt, int64_t rows, int64_t cols) {
  size_t rb = ds_quant_row_bytes(dt, cols), nbytes = rb * (size_t)rows;
  unsigned char *w = malloc(nbytes);
  for (size_t i = 0; i < nbytes; i++) w[i] = (unsigned char)(ds_rng_next_u64(&g_rng) >> 56);
  int64_t blk = ds_quant_block(dt), nb = rows * cols / blk;
  for (int64_t b = 0; b < nb; b++) {
    switch (dt) {
      case DS_Q8_0: {
        unsigned char *p = w + b * 34;
        put_f16(p, 0.01f * urand());
        for (int l = 0; l < 32; l++)
          if (p[2 + l] == 0x80) p[2 + l] = 0x81;
        break;
      }
      case DS_Q4_0: put_f16(w + b * 18, 0.02f * urand()); break;
      case DS_Q4_1:
        put_f16(w + b * 20, 0.02f * urand());
        put_f16(w + b * 20 + 2, 0.1f * urand());
        break;
      case DS_Q4_K:
        put_f16(w + b * 144, 0.002f * urand());
        put_f16(w + b * 144 + 2, 0.002f * urand());
        break;
      case DS_Q6_K: put_f16(w + b * 210 + 208, 0.001f * urand()); break;
      case DS_Q5_0: put_f16(w + b * 22, 0.01f * urand()); break;
      case DS_Q5_1:
        put_f16(w + b * 24, 0.01f * urand());
        put_f16(w + b * 24 + 2, 0.1f * urand());
        break;
      default: break;
    }
  }
  return w;
}

static float *dequantized(ds_dtype dt, const unsigned char *w, int64_t rows, int64_t cols) {
  float *f = malloc((size_t)(rows * cols) * sizeof *f);
  size_t rb = ds_quant_row_bytes(dt, cols);
  for (int64_t r = 0; r < rows; r++)
    ds_ggml_dequantize_row((uint32_t)ds_dtype_ggml_type(dt), w + (size_t)r * rb, f + r * cols, cols);
  return f;
}

/* x with a spread of magnitudes (some blocks 100x others), so the per-block steps differ */
static float *rand_x(int64_t n, int64_t in) {
  float *x = malloc((size_t)(n * in) * sizeof *x);
  for (int64_t i = 0; i < n * in; i++) x[i] = urand() * ((i / 32) % 3 == 0 ? 0.01f : 1.0f);
  return x;
}

/* The bounds of the header for y[i, o]: *direct (activations rounded per block) and *chunked. */
static void bounds(const float *wf, const float *x, int64_t i, int64_t o, int64_t in, double *direct,
                   double *chunked) {
  double rounding = 0, mag = 0;
  for (int64_t b = 0; b < in / 32; b++) {
    double amax = 0, sw = 0;
    for (int l = 0; l < 32; l++) {
      amax = fmax(amax, fabs(x[i * in + 32 * b + l]));
      sw += fabs(wf[o * in + 32 * b + l]);
      mag += fabs((double)wf[o * in + 32 * b + l] * x[i * in + 32 * b + l]);
    }
    rounding += amax / 127.0 / 2.0 * sw;
  }
  double acc = (double)in * 0x1p-23 * (mag + rounding) + 1e-30;
  *direct = rounding * (1 + 1e-5) + acc;
  *chunked = (double)in * 0x1p-23 * mag + 1e-30;
}

typedef struct {
  int64_t in, out;
} shape2;

static int check_against(const char *what, ds_dtype dt, const float *got, int64_t ldy, const float *want,
                         const float *wf, const float *x, int64_t n, int64_t in, int64_t out, int direct) {
  int bad = 0;
  double worst = 0;
  for (int64_t i = 0; i < n; i++)
    for (int64_t o = 0; o < out; o++) {
      double bd, bc, e = fabs((double)got[i * ldy + o] - want[i * out + o]);
      bounds(wf, x, i, o, in, &bd, &bc);
      double b = direct ? bd : bc;
      worst = fmax(worst, e / b);
      if (!(e <= b)) bad++;
    }
  if (bad)
    fprintf(stderr, "%s %s n=%lld in=%lld out=%lld: %d values outside the bound (worst %.2f of it)\n", what,
            ds_dtype_name(dt), (long long)n, (long long)in, (long long)out, bad, worst);
  return bad == 0;
}

static void ref_linear(float *y, const unsigned char *w, ds_dtype dt, const float *x, const float *bias, int64_t n,
                       int64_t in, int64_t out) {
  ds_backend_reference()->linear_w(y, out, x, (ds_weight){w, dt}, bias, n, in, out);
}

static const int64_t k_rows[] = {1, 3, 17, 64};

static void test_paths(void) {
  for (int t = 0; t < N_TYPES; t++) {
    ds_dtype dt = k_types[t];
    int k = ds_quant_block(dt) == 256;
    shape2 shapes[2] = {{k ? 256 : 96, 37}, {k ? 512 : 544, 70}};
    for (int s = 0; s < 2; s++) {
      int64_t in = shapes[s].in, out = shapes[s].out, ldy = out + 3;
      unsigned char *w = rand_weight(dt, out, in);
      float *wf = dequantized(dt, w, out, in);
      float *bias = rand_x(1, out);
      for (int r = 0; r < 4; r++) {
        int64_t n = k_rows[r];
        float *x = rand_x(n, in), *want = malloc((size_t)(n * out) * sizeof(float));
        float *got = malloc((size_t)(n * ldy) * sizeof(float));
        ref_linear(want, w, dt, x, NULL, n, in, out);
        ds_weight qw = {w, dt};
        for (int isa = DS_QISA_PORTABLE; isa <= (int)ds_qisa_best(); isa++) {
          /* the packed kernel runs where it can (AVX2 and above): its copy must exist */
          if (isa == DS_QISA_AVX2_PACKED || isa == DS_QISA_VNNI)
            EXPECT((ds_quant_packed(qw, out, in) != NULL) == ds_quant_packable(dt));
          for (int64_t q = 0; q < n * ldy; q++) got[q] = 7.0f;
          EXPECT(ds_quant_direct_cat((ds_qisa)isa, got, ldy, x, &qw, &out, 1, NULL, n, in));
          EXPECT(check_against(ds_qisa_name((ds_qisa)isa), dt, got, ldy, want, wf, x, n, in, out, 1));
          for (int64_t i = 0; i < n; i++)
            for (int64_t c = out; c < ldy; c++) EXPECT(got[i * ldy + c] == 7.0f); /* the gap untouched */
        }
        int64_t chunks[3] = {5, 16, out};
        for (int c = 0; c < 3; c++) {
          EXPECT(ds_quant_chunked(got, ldy, x, qw, NULL, n, in, out, chunks[c]));
          EXPECT(check_against("chunked", dt, got, ldy, want, wf, x, n, in, out, 0));
        }
        /* the backend entry, with a bias: by default the direct regime at every n; under an
         * explicit fp32 compute either regime by n */
        ref_linear(want, w, dt, x, bias, n, in, out);
        ds_backend_cpu()->linear_w(got, ldy, x, qw, bias, n, in, out);
        EXPECT(check_against("linear_w", dt, got, ldy, want, wf, x, n, in, out, 1));
        ds_set_matmul_compute(DS_COMPUTE_F32);
        ds_backend_cpu()->linear_w(got, ldy, x, qw, bias, n, in, out);
        EXPECT(check_against("linear_w fp32", dt, got, ldy, want, wf, x, n, in, out, n <= DS_QUANT_DIRECT_MAX_ROWS));
        ds_unset_matmul_compute();
        free(x), free(want), free(got);
      }
      ds_release_packed_weights(); /* before w's address can come back with other values */
      free(w), free(wf), free(bias);
    }
  }
}

/* A row's result does not depend on the other rows of its call (direct path: x quantized per row,
 * each row's dots accumulated on their own), bit for bit: decode (1 row a call) and verification
 * (several) give the same numbers, which keeps speculation lossless on quantized weights. */
static void test_rows_independent(void) {
  for (int t = 0; t < N_TYPES; t++) {
    ds_dtype dt = k_types[t];
    int64_t in = ds_quant_block(dt) == 256 ? 512 : 160, out = 37, n = 11; /* 11: VNNI's two-group pass and its tail */
    unsigned char *w = rand_weight(dt, out, in);
    ds_weight qw = {w, dt};
    float *x = rand_x(n, in), *all = malloc((size_t)(n * out) * sizeof(float)), one[37];
    for (int isa = DS_QISA_PORTABLE; isa <= (int)ds_qisa_best(); isa++) {
      EXPECT(ds_quant_direct_cat((ds_qisa)isa, all, out, x, &qw, &out, 1, NULL, n, in));
      int same = 1;
      for (int64_t i = 0; i < n; i++) {
        EXPECT(ds_quant_direct_cat((ds_qisa)isa, one, out, x + i * in, &qw, &out, 1, NULL, 1, in));
        same &= !memcmp(one, all + i * out, sizeof one);
      }
      if (!same) fprintf(stderr, "%s %s: rows depend on their call\n", ds_qisa_name((ds_qisa)isa), ds_dtype_name(dt));
      EXPECT(same);
    }
    ds_release_packed_weights();
    free(w), free(x), free(all);
  }
}

/* The largest integer sums a block can give: every quant at its maximum against x at +127
 * (int16 partial sums that would overflow, as Q5's 31 * 127 pairs do in AVX2's maddubs sums,
 * show here; random blocks rarely reach them). Every type and instruction set. */
static void test_extreme_blocks(void) {
  for (int t = 0; t < N_TYPES; t++) {
    ds_dtype dt = k_types[t];
    int64_t in = ds_quant_block(dt) == 256 ? 512 : 128, out = 24, n = 3;
    size_t bb = ds_quant_row_bytes(dt, ds_quant_block(dt));
    unsigned char *w = rand_weight(dt, out, in);
    /* the quant bytes of a block (the scales left finite): [q0, q1) */
    size_t q0 = dt == DS_Q4_1 || dt == DS_Q5_1 ? 4 : dt == DS_Q4_K ? 16 : dt == DS_Q6_K ? 0 : 2;
    size_t q1 = dt == DS_Q6_K ? 192 : bb;
    for (size_t b = 0; b < (size_t)(out * in / ds_quant_block(dt)); b++)
      memset(w + b * bb + q0, dt == DS_Q8_0 ? 0x7F : 0xFF, q1 - q0);
    float *x = malloc((size_t)(n * in) * sizeof(float)), *want = malloc((size_t)(n * out) * sizeof(float));
    float *got = malloc((size_t)(n * out) * sizeof(float)), *wf = dequantized(dt, w, out, in);
    for (int64_t i = 0; i < n * in; i++) x[i] = 1.0f;
    ref_linear(want, w, dt, x, NULL, n, in, out);
    ds_weight qw = {w, dt};
    for (int isa = DS_QISA_PORTABLE; isa <= (int)ds_qisa_best(); isa++) {
      EXPECT(ds_quant_direct_cat((ds_qisa)isa, got, out, x, &qw, &out, 1, NULL, n, in));
      EXPECT(check_against(ds_qisa_name((ds_qisa)isa), dt, got, out, want, wf, x, n, in, out, 1));
    }
    ds_release_packed_weights();
    free(w), free(x), free(want), free(got), free(wf);
  }
}

/* A quantized matrix with a non-finite scale is found by its row (the loader refuses it, naming
 * the row): each type's d, and the second half (m, dmin) of the types that carry one. */
static void test_nonfinite_scales(void) {
  for (int t = 0; t < N_TYPES; t++) {
    ds_dtype dt = k_types[t];
    int64_t in = ds_quant_block(dt) == 256 ? 512 : 96, rows = 7;
    size_t rb = ds_quant_row_bytes(dt, in), bb = ds_quant_row_bytes(dt, ds_quant_block(dt));
    size_t at = dt == DS_Q6_K ? 208 : 0;
    int two = dt == DS_Q4_1 || dt == DS_Q5_1 || dt == DS_Q4_K;
    for (int which = 0; which <= two; which++) {
      unsigned char *w = rand_weight(dt, rows, in);
      EXPECT(ds_quant_first_nonfinite_row(dt, w, rows, in) == -1);
      unsigned char *p = w + 5 * rb + bb + at + 2 * (size_t)which; /* row 5's second block */
      p[0] = 0x00, p[1] = 0x7e;                                  /* an f16 NaN */
      int64_t got = ds_quant_first_nonfinite_row(dt, w, rows, in);
      if (got != 5) fprintf(stderr, "%s, half %d: row %lld\n", ds_dtype_name(dt), which, (long long)got);
      EXPECT(got == 5);
      free(w);
    }
  }
}

/* The packed kernel's two instruction sets form the same integer sums of every block and scale
 * them in the same order: VNNI gives AVX2's numbers bit for bit on the packed rows (1 to 9 rows of
 * x: one and several passes of 4). */
static void test_packed_isas_equal(void) {
  if (ds_qisa_best() < DS_QISA_VNNI) {
    fprintf(stderr, "test_packed_isas_equal: no AVX-512 VNNI here, skipped\n");
    return;
  }
  for (int t = 0; t < N_TYPES; t++) {
    ds_dtype dt = k_types[t];
    if (!ds_quant_packable(dt)) continue;
    int64_t in = ds_quant_block(dt) == 256 ? 512 : 320, out = 45;
    unsigned char *w = rand_weight(dt, out, in);
    ds_weight qw = {w, dt};
    for (int64_t n = 1; n <= 9; n++) {
      float *x = rand_x(n, in), *a = malloc((size_t)(n * out) * sizeof(float));
      float *v = malloc((size_t)(n * out) * sizeof(float));
      EXPECT(ds_quant_direct_cat(DS_QISA_AVX2_PACKED, a, out, x, &qw, &out, 1, NULL, n, in));
      EXPECT(ds_quant_direct_cat(DS_QISA_VNNI, v, out, x, &qw, &out, 1, NULL, n, in));
      int same = 1; /* the packed rows; the last 5 take each set's own row kernel */
      for (int64_t i = 0; i < n; i++) same &= !memcmp(a + i * out, v + i * out, 40 * sizeof(float));
      if (!same) fprintf(stderr, "%s, %d rows of x: VNNI differs from AVX2\n", ds_dtype_name(dt), (int)n);
      EXPECT(same);
      free(x), free(a), free(v);
    }
    ds_release_packed_weights();
    free(w);
  }
}

/* The packed kernels' prefetch distance is a hint: every distance gives the numbers of none, bit
 * for bit (1 to 9 rows of x: the pair pass and the passes of 4 and their tails), including
 * prefetches that run past the copy's end (a distance of 1 MiB). */
static void test_packed_prefetch_same(void) {
#if defined(__x86_64__) || defined(__i386__)
  if (ds_qisa_best() < DS_QISA_AVX2_PACKED) {
    fprintf(stderr, "test_packed_prefetch_same: no AVX2 here, skipped\n");
    return;
  }
  const size_t dist[] = {64, 8192, (size_t)1 << 20};
  for (int t = 0; t < N_TYPES; t++) {
    ds_dtype dt = k_types[t];
    if (!ds_quant_packable(dt)) continue;
    int64_t in = ds_quant_block(dt) == 256 ? 512 : 320, out = 24;
    unsigned char *w = rand_weight(dt, out, in);
    const unsigned char *packed = ds_quant_packed((ds_weight){w, dt}, out, in);
    EXPECT(packed != NULL);
    for (int64_t n = 1; n <= 9 && packed; n++) {
      float *x = rand_x(n, in), *a = malloc((size_t)(n * out) * sizeof(float));
      float *v = malloc((size_t)(n * out) * sizeof(float));
      ds_qx qx;
      EXPECT(ds_qx_alloc(&qx, n, in));
      ds_qx_quantize(&qx, x, n, in);
      for (int isa = DS_QISA_AVX2_PACKED; isa <= (int)ds_qisa_best(); isa++) {
        void (*rows)(float *, int64_t, const ds_qx *, int64_t, const unsigned char *, ds_dtype, int64_t, int64_t,
                     int64_t, const float *, size_t) =
            isa == DS_QISA_VNNI ? ds_quant_packed_rows_vnni : ds_quant_packed_rows_avx2;
        rows(a, out, &qx, n, packed, dt, in, 0, out, NULL, 0);
        for (size_t d = 0; d < sizeof dist / sizeof *dist; d++) {
          rows(v, out, &qx, n, packed, dt, in, 0, out, NULL, dist[d]);
          int same = !memcmp(a, v, (size_t)(n * out) * sizeof(float));
          if (!same)
            fprintf(stderr, "%s, %s, %d rows of x, prefetch %zu: differs from none\n", ds_dtype_name(dt),
                    ds_qisa_name((ds_qisa)isa), (int)n, dist[d]);
          EXPECT(same);
        }
      }
      ds_qx_free(&qx);
      free(x), free(a), free(v);
    }
    ds_release_packed_weights();
    free(w);
  }
#endif
}

/* linear_w_cat over three segments of different types and sizes (a fused q | k | v). */
static void test_cat(void) {
  int64_t in = 256, out[4] = {40, 19, 19, 26}, total = 104, ldy = total + 2;
  ds_dtype dts[4] = {DS_Q4_K, DS_Q6_K, DS_Q8_0, DS_Q4_1}; /* packed ones at unaligned columns */
  unsigned char *w[4];
  ds_weight ws[4];
  for (int s = 0; s < 4; s++) w[s] = rand_weight(dts[s], out[s], in), ws[s] = (ds_weight){w[s], dts[s]};
  for (int r = 0; r < 4; r++) {
    int64_t n = k_rows[r];
    float *x = rand_x(n, in), *bias = rand_x(1, total);
    float *got = malloc((size_t)(n * ldy) * sizeof(float)), *want = malloc((size_t)(n * ldy) * sizeof(float));
    ds_backend_reference()->linear_w_cat(want, ldy, x, ws, out, 4, bias, n, in);
    for (int explicit_f32 = 0; explicit_f32 < 2; explicit_f32++) { /* the default: the direct path at any n */
      if (explicit_f32) ds_set_matmul_compute(DS_COMPUTE_F32);
      ds_backend_cpu()->linear_w_cat(got, ldy, x, ws, out, 4, bias, n, in);
      int64_t col = 0;
      for (int s = 0; s < 4; s++) {
        float *wf = dequantized(dts[s], w[s], out[s], in), *ws_want = malloc((size_t)(n * out[s]) * sizeof(float));
        for (int64_t i = 0; i < n; i++)
          memcpy(ws_want + i * out[s], want + i * ldy + col, (size_t)out[s] * sizeof(float));
        EXPECT(check_against("linear_w_cat", dts[s], got + col, ldy, ws_want, wf, x, n, in, out[s],
                             !explicit_f32 || n <= DS_QUANT_DIRECT_MAX_ROWS));
        col += out[s];
        free(wf), free(ws_want);
      }
      ds_unset_matmul_compute();
    }
    free(x), free(bias), free(got), free(want);
  }
  ds_release_packed_weights();
  for (int s = 0; s < 4; s++) free(w[s]);
}

/* The embedding gives the dequantized rows exactly; the backward (dx += dy @ w) is the
 * reference's up to summation order. */
static void test_embedding_backward(void) {
  for (int t = 0; t < N_TYPES; t++) {
    ds_dtype dt = k_types[t];
    int64_t d = ds_quant_block(dt) == 256 ? 512 : 96, V = 29, n = 17;
    unsigned char *w = rand_weight(dt, V, d);
    float *wf = dequantized(dt, w, V, d);
    int32_t ids[17];
    for (int i = 0; i < 17; i++) ids[i] = (int32_t)((i * 7 + 3) % V);
    float *got = malloc((size_t)(n * d) * sizeof(float));
    ds_backend_cpu()->embedding_w(got, ids, (ds_weight){w, dt}, n, d);
    int same = 1;
    for (int64_t i = 0; i < n; i++) same &= !memcmp(got + i * d, wf + ids[i] * d, (size_t)d * sizeof(float));
    EXPECT(same);
    float *dy = rand_x(n, V), *dx = malloc((size_t)(n * d) * sizeof(float)), *dx_ref = malloc((size_t)(n * d) * sizeof(float));
    for (int64_t q = 0; q < n * d; q++) dx[q] = dx_ref[q] = 0.5f;
    ds_backend_cpu()->linear_w_backward(dx, dy, (ds_weight){w, dt}, n, d, V);
    ds_backend_reference()->linear_w_backward(dx_ref, dy, (ds_weight){w, dt}, n, d, V);
    double worst = 0;
    for (int64_t i = 0; i < n; i++)
      for (int64_t p = 0; p < d; p++) {
        double mag = 0.5;
        for (int64_t o = 0; o < V; o++) mag += fabs((double)dy[i * V + o] * wf[o * d + p]);
        worst = fmax(worst, fabs((double)dx[i * d + p] - dx_ref[i * d + p]) / ((double)(V + 1) * 0x1p-23 * mag));
      }
    if (!(worst <= 1)) fprintf(stderr, "backward %s: %.2f of the bound\n", ds_dtype_name(dt), worst);
    EXPECT(worst <= 1);
    ds_release_packed_weights();
    free(w), free(wf), free(got), free(dy), free(dx), free(dx_ref);
  }
}

/* Under DS_COMPUTE_BF16, many rows (the chunked path) multiply the dequantized weights and x
 * both rounded to bf16, in fp32: the reference on the rounded inputs up to fp32 summation order,
 * for the forward and the backward's dx. The bf16 rounding error (2^-9 relative) is far outside
 * that bound, so an fp32 product fails it. */
static float bf16r(float v) { return ds_bf16_to_f32(ds_f32_to_bf16(v)); }

static void test_compute_bf16(void) {
  ds_set_matmul_compute(DS_COMPUTE_BF16);
  for (int t = 0; t < N_TYPES; t++) {
    ds_dtype dt = k_types[t];
    int64_t in = ds_quant_block(dt) == 256 ? 512 : 544, out = 70, n = 64;
    unsigned char *w = rand_weight(dt, out, in);
    float *wf = dequantized(dt, w, out, in), *x = rand_x(n, in), *dy = rand_x(n, out);
    float *y = malloc((size_t)(n * out) * sizeof(float)), *dx = malloc((size_t)(n * in) * sizeof(float));
    for (int64_t q = 0; q < out * in; q++) wf[q] = bf16r(wf[q]);
    ds_backend_cpu()->linear_w(y, out, x, (ds_weight){w, dt}, NULL, n, in, out);
    for (int64_t q = 0; q < n * in; q++) dx[q] = 0.0f;
    ds_backend_cpu()->linear_w_backward(dx, dy, (ds_weight){w, dt}, n, in, out);
    double worst = 0, worst_dx = 0;
    for (int64_t i = 0; i < n; i++)
      for (int64_t o = 0; o < out; o++) {
        double ref = 0, mag = 1e-30;
        for (int64_t p = 0; p < in; p++) {
          double v = (double)wf[o * in + p] * bf16r(x[i * in + p]);
          ref += v, mag += fabs(v);
        }
        worst = fmax(worst, fabs(y[i * out + o] - ref) / ((double)in * 0x1p-23 * mag));
      }
    for (int64_t i = 0; i < n; i++)
      for (int64_t p = 0; p < in; p++) {
        double ref = 0, mag = 1e-30;
        for (int64_t o = 0; o < out; o++) {
          double v = (double)bf16r(dy[i * out + o]) * wf[o * in + p];
          ref += v, mag += fabs(v);
        }
        worst_dx = fmax(worst_dx, fabs(dx[i * in + p] - ref) / ((double)out * 0x1p-23 * mag));
      }
    if (!(worst <= 1 && worst_dx <= 1))
      fprintf(stderr, "bf16 compute %s: forward %.2f, dx %.2f of the bound\n", ds_dtype_name(dt), worst, worst_dx);
    EXPECT(worst <= 1 && worst_dx <= 1);
    ds_release_packed_weights();
    free(w), free(wf), free(x), free(dy), free(y), free(dx);
  }
  ds_unset_matmul_compute();
}

/* Under DS_COMPUTE_INT8, more rows than DS_QUANT_DIRECT_MAX_ROWS (a prefill, a capture) still
 * take the integer path: linear_w and linear_w_cat give each row, bit for bit, what one row a
 * call (decoding) gives, and so does the default (unset); under an explicit fp32 the same call is
 * the dequantized product (not those bits for some row: the check can fail). */
static void test_compute_int8(void) {
  int64_t n = DS_QUANT_DIRECT_MAX_ROWS + 9;
  for (int t = 0; t < N_TYPES; t++) {
    ds_dtype dt = k_types[t];
    int64_t in = ds_quant_block(dt) == 256 ? 512 : 160, out = 37, outs[2] = {37, 37};
    unsigned char *w = rand_weight(dt, out, in);
    ds_weight qw = {w, dt}, ws[2] = {qw, qw};
    float *x = rand_x(n, in), *all = malloc((size_t)(n * out) * sizeof(float)), one[37];
    float *cat = malloc((size_t)(n * 2 * out) * sizeof(float)), *f32 = malloc((size_t)(n * out) * sizeof(float));
    float *dflt = malloc((size_t)(n * out) * sizeof(float));
    ds_set_matmul_compute(DS_COMPUTE_F32);
    ds_backend_cpu()->linear_w(f32, out, x, qw, NULL, n, in, out);
    ds_set_matmul_compute(DS_COMPUTE_INT8);
    ds_backend_cpu()->linear_w(all, out, x, qw, NULL, n, in, out);
    ds_backend_cpu()->linear_w_cat(cat, 2 * out, x, ws, outs, 2, NULL, n, in);
    ds_unset_matmul_compute(); /* the default: int8 products for quantized weights, as INT8 */
    EXPECT(ds_matmul_compute() == DS_COMPUTE_F32 && ds_quant_int8_rows());
    ds_backend_cpu()->linear_w(dflt, out, x, qw, NULL, n, in, out);
    int same = 1, same_cat = 1, differs_f32 = 0;
    for (int64_t i = 0; i < n; i++) {
      ds_backend_cpu()->linear_w(one, out, x + i * in, qw, NULL, 1, in, out);
      same &= !memcmp(one, all + i * out, sizeof one) && !memcmp(one, dflt + i * out, sizeof one);
      same_cat &= !memcmp(one, cat + i * 2 * out, sizeof one) && !memcmp(one, cat + i * 2 * out + out, sizeof one);
      differs_f32 |= memcmp(one, f32 + i * out, sizeof one) != 0;
    }
    if (!same || !same_cat) fprintf(stderr, "int8 compute %s: rows differ from decoding's\n", ds_dtype_name(dt));
    EXPECT(same && same_cat && differs_f32);
    ds_release_packed_weights();
    free(w), free(x), free(all), free(cat), free(f32), free(dflt);
  }
  ds_set_matmul_compute(DS_COMPUTE_F32);
  EXPECT(!ds_quant_int8_rows() && !strcmp(ds_compute_label(), "fp32"));
  ds_unset_matmul_compute();
  EXPECT(!strcmp(ds_compute_label(), "fp32 (int8 quantized products)"));
  ds_compute c;
  EXPECT(ds_compute_parse("int8", &c) && c == DS_COMPUTE_INT8 && !strcmp(ds_compute_name(c), "int8"));
}

/* The activation quantizer: steps, rounding to nearest within half a step, sums of 16. */
static void test_quantize_x(void) {
  int64_t n = 3, in = 96;
  float *x = rand_x(n, in);
  for (int l = 0; l < 32; l++) x[32 + l] = 0.0f; /* an all-zero block: step 0, quants 0 */
  ds_qx qx;
  EXPECT(ds_qx_alloc(&qx, n, in));
  ds_qx_quantize(&qx, x, n, in);
  int ok = 1;
  for (int64_t b = 0; b < n * in / 32; b++) {
    float d = qx.d[b];
    int s0 = 0, s1 = 0;
    for (int l = 0; l < 32; l++) {
      int q = qx.q[32 * b + l];
      ok &= q >= -127 && q <= 127 && fabs((double)x[32 * b + l] - (double)d * q) <= d * 0.5 * (1 + 1e-5);
      if (l < 16) s0 += q;
      else s1 += q;
    }
    ok &= qx.s[2 * b] == s0 && qx.s[2 * b + 1] == s1;
  }
  EXPECT(ok);
  EXPECT(qx.d[1] == 0.0f);
  ds_qx_free(&qx);
  free(x);
#if defined(__x86_64__) || defined(__i386__)
  if (ds_qisa_best() >= DS_QISA_AVX2) { /* the vector quantizer equals the C one, bit for bit */
    /* 7 rows of 5 blocks: its groups of 8 blocks cross rows; group 0 holds ties, zeros and a
     * denormal step with a finite reciprocal; group 1 a NaN, group 2 an infinity and values near
     * overflow, group 3 denormals (a step whose reciprocal is infinite) among random values (each
     * of those three taken a block at a time, for its own reason); blocks 32-34 the tail */
    int64_t m = 7, k = 160;
    float *y = rand_x(m, k);
    for (int l = 0; l < 32; l++) y[l] = (float)(l - 16) * 0.5f;  /* ties: x / d lands on k + 1/2 */
    for (int l = 32; l < 64; l++) y[l] = 0.0f;                    /* all zero */
    for (int l = 800; l < 832; l++) y[l] = 1e-40f * (float)(l - 810); /* denormals: 1 / d infinite */
    y[32 * 21 + 3] = 3e38f, y[32 * 21 + 4] = -3e38f;               /* near overflow */
    for (int l = 160; l < 192; l++) y[l] = 4e-37f * (float)(l - 176) / 16.0f; /* a denormal step, finite 1 / d */
    y[32 * 9 + 5] = NAN, y[32 * 20 + 7] = -INFINITY;
    ds_qx a, c;
    EXPECT(ds_qx_alloc(&a, m, k) && ds_qx_alloc(&c, m, k));
    ds_qx_quantize_portable(&a, y, m, k);
    ds_qx_quantize_avx2(&c, y, m, k);
    size_t nbk = (size_t)(m * k / 32);
    EXPECT(!memcmp(a.q, c.q, (size_t)(m * k)));
    EXPECT(!memcmp(a.s, c.s, 2 * nbk * sizeof(int16_t)));
    EXPECT(!memcmp(a.d, c.d, nbk * sizeof(float))); /* NaN has one bit pattern from both */
    EXPECT(!memcmp(a.m, c.m, nbk * sizeof(float)));
    ds_qx_free(&a), ds_qx_free(&c);
    free(y);
  }
#endif
  fprintf(stderr, "quantized weight kernels on this CPU: %s\n", ds_weight_quant_kernel_name());
}

/* ds_ggml_quantize_q8_0 (the draft's decoding copies and GGUF export; conformance.test_gguf_draft
 * checks it against llama.cpp's converter to the byte): d = max|x| / 127 as an f16, ties of
 * x / d away from zero, a zero block all zeros, and every value back within half a step. */
static void test_quantize_q8_0_weights(void) {
  float x[96];
  for (int j = 0; j < 32; j++) x[j] = (float)(j - 16) + 0.5f; /* -15.5 .. 15.5: ties at d = 1 */
  x[31] = 127.0f;                                              /* max|x| = 127: d = 1 exactly */
  for (int j = 32; j < 64; j++) x[j] = 0.0f;
  ds_rng rng;
  ds_rng_seed(&rng, 5);
  for (int j = 64; j < 96; j++) x[j] = 3e-3f * (2.0f * ds_rng_uniform_f32(&rng) - 1.0f);
  unsigned char b[3 * 34];
  ds_ggml_quantize_q8_0(x, b, 96);
  EXPECT(b[0] == 0x00 && b[1] == 0x3C); /* f16 1.0 */
  for (int j = 0; j < 31; j++) {
    int want = j - 16 < 0 ? j - 16 : j - 15; /* -15.5 -> -16, 0.5 -> 1 */
    EXPECT((int8_t)b[2 + j] == want);
  }
  EXPECT((int8_t)b[2 + 31] == 127);
  for (int j = 0; j < 34; j++) EXPECT(b[34 + j] == 0);
  float y[96];
  ds_ggml_dequantize_row(DS_GGML_Q8_0, b, y, 96);
  float d = ds_f16_to_f32((uint16_t)(b[68] | b[69] << 8)), amax = 0;
  for (int j = 64; j < 96; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
  EXPECT(fabsf(d - amax / 127.0f) <= 1e-3f * d);
  for (int j = 64; j < 96; j++) EXPECT(fabsf(y[j] - x[j]) <= 0.5f * d + 1e-3f * fabsf(x[j]));
}

/* Once a weight has its packed copy, the rows read back from it (the chunked path, embedding
 * lookups, ds_quant_unpack_row) are the stored rows, tail rows past the last group of 8 too. */
static void test_unpack(void) {
  const ds_dtype types[] = {DS_Q8_0, DS_Q4_0, DS_Q4_1, DS_Q5_0, DS_Q5_1, DS_Q4_K, DS_Q6_K};
  for (int t = 0; t < 7; t++) {
    ds_dtype dt = types[t];
    enum { IN_MAX = 512 };
    int64_t rows = 27, in = ds_quant_block(dt) == 256 ? IN_MAX : 96;
    unsigned char *w = rand_weight(dt, rows, in);
    size_t rb = ds_quant_row_bytes(dt, in);
    ds_weight wt = {w, dt};
    const unsigned char *packed = ds_quant_packed(wt, rows, in);
    int64_t rows_packed = 0;
    EXPECT(packed != NULL && ds_quant_packed_find(w, dt, in, &rows_packed) == packed && rows_packed == 24);
    unsigned char row[IN_MAX * 2];
    for (int64_t r = 0; r < rows_packed; r++) {
      ds_quant_unpack_row(row, packed, dt, in, r);
      EXPECT(memcmp(row, w + (size_t)r * rb, rb) == 0);
    }
    float *want = dequantized(dt, w, rows, in), got[27 * IN_MAX];
    ds_quant_dequantize_rows(got, wt, in, 0, rows);
    EXPECT(memcmp(got, want, (size_t)(rows * in) * sizeof(float)) == 0);
    int32_t ids[] = {26, 0, 7, 8, 23, 24, 13};
    float emb[7 * IN_MAX];
    ds_backend_cpu()->embedding_w(emb, ids, wt, 7, in);
    for (int i = 0; i < 7; i++) EXPECT(memcmp(emb + i * in, want + ids[i] * in, (size_t)in * sizeof(float)) == 0);
    free(want);
    ds_release_packed_weights(); /* before the weight's memory is freed: the copies are keyed by address */
    free(w);
  }
}

int main(void) {
  ds_rng_seed(&g_rng, 27);
  TEST_RUN(test_quantize_x);
  TEST_RUN(test_quantize_q8_0_weights);
  TEST_RUN(test_unpack);
  TEST_RUN(test_paths);
  TEST_RUN(test_rows_independent);
  TEST_RUN(test_packed_isas_equal);
  TEST_RUN(test_packed_prefetch_same);
  TEST_RUN(test_nonfinite_scales);
  TEST_RUN(test_extreme_blocks);
  TEST_RUN(test_cat);
  TEST_RUN(test_embedding_backward);
  TEST_RUN(test_compute_bf16);
  TEST_RUN(test_compute_int8);
  return TEST_RESULT();
}
