#define _DEFAULT_SOURCE /* madvise */
#include "dspark/common.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

/* Messages longer than the buffer are cut, by design: the warning about it is noise here. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

enum { DS_ERROR_CAP = 2048 };
static _Thread_local char g_error[DS_ERROR_CAP];

const char *ds_status_name(ds_status st) {
  switch (st) {
    case DS_OK: return "ok";
    case DS_ERR_IO: return "I/O error";
    case DS_ERR_FORMAT: return "format error";
    case DS_ERR_ARG: return "invalid argument";
    case DS_ERR_UNSUPPORTED: return "unsupported";
    case DS_ERR_NOMEM: return "out of memory";
    case DS_ERR_RANGE: return "out of range";
    case DS_ERR_NOT_FOUND: return "not found";
    case DS_ERR_NUMERIC: return "non-finite value";
    case DS_ERR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

ds_status ds_error_set(ds_status st, const char *src_file, int src_line, const char *fmt, ...) {
  /* The source location helps us, the message helps the user: message first. */
  char msg[DS_ERROR_CAP];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const char *base = strrchr(src_file, '/');
  snprintf(g_error, sizeof g_error, "%s [%s:%d]", msg, base ? base + 1 : src_file, src_line);
  return st;
}

ds_status ds_error_wrap(ds_status st, const char *fmt, ...) {
  char prefix[DS_ERROR_CAP], old[DS_ERROR_CAP];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, g_error, sizeof old);
  snprintf(g_error, sizeof g_error, "%s: %s", prefix, old);
  return st;
}

const char *ds_last_error(void) { return g_error[0] ? g_error : "no error recorded"; }
void ds_error_clear(void) { g_error[0] = 0; }

static ds_abort_hook g_abort_hook;
void ds_set_abort_hook(ds_abort_hook hook) { g_abort_hook = hook; }

void ds_check_failed(const char *src_file, int src_line, const char *cond) {
  char msg[512];
  snprintf(msg, sizeof msg, "%s:%d: invariant failed: %s", src_file, src_line, cond);
  if (g_abort_hook) g_abort_hook(msg);
  fprintf(stderr, "dspark: %s\n", msg);
  abort();
}

void *ds_malloc(size_t nbytes, const char *what) {
  void *p = malloc(nbytes ? nbytes : 1);
  if (!p) DS_FAIL(DS_ERR_NOMEM, "cannot allocate %zu bytes for %s", nbytes, what);
  return p;
}

void *ds_calloc(size_t n, size_t size, const char *what) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  if (!p) DS_FAIL(DS_ERR_NOMEM, "cannot allocate %zu x %zu bytes for %s", n, size, what);
  return p;
}

void *ds_malloc_aligned(size_t nbytes, const char *what) {
  void *p = NULL;
  size_t rounded = (nbytes + 63) & ~(size_t)63;
  if (posix_memalign(&p, 64, rounded ? rounded : 64) != 0) {
    DS_FAIL(DS_ERR_NOMEM, "cannot allocate %zu bytes for %s", nbytes, what);
    return NULL;
  }
  return p;
}

void *ds_malloc_huge(size_t nbytes, const char *what) {
  const size_t huge = (size_t)2 << 20;
  if (nbytes < huge) return ds_malloc_aligned(nbytes, what);
  size_t rounded = (nbytes + huge - 1) & ~(huge - 1); /* the last 2 MiB huge too */
  void *p = NULL;
  if (rounded < nbytes || posix_memalign(&p, huge, rounded) != 0) {
    DS_FAIL(DS_ERR_NOMEM, "cannot allocate %zu bytes for %s", nbytes, what);
    return NULL;
  }
#ifdef MADV_HUGEPAGE
  (void)madvise(p, rounded, MADV_HUGEPAGE); /* advice: refused, the buffer has 4 KiB pages */
#endif
  return p;
}

void ds_free_aligned(void *p) { free(p); }

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double ds_median(double *v, int64_t n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double ds_time_sec(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
