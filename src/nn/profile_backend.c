#include "dspark/profile.h"

static const ds_backend *g_inner;
static ds_profile *g_prof;

static void account(ds_kernel_kind k, double t0, double flops) {
  g_prof->calls[k]++;
  g_prof->seconds[k] += ds_time_sec() - t0;
  g_prof->flops[k] += flops;
}

static void p_linear(float *y, const float *x, const float *w, const float *bias, int64_t n, int64_t in, int64_t out) {
  double t0 = ds_time_sec();
  g_inner->linear(y, x, w, bias, n, in, out);
  account(DS_KERNEL_LINEAR, t0, 2.0 * (double)n * (double)in * (double)out);
}

static void p_rmsnorm(float *y, float *rstd, const float *x, const float *w, int64_t n, int64_t d, float eps) {
  double t0 = ds_time_sec();
  g_inner->rmsnorm(y, rstd, x, w, n, d, eps);
  account(DS_KERNEL_RMSNORM, t0, 4.0 * (double)n * (double)d);
}

static void p_rope(float *x, int64_t stride, const int64_t *pos, const float *inv_freq, int64_t n, int64_t heads,
                   int64_t head_dim) {
  double t0 = ds_time_sec();
  g_inner->rope(x, stride, pos, inv_freq, n, heads, head_dim);
  account(DS_KERNEL_ROPE, t0, 3.0 * (double)n * (double)heads * (double)head_dim);
}

static void p_attention(float *out, const float *q, int64_t q_stride, const float *k, const float *v, int64_t n,
                        int64_t past, int64_t cap, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale) {
  double t0 = ds_time_sec();
  g_inner->attention_causal(out, q, q_stride, k, v, n, past, cap, n_heads, n_kv_heads, head_dim, scale);
  /* QK^T and PV over the visible keys: 2 * 2 * head_dim per (query, key, head). */
  double pairs = (double)n * (double)past + (double)n * (double)(n + 1) / 2.0;
  account(DS_KERNEL_ATTENTION, t0, 4.0 * pairs * (double)n_heads * (double)head_dim);
}

static void p_swiglu(float *out, const float *gu, int64_t n, int64_t inter) {
  double t0 = ds_time_sec();
  g_inner->swiglu(out, gu, n, inter);
  account(DS_KERNEL_SWIGLU, t0, 5.0 * (double)n * (double)inter);
}

static void p_add(float *y, const float *x, int64_t n) {
  double t0 = ds_time_sec();
  g_inner->add(y, x, n);
  account(DS_KERNEL_ADD, t0, (double)n);
}

static ds_backend g_profiled = {
    .name = "profiled",
    .linear = p_linear,
    .rmsnorm = p_rmsnorm,
    .rope = p_rope,
    .attention_causal = p_attention,
    .swiglu = p_swiglu,
    .add = p_add,
};

const ds_backend *ds_backend_profiled(const ds_backend *inner, ds_profile *prof) {
  g_inner = inner;
  g_prof = prof;
  return &g_profiled;
}

void ds_profile_print(const ds_profile *p, double total_seconds, FILE *f) {
  static const char *names[DS_KERNEL_COUNT] = {"linear", "rmsnorm", "rope", "attention", "swiglu", "add"};
  double accounted = 0;
  for (int k = 0; k < DS_KERNEL_COUNT; k++) accounted += p->seconds[k];
  fprintf(f, "%-10s %8s %10s %7s %10s\n", "kernel", "calls", "seconds", "share", "GFLOP/s");
  for (int k = 0; k < DS_KERNEL_COUNT; k++) {
    if (!p->calls[k]) continue;
    fprintf(f, "%-10s %8lld %10.4f %6.1f%% %10.2f\n", names[k], (long long)p->calls[k], p->seconds[k],
            100.0 * p->seconds[k] / (total_seconds > 0 ? total_seconds : 1), p->flops[k] / (p->seconds[k] > 0 ? p->seconds[k] : 1e-12) / 1e9);
  }
  fprintf(f, "%-10s %8s %10.4f %6.1f%%\n", "other", "", total_seconds - accounted,
          100.0 * (total_seconds - accounted) / (total_seconds > 0 ? total_seconds : 1));
}
