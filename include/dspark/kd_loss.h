/* The distillation objective (spec/kd.md sections 2-3): the sparse "ghost token" KL of a student
 * against a teacher's captured top-K / top-p log-probs (or the dense KL against live teacher
 * logits), fused with the student's language-model cross-entropy, with the gradient w.r.t. the
 * student logits, the reporting pairs, the intermediate-loss balancer and the configuration
 * checks.
 *
 * Per row (one token position): student logits s [V] (fp32); the teacher as either
 *   sparse   ids [K] int32 and lq [K] fp32: the teacher's top-K ids with their FULL-vocabulary
 *            log-probs, as `dspark capture --topk` writes them (dspark/cache.h): sorted
 *            descending, the kept entries a prefix, dropped entries the sentinel id -1 (the id
 *            is authoritative; the value there is never read);
 *   dense    teacher logits t [V] (fp32), a live teacher without top-K;
 * a label (the next token, int32) and a loss-mask byte (nonzero = supervised).
 *
 * Math, per supervised row (T = temperature, eps = FLT_EPSILON = 1.1920929e-7):
 *   P = log_softmax(s / T) over the full vocabulary                    the student, always full
 *   sparse: n = the kept prefix (ids != -1), then the training-time top-p rule on it:
 *           n' = ds_kd_top_p_count(lq, n, top_p, min_k) (dspark/kd_select.h, the capture's own
 *           rule; top_p = 1 keeps all n). For i < n': q_i = lq_i, p_i = P[id_i]; then
 *     Lq = min(logsumexp_i q_i, -eps)   Lp = min(logsumexp_i p_i, -eps)
 *     gq = log(-expm1(Lq))              gp = log(-expm1(Lp))        (ds_kd_ghost_log_mass)
 *     forward  kd = sum_i e^q_i (q_i - p_i) + e^gq (gq - gp)
 *     reverse  kd = sum_i e^p_i (p_i - q_i) + e^gp (gp - gq)         (--reverse: p, q swapped)
 *     K+1 buckets (the kept ids and the "ghost" rest of the vocabulary) whose probabilities sum
 *     to 1 on each side; no T^2 factor. The teacher's log-probs are used as given: they carry
 *     the capture's temperature, T applies to the student.
 *   dense:  q = log_softmax(t / T) over the full vocabulary, kd = sum_v e^q_v (q_v - P_v)
 *           (reverse: sum_v e^P_v (P_v - q_v)); terms with zero probability on the weighting
 *           side are 0.
 *   lm = -log_softmax(s)[label]       the LM cross-entropy, at temperature 1 whatever T is
 *   total = (1 - alpha) lm + alpha kd,  alpha = kd_loss_alpha in [0, 1]
 *   alpha = 1: lm is not computed at all (labels are not read and may be NULL);
 *   alpha = 0: kd is not computed at all (no teacher input is read; may be NULL): plain LM
 *   training, the pretraining objective.
 * The clamp pins a kept mass above 1 - eps: the ghost bucket then holds about eps, its term can
 * make kd dip below 0 by O(eps), and it sends no gradient (the clamp's derivative is 0 there,
 * as torch.clamp's is). Computing the rest as log(1 - sum e^q) with a floor instead loses the
 * term to rounding at K = 1024, where the kept mass exceeds 0.9999; log(-expm1(.)) does not.
 * With K = V (everything kept) kd equals the dense KL to about 1e-6.
 * no_ghost (an ablation, to measure what the ghost bucket is worth; not kd.md's loss): p^_i =
 * p_i - logsumexp(p), q^_i = q_i - logsumexp(q) over the n kept entries, kd = sum_i e^q^_i
 * (q^_i - p^_i) (reverse: sum_i e^p^_i (p^_i - q^_i)); g_i = e^p^_i - e^q^_i (reverse
 * e^p^_i (p^_i - q^_i - kd)), so sum_i g_i = 0: the mass outside the kept ids gets no gradient.
 *
 * Gradient of the numerator w.r.t. s (teacher detached), with g_i = d kd / d p_i:
 *   forward  g_i = -e^q_i + [Lp unclamped] e^gq e^(p_i - gp)
 *   reverse  g_i = e^p_i (p_i - q_i + 1) - [Lp unclamped] e^p_i (gp - gq + 1)
 *   d kd / d s_v = (1/T) (g(v) [v kept] - softmax(s/T)_v sum_i g_i)
 *   dense forward  (1/T)(softmax(s/T)_v - e^q_v);  dense reverse (1/T) e^P_v (P_v - q_v - kd)
 *   d lm / d s_v = softmax(s)_v - [v == label]
 *   d numerator / d s = alpha d kd / d s + (1 - alpha) d lm / d s  (per supervised row)
 *
 * Normalization: the functions return the UNNORMALIZED numerator (sum over supervised rows of
 * the total) and the token count. The caller divides by the GLOBAL token count over all
 * micro-batches and data-parallel ranks, i.e. passes grad_scale = 1 / global tokens, exactly as
 * for the DSpark loss (dspark/dspark_loss.h).
 *
 * Inputs a supervised row must satisfy (each refusal names the tensor by its `dspark kd-loss`
 * name, the row and the entry; the trainer prefixes sequence and position with ds_error_wrap):
 *   student_logits  no NaN or +inf, at least one finite value (-inf is a probability of 0);
 *                   finite at the label (else the CE is infinite: DS_ERR_NUMERIC) and, for the
 *                   forward KL, at every kept id with teacher mass (else kd is infinite)
 *   topk_ids        each in [0, V) or -1; the kept entries a prefix of at least one entry,
 *                   pairwise distinct (DS_ERR_RANGE / DS_ERR_ARG)
 *   topk_logprobs   finite at kept entries, non-increasing along the prefix when top_p < 1
 *                   (the order the rule reads), kept mass exp(logsumexp) <= 1.1 (above that the
 *                   values are logits, not log-probs) (DS_ERR_NUMERIC / DS_ERR_ARG)
 *   teacher_logits  no NaN or +inf, at least one finite value
 *   labels          in [0, V) (DS_ERR_RANGE)
 * Robustness: rows with mask 0 are never read. They may hold sentinel ids and labels, NaN and
 * infinities anywhere; the results are bit-identical to the same batch with clean padding and
 * their gradient rows are exactly +0.0 (selected out, never multiplied by zero). On error the
 * outputs are unspecified.
 *
 * Memory: nothing of size [rows, V] is allocated. Per supervised row: a max pass, a sum-exp
 * pass (one exp per logit; two when T != 1 and lm is on, for the two normalizers), the O(K)
 * sparse part, and a gradient pass writing the row once (dense reverse reads a fourth time).
 * Extra memory: V bytes and 2 K doubles per thread (sparse only: duplicate-id marks, the kept
 * entries' log-probs and gradients) plus O(rows) for the per-row values.
 *
 * Determinism: each row is reduced in a fixed order (16 fixed lanes summed in double, then in
 * lane order), rows are independent, and batch sums run over rows in order after the parallel
 * part: the same inputs give the same bits for any thread count and any chunk_rows. Threads
 * (OpenMP) split the rows of a chunk. */
#ifndef DSPARK_KD_LOSS_H
#define DSPARK_KD_LOSS_H

#include "dspark/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The ghost clamp: FLT_EPSILON, the machine epsilon of the fp32 compute dtype. */
#define DS_KD_GHOST_EPS 1.1920928955078125e-7
/* The migration hint of the removed options skip_lm_loss and kd_loss_scale. */
#define DS_KD_REMOVED_OPTION_HINT "use --kd-loss-alpha (1.0 reproduces skip_lm_loss=true)"

typedef struct {
  double kd_loss_alpha; /* 1.0: total = (1 - alpha) lm + alpha kd; in [0, 1] */
  double temperature;   /* 1.0: T > 0, applied to the student (and dense teacher) logits */
  int64_t top_k;        /* entries used per row (the leading top_k of each row's k_stride); 0: dense KL
                           against teacher logits (a live teacher without top-K) */
  double top_p;         /* 1.0 (off): the training-time top-p on the kept prefix; in (0, 1] */
  int64_t min_k;        /* 1: the top-p rule's floor, >= 1 */
  int reverse;          /* 0: KL(teacher || student); 1: KL(student || teacher), ghost included */
  int no_ghost;         /* 0 (kd.md): the K+1-bucket KL. 1, an ablation only (--no-ghost): both sides
                           renormalized over the kept entries, the KL over K buckets (see below) */
  int64_t chunk_rows;   /* 128: rows per chunk in ds_kd_loss; >= 1 */
} ds_kd_loss_config;

/* The defaults above (sparse with top_k 0 is dense: set top_k for a cache). */
ds_kd_loss_config ds_kd_loss_config_default(void);
/* kd.md section 3, each refusal (DS_ERR_ARG) naming the option as the CLI spells it:
 * --kd-loss-alpha outside [0, 1]; --temperature <= 0; --top-p outside (0, 1]; --top-p < 1
 * without --topk (dense); --min-k < 1; --topk < 0 or > vocab (vocab <= 0: not checked yet);
 * --chunk-rows < 1. NaN is outside every range. */
ds_status ds_kd_loss_config_check(const ds_kd_loss_config *cfg, int64_t vocab);
/* The options kd.md section 3 removed: `arg` (a command-line argument such as
 * "--kd-loss-scale", "--skip_lm_loss" or "--kd-loss-scale=2", or a config key such as
 * "skip_lm_loss") is one of --skip-lm-loss / --kd-loss-scale in either spelling: DS_ERR_ARG
 * naming it with DS_KD_REMOVED_OPTION_HINT. Anything else: DS_OK. CLIs call it on every
 * argument they do not know and exit 2 on an error. */
ds_status ds_kd_check_removed_option(const char *arg);

/* log(1 - exp(min(log_kept_mass, -DS_KD_GHOST_EPS))): the log of the ghost bucket's mass,
 * computed without cancellation as log(-expm1(.)). -inf (nothing kept) gives 0. */
double ds_kd_ghost_log_mass(double log_kept_mass);

/* ---- intermediate-layer losses (kd.md section 3): the balancer's scalar arithmetic ---- */

typedef struct {
  double intermediate; /* I = the mean of the n intermediate losses (0 when n = 0) */
  double scale;        /* (I > 0) ? |logits_kd| / max(I, FLT_MIN) : 0, detached */
  double kd;           /* logits_kd + I * scale */
  double total;        /* (1 - alpha) lm + alpha kd */
  /* d total / d input with the scale detached, for the backward of each term: */
  double w_lm;           /* 1 - alpha */
  double w_logits_kd;    /* alpha */
  double w_intermediate; /* alpha * scale / n: per intermediate loss (0 when n = 0) */
} ds_kd_balance;

/* lm, logits_kd: the step's normalized LM and logits-KD losses; inter [n]: the intermediate
 * losses (cosine or mse, each already averaged). alpha outside [0, 1] (DS_ERR_ARG, naming
 * --kd-loss-alpha) or a non-finite input (DS_ERR_NUMERIC, naming it) is refused. */
ds_status ds_kd_balance_losses(double alpha, double lm, double logits_kd, const double *inter, int64_t n,
                               ds_kd_balance *out);

/* ---- reporting ---- */

/* Reporting pairs [numerator, denominator]; reduce by summing, divide at the end. */
typedef enum {
  DS_KD_PAIR_LOSS = 0, /* [numerator, tokens] */
  DS_KD_PAIR_KD,       /* [sum kd, tokens]   absent when alpha = 0 (not computed) */
  DS_KD_PAIR_LM,       /* [sum lm, tokens]   absent when alpha = 1 (not computed) */
  DS_KD_PAIR_COUNT
} ds_kd_pair;

/* "loss", "kd", "lm"; NULL outside the range. */
const char *ds_kd_pair_name(int pair);

typedef struct {
  double numerator;   /* (1 - alpha) pair[LM][0] + alpha pair[KD][0] (a term not computed adds nothing) */
  int64_t num_tokens; /* supervised rows */
  double pair[DS_KD_PAIR_COUNT][2];
  int pair_present[DS_KD_PAIR_COUNT];
} ds_kd_loss_result;

/* acc += x (numerator, count, every pair); presence is OR-ed. For micro-batch accumulation. */
void ds_kd_loss_result_add(ds_kd_loss_result *acc, const ds_kd_loss_result *x);

/* ---- the inputs of a set of rows ---- */

typedef struct {
  const float *student;    /* [n, V] student logits */
  const int32_t *topk_ids; /* [n, k_stride] sparse teacher ids (top_k > 0), else NULL */
  const float *topk_lp;    /* [n, k_stride] their full-vocabulary log-probs (top_k > 0), else NULL */
  int64_t k_stride;        /* entries stored per row (>= top_k; e.g. the cache's K) */
  const float *teacher;    /* [n, V] teacher logits (top_k = 0), else NULL */
  const int32_t *labels;   /* [n] next-token ids; required iff alpha < 1 */
  const uint8_t *mask;     /* [n] nonzero = supervised */
} ds_kd_rows_in;

/* ---- level 1: the row-chunk core, for the trainer's fused lm_head loop ----
 *
 * How an objective (distill, pretrain) uses it, per micro-batch of R rows, with
 * N = the supervised rows of the whole step (all micro-batches and ranks, counted from the masks
 * before any backward):
 *   for each chunk of c rows starting at r0:
 *     logits [c, V] = lm_head(hidden rows)                                  (GEMM)
 *     ds_kd_loss_rows(cfg, r0, c, V, &in, 1.0 / N, kd + r0, lm + r0, logits)
 *         `in` points at the chunk's rows (topk rows of the cache with k_stride = its K, or the
 *         live teacher's logits; labels; mask); the gradient replaces the logits in place
 *     d hidden = logits_grad @ lm_head, d lm_head += logits_grad^T @ hidden  (GEMMs)
 *   ds_kd_loss_finish(cfg, R, mask, kd, lm, &res)        once per micro-batch, rows in order
 *   ds_kd_loss_result_add(&step, &res)                   over micro-batches (and ranks)
 *   report step.pair[i][0] / step.pair[i][1]; loss = step.numerator / N
 * Pretraining is cfg.kd_loss_alpha = 0 with every teacher pointer NULL. Memory: one chunk of
 * logits [c, V]; nothing else of size V per row. */

/* c consecutive rows starting at global row row0 (used in messages only); every pointer of
 * `in` is chunk-local (row 0 .. c-1). Teacher inputs are read only when alpha > 0, labels only
 * when alpha < 1. grad_scale multiplies the gradient (the trainer passes 1 / global tokens).
 * Outputs, all OVERWRITTEN:
 *   kd [c], lm [c]      per-row kd and lm (0 at unsupervised rows and for a term not computed);
 *                       either may be NULL when not wanted
 *   grad [c, V]         grad_scale * d numerator / d student, or NULL to skip the gradient;
 *                       may be the same buffer as in->student (the gradient replaces the logits)
 * Extra memory: V bytes and 2 K doubles per thread (sparse only) and c status entries. */
ds_status ds_kd_loss_rows(const ds_kd_loss_config *cfg, int64_t row0, int64_t c, int64_t V, const ds_kd_rows_in *in,
                          double grad_scale, double *kd, double *lm, float *grad);

/* The finishing reduction in row order (deterministic): mask [R], kd [R], lm [R] (from the
 * core) -> *out (overwritten). kd / lm may be NULL only for a term that is not computed. */
ds_status ds_kd_loss_finish(const ds_kd_loss_config *cfg, int64_t R, const uint8_t *mask, const double *kd,
                            const double *lm, ds_kd_loss_result *out);

/* ---- level 2: a whole batch in one call (CLI, tests, users) ---- */

/* R rows over a vocabulary of V: runs the core over chunks of cfg->chunk_rows rows, then
 * finishes. Outputs as in the core: *out (overwritten), kd [R] / lm [R] (or NULL), grad [R, V]
 * (or NULL; may alias in->student). Extra memory O(threads * V + R). */
ds_status ds_kd_loss(const ds_kd_loss_config *cfg, int64_t R, int64_t V, const ds_kd_rows_in *in, double grad_scale,
                     ds_kd_loss_result *out, double *kd, double *lm, float *grad);

#ifdef __cplusplus
}
#endif
#endif
