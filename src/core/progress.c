#include "dspark/progress.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The stream whose last write was an unterminated progress line (a terminal), or NULL. */
static FILE *g_open_line;

double ds_peak_rss_mib(void) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  double kib = 0;
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, "VmHWM:", 6)) {
      sscanf(line + 6, "%lf", &kib);
      break;
    }
  fclose(f);
  return kib / 1024.0;
}

void ds_format_duration(double s, char *buf, size_t n) {
  if (s < 0 || s > 1e7) { snprintf(buf, n, "?"); return; }
  long t = (long)(s + 0.5);
  if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else if (t >= 60) snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
  else snprintf(buf, n, "%lds", t);
}

void ds_progress_line(FILE *f, const char *label, int64_t done, int64_t total, int64_t done_here, double elapsed,
                      double rate, const char *unit, const char *extra) {
  char eta[32], el[32];
  double remaining = done_here > 0 ? elapsed / (double)done_here * (double)(total - done) : -1;
  ds_format_duration(remaining, eta, sizeof eta);
  ds_format_duration(elapsed, el, sizeof el);
  int tty = isatty(fileno(f));
  fprintf(f, "%s%s %lld/%lld%s%s | %.1f %s | elapsed %s ETA %s%s", tty ? "\r\033[K" : "", label, (long long)done,
          (long long)total, extra && *extra ? " " : "", extra ? extra : "", rate, unit, el, eta, tty ? "" : "\n");
  g_open_line = tty ? f : NULL;
  if (tty && done == total) ds_progress_break(f);
  fflush(f);
}

void ds_progress_break(FILE *f) {
  if (g_open_line != f) return;
  fputc('\n', f);
  fflush(f);
  g_open_line = NULL;
}

void ds_note(const char *fmt, ...) {
  ds_progress_break(stderr);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  fflush(stderr);
}
