/* The CUDA backend's kernels timed at the shapes of a real draft step (issue 14): a
 * Qwen3-4B-sized draft, d = 2560, vocabulary 151936, 512 anchors x 7 slots = 3584 rows, 32
 * query heads over 8 kv heads of 128, intermediate 9728, context 2048. bench/gpu_kernels.py
 * runs it beside the same operations in PyTorch on the same GPU and prints the table.
 *   bench_cuda_kernels [reps (10)]
 * One JSON object per line: {"op", "mode" (fp32 | bf16: ds_cuda_set_bf16_gemm), "shape", "ms"
 * (mean of reps after 2 warm-up calls, kernels synchronized), "tflops"}. Flops count the
 * matmuls only: linear 2*n*in*out, its backward (dx and dw) twice that; attention 4*head_dim
 * per visible (query, key, head) forward and 10*head_dim backward (bench_block_attention.c).
 * The attentions run in both modes too (bf16: their GEMMs on bf16 inputs), attention_causal
 * against a KV cache at decode (1 query), verify (8) and prefill (2048) shapes; the few-query
 * shapes twice, on the flash kernel and on the GEMM path (DSPARK_CUDA_ATTN_FLASH_KEYS forces
 * one: the threshold between them in src/nn/cuda/cuda_attention.cu is set from these rows).
 * Exits 2 without a CUDA backend (a build without DSPARK_CUDA, or no device). */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <stdio.h>
#include <stdlib.h>

#include "dspark/backend.h"
#include "dspark/common.h"
#include "dspark/rng.h"

static const ds_backend *g;
static float *g_host; /* random values, as many as the largest buffer */
static size_t g_host_n;

static float *dev(size_t n) {
  float *p = g->alloc(n * sizeof(float), "bench buffer");
  if (!p) {
    fprintf(stderr, "bench_cuda_kernels: %s\n", ds_last_error());
    exit(1);
  }
  g->copy_to_device(p, g_host, (n < g_host_n ? n : g_host_n) * sizeof(float));
  return p;
}

static void report(const char *op, const char *mode, const char *shape, double sec, double flops) {
  printf("{\"op\": \"%s\", \"mode\": \"%s\", \"shape\": \"%s\", \"ms\": %.4f, \"tflops\": %.2f}\n", op, mode, shape,
         sec * 1e3, flops / sec / 1e12);
  fflush(stdout);
}

typedef struct {
  int64_t n, in, out;
  const char *name;
} lin_shape;

/* Each call of fn timed as one: 2 warm-up runs, then the mean of reps. */
#define TIME_IT(reps, sec, call)                                                                                       \
  do {                                                                                                                 \
    for (int w_ = 0; w_ < 2; w_++) call;                                                                               \
    g->synchronize();                                                                                                  \
    double t0_ = ds_time_sec();                                                                                        \
    for (int r_ = 0; r_ < (reps); r_++) call;                                                                          \
    g->synchronize();                                                                                                  \
    (sec) = (ds_time_sec() - t0_) / (reps);                                                                            \
  } while (0)

static void bench_linear(int reps) {
  const lin_shape shapes[] = {{3584, 2560, 151936, "lm_head"},
                              {3584, 2560, 4096, "q_proj"},
                              {3584, 2560, 19456, "gate_up"},
                              {3584, 9728, 2560, "down"}};
  for (int bf16 = 0; bf16 < 2; bf16++) {
    ds_cuda_set_bf16_gemm(bf16);
    const char *mode = bf16 ? "bf16" : "fp32";
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
      int64_t n = shapes[s].n, in = shapes[s].in, out = shapes[s].out;
      float *x = dev((size_t)(n * in)), *w = dev((size_t)(out * in)), *y = dev((size_t)(n * out));
      float *dx = dev((size_t)(n * in)), *dw = dev((size_t)(out * in));
      char shape[96];
      snprintf(shape, sizeof shape, "%s %lldx%lld @ %lldx%lld^T", shapes[s].name, (long long)n, (long long)in,
               (long long)out, (long long)in);
      double sec, flops = 2.0 * (double)n * (double)in * (double)out;
      TIME_IT(reps, sec, g->linear(y, x, w, NULL, n, in, out));
      report("linear", mode, shape, sec, flops);
      TIME_IT(reps, sec, g->linear_backward(dx, dw, NULL, y, x, w, n, in, out));
      report("linear_backward", mode, shape, sec, 2 * flops);
      g->free(x), g->free(w), g->free(y), g->free(dx), g->free(dw);
    }
  }
  ds_cuda_set_bf16_gemm(0);
}

/* attention_causal: n new queries after past cached keys, cache [KV, cap, hd]; with few
 * queries once per path ("[flash]" / "[gemm]" in the shape). */
static void bench_decode(int reps, const char *mode) {
  const int64_t H = 32, KV = 8, hd = 128, cap = 4096;
  const float scale = 0.08838834764831845f;
  const int64_t cases[][2] = {{1, 2047}, {8, 2040}, {8, 200}, {2048, 0}}; /* {n, past} */
  float *k = dev((size_t)(KV * cap * hd)), *v = dev((size_t)(KV * cap * hd));
  float *q = dev((size_t)(2048 * H * hd)), *o = dev((size_t)(2048 * H * hd));
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    int64_t n = cases[c][0], past = cases[c][1];
    double pairs = (double)H * ((double)n * (double)past + (double)n * (double)(n + 1) / 2), sec;
    for (int path = 0; path < (n <= 16 ? 2 : 1); path++) {
      const char *tag = n > 16 ? "" : path ? " [gemm]" : " [flash]";
      if (n <= 16) setenv("DSPARK_CUDA_ATTN_FLASH_KEYS", path ? "0" : "1000000000", 1);
      char shape[112];
      snprintf(shape, sizeof shape, "%lld new after %lld cached, heads %lld/%lld, hd %lld%s", (long long)n,
               (long long)past, (long long)H, (long long)KV, (long long)hd, tag);
      TIME_IT(reps, sec, g->attention_causal(o, q, H * hd, k, v, n, past, cap, H, KV, hd, scale));
      report("attention_causal", mode, shape, sec, 4.0 * (double)hd * pairs);
      unsetenv("DSPARK_CUDA_ATTN_FLASH_KEYS");
    }
  }
  g->free(k), g->free(v), g->free(q), g->free(o);
}

static void bench_attention(int reps, const char *mode) {
  const int64_t H = 32, KV = 8, hd = 128, L = 2048, n_seqs = 2;
  const float scale = 0.08838834764831845f; /* 1 / sqrt(128) */
  /* causal, whole sequences (target prefill, student training) */
  int64_t off[3] = {0, L, 2 * L}, rows = n_seqs * L;
  float *q = dev((size_t)(rows * H * hd)), *k = dev((size_t)(rows * KV * hd)), *v = dev((size_t)(rows * KV * hd));
  float *o = dev((size_t)(rows * H * hd)), *lse = dev((size_t)(rows * H)), *dout = dev((size_t)(rows * H * hd));
  float *dq = dev((size_t)(rows * H * hd)), *dk = dev((size_t)(rows * KV * hd)), *dv = dev((size_t)(rows * KV * hd));
  double pairs = (double)n_seqs * (double)L * (double)(L + 1) / 2 * (double)H, sec;
  char shape[96];
  snprintf(shape, sizeof shape, "%lld seqs x %lld, heads %lld/%lld, hd %lld", (long long)n_seqs, (long long)L,
           (long long)H, (long long)KV, (long long)hd);
  TIME_IT(reps, sec, g->attention_causal_train(o, lse, q, k, v, off, n_seqs, H, KV, hd, scale));
  report("attention_causal_train", mode, shape, sec, 4.0 * (double)hd * pairs);
  TIME_IT(reps, sec,
          g->attention_causal_train_backward(dq, dk, dv, dout, o, lse, q, k, v, off, n_seqs, H, KV, hd, scale));
  report("attention_causal_train_backward", mode, shape, sec, 10.0 * (double)hd * pairs);
  g->free(q), g->free(k), g->free(v), g->free(o), g->free(lse), g->free(dout), g->free(dq), g->free(dk), g->free(dv);

  /* the draft's block attention: 512 blocks of 7 over a 2048-token context */
  const int64_t nb = 512, gs = 7, brows = nb * gs;
  int64_t *ctx = malloc((size_t)nb * sizeof *ctx);
  ds_rng rng;
  ds_rng_seed(&rng, 3);
  double bpairs = 0;
  for (int64_t b = 0; b < nb; b++) {
    ctx[b] = 1 + (int64_t)(ds_rng_uniform_f32(&rng) * (float)(L - 1));
    bpairs += (double)gs * (double)(ctx[b] + gs) * (double)H;
  }
  q = dev((size_t)(brows * H * hd));
  float *kc = dev((size_t)(L * KV * hd)), *vc = dev((size_t)(L * KV * hd));
  float *kb = dev((size_t)(brows * KV * hd)), *vb = dev((size_t)(brows * KV * hd));
  o = dev((size_t)(brows * H * hd)), lse = dev((size_t)(brows * H)), dout = dev((size_t)(brows * H * hd));
  dq = dev((size_t)(brows * H * hd));
  float *dkc = dev((size_t)(L * KV * hd)), *dvc = dev((size_t)(L * KV * hd));
  float *dkb = dev((size_t)(brows * KV * hd)), *dvb = dev((size_t)(brows * KV * hd));
  snprintf(shape, sizeof shape, "%lld blocks x %lld, ctx %lld, heads %lld/%lld, hd %lld", (long long)nb,
           (long long)gs, (long long)L, (long long)H, (long long)KV, (long long)hd);
  TIME_IT(reps, sec, g->block_attention(o, lse, q, kc, vc, kb, vb, ctx, L, nb, gs, H, KV, hd, scale));
  report("block_attention", mode, shape, sec, 4.0 * (double)hd * bpairs);
  TIME_IT(reps, sec,
          g->block_attention_backward(dq, dkc, dvc, dkb, dvb, dout, o, lse, q, kc, vc, kb, vb, ctx, L, nb, gs, H, KV,
                                      hd, scale));
  report("block_attention_backward", mode, shape, sec, 10.0 * (double)hd * bpairs);
  g->free(q), g->free(kc), g->free(vc), g->free(kb), g->free(vb), g->free(o), g->free(lse), g->free(dout);
  g->free(dq), g->free(dkc), g->free(dvc), g->free(dkb), g->free(dvb);
  free(ctx);
}

int main(int argc, char **argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 10;
  if (reps < 1) reps = 1;
  g = ds_backend_cuda();
  if (!g) {
    fprintf(stderr, "bench_cuda_kernels: no CUDA backend: %s\n", ds_last_error());
    return 2;
  }
  g_host_n = (size_t)151936 * 2560;
  g_host = malloc(g_host_n * sizeof(float));
  if (!g_host) {
    fprintf(stderr, "bench_cuda_kernels: out of host memory\n");
    return 1;
  }
  ds_rng rng;
  ds_rng_seed(&rng, 1);
  for (size_t i = 0; i < g_host_n; i++) g_host[i] = ds_rng_uniform_f32(&rng) - 0.5f;
  bench_linear(reps);
  for (int bf16 = 0; bf16 < 2; bf16++) {
    ds_cuda_set_bf16_gemm(bf16);
    bench_attention(reps, bf16 ? "bf16" : "fp32");
    bench_decode(reps, bf16 ? "bf16" : "fp32");
  }
  ds_cuda_set_bf16_gemm(0);
  free(g_host);
  return 0;
}
