/* The engine's fast exp and the kernels that call it, on every kind of float: NaN, +-inf,
 * huge finite values, denormals. Nothing here may be undefined behaviour (the sanitizer build
 * runs this test with UBSan aborting on the first report), NaN must come out as NaN, and the
 * finite range keeps its accuracy. Pins issue 7 item 3: a NaN reaching ds_fast_expf converted
 * NaN to int and shifted a negative value. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/backend.h"
#include "dspark/dspark_loss.h"
#include "dspark/kd_select.h"
#include "nn/fast_exp.h"
#include "test_util.h"

static void test_exp_special_values(void) {
  EXPECT(isnan(ds_fast_expf(NAN)));
  EXPECT(isnan(ds_fast_expf(-NAN)));
  float big = ds_fast_expf(88.0f);
  EXPECT(isfinite(big) && big > 1e38f);
  EXPECT(ds_fast_expf(INFINITY) == big);   /* saturates */
  EXPECT(ds_fast_expf(FLT_MAX) == big);
  EXPECT(ds_fast_expf(1e30f) == big);
  EXPECT(ds_fast_expf(-INFINITY) == 0.0f);
  EXPECT(ds_fast_expf(-FLT_MAX) == 0.0f);
  EXPECT(ds_fast_expf(-1e30f) == 0.0f);
  EXPECT(ds_fast_expf(-88.0f) == 0.0f);     /* below FLT_MIN: 0 by design */
  EXPECT(ds_fast_expf(0.0f) == 1.0f);
  EXPECT(ds_fast_expf(-0.0f) == 1.0f);
  EXPECT_CLOSE(ds_fast_expf(FLT_TRUE_MIN), 1.0, 1e-7, 0);
  EXPECT_CLOSE(ds_fast_expf(-FLT_MIN), 1.0, 1e-7, 0);
}

/* Relative error against libm's double exp over the whole useful range. */
static void test_exp_accuracy(void) {
  double worst = 0;
  for (float x = -87.0f; x <= 88.0f; x += 0.0137f) {
    double want = exp((double)x), got = ds_fast_expf(x);
    double err = fabs(got - want) / want;
    worst = err > worst ? err : worst;
  }
  if (worst > 3e-7) fprintf(stderr, "worst relative error %.3g\n", worst);
  EXPECT(worst <= 3e-7);
}

/* The loop form the kernels use (vectorized in the release build) gives the scalar values,
 * NaN lanes included, and never lets a NaN lane disturb its neighbours. */
/* One lane at a time: the compiler may not vectorize this copy, so the loops below compare the
 * vectorized form (AVX2 or AVX-512 in the release build) against the scalar one. */
__attribute__((noinline, optimize("no-tree-vectorize"))) static float exp_scalar(float x) {
  return ds_fast_expf(x);
}

static void test_exp_loop(void) {
  enum { N = 67 };
  float x[N], y[N];
  const float special[] = {NAN, INFINITY, -INFINITY, FLT_MAX, -FLT_MAX, 0.0f, -0.5f, 3.0f, -100.0f};
  for (int i = 0; i < N; i++) x[i] = special[i % 9] + (i % 9 >= 5 ? 0.01f * (float)i : 0.0f);
  for (int i = 0; i < N; i++) y[i] = ds_fast_expf(x[i]);
  for (int i = 0; i < N; i++) {
    float want = exp_scalar(x[i]);
    EXPECT(isnan(want) ? isnan(y[i]) : y[i] == want);
    EXPECT(isnan(x[i]) == isnan(y[i]));
  }
  /* a dense sweep of the softmax range and past both clamps, with the underflow edge */
  enum { M = 4099 };
  static float xs[M], ys[M];
  for (int i = 0; i < M; i++) xs[i] = -100.0f + 190.0f * (float)i / (float)(M - 1);
  xs[7] = -87.3365448f, xs[8] = nextafterf(-87.3365448f, 0.0f), xs[9] = nextafterf(-87.3365448f, -INFINITY);
  for (int i = 0; i < M; i++) ys[i] = ds_fast_expf(xs[i]);
  int bad = 0;
  for (int i = 0; i < M; i++) bad += ys[i] != exp_scalar(xs[i]);
  EXPECT(bad == 0);
}

/* Block attention forward and backward with a NaN query, keys that overflow the scores to
 * +-inf, and clean blocks: NaN stays in the blocks it reaches, the clean block is exact. */
static void test_block_attention_nonfinite(void) {
  enum { NB = 3, G = 2, H = 2, KV = 1, HD = 4, NCTX = 5 };
  const ds_backend *be = ds_backend_cpu();
  float q[NB * G * H * HD], kc[NCTX * KV * HD], vc[NCTX * KV * HD], kb[NB * G * KV * HD], vb[NB * G * KV * HD];
  for (int i = 0; i < NB * G * H * HD; i++) q[i] = 0.1f * (float)((i * 7) % 11) - 0.5f;
  for (int i = 0; i < NCTX * KV * HD; i++) kc[i] = 0.2f * (float)((i * 5) % 7) - 0.6f, vc[i] = 0.3f * (float)(i % 5);
  for (int i = 0; i < NB * G * KV * HD; i++) kb[i] = 0.1f * (float)((i * 3) % 9) - 0.4f, vb[i] = 0.05f * (float)i;
  int64_t ctx_len[NB] = {3, 5, 4};
  float clean[NB * G * H * HD], lse0[NB * G * H];
  be->block_attention(clean, lse0, q, kc, vc, kb, vb, ctx_len, NCTX, NB, G, H, KV, HD, 0.5f);

  q[0] = NAN;                                   /* block 0: a NaN query */
  for (int e = 0; e < HD; e++) kb[(1 * G) * KV * HD + e] = 1e30f * (e % 2 ? 1.0f : -1.0f); /* block 1: +-inf scores */
  for (int e = 0; e < HD; e++) q[(1 * G) * H * HD + e] = 1e30f;
  float out[NB * G * H * HD], lse[NB * G * H];
  be->block_attention(out, lse, q, kc, vc, kb, vb, ctx_len, NCTX, NB, G, H, KV, HD, 0.5f);
  int nan0 = 0;
  for (int i = 0; i < G * H * HD; i++) nan0 |= isnan(out[i]);
  EXPECT(nan0);
  for (int i = 2 * G * H * HD; i < NB * G * H * HD; i++) EXPECT(out[i] == clean[i]); /* block 2 untouched */

  float dout[NB * G * H * HD], dq[NB * G * H * HD] = {0}, dkc[NCTX * KV * HD] = {0}, dvc[NCTX * KV * HD] = {0};
  float dkb[NB * G * KV * HD] = {0}, dvb[NB * G * KV * HD] = {0};
  for (int i = 0; i < NB * G * H * HD; i++) dout[i] = 0.01f * (float)(i % 13);
  be->block_attention_backward(dq, dkc, dvc, dkb, dvb, dout, out, lse, q, kc, vc, kb, vb, ctx_len, NCTX, NB, G, H, KV,
                               HD, 0.5f);
  int nan_dq = 0;
  for (int i = 0; i < G * H * HD; i++) nan_dq |= isnan(dq[i]);
  EXPECT(nan_dq);
  be = ds_backend_reference(); /* the reference kernels too: no undefined behaviour */
  be->block_attention(out, lse, q, kc, vc, kb, vb, ctx_len, NCTX, NB, G, H, KV, HD, 0.5f);
}

/* The KD selection on a row with NaN, +-inf and huge values: no undefined behaviour. */
#ifdef DS_HAVE_FAST_EXP_AVX512
/* The 16-lane AVX-512 exp gives the scalar function's bits on a dense sweep of the useful range
 * and on the special values (it exists only in FMA builds, where both fuse the same steps). */
__attribute__((target("avx512f"))) static void exp16(float *y, const float *x) {
  _mm512_storeu_ps(y, ds_fast_exp_avx512(_mm512_loadu_ps(x)));
}

static void test_exp_avx512(void) {
  if (!__builtin_cpu_supports("avx512f")) return;
  const float special[16] = {NAN,  -NAN,    INFINITY, -INFINITY, FLT_MAX, -FLT_MAX,      0.0f,          -0.0f,
                             88.0f, -88.0f, -87.3f,  1e30f,     -1e30f,  FLT_TRUE_MIN, -FLT_MIN, -87.3365448f};
  float x[16], y[16];
  long mismatches = 0;
  for (int pass = 0; pass < 2; pass++) {
    for (float x0 = -90.0f; x0 < 90.0f; x0 += 16 * 0.00041f) {
      for (int l = 0; l < 16; l++) x[l] = pass ? special[l] : x0 + (float)l * 0.00041f;
      exp16(y, x);
      for (int l = 0; l < 16; l++) {
        float want = ds_fast_expf(x[l]);
        if (isnan(want)) {
          EXPECT(isnan(y[l]));
        } else if (y[l] != want && ++mismatches <= 3) {
          fprintf(stderr, "exp(%.9g): avx512 %.9g, scalar %.9g\n", (double)x[l], (double)y[l], (double)want);
        }
      }
      if (pass) break;
    }
  }
  EXPECT(mismatches == 0);
}
#endif

static void test_kd_select_nonfinite(void) {
  enum { V = 40, K = 5 };
  float x[V], scratch[V], lp[K];
  int32_t ids[K];
  for (int i = 0; i < V; i++) x[i] = 0.1f * (float)i;
  x[3] = NAN;
  x[7] = INFINITY;
  x[9] = -INFINITY;
  x[11] = FLT_MAX;
  ds_kd_select(x, V, 1.0, K, 0.9, 1, scratch, ids, lp);
  ds_kd_select(x, V, 0.5, K, 1.0, 1, scratch, ids, lp);
  for (int i = 0; i < V; i++) x[i] = NAN;
  ds_kd_select(x, V, 1.0, K, 0.5, 2, scratch, ids, lp);
  for (int i = 0; i < K; i++) EXPECT(ids[i] >= -1 && ids[i] < V);
}

/* The DSpark loss on rows with huge finite logits (supervised) and NaN / inf ones
 * (unsupervised): defined behaviour, finite results or a named numeric error. */
static void test_loss_extremes(void) {
  enum { B = 2, G = 2, V = 24, R = B * G };
  float draft[R * V], target[R * V], conf[R], grad[R * V], gconf[R];
  for (int i = 0; i < R * V; i++) draft[i] = (i % 3) ? FLT_MAX : -FLT_MAX, target[i] = (i % 5) ? 3e38f : -3e38f;
  for (int i = 0; i < V; i++) draft[1 * V + i] = NAN, target[1 * V + i] = INFINITY; /* row 1 unsupervised */
  int32_t ids[R] = {1, -7, 2, 4};
  uint8_t em[R] = {1, 0, 1, 1}, keep[B] = {1, 1};
  for (int r = 0; r < R; r++) conf[r] = r == 1 ? NAN : 1e30f;
  ds_dspark_loss_config cfg = ds_dspark_loss_config_default();
  ds_dspark_loss_inputs in = {draft, target, ids, em, keep, conf, NULL};
  ds_dspark_loss_result res;
  double pa[G], pc[G];
  ds_status st = ds_dspark_loss(&cfg, B, G, V, &in, 1.0, &res, pa, pc, grad, gconf, NULL);
  EXPECT(st == DS_OK || st == DS_ERR_NUMERIC);
  if (st == DS_OK) EXPECT(isfinite(res.numerator));
  for (int i = 0; i < R * V; i++) draft[i] = (float)(i % 7) * 1e37f - 3e38f;
  memcpy(target, draft, sizeof draft);
  st = ds_dspark_loss(&cfg, B, G, V, &in, 1.0, &res, pa, pc, grad, gconf, NULL);
  EXPECT(st == DS_OK || st == DS_ERR_NUMERIC);
}

int main(void) {
  TEST_RUN(test_exp_special_values);
  TEST_RUN(test_exp_accuracy);
  TEST_RUN(test_exp_loop);
#ifdef DS_HAVE_FAST_EXP_AVX512
  TEST_RUN(test_exp_avx512);
#endif
  TEST_RUN(test_block_attention_nonfinite);
  TEST_RUN(test_kd_select_nonfinite);
  TEST_RUN(test_loss_extremes);
  return TEST_RESULT();
}
