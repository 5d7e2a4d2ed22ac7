/* Lossless speculative decoding of one request with a DSpark draft (include/dspark/speculate.h,
 * spec/dspark.md section 8). The target's KV cache and the draft's context state are cropped
 * to the committed prefix after every round; the target, the draft's kernels and the sampling
 * rule are the ones `generate` and training use, never copies. */
#include "dspark/speculate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/ngram.h"
#include "dspark/rng.h"
#include "dspark/sampling.h"
#include "dspark/spec_schedule.h"

void ds_spec_options_default(ds_spec_options *o) {
  memset(o, 0, sizeof *o);
  o->max_new_tokens = 64;
  o->top_p = 1.0;
  o->policy = DS_SPEC_FIXED;
  o->threshold = 0.5;
}

void ds_spec_result_free(ds_spec_result *r) {
  free(r->ids);
  r->ids = NULL;
  r->n = 0;
}

double ds_spec_tau(const ds_spec_result *r) {
  int64_t committed = 0;
  for (int c = 1; c < DS_SPEC_MAX_LEN + 2; c++) committed += (int64_t)c * r->committed_hist[c];
  return r->rounds > 0 ? (double)committed / (double)r->rounds : 0.0;
}

/* One request's state. */
typedef struct {
  ds_kv_cache *kv;
  ds_draft_state *st;
  ds_rng rng;
  ds_spec_result *r;
  int32_t xs;             /* the last committed token, not yet run by the target */
  int done;
  int64_t n_prop;         /* tokens proposed this round */
  int lookup;             /* ... by a lookup (point masses, no draft distributions in q): LOOKUP_* */
  const int32_t *prompt;  /* [n_prompt] the prompt, the start of what lookup searches */
  int64_t n_prompt;
  int32_t toks[DS_SPEC_MAX_LEN + 1]; /* [x_s, x_1 .. x_L] (target ids) */
  float *q;               /* [g, N] the draft's sampling distributions of the proposed tokens, over its
                             N columns (a reduced vocabulary's S; N = V without one) */
  int64_t row0;           /* its first row in the batch's target pass */
  int64_t rows;           /* its rows in this round's pass (0: it had finished) */
  int rest;               /* the logits of its rows after the first are in tlogits */
  float conf[DS_SPEC_MAX_LEN];      /* confidence logits of the slots drafted this round (NAN: none) */
  double share[DS_SPEC_MAX_LEN];    /* a corpus lookup's estimates (ds_ngram_propose) */
  int64_t n_conf;                   /* slots drafted (the scheduler drafts more than it proposes) */
  double survive[DS_SPEC_MAX_LEN];  /* scheduler: P(slots 0..k all accepted) */
  int64_t off_until;                /* scheduler: plain rounds until this batch step */
  int64_t backoff;                  /* scheduler: plain rounds after the next switch-off */
  float *pend;                      /* [n_pend, m*d] captured rows the draft's context has not taken yet */
  int64_t n_pend, cap_pend;
} request;

typedef struct {
  ds_target *target;
  ds_draft *draft;
  const ds_spec_options *o;
  const ds_model_config *tc;
  const ds_draft_config *dc;
  int64_t V, N, g, md;   /* N: the draft's logit columns */
  const int32_t *vocab_ids, *vocab_index; /* a reduced draft vocabulary: S [N], its inverse [V]; else NULL */
  int R;
  request *req;
  ds_target_seq *seqs;   /* [R] */
  float *ctx;            /* [rows, m*d] captured target rows of a pass */
  float *tlogits;        /* [rows, V] the target's logits of a pass: a request's first row from the
                            pass, the others (ds_target_logits) once its first proposal is accepted */
  float *fh, *first;     /* [rows, d] final-normed hidden states of a pass; [R, V] its first rows' logits */
  int64_t *first_rows;   /* [R], with lookup [R * (g + 1)]: the rows whose logits a pass computes */
  double head_s;         /* this round's seconds in ds_target_logits (verification, done lazily) */
  double *verify;        /* [n_verify] the scheduler's verification costs (ds_spec_loop_costs) */
  int64_t *len, *n_cand; /* [R] the scheduler's: each request's admitted length and candidates, */
  const double **a;      /* their survivals, */
  int *eager;            /* whether their rows are eager (rows_eager); made once, not a round */
  float *h, *dlogits;    /* [g, d], [g, N] a draft block */
  float *p, *resid;      /* [V] */
  void *scratch;
  int64_t step;                      /* batch rounds so far */
  /* what the run learns (ds_spec_learned): the caller's object, carried across calls, or own */
  ds_spec_learned *learn, own;
} run;

enum { SCHED_BACKOFF_FIRST = 4, SCHED_BACKOFF_MAX = 64 };
/* Where a round's proposal comes from: the draft, prompt lookup, the corpus table. */
enum { LOOKUP_NONE = 0, LOOKUP_PROMPT, LOOKUP_CORPUS };
/* A corpus lookup stops where the product of its estimates falls below this: under the fixed
 * policy nothing else cuts it, and every row of a lookup costs its logits. */
#define CORPUS_MIN_CHAIN 0.1
/* The scheduler trusts the calibration as much as this many rounds of its own outcomes. */
enum { SCHED_PRIOR_ROUNDS = 4 };

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* P(slot k accepted | the earlier ones were) from its confidence logit, calibrated when a
 * temperature is given for k. */
static double confidence(const ds_spec_options *o, int64_t k, float logit) {
  double T = o->calibration && k < o->n_calibration ? o->calibration[k] : 1.0;
  return sigmoid((double)logit / T);
}

/* Appends a token; returns 1 when generation ends with it (a stop token, or the budget). */
static int commit(run *u, request *q, int32_t tok) {
  ds_spec_result *r = q->r;
  if (r->n >= u->o->max_new_tokens) return 1;
  r->ids[r->n++] = tok;
  if (u->o->on_token) u->o->on_token(u->o->user, r->ids, r->n);
  if (!u->o->ignore_eos && ds_config_is_stop_token(u->tc, tok)) {
    r->stopped = 1;
    return 1;
  }
  return r->n >= u->o->max_new_tokens;
}

/* Draws from probs [n] (greedy: its argmax, which is where the one-hot sits). */
static int32_t draw_n(run *u, request *q, const float *probs, int64_t n) {
  return u->o->temperature > 0 ? ds_sample_probs(probs, n, 1.0, &q->rng) : ds_argmax(probs, n);
}

static int32_t draw(run *u, request *q, const float *probs) { return draw_n(u, q, probs, u->V); }

static void probs_of_n(run *u, const float *logits, float *probs, int64_t n) {
  ds_sampling_probs(logits, n, (float)u->o->temperature, (float)u->o->top_p, probs, u->scratch);
}

static void probs_of(run *u, const float *logits, float *probs) { probs_of_n(u, logits, probs, u->V); }

/* q_k(v) of a target id v: the draft's probability, 0 outside a reduced vocabulary (spec 4a, 8). */
static float draft_prob(const run *u, const float *qk, int32_t v) {
  if (!u->vocab_index) return qk[v];
  int32_t j = u->vocab_index[v];
  return j >= 0 ? qk[j] : 0.0f;
}

/* The draft's context takes the captured rows of q's committed tokens. While speculation is
 * switched off (the next round is plain) they wait in q->pend and go in with the next drafted
 * round as one product: a row at a time would read the draft's fc and K/V weights once per
 * token for a context nobody reads yet. */
static ds_status context_flush(run *u, request *q) {
  if (!q->n_pend) return DS_OK;
  DS_TRY(ds_draft_state_append(u->draft, q->st, q->pend, q->n_pend));
  q->n_pend = 0;
  return DS_OK;
}

static ds_status context_rows(run *u, request *q, const float *rows, int64_t n, int defer) {
  if (!defer) {
    DS_TRY(context_flush(u, q));
    return ds_draft_state_append(u->draft, q->st, rows, n);
  }
  if (q->n_pend + n > q->cap_pend) {
    int64_t cap = 2 * (q->n_pend + n);
    float *p = ds_malloc_aligned((size_t)(cap * u->md) * sizeof(float), "pending draft context");
    if (!p) return DS_ERR_NOMEM;
    if (q->n_pend) memcpy(p, q->pend, (size_t)(q->n_pend * u->md) * sizeof(float));
    ds_free_aligned(q->pend);
    q->pend = p, q->cap_pend = cap;
  }
  memcpy(q->pend + q->n_pend * u->md, rows, (size_t)(n * u->md) * sizeof(float));
  q->n_pend += n;
  return DS_OK;
}

/* Token i of request q's prompt followed by its output. */
static int32_t token_at(const request *q, int64_t i) { return i < q->n_prompt ? q->prompt[i] : q->r->ids[i - q->n_prompt]; }

/* Prompt lookup (ds_spec_options.lookup): the tokens that followed the latest earlier occurrence
 * of q's last m tokens, the longest m that occurred, up to L of them into q->toks[1..]; their
 * count, 0 when none occurred. An occurrence may overlap the suffix (a run of one token repeats). */
static int64_t lookup(const run *u, request *q, int64_t L) {
  int64_t n = q->n_prompt + q->r->n;
  for (int64_t m = DS_SPEC_LOOKUP_MAX; m >= u->o->lookup; m--)
    for (int64_t e = n - 1; e >= m; e--) { /* tokens e-m .. e-1 against n-m .. n-1, then from e on */
      int64_t k = 0;
      while (k < m && token_at(q, e - m + k) == token_at(q, n - m + k)) k++;
      if (k < m) continue;
      int64_t c = 0;
      for (; c < L && e + c < n; c++) q->toks[1 + c] = token_at(q, e + c);
      return c;
    }
  return 0;
}

/* The learned rate at which the draft's first proposal is accepted (add-one smoothed: a coin
 * flip before any), what a lookup must match to go before the draft under the scheduler. */
static double draft_first_rate(const run *u) { return ds_spec_smoothed_rate(u->learn->seen_acc[0], u->learn->seen_prop[0]); }

/* Whether a lookup goes before the draft: always under the fixed and threshold policies (asked
 * for, it is proposed wherever it finds an occurrence); under the scheduler while the draft is
 * switched off, or while lookups are accepted at their first position at least as often as the
 * draft's proposals, as learned so far (ds_spec_learned; add-one smoothed: both start at a coin
 * flip, and the draft's count grows in the rounds without an occurrence), so a draft that
 * accepts well keeps its rounds. */
static int lookup_first(const run *u, int draft) {
  return !draft || u->o->policy != DS_SPEC_SCHEDULER ||
         ds_spec_smoothed_rate(u->learn->lk_acc[0], u->learn->lk_prop[0]) >= draft_first_rate(u);
}

/* A calibration's correction at position k: the acceptance seen over what was predicted there,
 * the prediction counted as SCHED_PRIOR_ROUNDS rounds of agreement. */
static double drift_of(const double *predicted, const double *accepted, int64_t k) {
  return (accepted[k] + SCHED_PRIOR_ROUNDS) / (predicted[k] + SCHED_PRIOR_ROUNDS);
}

/* A corpus lookup's chance that its token k is accepted given the earlier ones were. */
static double corpus_chance(const run *u, const request *q, int64_t k) {
  return fmin(1.0, q->share[k] * drift_of(u->learn->corpus_pred, u->learn->corpus_acc, k));
}

/* The corpus table's continuation of q (ds_spec_options.corpus), up to L tokens into
 * q->toks[1..] and their estimates into q->share; 0 when it has none, or under the scheduler
 * while the draft runs (draft set) and its first position is accepted more often than this first
 * token would be (as lookup_first). */
static int64_t corpus_lookup(const run *u, request *q, int64_t L, int draft) {
  int32_t ctx[DS_NGRAM_MAX_CONTEXT];
  int64_t n = q->n_prompt + q->r->n, m = n < DS_NGRAM_MAX_CONTEXT ? n : DS_NGRAM_MAX_CONTEXT;
  for (int64_t i = 0; i < m; i++) ctx[i] = token_at(q, n - m + i);
  int64_t got = ds_ngram_propose(u->o->corpus, ctx, m, L, CORPUS_MIN_CHAIN, q->toks + 1, q->share);
  if (got > 0 && draft && u->o->policy == DS_SPEC_SCHEDULER && corpus_chance(u, q, 0) < draft_first_rate(u)) return 0;
  return got;
}

/* Request q's proposal for this round, up to L tokens into q->toks[1..]: prompt lookup's when it
 * finds one and goes first (lookup_first), else the corpus table's (corpus_lookup), else (when
 * draft is set) the draft's, with their distributions into q->q and their confidence logits
 * into q->conf. */
static ds_status propose(run *u, request *q, int64_t L, int draft) {
  const ds_spec_options *o = u->o;
  q->n_prop = q->n_conf = 0;
  q->lookup = 0;
  if (L <= 0) return DS_OK;
  if ((o->lookup > 0 && lookup_first(u, draft) && (q->n_prop = lookup(u, q, L)) > 0 && (q->lookup = LOOKUP_PROMPT)) ||
      (o->corpus && (q->n_prop = corpus_lookup(u, q, L, draft)) > 0 && (q->lookup = LOOKUP_CORPUS))) {
    for (int64_t k = 0; k < q->n_prop; k++) q->conf[k] = NAN;
    q->n_conf = q->n_prop;
    return DS_OK;
  }
  if (!draft) return DS_OK;
  DS_TRY(context_flush(u, q));
  DS_TRY(ds_draft_block(u->draft, q->st, q->xs, u->h, u->dlogits));
  int want_conf = o->policy != DS_SPEC_FIXED || o->on_round;
  int32_t prev = q->xs;
  double cum = 1.0;
  for (int64_t k = 0; k < L; k++) {
    float *logits = u->dlogits + k * u->N, conf = NAN;
    DS_TRY(ds_draft_head_step(u->draft, q->st, u->h + k * u->dc->hidden_size, prev, logits, want_conf ? &conf : NULL));
    q->conf[q->n_conf++] = conf;
    if (o->policy == DS_SPEC_THRESHOLD && u->dc->enable_confidence_head) {
      cum *= confidence(o, k, conf);
      if (cum < o->threshold) break;
    }
    probs_of_n(u, logits, q->q + k * u->N, u->N);
    int32_t j = draw_n(u, q, q->q + k * u->N, u->N);
    prev = q->toks[k + 1] = u->vocab_ids ? u->vocab_ids[j] : j; /* draft column -> target id */
    q->n_prop++;
  }
  return DS_OK;
}

/* The scheduler's survival probabilities of q's drafted slots: the calibrated confidences
 * corrected by this run's acceptance over what they predicted (drift_of), their running product;
 * a corpus lookup's estimates, corrected the same way (corpus_chance); or without the confidence
 * head (and for prompt lookup's proposals) this run's rates of such proposals surviving to each
 * position (ds_spec_rate_survival: already cumulative, so not multiplied again; their product
 * priced a prompt lookup's third token on the main job's code prompts at 0.10 where 0.39 of them
 * were accepted, and the scheduler cut its lookups short). */
static void survival(run *u, request *q) {
  const ds_spec_learned *l = u->learn;
  if (q->lookup == LOOKUP_PROMPT || (!q->lookup && !u->dc->enable_confidence_head)) {
    int prompt = q->lookup == LOOKUP_PROMPT;
    ds_spec_rate_survival(prompt ? l->lk_prop : l->seen_prop, prompt ? l->lk_acc : l->seen_acc, q->n_prop, q->survive);
    return;
  }
  double cum = 1.0;
  for (int64_t k = 0; k < q->n_prop; k++) {
    double c = q->lookup == LOOKUP_CORPUS ? corpus_chance(u, q, k)
                                          : fmin(1.0, confidence(u->o, k, q->conf[k]) * drift_of(l->pred_sum, l->pred_acc, k));
    q->survive[k] = cum *= c;
  }
}

/* Whether q's rows after the first get their logits in the pass's own vocabulary product
 * (eager) rather than in a second one once its first proposal is accepted (need_rest): a
 * lookup's. Several rows read the head's weights once: on SmolLM2 (a 30 MB Q8_0 head read in
 * 0.7 ms) 4 rows cost about what 1 does, where a second product costs the read again; its
 * proposals are few and often accepted (prompt lookup's first 0.6-0.7 of the time, the corpus
 * table's 0.2-0.3: 0.25 * 0.7 ms a round lazily, a fifth of what the row gains). The draft's
 * 7 rows stay lazy: their products cost more than the read, and a weak draft's first is mostly
 * rejected. */
static int rows_eager(const request *q) { return q->lookup != LOOKUP_NONE; }

/* The scheduler's part of a round, after every active request drafted: one prefix schedule
 * over the batch cuts each request's proposal to its length; a request that would not gain
 * over plain decoding alone switches speculation off for a back-off of rounds. */
static ds_status schedule(run *u, int64_t drafting) {
  const ds_spec_options *o = u->o;
  if (!o->verify_s || o->n_verify < 1)
    return DS_FAIL(DS_ERR_ARG, "speculate: the scheduler policy needs the verification cost table (a profile)");
  double draft_s = o->draft_block_s > 0 ? o->draft_block_s
                   : u->learn->draft_blocks > 0 ? u->learn->draft_sum_s / (double)u->learn->draft_blocks : 0.0;
  int64_t *len = u->len, *n_cand = u->n_cand;
  const double **a = u->a;
  int *eager = u->eager;
  int n = 0;
  for (int i = 0; i < u->R; i++) {
    request *q = &u->req[i];
    if (q->done) continue;
    survival(u, q);
    n_cand[n] = q->n_prop;
    eager[n] = rows_eager(q);
    a[n++] = q->survive;
  }
  /* the passes' costs as this loop has paid them, the profile's where it has not seen enough */
  ds_spec_loop_costs(o->verify_s, o->n_verify, u->learn->passes, u->learn->pass_s,
                     o->profile_costs ? 0 : DS_SPEC_LEARN_ROWS, u->verify);
  ds_prefix_schedule(n, n_cand, a, eager, u->verify, o->n_verify, o->head_s, o->n_head, (double)drafting * draft_s, len);
  n = 0;
  for (int i = 0; i < u->R; i++) {
    request *q = &u->req[i];
    if (q->done) continue;
    int64_t drafted = q->n_prop;
    q->n_prop = len[n++];
    if (drafted == 0 || q->lookup) continue; /* a lookup costs no draft block: nothing to switch off */
    if (ds_spec_expected_gain(drafted, q->survive, u->verify, o->n_verify, o->head_s, o->n_head, draft_s, NULL) < 1.0) {
      q->off_until = u->step + 1 + q->backoff;
      q->backoff = q->backoff * 2 < SCHED_BACKOFF_MAX ? q->backoff * 2 : SCHED_BACKOFF_MAX;
      q->r->switched_off++;
    } else {
      q->backoff = SCHED_BACKOFF_FIRST;
    }
  }
  return DS_OK;
}

/* The logits of q's rows after the first, on the first read of one: a draft whose first
 * proposal is rejected (most rounds of a weak one) never pays the vocabulary product of the
 * others (a third of verifying 8 tokens on SmolLM2); all of them at once when it is accepted. */
static ds_status need_rest(run *u, request *q) {
  if (q->rest) return DS_OK;
  q->rest = 1;
  double t0 = ds_time_sec();
  int64_t d = u->tc->hidden_size;
  ds_status st = ds_target_logits(u->target, u->fh + (q->row0 + 1) * d, q->n_prop, u->tlogits + (q->row0 + 1) * u->V);
  u->head_s += ds_time_sec() - t0;
  return st;
}

/* Request q's acceptance after the verification pass (its rows from q->row0), then commits
 * and crops. */
static ds_status accept(run *u, request *q) {
  ds_spec_result *r = q->r;
  const ds_spec_options *o = u->o;
  int64_t j = 0, s = ds_kv_cache_len(q->kv) - (q->n_prop + 1);
  int32_t next = -1;
  const float *rows = u->tlogits + q->row0 * u->V;
  for (int64_t k = 1; k <= q->n_prop && next < 0; k++) {
    if (k > 1) DS_TRY(need_rest(u, q));
    const float *row = rows + (k - 1) * u->V;
    int32_t x = q->toks[k];
    if (!q->lookup) r->pos_proposed[k - 1] += 1;
    int ok;
    if (o->temperature > 0) {
      probs_of(u, row, u->p);
      const float *qk = q->q + (k - 1) * u->N;
      double a = u->p[x], b = q->lookup ? 1.0 : draft_prob(u, qk, x); /* a lookup proposes x surely */
      ok = o->test_bias || ds_rng_uniform_f64(&q->rng) * b < a; /* u < p/q */
      if (!ok) { /* the residual max(0, p - q), renormalized; q is 0 outside a reduced vocabulary */
        double mass = 0;
        for (int64_t v = 0; v < u->V; v++) {
          float d = u->p[v] - (q->lookup ? (v == x ? 1.0f : 0.0f)
                               : u->vocab_index ? draft_prob(u, qk, (int32_t)v) : qk[v]);
          u->resid[v] = d > 0 ? d : 0.0f;
          mass += u->resid[v];
        }
        next = mass > 1e-12 ? ds_sample_probs(u->resid, u->V, mass, &q->rng) : ds_sample_probs(u->p, u->V, 1.0, &q->rng);
      }
    } else {
      int32_t best = ds_argmax(row, u->V);
      ok = o->test_bias || x == best;
      if (!ok) next = best;
    }
    if (ok) {
      j = k;
      if (!q->lookup) r->pos_accepted[k - 1] += 1;
    }
  }
  ds_spec_learned *l = u->learn;
  if (q->lookup != LOOKUP_CORPUS) { /* rates: the draft's and prompt lookup's */
    double *seen_prop = q->lookup ? l->lk_prop : l->seen_prop, *seen_acc = q->lookup ? l->lk_acc : l->seen_acc;
    for (int64_t k = 0; k < q->n_prop; k++) seen_prop[k] += 1, seen_acc[k] += k < j;
  }
  /* estimates against outcomes at the positions the verification reached: the corpus table's
   * shares, or the draft's (calibrated) confidences where it has them */
  int corpus = q->lookup == LOOKUP_CORPUS;
  double *predicted = corpus ? l->corpus_pred : l->pred_sum, *accepted = corpus ? l->corpus_acc : l->pred_acc;
  for (int64_t k = 0; k <= j && k < q->n_prop && (corpus || isfinite(q->conf[k])); k++)
    predicted[k] += corpus ? q->share[k] : confidence(o, k, q->conf[k]), accepted[k] += k < j;
  if (o->on_round && !q->lookup) o->on_round(o->round_user, (int)(q - u->req), q->conf, q->n_conf, q->n_prop, j);
  if (next < 0) { /* every proposal accepted: the bonus token from p_L */
    if (q->n_prop > 0) DS_TRY(need_rest(u, q));
    probs_of(u, rows + q->n_prop * u->V, u->p);
    next = draw(u, q, u->p);
  }
  r->rounds++;
  if (q->lookup == LOOKUP_PROMPT && q->n_prop > 0) r->lookup_rounds++, r->lookup_proposed += q->n_prop, r->lookup_accepted += j;
  else if (q->lookup == LOOKUP_CORPUS && q->n_prop > 0) r->corpus_rounds++, r->corpus_proposed += q->n_prop, r->corpus_accepted += j;
  else r->proposed += q->n_prop; /* a lookup the scheduler cut to nothing is a plain round */
  r->committed_hist[j + 1]++;
  /* commit x_1 .. x_j, then the replacement / bonus */
  for (int64_t k = 1; k <= j && !q->done; k++) q->done = commit(u, q, q->toks[k]);
  if (!q->done) q->done = commit(u, q, next);
  if (q->done) return DS_OK;
  /* the target keeps x_s .. x_j; the draft's context takes their rows */
  DS_TRY(ds_kv_cache_crop(q->kv, s + j + 1));
  int plain_next = o->policy == DS_SPEC_SCHEDULER && u->step < q->off_until;
  DS_TRY(context_rows(u, q, u->ctx + q->row0 * u->md, j + 1, plain_next));
  q->xs = next;
  return DS_OK;
}

/* One round over every unfinished request: proposals, one verification pass, acceptance. */
static ds_status round_all(run *u, int *active) {
  const ds_spec_options *o = u->o;
  int n = 0;
  int64_t rows = 0, drafting = 0, n_out = 0; /* n_out: rows whose logits the pass computes */
  double t0 = ds_time_sec();
  for (int i = 0; i < u->R; i++) {
    request *q = &u->req[i];
    if (q->done) continue;
    int64_t remaining = o->max_new_tokens - q->r->n;
    int64_t L = o->draft_len > 0 ? o->draft_len : u->g;
    if (L > u->g) L = u->g;
    if (L > remaining - 1) L = remaining - 1; /* the round commits up to L + 1 tokens */
    int off = o->policy == DS_SPEC_SCHEDULER && u->step < q->off_until; /* the draft switched off */
    double td = ds_time_sec();
    DS_TRY(propose(u, q, L, !off));
    if (off && !q->lookup) q->r->plain_rounds++; /* a plain round */
    if (L > 0 && !off && !q->lookup) u->learn->draft_sum_s += ds_time_sec() - td, u->learn->draft_blocks++, drafting++;
  }
  double t1 = ds_time_sec();
  if (o->policy == DS_SPEC_SCHEDULER) DS_TRY(schedule(u, drafting));
  for (int i = 0; i < u->R; i++) {
    request *q = &u->req[i];
    if (q->done) continue;
    q->toks[0] = q->xs;
    q->row0 = rows;
    int eager = rows_eager(q);
    q->rest = q->n_prop == 0 || eager;
    for (int64_t k = 0; k <= (eager ? q->n_prop : 0); k++) u->first_rows[n_out++] = rows + k;
    rows += q->n_prop + 1;
    u->seqs[n++] = (ds_target_seq){q->toks, q->n_prop + 1, q->kv};
  }
  *active = n;
  if (!n) return DS_OK;
  u->step++;
  double t1b = ds_time_sec();
  /* the pass gives every request's first row of logits (one product for the batch) and the
   * final hidden states the others are computed from when they are read (need_rest) */
  ds_target_outputs out = {u->dc->target_layer_ids, u->dc->n_target_layers, u->ctx, u->fh, u->first_rows, n_out, u->first};
  DS_TRY(ds_target_forward(u->target, u->seqs, n, &out));
  for (int64_t i = 0; i < n_out; i++)
    memcpy(u->tlogits + u->first_rows[i] * u->V, u->first + i * u->V, (size_t)u->V * sizeof(float));
  double t2 = ds_time_sec();
  if (rows <= DS_SPEC_LEARN_ROWS) u->learn->passes[rows - 1] += 1, u->learn->pass_s[rows - 1] += t2 - t1b;
  u->head_s = 0;
  for (int i = 0; i < u->R; i++) {
    request *q = &u->req[i];
    q->rows = q->done ? 0 : q->n_prop + 1;
    if (!q->done) DS_TRY(accept(u, q));
  }
  for (int i = 0; i < u->R; i++) {
    request *q = &u->req[i];
    q->r->draft_s += t1 - t0;
    q->r->verify_s += t2 - t1b + u->head_s;
    q->r->steps++;
    if (q->rows) q->r->passes_by_rows[q->rows - 1]++, q->r->pass_s_by_rows[q->rows - 1] += t2 - t1b + u->head_s;
  }
  return DS_OK;
}

static ds_status check_pair(const ds_target *t, const ds_draft *d) {
  const ds_model_config *tc = ds_target_config(t);
  const ds_draft_config *dc = ds_draft_get_config(d);
  if (tc->vocab_size != dc->vocab_size || tc->hidden_size != dc->hidden_size)
    return DS_FAIL(DS_ERR_ARG, "the draft (vocabulary %lld, hidden size %lld) was not trained for this target "
                   "(vocabulary %lld, hidden size %lld)", (long long)dc->vocab_size, (long long)dc->hidden_size,
                   (long long)tc->vocab_size, (long long)tc->hidden_size);
  if (dc->block_size > DS_SPEC_MAX_LEN)
    return DS_FAIL(DS_ERR_ARG, "draft block size %lld exceeds %d", (long long)dc->block_size, DS_SPEC_MAX_LEN);
  return ds_target_check_capture_layers(t, dc->target_layer_ids, dc->n_target_layers);
}

static ds_status speculate(run *u, const int32_t *const *prompts, const int64_t *n_prompts) {
  int64_t V = u->V, g = u->g, total = 0, max_new = u->o->max_new_tokens;
  for (int i = 0; i < u->R; i++) total += n_prompts[i];
  int64_t rows = total > u->R * (g + 1) ? total : u->R * (g + 1);
  u->ctx = ds_malloc_aligned((size_t)(rows * u->md) * sizeof(float), "captured rows");
  u->tlogits = ds_malloc_aligned((size_t)(u->R * (g + 1) * V) * sizeof(float), "target logits");
  u->fh = ds_malloc_aligned((size_t)(u->R * (g + 1) * u->tc->hidden_size) * sizeof(float), "final hidden states");
  int64_t out_rows = u->R * (u->o->lookup > 0 || u->o->corpus ? g + 1 : 1); /* with lookups, every row of one (rows_eager) */
  u->first = ds_malloc_aligned((size_t)(out_rows * V) * sizeof(float), "target logits");
  u->first_rows = ds_malloc((size_t)out_rows * sizeof(int64_t), "batch");
  u->h = ds_malloc_aligned((size_t)(g * u->dc->hidden_size) * sizeof(float), "draft block");
  u->dlogits = ds_malloc_aligned((size_t)(g * u->N) * sizeof(float), "draft logits");
  u->p = ds_malloc_aligned((size_t)V * sizeof(float), "target distribution");
  u->resid = ds_malloc_aligned((size_t)V * sizeof(float), "residual distribution");
  u->scratch = ds_malloc(ds_sampler_scratch_bytes(V), "sampler scratch");
  int sched = u->o->policy == DS_SPEC_SCHEDULER;
  if (sched) {
    u->verify = ds_malloc((size_t)(u->o->n_verify > 0 ? u->o->n_verify : 1) * sizeof(double), "verification costs");
    u->len = ds_malloc((size_t)u->R * sizeof(int64_t), "schedule");
    u->n_cand = ds_malloc((size_t)u->R * sizeof(int64_t), "schedule");
    u->a = ds_malloc((size_t)u->R * sizeof(*u->a), "schedule");
    u->eager = ds_malloc((size_t)u->R * sizeof(int), "schedule");
  }
  u->seqs = ds_calloc((size_t)u->R, sizeof *u->seqs, "batch");
  int64_t *last = ds_malloc((size_t)u->R * sizeof(int64_t), "batch");
  if (!u->ctx || !u->tlogits || !u->fh || !u->first || !u->first_rows || !u->h || !u->dlogits || !u->p || !u->resid ||
      !u->scratch || !u->seqs || !last || (sched && (!u->verify || !u->len || !u->n_cand || !u->a || !u->eager))) {
    free(last);
    return DS_ERR_NOMEM;
  }
  ds_status st = DS_OK;
  for (int i = 0; i < u->R && st == DS_OK; i++) {
    request *q = &u->req[i];
    int64_t cap = n_prompts[i] + max_new + g + 2;
    st = ds_kv_cache_new(u->target, cap, &q->kv);
    if (st == DS_OK) st = ds_draft_state_new(u->draft, cap, &q->st);
    q->q = ds_malloc_aligned((size_t)(g * u->N) * sizeof(float), "draft distributions");
    q->r->ids = ds_malloc((size_t)(max_new > 0 ? max_new : 1) * sizeof(int32_t), "output ids");
    if (st == DS_OK && (!q->q || !q->r->ids)) st = DS_ERR_NOMEM;
    ds_rng_seed(&q->rng, u->o->seeds ? u->o->seeds[i] : u->o->seed + (uint64_t)i);
    q->prompt = prompts[i], q->n_prompt = n_prompts[i];
    u->seqs[i] = (ds_target_seq){prompts[i], n_prompts[i], q->kv};
  }
  if (st != DS_OK || max_new <= 0) {
    free(last);
    return st;
  }
  /* prefill: every prompt in one pass; their rows go into the drafts' contexts */
  double t0 = ds_time_sec();
  int64_t row = 0;
  for (int i = 0; i < u->R; i++) last[i] = (row += n_prompts[i]) - 1;
  ds_target_outputs out = {u->dc->target_layer_ids, u->dc->n_target_layers, u->ctx, NULL, last, u->R, u->tlogits};
  st = ds_target_forward(u->target, u->seqs, u->R, &out);
  free(last);
  row = 0;
  for (int i = 0; i < u->R && st == DS_OK; i++) {
    request *q = &u->req[i];
    st = ds_draft_state_append(u->draft, q->st, u->ctx + row * u->md, n_prompts[i]);
    row += n_prompts[i];
    probs_of(u, u->tlogits + i * V, u->p);
    q->xs = draw(u, q, u->p);
    q->done = commit(u, q, q->xs);
  }
  double prefill = ds_time_sec() - t0;
  for (int i = 0; i < u->R; i++) u->req[i].r->prefill_s = prefill;
  int active = 1;
  while (st == DS_OK && active) st = round_all(u, &active);
  return st;
}

ds_status ds_speculate_batch(ds_target *target, ds_draft *draft, const int32_t *const *prompts, const int64_t *n_prompts,
                             int R, const ds_spec_options *o, ds_spec_result *results) {
  for (int i = 0; i < R; i++) memset(&results[i], 0, sizeof results[i]);
  if (R < 1) return DS_FAIL(DS_ERR_ARG, "speculate: no request");
  if (o->lookup < 0 || o->lookup > DS_SPEC_LOOKUP_MAX)
    return DS_FAIL(DS_ERR_ARG, "speculate: lookup %lld is not 0 (off) or a suffix length in 1 .. %d",
                   (long long)o->lookup, DS_SPEC_LOOKUP_MAX);
  DS_TRY(check_pair(target, draft));
  run u;
  memset(&u, 0, sizeof u);
  u.target = target;
  u.draft = draft;
  u.o = o;
  u.R = R;
  u.tc = ds_target_config(target);
  u.dc = ds_draft_get_config(draft);
  u.V = u.dc->vocab_size;
  u.N = ds_draft_vocab_size(draft);
  u.vocab_ids = ds_draft_vocab_ids(draft);
  u.vocab_index = ds_draft_vocab_index(draft);
  u.g = u.dc->block_size;
  u.md = u.dc->n_target_layers * u.dc->hidden_size;
  u.learn = o->learned ? o->learned : &u.own;
  for (int i = 0; i < R; i++) {
    if (n_prompts[i] < 1) return DS_FAIL(DS_ERR_ARG, "speculate: request %d: the prompt has no tokens", i);
    for (int64_t t = 0; t < n_prompts[i]; t++)
      if (prompts[i][t] < 0 || prompts[i][t] >= u.V)
        return DS_FAIL(DS_ERR_RANGE, "speculate: request %d: prompt token %d at position %lld outside the vocabulary "
                       "[0, %lld)", i, prompts[i][t], (long long)t, (long long)u.V);
  }
  u.req = ds_calloc((size_t)R, sizeof *u.req, "requests");
  if (!u.req) return DS_ERR_NOMEM;
  for (int i = 0; i < R; i++) u.req[i].r = &results[i], u.req[i].backoff = SCHED_BACKOFF_FIRST;
  double t0 = ds_time_sec();
  ds_status st = speculate(&u, prompts, n_prompts);
  double total = ds_time_sec() - t0;
  for (int i = 0; i < R; i++) {
    request *q = &u.req[i];
    q->r->total_s = total;
    ds_kv_cache_free(q->kv);
    ds_draft_state_free(q->st);
    ds_free_aligned(q->q);
    ds_free_aligned(q->pend);
    if (st != DS_OK) ds_spec_result_free(q->r);
  }
  free(u.req);
  free(u.seqs);
  free(u.first_rows);
  free(u.verify), free(u.len), free(u.n_cand), free(u.a), free(u.eager);
  float *bufs[] = {u.ctx, u.tlogits, u.fh, u.first, u.h, u.dlogits, u.p, u.resid};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) ds_free_aligned(bufs[i]);
  free(u.scratch);
  return st;
}

ds_status ds_speculate(ds_target *target, ds_draft *draft, const int32_t *prompt, int64_t n_prompt,
                       const ds_spec_options *o, ds_spec_result *r) {
  return ds_speculate_batch(target, draft, &prompt, &n_prompt, 1, o, r);
}
