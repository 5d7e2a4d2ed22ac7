/* Progress and resource reporting shared by the long-running commands.
 *
 * On a terminal the progress line is rewritten in place (no newline); any other message must
 * end it first, or the message is glued onto it: print such messages with ds_note (or call
 * ds_progress_break before writing to stderr yourself). Off a terminal every progress call
 * prints one whole line. */
#ifndef DSPARK_PROGRESS_H
#define DSPARK_PROGRESS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Peak resident memory of this process (VmHWM), MiB; 0 if unknown. */
double ds_peak_rss_mib(void);
/* "42s", "3m05s", "2h10m"; "?" for a negative or absurd value. */
void ds_format_duration(double seconds, char *buf, size_t n);
/* "LABEL DONE/TOTAL EXTRA | RATE UNIT | elapsed 1m02s ETA 4m10s". The ETA extrapolates this
 * process's pace: elapsed / done_here * (total - done) (done_here: units done since this
 * process started, so a resumed run is not credited with the earlier process's work). */
void ds_progress_line(FILE *f, const char *label, int64_t done, int64_t total, int64_t done_here, double elapsed,
                      double rate, const char *unit, const char *extra);
/* Ends an open progress line on f (a newline) so that the next message starts a line. */
void ds_progress_break(FILE *f);
/* A message on stderr, on a line of its own. */
void ds_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
