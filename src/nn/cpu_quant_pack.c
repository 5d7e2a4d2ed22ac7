/* The 8-row interleaved copies of frozen quantized weights (every type the kernels know; layout in
 * nn/cpu_quant.h) that the packed direct path reads (AVX2 and VNNI): made once per weight when a
 * target loads or on its first direct product, kept for the life of the process, keyed by the
 * weight's address as the bf16 packed copies are (ds_release_packed_weights() drops both). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/fileio.h"
#include "nn/cpu_kernels.h"
#include "nn/cpu_quant.h"

int ds_quant_packable(ds_dtype dt) {
  return dt == DS_Q4_0 || dt == DS_Q4_1 || dt == DS_Q8_0 || dt == DS_Q5_0 || dt == DS_Q5_1 || dt == DS_Q4_K ||
         dt == DS_Q6_K;
}

/* Where the bytes of row r's Q6_K super-block (ql[128], qh[64], scales[16], d as stored) lie in a
 * packed one (nn/cpu_quant.h): stored byte i at packed byte q6k_at(i, r). */
static size_t q6k_at(int i, int r) {
  if (i < 128) return 144 + 32 * (size_t)(i / 4) + 4 * (size_t)r + (size_t)(i % 4);         /* ql */
  if (i < 192) return 144 + 1024 + 32 * (size_t)((i - 128) / 4) + 4 * (size_t)r + (size_t)(i % 4); /* qh */
  if (i < 208) return 16 + 8 * (size_t)(i - 192) + (size_t)r;                              /* scales */
  return 2 * (size_t)r + (size_t)(i - 208);                                                /* d */
}

static int has_m(ds_dtype dt) { return dt == DS_Q4_1 || dt == DS_Q5_1 || dt == DS_Q4_K; } /* m or dmin */
static int is_q5(ds_dtype dt) { return dt == DS_Q5_0 || dt == DS_Q5_1; }
enum { Q4K_SCALES = 12 }; /* Q4_K's bytes of 6-bit scales and mins after d, dmin */
/* Bytes ahead of a packed block's quants: d[8] (and m[8] / dmin[8]), then Q5's fifth bits or
 * Q4_K's scale bytes. */
static size_t scale_bytes(ds_dtype dt) {
  return (has_m(dt) ? 32 : 16) + (is_q5(dt) ? 32 : 0) + (dt == DS_Q4_K ? 8 * Q4K_SCALES : 0);
}
/* Bytes ahead of a stored block's quants: d (m) (Q5's 32-bit mask of fifth bits, Q4_K's scales) */
static size_t head_bytes(ds_dtype dt) {
  return (has_m(dt) ? 4 : 2) + (is_q5(dt) ? 4 : 0) + (dt == DS_Q4_K ? Q4K_SCALES : 0);
}

/* A Q5 block's fifth bits (bit v of the stored mask: value v) in the packed kernel's order: byte k
 * bit c holds value (c < 4 ? 0 : 16) + 4 (c % 4) + k, so chunk j's bits for its low nibbles are
 * bit j of every byte, for its high ones bit 4 + j. */
static uint32_t q5_bits_packed(uint32_t h) {
  uint32_t e = 0;
  for (int k = 0; k < 4; k++)
    for (int c = 0; c < 8; c++) e |= ((h >> ((c < 4 ? 0 : 16) + 4 * (c % 4) + k)) & 1u) << (8 * k + c);
  return e;
}

static uint32_t q5_bits_stored(uint32_t e) {
  uint32_t h = 0;
  for (int k = 0; k < 4; k++)
    for (int c = 0; c < 8; c++) h |= ((e >> (8 * k + c)) & 1u) << ((c < 4 ? 0 : 16) + 4 * (c % 4) + k);
  return h;
}

static void put_le32(unsigned char *p, uint32_t v) {
  for (int k = 0; k < 4; k++) p[k] = (unsigned char)(v >> (8 * k));
}

void ds_quant_pack8(unsigned char *dst, const unsigned char *w, ds_dtype dt, int64_t groups, int64_t in) {
  int64_t blk = ds_quant_block(dt);
  DS_CHECK(ds_quant_packable(dt) && in % blk == 0);
  int64_t nb = in / blk;
  size_t bb = ds_quant_row_bytes(dt, blk), rb = ds_quant_row_bytes(dt, in), head = head_bytes(dt);
  size_t sb = scale_bytes(dt), qb = bb - head; /* quant bytes of a row's block: 16 or 32 */
  DS_OMP(parallel for schedule(static) if (groups * nb > 4096))
  for (int64_t g = 0; g < groups; g++)
    for (int64_t b = 0; b < nb; b++) {
      unsigned char *o = dst + ((size_t)g * (size_t)nb + (size_t)b) * 8 * bb;
      for (int r = 0; r < 8; r++) {
        const unsigned char *src = w + (size_t)(8 * g + r) * rb + (size_t)b * bb;
        if (dt == DS_Q6_K) {
          for (int i = 0; i < 210; i++) o[q6k_at(i, r)] = src[i];
          continue;
        }
        memcpy(o + 2 * r, src, 2);                             /* d */
        if (has_m(dt)) memcpy(o + 16 + 2 * r, src + 2, 2);     /* m */
        if (is_q5(dt)) put_le32(o + sb - 32 + 4 * r, q5_bits_packed(ds_quant_le32(src + head - 4)));
        if (dt == DS_Q4_K)
          for (int i = 0; i < Q4K_SCALES; i++) o[32 + 8 * i + r] = src[4 + i]; /* scale byte i of 8 rows */
        for (size_t j = 0; j < qb / 4; j++) memcpy(o + sb + 32 * j + 4 * r, src + head + 4 * j, 4);
      }
    }
}

/* ---------------------------------------------------------------- the copies */

typedef struct {
  const void *data; /* the weight's address: the key, with its type and shape */
  ds_dtype dtype;
  int64_t rows, in;
  unsigned char *packed; /* NULL when it could not be made (the row kernel runs) */
  size_t bytes;
} quant_pack;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static quant_pack *g_packs;
static int64_t g_used, g_cap; /* open addressing: g_cap a power of two, at most half full */
static size_t g_bytes;

/* The copies lie in chunks of huge-page memory (ds_malloc_huge), one after another in the order
 * they are made (a model's layers in order): a decode step streams them through 2 MiB pages (on
 * an AMD EPYC Zen 4, SmolLM2 Q4_1 / Q8_0 decoded 1.1x / 1.2x the tokens/s of copies in 4 KiB
 * pages: docs/compute.md). Freed all at once with the copies' table. */
enum { ARENA_CHUNK = 64 << 20 };
typedef struct arena_chunk {
  struct arena_chunk *next;
  unsigned char *base;
  size_t size, used;
} arena_chunk;
static arena_chunk *g_arena; /* the chunk being filled first */

static unsigned char *arena_alloc(size_t bytes) {
  bytes = (bytes + 63) & ~(size_t)63;
  if (g_arena && g_arena->size - g_arena->used >= bytes) {
    unsigned char *p = g_arena->base + g_arena->used;
    g_arena->used += bytes;
    return p;
  }
  /* a new chunk (untouched, its rest is not resident); a copy larger than a chunk gets its own,
   * kept behind the one being filled */
  size_t size = bytes > ARENA_CHUNK ? bytes : ARENA_CHUNK;
  arena_chunk *c = malloc(sizeof *c);
  unsigned char *base = c ? ds_malloc_huge(size, "packed copies of quantized weights") : NULL;
  if (!base) {
    free(c);
    return NULL;
  }
  *c = (arena_chunk){NULL, base, size, bytes};
  if (size > ARENA_CHUNK && g_arena) c->next = g_arena->next, g_arena->next = c;
  else c->next = g_arena, g_arena = c;
  return base;
}

static void arena_release(void) {
  while (g_arena) {
    arena_chunk *c = g_arena;
    g_arena = c->next;
    ds_free_aligned(c->base);
    free(c);
  }
}

static size_t slot_of(const void *data, int64_t cap) {
  uintptr_t h = (uintptr_t)data;
  h ^= h >> 17, h *= 0x9E3779B97F4A7C15u, h ^= h >> 29;
  return (size_t)h & (size_t)(cap - 1);
}

static int grow(void) {
  int64_t cap = g_cap ? 2 * g_cap : 512;
  quant_pack *np = calloc((size_t)cap, sizeof *np);
  if (!np) return 0;
  for (int64_t i = 0; i < g_cap; i++)
    if (g_packs[i].data) {
      size_t s = slot_of(g_packs[i].data, cap);
      while (np[s].data) s = (s + 1) & (size_t)(cap - 1);
      np[s] = g_packs[i];
    }
  free(g_packs);
  g_packs = np, g_cap = cap;
  return 1;
}

const unsigned char *ds_quant_packed(ds_weight w, int64_t rows, int64_t in) {
  if (!ds_quant_packable(w.dtype) || rows < 8 || in % ds_quant_block(w.dtype)) return NULL;
  pthread_mutex_lock(&g_lock);
  const unsigned char *found = NULL;
  int known = 0;
  if (g_cap) {
    for (size_t s = slot_of(w.data, g_cap); g_packs[s].data; s = (s + 1) & (size_t)(g_cap - 1)) {
      quant_pack *p = &g_packs[s];
      if (p->data == w.data && p->dtype == w.dtype && p->rows == rows && p->in == in) {
        found = p->packed, known = 1;
        break;
      }
    }
  }
  if (!known && (2 * (g_used + 1) <= g_cap || grow())) {
    int64_t groups = rows / 8;
    size_t bytes = ds_quant_row_bytes(w.dtype, in) * 8 * (size_t)groups;
    unsigned char *dst = arena_alloc(bytes);
    if (dst) ds_quant_pack8(dst, w.data, w.dtype, groups, in); /* no memory: the row kernel, for good */
    /* every reader of these rows now reads the copy (ds_quant_unpack_row for single rows): a
     * file mapping's pages of them need not stay resident beside it */
    if (dst) ds_release_mapped_pages(w.data, bytes);
    size_t s = slot_of(w.data, g_cap);
    while (g_packs[s].data) s = (s + 1) & (size_t)(g_cap - 1);
    g_packs[s] = (quant_pack){w.data, w.dtype, rows, in, dst, dst ? bytes : 0};
    g_used++;
    g_bytes += dst ? bytes : 0;
    found = dst;
  }
  pthread_mutex_unlock(&g_lock);
  return found;
}

const unsigned char *ds_quant_packed_find(const void *data, ds_dtype dt, int64_t in, int64_t *rows_packed) {
  *rows_packed = 0;
  if (!ds_quant_packable(dt)) return NULL;
  const unsigned char *found = NULL;
  pthread_mutex_lock(&g_lock);
  for (size_t s = g_cap ? slot_of(data, g_cap) : 0; g_cap && g_packs[s].data; s = (s + 1) & (size_t)(g_cap - 1))
    if (g_packs[s].data == data && g_packs[s].dtype == dt && g_packs[s].in == in) {
      found = g_packs[s].packed;
      *rows_packed = found ? g_packs[s].rows / 8 * 8 : 0;
      break;
    }
  pthread_mutex_unlock(&g_lock);
  return found;
}

void ds_quant_unpack_row(unsigned char *row, const unsigned char *packed, ds_dtype dt, int64_t in, int64_t r) {
  int64_t blk_values = ds_quant_block(dt), nb = in / blk_values, g = r / 8;
  int lane = (int)(r % 8);
  size_t bb = ds_quant_row_bytes(dt, blk_values), head = head_bytes(dt), sb = scale_bytes(dt), qb = bb - head;
  for (int64_t b = 0; b < nb; b++) {
    const unsigned char *blk = packed + ((size_t)g * (size_t)nb + (size_t)b) * 8 * bb;
    unsigned char *o = row + (size_t)b * bb;
    if (dt == DS_Q6_K) {
      for (int i = 0; i < 210; i++) o[i] = blk[q6k_at(i, lane)];
      continue;
    }
    memcpy(o, blk + 2 * lane, 2);                         /* d */
    if (has_m(dt)) memcpy(o + 2, blk + 16 + 2 * lane, 2); /* m */
    if (is_q5(dt)) put_le32(o + head - 4, q5_bits_stored(ds_quant_le32(blk + sb - 32 + 4 * lane)));
    if (dt == DS_Q4_K)
      for (int i = 0; i < Q4K_SCALES; i++) o[4 + i] = blk[32 + 8 * i + lane];
    for (size_t j = 0; j < qb / 4; j++) memcpy(o + head + 4 * j, blk + sb + 32 * j + 4 * lane, 4);
  }
}

size_t ds_quant_packed_bytes(void) {
  pthread_mutex_lock(&g_lock);
  size_t b = g_bytes;
  pthread_mutex_unlock(&g_lock);
  return b;
}

void ds_quant_release_packs(void) {
  pthread_mutex_lock(&g_lock);
  arena_release();
  free(g_packs);
  g_packs = NULL, g_cap = g_used = 0, g_bytes = 0;
  pthread_mutex_unlock(&g_lock);
}
