/* Matmuls and lookups on frozen BF16 / F16 weights for the CPU backend (contracts in
 * nn/cpu_linear16.h and include/dspark/backend.h), and the direct (row-streaming) product of a
 * frozen F32 weight at decode. Every weight value is converted to fp32 exactly (bf16: the 16
 * bits are the top half of the fp32; f16: the IEEE half is widened) and every product
 * accumulates in fp32: activations are never rounded.
 *
 * The instruction-set variants are compiled with __attribute__((target(...))) and chosen at
 * run time from cpuid (__builtin_cpu_supports), so the same binary is correct on a CPU
 * without AVX-512 or AVX2, whatever -march the build used. OpenMP regions live in plain
 * functions that call the per-ISA kernels on row blocks. */
#include "nn/cpu_linear16.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/cpu_gemm_bf16.h"
#include "nn/cpu_kernels.h"
#include "nn/linear_cat.h"

#if defined(__x86_64__) || defined(__i386__)
#define DS_X86 1
#include <immintrin.h>
#endif

/* ---------------------------------------------------------------- scalar conversion */

static inline float bits_to_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline float bf16_f32(uint16_t h) { return bits_to_f32((uint32_t)h << 16); }

/* IEEE half -> float, exact: the exponent and mantissa bits shifted into place make a float
 * 2^112 times too small (a half subnormal becomes a float subnormal), so one multiply by 2^112
 * rescales normals and subnormals alike; infinities and NaNs keep their payload. */
static inline float f16_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, em = h & 0x7fffu;
  if (em >= 0x7c00u) return bits_to_f32(sign | 0x7f800000u | ((em & 0x3ffu) << 13));
  float f = bits_to_f32(em << 13) * 0x1p112f;
  uint32_t u;
  memcpy(&u, &f, 4);
  return bits_to_f32(u | sign);
}

/* The direct kernels' weight kinds; a constant at every call site of the inlined tiles. */
enum { W_BF16 = 0, W_F16 = 1, W_F32 = 2 };

static inline float conv16(uint16_t h, int f16) { return f16 ? f16_f32(h) : bf16_f32(h); }

/* Element q of a weight row of the given kind, as fp32. */
static inline float welem(const void *w, int64_t q, int kind) {
  return kind == W_F32 ? ((const float *)w)[q] : conv16(((const uint16_t *)w)[q], kind == W_F16);
}

static inline size_t wbytes(int kind) { return kind == W_F32 ? 4 : 2; }

static void convert_portable(float *dst, const uint16_t *src, int64_t count, int f16) {
  if (f16)
    for (int64_t i = 0; i < count; i++) dst[i] = f16_f32(src[i]);
  else
    for (int64_t i = 0; i < count; i++) dst[i] = bf16_f32(src[i]);
}


static char g_kernel_name[48];

static void kernel_name_decide(void) {
  ds_isa isa = ds_isa_best();
  size_t pf = ds_weight_prefetch_bytes(1024);
  if (isa == DS_ISA_AVX512 && pf)
    snprintf(g_kernel_name, sizeof g_kernel_name, "AVX-512, prefetch %zu B ahead", pf);
  else if (isa == DS_ISA_AVX512)
    snprintf(g_kernel_name, sizeof g_kernel_name, "AVX-512, no prefetch");
  else
    snprintf(g_kernel_name, sizeof g_kernel_name, "%s", ds_isa_name(isa));
}

/* the instruction set, and the AVX-512 kernels' prefetch distance */
const char *ds_weight16_kernel_name(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, kernel_name_decide);
  return g_kernel_name;
}

int64_t ds_linear16_chunk_rows(int64_t in, int64_t out) {
  int64_t rows = ((int64_t)16 << 20) / (4 * (in > 0 ? in : 1));
  rows = rows < 16 ? 16 : rows & ~(int64_t)15;
  return rows < out ? rows : out;
}

/* A row-block kernel: y[i, o] for i < n and o in [o0, o1), w's rows of the given kind. */
typedef void (*rows_fn)(float *y, int64_t ldy, const float *x, const void *w, const float *bias, int64_t n,
                        int64_t in, int64_t o0, int64_t o1, int kind);
typedef void (*convert_fn)(float *dst, const uint16_t *src, int64_t count, int f16);

/* Portable rows: each weight row is converted in pieces of 256 into a local fp32 buffer and
 * dotted with up to 8 rows of x at a time. */
static void rows_portable(float *y, int64_t ldy, const float *x, const void *w, const float *bias, int64_t n,
                          int64_t in, int64_t o0, int64_t o1, int kind) {
  enum { P = 256, NI = 8 };
  float wf[P];
  for (int64_t o = o0; o < o1; o++) {
    const unsigned char *wr = (const unsigned char *)w + (size_t)(o * in) * wbytes(kind);
    for (int64_t i0 = 0; i0 < n; i0 += NI) {
      int64_t ni = n - i0 < NI ? n - i0 : NI;
      float acc[NI] = {0};
      for (int64_t p0 = 0; p0 < in; p0 += P) {
        int64_t np = in - p0 < P ? in - p0 : P;
        if (kind == W_F32) memcpy(wf, (const float *)(const void *)wr + p0, (size_t)np * sizeof(float));
        else convert_portable(wf, (const uint16_t *)(const void *)wr + p0, np, kind == W_F16);
        for (int64_t i = 0; i < ni; i++) {
          const float *xi = x + (i0 + i) * in + p0;
          float s = 0.0f;
          DS_OMP(simd reduction(+ : s))
          for (int64_t p = 0; p < np; p++) s += wf[p] * xi[p];
          acc[i] += s;
        }
      }
      for (int64_t i = 0; i < ni; i++) y[(i0 + i) * ldy + o] = acc[i] + (bias ? bias[o] : 0.0f);
    }
  }
}

#ifdef DS_X86
/* ---------------------------------------------------------------- AVX-512 */

#define T512 __attribute__((target("avx512f")))
#define T512_INLINE static inline __attribute__((always_inline, target("avx512f")))

T512_INLINE __m512 load16_512(const uint16_t *p, int f16) {
  __m256i h = _mm256_loadu_si256((const __m256i *)p);
  if (f16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* 16 weights from element p of a row of the given kind, as fp32 */
T512_INLINE __m512 loadw_512(const void *w, int64_t p, int kind) {
  if (kind == W_F32) return _mm512_loadu_ps((const float *)w + p);
  return load16_512((const uint16_t *)w + p, kind == W_F16);
}

/* One weight row times C rows of x (i .. i+C-1): 2 C fp32 accumulators of 16 lanes, the even and
 * odd 16-value steps apart (two chains hide the FMA latency when C is 1); C and kind are
 * constants at every call site. A row's sums run in the same order whatever C is, so a row of x
 * gets the same numbers alone (decode) as with others (verification). */
T512_INLINE void tile_512(float *y, int64_t ldy, const float *x, const void *w, const float *bias, int64_t in,
                          int C, int kind, size_t pf) {
  __m512 acc[4][2];
  for (int c = 0; c < C; c++) acc[c][0] = acc[c][1] = _mm512_setzero_ps();
  int64_t p = 0;
  for (; p + 32 <= in; p += 32) {
    /* pf ahead (1 KiB, 8 KiB on a Zen 5: ds_weight_prefetch_bytes), one line per 64 bytes: the
     * weight is read row after row, one stream (the 4-row bands this replaced read 4 short
     * streams at once, which the hardware prefetcher barely caught). bench_linear16 --decode, AMD
     * EPYC Zen 4, 1 thread, alternated runs: 20-26 GB/s (median 22.9) 1 KiB ahead against 16 with
     * 8 rows ahead and 22-24 with none; Zen 5, 1 thread: 31.7 GB/s 1 KiB ahead, 36-38 4 KiB,
     * 38-41 8 KiB, 37-38 16 KiB. Splitting each 64 bytes of BF16 into even and odd values against
     * a reordered x (one load, a shift and a mask per 32 values) measured slower, 19-20.5 GB/s.
     * Past the last row it touches nothing, a prefetch never faults (the address formed as an
     * integer: a pointer past its object's end would be undefined in C) */
    uintptr_t ahead = (uintptr_t)w + (uintptr_t)p * (uintptr_t)wbytes(kind) + pf;
    _mm_prefetch((const char *)ahead, _MM_HINT_T0);
    if (kind == W_F32) _mm_prefetch((const char *)(ahead + 64), _MM_HINT_T0); /* 128 bytes a step */
    __m512 w0 = loadw_512(w, p, kind), w1 = loadw_512(w, p + 16, kind);
    for (int c = 0; c < C; c++) {
      acc[c][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + c * in + p), acc[c][0]);
      acc[c][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + c * in + p + 16), acc[c][1]);
    }
  }
  if (p + 16 <= in) {
    __m512 w0 = loadw_512(w, p, kind);
    for (int c = 0; c < C; c++) acc[c][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + c * in + p), acc[c][0]);
    p += 16;
  }
  for (int c = 0; c < C; c++) {
    float s = _mm512_reduce_add_ps(_mm512_add_ps(acc[c][0], acc[c][1]));
    for (int64_t q = p; q < in; q++) s += welem(w, q, kind) * x[c * in + q];
    y[c * ldy] = s + (bias ? bias[0] : 0.0f);
  }
}

/* One weight row against every row of x, 4 rows of x at a time (the row stays in L1). */
T512_INLINE void band_512(float *y, int64_t ldy, const float *x, const void *w, const float *bias, int64_t n,
                          int64_t in, int kind, size_t pf) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) tile_512(y + i * ldy, ldy, x + i * in, w, bias, in, 4, kind, pf);
  switch (n - i) {
    case 3: tile_512(y + i * ldy, ldy, x + i * in, w, bias, in, 3, kind, pf); break;
    case 2: tile_512(y + i * ldy, ldy, x + i * in, w, bias, in, 2, kind, pf); break;
    case 1: tile_512(y + i * ldy, ldy, x + i * in, w, bias, in, 1, kind, pf); break;
    default: break;
  }
}

T512 static void rows_avx512(float *y, int64_t ldy, const float *x, const void *w, const float *bias, int64_t n,
                             int64_t in, int64_t o0, int64_t o1, int kind) {
  size_t pf = ds_weight_prefetch_bytes(1024);
  for (int64_t o = o0; o < o1; o++) {
    const char *wr = (const char *)w + (size_t)(o * in) * wbytes(kind);
    const float *b = bias ? bias + o : NULL;
    if (kind == W_F32) band_512(y + o, ldy, x, wr, b, n, in, W_F32, pf);
    else if (kind == W_F16) band_512(y + o, ldy, x, wr, b, n, in, W_F16, pf);
    else band_512(y + o, ldy, x, wr, b, n, in, W_BF16, pf);
  }
}

T512 static void convert_avx512(float *dst, const uint16_t *src, int64_t count, int f16) {
  int64_t i = 0;
  if (f16)
    for (; i + 16 <= count; i += 16) _mm512_storeu_ps(dst + i, load16_512(src + i, 1));
  else
    for (; i + 16 <= count; i += 16) _mm512_storeu_ps(dst + i, load16_512(src + i, 0));
  convert_portable(dst + i, src + i, count - i, f16);
}

/* ---------------------------------------------------------------- AVX2 + FMA + F16C */

#define T256 __attribute__((target("avx2,fma,f16c")))
#define T256_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

T256_INLINE __m256 load8_256(const uint16_t *p, int f16) {
  __m128i h = _mm_loadu_si128((const __m128i *)p);
  if (f16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* 8 weights from element p of a row of the given kind, as fp32 */
T256_INLINE __m256 loadw_256(const void *w, int64_t p, int kind) {
  if (kind == W_F32) return _mm256_loadu_ps((const float *)w + p);
  return load8_256((const uint16_t *)w + p, kind == W_F16);
}

T256_INLINE float hsum_256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/* tile_512 at 8 lanes: one weight row times C rows of x, two accumulator chains each. */
T256_INLINE void tile_256(float *y, int64_t ldy, const float *x, const void *w, const float *bias, int64_t in,
                          int C, int kind) {
  __m256 acc[4][2];
  for (int c = 0; c < C; c++) acc[c][0] = acc[c][1] = _mm256_setzero_ps();
  int64_t p = 0;
  for (; p + 16 <= in; p += 16) {
    if (!(p & 31)) _mm_prefetch((const char *)w + (size_t)(8 * in + p) * wbytes(kind), _MM_HINT_T0); /* 8 rows ahead */
    if (kind == W_F32 && !(p & 31)) _mm_prefetch((const char *)w + (size_t)(8 * in + p) * 4 + 64, _MM_HINT_T0);
    __m256 w0 = loadw_256(w, p, kind), w1 = loadw_256(w, p + 8, kind);
    for (int c = 0; c < C; c++) {
      acc[c][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + c * in + p), acc[c][0]);
      acc[c][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + c * in + p + 8), acc[c][1]);
    }
  }
  if (p + 8 <= in) {
    __m256 w0 = loadw_256(w, p, kind);
    for (int c = 0; c < C; c++) acc[c][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + c * in + p), acc[c][0]);
    p += 8;
  }
  for (int c = 0; c < C; c++) {
    float s = hsum_256(_mm256_add_ps(acc[c][0], acc[c][1]));
    for (int64_t q = p; q < in; q++) s += welem(w, q, kind) * x[c * in + q];
    y[c * ldy] = s + (bias ? bias[0] : 0.0f);
  }
}

/* One weight row against every row of x, 4 rows of x at a time (16 registers: 8 accumulators,
 * 2 weight vectors, the x loads). */
T256_INLINE void band_256(float *y, int64_t ldy, const float *x, const void *w, const float *bias, int64_t n,
                          int64_t in, int kind) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) tile_256(y + i * ldy, ldy, x + i * in, w, bias, in, 4, kind);
  switch (n - i) {
    case 3: tile_256(y + i * ldy, ldy, x + i * in, w, bias, in, 3, kind); break;
    case 2: tile_256(y + i * ldy, ldy, x + i * in, w, bias, in, 2, kind); break;
    case 1: tile_256(y + i * ldy, ldy, x + i * in, w, bias, in, 1, kind); break;
    default: break;
  }
}

T256 static void rows_avx2(float *y, int64_t ldy, const float *x, const void *w, const float *bias, int64_t n,
                           int64_t in, int64_t o0, int64_t o1, int kind) {
  for (int64_t o = o0; o < o1; o++) {
    const char *wr = (const char *)w + (size_t)(o * in) * wbytes(kind);
    const float *b = bias ? bias + o : NULL;
    if (kind == W_F32) band_256(y + o, ldy, x, wr, b, n, in, W_F32);
    else if (kind == W_F16) band_256(y + o, ldy, x, wr, b, n, in, W_F16);
    else band_256(y + o, ldy, x, wr, b, n, in, W_BF16);
  }
}

T256 static void convert_avx2(float *dst, const uint16_t *src, int64_t count, int f16) {
  int64_t i = 0;
  if (f16)
    for (; i + 8 <= count; i += 8) _mm256_storeu_ps(dst + i, load8_256(src + i, 1));
  else
    for (; i + 8 <= count; i += 8) _mm256_storeu_ps(dst + i, load8_256(src + i, 0));
  convert_portable(dst + i, src + i, count - i, f16);
}
#endif /* DS_X86 */

/* ---------------------------------------------------------------- dispatch */

static rows_fn pick_rows(ds_isa isa) {
#ifdef DS_X86
  if (isa == DS_ISA_AVX512) return rows_avx512;
  if (isa == DS_ISA_AVX2) return rows_avx2;
#endif
  (void)isa;
  return rows_portable;
}

static convert_fn pick_convert(ds_isa isa) {
#ifdef DS_X86
  if (isa == DS_ISA_AVX512) return convert_avx512;
  if (isa == DS_ISA_AVX2) return convert_avx2;
#endif
  (void)isa;
  return convert_portable;
}

/* A request for an instruction set the CPU lacks runs the best one it has (never a SIGILL). */
static ds_isa clamp_isa(ds_isa isa) {
  ds_isa best = ds_isa_best();
  return isa > best ? best : isa;
}

static int is_f16(ds_weight w) {
  DS_CHECK(w.dtype == DS_BF16 || w.dtype == DS_F16);
  return w.dtype == DS_F16;
}

/* The direct kernels' kind of w (BF16, F16 or F32). */
static int kind_of(ds_weight w) {
  DS_CHECK(w.dtype == DS_BF16 || w.dtype == DS_F16 || w.dtype == DS_F32);
  return w.dtype == DS_F32 ? W_F32 : w.dtype == DS_F16 ? W_F16 : W_BF16;
}

enum { ROW_BLOCK = 16 }; /* weight rows per parallel task */

void ds_convert16(ds_isa isa, float *dst, const uint16_t *src, int64_t count, ds_dtype dtype) {
  convert_fn conv = pick_convert(clamp_isa(isa));
  int f16 = dtype == DS_F16;
  enum { PIECE = 16384 };
  int64_t pieces = (count + PIECE - 1) / PIECE;
  DS_OMP(parallel for schedule(static) if (pieces > 1))
  for (int64_t k = 0; k < pieces; k++) {
    int64_t i0 = k * PIECE, m = count - i0 < PIECE ? count - i0 : PIECE;
    conv(dst + i0, src + i0, m, f16);
  }
}

/* y[n, out] (ldy) = x[n, in] @ w[out, in]^T (+ bias), reading w once. */
void ds_linear16_direct(ds_isa isa, float *y, int64_t ldy, const float *x, ds_weight w, const float *bias, int64_t n,
                        int64_t in, int64_t out) {
  ds_linear16_direct_cat(isa, y, ldy, x, &w, &out, 1, bias, n, in);
}

void ds_linear16_direct_cat(ds_isa isa, float *y, int64_t ldy, const float *x, const ds_weight *w, const int64_t *out,
                            int n_seg, const float *bias, int64_t n, int64_t in) {
  if (n <= 0 || n_seg <= 0) return;
  DS_CHECK(n_seg <= DS_CAT_SEG_MAX);
  rows_fn rows = pick_rows(clamp_isa(isa));
  ds_cat_blocks c;
  ds_cat_blocks_init(&c, out, n_seg, ROW_BLOCK);
  DS_OMP(parallel for schedule(static) if (c.total * in > 65536))
  for (int64_t b = 0; b < c.blocks; b++) {
    int64_t o0, o1;
    int s = ds_cat_block(&c, out, b, &o0, &o1);
    rows(y + c.col[s], ldy, x, w[s].data, bias ? bias + c.col[s] : NULL, n, in, o0, o1, kind_of(w[s]));
  }
}

void ds_cpu_linear_f32_rows(float *y, int64_t ldy, const float *x, const ds_weight *w, const int64_t *out, int n_seg,
                            const float *bias, int64_t n, int64_t in) {
  DS_CHECK(n <= DS_F32_DIRECT_MAX_ROWS);
  ds_linear16_direct_cat(ds_isa_best(), y, ldy, x, w, out, n_seg, bias, n, in);
}

static float *scratch_alloc(int64_t floats) {
  size_t bytes = ((size_t)floats * sizeof(float) + 63) & ~(size_t)63;
  return aligned_alloc(64, bytes ? bytes : 64); /* no error recorded: the caller falls back */
}

/* y[n, out] (ldy) = x[n, in] @ w[out, in]^T (+ bias), chunk_rows converted rows at a time. */
int ds_linear16_chunked(ds_isa isa, float *y, int64_t ldy, const float *x, ds_weight w, const float *bias, int64_t n,
                        int64_t in, int64_t out, int64_t chunk_rows) {
  if (n <= 0 || out <= 0) return 1;
  if (chunk_rows < 1 || chunk_rows > out) chunk_rows = out;
  float *buf = scratch_alloc(chunk_rows * in);
  if (!buf) return 0;
  const uint16_t *w16 = w.data;
  if (bias) {
    DS_OMP(parallel for schedule(static) if (n * out > 65536))
    for (int64_t i = 0; i < n; i++) memcpy(y + i * ldy, bias, (size_t)out * sizeof(float));
  }
  for (int64_t o0 = 0; o0 < out; o0 += chunk_rows) {
    int64_t c = out - o0 < chunk_rows ? out - o0 : chunk_rows;
    ds_convert16(isa, buf, w16 + o0 * in, c * in, w.dtype);
    ds_gemm_f32(0, 1, n, c, in, x, in, buf, in, bias ? 1.0f : 0.0f, y + o0, ldy);
  }
  free(buf);
  return 1;
}

/* dx[n, in] += dy[n, out] @ w[out, in]: each task owns a band of 256 columns of dx and
 * streams the weight rows' matching pieces, so dx is written by one thread and summed in
 * row order. */
void ds_linear16_backward_direct(float *dx, const float *dy, ds_weight w, int64_t n, int64_t in, int64_t out) {
  if (n <= 0 || in <= 0) return;
  enum { P = 256 };
  int f16 = is_f16(w);
  const uint16_t *w16 = w.data;
  int64_t bands = (in + P - 1) / P;
  DS_OMP(parallel for schedule(static) if (out * in > 65536))
  for (int64_t b = 0; b < bands; b++) {
    int64_t p0 = b * P, np = in - p0 < P ? in - p0 : P;
    float wf[P];
    for (int64_t o = 0; o < out; o++) {
      convert_portable(wf, w16 + o * in + p0, np, f16);
      for (int64_t i = 0; i < n; i++) {
        float g = dy[i * out + o], *d = dx + i * in + p0;
        for (int64_t p = 0; p < np; p++) d[p] += g * wf[p];
      }
    }
  }
}

int ds_linear16_backward_chunked(ds_isa isa, float *dx, const float *dy, ds_weight w, int64_t n, int64_t in,
                                 int64_t out, int64_t chunk_rows) {
  if (n <= 0 || in <= 0 || out <= 0) return 1;
  if (chunk_rows < 1 || chunk_rows > out) chunk_rows = out;
  float *buf = scratch_alloc(chunk_rows * in);
  if (!buf) return 0;
  const uint16_t *w16 = w.data;
  for (int64_t o0 = 0; o0 < out; o0 += chunk_rows) {
    int64_t c = out - o0 < chunk_rows ? out - o0 : chunk_rows;
    ds_convert16(isa, buf, w16 + o0 * in, c * in, w.dtype);
    /* dx += dy[:, o0:o0+c] @ w[o0:o0+c, :] */
    ds_gemm_f32(0, 0, n, in, c, dy + o0, out, buf, in, 1.0f, dx, in);
  }
  free(buf);
  return 1;
}

/* ---------------------------------------------------------------- backend entries */

/* Under DS_COMPUTE_BF16 a BF16 weight with enough rows of x goes to the bf16 GEMM (its packed
 * copy for each use: forward and input gradient). */
static int bf16_compute(ds_weight w, int64_t n) {
  return w.dtype == DS_BF16 && n >= DS_BF16_MIN_ROWS_BF16W && ds_matmul_compute() == DS_COMPUTE_BF16;
}

int ds_linear16_direct_wins(int64_t n, int64_t in) {
  if (n <= DS_LINEAR16_DIRECT_MAX_ROWS) return 1;
  if (ds_cpu_is_amd()) return n <= DS_LINEAR16_DIRECT_MAX_ROWS_AMD;
  return n * in * (int64_t)sizeof(float) <= DS_LINEAR16_DIRECT_MAX_X_BYTES;
}

void ds_cpu_linear16(float *y, int64_t ldy, const float *x, ds_weight w, const float *bias, int64_t n, int64_t in,
                     int64_t out) {
  if (bf16_compute(w, n)) {
    if (bias) {
      DS_OMP(parallel for schedule(static) if (n * out > 65536))
      for (int64_t i = 0; i < n; i++) memcpy(y + i * ldy, bias, (size_t)out * sizeof(float));
    }
    ds_cpu_gemm_bf16_frozen(1, n, out, in, x, in, NULL, w.data, bias ? 1.0f : 0.0f, y, ldy); /* packed once */
    return;
  }
  ds_isa isa = ds_isa_best();
  int direct = ds_linear16_direct_wins(n, in);
  if (!direct && ds_linear16_chunked(isa, y, ldy, x, w, bias, n, in, out, ds_linear16_chunk_rows(in, out))) return;
  ds_linear16_direct(isa, y, ldy, x, w, bias, n, in, out);
}

void ds_cpu_linear16_cat(float *y, int64_t ldy, const float *x, const ds_weight *w, const int64_t *out, int n_seg,
                         const float *bias, int64_t n, int64_t in) {
  int direct = ds_linear16_direct_wins(n, in);
  for (int s = 0; s < n_seg; s++) direct = direct && !bf16_compute(w[s], n);
  if (direct && n_seg <= DS_CAT_SEG_MAX) {
    ds_linear16_direct_cat(ds_isa_best(), y, ldy, x, w, out, n_seg, bias, n, in);
    return;
  }
  ds_linear_w_each_segment(ds_cpu_linear16, y, ldy, x, w, out, n_seg, bias, n, in);
}

void ds_cpu_linear16_backward(float *dx, const float *dy, ds_weight w, int64_t n, int64_t in, int64_t out) {
  if (bf16_compute(w, n)) { /* dx += dy @ w, on w's packed copy for this use */
    ds_cpu_gemm_bf16_frozen(0, n, in, out, dy, out, NULL, w.data, 1.0f, dx, in);
    return;
  }
  if (n > DS_LINEAR16_BWD_DIRECT_MAX_ROWS &&
      ds_linear16_backward_chunked(ds_isa_best(), dx, dy, w, n, in, out, ds_linear16_chunk_rows(in, out)))
    return;
  ds_linear16_backward_direct(dx, dy, w, n, in, out);
}

void ds_cpu_embedding_w(float *y, const int32_t *ids, ds_weight table, int64_t n, int64_t d) {
  if (table.dtype == DS_F32) {
    const float *t = table.data;
    for (int64_t i = 0; i < n; i++) memcpy(y + i * d, t + (int64_t)ids[i] * d, (size_t)d * sizeof(float));
    return;
  }
  convert_fn conv = pick_convert(ds_isa_best());
  int f16 = is_f16(table);
  const uint16_t *t = table.data;
  DS_OMP(parallel for schedule(static) if (n * d > 65536))
  for (int64_t i = 0; i < n; i++) conv(y + i * d, t + (int64_t)ids[i] * d, d, f16);
}
