/* The DSpark training objective (spec/dspark.md section 4): CE + raw L1 + confidence BCE over
 * the g slots of each block, with its gradients, reporting pairs and acceptance metrics.
 *
 * Layout. Rows are block-major: row = b * g + k (block b = 0 .. n_blocks-1, slot k = 0 .. g-1),
 * R = n_blocks * g. Per row:
 *   draft logits   [V]  the draft's logits INCLUDING the Markov bias (fp32)
 *   target logits  [V]  lm_head(last[a+k]) of the frozen target, or none (no teacher)
 *   target id           x*_k = input_ids[a+k+1] (int32)
 *   eval mask           uint8, nonzero = true; block_keep_mask is per block
 *   conf logit          the confidence head's logit, or none
 *
 * Math (k in code indexing 0 .. g-1; everything below is per row, then summed):
 *   sup_k    = eval_mask_k AND block_keep_b                         supervision mask
 *   w_k      = sup_k * decay(k)                                     see ds_dspark_decay
 *   q = softmax(draft), p = softmax(target)   fp32, from ONE log-softmax per row (q = exp(logq))
 *   ce       = -log q(x*)
 *   l1       = sum_v |q_v - p_v|                                    RAW L1 (= 2 TV), no 1/2
 *   accept   = clamp(1 - 0.5 * l1, 0, 1)                            label: detached
 *   bce      = max(z, 0) - z * accept + log1p(exp(-|z|))            BCE_with_logits(z, accept)
 *   numerator = alpha_ce sum w ce + alpha_l1 sum w l1 + alpha_conf sum w bce
 *   W = sum w,  num_tokens = sum sup  (unweighted)
 * Gradients of the numerator, each multiplied by grad_scale:
 *   d/d draft_v = w alpha_ce (q_v - [v == x*]) + w alpha_l1 q_v (s_v - sum_u q_u s_u),
 *                 s = sign(q - p) with sign(0) = 0 (the subgradient PyTorch's abs uses)
 *   d/d z       = w alpha_conf (sigmoid(z) - accept)
 * The target and the accept label are detached: no gradient flows into the target logits,
 * and the BCE term sends none into the draft logits through accept.
 * Without a teacher only CE is on: l1 and confidence are off, accept and tau are absent.
 * Without confidence logits the confidence term is off. A term that is off contributes
 * nothing and reports [0, W], never [0, 0].
 *
 * Normalization: the functions return the UNNORMALIZED numerator and its denominators. The
 * caller divides by the GLOBAL sum of W over all micro-batches and all data-parallel ranks,
 * i.e. passes grad_scale = 1 / global_W; dividing each micro-batch by its own W (a mean of
 * means) biases the objective whenever micro-batches carry different token counts.
 *
 * Robustness: rows with sup = 0 are never read. They may hold sentinel ids (-1, -100, V) and
 * NaN/inf logits in draft, target and confidence; the results are bit-identical to the same
 * batch with clean padding and their gradients are exactly +0.0 (the rows are selected out,
 * never multiplied by zero). A SUPERVISED row must be valid: its id in [0, V) (else
 * DS_ERR_RANGE), its weight finite and >= 0 (else DS_ERR_ARG), its logits free of NaN and
 * +inf with at least one finite value, its id's draft logit finite, its confidence logit
 * finite (else DS_ERR_NUMERIC). -inf logits are allowed (probability 0). Errors name the
 * block, the slot and the row; the trainer prefixes the sequence and position with
 * ds_error_wrap. On error the outputs are unspecified.
 *
 * Memory: nothing of size [R, V] is allocated. The work is done row by row: per supervised row
 * a max pass, an exp-sum pass, then a pass producing q and p (q kept in the row's gradient
 * buffer, p in one V-float scratch per thread) and a gradient pass. Extra memory is
 * O(threads * V + R), independent of the number of blocks; nothing is stored between a
 * forward and a backward (value and gradient of a row are computed together).
 *
 * Determinism: each row is reduced in a fixed order (fixed 16-lane partial sums, combined in
 * order, double accumulation), rows are independent, and the batch sums run over rows in
 * order after the parallel part: the same inputs give the same bits for any thread count
 * and any chunk_rows. Threads (OpenMP) split the rows of a chunk. */

#ifndef DSPARK_DSPARK_LOSS_H
#define DSPARK_DSPARK_LOSS_H

#include "dspark/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Position decay of the weights (0-based slot k). */
typedef enum {
  DS_DSPARK_DECAY_DEEPSPEC = 0, /* exp(-k / decay_gamma); decay_gamma <= 0 disables (w = sup) */
  DS_DSPARK_DECAY_PAPER = 1     /* exp(-(k1 - 1) / g) with 1-based k1, = exp(-k / g) with g the
                                   block size; decay_gamma is not used */
  /* grow only at the end */
} ds_dspark_decay;

typedef struct {
  double alpha_ce;         /* 0.1 */
  double alpha_l1;         /* 0.9 */
  double alpha_conf;       /* 1.0 */
  double decay_gamma;      /* 4.0; <= 0 disables the decay in DEEPSPEC mode */
  ds_dspark_decay decay;   /* DS_DSPARK_DECAY_DEEPSPEC */
  int64_t chunk_rows;      /* rows per chunk in ds_dspark_loss (128); >= 1 */
  int has_teacher;         /* target logits given: l1, confidence, accept, tau on */
  int has_conf;            /* confidence logits given (used only with a teacher) */
} ds_dspark_loss_config;

/* The defaults above, with has_teacher = has_conf = 1. */
ds_dspark_loss_config ds_dspark_loss_config_default(void);
/* Alphas finite and >= 0, decay_gamma finite, decay mode known, chunk_rows >= 1. */
ds_status ds_dspark_loss_config_check(const ds_dspark_loss_config *cfg);
/* decay(k) for slot k (0-based) of a block of g: the weight of a supervised slot. */
double ds_dspark_loss_decay(const ds_dspark_loss_config *cfg, int64_t k, int64_t g);

/* A reduced draft vocabulary (spec section 4a): the draft predicts over S, N target ids in
 * increasing order, so its logit rows are [N] (column j is target id S[j]) while the
 * teacher's stay [V]. Per supervised row, with q = softmax over S (zero outside S) and p the
 * teacher's FULL softmax (never renormalized over S):
 *   ce     = -log q(x*)   only where x* is in S (the row's CE term is on); elsewhere no CE term
 *   l1     = sum_j |q_j - p_{S[j]}| + sum_{v not in S} p_v     (the second sum = 1 - sum_S p:
 *                                                             the exact 2 TV to the full p)
 *   accept = clamp(1 - l1 / 2, 0, 1)
 *   d/d draft_j = w alpha_ce (q_j - [S[j] == x*]) [x* in S] + w alpha_l1 q_j (s_j - sum_u q_u s_u),
 *                 s_j = sign(q_j - p_{S[j]}) (the outside mass does not depend on the draft)
 * and the CE pair becomes [sum w ce, sum w] over the rows whose CE term is on. The outside
 * mass is summed directly over the ids outside S (in the pass that normalizes p), not as
 * 1 - sum_S p, so with S = all of V in order every value and gradient is the unrestricted
 * loss's, bit for bit. */
typedef struct {
  int64_t n;            /* N = |S|, 1 .. V */
  const int32_t *ids;   /* [N] S: strictly increasing target ids in [0, V) */
  const int32_t *index; /* [V] its inverse: index[v] = j when ids[j] = v, else -1 */
} ds_dspark_vocab;

/* ids strictly increasing in [0, V) and index their exact inverse; DS_ERR_ARG naming the
 * first bad entry. The loss functions below trust a vocabulary this accepts. */
ds_status ds_dspark_vocab_check(const ds_dspark_vocab *vocab, int64_t V);

/* Reporting pairs [numerator, denominator]; reduce them by summing, divide at the end. */
typedef enum {
  DS_DSPARK_PAIR_LOSS = 0, /* [numerator, W] */
  DS_DSPARK_PAIR_CE,       /* [sum w ce, W]  (reduced vocabulary: both sums over the rows whose x* is in S) */
  DS_DSPARK_PAIR_L1,       /* [sum w l1, W]   ([0, W] without a teacher) */
  DS_DSPARK_PAIR_CONF,     /* [sum w bce, W]  ([0, W] without teacher or confidence logits) */
  DS_DSPARK_PAIR_ACCEPT,   /* [sum accept sup, sum sup]                 teacher only */
  DS_DSPARK_PAIR_TAU,      /* [sum_b tau_b valid_b, sum_b valid_b]       teacher only;
                              tau_b = sum_k cumprod_k(accept sup) + 1, valid_b = any sup in b */
  DS_DSPARK_PAIR_COUNT
} ds_dspark_pair;

/* "loss", "ce", "l1", "confidence", "accept_rate", "tau"; NULL outside the range. */
const char *ds_dspark_pair_name(int pair);

typedef struct {
  double numerator;  /* alpha_ce pair[CE][0] + alpha_l1 pair[L1][0] + alpha_conf pair[CONF][0] */
  int64_t num_tokens; /* sum sup */
  double W;          /* sum w */
  double pair[DS_DSPARK_PAIR_COUNT][2];
  int pair_present[DS_DSPARK_PAIR_COUNT]; /* ACCEPT and TAU are absent without a teacher */
} ds_dspark_loss_result;

/* acc += x (numerator, counts, every pair); presence is OR-ed. For micro-batch accumulation. */
void ds_dspark_loss_result_add(ds_dspark_loss_result *acc, const ds_dspark_loss_result *x);

/* Per-row values (each array [n] for the n rows it is given for). Rows with sup = 0, and
 * terms that are off, hold 0. */
typedef struct {
  double *ce;     /* [n] -log q(x*) */
  double *l1;     /* [n] sum |q - p| */
  double *accept; /* [n] clamp(1 - l1 / 2, 0, 1) */
  double *bce;    /* [n] BCE_with_logits(z, accept) */
  uint8_t *ce_on; /* [n] 1 where the row's CE term is on (supervised, x* in the draft's vocabulary),
                     or NULL: the core then writes nothing and the finish takes every supervised
                     row (right for a full-vocabulary draft, whose CE is on wherever sup is) */
} ds_dspark_row_stats;

/* ---- level 1: the helpers and the row-chunk core, for the trainer's fused lm_head loop ---- */

/* Supervision mask and weights of a whole batch:
 *   eval_mask [R] u8, block_keep [n_blocks] u8 (nonzero = true)  ->  sup [R] u8 (0/1), w [R]
 *   sup = eval_mask AND block_keep[b];  w = sup ? decay(k) : 0;  R = n_blocks * g. */
ds_status ds_dspark_loss_weights(const ds_dspark_loss_config *cfg, int64_t n_blocks, int64_t g,
                                 const uint8_t *eval_mask, const uint8_t *block_keep, uint8_t *sup,
                                 double *w);

/* Checks the ids of supervised rows: ids [n] int32, sup [n] u8; the n rows start at global row
 * row0 (used with g to name block and slot). DS_ERR_RANGE for the first id outside [0, V). */
ds_status ds_dspark_loss_check_ids(int64_t row0, int64_t g, int64_t n, int64_t V, const int32_t *ids,
                                   const uint8_t *sup);

/* The row-chunk core: c consecutive rows starting at global row row0 (row0 and g only name
 * block and slot in error messages). Every per-row array is chunk-local, index 0 .. c-1.
 *   draft      [c, V]  f32 draft logits (with the Markov bias)
 *   target     [c, V]  f32 target logits; required iff cfg->has_teacher, else NULL
 *   ids        [c]     int32 target ids
 *   sup        [c]     u8 supervision (from ds_dspark_loss_weights)
 *   w          [c]     weights (from ds_dspark_loss_weights)
 *   conf       [c]     f32 confidence logits; required iff cfg->has_conf, else NULL
 *   grad_scale         multiplies both gradients (the trainer passes 1 / global W)
 * Outputs, all OVERWRITTEN:
 *   rows       ce/l1/accept/bce, each [c] (required)
 *   grad_draft [c, V]  grad_scale * d numerator / d draft, or NULL to skip the gradient;
 *                      may be the same buffer as draft (the gradient replaces the logits)
 *   grad_conf  [c]     grad_scale * d numerator / d conf, or NULL; 0 where the term is off
 * Extra memory: one V-float scratch per thread and c status bytes. */
ds_status ds_dspark_loss_rows(const ds_dspark_loss_config *cfg, int64_t row0, int64_t g, int64_t c, int64_t V,
                              const float *draft, const float *target, const int32_t *ids, const uint8_t *sup,
                              const double *w, const float *conf, double grad_scale,
                              const ds_dspark_row_stats *rows, float *grad_draft, float *grad_conf);
/* The same over a reduced draft vocabulary (vocab NULL: exactly ds_dspark_loss_rows): draft and
 * grad_draft are [c, vocab->n], target stays [c, V], ids are target ids. rows->ce_on, when
 * given, says which rows' CE term is on. */
ds_status ds_dspark_loss_rows_vocab(const ds_dspark_loss_config *cfg, const ds_dspark_vocab *vocab, int64_t row0,
                                    int64_t g, int64_t c, int64_t V, const float *draft, const float *target,
                                    const int32_t *ids, const uint8_t *sup, const double *w, const float *conf,
                                    double grad_scale, const ds_dspark_row_stats *rows, float *grad_draft,
                                    float *grad_conf);

/* What a teacher row over the full V adds to its S columns (spec 4a), which depends on the
 * position alone: a trainer that keeps it per position computes the teacher's full-vocabulary
 * product once per position, and the S columns after that.
 *   max = max_v t_v; lse = log sum_v exp(t_v - max); outside = sum_{v not in S} exp(t_v - max) */
typedef struct {
  float max;
  double lse, outside;
} ds_dspark_teacher_stat;

/* t [V] -> *out (vocab NULL: outside = 0). DS_ERR_NUMERIC when t holds NaN or +inf, or no finite
 * value (the row the loss would refuse). */
ds_status ds_dspark_teacher_stats(const float *t, int64_t V, const ds_dspark_vocab *vocab, ds_dspark_teacher_stat *out);

/* ds_dspark_loss_rows_vocab with the teacher given as its S columns target_s [c, vocab->n] (read
 * where sup) and each row's stat [c] (from ds_dspark_teacher_stats on the row's full logits):
 * the same values, bit for bit, as the full rows. Requires cfg->has_teacher. */
ds_status ds_dspark_loss_rows_stats(const ds_dspark_loss_config *cfg, const ds_dspark_vocab *vocab, int64_t row0,
                                    int64_t g, int64_t c, int64_t V, const float *draft, const float *target_s,
                                    const ds_dspark_teacher_stat *stat, const int32_t *ids, const uint8_t *sup,
                                    const double *w, const float *conf, double grad_scale,
                                    const ds_dspark_row_stats *rows, float *grad_draft, float *grad_conf);

/* The finishing reduction of a whole batch, in row order (deterministic):
 *   sup [R] u8, w [R], rows (each [R], from the core)  ->  *out (overwritten),
 *   pos_accept [g] = sum_b accept[b,k] sup[b,k], pos_count [g] = sum_b sup[b,k]
 *   (both overwritten; either may be NULL; zero without a teacher). R = n_blocks * g. */
ds_status ds_dspark_loss_finish(const ds_dspark_loss_config *cfg, int64_t n_blocks, int64_t g,
                                const uint8_t *sup, const double *w, const ds_dspark_row_stats *rows,
                                ds_dspark_loss_result *out, double *pos_accept, double *pos_count);

/* ---- level 2: a whole batch in one call (CLI, tests, users) ---- */

typedef struct {
  const float *draft_logits;  /* [R, V] */
  const float *target_logits; /* [R, V], NULL without a teacher (must match cfg->has_teacher) */
  const int32_t *target_ids;  /* [R] */
  const uint8_t *eval_mask;   /* [R] */
  const uint8_t *block_keep;  /* [n_blocks] */
  const float *conf_logits;   /* [R], NULL without confidence (must match cfg->has_conf) */
  const ds_dspark_vocab *vocab; /* NULL: the draft predicts over V; else draft_logits (and
                                   grad_draft) are [R, vocab->n] (section 4a) */
} ds_dspark_loss_inputs;

/* Loss, pairs, per-position acceptance and gradients of a batch of n_blocks blocks of g slots,
 * over a vocabulary of V (the draft's rows over in->vocab when given, checked first). Validates every supervised id first (nothing is written on that
 * error), then runs the core over chunks of cfg->chunk_rows rows and finishes. Extra memory
 * O(threads * V + R). Outputs as in ds_dspark_loss_rows / ds_dspark_loss_finish:
 *   out (overwritten), pos_accept [g] / pos_count [g] (or NULL),
 *   grad_draft [R, V] (or NULL; may alias in->draft_logits), grad_conf [R] (or NULL),
 *   rows: the per-row values, each [R] (or NULL). */
ds_status ds_dspark_loss(const ds_dspark_loss_config *cfg, int64_t n_blocks, int64_t g, int64_t V,
                         const ds_dspark_loss_inputs *in, double grad_scale, ds_dspark_loss_result *out,
                         double *pos_accept, double *pos_count, float *grad_draft, float *grad_conf,
                         const ds_dspark_row_stats *rows);

#ifdef __cplusplus
}
#endif
#endif
