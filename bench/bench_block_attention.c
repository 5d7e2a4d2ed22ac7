/* The draft's block attention, forward + backward, on the cpu backend against the reference
 * kernels at a training shape: n_ctx 2048, 256 blocks of g = 7 with context lengths drawn
 * uniformly in [0, n_ctx] (seeded), 8 query heads over 2 kv heads, head_dim 64.
 *   bench_block_attention [threads (2)] [n_blocks (256)] [n_ctx (2048)]
 * Prints per pass: seconds (best of 5 for cpu, one run for the reference), GFLOP/s counting
 * the matmuls only (forward QK^T + PV = 4 * head_dim flops per visible (query, key, head);
 * backward QK^T again + dO V^T + dS K + dS^T Q + P^T dO = 10 * head_dim), the speed-up, and
 * the agreement of the two backends (normwise relative error), and as the roofline the sgemm
 * rate at the attention's inner dimension (2048 x 2048 x head_dim) on the same threads. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "dspark/backend.h"
#include "dspark/rng.h"
#include "bench_util.h"


typedef struct {
  float *out, *lse, *dq, *dkc, *dvc, *dkb, *dvb;
} grads;

static float *buf(size_t n, ds_rng *r, float amp) {
  float *p = calloc(n, sizeof(float));
  if (!p) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  for (size_t i = 0; r && i < n; i++) p[i] = (2.0f * ds_rng_uniform_f32(r) - 1.0f) * amp;
  return p;
}

/* GFLOP/s of the engine's GEMM C[n, n] = A[n, k] B[n, k]^T, best of 5. */
static double sgemm_rate(int n, int k) {
  float *a = buf((size_t)n * (size_t)k, NULL, 0), *b = buf((size_t)n * (size_t)k, NULL, 0);
  float *c = buf((size_t)n * (size_t)n, NULL, 0);
  double best = 1e30;
  for (int rep = 0; rep < 5; rep++) {
    double t0 = ds_time_sec();
    ds_gemm_f32(0, 1, n, n, k, a, k, b, k, 0.0f, c, n);
    double dt = ds_time_sec() - t0;
    best = dt < best ? dt : best;
  }
  free(a); free(b); free(c);
  return 2.0 * n * n * k / best / 1e9;
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 2;
  int64_t n_blocks = argc > 2 ? atoll(argv[2]) : 256, n_ctx = argc > 3 ? atoll(argv[3]) : 2048;
  int64_t g = 7, nh = 8, nkv = 2, hd = 64;
  if (threads <= 0 || n_blocks <= 0 || n_ctx < 0) {
    fprintf(stderr, "usage: bench_block_attention [threads] [n_blocks] [n_ctx]\n");
    return 2;
  }
  ds_set_num_threads(threads);
  float scale = 1.0f / sqrtf((float)hd);
  ds_rng rng;
  ds_rng_seed(&rng, 7);
  size_t nq = (size_t)(n_blocks * g * nh * hd), nc = (size_t)(n_ctx * nkv * hd), nb = (size_t)(n_blocks * g * nkv * hd);
  size_t nl = (size_t)(n_blocks * g * nh);
  int64_t *ctx_len = malloc((size_t)n_blocks * sizeof(int64_t));
  double pairs = 0;
  for (int64_t b = 0; b < n_blocks; b++) {
    ctx_len[b] = (int64_t)(ds_rng_next_u64(&rng) % (uint64_t)(n_ctx + 1));
    pairs += (double)(ctx_len[b] + g) * (double)g * (double)nh;
  }
  float *q = buf(nq, &rng, 1), *kc = buf(nc, &rng, 1), *vc = buf(nc, &rng, 1), *kb = buf(nb, &rng, 1);
  float *vb = buf(nb, &rng, 1), *dout = buf(nq, &rng, 1);
  double fwd_flops = 4.0 * hd * pairs, bwd_flops = 10.0 * hd * pairs;
  printf("block_attention n_ctx %lld n_blocks %lld g %lld heads %lld kv_heads %lld head_dim %lld threads %d "
         "gemm %s\n",
         (long long)n_ctx, (long long)n_blocks, (long long)g, (long long)nh, (long long)nkv, (long long)hd,
         ds_get_num_threads(), ds_gemm_name());
  printf("work: %.2f GFLOP forward, %.2f GFLOP backward (matmuls over visible keys)\n", fwd_flops / 1e9,
         bwd_flops / 1e9);

  double peak = sgemm_rate(2048, (int)hd);
  printf("roofline: sgemm 2048 x 2048 x %lld %.2f GFLOP/s\n", (long long)hd, peak);

  grads r[2];
  double t_fwd[2], t_bwd[2];
  for (int k = 0; k < 2; k++) {
    const ds_backend *be = k == 0 ? ds_backend_cpu() : ds_backend_reference();
    int reps = k == 0 ? 5 : 1;
    grads *x = &r[k];
    *x = (grads){buf(nq, NULL, 0), buf(nl, NULL, 0), buf(nq, NULL, 0), buf(nc, NULL, 0),
                 buf(nc, NULL, 0), buf(nb, NULL, 0), buf(nb, NULL, 0)};
    t_fwd[k] = t_bwd[k] = 1e30;
    for (int rep = 0; rep < reps; rep++) {
      double t0 = ds_time_sec();
      be->block_attention(x->out, x->lse, q, kc, vc, kb, vb, ctx_len, n_ctx, n_blocks, g, nh, nkv, hd, scale);
      double t1 = ds_time_sec();
      /* gradients accumulate: zero them so the last repetition is one backward's result */
      for (size_t i = 0; i < nq; i++) x->dq[i] = 0;
      for (size_t i = 0; i < nc; i++) x->dkc[i] = x->dvc[i] = 0;
      for (size_t i = 0; i < nb; i++) x->dkb[i] = x->dvb[i] = 0;
      double t2 = ds_time_sec();
      be->block_attention_backward(x->dq, x->dkc, x->dvc, x->dkb, x->dvb, dout, x->out, x->lse, q, kc, vc, kb, vb,
                                   ctx_len, n_ctx, n_blocks, g, nh, nkv, hd, scale);
      double t3 = ds_time_sec();
      t_fwd[k] = t1 - t0 < t_fwd[k] ? t1 - t0 : t_fwd[k];
      t_bwd[k] = t3 - t2 < t_bwd[k] ? t3 - t2 : t_bwd[k];
    }
    printf("%-9s forward  %9.4f s %8.2f GFLOP/s   backward %9.4f s %8.2f GFLOP/s   total %9.4f s\n", be->name,
           t_fwd[k], fwd_flops / t_fwd[k] / 1e9, t_bwd[k], bwd_flops / t_bwd[k] / 1e9, t_fwd[k] + t_bwd[k]);
  }
  if (peak > 0)
    printf("cpu share of the sgemm roofline: forward %.0f%% backward %.0f%%\n", 100 * fwd_flops / t_fwd[0] / 1e9 / peak,
           100 * bwd_flops / t_bwd[0] / 1e9 / peak);
  printf("speedup cpu/reference: forward %.1fx backward %.1fx total %.1fx\n", t_fwd[1] / t_fwd[0],
         t_bwd[1] / t_bwd[0], (t_fwd[1] + t_bwd[1]) / (t_fwd[0] + t_bwd[0]));
  printf("agreement (normwise rel err): out %.2g dq %.2g dk_ctx %.2g dv_ctx %.2g dk_blk %.2g dv_blk %.2g\n",
         bench_rel_err(r[0].out, r[1].out, nq), bench_rel_err(r[0].dq, r[1].dq, nq),
         bench_rel_err(r[0].dkc, r[1].dkc, nc), bench_rel_err(r[0].dvc, r[1].dvc, nc),
         bench_rel_err(r[0].dkb, r[1].dkb, nb), bench_rel_err(r[0].dvb, r[1].dvb, nb));
  for (int k = 0; k < 2; k++) {
    free(r[k].out); free(r[k].lse); free(r[k].dq); free(r[k].dkc); free(r[k].dvc); free(r[k].dkb); free(r[k].dvb);
  }
  free(q); free(kc); free(vc); free(kb); free(vb); free(dout); free(ctx_len);
  return 0;
}
