/* Plots drawn by gnuplot (Debian's gnuplot-nox, installed by scripts/setup.sh): the program
 * writes the data (.dat) and the script (.gp) next to the PNG, so a user can redraw or restyle
 * a figure without rerunning anything, and gnuplot renders it. */
#ifndef DSPARK_CLI_PLOT_H
#define DSPARK_CLI_PLOT_H

#include <cjson/cJSON.h>
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

/* What plot_metrics reads of metrics.jsonl before it draws (apart, so that fuzz/fuzz_plot.c
 * reaches it without gnuplot): one curve per metric, the first PLOT_MAX_METRICS of them (every
 * finite number of a record except its bookkeeping fields: step, tokens, ...), and the
 * per-position vector (accept_per_position) of the last PLOT_MAX_VECTORS evaluations. */
enum { PLOT_MAX_METRICS = 48, PLOT_MAX_VECTORS = 6 };
typedef struct {
  char *name; /* the metric's key, whole: one cut short matched no later record's */
  double *step, *value;
  unsigned char *is_eval;
  int n, cap;
} plot_curve;
typedef struct {
  plot_curve m[PLOT_MAX_METRICS];
  int n;
  char vec_name[64];
  double *vec[PLOT_MAX_VECTORS];
  int vec_len[PLOT_MAX_VECTORS], n_vec;
  double vec_step[PLOT_MAX_VECTORS]; /* as the record has it: a step past 2^31 was no int */
} plot_curves;
/* Reads the records of text[0..len) (path names the file in errors) into *c: one JSON value a
 * line, records (a "kind" string and a "step" number) read and anything else passed over; a line
 * that is no JSON is an error naming it, except the last, which a run still writing may have
 * torn; no curve at all is an error too. Free *c with plot_curves_free, also after an error. */
ds_status plot_metrics_parse(const char *path, const char *text, size_t len, plot_curves *c);
void plot_curves_free(plot_curves *c);

/* What plot_report reads before it draws: text[0..len) as a report, its JSON tree in *out (free
 * it with cJSON_Delete); one without the arrays "accept_conditional" and
 * "tokens_per_round_histogram" and the number "tau": DS_ERR_NOT_FOUND, *out NULL. */
ds_status plot_report_parse(const char *json_path, const char *text, size_t len, cJSON **out);
/* Writes a figure's data: one row per index of the longest array of cols (numbered from
 * `first`), then each column's number, or "?" (gnuplot's missing value) where that array, or
 * column, has none. Returns the row count. */
int plot_columns(FILE *f, const cJSON *const *cols, int n_cols, int first);

#endif
