/* Plain autoregressive decoding with the target (include/dspark/speculate.h, ds_generate and
 * ds_generate_batch): the reference that speculative decoding must reproduce and is timed
 * against. A batch runs one target forward per step over every unfinished request. */
#include <stdlib.h>
#include <string.h>

#include "dspark/sampling.h"
#include "dspark/speculate.h"

typedef struct {
  ds_kv_cache *cache;
  ds_rng rng;
  int done;
} gen_request;

static ds_status generate(ds_target *target, const int32_t *const *prompts, const int64_t *n_prompts, int R,
                          const ds_spec_options *o, ds_spec_result *res, gen_request *req, float *logits,
                          void *scratch, ds_target_seq *seqs, int64_t *rows) {
  const ds_model_config *c = ds_target_config(target);
  int64_t V = c->vocab_size, max_new = o->max_new_tokens;
  for (int i = 0; i < R; i++) {
    if (n_prompts[i] < 1) return DS_FAIL(DS_ERR_ARG, "generate: request %d: the prompt has no tokens", i);
    res[i].ids = ds_malloc((size_t)(max_new > 0 ? max_new : 1) * sizeof(int32_t), "output ids");
    if (!res[i].ids) return DS_ERR_NOMEM;
    DS_TRY(ds_kv_cache_new(target, n_prompts[i] + (max_new > 0 ? max_new : 1), &req[i].cache));
    ds_rng_seed(&req[i].rng, o->seeds ? o->seeds[i] : o->seed + (uint64_t)i);
    seqs[i] = (ds_target_seq){prompts[i], n_prompts[i], req[i].cache};
  }
  if (max_new <= 0) return DS_OK;
  double t0 = ds_time_sec();
  int64_t row = 0;
  for (int i = 0; i < R; i++) rows[i] = (row += n_prompts[i]) - 1;
  ds_target_outputs out = {.logit_rows = rows, .n_logit_rows = R, .logits = logits};
  DS_TRY(ds_target_forward(target, seqs, R, &out));
  double prefill = ds_time_sec() - t0;
  int *which = (int *)(rows + R); /* request of each row of the next step */
  for (;;) {
    int n = 0;
    for (int i = 0; i < R; i++) { /* logits row k belongs to the k-th request still running */
      if (req[i].done) continue;
      ds_spec_result *r = &res[i];
      int32_t next = ds_sample(logits + (int64_t)n++ * V, V, (float)o->temperature, (float)o->top_p, &req[i].rng,
                               scratch);
      r->ids[r->n++] = next;
      if (o->on_token) o->on_token(o->user, r->ids, r->n);
      if (!o->ignore_eos && ds_config_is_stop_token(c, next)) r->stopped = 1;
      if (r->stopped || r->n == max_new) req[i].done = 1;
    }
    n = 0;
    for (int i = 0; i < R; i++)
      if (!req[i].done) {
        which[n] = i;
        seqs[n++] = (ds_target_seq){&res[i].ids[res[i].n - 1], 1, req[i].cache};
      }
    if (!n) break;
    ds_target_outputs step = {.logits = logits};
    double t1 = ds_time_sec();
    DS_TRY(ds_target_forward(target, seqs, n, &step));
    double dt = ds_time_sec() - t1;
    for (int k = 0; k < n; k++) res[which[k]].rounds++;
    for (int i = 0; i < R; i++) res[i].verify_s += dt;
  }
  for (int i = 0; i < R; i++) res[i].prefill_s = prefill;
  return DS_OK;
}

ds_status ds_generate_batch(ds_target *target, const int32_t *const *prompts, const int64_t *n_prompts, int R,
                            const ds_spec_options *o, ds_spec_result *results) {
  for (int i = 0; i < R; i++) memset(&results[i], 0, sizeof results[i]);
  if (R < 1) return DS_FAIL(DS_ERR_ARG, "generate: no request");
  int64_t V = ds_target_config(target)->vocab_size;
  gen_request *req = ds_calloc((size_t)R, sizeof *req, "requests");
  float *logits = ds_malloc((size_t)(R * V) * sizeof(float), "logits");
  void *scratch = ds_malloc(ds_sampler_scratch_bytes(V), "sampler scratch");
  ds_target_seq *seqs = ds_calloc((size_t)R, sizeof *seqs, "batch");
  int64_t *rows = ds_calloc((size_t)R * 2, sizeof *rows, "batch"); /* last rows, then the step's requests */
  ds_status st = req && logits && scratch && seqs && rows ? DS_OK : DS_ERR_NOMEM;
  double t0 = ds_time_sec();
  if (st == DS_OK) st = generate(target, prompts, n_prompts, R, o, results, req, logits, scratch, seqs, rows);
  double total = ds_time_sec() - t0;
  for (int i = 0; req && i < R; i++) {
    results[i].total_s = total;
    ds_kv_cache_free(req[i].cache);
    if (st != DS_OK) ds_spec_result_free(&results[i]);
  }
  free(req);
  free(logits);
  free(scratch);
  free(seqs);
  free(rows);
  return st;
}

ds_status ds_generate(ds_target *target, const int32_t *prompt, int64_t n_prompt, const ds_spec_options *o,
                      ds_spec_result *r) {
  return ds_generate_batch(target, &prompt, &n_prompt, 1, o, r);
}
