/* The confidence-scheduling functions (include/dspark/spec_schedule.h) on inputs whose answers
 * were worked out by hand: the prefix scheduler's lengths over its whole scan and its
 * non-decreasing cost, the table limit and tie rule, the expected gain that switches
 * speculation off, the cumulative ECE and the STS fit. */
#include <math.h>

#include "dspark/spec_schedule.h"
#include "test_util.h"

/* Two requests, survivals [0.9, 0.72, 0.36] and [0.8, 0.4]; verification seconds by B. From
 * B = 2, tau = 2, Theta = 2 / 1.0 = 2: admit 0.9 (2.9 / 1.1 = 2.636), 0.8 (3.7 / 1.2 = 3.083),
 * 0.72 (4.42 / 1.3 = 3.4); 0.4 gives 4.82 / 1.6 = 3.0125, 0.36 5.18 / 1.6 = 3.2375: B = 7's
 * entry (1.45) is below B = 6's, and a pass over more tokens is priced at least as dear as one
 * over fewer, so the best stays at B = 5. Lengths [2, 1]. */
static void test_prefix_schedule_hand_example(void) {
  const double a0[] = {0.9, 0.72, 0.36}, a1[] = {0.8, 0.4};
  const double *a[] = {a0, a1};
  const int64_t n_cand[] = {3, 2};
  const double verify[] = {1.0, 1.0, 1.1, 1.2, 1.3, 1.6, 1.45, 3.0};
  int64_t len[2] = {-1, -1};
  double theta = ds_prefix_schedule(2, n_cand, a, NULL, verify, 8, NULL, 0, 0.0, len);
  EXPECT(len[0] == 2 && len[1] == 1);
  EXPECT_CLOSE(theta, 4.42 / 1.3, 1e-12, 0);
  /* the round's fixed cost enters the denominator: 2/2, 2.9/2.1, 3.7/2.2, 4.42/2.3 = 1.922,
   * 4.82/2.6 = 1.854, then 5.18/2.6 = 1.992: the whole scan takes every candidate (the paper's
   * early stop would have ended at 1.854 with [2, 1]) */
  theta = ds_prefix_schedule(2, n_cand, a, NULL, verify, 8, NULL, 0, 1.0, len);
  EXPECT(len[0] == 3 && len[1] == 2);
  EXPECT_CLOSE(theta, 5.18 / 2.6, 1e-12, 0);
  /* a step in the cost (4 tokens, as an fp32 target's verification has it): one request,
   * survivals 0.9, 0.81, 0.729, 0.6561: 1/1, 1.9/1, 2.71/1.1 = 2.464, 3.439/1.5 = 2.293, then
   * 4.095/1.5 = 2.730: all four, where stopping at the step would have proposed two */
  const double s0[] = {0.9, 0.81, 0.729, 0.6561}, *s[] = {s0};
  const int64_t four[] = {4};
  const double step[] = {1.0, 1.0, 1.1, 1.5, 1.5};
  theta = ds_prefix_schedule(1, four, s, NULL, step, 5, NULL, 0, 0.0, len);
  EXPECT(len[0] == 4);
  EXPECT_CLOSE(theta, 4.0951 / 1.5, 1e-12, 0);
}

static void test_prefix_schedule_limits(void) {
  const double a0[] = {0.9, 0.72, 0.36}, a1[] = {0.8, 0.4};
  const double *a[] = {a0, a1};
  const int64_t n_cand[] = {3, 2};
  const double flat[] = {1, 1, 1, 1, 1, 1, 1, 1};
  int64_t len[2];
  /* verification costs nothing more per token: every candidate pays */
  ds_prefix_schedule(2, n_cand, a, NULL, flat, 8, NULL, 0, 0.0, len);
  EXPECT(len[0] == 3 && len[1] == 2);
  /* past the table's end (B = 3) the line through its last two entries, 0.2 s per token:
   * 2/1, 2.9/1.2 = 2.417, 3.7/1.4 = 2.643, 4.42/1.6 = 2.7625, then 4.82/1.8 = 2.678 stops */
  const double short_table[] = {1, 1, 1.2};
  EXPECT_CLOSE(ds_prefix_schedule(2, n_cand, a, NULL, short_table, 3, NULL, 0, 0.0, len), 4.42 / 1.6, 1e-12, 0);
  EXPECT(len[0] == 2 && len[1] == 1);
  /* a one-entry table prices tokens proportionally: 2/2 = 1, then 2.9/3 does not pay */
  ds_prefix_schedule(2, n_cand, a, NULL, flat, 1, NULL, 0, 0.0, len);
  EXPECT(len[0] == 0 && len[1] == 0);
  /* equal survivals: the lower request first (2/1, 2.5/1, then 3/2 stops) */
  const double b0[] = {0.5}, b1[] = {0.5}, dear4[] = {1, 1, 1, 2};
  const double *b[] = {b0, b1};
  const int64_t one[] = {1, 1};
  ds_prefix_schedule(2, one, b, NULL, dear4, 4, NULL, 0, 0.0, len);
  EXPECT(len[0] == 1 && len[1] == 0);
  /* a verification cost that doubles with one more token never pays for a survival of 0.9 */
  const double steep[] = {1, 2, 4};
  const double *c[] = {a0};
  ds_prefix_schedule(1, n_cand, c, NULL, steep, 3, NULL, 0, 0.0, len);
  EXPECT(len[0] == 0);
}

/* Alone, a = [0.9, 0.72], verification [1, 1.1, 1.2]: with a draft of 0.5 s, L = 1 gives
 * 1.9 / 1.6 = 1.1875 and L = 2 gives 2.62 / 1.7 = 1.541; with a draft of 5 s the best is
 * 2.62 / 6.2 = 0.4226 < 1 (speculation switches off). */
static void test_expected_gain(void) {
  const double a[] = {0.9, 0.72}, verify[] = {1.0, 1.1, 1.2};
  int64_t L = -1;
  EXPECT_CLOSE(ds_spec_expected_gain(2, a, verify, 3, NULL, 0, 0.5, &L), 2.62 / 1.7, 1e-12, 0);
  EXPECT(L == 2);
  EXPECT_CLOSE(ds_spec_expected_gain(2, a, verify, 3, NULL, 0, 5.0, &L), 2.62 / 6.2, 1e-12, 0);
  /* a table ending at B = 2 is extended by its last step (0.1): the same answer */
  EXPECT_CLOSE(ds_spec_expected_gain(2, a, verify, 2, NULL, 0, 0.5, &L), 2.62 / 1.7, 1e-12, 0);
  EXPECT(ds_spec_expected_gain(0, a, verify, 3, NULL, 0, 0.5, &L) == 0.0 && L == 0);
}

/* The rows after a request's first are priced at a_0 * head[len - 1] (computed only when its
 * first proposal is accepted). Alone, a = [0.9, 0.72], verification [1, 1.1, 1.2], head [0.5,
 * 0.6], draft 0.5: L = 1 gives 1.9 / (0.5 + 1.1 + 0.45) = 0.9268, L = 2 gives 2.62 / (0.5 +
 * 1.2 + 0.54) = 1.1696; with a = [0.1, 0.05] the head costs little: L = 1 gives 1.1 / (1.6 +
 * 0.05) = 0.6667, L = 2 1.15 / (1.7 + 0.06) = 0.6534. In the batch (one request, the hand
 * example's a0 and table): 1/1, then 0.9 costs 0.9 * 0.5 more: 1.9 / 1.45 = 1.310; 0.72
 * costs 0.9 * 0.1 more: 2.62 / (1.1 + 0.54) = 1.598; 0.36: 2.98 / (1.2 + 0.9 * 0.7) = 1.628,
 * admitted (head past its end: 0.6 + 0.1). */
static void test_head_costs(void) {
  const double a[] = {0.9, 0.72}, weak[] = {0.1, 0.05}, verify[] = {1.0, 1.1, 1.2}, head[] = {0.5, 0.6};
  int64_t L = -1;
  EXPECT_CLOSE(ds_spec_expected_gain(2, a, verify, 3, head, 2, 0.5, &L), 2.62 / 2.24, 1e-12, 0);
  EXPECT(L == 2);
  EXPECT_CLOSE(ds_spec_expected_gain(2, weak, verify, 3, head, 2, 0.5, &L), 1.1 / 1.65, 1e-12, 0);
  EXPECT(L == 1);
  const double a0[] = {0.9, 0.72, 0.36}, *aa[] = {a0}, table[] = {1.0, 1.0, 1.1, 1.2};
  const int64_t n_cand[] = {3};
  int64_t len[1] = {-1};
  EXPECT_CLOSE(ds_prefix_schedule(1, n_cand, aa, NULL, table, 4, head, 2, 0.0, len), 2.98 / 1.83, 1e-12, 0);
  EXPECT(len[0] == 3);
  /* without a head table the rows are in the table: the hand example's prices */
  EXPECT_CLOSE(ds_prefix_schedule(1, n_cand, aa, NULL, table, 4, NULL, 0, 0.0, len), 2.98 / 1.2, 1e-12, 0);
  /* eager rows (a lookup's) pay head[n] - head[0] whether or not the first is accepted: 0.9
   * adds 0.1, 1.9 / 1.1; 0.72 0.1 more, 2.62 / 1.3 = 2.015; 0.36 0.1 more (past the table's end),
   * 2.98 / 1.5 = 1.987: two kept, where lazily all three were */
  const int eager[] = {1}, lazy[] = {0};
  EXPECT_CLOSE(ds_prefix_schedule(1, n_cand, aa, eager, table, 4, head, 2, 0.0, len), 2.62 / 1.3, 1e-12, 0);
  EXPECT(len[0] == 2);
  EXPECT_CLOSE(ds_prefix_schedule(1, n_cand, aa, lazy, table, 4, head, 2, 0.0, len), 2.98 / 1.83, 1e-12, 0);
  EXPECT(len[0] == 3);
  /* a head its weights' bytes bind (as many rows cost as one): eager rows are free */
  const double flat_head[] = {0.5, 0.5};
  EXPECT_CLOSE(ds_prefix_schedule(1, n_cand, aa, eager, table, 4, flat_head, 2, 0.0, len), 2.98 / 1.2, 1e-12, 0);
  EXPECT(len[0] == 3);
}

/* Two rounds predicting 0.9 (accepted once) and two predicting 0.1 (never accepted): bin 9
 * errs |1.8 - 1| = 0.8, bin 1 |0.2 - 0| = 0.2, ECE = 1.0 / 4. A fifth round proposed nothing
 * and does not count; a sixth is left out by the mask. */
static void test_cumulative_ece(void) {
  const float l9 = (float)log(9.0);
  const float z[] = {l9, l9, -l9, -l9, 0, 0};
  const int64_t n_prop[] = {1, 1, 1, 1, 0, 1}, n_acc[] = {1, 0, 0, 0, 0, 1};
  const uint8_t use[] = {1, 1, 1, 1, 1, 0};
  ds_round_set s = {z, n_prop, n_acc, use, 6, 1};
  int64_t count = 0;
  EXPECT_CLOSE(ds_cumulative_ece(&s, 0, NULL, &count), 0.25, 1e-6, 0);
  EXPECT(count == 4);
}

/* Every round: confidences sigmoid(ln 3) = 0.75 at both positions, three of four rounds accept
 * both tokens. Position 1 is calibrated already (0.75 against 3/4): T_1 stays 1. Position 2
 * predicts 0.5625 against 3/4 (ECE 0.1875) and can only approach 0.75 by a confidence near 1:
 * the smallest temperature, 1/8, leaves ECE 0.75 * (1 - sigmoid(8 ln 3)) ~ 1.1e-4. */
static void test_sts_fit(void) {
  const float l3 = (float)log(3.0);
  const float z[] = {l3, l3, l3, l3, l3, l3, l3, l3};
  const int64_t n_prop[] = {2, 2, 2, 2}, n_acc[] = {2, 2, 2, 0};
  ds_round_set s = {z, n_prop, n_acc, NULL, 4, 2};
  double T[2];
  ds_sts_fit(&s, T);
  EXPECT(T[0] == 1.0);
  EXPECT_CLOSE(T[1], 0.125, 1e-12, 0);
  EXPECT_CLOSE(ds_cumulative_ece(&s, 1, NULL, NULL), 0.1875, 1e-6, 0);
  EXPECT(ds_cumulative_ece(&s, 1, T, NULL) < 2e-4);
  EXPECT_CLOSE(ds_sts_grid_value(0), 0.125, 1e-12, 0);
  EXPECT_CLOSE(ds_sts_grid_value(DS_STS_GRID - 1), 8.0, 1e-12, 0);
  EXPECT(ds_sts_grid_value(DS_STS_GRID / 2) == 1.0);
}

/* A cost table timed at some counts and filled between them (the in-process table of a batch). */
static void test_table_fill(void) {
  /* step 3 over 1 .. 10: 1, 2, 3, 6, 9 and the last, 10, are timed */
  const int want_timed[10] = {1, 1, 1, 0, 0, 1, 0, 0, 1, 1};
  for (int64_t i = 1; i <= 10; i++) EXPECT(ds_spec_table_timed(i, 3, 10) == want_timed[i - 1]);
  double v[10];
  for (int i = 0; i < 10; i++) v[i] = want_timed[i] ? 1.0 + 0.5 * i * i : -1.0; /* untimed: garbage */
  ds_spec_table_fill(v, 10, 3);
  EXPECT(v[0] == 1.0 && v[2] == 3.0 && v[5] == 13.5 && v[8] == 33.0 && v[9] == 41.5); /* the timed ones kept */
  EXPECT(fabs(v[3] - (3.0 + (13.5 - 3.0) / 3.0)) < 1e-12 && fabs(v[4] - (3.0 + 2.0 * (13.5 - 3.0) / 3.0)) < 1e-12);
  EXPECT(fabs(v[6] - (13.5 + (33.0 - 13.5) / 3.0)) < 1e-12 && fabs(v[7] - (13.5 + 2.0 * (33.0 - 13.5) / 3.0)) < 1e-12);
  /* step 1 (and any step past n) times everything and changes nothing */
  double w[4] = {4, 3, 2, 1};
  ds_spec_table_fill(w, 4, 1);
  EXPECT(w[0] == 4 && w[1] == 3 && w[2] == 2 && w[3] == 1);
  for (int64_t i = 1; i <= 4; i++) EXPECT(ds_spec_table_timed(i, 1, 4) && ds_spec_table_timed(i, 8, 4));
  ds_spec_table_fill(w, 0, 3); /* an empty table (no head rows) */
}

/* Survival from a source's per-position counts, which are cumulative (accepted[k]: position k
 * accepted with every earlier one): used as they are, not multiplied again; smoothed toward a
 * coin flip at position 0 and toward the position before it times the first's rate after (16
 * rounds of evidence); never rising with the position. */
static void test_rate_survival(void) {
  /* the main job's code prompts, prompt lookup (2026-12-07): 0.59, 0.45, 0.39 of the rounds that
   * proposed a position got through it (a product would have said 0.59, 0.27, 0.10) */
  const double proposed[3] = {477, 475, 473}, accepted[3] = {282, 215, 186};
  double a[3];
  ds_spec_rate_survival(proposed, accepted, 3, a);
  double s0 = 283.0 / 479.0, s1 = (215.0 + 16.0 * s0 * s0) / (475.0 + 16.0), s2 = (186.0 + 16.0 * s1 * s0) / (473.0 + 16.0);
  EXPECT_CLOSE(a[0], s0, 1e-15, 0);
  EXPECT_CLOSE(a[1], s1, 1e-15, 0);
  EXPECT_CLOSE(a[2], s2, 1e-15, 0);
  EXPECT(fabs(a[1] - 0.449) < 1e-3 && fabs(a[2] - 0.389) < 1e-3); /* near the counts: the prior weighs 16 rounds */
  /* a few early failures at a later position do not price it at nothing: 0 of 6 after 467 of 695 */
  const double p1[2] = {695, 6}, c1[2] = {467, 0};
  ds_spec_rate_survival(p1, c1, 2, a);
  EXPECT_CLOSE(a[1], 16.0 * a[0] * a[0] / 22.0, 1e-15, 0);
  EXPECT(a[1] > 0.3);
  /* unseen positions: a coin flip, then the first's rate again at each (0.5, 0.25, 0.125) */
  const double p3[3] = {0, 0, 0};
  ds_spec_rate_survival(p3, p3, 3, a);
  EXPECT(a[0] == 0.5 && a[1] == 0.25 && a[2] == 0.125);
  /* a later position's sample that looks better does not rise above the earlier one */
  const double p4[2] = {10, 10}, c4[2] = {2, 8};
  ds_spec_rate_survival(p4, c4, 2, a);
  EXPECT(a[0] == 0.25 && a[1] == 0.25);
  a[0] = -1.0;
  ds_spec_rate_survival(p4, c4, 0, a); /* none: nothing written */
  EXPECT(a[0] == -1.0);
}

/* The loop's costs by hand: profile [1, 1.1, 1.2, 1.3, 1.4]; the loop's 1-row passes 2.0 s each
 * (10), 3-row 2.8 (30 passes: 1.4x), 4-row 3.0 (5: 1.5x), no 2-row or 5-row pass. B = 1: 1; B =
 * 2: the profile's 1.1 (B = 1's correction, none); B = 3: 10 passes of evidence (the fewer of its
 * 30 and the 10 of one row) against 16, 1.2 * (10 * 1.4 / 1.2 + 16) / 26 = (10 * 1.4 + 16 * 1.2) /
 * 26; B = 4: (5 * 1.5 + 16 * 1.3) / 21; B = 5: 1.4 times B = 4's correction, not the profile's 1.4
 * (cheaper than the 4 rows seen: a free row). Nothing seen, or no 1-row pass to compare with: the
 * profile. */
static void test_loop_costs(void) {
  const double verify[] = {1.0, 1.1, 1.2, 1.3, 1.4}, passes[] = {10, 0, 30, 5, 0}, pass_s[] = {20, 0, 84, 15, 0};
  double out[5];
  ds_spec_loop_costs(verify, 5, passes, pass_s, 5, out);
  EXPECT_CLOSE(out[0], 1.0, 1e-12, 0);
  EXPECT_CLOSE(out[1], 1.1, 1e-12, 0);
  EXPECT_CLOSE(out[2], (10 * 1.4 + 16 * 1.2) / 26, 1e-12, 0);
  EXPECT_CLOSE(out[3], (5 * 1.5 + 16 * 1.3) / 21, 1e-12, 0);
  EXPECT_CLOSE(out[4], 1.4 * (5 * 1.5 / 1.3 + 16) / 21, 1e-12, 0);
  ds_spec_loop_costs(verify, 5, passes, pass_s, 0, out);
  for (int b = 0; b < 5; b++) EXPECT_CLOSE(out[b], verify[b], 1e-12, 0);
  const double zero_first[] = {0.0, 1.1, 1.2, 1.3, 1.4}; /* a caller's table without a time at 1: as given */
  ds_spec_loop_costs(zero_first, 5, passes, pass_s, 5, out);
  for (int b = 0; b < 5; b++) EXPECT(out[b] == zero_first[b]);
  const double none[] = {0, 0, 30, 5, 0};
  ds_spec_loop_costs(verify, 5, none, pass_s, 5, out);
  for (int b = 0; b < 5; b++) EXPECT_CLOSE(out[b], verify[b], 1e-12, 0);
  /* on the profile's clock: a host twice as slow in the loop changes no ratio */
  const double slow[] = {40, 0, 168, 30, 0};
  ds_spec_loop_costs(verify, 5, passes, slow, 5, out);
  EXPECT_CLOSE(out[2], (10 * 1.4 + 16 * 1.2) / 26, 1e-12, 0);
}

int main(void) {
  TEST_RUN(test_loop_costs);
  TEST_RUN(test_rate_survival);
  TEST_RUN(test_table_fill);
  TEST_RUN(test_prefix_schedule_hand_example);
  TEST_RUN(test_prefix_schedule_limits);
  TEST_RUN(test_expected_gain);
  TEST_RUN(test_head_costs);
  TEST_RUN(test_cumulative_ece);
  TEST_RUN(test_sts_fit);
  return TEST_RESULT();
}
