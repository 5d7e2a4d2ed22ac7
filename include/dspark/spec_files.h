/* The files and records of speculative decoding that `speculate`, `calibrate` and `profile`
 * share: the rounds a decode reports (confidences and acceptance, for calibration and its ECE),
 * the identity records of the draft and the target a file was made on, the calibration JSON
 * (STS temperatures), the profile JSON (verification and draft costs), and JSON reports. Reports
 * are cJSON trees (libcjson, which the library links publicly). */
#ifndef DSPARK_SPEC_FILES_H
#define DSPARK_SPEC_FILES_H

#include <cjson/cJSON.h>

#include "dspark/draft.h"
#include "dspark/model_source.h"
#include "dspark/spec_schedule.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Rounds collected through ds_spec_options.on_round (K = the draft's block size). */
typedef struct {
  float *z;        /* [cap, K] */
  int64_t *n_prop, *n_acc;
  int *request;    /* request of the round, offset by request_base */
  int64_t n, cap, K;
  int request_base;
  int failed;      /* out of memory: rounds were lost */
} ds_spec_rounds;
void ds_spec_rounds_init(ds_spec_rounds *r, int64_t K);
/* The on_round callback (user = a ds_spec_rounds). */
void ds_spec_rounds_add(void *user, int request, const float *conf, int64_t n_conf, int64_t n_prop, int64_t n_acc);
void ds_spec_rounds_free(ds_spec_rounds *r);
/* A view of the rounds for the ECE / STS functions (use may be NULL: every round). */
ds_round_set ds_spec_rounds_set(const ds_spec_rounds *r, const uint8_t *use);

/* Per position k < K: the cumulative ECE with T (NULL: raw) as a JSON array. */
cJSON *ds_ece_json(const ds_round_set *s, const double *T);
/* Rounds counted per position. */
cJSON *ds_ece_counts_json(const ds_round_set *s);
/* The mean of the per-position ECE over the positions that some round proposed (0 when none):
 * under the scheduler later positions may never be drafted, and their 0 is no measurement. */
double ds_ece_mean(const ds_round_set *s, const double *T);

/* What a calibration or profile file records of what it was made on: "draft_identity"
 * (ds_draft_identity as 16 hex digits) and "block_size"; "target_config_xxh64" (xxh64 of the
 * target's config.json: the verification costs depend on its shapes, not on its weights). */
void ds_spec_add_draft_identity(cJSON *j, const ds_draft *d);
ds_status ds_spec_add_target_identity(cJSON *j, ds_model_source *target);

/* Reads "temperatures" of a `dspark calibrate` file for the draft d (in draft_dir) proposing
 * `drafted` positions; T malloc'd. Refused, naming the file, the field and both values: a file
 * without the draft's record (an older calibrate's: re-run it), another draft's (identity or
 * block size), temperatures that are not one finite value > 0 per fitted position ("draft_len"),
 * and fewer fitted positions than drafted. On a refusal *T is NULL and *n 0. */
ds_status ds_spec_read_calibration(const char *path, const ds_draft *d, const char *draft_dir, int64_t drafted,
                                   double **T, int64_t *n);
/* Reads "verify_seconds" (required, B = 1 .. n_verify), "head_seconds" (optional: *n_head = 0
 * without it, as in a profile made before speculation computed rows after the first lazily:
 * verify_seconds then include them) and "draft_block_seconds" (optional: *n_draft = 0 without
 * it) of a `dspark profile` file; arrays malloc'd, entries finite and > 0.
 * A file recording another target (target_config_xxh64) is refused naming the field and both
 * values; draft costs recorded for another draft (identity or block size) are dropped with a note
 * (*n_draft = 0: measured during decoding, as without them); a file recording neither (written by
 * hand, or by an older profile) is taken as given, with a note. On a refusal every array is NULL
 * and every count 0. */
ds_status ds_spec_read_profile(const char *path, ds_model_source *target, const ds_draft *d, const char *draft_dir,
                               double **verify_s, int64_t *n_verify, double **head_s, int64_t *n_head, double **draft_s,
                               int64_t *n_draft);

/* Writes j (pretty-printed) to path atomically and deletes j; a failure names option and path. */
ds_status ds_json_write_report(const char *option, const char *path, cJSON *j);
/* An array of n numbers. */
cJSON *ds_json_number_array(const double *v, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
