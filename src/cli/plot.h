/* Plots drawn by gnuplot (Debian's gnuplot-nox, installed by scripts/setup.sh): the program
 * writes the data (.dat) and the script (.gp) next to the PNG, so a user can redraw or restyle
 * a figure without rerunning anything, and gnuplot renders it. */
#ifndef DSPARK_CLI_PLOT_H
#define DSPARK_CLI_PLOT_H

#include <stdio.h>

#include "dspark/common.h"
#include "dspark/fileio.h"

/* The files a plot reads (reports, metrics): no data, script or figure file may replace one.
 * option names where the figures go ("--out"; NULL: the default place). */
typedef struct {
  const ds_input_path *files;
  size_t n;
  const char *option;
} plot_inputs;

/* Opens DIR/NAME for writing (a .dat or .gp file); NULL with an error recorded, also when
 * DIR/NAME, or the figure NAME.png that its script draws, is one of the inputs. */
FILE *plot_open(const char *dir, const char *name, const plot_inputs *in);
/* Closes f, checking the writes: DS_OK or an error naming DIR/NAME. */
ds_status plot_close(FILE *f, const char *dir, const char *name);
/* Runs `gnuplot SCRIPT` with DIR as the working directory; DS_OK, or an error
 * recorded (gnuplot missing names the set-up script; its own failure its exit status). */
ds_status plot_run(const char *dir, const char *script);
/* Writes s as a gnuplot single-quoted string: quotes doubled, control characters written as
 * visible escapes (\n, \r, \t, \xHH) so that no string can end the command it sits in. Every
 * string a script holds (titles, labels, file names) goes through it. */
void plot_quote(FILE *f, const char *s);
/* plot_quote of a printf-formatted string (at most 1023 bytes). */
void plot_quotef(FILE *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The training curves of a run directory (metrics.jsonl): one PNG per metric into out_dir. */
ds_status plot_metrics(const char *run_dir, const char *out_dir, const plot_inputs *in, int *n_png);
/* The figures of a `dspark speculate --report` JSON into out_dir, named after the report
 * (REPORT-acceptance.png, REPORT-tokens-per-round.png, REPORT-calibration.png when it has a
 * calibration). A JSON that is not such a report: DS_ERR_NOT_FOUND. */
ds_status plot_report(const char *json_path, const char *out_dir, const plot_inputs *in, int *n_png);

#endif
