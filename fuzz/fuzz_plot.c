/* libFuzzer target for what `dspark plot` reads (src/cli/plot.h): each input is read as a run's
 * metrics.jsonl (plot_metrics_parse) and as a `speculate --report` JSON (plot_report_parse, then
 * plot_columns writes its arrays as plot_report's figures' data, into memory). Only the reading:
 * nothing is drawn, gnuplot never runs and no file is written. The strings of the file that
 * reach a gnuplot script (metric names, the report's policy) are quoted as the scripts quote
 * them. Findings: a crash or undefined behaviour; accepted curves that break the reader's
 * promises (1 .. PLOT_MAX_METRICS curves of distinct metric names, none a bookkeeping field,
 * each with points of finite values; at most PLOT_MAX_VECTORS vectors, none empty); a report
 * accepted without its arrays and tau, or refused with a tree; data rows other than the longest
 * array's, or of another width; a quoted string that could end its gnuplot command. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/plot.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* plot_quote(s) is one gnuplot single-quoted string: no control character, quotes doubled. */
static void check_quoted(const char *s) {
  char *q = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&q, &n);
  if (!f) return; /* out of memory */
  plot_quote(f, s);
  if (fclose(f)) return;
  if (n < 2 || q[0] != '\'' || q[n - 1] != '\'') __builtin_trap();
  for (size_t i = 1; i + 1 < n; i++) {
    unsigned char ch = (unsigned char)q[i];
    if (ch < 0x20 || ch == 0x7f) __builtin_trap();
    if (ch == '\'') {
      if (i + 2 >= n || q[i + 1] != '\'') __builtin_trap();
      i++;
    }
  }
  free(q);
}

static void read_metrics(const uint8_t *data, size_t size) {
  static const char *const bookkeeping[] = {"kind", "step", "elapsed_s", "tokens", "skipped_steps"};
  plot_curves c;
  if (plot_metrics_parse("fuzz/metrics.jsonl", (const char *)data, size, &c) == DS_OK) {
    if (c.n < 1 || c.n > PLOT_MAX_METRICS || c.n_vec < 0 || c.n_vec > PLOT_MAX_VECTORS) __builtin_trap();
    for (int k = 0; k < c.n; k++) {
      const plot_curve *s = &c.m[k];
      if (!s->name) __builtin_trap();
      for (int e = 0; e < k; e++)
        if (!strcmp(c.m[e].name, s->name)) __builtin_trap(); /* one curve per metric */
      for (size_t b = 0; b < sizeof bookkeeping / sizeof *bookkeeping; b++)
        if (!strcmp(s->name, bookkeeping[b])) __builtin_trap();
      if (s->n < 1 || s->n > s->cap || !s->step || !s->value || !s->is_eval) __builtin_trap();
      for (int i = 0; i < s->n; i++)
        if (!isfinite(s->value[i]) || s->is_eval[i] > 1) __builtin_trap();
      check_quoted(s->name);
    }
    for (int k = 0; k < c.n_vec; k++)
      if (!c.vec[k] || c.vec_len[k] < 1) __builtin_trap();
    if (c.n_vec) check_quoted(c.vec_name);
  }
  plot_curves_free(&c);
}

/* plot_columns: one row per entry of the longest array, each of 1 + n_cols fields. */
static void check_columns(const cJSON *const *cols, int n_cols) {
  int longest = 0;
  for (int i = 0; i < n_cols; i++)
    if (cJSON_IsArray(cols[i]) && cJSON_GetArraySize(cols[i]) > longest) longest = cJSON_GetArraySize(cols[i]);
  char *text = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&text, &n);
  if (!f) return;
  int rows = plot_columns(f, cols, n_cols, 1);
  if (fclose(f)) return;
  if (rows != longest) __builtin_trap();
  int lines = 0, fields = 0;
  for (size_t i = 0; i < n; i++) {
    if (text[i] == '\n' || text[i] == ' ') fields++;
    if (text[i] == '\n') {
      if (fields != 1 + n_cols) __builtin_trap();
      lines++;
      fields = 0;
    }
  }
  if (lines != rows || (n && text[n - 1] != '\n')) __builtin_trap();
  free(text);
}

static const cJSON *field(const cJSON *j, const char *key) { return cJSON_GetObjectItemCaseSensitive(j, key); }

static void read_report(const uint8_t *data, size_t size) {
  cJSON *j = (cJSON *)&j; /* not NULL: the reader must clear it */
  if (plot_report_parse("fuzz/report.json", (const char *)data, size, &j) != DS_OK) {
    if (j) __builtin_trap();
    return;
  }
  if (!j || !cJSON_IsArray(field(j, "accept_conditional")) || !cJSON_IsArray(field(j, "tokens_per_round_histogram")) ||
      !cJSON_IsNumber(field(j, "tau")))
    __builtin_trap();
  /* the figures' data as plot_report writes it */
  const cJSON *acceptance[2] = {field(j, "accept_conditional"), field(j, "accept_unconditional")};
  const cJSON *hist[1] = {field(j, "tokens_per_round_histogram")};
  check_columns(acceptance, 2);
  check_columns(hist, 1);
  const cJSON *cal = field(j, "calibration");
  if (cJSON_IsObject(cal)) {
    const cJSON *ece[3] = {field(cal, "ece_raw"), field(cal, "ece_calibrated"), field(cal, "count")};
    check_columns(ece, 3);
  }
  /* the policy goes into every figure's title */
  const cJSON *policy = field(j, "policy");
  if (cJSON_IsString(policy)) check_quoted(policy->valuestring);
  cJSON_Delete(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  read_metrics(data, size);
  read_report(data, size);
  return 0;
}
