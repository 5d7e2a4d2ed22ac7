#include "dspark/profile.h"
#include "nn/cpu_quant.h"

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

static void p_attention_seqs(float *out, const float *q, int64_t q_stride, const void *const *k, const void *const *v,
                             int f16, const int64_t *n, const int64_t *past, const int64_t *cap, int n_seqs,
                             int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale) {
  double t0 = ds_time_sec(), pairs = 0;
  g_inner->attention_causal_seqs(out, q, q_stride, k, v, f16, n, past, cap, n_seqs, n_heads, n_kv_heads, head_dim,
                                 scale);
  for (int s = 0; s < n_seqs; s++) pairs += (double)n[s] * (double)past[s] + (double)n[s] * (double)(n[s] + 1) / 2.0;
  account(DS_KERNEL_ATTENTION, t0, 4.0 * pairs * (double)n_heads * (double)head_dim);
}

static void p_attention_f16(float *out, const float *q, int64_t q_stride, const uint16_t *k, const uint16_t *v,
                            int64_t n, int64_t past, int64_t cap, int64_t n_heads, int64_t n_kv_heads,
                            int64_t head_dim, float scale) {
  double t0 = ds_time_sec();
  g_inner->attention_causal_f16(out, q, q_stride, k, v, n, past, cap, n_heads, n_kv_heads, head_dim, scale);
  double pairs = (double)n * (double)past + (double)n * (double)(n + 1) / 2.0;
  account(DS_KERNEL_ATTENTION, t0, 4.0 * pairs * (double)n_heads * (double)head_dim);
}

static void p_copy_rows_f16(uint16_t *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows,
                            int64_t cols) {
  g_inner->copy_rows_f16(dst, ld_dst, src, ld_src, rows, cols);
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

static void p_linear_backward(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w,
                              int64_t n, int64_t in, int64_t out) {
  double t0 = ds_time_sec();
  g_inner->linear_backward(dx, dw, db, dy, x, w, n, in, out);
  double mm = 2.0 * (double)n * (double)in * (double)out;
  account(DS_KERNEL_LINEAR_BWD, t0, (dx ? mm : 0) + (dw ? mm : 0) + (db ? (double)n * (double)out : 0));
}

static void p_rmsnorm_backward(float *dx, float *dw, const float *dy, const float *x, const float *w,
                               const float *rstd, int64_t n, int64_t d) {
  double t0 = ds_time_sec();
  g_inner->rmsnorm_backward(dx, dw, dy, x, w, rstd, n, d);
  account(DS_KERNEL_RMSNORM_BWD, t0, ((dx ? 7.0 : 0) + (dw ? 3.0 : 0)) * (double)n * (double)d);
}

static void p_rope_backward(float *dx, int64_t stride, const int64_t *pos, const float *inv_freq, int64_t n,
                            int64_t heads, int64_t head_dim) {
  double t0 = ds_time_sec();
  g_inner->rope_backward(dx, stride, pos, inv_freq, n, heads, head_dim);
  account(DS_KERNEL_ROPE_BWD, t0, 3.0 * (double)n * (double)heads * (double)head_dim);
}

static void p_swiglu_backward(float *dgu, const float *dout, const float *gu, int64_t n, int64_t inter) {
  double t0 = ds_time_sec();
  g_inner->swiglu_backward(dgu, dout, gu, n, inter);
  account(DS_KERNEL_SWIGLU_BWD, t0, 12.0 * (double)n * (double)inter);
}

/* Frozen-weight matmuls: F32 weights count as "linear", BF16 / F16 as "linear16". */
static void p_linear_w(float *y, int64_t ldy, const float *x, ds_weight w, const float *bias, int64_t n, int64_t in,
                       int64_t out) {
  double t0 = ds_time_sec();
  g_inner->linear_w(y, ldy, x, w, bias, n, in, out);
  account(w.dtype == DS_F32 ? DS_KERNEL_LINEAR : DS_KERNEL_LINEAR16, t0, 2.0 * (double)n * (double)in * (double)out);
}

static void p_rmsnorm_heads(float *x, int64_t stride, const float *w, int64_t n, int64_t heads, int64_t head_dim,
                            float eps) {
  double t0 = ds_time_sec();
  g_inner->rmsnorm_heads(x, stride, w, n, heads, head_dim, eps);
  account(DS_KERNEL_RMSNORM, t0, 4.0 * (double)n * (double)heads * (double)head_dim);
}

static void p_linear_w_cat(float *y, int64_t ldy, const float *x, const ds_weight *w, const int64_t *out, int n_seg,
                           const float *bias, int64_t n, int64_t in) {
  double t0 = ds_time_sec();
  g_inner->linear_w_cat(y, ldy, x, w, out, n_seg, bias, n, in);
  int64_t total = 0;
  for (int s = 0; s < n_seg; s++) total += out[s];
  account(n_seg > 0 && w[0].dtype == DS_F32 ? DS_KERNEL_LINEAR : DS_KERNEL_LINEAR16, t0,
          2.0 * (double)n * (double)in * (double)total);
}

static void p_linear_w_backward(float *dx, const float *dy, ds_weight w, int64_t n, int64_t in, int64_t out) {
  double t0 = ds_time_sec();
  g_inner->linear_w_backward(dx, dy, w, n, in, out);
  account(w.dtype == DS_F32 ? DS_KERNEL_LINEAR_BWD : DS_KERNEL_LINEAR16_BWD, t0,
          2.0 * (double)n * (double)in * (double)out);
}

static void p_embedding_w(float *y, const int32_t *ids, ds_weight table, int64_t n, int64_t d) {
  double t0 = ds_time_sec();
  g_inner->embedding_w(y, ids, table, n, d);
  account(DS_KERNEL_EMBEDDING_W, t0, 0.0);
}

/* (query row, visible key) pairs of a block attention call, over all query heads. */
static double block_attn_pairs(const int64_t *ctx_len, int64_t n_blocks, int64_t g, int64_t n_heads) {
  double pairs = 0;
  for (int64_t b = 0; b < n_blocks; b++)
    if (ctx_len[b] >= 0) pairs += (double)(ctx_len[b] + g) * (double)g;
  return pairs * (double)n_heads;
}

static void p_block_attention(float *out, float *lse, const float *q, const float *k_ctx, const float *v_ctx,
                              const float *k_blk, const float *v_blk, const int64_t *ctx_len, int64_t n_ctx,
                              int64_t n_blocks, int64_t g, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                              float scale) {
  double t0 = ds_time_sec();
  g_inner->block_attention(out, lse, q, k_ctx, v_ctx, k_blk, v_blk, ctx_len, n_ctx, n_blocks, g, n_heads, n_kv_heads,
                           head_dim, scale);
  /* QK^T and PV: 2 matmuls of 2 * head_dim flops per pair. */
  account(DS_KERNEL_BLOCK_ATTN, t0, 4.0 * (double)head_dim * block_attn_pairs(ctx_len, n_blocks, g, n_heads));
}

static void p_block_attention_backward(float *dq, float *dk_ctx, float *dv_ctx, float *dk_blk, float *dv_blk,
                                       const float *dout, const float *out, const float *lse, const float *q,
                                       const float *k_ctx, const float *v_ctx, const float *k_blk, const float *v_blk,
                                       const int64_t *ctx_len, int64_t n_ctx, int64_t n_blocks, int64_t g,
                                       int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale) {
  double t0 = ds_time_sec();
  g_inner->block_attention_backward(dq, dk_ctx, dv_ctx, dk_blk, dv_blk, dout, out, lse, q, k_ctx, v_ctx, k_blk, v_blk,
                                    ctx_len, n_ctx, n_blocks, g, n_heads, n_kv_heads, head_dim, scale);
  /* Recomputed QK^T, dO V^T, dS K, dS^T Q, P^T dO: 5 matmuls. */
  account(DS_KERNEL_BLOCK_ATTN_BWD, t0, 10.0 * (double)head_dim * block_attn_pairs(ctx_len, n_blocks, g, n_heads));
}

/* (query, visible key) pairs of a causal attention call over packed sequences, all heads. */
static double causal_pairs(const int64_t *seq_off, int64_t n_seqs, int64_t n_heads) {
  double pairs = 0;
  for (int64_t s = 0; s < n_seqs; s++) {
    double n = (double)(seq_off[s + 1] - seq_off[s]);
    pairs += n * (n + 1) / 2;
  }
  return pairs * (double)n_heads;
}

static void p_attention_causal_train(float *out, float *lse, const float *q, const float *k, const float *v,
                                     const int64_t *seq_off, int64_t n_seqs, int64_t n_heads, int64_t n_kv_heads,
                                     int64_t head_dim, float scale) {
  double t0 = ds_time_sec();
  g_inner->attention_causal_train(out, lse, q, k, v, seq_off, n_seqs, n_heads, n_kv_heads, head_dim, scale);
  account(DS_KERNEL_CAUSAL_ATTN, t0, 4.0 * (double)head_dim * causal_pairs(seq_off, n_seqs, n_heads));
}

static void p_attention_causal_train_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                              const float *lse, const float *q, const float *k, const float *v,
                                              const int64_t *seq_off, int64_t n_seqs, int64_t n_heads,
                                              int64_t n_kv_heads, int64_t head_dim, float scale) {
  double t0 = ds_time_sec();
  g_inner->attention_causal_train_backward(dq, dk, dv, dout, out, lse, q, k, v, seq_off, n_seqs, n_heads, n_kv_heads,
                                           head_dim, scale);
  /* Recomputed QK^T, dO V^T, dS K, dS^T Q, P^T dO: 5 matmuls. */
  account(DS_KERNEL_CAUSAL_ATTN_BWD, t0, 10.0 * (double)head_dim * causal_pairs(seq_off, n_seqs, n_heads));
}

static void p_embedding(float *out, const float *table, const int32_t *ids, int64_t n, int64_t d) {
  double t0 = ds_time_sec();
  g_inner->embedding(out, table, ids, n, d);
  account(DS_KERNEL_EMBEDDING, t0, 0.0);
}

static void p_embedding_backward(float *dtable, const float *dout, const int32_t *ids, int64_t n, int64_t d,
                                 int64_t skip_id) {
  double t0 = ds_time_sec();
  g_inner->embedding_backward(dtable, dout, ids, n, d, skip_id);
  account(DS_KERNEL_EMBEDDING_BWD, t0, (double)n * (double)d);
}

/* Memory entries pass straight through: they are not kernels and are not timed. */
static void *p_alloc(size_t nbytes, const char *what) { return g_inner->alloc(nbytes, what); }
static void p_free(void *p) { g_inner->free(p); }
static void p_copy_to_device(void *dst, const void *src, size_t nbytes) { g_inner->copy_to_device(dst, src, nbytes); }
static void p_copy_to_host(void *dst, const void *src, size_t nbytes) { g_inner->copy_to_host(dst, src, nbytes); }
static void p_copy(void *dst, const void *src, size_t nbytes) { g_inner->copy(dst, src, nbytes); }
static void p_copy_rows(float *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows, int64_t cols) {
  g_inner->copy_rows(dst, ld_dst, src, ld_src, rows, cols);
}
static void p_memset_zero(void *p, size_t nbytes) { g_inner->memset_zero(p, nbytes); }
static void p_synchronize(void) { g_inner->synchronize(); }
static void p_operand_hold(const float *p, size_t n) { g_inner->operand_hold(p, n); }
static void p_operand_release(const float *p) { g_inner->operand_release(p); }

static ds_backend g_profiled = {
    .name = "profiled",
    .linear = p_linear,
    .rmsnorm = p_rmsnorm,
    .rope = p_rope,
    .attention_causal = p_attention,
    .swiglu = p_swiglu,
    .add = p_add,
    .linear_backward = p_linear_backward,
    .rmsnorm_backward = p_rmsnorm_backward,
    .rope_backward = p_rope_backward,
    .swiglu_backward = p_swiglu_backward,
    .block_attention = p_block_attention,
    .block_attention_backward = p_block_attention_backward,
    .attention_causal_train = p_attention_causal_train,
    .attention_causal_train_backward = p_attention_causal_train_backward,
    .embedding = p_embedding,
    .embedding_backward = p_embedding_backward,
    .linear_w = p_linear_w,
    .linear_w_cat = p_linear_w_cat,
    .rmsnorm_heads = p_rmsnorm_heads,
    .linear_w_backward = p_linear_w_backward,
    .embedding_w = p_embedding_w,
    .alloc = p_alloc,
    .free = p_free,
    .copy_to_device = p_copy_to_device,
    .copy_to_host = p_copy_to_host,
    .copy = p_copy,
    .copy_rows = p_copy_rows,
    .memset_zero = p_memset_zero,
    .synchronize = p_synchronize,
    .operand_hold = p_operand_hold,
    .operand_release = p_operand_release,
};

const ds_backend *ds_backend_profiled(const ds_backend *inner, ds_profile *prof) {
  g_inner = inner;
  g_prof = prof;
  g_profiled.device_memory = inner->device_memory;
  g_profiled.attention_causal_f16 = inner->attention_causal_f16 ? p_attention_f16 : NULL; /* f16 caches where the inner has them */
  g_profiled.copy_rows_f16 = inner->copy_rows_f16 ? p_copy_rows_f16 : NULL;
  g_profiled.attention_causal_seqs = inner->attention_causal_seqs ? p_attention_seqs : NULL;
  g_profiled.prepare_weight = inner->prepare_weight; /* load time, not a kernel the profile times */
  return &g_profiled;
}

void ds_profile_print(const ds_profile *p, double total_seconds, FILE *f) {
  static const char *names[DS_KERNEL_COUNT] = {"linear",     "rmsnorm",     "rope",     "attention",
                                               "swiglu",     "add",         "linear_bwd", "rmsnorm_bwd",
                                               "rope_bwd",   "swiglu_bwd",  "block_attn", "block_attn_bwd",
                                               "causal_attn", "causal_attn_bwd", "embedding", "embedding_bwd",
                                               "linear16",   "linear16_bwd", "embedding_w"};
  double accounted = 0, total = total_seconds > 0 ? total_seconds : 1;
  for (int k = 0; k < DS_KERNEL_COUNT; k++) accounted += p->seconds[k];
  fprintf(f, "%-14s %8s %10s %7s %10s\n", "kernel", "calls", "seconds", "share", "GFLOP/s");
  for (int k = 0; k < DS_KERNEL_COUNT; k++) {
    if (!p->calls[k]) continue;
    fprintf(f, "%-14s %8lld %10.4f %6.1f%% %10.2f\n", names[k], (long long)p->calls[k], p->seconds[k],
            100.0 * p->seconds[k] / total, p->flops[k] / (p->seconds[k] > 0 ? p->seconds[k] : 1e-12) / 1e9);
  }
  fprintf(f, "%-14s %8s %10.4f %6.1f%%\n", "other", "", total_seconds - accounted,
          100.0 * (total_seconds - accounted) / total);
  /* two kinds of copies: the quantized weights' 8-row groups, and --compute bf16's (capped) */
  size_t packed = ds_packed_weight_bytes(), quant = ds_quant_packed_bytes();
  if (quant) fprintf(f, "packed copies of quantized weights (8-row groups): %.1f MiB\n", quant / 1048576.0);
  if (packed > quant)
    fprintf(f, "packed bf16 weight copies: %.1f MiB (DSPARK_BF16_PACK_MB caps them)\n", (packed - quant) / 1048576.0);
}
