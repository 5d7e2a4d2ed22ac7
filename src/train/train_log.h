/* Progress and resource reporting shared by the long-running commands. */
#ifndef DSPARK_TRAIN_LOG_H
#define DSPARK_TRAIN_LOG_H

#include <stdint.h>
#include <stdio.h>

/* Peak resident memory of this process (VmHWM), MiB; 0 if unknown. */
double ds_peak_rss_mib(void);
/* "step 12/100 <extra> | 35.2 tok/s | elapsed 1m02s ETA 4m10s": rewritten in place on a
 * terminal, one line per call otherwise. */
void ds_progress_line(FILE *f, int64_t done, int64_t total, double elapsed, double rate, const char *unit,
                      const char *extra);

#endif
