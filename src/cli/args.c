#include "cli/args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "dspark/draft.h"

const char *cli_value(int argc, char **argv, int *i) {
  if (*i + 1 >= argc) {
    fprintf(stderr, "dspark: option %s needs a value\n", argv[*i]);
    return NULL;
  }
  *i += 1;
  return argv[*i];
}

int cli_int(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) {
    fprintf(stderr, "dspark: %s expects an integer in [%lld, %lld], got '%s'\n", opt, (long long)lo, (long long)hi, s);
    return 0;
  }
  *out = v;
  return 1;
}

int cli_float(const char *opt, const char *s, double lo, double hi, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi) {
    fprintf(stderr, "dspark: %s expects a number in [%g, %g], got '%s'\n", opt, lo, hi, s);
    return 0;
  }
  *out = v;
  return 1;
}

int cli_int_list(const char *opt, const char *s, int32_t **out, int64_t *n) {
  *out = NULL;
  *n = 0;
  size_t cap = 1;
  for (const char *p = s; *p; p++) cap += *p == ',';
  int32_t *v = malloc(cap * sizeof *v);
  if (!v) {
    fprintf(stderr, "dspark: out of memory reading %s\n", opt);
    return 0;
  }
  const char *p = s;
  while (*p) {
    char *end;
    errno = 0;
    long x = strtol(p, &end, 10);
    /* every entry is a number: "1,,2" and "1,2," are refused, not read as shorter lists */
    if (errno || end == p || x < INT32_MIN || x > INT32_MAX || (*end && (*end != ',' || !end[1]))) {
      fprintf(stderr, "dspark: %s expects comma-separated integers, got '%s'\n", opt, s);
      free(v);
      return 0;
    }
    v[(*n)++] = (int32_t)x;
    p = *end ? end + 1 : end;
  }
  *out = v;
  return 1;
}

int cli_markov_type(const char *opt, const char *s, ds_markov_type *out) {
  if (ds_markov_type_parse(s, out) == DS_OK) return 1;
  fprintf(stderr, "dspark: %s expects none, vanilla, gated or rnn, got '%s'\n", opt, s);
  return 0;
}

int cli_draft_weights(const char *opt, const char *s, ds_dtype *out) {
  if (ds_draft_weights_parse(s, out)) return 1;
  fprintf(stderr, "dspark: %s expects f32, bf16 or q8_0, got '%s'\n", opt, s);
  return 0;
}

int cli_is_help(const char *arg) { return !strcmp(arg, "-h") || !strcmp(arg, "--help"); }

int cli_layer_ids(const char *opt, const char *s, int32_t *dst, int *n, int max) {
  int32_t *ids;
  int64_t cnt;
  if (!cli_int_list(opt, s, &ids, &cnt)) return 0;
  if (cnt == 0) fprintf(stderr, "dspark: %s needs at least one layer id\n", opt);
  if (cnt < 1 || cnt > max) {
    free(ids);
    if (cnt) fprintf(stderr, "dspark: %s takes 1 to %d layer ids, got %lld\n", opt, max, (long long)cnt);
    return 0;
  }
  memcpy(dst, ids, (size_t)cnt * sizeof *ids);
  *n = (int)cnt;
  free(ids);
  return 1;
}

int cli_max_line_option(int argc, char **argv, int *i, size_t *out) {
  if (strcmp(argv[*i], "--max-line-bytes")) return 0;
  const char *v = cli_value(argc, argv, i);
  if (!v) return -1;
  char *end;
  errno = 0;
  unsigned long long n = strtoull(v, &end, 10);
  int shift = *end == 'K' || *end == 'k' ? 10 : *end == 'M' || *end == 'm' ? 20 : *end == 'G' || *end == 'g' ? 30 : 0;
  if (shift) end++;
  const unsigned long long most = 1ull << 40; /* a terabyte line is a mistake, not data */
  if (errno || end == v || *end || v[0] == '-' || n == 0 || n > most >> shift) {
    fprintf(stderr, "dspark: --max-line-bytes expects a byte count from 1 to 1024G (K, M, G: KiB, MiB, GiB), "
                    "got '%s'\n", v);
    return -1;
  }
  *out = (size_t)(n << shift);
  return 1;
}

int cli_data_format_option(const char *cmd, int argc, char **argv, int *i, ds_data_format *out) {
  if (strcmp(argv[*i], "--data-format")) return 0;
  const char *v = cli_value(argc, argv, i);
  if (!v) return -1;
  if (ds_data_format_parse(v, out)) return 1;
  fprintf(stderr, "dspark %s: --data-format expects auto, text or jsonl, got '%s'\n", cmd, v);
  return -1;
}

int cli_output_refused(const char *cmd, const char *option, const char *path, ds_output_kind kind,
                       const ds_input_path *inputs, size_t n_inputs) {
  ds_status st = ds_output_check(option, path, kind, inputs, n_inputs);
  if (st == DS_OK) return 0;
  cli_report_error(cmd);
  return st == DS_ERR_ARG ? 2 : 1;
}
