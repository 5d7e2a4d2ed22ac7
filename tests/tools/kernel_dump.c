/* Runs each kernel named in IN's metadata on IN's tensors with both backends (cpu and
 * reference) and writes outputs and gradients to OUT, for the PyTorch autograd conformance
 * test (tests/conformance/test_kernels_torch.py):
 *   kernel_dump IN.safetensors OUT.safetensors */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/backend.h"
#include "dspark/safetensors.h"

static float *zeros(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

static float *dup_f(const float *x, size_t n) {
  float *y = malloc((n ? n : 1) * sizeof(float));
  memcpy(y, x, n * sizeof(float));
  return y;
}

static const ds_backend *backend(int i) { return i == 0 ? ds_backend_cpu() : ds_backend_reference(); }

/* Everything the dump allocates, freed after the writer has written. */
typedef struct {
  void **p;
  size_t n, cap;
} pool;

static void *pool_keep(pool *pl, void *p) {
  if (pl->n == pl->cap) {
    pl->cap = pl->cap ? 2 * pl->cap : 64;
    pl->p = realloc(pl->p, pl->cap * sizeof(void *));
    if (!pl->p) abort();
  }
  pl->p[pl->n++] = p;
  return p;
}

static float *pool_zeros(pool *pl, size_t n) { return pool_keep(pl, zeros(n)); }

/* Reads tensor prefix.name as fp32 (a copy, aligned), checking the dtype and the rank;
 * shape[] receives the dims. NULL with a message when absent or wrong, unless optional. */
static float *get_f32(pool *pl, const ds_safetensors *st, const char *prefix, const char *name, int ndim,
                      int64_t *shape, int optional) {
  char full[256];
  snprintf(full, sizeof full, "%s.%s", prefix, name);
  const ds_tensor_view *v = ds_st_find(st, full);
  if (!v) {
    if (!optional) fprintf(stderr, "dump: tensor %s missing\n", full);
    return NULL;
  }
  if (v->dtype != DS_F32 || v->ndim != ndim) {
    fprintf(stderr, "dump: tensor %s must be F32 with %d dims\n", full, ndim);
    return NULL;
  }
  for (int d = 0; d < ndim; d++) shape[d] = v->shape[d];
  float *p = pool_keep(pl, malloc(v->nbytes ? v->nbytes : 1));
  memcpy(p, v->data, v->nbytes);
  return p;
}

static int64_t *get_i64(pool *pl, const ds_safetensors *st, const char *prefix, const char *name, int64_t *count) {
  char full[256];
  snprintf(full, sizeof full, "%s.%s", prefix, name);
  const ds_tensor_view *v = ds_st_find(st, full);
  if (!v || v->dtype != DS_I64 || v->ndim != 1) {
    fprintf(stderr, "dump: tensor %s missing or not a 1-d I64\n", full);
    return NULL;
  }
  *count = v->shape[0];
  int64_t *p = pool_keep(pl, malloc(v->nbytes ? v->nbytes : 1));
  memcpy(p, v->data, v->nbytes);
  return p;
}

/* Adds backend.prefix.name (F32, the given shape) to the writer. */
static int put(pool *pl, ds_st_writer *w, const char *be, const char *prefix, const char *name, int ndim,
               const int64_t *shape, const float *data) {
  char *full = pool_keep(pl, malloc(256));
  snprintf(full, 256, "%s.%s.%s", be, prefix, name);
  ds_status st = ds_st_writer_add(w, full, DS_F32, ndim, shape, data);
  if (st != DS_OK) fprintf(stderr, "dump: %s\n", ds_last_error());
  return st == DS_OK;
}

/* One kernel case (kind, prefix) on one backend; returns 1 on success. */
static int dump_case(pool *pl, ds_st_writer *w, const ds_safetensors *st, const ds_backend *be, const char *kind,
                     const char *px) {
  const char *bn = be == ds_backend_cpu() ? "cpu" : "ref";
  int64_t s1[2], s2[2], s3[2], s4[2];
  if (strcmp(kind, "linear") == 0) {
    float *x = get_f32(pl, st, px, "x", 2, s1, 0), *wt = get_f32(pl, st, px, "w", 2, s2, 0);
    float *b = get_f32(pl, st, px, "b", 1, s3, 1), *dy = get_f32(pl, st, px, "dy", 2, s4, 0);
    if (!x || !wt || !dy || s1[1] != s2[1] || s4[0] != s1[0] || s4[1] != s2[0] || (b && s3[0] != s2[0])) return 0;
    int64_t n = s1[0], in = s1[1], out = s2[0];
    float *y = pool_zeros(pl, (size_t)(n * out)), *dx = pool_zeros(pl, (size_t)(n * in));
    float *dw = pool_zeros(pl, (size_t)(out * in)), *db = b ? pool_zeros(pl, (size_t)out) : NULL;
    be->linear(y, x, wt, b, n, in, out);
    be->linear_backward(dx, dw, db, dy, x, wt, n, in, out);
    return put(pl, w, bn, px, "y", 2, s4, y) && put(pl, w, bn, px, "dx", 2, s1, dx) &&
           put(pl, w, bn, px, "dw", 2, s2, dw) && (!b || put(pl, w, bn, px, "db", 1, s3, db));
  }
  if (strcmp(kind, "linear_w") == 0) { /* a frozen weight w in F32, BF16 or F16: y and dx only */
    char full[256];
    snprintf(full, sizeof full, "%s.w", px);
    const ds_tensor_view *wv = ds_st_find(st, full);
    float *x = get_f32(pl, st, px, "x", 2, s1, 0), *b = get_f32(pl, st, px, "b", 1, s3, 1);
    float *dy = get_f32(pl, st, px, "dy", 2, s4, 0);
    if (!wv || wv->ndim != 2 || (wv->dtype != DS_F32 && wv->dtype != DS_BF16 && wv->dtype != DS_F16) || !x || !dy ||
        s1[1] != wv->shape[1] || s4[0] != s1[0] || s4[1] != wv->shape[0] || (b && s3[0] != wv->shape[0]))
      return 0;
    void *wd = pool_keep(pl, malloc(wv->nbytes ? wv->nbytes : 1)); /* aligned copy */
    memcpy(wd, wv->data, wv->nbytes);
    ds_weight wt = {wd, wv->dtype};
    int64_t n = s1[0], in = s1[1], out = wv->shape[0];
    float *y = pool_zeros(pl, (size_t)(n * out)), *dx = pool_zeros(pl, (size_t)(n * in));
    be->linear_w(y, out, x, wt, b, n, in, out);
    be->linear_w_backward(dx, dy, wt, n, in, out);
    return put(pl, w, bn, px, "y", 2, s4, y) && put(pl, w, bn, px, "dx", 2, s1, dx);
  }
  if (strcmp(kind, "rmsnorm") == 0) {
    float *x = get_f32(pl, st, px, "x", 2, s1, 0), *wt = get_f32(pl, st, px, "w", 1, s2, 0);
    float *eps = get_f32(pl, st, px, "eps", 1, s3, 0), *dy = get_f32(pl, st, px, "dy", 2, s4, 0);
    if (!x || !wt || !eps || !dy || s2[0] != s1[1] || s3[0] != 1 || s4[0] != s1[0] || s4[1] != s1[1]) return 0;
    int64_t n = s1[0], d = s1[1];
    float *y = pool_zeros(pl, (size_t)(n * d)), *rstd = pool_zeros(pl, (size_t)n);
    float *dx = pool_zeros(pl, (size_t)(n * d)), *dw = pool_zeros(pl, (size_t)d);
    be->rmsnorm(y, rstd, x, wt, n, d, eps[0]);
    be->rmsnorm_backward(dx, dw, dy, x, wt, rstd, n, d);
    return put(pl, w, bn, px, "y", 2, s1, y) && put(pl, w, bn, px, "rstd", 1, s1, rstd) &&
           put(pl, w, bn, px, "dx", 2, s1, dx) && put(pl, w, bn, px, "dw", 1, s2, dw);
  }
  if (strcmp(kind, "rope") == 0) {
    int64_t npos, ncfg;
    float *x = get_f32(pl, st, px, "x", 2, s1, 0), *inv = get_f32(pl, st, px, "inv_freq", 1, s2, 0);
    float *dy = get_f32(pl, st, px, "dy", 2, s3, 0);
    int64_t *pos = get_i64(pl, st, px, "pos", &npos), *cfg = get_i64(pl, st, px, "cfg", &ncfg);
    if (!x || !inv || !dy || !pos || !cfg || ncfg != 2 || npos != s1[0] || s3[0] != s1[0] || s3[1] != s1[1]) return 0;
    int64_t n = s1[0], stride = s1[1], heads = cfg[0], hd = cfg[1];
    if (hd <= 0 || hd % 2 || hd > 2048 || heads <= 0 || heads * hd > stride || s2[0] != hd / 2) return 0;
    float *y = pool_keep(pl, dup_f(x, (size_t)(n * stride))), *dx = pool_keep(pl, dup_f(dy, (size_t)(n * stride)));
    be->rope(y, stride, pos, inv, n, heads, hd);
    be->rope_backward(dx, stride, pos, inv, n, heads, hd);
    return put(pl, w, bn, px, "y", 2, s1, y) && put(pl, w, bn, px, "dx", 2, s1, dx);
  }
  if (strcmp(kind, "swiglu") == 0) {
    float *gu = get_f32(pl, st, px, "gu", 2, s1, 0), *dout = get_f32(pl, st, px, "dout", 2, s2, 0);
    if (!gu || !dout || s1[1] % 2 || s2[0] != s1[0] || s2[1] != s1[1] / 2) return 0;
    int64_t n = s1[0], inter = s1[1] / 2;
    float *out = pool_zeros(pl, (size_t)(n * inter)), *dgu = pool_zeros(pl, (size_t)(n * 2 * inter));
    be->swiglu(out, gu, n, inter);
    be->swiglu_backward(dgu, dout, gu, n, inter);
    return put(pl, w, bn, px, "out", 2, s2, out) && put(pl, w, bn, px, "dgu", 2, s1, dgu);
  }
  if (strcmp(kind, "attn") == 0) {
    int64_t nbk, ncfg, sq[2], skc[2], svc[2], skb[2], svb[2], sd[2], ss[1];
    float *q = get_f32(pl, st, px, "q", 2, sq, 0), *kc = get_f32(pl, st, px, "k_ctx", 2, skc, 0);
    float *vc = get_f32(pl, st, px, "v_ctx", 2, svc, 0), *kb = get_f32(pl, st, px, "k_blk", 2, skb, 0);
    float *vb = get_f32(pl, st, px, "v_blk", 2, svb, 0), *dout = get_f32(pl, st, px, "dout", 2, sd, 0);
    float *scale = get_f32(pl, st, px, "scale", 1, ss, 0);
    int64_t *ctx_len = get_i64(pl, st, px, "ctx_len", &nbk), *cfg = get_i64(pl, st, px, "cfg", &ncfg);
    if (!q || !kc || !vc || !kb || !vb || !dout || !scale || !ctx_len || !cfg || ncfg != 4) return 0;
    int64_t g = cfg[0], nh = cfg[1], nkv = cfg[2], hd = cfg[3], n_ctx = skc[0];
    int ok = g > 0 && nh > 0 && nkv > 0 && hd > 0 && nh % nkv == 0 && sq[0] == nbk * g && sq[1] == nh * hd &&
             skc[1] == nkv * hd && svc[0] == n_ctx && svc[1] == nkv * hd && skb[0] == nbk * g && skb[1] == nkv * hd &&
             svb[0] == skb[0] && svb[1] == skb[1] && sd[0] == sq[0] && sd[1] == sq[1];
    for (int64_t b = 0; ok && b < nbk; b++) ok = ctx_len[b] <= n_ctx;
    if (!ok) {
      fprintf(stderr, "dump: %s: inconsistent attention shapes\n", px);
      return 0;
    }
    int64_t slse[2] = {nbk * g, nh};
    float *out = pool_zeros(pl, (size_t)(sq[0] * sq[1])), *lse = pool_zeros(pl, (size_t)(slse[0] * nh));
    float *dq = pool_zeros(pl, (size_t)(sq[0] * sq[1])), *dkc = pool_zeros(pl, (size_t)(skc[0] * skc[1]));
    float *dvc = pool_zeros(pl, (size_t)(skc[0] * skc[1])), *dkb = pool_zeros(pl, (size_t)(skb[0] * skb[1]));
    float *dvb = pool_zeros(pl, (size_t)(skb[0] * skb[1]));
    be->block_attention(out, lse, q, kc, vc, kb, vb, ctx_len, n_ctx, nbk, g, nh, nkv, hd, scale[0]);
    be->block_attention_backward(dq, dkc, dvc, dkb, dvb, dout, out, lse, q, kc, vc, kb, vb, ctx_len, n_ctx, nbk, g, nh,
                                 nkv, hd, scale[0]);
    return put(pl, w, bn, px, "out", 2, sq, out) && put(pl, w, bn, px, "lse", 2, slse, lse) &&
           put(pl, w, bn, px, "dq", 2, sq, dq) && put(pl, w, bn, px, "dk_ctx", 2, skc, dkc) &&
           put(pl, w, bn, px, "dv_ctx", 2, skc, dvc) && put(pl, w, bn, px, "dk_blk", 2, skb, dkb) &&
           put(pl, w, bn, px, "dv_blk", 2, skb, dvb);
  }
  if (strcmp(kind, "cattn") == 0) { /* causal attention over packed sequences */
    int64_t noff, ncfg, sq[2], sk[2], sv[2], sd[2], ss[1];
    float *q = get_f32(pl, st, px, "q", 2, sq, 0), *k = get_f32(pl, st, px, "k", 2, sk, 0);
    float *v = get_f32(pl, st, px, "v", 2, sv, 0), *dout = get_f32(pl, st, px, "dout", 2, sd, 0);
    float *scale = get_f32(pl, st, px, "scale", 1, ss, 0);
    int64_t *off = get_i64(pl, st, px, "seq_off", &noff), *cfg = get_i64(pl, st, px, "cfg", &ncfg);
    if (!q || !k || !v || !dout || !scale || !off || !cfg || ncfg != 3 || noff < 1) return 0;
    int64_t nh = cfg[0], nkv = cfg[1], hd = cfg[2], n_seqs = noff - 1, rows = sq[0];
    int ok = nh > 0 && nkv > 0 && hd > 0 && nh % nkv == 0 && off[0] == 0 && off[n_seqs] == rows &&
             sq[1] == nh * hd && sk[0] == rows && sk[1] == nkv * hd && sv[0] == rows && sv[1] == sk[1] &&
             sd[0] == rows && sd[1] == sq[1];
    for (int64_t s = 0; ok && s < n_seqs; s++) ok = off[s + 1] >= off[s];
    if (!ok) {
      fprintf(stderr, "dump: %s: inconsistent causal attention shapes\n", px);
      return 0;
    }
    int64_t slse[2] = {rows, nh};
    float *out = pool_zeros(pl, (size_t)(rows * sq[1])), *lse = pool_zeros(pl, (size_t)(rows * nh));
    float *dq = pool_zeros(pl, (size_t)(rows * sq[1])), *dk = pool_zeros(pl, (size_t)(rows * sk[1]));
    float *dv = pool_zeros(pl, (size_t)(rows * sk[1]));
    be->attention_causal_train(out, lse, q, k, v, off, n_seqs, nh, nkv, hd, scale[0]);
    be->attention_causal_train_backward(dq, dk, dv, dout, out, lse, q, k, v, off, n_seqs, nh, nkv, hd, scale[0]);
    return put(pl, w, bn, px, "out", 2, sq, out) && put(pl, w, bn, px, "lse", 2, slse, lse) &&
           put(pl, w, bn, px, "dq", 2, sq, dq) && put(pl, w, bn, px, "dk", 2, sk, dk) &&
           put(pl, w, bn, px, "dv", 2, sk, dv);
  }
  fprintf(stderr, "dump: unknown kernel kind '%s'\n", kind);
  return 0;
}

/* IN's metadata "cases" lists "kind:prefix" entries, comma separated (kinds: linear, linear_w,
 * rmsnorm, rope, swiglu, attn (block attention), cattn (causal attention over packed sequences)); each case's tensors are named prefix.NAME. OUT gets cpu.prefix.NAME
 * and ref.prefix.NAME for the outputs and gradients of both backends. */
static int dump(const char *in_path, const char *out_path) {
  ds_safetensors *st = NULL;
  if (ds_st_open(in_path, &st) != DS_OK) {
    fprintf(stderr, "dump: %s\n", ds_last_error());
    return 1;
  }
  const char *cases = ds_st_metadata(st, "cases");
  if (!cases) {
    fprintf(stderr, "dump: %s has no \"cases\" metadata\n", in_path);
    ds_st_close(st);
    return 1;
  }
  pool pl = {0};
  ds_st_writer *w = ds_st_writer_new();
  int ok = w != NULL;
  char *list = pool_keep(&pl, strdup(cases)), *save = NULL;
  for (char *tok = strtok_r(list, ",", &save); ok && tok; tok = strtok_r(NULL, ",", &save)) {
    char *colon = strchr(tok, ':');
    if (!colon) {
      fprintf(stderr, "dump: bad case '%s' (want kind:prefix)\n", tok);
      ok = 0;
      break;
    }
    *colon = 0;
    for (int k = 0; ok && k < 2; k++) {
      ok = dump_case(&pl, w, st, backend(k), tok, colon + 1);
      if (!ok) fprintf(stderr, "dump: case %s:%s failed\n", tok, colon + 1);
    }
  }
  if (ok && ds_st_writer_write(w, out_path) != DS_OK) {
    fprintf(stderr, "dump: %s\n", ds_last_error());
    ok = 0;
  }
  ds_st_writer_free(w);
  for (size_t i = 0; i < pl.n; i++) free(pl.p[i]);
  free(pl.p);
  ds_st_close(st);
  return ok ? 0 : 1;
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: kernel_dump IN.safetensors OUT.safetensors\n");
    return 2;
  }
  return dump(argv[1], argv[2]);
}
