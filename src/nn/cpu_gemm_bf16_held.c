/* The bf16 copies of fp32 operands (contract in nn/cpu_gemm_bf16.h): the rounding loop both
 * routes use, and the copies of held operands (the cpu backend's operand_hold), kept until their
 * last release. One mutex guards the table: the callers are the main thread, so it is never
 * contended. */
#include <pthread.h>
#include <stdlib.h>

#include "nn/cpu_gemm_bf16.h"
#include "nn/cpu_kernels.h"

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

void ds_bf16_round_rows(void *dst, int bits, const float *src, int64_t rows, int64_t cols, int64_t lds) {
  DS_OMP(parallel for schedule(static) if (rows * cols > 65536))
  for (int64_t r = 0; r < rows; r++) {
    const float *s = src + r * lds;
    if (bits) {
      uint16_t *d = (uint16_t *)dst + r * cols;
      for (int64_t j = 0; j < cols; j++) d[j] = ds_round_bf16(s[j]);
    } else {
      uint32_t *d = (uint32_t *)dst + r * cols;
      for (int64_t j = 0; j < cols; j++) d[j] = (uint32_t)ds_round_bf16(s[j]) << 16;
    }
  }
}

/* Operands the caller promised not to change (operand_hold): each keeps its bf16 copy, made by
 * the first product that reads it with a given stored shape, until the last release. A full
 * table ignores a hold (the hint is optional); a release of an unknown pointer does nothing. */
typedef struct {
  const float *p; /* NULL: a free slot */
  size_t n;
  int depth;
  int64_t rows, cols, ld; /* the stored shape of the copy; rows 0 while there is none */
  int f32;                /* the copy holds bf16 values as fp32 (the sgemm route), else bits */
  void *copy;
  size_t cap; /* bytes of copy, kept for the next hold of the slot unless over KEEP_BYTES */
} held_operand;

enum { HELD_SLOTS = 8 };
static held_operand g_held[HELD_SLOTS];
static const size_t KEEP_BYTES = (size_t)64 << 20;

void ds_cpu_bf16_hold(const float *p, size_t n) {
  if (!p || !n) return;
  pthread_mutex_lock(&g_lock);
  held_operand *slot = NULL;
  for (int i = 0; i < HELD_SLOTS && !slot; i++)
    if (g_held[i].p == p) slot = &g_held[i];
  if (slot) {
    slot->depth++;
    if (n > slot->n) slot->n = n;
  } else {
    for (int i = 0; i < HELD_SLOTS && !slot; i++)
      if (!g_held[i].p) slot = &g_held[i];
    if (slot) {
      slot->p = p;
      slot->n = n;
      slot->depth = 1;
      slot->rows = 0;
    }
  }
  pthread_mutex_unlock(&g_lock);
}

void ds_cpu_bf16_release(const float *p) {
  pthread_mutex_lock(&g_lock);
  for (int i = 0; i < HELD_SLOTS; i++) {
    held_operand *h = &g_held[i];
    if (!p || h->p != p || --h->depth > 0) continue;
    h->p = NULL;
    h->rows = 0;
    if (h->cap > KEEP_BYTES) {
      free(h->copy);
      h->copy = NULL;
      h->cap = 0;
    }
  }
  pthread_mutex_unlock(&g_lock);
}

const void *ds_bf16_held_copy(const float *src, int64_t rows, int64_t cols, int64_t ld, int f32) {
  pthread_mutex_lock(&g_lock);
  const void *found = NULL;
  size_t need = (size_t)(rows * cols) * (f32 ? sizeof(float) : sizeof(uint16_t));
  for (int i = 0; i < HELD_SLOTS; i++) {
    held_operand *h = &g_held[i];
    if (h->p != src || (size_t)((rows - 1) * ld + cols) > h->n) continue;
    if (h->rows == rows && h->cols == cols && h->ld == ld && h->f32 == f32) {
      found = h->copy;
      break;
    }
    if (need > h->cap) {
      void *b = aligned_alloc(64, (need + 4095) & ~(size_t)4095);
      if (!b) break; /* no copy: the caller rounds into its scratch as without a hold */
      free(h->copy);
      h->copy = b;
      h->cap = (need + 4095) & ~(size_t)4095;
    }
    ds_bf16_round_rows(h->copy, !f32, src, rows, cols, ld);
    h->rows = rows, h->cols = cols, h->ld = ld, h->f32 = f32;
    found = h->copy;
    break;
  }
  pthread_mutex_unlock(&g_lock);
  return found;
}

