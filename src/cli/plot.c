/* gnuplot driver and the training curves of a run (metrics.jsonl, written by the trainer core:
 * one JSON object per line, "kind" train or eval, "step", then the objective's metrics). */
#include "cli/plot.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/json_util.h"
#include "dspark/fileio.h"

FILE *plot_open(const char *dir, const char *name, const plot_inputs *in) {
  char *path = ds_path_join(dir, name);
  if (!path) { DS_FAIL(DS_ERR_NOMEM, "out of memory"); return NULL; }
  /* the figure: NAME with .png for the script's .gp */
  size_t n = strlen(path);
  char *png = n > 3 && !strcmp(path + n - 3, ".gp") ? malloc(n + 2) : NULL;
  if (png) snprintf(png, n + 2, "%.*s.png", (int)(n - 3), path);
  if (ds_output_check(in->option, path, DS_OUTPUT_FILE, in->files, in->n) != DS_OK ||
      (png && ds_output_check(in->option, png, DS_OUTPUT_FILE, in->files, in->n) != DS_OK)) {
    free(png);
    free(path);
    return NULL;
  }
  free(png);
  FILE *f = fopen(path, "w");
  if (!f) DS_FAIL(DS_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
  free(path);
  return f;
}

ds_status plot_close(FILE *f, const char *dir, const char *name) {
  int bad = ferror(f) != 0;
  bad |= fclose(f) != 0;
  if (bad) return DS_FAIL(DS_ERR_IO, "%s/%s: write failed", dir, name);
  return DS_OK;
}

/* s with its control characters written as visible escapes; in_quotes: quotes doubled too. */
static void write_escaped(FILE *f, const char *s, int in_quotes) {
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p < 0x20 || *p == 0x7f) {
      if (*p == '\n') fputs("\\n", f);
      else if (*p == '\r') fputs("\\r", f);
      else if (*p == '\t') fputs("\\t", f);
      else fprintf(f, "\\x%02x", *p);
      continue;
    }
    if (in_quotes && *p == '\'') fputc('\'', f);
    fputc(*p, f);
  }
}

/* A newline (or a carriage return) inside a string would end the command and run the rest as
 * gnuplot commands: control characters become visible escapes, which a single-quoted string
 * keeps as they are (it expands neither backslashes nor backquotes). */
void plot_quote(FILE *f, const char *s) {
  fputc('\'', f);
  write_escaped(f, s, 1);
  fputc('\'', f);
}

void plot_quotef(FILE *f, const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  plot_quote(f, buf);
}

ds_status plot_run(const char *dir, const char *script) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) return DS_FAIL(DS_ERR_IO, "cannot start gnuplot: %s", strerror(errno));
  if (pid == 0) {
    /* The scripts name their files relative to the figure folder. */
    if (chdir(dir) != 0) _exit(126);
    /* "./NAME": a script named after a report that begins with '-' is not read as an option */
    char arg[4096];
    if (snprintf(arg, sizeof arg, "./%s", script) >= (int)sizeof arg) _exit(126);
    execlp("gnuplot", "gnuplot", arg, (char *)NULL);
    _exit(errno == ENOENT ? 127 : 126);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return DS_FAIL(DS_ERR_IO, "waiting for gnuplot: %s", strerror(errno));
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
    return DS_FAIL(DS_ERR_UNSUPPORTED, "gnuplot is not installed: run scripts/setup.sh (Debian package gnuplot-nox)");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return DS_FAIL(DS_ERR_IO, "gnuplot failed on %s/%s (exit status %d)", dir, script,
                   WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  return DS_OK;
}

/* ---- training curves ---- */

/* Bookkeeping fields that are not curves. */
static int is_curve(const char *key) {
  static const char *const skip[] = {"kind", "step", "elapsed_s", "tokens", "skipped_steps"};
  for (size_t i = 0; i < sizeof skip / sizeof *skip; i++)
    if (!strcmp(key, skip[i])) return 0;
  return 1;
}

static ds_status add_point(plot_curves *c, const char *name, double step, double value, int is_eval) {
  int k = 0;
  while (k < c->n && strcmp(c->m[k].name, name)) k++;
  if (k == c->n) {
    if (c->n == PLOT_MAX_METRICS) return DS_OK; /* more metrics than a reader looks at */
    if (!(c->m[k].name = strdup(name))) return DS_FAIL(DS_ERR_NOMEM, "out of memory");
    c->n++;
  }
  plot_curve *s = &c->m[k];
  if (s->n == s->cap) {
    int cap = s->cap ? 2 * s->cap : 256;
    double *st = realloc(s->step, (size_t)cap * sizeof *st);
    if (st) s->step = st;
    double *va = realloc(s->value, (size_t)cap * sizeof *va);
    if (va) s->value = va;
    unsigned char *ev = realloc(s->is_eval, (size_t)cap);
    if (ev) s->is_eval = ev;
    if (!st || !va || !ev) return DS_FAIL(DS_ERR_NOMEM, "out of memory");
    s->cap = cap;
  }
  s->step[s->n] = step;
  s->value[s->n] = value;
  s->is_eval[s->n] = (unsigned char)is_eval;
  s->n++;
  return DS_OK;
}

static ds_status add_vector(plot_curves *c, const char *name, const cJSON *arr, double step) {
  int len = cJSON_GetArraySize(arr);
  if (len <= 0) return DS_OK;
  double *v = malloc((size_t)len * sizeof *v);
  if (!v) return DS_FAIL(DS_ERR_NOMEM, "out of memory");
  for (int i = 0; i < len; i++) {
    const cJSON *e = cJSON_GetArrayItem(arr, i);
    v[i] = cJSON_IsNumber(e) ? e->valuedouble : NAN;
  }
  if (c->n_vec == PLOT_MAX_VECTORS) { /* keep the latest: drop the oldest */
    free(c->vec[0]);
    memmove(c->vec, c->vec + 1, (PLOT_MAX_VECTORS - 1) * sizeof *c->vec);
    memmove(c->vec_len, c->vec_len + 1, (PLOT_MAX_VECTORS - 1) * sizeof *c->vec_len);
    memmove(c->vec_step, c->vec_step + 1, (PLOT_MAX_VECTORS - 1) * sizeof *c->vec_step);
    c->n_vec--;
  }
  snprintf(c->vec_name, sizeof c->vec_name, "%s", name);
  c->vec[c->n_vec] = v;
  c->vec_len[c->n_vec] = len;
  c->vec_step[c->n_vec] = step;
  c->n_vec++;
  return DS_OK;
}

void plot_curves_free(plot_curves *c) {
  for (int k = 0; k < c->n; k++) {
    free(c->m[k].name);
    free(c->m[k].step);
    free(c->m[k].value);
    free(c->m[k].is_eval);
  }
  for (int k = 0; k < c->n_vec; k++) free(c->vec[k]);
}

/* One record; a line that is not a JSON object is an error naming the line, except the last
 * one, which a run still writing may have torn. */
static ds_status read_record(plot_curves *c, const char *path, const char *line, size_t len, int line_no, int last) {
  char label[64];
  snprintf(label, sizeof label, "line %d", line_no);
  ds_status st;
  cJSON *j = ds_json_parse(line, len, label, &st);
  if (!j) {
    if (last) return DS_OK;
    return ds_error_wrap(st, "%s", path);
  }
  const cJSON *kind = cJSON_GetObjectItemCaseSensitive(j, "kind"), *step = cJSON_GetObjectItemCaseSensitive(j, "step");
  st = DS_OK;
  if (cJSON_IsString(kind) && cJSON_IsNumber(step)) {
    int is_eval = !strcmp(kind->valuestring, "eval");
    for (const cJSON *e = j->child; e && st == DS_OK; e = e->next) {
      if (!e->string || !is_curve(e->string)) continue;
      if (cJSON_IsNumber(e) && isfinite(e->valuedouble))
        st = add_point(c, e->string, step->valuedouble, e->valuedouble, is_eval);
      else if (cJSON_IsArray(e) && is_eval)
        st = add_vector(c, e->string, e, step->valuedouble);
    }
  }
  cJSON_Delete(j);
  return st;
}

/* A name safe as a file name: letters, digits, '_' and '-'. */
static void file_stem(const char *name, char *out, size_t cap) {
  size_t i = 0;
  for (; name[i] && i + 1 < cap; i++) {
    char ch = name[i];
    out[i] = ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-') ? ch : '_';
  }
  out[i] = 0;
}

static const char *base_name(const char *path) {
  size_t n = strlen(path);
  while (n > 1 && path[n - 1] == '/') n--;
  const char *b = path + n;
  while (b > path && b[-1] != '/') b--;
  return b;
}

/* Prints the run's name (the path's last component, without trailing slashes) quoted. */
static void quote_run_name(FILE *f, const char *run_dir, const char *what) {
  const char *b = base_name(run_dir);
  size_t n = strcspn(b, "/");
  char buf[256];
  snprintf(buf, sizeof buf, "%.*s: %s", (int)(n < 200 ? n : 200), b, what);
  plot_quote(f, buf);
}

static ds_status plot_series(const plot_curve *s, const char *stem, const char *run_dir, const char *out_dir,
                             const plot_inputs *in) {
  char dat[80], gp[80];
  snprintf(dat, sizeof dat, "%s.dat", stem);
  snprintf(gp, sizeof gp, "%s.gp", stem);
  int n_train = 0, n_eval = 0;
  FILE *f = plot_open(out_dir, dat, in);
  if (!f) return DS_ERR_IO;
  for (int i = 0; i < s->n; i++) {
    n_eval += s->is_eval[i];
    n_train += !s->is_eval[i];
  }
  /* Only blocks that hold points: gnuplot does not count an empty leading block. */
  fprintf(f, "# ");
  write_escaped(f, s->name, 0); /* a newline would start a data line or split the blocks */
  fprintf(f, ": step value; %s\n",
          n_train && n_eval ? "block 0 training steps, block 1 evaluations" : n_eval ? "evaluations" : "training steps");
  for (int pass = 0, blocks = 0; pass < 2; pass++) {
    if (!(pass ? n_eval : n_train)) continue;
    if (blocks++) fprintf(f, "\n\n");
    for (int i = 0; i < s->n; i++)
      if (s->is_eval[i] == pass) fprintf(f, "%.17g %.9g\n", s->step[i], s->value[i]);
  }
  DS_TRY(plot_close(f, out_dir, dat));
  if (!(f = plot_open(out_dir, gp, in))) return DS_ERR_IO;
  fprintf(f, "set terminal pngcairo size 800,480 noenhanced font ',10'\nset output ");
  plot_quotef(f, "%s.png", stem);
  fprintf(f, "\nset title ");
  quote_run_name(f, run_dir, s->name);
  fprintf(f, "\nset xlabel 'step'\nset ylabel ");
  plot_quote(f, stem);
  fprintf(f, "\nset grid\nset key top right\n");
  int positive = 1;
  for (int i = 0; i < s->n; i++) positive &= s->value[i] > 0;
  if (positive && (!strcmp(s->name, "ppl") || !strcmp(s->name, "lr"))) fprintf(f, "set logscale y\n");
  fprintf(f, "plot ");
  if (n_train) {
    plot_quote(f, dat);
    fprintf(f, " index 0 using 1:2 with %s lw 1.5 lc rgb '#1f77b4' title 'train'%s",
            n_train > 1 ? "lines" : "points pt 7", n_eval ? ", \\\n     " : "");
  }
  if (n_eval) {
    plot_quote(f, dat);
    fprintf(f, " index %d using 1:2 with linespoints pt 7 ps 0.8 lw 2 lc rgb '#d62728' title 'held-out'", n_train ? 1 : 0);
  }
  fprintf(f, "\n");
  DS_TRY(plot_close(f, out_dir, gp));
  return plot_run(out_dir, gp);
}

static ds_status plot_vectors(const plot_curves *c, const char *stem, const char *run_dir, const char *out_dir,
                              const plot_inputs *in) {
  char dat[80], gp[80];
  snprintf(dat, sizeof dat, "%s.dat", stem);
  snprintf(gp, sizeof gp, "%s.gp", stem);
  FILE *f = plot_open(out_dir, dat, in);
  if (!f) return DS_ERR_IO;
  fprintf(f, "# ");
  write_escaped(f, c->vec_name, 0);
  fprintf(f, " at the last evaluations: position value; one block per evaluation step\n");
  for (int k = 0; k < c->n_vec; k++) {
    if (k) fprintf(f, "\n\n");
    for (int i = 0; i < c->vec_len[k]; i++) fprintf(f, "%d %.9g\n", i + 1, c->vec[k][i]);
  }
  DS_TRY(plot_close(f, out_dir, dat));
  if (!(f = plot_open(out_dir, gp, in))) return DS_ERR_IO;
  fprintf(f, "set terminal pngcairo size 800,480 noenhanced font ',10'\nset output ");
  plot_quotef(f, "%s.png", stem);
  fprintf(f, "\nset title ");
  quote_run_name(f, run_dir, c->vec_name);
  fprintf(f, "\nset xlabel 'position in the block'\nset ylabel ");
  plot_quote(f, stem);
  fprintf(f, "\nset grid\nset yrange [0:*]\nset xtics 1\nset key top right\nplot ");
  for (int k = 0; k < c->n_vec; k++) {
    fprintf(f, "%s", k ? ", \\\n     " : "");
    plot_quote(f, dat);
    fprintf(f, " index %d using 1:2 with linespoints pt 7 lw %s title ", k, k == c->n_vec - 1 ? "2.5" : "1");
    plot_quotef(f, "step %.17g", c->vec_step[k]);
  }
  fprintf(f, "\n");
  DS_TRY(plot_close(f, out_dir, gp));
  return plot_run(out_dir, gp);
}

ds_status plot_metrics_parse(const char *path, const char *text, size_t len, plot_curves *c) {
  memset(c, 0, sizeof *c);
  ds_status st = DS_OK;
  int line_no = 0;
  for (size_t at = 0; st == DS_OK && at < len;) {
    const char *nl = memchr(text + at, '\n', len - at);
    size_t end = nl ? (size_t)(nl - text) : len;
    line_no++;
    if (end > at) st = read_record(c, path, text + at, end - at, line_no, !nl || end + 1 >= len);
    at = end + 1;
  }
  if (st == DS_OK && c->n == 0) st = DS_FAIL(DS_ERR_FORMAT, "%s: no metrics records to plot", path);
  return st;
}

ds_status plot_metrics(const char *run_dir, const char *out_dir, const plot_inputs *in, int *n_png) {
  *n_png = 0;
  char *path = ds_path_join(run_dir, "metrics.jsonl");
  if (!path) return DS_FAIL(DS_ERR_NOMEM, "out of memory");
  char *buf = NULL;
  size_t len = 0;
  plot_curves c;
  memset(&c, 0, sizeof c);
  ds_status st = ds_read_file(path, &buf, &len);
  if (st == DS_OK) st = plot_metrics_parse(path, buf, len, &c);
  if (st == DS_OK && (st = ds_mkdir_p(out_dir)) != DS_OK && in->option) ds_error_wrap(st, "%s", in->option);
  /* the file names: keys that differ only in characters a name cannot hold get a suffix */
  char stems[PLOT_MAX_METRICS + 1][64];
  for (int k = 0; k <= c.n; k++) {
    file_stem(k < c.n ? c.m[k].name : c.vec_name, stems[k], sizeof stems[k] - 8);
    for (int e = 0; e < k; e++)
      if (!strcmp(stems[e], stems[k])) {
        snprintf(stems[k] + strlen(stems[k]), 8, "-%d", (k + 1) % 1000);
        break;
      }
  }
  for (int k = 0; st == DS_OK && k < c.n; k++) {
    st = plot_series(&c.m[k], stems[k], run_dir, out_dir, in);
    if (st == DS_OK) (*n_png)++;
  }
  if (st == DS_OK && c.n_vec) {
    st = plot_vectors(&c, stems[c.n], run_dir, out_dir, in);
    if (st == DS_OK) (*n_png)++;
  }
  plot_curves_free(&c);
  free(buf);
  free(path);
  return st;
}
