/* Progress and resource reporting shared by the long-running commands. */
#ifndef DSPARK_PROGRESS_H
#define DSPARK_PROGRESS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Peak resident memory of this process (VmHWM), MiB; 0 if unknown. */
double ds_peak_rss_mib(void);
/* "42s", "3m05s", "2h10m"; "?" for a negative or absurd value. */
void ds_format_duration(double seconds, char *buf, size_t n);
/* "step 12/100 <extra> | 35.2 tok/s | elapsed 1m02s ETA 4m10s": rewritten in place on a
 * terminal, one line per call otherwise. */
void ds_progress_line(FILE *f, int64_t done, int64_t total, double elapsed, double rate, const char *unit,
                      const char *extra);

#endif
