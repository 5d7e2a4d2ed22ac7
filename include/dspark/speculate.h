/* Lossless speculative decoding with a DSpark draft (spec/dspark.md section 8).
 *
 * One request: the prompt is prefilled once (the target's captured rows of the draft's
 * target_layer_ids go into the draft's context); then per round, with the last committed
 * token x_s at position s (not yet run by the target):
 *   1. one draft backbone pass over [x_s, M, ..., M] at s .. s+g-1;
 *   2. the sequential head left to right: slot k's logits are the base logits plus the Markov
 *      bias of the token chosen at slot k-1 (x_s for the first), x_k drawn from
 *      q_k = the sampling distribution (temperature, top-p) of those logits, greedy = argmax;
 *      the policy decides how many slots L to propose (fixed, until the cumulative
 *      confidence falls below a threshold, or the prefix scheduler over the batch, see
 *      spec_schedule.h);
 *   3. one target pass over [x_s, x_1 .. x_L] with its KV cache gives p_0 .. p_L;
 *   4. x_k is accepted with probability min(1, p_{k-1}(x_k) / q_k(x_k)) (greedy: when it is
 *      the target's argmax); at the first rejection the replacement is drawn from
 *      normalize(max(0, p_{k-1} - q_k)) (p_{k-1} when that mass is ~0); after L acceptances a
 *      bonus token is drawn from p_L;
 *   5. the target's cache keeps x_s .. x_j (the accepted prefix), the draft's context takes
 *      their captured rows, and the replacement / bonus token becomes the next x_s.
 * A stop token inside the committed tokens ends generation there. The output distribution is
 * the target's own (greedy: token-for-token what plain decoding gives).
 *
 * Reporting convention (docs/speculative-decoding.md "Speculative decoding"): tau = tokens committed per target
 * verification pass, the bonus / replacement token counted; acceptance per draft position is
 * given conditional (accepted / proposed at that position, i.e. given the earlier ones were)
 * and unconditional (accepted / rounds). */
#ifndef DSPARK_SPECULATE_H
#define DSPARK_SPECULATE_H

#include "dspark/common.h"
#include "dspark/draft.h"
#include "dspark/target.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DS_SPEC_FIXED = 0, DS_SPEC_THRESHOLD, DS_SPEC_SCHEDULER } ds_spec_policy;

enum { DS_SPEC_MAX_LEN = 64 };
/* The longest suffix prompt lookup matches (ds_spec_options.lookup). */
enum { DS_SPEC_LOOKUP_MAX = 4 };
/* The largest pass (rows of a batch's verification) whose cost a run learns. */
enum { DS_SPEC_LEARN_ROWS = 64 };

/* What a run learns as it decodes, for the scheduler and the lookups: per position, how often
 * each source's proposals were accepted, and what the confidences predicted there against what
 * was accepted. A caller that passes the same object to every call (ds_spec_options.learned;
 * zeroed before the first) carries it from request to request, as a server would over its
 * lifetime, so that a request does not start from coin flips: the draft's and the lookups'
 * rates are the pair's and the data's, not one request's. */
typedef struct {
  double seen_prop[DS_SPEC_MAX_LEN], seen_acc[DS_SPEC_MAX_LEN];     /* the draft's proposals */
  double lk_prop[DS_SPEC_MAX_LEN], lk_acc[DS_SPEC_MAX_LEN];         /* prompt lookup's */
  double pred_sum[DS_SPEC_MAX_LEN], pred_acc[DS_SPEC_MAX_LEN];      /* the confidences', where reached */
  double corpus_pred[DS_SPEC_MAX_LEN], corpus_acc[DS_SPEC_MAX_LEN]; /* corpus lookup's estimates, where reached */
  double draft_sum_s;                                               /* measured draft blocks: their mean cost */
  int64_t draft_blocks;
  /* the verification passes of B rows (B = 1 .. DS_SPEC_LEARN_ROWS, index B - 1; the batch's
   * rows) and their seconds (the pass with its eager logits): the scheduler's costs as the loop
   * sees them (ds_spec_loop_costs) */
  double passes[DS_SPEC_LEARN_ROWS], pass_s[DS_SPEC_LEARN_ROWS];
} ds_spec_learned;

typedef struct {
  int64_t max_new_tokens;  /* 64 */
  double temperature;      /* 0 = greedy */
  double top_p;            /* 1 = off */
  uint64_t seed;
  /* Per-request seeds of a batch: request i samples with seeds[i] (NULL: seed + i). Lets a
   * caller give a request the same stream whatever batch it lands in (`dspark regenerate`). */
  const uint64_t *seeds;
  int ignore_eos;
  ds_spec_policy policy;   /* fixed */
  int64_t draft_len;       /* L for the fixed policy, the most for the others (default: the block size) */
  double threshold;        /* threshold policy: propose while prod sigmoid(conf) >= threshold (0.5) */
  int test_bias;           /* testing aid: accept every draft token (breaks losslessness on purpose) */
  /* Sequential Temperature Scaling (spec_schedule.h): confidence at position k =
   * sigmoid(logit / calibration[k]); NULL (or positions past n_calibration): T = 1. */
  const double *calibration;
  int64_t n_calibration;
  /* The scheduler policy (prefix scheduler, spec_schedule.h): every request drafts its whole
   * block, then one schedule over the batch picks each request's length to maximize the
   * expected tokens per second, priced by verify_s[B-1] = seconds of a target pass verifying
   * B tokens (B = 1 .. n_verify) and draft_block_s = seconds of one request's draft block
   * (<= 0: the mean measured in this run). A request whose expected gain over plain decoding
   * is below 1 stops drafting (plain rounds, same output) and tries again after a back-off.
   * Without the confidence head the survival probabilities are this run's acceptance rates. */
  const double *verify_s;
  int64_t n_verify;
  const double *head_s; /* head_s[n-1] = the logits of n rows after a request's first (spec_schedule.h); may be NULL */
  int64_t n_head;
  double draft_block_s;
  /* 1: the scheduler prices with verify_s as given; 0 (default): corrected by the passes the
   * loop has timed (ds_spec_loop_costs), so its picks follow this host's moment */
  int profile_costs;
  /* Prompt lookup: before the draft, the latest earlier occurrence in the request's prompt and
   * output of its last m tokens (m from DS_SPEC_LOOKUP_MAX down to lookup) proposes the tokens
   * that followed it, each a point mass, and the draft's block is not run that round; 0 = off.
   * A small target repeats its prompt and itself, which costs nothing to look up. The scheduler
   * prices such proposals by this run's acceptance of them, tries them while it has switched
   * the draft off, and otherwise lets them go first while their first position is accepted at
   * least as often as the draft's; the other policies propose them wherever they occur. */
  int64_t lookup;
  /* Corpus lookup (include/dspark/ngram.h; NULL = off): after prompt lookup finds nothing, the
   * table's continuation of the request, each token a point mass, while the product of its
   * estimates stays above 0.1. The scheduler prices them by those estimates, corrected by this
   * run's acceptance of them as the confidences are, and while the draft runs lets them go first
   * only where the first token's chance is at least the draft's first-position acceptance so far. */
  const struct ds_ngram *corpus;
  /* Carried statistics (ds_spec_learned), read and updated by the call; NULL: the call starts
   * from none. They decide the proposals' lengths and sources, never the output's distribution:
   * greedy output is the same either way; sampled output is drawn from the same distribution, but
   * its tokens follow the acceptance draws, so a request sampled after others may differ from
   * the same request sampled first. */
  ds_spec_learned *learned;
  /* Called after each request's round with the confidence logits of the slots drafted
   * (conf [n_conf], NAN without the confidence head), the tokens proposed and accepted; may
   * be NULL. Setting it makes every policy compute the confidences. */
  void (*on_round)(void *user, int request, const float *conf, int64_t n_conf, int64_t n_prop, int64_t n_acc);
  void *round_user;
  /* Called after each committed token with all generated ids so far (streaming output); may be NULL. */
  void (*on_token)(void *user, const int32_t *ids, int64_t n);
  void *user;
} ds_spec_options;

void ds_spec_options_default(ds_spec_options *o);

typedef struct {
  int32_t *ids;                          /* generated tokens (malloc'd), n of them */
  int64_t n;
  int stopped;                           /* 1: a stop token ended generation */
  int64_t rounds;                        /* target verification passes after the prefill */
  int64_t proposed;                      /* draft tokens proposed over all rounds */
  double pos_proposed[DS_SPEC_MAX_LEN];  /* rounds that proposed a token at position k */
  double pos_accepted[DS_SPEC_MAX_LEN];  /* ... and accepted it */
  int64_t committed_hist[DS_SPEC_MAX_LEN + 2]; /* rounds that committed c tokens, c = 1 .. L + 1 */
  double prefill_s, draft_s, verify_s, total_s;
  int64_t steps;                         /* verification passes of the whole batch (the same in every result) */
  int64_t plain_rounds;                  /* rounds the scheduler decoded plainly (speculation switched off) */
  int64_t switched_off;                  /* times the scheduler switched speculation off for the request */
  /* prompt lookup's rounds and tokens (ds_spec_options.lookup); the fields above from proposed
   * to pos_accepted count the draft's proposals only */
  int64_t lookup_rounds, lookup_proposed, lookup_accepted;
  int64_t corpus_rounds, corpus_proposed, corpus_accepted; /* corpus lookup's (ds_spec_options.corpus) */
  /* the verification passes by the rows this request had in them, B = 1 .. L + 1 at index B - 1,
   * and their seconds (the batch's pass, with its lazy logits): what a pass costs in the loop */
  int64_t passes_by_rows[DS_SPEC_MAX_LEN + 1];
  double pass_s_by_rows[DS_SPEC_MAX_LEN + 1];
} ds_spec_result;

/* Plain decoding with the target alone (what `dspark generate` runs): prefill once, then one
 * token per forward through the KV cache; the same options (draft fields unused). The result's
 * rounds count the decode forwards; prefill_s and total_s are timed. */
ds_status ds_generate(ds_target *target, const int32_t *prompt, int64_t n_prompt, const ds_spec_options *o,
                      ds_spec_result *r);
/* R requests decoded together: one target forward per step over every unfinished request's
 * new token (each request its own KV cache and length). Request i samples with seed + i (or
 * seeds[i]). The timings of every result are the batch's. */
ds_status ds_generate_batch(ds_target *target, const int32_t *const *prompts, const int64_t *n_prompts, int R,
                            const ds_spec_options *o, ds_spec_result *results);
/* Continuous batching: up to max_batch requests decode together, and a request that finishes
 * frees its place at once for the next one, whose prompt is prefilled in the same forward as
 * the other requests' next tokens. A request's tokens are those ds_generate gives for its prompt
 * and seed (the rows of one forward do not mix). Its result's prefill_s is the forward that
 * prefilled it, verify_s the decoding forwards it took part in, total_s from its admission. */
typedef struct {
  /* 1 with the next request (its prompt, valid until done() is called for it, its sampling
   * seed and the caller's tag), or 0 when there is none: the stream ends once no request runs
   * and next() has none; it is asked again as places free up. */
  int (*next)(void *user, const int32_t **prompt, int64_t *n_prompt, uint64_t *seed, int64_t *tag);
  /* A finished request, in the order they finish; *r is the callee's (ds_spec_result_free). A
   * status other than DS_OK ends the stream with it. */
  ds_status (*done)(void *user, int64_t tag, ds_spec_result *r);
  void *user;
} ds_gen_stream;
ds_status ds_generate_stream(ds_target *target, int max_batch, const ds_spec_options *o, const ds_gen_stream *s);

/* Decodes one request. target and draft must agree (vocabulary, hidden size, the draft's
 * target layers capturable). */
ds_status ds_speculate(ds_target *target, ds_draft *draft, const int32_t *prompt, int64_t n_prompt,
                       const ds_spec_options *o, ds_spec_result *r);
/* R requests as one batch: per round every unfinished request proposes its tokens (its own
 * draft state), then ONE target pass verifies all requests' candidates (each its own KV cache
 * and length); acceptance, commits and crops per request. Request i samples with seed + i (or
 * seeds[i]); the timings of every result are the batch's. */
ds_status ds_speculate_batch(ds_target *target, ds_draft *draft, const int32_t *const *prompts, const int64_t *n_prompts,
                             int R, const ds_spec_options *o, ds_spec_result *results);
void ds_spec_result_free(ds_spec_result *r);
/* tau = committed tokens / verification passes (bonus counted). */
double ds_spec_tau(const ds_spec_result *r);

#ifdef __cplusplus
}
#endif
#endif
