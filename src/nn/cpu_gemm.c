/* The CPU backend's matmul (every linear and attention product goes through ds_cpu_sgemm)
 * and its thread count. The library is a build option (DSPARK_GEMM, see CMakeLists.txt):
 *   onednn    oneDNN's dnnl_sgemm: JIT kernels chosen from the CPU's features at run time, the
 *             library PyTorch uses on CPU; the default, because it reaches the machine's fp32
 *             peak on every x86 CPU measured whatever the environment sets (bench/bench_gemm.c,
 *             docs/performance.md); with MKL's cblas_sgemm, loaded at run time where the build
 *             found it (nn/cpu_gemm_mkl.h), for the large products, where it measured faster;
 *   openblas  cblas_sgemm (+ sgemv for one row); its kernel follows its own CPU detection and
 *             OPENBLAS_CORETYPE, which falls back to a generic kernel on CPUs it does not know;
 *   none      the loops below (sanitizer builds, portability).
 * ds_gemm_warning says when a slow path runs on a CPU that has a faster one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/backend.h"
#include "nn/cpu_gemm_mkl.h"
#include "nn/cpu_isa.h"
#include "nn/cpu_kernels.h"

#if defined(DSPARK_GEMM_ONEDNN)
#include <oneapi/dnnl/dnnl.h>
#elif defined(DSPARK_GEMM_OPENBLAS)
#include <cblas.h>
/* OpenBLAS extensions (declared in its cblas.h on Debian, repeated for other builds). */
void openblas_set_num_threads(int num_threads);
char *openblas_get_corename(void);
#endif
#ifdef DSPARK_USE_OPENMP
#include <omp.h>
#endif

#if !defined(DSPARK_GEMM_ONEDNN) && !defined(DSPARK_GEMM_OPENBLAS)
/* The portable path: C[m, n] = op(A) @ op(B) + beta * C with plain loops. */
static void gemm_loops(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *B,
                       int64_t ldb, float beta, float *C, int64_t ldc) {
  DS_OMP(parallel for schedule(static) if (m * n * k > 65536))
  for (int64_t i = 0; i < m; i++) {
    float *c = C + i * ldc;
    if (tb) { /* dot products with the rows of B */
      for (int64_t j = 0; j < n; j++) {
        const float *b = B + j * ldb;
        float s = 0.0f;
        for (int64_t p = 0; p < k; p++) s += (ta ? A[p * lda + i] : A[i * lda + p]) * b[p];
        c[j] = (beta != 0.0f ? c[j] : 0.0f) + s;
      }
    } else { /* row i of C accumulates rows of B */
      if (beta == 0.0f) memset(c, 0, (size_t)n * sizeof(float));
      for (int64_t p = 0; p < k; p++) {
        float a = ta ? A[p * lda + i] : A[i * lda + p];
        const float *b = B + p * ldb;
        for (int64_t j = 0; j < n; j++) c[j] += a * b[j];
      }
    }
  }
}
#endif

#if defined(DSPARK_GEMM_ONEDNN)
/* A product with B transposed of at least this many rows, and this many columns per thread,
 * is split by columns across the threads (ds_cpu_sgemm). Measured on 50 shapes of the draft's
 * step, the pretraining step and SmolLM2's prefill (2 threads, AMD EPYC Zen 4): up to 2.4x
 * faster, most where k >= 1024 or m <= 128 (the 29M Qwen3's down projection, 512 x 384 x 1536:
 * 168 -> 214 GFLOP/s); within 6% either way on the rest; below 16 rows, or 64 columns a
 * thread, no gain. */
enum { SPLIT_MIN_ROWS = 16, SPLIT_MIN_COLS = 96 };

/* row-major, as ours; a failure (bad arguments: a bug of ours) must not pass silently */
static void onednn_sgemm(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda,
                         const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, A, lda, B, ldb, beta, C, ldc);
  DS_CHECK(st == dnnl_success);
}

/* oneDNN 2.6's AVX2 no-copy kernels read an operand whose k runs down its rows (A transposed, B
 * not) in place, a row at a time: at a row stride that is a multiple of 512 bytes (d = 512, 1024,
 * 3072...) those rows fall on a few cache sets and the product runs at 60-75% of its speed at
 * another stride (the draft's [128, 32000] @ lm_head [32000, 512]: 115-123 GFLOP/s, 150-186 with
 * the rows 528 floats apart; AMD EPYC Zen 3, 2 threads). Its AVX-512 path detects such strides
 * and packs instead; here the copy is ours: each such operand is copied a k-slice at a time into
 * rows 16 floats longer, and the product accumulates slice after slice. Products oneDNN packs
 * anyway are left alone (copying cost them 5-20%). DSPARK_GEMM_PAD=0 turns it off. */
enum { PAD_LD_MULT = 128, PAD_EXTRA = 16, PAD_SLICE_FLOATS = 1 << 18, PAD_MIN_K = 128, PAD_MAX_WIDTH = 4096 };
static const int64_t PAD_MIN_MACS = (int64_t)1 << 22;

static int pad_enabled(void) {
  static int on = -1;
  if (on < 0) {
    const char *e = getenv("DSPARK_GEMM_PAD");
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    on = !(e && !strcmp(e, "0")) && (isa & dnnl_cpu_isa_avx512_core) != dnnl_cpu_isa_avx512_core;
  }
  return on;
}

static int bad_ld(int64_t ld) { return ld % PAD_LD_MULT == 0; }

static long g_padded_count;
long ds_cpu_sgemm_padded_count(void) { return __atomic_load_n(&g_padded_count, __ATOMIC_RELAXED); }

/* Whether oneDNN 2.6 runs a product on its AVX2 no-copy kernels: its gemm_driver's rule, in its
 * column-major terms (our C^T = op(B)^T op(A)^T: its m is our n, its n our m, its transb our ta). */
static int onednn_avx2_nocopy(int nthr, int ta, int64_t m, int64_t n, int64_t k) {
  int64_t cm = n, cn = m;
  if (1.0 / (double)cm + 1.0 / (double)cn >= 0.0038) return 1;
  if (cm <= 378 && cn <= 378 && k >= nthr * 378) return 0;
  if (cm >= nthr * 378 && k >= nthr * 378) return 0;
  if (cm <= 128 && cn <= 128) return 1;
  if (!ta) return cn <= nthr * 16 || k <= nthr * 2 || (cm <= 64 && cn >= nthr * 16);
  return cn <= nthr || k <= nthr;
}

/* rows x cols of X (stride ldx) to Y (stride ldy) */
static void copy_rows(float *Y, int64_t ldy, const float *X, int64_t ldx, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; i++) memcpy(Y + i * ldy, X + i * ldx, (size_t)cols * sizeof(float));
}

/* One thread's product, A (pa: transposed, [k, m]) and B (pb: not, [k, n]) copied kc rows at a
 * time into rows 16 floats longer. */
static void padded_sgemm_1(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *B,
                           int64_t ldb, float beta, float *C, int64_t ldc, int pa, int pb) {
  int64_t pla = m + PAD_EXTRA, plb = n + PAD_EXTRA;
  int64_t kb = PAD_SLICE_FLOATS / ((pa ? pla : 0) + (pb ? plb : 0)); /* both slices about 1 MiB */
  kb = kb < PAD_MIN_K ? PAD_MIN_K : kb > k ? k : kb;
  float *sa = pa ? ds_malloc_aligned((size_t)(kb * pla) * sizeof(float), "a GEMM operand's padded rows") : NULL;
  float *sb = pb ? ds_malloc_aligned((size_t)(kb * plb) * sizeof(float), "a GEMM operand's padded rows") : NULL;
  DS_CHECK((!pa || sa) && (!pb || sb));
  for (int64_t k0 = 0; k0 < k; k0 += kb) {
    int64_t kc = k - k0 < kb ? k - k0 : kb;
    const float *Ak = ta ? A + k0 * lda : A + k0, *Bk = tb ? B + k0 : B + k0 * ldb;
    int64_t la = lda, lb = ldb;
    if (pa) copy_rows(sa, pla, Ak, lda, kc, m), Ak = sa, la = pla;
    if (pb) copy_rows(sb, plb, Bk, ldb, kc, n), Bk = sb, lb = plb;
    onednn_sgemm(ta, tb, m, n, kc, Ak, la, Bk, lb, k0 ? 1.0f : beta, C, ldc);
  }
  ds_free_aligned(sa);
  ds_free_aligned(sb);
}

/* The product with its bad-stride operands copied, split across the threads by C's columns (by
 * its rows when only A is copied, so that each thread copies its own part); 0 when it is not a
 * case for it. */
static int padded_sgemm(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *B,
                        int64_t ldb, float beta, float *C, int64_t ldc) {
  if (!pad_enabled() || m * n * k < PAD_MIN_MACS) return 0;
  /* not a vocabulary-wide operand ([128, 32000]^T: nothing gained, 16 MiB copied a call; [128, 8192]^T
   * 2-3% slower) */
  int pa = ta && bad_ld(lda) && m <= PAD_MAX_WIDTH, pb = !tb && bad_ld(ldb) && n <= PAD_MAX_WIDTH;
  if (!pa && !pb) return 0;
  int nt = 1;
#ifdef DSPARK_USE_OPENMP
  nt = omp_in_parallel() ? 1 : omp_get_max_threads();
#endif
  if (!onednn_avx2_nocopy(nt, ta, m, n, k)) return 0;
  __atomic_fetch_add(&g_padded_count, 1, __ATOMIC_RELAXED);
  int by_rows = pa && !pb && m >= 16 * nt;
  if (nt > 1 && !by_rows && n < 64 * nt) nt = 1;
  if (nt == 1) {
    padded_sgemm_1(ta, tb, m, n, k, A, lda, B, ldb, beta, C, ldc, pa, pb);
    return 1;
  }
#ifdef DSPARK_USE_OPENMP
#pragma omp parallel num_threads(nt)
  {
    int t = omp_get_thread_num();
    if (by_rows) {
      int64_t i0 = m * t / nt / 8 * 8, i1 = t + 1 == nt ? m : m * (t + 1) / nt / 8 * 8;
      padded_sgemm_1(ta, tb, i1 - i0, n, k, A + i0, lda, B, ldb, beta, C + i0 * ldc, ldc, pa, pb);
    } else {
      int64_t j0 = n * t / nt / 16 * 16, j1 = t + 1 == nt ? n : n * (t + 1) / nt / 16 * 16;
      padded_sgemm_1(ta, tb, m, j1 - j0, k, A, lda, tb ? B + j0 * ldb : B + j0, ldb, beta, C + j0, ldc, pa, pb);
    }
  }
#endif
  return 1;
}
#else
long ds_cpu_sgemm_padded_count(void) { return 0; }
#endif

/* C[m, n] = op(A)[m, k] @ op(B)[k, n] + beta * C (contract in cpu_kernels.h). */
void ds_cpu_sgemm(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *B,
                  int64_t ldb, float beta, float *C, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    if (beta == 0.0f)
      for (int64_t i = 0; i < m; i++) memset(C + i * ldc, 0, (size_t)n * sizeof(float));
    return;
  }
#if defined(DSPARK_GEMM_ONEDNN)
  if (m >= DS_MKL_SGEMM_MIN_ROWS && m * n * k >= DS_MKL_SGEMM_MIN && ds_mkl_sgemm_available()) {
    ds_mkl_sgemm(ta, tb, m, n, k, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  if (padded_sgemm(ta, tb, m, n, k, A, lda, B, ldb, beta, C, ldc)) return;
#ifdef DSPARK_USE_OPENMP
  int nt = omp_get_max_threads();
  if (tb && m >= SPLIT_MIN_ROWS && nt > 1 && n >= SPLIT_MIN_COLS * nt && !omp_in_parallel()) {
    /* Each thread takes its own columns of C (rows of B) whole, as one single-threaded call:
     * oneDNN 2.6's own sharing of such a product scales poorly, e.g. the draft's logit chunk
     * [128, 512] @ lm_head^T [512, 32000] ran 96 GFLOP/s on 1 thread, 128 on 2, and 187 split
     * (products with B not transposed gained nothing split and stay whole). */
    DS_OMP(parallel num_threads(nt))
    {
      int t = omp_get_thread_num();
      int64_t j0 = n * t / nt / 16 * 16, j1 = t + 1 == nt ? n : n * (t + 1) / nt / 16 * 16;
      onednn_sgemm(ta, tb, m, j1 - j0, k, A, lda, B + j0 * ldb, ldb, beta, C + j0, ldc);
    }
    return;
  }
#endif
  onednn_sgemm(ta, tb, m, n, k, A, lda, B, ldb, beta, C, ldc);
#elif defined(DSPARK_GEMM_OPENBLAS)
  if (m == 1 && !ta && tb) { /* one row: GEMV is faster than a 1-row GEMM in OpenBLAS */
    cblas_sgemv(CblasRowMajor, CblasNoTrans, (blasint)n, (blasint)k, 1.0f, B, (blasint)ldb, A, 1, beta, C, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (blasint)m,
              (blasint)n, (blasint)k, 1.0f, A, (blasint)lda, B, (blasint)ldb, beta, C, (blasint)ldc);
#else
  gemm_loops(ta, tb, m, n, k, A, lda, B, ldb, beta, C, ldc);
#endif
}

int ds_cpu_threads(void) {
#ifdef DSPARK_USE_OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

void ds_set_num_threads(int n) {
  if (n <= 0) return;
#ifdef DSPARK_USE_OPENMP
  omp_set_num_threads(n);
#endif
#ifdef DSPARK_GEMM_OPENBLAS
  openblas_set_num_threads(n);
#endif
}

int ds_get_num_threads(void) { return ds_cpu_threads(); }

void ds_gemm_f32(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *B,
                 int64_t ldb, float beta, float *C, int64_t ldc) {
  ds_cpu_sgemm(ta, tb, m, n, k, A, lda, B, ldb, beta, C, ldc);
}

#if defined(DSPARK_GEMM_ONEDNN)
static const char *isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "generic";
  }
}
#endif

const char *ds_gemm_name(void) {
  static char name[160];
  if (name[0]) return name;
#if defined(DSPARK_GEMM_ONEDNN)
  const dnnl_version_t *v = dnnl_version();
  int at = snprintf(name, sizeof name, "oneDNN %d.%d.%d %s", v->major, v->minor, v->patch,
                    isa_name(dnnl_get_effective_cpu_isa()));
  const char *ver = ds_mkl_sgemm_available() ? strstr(ds_mkl_bf16_status(), "Version ") : NULL;
  if (ver && at > 0 && (size_t)at < sizeof name)
    snprintf(name + at, sizeof name - (size_t)at, "; products of %d+ rows and %d+ multiply-adds: MKL %.*s",
             DS_MKL_SGEMM_MIN_ROWS, DS_MKL_SGEMM_MIN,
             (int)strcspn(ver + 8, "- "), ver + 8);
#elif defined(DSPARK_GEMM_OPENBLAS)
  snprintf(name, sizeof name, "OpenBLAS %s", openblas_get_corename());
#else
  snprintf(name, sizeof name, "loops (no GEMM library)");
#endif
  return name;
}

const char *ds_gemm_warning(void) {
  static char msg[400];
  /* the CPU as the kernels see it (a DSPARK_MAX_ISA cap included: a CPU without AVX-512) */
  int avx512 = ds_isa_best() == DS_ISA_AVX512, avx2 = ds_isa_best() >= DS_ISA_AVX2;
#if defined(DSPARK_GEMM_ONEDNN)
  dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  int slow = (avx512 && (isa & dnnl_cpu_isa_avx512_core) != dnnl_cpu_isa_avx512_core) ||
             (avx2 && (isa & dnnl_cpu_isa_avx2) != dnnl_cpu_isa_avx2);
  if (!slow) return NULL;
  snprintf(msg, sizeof msg, "warning: matmuls run oneDNN's %s kernels on a CPU with %s (is DNNL_MAX_CPU_ISA set?): "
           "several times below this machine's speed", isa_name(isa), avx512 ? "AVX-512" : "AVX2");
#elif defined(DSPARK_GEMM_OPENBLAS)
  const char *core = openblas_get_corename();
  static const char *const generic[] = {"Prescott", "Katmai", "Coppermine", "Northwood", "Core2", "Penryn", "Dunnington",
                                        "Nehalem", "Atom", "Sandybridge", "Haswell", "Zen", "Barcelona", "Bulldozer"};
  int slow = 0, is_avx2_kernel = !strcmp(core, "Haswell") || !strcmp(core, "Zen");
  for (size_t i = 0; i < sizeof generic / sizeof generic[0]; i++) slow |= !strcmp(core, generic[i]);
  if (!(avx512 && slow) && !(avx2 && slow && !is_avx2_kernel)) return NULL;
  snprintf(msg, sizeof msg, "warning: matmuls run OpenBLAS's %s kernel on a CPU with %s (OPENBLAS_CORETYPE, or a CPU "
           "this OpenBLAS does not recognize): %s below this machine's speed; the default build (DSPARK_GEMM=onednn) "
           "chooses its kernels from the CPU's features", core, avx512 ? "AVX-512" : "AVX2",
           is_avx2_kernel ? "about 2x" : "several times");
#else
  (void)avx512;
  if (!avx2) return NULL;
  snprintf(msg, sizeof msg, "warning: this build has no GEMM library (DSPARK_GEMM=none): matmuls run plain loops, "
           "tens of times below this machine's speed");
#endif
  return msg;
}
