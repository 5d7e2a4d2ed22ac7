#include "dspark/progress.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

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

void ds_progress_line(FILE *f, int64_t done, int64_t total, double elapsed, double rate, const char *unit,
                      const char *extra) {
  char eta[32], el[32];
  double remaining = done > 0 ? elapsed / (double)done * (double)(total - done) : -1;
  ds_format_duration(remaining, eta, sizeof eta);
  ds_format_duration(elapsed, el, sizeof el);
  int tty = isatty(fileno(f));
  fprintf(f, "%sstep %lld/%lld %s | %.1f %s | elapsed %s ETA %s%s", tty ? "\r\033[K" : "", (long long)done,
          (long long)total, extra, rate, unit, el, eta, tty ? "" : "\n");
  if (tty && done == total) fputc('\n', f);
  fflush(f);
}
