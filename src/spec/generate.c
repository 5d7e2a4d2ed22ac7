/* Plain autoregressive decoding with the target (include/dspark/speculate.h, ds_generate):
 * the reference that speculative decoding must reproduce and is timed against. */
#include <stdlib.h>
#include <string.h>

#include "dspark/sampling.h"
#include "dspark/speculate.h"

ds_status ds_generate(ds_target *target, const int32_t *prompt, int64_t n_prompt, const ds_spec_options *o,
                      ds_spec_result *r) {
  memset(r, 0, sizeof *r);
  if (n_prompt < 1) return DS_FAIL(DS_ERR_ARG, "generate: the prompt has no tokens");
  const ds_model_config *c = ds_target_config(target);
  int64_t V = c->vocab_size, max_new = o->max_new_tokens;
  ds_kv_cache *cache = NULL;
  float *logits = ds_malloc((size_t)V * sizeof(float), "logits");
  void *scratch = ds_malloc(ds_sampler_scratch_bytes(V), "sampler scratch");
  r->ids = ds_malloc((size_t)(max_new > 0 ? max_new : 1) * sizeof(int32_t), "output ids");
  ds_status st = logits && scratch && r->ids ? DS_OK : DS_ERR_NOMEM;
  if (st == DS_OK) st = ds_kv_cache_new(target, n_prompt + (max_new > 0 ? max_new : 1), &cache);
  ds_rng rng;
  ds_rng_seed(&rng, o->seed);
  double t0 = ds_time_sec();
  int64_t last = n_prompt - 1, zero = 0;
  ds_target_seq seq = {prompt, n_prompt, cache};
  ds_target_outputs out = {.logit_rows = &last, .n_logit_rows = 1, .logits = logits};
  if (st == DS_OK && max_new > 0) st = ds_target_forward(target, &seq, 1, &out);
  r->prefill_s = ds_time_sec() - t0;
  out.logit_rows = &zero;
  while (st == DS_OK && r->n < max_new) {
    int32_t next = ds_sample(logits, V, (float)o->temperature, (float)o->top_p, &rng, scratch);
    r->ids[r->n++] = next;
    if (o->on_token) o->on_token(o->user, r->ids, r->n);
    if (!o->ignore_eos && ds_config_is_stop_token(c, next)) {
      r->stopped = 1;
      break;
    }
    if (r->n == max_new) break;
    seq = (ds_target_seq){&r->ids[r->n - 1], 1, cache};
    double t1 = ds_time_sec();
    st = ds_target_forward(target, &seq, 1, &out);
    r->verify_s += ds_time_sec() - t1;
    r->rounds++;
  }
  r->total_s = ds_time_sec() - t0;
  free(logits);
  free(scratch);
  ds_kv_cache_free(cache);
  if (st != DS_OK) ds_spec_result_free(r);
  return st;
}
