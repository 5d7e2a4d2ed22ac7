/* The files and records shared by `speculate`, `calibrate` and `profile`: the rounds a decode
 * reports (confidences and acceptance, for calibration and its ECE), the calibration JSON
 * (STS temperatures) and the profile JSON (verification and draft costs). */
#ifndef DSPARK_CLI_SPEC_IO_H
#define DSPARK_CLI_SPEC_IO_H

#include <cjson/cJSON.h>

#include "dspark/spec_schedule.h"

/* Rounds collected through ds_spec_options.on_round (K = the draft's block size). */
typedef struct {
  float *z;        /* [cap, K] */
  int64_t *n_prop, *n_acc;
  int *request;    /* request of the round, offset by request_base */
  int64_t n, cap, K;
  int request_base;
  int failed;      /* out of memory: rounds were lost */
} cli_rounds;
void cli_rounds_init(cli_rounds *r, int64_t K);
/* The on_round callback (user = a cli_rounds). */
void cli_rounds_add(void *user, int request, const float *conf, int64_t n_conf, int64_t n_prop, int64_t n_acc);
void cli_rounds_free(cli_rounds *r);
/* A view of the rounds for the ECE / STS functions (use may be NULL: every round). */
ds_round_set cli_rounds_set(const cli_rounds *r, const uint8_t *use);

/* Per position k < K: the cumulative ECE with T (NULL: raw) as a JSON array. */
cJSON *cli_ece_array(const ds_round_set *s, const double *T);
/* Rounds counted per position. */
cJSON *cli_ece_counts(const ds_round_set *s);

/* Reads "temperatures" (every one finite and > 0) of a `dspark calibrate` file; T malloc'd. */
ds_status cli_read_calibration(const char *path, double **T, int64_t *n);
/* Reads "verify_seconds" (required, B = 1 .. n_verify) and "draft_block_seconds" (optional:
 * *n_draft = 0 without it) of a `dspark profile` file; arrays malloc'd, entries finite and > 0. */
ds_status cli_read_profile(const char *path, double **verify_s, int64_t *n_verify, double **draft_s, int64_t *n_draft);

/* Writes j (pretty-printed) to path atomically and deletes j; a failure names option and path. */
ds_status cli_write_json(const char *option, const char *path, cJSON *j);
/* An array of n numbers. */
cJSON *cli_number_array(const double *v, int64_t n);

#endif
