/* The CUDA backend against the cpu backend (issue 14), run on a GPU machine by
 * scripts/gpu-check.sh; built only with -DDSPARK_CUDA=ON.
 *
 * Every entry of the table, forward and backward, on random inputs at shapes that include odd
 * sizes, n = 1, GQA, several packed sequences (one empty) and dropped blocks: the same inputs
 * go to both backends (copied to the device for cuda), the results come back and are compared.
 * Gradient buffers start from the same random values on both sides, so the ADD rule is checked
 * too, and some calls pass NULL gradients.
 *
 * Error of a result: max |cuda - cpu| / max |cpu| over its elements (the infinity norm of the
 * difference relative to the cpu result's; 1 when the cpu result is all zero). Equal values
 * count as no error (so -inf lse of dropped blocks must match exactly); non-finite cpu values
 * do not enter the norm. Tolerance: 1e-5 for the fp32 paths; 1e-3 for the bf16 GEMM mode
 * (ds_cuda_set_bf16_gemm), whose inputs are rounded to bf16 before both backends see them, so
 * the check measures the kernels, not bf16 rounding; 1e-2 for the attentions in the bf16 mode
 * (BF16_ATTN_TOL below: the device also rounds the probabilities P and dS).
 *
 * The attentions run twice more with a tiny score budget (DSPARK_CUDA_ATTN_SCORE_BYTES), so
 * that the GEMM path cuts every call into several chunks at these small shapes.
 *
 * The attention backwards are also run twice from zeroed gradients and must agree bit for bit
 * (the CUDA kernels sum without atomics, in a fixed order).
 *
 * Prints one line per check (name, error, tolerance, PASS / FAIL) and exits 1 if any check
 * fails, 2 when no CUDA device can be used.
 *   cuda_kernel_check [--small] [seed]   (--small: shorter sequences, for the CPU emulation) */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/backend.h"
#include "dspark/common.h"
#include "dspark/dtype.h"
#include "dspark/rng.h"

#define FP32_TOL 1e-5
#define BF16_TOL 1e-3
/* The attentions in the bf16 mode: q, k, v and dout are rounded to bf16 for both sides (as for
 * the GEMMs), so the scores and dP are exact products summed in fp32; but the device rounds P
 * and dS = P (dP - D) to bf16 (relative error <= 2^-9 = 1.95e-3 each) before the PV, dS K,
 * dS^T Q and P^T dO products. Each output element is then a sum whose terms carry independent
 * errors of at most 2^-9 of their size; measured against the largest output (the norm here) that
 * stays below a few 2^-9: 1e-2 leaves margin while a wrong mask, head or scale (errors of order
 * 1) still fails. */
#define BF16_ATTN_TOL 1e-2

static const ds_backend *g_cpu, *g_gpu;
static ds_rng g_rng;
static int g_failures, g_checks;

/* ---------------------------------------------------------------- buffers */

/* A host array and its device copy. */
typedef struct {
  float *h;
  float *d;
  size_t n;
} buf;

static void *xmalloc(size_t nbytes) {
  void *p = malloc(nbytes ? nbytes : 1);
  if (!p) {
    fprintf(stderr, "cuda_kernel_check: out of host memory\n");
    exit(2);
  }
  return p;
}

static void *dev_alloc(size_t nbytes) {
  void *p = g_gpu->alloc(nbytes, "checker buffer");
  if (!p) {
    fprintf(stderr, "cuda_kernel_check: %s\n", ds_last_error());
    exit(2);
  }
  return p;
}

/* Uniform in [-scale, scale]; rounded to bf16 when round16 (the bf16-mode checks). */
static buf mk(size_t n, float scale, int round16) {
  buf b = {xmalloc(n * sizeof(float)), NULL, n};
  for (size_t i = 0; i < n; i++) {
    float v = (2.0f * ds_rng_uniform_f32(&g_rng) - 1.0f) * scale;
    b.h[i] = round16 ? ds_bf16_to_f32(ds_f32_to_bf16(v)) : v;
  }
  b.d = dev_alloc(n * sizeof(float));
  g_gpu->copy_to_device(b.d, b.h, n * sizeof(float));
  return b;
}

static void rm(buf b) {
  free(b.h);
  g_gpu->free(b.d);
}

/* The device copy, brought back. */
static float *fetch(buf b) {
  float *h = xmalloc(b.n * sizeof(float));
  g_gpu->copy_to_host(h, b.d, b.n * sizeof(float));
  return h;
}

/* A frozen weight in dtype dt with the values of w (exact for 16-bit: w is rounded first and
 * the cpu sees the rounded values through the same dtype). */
typedef struct {
  ds_weight h, d;
  void *hdata, *ddata;
} weight;

static weight mk_weight(buf *w, ds_dtype dt) {
  size_t es = ds_dtype_size(dt);
  weight r;
  r.hdata = xmalloc(w->n * es);
  if (ds_convert_from_f32(r.hdata, dt, w->h, w->n) != DS_OK) {
    fprintf(stderr, "cuda_kernel_check: %s\n", ds_last_error());
    exit(2);
  }
  r.ddata = dev_alloc(w->n * es);
  g_gpu->copy_to_device(r.ddata, r.hdata, w->n * es);
  r.h.data = r.hdata;
  r.h.dtype = dt;
  r.d.data = r.ddata;
  r.d.dtype = dt;
  return r;
}

static void rm_weight(weight w) {
  free(w.hdata);
  g_gpu->free(w.ddata);
}

/* ---------------------------------------------------------------- comparing */

static double rel_err(const float *got, const float *want, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    if (got[i] == want[i]) continue;
    double d = fabs((double)got[i] - (double)want[i]);
    num = isnan(d) ? INFINITY : fmax(num, d);
  }
  for (size_t i = 0; i < n; i++)
    if (isfinite(want[i])) den = fmax(den, fabs((double)want[i]));
  return num / (den > 0 ? den : 1);
}

/* Compares the device result of b with the cpu result in b.h. */
static void check(const char *name, buf b, double tol) {
  float *got = fetch(b);
  double err = rel_err(got, b.h, b.n);
  int ok = err <= tol;
  g_checks++;
  if (!ok) g_failures++;
  printf("%-44s max_rel_err %.3e  tol %.0e  %s\n", name, err, tol, ok ? "PASS" : "FAIL");
  fflush(stdout);
  free(got);
}

static void set_bf16(int on) { ds_cuda_set_bf16_gemm(on); }

/* Determinism: the device results of two runs of the same call, bit for bit. */
typedef struct {
  float *first[5];
  buf grads[5];
  int n;
} rerun;

/* Zeroes the gradients' device copies before a run. */
static void rerun_zero(rerun *r) {
  for (int i = 0; i < r->n; i++) g_gpu->memset_zero(r->grads[i].d, r->grads[i].n * sizeof(float));
}

/* After the first run: keeps its results. After the second: compares and reports. */
static void rerun_record(rerun *r, const char *name, int second) {
  int same = 1;
  for (int i = 0; i < r->n; i++) {
    float *got = fetch(r->grads[i]);
    if (!second) {
      r->first[i] = got;
      continue;
    }
    same &= memcmp(got, r->first[i], r->grads[i].n * sizeof(float)) == 0;
    free(got);
    free(r->first[i]);
  }
  if (!second) return;
  g_checks++;
  if (!same) g_failures++;
  printf("%-44s two runs bitwise equal: %s  %s\n", name, same ? "yes" : "no", same ? "PASS" : "FAIL");
  fflush(stdout);
}

/* ---------------------------------------------------------------- GEMM entries */

static void check_linear(int bf16) {
  int64_t shapes[][3] = {{1, 64, 96}, {7, 33, 17}, {130, 257, 65}};
  double tol = bf16 ? BF16_TOL : FP32_TOL;
  set_bf16(bf16);
  for (int s = 0; s < 3; s++) {
    int64_t n = shapes[s][0], in = shapes[s][1], out = shapes[s][2];
    char name[160];
    buf x = mk((size_t)(n * in), 1, bf16), w = mk((size_t)(out * in), 1, bf16), b = mk((size_t)out, 1, 0);
    buf y = mk((size_t)(n * out), 1, 0);
    for (int with_bias = 0; with_bias < 2; with_bias++) {
      g_cpu->linear(y.h, x.h, w.h, with_bias ? b.h : NULL, n, in, out);
      g_gpu->linear(y.d, x.d, w.d, with_bias ? b.d : NULL, n, in, out);
      snprintf(name, sizeof name, "linear%s n%lld in%lld out%lld%s", bf16 ? "[bf16]" : "", (long long)n,
               (long long)in, (long long)out, with_bias ? " +bias" : "");
      check(name, y, tol);
    }
    /* backward: all three gradients, then dx skipped */
    buf dy = mk((size_t)(n * out), 1, bf16), dx = mk((size_t)(n * in), 1, 0), dw = mk((size_t)(out * in), 1, 0);
    buf db = mk((size_t)out, 1, 0);
    g_cpu->linear_backward(dx.h, dw.h, db.h, dy.h, x.h, w.h, n, in, out);
    g_gpu->linear_backward(dx.d, dw.d, db.d, dy.d, x.d, w.d, n, in, out);
    g_cpu->linear_backward(NULL, dw.h, NULL, dy.h, x.h, w.h, n, in, out);
    g_gpu->linear_backward(NULL, dw.d, NULL, dy.d, x.d, w.d, n, in, out);
    snprintf(name, sizeof name, "linear_backward%s n%lld dx", bf16 ? "[bf16]" : "", (long long)n);
    check(name, dx, tol);
    snprintf(name, sizeof name, "linear_backward%s n%lld dw (twice)", bf16 ? "[bf16]" : "", (long long)n);
    check(name, dw, tol);
    snprintf(name, sizeof name, "linear_backward%s n%lld db", bf16 ? "[bf16]" : "", (long long)n);
    check(name, db, FP32_TOL); /* column sums, never a GEMM */
    rm(x); rm(w); rm(b); rm(y); rm(dy); rm(dx); rm(dw); rm(db);
  }
  set_bf16(0);
}

/* linear_w / linear_w_backward on F32, BF16 and F16 weights, y with a row stride past out
 * (the columns beyond must be left alone), and embedding_w on the same tables. */
static void check_linear_w(int bf16) {
  ds_dtype dts[] = {DS_F32, DS_BF16, DS_F16};
  double tol = bf16 ? BF16_TOL : FP32_TOL;
  set_bf16(bf16);
  for (int k = 0; k < 3; k++) {
    int64_t n = 11, in = 96, out = 75, ldy = 80;
    char name[160];
    const char *dn = ds_dtype_name(dts[k]);
    /* bf16 mode rounds every operand to bf16: an F16 weight's values are made bf16-exact too */
    buf x = mk((size_t)(n * in), 1, bf16), wv = mk((size_t)(out * in), 1, bf16 || dts[k] == DS_BF16);
    buf b = mk((size_t)out, 1, 0), y = mk((size_t)(n * ldy), 1, 0);
    weight w = mk_weight(&wv, dts[k]);
    for (int with_bias = 0; with_bias < 2; with_bias++) {
      g_cpu->linear_w(y.h, ldy, x.h, w.h, with_bias ? b.h : NULL, n, in, out);
      g_gpu->linear_w(y.d, ldy, x.d, w.d, with_bias ? b.d : NULL, n, in, out);
      snprintf(name, sizeof name, "linear_w%s %s ldy%lld%s", bf16 ? "[bf16]" : "", dn, (long long)ldy,
               with_bias ? " +bias" : "");
      check(name, y, tol);
    }
    buf dy = mk((size_t)(n * out), 1, bf16), dx = mk((size_t)(n * in), 1, 0);
    g_cpu->linear_w_backward(dx.h, dy.h, w.h, n, in, out);
    g_gpu->linear_w_backward(dx.d, dy.d, w.d, n, in, out);
    snprintf(name, sizeof name, "linear_w_backward%s %s", bf16 ? "[bf16]" : "", dn);
    check(name, dx, tol);
    if (!bf16) {
      int32_t ids[] = {3, 0, 74, 3, 41, 41, 9};
      buf e = mk((size_t)(7 * in), 1, 0);
      g_cpu->embedding_w(e.h, ids, w.h, 7, in);
      g_gpu->embedding_w(e.d, ids, w.d, 7, in);
      snprintf(name, sizeof name, "embedding_w %s", dn);
      check(name, e, 0.0); /* exact conversions */
      rm(e);
    }
    rm(x); rm(wv); rm(b); rm(y); rm(dy); rm(dx);
    rm_weight(w);
  }
  /* linear_w_cat: three segments (q, k, v stored apart) into one strided y, with the bias */
  for (int k = 0; k < 2; k++) {
    int64_t n = 11, in = 64, out[3] = {40, 16, 16}, ldy = 80;
    buf x = mk((size_t)(n * in), 1, bf16), b = mk(72, 1, 0), y = mk((size_t)(n * ldy), 1, 0);
    buf wv[3];
    weight w[3];
    ds_weight wh[3], wd[3];
    for (int s = 0; s < 3; s++) {
      wv[s] = mk((size_t)(out[s] * in), 1, bf16 || dts[k] == DS_BF16);
      w[s] = mk_weight(&wv[s], dts[k]);
      wh[s] = w[s].h, wd[s] = w[s].d;
    }
    g_cpu->linear_w_cat(y.h, ldy, x.h, wh, out, 3, b.h, n, in);
    g_gpu->linear_w_cat(y.d, ldy, x.d, wd, out, 3, b.d, n, in);
    char name[96];
    snprintf(name, sizeof name, "linear_w_cat%s %s", bf16 ? "[bf16]" : "", ds_dtype_name(dts[k]));
    check(name, y, tol);
    for (int s = 0; s < 3; s++) rm(wv[s]), rm_weight(w[s]);
    rm(x); rm(b); rm(y);
  }
  set_bf16(0);
}

/* ---------------------------------------------------------------- row-wise entries */

static void check_rowwise(void) {
  int64_t n = 13, d = 333;
  buf x = mk((size_t)(n * d), 3, 0), w = mk((size_t)d, 1, 0), y = mk((size_t)(n * d), 1, 0), r = mk((size_t)n, 1, 0);
  g_cpu->rmsnorm(y.h, r.h, x.h, w.h, n, d, 1e-6f);
  g_gpu->rmsnorm(y.d, r.d, x.d, w.d, n, d, 1e-6f);
  check("rmsnorm y", y, FP32_TOL);
  check("rmsnorm rstd", r, FP32_TOL);
  buf dy = mk((size_t)(n * d), 1, 0), dx = mk((size_t)(n * d), 1, 0), dw = mk((size_t)d, 1, 0);
  g_cpu->rmsnorm_backward(dx.h, dw.h, dy.h, x.h, w.h, r.h, n, d);
  g_gpu->rmsnorm_backward(dx.d, dw.d, dy.d, x.d, w.d, r.d, n, d);
  check("rmsnorm_backward dx", dx, FP32_TOL);
  check("rmsnorm_backward dw", dw, FP32_TOL);
  /* in place (y aliases x), no rstd */
  buf xi = mk((size_t)(n * d), 2, 0);
  g_cpu->rmsnorm(xi.h, NULL, xi.h, w.h, n, d, 1e-5f);
  g_gpu->rmsnorm(xi.d, NULL, xi.d, w.d, n, d, 1e-5f);
  check("rmsnorm in place", xi, FP32_TOL);
  rm(x); rm(w); rm(y); rm(r); rm(dy); rm(dx); rm(dw); rm(xi);

  /* rmsnorm_heads: the q columns of fused q|k|v rows (stride past them: the rest untouched) */
  {
    int64_t nh = 4, hdim = 48, st = nh * hdim + 40, nt = 7;
    buf qx = mk((size_t)(nt * st), 2, 0), wq = mk((size_t)hdim, 1, 0);
    g_cpu->rmsnorm_heads(qx.h, st, wq.h, nt, nh, hdim, 1e-6f);
    g_gpu->rmsnorm_heads(qx.d, st, wq.d, nt, nh, hdim, 1e-6f);
    check("rmsnorm_heads (strided rows)", qx, FP32_TOL);
    rm(qx); rm(wq);
  }

  /* rope on rows with a stride past heads * head_dim (the tail must be untouched) */
  int64_t heads = 5, hd = 64, stride = heads * hd + 24, nt = 9;
  int64_t pos[9] = {0, 1, 2, 7, 100, 1000, 4095, 31, 77777};
  float inv_freq_h[32];
  for (int i = 0; i < 32; i++) inv_freq_h[i] = powf(1000000.0f, -(float)(2 * i) / (float)hd);
  buf inv = mk(32, 1, 0);
  memcpy(inv.h, inv_freq_h, sizeof inv_freq_h);
  g_gpu->copy_to_device(inv.d, inv.h, sizeof inv_freq_h);
  buf q = mk((size_t)(nt * stride), 1, 0);
  g_cpu->rope(q.h, stride, pos, inv.h, nt, heads, hd);
  g_gpu->rope(q.d, stride, pos, inv.d, nt, heads, hd);
  check("rope (strided rows)", q, FP32_TOL);
  g_cpu->rope_backward(q.h, stride, pos, inv.h, nt, heads, hd);
  g_gpu->rope_backward(q.d, stride, pos, inv.d, nt, heads, hd);
  check("rope_backward", q, FP32_TOL);
  rm(inv); rm(q);

  int64_t rows = 6, inter = 173;
  buf gu = mk((size_t)(rows * 2 * inter), 4, 0), o = mk((size_t)(rows * inter), 1, 0);
  g_cpu->swiglu(o.h, gu.h, rows, inter);
  g_gpu->swiglu(o.d, gu.d, rows, inter);
  check("swiglu", o, FP32_TOL);
  buf dgu = mk((size_t)(rows * 2 * inter), 1, 0);
  g_cpu->swiglu_backward(dgu.h, o.h, gu.h, rows, inter);
  g_gpu->swiglu_backward(dgu.d, o.d, gu.d, rows, inter);
  check("swiglu_backward", dgu, FP32_TOL);
  buf a = mk(1001, 1, 0);
  /* add is exact: both sides must add the same x (swiglu's outputs may differ in the last bits) */
  g_gpu->copy_to_device(o.d, o.h, 1001 * sizeof(float));
  g_cpu->add(a.h, o.h, 1001);
  g_gpu->add(a.d, o.d, 1001);
  check("add", a, 0.0);
  rm(gu); rm(o); rm(dgu); rm(a);
}

static void check_embedding(void) {
  int64_t V = 50, d = 70, n = 12;
  int32_t ids[12] = {4, 9, 4, 0, 49, 7, 4, 9, 7, 7, 31, 0};
  buf table = mk((size_t)(V * d), 1, 0), out = mk((size_t)(n * d), 1, 0);
  g_cpu->embedding(out.h, table.h, ids, n, d);
  g_gpu->embedding(out.d, table.d, ids, n, d);
  check("embedding", out, 0.0);
  for (int skip = 0; skip < 2; skip++) {
    buf dt = mk((size_t)(V * d), 1, 0);
    g_cpu->embedding_backward(dt.h, out.h, ids, n, d, skip ? 7 : -1);
    g_gpu->embedding_backward(dt.d, out.d, ids, n, d, skip ? 7 : -1);
    check(skip ? "embedding_backward skip_id 7 (bitwise)" : "embedding_backward (bitwise)", dt, 0.0);
    rm(dt);
  }
  rm(table); rm(out);
}

/* ---------------------------------------------------------------- attention */

/* The flash kernel (a few queries over a short cache) and the GEMM path (more queries, or a
 * long cache: cuda_attention.cu's thresholds are 16 queries and 512 keys). */
static void check_decode_attention(int bf16, const char *note) {
  /* {n, past, n_heads, n_kv_heads, head_dim} */
  int64_t cases[][5] = {{1, 37, 4, 2, 64},   {5, 0, 3, 3, 128},   {19, 11, 8, 2, 96},
                        {3, 200, 2, 1, 256}, {2, 600, 4, 2, 64},  {70, 5, 4, 1, 64}};
  double tol = bf16 ? BF16_ATTN_TOL : FP32_TOL;
  set_bf16(bf16);
  for (int c = bf16 ? 4 : 0; c < 6; c++) { /* bf16 only changes the GEMM path */
    int64_t n = cases[c][0], past = cases[c][1], nh = cases[c][2], nkv = cases[c][3], hd = cases[c][4];
    int64_t cap = past + n + 3, q_stride = nh * hd + 16;
    float scale = 1.0f / sqrtf((float)hd);
    buf q = mk((size_t)(n * q_stride), 1, bf16), k = mk((size_t)(nkv * cap * hd), 1, bf16);
    buf v = mk((size_t)(nkv * cap * hd), 1, bf16), out = mk((size_t)(n * nh * hd), 1, 0);
    g_cpu->attention_causal(out.h, q.h, q_stride, k.h, v.h, n, past, cap, nh, nkv, hd, scale);
    g_gpu->attention_causal(out.d, q.d, q_stride, k.d, v.d, n, past, cap, nh, nkv, hd, scale);
    char name[160];
    snprintf(name, sizeof name, "attention_causal%s n%lld past%lld h%lld/%lld hd%lld%s", bf16 ? "[bf16]" : "",
             (long long)n, (long long)past, (long long)nh, (long long)nkv, (long long)hd, note);
    check(name, out, tol);
    rm(q); rm(k); rm(v); rm(out);
  }
  set_bf16(0);
}

static void check_causal_train(int64_t n_heads, int64_t n_kv, int64_t hd, const int64_t *lens, int64_t n_seqs,
                               int null_dk, int bf16, const char *note) {
  double tol = bf16 ? BF16_ATTN_TOL : FP32_TOL;
  set_bf16(bf16);
  int64_t seq_off[16] = {0};
  for (int64_t s = 0; s < n_seqs; s++) seq_off[s + 1] = seq_off[s] + lens[s];
  int64_t rows = seq_off[n_seqs], qs = n_heads * hd, kvs = n_kv * hd;
  float scale = 1.0f / sqrtf((float)hd);
  buf q = mk((size_t)(rows * qs), 1, bf16), k = mk((size_t)(rows * kvs), 1, bf16);
  buf v = mk((size_t)(rows * kvs), 1, bf16);
  buf out = mk((size_t)(rows * qs), 1, 0), lse = mk((size_t)(rows * n_heads), 1, 0);
  g_cpu->attention_causal_train(out.h, lse.h, q.h, k.h, v.h, seq_off, n_seqs, n_heads, n_kv, hd, scale);
  g_gpu->attention_causal_train(out.d, lse.d, q.d, k.d, v.d, seq_off, n_seqs, n_heads, n_kv, hd, scale);
  char name[160], tag[80];
  snprintf(tag, sizeof tag, "%sh%lld/%lld hd%lld rows%lld%s", bf16 ? "[bf16] " : "", (long long)n_heads,
           (long long)n_kv, (long long)hd, (long long)rows, note);
  snprintf(name, sizeof name, "causal_train %s out", tag);
  check(name, out, tol);
  snprintf(name, sizeof name, "causal_train %s lse", tag);
  check(name, lse, bf16 ? BF16_TOL : FP32_TOL); /* the scores are exact products of bf16 inputs */
  /* the backward from the cpu's forward results on both sides */
  g_gpu->copy_to_device(out.d, out.h, out.n * sizeof(float));
  g_gpu->copy_to_device(lse.d, lse.h, lse.n * sizeof(float));
  buf dout = mk(out.n, 1, bf16), dq = mk(q.n, 1, 0), dk = mk(k.n, 1, 0), dv = mk(v.n, 1, 0);
  g_cpu->attention_causal_train_backward(dq.h, null_dk ? NULL : dk.h, dv.h, dout.h, out.h, lse.h, q.h, k.h, v.h,
                                         seq_off, n_seqs, n_heads, n_kv, hd, scale);
  g_gpu->attention_causal_train_backward(dq.d, null_dk ? NULL : dk.d, dv.d, dout.d, out.d, lse.d, q.d, k.d, v.d,
                                         seq_off, n_seqs, n_heads, n_kv, hd, scale);
  snprintf(name, sizeof name, "causal_train_backward %s dq", tag);
  check(name, dq, tol);
  snprintf(name, sizeof name, "causal_train_backward %s dk%s", tag, null_dk ? " (NULL: untouched)" : "");
  check(name, dk, tol);
  snprintf(name, sizeof name, "causal_train_backward %s dv", tag);
  check(name, dv, tol);
  rerun r = {{NULL}, {dq, dk, dv}, 3};
  snprintf(name, sizeof name, "causal_train_backward %s", tag);
  for (int run = 0; run < 2; run++) {
    rerun_zero(&r);
    g_gpu->attention_causal_train_backward(dq.d, dk.d, dv.d, dout.d, out.d, lse.d, q.d, k.d, v.d, seq_off, n_seqs,
                                           n_heads, n_kv, hd, scale);
    rerun_record(&r, name, run);
  }
  rm(q); rm(k); rm(v); rm(out); rm(lse); rm(dout); rm(dq); rm(dk); rm(dv);
  set_bf16(0);
}

static void check_block_attention(int64_t n_heads, int64_t n_kv, int64_t hd, int64_t g, const int64_t *ctx_len,
                                  int64_t n_blocks, int64_t n_ctx, int null_ctx_grads, int bf16, const char *note) {
  int64_t rows = n_blocks * g, qs = n_heads * hd, kvs = n_kv * hd;
  float scale = 1.0f / sqrtf((float)hd);
  double tol = bf16 ? BF16_ATTN_TOL : FP32_TOL;
  set_bf16(bf16);
  buf q = mk((size_t)(rows * qs), 1, bf16), kc = mk((size_t)(n_ctx * kvs), 1, bf16);
  buf vc = mk((size_t)(n_ctx * kvs), 1, bf16);
  buf kb = mk((size_t)(rows * kvs), 1, bf16), vb = mk((size_t)(rows * kvs), 1, bf16);
  buf out = mk((size_t)(rows * qs), 1, 0), lse = mk((size_t)(rows * n_heads), 1, 0);
  g_cpu->block_attention(out.h, lse.h, q.h, kc.h, vc.h, kb.h, vb.h, ctx_len, n_ctx, n_blocks, g, n_heads, n_kv, hd,
                         scale);
  g_gpu->block_attention(out.d, lse.d, q.d, kc.d, vc.d, kb.d, vb.d, ctx_len, n_ctx, n_blocks, g, n_heads, n_kv, hd,
                         scale);
  char name[160], tag[88];
  snprintf(tag, sizeof tag, "%sh%lld/%lld hd%lld g%lld blocks%lld%s", bf16 ? "[bf16] " : "", (long long)n_heads,
           (long long)n_kv, (long long)hd, (long long)g, (long long)n_blocks, note);
  snprintf(name, sizeof name, "block_attention %s out", tag);
  check(name, out, tol);
  snprintf(name, sizeof name, "block_attention %s lse", tag);
  check(name, lse, bf16 ? BF16_TOL : FP32_TOL);
  g_gpu->copy_to_device(out.d, out.h, out.n * sizeof(float));
  g_gpu->copy_to_device(lse.d, lse.h, lse.n * sizeof(float));
  buf dout = mk(out.n, 1, bf16), dq = mk(q.n, 1, 0), dkc = mk(kc.n, 1, 0), dvc = mk(vc.n, 1, 0);
  buf dkb = mk(kb.n, 1, 0), dvb = mk(vb.n, 1, 0);
  g_cpu->block_attention_backward(dq.h, null_ctx_grads ? NULL : dkc.h, null_ctx_grads ? NULL : dvc.h, dkb.h, dvb.h,
                                  dout.h, out.h, lse.h, q.h, kc.h, vc.h, kb.h, vb.h, ctx_len, n_ctx, n_blocks, g,
                                  n_heads, n_kv, hd, scale);
  g_gpu->block_attention_backward(dq.d, null_ctx_grads ? NULL : dkc.d, null_ctx_grads ? NULL : dvc.d, dkb.d, dvb.d,
                                  dout.d, out.d, lse.d, q.d, kc.d, vc.d, kb.d, vb.d, ctx_len, n_ctx, n_blocks, g,
                                  n_heads, n_kv, hd, scale);
  const char *ctx_note = null_ctx_grads ? " (NULL: untouched)" : "";
  snprintf(name, sizeof name, "block_attention_backward %s dq", tag);
  check(name, dq, tol);
  snprintf(name, sizeof name, "block_attention_backward %s dk_ctx%s", tag, ctx_note);
  check(name, dkc, tol);
  snprintf(name, sizeof name, "block_attention_backward %s dv_ctx%s", tag, ctx_note);
  check(name, dvc, tol);
  snprintf(name, sizeof name, "block_attention_backward %s dk_blk", tag);
  check(name, dkb, tol);
  snprintf(name, sizeof name, "block_attention_backward %s dv_blk", tag);
  check(name, dvb, tol);
  rerun r = {{NULL}, {dq, dkc, dvc, dkb, dvb}, 5};
  snprintf(name, sizeof name, "block_attention_backward %s", tag);
  for (int run = 0; run < 2; run++) {
    rerun_zero(&r);
    g_gpu->block_attention_backward(dq.d, dkc.d, dvc.d, dkb.d, dvb.d, dout.d, out.d, lse.d, q.d, kc.d, vc.d, kb.d,
                                    vb.d, ctx_len, n_ctx, n_blocks, g, n_heads, n_kv, hd, scale);
    rerun_record(&r, name, run);
  }
  rm(q); rm(kc); rm(vc); rm(kb); rm(vb); rm(out); rm(lse); rm(dout); rm(dq); rm(dkc); rm(dvc); rm(dkb); rm(dvb);
  set_bf16(0);
}

int main(int argc, char **argv) {
  /* --small: shorter sequences and contexts, for the CPU emulation of CUDA (a ctest), where a
   * block's threads take turns on one core */
  int small = argc > 1 && strcmp(argv[1], "--small") == 0;
  if (small) argc--, argv++;
  uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10) : 14;
  ds_rng_seed(&g_rng, seed);
  g_cpu = ds_backend_cpu();
  g_gpu = ds_backend_cuda();
  if (!g_gpu) {
    fprintf(stderr, "cuda_kernel_check: no CUDA backend: %s\n", ds_last_error());
    return 2;
  }
  printf("cuda_kernel_check: cuda backend vs cpu backend (%s), seed %llu\n", ds_gemm_name(),
         (unsigned long long)seed);
  check_linear(0);
  check_linear(1);
  check_linear_w(0);
  check_linear_w(1);
  check_rowwise();
  check_embedding();
  int64_t lens1[] = {5, 0, 33, 1, 70}, lens2[] = {130, 9};
  if (small) lens1[4] = 21, lens2[0] = 41;
  int64_t ctx1[] = {0, 13, -1, 50, 7, -1}, ctx2[] = {200, 64, 3}, ctx3[] = {-1, -1};
  if (small) ctx2[0] = 60, ctx2[1] = 17;
  /* pass 0: the default score budget (one chunk per sequence or call at these shapes); pass 1:
   * a few KiB (several chunks each); pass 2: the bf16 mode, several chunks too */
  for (int pass = 0; pass < 3; pass++) {
    const char *note = pass ? " [chunks]" : "";
    int bf16 = pass == 2;
    if (pass) setenv("DSPARK_CUDA_ATTN_SCORE_BYTES", "24576", 1);
    check_decode_attention(bf16, note);
    check_causal_train(8, 2, 64, lens1, 5, 0, bf16, note);
    check_causal_train(4, 4, 128, lens2, 2, 1, bf16, note);
    check_causal_train(6, 3, 80, lens1 + 2, 1, 0, bf16, note);
    check_block_attention(6, 2, 64, 7, ctx1, 6, 50, 0, bf16, note);
    check_block_attention(4, 1, 128, 16, ctx2, 3, small ? 60 : 200, 0, bf16, note);
    check_block_attention(2, 2, 96, 9, ctx1, 6, 64, 1, bf16, note);
    check_block_attention(4, 2, 64, 5, ctx3, 2, 10, 0, bf16, note);
  }
  unsetenv("DSPARK_CUDA_ATTN_SCORE_BYTES");
  g_gpu->synchronize();
  printf("cuda_kernel_check: %d of %d checks passed%s\n", g_checks - g_failures, g_checks,
         g_failures ? " -- FAILURES above" : "");
  return g_failures ? 1 : 0;
}
