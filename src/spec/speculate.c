/* Lossless speculative decoding of one request with a DSpark draft (include/dspark/speculate.h,
 * spec/dspark.md section 8). The target's KV cache and the draft's context state are cropped
 * to the committed prefix after every round; the target, the draft's kernels and the sampling
 * rule are the ones `generate` and training use, never copies. */
#include "dspark/speculate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dspark/rng.h"
#include "dspark/sampling.h"

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

typedef struct {
  ds_target *target;
  ds_draft *draft;
  const ds_spec_options *o;
  const ds_model_config *tc;
  const ds_draft_config *dc;
  int64_t V, g, md;
  ds_kv_cache *kv;
  ds_draft_state *st;
  float *ctx;        /* [rows, m*d] captured target rows */
  float *tlogits;    /* [g + 1, V] the target's logits of a verification pass */
  float *h, *dlogits; /* [g, d], [g, V] the draft's block */
  float *q;          /* [g, V] the draft's sampling distributions of the proposed tokens */
  float *p, *resid;  /* [V] */
  void *scratch;
  ds_rng rng;
  ds_spec_result *r;
  int64_t cap;
} run;

static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

/* Appends a token; returns 1 when generation ends with it (a stop token, or the budget). */
static int commit(run *u, int32_t tok, ds_status *st) {
  ds_spec_result *r = u->r;
  if (r->n >= u->o->max_new_tokens) return 1;
  r->ids[r->n++] = tok;
  if (u->o->on_token) u->o->on_token(u->o->user, r->ids, r->n);
  if (!u->o->ignore_eos && ds_config_is_stop_token(u->tc, tok)) {
    r->stopped = 1;
    return 1;
  }
  *st = DS_OK;
  return r->n >= u->o->max_new_tokens;
}

/* Draws from probs [V] (greedy: its argmax, which is where the one-hot sits). */
static int32_t draw(run *u, const float *probs) {
  return u->o->temperature > 0 ? ds_sample_probs(probs, u->V, 1.0, &u->rng) : ds_argmax(probs, u->V);
}

static void probs_of(run *u, const float *logits, float *probs) {
  ds_sampling_probs(logits, u->V, (float)u->o->temperature, (float)u->o->top_p, probs, u->scratch);
}

/* The draft's proposal for the round of x_s: up to L tokens into prop[], their distributions
 * into u->q. Returns how many it proposes. */
static ds_status propose(run *u, int32_t xs, int64_t L, int32_t *prop, int64_t *n_prop) {
  *n_prop = 0;
  if (L <= 0) return DS_OK;
  DS_TRY(ds_draft_block(u->draft, u->st, xs, u->h, u->dlogits));
  int32_t prev = xs;
  double cum = 1.0;
  for (int64_t k = 0; k < L; k++) {
    float *logits = u->dlogits + k * u->V, conf = NAN;
    DS_TRY(ds_draft_head_step(u->draft, u->st, u->h + k * u->dc->hidden_size, prev, logits,
                              u->o->policy == DS_SPEC_THRESHOLD ? &conf : NULL));
    if (u->o->policy == DS_SPEC_THRESHOLD && u->dc->enable_confidence_head) {
      cum *= sigmoidf(conf); /* P(slot k accepted | the earlier ones were) */
      if (cum < u->o->threshold) break;
    }
    probs_of(u, logits, u->q + k * u->V);
    prev = prop[k] = draw(u, u->q + k * u->V);
    (*n_prop)++;
  }
  return DS_OK;
}

/* One round: propose, verify, accept, commit, crop. *done when generation ended. */
static ds_status round_once(run *u, int32_t *xs, int *done) {
  ds_spec_result *r = u->r;
  const ds_spec_options *o = u->o;
  int64_t remaining = o->max_new_tokens - r->n;
  int64_t L = o->draft_len > 0 ? o->draft_len : u->g;
  if (L > u->g) L = u->g;
  if (L > remaining - 1) L = remaining - 1; /* the round commits up to L + 1 tokens */
  int32_t toks[DS_SPEC_MAX_LEN + 1];
  int64_t n_prop = 0;
  double t0 = ds_time_sec();
  DS_TRY(propose(u, *xs, L, toks + 1, &n_prop));
  double t1 = ds_time_sec();
  toks[0] = *xs;
  /* verification: [x_s, x_1 .. x_L] in one pass, every row's logits and captured rows */
  int64_t s = ds_kv_cache_len(u->kv);
  ds_target_seq seq = {toks, n_prop + 1, u->kv};
  ds_target_outputs out = {u->dc->target_layer_ids, u->dc->n_target_layers, u->ctx, NULL, NULL, 0, u->tlogits};
  DS_TRY(ds_target_forward(u->target, &seq, 1, &out));
  r->draft_s += t1 - t0;
  r->verify_s += ds_time_sec() - t1;
  /* acceptance, left to right */
  int64_t j = 0;
  int32_t next = -1;
  for (int64_t k = 1; k <= n_prop && next < 0; k++) {
    const float *row = u->tlogits + (k - 1) * u->V;
    int32_t x = toks[k];
    r->pos_proposed[k - 1] += 1;
    int ok;
    if (o->temperature > 0) {
      probs_of(u, row, u->p);
      const float *q = u->q + (k - 1) * u->V;
      double a = u->p[x], b = q[x];
      ok = o->test_bias || ds_rng_uniform_f64(&u->rng) * b < a; /* u < p/q */
      if (!ok) { /* the residual max(0, p - q), renormalized */
        double mass = 0;
        for (int64_t v = 0; v < u->V; v++) {
          float d = u->p[v] - q[v];
          u->resid[v] = d > 0 ? d : 0.0f;
          mass += u->resid[v];
        }
        next = mass > 1e-12 ? ds_sample_probs(u->resid, u->V, mass, &u->rng) : ds_sample_probs(u->p, u->V, 1.0, &u->rng);
      }
    } else {
      int32_t best = ds_argmax(row, u->V);
      ok = o->test_bias || x == best;
      if (!ok) next = best;
    }
    if (ok) {
      j = k;
      r->pos_accepted[k - 1] += 1;
    }
  }
  if (next < 0) { /* every proposal accepted: the bonus token from p_L */
    probs_of(u, u->tlogits + n_prop * u->V, u->p);
    next = draw(u, u->p);
  }
  r->rounds++;
  r->proposed += n_prop;
  r->committed_hist[j + 1]++;
  /* commit x_1 .. x_j, then the replacement / bonus */
  ds_status st = DS_OK;
  for (int64_t k = 1; k <= j && !*done; k++) *done = commit(u, toks[k], &st);
  if (!*done) *done = commit(u, next, &st);
  if (*done) return st;
  /* the target keeps x_s .. x_j; the draft's context takes their rows */
  DS_TRY(ds_kv_cache_crop(u->kv, s + j + 1));
  DS_TRY(ds_draft_state_append(u->draft, u->st, u->ctx, j + 1));
  *xs = next;
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

static ds_status speculate(run *u, const int32_t *prompt, int64_t n_prompt) {
  ds_spec_result *r = u->r;
  int64_t V = u->V, g = u->g, rows = n_prompt > g + 1 ? n_prompt : g + 1;
  u->cap = n_prompt + u->o->max_new_tokens + g + 2;
  DS_TRY(ds_kv_cache_new(u->target, u->cap, &u->kv));
  DS_TRY(ds_draft_state_new(u->draft, u->cap, &u->st));
  u->ctx = ds_malloc_aligned((size_t)(rows * u->md) * sizeof(float), "captured rows");
  u->tlogits = ds_malloc_aligned((size_t)((g + 1) * V) * sizeof(float), "target logits");
  u->h = ds_malloc_aligned((size_t)(g * u->dc->hidden_size) * sizeof(float), "draft block");
  u->dlogits = ds_malloc_aligned((size_t)(g * V) * sizeof(float), "draft logits");
  u->q = ds_malloc_aligned((size_t)(g * V) * sizeof(float), "draft distributions");
  u->p = ds_malloc_aligned((size_t)V * sizeof(float), "target distribution");
  u->resid = ds_malloc_aligned((size_t)V * sizeof(float), "residual distribution");
  u->scratch = ds_malloc(ds_sampler_scratch_bytes(V), "sampler scratch");
  r->ids = ds_malloc((size_t)(u->o->max_new_tokens > 0 ? u->o->max_new_tokens : 1) * sizeof(int32_t), "output ids");
  if (!u->ctx || !u->tlogits || !u->h || !u->dlogits || !u->q || !u->p || !u->resid || !u->scratch || !r->ids)
    return DS_ERR_NOMEM;
  ds_rng_seed(&u->rng, u->o->seed);
  if (u->o->max_new_tokens <= 0) return DS_OK;
  /* prefill: the prompt once; its rows go into the draft's context */
  double t0 = ds_time_sec();
  int64_t last = n_prompt - 1;
  ds_target_seq seq = {prompt, n_prompt, u->kv};
  ds_target_outputs out = {u->dc->target_layer_ids, u->dc->n_target_layers, u->ctx, NULL, &last, 1, u->tlogits};
  DS_TRY(ds_target_forward(u->target, &seq, 1, &out));
  DS_TRY(ds_draft_state_append(u->draft, u->st, u->ctx, n_prompt));
  r->prefill_s = ds_time_sec() - t0;
  probs_of(u, u->tlogits, u->p);
  int32_t xs = draw(u, u->p);
  ds_status st = DS_OK;
  int done = commit(u, xs, &st);
  while (!done && st == DS_OK) st = round_once(u, &xs, &done);
  return st;
}

ds_status ds_speculate(ds_target *target, ds_draft *draft, const int32_t *prompt, int64_t n_prompt,
                       const ds_spec_options *o, ds_spec_result *r) {
  memset(r, 0, sizeof *r);
  if (n_prompt < 1) return DS_FAIL(DS_ERR_ARG, "speculate: the prompt has no tokens");
  DS_TRY(check_pair(target, draft));
  run u;
  memset(&u, 0, sizeof u);
  u.target = target;
  u.draft = draft;
  u.o = o;
  u.r = r;
  u.tc = ds_target_config(target);
  u.dc = ds_draft_get_config(draft);
  u.V = u.dc->vocab_size;
  u.g = u.dc->block_size;
  u.md = u.dc->n_target_layers * u.dc->hidden_size;
  for (int64_t i = 0; i < n_prompt; i++)
    if (prompt[i] < 0 || prompt[i] >= u.V)
      return DS_FAIL(DS_ERR_RANGE, "speculate: prompt token %d at position %lld outside the vocabulary [0, %lld)",
                     prompt[i], (long long)i, (long long)u.V);
  double t0 = ds_time_sec();
  ds_status st = speculate(&u, prompt, n_prompt);
  r->total_s = ds_time_sec() - t0;
  ds_kv_cache_free(u.kv);
  ds_draft_state_free(u.st);
  float *bufs[] = {u.ctx, u.tlogits, u.h, u.dlogits, u.q, u.p, u.resid};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) ds_free_aligned(bufs[i]);
  free(u.scratch);
  if (st != DS_OK) ds_spec_result_free(r);
  return st;
}
