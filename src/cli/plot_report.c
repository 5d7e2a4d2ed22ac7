/* The figures of a speculative-decoding report (`dspark speculate --report`): acceptance by
 * position (conditional and unconditional), the histogram of tokens committed per round, and
 * the calibration (ECE of the cumulative acceptance per position, before and after STS). */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "cli/plot.h"
#include "core/json_util.h"
#include "dspark/fileio.h"

static const cJSON *field(const cJSON *j, const char *key) { return cJSON_GetObjectItemCaseSensitive(j, key); }

int plot_columns(FILE *f, const cJSON *const *cols, int n_cols, int first) {
  int rows = 0;
  for (int c = 0; c < n_cols; c++)
    if (cJSON_IsArray(cols[c]) && cJSON_GetArraySize(cols[c]) > rows) rows = cJSON_GetArraySize(cols[c]);
  for (int r = 0; r < rows; r++) {
    fprintf(f, "%d", r + first);
    for (int c = 0; c < n_cols; c++) {
      const cJSON *e = cJSON_IsArray(cols[c]) ? cJSON_GetArrayItem(cols[c], r) : NULL;
      if (cJSON_IsNumber(e)) fprintf(f, " %.9g", e->valuedouble);
      else fprintf(f, " ?");
    }
    fprintf(f, "\n");
  }
  return rows;
}

typedef struct {
  const char *out_dir, *stem, *title; /* stem: the report's file name without .json */
  const plot_inputs *in;
} figure_ctx;

/* Writes STEM-NAME.dat with the columns, STEM-NAME.gp with `head` then `plot` and draws it. */
static ds_status draw(const figure_ctx *x, const char *name, const cJSON *const *cols, int n_cols, int first,
                      const char *head, const char *plot, int *n_png) {
  char dat[320], gp[320];
  snprintf(dat, sizeof dat, "%s-%s.dat", x->stem, name);
  snprintf(gp, sizeof gp, "%s-%s.gp", x->stem, name);
  FILE *f = plot_open(x->out_dir, dat, x->in);
  if (!f) return DS_ERR_IO;
  int rows = plot_columns(f, cols, n_cols, first);
  DS_TRY(plot_close(f, x->out_dir, dat));
  if (!rows) return DS_OK; /* nothing to draw (e.g. no calibration in this report) */
  if (!(f = plot_open(x->out_dir, gp, x->in))) return DS_ERR_IO;
  fprintf(f, "set terminal pngcairo size 800,480 noenhanced font ',10'\nset output ");
  char png[320];
  snprintf(png, sizeof png, "%s-%s.png", x->stem, name);
  plot_quote(f, png);
  fprintf(f, "\nset title ");
  char title[400];
  snprintf(title, sizeof title, "%s: %s", x->title, name);
  plot_quote(f, title);
  fprintf(f, "\nset grid\nset key top right\n%s\ndatafile = ", head);
  plot_quote(f, dat);
  fprintf(f, "\n%s\n", plot);
  DS_TRY(plot_close(f, x->out_dir, gp));
  DS_TRY(plot_run(x->out_dir, gp));
  (*n_png)++;
  return DS_OK;
}

ds_status plot_report_parse(const char *json_path, const char *text, size_t len, cJSON **out) {
  ds_status st;
  *out = NULL;
  cJSON *j = ds_json_parse(text, len, json_path, &st);
  if (!j) return st;
  if (!cJSON_IsArray(field(j, "accept_conditional")) || !cJSON_IsArray(field(j, "tokens_per_round_histogram")) ||
      !cJSON_IsNumber(field(j, "tau"))) {
    cJSON_Delete(j);
    return DS_FAIL(DS_ERR_NOT_FOUND, "%s: not a speculative-decoding report (accept_conditional, "
                   "tokens_per_round_histogram or tau missing)", json_path);
  }
  *out = j;
  return DS_OK;
}

ds_status plot_report(const char *json_path, const char *out_dir, const plot_inputs *in, int *n_png) {
  *n_png = 0;
  char *buf = NULL;
  size_t len = 0;
  DS_TRY(ds_read_file(json_path, &buf, &len));
  cJSON *j = NULL;
  ds_status st = plot_report_parse(json_path, buf, len, &j);
  free(buf);
  if (!j) return st;
  const cJSON *cond = field(j, "accept_conditional"), *uncond = field(j, "accept_unconditional");
  const cJSON *hist = field(j, "tokens_per_round_histogram"), *tau = field(j, "tau");
  /* the stem names the figures: report.json -> report-acceptance.png */
  const char *base = strrchr(json_path, '/') ? strrchr(json_path, '/') + 1 : json_path;
  char stem[256], title[300];
  snprintf(stem, sizeof stem, "%.*s", (int)(strlen(base) > 5 && !strcmp(base + strlen(base) - 5, ".json")
                                                ? strlen(base) - 5 : strlen(base)), base);
  const cJSON *policy = field(j, "policy");
  snprintf(title, sizeof title, "%s (%s, tau %.3f)", stem, cJSON_IsString(policy) ? policy->valuestring : "?",
           tau->valuedouble);
  /* The figures' file names: a control character, which no gnuplot string can hold as it is,
   * becomes '_' (the title keeps it, escaped). */
  for (char *p = stem; *p; p++)
    if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '_';
  figure_ctx x = {out_dir, stem, title, in};
  if ((st = ds_mkdir_p(out_dir)) != DS_OK && in->option) ds_error_wrap(st, "%s", in->option);
  if (st == DS_OK) {
    const cJSON *cols[2] = {cond, uncond};
    st = draw(&x, "acceptance", cols, 2, 1,
              "set xlabel 'draft position'\nset ylabel 'acceptance'\nset yrange [0:1.05]\nset xtics 1",
              "plot datafile using 1:2 with linespoints pt 7 lw 2 title 'conditional (given the earlier accepted)', \\\n"
              "     datafile using 1:3 with linespoints pt 5 lw 2 title 'unconditional (per round)'",
              n_png);
  }
  if (st == DS_OK) {
    const cJSON *cols[1] = {hist};
    st = draw(&x, "tokens-per-round", cols, 1, 1,
              "set xlabel 'tokens committed in a round (bonus counted)'\nset ylabel 'rounds'\nset yrange [0:*]\n"
              "set xtics 1\nset style fill solid 0.6\nset boxwidth 0.7",
              "plot datafile using 1:2 with boxes lc rgb '#1f77b4' notitle", n_png);
  }
  const cJSON *cal = field(j, "calibration");
  /* a report whose rounds never drafted a position (the scheduler decoded plainly or by lookup
   * throughout) has no calibration to draw: every bar would be empty, which gnuplot refuses */
  const cJSON *counts = cJSON_IsObject(cal) ? field(cal, "count") : NULL, *c;
  int drafted = !cJSON_IsArray(counts);
  cJSON_ArrayForEach(c, counts) drafted |= cJSON_IsNumber(c) && c->valuedouble > 0;
  if (st == DS_OK && cJSON_IsObject(cal) && !drafted)
    fprintf(stderr, "plot: %s: no round drafted a position with a confidence: no calibration figure\n", x.stem);
  if (st == DS_OK && cJSON_IsObject(cal) && drafted) {
    /* With the rounds per position (a scheduler may never draft the later ones, whose ECE of 0
     * is no measurement), the tics say how many rounds each bar stands on and empty positions
     * get no bar. */
    const cJSON *raw = field(cal, "ece_raw"), *calib = field(cal, "ece_calibrated"), *count = field(cal, "count");
    int after = cJSON_IsArray(calib) && cJSON_GetArraySize(calib) > 0, counted = cJSON_IsArray(count);
    const cJSON *cols[3] = {raw};
    int n_cols = 1;
    if (after) cols[n_cols++] = calib;
    if (counted) cols[n_cols++] = count;
    static const char *const plots[2][2] = {
        {"plot datafile using 2:xtic(1) title 'raw confidence'",
         "plot datafile using ($3 > 0 ? $2 : NaN):xtic(sprintf('%d (%d)', $1, $3)) title 'raw confidence'"},
        {"plot datafile using 2:xtic(1) title 'raw confidence', '' using 3 title 'after STS'",
         "plot datafile using ($4 > 0 ? $2 : NaN):xtic(sprintf('%d (%d)', $1, $4)) title 'raw confidence', \\\n"
         "     '' using ($4 > 0 ? $3 : NaN) title 'after STS'"}};
    char head[320];
    snprintf(head, sizeof head, "set xlabel 'draft position%s'\nset ylabel 'ECE of the cumulative acceptance'\n"
             "set yrange [0:*]\nset xtics 1\nset style data histogram\nset style histogram clustered gap 1\n"
             "set style fill solid 0.7", counted ? " (rounds that drafted it)" : "");
    st = draw(&x, "calibration", cols, n_cols, 1, head, plots[after][counted], n_png);
  }
  cJSON_Delete(j);
  return st;
}
