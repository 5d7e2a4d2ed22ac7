/* Minimal assertion helpers for the C unit tests: every failure prints where and why and
 * makes the test exit non-zero (TEST_MAIN returns the failure count). */
#ifndef DSPARK_TEST_UTIL_H
#define DSPARK_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_test_failures;

#define EXPECT(cond)                                                              \
  do {                                                                            \
    if (!(cond)) {                                                                \
      fprintf(stderr, "%s:%d: EXPECT failed: %s\n", __FILE__, __LINE__, #cond);   \
      g_test_failures++;                                                          \
    }                                                                             \
  } while (0)

#define EXPECT_OK(expr)                                                                     \
  do {                                                                                      \
    ds_status st_ = (expr);                                                                 \
    if (st_ != DS_OK) {                                                                     \
      fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__, #expr,             \
              ds_status_name(st_), ds_last_error());                                        \
      g_test_failures++;                                                                    \
    }                                                                                       \
  } while (0)

/* |got - want| <= atol + rtol * |want|, reported with both values. */
#define EXPECT_CLOSE(got, want, rtol, atol)                                               \
  do {                                                                                    \
    double g_ = (double)(got), w_ = (double)(want);                                       \
    if (!(fabs(g_ - w_) <= (atol) + (rtol) * fabs(w_))) {                                  \
      fprintf(stderr, "%s:%d: %s = %.9g, expected %.9g (rtol %g, atol %g)\n", __FILE__,    \
              __LINE__, #got, g_, w_, (double)(rtol), (double)(atol));                     \
      g_test_failures++;                                                                  \
    }                                                                                     \
  } while (0)

#define TEST_RUN(fn)                                                  \
  do {                                                                \
    int before_ = g_test_failures;                                    \
    fn();                                                             \
    fprintf(stderr, "%s %s\n", g_test_failures == before_ ? "ok  " : "FAIL", #fn); \
  } while (0)

#define TEST_RESULT() (g_test_failures ? 1 : 0)

/* max |a - b| / max |b|: the normwise (infinity-norm) relative error of a whole result. */
static inline double test_rel_err(const float *a, const float *b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    num = fmax(num, fabs((double)a[i] - b[i]));
    den = fmax(den, fabs((double)b[i]));
  }
  return num / (den > 0 ? den : 1);
}

/* Kilobytes of transparent huge pages /proc/self/smaps gives the mapping that holds p; -1 where
 * it cannot be read (not Linux). */
static inline long huge_kb_at(const void *p) {
  FILE *f = fopen("/proc/self/smaps", "r");
  if (!f) return -1;
  char line[512];
  int inside = 0;
  long kb = -1;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) /* a mapping's first line; its fields follow */
      inside = (uintptr_t)p >= lo && (uintptr_t)p < hi;
    else if (inside && sscanf(line, "AnonHugePages: %ld kB", &kb) == 1)
      break;
  }
  fclose(f);
  return kb;
}

/* the system grants huge pages to an madvise'd buffer at its first touch (THP "madvise" or
 * "always", and a defrag mode that compacts for it) */
static inline int thp_advised_at_fault(void) {
  char e[128] = "", d[128] = "";
  FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  if (f) (void)!fgets(e, sizeof e, f), fclose(f);
  f = fopen("/sys/kernel/mm/transparent_hugepage/defrag", "r");
  if (f) (void)!fgets(d, sizeof d, f), fclose(f);
  return (strstr(e, "[madvise]") || strstr(e, "[always]")) &&
         (strstr(d, "[madvise]") || strstr(d, "[always]") || strstr(d, "[defer+madvise]"));
}

#endif
