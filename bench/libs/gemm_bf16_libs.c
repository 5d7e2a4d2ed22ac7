/* bf16 GEMM libraries side by side on the linear layers' shapes (issue 9): which library could
 * run the bf16-compute products faster than the one the build uses. Built and run by
 * bench/gemm_bf16_libs.sh, once per library, since the candidates are different versions of
 * the same API (oneDNN 2.x from Debian, 3.x from PyPI) or another API (MKL):
 *   -DUSE_MKL      MKL's cblas_gemm_bf16bf16f32 on a B packed by cblas_gemm_bf16bf16f32_pack;
 *   otherwise      oneDNN's matmul against whichever oneDNN headers it is compiled with, the
 *                  weights reordered once into the layout the primitive asks for (format any),
 *                  as the engine's packed frozen weights are.
 * Every product is C[m, n] (fp32) = A[m, k] (bf16) @ W[n, k]^T (bf16), fp32 accumulation; A is
 * already bf16 (the engine's own path also rounds an fp32 A first: bench_gemm_bf16 w16pk).
 * Prints one line per shape: GFLOP/s, the best of the runs that fill --seconds, and a
 * checksum of C so that a wrong product shows. Those runs keep one weight in cache; --layers L
 * instead runs a forward's order over L layers of distinct weights (every layer shape of the
 * set, layer after layer, 4 passes, the first a warm-up), where a large model's weights stream from
 * memory as they do in the engine; GFLOP/s per shape then sums its time over the passes.
 *   gemm_bf16_libs [--seconds S] [--shapes 100m|1.7b|all] [--layers L]   (threads: OMP_NUM_THREADS) */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
  const char *label;
  int64_t m, n, k;
} shape;

static const shape k_shapes[] = {
    {"100m qkv    512x1280x768", 512, 1280, 768},    {"100m o      512x768x768", 512, 768, 768},
    {"100m gateup 512x4096x768", 512, 4096, 768},    {"100m down   512x768x2048", 512, 768, 2048},
    {"100m head   512x32000x768", 512, 32000, 768},  {"1.7b qkv    256x4096x2048", 256, 4096, 2048},  {"1.7b o      256x2048x2048", 256, 2048, 2048},
    {"1.7b gateup 256x12288x2048", 256, 12288, 2048}, {"1.7b down   256x2048x6144", 256, 2048, 6144},
};

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint16_t to_bf16(float f) { /* nearest even; the inputs here are finite */
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

#define FAIL(...) (fprintf(stderr, "gemm_bf16_libs: " __VA_ARGS__), fputc('\n', stderr), exit(1))

/* ---------------------------------------------------------------- the product per library */

typedef struct product product;
static product *product_make(const shape *s, const uint16_t *w); /* packs w */
static void product_run(product *p, const uint16_t *a, float *c);
static const char *library_name(void);

#ifdef USE_MKL
enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112, PACKED = 151, B_MATRIX = 162 };
size_t cblas_gemm_bf16bf16f32_pack_get_size(int id, int m, int n, int k);
void cblas_gemm_bf16bf16f32_pack(int layout, int id, int trans, int m, int n, int k, const uint16_t *src, int ld,
                                 uint16_t *dst);
void cblas_gemm_bf16bf16f32_compute(int layout, int ta, int tb, int m, int n, int k, float alpha, const uint16_t *a,
                                    int lda, const uint16_t *b, int ldb, float beta, float *c, int ldc);
void mkl_get_version_string(char *buf, int len);

struct product {
  int m, n, k;
  uint16_t *packed;
};

static product *product_make(const shape *s, const uint16_t *w) {
  product *p = malloc(sizeof *p);
  p->m = (int)s->m, p->n = (int)s->n, p->k = (int)s->k;
  p->packed = malloc(cblas_gemm_bf16bf16f32_pack_get_size(B_MATRIX, p->m, p->n, p->k));
  if (!p->packed) FAIL("out of memory");
  cblas_gemm_bf16bf16f32_pack(ROW_MAJOR, B_MATRIX, TRANS, p->m, p->n, p->k, w, p->k, p->packed);
  return p;
}

static void product_run(product *p, const uint16_t *a, float *c) {
  cblas_gemm_bf16bf16f32_compute(ROW_MAJOR, NO_TRANS, PACKED, p->m, p->n, p->k, 1.0f, a, p->k, p->packed, p->k, 0.0f,
                                 c, p->n);
}

static const char *library_name(void) {
  static char buf[320];
  char v[200];
  mkl_get_version_string(v, sizeof v);
  for (size_t n = strlen(v); n > 0 && v[n - 1] == ' '; n--) v[n - 1] = 0; /* MKL pads it */
  snprintf(buf, sizeof buf, "MKL cblas_gemm_bf16bf16f32, packed B (%s)", v);
  return buf;
}
#else
#include <oneapi/dnnl/dnnl.h>
#define CK(x)                                                     \
  do {                                                            \
    if ((x) != dnnl_success) FAIL("%s failed (line %d)", #x, __LINE__); \
  } while (0)

#if DNNL_VERSION_MAJOR >= 3
typedef dnnl_memory_desc_t md_t; /* a handle */
typedef const_dnnl_memory_desc_t md_ref;
static md_t md_2d(int64_t r, int64_t c, dnnl_data_type_t dt, dnnl_format_tag_t tag) {
  md_t m;
  dnnl_dims_t d = {r, c};
  CK(dnnl_memory_desc_create_with_tag(&m, 2, d, dt, tag));
  return m;
}
#define MD(m) (m)
#else
typedef dnnl_memory_desc_t md_t; /* a struct */
typedef const dnnl_memory_desc_t *md_ref;
static md_t md_2d(int64_t r, int64_t c, dnnl_data_type_t dt, dnnl_format_tag_t tag) {
  md_t m;
  dnnl_dims_t d = {r, c};
  CK(dnnl_memory_desc_init_by_tag(&m, 2, d, dt, tag));
  return m;
}
#define MD(m) (&(m))
#endif

static dnnl_engine_t g_engine;
static dnnl_stream_t g_stream;
static const char *g_impl = "";

struct product {
  dnnl_primitive_t prim;
  dnnl_memory_t a, w, c;
};

static product *product_make(const shape *s, const uint16_t *w) {
  if (!g_engine) {
    CK(dnnl_engine_create(&g_engine, dnnl_cpu, 0));
    CK(dnnl_stream_create(&g_stream, g_engine, dnnl_stream_default_flags));
  }
  md_t a = md_2d(s->m, s->k, dnnl_bf16, dnnl_ab), w_plain = md_2d(s->k, s->n, dnnl_bf16, dnnl_ba);
  md_t w_any = md_2d(s->k, s->n, dnnl_bf16, dnnl_format_tag_any), c = md_2d(s->m, s->n, dnnl_f32, dnnl_ab);
  dnnl_primitive_desc_t pd, rpd;
#if DNNL_VERSION_MAJOR >= 3
  CK(dnnl_matmul_primitive_desc_create(&pd, g_engine, a, w_any, NULL, c, NULL));
#else
  dnnl_matmul_desc_t mm;
  CK(dnnl_matmul_desc_init(&mm, &a, &w_any, NULL, &c));
  CK(dnnl_primitive_desc_create(&pd, &mm, NULL, g_engine, NULL));
#endif
  CK(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &g_impl));
  md_ref w_packed = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
  product *p = malloc(sizeof *p);
  CK(dnnl_primitive_create(&p->prim, pd));
  size_t bytes = (dnnl_memory_desc_get_size(w_packed) + 63) / 64 * 64;
  void *packed = aligned_alloc(64, bytes);
  if (!p || !packed) FAIL("out of memory");
  dnnl_memory_t src;
  CK(dnnl_memory_create(&src, MD(w_plain), g_engine, (void *)w));
  CK(dnnl_memory_create(&p->w, w_packed, g_engine, packed));
  CK(dnnl_reorder_primitive_desc_create(&rpd, MD(w_plain), g_engine, w_packed, g_engine, NULL));
  dnnl_primitive_t reorder;
  CK(dnnl_primitive_create(&reorder, rpd));
  dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, p->w}};
  CK(dnnl_primitive_execute(reorder, g_stream, 2, args));
  CK(dnnl_stream_wait(g_stream));
  CK(dnnl_memory_create(&p->a, MD(a), g_engine, DNNL_MEMORY_NONE));
  CK(dnnl_memory_create(&p->c, MD(c), g_engine, DNNL_MEMORY_NONE));
  return p;
}

static void product_run(product *p, const uint16_t *a, float *c) {
  CK(dnnl_memory_set_data_handle(p->a, (void *)a));
  CK(dnnl_memory_set_data_handle(p->c, c));
  dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, p->a}, {DNNL_ARG_WEIGHTS, p->w}, {DNNL_ARG_DST, p->c}};
  CK(dnnl_primitive_execute(p->prim, g_stream, 3, args));
  CK(dnnl_stream_wait(g_stream));
}

static const char *library_name(void) {
  static char buf[160];
  const dnnl_version_t *v = dnnl_version();
  snprintf(buf, sizeof buf, "oneDNN %d.%d.%d matmul, weights in the primitive's layout", v->major, v->minor, v->patch);
  return buf;
}
#endif

/* ---------------------------------------------------------------- driver */

enum { N_SHAPES = sizeof k_shapes / sizeof k_shapes[0], MAX_LAYERS = 64 };

static uint16_t *bf16_values(int64_t count, int64_t mul, int64_t mod, float scale, float shift) {
  uint16_t *p = malloc((size_t)count * 2);
  if (!p) FAIL("out of memory");
  for (int64_t i = 0; i < count; i++) p[i] = to_bf16((float)((i * mul) % mod) * scale - shift);
  return p;
}

/* --layers: the selected shapes as a model's layers, each layer's weights distinct. */
static void stream_layers(const char *which, int layers) {
  const shape *sel[N_SHAPES];
  int ns = 0;
  for (int si = 0; si < N_SHAPES; si++) /* a layer's products; the head is not one */
    if (!strncmp(k_shapes[si].label, which, strlen(which)) && !strstr(k_shapes[si].label, "head"))
      sel[ns++] = &k_shapes[si];
  if (!ns || layers < 1 || layers > MAX_LAYERS) FAIL("--layers takes 1..%d and --shapes 100m or 1.7b", MAX_LAYERS);
  static product *prod[MAX_LAYERS][N_SHAPES];
  int64_t max_a = 0, max_c = 0;
  double bytes = 0;
  for (int j = 0; j < ns; j++) {
    uint16_t *w = bf16_values(sel[j]->n * sel[j]->k, 31337, 2000, 1.0f / 40000.0f, 0.025f);
    for (int l = 0; l < layers; l++) prod[l][j] = product_make(sel[j], w); /* a packed copy each */
    free(w);
    max_a = sel[j]->m * sel[j]->k > max_a ? sel[j]->m * sel[j]->k : max_a;
    max_c = sel[j]->m * sel[j]->n > max_c ? sel[j]->m * sel[j]->n : max_c;
    bytes += 2.0 * (double)(sel[j]->n * sel[j]->k) * layers;
  }
  uint16_t *a = bf16_values(max_a, 7919, 1000, 1.0f / 1000.0f, 0.5f);
  float *c = malloc((size_t)max_c * sizeof(float));
  double spent[N_SHAPES] = {0};
  for (int pass = 0; pass < 4; pass++)
    for (int l = 0; l < layers; l++)
      for (int j = 0; j < ns; j++) {
        double t0 = now();
        product_run(prod[l][j], a, c);
        if (pass > 0) spent[j] += now() - t0;
      }
  double total_flop = 0, total_t = 0;
  for (int j = 0; j < ns; j++) {
    double flop = 2.0 * (double)(sel[j]->m * sel[j]->n) * (double)sel[j]->k * layers * 3;
    printf("%-30s %8.1f GFLOP/s  (%d layers of distinct weights, 3 passes)\n", sel[j]->label, flop / spent[j] / 1e9,
           layers);
    total_flop += flop, total_t += spent[j];
  }
  printf("%-30s %8.1f GFLOP/s  (%.0f MB of weights a pass)\n", "all, streamed", total_flop / total_t / 1e9, bytes / 1e6);
  free(a), free(c); /* the products are kept to the end: the process exits */
}

int main(int argc, char **argv) {
  double seconds = 0.4;
  const char *which = "all";
  int layers = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
    else if (!strcmp(argv[i], "--shapes") && i + 1 < argc) which = argv[++i];
    else if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = atoi(argv[++i]);
    else FAIL("usage: gemm_bf16_libs [--seconds S] [--shapes 100m|1.7b|all] [--layers L]");
  }
  const char *env = getenv("OMP_NUM_THREADS");
  printf("library %s | threads %s\n", library_name(), env ? env : "(default)");
  if (layers) {
    stream_layers(which, layers);
    return 0;
  }
  for (size_t si = 0; si < N_SHAPES; si++) {
    const shape *s = &k_shapes[si];
    if (strcmp(which, "all") && strncmp(s->label, which, strlen(which))) continue;
    uint16_t *a = bf16_values(s->m * s->k, 7919, 1000, 1.0f / 1000.0f, 0.5f);
    uint16_t *w = bf16_values(s->n * s->k, 31337, 2000, 1.0f / 40000.0f, 0.025f);
    float *c = malloc((size_t)(s->m * s->n) * sizeof(float));
    if (!c) FAIL("out of memory");
    product *p = product_make(s, w);
    product_run(p, a, c); /* warm-up */
    double best = 1e30, spent = 0;
    int runs = 0;
    while (spent < seconds || runs < 3) {
      double t0 = now();
      product_run(p, a, c);
      double t = now() - t0;
      best = t < best ? t : best, spent += t, runs++;
    }
    double sum = 0;
    for (int64_t i = 0; i < s->m * s->n; i += 97) sum += c[i];
    printf("%-30s %8.1f GFLOP/s  (%d runs, checksum %.6g)\n", s->label, 2.0 * (double)(s->m * s->n) * (double)s->k / best / 1e9,
           runs, sum);
    fflush(stdout);
    free(a), free(w), free(c); /* the product's packed weights are kept: a few MiB per shape */
  }
#ifndef USE_MKL
  printf("implementation %s\n", g_impl);
#endif
  return 0;
}
