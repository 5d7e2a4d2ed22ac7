/* Matmuls and lookups on frozen block-quantized weights for the CPU backend (contracts in
 * nn/cpu_quant.h and include/dspark/backend.h): the activation quantizer, the portable row
 * kernel, the choice of instruction set and regime, and the OpenMP regions. The AVX2 / VNNI
 * row kernels are cpu_quant_avx2.c / cpu_quant_avx512.c. */
#include "nn/cpu_quant.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/dtype.h"
#include "nn/cpu_gemm_bf16.h"
#include "nn/cpu_isa.h"
#include "nn/cpu_kernels.h"
#include "nn/linear_cat.h"

#ifdef DSPARK_USE_OPENMP
#include <omp.h>
#endif

/* ---------------------------------------------------------------- activations */

int ds_qx_alloc(ds_qx *qx, int64_t n, int64_t in) {
  size_t cells = (size_t)(n > 0 ? n : 1) * (size_t)(in > 0 ? in : 1);
  qx->q = malloc(cells);
  qx->d = malloc(cells / DS_QX_BLOCK * sizeof(float) + sizeof(float));
  qx->s = malloc(cells / 16 * sizeof(int16_t) + sizeof(int16_t));
  qx->m = malloc(cells / DS_QX_BLOCK * sizeof(float) + sizeof(float));
  if (qx->q && qx->d && qx->s && qx->m) return 1;
  ds_qx_free(qx);
  return 0;
}

void ds_qx_free(ds_qx *qx) {
  free(qx->q);
  free(qx->d);
  free(qx->s);
  free(qx->m);
  qx->q = NULL, qx->d = NULL, qx->s = NULL, qx->m = NULL;
}

/* Per block of 32: d = max|x| / 127 and q = round(x / d) (nearest, ties to even), so every
 * |x - d q| <= d / 2 (up to the rounding of 1 / d). A block of zeros gets d = 0, q = 0. Written
 * for the compiler to vectorize (no fmaxf / lrintf calls: adding and subtracting 1.5 * 2^23 rounds
 * |v| < 2^22 to the nearest integer, ties to even, as lrintf does in the default mode); it was 5%
 * of a verification pass as scalar calls. */
static void qx_quantize_rows(ds_qx *qx, const float *x, int64_t n, int64_t in) {
#if defined(__x86_64__) || defined(__i386__)
  if (ds_qisa_best() >= DS_QISA_AVX2) {
    ds_qx_quantize_avx2(qx, x, n, in);
    return;
  }
#endif
  ds_qx_quantize_portable(qx, x, n, in);
}

/* Rows are independent: a prompt's rows split over the threads (one thread quantizing a prefill's
 * x while the others waited was 2.4% of a 1024-token SmolLM2 Q4_1 prefill's samples). */
void ds_qx_quantize(ds_qx *qx, const float *x, int64_t n, int64_t in) {
  int nt = n >= 2 && n * in > 65536 ? ds_get_num_threads() : 1; /* a small one: no region (cpu_kernels.h) */
#ifdef DSPARK_USE_OPENMP
  if (nt > 1) { /* each thread's contiguous share of the rows, as ds_quant_direct_cat shares blocks */
#pragma omp parallel num_threads(nt)
    {
      int t = omp_get_thread_num(), T = omp_get_num_threads();
      int64_t i0 = n * t / T, i1 = n * (t + 1) / T, nb = in / DS_QX_BLOCK;
      ds_qx part = {qx->q + i0 * in, qx->d + i0 * nb, qx->s + i0 * (in / 16), qx->m + i0 * nb};
      if (i1 > i0) qx_quantize_rows(&part, x + i0 * in, i1 - i0, in);
    }
    return;
  }
#endif
  (void)nt;
  qx_quantize_rows(qx, x, n, in);
}

void ds_qx_quantize_portable(ds_qx *qx, const float *x, int64_t n, int64_t in) {
  DS_CHECK(in % DS_QX_BLOCK == 0);
  int64_t nb = in / DS_QX_BLOCK;
  for (int64_t i = 0; i < n; i++)
    for (int64_t b = 0; b < nb; b++) {
      const float *xb = x + i * in + b * DS_QX_BLOCK;
      int8_t *q = qx->q + i * in + b * DS_QX_BLOCK;
      float amax = 0.0f;
      int nan = 0;
      for (int l = 0; l < DS_QX_BLOCK; l++) {
        float a = fabsf(xb[l]);
        amax = a > amax ? a : amax;
        nan |= a != a;
      }
      float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
      int v[DS_QX_BLOCK];
      for (int l = 0; l < DS_QX_BLOCK; l++) {
        float r = xb[l] * id;
        r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r == r ? r : 0.0f;
        v[l] = (int)((r + 0x1.8p23f) - 0x1.8p23f);
      }
      int s0 = 0, s1 = 0;
      for (int l = 0; l < DS_QX_BLOCK; l++) {
        q[l] = (int8_t)v[l];
        if (l < 16) s0 += v[l];
        else s1 += v[l];
      }
      if (nan) d = NAN; /* a NaN in x makes every output it meets NaN, as in fp32 */
      qx->d[i * nb + b] = d;
      qx->m[i * nb + b] = d * (float)(s0 + s1);
      qx->s[(i * nb + b) * 2] = (int16_t)s0;
      qx->s[(i * nb + b) * 2 + 1] = (int16_t)s1;
    }
}

/* ---------------------------------------------------------------- portable row kernel */

static float f16_at(const unsigned char *p) { return ds_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

/* One weight row (nb blocks of type dt) dotted with one quantized x row. Shapes: w row of in
 * values, xq[in], xd[in / 32], xs[in / 16]. */
static float dot_row_portable(const unsigned char *w, ds_dtype dt, const int8_t *xq, const float *xd,
                              const int16_t *xs, int64_t in) {
  float acc = 0.0f;
  switch (dt) {
    case DS_Q8_0:
      for (int64_t b = 0; b < in / 32; b++, w += 34) {
        const int8_t *q = (const int8_t *)(w + 2);
        int s = 0;
        for (int l = 0; l < 32; l++) s += q[l] * xq[32 * b + l];
        acc += f16_at(w) * xd[b] * (float)s;
      }
      break;
    case DS_Q4_0:
    case DS_Q4_1: {
      int q41 = dt == DS_Q4_1;
      for (int64_t b = 0; b < in / 32; b++, w += q41 ? 20 : 18) {
        const unsigned char *qs = w + (q41 ? 4 : 2);
        const int8_t *x = xq + 32 * b;
        int s = 0, xsum = xs[2 * b] + xs[2 * b + 1];
        for (int l = 0; l < 16; l++) s += (qs[l] & 0xF) * x[l] + (qs[l] >> 4) * x[l + 16];
        if (q41) acc += f16_at(w) * xd[b] * (float)s + f16_at(w + 2) * xd[b] * (float)xsum;
        else acc += f16_at(w) * xd[b] * (float)(s - 8 * xsum); /* x = d (q - 8) */
      }
      break;
    }
    case DS_Q5_0:
    case DS_Q5_1: {
      int q51 = dt == DS_Q5_1;
      for (int64_t b = 0; b < in / 32; b++, w += q51 ? 24 : 22) {
        const unsigned char *qh = w + (q51 ? 4 : 2), *qs = qh + 4;
        uint32_t h = ds_quant_le32(qh);
        const int8_t *x = xq + 32 * b;
        int s = 0, xsum = xs[2 * b] + xs[2 * b + 1];
        for (int l = 0; l < 16; l++)
          s += ((qs[l] & 0xF) | ((h >> l) & 1) << 4) * x[l] + ((qs[l] >> 4) | ((h >> (l + 16)) & 1) << 4) * x[l + 16];
        if (q51) acc += f16_at(w) * xd[b] * (float)s + f16_at(w + 2) * xd[b] * (float)xsum;
        else acc += f16_at(w) * xd[b] * (float)(s - 16 * xsum); /* x = d (q - 16) */
      }
      break;
    }
    case DS_Q4_K:
      for (int64_t b = 0; b < in / 256; b++, w += 144) {
        float d = f16_at(w), dmin = f16_at(w + 2);
        uint8_t sc[8], mn[8];
        ds_ggml_q4k_scales(w + 4, sc, mn);
        for (int j = 0; j < 8; j++) {
          const unsigned char *qs = w + 16 + 32 * (j / 2);
          int shift = 4 * (j % 2), s = 0;
          int64_t k = 8 * b + j; /* x's block of 32 */
          for (int l = 0; l < 32; l++) s += ((qs[l] >> shift) & 0xF) * xq[32 * k + l];
          acc += xd[k] * (d * (float)sc[j] * (float)s - dmin * (float)mn[j] * (float)(xs[2 * k] + xs[2 * k + 1]));
        }
      }
      break;
    case DS_Q6_K:
      for (int64_t b = 0; b < in / 256; b++, w += 210) {
        const unsigned char *ql = w, *qh = w + 128;
        const int8_t *sc = (const int8_t *)(w + 192);
        float d = f16_at(w + 208);
        for (int g = 0; g < 16; g++) { /* 16 values of one scale */
          int s = 0;
          for (int l = 0; l < 16; l++) {
            int v = 16 * g + l, half = v / 128, within = v % 128;
            int lo = (ql[64 * half + within % 64] >> (4 * (within / 64))) & 0xF;
            int hi = (qh[32 * half + within % 32] >> (2 * (within / 32))) & 3;
            s += (lo | hi << 4) * xq[256 * b + v];
          }
          int64_t G = 16 * b + g; /* x's group of 16 */
          acc += d * (float)sc[g] * xd[G / 2] * (float)(s - 32 * xs[G]); /* x = d sc (q - 32) */
        }
      }
      break;
    default: DS_CHECK(!"a quantized dtype the kernels do not know");
  }
  return acc;
}

void ds_quant_rows_portable(float *y, int64_t ldy, const ds_qx *x, int64_t n, const unsigned char *w, ds_dtype dt,
                            int64_t in, int64_t o0, int64_t o1, const float *bias) {
  size_t rb = ds_quant_row_bytes(dt, in);
  for (int64_t o = o0; o < o1; o++)
    for (int64_t i = 0; i < n; i++)
      y[i * ldy + o] = dot_row_portable(w + (size_t)o * rb, dt, x->q + i * in, x->d + i * (in / 32),
                                        x->s + i * (in / 16), in) +
                       (bias ? bias[o] : 0.0f);
}

/* ---------------------------------------------------------------- instruction sets */

static int cpu_has_vnni(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512bw");
#else
  return 0;
#endif
}

ds_qisa ds_qisa_best(void) {
  ds_isa isa = ds_isa_best(); /* AVX2 there means AVX2 + FMA + F16C, which the AVX2 kernel uses */
  if (isa == DS_ISA_AVX512) return cpu_has_vnni() ? DS_QISA_VNNI : DS_QISA_AVX2;
  return isa == DS_ISA_AVX2 ? DS_QISA_AVX2_PACKED : DS_QISA_PORTABLE;
}

const char *ds_qisa_name(ds_qisa isa) {
  return isa == DS_QISA_VNNI          ? "AVX-512 VNNI"
         : isa == DS_QISA_AVX2_PACKED ? "AVX2 (8-row packed)"
         : isa == DS_QISA_AVX2        ? "AVX2"
                                      : "portable";
}

/* none by default: on a Zen 4 prefetches 1 KiB ahead, or of whole groups, were slower */
size_t ds_quant_prefetch_bytes(void) { return ds_weight_prefetch_bytes(0); }

static int reads_packed(ds_qisa isa);
static char g_kernel_name[64];

static void kernel_name_decide(void) {
  ds_qisa isa = ds_qisa_best();
  size_t pf = reads_packed(isa) ? ds_quant_prefetch_bytes() : 0;
  if (pf) snprintf(g_kernel_name, sizeof g_kernel_name, "%s, prefetch %zu B ahead", ds_qisa_name(isa), pf);
  else snprintf(g_kernel_name, sizeof g_kernel_name, "%s", ds_qisa_name(isa));
}

/* the instruction set, and the prefetch distance where the packed kernels run one */
const char *ds_weight_quant_kernel_name(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, kernel_name_decide);
  return g_kernel_name;
}

static ds_quant_rows_fn pick_rows(ds_qisa isa) {
  ds_qisa best = ds_qisa_best();
  if (isa > best) isa = best; /* never a SIGILL */
#if defined(__x86_64__) || defined(__i386__)
  if (isa == DS_QISA_VNNI) return ds_quant_rows_vnni;
  if (isa == DS_QISA_AVX2 || isa == DS_QISA_AVX2_PACKED) return ds_quant_rows_avx2;
#endif
  return ds_quant_rows_portable;
}

/* ---------------------------------------------------------------- regimes */

/* the instruction sets whose direct path reads the 8-row packed copies */
static int reads_packed(ds_qisa isa) { return isa == DS_QISA_AVX2_PACKED || isa == DS_QISA_VNNI; }

enum { ROW_BLOCK = 16 }; /* weight rows per parallel task */

typedef struct {
  float *y;
  int64_t ldy;
  const ds_qx *qx;
  const ds_weight *w;
  const int64_t *out;
  int n_seg;
  const float *bias;
  int64_t n, in;
  ds_qisa isa;
  ds_quant_rows_fn rows;
  const unsigned char *const *packed;
  const ds_cat_blocks *c;
  size_t prefetch;
} direct_span_args;

/* The products of blocks [b0, b1): each segment's rows in them, packed groups by the packed
 * kernel and the rest (< 8 rows) by the row kernel. */
static void direct_span(const direct_span_args *a, int64_t b0, int64_t b1) {
  for (int s = 0; s < a->n_seg; s++) {
    int64_t o0, o1;
    ds_cat_span(a->c, a->out, s, b0, b1, &o0, &o1);
    if (o0 >= o1) continue;
    float *ys = a->y + a->c->col[s];
    const float *bs = a->bias ? a->bias + a->c->col[s] : NULL;
#if defined(__x86_64__) || defined(__i386__)
    if (a->packed[s]) {
      int64_t o8 = o0 + (o1 - o0) / 8 * 8;
      if (a->isa == DS_QISA_VNNI)
        ds_quant_packed_rows_vnni(ys, a->ldy, a->qx, a->n, a->packed[s], a->w[s].dtype, a->in, o0, o8, bs, a->prefetch);
      else
        ds_quant_packed_rows_avx2(ys, a->ldy, a->qx, a->n, a->packed[s], a->w[s].dtype, a->in, o0, o8, bs, a->prefetch);
      o0 = o8;
    }
#endif
    if (o0 < o1) a->rows(ys, a->ldy, a->qx, a->n, a->w[s].data, a->w[s].dtype, a->in, o0, o1, bs);
  }
}

int ds_quant_direct_cat(ds_qisa isa, float *y, int64_t ldy, const float *x, const ds_weight *w, const int64_t *out,
                        int n_seg, const float *bias, int64_t n, int64_t in) {
  if (n <= 0 || n_seg <= 0) return 1;
  DS_CHECK(n_seg <= DS_CAT_SEG_MAX);
  for (int s = 0; s < n_seg; s++) DS_CHECK(ds_dtype_is_quantized(w[s].dtype) && in % ds_quant_block(w[s].dtype) == 0);
  ds_qx qx;
  if (!ds_qx_alloc(&qx, n, in)) return 0;
  ds_qx_quantize(&qx, x, n, in);
  ds_quant_rows_fn rows = pick_rows(isa);
  const unsigned char *packed[DS_CAT_SEG_MAX] = {0};
  if (isa > ds_qisa_best()) isa = ds_qisa_best(); /* never a SIGILL */
  if (reads_packed(isa))
    for (int s = 0; s < n_seg; s++) packed[s] = ds_quant_packed(w[s], out[s], in);
  ds_cat_blocks c;
  ds_cat_blocks_init(&c, out, n_seg, ROW_BLOCK); /* ROW_BLOCK a multiple of 8: whole packed groups */
  direct_span_args a = {y, ldy, &qx, w, out, n_seg, bias, n, in, isa, rows, packed, &c, ds_quant_prefetch_bytes()};
  int nt = c.total * in > 65536 ? ds_get_num_threads() : 1; /* a small product: no region (cpu_kernels.h) */
#ifdef DSPARK_USE_OPENMP
  if (nt > 1) {
    /* each thread's contiguous share of the blocks, one kernel call per segment in it (a call
     * per block of 16 rows took 2.5% of the kernel's time in a SmolLM2 Q4_1 decode, on setup) */
#pragma omp parallel num_threads(nt)
    {
      int t = omp_get_thread_num(), T = omp_get_num_threads();
      direct_span(&a, c.blocks * t / T, c.blocks * (t + 1) / T);
    }
  } else
#endif
  {
    (void)nt;
    direct_span(&a, 0, c.blocks);
  }
  ds_qx_free(&qx);
  return 1;
}

/* Row r of w (in values) to fp32: from its packed copy when one holds it (the stored bytes put
 * back into row, a scratch of the row's bytes), else where it lies. */
static void dequantize_row(float *dst, ds_weight w, int64_t in, int64_t r, const unsigned char *packed,
                           int64_t rows_packed, unsigned char *row) {
  size_t rb = ds_quant_row_bytes(w.dtype, in);
  const unsigned char *src = (const unsigned char *)w.data + (size_t)r * rb;
  if (packed && r < rows_packed) ds_quant_unpack_row(row, packed, w.dtype, in, r), src = row;
  ds_ggml_dequantize_row((uint32_t)ds_dtype_ggml_type(w.dtype), src, dst, in);
}

void ds_quant_dequantize_rows(float *dst, ds_weight w, int64_t in, int64_t r0, int64_t rows) {
  int64_t rows_packed = 0;
  const unsigned char *packed = ds_quant_packed_find(w.data, w.dtype, in, &rows_packed);
  size_t rb = ds_quant_row_bytes(w.dtype, in);
  DS_OMP(parallel if (rows * in > 65536))
  {
    unsigned char *row = packed ? malloc(rb) : NULL;
    int64_t from_copy = row ? rows_packed : 0; /* no scratch: the stored rows (faulted back in) */
    DS_OMP(for schedule(static))
    for (int64_t r = 0; r < rows; r++) dequantize_row(dst + r * in, w, in, r0 + r, packed, from_copy, row);
    free(row);
  }
}

/* About 4 MiB of fp32 rows (at least 16, a multiple of 16): measured on SmolLM2-135M's shapes
 * (bench_quant --chunk-kb, 1 thread, AMD EPYC), 4 MiB chunks ran 1.1-2x faster than 16 MiB ones
 * (a fresh 16 MiB scratch is page-faulted on every call, and the rows leave the cache before the
 * GEMM reads them) and up to 1.5x faster than 1 MiB ones (more, smaller GEMM calls). */
int64_t ds_quant_chunk_rows(int64_t in, int64_t out) {
  int64_t rows = ((int64_t)4 << 20) / (4 * (in > 0 ? in : 1));
  rows = rows < 16 ? 16 : rows & ~(int64_t)15;
  return rows < out ? rows : out;
}

static float *scratch_alloc(int64_t floats) {
  size_t bytes = ((size_t)floats * sizeof(float) + 63) & ~(size_t)63;
  return aligned_alloc(64, bytes ? bytes : 64); /* no error recorded: the caller falls back */
}

int ds_quant_chunked(float *y, int64_t ldy, const float *x, ds_weight w, const float *bias, int64_t n, int64_t in,
                     int64_t out, int64_t chunk_rows) {
  if (n <= 0 || out <= 0) return 1;
  if (chunk_rows < 1 || chunk_rows > out) chunk_rows = out;
  float *buf = scratch_alloc(chunk_rows * in);
  if (!buf) return 0;
  if (bias) {
    DS_OMP(parallel for schedule(static) if (n * out > 65536))
    for (int64_t i = 0; i < n; i++) memcpy(y + i * ldy, bias, (size_t)out * sizeof(float));
  }
  for (int64_t o0 = 0; o0 < out; o0 += chunk_rows) {
    int64_t c = out - o0 < chunk_rows ? out - o0 : chunk_rows;
    ds_quant_dequantize_rows(buf, w, in, o0, c);
    /* under DS_COMPUTE_BF16 the dequantized rows are rounded to bf16 like any frozen fp32 weight */
    ds_cpu_matmul_w(0, 1, n, c, in, x, in, buf, in, bias ? 1.0f : 0.0f, y + o0, ldy, n, DS_BF16_MIN_ROWS_F32W);
  }
  free(buf);
  return 1;
}

/* ---------------------------------------------------------------- backend entries */

/* n rows of x take the direct (integer) path: up to DS_QUANT_DIRECT_MAX_ROWS, or any number
 * under DS_COMPUTE_INT8 and by default (ds_quant_int8_rows) */
static int direct_rows(int64_t n) { return n <= DS_QUANT_DIRECT_MAX_ROWS || ds_quant_int8_rows(); }

void ds_cpu_linear_quant(float *y, int64_t ldy, const float *x, ds_weight w, const float *bias, int64_t n,
                         int64_t in, int64_t out) {
  int64_t one[1] = {out};
  if (!direct_rows(n) && ds_quant_chunked(y, ldy, x, w, bias, n, in, out, ds_quant_chunk_rows(in, out))) return;
  if (!ds_quant_direct_cat(ds_qisa_best(), y, ldy, x, &w, one, 1, bias, n, in) &&
      !ds_quant_chunked(y, ldy, x, w, bias, n, in, out, 16))
    DS_CHECK(!"out of memory in a quantized matmul");
}

void ds_cpu_linear_quant_cat(float *y, int64_t ldy, const float *x, const ds_weight *w, const int64_t *out, int n_seg,
                             const float *bias, int64_t n, int64_t in) {
  if (direct_rows(n) && n_seg <= DS_CAT_SEG_MAX && ds_quant_direct_cat(ds_qisa_best(), y, ldy, x, w, out, n_seg, bias, n, in))
    return;
  int64_t col = 0;
  for (int s = 0; s < n_seg; s++) {
    ds_cpu_linear_quant(y + col, ldy, x, w[s], bias ? bias + col : NULL, n, in, out[s]);
    col += out[s];
  }
}

void ds_cpu_linear_quant_backward(float *dx, const float *dy, ds_weight w, int64_t n, int64_t in, int64_t out) {
  if (n <= 0 || in <= 0 || out <= 0) return;
  int64_t chunk = ds_quant_chunk_rows(in, out);
  float *buf = scratch_alloc(chunk * in);
  if (!buf) chunk = 16, buf = scratch_alloc(chunk * in);
  DS_CHECK(buf != NULL);
  for (int64_t o0 = 0; o0 < out; o0 += chunk) {
    int64_t c = out - o0 < chunk ? out - o0 : chunk;
    ds_quant_dequantize_rows(buf, w, in, o0, c);
    /* dx += dy[:, o0:o0+c] @ w[o0:o0+c, :] */
    ds_cpu_matmul_w(0, 0, n, in, c, dy + o0, out, buf, in, 1.0f, dx, in, n, DS_BF16_MIN_ROWS_F32W);
  }
  free(buf);
}

void ds_cpu_embedding_quant(float *y, const int32_t *ids, ds_weight table, int64_t n, int64_t d) {
  int64_t rows_packed = 0; /* a tied head's table has its packed copy */
  const unsigned char *packed = ds_quant_packed_find(table.data, table.dtype, d, &rows_packed);
  size_t rb = ds_quant_row_bytes(table.dtype, d);
  DS_OMP(parallel if (n * d > 65536))
  {
    unsigned char *row = packed ? malloc(rb) : NULL;
    int64_t from_copy = row ? rows_packed : 0;
    DS_OMP(for schedule(static))
    for (int64_t i = 0; i < n; i++) dequantize_row(y + i * d, table, d, ids[i], packed, from_copy, row);
    free(row);
  }
}

void ds_cpu_prepare_quant_weight(ds_weight w, int64_t rows, int64_t in) {
  if (reads_packed(ds_qisa_best())) (void)ds_quant_packed(w, rows, in); /* NULL for a type without the layout */
}
