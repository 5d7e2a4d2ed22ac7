/* Plain autoregressive decoding with the target (include/dspark/speculate.h): the reference
 * that speculative decoding must reproduce and is timed against. One loop serves every caller:
 * ds_generate_stream decodes up to max_batch requests together, one target forward per step over
 * every running request's new token, and admits the next request into a freed place in the same
 * forward (its prompt prefilled beside the others' single tokens); ds_generate_batch is that loop
 * with every request admitted at the start, ds_generate with one. */
#include <stdlib.h>
#include <string.h>

#include "dspark/sampling.h"
#include "dspark/speculate.h"

typedef struct {
  ds_kv_cache *cache;
  ds_rng rng;
  int64_t tag;
  const int32_t *prompt; /* the prompt until its prefill, then NULL */
  int64_t n_prompt;
  ds_spec_result res;
  double t_admitted;
} gen_slot;

typedef struct {
  ds_target *target;
  const ds_spec_options *o;
  const ds_gen_stream *s;
  gen_slot *slot; /* [max_batch]; running: cache != NULL */
  int max_batch, running;
  float *logits;          /* [max_batch, V] */
  void *scratch;
  ds_target_seq *seqs;    /* [max_batch] */
  int64_t *rows;          /* [max_batch] the step's logit rows */
  int *which;             /* [max_batch] the slot of each row */
  int exhausted;          /* next() said 0 with nothing running: the end */
} gen_run;

static void slot_clear(gen_slot *g) {
  ds_kv_cache_free(g->cache);
  ds_spec_result_free(&g->res);
  memset(g, 0, sizeof *g);
}

/* Fills free places from next(); *added counts the new requests. */
static ds_status admit(gen_run *r, int *added) {
  int64_t max_new = r->o->max_new_tokens > 0 ? r->o->max_new_tokens : 1;
  *added = 0;
  for (int i = 0; i < r->max_batch && r->running < r->max_batch; i++) {
    gen_slot *g = &r->slot[i];
    if (g->cache) continue;
    uint64_t seed = 0;
    if (!r->s->next(r->s->user, &g->prompt, &g->n_prompt, &seed, &g->tag)) break;
    if (g->n_prompt < 1) return DS_FAIL(DS_ERR_ARG, "generate: request %lld: the prompt has no tokens", (long long)g->tag);
    g->res.ids = ds_malloc((size_t)max_new * sizeof(int32_t), "output ids");
    if (!g->res.ids) return DS_ERR_NOMEM;
    ds_status st = ds_kv_cache_new(r->target, g->n_prompt + max_new, &g->cache);
    if (st != DS_OK) {
      slot_clear(g);
      return st;
    }
    ds_rng_seed(&g->rng, seed);
    g->t_admitted = ds_time_sec();
    r->running++;
    ++*added;
  }
  return DS_OK;
}

/* Hands slot i's result to done() and frees its place. */
static ds_status finish(gen_run *r, int i) {
  gen_slot *g = &r->slot[i];
  g->res.total_s = ds_time_sec() - g->t_admitted;
  ds_spec_result res = g->res;
  memset(&g->res, 0, sizeof g->res);
  int64_t tag = g->tag;
  slot_clear(g);
  r->running--;
  return r->s->done(r->s->user, tag, &res);
}

/* One forward: prompts of newly admitted requests and one token of every other running one;
 * then each row's next token is sampled and finished requests leave. */
static ds_status step(gen_run *r) {
  const ds_model_config *c = ds_target_config(r->target);
  int64_t V = c->vocab_size, max_new = r->o->max_new_tokens, row = 0;
  int n = 0;
  for (int i = 0; i < r->max_batch; i++) {
    gen_slot *g = &r->slot[i];
    if (!g->cache) continue;
    if (g->prompt) r->seqs[n] = (ds_target_seq){g->prompt, g->n_prompt, g->cache};
    else r->seqs[n] = (ds_target_seq){&g->res.ids[g->res.n - 1], 1, g->cache};
    row += r->seqs[n].n;
    r->rows[n] = row - 1;
    r->which[n++] = i;
  }
  ds_target_outputs out = {.logit_rows = r->rows, .n_logit_rows = n, .logits = r->logits};
  double t0 = ds_time_sec();
  DS_TRY(ds_target_forward(r->target, r->seqs, n, &out));
  double dt = ds_time_sec() - t0;
  for (int k = 0; k < n; k++) {
    gen_slot *g = &r->slot[r->which[k]];
    ds_spec_result *res = &g->res;
    if (g->prompt) {
      res->prefill_s += dt;
      g->prompt = NULL;
    } else {
      res->verify_s += dt;
      res->rounds++;
    }
    int32_t next = ds_sample(r->logits + (int64_t)k * V, V, (float)r->o->temperature, (float)r->o->top_p, &g->rng,
                             r->scratch);
    res->ids[res->n++] = next;
    if (r->o->on_token) r->o->on_token(r->o->user, res->ids, res->n);
    if (!r->o->ignore_eos && ds_config_is_stop_token(c, next)) res->stopped = 1;
    if (res->stopped || res->n == max_new) DS_TRY(finish(r, r->which[k]));
  }
  return DS_OK;
}

ds_status ds_generate_stream(ds_target *target, int max_batch, const ds_spec_options *o, const ds_gen_stream *s) {
  if (max_batch < 1) return DS_FAIL(DS_ERR_ARG, "generate: a batch of %d requests", max_batch);
  int64_t V = ds_target_config(target)->vocab_size;
  gen_run r = {.target = target, .o = o, .s = s, .max_batch = max_batch};
  r.slot = ds_calloc((size_t)max_batch, sizeof *r.slot, "requests");
  r.logits = ds_malloc((size_t)max_batch * (size_t)V * sizeof(float), "logits");
  r.scratch = ds_malloc(ds_sampler_scratch_bytes(V), "sampler scratch");
  r.seqs = ds_calloc((size_t)max_batch, sizeof *r.seqs, "batch");
  r.rows = ds_calloc((size_t)max_batch, sizeof *r.rows, "batch");
  r.which = ds_calloc((size_t)max_batch, sizeof *r.which, "batch");
  ds_status st = r.slot && r.logits && r.scratch && r.seqs && r.rows && r.which ? DS_OK : DS_ERR_NOMEM;
  while (st == DS_OK) {
    int added = 0;
    st = admit(&r, &added);
    if (st != DS_OK || r.running == 0) break;
    if (o->max_new_tokens <= 0) { /* nothing to generate: each request ends empty */
      for (int i = 0; st == DS_OK && i < max_batch; i++)
        if (r.slot[i].cache) st = finish(&r, i);
      continue;
    }
    st = step(&r);
  }
  for (int i = 0; r.slot && i < max_batch; i++) slot_clear(&r.slot[i]);
  free(r.slot);
  free(r.logits);
  free(r.scratch);
  free(r.seqs);
  free(r.rows);
  free(r.which);
  return st;
}

/* ds_generate_batch over the stream: every request admitted at the start. */
typedef struct {
  const int32_t *const *prompts;
  const int64_t *n_prompts;
  const ds_spec_options *o;
  ds_spec_result *results;
  int R, given;
} batch_feed;

static int batch_next(void *user, const int32_t **prompt, int64_t *n, uint64_t *seed, int64_t *tag) {
  batch_feed *b = user;
  if (b->given == b->R) return 0;
  int i = b->given++;
  *prompt = b->prompts[i];
  *n = b->n_prompts[i];
  *seed = b->o->seeds ? b->o->seeds[i] : b->o->seed + (uint64_t)i;
  *tag = i;
  return 1;
}

static ds_status batch_done(void *user, int64_t tag, ds_spec_result *r) {
  ((batch_feed *)user)->results[tag] = *r;
  return DS_OK;
}

ds_status ds_generate_batch(ds_target *target, const int32_t *const *prompts, const int64_t *n_prompts, int R,
                            const ds_spec_options *o, ds_spec_result *results) {
  for (int i = 0; i < R; i++) memset(&results[i], 0, sizeof results[i]);
  if (R < 1) return DS_FAIL(DS_ERR_ARG, "generate: no request");
  for (int i = 0; i < R; i++)
    if (n_prompts[i] < 1) return DS_FAIL(DS_ERR_ARG, "generate: request %d: the prompt has no tokens", i);
  batch_feed b = {prompts, n_prompts, o, results, R, 0};
  ds_gen_stream s = {batch_next, batch_done, &b};
  double t0 = ds_time_sec();
  ds_status st = ds_generate_stream(target, R, o, &s);
  double total = ds_time_sec() - t0, decode = 0;
  /* the batch's timings in every result: all were prefilled by the first forward, and the
   * longest-running request decoded through every later step */
  for (int i = 0; i < R; i++) decode = results[i].verify_s > decode ? results[i].verify_s : decode;
  for (int i = 0; i < R; i++) {
    results[i].verify_s = decode;
    results[i].total_s = total;
    if (st != DS_OK) ds_spec_result_free(&results[i]);
  }
  return st;
}

ds_status ds_generate(ds_target *target, const int32_t *prompt, int64_t n_prompt, const ds_spec_options *o,
                      ds_spec_result *r) {
  return ds_generate_batch(target, &prompt, &n_prompt, 1, o, r);
}
