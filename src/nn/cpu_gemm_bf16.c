/* bf16 compute for the matmuls (DS_COMPUTE_BF16; contract in include/dspark/backend.h and
 * nn/cpu_gemm_bf16.h). Both operands are rounded to bf16 (round to nearest even), every product
 * of two bf16 values is exact in fp32 and accumulates in fp32, and C stays fp32.
 *
 * Native path (DSPARK_GEMM=onednn on a CPU with AVX512_BF16 or AMX): oneDNN 2.x's matmul
 * primitive on bf16 src / bf16 weights / f32 dst (its public bf16 gemm function is not in the
 * 2.6 header). fp32 operands are converted into packed scratch in their stored layout, so the
 * primitive sees dense strides (the brgemm / AMX kernels; padded strides get gemm:jit); a bf16
 * B (a frozen weight) is passed in place with its own stride, and a padded C goes through a
 * dense copy. beta = 1 is a sum post-op. Creating a primitive costs 0.2-0.7 ms, so they are
 * cached by shape, strides, transposes and beta. Frozen weights used again get a packed copy
 * in the kernel's own layout (ds_cpu_gemm_bf16_frozen); kernels with their own parallel tiles
 * (the bf16 attention) run primitives from many threads (ds_bf16_tile_gemm_*). The sgemm route
 * (other builds, CPUs without AMX or without native bf16; cpu_gemm_bf16_sgemm.c): the operands
 * rounded to bf16 values held in fp32, multiplied by ds_cpu_sgemm: the same numbers up to fp32
 * summation order; its frozen F32 weights' rounded copies live in the same packed-copy cache.
 *
 * One mutex guards the setting's scratch and the caches: the callers are the main thread (the
 * threads are inside oneDNN and the conversion loops), so it is never contended; the tile
 * products take it only to find their primitive, before their parallel region. */
#include "nn/cpu_gemm_bf16.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/backend.h"
#include "nn/cpu_gemm_mkl.h"
#include "nn/cpu_isa.h"
#include "nn/cpu_kernels.h"
#include "nn/cpu_quant.h"

#if defined(DSPARK_GEMM_ONEDNN)
#include <oneapi/dnnl/dnnl.h>
#endif

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static ds_compute g_compute = DS_COMPUTE_F32;
static int g_compute_set; /* ds_set_matmul_compute was called (include/dspark/backend.h) */

void ds_set_matmul_compute(ds_compute c) {
  g_compute = c == DS_COMPUTE_BF16 || c == DS_COMPUTE_INT8 ? c : DS_COMPUTE_F32;
  g_compute_set = 1;
}
void ds_unset_matmul_compute(void) { g_compute = DS_COMPUTE_F32, g_compute_set = 0; }
ds_compute ds_matmul_compute(void) { return g_compute; }
int ds_quant_int8_rows(void) { return g_compute == DS_COMPUTE_INT8 || !g_compute_set; }
const char *ds_compute_label(void) {
  return g_compute_set ? ds_compute_name(g_compute) : "fp32 (int8 quantized products)";
}
const char *ds_compute_name(ds_compute c) {
  return c == DS_COMPUTE_BF16 ? "bf16" : c == DS_COMPUTE_INT8 ? "int8" : "fp32";
}
int ds_compute_parse(const char *s, ds_compute *out) {
  if (!strcmp(s, "fp32") || !strcmp(s, "f32")) *out = DS_COMPUTE_F32;
  else if (!strcmp(s, "bf16")) *out = DS_COMPUTE_BF16;
  else if (!strcmp(s, "int8")) *out = DS_COMPUTE_INT8;
  else return 0;
  return 1;
}

/* ---------------------------------------------------------------- scratch */

#if defined(DSPARK_GEMM_ONEDNN)
typedef struct {
  void *p;
  size_t bytes;
} scratch;

static scratch g_sa, g_sb; /* A's and B's converted copies; grown, never shrunk */

static void *scratch_get(scratch *s, size_t bytes) {
  if (bytes <= s->bytes) return s->p;
  size_t want = (bytes + 4095) & ~(size_t)4095;
  void *p = aligned_alloc(64, want);
  DS_CHECK(p != NULL); /* a matmul cannot report an error: as any other allocation failure in a kernel */
  free(s->p);
  s->p = p;
  s->bytes = want;
  return p;
}
#endif
#if defined(DSPARK_GEMM_ONEDNN)
/* The bf16 bits of the stored matrix src[rows, cols] (row stride ld), packed (row stride cols):
 * a held operand's copy, else rounded into s. Called with g_lock held. */
static const uint16_t *rounded(const float *src, int64_t rows, int64_t cols, int64_t ld, scratch *s) {
  const uint16_t *h = ds_bf16_held_copy(src, rows, cols, ld, 0);
  if (h) return h;
  uint16_t *a = scratch_get(s, (size_t)(rows * cols) * sizeof(uint16_t));
  ds_bf16_round_rows(a, 1, src, rows, cols, ld);
  return a;
}
#endif

/* $DSPARK_BF16_GEMM read once, on every build and CPU (a bad value is reported even where the
 * native route does not exist): -1 auto, 1 native, 0 sgemm. Called with g_lock held. */
static int g_route_asked = -2; /* -2 not read yet */
static int route_asked_locked(void) {
  if (g_route_asked != -2) return g_route_asked;
  const char *e = getenv("DSPARK_BF16_GEMM");
  g_route_asked = -1;
  if (e && *e && !strcmp(e, "native")) g_route_asked = 1;
  else if (e && *e && !strcmp(e, "sgemm")) g_route_asked = 0;
  else if (e && *e && strcmp(e, "auto"))
    fprintf(stderr, "warning: DSPARK_BF16_GEMM=%s is not auto, native or sgemm; using auto\n", e);
  return g_route_asked;
}

/* ---------------------------------------------------------------- oneDNN path */

#if defined(DSPARK_GEMM_ONEDNN)
static dnnl_engine_t g_engine;
static dnnl_stream_t g_stream;
static int g_native = -1; /* -1 not probed yet, 0 portable, 1 oneDNN bf16 */

typedef struct {
  int64_t m, n, k, lda, ldb, ldc;
  int ta, tb, beta;
  int packed; /* weights in the layout oneDNN chose (format any), as a packed_weight holds them */
  int user_sp; /* scratchpad passed by the caller (tile products run concurrently) */
  dnnl_primitive_t prim;
  dnnl_memory_desc_t ad, bd, cd, sd;
  char impl[64];
} cached_matmul;

enum { CACHE_SLOTS = 64 };
static cached_matmul g_cache[CACHE_SLOTS];
static int g_cache_used, g_cache_next;

/* Called with g_lock held. */
static int native_locked(void) {
  if (g_native >= 0) return g_native;
  g_native = 0;
  dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  if ((isa & dnnl_cpu_isa_avx512_core_bf16) != dnnl_cpu_isa_avx512_core_bf16) return 0;
  if (dnnl_engine_create(&g_engine, dnnl_cpu, 0) != dnnl_success) return 0;
  if (dnnl_stream_create(&g_stream, g_engine, dnnl_stream_default_flags) != dnnl_success) return 0;
  g_native = 1;
  return 1;
}

/* The route of the products that are not tiles (DSPARK_BF16_GEMM, cpu_gemm_bf16.h): 1 native
 * bf16 kernels, 0 the sgemm route. Called with g_lock held. */
static int g_route = -1;
static const char *g_route_why = "";
static int route_native_locked(void) {
  if (g_route >= 0) return g_route;
  int want = route_asked_locked();
  int native = native_locked();
  g_route_why = want == 0 ? "DSPARK_BF16_GEMM=sgemm" : "";
  if (want < 0) {
    /* measured: native wins with AMX, and on AMD Zen 4 (AVX512_BF16 dot products at twice the
     * fp32 FMAs' rate: a SmolLM2 prefill 1.9x, a draft step 1.5x); on Intel CPUs with
     * AVX512_BF16 and no AMX the sgemm route won (docs/compute.md) */
    int amx = (dnnl_get_effective_cpu_isa() & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx;
    want = native && (amx || ds_cpu_is_amd());
    g_route_why = "faster than the native matmul on Intel without AMX; DSPARK_BF16_GEMM=native for it";
  }
  if (want == 1 && !native)
    fprintf(stderr, "warning: DSPARK_BF16_GEMM=native, but this CPU or oneDNN has no native bf16 matmul: "
                    "using the sgemm route\n");
  g_route = native && want;
  return g_route;
}

/* The primitive for this product, created on first use (NULL when oneDNN refuses it). */
static cached_matmul *matmul_for(int ta, int tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                                 int64_t ldc, int beta, int packed, int user_sp) {
  for (int i = 0; i < g_cache_used; i++) {
    cached_matmul *c = &g_cache[i];
    if (c->m == m && c->n == n && c->k == k && c->lda == lda && c->ldb == ldb && c->ldc == ldc && c->ta == ta &&
        c->tb == tb && c->beta == beta && c->packed == packed && c->user_sp == user_sp)
      return c;
  }
  cached_matmul e = {.m = m, .n = n, .k = k, .lda = lda, .ldb = ldb, .ldc = ldc, .ta = ta, .tb = tb, .beta = beta,
                     .packed = packed, .user_sp = user_sp};
  /* logical src [m, k], weights [k, n], dst [m, n]; a transposed operand is a swapped stride */
  dnnl_dims_t ash = {m, k}, bsh = {k, n}, csh = {m, n};
  dnnl_dims_t as = {ta ? 1 : lda, ta ? lda : 1}, bs = {tb ? 1 : ldb, tb ? ldb : 1}, cs = {ldc, 1};
  dnnl_status_t bst = packed ? dnnl_memory_desc_init_by_tag(&e.bd, 2, bsh, dnnl_bf16, dnnl_format_tag_any)
                             : dnnl_memory_desc_init_by_strides(&e.bd, 2, bsh, dnnl_bf16, bs);
  if (dnnl_memory_desc_init_by_strides(&e.ad, 2, ash, dnnl_bf16, as) != dnnl_success || bst != dnnl_success ||
      dnnl_memory_desc_init_by_strides(&e.cd, 2, csh, dnnl_f32, cs) != dnnl_success)
    return NULL;
  dnnl_matmul_desc_t md;
  if (dnnl_matmul_desc_init(&md, &e.ad, &e.bd, NULL, &e.cd) != dnnl_success) return NULL;
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t po = NULL;
  dnnl_primitive_desc_t pd = NULL;
  int ok = dnnl_primitive_attr_create(&attr) == dnnl_success;
  /* this oneDNN build's library scratchpad is one buffer for all threads (no
   * DNNL_ENABLE_CONCURRENT_EXEC): primitives that run concurrently take their own */
  if (ok && user_sp) ok = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success;
  if (ok && beta) {
    ok = dnnl_post_ops_create(&po) == dnnl_success && dnnl_post_ops_append_sum(po, 1.0f) == dnnl_success &&
         dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
  }
  ok = ok && dnnl_primitive_desc_create(&pd, &md, attr, g_engine, NULL) == dnnl_success;
  const char *impl = NULL;
  if (ok && dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl)
    snprintf(e.impl, sizeof e.impl, "%s", impl);
  if (ok && user_sp) {
    const dnnl_memory_desc_t *sd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    ok = sd != NULL;
    if (ok) e.sd = *sd;
  }
  if (ok && packed) { /* the layout oneDNN chose for the weights */
    const dnnl_memory_desc_t *wd = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    ok = wd != NULL;
    if (ok) e.bd = *wd;
  }
  ok = ok && dnnl_primitive_create(&e.prim, pd) == dnnl_success;
  if (pd) dnnl_primitive_desc_destroy(pd);
  if (po) dnnl_post_ops_destroy(po);
  if (attr) dnnl_primitive_attr_destroy(attr);
  if (!ok) return NULL;
  int slot = g_cache_used < CACHE_SLOTS ? g_cache_used++ : g_cache_next++ % CACHE_SLOTS;
  if (g_cache[slot].prim) dnnl_primitive_destroy(g_cache[slot].prim);
  g_cache[slot] = e;
  return &g_cache[slot];
}

/* Runs the cached primitive on bf16 a, b (in c's layouts) into C; 1 when it ran. */
static int run_matmul(const cached_matmul *c, const void *a, const void *b, float *C) {
  dnnl_memory_t am = NULL, bm = NULL, cm = NULL;
  int ok = dnnl_memory_create(&am, &c->ad, g_engine, (void *)a) == dnnl_success &&
           dnnl_memory_create(&bm, &c->bd, g_engine, (void *)b) == dnnl_success &&
           dnnl_memory_create(&cm, &c->cd, g_engine, C) == dnnl_success;
  if (ok) {
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
    ok = dnnl_primitive_execute(c->prim, g_stream, 3, args) == dnnl_success &&
         dnnl_stream_wait(g_stream) == dnnl_success;
    DS_CHECK(ok); /* a created primitive that fails to run is a bug of ours (bad strides) */
  }
  if (am) dnnl_memory_destroy(am);
  if (bm) dnnl_memory_destroy(bm);
  if (cm) dnnl_memory_destroy(cm);
  return ok;
}

static scratch g_sc; /* a dense C for a product whose C is padded */

static void copy_rows(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows, int64_t cols) {
  DS_OMP(parallel for schedule(static) if (rows * cols > 65536))
  for (int64_t r = 0; r < rows; r++) memcpy(dst + r * ldd, src + r * lds, (size_t)cols * sizeof(float));
}

/* run_matmul for a primitive made for a dense C[m, n] (row stride n) when the caller's C has
 * row stride ldc: a padded C (a segment of q/k/v or gate/up writing its columns of a wider y)
 * gets oneDNN 2.6's gemm:jit kernel, at about half the speed of brgemm / AMX, so such a product
 * runs into a dense copy (beta = 1: of C's values) that is copied back, a small cost next to
 * the product. */
static int run_dense(const cached_matmul *c, const void *a, const void *b, float *C, int64_t ldc, float beta) {
  int64_t m = c->m, n = c->n;
  if (ldc == n) return run_matmul(c, a, b, C);
  float *d = scratch_get(&g_sc, (size_t)(m * n) * sizeof(float));
  if (beta != 0.0f) copy_rows(d, n, C, ldc, m, n);
  int ok = run_matmul(c, a, b, d);
  if (ok) copy_rows(C, ldc, d, n, m, n);
  return ok;
}

/* 1 when oneDNN ran the product. */
static int gemm_onednn(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda,
                       const float *Bf, const uint16_t *Bh, int64_t ldb, float beta, float *C, int64_t ldc) {
  int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
  const void *b = Bh;
  int64_t ldb_used = ldb;
  if (Bf) ldb_used = bc; /* converted packed below */
  cached_matmul *c = matmul_for(ta, tb, m, n, k, ac, ldb_used, n, beta != 0.0f, 0, 0);
  if (!c) return 0;
  const uint16_t *a = rounded(A, ar, ac, lda, &g_sa);
  if (Bf) b = rounded(Bf, br, bc, ldb, &g_sb);
  return run_dense(c, a, b, C, ldc, beta);
}

/* ---------------------------------------------------------------- packed frozen weights */

/* The layouts of the packed copies below. */
typedef enum {
  PACK_ONEDNN,  /* the layout oneDNN's kernel chose (md) */
  PACK_MKL,     /* MKL's packed bf16 layout (cpu_gemm_mkl.h), for a forward (tb) */
  PACK_ROUNDED, /* the sgemm route's: an F32 W as stored, rounded to bf16 values held in fp32; one
                 * copy serves the forward and the input gradient (keyed tb 1, n x k as stored) */
  PACK_MKL_F32, /* the sgemm route's forward of an F32 W on MKL: those values in MKL's packed
                 * fp32 layout (cpu_gemm_mkl.h) */
} pack_kind;

/* A frozen weight W[n, k] (x @ W^T, the shape of every linear) reordered once, as bf16, into
 * the layout oneDNN's kernel wants (AMX: blocked, pairs of k interleaved), so a call neither
 * rounds W (F32) nor re-lays it out (the brgemm kernels copy a plain B into that layout on every
 * call). Keyed by the data pointer, shape and source dtype; a frozen weight's values do not
 * change while it is loaded (include/dspark/common.h), and ds_release_packed_weights(), called
 * when a model is freed, drops every copy before its memory can be reused. A fingerprint of
 * sampled values guards against a caller that rewrites a frozen buffer in place. Trainable
 * weights never come here (the cpu backend's linear / linear_backward take the plain path). */
typedef struct {
  const void *data;
  int64_t n, k;   /* the product's: B is [k, n] */
  int tb;         /* 1: W[n, k] used as W^T (a forward); 0: W[k, n] used as it is (dx = dy @ W) */
  uint64_t cat;   /* 0, or for a concatenation of segments (data: the first) a hash of them all */
  int f32;        /* source dtype: F32 (rounded on packing) or BF16 */
  uint64_t print; /* fingerprint of sampled source values */
  dnnl_memory_desc_t md; /* oneDNN's layout; unused for MKL's */
  void *packed;
  size_t bytes;
  pack_kind kind; /* the layout */
} packed_weight;


static packed_weight *g_packs;
static int g_packs_used, g_packs_cap;
static size_t g_pack_bytes;      /* held by g_packs */
static int64_t g_pack_limit = -1; /* bytes; -1 not read yet from DSPARK_BF16_PACK_MB */

enum { PACK_DEFAULT_MB = 4096, PRINT_SAMPLES = 64 };

static size_t pack_limit(void) {
  if (g_pack_limit < 0) {
    const char *e = getenv("DSPARK_BF16_PACK_MB");
    char *end = NULL;
    long long mb = e && *e ? strtoll(e, &end, 10) : PACK_DEFAULT_MB;
    if (e && *e && (*end || mb < 0)) {
      fprintf(stderr, "warning: DSPARK_BF16_PACK_MB=%s is not a count of MiB; using %d\n", e, PACK_DEFAULT_MB);
      mb = PACK_DEFAULT_MB;
    }
    g_pack_limit = (int64_t)mb << 20;
  }
  return (size_t)g_pack_limit;
}

static uint64_t fingerprint(const void *data, int f32, int64_t count) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < PRINT_SAMPLES; i++) {
    int64_t at = count > 1 ? (int64_t)((double)i * (double)(count - 1) / (PRINT_SAMPLES - 1)) : 0;
    uint32_t v = f32 ? ((const uint32_t *)data)[at] : ((const uint16_t *)data)[at];
    h = (h ^ v) * 1099511628211ull;
  }
  return h;
}

static void pack_drop(packed_weight *p) {
  free(p->packed);
  g_pack_bytes -= p->bytes;
  *p = g_packs[--g_packs_used];
}

/* Frozen weights stored apart that one product reads as [segs[0]; segs[1]; ...] (each rows[s] x
 * k, contiguous, all F32 or all BF16): linear_w_cat's q, k, v or gate, up. */
typedef struct {
  const void *const *segs;
  const int64_t *rows;
  int n_seg;
} cat_src;

static uint64_t cat_hash(const cat_src *cat) {
  uint64_t h = 1469598103934665603ull;
  for (int s = 0; s < cat->n_seg; s++) {
    h = (h ^ (uint64_t)(uintptr_t)cat->segs[s]) * 1099511628211ull;
    h = (h ^ (uint64_t)cat->rows[s]) * 1099511628211ull;
  }
  return h ? h : 1;
}

/* The concatenation as one plain bf16 [sum rows, k] (F32 rounded as the unpacked path rounds). */
static void concat_bf16(uint16_t *dst, const cat_src *cat, int f32, int64_t k) {
  int64_t row = 0;
  for (int s = 0; s < cat->n_seg; s++) {
    if (f32) ds_bf16_round_rows(dst + row * k, 1, cat->segs[s], cat->rows[s], k, k);
    else memcpy(dst + row * k, cat->segs[s], (size_t)(cat->rows[s] * k) * sizeof(uint16_t));
    row += cat->rows[s];
  }
}

/* The packed copy of W (B of the product: W^T when tb, W otherwise; data F32 or BF16, or with
 * cat the concatenation of its segments, tb 1) for the primitive c (kind PACK_ONEDNN), or in
 * MKL's layout for an m-row forward (PACK_MKL, tb 1), or rounded (PACK_ROUNDED; for an m-row
 * forward on MKL, PACK_MKL_F32); NULL when it cannot be made or would pass the cap. */
static const void *packed_for(const cached_matmul *c, pack_kind kind, const void *data, int f32, const cat_src *cat,
                              int tb, int64_t m, int64_t n, int64_t k) {
  uint64_t key = cat ? cat_hash(cat) : 0, print = 0;
  if (cat)
    for (int s = 0; s < cat->n_seg; s++) print = print * 31 + fingerprint(cat->segs[s], f32, cat->rows[s] * k);
  else
    print = fingerprint(data, f32, n * k);
  packed_weight *seen = NULL;
  for (int i = 0; i < g_packs_used && !seen; i++) {
    packed_weight *p = &g_packs[i];
    if (p->data != data || p->n != n || p->k != k || p->tb != tb || p->f32 != f32 || p->cat != key ||
        p->kind != kind)
      continue;
    if (p->print != print) { /* rewritten in place: stale */
      pack_drop(p);
      i--;
      continue;
    }
    if (!p->packed) seen = p;
    else return kind != PACK_ONEDNN || dnnl_memory_desc_equal(&p->md, &c->bd) ? p->packed : NULL;
  }
  if (!seen) {
    /* The first use runs in place: packing costs about one product (it reads the weight, the
     * first touch of a mapped one included), so it pays only for a weight used again, and a
     * single forward (one prefill) does not pay it at all. */
    if (g_packs_used == g_packs_cap) {
      int cap = g_packs_cap ? 2 * g_packs_cap : 64;
      packed_weight *np = realloc(g_packs, (size_t)cap * sizeof *np);
      if (!np) return NULL;
      g_packs = np;
      g_packs_cap = cap;
    }
    g_packs[g_packs_used] = (packed_weight){data, n, k, tb, key, f32, print, {0}, NULL, 0, kind};
    if (c) g_packs[g_packs_used].md = c->bd;
    g_packs_used++;
    return NULL;
  }
  size_t bytes = kind == PACK_MKL      ? ds_mkl_bf16_pack_size(m, n, k)
                 : kind == PACK_MKL_F32 ? ds_mkl_sgemm_pack_size(m, n, k)
                 : kind == PACK_ROUNDED ? (size_t)(n * k) * sizeof(float)
                                        : dnnl_memory_desc_get_size(&c->bd);
  if (g_pack_bytes + bytes > pack_limit()) return NULL;
  void *dst = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
  if (!dst) return NULL;
  /* the plain bf16 B as the matmul sees it: logical [k, n], strides {1, k} (W^T) or {n, 1} (W) */
  if (kind == PACK_ROUNDED || kind == PACK_MKL_F32) { /* W[n, k]: the values ds_bf16_sgemm would round */
    float *r = kind == PACK_ROUNDED ? dst : malloc((size_t)(n * k) * sizeof(float)); /* not kept */
    if (!r) {
      free(dst);
      return NULL;
    }
    ds_bf16_round_rows(r, 0, data, n, k, k);
    if (kind == PACK_MKL_F32) ds_mkl_sgemm_pack(dst, r, m, n, k), free(r);
    seen->packed = dst, seen->bytes = bytes;
    g_pack_bytes += bytes;
    return dst;
  }
  const uint16_t *src = data;
  if (cat) {
    uint16_t *s = scratch_get(&g_sb, (size_t)(n * k) * sizeof(uint16_t));
    concat_bf16(s, cat, f32, k);
    src = s;
  } else if (f32) { /* rounded exactly as the unpacked path rounds it */
    uint16_t *s = scratch_get(&g_sb, (size_t)(n * k) * sizeof(uint16_t));
    ds_bf16_round_rows(s, 1, data, tb ? n : k, tb ? k : n, tb ? k : n); /* W as stored */
    src = s;
  }
  if (kind == PACK_MKL) {
    ds_mkl_bf16_pack(dst, src, m, n, k);
    seen->packed = dst, seen->bytes = bytes;
    g_pack_bytes += bytes;
    return dst;
  }
  if (getenv("DSPARK_BF16_PACK_ONEDNN") == NULL && ds_pack_amx(&c->bd, src, tb, n, k, dst, bytes)) {
    *seen = (packed_weight){data, n, k, tb, key, f32, print, c->bd, dst, bytes, PACK_ONEDNN};
    g_pack_bytes += bytes;
    return dst;
  }
  dnnl_dims_t sh = {k, n}, st = {tb ? 1 : n, tb ? k : 1};
  dnnl_memory_desc_t sd;
  dnnl_primitive_desc_t rpd = NULL;
  dnnl_primitive_t r = NULL;
  dnnl_memory_t sm = NULL, dm = NULL;
  int ok = dnnl_memory_desc_init_by_strides(&sd, 2, sh, dnnl_bf16, st) == dnnl_success &&
           dnnl_reorder_primitive_desc_create(&rpd, &sd, g_engine, &c->bd, g_engine, NULL) == dnnl_success &&
           dnnl_primitive_create(&r, rpd) == dnnl_success &&
           dnnl_memory_create(&sm, &sd, g_engine, (void *)src) == dnnl_success &&
           dnnl_memory_create(&dm, &c->bd, g_engine, dst) == dnnl_success;
  if (ok) {
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, sm}, {DNNL_ARG_TO, dm}};
    ok = dnnl_primitive_execute(r, g_stream, 2, args) == dnnl_success && dnnl_stream_wait(g_stream) == dnnl_success;
  }
  if (sm) dnnl_memory_destroy(sm);
  if (dm) dnnl_memory_destroy(dm);
  if (r) dnnl_primitive_destroy(r);
  if (rpd) dnnl_primitive_desc_destroy(rpd);
  if (!ok) {
    free(dst);
    return NULL;
  }
  *seen = (packed_weight){data, n, k, tb, key, f32, print, c->bd, dst, bytes, PACK_ONEDNN};
  g_pack_bytes += bytes;
  return dst;
}

/* A forward on a weight of n x k elements goes to MKL (cpu_gemm_mkl.h: weights that stream from
 * memory, where its kernels measured 1.42x oneDNN 2.6's). */
static int mkl_for(int64_t n, int64_t k) { return n * k >= ds_mkl_bf16_min_elems() && ds_mkl_bf16_available(); }

/* 1 when MKL ran C = A[m, k] @ W^T (+ C) on W's packed copy (data, or the concatenation cat);
 * 0 on the first use (the caller runs it in place) or past the cap. */
static int gemm_mkl_packed(int64_t m, const void *data, int f32, const cat_src *cat, int64_t n, int64_t k,
                           const float *A, int64_t lda, float beta, float *C, int64_t ldc) {
  const void *b = packed_for(NULL, PACK_MKL, data, f32, cat, 1, m, n, k);
  if (!b) return 0;
  ds_mkl_bf16_gemm(m, n, k, rounded(A, m, k, lda, &g_sa), k, b, beta, C, ldc);
  return 1;
}

/* 1 when oneDNN ran C = A[m, k] @ B (+ C) on the packed W: B = W[n, k]^T (tb) or W[k, n]. */
static int gemm_onednn_packed(int tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *Bf,
                              const uint16_t *Bh, float beta, float *C, int64_t ldc) {
  const void *w = Bf ? (const void *)Bf : (const void *)Bh;
  if (tb && mkl_for(n, k)) return gemm_mkl_packed(m, w, Bf != NULL, NULL, n, k, A, lda, beta, C, ldc);
  cached_matmul *c = matmul_for(0, tb, m, n, k, k, tb ? k : n, n, beta != 0.0f, 1, 0);
  if (!c) return 0;
  const void *b = packed_for(c, PACK_ONEDNN, w, Bf != NULL, NULL, tb, m, n, k);
  if (!b) return 0;
  return run_dense(c, rounded(A, m, k, lda, &g_sa), b, C, ldc, beta);
}

/* 1 when oneDNN ran C = A[m, k] @ [segs]^T (+ C) as one product on the concatenation's packed
 * copy (made on its second use, under the cap); 0 otherwise, the caller then runs the segments
 * in place. A one-shot concatenated copy is not made: copying the weights (66 MB a layer of a
 * Qwen3-1.7B) cost more than the narrow products it saved (measured: a 256-token prefill of the
 * 1.7B shape 1.1-1.5x slower). */
static int gemm_onednn_cat(int64_t m, const cat_src *cat, int f32, int64_t k, const float *A, int64_t lda,
                           float beta, float *C, int64_t ldc) {
  int64_t n = 0;
  for (int s = 0; s < cat->n_seg; s++) n += cat->rows[s];
  if (pack_limit() == 0) return 0;
  if (mkl_for(n, k)) return gemm_mkl_packed(m, cat->segs[0], f32, cat, n, k, A, lda, beta, C, ldc);
  cached_matmul *c = matmul_for(0, 1, m, n, k, k, k, n, beta != 0.0f, 1, 0);
  const void *b = c ? packed_for(c, PACK_ONEDNN, cat->segs[0], f32, cat, 1, m, n, k) : NULL;
  return b ? run_dense(c, rounded(A, m, k, lda, &g_sa), b, C, ldc, beta) : 0;
}

/* ---------------------------------------------------------------- tile products */

/* Primitives for ds_bf16_tile_gemm_run: made under g_lock, never evicted (a thread may be
 * running one), so the table is bounded and a full table answers NULL (the caller's fp32 path). */
enum { TILE_SLOTS = 256 };
struct ds_bf16_tile_gemm {
  cached_matmul mm;
};
static ds_bf16_tile_gemm g_tiles[TILE_SLOTS];
static int g_tiles_used;

static const ds_bf16_tile_gemm *tile_gemm_locked(int tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                                                 int64_t ldc) {
  for (int i = 0; i < g_tiles_used; i++) {
    const cached_matmul *c = &g_tiles[i].mm;
    if (c->m == m && c->n == n && c->k == k && c->lda == lda && c->ldb == ldb && c->ldc == ldc && c->tb == tb)
      return &g_tiles[i]; /* every tile primitive: ta 0, beta 0, user scratchpad */
  }
  if (g_tiles_used == TILE_SLOTS || !native_locked()) return NULL;
  /* made through the eviction cache, then moved here (the cache slot forgets it) */
  cached_matmul *c = matmul_for(0, tb, m, n, k, lda, ldb, ldc, 0, 0, 1);
  if (!c) return NULL;
  g_tiles[g_tiles_used].mm = *c;
  memset(c, 0, sizeof *c);
  c->m = -1; /* matches no product */
  return &g_tiles[g_tiles_used++];
}

/* oneDNN streams are not meant to be shared between threads: one per calling thread, made on
 * its first tile product and kept for the life of the thread. */
static _Thread_local dnnl_stream_t tl_stream;
static _Thread_local scratch tl_pad; /* the thread's scratchpad for tile products; kept */

void ds_bf16_tile_gemm_run(const ds_bf16_tile_gemm *g, const uint16_t *A, const uint16_t *B, float *C) {
  if (!tl_stream) DS_CHECK(dnnl_stream_create(&tl_stream, g_engine, dnnl_stream_default_flags) == dnnl_success);
  const cached_matmul *c = &g->mm;
  size_t pad = dnnl_memory_desc_get_size(&c->sd);
  void *sp = scratch_get(&tl_pad, pad ? pad : 64);
  dnnl_memory_t am = NULL, bm = NULL, cm = NULL, sm = NULL;
  int ok = dnnl_memory_create(&am, &c->ad, g_engine, (void *)A) == dnnl_success &&
           dnnl_memory_create(&bm, &c->bd, g_engine, (void *)B) == dnnl_success &&
           dnnl_memory_create(&cm, &c->cd, g_engine, C) == dnnl_success &&
           dnnl_memory_create(&sm, &c->sd, g_engine, sp) == dnnl_success;
  if (ok) {
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}, {DNNL_ARG_SCRATCHPAD, sm}};
    ok = dnnl_primitive_execute(c->prim, tl_stream, 4, args) == dnnl_success &&
         dnnl_stream_wait(tl_stream) == dnnl_success;
  }
  if (am) dnnl_memory_destroy(am);
  if (bm) dnnl_memory_destroy(bm);
  if (cm) dnnl_memory_destroy(cm);
  if (sm) dnnl_memory_destroy(sm);
  DS_CHECK(ok); /* made and checked by ds_bf16_tile_gemm_get: a failure here is a bug of ours */
}
#endif

const ds_bf16_tile_gemm *ds_bf16_tile_gemm_get(int tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                                               int64_t ldc) {
#if defined(DSPARK_GEMM_ONEDNN)
  pthread_mutex_lock(&g_lock);
  const ds_bf16_tile_gemm *g = tile_gemm_locked(tb, m, n, k, lda, ldb, ldc);
  pthread_mutex_unlock(&g_lock);
  return g;
#else
  (void)tb, (void)m, (void)n, (void)k, (void)lda, (void)ldb, (void)ldc;
  return NULL;
#endif
}

#if !defined(DSPARK_GEMM_ONEDNN)
/* Without oneDNN, _get never hands out a product, so nothing can run one. */
void ds_bf16_tile_gemm_run(const ds_bf16_tile_gemm *g, const uint16_t *A, const uint16_t *B, float *C) {
  (void)A, (void)B, (void)C;
  DS_CHECK(g == NULL && !"a tile product without oneDNN");
}
#endif

/* ---------------------------------------------------------------- entries */

void ds_cpu_gemm_bf16(ds_bf16_path path, int ta, int tb, int64_t m, int64_t n, int64_t k, const float *A,
                      int64_t lda, const float *Bf, const uint16_t *Bh, int64_t ldb, float beta, float *C,
                      int64_t ldc) {
  DS_CHECK((Bf != NULL) != (Bh != NULL));
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    if (beta == 0.0f)
      for (int64_t i = 0; i < m; i++) memset(C + i * ldc, 0, (size_t)n * sizeof(float));
    return;
  }
  pthread_mutex_lock(&g_lock);
  int done = 0;
  (void)route_asked_locked();
#if defined(DSPARK_GEMM_ONEDNN)
  if (path == DS_BF16_AUTO && route_native_locked())
    done = gemm_onednn(ta, tb, m, n, k, A, lda, Bf, Bh, ldb, beta, C, ldc);
#endif
  pthread_mutex_unlock(&g_lock);
  if (!done) ds_bf16_sgemm(ta, tb, m, n, k, A, lda, Bf, Bh, ldb, beta, C, ldc);
}

void ds_cpu_gemm_bf16_frozen(int tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *Bf,
                             const uint16_t *Bh, float beta, float *C, int64_t ldc) {
  DS_CHECK((Bf != NULL) != (Bh != NULL));
  int done = 0, native = 0;
  const float *rounded_w = NULL, *mkl_w = NULL; /* the sgemm route's copies of an F32 W */
#if defined(DSPARK_GEMM_ONEDNN)
  if (m > 0 && n > 0 && k > 0) {
    pthread_mutex_lock(&g_lock);
    native = route_native_locked();
    if (native && pack_limit() > 0) done = gemm_onednn_packed(tb, m, n, k, A, lda, Bf, Bh, beta, C, ldc);
    else if (!native && Bf && pack_limit() > 0 && tb && m * n * k >= DS_MKL_SGEMM_MIN && ds_mkl_sgemm_available())
      mkl_w = packed_for(NULL, PACK_MKL_F32, Bf, 1, NULL, 1, m, n, k); /* a forward MKL runs */
    else if (!native && Bf && pack_limit() > 0)
      rounded_w = packed_for(NULL, PACK_ROUNDED, Bf, 1, NULL, 1, m, tb ? n : k, tb ? k : n);
    pthread_mutex_unlock(&g_lock);
  }
#endif
  if (done) return;
  if (mkl_w) ds_bf16_sgemm_mkl_packed(m, n, k, A, lda, mkl_w, beta, C, ldc);
  else if (rounded_w) ds_bf16_sgemm_rounded_b(0, tb, m, n, k, A, lda, rounded_w, tb ? k : n, beta, C, ldc);
  else if (!native && m > 0 && n > 0 && k > 0) ds_bf16_sgemm_frozen(tb, m, n, k, A, lda, Bf, Bh, beta, C, ldc);
  else ds_cpu_gemm_bf16(DS_BF16_AUTO, 0, tb, m, n, k, A, lda, Bf, Bh, tb ? k : n, beta, C, ldc);
}

void ds_cpu_gemm_bf16_frozen_cat(int64_t m, const void *const *segs, int f32, const int64_t *rows, int n_seg, int64_t k,
                                 const float *A, int64_t lda, float beta, float *C, int64_t ldc) {
  int done = 0, native = 0;
  int64_t n = 0;
  for (int s = 0; s < n_seg; s++) n += rows[s];
#if defined(DSPARK_GEMM_ONEDNN)
  if (m > 0 && k > 0 && n_seg > 0) {
    cat_src cat = {segs, rows, n_seg};
    pthread_mutex_lock(&g_lock);
    native = route_native_locked();
    if (native) done = gemm_onednn_cat(m, &cat, f32, k, A, lda, beta, C, ldc);
    pthread_mutex_unlock(&g_lock);
  }
#endif
  if (!done && !native && m > 0 && k > 0 && n > 0) {
    ds_bf16_sgemm_frozen_cat(m, segs, f32, rows, n_seg, k, A, lda, beta, C, ldc);
    return;
  }
  int64_t col = 0;
  for (int s = 0; !done && s < n_seg; col += rows[s], s++)
    ds_cpu_gemm_bf16_frozen(1, m, rows[s], k, A, lda, f32 ? segs[s] : NULL, f32 ? NULL : segs[s], beta, C + col, ldc);
}

size_t ds_packed_weight_bytes(void) {
  size_t q = ds_quant_packed_bytes(); /* the 8-row copies of quantized weights (nn/cpu_quant.h) */
  pthread_mutex_lock(&g_lock);
#if defined(DSPARK_GEMM_ONEDNN)
  size_t b = g_pack_bytes;
#else
  size_t b = 0;
#endif
  pthread_mutex_unlock(&g_lock);
  return b + q;
}

void ds_release_packed_weights(void) {
  ds_quant_release_packs();
#if defined(DSPARK_GEMM_ONEDNN)
  pthread_mutex_lock(&g_lock);
  while (g_packs_used > 0) pack_drop(&g_packs[g_packs_used - 1]);
  free(g_packs);
  g_packs = NULL;
  g_packs_cap = 0;
  pthread_mutex_unlock(&g_lock);
#endif
}

void ds_gemm_bf16(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *B,
                  int64_t ldb, float beta, float *C, int64_t ldc) {
  ds_cpu_gemm_bf16(DS_BF16_AUTO, ta, tb, m, n, k, A, lda, B, NULL, ldb, beta, C, ldc);
}

#if defined(DSPARK_GEMM_ONEDNN)
static int under_lock(int (*query)(void)) {
  pthread_mutex_lock(&g_lock);
  int r = query();
  pthread_mutex_unlock(&g_lock);
  return r;
}
int ds_gemm_bf16_native(void) { return under_lock(route_native_locked); }
int ds_bf16_tiles_native(void) { return under_lock(native_locked); }
#else
int ds_gemm_bf16_native(void) { return 0; }
int ds_bf16_tiles_native(void) { return 0; }
#endif

const char *ds_gemm_bf16_name(void) {
  static char name[384];
  pthread_mutex_lock(&g_lock);
  (void)route_asked_locked();
  if (!name[0]) {
#if defined(DSPARK_GEMM_ONEDNN)
    /* the kernel oneDNN picks for a dense x @ W^T product, the shape of every linear */
    cached_matmul *c = native_locked() ? matmul_for(0, 1, 256, 256, 256, 256, 256, 256, 0, 0, 0) : NULL;
    char onednn[96] = "";
    if (c) {
      const dnnl_version_t *v = dnnl_version();
      snprintf(onednn, sizeof onednn, "oneDNN %d.%d.%d matmul %s", v->major, v->minor, v->patch,
               c->impl[0] ? c->impl : "(kernel not reported)");
    }
    if (c && route_native_locked()) {
      int at = snprintf(name, sizeof name, "%s", onednn);
      const char *ver = ds_mkl_bf16_available() ? strstr(ds_mkl_bf16_status(), "Version ") : NULL;
      if (ver && at > 0 && (size_t)at < sizeof name)
        snprintf(name + at, sizeof name - (size_t)at, "; frozen weights of %lld+ elements: MKL %.*s",
                 (long long)ds_mkl_bf16_min_elems(), (int)strcspn(ver + 8, "- "), ver + 8);
    } else if (c) {
      snprintf(name, sizeof name, "bf16-rounded inputs, fp32 GEMM (%s; %s); attention tiles: %s", ds_gemm_name(),
               g_route_why, onednn);
    }
#endif
    if (!name[0]) snprintf(name, sizeof name, "bf16-rounded inputs, fp32 GEMM (%s)", ds_gemm_name());
  }
  pthread_mutex_unlock(&g_lock);
  return name;
}

const char *ds_gemm_bf16_warning(void) {
  pthread_mutex_lock(&g_lock);
  (void)route_asked_locked(); /* a bad DSPARK_BF16_GEMM is reported wherever bf16 compute runs */
  pthread_mutex_unlock(&g_lock);
  if (ds_bf16_tiles_native()) return NULL;
  return "warning: bf16 compute without native bf16 matmul kernels (a build without oneDNN, a CPU without "
         "AVX512_BF16 / AMX, or DNNL_MAX_CPU_ISA below them): inputs are rounded to bf16 and multiplied by the "
         "fp32 GEMM: bf16 numbers, no speedup";
}

void ds_cpu_matmul_w(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda, const float *B,
                     int64_t ldb, float beta, float *C, int64_t ldc, int64_t rows, int64_t min_rows) {
  if (ds_matmul_compute() == DS_COMPUTE_BF16 && rows >= min_rows)
    ds_cpu_gemm_bf16(DS_BF16_AUTO, ta, tb, m, n, k, A, lda, B, NULL, ldb, beta, C, ldc);
  else
    ds_cpu_sgemm(ta, tb, m, n, k, A, lda, B, ldb, beta, C, ldc);
}
