/* Confidence scheduling for speculative decoding (spec/dspark.md section 8): calibration of the
 * draft's confidence head by Sequential Temperature Scaling (STS), the prefix scheduler (paper
 * Algorithm 1) that picks per-request draft lengths, and the measurements of this machine's
 * costs it schedules with (verification time per batch of verified tokens, draft time per
 * block length).
 *
 * Round records: round i proposed n_prop[i] tokens and the target accepted the first
 * n_acc[i] of them; z[i*K + k] is the confidence head's logit at draft position k (k = 0 .. K-1,
 * NAN where not computed). The cumulative prediction at position k is
 * prod_{i<=k} sigmoid(z_i / T_i); its label is 1 when the first k+1 tokens were all accepted.
 * A round counts at position k only when it proposed that position (k < n_prop). */
#ifndef DSPARK_SPEC_SCHEDULE_H
#define DSPARK_SPEC_SCHEDULE_H

#include "dspark/common.h"
#include "dspark/draft.h"
#include "dspark/target.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { DS_ECE_BINS = 10, DS_STS_GRID = 49 };

typedef struct {
  const float *z;        /* [n, K] confidence logits */
  const int64_t *n_prop; /* [n] */
  const int64_t *n_acc;  /* [n] */
  const uint8_t *use;    /* [n] 1: the round belongs to the set (NULL: every round) */
  int64_t n, K;
} ds_round_set;

/* The STS grid: DS_STS_GRID temperatures log-spaced over [1/8, 8] (value i of them). */
double ds_sts_grid_value(int i);
/* Expected calibration error (DS_ECE_BINS equal-width bins) of the cumulative acceptance
 * prediction at position k, temperatures T[0..k] (NULL: all 1, the raw head). *count (may be
 * NULL) = rounds that counted; 0 rounds give 0. */
double ds_cumulative_ece(const ds_round_set *s, int64_t k, const double *T, int64_t *count);
/* Fits T[0..K-1] left to right: position k takes the grid temperature whose cumulative ECE is
 * lowest with T[0..k-1] frozen (ties: the earliest grid value nearest 1, so a position without
 * data keeps T = 1). */
void ds_sts_fit(const ds_round_set *s, double *T);

/* Verification prices (ds_prefix_schedule, ds_spec_expected_gain): verify_s[B-1] = one target
 * pass over B tokens that computes the logits of each request's first row; head_s[n-1] = the
 * logits of n more rows, which speculation computes for a request only when its first proposal is
 * accepted (so they cost a_{r,0} * head_s[len_r - 1] in expectation; past the end the line through
 * the last two entries). head_s NULL (a profile made before the lazy rows): verify_s includes
 * every row's logits and no head term is added. A request whose rows are eager (eager[r] set:
 * their logits in the pass's product with the first rows', as for lookups, mostly accepted)
 * pays for its n rows after the first what n + 1 rows of logits read together cost over one,
 * head_s[n] - head_s[0], whether or not its first proposal is accepted.
 *
 * The prefix scheduler (paper Algorithm 1). R requests; request r offers n_cand[r] candidate
 * tokens with survival probabilities a[r][0..n_cand[r]-1] (non-increasing: a_{r,j} =
 * prod_{i<=j} c_{r,i}). verify_s[B-1] = seconds of one target pass verifying B tokens,
 * B = 1 .. max_B, priced as the most of its entries up to B (a pass over more tokens never
 * costs less; past the end: the line through the last two entries, never decreasing; a
 * one-entry table: proportional to B); fixed_s = seconds of the round that do not depend on the choice (the drafts
 * already run). Starting from B = R, tau = R (every request commits one token), every candidate
 * is admitted in descending a (ties: lower r, then lower j), B += 1 and tau += a each, and the
 * admitted prefix of that order with the highest Theta = tau / (fixed_s + verify(B) + the
 * expected head costs) (expected tokens per second; with fixed_s = 0 it is tau * SPS(B)) is
 * kept (ties: the shorter) -- not the paper's early stop at the first admission that does not
 * improve Theta (docs/speculative-decoding.md). len[r] = the admitted prefix length of request
 * r. Returns the best Theta. Allocates nothing (the requests' lists are merged head by head). */
double ds_prefix_schedule(int R, const int64_t *n_cand, const double *const *a, const int *eager, const double *verify_s,
                          int64_t max_B, const double *head_s, int64_t max_head, double fixed_s, int64_t *len);
/* The expected speedup of speculating one request alone over plain decoding, at its best
 * length (the table priced as above): max over L = 1 .. n_cand of
 * (1 + sum_{j<L} a_j) * verify_s[0] / (draft_s + verify_s[L] + a_0 * head_s[L-1]); 0 when no L qualifies. Below 1,
 * drafting for the request does not pay. *best_len (may be NULL) gets that L. */
double ds_spec_expected_gain(int64_t n_cand, const double *a, const double *verify_s, int64_t max_B,
                             const double *head_s, int64_t max_head, double draft_s, int64_t *best_len);

/* accepted / proposed, add-one smoothed: an unseen position is a coin flip. */
double ds_spec_smoothed_rate(double accepted, double proposed);
/* survive[k] (k < n) = the chance a source's proposal survives through its position k, from this
 * run's counts: proposed[k] rounds proposed position k and accepted[k] of them accepted it with
 * every position before it, so accepted[k] / proposed[k] is already that chance (cumulative, not
 * the conditional rate a product of positions takes). Smoothed toward a prior: position 0 toward
 * a coin flip (add-one), a later one toward survive[k-1] * survive[0] (passing it as often as the
 * first) with the weight of 16 rounds; kept non-increasing (a later position never survives more
 * often). */
void ds_spec_rate_survival(const double *proposed, const double *accepted, int64_t n, double *survive);

/* The verification table as the decoding loop pays it: out[B-1] = verify_s[0] times the cost of
 * B rows over one, the profile's ratio verify(B) / verify_s[0] (priced as ds_prefix_schedule
 * does) times a correction: the loop's mean pass of B rows over its mean pass of one, over the
 * profile's ratio, blended toward 1 with min(passes[B-1], passes[0]) passes of evidence against
 * 16; a count the loop has not seen takes the correction of the nearest seen below it (1 for
 * none), so that a count past the loop's is not priced as free beside a dearer one it has seen.
 * B = 1 .. n, the loop's counts pass_s / passes known for B <= n_seen. The
 * profile times a pass after 128 cached tokens on a quiet machine; the loop's passes run at the
 * requests' lengths, each a context of its own, and on the main job's AMD Zen 4 host a 2-row
 * pass cost 1.17x a plain step and a 4-row one 1.68x where the profile said 1.03x and 1.20x. On
 * the profile's clock (verify_s[0]): the draft's and the head's costs stay comparable. */
void ds_spec_loop_costs(const double *verify_s, int64_t n, const double *passes, const double *pass_s, int64_t n_seen,
                        double *out);

/* Measures seconds[B-1] = the median time of a target pass over B new tokens as speculation
 * runs it (the logits of the first row, the final hidden states of all, the draft's capture
 * layers when capture_layers is given) after `context` cached tokens, B = 1 .. max_tokens, and,
 * when head is not NULL, head[n-1] = the median time of the logits of n more rows
 * (ds_target_logits), n = 1 .. max_tokens - 1; reps timings each after one warm-up. With
 * step > 1 only the counts up to step, its multiples and the last are timed, the others
 * interpolated linearly between them (a batch's table in a fraction of the time: past a few
 * rows a pass's cost grows in a straight line); step 1 times every count. */
ds_status ds_spec_profile_verify(ds_target *t, int64_t context, int64_t max_tokens, int64_t step, int reps,
                                 const int32_t *capture_layers, int n_capture, double *seconds, double *head);
/* The table a run measures for itself when no profile is given (`speculate`, `regenerate
 * --draft`): B = 1 .. *n, *n = requests * (draft_len + 1) up to 64 (the scheduler extends it
 * linearly past its end), after 64 cached tokens, with the draft's capture layers, timed at one
 * request's counts and their multiples (step draft_len + 1), 3 repetitions each. *verify (*n
 * entries) and *head (*n - 1) are malloc'd for the caller to free, NULL after a failure. */
ds_status ds_spec_profile_quick(ds_target *t, const ds_draft *d, int64_t requests, int64_t draft_len, double **verify,
                                double **head, int64_t *n);
/* The counts such a table times (1 when count i of 1 .. last is: up to step, step's multiples, the
 * last), and the others filled in v[0 .. n-1] on the line between their timed neighbours. */
int ds_spec_table_timed(int64_t i, int64_t step, int64_t last);
void ds_spec_table_fill(double *v, int64_t n, int64_t step);
/* Measures seconds[L-1] = the median time of one draft block followed by L head steps (with
 * the confidence head), after `context` committed positions, L = 1 .. the block size. */
ds_status ds_spec_profile_draft(ds_target *t, ds_draft *d, int64_t context, int reps, double *seconds);

#ifdef __cplusplus
}
#endif
#endif
