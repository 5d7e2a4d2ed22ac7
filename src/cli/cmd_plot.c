/* dspark plot PATH... [--out DIR]: draws figures with gnuplot from what runs leave behind.
 *   a run directory (metrics.jsonl of train / pretrain / distill): one PNG per metric, train
 *     and held-out curves, into RUN/plots/ (or --out);
 *   a speculation report (`dspark speculate --report FILE.json`): acceptance by position,
 *     tokens per round and calibration figures in a plots/ folder beside it (or in --out);
 *   a folder (such as the demo's): every run directory and every report directly inside it. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/plot.h"
#include "dspark/fileio.h"

static void plot_usage(FILE *f) {
  fprintf(f,
          "usage: dspark plot PATH... [--out DIR]\n"
          "  PATH  a run directory (its metrics.jsonl: loss, held-out loss, acceptance, tau, perplexity,\n"
          "        learning rate, ... per step), a `dspark speculate --report` JSON (acceptance by\n"
          "        position, tokens per round, calibration), or a folder holding runs and reports\n"
          "  --out DIR  where the figures go (default: RUN/plots, or plots/ beside a report); each figure's data\n"
          "             (.dat) and gnuplot script (.gp) are written beside its PNG, to redraw or restyle it\n");
}

static int is_dir(const char *p) {
  struct stat s;
  return stat(p, &s) == 0 && S_ISDIR(s.st_mode);
}

static int has_metrics(const char *dir) {
  char *m = ds_path_join(dir, "metrics.jsonl");
  int ok = m && ds_file_exists(m);
  free(m);
  return ok;
}

/* out: --out (with the run's name below it when several runs are drawn) or RUN/plots. */
static int plot_run_dir(const char *run, const char *out, const plot_inputs *in, int many) {
  char *dst = out ? (many ? ds_path_join(out, strrchr(run, '/') ? strrchr(run, '/') + 1 : run) : strdup(out))
                  : ds_path_join(run, "plots");
  if (!dst) return cli_report_error("plot");
  int n = 0;
  ds_status st = plot_metrics(run, dst, in, &n);
  if (st == DS_OK) fprintf(stderr, "plot: %s: %d figure%s in %s\n", run, n, n == 1 ? "" : "s", dst);
  free(dst);
  return st == DS_OK ? 0 : cli_report_error("plot");
}

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !strcmp(s + n - m, suffix);
}

/* A report's figures (with their .dat and .gp) go into a plots/ folder beside it, as a run's
 * into RUN/plots, unless --out says otherwise: nothing loose among the user's files. skipped
 * (NULL: not allowed): a JSON that is not a report is passed over (in a folder) rather than an
 * error, and counted. */
static int plot_report_file(const char *path, const char *out, const plot_inputs *in, int *skipped) {
  char *dir = NULL;
  if (out) dir = strdup(out);
  else {
    const char *slash = strrchr(path, '/');
    char *parent = slash ? strndup(path, (size_t)(slash - path) + (slash == path)) : strdup(".");
    dir = parent ? ds_path_join(parent, "plots") : NULL;
    free(parent);
  }
  if (!dir) return cli_report_error("plot");
  int n = 0;
  ds_status st = plot_report(path, dir, in, &n);
  if (st == DS_OK) fprintf(stderr, "plot: %s: %d figure%s in %s\n", path, n, n == 1 ? "" : "s", dir);
  free(dir);
  if (st == DS_ERR_NOT_FOUND && skipped) {
    (*skipped)++;
    return 0;
  }
  return st == DS_OK ? 0 : cli_report_error("plot");
}

/* The run directories and reports directly inside dir, sorted by name. */
static int plot_folder(const char *dir, const char *out, const plot_inputs *in) {
  struct dirent **names = NULL;
  int n = scandir(dir, &names, NULL, alphasort), found = 0, skipped = 0, rc = 0;
  if (n < 0) {
    fprintf(stderr, "dspark plot: %s: cannot list the folder\n", dir);
    return 1;
  }
  for (int i = 0; i < n; i++) {
    if (rc == 0 && names[i]->d_name[0] != '.') {
      char *sub = ds_path_join(dir, names[i]->d_name);
      if (!sub) rc = cli_report_error("plot");
      else if (is_dir(sub) && has_metrics(sub)) {
        found++;
        rc = plot_run_dir(sub, out, in, 1);
      } else if (!is_dir(sub) && ends_with(sub, ".json")) {
        int before = skipped;
        rc = plot_report_file(sub, out, in, &skipped);
        found += skipped == before;
      }
      free(sub);
    }
    free(names[i]);
  }
  free(names);
  if (rc == 0 && !found) {
    fprintf(stderr, "dspark plot: %s: nothing to draw: not a run directory (no metrics.jsonl in it), and no run directory "
            "(a folder with a metrics.jsonl) or speculation report (a `dspark speculate --report` .json) inside it", dir);
    if (skipped) fprintf(stderr, " (%d .json file%s that %s not such a report)", skipped, skipped == 1 ? "" : "s",
                         skipped == 1 ? "is" : "are");
    fprintf(stderr, "\n");
    return 1;
  }
  return rc;
}

int cmd_plot(int argc, char **argv) {
  const char *out = NULL;
  int n_paths = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (cli_is_help(a)) {
      plot_usage(stdout);
      return 0;
    } else if (!strcmp(a, "--out")) {
      if (!(out = cli_value(argc, argv, &i))) return 2;
    } else if (a[0] == '-' && a[1]) {
      fprintf(stderr, "dspark plot: unknown option %s\n", a);
      plot_usage(stderr);
      return 2;
    } else {
      n_paths++;
    }
  }
  if (!n_paths) {
    plot_usage(stderr);
    return 2;
  }
  /* The files given are inputs (a report, a metrics file): no figure or data file may replace
   * one. A run directory is not one: its figures go inside it by default. */
  ds_input_path *files = calloc((size_t)n_paths, sizeof *files);
  if (!files) return cli_report_error("plot");
  plot_inputs in = {files, 0, out ? "--out" : NULL};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--out")) i++;
    else if (!is_dir(argv[i])) files[in.n++] = (ds_input_path){"PATH", argv[i]};
  }
  int refused = out ? cli_output_refused("plot", "--out", out, DS_OUTPUT_DIR, NULL, 0) : 0;
  if (refused) {
    free(files);
    return refused;
  }
  int rc = 0;
  for (int i = 1; i < argc && rc == 0; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--out")) {
      i++;
      continue;
    }
    if (!is_dir(a)) {
      rc = plot_report_file(a, out, &in, NULL);
    } else {
      rc = has_metrics(a) ? plot_run_dir(a, out, &in, n_paths > 1) : plot_folder(a, out, &in);
    }
  }
  free(files);
  return rc;
}
