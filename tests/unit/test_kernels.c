/* The optimized CPU backend against the naive reference kernels on random inputs, at shapes
 * that exercise the GEMV path (n = 1), chunked attention (n > 64) and GQA. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/backend.h"
#include "dspark/dtype.h"
#include "dspark/rng.h"
#include "nn/cpu_kernels.h"
#include "test_util.h"

static ds_rng g_rng;

static float *rand_buf(size_t n, float scale) {
  float *p = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) p[i] = (2.0f * ds_rng_uniform_f32(&g_rng) - 1.0f) * scale;
  return p;
}


static void test_linear(void) {
  const ds_backend *cpu = ds_backend_cpu(), *ref = ds_backend_reference();
  int64_t shapes[][3] = {{1, 64, 96}, {7, 33, 17}, {130, 64, 200}};
  for (int s = 0; s < 3; s++) {
    int64_t n = shapes[s][0], in = shapes[s][1], out = shapes[s][2];
    float *x = rand_buf((size_t)(n * in), 1), *w = rand_buf((size_t)(out * in), 1), *b = rand_buf((size_t)out, 1);
    float *y1 = malloc(sizeof(float) * (size_t)(n * out)), *y2 = malloc(sizeof(float) * (size_t)(n * out));
    for (int with_bias = 0; with_bias < 2; with_bias++) {
      cpu->linear(y1, x, w, with_bias ? b : NULL, n, in, out);
      ref->linear(y2, x, w, with_bias ? b : NULL, n, in, out);
      EXPECT(test_rel_err(y1, y2, (size_t)(n * out)) < 1e-5);
    }
    free(x); free(w); free(b); free(y1); free(y2);
  }
}

static void test_rmsnorm(void) {
  int64_t n = 9, d = 80;
  float *x = rand_buf((size_t)(n * d), 3), *w = rand_buf((size_t)d, 1);
  float y1[9 * 80], y2[9 * 80], r1[9], r2[9];
  ds_backend_cpu()->rmsnorm(y1, r1, x, w, n, d, 1e-6f);
  ds_backend_reference()->rmsnorm(y2, r2, x, w, n, d, 1e-6f);
  EXPECT(test_rel_err(y1, y2, (size_t)(n * d)) < 1e-6);
  EXPECT(test_rel_err(r1, r2, (size_t)n) < 1e-6);
  /* In place (y aliases x) gives the same values. */
  ds_backend_cpu()->rmsnorm(x, NULL, x, w, n, d, 1e-6f);
  EXPECT(test_rel_err(x, y2, (size_t)(n * d)) < 1e-6);
  free(x); free(w);
}

static void test_rope(void) {
  int64_t n = 5, heads = 3, hd = 16, stride = 64;
  float *x1 = rand_buf((size_t)(n * stride), 1), *x2 = malloc(sizeof(float) * (size_t)(n * stride));
  memcpy(x2, x1, sizeof(float) * (size_t)(n * stride));
  int64_t pos[5] = {0, 1, 7, 100, 511};
  float inv[8];
  for (int i = 0; i < 8; i++) inv[i] = 1.0f / powf(10000.0f, (float)(2 * i) / 16.0f);
  ds_backend_cpu()->rope(x1, stride, pos, inv, n, heads, hd);
  ds_backend_reference()->rope(x2, stride, pos, inv, n, heads, hd);
  /* Both compute the fp32 angle; the reference rotates in double. */
  EXPECT(test_rel_err(x1, x2, (size_t)(n * stride)) < 2e-5);
  /* Columns past heads * hd in each row are untouched. */
  int untouched = 1;
  for (int64_t t = 0; t < n; t++)
    for (int64_t j = heads * hd; j < stride; j++) untouched &= x1[t * stride + j] == x2[t * stride + j];
  EXPECT(untouched);
  free(x1); free(x2);
}

static void test_attention(void) {
  /* past keys already cached + n new queries; GQA 6 query heads over 2 kv heads. */
  int64_t cases[][2] = {{0, 1}, {0, 9}, {13, 1}, {5, 150}};
  for (int c = 0; c < 4; c++) {
    int64_t past = cases[c][0], n = cases[c][1], hq = 6, hkv = 2, hd = 16, cap = past + n + 3;
    int64_t q_stride = hq * hd + 8; /* padded rows, as in the fused qkv buffer */
    float *q = rand_buf((size_t)(n * q_stride), 2), *k = rand_buf((size_t)(hkv * cap * hd), 2);
    float *v = rand_buf((size_t)(hkv * cap * hd), 2);
    float *o1 = malloc(sizeof(float) * (size_t)(n * hq * hd)), *o2 = malloc(sizeof(float) * (size_t)(n * hq * hd));
    float scale = 0.25f;
    ds_backend_cpu()->attention_causal(o1, q, q_stride, k, v, n, past, cap, hq, hkv, hd, scale);
    ds_backend_reference()->attention_causal(o2, q, q_stride, k, v, n, past, cap, hq, hkv, hd, scale);
    EXPECT(test_rel_err(o1, o2, (size_t)(n * hq * hd)) < 1e-5);
    free(q); free(k); free(v); free(o1); free(o2);
  }
  /* Decode and short verification (at most 8 new rows) over several key blocks of 128, head
   * sizes with lane and column tails: each row equals the reference, and equals bit for bit the
   * same query decoded alone after the rows before it (what makes a verification's numbers a
   * decode's). Query heads per kv head 1 to 4, so that a block's (row, head) pairs fill the
   * AVX-512 value pass (4 pairs of 64 values, 2 of 128) and leave it a remainder. */
  int64_t dec[][4] = {{300, 1, 72, 6}, {260, 5, 64, 6}, {127, 8, 20, 6}, {1000, 3, 80, 6}, /* 20: the portable path */
                      {200, 8, 128, 6}, {129, 7, 64, 8}, {64, 2, 64, 2}, {383, 6, 128, 8}};
  for (int c = 0; c < (int)(sizeof dec / sizeof *dec); c++) {
    int64_t past = dec[c][0], n = dec[c][1], hd = dec[c][2], hq = dec[c][3], hkv = 2, cap = past + n;
    int64_t q_stride = hq * hd, w = hq * hd;
    float *q = rand_buf((size_t)(n * q_stride), 7 + c), *k = rand_buf((size_t)(hkv * cap * hd), 2);
    float *v = rand_buf((size_t)(hkv * cap * hd), 3);
    float *o1 = malloc(sizeof(float) * (size_t)(n * w)), *o2 = malloc(sizeof(float) * (size_t)(n * w));
    float *one = malloc(sizeof(float) * (size_t)w);
    float scale = 1.0f / sqrtf((float)hd);
    ds_backend_cpu()->attention_causal(o1, q, q_stride, k, v, n, past, cap, hq, hkv, hd, scale);
    ds_backend_reference()->attention_causal(o2, q, q_stride, k, v, n, past, cap, hq, hkv, hd, scale);
    EXPECT(test_rel_err(o1, o2, (size_t)(n * w)) < 1e-5);
    int same = 1;
    for (int64_t i = 0; i < n; i++) {
      ds_backend_cpu()->attention_causal(one, q + i * q_stride, q_stride, k, v, 1, past + i, cap, hq, hkv, hd, scale);
      same &= memcmp(one, o1 + i * w, sizeof(float) * (size_t)w) == 0;
    }
    EXPECT(same);
    free(q); free(k); free(v); free(o1); free(o2); free(one);
  }
}

/* An f16 KV cache: the appends round as ds_f32_to_f16 does (ties to even, subnormals, overflow to
 * infinity), and attention over it (decode rows, a verification, a prefill) equals the reference
 * attention over the widened values, each decode row bit-equal to the query decoded alone and
 * to the cpu's fp32 attention over the widened values (the f16 path converts as it reads and
 * must not change a decode's numbers). */
static void test_attention_f16(void) {
  float specials[] = {0.0f, -0.0f, 1.0f, 65504.0f, 65520.0f, 1e6f, -1e6f, 6.0e-8f, 3.0e-5f, -2.9e-8f,
                      1.00048828125f, 1.000732421875f, 0.333333343f, -7.77e-3f, 2049.0f, 2051.0f, 1e-3f};
  int n_sp = (int)(sizeof specials / sizeof *specials);
  float *x = rand_buf(4 * 37, 300);
  for (int i = 0; i < n_sp; i++) x[i * 5] = specials[i];
  uint16_t got[4 * 37];
  ds_backend_cpu()->copy_rows_f16(got, 37, x, 37, 4, 37);
  int same = 1;
  for (int i = 0; i < 4 * 37; i++) same &= got[i] == ds_f32_to_f16(x[i]);
  EXPECT(same);
  free(x);

  /* past, rows, head_dim, heads, kv heads: GQA groups of 3, 4 and 2 (the decode kernels take up
   * to 3 query vectors per widened key and up to 4 (hd 64) or 2 (hd 128) per value row), head
   * sizes those kernels take and others, key counts with tails */
  int64_t cases[][5] = {{0, 1, 64, 6, 2},   {300, 1, 72, 6, 2},  {260, 5, 36, 6, 2}, {1000, 3, 80, 6, 2},
                        {37, 150, 64, 6, 2}, {129, 2, 64, 8, 2}, {77, 1, 128, 4, 2}};
  for (int c = 0; c < 7; c++) {
    int64_t past = cases[c][0], n = cases[c][1], hd = cases[c][2], hq = cases[c][3], hkv = cases[c][4];
    int64_t cap = past + n + 2;
    int64_t w = hq * hd, cells = hkv * cap * hd;
    float *q = rand_buf((size_t)(n * w), 2), *kf = rand_buf((size_t)cells, 2), *vf = rand_buf((size_t)cells, 2);
    uint16_t *k = malloc(sizeof(uint16_t) * (size_t)cells), *v = malloc(sizeof(uint16_t) * (size_t)cells);
    ds_backend_cpu()->copy_rows_f16(k, cells, kf, cells, 1, cells);
    ds_backend_cpu()->copy_rows_f16(v, cells, vf, cells, 1, cells);
    float *o1 = malloc(sizeof(float) * (size_t)(n * w)), *o2 = malloc(sizeof(float) * (size_t)(n * w));
    float *one = malloc(sizeof(float) * (size_t)w), scale = 1.0f / sqrtf((float)hd);
    ds_backend_cpu()->attention_causal_f16(o1, q, w, k, v, n, past, cap, hq, hkv, hd, scale);
    ds_backend_reference()->attention_causal_f16(o2, q, w, k, v, n, past, cap, hq, hkv, hd, scale);
    EXPECT(test_rel_err(o1, o2, (size_t)(n * w)) < 1e-5);
    if (n <= 8) {
      int alone = 1;
      for (int64_t i = 0; i < n; i++) {
        ds_backend_cpu()->attention_causal_f16(one, q + i * w, w, k, v, 1, past + i, cap, hq, hkv, hd, scale);
        alone &= memcmp(one, o1 + i * w, sizeof(float) * (size_t)w) == 0;
      }
      EXPECT(alone);
      for (int64_t e = 0; e < cells; e++) kf[e] = ds_f16_to_f32(k[e]), vf[e] = ds_f16_to_f32(v[e]);
      ds_backend_cpu()->attention_causal(o2, q, w, kf, vf, n, past, cap, hq, hkv, hd, scale);
      EXPECT(memcmp(o1, o2, sizeof(float) * (size_t)(n * w)) == 0);
    }
    free(q); free(kf); free(vf); free(k); free(v); free(o1); free(o2); free(one);
  }
}

/* attention_causal_seqs (batched decoding): each sequence's rows equal its own attention_causal(_f16)
 * call bit for bit, with sequences of other lengths and row counts beside it (one with more rows
 * than the decode kernels take, a call each), fp32 and f16 caches; the reference's too. */
static void test_attention_seqs(void) {
  enum { NS = 4 };
  int64_t hq = 6, hkv = 2, hd = 64, w = hq * hd, qs = w + 8;
  int64_t past_sets[2][NS] = {{300, 0, 129, 1000}, {40, 7, 260, 3}}, n_sets[2][NS] = {{1, 1, 3, 1}, {2, 1, 12, 1}};
  for (int set = 0; set < 2; set++)
    for (int f16 = 0; f16 < 2; f16++) {
      const int64_t *past = past_sets[set], *n = n_sets[set];
      int64_t cap[NS], rows = 0;
      const void *k[NS], *v[NS];
      float *kf[NS], *vf[NS];
      uint16_t *kh[NS], *vh[NS];
      for (int s = 0; s < NS; s++) {
        cap[s] = past[s] + n[s] + 5, rows += n[s];
        size_t cells = (size_t)(hkv * cap[s] * hd);
        kf[s] = rand_buf(cells, 40 + s), vf[s] = rand_buf(cells, 50 + s);
        kh[s] = malloc(cells * sizeof(uint16_t)), vh[s] = malloc(cells * sizeof(uint16_t));
        ds_backend_cpu()->copy_rows_f16(kh[s], (int64_t)cells, kf[s], (int64_t)cells, 1, (int64_t)cells);
        ds_backend_cpu()->copy_rows_f16(vh[s], (int64_t)cells, vf[s], (int64_t)cells, 1, (int64_t)cells);
        k[s] = f16 ? (const void *)kh[s] : (const void *)kf[s], v[s] = f16 ? (const void *)vh[s] : (const void *)vf[s];
      }
      float *q = rand_buf((size_t)(rows * qs), 60), *all = malloc((size_t)(rows * w) * sizeof(float));
      float *one = malloc((size_t)(rows * w) * sizeof(float)), *ref = malloc((size_t)(rows * w) * sizeof(float));
      float scale = 0.125f;
      ds_backend_cpu()->attention_causal_seqs(all, q, qs, k, v, f16, n, past, cap, NS, hq, hkv, hd, scale);
      ds_backend_reference()->attention_causal_seqs(ref, q, qs, k, v, f16, n, past, cap, NS, hq, hkv, hd, scale);
      for (int s = 0, row = 0; s < NS; row += (int)n[s++])
        if (f16)
          ds_backend_cpu()->attention_causal_f16(one + row * w, q + row * qs, qs, kh[s], vh[s], n[s], past[s], cap[s], hq,
                                                 hkv, hd, scale);
        else
          ds_backend_cpu()->attention_causal(one + row * w, q + row * qs, qs, kf[s], vf[s], n[s], past[s], cap[s], hq,
                                             hkv, hd, scale);
      EXPECT(memcmp(all, one, (size_t)(rows * w) * sizeof(float)) == 0);
      EXPECT(test_rel_err(all, ref, (size_t)(rows * w)) < 1e-5);
      for (int s = 0; s < NS; s++) free(kf[s]), free(vf[s]), free(kh[s]), free(vh[s]);
      free(q), free(all), free(one), free(ref);
    }
}

static void test_swiglu_add(void) {
  int64_t n = 4, inter = 37;
  float *gu = rand_buf((size_t)(n * 2 * inter), 6);
  float o1[4 * 37], o2[4 * 37];
  ds_backend_cpu()->swiglu(o1, gu, n, inter);
  ds_backend_reference()->swiglu(o2, gu, n, inter);
  EXPECT(test_rel_err(o1, o2, (size_t)(n * inter)) < 1e-6);
  float y[3] = {1, 2, 3}, x[3] = {0.5f, -2, 4};
  ds_backend_cpu()->add(y, x, 3);
  EXPECT(y[0] == 1.5f && y[1] == 0.0f && y[2] == 7.0f);
  free(gu);
}

/* ds_gemm_f32 on random operands of the given strides (C's rows n + pad_c apart), against a
 * double reference: the entries outside the first-order bound of a k-term fp32 sum, plus those of
 * C's padding between rows that were written. */
static int gemm_mismatches(int ta, int tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t pad_c,
                           float beta) {
  int64_t ldc = n + pad_c;
  float *A = rand_buf((size_t)((ta ? k : m) * lda), 1), *B = rand_buf((size_t)((tb ? n : k) * ldb), 1);
  float *C = rand_buf((size_t)(m * ldc), 1), *C0 = malloc(sizeof(float) * (size_t)(m * ldc));
  memcpy(C0, C, sizeof(float) * (size_t)(m * ldc));
  ds_gemm_f32(ta, tb, m, n, k, A, lda, B, ldb, beta, C, ldc);
  int bad = 0;
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double ref = beta * (double)C0[i * ldc + j], mag = fabs(ref);
      for (int64_t p = 0; p < k; p++) {
        double t = (double)(ta ? A[p * lda + i] : A[i * lda + p]) * (tb ? B[j * ldb + p] : B[p * ldb + j]);
        ref += t, mag += fabs(t);
      }
      bad += fabs(C[i * ldc + j] - ref) > (double)(k + 2) * 0x1p-24 * mag;
    }
  for (int64_t i = 0; i < m; i++) /* the padding between rows of C is never written */
    for (int64_t j = n; j < ldc; j++) bad += C[i * ldc + j] != C0[i * ldc + j];
  free(A), free(B), free(C), free(C0);
  return bad;
}

/* The fp32 GEMM with padded strides and beta 0 / 1, on 2 threads, at shapes its column split
 * takes (B transposed, 16+ rows, 96+ columns a thread: tails of the split included) and that
 * it leaves whole, against a double reference: each entry within the first-order bound of a
 * k-term fp32 sum. */
static void test_sgemm_split(void) {
  int64_t shapes[][3] = {{16, 192, 40}, {33, 517, 70}, {64, 1024, 129}, {15, 600, 33}, {40, 150, 64}};
  int threads = ds_get_num_threads();
  ds_set_num_threads(2);
  for (int s = 0; s < 5; s++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++)
        for (int bi = 0; bi < 2; bi++) {
          int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2], pad = 3;
          EXPECT(gemm_mismatches(ta, tb, m, n, k, (ta ? m : k) + pad, (tb ? k : n) + pad, pad, (float)bi) == 0);
        }
  ds_set_num_threads(threads);
}

/* Products whose operand with k down its rows has a row stride of a multiple of 512 bytes, which
 * the oneDNN build copies to rows of another stride on a CPU without AVX-512 (nn/cpu_gemm.c:
 * here, or under unit.test_kernels_avx2): B [k, n] split by columns, A^T and B both, A^T alone
 * split by rows, and one left on a thread count of its own (n < 128); k-slices with a tail. Each
 * against a double reference within the first-order bound of a k-term fp32 sum, C's padding
 * between rows never written; and the copying route counted where oneDNN runs AVX2. */
static void test_sgemm_bad_stride(void) {
  /* ta, tb, m, n, k, lda, ldb */
  int64_t cases[][7] = {{0, 0, 128, 512, 1100, 1100, 512},
                        {1, 0, 512, 512, 448, 512, 512},
                        {1, 1, 384, 200, 300, 384, 300},
                        {0, 0, 256, 100, 2000, 2000, 128}};
  int threads = ds_get_num_threads();
  ds_set_num_threads(2);
  long before = ds_cpu_sgemm_padded_count();
  for (int c = 0; c < 4; c++)
    for (int bi = 0; bi < 2; bi++) {
      int ta = (int)cases[c][0], tb = (int)cases[c][1];
      EXPECT(gemm_mismatches(ta, tb, cases[c][2], cases[c][3], cases[c][4], cases[c][5], cases[c][6], 5, (float)bi) ==
             0);
    }
  long taken = ds_cpu_sgemm_padded_count() - before;
  const char *gemm = ds_gemm_name();
  if (strstr(gemm, "oneDNN") && strstr(gemm, " avx2") && !getenv("DSPARK_GEMM_PAD")) EXPECT(taken == 8);
  ds_set_num_threads(threads);
}

int main(void) {
  ds_rng_seed(&g_rng, 42);
  TEST_RUN(test_sgemm_split);
  TEST_RUN(test_sgemm_bad_stride);
  TEST_RUN(test_linear);
  TEST_RUN(test_rmsnorm);
  TEST_RUN(test_rope);
  TEST_RUN(test_attention);
  TEST_RUN(test_attention_f16);
  TEST_RUN(test_attention_seqs);
  TEST_RUN(test_swiglu_add);
  return TEST_RESULT();
}
