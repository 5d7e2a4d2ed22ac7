/* dspark plot PATH... [--out DIR]: draws figures with gnuplot from what runs leave behind.
 *   a run directory (metrics.jsonl of train / pretrain / distill): one PNG per metric, train
 *     and held-out curves, into RUN/plots/ (or --out);
 *   a folder of runs (such as the demo's): every run directory directly inside it. */
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
          "        learning rate, ... per step) or a folder holding run directories\n"
          "  --out DIR  where the figures go (default: RUN/plots); each figure's data (.dat) and\n"
          "             gnuplot script (.gp) are written beside its PNG, to redraw or restyle it\n");
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
static int plot_run_dir(const char *run, const char *out, int many) {
  char *dst = out ? (many ? ds_path_join(out, strrchr(run, '/') ? strrchr(run, '/') + 1 : run) : strdup(out))
                  : ds_path_join(run, "plots");
  if (!dst) return cli_report_error("plot");
  int n = 0;
  ds_status st = plot_metrics(run, dst, &n);
  if (st == DS_OK) fprintf(stderr, "plot: %s: %d figure%s in %s\n", run, n, n == 1 ? "" : "s", dst);
  free(dst);
  return st == DS_OK ? 0 : cli_report_error("plot");
}

/* The run directories directly inside dir, sorted by name. */
static int plot_folder(const char *dir, const char *out) {
  struct dirent **names = NULL;
  int n = scandir(dir, &names, NULL, alphasort), found = 0, rc = 0;
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
        rc = plot_run_dir(sub, out, 1);
      }
      free(sub);
    }
    free(names[i]);
  }
  free(names);
  if (rc == 0 && !found) {
    fprintf(stderr, "dspark plot: %s: neither a run directory (no metrics.jsonl) nor a folder of runs\n", dir);
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
  int rc = 0;
  for (int i = 1; i < argc && rc == 0; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--out")) {
      i++;
      continue;
    }
    if (!is_dir(a)) {
      fprintf(stderr, "dspark plot: %s: not a directory\n", a);
      rc = 1;
    } else {
      rc = has_metrics(a) ? plot_run_dir(a, out, n_paths > 1) : plot_folder(a, out);
    }
  }
  return rc;
}
