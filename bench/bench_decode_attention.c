/* Decoding's attention over a KV cache: one new query (or a few, as a verification) against
 * `past` cached keys, for every layer of a model, each layer its own cache so that a token's
 * keys and values come from memory as in real decoding (SmolLM2-135M's 30 layers hold 46 KiB of
 * fp32 keys and values a token: 94 MB a token at 2048, past the L3 of the CPUs measured).
 *   bench_decode_attention [threads (2)] [rows (1)] [past,past,... (256,512,2048,4096)]
 *     [layers (30)] [heads (9)] [kv_heads (3)] [head_dim (64)] [f32|f16 (f32): the cache's type]
 *     [warm|cold (warm)]
 * cold: a 64 MiB read on the same threads before each layer's call (untimed), as a decoding
 * step's weights pass through the caches between two layers' attention; the caches' bytes then
 * come from memory as in real decoding even when they would fit in the L3.
 * Prints per context length: ms per token (all layers, best of 5 tokens), the keys' and values'
 * GB/s, and their share of this machine's streaming read rate (a sum over a 512 MiB buffer on the
 * same threads, best of 3), and the agreement with the reference backend (normwise). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/backend.h"
#include "dspark/dtype.h"
#include "dspark/rng.h"
#include "bench_util.h"
#include "stream_read.h"

static float *buf(size_t n, ds_rng *r) {
  float *p = malloc(n * sizeof(float));
  if (!p) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  for (size_t i = 0; i < n; i++) p[i] = r ? 2.0f * ds_rng_uniform_f32(r) - 1.0f : 1.0f; /* touched: no zero page */
  return p;
}

/* GB/s of reading a 512 MiB buffer (bench/stream_read.h), best of 3. */
static double stream_rate(void) {
  size_t n = (size_t)128 << 20;
  float *a = buf(n, NULL);
  double best = 1e30;
  for (int rep = 0; rep < 3; rep++) {
    double dt = stream_read_seconds(a, (int64_t)n);
    best = dt < best ? dt : best;
  }
  free(a);
  return (double)n * sizeof(float) / best / 1e9;
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 2;
  int64_t rows = argc > 2 ? atoll(argv[2]) : 1;
  const char *pasts = argc > 3 ? argv[3] : "256,512,2048,4096";
  int64_t layers = argc > 4 ? atoll(argv[4]) : 30, nh = argc > 5 ? atoll(argv[5]) : 9;
  int64_t nkv = argc > 6 ? atoll(argv[6]) : 3, hd = argc > 7 ? atoll(argv[7]) : 64;
  int f16 = argc > 8 && !strcmp(argv[8], "f16"), cold = argc > 9 && !strcmp(argv[9], "cold");
  if (threads <= 0 || rows <= 0 || layers <= 0 || nkv <= 0 || nh % nkv || hd <= 0) {
    fprintf(stderr, "usage: bench_decode_attention [threads] [rows] [past,...] [layers] [heads] [kv_heads] "
                    "[head_dim] [f32|f16] [warm|cold]\n");
    return 2;
  }
  ds_set_num_threads(threads);
  double gbs = stream_rate();
  size_t n_evict = (size_t)16 << 20; /* 64 MiB of floats */
  float *evict = cold ? buf(n_evict, NULL) : NULL;
  printf("decode attention: %lld layers, %lld query row(s), %lld heads over %lld kv heads, head_dim %lld, %s cache, "
         "%d threads, %s; streaming read %.1f GB/s\n",
         (long long)layers, (long long)rows, (long long)nh, (long long)nkv, (long long)hd, f16 ? "f16" : "fp32",
         ds_get_num_threads(), cold ? "64 MiB read before each layer" : "caches warm", gbs);
  printf("| past | ms a token | KV GB/s | share of the streaming rate | rel err vs reference |\n|---|---|---|---|---|\n");
  float scale = 1.0f / sqrtf((float)hd);
  char *list = strdup(pasts);
  for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
    int64_t past = atoll(tok), cap = past + rows;
    ds_rng rng;
    ds_rng_seed(&rng, 11);
    size_t per = (size_t)(nkv * cap * hd);
    float **k = malloc((size_t)layers * sizeof *k), **v = malloc((size_t)layers * sizeof *v);
    uint16_t **k16 = malloc((size_t)layers * sizeof *k16), **v16 = malloc((size_t)layers * sizeof *v16);
    for (int64_t l = 0; l < layers; l++) {
      k[l] = buf(per, &rng), v[l] = buf(per, &rng);
      k16[l] = v16[l] = NULL;
      if (f16) { /* the cache as an f16 cache holds it; the fp32 copy then holds the rounded values */
        k16[l] = malloc(per * sizeof(uint16_t)), v16[l] = malloc(per * sizeof(uint16_t));
        ds_backend_cpu()->copy_rows_f16(k16[l], (int64_t)per, k[l], (int64_t)per, 1, (int64_t)per);
        ds_backend_cpu()->copy_rows_f16(v16[l], (int64_t)per, v[l], (int64_t)per, 1, (int64_t)per);
        for (size_t e = 0; e < per; e++) k[l][e] = ds_f16_to_f32(k16[l][e]), v[l][e] = ds_f16_to_f32(v16[l][e]);
      }
    }
    float *q = buf((size_t)(rows * nh * hd), &rng), *out = buf((size_t)(rows * nh * hd), NULL);
    float *ref = buf((size_t)(rows * nh * hd), NULL);
    double best = 1e30;
    for (int rep = 0; rep < 6; rep++) { /* the first a warm-up */
      double dt = 0.0;
      for (int64_t l = 0; l < layers; l++) {
        if (cold) (void)stream_read_seconds(evict, (int64_t)n_evict);
        double t0 = ds_time_sec();
        if (f16)
          ds_backend_cpu()->attention_causal_f16(out, q, nh * hd, k16[l], v16[l], rows, past, cap, nh, nkv, hd, scale);
        else
          ds_backend_cpu()->attention_causal(out, q, nh * hd, k[l], v[l], rows, past, cap, nh, nkv, hd, scale);
        dt += ds_time_sec() - t0;
      }
      if (rep) best = dt < best ? dt : best;
    }
    ds_backend_reference()->attention_causal(ref, q, nh * hd, k[layers - 1], v[layers - 1], rows, past, cap, nh, nkv,
                                             hd, scale);
    double bytes = 2.0 * (double)layers * (double)nkv * (double)(past + rows) * (double)hd * (f16 ? 2.0 : 4.0);
    printf("| %lld | %.3f | %.1f | %.0f%% | %.2g |\n", (long long)past, best * 1e3, bytes / best / 1e9,
           100.0 * bytes / best / 1e9 / gbs, bench_rel_err(out, ref, (size_t)(rows * nh * hd)));
    for (int64_t l = 0; l < layers; l++) free(k[l]), free(v[l]), free(k16[l]), free(v16[l]);
    free(k), free(v), free(k16), free(v16), free(q), free(out), free(ref);
  }
  free(list);
  free(evict);
  return 0;
}
