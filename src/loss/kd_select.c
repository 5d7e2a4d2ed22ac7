/* KD capture of one position (spec/kd.md section 1): full-vocabulary log-probs of the teacher's
 * top-K ids, with the optional top-p prefix and its min_k floor (the one rule, shared with the KD
 * loss, which applies it again at training time). See include/dspark/cache.h. */
#include <math.h>
#include <stdint.h>

#include "dspark/backend.h"
#include "dspark/kd_select.h"
#include "nn/fast_exp.h"

/* Heap entries ordered so that the root is the WORST kept entry: lower value, or equal value
 * and larger id (ties keep the smaller id, so the result is a total order). */
static int worse(float va, int32_t ia, float vb, int32_t ib) { return va < vb || (va == vb && ia > ib); }

static void sift_down(float *v, int32_t *id, int64_t n, int64_t i) {
  for (;;) {
    int64_t l = 2 * i + 1, r = l + 1, w = i;
    if (l < n && worse(v[l], id[l], v[w], id[w])) w = l;
    if (r < n && worse(v[r], id[r], v[w], id[w])) w = r;
    if (w == i) return;
    float tv = v[i];
    int32_t ti = id[i];
    v[i] = v[w];
    id[i] = id[w];
    v[w] = tv;
    id[w] = ti;
    i = w;
  }
}

enum { LANES = 16, BLOCK = 256 };

static float max_of(const float *z, int64_t V) {
  float lane[LANES];
  for (int l = 0; l < LANES; l++) lane[l] = -INFINITY;
  int64_t i = 0;
  for (; i + LANES <= V; i += LANES)
    for (int l = 0; l < LANES; l++) lane[l] = z[i + l] > lane[l] ? z[i + l] : lane[l];
  float m = -INFINITY;
  for (int l = 0; l < LANES; l++) m = lane[l] > m ? lane[l] : m;
  for (; i < V; i++) m = z[i] > m ? z[i] : m;
  return m;
}

/* sum exp(z - m) with the engine's softmax exp (nn/fast_exp.h, ~2e-7 relative): fp32 lanes
 * over blocks of BLOCK values (16 terms per lane), the blocks summed in double. Written so
 * the compiler vectorizes it: the KD capture then costs a few percent of the forward. */
static double sum_exp(const float *z, int64_t V, float m) {
  double s = 0;
  int64_t i = 0;
  for (; i + BLOCK <= V; i += BLOCK) {
    float part[LANES] = {0};
    for (int64_t j = 0; j < BLOCK; j += LANES)
      for (int l = 0; l < LANES; l++) part[l] += ds_fast_expf(z[i + j + l] - m);
    for (int l = 0; l < LANES; l++) s += (double)part[l];
  }
  for (; i < V; i++) s += (double)ds_fast_expf(z[i] - m);
  return s;
}

static int count_above(const float *z, int64_t n, float thr) {
  int c = 0;
  for (int64_t l = 0; l < n; l++) c += z[l] > thr;
  return c;
}

int64_t ds_kd_select(const float *x, int64_t V, double temperature, int64_t K, double top_p, int64_t min_k,
                     float *scratch, int32_t *ids, float *lp) {
  /* z = x / T (x itself at T = 1) and lse = logsumexp(z) over the whole vocabulary. */
  const float *z = x;
  if (temperature != 1.0) {
    float inv_t = (float)(1.0 / temperature);
    for (int64_t i = 0; i < V; i++) scratch[i] = x[i] * inv_t;
    z = scratch;
  }
  float zmax = max_of(z, V);
  double lse = (double)zmax + log(sum_exp(z, V, zmax));

  /* Top-K by a min-heap of the K best so far: O(V log K). lp doubles as the heap's values.
   * Ids are scanned in increasing order, so a later value equal to the root's never beats it:
   * only z > root counts, and a block of values all below the root is skipped at once. */
  for (int64_t i = 0; i < K; i++) {
    lp[i] = z[i];
    ids[i] = (int32_t)i;
  }
  for (int64_t i = K / 2 - 1; i >= 0; i--) sift_down(lp, ids, K, i);
  for (int64_t i = K; i < V;) {
    int64_t stop = i + BLOCK <= V ? i + BLOCK : V;
    if (!count_above(z + i, stop - i, lp[0])) {
      i = stop;
      continue;
    }
    for (; i < stop; i++)
      if (z[i] > lp[0]) {
        lp[0] = z[i];
        ids[0] = (int32_t)i;
        sift_down(lp, ids, K, 0);
      }
  }
  /* Heap sort: repeatedly move the worst to the end -> best first. */
  for (int64_t n = K - 1; n > 0; n--) {
    float tv = lp[0];
    int32_t ti = ids[0];
    lp[0] = lp[n];
    ids[0] = ids[n];
    lp[n] = tv;
    ids[n] = ti;
    sift_down(lp, ids, n, 0);
  }
  for (int64_t i = 0; i < K; i++) lp[i] = (float)((double)lp[i] - lse);

  /* Top-p prefix with the min_k floor (top-1 always kept); 1 disables it. */
  int64_t kept = ds_kd_top_p_count(lp, K, top_p, min_k);
  for (int64_t i = kept; i < K; i++) {
    ids[i] = -1;
    lp[i] = -INFINITY;
  }
  return kept;
}

int64_t ds_kd_top_p_count(const float *lp, int64_t n, double top_p, int64_t min_k) {
  if (!(top_p < 1.0)) return n;
  int64_t floor_k = min_k > 1 ? min_k : 1;
  double cum = 0;
  for (int64_t i = 0; i < n; i++) {
    if (!(cum < top_p || i < floor_k)) return i;
    cum += exp((double)lp[i]);
  }
  return n;
}

void ds_kd_teacher_select(const float *hidden, int64_t n, int64_t d, ds_weight head, int64_t V, double temperature,
                          int64_t K, double top_p, int64_t min_k, float *logits, float *scratch, int32_t *ids,
                          float *lp, double *t_product, double *t_select) {
  for (int64_t r = 0; r < n; r += DS_KD_TEACHER_ROWS) {
    int64_t rows = n - r < DS_KD_TEACHER_ROWS ? n - r : DS_KD_TEACHER_ROWS;
    double t0 = ds_time_sec();
    ds_backend_cpu()->linear_w(logits, V, hidden + r * d, head, NULL, rows, d, V);
    double t1 = ds_time_sec();
    if (t_product) *t_product += t1 - t0;
    if (!ids) continue;
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < rows; k++)
      ds_kd_select(logits + k * V, V, temperature, K, top_p, min_k, scratch + k * V, ids + (r + k) * K,
                   lp + (r + k) * K);
    if (t_select) *t_select += ds_time_sec() - t1;
  }
}

ds_status ds_kd_select_check(int64_t top_k, int k_is_option, double top_p, int64_t min_k, double temperature,
                             int64_t vocab) {
  if (!(temperature > 0.0) || isinf(temperature))
    return DS_FAIL(DS_ERR_ARG, "--temperature %g must be finite and > 0", temperature);
  if (!(top_p > 0.0 && top_p <= 1.0))
    return DS_FAIL(DS_ERR_ARG, "--top-p %g is outside (0, 1] (1 keeps every entry)", top_p);
  if (top_k < 0) return DS_FAIL(DS_ERR_ARG, "--topk %lld must be >= 1 (or absent: dense KL)", (long long)top_k);
  if (vocab > 0 && top_k > vocab)
    return DS_FAIL(DS_ERR_ARG, "--topk %lld exceeds the vocabulary size %lld", (long long)top_k, (long long)vocab);
  if (top_k == 0 && top_p < 1.0)
    return DS_FAIL(DS_ERR_ARG, "--top-p %g needs --topk: top-p truncates the teacher's top-K entries, and the "
                   "dense KL (no top-K) has none", top_p);
  if (min_k < 1) return DS_FAIL(DS_ERR_ARG, "--min-k %lld must be >= 1", (long long)min_k);
  if (k_is_option && top_k > 0 && min_k > top_k)
    return DS_FAIL(DS_ERR_ARG, "--min-k %lld exceeds --topk %lld (the floor of the entries kept out of the top K)",
                   (long long)min_k, (long long)top_k);
  return DS_OK;
}
