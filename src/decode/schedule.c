/* Sequential Temperature Scaling, the cumulative-acceptance ECE and the prefix scheduler
 * (include/dspark/spec_schedule.h, spec/dspark.md section 8). Pure functions of their
 * arguments: the decoder and the CLI feed them rounds and measured costs. */
#include <math.h>
#include <stdlib.h>

#include "dspark/spec_schedule.h"

enum { STS_GRID_CENTER = DS_STS_GRID / 2 }; /* the grid value 1 (no rescaling) */

double ds_sts_grid_value(int i) {
  if (i == STS_GRID_CENTER) return 1.0; /* exact, so "no change" is representable */
  return exp(log(0.125) + (double)i * log(64.0) / (double)(DS_STS_GRID - 1));
}

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

static int counts_at(const ds_round_set *s, int64_t i, int64_t k) {
  return (!s->use || s->use[i]) && k < s->n_prop[i];
}

/* ECE at position k of the predictions prefix[i] * sigmoid(z_k / Tk) (prefix NULL: 1). */
static double ece_at(const ds_round_set *s, int64_t k, const double *prefix, double Tk, int64_t *count) {
  double pred_sum[DS_ECE_BINS] = {0}, label_sum[DS_ECE_BINS] = {0};
  int64_t n = 0;
  for (int64_t i = 0; i < s->n; i++) {
    if (!counts_at(s, i, k)) continue;
    double p = (prefix ? prefix[i] : 1.0) * sigmoid((double)s->z[i * s->K + k] / Tk);
    if (!isfinite(p)) continue; /* a round without confidences at this position */
    int b = (int)(p * DS_ECE_BINS);
    if (b >= DS_ECE_BINS) b = DS_ECE_BINS - 1;
    if (b < 0) b = 0;
    pred_sum[b] += p;
    label_sum[b] += s->n_acc[i] > k ? 1.0 : 0.0;
    n++;
  }
  if (count) *count = n;
  if (n == 0) return 0.0;
  double e = 0;
  for (int b = 0; b < DS_ECE_BINS; b++) e += fabs(pred_sum[b] - label_sum[b]);
  return e / (double)n;
}

double ds_cumulative_ece(const ds_round_set *s, int64_t k, const double *T, int64_t *count) {
  double *prefix = ds_malloc((size_t)(s->n > 0 ? s->n : 1) * sizeof(double), "ECE prefix products");
  if (!prefix) return NAN;
  for (int64_t i = 0; i < s->n; i++) {
    prefix[i] = 1.0;
    for (int64_t m = 0; m < k && counts_at(s, i, k); m++) prefix[i] *= sigmoid((double)s->z[i * s->K + m] / (T ? T[m] : 1.0));
  }
  double e = ece_at(s, k, prefix, T ? T[k] : 1.0, count);
  free(prefix);
  return e;
}

void ds_sts_fit(const ds_round_set *s, double *T) {
  double *prefix = ds_malloc((size_t)(s->n > 0 ? s->n : 1) * sizeof(double), "STS prefix products");
  for (int64_t k = 0; k < s->K; k++) T[k] = 1.0;
  if (!prefix) return; /* out of memory: leave the head uncalibrated (T = 1) */
  for (int64_t i = 0; i < s->n; i++) prefix[i] = 1.0;
  for (int64_t k = 0; k < s->K; k++) {
    /* visit the grid outward from 1, lower values first at equal distance: only a strictly
     * lower ECE moves T_k away from 1 */
    double best = ece_at(s, k, prefix, 1.0, NULL);
    for (int d = 1; d <= STS_GRID_CENTER; d++)
      for (int side = -1; side <= 1; side += 2) {
        int i = STS_GRID_CENTER + side * d;
        if (i < 0 || i >= DS_STS_GRID) continue;
        double e = ece_at(s, k, prefix, ds_sts_grid_value(i), NULL);
        if (e < best) best = e, T[k] = ds_sts_grid_value(i);
      }
    for (int64_t i = 0; i < s->n; i++) prefix[i] *= sigmoid((double)s->z[i * s->K + k] / T[k]); /* freeze T_k */
  }
  free(prefix);
}

/* Seconds of a pass verifying B tokens: the most of the table's entries up to B (a measured
 * table dips by its noise, and a pass over more tokens never costs less), past its end the line
 * through its last two entries (never cheaper than the last), a one-entry table proportional to
 * B. */
static double verify_cost(const double *verify_s, int64_t max_B, int64_t B) {
  if (max_B < 2 && B > max_B) return verify_s[0] * (double)B;
  double c = verify_s[0];
  for (int64_t i = 1; i < (B < max_B ? B : max_B); i++) c = verify_s[i] > c ? verify_s[i] : c;
  if (B <= max_B) return c;
  double slope = verify_s[max_B - 1] - verify_s[max_B - 2];
  return c + (slope > 0 ? slope : 0.0) * (double)(B - max_B);
}

/* Seconds of the logits of n rows after a request's first (0 for none; no table: none priced). */
static double head_cost(const double *head_s, int64_t max_head, int64_t n) {
  return n < 1 || !head_s || max_head < 1 ? 0.0 : verify_cost(head_s, max_head, n);
}

/* What admitting a request's next candidate (its len-th, from 0) adds to the expected logits
 * cost: lazy rows are a separate product of the rows after the first, paid when the first
 * proposal is accepted (a0); eager rows join the pass's product of the first row, where they
 * cost what n + 1 rows read together cost over the first alone (the head table's entries for 1
 * row and n + 1: about nothing while its weights' bytes bind it, as SmolLM2's 30 MB head's do). */
static double rows_cost(const double *head_s, int64_t max_head, int eager, double a0, int64_t len) {
  if (eager) return head_cost(head_s, max_head, len + 2) - head_cost(head_s, max_head, len + 1);
  return a0 * (head_cost(head_s, max_head, len + 1) - head_cost(head_s, max_head, len));
}

/* The admission scan: candidates in descending survival (each request's list is non-increasing,
 * so the next is one of the R heads; ties: the lower request), at most `limit` of them (-1: all);
 * len[] gets the admitted prefixes. Returns the number admitted at the best Theta, *best_out
 * that Theta. */
static int64_t admit(int R, const int64_t *n_cand, const double *const *a, const int *eager, const double *verify_s,
                     int64_t max_B, const double *head_s, int64_t max_head, double fixed_s, int64_t limit, int64_t *len,
                     double *best_out) {
  for (int r = 0; r < R; r++) len[r] = 0;
  int64_t B = R, count = 0, at = 0;
  double tau = R, rest = 0.0, best = tau / (fixed_s + verify_cost(verify_s, max_B, B));
  while (limit < 0 || count < limit) {
    int pick = -1;
    for (int r = 0; r < R; r++)
      if (len[r] < n_cand[r] && (pick < 0 || a[r][len[r]] > a[pick][len[pick]])) pick = r;
    if (pick < 0) break;
    rest += rows_cost(head_s, max_head, eager && eager[pick], a[pick][0], len[pick]);
    tau += a[pick][len[pick]];
    B++;
    len[pick]++;
    count++;
    double theta = tau / (fixed_s + verify_cost(verify_s, max_B, B) + rest);
    if (theta > best) best = theta, at = count;
  }
  *best_out = best;
  return at;
}

double ds_prefix_schedule(int R, const int64_t *n_cand, const double *const *a, const int *eager, const double *verify_s,
                          int64_t max_B, const double *head_s, int64_t max_head, double fixed_s, int64_t *len) {
  for (int r = 0; r < R; r++) len[r] = 0;
  if (R < 1 || max_B < 1) return 0.0;
  /* the whole scan, then its best prefix again: the paper's early stop (the first admission that
   * does not pay ends the scan) stopped at a step of the cost table, 4 rows on an fp32 target,
   * where 7 proposals, accepted at 0.81-0.95 each, decoded 1.5x faster (docs/speculative-decoding.md) */
  double best;
  int64_t at = admit(R, n_cand, a, eager, verify_s, max_B, head_s, max_head, fixed_s, -1, len, &best);
  admit(R, n_cand, a, eager, verify_s, max_B, head_s, max_head, fixed_s, at, len, &best);
  return best;
}

double ds_spec_expected_gain(int64_t n_cand, const double *a, const double *verify_s, int64_t max_B,
                             const double *head_s, int64_t max_head, double draft_s, int64_t *best_len) {
  double best = 0.0, tokens = 1.0; /* L = 0 (plain decoding) would be 1 by definition: not a candidate */
  int64_t at = 0;
  if (max_B < 1) return 0.0;
  for (int64_t L = 1; L <= n_cand; L++) {
    tokens += a[L - 1];
    double g = tokens * verify_s[0] / (draft_s + verify_cost(verify_s, max_B, L + 1) + a[0] * head_cost(head_s, max_head, L));
    if (g > best) best = g, at = L;
  }
  if (best_len) *best_len = at;
  return best;
}

/* Rounds of evidence the prior of a later position counts as (ds_spec_rate_survival): with the
 * add-one coin flip there, a lookup's first few second tokens, rejected in rounds unlike the rest
 * (matches in the prompt early in a request), priced every later one near zero on the main job's
 * code prompts (0 of 6 accepted, where 49% of 542 got through once tried: tau 1.25 -> 1.35). */
enum { SURVIVAL_PRIOR_ROUNDS = 16 };

double ds_spec_smoothed_rate(double accepted, double proposed) { return (accepted + 1.0) / (proposed + 2.0); }

void ds_spec_rate_survival(const double *proposed, const double *accepted, int64_t n, double *survive) {
  double prev = 1.0;
  for (int64_t k = 0; k < n; k++) {
    /* position 0 from a coin flip; a later one from the position before it times the first's
     * rate (as likely to pass as the first was), SURVIVAL_PRIOR_ROUNDS rounds of evidence */
    double rate = k == 0 ? ds_spec_smoothed_rate(accepted[0], proposed[0])
                         : (accepted[k] + SURVIVAL_PRIOR_ROUNDS * prev * survive[0]) / (proposed[k] + SURVIVAL_PRIOR_ROUNDS);
    survive[k] = prev = rate < prev ? rate : prev;
  }
}

/* Passes of evidence the profile's ratio counts as in ds_spec_loop_costs. */
enum { LOOP_COST_PRIOR_PASSES = 16 };

void ds_spec_loop_costs(const double *verify_s, int64_t n, const double *passes, const double *pass_s, int64_t n_seen,
                        double *out) {
  double one = n_seen > 0 && passes[0] > 0 ? pass_s[0] / passes[0] : 0.0, corr = 1.0;
  if (!(one > 0) || !(verify_s[0] > 0)) { /* no 1-row pass to compare with, or no time at 1: as given */
    for (int64_t B = 1; B <= n; B++) out[B - 1] = verify_s[B - 1];
    return;
  }
  for (int64_t B = 1; B <= n; B++) {
    double prof = verify_cost(verify_s, n, B) / verify_s[0];
    double seen = B <= n_seen ? (passes[B - 1] < passes[0] ? passes[B - 1] : passes[0]) : 0.0;
    if (seen > 0) /* the loop's ratio over the profile's, blended toward none */
      corr = (seen * (pass_s[B - 1] / passes[B - 1] / one) / prof + LOOP_COST_PRIOR_PASSES) / (seen + LOOP_COST_PRIOR_PASSES);
    out[B - 1] = verify_s[0] * prof * corr; /* an unseen count: the correction of the nearest seen below */
  }
}

int ds_spec_table_timed(int64_t i, int64_t step, int64_t last) { return i <= step || i % step == 0 || i == last; }

void ds_spec_table_fill(double *v, int64_t n, int64_t step) {
  for (int64_t i = 1; i <= n; i++) {
    if (ds_spec_table_timed(i, step, n)) continue;
    int64_t a = i - 1, b = i + 1; /* the nearest timed counts below and above (1 and n are timed) */
    while (!ds_spec_table_timed(a, step, n)) a--;
    while (!ds_spec_table_timed(b, step, n)) b++;
    v[i - 1] = v[a - 1] + (v[b - 1] - v[a - 1]) * (double)(i - a) / (double)(b - a);
  }
}
