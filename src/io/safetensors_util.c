/* Small helpers of the safetensors reader, directory and writer (io/safetensors_internal.h). */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/json_util.h"
#include "dspark/dtype.h"
#include "dspark/safetensors.h"
#include "io/safetensors_internal.h"

uint64_t st_read_le64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

char *st_dup_str(const char *s, const char *what) {
  size_t n = strlen(s) + 1;
  char *p = ds_malloc(n, what);
  if (p) memcpy(p, s, n);
  return p;
}

/* Strict UTF-8 (no overlongs, no surrogates, <= U+10FFFF), as Rust's str::from_utf8.
 * Returns the offset of the first bad byte, or len if all valid. */
size_t st_utf8_invalid_at(const unsigned char *s, size_t len) {
  size_t i = 0;
  while (i < len) {
    unsigned c = s[i];
    if (c < 0x80) { i++; continue; }
    size_t need;
    unsigned lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) need = 1;
    else if (c == 0xe0) { need = 2; lo = 0xa0; }
    else if (c >= 0xe1 && c <= 0xec) need = 2;
    else if (c == 0xed) { need = 2; hi = 0x9f; }
    else if (c >= 0xee && c <= 0xef) need = 2;
    else if (c == 0xf0) { need = 3; lo = 0x90; }
    else if (c >= 0xf1 && c <= 0xf3) need = 3;
    else if (c == 0xf4) { need = 3; hi = 0x8f; }
    else return i;
    if (len - i <= need) return i;
    if (s[i + 1] < lo || s[i + 1] > hi) return i;
    for (size_t k = 2; k <= need; k++)
      if ((s[i + k] & 0xc0) != 0x80) return i;
    i += need + 1;
  }
  return len;
}

void st_format_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
  size_t used = 0;
  int w = snprintf(buf, cap, "[");
  used = w > 0 ? (size_t)w : 0;
  for (int d = 0; d < ndim && used < cap; d++) {
    w = snprintf(buf + used, cap - used, "%s%" PRId64, d ? ", " : "", shape[d]);
    if (w < 0) break;
    used += (size_t)w;
  }
  if (used < cap) snprintf(buf + used, cap - used, "]");
}

/* Reads a JSON number that must be an exact integer in [0, 2^53]. Returns 1 on success;
 * on failure *val holds the number (or NAN when it is not a number) for the message. */
int st_json_index(const cJSON *j, uint64_t *out, double *val) {
  *val = NAN;
  if (!cJSON_IsNumber(j)) return 0;
  double d = j->valuedouble;
  *val = d;
  if (!(d >= 0.0 && d <= ST_MAX_JSON_INT) || d != floor(d)) return 0;
  *out = (uint64_t)d;
  return 1;
}

int st_cmp_view_name(const void *a, const void *b) {
  const ds_tensor_view *x = *(const ds_tensor_view *const *)a;
  const ds_tensor_view *y = *(const ds_tensor_view *const *)b;
  return strcmp(x->name, y->name);
}

int st_cmp_cstr(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int st_cmp_meta_key(const void *a, const void *b) {
  return strcmp(((const st_meta *)a)->key, ((const st_meta *)b)->key);
}

const ds_tensor_view *st_find_in_sorted(const ds_tensor_view *const *by_name, size_t n,
                                            const char *name) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(by_name[mid]->name, name);
    if (c == 0) return by_name[mid];
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return NULL;
}


uint64_t st_metadata_hash(const st_meta *meta, size_t n, const char *skip_key) {
  XXH64_state_t *h = XXH64_createState();
  if (!h) return 0;
  XXH64_reset(h, 0);
  for (size_t i = 0; i < n; i++) {
    if (skip_key && !strcmp(meta[i].key, skip_key)) continue;
    XXH64_update(h, meta[i].key, strlen(meta[i].key) + 1);
    XXH64_update(h, meta[i].value, strlen(meta[i].value) + 1);
  }
  uint64_t v = XXH64_digest(h);
  XXH64_freeState(h);
  return v;
}

/* An image of 2 MiB or more starts on a 2 MiB boundary with huge pages advised: a GGUF's F16 /
 * BF16 matrices are used where they lie in it, and a decode step streams all of them (SmolLM2's
 * F16 file decoded 1.07-1.09x faster from 2 MiB pages, docs/compute.md). A tensor reserved and
 * never written costs nothing while no page of it is touched; a small tensor written between
 * such ones would fault their 2 MiB around it in, so an image's builder places them last. */
enum { IMAGE_HUGE = 2 << 20 };

unsigned char *st_image_alloc(size_t size, const char *label) {
  size_t n = size ? size : 1, pad = n >= IMAGE_HUGE ? IMAGE_HUGE : 0;
  unsigned char *p = n + pad < n ? MAP_FAILED : mmap(NULL, n + pad, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    DS_FAIL(DS_ERR_NOMEM, "%s: cannot allocate the weights' image (%.1f MB)", label, (double)size / 1e6);
    return NULL;
  }
  if (!pad) return p;
  /* keep the 2 MiB-aligned n bytes of the mapping, give back the rest (whole pages) */
  uintptr_t at = ((uintptr_t)p + IMAGE_HUGE - 1) & ~(uintptr_t)(IMAGE_HUGE - 1);
  size_t head = at - (uintptr_t)p, page = (size_t)sysconf(_SC_PAGESIZE), end = (head + n + page - 1) & ~(page - 1);
  if (head) munmap(p, head);
  if (end < n + pad) munmap(p + end, n + pad - end);
#ifdef MADV_HUGEPAGE
  (void)madvise((void *)at, end - head, MADV_HUGEPAGE); /* advice: refused, the image has 4 KiB pages */
#endif
  return (unsigned char *)at;
}

void ds_st_image_free(unsigned char *image, size_t size) {
  if (image) munmap(image, size ? size : 1);
}
